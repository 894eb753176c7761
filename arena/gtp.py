"""A GTP version 2 engine on stdin/stdout, for Sabaki, GoGui and gogui-twogtp.

    python -m arena.gtp --root ROOT [--generation G]   # a run's published model
    python -m arena.gtp --model PATH                    # one published model folder
    python -m arena.gtp                                  # no model: uniform evaluator

Moves come from `arena.player.MctsPlayer` (the project's batched Cython
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

The commands referees and servers send (beyond the spec's required set):

* ``fixed_handicap N`` places GNU Go's (the GTP reference implementation's)
  points: 2..4 stones on 7x7 and even sizes from 8, 2..9 on odd sizes from 9,
  on the 3rd line up to 11x11 and the 4th from 12x12; ``place_free_handicap N``
  (2 up to the board's points less one) takes those points as far as they go
  and lets the search (without the pass rule) choose the rest, stopping early
  if it would pass;
  ``set_free_handicap V...`` takes the controller's.  All three need an empty
  board, fail with ``board not empty``, ``invalid number of stones`` or ``bad
  vertex list``, and make the stones setup stones (not moves: ``undo`` stops
  at them), with White to move; komi stays the controller's.
* ``final_status_list alive|dead|seki`` lists one chain per line, judged by
  `stone_statuses`, the one judge of life and death: a chain is in seki when
  it touches a *seki point*, an empty point that Tromp-Taylor leaves neutral
  and where neither colour can play without suicide or leaving the played
  chain in atari (shared liberties; dame between living walls are not); it
  is dead when random playouts from the stones (`DEAD_STONE_PLAYOUTS`) give
  its points to the other colour more often than to its own, which is what
  a referee asks (GNU Go agrees on the closing match's games:
  bench/final_status.py); ``alive`` is every other stone.  ``final_score``
  stays the engine's rules, Tromp-Taylor on the board as it stands, where
  every stone counts (so the pass rule can never pass away stones): a
  controller that removes the dead stones scores them itself, and
  ``kgs-genmove_cleanup`` plays them out.
* ``loadsgf FILE [MOVE_NUMBER]`` reads a regular file of at most
  MAX_SGF_BYTES through sgfmill (main line; setup stones AB/AW/AE before the
  first move, then moves numbered from 1, replayed through the engine's rules
  up to the position before MOVE_NUMBER); board size and komi come from the
  file.  Any failure leaves the engine's game as it was.  ``printsgf [FILE]``
  writes the game (size, komi, setup stones, moves) as SGF, in the reply or
  to FILE.
* ``kgs-genmove_cleanup COLOR`` is genmove without the pass rule's early
  pass (``--pass-when-winning``): it passes only when every other move would
  fill its own eye, so dead stones get captured before the game ends.
  ``reg_genmove COLOR`` answers the move genmove would choose without playing
  it.

Live analysis, for Sabaki and Lizzie (Leela Zero's and KataGo's extensions;
arena/gtp_analysis.py writes the lines):

* ``lz-analyze [COLOR] [INTERVAL] [KEY VALUE]...`` and ``kata-analyze`` (same
  arguments) search the position for COLOR (default: the side to move;
  another colour re-enters the stones as a fresh position, as for ``play``)
  and report every INTERVAL centiseconds (also ``interval N``; 0 or none: no
  reports, as Leela Zero).  ``maxmoves N`` caps the moves per report;
  kata-analyze also takes ``ownership true`` and ``pvVisits true``; any
  other key is a syntax error.  The reply is ``=`` (with the id: ``=12``)
  alone on a line, then one line per report, then the empty line.  A report
  line holds one block per move with visits, most visited first::

      info move D4 visits 31 winrate 5210 prior 1204 lcb 4903 order 0 pv D4 E5 E4 info move ...

  for lz-analyze (winrate, prior and lcb: integers in 0..10000), and for
  kata-analyze ``info move D4 visits 31 utility 0.042000 winrate 0.521000
  scoreMean S scoreStdev 0.000000 scoreLead S prior 0.120400 lcb 0.490300
  utilityLcb -0.019400 order 0 pv D4 E5 E4 [pvVisits 31 12 5]`` (winrate,
  prior, lcb in [0, 1] with a decimal point; utility, utilityLcb in
  [-1, 1]), then, with ``ownership true``, ``ownership`` and N*N values in
  [-1, 1], row-major from the top left (A19 .. T1).  All values are for
  COLOR: ``winrate`` is (Q + 1) / 2 of the move's mean value Q,
  ``utility`` is Q itself, ``lcb`` Wilson's lower bound on the win rate
  over the move's visits (the search keeps no per-move variance;
  `gtp_analysis.winrate_lcb`), ``utilityLcb`` = 2 lcb - 1; ``order`` 0 is
  the move genmove would play; ``pv`` follows the most visited child while
  it has visits (at most PV_MAX_MOVES moves), every move legal in turn from
  the position; a move's visits are one more than the sum of its
  children's (its own first evaluation), so ``pvVisits`` strictly falls.
  The search has no score or ownership estimate yet (the network's heads
  are not read by the evaluators), so both come from the rules, exactly:
  ``scoreLead`` = ``scoreMean`` is the Tromp-Taylor area score, for COLOR,
  of the board right after the move, as it stands (so ``scoreStdev`` is 0),
  and ``ownership`` is the Tromp-Taylor ownership of the board as it stands
  (`Board.ownership`, the owner ``final_score`` reads), +1 for COLOR.  The search runs between reports and stops at the
  next input line, a bare newline included (Sabaki's stop); the reply ends
  with its empty line, then that line is answered as a command (a bare
  newline or a comment gets no reply).  The input is read by its own thread
  and checked between two evaluator batches, so the next command is
  answered within about one batch's time.  Without a visit limit a search
  would grow its tree forever: it stops at
  `gtp_analysis.max_analysis_visits` root visits (ANALYSIS_MAX_NODES tree
  nodes) and the reports go on, unchanged, until stopped.  The tree is kept:
  analysing the same position again, or the position after the next move,
  goes on from it.
* ``lz-genmove_analyze [COLOR] [INTERVAL] [KEY VALUE]...`` and
  ``kata-genmove_analyze`` are genmove (COLOR defaults to the side to move)
  with the reports above while it searches, within genmove's budget; input
  does not stop them (it waits, as KataGo documents).  The reply ends with
  ``play VERTEX`` (or ``play resign``) on its own line, and the move is
  played.
"""
from __future__ import annotations

