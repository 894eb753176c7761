"""pipeline.cluster: every role at once on a fake-gcs-server root, under chaos.

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
import time
from pathlib import Path

import pytest

from pipeline import cluster as C

REPO = Path(__file__).resolve().parents[1]

# Every role tiny: 2 cores carry 5 roles, the launcher and the emulator.
TINY = ["--workers", "3", "--games-at-once", "8", "--visits", "4", "--fast-visits", "2",
        "--chunk-games", "8", "--chunk-seconds", "4", "--blocks", "1", "--filters", "8", "--batch-size", "32",
        "--train-steps", "20", "--checkpoint-every", "10", "--follow-new-positions", "1500", "--claim-seconds", "8",
        "--poll-seconds", "1", "--status-seconds", "5", "--child-threads", "1", "--stop-grace", "20",
        "--restart-backoff", "0.5", "--drain-seconds", "25",
        "--role-args", "shuffle=--random_playouts 4 --shard_positions 4000 --window_min_positions 3000"]


def test_role_args_and_flags():
    assert C.parse_role_args(["worker=--leaves-per-game 4", "trainer=--seed 3"]) == (
        ("worker", ("--leaves-per-game", "4")), ("train", ("--seed", "3")))
    with pytest.raises(ValueError, match="--role-args"):
        C.parse_role_args(["gpu=--x"])
    with pytest.raises(ValueError, match="--workers"):
        C.ClusterConfig(workers=0)
    assert C.default_state_dir("gs://b/run") == C.default_state_dir("gs://b/run") != C.default_state_dir("x")


def test_commands_pass_only_flags_a_role_has(tmp_path):
    config = C.ClusterConfig(root="gs://b/r", workers=2, role_args=(("worker", ("--seed", "-1")),))
    flags = {"worker": {"--spool-dir"}, "shuffle": {"--follow", "--events"}, "train": set()}
    commands = C.Commands(config, str(tmp_path), flags)
    specs = commands.all()
    assert [s.name for s in specs] == ["worker0", "worker1", "shuffle", "trainer"]
    assert "--spool-dir" in specs[0].argv and "--events" not in specs[0].argv
    assert specs[0].argv[-2:] == ["--seed", "-1"]
    assert "worker --events" in commands.missing and "train --follow" in commands.missing
    assert specs[0].spool_dir != specs[1].spool_dir


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


def test_chaos_cluster_on_fake_gcs_loses_nothing(fake_gcs, tmp_path):
    root = fake_gcs.root_url("cluster")
    report_path = tmp_path / "report.json"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cluster", "--root", root, "--state-dir", str(tmp_path / "state"), *TINY,
         "--until-generations", "1", "--chaos-kill-every", "6", "--chaos-seed", "3",
         "--chaos-min-kills-per-kind", "1", "--chaos-max-kills", "5", "--minutes", "1.4", "--report", str(report_path)],
        cwd=REPO, capture_output=True, text=True, timeout=170, env={**os.environ, **fake_gcs.env, "TMPDIR": str(tmp_path)})
    wall = time.monotonic() - started
    logs = "".join(f"\n--- {p.name}\n" + p.read_text()[-1500:] for p in (tmp_path / "state" / "logs").glob("*.log"))
    assert report_path.exists(), result.stdout[-4000:] + result.stderr[-3000:] + logs
    report = json.loads(report_path.read_text())
    print(f"chaos cluster: {wall:.0f}s wall; {json.dumps(report)}")
    context = json.dumps(report, indent=1) + result.stdout[-3000:] + logs
    for key in C.ZERO_LOSS_KEYS:
        assert report[key] == 0, f"{key}: {context}"
    assert report["generations"] >= 1, context
    assert report["published_in_order_once"], context
    assert all(report["kills_by_role"][kind] >= 1 for kind in C.KINDS), context
    assert report["games_finished"] > 0 and report["games_in_lake"] >= report["games_finished"], context
    assert report["tmp_leftovers"] == [], context          # only the in-flight attempt may keep pieces
    assert result.returncode == 0, context
