"""Unit tests of the shuffle job's pieces: window rule, positions, dedup, copies, labels."""
from __future__ import annotations

import numpy as np
import pytest

from format import codec
from format import schema
from format import layout
from testdata.synthetic_games import synthetic_game
from pipeline import labels as L
from pipeline import positions as P
from pipeline import window_plan as W
from pipeline.config import ShuffleConfig
from pipeline.transforms import chunk_problem, duplicate_instances
from tests.pipeline.support import engine_game, resigned_copy


# --- window ------------------------------------------------------------------


def test_window_is_whole_lake_below_minimum_then_grows_sublinearly():
    m, s, a = 1000, 1000, 0.65
    assert W.window_positions(800, m, s, a) == 800
    sizes = [W.window_positions(t, m, s, a) for t in (2000, 4000, 8000, 16000, 64000)]
    assert all(x < y for x, y in zip(sizes, sizes[1:])), sizes
    assert all(w < t for w, t in zip(sizes, (2000, 4000, 8000, 16000, 64000)))
    # Slope 1 at the minimum: just above it the window is (almost) everything.
    assert W.window_positions(m + 10, m, s, a) >= m + 9
    # Power law: doubling a large lake grows the window by about 2**a.
    ratio = W.window_positions(2_000_000, m, s, a) / W.window_positions(1_000_000, m, s, a)
    assert abs(ratio - 2 ** a) < 0.02
    assert W.window_positions(10 ** 9, m, s, a, max_positions=5000) == 5000


def test_the_window_slope_scales_its_growth_past_the_minimum():
    m, s, a = 1000, 1000, 0.65
    assert W.window_positions(m + 1000, m, s, a, slope=0.4) == m + int(0.4 * (W.window_positions(m + 1000, m, s, a) - m))
    assert W.window_positions(m + 100, m, s, a, slope=0.4) <= m + 40          # 0.4 new ones per new position
    assert W.window_positions(800, m, s, a, slope=0.4) == 800                # the whole lake below the minimum


def test_chunk_listing_is_newest_first_and_ignores_other_files():
    class Info:
        def __init__(self, path, size):
            self.path, self.size = path, size

    listed = W.parse_chunk_listing([
        Info(layout.chunk_path(1, "w", 5, 1), 10),
        Info(layout.chunk_path(2, "w", 1, 0), 10),
        Info(layout.chunk_path(1, "w", 9, 2), 10),
        Info(layout.games_prefix(1) + "notes.txt", 10),
        Info(layout.games_prefix() + "README", 10),
    ])
    assert [(c.generation, c.time_ms) for c in listed] == [(2, 1), (1, 9), (1, 5)]


def test_bundles_hold_whole_chunks_of_about_the_target_size():
    bundles = W.bundle_chunks([100] * 10, positions_per_byte=2.0, bundle_positions=500)
    assert bundles == [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9,)]


def test_config_names_every_bad_flag():
    with pytest.raises(ValueError) as err:
        ShuffleConfig(root="x", reuse=0, window_exponent=2, playout_labels="magic")
    text = str(err.value)
    assert "--reuse" in text and "--window-exponent" in text and "--playout-labels" in text
    with pytest.raises(ValueError, match="--root"):
        ShuffleConfig()


# --- positions -----------------------------------------------------------------


def _label(game):
    return L.EndstateLabel(np.asarray(game.ownership, np.float32), game.score, schema.OWNERSHIP_FINAL_BOARD, 1.0)


