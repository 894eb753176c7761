"""A TPU trainer that TensorFlow can see, and the zones Google lists.

* For every generation of operations/deploy/zones.py's one table, the plan boots
  the base software version the table names (one with no TensorFlow of its own,
  as Google's TensorFlow TPU tests boot before they pip-install tensorflow-tpu),
  and tells the VM its generation; run-role.sh then exports exactly that row's
  environment (PJRT_DEVICE, NEXT_PLUGGABLE_DEVICE_USE_C_API, and
  TF_PLUGGABLE_DEVICE_LIBRARY_PATH pointing at the venv's libtpu.so) to every
  role on a TPU VM, and nothing of it elsewhere.
* A generation with no documented TensorFlow path, or a multi-host slice, is
  refused naming the page (tests/operations/deploy/test_plan.py, with the other refusals).
* The trainer's TensorFlow pin does not move (tensorflow-tpu 2.20, installed
  with Google's libtpu index as a source, as those tests install it): a SavedModel exported by TensorFlow 2.20
  through model.export (tests/data/savedmodel-tf2.20, made by
  tests/tf_compat_fixture.py) is published and loaded by the workers'
  TensorFlow here and gives the outputs 2.20 gave.
* Zones: the AI zones the page lists for v6e pass the table; --no-check-zones
  also lifts the zone-name check.
"""
from __future__ import annotations

import json
import pathlib
import re
import shutil

import numpy as np
import pytest

from operations.deploy import zones
from tests.operations.deploy.support import (BASE, REPO, creates, metadata_of, plan_text, role_environment, run_deploy,
                                             run_role, run_role_process)

FIXTURE = REPO / "tests" / "data" / "savedmodel-tf2.20"
BASE_IMAGES = {"tpu-ubuntu2204-base", "v2-alpha-tpuv5-lite", "v2-alpha-tpuv5", "v2-alpha-tpuv6e"}
"""The base software versions of https://cloud.google.com/tpu/docs/runtimes, as Google's TensorFlow TPU tests
name them (ml-auto-solutions, dags/vm_resource.py RuntimeVersion)."""


@pytest.fixture
def libtpu(tmp_path) -> pathlib.Path:
    """A stand-in libtpu package (what pip's libtpu installs: libtpu/__init__.py and libtpu/libtpu.so)."""
    package = tmp_path / "site" / "libtpu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "libtpu.so").write_bytes(b"")
    return package / "libtpu.so"


@pytest.mark.parametrize("generation", sorted(zones.TPU_GENERATIONS))
def test_each_generation_boots_its_base_image_and_gets_its_pjrt_environment(generation, capsys, tmp_path,
                                                                                   libtpu):
    row = zones.TPU_GENERATIONS[generation]
    tpu, zone = f"{generation}-8", row.zones[0]
    script = plan_text(["plan", "--only", "trainer", "--trainer-tpu", tpu, "--trainer-zone", zone] + BASE, capsys)
    [create] = creates(script, ("compute", "tpus", "queued-resources", "create"))
    assert f"--runtime-version={row.runtime}" in create and f"--accelerator-type={tpu}" in create
    # A base image (no framework of its own, single host): not a tpu-vm-tf-* image, whose TensorFlow would sit
    # beside the pinned one, nor a -pod image.
    assert row.runtime in BASE_IMAGES and not re.search(r"tf|pod", row.runtime)
    assert "zerolake-tpu-generation=" + generation in metadata_of(script)["zerolake-trainer"].split(",")
    assert {zones.TPU_RUNTIMES_SOURCE, zones.TPU_ZONES_SOURCE, zones.TF_INSTALL_SOURCE} <= set(row.documented_by)

    # On the VM: run-role.sh exports the row's environment before the trainer (or a TPU worker) starts.
    expected = {name: str(libtpu) if value == zones.LIBTPU else value for name, value in row.environment}
    assert expected == {"PJRT_DEVICE": "TPU", "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
                        "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": str(libtpu)}
    pythonpath = f"{REPO}:{libtpu.parent.parent}"
    for role, argv_head in (("trainer", ["-m", "model.train"]), ("worker", ["-m", "selfplay.worker"])):
        argv = run_role(tmp_path, role, accelerator="tpu", ZEROLAKE_TPU_GENERATION=generation, PYTHONPATH=pythonpath)
        assert argv[:2] == argv_head
        env = role_environment(tmp_path)
        assert {name: env.get(name) for name in expected} == expected, role
    assert argv[argv.index("--device") + 1] == "tpu"


