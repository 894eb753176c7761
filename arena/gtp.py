"""``python -m arena.gtp``: zerolake as a GTP version 2 engine on stdin/stdout, for Sabaki, GoGui and gogui-twogtp.

    python -m arena.gtp --root ROOT [--generation G]   # a run's published model
    python -m arena.gtp --model PATH                    # one published model folder
    python -m arena.gtp                                  # no model: uniform evaluator

Data flows: `build_engine` loads the model (or the uniform evaluator) once
and makes a `arena.gtp_engine.GtpEngine`, whose moves come from
`arena.player.MctsPlayer` with a per-move budget of ``--visits`` simulations
and/or ``--seconds-per-move`` seconds, whichever ends first (after
``time_settings``, also capped by a share of the remaining clock:
`arena.gtp_game.move_time_allotment`).  `serve` reads command lines (bytes,
at most MAX_LINE_BYTES each) on its own thread, hands each to
`GtpEngine.handle` and writes the reply; an analysis command's
`StreamingReply` is written while its search runs and stops at the next
input line (`stream_reply`).  The engine never exits except on ``quit``,
end of input or SIGTERM.

Lizzie reads the engine's stderr as part of its replies, and stops reading
the engine for good at a line it takes for one; `main` therefore quiets
TensorFlow's logging before it is imported (`quiet_libraries`) and passes
everything written to fd 2, by any library, through `sanitized_stderr`.

The commands and their replies: arena/gtp_engine.py; the analysis
commands' report lines: arena/gtp_analysis.py; the game state:
arena/gtp_game.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import sys
import threading
import time
from typing import Callable, Iterator

from arena.gtp_analysis import NetworkScore
from arena.gtp_engine import GtpEngine, StreamingReply
from arena.player import MctsConfig, MctsPlayer, SearchBudget
from engine.move_choice import MovePolicy
from format.cli import (
    RoleCli,
    board_size_setting,
    komi_setting,
    pass_when_winning_setting,
    root_setting,
    setting,
    setting_problems,
)
from inference.loading import EvaluatorSource, load_evaluator
from processes.sigterm import EXIT_TERMINATED, Terminated, terminated_by_sigterm

# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GtpConfig:
    """Settings of `python -m arena.gtp` (see --help)."""

    root: str | None = root_setting(
        None,
        required=False,
        note="plays the run's latest published model, or "
        "--generation (neither --root nor --model: the "
        "uniform evaluator)",
    )
    model: str | None = setting(None, "folder of one published model (ROOT/models/<generation>)")
    generation: int | None = setting(None, "with --root: this generation instead of the latest")
    visits: int | None = setting(200, "search simulations per move (0 = no visit limit, needs --seconds-per-move)")
    seconds_per_move: float | None = setting(
        None,
        "wall-clock limit per move; with --visits, whichever ends first. time_settings/time_left can only shorten it",
    )
    board_size: int = board_size_setting(note="until the controller's boardsize")
    komi: float = komi_setting(note="until the controller's komi")
    resign_threshold: float | None = setting(
        None,
        "answer genmove with 'resign' when the root value for us is below this (e.g. -0.95; default: never resign)",
    )
    resign_consecutive: int = setting(
        1, "...for this many of our consecutive moves (self-play's rule, engine.move_choice)"
    )
    pass_when_winning: bool = pass_when_winning_setting()
    seed: int = setting(0, "seed of the search's random draws")
    quiet: bool = setting(False, "no per-move search line on stderr")

    def __post_init__(self):
        if self.visits == 0:
            object.__setattr__(self, "visits", None)  # 0 on the command line = no visit limit
        if self.root and self.model:
            raise ValueError("give --root or --model, not both")
        if self.generation is not None and not self.root:
            raise ValueError("--generation needs --root")
        if self.model:
            EvaluatorSource.from_model_dir(self.model)  # validates the path's shape
        for problem in setting_problems(self):  # root, board size, komi
            raise ValueError(problem)
        SearchBudget(self.visits, self.seconds_per_move)  # validates both
        MovePolicy(resign_threshold=self.resign_threshold, resign_consecutive=self.resign_consecutive)


CLI = RoleCli(
    GtpConfig,
    prog="python -m arena.gtp",
    description="zerolake as a GTP v2 engine on stdin/stdout (Sabaki, GoGui, gogui-twogtp). "
    "Without --root or --model the search uses the uniform evaluator.",
)


def evaluator_source(config: GtpConfig) -> EvaluatorSource:
    if config.model:
        return EvaluatorSource.from_model_dir(config.model)
    return EvaluatorSource(model_root=config.root, generation=config.generation)


def build_engine(config: GtpConfig, log: Callable[[str], None] | None = None, retry=None) -> GtpEngine:
    """The engine for `config`: loads the model (or the uniform evaluator) once;
    ``retry`` is the storage RetryPolicy for a gs:// root."""
    loaded = load_evaluator(evaluator_source(config), retry=retry)
    mcts = MctsConfig(
        budget=SearchBudget(config.visits, config.seconds_per_move),
        moves=MovePolicy(resign_threshold=config.resign_threshold, resign_consecutive=config.resign_consecutive),
        seed=config.seed,
        pass_when_winning=config.pass_when_winning,
    )

    def player_for(board_size: int, config: MctsConfig = mcts) -> MctsPlayer:
        return MctsPlayer(loaded.for_board_size(board_size), config, name=loaded.name)

    def cleanup_player_for(board_size: int) -> MctsPlayer:
        return player_for(board_size, dataclasses.replace(mcts, pass_when_winning=False))

    return GtpEngine(
        player_for,
        mcts.budget,
        board_size=loaded.board_size or config.board_size,
        komi=config.komi if loaded.komi is None else loaded.komi,
        log=log,
        cleanup_factory=cleanup_player_for if config.pass_when_winning else None,
        scorer=network_score(config, loaded, retry),
    )


