"""``python -m cloud.deploy``: the plan for each role and accelerator, checked against the installed gcloud.

* Every plan passes ``bash -n``.
* Every gcloud command in every plan is checked against the installed
  gcloud's own ``--help``: the command path exists and is a command (not a
  group), each flag is documented for it (or is a gcloud-wide flag), a flag
  that takes a value is given one and a switch is not, and a value of a flag
  whose help lists its choices ("X must be one of: ...") is one of them.
  ``gcloud ... --help`` takes ~2.5 s, so each page is cached in pytest's cache
  under the SDK's version (the first run of this file on a machine is the slow one).
* ``--apply`` refuses without gcloud or without an active account, and runs
  the plan through a stand-in gcloud that records its calls.
* ``status`` reads a lake (chunks, LATEST, the trainer's lease) into one table.
* The start-up scripts pass ``bash -n`` and the systemd units pass
  ``systemd-analyze verify``.
* The keeper: the plan creates its two custom roles, grants the list role on
  the project and the start role on each VM it may start, turns it on on
  exactly one always-on VM (or says that none runs), and ``keep-workers.sh``,
  run against a stand-in gcloud that prints a canned instance list, starts
  exactly the stopped workers (and a kept trainer) of its deployment and warns
  about a VM whose role never started.
* Least privilege, zones, order, retries: each role has its own account and
  only its grants; an accelerator absent from its zone is refused at plan time
  and the script asks gcloud again before creating; the follower and trainer
  come before the workers; grants are retried; a worker that cannot be created
  is named and the rest go on; the Dataflow image is built and named.
* The start-up script retries a failed install until it succeeds.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from cloud.deploy import plan as P
from cloud.deploy.config import DeployConfig
from cloud.deploy.status import read_status, table
from cloud.storage import open_storage
from format import codec, layout
from model.lease import LeaseRecord
from testdata.synthetic_games import synthetic_game
from tests.deploy_support import (BASE, GCLOUD, REPO, VM, check_invocation, gcloud_help, gcloud_invocations,
                                  metadata_of, needs_gcloud, plan_text, run_deploy, run_role, stand_in_gcloud)
from tests.deploy_support import creates as _creates

SCENARIOS = {
    # the acceptance example: GPU workers, TPU trainer
    "gpu-workers-tpu-trainer": ["--workers", "8", "--worker-gpu", "nvidia-l4", "--trainer-tpu", "v5litepod-8"],
    "cpu-workers-cpu-trainer": ["--workers", "3", "--trainer-cpu", "--no-spot"],
    "t4-workers-multi-gpu-trainer": ["--workers", "2", "--worker-gpu", "nvidia-tesla-t4", "--worker-gpu-count", "2",
                                     "--trainer-gpu", "nvidia-a100-80gb", "--trainer-gpu-count", "4"],
    "dataflow-shuffle-spot-gpu-trainer": ["--workers", "20", "--worker-gpu", "nvidia-tesla-a100", "--trainer-gpu",
                                          "nvidia-l4", "--trainer-spot", "--worker-args",
                                          "--visits 128 --board-size 19"],
    "v6e-trainer-in-its-zone": ["--workers", "1", "--trainer-tpu", "v6e-8", "--trainer-zone", "us-east5-b",
                                "--worker-zone", "us-central1-b"],
    "forced-dataflow-t4-trainer": ["--workers", "1", "--shuffle-runner", "dataflow", "--trainer-gpu",
                                   "nvidia-tesla-t4"],
    # --no-shuffle: the worker keeper moves to a standard trainer VM, or (TPU trainer) runs nowhere
    "no-shuffle-keeper-on-gpu-trainer": ["--workers", "2", "--no-shuffle", "--trainer-gpu", "nvidia-l4"],
    "no-shuffle-tpu-trainer-no-keeper": ["--workers", "2", "--no-shuffle", "--trainer-tpu", "v4-8",
                                         "--trainer-zone", "us-central2-b"],
}
DOWN_SCENARIOS = {
    "down-all": ["down", "--delete-account"],
    "scale-down-workers": ["down", "--workers-only", "--keep-workers", "4"],
}


# ---- the plans -------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", sorted(SCENARIOS) + sorted(DOWN_SCENARIOS))
def test_every_plan_is_valid_bash(scenario, capsys, tmp_path):
    argv = DOWN_SCENARIOS.get(scenario, ["plan"] + SCENARIOS.get(scenario, [])) + BASE
    script = tmp_path / "plan.sh"
    script.write_text(plan_text(argv, capsys))
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@needs_gcloud
def test_every_gcloud_command_and_flag_is_documented_by_the_installed_gcloud(capsys, gcloud_help):
    problems, checked = [], set()
    for argv in [["plan", *s] for s in SCENARIOS.values()] + list(DOWN_SCENARIOS.values()):
        for words in gcloud_invocations(plan_text(argv + BASE, capsys)):
            key = tuple(words)
            if key not in checked:
                checked.add(key)
                problems += check_invocation(words, gcloud_help)
    assert len(checked) > 20
    assert not problems, "\n".join(problems)


@needs_gcloud
def test_the_checker_catches_an_undocumented_flag_a_missing_value_and_a_bad_choice(gcloud_help):
    good = ["compute", "instances", "create", "vm", "--zone=us-central1-a", "--provisioning-model=SPOT"]
    assert check_invocation(good, gcloud_help) == []
    assert check_invocation(good + ["--no-such-flag=1"], gcloud_help)
    assert check_invocation(["compute", "instances", "create", "vm", "--zone"], gcloud_help)
    assert check_invocation(["compute", "instances", "create", "vm", "--provisioning-model=CHEAP"], gcloud_help)
    assert check_invocation(["compute", "instances", "create", "vm", "--preemptible=yes"], gcloud_help)
    assert check_invocation(["compute", "instances", "launch", "vm"], gcloud_help)
    assert check_invocation(["compute", "instances"], gcloud_help)


def test_invocations_are_found_inside_conditions_and_pipelines():
    script = ("if ! gcloud a b --x=1 >/dev/null 2>&1; then\n  gcloud c d \\\n    --y=2\nfi\n"
              "gcloud e f --z='p q' | while read -r n; do gcloud g \"$n\" --w </dev/null; done\n")
    assert gcloud_invocations(script) == [["a", "b", "--x=1"], ["c", "d", "--y=2"], ["e", "f", "--z=p q"],
                                          ["g", "$n", "--w"]]


def test_the_acceptance_plan_holds_every_part(capsys):
    script = plan_text(["plan"] + SCENARIOS["gpu-workers-tpu-trainer"] + BASE, capsys)
    workers = [w for w in _creates(script, ("compute", "instances", "create")) if "-worker-" in w[3]]
    assert [w[3] for w in workers] == [f"zerolake-worker-{i:03d}" for i in range(8)]
    for words in workers:
        assert {"--provisioning-model=SPOT", "--instance-termination-action=STOP", "--machine-type=g2-standard-8",
                "--maintenance-policy=TERMINATE", "--image-project=deeplearning-platform-release"} <= set(words)
        assert not any(w.startswith("--accelerator") for w in words)     # G2 machines come with their L4
        metadata = next(w for w in words if w.startswith("--metadata="))
        assert "zerolake-accelerator=gpu" in metadata and "install-nvidia-driver=True" in metadata
        assert f"--metadata-from-file=startup-script={P.STARTUP_SCRIPT}" in words
    [tpu] = _creates(script, ("compute", "tpus", "queued-resources", "create"))
    assert "--accelerator-type=v5litepod-8" in tpu and "zerolake-accelerator=tpu" in " ".join(tpu)
    assert "--runtime-version=tpu-vm-tf-2.16.1-pjrt" in tpu and "--node-id=zerolake-trainer" in tpu
    [shuffle] = [w for w in _creates(script, ("compute", "instances", "create")) if w[3] == "zerolake-shuffle"]
    # auto: 8 workers' windows start small, on the follower VM; the large ones later go to Dataflow.
    assert "--image-family=debian-12" in shuffle and "--dataflow-above-positions=1000000" in " ".join(shuffle)
    assert _creates(script, ("storage", "buckets", "create")) and _creates(script, ("iam", "service-accounts",
                                                                                    "create"))
    assert _creates(script, ("storage", "cp"))[0][-2] == "gs://zl-test-bucket/zerolake-deploy/zerolake/zerolake.tar.gz"
    # Section order: bucket and account before anything that uses them, then the roles there is one of, the
    # workers last (a worker's stockout must not hold up the follower or the trainer).
    order = [script.index(marker) for marker in ("buckets create", "service-accounts create", "storage cp",
                                                 "builds submit", "instances create zerolake-shuffle",
                                                 "queued-resources create zerolake-trainer",
                                                 "instances create zerolake-worker-000")]
    assert order == sorted(order)


def test_accelerator_kinds(capsys):
    t4 = plan_text(["plan"] + SCENARIOS["t4-workers-multi-gpu-trainer"] + BASE, capsys)
    creates = {w[3]: w for w in _creates(t4, ("compute", "instances", "create"))}
    assert "--accelerator=type=nvidia-tesla-t4,count=2" in creates["zerolake-worker-000"]   # N1: attached
    assert "--machine-type=a2-ultragpu-4g" in creates["zerolake-trainer"]
    assert "zerolake-processes=8" in " ".join(creates["zerolake-worker-000"])                  # 4 per GPU
    assert not any("SPOT" in w for w in creates["zerolake-trainer"])                            # trainer: standard
    cpu = plan_text(["plan"] + SCENARIOS["cpu-workers-cpu-trainer"] + BASE, capsys)
    creates = {w[3]: w for w in _creates(cpu, ("compute", "instances", "create"))}
    assert "--image-family=debian-12" in creates["zerolake-worker-002"]
    assert not any("SPOT" in w or "nvidia" in w for w in creates["zerolake-worker-002"])         # --no-spot, CPU
    assert "zerolake-accelerator=cpu" in " ".join(creates["zerolake-trainer"])
    assert "tpu.googleapis.com" not in cpu and not _creates(cpu, ("compute", "tpus", "queued-resources", "create"))


def _account(role: str) -> str:
    return f"zerolake-{role}@zl-test-project.iam.gserviceaccount.com"


def _grants(script: str) -> list[tuple[str, str, str, str]]:
    """(scope kind, resource, member, role) of every IAM grant in a plan."""
    found = []
    for words in gcloud_invocations(script):
        if "add-iam-policy-binding" not in words:
            continue
        at = words.index("add-iam-policy-binding")
        flags = dict(w.split("=", 1) for w in words if w.startswith("--") and "=" in w)
        found.append((" ".join(words[:at]), words[at + 1], flags["--member"], flags["--role"]))
    return found


def test_dataflow_shuffle_gets_its_apis_roles_image_and_beam_flags(capsys):
    script = plan_text(["plan"] + SCENARIOS["dataflow-shuffle-spot-gpu-trainer"] + BASE, capsys)
    [shuffle] = [w for w in _creates(script, ("compute", "instances", "create")) if w[3] == "zerolake-shuffle"]
    metadata = next(w for w in shuffle if w.startswith("--metadata="))
    image = "us-central1-docker.pkg.dev/zl-test-project/zerolake-images/dataflow-worker"
    for flag in ("--runner=DataflowRunner", "--region=us-central1", f"--sdk_container_image={image}:current",
                 "--temp_location=gs://zl-test-bucket/zerolake-deploy/zerolake/dataflow-tmp",
                 f"--service_account_email={_account('shuffle')}"):
        assert flag in metadata
    assert "--setup_file" not in script        # Dataflow's workers install nothing at boot
    for api in ("dataflow.googleapis.com", "artifactregistry.googleapis.com", "cloudbuild.googleapis.com"):
        assert api in script
    # The image: a repository, a build from cloud/dataflow/Dockerfile and the sdist, tagged, and readable by the
    # follower's account (whose jobs' workers pull it).
    assert _creates(script, ("artifacts", "repositories", "create"))[0][3] == "zerolake-images"
    [build] = _creates(script, ("builds", "submit"))
    assert "--region=us-central1" in build and any(w.startswith("--config=") for w in build)
    assert f"cp {P.DATAFLOW_DOCKERFILE} " in script and f"{image}:src-$zerolake_digest" in script
    assert [w[-2] for w in _creates(script, ("artifacts", "docker", "tags", "add"))] == [f"{image}:current"]
    grants = _grants(script)
    assert ("artifacts repositories", "zerolake-images", f"serviceAccount:{_account('shuffle')}",
            "roles/artifactregistry.reader") in grants
    assert ("artifacts repositories", "zerolake-images", f"serviceAccount:{_account('builder')}",
            "roles/artifactregistry.writer") in grants
    # Least privilege: Dataflow's project roles go to the follower's account alone, and none is dataflow.admin
    # (which carries storage permissions on every bucket of the project).
    project = {(member, role) for kind, _, member, role in grants if kind == "projects"}
    assert {role for member, role in project if member == f"serviceAccount:{_account('shuffle')}"} >= {
        "roles/dataflow.developer", "roles/compute.viewer", "roles/dataflow.worker"}
    assert not any("dataflow.admin" in role for _, role in project)
    assert {role for member, role in project if member == f"serviceAccount:{_account('worker')}"} == set(P.LOG_ROLES)
    assert ("iam service-accounts", _account("shuffle"), f"serviceAccount:{_account('shuffle')}",
            "roles/iam.serviceAccountUser") in grants
    worker = _creates(script, ("compute", "instances", "create"))[-1]
    assert "zerolake-args=--visits 128 --board-size 19" in " ".join(worker)
    assert f"--service-account={_account('worker')}" in worker
    # --shuffle-runner auto (the default): the follower chooses per window, by its size.
    assert "--dataflow-above-positions=1000000 --runner=DataflowRunner" in metadata
    assert "up to 1,000,000 positions, larger ones on Dataflow" in script
    # local: never Dataflow, no image; dataflow: every window there.
    local = plan_text(["plan", "--workers", "2", "--shuffle-runner", "local"] + BASE, capsys)
    assert "DataflowRunner" not in local and "dataflow.googleapis.com" not in local and "builds submit" not in local
    forced = plan_text(["plan", "--dataflow-above-positions", "5"] + SCENARIOS["forced-dataflow-t4-trainer"] + BASE,
                       capsys)
    assert "--runner=DataflowRunner" in forced and "--dataflow-above-positions" not in forced


def test_each_role_runs_as_its_own_account_with_only_its_grants(capsys):
    script = plan_text(["plan"] + SCENARIOS["gpu-workers-tpu-trainer"] + BASE, capsys)
    vms = {w[3]: w for w in _creates(script, ("compute", "instances", "create"))}
    assert f"--service-account={_account('worker')}" in vms["zerolake-worker-000"]
    assert f"--service-account={_account('shuffle')}" in vms["zerolake-shuffle"]
    [tpu] = _creates(script, ("compute", "tpus", "queued-resources", "create"))
    assert f"--service-account={_account('trainer')}" in tpu
    by_member: dict = {}
    for kind, resource, who, role in _grants(script):
        by_member.setdefault(who.removeprefix("serviceAccount:"), set()).add((kind, role))
    bucket = {("storage buckets", role) for role in P.BUCKET_ROLES}
    logs = {("projects", role) for role in P.LOG_ROLES}
    assert by_member[_account("worker")] == bucket | logs
    assert by_member[_account("trainer")] == bucket | logs
    # The follower also runs the keeper: listing on the project, starting on each worker VM, actAs the workers.
    keeper = by_member[_account("shuffle")] - bucket - logs
    assert keeper - {("projects", role) for role in P.DATAFLOW_PROJECT_ROLES} - {
        ("iam service-accounts", "roles/iam.serviceAccountUser"),
        ("artifacts repositories", "roles/artifactregistry.reader")} == {
        ("projects", KEEPER_ROLE.format("list")), ("compute instances", KEEPER_ROLE.format("start"))}
    # Every grant is retried: an account just created takes a while to be seen by IAM.
    grant_lines = [line for line in script.splitlines() if "add-iam-policy-binding" in line]
    assert grant_lines and all(line.lstrip().startswith(f"retry {P.GRANT_TRIES} gcloud") for line in grant_lines)
    # ... and each new account is waited for before its first grant.
    for role in ("worker", "shuffle", "trainer"):
        wait = script.index(f"retry {P.GRANT_TRIES} gcloud iam service-accounts describe {_account(role)}")
        assert script.index(f"service-accounts create zerolake-{role}") < wait < script.index(
            f"--member=serviceAccount:{_account(role)}")


@pytest.mark.parametrize("argv, field, words", [
    (["--trainer-tpu", "v6e-8"], "--zone", ["us-central1-a has no v6e-8", "us-east5-b", "--no-check-zones"]),
    (["--trainer-tpu", "v4-8", "--trainer-zone", "us-central1-a"], "--trainer-zone",
     ["us-central1-a has no v4-8", "us-central2-b"]),
    (["--trainer-tpu", "v4-8", "--trainer-zone", "us-central2-b", "--trainer-spot"], "--trainer-spot",
     ["cannot be started again"]),
    (["--trainer-tpu", "v9x-8", "--trainer-zone", "us-central2-b"], "--trainer-tpu",
     ["no TensorFlow software version is documented", "https://cloud.google.com/tpu/docs/runtimes"]),
    (["--trainer-tpu", "v5litepod-16"], "--trainer-tpu", ["multi-host", "v5litepod-8"]),
    (["--trainer-gpu", "nvidia-l4", "--trainer-spot", "--no-shuffle"], "--trainer-spot", ["keeper"]),
    (["--worker-zone", "central"], "--worker-zone", ["is not a zone"]),
])
def test_an_accelerator_the_zone_lacks_is_refused_before_anything_is_printed(argv, field, words, capsys):
    code, out, err = run_deploy(["plan"] + BASE + argv, capsys)
    assert code == 2 and out == "" and "Traceback" not in err, err
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert f"{field}: " in line and all(word in line for word in words), line


def _apply_with_listing(tmp_path, script: str, listing_output: str, listing_status: int):
    """Run a plan's script against a stand-in gcloud whose accelerator listing prints ``listing_output``
    and exits ``listing_status``; nothing exists yet (describe fails).  The result gains ``calls``."""
    fake = tmp_path / f"bin-{listing_status}-{len(listing_output)}" / "gcloud"
    fake.parent.mkdir()
    fake.write_text("#!/usr/bin/env bash\n"
                    f"if [[ $* == *accelerator-types* ]]; then printf '{listing_output}'; exit {listing_status}; fi\n"
                    "[[ $* == *describe* ]] && exit 1\n"
                    'echo "$*" >> "$(dirname "$0")/calls"\n')
    fake.chmod(0o755)
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                            env={**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"})
    result.calls = (fake.parent / "calls").read_text() if (fake.parent / "calls").exists() else ""
    return result


def test_no_check_zones_trusts_the_zone_and_the_script_still_asks_gcloud(tmp_path, capsys):
    script = plan_text(["plan", "--only", "trainer", "--trainer-tpu", "v6e-8", "--no-check-zones",
                        "--trainer-wait-minutes", "0"] + BASE, capsys)
    [listing] = _creates(script, ("compute", "tpus", "accelerator-types", "list"))
    assert "--zone=us-central1-a" in listing
    assert script.index("accelerator-types list") < script.index("queued-resources create")

    absent = _apply_with_listing(tmp_path, script, "v5litepod-8\n", 0)
    assert absent.returncode == 2 and "zone us-central1-a offers no v6e-8 today" in absent.stderr
    assert "queued-resources create" not in absent.calls
    present = _apply_with_listing(tmp_path, script, "v6e-8\n", 0)
    assert "queued-resources create zerolake-trainer" in present.calls
    unknown = _apply_with_listing(tmp_path, script, "", 1)      # the listing itself failed: say so, and create anyway
    assert "could not list the accelerators of us-central1-a" in unknown.stderr
    assert "queued-resources create zerolake-trainer" in unknown.calls


def test_a_gpu_type_is_checked_live_in_its_zone_before_its_vm_is_created(tmp_path, capsys):
    """GPU types have no dated table (cloud.deploy.zones.GPU_ZONES is empty: Google offers each in dozens
    of zones), so the script's live check is what stops a GPU VM in a zone without that GPU."""
    script = plan_text(["plan", "--only", "trainer", "--trainer-gpu", "nvidia-l4"] + BASE, capsys)
    [listing] = _creates(script, ("compute", "accelerator-types", "list"))
    assert any("zone:us-central1-a" in word and "nvidia-l4" in word for word in listing), listing
    assert script.index("accelerator-types list") < script.index("instances create")

    absent = _apply_with_listing(tmp_path, script, "nvidia-tesla-t4\n", 0)
    assert absent.returncode == 2 and "zone us-central1-a offers no nvidia-l4 today" in absent.stderr
    assert "instances create" not in absent.calls
    present = _apply_with_listing(tmp_path, script, "nvidia-l4\n", 0)
    assert present.returncode == 0 and "instances create zerolake-trainer" in present.calls


