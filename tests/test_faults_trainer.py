"""The trainer never keeps or publishes a diverged network, and refuses an absurd learning rate.

With a learning rate of 5 the loss becomes NaN within a few dozen steps.
The trainer used to checkpoint and publish that network, and workers then
played identical nonsense games into the lake.  Now the first non-finite
loss stops it: exit 4, a ``diverged`` event, one line saying what to change,
no checkpoint written since the last finite one, nothing published, LATEST
unmoved.
"""
from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

from cloud.storage import open_storage
from format import layout
from testdata import synthetic_windows as synthetic

TINY = ["--blocks", "1", "--filters", "8", "--value-hidden", "8", "--batch-size", "32", "--steps-per-window", "80",
        "--steps-per-call", "10", "--log-every", "10", "--checkpoint-every", "40", "--warmup-steps", "0",
        "--shuffle-buffer", "64"]


def train(argv) -> tuple[int, str, str]:
    from model import train as train_module

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = train_module.main(argv)
    return code, out.getvalue(), err.getvalue()


def test_a_diverging_run_saves_and_publishes_nothing_and_says_so(tmp_path):
    root = str(tmp_path / "lake")
    storage = open_storage(root)
    synthetic.write_run_config(storage, board_size=9)
    synthetic.write_synthetic_window(storage, target_generation=1, board_size=9, positions=600, seed=3)
    events = str(tmp_path / "train.jsonl")
    code, out, err = train(["--root", root, *TINY, "--learning-rate", "8", "--momentum", "0.99",
                            "--events", events])
    assert code == 4, out[-2000:] + err[-2000:]
    assert "training diverged" in err and "Lower --learning-rate" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1
    assert not storage.exists(layout.LATEST)
    assert not storage.list(layout.models_prefix())
    names = [json.loads(line)["event"] for line in open(events)]
    assert "diverged" in names and "published" not in names
    diverged = next(json.loads(line) for line in open(events) if json.loads(line)["event"] == "diverged")
    # Checkpoints come every 40 steps: none may hold a step at or after the one that diverged.
    saved = [info.path for info in storage.list(layout.CHECKPOINTS_DIR + "/")]
    steps = sorted(int(name.split("ckpt-")[1].split(".")[0]) for name in saved if "ckpt-" in name)
    assert all(step < diverged["step"] for step in steps), (steps, diverged)


@pytest.mark.parametrize("rate", ["1e12", "nan", "-1"])
def test_an_absurd_learning_rate_is_refused_in_one_line(rate, capsys):
    from model import train as train_module

    with pytest.raises(SystemExit) as exit_:
        train_module.main(["--root", "/tmp/unused", "--learning-rate", rate])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--learning-rate" in err.splitlines()[-1]
