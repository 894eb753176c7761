"""The trainer's lease: one trainer per lake root, enforced through the root itself.

Roles meet only through the storage root, so the lease is an object in it,
``format.layout.TRAINER_LEASE`` (``cluster/trainer-lease.json``)::

    {"holder": "<host>:<pid>:<random hex>", "host": str, "pid": int,
     "acquired": unix s, "renewed": unix s, "expires": unix s, "released": bool}

Terms
-----
* *holder*: the id of one trainer process, unique per process start.
* *held*: a record whose ``expires`` is in the future and is not ``released``.
* *generation*: the storage generation of the lease object
  (``Storage.read_versioned``); every write of the lease is a
  ``write_if_generation`` on the generation its writer last read or wrote,
  so of two trainers racing for it exactly one wins.

Protocol
--------
acquire   read the lease (absent = generation 0).  Take it if it is absent,
          released, expired, or held by a dead process on this very host
          (same host name, its pid no longer exists: a trainer killed with
          SIGKILL and restarted on the same machine need not wait out the
          expiry).  Otherwise raise :class:`LeaseHeld`, naming the holder and
          when the lease expires (``wait=True``: sleep until it expires, then
          try again).  Taking it is a conditional write on the generation read.
renew     every ``renew_every`` seconds (a quarter of ``seconds``) a background
          thread rewrites the record with a later ``expires``, conditionally
          on the generation it wrote last.  The trainer also renews
          synchronously right before each checkpoint and each publish, so no
          shared state is written on a lease that is not ours.
lost      a renewal whose precondition fails and whose re-read shows another
          holder, or a lease whose ``expires`` passed without a successful
          renewal (storage unreachable): :meth:`TrainerLease.check` raises
          :class:`LeaseLost` and the trainer stops at once without publishing.
release   on a clean exit: write the record back with ``expires`` = now and
          ``released`` true, conditionally (never a conditional *delete*: the
          fake-gcs-server emulator does not enforce preconditions on deletes).

Times are the writer's wall clock (unix seconds); machines sharing a root
must agree on the time to well under ``seconds``.
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

from cloud.base import NotFound, PreconditionFailed, StorageError
from format import layout

log = logging.getLogger(__name__)

DEFAULT_SECONDS = 60.0
RENEW_FRACTION = 0.25
"""Renew after this fraction of the lease's lifetime: 60 s -> every 15 s, so
three renewals in a row may fail (transiently) before the lease lapses."""


class LeaseError(RuntimeError):
    """The trainer lease cannot be taken or kept; the message says why."""


class LeaseHeld(LeaseError):
    """Another live trainer holds the lease."""

    def __init__(self, message: str, record: "LeaseRecord"):
        super().__init__(message)
        self.record = record


class LeaseLost(LeaseError):
    """The lease this trainer held was taken by another one, or lapsed."""


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """The lease object's contents (see the module docstring)."""

    holder: str
    host: str
    pid: int
    acquired: float
    renewed: float
    expires: float
    released: bool = False

    def to_bytes(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, url: str) -> "LeaseRecord":
        try:
            document = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise LeaseError(f"{url}: not valid JSON ({exc}); if no trainer is running, delete it") from None
        if not isinstance(document, dict):
            raise LeaseError(f"{url}: is not a JSON object; if no trainer is running, delete it")
        kinds = {"holder": str, "host": str, "pid": int, "acquired": (int, float),
                 "renewed": (int, float), "expires": (int, float)}
        for name, kind in kinds.items():
            if not isinstance(document.get(name), kind) or isinstance(document.get(name), bool):
                raise LeaseError(f"{url}: field '{name}' is missing or of the wrong type; "
                                 "if no trainer is running, delete it")
        return cls(holder=document["holder"], host=document["host"], pid=document["pid"],
                   acquired=float(document["acquired"]), renewed=float(document["renewed"]),
                   expires=float(document["expires"]), released=bool(document.get("released", False)))

    def held_at(self, now: float) -> bool:
        return not self.released and self.expires > now


def new_holder_id() -> tuple[str, str, int]:
    """``(holder, host, pid)`` for this process: ``host:pid:random``."""
    host, pid = socket.gethostname(), os.getpid()
    return f"{host}:{pid}:{secrets.token_hex(4)}", host, pid


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def describe_time(unix_s: float, now: float) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix_s))
    delta = unix_s - now
    return f"{stamp} (in {delta:.0f} s)" if delta >= 0 else f"{stamp} ({-delta:.0f} s ago)"


