"""The turns schedule: each generation g the roles take turns, a new process each::

    selfplay   python -m selfplay.worker   games/<g>/ chunks, for a planned time
    shuffle    python -m pipeline.shuffle  windows/<g+1>/ shards + MANIFEST
    train      python -m model.train       models/<g+1>/ + models/LATEST
    evaluate   python -m arena.match       the new model against random moves (`LoopConfig.evaluates`)

What is done is read from the lake, so a rerun resumes at the interrupted phase: the generation is
``models/LATEST``; self-play of g is done when ``loop/selfplay-<g>.done`` exists, the shuffle when
``windows/<g+1>/MANIFEST.json`` does, training when generation g+1 is published, an evaluation when
``loop/eval-<g+1>.json`` exists.  Self-play time is planned from what is left of the budget and the
other phases' last durations (`selfplay_seconds`).
"""

from __future__ import annotations

import json
import time

from format import layout
from format.match_record import MatchRecord
from operations.loop.records import GenerationRecord, loss_fields, trained_steps
from operations.loop.run import LoopRun, PhaseFailed
from operations.loop.settings import LONG_RUN
from operations.roles import role_argv
from processes.children import say


class TurnsSchedule(LoopRun):
    """The roles in turns (``--schedule turns``, the demo's)."""

    def run_turns(self) -> int:
        cfg = self.config
        self.evaluate_unevaluated()
        while True:
            if self.lease is not None:
                self.lease.check()  # LeaseLost: another loop owns the root now
            generation = self.current_generation()
            self.status.generation = generation
            if cfg.generation_limit is not None and generation >= cfg.generation_limit:
                break
            if time.monotonic() >= self.deadline:
                say(
                    f"time budget of {cfg.budget_text()} used up at generation {generation}; "
                    f"a rerun with a larger budget continues the run"
                )
                break
            started = time.monotonic()
            row = self.rows.setdefault(generation, GenerationRecord(generation))
            played = False
            if not self.storage.exists(self.marker(f"selfplay-{layout.generation_dir(generation)}.done")):
                seconds = self.selfplay_seconds(generation)
                if not seconds:
                    say(
                        f"time left in the budget of {cfg.budget_text()} holds less than half a generation's "
                        f"self-play; stopping at generation {generation} for the closing matches"
                    )
                    break
                self.selfplay(generation, seconds)
                played = True
            row.games, row.positions = self.count_games(generation)
            if played:
                self.meter.positions += row.positions
            self.status.games, self.status.positions = self._totals()
            if not self.storage.exists(layout.window_manifest(generation + 1)):
                self.shuffle(generation)
            row.losses = self.train(generation)
            if self.current_generation() != generation + 1:
                raise PhaseFailed(f"training finished but generation {generation + 1} was not published")
            if cfg.evaluates(generation + 1):
                result = self.evaluate_generation(generation + 1)
                next_row = self.rows.setdefault(generation + 1, GenerationRecord(generation + 1))
                next_row.eval_vs_random = result
                self.status.last_eval = result.text()
            row.seconds += time.monotonic() - started
            say(self.status.line())
        return self.finish()

    def selfplay_seconds(self, generation: int) -> float:
        cfg = self.config
        if cfg.selfplay_seconds:
            return cfg.selfplay_seconds
        remaining = self.deadline - time.monotonic() - self.final_eval_seconds()
        overhead = self.phase_seconds["shuffle"] + self.phase_seconds["train"] + self.phase_seconds["evaluate"]
        if cfg.generation_limit is None:
            # Long-run mode: full generations, the last one cut to the budget, but never below half a
            # generation: a generation of a few dozen games would train again on nearly the same
            # window. 0 tells run() to stop for the closing matches.
            seconds = min(LONG_RUN["selfplay_seconds"], remaining - overhead)
            return seconds if seconds >= LONG_RUN["selfplay_seconds"] / 2 else 0.0
        remaining_generations = max(1, cfg.generation_limit - generation)
        return max(30.0, remaining / remaining_generations - overhead)

    def selfplay(self, generation: int, seconds: float) -> None:
        """Self-play generation `generation` for `seconds` (run() plans them with selfplay_seconds)."""
        cfg = self.config

        games_before, positions_before = self.status.games, self.status.positions

        def on_event(event):  # the worker's counts since it started
            if event["event"] == "progress":
                self.status.games = games_before + int(event["games"])
                self.status.positions = positions_before + int(event["positions"])

        events = self.events_path("selfplay")
        # Generation 0 may be sized in positions: at 30 games/s, random-playout self-play fills several
        # model generations' worth of window in the time one model generation gets.
        positions = cfg.generation0_positions if generation == 0 else 0
        self.run_child(
            "selfplay",
            [
                "selfplay.worker",
                *role_argv(
                    cfg,
                    "worker",
                    retry=self.retry,
                    max_seconds=f"{seconds:.0f}",
                    seed=cfg.seed * 1000 + generation,
                    worker_id=f"loop{generation}",
                    events=events,
                    **({"max_positions": str(positions)} if positions else {}),
                ),
            ],
            events,
            on_event,
        )
        self.storage.write_new(
            self.marker(f"selfplay-{layout.generation_dir(generation)}.done"),
            json.dumps({"seconds": round(seconds)}).encode(),
        )

    def shuffle(self, generation: int) -> None:
        self.run_child(
            "shuffle",
            [
                "pipeline.shuffle",
                *role_argv(self.config, "shuffle", retry=self.retry, seed=self.config.seed + generation),
            ],
        )

    def train(self, generation: int) -> dict:
        cfg = self.config
        losses: dict = {}

        seen = []

        def on_event(event):
            seen.append(event)
            if event["event"] == "progress":
                losses.clear()
                losses.update(loss_fields(event))
                self.status.losses = dict(losses)

        events = self.events_path("train")
        try:
            self.run_child(
                "train", ["model.train", *role_argv(cfg, "train", retry=self.retry, events=events)], events, on_event
            )
        finally:
            self.meter.trained_steps += trained_steps(seen)
        return losses

    def evaluate_generation(self, generation: int) -> MatchRecord:
        name = self.marker(f"eval-{layout.generation_dir(generation)}.json")
        if self.storage.exists(name):
            return self.read_record(MatchRecord, name)
        result = self.evaluate(
            f"model:{self.config.root}@{generation}", "random", self.config.eval_games, self.config.seed + generation
        )
        self.storage.write_new(name, result.to_bytes())
        return result

    def evaluate_unevaluated(self) -> None:
        """Evaluate every published generation that has no evaluation marker yet.

        A stop between the trainer's publish and the evaluation (Ctrl-C at that
        moment) leaves one; the loop resumes at the next generation, so without
        this its row would stay '-' for good.
        """
        from format.registry import is_published

        for generation in range(1, self.current_generation() + 1):
            done = self.storage.exists(self.marker(f"eval-{layout.generation_dir(generation)}.json"))
            if not done and self.config.evaluates(generation) and is_published(self.storage, generation):
                say(
                    f"generation {generation} was published but not evaluated (the loop was stopped in "
                    "between); evaluating it now"
                )
                row = self.rows.setdefault(generation, GenerationRecord(generation))
                row.eval_vs_random = self.evaluate_generation(generation)
