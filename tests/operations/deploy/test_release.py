"""Releases: immutable, named by their sha256, checked by every VM, written only by the deployer.

* One source is one release: the repack's bytes do not depend on file times.
* startup.sh refuses a doctored package in one line, before unpacking or running anything.
* The plan, run through a stand-in gcloud and a stand-in sdist build: the object it uploads is named by the
  sha256 of the uploaded file, create-only, and that sha256 is what the VMs' metadata names; a plan whose
  release differs from the one the deployment runs is refused in one line.
* No role's account can write a release (the bucket grants' IAM conditions, evaluated).
* ``update``: every gcloud word documented; the trainer and the follower get the release, stop and start
  before any worker is touched; each VM's metadata is set before it is stopped; then the workers' new
  template (the release in its metadata) and the group's rolling update onto it.
"""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
import tarfile

import pytest

from format import layout
from operations.deploy import steps as S
from operations.deploy import release as R
from tests.operations.deploy.support import (BASE, RELEASE, VM, VM_IMAGE_DIGEST, account, check_invocation, creates,
                                             gcloud_invocations, iam_grants, metadata_of, needs_gcloud, plan_text,
                                             stand_in_gcloud)
from tests.operations.deploy.support import gcloud_help  # noqa: F401  (a fixture, used by parameter name)


def _sdist(folder, text: str, mtime: int):
    source = folder / "src" / "zerolake-0"
    (source / "operations" / "vm").mkdir(parents=True, exist_ok=True)
    script = source / "operations" / "vm" / "install.sh"
    script.write_text(text)
    script.chmod(0o755)
    os.utime(script, (mtime, mtime))
    dist = folder / "dist"
    dist.mkdir()
    with tarfile.open(dist / "zerolake-0.tar.gz", "w:gz") as tar:
        tar.add(source, arcname="zerolake-0")
    return dist


def test_one_source_is_one_release_whatever_its_file_times(tmp_path):
    first = _sdist(tmp_path / "a", "echo one\n", 1_000_000)
    again = _sdist(tmp_path / "b", "echo one\n", 2_000_000)
    other = _sdist(tmp_path / "c", "echo two\n", 1_000_000)
    assert (tmp_path / "a" / "dist" / "zerolake-0.tar.gz").read_bytes() != \
        (tmp_path / "b" / "dist" / "zerolake-0.tar.gz").read_bytes()       # sdist's own bytes differ
    digests = [subprocess.run([sys.executable, "-m", "operations.deploy.release", str(d)], capture_output=True,
                              text=True, check=True).stdout.strip() for d in (first, again, other)]
    assert digests[0] == digests[1] != digests[2] and re.fullmatch(r"[0-9a-f]{64}", digests[0])
    assert R.sha256_of(first / R.RELEASE_FILE) == digests[0]
    with tarfile.open(first / R.RELEASE_FILE) as tar:      # the members survive, the executable bit too
        member = tar.getmember("zerolake-0/operations/vm/install.sh")
        assert member.mode & 0o111 and tar.extractfile(member).read() == b"echo one\n"
    two = subprocess.run([sys.executable, "-m", "operations.deploy.release", str(tmp_path)], capture_output=True,
                         text=True)
    assert two.returncode == 2 and "holds 0 zerolake-*.tar.gz" in two.stderr


def _startup(tmp_path, package, sha256):
    env = {"PATH": os.environ["PATH"], "ZEROLAKE_ROLE": "worker", "ZEROLAKE_ROOT": "gs://b/run",
           "ZEROLAKE_PACKAGE": str(package), "ZEROLAKE_RELEASE_SHA256": sha256, "ZEROLAKE_ACCELERATOR": "cpu",
           "ZEROLAKE_PROCESSES": "1", "ZEROLAKE_ARGS": "", "ZEROLAKE_FOREGROUND": "1",
           "ZEROLAKE_PREFIX": str(tmp_path / "opt"), "ZEROLAKE_STATE": str(tmp_path / "state")}
    return subprocess.run([str(VM / "startup.sh")], capture_output=True, text=True, env=env, timeout=60)


