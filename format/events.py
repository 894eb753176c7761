"""Structured progress: one JSON event per line, beside each role's human status line.

Every long-running role takes ``--events PATH`` and appends one JSON object a line to PATH ('-' =
stdout), flushed as written, so a reader (the loop, the cluster launcher, ``tail -f | jq``) learns
what the role is doing without parsing log lines, and a line survives a SIGKILL right after.
`REQUIRED` and `NOTES` are the one copy of every event and its fields, from which `spec_table`
writes format/SPEC.md's "Events" table (``python -m format.events``).  Every event carries::

    {"schema": "zerolake.event", "version": 1, "time": <unix seconds>,
     "role": "worker" | "shuffle" | "train" | "match" | "loop" | "cluster",
     "pid": <int>, "event": <name>, ...fields}

Readers call `parse_event` on each line (None for a non-event, EventError for an unknown
version) or follow a growing file with `EventTail`.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

SCHEMA = "zerolake.event"
EVENTS_VERSION = 1
ROLES = ("worker", "shuffle", "train", "match", "loop", "cluster")

# Each event and the fields it must carry beyond the common ones.  The
# writer checks them, so a typo fails in the role's own tests, not in a reader.
REQUIRED = {
    "worker": {
        "started": ("worker_id", "seed", "generation"),
        "progress": ("games", "positions", "generation", "chunks", "spooled"),
        "game_finished": ("game_id", "generation", "moves", "spool_entry"),
        "chunk_uploaded": ("path", "games", "generation"),
        "model_loaded": ("generation",),
        "model_rejected": ("generation", "error"),
        "stopped": ("reason", "games"),
    },
    "shuffle": {
        "started": ("follow",),
        "waiting": ("new_positions", "needed"),
        "looked": ("generation", "new_positions", "needed", "refused", "listed"),
        "claim_lost": ("generation",),
        "window_published": ("generation", "positions", "shards"),
        "stopped": ("reason",),
    },
    "train": {
        "started": ("strategy",),
        "lease_acquired": ("holder", "expires"),
        "window_started": ("generation", "steps"),
        "window_skipped": ("generation", "reason"),
        "progress": (
            "generation",
            "step",
            "steps",
            "loss",
            "policy_loss",
            "value_loss",
            "accuracy",
            "occupied_policy_mass",
            "examples_per_s",
        ),
        "published": ("generation", "step"),
        "diverged": ("generation", "step", "learning_rate"),
        "stopped": ("reason",),
    },
    "match": {
        "started": ("player_a", "player_b", "games"),
        "game_finished": ("index", "black", "white", "result", "moves"),
        "result": ("result",),
        "stopped": ("reason",),
    },
    "loop": {
        "phase": ("generation", "phase"),
        "throughput": ("cpu_share", "positions_per_hour", "trained_rows_per_hour"),
        "stopped": ("reason",),
    },
    "cluster": {
        "role_started": ("name", "pid"),
        "role_exited": ("name", "returncode"),
        "role_killed": ("name", "pid"),
        "status": ("generation", "games", "positions", "roles"),
        "stopped": ("reason",),
        "checked": (
            "kills",
            "games_finished",
            "games_lost",
            "games_duplicated",
            "generations",
            "latest_regressions",
            "chunk_verify_failures",
            "positions_per_s",
        ),
    },
}


# What SPEC.md says of an event beyond its fields (spec_table writes it after a colon).
NOTES = {
    ("match", "game_finished"): "`result` as SGF writes it, e.g. `B+3.5`",
    ("worker", "game_finished"): "emitted only once the game is safe in the local spool",
    ("shuffle", "looked"): "one per look at the lake in `--follow` mode (each poll), whatever it decided; "
    "`listed`: the chunks that look listed (the newest generations' folders, the whole of `games/` once an hour)",
    (
        "train",
        "window_started",
    ): "also `start_step`, `resumed` and `global_step` (the global step as the window starts or resumes: a "
    "reader counts the steps trained from it)",
    (
        "train",
        "progress",
    ): "`occupied_policy_mass` is the mean softmax policy mass on occupied points (moves the input planes "
    "show are illegal) over the reported steps' batches",
    (
        "train",
        "diverged",
    ): "the loss (or the weights to publish) stopped being finite at `step` (`metrics` names the sums that "
    "did); the trainer exits 4, saving and publishing nothing since its last checkpoint",
    ("match", "result"): "the whole result, as `arena.match --json` prints it",
    ("match", "stopped"): "`done`, `error` or `SIGTERM`",
    (
        "loop",
        "throughput",
    ): "the roles' user + system CPU seconds / wall seconds / cores over the invocation, and per hour the "
    "positions self-played and the rows trained (steps x global batch); also `cpu_seconds`, `cores`, "
    "`wall_seconds`, `positions`, `trained_steps`, `trained_rows`",
}


def spec_table() -> str:
    """format/SPEC.md's Events table, generated from `REQUIRED` and `NOTES` (SPEC.md holds this text
    exactly; ``python -m format.events`` prints it, tests/format/test_events.py checks it)."""
    rows = ["| role | event | fields |", "|---|---|---|"]
    for role, events in REQUIRED.items():
        for event, fields in events.items():
            text = ", ".join(f"`{name}`" for name in fields)
            note = NOTES.get((role, event))
            rows.append(f"| {role} | `{event}` | {text}{': ' + note if note else ''} |")
    return "\n".join(rows)


class EventError(ValueError):
    """An event line that cannot be trusted (unknown version, missing fields)."""


class EventLog:
    """Appends events for one role; ``EventLog(None, role)`` emits nothing.

    Thread-safe: the worker emits from its play loop and its model watcher.
    """

    def __init__(self, path: str | None, role: str):
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        self.role = role
        self._lock = threading.Lock()
        if path is None or path == "":
            self._stream = None
        elif path == "-":
            self._stream = sys.stdout
        else:
            directory = os.path.dirname(os.path.abspath(path))
            os.makedirs(directory, exist_ok=True)
            self._stream = open(path, "a", encoding="utf-8", buffering=1)

    @property
    def enabled(self) -> bool:
        return self._stream is not None

    def emit(self, event: str, **fields) -> None:
        """Write one event line and flush it."""
        missing = [name for name in REQUIRED[self.role].get(event, ()) if name not in fields]
        if event not in REQUIRED[self.role]:
            raise ValueError(f"{self.role} has no event {event!r}")
        if missing:
            raise ValueError(f"{self.role} event {event!r} lacks {missing}")
        if self._stream is None:
            return
        record = {
            "schema": SCHEMA,
            "version": EVENTS_VERSION,
            "time": round(time.time(), 3),
            "role": self.role,
            "pid": os.getpid(),
            "event": event,
            **fields,
        }
        line = json.dumps(record, separators=(",", ":"), allow_nan=False, default=_plain) + "\n"
        with self._lock:
            self._stream.write(line)
            self._stream.flush()

    def close(self) -> None:
        if self._stream is not None and self._stream is not sys.stdout:
            self._stream.close()
        self._stream = None


def _plain(value):
    """numpy scalars and the like as plain JSON numbers."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def parse_event(line: str) -> dict | None:
    """The event on ``line``, or None when the line is not an event at all."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        return None
    if record.get("version") != EVENTS_VERSION:
        raise EventError(f"event version {record.get('version')!r}; this reader knows {EVENTS_VERSION}")
    role, event = record.get("role"), record.get("event")
    if role not in REQUIRED or event not in REQUIRED[role]:
        raise EventError(f"unknown event {role!r}/{event!r}")
    missing = [name for name in REQUIRED[role][event] if name not in record]
    if missing:
        raise EventError(f"{role} event {event!r} lacks {missing}")
    return record


class EventTail:
    """Follows an events file as it grows: ``poll()`` returns the new events.

    A partial last line (the writer is mid-write) is kept until it ends.
    """

    def __init__(self, path: str):
        self.path = path
        self._offset = 0
        self._partial = ""

    def poll(self) -> list[dict]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                handle.seek(self._offset)
                text = handle.read()
                self._offset = handle.tell()
        except FileNotFoundError:
            return []
        text = self._partial + text
        lines = text.split("\n")
        self._partial = lines.pop()
        events = []
        for line in lines:
            event = parse_event(line)
            if event is not None:
                events.append(event)
        return events


def read_events(path: str) -> list[dict]:
    """Every complete event in a file (a missing file has none)."""
    return EventTail(path).poll()


if __name__ == "__main__":
    print(spec_table())
