"""Expiring leases in the lake: which process owns something, until when.

Roles meet only through the storage root, so "one process at a time" is an object in it: the
trainer's lease (``cluster/trainer-lease.json``) and each window's claim
(``cluster/claims/window-<gen>.json``).  The callers (model.lease, pipeline.follow) choose the path,
the lifetime and the takeover rules (`Takeover`).  Terms: a *record* is the object's JSON
(`LeaseRecord`: holder, host, pid, acquired, renewed, expires in the writer's unix seconds,
released, details); the *holder* is one process start's id (``host:pid:random hex``); *held*:
``expires`` in the future and not released; a *generation* is the object's storage generation, and
every write is ``write_if_generation`` on the one its writer last saw (0 = create only), so of two
racing processes exactly one wins.  Nothing is deleted: a finished holder writes *released*.  A
record outside the bounds (`LeaseRecord.from_bytes`: finite, ordered times, a lifetime of at most
`MAX_LEASE_SECONDS`, no clock from the future) is *damaged*, never an OverflowError.

`Lease`: ``try_acquire`` takes an absent, released, expired or takeable record; ``renew`` extends
it or raises `LeaseLost`; ``check`` stops a holder whose renewals failed past ``expires``;
``release`` writes it back released.  Machines sharing a root must agree on the time to well
under a lease's lifetime.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import socket
import threading
import time

from cloud.base import AlreadyExists, NotFound, PreconditionFailed, StorageError, TooLarge
from format import lake_json
from format.documents import MAX_POINTER_BYTES, too_large

log = logging.getLogger(__name__)

RENEW_FRACTION = 0.25
"""Renew after this fraction of the lifetime: 60 s -> every 15 s, so three
renewals in a row may fail (transiently) before the lease lapses."""
DAMAGED_REFUSED = "refused"
DAMAGED_EXPIRED = "expired"
_ACQUIRE_TRIES = 8
"""Lost races in a row before acquire gives up for now (each lost race means
another process wrote the record in between: progress, not a loop)."""


class LeaseError(RuntimeError):
    """A lease cannot be read, taken or kept; the message says why."""


class LeaseDamaged(LeaseError):
    """The record is not a lease record; ``generation`` is the object's (to replace it conditionally)."""

    def __init__(self, message: str, generation: int = 0):
        super().__init__(message)
        self.generation = generation


class LeaseHeld(LeaseError):
    """Another live process holds the lease; ``record`` is its record."""

    def __init__(self, message: str, record: "LeaseRecord"):
        super().__init__(message)
        self.record = record


MAX_LEASE_SECONDS = 3600.0
"""The longest lifetime a record may give itself (the trainer's --lease-seconds
and the followers' --claim-seconds are bounded by it)."""

MAX_UNIX_SECONDS = 2.0**33
"""No lease time is later than this (the year 2242)."""

MAX_PID = 2**31 - 1


