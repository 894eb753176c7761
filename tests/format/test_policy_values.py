"""Policy values of position records (format/SPEC.md "Position records").

A record keeps each position's policy as integers proportional to it
(`codec.policy_integers`): the target the worker recorded, no entry raised.
Here, on legal random games whose targets are shaped like Gumbel improved
policies and quantized as the worker quantizes them (`codec.quantize_policy`
to its denominator): the shuffle job's encoding (`PositionBatch.compact`,
then the wire encoder) round-trips every target whose smallest value is at
most 16 of its unit exactly, in numpy and in tf.data's graph, and every
other target within SPEC.md's bound, never raising an entry; a tail of many
small entries keeps its mass; entries that scale to 0 are dropped with
their index; visit counts are stored as the counts; a window trains through
`training_dataset`; and bad values are refused, naming the field.
"""
from __future__ import annotations

import collections
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
from tests.format.reference_records import encode_position_groups


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
    """Mass of the entries below ``largest_share`` of the target's largest: its tail."""
    prob = np.asarray(prob, np.float64)
    return float(prob[prob < largest_share * prob.max()].sum())


def test_gumbel_targets_read_back_as_the_worker_recorded_them(gumbel_window):
    games, batch, game, table = gumbel_window
    n = table.board_size
    compact = batch.compact(game, table)
    records = codec.encode_groups(compact)
    assert records == encode_position_groups(compact)
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
    truth_tail, stored_tail = np.array(tails).sum(axis=0)
    assert truth_tail > 0.005 * len(tails)  # the targets do have a tail below 1/255 of the largest...
    assert abs(stored_tail - truth_tail) <= 1e-5 * truth_tail  # ...which the records keep


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


def test_dropped_entries_leave_the_record_with_their_index(gumbel_window):
    """The entries that scale to 0 are dropped, index and offsets with them (codec.policy_columns)."""
    _, batch, game, table = gumbel_window
    rows = np.flatnonzero(np.diff(batch.policy_offsets) > 3)[:70]
    part = batch.take(rows)
    prob = part.policy_prob.astype(np.float64) * np.random.default_rng(2).uniform(0.5, 1.5, len(part.policy_prob))
    tiny = part.policy_offsets[:-1] + 1  # the second entry of each position: far below max / 131070
    prob[tiny] = 1e-9
    compact = dataclasses.replace(part, policy_prob=prob.astype(np.float32)).compact(game[rows], table)
    assert len(compact.policy_index) == len(part.policy_index) - len(rows)
    decoded = [p for r in codec.encode_groups(compact) for p in codec.decode_records(r, "s#0", table=table)]
    for i, position in enumerate(decoded):
        lo, hi = part.policy_offsets[i], part.policy_offsets[i + 1]
        keep = np.r_[lo, lo + 2:hi]
        np.testing.assert_array_equal(position.policy_index, part.policy_index[keep])
        assert np.abs(position.policy_prob - prob[keep] / prob[lo:hi].sum()).sum() <= l1_bound(table.board_size)


def test_visit_counts_are_stored_as_the_counts():
    """A target of visit counts whose smallest is at most POLICY_UNITS is stored as the counts (up to a
    common factor), however many visits: small integers, a few bits each in the gzip'd shard."""
    rng = np.random.default_rng(7)
    games = [engine_game(rng, 9, visits=40, full_search_fraction=0.5) for _ in range(3)]
    labels = L.label_games(games, policy_fn=None, random_playouts=2, model_playout_moves=0, temperature=1.0,
                           playout_weight=0.5, rng=rng, stats=L.empty_stats())
    batch = P.games_positions(games, labels, [0, 1, 2], dedup_max_move=0)
    counts = [np.asarray(games[g].policy_values[m], np.int64) for g, m in zip(batch.instance, batch.move_number)]
    batch = batch.take(np.flatnonzero([len(c) and c.min() <= schema.POLICY_UNITS for c in counts]))
    table = codec.GameTable(board_size=9, generation=[0, 0, 0], ownership=P.game_label_rows(labels))
    compact = batch.compact(batch.instance.astype(np.int64), table)
    assert len(compact.policy_value) > 500
    for i, (g, m) in enumerate(zip(batch.instance, batch.move_number)):
        visits = np.asarray(games[g].policy_values[m], np.int64)
        values = compact.policy_value[compact.policy_offsets[i]:compact.policy_offsets[i + 1]].astype(np.int64)
        np.testing.assert_array_equal(values * visits[0], visits * values[0])  # proportional...
        assert values.max() <= visits.max()                                    # ...and no larger
    counts = np.array([700, 300, 2, 1, 1], np.float64)  # 1004 visits
    values = codec.policy_integers(counts / counts.sum(), np.array([0, 5]))
    np.testing.assert_array_equal(values, counts)


