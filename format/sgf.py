"""SGF import and export of games, through sgfmill: the project's one SGF reader and writer.

A game here is what the engine and the lake know: board size, komi, optional
setup stones placed before the first move (handicap, a loaded position), the
main line of moves as (colour, flat action) pairs and an optional result in
SGF form (``"B+3.5"``, ``"W+R"``, ``"0"``).  A flat action is
``p = row * N + col``, row 0 on top, ``PASS = N*N``; colours are
format/schema.py's BLACK = 1 and WHITE = -1.

Data flows: `write_sgf` turns a game into SGF bytes (`write_sgf_file`: into a
regular file); `read_sgf` turns SGF bytes (`read_sgf_file`: a bounded regular
file) into an `SgfGame`.  `game_to_sgf` and
`game_from_sgf` are the views of plain games (no setup stones, colours
alternating from Black) that match records, the ladder and the lake use;
GTP's loadsgf/printsgf use the full game.

SGF counts rows from the top (``aa`` is the top-left point), but sgfmill
hands points over as ``(row, col)`` with row 0 at the *bottom*; `_to_sgfmill`
and `_from_sgfmill` are the one conversion.  A pass is an empty move
(``B[]``, or ``tt`` on boards up to 19x19, which sgfmill reads as a pass).
Every malformed input raises ValueError naming what is wrong (and the node).
"""

from __future__ import annotations

import dataclasses
import os
import stat

import numpy as np
from sgfmill import sgf

from format.schema import BLACK, EMPTY, MAX_BOARD_SIZE, MIN_BOARD_SIZE, WHITE

MAX_SGF_BYTES = 1_000_000
"""Largest file `read_sgf_file` reads (a 19x19 game is a few kilobytes); a
bigger one, or a pipe or device, is refused before parsing."""

_COLOUR_LETTER = {BLACK: "b", WHITE: "w"}


@dataclasses.dataclass(frozen=True)
class SgfGame:
    """An SGF game's main line.

    `setup`: int8 [N*N] stones (+1/-1/0) before the first move, None when the
    file has no AB/AW/AE there; `to_play`: the colour that moves first after
    them (PL, else White after Black-only stones, a handicap, else Black);
    `komi`: None when the file has no KM; `moves`: [(colour, action)]."""

    size: int
    komi: float | None
    setup: np.ndarray | None
    to_play: int
    moves: list[tuple[int, int]]
    result: str | None


