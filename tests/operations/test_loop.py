"""The one-machine loop end to end, on a tiny budget: local, interrupted, gs://."""
import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.operations.support import alive

from cloud.storage import open_storage
from format import layout
from format.settings_record import SettingsRecord
from format.match_record import MatchGame, MatchRecord
from operations.loop import Loop
from operations.loop import settings as S
from operations.loop.run import PhaseFailed
from operations.loop.settings import LoopConfig


@pytest.fixture(autouse=True)
def _state_in_tmp(tmp_path, monkeypatch):
    """A loop keeps its local state (the phases' events) under ./loop-state: here, the test's own folder."""
    monkeypatch.chdir(tmp_path)


REPO = Path(__file__).resolve().parents[2]

TINY = ["--generations", "1", "--selfplay-seconds", "8", "--worker-games", "16", "--worker-visits", "8",
        "--worker-fast-visits", "4", "--train-steps-per-window", "20", "--train-batch-size", "64",
        "--train-blocks", "1", "--train-filters", "8",
        "--eval-games", "4", "--final-eval-games", "6", "--eval-visits", "4", "--minutes", "10"]


def run_loop(root, *extra, env=None, timeout=400):
    return subprocess.run([sys.executable, "-m", "operations.loop", "--root", str(root), *TINY, *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def lake_objects(storage, prefix):
    return {(i.path, i.size) for i in storage.list(prefix)}


def assert_completed(result, storage):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "summary" in result.stdout
    assert re.search(r"vs uniform random moves: \d+/6", result.stdout), result.stdout[-2000:]
    assert re.search(r"vs generation 0 .*: \d+/3", result.stdout)
    # Each match's result is its own one summary line on the terminal; the loop reads the result from
    # the match's events and shows no JSON.
    assert not [line for line in result.stdout.splitlines() if line.lstrip().startswith(("{", "evaluate: {"))]
    assert re.search(r"^    evaluate: model-g1 vs random on 9x9.*: \d+ wins", result.stdout, re.M), \
        result.stdout[-2000:]
    assert storage.exists(layout.model_manifest(1))
    assert storage.exists(layout.window_manifest(1))
    assert int(storage.read(layout.LATEST)) == 1


def test_the_loop_reads_progress_from_events_not_from_human_lines(tmp_path, monkeypatch):
    """A stand-in child prints a misleading human line and emits one train progress event."""
    (tmp_path / "fake_trainer.py").write_text(
        "import sys\n"
        "from format.events import EventLog\n"
        "log = EventLog(sys.argv[sys.argv.index('--events') + 1], 'train')\n"
        "print('loss 9.000 policy 9.000 acc 0.900 value 9.000 ownership 9.000 score 9.000', flush=True)\n"
        "log.emit('progress', generation=1, step=20, steps=20, loss=2.5, policy_loss=2.0, value_loss=0.4,\n"
        "         accuracy=0.25, occupied_policy_mass=0.9, examples_per_s=100.0)\n"
        "print('done', flush=True)\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{REPO}")
    loop = Loop(LoopConfig(root=str(tmp_path / "lake")), open_storage(str(tmp_path / "lake")))
    events = loop.events_path("train")
    seen = []
    loop.run_child("train", ["fake_trainer", "--events", events], events, seen.append)
    assert [e["event"] for e in seen] == ["progress"] and seen[0]["loss"] == 2.5
    trees = [ast.parse(path.read_text()) for path in (REPO / "operations" / "loop").glob("*.py")]
    imported = {alias.name for tree in trees for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    assert "re" not in imported                               # no regex over the children's lines


def test_role_settings_reach_each_phases_command_line(tmp_path, monkeypatch):
    """--worker-*/--train-*/--shuffle-* reach the children's argv."""
    from operations import loop as L

    config, retry = L.CLI.parse(["--root", str(tmp_path / "lake"), "--worker-visits", "8", "--worker-c-puct",
                                 "2.5", "--train-learning-rate", "0.05", "--train-steps-per-window", "30",
                                 "--shuffle-reuse", "2", "--storage-max-attempts", "3"])
    loop = Loop(config, open_storage(config.root), retry)
    commands = []
    monkeypatch.setattr(loop, "run_child", lambda phase, argv, *rest: commands.append(argv) or [])
    loop.selfplay(0, loop.selfplay_seconds(0))
    loop.shuffle(0)
    loop.train(0)
    worker, shuffle, trainer = commands
    assert worker[0] == "selfplay.worker" and worker[worker.index("--visits") + 1] == "8"
    assert worker[worker.index("--c-puct") + 1] == "2.5" and worker[worker.index("--worker-id") + 1] == "loop0"
    assert worker[worker.index("--storage-max-attempts") + 1] == "3"
    assert shuffle[shuffle.index("--reuse") + 1] == "2.0" and shuffle[shuffle.index("--seed") + 1] == "1"
    assert trainer[trainer.index("--learning-rate") + 1] == "0.05"
    assert trainer[trainer.index("--steps-per-window") + 1] == "30" and "--events" in trainer


def test_each_invocation_records_its_settings_in_the_lake(tmp_path, monkeypatch):
    from operations import loop as L

    monkeypatch.setattr(L.Loop, "run", lambda self: 0)
    root = str(tmp_path / "lake")
    for _ in range(2):
        assert L.main(["--root", root, "--worker-visits", "9", "--generations", "2"]) == 0
    storage = open_storage(root)
    records = [i.path for i in storage.list(layout.settings_records_prefix("loop"))]
    assert len(records) == 2                                  # a second run adds its own, overwriting none
    record = SettingsRecord.from_bytes(storage.read(records[0]), records[0])
    assert record.launcher == "loop" and record.settings["worker"]["visits"] == 9
    assert record.settings["generations"] == 2 and record.settings["train"]["steps_per_window"] == 0   # auto


def test_loop_runs_a_generation_and_resumes_as_done(tmp_path):
    root = tmp_path / "lake"
    result = run_loop(root)
    storage = open_storage(str(root))
    assert_completed(result, storage)
    table = result.stdout[result.stdout.index("summary"):]
    assert re.search(r"^\s+0\s+\d+\s+\d+\s+[\d.]+", table, re.M), table  # generation 0 row with losses
    # What the machine did: the CPU of the roles, the positions self-played, the 20 steps of 64 trained.
    assert re.search(r"the machine: the roles used \d+% of \d+ cores over [\d.]+ minutes; [\d,]+ positions/hour "
                     r"\([\d,]+ in all\), [\d,]+ trained rows/hour \(20 steps x 64\)", table), table
    # Rerunning a finished run changes nothing in the lake but for its own settings record,
    # the loop's lease (a pointer object, released again) and the time it ran (loop/budget.json),
    # and prints the summary again.
    records = layout.settings_records_prefix("loop")
    before = lake_objects(storage, "")
    again = run_loop(root)
    assert again.returncode == 0 and "summary" in again.stdout
    after = lake_objects(storage, "")

    def kept(objects):
        return {o for o in objects if not o[0].startswith(records) and o[0] not in (layout.LAUNCHER_LEASE,
                                                                                     layout.LOOP_BUDGET)}
    assert kept(after) == kept(before)
    assert len(lake_objects(storage, records)) == 2


def test_ctrl_c_mid_phase_loses_nothing_and_rerun_resumes(tmp_path):
    root = tmp_path / "lake"
    proc = subprocess.Popen([sys.executable, "-m", "operations.loop", "--root", str(root), *TINY,
                             "--selfplay-seconds", "12"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen = []
    deadline = time.monotonic() + 300
    for line in proc.stdout:  # interrupt once training is under way
        seen.append(line)
        if "| train |" in line or time.monotonic() > deadline:
            break
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + rest
    assert "rerun the same command to resume" in rest

    storage = open_storage(str(root))
    chunks = lake_objects(storage, layout.games_prefix())
    window = lake_objects(storage, layout.windows_prefix())
    assert chunks and window
    result = run_loop(root)
    assert_completed(result, storage)
    # Every chunk and shard written before the interrupt is still there, unchanged.
    assert chunks <= lake_objects(storage, layout.games_prefix())
    assert window <= lake_objects(storage, layout.windows_prefix())
    # Self-play was not repeated: generation 0 has no chunk from after the interrupt.
    gen0 = {p for p, _ in lake_objects(storage, layout.games_prefix(0))}
    assert gen0 == {p for p, _ in chunks if p.startswith(layout.games_prefix(0))}


def test_a_rerun_continues_the_runs_budget_and_a_spent_one_goes_to_the_closing_matches(tmp_path, capsys):
    """A six-hour run stopped after four hours runs two more when rerun, not six: --hours and --minutes are
    the run's, and each invocation counts the time it ran into loop/budget.json."""
    from format.loop_budget import LoopBudget, read_loop_budget
    from operations import loop as L

    root = str(tmp_path / "lake")
    storage = open_storage(root)
    storage.write_replace(layout.LOOP_BUDGET, LoopBudget(budget_seconds=3600.0, spent_seconds=3000.0).to_bytes())
    half = Loop(L.CLI.parse(["--root", root, "--hours", "1"])[0], storage)
    assert half.deadline - half.status.started == pytest.approx(600.0)
    longer = Loop(L.CLI.parse(["--root", root, "--hours", "2"])[0], storage)   # a larger budget extends it
    assert longer.deadline - longer.status.started == pytest.approx(4200.0)
    # An anneal planned by a resumed run began in an earlier invocation: the last quarter of the whole run.
    annealed = Loop(L.CLI.parse(["--root", root, "--hours", "1", "--anneal", "0.25"])[0], storage).config.train
    assert annealed.lr_anneal_to - annealed.lr_anneal_from == pytest.approx(
        0.25 * (3600 - half.final_eval_seconds()), abs=5)

    # Spent: nothing is self-played or trained; the run goes to its closing matches (none at generation 0).
    storage.write_replace(layout.LOOP_BUDGET, LoopBudget(budget_seconds=60.0, spent_seconds=61.0).to_bytes())
    capsys.readouterr()
    assert L.main(["--root", root, "--minutes", "1"]) == 0
    out = capsys.readouterr().out
    assert "has run 0:01:01 of its 1 minutes before; 0:00:00 left" in out and "summary" in out, out[-2000:]
    assert not storage.list(layout.games_prefix())
    assert read_loop_budget(storage).spent_seconds >= 61.0     # and this invocation's seconds were counted

    storage.write_replace(layout.LOOP_BUDGET, b'{"version": 1, "budget_seconds": 60, "spent_seconds": -5}')
    assert L.main(["--root", root, "--minutes", "1"]) == 2
    err = capsys.readouterr().err
    assert "loop/budget.json: field 'spent_seconds'" in err and len(err.strip().splitlines()) == 1, err


def test_loop_on_a_gcs_root(gcs_emulator, tmp_path):
    root = gcs_emulator.root_url("loop")
    result = run_loop(root, env={**gcs_emulator.env, "TMPDIR": str(tmp_path)}, timeout=500)
    assert_completed(result, open_storage(root))


def test_a_published_generation_without_an_evaluation_is_evaluated_on_resume(tmp_path, monkeypatch):
    """Ctrl-C between the trainer's publish and the evaluation: the resumed loop evaluates it."""
    from testdata.models import publish_untrained_model

    root = str(tmp_path / "lake")
    publish_untrained_model(root, 1, 9, seed=1)
    publish_untrained_model(root, 2, 9, seed=2)
    storage = open_storage(root)
    storage.write_new(layout.loop_marker(f"eval-{layout.generation_dir(1)}.json"), match_record(3).to_bytes())
    loop = Loop(LoopConfig(root=root), storage)
    played = []
    monkeypatch.setattr(loop, "evaluate", lambda a, b, games, seed, visits=None: played.append(a) or match_record(1))
    loop.evaluate_unevaluated()
    assert played == [f"model:{root}@2"]                       # only the one without a marker
    marker = layout.loop_marker(f"eval-{layout.generation_dir(2)}.json")
    assert MatchRecord.from_bytes(storage.read(marker), marker) == match_record(1) == loop.rows[2].eval_vs_random


def match_record(wins, games=4, opponent="random", **fields):
    return MatchRecord(player_a="model-g1", player_b=opponent, board_size=9, komi=7.5, games=games, wins=wins,
                       losses=games - wins, draws=0, wins_as_black=wins // 2, wins_as_white=wins - wins // 2,
                       win_rate=wins / games, ci_low=0.0, ci_high=1.0, mean_moves=60.0, seconds=1.0, **fields)


def test_a_damaged_evaluation_marker_is_one_error_naming_it(tmp_path):
    root = str(tmp_path / "lake")
    storage = open_storage(root)
    marker = layout.loop_marker(f"eval-{layout.generation_dir(1)}.json")
    storage.write_new(marker, b'{"wins": 3}')
    with pytest.raises(PhaseFailed, match=r"eval-000001\.json.*no 'player_a'"):
        Loop(LoopConfig(root=root), storage).evaluate_generation(1)


def test_a_run_that_will_play_gnu_go_without_it_stops_at_once(tmp_path, monkeypatch, capsys):
    from operations import loop as L
    from arena import gtp_client

    def absent():
        raise gtp_client.GnuGoNotFound(f"gnugo not found: {gtp_client.INSTALL_HINT}")

    monkeypatch.setattr(gtp_client, "find_gnugo", absent)
    started = time.monotonic()
    assert L.main(["--root", str(tmp_path / "lake"), "--hours", "1"]) == 2
    err = capsys.readouterr().err
    assert time.monotonic() - started < 10 and "GNU Go level 1" in err and "gnugo" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "lake").exists()
    assert L.missing_tools(LoopConfig(root=str(tmp_path / "lake"))) == ""   # the demo plays no GNU Go


def test_a_second_loop_on_a_root_is_refused_up_front(tmp_path, capsys):
    from format.leases import Lease
    from operations import loop as L

    root = str(tmp_path / "lake")
    storage = open_storage(root)
    first = Lease(storage, layout.LAUNCHER_LEASE, 60.0)          # a live loop (this very process)
    assert first.try_acquire() is None
    assert L.main(["--root", root, "--minutes", "1"]) == 2
    err = capsys.readouterr().err
    assert "another launcher" in err and first.holder in err and len(err.strip().splitlines()) == 1
    assert not storage.list(layout.settings_records_prefix("loop"))   # refused before writing anything
    first.release()


def test_the_closing_gnu_go_games_keep_their_games_in_the_lake(tmp_path, monkeypatch):
    """The ladder folds the closing match into its fit game by game: the loop keeps each
    game's result and SGF in the lake (loop/final-<G>-gnugo-1/), and drops them elsewhere."""
    root = str(tmp_path / "lake")
    storage = open_storage(root)
    loop = Loop(LoopConfig(root=root), storage)

    def fake_match(phase, argv, events=None, on_event=None):
        assert argv[argv.index("--events") + 1] == events      # the result comes as the match's event
        folder = argv[argv.index("--sgf-dir") + 1] if "--sgf-dir" in argv else None
        games = []
        for index in range(2):
            sgf = None
            if folder:
                sgf = os.path.join(folder, f"{index:05d}-a-vs-b.sgf")
                with open(sgf, "wb") as handle:
                    handle.write(b"(;GM[1]SZ[9])")
            games.append(MatchGame(index, "a", "b", "B+R", None, "resign", 40, sgf))
        record = match_record(1, games=2, opponent=argv[2], game_results=tuple(games))
        on_event({"event": "result", "result": record.to_json_dict()})   # as arena.match emits it
        return []

    monkeypatch.setattr(loop, "run_child", fake_match)
    prefix = layout.loop_marker("final-000003-gnugo-1")
    kept = loop.evaluate("model:x@3", "gnugo:1", 2, seed=1, visits=256, sgf_prefix=prefix)
    assert [g.sgf for g in kept.game_results] == [f"{prefix}/00000.sgf", f"{prefix}/00001.sgf"]
    assert storage.read(f"{prefix}/00001.sgf") == b"(;GM[1]SZ[9])" and kept.visits == 256
    assert loop.evaluate("model:x@3", "random", 2, seed=1).game_results is None
    assert not [name for name in os.listdir(loop.events_dir) if name.startswith("sgf-")]   # no local copies left


def test_the_closing_gnu_go_match_plays_paired_openings_the_others_sampled_ones(tmp_path, monkeypatch):
    # Sampling the model's first moves while GNU Go plays its best from move 1 handicaps the
    # model: the closing match against GNU Go plays each random opening with both colours.
    from operations import loop as L
    from operations.loop import run as loop_run

    root = str(tmp_path / "lake")
    loop = Loop(L.CLI.parse(["--root", root, "--final-gnugo-games", "4", "--final-eval-games", "2"])[0],
                open_storage(root))
    monkeypatch.setattr(loop, "current_generation", lambda: 3)
    commands = []

    def fake_match(phase, argv, events=None, on_event=None):
        commands.append(argv)
        on_event({"event": "result", "result": match_record(1, games=2, opponent=argv[2]).to_json_dict()})
        return []

    monkeypatch.setattr(loop, "run_child", fake_match)
    monkeypatch.setattr(loop_run, "summary_table", lambda *args: "")
    loop.finish()
    by_opponent = {argv[2]: argv for argv in commands}
    gnugo = by_opponent["gnugo:1"]
    assert gnugo[gnugo.index("--paired-openings") + 1] == str(S.GNUGO_PAIRED_OPENINGS) == "4"
    assert all("--paired-openings" not in argv for opponent, argv in by_opponent.items() if opponent != "gnugo:1")


def test_generation_0_can_be_sized_in_positions(tmp_path, monkeypatch):
    from operations import loop as L

    config, retry = L.CLI.parse(["--root", str(tmp_path / "lake"), "--generation0-positions", "150000"])
    loop = Loop(config, open_storage(config.root), retry)
    commands = []
    monkeypatch.setattr(loop, "run_child", lambda phase, argv, *rest, **named: commands.append(argv) or [])
    loop.selfplay(0, 300)
    loop.selfplay(1, 300)
    first, second = commands
    assert first[first.index("--max-positions") + 1] == "150000" and first[first.index("--max-seconds") + 1] == "300"
    assert "--max-positions" not in second                  # model generations stay sized in time


def test_a_long_run_evaluates_against_random_every_4th_generation_the_demo_every_one(tmp_path):
    from operations import loop as L

    def due(*flags):
        config, _ = L.CLI.parse(["--root", str(tmp_path / "lake"), *flags])
        return [g for g in range(1, 13) if config.evaluates(g)]

    assert due() == list(range(1, 13))                                   # the 15-minute demo
    assert due("--hours", "2") == [1, 4, 8, 12]                          # about 1% of a two-hour run
    assert due("--hours", "2", "--eval-every", "1") == list(range(1, 13))
    assert due("--eval-every", "5") == [1, 5, 10]


# ---------------------------------------------------------------------------
# The concurrent schedule: every role at once, each started once
# ---------------------------------------------------------------------------

CONCURRENT = ["--schedule", "concurrent", "--workers", "1", "--generations", "1", "--minutes", "10",
              "--worker-games", "16", "--worker-visits", "8", "--worker-fast-visits", "4", "--train-batch-size", "64", "--train-blocks", "1",
              "--train-filters", "8",
              "--final-eval-games", "6", "--eval-visits", "4", "--no-train-cpu-int8",
              "--train-min-steps-per-window", "10", "--train-max-steps-per-window", "20",
              "--train-warmup-steps", "10", "--train-log-every", "10", "--train-checkpoint-every", "10",
              "--worker-chunk-seconds", "3", "--shuffle-window-min-positions", "3000", "--shuffle-workers", "1",
              "--shuffle-random-playouts", "4", "--shuffle-shard-positions", "4000"]


def test_the_concurrent_schedule_runs_every_role_at_once_and_resumes_after_a_stop(tmp_path):
    """One worker, the shuffle follower and the trainer follower run at once; a stop (SIGINT) while the
    trainer trains window 1 stops them all, and the same command then finishes the run from the lake,
    its spool and the trainer's checkpoint, and reports what the machine did."""
    root, state = tmp_path / "lake", tmp_path / "state"
    command = [sys.executable, "-m", "operations.loop", "--root", str(root), "--state-dir", str(state), *CONCURRENT]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    storage = open_storage(str(root))
    deadline = time.monotonic() + 120
    while not storage.exists(layout.window_manifest(1)) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "rerun the same command to resume" in out, out[-3000:]
    assert "the roles at once" in out and "worker0 up/0 shuffle up/0 trainer up/0" in out
    assert not storage.exists(layout.model_manifest(1))          # stopped before its model
    chunks = lake_objects(storage, layout.games_prefix())
    assert chunks and storage.exists(layout.window_manifest(1))

    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    # At least the one generation asked for: the trainer may publish a window it had nearly done as they stop.
    assert int(storage.read(layout.LATEST)) >= 1 and chunks <= lake_objects(storage, layout.games_prefix())
    assert re.search(r"vs uniform random moves: \d+/6", again.stdout)
    machine = re.search(r"the machine: the roles used (\d+)% of \d+ cores .*; ([\d,]+) positions/hour .*"
                        r"([\d,]+) trained rows/hour \((\d+) steps x 64\)", again.stdout)
    assert machine and int(machine[2].replace(",", "")) > 0 and int(machine[4]) > 0, again.stdout[-2000:]
    assert re.search(r"the roles used \d+% of \d+ cores over [\d.]+ minutes: worker0 \d+%, shuffle \d+%, "
                     r"trainer \d+%", again.stdout)
    # The trainer trained by the samples-per-row rule within its bounds (window 1, or window 2 when the
    # follower built it while the restarted trainer was starting: then window 1 was superseded).
    trainer_log = (state / "logs" / "trainer.log").read_text()
    assert re.search(r"training window 00000\d: .* (1\d|20) steps \(\d+ new rows x 2 samples per row\)",
                     trainer_log), trainer_log[-2000:]


def test_each_schedule_gets_its_trainer_steps_and_the_follower_its_sizing(tmp_path):
    from operations import loop as L

    def config(*flags):
        return L.CLI.parse(["--root", str(tmp_path / "lake"), *flags])[0]

    storage = open_storage(str(tmp_path / "lake"))
    assert not config().concurrent and config("--hours", "2").concurrent
    assert config("--hours", "2", "--schedule", "turns").concurrent is False
    assert config("--schedule", "concurrent").concurrent
    # Turns keep today's 500 steps a generation; the concurrent schedule's trainer uses its rule.
    assert Loop(config(), storage).config.train.steps_per_window == S.TURNS_STEPS_PER_WINDOW
    assert Loop(config("--hours", "2"), storage).config.train.steps_per_window == 0
    assert Loop(config("--hours", "2", "--train-steps-per-window", "30"),
                storage).config.train.steps_per_window == 30
    shuffle = config("--hours", "2", "--train-samples-per-row", "4", "--train-batch-size", "256").follower_shuffle()
    assert (shuffle.samples_per_row, shuffle.follow_max_untrained) == (4.0, 2)
    assert shuffle.follow_new_positions == S.CONCURRENT["min_steps_per_window"] * 256 // 4
    assert shuffle.follow_max_rows == S.CONCURRENT["max_steps_per_window"] * 256


def test_a_phase_child_dies_with_a_sigkilled_loop_and_its_events_live_in_the_state_folder(tmp_path):
    """The turns schedule's phase child outlived a SIGKILLed loop (a worker uploading on, a trainer
    holding the lease, so that "rerun the same command" failed), and its events folder stayed in TMPDIR."""
    script = (
        "import sys\n"
        "from operations.loop import Loop\n"
        "from operations.loop.settings import LoopConfig\n"
        "loop = Loop(LoopConfig(root=sys.argv[1]), storage=None)\n"
        "print(loop.events_dir, flush=True)\n"
        "loop.run_child('selfplay', ['timeit', '-n', '1', '-r', '1', 'import time; time.sleep(300)'])\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "lake")], cwd=tmp_path,
                                env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
    child = None
    try:
        events_dir = launcher.stdout.readline().strip()
        deadline = time.monotonic() + 60
        while child is None and time.monotonic() < deadline:
            with open(f"/proc/{launcher.pid}/task/{launcher.pid}/children") as listing:
                found = listing.read().split()
            child = int(found[0]) if found else None
            time.sleep(0.1)
        assert child is not None, "the phase child never started"
        time.sleep(0.5)                                     # past its exec
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child), "the phase child outlived the SIGKILLed loop"
    finally:
        launcher.kill()
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)
    assert Path(events_dir).parent.parent == tmp_path / "loop-state"      # ./loop-state/<lake>/phase-events
    (Path(events_dir) / "001-selfplay.jsonl").write_text("{}")  # what the killed loop left...
    again = Loop(LoopConfig(root=str(tmp_path / "lake")), storage=None)
    assert again.events_dir == events_dir and os.listdir(events_dir) == []   # ...the next one removes
    again.remove_events_dir()
    assert not (tmp_path / "loop-state").exists()            # and the state folder goes when it holds nothing else

