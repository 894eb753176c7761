"""Version-2 position records (format/SPEC.md "Position records, version 2").

The planes themselves are cross-checked against format/planes.py in
tests/format/test_planes.py; here: the targets survive the round trip at the
precision SPEC.md states, the packing helpers, refusal of bad records with an
error naming the field, and tf.data's choice of decoder by record version
(a version-1 window still trains).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from format import codec
from format import schema
from format.example_fields import set_int64
from format.example_proto import Example
from model.tfdata import shard_record_version, training_dataset
from pipeline import labels as L
from pipeline import positions as P
from testdata import records_v1
from testdata.random_games import engine_game, resigned_copy

UNKNOWN_VERSION = max(schema.POSITION_RECORD_VERSIONS) + 1
"""A position-record version no reader knows (yet)."""


@pytest.fixture(scope="module")
def batches():
    """{N: PositionBatch} of finished games and one resigned game (played-out labels), 9x9 and 19x19."""
    rng = np.random.default_rng(5)
    out = {}
    for n, count in ((9, 4), (19, 1)):
        games = [engine_game(rng, n, visits=50, full_search_fraction=0.5) for _ in range(count)]
        games.append(resigned_copy(engine_game(rng, n), 0.5))
        labels = L.label_games(games, policy_fn=None, random_playouts=3, model_playout_moves=0, temperature=1.0,
                               playout_weight=0.5, rng=rng, stats=L.empty_stats())
        out[n] = P.games_positions(games, labels, list(range(len(games))), dedup_max_move=0)
    return out


def test_trits_round_trip_and_mark_bad_bytes():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 3, size=(7, 361)).astype(np.uint8)
    packed = codec.pack_trits(codes)
    assert packed.shape == (7, schema.trit_bytes(19)) == (7, 73) and packed.max() <= 242
    np.testing.assert_array_equal(codec.unpack_trits(packed, 361), codes)
    assert (codec.unpack_trits(np.array([[243]], np.uint8), 5) == 3).all()


def test_policy_small_integers_keep_visit_counts_and_scale_the_rest():
    visits = np.array([40, 10, 3, 1, 1], np.float64)
    other = np.array([0.5, 0.3, 0.2 - 1e-4, 1e-4])
    offsets = np.array([0, 5, 5, 9])  # the middle position has no target
    values = codec.policy_small_integers(np.concatenate([visits / visits.sum(), other]), offsets)
    np.testing.assert_array_equal(values[:5], visits)
    assert values[5] == 255 and values.min() >= 1  # scaled: largest 255, nothing lost
    np.testing.assert_allclose(values[5:] / values[5:].sum(), other, atol=2 / 255)


@pytest.mark.parametrize("n", (9, 19))
def test_targets_survive_at_the_stated_precision(n, batches):
    batch = batches[n]
    records = batch.encode()
    assert len(records) == -(-len(batch) // schema.POSITION_GROUP)
    decoded = [p for r in records for p in codec.decode_records(r, "shard#0")]
    assert len(decoded) == len(batch)
    for i, rec in enumerate(decoded):
        assert rec.version == 2 and rec.to_play == batch.to_play[i] and rec.generation == batch.generation[i]
        assert rec.move_number == batch.move_number[i] and rec.game == batch.instance[i] and rec.game_id == ""
        index, prob = batch.policy(i)
        np.testing.assert_array_equal(rec.policy_index, index)
        np.testing.assert_allclose(rec.policy_prob, prob, atol=1e-6)  # visit counts: exact
        # Exact labels (ternary) and played-out ones (int8) both come back as version 1 gives them.
        np.testing.assert_array_equal(rec.ownership, batch.ownership[i].astype(np.float32) / schema.OWNERSHIP_SCALE)
        assert rec.value == batch.value[i] and rec.score == batch.score[i]
        assert (rec.policy_weight, rec.value_weight, rec.ownership_weight, rec.score_weight) == (
            batch.policy_weight[i], batch.value_weight[i], batch.ownership_weight[i], batch.score_weight[i])
    assert {d.ownership_weight for d in decoded} == {1.0, 0.5}  # exact and played-out labels both present
    fractional = [d for d in decoded if not np.isin(d.ownership, (-1.0, 0.0, 1.0)).all()]
    assert fractional and all(d.ownership_weight == 0.5 for d in fractional)


def _record(fields: dict) -> bytes:
    ex = Example()
    ex.ParseFromString(codec.encode_position_groups(fields.pop("compact"))[0])
    for name, value in fields.items():
        del ex.features.feature[name]
        if isinstance(value, bytes):
            ex.features.feature[name].bytes_list.value.append(value)
        else:
            set_int64(ex, name, value)
    return ex.SerializeToString()


@pytest.mark.parametrize("field, value, problem", [
    (schema.P_VERSION, [UNKNOWN_VERSION], f"unknown position-record version {UNKNOWN_VERSION}"),
    (schema.P2_COUNT, [65], "outside 1..64"),
    (schema.P2_BOARD, bytes([243]) * (64 * 17), "not 5 base-3 digits"),
    (schema.P2_MOVES, bytes([83]) * (64 * 7), "above 82"),
    (schema.P2_POLICY_VALUE, [0], "integers in 1..255"),
    (schema.P2_CAPTURE_COUNT, [1] * 64, "sums to 64"),
    (schema.P2_OWNERSHIP_FINE, bytes(5), "fine positions x 81"),
])
def test_bad_records_are_refused_naming_the_field(field, value, problem, batches):
    data = _record({"compact": batches[9].take(np.arange(64)).compact(), field: value})
    with pytest.raises(codec.FormatError) as err:
        codec.decode_records(data, "w/shard.tfrecord.gz#3")
    assert err.value.field == field and problem in str(err.value) and "w/shard.tfrecord.gz#3" in str(err.value)


def test_game_ids_come_from_the_window_game_table(batches):
    """A position stores its game's index in the table; the ids live once, in the manifest."""
    batch = batches[9]
    table = sorted(set(batch.game_id.astype(str).tolist()))
    game = np.array([table.index(g) for g in batch.game_id.astype(str)])
    decoded = [p for r in batch.encode(game) for p in codec.decode_records(r, "s#0", games=table)]
    assert [d.game_id for d in decoded] == batch.game_id.astype(str).tolist()
    with pytest.raises(codec.FormatError, match="game table has 2") as err:
        codec.decode_records(batch.encode(game)[0], "s#0", games=table[:2])
    assert err.value.field == schema.P2_GAME


