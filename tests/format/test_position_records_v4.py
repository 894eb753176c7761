"""Version-4 position records (format/SPEC.md "Position records, version 4").

Version 4 is version 3 with policy values that keep the target the worker
recorded: version 3 scaled a target that was not visit counts of at most 255
so its largest entry was 255 and raised every other entry to at least 1, so
a Gumbel improved policy's tail of small entries read back several times
heavier.  Here, on legal random games whose targets are shaped like Gumbel
improved policies and quantized as the worker quantizes them
(`codec.quantize_policy` to its denominator): the shuffle job's encoding
(`codec.written_positions`, then the wire encoder) round-trips every target
whose smallest value is at most 16 of its unit exactly, in numpy and in
tf.data's graph, and every other target within SPEC.md's bound, never
raising an entry; a tail of many small entries keeps its mass where version 3
made it heavier; visit counts cost what they cost in version 3; a version-4
window trains through `training_dataset` as the version-3 window of the same
positions does, but for the policy; and bad values are refused, naming the field.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from format import codec
from format import layout
from format.window_manifest import parse_window_manifest, WINDOW_MANIFEST_VERSION
from format import schema
from format.example_fields import set_int64
from format.example_proto import Example
from model.tfdata import GroupDecoder, shard_record_version, training_dataset
from pipeline import labels as L
from pipeline import positions as P
from selfplay.worker import POLICY_DENOMINATOR
from testdata.random_games import engine_game


def gumbel_shaped(rng: np.random.Generator, legal: np.ndarray) -> np.ndarray:
    """Probabilities over ``legal`` shaped like an improved policy: softmax of spread-out logits, one move
    lifted well above the rest, so a long tail of entries lies below 1/255 of the largest."""
    logits = rng.normal(0.0, 2.0, len(legal))
    logits[rng.integers(len(legal))] += 6.0
    p = np.exp(logits - logits.max())
    return p / p.sum()


def with_gumbel_targets(game: codec.GameRecord, rng: np.random.Generator) -> codec.GameRecord:
    """``game`` with each recorded target replaced by a Gumbel-shaped one over the empty points and pass,
    quantized as `selfplay.worker` quantizes an improved policy."""
    n = game.board_size
    indices, values = [], []
    for i, old in enumerate(game.policy_indices):
        if not len(old):
            indices.append(np.zeros(0, np.int64))
            values.append(np.zeros(0, np.int64))
            continue
        legal = np.r_[np.flatnonzero(game.planes[i].reshape(2, -1).sum(axis=0) == 0), n * n]
        index, value = codec.quantize_policy(gumbel_shaped(rng, legal), POLICY_DENOMINATOR)
        indices.append(legal[index])
        values.append(value)
    return dataclasses.replace(game, policy_indices=indices, policy_values=values)


@pytest.fixture(scope="module", params=(9, 19))
def gumbel_window(request):
    """(games as a chunk holds them, PositionBatch in a shard's shuffled order, game index per position,
    GameTable) of games whose targets are quantized Gumbel-shaped policies."""
    n = request.param
    rng = np.random.default_rng(41)
    games = [with_gumbel_targets(engine_game(rng, n, visits=32, full_search_fraction=0.5), rng)
             for _ in range(3 if n == 9 else 1)]
    games = codec.read_chunk(codec.encode_chunk(games), f"c{schema.CHUNK_SUFFIX}")  # what the lake holds
    labels = L.label_games(games, policy_fn=None, random_playouts=2, model_playout_moves=0, temperature=1.0,
                           playout_weight=0.5, rng=rng, stats=L.empty_stats())
    batch = P.games_positions(games, labels, list(range(len(games))), dedup_max_move=0)
    batch = batch.take(rng.permutation(len(batch)))
    table = codec.GameTable(board_size=n, generation=[g.generation for g in games],
                            ownership=P.game_label_rows(labels))
    return games, batch, batch.instance.astype(np.int64), table


def written(batch, game, table) -> codec.CompactPositions:
    """What the shuffle job writes of ``batch`` (pipeline.transforms.WriteShardFn)."""
    return codec.written_positions(batch.compact(game, table), batch.policy_prob)


def recorded_target(games, batch, i) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices, integer values, probabilities) of position ``i``'s target as its game's chunk holds it."""
    g = games[batch.instance[i]]
    index = np.asarray(g.policy_indices[batch.move_number[i]])
    value = np.asarray(g.policy_values[batch.move_number[i]], np.int64)
    return index, value, value / POLICY_DENOMINATOR


