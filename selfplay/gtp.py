"""A GTP version 2 engine on stdin/stdout, for Sabaki, GoGui and gogui-twogtp.

    python -m selfplay.gtp --root ROOT [--generation G]   # a run's published model
    python -m selfplay.gtp --model PATH                    # one published model folder
    python -m selfplay.gtp                                  # no model: uniform evaluator

Moves come from `selfplay.player.MctsPlayer` (the project's batched Cython
search) with a per-move budget of ``--visits`` simulations and/or
``--seconds-per-move`` seconds, whichever ends first.  After
``time_settings``, each move's time is further capped by an allotment of the
remaining clock (`move_time_allotment`).

Protocol handling (GTP 2 spec, section 2-3): control characters other than
tab and newline are dropped, tabs become spaces, ``#`` starts a comment,
blank lines get no reply.  A command may start with a numeric id, echoed in
the reply (``12 genmove b`` -> ``=12 D4``).  A reply is ``= text`` or
``? message`` followed by one empty line.  Every failure, malformed input
included, is a ``?`` reply; the engine never exits except on ``quit`` or end
of input.

Rules are the project's (Tromp-Taylor area scoring, positional superko,
suicide illegal); ``final_score`` is the Tromp-Taylor area score of the
position as it stands, from Black's side, as ``B+3.5``, ``W+0.5`` or ``0``.

GTP allows a controller to play either colour at any time (setup stones, two
moves in a row) or to go on after two passes.  The engine's Board always
alternates, so when a move's colour is not the side to move, or the game is
over, the position is re-entered as a fresh position with that colour to
move (`Board.set_position`).  Superko history before that point is then
forgotten; the move list is kept, so ``undo`` still works.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Callable

from format.cli import (RoleCli, board_size_setting, komi_setting, pass_when_winning_setting, root_setting, setting,
                        setting_problems)
from format import schema
from selfplay.board import Board, IllegalMove
from format.coords import GTP_COLUMNS, gtp_to_move, move_to_gtp
from selfplay.move_policy import MovePolicy
from selfplay.player import (
    EXIT_TERMINATED, RESIGN, EvaluatorSource, MctsConfig, MctsPlayer, SearchBudget, Terminated, load_evaluator,
    terminated_by_sigterm,
)

ENGINE_NAME = "zerolake"
ENGINE_VERSION = "0.1"
PROTOCOL_VERSION = "2"

MAX_MOVES_PER_POINT = 10
"""Board move cap = this x N x N: far beyond any real game, so the cap only
stops runaway controllers."""

TIME_SAFETY_FRACTION = 0.8
"""Share of a move's time allotment the search may use (the rest covers
I/O and the controller's own latency)."""
MIN_MOVE_SECONDS = 0.05


class GtpFailure(Exception):
    """A command failed; the message is the text of the '?' reply."""


@dataclasses.dataclass(frozen=True)
class TimeControl:
    """Canadian byo-yomi as GTP's time_settings gives it (seconds, stones).

    byo_yomi_time > 0 with byo_yomi_stones == 0 means no time limit (spec
    4.6); main_time with byo_yomi_time == 0 is absolute time."""

    main_time: float
    byo_yomi_time: float
    byo_yomi_stones: int

    @property
    def unlimited(self) -> bool:
        return self.byo_yomi_time > 0 and self.byo_yomi_stones == 0


def move_time_allotment(control: TimeControl, remaining: float | None, stones: int | None,
                        board_size: int, move_number: int) -> float | None:
    """Seconds this move may take under `control`, or None if unlimited.

    In byo-yomi (stones > 0) the period's time is split evenly over its
    stones.  In main time the remaining time is split over the mover's
    expected remaining moves: (3/4 N^2 - moves played) / 2, at least N^2/6,
    so that main time lasts the game and the clock never reaches byo-yomi
    in a hurry.  The result keeps a safety margin (TIME_SAFETY_FRACTION)."""
    if control.unlimited:
        return None
    if remaining is None:
        remaining, stones = control.main_time, 0
        if remaining <= 0:
            remaining, stones = control.byo_yomi_time, control.byo_yomi_stones
    points = board_size * board_size
    if stones and stones > 0:
        share = remaining / stones
    else:
        own_moves_left = max(points / 6.0, (0.75 * points - move_number) / 2.0)
        share = remaining / own_moves_left
    return max(MIN_MOVE_SECONDS, TIME_SAFETY_FRACTION * share)


