"""GTP coordinates <-> flat actions.

A flat action is ``p = row * N + col`` with row 0 the *top* edge, or
``PASS = N * N`` (format/schema.py).  GTP names columns with letters A-T,
skipping I, from the left, and rows with numbers 1..N from the *bottom*::

    flat (9x9)   row, col   GTP
    0            0, 0       A9      (top-left)
    8            0, 8       J9      (top-right)
    72           8, 0       A1      (bottom-left)
    80           8, 8       J1
    81           -          pass

Both directions raise ValueError naming the offending text or number,
including coordinates that exist in GTP but not on this board size.
"""

GTP_COLUMNS = "ABCDEFGHJKLMNOPQRST"
"""Column letters, left to right ('I' is skipped by GTP)."""


def _check_size(board_size):
    if not isinstance(board_size, int) or not 1 <= board_size <= len(GTP_COLUMNS):
        raise ValueError(f"board size must be an int in 1..{len(GTP_COLUMNS)}, got {board_size!r}")


def gtp_to_move(text, board_size):
    """'D4' / 'pass' (any case) -> flat action on a board_size board."""
    _check_size(board_size)
    if not isinstance(text, str):
        raise ValueError(f"GTP vertex must be a string, got {text!r}")
    vertex = text.strip().upper()
    if vertex == "PASS":
        return board_size * board_size
    if len(vertex) < 2 or vertex[0] not in GTP_COLUMNS or not vertex[1:].isdigit():
        raise ValueError(f"malformed GTP vertex {text!r}: want a letter A-T (no I) and a row number, or 'pass'")
    col = GTP_COLUMNS.index(vertex[0])
    row_from_bottom = int(vertex[1:])
    if col >= board_size or not 1 <= row_from_bottom <= board_size:
        raise ValueError(f"GTP vertex {text!r} is off a {board_size}x{board_size} board")
    row = board_size - row_from_bottom
    return row * board_size + col


def move_to_gtp(move, board_size):
    """Flat action -> 'D4' or 'pass'."""
    _check_size(board_size)
    if isinstance(move, bool) or not hasattr(move, "__index__"):
        raise ValueError(f"a move is a flat int action, got {move!r}")
    move = int(move)
    if move == board_size * board_size:
        return "pass"
    if not 0 <= move < board_size * board_size:
        raise ValueError(f"move {move} is off a {board_size}x{board_size} board (pass is {board_size * board_size})")
    row, col = divmod(move, board_size)
    return f"{GTP_COLUMNS[col]}{board_size - row}"
