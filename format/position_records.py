"""Position records: training examples in shards (format/SPEC.md "Shards").

A record holds a *group* of up to ``schema.POSITION_GROUP`` positions,
stored column by column at about what a chunk costs: the board at t in base
3 (5 points a byte), the last 7 moves and the stones each captured (from
which the 7 older boards, hence the 16 history planes, follow), the policy
as integers proportional to it with gap-coded indices (`policy_integers`),
the scalar targets in 14 bytes, and each position's game (an index into the
window's game table, `format.game_table`, which holds each game's ownership
label and generation) and move number.  A position whose label differs from
its game's row (a capped opening's merged mean) keeps its own int8 row in
``ownership_fine`` (flag bit 1).  `CompactPositions` is that at-rest form.
Only ``schema.POSITION_RECORD_VERSION`` is read: a shard of an older
version is refused with the one line that says how to rebuild its window.

Data flow::

    pipeline.positions.PositionBatch --compact(game, table)--> CompactPositions
        --group_wire.encode_groups()--> records --encode_shard()--> GZIP shard
    (+ the window's GameTable --format.game_table--> its table file)
    shard + table --model.tfdata (in the graph)--> training batches
    shard + table --read_shard()/decode_records() (numpy, tools and tests)--> PositionRecord
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from format import planes as plane_layout
from format import schema
from format.example_fields import FeatureReader, FormatError, parse_example
from format.tfrecord import (
    RecordError,
    compress_gzip,
    decompress_for,
    frame_records,
    iter_framed_records,
)

# --------------------------------------------------------------------------
# Position records
# --------------------------------------------------------------------------


@dataclasses.dataclass
class PositionRecord:
    """One training example, decoded (SPEC.md, "Position records")."""

    board_size: int
    planes: np.ndarray
    """uint8[16, N, N]: side to move at t..t-7, then the opponent at t..t-7."""
    to_play: int
    policy_index: np.ndarray
    policy_prob: np.ndarray
    value: float
    score: float
    ownership: np.ndarray
    """float32[N*N] in [-1, 1], side to move."""
    policy_weight: float
    value_weight: float
    ownership_weight: float
    score_weight: float
    game_id: str
    """The source game, looked up in the manifest's ``games`` when given, else ""."""
    move_number: int
    """Position index in its game."""
    generation: int
    game: int
    """The game's index in the window's game table (the manifest's ``games``)."""


def _checked_version(r: FeatureReader) -> None:
    """Refuse a record of any version but the one this release reads, in one line naming the file."""
    problem = schema.position_record_version_problem(r.int(schema.P_VERSION))
    if problem:
        raise r.error(schema.P_VERSION, problem)


def decode_version(data: bytes, source: str = "<bytes>") -> int:
    """The version of one position record: ``schema.POSITION_RECORD_VERSION``, or FormatError naming
    ``source`` (an older version: rebuild the window)."""
    _checked_version(FeatureReader(parse_example(data, source), source))
    return schema.POSITION_RECORD_VERSION


def decode_records(
    data: bytes, source: str = "<bytes>", games: Sequence[str] | None = None, table=None
) -> list[PositionRecord]:
    """Every position in one record (a group).

    ``games`` is the manifest's list of game ids: given, each position's
    ``game_id`` is looked up in it.  ``table`` is the window's
    `format.game_table.GameTable`, which every record needs (each position's
    ownership label and generation are its game's row there).
    """
    r = FeatureReader(parse_example(data, source), source)
    _checked_version(r)
    n = r.int(schema.P_BOARD_SIZE)
    if not schema.MIN_BOARD_SIZE <= n <= schema.MAX_BOARD_SIZE:
        raise r.error(schema.P_BOARD_SIZE, f"impossible board size {n}")
    return _decode_group(r, n, games, table)


def encode_shard(records: Sequence[bytes]) -> bytes:
    """A whole shard file: GZIP TFRecord of serialized position records."""
    return compress_gzip(frame_records(records))


