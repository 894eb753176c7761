"""``python -m operations.deploy plan | down``: the plan for each role and accelerator, checked against the installed gcloud.

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
* Least privilege, zones, order, retries: each role has its own account and
  only its grants; an accelerator absent from its zone is refused at plan time
  and the script asks gcloud again before creating; the follower and trainer
  come before the workers; grants are retried; the Dataflow image is built and
  named.
* The workers: a regional managed instance group of ``--workers`` spot VMs
  from an instance template that carries the release, with the spool on a
  stateful disk; a rerun resizes the group; ``down`` deletes the group, its
  templates and the run's Dataflow jobs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from operations.deploy import steps as S
from operations.deploy.config import DeployConfig
from operations.deploy.workers import worker_template_prefix
from tests.operations.deploy.support import (BASE, RELEASE, REPO, check_invocation, gcloud_invocations, metadata_of,
                                             needs_gcloud, plan_text, run_deploy, stand_in_gcloud)
from tests.operations.deploy.support import gcloud_help  # noqa: F401  (a fixture, used by parameter name)
from tests.operations.deploy.support import VM_IMAGE_DIGEST, account, iam_grants
from tests.operations.deploy.support import creates as _creates

SCENARIOS = {
    # the headline deployment: GPU workers, TPU trainer
    "gpu-workers-tpu-trainer": ["--workers", "8", "--worker-gpu", "nvidia-l4", "--trainer-tpu", "v5litepod-8"],
    "cpu-workers-cpu-trainer": ["--workers", "3", "--trainer-cpu", "--no-spot"],
    "t4-workers-multi-gpu-trainer": ["--workers", "2", "--worker-gpu", "nvidia-tesla-t4", "--worker-gpu-count", "2",
                                     "--trainer-gpu", "nvidia-a100-80gb", "--trainer-gpu-count", "4"],
    "dataflow-shuffle-gpu-trainer": ["--workers", "20", "--worker-gpu", "nvidia-tesla-a100", "--trainer-gpu",
                                     "nvidia-l4", "--worker-args", "--visits 128 --board-size 19"],
    "v6e-trainer-in-its-zone": ["--workers", "1", "--trainer-tpu", "v6e-8", "--trainer-zone", "us-east5-b",
                                "--worker-zone", "us-central1-b"],
    "forced-dataflow-t4-trainer": ["--workers", "1", "--shuffle-runner", "dataflow", "--trainer-gpu",
                                   "nvidia-tesla-t4"],
    "no-shuffle-gpu-trainer": ["--workers", "2", "--no-shuffle", "--trainer-gpu", "nvidia-l4"],
    "no-shuffle-tpu-trainer": ["--workers", "2", "--no-shuffle", "--trainer-tpu", "v4-8",
                               "--trainer-zone", "us-central2-b"],
    # the worker group spread over three zones of one region, in a private network's subnet
    "gpu-workers-three-zones-subnet": ["--workers", "6", "--worker-gpu", "nvidia-l4", "--worker-zones",
                                       "us-central1-a,us-central1-b,us-central1-c", "--network", "zl-vpc",
                                       "--subnet", "zl-sub", "--no-external-ip", "--trainer-cpu"],
}

DOWN_SCENARIOS = {
    "down-all": ["down", "--delete-account"],
    "scale-down-workers": ["down", "--workers-only", "--keep-workers", "4"],
}


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
    assert not [w for w in _creates(script, ("compute", "instances", "create")) if "-worker-" in w[3]]
    words = template_of(script)           # the workers are the group's, made from one template
    assert {"--provisioning-model=SPOT", "--instance-termination-action=STOP", "--machine-type=g2-standard-8",
            "--maintenance-policy=TERMINATE", "--image-project=cos-cloud", "--image-family=cos-stable",
            "--tags=zerolake-worker"} <= set(words)
    assert not any(w.startswith("--accelerator") for w in words)     # G2 machines come with their L4
    metadata = next(w for w in words if w.startswith("--metadata="))
    # Container-Optimized OS: its logging agent on; the driver comes from cos-extensions (startup-image.sh).
    assert {"zerolake-accelerator=gpu", "google-logging-enabled=true", f"{S.HEALTH_PORT_METADATA}={S.HEALTH_PORT}"
            } <= set(metadata.removeprefix("--metadata=").split(","))
    assert "install-nvidia-driver" not in metadata
    # The VMs run the release's image by digest (operations/vm/startup-image.sh); nothing is installed at boot.
    assert f"--metadata-from-file=startup-script={S.IMAGE_STARTUP_SCRIPT}" in words
    assert (f"{S.IMAGE_METADATA}=us-central1-docker.pkg.dev/zl-test-project/zerolake-images/zerolake-gpu"
            "@${zerolake_vm_image_gpu}") in metadata
    # The release travels in the template's metadata, so the group's VMs run it and check its sha256.
    assert {"zerolake-package=gs://zl-test-bucket/zerolake-deploy/zerolake/releases/${zerolake_release}.tar.gz",
            f"{S.RELEASE_METADATA}=${{zerolake_release}}"} <= set(metadata.removeprefix("--metadata=").split(","))
    assert f"--create-disk=device-name={S.SPOOL_DEVICE},size={S.SPOOL_DISK_GB}GB,type=pd-balanced" in words
    [group] = _creates(script, ("compute", "instance-groups", "managed", "create"))
    assert group[4] == "zerolake-workers" and {
        "--size=8", "--region=us-central1", "--zones=us-central1-a", "--template=$zerolake_template",
        "--target-distribution-shape=any", "--instance-redistribution-type=none",
        f"--stateful-disk=device-name={S.SPOOL_DEVICE},auto-delete=on-permanent-instance-deletion"} <= set(group)
    [tpu] = _creates(script, ("compute", "tpus", "queued-resources", "create"))
    assert "--accelerator-type=v5litepod-8" in tpu and "zerolake-accelerator=tpu" in " ".join(tpu)
    assert "--runtime-version=v2-alpha-tpuv5-lite" in tpu and "--node-id=zerolake-trainer" in tpu
    [shuffle] = [w for w in _creates(script, ("compute", "instances", "create")) if w[3] == "zerolake-shuffle"]
    # auto: 8 workers' windows start small, on the follower VM; the large ones later go to Dataflow.
    assert "--image-family=cos-stable" in shuffle and "--dataflow-above-positions=1000000" in " ".join(shuffle)
    assert _creates(script, ("storage", "buckets", "create")) and _creates(script, ("iam", "service-accounts",
                                                                                    "create"))
    [upload] = [w for w in _creates(script, ("storage", "cp")) if "--no-clobber" in w]      # create-only
    assert upload[-2] == "gs://zl-test-bucket/zerolake-deploy/zerolake/releases/${zerolake_release}.tar.gz"
    # Section order: bucket and account before anything that uses them, then the roles there is one of, the
    # workers last (a worker's stockout must not hold up the follower or the trainer).
    order = [script.index(marker) for marker in ("buckets create", "service-accounts create", "storage cp",
                                                 "builds submit", "instances create zerolake-shuffle",
                                                 "queued-resources create zerolake-trainer",
                                                 "instance-templates create", "managed create zerolake-workers")]
    assert order == sorted(order)


def test_accelerator_kinds(capsys):
    t4 = plan_text(["plan"] + SCENARIOS["t4-workers-multi-gpu-trainer"] + BASE, capsys)
    creates = {w[3]: w for w in _creates(t4, ("compute", "instances", "create"))}
    assert "--accelerator=type=nvidia-tesla-t4,count=2" in template_of(t4)                    # N1: attached
    assert "--machine-type=a2-ultragpu-4g" in creates["zerolake-trainer"]
    assert "zerolake-processes=8" in " ".join(template_of(t4))                                # 4 per GPU
    assert not any("SPOT" in w for w in creates["zerolake-trainer"])                            # trainer: standard
    cpu = plan_text(["plan"] + SCENARIOS["cpu-workers-cpu-trainer"] + BASE, capsys)
    creates = {w[3]: w for w in _creates(cpu, ("compute", "instances", "create"))}
    assert "--image-family=cos-stable" in template_of(cpu)
    assert not any("SPOT" in w or "nvidia" in w for w in template_of(cpu))                      # --no-spot, CPU
    assert "zerolake-accelerator=cpu" in " ".join(creates["zerolake-trainer"])
    assert "tpu.googleapis.com" not in cpu and not _creates(cpu, ("compute", "tpus", "queued-resources", "create"))


def test_dataflow_shuffle_gets_its_apis_roles_image_and_beam_flags(capsys):
    script = plan_text(["plan"] + SCENARIOS["dataflow-shuffle-gpu-trainer"] + BASE, capsys)
    [shuffle] = [w for w in _creates(script, ("compute", "instances", "create")) if w[3] == "zerolake-shuffle"]
    metadata = next(w for w in shuffle if w.startswith("--metadata="))
    image = "us-central1-docker.pkg.dev/zl-test-project/zerolake-images/dataflow-worker"
    for flag in ("--runner=DataflowRunner", "--region=us-central1",
                 f"--sdk_container_image={image}@${{zerolake_image_digest}}",
                 "--temp_location=gs://zl-test-bucket/zerolake-deploy/zerolake/dataflow-tmp",
                 f"--service_account_email={account('shuffle')}"):
        assert flag in metadata
    assert "--setup_file" not in script        # Dataflow's workers install nothing at boot
    for api in ("dataflow.googleapis.com", "artifactregistry.googleapis.com", "cloudbuild.googleapis.com"):
        assert api in script
    # The image: a repository, a build from operations/dataflow/Dockerfile and the sdist, tagged, and readable by the
    # follower's account (whose jobs' workers pull it).
    assert _creates(script, ("artifacts", "repositories", "create"))[0][3] == "zerolake-images"
    builds = _creates(script, ("builds", "submit"))       # Dataflow's image, and the follower's and trainer's
    assert len(builds) == 3 and all("--region=us-central1" in build and any(w.startswith("--config=") for w in build)
                                    for build in builds)
    assert f"cp {S.DATAFLOW_DOCKERFILE} " in script and f"{image}:release-$zerolake_release" in script
    assert not _creates(script, ("artifacts", "docker", "tags"))            # no moving tag: jobs name the digest
    [digest] = [w for w in _creates(script, ("artifacts", "docker", "images", "describe"))
                if "--format=value(image_summary.digest)" in w and "dataflow-worker" in w[4]]
    assert digest[4] == f"{image}:release-$zerolake_release"
    assert script.index("value(image_summary.digest)") < script.index("instances create zerolake-shuffle")
    grants = iam_grants(script)
    assert ("artifacts repositories", "zerolake-images", f"serviceAccount:{account('shuffle')}",
            "roles/artifactregistry.reader") in grants
    assert ("artifacts repositories", "zerolake-images", f"serviceAccount:{account('builder')}",
            "roles/artifactregistry.writer") in grants
    # Least privilege: Dataflow's project roles go to the follower's account alone, and none is dataflow.admin
    # (which carries storage permissions on every bucket of the project).
    project = {(member, role) for kind, _, member, role in grants if kind == "projects"}
    assert {role for member, role in project if member == f"serviceAccount:{account('shuffle')}"} >= {
        "roles/dataflow.developer", "roles/compute.viewer", "roles/dataflow.worker"}
    assert not any("dataflow.admin" in role for _, role in project)
    assert {role for member, role in project if member == f"serviceAccount:{account('worker')}"} == set(S.LOG_ROLES)
    assert ("iam service-accounts", account("shuffle"), f"serviceAccount:{account('shuffle')}",
            "roles/iam.serviceAccountUser") in grants
    worker = template_of(script)
    assert "zerolake-args=--visits 128 --board-size 19" in " ".join(worker)
    assert f"--service-account={account('worker')}" in worker
    # --shuffle-runner auto (the default): the follower chooses per window, by its size.
    assert "--dataflow-above-positions=1000000 --runner=DataflowRunner" in metadata
    assert "up to 1,000,000 positions, larger ones on Dataflow" in script
    # local: never Dataflow, no image; dataflow: every window there.
    local = plan_text(["plan", "--workers", "2", "--shuffle-runner", "local"] + BASE, capsys)
    assert "DataflowRunner" not in local and "dataflow.googleapis.com" not in local and "dataflow-worker" not in local
    forced = plan_text(["plan", "--dataflow-above-positions", "5"] + SCENARIOS["forced-dataflow-t4-trainer"] + BASE,
                       capsys)
    assert "--runner=DataflowRunner" in forced and "--dataflow-above-positions" not in forced


def test_each_role_runs_as_its_own_account_with_only_its_grants(capsys):
    script = plan_text(["plan"] + SCENARIOS["gpu-workers-tpu-trainer"] + BASE, capsys)
    vms = {w[3]: w for w in _creates(script, ("compute", "instances", "create"))}
    assert f"--service-account={account('worker')}" in template_of(script)
    assert f"--service-account={account('shuffle')}" in vms["zerolake-shuffle"]
    [tpu] = _creates(script, ("compute", "tpus", "queued-resources", "create"))
    assert f"--service-account={account('trainer')}" in tpu
    by_member: dict = {}
    for kind, resource, who, role in iam_grants(script):
        by_member.setdefault(who.removeprefix("serviceAccount:"), set()).add((kind, role))
    bucket = {("storage buckets", role) for role in S.BUCKET_ROLES}
    logs = {("projects", role) for role in S.LOG_ROLES}
    image = {("artifacts repositories", "roles/artifactregistry.reader")}     # the release's image, by digest
    assert by_member[account("worker")] == bucket | logs | image
    assert by_member[account("trainer")] == bucket | logs            # the TPU trainer pulls no image (pip)
    # The follower: its Dataflow jobs, and nothing more (no keeper: the worker group restarts preempted workers,
    # so no role can list, start or change VMs, and no custom role is made).
    assert by_member[account("shuffle")] - bucket - logs == {("projects", role) for role in S.DATAFLOW_PROJECT_ROLES} | {
        ("iam service-accounts", "roles/iam.serviceAccountUser"),
        ("artifacts repositories", "roles/artifactregistry.reader")}
    assert "iam roles create" not in script and "keeper" not in script
    # Every grant is retried: an account just created takes a while to be seen by IAM.
    grant_lines = [line for line in script.splitlines() if "add-iam-policy-binding" in line]
    assert grant_lines and all(line.lstrip().startswith(f"retry {S.GRANT_TRIES} gcloud") for line in grant_lines)
    # ... and each new account is waited for before its first grant.
    for role in ("worker", "shuffle", "trainer"):
        wait = script.index(f"retry {S.GRANT_TRIES} gcloud iam service-accounts describe {account(role)}")
        assert script.index(f"service-accounts create zerolake-{role}") < wait < script.index(
            f"--member=serviceAccount:{account(role)}")


@pytest.mark.parametrize("argv, field, words", [
    (["--trainer-tpu", "v6e-8"], "--zone", ["us-central1-a has no v6e-8", "us-east5-b", "--no-check-zones"]),
    (["--trainer-tpu", "v4-8", "--trainer-zone", "us-central1-a"], "--trainer-zone",
     ["us-central1-a has no v4-8", "us-central2-b"]),
    (["--trainer-tpu", "v9x-8", "--trainer-zone", "us-central2-b"], "--trainer-tpu",
     ["no tested TensorFlow path", "https://cloud.google.com/tpu/docs/runtimes"]),
    (["--trainer-tpu", "v5litepod-16"], "--trainer-tpu", ["multi-host", "v5litepod-8"]),
    (["--worker-zones", "us-central1-a,us-east1-b"], "--worker-zones",
     ["'us-east1-b' is not a zone of us-central1", "--worker-zone"]),
    (["--worker-zone", "central"], "--worker-zone", ["is not a zone"]),
])
def test_an_accelerator_the_zone_lacks_is_refused_before_anything_is_printed(argv, field, words, capsys):
    code, out, err = run_deploy(["plan"] + BASE + argv, capsys)
    assert code == 2 and out == "" and "Traceback" not in err, err
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert f"{field}: " in line and all(word in line for word in words), line


def _apply_with_listing(tmp_path, script: str, listing_output: str, listing_status: int,
                        versions: str = "v2-alpha-tpuv6e\\n", versions_status: int = 0):
    """Run a plan's script against a stand-in gcloud whose accelerator listing prints ``listing_output``
    and exits ``listing_status`` (its TPU software versions: ``versions``, ``versions_status``); nothing
    exists yet (describe fails).  The result gains ``calls``."""
    fake = tmp_path / f"bin-{listing_status}-{len(listing_output)}-{versions_status}-{len(versions)}" / "gcloud"
    fake.parent.mkdir()
    fake.write_text("#!/usr/bin/env bash\n"
                    f"if [[ $* == *accelerator-types* ]]; then printf '{listing_output}'; exit {listing_status}; fi\n"
                    f"if [[ $* == *'tpu-vm versions list'* ]]; then printf '{versions}'; exit {versions_status}; fi\n"
                    f"[[ $* == *image_summary.digest* ]] && {{ echo {VM_IMAGE_DIGEST}; exit 0; }}\n"
                    "[[ $* == *describe* ]] && exit 1\n"
                    'echo "$*" >> "$(dirname "$0")/calls"\n')
    fake.chmod(0o755)
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                            env={**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"})
    result.calls = (fake.parent / "calls").read_text() if (fake.parent / "calls").exists() else ""
    return result


def test_no_check_zones_trusts_the_zone_and_the_script_still_asks_gcloud(tmp_path, capsys):
    script = plan_text(["plan", "--only", "trainer", "--release", RELEASE, "--trainer-tpu", "v6e-8", "--no-check-zones",
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


def test_the_script_asks_gcloud_whether_the_zone_offers_the_tpu_software_version(tmp_path, capsys):
    script = plan_text(["plan", "--only", "trainer", "--release", RELEASE, "--trainer-tpu", "v6e-8",
                        "--trainer-zone", "us-east5-b", "--trainer-wait-minutes", "0"] + BASE, capsys)
    [listing] = _creates(script, ("compute", "tpus", "tpu-vm", "versions", "list"))
    assert "--zone=us-east5-b" in listing and "--filter=version=v2-alpha-tpuv6e" in listing
    assert script.index("versions list") < script.index("queued-resources create")

    absent = _apply_with_listing(tmp_path, script, "v6e-8\\n", 0, versions="tpu-ubuntu2204-base\\n")
    assert absent.returncode == 2 and "queued-resources create" not in absent.calls
    [line] = [line for line in absent.stderr.splitlines() if "error:" in line]
    assert "us-east5-b offers no TPU software version v2-alpha-tpuv6e" in line and "--trainer-tpu-runtime" in line
    unknown = _apply_with_listing(tmp_path, script, "v6e-8\\n", 0, versions="", versions_status=1)
    assert "could not list the TPU software versions of us-east5-b" in unknown.stderr
    assert "queued-resources create zerolake-trainer" in unknown.calls


def test_a_gpu_type_is_checked_live_in_its_zone_before_its_vm_is_created(tmp_path, capsys):
    """GPU types have no dated table (operations.deploy.zones.GPU_ZONES is empty: Google offers each in dozens
    of zones), so the script's live check is what stops a GPU VM in a zone without that GPU."""
    script = plan_text(["plan", "--only", "trainer", "--release", RELEASE, "--trainer-gpu", "nvidia-l4"] + BASE,
                       capsys)
    [listing] = _creates(script, ("compute", "accelerator-types", "list"))
    assert any("zone:us-central1-a" in word and "nvidia-l4" in word for word in listing), listing
    assert script.index("accelerator-types list") < script.index("instances create")

    absent = _apply_with_listing(tmp_path, script, "nvidia-tesla-t4\n", 0)
    assert absent.returncode == 2 and "zone us-central1-a offers no nvidia-l4 today" in absent.stderr
    assert "instances create" not in absent.calls
    present = _apply_with_listing(tmp_path, script, "nvidia-l4\n", 0)
    assert present.returncode == 0 and "instances create zerolake-trainer" in present.calls


