"""Training positions as batches of numpy arrays: build, cap, copy, serialize.

The Beam job never moves one position per element.  A `PositionBatch` is a
struct of arrays for P positions (any number of games); every step here is a
whole-array operation or, where a loop is unavoidable, a loop over games.

Terms
-----
* ``N`` board size, ``NN = N*N`` points, ``A = NN + 1`` actions.
* *fresh planes*: a game record keeps, for each position, only its own
  board (uint8[M, 2, N, N], Black plane then White plane).
* *history planes*: the 16 packed planes of a position record, input
  channels 0-15 in format/planes.py's layout: planes 0-7 the side to move's
  stones at t..t-7, 8-15 the opponent's, zero before the game's start.
  `games_positions` builds them for a whole bundle of games at once
  (`history_planes`).
* *instance*: a game's number within this run (bundle chunk index << 20 |
  game index); exact duplicate games are dropped by instance.
* *key*: 64-bit hash of (history planes, side to move) for positions early
  enough to be capped (move number < dedup_max_move); 0 for the rest.
* *copies*: each position goes to the shards floor(r) + Bernoulli(frac(r))
  times (r = reuse), which has the lowest spread of any integer count with
  mean r, and each game's copies are dealt round-robin over the shards from a
  random start, so a game is spread as evenly as it can be.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Sequence

import numpy as np

from format import codec
from format import schema as S
from format.codec import GameRecord
from format.tfrecord import select_frames
from pipeline.labels import EndstateLabel

INSTANCE_SHIFT = 20
"""instance = chunk index << 20 | game index within the chunk."""

_ARRAY_FIELDS = ("planes", "to_play", "policy_offsets", "policy_index", "policy_prob", "value", "score",
                 "ownership", "policy_weight", "value_weight", "ownership_weight", "score_weight",
                 "game_id", "move_number", "generation", "instance", "key")


@dataclasses.dataclass
class PositionBatch:
    """P training positions of one board size, targets already in record form."""

    board_size: int
    planes: np.ndarray
    """uint8[P, packed_plane_bytes(N, 16)] history planes (module docstring)."""
    to_play: np.ndarray
    """int8[P]: BLACK or WHITE."""
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

    def __len__(self) -> int:
        return len(self.to_play)

    def take(self, rows) -> "PositionBatch":
        """The positions at ``rows`` (an int array), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        starts, ends = self.policy_offsets[rows], self.policy_offsets[rows + 1]
        lengths = ends - starts
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        fields = {name: getattr(self, name)[rows] for name in _ARRAY_FIELDS
                  if name not in ("policy_offsets", "policy_index", "policy_prob")}
        return PositionBatch(board_size=self.board_size, policy_offsets=offsets,
                             policy_index=self.policy_index[gather], policy_prob=self.policy_prob[gather], **fields)

    def policy(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.policy_offsets[i], self.policy_offsets[i + 1]
        return self.policy_index[lo:hi], self.policy_prob[lo:hi]

    def encode(self) -> list[bytes]:
        """Serialized position records, one per row (codec.encode_positions)."""
        return codec.encode_positions(**self._record_fields())

    def encode_framed(self) -> tuple[np.ndarray, np.ndarray]:
        """(TFRecord frames end to end uint8[total], int64[P+1] offsets) (codec.encode_positions_framed)."""
        return codec.encode_positions_framed(**self._record_fields())

    def _record_fields(self) -> dict:
        return dict(
            board_size=self.board_size, planes_packed=self.planes, to_play=self.to_play,
            policy_offsets=self.policy_offsets, policy_index=self.policy_index, policy_prob=self.policy_prob,
            value=self.value, score=self.score, ownership=self.ownership, policy_weight=self.policy_weight,
            value_weight=self.value_weight, ownership_weight=self.ownership_weight,
            score_weight=self.score_weight, game_id=self.game_id,
            move_number=self.move_number, generation=self.generation)

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

    The temporary pieces are written and read once each; np.savez's zip
    container (a CRC and a header per member) cost ~2 us a position here.
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
        blobs.append(memoryview(value.reshape(-1)).cast("B"))  # no copy before the join
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
    for name, dtype, shape, nbytes in json.loads(data[len(_PACK_MAGIC):end]):
        arrays[name] = np.frombuffer(data, np.dtype(dtype), count=nbytes // max(1, np.dtype(dtype).itemsize),
                                     offset=offset).reshape(tuple(shape))
        offset += nbytes
    return arrays


def concat(batches) -> PositionBatch | None:
    """One batch holding every position of ``batches`` (None if there are none)."""
    batches = [b for b in batches if len(b)]
    if not batches:
        return None
    fields = {}
    for name in _ARRAY_FIELDS:
        if name == "policy_offsets":
            shifts = np.cumsum([0] + [len(b.policy_index) for b in batches[:-1]])
            fields[name] = np.concatenate(
                [b.policy_offsets[:-1] + s for b, s in zip(batches, shifts)]
                + [[shifts[-1] + len(batches[-1].policy_index)]]).astype(np.int64)
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
    from pipeline import _history  # compiled; imported late like the engine (labels._engine)

    p = len(fresh)
    fresh = np.ascontiguousarray(fresh, dtype=np.uint8).reshape(p, 2, -1)
    out = np.empty((p, (S.PACKED_PLANES * fresh.shape[2] + 7) // 8), np.uint8)  # packed_plane_bytes(N, 16)
    _history.pack_history(fresh, np.ascontiguousarray(move_number, dtype=np.int32), out)
    return out


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


def games_positions(games: Sequence[GameRecord], labels: Sequence[EndstateLabel], instances: Sequence[int],
                    dedup_max_move: int) -> PositionBatch | None:
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
    to_play = np.where(black_to_move, S.BLACK, S.WHITE).astype(np.int8)
    fresh = np.concatenate([np.asarray(g.planes, dtype=np.uint8).reshape(-1, 2, n * n) for g in games])
    planes = history_planes(fresh, move_number)

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
    value_known = [g.winner != 0 or g.end_reason == S.END_TWO_PASSES for g in games]
    score_black = [g.score if g.end_reason == S.END_TWO_PASSES and math.isfinite(g.score) else lab.score
                   for g, lab in zip(games, labels)]
    score_known = [math.isfinite(sc) and lab.source != S.OWNERSHIP_NONE for sc, lab in zip(score_black, labels)]
    side = to_play.astype(np.float32)
    score = per_game([sc if known else 0.0 for sc, known in zip(score_black, score_known)], np.float32) * side
    label_weight = [lab.weight for lab in labels]
    ownership_black = np.stack([np.asarray(lab.ownership, np.float32) for lab in labels])
    own = np.repeat(ownership_black * np.float32(S.OWNERSHIP_SCALE), lengths, axis=0)
    own[~black_to_move] *= -1
    ids = [g.game_id.encode() for g in games]
    return PositionBatch(
        board_size=n, planes=planes, to_play=to_play, policy_offsets=offsets, policy_index=index,
        policy_prob=prob, value=winner * side, score=score,
        ownership=np.clip(np.round(own), -127, 127).astype(np.int8),
        policy_weight=policy_weight, value_weight=per_game([1.0 if k else 0.0 for k in value_known], np.float32),
        ownership_weight=per_game(label_weight, np.float32),
        score_weight=per_game([w if k else 0.0 for w, k in zip(label_weight, score_known)], np.float32),
        game_id=per_game(ids, f"S{max(1, max(len(i) for i in ids))}"),
        move_number=move_number, generation=per_game([g.generation for g in games], np.int32),
        instance=per_game(instances, np.int64), key=position_keys(planes, to_play, move_number, dedup_max_move))


def game_digest(game: GameRecord) -> bytes:
    """16 bytes that are equal for exact duplicates of one game."""
    h = hashlib.blake2b(digest_size=16)
    h.update(game.game_id.encode() + b"\0" + str(game.generation).encode() + b"\0")
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
        rows = order[start:start + count]
        if keys[start] == 0 or count <= cap:
            keep_rows.extend(rows.tolist())
            continue
        kept = rows[:cap]
        keep_rows.extend(kept.tolist())
        target = _merged_target(batch, rows)
        for r in kept.tolist():
            merged[r] = target
    out = batch.take(np.sort(np.asarray(keep_rows, dtype=np.int64)))
    stats = {"capped_keys": int(((counts > cap) & (keys[starts] != 0)).sum()),
             "capped_positions_removed": len(batch) - len(out)}
    if merged:
        out = _apply_merged(out, batch, np.sort(np.asarray(keep_rows, dtype=np.int64)), merged)
    return out, stats


def _merged_target(batch: PositionBatch, rows: np.ndarray) -> dict:
    actions = batch.board_size ** 2 + 1
    dense = np.zeros((len(rows), actions), np.float64)
    for j, r in enumerate(rows.tolist()):
        index, prob = batch.policy(r)
        dense[j, index] = prob
    pw = batch.policy_weight[rows].astype(np.float64)
    policy = _weighted_mean(dense, pw) if pw.sum() > 0 else np.zeros(actions)
    ownership = _weighted_mean(batch.ownership[rows].astype(np.float64), batch.ownership_weight[rows])
    nonzero = np.flatnonzero(policy > 0)
    return {
        "policy_index": nonzero, "policy_prob": policy[nonzero].astype(np.float32),
        "value": _weighted_mean(batch.value[rows].astype(np.float64), batch.value_weight[rows]),
        "score": _weighted_mean(batch.score[rows].astype(np.float64), batch.score_weight[rows]),
        "ownership": np.clip(np.round(ownership), -127, 127).astype(np.int8),
        "policy_weight": pw.max(), "value_weight": batch.value_weight[rows].max(),
        "ownership_weight": batch.ownership_weight[rows].max(), "score_weight": batch.score_weight[rows].max(),
    }


def _apply_merged(out: PositionBatch, source: PositionBatch, source_rows: np.ndarray, merged: dict) -> PositionBatch:
    """Replace the targets of the rows of ``out`` that came from merged keys.

    Only the merged rows (a few per capped key) are visited in Python; the
    policy arrays of all the others are moved by one vectorized gather.
    """
    position_of = {r: i for i, r in enumerate(source_rows.tolist()) if r in merged}
    rows = np.array(sorted(position_of.values()), np.int64)
    targets = [merged[r] for r in sorted(position_of, key=position_of.get)]
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
        index[offsets[i]:offsets[i + 1]] = target["policy_index"]
        prob[offsets[i]:offsets[i + 1]] = target["policy_prob"]
    out.policy_offsets, out.policy_index, out.policy_prob = offsets, index, prob
    return out


def _ranks_within(counts: np.ndarray) -> np.ndarray:
    """0..c-1 for each count c, end to end."""
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    return np.arange(total) - np.repeat(starts, counts)


def assign_copies(instance: np.ndarray, reuse: float, num_shards: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
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
    """Framed records bound for one shard, with what phase 2 needs to filter."""

    frames: np.ndarray
    """uint8: TFRecord frames (length, CRCs, data) end to end: framing happens
    once per position in phase 1, not once per copy in phase 2."""
    offsets: np.ndarray
    """int64[R+1]: frame i is ``frames[offsets[i]:offsets[i+1]]``."""
    instance: np.ndarray
    """int64[R] game instance of each record (to drop duplicate games)."""
    generation: np.ndarray
    """int32[R]"""

    def __len__(self) -> int:
        return len(self.instance)

    def to_bytes(self) -> bytes:
        return pack_arrays({"frames": self.frames, "offsets": self.offsets,
                            "instance": self.instance, "generation": self.generation})

    @classmethod
    def from_bytes(cls, data: bytes) -> "ShardPiece":
        arrays = unpack_arrays(data)
        return cls(arrays["frames"], arrays["offsets"], arrays["instance"], arrays["generation"])


def join_frames(pieces, order: np.ndarray) -> np.ndarray:
    """The frames of ``pieces`` (read as one list of records) in ``order``, end to end (uint8)."""
    if not pieces:
        return np.zeros(0, np.uint8)
    frames = np.concatenate([p.frames for p in pieces])
    bases = np.cumsum([0] + [len(p.frames) for p in pieces[:-1]])
    offsets = np.concatenate([p.offsets[:-1] + base for p, base in zip(pieces, bases)] + [[len(frames)]])
    return select_frames(frames, offsets, order)[0]


def split_for_shards(batch: PositionBatch, reuse: float, num_shards: int,
                     rng: np.random.Generator) -> dict:
    """{shard: ShardPiece} for every copy of every position in ``batch``.

    Each position is serialized and framed once (one batched call); its
    copies share the bytes.
    """
    frames, offsets = batch.encode_framed()
    rows, shards = assign_copies(batch.instance, reuse, num_shards, rng)
    pieces = {}
    order = np.argsort(shards, kind="stable")
    rows, shards = rows[order], shards[order]
    bounds = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1], True])
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        picked = rows[lo:hi]
        pieces[int(shards[lo])] = ShardPiece(*select_frames(frames, offsets, picked), batch.instance[picked],
                                             batch.generation[picked])
    return pieces