def test_startup_refuses_a_doctored_release_in_one_line_before_running_anything(tmp_path):
    source = tmp_path / "zerolake-0" / "operations" / "vm"
    source.mkdir(parents=True)
    marker = tmp_path / "ran"
    for name in ("install.sh", "run-role.sh"):
        (source / name).write_text(f"#!/usr/bin/env bash\ntouch {shlex.quote(str(marker))}\n")
        (source / name).chmod(0o755)
    package = tmp_path / "zerolake.tar.gz"
    with tarfile.open(package, "w:gz") as tar:
        tar.add(tmp_path / "zerolake-0", arcname="zerolake-0")
    expected = hashlib.sha256(package.read_bytes()).hexdigest()
    with open(package, "ab") as f:         # doctored after the plan named it
        f.write(b"\0")
    actual = hashlib.sha256(package.read_bytes()).hexdigest()
    result = _startup(tmp_path, package, expected)
    assert result.returncode == 3, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert expected in line and actual in line and "refused" in line
    assert not marker.exists() and not (tmp_path / "opt" / "src").exists()      # nothing unpacked or run
    # The untouched release of that sha256 runs; a missing or malformed sha256 is refused before any download.
    with tarfile.open(package, "w:gz") as tar:
        tar.add(tmp_path / "zerolake-0", arcname="zerolake-0")
    good = _startup(tmp_path, package, hashlib.sha256(package.read_bytes()).hexdigest())
    assert good.returncode == 0 and marker.exists(), good.stderr
    for bad in ("", "abc", expected.upper()):
        result = _startup(tmp_path, package, bad)
        assert result.returncode == 2 and "metadata zerolake-release-sha256" in result.stderr


STAND_IN_PYTHON = """#!/usr/bin/env bash
if [[ $1 == setup.py ]]; then     # setup.py -q sdist --dist-dir DIR: a small sdist
  work=$(mktemp -d); mkdir -p "$work/zerolake-0"; echo "$RANDOM" > "$work/zerolake-0/PKG-INFO"
  touch -d @1000000 "$work/zerolake-0/PKG-INFO"; tar -czf "$5/zerolake-0.tar.gz" -C "$work" zerolake-0; exit 0
fi
exec {python} "$@"
""".format(python=shlex.quote(sys.executable))

CLOUD = r"""
[[ $* == *"storage cat"* ]] && { [[ -e "$(dirname "$0")/running" ]] && cat "$(dirname "$0")/running"; [[ -e "$(dirname "$0")/running" ]]; exit; }
if [[ $1 == storage && $2 == cp ]]; then
  for word in "$@"; do [[ -f $word ]] && echo "uploaded $(sha256sum "$word" | cut -d' ' -f1) to ${@: -2:1}" >> "$(dirname "$0")/uploads"; done
  exit 0
fi
[[ $* == *describe* ]] && exit 1
exit 0
"""


def _apply(tmp_path, capsys, running=None):
    python = tmp_path / "python"
    python.write_text(STAND_IN_PYTHON)
    python.chmod(0o755)
    script = plan_text(["plan", "--only", "package,trainer", "--trainer-cpu", "--python", str(python)] + BASE, capsys)
    folder, log = stand_in_gcloud(tmp_path / "bin", CLOUD)
    if running:
        (folder / "running").write_text(running + "\n")
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"})
    uploads = (folder / "uploads").read_text().splitlines() if (folder / "uploads").exists() else []
    return result, log.read_text().splitlines(), uploads


