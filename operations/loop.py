"""``python -m operations.loop``: the whole system in cycles on one machine.

Each generation ``g`` (the model generation playing; 0 = the uniform
evaluator before any model exists) runs four phases against one root::

    selfplay   python -m selfplay.worker   games/<g>/ chunks, for a planned time
    shuffle    python -m pipeline.shuffle  windows/<g+1>/ shards + MANIFEST (in-process Beam)
    train      python -m model.train       models/<g+1>/ + models/LATEST
    evaluate   python -m arena.match    the new model against uniform random moves

Every phase is a child process, so each role runs exactly as a user would
run it, and a crash or a Ctrl-C costs only the phase in flight.

Schedules
---------
``--schedule turns`` is the cycle above: the roles take turns, each a new
process every generation (TensorFlow's start-up, the graph build, the
trainer's export every time), and on 2 cores the machine idles about 40% of
the run.  ``--schedule concurrent`` (the default with ``--hours``) starts
the roles once and runs them at once, as operations.cluster does (its
Cluster supervises them: ``--workers`` self-play workers (2), ``pipeline.shuffle --follow``,
``model.train --follow``; a role that dies is restarted)::

    worker     plays with the newest model, a chunk a minute     games/<g>/
    follower   a window once the trainer has room for one        windows/<g>/
    trainer    each window for its samples-per-row steps          models/<g>/ + LATEST

How much each row is trained is bounded, in KataGo's manner: the trainer
trains a window ``ceil(new rows x --train-samples-per-row / batch)`` steps
within ``--train-min/max-steps-per-window`` (model.windows), where new rows
arrived since the window the last model was trained on.  The follower builds
a window once its new rows give the minimum, never while two windows wait
newer than LATEST (one in training, one ready: more would be superseded
unread), and sizes its shards to what the trainer will read (pipeline.follow's
"sizing", `LoopConfig.follower_shuffle`).  The cores are shared by the
roles' thread settings (``--child-threads``, ``--worker-nice``; `CONCURRENT`
says why these).  The concurrent schedule plays no match until the end: the
closing matches measure the last generation, the rating ladder the others.

Both schedules end with the same closing matches and summary, which adds what
the machine did (`RunMeter`): the CPU the roles used (their user + system
seconds over wall seconds x cores), positions per hour and trained rows
(steps x batch) per hour; the same figures go to ``--events`` as a
``throughput`` event.

Budgets
-------
``--minutes M`` (default 15, the demo) plans each generation's self-play so
that ``--generations`` (default 3) generations and the closing matches fit.
``--hours H`` is the long-run mode: H hours, no generation limit, the roles
at once (the concurrent schedule, below; in turns a fixed self-play time a
generation, `LONG_RUN`, the last generation cut to what is left), and 40
closing games against GNU Go level 1.  A flag given explicitly
(``--generations``, ``--selfplay-seconds``, ``--final-gnugo-games``) wins
over either mode's choice.  The closing matches put the last generation
against random moves, against generation 0 (the worker's evaluator before any
model: MCTS on random playouts, or the uniform evaluator) and, when asked,
GNU Go level 1.

Resume
------
The loop keeps no state of its own beyond small create-only markers under
``ROOT/loop/``; everything else is read back from the lake:

* the current generation is ``models/LATEST`` (0 when absent);
* self-play of generation g is done when ``loop/selfplay-<g>.done`` exists;
* the shuffle is done when ``windows/<g+1>/MANIFEST.json`` exists;
* training is done when generation g+1 is published (LATEST moved);
* an evaluation is done when ``loop/eval-<g+1>.json`` exists.

Each invocation also writes its full settings (the loop's and each role's,
see LoopConfig) once to ``loop/settings/<run id>.json`` (a new record per
invocation; ``layout.settings_record``).

The concurrent schedule needs no marker of its own: the worker's spool (in
``--state-dir``), the follower's windows and the trainer's checkpoint are
where each role resumes.

Rerunning the same command therefore picks up at the phase that was
interrupted; finished chunks, shards and checkpoints are never rewritten
(each role writes create-only, and the trainer resumes its checkpoint).
The time budget counts from the start of each invocation.

On Ctrl-C or SIGTERM the loop sends SIGTERM to the process group of the
phase in flight (the worker then writes every finished game; the group, so
that the shuffle's Beam worker processes stop too: processes.children),
SIGKILLs it after 60 s, and exits 130; in the concurrent schedule every
role gets SIGTERM (and SIGKILL after its own grace), and each dies with the
loop should the loop itself be killed.

How the loop knows what a phase is doing
----------------------------------------
Each child gets ``--events PATH`` (format.events): a fresh JSON-lines file
per phase in a local folder of this invocation.  The loop follows it with an
EventTail while the child runs: the worker's ``progress`` events give games
and positions, the trainer's ``progress`` events the losses, the match's
``result`` event an evaluation's result.  The children's human lines are
only echoed, never parsed.  Lake paths come from
format.layout (markers: ``layout.loop_marker``).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace

from cloud.storage import retry_flags_argv
from format import layout
from format.cli import (RoleCli, board_size_setting, events_setting, komi_setting, root_setting, setting,
                        setting_problems)
from operations.roles import complete_roles, open_launch, role_argv, role_setting
from format.events import EventLog, EventTail
from format.leases import DAMAGED_EXPIRED, Lease, LeaseLost, Takeover, describe_time
from format.match_record import ClosingRecord, MatchRecord
from model.config import TrainConfig
from pipeline.config import ShuffleConfig
from processes.children import (STOP_GRACE_SECONDS, cpu_share, ignore_sigint_and_sigterm, say, start_child,
                                stop_groups, stop_on_sigint_and_sigterm, waited_children_cpu_seconds)
from selfplay.config import WorkerConfig

# The trainer's progress event fields shown as losses, and their short names.
LOSS_FIELDS = {"loss": "loss", "policy_loss": "policy", "value_loss": "value", "accuracy": "acc",
               "ownership_loss": "ownership", "score_loss": "score"}


DEMO_GENERATIONS = 3
"""Generations of a --minutes run (the 15-minute demo) unless --generations says otherwise."""
LONG_RUN = {"selfplay_seconds": 150.0, "final_gnugo_games": 40, "final_gnugo_visits": 256, "eval_every": 4}
"""The long-run mode's (--hours) settings where the loop's flags say auto.

