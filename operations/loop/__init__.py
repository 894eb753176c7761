"""``python -m operations.loop``: the whole system in cycles on one machine, against one lake root.

Self-play, the shuffle job and the trainer run as child processes, either in turns (a process each per
generation: operations.loop.turns) or at once (operations.loop.concurrent); every run ends with the
same closing matches and summary (operations.loop.run, operations.loop.records).  LoopConfig and the
schedules' defaults are in operations.loop.settings.

This module is the entry: flags -> LoopConfig (format.cli's RoleCli) -> a check of the tools the run
needs -> the loop's lease on the root (one launcher per root: layout.LAUNCHER_LEASE) -> the run's settings
record (``loop/settings/<run id>.json``, one per invocation) -> `Loop.run`, its time counted into
``loop/budget.json`` (operations.loop.budget: a rerun continues the run's budget).  Exit status: 0 done,
130 interrupted (rerun the same command to resume), 1 a phase failed, 2 a bad flag, a missing tool or
a root another loop drives, 3 the lease was lost.
"""

from __future__ import annotations

import sys

from format.cli import RoleCli
from format.documents import ManifestError
from format.leases import LeaseLost
from operations.loop.concurrent import ConcurrentSchedule
from operations.loop.run import Interrupted, PhaseFailed
from operations.loop.settings import LoopConfig
from operations.loop.turns import TurnsSchedule
from operations.roles import hold_root, open_launch
from processes.children import say, stop_on_sigint_and_sigterm

CLI = RoleCli(
    LoopConfig,
    prog="python -m operations.loop",
    description="Run self-play, the shuffle job and the trainer in cycles on one machine against one lake "
    "root, evaluate each new model, and print a summary. Rerun the same command to resume.",
)


class Loop(TurnsSchedule, ConcurrentSchedule):
    """The loop of one invocation; ``--schedule`` chooses which of its schedules runs."""

    def run(self) -> int:
        if self.config.concurrent:
            return self.run_concurrent()
        return self.run_turns()


def missing_tools(config: LoopConfig) -> str:
    """What this run will need but the machine lacks, in one line ('' = nothing): checked at
    start-up, so a long run never finds out after hours of training."""
    if config.gnugo_games:
        from arena.gtp_client import GnuGoNotFound, find_gnugo

        try:
            find_gnugo()
        except GnuGoNotFound as exc:
            return (
                f"this run ends with {config.gnugo_games} games against GNU Go level 1, and {exc} "
                "(scripts/run.sh installs it for such runs; or scripts/setup.sh --gnugo)"
            )
    return ""


def _clock(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    config, retry = CLI.parse(argv)
    missing = missing_tools(config)
    if missing:
        print(f"operations.loop: error: {missing}", file=sys.stderr)
        return 2
    lease = hold_root(CLI.prog, config.root, retry)
    if isinstance(lease, str):
        print(f"operations.loop: error: {lease}", file=sys.stderr)
        return 2
    storage, record = open_launch(CLI.prog, "loop", config, retry=retry, argv=argv)
    # Ctrl-C and SIGTERM (e.g. a preempted VM) both stop the phase in flight cleanly.
    stop_on_sigint_and_sigterm()
    try:
        loop = Loop(config, storage, retry)
    except ManifestError as exc:  # loop/budget.json
        lease.stop_renewing()
        lease.release()
        print(f"operations.loop: error: {exc}; delete it to count the run's budget afresh", file=sys.stderr)
        return 2
    loop.lease = lease
    limit = config.generation_limit
    say(
        f"zerolake loop on {storage.url()}: {config.board_size}x{config.board_size}, "
        f"{'as many generations as fit' if limit is None else f'{limit} generations'} within "
        f"{config.budget_text()}, the roles {'at once' if config.concurrent else 'in turns'}; "
        f"settings in {storage.url(record)}"
    )
    budget = loop.budget
    if budget.spent_before:
        say(
            f"this lake's loop has run {_clock(budget.spent_before)} of its {config.budget_text()} before; "
            f"{_clock(budget.left_seconds)} left (rerun with a larger budget to run longer)"
        )
    reason = "error"
    budget.start()
    try:
        code = loop.run()
        reason = "done"
        return code
    except Interrupted as exc:
        say(f"interrupted during {exc}; rerun the same command to resume")
        reason = "interrupted"
        return 130
    except KeyboardInterrupt:
        loop.stop_child()
        say("interrupted; rerun the same command to resume")
        reason = "interrupted"
        return 130
    except PhaseFailed as exc:
        print(f"operations.loop: error: {exc}", file=sys.stderr)
        return 1
    except LeaseLost as exc:
        loop.stop_child()
        print(f"operations.loop: error: {exc}", file=sys.stderr)
        reason = "lease lost"
        return 3
    finally:
        budget.stop()
        lease.stop_renewing()
        lease.release()
        loop.events.emit("stopped", reason=reason, generation=loop.status.generation)
        loop.events.close()
        loop.remove_events_dir()
