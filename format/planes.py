"""The network's input planes: their layout, stated once, and the reference builder.

Every builder of network input follows this module, and
tests/test_input_planes.py checks each one against `input_planes` bit for
bit on the same positions of many legal games (9x9 and 19x19):

* `selfplay.board.Board.features` (compiled, constants from
  format/planes.pxd): float32 [N, N, 17] for inference; the search driver
  (selfplay/driver.pyx) writes leaves into its batch with the same C routine,
  and the shuffle job's model playouts (pipeline/labels.py) call it too.
* `pipeline.positions.history_planes` (compiled in pipeline/_history.pyx,
  constants from format/planes.pxd): channels 0-15 of every position of
  whole games, bit-packed for position records.
* `format.tfdata.GroupDecoder` (and, for version-1 records,
  `format.legacy.tfdata_version1.PositionDecoder`): position records ->
  float32 [B, N, N, 17] under one of the 8 symmetries, for training.
* `format.codec.decode_records`: each position's channels 0-15 as uint8
  [16, N, N] (inspection, tests).
* `selfplay.playouts.playout_values` (the value of
  `selfplay.player.PlayoutEvaluator`): reads the position at t back out of
  the planes (the newest own and opponent stones and the colour plane).

The layout (AlphaGo Zero's 17 planes), NHWC ``[N, N, INPUT_PLANES]``, all 0/1:

* channel ``OWN_STONES + age`` (0-7): the stones of the side to move at
  t - age, for age 0 .. HISTORY_LENGTH - 1;
* channel ``OPPONENT_STONES + age`` (8-15): the opponent's stones at the same
  times;
* channel ``COLOUR_PLANE`` (16): all ones when ``COLOUR_PLANE_SIDE`` (Black)
  is to move, all zeros otherwise.

"Side to move" is the player to move at t, for every age: the history planes
of a White-to-move position show White's stones in channels 0-7 even at t-1,
when Black was to move.  A position t - age before the start of the game
(age > move number) has all-zero planes.  Every move, passes included, is
one step of history, so after a pass channel 0 and channel 1 show the same
stones.

A position record (format/SPEC.md) stores channels 0 .. PACKED_PLANES - 1,
plane-major and bit-packed, and the side to move as a scalar from which the
readers rebuild the colour plane, which is the last channel.

The numbers (HISTORY_LENGTH, INPUT_PLANES, PACKED_PLANES) are part of the
on-disk contract and live in `format.schema`, re-exported here; compiled
code takes the same numbers and channels from format/planes.pxd, and the
cross-check test asserts that the two agree.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from format import schema

HISTORY_LENGTH = schema.HISTORY_LENGTH
"""Board positions in the input: t, t-1, ..., t - (HISTORY_LENGTH - 1)."""
INPUT_PLANES = schema.INPUT_PLANES
"""Channels of the network input."""
PACKED_PLANES = schema.PACKED_PLANES
"""Channels a position record stores (all but the colour plane)."""

OWN_STONES = 0
"""First channel of the side to move's stones; age k is channel OWN_STONES + k."""
OPPONENT_STONES = OWN_STONES + HISTORY_LENGTH
"""First channel of the opponent's stones; age k is channel OPPONENT_STONES + k."""
COLOUR_PLANE = OPPONENT_STONES + HISTORY_LENGTH
"""Channel that says who is to move: the last one, so records can leave it out."""
COLOUR_PLANE_SIDE = schema.BLACK
"""The colour plane is all ones when this side is to move, else all zeros."""

# The layout above must tile the input exactly, stone planes first.
assert PACKED_PLANES == 2 * HISTORY_LENGTH and COLOUR_PLANE == PACKED_PLANES == INPUT_PLANES - 1


def channel_name(channel: int) -> str:
    """What a channel holds, for error messages: 'own stones at t-3', 'colour (1 = Black to move)'."""
    if not 0 <= channel < INPUT_PLANES:
        raise ValueError(f"channel {channel} is outside 0..{INPUT_PLANES - 1}")
    if channel == COLOUR_PLANE:
        return "colour (1 = Black to move)"
    whose, age = ("own", channel - OWN_STONES) if channel < OPPONENT_STONES else ("opponent", channel - OPPONENT_STONES)
    return f"{whose} stones at t" + (f"-{age}" if age else "")


def input_planes(history_boards: Sequence[np.ndarray], to_play: int) -> np.ndarray:
    """The reference builder: float32 [N, N, INPUT_PLANES] for one position.

    ``history_boards`` are int8 [N, N] boards (schema colours: BLACK = 1,
    WHITE = -1, EMPTY = 0), newest first: the board at t, then t-1, ...
    Fewer than HISTORY_LENGTH boards means the game is younger than the
    history (the rest of the planes stay zero); more are ignored.
    ``to_play`` is the side to move at t (schema.BLACK or schema.WHITE).
    Written for clarity, not speed: the compiled builders are checked
    against it.
    """
    if to_play not in (schema.BLACK, schema.WHITE):
        raise ValueError(f"to_play must be BLACK ({schema.BLACK}) or WHITE ({schema.WHITE}), got {to_play!r}")
    boards = [np.asarray(b) for b in list(history_boards)[:HISTORY_LENGTH]]
    if not boards:
        raise ValueError("input_planes needs at least the board at t")
    n = boards[0].shape[0]
    if any(b.shape != (n, n) for b in boards):
        raise ValueError(f"history boards must all be [{n}, {n}], got {[b.shape for b in boards]}")
    out = np.zeros((n, n, INPUT_PLANES), np.float32)
    opponent = -to_play
    for age, board in enumerate(boards):
        out[:, :, OWN_STONES + age] = board == to_play
        out[:, :, OPPONENT_STONES + age] = board == opponent
    out[:, :, COLOUR_PLANE] = 1.0 if to_play == COLOUR_PLANE_SIDE else 0.0
    return out


def record_planes(history_boards: Sequence[np.ndarray], to_play: int) -> np.ndarray:
    """uint8 [PACKED_PLANES, N, N]: the channels a position record stores, plane-major.

    The same planes as `input_planes` without the colour plane (the record
    keeps ``to_play`` as a scalar instead).
    """
    planes = input_planes(history_boards, to_play)[:, :, :PACKED_PLANES]
    return np.ascontiguousarray(np.moveaxis(planes, -1, 0)).astype(np.uint8)


def input_from_record_planes(packed: np.ndarray, to_play: int) -> np.ndarray:
    """float32 [N, N, INPUT_PLANES]: `record_planes`' inverse, the network input of a stored position.

    ``packed`` is uint8 [PACKED_PLANES, N, N] (a decoded record's planes); the
    colour plane comes from ``to_play`` as `input_planes` makes it.
    """
    packed = np.asarray(packed)
    if packed.ndim != 3 or packed.shape[0] != PACKED_PLANES or packed.shape[1] != packed.shape[2]:
        raise ValueError(f"record planes must be [{PACKED_PLANES}, N, N], got {packed.shape}")
    if to_play not in (schema.BLACK, schema.WHITE):
        raise ValueError(f"to_play must be BLACK ({schema.BLACK}) or WHITE ({schema.WHITE}), got {to_play!r}")
    n = packed.shape[1]
    out = np.zeros((n, n, INPUT_PLANES), np.float32)
    out[:, :, :PACKED_PLANES] = np.moveaxis(packed, 0, -1)
    out[:, :, COLOUR_PLANE] = 1.0 if to_play == COLOUR_PLANE_SIDE else 0.0
    return out
