"""``python -m pipeline.shuffle``: turn the lake's newest games into a training window.

Reads ``ROOT/games/<gen>/*.tfrecord.zst``; writes ``windows/<target_gen>/<attempt>-<i>-of-<S>.tfrecord.gz``
(position records of `format.schema.POSITION_RECORD_VERSION`), the game table
``<attempt>-games.table.gz`` and, last, ``MANIFEST.json``; target_gen = latest model + 1.  A window
with a manifest is not redone; an invalid manifest is an error (exit 2), never overwritten.  The job
cleans killed writers' temporary files and claims its window as a follower does; SIGTERM exits 143
once its files are removed and its claim released.  Then it deletes finished windows beyond
``--keep-windows`` (pipeline.retention).  ``--follow`` runs forever instead (pipeline.follow).

This module makes the cheap, global decisions (run.json, the chunks by pipeline.window_plan's
power-law rule, shard and partition sizes, the attempt id); pipeline.transforms does the work.
Locally on Beam's in-process FnApiRunner (``--workers`` processes of `pipeline.beam_worker`), or on
Dataflow (the image operations/dataflow/Dockerfile builds; docs/deploy.md)::

    python -m pipeline.shuffle --root /data/lake
    python -m pipeline.shuffle --root gs://BUCKET/lake --runner DataflowRunner --project PROJECT \\
        --region REGION --temp_location gs://BUCKET/beam-tmp --sdk_container_image IMAGE
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import re
import shlex
import shutil
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Sequence

from cloud.base import StorageError
from format import layout
from format.cli import flag_name, role_parser
from format.events import EventLog
from format.leases import Lease, describe_time
from format.registry import RegistryError
from format.window_manifest import WindowManifest
from pipeline import window_plan as W
from pipeline.config import LABEL_MODEL, LABEL_RANDOM, ShuffleConfig, from_args
from pipeline.lake_view import (
    ONE_SHOT_CLAIM_TAKEOVER,
    ShuffleError,
    check_run_config,
    claim_attempt,
    clean_tmp,
    delete_tmp_dir,
    existing_window,
    holder_id,
    latest_model,
    new_attempt_id,
    progress,
    try_claim,
)
from pipeline.retention import apply_retention
from processes.sigterm import EXIT_TERMINATED, Terminated, terminated_by_sigterm

# pipeline.transforms (and with it Apache Beam, ~5 s to import on a busy
# 2-core machine) is imported inside prepare() and build(): a follower that
# only watches the lake never needs it; its child job does.
if TYPE_CHECKING:  # prepare() names the type in its annotation only
    from pipeline.transforms import JobContext


SKIPPED_CHUNKS_SHOWN = 10
"""Skipped chunks named on the console; the window's manifest names them all."""


