"""Version-1 position records: one assembled training example a record (reading).

The shuffle job wrote this version before groups of compact positions
(version 2, then 3, format/SPEC.md "Shards") replaced it; nothing in
production writes it now.  It stays readable so that a window an earlier
release wrote still trains.  A record holds the 16 input planes bit-packed
(plane-major, most significant bit first), the sparse float policy, int8
ownership, the float targets and weights, and the game id.

Data flow::

    record --format.position_records.decode_records()--> decode_fields() --> PositionRecord
    shard --model.tfdata.training_dataset()--> model.tfdata_version1.PositionDecoder --> batch

Its writers (the reference and a batched one, byte-identical) are
`testdata.records_v1`: tests and `bench/train.py` write version 1 to check and
measure the readers.
"""
from __future__ import annotations

import numpy as np

from format import schema
from format.example_fields import FeatureReader

VERSION = 1


def decode_fields(r: FeatureReader, n: int) -> dict:
    """One version-1 record's fields, validated, as `format.position_records.PositionRecord`'s keywords.

    ``r`` reads the parsed record (its version and board size ``n`` already
    checked by the caller); an inconsistent field raises FormatError naming it.
    """
    raw = r.bytes(schema.P_PLANES)
    expected = schema.packed_plane_bytes(n, schema.PACKED_PLANES)
    if len(raw) != expected:
        raise r.error(schema.P_PLANES, f"has {len(raw)} bytes, expected {expected}")
    planes = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=schema.PACKED_PLANES * n * n,
                           bitorder="big").reshape(schema.PACKED_PLANES, n, n)
    to_play = r.int(schema.P_TO_PLAY)
    if to_play not in (schema.BLACK, schema.WHITE):
        raise r.error(schema.P_TO_PLAY, f"impossible colour {to_play}")
    index = r.ints(schema.P_POLICY_INDEX)
    prob = r.floats(schema.P_POLICY_PROB)
    if len(index) != len(prob):
        raise r.error(schema.P_POLICY_PROB, f"{len(prob)} probabilities for {len(index)} indices")
    if len(index) and (index.min() < 0 or index.max() > n * n):
        raise r.error(schema.P_POLICY_INDEX, f"index outside 0..{n * n}")
    if len(prob) and abs(float(prob.sum()) - 1.0) > schema.POLICY_SUM_TOLERANCE:
        raise r.error(schema.P_POLICY_PROB, f"sums to {float(prob.sum()):.4f}, far from 1")
    own_raw = r.bytes(schema.P_OWNERSHIP)
    if len(own_raw) != n * n:
        raise r.error(schema.P_OWNERSHIP, f"has {len(own_raw)} bytes, expected {n * n}")
    ownership = np.frombuffer(own_raw, dtype=np.int8).astype(np.float32) / schema.OWNERSHIP_SCALE
    return dict(
        board_size=n, planes=planes, to_play=to_play, policy_index=index, policy_prob=prob,
        value=r.float(schema.P_VALUE), score=r.float(schema.P_SCORE), ownership=ownership,
        policy_weight=r.float(schema.P_POLICY_WEIGHT), value_weight=r.float(schema.P_VALUE_WEIGHT),
        ownership_weight=r.float(schema.P_OWNERSHIP_WEIGHT), score_weight=r.float(schema.P_SCORE_WEIGHT),
        game_id=r.text(schema.P_GAME_ID), move_number=r.int(schema.P_MOVE_NUMBER),
        generation=r.int(schema.P_GENERATION), version=VERSION,
    )
