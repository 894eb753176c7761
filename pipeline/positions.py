"""Training positions as batches of numpy arrays: build, cap, copy, serialize.

A `PositionBatch` is a struct of arrays for P positions (any number of games); every step is a
whole-array operation or a loop over games, never one Beam element a position.  Terms:
* ``N`` board size, ``NN = N*N`` points, ``A = NN + 1`` actions.
* *fresh planes*: a game record's own board per position (uint8[M, 2, N, N], Black then White).
* *history planes*: a position record's packed planes, the stone channels of format/planes.py's
  layout (``PACKED_PLANES``), built for a whole bundle at once by `games_positions`.
* *instance*: a game's number within this run (bundle chunk index << 20 | game index); exact
  duplicate games are dropped by instance.
* *key*: 64-bit hash of (history planes, side to move) for positions early enough to be capped
  (move number < dedup_max_move); 0 for the rest.
* *copies*: each position goes to the shards floor(r) + Bernoulli(frac(r)) times (r = reuse, the
  lowest-spread integer count with mean r), a game's copies dealt round-robin from a random shard.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Sequence

import numpy as np

from format import codec, schema
from format.codec import GameRecord
from format.game_table import label_rows
from pipeline.labels import EndstateLabel

INSTANCE_SHIFT = 20
"""instance = chunk index << 20 | game index within the chunk."""

_ARRAY_FIELDS = (
    "board",
    "moves",
    "capture_offsets",
    "captures",
    "to_play",
    "policy_offsets",
    "policy_index",
    "policy_prob",
    "value",
    "score",
    "ownership",
    "policy_weight",
    "value_weight",
    "ownership_weight",
    "score_weight",
    "game_id",
    "move_number",
    "generation",
    "instance",
    "key",
)
_RAGGED = {"policy_offsets": ("policy_index", "policy_prob"), "capture_offsets": ("captures",)}
"""Ragged columns: offsets field -> the value fields it slices (row i: values[off[i]:off[i+1]])."""


def _ragged_take(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(new offsets, gather indices of the values) of ``rows`` of a ragged column."""
    starts, ends = offsets[rows], offsets[rows + 1]
    lengths = ends - starts
    new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    gather = np.repeat(starts - new_offsets[:-1], lengths) + np.arange(new_offsets[-1])
    return new_offsets, gather


