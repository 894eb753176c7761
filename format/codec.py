"""The one codec for the lake's two record kinds (byte layout: format/SPEC.md).

Data flow::

    selfplay.worker --GameRecord--> encode_chunk() --bytes--> Storage.write_new(games/...)
    Storage.read() --bytes--> read_chunk() --GameRecord...--> pipeline, format.inspect
    pipeline --encode_position()--> shards (GZIP TFRecord) --> format.tfdata --> trainer

*Game records* keep one game each: the moves, the fresh board planes of every
position (bit-packed; history is rebuilt by the Beam job), a sparse quantized
policy target per fully searched position, root values, the result and the
endstate.  *Position records* keep one training example each, already
assembled (history planes, dense-able policy, targets, weights), so the
trainer needs no Go engine.

Every decode validates what it reads and raises :class:`FormatError` naming
the source (file and record index) and the field.  Nothing read is unpickled
or evaluated.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import math
from typing import Iterable, Iterator, Sequence

import numpy as np

from format import schema as S
from format.example_proto import Example
from format.tfrecord import (
    RecordError,
    gather_segments,
    compress_gzip,
    compress_zstd,
    decompress_for,
    fill_data_crcs,
    frame_header,
    frame_records,
    iter_framed_records,
)

__all__ = [
    "FormatError",
    "GameRecord",
    "Segments",
    "flat_segments",
    "PositionRecord",
    "encode_game",
    "decode_game",
    "encode_chunk",
    "read_chunk",
    "iter_chunk",
    "encode_position",
    "encode_positions",
    "encode_positions_framed",
    "decode_position",
    "encode_shard",
    "read_shard",
    "quantize_policy",
    "chunk_path",
    "pack_ownership",
    "unpack_ownership",
]


class FormatError(ValueError):
    """A record does not satisfy format/SPEC.md.

    ``source`` names the file (and record), ``field`` the offending field
    (``None`` for framing or compression damage).
    """

    def __init__(self, source: str, field: str | None, problem: str):
        self.source, self.field, self.problem = source, field, problem
        where = f"field '{field}'" if field else "framing"
        super().__init__(f"{source}: {where}: {problem}")


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
            return Segments(self.flat[base:self.offsets[stop]], self.offsets[start:stop + 1] - base)
        if isinstance(i, (np.ndarray, list)):
            return [self[int(k)] for k in np.arange(len(self))[i]]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"segment {i} out of range for {len(self)}")
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

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
    ownership_source: int = S.OWNERSHIP_NONE
    resign_enabled: bool = True
    would_resign: int = 0
    """Colour that would have resigned while resignation was disabled, else 0."""
    accelerated_from: int = -1
    """Move index where acceleration mode began, -1 if never."""
    seed: int = -1
    """Seed of the game's random stream (0 <= seed < 2**63), -1 if not recorded."""
    rules: str = S.RULES_TROMP_TAYLOR
    version: int = S.FORMAT_VERSION

    @property
    def num_positions(self) -> int:
        return int(len(self.moves))

    def policy_probs(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(indices, probabilities) of position ``i``'s target; empty if none."""
        values = np.asarray(self.policy_values[i], dtype=np.float64)
        total = values.sum()
        probs = values / total if total > 0 else values
        return np.asarray(self.policy_indices[i], dtype=np.int64), probs.astype(np.float32)


# SetInParent(): an empty list must still mark which kind the feature is, or
# readers (ours and tf.io.parse_example) see a feature of no type.
def _set_int64(example, name, values):
    kind = example.features.feature[name].int64_list
    kind.SetInParent()
    kind.value.extend(np.asarray(values, dtype=np.int64).ravel().tolist())


def _set_float(example, name, values):
    kind = example.features.feature[name].float_list
    kind.SetInParent()
    kind.value.extend(np.asarray(values, dtype=np.float32).ravel().tolist())


def _set_bytes(example, name, value: bytes):
    example.features.feature[name].bytes_list.value.append(value)


def _plane_bytes_per_position(board_size: int) -> int:
    return S.packed_plane_bytes(board_size, 2)


def pack_ownership(ownership: np.ndarray) -> bytes:
    """int8[P] in {-1,0,1} -> 2 bits a point, 4 points a byte, point p in bits 2*(p%4)."""
    codes = np.zeros(len(ownership), dtype=np.uint8)
    codes[ownership == S.BLACK] = S.OWNERSHIP_CODE[S.BLACK]
    codes[ownership == S.WHITE] = S.OWNERSHIP_CODE[S.WHITE]
    padded = np.zeros((len(codes) + 3) // 4 * 4, dtype=np.uint8)
    padded[: len(codes)] = codes
    quads = padded.reshape(-1, 4)
    return (quads[:, 0] | quads[:, 1] << 2 | quads[:, 2] << 4 | quads[:, 3] << 6).astype(np.uint8).tobytes()


def unpack_ownership(data: bytes, points: int, source: str = "<bytes>") -> np.ndarray:
    """Inverse of :func:`pack_ownership`; code 3 is corruption."""
    if len(data) != (points + 3) // 4:
        raise FormatError(source, S.G_OWNERSHIP, f"has {len(data)} bytes, expected {(points + 3) // 4}")
    raw = np.frombuffer(data, dtype=np.uint8)
    codes = np.stack([raw & 3, raw >> 2 & 3, raw >> 4 & 3, raw >> 6 & 3], axis=1).ravel()[:points]
    if (codes == 3).any():
        raise FormatError(source, S.G_OWNERSHIP, "contains the invalid 2-bit code 3")
    out = np.zeros(points, dtype=np.int8)
    out[codes == 1] = S.BLACK
    out[codes == 2] = S.WHITE
    return out


def encode_game(game: GameRecord) -> bytes:
    """Serialize a game as a ``tf.train.Example`` (layout in SPEC.md)."""
    n, m = game.board_size, game.num_positions
    _check_writable_game(game)
    ex = Example()
    _set_int64(ex, S.G_VERSION, [game.version])
    _set_int64(ex, S.G_BOARD_SIZE, [n])
    _set_float(ex, S.G_KOMI, [game.komi])
    _set_bytes(ex, S.G_RULES, game.rules.encode())
    _set_bytes(ex, S.G_GAME_ID, game.game_id.encode())
    _set_int64(ex, S.G_GENERATION, [game.generation])
    _set_bytes(ex, S.G_WORKER_ID, game.worker_id.encode())
    _set_bytes(ex, S.G_MOVES, np.asarray(game.moves, dtype="<u2").tobytes())
    planes = np.asarray(game.planes, dtype=np.uint8).reshape(m, 2 * n * n)
    _set_bytes(ex, S.G_PLANES, np.packbits(planes, axis=1, bitorder="big").tobytes())

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
    _set_int64(ex, S.G_POLICY_COUNT, counts)
    _set_int64(ex, S.G_POLICY_DENOMINATOR, denominators)
    _set_int64(ex, S.G_POLICY_INDEX_DELTA, np.concatenate(deltas) if deltas else [])
    _set_int64(ex, S.G_POLICY_VALUE, np.concatenate(values) if values else [])
    root_q = np.clip(np.round(np.asarray(game.root_values, dtype=np.float64) * S.ROOT_VALUE_SCALE), -127, 127)
    _set_bytes(ex, S.G_ROOT_VALUE, root_q.astype(np.int8).tobytes())
    _set_bytes(ex, S.G_FULL_SEARCH, np.asarray(game.full_search, dtype=np.uint8).tobytes())
    _set_int64(ex, S.G_WINNER, [game.winner])
    _set_float(ex, S.G_SCORE, [game.score])
    _set_int64(ex, S.G_END_REASON, [game.end_reason])
    own = b"" if game.ownership is None else pack_ownership(np.asarray(game.ownership, dtype=np.int8))
    _set_bytes(ex, S.G_OWNERSHIP, own)
    _set_int64(ex, S.G_OWNERSHIP_SOURCE, [game.ownership_source])
    _set_int64(ex, S.G_RESIGN_ENABLED, [int(game.resign_enabled)])
    _set_int64(ex, S.G_WOULD_RESIGN, [game.would_resign])
    _set_int64(ex, S.G_ACCELERATED_FROM, [game.accelerated_from])
    if game.seed >= 0:
        _set_int64(ex, S.G_SEED, [game.seed])
    return ex.SerializeToString(deterministic=True)


def _check_writable_game(game: GameRecord) -> None:
    """Refuse to write what a reader would refuse to read."""
    source = f"game {game.game_id!r} (being written)"
    n, m = game.board_size, game.num_positions
    if not S.MIN_BOARD_SIZE <= n <= S.MAX_BOARD_SIZE:
        raise FormatError(source, S.G_BOARD_SIZE, f"{n} is outside {S.MIN_BOARD_SIZE}..{S.MAX_BOARD_SIZE}")
    if np.shape(game.planes) != (m, 2, n, n):
        raise FormatError(source, S.G_PLANES, f"shape {np.shape(game.planes)} != {(m, 2, n, n)}")
    for name in ("policy_indices", "policy_values", "root_values", "full_search"):
        if len(getattr(game, name)) != m:
            raise FormatError(source, name, f"has {len(getattr(game, name))} entries for {m} positions")
    if m and (np.min(game.moves) < 0 or np.max(game.moves) > n * n):
        raise FormatError(source, S.G_MOVES, f"move index outside 0..{n * n}")
    for i, (idx, val) in enumerate(zip(game.policy_indices, game.policy_values)):
        if len(idx) != len(val):
            raise FormatError(source, "policy_values", f"position {i}: {len(idx)} indices, {len(val)} values")
        if len(idx) and (np.min(idx) < 0 or np.max(idx) > n * n or np.min(val) < 0):
            raise FormatError(source, "policy_indices", f"position {i}: index or value out of range")
    if game.ownership is not None and len(game.ownership) != n * n:
        raise FormatError(source, S.G_OWNERSHIP, f"has {len(game.ownership)} points, expected {n * n}")


class _Reader:
    """Typed, validated access to one parsed Example's features."""

    def __init__(self, example, source: str):
        self.features = example.features.feature
        self.source = source

    def error(self, field, problem):
        return FormatError(self.source, field, problem)

    def _feature(self, name, kind):
        if name not in self.features:
            raise self.error(name, "is missing")
        feature = self.features[name]
        if feature.WhichOneof("kind") != kind:
            raise self.error(name, f"has type {feature.WhichOneof('kind')}, expected {kind}")
        return getattr(feature, kind).value

    def ints(self, name) -> np.ndarray:
        return np.asarray(self._feature(name, "int64_list"), dtype=np.int64)

    def int(self, name) -> int:
        values = self._feature(name, "int64_list")
        if len(values) != 1:
            raise self.error(name, f"has {len(values)} values, expected 1")
        return int(values[0])

    def float(self, name) -> float:
        values = self._feature(name, "float_list")
        if len(values) != 1:
            raise self.error(name, f"has {len(values)} values, expected 1")
        return float(values[0])

    def floats(self, name) -> np.ndarray:
        return np.asarray(self._feature(name, "float_list"), dtype=np.float32)

    def bytes(self, name) -> bytes:
        values = self._feature(name, "bytes_list")
        if len(values) != 1:
            raise self.error(name, f"has {len(values)} values, expected 1")
        return values[0]

    def text(self, name) -> str:
        try:
            return self.bytes(name).decode()
        except UnicodeDecodeError:
            raise self.error(name, "is not UTF-8 text") from None

    def header(self, version_field, size_field) -> tuple[int, int]:
        version = self.int(version_field)
        if version not in S.SUPPORTED_VERSIONS:
            raise self.error(version_field, f"unknown format version {version} (this reader knows "
                                            f"{sorted(S.SUPPORTED_VERSIONS)})")
        size = self.int(size_field)
        if not S.MIN_BOARD_SIZE <= size <= S.MAX_BOARD_SIZE:
            raise self.error(size_field, f"impossible board size {size}")
        return version, size


def _parse_example(data: bytes, source: str):
    example = Example()
    try:
        example.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError (message varies by backend)
        raise FormatError(source, None, f"not a tf.train.Example ({exc})") from None
    return example


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
            bad = int(np.searchsorted(offsets, np.flatnonzero((deltas < 1) & ~is_first | (deltas < 0))[0],
                                      side="right") - 1)
            raise r.error(S.G_POLICY_INDEX_DELTA, f"position {bad}: indices are not strictly increasing")
        running = np.cumsum(deltas)
        base = np.where(starts > 0, running[np.maximum(starts - 1, 0)], 0)
        indices = running - np.repeat(base, counts[nonempty])
        if indices.max() >= actions:
            bad = int(np.searchsorted(offsets, int(np.argmax(indices >= actions)), side="right") - 1)
            raise r.error(S.G_POLICY_INDEX_DELTA, f"position {bad}: index {int(indices.max())} "
                                                  f"outside 0..{actions - 1}")
        totals = np.add.reduceat(values, starts)
        dens = denominators[nonempty]
        far = (dens <= 0) | (np.abs(totals / np.maximum(dens, 1) - 1.0) > S.POLICY_SUM_TOLERANCE)
        if far.any():
            k = int(np.argmax(far))
            bad = int(np.flatnonzero(nonempty)[k])
            raise r.error(S.G_POLICY_DENOMINATOR, f"position {bad}: policy sums to {int(totals[k])}/"
                                                  f"{int(dens[k])}, far from 1")
    else:
        indices = deltas
    return Segments(indices, offsets), Segments(values, offsets)


def decode_game(data: bytes, source: str = "<bytes>") -> GameRecord:
    """Parse and validate one serialized game record."""
    r = _Reader(_parse_example(data, source), source)
    version, n = r.header(S.G_VERSION, S.G_BOARD_SIZE)
    actions = n * n + 1
    rules = r.text(S.G_RULES)
    if rules != S.RULES_TROMP_TAYLOR:
        raise r.error(S.G_RULES, f"unsupported rules {rules!r}")
    komi = r.float(S.G_KOMI)
    if not math.isfinite(komi) or abs(komi) > 2 * n * n:
        raise r.error(S.G_KOMI, f"impossible komi {komi}")

    raw_moves = r.bytes(S.G_MOVES)
    if len(raw_moves) % 2:
        raise r.error(S.G_MOVES, "odd byte length")
    moves = np.frombuffer(raw_moves, dtype="<u2").astype(np.int16)
    m = len(moves)
    if m and int(moves.max()) >= actions:
        raise r.error(S.G_MOVES, f"move index {int(moves.max())} outside 0..{actions - 1}")

    per_position = _plane_bytes_per_position(n)
    raw_planes = r.bytes(S.G_PLANES)
    if len(raw_planes) != m * per_position:
        raise r.error(S.G_PLANES, f"has {len(raw_planes)} bytes, expected {m} positions x {per_position}")
    packed = np.frombuffer(raw_planes, dtype=np.uint8).reshape(m, per_position)
    planes = np.unpackbits(packed, axis=1, count=2 * n * n, bitorder="big").reshape(m, 2, n, n)
    if (planes[:, 0] & planes[:, 1]).any():
        raise r.error(S.G_PLANES, "a point holds both a black and a white stone")

    counts = r.ints(S.G_POLICY_COUNT)
    denominators = r.ints(S.G_POLICY_DENOMINATOR)
    deltas = r.ints(S.G_POLICY_INDEX_DELTA)
    values = r.ints(S.G_POLICY_VALUE)
    if len(counts) != m or len(denominators) != m:
        raise r.error(S.G_POLICY_COUNT, f"has {len(counts)} counts / {len(denominators)} denominators for {m} positions")
    if (counts < 0).any() or counts.sum() != len(deltas) or len(deltas) != len(values):
        raise r.error(S.G_POLICY_COUNT, f"counts sum to {counts.sum()} but there are {len(deltas)} "
                                        f"indices and {len(values)} values")
    if len(values) and values.min() <= 0:
        raise r.error(S.G_POLICY_VALUE, "holds a zero or negative value (zeros are dropped)")
    policy_indices, policy_values = _decode_policies(r, counts, denominators, deltas, values, actions)

    root_raw = r.bytes(S.G_ROOT_VALUE)
    if len(root_raw) != m:
        raise r.error(S.G_ROOT_VALUE, f"has {len(root_raw)} entries for {m} positions")
    root_values = np.frombuffer(root_raw, dtype=np.int8).astype(np.float32) / S.ROOT_VALUE_SCALE
    full_raw = np.frombuffer(r.bytes(S.G_FULL_SEARCH), dtype=np.uint8)
    if len(full_raw) != m or (full_raw > 1).any():
        raise r.error(S.G_FULL_SEARCH, f"expected {m} flags of 0 or 1")

    winner = r.int(S.G_WINNER)
    if winner not in (S.BLACK, S.WHITE, 0):
        raise r.error(S.G_WINNER, f"impossible winner {winner}")
    end_reason = r.int(S.G_END_REASON)
    if end_reason not in S.END_REASONS:
        raise r.error(S.G_END_REASON, f"unknown end reason {end_reason}")
    source_code = r.int(S.G_OWNERSHIP_SOURCE)
    if source_code not in S.OWNERSHIP_SOURCES:
        raise r.error(S.G_OWNERSHIP_SOURCE, f"unknown ownership source {source_code}")
    own_raw = r.bytes(S.G_OWNERSHIP)
    ownership = None
    if source_code != S.OWNERSHIP_NONE:
        ownership = unpack_ownership(own_raw, n * n, source)
    elif own_raw:
        raise r.error(S.G_OWNERSHIP, "present although ownership_source is 'none'")
    accelerated_from = r.int(S.G_ACCELERATED_FROM)
    if not -1 <= accelerated_from <= m:
        raise r.error(S.G_ACCELERATED_FROM, f"{accelerated_from} outside -1..{m}")
    seed = r.int(S.G_SEED) if S.G_SEED in r.features else -1   # optional: absent in older chunks
    if seed < -1:
        raise r.error(S.G_SEED, f"{seed} is negative")
    would_resign = r.int(S.G_WOULD_RESIGN)
    if would_resign not in (S.BLACK, S.WHITE, 0):
        raise r.error(S.G_WOULD_RESIGN, f"impossible colour {would_resign}")

    return GameRecord(
        board_size=n, komi=komi, game_id=r.text(S.G_GAME_ID), generation=r.int(S.G_GENERATION),
        worker_id=r.text(S.G_WORKER_ID), moves=moves, planes=planes,
        policy_indices=policy_indices, policy_values=policy_values, root_values=root_values,
        full_search=full_raw.astype(bool), winner=winner, score=r.float(S.G_SCORE),
        end_reason=end_reason, ownership=ownership, ownership_source=source_code,
        resign_enabled=bool(r.int(S.G_RESIGN_ENABLED)), would_resign=would_resign,
        accelerated_from=accelerated_from, seed=seed, rules=rules, version=version,
    )


def encode_chunk(games: Iterable[GameRecord]) -> bytes:
    """A whole chunk file: zstd-compressed TFRecord, one record per game."""
    return compress_zstd(frame_records(encode_game(g) for g in games))


def iter_chunk(data: bytes, source: str) -> Iterator[GameRecord | FormatError]:
    """Yield each game of a chunk, or a FormatError in place of a bad record.

    Damage to the framing or compression ends the iteration with one
    FormatError (later records cannot be located); a record that frames
    correctly but fails validation costs only itself.
    """
    try:
        raw = decompress_for(source, data)
        for index, record in enumerate(iter_framed_records(raw, source)):
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


def chunk_path(generation: int, worker_id: str, seq: int, time_ms: int) -> str:
    """Lake path of a new chunk: games/<gen>/<worker>-<time_ms>-<seq>.tfrecord.zst."""
    if not worker_id or "/" in worker_id or "-" in worker_id:
        raise ValueError(f"worker id {worker_id!r} must be non-empty and contain no '/' or '-'")
    from format import layout  # the layout owns chunk names (layout imports schema, not codec)

    return layout.chunk_path(generation, worker_id, time_ms, seq)


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
    move_number: int
    generation: int
    version: int = S.FORMAT_VERSION


def encode_position(
    *, board_size: int, planes_packed: bytes, to_play: int, policy_index, policy_prob,
    value: float, score: float, ownership_int8: bytes, policy_weight: float, value_weight: float,
    ownership_weight: float, score_weight: float, game_id: str, move_number: int, generation: int,
) -> bytes:
    """Serialize one position record.  Inputs are already in at-rest form."""
    ex = Example()
    _set_int64(ex, S.P_VERSION, [S.FORMAT_VERSION])
    _set_int64(ex, S.P_BOARD_SIZE, [board_size])
    _set_bytes(ex, S.P_PLANES, bytes(planes_packed))
    _set_int64(ex, S.P_TO_PLAY, [to_play])
    _set_int64(ex, S.P_POLICY_INDEX, policy_index)
    _set_float(ex, S.P_POLICY_PROB, policy_prob)
    _set_float(ex, S.P_VALUE, [value])
    _set_float(ex, S.P_SCORE, [score])
    _set_bytes(ex, S.P_OWNERSHIP, bytes(ownership_int8))
    _set_float(ex, S.P_POLICY_WEIGHT, [policy_weight])
    _set_float(ex, S.P_VALUE_WEIGHT, [value_weight])
    _set_float(ex, S.P_OWNERSHIP_WEIGHT, [ownership_weight])
    _set_float(ex, S.P_SCORE_WEIGHT, [score_weight])
    _set_bytes(ex, S.P_GAME_ID, game_id.encode())
    _set_int64(ex, S.P_MOVE_NUMBER, [move_number])
    _set_int64(ex, S.P_GENERATION, [generation])
    return ex.SerializeToString(deterministic=True)


def decode_position(data: bytes, source: str = "<bytes>") -> PositionRecord:
    """Parse and validate one position record (the trainer uses format.tfdata)."""
    r = _Reader(_parse_example(data, source), source)
    version, n = r.header(S.P_VERSION, S.P_BOARD_SIZE)
    raw = r.bytes(S.P_PLANES)
    expected = S.packed_plane_bytes(n, S.PACKED_PLANES)
    if len(raw) != expected:
        raise r.error(S.P_PLANES, f"has {len(raw)} bytes, expected {expected}")
    planes = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=S.PACKED_PLANES * n * n,
                           bitorder="big").reshape(S.PACKED_PLANES, n, n)
    to_play = r.int(S.P_TO_PLAY)
    if to_play not in (S.BLACK, S.WHITE):
        raise r.error(S.P_TO_PLAY, f"impossible colour {to_play}")
    index = r.ints(S.P_POLICY_INDEX)
    prob = r.floats(S.P_POLICY_PROB)
    if len(index) != len(prob):
        raise r.error(S.P_POLICY_PROB, f"{len(prob)} probabilities for {len(index)} indices")
    if len(index) and (index.min() < 0 or index.max() > n * n):
        raise r.error(S.P_POLICY_INDEX, f"index outside 0..{n * n}")
    if len(prob) and abs(float(prob.sum()) - 1.0) > S.POLICY_SUM_TOLERANCE:
        raise r.error(S.P_POLICY_PROB, f"sums to {float(prob.sum()):.4f}, far from 1")
    own_raw = r.bytes(S.P_OWNERSHIP)
    if len(own_raw) != n * n:
        raise r.error(S.P_OWNERSHIP, f"has {len(own_raw)} bytes, expected {n * n}")
    ownership = np.frombuffer(own_raw, dtype=np.int8).astype(np.float32) / S.OWNERSHIP_SCALE
    return PositionRecord(
        board_size=n, planes=planes, to_play=to_play, policy_index=index, policy_prob=prob,
        value=r.float(S.P_VALUE), score=r.float(S.P_SCORE), ownership=ownership,
        policy_weight=r.float(S.P_POLICY_WEIGHT), value_weight=r.float(S.P_VALUE_WEIGHT),
        ownership_weight=r.float(S.P_OWNERSHIP_WEIGHT), score_weight=r.float(S.P_SCORE_WEIGHT),
        game_id=r.text(S.P_GAME_ID), move_number=r.int(S.P_MOVE_NUMBER),
        generation=r.int(S.P_GENERATION), version=version,
    )


def encode_shard(records: Sequence[bytes]) -> bytes:
    """A whole shard file: GZIP TFRecord of serialized position records."""
    return compress_gzip(frame_records(records))


def read_shard(data: bytes, source: str) -> list[PositionRecord]:
    """Decode a whole shard (tools and tests; the trainer streams with tf.data)."""
    try:
        raw = decompress_for(source, data)
        return [decode_position(rec, f"{source}#{i}") for i, rec in enumerate(iter_framed_records(raw, source))]
    except RecordError as exc:
        raise FormatError(source, None, str(exc).split(": ", 1)[-1]) from None


# --------------------------------------------------------------------------
# Batched position encoder (the Beam job's hot path)
# --------------------------------------------------------------------------
#
# Building one protobuf message per position costs ~15 us in Python; the
# shuffle job writes tens of thousands of positions a second.  Position
# records all share one shape, so this writes the protobuf wire format
# directly: an Example is field 1 (Features), Features is a repeated map
# entry (field 1) of {key: field 1, value: field 2 (Feature)}, and a Feature
# is bytes_list (1), float_list (2, packed float32) or int64_list (3, packed
# varints).  Map entries may come in any order on the wire; these are
# emitted in the order protobuf's deterministic serializer uses (upb sorts
# "x_weight" before "x"), so the bytes match encode_position's, and a test
# asserts that both parse to equal messages.
#
# A per-record Python loop (one join of ~30 pieces, varints, two CRC calls
# for the frame) still cost ~12 us a position, so the whole batch is built
# with numpy instead (`_Gather`): each record is the same list of columns
# (constants, entries cached per distinct value such as a game id or a
# policy length, and rows of the callers' arrays), and one gather writes all
# records.  What is left per record is one crc32c call when framing.


def _varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # int64 negatives are 10-byte two's complement
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


def _entry(key: str, feature: bytes) -> bytes:
    inner = _len_field(0x0A, key.encode()) + _len_field(0x12, feature)
    return _len_field(0x0A, inner)


def _feature_bytes(value: bytes) -> bytes:
    return _len_field(0x0A, _len_field(0x0A, value))


def _feature_floats(packed: bytes) -> bytes:
    return _len_field(0x12, _len_field(0x0A, packed) if packed else b"")


def _feature_ints(packed_varints: bytes) -> bytes:
    return _len_field(0x1A, _len_field(0x0A, packed_varints) if packed_varints else b"")


def _varints_up_to_14_bits(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varint-encode non-negative ints < 2**14 at once.

    Returns (bytes uint8[total], byte offsets int64[len(values)+1]).
    """
    values = np.asarray(values, dtype=np.int64)
    two = values >= 0x80
    lengths = 1 + two
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    out = np.empty(offsets[-1], dtype=np.uint8)
    starts = offsets[:-1]
    out[starts] = (values & 0x7F) | (two * 0x80)
    out[starts[two] + 1] = values[two] >> 7
    return out, offsets


def _byte_table(entries: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes uint8[total], starts int64[E], lengths int64[E]) of byte strings laid end to end."""
    lengths = np.fromiter((len(e) for e in entries), np.int64, len(entries))
    starts = np.zeros(len(entries), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return np.frombuffer(b"".join(entries), np.uint8), starts, lengths


class _Gather:
    """Records assembled from byte segments, all at once.

    Every record is the same sequence of K *columns*; column k of record i is
    ``lengths[i, k]`` bytes starting at ``starts[i, k]`` of one shared pool
    (constants, cached entries and the callers' arrays laid end to end).  One
    fancy-indexing gather then writes every record, so the Python cost is per
    column, not per record.
    """

    def __init__(self, count: int):
        self.count = count
        self.pool: list[np.ndarray] = []
        self.pool_size = 0
        self.starts: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []

    def _add_pool(self, data: np.ndarray) -> int:
        base = self.pool_size
        self.pool.append(data)
        self.pool_size += len(data)
        return base

    def const(self, data: bytes) -> None:
        base = self._add_pool(np.frombuffer(data, np.uint8))
        self.starts.append(np.full(self.count, base, np.int64))
        self.lengths.append(np.full(self.count, len(data), np.int64))

    def table(self, entries: Sequence[bytes], which: np.ndarray, first: bool = False) -> None:
        """Record i gets ``entries[which[i]]`` (as its first column if ``first``)."""
        data, starts, lengths = _byte_table(entries)
        base = self._add_pool(data)
        at = 0 if first else len(self.starts)
        self.starts.insert(at, starts[which] + base)
        self.lengths.insert(at, lengths[which])

    def rows(self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Record i gets ``data[starts[i]:starts[i] + lengths[i]]``."""
        base = self._add_pool(np.ascontiguousarray(data, np.uint8).reshape(-1))
        self.starts.append(np.asarray(starts, np.int64) + base)
        self.lengths.append(np.broadcast_to(np.asarray(lengths, np.int64), (self.count,)))

    def fixed(self, data: np.ndarray, width: int) -> None:
        """Record i gets row i of ``data`` viewed as uint8[count, width]."""
        self.rows(data, np.arange(self.count, dtype=np.int64) * width, width)

    def record_lengths(self) -> np.ndarray:
        return np.sum(self.lengths, axis=0) if self.lengths else np.zeros(self.count, np.int64)

    def gather(self) -> tuple[np.ndarray, np.ndarray]:
        """(every record end to end uint8[total], offsets int64[count+1])."""
        pool = np.concatenate(self.pool) if self.pool else np.zeros(0, np.uint8)
        starts = np.stack(self.starts, axis=1)  # [count, K]
        lengths = np.stack(self.lengths, axis=1)
        offsets = np.zeros(self.count + 1, np.int64)
        np.cumsum(lengths.sum(axis=1), out=offsets[1:])
        # The copy loop trusts its input: check every segment lies in the pool.
        if len(starts) and ((lengths < 0).any() or (starts < 0).any() or (starts + lengths > len(pool)).any()):
            raise ValueError("a record segment lies outside the byte pool")
        out = np.empty(offsets[-1], np.uint8)
        gather_segments(pool, starts, lengths, out)
        return out, offsets


def _unique_entries(values, make_entry) -> tuple[list[bytes], np.ndarray]:
    """(entry bytes per distinct value, which entry each record uses).

    Integer columns (move numbers, lengths, generations) span small ranges,
    so a lookup table over [min, max] finds the distinct values in linear
    time; np.unique's sort was a tenth of the encoder's time.  Strings (game
    ids) come in runs, one per game: an entry per run is cheap and a repeated
    entry only costs pool bytes.
    """
    values = np.asarray(values).reshape(-1)
    if not len(values):
        return [], np.zeros(0, np.int64)
    if values.dtype.kind in "iu":
        low = int(values.min())
        span = int(values.max()) - low + 1
        if span <= 4 * len(values) + 1024:
            present = np.zeros(span, bool)
            present[values - low] = True
            distinct = np.flatnonzero(present)
            lookup = np.cumsum(present) - 1
            return [make_entry(int(v) + low) for v in distinct.tolist()], lookup[values - low]
        distinct, which = np.unique(values, return_inverse=True)
        return [make_entry(v) for v in distinct.tolist()], which.reshape(-1)
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    which = np.cumsum(np.r_[True, values[1:] != values[:-1]]) - 1
    return [make_entry(v) for v in values[starts].tolist()], which


def _position_gather(
    *, board_size: int, planes_packed: np.ndarray, to_play, policy_offsets, policy_index, policy_prob,
    value, score, ownership: np.ndarray, policy_weight, value_weight, ownership_weight, score_weight,
    game_id, move_number, generation, framed: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Every position record (TFRecord frames if ``framed``) end to end, and their offsets."""
    n = board_size
    nn = n * n
    count = len(planes_packed)
    planes_packed = np.ascontiguousarray(planes_packed, dtype=np.uint8)
    ownership = np.ascontiguousarray(ownership, dtype=np.int8)
    if planes_packed.shape != (count, S.packed_plane_bytes(n, S.PACKED_PLANES)):
        raise ValueError(f"planes_packed has shape {planes_packed.shape}")
    if ownership.shape != (count, nn):
        raise ValueError(f"ownership has shape {ownership.shape}")
    policy_offsets = np.asarray(policy_offsets, dtype=np.int64)
    policy_index = np.asarray(policy_index, dtype=np.int64)
    if len(policy_index) and (policy_index.min() < 0 or policy_index.max() > nn):
        raise ValueError(f"policy index outside 0..{nn}")
    if count == 0:
        return np.zeros(0, np.uint8), np.zeros(1, np.int64)
    index_bytes, index_byte_offsets = _varints_up_to_14_bits(policy_index)
    plane_len = planes_packed.shape[1]

    def floats(a):
        return np.frombuffer(np.asarray(a, dtype="<f4").reshape(-1).tobytes(), np.uint8)

    ids = np.asarray(game_id)
    if ids.dtype.kind == "U":
        id_entries, id_which = _unique_entries(ids, lambda g: _entry(S.P_GAME_ID, _feature_bytes(g.encode())))
    elif ids.dtype.kind == "S":
        id_entries, id_which = _unique_entries(ids, lambda g: _entry(S.P_GAME_ID, _feature_bytes(g)))
    else:
        raise ValueError(f"game_id must hold strings, got dtype {ids.dtype}")

    def int_column(key, values):
        return _unique_entries(np.asarray(values, dtype=np.int64),
                               lambda v: _entry(key, _feature_ints(_varint(v))))

    def float_prefix(key):
        return _entry(key, _feature_floats(b"\0\0\0\0"))[:-4]

    # The policy entries' headers depend only on the payload length.
    policy_counts = np.diff(policy_offsets)
    index_lengths = index_byte_offsets[policy_offsets[1:]] - index_byte_offsets[policy_offsets[:-1]]

    def length_prefix(key, make_feature, lengths):
        def prefix(length):
            whole = _entry(key, make_feature(bytes(length)))
            return whole[: len(whole) - length]
        return _unique_entries(lengths, prefix)

    body = _Gather(count)
    # Map entries in the order protobuf's deterministic serializer emits them.
    body.const(_entry(S.P_BOARD_SIZE, _feature_ints(_varint(n))))
    body.table(id_entries, id_which)
    body.table(*int_column(S.P_GENERATION, generation))
    body.table(*int_column(S.P_MOVE_NUMBER, move_number))
    body.const(float_prefix(S.P_OWNERSHIP_WEIGHT))
    body.fixed(floats(ownership_weight), 4)
    body.const(_entry(S.P_OWNERSHIP, _feature_bytes(bytes(nn)))[:-nn])
    body.fixed(ownership.view(np.uint8), nn)
    body.const(_entry(S.P_PLANES, _feature_bytes(bytes(plane_len)))[:-plane_len])
    body.fixed(planes_packed, plane_len)
    body.table(*length_prefix(S.P_POLICY_INDEX, _feature_ints, index_lengths))
    body.rows(index_bytes, index_byte_offsets[policy_offsets[:-1]], index_lengths)
    body.table(*length_prefix(S.P_POLICY_PROB, _feature_floats, 4 * policy_counts))
    body.rows(floats(policy_prob), 4 * policy_offsets[:-1], 4 * policy_counts)
    body.const(float_prefix(S.P_POLICY_WEIGHT))
    body.fixed(floats(policy_weight), 4)
    body.const(float_prefix(S.P_SCORE_WEIGHT))
    body.fixed(floats(score_weight), 4)
    body.const(float_prefix(S.P_SCORE))
    body.fixed(floats(score), 4)
    body.table(*int_column(S.P_TO_PLAY, to_play))
    body.const(float_prefix(S.P_VALUE_WEIGHT))
    body.fixed(floats(value_weight), 4)
    body.const(float_prefix(S.P_VALUE))
    body.fixed(floats(value), 4)
    body.const(_entry(S.P_VERSION, _feature_ints(_varint(S.FORMAT_VERSION))))

    # Example.features (field 1) wraps the body: its tag and length go in
    # front, one entry per distinct body length.
    body_lengths = body.record_lengths()
    header_entries, header_which = _unique_entries(body_lengths, lambda k: b"\x0a" + _varint(k))
    body.table(header_entries, header_which, first=True)
    if not framed:
        return body.gather()
    # A TFRecord frame: length and its CRC in front (one per distinct
    # length), the data CRC behind (written after the gather).
    body.table(*_unique_entries(body.record_lengths(), frame_header), first=True)
    body.const(bytes(4))
    out, offsets = body.gather()
    fill_data_crcs(out, offsets)
    return out, offsets


def encode_positions(
    *, board_size: int, planes_packed: np.ndarray, to_play, policy_offsets, policy_index, policy_prob,
    value, score, ownership: np.ndarray, policy_weight, value_weight, ownership_weight, score_weight,
    game_id: Sequence[str], move_number, generation,
) -> list[bytes]:
    """Serialize P position records at once; byte-identical to encode_position.

    ``planes_packed`` is uint8[P, packed_plane_bytes(N, 16)], ``ownership``
    int8[P, N*N]; the policy of record i is
    ``policy_index/prob[policy_offsets[i]:policy_offsets[i+1]]``.
    ``game_id`` holds str (or a numpy bytes array).
    """
    data, offsets = _position_gather(
        board_size=board_size, planes_packed=planes_packed, to_play=to_play, policy_offsets=policy_offsets,
        policy_index=policy_index, policy_prob=policy_prob, value=value, score=score, ownership=ownership,
        policy_weight=policy_weight, value_weight=value_weight, ownership_weight=ownership_weight,
        score_weight=score_weight, game_id=game_id, move_number=move_number, generation=generation,
        framed=False)
    blob, bounds = data.tobytes(), offsets.tolist()
    return [blob[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def encode_positions_framed(**fields) -> tuple[np.ndarray, np.ndarray]:
    """Like encode_positions, but each record already framed as a TFRecord.

    Takes encode_positions' keyword arguments.  Returns (every frame end to
    end as uint8[total], int64[P+1] frame offsets): frame i is
    ``data[off[i]:off[i+1]]``, byte-identical to
    ``frame_records([encode_positions(...)[i]])``.
    """
    return _position_gather(framed=True, **fields)