class TrainerLease:
    """This process's claim on one root's trainer lease."""

    def __init__(self, storage, seconds: float = DEFAULT_SECONDS, *, clock=time.time):
        if seconds <= 0:
            raise ValueError(f"--lease-seconds must be > 0, got {seconds}")
        self.storage = storage
        self.seconds = float(seconds)
        self.renew_every = self.seconds * RENEW_FRACTION
        self.path = layout.TRAINER_LEASE
        self.url = storage.url(self.path)
        self.holder, self.host, self.pid = new_holder_id()
        self._clock = clock
        self._lock = threading.Lock()
        self._record: LeaseRecord | None = None
        self._generation = 0
        self._lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def record(self) -> LeaseRecord | None:
        return self._record

    # --- reading ------------------------------------------------------------------
    def read(self) -> tuple[LeaseRecord | None, int]:
        """The stored record (None when absent) and its storage generation (0 when absent)."""
        try:
            data, generation = self.storage.read_versioned(self.path)
        except NotFound:
            return None, 0
        return LeaseRecord.from_bytes(data, self.url), generation

    def _takeable(self, record: LeaseRecord | None, now: float) -> bool:
        if record is None or not record.held_at(now):
            return True
        # Same machine, process gone: a SIGKILLed trainer being restarted here.
        return record.host == self.host and record.pid != self.pid and not _process_exists(record.pid)

    def _refusal(self, record: LeaseRecord, now: float) -> LeaseHeld:
        return LeaseHeld(
            f"{self.url} is held by trainer {record.holder} (renewed "
            f"{describe_time(record.renewed, now)}); it expires {describe_time(record.expires, now)}. "
            "One trainer per root: stop that trainer, or rerun after the lease expires "
            "(--lease-wait waits for it)", record)

    # --- acquire / renew / release -------------------------------------------------
    def acquire(self, *, wait: bool = False, stop: threading.Event | None = None) -> LeaseRecord:
        """Take the lease, or raise LeaseHeld (``wait``: sleep until it can be taken).

        ``stop`` (set by SIGTERM) ends a wait with LeaseHeld.
        """
        while True:
            record, generation = self.read()
            now = self._clock()
            if self._takeable(record, now):
                mine = LeaseRecord(self.holder, self.host, self.pid, acquired=now, renewed=now,
                                   expires=now + self.seconds)
                try:
                    self._generation = self.storage.write_if_generation(self.path, mine.to_bytes(), generation)
                    self._record = mine
                    return mine
                except PreconditionFailed:
                    continue  # another trainer got there between our read and write: look again
            if not wait or (stop is not None and stop.is_set()):
                raise self._refusal(record, now)
            pause = min(max(record.expires - now, 0.0) + 0.2, self.renew_every)
            log.warning("%s", self._refusal(record, now))
            if stop is not None:
                if stop.wait(pause):
                    raise self._refusal(record, self._clock())
            else:
                time.sleep(pause)

    def renew(self) -> LeaseRecord:
        """Extend the lease now (conditional on our last generation); LeaseLost if it is not ours."""
        with self._lock:
            if self._lost is not None:
                raise self._lost
            if self._record is None:
                raise LeaseError("renew() before acquire()")
            now = self._clock()
            mine = dataclasses.replace(self._record, renewed=now, expires=now + self.seconds)
            try:
                self._generation = self.storage.write_if_generation(self.path, mine.to_bytes(), self._generation)
            except PreconditionFailed:
                record, generation = self.read()
                if record is None or record.holder != self.holder or record.released:
                    who = "nobody (it was deleted)" if record is None else f"trainer {record.holder}"
                    self._lost = LeaseLost(
                        f"lost the trainer lease {self.url}: it is now held by {who}; stopping at "
                        "once without publishing (another trainer owns this root)")
                    raise self._lost from None
                # Still ours (our own earlier write landed although it reported failure): go on from it.
                self._generation = self.storage.write_if_generation(self.path, mine.to_bytes(), generation)
            self._record = mine
            return mine

    def check(self) -> None:
        """Raise LeaseLost if a renewal found the lease taken, or it lapsed unrenewed."""
        if self._lost is not None:
            raise self._lost
        if self._record is not None and self._clock() >= self._record.expires:
            self._lost = LeaseLost(
                f"the trainer lease {self.url} expired at {describe_time(self._record.expires, self._clock())} "
                "before it could be renewed (storage unreachable?); another trainer may own this root "
                "now, so stopping without publishing")
            raise self._lost

    def release(self) -> None:
        """Write the lease back as released (conditionally); silently a no-op if it is not ours."""
        self.stop_renewing()
        with self._lock:
            if self._record is None or self._lost is not None:
                return
            now = self._clock()
            done = dataclasses.replace(self._record, renewed=now, expires=now, released=True)
            try:
                self.storage.write_if_generation(self.path, done.to_bytes(), self._generation)
            except PreconditionFailed:
                log.warning("did not release %s: another trainer holds it now", self.url)
            except StorageError as exc:
                log.warning("could not release %s (it expires on its own): %s", self.url, exc)
            self._record = None

    # --- the renewal thread ----------------------------------------------------------
    def start_renewing(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="trainer-lease", daemon=True)
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
                # Transient: the next tick tries again; check() stops the trainer
                # if the lease lapses before any renewal succeeds.
                log.warning("could not renew %s (retrying in %.0f s): %s", self.url, self.renew_every, exc)
