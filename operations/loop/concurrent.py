"""The concurrent schedule: ``--workers`` self-play workers, the shuffle follower and the trainer
follower at once, as operations.cluster runs them (its Cluster supervises them and restarts a role that
dies)::

    worker     plays with the newest model, a chunk a minute     games/<g>/
    follower   a window once the trainer has room for one        windows/<g>/
    trainer    each window for its samples-per-row steps          models/<g>/ + LATEST

They run until the budget leaves only the closing matches (or ``--generations`` are published); no
match is played before those.  The roles resume from their own state (the worker's spool in
``--state-dir``, the follower's windows, the trainer's checkpoint), so this schedule needs no marker.
"""

from __future__ import annotations

import time

from operations.loop.records import GenerationRecord, loss_fields, trained_steps
from operations.loop.run import Interrupted, LoopRun
from operations.loop.settings import CONCURRENT, CONCURRENT_MIN_SECONDS
from processes.children import (
    ignore_sigint_and_sigterm,
    say,
    stop_on_sigint_and_sigterm,
)


class ConcurrentSchedule(LoopRun):
    """The roles at once (``--schedule concurrent``, the default with --hours)."""

    def run_concurrent(self) -> int:
        """Run the worker, the shuffle follower and the trainer follower at once until the budget
        leaves only the closing matches (or --generations are published), then stop them and play
        the closing matches.  The roles are operations.cluster's, supervised by its Cluster."""
        cfg = self.config
        generation = self.current_generation()
        self.status.generation = generation
        limit = cfg.generation_limit
        seconds = self.deadline - time.monotonic() - self.final_eval_seconds()
        if limit is not None and generation >= limit:
            return self.finish()
        if seconds < CONCURRENT_MIN_SECONDS:
            say(
                f"time left in the budget of {cfg.budget_text()} holds less than {CONCURRENT_MIN_SECONDS:.0f} s "
                f"of self-play and training; stopping at generation {generation} for the closing matches"
            )
            return self.finish()
        self.cluster = cluster = self.start_roles(seconds, None if limit is None else limit - generation)
        cluster.lease = self.lease  # LeaseLost: another launcher owns the root now
        self.status.phase = "roles"
        self.events.emit("phase", generation=generation, phase="roles")
        say(
            f"roles at once for {seconds / 60:.1f} minutes (worker, shuffle follower, trainer); their logs and "
            f"events in {cluster.state_dir}"
        )
        reason = "interrupted"
        try:
            reason = cluster.run()
        finally:
            ignore_sigint_and_sigterm()  # the stop itself is not interrupted
            try:
                cluster.stop(reason)
                self.absorb(cluster)
            finally:
                stop_on_sigint_and_sigterm()
                self.cluster = None
        if reason != "goal":
            raise Interrupted("the concurrent roles")
        return self.finish()

    def start_roles(self, seconds: float, generations: int | None):
        """operations.cluster's Cluster of this loop's roles (``--workers`` workers), to run ``seconds`` or until
        ``generations`` more are published."""
        from operations.cluster import Cluster, ClusterConfig, Commands

        cfg = self.config
        state_dir = self.state_dir
        roles = ClusterConfig(
            root=cfg.root,
            workers=cfg.workers,
            state_dir=state_dir,
            board_size=cfg.board_size,
            komi=cfg.komi,
            status_seconds=CONCURRENT["status_seconds"],
            child_threads=cfg.child_threads,
            worker_nice=cfg.worker_nice,
            minutes=seconds / 60,
            until_generations=generations or 0,
            worker=cfg.worker,
            shuffle=cfg.follower_shuffle(),
            train=cfg.train,
        )
        return Cluster(roles, self.storage, state_dir, Commands(roles, state_dir, self.retry).all())

    def absorb(self, cluster) -> None:
        """What the roles' events say into the summary: positions made, steps trained, the losses of
        each generation's window, and each role's CPU share (printed)."""
        events = cluster.observer.events
        totals = cluster.observer.totals()
        self.meter.positions += totals["positions"]
        self.status.games, self.status.positions = totals["games"], totals["positions"]
        self.status.generation = self.current_generation()
        trainer = events.get("trainer", [])
        self.meter.trained_steps += trained_steps(trainer)
        for event in trainer:
            if event["event"] == "progress" and int(event["generation"]) >= 1:
                row = self.rows.setdefault(int(event["generation"]) - 1, GenerationRecord(int(event["generation"]) - 1))
                row.losses = loss_fields(event)
                self.status.losses = dict(row.losses)
        cpu = cluster.cpu()
        shares = ", ".join(f"{name} {share:.0%}" for name, share in cpu["role_cpu_share"].items())
        say(
            f"the roles used {cpu['cpu_share']:.0%} of {cpu['cores']} cores over {cpu['wall_seconds'] / 60:.1f} "
            f"minutes: {shares}"
        )