def test_the_release_is_uploaded_create_only_under_its_sha256_and_the_vms_are_told_that_sha256(tmp_path, capsys):
    result, calls, uploads = _apply(tmp_path, capsys)
    assert result.returncode == 0, result.stderr
    release = re.fullmatch(r"uploaded ([0-9a-f]{64}) to (\S+)", uploads[0])
    sha256, url = release.groups()
    assert url == f"gs://zl-test-bucket/zerolake-deploy/zerolake/releases/{sha256}.tar.gz"
    [cp] = [c for c in calls if c.startswith("storage cp --no-clobber")]
    assert cp.split()[-2] == url
    assert uploads[1] == f"uploaded {hashlib.sha256((sha256 + chr(10)).encode()).hexdigest()} to " \
                         "gs://zl-test-bucket/zerolake-deploy/zerolake/release"       # the deployment's release
    [create] = [c for c in calls if c.startswith("compute instances create zerolake-trainer")]
    metadata = dict(e.split("=", 1) for e in re.search(r"--metadata=(\S+)", create).group(1).split(","))
    assert metadata[S.RELEASE_METADATA] == sha256 and metadata["zerolake-package"] == url


def test_a_plan_of_another_release_than_the_deployment_runs_is_refused_in_one_line(tmp_path, capsys):
    result, calls, _ = _apply(tmp_path, capsys, running="0" * 64)
    assert result.returncode == 2
    [line] = [line for line in result.stderr.splitlines() if "error:" in line]
    assert "runs release " + "0" * 64 in line and "operations.deploy update" in line
    assert not any("instances create" in c for c in calls)


def _may(expression: str, name: str) -> bool:
    """Evaluate a bucket grant's condition (the CEL subset the plan writes) for one resource name."""
    python = (expression.replace("||", " or ").replace("&&", " and ").replace("!", " not ")
              .replace("resource.name.startsWith(", "name.startswith("))
    return eval(python, {"__builtins__": {}}, {"name": name})


@pytest.mark.parametrize("scenario", [["--workers", "2", "--trainer-tpu", "v5litepod-8"],
                                      ["--workers", "1", "--trainer-cpu", "--shuffle-runner", "local"]])
def test_no_role_account_can_write_a_release_and_every_role_can_read_them(scenario, capsys):
    script = plan_text(["plan"] + scenario + BASE, capsys)
    objects = "projects/_/buckets/zl-test-bucket/objects/"
    release = objects + f"zerolake-deploy/zerolake/releases/{RELEASE}.tar.gz"
    pointer = objects + "zerolake-deploy/zerolake/release"
    other = objects + f"zerolake-deploy/zerolake-b/releases/{RELEASE}.tar.gz"
    chunk = objects + "run1/" + layout.chunk_path(0, "worker", 0, 0)     # a lake object, the layout's spelling
    conditions = {}
    for words in gcloud_invocations(script):
        if words[:3] == ["storage", "buckets", "add-iam-policy-binding"]:
            flags = dict(w.split("=", 1) for w in words if w.startswith("--") and "=" in w)
            expression = re.search(r"expression=([^;]*)", flags.get("--condition", ""))
            conditions.setdefault(flags["--member"], []).append((flags["--role"], expression and expression.group(1)))
    for role in ("worker", "shuffle", "trainer"):
        grants = conditions[f"serviceAccount:{account(role)}"]
        writes = [c for r, c in grants if r == S.LAKE_WRITER_ROLE]
        assert writes and all(c for c in writes)                     # never unconditional
        assert not any(_may(c, name) for c in writes for name in (release, pointer, other)), role
        assert all(_may(c, chunk) for c in writes)
        reads = [c for r, c in grants if r == S.RELEASE_READER_ROLE]
        assert reads and all(_may(c, release) and not _may(c, pointer) and not _may(c, chunk) for c in reads)
        assert {r for r, _ in grants} == set(S.BUCKET_ROLES)
    # The follower's Dataflow jobs run as it and stage their files in the deploy area, outside the releases.
    follower = [c for r, c in conditions[f"serviceAccount:{account('shuffle')}"] if r == S.LAKE_WRITER_ROLE]
    uses_dataflow = "--shuffle-runner" not in scenario
    assert _may(follower[0], objects + "zerolake-deploy/zerolake/dataflow-tmp/x") == uses_dataflow
    # An earlier plan's unconditional grant is removed.
    removals = creates(script, ("storage", "buckets", "remove-iam-policy-binding"))
    assert {w[w.index("--condition=None") - 2] for w in removals} == {
        f"--member=serviceAccount:{account(r)}" for r in ("worker", "shuffle", "trainer")}


