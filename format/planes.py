"""The network's input planes: their layout, stated once, and the reference builder `input_planes`.

NHWC ``[N, N, C]``, all 0/1; C = ``BASIC_INPUT_PLANES`` (17, AlphaGo Zero's) or ``INPUT_PLANES``
(22), as a model manifest's ``feature_set_planes`` says (17 when absent):
* ``OWN_STONES + age`` / ``OPPONENT_STONES + age``: the stones of the side to move at t / of its
  opponent, at t - age for age < HISTORY_LENGTH.  "Side to move" is the player to move at t for
  every age; every move, passes included, is one step; before the game: all zeros.
* ``COLOUR_PLANE``: all ones when ``COLOUR_PLANE_SIDE`` (Black) is to move.
* ``ON_BOARD``: all ones, so the edge differs from an empty point under zero padding.
* ``LIBERTIES_1`` / ``+ 1`` / ``+ 2``: stones whose chain has 1, 2, or 3 or more liberties.
* ``LEGAL``: empty points where the side to move may play under the *basic* rules (not suicide, not
  a ko recapture, `ko_ban`): from the boards at t and t-1 alone, so the training reader can build it.
A position record (format/SPEC.md) stores channels below PACKED_PLANES bit-packed and the side to
move as a scalar; readers rebuild the rest.  The numbers live in `format.schema` (and
format/planes.pxd for compiled code).  Every builder (`engine.board.Board.features`, the search
driver's leaves, `pipeline.positions.history_planes`, `model.tfdata.GroupDecoder`,
`format.codec.decode_records`, `engine.playouts.playout_values`) is checked against `input_planes`
bit for bit by tests/format/test_planes.py.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from format import schema

HISTORY_LENGTH = schema.HISTORY_LENGTH
"""Board positions in the input: t, t-1, ..., t - (HISTORY_LENGTH - 1)."""
INPUT_PLANES = schema.INPUT_PLANES
"""Channels of the full layout (22)."""
BASIC_INPUT_PLANES = schema.BASIC_INPUT_PLANES
"""Channels of AlphaGo Zero's planes (17), the first of the layout."""
PACKED_PLANES = schema.PACKED_PLANES
"""Channels a position record stores (the stone history)."""

OWN_STONES = 0
"""First channel of the side to move's stones; age k is channel OWN_STONES + k."""
OPPONENT_STONES = OWN_STONES + HISTORY_LENGTH
"""First channel of the opponent's stones; age k is channel OPPONENT_STONES + k."""
COLOUR_PLANE = OPPONENT_STONES + HISTORY_LENGTH
"""Channel that says who is to move: right after the stones, so records can leave it out."""
COLOUR_PLANE_SIDE = schema.BLACK
"""The colour plane is all ones when this side is to move, else all zeros."""
ON_BOARD = COLOUR_PLANE + 1
"""All ones."""
LIBERTIES_1 = ON_BOARD + 1
"""Stones whose chain has exactly one liberty (in atari); LIBERTIES_1 + 1 two, + 2 three or more."""
LEGAL = LIBERTIES_1 + 3
"""Empty points where the side to move may play under the basic rules (module docstring)."""

# The layout above must tile the input exactly, stone planes first.
assert PACKED_PLANES == 2 * HISTORY_LENGTH and COLOUR_PLANE == PACKED_PLANES == BASIC_INPUT_PLANES - 1
assert LEGAL == INPUT_PLANES - 1


def check_channels(channels: int) -> int:
    """``channels`` if it is a width a model may take (17 or 22), else ValueError naming both."""
    if channels not in schema.INPUT_PLANE_CHOICES:
        raise ValueError(f"input planes must be one of {schema.INPUT_PLANE_CHOICES}, got {channels!r}")
    return channels


def input_planes_of(consumer) -> int:
    """The input width a model or evaluator takes: its ``input_planes`` attribute, else 17
    (every model and evaluator from before liberty planes)."""
    return int(getattr(consumer, "input_planes", BASIC_INPUT_PLANES))


def channel_name(channel: int) -> str:
    """What a channel holds, for error messages: 'own stones at t-3', 'colour (1 = Black to move)'."""
    if not 0 <= channel < INPUT_PLANES:
        raise ValueError(f"channel {channel} is outside 0..{INPUT_PLANES - 1}")
    if channel == COLOUR_PLANE:
        return "colour (1 = Black to move)"
    if channel == ON_BOARD:
        return "on board (all ones)"
    if LIBERTIES_1 <= channel < LEGAL:
        return ("stones with 1 liberty", "stones with 2 liberties", "stones with 3 or more liberties")[
            channel - LIBERTIES_1
        ]
    if channel == LEGAL:
        return "legal moves of the side to move (basic rules)"
    whose, age = ("own", channel - OWN_STONES) if channel < OPPONENT_STONES else ("opponent", channel - OPPONENT_STONES)
    return f"{whose} stones at t" + (f"-{age}" if age else "")


