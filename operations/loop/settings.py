"""The one-machine loop's settings: `LoopConfig` (each field a flag of ``python -m operations.loop``)
and the defaults of its two schedules.

Schedules (``--schedule``)::

    turns       each generation g: self-play (games/<g>/), one shuffle (windows/<g+1>/), training
                (models/<g+1>/), an evaluation; each role a new process every generation
    concurrent  the worker(s), the shuffle follower and the trainer follower at once, each started
                once (operations.cluster's Cluster); the default with --hours

Budgets: ``--minutes M`` (the demo, 15 by default) plans each generation's self-play so that
``--generations`` generations and the closing matches fit; ``--hours H`` is the long-run mode: no
generation limit, `LONG_RUN`'s settings wherever a flag says auto, the concurrent schedule.  A flag
given explicitly wins over either mode's choice.  The roles' own settings are their configs, nested
(``--worker-*``, ``--shuffle-*``, ``--train-*``: operations.roles).

In the concurrent schedule the trainer trains a window ``ceil(new rows x --train-samples-per-row /
batch)`` steps within ``--train-min/max-steps-per-window`` (model.windows), and the follower builds a
window once its new rows give the minimum, never while two windows wait newer than LATEST, with shards
sized to what the trainer will read (`LoopConfig.follower_shuffle`, pipeline.follow's "sizing").
docs/results.md ("Why the loop's defaults are what they are") has the measurements behind the defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TypedDict

from format.cli import (
    board_size_setting,
    events_setting,
    komi_setting,
    root_setting,
    setting,
    setting_problems,
)
from model.config import TrainConfig
from operations.roles import complete_roles, role_setting
from pipeline.config import ShuffleConfig
from selfplay.config import WorkerConfig


class LongRunSettings(TypedDict):
    """`LONG_RUN`'s fields and their types (a float or an int each)."""

    selfplay_seconds: float
    final_gnugo_games: int
    final_gnugo_visits: int
    eval_every: int


class ConcurrentSettings(TypedDict):
    """`CONCURRENT`'s fields and their types (a float or an int each)."""

    samples_per_row: float
    min_steps_per_window: int
    max_steps_per_window: int
    max_untrained: int
    workers: int
    child_threads: int
    worker_nice: int
    status_seconds: float


DEMO_GENERATIONS = 3
"""Generations of a --minutes run (the 15-minute demo) unless --generations says otherwise."""
LONG_RUN: LongRunSettings = {
    "selfplay_seconds": 150.0,
    "final_gnugo_games": 40,
    "final_gnugo_visits": 256,
    "eval_every": 4,
}
"""The long-run mode's (--hours) settings where the loop's flags say auto: 150 s of self-play a generation
(turns), an evaluation against random moves at generation 1 and every 4th (each costs ~20 s to learn again
that a model beats random moves), and 40 closing games against GNU Go level 1 with the model at 256 visits
a move (a strength measurement, not a quick check)."""
ANNEAL_SWA_DECAY = 0.9
"""With --anneal, the trainer publishes an exponential average of its weights (model.train --swa-decay, per
call of 20 steps: about the last 200 steps) unless --train-swa-decay gives a decay of its own."""
GNUGO_PAIRED_OPENINGS = 4
"""The closing match against GNU Go plays each of games/2 random 4-move openings with both colours and no
sampled moves (arena.match --paired-openings): sampled first moves against GNU Go's best handicap the model."""
GNUGO_GAME_SECONDS = (1.0, 0.004)
"""Seconds of one 9x9 game against GNU Go level 1 on 2 cores: a + b x the model's visits, rounded up from
measured games; the closing matches' reservation comes out of self-play and training, so it stays close."""
CLOSING_GAME_SECONDS = 0.2
"""Seconds of one closing game against random moves or generation 0 (32 at once) when this run timed no
evaluation; rounded up from measured games at 32 visits."""
SCHEDULES = ("auto", "turns", "concurrent")
"""``--schedule``: how the roles share the machine (this module's docstring)."""
TURNS_STEPS_PER_WINDOW = 500
"""Training steps (of 256) of a generation in turns when ``--train-steps-per-window`` is 0: about 0.5
samples per new row of a 150 s generation."""
CONCURRENT: ConcurrentSettings = {
    "samples_per_row": 2.0,
    "min_steps_per_window": 100,
    "max_steps_per_window": 500,
    "max_untrained": 2,
    "workers": 2,
    "child_threads": 1,
    "worker_nice": 0,
    "status_seconds": 30.0,
}
"""The concurrent schedule's settings: each new row trained at most about twice, within 100-500 steps a
window (500, the turns' generation, keeps a model coming every 1.5-2 minutes on 2 cores); at most 2 windows
newer than LATEST (one in training, one ready); two workers with one thread each, the configuration that
kept both cores busy."""
PHASE_CHILD = {"selfplay": "worker", "shuffle": "window", "train": "train", "evaluate": "evaluate"}
"""What each phase's child is, for its stop grace (processes.children.STOP_GRACE_SECONDS)."""
CONCURRENT_MIN_SECONDS = 60.0
"""The least time the concurrent schedule starts its roles for (their start-up alone takes ~20 s)."""
LOOP_SEARCH = {"gumbel": True, "visits": 16, "fast_visits": 4}
"""The one-machine loop's self-play search (``--worker-*`` flags override it): a Gumbel root at 16
simulations for a move with a policy target and 4 for the others, which won the loop's A/B against PUCT
at 64/16.  The worker's own defaults (`selfplay.config.WorkerConfig`) stay those of many-machine runs."""


