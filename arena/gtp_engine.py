"""GTP's command table: `GtpEngine` answers one command line at a time and keeps the game.

`arena.gtp` (the entry point) reads lines and hands each to `GtpEngine.handle`,
which returns the reply text (or a `StreamingReply` for the analysis
commands, which `arena.gtp.serve` writes while the search runs).  The game
state is `arena.gtp_game`'s (setup, moves, board, clock); moves come from
`arena.player.MctsPlayer`; rules and scoring from `engine.board`; analysis
reports from `arena.gtp_analysis`; the referee commands (handicap,
final_status_list, loadsgf/printsgf) from `arena.gtp_referee`.

Protocol (GTP 2, sections 2-3): control characters other than tab and
newline are dropped, tabs become spaces, ``#`` starts a comment, blank lines
get no reply.  A command may start with a numeric id, echoed in the reply
(``12 genmove b`` -> ``=12 D4``).  A reply is ``= text`` or ``? message``
followed by one empty line.  Every failure, malformed input included, is a
``?`` reply.  Rules are the engine's: Tromp-Taylor area scoring, positional
superko, suicide illegal.  Beyond the spec's required set the engine answers
the commands referees, servers and GUIs send (the referee commands,
kgs-genmove_cleanup, reg_genmove, the lz-/kata- analysis commands); each
``cmd_*`` method's docstring says what it does.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

from arena.gtp_analysis import AnalysisRun, max_analysis_visits, parse_request, root_moves
from arena.gtp_game import (
    GtpFailure,
    Setup,
    TimeControl,
    board_for,
    board_to_text,
    format_score,
    move_time_allotment,
    parse_color,
)
from arena.gtp_referee import RefereeCommands
from arena.player import COLOR_NAMES, RESIGN, MctsPlayer, SearchBudget
from engine.board import Board, IllegalMove
from format import schema
from format.coords import gtp_to_move, move_to_gtp

ENGINE_NAME = "zerolake"
ENGINE_VERSION = "0.1"
PROTOCOL_VERSION = "2"
LEELA_ZERO_LEVEL = "0.17"
"""The Leela Zero release whose analysis commands (lz-analyze with avoid/allow,
lz-genmove_analyze) the engine speaks: the first word of the ``version``
reply, because Lizzie reads that word as a Leela Zero version (``MAJOR.MINOR``,
MINOR an integer of at least 15, else a modal dialog or a parse error)."""


@dataclasses.dataclass
class StreamingReply:
    """A reply written while its search runs (the analysis commands); `serve`
    drives it (`stream_reply`).

    On the wire: `head` ('=' and the command's id) alone on a line, a
    `report()` line every `interval` seconds (None: none) while `step()`
    searches one evaluator batch at a time (False once the search has
    ended), `finish()`'s text, then the empty line.  `stoppable`: the next
    input line ends it (lz-/kata-analyze); else it runs until its search
    ends (genmove_analyze)."""

    step: Callable[[], bool]
    report: Callable[[], str]
    finish: Callable[[], str]
    interval: float | None
    stoppable: bool
    head: str = "="


class GtpEngine(RefereeCommands):
    """GTP state machine: `handle(line)` returns the reply ('' for no reply).

    `player_factory(board_size)` makes the move chooser for a board size
    (raising ValueError when it can't play that size, e.g. a model trained
    on another size); `budget` is the per-move search budget.
    `cleanup_factory` makes the chooser of kgs-genmove_cleanup and of
    place_free_handicap's searched stones, one without the pass rule's early
    pass; None when the player has no pass rule (it is then used itself).
    `scorer`: the network's score estimate for kata-analyze's score fields
    (`arena.gtp_analysis.NetworkScore`; None: a model without one, no
    score fields)."""

    def __init__(
        self,
        player_factory: Callable[[int], MctsPlayer],
        budget: SearchBudget,
        board_size: int = schema.DEFAULT_BOARD_SIZE,
        komi: float = schema.DEFAULT_KOMI,
        log: Callable[[str], None] | None = None,
        cleanup_factory: Callable[[int], MctsPlayer] | None = None,
        scorer=None,
    ):
        self._player_factory = player_factory
        self.scorer = scorer
        self._cleanup_factory = cleanup_factory
        self._cleanup_player: MctsPlayer | None = None  # made on first use
        self.budget = budget
        self.log = log or (lambda text: None)
        self.komi = float(komi)
        self.size = board_size
        self.player = player_factory(board_size)
        self.setup: Setup | None = None  # handicap / loadsgf stones before the moves
        self.moves: list[tuple[int, int]] = []  # (colour, action) in order
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
            "final_status_list": self.cmd_final_status_list,
            "fixed_handicap": self.cmd_fixed_handicap,
            "place_free_handicap": self.cmd_place_free_handicap,
            "set_free_handicap": self.cmd_set_free_handicap,
            "loadsgf": self.cmd_loadsgf,
            "printsgf": self.cmd_printsgf,
            "kgs-genmove_cleanup": self.cmd_kgs_genmove_cleanup,
            "reg_genmove": self.cmd_reg_genmove,
            "lz-analyze": self.cmd_lz_analyze,
            "kata-analyze": self.cmd_kata_analyze,
            "lz-genmove_analyze": self.cmd_lz_genmove_analyze,
            "kata-genmove_analyze": self.cmd_kata_genmove_analyze,
        }

    # ---- protocol --------------------------------------------------------------

    @staticmethod
    def preprocess(line: str) -> str:
        """Spec 3.1: drop control characters but HT/LF, HT -> space, cut comments."""
        line = "".join(ch for ch in line if ch in "\t\n" or not (ord(ch) < 32 or ord(ch) == 127))
        line = line.replace("\t", " ")
        return line.split("#", 1)[0].strip()

    def handle(self, line: str) -> str | StreamingReply:
        """The full reply to one input line (ending in a blank line), or '';
        for an analysis command a `StreamingReply` for `serve` to drive."""
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
        if isinstance(text, StreamingReply):
            text.head = "=" + command_id
            return text
        # An empty line ends a reply, so a multi-line text must contain none
        # (its first line may be empty: it follows the '=' on the same line).
        first, *rest = str(text).split("\n")
        text = "\n".join([first] + [row for row in rest if row.strip()])
        head = ("=" if ok else "?") + command_id
        return f"{head} {text}\n\n" if text else f"{head}\n\n"

    # ---- state -----------------------------------------------------------------

    def _board_for(self, board: Board, color: int) -> Board:
        return board_for(board, color)

    def _replay(self, moves: list[tuple[int, int]]) -> Board:
        board = self._new_board()
        for color, move in moves:
            board = board_for(board, color)
            board.play(move)
        return board

    def _reset(self, size: int | None = None, komi: float | None = None) -> None:
        """A new game: no setup stones, no moves; `size` and `komi` when given.
        Fails (changing nothing) when the player can't play `size`."""
        if size is not None and size != self.size:
            try:
                player = self._player_factory(size)
            except ValueError as exc:
                raise GtpFailure(f"unacceptable size: {exc}") from None
            self.player.close()
            if self._cleanup_player is not None:
                self._cleanup_player.close()
                self._cleanup_player = None
            self.player, self.size = player, size
        if komi is not None:
            self.komi = komi
        self.setup = None
        self.moves = []
        self.clock = {}
        self.board = self._new_board()
        for chooser in (self.player, self._cleanup_player):
            if chooser is not None:
                chooser.start_game(self.size, self.komi)

    def _cleanup(self) -> MctsPlayer:
        """The chooser without the pass rule (the player itself if it has none)."""
        if self._cleanup_factory is None:
            return self.player
        if self._cleanup_player is None:
            self._cleanup_player = self._cleanup_factory(self.size)
            self._cleanup_player.start_game(self.size, self.komi)
        return self._cleanup_player

    def close(self) -> None:
        self.player.close()
        if self._cleanup_player is not None:
            self._cleanup_player.close()

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
        """``0.17 (zerolake 0.1, model-g3; ...)``: the first word is `LEELA_ZERO_LEVEL` for
        Lizzie, the rest says what the engine is."""
        return (
            f"{LEELA_ZERO_LEVEL} ({ENGINE_NAME} {ENGINE_VERSION}, {self.player.name}; "
            f"speaks Leela Zero {LEELA_ZERO_LEVEL}'s analysis commands)"
        )

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
        """``play COLOR VERTEX``; a colour that is not the side to move, or a move
        after the game's end, re-enters the stones as a fresh position
        (`arena.gtp_game.board_for`); the move list is kept, so undo works."""
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

    def cmd_genmove(self, args, name="genmove", player=None, play=True):
        self._want_args(args, 1, f"{name} COLOR")
        color = parse_color(args[0])
        player = player or self.player
        board = self._board_for(self.board, color)
        started = time.monotonic()
        move = player.select_move(board, self._move_budget(color))
        return self._searched_move(name, color, move, player, started, play)

    def _searched_move(
        self, name: str, color: int, move: int, player: MctsPlayer, started: float, play: bool = True
    ) -> str:
        """Log a finished genmove search, play its move (unless `play` is
        False or it resigns) and return the move's GTP text."""
        values = getattr(player, "last_root_values", None) or [float("nan")]
        visits = getattr(player, "last_visits", None) or [0]
        self.log(
            f"{name} {COLOR_NAMES[color]}: {'resign' if move == RESIGN else move_to_gtp(move, self.size)} "
            f"visits={visits[0]} value={values[0]:+.3f} seconds={time.monotonic() - started:.2f}"
        )
        if move == RESIGN:
            return "resign"
        if play:
            self._play(color, move)
        return move_to_gtp(move, self.size)

    def cmd_kgs_genmove_cleanup(self, args):
        """genmove without the pass rule's early pass (``--pass-when-winning``):
        it passes only when every other move would fill its own eye, so dead
        stones get captured before the game ends."""
        return self.cmd_genmove(args, "kgs-genmove_cleanup", player=self._cleanup())

    def cmd_reg_genmove(self, args):
        """The move genmove would choose, not played."""
        # The search's tree moves on to the chosen move; the next genmove sees
        # a position that does not continue it and starts a fresh tree.
        return self.cmd_genmove(args, "reg_genmove", play=False)

    # ---- live analysis (the report lines: arena/gtp_analysis.py) ---------------

    def cmd_lz_analyze(self, args):
        """``lz-analyze [COLOR] [INTERVAL] [KEY VALUE]...``: search the position
        for COLOR (default: the side to move; another colour re-enters the
        stones, as for play) and report every INTERVAL centiseconds until the
        next input line, a bare newline included (Sabaki's stop), which is then
        answered as a command.  The tree is kept: analysing the same position
        again, or the one after the next move, goes on from it; it stops
        growing at `gtp_analysis.max_analysis_visits` root visits.  With
        ``avoid``/``allow`` (Lizzie's) the root's moves are restricted
        (`gtp_analysis.root_moves`) in a fresh tree, which is not kept."""
        return self._analyze(args, kata=False)

    def cmd_kata_analyze(self, args):
        """lz-analyze with KataGo's report lines (``ownership``, ``pvVisits``)."""
        return self._analyze(args, kata=True)

    def cmd_lz_genmove_analyze(self, args):
        """genmove with lz-analyze's reports while it searches, within genmove's
        budget; input does not stop it (it waits, as KataGo documents).  The
        reply ends with ``play VERTEX`` (or ``play resign``), and the move is
        played."""
        return self._genmove_analyze(args, kata=False)

    def cmd_kata_genmove_analyze(self, args):
        """lz-genmove_analyze with KataGo's report lines."""
        return self._genmove_analyze(args, kata=True)

    def _analysis_position(self, args, kata: bool):
        try:
            request = parse_request(args, kata, self.size)
        except ValueError as exc:
            raise GtpFailure(f"syntax error: {exc}") from None
        color = self.board.to_play if request.color is None else request.color
        return request, color, self._board_for(self.board, color)

    def _analyze(self, args, kata: bool) -> StreamingReply:
        """Search until the next input line, reporting every interval."""
        request, color, board = self._analysis_position(args, kata)
        moves = None
        if not board.is_over:
            moves = root_moves(request, color, board.candidate_mask(True, self.player.config.pass_when_winning))
        steps = self.player.analysis_steps(board, max_analysis_visits(self.size), root_moves=moves)
        run = AnalysisRun(steps, board, request, self.scorer)
        return StreamingReply(
            step=run.step, report=run.report, finish=lambda: "", interval=request.interval, stoppable=True
        )

    def _genmove_analyze(self, args, kata: bool) -> StreamingReply:
        """genmove with reports; the reply ends with 'play VERTEX'."""
        request, color, board = self._analysis_position(args, kata)
        if request.avoid or request.allow:
            raise GtpFailure("syntax error: avoid/allow are for lz-analyze and kata-analyze, not genmove")
        started = time.monotonic()
        run = AnalysisRun(self.player.select_move_steps(board, self._move_budget(color)), board, request, self.scorer)
        name = "kata-genmove_analyze" if kata else "lz-genmove_analyze"

        def finish() -> str:
            if run.result is None:
                raise RuntimeError(f"{name}: the search ended without choosing a move")
            return "play " + self._searched_move(name, color, run.result, self.player, started)

        return StreamingReply(
            step=run.step, report=run.report, finish=finish, interval=request.interval, stoppable=False
        )

    def _move_budget(self, color: int) -> SearchBudget:
        if self.time_control is None:
            return self.budget
        remaining, stones = self.clock.get(color, (None, None))
        allotment = move_time_allotment(self.time_control, remaining, stones, self.size, self.board.move_number)
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
        """Tromp-Taylor area score of the board as it stands, from Black's side."""
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
            self.time_control = TimeControl(seconds, 0.0, 0)  # absolute time, as far as we know
        self.clock[color] = (seconds, stones)
        return ""
