"""One training cycle: pick a window, train it in resumable slices, publish it.

    choose   model.windows.plan_next: the checkpoint's unfinished window if still newer than
             LATEST, else the newest complete one (older candidates skipped and reported)
    train    slices of steps_per_call steps; progress every log_every steps, a checkpoint every
             checkpoint_every steps and at the window's end; the lease and SIGTERM are checked
             between slices (the step-call boundary)
    publish  renew the lease, check LATEST is still older, export a float32 SavedModel,
             format.registry.publish_model (create-only files, LATEST moved by compare-and-swap)

``--follow`` repeats this forever; a window that appears mid-training waits until the current one
is published.  SIGTERM saves a checkpoint at the next boundary and exits 0; a lost lease
(model.lease) stops without saving or publishing; every checkpoint and publish follows a lease
renewal.  Non-finite losses or weights raise `Diverged`.  A read error traced to a damaged file
skips the window, naming the file.  Resume: the checkpoint holds the window and its steps done, and
the same command skips the batches already trained.  I/O is *direct* (TensorFlow reads ROOT) or
*stage* (``--stage-dir``, model.staging: every byte through the storage layer).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import os
import tempfile
import threading
import time

import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import summary_pb2

from cloud.base import NotFound
from format import layout
from format.documents import ManifestError
from format.events import EventLog
from format.example_fields import FormatError
from format.game_table import read_window_table
from format.planes import input_from_record_planes
from format.position_records import decode_records
from format.registry import (
    AlreadyPublished,
    RegistryError,
    advance_latest,
    is_published,
    latest_generation,
    publish_model,
    read_manifest,
)
from format.run_config import read_run_config
from format.tfrecord import RecordError, check_gzip_frames, decompress_for, iter_framed_records
from format.window_manifest import read_window_manifest
from model.config import TrainConfig
from model.cpu_int8 import CALIBRATION_POSITIONS, CHECK_POSITIONS, add_cpu_int8
from model.export import export_inference_model
from model.sgd import METRIC_NAMES, ResolvedStrategy, Trainer, summarize
from model.staging import STATE_FILE, Stage, resolve_stage_dir
from model.tfdata import training_dataset
from model.windows import (
    LakeError,
    Skipped,
    Window,
    new_rows,
    plan_next,
    samples_per_row_steps,
    scan_windows,
    window_steps,
)

log = logging.getLogger(__name__)


LOG_PUSH_SECONDS = 60.0
"""Stage mode: summaries go up to ROOT/logs at most this often (and at every checkpoint)."""

# TensorBoard's scalar plugin tag, written with the core tf.summary.write so
# that logging works without the tensorboard package (tensorflow-cpu does not
# install it; it is only needed to *view* the logs).
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
)


class CheckpointMismatch(RuntimeError):
    """ROOT/checkpoints was written by a differently shaped network."""


class Diverged(RuntimeError):
    """The training loss stopped being finite.  Nothing since the last checkpoint is
    saved or published; ``str()`` is the one line that says so and what to change."""

    def __init__(self, generation: int, step: int, learning_rate: float, peak: float, what: str, resume: str):
        # The rate in use differs from --learning-rate during warm-up and decay: both are
        # named, since the flag is what the operator changes.
        rate = (
            f"--learning-rate {peak:g}"
            if math.isclose(learning_rate, peak, rel_tol=1e-6)
            else f"learning rate {learning_rate:g}, --learning-rate {peak:g}"
        )
        super().__init__(
            f"training diverged: {what} at step {step} of window {layout.generation_dir(generation)} ({rate}); "
            "nothing since the last checkpoint was saved or published. Lower --learning-rate (or lengthen "
            f"--warmup-steps) and rerun: training resumes from {resume}"
        )
        self.generation, self.step, self.learning_rate = generation, step, learning_rate


class DamagedWindow(RuntimeError):
    """A file of the window being trained does not read: ``reason`` names it (and the
    record and field where the repository's own reader can say), for the log and the
    ``window_skipped`` event."""

    def __init__(self, generation: int, reason: str):
        super().__init__(reason)
        self.generation, self.reason = generation, reason


class CheckpointStateError(RuntimeError):
    """The checkpoint state file (``checkpoints/checkpoint``) is unreadable, or
    names a checkpoint whose files are missing; the message names the file."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (a full disk, no permission, something standing
    in the way); the message names the checkpoint and says why, in one line.  The
    checkpoints saved before stay as they were, and a rerun resumes the newest."""


def _op_error_reason(error: Exception) -> str:
    """TensorFlow's own reason, without the op's wrapping: ``{{function_node ...}} /x/ckpt-9.index; Is a
    directory [Op:MergeV2Checkpoints]`` -> ``/x/ckpt-9.index; Is a directory``."""
    text = (getattr(error, "message", None) or str(error)).strip().splitlines()[0]
    if text.startswith("{{") and "}}" in text:
        text = text.split("}}", 1)[1]
    return text.split(" [Op:", 1)[0].strip()


_READ_ERRORS = (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError)
"""What tf.data raises on a damaged shard or record: a bad gzip stream or record CRC (DataLoss),
a record that does not parse or fails a decoder check (InvalidArgument), a stream that ends
early (OutOfRange).  Traced to a file by ``TrainingRun._damage``."""


def _say(message: str) -> None:
    print(f"[train] {message}", flush=True)


def _finite(value):
    """A metric for a JSON event: None instead of NaN/inf (events are strict JSON)."""
    value = float(value)
    return value if math.isfinite(value) else None


def window_seed(seed: int, generation: int) -> int:
    """Data-order seed of one window: fixed by the run seed and the generation."""
    return (seed * 1_000_003 + generation) % (2**31 - 1)


class TrainingRun:
    """Owns the trainer, its checkpoint manager and the TensorBoard writer.

    ``lease`` (a model.lease.TrainerLease, already acquired) is checked at
    every step-call boundary and renewed before each checkpoint and publish;
    ``events`` receives the ``train`` events; setting ``stop`` (SIGTERM)
    ends the run at the next boundary.
    """

    def __init__(
        self,
        config: TrainConfig,
        storage,
        board_size: int,
        resolved: ResolvedStrategy,
        *,
        lease=None,
        events: EventLog | None = None,
        stop: threading.Event | None = None,
    ):
        self.config = config
        self.storage = storage
        self.board_size = board_size
        self.resolved = resolved
        self.lease = lease
        self.events = events or EventLog(None, "train")
        self.stop = stop or threading.Event()
        self.stop_reason = ""
        self._reported_skips: set[int] = set()
        self._damaged: dict[int, str] = {}
        """Windows this process found a damaged file in (generation -> reason): never chosen again."""
        self._skipped_below: list[Skipped] = []
        self._saved_step = -1
        self.net_config = config.network_for(board_size)
        run = read_run_config(storage)
        # A whole-number komi allows draws, which the wdl head's targets must tell apart.
        draws_possible = run is not None and float(run.komi).is_integer()
        self.trainer = Trainer(config, self.net_config, resolved, draws_possible=draws_possible)
        self._last_metrics: dict = {}
        """The means of the latest progress report; published with the model."""
        self.stage = self._open_stage()
        checkpoint_dir = self.stage.checkpoint_dir if self.stage else storage.url(layout.CHECKPOINTS_DIR)
        # The manager reads its directory's state file now, so a stage directory
        # must already hold the newest checkpoint (Stage.sync_on_start).
        self.state_file = f"{checkpoint_dir}/{STATE_FILE}"
        try:
            self.manager = tf.train.CheckpointManager(
                self.trainer.checkpoint, checkpoint_dir, max_to_keep=config.keep_checkpoints
            )
        except (UnicodeDecodeError, text_format.ParseError, tf.errors.OpError) as exc:
            raise CheckpointStateError(
                f"{self.state_file}: not a checkpoint state file ({exc}); move it "
                "aside to start fresh, or restore it from a backup"
            ) from None
        log_dir = config.log_dir or (self.stage.log_dir if self.stage else storage.url(layout.trainer_logs_dir()))
        self.writer = tf.summary.create_file_writer(log_dir)
        _say(
            f"{resolved.description}; global batch {self.trainer.global_batch} "
            f"({config.batch_size} x {resolved.replicas}); {self.trainer.dtype_policy}; "
            f"{config.network.blocks} blocks x {config.network.filters} filters on {board_size}x{board_size}"
        )

    def _open_stage(self) -> Stage | None:
        """The stage directory for this run (claimed and synced), or None for direct I/O."""
        directory, why = resolve_stage_dir(self.config.stage_dir, self.storage.url(""), os.environ)
        if not directory:
            _say(f"I/O: direct: TensorFlow reads and writes {self.storage.url('')} itself ({why})")
            return None
        _say(
            f"I/O: staged through {directory} ({why}); checkpoints are uploaded to "
            f"{self.storage.url(layout.CHECKPOINTS_DIR)}"
        )
        stage = Stage(self.storage, directory)
        stage.claim()
        _say(f"checkpoints: {stage.sync_on_start()}")
        return stage

    # --- checkpoint ------------------------------------------------------------
    def restore(self) -> None:
        latest = self.manager.latest_checkpoint
        if latest is None:
            where = self.storage.url(layout.CHECKPOINTS_DIR)
            if self.stage:
                where = f"{self.stage.checkpoint_dir} or {where}"
            _say(f"no checkpoint under {where}: starting fresh")
            return
        if not tf.io.gfile.exists(f"{latest}.index"):
            # Else TensorFlow's error blames the network's shape.
            raise CheckpointStateError(f"{self.state_file} names {latest}, whose files are missing")
        try:
            self.trainer.checkpoint.restore(latest).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            raise CheckpointMismatch(
                f"{latest} does not match this network (was it written with other --input-planes/--blocks/"
                f"--filters/--value-head/--policy-head/--swa-decay flags?): {exc}"
            ) from None
        self._saved_step = int(self.trainer.window_step.numpy())
        generation = int(self.trainer.window_generation.numpy())
        where = (
            f"window {generation} at step {int(self.trainer.window_step.numpy())}/"
            f"{int(self.trainer.window_steps_total.numpy())}"
            if generation >= 0
            else "no window in progress"
        )
        _say(f"restored {latest}: global step {self.trainer.global_step}, {where}")

    def save(self) -> str:
        """Write a checkpoint (and in stage mode upload it) before saying so.

        The state is checked first: Diverged if a weight, optimizer slot or
        average is not finite (the loss checks of every step call catch nearly
        every case; this one also catches the last update of a call, whose loss
        was finite).  Then the lease is renewed: LeaseLost means another trainer
        owns the checkpoints now, and nothing is written."""
        self._check_state(int(self.trainer.window_generation.numpy()))
        if self.lease is not None:
            self.lease.renew()
        step = self.trainer.global_step
        try:
            path = self.manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as exc:
            prefix = f"{self.manager.directory}/ckpt-{step}"
            self._remove_failed_save(prefix)
            reason = _op_error_reason(exc) if isinstance(exc, tf.errors.OpError) else exc.strerror or str(exc)
            raise CheckpointWriteError(
                f"cannot write checkpoint {prefix}: {reason}; the checkpoints saved before are kept "
                f"({self.manager.latest_checkpoint or 'none yet'} is the newest, where a rerun resumes)"
            ) from None
        self._saved_step = int(self.trainer.window_step.numpy())
        uploaded = ""
        if self.stage:
            pushed = self.stage.push()
            uploaded = (
                f" (uploaded {pushed.uploaded} file(s) to {self.stage.remote_checkpoints}"
                + (f", deleted {pushed.deleted} old" if pushed.deleted else "")
                + ")"
            )
            if not self.config.log_dir:
                self.stage.push_logs()
        _say(f"checkpoint {path} at window step {int(self.trainer.window_step.numpy())}{uploaded}")
        return path

    def _remove_failed_save(self, prefix: str) -> None:
        """Remove what a failed save of ``prefix`` left: TensorFlow writes the shards into a
        ``<prefix>_temp`` folder and merges them into ``<prefix>.index`` and ``.data-*``;
        a failure in between left the folder and half the files, which no state file names.
        Files of a checkpoint the manager keeps are never touched; what cannot be removed
        (the very thing in the way, say) is left."""
        if prefix in self.manager.checkpoints:
            return
        for leftover in tf.io.gfile.glob(f"{prefix}_temp*") + tf.io.gfile.glob(f"{prefix}.data-*"):
            try:
                if tf.io.gfile.isdir(leftover):
                    tf.io.gfile.rmtree(leftover)
                else:
                    tf.io.gfile.remove(leftover)
            except tf.errors.OpError:
                pass

    def _check_state(self, generation: int) -> None:
        """Diverged (with its event) if a variable a checkpoint would hold is not finite."""
        bad = self.trainer.non_finite_state()
        if bad:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            raise self._diverged(
                generation, int(self.trainer.window_step.numpy()), f"the variable {bad[0]}{more} became non-finite", bad
            )

    # --- choosing work ---------------------------------------------------------
    def choose_window(self) -> Window | None:
        """The window to train now (its state set in the trainer), or None.

        One-shot mode: a bad manifest among the candidates newer than LATEST
        raises LakeError (one line naming the object and field); the
        checkpoint's own window at or below LATEST is never resumed, so one
        that retention is deleting under us is not an error.  Follow mode:
        every bad window is skipped.
        """
        latest = latest_generation(self.storage)
        current = int(self.trainer.window_generation.numpy())
        current_published = current >= 0 and is_published(self.storage, current)
        scan = self._without_damaged(scan_windows(self.storage, self.board_size, latest, also=current))
        latest = self._finish_interrupted_publish(scan, latest)
        blocking = [bad for bad in scan.bad if latest is None or bad.generation > latest]
        if blocking and not self.config.follow:
            others = f" (and {len(blocking) - 1} more bad window(s))" if len(blocking) > 1 else ""
            raise LakeError(blocking[-1].reason + others)
        plan = plan_next(scan, latest, current, current_published)
        self._report_skipped(plan.skipped)
        window = plan.window
        if window is None:
            return None
        self._skipped_below = plan.skipped_below()
        generation = window.target_generation
        if plan.resume:
            _say(
                f"resuming window {layout.generation_dir(generation)} at step "
                f"{int(self.trainer.window_step.numpy())}/{int(self.trainer.window_steps_total.numpy())}"
            )
        else:
            steps, rule = self._window_steps(window, latest)
            self.trainer.start_window(generation, steps)
            self._saved_step = 0
            _say(
                f"training window {layout.generation_dir(generation)}: "
                f"{window.positions} positions in {len(window.shards)} shards, {steps} steps ({rule})"
            )
        self.events.emit(
            "window_started",
            generation=generation,
            steps=int(self.trainer.window_steps_total.numpy()),
            start_step=int(self.trainer.window_step.numpy()),
            resumed=plan.resume,
            global_step=self.trainer.global_step,
        )
        return window

    def _window_steps(self, window: Window, latest: int | None) -> tuple[int, str]:
        """(steps for a window started afresh, how they were chosen): --steps-per-window, else the
        samples-per-row rule on the rows new since LATEST's window (model.windows.new_rows), else
        --epochs-per-window passes (the rule is off, or the new rows are unknown)."""
        cfg = self.config
        if cfg.steps_per_window:
            return cfg.steps_per_window, "--steps-per-window"
        if cfg.samples_per_row:
            rows = new_rows(window, self._previous_lake_bytes(latest))
            if rows is not None:
                steps = samples_per_row_steps(
                    rows,
                    cfg.samples_per_row,
                    self.trainer.global_batch,
                    cfg.min_steps_per_window,
                    cfg.max_steps_per_window,
                )
                return steps, f"{rows} new rows x {cfg.samples_per_row:g} samples per row"
        steps = window_steps(window, self.trainer.global_batch, cfg.epochs_per_window)
        return steps, f"{cfg.epochs_per_window:g} epochs"

    def _previous_lake_bytes(self, latest: int | None) -> int | None:
        """The lake's chunk bytes at the plan of the window LATEST was trained on: the model's
        'window_lake_bytes' metadata, or (a model published before it) that window's manifest while
        retention keeps it; 0 before any model; None when neither says."""
        if latest is None:
            return 0
        try:
            recorded = read_manifest(self.storage, latest).metadata.get("window_lake_bytes")
            if isinstance(recorded, int) and not isinstance(recorded, bool):
                return recorded
            return read_window_manifest(self.storage, latest).planned_lake_bytes
        except (RegistryError, ManifestError, NotFound):
            return None

    def _without_damaged(self, scan):
        """``scan`` with the windows this process found damaged moved from good to bad."""
        if not self._damaged:
            return scan
        return dataclasses.replace(
            scan,
            good=tuple(w for w in scan.good if w.target_generation not in self._damaged),
            bad=scan.bad + tuple(Skipped(g, reason) for g, reason in sorted(self._damaged.items())),
        )

    def _finish_interrupted_publish(self, scan, latest: int | None) -> int | None:
        """Move LATEST to a candidate whose model is already published, and return LATEST.

        A publisher killed between the model's manifest (create-only) and
        LATEST leaves a generation that exists but is not announced; without
        this the window would look untrained forever.  Its ``published``
        event is emitted now, so each generation still gets exactly one.
        """
        floor = -1 if latest is None else latest
        done = [
            w.target_generation
            for w in scan.good
            if w.target_generation > floor and is_published(self.storage, w.target_generation)
        ]
        if not done:
            return latest
        generation = max(done)
        moved = advance_latest(self.storage, generation)
        step = read_manifest(self.storage, generation).metadata.get("global_step", -1)
        _say(
            f"generation {generation} was published but {self.storage.url(layout.LATEST)} still named "
            f"{latest} (its publisher was stopped in between); moved LATEST to {moved}"
        )
        self.events.emit("published", generation=generation, step=step, completed_after_restart=True)
        return moved

    def _report_skipped(self, skipped) -> None:
        """A log line and a ``window_skipped`` event for each window, once per process."""
        for item in skipped:
            if item.generation in self._reported_skips:
                continue
            self._reported_skips.add(item.generation)
            _say(f"skipping window {layout.generation_dir(item.generation)}: {item.reason}")
            self.events.emit("window_skipped", generation=item.generation, reason=item.reason)

    def _should_stop(self) -> bool:
        """At a step-call boundary: LeaseLost if the lease is gone; True once SIGTERM arrived."""
        if self.lease is not None:
            self.lease.check()
        if self.stop.is_set():
            self.stop_reason = self.stop_reason or "SIGTERM"
            return True
        return False

    # --- training --------------------------------------------------------------
    def _shard_files(self, window: Window) -> list[str]:
        """What tf.data reads: local copies in stage mode, else the shards' URLs.  A window's
        game table is staged too: tf.data finds it beside the shards."""
        if not self.stage:
            return [self.storage.url(path) for path in window.shards]
        staged = self.stage.stage_window(window.target_generation, window.files)
        _say(
            f"staged window {layout.generation_dir(window.target_generation)} in "
            f"{os.path.dirname(staged.paths[0])}: {staged.copied} file(s) copied "
            f"({staged.bytes_copied / 1e6:.1f} MB), {staged.already_present} already there"
        )
        return list(staged.paths[: len(window.shards)])

    def _checked_framing(self, window: Window, files: list[str]) -> None:
        """Each shard's framing, checked in bounded memory before tf.data reads it
        (format.tfrecord.check_gzip_frames: tf.data would allocate whatever a length field
        says).  A file that fails is the window's damage, named by its lake path.  In stage
        mode the staged copy is read; without a stage each shard is read from the lake once
        more (a window's shards are tens of MB, read once per window)."""
        for path, file in zip(window.shards, files):
            if self.stage:
                with open(file, "rb") as handle:
                    data = handle.read()
            else:
                data = self.storage.read(path)
            try:
                check_gzip_frames(data, self.storage.url(path))
            except RecordError as exc:
                raise DamagedWindow(window.target_generation, f"damaged: {exc}") from None

    def _dataset_iterator(self, window: Window):
        files = self._shard_files(window)
        self._checked_framing(window, files)
        dataset = training_dataset(
            files,
            board_size=self.board_size,
            record_version=window.record_version,
            batch_size=self.trainer.global_batch,
            seed=window_seed(self.config.seed, window.target_generation),
            skip_batches=int(self.trainer.window_step.numpy()),
            shuffle_buffer=self.config.shuffle_buffer,
            input_planes=self.net_config.input_planes,
        )
        return iter(self.trainer.strategy.experimental_distribute_dataset(dataset))

    def _calibration_planes(self, window: Window) -> np.ndarray:
        """Network inputs of up to CALIBRATION + CHECK positions of ``window``, for the int8
        copy's calibration and accuracy check: the first records of its first shard, decoded
        in numpy (a window is shuffled, so they are a fair sample; building a tf.data pipeline
        for them cost ~10 s on a loaded 2-core machine, most of a chaos-killed trainer's life)."""
        wanted = CALIBRATION_POSITIONS + CHECK_POSITIONS
        manifest = read_window_manifest(self.storage, window.target_generation)
        table = read_window_table(self.storage, manifest) if manifest.game_table else None
        source = self.storage.url(window.shards[0])
        raw = decompress_for(source, self.storage.read(window.shards[0]))
        planes = []
        for i, record in enumerate(iter_framed_records(raw, source)):
            for position in decode_records(record, f"{source}#{i}", table=table):
                planes.append(input_from_record_planes(position.planes, position.to_play, self.net_config.input_planes))
            if len(planes) >= wanted:
                break
        return np.stack(planes[:wanted]) if planes else np.zeros((0,), np.float32)

    def _damage(self, window: Window, error: Exception) -> DamagedWindow:
        """The DamagedWindow behind ``error`` (raised while reading ``window``): the first of its
        files that the repository's own readers refuse (the game table, then each shard in
        order), named with the record and problem.  TensorFlow's errors name no file, or a
        staged copy; these name the lake's.  If every file reads, ``error`` was not damage,
        and it is raised as it is.  Only ever run after a read failed, so its cost (reading
        the window once in numpy, one record at a time) is paid only then."""
        manifest = read_window_manifest(self.storage, window.target_generation)
        games = manifest.games
        try:
            table = read_window_table(self.storage, manifest) if manifest.game_table else None
            for path in window.shards:
                source = self.storage.url(path)
                raw = decompress_for(source, self.storage.read(path))
                for i, record in enumerate(iter_framed_records(raw, source)):
                    decode_records(record, f"{source}#{i}", games, table)
        except (FormatError, RecordError) as exc:
            return DamagedWindow(window.target_generation, f"damaged: {exc}")
        raise error

    def _next_slice(self, done: int, total: int) -> int:
        """Steps in the next call: up to the next log or checkpoint boundary."""
        cfg = self.config
        to_log = cfg.log_every - done % cfg.log_every
        to_checkpoint = cfg.checkpoint_every - done % cfg.checkpoint_every
        return min(cfg.steps_per_call, total - done, to_log, to_checkpoint)

    def train_window(self, window: Window) -> bool:
        """Train the window to its end (True), or until a stop was asked for (False,
        after saving a checkpoint of any steps done since the last one)."""
        total = int(self.trainer.window_steps_total.numpy())
        if int(self.trainer.window_step.numpy()) >= total:
            return True
        # The last window's tf.data pipeline (its graph functions, its game table held as constants)
        # lives on in reference cycles that only a full collection frees, and Python runs one rarely
        # in a process this size: a following trainer grew about 0.3 MB a window without this.
        gc.collect()
        try:
            iterator = self._dataset_iterator(window)
        except (FormatError, RecordError, *_READ_ERRORS) as exc:  # the game table is read here, once
            raise self._damage(window, exc) from None
        sums = dict.fromkeys(METRIC_NAMES, 0.0)
        # Examples/s is timed from the end of the first call, so that tracing
        # and filling the input pipeline do not count.
        timed_from, untimed = None, 0.0
        while (done := int(self.trainer.window_step.numpy())) < total:
            if self._should_stop():
                if done > self._saved_step:
                    self.save()
                return False
            steps = self._next_slice(done, total)
            try:
                slice_sums = self.trainer.train_steps(iterator, steps)
            except _READ_ERRORS as exc:
                raise self._damage(window, exc) from None
            self._check_finite(window, done + steps, slice_sums)
            for name, value in slice_sums.items():
                sums[name] += value
            if timed_from is None:
                timed_from, untimed = time.monotonic(), sums["examples"]
            done += steps
            if done % self.config.log_every == 0 or done == total:
                elapsed = time.monotonic() - timed_from
                rate = (
                    (sums["examples"] - untimed) / elapsed
                    if elapsed > 0 and sums["examples"] > untimed
                    else float("nan")
                )
                self._report(window, done, total, sums, rate)
                sums = dict.fromkeys(METRIC_NAMES, 0.0)
                timed_from, untimed = time.monotonic(), 0.0
            if done % self.config.checkpoint_every == 0 or done == total:
                self.save()
        return True

    def _check_finite(self, window: Window, step: int, slice_sums: dict) -> None:
        """Diverged (with a ``diverged`` event) if the slice's loss sums are not finite.

        Checked after every step call, before anything is saved: a non-finite loss means
        the weights it came from are garbage, and a checkpoint or a published model of
        them would make every later step, and every worker, play on garbage.
        """
        bad = sorted(name for name, value in slice_sums.items() if not math.isfinite(value))
        if not bad:
            return
        name = "total_loss_sum" if "total_loss_sum" in bad else bad[0]
        what = f"the {'loss' if name == 'total_loss_sum' else name} became {slice_sums[name]}"
        raise self._diverged(window.target_generation, step, what, bad)

    def _diverged(self, generation: int, step: int, what: str, metrics: list) -> Diverged:
        """The ``diverged`` event, and the Diverged to raise (naming the checkpoint a rerun resumes)."""
        rate = self.trainer.learning_rate()
        self.events.emit(
            "diverged",
            generation=generation,
            step=step,
            learning_rate=_finite(rate),
            peak_learning_rate=self.config.learning_rate,
            metrics=metrics,
        )
        latest = self.manager.latest_checkpoint
        resume = latest if latest else "scratch (no checkpoint was saved)"
        return Diverged(generation, step, rate, self.config.learning_rate, what, resume)

    def _report(self, window, done, total, sums, rate) -> None:
        means = summarize(sums)
        self._last_metrics = {name: _finite(value) for name, value in means.items()}
        lr = self.trainer.learning_rate()
        step = self.trainer.global_step
        scalars = {**means, "learning_rate": lr}
        if math.isfinite(rate):
            scalars["examples_per_second"] = rate
        with self.writer.as_default(step=step):
            for name, value in scalars.items():
                tf.summary.write(f"train/{name}", tf.constant(value, tf.float32), metadata=_SCALAR_METADATA)
        self.writer.flush()
        if self.stage and not self.config.log_dir:  # stage mode: summaries go up to ROOT/logs (model.staging)
            self.stage.push_logs(at_most_every=LOG_PUSH_SECONDS)
        self.events.emit(
            "progress",
            generation=window.target_generation,
            step=done,
            steps=total,
            global_step=step,
            loss=_finite(means["loss"]),
            policy_loss=_finite(means["policy_loss"]),
            value_loss=_finite(means["value_loss"]),
            accuracy=_finite(means["policy_accuracy"]),
            ownership_loss=_finite(means["ownership_loss"]),
            score_loss=_finite(means["score_loss"]),
            occupied_policy_mass=_finite(means["occupied_policy_mass"]),
            examples_per_s=_finite(rate),
            learning_rate=_finite(lr),
        )
        _say(
            f"window {layout.generation_dir(window.target_generation)} step {done}/{total} "
            f"(global {step}) loss {means['loss']:.4f} policy {means['policy_loss']:.4f} "
            f"acc {means['policy_accuracy']:.3f} value {means['value_loss']:.4f} "
            f"ownership {means['ownership_loss']:.4f} score {means['score_loss']:.4f} "
            f"occupied {means['occupied_policy_mass']:.3f} "
            f"lr {lr:.5f} " + (f"{rate:.0f} ex/s" if math.isfinite(rate) else "(warming up)")
        )

    # --- publishing ------------------------------------------------------------
    def publish(self, window: Window) -> bool:
        """Export and publish the window's model; False if it already existed or went stale."""
        generation = window.target_generation
        if self.lease is not None:
            self.lease.renew()  # LeaseLost: another trainer owns the root; publish nothing
        if is_published(self.storage, generation):
            _say(f"generation {generation} is already published; not republishing")
            return False
        latest = latest_generation(self.storage)
        if latest is not None and latest > generation:
            self._report_skipped(
                [
                    Skipped(
                        generation,
                        f"stale: {self.storage.url(layout.LATEST)} moved to {latest} while it was being trained",
                    )
                ]
            )
            return False
        metadata = {
            "board_size": self.board_size,
            "generation": generation,
            "network": dataclasses.asdict(self.net_config),
            "global_step": self.trainer.global_step,
            "window": window.path,
            "window_positions": window.positions,
            # The next window's new rows are counted from here (model.windows.new_rows).
            "window_lake_bytes": window.planned_lake_bytes,
            "window_steps": int(self.trainer.window_steps_total.numpy()),
            "skipped_windows": [item.as_metadata() for item in self._skipped_below],
            "swa_decay": self.config.swa_decay,
            "feature_set_planes": self.net_config.input_planes,
            "created_unix": int(time.time()),
            # The window's last progress report (losses, accuracy, occupied policy mass):
            # the rating ladder's report plots them per generation.  Empty when the
            # window was finished by an earlier process and only published here.
            "training_metrics": self._last_metrics,
        }
        weights = self.trainer.published_weights()
        if not all(np.isfinite(w).all() for w in weights if np.issubdtype(w.dtype, np.floating)):
            # The checks before every save catch this first; this guards what is exported itself.
            raise self._diverged(
                generation, int(self.trainer.window_step.numpy()), "the weights to publish are not finite", ["weights"]
            )
        with tempfile.TemporaryDirectory(prefix="zerolake-export-") as scratch:
            local = os.path.join(scratch, "model")
            export_inference_model(self.net_config, weights, local)
            if self.config.cpu_int8:
                try:
                    planes = self._calibration_planes(window)
                except (FormatError, RecordError) as exc:
                    raise self._damage(window, exc) from None
                metadata["cpu_int8"] = add_cpu_int8(local, planes, log=_say)
            try:
                # The lease is renewed again between the files and the manifest (the commit point):
                # the export and the uploads take long enough for it to lapse to another trainer.
                publish_model(
                    self.storage,
                    generation,
                    local,
                    metadata,
                    before_commit=self.lease.renew if self.lease is not None else None,
                )
            except AlreadyPublished as exc:
                _say(f"not republishing: {exc}")
                return False
        self.events.emit(
            "published",
            generation=generation,
            step=self.trainer.global_step,
            skipped_windows=[item.generation for item in self._skipped_below],
        )
        _say(f"published generation {generation} to {self.storage.url(layout.model_dir(generation))}")
        return True

    def _abandon(self, generation: int) -> None:
        """Checkpoint with no window in progress, so that no later process resumes the damaged
        window from its checkpoint forever (a resumed window comes before any newer one); the
        steps it trained, on records that read, are kept.  A later process that finds it the
        newest window starts it afresh and meets the damage again."""
        self._check_state(generation)  # a divergence in the steps before the damage is named first
        self.trainer.abandon_window()
        self.save()
        _say(f"window {layout.generation_dir(generation)} abandoned: the checkpoint resumes no window")

    # --- the whole run -----------------------------------------------------------
    def run(self) -> int:
        """Train and publish up to --windows windows (forever with --follow); exit status.

        ``stop_reason`` says afterwards why it ended ("SIGTERM", "done",
        "nothing to train").  LeaseLost propagates (the caller exits 3).
        """
        self.restore()
        trained = 0
        while self.config.follow or trained < self.config.windows:
            if self._should_stop():
                break
            window = self.choose_window()
            if window is None:
                if not self.config.follow:
                    break
                self.stop.wait(self.config.poll_seconds)
                continue
            try:
                if not self.train_window(window):
                    break
                self.publish(window)
            except DamagedWindow as damaged:
                # Skipped for the rest of this process: follow mode goes on to the next window,
                # one-shot mode stops with the one line (a rerun finds the damage again).
                self._damaged[damaged.generation] = damaged.reason
                self._report_skipped([Skipped(damaged.generation, damaged.reason)])
                self._abandon(damaged.generation)
                if not self.config.follow:
                    raise LakeError(f"window {layout.generation_dir(damaged.generation)} {damaged.reason}") from None
                continue
            trained += 1
        if trained == 0 and not self.stop_reason:
            _say("nothing to train: no complete window is newer than the published models")
            self.stop_reason = "nothing to train"
        self.stop_reason = self.stop_reason or "done"
        return 0