@dataclasses.dataclass
class PositionBatch(codec.PositionHistory):
    """P training positions of one board size, targets already in record form.

    The position itself is kept the way a record stores it
    (`codec.PositionHistory`: the board at t, the last 7 moves and their captures);
    the targets at full precision, so that merging capped openings averages
    exact values.
    """

    policy_offsets: np.ndarray
    """int64[P+1]: position i's policy is policy_index/prob[off[i]:off[i+1]]."""
    policy_index: np.ndarray
    """int64[K] action indices."""
    policy_prob: np.ndarray
    """float32[K] probabilities, summing to 1 per position (empty: no target)."""
    value: np.ndarray
    """float32[P] game result from the side to move."""
    score: np.ndarray
    """float32[P] final area score from the side to move."""
    ownership: np.ndarray
    """int8[P, NN] round(127 * ownership) from the side to move."""
    policy_weight: np.ndarray
    value_weight: np.ndarray
    ownership_weight: np.ndarray
    score_weight: np.ndarray
    """float32[P] each."""
    game_id: np.ndarray
    """bytes_[P] (numpy 'S' dtype) game id."""
    move_number: np.ndarray
    """int32[P]"""
    generation: np.ndarray
    """int32[P] generation of the model that played the game."""
    instance: np.ndarray
    """int64[P] game instance in this run (module docstring)."""
    key: np.ndarray
    """uint64[P] dedup key, 0 when the position cannot be capped."""

    def take(self, rows) -> "PositionBatch":
        """The positions at ``rows`` (an int array), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        fields = {}
        for offsets_name, value_names in _RAGGED.items():
            fields[offsets_name], gather = _ragged_take(getattr(self, offsets_name), rows)
            for name in value_names:
                fields[name] = getattr(self, name)[gather]
        for name in _ARRAY_FIELDS:
            if name not in fields:
                fields[name] = getattr(self, name)[rows]
        return PositionBatch(board_size=self.board_size, **fields)

    def policy(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.policy_offsets[i], self.policy_offsets[i + 1]
        return self.policy_index[lo:hi], self.policy_prob[lo:hi]

    def compact(self, game: np.ndarray | None, table: codec.GameTable) -> codec.CompactPositions:
        """The positions in the at-rest form of a record (codec.CompactPositions), what the shuffle job writes.

        ``game`` is each position's index in the window's game table
        (`game_table_index`); None (tests, benches) lets the instance stand
        in.  ``table`` is the window's game table (codec.GameTable, whose
        rows ``game`` indexes): a position keeps an int8 ownership row
        (``fine``) only where its label differs from its game's row, which
        happens only to a capped opening's merged copies; every other
        position's label is its game's row.  The policy becomes integers
        proportional to it (codec.policy_columns).
        """
        game = np.asarray(self.instance if game is None else game, np.int64)
        # Ownership is int8 in -SCALE..SCALE from the side to move, and
        # to_play is +1 or -1, so the product stays in int8 (no widening:
        # this runs over every point of every position of a window).
        black_view = self.ownership.astype(np.int8, copy=False) * self.to_play.astype(np.int8)[:, None]
        if len(game) and game.max() >= len(table):
            raise ValueError(f"a position's game {int(game.max())} is outside the game table ({len(table)})")
        fine = (black_view != table.ownership[game]).any(axis=1)  # its own label, not its game's
        offsets, index, values = codec.policy_columns(self.policy_index, self.policy_prob, self.policy_offsets)
        return codec.CompactPositions(
            board_size=self.board_size,
            board=self.board,
            moves=self.moves,
            capture_offsets=self.capture_offsets,
            captures=self.captures,
            to_play=self.to_play,
            fine=fine,
            ownership_fine=black_view[fine],
            value=self.value,
            score=self.score,
            policy_weight=self.policy_weight,
            value_weight=self.value_weight,
            ownership_weight=self.ownership_weight,
            score_weight=self.score_weight,
            policy_offsets=offsets,
            policy_index=index,
            policy_value=values,
            game=game,
            move_number=self.move_number.astype(np.int64),
        )

    def encode(self, game: np.ndarray | None, table: codec.GameTable) -> list[bytes]:
        """Serialized records, POSITION_GROUP positions each, in row order (``game``, ``table``: see compact)."""
        return codec.encode_groups(self.compact(game, table))

    def to_bytes(self) -> bytes:
        """A temporary-file image (no pickles; see `pack_arrays`)."""
        return pack_arrays({"board_size": np.int64(self.board_size), **{n: getattr(self, n) for n in _ARRAY_FIELDS}})

    @classmethod
    def from_bytes(cls, data: bytes) -> "PositionBatch":
        arrays = unpack_arrays(data)
        return cls(board_size=int(arrays["board_size"]), **{n: arrays[n] for n in _ARRAY_FIELDS})


_PACK_MAGIC = b"ZLARRAYS1\n"


def pack_arrays(arrays: dict) -> bytes:
    """Named numpy arrays as one byte string: magic, JSON header line, raw data.

    The temporary pieces are written and read once each, so np.savez's zip
    container (a CRC and a header per member) is cost without use.
    Only plain dtypes are allowed (no object arrays, nothing unpickled).
    """
    header, blobs = [], []
    for name, value in arrays.items():
        value = np.asarray(value)
        if not value.flags.c_contiguous:  # the buffer must hold the data in C order
            value = np.ascontiguousarray(value)
        if value.dtype.hasobject:
            raise ValueError(f"array {name!r} has an object dtype")
        header.append([name, value.dtype.str, list(value.shape), value.nbytes])
        blobs.append(value.reshape(-1).data.cast("B"))  # no copy before the join
    return b"".join([_PACK_MAGIC, json.dumps(header).encode(), b"\n", *blobs])


def unpack_arrays(data: bytes) -> dict:
    """Inverse of `pack_arrays`: read-only views of ``data`` (no copy).

    Every consumer builds new arrays from these (take, concat, select), so
    copying each piece once more on read would only cost memory bandwidth.
    """
    if not data.startswith(_PACK_MAGIC):
        raise ValueError("not a pack_arrays image")
    end = data.index(b"\n", len(_PACK_MAGIC))
    offset, arrays = end + 1, {}
    for name, dtype, shape, nbytes in json.loads(data[len(_PACK_MAGIC) : end]):
        arrays[name] = np.frombuffer(
            data, np.dtype(dtype), count=nbytes // max(1, np.dtype(dtype).itemsize), offset=offset
        ).reshape(tuple(shape))
        offset += nbytes
    return arrays


def concat(batches) -> PositionBatch | None:
    """One batch holding every position of ``batches`` (None if there are none)."""
    batches = [b for b in batches if len(b)]
    if not batches:
        return None
    fields = {}
    for name in _ARRAY_FIELDS:
        if name in _RAGGED:
            values = _RAGGED[name][0]
            shifts = np.cumsum([0] + [len(getattr(b, values)) for b in batches[:-1]])
            fields[name] = np.concatenate(
                [getattr(b, name)[:-1] + s for b, s in zip(batches, shifts)]
                + [[shifts[-1] + len(getattr(batches[-1], values))]]
            ).astype(np.int64)
        else:
            fields[name] = np.concatenate([getattr(b, name) for b in batches])
    return PositionBatch(board_size=batches[0].board_size, **fields)


def history_planes(fresh: np.ndarray, move_number: np.ndarray) -> np.ndarray:
    """uint8[P, packed 16 planes] from fresh planes uint8[P, 2, NN] of whole games.

    ``fresh`` holds the positions of one or more games back to back and
    ``move_number`` each position's index within its game, so position p's
    game started at row p - move_number[p].  Position p has Black to move
    for even move numbers (no handicap).  Plane ``OWN_STONES + k`` of
    position p is row p - k's stones of the side to move at p, plane
    ``OPPONENT_STONES + k`` the other colour's, zeros when move_number[p] < k
    (format/planes.py, whose `record_planes` is the reference this is tested
    against).  The compiled kernel (pipeline/_history.pyx) packs the bits
    directly: planes are N*N bits, not whole bytes, so numpy had to unpack
    and repack ~1.3 KB per position.
    """
    import pipeline._history as _history  # compiled; imported late like the engine (labels._engine)

    p = len(fresh)
    fresh = np.ascontiguousarray(fresh, dtype=np.uint8).reshape(p, 2, -1)
    out = np.empty((p, (schema.PACKED_PLANES * fresh.shape[2] + 7) // 8), np.uint8)  # packed_plane_bytes(N, 16)
    _history.pack_history(fresh, np.ascontiguousarray(move_number, dtype=np.int32), out)
    return out


def recent_moves(
    fresh: np.ndarray, moves: np.ndarray, move_number: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(moves int32[P, 7], capture offsets int64[P+1], captures int64[C]) of whole games.

    ``fresh`` uint8[P, 2, NN] and ``moves`` (the move played at each row)
    hold games back to back, ``move_number`` each row's index in its game,
    as in `history_planes`.  Row p's moves are those of rows p-1 .. p-7
    (NN + 1 where the game had not started); the stones move p-k captured
    are the stones on row p-k's board that row p-k+1's lacks (a move only
    removes stones by capturing), entered as (k - 1) * NN + point.
    """
    positions, nn = fresh.shape[0], fresh.shape[2]
    history = np.full((positions, schema.HISTORY_MOVES), nn + schema.NO_MOVE_OFFSET, np.int32)
    lost = np.zeros((positions, nn), bool)  # lost[r]: points emptied by the move at row r
    if positions > 1:
        lost[:-1] = ((fresh[:-1] & ~fresh[1:]) != 0).any(axis=1)
    entries, owners = [], []
    for age in range(1, schema.HISTORY_MOVES + 1):
        valid = np.flatnonzero(move_number >= age)
        history[valid, age - 1] = moves[valid - age]
        row, point = np.nonzero(lost[valid - age])
        owners.append(valid[row])
        entries.append((age - 1) * nn + point)
    owner = np.concatenate(owners)
    entry = np.concatenate(entries).astype(np.int64)
    order = np.lexsort((entry, owner))
    counts = np.bincount(owner, minlength=positions)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return history, offsets, entry[order]