def test_the_strategy_follows_the_accelerator_and_only_a_tpu_vm_gets_the_pjrt_environment(tmp_path, libtpu):
    pythonpath = f"{REPO}:{libtpu.parent.parent}"
    argv = run_role(tmp_path, "trainer", accelerator="tpu", ZEROLAKE_TPU_GENERATION="v5litepod", PYTHONPATH=pythonpath)
    assert argv[argv.index("--strategy") + 1] == "tpu"        # never the host CPU while the TPU is billed
    gpu = run_role(tmp_path, "trainer", accelerator="gpu", PYTHONPATH=pythonpath)
    assert gpu[gpu.index("--strategy") + 1] == "gpu"
    assert not {"PJRT_DEVICE", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH"} & set(role_environment(tmp_path))
    assert "--strategy" not in run_role(tmp_path, "trainer", accelerator="cpu")


def test_a_tpu_vm_without_its_generation_or_its_libtpu_says_so_in_one_line(tmp_path):
    missing = run_role_process(tmp_path, "trainer", accelerator="tpu")
    assert missing.returncode != 0 and "ZEROLAKE_TPU_GENERATION is not set" in missing.stderr
    no_libtpu = run_role_process(tmp_path, "trainer", accelerator="tpu", ZEROLAKE_TPU_GENERATION="v6e")
    [line] = no_libtpu.stderr.strip().splitlines()
    assert no_libtpu.returncode == 2 and "no libtpu.so" in line and "install.sh --accelerator tpu" in line
    unknown = run_role_process(tmp_path, "trainer", accelerator="tpu", ZEROLAKE_TPU_GENERATION="v9x")
    assert unknown.returncode == 2 and "'v9x' is not in operations/deploy/zones.py" in unknown.stderr
    assert not (tmp_path / "role-env").exists()            # the role never started without its environment


def test_a_savedmodel_published_by_the_tpu_trainers_tensorflow_loads_in_the_workers(tmp_path):
    """tensorflow-tpu 2.20 (the trainer, setup.py) -> the workers' TensorFlow (2.21 on Debian 12 CPU VMs)."""
    import tensorflow as tf

    from cloud.storage import open_storage
    from format.registry import publish_model
    from inference.model_files import load_model
    from inference.evaluator import ModelEvaluator

    exported_by = json.loads((FIXTURE / "exported_by.json").read_text())
    assert exported_by["tensorflow"] == "2.20.0"
    setup = (REPO / "setup.py").read_text()
    assert '"tensorflow-tpu==2.20.0"' in setup           # the trainer's pin the fixture stands for
    saved = tmp_path / "export"
    shutil.copytree(FIXTURE / "saved_model", saved)
    storage = open_storage(str(tmp_path / "lake"))
    publish_model(storage, 1, str(saved), {"board_size": exported_by["network"]["board_size"]})
    model = load_model(storage, 1, str(tmp_path / "cache"))
    expected = np.load(FIXTURE / "expected.npz")
    outputs = model(expected["planes"])
    for name in ("policy_logits", "value", "ownership", "score"):
        np.testing.assert_allclose(outputs[name], expected[name], rtol=1e-4, atol=1e-5, err_msg=name)
    policy, value = ModelEvaluator(model, devices=[])(expected["planes"])     # the worker's own call
    np.testing.assert_allclose(policy, expected["policy_logits"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(value, expected["value"].reshape(-1), rtol=1e-4, atol=1e-5)
    assert tf.__version__ != exported_by["tensorflow"], "this checks nothing where the workers' TensorFlow is 2.20"


@pytest.mark.parametrize("zone", ["us-central1-ai1", "us-south1-ai1b"])
def test_the_ai_zones_google_lists_for_v6e_are_accepted(zone, capsys):
    script = plan_text(["plan", "--only", "trainer", "--trainer-tpu", "v6e-8", "--trainer-zone", zone] + BASE, capsys)
    [create] = creates(script, ("compute", "tpus", "queued-resources", "create"))
    assert f"--zone={zone}" in create


def test_no_check_zones_overrides_the_table_and_the_zone_names_shape(capsys):
    code, out, err = run_deploy(["plan", "--trainer-tpu", "v5litepod-8", "--trainer-zone", "us-central1-ai1"] + BASE,
                                capsys)
    assert code == 2 and "us-central1-ai1 has no v5litepod-8" in err
    code, out, err = run_deploy(["plan", "--trainer-zone", "us-central1-x-y", "--trainer-cpu"] + BASE, capsys)
    assert code == 2 and "--trainer-zone: 'us-central1-x-y' is not a zone" in err and "--no-check-zones" in err
    for zone in ("us-central1-ai1", "us-central1-x-y"):
        script = plan_text(["plan", "--only", "trainer", "--trainer-tpu", "v5litepod-8", "--trainer-zone", zone,
                            "--no-check-zones"] + BASE, capsys)
        assert f"--zone={zone}" in creates(script, ("compute", "tpus", "queued-resources", "create"))[0]


@pytest.mark.parametrize("accelerator", ["tpu", "cpu"])
def test_install_looks_up_libtpu_in_googles_index_on_a_tpu_vm_only(accelerator, tmp_path):
    # A stand-in python3 that records each pip call (and whose venv is this folder): install.sh on a TPU VM
    # adds Google's libtpu index as a source, as Google's TensorFlow TPU tests install tensorflow-tpu.
    import subprocess
    calls = tmp_path / "calls"
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n'
                      'if [[ $1 == -m && $2 == venv ]]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; fi\n'
                      'if [[ $* == *"pip"*" show "* ]]; then exit 1; fi\n')
    python.chmod(0o755)
    done = subprocess.run(["bash", str(REPO / "operations" / "vm" / "install.sh"), "--accelerator", accelerator,
                           "--package", str(REPO), "--prefix", str(tmp_path / "opt")],
                          env={"PATH": f"{python.parent}:/usr/bin:/bin", "ZEROLAKE_SKIP_APT": "1"},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    [install] = [line for line in calls.read_text().splitlines() if line.endswith(str(REPO))]
    assert (f"--find-links {zones.LIBTPU_INDEX}" in install) == (accelerator == "tpu"), install
