"""The VMs run the release's image: nothing is installed at boot.

* Every Compute Engine VM and the worker template name the release's image by digest in their metadata
  (``zerolake-image``) and start operations/vm/startup-image.sh; the TPU trainer keeps startup.sh (pip).
* The image is built once per release and accelerator by Cloud Build from the release object itself.
* startup-image.sh, run against stand-in ``docker``, ``docker-credential-gcr``, ``curl`` and ``nvidia-smi``
  executables that record their argv: it pulls by digest, runs the role as the image runs it, and refuses in
  one line an image whose digest is not the metadata's, or an image named by a tag.
"""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from operations.deploy import steps as S
from tests.operations.deploy.support import BASE, RELEASE, REPO, VM, creates, plan_text

REPO_IMAGE = "us-central1-docker.pkg.dev/zl-test-project/zerolake-images/zerolake-"
DIGEST = "sha256:" + "ab" * 32

PLANS = {   # argv, and the VM images (accelerators) the plan builds
    "gpu-workers-tpu-trainer": (["--workers", "4", "--worker-gpu", "nvidia-l4", "--trainer-tpu", "v5litepod-8"],
                                ["cpu", "gpu"]),
    "cpu-workers-gpu-trainer": (["--workers", "2", "--trainer-gpu", "nvidia-l4"], ["cpu", "gpu"]),
    "cpu-workers-cpu-trainer-dataflow": (["--workers", "2", "--trainer-cpu", "--shuffle-runner", "dataflow"],
                                         ["cpu"]),
}


def _metadata(words: list[str]) -> str:
    return next(w for w in words if w.startswith("--metadata=")).removeprefix("--metadata=")


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_vm_names_the_release_image_by_digest_and_starts_no_install(name, capsys):
    argv, kinds = PLANS[name]
    script = plan_text(["plan", "--release", RELEASE] + argv + BASE, capsys)
    vms = creates(script, ("compute", "instances", "create")) + creates(script, ("compute", "instance-templates",
                                                                                  "create"))
    assert len(vms) >= 2
    for words in vms:
        kind = "gpu" if "zerolake-accelerator=gpu" in _metadata(words) else "cpu"
        entries = _metadata(words).split(",")
        assert f"{S.IMAGE_METADATA}={REPO_IMAGE}{kind}@${{zerolake_vm_image_{kind}}}" in entries, words[:4]
        assert f"--metadata-from-file=startup-script={S.IMAGE_STARTUP_SCRIPT}" in words, words[:4]
        # The digest is read (and a missing image stops the plan) before the VM or template is made.
        made = f"instances create {words[3]}" if words[1] == "instances" else "instance-templates create"
        assert script.index(f"zerolake_vm_image_{kind}=$(") < script.index(made)
    for words in creates(script, ("compute", "tpus", "queued-resources", "create")):
        assert f"--metadata-from-file=startup-script={S.STARTUP_SCRIPT}" in words     # TPU: pip at boot
        assert S.IMAGE_METADATA not in " ".join(words)
    # One build per accelerator the plan's VMs use, of the release object (checked against its sha256).
    assert kinds == sorted({"gpu" if "zerolake-accelerator=gpu" in _metadata(w) else "cpu" for w in vms})
    for kind in ("cpu", "gpu"):
        assert (f"--build-arg, 'ACCELERATOR={kind}', --tag, '{REPO_IMAGE}{kind}:release-$zerolake_release'"
                in script) == (kind in kinds)
    assert 'cp "$zerolake_release_file" "$zerolake_vm_context_cpu/zerolake.tar.gz"' in script
    assert "tar -xzf zerolake.tar.gz --strip-components=1" in script       # the release's own Dockerfile
    assert script.index("zerolake_got=$(sha256sum") < script.index("builds submit")


def test_the_generated_start_up_path_of_cpu_and_gpu_vms_installs_nothing():
    """startup-image.sh is every Compute Engine VM's start-up script: no pip, no install.sh, no apt."""
    code = [line for line in S.IMAGE_STARTUP_SCRIPT.read_text().splitlines() if not line.lstrip().startswith("#")]
    for word in ("pip", "install.sh", "apt-get", "venv"):
        assert not [line for line in code if re.search(rf"\b{re.escape(word)}\b", line)], word


# ---- startup-image.sh against stand-ins ------------------------------------------------------

