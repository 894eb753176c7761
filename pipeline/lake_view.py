"""The lake as the shuffle job and its follower both see it; imported by both, importing neither.

`pipeline.shuffle` builds one window; `pipeline.follow` watches the lake and
starts that job, as a child process, whenever enough new games are in.  What
both need lives here, below them: the error they print without a traceback
(`ShuffleError`), their progress lines, run.json checked against the flags,
the newest published model, a window already in the lake (validated, or
refused as untrusted), the attempt ids and temporary folders of jobs, the
claims that make an attempt live, and the clean-up of the lake's temporary
area, which whoever starts a window does first (`clean_tmp`).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import uuid

from format import layout
from format.documents import ManifestError
from format.leases import DAMAGED_EXPIRED, Lease, LeaseRecord, Takeover, held_record
from format.run_config import NoRun, RunConfigMismatch, require_run_config
from format.window_manifest import WindowManifest, read_window_manifest
from pipeline.config import ShuffleConfig

JOB = "shuffle"
"""The job name in the temporary folders of shuffle attempts (format.layout.job_tmp_dir)."""

STALE_TEMP_SECONDS = 3600.0
"""A storage writer's temporary file this old belongs to a writer that was killed: a live one
turns its file into the object within seconds of starting it."""


class ShuffleError(Exception):
    """A problem the user can fix; printed without a traceback."""


def progress(message: str) -> None:
    print(f"[shuffle {time.strftime('%H:%M:%S')}] {message}", flush=True)


def latest_model(storage):
    from format.registry import latest_generation

    return latest_generation(storage)


def new_attempt_id() -> str:
    """Unique per run: shard names never collide with a killed attempt's leftovers."""
    return f"{int(time.time()):x}{uuid.uuid4().hex[:6]}"


def check_run_config(config: ShuffleConfig, storage):
    """ROOT/run.json, checked against --board-size (format.run_config.require_run_config); ShuffleError
    names the file and the flag."""
    try:
        return require_run_config(storage, config.board_size, creator="self-play")
    except (NoRun, RunConfigMismatch) as exc:
        raise ShuffleError(str(exc)) from None


def untrusted_window(exc: ManifestError, generation: int) -> str:
    """The operator's message for a window manifest that does not validate."""
    return (
        f"{exc}\n  window {generation} cannot be trusted and is never overwritten (its manifest is "
        f"create-only): move {layout.window_dir(generation)}/ aside or delete it, and the job rebuilds it"
    )


def existing_window(storage, generation: int) -> WindowManifest | None:
    """The validated window ``generation`` (every shard present), None if it has no manifest yet.

    A manifest that exists but does not validate raises ShuffleError.
    """
    from cloud.storage import NotFound

    try:
        return read_window_manifest(storage, generation, check_shards=True)
    except NotFound:
        return None
    except ManifestError as exc:
        raise ShuffleError(untrusted_window(exc, generation)) from None


def delete_tmp_dir(storage, tmp_dir: str) -> int:
    """Delete every object under one attempt's tmp folder; returns how many there were.

    ``missing_ok``: a follower cleaning up after a dead attempt may race
    the attempt's own cleanup; either delete is enough.
    """
    leftovers = storage.list(tmp_dir + "/")
    for info in leftovers:
        storage.delete(info.path, missing_ok=True)
    return len(leftovers)


# ---------------------------------------------------------------------------
# Claims: format.leases records, with the claims' own takeover rules
# ---------------------------------------------------------------------------

CLAIM_TAKEOVER = Takeover(damaged=DAMAGED_EXPIRED, own_period=True)
"""A damaged claim counts as expired, and a claim lives at most its last renewal plus the reader's
own ``--claim-seconds``: the window's manifest is the commit point, so two builders cost only work,
while a claim nobody may replace would stop the pipeline.  A dead local follower's claim is still
waited out, since its child's Beam workers may outlive it for a moment."""


def holder_id() -> str:
    """This process's name in the claims it takes: host, pid and a random tail."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


ONE_SHOT_CLAIM_TAKEOVER = dataclasses.replace(CLAIM_TAKEOVER, dead_local_holder=True)
"""A one-shot job also takes at once a claim whose holder ran on this host and is gone, so a job
SIGKILLed by its launcher and run again is not refused; its workers' late writes land in a dead
attempt's folder, which the next clean-up deletes."""