def template_of(script: str) -> list[str]:
    """The words of the plan's one worker instance template."""
    [words] = _creates(script, ("compute", "instance-templates", "create"))
    return words


def test_a_rerun_resizes_the_worker_group_to_workers_and_moves_it_to_this_template(tmp_path, capsys):
    """A stand-in gcloud: the first run finds nothing and creates the template and the group of 3; the second
    finds both and, for --workers 5, resizes the group and starts a rolling update to the same template (a no-op
    for Compute Engine), creating nothing."""
    script = plan_text(["plan", "--only", "workers", "--workers", "3", "--release", RELEASE] + BASE, capsys)
    template = next(line for line in script.splitlines() if line.startswith("zerolake_template=")) \
        .removeprefix("zerolake_template=").replace("${zerolake_release:0:12}", RELEASE[:12])
    first, log = stand_in_gcloud(tmp_path / "first", "[[ $* == *describe* ]] && exit 1\nexit 0\n")
    subprocess.run(["bash", "-c", script], check=True, env={**os.environ, "PATH": f"{first}:{os.environ['PATH']}"})
    calls = [c for c in log.read_text().splitlines() if not c.startswith("storage")]
    assert [c.split()[:4] for c in calls if "describe" not in c] == [
        ["compute", "instance-templates", "create", template], ["compute", "health-checks", "create", "http"],
        ["compute", "firewall-rules", "create", "zerolake-allow-worker-health"],
        ["compute", "instance-groups", "managed", "create"]]
    assert f"--template={template}" in calls[-1] and "--size=3" in calls[-1]
    assert {"--health-check=zerolake-worker-health", "--initial-delay=1200"} <= set(calls[-1].split())
    script = plan_text(["plan", "--only", "workers", "--workers", "5", "--release", RELEASE] + BASE, capsys)
    second, log = stand_in_gcloud(tmp_path / "second", "exit 0\n")
    subprocess.run(["bash", "-c", script], check=True, env={**os.environ, "PATH": f"{second}:{os.environ['PATH']}"})
    calls = [c for c in log.read_text().splitlines() if not c.startswith("storage") and "describe" not in c]
    assert [c.split()[3:5] for c in calls] == [["resize", "zerolake-workers"], ["update", "zerolake-workers"],
                                               ["rolling-action", "start-update"]]
    assert "--size=5" in calls[0] and f"--version=template={template}" in calls[2]
    assert {"--health-check=zerolake-worker-health", "--initial-delay=1200"} <= set(calls[1].split())  # autohealing
    assert "--replacement-method=recreate" in calls[2] and "--max-surge=0" in calls[2]     # the spool disk stays