def test_tfdata_decodes_the_worker_targets_and_trains_a_window(tmp_path, gumbel_window):
    games, batch, game, table = gumbel_window
    n = table.board_size
    records = codec.encode_groups(batch.compact(game, table))
    decoder = GroupDecoder(n, table=table, jit=False)
    policy = decoder.decode(tf.constant(records), tf.zeros([len(batch)], tf.int32))["policy"].numpy()
    for i in range(len(batch)):
        index, value, truth = recorded_target(games, batch, i)
        if len(index) and value.min() <= schema.POLICY_UNITS:
            expected = np.zeros(schema.num_actions(n))
            expected[index] = truth
            np.testing.assert_allclose(policy[i], expected, rtol=1e-6, atol=1e-9)
    if n != 9:
        return  # one board size through the whole reader is enough (tests/format/test_planes.py runs the job)
    paths = []
    for shard, rows in enumerate(np.array_split(np.arange(len(batch)), 2)):
        path = tmp_path / layout.shard_name("four", shard, 2)
        path.write_bytes(codec.encode_shard(codec.encode_groups(batch.take(rows).compact(game[rows], table))))
        paths.append(str(path))
    (tmp_path / layout.game_table_name("four")).write_bytes(codec.encode_game_table(table))
    assert [shard_record_version(p) for p in paths] == [schema.POSITION_RECORD_VERSION] * 2
    stream = list(training_dataset(paths, board_size=n, batch_size=64, seed=4, shuffle_buffer=256, repeat=False))
    assert len(stream) == len(batch) // 64
    streamed = np.concatenate([b["policy"].numpy() for b in stream])
    sums = streamed.sum(axis=1)
    assert np.all((np.abs(sums - 1) < 1e-5) | (sums == 0))
    # The stream is shuffled and augmented (a symmetry permutes a target, its sorted values stay): its
    # targets are among the decoder's, counted with multiplicity.
    def key(p):
        return np.sort(p).round(6).tobytes()
    assert not collections.Counter(map(key, streamed)) - collections.Counter(map(key, policy))
    manifest = {"version": WINDOW_MANIFEST_VERSION, "record_version": schema.POSITION_RECORD_VERSION,
                "target_generation": 1, "board_size": n, "shards": [os.path.basename(p) for p in paths],
                "positions": len(batch), "games": [str(i) for i in range(len(table))],
                "game_table": layout.game_table_name("four")}
    assert parse_window_manifest(json.dumps(manifest).encode(),
                                        layout.window_manifest(1)).record_version == schema.POSITION_RECORD_VERSION


def _with_values(record: bytes, values) -> bytes:
    ex = Example()
    ex.ParseFromString(record)
    del ex.features.feature[schema.P_POLICY_VALUE]
    set_int64(ex, schema.P_POLICY_VALUE, values)
    return ex.SerializeToString()


def test_values_outside_the_range_are_refused_naming_the_field(gumbel_window):
    _, batch, game, table = gumbel_window
    rows = np.arange(min(len(batch), schema.POSITION_GROUP))
    part = batch.take(rows)
    (record,) = part.encode(game[rows], table)
    entries = len(part.policy_index)
    assert entries > 2
    wide = [256] * entries  # wider than a byte: fine
    assert len(codec.decode_records(_with_values(record, wide), "s#0", table=table)) == len(rows)
    for values in ([schema.POLICY_VALUE_MAX + 1] * entries, [0] * entries):
        with pytest.raises(codec.FormatError, match="integers in 1..65535") as err:
            codec.decode_records(_with_values(record, values), "s#0", table=table)
        assert err.value.field == schema.P_POLICY_VALUE and "s#0" in str(err.value)
    decoder = GroupDecoder(table.board_size, table=table, jit=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="'policy_value' holds a value above 65535"):
        decoder.decode(tf.constant([_with_values(record, [1 << 16] * entries)]), tf.zeros([len(rows)], tf.int32))
    with pytest.raises(ValueError, match="position records need their window's game table"):
        GroupDecoder(table.board_size, table=None)


def test_the_wire_encoder_writes_the_reference_bytes_with_wide_values(gumbel_window):
    _, batch, game, table = gumbel_window
    for rows in (np.arange(len(batch)), np.arange(schema.POSITION_GROUP + 5), np.arange(3), np.arange(0)):
        compact = batch.take(rows).compact(game[rows], table)
        assert codec.encode_groups(compact) == encode_position_groups(compact)
    compact = batch.compact(game, table)
    compact.policy_value = np.full(len(compact.policy_value), schema.POLICY_VALUE_MAX, np.uint16)  # 3-byte varints
    assert codec.encode_groups(compact) == encode_position_groups(compact)
