"""bench/learning.py: the statistics on results whose answer is known, and the A/B end to end on stand-ins.

The runs themselves take hours (two arms, five seeds, 35 minutes each), and
the shortest real loop run the bench allows is a minute, so the end-to-end
tests run `make_base`, `run_arm` and `main` for real with stand-ins for the
three processes they start (the generation-0 worker, the loop, the match):
the stand-ins check their command line with the real command's parser and
write what the real one would (the base's marker, SGFs and a match's JSON),
in milliseconds.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from format import layout
from format.match_record import MatchGame, MatchRecord
from format.sgf import game_to_sgf
from arena.elo import expected_score

_SPEC = importlib.util.spec_from_file_location("learning_bench",
                                               Path(__file__).resolve().parents[2] / "bench" / "learning.py")
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench          # dataclasses look their module up while the class is made
_SPEC.loader.exec_module(bench)

RUN_SPREAD = 60.0
"""SD of a simulated run about its configuration's mean: the spread measured between real runs."""


def simulated_cross(rng: np.random.Generator, seeds: int, effect: float, games: int,
                    spread: float = RUN_SPREAD) -> dict:
    """One simulated A/B's cross-arm tallies: each run's strength is its arm's mean plus a normal
    deviate of SD ``spread``, each game a Bradley-Terry draw between the two runs."""
    a = rng.normal(0.0, spread, seeds)
    b = rng.normal(effect, spread, seeds)
    return {(f"b{j}", f"a{i}"): bench.MatchTally(games, float(rng.binomial(games, expected_score(b[j], a[i]))))
            for j in range(seeds) for i in range(seeds)}


def test_elo_of_a_score_is_symmetric_and_clamped():
    assert bench.elo_of(0.5) == 0
    assert bench.elo_of(0.76) == pytest.approx(200, abs=1)
    assert bench.elo_of(0.24) == pytest.approx(-200, abs=1)
    assert bench.elo_of(1.0) == bench.ELO_CLAMP and bench.elo_of(0.0) == -bench.ELO_CLAMP


def test_student_t_quantiles_match_the_tables():
    for df, expected in ((1, 12.706), (2, 4.303), (8, 2.306), (30, 2.042), (1e6, 1.960)):
        assert bench.student_t_quantile(0.975, df) == pytest.approx(expected, abs=2e-3)
    assert bench.student_t_quantile(0.8, 8) == pytest.approx(0.889, abs=2e-3)
    assert bench.student_t_quantile(0.025, 8) == pytest.approx(-2.306, abs=2e-3)


def test_the_run_level_interval_holds_the_true_effect_95_percent_and_the_games_pooled_one_about_half():
    """Why runs are the units: runs of one configuration land about 60 Elo apart, so an interval that takes
    every game as independent covers a configuration's true effect far less often than it says."""
    rng = np.random.default_rng(41)
    trials, effect, seeds = 800, 100.0, bench.DEFAULT_SEEDS
    games = bench.games_per_pairing(bench.DEFAULT_CROSS_GAMES_PER_RUN, seeds)
    below = above = pooled_hits = 0
    errors = []
    for _ in range(trials):
        cross = simulated_cross(rng, seeds, effect, games)
        result = bench.run_level_effect(cross)
        below += effect < result.low
        above += effect > result.high
        errors.append(result.elo - effect)
        _, low, high = sum(cross.values(), bench.MatchTally(0, 0.0)).elo()
        pooled_hits += low <= effect <= high
    assert 0.93 <= 1 - (below + above) / trials <= 0.97
    assert below / trials < 0.04 and above / trials < 0.04          # neither end is lopsided
    assert abs(np.mean(errors)) < 10                                 # Elo: the estimate is centred
    assert pooled_hits / trials < 0.7                                # what the old verdict's interval did


def test_the_planned_precision_is_what_the_docstring_promises():
    half_width, resolvable = bench.planned_precision(5, 100)
    assert (round(half_width), round(resolvable)) == (95, 131)
    assert [round(bench.planned_precision(seeds, 100)[0]) for seeds in (2, 4, 6)] == [279, 112, 83]
    assert round(bench.planned_precision(5, 400)[0]) == 89           # more games a run buy little