def test_a_worker_that_cannot_be_created_is_named_and_the_others_still_come_up(tmp_path, capsys):
    script = plan_text(["plan", "--only", "workers", "--workers", "3"] + BASE, capsys)
    folder, log = stand_in_gcloud(tmp_path / "bin", "[[ $* == *describe* ]] && exit 1\n"
                                   "[[ $* == *'create zerolake-worker-001'* ]] && "
                                   "{ echo 'ZONE_RESOURCE_POOL_EXHAUSTED' >&2; exit 1; }\nexit 0\n")
    result = subprocess.run(["bash", "-c", script.replace("sleep \"$wait\"", ":")], capture_output=True, text=True,
                            env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"})
    calls = log.read_text().splitlines()
    creates = [c.split()[3] for c in calls if " create " in c]
    assert creates == ["zerolake-worker-000"] + ["zerolake-worker-001"] * P.CREATE_TRIES + ["zerolake-worker-002"]
    granted = [c.split()[3] for c in calls if "add-iam-policy-binding" in c]
    assert granted == ["zerolake-worker-000", "zerolake-worker-002"]      # the keeper may start those that exist
    assert result.returncode == 3
    assert "could not be created in us-central1-a" in result.stderr and " zerolake-worker-001;" in result.stderr


def test_the_follower_parses_the_plans_shuffle_flags_and_chooses_per_window(capsys):
    """The plan's shuffle args, as startup.sh passes them, give pipeline.shuffle --follow its per-window choice."""
    import shlex

    from cloud.deploy.config import DeployConfig
    from cloud.deploy.plan import shuffle_runner_args
    from pipeline import follow as F
    from pipeline.shuffle import build_parser

    config = DeployConfig(project="zl-test-project", root="gs://zl-test-bucket/run1", workers=2,
                          dataflow_above_positions=300_000)
    args, beam_args = build_parser().parse_known_args(["--root", config.root, "--follow",
                                                       *shlex.split(shuffle_runner_args(config))])
    assert args.dataflow_above_positions == 300_000 and F.names_dataflow(beam_args)
    code, _, err = run_deploy(["plan", "--dataflow-above-positions", "0"] + BASE, capsys)
    assert code == 2 and "--dataflow-above-positions: must be >= 1, got 0" in err


def test_only_prints_the_sections_asked_for(capsys):
    script = plan_text(["plan", "--only", "workers", "--workers", "2"] + BASE, capsys)
    assert [w[:3] for w in gcloud_invocations(script)] == [["compute", "instances", "describe"],
                                                           ["compute", "instances", "create"],
                                                           ["compute", "instances", "add-iam-policy-binding"]] * 2
    code, _, err = run_deploy(["plan", "--only", "image"] + BASE, capsys)
    assert code == 2 and "--only" in err and "package" in err


def test_down_selects_by_label_and_keeps_the_bucket(capsys):
    script = plan_text(DOWN_SCENARIOS["down-all"] + BASE, capsys)
    assert "buckets delete" not in script and "storage rm" not in script
    assert "labels.zerolake-deployment=zerolake" in script
    assert _creates(script, ("iam", "service-accounts", "delete"))
    scale = plan_text(DOWN_SCENARIOS["scale-down-workers"] + BASE, capsys)
    assert ">= 4" in scale and "tpu-vm" not in scale


def test_scale_down_deletes_only_workers_from_the_index_up(tmp_path, capsys):
    """Run the scale-down plan with a stand-in gcloud that lists five workers, and one of another deployment
    (zerolake-b) that a word-matching label filter would let through."""
    folder, log = stand_in_gcloud(tmp_path / "bin", "if [[ $1 == compute && $3 == list ]]; then\n"
                                   "  for i in 000 001 003 004 009; do echo \"zerolake-worker-$i us-central1-a\"; done\n"
                                   "  echo 'zerolake-b-worker-007 us-central1-a'\nfi\n")
    script = tmp_path / "down.sh"
    script.write_text(plan_text(DOWN_SCENARIOS["scale-down-workers"] + BASE, capsys))
    subprocess.run(["bash", str(script)], check=True, env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"})
    deleted = [line.split()[3] for line in log.read_text().splitlines() if " delete " in line]
    assert deleted == ["zerolake-worker-004", "zerolake-worker-009"]


def test_nothing_secret_is_in_any_plan(capsys):
    for argv in [["plan", *s] for s in SCENARIOS.values()] + list(DOWN_SCENARIOS.values()):
        script = plan_text(argv + BASE, capsys)
        for secret in ("keys create", "private_key", "GOOGLE_APPLICATION_CREDENTIALS", "access_token", "password",
                       "print-access-token"):
            assert secret not in script, (argv, secret)


@pytest.mark.parametrize("argv, flag", [
    (["--worker-gpu", "nvidia-gtx-1080"], "--worker-gpu"),
    (["--root", "/local/lake"], "--root"),
    (["--project", "X"], "--project"),
    (["--trainer-tpu", "v5litepod-8", "--trainer-gpu", "nvidia-l4"], "--trainer-tpu"),
    (["--worker-gpu", "nvidia-l4", "--worker-gpu-count", "3"], "--worker-gpu-count"),
    (["--worker-args", "--visits 1,2"], "--worker-args"),
    (["--only", "workers,nonsense"], "--only"),
])
def test_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    code, out, err = run_deploy(["plan"] + BASE + argv, capsys)
    assert code == 2 and flag in err and "Traceback" not in err and out == ""


def test_apply_refuses_without_gcloud_or_without_an_account(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))          # no gcloud on PATH
    code, out, err = run_deploy(["plan", "--workers", "1", "--apply"] + BASE, capsys)
    assert code == 2 and "`gcloud` is not on PATH" in err and out == ""
    fake = tmp_path / "gcloud"
    fake.write_text("#!/bin/sh\nexit 0\n")             # installed, nobody logged in
    fake.chmod(0o755)
    code, out, err = run_deploy(["plan", "--workers", "1", "--apply"] + BASE, capsys)
    assert code == 2 and "no active account" in err and "gcloud auth login" in err


def test_apply_runs_the_plan_through_gcloud(tmp_path, capsys, monkeypatch):
    """A stand-in gcloud: logged in, every describe fails (nothing exists), so each create runs."""
    log = tmp_path / "calls"
    fake = tmp_path / "bin" / "gcloud"
    fake.parent.mkdir()
    fake.write_text("#!/usr/bin/env bash\n"
                    "if [[ $1 == auth ]]; then echo someone@example.com; exit 0; fi\n"
                    f"echo \"$*\" >> {log}\n"
                    "[[ $* == *accelerator-types* ]] && echo v4-8\n"
                    "[[ $* == *describe* ]] && exit 1\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    argv = ["plan", "--only", "workers,trainer", "--workers", "2", "--trainer-tpu", "v4-8", "--trainer-zone",
            "us-central2-b", "--trainer-wait-minutes", "0", "--apply"] + BASE
    code, _, err = run_deploy(argv, capsys)
    # The stand-in never reports the queued TPU ACTIVE: the plan names it and ends with status 3.
    assert code == 3, err          # (the script's own stderr is the terminal's: tests/test_deploy_capacity.py reads it)
    calls = log.read_text().splitlines()
    assert [c.split()[:4] for c in calls if "create" in c] == [          # the trainer first, then the workers
        ["compute", "tpus", "queued-resources", "create"],
        ["compute", "instances", "create", "zerolake-worker-000"],
        ["compute", "instances", "create", "zerolake-worker-001"]]


# ---- status -----------------------------------------------------------------------------

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


# ---- the VM files -----------------------------------------------------------------------

@pytest.mark.parametrize("script", ["install.sh", "startup.sh", "run-role.sh", "keep-workers.sh", "ship-logs.sh"])
def test_vm_scripts_are_valid_bash_and_executable(script):
    path = VM / script
    assert os.access(path, os.X_OK), f"{path} is not executable"
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("accelerator, processes, threads", [
    ("cpu", "2", max(1, len(os.sched_getaffinity(0)) // 2)), ("cpu", "64", 1), ("gpu", "2", None)])
def test_cpu_worker_processes_share_the_cores_between_their_networks(tmp_path, accelerator, processes, threads):
    """run-role.sh gives each CPU worker process cores / processes threads for its int8 network."""
    argv = run_role(tmp_path, "worker", accelerator=accelerator, processes=processes)
    assert argv[:2] == ["-m", "selfplay.worker"] and argv[-2:] == ["--visits", "8"]
    if threads is None:
        assert "--inference-threads" not in argv
    else:
        assert argv[argv.index("--inference-threads") + 1] == str(threads)


ROLE_UNITS = ["zerolake-shuffle.service", "zerolake-trainer.service", "zerolake-worker@.service"]
KEEPER_UNITS = ["zerolake-keeper.service", "zerolake-keeper.timer"]
LOGGING_UNIT = "zerolake-logging.service"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_units_verify(tmp_path):
    """systemd-analyze verify of every unit, the keeper's timer and service included, with ExecStart pointed
    at this checkout's scripts (verify checks that the command exists; on a VM it is /opt/zerolake/src/...)."""
    assert sorted(p.name for p in (VM / "systemd").iterdir()) == sorted(ROLE_UNITS + KEEPER_UNITS + [LOGGING_UNIT])
    units = []
    for unit in sorted((VM / "systemd").iterdir()):
        text = unit.read_text()
        if unit.name in ROLE_UNITS:
            assert "Restart=always" in text and "StandardOutput=journal" in text and "KillSignal=SIGTERM" in text
            assert "ExecStart=/opt/zerolake/src/cloud/vm/run-role.sh" in text
        elif unit.name == LOGGING_UNIT:      # retried until the Ops Agent installs, never holding up a role
            assert "Restart=on-failure" in text and "RestartSec=120" in text and "StartLimitIntervalSec=0" in text
            assert "ExecStart=/opt/zerolake/src/cloud/vm/ship-logs.sh ${ZEROLAKE_LOGGING}\n" in text
        elif unit.suffix == ".service":      # the keeper: one pass per timer tick, to the journal
            assert "Type=oneshot" in text and "StandardOutput=journal" in text
            assert not re.search(r"^\[Install\]", text, re.M)      # only the timer starts it
            assert "ExecStart=/opt/zerolake/src/cloud/vm/keep-workers.sh\n" in text
        else:
            assert re.search(r"^OnUnitActiveSec=2min$", text, re.M) and "WantedBy=timers.target" in text
        text = text.replace("/opt/zerolake/src/cloud/vm/", f"{VM}/")
        name = unit.name.replace("@.service", "@0.service")
        (tmp_path / name).write_text(text)
        units.append(name)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", *units], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), \
        result.stdout + result.stderr


def test_the_worker_stops_within_the_spot_notice():
    """The worker unit's stop timeout fits in the ~30 s a spot VM gets after its preemption notice."""
    text = (VM / "systemd" / "zerolake-worker@.service").read_text()
    timeout = int(re.search(r"^TimeoutStopSec=(\d+)$", text, re.M).group(1))
    assert 0 < timeout < 30 and "KillMode=mixed" in text


# ---- the keeper ------------------------------------------------------------------------------

KEEPER_SA = "zerolake-shuffle@zl-test-project.iam.gserviceaccount.com"
KEEPER_ROLE = "projects/zl-test-project/roles/zerolake_keeper_{}_zerolake"


def test_the_plan_points_at_files_that_exist():
    assert P.STARTUP_SCRIPT.exists() and (REPO / "Dockerfile").exists() and P.DATAFLOW_DOCKERFILE.exists()
    assert "cloud/vm/install.sh" in (REPO / "Dockerfile").read_text()
    assert "cloud/vm/install.sh" in P.STARTUP_SCRIPT.read_text()
    assert "cloud/vm/install.sh --system" in P.DATAFLOW_DOCKERFILE.read_text()
    json.dumps(dataclasses.asdict(DeployConfig(project="zl-test-project", root="gs://zl-test-bucket/r")))
    assert sys.executable


def test_the_image_is_built_in_two_stages_and_runs_unprivileged_with_the_state_on_a_volume():
    """The Dockerfile, read as text (no container engine runs here): the compilers stay in the build stage."""
    text = (REPO / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) == 2 and stages[0].split()[2] == "build"
    final = stages[1]
    assert "install.sh" not in final and "apt-get" not in final          # nothing compiled or installed there
    assert "COPY --from=build /opt/zerolake /opt/zerolake" in final
    user = re.search(r"^USER (\S+)$", final, re.M)
    assert user and user.group(1) not in ("root", "0")
    assert re.search(r"^VOLUME /var/lib/zerolake$", final, re.M)
    assert stages[0].split()[0] == final.split()[0]       # one base: the venv's interpreter path holds in both
    assert "GKE" not in text



def _setup_literal(name: str):
    """A literal assigned at the top of setup.py (read, not run: running it would build the package)."""
    import ast
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == name for t in node.targets):
            if isinstance(node.value, ast.List):     # INSTALL_REQUIRES splices in the TensorFlow flavour
                return [ast.literal_eval(item) for item in node.value.elts if not isinstance(item, ast.Starred)]
            return ast.literal_eval(node.value)
    raise AssertionError(f"setup.py assigns no {name}")


def _pins_for(python_version: str) -> dict[str, str]:
    """constraints.txt as pip reads it under one interpreter: canonical name -> pinned version."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    pins: dict[str, str] = {}
    for line in (VM / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        if requirement.marker and not requirement.marker.evaluate({"python_version": python_version}):
            continue
        name = canonicalize_name(requirement.name)
        assert name not in pins, f"constraints.txt pins {name} twice for Python {python_version}"
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"constraints.txt: {line!r} is not an exact pin"
        pins[name] = spec.version
    return pins


@pytest.mark.parametrize("python_version", ["3.10", "3.11"])
def test_every_package_the_vms_install_is_pinned_for_both_image_interpreters(python_version):
    # Python 3.10: Ubuntu 22.04, the Deep Learning VM and TPU VM images; 3.11: Debian 12, the Docker
    # images.  A package left unpinned for one of them installs whatever PyPI has that day.
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    pins = _pins_for(python_version)
    wanted = [Requirement(r) for r in _setup_literal("INSTALL_REQUIRES")]
    wanted += [Requirement(r) for flavour in ("cpu", "gpu") for r in _setup_literal("TENSORFLOW_BY_ACCELERATOR")[flavour]]
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"cloud/vm/constraints.txt pins no {name} for Python {python_version}"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} breaks setup.py's {requirement}"
    # The lines written for 3.10 name releases that still support it (each was resolved against PyPI
    # for 3.10, see the file's header); these three are the ones that dropped 3.10.
    if python_version == "3.10":
        assert pins["tensorflow"].startswith("2.20.") and pins["numpy"].startswith("2.2.")
        assert pins["matplotlib"].startswith("3.10.")


def test_the_tpu_flavour_pins_exact_versions():
    # TPU VMs install tensorflow-tpu, libtpu and Keras from setup.py (constraints.txt leaves them out):
    # each must be one exact release, or a TPU VM installs whatever PyPI has the day it boots.
    from packaging.requirements import Requirement
    for requirement in map(Requirement, _setup_literal("TENSORFLOW_BY_ACCELERATOR")["tpu"]):
        specifiers = list(requirement.specifier)
        assert len(specifiers) == 1 and specifiers[0].operator == "==", f"setup.py's {requirement} is not exact"


def test_the_dataflow_image_is_beams_own_for_the_pinned_beam_and_python():
    text = P.DATAFLOW_DOCKERFILE.read_text()
    python = re.search(r"^FROM apache/beam_python(3\.[0-9]+)_sdk:\$\{BEAM_VERSION\}$", text, re.M)
    assert python, "cloud/dataflow/Dockerfile does not start from Beam's own Python SDK image"
    beam = _pins_for(python.group(1)).get("apache-beam")
    assert beam, f"cloud/vm/constraints.txt pins no apache-beam for Python {python.group(1)}"
    assert f"ARG BEAM_VERSION={beam}" in text
    assert "ENTRYPOINT" not in text            # Beam's boot stays the entrypoint Dataflow starts


def test_the_plan_creates_the_keepers_roles_grants_them_and_turns_it_on_on_the_follower(capsys):
    script = plan_text(["plan", "--shuffle-runner", "local"] + SCENARIOS["gpu-workers-tpu-trainer"] + BASE, capsys)
    creates = {w[3]: w for w in _creates(script, ("iam", "roles", "create"))}
    assert set(creates) == {"zerolake_keeper_list_zerolake", "zerolake_keeper_start_zerolake"}
    assert f"--permissions={','.join(P.KEEPER_LIST_PERMISSIONS)}" in creates["zerolake_keeper_list_zerolake"]
    assert f"--permissions={','.join(P.KEEPER_START_PERMISSIONS)}" in creates["zerolake_keeper_start_zerolake"]
    assert "compute.instances.start" in P.KEEPER_START_PERMISSIONS
    # the project-wide role only reads; starting is granted VM by VM
    assert all(p.endswith((".list", ".get")) for p in P.KEEPER_LIST_PERMISSIONS)
    every = P.KEEPER_LIST_PERMISSIONS + P.KEEPER_START_PERMISSIONS
    assert not any(p.endswith((".create", ".delete", ".setMetadata", ".setIamPolicy")) for p in every)
    # guarded like every create: rerunning the plan skips it
    assert "if ! gcloud iam roles describe zerolake_keeper_list_zerolake --project=zl-test-project" in script
    grants = _grants(script)
    assert ("projects", "zl-test-project", f"serviceAccount:{KEEPER_SA}", KEEPER_ROLE.format("list")) in grants
    started = [resource for kind, resource, who, role in grants if role == KEEPER_ROLE.format("start")]
    assert started == [f"zerolake-worker-{i:03d}" for i in range(8)]          # each worker VM, nothing else
    # actAs on the workers' account, although this plan (--shuffle-runner local) has no Dataflow
    assert ("iam service-accounts", _account("worker"), f"serviceAccount:{KEEPER_SA}",
            "roles/iam.serviceAccountUser") in grants
    assert script.index("roles create") < script.index(KEEPER_ROLE.format("list")) < script.index("instances create")
    metadata = metadata_of(script)
    keepers = [name for name, entries in metadata.items() if "zerolake-keeper=on" in entries]
    assert keepers == ["zerolake-shuffle"]
    assert "zerolake-deployment=zerolake,zerolake-project=zl-test-project,zerolake-keep-trainer=off" in \
        metadata["zerolake-shuffle"]
    assert all("enable-guest-attributes=TRUE" in metadata[f"zerolake-worker-{i:03d}"] for i in range(8))
    assert "it also runs the keeper" in script and "no worker keeper" not in script


def test_a_spot_gpu_trainer_is_kept_too(capsys):
    script = plan_text(["plan"] + SCENARIOS["dataflow-shuffle-spot-gpu-trainer"] + BASE, capsys)
    [trainer] = [w for w in _creates(script, ("compute", "instances", "create")) if w[3] == "zerolake-trainer"]
    assert "--provisioning-model=SPOT" in trainer and "--instance-termination-action=STOP" in trainer
    assert "zerolake-keep-trainer=on" in metadata_of(script)["zerolake-shuffle"]
    grants = _grants(script)
    assert ("compute instances", "zerolake-trainer", f"serviceAccount:{KEEPER_SA}", KEEPER_ROLE.format("start")) in grants
    assert ("iam service-accounts", _account("trainer"), f"serviceAccount:{KEEPER_SA}",
            "roles/iam.serviceAccountUser") in grants
    assert "spot: the keeper starts it again after a preemption" in script


def test_without_a_follower_the_keeper_runs_on_a_standard_trainer_vm_or_the_plan_says_none_does(capsys):
    gpu = plan_text(["plan"] + SCENARIOS["no-shuffle-keeper-on-gpu-trainer"] + BASE, capsys)
    keepers = [name for name, entries in metadata_of(gpu).items() if "zerolake-keeper=on" in entries]
    assert keepers == ["zerolake-trainer"] and _creates(gpu, ("iam", "roles", "create"))
    trainer_sa = f"serviceAccount:{_account('trainer')}"
    assert ("projects", "zl-test-project", trainer_sa, KEEPER_ROLE.format("list")) in _grants(gpu)
    assert "roles/dataflow" not in gpu
    script = plan_text(["plan"] + SCENARIOS["no-shuffle-tpu-trainer-no-keeper"] + BASE, capsys)
    assert not any("zerolake-keeper=on" in e for e in metadata_of(script).values())
    assert not _creates(script, ("iam", "roles", "create")) and "zerolake_keeper" not in script
    assert not [g for g in _grants(script) if g[3] == "roles/iam.serviceAccountUser"]
    assert "# no worker keeper: with --no-shuffle" in script       # said in the plan ...
    result = subprocess.run(["bash", "-c", script.split("# no worker keeper")[1].split("\n")[1]],
                            capture_output=True, text=True)
    assert result.returncode == 0 and result.stderr.startswith("note: no worker keeper")   # ... and when run


def test_down_removes_the_keepers_grant_first_and_keeps_the_roles(tmp_path, capsys):
    script = plan_text(DOWN_SCENARIOS["down-all"] + BASE, capsys)
    removes = [w for w in gcloud_invocations(script) if w[:2] == ["projects", "remove-iam-policy-binding"]]
    assert removes == [["projects", "remove-iam-policy-binding", "zl-test-project",
                        f"--member=serviceAccount:{_account(host)}", f"--role={KEEPER_ROLE.format('list')}",
                        "--condition=None", "--format=none"] for host in ("shuffle", "trainer")]
    assert script.index("remove-iam-policy-binding") < script.index("instances list")
    assert "roles delete" not in script
    assert "remove-iam-policy-binding" not in plan_text(DOWN_SCENARIOS["scale-down-workers"] + BASE, capsys)
    deleted = [w[3] for w in _creates(script, ("iam", "service-accounts", "delete"))]
    assert deleted == [_account(role) for role in ("worker", "shuffle", "trainer", "builder")]
    # rerunnable: a grant is removed only where get-iam-policy shows it, an account deleted only if it is there
    for bound in (True, False):
        folder, log = stand_in_gcloud(
            tmp_path / f"bin-{bound}",
            (f"[[ $2 == get-iam-policy && $* == *zerolake-shuffle@* ]] && echo {KEEPER_ROLE.format('list')}\n"
             if bound else "[[ $3 == describe ]] && exit 1\n") + "exit 0\n")
        subprocess.run(["bash", "-c", script], check=True, env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"})
        calls = log.read_text().splitlines()
        assert len([line for line in calls if "remove-iam-policy-binding" in line]) == int(bound)
        assert len([line for line in calls if "service-accounts delete" in line]) == (4 if bound else 0)


# A canned `gcloud compute instances list`: name, zone, status, boot time, and (not printed) the deployment and
# role labels.  The stand-in prints the rows whatever --filter says, so the keeper's own check is what is tested.
LONG_AGO = "2026-01-01T00:00:00.000-08:00"
CANNED_INSTANCES = [
    ("zerolake-worker-000", "us-central1-a", "RUNNING", LONG_AGO),
    ("zerolake-worker-001", "us-central1-a", "TERMINATED", LONG_AGO),
    ("zerolake-worker-002", "us-east1-b", "TERMINATED", LONG_AGO),
    ("zerolake-worker-003", "us-central1-a", "STOPPING", LONG_AGO),
    ("zerolake-worker-004", "us-central1-a", "TERMINATED", LONG_AGO),
    ("zerolake-worker-005", "us-central1-a", "RUNNING", LONG_AGO),        # its role never started
    ("zerolake-worker-006", "us-central1-a", "RUNNING", "{now}"),         # just booted: within the grace
    ("zerolake-shuffle", "us-central1-a", "TERMINATED", LONG_AGO),
    ("zerolake-trainer", "us-central1-a", "TERMINATED", LONG_AGO),
    ("zerolake-b-worker-005", "us-central1-a", "TERMINATED", LONG_AGO),
    ("other-vm", "us-central1-a", "TERMINATED", LONG_AGO),
]
STOPPED_WORKERS = {"us-central1-a": ["zerolake-worker-001", "zerolake-worker-004"],
                   "us-east1-b": ["zerolake-worker-002"]}
GUEST_STATES = {"zerolake-worker-000": "running", "zerolake-worker-005": "install-failed"}


def _fake_gcloud(tmp_path, *, start_fails: bool = False) -> tuple[pathlib.Path, pathlib.Path]:
    """A stand-in gcloud that records each call's exact words (0x1f-separated, one call a line)."""
    log = tmp_path / "calls"
    fake = tmp_path / "bin" / "gcloud"
    fake.parent.mkdir(exist_ok=True)
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    rows = "\n".join("\t".join(row).replace("{now}", now) for row in CANNED_INSTANCES)
    states = "".join(f"[[ $4 == {name} ]] && echo {state}\n" for name, state in GUEST_STATES.items())
    fake.write_text("#!/usr/bin/env bash\n"
                    f"( IFS=$'\\x1f'; echo \"$*\" ) >> {log}\n"
                    f"if [[ $1 == compute && $3 == list ]]; then printf '%s\\n' {shlex.quote(rows)}; exit 0; fi\n"
                    f"if [[ $3 == get-guest-attributes ]]; then\n{states}exit 0\nfi\n"
                    f"if [[ $3 == start ]]; then exit {1 if start_fails else 0}; fi\n"
                    "exit 3\n")
    fake.chmod(0o755)
    return fake, log


def _keep_workers(fake: pathlib.Path, *args, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}",
                   "ZEROLAKE_DEPLOYMENT": "zerolake", "ZEROLAKE_PROJECT": "zl-test-project",
                   "ZEROLAKE_STATE": str(fake.parent.parent / "state"), **env}
    return subprocess.run([str(VM / "keep-workers.sh"), *args], capture_output=True, text=True, env=environment,
                          timeout=60)


def _calls(log: pathlib.Path) -> list[list[str]]:
    return [line.split("\x1f") for line in log.read_text().splitlines()] if log.exists() else []


def test_the_keeper_starts_exactly_the_stopped_workers_of_its_deployment(tmp_path, request):
    fake, log = _fake_gcloud(tmp_path)
    result = _keep_workers(fake)
    assert result.returncode == 0, result.stderr
    calls = _calls(log)
    [listing] = [c for c in calls if c[2] == "list"]
    config = DeployConfig(project="zl-test-project", root="gs://zl-test-bucket/run1")
    # the same label selection as the plan's `down`, narrowed to the roles it keeps
    assert f"--filter={P.deployment_filter(config)} AND (labels.zerolake-role=worker OR " \
           "labels.zerolake-role=trainer)" in listing
    assert "--project=zl-test-project" in listing
    starts = [c for c in calls if c[2] == "start"]
    assert starts == [["compute", "instances", "start", *names, f"--zone={zone}", "--project=zl-test-project",
                       "--quiet"] for zone, names in sorted(STOPPED_WORKERS.items())]
    assert "started 2 stopped VM(s) in us-central1-a: zerolake-worker-001 zerolake-worker-004" in result.stdout
    for other in ("zerolake-b-worker-005", "zerolake-shuffle", "zerolake-trainer", "other-vm"):
        assert f"left alone: {other}" in result.stdout
    if GCLOUD:     # and each call, as made, is one the installed gcloud documents
        help_text = request.getfixturevalue("gcloud_help")
        assert [p for c in calls for p in check_invocation(c, help_text)] == []


def test_the_keeper_starts_a_kept_trainer_and_never_the_follower(tmp_path):
    fake, log = _fake_gcloud(tmp_path)
    result = _keep_workers(fake, ZEROLAKE_KEEP_TRAINER="on")
    assert result.returncode == 0, result.stderr
    starts = [c for c in _calls(log) if c[2] == "start"]
    assert starts[0][3:6] == ["zerolake-worker-001", "zerolake-worker-004", "zerolake-trainer"]
    assert "left alone: zerolake-shuffle" in result.stdout


def test_the_keeper_warns_about_a_vm_whose_role_never_started(tmp_path):
    fake, log = _fake_gcloud(tmp_path)
    result = _keep_workers(fake)
    warnings = [line for line in result.stdout.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "zerolake-worker-005 has been up" in warnings[0]
    assert "its start-up script reports: install-failed" in warnings[0]
    assert 'labels."compute.googleapis.com/resource_name"="zerolake-worker-005"' in warnings[0]
    asked = [c[3] for c in _calls(log) if c[2] == "get-guest-attributes"]
    assert asked == ["zerolake-worker-000", "zerolake-worker-005"]          # not the one within its grace
    # A boot seen running is remembered: the next pass asks only about the one still failing.
    log.unlink()
    _keep_workers(fake)
    assert [c[3] for c in _calls(log) if c[2] == "get-guest-attributes"] == ["zerolake-worker-005"]


def test_the_keepers_dry_run_lists_but_starts_nothing(tmp_path):
    fake, log = _fake_gcloud(tmp_path)
    result = _keep_workers(fake, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "start" not in [c[2] for c in _calls(log)]
    would = [line.split("would run: ")[1].split() for line in result.stdout.splitlines() if "would run: " in line]
    assert [w[4:-3] for w in would] == [names for _, names in sorted(STOPPED_WORKERS.items())]


def test_the_keeper_reports_a_failed_start_and_a_missing_gcloud(tmp_path):
    fake, log = _fake_gcloud(tmp_path, start_fails=True)
    result = _keep_workers(fake)
    assert result.returncode == 1 and "the next run tries again" in result.stdout
    assert len([c for c in _calls(log) if c[2] == "start"]) == 2          # one zone failing does not stop the other
    empty = tmp_path / "empty"
    empty.mkdir()
    result = subprocess.run(["/bin/bash", str(VM / "keep-workers.sh")], capture_output=True, text=True,
                            env={"PATH": str(empty), "ZEROLAKE_DEPLOYMENT": "zerolake",
                                 "ZEROLAKE_PROJECT": "zl-test-project"})
    assert result.returncode == 2 and "gcloud (the Google Cloud CLI) is not on PATH" in result.stderr
    result = _keep_workers(fake, ZEROLAKE_DEPLOYMENT="")
    assert result.returncode != 0 and "ZEROLAKE_DEPLOYMENT is not set" in result.stderr
    assert _keep_workers(fake, "--now").returncode == 2


def test_startup_refuses_a_keeper_without_its_deployment_and_project():
    env = {"PATH": os.environ["PATH"], "ZEROLAKE_ROLE": "shuffle", "ZEROLAKE_ROOT": "gs://b/r",
           "ZEROLAKE_PACKAGE": "/nonexistent.tar.gz", "ZEROLAKE_ACCELERATOR": "cpu", "ZEROLAKE_PROCESSES": "1",
           "ZEROLAKE_ARGS": "", "ZEROLAKE_KEEPER": "on", "ZEROLAKE_DEPLOYMENT": "zerolake", "ZEROLAKE_PROJECT": ""}
    result = subprocess.run([str(VM / "startup.sh")], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2 and "zerolake-project" in result.stderr
    result = subprocess.run([str(VM / "startup.sh")], capture_output=True, text=True, timeout=60,
                            env={**env, "ZEROLAKE_KEEPER": "yes"})
    assert result.returncode == 2 and "keeper 'yes' is not on or off" in result.stderr


def test_startup_retries_a_failed_install_until_it_succeeds_and_then_starts_the_role(tmp_path):
    """The package is missing at boot (a download that failed) and appears later: the start-up script keeps
    trying, never leaving the VM idle, installs it, and starts the role.  Foreground mode, unprivileged: a stand-in
    sdist whose install.sh and run-role.sh only say that they ran."""
    import tarfile
    import threading

    source = tmp_path / "sdist" / "zerolake-0"
    (source / "cloud" / "vm").mkdir(parents=True)
    for script, text in (("install.sh", "echo \"stand-in install $*\"\n"),
                         ("run-role.sh", "echo \"stand-in role $1 $2 root=$ZEROLAKE_ROOT\"\n")):
        path = source / "cloud" / "vm" / script
        path.write_text("#!/usr/bin/env bash\n" + text)
        path.chmod(0o755)
    package = tmp_path / "zerolake.tar.gz"

    def publish_later():
        time.sleep(2.5)
        with tarfile.open(tmp_path / "pending.tar.gz", "w:gz") as tar:
            tar.add(source, arcname="zerolake-0")
        os.replace(tmp_path / "pending.tar.gz", package)

    env = {"PATH": os.environ["PATH"], "ZEROLAKE_ROLE": "worker", "ZEROLAKE_ROOT": "gs://b/run",
           "ZEROLAKE_PACKAGE": str(package), "ZEROLAKE_ACCELERATOR": "cpu", "ZEROLAKE_PROCESSES": "1",
           "ZEROLAKE_ARGS": "", "ZEROLAKE_FOREGROUND": "1", "ZEROLAKE_PREFIX": str(tmp_path / "opt"),
           "ZEROLAKE_STATE": str(tmp_path / "state"), "ZEROLAKE_INSTALL_RETRY_SECONDS": "1"}
    publisher = threading.Thread(target=publish_later)
    publisher.start()
    try:
        result = subprocess.run([str(VM / "startup.sh")], capture_output=True, text=True, env=env, timeout=120)
    finally:
        publisher.join()
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    failures = [line for line in out.splitlines() if "installing the package failed" in line]
    assert failures and "trying again in 1s" in failures[0], out
    assert "stand-in install --accelerator cpu" in out
    assert result.stdout.splitlines()[-1] == "stand-in role worker 0 root=gs://b/run"
    assert (tmp_path / "opt" / "installed").read_text().endswith(" cpu\n")
    # A bad retry setting is one line, before anything is done.
    bad = subprocess.run([str(VM / "startup.sh")], capture_output=True, text=True, timeout=60,
                         env={**env, "ZEROLAKE_INSTALL_RETRY_SECONDS": "soon"})
    assert bad.returncode == 2 and "ZEROLAKE_INSTALL_RETRY_SECONDS 'soon'" in bad.stderr


def test_the_sdist_carries_every_vm_file():
    """startup.sh installs the units and runs the scripts from the unpacked sdist: MANIFEST.in must take them."""
    import fnmatch

    patterns = re.search(r"^recursive-include cloud/vm (.+)$", (REPO / "MANIFEST.in").read_text(), re.M)
    assert patterns, "MANIFEST.in has no `recursive-include cloud/vm` line"
    missing = [str(path.relative_to(REPO)) for path in sorted(VM.rglob("*")) if path.is_file()
               and not any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns.group(1).split())]
    assert not missing, f"MANIFEST.in leaves these out of the sdist: {missing}"


# ---- the root's run prefix (issue 25, defect 12) ------------------------------------

@pytest.mark.parametrize("run", ["run1,zerolake-role=trainer", 'run"1', "run'1", "run 1", "run1\nZEROLAKE_ARGS=x",
                                 "$(touch /tmp/owned)", "run`id`", "run$HOME", "run\\1", "a/../b", "a//b",
                                 ".zl-tmp-x", "r" * 513])
def test_a_root_whose_run_is_unsafe_in_metadata_or_the_env_file_is_refused(run, capsys):
    """The run after gs://BUCKET/ goes verbatim into --metadata (',' splits entries) and into the
    VMs' double-quoted environment file: only '/'-separated segments of letters, digits and _.-."""
    for command in ("plan", "down"):
        code, out, err = run_deploy([command, "--project", "zl-test-project", "--root", f"gs://zl-test-bucket/{run}"],
                                    capsys)
        [line] = [line for line in err.splitlines() if not line.startswith("usage:")]
        assert code == 2 and out == "" and "--root" in line and "Traceback" not in err, (command, err)


def test_a_nested_run_prefix_reaches_the_metadata_unchanged(capsys):
    script = plan_text(["plan", "--project", "zl-test-project", "--root", "gs://zl-test-bucket/team-a/run_1.v2/",
                        "--workers", "1", "--trainer-cpu"], capsys)
    entries = [m.split(",") for m in metadata_of(script).values()]
    assert entries and all("zerolake-root=gs://zl-test-bucket/team-a/run_1.v2/" in e for e in entries)