def test_the_template_is_named_by_its_settings_and_release(capsys):
    """Templates cannot change: new worker settings make a new name (a new template), the same ones the same."""
    def name(*argv):
        script = plan_text(["plan", "--only", "workers", "--workers", "2", "--release", RELEASE, *argv] + BASE, capsys)
        return next(line for line in script.splitlines() if line.startswith("zerolake_template="))
    assert name() == name() and name() != name("--worker-args", "--visits 64") != name("--worker-machine", "c2d-standard-8")
    assert name().endswith("-${zerolake_release:0:12}") and len(worker_template_prefix(DeployConfig(
        project="zl-test-project", root="gs://zl-test-bucket/run1", name="a" * 21)) + "0" * 21) <= 63


def test_each_zone_of_the_group_is_asked_live_for_the_workers_gpu(capsys):
    script = plan_text(["plan"] + SCENARIOS["gpu-workers-three-zones-subnet"] + BASE, capsys)
    listings = [w for w in _creates(script, ("compute", "accelerator-types", "list"))
                if any("nvidia-l4" in word for word in w)]
    assert [next(w for w in words if w.startswith("--filter=")) for words in listings[:3]] == [
        f"--filter=zone:us-central1-{z} AND name=nvidia-l4" for z in "abc"]
    assert script.rindex("accelerator-types list") < script.index("instance-templates create")
    [group] = _creates(script, ("compute", "instance-groups", "managed", "create"))
    assert "--zones=us-central1-a,us-central1-b,us-central1-c" in group
    # A global template names its subnet's region.
    assert {"--subnet=zl-sub", "--no-address", "--region=us-central1"} <= set(template_of(script))