def test_a_root_inside_the_deploy_area_is_refused(capsys):
    from tests.operations.deploy.support import run_deploy
    code, out, err = run_deploy(["plan", "--project", "zl-test-project", "--root", "gs://zl-test-bucket/zerolake-deploy/x"],
                                capsys)
    assert code == 2 and out == "" and "--root" in err and "deploy area" in err


UPDATES = {"tpu-dataflow": ["update", "--workers", "3", "--trainer-tpu", "v5litepod-8"],
           "gpu-release": ["update", "--workers", "2", "--trainer-gpu", "nvidia-l4", "--release", RELEASE]}


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_the_update_plan_is_valid_bash(name, capsys, tmp_path):
    script = tmp_path / "update.sh"
    script.write_text(plan_text(UPDATES[name] + BASE, capsys))
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@needs_gcloud
def test_every_gcloud_command_of_an_update_is_documented(capsys, gcloud_help):
    problems = []
    for argv in UPDATES.values():
        for words in gcloud_invocations(plan_text(argv + BASE, capsys)):
            problems += check_invocation(words, gcloud_help)
    assert not problems, "\n".join(problems)


def test_update_moves_the_trainer_and_the_follower_before_the_workers(tmp_path, capsys):
    # The stand-in bucket holds one release, the bytes "release\n"; the image is built from it (its sha256 checked).
    release = hashlib.sha256(b"release\n").hexdigest()
    script = plan_text(UPDATES["gpu-release"][:-1] + [release] + BASE, capsys)
    template = next(line for line in script.splitlines() if line.startswith("zerolake_template=")) \
        .removeprefix("zerolake_template=").replace("${zerolake_release:0:12}", release[:12])
    assert "setup.py" not in script                  # --release: nothing is built
    folder, log = stand_in_gcloud(tmp_path / "bin", r"""
if [[ $1 == storage && $2 == cp && $3 == gs://* ]]; then echo release > "$4"; exit 0; fi
[[ $* == *"images describe"*"--format"* ]] && { echo sha256:feed; exit 0; }
[[ $* == *"images describe"* ]] && exit 1
[[ $* == *"instance-templates describe"* ]] && exit 1
exit 0
""")
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    calls = [c.split() for c in log.read_text().splitlines()]
    steps = [(c[2], c[3]) for c in calls if c[:2] == ["compute", "instances"] and c[2] in ("add-metadata", "stop",
                                                                                            "start")] + \
        [(c[2], c[3]) for c in calls if c[1] == "instance-templates" and c[2] == "create"] + \
        [(c[3], c[4]) for c in calls if c[1:4] == ["instance-groups", "managed", "rolling-action"]]
    assert any(c[:2] == ["builds", "submit"] for c in calls)     # that release's image, built from it
    assert steps == [("add-metadata", "zerolake-shuffle"), ("add-metadata", "zerolake-trainer"),
                     ("stop", "zerolake-shuffle"), ("stop", "zerolake-trainer"),
                     ("start", "zerolake-shuffle"), ("start", "zerolake-trainer"),
                     ("create", template), ("rolling-action", "start-update")]
    # ... and in that order in time: the group's update starts after the trainer and the follower started.
    index = {tuple(c[:4]): i for i, c in enumerate(calls)}
    assert index[("compute", "instances", "start", "zerolake-trainer")] < \
        index[("compute", "instance-templates", "create", template)] < \
        next(i for i, c in enumerate(calls) if c[3:5] == ["rolling-action", "start-update"])
    [rolling] = [c for c in calls if c[3:5] == ["rolling-action", "start-update"]]
    assert rolling[5] == "zerolake-workers" and f"--version=template={template}" in rolling
    [made] = [c for c in calls if c[1:3] == ["instance-templates", "create"]]
    assert "--provisioning-model=SPOT" in made      # the template: spot, and the new release in its metadata
    for call in calls:
        if "add-metadata" in call or call[1:3] == ["instance-templates", "create"]:
            text = " ".join(call)
            assert f"zerolake-release-sha256={release}" in text and f"releases/{release}.tar.gz" in text
            # The updated VMs pull the release's image by the digest the plan read, and install nothing.
            assert f"startup-script={S.IMAGE_STARTUP_SCRIPT}" in text
            assert f"{S.IMAGE_METADATA}=us-central1-docker.pkg.dev/zl-test-project/zerolake-images/zerolake-" in text
            assert f"@{VM_IMAGE_DIGEST}" in text
    follower = " ".join(next(c for c in calls if c[2:4] == ["add-metadata", "zerolake-shuffle"]))
    assert "--sdk_container_image=us-central1-docker.pkg.dev/zl-test-project/zerolake-images/dataflow-worker" \
           "@sha256:feed" in follower          # the follower's jobs: the image of the same release, by digest
    # The deployment's release is recorded before anything is rolled out.
    record = next(i for i, c in enumerate(calls) if c[:2] == ["storage", "cp"] and c[-2].endswith("/release"))
    assert record < next(i for i, c in enumerate(calls) if "add-metadata" in c)


