"""One training run: pick a window, train it in resumable slices, publish it.

Per window::

    choose   the checkpoint's unfinished, unpublished window if there is one,
             else the newest complete window newer than models/LATEST
    train    slices of steps_per_call steps; a progress line and TensorBoard
             points every log_every window steps; a checkpoint every
             checkpoint_every window steps and at the end of the window
    publish  export a float32 SavedModel, then format.registry.publish_model
             (files, MANIFEST.json create-only, LATEST last)

Resume: the checkpoint holds the window generation and how many of its
steps are done.  Rerunning the same command restores it, rebuilds the same
data stream and skips the batches already trained (format.tfdata), so the
run continues from the last checkpoint.  A window whose model is already
published is never trained or published again.

I/O modes (printed at start):

* direct: TensorFlow reads the shards from ROOT/windows and writes
  ROOT/checkpoints and ROOT/logs itself (local roots, and gs:// on real GCS);
* stage (``--stage-dir``, see model.staging): shards are copied to the stage
  directory through the storage layer and read there; checkpoints are
  written there and each is uploaded to ROOT/checkpoints before its
  progress line is printed; summaries stay local.  On start the newer of the
  stage directory's and ROOT's checkpoints is used, so resuming works on a
  fresh disk too.  A gs:// root is staged by default while
  $STORAGE_EMULATOR_HOST is set, because TensorFlow cannot reach an emulator.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import tempfile
import time

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from format.registry import AlreadyPublished, is_published, latest_generation, publish_model
from format import schema
from format.tfdata import training_dataset
from model.config import TrainConfig
from model.export import export_inference_model
from model.staging import Stage, resolve_stage_dir
from model.trainer import METRIC_NAMES, ResolvedStrategy, Trainer, network_config, summarize
from model.windows import Window, complete_windows, newest_untrained

log = logging.getLogger(__name__)


# TensorBoard's scalar plugin tag, written with the core tf.summary.write so
# that logging works without the tensorboard package (tensorflow-cpu does not
# install it; it is only needed to *view* the logs).
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


class CheckpointMismatch(RuntimeError):
    """ROOT/checkpoints was written by a differently shaped network."""


def _say(message: str) -> None:
    print(f"[train] {message}", flush=True)


def window_seed(seed: int, generation: int) -> int:
    """Data-order seed of one window: fixed by the run seed and the generation."""
    return (seed * 1_000_003 + generation) % (2**31 - 1)


class TrainingRun:
    """Owns the trainer, its checkpoint manager and the TensorBoard writer."""

    def __init__(self, config: TrainConfig, storage, board_size: int, resolved: ResolvedStrategy):
        self.config = config
        self.storage = storage
        self.board_size = board_size
        self.resolved = resolved
        self.net_config = network_config(config, board_size)
        self.trainer = Trainer(config, self.net_config, resolved)
        self.stage = self._open_stage()
        checkpoint_dir = self.stage.checkpoint_dir if self.stage else storage.url(schema.CHECKPOINTS_DIR)
        # The manager reads its directory's state file now, so a stage directory
        # must already hold the newest checkpoint (Stage.sync_on_start).
        self.manager = tf.train.CheckpointManager(self.trainer.checkpoint, checkpoint_dir,
                                                  max_to_keep=config.keep_checkpoints)
        log_dir = config.log_dir or (self.stage.log_dir if self.stage else storage.url("logs"))
        self.writer = tf.summary.create_file_writer(log_dir)
        _say(f"{resolved.description}; global batch {self.trainer.global_batch} "
             f"({config.batch_size} x {resolved.replicas}); {self.trainer.dtype_policy}; "
             f"{config.blocks} blocks x {config.filters} filters on {board_size}x{board_size}")

    def _open_stage(self) -> Stage | None:
        """The stage directory for this run (claimed and synced), or None for direct I/O."""
        directory, why = resolve_stage_dir(self.config.stage_dir, self.storage.url(""), os.environ)
        if not directory:
            _say(f"I/O: direct: TensorFlow reads and writes {self.storage.url('')} itself ({why})")
            return None
        _say(f"I/O: staged through {directory} ({why}); checkpoints are uploaded to "
             f"{self.storage.url(schema.CHECKPOINTS_DIR)}")
        stage = Stage(self.storage, directory)
        stage.claim()
        _say(f"checkpoints: {stage.sync_on_start()}")
        return stage

    # --- checkpoint ------------------------------------------------------------
    def restore(self) -> None:
        latest = self.manager.latest_checkpoint
        if latest is None:
            where = self.storage.url(schema.CHECKPOINTS_DIR)
            if self.stage:
                where = f"{self.stage.checkpoint_dir} or {where}"
            _say(f"no checkpoint under {where}: starting fresh")
            return
        try:
            self.trainer.checkpoint.restore(latest).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            raise CheckpointMismatch(f"{latest} does not match this network (was it written with other "
                               f"--blocks/--filters/--value-head/--swa-decay flags?): {exc}") from None
        _say(f"restored {latest}: global step {self.trainer.global_step}, window "
             f"{int(self.trainer.window_generation.numpy())} at step "
             f"{int(self.trainer.window_step.numpy())}/{int(self.trainer.window_steps_total.numpy())}")

    def save(self) -> str:
        """Write a checkpoint (and in stage mode upload it) before saying so."""
        path = self.manager.save(checkpoint_number=self.trainer.global_step)
        uploaded = ""
        if self.stage:
            pushed = self.stage.push()
            uploaded = (f" (uploaded {pushed.uploaded} file(s) to {self.stage.remote_checkpoints}"
                        + (f", deleted {pushed.deleted} old" if pushed.deleted else "") + ")")
        _say(f"checkpoint {path} at window step {int(self.trainer.window_step.numpy())}{uploaded}")
        return path

    # --- choosing work ---------------------------------------------------------
    def choose_window(self) -> Window | None:
        """The window to train now (its state set in the trainer), or None."""
        windows = complete_windows(self.storage, self.board_size)
        current = int(self.trainer.window_generation.numpy())
        if current >= 0 and not is_published(self.storage, current):
            resumed = [w for w in windows if w.target_generation == current]
            if resumed:
                _say(f"resuming window {schema.generation_dir(current)} at step "
                     f"{int(self.trainer.window_step.numpy())}/{int(self.trainer.window_steps_total.numpy())}")
                return resumed[0]
            log.warning("the checkpoint's window %d has no manifest any more; moving on", current)
        window = newest_untrained(windows, latest_generation(self.storage))
        if window is None or is_published(self.storage, window.target_generation):
            return None
        steps = self.config.steps_per_window or window.steps(self.trainer.global_batch,
                                                             self.config.epochs_per_window)
        self.trainer.start_window(window.target_generation, steps)
        _say(f"training window {schema.generation_dir(window.target_generation)}: "
             f"{window.positions} positions in {len(window.shards)} shards, {steps} steps")
        return window

    # --- training --------------------------------------------------------------
    def _shard_files(self, window: Window) -> list[str]:
        """What tf.data reads: local copies in stage mode, else the shards' URLs."""
        if not self.stage:
            return [self.storage.url(path) for path in window.shards]
        staged = self.stage.stage_window(window.target_generation, window.shards)
        _say(f"staged window {schema.generation_dir(window.target_generation)} in "
             f"{os.path.dirname(staged.paths[0])}: {staged.copied} shard(s) copied "
             f"({staged.bytes_copied / 1e6:.1f} MB), {staged.already_present} already there")
        return list(staged.paths)

    def _dataset_iterator(self, window: Window):
        dataset = training_dataset(
            self._shard_files(window), board_size=self.board_size,
            batch_size=self.trainer.global_batch,
            seed=window_seed(self.config.seed, window.target_generation),
            skip_batches=int(self.trainer.window_step.numpy()),
            shuffle_buffer=self.config.shuffle_buffer)
        return iter(self.trainer.strategy.experimental_distribute_dataset(dataset))

    def _next_slice(self, done: int, total: int) -> int:
        """Steps in the next call: up to the next log or checkpoint boundary."""
        cfg = self.config
        to_log = cfg.log_every - done % cfg.log_every
        to_checkpoint = cfg.checkpoint_every - done % cfg.checkpoint_every
        return min(cfg.steps_per_call, total - done, to_log, to_checkpoint)

    def train_window(self, window: Window) -> None:
        total = int(self.trainer.window_steps_total.numpy())
        if int(self.trainer.window_step.numpy()) >= total:
            return
        iterator = self._dataset_iterator(window)
        sums = dict.fromkeys(METRIC_NAMES, 0.0)
        # Examples/s is timed from the end of the first call, so that tracing
        # and filling the input pipeline do not count.
        timed_from, untimed = None, 0.0
        while (done := int(self.trainer.window_step.numpy())) < total:
            steps = self._next_slice(done, total)
            for name, value in self.trainer.train_steps(iterator, steps).items():
                sums[name] += value
            if timed_from is None:
                timed_from, untimed = time.monotonic(), sums["examples"]
            done += steps
            if done % self.config.log_every == 0 or done == total:
                elapsed = time.monotonic() - timed_from
                rate = (sums["examples"] - untimed) / elapsed if elapsed > 0 and sums["examples"] > untimed \
                    else float("nan")
                self._report(window, done, total, sums, rate)
                sums = dict.fromkeys(METRIC_NAMES, 0.0)
                timed_from, untimed = time.monotonic(), 0.0
            if done % self.config.checkpoint_every == 0 or done == total:
                self.save()

    def _report(self, window, done, total, sums, rate) -> None:
        means = summarize(sums)
        lr = self.trainer.learning_rate()
        step = self.trainer.global_step
        scalars = {**means, "learning_rate": lr}
        if math.isfinite(rate):
            scalars["examples_per_second"] = rate
        with self.writer.as_default(step=step):
            for name, value in scalars.items():
                tf.summary.write(f"train/{name}", tf.constant(value, tf.float32),
                                 metadata=_SCALAR_METADATA)
        self.writer.flush()
        _say(f"window {schema.generation_dir(window.target_generation)} step {done}/{total} "
             f"(global {step}) loss {means['loss']:.4f} policy {means['policy_loss']:.4f} "
             f"acc {means['policy_accuracy']:.3f} value {means['value_loss']:.4f} "
             f"ownership {means['ownership_loss']:.4f} score {means['score_loss']:.4f} "
             f"lr {lr:.5f} " + (f"{rate:.0f} ex/s" if math.isfinite(rate) else "(warming up)"))

    # --- publishing ------------------------------------------------------------
    def publish(self, window: Window) -> bool:
        """Export and publish the window's model; False if it already existed."""
        generation = window.target_generation
        if is_published(self.storage, generation):
            _say(f"generation {generation} is already published; not republishing")
            return False
        metadata = {
            "board_size": self.board_size, "generation": generation,
            "network": dataclasses.asdict(self.net_config),
            "global_step": self.trainer.global_step,
            "window": window.manifest_path, "window_positions": window.positions,
            "window_steps": int(self.trainer.window_steps_total.numpy()),
            "swa_decay": self.config.swa_decay, "feature_set_planes": schema.INPUT_PLANES,
            "created_unix": int(time.time()),
        }
        with tempfile.TemporaryDirectory(prefix="zerolake-export-") as scratch:
            local = os.path.join(scratch, "model")
            export_inference_model(self.net_config, self.trainer.published_weights(), local)
            try:
                publish_model(self.storage, generation, local, metadata)
            except AlreadyPublished as exc:
                _say(f"not republishing: {exc}")
                return False
        _say(f"published generation {generation} to {self.storage.url(f'{schema.MODELS_DIR}/{schema.generation_dir(generation)}')}")
        return True

    # --- the whole run -----------------------------------------------------------
    def run(self) -> int:
        """Train and publish up to --windows windows (forever with --follow); exit status."""
        self.restore()
        trained = 0
        while self.config.follow or trained < self.config.windows:
            window = self.choose_window()
            if window is None:
                if not self.config.follow:
                    break
                time.sleep(self.config.poll_seconds)
                continue
            self.train_window(window)
            self.publish(window)
            trained += 1
        if trained == 0:
            _say("nothing to train: no complete window is newer than the published models")
        return 0
