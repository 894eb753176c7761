"""Wire encoder of position records: protobuf bytes written directly.

A record is one ``tf.train.Example`` per group of 64 positions.  Building it
with the protobuf API (filling int64 lists: a numpy array to a Python list,
then the repeated field's ``extend``) was two thirds of the time, so the
shuffle job writes the same bytes here instead (`encode_groups`; a test
asserts byte identity with a protobuf-API reference encoder, kept in the
tests, on both board sizes).

The wire format of an Example: field 1 (Features) holds the map entries
(field 1 each: {key: field 1, value: field 2, a Feature}); a Feature is
``bytes_list`` (field 1, one value: field 1) or ``int64_list`` (field 3,
its values as one packed varint run: field 1, absent when empty).  Every
int64 column of the whole batch is varint-encoded at once with numpy
(`varints`); a record then takes a contiguous slice of each column's bytes,
so what is left per record is joining ~16 short byte strings.  The map
entries go in the order protobuf's deterministic serializer emits them
(upb's map-key order, which is not plain string order: "board_size" before
"board"), read once from protobuf itself (`_key_order`).
"""

from __future__ import annotations

import numpy as np

from format import schema
from format.example_fields import set_int64
from format.example_proto import Example, varint
from format.position_records import CompactPositions, _index_deltas, _target_columns, _targets_rows

_SMALL_VARINTS = [varint(v) for v in range(1 << 14)]
"""Every length and count a record holds is below 2**14 but the longest rows: a list look-up each."""


def _varint(value: int) -> bytes:
    return _SMALL_VARINTS[value] if value < 16384 else varint(value)


def varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varint encoding of non-negative int64 ``values``, all at once: (bytes uint8[total], offsets int64[V+1]);
    value i is ``bytes[offsets[i]:offsets[i+1]]``."""
    values = np.asarray(values, np.int64).reshape(-1)
    if not len(values):
        return np.zeros(0, np.uint8), np.zeros(1, np.int64)
    low, high = int(values.min()), int(values.max())
    if low < 0:
        raise ValueError("varints takes non-negative values (int64 lists of position records are)")
    if high < 0x80:  # the common case (counts, gaps, 9x9 policy indices): one byte each
        return values.astype(np.uint8), np.arange(len(values) + 1, dtype=np.int64)
    if high < 0x4000:  # captures, move numbers, policy values, game indices of most windows: one or two
        two = values >= 0x80
        offsets = np.zeros(len(values) + 1, np.int64)
        np.cumsum(1 + two, out=offsets[1:])
        out = np.empty(offsets[-1], np.uint8)
        out[offsets[:-1]] = (values & 0x7F) | (two * 0x80)
        out[offsets[:-1][two] + 1] = values[two] >> 7
        return out, offsets
    lengths = np.ones(len(values), np.int64)
    for bits in range(7, 63, 7):
        lengths += values >= (1 << bits)
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    out = np.empty(offsets[-1], np.uint8)
    rest = values.copy()
    for k in range(int(lengths.max())):
        more = lengths > k
        at = offsets[:-1][more] + k
        out[at] = (rest[more] & 0x7F) | np.where(lengths[more] > k + 1, 0x80, 0)
        rest >>= 7
    return out, offsets


def _key_order(keys) -> list[str]:
    """``keys`` in the order ``SerializeToString(deterministic=True)`` writes map entries."""
    ex = Example()
    for key in keys:
        set_int64(ex, key, [0])
    data = ex.SerializeToString(deterministic=True)
    return sorted(keys, key=lambda k: data.index(b"\x0a" + _varint(len(k)) + k.encode() + b"\x12"))


_INT_FIELDS = (
    schema.P_CAPTURE_COUNT,
    schema.P_CAPTURES,
    schema.P_POLICY_COUNT,
    schema.P_POLICY_INDEX_DELTA,
    schema.P_POLICY_VALUE,
    schema.P_GAME,
    schema.P_MOVE_NUMBER,
)
_BYTES_FIELDS = (schema.P_BOARD, schema.P_MOVES, schema.P_OWNERSHIP_FINE, schema.P_TARGETS)
_SCALARS = (schema.P_VERSION, schema.P_BOARD_SIZE, schema.P_COUNT)
_ORDER = _key_order(_SCALARS + _INT_FIELDS + _BYTES_FIELDS)


def _entry(key: str, feature: bytes) -> bytes:
    """One map entry of Features, its field tag and length included."""
    entry = _entry_head(key) + _varint(len(feature)) + feature
    return b"\x0a" + _varint(len(entry)) + entry


def _entry_head(key: str) -> bytes:
    """A map entry's key field and its value field's tag (the value's length follows)."""
    return b"\x0a" + _varint(len(key)) + key.encode() + b"\x12"


def _int_feature(payload: bytes) -> bytes:
    """A Feature holding an int64_list of packed varints ``payload`` (empty: an empty list)."""
    inner = b"\x0a" + _varint(len(payload)) + payload if payload else b""
    return b"\x1a" + _varint(len(inner)) + inner


def _bytes_feature(value: bytes) -> bytes:
    inner = b"\x0a" + _varint(len(value)) + value
    return b"\x0a" + _varint(len(inner)) + inner


def encode_groups(c: CompactPositions) -> list[bytes]:
    """Records (version ``schema.POSITION_RECORD_VERSION``) of every position of ``c`` in order,
    POSITION_GROUP a record."""
    version = schema.POSITION_RECORD_VERSION
    n, count = c.board_size, len(c)
    group = schema.POSITION_GROUP
    move_dtype = np.uint8 if schema.move_bytes(n) == 1 else np.dtype("<u2")
    fine = np.asarray(c.fine, bool)
    fine_offsets = np.zeros(count + 1, np.int64)
    np.cumsum(fine, out=fine_offsets[1:])
    policy_offsets = np.asarray(c.policy_offsets, np.int64)
    capture_offsets = np.asarray(c.capture_offsets, np.int64)
    # Per position (row offsets = position index) or per entry (offsets: the ragged column's).
    int_columns = {
        schema.P_CAPTURE_COUNT: (np.diff(capture_offsets), None),
        schema.P_CAPTURES: (c.captures, capture_offsets),
        schema.P_POLICY_COUNT: (np.diff(policy_offsets), None),
        schema.P_POLICY_INDEX_DELTA: (_index_deltas(c.policy_index, policy_offsets), policy_offsets),
        schema.P_POLICY_VALUE: (c.policy_value, policy_offsets),
        schema.P_GAME: (c.game, None),
        schema.P_MOVE_NUMBER: (c.move_number, None),
    }
    bounds = np.r_[np.arange(0, count, group), count]  # the records' first positions, then the end
    encoded = {}
    for key, (values, entry_offsets) in int_columns.items():
        data, offsets = varints(values)
        at = bounds if entry_offsets is None else entry_offsets[bounds]  # value index at each record bound
        encoded[key] = (data.tobytes(), offsets[at].tolist())
    # Fixed-width columns: (every position's row end to end, bytes a row).
    width = schema.trit_bytes(n)
    fixed = {
        schema.P_BOARD: (np.ascontiguousarray(c.board, np.uint8).tobytes(), width),
        schema.P_MOVES: (
            np.ascontiguousarray(np.asarray(c.moves).astype(move_dtype)).tobytes(),
            schema.HISTORY_MOVES * schema.move_bytes(n),
        ),
    }
    fine_rows = np.ascontiguousarray(c.ownership_fine, np.int8).tobytes()
    nn = n * n
    fine_bounds = fine_offsets[bounds].tolist()
    targets = _targets_rows(c)
    constants = {
        schema.P_VERSION: _entry(schema.P_VERSION, _int_feature(_varint(version))),
        schema.P_BOARD_SIZE: _entry(schema.P_BOARD_SIZE, _int_feature(_varint(n))),
        schema.P_COUNT: _entry(schema.P_COUNT, _int_feature(_varint(group))),
    }
    order = _ORDER
    records = []
    for r, lo in enumerate(range(0, count, group)):
        hi = min(lo + group, count)
        entries = dict(constants)
        if hi - lo != group:
            entries[schema.P_COUNT] = _entry(schema.P_COUNT, _int_feature(_varint(hi - lo)))
        entries[schema.P_TARGETS] = _entry(schema.P_TARGETS, _bytes_feature(_target_columns(targets[lo:hi])))
        entries[schema.P_OWNERSHIP_FINE] = _entry(
            schema.P_OWNERSHIP_FINE, _bytes_feature(fine_rows[fine_bounds[r] * nn : fine_bounds[r + 1] * nn])
        )
        for key, (column, row) in fixed.items():
            entries[key] = _entry(key, _bytes_feature(column[lo * row : hi * row]))
        for key, (varint_bytes, at) in encoded.items():
            entries[key] = _entry(key, _int_feature(varint_bytes[at[r] : at[r + 1]]))
        body = b"".join([entries[key] for key in order])
        records.append(b"\x0a" + _varint(len(body)) + body)
    return records
