"""``python -m operations.deploy status``: how a deployed run is doing, read from its lake alone.

The roles meet only through the lake, so the lake is what says how they are doing; no VM is asked.
One listing of ``games/`` and ``windows/``, a read of ``models/LATEST`` and of the trainer's lease,
and the decoding of at most ``sample_chunks`` recent chunks give one table:

* *generation*: ``models/LATEST`` (format.registry), and the newest window with a manifest;
* *games per hour*: the bytes of chunks written in the last ``recent_minutes`` (the time in each
  chunk's name, format.layout.parse_chunk_path) times games per byte measured on the newest of them;
* *workers seen*: distinct worker processes, and machines (their ``--worker-id`` prefix), with a
  chunk in that time;
* *trainer lease*: who holds ``cluster/trainer-lease.json`` (model.lease) and until when.

With ``--project`` it also asks gcloud how many worker VMs the group runs against its target size
(which a stockout of spot VMs holds below it): `worker_group_text`.  It reads the lake through
format/ and model.lease, which is why operations.deploy sits on the operations floor.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time

from format import layout
from format.codec import FormatError, iter_chunk
from format.registry import latest_generation
from model.lease import TrainerLease, describe_time


@dataclasses.dataclass(frozen=True)
class LakeStatus:
    """What `read_status` found; `table` prints it."""

    root: str
    latest_model: int | None
    newest_window: int | None
    chunks: int
    recent_chunks: int
    games_per_hour: float | None
    """None when there are recent chunks but none of the sampled ones decoded."""
    worker_processes: int
    worker_machines: tuple[str, ...]
    lease: str
    recent_minutes: float


def worker_machine(worker_name: str) -> str:
    """The machine part of a worker name, ``<prefix>[_<host>]_<pid>_<hex>`` (selfplay.config): all but pid and hex."""
    parts = worker_name.split("_")
    return "_".join(parts[:-2]) if len(parts) > 2 else worker_name


def _lease_text(storage, now: float) -> str:
    record, _ = TrainerLease(storage).read()
    if record is None:
        return "none (no trainer has run)"
    if record.released:
        return f"released by {record.holder} at {describe_time(record.expires, now)}"
    if not record.held_at(now):
        return f"expired: {record.holder}, {describe_time(record.expires, now)}"
    return f"held by {record.holder}, expires {describe_time(record.expires, now)}"


def read_status(
    storage, *, recent_minutes: float = 60.0, sample_chunks: int = 3, now: float | None = None
) -> LakeStatus:
    """Read the lake once (see the module docstring)."""
    now = time.time() if now is None else now
    since_ms = (now - recent_minutes * 60) * 1000
    chunks = [
        (info, name)
        for info in storage.list(layout.games_prefix())
        if (name := layout.parse_chunk_path(info.path)) is not None
    ]
    recent = sorted(
        ((info, name) for info, name in chunks if name.time_ms >= since_ms),
        key=lambda pair: pair[1].time_ms,
        reverse=True,
    )
    games_per_hour = 0.0 if not recent else None
    sampled_games = sampled_bytes = 0
    for info, _ in recent[:sample_chunks]:
        games = [
            g for g in iter_chunk(storage.read(info.path), storage.url(info.path)) if not isinstance(g, FormatError)
        ]
        sampled_games, sampled_bytes = sampled_games + len(games), sampled_bytes + info.size
    if sampled_games:
        recent_bytes = sum(info.size for info, _ in recent)
        games_per_hour = recent_bytes * sampled_games / sampled_bytes * 60.0 / recent_minutes
    windows = [
        layout.window_generation(info.path)
        for info in storage.list(layout.windows_prefix())
        if layout.is_window_manifest(info.path)
    ]
    workers = {name.worker_id for _, name in recent}
    return LakeStatus(
        root=storage.url(),
        latest_model=latest_generation(storage),
        newest_window=max((w for w in windows if w is not None), default=None),
        chunks=len(chunks),
        recent_chunks=len(recent),
        games_per_hour=games_per_hour,
        worker_processes=len(workers),
        worker_machines=tuple(sorted({worker_machine(w) for w in workers})),
        lease=_lease_text(storage, now),
        recent_minutes=recent_minutes,
    )


def table(status: LakeStatus) -> str:
    """One two-column table, one row per figure."""
    minutes = f"{status.recent_minutes:g} min"
    games = (
        "unknown (recent chunks did not decode)" if status.games_per_hour is None else f"{status.games_per_hour:,.0f}"
    )
    machines = ", ".join(status.worker_machines[:8]) + (" ..." if len(status.worker_machines) > 8 else "")
    rows = [
        ("lake", status.root),
        ("latest model (models/LATEST)", "none yet" if status.latest_model is None else status.latest_model),
        ("newest complete window", "none yet" if status.newest_window is None else status.newest_window),
        ("chunks (all / last " + minutes + ")", f"{status.chunks} / {status.recent_chunks}"),
        ("games per hour (last " + minutes + ")", games),
        ("worker processes seen (last " + minutes + ")", status.worker_processes),
        ("worker machines seen", f"{len(status.worker_machines)}" + (f": {machines}" if machines else "")),
        ("trainer lease", status.lease),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


GCLOUD_TIMEOUT_SECONDS = 60.0
"""One gcloud call's limit (a listing of a large group takes seconds)."""


def worker_group_text(project: str, group: str, region: str, gcloud: str = "gcloud") -> str:
    """``"R running of T (target)"`` for the worker group, from ``gcloud compute instance-groups managed
    describe`` (its targetSize) and ``list-instances`` (each VM's instanceStatus); one line saying what
    failed when gcloud does (not installed, no permission, no such group)."""
    where = [group, f"--region={region}", f"--project={project}"]
    calls = {
        "target": ["describe", *where, "--format=value(targetSize)"],
        "statuses": ["list-instances", *where, "--format=value(instanceStatus)"],
    }
    out = {}
    for key, words in calls.items():
        command = [gcloud, "compute", "instance-groups", "managed", *words]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=GCLOUD_TIMEOUT_SECONDS)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"unknown: `{' '.join(command[:5])}` failed: {exc}"
        if result.returncode != 0:
            why = (result.stderr.strip().splitlines() or ["no message"])[-1]
            return f"unknown: `{' '.join(command[:5])}` exited {result.returncode}: {why}"
        out[key] = result.stdout.split()
    target = out["target"][0] if out["target"] else "?"
    running = sum(status == "RUNNING" for status in out["statuses"])
    others = len(out["statuses"]) - running
    return f"{running} running of {target} (target)" + (f", {others} not running yet or stopped" if others else "")
