"""The GTP commands referees and servers send: handicap stones, final_status_list, loadsgf and printsgf.

`RefereeCommands` is a part of `arena.gtp_engine.GtpEngine` (its base
class), kept apart because these commands set up or read out a whole game
rather than play it: they read and replace the engine's game state
(``size``, ``komi``, ``setup``, ``moves``, ``board``; arena/gtp_game.py) and
answer through the same protocol (`GtpFailure` for a ``?`` reply).

Data flows: the handicap commands put Black setup stones on an empty board
(`arena.gtp_game.fixed_handicap_points`, or the search's choice) with White
to move; loadsgf reads a file through `format.sgf.read_sgf_file` and replays
it through the engine's rules before replacing the game; printsgf writes the
game through `format.sgf.write_sgf` (to a file: `write_sgf_file`; both refuse
a FIFO or device, whose open() would block the engine); final_status_list
lists the board's chains (`engine.board.Board.chains`) by
`engine.playouts.stone_statuses`' verdicts.  Points are flat actions (``row * N + col``, row 0 on top); GTP
vertices are converted by `format.coords`.
"""

from __future__ import annotations

import math

import numpy as np

from arena.gtp_game import GtpFailure, Setup, board_for, fixed_handicap_points, new_board
from arena.player import RESIGN
from engine.board import Board, IllegalMove
from engine.playouts import STATUS_ALIVE, STATUS_DEAD, STATUS_SEKI, stone_statuses
from format import schema
from format.coords import gtp_to_move, move_to_gtp
from format.sgf import read_sgf_file, write_sgf, write_sgf_file

STATUS_NAMES = {"alive": STATUS_ALIVE, "dead": STATUS_DEAD, "seki": STATUS_SEKI}
"""final_status_list's words -> `engine.playouts.stone_statuses`' verdicts."""