def test_the_verdict_is_judged_on_the_run_level_interval():
    # Five runs an arm, 20 games a pairing, 65% pooled either way (+108 Elo, games-pooled low end ~+80).
    steady = {(f"b{j}", f"a{i}"): bench.MatchTally(20, 13.0) for j in range(5) for i in range(5)}
    kept = bench.decide(steady, [], gap=0.05, max_gap=0.15)
    assert kept["decision"] == "keep" and kept["elo_low"] > 0 and "run-level" in kept["why"]
    # The same pooled score from runs far apart: two B runs won everything, three were even with A.
    scores = {0: 20.0, 1: 20.0, 2: 9.0, 3: 8.0, 4: 8.0}
    scattered = {(f"b{j}", f"a{i}"): bench.MatchTally(20, scores[j])
                 for j in range(5) for i in range(5)}
    verdict = bench.decide(scattered, [], gap=0.05, max_gap=0.15)
    assert verdict["cross_score"] == 325.0 and verdict["pooled_elo_low"] > 60     # the pooled interval is sure
    assert verdict["decision"] == "drop" and verdict["elo_low"] < 0                # the runs are not
    assert verdict["run_level"]["run_spread"] > 150
    json.dumps(verdict, allow_nan=False)
    with pytest.raises(ValueError, match="two runs an arm"):
        bench.run_level_effect({("b1", "a1"): bench.MatchTally(100, 60.0), ("b1", "a2"): bench.MatchTally(100, 60.0)})


def test_a_loaded_machine_refuses_the_result_and_an_arms_own_cpu_use_does_not():
    strong = {(f"b{j}", f"a{i}"): bench.MatchTally(20, 15.0) for j in range(4) for i in range(4)}
    idle = {"a1": 0.01, "a2": 0.0, "b1": 0.02, "b2": 0.01}
    # B keeps the cores busier than A (30% more CPU seconds), on an idle machine: judged.
    assert bench.decide(strong, [], gap=0.30, max_gap=0.15, loads=idle)["decision"] == "keep"
    loaded = bench.decide(strong, [], gap=0.02, max_gap=0.15, loads={**idle, "a1": 0.17})
    assert loaded["decision"] == "refused" and "during run a1" in loaded["why"] and "17%" in loaded["why"]
    # Runs recorded before the outside load was measured: the CPU-gap rule, saying why.
    old = bench.decide(strong, [], gap=0.30, max_gap=0.15, loads={**idle, "a1": None})
    assert old["decision"] == "refused" and "outside load" in old["why"]
    assert bench.cpu_gap([100.0, 110.0], [100.0, 90.0]) == pytest.approx(10 / 105)


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
    with pytest.raises(ValueError, match="kept no SGF"):
        bench.tally_match(dataclasses.replace(result, game_results=None))


def test_an_arm_may_bundle_several_changes_but_not_set_one_flag_twice(capsys):
    assert bench.bundle_flags(["--train-steps-per-window 1000", "--train-input-planes 22"], "--arm-b") == \
        "--train-steps-per-window 1000 --train-input-planes 22"
    with pytest.raises(ValueError, match="--arm-b: --train-steps-per-window is set by two changes"):
        bench.bundle_flags(["--train-steps-per-window 1000", "--worker-gumbel --train-steps-per-window=800"],
                           "--arm-b")
    with pytest.raises(SystemExit) as stopped:
        bench.parse_args(["--out", "x", "--arm-b", "--train-steps-per-window 1000",
                          "--arm-b", "--train-steps-per-window 800"])
    assert stopped.value.code == 2 and "--train-steps-per-window is set by two changes" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        bench.parse_args(["--out", "x", "--arm-b=--worker-gumbel", "--seeds", "1"])
    assert stopped.value.code == 2 and "--seeds must be in [2, 8]" in capsys.readouterr().err


def test_provenance_tells_a_faster_or_another_machine_and_another_commit_apart():
    here = {"flags": {"seed": 1}, "commit": "c1", "machine": {"cpu": "EPYC", "cores": 2, "speed": 10.0}}
    assert bench.provenance_differences(here, here) == []
    assert bench.provenance_differences(here, {**here, "machine": {**here["machine"], "speed": 11.5}}) == []
    slower = bench.provenance_differences(here, {**here, "machine": {**here["machine"], "speed": 7.0}})
    assert len(slower) == 1 and "machine speed 10.0, now 7.0" in slower[0]
    other = bench.provenance_differences(here, {**here, "commit": "c2", "machine": {**here["machine"], "cores": 4}})
    assert other == ["commit c1, now c2", "machine cores 2, now 4"]
    assert bench.provenance_differences({}, here)[0] == "seed None, now 1"
    commit, _ = bench.current_commit()
    assert len(commit) == 40
    assert bench.machine_speed() > 0


# --------------------------------------------------------------------------
# End to end on stand-ins (module docstring)
# --------------------------------------------------------------------------

