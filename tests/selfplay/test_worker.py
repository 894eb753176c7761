"""Tests of the self-play worker (`selfplay.worker`) against a local lake.

Subprocess tests run ``python -m selfplay.worker`` the way a machine would
and kill it (SIGKILL at random moments, SIGTERM); in-process tests drive
`SelfPlayWorker` with small fake evaluators so that resignation and model
switches happen within seconds.  Games are 9x9 with a handful of visits.
"""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cloud.local import LocalStorage
from cloud.storage import open_storage
from format import layout
from format import schema
from format.codec import read_chunk
from format.run_config import RunConfig, ensure_run_config
from engine.board import Board
from selfplay.config import WorkerConfig
from selfplay.worker import SelfPlayWorker, main

REPO = Path(__file__).resolve().parents[2]
FAST_FLAGS = ["--board-size", "9", "--games", "8", "--visits", "4", "--fast-visits", "2",
              "--full-search-fraction", "0.5", "--progress-seconds", "0.5", "--poll-seconds", "0.5",
              "--chunk-games", "2", "--leaves-per-game", "2"]


def start_worker(root, *flags):
    # The default spool lives under the user's state folder: keep it beside the test's lake.
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3",
               XDG_STATE_HOME=str(Path(root).parent / "state"))
    return subprocess.Popen([sys.executable, "-m", "selfplay.worker", "--root", str(root), *FAST_FLAGS, *flags],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def chunk_files(root):
    """Every file under games/ on disk (temp files included, if any were visible)."""
    games = Path(root) / layout.GAMES_DIR
    return sorted(p for p in games.rglob("*") if p.is_file()) if games.exists() else []


def listed_chunks(root):
    return [info.path if hasattr(info, "path") else info for info in open_storage(str(root)).list(layout.GAMES_DIR + "/")]


def decode_all(root):
    """Decode every listed chunk; returns {path: games}."""
    storage = open_storage(str(root))
    return {path: read_chunk(storage.read(path), path) for path in listed_chunks(root)}


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigkill_never_exposes_a_partial_chunk_and_a_restart_carries_on(tmp_path):
    rng = random.Random(1)
    seen = 0
    for attempt in range(3):
        proc = start_worker(tmp_path, "--seed", str(attempt))
        time.sleep(rng.uniform(1.5, 4.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        listed = listed_chunks(tmp_path)
        # Nothing but whole chunks is visible, and every one decodes.
        for path in listed:
            assert path.endswith(schema.CHUNK_SUFFIX)
        for path, games in decode_all(tmp_path).items():
            assert games and all(g.board_size == 9 and g.generation == 0 for g in games)
        on_disk = [p for p in chunk_files(tmp_path) if not p.name.startswith(".")]
        assert len(on_disk) == len(listed)
        assert len(listed) >= seen
        seen = len(listed)
    proc = start_worker(tmp_path, "--seed", "9", "--max-games", "4")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    after = decode_all(tmp_path)
    assert len(after) >= seen + 2          # four more games, two per chunk
    ids = [g.game_id for games in after.values() for g in games]
    assert len(ids) == len(set(ids))


def test_sigterm_writes_every_finished_game_and_exits_0(tmp_path):
    # Chunks of 1000 games: nothing is written before the SIGTERM.
    proc = start_worker(tmp_path, "--chunk-games", "1000", "--seed", "4")
    finished = 0
    lines = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if " games " in line:
            finished = int(line.split(" games ")[1].split()[0])
            if finished >= 3:
                break
    assert finished >= 3, "".join(lines)
    assert listed_chunks(tmp_path) == []
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    games = [g for chunk in decode_all(tmp_path).values() for g in chunk]
    assert len(games) >= finished


def test_run_json_mismatch_is_refused_with_a_clear_message(tmp_path, capsys):
    ensure_run_config(LocalStorage(str(tmp_path)), RunConfig(board_size=9, komi=7.5))
    code = main(["--root", str(tmp_path), "--board-size", "13", "--games", "4", "--max-games", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "board_size" in err and "13" in err and layout.RUN_CONFIG in err
    assert listed_chunks(tmp_path) == []


def material_evaluator(planes):
    """Value = stone balance from the side to move, so the side behind soon
    sees values low enough to resign; the policy favours passing once the
    balance is lopsided, so accelerated games reach two passes quickly."""
    own = planes[..., 0].sum(axis=(1, 2))
    opp = planes[..., 8].sum(axis=(1, 2))
    n = planes.shape[1]
    logits = np.zeros((len(planes), n * n + 1), np.float32)
    logits[:, -1] = np.abs(own - opp) - 2.0
    return logits, np.tanh((own - opp) / 2.0).astype(np.float32)


material_evaluator.generation = 0


def replay(game):
    board = Board(game.board_size, game.komi)
    for move in game.moves:
        board.play(int(move))
    return board


def test_resigned_games_are_accelerated_to_the_end_with_exact_ownership(tmp_path):
    lake = tmp_path / "lake"
    storage = LocalStorage(str(lake))
    config = WorkerConfig(root=str(lake), games=8, visits=8, fast_visits=4, full_search_fraction=0.5,
                          resign_threshold=-0.5, resign_consecutive=2, resign_disabled_fraction=0.3,
                          accelerated_visits=1, max_games=16, chunk_games=4, worker_id="acc", seed=3,
                          spool_dir=str(tmp_path / "spool"))
    SelfPlayWorker(config, storage, material_evaluator).run()
    games = [g for chunk in decode_all(lake).values() for g in chunk]
    assert len(games) >= 16
    resigned = [g for g in games if g.end_reason == schema.END_RESIGN]
    assert resigned, "no game resigned"
    for game in resigned:
        assert game.resign_enabled
        board = replay(game)
        assert 0 < game.accelerated_from <= game.num_positions
        tail = slice(game.accelerated_from, None)
        assert not game.full_search[tail].any()
        assert all(len(p) == 0 for p in game.policy_indices[tail])
        if game.ownership_source == schema.OWNERSHIP_ACCELERATED:
            assert board.consecutive_passes == 2
            np.testing.assert_array_equal(game.ownership, board.ownership())
            assert game.score == pytest.approx(board.area_score())
        else:                                  # stopped by the move cap instead
            assert game.ownership is None and np.isnan(game.score)
    assert any(g.ownership_source == schema.OWNERSHIP_ACCELERATED for g in resigned)
    # Games with resignation disabled record who would have resigned.
    disabled = [g for g in games if not g.resign_enabled]
    assert all(g.accelerated_from == -1 and g.end_reason != schema.END_RESIGN for g in disabled)
    for game in games:
        if game.end_reason == schema.END_TWO_PASSES:
            np.testing.assert_array_equal(game.ownership, replay(game).ownership())


def make_tiny_saved_model(directory, board_size):
    """A SavedModel with the registry's serving signature: uniform policy,
    value = tanh of the stone balance."""
    import tensorflow as tf

    points = board_size * board_size

    class Tiny(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, board_size, board_size, 17], tf.float32, name="planes")])
        def serve(self, planes):
            batch = tf.shape(planes)[0]
            balance = tf.reduce_sum(planes[..., 0] - planes[..., 8], axis=[1, 2])
            return {"policy_logits": tf.zeros([batch, points + 1]), "value": tf.tanh(balance / 4.0),
                    "ownership": tf.zeros([batch, points]), "score": tf.zeros([batch])}

    module = Tiny()
    tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})