def format_score(score: float) -> str:
    """GTP final_score text of a Black-side area score: 'B+3.5', 'W+0.5', '0'."""
    if score > 0:
        return f"B+{score:g}"
    if score < 0:
        return f"W+{-score:g}"
    return "0"


def parse_color(text: str) -> int:
    lowered = text.lower()
    if lowered in ("b", "black"):
        return schema.BLACK
    if lowered in ("w", "white"):
        return schema.WHITE
    raise GtpFailure(f"syntax error: invalid color {text!r}")


def board_to_text(board: Board) -> str:
    """showboard's picture: rows N..1 top to bottom, columns A.. without I."""
    size = board.size
    letters = "   " + " ".join(GTP_COLUMNS[:size])
    stones = board.stones()
    last = board.last_move
    lines = [letters]
    for row in range(size):
        label = f"{size - row:>2}"
        cells = [{schema.BLACK: "X", schema.WHITE: "O", schema.EMPTY: "."}[int(c)] for c in stones[row]]
        # Separators around each cell; the last move is bracketed: ". (X) .".
        seps = [" "] * (size + 1)
        if 0 <= last < size * size and last // size == row:
            seps[last % size], seps[last % size + 1] = "(", ")"
        text = "".join(sep + cell for sep, cell in zip(seps, cells)) + seps[size]
        lines.append(f"{label}{text}{size - row}")
    lines.append(letters)
    side = "Black" if board.to_play == schema.BLACK else "White"
    lines.append(f"{side} to play, move {board.move_number}, komi {board.komi:g}")
    return "\n".join(lines)


