"""Stage mode (model.staging, ``--stage-dir``): training a gs:// root served by an emulator.

TensorFlow's gs:// filesystem cannot be pointed at an emulator, so in stage
mode the trainer moves shards and checkpoints through the storage layer and
TensorFlow touches only the stage directory.  The first tests check the
checkpoint mirror's rules on a local "ROOT" with hand-made checkpoint files
(no TensorFlow, milliseconds each): files before the state file, the higher
step wins on start, leftovers of a killed upload are replaced, a stage
directory serves one root.  The last one runs ``python -m model.train``
against gcp-storage-emulator: killed mid-window, rerun on a fresh stage
directory, it resumes from the checkpoint it downloads, publishes once, and
a third run has nothing to do.
"""
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from format.registry import latest_generation
from inference.model_files import load_model
from cloud.storage import open_storage
from format import schema
from format import layout
from testdata import synthetic_windows as synthetic
from model.config import ConfigError, TrainConfig
from tests.model.support import run_until_killed
from model.staging import (STATE_FILE, Stage, StagingError, default_stage_dir, format_checkpoint_state,
                           CheckpointState, parse_checkpoint_state, resolve_stage_dir)

REPO = pathlib.Path(__file__).resolve().parents[2]


# --- helpers --------------------------------------------------------------------

class RecordingStorage:
    """A storage that logs every write and delete (path, operation), in order."""

    def __init__(self, inner):
        self.inner = inner
        self.ops = []

    def write_new(self, path, data):
        self.ops.append(("write_new", path))
        self.inner.write_new(path, data)

    def write_replace(self, path, data):
        self.ops.append(("write_replace", path))
        self.inner.write_replace(path, data)

    def delete(self, path, *, missing_ok=False):
        self.ops.append(("delete", path))
        self.inner.delete(path, missing_ok=missing_ok)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def fake_save(checkpoint_dir, step, kept_steps, payload=b""):
    """What CheckpointManager.save leaves behind: ckpt-<step> files and the state file."""
    os.makedirs(checkpoint_dir, exist_ok=True)
    for name in (f"ckpt-{step}.index", f"ckpt-{step}.data-00000-of-00001"):
        with open(os.path.join(checkpoint_dir, name), "wb") as out:
            out.write(f"{name}:{payload.decode()}".encode() * 10)
    for name in os.listdir(checkpoint_dir):  # the manager's sweep of dropped checkpoints
        if name.startswith("ckpt-") and int(name.split(".")[0].split("-")[1]) not in kept_steps:
            os.unlink(os.path.join(checkpoint_dir, name))
    state = CheckpointState(f"ckpt-{step}", tuple(f"ckpt-{s}" for s in kept_steps))
    with open(os.path.join(checkpoint_dir, STATE_FILE), "w") as out:
        out.write(format_checkpoint_state(state) + "all_model_checkpoint_timestamps: 1.5\n")


def remote_names(storage):
    return sorted(info.path.split("/", 1)[1] for info in storage.list(layout.checkpoints_prefix()))


# --- mode and config --------------------------------------------------------------

