"""What runs on the VMs (operations/vm/, the Dockerfiles): scripts, systemd units, images and their pins.

* The start-up scripts pass ``bash -n`` and the systemd units pass
  ``systemd-analyze verify``; the worker stops within a spot VM's notice.
* run-role.sh gives each role its command line; the start-up script retries a
  failed install until it succeeds.
* The images: two stages, unprivileged, every package pinned, the Dataflow
  image Beam's own; the sdist carries every VM file.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time

import pytest

from operations.deploy import steps as S
from tests.operations.deploy.support import REPO, VM, run_role


@pytest.mark.parametrize("script", ["install.sh", "startup.sh", "startup-image.sh", "run-role.sh", "ship-logs.sh"])
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

LOGGING_UNIT = "zerolake-logging.service"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_units_verify(tmp_path):
    """systemd-analyze verify of every unit, with ExecStart pointed at this checkout's scripts (verify checks
    that the command exists; on a VM it is /opt/zerolake/src/...).  No keeper unit is left: the worker group
    restarts preempted workers."""
    assert sorted(p.name for p in (VM / "systemd").iterdir()) == sorted(ROLE_UNITS + [LOGGING_UNIT])
    units = []
    for unit in sorted((VM / "systemd").iterdir()):
        text = unit.read_text()
        if unit.name in ROLE_UNITS:
            assert "Restart=always" in text and "StandardOutput=journal" in text and "KillSignal=SIGTERM" in text
            assert "ExecStart=/opt/zerolake/src/operations/vm/run-role.sh" in text
        else:                                # retried until the Ops Agent installs, never holding up a role
            assert "Restart=on-failure" in text and "RestartSec=120" in text and "StartLimitIntervalSec=0" in text
            assert "ExecStart=/opt/zerolake/src/operations/vm/ship-logs.sh ${ZEROLAKE_LOGGING}\n" in text
        text = text.replace("/opt/zerolake/src/operations/vm/", f"{VM}/")
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
    # Python 3.10: Ubuntu 22.04, the TPU VM base images; 3.11: Debian 12, the Docker
    # images.  A package left unpinned for one of them installs whatever PyPI has that day.
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    pins = _pins_for(python_version)
    wanted = [Requirement(r) for r in _setup_literal("INSTALL_REQUIRES")]
    wanted += [Requirement(r) for flavour in ("cpu", "gpu") for r in _setup_literal("TENSORFLOW_BY_ACCELERATOR")[flavour]]
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"operations/vm/constraints.txt pins no {name} for Python {python_version}"
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
    text = S.DATAFLOW_DOCKERFILE.read_text()
    python = re.search(r"^FROM apache/beam_python(3\.[0-9]+)_sdk:\$\{BEAM_VERSION\}$", text, re.M)
    assert python, "operations/dataflow/Dockerfile does not start from Beam's own Python SDK image"
    beam = _pins_for(python.group(1)).get("apache-beam")
    assert beam, f"operations/vm/constraints.txt pins no apache-beam for Python {python.group(1)}"
    assert f"ARG BEAM_VERSION={beam}" in text
    assert "ENTRYPOINT" not in text            # Beam's boot stays the entrypoint Dataflow starts


def test_startup_retries_a_failed_install_until_it_succeeds_and_then_starts_the_role(tmp_path):
    """The package is missing at boot (a download that failed) and appears later: the start-up script keeps
    trying, never leaving the VM idle, installs it, and starts the role.  Foreground mode, unprivileged: a stand-in
    sdist whose install.sh and run-role.sh only say that they ran."""
    import tarfile
    import threading

    source = tmp_path / "sdist" / "zerolake-0"
    (source / "operations" / "vm").mkdir(parents=True)
    for script, text in (("install.sh", "echo \"stand-in install $*\"\n"),
                         ("run-role.sh", "echo \"stand-in role $1 $2 root=$ZEROLAKE_ROOT\"\n")):
        path = source / "operations" / "vm" / script
        path.write_text("#!/usr/bin/env bash\n" + text)
        path.chmod(0o755)
    package = tmp_path / "zerolake.tar.gz"
    with tarfile.open(tmp_path / "pending.tar.gz", "w:gz") as tar:
        tar.add(source, arcname="zerolake-0")
    release = hashlib.sha256((tmp_path / "pending.tar.gz").read_bytes()).hexdigest()

    def publish_later():
        time.sleep(2.5)
        os.replace(tmp_path / "pending.tar.gz", package)

    env = {"PATH": os.environ["PATH"], "ZEROLAKE_ROLE": "worker", "ZEROLAKE_ROOT": "gs://b/run",
           "ZEROLAKE_PACKAGE": str(package), "ZEROLAKE_ACCELERATOR": "cpu", "ZEROLAKE_PROCESSES": "1",
           "ZEROLAKE_ARGS": "", "ZEROLAKE_FOREGROUND": "1", "ZEROLAKE_PREFIX": str(tmp_path / "opt"),
           "ZEROLAKE_STATE": str(tmp_path / "state"), "ZEROLAKE_INSTALL_RETRY_SECONDS": "1",
           "ZEROLAKE_RELEASE_SHA256": release}
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


def test_startup_mounts_the_spool_disk_and_formats_it_only_when_it_is_blank(tmp_path):
    """A worker of the group has the stateful disk zerolake-spool: startup.sh mounts it at the state folder
    (the spools) before the role starts, formats it only when blkid finds no file system (a new disk; a
    recreated VM gets its old one, spool and all), and records it in fstab once.  Stand-ins for blkid,
    mkfs.ext4, mount and mountpoint log their calls; foreground mode, unprivileged."""
    import tarfile

    source = tmp_path / "sdist" / "zerolake-0" / "operations" / "vm"
    source.mkdir(parents=True)
    for script in ("install.sh", "run-role.sh"):
        (source / script).write_text("#!/usr/bin/env bash\necho \"stand-in $*\"\n")
        (source / script).chmod(0o755)
    package = tmp_path / "zerolake.tar.gz"
    with tarfile.open(package, "w:gz") as tar:
        tar.add(tmp_path / "sdist" / "zerolake-0", arcname="zerolake-0")
    formatted, log = tmp_path / "formatted", tmp_path / "calls"
    tools = {"blkid": f'echo "blkid $*" >> {log}\n[[ -e {formatted} ]] || exit 2\n[[ $* == *UUID* ]] && echo 0f-uuid\nexit 0\n',
             "mkfs.ext4": f'echo "mkfs.ext4 $*" >> {log}\ntouch {formatted}\n',
             "mount": f'echo "mount $*" >> {log}\n', "mountpoint": "exit 1\n"}
    (tmp_path / "bin").mkdir()
    for name, body in tools.items():
        (tmp_path / "bin" / name).write_text("#!/usr/bin/env bash\n" + body)
        (tmp_path / "bin" / name).chmod(0o755)
    disk, fstab, state = tmp_path / "google-zerolake-spool", tmp_path / "fstab", tmp_path / "state"
    disk.touch()
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "ZEROLAKE_ROLE": "worker", "ZEROLAKE_ROOT": "gs://b/run",
           "ZEROLAKE_PACKAGE": str(package), "ZEROLAKE_FOREGROUND": "1", "ZEROLAKE_PREFIX": str(tmp_path / "opt"),
           "ZEROLAKE_STATE": str(state), "ZEROLAKE_RELEASE_SHA256": hashlib.sha256(package.read_bytes()).hexdigest(),
           "ZEROLAKE_SPOOL_DEVICE": str(disk), "ZEROLAKE_FSTAB": str(fstab)}
    for boot in (1, 2):                           # a new disk, then the same disk on a recreated VM
        result = subprocess.run([str(VM / "startup.sh")], capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.splitlines()[-1] == "stand-in worker 0"       # the role ran after the mount
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls if c.split()[0] in ("mkfs.ext4", "mount")] == ["mkfs.ext4", "mount", "mount"]
    assert f"mount -o discard,defaults {disk} {state}" in calls
    assert fstab.read_text() == f"UUID=0f-uuid {state} ext4 discard,defaults,nofail 0 2\n"      # once
    # Without the disk (the trainer, the follower) nothing is mounted.
    disk.unlink()
    log.unlink()
    result = subprocess.run([str(VM / "startup.sh")], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0 and not log.exists(), result.stderr


def test_the_sdist_carries_every_vm_file():
    """startup.sh installs the units and runs the scripts from the unpacked sdist: MANIFEST.in must take them."""
    import fnmatch

    patterns = re.search(r"^recursive-include operations/vm (.+)$", (REPO / "MANIFEST.in").read_text(), re.M)
    assert patterns, "MANIFEST.in has no `recursive-include operations/vm` line"
    missing = [str(path.relative_to(REPO)) for path in sorted(VM.rglob("*")) if path.is_file()
               and not any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns.group(1).split())]
    assert not missing, f"MANIFEST.in leaves these out of the sdist: {missing}"
