"""operations.cluster: every role at once on a fake-gcs-server root, under chaos.

The chaos test starts the launcher as a user would (3 workers, the shuffle
follower, the trainer; tiny 9x9 settings) against fake-gcs-server, which
enforces create-only writes, SIGKILLs a random role every few seconds (five
kills, each kind at least once, then it lets the cluster recover) until a
generation is published, then checks the zero-loss invariants from the
launcher's final JSON.  About 60 s wall on 2 cores, emulator included.  The small tests
before it cover the launcher's pieces without processes.
"""
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.operations.support import alive

from operations import cluster as C
from operations.chaos_audit import ZERO_LOSS_KEYS

REPO = Path(__file__).resolve().parents[2]

# Every role tiny: 2 cores carry 5 roles, the launcher and the emulator.
TINY = ["--workers", "3", "--worker-games", "8", "--worker-visits", "4", "--worker-fast-visits", "2",
        "--worker-chunk-games", "8", "--worker-chunk-seconds", "4", "--train-blocks", "1", "--train-filters", "8",
        "--train-batch-size", "32", "--train-steps-per-window", "20", "--train-warmup-steps", "20",
        "--train-log-every", "5", "--train-checkpoint-every", "10",
        "--shuffle-follow-new-positions", "1500", "--shuffle-claim-seconds", "8",
        "--poll-seconds", "1", "--status-seconds", "5", "--child-threads", "1", "--stop-grace", "20",
        "--restart-backoff", "0.5", "--drain-seconds", "25",
        "--role-args", "shuffle=--random-playouts 4 --shard-positions 4000 --window-min-positions 3000"]


def test_role_args_and_flags():
    assert C.parse_role_args(["worker=--leaves-per-game 4", "train=--seed 3"]) == (
        ("worker", ("--leaves-per-game", "4")), ("train", ("--seed", "3")))
    for unknown in ("gpu=--x", "trainer=--seed 3", "workers=--seed 3"):     # one name per role, as --ROLE-*
        with pytest.raises(ValueError, match="--role-args"):
            C.parse_role_args([unknown])
    with pytest.raises(ValueError, match="--workers"):
        C.ClusterConfig(workers=0)
    assert C.default_state_dir("gs://zl-bucket/run") == C.default_state_dir("gs://zl-bucket/run") != C.default_state_dir("x")


def test_the_state_folder_is_the_lakes_however_the_root_is_spelled(tmp_path, monkeypatch, capsys):
    """The workers' spools live in the state folder: keyed by the spelling of --root, a launcher killed
    under ``--root lake`` and restarted under ``--root /abs/lake`` never uploaded what they held."""
    import hashlib

    monkeypatch.chdir(tmp_path)
    (tmp_path / "lake").mkdir()
    os.symlink(tmp_path / "lake", tmp_path / "link")
    spellings = ["lake", "./lake", str(tmp_path / "lake"), f"{tmp_path}/lake/", f"file://{tmp_path}/lake", "link"]
    for folder in ("cluster-state", "loop-state"):
        assert len({C.default_state_dir(spelling, folder) for spelling in spellings}) == 1
    assert C.default_state_dir("gs://zl-bucket/run") == C.default_state_dir("gs://zl-bucket/run/") != \
        C.default_state_dir("gs://zl-bucket/x")
    # A folder that an earlier version named by the spelling is moved to the lake's name, spool and all.
    (tmp_path / "other").mkdir()
    spelled = tmp_path / "loop-state" / hashlib.sha256(b"other").hexdigest()[:12]
    (spelled / "worker0" / "spool").mkdir(parents=True)
    (spelled / "worker0" / "spool" / "entry").write_text("a game")
    state = C.default_state_dir("other", "loop-state")
    assert not spelled.exists() and (tmp_path / state / "worker0" / "spool" / "entry").read_text() == "a game"
    assert str(spelled.relative_to(tmp_path)) in capsys.readouterr().err
    assert C.default_state_dir(str(tmp_path / "other"), "loop-state") == state


def parse_cluster(argv):
    parser = C.build_parser()
    args = parser.parse_args(argv)
    return C.config_from_namespace(C.ClusterConfig, args, parser, role_args=C.parse_role_args(args.role_args))