def test_mode_is_stage_only_when_asked_or_when_an_emulator_is_in_use(tmp_path):
    emulator = {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"}
    assert resolve_stage_dir(str(tmp_path / "s"), "gs://b/run", {}) == (str(tmp_path / "s"), "--stage-dir")
    assert resolve_stage_dir("", "gs://b/run", {})[0] == ""            # real GCS: TF reads it directly
    assert resolve_stage_dir("", str(tmp_path), emulator)[0] == ""     # local roots never need staging
    directory, why = resolve_stage_dir("", "gs://b/run", emulator)
    assert directory == default_stage_dir("gs://b/run", emulator) != default_stage_dir("gs://b/other", emulator)
    assert "STORAGE_EMULATOR_HOST" in why
    with pytest.raises(ConfigError, match="--stage-dir"):
        TrainConfig(root="gs://b/run", stage_dir="gs://b/stage")


def test_the_default_stage_dir_is_the_users_not_a_predictable_name_in_the_shared_temp_folder(tmp_path):
    import tempfile

    emulator = {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:9", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    directory, _ = resolve_stage_dir("", "gs://b/run", emulator)
    assert os.path.dirname(directory) == str(tmp_path / "cache" / "zerolake" / "stage")
    del emulator["XDG_CACHE_HOME"]
    directory, _ = resolve_stage_dir("", "gs://b/run", emulator)
    assert directory.startswith(os.path.expanduser("~") + os.sep)
    assert not directory.startswith(tempfile.gettempdir() + os.sep)


@pytest.mark.parametrize("where", ["root", "inside", "above", "symlink"])
def test_a_stage_dir_at_inside_or_above_the_lake_root_is_refused(tmp_path, where):
    # The stage clean-up deletes every window folder but the one in training: a
    # stage dir at the root of a local lake removed the lake's other windows.
    root = tmp_path / "lake"
    root.mkdir()
    (tmp_path / "alias").symlink_to(root)
    stage = {"root": root, "inside": root / "stage", "above": tmp_path, "symlink": tmp_path / "alias"}[where]
    with pytest.raises(ConfigError, match="--stage-dir.*lake root"):
        TrainConfig(root=str(root), stage_dir=str(stage))
    TrainConfig(root=str(root), stage_dir=str(tmp_path / "stage"))       # a folder of its own is fine
    if where != "above":
        return
    proc = subprocess.run([sys.executable, "-m", "model.train", "--root", "lake", "--stage-dir", "."],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 2 and "--stage-dir" in proc.stderr and "Traceback" not in proc.stderr


def test_state_file_round_trip_keeps_names_and_refuses_garbage():
    text = ('model_checkpoint_path: "gs://b/run/checkpoints/ckpt-30"\n'
            'all_model_checkpoint_paths: "ckpt-20"\nall_model_checkpoint_paths: "ckpt-30"\n'
            'all_model_checkpoint_timestamps: 17.5\nlast_preserved_timestamp: 3.0\n')
    state = parse_checkpoint_state(text, "x")
    assert state == CheckpointState("ckpt-30", ("ckpt-20", "ckpt-30")) and state.step == 30
    assert parse_checkpoint_state(format_checkpoint_state(state), "x") == state
    assert parse_checkpoint_state("", "x") is None
    with pytest.raises(StagingError, match="where.*not a checkpoint prefix"):
        parse_checkpoint_state('model_checkpoint_path: "../../etc/passwd"\n', "where")


# --- the checkpoint mirror -----------------------------------------------------------

def test_push_uploads_files_before_the_state_file_and_drops_what_the_manager_dropped(tmp_path):
    root = RecordingStorage(open_storage(str(tmp_path / "root")))
    stage = Stage(root, str(tmp_path / "stage"))
    fake_save(stage.checkpoint_dir, 10, [10])
    fake_save(stage.checkpoint_dir, 20, [10, 20])
    first = stage.push()
    state_write = root.ops.index(("write_replace", layout.checkpoint_file("checkpoint")))
    assert state_write == len(root.ops) - 1, root.ops  # LAST, after all four files
    assert sorted(path for op, path in root.ops[:state_write]) == [
        layout.checkpoint_file("ckpt-10.data-00000-of-00001"), layout.checkpoint_file("ckpt-10.index"),
        layout.checkpoint_file("ckpt-20.data-00000-of-00001"), layout.checkpoint_file("ckpt-20.index")]
    assert all(op == "write_new" for op, _ in root.ops[:state_write])
    assert (first.uploaded, first.deleted) == (4, 0)

    root.ops.clear()
    fake_save(stage.checkpoint_dir, 30, [20, 30])
    second = stage.push()
    assert (second.uploaded, second.already_there, second.deleted) == (2, 2, 2)
    writes = [path for op, path in root.ops if op != "delete"]
    assert writes[-1] == layout.checkpoint_file("checkpoint")
    assert remote_names(root) == ["checkpoint", "ckpt-20.data-00000-of-00001", "ckpt-20.index",
                                  "ckpt-30.data-00000-of-00001", "ckpt-30.index"]
    assert parse_checkpoint_state(root.read(layout.checkpoint_file("checkpoint")).decode(), "r") == \
        CheckpointState("ckpt-30", ("ckpt-20", "ckpt-30"))


def test_on_start_the_higher_step_wins(tmp_path):
    root = open_storage(str(tmp_path / "root"))
    machine_a = Stage(root, str(tmp_path / "a"))
    fake_save(machine_a.checkpoint_dir, 40, [40], b"a")
    machine_a.push()

    # A fresh disk downloads ROOT's checkpoint.
    machine_b = Stage(root, str(tmp_path / "b"))
    assert "downloaded ckpt-40" in machine_b.sync_on_start()
    assert machine_b.local_state().latest == "ckpt-40"
    with open(os.path.join(machine_b.checkpoint_dir, "ckpt-40.index"), "rb") as handle:
        assert handle.read() == root.read(layout.checkpoint_file("ckpt-40.index"))
    fake_save(machine_b.checkpoint_dir, 60, [40, 60], b"b")
    machine_b.push()

    # A's disk (stale at 50, never uploaded) loses to ROOT's 60; its files are discarded.
    fake_save(machine_a.checkpoint_dir, 50, [40, 50], b"a")
    assert "downloaded ckpt-60" in machine_a.sync_on_start()
    assert sorted(os.listdir(machine_a.checkpoint_dir)) == [
        "checkpoint", "ckpt-60.data-00000-of-00001", "ckpt-60.index"]
    assert machine_a.local_state() == CheckpointState("ckpt-60", ("ckpt-40", "ckpt-60"))

    # B saved 80 locally but was killed before uploading: its own disk is newer, so it uploads.
    fake_save(machine_b.checkpoint_dir, 80, [60, 80], b"b")
    message = machine_b.sync_on_start()
    assert "kept ckpt-80" in message and "had ckpt-60" in message
    assert root.read(layout.checkpoint_file("checkpoint")).startswith(b'model_checkpoint_path: "ckpt-80"')
    assert "ckpt-40.index" not in remote_names(root)


def test_leftover_of_a_killed_upload_is_replaced_but_a_named_checkpoint_is_never(tmp_path):
    root = open_storage(str(tmp_path / "root"))
    stage = Stage(root, str(tmp_path / "stage"))
    fake_save(stage.checkpoint_dir, 10, [10], b"mine")
    stage.push()
    # Another machine uploaded ckpt-20's data and died before the state file.
    root.write_new(layout.checkpoint_file("ckpt-20.data-00000-of-00001"), b"other machine's bytes")
    fake_save(stage.checkpoint_dir, 20, [10, 20], b"mine")
    stage.push()
    with open(os.path.join(stage.checkpoint_dir, "ckpt-20.data-00000-of-00001"), "rb") as handle:
        assert root.read(layout.checkpoint_file("ckpt-20.data-00000-of-00001")) == handle.read()

    # ROOT's state names ckpt-20; a different ckpt-20 here means a second writer: refuse.
    other = Stage(root, str(tmp_path / "other"))
    fake_save(other.checkpoint_dir, 20, [20], b"a different run!")
    with pytest.raises(StagingError, match="another trainer"):
        other.push()


def test_window_staging_copies_once_and_recopies_a_damaged_file(tmp_path):
    root = open_storage(str(tmp_path / "root"))
    manifest = synthetic.write_synthetic_window(root, target_generation=2, board_size=9,
                                                positions=40, shards=2, seed=1)
    shards = tuple(layout.shard_path(2, name) for name in manifest["shards"])
    stage = Stage(root, str(tmp_path / "stage"))
    os.makedirs(os.path.join(stage.windows_dir, "000001"))  # a previous window's copy
    first = stage.stage_window(2, shards)
    assert (first.copied, first.already_present) == (2, 0)
    assert os.listdir(stage.windows_dir) == ["000002"]
    for path, shard in zip(first.paths, shards):
        with open(path, "rb") as handle:
            assert handle.read() == root.read(shard)
    with open(first.paths[1], "r+b") as handle:
        handle.truncate(10)
    again = stage.stage_window(2, shards)
    assert (again.copied, again.already_present) == (1, 1)
    assert os.path.getsize(again.paths[1]) == len(root.read(shards[1]))


def test_a_stage_directory_serves_one_root(tmp_path):
    Stage(open_storage(str(tmp_path / "one")), str(tmp_path / "stage")).claim()
    Stage(open_storage(str(tmp_path / "one")), str(tmp_path / "stage")).claim()  # same root: fine
    with pytest.raises(StagingError, match="give each root its own stage directory"):
        Stage(open_storage(str(tmp_path / "two")), str(tmp_path / "stage")).claim()


# --- the trainer against the emulator ---------------------------------------------------

STEPS = 60


def train_command(root, *extra):
    return [sys.executable, "-m", "model.train", "--root", root, "--blocks", "1", "--filters", "16",
            "--value-hidden", "16", "--batch-size", "32", "--steps-per-window", str(STEPS),
            "--checkpoint-every", "20", "--log-every", "20", "--steps-per-call", "10",
            "--warmup-steps", "10", "--keep-checkpoints", "2", *extra]


def test_trainer_on_an_emulated_bucket_resumes_on_a_fresh_stage_dir_and_publishes_once(
        gcs_emulator, tmp_path):
    root = gcs_emulator.root_url("train")
    lake = gcs_emulator.open(root)
    synthetic.write_run_config(lake, board_size=9)
    synthetic.write_synthetic_window(lake, target_generation=1, board_size=9, positions=600,
                                     shards=2, seed=4)
    env = {**os.environ, **gcs_emulator.env}

    killed = run_until_killed(train_command(root, "--stage-dir", str(tmp_path / "stage-1")),
                              "at window step 20 (uploaded", env)
    assert "I/O: staged through" in killed and "3 file(s) copied" in killed   # 2 shards and the game table
    last = int(re.findall(r"at window step (\d+) \(uploaded", killed)[-1])
    assert latest_generation(lake) is None
    assert f"ckpt-{last}.index" in remote_names(lake)

    # A new machine: no --stage-dir, so the emulator default under the (test's) cache folder.
    temp = tmp_path / "cache"
    temp.mkdir()
    resumed = subprocess.run(train_command(root), cwd=REPO, env={**env, "XDG_CACHE_HOME": str(temp)},
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    out = resumed.stdout
    assert f"I/O: staged through {temp}" in out and "STORAGE_EMULATOR_HOST is set" in out, out
    assert f"downloaded ckpt-{last} from {root}/checkpoints (the stage directory had none)" in out, out
    assert f"resuming window 000001 at step {last}/{STEPS}" in out, out
    assert f"step {STEPS}/{STEPS} (global {STEPS})" in out
    assert "published generation 1" in out
    assert out.count("published generation") == 1

    assert latest_generation(lake) == 1
    assert remote_names(lake) == ["checkpoint", f"ckpt-{STEPS - 20}.data-00000-of-00001",
                                  f"ckpt-{STEPS - 20}.index", f"ckpt-{STEPS}.data-00000-of-00001",
                                  f"ckpt-{STEPS}.index"]  # --keep-checkpoints 2, the rest deleted
    assert lake.read(layout.checkpoint_file("checkpoint")).startswith(f'model_checkpoint_path: "ckpt-{STEPS}"'.encode())
    published = lake.read(layout.model_manifest(1))

    again = subprocess.run(train_command(root, "--stage-dir", str(tmp_path / "stage-3")), cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "no window to train" in again.stderr, again.stderr[-2000:]
    assert lake.read(layout.model_manifest(1)) == published

    model = load_model(lake, 1, cache_dir=str(tmp_path / "cache"))
    outputs = model(np.zeros((2, 9, 9, schema.BASIC_INPUT_PLANES), np.float32))
    assert outputs["policy_logits"].shape == (2, 82) and outputs["value"].shape == (2,)