@pytest.mark.parametrize("size", [9, 19])
def test_history_planes_and_targets_round_trip_through_position_records(size):
    rng = np.random.default_rng(size)
    game = synthetic_game(rng, size, visits=40, full_search_fraction=0.5, generation=3)
    batch = P.games_positions([game], [_label(game)], [7], dedup_max_move=10)
    table = codec.GameTable(board_size=size, generation=[3], ownership=P.game_label_rows([_label(game)]))
    in_table = np.zeros(len(batch), np.int64)  # instance 7 is the table's row 0
    records = batch.encode(in_table, table)
    assert len(records) == -(-game.num_positions // schema.POSITION_GROUP)  # groups of positions
    decoded = [position for record in records for position in codec.decode_records(record, table=table)]
    assert len(decoded) == game.num_positions
    for i in (0, 1, 5, game.num_positions - 1):
        rec = decoded[i]
        mover = schema.BLACK if i % 2 == 0 else schema.WHITE
        assert rec.to_play == mover and rec.generation == 3
        for k in range(schema.HISTORY_LENGTH):
            if i - k < 0:
                assert not rec.planes[k].any() and not rec.planes[8 + k].any()
                continue
            black, white = game.planes[i - k]
            own, opp = (black, white) if mover == schema.BLACK else (white, black)
            assert np.array_equal(rec.planes[k], own) and np.array_equal(rec.planes[8 + k], opp)
        index, prob = game.policy_probs(i)
        assert np.array_equal(rec.policy_index, index) and np.allclose(rec.policy_prob, prob)
        assert rec.policy_weight == float(game.full_search[i])
        assert rec.value == game.winner * mover
        assert rec.score == pytest.approx(game.score * mover)
        assert np.allclose(rec.ownership, game.ownership * mover)
    assert (batch.key[:10] != 0).all() and (batch.key[10:] == 0).all()
    # Serialization of temporary files keeps every byte.
    assert P.PositionBatch.from_bytes(batch.to_bytes()).encode(in_table, table) == records


def test_value_only_rows_keep_every_policy_row_and_the_configured_share_of_the_others():
    rng = np.random.default_rng(4)
    games = [synthetic_game(rng, 9, visits=40, full_search_fraction=0.25, generation=1) for _ in range(40)]
    batch = P.games_positions(games, [_label(g) for g in games], list(range(40)), dedup_max_move=10)
    with_target = int(np.count_nonzero(batch.policy_weight > 0))
    without = len(batch) - with_target
    assert 0 < with_target < without
    same, dropped = P.thin_value_only_rows(batch, 1.0, np.random.default_rng(0))
    assert same is batch and dropped == 0
    none, dropped = P.thin_value_only_rows(batch, 0.0, np.random.default_rng(0))
    assert (none.policy_weight > 0).all() and len(none) == with_target and dropped == without
    some, dropped = P.thin_value_only_rows(batch, 0.25, np.random.default_rng(0))
    kept_without = len(some) - with_target
    assert int(np.count_nonzero(some.policy_weight > 0)) == with_target and dropped == without - kept_without
    assert abs(kept_without - 0.25 * without) < 4 * np.sqrt(0.25 * 0.75 * without)
    # The window plan counts the rows a game will give, not its positions.
    full = sum(int(np.count_nonzero(g.full_search)) for g in games)
    assert sum(W.rows_kept(g, 0.25) for g in games) == pytest.approx(full + 0.25 * (len(batch) - full))
    assert sum(W.rows_kept(g, 1.0) for g in games) == len(batch)


def test_rows_after_a_resignation_are_kept_at_their_share_and_counted_by_the_plan():
    import dataclasses

    rng = np.random.default_rng(5)
    finished = [engine_game(rng, 9, generation=1, visits=8, full_search_fraction=0.5) for _ in range(6)]
    resigned = [dataclasses.replace(g, end_reason=schema.END_RESIGN, accelerated_from=g.num_positions // 2)
                for g in finished[:3]]
    games = [*resigned, *finished[3:]]
    after = P.after_resignation(games)
    tails = sum(g.num_positions - g.num_positions // 2 for g in resigned)
    assert len(after) == sum(g.num_positions for g in games) and int(after.sum()) == tails
    assert not after[resigned[0].num_positions // 2 - 1] and after[resigned[0].num_positions // 2]
    batch = P.games_positions(games, [_label(g) for g in games], list(range(len(games))), dedup_max_move=10)
    same, dropped = P.thin_after_resignation_rows(batch, after, 1.0, np.random.default_rng(0))
    assert same is batch and dropped == 0
    none, dropped = P.thin_after_resignation_rows(batch, after, 0.0, np.random.default_rng(0))
    assert dropped == tails and len(none) == len(batch) - tails
    assert (none.move_number[:resigned[0].num_positions // 2] == np.arange(resigned[0].num_positions // 2)).all()
    # The plan's expectation: a resigned game's tail counts at the share, the rest as before.
    game = resigned[0]
    assert W.rows_kept(game, 1.0, 0.0) == game.num_positions // 2
    assert W.rows_kept(game, 1.0, 0.5) == pytest.approx(game.num_positions // 2 + 0.5 * (game.num_positions -
                                                                                        game.num_positions // 2))
    assert W.rows_kept(finished[4], 1.0, 0.0) == finished[4].num_positions


def test_a_resigned_games_cheap_ending_labels_at_its_own_weight():
    import dataclasses

    rng = np.random.default_rng(6)
    game = engine_game(rng, 9, generation=1)
    accelerated = dataclasses.replace(game, end_reason=schema.END_RESIGN, accelerated_from=10,
                                      ownership_source=schema.OWNERSHIP_ACCELERATED)
    stats = __import__("collections").Counter()
    labels = L.label_games([game, accelerated], policy_fn=None, random_playouts=4, model_playout_moves=0,
                           temperature=1.0, playout_weight=0.5, rng=np.random.default_rng(0), stats=stats,
                           accelerated_weight=0.25)
    assert [label.weight for label in labels] == [1.0, 0.25]
    assert labels[1].source == schema.OWNERSHIP_ACCELERATED
    np.testing.assert_array_equal(labels[0].ownership, labels[1].ownership)


@pytest.mark.parametrize("size", [9, 13, 19])
def test_history_planes_of_games_laid_end_to_end(size):
    """Each position's 16 planes come from its own game only (compiled kernel vs the definition)."""
    rng = np.random.default_rng(size)
    move_number = np.concatenate([np.arange(k) for k in (1, 12, 3, 9)]).astype(np.int32)
    fresh = (rng.random((len(move_number), 2, size * size)) < 0.3).astype(np.uint8)
    packed = P.history_planes(fresh, move_number)
    planes = np.unpackbits(packed, axis=1, count=16 * size * size, bitorder="big").reshape(-1, 16, size * size)
    for p, t in enumerate(move_number.tolist()):
        mover = t % 2
        for k in range(schema.HISTORY_LENGTH):
            own = fresh[p - k, mover] if k <= t else 0
            opp = fresh[p - k, 1 - mover] if k <= t else 0
            assert np.array_equal(planes[p, k], np.broadcast_to(own, size * size))
            assert np.array_equal(planes[p, 8 + k], np.broadcast_to(opp, size * size))
    with pytest.raises(ValueError, match="before the first row"):
        P.history_planes(fresh[:3], np.array([0, 2, 1], np.int32))


def _opening_batch(num_games, cap_moves=4):
    """Games that share their first moves exactly (same planes, same history)."""
    rng = np.random.default_rng(5)
    base = synthetic_game(rng, 9, visits=30)
    batches = []
    for g in range(num_games):
        game = synthetic_game(rng, 9, visits=30, max_moves=20)
        game.planes[:cap_moves] = base.planes[:cap_moves]
        batches.append(P.games_positions([game], [_label(game)], [g], dedup_max_move=cap_moves))
    return P.concat(batches)


def test_keys_are_distinct_for_distinct_positions_and_spread_over_partitions():
    batch = _opening_batch(40, cap_moves=0)
    # The 16 history planes, packed, rebuilt from the records (board, moves, captures); the game
    # table's labels do not matter to the planes.
    games = int(batch.instance.max()) + 1
    table = codec.GameTable(board_size=9, generation=np.zeros(games, np.int64),
                            ownership=np.zeros((games, 81), np.int8))
    planes = np.stack([np.packbits(position.planes.ravel(), bitorder="big")
                       for record in batch.encode(None, table) for position in codec.decode_records(record, table=table)])
    rows = np.flatnonzero(batch.move_number < 12)
    keys = P.position_keys(planes, batch.to_play, batch.move_number, max_move=12)
    assert (keys[rows] != 0).all() and (keys[batch.move_number >= 12] == 0).all()
    distinct = {(planes[r].tobytes(), int(batch.to_play[r])) for r in rows.tolist()}
    assert len(set(keys[rows].tolist())) == len(distinct)
    # The same planes with the other side to move are another position.
    flipped = P.position_keys(planes[rows], -batch.to_play[rows], batch.move_number[rows], max_move=12)
    assert not set(flipped.tolist()) & set(keys[rows].tolist())
    for partitions in (2, 3, 8):
        counts = np.bincount(P.dedup_partition(keys[rows], partitions), minlength=partitions)
        assert len(counts) == partitions and counts.min() > 0.5 * len(rows) / partitions, counts


def test_cap_keeps_an_opening_cap_times_with_the_mean_of_all_targets():
    batch = _opening_batch(10)
    first = np.flatnonzero(batch.move_number == 0)
    assert len(set(batch.key[first].tolist())) == 1
    dense = np.zeros((len(first), 82))
    for j, r in enumerate(first.tolist()):
        index, prob = batch.policy(r)
        dense[j, index] = prob
    expected_policy = dense.mean(axis=0)
    expected_value = batch.value[first].mean()

    capped, stats = P.cap_positions(batch, cap=3)
    kept = np.flatnonzero(capped.move_number == 0)
    assert len(kept) == 3
    assert stats["capped_keys"] == 4  # moves 0..3 are shared by all 10 games
    assert stats["capped_positions_removed"] == 4 * 7
    for r in kept.tolist():
        index, prob = capped.policy(r)
        got = np.zeros(82)
        got[index] = prob
        assert np.allclose(got, expected_policy, atol=1e-6)
        assert capped.value[r] == pytest.approx(expected_value)
        assert capped.policy_weight[r] == 1.0
    # Positions past the cap's move limit are never touched.
    late = np.flatnonzero(batch.move_number >= 4)
    capped_late = np.flatnonzero(capped.move_number >= 4)
    assert len(capped_late) == len(late)
    for a, b in zip(late.tolist(), capped_late.tolist()):
        assert all(np.array_equal(x, y) for x, y in zip(batch.policy(a), capped.policy(b)))
        assert batch.value[a] == capped.value[b]


def test_merge_keeps_weights_written_on_purpose():
    batch = _opening_batch(6)
    first = np.flatnonzero(batch.move_number == 0)
    batch.policy_weight[first] = 0.0  # fast-search positions: no policy target
    batch.ownership_weight[first] = 0.5  # played-out labels
    capped, _ = P.cap_positions(batch, cap=2)
    kept = np.flatnonzero(capped.move_number == 0)
    assert (capped.policy_weight[kept] == 0).all()
    assert (capped.ownership_weight[kept] == 0.5).all()
    assert all(len(capped.policy(r)[0]) == 0 for r in kept.tolist())


def test_copies_have_the_configured_mean_and_minimal_spread_and_spread_games():
    rng = np.random.default_rng(0)
    instance = np.repeat(np.arange(200), 60)
    rows, shards = P.assign_copies(instance, 1.5, 16, rng)
    copies = np.bincount(rows, minlength=len(instance))
    assert set(np.unique(copies).tolist()) == {1, 2}  # floor/ceil only: less spread than Bin(n, p)
    assert abs(copies.mean() - 1.5) < 0.02
    for g in range(0, 200, 37):
        per_shard = np.bincount(shards[instance[rows] == g], minlength=16)
        assert per_shard.max() - per_shard.min() <= 1  # round-robin over the shards
    rows, _ = P.assign_copies(instance, 0.25, 4, rng)
    assert abs(len(rows) / len(instance) - 0.25) < 0.02


def test_duplicate_games_keep_the_lowest_instance():
    digests = np.array([b"a" * 16, b"b" * 16, b"a" * 16, b"c" * 16, b"a" * 16], dtype="S16")
    instances = np.array([30, 11, 12, 40, 50], dtype=np.int64)
    assert duplicate_instances(instances, digests).tolist() == [30, 50]


def test_chunk_problem_names_foreign_games():
    rng = np.random.default_rng(1)
    game = synthetic_game(rng, 9, visits=10)
    assert chunk_problem([game], 9, 7.5) is None
    assert "run.json says 19" in chunk_problem([game], 19, 7.5)
    assert "komi" in chunk_problem([game], 9, 6.5)


# --- labels ----------------------------------------------------------------------


def test_tromp_taylor_fallback_matches_the_engine():
    from engine.board import Board

    for seed in range(10):
        board = Board(9 if seed % 2 else 13)
        board.random_playout(seed)
        assert np.array_equal(L.tromp_taylor_ownership(board.stones()), board.ownership())


@pytest.mark.parametrize("size", [9, 19])
def test_finished_games_get_tromp_taylor_of_their_final_board(size):
    rng = np.random.default_rng(size)
    games = [engine_game(rng, size) for _ in range(6 if size == 9 else 2)]
    stats = L.empty_stats()
    labels = L.label_games(games, policy_fn=None, random_playouts=8, model_playout_moves=0, temperature=1.0,
                           playout_weight=0.5, rng=rng, stats=stats)
    for game, label in zip(games, labels):
        final = L.replay(game)
        assert final is not None and final.is_over
        assert np.array_equal(label.ownership, final.ownership())
        assert label.source == schema.OWNERSHIP_FINAL_BOARD and label.weight == 1.0
        assert label.score == pytest.approx(game.score)
    assert stats["final_board"] == len(games) and stats["final_board_result_disagreements"] == 0
    assert stats["replay_failed"] == 0


def test_a_disagreeing_recorded_result_is_counted_not_changed():
    rng = np.random.default_rng(3)
    game = engine_game(rng, 9)
    game.winner = -game.winner
    stats = L.empty_stats()
    L.label_games([game], policy_fn=None, random_playouts=8, model_playout_moves=0, temperature=1.0,
                  playout_weight=0.5, rng=rng, stats=stats)
    assert stats["final_board_result_disagreements"] == 1
    batch = P.games_positions([game], [L.final_board_label(game, L.replay(game), L.empty_stats())], [0], 0)
    assert batch.value[0] == game.winner  # the value target stays the recorded result


def _clearly_decided_resignations(rng, count):
    """Engine games cut at 70% where an independent estimate shows a clear leader.

    The estimate (256 random playouts from the cut, a different seed from the
    labeller's) must give the eventual winner a margin of at least 10 points:
    that is when a player would resign.
    """
    from engine.playouts import playout_ownership

    resigned = []
    while len(resigned) < count:
        game = engine_game(rng, 9)
        cut = resigned_copy(game, 0.7)
        board = L.replay(cut)
        expected = float(playout_ownership(board, 256, int(rng.integers(1 << 62))).sum()) - cut.komi
        if expected * cut.winner >= 10:
            resigned.append(cut)
    return resigned


def test_resigned_games_are_played_out_and_agree_with_the_result():
    rng = np.random.default_rng(11)
    resigned = _clearly_decided_resignations(rng, 100)
    stats = L.empty_stats()
    labels = L.label_games(resigned, policy_fn=None, random_playouts=64, model_playout_moves=0,
                           temperature=1.0, playout_weight=0.5, rng=np.random.default_rng(99), stats=stats)
    assert stats["played_out_random"] == 100 and stats["playout_winner_checked"] == 100
    assert all(l.source == schema.OWNERSHIP_RANDOM_PLAYOUTS and l.weight == 0.5 for l in labels)
    agree = np.mean([L.winner_of(l.score) == g.winner for l, g in zip(labels, resigned)])
    assert agree >= 0.95, agree
    assert stats["playout_winner_agreements"] == round(agree * 100)
    # Random-playout labels are soft: the mean over playouts.
    assert any(((np.abs(l.ownership) > 0) & (np.abs(l.ownership) < 1)).any() for l in labels)


def test_model_playouts_batch_one_call_per_move_and_finish_the_game():
    rng = np.random.default_rng(12)
    resigned = _clearly_decided_resignations(rng, 20)
    calls = []

    def uniform_model(planes):
        assert planes.dtype == np.float32 and planes.shape[1:] == (9, 9, schema.BASIC_INPUT_PLANES)
        calls.append(len(planes))
        logits = np.zeros((len(planes), 82), np.float32)
        logits[:, 81] = -5.0  # rarely pass, as a trained model late in a game
        return {"policy_logits": logits, "value": np.zeros(len(planes))}

    stats = L.empty_stats()
    labels = L.label_games(resigned, policy_fn=uniform_model, random_playouts=8, model_playout_moves=30,
                           temperature=1.0, playout_weight=0.7, rng=rng, stats=stats)
    assert stats["played_out_model"] == 20
    assert calls[0] == 20 and len(calls) <= 30  # batched across the games, bounded moves
    for label in labels:
        assert label.source == schema.OWNERSHIP_MODEL_PLAYOUT and label.weight == 0.7
        assert set(np.unique(label.ownership).tolist()) <= {-1.0, 0.0, 1.0}
    # A uniform "model" is a weak player, yet from clearly decided positions it mostly agrees.
    assert stats["playout_winner_agreements"] >= 14
