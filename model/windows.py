"""Finding work in the lake: run.json's board size and which window to train.

A *window* is ``windows/<gen>/`` (format.layout): shards, then its manifest last; a folder without
a manifest is still being written and is ignored.  Its ``target_generation`` is the model
generation trained from it.  *LATEST* is the newest published generation; a *candidate* is a
window with a manifest newer than LATEST, *bad* when its manifest fails
format.window_manifest.read_window_manifest or names another board size; *current* is the window the
checkpoint was training (-1 for none).

`plan_next`, the same in one-shot and follow mode: the current window if it is still a good
candidate (a window is never abandoned mid-way), else the newest good candidate.  Every other
candidate older than the choice, and every bad one, is *skipped*: reported once (a
``window_skipped`` event) and listed in the published model's ``skipped_windows``; in one-shot
mode a bad candidate is an error (exit 2).  Nothing here imports TensorFlow.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from cloud.base import NotFound
from format import layout
from format.documents import ManifestError
from format.run_config import NoRun, RunConfigMismatch, require_run_config
from format.window_manifest import WindowManifest, read_window_manifest

log = logging.getLogger(__name__)


class LakeError(RuntimeError):
    """The lake cannot be trained from as asked; the message says why and where."""


Window = WindowManifest
"""A complete training window: the window manifest's one typed owner, format.window_manifest.WindowManifest."""


def window_steps(window: Window, global_batch: int, epochs: float) -> int:
    """Training steps for ``epochs`` passes over ``window`` at ``global_batch`` (at least 1)."""
    return max(1, math.ceil(window.positions * epochs / global_batch))


def new_rows(window: Window, previous_lake_bytes: int | None) -> int | None:
    """Rows that arrived in the lake between the plan of the previous window trained and ``window``'s plan.

    The window's plan records the lake's chunk bytes and the rows kept per byte
    ('window.lake_bytes', 'window.positions_per_byte'); ``previous_lake_bytes``
    is the former of the window the trainer trained before (0 before any model:
    every row is new).  None when either is unknown (an older manifest or model).
    Bytes, not two row estimates, are subtracted: each window estimates rows per
    byte afresh, and the difference of two estimates of a large lake would drown
    the new rows in the estimates' noise.
    """
    if previous_lake_bytes is None or window.planned_lake_bytes is None or window.positions_per_byte is None:
        return None
    return max(0, round((window.planned_lake_bytes - previous_lake_bytes) * window.positions_per_byte))


def samples_per_row_steps(
    rows: int, samples_per_row: float, global_batch: int, min_steps: int = 1, max_steps: int = 0
) -> int:
    """``ceil(rows x samples_per_row / global_batch)`` within ``[min_steps, max_steps]`` (0 = no maximum):
    the steps that train each of ``rows`` new rows about ``samples_per_row`` times (KataGo's samples per new
    row), bounded so that a window is never empty nor so long that the workers wait on one model for ever."""
    steps = max(min_steps, math.ceil(rows * samples_per_row / global_batch))
    return min(steps, max_steps) if max_steps else steps


def lake_board_size(storage, flag_board_size: int) -> int:
    """The run's board size; refuses a missing run.json or a disagreeing flag (one LakeError line)."""
    try:
        return require_run_config(storage, flag_board_size, creator="self-play or the pipeline").board_size
    except (NoRun, RunConfigMismatch) as exc:
        raise LakeError(str(exc)) from None


@dataclass(frozen=True)
class Skipped:
    """A window the trainer will not train, and why (``reason`` names object and field for a bad one)."""

    generation: int
    reason: str

    def as_metadata(self) -> dict:
        return {"generation": self.generation, "reason": self.reason}


@dataclass(frozen=True)
class WindowScan:
    """The candidates found by one look at the lake, oldest first."""

    good: tuple[Window, ...]
    bad: tuple[Skipped, ...]


def manifest_generations(storage) -> list[int]:
    """Generations whose window manifest exists (complete or not valid), ascending."""
    generations = (
        layout.window_generation(info.path)
        for info in storage.list(layout.windows_prefix())
        if layout.is_window_manifest(info.path)
    )
    return sorted(g for g in generations if g is not None)  # a manifest's path always has one


def read_window(storage, generation: int, board_size: int) -> Window:
    """One window from its manifest; ManifestError (object and field) if it is unusable.

    Every shard the manifest names must exist, and the board size must be
    the run's.  A manifest that vanished raises the storage layer's NotFound.
    """
    manifest = read_window_manifest(storage, generation, check_shards=True)
    if manifest.board_size != board_size:
        raise ManifestError(
            storage.url(manifest.path),
            "board_size",
            f"is {manifest.board_size}; this run (run.json) is {board_size}x{board_size}",
        )
    return manifest


def scan_windows(storage, board_size: int, newer_than: int | None, also: int = -1) -> WindowScan:
    """Read every candidate (generation > ``newer_than``, plus generation ``also``)."""
    floor = -1 if newer_than is None else newer_than
    good, bad = [], []
    for generation in manifest_generations(storage):
        if generation <= floor and generation != also:
            continue
        try:
            good.append(read_window(storage, generation, board_size))
        except ManifestError as exc:
            bad.append(Skipped(generation, str(exc)))
        except NotFound:
            continue
    return WindowScan(tuple(good), tuple(bad))


@dataclass(frozen=True)
class Plan:
    """What to train next: ``window`` (None = nothing yet), whether it resumes the
    checkpoint's window, and every candidate skipped for good (oldest first)."""

    window: Window | None
    resume: bool
    skipped: tuple[Skipped, ...]

    def skipped_below(self) -> list[Skipped]:
        """The skipped windows older than the chosen one (recorded in its model's metadata)."""
        if self.window is None:
            return []
        return [s for s in self.skipped if s.generation < self.window.target_generation]


def plan_next(scan: WindowScan, latest: int | None, current: int = -1, current_published: bool = False) -> Plan:
    """Choose the window to train (see the module docstring).  Pure: no I/O."""
    floor = -1 if latest is None else latest
    good = {w.target_generation: w for w in scan.good}
    skipped = [s for s in scan.bad if s.generation > floor]
    chosen, resume = None, False
    if current >= 0 and not current_published:
        if current in good and current > floor:
            chosen, resume = good[current], True
        elif current <= floor:
            skipped.append(
                Skipped(
                    current,
                    f"stale: it was being trained when {layout.LATEST} moved to "
                    f"{floor}, so publishing it would move generations backwards",
                )
            )
    if chosen is None:
        fresh = [g for g in good if g > floor]
        if fresh:
            chosen = good[max(fresh)]
    if chosen is not None:
        target = chosen.target_generation
        for generation in sorted(good):
            if floor < generation < target:
                skipped.append(
                    Skipped(
                        generation,
                        f"superseded: window {layout.generation_dir(target)} "
                        "is newer, and the trainer trains only the newest",
                    )
                )
    unique = {s.generation: s for s in sorted(skipped, key=lambda s: s.generation)}
    return Plan(chosen, resume, tuple(unique[g] for g in sorted(unique)))