STAND_INS = {
    # docker: logs its argv; `image inspect` prints the RepoDigests in the file repo-digests.
    "docker": 'echo "docker $*" >> "$CALLS"\n'
              'if [[ $1 == image && $2 == inspect ]]; then cat "$(dirname "$0")/repo-digests"; fi\n'
              'if [[ $1 == ps ]]; then echo old1; fi\n'
              "exit 0\n",
    "docker-credential-gcr": 'echo "docker-credential-gcr $*" >> "$CALLS"\n',
    "curl": 'echo "curl $*" >> "$CALLS"\nexit 22\n',              # no metadata server: settings come from env
    "nvidia-smi": 'echo "GPU 0: NVIDIA L4"\n',
}


def _startup_image(tmp_path, *, image: str, digests: str, accelerator="cpu", processes="1", role="worker",
                   logging="off"):
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, body in STAND_INS.items():
        (folder / name).write_text("#!/usr/bin/env bash\n" + body)
        (folder / name).chmod(0o755)
    (folder / "repo-digests").write_text(digests + "\n")
    calls = tmp_path / "calls"
    env = {"PATH": f"{folder}:{os.environ['PATH']}", "CALLS": str(calls), "ZEROLAKE_ROLE": role,
           "ZEROLAKE_ROOT": "gs://b/run", "ZEROLAKE_IMAGE": image, "ZEROLAKE_RELEASE_SHA256": "5e" * 32,
           "ZEROLAKE_ACCELERATOR": accelerator, "ZEROLAKE_PROCESSES": processes, "ZEROLAKE_ARGS": "--visits 8",
           "ZEROLAKE_STATE": str(tmp_path / "state"), "ZEROLAKE_DOCKER_HOME": str(tmp_path / "docker-home"),
           "ZEROLAKE_SPOOL_DEVICE": str(tmp_path / "no-such-disk"), "ZEROLAKE_PULL_RETRY_SECONDS": "1",
           "ZEROLAKE_LOGGING": logging}
    result = subprocess.run(["bash", str(VM / "startup-image.sh")], capture_output=True, text=True, env=env,
                            timeout=60)
    result.calls = calls.read_text().splitlines() if calls.exists() else []
    return result


def test_startup_image_pulls_by_digest_and_runs_each_process_as_the_image_runs_it(tmp_path):
    image = f"{REPO_IMAGE}gpu@{DIGEST}"
    result = _startup_image(tmp_path, image=image, digests=f"{REPO_IMAGE}gpu@{DIGEST}", accelerator="gpu",
                            processes="2")
    assert result.returncode == 0, result.stderr
    assert "docker-credential-gcr configure-docker --registries=us-central1-docker.pkg.dev" in result.calls
    assert f"docker pull {image}" in result.calls
    # The container of an earlier boot (Docker restarts it with its old image) is stopped before the pull.
    assert result.calls.index("docker stop --time=25 old1") < result.calls.index(f"docker pull {image}")
    runs = [c.split() for c in result.calls if c.startswith("docker run")]
    assert len(runs) == 2                                            # one container per worker process
    for index, run in enumerate(runs):
        assert run[-3:] == [image, "worker", str(index)]             # ENTRYPOINT run-role.sh's arguments
        assert {"--restart=always", "--stop-timeout=25", "--network=host", "--log-driver=journald", "--gpus"} <= set(run)
        assert f"{tmp_path / 'state'}:/var/lib/zerolake" in run      # the image's VOLUME, on the spool disk
        assert "ZEROLAKE_ACCELERATOR=gpu" in run and "ZEROLAKE_PROCESSES=2" in run
    assert "curl" in " ".join(result.calls)                          # the guest attribute reports progress


@pytest.mark.parametrize("role, unit, seconds", [("worker", "zerolake-worker@.service", 25),
                                                 ("shuffle", "zerolake-shuffle.service", 90),
                                                 ("trainer", "zerolake-trainer.service", 120)])
def test_startup_image_gives_each_role_its_own_stop_time(tmp_path, role, unit, seconds):
    """Every container got --stop-timeout=25: on update or down the follower (cancel its Dataflow job,
    delete its pieces, release its claim) and the trainer (upload a checkpoint) were killed mid-way.
    Each role gets what its systemd unit's TimeoutStopSec gives it."""
    assert f"TimeoutStopSec={seconds}\n" in (VM / "systemd" / unit).read_text()
    image = f"{REPO_IMAGE}cpu@{DIGEST}"
    result = _startup_image(tmp_path, image=image, digests=image, role=role)
    assert result.returncode == 0, result.stderr
    [run] = [c.split() for c in result.calls if c.startswith("docker run")]
    assert f"--stop-timeout={seconds}" in run and run[-2] == role
    assert f"docker stop --time={seconds} old1" in result.calls       # an earlier boot's container too


