"""The follower's Dataflow jobs (pipeline.dataflow_jobs, pipeline.follow): named, labelled, cancelled.

No Dataflow is reachable here, so two stand-ins play its parts, each a real
executable the follower starts as it would start the real one:

* ``gcloud`` (FAKE_GCLOUD, a test double of the Google Cloud CLI), first on
  PATH: it appends its argv to a log and prints the canned job list of a JSON
  file for ``dataflow jobs list``, ignoring ``--filter`` unless told to apply
  it, so that the follower's own check of each name is what is tested (the
  worst gcloud could do); it fails or hangs on request.
* the window's launcher (FAKE_LAUNCHER, in place of ``python -m
  pipeline.shuffle``): it logs the command line the follower built for it and
  waits, as the real launcher waits for its Dataflow job.

Both write to one log, so the order of what happened (a stale job cancelled
before the new launcher started) is checked, not assumed.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from cloud.storage import open_storage
from format import layout
from format.events import EventLog
from pipeline import dataflow_jobs as DJ
from pipeline import follow as F
from pipeline import lake_view as LW
from pipeline.config import ShuffleConfig
from pipeline.shuffle import main

FAKE_GCLOUD = """#!{python}
# Test double of the Google Cloud CLI (tests/pipeline/test_follow_dataflow_jobs.py).
import json, os, re, sys, time
argv = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({{"who": "gcloud", "argv": argv}}) + "\\n")
time.sleep(float(os.environ.get("FAKE_GCLOUD_SLEEP", "0")))
if os.environ.get("FAKE_GCLOUD_FAIL"):
    print("ERROR: (gcloud.dataflow.jobs.list) PERMISSION_DENIED: the caller lacks dataflow.jobs.list",
          file=sys.stderr)
    sys.exit(1)
if argv[:3] == ["dataflow", "jobs", "list"]:
    with open(os.environ["FAKE_JOBS"]) as f:
        jobs = json.load(f)
    flags = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    if os.environ.get("FAKE_GCLOUD_APPLY_FILTER"):
        key, _, pattern = flags["filter"].partition("~")
        jobs = [j for j in jobs if re.search(pattern, j[key])]
    if flags.get("format") == "value(id)":
        print("\\n".join(j["id"] for j in jobs))
    else:
        print(os.environ.get("FAKE_GCLOUD_OUTPUT") or json.dumps(jobs))
elif argv[:3] == ["dataflow", "jobs", "cancel"]:
    print("Cancelled job [%s]" % argv[3], file=sys.stderr)
"""

FAKE_LAUNCHER = """# Stand-in for `python -m pipeline.shuffle` (tests/pipeline/test_follow_dataflow_jobs.py).
import json, os, sys, time
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({"who": "launcher", "argv": sys.argv[1:]}) + "\\n")
time.sleep(60)
"""

DATAFLOW_FLAGS = ["--runner", "DataflowRunner", "--project", "proj", "--region", "us-central1",
                  "--temp_location", "gs://b/tmp"]
ATTEMPT = "0new22"


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    """The stand-ins on PATH and PYTHONPATH; returns (log path, jobs file path)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(FAKE_GCLOUD.format(python=sys.executable))
    gcloud.chmod(0o755)
    (bin_dir / "fake_dataflow_launcher.py").write_text(FAKE_LAUNCHER)
    log, jobs = tmp_path / "calls.jsonl", tmp_path / "jobs.json"
    jobs.write_text("[]")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(bin_dir), *sys.path]))
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_JOBS", str(jobs))
    return log, jobs