def _to_sgfmill(action: int, size: int):
    """Flat action -> sgfmill's (row from the bottom, col); None for a pass."""
    return None if action == size * size else (size - 1 - action // size, action % size)


def _from_sgfmill(point, size: int) -> int:
    """sgfmill's (row from the bottom, col) or None (a pass) -> flat action."""
    return size * size if point is None else (size - 1 - point[0]) * size + point[1]


def _check_size(board_size) -> int:
    if not MIN_BOARD_SIZE <= int(board_size) <= MAX_BOARD_SIZE:
        raise ValueError(f"board size must be in {MIN_BOARD_SIZE}..{MAX_BOARD_SIZE}, got {board_size!r}")
    return int(board_size)


def write_sgf(board_size, komi, moves, setup=None, to_play=BLACK, result=None, comments=None) -> bytes:
    """A game as SGF bytes (UTF-8): SZ, KM, RU, RE, setup stones (AB/AW, with
    HA for Black-only stones with White to move, and PL), then one node per
    (colour, action) of `moves`.

    `setup` is flat [N*N] stones (+1/-1/0) or None; `to_play` the colour
    moving first after them.  `comments` is an optional mapping {move index:
    text} (index 0 = the first move's node) or a sequence aligned with
    `moves` (None entries skipped)."""
    size = _check_size(board_size)
    game = sgf.Sgf_game(size=size)
    root = game.get_root()
    root.set("KM", float(komi))
    root.set("RU", "Chinese")
    if result is not None:
        root.set("RE", str(result))
    if setup is not None:
        flat = np.asarray(setup).reshape(-1)
        black = {_to_sgfmill(int(p), size) for p in np.flatnonzero(flat == BLACK)}
        white = {_to_sgfmill(int(p), size) for p in np.flatnonzero(flat == WHITE)}
        root.set_setup_stones(black, white)
        if black and not white and to_play == WHITE:
            root.set("HA", len(black))
        root.set("PL", _COLOUR_LETTER[to_play])
    if comments is None:
        comments = {}
    elif not hasattr(comments, "get"):
        comments = dict(enumerate(comments))
    node = root
    for index, (colour, move) in enumerate(moves):
        move = int(move)
        if not 0 <= move <= size * size:
            raise ValueError(f"move {index} = {move} is not an action on a {size}x{size} board")
        # A child of the last node, not game.extend_main_sequence(): that walks the whole line from the
        # root for every move, quadratic in the moves (a 1 MB game held GTP's printsgf for 45 minutes).
        node = node.new_child()
        node.set_move(_COLOUR_LETTER[colour], _to_sgfmill(move, size))
        text = comments.get(index)
        if text is not None:
            node.set("C", str(text))
    return game.serialise()


def read_sgf(data) -> SgfGame:
    """Parse SGF bytes/str -> `SgfGame` of its main line.  Setup stones are
    taken from the nodes before the first move; later ones are refused."""
    try:
        game = sgf.Sgf_game.from_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    except ValueError as err:
        raise ValueError(f"malformed SGF: {err}") from None
    root = game.get_root()
    try:
        size = game.get_size()
        komi = game.get_komi() if root.has_property("KM") else None
        game_type = root.get("GM") if root.has_property("GM") else 1
    except ValueError as err:
        raise ValueError(f"malformed SGF root properties: {err}") from None
    if not MIN_BOARD_SIZE <= size <= MAX_BOARD_SIZE:
        raise ValueError(f"SGF board size {size} is outside {MIN_BOARD_SIZE}..{MAX_BOARD_SIZE}")
    if game_type != 1:
        raise ValueError(f"GM[{game_type}] is not a game of Go")
    result = root.get("RE") if root.has_property("RE") else None
    stones = np.zeros(size * size, np.int8)
    has_setup = False
    moves: list[tuple[int, int]] = []
    for number, node in enumerate(game.get_main_sequence()):
        if node.has_setup_stones():
            if moves:
                raise ValueError(f"SGF node {number}: setup stones after the first move")
            try:
                placed = node.get_setup_stones()
            except ValueError as err:
                raise ValueError(f"SGF node {number}: malformed setup stones ({err})") from None
            has_setup = True
            for value, points in zip((BLACK, WHITE, EMPTY), placed):
                for point in points:
                    stones[_from_sgfmill(point, size)] = value
        try:
            colour, point = node.get_move()
        except ValueError as err:
            raw = node.get_raw("B") if node.has_property("B") else node.get_raw("W")
            raw = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            detail = f" ({err})" if str(err) else ""
            raise ValueError(
                f"SGF node {number}: malformed move coordinate {raw!r} for a {size}x{size} board{detail}"
            ) from None
        if colour is not None:
            moves.append((BLACK if colour == "b" else WHITE, _from_sgfmill(point, size)))
    to_play = BLACK
    if root.has_property("PL"):
        try:
            to_play = BLACK if root.get("PL") == "b" else WHITE
        except ValueError:
            raise ValueError("malformed PL property") from None
    elif stones.any() and not (stones == WHITE).any():  # a handicap: White moves first
        to_play = WHITE
    return SgfGame(size, komi, stones if has_setup else None, to_play, moves, result)


def _open_regular(path: str, flags: int):
    """``path`` opened with ``flags`` as a binary file object, if it is a regular file (or, when
    ``flags`` create it, absent); ValueError for a FIFO, socket, device or folder, OSError otherwise.

    Checked before opening (os.stat) and again on what was opened (os.fstat; something else may
    have taken the name meanwhile): open() of a FIFO waits for its other end for ever.  O_NONBLOCK
    makes such an open return (or fail) at once instead; for a regular file it changes nothing."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    else:
        if not stat.S_ISREG(mode):
            raise ValueError("not a regular file")
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("not a regular file")
    return os.fdopen(fd, "wb" if flags & os.O_WRONLY else "rb")


def read_sgf_file(path: str, limit: int = MAX_SGF_BYTES) -> SgfGame:
    """`read_sgf` of regular file `path` if it holds at most `limit` bytes;
    raises ValueError (or OSError) naming the problem."""
    with _open_regular(path, os.O_RDONLY) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return read_sgf(data)


def write_sgf_file(path: str, data: bytes) -> None:
    """Write SGF bytes to `path`, created or replaced if it is a regular file; raises ValueError (a
    FIFO, socket, device or folder, refused before it is opened) or OSError naming the problem."""
    with _open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) as handle:
        handle.write(data)


def game_to_sgf(board_size, komi, moves, result=None, comments=None) -> bytes:
    """A plain game (flat actions, Black first, alternating) as SGF bytes;
    `write_sgf` for `result` and `comments`."""
    return write_sgf(
        board_size,
        komi,
        [(BLACK if index % 2 == 0 else WHITE, move) for index, move in enumerate(moves)],
        result=result,
        comments=comments,
    )


def game_from_sgf(data) -> tuple[int, float, list[int], str | None]:
    """A plain game's SGF bytes/str -> (board_size, komi (0.0 without KM),
    flat actions, result or None); raises ValueError for setup stones or
    colours that do not alternate from Black."""
    game = read_sgf(data)
    if game.setup is not None:
        raise ValueError("SGF has setup stones (AB/AW/AE); only plain games are supported")
    for index, (colour, _) in enumerate(game.moves):
        expected = BLACK if index % 2 == 0 else WHITE
        if colour != expected:
            raise ValueError(
                f"SGF move {index}: {_COLOUR_LETTER[colour].upper()} plays out of turn "
                f"(should be {_COLOUR_LETTER[expected].upper()})"
            )
    return game.size, 0.0 if game.komi is None else game.komi, [move for _, move in game.moves], game.result
