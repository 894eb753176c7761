"""bench/learning.py's verdict: the statistics and the distinct-game tally, on results whose answer is known.

The runs themselves take hours (two arms, two seeds, 35 minutes each); here
only the parts that decide: Elo from a score with its interval, the
keep/drop/refuse rule, and counting a match's games once each.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from format.match_record import MatchGame, MatchRecord
from format.sgf import game_to_sgf

_SPEC = importlib.util.spec_from_file_location("learning_bench",
                                               Path(__file__).resolve().parents[1] / "bench" / "learning.py")
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench          # dataclasses look their module up while the class is made
_SPEC.loader.exec_module(bench)


def test_elo_of_a_score_is_symmetric_and_clamped():
    assert bench.elo_of(0.5) == 0
    assert bench.elo_of(0.76) == pytest.approx(200, abs=1)
    assert bench.elo_of(0.24) == pytest.approx(-200, abs=1)
    assert bench.elo_of(1.0) == bench.ELO_CLAMP and bench.elo_of(0.0) == -bench.ELO_CLAMP


def test_the_verdict_needs_a_positive_lower_bound_an_effect_above_the_noise_and_equal_cpu():
    strong = bench.MatchTally(400, 260.0)                 # 65%: about +108 Elo, low end about +70
    effect, low, _ = strong.elo()
    assert effect == pytest.approx(107.5, abs=1) and low > 60
    quiet = [bench.MatchTally(100, 52.0), bench.MatchTally(100, 47.0)]
    assert bench.decide(strong, quiet, gap=0.05, max_gap=0.15)["decision"] == "keep"
    noisy = [bench.MatchTally(100, 70.0), bench.MatchTally(100, 50.0)]  # seeds of one arm 147 Elo apart
    assert bench.decide(strong, noisy, gap=0.05, max_gap=0.15)["decision"] == "drop"
    weak = bench.MatchTally(400, 212.0)                   # 53%: the interval holds 0
    assert bench.decide(weak, quiet, gap=0.05, max_gap=0.15)["decision"] == "drop"
    verdict = bench.decide(strong, quiet, gap=0.30, max_gap=0.15)
    assert verdict["decision"] == "refused" and "CPU time differs by 30%" in verdict["why"]
    assert bench.cpu_gap([100.0, 110.0], [100.0, 90.0]) == pytest.approx(10 / 105)


def test_a_loaded_machine_refuses_the_result_and_an_arms_own_cpu_use_does_not():
    strong, quiet = bench.MatchTally(400, 260.0), [bench.MatchTally(100, 52.0)]
    idle = {"a1": 0.01, "a2": 0.0, "b1": 0.02, "b2": 0.01}
    # B keeps the cores busier than A (30% more CPU seconds), on an idle machine: judged.
    assert bench.decide(strong, quiet, gap=0.30, max_gap=0.15, loads=idle)["decision"] == "keep"
    loaded = bench.decide(strong, quiet, gap=0.02, max_gap=0.15, loads={**idle, "a1": 0.17})
    assert loaded["decision"] == "refused" and "during run a1" in loaded["why"] and "17%" in loaded["why"]
    # Runs recorded before the outside load was measured: the CPU-gap rule, saying why.
    old = bench.decide(strong, quiet, gap=0.30, max_gap=0.15, loads={**idle, "a1": None})
    assert old["decision"] == "refused" and "outside load" in old["why"]


def test_outside_load_is_the_other_processes_share_of_the_machine():
    assert bench.outside_load({"outside_cpu_seconds": 180.0, "wall_seconds": 1800.0, "cores": 2}) == 0.05
    assert bench.outside_load({"outside_cpu_seconds": -3.0, "wall_seconds": 1800.0, "cores": 2}) == 0.0
    assert bench.outside_load({"cpu_seconds": 2000.0}) is None
    before = bench.machine_busy_seconds()
    sum(i * i for i in range(3_000_000))                  # this process's own work shows as machine time
    assert bench.machine_busy_seconds() > before


def test_a_match_counts_each_distinct_game_once_from_player_a_side(tmp_path):
    def game(index, black, white, moves, result):
        path = tmp_path / f"{index:05d}.sgf"
        path.write_bytes(game_to_sgf(9, 7.5, moves, result=result))
        return MatchGame(index=index, black=black, white=white, result=result, score=None, end_reason="score",
                         moves=len(moves), sgf=str(path))

    games = (
        game(0, "A", "B", [40, 41, 81, 81], "B+3.5"),     # A wins as Black
        game(1, "B", "A", [40, 41, 81, 81], "B+3.5"),     # same moves, colours swapped: a distinct game; A loses
        game(2, "A", "B", [40, 41, 81, 81], "B+3.5"),     # a repeat of game 0: not counted again
        game(3, "B", "A", [30, 31, 81, 81], "W+0.5"),     # A wins as White
        game(4, "A", "B", [20, 81, 81], "0"),             # a draw: half a point
    )
    result = MatchRecord(player_a="A", player_b="B", board_size=9, komi=7.5, games=5, wins=2, losses=2, draws=1,
                         wins_as_black=1, wins_as_white=1, win_rate=0.5, ci_low=0.1, ci_high=0.9, mean_moves=3.8,
                         seconds=1.0, game_results=games)
    tally = bench.tally_match(result)
    assert tally == bench.MatchTally(4, 2.5)
    assert math.isclose(tally.elo()[0], bench.elo_of(2.5 / 4))
    json.dumps(bench.decide(tally, [], 0.0, 0.15))        # the verdict is JSON as it stands (no NaN)
    with pytest.raises(ValueError, match="kept no SGF"):
        bench.tally_match(dataclasses.replace(result, game_results=None))