class StandIns:
    """The worker, the loop and the match, replaced; each call's command line parsed by the real CLI."""

    def __init__(self):
        self.calls: list[str] = []

    def run_measured(self, argv, log_path):
        module = argv[2]
        self.calls.append(module)
        if module == "selfplay.worker":
            from selfplay.worker import CLI
            config, _ = CLI.parse(argv[3:])
            os.makedirs(config.root)
            Path(config.root, layout.RUN_CONFIG).write_text("{}")
        else:
            assert module == "operations.loop"
            from operations.loop import CLI
            config, _ = CLI.parse(argv[3:])
            assert Path(config.root, layout.RUN_CONFIG).exists()       # forked from the base
            Path(config.root, "loop-flags.txt").write_text(" ".join(argv[3:]))
        return 0, 100.0, 1.0, 100.0

    def run_match(self, argv):
        from arena.match import build_arg_parser
        self.calls.append("arena.match")
        args = build_arg_parser().parse_args(argv[3:])
        assert args.json and args.opening_moves == 0 and args.paired_openings == 4
        first, second = (spec.partition(":")[2] for spec in (args.player_a, args.player_b))
        # A run of the bundle wins 3 games in 4 against a default one; like runs split evenly.
        bundle = ["--train-steps-per-window 1000" in Path(root, "loop-flags.txt").read_text()
                  for root in (first, second)]
        rng = np.random.default_rng(args.seed)
        win = 0.75 if bundle == [True, False] else 0.25 if bundle == [False, True] else 0.5
        os.makedirs(args.sgf_dir, exist_ok=True)
        games = []
        for index in range(args.games):
            black, white = ("A", "B") if index % 2 == 0 else ("B", "A")
            a_wins = rng.random() < win
            result = "B+2.5" if a_wins == (black == "A") else "W+2.5"
            moves = [index // 2 % 81, 40 + index % 2, 81, 81]      # paired openings: a distinct game each
            path = os.path.join(args.sgf_dir, f"{index:05d}.sgf")
            Path(path).write_bytes(game_to_sgf(9, 7.5, moves, result=result))
            games.append(MatchGame(index, black, white, result, 2.5, "score", len(moves), path))
        wins = sum((g.result[0] == "B") == (g.black == "A") for g in games)
        record = MatchRecord("A", "B", 9, 7.5, len(games), wins, len(games) - wins, 0, 0, 0, wins / len(games),
                             0.0, 1.0, 4.0, 1.0, len(games), args.visits, tuple(games))
        return bench.subprocess.CompletedProcess(argv, 0, "a progress line\n" + record.to_bytes().decode(), "")


@pytest.fixture
def stand_ins(monkeypatch):
    fake = StandIns()
    monkeypatch.setattr(bench, "run_measured", fake.run_measured)
    monkeypatch.setattr(bench, "run_match", fake.run_match)
    monkeypatch.setattr(bench, "machine_speed", lambda: 10.0)       # no timing in tests
    monkeypatch.setattr(bench, "current_commit", lambda: ("c" * 40, False))
    return fake


def run_main(capsys, argv) -> dict:
    assert bench.main(argv) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    return json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in the JSON line"))


def test_make_base_run_arm_and_main_end_to_end(tmp_path, capsys, stand_ins, monkeypatch):
    argv = ["--out", str(tmp_path), "--seeds", "2", "--cross-games-per-run", "16", "--within-games", "4",
            "--arm-b-name", "bundle", "--arm-b", "--train-steps-per-window 1000", "--arm-b", "--train-input-planes 22"]
    result = run_main(capsys, argv)
    assert stand_ins.calls == ["selfplay.worker"] + ["operations.loop"] * 4 + ["arena.match"] * 6
    assert result["arm_b"] == "--train-steps-per-window 1000 --train-input-planes 22"
    assert result["arm_b_name"] == "bundle"
    assert result["arm_b_changes"] == ["--train-steps-per-window 1000", "--train-input-planes 22"]
    assert result["games_per_pairing"] == 8 and result["cross_games"] == 32
    assert [m["match"] for m in result["matches"]] == ["b1-vs-a1", "b1-vs-a2", "b2-vs-a1", "b2-vs-a2",
                                                       "a1-vs-a2", "b1-vs-b2"]
    assert all(len(m["digest"]) == 64 and m["seed"] for m in result["matches"])
    assert result["elo"] > 0 and result["decision"] in ("keep", "drop")
    assert result["resolvable_elo"] > 300 and result["commit"] == "c" * 40 and result["stale_caches"] == []
    assert sum(m["score"] for m in result["matches"][:4]) == result["cross_score"]
    assert Path(tmp_path, "runs", "b1", "loop-flags.txt").read_text().endswith(
        "--train-steps-per-window 1000 --train-input-planes 22")

    # The same command again: everything is reused, nothing runs, the same verdict.
    stand_ins.calls.clear()
    again = run_main(capsys, argv)
    assert stand_ins.calls == [] and again["matches"] == result["matches"] and again["elo"] == result["elo"]

    # Another commit: the base is refused, in one line naming what differs.
    monkeypatch.setattr(bench, "current_commit", lambda: ("d" * 40, False))
    with pytest.raises(SystemExit) as stopped:
        bench.main(argv)
    error = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and len(error.splitlines()) == 1
    assert "generation-0 lake" in error and f"commit {'c' * 40}, now {'d' * 40}" in error
    assert "--allow-stale-cache" in error
    # ... and reused when asked, saying so in the output and the JSON line.
    stale = run_main(capsys, argv + ["--allow-stale-cache"])
    assert stand_ins.calls == [] and len(stale["stale_caches"]) == 1 + 4 + 6
    monkeypatch.setattr(bench, "current_commit", lambda: ("c" * 40, False))

    # A slower machine: refused, naming the speed.
    monkeypatch.setattr(bench, "machine_speed", lambda: 6.0)
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert "machine speed 10.0, now 6.0" in capsys.readouterr().err
    monkeypatch.setattr(bench, "machine_speed", lambda: 10.0)

    # Other flags for arm B: its runs are refused (the base is still good).
    with pytest.raises(SystemExit) as stopped:
        bench.main(argv[:-2])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and "run b1" in error
    assert ("loop_flags '--train-steps-per-window 1000 --train-input-planes 22', "
            "now '--train-steps-per-window 1000'") in error


def test_run_arm_resumes_an_interrupted_run_and_refuses_one_begun_otherwise(tmp_path, capsys, stand_ins):
    args = bench.parse_args(["--out", str(tmp_path), "--arm-b=--worker-gumbel"])
    os.makedirs(tmp_path / "runs")
    bench.make_base(args, str(tmp_path / "base"))
    bench.make_base(args, str(tmp_path / "base"))                     # made once
    assert stand_ins.calls == ["selfplay.worker"]
    first = bench.run_arm(args, str(tmp_path / "base"), "b", args.arm_b_flags, 1)
    assert first["done"] and first["invocations"] == 1 and first["outside_cpu_seconds"] == 1.0
    (tmp_path / "runs" / "b1.json").unlink()                           # as if stopped before the record
    resumed = bench.run_arm(args, str(tmp_path / "base"), "b", args.arm_b_flags, 1)
    assert resumed["invocations"] == 1 and stand_ins.calls.count("operations.loop") == 2
    with pytest.raises(SystemExit) as stopped:
        bench.run_arm(args, str(tmp_path / "base"), "b", "--worker-visits 32", 1)
    assert stopped.value.code == 2 and "loop_flags '--worker-gumbel', now '--worker-visits 32'" in \
        capsys.readouterr().err


def test_an_arm_the_loop_would_refuse_is_refused_before_any_run(tmp_path, capsys, stand_ins):
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--out", str(tmp_path), "--arm-b", "--train-stepz 1000"])
    assert stopped.value.code == 2 and "--arm-b: operations.loop refuses '--train-stepz 1000'" in \
        capsys.readouterr().err
    assert stand_ins.calls == []


def test_the_arms_take_turns_and_a_window_stops_between_runs_for_a_rerun_to_resume(tmp_path, capsys, stand_ins,
                                                                                    monkeypatch):
    argv = ["--out", str(tmp_path), "--seeds", "2", "--cross-games-per-run", "4", "--minutes", "10",
            "--window-minutes", "25", "--arm-b=--worker-gumbel"]
    clock, order = [0.0], []

    def loop_takes_its_minutes(argv, log_path):
        if argv[2] == "operations.loop":
            clock[0] += 600
            order.append(os.path.basename(argv[argv.index("--root") + 1]))
        return StandIns.run_measured(stand_ins, argv, log_path)

    monkeypatch.setattr(bench.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(bench, "run_measured", loop_takes_its_minutes)
    with pytest.raises(SystemExit) as stopped:
        bench.main(argv)
    assert stopped.value.code == 3
    assert "window is spent before the next run; left: a2, b2" in capsys.readouterr().out
    assert order == ["a1", "b1"]

    # The same command again: a fresh window, the other two runs (a before b), then the matches.
    stand_ins.calls.clear()
    result = run_main(capsys, argv)
    assert stand_ins.calls == ["operations.loop"] * 2 + ["arena.match"] * 4
    assert order == ["a1", "b1", "a2", "b2"] and result["cross_games"] == 8