import dataclasses
import math
import os
import queue
import stat
import sys
import threading
import time
from typing import Callable

import numpy as np
from sgfmill import sgf

from format.cli import (RoleCli, board_size_setting, komi_setting, pass_when_winning_setting, root_setting,
                        setting, setting_problems)
from format import schema
from engine.board import Board, IllegalMove
from engine.playouts import playout_ownership
from format.coords import GTP_COLUMNS, gtp_to_move, move_to_gtp
from engine.move_choice import MovePolicy
from processes.sigterm import EXIT_TERMINATED, Terminated, terminated_by_sigterm
from inference.loading import EvaluatorSource, load_evaluator
from arena.player import COLOR_NAMES, RESIGN, MctsConfig, MctsPlayer, SearchBudget
from arena.gtp_analysis import AnalysisRun, max_analysis_visits, parse_request

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

MAX_SGF_BYTES = 1_000_000
"""Largest file loadsgf reads (a 19x19 game is a few kilobytes); a bigger
one, or a pipe or device, is refused before parsing."""


class GtpFailure(Exception):
    """A command failed; the message is the text of the '?' reply."""


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


# --------------------------------------------------------------------------
# the game's start: empty, or setup stones (handicap, loadsgf's AB/AW)
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Setup:
    """Stones on the board before the first move: flat int8 [N*N] (+1/-1/0),
    and the colour to move after them (White after a handicap)."""

    stones: np.ndarray
    to_play: int


def new_board(size: int, komi: float, setup: Setup | None = None) -> Board:
    """The board at the game's start, with the engine's move cap."""
    board = Board(size, komi, MAX_MOVES_PER_POINT * size * size)
    if setup is not None:
        board.set_position(setup.stones.reshape(size, size), setup.to_play)
    return board


def board_for(board: Board, color: int) -> Board:
    """`board` itself when `color` is to move and the game goes on; else the
    same stones as a fresh position with `color` to move."""
    if board.to_play == color and not board.is_over:
        return board
    fresh = new_board(board.size, board.komi)
    fresh.set_position(board.stones(), color)
    return fresh


