"""One invocation of the loop, whatever its schedule: the child processes, the matches, and the
closing matches that end every run.

Every phase is a child process (``python -m ROLE``), so each role runs exactly as a user would run it
and a crash or a Ctrl-C costs only the phase in flight.  Each child gets ``--events PATH``
(format.events), a fresh JSON-lines file in a local folder of this invocation, which the loop follows
while the child runs; the children's human lines are only echoed, never parsed.  On Ctrl-C or SIGTERM
the loop stops the child's process group (SIGTERM, SIGKILL after its grace: processes.children).

The loop keeps no state of its own beyond small create-only markers under ``ROOT/loop/``
(``layout.loop_marker``): ``eval-<g>.json`` (an evaluation) and ``final-<g>.json`` (the closing
matches), and the time it has run (``loop/budget.json``, operations.loop.budget); everything else is
read back from the lake, so rerunning the same command resumes, with what is left of the budget.  The
closing matches put the last generation against random moves, against generation 0 (the worker's
evaluator before any model) and, when asked, GNU Go level 1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import replace

from cloud.storage import retry_flags_argv
from format import layout
from format.events import EventLog, EventTail
from format.match_record import ClosingRecord, MatchRecord
from operations.loop.budget import BudgetClock
from operations.loop.records import GenerationRecord, RunMeter, Status, summary_table
from operations.loop.settings import (
    ANNEAL_SWA_DECAY,
    CLOSING_GAME_SECONDS,
    GNUGO_GAME_SECONDS,
    GNUGO_PAIRED_OPENINGS,
    PHASE_CHILD,
    LoopConfig,
)
from processes.children import STOP_GRACE_SECONDS, die_with_parent, say, start_child, stop_groups


class Interrupted(Exception):
    """A Ctrl-C or SIGTERM stopped the phase in flight (its name is the message); a rerun resumes."""


class PhaseFailed(RuntimeError):
    """A phase failed, or a marker it left is damaged; the message says which and what to do."""


class LoopRun:
    """What every schedule shares: the lake's state, the child processes, the matches and the
    closing matches.  Schedules are its subclasses (operations.loop.turns, operations.loop.concurrent)."""

    def __init__(self, config: LoopConfig, storage, retry=None):
        # Turns train a fixed number of steps a generation; the concurrent schedule passes 0 on
        # (the trainer's samples-per-row rule).
        self.config = config = config if config.concurrent else replace(config, train=config.turns_train())
        self.storage = storage
        self.retry = retry  # the --storage-* policy, passed on to every child
        self.status = Status()
        # --hours/--minutes is the whole run's: what earlier invocations on this lake ran is spent.
        self.budget = BudgetClock(storage, config.budget_seconds)
        self.deadline = self.status.started + self.budget.left_seconds
        self.rows: dict[int, GenerationRecord] = {}
        self.phase_seconds = {"shuffle": 45.0, "train": 120.0, "evaluate": 40.0}
        if config.anneal:
            self.config = config = replace(config, train=self.annealed(config.train))
        self.child: subprocess.Popen | None = None
        self._events_dir = ""
        self.phase_runs = 0
        self.events = EventLog(config.events or None, "loop")
        self.lease = None  # format.leases.Lease on layout.LAUNCHER_LEASE, set by main()
        self.meter = RunMeter(global_batch=config.train.batch_size)  # one replica: the loop trains on the CPU
        self.cluster = None  # the concurrent schedule's roles (operations.cluster.Cluster) while they run

    @property
    def events_dir(self) -> str:
        """Local, per invocation: the phases' --events files (one per phase run) and the closing matches'
        SGFs on their way to the lake.  In the loop's state folder, made at first use: in TMPDIR a
        SIGKILLed loop left one folder a run.  The launcher lease makes it this loop's, so what an earlier
        invocation left there goes."""
        if not self._events_dir:
            folder = os.path.join(self.state_dir, "phase-events")
            shutil.rmtree(folder, ignore_errors=True)
            for attempt in range(5):  # another loop's end may prune ./loop-state while we make it
                try:
                    os.makedirs(folder, exist_ok=True)
                    break
                except FileNotFoundError:
                    if attempt == 4:
                        raise
            self._events_dir = folder
        return self._events_dir

    def remove_events_dir(self) -> None:
        """At the end: the phases' events go, and the default state folder too when nothing else is in it
        (the turns schedule keeps nothing there)."""
        if not self._events_dir:
            return
        shutil.rmtree(self._events_dir, ignore_errors=True)
        folders = () if self.config.state_dir else (self.state_dir, os.path.dirname(self.state_dir))
        for folder in folders:
            try:
                os.rmdir(folder)
            except OSError:
                return  # not empty (or gone): kept

    @property
    def state_dir(self) -> str:
        """The loop's local state: --state-dir, else ./loop-state/<hash of the lake>."""
        from operations.cluster import default_state_dir

        return os.path.abspath(self.config.state_dir or default_state_dir(self.config.root, "loop-state"))

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
        # It dies with the loop (a SIGKILLed loop left its worker uploading and its trainer holding the
        # lease, so that "rerun the same command" failed).
        self.child = start_child(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            preexec_fn=die_with_parent(os.getpid()),
        )
        next_status = time.monotonic() + 20
        try:
            output = self.child.stdout
            if output is None:
                raise RuntimeError(f"{phase}: the child's output is not a pipe")  # stdout=PIPE makes one
            for raw in output:
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
            last_lines = "\n".join(lines[-15:])
            raise PhaseFailed(f"{phase} exited with status {code}; its last lines:\n{last_lines}")
        return lines

    def stop_child(self) -> None:
        """SIGTERM the phase's process group (the shuffle's Beam workers too), SIGKILL after its grace."""
        if self.child is None or self.child.poll() is not None:
            return
        say(f"interrupt: stopping {self.status.phase} (SIGTERM), finished work is kept")
        stop_groups([self.child], STOP_GRACE_SECONDS[PHASE_CHILD[self.status.phase]])

    # --- the matches, and the closing matches that end every run ---------------
    def annealed(self, train):
        """``train`` with the --anneal schedule on the clock: the rate falls over the last --anneal share of
        the run's time for self-play and training (the budget less the closing matches; a resumed run's
        anneal may have begun before this invocation), and the trainer publishes averaged weights
        (`ANNEAL_SWA_DECAY` unless --train-swa-decay says)."""
        now = time.time()
        closing = self.final_eval_seconds()
        end = now + max(0.0, self.deadline - time.monotonic() - closing)
        if end - now < 1.0:  # nothing left to train: no schedule to plan
            return train
        training = max(end - now, self.config.budget_seconds - closing)
        return replace(
            train,
            lr_schedule="anneal",
            lr_anneal_by="clock",
            lr_anneal_from=round(end - self.config.anneal * training, 1),
            lr_anneal_to=round(end, 1),
            swa_decay=train.swa_decay or ANNEAL_SWA_DECAY,
        )

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

    def evaluate(
        self,
        player_a: str,
        player_b: str,
        games: int,
        seed: int,
        visits: int | None = None,
        sgf_prefix: str | None = None,
        paired_openings: int = 0,
    ) -> MatchRecord:
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

    def _evaluate(self, player_a, player_b, games, seed, visits, sgf_prefix, sgf_dir, paired_openings=0) -> MatchRecord:
        events = self.events_path("evaluate")
        results = []
        self.run_child(
            "evaluate",
            [
                "arena.match",
                player_a,
                player_b,
                "--games",
                str(games),
                "--visits",
                str(visits or self.config.eval_visits),
                "--board-size",
                str(self.config.board_size),
                "--komi",
                str(self.config.komi),
                "--seed",
                str(seed),
                # The model plays its matches under the pass rule it learnt in self-play.
                *(["--pass-when-winning"] if self.config.worker.pass_when_winning else []),
                *(["--paired-openings", str(paired_openings)] if paired_openings else []),
                *([] if sgf_dir is None else ["--sgf-dir", sgf_dir]),
                "--events",
                events,
                *([] if self.retry is None else retry_flags_argv(self.retry)),
            ],
            events=events,
            on_event=lambda event: results.append(event["result"]) if event["event"] == "result" else None,
        )
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
                if game.sgf is None:
                    raise PhaseFailed(
                        f"evaluate: game {game.index} of {events} names no SGF file "
                        "(arena.match writes one only with --sgf-dir)"
                    )
                # Replace, not create-only: a closing match interrupted before its marker was written
                # is played again from the start, and its games supersede the partial attempt's,
                # which no marker or result names.
                with open(game.sgf, "rb") as handle:
                    self.storage.write_replace(path, handle.read())
                games.append(replace(game, sgf=path))
        return replace(
            result, visits=visits or self.config.eval_visits, game_results=None if games is None else tuple(games)
        )

    def read_record(self, kind, name: str):
        """``kind.from_bytes`` of the loop marker ``name``; a damaged one is PhaseFailed naming it."""
        try:
            return kind.from_bytes(self.storage.read(name), self.storage.url(name))
        except ValueError as exc:
            raise PhaseFailed(f"{exc} (delete it to play that match again)") from None

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
                    vs_generation_0=self.evaluate(
                        model, cfg.generation0_player, cfg.final_eval_games // 2, cfg.seed + 102
                    ),
                    vs_gnugo_1=self.evaluate(
                        model,
                        "gnugo:1",
                        cfg.gnugo_games,
                        cfg.seed + 103,
                        visits=cfg.gnugo_visits,
                        sgf_prefix=self.marker(f"final-{layout.generation_dir(final)}-gnugo-1"),
                        paired_openings=GNUGO_PAIRED_OPENINGS,
                    )
                    if cfg.gnugo_games
                    else None,
                )
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


def _worth_echoing(line: str) -> bool:
    """Progress and problems, not the children's library chatter."""
    if not line.strip():
        return False
    noisy = (
        "WARNING: All log messages",
        "oneDNN",
        "cpu_feature_guard",
        "TF_ENABLE_ONEDNN",
        "absl::",
        "rebuild TensorFlow",
        "I0000",
        "E0000",
        "W0000",
        "To enable the following instructions",
    )
    return not any(n in line for n in noisy)
