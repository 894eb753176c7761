"""operations.loop's settings: the long-run mode (``--hours``) resolves its 'auto' settings, the loop
self-plays with its own search unless flags override it, and its closing match against generation 0
plays the run's own generation-0 player."""

import pytest

from selfplay.config import WorkerConfig


@pytest.fixture(autouse=True)
def _state_in_tmp(tmp_path, monkeypatch):
    """A loop keeps its local state (the phases' events) under ./loop-state: here, the test's own folder."""
    monkeypatch.chdir(tmp_path)


def test_the_long_run_mode_resolves_its_auto_settings(tmp_path):
    from operations.loop import Loop
    from operations.loop.settings import DEMO_GENERATIONS, GNUGO_GAME_SECONDS, LONG_RUN, LoopConfig

    root = str(tmp_path / "lake")
    demo = LoopConfig(root=root)
    assert (demo.budget_seconds, demo.generation_limit, demo.gnugo_games) == (900, DEMO_GENERATIONS, 0)
    assert demo.generation0_player == "playouts:1"
    long_run = LoopConfig(root=root, hours=2)
    assert long_run.budget_seconds == 7200 and long_run.generation_limit is None
    assert long_run.gnugo_games == LONG_RUN["final_gnugo_games"]
    assert (demo.gnugo_visits, long_run.gnugo_visits) == (demo.eval_visits, LONG_RUN["final_gnugo_visits"])
    # Explicit flags win over the mode's choices.
    assert LoopConfig(root=root, hours=2, generations=5, final_gnugo_games=0).generation_limit == 5
    assert LoopConfig(root=root, hours=2, final_gnugo_games=0).gnugo_games == 0
    uniform = LoopConfig(root=root, worker=WorkerConfig(root=root, generation0_playouts=0))
    assert uniform.generation0_player == "uniform"

    loop = Loop(long_run, storage=None)
    assert loop.selfplay_seconds(0) == LONG_RUN["selfplay_seconds"]
    # Its closing GNU Go games (40 at 256 visits) are planned for, on top of its other closing matches...
    fixed, per_visit = GNUGO_GAME_SECONDS
    without_gnugo = Loop(LoopConfig(root=root, hours=2, final_gnugo_games=0), storage=None)
    assert loop.final_eval_seconds() - without_gnugo.final_eval_seconds() >= 40 * (fixed + 256 * per_visit)
    # ...and close to what they take: a two-hour run's closing matches (100 games against random moves,
    # 50 against generation 0, 100 against GNU Go at 256 visits) took 228 s on 2 cores; the reservation
    # comes out of self-play and training, so it may not be several times that (it was 1,035 s).
    measured = Loop(LoopConfig(root=root, hours=2, final_gnugo_games=100), storage=None).final_eval_seconds()
    assert 228 <= measured <= 1.5 * 228
    # What the end of the budget must also hold: the closing matches and this generation's other phases.
    reserved = loop.final_eval_seconds() + sum(loop.phase_seconds.values())
    full = LONG_RUN["selfplay_seconds"]
    loop.deadline = loop.status.started + reserved + 0.8 * full   # near the end the last generation is cut...
    assert full / 2 <= loop.selfplay_seconds(7) < full
    loop.deadline = loop.status.started + reserved + 0.4 * full   # ...but never below half a generation
    assert loop.selfplay_seconds(7) == 0
    assert Loop(LoopConfig(root=root, hours=2, selfplay_seconds=60), storage=None).selfplay_seconds(0) == 60


def test_the_loop_self_plays_with_its_own_search_and_flags_override_it(tmp_path):
    from operations import loop as L
    from operations.loop.settings import LOOP_SEARCH

    root = str(tmp_path / "lake")
    config = L.CLI.parse(["--root", root])[0]
    assert {name: getattr(config.worker, name) for name in LOOP_SEARCH} == LOOP_SEARCH
    assert WorkerConfig(root=root).gumbel is False          # the worker's own defaults are not the loop's
    config = L.CLI.parse(["--root", root, "--no-worker-gumbel", "--worker-visits", "64",
                          "--worker-fast-visits", "16"])[0]
    assert (config.worker.gumbel, config.worker.visits, config.worker.fast_visits) == (False, 64, 16)


