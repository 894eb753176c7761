"""The trainer's faults: divergence, absurd settings, damaged files.

Divergence: with a learning rate of 8 the loss becomes NaN within a few
dozen steps.  The trainer used to checkpoint and publish that network, and
workers then played identical nonsense games into the lake.  Now the first
non-finite loss, or a non-finite weight before a checkpoint, stops it: exit
4, a ``diverged`` event, one line saying what to change, no non-finite
checkpoint, nothing published, LATEST unmoved.  An absurd learning rate is
refused at the command line.

Damage: a shard (bytes flipped, truncated, or garbage; or one record's body
damaged, which only the reader that meets it finds) or a game
table that does not read used to kill the trainer with a TensorFlow
traceback naming no file, and ``--follow`` crash-looped on it.  Now the file
is named in one line and a ``window_skipped`` event; one-shot exits 2, a
follower goes on to the next window, and no later run resumes the damaged
window from its checkpoint.  A shard's framing is checked before tf.data
reads it (tests/system/test_bounded_reads.py has the shard whose length field lies).

Every run here is in-process (TensorFlow is imported once) on tiny windows.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import signal
import struct
import threading
import time

import numpy as np
import pytest

from cloud.storage import open_storage
from format import codec, layout, schema
from format.window_manifest import read_window_manifest, window_manifest_bytes, WINDOW_MANIFEST_VERSION
from format.tfrecord import compress_gzip, frame_records
from testdata import synthetic_windows as synthetic

TINY = ["--blocks", "1", "--filters", "8", "--value-hidden", "8", "--batch-size", "32", "--steps-per-window", "80",
        "--steps-per-call", "10", "--log-every", "10", "--checkpoint-every", "40", "--warmup-steps", "0",
        "--shuffle-buffer", "64", "--no-cpu-int8"]


def train(argv) -> tuple[int, str, str]:
    from model import train as train_module

    out, err = io.StringIO(), io.StringIO()
    previous = signal.getsignal(signal.SIGTERM)   # model.train installs its own
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = train_module.main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code, out.getvalue(), err.getvalue()


def events_of(path: str) -> list[dict]:
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def lake_with_windows(root: str, generations) -> object:
    storage = open_storage(root)
    synthetic.write_run_config(storage, board_size=9)
    for generation in generations:
        synthetic.write_synthetic_window(storage, target_generation=generation, board_size=9, positions=600,
                                         seed=generation)
    return storage


def checkpoint_steps(storage) -> list[int]:
    saved = [info.path for info in storage.list(layout.CHECKPOINTS_DIR + "/")]
    return sorted({int(name.split("ckpt-")[1].split(".")[0]) for name in saved if "ckpt-" in name})


def assert_checkpoints_finite(root: str) -> None:
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(os.path.join(root, layout.CHECKPOINTS_DIR))
    if latest is None:
        return
    reader = tf.train.load_checkpoint(latest)
    for name, dtype in reader.get_variable_to_dtype_map().items():
        if dtype.is_floating:
            assert np.isfinite(reader.get_tensor(name)).all(), (latest, name)


# --- divergence -----------------------------------------------------------------


def test_a_diverging_run_saves_and_publishes_nothing_and_says_so(tmp_path):
    root = str(tmp_path / "lake")
    storage = lake_with_windows(root, [1])
    events = str(tmp_path / "train.jsonl")
    # The loss is NaN by step 20 (before the fix: checkpoints at 20, 30, 40 and a published model).
    code, out, err = train(["--root", root, *TINY, "--learning-rate", "8", "--momentum", "0.99",
                            "--steps-per-window", "40", "--steps-per-call", "5", "--checkpoint-every", "10",
                            "--events", events])
    assert code == 4, out[-2000:] + err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    diverged = next(e for e in events_of(events) if e["event"] == "diverged")
    assert (f"training diverged: the loss became nan at step {diverged['step']} of window 000001 "
            "(--learning-rate 8)") in lines[0], lines[0]
    assert "Lower --learning-rate" in lines[0] and "resumes from" in lines[0]
    assert diverged["generation"] == 1 and diverged["learning_rate"] == 8
    assert not storage.exists(layout.LATEST)
    assert not storage.list(layout.models_prefix())
    assert "published" not in [e["event"] for e in events_of(events)]
    # Only the checkpoints before the divergence are kept, and they are finite.
    steps = checkpoint_steps(storage)
    assert steps and all(step < diverged["step"] for step in steps), (steps, diverged)
    assert f"resumes from {storage.url(layout.CHECKPOINTS_DIR)}/ckpt-{steps[-1]}" in lines[0], lines[0]
    assert_checkpoints_finite(root)


def test_a_non_finite_weight_is_never_checkpointed(tmp_path, monkeypatch):
    """The loss of a step comes before its update: a step call whose losses were all finite
    can still leave a NaN weight, which the check before every save catches."""
    from model.sgd import Trainer

    original = Trainer.train_steps

    def poisoning(self, iterator, steps):
        sums = original(self, iterator, steps)
        weight = self.model.trainable_weights[0]
        weight.assign(np.full(weight.shape, np.nan, np.float32))
        return sums

    monkeypatch.setattr(Trainer, "train_steps", poisoning)
    root = str(tmp_path / "lake")
    storage = lake_with_windows(root, [1])
    events = str(tmp_path / "train.jsonl")
    code, out, err = train(["--root", root, *TINY, "--steps-per-window", "10", "--checkpoint-every", "10",
                            "--events", events])
    assert code == 4, out[-2000:] + err[-2000:]
    assert "training diverged: the variable stem_conv/kernel became non-finite at step 10 of window 000001" in err
    assert "resumes from scratch (no checkpoint was saved)" in err
    assert checkpoint_steps(storage) == [] and not storage.exists(layout.LATEST)
    assert [e["event"] for e in events_of(events)].count("diverged") == 1


def test_a_checkpoint_that_cannot_be_written_is_one_line_and_releases_the_lease(tmp_path):
    """A folder standing where the second checkpoint's index goes: TensorFlow fails after writing its
    shards into ``ckpt-20_temp/``.  That used to be a traceback and exit 1, the lease held until it
    expired and the temp folder left; now one line names the checkpoint and why, exit 2, the lease is
    released, nothing half-written stays, and the checkpoint before is still the one a rerun resumes."""
    from format.leases import read_record

    root = str(tmp_path / "lake")
    storage = lake_with_windows(root, [1])
    in_the_way = os.path.join(storage.url(layout.CHECKPOINTS_DIR), "ckpt-20.index")
    os.makedirs(in_the_way)
    events = str(tmp_path / "train.jsonl")
    code, out, err = train(["--root", root, *TINY, "--steps-per-window", "20", "--checkpoint-every", "10",
                            "--events", events])
    assert code == 2, out[-2000:] + err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    prefix = f"{storage.url(layout.CHECKPOINTS_DIR)}/ckpt-"
    assert lines[0].startswith(f"model.train: error: cannot write checkpoint {prefix}20: {in_the_way}; Is a directory; "
                               f"the checkpoints saved before are kept ({prefix}10 is the newest"), lines[0]
    assert read_record(storage, layout.TRAINER_LEASE)[0].released
    assert sorted(os.listdir(storage.url(layout.CHECKPOINTS_DIR))) == [
        "checkpoint", "ckpt-10.data-00000-of-00001", "ckpt-10.index", "ckpt-20.index"]   # the folder in the way
    assert events_of(events)[-1]["event"] == "stopped" and not storage.exists(layout.LATEST)


@pytest.mark.parametrize("flag,value", [("--learning-rate", "1e12"), ("--learning-rate", "1000"),
                                        ("--learning-rate", "nan"), ("--learning-rate", "-1"), ("--l2", "1e6"),
                                        ("--policy-loss-weight", "1e9"), ("--epochs-per-window", "1e8")])
def test_an_absurd_learning_setting_is_refused_in_one_line(flag, value, capsys):
    from model import train as train_module

    with pytest.raises(SystemExit) as exit_:
        train_module.main(["--root", "/tmp/unused", flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.splitlines()[-1].startswith(f"python -m model.train: error: {flag}:")


# --- damaged files --------------------------------------------------------------


def damage(path: str, how: str) -> None:
    data = open(path, "rb").read()
    if how == "flipped":
        middle = len(data) // 2
        data = data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:]
    elif how == "truncated":
        data = data[:len(data) // 2]
    elif how == "record flipped late":
        # A valid gzip stream and valid framing (format.tfrecord.check_gzip_frames passes it), but one
        # record's body, about nine tenths in, is damaged: only the reader that meets it finds out.
        raw = bytearray(gzip.decompress(data))
        offset = 0
        while True:
            (length,) = struct.unpack_from("<Q", raw, offset)
            if offset + 16 + length >= len(raw) * 9 // 10:
                break
            offset += 16 + length
        raw[offset + 12 + length // 2] ^= 0xFF
        data = compress_gzip(bytes(raw))
    else:
        data = b"\x1f\x8b" + os.urandom(len(data))
    with open(path, "wb") as handle:
        handle.write(data)


def assert_named_and_skipped(code, out, err, events, url) -> None:
    assert code == 2, out[-2000:] + err[-3000:]
    assert "Traceback" not in err and len([line for line in err.splitlines() if line.strip()]) == 1, err
    assert f"window 000001 damaged: {url}" in err, err
    skipped = [e for e in events_of(events) if e["event"] == "window_skipped"]
    assert [e["generation"] for e in skipped] == [1] and url in skipped[0]["reason"]


@pytest.mark.parametrize("how", ["flipped", "garbage"])   # truncated: the next test
def test_a_damaged_shard_is_named_in_one_line_and_its_window_skipped(tmp_path, how):
    root = str(tmp_path / "lake")
    storage = lake_with_windows(root, [1])
    shard = read_window_manifest(storage, 1).shards[1]
    damage(storage.url(shard), how)
    events = str(tmp_path / "train.jsonl")
    code, out, err = train(["--root", root, *TINY, "--steps-per-window", "40", "--events", events])
    assert_named_and_skipped(code, out, err, events, storage.url(shard))
    assert not storage.exists(layout.LATEST)


def write_engine_window(storage, generation: int, board_size: int = 9, games: int = 6) -> None:
    """A window (two shards and the game table) of random engine games."""
    from pipeline import labels as L
    from pipeline import positions as P
    from testdata.random_games import engine_game

    rng = np.random.default_rng(generation)
    played = [engine_game(rng, board_size) for _ in range(games)]
    labels = L.label_games(played, policy_fn=None, random_playouts=0, model_playout_moves=0, temperature=1.0,
                           playout_weight=0.5, rng=rng, stats=L.empty_stats())
    batch = P.games_positions(played, labels, list(range(games)), dedup_max_move=0)
    table = codec.GameTable(board_size=board_size, generation=[g.generation for g in played],
                            ownership=P.game_label_rows(labels))
    records = batch.encode(batch.instance.astype(np.int64), table)
    names = [layout.shard_name("test", i, 2) for i in range(2)]
    for name, part in zip(names, (records[:len(records) // 2], records[len(records) // 2:])):
        storage.write_new(layout.shard_path(generation, name), compress_gzip(frame_records(part)))
    storage.write_new(layout.game_table_path(generation, layout.game_table_name("test")),
                      codec.encode_game_table(table))
    document = {"version": WINDOW_MANIFEST_VERSION, "record_version": schema.POSITION_RECORD_VERSION,
                "target_generation": generation,
                "board_size": board_size, "shards": names, "positions": len(batch),
                "games": [g.game_id for g in played], "game_table": layout.game_table_name("test")}
    storage.write_new(layout.window_manifest(generation), window_manifest_bytes(document))


def test_a_shard_of_an_older_record_version_is_named_with_the_rebuild_command_and_skipped(tmp_path):
    """A window whose manifest says the current version but whose shard holds older records (written
    by an earlier release): tf.data's check stops it, and the trainer names the shard in one line
    that says how to rebuild the window."""
    from format.tfrecord import decompress_gzip, iter_framed_records
    from tests.format.reference_records import with_version

    root = str(tmp_path / "lake")
    storage = lake_with_windows(root, [1])
    shard = read_window_manifest(storage, 1).shards[1]
    url = storage.url(shard)
    records = list(iter_framed_records(decompress_gzip(storage.read(shard), url), url))
    with open(url, "wb") as handle:
        handle.write(compress_gzip(frame_records([with_version(r, 3) for r in records])))
    events = str(tmp_path / "train.jsonl")
    code, out, err = train(["--root", root, *TINY, "--steps-per-window", "40", "--events", events])
    assert_named_and_skipped(code, out, err, events, url)
    assert "version-3 position records" in err and "`python -m pipeline.shuffle --root ROOT`" in err, err


def test_a_damaged_game_table_is_named_in_one_line_and_its_window_skipped(tmp_path):
    root = str(tmp_path / "lake")
    storage = open_storage(root)
    synthetic.write_run_config(storage, board_size=9)
    write_engine_window(storage, 1)
    table = read_window_manifest(storage, 1).game_table
    damage(storage.url(table), "truncated")
    events = str(tmp_path / "train.jsonl")
    code, out, err = train(["--root", root, *TINY, "--steps-per-window", "10", "--events", events])
    assert_named_and_skipped(code, out, err, events, storage.url(table))


def test_a_damaged_first_shard_met_by_the_int8_calibration_is_named_too(tmp_path, monkeypatch):
    """The int8 copy's calibration reads the first shard in numpy, after training: damage
    there (here made between training and publishing) is the same named skip."""
    from model.cycle import TrainingRun

    publish = TrainingRun.publish

    def damaging_publish(self, window):
        damage(self.storage.url(window.shards[0]), "truncated")
        return publish(self, window)

    monkeypatch.setattr(TrainingRun, "publish", damaging_publish)
    root = str(tmp_path / "lake")
    storage = lake_with_windows(root, [1])
    shard = read_window_manifest(storage, 1).shards[0]
    events = str(tmp_path / "train.jsonl")
    code, out, err = train(["--root", root, *TINY, "--cpu-int8", "--steps-per-window", "10", "--events", events])
    assert_named_and_skipped(code, out, err, events, storage.url(shard))
    assert not storage.exists(layout.LATEST) and not storage.list(layout.models_prefix())


def test_a_window_skipped_for_damage_is_never_resumed_from_its_checkpoint(tmp_path):
    """A damaged record, met after a checkpoint of its window: named and skipped, and the skip
    leaves a checkpoint that resumes no window, so the next run trains the next window instead
    of resuming the damaged one (and exiting 2) forever."""
    root = str(tmp_path / "lake")
    storage = lake_with_windows(root, [1])
    shard = read_window_manifest(storage, 1).shards[1]
    damage(storage.url(shard), "record flipped late")
    events = str(tmp_path / "train.jsonl")
    flags = [*TINY, "--steps-per-call", "2", "--checkpoint-every", "2", "--log-every", "2"]
    code, out, err = train(["--root", root, *flags, "--steps-per-window", "40", "--events", events])
    assert_named_and_skipped(code, out, err, events, storage.url(shard))
    assert "checkpoint" in out.split("skipping window 000001")[0], "no checkpoint of window 1 before the damage"
    synthetic.write_synthetic_window(storage, target_generation=2, board_size=9, positions=600, seed=2)
    code, out, err = train(["--root", root, *flags, "--steps-per-window", "4"])
    assert code == 0, out[-2000:] + err[-2000:]
    assert "training window 000002" in out and storage.exists(layout.LATEST)
    assert int(storage.read(layout.LATEST)) == 2


def test_following_skips_a_damaged_window_and_trains_the_next(tmp_path):
    root = str(tmp_path / "lake")
    storage = lake_with_windows(root, [1])
    damage(storage.url(read_window_manifest(storage, 1).shards[0]), "flipped")
    events = str(tmp_path / "train.jsonl")
    failures = []

    def operator():
        """Adds a good window once the damaged one is skipped; SIGTERM once it is published."""
        deadline = time.monotonic() + 90
        try:
            while not any(e["event"] == "window_skipped" for e in events_of(events)):
                assert time.monotonic() < deadline, "no window_skipped event"
                time.sleep(0.1)
            synthetic.write_synthetic_window(storage, target_generation=2, board_size=9, positions=600, seed=2)
            while not any(e["event"] == "published" for e in events_of(events)):
                assert time.monotonic() < deadline, "window 2 was not published"
                time.sleep(0.1)
        except AssertionError as exc:
            failures.append(str(exc))
        finally:
            os.kill(os.getpid(), signal.SIGTERM)   # model.train's handler: stop at the next boundary

    watcher = threading.Thread(target=operator, daemon=True)
    watcher.start()
    code, out, err = train(["--root", root, *TINY, "--steps-per-window", "20", "--follow", "--poll-seconds", "0.1",
                            "--events", events])
    watcher.join(timeout=30)
    assert not failures and code == 0, failures + [out[-2000:], err[-3000:]]
    assert "Traceback" not in err
    seen = events_of(events)
    assert [e["generation"] for e in seen if e["event"] == "published"] == [2]
    assert [e["generation"] for e in seen if e["event"] == "window_skipped"] == [1]
