"""Version-1 position records, written (format/SPEC.md "Position records, version 1").

Production never writes version 1 (format.legacy.version1 reads it); tests
and `bench/train.py` write it here to check and measure the readers.

Data flow::

    encode_position() (reference, one protobuf message)  \
    encode_positions() / encode_positions_framed()        -> records, byte-identical
        (batched: protobuf wire bytes written with numpy gathers)
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from format import schema
from format.example_fields import set_bytes, set_float, set_int64
from format.example_proto import Example, varint
from format.legacy.version1 import VERSION
from format.tfrecord import (
    gather_segments,
    fill_data_crcs,
    frame_header,
)


def encode_position(
    *, board_size: int, planes_packed: bytes, to_play: int, policy_index, policy_prob,
    value: float, score: float, ownership_int8: bytes, policy_weight: float, value_weight: float,
    ownership_weight: float, score_weight: float, game_id: str, move_number: int, generation: int,
) -> bytes:
    """Serialize one position record, one protobuf message (the reference the batched writer matches).

    Inputs are already in at-rest form.
    """
    ex = Example()
    set_int64(ex, schema.P_VERSION, [VERSION])
    set_int64(ex, schema.P_BOARD_SIZE, [board_size])
    set_bytes(ex, schema.P_PLANES, bytes(planes_packed))
    set_int64(ex, schema.P_TO_PLAY, [to_play])
    set_int64(ex, schema.P_POLICY_INDEX, policy_index)
    set_float(ex, schema.P_POLICY_PROB, policy_prob)
    set_float(ex, schema.P_VALUE, [value])
    set_float(ex, schema.P_SCORE, [score])
    set_bytes(ex, schema.P_OWNERSHIP, bytes(ownership_int8))
    set_float(ex, schema.P_POLICY_WEIGHT, [policy_weight])
    set_float(ex, schema.P_VALUE_WEIGHT, [value_weight])
    set_float(ex, schema.P_OWNERSHIP_WEIGHT, [ownership_weight])
    set_float(ex, schema.P_SCORE_WEIGHT, [score_weight])
    set_bytes(ex, schema.P_GAME_ID, game_id.encode())
    set_int64(ex, schema.P_MOVE_NUMBER, [move_number])
    set_int64(ex, schema.P_GENERATION, [generation])
    return ex.SerializeToString(deterministic=True)




# --------------------------------------------------------------------------
# Batched position encoder
# --------------------------------------------------------------------------
#
# Building one protobuf message per position costs ~15 us in Python, and a
# bench writes tens of thousands of positions.  Position
# records all share one shape, so this writes the protobuf wire format
# directly: an Example is field 1 (Features), Features is a repeated map
# entry (field 1) of {key: field 1, value: field 2 (Feature)}, and a Feature
# is bytes_list (1), float_list (2, packed float32) or int64_list (3, packed
# varints).  Map entries may come in any order on the wire; these are
# emitted in the order protobuf's deterministic serializer uses (upb sorts
# "x_weight" before "x"), so the bytes match encode_position's, and a test
# asserts that both parse to equal messages.
#
# A per-record Python loop (one join of ~30 pieces, varints, two CRC calls
# for the frame) still cost ~12 us a position, so the whole batch is built
# with numpy instead (`_Gather`): each record is the same list of columns
# (constants, entries cached per distinct value such as a game id or a
# policy length, and rows of the callers' arrays), and one gather writes all
# records.  What is left per record is one crc32c call when framing.


def _len_field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + varint(len(payload)) + payload


def _entry(key: str, feature: bytes) -> bytes:
    inner = _len_field(0x0A, key.encode()) + _len_field(0x12, feature)
    return _len_field(0x0A, inner)


def _feature_bytes(value: bytes) -> bytes:
    return _len_field(0x0A, _len_field(0x0A, value))


def _feature_floats(packed: bytes) -> bytes:
    return _len_field(0x12, _len_field(0x0A, packed) if packed else b"")


def _feature_ints(packed_varints: bytes) -> bytes:
    return _len_field(0x1A, _len_field(0x0A, packed_varints) if packed_varints else b"")


def _varints_up_to_14_bits(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varint-encode non-negative ints < 2**14 at once.

    Returns (bytes uint8[total], byte offsets int64[len(values)+1]).
    """
    values = np.asarray(values, dtype=np.int64)
    two = values >= 0x80
    lengths = 1 + two
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    out = np.empty(offsets[-1], dtype=np.uint8)
    starts = offsets[:-1]
    out[starts] = (values & 0x7F) | (two * 0x80)
    out[starts[two] + 1] = values[two] >> 7
    return out, offsets


