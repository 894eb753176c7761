"""Game records: one self-play game per record, many games per chunk (format/SPEC.md "Chunks").

Data flow::

    selfplay.worker --GameRecord--> encode_game() --record bytes--> selfplay.spool (one file a game)
    selfplay.spool --record bytes...--> frame_chunk() --chunk bytes--> Storage.write_new(games/...)
    Storage.read() --bytes--> read_chunk() / iter_chunk() --GameRecord...--> pipeline, format.inspect

`encode_chunk` (GameRecords to a chunk in one call) serves tests and
generated data; `chunk_records` undoes `frame_chunk` without decoding (the
spool compares a stored chunk's records with its own).

A record keeps the moves, the fresh board planes of every position
(bit-packed; the history planes are rebuilt by the Beam job), a sparse
quantized policy target per fully searched position, root values, the result
and the endstate.  Every decode validates what it reads and raises
FormatError naming the source (file and record index) and the field.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
from typing import Iterable, Iterator, Sequence

import numpy as np

from format import schema
from format.example_fields import FeatureReader, FormatError, parse_example, set_bytes, set_float, set_int64
from format.example_proto import Example
from format.tfrecord import (
    RecordError,
    compress_zstd,
    decompress_for,
    frame_records,
    iter_framed_records,
)

# --------------------------------------------------------------------------
# Game records
# --------------------------------------------------------------------------


class Segments(collections.abc.Sequence):
    """A list of 1-d arrays kept as one flat array plus offsets.

    `decode_game` returns each game's per-position policy indices and values
    this way: item i is ``flat[offsets[i]:offsets[i+1]]`` (a view), so
    decoding does not cut a game into one small array per position, and the
    shuffle job reads ``flat``/``offsets`` for whole bundles at once.  It
    behaves as the list it stands for (len, indexing, slicing, iteration).
    """

    __slots__ = ("flat", "offsets")

    def __init__(self, flat: np.ndarray, offsets: np.ndarray):
        self.flat, self.offsets = flat, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return [self[k] for k in range(start, stop, step)]
            stop = max(start, stop)
            base = self.offsets[start]
            return Segments(self.flat[base : self.offsets[stop]], self.offsets[start : stop + 1] - base)
        if isinstance(i, (np.ndarray, list)):
            return [self[int(k)] for k in np.arange(len(self))[i]]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"segment {i} out of range for {len(self)}")
        return self.flat[self.offsets[i] : self.offsets[i + 1]]

    def __repr__(self) -> str:
        return f"Segments({len(self)} items, {len(self.flat)} values)"


def flat_segments(items) -> tuple[np.ndarray, np.ndarray]:
    """(flat values, int64 offsets) of a list of arrays or of `Segments` (no copy then)."""
    if isinstance(items, Segments):
        return items.flat, np.asarray(items.offsets, np.int64)
    counts = np.fromiter((len(x) for x in items), np.int64, len(items))
    offsets = np.zeros(len(items) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    flat = np.concatenate([np.asarray(x) for x in items]) if offsets[-1] else np.zeros(0, np.int64)
    return flat, offsets


@dataclasses.dataclass
class GameRecord:
    """One self-play game.  ``M`` = number of moves = number of positions.

    Position ``i`` is the board *before* move ``i``; its side to move is
    Black for even ``i`` (no handicap).  Per-position arrays have length M.
    """

    board_size: int
    komi: float
    game_id: str
    generation: int
    worker_id: str
    moves: np.ndarray
    """int16[M] flat point indices, ``N*N`` = pass."""
    planes: np.ndarray
    """uint8[M, 2, N, N] 0/1: plane 0 Black stones, plane 1 White stones."""
    policy_indices: Sequence
    """M int arrays: sorted action indices with a nonzero target (empty = none).
    A list, or `Segments` when decoded."""
    policy_values: Sequence
    """M int arrays, same lengths: visit counts or quantized probabilities."""
    root_values: np.ndarray
    """float32[M] root value in [-1, 1] from the side to move (int8 at rest)."""
    full_search: np.ndarray
    """bool[M]: the position got the full search (playout-cap randomization)."""
    winner: int
    """BLACK, WHITE or 0 (draw / unknown)."""
    score: float
    """Final area score, Black's side, komi included; NaN if not played out."""
    end_reason: int
    """schema.END_*"""
    ownership: np.ndarray | None = None
    """int8[N*N] in {-1, 0, 1} from Black's side, or None."""
    ownership_source: int = schema.OWNERSHIP_NONE
    resign_enabled: bool = True
    would_resign: int = 0
    """Colour that would have resigned while resignation was disabled, else 0."""
    accelerated_from: int = -1
    """Move index where acceleration mode began, -1 if never."""
    seed: int = -1
    """Seed of the game's random stream (0 <= seed < 2**63), -1 if not recorded."""
    rules: str = schema.RULES_TROMP_TAYLOR
    version: int = schema.FORMAT_VERSION

    @property
    def num_positions(self) -> int:
        return int(len(self.moves))

    def policy_probs(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(indices, probabilities) of position ``i``'s target; empty if none."""
        values = np.asarray(self.policy_values[i], dtype=np.float64)
        total = values.sum()
        probs = values / total if total > 0 else values
        return np.asarray(self.policy_indices[i], dtype=np.int64), probs.astype(np.float32)


def _plane_bytes_per_position(board_size: int) -> int:
    return schema.packed_plane_bytes(board_size, 2)


def pack_ownership(ownership: np.ndarray) -> bytes:
    """int8[P] in {-1,0,1} -> 2 bits a point, 4 points a byte, point p in bits 2*(p%4)."""
    codes = np.zeros(len(ownership), dtype=np.uint8)
    codes[ownership == schema.BLACK] = schema.OWNERSHIP_CODE[schema.BLACK]
    codes[ownership == schema.WHITE] = schema.OWNERSHIP_CODE[schema.WHITE]
    padded = np.zeros((len(codes) + 3) // 4 * 4, dtype=np.uint8)
    padded[: len(codes)] = codes
    quads = padded.reshape(-1, 4)
    return (quads[:, 0] | quads[:, 1] << 2 | quads[:, 2] << 4 | quads[:, 3] << 6).astype(np.uint8).tobytes()


def unpack_ownership(data: bytes, points: int, source: str = "<bytes>") -> np.ndarray:
    """Inverse of :func:`pack_ownership`; code 3 is corruption."""
    if len(data) != (points + 3) // 4:
        raise FormatError(source, schema.G_OWNERSHIP, f"has {len(data)} bytes, expected {(points + 3) // 4}")
    raw = np.frombuffer(data, dtype=np.uint8)
    codes = np.stack([raw & 3, raw >> 2 & 3, raw >> 4 & 3, raw >> 6 & 3], axis=1).ravel()[:points]
    if (codes == 3).any():
        raise FormatError(source, schema.G_OWNERSHIP, "contains the invalid 2-bit code 3")
    out = np.zeros(points, dtype=np.int8)
    out[codes == 1] = schema.BLACK
    out[codes == 2] = schema.WHITE
    return out


def encode_game(game: GameRecord) -> bytes:
    """Serialize a game as a ``tf.train.Example`` (layout in SPEC.md)."""
    n, m = game.board_size, game.num_positions
    _check_writable_game(game)
    ex = Example()
    set_int64(ex, schema.G_VERSION, [game.version])
    set_int64(ex, schema.G_BOARD_SIZE, [n])
    set_float(ex, schema.G_KOMI, [game.komi])
    set_bytes(ex, schema.G_RULES, game.rules.encode())
    set_bytes(ex, schema.G_GAME_ID, game.game_id.encode())
    set_int64(ex, schema.G_GENERATION, [game.generation])
    set_bytes(ex, schema.G_WORKER_ID, game.worker_id.encode())
    set_bytes(ex, schema.G_MOVES, np.asarray(game.moves, dtype="<u2").tobytes())
    planes = np.asarray(game.planes, dtype=np.uint8).reshape(m, 2 * n * n)
    set_bytes(ex, schema.G_PLANES, np.packbits(planes, axis=1, bitorder="big").tobytes())

    counts, deltas, values, denominators = [], [], [], []
    for indices, vals in zip(game.policy_indices, game.policy_values):
        indices = np.asarray(indices, dtype=np.int64)
        vals = np.asarray(vals, dtype=np.int64)
        keep = vals > 0  # zeros are dropped: the target is sparse
        indices, vals = indices[keep], vals[keep]
        order = np.argsort(indices, kind="stable")
        indices, vals = indices[order], vals[order]
        counts.append(len(indices))
        if len(indices):
            # Sorted indices stored as gaps: small varints (mostly one byte).
            deltas.append(np.diff(indices, prepend=0))
            values.append(vals)
        denominators.append(int(vals.sum()))
    set_int64(ex, schema.G_POLICY_COUNT, counts)
    set_int64(ex, schema.G_POLICY_DENOMINATOR, denominators)
    set_int64(ex, schema.G_POLICY_INDEX_DELTA, np.concatenate(deltas) if deltas else [])
    set_int64(ex, schema.G_POLICY_VALUE, np.concatenate(values) if values else [])
    root_q = np.clip(np.round(np.asarray(game.root_values, dtype=np.float64) * schema.ROOT_VALUE_SCALE), -127, 127)
    set_bytes(ex, schema.G_ROOT_VALUE, root_q.astype(np.int8).tobytes())
    set_bytes(ex, schema.G_FULL_SEARCH, np.asarray(game.full_search, dtype=np.uint8).tobytes())
    set_int64(ex, schema.G_WINNER, [game.winner])
    set_float(ex, schema.G_SCORE, [game.score])
    set_int64(ex, schema.G_END_REASON, [game.end_reason])
    own = b"" if game.ownership is None else pack_ownership(np.asarray(game.ownership, dtype=np.int8))
    set_bytes(ex, schema.G_OWNERSHIP, own)
    set_int64(ex, schema.G_OWNERSHIP_SOURCE, [game.ownership_source])
    set_int64(ex, schema.G_RESIGN_ENABLED, [int(game.resign_enabled)])
    set_int64(ex, schema.G_WOULD_RESIGN, [game.would_resign])
    set_int64(ex, schema.G_ACCELERATED_FROM, [game.accelerated_from])
    if game.seed >= 0:
        set_int64(ex, schema.G_SEED, [game.seed])
    return ex.SerializeToString(deterministic=True)


def _check_writable_game(game: GameRecord) -> None:
    """Refuse to write what a reader would refuse to read."""
    source = f"game {game.game_id!r} (being written)"
    n, m = game.board_size, game.num_positions
    if not schema.MIN_BOARD_SIZE <= n <= schema.MAX_BOARD_SIZE:
        raise FormatError(
            source, schema.G_BOARD_SIZE, f"{n} is outside {schema.MIN_BOARD_SIZE}..{schema.MAX_BOARD_SIZE}"
        )
    if np.shape(game.planes) != (m, 2, n, n):
        raise FormatError(source, schema.G_PLANES, f"shape {np.shape(game.planes)} != {(m, 2, n, n)}")
    for name in ("policy_indices", "policy_values", "root_values", "full_search"):
        if len(getattr(game, name)) != m:
            raise FormatError(source, name, f"has {len(getattr(game, name))} entries for {m} positions")
    if m and (np.min(game.moves) < 0 or np.max(game.moves) > n * n):
        raise FormatError(source, schema.G_MOVES, f"move index outside 0..{n * n}")
    for i, (idx, val) in enumerate(zip(game.policy_indices, game.policy_values)):
        if len(idx) != len(val):
            raise FormatError(source, "policy_values", f"position {i}: {len(idx)} indices, {len(val)} values")
        if len(idx) and (np.min(idx) < 0 or np.max(idx) > n * n or np.min(val) < 0):
            raise FormatError(source, "policy_indices", f"position {i}: index or value out of range")
    if game.ownership is not None and len(game.ownership) != n * n:
        raise FormatError(source, schema.G_OWNERSHIP, f"has {len(game.ownership)} points, expected {n * n}")


def _decode_policies(r, counts, denominators, deltas, values, actions):
    """The gap-coded policy arrays as per-position (indices, values) `Segments`.

    Vectorized over the whole game (a Python loop per position cost ~5 us):
    ``starts`` marks the first entry of every non-empty position; indices
    are a global cumulative sum of the gaps minus each segment's base.
    """
    m = len(counts)
    offsets = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    nonempty = counts > 0
    starts = offsets[:-1][nonempty]
    if len(deltas):
        is_first = np.zeros(len(deltas), dtype=bool)
        is_first[starts] = True
        if (deltas[is_first] < 0).any() or (deltas[~is_first] < 1).any():
            bad = int(
                np.searchsorted(offsets, np.flatnonzero((deltas < 1) & ~is_first | (deltas < 0))[0], side="right") - 1
            )
            raise r.error(schema.G_POLICY_INDEX_DELTA, f"position {bad}: indices are not strictly increasing")
        running = np.cumsum(deltas)
        base = np.where(starts > 0, running[np.maximum(starts - 1, 0)], 0)
        indices = running - np.repeat(base, counts[nonempty])
        if indices.max() >= actions:
            bad = int(np.searchsorted(offsets, int(np.argmax(indices >= actions)), side="right") - 1)
            raise r.error(
                schema.G_POLICY_INDEX_DELTA, f"position {bad}: index {int(indices.max())} outside 0..{actions - 1}"
            )
        totals = np.add.reduceat(values, starts)
        dens = denominators[nonempty]
        far = (dens <= 0) | (np.abs(totals / np.maximum(dens, 1) - 1.0) > schema.POLICY_SUM_TOLERANCE)
        if far.any():
            k = int(np.argmax(far))
            bad = int(np.flatnonzero(nonempty)[k])
            raise r.error(
                schema.G_POLICY_DENOMINATOR,
                f"position {bad}: policy sums to {int(totals[k])}/{int(dens[k])}, far from 1",
            )
    else:
        indices = deltas
    return Segments(indices, offsets), Segments(values, offsets)


def decode_game(data: bytes, source: str = "<bytes>") -> GameRecord:
    """Parse and validate one serialized game record."""
    r = FeatureReader(parse_example(data, source), source)
    version, n = r.header(schema.G_VERSION, schema.G_BOARD_SIZE)
    actions = n * n + 1
    rules = r.text(schema.G_RULES)
    if rules != schema.RULES_TROMP_TAYLOR:
        raise r.error(schema.G_RULES, f"unsupported rules {rules!r}")
    komi = r.float(schema.G_KOMI)
    if not math.isfinite(komi) or abs(komi) > 2 * n * n:
        raise r.error(schema.G_KOMI, f"impossible komi {komi}")

    raw_moves = r.bytes(schema.G_MOVES)
    if len(raw_moves) % 2:
        raise r.error(schema.G_MOVES, "odd byte length")
    unsigned = np.frombuffer(raw_moves, dtype="<u2")
    m = len(unsigned)
    # Checked as stored (uint16): 32768..65535 would turn negative as int16 and pass a maximum check.
    if m and int(unsigned.max()) >= actions:
        raise r.error(schema.G_MOVES, f"move index {int(unsigned.max())} outside 0..{actions - 1}")
    moves = unsigned.astype(np.int16)

    per_position = _plane_bytes_per_position(n)
    raw_planes = r.bytes(schema.G_PLANES)
    if len(raw_planes) != m * per_position:
        raise r.error(schema.G_PLANES, f"has {len(raw_planes)} bytes, expected {m} positions x {per_position}")
    packed = np.frombuffer(raw_planes, dtype=np.uint8).reshape(m, per_position)
    planes = np.unpackbits(packed, axis=1, count=2 * n * n, bitorder="big").reshape(m, 2, n, n)
    if (planes[:, 0] & planes[:, 1]).any():
        raise r.error(schema.G_PLANES, "a point holds both a black and a white stone")

    counts = r.ints(schema.G_POLICY_COUNT)
    denominators = r.ints(schema.G_POLICY_DENOMINATOR)
    deltas = r.ints(schema.G_POLICY_INDEX_DELTA)
    values = r.ints(schema.G_POLICY_VALUE)
    if len(counts) != m or len(denominators) != m:
        raise r.error(
            schema.G_POLICY_COUNT, f"has {len(counts)} counts / {len(denominators)} denominators for {m} positions"
        )
    if (counts < 0).any() or counts.sum() != len(deltas) or len(deltas) != len(values):
        raise r.error(
            schema.G_POLICY_COUNT,
            f"counts sum to {counts.sum()} but there are {len(deltas)} indices and {len(values)} values",
        )
    if len(values) and values.min() <= 0:
        raise r.error(schema.G_POLICY_VALUE, "holds a zero or negative value (zeros are dropped)")
    policy_indices, policy_values = _decode_policies(r, counts, denominators, deltas, values, actions)

    root_raw = r.bytes(schema.G_ROOT_VALUE)
    if len(root_raw) != m:
        raise r.error(schema.G_ROOT_VALUE, f"has {len(root_raw)} entries for {m} positions")
    root_values = np.frombuffer(root_raw, dtype=np.int8).astype(np.float32) / schema.ROOT_VALUE_SCALE
    full_raw = np.frombuffer(r.bytes(schema.G_FULL_SEARCH), dtype=np.uint8)
    if len(full_raw) != m or (full_raw > 1).any():
        raise r.error(schema.G_FULL_SEARCH, f"expected {m} flags of 0 or 1")

    winner = r.int(schema.G_WINNER)
    if winner not in (schema.BLACK, schema.WHITE, 0):
        raise r.error(schema.G_WINNER, f"impossible winner {winner}")
    end_reason = r.int(schema.G_END_REASON)
    if end_reason not in schema.END_REASONS:
        raise r.error(schema.G_END_REASON, f"unknown end reason {end_reason}")
    source_code = r.int(schema.G_OWNERSHIP_SOURCE)
    if source_code not in schema.OWNERSHIP_SOURCES:
        raise r.error(schema.G_OWNERSHIP_SOURCE, f"unknown ownership source {source_code}")
    own_raw = r.bytes(schema.G_OWNERSHIP)
    ownership = None
    if source_code != schema.OWNERSHIP_NONE:
        ownership = unpack_ownership(own_raw, n * n, source)
    elif own_raw:
        raise r.error(schema.G_OWNERSHIP, "present although ownership_source is 'none'")
    accelerated_from = r.int(schema.G_ACCELERATED_FROM)
    if not -1 <= accelerated_from <= m:
        raise r.error(schema.G_ACCELERATED_FROM, f"{accelerated_from} outside -1..{m}")
    seed = r.int(schema.G_SEED) if schema.G_SEED in r.features else -1  # optional: absent in older chunks
    if seed < -1:
        raise r.error(schema.G_SEED, f"{seed} is negative")
    would_resign = r.int(schema.G_WOULD_RESIGN)
    if would_resign not in (schema.BLACK, schema.WHITE, 0):
        raise r.error(schema.G_WOULD_RESIGN, f"impossible colour {would_resign}")

    return GameRecord(
        board_size=n,
        komi=komi,
        game_id=r.text(schema.G_GAME_ID),
        generation=r.int(schema.G_GENERATION),
        worker_id=r.text(schema.G_WORKER_ID),
        moves=moves,
        planes=planes,
        policy_indices=policy_indices,
        policy_values=policy_values,
        root_values=root_values,
        full_search=full_raw.astype(bool),
        winner=winner,
        score=r.float(schema.G_SCORE),
        end_reason=end_reason,
        ownership=ownership,
        ownership_source=source_code,
        resign_enabled=bool(r.int(schema.G_RESIGN_ENABLED)),
        would_resign=would_resign,
        accelerated_from=accelerated_from,
        seed=seed,
        rules=rules,
        version=version,
    )


def frame_chunk(records: Iterable[bytes]) -> bytes:
    """A whole chunk file of game records already encoded (`encode_game`): zstd-compressed
    TFRecord, one record per game.  The worker's spool keeps encoded records and frames them here."""
    return compress_zstd(frame_records(records))


def encode_chunk(games: Iterable[GameRecord]) -> bytes:
    """A whole chunk file of ``games``: `frame_chunk` of their `encode_game` records."""
    return frame_chunk(encode_game(g) for g in games)


def chunk_records(data: bytes, source: str) -> Iterator[bytes]:
    """The encoded game records of a chunk file, in order, not decoded: `frame_chunk` undone.

    ``source`` names the chunk in errors, and its suffix says the compression
    (`format.tfrecord.decompress_for`).  Damaged compression or framing raises
    RecordError, at the call or when the iteration reaches the damage.
    """
    return iter_framed_records(decompress_for(source, data), source)


def iter_chunk(data: bytes, source: str, keep=None) -> Iterator[GameRecord | FormatError]:
    """Yield each game of a chunk, or a FormatError in place of a bad record.

    Damage to the framing or compression ends the iteration with one
    FormatError (later records cannot be located); a record that frames
    correctly but fails validation costs only itself.  ``keep``: called once
    per record in order; a record it refuses is neither decoded nor yielded.
    """
    try:
        for index, record in enumerate(chunk_records(data, source)):
            if keep is not None and not keep():
                continue
            try:
                yield decode_game(record, f"{source}#{index}")
            except FormatError as exc:
                yield exc
    except RecordError as exc:
        yield FormatError(source, None, str(exc).split(": ", 1)[-1])


def read_chunk(data: bytes, source: str) -> list[GameRecord]:
    """Decode a whole chunk; the first problem raises FormatError."""
    games = []
    for item in iter_chunk(data, source):
        if isinstance(item, FormatError):
            raise item
        games.append(item)
    return games


def quantize_policy(probs: np.ndarray, denominator: int = 1023) -> tuple[np.ndarray, np.ndarray]:
    """Quantize a probability vector to integers that sum exactly to ``denominator``.

    Largest-remainder rounding, so the stored target sums to 1 exactly and
    every probability moves by less than ``1/denominator``.  Returns the
    (indices, values) of the nonzero entries.
    """
    probs = np.asarray(probs, dtype=np.float64)
    total = probs.sum()
    if not total > 0 or (probs < 0).any():
        raise ValueError("policy must be non-negative with a positive sum")
    scaled = probs / total * denominator
    floor = np.floor(scaled).astype(np.int64)
    short = denominator - int(floor.sum())
    if short > 0:
        floor[np.argsort(floor - scaled, kind="stable")[:short]] += 1
    nonzero = np.flatnonzero(floor)
    return nonzero.astype(np.int64), floor[nonzero]