@dataclass(frozen=True)
class LoopConfig:
    """Settings of the one-machine loop (each is a flag; see --help).

    The roles' settings are the roles' own configs (operations.roles.role_setting):
    ``--worker-*`` is selfplay.worker's WorkerConfig, ``--train-*``
    model.train's TrainConfig, ``--shuffle-*`` pipeline.shuffle's
    ShuffleConfig.  The loop sets per phase what it plans itself (the worker's
    seed, name, time and events; the shuffle's seed; the trainer's events).
    """

    root: str = root_setting("./lake", required=False)
    board_size: int = board_size_setting(note="written to run.json on an empty root")
    komi: float = komi_setting()
    minutes: float = setting(
        15.0,
        "wall-clock budget of the run, closing matches included; phases are planned to fit it. A rerun on "
        "the same root continues it (the time earlier invocations ran is spent: ROOT/loop/budget.json)",
        above=0,
    )
    hours: float = setting(
        0.0,
        "long-run mode: a budget of this many hours instead of --minutes (a rerun continues it), no generation "
        f"limit, {LONG_RUN['selfplay_seconds']:g} s of self-play a generation and "
        f"{LONG_RUN['final_gnugo_games']} closing games against GNU Go level 1 (each "
        "flag that says 'auto'); 0 = off",
        at_least=0,
    )
    schedule: str = setting(
        "auto",
        "how the roles share the machine: turns (self-play, shuffle, training and "
        "evaluation one after another, a process each per generation) or concurrent "
        "(the worker, the shuffle follower and the trainer follower at once, each "
        "started once, as operations.cluster runs them); auto = concurrent with "
        "--hours, turns for the --minutes demo",
        choices=SCHEDULES,
    )
    state_dir: str = setting(
        "",
        "the loop's local state (the concurrent schedule's worker spools, "
        "trainer's stage, events and logs; the phases' events of either schedule); default "
        "./loop-state/<hash of the lake>. The same command reuses it, so a stopped run resumes its spool",
    )
    workers: int = setting(
        CONCURRENT["workers"],
        "concurrent schedule: self-play worker processes, each with its own "
        "spool and the --worker-* settings (seeds differ); 2 keep 2 cores busy beside the "
        "trainer and the follower",
        at_least=1,
    )
    child_threads: int = setting(
        CONCURRENT["child_threads"],
        "concurrent schedule: TensorFlow/OpenMP threads of each role (0 = their own choice: every core each)",
        at_least=0,
    )
    worker_nice: int = setting(
        CONCURRENT["worker_nice"],
        "concurrent schedule: niceness added to the "
        "self-play worker, which takes every cycle it gets, so that the trainer and the "
        "shuffle follower keep their share",
        at_least=0,
        at_most=19,
    )
    generations: int = setting(
        0, "stop once this many model generations are published; 0 = auto: 3, or no limit with --hours", at_least=0
    )
    selfplay_seconds: float = setting(
        0.0,
        "self-play time per generation; 0 = auto: planned from --minutes, or "
        f"{LONG_RUN['selfplay_seconds']:g} with --hours",
        at_least=0,
    )
    generation0_positions: int = setting(
        0,
        "end generation 0's self-play once its games hold this many "
        "positions (at most its self-play time); 0 = by time only, like "
        "every generation",
        at_least=0,
    )
    eval_games: int = setting(20, "games against random moves after each evaluated generation", at_least=1)
    eval_every: int = setting(
        0,
        "evaluate generation 1 and every this many generations after against random "
        f"moves; 0 = auto: every one, or every {LONG_RUN['eval_every']} with --hours "
        "(turns only: the concurrent schedule plays only the closing matches)",
        at_least=0,
        at_most=1000,
    )
    final_eval_games: int = setting(
        100, "games of the last generation against random moves, and against generation 0", at_least=1
    )
    eval_visits: int = setting(32, "simulations per move in evaluation games", at_least=1)
    final_gnugo_games: int = setting(
        -1,
        "games of the last generation against GNU Go level 1 at the end "
        f"(needs gnugo; {GNUGO_PAIRED_OPENINGS}-move random openings, each "
        "played with both colours); -1 = auto: none, or "
        f"{LONG_RUN['final_gnugo_games']} with --hours",
        at_least=-1,
    )
    final_gnugo_visits: int = setting(
        0,
        "the model's simulations a move in those games; 0 = auto: --eval-visits, "
        f"or {LONG_RUN['final_gnugo_visits']} with --hours",
        at_least=0,
    )
    anneal: float = setting(
        0.25,
        "the last this share of the run's training time lowers the trainer's rate along a "
        "half cosine to --train-lr-final-fraction, timed by the clock from the budget "
        "(model.train --lr-schedule anneal), and the published weights are averaged "
        f"(--train-swa-decay {ANNEAL_SWA_DECAY} unless given); 0 = the rate stays at its peak "
        "(docs/results.md, 'Issue 49: the finish lever on four seeds')",
        at_least=0.0,
        at_most=1.0,
    )
    seed: int = setting(
        1, "seed of self-play (1000 x seed + generation), the shuffle (seed + generation) and evaluation"
    )
    events: str = events_setting(what="the loop's own (phases, stop)")
    worker: WorkerConfig = role_setting(
        WorkerConfig,
        "self-play (python -m selfplay.worker's flags); the loop sets the seed, worker id, "
        "time and events of each generation's worker",
        shared=("root", "board_size", "komi"),
        managed=("seed", "worker_id", "max_seconds", "max_positions", "events"),
        # 60 s chunks: the concurrent schedule's follower sees new games within a minute.
        games=64,
        progress_seconds=15.0,
        chunk_seconds=60.0,
        **LOOP_SEARCH,
    )
    shuffle: ShuffleConfig = role_setting(
        ShuffleConfig,
        "the shuffle job (python -m pipeline.shuffle's flags); in turns the loop sets its seed "
        "and runs one window per generation, in the concurrent schedule it runs the follower "
        "and sizes its windows from the trainer's --train-samples-per-row and step bounds",
        shared=("root", "board_size"),
        managed=(
            "seed",
            "follow",
            "follow_new_positions",
            "poll_seconds",
            "claim_seconds",
            "events",
            "dataflow_above_positions",
            "follow_max_untrained",
            "samples_per_row",
            "follow_min_rows",
            "follow_max_rows",
        ),
    )
    train: TrainConfig = role_setting(
        TrainConfig,
        "the trainer (python -m model.train's flags); in turns the loop trains one window per "
        f"generation ({TURNS_STEPS_PER_WINDOW} steps when --train-steps-per-window is 0), in the "
        "concurrent schedule it runs the trainer's --follow mode (steps by --train-samples-per-row "
        "within --train-min/max-steps-per-window when --train-steps-per-window is 0); it reads its "
        "events",
        shared=("root", "board_size"),
        managed=("follow", "windows", "events"),
        steps_per_window=0,
        warmup_steps=50,
        log_every=50,
        samples_per_row=CONCURRENT["samples_per_row"],
        min_steps_per_window=CONCURRENT["min_steps_per_window"],
        max_steps_per_window=CONCURRENT["max_steps_per_window"],
    )

    def __post_init__(self):
        for problem in setting_problems(self):  # shared settings, declared ranges (format.cli)
            raise ValueError(problem)
        complete_roles(self)
        if self.anneal and self.train.lr_schedule not in ("constant", "anneal"):  # the loop's own plan
            raise ValueError(
                f"--anneal: plans the trainer's schedule itself; drop --train-lr-schedule "
                f"{self.train.lr_schedule} or pass --anneal 0"
            )

    # The 'auto' settings, resolved (the settings record keeps the flags as given).
    @property
    def budget_seconds(self) -> float:
        return self.hours * 3600 if self.hours else self.minutes * 60

    @property
    def generation_limit(self) -> int | None:
        """Generations to publish before stopping; None = until the time budget runs out."""
        if self.generations:
            return self.generations
        return None if self.hours else DEMO_GENERATIONS

    @property
    def evaluation_period(self) -> int:
        if self.eval_every:
            return self.eval_every
        return LONG_RUN["eval_every"] if self.hours else 1

    def evaluates(self, generation: int) -> bool:
        """Whether ``generation`` gets its match against random moves when it is published."""
        return generation == 1 or generation % self.evaluation_period == 0

    @property
    def gnugo_games(self) -> int:
        if self.final_gnugo_games >= 0:
            return self.final_gnugo_games
        return LONG_RUN["final_gnugo_games"] if self.hours else 0

    @property
    def gnugo_visits(self) -> int:
        if self.final_gnugo_visits:
            return self.final_gnugo_visits
        return LONG_RUN["final_gnugo_visits"] if self.hours else self.eval_visits

    @property
    def generation0_player(self) -> str:
        """The match player spec of generation 0: the worker's evaluator before any model."""
        playouts = self.worker.generation0_playouts
        return f"playouts:{playouts}" if playouts else "uniform"

    def budget_text(self) -> str:
        return f"{self.hours:g} hours" if self.hours else f"{self.minutes:g} minutes"

    @property
    def concurrent(self) -> bool:
        """Whether the roles run at once (``--schedule``; auto: with --hours)."""
        return self.schedule == "concurrent" or (self.schedule == "auto" and bool(self.hours))

    def turns_train(self) -> TrainConfig:
        """The trainer's settings in turns: --train-steps-per-window 0 means TURNS_STEPS_PER_WINDOW."""
        if self.train.steps_per_window:
            return self.train
        return replace(self.train, steps_per_window=TURNS_STEPS_PER_WINDOW)

    def follower_shuffle(self) -> ShuffleConfig:
        """The shuffle follower's settings in the concurrent schedule: windows sized for the trainer.

        A window is due once its new rows give the trainer --train-min-steps-per-window steps at
        --train-samples-per-row, no more than 2 windows wait ahead of LATEST, and a window's shards
        hold about what the trainer will read of it (pipeline.follow's "sizing").  With
        --train-steps-per-window N or --train-samples-per-row 0 the follower keeps its own cadence."""
        train = self.train
        if train.steps_per_window or not train.samples_per_row:
            return replace(self.shuffle, follow_max_untrained=CONCURRENT["max_untrained"])
        batch = train.batch_size  # per replica; the loop's trainer runs one replica on the CPU
        return replace(
            self.shuffle,
            follow_max_untrained=CONCURRENT["max_untrained"],
            samples_per_row=train.samples_per_row,
            follow_new_positions=math.ceil(train.min_steps_per_window * batch / train.samples_per_row),
            follow_min_rows=train.min_steps_per_window * batch,
            follow_max_rows=train.max_steps_per_window * batch,
        )
