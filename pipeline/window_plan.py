"""Which chunks make up the training window (runs in the driver, before Beam).

*Lake positions* T: positions in every chunk under ``games/``.  The *window* is the newest chunks
whose positions add up to `window_positions` of T, by KataGo's rule (shuffle.py's
``compute_desired_num_rows``): the whole lake while small, then a power law that keeps growing
ever more slowly, so old generations drop out::

    W(T) = T                                               for T <= m
    W(T) = m + b * s * ((1 + (T - m) / s) ** a - 1) / a    for T > m

with m = window_min_positions, s = window_scale, a = window_exponent, b = window_slope (dW/dT at
T = m; KataGo's ``expand_window_per_row`` is 0.4).  A chunk's size is known from a listing but its
positions are not, so the newest few chunks are decoded to learn positions per byte and every
chunk is estimated from its size (the manifest records estimate and actual).  A *bundle* is whole
chunks of about `bundle_positions` positions, one coarse Beam element.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from format import codec, layout, schema
from pipeline import positions as P


@dataclasses.dataclass(frozen=True)
class ChunkRef:
    """One chunk file of the lake, as listed (paths relative to the root)."""

    path: str
    generation: int
    size: int
    time_ms: int
    """Creation time from the file name (layout.chunk_path)."""


@dataclasses.dataclass(frozen=True)
class WindowPlan:
    """What the driver decided: the window's chunks, newest first, in bundles."""

    lake_chunks: int
    lake_positions_estimate: int
    window_positions_target: int
    positions_per_byte: float
    positions_per_game: float
    chunks: tuple
    """ChunkRef, newest first; chunk index = position in this tuple."""
    bundles: tuple
    """Tuples of chunk indices; each bundle is one Beam element."""

    lake_bytes: int = 0
    """Compressed bytes of every listed chunk (the follower's new-data yardstick)."""

    @property
    def window_positions_estimate(self) -> int:
        return int(round(sum(c.size for c in self.chunks) * self.positions_per_byte))


def window_positions(
    total: int, min_positions: int, scale: int, exponent: float, max_positions: int = 0, slope: float = 1.0
) -> int:
    """Desired window size W(T) for T lake positions (module docstring)."""
    if total <= min_positions:
        desired = total
    else:
        x = 1.0 + (total - min_positions) / scale
        desired = min_positions + slope * scale * (x**exponent - 1.0) / exponent
    desired = min(total, int(desired))
    return min(desired, max_positions) if max_positions else desired


def list_chunks(storage) -> list[ChunkRef]:
    """Every chunk under games/, newest first: one listing, nothing decoded."""
    return parse_chunk_listing(storage.list(layout.games_prefix()))


def parse_chunk_listing(objects) -> list[ChunkRef]:
    """ChunkRefs for the chunk files among listed objects, newest first.

    Newest = highest generation, then latest time in the name, then name.
    A chunk is what layout.parse_chunk_path accepts; other files under
    games/ are ignored.
    """
    chunks = []
    for obj in objects:
        name = layout.parse_chunk_path(obj.path)
        if name is not None:
            chunks.append(ChunkRef(obj.path, name.generation, int(obj.size), name.time_ms))
    chunks.sort(key=lambda c: (c.generation, c.time_ms, c.path), reverse=True)
    return chunks


def estimate_positions_per_byte(
    storage, chunks: Sequence[ChunkRef], sample: int, value_only_rows: float = 1.0, after_resignation_rows: float = 1.0
) -> tuple[float, float]:
    """(positions per compressed byte, positions per game), from the newest readable chunks.

    Positions are the rows the window will keep: every position whose move had
    a full search (it carries a policy target), and ``value_only_rows`` of the
    others, in expectation (`pipeline.positions.thin_value_only_rows`), each after a resignation
    kept at ``after_resignation_rows`` (`pipeline.positions.thin_after_resignation_rows`).
    """
    positions = 0.0  # in expectation (rows_kept)
    size = games = 0
    for chunk in chunks:
        if sample <= 0:
            break
        items = list(codec.iter_chunk(storage.read(chunk.path), storage.url(chunk.path)))
        if not items or any(isinstance(item, codec.FormatError) for item in items):
            continue  # damaged: the job will skip and report it; sample another
        positions += sum(rows_kept(g, value_only_rows, after_resignation_rows) for g in items)
        games += len(items)
        size += chunk.size
        sample -= 1
    if not size:
        raise ValueError("none of the sampled chunks under games/ could be decoded")
    return positions / size, positions / games


def rows_kept(game, value_only_rows: float, after_resignation_rows: float = 1.0) -> float:
    """The training rows a game gives in expectation: its full-search positions and
    ``value_only_rows`` of the rest, those after a resignation kept at ``after_resignation_rows``."""
    full = np.asarray(game.full_search, bool)
    keep = np.where(full, 1.0, value_only_rows)
    keep[P.after_resignation([game])] *= after_resignation_rows
    return float(keep.sum())


def bundle_chunks(sizes: Sequence[int], positions_per_byte: float, bundle_positions: int) -> list[tuple]:
    """Group consecutive chunk indices into bundles of about `bundle_positions`."""
    bundles, current, filled = [], [], 0.0
    for index, size in enumerate(sizes):
        current.append(index)
        filled += size * positions_per_byte
        if filled >= bundle_positions:
            bundles.append(tuple(current))
            current, filled = [], 0.0
    if current:
        bundles.append(tuple(current))
    return bundles


def plan_window(
    storage,
    *,
    min_positions: int,
    scale: int,
    exponent: float,
    max_positions: int,
    sample_chunks: int,
    bundle_positions: int,
    slope: float = 1.0,
    value_only_rows: float = 1.0,
    after_resignation_rows: float = 1.0,
) -> WindowPlan:
    """List games/, apply the window rule to the rows kept (`estimate_positions_per_byte`), and
    bundle the chosen chunks."""
    listed = list_chunks(storage)
    if not listed:
        raise ValueError(f"{storage.url(layout.GAMES_DIR)} holds no chunk files (*{schema.CHUNK_SUFFIX})")
    per_byte, per_game = estimate_positions_per_byte(
        storage, listed, sample_chunks, value_only_rows, after_resignation_rows
    )
    total = int(round(sum(c.size for c in listed) * per_byte))
    target = window_positions(total, min_positions, scale, exponent, max_positions, slope)
    chosen, filled = [], 0.0
    for chunk in listed:
        if filled >= target:
            break
        chosen.append(chunk)
        filled += chunk.size * per_byte
    bundles = bundle_chunks([c.size for c in chosen], per_byte, bundle_positions)
    return WindowPlan(
        len(listed),
        total,
        target,
        per_byte,
        per_game,
        tuple(chosen),
        tuple(bundles),
        lake_bytes=sum(c.size for c in listed),
    )


def num_shards(positions: int, reuse: float, shard_positions: int) -> int:
    """Output shards so that each holds about `shard_positions` records."""
    return max(1, math.ceil(positions * reuse / shard_positions))
