"""The trainer's lease: one trainer per lake root (format.leases, with the trainer's rules).

The lease is ``format.layout.TRAINER_LEASE`` (``cluster/trainer-lease.json``),
a format.leases record; its protocol (acquire, renew, check, release by
compare-and-swap) is format.leases's.  What is the trainer's own:

* takeover: a *damaged* record is refused (an operator deletes it): two
  trainers on one root would overwrite each other's checkpoints and
  publications, so the lease errs on the side of none.  A record held by a
  dead process on this very host is taken at once (a SIGKILLed trainer
  restarted on the same machine need not wait out the expiry).
* waiting: ``acquire(wait=True)`` (``--lease-wait``) sleeps until the lease
  can be taken instead of refusing.
* renewal: a background thread renews every quarter of ``--lease-seconds``;
  the trainer also renews synchronously right before each checkpoint and
  each publish, and calls :meth:`check` at every step-call boundary, so no
  shared state is written on a lease that is not ours.  A lost lease stops
  the trainer at once without publishing.
"""

from __future__ import annotations

import logging
import threading
import time

from format import layout
from format.leases import RENEW_FRACTION, Lease, LeaseError, LeaseHeld, LeaseLost, LeaseRecord, Takeover, describe_time

__all__ = [
    "DEFAULT_SECONDS",
    "RENEW_FRACTION",
    "LeaseError",
    "LeaseHeld",
    "LeaseLost",
    "LeaseRecord",
    "TrainerLease",
    "describe_time",
]

log = logging.getLogger(__name__)

DEFAULT_SECONDS = 60.0
TRAINER_TAKEOVER = Takeover(dead_local_holder=True)
"""Damaged: refused; a dead holder on this host: taken at once (module docstring)."""


class TrainerLease(Lease):
    """This process's claim on one root's trainer lease."""

    def __init__(self, storage, seconds: float = DEFAULT_SECONDS, *, clock=time.time):
        if seconds <= 0:
            raise ValueError(f"--lease-seconds must be > 0, got {seconds}")
        super().__init__(
            storage,
            layout.TRAINER_LEASE,
            seconds,
            takeover=TRAINER_TAKEOVER,
            name="trainer lease",
            lost_note="; stopping at once without publishing (another trainer may own this root)",
            clock=clock,
        )

    def _refusal(self, record: LeaseRecord, now: float) -> LeaseHeld:
        return LeaseHeld(
            f"{self.url} is held by trainer {record.holder} (renewed "
            f"{describe_time(record.renewed, now)}); it expires {describe_time(record.expires, now)}. "
            "One trainer per root: stop that trainer, or rerun after the lease expires "
            "(--lease-wait waits for it)",
            record,
        )

    def acquire(self, *, wait: bool = False, stop: threading.Event | None = None) -> LeaseRecord:
        """Take the lease, or raise LeaseHeld (``wait``: sleep until it can be taken).

        ``stop`` (set by SIGTERM) ends a wait with LeaseHeld.  A damaged record
        raises format.leases.LeaseDamaged (a LeaseError) naming the object.
        """
        while True:
            holder = self.try_acquire()
            if holder is None:
                mine = self.record
                assert mine is not None  # try_acquire took the lease and kept its record
                return mine
            now = self._clock()
            if not wait or (stop is not None and stop.is_set()):
                raise self._refusal(holder, now)
            pause = min(max(holder.expires - now, 0.0) + 0.2, self.renew_every)
            log.warning("%s", self._refusal(holder, now))
            if stop is not None:
                if stop.wait(pause):
                    raise self._refusal(holder, self._clock())
            else:
                time.sleep(pause)
