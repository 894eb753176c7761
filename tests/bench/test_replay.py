"""bench/strength.py and bench/replay.py: a figure is A's tally, kept and reused only as made; a replay
trains every arm on the same positions, scores each on held-out games and plays the matches."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from engine.board import Board
from format.sgf import game_from_sgf
from tests.pipeline.support import engine_game, write_chunk, write_run_json

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRENGTH = os.path.join(REPO, "bench", "strength.py")
REPLAY = os.path.join(REPO, "bench", "replay.py")


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _bench(script: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script, *argv], cwd=REPO, capture_output=True, text=True)


def _last_json(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def matches(tmp_path_factory):
    """A searching player (MCTS on random playouts) against random moves, and the same match with A and B
    swapped."""
    out = tmp_path_factory.mktemp("strength")
    flags = ("--games", "6", "--visits", "16", "--seed", "3")
    ab = _last_json(_bench(STRENGTH, "playouts", "random", "--out", str(out / "ab"), *flags))
    ba = _last_json(_bench(STRENGTH, "random", "playouts", "--out", str(out / "ba"), *flags))
    return out, ab, ba, flags


def test_a_figure_is_player_as_side_and_kept_with_its_games(matches):
    out, ab, ba, flags = matches
    assert ab["games"] == ba["games"] == 6
    # The score is A's: the searcher's is high whichever side it is named on, the random player's low.
    assert ab["score"] >= 5 and ba["score"] <= 1
    assert ab["wins_as_black"] + ab["wins_as_white"] <= ab["score"]
    assert ab["wilson95"][0] <= ab["win_rate"] <= ab["wilson95"][1]
    assert ab["elo95"][0] <= ab["elo"] <= ab["elo95"][1]
    assert len(os.listdir(out / "ab" / "games")) == 6
    assert ab["digest"] != ba["digest"] and len(ab["digest"]) == 64
    assert ab["commit"] and ab["machine"]["cores"] >= 1


def test_a_finished_match_is_reused_only_with_its_own_settings(matches):
    out, ab, _, flags = matches
    # (--allow-stale-cache: the machine's speed, part of what must match, moves under the suite's load)
    again = _last_json(_bench(STRENGTH, "playouts", "random", "--out", str(out / "ab"), *flags, "--allow-stale-cache"))
    assert again["digest"] == ab["digest"] and again["score"] == ab["score"]
    changed = _bench(STRENGTH, "playouts", "random", "--out", str(out / "ab"), "--games", "6", "--visits", "8",
                     "--seed", "3")
    assert changed.returncode != 0
    assert changed.stderr.startswith("bench/strength.py: ") and "visits 16, now 8" in changed.stderr
    assert "Traceback" not in changed.stderr
    odd = _bench(STRENGTH, "uniform", "random", "--out", str(out / "odd"), "--games", "5")
    assert odd.returncode == 2 and "--games must be even" in odd.stderr


def test_heldout_positions_from_sgf_are_the_games_as_played(matches):
    out, _, _, _ = matches
    replay = _load(REPLAY, "replay_bench")
    folder = str(out / "ab" / "games")
    held = replay.heldout_from_sgf([folder], 9, 17, 10_000)
    first = sorted(os.listdir(folder))[0]
    with open(os.path.join(folder, first), "rb") as handle:
        size, komi, moves, result = game_from_sgf(handle.read())
    board = Board(size, komi)
    winner = 1 if result.startswith("B+") else -1
    for number, move in enumerate(moves[:12]):
        np.testing.assert_array_equal(held["planes"][number], board.features(17))
        assert held["policy_index"][held["policy_offsets"][number]] == move
        assert held["value"][number] == winner * (1 if number % 2 == 0 else -1)
        board.play(move)
    assert len(held["planes"]) == held["policy_offsets"][-1] == sum(
        len(game_from_sgf(open(os.path.join(folder, name), "rb").read())[2]) for name in os.listdir(folder))


def test_a_replay_trains_each_arm_alike_then_judges_it(matches, tmp_path):
    sgf_out, _, _, _ = matches
    lake = str(tmp_path / "lake")
    rng = np.random.default_rng(1)
    write_run_json(lake, 9)
    for generation in range(3):
        write_chunk(lake, generation, [engine_game(rng, 9, generation=generation, visits=8, full_search_fraction=0.5)
                                       for _ in range(10)], generation)
    tiny = "--train-blocks 1 --train-filters 8"
    argv = ["--lake", lake, "--window", "3", "--steps", "20", "--seeds", "1", "--out", str(tmp_path / "out"),
            "--arm", f"base={tiny}", "--arm", f"slow={tiny} --train-learning-rate 0.002",
            "--heldout-sgf", str(sgf_out / "ab" / "games"), "--opponent", "random", "--gnugo-games", "2",
            "--head-to-head-games", "2", "--visits", "4"]
    result = _last_json(_bench(REPLAY, *argv))
    base, slow = result["arms"]["base"], result["arms"]["slow"]
    assert slow["train"][-2:] == ["--learning-rate", "0.002"]
    # Same positions, same seed: the learning rate alone moves the held-out figures.
    assert base["heldout"]["sgf_policy_ce"] != slow["heldout"]["sgf_policy_ce"]
    assert all(np.isfinite(v) for v in base["heldout"].values() if not isinstance(v, list))
    assert [m["player_b"] for m in base["matches"]] == ["random"]
    assert "head_to_head" not in base and slow["head_to_head"]["over"] == "base"
    assert slow["matches"][-1]["player_b"] == f"model:{base['matches'][0]['player_a'][len('model:'):]}"
    # The same command resumes: nothing is trained or played again, the figures are the same.
    again = _last_json(_bench(REPLAY, *argv, "--allow-stale-cache"))
    assert again["arms"] == result["arms"]
    changed = _bench(REPLAY, *[("30" if word == "20" else word) for word in argv])
    assert changed.returncode == 2 and "steps 20, now 30" in changed.stderr
    assert changed.stderr.splitlines()[-1].startswith("bench/replay.py: ")
