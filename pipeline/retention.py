"""Window retention: delete the training windows the trainer has finished, keep the newest K.

The shuffle job calls `apply_retention` after each run: one read of ``models/LATEST``, one listing
of ``windows/``, a pure decision (`plan_retention`), then deletes through cloud.storage.
*Window G* is everything under ``windows/<G>/``, *complete* once its ``MANIFEST.json`` exists,
*finished* when G <= LATEST, else *open*.  *K* is ``--keep-windows``: the newest K complete finished
windows are kept (the follower measures new games against the newest manifest); K = 0 deletes nothing.

Finished windows are safe to delete: the trainer only chooses or resumes an open window
(model.windows.plan_next), publishing reads no shard, and LATEST never moves back; the follower,
the loop and the shuffle job read only open windows or the newest complete one.  (A trainer that
lost its lease while another published past its window stops at its next step-call boundary.)
Order: the manifest first, then the rest, since readers trust a window only through its manifest;
a folder left without one at G <= LATEST (a *leftover*: a crash mid-delete, a losing attempt's
shards) is deleted whole.  Deletes are ``missing_ok``, so concurrent runs are harmless.
"""

from __future__ import annotations

import dataclasses

from format import layout
from format.registry import latest_generation

KEEP_ALL = 0
"""``--keep-windows 0``: retention is off; no window is ever deleted."""


@dataclasses.dataclass(frozen=True)
class RetentionPlan:
    """What one look at ``windows/`` decided (generations ascending)."""

    keep: int
    """K, as asked for (KEEP_ALL: retention off)."""
    latest: int | None
    """LATEST when the look was taken (None: no model yet, nothing is finished)."""
    kept: tuple[int, ...]
    """Complete finished windows kept: the newest K of them."""
    open: tuple[int, ...]
    """Windows newer than LATEST (complete or being written): never deleted."""
    delete: tuple[int, ...]
    """Complete finished windows beyond the newest K."""
    leftovers: tuple[int, ...]
    """Finished folders without a manifest: an interrupted delete (or a late
    attempt's strays); deleted whole."""


@dataclasses.dataclass(frozen=True)
class RetentionResult:
    """What :func:`apply_retention` did."""

    plan: RetentionPlan
    objects_deleted: int
    bytes_deleted: int

    @property
    def deleted(self) -> tuple[int, ...]:
        """Every generation whose folder was emptied (windows and leftovers)."""
        return tuple(sorted(self.plan.delete + self.plan.leftovers))

    def describe(self) -> str:
        """One progress line: what was deleted and what is kept, and why."""
        plan = self.plan
        if plan.keep == KEEP_ALL:
            return "retention: off (--keep-windows 0); every window is kept"
        if plan.latest is None:
            return "retention: no published model yet, so no window is finished; nothing deleted"
        kept = f"kept finished {_generations(plan.kept)}" if plan.kept else "no finished window kept"
        never = (
            f"; open (newer than LATEST {plan.latest}, never deleted): {_generations(plan.open)}" if plan.open else ""
        )
        if not self.deleted:
            return f"retention: nothing to delete; {kept}{never}"
        parts = []
        if plan.delete:
            parts.append(f"finished windows {_generations(plan.delete)}")
        if plan.leftovers:
            parts.append(f"the rest of interrupted deletes {_generations(plan.leftovers)}")
        return (
            f"retention: deleted {' and '.join(parts)} ({self.objects_deleted} objects, "
            f"{self.bytes_deleted / 1e6:.1f} MB); {kept}{never}"
        )


def _generations(generations) -> str:
    return ", ".join(layout.generation_dir(g) for g in generations)


def plan_retention(listing, latest: int | None, keep: int) -> RetentionPlan:
    """Decide from a listing of ``windows/`` (ObjectInfo) and LATEST.  Pure: no I/O.

    ``keep`` >= 1 keeps the newest ``keep`` complete finished windows;
    ``keep`` = KEEP_ALL keeps everything.  Raises ValueError for ``keep`` < 0.
    """
    if keep < 0:
        raise ValueError(f"keep must be >= 0 (0 = keep every window), got {keep}")
    folders: dict[int, bool] = {}  # generation -> has a manifest
    for info in listing:
        generation = layout.window_generation(info.path)
        if generation is None:
            continue
        folders[generation] = folders.get(generation, False) or layout.is_window_manifest(info.path)
    floor = -1 if latest is None else latest
    finished = sorted(g for g, complete in folders.items() if g <= floor and complete)
    leftovers = sorted(g for g, complete in folders.items() if g <= floor and not complete)
    opened = tuple(sorted(g for g in folders if g > floor))
    if keep == KEEP_ALL or latest is None:
        return RetentionPlan(keep, latest, tuple(finished), opened, (), ())
    kept, delete = finished[-keep:], finished[:-keep]
    return RetentionPlan(keep, latest, tuple(kept), opened, tuple(delete), tuple(leftovers))


def delete_window(storage, generation: int, objects) -> tuple[int, int]:
    """Delete one window folder's ``objects`` (ObjectInfo), manifest first, then the window's claim;
    (objects, bytes).

    The manifest goes first so that no reader trusts the window from then on
    (see the module docstring); the shards follow in any order.  The claim
    (``cluster/claims/window-<G>.json``) goes last: it was needed only while
    the window was being made, and without this every window ever made would
    leave its claim in the lake for good (one object a window, found by the
    soak check).  A follower never claims a finished window again: it claims
    only generations above LATEST.
    """
    manifest = layout.window_manifest(generation)
    ordered = sorted(objects, key=lambda info: info.path != manifest)
    for info in ordered:
        storage.delete(info.path, missing_ok=True)
    storage.delete(layout.window_claim(generation), missing_ok=True)
    return len(ordered), sum(info.size for info in ordered)


def apply_retention(storage, keep: int) -> RetentionResult:
    """Read LATEST, list ``windows/``, delete what :func:`plan_retention` says.

    LATEST is read before the listing: it only moves forward, so a value
    that is stale by the time of the deletes is only more cautious.
    Storage errors propagate (the caller reports them; the next run
    finishes the job, see "leftovers").  With KEEP_ALL nothing is read.
    """
    if keep == KEEP_ALL:
        return RetentionResult(RetentionPlan(keep, None, (), (), (), ()), 0, 0)
    latest = latest_generation(storage)
    listing = storage.list(layout.windows_prefix())
    plan = plan_retention(listing, latest, keep)
    by_generation: dict[int, list] = {}
    for info in listing:
        generation = layout.window_generation(info.path)
        if generation is not None:
            by_generation.setdefault(generation, []).append(info)
    objects = size = 0
    for generation in sorted(plan.delete + plan.leftovers):
        count, nbytes = delete_window(storage, generation, by_generation[generation])
        objects += count
        size += nbytes
    return RetentionResult(plan, objects, size)