class RefereeCommands:
    """The referee commands of `arena.gtp_engine.GtpEngine` (see the module docstring)."""

    # The game state these commands read and set; `arena.gtp_engine.GtpEngine` owns it (its __init__).
    size: int
    komi: float
    setup: Setup | None  # handicap / loadsgf stones before the moves
    moves: list[tuple[int, int]]  # (colour, action) in order
    board: Board

    def _new_board(self) -> Board:
        return new_board(self.size, self.komi, self.setup)

    def cmd_final_status_list(self, args):
        """``final_status_list alive|dead|seki``: one chain per line, as
        `engine.playouts.stone_statuses` judges them (seki by the rules, dead
        by random playouts; alive is every other stone).  final_score stays
        Tromp-Taylor on the board as it stands, where every stone counts: a
        controller that removes dead stones scores them itself, and
        kgs-genmove_cleanup plays them out."""
        self._want_args(args, 1, "final_status_list alive|dead|seki")
        wanted = STATUS_NAMES.get(args[0].lower())
        if wanted is None:
            raise GtpFailure(f"syntax error: status {args[0]!r} is not alive, dead or seki")
        status = stone_statuses(self.board)
        lines = [
            " ".join(move_to_gtp(p, self.size) for p in chain)
            for chain in self.board.chains()
            if status[chain[0]] == wanted
        ]
        return "\n".join(lines)

    def _place_handicap(self, points: list[int]) -> str:
        stones = np.zeros(self.size * self.size, np.int8)
        stones[points] = schema.BLACK
        self.setup = Setup(stones, schema.WHITE)
        self.moves = []
        self.board = self._new_board()
        return " ".join(move_to_gtp(p, self.size) for p in sorted(points))

    def _handicap_count(self, args, usage):
        self._want_args(args, 1, usage)
        if self.board.stones().any():
            raise GtpFailure("board not empty")
        try:
            return int(args[0])
        except ValueError:
            raise GtpFailure(f"syntax error: number of stones {args[0]!r} is not an integer") from None

    def cmd_fixed_handicap(self, args):
        """``fixed_handicap N``: GNU Go's points (`fixed_handicap_points`).  The
        handicap commands need an empty board and make the stones setup stones
        (not moves: undo stops at them), with White to move."""
        count = self._handicap_count(args, "fixed_handicap NUMBER_OF_STONES")
        points = fixed_handicap_points(self.size, count)
        if points is None:
            raise GtpFailure("invalid number of stones")
        return self._place_handicap(points)

    def cmd_place_free_handicap(self, args):
        """``place_free_handicap N`` (2 up to the board's points less one): the
        fixed points as far as they go, then the search's choice (without the
        pass rule) for the rest, stopping early if it would pass."""
        count = self._handicap_count(args, "place_free_handicap NUMBER_OF_STONES")
        if not 2 <= count < self.size * self.size:
            raise GtpFailure("invalid number of stones")
        points: list[int] = []
        for fixed in range(count, 1, -1):  # the most fixed points that fit
            points = fixed_handicap_points(self.size, fixed) or []
            if points:
                break
        # The rest: Black's searched moves on the stones so far; a pass (or a
        # resignation) means more stones would not help, which the spec allows.
        chooser = self._cleanup()
        stones = np.zeros(self.size * self.size, np.int8)
        stones[points] = schema.BLACK
        while len(points) < count:
            board = new_board(self.size, self.komi, Setup(stones, schema.BLACK))
            move = chooser.select_move(board, self.budget)
            if move == RESIGN or move == self.size * self.size:
                break
            points.append(move)
            stones[move] = schema.BLACK
        return self._place_handicap(points)

    def cmd_set_free_handicap(self, args):
        """``set_free_handicap V...``: the controller's points (2 up to the board's
        points less one, no pass, none twice; else ``bad vertex list``)."""
        if self.board.stones().any():
            raise GtpFailure("board not empty")
        try:
            points = [gtp_to_move(vertex, self.size) for vertex in args]
        except ValueError:
            points = []
        if (
            not 2 <= len(points) < self.size * self.size
            or len(set(points)) != len(points)
            or self.size * self.size in points
        ):
            raise GtpFailure("bad vertex list")
        self._place_handicap(points)
        return ""

    def cmd_loadsgf(self, args):
        """``loadsgf FILE [MOVE_NUMBER]``: a game read by `format.sgf.read_sgf_file`
        (main line, setup stones, then moves numbered from 1), replayed through
        the rules up to the position before MOVE_NUMBER; board size and komi
        come from the file.  Any failure leaves the engine's game as it was."""
        if len(args) not in (1, 2):
            raise GtpFailure("syntax error: usage: loadsgf FILE [MOVE_NUMBER]")
        path = args[0]
        stop = None
        if len(args) == 2:
            try:
                stop = int(args[1])
            except ValueError:
                stop = 0
            if stop < 1:
                raise GtpFailure(f"syntax error: move number {args[1]!r} is not a positive integer")
        try:
            game = read_sgf_file(path)
        except OSError as exc:
            raise GtpFailure(f"cannot load {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise GtpFailure(f"cannot load {path}: {str(exc) or 'malformed SGF'}") from None
        size, komi, moves = game.size, self.komi if game.komi is None else game.komi, game.moves
        setup = None if game.setup is None else Setup(game.setup, game.to_play)
        if not math.isfinite(komi) or abs(komi) > schema.MAX_KOMI:
            raise GtpFailure(f"cannot load {path}: komi {komi} is out of range")
        if stop is not None:
            moves = moves[: stop - 1]  # the position before move `stop`
        # Replay on boards of our own before touching the engine's game, so a
        # bad file leaves it as it was.
        try:
            board = new_board(size, komi, setup)
        except ValueError as exc:
            raise GtpFailure(f"cannot load {path}: setup stones: {exc}") from None
        for number, (color, move) in enumerate(moves, 1):
            board = board_for(board, color)
            try:
                board.play(move)
            except IllegalMove as exc:
                colour = "B" if color == schema.BLACK else "W"
                raise GtpFailure(
                    f"illegal move in {path} at move {number} ({colour} {move_to_gtp(move, size)}: {exc.reason})"
                ) from None
        self._reset(size, komi)
        self.setup, self.moves, self.board = setup, list(moves), board
        return ""

    def cmd_printsgf(self, args):
        """``printsgf [FILE]``: the game (size, komi, setup stones, moves) as SGF
        (`format.sgf.write_sgf`), in the reply or to FILE."""
        if len(args) > 1:
            raise GtpFailure("syntax error: usage: printsgf [FILE]")
        setup = self.setup
        data = write_sgf(
            self.size,
            self.komi,
            self.moves,
            setup=None if setup is None else setup.stones,
            to_play=schema.BLACK if setup is None else setup.to_play,
        )
        if not args:
            return data.decode("utf-8").strip()
        try:
            write_sgf_file(args[0], data)
        except OSError as exc:
            raise GtpFailure(f"cannot write {args[0]}: {exc.strerror or exc}") from None
        except ValueError as exc:  # a FIFO or device: refused before opening (it would block for ever)
            raise GtpFailure(f"cannot write {args[0]}: {exc}") from None
        return ""
