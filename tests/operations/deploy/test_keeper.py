"""The keeper: the plan creates its two custom roles, grants the list role on
the project and the start role on each VM it may start, turns it on on
exactly one always-on VM (or says that none runs), and ``keep-workers.sh``,
run against a stand-in gcloud that prints a canned instance list, starts
exactly the stopped workers (and a kept trainer) of its deployment and warns
about a VM whose role never started.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
import time

from operations.deploy import plan as P
from operations.deploy.config import DeployConfig
from tests.operations.deploy.support import (BASE, GCLOUD, VM, check_invocation, gcloud_invocations, metadata_of,
                                             plan_text, stand_in_gcloud)
from tests.operations.deploy.support import account, iam_grants
from tests.operations.deploy.support import creates as _creates
from tests.operations.deploy.support import gcloud_help  # noqa: F401  (a fixture, asked for by name)
from tests.operations.deploy.test_plan import DOWN_SCENARIOS, SCENARIOS


KEEPER_SA = account("shuffle")

KEEPER_ROLE = "projects/zl-test-project/roles/zerolake_keeper_{}_zerolake"


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
    grants = iam_grants(script)
    assert ("projects", "zl-test-project", f"serviceAccount:{KEEPER_SA}", KEEPER_ROLE.format("list")) in grants
    started = [resource for kind, resource, who, role in grants if role == KEEPER_ROLE.format("start")]
    assert started == [f"zerolake-worker-{i:03d}" for i in range(8)]          # each worker VM, nothing else
    # actAs on the workers' account, although this plan (--shuffle-runner local) has no Dataflow
    assert ("iam service-accounts", account("worker"), f"serviceAccount:{KEEPER_SA}",
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
    grants = iam_grants(script)
    assert ("compute instances", "zerolake-trainer", f"serviceAccount:{KEEPER_SA}", KEEPER_ROLE.format("start")) in grants
    assert ("iam service-accounts", account("trainer"), f"serviceAccount:{KEEPER_SA}",
            "roles/iam.serviceAccountUser") in grants
    assert "spot: the keeper starts it again after a preemption" in script


def test_without_a_follower_the_keeper_runs_on_a_standard_trainer_vm_or_the_plan_says_none_does(capsys):
    gpu = plan_text(["plan"] + SCENARIOS["no-shuffle-keeper-on-gpu-trainer"] + BASE, capsys)
    keepers = [name for name, entries in metadata_of(gpu).items() if "zerolake-keeper=on" in entries]
    assert keepers == ["zerolake-trainer"] and _creates(gpu, ("iam", "roles", "create"))
    trainer_sa = f"serviceAccount:{account('trainer')}"
    assert ("projects", "zl-test-project", trainer_sa, KEEPER_ROLE.format("list")) in iam_grants(gpu)
    assert "roles/dataflow" not in gpu
    script = plan_text(["plan"] + SCENARIOS["no-shuffle-tpu-trainer-no-keeper"] + BASE, capsys)
    assert not any("zerolake-keeper=on" in e for e in metadata_of(script).values())
    assert not _creates(script, ("iam", "roles", "create")) and "zerolake_keeper" not in script
    assert not [g for g in iam_grants(script) if g[3] == "roles/iam.serviceAccountUser"]
    assert "# no worker keeper: with --no-shuffle" in script       # said in the plan ...
    result = subprocess.run(["bash", "-c", script.split("# no worker keeper")[1].split("\n")[1]],
                            capture_output=True, text=True)
    assert result.returncode == 0 and result.stderr.startswith("note: no worker keeper")   # ... and when run


def test_down_removes_the_keepers_grant_first_and_keeps_the_roles(tmp_path, capsys):
    script = plan_text(DOWN_SCENARIOS["down-all"] + BASE, capsys)
    removes = [w for w in gcloud_invocations(script) if w[:2] == ["projects", "remove-iam-policy-binding"]]
    assert removes == [["projects", "remove-iam-policy-binding", "zl-test-project",
                        f"--member=serviceAccount:{account(host)}", f"--role={KEEPER_ROLE.format('list')}",
                        "--condition=None", "--format=none"] for host in ("shuffle", "trainer")]
    assert script.index("remove-iam-policy-binding") < script.index("instances list")
    assert "roles delete" not in script
    assert "remove-iam-policy-binding" not in plan_text(DOWN_SCENARIOS["scale-down-workers"] + BASE, capsys)
    deleted = [w[3] for w in _creates(script, ("iam", "service-accounts", "delete"))]
    assert deleted == [account(role) for role in ("worker", "shuffle", "trainer", "builder")]
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
