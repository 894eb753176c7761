"""The follower's Dataflow jobs (pipeline.dataflow_jobs, pipeline.follow): named, labelled, cancelled.

No Dataflow is reachable here, so stand-ins play its parts, each what the follower really talks to:

* Dataflow's API (StandInDataflow): an HTTP server on 127.0.0.1 that speaks the REST API's JSON
  (``GET .../locations/R/jobs`` lists the canned jobs, whatever their names, so that the follower's
  own check of each name is what is tested; ``PUT .../jobs/ID`` cancels), reached through Beam's
  ``--dataflow_endpoint`` by the client library the follower uses; it fails, hangs or garbles on
  request.
* the window's launcher (FAKE_LAUNCHER, in place of ``python -m pipeline.shuffle``): it logs the
  command line the follower built for it and waits, as the real launcher waits for its Dataflow job.
* ``gcloud`` (FAKE_GCLOUD), only for ``down``'s line, which runs on the operator's machine.

All write to one log, so the order of what happened (a stale job cancelled before the new launcher
started) is checked, not assumed.
"""
from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse

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
# Test double of the Google Cloud CLI for `down`'s line (tests/pipeline/test_follow_dataflow_jobs.py).
import json, os, re, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({{"who": "gcloud", "argv": argv}}) + "\\n")
if argv[:3] == ["dataflow", "jobs", "list"]:
    with open(os.environ["FAKE_JOBS"]) as f:
        jobs = json.load(f)
    flags = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    key, _, pattern = flags["filter"].partition("~")
    print("\\n".join(j["id"] for j in jobs if re.search(pattern, j[key])))
"""

FAKE_LAUNCHER = """# Stand-in for `python -m pipeline.shuffle` (tests/pipeline/test_follow_dataflow_jobs.py).
import json, os, sys, time
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({"who": "launcher", "argv": sys.argv[1:]}) + "\\n")
time.sleep(60)
"""

PROJECT, REGION = "proj", "us-central1"
ATTEMPT = "0new22"


class StandInDataflow(http.server.ThreadingHTTPServer):
    """Dataflow's REST API on 127.0.0.1 (module docstring): ``jobs`` is what a listing returns;
    ``fail``, ``sleep`` and ``garble`` make each call a 403, slow, or not JSON."""

    def __init__(self, log):
        self.log, self.jobs, self.fail, self.sleep, self.garble = log, [], False, 0.0, False
        super().__init__(("127.0.0.1", 0), _DataflowHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class _DataflowHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _answer(self, status: int, body) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        server = self.server
        url = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        with open(server.log, "a") as log:
            log.write(json.dumps({"who": "dataflow", "method": method, "path": url.path,
                                  "query": urllib.parse.parse_qs(url.query), "body": body}) + "\n")
        time.sleep(server.sleep)
        jobs = f"/v1b3/projects/{PROJECT}/locations/{REGION}/jobs"
        if server.fail:
            self._answer(403, {"error": {"code": 403, "status": "PERMISSION_DENIED",
                                         "message": "the caller lacks dataflow.jobs.list"}})
        elif server.garble:
            self._answer(200, b"Listed 0 items.")
        elif method == "GET" and url.path == jobs:
            self._answer(200, {"jobs": server.jobs})
        elif method == "PUT" and url.path.startswith(jobs + "/"):
            self._answer(200, {"id": url.path.rsplit("/", 1)[1], **(body or {})})
        else:
            self._answer(404, {"error": {"code": 404, "status": "NOT_FOUND", "message": url.path}})

    def do_GET(self):
        self._handle("GET")

    def do_PUT(self):
        self._handle("PUT")


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    """The stand-ins; returns (log path, the Dataflow stand-in).  The launcher is on PYTHONPATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(FAKE_GCLOUD.format(python=sys.executable))
    gcloud.chmod(0o755)
    (bin_dir / "fake_dataflow_launcher.py").write_text(FAKE_LAUNCHER)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(bin_dir), *sys.path]))
    monkeypatch.setenv("FAKE_LOG", str(log))
    server = StandInDataflow(str(log))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield log, server
    server.shutdown()
    server.server_close()


