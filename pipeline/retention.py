"""Window retention: delete the training windows the trainer has finished, keep the newest K.

The shuffle job (pipeline.shuffle) calls :func:`apply_retention` after each
run, so one-shot runs and ``--follow`` (whose child job is that same
command) both keep ``windows/`` bounded.  Data flow: one read of
``models/LATEST``, one listing of ``windows/``, a pure decision
(:func:`plan_retention`), then deletes through the storage interface
(cloud.storage; local folders and gs:// alike).

Terms
-----
* *LATEST*: the newest published model generation (format.registry); it
  only moves forward (compare-and-swap, ``advance_latest``).
* *window G*: every object under ``windows/<G>/`` (format.layout); it is
  *complete* once its ``MANIFEST.json`` exists.
* *finished*: G <= LATEST.  *open*: G > LATEST.
* *K*: ``--keep-windows``.  The newest K complete finished windows are kept
  (for inspection and for the follower, which measures new games against the
  newest window's manifest); K = 0 turns retention off (nothing is deleted).

The rule: a finished window is never read again, an open one may be
--------------------------------------------------------------------
Proved from the trainer's code (model/windows.py, model/cycle.py):

1. The trainer reads shards only in ``TrainingRun.train_window``, of the
   window ``choose_window`` returned, which is ``plan_next(...).window``.
2. ``plan_next`` returns either the checkpoint's window, and only when
   ``current > floor`` (floor = LATEST, -1 before any model), or the newest
   good window with ``generation > floor``.  So a window is chosen only
   while it is open, and a checkpoint's window with G <= LATEST is never
   resumed: it is either published (``current_published``) or reported
   stale and skipped.
3. LATEST only moves forward, so a finished window stays finished.
4. Publishing reads no shard (only the manifest's path, in the metadata);
   ``_finish_interrupted_publish`` only moves LATEST to a window already
   published.  Stage mode copies only the chosen (open) window's shards.

So deleting only finished windows never removes a window that a checkpoint
or a running trainer reads, with one exception that cannot be avoided by any
order: a trainer that lost its lease while another trainer published past
its window may still be reading that window's shards until its next
step-call boundary, where it stops anyway (model.lease).

Other readers: the follower's target is the first generation from LATEST + 1
up without a manifest, and it reads only window target - 1, the newest
complete one (kept: open windows are never deleted, and K >= 1 keeps the
newest finished one); the one-machine loop looks only at window LATEST + 1;
the shuffle job only at its own target (LATEST + 1, or the follower's).

Order of deletion: the manifest first, then every other object of the folder
--------------------------------------------------------------------------
* A reader trusts a window only through its manifest, validated with every
  shard it names present (format.window_manifest.read_window_manifest).  Once the
  manifest is gone the folder is "incomplete, ignored" for every role, so no
  reader ever trusts a half-deleted window.  Deleting shards first would
  leave, for a while or after a crash, a manifest naming missing shards:
  a window every role refuses as damaged, and that a one-shot trainer whose
  checkpoint names it reports as an error.
* A crash mid-delete leaves a folder without a manifest whose generation is
  <= LATEST: a *leftover*.  No role can use it (it is ignored as incomplete,
  and a manifest written there later would be for a window the trainer never
  trains), so the next run deletes leftovers whole.  The same rule removes
  the stray shards of an attempt that lost its window to another follower
  and kept writing after the winner's window was published.

Concurrent retention runs (two followers) delete the same objects; every
delete is ``missing_ok``, so either finishing is enough.
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
        never = f"; open (newer than LATEST {plan.latest}, never deleted): {_generations(plan.open)}" \
            if plan.open else ""
        if not self.deleted:
            return f"retention: nothing to delete; {kept}{never}"
        parts = []
        if plan.delete:
            parts.append(f"finished windows {_generations(plan.delete)}")
        if plan.leftovers:
            parts.append(f"the rest of interrupted deletes {_generations(plan.leftovers)}")
        return (f"retention: deleted {' and '.join(parts)} ({self.objects_deleted} objects, "
                f"{self.bytes_deleted / 1e6:.1f} MB); {kept}{never}")


def _generations(generations) -> str:
    return ", ".join(layout.generation_dir(g) for g in generations)


def plan_retention(listing, latest: int | None, keep: int) -> RetentionPlan:
    """Decide from a listing of ``windows/`` (ObjectInfo) and LATEST.  Pure: no I/O.

    ``keep`` >= 1 keeps the newest ``keep`` complete finished windows;
    ``keep`` = KEEP_ALL keeps everything.  Raises ValueError for ``keep`` < 0.
    """
    if keep < 0:
        raise ValueError(f"keep must be >= 0 (0 = keep every window), got {keep}")
    folders: dict[int, bool] = {}          # generation -> has a manifest
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