def test_every_role_setting_reaches_its_processes(tmp_path):
    """--worker-*/--shuffle-*/--train-* end up in each child's argv, which the
    role's own CLI parses back into the same settings; managed settings differ per process."""
    from model.config import CLI as TRAIN
    from pipeline.config import ShuffleConfig
    from pipeline.config import from_args as shuffle_from_args
    from pipeline.shuffle import build_parser as shuffle_parser
    from selfplay.config import CLI as WORKER

    config = parse_cluster(["--root", "gs://b/r", "--workers", "2", "--worker-visits", "8", "--worker-c-puct", "2.5",
                            "--worker-gumbel", "--shuffle-reuse", "2", "--train-steps-per-window", "60",
                            "--train-learning-rate", "0.05", "--no-train-sync-batchnorm", "--poll-seconds", "2",
                            "--role-args", "worker=--seed 7"])
    specs = C.Commands(config, str(tmp_path)).all()
    assert [s.name for s in specs] == ["worker0", "worker1", "shuffle", "trainer"]
    worker, other_worker, shuffle, trainer = specs
    assert worker.argv[-2:] == ["--seed", "7"]                     # --role-args come last
    assert worker.spool_dir != other_worker.spool_dir
    parsed_worker, _ = WORKER.parse(worker.argv[1:])
    assert (parsed_worker.visits, parsed_worker.c_puct, parsed_worker.gumbel, parsed_worker.games) == (8, 2.5, True, 32)
    assert parsed_worker.spool_dir == worker.spool_dir and parsed_worker.poll_seconds == 2.0
    assert parsed_worker.worker_id == "w0" and WORKER.parse(other_worker.argv[1:])[0].worker_id == "w1"
    parser = shuffle_parser()
    args, _ = parser.parse_known_args(shuffle.argv[1:])
    parsed_shuffle = shuffle_from_args(args, parser)
    assert isinstance(parsed_shuffle, ShuffleConfig) and parsed_shuffle.reuse == 2.0 and parsed_shuffle.follow
    parsed_train, _ = TRAIN.parse(trainer.argv[1:])
    assert (parsed_train.steps_per_window, parsed_train.learning_rate, parsed_train.network.sync_batchnorm,
            parsed_train.follow, parsed_train.network.blocks) == (60, 0.05, False, True, 2)
    # The network's fields (TrainConfig.network) are flags under their own names: --blocks 2, not --network-*.
    assert trainer.argv[trainer.argv.index("--blocks") + 1] == "2" and "--no-sync-batchnorm" in trainer.argv
    assert parsed_train.network == config.train.network
    assert parsed_train.events == trainer.events_path


def test_a_bad_role_setting_names_the_launchers_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_cluster(["--worker-visits", "0"])
    assert exit_info.value.code == 2 and "--worker-visits" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_cluster(["--train-blocks", "0"])
    assert "--train-blocks" in capsys.readouterr().err
    with pytest.raises(SystemExit):                 # a rule of the nested NetworkConfig, in the launcher's words
        parse_cluster(["--train-global-pool-every", "1", "--train-global-pool-channels", "16"])
    assert "--train-global-pool-channels: must be smaller than --train-filters (16)" in capsys.readouterr().err


def test_chaos_kills_every_kind_before_any_twice():
    class Alive:
        def poll(self):
            return None

    roles = [C.Role(C.RoleSpec(n, k, [], "", "")) for n, k in
             [("worker0", "worker"), ("worker1", "worker"), ("shuffle", "shuffle"), ("trainer", "train")]]
    for role in roles:
        role.process = Alive()
    monkey = C.ChaosMonkey(5.0, random.Random(7))
    chosen = []
    for _ in range(3):
        victim = monkey.choose(roles)
        monkey.kills_by_kind[victim.kind] += 1
        chosen.append(victim.kind)
    assert sorted(chosen) == ["shuffle", "train", "worker"]


# A parent that starts a grandchild in its own group (as the shuffle job starts
# Beam's SDK workers), prints the grandchild's pid, then sleeps; with IGNORE it
# ignores SIGTERM, as a hung role would.
GROUP_PARENT = """
import signal, subprocess, sys, time
if sys.argv[1] == "IGNORE":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # exits, leaving its grandchild behind
grandchild = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                               "signal.SIG_IGN); time.sleep(60)"])
print(grandchild.pid, flush=True)
time.sleep(60)
"""



def test_stopping_a_child_stops_its_whole_process_group_within_the_grace():
    from processes.children import stop_groups

    children = [subprocess.Popen([sys.executable, "-c", GROUP_PARENT, mode], stdout=subprocess.PIPE, text=True,
                                 start_new_session=True) for mode in ("EXIT", "IGNORE")]
    grandchildren = [int(child.stdout.readline()) for child in children]
    started = time.monotonic()
    killed = stop_groups(children, grace=2.0)
    assert time.monotonic() - started < 6                  # one grace for all, not one each
    assert killed == [children[1]]                         # only the one that ignored SIGTERM needed SIGKILL
    assert children[0].returncode == 0 and children[1].returncode == -9
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in grandchildren) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in grandchildren)   # no orphan outlives the stop
    for child in children:
        child.stdout.close()