def claim_lease(
    storage, generation: int, holder: str, attempt: str, ttl: float, takeover: Takeover = CLAIM_TAKEOVER
) -> Lease:
    """A (not yet taken) claim on window ``generation`` for ``attempt``: a follower's, or a one-shot job's."""
    return Lease(
        storage,
        layout.window_claim(generation),
        ttl,
        takeover=takeover,
        details={"attempt": attempt},
        holder=holder,
        name=f"claim of window {generation}",
    )


def claim_attempt(record: LeaseRecord) -> str:
    """The attempt a claim record was taken for ('' for a record without one)."""
    return record.details.get("attempt", "")


def try_claim(
    storage, generation: int, holder: str, attempt: str, ttl: float, takeover: Takeover = CLAIM_TAKEOVER
) -> Lease | LeaseRecord:
    """Claim window ``generation``: the held Lease, or the live record of whoever holds it."""
    claim = claim_lease(storage, generation, holder, attempt, ttl, takeover)
    winner = claim.try_acquire()
    return claim if winner is None else winner


def live_claim(storage, generation: int) -> LeaseRecord | None:
    """The unexpired, unreleased claim of window ``generation``, else None (damaged counts as expired)."""
    return held_record(storage, layout.window_claim(generation))


# ---------------------------------------------------------------------------
# Temporary pieces
# ---------------------------------------------------------------------------


def remove_dead_tmp(storage, keep_attempt: str = "") -> list[str]:
    """Delete the tmp folders of shuffle attempts that are not live; returns the folders.

    Live = the attempt holds the unexpired claim of its window and the window
    has no manifest yet.  Every attempt that writes pieces holds one: a
    follower's child job builds under its follower's claim, and a one-shot job
    takes its own (pipeline.shuffle.run), so followers and one-shot jobs may
    share a lake.  ``keep_attempt`` (the caller's own) is kept.
    """
    folders: dict[str, tuple[int, str]] = {}
    for info in storage.list(layout.tmp_prefix()):
        parsed = layout.parse_job_tmp_dir(info.path)
        if parsed and parsed[0] == JOB:
            folders[layout.job_tmp_dir(JOB, parsed[1], parsed[2])] = (parsed[1], parsed[2])
    removed = []
    for folder, (generation, attempt) in sorted(folders.items()):
        if attempt == keep_attempt:
            continue
        if not storage.exists(layout.window_manifest(generation)):
            claim = live_claim(storage, generation)
            if claim is not None and claim_attempt(claim) == attempt:
                continue
        delete_tmp_dir(storage, folder)
        removed.append(folder)
    return removed


def remove_stale_temp_files(storage) -> int:
    """Delete storage writers' temporary files older than STALE_TEMP_SECONDS; returns how many.

    A writer killed mid-write (a Beam worker stopped with its job, a self-play
    worker killed) leaves its temporary file, which no listing shows and so no
    delete of objects reaches.  Only a local lake has them (cloud.local); a
    bucket's uploads leave nothing behind.
    """
    remove = getattr(storage, "remove_stale_temp_files", None)
    return remove(STALE_TEMP_SECONDS) if remove is not None else 0


def clean_tmp(storage, keep_attempt: str = "", *, stale_temp_files: bool = True) -> None:
    """Clean the lake's temporary area, saying what went: the pieces of dead attempts and, with
    ``stale_temp_files``, killed writers' temporary files (a walk of the whole lake).

    Whoever is about to build a window does it first (a follower, a one-shot
    job), so what a killed job leaves does not pile up.
    """
    for folder in remove_dead_tmp(storage, keep_attempt):
        progress(f"removed the temporary pieces of a dead attempt: {storage.url(folder)}")
    if stale_temp_files:
        removed = remove_stale_temp_files(storage)
        if removed:
            progress(
                f"removed {removed} temporary files of killed writers (older than "
                f"{STALE_TEMP_SECONDS:.0f} s) under {storage.url()}"
            )