def l1_bound(n: int) -> float:
    """SPEC.md's bound on the L1 change of a target stored by scaling (case 2), A = N*N + 1 entries."""
    actions = schema.num_actions(n)
    return actions / (schema.POLICY_VALUE_MAX - actions / 2)


def tail_mass(index, prob, largest_share=1 / 255) -> float:
    """Mass of the entries below ``largest_share`` of the target's largest: the tail version 3 raised."""
    prob = np.asarray(prob, np.float64)
    return float(prob[prob < largest_share * prob.max()].sum())


def test_gumbel_targets_read_back_as_the_worker_recorded_them(gumbel_window):
    games, batch, game, table = gumbel_window
    n = table.board_size
    compact = written(batch, game, table)
    assert compact.version == schema.POSITION_RECORD_VERSION == 4
    records = codec.encode_groups(compact)
    assert records == codec.encode_position_groups(compact)
    decoded = [p for r in records for p in codec.decode_records(r, "s#0", table=table)]
    assert len(decoded) == len(batch)
    exact = scaled = 0
    tails = []
    for i, position in enumerate(decoded):
        index, value, truth = recorded_target(games, batch, i)
        if not len(index):
            assert not len(position.policy_index)
            continue
        np.testing.assert_array_equal(position.policy_index, index)  # nothing dropped, nothing added
        if value.min() <= schema.POLICY_UNITS:  # case 1: whole multiples of one unit, the worker's integers
            np.testing.assert_allclose(position.policy_prob, truth, rtol=1e-6)
            exact += 1
        else:  # case 2: scaled to 65535, within SPEC.md's bound
            assert np.abs(position.policy_prob - truth).sum() <= l1_bound(n)
            scaled += 1
        tails.append((tail_mass(index, truth), tail_mass(index, position.policy_prob, 1 / 255)))
    assert exact >= 0.8 * (exact + scaled) and exact > 20
    truth_tail, v4_tail = np.array(tails).sum(axis=0)
    assert truth_tail > 0.005 * len(tails)  # the targets do have a tail below 1/255 of the largest...
    assert abs(v4_tail - truth_tail) <= 1e-5 * truth_tail  # ...which version 4 keeps


def test_version_3_made_the_same_tails_heavier(gumbel_window):
    """The floor version 4 removes: version 3's values of the same targets give their tails half as much
    mass again as the worker recorded, or more (so the test above checks something version 3 fails)."""
    games, batch, game, table = gumbel_window
    v3 = [p for r in batch.encode(game, table) for p in codec.decode_records(r, "s#0", table=table)]
    truth_tail = v3_tail = 0.0
    for i, position in enumerate(v3):
        index, _, truth = recorded_target(games, batch, i)
        if len(index):
            below = truth < truth.max() / 255
            truth_tail += truth[below].sum()
            v3_tail += position.policy_prob[below].sum()
    assert v3_tail > 1.5 * truth_tail


def test_a_tail_of_many_small_entries_keeps_its_mass_and_nothing_is_raised():
    """Case 2 (no unit: float probabilities, as a capped opening's merged mean): a 19x19 target whose
    largest entry is 0.3 and whose tail of 300 entries, each below 1/255 of it, holds 15% of the mass,
    with 5 entries below max / 131070, which are dropped.  The whole target moves by at most SPEC.md's
    L1 bound; the tail, each of its m entries within 0.5 of 65535 p / max(p) and the sum's error
    shared out, by at most (m + 0.15 A) / 2 units of max(p) / (65535 - A/2): under 1% of its mass."""
    rng = np.random.default_rng(5)
    actions = schema.num_actions(19)
    prob = np.zeros(actions)
    prob[:5] = 0.3 / 131070 * rng.uniform(0.01, 0.9, 5)                  # below the smallest value: dropped
    prob[5:300] = rng.uniform(0.1, 1.0, 295)
    prob[5:300] *= (0.15 - prob[:5].sum()) / prob[5:300].sum()          # the tail: 15% of the mass
    prob[300:-1] = rng.uniform(0.1, 1.0, actions - 301)
    prob[300:-1] *= 0.55 / prob[300:-1].sum()
    prob[-1] = 0.3                                                        # pass, the largest
    assert abs(prob.sum() - 1) < 1e-12 and (prob[:300] < prob.max() / 255).all()
    offsets = np.array([0, actions])
    values = codec.policy_integers(prob, offsets).astype(np.int64)
    assert values.max() == schema.POLICY_VALUE_MAX
    assert (values <= schema.POLICY_VALUE_MAX * prob / prob.max() + 0.5).all()  # never raised
    np.testing.assert_array_equal(values[:5], 0)
    assert (values[5:] > 0).all()
    back = values / values.sum()
    assert np.abs(back - prob).sum() <= l1_bound(19)
    assert abs(back[:300].sum() - 0.15) <= 0.01 * 0.15
    v3 = codec.policy_small_integers(prob, offsets).astype(np.float64)
    assert v3[:300].sum() / v3.sum() > 1.8 * 0.15  # version 3: the floor all but doubles it


