"""The worker's seeds: the default ``--seed`` was once 0, so every worker played the same games.  Now
the default seed comes from the OS's entropy, each game has its own stream, and the record carries
that stream's seed so the game can be replayed."""

import numpy as np
import pytest

from cloud.storage import open_storage
from format import layout
from format.codec import read_chunk
from selfplay.config import WorkerConfig
from selfplay.worker import SelfPlayWorker, game_seed


def worker_config(root, **overrides):
    settings = dict(root=str(root), board_size=9, games=4, visits=4, fast_visits=2, leaves_per_game=2,
                    full_search_fraction=0.5, max_games=4, chunk_games=100, progress_seconds=60.0,
                    spool_dir=str(root) + "-spool")   # beside the lake, not under ~/.local/state
    settings.update(overrides)
    return WorkerConfig(**settings)


def play(config):
    storage = open_storage(config.root)
    worker = SelfPlayWorker(config, storage)
    worker.run(None)
    return [game for info in storage.list(layout.GAMES_DIR + "/") for game in read_chunk(storage.read(info.path), info.path)]


def test_default_seeds_differ_and_two_workers_play_different_games(tmp_path):
    first, second = worker_config(tmp_path / "a"), worker_config(tmp_path / "b")
    assert first.seed != second.seed and 0 <= first.seed < 2 ** 63
    games = play(first) + play(second)
    assert len(games) >= 8
    moves = {tuple(game.moves.tolist()) for game in games}
    assert len(moves) == len(games), "two games are identical move for move"


def test_each_game_records_its_seed_and_replays_from_it(tmp_path, monkeypatch):
    games = play(worker_config(tmp_path / "a", seed=1234, generation0_playouts=0))
    assert [g.seed for g in games] and all(g.seed >= 0 for g in games)
    assert len({g.seed for g in games}) == len(games)
    assert {g.seed for g in games} <= {game_seed(1234, serial) for serial in range(len(games) + 4)}
    # Replay it in another worker with another seed, in whatever slots: every
    # game there gets the recorded seed.  Same seed, same (uniform) network,
    # same game, move for move.  (Generation 0's default random playouts draw
    # from the worker's stream, not the game's, so this plays it uniform.)
    target = games[-1]
    import selfplay.worker as worker_module
    monkeypatch.setattr(worker_module, "game_seed", lambda worker_seed, serial: target.seed)
    replayed = play(worker_config(tmp_path / "b", seed=99, max_games=2, generation0_playouts=0))
    assert len(replayed) >= 2 and all(g.seed == target.seed for g in replayed)
    for again in replayed:
        np.testing.assert_array_equal(again.moves, target.moves)
        np.testing.assert_array_equal(again.full_search, target.full_search)
        assert again.resign_enabled == target.resign_enabled


def test_seed_flag_is_validated():
    with pytest.raises(ValueError, match="--seed"):
        WorkerConfig(root="lake", seed=-5)