def test_decode_position_points_version_2_to_decode_records(batches):
    with pytest.raises(codec.FormatError, match="decode_records"):
        codec.decode_position(batches[9].encode()[0])


def _write(path, records) -> str:
    with open(path, "wb") as f:
        f.write(codec.encode_shard(records))
    return str(path)


def test_training_dataset_reads_either_version_by_its_records(tmp_path, batches):
    """The same positions as version-1 and version-2 shards give the same training batches."""
    batch = batches[9]
    fresh_rows = np.zeros((len(batch), 2, 81), np.uint8)  # v1 planes come from the decoded v2 records
    decoded = [p for r in batch.encode() for p in codec.decode_records(r)]
    planes = np.stack([np.packbits(d.planes.ravel(), bitorder="big") for d in decoded])
    del fresh_rows
    v1 = records_v1.encode_positions(
        board_size=9, planes_packed=planes, to_play=batch.to_play, policy_offsets=batch.policy_offsets,
        policy_index=batch.policy_index, policy_prob=batch.policy_prob, value=batch.value, score=batch.score,
        ownership=batch.ownership, policy_weight=batch.policy_weight, value_weight=batch.value_weight,
        ownership_weight=batch.ownership_weight, score_weight=batch.score_weight, game_id=batch.game_id,
        move_number=batch.move_number, generation=batch.generation)
    paths = {1: _write(tmp_path / "v1.tfrecord.gz", v1), 2: _write(tmp_path / "v2.tfrecord.gz", batch.encode())}
    streams = {}
    for version, path in paths.items():
        assert shard_record_version(path) == version
        dataset = training_dataset([path], board_size=9, batch_size=32, seed=3, shuffle_buffer=0, repeat=False)
        streams[version] = [b for b in dataset]
    assert len(streams[1]) == len(streams[2]) == len(batch) // 32
    for one, two in zip(streams[1], streams[2]):
        for key in one:
            np.testing.assert_allclose(two[key].numpy(), one[key].numpy(), atol=1e-6, err_msg=key)


def test_an_unknown_record_version_is_refused_with_what_to_do(tmp_path, batches):
    ex = Example()
    ex.ParseFromString(batches[9].encode()[0])
    del ex.features.feature[schema.P_VERSION]
    set_int64(ex, schema.P_VERSION, [UNKNOWN_VERSION])
    path = _write(tmp_path / "unknown.tfrecord.gz", [ex.SerializeToString()])
    with pytest.raises(codec.FormatError, match="update zerolake"):
        training_dataset([path], board_size=9, batch_size=8, seed=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="mixes record versions"):
        dataset = training_dataset([path], board_size=9, batch_size=8, seed=0, record_version=2, repeat=False)
        next(iter(dataset))


def test_window_manifest_names_its_record_version_and_refuses_an_unknown_one():
    import json

    from format import layout
    from format.documents import ManifestError
    from format.window_manifest import parse_window_manifest, WINDOW_MANIFEST_VERSION

    path = layout.window_manifest(3)
    document = {"version": WINDOW_MANIFEST_VERSION, "target_generation": 3, "board_size": 9,
                "shards": ["a-0-of-1.tfrecord.gz"], "positions": 10}
    assert parse_window_manifest(json.dumps(document).encode(), path).record_version == 1
    document["record_version"] = 2
    assert parse_window_manifest(json.dumps(document).encode(), path).record_version == 2
    document["record_version"] = UNKNOWN_VERSION
    with pytest.raises(ManifestError, match="record_version.*update zerolake"):
        parse_window_manifest(json.dumps(document).encode(), path)
