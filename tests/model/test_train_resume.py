"""Kill ``python -m model.train`` with SIGKILL mid-window, rerun the same command.

The restarted run must restore the last checkpoint, continue the window from
that checkpoint's step (not from 0), publish the generation once, and a
third run must find nothing to do and leave the published model untouched.
"""
import pathlib
import re
import subprocess
import sys

import numpy as np

from format.registry import latest_generation
from inference.model_files import load_model
from cloud.storage import open_storage
from format import schema
from format import layout
from testdata import synthetic_windows as synthetic
from tests.model.support import run_until_killed

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 160


def command(root):
    return [sys.executable, "-m", "model.train", "--root", str(root), "--blocks", "1",
            "--filters", "16", "--value-hidden", "16", "--batch-size", "32",
            "--steps-per-window", str(STEPS), "--checkpoint-every", "40", "--log-every", "20",
            "--steps-per-call", "10", "--warmup-steps", "10"]


def checkpoint_steps(output):
    return [int(s) for s in re.findall(r"checkpoint \S+ at window step (\d+)", output)]


def test_sigkill_mid_window_then_rerun_resumes_and_never_republishes(tmp_path):
    root = tmp_path / "lake"
    storage = open_storage(str(root))
    synthetic.write_run_config(storage, board_size=9)
    synthetic.write_synthetic_window(storage, target_generation=1, board_size=9,
                                     positions=1500, shards=2, seed=4)

    killed = run_until_killed(command(root), "at window step 80")
    last_checkpoint = checkpoint_steps(killed)[-1]
    assert 80 <= last_checkpoint < STEPS
    assert not storage.exists(layout.model_manifest(1))
    assert latest_generation(storage) is None

    resumed = subprocess.run(command(root), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = resumed.stdout
    assert f"resuming window 000001 at step {last_checkpoint}/{STEPS}" in out, out
    progress = [int(s) for s in re.findall(r"step (\d+)/%d \(global (\d+)\)" % STEPS, out)[0]]
    assert progress == [last_checkpoint + 20, last_checkpoint + 20], out  # window and global step agree
    assert f"step {STEPS}/{STEPS} (global {STEPS})" in out
    assert "published generation 1" in out
    assert latest_generation(storage) == 1
    published = storage.read(layout.model_manifest(1))

    again = subprocess.run(command(root), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "no window to train" in again.stderr
    assert storage.read(layout.model_manifest(1)) == published

    model = load_model(storage, 1, cache_dir=str(tmp_path / "cache"))
    out = model(np.zeros((2, 9, 9, schema.BASIC_INPUT_PLANES), np.float32))
    assert out["policy_logits"].shape == (2, 82) and out["value"].shape == (2,)