class GtpEngine:
    """GTP state machine: `handle(line)` returns the reply ('' for no reply).

    `player_factory(board_size)` makes the move chooser for a board size
    (raising ValueError when it can't play that size, e.g. a model trained
    on another size); `budget` is the per-move search budget."""

    def __init__(self, player_factory: Callable[[int], MctsPlayer], budget: SearchBudget,
                 board_size: int = schema.DEFAULT_BOARD_SIZE, komi: float = schema.DEFAULT_KOMI, log: Callable[[str], None] | None = None):
        self._player_factory = player_factory
        self.budget = budget
        self.log = log or (lambda text: None)
        self.komi = float(komi)
        self.size = board_size
        self.player = player_factory(board_size)
        self.moves: list[tuple[int, int]] = []        # (colour, action) in order
        self.board = self._new_board()
        self.time_control: TimeControl | None = None
        self.clock: dict[int, tuple[float, int]] = {}  # colour -> (seconds left, stones left)
        self.quit_requested = False
        self.commands = {
            "protocol_version": self.cmd_protocol_version,
            "name": self.cmd_name,
            "version": self.cmd_version,
            "known_command": self.cmd_known_command,
            "list_commands": self.cmd_list_commands,
            "quit": self.cmd_quit,
            "boardsize": self.cmd_boardsize,
            "clear_board": self.cmd_clear_board,
            "komi": self.cmd_komi,
            "play": self.cmd_play,
            "genmove": self.cmd_genmove,
            "undo": self.cmd_undo,
            "showboard": self.cmd_showboard,
            "final_score": self.cmd_final_score,
            "time_settings": self.cmd_time_settings,
            "time_left": self.cmd_time_left,
        }

    # ---- protocol --------------------------------------------------------------

    @staticmethod
    def preprocess(line: str) -> str:
        """Spec 3.1: drop control characters but HT/LF, HT -> space, cut comments."""
        line = "".join(ch for ch in line if ch in "\t\n" or not (ord(ch) < 32 or ord(ch) == 127))
        line = line.replace("\t", " ")
        return line.split("#", 1)[0].strip()

    def handle(self, line: str) -> str:
        """The full reply to one input line (ending in a blank line), or ''."""
        line = self.preprocess(line)
        if not line:
            return ""
        parts = line.split()
        command_id = ""
        if parts[0].isdigit():
            command_id = parts.pop(0)
            if not parts:
                return f"?{command_id} syntax error: missing command\n\n"
        name, args = parts[0], parts[1:]
        handler = self.commands.get(name)
        try:
            if handler is None:
                raise GtpFailure("unknown command")
            text, ok = handler(args), True
        except GtpFailure as exc:
            text, ok = str(exc), False
        except Exception as exc:  # noqa: BLE001 - a controller must always get a reply
            text, ok = f"internal error: {type(exc).__name__}: {exc}", False
        # An empty line ends a reply, so a multi-line text must contain none
        # (its first line may be empty: it follows the '=' on the same line).
        first, *rest = str(text).split("\n")
        text = "\n".join([first] + [row for row in rest if row.strip()])
        head = ("=" if ok else "?") + command_id
        return f"{head} {text}\n\n" if text else f"{head}\n\n"

    # ---- state -----------------------------------------------------------------

    def _new_board(self) -> Board:
        return Board(self.size, self.komi, MAX_MOVES_PER_POINT * self.size * self.size)

    def _board_for(self, board: Board, color: int) -> Board:
        """`board` itself when `color` is to move and the game goes on; else
        the same stones as a fresh position with `color` to move."""
        if board.to_play == color and not board.is_over:
            return board
        fresh = self._new_board()
        fresh.set_position(board.stones(), color)
        return fresh

    def _replay(self, moves: list[tuple[int, int]]) -> Board:
        board = self._new_board()
        for color, move in moves:
            board = self._board_for(board, color)
            board.play(move)
        return board

    def _reset(self, size: int | None = None) -> None:
        if size is not None and size != self.size:
            try:
                player = self._player_factory(size)
            except ValueError as exc:
                raise GtpFailure(f"unacceptable size: {exc}") from None
            self.player.close()
            self.player, self.size = player, size
        self.moves = []
        self.clock = {}
        self.board = self._new_board()
        self.player.start_game(self.size, self.komi)

    # ---- commands --------------------------------------------------------------

    @staticmethod
    def _want_args(args, count, usage):
        if len(args) != count:
            raise GtpFailure(f"syntax error: usage: {usage}")

    def cmd_protocol_version(self, args):
        return PROTOCOL_VERSION

    def cmd_name(self, args):
        return ENGINE_NAME

    def cmd_version(self, args):
        return f"{ENGINE_VERSION} ({self.player.name})"

    def cmd_known_command(self, args):
        self._want_args(args, 1, "known_command COMMAND")
        return "true" if args[0] in self.commands else "false"

    def cmd_list_commands(self, args):
        return "\n".join(self.commands)

    def cmd_quit(self, args):
        self.quit_requested = True
        return ""

    def cmd_boardsize(self, args):
        self._want_args(args, 1, "boardsize SIZE")
        try:
            size = int(args[0])
        except ValueError:
            raise GtpFailure(f"syntax error: board size {args[0]!r} is not an integer") from None
        if not schema.MIN_BOARD_SIZE <= size <= schema.MAX_BOARD_SIZE:
            raise GtpFailure(f"unacceptable size (this engine plays {schema.MIN_BOARD_SIZE}..{schema.MAX_BOARD_SIZE})")
        self._reset(size)
        return ""

    def cmd_clear_board(self, args):
        self._reset()
        return ""

    def cmd_komi(self, args):
        self._want_args(args, 1, "komi VALUE")
        try:
            komi = float(args[0])
        except ValueError:
            raise GtpFailure(f"syntax error: komi {args[0]!r} is not a number") from None
        if not math.isfinite(komi) or abs(komi) > schema.MAX_KOMI:
            raise GtpFailure(f"syntax error: komi {args[0]!r} is out of range")
        self.komi = komi
        self.board = self._replay(self.moves)
        return ""

    def cmd_play(self, args):
        self._want_args(args, 2, "play COLOR VERTEX")
        color = parse_color(args[0])
        try:
            move = gtp_to_move(args[1], self.size)
        except ValueError as exc:
            raise GtpFailure(f"syntax error: {exc}") from None
        self._play(color, move)
        return ""

    def _play(self, color: int, move: int) -> None:
        board = self._board_for(self.board, color)
        try:
            board.play(move)
        except IllegalMove as exc:
            raise GtpFailure(f"illegal move ({exc.reason})") from None
        self.board = board
        self.moves.append((color, move))
        self.player.observe(move, color)

    def cmd_genmove(self, args):
        self._want_args(args, 1, "genmove COLOR")
        color = parse_color(args[0])
        board = self._board_for(self.board, color)
        budget = self._move_budget(color)
        started = time.monotonic()
        move = self.player.select_move(board, budget)
        values = getattr(self.player, "last_root_values", None) or [float("nan")]
        visits = getattr(self.player, "last_visits", None) or [0]
        self.log(f"genmove {args[0]}: {'resign' if move == RESIGN else move_to_gtp(move, self.size)} "
                 f"visits={visits[0]} value={values[0]:+.3f} seconds={time.monotonic() - started:.2f}")
        if move == RESIGN:
            return "resign"
        self._play(color, move)
        return move_to_gtp(move, self.size)

    def _move_budget(self, color: int) -> SearchBudget:
        if self.time_control is None:
            return self.budget
        remaining, stones = self.clock.get(color, (None, None))
        allotment = move_time_allotment(self.time_control, remaining, stones, self.size,
                                        self.board.move_number)
        if allotment is None:
            return self.budget
        seconds = allotment if self.budget.seconds is None else min(allotment, self.budget.seconds)
        return SearchBudget(visits=self.budget.visits, seconds=seconds)

    def cmd_undo(self, args):
        if not self.moves:
            raise GtpFailure("cannot undo")
        self.board = self._replay(self.moves[:-1])
        self.moves.pop()
        return ""

    def cmd_showboard(self, args):
        return "\n" + board_to_text(self.board)

    def cmd_final_score(self, args):
        return format_score(self.board.area_score())

    def cmd_time_settings(self, args):
        self._want_args(args, 3, "time_settings MAIN_TIME BYO_YOMI_TIME BYO_YOMI_STONES")
        try:
            main, byo, stones = float(args[0]), float(args[1]), int(args[2])
        except ValueError:
            raise GtpFailure("syntax error: time_settings wants two numbers and an integer") from None
        if min(main, byo, stones) < 0 or not (math.isfinite(main) and math.isfinite(byo)):
            raise GtpFailure("syntax error: time settings must be non-negative")
        self.time_control = TimeControl(main, byo, stones)
        self.clock = {}
        return ""

    def cmd_time_left(self, args):
        self._want_args(args, 3, "time_left COLOR TIME STONES")
        color = parse_color(args[0])
        try:
            seconds, stones = float(args[1]), int(args[2])
        except ValueError:
            raise GtpFailure("syntax error: time_left wants a number and an integer") from None
        if seconds < 0 or stones < 0 or not math.isfinite(seconds):
            raise GtpFailure("syntax error: time left must be non-negative")
        if self.time_control is None:
            self.time_control = TimeControl(seconds, 0.0, 0)   # absolute time, as far as we know
        self.clock[color] = (seconds, stones)
        return ""


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GtpConfig:
    """Settings of `python -m selfplay.gtp` (see --help)."""

    root: str | None = root_setting(None, required=False, note="plays the run's latest published model, or "
                                                               "--generation (neither --root nor --model: the "
                                                               "uniform evaluator)")
    model: str | None = setting(None, "folder of one published model (ROOT/models/<generation>)")
    generation: int | None = setting(None, "with --root: this generation instead of the latest")
    visits: int | None = setting(200, "search simulations per move (0 = no visit limit, needs --seconds-per-move)")
    seconds_per_move: float | None = setting(None, "wall-clock limit per move; with --visits, whichever ends "
                                                   "first. time_settings/time_left can only shorten it")
    board_size: int = board_size_setting(note="until the controller's boardsize")
    komi: float = komi_setting(note="until the controller's komi")
    resign_threshold: float | None = setting(None, "answer genmove with 'resign' when the root value for us is "
                                                   "below this (e.g. -0.95; default: never resign)")
    resign_consecutive: int = setting(1, "...for this many of our consecutive moves (self-play's rule, "
                                         "selfplay.move_policy)")
    pass_when_winning: bool = pass_when_winning_setting()
    seed: int = setting(0, "seed of the search's random draws")
    quiet: bool = setting(False, "no per-move search line on stderr")

    def __post_init__(self):
        if self.visits == 0:
            object.__setattr__(self, "visits", None)      # 0 on the command line = no visit limit
        if self.root and self.model:
            raise ValueError("give --root or --model, not both")
        if self.generation is not None and not self.root:
            raise ValueError("--generation needs --root")
        if self.model:
            EvaluatorSource.from_model_dir(self.model)             # validates the path's shape
        for problem in setting_problems(self):           # root, board size, komi
            raise ValueError(problem)
        SearchBudget(self.visits, self.seconds_per_move)      # validates both
        MovePolicy(resign_threshold=self.resign_threshold, resign_consecutive=self.resign_consecutive)


