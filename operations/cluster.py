"""``python -m operations.cluster``: every role at once, as separate processes, on one root.

The roles run at the same time and meet only through the storage root, as they would on many machines
(operations.loop's concurrent schedule runs its roles with this supervisor)::

    worker0..K-1   python -m selfplay.worker --spool-dir ... --events ...   games/<gen>/ chunks
    shuffle        python -m pipeline.shuffle --follow --events ...        windows/<gen>/
    trainer        python -m model.train --follow --stage-dir ... --events ... models/<gen>/ + LATEST

A *role* is one supervised child process with a fixed name (``worker0``, ``shuffle``, ``trainer``) and
*kind* (``worker``, ``shuffle``, ``train``); one that exits is started again after a doubling backoff
with the same arguments, so it resumes from its spool, its checkpoint or the lake, and each dies with
the launcher (PR_SET_PDEATHSIG).  The *state dir* (``--state-dir``, default ``./cluster-state/<hash of
the lake>``, however ``--root`` spells it) is what a machine would keep on its local disk: per role
``spool/``, ``stage/``, ``models/``, ``events/<role>.jsonl`` and ``logs/<role>.log``; the same command
reuses it and resumes.  One launcher per root: the launcher lease (operations.roles.hold_root, shared
with operations.loop) refuses a second one in one line (exit 2); a launcher that loses it exits 3.

Data flow: the roles' settings are their own configs (``--worker-*``, ``--shuffle-*``, ``--train-*``:
operations.roles), recorded once per invocation in ``cluster/settings/<run id>.json``.  The launcher
reads only the roles' events (format.events.EventTail) and the lake, prints a status line every few
seconds and emits it as a ``status`` event (with each role's share of the cores).

Chaos: ``--chaos-kill-every S`` SIGKILLs a seeded random role every ~S seconds (the kinds killed least
first); at the end every role is restarted, stopped cleanly, and operations.chaos_audit checks the lake
against the events, printing one JSON line (and ``--report``).  Ctrl-C or SIGTERM stops every child's
process group with its own grace (processes.children.STOP_GRACE_SECONDS, or ``--stop-grace``); exit 130.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from cloud.storage import canonical_root
from format import layout
from format.cli import (
    RoleCli,
    board_size_setting,
    config_from_namespace,
    events_setting,
    komi_setting,
    poll_seconds_setting,
    root_setting,
    setting,
    setting_problems,
    storage_retry,
)
from format.events import EventError, EventLog, EventTail
from format.leases import LeaseLost
from format.registry import latest_generation
from model.config import TrainConfig
from operations.chaos_audit import ZERO_LOSS_KEYS, audit_run
from operations.roles import complete_roles, hold_root, open_launch, role_argv, role_setting
from pipeline.config import ShuffleConfig
from processes.children import (
    STOP_GRACE_SECONDS,
    cpu_seconds_of_trees,
    cpu_share,
    die_with_parent,
    ignore_sigint_and_sigterm,
    say,
    signal_group,
    start_child,
    stop_groups,
    stop_on_sigint_and_sigterm,
    waited_children_cpu_seconds,
)
from selfplay.config import WorkerConfig

KINDS = ("worker", "shuffle", "train")
MODULES = {"worker": "selfplay.worker", "shuffle": "pipeline.shuffle", "train": "model.train"}
# A role that dies younger than this counts as failing; its backoff doubles.
YOUNG_DEATH_SECONDS = 15.0


@dataclass(frozen=True)
class ClusterConfig:
    """Settings of the launcher (each is a flag, see --help; role_args comes from --role-args).

    The roles' settings are the roles' own configs (operations.roles.role_setting):
    ``--worker-*`` is WorkerConfig, ``--shuffle-*`` ShuffleConfig,
    ``--train-*`` TrainConfig, passed to every process of the role.  The
    launcher sets per process what must differ between processes or follow
    its state dir (worker ids, spools, events files, the stage dir) and the
    shared cadence (--poll-seconds, --status-seconds).
    """

    root: str = root_setting("./lake", required=False)
    workers: int = setting(2, "self-play worker processes", at_least=1)
    state_dir: str = setting(
        "",
        "local state (spools, stage dir, events, logs); default ./cluster-state/<hash of the lake> (one folder "
        "per lake, however --root spells it)",
    )
    events: str = events_setting(what="the launcher's own", empty="STATE_DIR/events/cluster.jsonl")
    board_size: int = board_size_setting(note="written to run.json on an empty root")
    komi: float = komi_setting()
    poll_seconds: float = poll_seconds_setting(
        5.0, looks_at="the lake, for the followers and workers (their --poll-seconds)"
    )
    status_seconds: float = setting(5.0, "seconds between status lines (and the workers' --progress-seconds)", above=0)
    child_threads: int = setting(
        0, "TensorFlow/OpenMP threads per child (0 = their own choice); 1 suits a small machine", at_least=0
    )
    worker_nice: int = setting(
        0,
        "niceness added to worker processes (e.g. 10 on a small machine, so that "
        "self-play, which takes all the CPU it gets, yields to the shuffle follower and "
        "the trainer)",
        at_least=0,
    )
    minutes: float = setting(0.0, "stop after this long (0 = no limit)", at_least=0)
    until_generations: int = setting(
        0,
        "stop once this many model generations are published (seen in the "
        "trainer's events in the state dir, or as moves of LATEST; 0 = no limit)",
        at_least=0,
    )
    chaos_kill_every: float = setting(
        0.0, "chaos mode: SIGKILL a random role about every this many seconds (0 = off)", at_least=0
    )
    chaos_seed: int = setting(1, "seed of the chaos mode's choices")
    chaos_min_kills_per_kind: int = setting(
        0, "with --until-generations: also wait until each kind was killed this often", at_least=0
    )
    chaos_max_kills: int = setting(
        0, "stop killing after this many kills (0 = no limit); the run then shows it recovers", at_least=0
    )
    chaos_min_uptime: float = setting(
        0.0,
        "spare a role until it has run this long since its (re)start, so that a "
        "role that needs a while to get anything done (the trainer) still does",
        at_least=0,
    )
    restart_backoff: float = setting(
        1.0, "seconds before restarting a role that exited (doubles while it keeps dying young)", above=0
    )
    stop_grace: float = setting(
        0.0,
        "seconds every child has to exit after SIGTERM before SIGKILL (0 = each "
        "role's own: 25 for a worker, 60 for the follower, 120 for the trainer)",
        at_least=0,
    )
    drain_seconds: float = setting(
        60.0, "at a planned end: at most this long to let every role come back up before stopping", at_least=0
    )
    check: bool = setting(
        False, "at the end, verify the lake against the events and print one JSON line (implied by chaos)"
    )
    report: str = setting("", "also write the final check's JSON to this file")
    role_args: tuple = setting((), hidden=True)
    """ROLE=ARGS: extra arguments for every process of ROLE (worker, shuffle, train); repeatable (parsed from
    repeated --role-args ROLE=ARGS)"""
    worker: WorkerConfig = role_setting(
        WorkerConfig,
        "every self-play worker (python -m selfplay.worker's flags); the launcher sets each one's "
        "worker id, spool, model cache, events, --poll-seconds and --progress-seconds; each draws its "
        "own seed",
        shared=("root", "board_size", "komi"),
        managed=("seed", "worker_id", "spool_dir", "model_cache", "events", "poll_seconds", "progress_seconds"),
        games=32,
        visits=32,
        fast_visits=8,
        chunk_games=16,
        chunk_seconds=30.0,
    )
    shuffle: ShuffleConfig = role_setting(
        ShuffleConfig,
        "the shuffle follower (python -m pipeline.shuffle --follow's flags); the launcher sets "
        "its events and --poll-seconds",
        shared=("root", "board_size"),
        managed=("follow", "poll_seconds", "events"),
        workers=1,
        follow_new_positions=5000,
    )
    train: TrainConfig = role_setting(
        TrainConfig,
        "the trainer (python -m model.train --follow's flags); the launcher sets its stage dir, "
        "events and --poll-seconds",
        shared=("root", "board_size"),
        managed=("follow", "poll_seconds", "events", "stage_dir"),
        blocks=2,
        filters=16,
        batch_size=128,
        steps_per_window=200,
        checkpoint_every=50,
        warmup_steps=50,
        log_every=50,
    )

    def __post_init__(self):
        for problem in setting_problems(self):  # shared settings, declared ranges (format.cli)
            raise ValueError(problem)
        for kind, _ in self.role_args:
            if kind not in KINDS:
                raise ValueError(f"--role-args: unknown role {kind!r}; use worker, shuffle or train")
        complete_roles(self)

    @property
    def chaos(self) -> bool:
        return self.chaos_kill_every > 0

    def extra_args(self, kind: str) -> list[str]:
        return [arg for k, args in self.role_args if k == kind for arg in args]


def default_state_dir(root: str, folder: str = "cluster-state") -> str:
    """``./<folder>/<12 hex of sha256(the lake's canonical root)>``: one state folder per lake, however
    ``root`` spells it (operations.loop's is loop-state).

    The workers' spools live in it, so a launcher killed under ``--root lake`` and restarted under
    ``--root /abs/lake`` must find them (keyed by the spelling, it made a new folder, and the spooled
    games were never uploaded).  A folder keyed by this root's spelling, as earlier versions named
    it, is moved to the canonical name when that one does not exist yet.
    """
    state = os.path.join(folder, hashlib.sha256(canonical_root(root).encode()).hexdigest()[:12])
    spelled = os.path.join(folder, hashlib.sha256(root.encode()).hexdigest()[:12])
    if spelled != state and os.path.isdir(spelled) and not os.path.lexists(state):
        os.rename(spelled, state)
        print(f"moved the state folder {spelled} (named by the spelling {root!r}) to {state}", file=sys.stderr)
    return state


# --------------------------------------------------------------------------
# Roles: which flags each has, and the command of each
# --------------------------------------------------------------------------


@dataclass
class RoleSpec:
    """What it takes to (re)start one role: the same command every time."""

    name: str
    kind: str
    argv: list[str]
    events_path: str
    log_path: str
    spool_dir: str = ""


class Commands:
    """Builds each role's command: the role's config from ClusterConfig
    (operations.roles.role_argv), the settings this launcher manages, then the
    role's --role-args; the same command at every (re)start."""

    def __init__(self, config: ClusterConfig, state_dir: str, retry=None):
        self.config = config
        self.state_dir = state_dir
        self.retry = retry  # the --storage-* policy, passed on to every role

    def path(self, *parts: str) -> str:
        return os.path.abspath(os.path.join(self.state_dir, *parts))

    def worker(self, index: int) -> RoleSpec:
        cfg = self.config
        name = f"worker{index}"
        events = self.path("events", f"{name}.jsonl")
        spool = self.path(name, "spool")
        # No '-' in a worker id (chunk names use it as the separator); the
        # worker adds its host, pid and random hex to this prefix.
        argv = role_argv(
            cfg,
            "worker",
            retry=self.retry,
            worker_id=f"w{index}",
            spool_dir=spool,
            model_cache=self.path(name, "models"),
            events=events,
            poll_seconds=cfg.poll_seconds,
            progress_seconds=cfg.status_seconds,
        )
        return RoleSpec(
            name,
            "worker",
            [MODULES["worker"], *argv, *cfg.extra_args("worker")],
            events,
            self.path("logs", f"{name}.log"),
            spool_dir=spool,
        )

    def shuffle(self) -> RoleSpec:
        cfg = self.config
        events = self.path("events", "shuffle.jsonl")
        argv = role_argv(cfg, "shuffle", retry=self.retry, follow=True, poll_seconds=cfg.poll_seconds, events=events)
        return RoleSpec(
            "shuffle",
            "shuffle",
            [MODULES["shuffle"], *argv, *cfg.extra_args("shuffle")],
            events,
            self.path("logs", "shuffle.log"),
        )

    def trainer(self) -> RoleSpec:
        cfg = self.config
        events = self.path("events", "trainer.jsonl")
        argv = role_argv(
            cfg,
            "train",
            retry=self.retry,
            follow=True,
            poll_seconds=cfg.poll_seconds,
            events=events,
            stage_dir=self.path("trainer", "stage"),
        )
        return RoleSpec(
            "trainer",
            "train",
            [MODULES["train"], *argv, *cfg.extra_args("train")],
            events,
            self.path("logs", "trainer.log"),
        )

    def all(self) -> list[RoleSpec]:
        return [self.worker(i) for i in range(self.config.workers)] + [self.shuffle(), self.trainer()]


# --------------------------------------------------------------------------
# Supervision
# --------------------------------------------------------------------------


@dataclass
class Role:
    """One supervised role and its process history."""

    spec: RoleSpec
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    kills: int = 0
    young_deaths: int = 0
    next_start: float = 0.0
    pids: list = field(default_factory=list)
    last_returncode: int | None = None
    stopped: bool = False
    cpu_done: float = 0.0
    """CPU seconds of this role's exited processes (each process's last sample, with its descendants)."""
    cpu_live: float = 0.0
    """CPU seconds so far of the running process and its descendants (the last sample)."""

    @property
    def cpu_seconds(self) -> float:
        return self.cpu_done + self.cpu_live

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def child(self) -> subprocess.Popen:
        """The role's process, for a role that has one (started and not yet reaped or stopped)."""
        if self.process is None:
            raise RuntimeError(f"role {self.name} has no process (not started, or already reaped)")
        return self.process

    @property
    def state(self) -> str:
        if self.running:
            return "up"
        if self.stopped:
            return "stopped"
        return "down" if self.process is None and not self.pids else "restarting"


def child_env(threads: int) -> dict[str, str]:
    """What the roles' environment adds to the launcher's (`processes.children.start_child` adds the rest)."""
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    if threads:
        for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS"):
            env[name] = str(threads)
    return env


@dataclass
class ChaosMonkey:
    """Chooses whom to SIGKILL, and when (seeded)."""

    every: float
    rng: random.Random
    min_uptime: float = 0.0
    next_kill: float = 0.0
    kills_by_kind: dict = field(default_factory=lambda: {k: 0 for k in KINDS})

    def schedule(self, now: float) -> None:
        self.next_kill = now + self.every * self.rng.uniform(0.5, 1.5)

    def choose(self, roles: list[Role]) -> Role | None:
        """A running role (up at least min_uptime) of a least-killed kind; None when there is none."""
        now = time.monotonic()
        running = [r for r in roles if r.running and now - r.started_at >= self.min_uptime]
        if not running:
            return None
        fewest = min(self.kills_by_kind[r.kind] for r in running)
        kinds = sorted({r.kind for r in running if self.kills_by_kind[r.kind] == fewest})
        kind = self.rng.choice(kinds)
        return self.rng.choice([r for r in running if r.kind == kind])


class Observer:
    """What the roles' events and the lake say, accumulated over the run.

    Reads each role's events file with an EventTail, and LATEST from the
    lake.  Everything the status line and the checker need is kept here.
    A worker's ``game_finished`` events (one a game) are counted
    (`games_finished`, `positions_finished`) and kept only with
    ``keep_games`` (the chaos check reads each one): kept always, they grew a
    launcher by about 100 MB in two hours of two workers (219,000 games).
    """

    def __init__(self, storage, roles: list[Role], keep_games: bool = True):
        self.storage = storage
        self.tails = {r.name: EventTail(r.spec.events_path) for r in roles}
        self.events: dict[str, list[dict]] = {r.name: [] for r in roles}
        self.keep_games = keep_games
        self.games_finished = 0
        self.positions_finished = 0
        self.playing_pids: set[int] = set()  # workers that have finished a game
        self.bad_events = 0
        self.latest: int | None = None
        self.latest_samples = 0
        self.latest_regressions = 0
        self.latest_changes: list[tuple[float, int]] = []  # (time seen, generation)
        self.chunks = 0

    def poll_events(self) -> None:
        for name, tail in self.tails.items():
            try:
                events = tail.poll()
            except EventError:
                self.bad_events += 1
                continue
            for event in events:
                if event["role"] == "worker" and event["event"] == "game_finished":
                    self.games_finished += 1
                    self.positions_finished += int(event["moves"])
                    self.playing_pids.add(event["pid"])
                    if not self.keep_games:
                        continue
                self.events[name].append(event)

    def sample_latest(self) -> None:
        try:
            latest = latest_generation(self.storage)
        except Exception:  # noqa: BLE001 - a storage hiccup costs one sample
            return
        self.latest_samples += 1
        if self.latest is not None and (latest is None or latest < self.latest):  # gone, or moved back
            self.latest_regressions += 1
        if latest is not None and latest != self.latest:
            self.latest_changes.append((time.time(), latest))
        self.latest = latest

    def count_chunks(self) -> None:
        try:
            self.chunks = sum(
                1 for i in self.storage.list(layout.games_prefix()) if layout.parse_chunk_path(i.path) is not None
            )
        except Exception:  # noqa: BLE001
            pass

    def published(self) -> set[int]:
        """Generations seen published in this run: the trainer's events and LATEST's moves."""
        seen = {g for _, g in self.latest_changes if g > 0}
        seen.update(int(e["generation"]) for e in self.events.get("trainer", []) if e["event"] == "published")
        return seen

    def of(self, name: str, event: str) -> list[dict]:
        return [e for e in self.events.get(name, []) if e["event"] == event]

    def totals(self) -> dict:
        """games, positions (reported finished by workers), last loss, per worker generation."""
        games, positions = self.games_finished, self.positions_finished
        progress_games = 0
        for events in self.events.values():
            # Without game_finished events, fall back to the newest progress of each process.
            last_by_pid: dict[int, dict] = {}
            for e in events:
                if e["role"] == "worker" and e["event"] == "progress":
                    last_by_pid[e["pid"]] = e
            progress_games += sum(int(e["games"]) for e in last_by_pid.values())
        loss = None
        for e in self.events.get("trainer", []):
            if e["event"] == "progress":
                loss = e["loss"]
        return {"games": games or progress_games, "positions": positions, "loss": loss}


class Cluster:
    def __init__(self, config: ClusterConfig, storage, state_dir: str, specs: list[RoleSpec]):
        self.config = config
        self.storage = storage
        self.state_dir = state_dir
        self.roles = [Role(spec) for spec in specs]
        self.observer = Observer(storage, self.roles, keep_games=config.check or config.chaos)
        self.events = EventLog(config.events or os.path.join(state_dir, "events", "cluster.jsonl"), "cluster")
        self.lease = None
        """The launcher's lease on the root (operations.roles.hold_root), checked every tick: LeaseLost
        when another launcher took it."""
        self.chaos = (
            ChaosMonkey(config.chaos_kill_every, random.Random(config.chaos_seed), config.chaos_min_uptime)
            if config.chaos
            else None
        )
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.stopped_wall = 0.0
        self.env = child_env(config.child_threads)
        self.cpu_waited_at_start = waited_children_cpu_seconds()

    # --- processes ------------------------------------------------------------
    def start(self, role: Role) -> None:
        os.makedirs(os.path.dirname(role.spec.log_path), exist_ok=True)
        if role.spec.spool_dir:
            os.makedirs(role.spec.spool_dir, exist_ok=True)
        with open(role.spec.log_path, "ab") as log:
            log.write(f"\n==== {time.strftime('%H:%M:%S')} start: {shlex.join(role.spec.argv)}\n".encode())
            log.flush()
            # A session of its own: a Ctrl-C at the terminal reaches only the
            # launcher, which then stops each child with SIGTERM.
            # Each child dies with the launcher (a SIGKILLed launcher leaves no role running, holding
            # the trainer lease or playing into the lake unsupervised); a rerun starts them again.
            nice = self.config.worker_nice if role.kind == "worker" else 0
            with_parent = die_with_parent(os.getpid())

            def setup():
                with_parent()
                if nice:
                    os.nice(nice)

            role.process = start_child(
                role.spec.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=setup,
            )
        if role.pids:
            role.restarts += 1
        role.pids.append(role.process.pid)
        role.started_at = time.monotonic()
        self.events.emit("role_started", name=role.name, pid=role.process.pid, kind=role.kind, restarts=role.restarts)

    def reap(self, role: Role, now: float) -> None:
        """Notice an exit and plan the restart."""
        code = role.child.poll()
        if code is None:
            return
        uptime = now - role.started_at
        role.last_returncode = code
        role.cpu_done += role.cpu_live
        role.cpu_live = 0.0
        self.events.emit("role_exited", name=role.name, returncode=code, pid=role.child.pid, uptime_s=round(uptime, 1))
        role.process = None
        role.young_deaths = role.young_deaths + 1 if uptime < YOUNG_DEATH_SECONDS and code != -signal.SIGKILL else 0
        role.next_start = now + min(30.0, self.config.restart_backoff * 2 ** min(role.young_deaths, 5))
        if code not in (0, -signal.SIGKILL):
            say(f"    {role.name} exited with status {code} after {uptime:.0f}s; see {role.spec.log_path}")

    def supervise(self, now: float) -> None:
        for role in self.roles:
            if role.process is not None:
                self.reap(role, now)
            if role.process is None and now >= role.next_start:
                self.start(role)

    def kill(self, role: Role) -> None:
        if self.chaos is None:
            raise RuntimeError("only chaos kills roles, and chaos is off (--chaos-kill-every 0)")
        pid = role.child.pid
        if not signal_group(role.child, signal.SIGKILL):  # the role and anything it started (Beam's workers)
            return
        role.kills += 1
        self.chaos.kills_by_kind[role.kind] += 1
        self.events.emit("role_killed", name=role.name, pid=pid, kind=role.kind, by="chaos")
        say(f"    chaos: SIGKILL {role.name} (pid {pid})")

    def stop_all(self) -> None:
        """SIGTERM every child, give each its grace (--stop-grace for all, or each role's own:
        processes.children.STOP_GRACE_SECONDS), then SIGKILL stragglers."""
        self.sample_cpu()  # each role's share up to the stop (what the stop costs counts in the total only)
        live = [r for r in self.roles if r.running]
        graces = {role.name: self.config.stop_grace or STOP_GRACE_SECONDS[role.kind] for role in live}
        killed = stop_groups([role.child for role in live], [graces[role.name] for role in live])
        for role in live:
            if role.process in killed:
                say(f"    {role.name} did not stop within {graces[role.name]:g}s: SIGKILL")
                self.events.emit("role_killed", name=role.name, pid=role.child.pid, kind=role.kind, by="stop")
            self.events.emit(
                "role_exited",
                name=role.name,
                returncode=role.child.returncode,
                pid=role.child.pid,
                uptime_s=round(time.monotonic() - role.started_at, 1),
            )
        for role in self.roles:
            role.process = None
            role.stopped = True
            role.cpu_done += role.cpu_live  # waited for now: counted by getrusage from here on
            role.cpu_live = 0.0

    # --- status -----------------------------------------------------------------
    def sample_cpu(self) -> None:
        """Each running role's CPU seconds so far (its process and descendants, processes.children)."""
        running = {r.child.pid: r for r in self.roles if r.running}
        for pid, seconds in cpu_seconds_of_trees(running).items():
            running[pid].cpu_live = seconds

    def cpu(self) -> dict:
        """CPU the roles used since this launcher started them: ``cpu_seconds`` (user + system, every
        process: the waited ones exactly, from getrusage, plus the running ones' last sample),
        ``cpu_share`` of all cores over the wall time, and each role's share (from its samples)."""
        wall = time.monotonic() - self.started
        total = waited_children_cpu_seconds() - self.cpu_waited_at_start + sum(r.cpu_live for r in self.roles)
        return {
            "cpu_seconds": round(total, 1),
            "cpu_share": round(cpu_share(total, wall), 3),
            "cores": os.cpu_count() or 1,
            "wall_seconds": round(wall, 1),
            "role_cpu_share": {r.name: round(cpu_share(r.cpu_seconds, wall), 3) for r in self.roles},
        }

    def status(self) -> dict:
        totals = self.observer.totals()
        roles = {r.name: {"state": r.state, "restarts": r.restarts, "kills": r.kills} for r in self.roles}
        return {
            "generation": self.observer.latest or 0,
            "games": totals["games"],
            "positions": totals["positions"],
            "chunks": self.observer.chunks,
            "loss": totals["loss"],
            "roles": roles,
            "kills": sum(r.kills for r in self.roles),
            **self.cpu(),
        }

    def status_line(self, status: dict) -> str:
        elapsed = int(time.monotonic() - self.started)
        roles = " ".join(f"{name} {r['state']}/{r['restarts']}" for name, r in status["roles"].items())
        loss = f"{status['loss']:.3f}" if status["loss"] is not None else "-"
        chaos = f" | kills {status['kills']}" if self.chaos else ""
        return (
            f"[cluster {elapsed // 60:02d}:{elapsed % 60:02d}] generation {status['generation']} | "
            f"games {status['games']} positions {status['positions']} chunks {status['chunks']} | "
            f"{roles} | loss {loss} | cpu {status['cpu_share']:.0%} of {status['cores']} cores{chaos}"
        )

    # --- the run ------------------------------------------------------------------
    def goal_reached(self) -> bool:
        cfg = self.config
        if cfg.minutes and time.monotonic() - self.started >= cfg.minutes * 60:
            return True
        if cfg.until_generations and len(self.observer.published()) >= cfg.until_generations:
            if not self.chaos or min(self.chaos.kills_by_kind.values()) >= cfg.chaos_min_kills_per_kind:
                return True
        return False

    def tick(self, now: float, next_status: float) -> float:
        self.supervise(now)
        self.observer.poll_events()
        self.observer.sample_latest()
        if now >= next_status:
            self.sample_cpu()
            self.observer.count_chunks()
            status = self.status()
            self.events.emit("status", **status)
            say(self.status_line(status))
            next_status = now + self.config.status_seconds
        return next_status

    def run(self) -> str:
        """Supervise until the goal or an interrupt; returns the stop reason."""
        next_status = time.monotonic()
        if self.chaos:
            self.chaos.schedule(time.monotonic())
        while not self.goal_reached():
            if self.lease is not None:
                self.lease.check()
            now = time.monotonic()
            next_status = self.tick(now, next_status)
            if self.chaos and now >= self.chaos.next_kill and not self.chaos_done():
                victim = self.chaos.choose(self.roles)
                if victim is not None:
                    self.kill(victim)
                self.chaos.schedule(now)
            time.sleep(0.5)
        self.drain()
        return "goal"

    def chaos_done(self) -> bool:
        limit = self.config.chaos_max_kills
        if self.chaos is None:
            return False  # no chaos, no kills
        return bool(limit) and sum(self.chaos.kills_by_kind.values()) >= limit

    def drain(self) -> None:
        """Before a planned stop: no more kills; let every role come back up.

        A restarted worker uploads its spool when it starts, so the check at
        the end sees every finished game in the lake.  Bounded by --drain-seconds.
        """
        deadline = time.monotonic() + self.config.drain_seconds
        for role in self.roles:
            if role.process is None:
                role.next_start = 0.0
        next_status = time.monotonic()
        while time.monotonic() < deadline:
            next_status = self.tick(time.monotonic(), next_status)
            if all(self.settled(r) for r in self.roles):
                break
            time.sleep(0.5)

    def settled(self, role: Role) -> bool:
        """Up, and (for a worker) past its start: it has reported progress since it started."""
        if not role.running:
            return False
        if role.kind != "worker":
            return True
        pid = role.child.pid
        if role.spec.events_path and os.path.exists(role.spec.events_path):
            return pid in self.observer.playing_pids or any(
                e["pid"] == pid and e["event"] in ("progress", "chunk_uploaded")
                for e in self.observer.events[role.name]
            )
        return time.monotonic() - role.started_at > 20

    def stop(self, reason: str) -> None:
        self.stop_all()
        self.stopped_wall = time.time()
        self.observer.poll_events()
        self.observer.sample_latest()
        self.observer.count_chunks()
        status = self.status()
        say(self.status_line(status))
        self.events.emit("stopped", reason=reason, generation=status["generation"], kills=status["kills"])


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------


def parse_role_args(values: list[str]) -> tuple:
    """``["worker=--leaves-per-game 4", ...]`` -> ``(("worker", ("--leaves-per-game", "4")), ...)``."""
    parsed = []
    for value in values:
        kind, sep, args = value.partition("=")
        if not sep or kind.strip() not in KINDS:
            raise ValueError(f"--role-args expects ROLE=ARGS with ROLE worker, shuffle or train; got {value!r}")
        parsed.append((kind.strip(), tuple(shlex.split(args))))
    return tuple(parsed)


CLI = RoleCli(
    ClusterConfig,
    prog="python -m operations.cluster",
    description="Run every role at once as its own process against one lake root (K self-play workers, "
    "the shuffle follower, the trainer), restart any that dies, and print one status line for "
    "the whole cluster. Ctrl-C stops every role cleanly; the same command resumes.",
    arguments=(
        (
            ("--role-args",),
            dict(
                action="append",
                default=[],
                metavar="ROLE=ARGS",
                help="extra arguments for every process of ROLE (worker, shuffle, train); repeatable",
            ),
        ),
    ),
)


def build_parser() -> argparse.ArgumentParser:
    return CLI.parser()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        role_args = parse_role_args(args.role_args)
    except ValueError as exc:
        parser.error(str(exc))
    config = config_from_namespace(ClusterConfig, args, parser, role_args=role_args)
    retry = storage_retry(args, parser)
    lease = hold_root(parser.prog, config.root, retry)
    if isinstance(lease, str):
        print(f"{parser.prog}: error: {lease}", file=sys.stderr)
        return 2
    try:
        return supervise(parser.prog, config, retry, argv, lease)
    finally:
        lease.stop_renewing()
        lease.release()


def supervise(prog: str, config: ClusterConfig, retry, argv, lease) -> int:
    """The cluster's run under its lease: start the roles, supervise them to the goal or a stop, stop
    them, and check the run when asked.  Returns the exit status."""
    storage, record = open_launch(prog, "cluster", config, retry=retry, argv=argv)
    state_dir = os.path.abspath(config.state_dir or default_state_dir(config.root))
    commands = Commands(config, state_dir, retry)
    specs = commands.all()
    say(
        f"zerolake cluster on {storage.url()}: {config.workers} workers, shuffle follower, trainer; "
        f"state in {state_dir}"
    )
    say(f"    settings in {storage.url(record)}")
    cluster = Cluster(config, storage, state_dir, specs)
    cluster.lease = lease
    stop_on_sigint_and_sigterm()
    code = 0
    try:
        reason = cluster.run()
    except KeyboardInterrupt:
        reason, code = "interrupted", 130
        say("interrupt: stopping every role (SIGTERM); rerun the same command to resume")
    except LeaseLost as exc:
        reason, code = "lease lost", 3
        print(f"{prog}: error: {exc}", file=sys.stderr)
    ignore_sigint_and_sigterm()
    cluster.stop(reason)
    if (config.check or config.chaos) and code == 0:
        report = audit_run(
            storage,
            cluster.observer,
            cluster.roles,
            wall_seconds=cluster.stopped_wall - cluster.started_wall,
            stopped_wall=cluster.stopped_wall,
            kills_by_kind=cluster.chaos.kills_by_kind if cluster.chaos else {},
        )
        cluster.events.emit("checked", **report)
        line = json.dumps(report, sort_keys=False)
        if config.report:
            with open(config.report, "w") as out:
                out.write(line + "\n")
        say(line)
        if any(report[k] for k in ZERO_LOSS_KEYS):
            code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