def test_a_tpu_trainer_is_updated_in_place(capsys):
    script = plan_text(UPDATES["tpu-dataflow"] + BASE, capsys)
    [update] = creates(script, ("compute", "tpus", "tpu-vm", "update"))
    assert any(w.startswith("--update-metadata=") and S.RELEASE_METADATA in w for w in update)
    # A TPU VM of a queued request is not stopped and started: its start-up script runs again, while the
    # follower is stopped (a failed stop used to end the plan there, the follower down, the workers not rolled).
    assert "tpu-vm stop" not in script and "tpu-vm start" not in script
    order = [script.index(m) for m in ("tpu-vm update", "instances stop", "tpu-vm ssh", "instances start",
                                       "instance-templates create", "rolling-action start-update")]
    assert order == sorted(order)
    [rerun] = creates(script, ("compute", "tpus", "tpu-vm", "ssh"))
    assert "--command=sudo google_metadata_script_runner startup" in rerun and "--worker=all" in rerun
    assert metadata_of(plan_text(["plan", "--workers", "1", "--trainer-cpu"] + BASE, capsys))
    assert iam_grants(script)     # update also makes sure the image repository's grants are there


def test_a_tpu_trainer_that_fails_to_restart_leaves_the_run_going_and_exits_2(tmp_path, capsys):
    """The follower is started again and the workers are rolled; the plan then exits 2 naming the trainer."""
    release = hashlib.sha256(b"release\n").hexdigest()     # the bytes the stand-in's bucket holds
    script = plan_text(UPDATES["tpu-dataflow"] + ["--release", release] + BASE, capsys)
    folder, log = stand_in_gcloud(tmp_path / "bin", r"""
[[ $* == *"tpu-vm ssh"* ]] && exit 255
[[ $* == *"images describe"*"--format"* ]] && { echo sha256:feed; exit 0; }
[[ $* == *"storage cp gs://"* ]] && { echo release > "$4"; exit 0; }
exit 0
""")
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"})
    calls = log.read_text()
    assert result.returncode == 2 and "zerolake-trainer" in result.stderr.strip().splitlines()[-1]
    assert "instances start zerolake-shuffle" in calls and "rolling-action start-update" in calls
