"""A deployed trainer's TensorBoard summaries reach ROOT/logs, on the GCS emulator.

A deployed trainer runs in stage mode (run-role.sh gives --stage-dir), so
TensorFlow writes its event files to the VM's disk, which ``down`` deletes.
model.staging.Stage.push_logs copies them to ROOT/logs through the storage
layer (TensorFlow's own gs:// cannot reach the emulator), as it copies
checkpoints; model/cycle.py calls it after each report (at most every
LOG_PUSH_SECONDS) and at each checkpoint.  Here a real summary writer appends
to an event file in the stage directory while pushes copy it up; the bucket's
copy reads back as TensorBoard would read it, also after the stage directory
is gone.
"""
from __future__ import annotations

import shutil

import tensorflow as tf

from model import cycle
from model.staging import Stage


def _scalars(data: bytes, tmp_path) -> dict[str, list[float]]:
    path = tmp_path / "downloaded.tfevents"
    path.write_bytes(data)
    found: dict[str, list[float]] = {}
    for record in tf.data.TFRecordDataset(str(path)):
        event = tf.compat.v1.Event.FromString(record.numpy())
        for value in event.summary.value:
            found.setdefault(value.tag, []).append(round(float(tf.make_ndarray(value.tensor)), 3))
    return found


def test_summaries_reach_root_logs_during_the_run_and_outlive_the_stage(gcs_emulator, tmp_path):
    storage = gcs_emulator.storage
    stage = Stage(storage, str(tmp_path / "stage"))
    stage.claim()
    writer = tf.summary.create_file_writer(stage.log_dir)

    def report(step: int, loss: float) -> None:
        with writer.as_default(step=step):
            tf.summary.write("train/loss", tf.constant(loss, tf.float32))
        writer.flush()

    report(1, 0.9)
    assert stage.push_logs(at_most_every=60.0, now=1000.0) == 1
    [info] = storage.list("logs/")
    assert info.path.startswith("logs/events.out.tfevents.")
    assert _scalars(storage.read(info.path), tmp_path) == {"train/loss": [0.9]}

    report(2, 0.5)
    assert stage.push_logs(at_most_every=60.0, now=1030.0) == 0       # too soon: the next report sends it
    assert stage.push_logs(at_most_every=60.0, now=1061.0) == 1
    assert stage.push_logs(now=1062.0) == 0                            # unchanged files are not sent again
    assert _scalars(storage.read(info.path), tmp_path) == {"train/loss": [0.9, 0.5]}

    writer.close()
    shutil.rmtree(tmp_path / "stage")           # `down` deletes the VM and its disk; the bucket keeps the logs
    assert [i.path for i in storage.list("logs/")] == [info.path]
    assert storage.url("logs").endswith("/logs")    # what `tensorboard --logdir gs://BUCKET/RUN/logs` reads


def test_the_trainer_pushes_its_summaries_in_stage_mode_unless_log_dir_is_given():
    """The few lines in model/cycle.py that call push_logs (read, not run: a trainer run is
    tests/model/test_staging_gcs.py's business)."""
    import inspect

    report = inspect.getsource(cycle.TrainingRun._report)
    save = inspect.getsource(cycle.TrainingRun.save)
    assert "self.stage.push_logs(at_most_every=LOG_PUSH_SECONDS)" in report and "not self.config.log_dir" in report
    assert "self.stage.push_logs()" in save
    assert 0 < cycle.LOG_PUSH_SECONDS <= 300