CLI = RoleCli(
    GtpConfig, prog="python -m selfplay.gtp",
    description="zerolake as a GTP v2 engine on stdin/stdout (Sabaki, GoGui, gogui-twogtp). "
                "Without --root or --model the search uses the uniform evaluator.")


def evaluator_source(config: GtpConfig) -> EvaluatorSource:
    if config.model:
        return EvaluatorSource.from_model_dir(config.model)
    return EvaluatorSource(model_root=config.root, generation=config.generation)


def build_engine(config: GtpConfig, log: Callable[[str], None] | None = None, retry=None) -> GtpEngine:
    """The engine for `config`: loads the model (or the uniform evaluator) once;
    ``retry`` is the storage RetryPolicy for a gs:// root."""
    loaded = load_evaluator(evaluator_source(config), retry=retry)
    mcts = MctsConfig(budget=SearchBudget(config.visits, config.seconds_per_move),
                      moves=MovePolicy(resign_threshold=config.resign_threshold,
                                       resign_consecutive=config.resign_consecutive), seed=config.seed,
                      pass_when_winning=config.pass_when_winning)

    def player_for(board_size: int) -> MctsPlayer:
        return MctsPlayer(loaded.for_board_size(board_size), mcts, name=loaded.name)

    return GtpEngine(player_for, mcts.budget, board_size=loaded.board_size or config.board_size,
                     komi=config.komi if loaded.komi is None else loaded.komi, log=log)


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