def test_each_child_gets_its_own_grace_and_a_hung_one_is_not_kept_for_a_longer_one():
    from processes.children import stop_groups

    children = [subprocess.Popen([sys.executable, "-c", GROUP_PARENT, "IGNORE"], stdout=subprocess.PIPE, text=True,
                                 start_new_session=True) for _ in range(2)]
    for child in children:
        child.stdout.readline()
    died = {}

    def watch():   # when the short-grace child dies (stop_groups returns only after the long one)
        while alive(children[1].pid) and time.monotonic() - started < 10:
            time.sleep(0.02)
        died["at"] = time.monotonic() - started

    started = time.monotonic()
    watcher = threading.Thread(target=watch)
    watcher.start()
    killed = stop_groups(children, grace=[3.0, 0.5])     # the long grace listed first
    total = time.monotonic() - started
    watcher.join()
    assert sorted(p.pid for p in killed) == sorted(p.pid for p in children)
    assert died["at"] < 2.0 and total >= 3.0
    for child in children:
        child.stdout.close()


def test_chaos_cluster_on_fake_gcs_loses_nothing(fake_gcs, tmp_path):
    root = fake_gcs.root_url("cluster")
    report_path = tmp_path / "report.json"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "operations.cluster", "--root", root, "--state-dir", str(tmp_path / "state"), *TINY,
         "--until-generations", "1", "--chaos-kill-every", "6", "--chaos-seed", "3",
         "--chaos-min-kills-per-kind", "1", "--chaos-max-kills", "5", "--minutes", "3", "--report", str(report_path)],
        cwd=REPO, capture_output=True, text=True, timeout=280, env={**os.environ, **fake_gcs.env, "TMPDIR": str(tmp_path)})
    wall = time.monotonic() - started
    logs = "".join(f"\n--- {p.name}\n" + p.read_text()[-1500:] for p in (tmp_path / "state" / "logs").glob("*.log"))
    assert report_path.exists(), result.stdout[-4000:] + result.stderr[-3000:] + logs
    report = json.loads(report_path.read_text())
    print(f"chaos cluster: {wall:.0f}s wall; {json.dumps(report)}")
    context = json.dumps(report, indent=1) + result.stdout[-3000:] + logs
    for key in ZERO_LOSS_KEYS:
        assert report[key] == 0, f"{key}: {context}"
    assert report["generations"] >= 1, context
    assert report["published_in_order_once"], context
    assert all(report["kills_by_role"][kind] >= 1 for kind in C.KINDS), context
    assert report["games_finished"] > 0 and report["games_in_lake"] >= report["games_finished"], context
    assert report["tmp_leftovers"] == [], context          # only the in-flight attempt may keep pieces
    assert result.returncode == 0, context


def test_a_second_launcher_on_a_root_is_refused_up_front(tmp_path, capsys):
    """A second operations.cluster on a root crash-looped its trainer and worker (14 exits in 45 s: the
    trainer lease, the spools of the shared state folder); it took no lease, where a loop did."""
    from cloud.storage import open_storage
    from format import layout
    from format.leases import Lease

    root = str(tmp_path / "lake")
    storage = open_storage(root)
    first = Lease(storage, layout.LAUNCHER_LEASE, 60.0)       # a live launcher (this very process)
    assert first.try_acquire() is None
    assert C.main(["--root", root, "--minutes", "1", "--state-dir", str(tmp_path / "state")]) == 2
    err = capsys.readouterr().err
    assert "another launcher" in err and first.holder in err and len(err.strip().splitlines()) == 1
    assert not storage.list(layout.settings_records_prefix("cluster"))   # refused before writing anything
    assert not (tmp_path / "state").exists()
    first.release()


def test_the_launcher_counts_finished_games_without_keeping_them(tmp_path):
    """The concurrent loop's launcher kept every role event, a game_finished a game: 199 -> 295 MB (medians of
    the middle and last third) over two hours of two workers.  It keeps them only for the chaos check."""
    from types import SimpleNamespace

    from format.events import EventLog

    path = str(tmp_path / "worker0.jsonl")
    log = EventLog(path, "worker")
    for i in range(500):
        log.emit("game_finished", game_id=f"g{i}", generation=1, moves=60, spool_entry=f"e{i}")
    log.emit("progress", games=500, positions=30000, generation=1, chunks=2, spooled=0)
    log.close()
    roles = [SimpleNamespace(name="worker0", spec=SimpleNamespace(events_path=path))]
    lean, full = C.Observer(None, roles, keep_games=False), C.Observer(None, roles)
    for observer in (lean, full):
        observer.poll_events()
        assert (observer.games_finished, observer.positions_finished) == (500, 30000)
        assert observer.totals()["games"] == 500 and observer.totals()["positions"] == 30000
    assert [e["event"] for e in lean.events["worker0"]] == ["progress"]
    assert sum(e["event"] == "game_finished" for e in full.events["worker0"]) == 500   # what the audit reads
