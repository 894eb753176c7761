"""Test helpers for position records: the protobuf-API reference encoder, and records of another version.

`encode_position_groups` builds each record with the protobuf API, the
plain way; the shuffle job writes the same bytes faster with
`format.group_wire.encode_groups`, and tests assert the two agree byte for
byte.  `with_version` rewrites a record's version field, to make the record
an older (or newer) release would have written, for the readers' refusal.
"""
from __future__ import annotations

import numpy as np

from format import schema
from format.example_fields import set_bytes, set_int64
from format.example_proto import Example
from format.position_records import CompactPositions, _index_deltas, _target_columns, _targets_rows


def encode_position_groups(c: CompactPositions) -> list[bytes]:
    """The records of every position of ``c`` in order, POSITION_GROUP to a record, through the protobuf API.

    The per-position byte rows are built once for all positions; each record
    then takes a contiguous slice of every column.
    """
    n = c.board_size
    move_dtype = np.uint8 if schema.move_bytes(n) == 1 else np.dtype("<u2")
    board = np.ascontiguousarray(c.board, np.uint8)
    moves = np.ascontiguousarray(c.moves.astype(move_dtype))
    targets = _targets_rows(c)
    deltas = _index_deltas(c.policy_index, c.policy_offsets)
    policy_counts = np.diff(c.policy_offsets)
    capture_counts = np.diff(c.capture_offsets)
    fine_offsets = np.concatenate([[0], np.cumsum(np.asarray(c.fine, np.int64))])
    fine_rows = np.ascontiguousarray(c.ownership_fine, np.int8)
    records = []
    for lo in range(0, len(c), schema.POSITION_GROUP):
        hi = min(lo + schema.POSITION_GROUP, len(c))
        p_lo, p_hi = c.policy_offsets[lo], c.policy_offsets[hi]
        c_lo, c_hi = c.capture_offsets[lo], c.capture_offsets[hi]
        ex = Example()
        set_int64(ex, schema.P_VERSION, [schema.POSITION_RECORD_VERSION])
        set_int64(ex, schema.P_BOARD_SIZE, [n])
        set_int64(ex, schema.P_COUNT, [hi - lo])
        set_bytes(ex, schema.P_BOARD, board[lo:hi].tobytes())
        set_bytes(ex, schema.P_MOVES, moves[lo:hi].tobytes())
        set_int64(ex, schema.P_CAPTURE_COUNT, capture_counts[lo:hi])
        set_int64(ex, schema.P_CAPTURES, c.captures[c_lo:c_hi])
        set_bytes(ex, schema.P_OWNERSHIP_FINE, fine_rows[fine_offsets[lo]:fine_offsets[hi]].tobytes())
        set_bytes(ex, schema.P_TARGETS, _target_columns(targets[lo:hi]))
        set_int64(ex, schema.P_POLICY_COUNT, policy_counts[lo:hi])
        set_int64(ex, schema.P_POLICY_INDEX_DELTA, deltas[p_lo:p_hi])
        set_int64(ex, schema.P_POLICY_VALUE, c.policy_value[p_lo:p_hi])
        set_int64(ex, schema.P_GAME, c.game[lo:hi])
        set_int64(ex, schema.P_MOVE_NUMBER, c.move_number[lo:hi])
        records.append(ex.SerializeToString(deterministic=True))
    return records


def with_version(record: bytes, version: int) -> bytes:
    """``record`` with its version field set to ``version`` (every other field as it was)."""
    ex = Example()
    ex.ParseFromString(record)
    del ex.features.feature[schema.P_VERSION].int64_list.value[:]
    set_int64(ex, schema.P_VERSION, [version])
    return ex.SerializeToString(deterministic=True)
