"""Nothing is left behind: a match, the GTP engine or the ladder stopped by SIGTERM
removes its model cache, a shuffle job that labels with a model leaves no copy
of it in TMPDIR, and a local lake keeps no empty folders once their objects are
deleted.

The shuffle job's own case (no empty ``tmp/shuffle-*/{parts,shards}`` folders
after a run) is checked where the job already runs, in
tests/test_pipeline_job.py.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloud.local import LocalStorage
from format import layout, registry
from format.run_config import RunConfig, ensure_run_config

REPO = Path(__file__).resolve().parents[1]

STUB_TENSORFLOW = '''"""Stand-in for TensorFlow: a model load that never ends, reached at once."""
import time


class saved_model:
    @staticmethod
    def load(path):
        time.sleep(120)
'''


STOPPED_WHILE_LOADING = {
    "match": (["selfplay.match", "model:{lake}@1", "random", "--games", "1"],
              "selfplay.match: stopped by SIGTERM; no result"),
    # GUIs (Sabaki, GoGui) and systemd stop an engine with SIGTERM.
    "gtp": (["selfplay.gtp", "--root", "{lake}", "--quiet"], "selfplay.gtp: stopped by SIGTERM"),
    # One generation against one anchor: the model is the first thing it loads.
    "ladder": (["selfplay.ladder", "--root", "{lake}", "--anchors", "random", "--anchor", "random",
                "--games", "1", "--no-stored-anchor-games"],
               "selfplay.ladder: stopped by SIGTERM; every game played so far is kept (rerun to go on)"),
}


@pytest.mark.parametrize("program", sorted(STOPPED_WHILE_LOADING))
def test_a_program_stopped_by_sigterm_removes_its_model_cache(tmp_path, program):
    """SIGTERM while a match, the GTP engine or the ladder loads its model: the cache's files are
    fetched, TMPDIR is empty afterwards (the engine and the ladder used to die leaving the copy).

    A stand-in ``tensorflow`` whose ``saved_model.load`` blocks holds the program
    inside loading, its cache full, without paying TensorFlow's import
    (seconds); a match of two network-free players makes no cache at all.
    """
    lake = tmp_path / "lake"
    ensure_run_config(LocalStorage(str(lake)), RunConfig(board_size=9))   # the ladder needs the run
    publish_fake_model(lake, tmp_path / "export")
    env, tmpdir = stub_environment(tmp_path, STUB_TENSORFLOW)
    args, last_line = STOPPED_WHILE_LOADING[program]
    proc = subprocess.Popen([sys.executable, "-m", *(arg.format(lake=lake) for arg in args)], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(tmpdir.glob(f"zerolake-models-*/{layout.generation_dir(1)}/variables/data")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == last_line and "Traceback" not in err, err
    assert os.listdir(tmpdir) == []


STUB_TENSORFLOW_UNIFORM = '''"""Stand-in for TensorFlow: a SavedModel with a uniform policy, loaded at once."""
import numpy as np


class _Tensor:
    def __init__(self, array):
        self.array = array

    def numpy(self):
        return self.array


def _serve(planes):
    batch, n = planes.shape[0], planes.shape[1]
    return {name: _Tensor(np.zeros(shape, np.float32)) for name, shape in (
        ("policy_logits", (batch, n * n + 1)), ("value", (batch,)), ("ownership", (batch, n * n)), ("score", (batch,)))}


class saved_model:
    @staticmethod
    def load(path):
        return type("SavedModel", (), {"signatures": {"serving_default": _serve}})
'''


def stub_environment(tmp_path: Path, stub_source: str) -> tuple[dict, Path]:
    """(a child's environment with the stand-in TensorFlow ``stub_source`` first on its path and
    TMPDIR a fresh folder, that folder): what a program leaves in TMPDIR can then be counted."""
    stub = tmp_path / "stub" / "tensorflow"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(stub_source)
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    return dict(os.environ, PYTHONPATH=f"{stub.parent}{os.pathsep}{REPO}", TMPDIR=str(tmpdir)), tmpdir


def publish_fake_model(lake: Path, export: Path) -> None:
    """Publish files that only a stand-in TensorFlow loads as generation 1 (LATEST moves to it)."""
    (export / "variables").mkdir(parents=True)
    (export / "saved_model.pb").write_bytes(b"graph")
    (export / "variables" / "data").write_bytes(b"weights" * 10)
    registry.publish_model(LocalStorage(str(lake)), 1, str(export), {"board_size": 9})


def test_a_shuffle_that_labels_with_a_model_leaves_no_copy_of_it(tmp_path):
    """Each local Beam worker copies the model it labels with; the copies are gone when the job ends.

    Two workers, so that the copies are made in pipeline.beam_worker processes, which end with
    os._exit (nothing of theirs runs at exit).  A stand-in TensorFlow with a uniform policy spares
    each worker TensorFlow's import.
    """
    import numpy as np
    from testdata.synthetic_games import synthetic_game
    from tests.test_pipeline_support import write_chunk, write_run_json

    lake = tmp_path / "lake"
    write_run_json(str(lake), 9)
    rng = np.random.default_rng(5)
    write_chunk(str(lake), 0, [synthetic_game(rng, 9, visits=8, generation=0) for _ in range(6)], 0)
    publish_fake_model(lake, tmp_path / "export")
    env, tmpdir = stub_environment(tmp_path, STUB_TENSORFLOW_UNIFORM)
    done = subprocess.run([sys.executable, "-m", "pipeline.shuffle", "--root", str(lake), "--workers", "2",
                           "--model-playout-moves", "10"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "play-out labels: model generation 1" in done.stdout        # the workers did load the model
    assert layout.read_window_manifest(LocalStorage(str(lake)), 2).positions > 0
    assert os.listdir(tmpdir) == []


def test_a_delete_removes_the_folders_it_leaves_empty_up_to_the_root(tmp_path):
    root = tmp_path / "lake"
    storage = LocalStorage(str(root))
    storage.write_new("tmp/shuffle-000001-a/parts/00000/b0.npz", b"x")
    storage.write_new("tmp/shuffle-000001-a/parts/00001/b0.npz", b"x")
    storage.write_new("tmp/shuffle-000001-a/shards/00000/c0.npz", b"x")
    storage.delete("tmp/shuffle-000001-a/parts/00000/b0.npz")
    assert sorted(os.listdir(root / "tmp/shuffle-000001-a/parts")) == ["00001"]
    storage.delete("tmp/shuffle-000001-a/parts/00001/b0.npz")
    assert os.listdir(root / "tmp/shuffle-000001-a") == ["shards"]
    storage.delete("tmp/shuffle-000001-a/shards/00000/c0.npz")
    assert os.listdir(root) == []                      # the root itself stays
    storage.delete("tmp/shuffle-000001-a/shards/00000/c0.npz", missing_ok=True)
    assert os.listdir(root) == []


def test_a_write_whose_folder_a_concurrent_delete_prunes_makes_it_again(tmp_path, monkeypatch):
    """Another process's delete may remove the (empty) folder between this writer's makedirs and open."""
    import cloud.local

    storage = LocalStorage(str(tmp_path / "lake"))
    real_open = os.open
    pruned = []

    def open_after_a_prune(path, flags, mode=0o777):
        folder = os.path.dirname(path)
        if not pruned and os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)
            pruned.append(folder)
        return real_open(path, flags, mode)

    monkeypatch.setattr(cloud.local.os, "open", open_after_a_prune)
    storage.write_new("tmp/probe-w1", b"probe")
    assert pruned and storage.read("tmp/probe-w1") == b"probe"