def network_score(config: GtpConfig, loaded, retry) -> NetworkScore | None:
    """kata-analyze's score fields for a published model: its score head,
    through the SavedModel itself (the search's evaluator may be OpenVINO's
    copy, which keeps only the policy and value); None for the uniform
    evaluator, which has none."""
    if loaded.board_size is None:
        return None
    from cloud.storage import open_storage
    from inference.model_files import load_model

    source = evaluator_source(config)
    if source.model_root is None:
        raise ValueError("arena.gtp: a model's score head needs the model's root (--root or --model)")
    return NetworkScore(load_model(open_storage(source.model_root, retry=retry), loaded.generation))


MAX_LINE_BYTES = 4096
"""Longest command line answered; GTP commands are short, and reading an
unbounded line let a controller that never sends a newline fill memory."""


def read_command_line(stdin) -> bytes | None:
    """The next line of at most MAX_LINE_BYTES, b"" for an over-long one (its
    rest is read and dropped in bounded pieces), None at end of input."""
    raw = stdin.readline(MAX_LINE_BYTES + 1)
    if not raw:
        return None
    if len(raw) <= MAX_LINE_BYTES or raw.endswith(b"\n"):
        return raw
    while True:
        rest = stdin.readline(MAX_LINE_BYTES)
        if not rest or rest.endswith(b"\n"):
            return b""


LINE_QUEUE_SIZE = 64
"""Input lines read ahead while a command runs; the reader then waits, so a
controller that floods the engine during a long search fills no memory."""

_NOT_READ = object()
"""`stream_reply`'s answer when it ended without reading a line."""


def start_reader(stdin) -> queue.Queue:
    """A daemon thread putting `read_command_line`'s results (bytes; None at
    the end of input, then nothing) into the returned queue, so that `serve`
    sees a line arrive while a search runs (the analysis commands stop at
    the next line).  Daemon: at quit it may be blocked reading, which must
    not keep the process alive."""
    lines: queue.Queue = queue.Queue(LINE_QUEUE_SIZE)

    def read() -> None:
        while True:
            raw = read_command_line(stdin)
            lines.put(raw)
            if raw is None:
                return

    threading.Thread(target=read, name="gtp-input", daemon=True).start()
    return lines


def _take_line(lines: queue.Queue, timeout: float | None = 0.0):
    """The next input line (bytes, or None at end of input) if one comes
    within `timeout` seconds (None: wait for it), else _NOT_READ."""
    try:
        if timeout is not None and timeout <= 0:
            return lines.get_nowait()
        return lines.get(timeout=timeout)
    except queue.Empty:
        return _NOT_READ