def test_dropped_entries_leave_the_record_with_their_index(gumbel_window):
    """written_positions drops the entries that scale to 0, index and offsets with them."""
    _, batch, game, table = gumbel_window
    rows = np.flatnonzero(np.diff(batch.policy_offsets) > 3)[:70]
    part = batch.take(rows)
    prob = part.policy_prob.astype(np.float64) * np.random.default_rng(2).uniform(0.5, 1.5, len(part.policy_prob))
    tiny = part.policy_offsets[:-1] + 1  # the second entry of each position: far below max / 131070
    prob[tiny] = 1e-9
    compact = codec.written_positions(part.compact(game[rows], table), prob.astype(np.float32))
    assert len(compact.policy_index) == len(part.policy_index) - len(rows)
    decoded = [p for r in codec.encode_groups(compact) for p in codec.decode_records(r, "s#0", table=table)]
    for i, position in enumerate(decoded):
        lo, hi = part.policy_offsets[i], part.policy_offsets[i + 1]
        keep = np.r_[lo, lo + 2:hi]
        np.testing.assert_array_equal(position.policy_index, part.policy_index[keep])
        assert np.abs(position.policy_prob - prob[keep] / prob[lo:hi].sum()).sum() <= l1_bound(table.board_size)


def test_visit_counts_cost_what_they_cost_in_version_3():
    """Visit counts of at most 255 are the same values as version 3's (the records differ in the version
    byte only); larger counts are stored exactly where version 3 scaled them."""
    rng = np.random.default_rng(7)
    games = [engine_game(rng, 9, visits=40, full_search_fraction=0.5) for _ in range(3)]
    labels = L.label_games(games, policy_fn=None, random_playouts=2, model_playout_moves=0, temperature=1.0,
                           playout_weight=0.5, rng=rng, stats=L.empty_stats())
    batch = P.games_positions(games, labels, [0, 1, 2], dedup_max_move=0)
    # The positions whose counts version 3 stores as they are (a few, such as 20 and 21 visits, it scales).
    smallest = [min(games[g].policy_values[m], default=1) for g, m in zip(batch.instance, batch.move_number)]
    batch = batch.take(np.flatnonzero(np.array(smallest) <= schema.POLICY_UNITS))
    table = codec.GameTable(board_size=9, generation=[0, 0, 0], ownership=P.game_label_rows(labels))
    game = batch.instance.astype(np.int64)
    v3, v4 = batch.compact(game, table), written(batch, game, table)
    assert v3.policy_value.max() < 255 and len(v3.policy_value) > 500
    np.testing.assert_array_equal(v4.policy_value, v3.policy_value)
    three, four = codec.encode_groups(v3), codec.encode_groups(v4)
    assert [len(r) for r in three] == [len(r) for r in four]
    assert abs(len(codec.encode_shard(four)) - len(codec.encode_shard(three))) <= 8
    counts = np.array([700, 300, 2, 1, 1], np.float64)  # 1004 visits: version 3 scales these
    values = codec.policy_integers(counts / counts.sum(), np.array([0, 5]))
    np.testing.assert_array_equal(values, counts)
    assert list(codec.policy_small_integers(counts / counts.sum(), np.array([0, 5]))) == [255, 109, 1, 1, 1]


