"""The VMs run the release's image: nothing is installed at boot.

* Every Compute Engine VM and the worker template name the release's image by digest in their metadata
  (``zerolake-image``) and start operations/vm/startup-image.sh; the TPU trainer keeps startup.sh (pip).
* The image is built once per release and accelerator by Cloud Build from the release object itself.
* startup-image.sh, run against stand-in ``docker``, ``docker-credential-gcr``, ``curl``, ``cos-extensions``,
  ``mount`` and ``nvidia-smi`` executables that record their argv: it pulls by digest, runs the role as the
  image runs it (on a GPU VM with the devices and driver folders Container-Optimized OS's GPU page passes),
  and refuses in one line (a guest attribute, exit 4) a VM without Docker, a GPU VM whose driver does not
  install or whose GPU neither the VM nor the image sees, an image whose digest is not the metadata's, or an
  image named by a tag.
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
    # docker: logs its argv; `image inspect` prints the RepoDigests in the file repo-digests; `run --rm`
    # (the GPU check inside the image) prints the file container-gpus.
    "docker": 'echo "docker $*" >> "$CALLS"\n'
              'if [[ $1 == image && $2 == inspect ]]; then cat "$(dirname "$0")/repo-digests"; fi\n'
              'if [[ $1 == ps ]]; then echo old1; fi\n'
              'if [[ $1 == run && $2 == --rm ]]; then cat "$(dirname "$0")/container-gpus"; fi\n'
              "exit 0\n",
    "docker-credential-gcr": 'echo "docker-credential-gcr $*" >> "$CALLS"\n',
    "curl": 'echo "curl $*" >> "$CALLS"\nexit 22\n',              # no metadata server: settings come from env
    # cos-extensions: fails while the file driver-failures holds a count above 0 (one less each call).
    "cos-extensions": 'echo "cos-extensions $*" >> "$CALLS"\nf="$(dirname "$0")/driver-failures"\n'
                      'n=$(cat "$f" 2>/dev/null || echo 0); if (( n > 0 )); then echo $((n - 1)) > "$f"; exit 1; fi\n',
    "mount": 'echo "mount $*" >> "$CALLS"\n',
    "mountpoint": "exit 1\n",
}


def _startup_image(tmp_path, *, image: str, digests: str, accelerator="cpu", processes="1", role="worker",
                   logging="off", gpus="GPU 0: NVIDIA L4 (UUID: GPU-1)", container_gpus="GPU 0: NVIDIA L4",
                   driver_failures=0, without=(), health_port=""):
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, body in STAND_INS.items():
        if name not in without:
            (folder / name).write_text("#!/usr/bin/env bash\n" + body)
            (folder / name).chmod(0o755)
    (folder / "repo-digests").write_text(digests + "\n")
    (folder / "container-gpus").write_text(container_gpus + "\n")
    (folder / "driver-failures").write_text(f"{driver_failures}\n")
    nvidia = tmp_path / "nvidia"                      # what cos-extensions installs: bin/nvidia-smi, lib64/
    (nvidia / "bin").mkdir(parents=True, exist_ok=True)
    (nvidia / "lib64").mkdir(exist_ok=True)
    (nvidia / "bin" / "nvidia-smi").write_text(f"#!/usr/bin/env bash\necho '{gpus}'\n")
    (nvidia / "bin" / "nvidia-smi").chmod(0o755)
    devices = tmp_path / "dev"
    devices.mkdir(exist_ok=True)
    for device in ("nvidia0", "nvidiactl", "nvidia-uvm"):
        (devices / device).touch()
    calls = tmp_path / "calls"
    # /usr/local/bin (a real docker, here) stays out of PATH: the stand-ins are the only tools of that name.
    env = {"PATH": f"{folder}:/usr/bin:/bin", "CALLS": str(calls), "ZEROLAKE_ROLE": role,
           "ZEROLAKE_NVIDIA_DIR": str(nvidia), "ZEROLAKE_DEVICE_DIR": str(devices),
           "ZEROLAKE_DRIVER_RETRY_SECONDS": "0", "ZEROLAKE_HEALTH_PORT": health_port,
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
                            processes="2", health_port="8420")
    assert result.returncode == 0, result.stderr
    assert "docker-credential-gcr configure-docker --registries=us-central1-docker.pkg.dev" in result.calls
    assert f"docker pull {image}" in result.calls
    # The container of an earlier boot (Docker restarts it with its old image) is stopped before the pull.
    assert result.calls.index("docker stop --time=25 old1") < result.calls.index(f"docker pull {image}")
    # Container-Optimized OS's driver, installed, its folder made executable, before anything is pulled.
    assert "cos-extensions install gpu" in result.calls
    assert f"mount -o remount,exec {tmp_path / 'nvidia'}" in result.calls
    assert result.calls.index("cos-extensions install gpu") < result.calls.index(f"docker pull {image}")
    [check] = [c.split() for c in result.calls if c.startswith("docker run --rm")]
    assert check[check.index("--entrypoint") + 1:] == ["nvidia-smi", image, "-L"]
    runs = [c.split() for c in result.calls if c.startswith("docker run -d")]
    assert len(runs) == 2                                            # one container per worker process
    for index, run in enumerate(runs):
        assert run[-3:] == [image, "worker", str(index)]             # ENTRYPOINT run-role.sh's arguments
        assert {"--restart=always", "--stop-timeout=25", "--network=host", "--log-driver=local"} <= set(run)
        assert "--gpus" not in run                                   # no NVIDIA container toolkit on the VM
        # The run-gpus page's flags: every device file, the driver's libraries and tools, where CUDA finds them.
        devices = {run[i + 1] for i, word in enumerate(run) if word == "--device"}
        assert devices == {f"{tmp_path / 'dev' / d}:/dev/{d}" for d in ("nvidia0", "nvidiactl", "nvidia-uvm")}
        assert f"{tmp_path / 'nvidia' / 'lib64'}:/usr/local/nvidia/lib64" in run
        assert f"{tmp_path / 'nvidia' / 'bin'}:/usr/local/nvidia/bin" in run
        assert "LD_LIBRARY_PATH=/usr/local/nvidia/lib64" in run
        assert devices == {check[i + 1] for i, word in enumerate(check) if word == "--device"}   # as the check
        assert f"{tmp_path / 'state'}:/var/lib/zerolake" in run      # the image's VOLUME, on the spool disk
        assert "ZEROLAKE_ACCELERATOR=gpu" in run and "ZEROLAKE_PROCESSES=2" in run
        assert "ZEROLAKE_HEALTH_PORT=8420" in run                    # run-role.sh gives it to process 0
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


@pytest.mark.parametrize("logging, driver", [("on", "json-file"), ("all", "json-file"), ("off", "local")])
def test_startup_image_writes_what_the_cos_logging_agent_ships_unless_logging_is_off(tmp_path, logging, driver):
    # Container-Optimized OS's agent ships the json-file driver's lines (a JSON line's fields as fields).
    image = f"{REPO_IMAGE}cpu@{DIGEST}"
    result = _startup_image(tmp_path, image=image, digests=image, logging=logging)
    assert result.returncode == 0, result.stderr
    runs = [c.split() for c in result.calls if c.startswith("docker run")]
    assert runs and all(f"--log-driver={driver}" in run for run in runs)
    assert all(("--log-opt" in run) == (driver == "json-file") for run in runs)     # rotated on the VM


@pytest.mark.parametrize("case, settings, state, words", [
    ("no docker", dict(without=("docker",)), "no-docker", ["has no docker", "Container-Optimized OS"]),
    ("no cos-extensions", dict(accelerator="gpu", without=("cos-extensions",)), "no-gpu-runtime",
     ["no cos-extensions", "--gpu-image"]),
    ("the driver never installs", dict(accelerator="gpu", driver_failures=3), "gpu-driver-failed",
     ["failed 3 times"]),
    ("the VM sees no GPU", dict(accelerator="gpu", gpus="No devices were found"), "no-gpu",
     ["sees no GPU", "No devices were found"]),
    ("the image sees no GPU", dict(accelerator="gpu", container_gpus="Failed to initialize NVML"), "gpu-unusable",
     ["container sees no GPU", "Failed to initialize NVML"]),
])
def test_a_vm_that_cannot_run_its_role_says_why_in_one_line_and_a_guest_attribute(tmp_path, case, settings,
                                                                                   state, words):
    kind = settings.get("accelerator", "cpu")
    image = f"{REPO_IMAGE}{kind}@{DIGEST}"
    result = _startup_image(tmp_path, image=image, digests=image, **settings)
    assert result.returncode == 4, (case, result.stderr)
    [line] = [line for line in result.stderr.splitlines() if line.startswith("startup-image.sh:")]
    assert all(word in line for word in words), line
    assert any(f"--data {state} " in call for call in result.calls if call.startswith("curl")), result.calls
    assert not [c for c in result.calls if c.startswith("docker run -d")]      # no role started


def test_the_driver_install_is_tried_again_and_only_workers_get_the_health_port(tmp_path):
    image = f"{REPO_IMAGE}gpu@{DIGEST}"
    result = _startup_image(tmp_path, image=image, digests=image, accelerator="gpu", driver_failures=2,
                            role="trainer", health_port="8420")
    assert result.returncode == 0, result.stderr
    assert result.calls.count("cos-extensions install gpu") == 3
    [run] = [c.split() for c in result.calls if c.startswith("docker run -d")]
    assert "ZEROLAKE_HEALTH_PORT=8420" not in run


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