def calls(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def cancelled(log) -> list[str]:
    return [c["argv"][3] for c in calls(log)
            if c["who"] == "gcloud" and c["argv"][:3] == ["dataflow", "jobs", "cancel"]]


def launched(log) -> list[list[str]]:
    return [c["argv"] for c in calls(log) if c["who"] == "launcher"]


def job(job_id: str, name: str, state: str = "Running") -> dict:
    """One row as `gcloud dataflow jobs list --format=json` prints it."""
    return {"id": job_id, "name": name, "type": "Batch", "state": state, "creationTime": "2026-11-27 05:00:00",
            "stateTime": "2026-11-27 05:00:01", "location": "us-central1"}


def follower(root: str, monkeypatch, claim_seconds: float = 60.0) -> F.Follower:
    """A follower whose window launcher is FAKE_LAUNCHER, given the command line the follower built."""
    config = ShuffleConfig(root=root, follow=True, claim_seconds=claim_seconds)
    built = F.Follower.window_command
    monkeypatch.setattr(F.Follower, "window_command",
                        lambda self, *a, **k: ["fake_dataflow_launcher", *built(self, *a, **k)[1:]])
    monkeypatch.setattr(F, "new_attempt_id", lambda: ATTEMPT)
    return F.Follower(config, DATAFLOW_FLAGS, open_storage(root), EventLog(None, "shuffle"))


def build_in_thread(fol: F.Follower, generation: int = 1) -> threading.Thread:
    outlook = F.Outlook(target=generation, new_positions=10_000, needed=100, window_positions=1_000_000)
    thread = threading.Thread(target=fol.build, args=(outlook,), daemon=True)
    thread.start()
    return thread


def wait_for(condition, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def finish(fol: F.Follower, thread: threading.Thread) -> None:
    fol.stop_reason = "SIGTERM"
    thread.join(timeout=60)
    assert not thread.is_alive()


# ---------------------------------------------------------------------------
# Names and labels
# ---------------------------------------------------------------------------

def test_job_names_and_labels_fit_dataflows_rules_and_name_their_run():
    run = DJ.run_label("gs://My-Bucket/Runs/2026_11 first try/" + "x" * 80)
    assert len(run) <= 63 and re.fullmatch(r"[a-z0-9-]+", run) and not run.startswith("-")
    assert DJ.run_label("gs://b/run") == DJ.run_label("gs://b/run/")         # one lake, one run
    assert DJ.run_label("gs://b/run") != DJ.run_label("gs://c/run")          # two lakes, two runs
    name = DJ.job_name(run, 12, "18f3a2b9c0ffee")
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,1022}[a-z0-9])?", name)
    assert DJ.parse_job_name(name) == (run, 12, "18f3a2b9c0ffee")
    assert DJ.parse_job_name("beamapp-someone-1127") is None
    labels = DJ.job_labels(run, 12, "18f3a2b9c0ffee")
    assert labels == {"zerolake-run": run, "zerolake-window": "12", "zerolake-role": "shuffle",
                      "zerolake-attempt": "18f3a2b9c0ffee"}
    assert all(re.fullmatch(r"[a-z][-a-z0-9_]{0,62}", k) and re.fullmatch(r"[-a-z0-9_]{0,63}", v)
               for k, v in labels.items())
    with pytest.raises(ValueError, match="attempt id 'A_1' cannot name a Dataflow job"):
        DJ.job_name(run, 1, "A_1")


def test_beam_reads_the_job_name_and_labels_the_follower_gives(tmp_path):
    from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions
    fol = F.Follower(ShuffleConfig(root=str(tmp_path), follow=True), DATAFLOW_FLAGS, None, events=None)
    command = fol.window_command(7, "abc123", 10**6)
    options = PipelineOptions(command[command.index("--runner"):]).view_as(GoogleCloudOptions)
    assert options.job_name == f"zerolake-{fol.run_label}-w7-abc123"
    assert sorted(options.labels) == sorted(f"{k}={v}" for k, v in DJ.job_labels(fol.run_label, 7, "abc123").items())
    # An in-process window (--dataflow-above-positions) launches no Dataflow job: no name, no labels.
    local = F.Follower(ShuffleConfig(root=str(tmp_path), follow=True, dataflow_above_positions=10**6),
                       DATAFLOW_FLAGS, None, events=None)
    assert not any(a.startswith(("--job_name", "--labels")) for a in local.window_command(7, "abc123", 10))


