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


def damage(path: str, how: str) -> None:
    data = open(path, "rb").read()
    if how == "flipped":
        middle = len(data) // 2
        data = data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:]
    elif how == "truncated":
        data = data[:len(data) // 2]
    else:
        data = b"\x1f\x8b" + os.urandom(len(data))
    with open(path, "wb") as handle:
        handle.write(data)


def lake_with_windows(root: str, generations) -> object:
    storage = open_storage(root)
    synthetic.write_run_config(storage, board_size=9)
    for generation in generations:
        synthetic.write_synthetic_window(storage, target_generation=generation, board_size=9, positions=600,
                                         seed=generation)
    return storage


@pytest.mark.parametrize("how", ["flipped", "truncated"])
def test_a_damaged_shard_is_named_in_one_line_and_its_window_skipped(tmp_path, how):
    root = str(tmp_path / "lake")
    storage = lake_with_windows(root, [1])
    shard = layout.read_window_manifest(storage, 1).shards[1]
    damage(storage.url(shard), how)
    events = str(tmp_path / "train.jsonl")
    code, out, err = train(["--root", root, *TINY, "--steps-per-window", "40", "--events", events])
    assert code == 2, out[-2000:] + err[-3000:]
    assert "Traceback" not in err and len([line for line in err.splitlines() if line.strip()]) == 1, err
    assert storage.url(shard) in err and "damaged" in err
    skipped = [json.loads(line) for line in open(events) if json.loads(line)["event"] == "window_skipped"]
    assert [e["generation"] for e in skipped] == [1] and storage.url(shard) in skipped[0]["reason"]
    assert not storage.exists(layout.LATEST)


def test_following_skips_a_damaged_window_and_trains_the_next(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    root = str(tmp_path / "lake")
    storage = lake_with_windows(root, [1])
    damage(storage.url(layout.read_window_manifest(storage, 1).shards[0]), "flipped")
    events = str(tmp_path / "train.jsonl")
    follower = subprocess.Popen([sys.executable, "-m", "model.train", "--root", root, *TINY, "--steps-per-window",
                                 "20", "--follow", "--poll-seconds", "0.2", "--events", events],
                                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def seen(name):
            return [json.loads(line) for line in open(events)] if os.path.exists(events) else []

        deadline = time.monotonic() + 120
        while not any(e["event"] == "window_skipped" for e in seen(events)):
            assert follower.poll() is None and time.monotonic() < deadline, follower.stderr.read()
            time.sleep(0.2)
        # A good window arrives: the follower trains and publishes it.
        synthetic.write_synthetic_window(storage, target_generation=2, board_size=9, positions=600, seed=2)
        while not any(e["event"] == "published" for e in seen(events)):
            assert follower.poll() is None and time.monotonic() < deadline, follower.stderr.read()
            time.sleep(0.2)
    finally:
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    published = [e["generation"] for e in seen(events) if e["event"] == "published"]
    assert published == [2]
    assert sum(1 for e in seen(events) if e["event"] == "window_skipped" and e["generation"] == 1) == 1