def stream_reply(reply: StreamingReply, lines: queue.Queue, stdout):
    """Write `reply` (StreamingReply's docstring) while its search runs.

    A stoppable reply checks the input before each evaluator batch and ends
    at the first line; once its search has ended it waits for that line,
    waking for each report.  Returns the line that stopped it (to be
    answered next) or _NOT_READ.  An error inside the search can no longer
    become a '?' reply (the '=' is out): it goes to stderr and the reply ends."""
    stdout.write(reply.head + "\n")
    stdout.flush()
    interval = reply.interval
    next_report = None if interval is None else time.monotonic() + interval
    searching, stopper = True, _NOT_READ
    try:
        while True:
            if reply.stoppable:
                wait: float | None = 0.0
                if not searching:
                    wait = None if next_report is None else next_report - time.monotonic()
                stopper = _take_line(lines, wait)
                if stopper is not _NOT_READ:
                    break
            if searching:
                searching = reply.step()
                if not searching and not reply.stoppable:
                    break  # genmove_analyze: its tree has moved on to the chosen move
            if next_report is not None and interval is not None and time.monotonic() >= next_report:
                line = reply.report()
                if line:
                    stdout.write(line + "\n")
                    stdout.flush()
                next_report = time.monotonic() + interval
        text = reply.finish()
    except Exception as exc:  # noqa: BLE001 - the reply must still end
        text = ""
        print(
            f"arena.gtp: analysis stopped by an internal error: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
    stdout.write(text + "\n\n" if text else "\n")
    stdout.flush()
    return stopper


def serve(engine: GtpEngine, stdin, stdout) -> None:
    """Answer commands from `stdin` (bytes) on `stdout` (text) until quit or EOF."""
    lines = start_reader(stdin)
    raw = lines.get()
    while raw is not None:
        follow = _NOT_READ
        if raw == b"":
            stdout.write(f"? command longer than {MAX_LINE_BYTES} bytes\n\n")
            stdout.flush()
        else:
            reply = engine.handle(raw.decode("utf-8", errors="replace"))
            if isinstance(reply, StreamingReply):
                follow = stream_reply(reply, lines, stdout)
            elif reply:
                stdout.write(reply)
                stdout.flush()
            if engine.quit_requested:
                return
        raw = lines.get() if follow is _NOT_READ else follow


# --------------------------------------------------------------------------
# stderr, as a GUI reading it with the replies sees it
# --------------------------------------------------------------------------

UNSAFE_LINE_STARTS = (b"=", b"?", b"info", b"play", b"komi=", b"opp_komi=", b"Tuning")
"""Line starts that Lizzie 0.7.4 (Leelaz.parseLine) acts on: a reply (its id
parsed as an integer, which throws on anything else and ends the reading),
an analysis line, a move, a komi, a tuning notice."""
UNSAFE_LINE_PART = b" -> "
"""Leela Zero's old summary lines; Lizzie parses one as a move's data."""
STDERR_MARK = b"stderr: "
"""Put before a line that would be unsafe, so that no GUI acts on it."""
STDERR_CHUNK = 65536
"""Bytes read from the pipe at once; also the longest line held back
waiting for its newline (a longer one is written out as a line)."""


def safe_stderr_line(line: bytes) -> bytes:
    """`line` (with its newline) as the engine's stderr writes it: unchanged
    unless a GUI could take it for engine output (`UNSAFE_LINE_STARTS`,
    `UNSAFE_LINE_PART`), then marked with `STDERR_MARK` and its arrows made
    ``=>``."""
    if line.startswith(UNSAFE_LINE_STARTS) or UNSAFE_LINE_PART in line:
        return STDERR_MARK + line.replace(UNSAFE_LINE_PART, b" => ")
    return line


def quiet_libraries() -> None:
    """TensorFlow's C++ logging (absl) only for errors, unless the user set
    it; call before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@contextlib.contextmanager
def sanitized_stderr() -> Iterator[None]:
    """While inside, fd 2 is a pipe whose lines a thread writes to the real
    stderr through `safe_stderr_line`, so that what a library writes there
    (C code included) cannot read as a GTP reply.  On leaving, fd 2 is the
    real stderr again and what was written is flushed out."""
    sys.stderr.flush()
    real = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def copy() -> None:
        pending = b""
        while chunk := os.read(read_end, STDERR_CHUNK):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if len(pending) >= STDERR_CHUNK:
                lines, pending = lines + [pending], b""
            if lines:
                os.write(real, b"".join(safe_stderr_line(line + b"\n") for line in lines))
        if pending:
            os.write(real, safe_stderr_line(pending + b"\n"))

    thread = threading.Thread(target=copy, name="gtp-stderr", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)  # the pipe's last writer closed: the thread reads its end
        thread.join(timeout=5)
        os.close(read_end)
        os.close(real)


def main(argv=None) -> int:
    config, retry = CLI.parse(argv)
    quiet_libraries()
    with sanitized_stderr():
        return _main(config, retry)


def _main(config: GtpConfig, retry) -> int:
    log = None if config.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    # A GUI or systemd stops an engine with SIGTERM: unwinding closes the player and,
    # at exit, removes the temporary copy of the model (inference.model_files.ModelCache).
    try:
        with terminated_by_sigterm():
            return _load_and_serve(config, log, retry)
    except Terminated:
        print("arena.gtp: stopped by SIGTERM", file=sys.stderr)
        return EXIT_TERMINATED


def _load_and_serve(config: GtpConfig, log, retry) -> int:
    from cloud.base import StorageError
    from format.registry import RegistryError

    try:
        engine = build_engine(config, log, retry)
    except (OSError, ValueError, LookupError, RegistryError, StorageError) as exc:
        print(f"arena.gtp: cannot load the model: {exc}", file=sys.stderr)
        return 2
    # The input thread (start_reader) may still be blocked reading when the
    # process exits; it reads its own buffered reader of fd 0, not
    # sys.stdin.buffer, whose lock interpreter shutdown takes to close it
    # (a daemon thread holding it there is a fatal error).
    stdin = open(sys.stdin.fileno(), "rb", closefd=False)
    try:
        serve(engine, stdin, sys.stdout)
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
