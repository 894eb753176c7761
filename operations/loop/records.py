"""What one loop invocation reports: the summary table's rows (`GenerationRecord`), the live status
line (`Status`), and what the machine did (`RunMeter`).

The rows are filled from the children's events (the worker's and the trainer's ``progress``, the
match's ``result``) and, for what this invocation did not see, read back from the lake.  `RunMeter`
gives the CPU the roles used (user + system seconds of every waited-for child over wall seconds x
cores), positions per hour and trained rows (steps x batch) per hour; the loop prints it under the
summary and emits it as a ``throughput`` event.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from format.match_record import ClosingRecord, MatchRecord
from operations.loop.settings import GNUGO_PAIRED_OPENINGS
from processes.children import cpu_share, waited_children_cpu_seconds

# The trainer's progress event fields shown as losses, and their short names.
LOSS_FIELDS = {
    "loss": "loss",
    "policy_loss": "policy",
    "value_loss": "value",
    "accuracy": "acc",
    "ownership_loss": "ownership",
    "score_loss": "score",
}


@dataclass
class GenerationRecord:
    """One row of the summary table."""

    generation: int
    games: int = 0
    positions: int = 0
    losses: dict = field(default_factory=dict)
    eval_vs_random: MatchRecord | None = None
    seconds: float = 0.0


@dataclass
class Status:
    started: float = field(default_factory=time.monotonic)
    generation: int = 0
    phase: str = "starting"
    games: int = 0
    positions: int = 0
    losses: dict = field(default_factory=dict)
    last_eval: str = "-"

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        losses = " ".join(f"{k} {v:.3f}" for k, v in self.losses.items()) or "-"
        return (
            f"[loop {int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] generation {self.generation} | "
            f"{self.phase} | games {self.games} positions {self.positions} | losses {losses} | "
            f"last eval {self.last_eval}"
        )


@dataclass
class RunMeter:
    """What the machine did in this invocation: the CPU its roles used, positions made, rows trained.

    CPU: user + system seconds of every child the loop waited for (each with what it waited for:
    the follower's window jobs, Beam's workers; processes.children), over wall seconds x cores.
    Positions: of the games self-played in this invocation.  Trained rows: training steps x the
    global batch (the trainer's steps, whether or not their window was published yet).
    """

    global_batch: int
    started: float = field(default_factory=time.monotonic)
    cpu_at_start: float = field(default_factory=waited_children_cpu_seconds)
    positions: int = 0
    trained_steps: int = 0

    def report(self) -> dict:
        wall = time.monotonic() - self.started
        cpu = waited_children_cpu_seconds() - self.cpu_at_start
        hours = wall / 3600
        rows = self.trained_steps * self.global_batch
        return {
            "wall_seconds": round(wall, 1),
            "cpu_seconds": round(cpu, 1),
            "cores": os.cpu_count() or 1,
            "cpu_share": round(cpu_share(cpu, wall), 3),
            "positions": self.positions,
            "positions_per_hour": round(self.positions / hours) if hours else 0,
            "trained_steps": self.trained_steps,
            "trained_rows": rows,
            "trained_rows_per_hour": round(rows / hours) if hours else 0,
        }

    @staticmethod
    def text(report: dict) -> str:
        return (
            f"the machine: the roles used {report['cpu_share']:.0%} of {report['cores']} cores over "
            f"{report['wall_seconds'] / 60:.1f} minutes; {report['positions_per_hour']:,} positions/hour "
            f"({report['positions']:,} in all), {report['trained_rows_per_hour']:,} trained rows/hour "
            f"({report['trained_steps']:,} steps x {report['trained_rows'] // max(1, report['trained_steps'])})"
        )


def trained_steps(events) -> int:
    """Training steps the trainer's events show were done: per process, from the global step at its
    first window_started (where it restored its checkpoint) to its last progress event."""
    first: dict = {}
    last: dict = {}
    for event in events:
        pid = event.get("pid")
        if event["event"] == "window_started" and "global_step" in event:
            first.setdefault(pid, int(event["global_step"]))
        elif event["event"] == "progress" and pid in first:
            last[pid] = int(event["global_step"])
    return sum(max(0, last[pid] - first[pid]) for pid in last)


def loss_fields(event: dict) -> dict:
    """A trainer ``progress`` event's losses under their short names (LOSS_FIELDS)."""
    return {short: float(event[name]) for name, short in LOSS_FIELDS.items() if event.get(name) is not None}


def summary_table(
    rows: list[GenerationRecord], final: int, final_results: ClosingRecord | None, throughput: dict | None = None
) -> str:
    header = (
        f"{'gen':>4} {'games':>6} {'positions':>9} {'policy':>7} {'value':>6} {'acc':>6} {'loss':>6}  "
        f"{'vs random (trained models)':<40} {'time':>6}"
    )
    lines = ["", "summary", header, "-" * len(header)]
    for row in rows:
        losses = row.losses
        cells = [f"{losses[k]:.3f}" if k in losses else "-" for k in ("policy", "value", "acc", "loss")]
        evaluation = row.eval_vs_random.text() if row.eval_vs_random else "-"
        seconds = f"{row.seconds:.0f}s" if row.seconds else "-"
        lines.append(
            f"{row.generation:>4} {row.games:>6} {row.positions:>9} {cells[0]:>7} {cells[1]:>6} "
            f"{cells[2]:>6} {cells[3]:>6}  {evaluation:<40} {seconds:>6}"
        )
    lines.append("(losses: the training of the next generation on this generation's window; loss = total)")
    if final_results:
        lines.append("")
        lines.append(f"final generation {final}:")
        lines.append(f"  vs uniform random moves: {final_results.vs_random.text()}")
        opponent = final_results.vs_generation_0.player_b
        lines.append(f"  vs generation 0 ({opponent} MCTS): {final_results.vs_generation_0.text()}")
        gnugo = final_results.vs_gnugo_1
        if gnugo is not None:
            lines.append(
                f"  vs GNU Go level 1 (the model at {gnugo.visits} visits a move, "
                f"{GNUGO_PAIRED_OPENINGS}-move paired openings): {gnugo.text()}"
            )
    if throughput is not None:
        lines.append("")
        lines.append(RunMeter.text(throughput))
    return "\n".join(lines)
