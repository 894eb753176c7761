"""Capacity that is waited for: queued TPUs, and trainers that cannot be had yet.

The plan's script runs against a stand-in gcloud that plays a queued
resource: its request states come from a list (describe pops one each look),
its create may fail with a quota error, and every call is logged.  Checked:
the request is queued before the workers and waited for after them, until
ACTIVE or FAILED or --trainer-wait-minutes; a FAILED or expired request is
deleted before a new one; a zero quota is one line; a TPU or GPU trainer that
cannot be had does not stop the workers, and the script ends with status 3
naming it; ``down`` deletes the request.
"""
from __future__ import annotations

import os
import subprocess

from tests.operations.deploy.support import BASE, RELEASE, creates, plan_text, stand_in_gcloud

QUEUED = r"""
state_file="$(dirname "$0")/states"
if [[ $* == *"queued-resources describe"*"state.state"* ]]; then
  [[ -e "$(dirname "$0")/queued" ]] || exit 1
  head -n 1 "$state_file"
  if (( $(wc -l < "$state_file") > 1 )); then sed -i 1d "$state_file"; fi
  exit 0
fi
[[ $* == *"failedData"* ]] && { cat "$(dirname "$0")/reason" 2>/dev/null; exit 0; }
if [[ $* == *"queued-resources create"* ]]; then
  if [[ -e "$(dirname "$0")/create-error" ]]; then cat "$(dirname "$0")/create-error" >&2; exit 1; fi
  touch "$(dirname "$0")/queued"; exit 0
fi
[[ $* == *"queued-resources delete"* ]] && { rm -f "$(dirname "$0")/queued"; exit 0; }
[[ $* == *"accelerator-types"* ]] && { echo v5litepod-8; echo nvidia-l4; exit 0; }
[[ $* == *"tpu-vm versions list"* ]] && { echo v2-alpha-tpuv5-lite; exit 0; }
[[ $* == *"trainer"*"instances create"* || $* == *"instances create"*"trainer"* ]] && [[ -e "$(dirname "$0")/no-gpu" ]] && exit 1
[[ $* == *describe* ]] && exit 1
exit 0
"""


def _run(tmp_path, argv, capsys, *, states=(), queued=False, create_error="", reason="", no_gpu=False):
    script = plan_text(["plan", "--only", "trainer,workers", "--workers", "2", "--release", RELEASE] + argv + BASE,
                       capsys)
    folder, log = stand_in_gcloud(tmp_path / "bin", QUEUED)
    (folder / "states").write_text("".join(f"{s}\n" for s in states))
    for name, on, text in (("queued", queued, ""), ("create-error", create_error, create_error),
                           ("reason", reason, reason), ("no-gpu", no_gpu, "")):
        if on:
            (folder / name).write_text(text)
    result = subprocess.run(["bash", "-c", script.replace('sleep "$wait"', ":")], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}",
                                             "ZEROLAKE_POLL_SECONDS": "0"})
    result.calls = log.read_text().splitlines()
    return script, result


def _verbs(calls):
    """The TPU request, VM and worker group calls in order: 'qr create', 'qr describe', 'vm create NAME',
    'group create NAME', ..."""
    found = []
    for call in calls:
        words = call.split()
        if words[:3] == ["compute", "tpus", "queued-resources"]:
            found.append(f"qr {words[3]}")
        elif words[:3] == ["compute", "instances", "create"]:
            found.append(f"vm create {words[3]}")
        elif words[:4] == ["compute", "instance-groups", "managed", "create"]:
            found.append(f"group create {words[4]}")
    return found


def test_the_tpu_is_queued_before_the_workers_and_waited_for_after_them(tmp_path, capsys):
    script, result = _run(tmp_path, ["--trainer-tpu", "v5litepod-8", "--trainer-tpu-valid-for", "6h"], capsys,
                          states=["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"])
    [create] = creates(script, ("compute", "tpus", "queued-resources", "create"))
    assert {"--node-id=zerolake-trainer", "--runtime-version=v2-alpha-tpuv5-lite", "--accelerator-type=v5litepod-8",
            "--valid-until-duration=6h", "--zone=us-central1-a"} <= set(create)
    assert result.returncode == 0, result.stderr
    verbs = _verbs(result.calls)
    assert verbs[:3] == ["qr describe", "qr create", "group create zerolake-workers"]
    assert verbs[3:] == ["qr describe"] * 3            # polled: waiting, provisioning, active
    assert "the trainer's TPU is ACTIVE" in result.stderr and "not up yet" not in result.stderr