def _round_up(count: int, multiple: int) -> int:
    """The least positive multiple of ``multiple`` that is at least ``count``."""
    return max(1, -(-count // multiple)) * multiple


def prepare(
    config: ShuffleConfig, storage, *, target: int | None = None, attempt: str | None = None
) -> tuple["JobContext", list] | WindowManifest:
    """Driver decisions: (context, bundle elements), or the existing window if it is done.

    ``target``: the window to build (default: latest model + 1); ``attempt``:
    its attempt id (default: a new one).  The follower passes both.
    """
    from pipeline.transforms import JobContext

    run = check_run_config(config, storage)
    latest = latest_model(storage)
    target = (latest or 0) + 1 if target is None else target
    done = existing_window(storage, target)
    if done is not None:
        return done
    if config.playout_labels == LABEL_MODEL and latest is None:
        raise ShuffleError("--playout-labels model: the lake has no published model")
    model_generation = None if config.playout_labels == LABEL_RANDOM else latest
    try:
        plan = W.plan_window(
            storage,
            min_positions=config.window_min_positions,
            scale=config.window_scale,
            exponent=config.window_exponent,
            max_positions=config.window_max_positions,
            sample_chunks=config.sample_chunks,
            bundle_positions=config.bundle_positions,
            slope=config.window_slope,
            value_only_rows=config.value_only_rows,
            after_resignation_rows=config.after_resignation_rows,
        )
    except ValueError as exc:
        raise ShuffleError(str(exc)) from None
    window_estimate = plan.window_positions_estimate
    early_estimate = (window_estimate / plan.positions_per_game) * min(plan.positions_per_game, config.dedup_max_move)
    attempt = attempt or new_attempt_id()
    seed = config.seed or int.from_bytes(hashlib.blake2b(attempt.encode(), digest_size=4).digest(), "little")
    generations = sorted({c.generation for c in plan.chunks})
    summary = (
        (
            "rule",
            f"min {config.window_min_positions}, scale {config.window_scale}, "
            f"exponent {config.window_exponent}, slope {config.window_slope}, "
            f"max {config.window_max_positions or 'none'}",
        ),
        ("lake_chunks", plan.lake_chunks),
        ("lake_positions_estimate", plan.lake_positions_estimate),
        # The follower measures "new positions since this window" against these two.
        ("lake_bytes", plan.lake_bytes),
        ("positions_per_byte", plan.positions_per_byte),
        ("window_positions_target", plan.window_positions_target),
        ("window_positions_estimate", window_estimate),
        ("window_chunks", len(plan.chunks)),
        ("generations", generations),
        ("chunks", [c.path for c in plan.chunks]),
    )
    context = JobContext(
        root_url=config.root,
        config=config,
        board_size=run.board_size,
        komi=run.komi,
        target_generation=target,
        attempt=attempt,
        seed=seed,
        # Shards and dedup partitions are whole multiples of the local workers, so
        # that no worker idles through the last round of either step.
        num_shards=_round_up(W.num_shards(window_estimate, config.reuse, config.shard_positions), config.workers),
        num_partitions=_round_up(int(-(-early_estimate // config.partition_positions)), config.workers),
        model_generation=model_generation,
        plan_summary=summary,
    )
    progress(
        f"lake: {plan.lake_chunks} chunks, ~{plan.lake_positions_estimate} positions; window: "
        f"{len(plan.chunks)} chunks of generations {generations[0]}..{generations[-1]}, "
        f"~{window_estimate} positions (target {plan.window_positions_target}) in {len(plan.bundles)} bundles"
    )
    progress(
        f"target generation {target}, attempt {attempt}, {context.num_shards} shards, "
        f"{context.num_partitions} dedup partitions, play-out labels: "
        f"{'model generation %d' % model_generation if model_generation is not None else 'random playouts'}"
    )
    bundles = [(b, [(i, plan.chunks[i]) for i in chunk_indices]) for b, chunk_indices in enumerate(plan.bundles)]
    return context, bundles


def pipeline_options(config: ShuffleConfig, beam_args: list[str]):
    """PipelineOptions from the unknown flags, and the runner they name (None: local)."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, TypeOptions

    options = PipelineOptions(beam_args)
    # The job's transforms carry no type hints, so Beam's construction-time
    # type check has nothing to check; it cost 0.1-0.2 s of every run here.
    options.view_as(TypeOptions).pipeline_type_check = False
    runner = options.view_as(StandardOptions).runner
    if runner is None:
        direct = options.view_as(DirectOptions)
        direct.direct_num_workers = config.workers
        # "in_memory" keeps the environment given to local_runner(); with more
        # than one worker that environment is a subprocess per worker.
        direct.direct_running_mode = "in_memory"
    return options, runner


class _DropHarmlessBeamWarnings(logging.Filter):
    """Two warnings every local run printed that do not apply to it.

    * FnApiRunner: in_memory mode cannot run several workers.  True of its
      embedded environment, not of the subprocess one local_runner() gives it.
    * Each SDK worker, forwarded by the runner: no semi_persistent_directory
      for a pickled main session.  The job pickles no main session.
    """

    HARMLESS = ("If direct_num_workers is not equal to 1", "No semi_persistent_directory found")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.HARMLESS)


LAKE_ERRORS = (StorageError, RegistryError)
"""The lake's own errors: each names the object (a shard that could not be written, a model that
does not load) and why, so the job prints it in one line instead of a traceback."""

_ERROR_LINE = re.compile(r"^((?:cloud|format)\.[\w.]+): (.+)$", re.MULTILINE)
"""The last line of a formatted traceback: ``module.Class: message``."""


def _is_lake_error_class(qualified_name: str) -> bool:
    module, _, name = qualified_name.rpartition(".")
    found = getattr(sys.modules.get(module), name, None)  # only modules already imported, never an import
    return isinstance(found, type) and issubclass(found, LAKE_ERRORS)


def _raised_by(error: BaseException | None, kind: type) -> bool:
    """Whether ``error`` or an exception it was raised from or while handling is a ``kind``."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kind):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def lake_error(error: BaseException | str) -> str | None:
    """The message of the lake error that failed a Beam job (``error``: its exception or log text), else None.

    In-process (one worker) Beam re-raises the DoFn's own exception.  A worker
    process, or Dataflow, sends back only the worker's formatted traceback, in
    the text of a RuntimeError, where the error is the line ``cloud.base.StorageError:
    cannot write ...``; so the text is all there is to read.  Beam's suffix
    naming the step (`` [while running '...']``) is dropped.
    """
    if isinstance(error, LAKE_ERRORS):
        message = str(error)
    else:
        # A forwarded worker log entry is protobuf text, its newlines escaped.
        text = str(error).replace("\\n", "\n")
        found = [message for name, message in _ERROR_LINE.findall(text) if _is_lake_error_class(name)]
        if not found:
            return None
        message = found[-1]
    return message.split(" [while running ")[0]


class _DropLakeErrorLogs(logging.Filter):
    """Beam's logs of a lake error: the runner's, and each worker's forwarded to it.

    The job stops on the error and prints it in one line (`lake_error`); Beam
    logged it, traceback and all, once per worker and step that met it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], LAKE_ERRORS):
            return False
        return lake_error(record.getMessage()) is None


class _DropSigtermLogs(logging.Filter):
    """Beam's log of the SIGTERM that stopped a DoFn running in this process (one worker): the job
    says it was stopped in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and _raised_by(record.exc_info[1], Terminated))


def _quiet_beam_logs() -> None:
    """The two harmless warnings, the lake errors' logs and SIGTERM's, on the loggers that print them."""
    for name, quiet in (
        ("apache_beam.runners.portability.fn_api_runner.fn_runner", _DropHarmlessBeamWarnings),
        ("apache_beam.runners.portability.local_job_service", _DropHarmlessBeamWarnings),
        ("apache_beam.runners.portability.local_job_service", _DropLakeErrorLogs),
        ("apache_beam.runners.common", _DropLakeErrorLogs),
        ("apache_beam.runners.common", _DropSigtermLogs),
    ):
        logger = logging.getLogger(name)
        if not any(isinstance(f, quiet) for f in logger.filters):
            logger.addFilter(quiet())


def local_runner(config: ShuffleConfig):
    """Beam's in-process FnApiRunner; with several workers, one process each (pipeline.beam_worker)."""
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.transforms import environments

    _quiet_beam_logs()
    if config.workers == 1:
        return FnApiRunner()
    # Beam starts the command through a shell; exec makes the worker the process Beam waits on, not
    # a shell that a SIGTERM to the job's group would kill under it (pipeline.beam_worker: stopping).
    command = f"exec {shlex.quote(sys.executable)} -m pipeline.beam_worker"
    return FnApiRunner(default_environment=environments.SubprocessSDKEnvironment.from_command_string(command))


def run(
    config: ShuffleConfig, beam_args: Sequence[str] = (), *, target: int | None = None, attempt: str | None = None
) -> WindowManifest:
    """Run the job; returns the window's manifest (the existing one if already done).

    ``attempt`` given: a follower's child job, which builds under its
    follower's claim and after its clean-up.  Otherwise a one-shot job: it
    cleans the lake's temporary area first and claims its window itself.
    """
    from cloud.storage import open_storage

    try:
        storage = open_storage(config.root, retry=config.storage_retry)
    except ValueError as exc:
        raise ShuffleError(f"--root: {exc}") from None
    one_shot = attempt is None
    if one_shot:
        clean_tmp(storage)
    prepared = prepare(config, storage, target=target, attempt=attempt)
    if isinstance(prepared, WindowManifest):
        progress(f"window {prepared.target_generation} already has a manifest; nothing to do")
        retain_windows(config, storage)
        return prepared
    context, bundles = prepared
    started = time.monotonic()
    claim = claim_window(config, storage, context) if one_shot else None
    try:
        # A follower may have published it between the plan and the claim.
        if claim is None or not storage.exists(layout.window_manifest(context.target_generation)):
            build(config, storage, context, bundles, beam_args)
    finally:
        if claim is not None:
            claim.release()
    window = existing_window(storage, context.target_generation)
    if window is None:
        raise ShuffleError(
            f"window {context.target_generation} would hold no positions: every chunk in it was "
            f"skipped or empty, so no manifest was written (`python -m format.inspect verify "
            f"{storage.url()}` names the bad chunks)"
        )
    elapsed = time.monotonic() - started
    progress(
        f"wrote {len(window.shards)} shards, {window.positions} records from {window.positions_read} "
        f"positions ({window.positions_read / max(elapsed, 1e-9):.0f} positions/s); skipped "
        f"{len(window.chunks_skipped)} chunks, dropped {window.duplicate_games} duplicate games, capped "
        f"{window.capped_positions_removed} positions"
    )
    for chunk, reason in window.chunks_skipped[:SKIPPED_CHUNKS_SHOWN]:
        progress(f"skipped {storage.url(chunk)}: {reason}")
    if len(window.chunks_skipped) > SKIPPED_CHUNKS_SHOWN:
        progress(
            f"... and {len(window.chunks_skipped) - SKIPPED_CHUNKS_SHOWN} more skipped chunks, "
            f"named in {storage.url(window.path)}"
        )
    retain_windows(config, storage)
    return window


def claim_window(config: ShuffleConfig, storage, context) -> Lease:
    """A one-shot job's claim of its window, renewed in the background while it builds.

    With it the job's attempt is live to a follower's clean-up
    (pipeline.lake_view.remove_dead_tmp), which would otherwise delete its
    pieces under it, and a follower waits for the window instead of building
    it too.  A window another job holds is refused in one line.
    """
    generation = context.target_generation
    held = try_claim(storage, generation, holder_id(), context.attempt, config.claim_seconds, ONE_SHOT_CLAIM_TAKEOVER)
    if not isinstance(held, Lease):
        raise ShuffleError(
            f"window {generation} is being built by {held.holder} (attempt {claim_attempt(held)}); "
            f"its claim {storage.url(layout.window_claim(generation))} expires "
            f"{describe_time(held.expires, time.time())} unless renewed: wait for that job"
        )
    if held.took_over is not None:
        progress(
            f"window {generation}: took over the claim of {held.took_over.holder} "
            f"(attempt {claim_attempt(held.took_over)})"
        )
        clean_tmp(storage, context.attempt, stale_temp_files=False)  # that attempt's pieces are dead now
    held.start_renewing()
    return held


def build(config: ShuffleConfig, storage, context, bundles, beam_args) -> None:
    """Run the Beam pipeline that writes the window; its temporary pieces and model copies are gone after.

    A lake error that fails it (a shard the disk refuses) becomes a ShuffleError naming the object.
    """
    import apache_beam as beam

    from pipeline.transforms import ShuffleWindow

    options, runner = pipeline_options(config, list(beam_args))
    if runner is None and context.model_generation is not None:
        # The local workers' model copies live in one folder of the job's, removed below however the
        # workers ended (pipeline.transforms.LabelBundleFn.model_cache).
        context = dataclasses.replace(context, model_cache_dir=tempfile.mkdtemp(prefix="zerolake-shuffle-"))
    progress(
        "running the Beam pipeline"
        + (f" on {runner}" if runner else f" locally (FnApiRunner, {config.workers} workers)")
    )
    pipeline = beam.Pipeline(runner=None if runner else local_runner(config), options=options)
    _ = pipeline | "Window bundles" >> beam.Create(bundles) | "Shuffle window" >> ShuffleWindow(context)
    try:
        pipeline.run().wait_until_finish()
    except Exception as exc:
        if _raised_by(exc, Terminated):
            # One worker runs the DoFns in this process, so SIGTERM's Terminated can rise inside one,
            # and Beam re-raises it as a RuntimeError (three tracebacks, exit 1): a stop, not a bug.
            raise Terminated from None
        message = lake_error(exc)
        if message is None:
            raise  # a bug: its traceback, whole
        raise ShuffleError(message) from None
    finally:
        if context.model_cache_dir is not None:
            shutil.rmtree(context.model_cache_dir, ignore_errors=True)
        try:
            removed = cleanup_tmp(storage, context)
        except StorageError as exc:  # the disk that failed the job may refuse deletes too
            print(
                f"warning: the temporary files under {storage.url(context.tmp_dir)} stay ({exc}); "
                f"the next job removes them",
                file=sys.stderr,
            )
        else:
            if removed:
                progress(f"removed {removed} temporary files under {storage.url(context.tmp_dir)}")


def retain_windows(config: ShuffleConfig, storage):
    """Delete the finished windows beyond --keep-windows (pipeline.retention); one progress line.

    Runs once the job's own window is complete.  A storage error here is a
    warning, not a failed job: the window is written, and the next run
    finishes the deletes (an interrupted delete leaves a "leftover" that
    retention removes whole).  Returns the RetentionResult, None on error.
    """
    try:
        result = apply_retention(storage, config.keep_windows)
    except (StorageError, RegistryError) as exc:
        print(f"warning: window retention stopped ({exc}); the next run finishes it", file=sys.stderr)
        return None
    progress(result.describe())
    return result


def cleanup_tmp(storage, context) -> int:
    """Delete what is left of this attempt's temporary pieces."""
    return delete_tmp_dir(storage, context.tmp_dir)


def build_parser() -> argparse.ArgumentParser:
    parser = role_parser(
        ShuffleConfig,
        prog="python -m pipeline.shuffle",
        description="Label, deduplicate and shuffle the lake's newest games into ROOT/windows/<gen>/.",
        epilog="Unknown flags go to Apache Beam (e.g. --runner DataflowRunner --project P --region R "
        "--temp_location gs://B/tmp --setup_file ./setup.py).  Without --runner the job runs "
        "locally on Beam's in-process FnApiRunner.",
    )
    # Internal: how a follower starts the child job that builds one claimed window.
    parser.add_argument("--window-generation", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--attempt", default=None, help=argparse.SUPPRESS)
    return parser


def misspelled_own_flags(beam_args) -> list[tuple[str, str]]:
    """``(given, flag)`` for each of ``beam_args`` that is one of this job's own flags spelled with
    underscores (``--window_exponent`` for ``--window-exponent``).

    Each setting has one name, the dashed one.  What the parser does not know goes on to Beam, which
    would drop such a spelling with a warning and build the window with the setting's default: the
    job refuses it instead.  Beam's own options (``--temp_location``) are no field of ShuffleConfig.
    """
    own = {flag_name(f.name) for f in dataclasses.fields(ShuffleConfig) if "_" in f.name}
    found = []
    for arg in beam_args:
        given = arg.split("=", 1)[0]
        if given.startswith("--") and "_" in given and given.replace("_", "-") in own:
            found.append((given, given.replace("_", "-")))
    return found


def main(argv=None) -> int:
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    misspelled = misspelled_own_flags(beam_args)
    if misspelled:
        parser.error(
            "; ".join(f"{given}: this job's flags are dashed, use {flag}" for given, flag in misspelled)
            + " (only Beam's own options, passed on to Beam, keep underscores)"
        )
    config = from_args(args, parser)
    if config.follow:
        from pipeline.follow import follow

        return follow(config, beam_args)
    events = EventLog(config.events or None, "shuffle")
    events.emit("started", follow=False)
    try:
        # SIGTERM (operations.loop and a follower stop the job so) unwinds: the
        # run's clean-up removes its temporary files and releases its claim.
        with terminated_by_sigterm():
            window = run(config, beam_args, target=args.window_generation, attempt=args.attempt)
    except (ShuffleError, StorageError, RegistryError) as exc:
        # The lake's own errors name the object (an unreachable bucket, a
        # broken LATEST): one line, not a traceback.
        print(f"error: {exc}", file=sys.stderr)
        events.emit("stopped", reason="error")
        return 2
    except Terminated:
        print("stopped by SIGTERM: no window published, the job's temporary files removed", file=sys.stderr)
        events.emit("stopped", reason="SIGTERM")
        return EXIT_TERMINATED
    events.emit(
        "window_published", generation=window.target_generation, positions=window.positions, shards=len(window.shards)
    )
    events.emit("stopped", reason="done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
