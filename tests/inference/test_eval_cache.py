"""The evaluation cache (inference.eval_cache): same outputs as the network, fewer network rows."""
import numpy as np
import pytest

from engine.board import Board
from engine.driver import GameBatch
from inference.eval_cache import CachedEvaluator, with_evaluation_cache
from inference.evaluator import Evaluator, UniformEvaluator


class CountingNet:
    """A deterministic stand-in network: outputs depend on every input value; counts the rows it runs."""

    generation = 3

    def __init__(self, board_size):
        rng = np.random.default_rng(0)
        self.weights = rng.standard_normal((board_size * board_size * 17, board_size * board_size + 1))
        self.rows_run = 0
        self.calls = 0

    def __call__(self, planes):
        self.rows_run += len(planes)
        self.calls += 1
        flat = planes.reshape(len(planes), -1).astype(np.float64)
        logits = (flat @ self.weights).astype(np.float32)
        return logits, np.tanh(flat.sum(axis=1) / 100.0).astype(np.float32)


def positions(board_size, moves_list):
    """Input planes of the positions after each list of moves (black first)."""
    rows = []
    for moves in moves_list:
        board = Board(board_size, 7.5)
        for move in moves:
            board.play(move)
        rows.append(board.features())
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("board_size", [9, 19])
def test_cached_outputs_equal_the_networks_and_repeats_skip_it(board_size):
    net = CountingNet(board_size)
    cached = CachedEvaluator(net, capacity=100)
    assert isinstance(cached, Evaluator) and cached.generation == 3
    first = positions(board_size, [[], [0], [0, 1], [0]])          # row 3 repeats row 1
    logits, values = cached(first)
    want_logits, want_values = CountingNet(board_size)(first)
    np.testing.assert_array_equal(logits, want_logits)
    np.testing.assert_array_equal(values, want_values)
    assert net.rows_run == 3 and cached.hits == 1 and cached.rows == 4
    second = positions(board_size, [[0, 1], [2], []])               # two seen, one new
    logits, values = cached(second)
    np.testing.assert_array_equal(logits, CountingNet(board_size)(second)[0])
    assert net.rows_run == 4 and cached.hits == 3 and cached.hit_share == pytest.approx(3 / 7)


def test_same_stones_with_another_history_or_side_to_move_is_another_entry():
    # The same stones reached in two orders differ in their history planes;
    # after a pass the stones repeat but the side to move differs.
    net = CountingNet(9)
    cached = CachedEvaluator(net)
    rows = positions(9, [[0, 1, 2], [2, 1, 0], [0, 1, 2, 81, 81]])
    cached(rows)
    assert net.rows_run == 3 and cached.hits == 0


def test_least_recently_used_entries_go_first():
    net = CountingNet(9)
    cached = CachedEvaluator(net, capacity=2)
    a, b, c = positions(9, [[0], [1], [2]])
    cached(np.stack([a, b]))
    cached(a[None])            # a is now the most recent
    cached(c[None])            # evicts b
    assert len(cached) == 2
    before = net.rows_run
    cached(a[None])
    assert net.rows_run == before
    cached(b[None])
    assert net.rows_run == before + 1


def test_an_all_hit_batch_never_calls_the_network():
    net = CountingNet(9)
    cached = CachedEvaluator(net)
    rows = positions(9, [[], [4]])
    cached(rows)
    calls = net.calls
    logits, values = cached(rows[::-1].copy())
    assert net.calls == calls and logits.shape == (2, 82) and values.shape == (2,)
    np.testing.assert_array_equal(logits, CountingNet(9)(rows[::-1].copy())[0])


def test_uniform_evaluator_and_capacity_zero_are_left_uncached():
    uniform = UniformEvaluator(9)
    assert with_evaluation_cache(uniform) is uniform
    net = CountingNet(9)
    assert with_evaluation_cache(net, capacity=0) is net
    wrapped = with_evaluation_cache(net)
    assert isinstance(wrapped, CachedEvaluator) and with_evaluation_cache(wrapped) is wrapped
    with pytest.raises(ValueError, match="capacity"):
        CachedEvaluator(net, capacity=-1)


def test_a_search_with_the_cache_matches_one_without_it():
    """Same seeds, same network: the cache changes no visit count, only the network's rows."""
    def run(evaluator):
        batch = GameBatch(9, 4, num_groups=1, leaves_per_game=4, seed=5)
        buffer = np.zeros((batch.batch_rows, 9, 9, 17), np.float32)
        for g in range(4):
            batch.new_game(g, seed=11)      # every game the same: the cache must hit across games
            batch.start_search(g, 24)
        moves = []
        for _ in range(40):
            rows = batch.gather(0, buffer)
            logits, values = evaluator(buffer[:rows])
            batch.apply(0, logits, values)
            for g in batch.done_games(0):
                move = batch.choose_move(g, 0.0)
                moves.append(move)
                batch.play(g, move)
                batch.start_search(g, 24)
        return moves, batch.stats()

    plain_net, cached_net = CountingNet(9), CountingNet(9)
    cached = CachedEvaluator(cached_net)
    plain_moves, plain_stats = run(plain_net)
    cached_moves, cached_stats = run(cached)
    assert cached_moves == plain_moves and cached_stats == plain_stats
    assert cached.hits > 0 and cached_net.rows_run == plain_net.rows_run - cached.hits


def test_the_worker_flag_sizes_the_cache_and_zero_turns_it_off():
    from selfplay.config import CLI, WorkerConfig
    from inference.eval_cache import DEFAULT_CAPACITY

    assert WorkerConfig(root="/tmp/x").eval_cache_entries == DEFAULT_CAPACITY
    config, _ = CLI.parse(["--root", "/tmp/x", "--eval-cache-entries", "0"])
    net = CountingNet(9)
    assert with_evaluation_cache(net, config.eval_cache_entries) is net
    config, _ = CLI.parse(["--root", "/tmp/x", "--eval-cache-entries", "5"])
    assert with_evaluation_cache(net, config.eval_cache_entries).capacity == 5
    with pytest.raises(ValueError, match="eval.cache.entries"):
        WorkerConfig(root="/tmp/x", eval_cache_entries=-1)