def test_the_follower_refuses_a_job_name_of_its_own_in_one_line(capsys):
    assert main(["--root", "r", "--follow", *DATAFLOW_FLAGS, "--job_name", "mine"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --job_name:")


def test_dataflow_flags_without_a_region_are_named_in_the_warning(tmp_path):
    fol = F.Follower(ShuffleConfig(root=str(tmp_path), follow=True), ["--runner", "DataflowRunner"], None, None)
    assert fol.dataflow is None and fol.dataflow_problem.startswith("--region:")


# ---------------------------------------------------------------------------
# Cancelling: on a stop, on a lost claim, and a stale job at the start of a window
# ---------------------------------------------------------------------------

def test_a_stop_cancels_the_windows_job_and_only_it(tmp_path, fakes, monkeypatch):
    log, jobs = fakes
    root = str(tmp_path / "lake")
    fol = follower(root, monkeypatch)
    run = fol.run_label
    other_run = DJ.run_label("gs://other/run")
    jobs.write_text(json.dumps([job("own", DJ.job_name(run, 1, ATTEMPT)),
                                job("next-window", DJ.job_name(run, 2, "abc")),
                                job("other-run", DJ.job_name(other_run, 1, "abc")),
                                job("not-ours", "beamapp-someone-1127")]))
    thread = build_in_thread(fol)
    wait_for(lambda: launched(log), "the launcher")
    (argv,) = launched(log)
    assert f"--job_name=zerolake-{run}-w1-{ATTEMPT}" in argv and f"--labels=zerolake-run={run}" in argv
    assert "--labels=zerolake-window=1" in argv and "--labels=zerolake-role=shuffle" in argv
    finish(fol, thread)
    assert cancelled(log) == ["own"]
    cancel = [c["argv"] for c in calls(log) if c["argv"][:3] == ["dataflow", "jobs", "cancel"]][0]
    assert "--region=us-central1" in cancel and "--project=proj" in cancel
    listing = [c["argv"] for c in calls(log) if c["argv"][:3] == ["dataflow", "jobs", "list"]][-1]
    assert "--status=active" in listing and f"--filter={DJ.list_filter(run, 1)}" in listing
    storage = open_storage(root)
    assert LW.live_claim(storage, 1) is None                     # released as before


def test_a_lost_claim_cancels_the_windows_job(tmp_path, fakes, monkeypatch, capsys):
    log, jobs = fakes
    root = str(tmp_path / "lake")
    fol = follower(root, monkeypatch, claim_seconds=1.0)          # renewed every 0.25 s
    jobs.write_text(json.dumps([job("own", DJ.job_name(fol.run_label, 1, ATTEMPT))]))
    thread = build_in_thread(fol)
    wait_for(lambda: launched(log), "the launcher")
    assert cancelled(log) == []
    open_storage(root).delete(layout.window_claim(1))              # the claim is gone: its next renewal fails
    thread.join(timeout=60)
    assert not thread.is_alive() and not fol.stop_reason
    assert cancelled(log) == ["own"]
    out = capsys.readouterr().out
    assert f"cancelled Dataflow job zerolake-{fol.run_label}-w1-{ATTEMPT} (own) of this attempt" in out


def test_a_job_of_an_earlier_attempt_is_cancelled_before_the_new_one_launches(tmp_path, fakes, monkeypatch, capsys):
    log, jobs = fakes
    root = str(tmp_path / "lake")
    fol = follower(root, monkeypatch)
    run = fol.run_label
    jobs.write_text(json.dumps([job("stale", DJ.job_name(run, 1, "0old11")),
                                job("ending", DJ.job_name(run, 1, "0old00"), state="Cancelling"),
                                job("other-window", DJ.job_name(run, 12, "0old11")),
                                job("other-run", DJ.job_name(DJ.run_label("gs://other/run"), 1, "0old11"))]))
    thread = build_in_thread(fol)
    wait_for(lambda: launched(log), "the launcher")
    whos = [(c["who"], c["argv"][:4]) for c in calls(log)]
    assert whos.index(("gcloud", ["dataflow", "jobs", "cancel", "stale"])) < [w for w, _ in whos].index("launcher")
    finish(fol, thread)
    assert cancelled(log) == ["stale"]       # the stop finds no job of its own attempt in the canned list
    assert f"cancelled Dataflow job zerolake-{run}-w1-0old11 (stale) of the earlier attempt 0old11" in \
        capsys.readouterr().out


def test_a_gcloud_failure_is_one_warning_and_the_window_is_built_anyway(tmp_path, fakes, monkeypatch, capsys):
    log, _ = fakes
    monkeypatch.setenv("FAKE_GCLOUD_FAIL", "1")
    fol = follower(str(tmp_path / "lake"), monkeypatch)
    thread = build_in_thread(fol)
    wait_for(lambda: launched(log), "the launcher")               # the failed listing did not stop the window
    finish(fol, thread)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2                                     # at the start, and at the stop
    for line in warnings:
        assert f"listing the Dataflow jobs of run {fol.run_label} window 1" in line
        assert "`gcloud dataflow jobs list` exited 1: ERROR: (gcloud.dataflow.jobs.list) PERMISSION_DENIED" in line
    assert cancelled(log) == []


def test_gcloud_missing_hung_or_garbled_is_one_line_naming_it(tmp_path, fakes, monkeypatch):
    where = DJ.Dataflow("proj", "us-central1", gcloud=str(tmp_path / "no" / "gcloud"))
    with pytest.raises(DJ.DataflowJobsError, match=r"^listing the Dataflow jobs of run r window 3: '.*gcloud' is "
                                                   r"not installed or not on PATH$"):
        where.active_jobs("r", 3)
    monkeypatch.setenv("FAKE_GCLOUD_SLEEP", "5")
    with pytest.raises(DJ.DataflowJobsError, match=r"cancelling Dataflow job zerolake-r-w3-a \(123\): "
                                                   r"`gcloud dataflow jobs cancel` took more than 0.5 s$"):
        DJ.Dataflow("proj", "us-central1", timeout=0.5).cancel(DJ.Job("123", "zerolake-r-w3-a", "Running",
                                                                      "r", 3, "a"))
    monkeypatch.delenv("FAKE_GCLOUD_SLEEP")
    monkeypatch.setenv("FAKE_GCLOUD_OUTPUT", "Listed 0 items.")
    with pytest.raises(DJ.DataflowJobsError, match="gcloud printed no job list") as error:
        DJ.Dataflow("proj", "us-central1").active_jobs("r", 3)
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------------
# `down`: every job of the run
# ---------------------------------------------------------------------------

def test_the_down_line_cancels_every_active_job_of_the_run_and_no_other(tmp_path, fakes, monkeypatch):
    log, jobs = fakes
    monkeypatch.setenv("FAKE_GCLOUD_APPLY_FILTER", "1")           # this line relies on gcloud's --filter
    run = DJ.run_label("gs://bucket/run")
    jobs.write_text(json.dumps([job("w1", DJ.job_name(run, 1, "a1")), job("w12", DJ.job_name(run, 12, "b2")),
                                job("other-run", DJ.job_name(DJ.run_label("gs://bucket/run2"), 1, "a1")),
                                job("not-ours", "beamapp-someone-1127")]))
    line = DJ.cancel_run_shell("gs://bucket/run", "proj", "us-central1")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", line], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert cancelled(log) == ["w1", "w12"]
    assert all("--region=us-central1" in c["argv"] and "--project=proj" in c["argv"] for c in calls(log))