def _neighbours(row: int, col: int, n: int):
    for r, c in ((row - 1, col), (row, col - 1), (row, col + 1), (row + 1, col)):
        if 0 <= r < n and 0 <= c < n:
            yield r, c


def chain_liberties(board: np.ndarray) -> np.ndarray:
    """int [N, N]: the liberty count of each stone's chain (0 on empty points), by flood fill."""
    n = board.shape[0]
    out = np.zeros((n, n), np.int32)
    done = np.zeros((n, n), bool)
    for row in range(n):
        for col in range(n):
            if board[row, col] == schema.EMPTY or done[row, col]:
                continue
            colour, chain, liberties, todo = board[row, col], [], set(), [(row, col)]
            done[row, col] = True
            while todo:
                point = todo.pop()
                chain.append(point)
                for r, c in _neighbours(*point, n):
                    if board[r, c] == schema.EMPTY:
                        liberties.add((r, c))
                    elif board[r, c] == colour and not done[r, c]:
                        done[r, c] = True
                        todo.append((r, c))
            for point in chain:
                out[point] = len(liberties)
    return out


def ko_ban(
    board: np.ndarray, previous: np.ndarray | None, to_play: int, liberties: np.ndarray | None = None
) -> tuple[int, int] | None:
    """The point where ``to_play`` may not retake a ko at once, or None.

    The last move put a single stone at ``m`` (opponent's at t, empty at t-1) and took exactly one
    stone of ``to_play`` at ``k`` (own at t-1, empty at t), and the chain at ``m`` is that one stone
    with one liberty: playing ``k`` would bring back the board at t-1.
    ``liberties``: `chain_liberties` of ``board`` when the caller has it."""
    if previous is None:
        return None
    taken = np.argwhere((previous == to_play) & (board == schema.EMPTY))
    placed = np.argwhere((board == -to_play) & (previous == schema.EMPTY))
    if len(taken) != 1 or len(placed) != 1:
        return None
    row, col = placed[0]
    alone = all(board[r, c] != -to_play for r, c in _neighbours(row, col, board.shape[0]))
    if liberties is None:
        liberties = chain_liberties(board)
    return tuple(taken[0]) if alone and liberties[row, col] == 1 else None


def legal_points(
    board: np.ndarray, previous: np.ndarray | None, to_play: int, liberties: np.ndarray | None = None
) -> np.ndarray:
    """bool [N, N]: the LEGAL plane: empty, not suicide, not the ko recapture."""
    n = board.shape[0]
    if liberties is None:
        liberties = chain_liberties(board)
    legal = np.zeros((n, n), bool)
    for row in range(n):
        for col in range(n):
            if board[row, col] != schema.EMPTY:
                continue
            for r, c in _neighbours(row, col, n):
                if (
                    board[r, c] == schema.EMPTY  # a liberty of its own
                    or (board[r, c] == to_play and liberties[r, c] >= 2)  # joins a chain that keeps one
                    or (board[r, c] == -to_play and liberties[r, c] == 1)
                ):  # takes a chain
                    legal[row, col] = True
    ban = ko_ban(board, previous, to_play, liberties)
    if ban is not None:
        legal[ban] = False
    return legal