def test_the_follower_parses_the_plans_shuffle_flags_and_chooses_per_window(capsys):
    """The plan's shuffle args, as startup.sh passes them, give pipeline.shuffle --follow its per-window choice."""
    import shlex

    from operations.deploy.config import DeployConfig
    from operations.deploy.vms import shuffle_runner_args
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
    # Without the package section, the VMs get the release the deployment records (read first).
    assert [w[:4] for w in gcloud_invocations(script)] == [
        ["storage", "cat", "gs://zl-test-bucket/zerolake-deploy/zerolake/release", "--project=zl-test-project"],
        ["artifacts", "docker", "images", "describe"],
        ["compute", "instance-templates", "describe", "$zerolake_template"],
        ["compute", "instance-templates", "create", "$zerolake_template"],
        ["compute", "health-checks", "describe", "zerolake-worker-health"],
        ["compute", "health-checks", "create", "http"],
        ["compute", "firewall-rules", "describe", "zerolake-allow-worker-health"],
        ["compute", "firewall-rules", "create", "zerolake-allow-worker-health"]] + [
        ["compute", "instance-groups", "managed", verb]
        for verb in ("describe", "resize", "update", "rolling-action", "create")]
    image = plan_text(["plan", "--only", "image", "--release", RELEASE] + BASE, capsys)
    assert "sdist" not in image and f"zerolake_release={RELEASE}\n" in image and "builds submit" in image