def fixed_handicap_points(size: int, count: int) -> list[int] | None:
    """Flat points of GNU Go's fixed handicap placement (the GTP reference
    implementation's), in GTP order (top row first), or None when `count` is
    not placeable on `size`: 2..9 on odd sizes from 9, 2..4 on 7x7 and even
    sizes from 8."""
    most = 9 if size >= 9 and size % 2 == 1 else (4 if size >= 7 else 0)
    if not 2 <= count <= most:
        return None
    near = 3 if size >= 12 else 2          # 4th line from 12x12 up, else the 3rd
    far, mid = size - 1 - near, size // 2
    spots = [(near, far), (far, near)]      # upper right, lower left
    if count >= 3:
        spots.append((near, near))
    if count >= 4:
        spots.append((far, far))
    if count >= 6:
        spots += [(mid, near), (mid, far)]
    if count >= 8:
        spots += [(near, mid), (far, mid)]
    if count % 2 == 1 and count >= 5:
        spots.append((mid, mid))
    return sorted(row * size + col for row, col in spots)


# --------------------------------------------------------------------------
# which stones are alive, dead, in seki
# --------------------------------------------------------------------------

STATUS_ALIVE, STATUS_DEAD, STATUS_SEKI = 1, 2, 3
STATUS_NAMES = {"alive": STATUS_ALIVE, "dead": STATUS_DEAD, "seki": STATUS_SEKI}


def neighbours(point: int, size: int) -> list[int]:
    row, col = divmod(point, size)
    return [point + d for ok, d in ((row > 0, -size), (col > 0, -1), (col < size - 1, 1), (row < size - 1, size))
            if ok]


def chains(stones: np.ndarray, size: int) -> list[list[int]]:
    """The chains of flat `stones` [N*N], each a sorted list of points, in
    order of their first point (GTP order: top row first)."""
    chain_of: dict[int, int] = {}
    found = []
    for start in range(size * size):
        if stones[start] == 0 or start in chain_of:
            continue
        members, stack = [], [start]
        chain_of[start] = len(found)
        while stack:
            point = stack.pop()
            members.append(point)
            for n in neighbours(point, size):
                if stones[n] == stones[start] and n not in chain_of:
                    chain_of[n] = len(found)
                    stack.append(n)
        found.append(sorted(members))
    return found


def _can_fill(stones: np.ndarray, size: int, point: int, color: int) -> bool:
    """`color` may play the empty `point` and keep two liberties there (the
    engine's own rules on a probe board)."""
    probe = Board(size, 0.0, 1)
    probe.set_position(stones.reshape(size, size), color)
    if not probe.is_legal(point):
        return False
    probe.play(point)
    return probe.liberties(point) >= 2


DEAD_STONE_PLAYOUTS = 400
"""Random playouts behind `stone_statuses`' judgement of dead chains: the
playout ownership's standard error is at most 1/sqrt(400) = 0.05 a point,
so a chain the playouts split near evenly is the only one whose verdict a
seed can flip.  Playouts from a finished position are short: bench/final_status.py
judges a 9x9 position in 2.3 ms, loadsgf included."""


def stone_statuses(board: Board, playouts: int = DEAD_STONE_PLAYOUTS, seed: int = 0) -> np.ndarray:
    """Per point [N*N]: 0 (empty) or STATUS_ALIVE / STATUS_DEAD / STATUS_SEKI.

    The one judge of which stones are dead (``final_status_list``; the
    kata-analyze ownership and ``final_score`` stay the rules' Tromp-Taylor
    count of the board as it stands, which counts every stone).  Seki first:
    a chain touching a *seki point*, an empty point Tromp-Taylor leaves
    neutral and where neither colour can play without suicide or leaving the
    played chain in atari (see the module docstring).  Then dead: a chain
    whose points the random playouts of `engine.playouts.playout_ownership`
    (the shuffle job's ownership of a resigned game) give to the other
    colour more often than to its own, on average over the chain.  The
    playouts start from the stones alone, with ``board``'s side to move, so
    a finished game (two passes) is played on: a dead chain is captured in
    most of them, a chain with two eyes never, and a group that can still
    make life or be killed goes the way the playouts mostly take it.
    Deterministic for a given ``seed``."""
    size = board.size
    stones = board.stones().reshape(-1).astype(np.int8)
    owner = board.ownership()
    status = np.zeros(size * size, np.int8)
    status[stones != 0] = STATUS_ALIVE
    seki_points = [p for p in range(size * size)
                   if stones[p] == 0 and owner[p] == 0
                   and any(stones[n] != 0 for n in neighbours(p, size))
                   and not _can_fill(stones, size, p, schema.BLACK)
                   and not _can_fill(stones, size, p, schema.WHITE)]
    touching = {n for p in seki_points for n in neighbours(p, size)}
    living = []
    for chain in chains(stones, size):
        if touching.intersection(chain):
            status[chain] = STATUS_SEKI
        else:
            living.append(chain)
    if living:
        fresh = Board(size, board.komi)
        fresh.set_position(stones.reshape(size, size), board.to_play)
        expected = playout_ownership(fresh, playouts, seed)
        for chain in living:
            colour = stones[chain[0]]
            if float(np.mean(expected[chain])) * colour < 0:
                status[chain] = STATUS_DEAD
    return status


