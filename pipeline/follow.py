"""``python -m pipeline.shuffle --root ROOT --follow``: a new window whenever enough new games arrived.

A *follower* runs `follow`; several may follow one lake, meeting only through the storage root.
The *target* is the next window: one past the newest with a manifest (the commit point; never
redone), never below the latest model + 1.  *New positions*: those in chunks that arrived since the
newest window was planned, estimated from the listing of ``games/`` (bytes less its manifest's
``lake_bytes``, times its ``positions_per_byte``; a look lists the newest folders, the whole once an
hour).  The *cadence rule*: a window is due when they reach ``--follow-new-positions`` (default
FOLLOW_WINDOW_FRACTION of the power-law window W(T)).
``--follow-max-untrained K`` waits while K windows newer than models/LATEST exist;
``--samples-per-row`` sizes shards to what training reads (`Follower.window_reuse`).  A *claim*
(``cluster/claims/window-<gen>.json``, a format.leases record) is taken by compare-and-swap,
renewed while the window is built, and replaced once expired; an *attempt* is one try at a window.

One cycle: look (wait while new < needed) -> clean dead attempts' tmp pieces -> claim (lost: wait)
-> build in a child ``python -m pipeline.shuffle ... --window-generation G --attempt A`` (its own
session; on Dataflow above ``--dataflow-above-positions``) -> publish event, release the claim.
SIGTERM stops the child, cancels its Dataflow job, deletes its pieces and releases the claim.  A
manifest that does not validate is never trusted or overwritten: the follower names it and waits.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import subprocess
import sys
import time

from cloud.base import ObjectInfo, StorageError
from format import layout
from format.events import EventLog
from format.leases import Lease, LeaseLost, LeaseRecord, describe_time
from format.registry import RegistryError
from format.window_manifest import WindowManifest
from pipeline import dataflow_jobs as DJ
from pipeline import window_plan as W
from pipeline.config import FOLLOW_WINDOW_FRACTION, ShuffleConfig, window_argv
from pipeline.lake_view import (
    JOB,
    STALE_TEMP_SECONDS,
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
from processes.children import STOP_GRACE_SECONDS, die_with_parent, start_child, stop_groups

WAIT_REPORT_SECONDS = 30.0
"""At most one human 'waiting' line and one 'waiting' event per this many seconds."""
RETRY_SECONDS = 30.0
"""Pause after a child job failed before the window is tried again."""
MIN_REUSE = 0.001
"""The least --reuse `Follower.window_reuse` gives a window, so that even a huge window holds some rows."""
FULL_LISTING_SECONDS = 3600.0
"""How often a follower lists the whole of ``games/``.  Between those, a look lists only the newest
generations' folders (`Follower.list_chunks`): a chunk that a worker slow to load new models writes
under an older generation is counted within this time."""
RECENT_GENERATIONS = 2
"""Generation folders below the newest chunk's that a look lists again (workers load a new model
within a poll or two; a straggler further behind waits for the next full listing)."""


# ---------------------------------------------------------------------------
# Temporary pieces (claims and dead attempts: pipeline.lake_view)
# ---------------------------------------------------------------------------


def remove_stray_shards(storage, window: WindowManifest) -> int:
    """Delete objects in a published window's folder that its manifest does not name (shards, game table).

    They are shards of attempts that were stopped, killed or lost a race.
    Only safe after publication: before it, a slow attempt whose claim was
    taken over may still publish a manifest naming its own shards.
    """
    keep = set(window.files) | {window.path}
    stray = [
        info.path for info in storage.list(layout.window_dir(window.target_generation) + "/") if info.path not in keep
    ]
    for path in stray:
        storage.delete(path, missing_ok=True)
    return len(stray)


# ---------------------------------------------------------------------------
# Looking at the lake
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Outlook:
    """What one look at the lake found."""

    target: int
    new_positions: int
    needed: int
    window_positions: int = 0
    """The window the power-law rule would take from the lake now (an estimate: the job plans the exact one)."""
    refusal: str = ""
    """Non-empty: why no window may be built now (an untrusted manifest, no run.json)."""
    untrained: int = 0
    """Windows newer than models/LATEST (the trainer's work in hand), for --follow-max-untrained."""


@dataclasses.dataclass(frozen=True)
class LakeListing:
    """What a look knows of games/: the relisted folders' chunks and the whole lake's totals."""

    recent: list[W.ChunkRef]
    """The chunks of the folders a look lists again (RECENT_GENERATIONS below the newest and up), newest first."""
    lake_bytes: int
    lake_chunks: int


class Follower:
    """The follow loop's state; `run` is the loop.  ``stop_reason`` is set by a signal."""

    def __init__(self, config: ShuffleConfig, beam_args, storage, events: EventLog):
        self.config = config
        self.beam_args = list(beam_args)
        self.storage = storage
        self.events = events
        self.holder = holder_id()
        self.stop_reason = ""
        self._newest_window: WindowManifest | None = None
        """The one window manifest kept: the newest read.  Only the newest window is ever looked at again
        (``look`` measures new games against it), and a manifest lists every game id of its window (MBs at
        scale), so keeping each one read would grow a follower that runs for weeks by one per window."""
        self._sampled_per_byte: float | None = None
        self._recent: dict[int, list[W.ChunkRef]] | None = None
        """The chunks of the folders a look lists again, by generation, as of the last look (`list_chunks`)."""
        self._older: dict[int, tuple[int, int]] = {}
        """(bytes, chunks) of each folder below those, as of the last full listing: a look needs only the
        lake's total of them, and a month of a hundred workers makes millions of chunks."""
        self._next_full_listing = -math.inf
        self.listed = 0
        """Objects the last look listed: what a poll costs (the ``looked`` event carries it)."""
        self._last_report = -math.inf
        self._reported: set = set()
        self._next_temp_sweep = -math.inf
        self.run_label = DJ.run_label(config.root)
        self.dataflow: DJ.Dataflow | None = None
        """Lists and cancels this run's Dataflow jobs (pipeline.dataflow_jobs); None without Dataflow flags."""
        self.dataflow_problem = ""
        if names_dataflow(self.beam_args):
            try:
                self.dataflow = DJ.Dataflow.from_beam_args(self.beam_args)
            except ValueError as exc:
                self.dataflow_problem = str(exc)

    # ---- stopping ----

    def request_stop(self, signum, _frame=None) -> None:
        self.stop_reason = signal.Signals(signum).name

    def sleep(self, seconds: float) -> None:
        """Sleep in short slices, so that a signal ends the sleep at once."""
        deadline = time.monotonic() + seconds
        while not self.stop_reason and time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def say_once(self, key, message: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            print(message, file=sys.stderr, flush=True)

    # ---- the loop ----

    def run(self) -> int:
        try:
            check_run_config(self.config, self.storage)
        except ShuffleError as exc:
            if "does not exist" not in str(exc):
                print(f"error: {exc}", file=sys.stderr)
                return 2
        except StorageError as exc:
            # Unreachable at start-up is most often a wrong root or missing
            # credentials: say so and stop, rather than wait on it forever.
            print(f"error: cannot reach the root {self.config.root}: {exc}", file=sys.stderr)
            return 2
        self.events.emit("started", follow=True, holder=self.holder)
        progress(f"following {self.config.root} as {self.holder}")
        if self.dataflow_problem:
            print(
                f"warning: {self.dataflow_problem}; a job this follower leaves runs to its window's end",
                file=sys.stderr,
                flush=True,
            )
        try:
            self.clean()
        except StorageError as exc:  # a read-only disk, say: warned as below; each build cleans again
            self.say_once(("storage", str(exc)), f"warning: {exc}; retrying every {self.config.poll_seconds:g} s")
        while not self.stop_reason:
            try:
                self.cycle()
            except StorageError as exc:
                # The store's own retries are spent.  A follower outlives outages:
                # an unreleased claim expires, dead tmp pieces are cleaned later.
                self.say_once(("storage", str(exc)), f"warning: {exc}; retrying every {self.config.poll_seconds:g} s")
                self.sleep(self.config.poll_seconds)
        self.events.emit("stopped", reason=self.stop_reason)
        progress(f"stopped ({self.stop_reason})")
        return 0

    def cycle(self) -> None:
        """One look at the lake, then wait, or build the next window.

        Each look is a ``looked`` event: what a watcher (or a test) counts to know
        that the follower looked and decided, instead of sleeping and hoping."""
        outlook = self.look()
        self.events.emit(
            "looked",
            generation=outlook.target,
            new_positions=outlook.new_positions,
            needed=outlook.needed,
            refused=bool(outlook.refusal),
            listed=self.listed,
        )
        if outlook.refusal:
            self.say_once(outlook.refusal, f"error: {outlook.refusal}")
            self.sleep(self.config.poll_seconds)
        elif outlook.new_positions < outlook.needed or self.trainer_behind(outlook):
            self.report_waiting(outlook)
            self.sleep(self.config.poll_seconds)
        else:
            self.build(outlook)

    def clean(self, keep_attempt: str = "") -> None:
        """Dead attempts' pieces every time; killed writers' temporary files (a walk of the
        whole lake) at start and then at most once per STALE_TEMP_SECONDS."""
        sweep = time.monotonic() >= self._next_temp_sweep
        clean_tmp(self.storage, keep_attempt, stale_temp_files=sweep)
        if sweep:
            self._next_temp_sweep = time.monotonic() + STALE_TEMP_SECONDS

    def window(self, generation: int) -> WindowManifest | None:
        """A validated window; ShuffleError if untrusted.

        The newest one read is cached (a window is immutable once valid), and
        only it: reading another replaces it (see ``_newest_window``).
        """
        cached = self._newest_window
        if cached is None or cached.target_generation != generation:
            cached = existing_window(self.storage, generation)
            if cached is None:
                return None
            self._newest_window = cached
        return cached

    def look(self) -> Outlook:
        try:
            check_run_config(self.config, self.storage)
        except ShuffleError as exc:
            return Outlook(0, 0, 1, refusal=f"{exc}; waiting for it")
        try:
            latest = latest_model(self.storage) or 0
        except RegistryError as exc:
            return Outlook(0, 0, 1, refusal=f"{exc}; waiting for it to be fixed")
        target = latest + 1
        while self.storage.exists(layout.window_manifest(target)):
            target += 1
        untrained = target - 1 - latest
        try:
            last = self.window(target - 1) if target > 1 else None
        except ShuffleError as exc:
            return Outlook(target, 0, 1, refusal=str(exc))
        listing = self.list_chunks(latest)
        if not listing.lake_chunks:
            return Outlook(target, 0, max(1, self.config.follow_new_positions), untrained=untrained)
        lake_bytes = listing.lake_bytes
        per_byte, new_bytes = self.measure(last, listing.recent, lake_bytes)
        window = W.window_positions(
            int(lake_bytes * per_byte),
            self.config.window_min_positions,
            self.config.window_scale,
            self.config.window_exponent,
            self.config.window_max_positions,
            self.config.window_slope,
        )
        needed = self.config.follow_new_positions or max(1, math.ceil(FOLLOW_WINDOW_FRACTION * window))
        return Outlook(target, max(0, int(new_bytes * per_byte)), needed, window, untrained=untrained)

    def list_chunks(self, latest: int) -> LakeListing:
        """The lake's chunks at the cost of listing only the newest folders.

        The whole of games/ is listed at the first look and then once per FULL_LISTING_SECONDS;
        a look in between lists the folders from RECENT_GENERATIONS below the newest chunk's
        generation up to models/LATEST (``latest``), where workers write, and keeps the older
        folders' totals from the last full listing.  A month-long run's poll so lists a few
        folders, and the follower holds the chunks of those folders, not every chunk it saw.
        """
        now = time.monotonic()
        if self._recent is None or now >= self._next_full_listing:
            listing = W.list_chunks(self.storage)
            self._recent, self._older = {}, {}
            for chunk in listing:
                self._recent.setdefault(chunk.generation, []).append(chunk)
            self._next_full_listing = now + FULL_LISTING_SECONDS
            self.listed = len(listing)
        else:
            self.listed = 0
            newest = max(self._recent, default=0)
            for generation in range(max(0, newest - RECENT_GENERATIONS), max(newest, latest) + 1):
                fresh = W.parse_chunk_listing(self.storage.list(layout.games_prefix(generation)))
                self.listed += len(fresh)
                self._older.pop(generation, None)
                if fresh:
                    self._recent[generation] = fresh
                else:
                    self._recent.pop(generation, None)
        # Folders that fell below the relisted range keep only their totals.
        lowest = max(self._recent, default=0) - RECENT_GENERATIONS
        for generation in [g for g in self._recent if g < lowest]:
            folder = self._recent.pop(generation)
            self._older[generation] = (sum(c.size for c in folder), len(folder))
        recent = [chunk for folder in self._recent.values() for chunk in folder]
        recent.sort(key=lambda c: (c.generation, c.time_ms, c.path), reverse=True)
        return LakeListing(
            recent,
            lake_bytes=sum(c.size for c in recent) + sum(size for size, _ in self._older.values()),
            lake_chunks=len(recent) + sum(count for _, count in self._older.values()),
        )

    def measure(self, last: WindowManifest | None, chunks, lake_bytes: int) -> tuple[float, int]:
        """(positions per byte, bytes that arrived since ``last`` was planned).

        ``chunks``: the newest folders' chunks, newest first; ``lake_bytes``: the whole lake's.
        """
        per_byte = last.positions_per_byte if last else None
        if per_byte is None:
            if self._sampled_per_byte is None:
                try:
                    self._sampled_per_byte = W.estimate_positions_per_byte(
                        self.storage,
                        chunks,
                        self.config.sample_chunks,
                        self.config.value_only_rows,
                        self.config.after_resignation_rows,
                    )[0]
                except ValueError:
                    return 0.0, 0  # nothing decodable yet
            per_byte = self._sampled_per_byte
        if last is None:
            return per_byte, lake_bytes
        if last.planned_lake_bytes is not None:
            return per_byte, lake_bytes - last.planned_lake_bytes
        # An older manifest: count the chunks newer than the newest one it took.
        taken = W.parse_chunk_listing([ObjectInfo(p, 0) for p in last.planned_chunks])
        if not taken:
            return per_byte, lake_bytes
        newest = (taken[0].generation, taken[0].time_ms, taken[0].path)
        return per_byte, sum(c.size for c in chunks if (c.generation, c.time_ms, c.path) > newest)

    def trainer_behind(self, outlook: Outlook) -> bool:
        """--follow-max-untrained: the trainer already has that many windows in hand, so a window
        built now would supersede one it has not reached (it trains only the newest), and the
        work of building that one would be lost."""
        limit = self.config.follow_max_untrained
        return bool(limit) and outlook.untrained >= limit

    def report_waiting(self, outlook: Outlook) -> None:
        now = time.monotonic()
        if now - self._last_report < WAIT_REPORT_SECONDS:
            return
        self._last_report = now
        behind = self.trainer_behind(outlook)
        self.events.emit(
            "waiting",
            new_positions=outlook.new_positions,
            needed=outlook.needed,
            generation=outlook.target,
            untrained=outlook.untrained,
        )
        if behind:
            progress(
                f"window {outlook.target}: waiting for the trainer, {outlook.untrained} windows newer than "
                f"models/LATEST (--follow-max-untrained {self.config.follow_max_untrained}); "
                f"~{outlook.new_positions} new positions"
            )
        else:
            progress(
                f"window {outlook.target}: waiting for new games, ~{outlook.new_positions} of "
                f"{outlook.needed} new positions"
            )

    # ---- one window ----

    def build(self, outlook: Outlook) -> None:
        """Claim, build (child job) and publish window ``outlook.target``, or give way."""
        generation = outlook.target
        attempt = new_attempt_id()
        self.clean(keep_attempt=attempt)
        held = try_claim(self.storage, generation, self.holder, attempt, self.config.claim_seconds)
        if not isinstance(held, Lease):
            self.lose(generation, held)
            self.sleep(self.config.poll_seconds)
            return
        if held.took_over is not None:
            progress(
                f"window {generation}: took over the expired claim of {held.took_over.holder} "
                f"(attempt {claim_attempt(held.took_over)})"
            )
            self.clean(keep_attempt=attempt)  # that attempt's pieces are dead now
        if self.storage.exists(layout.window_manifest(generation)):
            held.release()  # published between the look and the claim
            return
        # A job of an earlier attempt at this window still running (its follower was SIGKILLed, or its
        # cancel failed) is cancelled, not waited for: holding the claim makes this attempt the only live
        # one, the clean-up above has deleted (or will delete) the dead attempt's temporary pieces under
        # it, and a dead attempt publishes nothing its follower can check, so waiting would pay for its
        # workers to the window's end for a build that cannot be trusted to finish.
        self.cancel_jobs(generation, attempt, own=False)
        reuse = self.window_reuse(outlook.new_positions, outlook.window_positions)
        command = self.window_command(generation, attempt, outlook.window_positions, reuse)
        where = "on Dataflow" if names_dataflow(command) else "in-process"
        sized = "" if reuse is None else f", reuse {reuse:g} for ~{round(reuse * outlook.window_positions)} rows"
        progress(
            f"window {generation}: ~{outlook.new_positions} new positions (needed {outlook.needed}); "
            f"building it ({where}, ~{outlook.window_positions} positions{sized}) as attempt {attempt}"
        )
        outcome = self.run_child(held, generation, command)
        if outcome != "done" and names_dataflow(command):
            # Stopping the launcher does not stop its job (pipeline.dataflow_jobs): cancelled here, on a
            # stop, a lost claim or a failed launcher alike, before the attempt's pieces are deleted.
            self.cancel_jobs(generation, attempt, own=True)
        removed = delete_tmp_dir(self.storage, layout.job_tmp_dir(JOB, generation, attempt))
        if removed:
            progress(f"removed {removed} temporary pieces of attempt {attempt}")
        if outcome == "lost":
            self.lose(generation, None)
            return
        held.release()
        if outcome == "stopped":
            progress(f"window {generation} left unpublished (attempt {attempt} stopped)")
            return
        try:
            window = existing_window(self.storage, generation)
        except ShuffleError as exc:
            self.say_once(str(exc), f"error: {exc}")
            return
        if window is None:
            print(
                f"warning: window {generation}: the job (attempt {attempt}) failed ({outcome}); "
                f"trying again in {RETRY_SECONDS:g} s",
                file=sys.stderr,
                flush=True,
            )
            self.sleep(RETRY_SECONDS)
            return
        remove_stray_shards(self.storage, window)
        if window.attempt != attempt:
            self.lose(generation, None)  # a racing attempt's manifest got there first
            return
        self._last_report = -math.inf
        self.events.emit(
            "window_published",
            generation=generation,
            positions=window.positions,
            shards=len(window.shards),
            attempt=attempt,
        )
        progress(f"window {generation} published: {window.positions} positions in {len(window.shards)} shards")

    def cancel_jobs(self, generation: int, attempt: str, *, own: bool) -> None:
        """Cancel the active Dataflow jobs of window ``generation``: this ``attempt``'s (``own``), or every
        other attempt's.  A gcloud failure is one warning line; the follower goes on either way."""
        if self.dataflow is None:
            return
        try:
            jobs = self.dataflow.active_jobs(self.run_label, generation)
        except DJ.DataflowJobsError as exc:
            print(f"warning: {exc}; a job left running ends with its window", file=sys.stderr, flush=True)
            return
        for job in jobs:
            if (job.attempt == attempt) != own:
                continue
            try:
                self.dataflow.cancel(job)
            except DJ.DataflowJobsError as exc:
                print(
                    f"warning: {exc}; it runs to its window's end unless cancelled by hand", file=sys.stderr, flush=True
                )
                continue
            whose = "this attempt" if own else f"the earlier attempt {job.attempt}"
            progress(f"window {generation}: cancelled Dataflow job {job.name} ({job.id}) of {whose}")

    def lose(self, generation: int, winner: LeaseRecord | None) -> None:
        """Another follower makes window ``generation`` (reported once per window)."""
        if ("lost", generation) in self._reported:
            return
        self._reported.add(("lost", generation))
        self.events.emit("claim_lost", generation=generation, holder=winner.holder if winner else "")
        until = f" (its claim expires {describe_time(winner.expires, time.time())} unless renewed)" if winner else ""
        progress(
            f"window {generation} is claimed by {winner.holder if winner else 'another follower'}; "
            f"waiting for it{until}"
        )

    def window_reuse(self, new_positions: int, window_positions: int) -> float | None:
        """--samples-per-row: the window's --reuse that makes its shards hold about what the trainer
        will read of it, samples per row x new rows (within --follow-min-rows, --follow-max-rows),
        drawn evenly from the whole window; never above --reuse.  None: the setting is off.

        Each row then appears in about samples-per-row x new / window of each window it is in, and
        is in about window / new windows, so it is read about samples-per-row times in all: the
        trainer's rule, without writing (and staging) shards of rows nobody reads."""
        cfg = self.config
        if not cfg.samples_per_row or window_positions <= 0:
            return None
        rows = max(cfg.samples_per_row * new_positions, cfg.follow_min_rows)
        if cfg.follow_max_rows:
            rows = min(rows, cfg.follow_max_rows)
        return float(f"{min(cfg.reuse, max(MIN_REUSE, rows / window_positions)):.4g}")

    def window_command(
        self, generation: int, attempt: str, window_positions: int, reuse: float | None = None
    ) -> list[str]:
        """The child job's ``python -m`` arguments for one window: the one-shot job's flags (with
        ``reuse`` for --reuse when given: `window_reuse`), then the Beam flags.

        With --dataflow-above-positions, a window of at most that many
        positions gets no Beam flags (the in-process runner on this machine);
        a larger one, or every window without the setting, gets them all, and
        with Dataflow flags its job's name and labels (pipeline.dataflow_jobs).
        """
        local = 0 < window_positions <= self.config.dataflow_above_positions
        config = self.config if reuse is None else dataclasses.replace(self.config, reuse=reuse)
        dataflow = not local and names_dataflow(self.beam_args)
        # The job's name and labels come last, so that they are the ones Beam keeps (`follow` refuses a
        # --job_name of the user's: one name for every window would make Dataflow return the running job).
        return [
            "pipeline.shuffle",
            *window_argv(config),
            "--window-generation",
            str(generation),
            "--attempt",
            attempt,
            *([] if local else self.beam_args),
            *(DJ.beam_flags(self.run_label, generation, attempt) if dataflow else []),
        ]

    def run_child(self, held: Lease, generation: int, module_argv: list[str]) -> str:
        """Build the window in a child job, renewing the claim: 'done', 'lost', 'stopped' or 'exit N'."""
        child = start_child(module_argv, preexec_fn=die_with_parent(os.getpid()))
        next_renewal = time.monotonic() + held.renew_every
        while True:
            try:
                code = child.wait(timeout=0.2)
                return "done" if code == 0 else f"exit {code}"
            except subprocess.TimeoutExpired:
                pass
            if self.stop_reason:
                stop_groups([child], STOP_GRACE_SECONDS["window"])
                return "stopped"
            if time.monotonic() >= next_renewal:
                try:
                    held.renew()
                except LeaseLost as exc:
                    print(f"warning: {exc}", file=sys.stderr, flush=True)
                    stop_groups([child], STOP_GRACE_SECONDS["window"])
                    return "lost"
                except StorageError as exc:  # transient: try again soon; expiry leaves slack
                    print(f"warning: renewing the claim of window {generation}: {exc}", file=sys.stderr)
                next_renewal = time.monotonic() + held.renew_every


def names_dataflow(beam_args) -> bool:
    """Whether Beam flags choose the Dataflow runner (``--runner DataflowRunner``, ``--runner=dataflow``...;
    the last ``--runner`` wins, as in Beam)."""
    runner = DJ.beam_option(beam_args, "--runner")
    return runner is not None and runner.lower() in ("dataflow", "dataflowrunner")


def follow(config: ShuffleConfig, beam_args=()) -> int:
    """Run the follower until SIGTERM or Ctrl-C (exit 0); 2 for a lake it must not touch."""
    from cloud.storage import open_storage

    if config.dataflow_above_positions and not names_dataflow(beam_args):
        print(
            "error: --dataflow-above-positions chooses between the in-process runner and Dataflow, so it needs "
            "Beam flags for Dataflow (--runner DataflowRunner --project P --region R --temp_location gs://...)",
            file=sys.stderr,
        )
        return 2
    if DJ.beam_option(beam_args, "--job_name") is not None:
        print(
            "error: --job_name: the follower names each window's Dataflow job itself "
            "(zerolake-<run>-w<window>-<attempt>, to find and cancel it); leave --job_name out",
            file=sys.stderr,
        )
        return 2
    try:
        storage = open_storage(config.root, retry=config.storage_retry)
    except ValueError as exc:
        print(f"error: --root: {exc}", file=sys.stderr)
        return 2
    events = EventLog(config.events or None, "shuffle")
    follower = Follower(config, beam_args, storage, events)
    signal.signal(signal.SIGTERM, follower.request_stop)
    signal.signal(signal.SIGINT, follower.request_stop)
    try:
        return follower.run()
    finally:
        events.close()