def test_down_selects_by_label_and_keeps_the_bucket(capsys):
    script = plan_text(DOWN_SCENARIOS["down-all"] + BASE, capsys)
    assert "buckets delete" not in script and "storage rm" not in script
    assert "labels.zerolake-deployment=zerolake" in script
    assert _creates(script, ("iam", "service-accounts", "delete"))
    scale = plan_text(DOWN_SCENARIOS["scale-down-workers"] + BASE, capsys)
    [resize] = _creates(scale, ("compute", "instance-groups", "managed", "resize"))
    assert "--size=4" in resize and "tpu-vm" not in scale and "gcloud compute instance-groups managed delete" not in scale


def test_scale_down_resizes_the_group_found_by_listing(tmp_path, capsys):
    """``down --workers-only --keep-workers 4`` resizes the group in the region its listing gives, and says so
    when there is no group (another deployment's, zerolake-workers-b, does not count)."""
    script = plan_text(DOWN_SCENARIOS["scale-down-workers"] + BASE, capsys)
    for listed, expected in (("zerolake-workers us-west1", ["--region=us-west1", "--size=4"]),
                             ("zerolake-workers-b us-west1", None)):
        folder, log = stand_in_gcloud(tmp_path / listed.split()[0], f"[[ $4 == list ]] && echo '{listed}'\nexit 0\n")
        result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                                env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"})
        resizes = [c.split() for c in log.read_text().splitlines() if " resize " in c]
        if expected:
            assert len(resizes) == 1 and set(expected) <= set(resizes[0]), resizes
        else:
            assert not resizes and "there is no regional worker group zerolake-workers" in result.stderr


