"""A shuffle job that labels with a model leaves no copy of it in TMPDIR (one folder per job, removed
when the job ends however its workers end).  The job's own case (no empty
``tmp/shuffle-*/{parts,shards}`` folders after a run) is checked where the job already runs, in
tests/pipeline/test_shuffle.py."""

import os
import subprocess
import sys
from pathlib import Path

from cloud.local import LocalStorage
from format.window_manifest import read_window_manifest
from tests.arena.test_sigterm import publish_fake_model, stub_environment

REPO = Path(__file__).resolve().parents[2]


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


def test_a_shuffle_that_labels_with_a_model_leaves_no_copy_of_it(tmp_path):
    """Each local Beam worker copies the model it labels with; the copies are gone when the job ends.

    Two workers, so that the copies are made in pipeline.beam_worker processes, which end with
    os._exit (nothing of theirs runs at exit).  A stand-in TensorFlow with a uniform policy spares
    each worker TensorFlow's import.
    """
    import numpy as np
    from testdata.synthetic_games import synthetic_game
    from tests.pipeline.support import write_chunk, write_run_json

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
    assert read_window_manifest(LocalStorage(str(lake)), 2).positions > 0
    assert os.listdir(tmpdir) == []
