"""Position records: one training example per record, many per shard (format/SPEC.md "Shards").

The Beam job assembles each position (history planes, policy target, value,
score and ownership targets, loss weights) so that the trainer needs no Go
engine; format.tfdata parses the same bytes in the graph.  This module is the
reference encoder and decoder, one position at a time; the job's batched hot
path (`format.position_wire`) writes byte-identical records.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from format import schema as S
from format.example_proto import Example
from format.tfrecord import (
    RecordError,
    compress_gzip,
    decompress_for,
    frame_records,
    iter_framed_records,
)
from format.example_fields import FeatureReader, FormatError, parse_example, set_bytes, set_float, set_int64

# --------------------------------------------------------------------------
# Position records
# --------------------------------------------------------------------------


@dataclasses.dataclass
class PositionRecord:
    """One training example, decoded (SPEC.md, "Position records")."""

    board_size: int
    planes: np.ndarray
    """uint8[16, N, N]: side to move at t..t-7, then the opponent at t..t-7."""
    to_play: int
    policy_index: np.ndarray
    policy_prob: np.ndarray
    value: float
    score: float
    ownership: np.ndarray
    """float32[N*N] in [-1, 1], side to move."""
    policy_weight: float
    value_weight: float
    ownership_weight: float
    score_weight: float
    game_id: str
    move_number: int
    generation: int
    version: int = S.FORMAT_VERSION


def encode_position(
    *, board_size: int, planes_packed: bytes, to_play: int, policy_index, policy_prob,
    value: float, score: float, ownership_int8: bytes, policy_weight: float, value_weight: float,
    ownership_weight: float, score_weight: float, game_id: str, move_number: int, generation: int,
) -> bytes:
    """Serialize one position record.  Inputs are already in at-rest form."""
    ex = Example()
    set_int64(ex, S.P_VERSION, [S.FORMAT_VERSION])
    set_int64(ex, S.P_BOARD_SIZE, [board_size])
    set_bytes(ex, S.P_PLANES, bytes(planes_packed))
    set_int64(ex, S.P_TO_PLAY, [to_play])
    set_int64(ex, S.P_POLICY_INDEX, policy_index)
    set_float(ex, S.P_POLICY_PROB, policy_prob)
    set_float(ex, S.P_VALUE, [value])
    set_float(ex, S.P_SCORE, [score])
    set_bytes(ex, S.P_OWNERSHIP, bytes(ownership_int8))
    set_float(ex, S.P_POLICY_WEIGHT, [policy_weight])
    set_float(ex, S.P_VALUE_WEIGHT, [value_weight])
    set_float(ex, S.P_OWNERSHIP_WEIGHT, [ownership_weight])
    set_float(ex, S.P_SCORE_WEIGHT, [score_weight])
    set_bytes(ex, S.P_GAME_ID, game_id.encode())
    set_int64(ex, S.P_MOVE_NUMBER, [move_number])
    set_int64(ex, S.P_GENERATION, [generation])
    return ex.SerializeToString(deterministic=True)


def decode_position(data: bytes, source: str = "<bytes>") -> PositionRecord:
    """Parse and validate one position record (the trainer uses format.tfdata)."""
    r = FeatureReader(parse_example(data, source), source)
    version, n = r.header(S.P_VERSION, S.P_BOARD_SIZE)
    raw = r.bytes(S.P_PLANES)
    expected = S.packed_plane_bytes(n, S.PACKED_PLANES)
    if len(raw) != expected:
        raise r.error(S.P_PLANES, f"has {len(raw)} bytes, expected {expected}")
    planes = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=S.PACKED_PLANES * n * n,
                           bitorder="big").reshape(S.PACKED_PLANES, n, n)
    to_play = r.int(S.P_TO_PLAY)
    if to_play not in (S.BLACK, S.WHITE):
        raise r.error(S.P_TO_PLAY, f"impossible colour {to_play}")
    index = r.ints(S.P_POLICY_INDEX)
    prob = r.floats(S.P_POLICY_PROB)
    if len(index) != len(prob):
        raise r.error(S.P_POLICY_PROB, f"{len(prob)} probabilities for {len(index)} indices")
    if len(index) and (index.min() < 0 or index.max() > n * n):
        raise r.error(S.P_POLICY_INDEX, f"index outside 0..{n * n}")
    if len(prob) and abs(float(prob.sum()) - 1.0) > S.POLICY_SUM_TOLERANCE:
        raise r.error(S.P_POLICY_PROB, f"sums to {float(prob.sum()):.4f}, far from 1")
    own_raw = r.bytes(S.P_OWNERSHIP)
    if len(own_raw) != n * n:
        raise r.error(S.P_OWNERSHIP, f"has {len(own_raw)} bytes, expected {n * n}")
    ownership = np.frombuffer(own_raw, dtype=np.int8).astype(np.float32) / S.OWNERSHIP_SCALE
    return PositionRecord(
        board_size=n, planes=planes, to_play=to_play, policy_index=index, policy_prob=prob,
        value=r.float(S.P_VALUE), score=r.float(S.P_SCORE), ownership=ownership,
        policy_weight=r.float(S.P_POLICY_WEIGHT), value_weight=r.float(S.P_VALUE_WEIGHT),
        ownership_weight=r.float(S.P_OWNERSHIP_WEIGHT), score_weight=r.float(S.P_SCORE_WEIGHT),
        game_id=r.text(S.P_GAME_ID), move_number=r.int(S.P_MOVE_NUMBER),
        generation=r.int(S.P_GENERATION), version=version,
    )


def encode_shard(records: Sequence[bytes]) -> bytes:
    """A whole shard file: GZIP TFRecord of serialized position records."""
    return compress_gzip(frame_records(records))


def read_shard(data: bytes, source: str) -> list[PositionRecord]:
    """Decode a whole shard (tools and tests; the trainer streams with tf.data)."""
    try:
        raw = decompress_for(source, data)
        return [decode_position(rec, f"{source}#{i}") for i, rec in enumerate(iter_framed_records(raw, source))]
    except RecordError as exc:
        raise FormatError(source, None, str(exc).split(": ", 1)[-1]) from None