def test_down_deletes_the_group_then_its_templates_and_cancels_the_runs_dataflow_jobs(tmp_path, capsys):
    """Run the down plan with a stand-in gcloud that lists the group (in a region no flag of this down names:
    it is found by listing) and another deployment's, this deployment's two templates, a template of another
    deployment (zerolake-b) and one of a name this plan never makes, and two active Dataflow jobs."""
    folder, log = stand_in_gcloud(tmp_path / "bin", "case \"$*\" in\n"
                                  "  'compute instance-templates list'*) printf 'zerolake-worker-0123abcd-5e5e5e5e5e5e\\n"
                                  "zerolake-worker-89abcdef-0123456789ab\\nzerolake-b-worker-0123abcd-5e5e5e5e5e5e\\n"
                                  "zerolake-worker-handmade\\n' ;;\n"
                                  "  'compute instances list'*) echo 'zerolake-shuffle us-central1-a' ;;\n"
                                  "  'compute instance-groups managed list'*) printf 'zerolake-workers-b us-east1\\n"
                                  "zerolake-workers europe-west4\\n' ;;\n"
                                  "  'dataflow jobs list'*) printf '2026-01-01_job1\\n2026-01-01_job2\\n' ;;\nesac\n")
    script = tmp_path / "down.sh"
    script.write_text(plan_text(DOWN_SCENARIOS["down-all"] + BASE, capsys))
    subprocess.run(["bash", str(script)], check=True, env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"})
    calls = [c.split() for c in log.read_text().splitlines()]
    acts = [c[:5] for c in calls if c[2] in ("delete", "cancel") or c[3:4] == ["delete"]]
    [group_delete] = [c for c in calls if c[2:4] == ["managed", "delete"]]
    assert "--region=europe-west4" in group_delete
    assert acts[:3] == [["compute", "instance-groups", "managed", "delete", "zerolake-workers"],
                        ["compute", "instance-templates", "delete", "zerolake-worker-0123abcd-5e5e5e5e5e5e",
                         "--project=zl-test-project"],
                        ["compute", "instance-templates", "delete", "zerolake-worker-89abcdef-0123456789ab",
                         "--project=zl-test-project"]]
    cancels = [c for c in calls if c[:3] == ["dataflow", "jobs", "cancel"]]
    assert [c[3] for c in cancels] == ["2026-01-01_job1", "2026-01-01_job2"]
    assert all("--region=us-central1" in c for c in cancels)
    [listing] = [c for c in calls if c[:3] == ["dataflow", "jobs", "list"]]
    assert "--status=active" in listing and any("zerolake-zl-test-bucket-run1-" in w for w in listing)
    # After the follower (which cancels its own job on SIGTERM): this catches what it could not.
    order = [c[:4] if c[2] == "delete" else c[:3] for c in calls if c[:3] in (["compute", "instances", "delete"], ["dataflow", "jobs", "cancel"])]
    assert order == [["compute", "instances", "delete", "zerolake-shuffle"]] + [["dataflow", "jobs", "cancel"]] * 2
    text = script.read_text()
    assert "iam roles" not in text and "remove-iam-policy-binding" not in text          # no keeper left to unbind
    local = plan_text(["down", "--shuffle-runner", "local"] + BASE, capsys)
    assert "dataflow" not in local


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
                    "[[ $* == *'tpu-vm versions list'* ]] && echo tpu-ubuntu2204-base\n"
                    f"[[ $* == *image_summary.digest* ]] && {{ echo {VM_IMAGE_DIGEST}; exit 0; }}\n"
                    "[[ $* == *describe* ]] && exit 1\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    argv = ["plan", "--only", "workers,trainer", "--release", RELEASE, "--workers", "2", "--trainer-tpu", "v4-8",
            "--trainer-zone",
            "us-central2-b", "--trainer-wait-minutes", "0", "--apply"] + BASE
    code, _, err = run_deploy(argv, capsys)
    # The stand-in never reports the queued TPU ACTIVE: the plan names it and ends with status 3.
    assert code == 3, err          # (the script's own stderr is the terminal's: tests/operations/deploy/test_capacity.py reads it)
    calls = log.read_text().splitlines()
    creates = [c.split() for c in calls if "create" in c]
    assert [c[:4] for c in creates] == [          # the trainer first, then the workers' template and group
        ["compute", "tpus", "queued-resources", "create"], ["compute", "instance-templates", "create", creates[1][3]],
        ["compute", "health-checks", "create", "http"],
        ["compute", "firewall-rules", "create", "zerolake-allow-worker-health"],
        ["compute", "instance-groups", "managed", "create"]]
    assert creates[1][3].startswith("zerolake-worker-") and creates[1][3].endswith(f"-{RELEASE[:12]}")
    assert f"--template={creates[1][3]}" in creates[4]