def input_planes(history_boards: Sequence[np.ndarray], to_play: int, channels: int = BASIC_INPUT_PLANES) -> np.ndarray:
    """The reference builder: float32 [N, N, channels] for one position (channels 17 or 22).

    ``history_boards`` are int8 [N, N] boards (schema colours: BLACK = 1,
    WHITE = -1, EMPTY = 0), newest first: the board at t, then t-1, ...
    Fewer than HISTORY_LENGTH boards means the game is younger than the
    history (the rest of the planes stay zero); more are ignored.
    ``to_play`` is the side to move at t (schema.BLACK or schema.WHITE).
    Written for clarity, not speed: the compiled builders are checked
    against it.
    """
    check_channels(channels)
    if to_play not in (schema.BLACK, schema.WHITE):
        raise ValueError(f"to_play must be BLACK ({schema.BLACK}) or WHITE ({schema.WHITE}), got {to_play!r}")
    boards = [np.asarray(b) for b in list(history_boards)[:HISTORY_LENGTH]]
    if not boards:
        raise ValueError("input_planes needs at least the board at t")
    n = boards[0].shape[0]
    if any(b.shape != (n, n) for b in boards):
        raise ValueError(f"history boards must all be [{n}, {n}], got {[b.shape for b in boards]}")
    out = np.zeros((n, n, channels), np.float32)
    opponent = -to_play
    for age, board in enumerate(boards):
        out[:, :, OWN_STONES + age] = board == to_play
        out[:, :, OPPONENT_STONES + age] = board == opponent
    out[:, :, COLOUR_PLANE] = 1.0 if to_play == COLOUR_PLANE_SIDE else 0.0
    if channels > BASIC_INPUT_PLANES:
        board, previous = boards[0], boards[1] if len(boards) > 1 else None
        liberties = chain_liberties(board)
        out[:, :, ON_BOARD] = 1.0
        out[:, :, LIBERTIES_1] = liberties == 1
        out[:, :, LIBERTIES_1 + 1] = liberties == 2
        out[:, :, LIBERTIES_1 + 2] = liberties >= 3
        out[:, :, LEGAL] = legal_points(board, previous, to_play, liberties)
    return out


def record_planes(history_boards: Sequence[np.ndarray], to_play: int) -> np.ndarray:
    """uint8 [PACKED_PLANES, N, N]: the channels a position record stores, plane-major.

    The stone planes of `input_planes`; the record keeps ``to_play`` as a
    scalar instead of the colour plane and rebuilds the rest.
    """
    planes = input_planes(history_boards, to_play, BASIC_INPUT_PLANES)[:, :, :PACKED_PLANES]
    return np.ascontiguousarray(np.moveaxis(planes, -1, 0)).astype(np.uint8)


def input_from_record_planes(packed: np.ndarray, to_play: int, channels: int = BASIC_INPUT_PLANES) -> np.ndarray:
    """float32 [N, N, channels]: `record_planes`' inverse, the network input of a stored position.

    ``packed`` is uint8 [PACKED_PLANES, N, N] (a decoded record's planes); the
    colour plane comes from ``to_play`` and the five planes after it from the
    boards at t and t-1, as `input_planes` makes them.
    """
    packed = np.asarray(packed)
    if packed.ndim != 3 or packed.shape[0] != PACKED_PLANES or packed.shape[1] != packed.shape[2]:
        raise ValueError(f"record planes must be [{PACKED_PLANES}, N, N], got {packed.shape}")
    if to_play not in (schema.BLACK, schema.WHITE):
        raise ValueError(f"to_play must be BLACK ({schema.BLACK}) or WHITE ({schema.WHITE}), got {to_play!r}")
    n = packed.shape[1]
    basic = np.zeros((1, n, n, BASIC_INPUT_PLANES), np.float32)
    basic[0, :, :, :PACKED_PLANES] = np.moveaxis(packed, 0, -1)
    basic[0, :, :, COLOUR_PLANE] = 1.0 if to_play == COLOUR_PLANE_SIDE else 0.0
    return convert_input_planes(basic, channels)[0]


def convert_input_planes(planes: np.ndarray, channels: int) -> np.ndarray:
    """float32 [B, N, N, channels]: network input rows of either width made ``channels`` wide.

    Dropping planes is a slice; adding the five position planes rebuilds
    each row's boards at t and t-1 from its stone channels and runs the
    reference builder (slow: for the rare batch gathered for a model of the
    other width, e.g. a worker's rows left over when a lake changes width).
    """
    check_channels(channels)
    planes = np.asarray(planes, np.float32)
    have = planes.shape[-1]
    if have == channels or channels == BASIC_INPUT_PLANES:
        return np.ascontiguousarray(planes[..., :channels])
    out = np.empty((*planes.shape[:-1], channels), np.float32)
    for row, position in enumerate(planes):
        to_play = COLOUR_PLANE_SIDE if position[0, 0, COLOUR_PLANE] else -COLOUR_PLANE_SIDE
        boards = [
            np.where(position[:, :, OWN_STONES + age] > 0, to_play, 0)
            + np.where(position[:, :, OPPONENT_STONES + age] > 0, -to_play, 0)
            for age in range(2)
        ]
        out[row] = input_planes(boards, to_play, channels)
        out[row, :, :, :have] = position
    return out
