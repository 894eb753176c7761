"""The game a GTP engine keeps: its start, boards for either colour, clocks and the texts GTP reads and shows.

A GTP game (`arena.gtp_engine.GtpEngine`) is its board size and komi, an
optional `Setup` (stones placed before the first move: a handicap, or
loadsgf's AB/AW), and the moves as (colour, flat action) pairs; its board is
`new_board` of the setup with every move replayed through the engine's
rules.  GTP lets a controller play either colour at any time, but the
engine's Board alternates: `board_for` re-enters the stones as a fresh
position with the other colour to move (superko history before it is lost).

Terms and units: a flat action is ``row * N + col``, row 0 on top,
``PASS = N*N`` (format/schema.py); colours are BLACK = 1, WHITE = -1;
clock times are seconds.  Scores are Tromp-Taylor area scores from Black's
side.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from engine.board import Board
from format import schema
from format.coords import GTP_COLUMNS

MAX_MOVES_PER_POINT = 10
"""Board move cap = this x N x N: far beyond any real game, so the cap only
stops runaway controllers."""

TIME_SAFETY_FRACTION = 0.8
"""Share of a move's time allotment the search may use (the rest covers
I/O and the controller's own latency)."""
MIN_MOVE_SECONDS = 0.05


class GtpFailure(Exception):
    """A command failed; the message is the text of the '?' reply."""


def parse_color(text: str) -> int:
    """GTP's colour ('b', 'black', 'W', ...) -> BLACK or WHITE."""
    lowered = text.lower()
    if lowered in ("b", "black"):
        return schema.BLACK
    if lowered in ("w", "white"):
        return schema.WHITE
    raise GtpFailure(f"syntax error: invalid color {text!r}")


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
    near = 3 if size >= 12 else 2  # 4th line from 12x12 up, else the 3rd
    far, mid = size - 1 - near, size // 2
    spots = [(near, far), (far, near)]  # upper right, lower left
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


def move_time_allotment(
    control: TimeControl, remaining: float | None, stones: int | None, board_size: int, move_number: int
) -> float | None:
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