_KEY_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


def _mix64(h: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: every input bit reaches every output bit."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def position_keys(planes: np.ndarray, to_play: np.ndarray, move_number: np.ndarray, max_move: int) -> np.ndarray:
    """uint64 dedup keys of the positions before ``max_move``; 0 for the rest.

    A 64-bit hash of (history planes, side to move), vectorized over the
    positions: the packed planes are read as little-endian 64-bit words and
    folded in one column at a time (h = mix(h ^ word) per column), so the
    cost is a few array operations per word of a position, not a hash call
    per position.  Keys only need to be equal for equal positions and
    distinct otherwise: a chance collision of two 63-bit keys in a window of
    millions of early positions is ~1e-7 and would merge two targets.
    """
    keys = np.zeros(len(planes), dtype=np.uint64)
    rows = np.flatnonzero(move_number < max_move)
    if not len(rows):
        return keys
    data = planes[rows]
    pad = -data.shape[1] % 8
    if pad:
        data = np.concatenate([data, np.zeros((len(rows), pad), np.uint8)], axis=1)
    words = np.ascontiguousarray(data).view("<u8")
    h = _mix64(to_play[rows].astype(np.int64).astype(np.uint64) + np.uint64(words.shape[1]))
    for column in range(words.shape[1]):
        h = _mix64((h ^ words[:, column]) * _KEY_MULTIPLIER)
    keys[rows] = h | np.uint64(1)  # never 0, which means "not keyed"
    return keys


def dedup_partition(keys: np.ndarray, num_partitions: int) -> np.ndarray:
    """int64 dedup partition of each (nonzero) key.

    The low bit of every key is forced to 1 (`position_keys`), so the
    partition comes from the other 63 bits: ``key % 2`` would send every key
    to partition 1 of 2.
    """
    return ((keys >> np.uint64(1)) % np.uint64(num_partitions)).astype(np.int64)


def games_positions(
    games: Sequence[GameRecord], labels: Sequence[EndstateLabel], instances: Sequence[int], dedup_max_move: int
) -> PositionBatch | None:
    """Every position of ``games`` (one board size) with its targets and weights.

    Built for all the games at once: per-game values (result, label, ids)
    are repeated over each game's positions and every per-position step is
    one array operation over the whole batch, so the cost per game is a few
    list appends, not dozens of small numpy calls.  None if there are no
    positions.
    """
    games = list(games)
    lengths = np.array([g.num_positions for g in games], dtype=np.int64)
    total = int(lengths.sum()) if len(lengths) else 0
    if total == 0:
        return None
    n = games[0].board_size
    per_game = lambda values, dtype: np.repeat(np.asarray(values, dtype=dtype), lengths)  # noqa: E731
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    move_number = (np.arange(total) - np.repeat(starts, lengths)).astype(np.int32)
    black_to_move = move_number % 2 == 0
    to_play = np.where(black_to_move, schema.BLACK, schema.WHITE).astype(np.int8)
    fresh = np.concatenate([np.asarray(g.planes, dtype=np.uint8).reshape(-1, 2, n * n) for g in games])
    moves = np.concatenate([np.asarray(g.moves, np.int64) for g in games])
    history_moves, capture_offsets, captures = recent_moves(fresh, moves, move_number)
    # The dedup key hashes the 16 history planes (the network's view of the
    # position); they are built here only for that, then dropped.
    keys = position_keys(history_planes(fresh, move_number), to_play, move_number, dedup_max_move)

    # Policy: visit counts (or quantized probabilities) -> probabilities.
    # Decoded games keep them flat (codec.Segments): no per-position arrays.
    flat_index = [codec.flat_segments(g.policy_indices) for g in games]
    flat_visits = [codec.flat_segments(g.policy_values)[0] for g in games]
    counts = np.concatenate([np.diff(o) for _, o in flat_index])
    offsets = np.zeros(total + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    if offsets[-1]:
        index = np.concatenate([i for i, _ in flat_index]).astype(np.int64)
        visits = np.concatenate(flat_visits).astype(np.float64)
        nonempty = counts > 0
        totals = np.add.reduceat(visits, offsets[:-1][nonempty])
        prob = (visits / np.repeat(totals, counts[nonempty])).astype(np.float32)
    else:
        index, prob = np.zeros(0, np.int64), np.zeros(0, np.float32)
    full_search = np.concatenate([np.asarray(g.full_search, bool) for g in games])
    policy_weight = ((counts > 0) & full_search).astype(np.float32)

    # Value and score: the recorded result; the score of a two-pass game as
    # recorded, else the label's; both from the side to move.
    winner = per_game([g.winner for g in games], np.float32)
    value_known = [g.winner != 0 or g.end_reason == schema.END_TWO_PASSES for g in games]
    score_black = [
        g.score if g.end_reason == schema.END_TWO_PASSES and math.isfinite(g.score) else lab.score
        for g, lab in zip(games, labels)
    ]
    score_known = [math.isfinite(sc) and lab.source != schema.OWNERSHIP_NONE for sc, lab in zip(score_black, labels)]
    side = to_play.astype(np.float32)
    score = per_game([sc if known else 0.0 for sc, known in zip(score_black, score_known)], np.float32) * side
    label_weight = [lab.weight for lab in labels]
    # The labels' int8 rows (Black's side; the window game table's rows too),
    # negated for White to move: round(-x) = -round(x), so each position's
    # row is exactly its game's row seen from its side.
    own = np.repeat(game_label_rows(labels), lengths, axis=0)
    own[~black_to_move] *= -1
    ids = [g.game_id.encode() for g in games]
    return PositionBatch(
        board_size=n,
        board=codec.pack_trits(fresh[:, 0] + 2 * fresh[:, 1]),
        moves=history_moves,
        capture_offsets=capture_offsets,
        captures=captures,
        to_play=to_play,
        policy_offsets=offsets,
        policy_index=index,
        policy_prob=prob,
        value=winner * side,
        score=score,
        ownership=own,
        policy_weight=policy_weight,
        value_weight=per_game([1.0 if k else 0.0 for k in value_known], np.float32),
        ownership_weight=per_game(label_weight, np.float32),
        score_weight=per_game([w if k else 0.0 for w, k in zip(label_weight, score_known)], np.float32),
        game_id=per_game(ids, f"S{max(1, max(len(i) for i in ids))}"),
        move_number=move_number,
        generation=per_game([g.generation for g in games], np.int32),
        instance=per_game(instances, np.int64),
        key=keys,
    )


def game_label_rows(labels: Sequence[EndstateLabel]) -> np.ndarray:
    """int8[G, NN]: each game's ownership label as ``round(127 * o)`` from Black's side.

    These are the window game table's rows (SPEC.md "Window game table") and,
    negated for White to move, every position's row in `games_positions`.
    """
    return label_rows(np.stack([np.asarray(lab.ownership, np.float32) for lab in labels]))


def game_digest(game: GameRecord) -> bytes:
    """16 bytes that are equal for games with the same board size, komi and moves.

    The id is left out on purpose: a re-uploaded copy of a game has the same id,
    but two workers started with the same seed (two loops on one root) write the
    same games under different ids, and either way the window would hold the same
    positions twice.  Games that differ in any move differ here.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{game.board_size}/{float(game.komi)!r}/".encode())
    h.update(np.asarray(game.moves, dtype="<u2").tobytes())
    return h.digest()


def _weighted_mean(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Mean over axis 0 weighted by ``weights``; plain mean when they sum to 0."""
    total = weights.sum()
    if total <= 0:
        return values.mean(axis=0)
    return np.tensordot(weights, values, axes=1) / total


def cap_positions(batch: PositionBatch, cap: int) -> tuple[PositionBatch, dict]:
    """Keep each key at most ``cap`` times; the kept copies carry the merged targets.

    Positions with key 0 pass through.  For a key seen c > cap times, the
    first ``cap`` occurrences (by instance, then move) are kept and every one
    of them gets the mean of all c targets: policy = mean of the merged
    policy targets (weighted by policy_weight, i.e. over the searched
    occurrences), value/score/ownership = means weighted by their weights.
    Weights are the largest of the merged ones: a weight written on purpose
    (0 for a fast-search position, less than 1 for a played-out label) is
    kept, never rescaled.  Returns the capped batch and statistics.
    """
    order = np.lexsort((batch.move_number, batch.instance, batch.key))
    keys = batch.key[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    counts = np.diff(np.r_[starts, len(keys)])
    keep_rows, merged = [], {}
    for start, count in zip(starts.tolist(), counts.tolist()):
        rows = order[start : start + count]
        if keys[start] == 0 or count <= cap:
            keep_rows.extend(rows.tolist())
            continue
        kept = rows[:cap]
        keep_rows.extend(kept.tolist())
        target = _merged_target(batch, rows)
        for r in kept.tolist():
            merged[r] = target
    out = batch.take(np.sort(np.asarray(keep_rows, dtype=np.int64)))
    stats = {
        "capped_keys": int(((counts > cap) & (keys[starts] != 0)).sum()),
        "capped_positions_removed": len(batch) - len(out),
    }
    if merged:
        out = _apply_merged(out, batch, np.sort(np.asarray(keep_rows, dtype=np.int64)), merged)
    return out, stats


def _merged_target(batch: PositionBatch, rows: np.ndarray) -> dict:
    actions = batch.board_size**2 + 1
    dense = np.zeros((len(rows), actions), np.float64)
    for j, r in enumerate(rows.tolist()):
        index, prob = batch.policy(r)
        dense[j, index] = prob
    pw = batch.policy_weight[rows].astype(np.float64)
    policy = _weighted_mean(dense, pw) if pw.sum() > 0 else np.zeros(actions)
    ownership = _weighted_mean(batch.ownership[rows].astype(np.float64), batch.ownership_weight[rows])
    nonzero = np.flatnonzero(policy > 0)
    return {
        "policy_index": nonzero,
        "policy_prob": policy[nonzero].astype(np.float32),
        "value": _weighted_mean(batch.value[rows].astype(np.float64), batch.value_weight[rows]),
        "score": _weighted_mean(batch.score[rows].astype(np.float64), batch.score_weight[rows]),
        "ownership": np.clip(np.round(ownership), -127, 127).astype(np.int8),
        "policy_weight": pw.max(),
        "value_weight": batch.value_weight[rows].max(),
        "ownership_weight": batch.ownership_weight[rows].max(),
        "score_weight": batch.score_weight[rows].max(),
    }


def _apply_merged(out: PositionBatch, source: PositionBatch, source_rows: np.ndarray, merged: dict) -> PositionBatch:
    """Replace the targets of the rows of ``out`` that came from merged keys.

    Only the merged rows (a few per capped key) are visited in Python; the
    policy arrays of all the others are moved by one vectorized gather.
    """
    position_of = {r: i for i, r in enumerate(source_rows.tolist()) if r in merged}
    rows = np.array(sorted(position_of.values()), np.int64)
    targets = [merged[r] for r in sorted(position_of, key=position_of.__getitem__)]
    for name in ("value", "score", "policy_weight", "value_weight", "ownership_weight", "score_weight"):
        getattr(out, name)[rows] = [t[name] for t in targets]
    if len(rows):
        out.ownership[rows] = np.stack([t["ownership"] for t in targets])
    old_offsets = out.policy_offsets
    counts = np.diff(old_offsets)
    counts[rows] = [len(t["policy_index"]) for t in targets]
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    index = np.empty(offsets[-1], np.int64)
    prob = np.empty(offsets[-1], np.float32)
    kept = np.ones(len(counts), bool)
    kept[rows] = False
    kept_counts = counts[kept]
    # Destination and source positions of every kept entry, as in take().
    to = np.repeat(offsets[:-1][kept], kept_counts) + _ranks_within(kept_counts)
    frm = np.repeat(old_offsets[:-1][kept], kept_counts) + _ranks_within(kept_counts)
    index[to], prob[to] = out.policy_index[frm], out.policy_prob[frm]
    for i, target in zip(rows.tolist(), targets):
        index[offsets[i] : offsets[i + 1]] = target["policy_index"]
        prob[offsets[i] : offsets[i + 1]] = target["policy_prob"]
    out.policy_offsets, out.policy_index, out.policy_prob = offsets, index, prob
    return out


def _ranks_within(counts: np.ndarray) -> np.ndarray:
    """0..c-1 for each count c, end to end."""
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    return np.arange(total) - np.repeat(starts, counts)


def assign_copies(
    instance: np.ndarray, reuse: float, num_shards: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(row, shard) of every copy: floor(r) + Bernoulli(frac(r)) copies per row.

    Copies of one game instance are dealt round-robin over the shards from a
    random start, in random order, so no shard gets more than
    ceil(copies / num_shards) of a game.
    """
    whole, frac = math.floor(reuse), reuse - math.floor(reuse)
    copies = whole + (rng.random(len(instance)) < frac).astype(np.int64)
    rows = np.repeat(np.arange(len(instance)), copies)
    if not len(rows):
        return rows, rows.copy()
    games = instance[rows]
    order = np.lexsort((rng.random(len(rows)), games))
    rows, games = rows[order], games[order]
    starts = np.flatnonzero(np.r_[True, games[1:] != games[:-1]])
    lengths = np.diff(np.r_[starts, len(rows)])
    rank = np.arange(len(rows)) - np.repeat(starts, lengths)
    first = np.repeat(rng.integers(0, num_shards, len(starts)), lengths)
    return rows, (first + rank) % num_shards


# --- temporary shard pieces ------------------------------------------------


@dataclasses.dataclass
class ShardPiece:
    """Positions bound for one shard, with what phase 2 needs to filter.

    Version-2 records group POSITION_GROUP consecutive positions of the
    shard's final order, so a piece carries positions, not records: phase 2
    permutes the shard's positions, then encodes and frames each group.
    """

    batch: PositionBatch

    def __len__(self) -> int:
        return len(self.batch)

    @property
    def instance(self) -> np.ndarray:
        """int64[R] game instance of each position (to drop duplicate games)."""
        return self.batch.instance

    @property
    def generation(self) -> np.ndarray:
        """int32[R]"""
        return self.batch.generation

    def to_bytes(self) -> bytes:
        return self.batch.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> "ShardPiece":
        return cls(PositionBatch.from_bytes(data))


def game_table_index(table_instances: np.ndarray, instance: np.ndarray) -> np.ndarray:
    """int64 index of each ``instance`` in the window's game table (its sorted instances)."""
    index = np.searchsorted(table_instances, instance)
    if len(instance) and (index.max() >= len(table_instances) or (table_instances[index] != instance).any()):
        raise ValueError("a position's game instance is missing from the window's game table")
    return index.astype(np.int64)


def after_resignation(games: Sequence[GameRecord]) -> np.ndarray:
    """bool over the positions of ``games`` in order (`games_positions`' rows): recorded after a
    resignation, while self-play finished the game with cheap moves (``accelerated_from`` on)."""
    return (
        np.concatenate(
            [
                np.arange(g.num_positions)
                >= (
                    g.accelerated_from
                    if g.accelerated_from >= 0 and g.end_reason == schema.END_RESIGN
                    else g.num_positions
                )
                for g in games
            ]
        )
        if games
        else np.zeros(0, bool)
    )


def thin_after_resignation_rows(
    batch: PositionBatch, after: np.ndarray, after_resignation_rows: float, rng: np.random.Generator
) -> tuple[PositionBatch, int]:
    """(``batch`` keeping every row before a resignation and ``after_resignation_rows`` of those
    after it (``after``, row-aligned), rows dropped).  Those rows' moves come from a 2-simulation
    search and their result is the resignation's; 1 keeps the batch as it is without drawing."""
    if after_resignation_rows >= 1.0 or not after.any():
        return batch, 0
    keep = ~after | (rng.random(len(batch)) < after_resignation_rows)
    dropped = int(len(batch) - np.count_nonzero(keep))
    return (batch.take(np.flatnonzero(keep)) if dropped else batch), dropped


def thin_value_only_rows(
    batch: PositionBatch, value_only_rows: float, rng: np.random.Generator
) -> tuple[PositionBatch, int]:
    """(``batch`` keeping every row with a policy target and ``value_only_rows`` of the others,
    rows dropped).

    A row without a policy target (its move had a fast search) still teaches the value,
    ownership and score heads, but it is a near copy of its game's other rows for those
    targets, and by the global-batch normalization it dilutes the policy's share of every
    batch.  Each such row is kept with probability ``value_only_rows`` (independent draws,
    so the expected count is what the window plan sized the window by).  1 keeps the batch
    as it is without drawing.
    """
    if value_only_rows >= 1.0:
        return batch, 0
    value_only = batch.policy_weight == 0
    keep = ~value_only | (rng.random(len(batch)) < value_only_rows)
    dropped = int(len(batch) - np.count_nonzero(keep))
    return (batch.take(np.flatnonzero(keep)) if dropped else batch), dropped


def split_for_shards(batch: PositionBatch, reuse: float, num_shards: int, rng: np.random.Generator) -> dict:
    """{shard: ShardPiece} for every copy of every position in ``batch``."""
    rows, shards = assign_copies(batch.instance, reuse, num_shards, rng)
    pieces = {}
    order = np.argsort(shards, kind="stable")
    rows, shards = rows[order], shards[order]
    bounds = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1], True])
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        pieces[int(shards[lo])] = ShardPiece(batch.take(rows[lo:hi]))
    return pieces