def test_a_model_published_mid_run_is_picked_up_by_games_in_progress(tmp_path):
    from format.registry import publish_model

    lake = tmp_path / "lake"
    proc = start_worker(lake, "--seed", "2", "--chunk-games", "2")
    try:
        wait_for(lambda: len(listed_chunks(lake)) >= 1, 60, "a generation-0 chunk")
        make_tiny_saved_model(tmp_path / "export", 9)
        publish_model(open_storage(str(lake)), 1, str(tmp_path / "export"), {"board_size": 9})
        wait_for(lambda: any("/000001/" in p for p in listed_chunks(lake)), 120, "a generation-1 chunk")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "model generation 1 loaded" in out
    chunks = decode_all(lake)
    for path, games in chunks.items():
        generation = int(path.split("/")[1])
        assert all(g.generation == generation for g in games)
    assert any(p.split("/")[1] == "000000" for p in chunks)


def test_a_worker_stops_once_its_games_hold_max_positions(tmp_path):
    # How the loop sizes generation 0 in positions rather than seconds (--generation0-positions).
    lake = tmp_path / "lake"
    config = WorkerConfig(root=str(lake), games=4, visits=4, fast_visits=2, max_positions=150, chunk_games=2,
                          worker_id="cap", seed=5, spool_dir=str(tmp_path / "spool"))
    worker = SelfPlayWorker(config, LocalStorage(str(lake)), material_evaluator)
    counters = worker.run()
    games = [g for chunk in decode_all(lake).values() for g in chunk]
    assert worker.stop_reason() == "max_positions" and counters.finished_positions >= 150
    # The lake holds exactly the finished games' positions, and play stopped at the game that crossed the cap.
    assert sum(g.num_positions for g in games) == counters.finished_positions
    assert counters.finished_positions - max(g.num_positions for g in games) < 150