def _byte_table(entries: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes uint8[total], starts int64[E], lengths int64[E]) of byte strings laid end to end."""
    lengths = np.fromiter((len(e) for e in entries), np.int64, len(entries))
    starts = np.zeros(len(entries), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return np.frombuffer(b"".join(entries), np.uint8), starts, lengths


class _Gather:
    """Records assembled from byte segments, all at once.

    Every record is the same sequence of K *columns*; column k of record i is
    ``lengths[i, k]`` bytes starting at ``starts[i, k]`` of one shared pool
    (constants, cached entries and the callers' arrays laid end to end).  One
    fancy-indexing gather then writes every record, so the Python cost is per
    column, not per record.
    """

    def __init__(self, count: int):
        self.count = count
        self.pool: list[np.ndarray] = []
        self.pool_size = 0
        self.starts: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []

    def _add_pool(self, data: np.ndarray) -> int:
        base = self.pool_size
        self.pool.append(data)
        self.pool_size += len(data)
        return base

    def const(self, data: bytes) -> None:
        base = self._add_pool(np.frombuffer(data, np.uint8))
        self.starts.append(np.full(self.count, base, np.int64))
        self.lengths.append(np.full(self.count, len(data), np.int64))

    def table(self, entries: Sequence[bytes], which: np.ndarray, first: bool = False) -> None:
        """Record i gets ``entries[which[i]]`` (as its first column if ``first``)."""
        data, starts, lengths = _byte_table(entries)
        base = self._add_pool(data)
        at = 0 if first else len(self.starts)
        self.starts.insert(at, starts[which] + base)
        self.lengths.insert(at, lengths[which])

    def rows(self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray | int) -> None:
        """Record i gets ``data[starts[i]:starts[i] + lengths[i]]``."""
        base = self._add_pool(np.ascontiguousarray(data, np.uint8).reshape(-1))
        self.starts.append(np.asarray(starts, np.int64) + base)
        self.lengths.append(np.broadcast_to(np.asarray(lengths, np.int64), (self.count,)))

    def fixed(self, data: np.ndarray, width: int) -> None:
        """Record i gets row i of ``data`` viewed as uint8[count, width]."""
        self.rows(data, np.arange(self.count, dtype=np.int64) * width, width)

    def record_lengths(self) -> np.ndarray:
        return np.sum(self.lengths, axis=0) if self.lengths else np.zeros(self.count, np.int64)

    def gather(self) -> tuple[np.ndarray, np.ndarray]:
        """(every record end to end uint8[total], offsets int64[count+1])."""
        pool = np.concatenate(self.pool) if self.pool else np.zeros(0, np.uint8)
        starts = np.stack(self.starts, axis=1)  # [count, K]
        lengths = np.stack(self.lengths, axis=1)
        offsets = np.zeros(self.count + 1, np.int64)
        np.cumsum(lengths.sum(axis=1), out=offsets[1:])
        # The copy loop trusts its input: check every segment lies in the pool.
        if len(starts) and ((lengths < 0).any() or (starts < 0).any() or (starts + lengths > len(pool)).any()):
            raise ValueError("a record segment lies outside the byte pool")
        out = np.empty(offsets[-1], np.uint8)
        gather_segments(pool, starts, lengths, out)
        return out, offsets


def _unique_entries(values, make_entry) -> tuple[list[bytes], np.ndarray]:
    """(entry bytes per distinct value, which entry each record uses).

    Integer columns (move numbers, lengths, generations) span small ranges,
    so a lookup table over [min, max] finds the distinct values in linear
    time; np.unique's sort was a tenth of the encoder's time.  Strings (game
    ids) come in runs, one per game: an entry per run is cheap and a repeated
    entry only costs pool bytes.
    """
    values = np.asarray(values).reshape(-1)
    if not len(values):
        return [], np.zeros(0, np.int64)
    if values.dtype.kind in "iu":
        low = int(values.min())
        span = int(values.max()) - low + 1
        if span <= 4 * len(values) + 1024:
            present = np.zeros(span, bool)
            present[values - low] = True
            distinct = np.flatnonzero(present)
            lookup = np.cumsum(present) - 1
            return [make_entry(int(v) + low) for v in distinct.tolist()], lookup[values - low]
        distinct, which = np.unique(values, return_inverse=True)
        return [make_entry(v) for v in distinct.tolist()], which.reshape(-1)
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    which = np.cumsum(np.r_[True, values[1:] != values[:-1]]) - 1
    return [make_entry(v) for v in values[starts].tolist()], which


def _position_gather(
    *, board_size: int, planes_packed: np.ndarray, to_play, policy_offsets, policy_index, policy_prob,
    value, score, ownership: np.ndarray, policy_weight, value_weight, ownership_weight, score_weight,
    game_id, move_number, generation, framed: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Every position record (TFRecord frames if ``framed``) end to end, and their offsets."""
    n = board_size
    nn = n * n
    count = len(planes_packed)
    planes_packed = np.ascontiguousarray(planes_packed, dtype=np.uint8)
    ownership = np.ascontiguousarray(ownership, dtype=np.int8)
    if planes_packed.shape != (count, schema.packed_plane_bytes(n, schema.PACKED_PLANES)):
        raise ValueError(f"planes_packed has shape {planes_packed.shape}")
    if ownership.shape != (count, nn):
        raise ValueError(f"ownership has shape {ownership.shape}")
    policy_offsets = np.asarray(policy_offsets, dtype=np.int64)
    policy_index = np.asarray(policy_index, dtype=np.int64)
    if len(policy_index) and (policy_index.min() < 0 or policy_index.max() > nn):
        raise ValueError(f"policy index outside 0..{nn}")
    if count == 0:
        return np.zeros(0, np.uint8), np.zeros(1, np.int64)
    index_bytes, index_byte_offsets = _varints_up_to_14_bits(policy_index)
    plane_len = planes_packed.shape[1]

    def floats(a):
        return np.frombuffer(np.asarray(a, dtype="<f4").reshape(-1).tobytes(), np.uint8)

    ids = np.asarray(game_id)
    if ids.dtype.kind == "U":
        id_entries, id_which = _unique_entries(ids, lambda g: _entry(schema.P_GAME_ID, _feature_bytes(g.encode())))
    elif ids.dtype.kind == "S":
        id_entries, id_which = _unique_entries(ids, lambda g: _entry(schema.P_GAME_ID, _feature_bytes(g)))
    else:
        raise ValueError(f"game_id must hold strings, got dtype {ids.dtype}")

    def int_column(key, values):
        return _unique_entries(np.asarray(values, dtype=np.int64),
                               lambda v: _entry(key, _feature_ints(varint(v))))

    def float_prefix(key):
        return _entry(key, _feature_floats(b"\0\0\0\0"))[:-4]

    # The policy entries' headers depend only on the payload length.
    policy_counts = np.diff(policy_offsets)
    index_lengths = index_byte_offsets[policy_offsets[1:]] - index_byte_offsets[policy_offsets[:-1]]

    def length_prefix(key, make_feature, lengths):
        def prefix(length):
            whole = _entry(key, make_feature(bytes(length)))
            return whole[: len(whole) - length]
        return _unique_entries(lengths, prefix)

    body = _Gather(count)
    # Map entries in the order protobuf's deterministic serializer emits them.
    body.const(_entry(schema.P_BOARD_SIZE, _feature_ints(varint(n))))
    body.table(id_entries, id_which)
    body.table(*int_column(schema.P_GENERATION, generation))
    body.table(*int_column(schema.P_MOVE_NUMBER, move_number))
    body.const(float_prefix(schema.P_OWNERSHIP_WEIGHT))
    body.fixed(floats(ownership_weight), 4)
    body.const(_entry(schema.P_OWNERSHIP, _feature_bytes(bytes(nn)))[:-nn])
    body.fixed(ownership.view(np.uint8), nn)
    body.const(_entry(schema.P_PLANES, _feature_bytes(bytes(plane_len)))[:-plane_len])
    body.fixed(planes_packed, plane_len)
    body.table(*length_prefix(schema.P_POLICY_INDEX, _feature_ints, index_lengths))
    body.rows(index_bytes, index_byte_offsets[policy_offsets[:-1]], index_lengths)
    body.table(*length_prefix(schema.P_POLICY_PROB, _feature_floats, 4 * policy_counts))
    body.rows(floats(policy_prob), 4 * policy_offsets[:-1], 4 * policy_counts)
    body.const(float_prefix(schema.P_POLICY_WEIGHT))
    body.fixed(floats(policy_weight), 4)
    body.const(float_prefix(schema.P_SCORE_WEIGHT))
    body.fixed(floats(score_weight), 4)
    body.const(float_prefix(schema.P_SCORE))
    body.fixed(floats(score), 4)
    body.table(*int_column(schema.P_TO_PLAY, to_play))
    body.const(float_prefix(schema.P_VALUE_WEIGHT))
    body.fixed(floats(value_weight), 4)
    body.const(float_prefix(schema.P_VALUE))
    body.fixed(floats(value), 4)
    body.const(_entry(schema.P_VERSION, _feature_ints(varint(VERSION))))

    # Example.features (field 1) wraps the body: its tag and length go in
    # front, one entry per distinct body length.
    body_lengths = body.record_lengths()
    header_entries, header_which = _unique_entries(body_lengths, lambda k: b"\x0a" + varint(k))
    body.table(header_entries, header_which, first=True)
    if not framed:
        return body.gather()
    # A TFRecord frame: length and its CRC in front (one per distinct
    # length), the data CRC behind (written after the gather).
    body.table(*_unique_entries(body.record_lengths(), frame_header), first=True)
    body.const(bytes(4))
    out, offsets = body.gather()
    fill_data_crcs(out, offsets)
    return out, offsets


def encode_positions(
    *, board_size: int, planes_packed: np.ndarray, to_play, policy_offsets, policy_index, policy_prob,
    value, score, ownership: np.ndarray, policy_weight, value_weight, ownership_weight, score_weight,
    game_id: Sequence[str] | np.ndarray, move_number, generation,
) -> list[bytes]:
    """Serialize P position records at once; byte-identical to encode_position.

    ``planes_packed`` is uint8[P, packed_plane_bytes(N, 16)], ``ownership``
    int8[P, N*N]; the policy of record i is
    ``policy_index/prob[policy_offsets[i]:policy_offsets[i+1]]``.
    ``game_id`` holds str (or a numpy bytes array).
    """
    data, offsets = _position_gather(
        board_size=board_size, planes_packed=planes_packed, to_play=to_play, policy_offsets=policy_offsets,
        policy_index=policy_index, policy_prob=policy_prob, value=value, score=score, ownership=ownership,
        policy_weight=policy_weight, value_weight=value_weight, ownership_weight=ownership_weight,
        score_weight=score_weight, game_id=game_id, move_number=move_number, generation=generation,
        framed=False)
    blob, bounds = data.tobytes(), offsets.tolist()
    return [blob[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def encode_positions_framed(**fields) -> tuple[np.ndarray, np.ndarray]:
    """Like encode_positions, but each record already framed as a TFRecord.

    Takes encode_positions' keyword arguments.  Returns (every frame end to
    end as uint8[total], int64[P+1] frame offsets): frame i is
    ``data[off[i]:off[i+1]]``, byte-identical to
    ``frame_records([encode_positions(...)[i]])``.
    """
    return _position_gather(framed=True, **fields)
