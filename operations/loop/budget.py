"""The loop's time budget across invocations: ``--hours``/``--minutes`` is the whole run's, not each
invocation's.

`BudgetClock` reads what earlier invocations on the lake ran (format.loop_budget, ``loop/budget.json``)
when the loop starts, and rewrites it from a background thread every `WRITE_EVERY_SECONDS` and when the
loop stops.  The loop's deadline is its start plus the budget less that, so rerunning the same command
after a crash, a reboot or a Ctrl-C runs only what is left, closing matches included.
"""

from __future__ import annotations

import threading
import time

from format import layout
from format.loop_budget import LoopBudget, read_loop_budget, write_loop_budget
from processes.children import say

WRITE_EVERY_SECONDS = 60.0
"""How often the running loop rewrites its record: what a SIGKILL or a power cut can leave uncounted."""


class BudgetClock:
    """This invocation's share of the run's budget, counted into the lake."""

    def __init__(self, storage, budget_seconds: float):
        """``storage`` None: a plan without a lake (nothing spent before, nothing recorded)."""
        self.storage = storage
        self.budget_seconds = budget_seconds
        # A damaged record: ManifestError, before any work.
        earlier = read_loop_budget(storage) if storage is not None else None
        self.spent_before = earlier.spent_seconds if earlier else 0.0
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    @property
    def left_seconds(self) -> float:
        """What the budget leaves this invocation from its start (0 when earlier ones spent it)."""
        return max(0.0, self.budget_seconds - self.spent_before)

    def spent(self) -> float:
        return self.spent_before + time.monotonic() - self.started

    def start(self) -> None:
        """Record the start, then keep recording in the background until `stop`."""
        self.write()
        self._thread = threading.Thread(target=self._run, name="loop-budget", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.write()

    def _run(self) -> None:
        while not self._stop.wait(WRITE_EVERY_SECONDS):
            self.write()

    def write(self) -> None:
        """Rewrite the record; a failed write is said once and retried at the next tick (the run goes on:
        at worst a rerun gets more time than was left)."""
        if self.storage is None:
            return
        try:
            write_loop_budget(self.storage, LoopBudget(self.budget_seconds, self.spent()))
        except Exception as exc:  # noqa: BLE001 - any storage failure: the run matters more than the count
            if not self._warned:
                say(f"cannot record the loop's budget in {self.storage.url(layout.LOOP_BUDGET)}: {exc}; retrying")
                self._warned = True