# --------------------------------------------------------------------------
# SGF through sgfmill (format/sgf.py takes plain games only; these carry setup
# stones and moves of either colour, as GTP allows)
# --------------------------------------------------------------------------

def _sgf_point(move: int, size: int):
    """Flat point -> sgfmill's (row from the bottom, col); None for a pass."""
    return None if move == size * size else (size - 1 - move // size, move % size)


def game_record_sgf(size: int, komi: float, setup: Setup | None, moves: list[tuple[int, int]]) -> bytes:
    """The game as SGF bytes: SZ, KM, RU, setup stones (AB/AW, with HA and
    PL for a handicap), then one node per (colour, move)."""
    game = sgf.Sgf_game(size=size)
    root = game.get_root()
    root.set("KM", float(komi))
    root.set("RU", "Chinese")
    if setup is not None:
        flat = setup.stones.reshape(-1)
        black = {_sgf_point(int(p), size) for p in np.flatnonzero(flat == schema.BLACK)}
        white = {_sgf_point(int(p), size) for p in np.flatnonzero(flat == schema.WHITE)}
        root.set_setup_stones(black, white)
        if black and not white and setup.to_play == schema.WHITE:
            root.set("HA", len(black))
        root.set("PL", "b" if setup.to_play == schema.BLACK else "w")
    for color, move in moves:
        game.extend_main_sequence().set_move("b" if color == schema.BLACK else "w", _sgf_point(move, size))
    return game.serialise()


def read_bounded(path: str, limit: int = MAX_SGF_BYTES) -> bytes:
    """The bytes of regular file `path` if it holds at most `limit`; raises
    ValueError (or OSError) naming the problem."""
    with open(path, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ValueError("not a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data


def parse_sgf_game(data: bytes) -> tuple[int, float | None, Setup | None, list[tuple[int, int]]]:
    """(size, komi or None, setup or None, [(colour, move)]) of an SGF game's
    main line; raises ValueError naming what is wrong.  Setup stones are
    taken from the nodes before the first move; later ones are refused."""
    game = sgf.Sgf_game.from_bytes(data)
    size = game.get_size()
    if not schema.MIN_BOARD_SIZE <= size <= schema.MAX_BOARD_SIZE:
        raise ValueError(f"board size {size} is outside {schema.MIN_BOARD_SIZE}..{schema.MAX_BOARD_SIZE}")
    root = game.get_root()
    if root.has_property("GM") and root.get("GM") != 1:
        raise ValueError(f"GM[{root.get('GM')}] is not a game of Go")
    komi = game.get_komi() if root.has_property("KM") else None
    stones = np.zeros(size * size, np.int8)
    has_setup = False
    moves: list[tuple[int, int]] = []
    for number, node in enumerate(game.get_main_sequence()):
        try:
            if node.has_setup_stones():
                if moves:
                    raise ValueError("setup stones after the first move")
                has_setup = True
                for value, points in zip((schema.BLACK, schema.WHITE, schema.EMPTY), node.get_setup_stones()):
                    for row, col in points:
                        stones[(size - 1 - row) * size + col] = value
            colour, point = node.get_move()
        except ValueError as exc:
            raise ValueError(f"node {number}: {exc}" if str(exc) else f"node {number}: malformed property") from None
        if colour is None:
            continue
        color = schema.BLACK if colour == "b" else schema.WHITE
        moves.append((color, size * size if point is None else (size - 1 - point[0]) * size + point[1]))
    setup = None
    if has_setup:
        if root.has_property("PL"):
            try:
                to_play = schema.BLACK if root.get("PL") == "b" else schema.WHITE
            except ValueError:
                raise ValueError("malformed PL property") from None
        else:   # a handicap (Black stones only): White moves first
            to_play = schema.WHITE if stones.any() and not (stones == schema.WHITE).any() else schema.BLACK
        setup = Setup(stones, to_play)
    return size, komi, setup, moves


class GtpEngine:
    """GTP state machine: `handle(line)` returns the reply ('' for no reply).

    `player_factory(board_size)` makes the move chooser for a board size
    (raising ValueError when it can't play that size, e.g. a model trained
    on another size); `budget` is the per-move search budget.
    `cleanup_factory` makes the chooser of kgs-genmove_cleanup and of
    place_free_handicap's searched stones, one without the pass rule's early
    pass; None when the player has no pass rule (it is then used itself)."""

    def __init__(self, player_factory: Callable[[int], MctsPlayer], budget: SearchBudget,
                 board_size: int = schema.DEFAULT_BOARD_SIZE, komi: float = schema.DEFAULT_KOMI, log: Callable[[str], None] | None = None,
                 cleanup_factory: Callable[[int], MctsPlayer] | None = None):
        self._player_factory = player_factory
        self._cleanup_factory = cleanup_factory
        self._cleanup_player: MctsPlayer | None = None     # made on first use
        self.budget = budget
        self.log = log or (lambda text: None)
        self.komi = float(komi)
        self.size = board_size
        self.player = player_factory(board_size)
        self.setup: Setup | None = None              # handicap / loadsgf stones before the moves
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

    def _new_board(self) -> Board:
        return new_board(self.size, self.komi, self.setup)

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
        for player in (self.player, self._cleanup_player):
            if player is not None:
                player.start_game(self.size, self.komi)

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

    def cmd_genmove(self, args, name="genmove", player=None, play=True):
        self._want_args(args, 1, f"{name} COLOR")
        color = parse_color(args[0])
        player = player or self.player
        board = self._board_for(self.board, color)
        started = time.monotonic()
        move = player.select_move(board, self._move_budget(color))
        return self._searched_move(name, color, move, player, started, play)

    def _searched_move(self, name: str, color: int, move: int, player: MctsPlayer, started: float,
                       play: bool = True) -> str:
        """Log a finished genmove search, play its move (unless `play` is
        False or it resigns) and return the move's GTP text."""
        values = getattr(player, "last_root_values", None) or [float("nan")]
        visits = getattr(player, "last_visits", None) or [0]
        self.log(f"{name} {COLOR_NAMES[color]}: {'resign' if move == RESIGN else move_to_gtp(move, self.size)} "
                 f"visits={visits[0]} value={values[0]:+.3f} seconds={time.monotonic() - started:.2f}")
        if move == RESIGN:
            return "resign"
        if play:
            self._play(color, move)
        return move_to_gtp(move, self.size)

    def cmd_kgs_genmove_cleanup(self, args):
        return self.cmd_genmove(args, "kgs-genmove_cleanup", player=self._cleanup())

    def cmd_reg_genmove(self, args):
        # The search's tree moves on to the chosen move; the next genmove sees
        # a position that does not continue it and starts a fresh tree.
        return self.cmd_genmove(args, "reg_genmove", play=False)

    # ---- live analysis (module docstring; arena/gtp_analysis.py) -----------------

    def cmd_lz_analyze(self, args):
        return self._analyze(args, kata=False)

    def cmd_kata_analyze(self, args):
        return self._analyze(args, kata=True)

    def cmd_lz_genmove_analyze(self, args):
        return self._genmove_analyze(args, kata=False)

    def cmd_kata_genmove_analyze(self, args):
        return self._genmove_analyze(args, kata=True)

    def _analysis_position(self, args, kata: bool):
        try:
            request = parse_request(args, kata)
        except ValueError as exc:
            raise GtpFailure(f"syntax error: {exc}") from None
        color = self.board.to_play if request.color is None else request.color
        return request, color, self._board_for(self.board, color)

    def _analyze(self, args, kata: bool) -> StreamingReply:
        """Search until the next input line, reporting every interval."""
        request, _, board = self._analysis_position(args, kata)
        run = AnalysisRun(self.player.analysis_steps(board, max_analysis_visits(self.size)), board, request)
        return StreamingReply(step=run.step, report=run.report, finish=lambda: "",
                              interval=request.interval, stoppable=True)

    def _genmove_analyze(self, args, kata: bool) -> StreamingReply:
        """genmove with reports; the reply ends with 'play VERTEX'."""
        request, color, board = self._analysis_position(args, kata)
        started = time.monotonic()
        run = AnalysisRun(self.player.select_move_steps(board, self._move_budget(color)), board, request)
        name = "kata-genmove_analyze" if kata else "lz-genmove_analyze"

        def finish() -> str:
            return "play " + self._searched_move(name, color, run.result, self.player, started)

        return StreamingReply(step=run.step, report=run.report, finish=finish,
                              interval=request.interval, stoppable=False)

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

    def cmd_final_status_list(self, args):
        self._want_args(args, 1, "final_status_list alive|dead|seki")
        wanted = STATUS_NAMES.get(args[0].lower())
        if wanted is None:
            raise GtpFailure(f"syntax error: status {args[0]!r} is not alive, dead or seki")
        status = stone_statuses(self.board)
        lines = [" ".join(move_to_gtp(p, self.size) for p in chain)
                 for chain in chains(self.board.stones().reshape(-1), self.size) if status[chain[0]] == wanted]
        return "\n".join(lines)

    # ---- handicap: setup stones on an empty board, then White moves -----------

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
        count = self._handicap_count(args, "fixed_handicap NUMBER_OF_STONES")
        points = fixed_handicap_points(self.size, count)
        if points is None:
            raise GtpFailure("invalid number of stones")
        return self._place_handicap(points)

    def cmd_place_free_handicap(self, args):
        count = self._handicap_count(args, "place_free_handicap NUMBER_OF_STONES")
        if not 2 <= count < self.size * self.size:
            raise GtpFailure("invalid number of stones")
        points: list[int] = []
        for fixed in range(count, 1, -1):          # the most fixed points that fit
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
        if self.board.stones().any():
            raise GtpFailure("board not empty")
        try:
            points = [gtp_to_move(vertex, self.size) for vertex in args]
        except ValueError:
            points = []
        if (not 2 <= len(points) < self.size * self.size or len(set(points)) != len(points)
                or self.size * self.size in points):
            raise GtpFailure("bad vertex list")
        self._place_handicap(points)
        return ""

    # ---- SGF -------------------------------------------------------------------

    def cmd_loadsgf(self, args):
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
            size, komi, setup, moves = parse_sgf_game(read_bounded(path))
        except OSError as exc:
            raise GtpFailure(f"cannot load {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise GtpFailure(f"cannot load {path}: {str(exc) or 'malformed SGF'}") from None
        if komi is None:
            komi = self.komi
        if not math.isfinite(komi) or abs(komi) > schema.MAX_KOMI:
            raise GtpFailure(f"cannot load {path}: komi {komi} is out of range")
        if stop is not None:
            moves = moves[:stop - 1]        # the position before move `stop`
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
                raise GtpFailure(f"illegal move in {path} at move {number} "
                                 f"({colour} {move_to_gtp(move, size)}: {exc.reason})") from None
        self._reset(size, komi)
        self.setup, self.moves, self.board = setup, list(moves), board
        return ""

    def cmd_printsgf(self, args):
        if len(args) > 1:
            raise GtpFailure("syntax error: usage: printsgf [FILE]")
        data = game_record_sgf(self.size, self.komi, self.setup, self.moves)
        if not args:
            return data.decode("utf-8").strip()
        try:
            with open(args[0], "wb") as handle:
                handle.write(data)
        except OSError as exc:
            raise GtpFailure(f"cannot write {args[0]}: {exc.strerror or exc}") from None
        return ""

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
    """Settings of `python -m arena.gtp` (see --help)."""

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
    GtpConfig, prog="python -m arena.gtp",
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

    def player_for(board_size: int, config: MctsConfig = mcts) -> MctsPlayer:
        return MctsPlayer(loaded.for_board_size(board_size), config, name=loaded.name)

    def cleanup_player_for(board_size: int) -> MctsPlayer:
        return player_for(board_size, dataclasses.replace(mcts, pass_when_winning=False))

    return GtpEngine(player_for, mcts.budget, board_size=loaded.board_size or config.board_size,
                     komi=config.komi if loaded.komi is None else loaded.komi, log=log,
                     cleanup_factory=cleanup_player_for if config.pass_when_winning else None)


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
                wait = 0.0
                if not searching:
                    wait = None if next_report is None else next_report - time.monotonic()
                stopper = _take_line(lines, wait)
                if stopper is not _NOT_READ:
                    break
            if searching:
                searching = reply.step()
                if not searching and not reply.stoppable:
                    break       # genmove_analyze: its tree has moved on to the chosen move
            if next_report is not None and time.monotonic() >= next_report:
                line = reply.report()
                if line:
                    stdout.write(line + "\n")
                    stdout.flush()
                next_report = time.monotonic() + interval
        text = reply.finish()
    except Exception as exc:  # noqa: BLE001 - the reply must still end
        text = ""
        print(f"arena.gtp: analysis stopped by an internal error: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
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


def main(argv=None) -> int:
    config, retry = CLI.parse(argv)
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
