"""SGF import and export of whole games, through sgfmill.

A game here is what the engine and the lake know: board size, komi, the
main line of moves as flat actions (``p = row * N + col``, row 0 on top,
``PASS = N*N``; Black moves first and colours alternate) and an optional
result string in SGF form (``"B+3.5"``, ``"W+R"``, ``"0"``).

SGF itself counts rows from the top too (``aa`` is the top-left point), but
sgfmill hands moves over as ``(row, col)`` with row 0 at the *bottom*; the
conversion is ``row = N - 1 - sgfmill_row``.  A pass is an empty move
(``B[]``, or ``tt`` on boards up to 19x19, which sgfmill reads as a pass).

Only plain games are accepted on import: no handicap or setup stones
(AB/AW/AE), moves alternating from Black.  Anything else, a malformed move
coordinate included, raises ValueError naming the node.
"""
from sgfmill import sgf

from format.schema import MAX_BOARD_SIZE, MIN_BOARD_SIZE


def game_to_sgf(board_size, komi, moves, result=None, comments=None):
    """Serialise a game to SGF bytes (UTF-8).

    `comments` is an optional mapping {move index: text} (index 0 = the first
    move's node) or a sequence aligned with `moves` (None entries skipped).
    """
    if not MIN_BOARD_SIZE <= int(board_size) <= MAX_BOARD_SIZE:
        raise ValueError(f"board size must be in {MIN_BOARD_SIZE}..{MAX_BOARD_SIZE}, got {board_size!r}")
    size = int(board_size)
    game = sgf.Sgf_game(size=size)
    root = game.get_root()
    root.set("KM", float(komi))
    root.set("RU", "Chinese")
    if result is not None:
        root.set("RE", str(result))
    if comments is None:
        comments = {}
    elif not hasattr(comments, "get"):
        comments = dict(enumerate(comments))
    passed = size * size
    for index, move in enumerate(moves):
        move = int(move)
        if not 0 <= move <= passed:
            raise ValueError(f"move {index} = {move} is not an action on a {size}x{size} board")
        node = game.extend_main_sequence()
        colour = "b" if index % 2 == 0 else "w"
        node.set_move(colour, None if move == passed else (size - 1 - move // size, move % size))
        text = comments.get(index)
        if text is not None:
            node.set("C", str(text))
    return game.serialise()


def game_from_sgf(data):
    """Parse SGF bytes/str -> (board_size, komi, moves, result or None)."""
    try:
        game = sgf.Sgf_game.from_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    except ValueError as err:
        raise ValueError(f"malformed SGF: {err}") from None
    try:
        size = game.get_size()
        komi = game.get_komi()
    except ValueError as err:
        raise ValueError(f"malformed SGF root properties: {err}") from None
    if not MIN_BOARD_SIZE <= size <= MAX_BOARD_SIZE:
        raise ValueError(f"SGF board size {size} is outside {MIN_BOARD_SIZE}..{MAX_BOARD_SIZE}")
    root = game.get_root()
    result = root.get("RE") if root.has_property("RE") else None
    moves = []
    for number, node in enumerate(game.get_main_sequence()):
        for setup in ("AB", "AW", "AE"):
            if node.has_property(setup):
                raise ValueError(f"SGF node {number} has setup stones ({setup}); only plain games are supported")
        try:
            colour, point = node.get_move()
        except ValueError as err:
            raw = node.get_raw("B") if node.has_property("B") else node.get_raw("W")
            raw = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            detail = f" ({err})" if str(err) else ""
            raise ValueError(f"SGF node {number}: malformed move coordinate {raw!r} for a {size}x{size} board{detail}") from None
        if colour is None:
            continue
        expected = "b" if len(moves) % 2 == 0 else "w"
        if colour != expected:
            raise ValueError(f"SGF node {number}: {colour.upper()} plays out of turn (move {len(moves)} should be {expected.upper()})")
        if point is None:
            moves.append(size * size)
        else:
            row, col = point
            moves.append((size - 1 - row) * size + col)
    return size, komi, moves, result