def test_a_request_still_waiting_is_left_queued_and_named_at_the_end(tmp_path, capsys):
    _, result = _run(tmp_path, ["--trainer-tpu", "v5litepod-8", "--trainer-wait-minutes", "0"], capsys,
                     states=["WAITING_FOR_RESOURCES"])
    assert result.returncode == 3
    assert "still WAITING_FOR_RESOURCES after 0 minutes; it stays queued until --trainer-tpu-valid-for (24h)" \
        in result.stderr
    assert "not up yet: zerolake-trainer (queued: WAITING_FOR_RESOURCES)" in result.stderr
    assert "qr delete" not in _verbs(result.calls)     # the request keeps its place in the queue


def test_a_failed_or_expired_request_is_deleted_before_a_new_one(tmp_path, capsys):
    _, result = _run(tmp_path, ["--trainer-tpu", "v5litepod-8"], capsys, queued=True,
                     states=["SUSPENDED", "ACTIVE"])
    verbs = _verbs(result.calls)
    assert verbs[:3] == ["qr describe", "qr delete", "qr create"], verbs
    delete = next(c for c in result.calls if "queued-resources delete" in c)
    assert "--force" in delete.split() and "--quiet" in delete.split()
    assert "earlier TPU request is SUSPENDED" in result.stderr and result.returncode == 0


def test_a_zero_quota_is_one_line_and_the_workers_still_come_up(tmp_path, capsys):
    error = ("ERROR: (gcloud.compute.tpus.queued-resources.create) RESOURCE_EXHAUSTED: Quota limit "
             "'TPUV5sLitepodServingPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 0 in zone us-central1-a.")
    _, result = _run(tmp_path, ["--trainer-tpu", "v5litepod-8"], capsys, create_error=error)
    lines = [line for line in result.stderr.splitlines() if "quota" in line.lower()]
    assert len(lines) == 1 and lines[0].startswith("error: the project has no TPU quota left for v5litepod-8 in "
                                                   "us-central1-a") and "cloud.google.com/tpu/docs/quota" in lines[0]
    assert _verbs(result.calls)[-1] == "group create zerolake-workers"
    assert result.returncode == 3 and "not up yet: zerolake-trainer;" in result.stderr


def test_a_request_that_fails_in_the_queue_says_why(tmp_path, capsys):
    _, result = _run(tmp_path, ["--trainer-tpu", "v5litepod-8"], capsys, states=["ACCEPTED", "FAILED"],
                     reason="Insufficient capacity before the valid-until time")
    assert result.returncode == 3
    assert "TPU request is FAILED: Insufficient capacity before the valid-until time; a rerun of this plan " \
           "deletes it" in result.stderr


def test_a_gpu_trainer_that_cannot_be_had_does_not_stop_the_workers(tmp_path, capsys):
    _, result = _run(tmp_path, ["--trainer-gpu", "nvidia-l4"], capsys, no_gpu=True)
    verbs = _verbs(result.calls)
    assert verbs.count("vm create zerolake-trainer") == 3            # retried, then given up
    assert verbs[-1] == "group create zerolake-workers"
    assert result.returncode == 3 and "the trainer VM zerolake-trainer could not be created" in result.stderr
    assert "not up yet: zerolake-trainer;" in result.stderr


def test_down_deletes_the_queued_request_with_its_tpu(capsys):
    script = plan_text(["down", "--trainer-tpu", "v5litepod-8"] + BASE, capsys)
    [delete] = creates(script, ("compute", "tpus", "queued-resources", "delete"))
    assert delete[4] == "zerolake-trainer" and "--force" in delete and "--zone=us-central1-a" in delete
    assert script.index("tpu-vm delete") < script.index("queued-resources delete")