* Self-play 150 s a generation (`--schedule turns`; the concurrent schedule's
  generations come as the trainer publishes them, 47 in a two-hour run):
  about 200-400k 9x9 positions with the loop's
  Gumbel search at 16/4 simulations (`LOOP_SEARCH`) and the default 4x32
  network on 2 cores (200k on an AVX2-only EPYC, docs/results.md's record
  run); a generation's training (500 steps of 256, 50-80 s) then comes
  twice as often as at 300 s, which won the A/B of docs/results.md ("A/B:
  Gumbel self-play at 16/4 simulations") together with the search; shuffle,
  training and evaluation add 1.5-2.5 minutes, so 2 hours give 21-25
  generations.
* Evaluation against random moves every 4th generation (and the first): each
  costs about 20 s, 4% of a two-hour run if done every generation, to learn
  again that a model beats random moves; every 4th keeps it near 1%.
* 40 games against GNU Go level 1 at the end: the yardstick the README's long
  run reports, with a 95% interval of about +-15 points at 50%.  The model
  searches 256 visits a move there (GNU Go thinks as long as it likes): a
  strength measurement, not the quick check of every generation.  Its
  openings are paired (`GNUGO_PAIRED_OPENINGS`).
"""

GNUGO_PAIRED_OPENINGS = 4
"""The closing match against GNU Go plays each of games/2 random 4-move openings with both colours and no
sampled moves (arena.match --paired-openings 4): sampling the model's first moves while GNU Go plays its
best from move 1 handicapped the model (the published models scored 16, 40 and 30 of 100 this way against
about 13, 19 and 20 with sampled openings: docs/results.md names each figure's protocol)."""

GNUGO_GAME_SECONDS = (1.0, 0.004)
"""One 9x9 game against GNU Go level 1 (one game at a time): about a + b x the model's visits seconds,
rounded up from measured games on 2 cores (a two-hour run's last model, 2026-11-27: 0.91 s at 32 visits,
1.69 s at 256).  The time reserved for the closing matches is taken from self-play and training: the
earlier (1.5, 0.025), measured before the search batched its leaves, reserved 13 of a two-hour run's
minutes that the matches did not use."""
CLOSING_GAME_SECONDS = 0.2
"""One closing game against random moves or generation 0 (32 games at once), when no evaluation of this
run has been timed: measured 0.07 and 0.11 s a game at 32 visits."""
SCHEDULES = ("auto", "turns", "concurrent")
"""``--schedule``: how the roles share the machine (the module docstring's "Schedules")."""
TURNS_STEPS_PER_WINDOW = 500
"""Training steps of a generation in turns (``--train-steps-per-window 0`` = auto): today's 500 x 256,
about 0.5 samples per new row of a 150 s generation."""
CONCURRENT = {"samples_per_row": 2.0, "min_steps_per_window": 100, "max_steps_per_window": 500,
              "max_untrained": 2, "workers": 2, "child_threads": 1, "worker_nice": 0, "status_seconds": 30.0}
"""The concurrent schedule's settings.

* At most 2 samples per new row, and 100 to 500 steps of 256 a window.  In
  a 12-minute trial on 2 shared cores (9x9, the loop's search, 4x32) a
  window got 100-370k new rows and the trainer, at ~1300 rows/s on one
  thread, trained every window its 500 steps: 0.35-1.2 samples per new row,
  so the maximum, not the bound, decided.  The bound acts when self-play
  slows (a bigger network or board): then each row is read at most about
  twice, less than KataGo's 4-8, which a trainer on an accelerator of its
  own, with a larger lake, affords; on this machine rows read more often
  would be rows the trainer cannot reach.  500 steps (the turns'
  generation) keep a new model coming every 1.5-2 minutes there.
* At most 2 windows newer than LATEST: the one in training and one ready.
* Two self-play workers, one TensorFlow/OpenMP thread per role
  (``--child-threads 1``), the workers at nice 0.  One worker keeps about
  0.85 of a core busy (its network thread waits while its search thread
  gathers the next batch), and with the trainer's one thread and the
  follower the roles used 85-86% of 2 cores.  In 10-minute runs on 2 cores
  (docs/results.md, "Every core works"), a second worker raised that to 95%
  and the positions an hour of generation 1 on by a third (6.46 million
  against 4.84), at a fifth fewer trained rows an hour (2.97 million against
  3.77; the turns loop trains 1.89).  More threads for every role
  (``--child-threads 2``) gave the cores to the trainer, two network
  threads in one worker lost positions, and niced workers (``--worker-nice
  5``) lost both figures."""
PHASE_CHILD = {"selfplay": "worker", "shuffle": "window", "train": "train", "evaluate": "evaluate"}
"""What each phase's child is, for its stop grace (processes.children.STOP_GRACE_SECONDS)."""
CONCURRENT_MIN_SECONDS = 60.0
"""The least time the concurrent schedule starts its roles for (their start-up alone takes ~20 s)."""
LOOP_SEARCH = {"gumbel": True, "visits": 16, "fast_visits": 4}
"""The self-play search of the one-machine loop (its worker's defaults; ``--worker-*`` flags override
them): a Gumbel root with sequential halving at 16 simulations for a move with a policy target and 4
for the others.  On 2 cores it makes about 3x the positions an hour that PUCT at 64/16 makes, and with
150 s of self-play a generation its 30-minute runs beat PUCT's by +198 Elo [+158, +238] in the A/B of
docs/results.md ("A/B: Gumbel self-play at 16/4 simulations").  The worker's own defaults (PUCT
at 64/16, `selfplay.config.WorkerConfig`) stay what many-machine deployments run: the A/B measured
this machine's network and budget, not theirs."""


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
    minutes: float = setting(15.0, "wall-clock budget of this invocation; phases are planned to fit it", above=0)
    hours: float = setting(0.0, "long-run mode: a budget of this many hours instead of --minutes, no generation "
                                f"limit, {LONG_RUN['selfplay_seconds']:g} s of self-play a generation and "
                                f"{LONG_RUN['final_gnugo_games']} closing games against GNU Go level 1 (each "
                                "flag that says 'auto'); 0 = off", at_least=0)
    schedule: str = setting("auto", "how the roles share the machine: turns (self-play, shuffle, training and "
                                    "evaluation one after another, a process each per generation) or concurrent "
                                    "(the worker, the shuffle follower and the trainer follower at once, each "
                                    "started once, as operations.cluster runs them); auto = concurrent with "
                                    "--hours, turns for the --minutes demo", choices=SCHEDULES)
    state_dir: str = setting("", "concurrent schedule: the roles' local state (the worker's spool, the "
                                 "trainer's stage, events, logs); default ./loop-state/<hash of root>. The "
                                 "same command reuses it, so a stopped run resumes its spool")
    workers: int = setting(CONCURRENT["workers"], "concurrent schedule: self-play worker processes, each with its own "
                           "spool and the --worker-* settings (seeds differ); 2 keep 2 cores busy beside the "
                           "trainer and the follower", at_least=1)
    child_threads: int = setting(CONCURRENT["child_threads"], "concurrent schedule: TensorFlow/OpenMP threads of "
                                 "each role (0 = their own choice: every core each)", at_least=0)
    worker_nice: int = setting(CONCURRENT["worker_nice"], "concurrent schedule: niceness added to the "
                               "self-play worker, which takes every cycle it gets, so that the trainer and the "
                               "shuffle follower keep their share", at_least=0, at_most=19)
    generations: int = setting(0, "stop once this many model generations are published; 0 = auto: 3, or no "
                                  "limit with --hours", at_least=0)
    selfplay_seconds: float = setting(0.0, "self-play time per generation; 0 = auto: planned from --minutes, or "
                                           f"{LONG_RUN['selfplay_seconds']:g} with --hours", at_least=0)
    generation0_positions: int = setting(0, "end generation 0's self-play once its games hold this many "
                                            "positions (at most its self-play time); 0 = by time only, like "
                                            "every generation", at_least=0)
    eval_games: int = setting(20, "games against random moves after each evaluated generation", at_least=1)
    eval_every: int = setting(0, "evaluate generation 1 and every this many generations after against random "
                                 f"moves; 0 = auto: every one, or every {LONG_RUN['eval_every']} with --hours "
                                 "(turns only: the concurrent schedule plays only the closing matches)",
                              at_least=0, at_most=1000)
    final_eval_games: int = setting(100, "games of the last generation against random moves, and against "
                                         "generation 0", at_least=1)
    eval_visits: int = setting(32, "simulations per move in evaluation games", at_least=1)
    final_gnugo_games: int = setting(-1, "games of the last generation against GNU Go level 1 at the end "
                                         f"(needs gnugo; {GNUGO_PAIRED_OPENINGS}-move random openings, each "
                                         "played with both colours); -1 = auto: none, or "
                                         f"{LONG_RUN['final_gnugo_games']} with --hours", at_least=-1)
    final_gnugo_visits: int = setting(0, "the model's simulations a move in those games; 0 = auto: --eval-visits, "
                                         f"or {LONG_RUN['final_gnugo_visits']} with --hours", at_least=0)
    seed: int = setting(1, "seed of self-play (1000 x seed + generation), the shuffle (seed + generation) and "
                           "evaluation")
    events: str = events_setting(what="the loop's own (phases, stop)")
    worker: WorkerConfig = role_setting(
        WorkerConfig, "self-play (python -m selfplay.worker's flags); the loop sets the seed, worker id, "
                      "time and events of each generation's worker",
        shared=("root", "board_size", "komi"),
        managed=("seed", "worker_id", "max_seconds", "max_positions", "events"),
        # 60 s chunks: the concurrent schedule's follower sees new games within a minute.
        games=64, progress_seconds=15.0, chunk_seconds=60.0, **LOOP_SEARCH)
    shuffle: ShuffleConfig = role_setting(
        ShuffleConfig, "the shuffle job (python -m pipeline.shuffle's flags); in turns the loop sets its seed "
                       "and runs one window per generation, in the concurrent schedule it runs the follower "
                       "and sizes its windows from the trainer's --train-samples-per-row and step bounds",
        shared=("root", "board_size"),
        managed=("seed", "follow", "follow_new_positions", "poll_seconds", "claim_seconds", "events",
                 "dataflow_above_positions", "follow_max_untrained", "samples_per_row", "follow_min_rows",
                 "follow_max_rows"))
    train: TrainConfig = role_setting(
        TrainConfig, "the trainer (python -m model.train's flags); in turns the loop trains one window per "
                     f"generation ({TURNS_STEPS_PER_WINDOW} steps when --train-steps-per-window is 0), in the "
                     "concurrent schedule it runs the trainer's --follow mode (steps by --train-samples-per-row "
                     "within --train-min/max-steps-per-window when --train-steps-per-window is 0); it reads its "
                     "events",
        shared=("root", "board_size"), managed=("follow", "windows", "events"),
        steps_per_window=0, warmup_steps=50, log_every=50,
        samples_per_row=CONCURRENT["samples_per_row"], min_steps_per_window=CONCURRENT["min_steps_per_window"],
        max_steps_per_window=CONCURRENT["max_steps_per_window"])

    def __post_init__(self):
        for problem in setting_problems(self):           # shared settings, declared ranges (format.cli)
            raise ValueError(problem)
        complete_roles(self)

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
        batch = train.batch_size          # per replica; the loop's trainer runs one replica on the CPU
        return replace(self.shuffle, follow_max_untrained=CONCURRENT["max_untrained"],
                       samples_per_row=train.samples_per_row,
                       follow_new_positions=math.ceil(train.min_steps_per_window * batch / train.samples_per_row),
                       follow_min_rows=train.min_steps_per_window * batch,
                       follow_max_rows=train.max_steps_per_window * batch)


# --------------------------------------------------------------------------
# Live status
# --------------------------------------------------------------------------

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
        return (f"[loop {int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] generation {self.generation} | "
                f"{self.phase} | games {self.games} positions {self.positions} | losses {losses} | "
                f"last eval {self.last_eval}")


# --------------------------------------------------------------------------
# Phases
# --------------------------------------------------------------------------


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
        return {"wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1), "cores": os.cpu_count() or 1,
                "cpu_share": round(cpu_share(cpu, wall), 3), "positions": self.positions,
                "positions_per_hour": round(self.positions / hours) if hours else 0,
                "trained_steps": self.trained_steps, "trained_rows": rows,
                "trained_rows_per_hour": round(rows / hours) if hours else 0}

    @staticmethod
    def text(report: dict) -> str:
        return (f"the machine: the roles used {report['cpu_share']:.0%} of {report['cores']} cores over "
                f"{report['wall_seconds'] / 60:.1f} minutes; {report['positions_per_hour']:,} positions/hour "
                f"({report['positions']:,} in all), {report['trained_rows_per_hour']:,} trained rows/hour "
                f"({report['trained_steps']:,} steps x {report['trained_rows'] // max(1, report['trained_steps'])})")


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


class Interrupted(Exception):
    pass


class PhaseFailed(RuntimeError):
    pass


class Loop:
    def __init__(self, config: LoopConfig, storage, retry=None):
        # Turns train a fixed number of steps a generation; the concurrent schedule passes 0 on
        # (the trainer's samples-per-row rule).
        self.config = config = config if config.concurrent else replace(config, train=config.turns_train())
        self.storage = storage
        self.retry = retry  # the --storage-* policy, passed on to every child
        self.status = Status()
        self.deadline = self.status.started + config.budget_seconds
        self.rows: dict[int, GenerationRecord] = {}
        self.phase_seconds = {"shuffle": 45.0, "train": 120.0, "evaluate": 40.0}
        self.child: subprocess.Popen | None = None
        # Local, per invocation: the children's --events files (one per phase run).
        self.events_dir = tempfile.mkdtemp(prefix="zerolake-loop-events-")
        self.phase_runs = 0
        self.events = EventLog(config.events or None, "loop")
        self.lease = None   # format.leases.Lease on layout.LOOP_LEASE, set by main()
        self.meter = RunMeter(global_batch=config.train.batch_size)   # one replica: the loop trains on the CPU
        self.cluster = None   # the concurrent schedule's roles (operations.cluster.Cluster) while they run

    # --- lake state -----------------------------------------------------------
    def current_generation(self) -> int:
        from format.registry import latest_generation

        return latest_generation(self.storage) or 0

    def marker(self, name: str) -> str:
        return layout.loop_marker(name)

    def count_games(self, generation: int) -> tuple[int, int]:
        """(games, positions) in games/<generation>/, read from the chunks."""
        from format.codec import FormatError, iter_chunk

        games = positions = 0
        for info in self.storage.list(layout.games_prefix(generation)):
            if layout.parse_chunk_path(info.path) is None:
                continue
            for item in iter_chunk(self.storage.read(info.path), self.storage.url(info.path)):
                if not isinstance(item, FormatError):
                    games += 1
                    positions += item.num_positions
        return games, positions

    # --- child processes --------------------------------------------------------
    def events_path(self, phase: str) -> str:
        """A fresh events file for one run of a phase."""
        self.phase_runs += 1
        return os.path.join(self.events_dir, f"{self.phase_runs:03d}-{phase}.jsonl")

    def run_child(self, phase: str, argv: list[str], events: str | None = None, on_event=None) -> list[str]:
        """Run one phase's process, echoing its output under the status line.

        With ``events`` (the path passed as the child's ``--events``), each new
        event goes to ``on_event`` as the child runs and once more at its end.
        """
        self.status.phase = phase
        say(self.status.line())
        self.events.emit("phase", generation=self.status.generation, phase=phase)
        started = time.monotonic()
        lines: list[str] = []
        tail = EventTail(events) if events else None

        def deliver():
            if tail is not None and on_event is not None:
                for event in tail.poll():
                    on_event(event)

        # A session of its own: Ctrl-C reaches only the loop, which then
        # stops the child's group with SIGTERM (the worker's graceful path;
        # processes.children says why the group).
        self.child = start_child(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        next_status = time.monotonic() + 20
        try:
            for raw in self.child.stdout:
                line = raw.rstrip()
                lines.append(line)
                deliver()
                if _worth_echoing(line):
                    say(f"    {phase}: {line}")
                if time.monotonic() >= next_status:
                    say(self.status.line())
                    next_status = time.monotonic() + 20
            code = self.child.wait()
            deliver()
        except KeyboardInterrupt:
            self.stop_child()
            raise Interrupted(phase) from None
        finally:
            self.child = None
        self.phase_seconds[phase] = time.monotonic() - started
        if code != 0:
            tail = "\n".join(lines[-15:])
            raise PhaseFailed(f"{phase} exited with status {code}; its last lines:\n{tail}")
        return lines

    def stop_child(self) -> None:
        """SIGTERM the phase's process group (the shuffle's Beam workers too), SIGKILL after its grace."""
        if self.child is None or self.child.poll() is not None:
            return
        say(f"interrupt: stopping {self.status.phase} (SIGTERM), finished work is kept")
        stop_groups([self.child], STOP_GRACE_SECONDS[PHASE_CHILD[self.status.phase]])

    # --- the phases -----------------------------------------------------------
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

    def final_eval_seconds(self) -> float:
        """Expected time of the closing matches (1.5 x final_eval_games games, and the GNU Go games).

        An evaluation costs a start-up (TensorFlow import, model load: 5-10 s) plus a per-game
        share, read off the last evaluation (the turns schedule's; before its first one, a cautious
        default); the concurrent schedule evaluates nothing before the closing matches, and its games
        against random moves and generation 0, 32 at once, take about 0.1 s each.  What is reserved is
        taken from self-play and training, so it is planned close to what the matches take.
        """
        startup = 10.0
        per_game = CLOSING_GAME_SECONDS
        if not self.config.concurrent:
            # The turns schedule times an evaluation every few generations (phase_seconds; before the
            # first, a cautious default); the concurrent schedule's only evaluations are these matches.
            per_game = max(per_game, (self.phase_seconds["evaluate"] - startup) / self.config.eval_games)
        fixed, per_visit = GNUGO_GAME_SECONDS
        gnugo = self.config.gnugo_games * (fixed + per_visit * self.config.gnugo_visits)
        matches = 3 if self.config.gnugo_games else 2
        return matches * startup + 1.5 * self.config.final_eval_games * per_game + gnugo

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
        self.run_child("selfplay", ["selfplay.worker", *role_argv(
            cfg, "worker", retry=self.retry, max_seconds=f"{seconds:.0f}", seed=cfg.seed * 1000 + generation,
            worker_id=f"loop{generation}", events=events,
            **({"max_positions": str(positions)} if positions else {}))], events, on_event)
        self.storage.write_new(self.marker(f"selfplay-{layout.generation_dir(generation)}.done"),
                               json.dumps({"seconds": round(seconds)}).encode())

    def shuffle(self, generation: int) -> None:
        self.run_child("shuffle", ["pipeline.shuffle", *role_argv(self.config, "shuffle", retry=self.retry,
                                                                  seed=self.config.seed + generation)])

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
            self.run_child("train", ["model.train", *role_argv(cfg, "train", retry=self.retry, events=events)],
                           events, on_event)
        finally:
            self.meter.trained_steps += trained_steps(seen)
        return losses

    def evaluate(self, player_a: str, player_b: str, games: int, seed: int, visits: int | None = None,
                 sgf_prefix: str | None = None, paired_openings: int = 0) -> MatchRecord:
        """The match's result (its ``result`` event) with the model's ``visits``.  ``sgf_prefix``: keep
        its per-game results and each game's SGF in the lake as ``<sgf_prefix>/<index:05d>.sgf`` (the
        rating ladder folds such games into its fit: arena.ladder); without it, the totals only.
        ``paired_openings``: arena.match's --paired-openings (0: its sampled opening moves)."""
        # The match writes SGFs to a local folder only: the loop copies them into the lake, then
        # removes the folder.
        sgf_dir = None if sgf_prefix is None else tempfile.mkdtemp(prefix="sgf-", dir=self.events_dir)
        try:
            return self._evaluate(player_a, player_b, games, seed, visits, sgf_prefix, sgf_dir, paired_openings)
        finally:
            if sgf_dir is not None:
                shutil.rmtree(sgf_dir, ignore_errors=True)

    def _evaluate(self, player_a, player_b, games, seed, visits, sgf_prefix, sgf_dir,
                  paired_openings=0) -> MatchRecord:
        events = self.events_path("evaluate")
        results = []
        self.run_child("evaluate", [
            "arena.match", player_a, player_b, "--games", str(games),
            "--visits", str(visits or self.config.eval_visits),
            "--board-size", str(self.config.board_size), "--komi", str(self.config.komi), "--seed", str(seed),
            # The model plays its matches under the pass rule it learnt in self-play.
            *(["--pass-when-winning"] if self.config.worker.pass_when_winning else []),
            *(["--paired-openings", str(paired_openings)] if paired_openings else []),
            *([] if sgf_dir is None else ["--sgf-dir", sgf_dir]),
            "--events", events, *([] if self.retry is None else retry_flags_argv(self.retry))],
            events=events, on_event=lambda event: results.append(event["result"]) if event["event"] == "result"
            else None)
        if not results:
            raise PhaseFailed(f"evaluate reported no result in {events}")
        try:
            result = MatchRecord.from_json_dict(results[-1], f"{events}: the result event")
        except ValueError as exc:
            raise PhaseFailed(str(exc)) from None
        games = None
        if sgf_prefix is not None:
            games = []
            for game in result.game_results or ():
                path = f"{sgf_prefix}/{game.index:05d}.sgf"
                # Replace, not create-only: a closing match interrupted before its marker was written
                # is played again from the start, and its games supersede the partial attempt's,
                # which no marker or result names.
                with open(game.sgf, "rb") as handle:
                    self.storage.write_replace(path, handle.read())
                games.append(replace(game, sgf=path))
        return replace(result, visits=visits or self.config.eval_visits,
                       game_results=None if games is None else tuple(games))

    def evaluate_generation(self, generation: int) -> MatchRecord:
        name = self.marker(f"eval-{layout.generation_dir(generation)}.json")
        if self.storage.exists(name):
            return self.read_record(MatchRecord, name)
        result = self.evaluate(f"model:{self.config.root}@{generation}", "random", self.config.eval_games,
                               self.config.seed + generation)
        self.storage.write_new(name, result.to_bytes())
        return result

    def read_record(self, kind, name: str):
        """``kind.from_bytes`` of the loop marker ``name``; a damaged one is PhaseFailed naming it."""
        try:
            return kind.from_bytes(self.storage.read(name), self.storage.url(name))
        except ValueError as exc:
            raise PhaseFailed(f"{exc} (delete it to play that match again)") from None

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
                say(f"generation {generation} was published but not evaluated (the loop was stopped in "
                    "between); evaluating it now")
                row = self.rows.setdefault(generation, GenerationRecord(generation))
                row.eval_vs_random = self.evaluate_generation(generation)

    # --- the cycle ------------------------------------------------------------
    def run(self) -> int:
        if self.config.concurrent:
            return self.run_concurrent()
        return self.run_turns()

    def run_turns(self) -> int:
        cfg = self.config
        self.evaluate_unevaluated()
        while True:
            if self.lease is not None:
                self.lease.check()   # LeaseLost: another loop owns the root now
            generation = self.current_generation()
            self.status.generation = generation
            if cfg.generation_limit is not None and generation >= cfg.generation_limit:
                break
            if time.monotonic() >= self.deadline:
                say(f"time budget of {cfg.budget_text()} used up at generation {generation}; "
                    f"rerun the same command to continue")
                break
            started = time.monotonic()
            row = self.rows.setdefault(generation, GenerationRecord(generation))
            played = False
            if not self.storage.exists(self.marker(f"selfplay-{layout.generation_dir(generation)}.done")):
                seconds = self.selfplay_seconds(generation)
                if not seconds:
                    say(f"time left in the budget of {cfg.budget_text()} holds less than half a generation's "
                        f"self-play; stopping at generation {generation} for the closing matches")
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

    # --- the concurrent schedule ------------------------------------------------------
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
            say(f"time left in the budget of {cfg.budget_text()} holds less than {CONCURRENT_MIN_SECONDS:.0f} s "
                f"of self-play and training; stopping at generation {generation} for the closing matches")
            return self.finish()
        self.cluster = cluster = self.start_roles(seconds, None if limit is None else limit - generation)
        self.status.phase = "roles"
        self.events.emit("phase", generation=generation, phase="roles")
        say(f"roles at once for {seconds / 60:.1f} minutes (worker, shuffle follower, trainer); their logs and "
            f"events in {cluster.state_dir}")
        reason = "interrupted"
        try:
            reason = cluster.run()
        finally:
            ignore_sigint_and_sigterm()         # the stop itself is not interrupted
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
        from operations.cluster import Cluster, ClusterConfig, Commands, default_state_dir

        cfg = self.config
        state_dir = os.path.abspath(cfg.state_dir or default_state_dir(cfg.root, "loop-state"))
        roles = ClusterConfig(
            root=cfg.root, workers=cfg.workers, state_dir=state_dir, board_size=cfg.board_size, komi=cfg.komi,
            status_seconds=CONCURRENT["status_seconds"], child_threads=cfg.child_threads,
            worker_nice=cfg.worker_nice, minutes=seconds / 60, until_generations=generations or 0,
            worker=cfg.worker, shuffle=cfg.follower_shuffle(), train=cfg.train)
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
        say(f"the roles used {cpu['cpu_share']:.0%} of {cpu['cores']} cores over {cpu['wall_seconds'] / 60:.1f} "
            f"minutes: {shares}")

    def _totals(self) -> tuple[int, int]:
        return (sum(r.games for r in self.rows.values()), sum(r.positions for r in self.rows.values()))

    def finish(self) -> int:
        cfg = self.config
        final = self.current_generation()
        final_results = None
        if final >= 1:
            name = self.marker(f"final-{layout.generation_dir(final)}.json")
            if self.storage.exists(name):
                final_results = self.read_record(ClosingRecord, name)
            else:
                model = f"model:{cfg.root}@{final}"
                final_results = ClosingRecord(
                    vs_random=self.evaluate(model, "random", cfg.final_eval_games, cfg.seed + 101),
                    vs_generation_0=self.evaluate(model, cfg.generation0_player, cfg.final_eval_games // 2,
                                                  cfg.seed + 102),
                    vs_gnugo_1=self.evaluate(
                        model, "gnugo:1", cfg.gnugo_games, cfg.seed + 103, visits=cfg.gnugo_visits,
                        sgf_prefix=self.marker(f"final-{layout.generation_dir(final)}-gnugo-1"),
                        paired_openings=GNUGO_PAIRED_OPENINGS)
                    if cfg.gnugo_games else None)
                self.storage.write_new(name, final_results.to_bytes())
        self.status.phase = "done"
        say(self.status.line())
        report = self.meter.report()
        self.events.emit("throughput", **report)
        say(summary_table(self.fill_rows(final), final, final_results, report))
        return 0

    def fill_rows(self, final: int) -> list[GenerationRecord]:
        """Rows for every generation, reading back what this invocation did not see."""
        rows = []
        for g in range(final + 1):
            row = self.rows.get(g) or GenerationRecord(g)
            if not row.games:
                row.games, row.positions = self.count_games(g)
            if g >= 1 and row.eval_vs_random is None:
                name = self.marker(f"eval-{layout.generation_dir(g)}.json")
                if self.storage.exists(name):
                    row.eval_vs_random = self.read_record(MatchRecord, name)
            rows.append(row)
        return rows


def loss_fields(event: dict) -> dict:
    """A trainer ``progress`` event's losses under their short names (LOSS_FIELDS)."""
    return {short: float(event[name]) for name, short in LOSS_FIELDS.items() if event.get(name) is not None}


def _worth_echoing(line: str) -> bool:
    """Progress and problems, not the children's library chatter."""
    if not line.strip():
        return False
    noisy = ("WARNING: All log messages", "oneDNN", "cpu_feature_guard", "TF_ENABLE_ONEDNN", "absl::",
             "rebuild TensorFlow", "I0000", "E0000", "W0000", "To enable the following instructions")
    return not any(n in line for n in noisy)


def summary_table(rows: list[GenerationRecord], final: int, final_results: ClosingRecord | None,
                  throughput: dict | None = None) -> str:
    header = f"{'gen':>4} {'games':>6} {'positions':>9} {'policy':>7} {'value':>6} {'acc':>6} {'loss':>6}  " \
             f"{'vs random (trained models)':<40} {'time':>6}"
    lines = ["", "summary", header, "-" * len(header)]
    for row in rows:
        losses = row.losses
        cells = [f"{losses[k]:.3f}" if k in losses else "-" for k in ("policy", "value", "acc", "loss")]
        evaluation = row.eval_vs_random.text() if row.eval_vs_random else "-"
        seconds = f"{row.seconds:.0f}s" if row.seconds else "-"
        lines.append(f"{row.generation:>4} {row.games:>6} {row.positions:>9} {cells[0]:>7} {cells[1]:>6} "
                     f"{cells[2]:>6} {cells[3]:>6}  {evaluation:<40} {seconds:>6}")
    lines.append("(losses: the training of the next generation on this generation's window; loss = total)")
    if final_results:
        lines.append("")
        lines.append(f"final generation {final}:")
        lines.append(f"  vs uniform random moves: {final_results.vs_random.text()}")
        opponent = final_results.vs_generation_0.player_b
        lines.append(f"  vs generation 0 ({opponent} MCTS): {final_results.vs_generation_0.text()}")
        gnugo = final_results.vs_gnugo_1
        if gnugo is not None:
            lines.append(f"  vs GNU Go level 1 (the model at {gnugo.visits} visits a move, {GNUGO_PAIRED_OPENINGS}-move "
                         f"paired openings): {gnugo.text()}")
    if throughput is not None:
        lines.append("")
        lines.append(RunMeter.text(throughput))
    return "\n".join(lines)


# --------------------------------------------------------------------------


CLI = RoleCli(
    LoopConfig, prog="python -m operations.loop",
    description="Run self-play, the shuffle job and the trainer in cycles on one machine against one lake "
                "root, evaluate each new model, and print a summary. Rerun the same command to resume.")


LOOP_LEASE_SECONDS = 60.0
"""Lifetime of the loop's lease on its root (renewed every quarter of it by a thread)."""


def hold_root(config: LoopConfig, retry):
    """This loop's lease on its root (renewing), or the one line that refuses a second loop.

    Two loops on one root played the same seeds into it and then died on a
    create-only write; one loop per root, as one trainer per root.
    """
    from cloud.storage import StorageError, open_storage

    try:
        lease = Lease(open_storage(config.root, retry=retry), layout.LOOP_LEASE, LOOP_LEASE_SECONDS,
                      takeover=Takeover(damaged=DAMAGED_EXPIRED, dead_local_holder=True), name="loop lease",
                      lost_note="; stopping (another operations.loop took this root)")
        holder = lease.try_acquire()
    except (StorageError, ValueError) as exc:
        return f"cannot open {config.root}: {exc}"
    if holder is not None:
        return (f"another operations.loop ({holder.holder}) drives {config.root} ({lease.url}); it expires "
                f"{describe_time(holder.expires, time.time())} unless renewed. One loop per root: stop that "
                "one, or give this one another --root")
    lease.start_renewing()
    return lease


def missing_tools(config: LoopConfig) -> str:
    """What this run will need but the machine lacks, in one line ('' = nothing): checked at
    start-up, so a long run never finds out after hours of training."""
    if config.gnugo_games:
        from arena.gtp_client import GnuGoNotFound, find_gnugo

        try:
            find_gnugo()
        except GnuGoNotFound as exc:
            return (f"this run ends with {config.gnugo_games} games against GNU Go level 1, and {exc} "
                    "(scripts/run.sh installs it for such runs; or scripts/setup.sh --gnugo)")
    return ""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    config, retry = CLI.parse(argv)
    missing = missing_tools(config)
    if missing:
        print(f"operations.loop: error: {missing}", file=sys.stderr)
        return 2
    lease = hold_root(config, retry)
    if isinstance(lease, str):
        print(f"operations.loop: error: {lease}", file=sys.stderr)
        return 2
    storage, record = open_launch(CLI.prog, "loop", config, retry=retry, argv=argv)
    # Ctrl-C and SIGTERM (e.g. a preempted VM) both stop the phase in flight cleanly.
    stop_on_sigint_and_sigterm()
    loop = Loop(config, storage, retry)
    loop.lease = lease
    limit = config.generation_limit
    say(f"zerolake loop on {storage.url()}: {config.board_size}x{config.board_size}, "
        f"{'as many generations as fit' if limit is None else f'{limit} generations'} within "
        f"{config.budget_text()}, the roles {'at once' if config.concurrent else 'in turns'}; "
        f"settings in {storage.url(record)}")
    reason = "error"
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
        lease.stop_renewing()
        lease.release()
        loop.events.emit("stopped", reason=reason, generation=loop.status.generation)
        loop.events.close()
        shutil.rmtree(loop.events_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