def test_the_gumbel_constants_reach_the_search(tmp_path, monkeypatch):
    import selfplay.worker as worker_module

    seen = {}
    real = worker_module.GameBatch

    def capture(*args, **named):
        seen.update(named)
        return real(*args, **named)

    monkeypatch.setattr(worker_module, "GameBatch", capture)
    config = WorkerConfig(root=str(tmp_path / "lake"), games=2, gumbel=True, gumbel_c_scale=0.3, gumbel_c_visit=20,
                          spool_dir=str(tmp_path / "spool"))
    SelfPlayWorker(config, LocalStorage(str(tmp_path / "lake")), material_evaluator)
    assert seen["gumbel_c_scale"] == pytest.approx(0.3) and seen["gumbel_c_visit"] == pytest.approx(20)


def test_resignation_reads_the_played_moves_value_when_asked(tmp_path, monkeypatch):
    from engine.driver import GameBatch

    calls = {"move_value": 0}
    real = GameBatch.move_value

    class Counting(GameBatch):
        def move_value(self, game, move):
            calls["move_value"] += 1
            return real(self, game, move)

    import selfplay.worker as worker_module
    monkeypatch.setattr(worker_module, "GameBatch", Counting)
    resigned = {}
    for rule in ("root", "move"):
        lake = tmp_path / rule
        config = WorkerConfig(root=str(lake), games=8, visits=8, fast_visits=4, full_search_fraction=0.5, gumbel=True,
                              resign_threshold=-0.5, resign_consecutive=2, resign_disabled_fraction=0.0,
                              resign_value=rule, accelerated_visits=1, max_games=8, chunk_games=4, seed=3,
                              worker_id="rv", spool_dir=str(tmp_path / f"spool-{rule}"))
        before = calls["move_value"]
        SelfPlayWorker(config, LocalStorage(str(lake)), material_evaluator).run()
        games = [g for chunk in decode_all(lake).values() for g in chunk]
        resigned[rule] = sum(g.end_reason == schema.END_RESIGN for g in games)
        # The root rule never asks for a move's value; the move rule asks once a move until a side resigns.
        assert (calls["move_value"] > before) == (rule == "move")
    assert resigned["move"] > 0


def test_symmetry_turns_a_models_positions_but_not_generation_zeros(tmp_path):
    from inference.eval_cache import CachedEvaluator
    from inference.symmetric import RandomSymmetryEvaluator

    def model(planes):
        return material_evaluator(planes)

    model.generation = 3
    config = WorkerConfig(root=str(tmp_path / "lake"), games=2, symmetry=True, spool_dir=str(tmp_path / "spool"))
    playing = SelfPlayWorker(config, LocalStorage(str(tmp_path / "lake")), model).evaluator
    assert isinstance(playing, CachedEvaluator) and isinstance(playing.evaluator, RandomSymmetryEvaluator)
    config = WorkerConfig(root=str(tmp_path / "lake"), games=2, symmetry=True, spool_dir=str(tmp_path / "spool0"))
    generation0 = SelfPlayWorker(config, LocalStorage(str(tmp_path / "lake")), material_evaluator).evaluator
    assert not isinstance(getattr(generation0, "evaluator", generation0), RandomSymmetryEvaluator)
