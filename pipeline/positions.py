"""Training positions as batches of numpy arrays: build, cap, copy, serialize.

The Beam job never moves one position per element.  A `PositionBatch` is a
struct of arrays for P positions (any number of games); every step here is a
whole-array operation or, where a loop is unavoidable, a loop over games.

Terms
-----
* ``N`` board size, ``NN = N*N`` points, ``A = NN + 1`` actions.
* *fresh planes*: a game record keeps, for each position, only its own
  board (uint8[M, 2, N, N], Black plane then White plane).
* *history planes*: the 16 packed planes of a position record (schema):
  planes 0-7 the side to move's stones at t..t-7, 8-15 the opponent's, zero
  before the game's start.  `game_positions` builds them for a whole game
  with one fancy-indexing gather.
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

import numpy as np

from format import codec
from format import schema as S
from format.codec import GameRecord
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

    def encode_framed(self) -> tuple[bytes, np.ndarray]:
        """(TFRecord frames end to end, int64[P+1] offsets) (codec.encode_positions_framed)."""
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
        value = np.asarray(value)  # tobytes() below is C order whatever the layout
        if value.dtype.hasobject:
            raise ValueError(f"array {name!r} has an object dtype")
        header.append([name, value.dtype.str, list(value.shape), value.nbytes])
        blobs.append(value.tobytes())
    return b"".join([_PACK_MAGIC, json.dumps(header).encode(), b"\n", *blobs])


def unpack_arrays(data: bytes) -> dict:
    """Inverse of `pack_arrays` (writable copies)."""
    if not data.startswith(_PACK_MAGIC):
        raise ValueError("not a pack_arrays image")
    end = data.index(b"\n", len(_PACK_MAGIC))
    offset, arrays = end + 1, {}
    for name, dtype, shape, nbytes in json.loads(data[len(_PACK_MAGIC):end]):
        arrays[name] = np.frombuffer(data, np.dtype(dtype), count=nbytes // max(1, np.dtype(dtype).itemsize),
                                     offset=offset).reshape(tuple(shape)).copy()
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


def history_planes(fresh: np.ndarray) -> np.ndarray:
    """uint8[M, packed 16 planes] from a game's fresh planes uint8[M, 2, N, N].

    Position i has Black to move for even i (no handicap).  Two gathers
    build all M x 8 history slots: slot k of position i is colour c of
    fresh[i - k] (c = the side to move at i for planes 0-7, the other
    colour for 8-15), or zeros for i - k < 0.
    """
    m, _, n, _ = fresh.shape
    padded = np.zeros((m + S.HISTORY_LENGTH - 1, 2, n * n), np.uint8)
    padded[S.HISTORY_LENGTH - 1:] = fresh.reshape(m, 2, n * n)
    slots = np.arange(m)[:, None] + (S.HISTORY_LENGTH - 1) - np.arange(S.HISTORY_LENGTH)[None, :]
    mover = (np.arange(m) % 2)[:, None]  # plane index of the side to move: 0 Black, 1 White
    planes = np.empty((m, S.PACKED_PLANES, n * n), np.uint8)
    planes[:, :S.HISTORY_LENGTH] = padded[slots, mover]
    planes[:, S.HISTORY_LENGTH:] = padded[slots, 1 - mover]
    return np.packbits(planes.reshape(m, S.PACKED_PLANES * n * n), axis=1, bitorder="big")


def position_keys(planes: np.ndarray, to_play: np.ndarray, move_number: np.ndarray, max_move: int) -> np.ndarray:
    """uint64 dedup keys of the positions before ``max_move``; 0 for the rest."""
    keys = np.zeros(len(planes), dtype=np.uint64)
    for i in np.flatnonzero(move_number < max_move).tolist():
        digest = hashlib.blake2b(planes[i].tobytes() + bytes([int(to_play[i]) & 0xFF]), digest_size=8).digest()
        keys[i] = int.from_bytes(digest, "little") | 1  # never 0, which means "not keyed"
    return keys


def game_positions(game: GameRecord, label: EndstateLabel, instance: int, dedup_max_move: int) -> PositionBatch:
    """Every position of one game with its targets and weights."""
    n, m = game.board_size, game.num_positions
    move_number = np.arange(m, dtype=np.int32)
    to_play = np.where(move_number % 2 == 0, S.BLACK, S.WHITE).astype(np.int8)
    planes = history_planes(np.asarray(game.planes, dtype=np.uint8))

    counts = np.array([len(v) for v in game.policy_values], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    if offsets[-1]:
        index = np.concatenate(game.policy_indices).astype(np.int64)
        visits = np.concatenate(game.policy_values).astype(np.float64)
        totals = np.add.reduceat(visits, offsets[:-1][counts > 0])
        prob = (visits / np.repeat(totals, counts[counts > 0])).astype(np.float32)
    else:
        index, prob = np.zeros(0, np.int64), np.zeros(0, np.float32)
    policy_weight = ((counts > 0) & np.asarray(game.full_search, bool)).astype(np.float32)

    value_known = game.winner != 0 or game.end_reason == S.END_TWO_PASSES
    value = (game.winner * to_play).astype(np.float32)
    score_black = game.score if game.end_reason == S.END_TWO_PASSES and math.isfinite(game.score) else label.score
    score_known = math.isfinite(score_black) and label.source != S.OWNERSHIP_NONE
    score = (np.float32(score_black if score_known else 0.0) * to_play).astype(np.float32)
    own = np.clip(np.round(label.ownership[None, :] * to_play[:, None] * S.OWNERSHIP_SCALE), -127, 127)
    return PositionBatch(
        board_size=n, planes=planes, to_play=to_play, policy_offsets=offsets, policy_index=index,
        policy_prob=prob, value=value, score=score, ownership=own.astype(np.int8),
        policy_weight=policy_weight, value_weight=np.full(m, 1.0 if value_known else 0.0, np.float32),
        ownership_weight=np.full(m, label.weight, np.float32),
        score_weight=np.full(m, label.weight if score_known else 0.0, np.float32),
        game_id=np.full(m, game.game_id.encode(), dtype=f"S{max(1, len(game.game_id.encode()))}"),
        move_number=move_number, generation=np.full(m, game.generation, np.int32),
        instance=np.full(m, instance, np.int64), key=position_keys(planes, to_play, move_number, dedup_max_move))


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
    """Replace the targets of the rows of ``out`` that came from merged keys."""
    indices, probs = [], []
    for i, r in enumerate(source_rows.tolist()):
        target = merged.get(r)
        if target is None:
            index, prob = out.policy(i)
        else:
            index, prob = target["policy_index"], target["policy_prob"]
            for name in ("value", "score", "policy_weight", "value_weight", "ownership_weight", "score_weight"):
                getattr(out, name)[i] = target[name]
            out.ownership[i] = target["ownership"]
        indices.append(np.asarray(index, np.int64))
        probs.append(np.asarray(prob, np.float32))
    out.policy_offsets = np.concatenate([[0], np.cumsum([len(x) for x in indices])]).astype(np.int64)
    out.policy_index = np.concatenate(indices) if indices else np.zeros(0, np.int64)
    out.policy_prob = np.concatenate(probs) if probs else np.zeros(0, np.float32)
    return out


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

    frames: bytes
    """TFRecord frames (length, CRCs, data) end to end: framing happens once
    per position in phase 1, not once per copy in phase 2."""
    offsets: np.ndarray
    """int64[R+1]: frame i is ``frames[offsets[i]:offsets[i+1]]``."""
    instance: np.ndarray
    """int64[R] game instance of each record (to drop duplicate games)."""
    generation: np.ndarray
    """int32[R]"""

    def __len__(self) -> int:
        return len(self.instance)

    def to_bytes(self) -> bytes:
        return pack_arrays({"frames": np.frombuffer(self.frames, np.uint8), "offsets": self.offsets,
                            "instance": self.instance, "generation": self.generation})

    @classmethod
    def from_bytes(cls, data: bytes) -> "ShardPiece":
        arrays = unpack_arrays(data)
        return cls(arrays["frames"].tobytes(), arrays["offsets"], arrays["instance"], arrays["generation"])


def join_frames(pieces, order: np.ndarray) -> bytes:
    """The frames of ``pieces`` (read as one list of records) in ``order``."""
    blob = b"".join(p.frames for p in pieces)
    starts, ends = [], []
    base = 0
    for p in pieces:
        starts.append(p.offsets[:-1] + base)
        ends.append(p.offsets[1:] + base)
        base += len(p.frames)
    if not starts:
        return b""
    lo = np.concatenate(starts)[order].tolist()
    hi = np.concatenate(ends)[order].tolist()
    return b"".join([blob[a:b] for a, b in zip(lo, hi)])


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
        pieces[int(shards[lo])] = ShardPiece(*_pick_frames(frames, offsets, picked), batch.instance[picked],
                                             batch.generation[picked])
    return pieces


def _pick_frames(frames: bytes, offsets: np.ndarray, rows: np.ndarray) -> tuple[bytes, np.ndarray]:
    lo, hi = offsets[rows], offsets[rows + 1]
    picked = b"".join([frames[a:b] for a, b in zip(lo.tolist(), hi.tolist())])
    new_offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(hi - lo, out=new_offsets[1:])
    return picked, new_offsets