def test_the_plan_points_at_files_that_exist():
    assert S.STARTUP_SCRIPT.exists() and (REPO / "Dockerfile").exists() and S.DATAFLOW_DOCKERFILE.exists()
    assert "operations/vm/install.sh" in (REPO / "Dockerfile").read_text()
    assert "operations/vm/install.sh" in S.STARTUP_SCRIPT.read_text()
    assert "operations/vm/install.sh --system" in S.DATAFLOW_DOCKERFILE.read_text()
    json.dumps(dataclasses.asdict(DeployConfig(project="zl-test-project", root="gs://zl-test-bucket/r")))
    assert sys.executable


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


TEXT_FIELDS = [f.name for f in dataclasses.fields(DeployConfig) if f.type in ("str", str)]


@pytest.mark.parametrize("field", TEXT_FIELDS)
def test_no_text_flag_can_end_a_comment_line_of_the_plan(field, capsys):
    """Each text setting reaches the script, a step's ``# comment`` at least: a newline in one ended the
    comment and made the rest a command that --apply runs with the deployer's credentials
    (--trainer-tpu-runtime did, unchecked)."""
    from format.cli import flag_name

    flag = flag_name(field)
    settings = {"--project": "zl-test-project", "--root": "gs://zl-test-bucket/run1", "--trainer-tpu": "v4-8",
                "--trainer-zone": "us-central2-b"}
    settings[flag] = "v2\ntouch /tmp/zerolake-owned #"
    argv = ["plan", "--workers", "1", *[item for pair in settings.items() for item in pair]]
    code, out, err = run_deploy(argv, capsys)
    assert code == 2 and out == "" and flag in err and "Traceback" not in err, err


def test_the_tpu_runtime_is_a_version_name_and_a_good_one_reaches_gcloud(capsys):
    tpu = ["plan", *BASE, "--workers", "1", "--trainer-tpu", "v4-8", "--trainer-zone", "us-central2-b"]
    code, out, err = run_deploy([*tpu, "--trainer-tpu-runtime", "v2 ; curl x|sh"], capsys)
    assert code == 2 and "--trainer-tpu-runtime" in err and out == ""
    script = plan_text([*tpu, "--trainer-tpu-runtime", "tpu-vm-tf-2.18.0-pjrt"], capsys)
    assert "--runtime-version=tpu-vm-tf-2.18.0-pjrt" in script


def test_a_comment_holds_one_line_whatever_its_text():
    from operations.deploy.render import render

    script = render([S.Step("workers", "a\nrm -rf ~ \x1b]0;t\x07", "true")], "title\nreboot")
    assert "\nrm -rf" not in script and "\nreboot" not in script and "\x1b" not in script
    assert "# a\\nrm -rf ~ \\x1b]0;t\\x07" in script.splitlines()


@pytest.mark.parametrize("release_bytes", [b"the release", b"another file"])
def test_a_plan_leaves_no_scratch_file_however_it_ends(tmp_path, capsys, release_bytes):
    """A finished plan left four temporary entries, two of them copies of the release: now one scratch
    folder, removed on exit, whether the plan ends well (the images built) or fails (a release whose
    sha256 is not its name)."""
    import hashlib

    release = hashlib.sha256(b"the release").hexdigest()
    script = plan_text(["plan", "--only", "package,image", "--release", release, "--workers", "1"] + BASE, capsys)
    lines = [line for line in script.splitlines() if "mktemp" in line]
    assert lines[0] == "zerolake_scratch=$(mktemp -d)" and all('-p "$zerolake_scratch"' in x for x in lines[1:])
    (tmp_path / "release").write_bytes(release_bytes)
    folder, log = stand_in_gcloud(tmp_path / "bin", f'[[ $1 == storage && $2 == cp && $4 != gs://* ]] && '
                                                    f'cp {tmp_path / "release"} "$4"\n'
                                                    '[[ $* == *"images describe"* ]] && exit 1\nexit 0\n')
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (tmp_path / "plan.sh").write_text(script)
    result = subprocess.run(["bash", str(tmp_path / "plan.sh")], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}", "TMPDIR": str(scratch)})
    built = "builds submit" in log.read_text()
    assert (result.returncode == 0 and built) if release_bytes == b"the release" else \
        (result.returncode != 0 and not built), result.stderr
    assert list(scratch.iterdir()) == []


