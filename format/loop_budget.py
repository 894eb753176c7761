"""``loop/budget.json``: how much of its time budget (``--hours``/``--minutes``) the one-machine loop has run.

The loop (operations.loop.budget's `BudgetClock`) rewrites it about once a minute while it runs and
once when it stops, so rerunning the same command after a crash, a reboot or a Ctrl-C continues the
run's budget instead of starting a new one: a six-hour run stopped after four hours runs two more
(the closing matches included), counting at most a minute of the stopped stretch twice.  Only time
the loop ran counts, not the time between invocations.

Data flow: the loop --`LoopBudget.to_bytes`--> the lake --`LoopBudget.from_bytes`--> the next
invocation.  A damaged record is a ManifestError naming the object and the field.
"""

from __future__ import annotations

import dataclasses
import json

from format import layout
from format.documents import MAX_POINTER_BYTES, ManifestError, json_object, required_field, too_large

VERSION = 1


@dataclasses.dataclass(frozen=True)
class LoopBudget:
    budget_seconds: float
    """The budget of the invocation that wrote the record (its --hours or --minutes, in seconds)."""
    spent_seconds: float
    """Wall seconds the loop has run on this lake, every invocation together."""

    def to_bytes(self) -> bytes:
        return json.dumps(
            {"version": VERSION, "budget_seconds": self.budget_seconds, "spent_seconds": round(self.spent_seconds, 1)}
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes, url: str) -> "LoopBudget":
        document = json_object(data, url)

        def field(name, kinds):
            return required_field(document, name, kinds, url)

        version = field("version", int)
        if version != VERSION:
            raise ManifestError(url, "version", f"is {version}, this release reads version {VERSION}")
        budget, spent = field("budget_seconds", float), field("spent_seconds", float)
        for name, value in (("budget_seconds", budget), ("spent_seconds", spent)):
            if value < 0:
                raise ManifestError(url, name, f"is {value}, expected a number >= 0")
        return cls(budget_seconds=budget, spent_seconds=spent)


def read_loop_budget(storage) -> LoopBudget | None:
    """The root's ``loop/budget.json``, or None when no loop has run on it; a damaged one is a ManifestError."""
    from cloud.base import NotFound, TooLarge

    url = storage.url(layout.LOOP_BUDGET)
    try:
        data = storage.read(layout.LOOP_BUDGET, max_bytes=MAX_POINTER_BYTES)
    except NotFound:
        return None
    except TooLarge:
        raise ManifestError(url, "", too_large(MAX_POINTER_BYTES)) from None
    return LoopBudget.from_bytes(data, url)


def write_loop_budget(storage, budget: LoopBudget) -> None:
    storage.write_replace(layout.LOOP_BUDGET, budget.to_bytes())