@pytest.mark.parametrize("logging, driver", [("on", "gcplogs"), ("all", "gcplogs"), ("off", "journald")])
def test_startup_image_sends_the_roles_output_to_cloud_logging_unless_logging_is_off(tmp_path, logging, driver):
    image = f"{REPO_IMAGE}cpu@{DIGEST}"
    result = _startup_image(tmp_path, image=image, digests=image, logging=logging)
    assert result.returncode == 0, result.stderr
    runs = [c.split() for c in result.calls if c.startswith("docker run")]
    assert runs and all(f"--log-driver={driver}" in run for run in runs)


def test_startup_image_refuses_a_logging_setting_it_does_not_know_in_one_line(tmp_path):
    result = _startup_image(tmp_path, image=f"{REPO_IMAGE}cpu@{DIGEST}", digests="", logging="verbose")
    assert result.returncode == 2 and not any(c.startswith("docker") for c in result.calls)
    assert result.stderr.strip().splitlines() == [
        "startup-image.sh: logging 'verbose' is not on, all or off (metadata zerolake-logging)"]


def test_startup_image_refuses_an_image_whose_digest_is_not_the_metadatas_in_one_line(tmp_path):
    other = "sha256:" + "cd" * 32
    result = _startup_image(tmp_path, image=f"{REPO_IMAGE}cpu@{DIGEST}", digests=f"{REPO_IMAGE}cpu@{other}")
    assert result.returncode == 3
    [line] = result.stderr.strip().splitlines()
    assert "refused" in line and "zerolake-image" in line and other in line
    assert not [c for c in result.calls if c.startswith("docker run")]


@pytest.mark.parametrize("image", [f"{REPO_IMAGE}cpu:latest", f"docker.io/library/python@{DIGEST}", ""])
def test_startup_image_refuses_an_image_not_pinned_by_digest_in_artifact_registry(tmp_path, image):
    result = _startup_image(tmp_path, image=image, digests="")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "metadata zerolake-image" in line
    assert not [c for c in result.calls if c.startswith("docker")]


def test_startup_image_is_valid_bash_and_in_the_sdist():
    assert os.access(S.IMAGE_STARTUP_SCRIPT, os.X_OK)
    assert subprocess.run(["bash", "-n", str(S.IMAGE_STARTUP_SCRIPT)]).returncode == 0


# ---- scripts/check_image.sh --entries: each role's entry as the image runs it ------------------

def _check_entries(tmp_path, dockerfile=None):
    env = {**os.environ}
    if dockerfile:
        env["ZEROLAKE_CHECK_DOCKERFILE"] = str(dockerfile)
    return subprocess.run([str(REPO / "scripts" / "check_image.sh"), "--entries", str(tmp_path / "entries")],
                          capture_output=True, text=True, timeout=900, env=env)


def test_check_image_runs_each_roles_entry_as_the_image_runs_it(tmp_path):
    """startup-image.sh's `docker run`, executed as Docker would in the image (ENTRYPOINT, ENV, VOLUME):
    the worker plays real games whose chunks verify, the follower and the trainer parse their flags."""
    result = _check_entries(tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    line = json.loads(result.stdout.strip().splitlines()[-1])
    assert line["ok"] and line["worker"] and line["shuffle"] and line["trainer"] and line["worker_chunks"] > 0
    assert line["unknown_role_exit"] == 2 and line["cmd"] == ["worker", "0"]


@pytest.mark.parametrize("broken", [
    ('ENTRYPOINT ["/opt/zerolake/src/operations/vm/run-role.sh"]',
     'ENTRYPOINT ["/opt/zerolake/src/operations/vm/no-such-entry.sh"]'),
    ('CMD ["worker", "0"]', 'CMD ["player", "0"]'),
])
def test_check_image_fails_when_an_entry_is_wrong(tmp_path, broken):
    dockerfile = tmp_path / "Dockerfile"
    text = (REPO / "Dockerfile").read_text()
    assert broken[0] in text
    dockerfile.write_text(text.replace(broken[0], broken[1]))
    result = _check_entries(tmp_path, dockerfile)
    assert result.returncode == 1
    assert json.loads(result.stdout.strip().splitlines()[-1])["ok"] is False