NO_TERMINAL_GCLOUD = r'''
if [[ $1 == auth ]]; then echo someone@example.com; exit 0; fi
if [[ $* == *uniform_bucket_level_access* ]]; then echo True; exit 0; fi
if [[ $1 == storage && $2 == cp && $4 != gs://* ]]; then cp "$RELEASE_FILE" "$4"; exit 0; fi
args=("$@")
for ((i = 0; i < $#; i++)); do
  if [[ ${args[i]} == add-iam-policy-binding ]]; then
    resource=${args[i+1]//\//_}
    if [[ $* == *--condition=None* ]]; then :
    elif [[ $* == *--condition=* ]]; then touch "$STATE/conditional-$resource"
    elif [[ -e $STATE/conditional-$resource ]]; then
      # gcloud's rule outside a terminal: the binding is refused (recorded here, so no retry waits).
      echo "$*" >> "$STATE/refused"
    fi
  fi
done
[[ $* == *accelerator-types* ]] && { echo nvidia-l4; echo v5litepod-8; exit 0; }
[[ $* == *"tpu-vm versions list"* ]] && { echo v2-alpha-tpuv5-lite; exit 0; }
[[ $* == *"service-accounts describe"* ]] && exit 0      # each account exists once created
[[ $* == *describe* ]] && exit 1
exit 0
'''


@pytest.mark.parametrize("roles, code", [
    (["--workers", "1", "--trainer-cpu"], 0),
    # GPU workers (health check, firewall rule) and a TPU trainer (its software version asked live), which the
    # stand-in never makes ACTIVE: the plan ends naming it (status 3), everything else made.
    (["--workers", "2", "--worker-gpu", "nvidia-l4", "--trainer-tpu", "v5litepod-8", "--trainer-wait-minutes", "0"], 3),
])
def test_the_whole_plan_runs_with_no_terminal_under_gclouds_conditional_binding_rule(tmp_path, capsys, roles, code):
    """Outside a terminal gcloud refuses a binding without a condition on a policy that holds conditional
    ones ("prohibited in non-interactive mode"): the bucket reader's grant had none, after the roles'
    conditional grants, and a plan from a CI job stopped there.  Here a stand-in gcloud keeps the rule."""
    import hashlib

    (tmp_path / "release").write_bytes(b"the release")
    release = hashlib.sha256(b"the release").hexdigest()
    script = plan_text(["plan", "--release", release, *roles, "--shuffle-runner", "local"] + BASE, capsys)
    folder, log = stand_in_gcloud(tmp_path / "bin", NO_TERMINAL_GCLOUD)
    (tmp_path / "plan.sh").write_text(script)
    (tmp_path / "state").mkdir()
    result = subprocess.run(["bash", str(tmp_path / "plan.sh")], stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=300,
                            env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}", "ZEROLAKE_POLL_SECONDS": "0",
                                 "STATE": str(tmp_path / "state"), "RELEASE_FILE": str(tmp_path / "release")})
    assert result.returncode == code, result.stderr[-3000:]
    assert not (tmp_path / "state" / "refused").exists(), (tmp_path / "state" / "refused").read_text()
    assert list((tmp_path / "state").glob("conditional-*"))        # the rule had something to act on
    assert "instance-groups managed create" in log.read_text()     # the plan ran to its end
    # The builder reads its staged sources, not the lake.
    [builder] = [line for line in log.read_text().splitlines()
                 if "add-iam-policy-binding" in line and "builder" in line and "objectViewer" in line]
    assert "build-source/" in builder and "--condition=^;^expression=resource.name.startsWith" in builder


def test_an_existing_bucket_without_uniform_access_is_refused_in_one_line(tmp_path, capsys):
    script = plan_text(["plan", "--only", "bucket"] + BASE, capsys)
    folder, _ = stand_in_gcloud(tmp_path / "bin", 'if [[ $* == *uniform_bucket_level_access* ]]; then echo False; fi\n'
                                                  "exit 0\n")
    (tmp_path / "plan.sh").write_text(script)
    result = subprocess.run(["bash", str(tmp_path / "plan.sh")], stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"})
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "uniform bucket-level access" in line and "gs://zl-test-bucket" in line


def test_the_worker_group_autoheals_on_the_workers_own_health_answer(capsys):
    """A VM with no Docker, no GPU or a worker that never plays stays up and billed unless the group checks
    it: the health check asks worker process 0's GET /health (selfplay/health.py) on the port the template's
    metadata gives startup-image.sh, and only Google's probe ranges reach that port on the workers' tag."""
    from selfplay.health import PATH
    script = plan_text(["plan", "--only", "workers", "--workers", "2", "--release", RELEASE] + BASE, capsys)
    [check] = _creates(script, ("compute", "health-checks", "create", "http"))
    assert {"--global", f"--port={S.HEALTH_PORT}", f"--request-path={PATH}", "--check-interval=60s",
            "--unhealthy-threshold=10"} <= set(check)
    [rule] = _creates(script, ("compute", "firewall-rules", "create"))
    assert {f"--allow=tcp:{S.HEALTH_PORT}", "--source-ranges=35.191.0.0/16,130.211.0.0/22",
            "--target-tags=zerolake-worker"} <= set(rule)
    words = template_of(script)
    assert "--tags=zerolake-worker" in words
    assert f"{S.HEALTH_PORT_METADATA}={S.HEALTH_PORT}" in next(w for w in words if w.startswith("--metadata="))
    [group] = _creates(script, ("compute", "instance-groups", "managed", "create"))
    assert {"--health-check=zerolake-worker-health", "--initial-delay=1200"} <= set(group)
    # The shuffle follower and the trainer are single VMs: no health port, no worker tag.
    script = plan_text(["plan", "--only", "shuffle,trainer", "--trainer-cpu", "--release", RELEASE] + BASE, capsys)
    for words in _creates(script, ("compute", "instances", "create")):
        assert S.HEALTH_PORT_METADATA not in " ".join(words) and "--tags=zerolake-worker" not in words