def read_shard(data: bytes, source: str, games: Sequence[str] | None = None, table=None) -> list[PositionRecord]:
    """Decode a whole shard (tools and tests; the trainer streams with tf.data).

    ``games``: the manifest's game ids, to fill game ids; ``table``: the
    window's game table, which every record needs (`decode_records`).
    """
    try:
        raw = decompress_for(source, data)
        return [
            position
            for i, rec in enumerate(iter_framed_records(raw, source))
            for position in decode_records(rec, f"{source}#{i}", games, table)
        ]
    except RecordError as exc:
        raise FormatError(source, None, str(exc).split(": ", 1)[-1]) from None


# --------------------------------------------------------------------------
# Groups of compact positions
# --------------------------------------------------------------------------


def pack_trits(codes: np.ndarray) -> np.ndarray:
    """uint8[P, NN] codes in 0..2 -> uint8[P, ceil(NN/5)]: point p is digit p % 5 (base 3) of byte p // 5."""
    codes = np.asarray(codes, dtype=np.uint8)
    rows, points = codes.shape
    padded = np.zeros((rows, -(-points // schema.TRIT_POINTS) * schema.TRIT_POINTS), np.uint8)
    padded[:, :points] = codes
    digits = padded.reshape(rows, padded.shape[1] // schema.TRIT_POINTS, schema.TRIT_POINTS)  # (-1 fails for 0 rows)
    # Horner's rule over the five digits, most significant first, in uint8
    # (at most 3**5 - 1 = 242): a reduction over an axis of 5 in numpy costs
    # several times more than five strided adds over the whole array.
    packed = digits[:, :, schema.TRIT_POINTS - 1].copy()
    for k in range(schema.TRIT_POINTS - 2, -1, -1):
        packed *= 3
        packed += digits[:, :, k]
    return packed


def trit_table() -> np.ndarray:
    """uint8[256, 5]: the five base-3 digits of each byte, least significant first (bytes > 242: 3s)."""
    values = np.arange(256)
    table = np.stack([values // 3**k % 3 for k in range(schema.TRIT_POINTS)], axis=1)
    table[values >= 3**schema.TRIT_POINTS] = 3  # invalid: no code 3 exists
    return table.astype(np.uint8)


def unpack_trits(packed: np.ndarray, points: int) -> np.ndarray:
    """Inverse of `pack_trits`: uint8[P, points]; code 3 marks a byte that is not base 3."""
    packed = np.asarray(packed, dtype=np.uint8)
    return trit_table()[packed].reshape(len(packed), -1)[:, :points]


def _colour_code_table() -> np.ndarray:
    """uint8[256]: the code of each int8 colour, indexed by the colour's byte (two's complement)."""
    table = np.zeros(256, np.uint8)
    table[np.array([schema.BLACK, schema.WHITE], np.int8).view(np.uint8)] = (1, 2)
    return table


_COLOUR_CODES = _colour_code_table()


def colour_codes(colours: np.ndarray) -> np.ndarray:
    """int8 colours (BLACK, WHITE, EMPTY) -> codes 1, 2, 0.

    One table look-up per point: the shuffle job codes every point of every
    board it writes, and nested np.where over int64 temporaries cost ~10 us
    a 9x9 position there.
    """
    return _COLOUR_CODES[np.ascontiguousarray(colours, np.int8).view(np.uint8)]


def code_colours(codes: np.ndarray) -> np.ndarray:
    """Inverse of `colour_codes`."""
    return np.where(codes == 1, schema.BLACK, np.where(codes == 2, schema.WHITE, schema.EMPTY)).astype(np.int8)


def policy_integers(prob: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each position's positive probabilities as integers proportional to them: a record's policy values.

    Position i's entries are ``prob[offsets[i]:offsets[i+1]]``.  A target
    made of whole multiples of one unit ``min(p) / k`` (the first k in
    1..schema.POLICY_UNITS that works, the largest multiple at most
    ``schema.POLICY_VALUE_MAX``) comes out as those multiples: visit counts
    whose smallest is 1..16 as the counts, and the worker's quantized Gumbel
    targets as the integers its chunk holds, up to a common factor.  Any
    other target is scaled so its largest entry is ``POLICY_VALUE_MAX`` and
    rounded, no entry raised (uint16 in 0..65535, where 0 marks an entry
    below ``max(p) / 131070`` that the record drops: `policy_columns`).
    Small integers keep the gzip'd shard small: a one-visit entry costs a
    few bits, not a float.  One pass over all positions (segment
    reductions), no loop over positions.

    Exact multiples: ``|p / u - v| <= 1e-3 + 1e-6 * v`` (the float32 rounding
    of probabilities as large as 65535 units); SPEC.md "Position records"
    states the error bounds.
    """
    limit = schema.POLICY_VALUE_MAX
    prob = np.asarray(prob, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    counts = np.diff(offsets)
    if not len(prob):
        return np.zeros(0, np.uint16)
    if not (prob > 0).all() or not np.isfinite(prob).all():
        raise ValueError("policy entries must be positive and finite")
    starts = offsets[:-1][counts > 0]
    counts = counts[counts > 0]
    smallest = np.repeat(np.minimum.reduceat(prob, starts), counts)
    largest = np.repeat(np.maximum.reduceat(prob, starts), counts)
    out = np.round(prob / largest * limit)
    settled = np.zeros(len(counts), bool)
    # Whole multiples: the smallest entry is a small multiple of the unit (1 visit in real searches).
    for unit in range(1, schema.POLICY_UNITS + 1):
        ratio = prob / smallest * unit
        whole = np.round(ratio)
        off = np.abs(ratio - whole) <= 1e-3 + 1e-6 * whole
        exact = (np.maximum.reduceat(whole, starts) <= limit) & np.logical_and.reduceat(off, starts) & ~settled
        out = np.where(np.repeat(exact, counts), whole, out)
        settled |= exact
        if settled.all():
            break
    return out.astype(np.uint16)


def policy_columns(
    index: np.ndarray, prob: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets int64[P+1], index int64[K], values uint16[K]): the policy columns of a record.

    ``index`` and ``prob`` are every position's actions and probabilities,
    position i's at ``offsets[i]:offsets[i+1]``; the values are
    `policy_integers`, and an entry below ``max(p) / 131070`` of a target
    that is not whole multiples (value 0) is dropped, index and offsets with it.
    """
    offsets, index = np.asarray(offsets, np.int64), np.asarray(index, np.int64)
    if len(prob) != len(index):
        raise ValueError(f"{len(prob)} probabilities for {len(index)} policy entries")
    values = policy_integers(prob, offsets)
    kept = values > 0
    if not kept.all():
        positions = len(offsets) - 1
        entry_position = np.repeat(np.arange(positions), np.diff(offsets))
        offsets = np.zeros(positions + 1, np.int64)
        np.cumsum(np.bincount(entry_position[kept], minlength=positions), out=offsets[1:])
        index, values = index[kept], values[kept]
    return offsets, index, values


@dataclasses.dataclass
class PositionHistory:
    """P positions as records keep them: the board at t and how it got there.

    The 16 history planes follow from these columns (`history_boards`).  The
    shuffle job's `pipeline.positions.PositionBatch` and the at-rest
    `CompactPositions` both start with them.
    """

    board_size: int
    board: np.ndarray
    """uint8[P, trit_bytes(N)]: the board at t, `pack_trits` of colour codes (0 empty, 1 Black, 2 White)."""
    moves: np.ndarray
    """int32[P, 7]: moves t-1, t-2, ..., t-7 (newest first); PASS = N*N, N*N + 1 = before the start."""
    capture_offsets: np.ndarray
    """int64[P+1]: position i's captures are captures[off[i]:off[i+1]]."""
    captures: np.ndarray
    """int64[C]: (age - 1) * N*N + point for each stone the move t-age captured, ascending per position."""
    to_play: np.ndarray
    """int8[P]: BLACK or WHITE."""

    def __len__(self) -> int:
        return len(self.to_play)


@dataclasses.dataclass
class CompactPositions(PositionHistory):
    """P positions in the at-rest form of a record, column by column.

    Colours are absolute (codes 0 empty/neutral, 1 Black, 2 White); the
    targets are from the side to move's view.  ``fine`` marks the positions
    whose ownership label is their own, not their game's row of the
    window's game table.
    """

    fine: np.ndarray
    """bool[P]: the position's ownership lies in ``ownership_fine`` (it is not its game's row of the game
    table)."""
    ownership_fine: np.ndarray
    """int8[F, NN]: ``round(127 * o)``, Black's view, of each fine position in order (F = fine.sum())."""
    value: np.ndarray
    score: np.ndarray
    policy_weight: np.ndarray
    value_weight: np.ndarray
    ownership_weight: np.ndarray
    score_weight: np.ndarray
    """float32[P] each (value and score from the side to move)."""
    policy_offsets: np.ndarray
    """int64[P+1]: position i's policy is policy_index/value[off[i]:off[i+1]]."""
    policy_index: np.ndarray
    """int64[K]: action indices, ascending per position."""
    policy_value: np.ndarray
    """uint16[K] in 1..65535 (`policy_columns`): probability = value / (sum of the position's values)."""
    game: np.ndarray
    """int64[P]: the source game's index in the window's game table."""
    move_number: np.ndarray
    """int64[P]: the position's index in its game."""


def _targets_rows(c: CompactPositions) -> np.ndarray:
    """uint8[P, TARGET_BYTES]: flags byte, int8 value, float32 score, 4 float16 weights (little-endian).

    The score is float32 because a played-out score is the mean of many
    half-point playout scores (64 by default: steps of 1/128 point), which
    no 16-bit fixed point holds over a 19x19 board's range.
    """
    out = np.zeros((len(c), schema.TARGET_BYTES), np.uint8)
    out[:, 0] = (c.to_play == schema.WHITE).astype(np.uint8) * schema.TARGET_FLAG_WHITE | np.asarray(
        c.fine, bool
    ).astype(np.uint8) * schema.TARGET_FLAG_OWN_OWNERSHIP
    out[:, 1] = np.clip(np.round(c.value * schema.ROOT_VALUE_SCALE), -127, 127).astype(np.int8).view(np.uint8)
    out[:, 2:6] = np.asarray(c.score, "<f4").view(np.uint8).reshape(-1, 4)
    weights = np.stack([c.policy_weight, c.value_weight, c.ownership_weight, c.score_weight], axis=1).astype("<f2")
    out[:, 6:14] = weights.view(np.uint8).reshape(-1, 8)
    return out


def _target_columns(rows: np.ndarray) -> bytes:
    """A record's targets rows stored column by column, each column padded to POSITION_GROUP entries.

    Byte j of position i is at ``j * POSITION_GROUP + i``.  Columns put the
    like bytes of 64 positions side by side (the weights, mostly equal; the
    low mantissa bytes of the scores, mostly 0), which gzip squeezes far
    better than interleaved rows; the fixed column length keeps one layout
    for a short last record, so tf.data unpacks every record alike.
    """
    columns = np.zeros((schema.TARGET_BYTES, schema.POSITION_GROUP), np.uint8)
    columns[:, : len(rows)] = rows.T
    return columns.tobytes()


def _index_deltas(index: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each position's sorted indices gap-coded: the first index, then differences (>= 1)."""
    deltas = np.asarray(index, np.int64).copy()
    if len(deltas):
        deltas[1:] = np.diff(deltas)
        firsts = offsets[:-1][np.diff(offsets) > 0]
        deltas[firsts] = index[firsts]
    return deltas


def history_boards(
    board: np.ndarray, moves: np.ndarray, captures: np.ndarray, to_play: int, board_size: int
) -> list[np.ndarray]:
    """int8 [N, N] boards t, t-1, ... (newest first, as many as the game has, up to 8).

    Undoes the moves one at a time: the stone move t-k placed is lifted and
    the stones it captured come back in the other colour.  ``board`` is int8
    [NN] colours at t, ``captures`` one position's (age - 1) * NN + point entries.
    """
    nn = board_size * board_size
    boards = [np.asarray(board, np.int8).copy()]
    for age in range(1, schema.HISTORY_LENGTH):
        move = int(moves[age - 1])
        if move == nn + schema.NO_MOVE_OFFSET:
            break
        mover = to_play if age % 2 == 0 else -to_play  # who played move t-age
        older = boards[-1].copy()
        if move < nn:
            older[move] = schema.EMPTY
        captured = captures[captures // nn == age - 1] % nn
        older[captured] = -mover
        boards.append(older)
    return [b.reshape(board_size, board_size) for b in boards]


def _decode_group(r: FeatureReader, n: int, games: Sequence[str] | None, table) -> list[PositionRecord]:
    """Validate a record and rebuild each position (history planes by the reference builder).

    Each position takes its generation, and its ownership unless it keeps
    its own row, from ``table`` (the window's GameTable).
    """
    if table is None:
        raise r.error(
            schema.P_GAME,
            "positions take their ownership and generation from the window's game table "
            "(the manifest's 'game_table'); none was given to this reader",
        )
    nn, actions, width = n * n, schema.num_actions(n), schema.trit_bytes(n)
    count = r.int(schema.P_COUNT)
    if not 1 <= count <= schema.POSITION_GROUP:
        raise r.error(schema.P_COUNT, f"is {count}, outside 1..{schema.POSITION_GROUP}")

    def fixed(field, row_bytes):
        raw = r.bytes(field)
        if len(raw) != count * row_bytes:
            raise r.error(field, f"has {len(raw)} bytes, expected {count} x {row_bytes}")
        return np.frombuffer(raw, np.uint8).reshape(count, row_bytes)

    def counted(count_field, values_field):
        counts = r.ints(count_field)
        if len(counts) != count or (counts < 0).any():
            raise r.error(count_field, f"has {len(counts)} entries (or a negative one), expected {count}")
        values = r.ints(values_field)
        if len(values) != counts.sum():
            raise r.error(count_field, f"sums to {int(counts.sum())} but '{values_field}' holds {len(values)} entries")
        return np.concatenate([[0], np.cumsum(counts)]), values

    board_codes = unpack_trits(fixed(schema.P_BOARD, width), nn)
    if (board_codes == 3).any():
        raise r.error(schema.P_BOARD, "holds a byte above 242 (not 5 base-3 digits)")
    move_width = schema.move_bytes(n)
    moves = (
        fixed(schema.P_MOVES, schema.HISTORY_MOVES * move_width)
        .copy()
        .view(np.uint8 if move_width == 1 else np.dtype("<u2"))
        .astype(np.int64)
    )
    no_move = nn + schema.NO_MOVE_OFFSET
    if (moves > no_move).any():
        raise r.error(schema.P_MOVES, f"holds a move above {no_move}")
    if ((moves[:, :-1] == no_move) & (moves[:, 1:] != no_move)).any():
        raise r.error(schema.P_MOVES, "has a move older than the game's start")
    raw_targets = r.bytes(schema.P_TARGETS)
    if len(raw_targets) != schema.TARGET_BYTES * schema.POSITION_GROUP:
        raise r.error(
            schema.P_TARGETS, f"has {len(raw_targets)} bytes, expected {schema.TARGET_BYTES} x {schema.POSITION_GROUP}"
        )
    stored = np.frombuffer(raw_targets, np.uint8).reshape(schema.TARGET_BYTES, schema.POSITION_GROUP)
    targets = stored[:, :count].T.copy()  # one row per position
    if (targets[:, 0] > 3).any():
        raise r.error(schema.P_TARGETS, "has a flags byte above 3 (bit 0: White to move, bit 1: own ownership)")
    fine = (targets[:, 0] & schema.TARGET_FLAG_OWN_OWNERSHIP) != 0
    fine_raw = r.bytes(schema.P_OWNERSHIP_FINE)
    if len(fine_raw) != int(fine.sum()) * nn:
        raise r.error(
            schema.P_OWNERSHIP_FINE, f"has {len(fine_raw)} bytes, expected {int(fine.sum())} own-label positions x {nn}"
        )
    fine_rows = np.frombuffer(fine_raw, np.int8).reshape(-1, nn)
    if (fine_rows == -128).any():
        raise r.error(
            schema.P_OWNERSHIP_FINE, f"holds -128 (ownership is -{schema.OWNERSHIP_SCALE}..{schema.OWNERSHIP_SCALE})"
        )
    fine_index = np.cumsum(fine) - 1
    value = targets[:, 1].view(np.int8).astype(np.float32) / schema.ROOT_VALUE_SCALE
    score = targets[:, 2:6].copy().view("<f4")[:, 0].astype(np.float32)
    if not np.isfinite(score).all():
        raise r.error(schema.P_TARGETS, "has a score that is not finite")
    weights = targets[:, 6:14].copy().view("<f2").astype(np.float32)
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise r.error(schema.P_TARGETS, "has a loss weight that is negative or not finite")
    capture_offsets, captures = counted(schema.P_CAPTURE_COUNT, schema.P_CAPTURES)
    if len(captures) and (captures.min() < 0 or captures.max() >= schema.HISTORY_MOVES * nn):
        raise r.error(schema.P_CAPTURES, f"holds an entry outside 0..{schema.HISTORY_MOVES * nn - 1}")
    policy_offsets, deltas = counted(schema.P_POLICY_COUNT, schema.P_POLICY_INDEX_DELTA)
    values = r.ints(schema.P_POLICY_VALUE)
    most = schema.POLICY_VALUE_MAX
    if len(values) != len(deltas) or (len(values) and (values.min() < 1 or values.max() > most)):
        raise r.error(schema.P_POLICY_VALUE, f"must hold {len(deltas)} integers in 1..{most}")
    columns = {}
    for field in (schema.P_GAME, schema.P_MOVE_NUMBER):
        columns[field] = r.ints(field)
        if len(columns[field]) != count or (columns[field] < 0).any():
            raise r.error(field, f"has {len(columns[field])} entries (or a negative one), expected {count}")
    game, move_number = columns[schema.P_GAME], columns[schema.P_MOVE_NUMBER]
    if games is not None and len(game) and game.max() >= len(games):
        raise r.error(schema.P_GAME, f"holds game {int(game.max())}, but the window's game table has {len(games)}")
    if table.board_size != n:
        raise r.error(
            schema.P_BOARD_SIZE, f"is {n}, but the window's game table is {table.board_size}x{table.board_size}"
        )
    if len(game) and game.max() >= len(table):
        raise r.error(schema.P_GAME, f"holds game {int(game.max())}, but the window's game table has {len(table)}")
    generation = table.generation[game]
    out = []
    for i in range(count):
        to_play = schema.WHITE if targets[i, 0] & 1 else schema.BLACK
        lo, hi = policy_offsets[i], policy_offsets[i + 1]
        index = np.cumsum(deltas[lo:hi])
        if hi > lo and ((deltas[lo + 1 : hi] < 1).any() or index[0] < 0 or index[-1] >= actions):
            raise r.error(schema.P_POLICY_INDEX_DELTA, f"position {i}: indices not strictly increasing in 0..{nn}")
        prob = (values[lo:hi] / max(1, values[lo:hi].sum())).astype(np.float32)
        boards = history_boards(
            code_colours(board_codes[i]), moves[i], captures[capture_offsets[i] : capture_offsets[i + 1]], to_play, n
        )
        if fine[i]:
            ownership = fine_rows[fine_index[i]].astype(np.float32) * to_play / schema.OWNERSHIP_SCALE
        else:
            ownership = table.ownership[game[i]].astype(np.float32) * to_play / schema.OWNERSHIP_SCALE
        out.append(
            PositionRecord(
                board_size=n,
                planes=plane_layout.record_planes(boards, to_play),
                to_play=to_play,
                policy_index=index,
                policy_prob=prob,
                value=float(value[i]),
                score=float(score[i]),
                ownership=ownership,
                policy_weight=float(weights[i, 0]),
                value_weight=float(weights[i, 1]),
                ownership_weight=float(weights[i, 2]),
                score_weight=float(weights[i, 3]),
                game_id=games[game[i]] if games is not None else "",
                move_number=int(move_number[i]),
                generation=int(generation[i]),
                game=int(game[i]),
            )
        )
    return out