def dataflow_flags(server: StandInDataflow) -> list[str]:
    return ["--runner", "DataflowRunner", "--project", PROJECT, "--region", REGION, "--temp_location", "gs://b/tmp",
            f"--dataflow_endpoint={server.url}"]


DATAFLOW_FLAGS = ["--runner", "DataflowRunner", "--project", PROJECT, "--region", REGION,
                  "--temp_location", "gs://b/tmp"]


def calls(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def cancelled(log) -> list[str]:
    """The ids of the jobs cancelled through the API (a PUT asking for the cancelled state)."""
    return [c["path"].rsplit("/", 1)[1] for c in calls(log)
            if c["who"] == "dataflow" and c["method"] == "PUT"
            and c["body"].get("requestedState") in ("JOB_STATE_CANCELLED", 5)]


def launched(log) -> list[list[str]]:
    return [c["argv"] for c in calls(log) if c["who"] == "launcher"]


def job(job_id: str, name: str, state: str = "JOB_STATE_RUNNING") -> dict:
    """One job as the REST API lists it."""
    return {"id": job_id, "projectId": PROJECT, "name": name, "type": "JOB_TYPE_BATCH", "currentState": state,
            "createTime": "2026-11-27T05:00:00Z", "location": REGION}


def follower(root: str, monkeypatch, server: StandInDataflow, claim_seconds: float = 60.0) -> F.Follower:
    """A follower whose window launcher is FAKE_LAUNCHER, given the command line the follower built, and
    whose Dataflow is the stand-in."""
    config = ShuffleConfig(root=root, follow=True, claim_seconds=claim_seconds)
    built = F.Follower.window_command
    monkeypatch.setattr(F.Follower, "window_command",
                        lambda self, *a, **k: ["fake_dataflow_launcher", *built(self, *a, **k)[1:]])
    monkeypatch.setattr(F, "new_attempt_id", lambda: ATTEMPT)
    return F.Follower(config, dataflow_flags(server), open_storage(root), EventLog(None, "shuffle"))


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
    log, server = fakes
    root = str(tmp_path / "lake")
    fol = follower(root, monkeypatch, server)
    run = fol.run_label
    other_run = DJ.run_label("gs://other/run")
    server.jobs = [job("own", DJ.job_name(run, 1, ATTEMPT)), job("next-window", DJ.job_name(run, 2, "abc")),
                   job("other-run", DJ.job_name(other_run, 1, "abc")), job("not-ours", "beamapp-someone-1127")]
    thread = build_in_thread(fol)
    wait_for(lambda: launched(log), "the launcher")
    (argv,) = launched(log)
    assert f"--job_name=zerolake-{run}-w1-{ATTEMPT}" in argv and f"--labels=zerolake-run={run}" in argv
    assert "--labels=zerolake-window=1" in argv and "--labels=zerolake-role=shuffle" in argv
    finish(fol, thread)
    assert cancelled(log) == ["own"]
    [listing] = {json.dumps(c["query"]) for c in calls(log) if c["who"] == "dataflow" and c["method"] == "GET"}
    assert json.loads(listing)["filter"][0] in ("ACTIVE", "3")      # active jobs only, of the flags' project/region
    storage = open_storage(root)
    assert LW.live_claim(storage, 1) is None                     # released as before


def test_a_lost_claim_cancels_the_windows_job(tmp_path, fakes, monkeypatch, capsys):
    log, server = fakes
    root = str(tmp_path / "lake")
    fol = follower(root, monkeypatch, server, claim_seconds=1.0)   # renewed every 0.25 s
    server.jobs = [job("own", DJ.job_name(fol.run_label, 1, ATTEMPT))]
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
    log, server = fakes
    root = str(tmp_path / "lake")
    fol = follower(root, monkeypatch, server)
    run = fol.run_label
    server.jobs = [job("stale", DJ.job_name(run, 1, "0old11")),
                   job("ending", DJ.job_name(run, 1, "0old00"), state="JOB_STATE_CANCELLING"),
                   job("other-window", DJ.job_name(run, 12, "0old11")),
                   job("other-run", DJ.job_name(DJ.run_label("gs://other/run"), 1, "0old11"))]
    thread = build_in_thread(fol)
    wait_for(lambda: launched(log), "the launcher")
    order = [c["who"] if c["who"] == "launcher" else c["method"] + c["path"].rsplit("/", 1)[1] for c in calls(log)]
    assert order.index("PUTstale") < order.index("launcher")
    finish(fol, thread)
    assert cancelled(log) == ["stale"]       # the stop finds no job of its own attempt in the canned list
    assert f"cancelled Dataflow job zerolake-{run}-w1-0old11 (stale) of the earlier attempt 0old11" in \
        capsys.readouterr().out


def test_an_api_failure_is_one_warning_and_the_window_is_built_anyway(tmp_path, fakes, monkeypatch, capsys):
    log, server = fakes
    server.fail = True
    fol = follower(str(tmp_path / "lake"), monkeypatch, server)
    thread = build_in_thread(fol)
    wait_for(lambda: launched(log), "the launcher")               # the failed listing did not stop the window
    finish(fol, thread)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2                                     # at the start, and at the stop
    for line in warnings:
        assert f"listing the Dataflow jobs of run {fol.run_label} window 1: " in line
        assert "403" in line and "the caller lacks dataflow.jobs.list" in line
    assert cancelled(log) == []


def test_dataflow_unreachable_hung_or_garbled_is_one_line_naming_it(tmp_path, fakes):
    _, server = fakes
    closed = StandInDataflow("/dev/null")
    closed.server_close()                                         # a port nothing listens on
    with pytest.raises(DJ.DataflowJobsError, match=r"^listing the Dataflow jobs of run r window 3: ") as error:
        DJ.Dataflow(PROJECT, REGION, endpoint=closed.url).active_jobs("r", 3)
    assert "\n" not in str(error.value)
    server.sleep = 5.0
    with pytest.raises(DJ.DataflowJobsError, match=r"^cancelling Dataflow job zerolake-r-w3-a \(123\): ") as error:
        DJ.Dataflow(PROJECT, REGION, endpoint=server.url, timeout=0.5).cancel(
            DJ.Job("123", "zerolake-r-w3-a", "running", "r", 3, "a"))
    assert "\n" not in str(error.value) and "time" in str(error.value).lower()
    server.sleep, server.garble = 0.0, True
    with pytest.raises(DJ.DataflowJobsError, match=r"^listing the Dataflow jobs of run r window 3: ") as error:
        DJ.Dataflow(PROJECT, REGION, endpoint=server.url).active_jobs("r", 3)
    assert "\n" not in str(error.value)


def test_the_follower_reads_the_api_endpoint_project_and_region_from_its_beam_flags():
    where = DJ.Dataflow.from_beam_args([*DATAFLOW_FLAGS, "--dataflow_endpoint", "http://127.0.0.1:9/"])
    assert where == DJ.Dataflow(PROJECT, REGION, endpoint="http://127.0.0.1:9")
    assert DJ.Dataflow.from_beam_args(DATAFLOW_FLAGS).endpoint == "https://dataflow.googleapis.com"


# ---------------------------------------------------------------------------
# `down`: every job of the run
# ---------------------------------------------------------------------------

def test_the_down_line_cancels_every_active_job_of_the_run_and_no_other(tmp_path, fakes, monkeypatch):
    log, _ = fakes
    jobs = tmp_path / "jobs.json"
    monkeypatch.setenv("FAKE_JOBS", str(jobs))
    run = DJ.run_label("gs://bucket/run")
    jobs.write_text(json.dumps([{"id": "w1", "name": DJ.job_name(run, 1, "a1")},
                                {"id": "w12", "name": DJ.job_name(run, 12, "b2")},
                                {"id": "other-run", "name": DJ.job_name(DJ.run_label("gs://bucket/run2"), 1, "a1")},
                                {"id": "not-ours", "name": "beamapp-someone-1127"}]))
    line = DJ.cancel_run_shell("gs://bucket/run", "proj", "us-central1")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", line], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    gcloud = [c["argv"] for c in calls(log) if c["who"] == "gcloud"]
    assert [argv[3] for argv in gcloud if argv[:3] == ["dataflow", "jobs", "cancel"]] == ["w1", "w12"]
    assert all("--region=us-central1" in argv and "--project=proj" in argv for argv in gcloud)