def test_the_summary_names_the_closing_opponents_and_the_gnugo_visits():
    from operations.loop.records import GenerationRecord, summary_table

    from format.match_record import ClosingRecord, MatchRecord

    def result(opponent, wins, visits=32):
        return MatchRecord(player_a="model-g1", player_b=opponent, board_size=9, komi=7.5, games=40, wins=wins,
                           losses=40 - wins, draws=0, wins_as_black=wins // 2, wins_as_white=wins - wins // 2,
                           win_rate=wins / 40, ci_low=0.1, ci_high=0.9, mean_moves=60.0, seconds=1.0, visits=visits)

    table = summary_table([GenerationRecord(0), GenerationRecord(1)], 1, ClosingRecord(
        vs_random=result("random", 40), vs_generation_0=result("playouts1", 38),
        vs_gnugo_1=result("gnugo-l1", 21, visits=256)))
    assert "vs generation 0 (playouts1 MCTS): 38/40" in table
    assert "vs GNU Go level 1 (the model at 256 visits a move, 4-move paired openings): 21/40" in table


def test_the_concurrent_schedule_starts_two_workers_by_default_each_with_its_own_spool(tmp_path):
    """--workers (2: what kept both cores busy in docs/results.md's measurement) becomes that many worker
    roles beside the follower and the trainer; --workers 1 is the single worker of before."""
    from cloud.storage import open_storage
    from operations import loop as L

    root = str(tmp_path / "lake")
    for flags, workers in (([], 2), (["--workers", "1"], 1)):
        config = L.CLI.parse(["--root", root, "--hours", "1", "--state-dir", str(tmp_path / "state"), *flags])[0]
        cluster = L.Loop(config, storage=open_storage(root)).start_roles(60.0, None)
        kinds = [role.spec.kind for role in cluster.roles]
        assert sorted(kinds) == sorted(["worker"] * workers + ["shuffle", "train"])
        spools = {role.spec.spool_dir for role in cluster.roles if role.spec.kind == "worker"}
        assert len(spools) == workers and "" not in spools


def test_anneal_plans_the_trainers_rate_to_fall_over_the_last_share_of_the_budget(tmp_path, capsys):
    import time

    from operations import loop as L
    from operations.loop.settings import ANNEAL_SWA_DECAY
    from operations.roles import role_argv

    root = str(tmp_path / "lake")
    config = L.CLI.parse(["--root", root, "--hours", "2", "--anneal", "0.25"])[0]
    before = time.time()
    loop = L.Loop(config, storage=None)
    train = loop.config.train
    assert (train.lr_schedule, train.lr_anneal_by) == ("anneal", "clock")
    # It ends where the closing matches begin, and starts a quarter of the training time before.
    end = before + 7200 - loop.final_eval_seconds()
    assert train.lr_anneal_to == pytest.approx(end, abs=5)
    assert train.lr_anneal_to - train.lr_anneal_from == pytest.approx(0.25 * (end - before), abs=5)
    argv = role_argv(loop.config, "train")
    assert argv[argv.index("--lr-schedule") + 1] == "anneal" and "--lr-anneal-from" in argv
    assert train.swa_decay == ANNEAL_SWA_DECAY          # and averaged weights are published
    mine = L.Loop(L.CLI.parse(["--root", root, "--hours", "2", "--anneal", "0.25", "--train-swa-decay", "0.99"])[0],
                  storage=None)
    assert mine.config.train.swa_decay == 0.99             # a decay given by hand is kept
    # On by default at 0.25 (the four-seed replay), off with --anneal 0; the loop will not plan over a
    # schedule given by hand, and says how to keep the hand's.
    for argv in (["--minutes", "15"], ["--hours", "2"]):
        default = L.Loop(L.CLI.parse(["--root", root, *argv])[0], storage=None).config.train
        assert (default.lr_schedule, default.swa_decay) == ("anneal", ANNEAL_SWA_DECAY), argv
        plain = L.Loop(L.CLI.parse(["--root", root, *argv, "--anneal", "0"])[0], storage=None).config.train
        assert (plain.lr_schedule, plain.swa_decay) == ("constant", 0.0), argv
    with pytest.raises(SystemExit):
        L.CLI.parse(["--root", root, "--train-lr-schedule", "cosine"])
    assert "drop --train-lr-schedule cosine or pass --anneal 0" in capsys.readouterr().err
    assert L.CLI.parse(["--root", root, "--anneal", "0", "--train-lr-schedule", "cosine"])[0].anneal == 0