def test_tfdata_decodes_the_worker_targets_and_trains_a_version_4_window(tmp_path, gumbel_window):
    games, batch, game, table = gumbel_window
    n = table.board_size
    compact = written(batch, game, table)
    records = codec.encode_groups(compact)
    decoder = GroupDecoder(n, version=4, table=table, jit=False)
    policy = decoder.decode(tf.constant(records), tf.zeros([len(batch)], tf.int32))["policy"].numpy()
    for i in range(len(batch)):
        index, value, truth = recorded_target(games, batch, i)
        if len(index) and value.min() <= schema.POLICY_UNITS:
            expected = np.zeros(schema.num_actions(n))
            expected[index] = truth
            np.testing.assert_allclose(policy[i], expected, rtol=1e-6, atol=1e-9)
    if n != 9:
        return  # one board size through the whole reader is enough (tests/format/test_planes.py runs the job)
    paths = {}
    for version, attempt, make in ((3, "three", lambda rows: batch.take(rows).encode(game[rows], table)),
                                   (4, "four", lambda rows: codec.encode_groups(written(batch.take(rows), game[rows],
                                                                                        table)))):
        paths[version] = []
        for shard, rows in enumerate(np.array_split(np.arange(len(batch)), 2)):
            path = tmp_path / layout.shard_name(attempt, shard, 2)
            path.write_bytes(codec.encode_shard(make(rows)))
            paths[version].append(str(path))
        (tmp_path / layout.game_table_name(attempt)).write_bytes(codec.encode_game_table(table))
    assert [shard_record_version(p) for p in paths[4]] == [4, 4]
    streams = {version: list(training_dataset(paths[version], board_size=n, batch_size=64, seed=4,
                                              shuffle_buffer=256, repeat=False)) for version in (3, 4)}
    assert len(streams[3]) == len(streams[4]) == len(batch) // 64
    tails = np.zeros(2)
    for three, four in zip(streams[3], streams[4]):
        for key in three:
            if key != "policy":
                assert three[key].numpy().tobytes() == four[key].numpy().tobytes(), key
        p3, p4 = three["policy"].numpy(), four["policy"].numpy()
        np.testing.assert_array_equal(p3 > 0, p4 > 0)  # the same entries...
        small = (p4 > 0) & (p4 < p4.max(axis=1, keepdims=True) / 255)
        tails += (p3 * small).sum(), (p4 * small).sum()
    assert tails[0] > 1.5 * tails[1]  # ...whose tail version 3 made heavier
    manifest = {"version": WINDOW_MANIFEST_VERSION, "record_version": 4, "target_generation": 1,
                "board_size": n, "shards": [os.path.basename(p) for p in paths[4]], "positions": len(batch),
                "games": [str(i) for i in range(len(table))], "game_table": layout.game_table_name("four")}
    assert parse_window_manifest(json.dumps(manifest).encode(), layout.window_manifest(1)).record_version == 4


def _with_values(record: bytes, values) -> bytes:
    ex = Example()
    ex.ParseFromString(record)
    del ex.features.feature[schema.P2_POLICY_VALUE]
    set_int64(ex, schema.P2_POLICY_VALUE, values)
    return ex.SerializeToString()


def test_values_outside_the_versions_range_are_refused_naming_the_field(gumbel_window):
    _, batch, game, table = gumbel_window
    rows = np.arange(min(len(batch), schema.POSITION_GROUP))
    part = batch.take(rows)
    (four,) = codec.encode_groups(written(part, game[rows], table))
    (three,) = part.encode(game[rows], table)
    entries = len(part.policy_index)
    assert entries > 2
    wide = [schema.SMALL_POLICY_VALUE_MAX + 1] * entries
    assert len(codec.decode_records(_with_values(four, wide), "s#0", table=table)) == len(rows)
    for record, values, problem in ((three, wide, "integers in 1..255"),
                                    (four, [schema.POLICY_VALUE_MAX + 1] * entries, "integers in 1..65535"),
                                    (four, [0] * entries, "integers in 1..65535")):
        with pytest.raises(codec.FormatError, match=problem) as err:
            codec.decode_records(_with_values(record, values), "s#0", table=table)
        assert err.value.field == schema.P2_POLICY_VALUE and "s#0" in str(err.value)
    decoder = GroupDecoder(table.board_size, version=4, table=table, jit=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="'policy_value' holds a value above 65535"):
        decoder.decode(tf.constant([_with_values(four, [1 << 16] * entries)]), tf.zeros([len(rows)], tf.int32))
    with pytest.raises(ValueError, match="version-4 records need their window's game table"):
        GroupDecoder(table.board_size, version=4)


def test_the_wire_encoder_writes_the_reference_bytes_with_wide_values(gumbel_window):
    _, batch, game, table = gumbel_window
    for rows in (np.arange(len(batch)), np.arange(schema.POSITION_GROUP + 5), np.arange(3), np.arange(0)):
        compact = written(batch.take(rows), game[rows], table)
        assert codec.encode_groups(compact) == codec.encode_position_groups(compact)
    compact = written(batch, game, table)
    compact.policy_value = np.full(len(compact.policy_value), schema.POLICY_VALUE_MAX, np.uint16)  # 3-byte varints
    assert codec.encode_groups(compact) == codec.encode_position_groups(compact)
