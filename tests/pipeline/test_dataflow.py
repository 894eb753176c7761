"""The package Dataflow gets: the job graph under DataflowRunner, and the sdist that --setup_file stages.

On Dataflow, Beam runs ``python setup.py sdist`` in the folder of
``--setup_file`` and every worker pip-installs that sdist, compiling the
Cython extensions there.  Nothing here reaches Google:

* the shuffle job's graph is built and translated into a Dataflow job with
  ``--runner DataflowRunner --dry_run`` (Beam stops right before submitting);
* the sdist is built from a copy of the checkout and must hold every
  ``.pyx``/``.pxd`` the build compiles, setup.py, pyproject.toml and the VM
  scripts;
* (slow) a fresh virtual environment installs ONLY that sdist (``pip install
  --no-deps --no-build-isolation``; its dependencies come from the project's
  .venv through a ``.pth`` line, which does not carry the checkout's editable
  install), and runs the shuffle job on a small lake from another working
  directory, importing nothing from the checkout.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tarfile

import numpy as np
import pytest

from format import layout
from tests.pipeline.support import write_chunk, write_run_json
from testdata.synthetic_games import synthetic_game

REPO = pathlib.Path(__file__).resolve().parents[2]
IGNORED = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.so", "*.egg-info", "__pycache__", "lake",
                                 "cluster-state", ".pytest_cache", ".hypothesis", "tests")


def small_lake(root: pathlib.Path) -> str:
    write_run_json(str(root), 9)
    rng = np.random.default_rng(7)
    for seq in range(3):
        write_chunk(str(root), 0, [synthetic_game(rng, 9, visits=16, generation=0) for _ in range(6)], seq)
    return str(root)


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> pathlib.Path:
    """The sdist, built as Beam builds it for --setup_file (from a copy: the checkout's build/ stays as it is)."""
    work = tmp_path_factory.mktemp("sdist")
    shutil.copytree(REPO, work / "src", ignore=IGNORED)
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(work / "dist")], cwd=work / "src",
                   check=True, capture_output=True)
    [archive] = (work / "dist").glob("zerolake-*.tar.gz")
    return archive


def test_the_sdist_holds_what_a_dataflow_worker_compiles(sdist):
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    needed = {"setup.py", "pyproject.toml", "MANIFEST.in", "operations/vm/install.sh", "operations/vm/startup.sh",
              "operations/vm/run-role.sh", "operations/vm/constraints.txt", "operations/vm/systemd/zerolake-worker@.service"}
    for package in ("selfplay", "pipeline", "format", "model", "cloud", "testdata"):
        for path in (REPO / package).rglob("*"):
            if path.suffix in (".pyx", ".pxd", ".py") and "__pycache__" not in path.parts:
                needed.add(str(path.relative_to(REPO)))
    missing = sorted(needed - names)
    assert not missing, f"missing from {sdist.name}: {missing}"
    assert not [n for n in names if n.endswith(".so") or n.startswith("tests/")]


def test_the_job_graph_builds_for_dataflow(tmp_path):
    """prepare + ShuffleWindow under DataflowRunner options, translated into a Dataflow job, not submitted."""
    import apache_beam as beam

    from cloud.storage import open_storage
    from pipeline.config import ShuffleConfig
    from pipeline.shuffle import pipeline_options, prepare
    from pipeline.transforms import ShuffleWindow

    root = small_lake(tmp_path / "lake")
    config = ShuffleConfig(root=root, workers=1, window_min_positions=100)
    context, bundles = prepare(config, open_storage(root))
    options, runner = pipeline_options(config, [
        "--runner", "DataflowRunner", "--project", "zl-test-project", "--region", "us-central1",
        "--temp_location", "gs://zl-test-bucket/zerolake-deploy/zerolake/dataflow-tmp",
        "--staging_location", "gs://zl-test-bucket/zerolake-deploy/zerolake/dataflow-staging",
        "--setup_file", str(REPO / "setup.py"), "--dry_run", "True"])
    assert runner == "DataflowRunner"
    pipeline = beam.Pipeline(options=options)
    _ = pipeline | "Window bundles" >> beam.Create(bundles) | "Shuffle window" >> ShuffleWindow(context)
    result = pipeline.run()
    job = result.job.proto
    assert job.name and "JOB_TYPE_BATCH" in str(job)
    # --setup_file: Beam built the package from setup.py and lists it among the workers' artifacts.
    environments = str(result.job.proto_pipeline.components.environments)
    assert "workflow.tar.gz" in environments, environments[:2000]
    transforms = result.job.proto_pipeline.components.transforms
    labels = {t.unique_name for t in transforms.values()}
    assert any(label.startswith("Shuffle window/") for label in labels), sorted(labels)[:20]
    assert not list((tmp_path / "lake").rglob(layout.MANIFEST))   # nothing ran


def test_a_fresh_venv_with_only_the_sdist_runs_the_shuffle_job(sdist, tmp_path):
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(fresh)], check=True)
    python = fresh / "bin" / "python"
    site = pathlib.Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       check=True, capture_output=True, text=True).stdout.strip())
    # The dependencies (numpy, Cython, Beam, TensorFlow...) from the project's venv, as a plain path line:
    # the .pth files in that folder (among them the checkout's editable install) are not processed.
    (site / "zerolake_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                              "--no-index", str(sdist)], capture_output=True, text=True, cwd=tmp_path)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(python), "-c", "import json, engine.board, pipeline.shuffle, format.layout; "
                            "print(json.dumps([engine.board.__file__, pipeline.shuffle.__file__]))"],
                           cwd=elsewhere, capture_output=True, text=True, check=True)
    for path in json.loads(where.stdout):
        assert path.startswith(str(site)) and str(REPO) not in path, path
    root = small_lake(tmp_path / "lake")
    job = subprocess.run([str(python), "-m", "pipeline.shuffle", "--root", root, "--workers", "1",
                          "--window-min-positions", "100"], cwd=elsewhere, capture_output=True, text=True,
                         timeout=600)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    manifest = json.loads((pathlib.Path(root) / layout.window_manifest(1)).read_text())
    assert manifest["positions"] > 0 and manifest["shards"]