def serve(engine: GtpEngine, stdin, stdout) -> None:
    """Answer commands from `stdin` (bytes) on `stdout` (text) until quit or EOF."""
    while True:
        raw = read_command_line(stdin)
        if raw is None:
            return
        if raw == b"":
            stdout.write(f"? command longer than {MAX_LINE_BYTES} bytes\n\n")
            stdout.flush()
            continue
        reply = engine.handle(raw.decode("utf-8", errors="replace"))
        if reply:
            stdout.write(reply)
            stdout.flush()
        if engine.quit_requested:
            return


def main(argv=None) -> int:
    config, retry = CLI.parse(argv)
    log = None if config.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    # A GUI or systemd stops an engine with SIGTERM: unwinding closes the player and,
    # at exit, removes the temporary copy of the model (format.registry.ModelCache).
    try:
        with terminated_by_sigterm():
            return _load_and_serve(config, log, retry)
    except Terminated:
        print("selfplay.gtp: stopped by SIGTERM", file=sys.stderr)
        return EXIT_TERMINATED


def _load_and_serve(config: GtpConfig, log, retry) -> int:
    from cloud.base import StorageError
    from format.registry import RegistryError

    try:
        engine = build_engine(config, log, retry)
    except (OSError, ValueError, LookupError, RegistryError, StorageError) as exc:
        print(f"selfplay.gtp: cannot load the model: {exc}", file=sys.stderr)
        return 2
    try:
        serve(engine, sys.stdin.buffer, sys.stdout)
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        engine.player.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
