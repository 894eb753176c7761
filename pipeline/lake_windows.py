"""The lake as the shuffle job and its follower both see it; imported by both, importing neither.

`pipeline.shuffle` builds one window; `pipeline.follow` watches the lake and
starts that job, as a child process, whenever enough new games are in.  What
both need lives here, below them: the error they print without a traceback
(`ShuffleError`), their progress lines, run.json checked against the flags,
the newest published model, a window already in the lake (validated, or
refused as untrusted), and the attempt ids and temporary folders of jobs.
"""
from __future__ import annotations

import time
import uuid

from format import layout
from format.run_config import NoRun, RunConfigMismatch, require_run_config
from pipeline.config import ShuffleConfig


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


def untrusted_window(exc: layout.ManifestError, generation: int) -> str:
    """The operator's message for a window manifest that does not validate."""
    return (f"{exc}\n  window {generation} cannot be trusted and is never overwritten (its manifest is "
            f"create-only): move {layout.window_dir(generation)}/ aside or delete it, and the job rebuilds it")


def existing_window(storage, generation: int) -> layout.WindowManifest | None:
    """The validated window ``generation`` (every shard present), None if it has no manifest yet.

    A manifest that exists but does not validate raises ShuffleError.
    """
    from cloud.storage import NotFound
    try:
        return layout.read_window_manifest(storage, generation, check_shards=True)
    except NotFound:
        return None
    except layout.ManifestError as exc:
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