class LeaseLost(LeaseError):
    """The lease this process held was taken by another, or lapsed unrenewed."""


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """A lease object's contents (the module docstring's terms)."""

    holder: str
    host: str
    pid: int
    acquired: float
    renewed: float
    expires: float
    released: bool = False
    details: dict = dataclasses.field(default_factory=dict)
    """The caller's own facts about the hold, e.g. a window claim's ``attempt``."""

    def to_bytes(self) -> bytes:
        document = dataclasses.asdict(self)
        if not self.details:
            del document["details"]
        return (json.dumps(document, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, url: str) -> "LeaseRecord":
        """The record in ``data``; LeaseDamaged naming ``url`` and the field when it is not one."""
        try:
            document = lake_json.parse(data, MAX_POINTER_BYTES)
        except lake_json.NotADocument as exc:
            raise LeaseDamaged(f"{url}: {exc}") from None
        if not isinstance(document, dict):
            raise LeaseDamaged(f"{url}: is not a JSON object")
        kinds: dict[str, type | tuple[type, ...]] = {
            "holder": str,
            "host": str,
            "pid": int,
            "acquired": (int, float),
            "renewed": (int, float),
            "expires": (int, float),
        }
        for name, kind in kinds.items():
            if not isinstance(document.get(name), kind) or isinstance(document.get(name), bool):
                raise LeaseDamaged(f"{url}: field '{name}' is missing or of the wrong type")
        details = document.get("details", {})
        if not isinstance(details, dict) or not all(isinstance(v, str) for v in details.values()):
            raise LeaseDamaged(f"{url}: field 'details' is not an object of strings")
        if not 0 < document["pid"] <= MAX_PID:
            raise LeaseDamaged(f"{url}: field 'pid' is {document['pid']}, not a process id (1..{MAX_PID})")
        for name in ("acquired", "renewed", "expires"):
            if not 0 <= document[name] < MAX_UNIX_SECONDS:  # NaN fails this too
                raise LeaseDamaged(
                    f"{url}: field '{name}' is {document[name]}, not a time (unix seconds in 0..{MAX_UNIX_SECONDS:.0f})"
                )
        if not document["acquired"] <= document["renewed"] <= document["expires"]:
            raise LeaseDamaged(
                f"{url}: times out of order (acquired {document['acquired']}, renewed "
                f"{document['renewed']}, expires {document['expires']}; need acquired <= "
                "renewed <= expires)"
            )
        if document["expires"] - document["renewed"] > MAX_LEASE_SECONDS:
            raise LeaseDamaged(
                f"{url}: field 'expires' is {document['expires'] - document['renewed']:.0f} s "
                f"after 'renewed'; a lease lives at most {MAX_LEASE_SECONDS:.0f} s past its "
                "last renewal"
            )
        return cls(
            holder=document["holder"],
            host=document["host"],
            pid=document["pid"],
            acquired=float(document["acquired"]),
            renewed=float(document["renewed"]),
            expires=float(document["expires"]),
            released=bool(document.get("released", False)),
            details=dict(details),
        )

    def held_at(self, now: float) -> bool:
        return not self.released and self.expires > now

    def from_the_future(self, now: float) -> bool:
        """Renewed further ahead of ``now`` than its own lifetime: its writer's clock is off by
        more than the protocol tolerates, and the record is damaged."""
        return self.renewed - now > self.expires - self.renewed


@dataclasses.dataclass(frozen=True)
class Takeover:
    """When a record another process wrote may be replaced.

    ``damaged``: a record that does not parse is refused (an operator must delete it: the trainer,
    where two holders would corrupt checkpoints) or counts as expired (window claims, where the
    manifest is the commit point).  ``dead_local_holder``: a held record whose pid on this host is
    gone may be taken at once.  ``own_period``: a record counts as held only until its last renewal
    plus the *reader's* own period, whatever expiry its writer gave it."""

    damaged: str = DAMAGED_REFUSED
    dead_local_holder: bool = False
    own_period: bool = False

    def __post_init__(self):
        if self.damaged not in (DAMAGED_REFUSED, DAMAGED_EXPIRED):
            raise ValueError(f"Takeover.damaged: {self.damaged!r} is not {DAMAGED_REFUSED!r} or {DAMAGED_EXPIRED!r}")


def new_holder_id() -> tuple[str, str, int]:
    """``(holder, host, pid)`` for this process: ``host:pid:random``."""
    host, pid = socket.gethostname(), os.getpid()
    return f"{host}:{pid}:{secrets.token_hex(4)}", host, pid


def process_exists(pid: int) -> bool:
    """Whether a process with this pid runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def describe_time(unix_s: float, now: float) -> str:
    """``2026-11-23 03:00:00 UTC (in 12 s)`` / ``(... s ago)``."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix_s))
    delta = unix_s - now
    return f"{stamp} (in {delta:.0f} s)" if delta >= 0 else f"{stamp} ({-delta:.0f} s ago)"


def read_record(storage, path: str, *, now: float | None = None) -> tuple[LeaseRecord | None, int]:
    """The record at ``path`` (None when absent) and its generation (0 when absent); LeaseDamaged if
    unparsable or out of range at ``now`` (default: this machine's clock)."""
    try:
        data, generation = storage.read_versioned(path, max_bytes=MAX_POINTER_BYTES)
    except NotFound:
        return None, 0
    except TooLarge as exc:
        raise LeaseDamaged(f"{storage.url(path)}: {too_large(MAX_POINTER_BYTES)}", exc.generation or 0) from None
    try:
        record = LeaseRecord.from_bytes(data, storage.url(path))
    except LeaseDamaged as exc:
        raise LeaseDamaged(str(exc), generation) from None
    now = time.time() if now is None else now
    if record.from_the_future(now):
        raise LeaseDamaged(
            f"{storage.url(path)}: renewed {describe_time(record.renewed, now)}, further ahead than "
            f"its lifetime of {record.expires - record.renewed:.0f} s: its writer's clock is wrong",
            generation,
        )
    return record, generation


def held_record(storage, path: str, *, now: float | None = None) -> LeaseRecord | None:
    """The record at ``path`` if it is held now; None when absent, released, expired or damaged."""
    now = time.time() if now is None else now
    try:
        record, _ = read_record(storage, path, now=now)
    except LeaseDamaged:
        return None
    return record if record is not None and record.held_at(now) else None


class Lease:
    """This process's hold (or attempt at one) on the lease object ``path``.

    ``seconds``: the lifetime after each write; ``details``: the caller's facts
    stored in the record; ``holder``: this process's id (default
    :func:`new_holder_id`); ``name`` and ``lost_note`` word the messages
    ("lost the {name} URL: ...{lost_note}").  ``took_over`` is set by :meth:`acquire` to the
    record it replaced while that was not released (an expired holder, a dead
    local one), for the caller's log.
    """

    def __init__(
        self,
        storage,
        path: str,
        seconds: float,
        *,
        takeover: Takeover = Takeover(),
        details: dict | None = None,
        holder: str | None = None,
        name: str = "lease",
        lost_note: str = "",
        clock=time.time,
    ):
        if not seconds > 0:
            raise ValueError(f"lease lifetime must be > 0 seconds, got {seconds}")
        self.storage = storage
        self.path = path
        self.url = storage.url(path)
        self.seconds = float(seconds)
        self.renew_every = self.seconds * RENEW_FRACTION
        self.takeover = takeover
        self.name = name
        self.lost_note = lost_note
        self.details = dict(details or {})
        own_holder, self.host, self.pid = new_holder_id()
        self.holder = holder or own_holder
        self.took_over: LeaseRecord | None = None
        self._clock = clock
        self._lock = threading.Lock()
        self._record: LeaseRecord | None = None
        self._generation = 0
        self._lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def record(self) -> LeaseRecord | None:
        """The record this process last wrote while holding the lease; None when not held."""
        return self._record

    # --- reading ------------------------------------------------------------------
    def read(self) -> tuple[LeaseRecord | None, int]:
        """The stored record (None when absent) and its generation; LeaseDamaged as :func:`read_record`."""
        return read_record(self.storage, self.path, now=self._clock())

    def _read_for_takeover(self) -> tuple[LeaseRecord | None, int, bool]:
        """(record, generation, takeable now) under this lease's takeover rules."""
        try:
            record, generation = self.read()
        except LeaseDamaged as exc:
            if self.takeover.damaged == DAMAGED_REFUSED:
                raise LeaseDamaged(f"{exc}; if no process holds it, delete it", exc.generation) from None
            log.warning("%s; replacing it (a damaged record counts as expired)", exc)
            return None, exc.generation, True
        return record, generation, record is None or self._takeable(record)

    def _takeable(self, record: LeaseRecord) -> bool:
        now = self._clock()
        if not record.held_at(now):
            return True
        if self.takeover.own_period and record.renewed + self.seconds <= now:
            return True  # past its last renewal plus this lease's own period
        # Same machine, process gone: a SIGKILLed holder being restarted here.
        return (
            self.takeover.dead_local_holder
            and record.host == self.host
            and record.pid != self.pid
            and not process_exists(record.pid)
        )

    # --- acquire / renew / release -------------------------------------------------
    def try_acquire(self) -> LeaseRecord | None:
        """Take the lease: None when taken (``self.record`` is ours), else the holder's record.

        LeaseDamaged when the record is damaged and the rules refuse it.
        After a run of lost races without learning a winner, the last
        record read is returned as the holder's (the caller tries later).
        """
        record = None
        for _ in range(_ACQUIRE_TRIES):
            record, generation, takeable = self._read_for_takeover()
            if not takeable:
                return record
            now = self._clock()
            mine = LeaseRecord(
                self.holder,
                self.host,
                self.pid,
                acquired=now,
                renewed=now,
                expires=now + self.seconds,
                details=self.details,
            )
            try:
                written = self.storage.write_if_generation(self.path, mine.to_bytes(), generation)
            except (PreconditionFailed, AlreadyExists):
                continue  # another process wrote between our read and write: look again
            with self._lock:
                self._generation, self._record, self._lost = written, mine, None
            self.took_over = record if record is not None and not record.released else None
            return None
        return record

    def renew(self) -> LeaseRecord:
        """Extend the lease now (conditional on our last generation); LeaseLost if it is not ours."""
        with self._lock:
            if self._lost is not None:
                raise self._lost
            if self._record is None:
                raise LeaseError(f"{self.url}: renew() before acquire()")
            now = self._clock()
            mine = dataclasses.replace(self._record, renewed=now, expires=now + self.seconds)
            try:
                self._generation = self.storage.write_if_generation(self.path, mine.to_bytes(), self._generation)
            except PreconditionFailed:
                try:
                    record, generation = self.read()
                except LeaseDamaged:
                    record, generation = None, 0
                if record is None or record.holder != self.holder or record.released:
                    who = "nobody (it was deleted or damaged)" if record is None else record.holder
                    self._lost = LeaseLost(f"lost the {self.name} {self.url}: it is now held by {who}{self.lost_note}")
                    self._record = None
                    raise self._lost from None
                # Still ours: our own earlier write landed although it reported failure.
                self._generation = self.storage.write_if_generation(self.path, mine.to_bytes(), generation)
            self._record = mine
            return mine

    def check(self) -> None:
        """Raise LeaseLost if a renewal found the lease taken, or it lapsed unrenewed."""
        with self._lock:
            if self._lost is None and self._record is not None and self._clock() >= self._record.expires:
                self._lost = LeaseLost(
                    f"the {self.name} {self.url} expired at "
                    f"{describe_time(self._record.expires, self._clock())} before it could "
                    f"be renewed (storage unreachable?){self.lost_note}"
                )
                self._record = None
            if self._lost is not None:
                raise self._lost

    def release(self) -> bool:
        """Write the record back released (conditionally); False when it was not ours (any more)."""
        self.stop_renewing()
        with self._lock:
            if self._record is None or self._lost is not None:
                return False
            now = self._clock()
            done = dataclasses.replace(self._record, renewed=now, expires=now, released=True)
            self._record = None
            try:
                self.storage.write_if_generation(self.path, done.to_bytes(), self._generation)
            except PreconditionFailed:
                log.warning("did not release %s: another process holds it now", self.url)
                return False
            except StorageError as exc:
                log.warning("could not release %s (it expires on its own): %s", self.url, exc)
                return False
            return True

    # --- renewal in a background thread (for holders busy with other work) -------
    def start_renewing(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name=f"lease:{self.path}", daemon=True)
        self._thread.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._thread = None

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_every):
            try:
                self.renew()
            except LeaseLost as exc:
                log.error("%s", exc)
                return
            except (StorageError, OSError) as exc:
                # Transient: the next tick tries again; check() stops the holder
                # if the lease lapses before any renewal succeeds.
                log.warning("could not renew %s (retrying in %.0f s): %s", self.url, self.renew_every, exc)
