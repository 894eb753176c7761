"""``python -m operations.deploy status``: a lake (chunks, LATEST, the trainer's lease) read into one table."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from cloud.storage import open_storage
from format import codec, layout
from model.lease import LeaseRecord
from operations.deploy.status import read_status, table
from testdata.synthetic_games import synthetic_game
from tests.operations.deploy.support import run_deploy


def test_status_reads_generations_games_workers_and_the_lease(tmp_path, capsys):
    storage = open_storage(str(tmp_path / "lake"))
    rng = np.random.default_rng(1)
    now = time.time()
    for seq, (worker, minutes_ago, games) in enumerate([("vmA_11_aa", 5, 4), ("vmB_12_bb", 20, 4),
                                                        ("vmA_13_cc", 300, 2)]):
        chunk = codec.encode_chunk([synthetic_game(rng, 9, visits=8) for _ in range(games)])
        storage.write_new(layout.chunk_path(0, worker, int((now - minutes_ago * 60) * 1000), seq), chunk)
    storage.write_new(layout.LATEST, b"3\n")
    lease = LeaseRecord(holder="tpu-host:42:abcd", host="tpu-host", pid=42, acquired=now - 100, renewed=now - 5,
                        expires=now + 55)
    storage.write_new(layout.TRAINER_LEASE, lease.to_bytes())
    status = read_status(storage, recent_minutes=60, now=now)
    assert (status.latest_model, status.chunks, status.recent_chunks, status.worker_processes) == (3, 3, 2, 2)
    assert status.worker_machines == ("vmA", "vmB")
    assert status.games_per_hour == pytest.approx(8.0)          # 8 games in the last hour (all sampled)
    assert "held by tpu-host:42:abcd" in status.lease
    text = table(status)
    assert len(text.splitlines()) == 8 and "games per hour" in text
    code, out, err = run_deploy(["status", "--root", str(tmp_path / "lake")], capsys)
    assert code == 0 and "tpu-host:42:abcd" in out, err


def test_status_of_an_empty_lake_and_of_a_released_lease(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    status = read_status(storage)
    assert (status.latest_model, status.newest_window, status.games_per_hour) == (None, None, 0.0)
    assert status.lease.startswith("none")
    now = time.time()
    storage.write_new(layout.TRAINER_LEASE, LeaseRecord("h:1:x", "h", 1, now - 9, now - 9, now - 1, True).to_bytes())
    assert read_status(storage, now=now).lease.startswith("released by h:1:x")




def test_status_with_a_project_reports_the_worker_groups_vms_against_its_target(tmp_path, capsys, monkeypatch):
    """A stand-in gcloud: the group's target is 8, three VMs run and one is still being created (a stockout of
    spot VMs holds a group below its target, which the lake cannot show)."""
    from tests.operations.deploy.support import stand_in_gcloud

    folder, log = stand_in_gcloud(tmp_path / "bin", "case \"$4\" in\n  describe) echo 8 ;;\n"
                                  "  list-instances) printf 'RUNNING\\nRUNNING\\nPROVISIONING\\nRUNNING\\n' ;;\nesac\n")
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    open_storage(str(tmp_path / "lake"))
    code, out, err = run_deploy(["status", "--root", str(tmp_path / "lake"), "--project", "zl-test-project",
                                 "--region", "europe-west4"], capsys)
    assert code == 0, err
    [row] = [line for line in out.splitlines() if line.startswith("worker group")]
    assert row == "worker group zerolake-workers (europe-west4)  3 running of 8 (target), 1 not running yet or stopped"
    calls = log.read_text().splitlines()
    assert calls == [f"compute instance-groups managed {verb} zerolake-workers --region=europe-west4 "
                     f"--project=zl-test-project --format=value({field})"
                     for verb, field in (("describe", "targetSize"), ("list-instances", "instanceStatus"))]
    # gcloud failing (no such group, no permission) is one line; the lake's table still prints.
    (folder / "gcloud").write_text("#!/usr/bin/env bash\necho 'ERROR: (gcloud) not found: zerolake-workers' >&2\n"
                                   "exit 1\n")
    code, out, _ = run_deploy(["status", "--root", str(tmp_path / "lake"), "--project", "zl-test-project"], capsys)
    assert code == 0 and "lake" in out
    assert "worker group zerolake-workers (us-central1)  unknown: `gcloud compute instance-groups managed " \
           "describe` exited 1: ERROR: (gcloud) not found: zerolake-workers" in out
