"""Plausible synthetic game records, for tests, benchmarks and the demo.

Games are random sequences of stone placements with occasional captures of
single stones (no Go engine needed, so the format can be exercised on its
own).  Policy targets look like search output: ``visits`` visit counts spread
over the empty points, most of them on a handful of favourites and a tail of
one- and two-visit moves, as PUCT produces.
"""

from __future__ import annotations

import uuid

import numpy as np

from format import schema
from format.codec import GameRecord


def synthetic_visit_counts(rng: np.random.Generator, legal: np.ndarray, visits: int) -> np.ndarray:
    """Visit counts over ``legal`` action indices shaped like a real search's."""
    favourites = rng.choice(legal, size=min(len(legal), int(rng.integers(2, 7))), replace=False)
    # A tail of 5-12% of the legal moves, as PUCT spends its exploration.
    tail_size = int(rng.integers(max(2, len(legal) // 20), max(3, len(legal) // 8)))
    tail = rng.choice(legal, size=min(len(legal), tail_size), replace=False)
    p = np.zeros(legal.max() + 1)
    p[favourites] += 0.85 * rng.dirichlet(np.ones(len(favourites)))
    p[tail] += 0.15 / len(tail)
    counts = rng.multinomial(visits, p / p.sum())
    return counts


def synthetic_game(
    rng: np.random.Generator,
    board_size: int,
    *,
    visits: int,
    full_search_fraction: float = 1.0,
    generation: int = 0,
    worker_id: str = "synthetic",
    komi: float = schema.DEFAULT_KOMI,
    max_moves: int | None = None,
) -> GameRecord:
    """One game of ``~0.8 N^2`` moves ending in two passes."""
    n = board_size
    points = n * n
    length = max_moves or int(rng.integers(int(0.6 * points), int(0.9 * points)))
    board = np.zeros(points, dtype=np.int8)
    moves, planes, indices, values, roots, full = [], [], [], [], [], []
    colour = schema.BLACK
    value = 0.0
    for i in range(length + 2):
        planes.append(np.stack([board == schema.BLACK, board == schema.WHITE]).reshape(2, n, n))
        empty = np.flatnonzero(board == 0)
        passing = i >= length or len(empty) == 0
        move = points if passing else int(rng.choice(empty))
        is_full = bool(rng.random() < full_search_fraction)
        if is_full:
            legal = np.append(empty, points)
            counts = synthetic_visit_counts(rng, legal, visits)
            counts[move] += 1  # the played move was searched
            nz = np.flatnonzero(counts)
            indices.append(nz)
            values.append(counts[nz])
        else:
            indices.append(np.zeros(0, dtype=np.int64))
            values.append(np.zeros(0, dtype=np.int64))
        value = float(np.clip(value + rng.normal(0, 0.05), -1, 1))
        roots.append(value if colour == schema.BLACK else -value)
        full.append(is_full)
        moves.append(move)
        if not passing:
            board[move] = colour
            if rng.random() < 0.05:  # an occasional capture of one enemy stone
                enemy = np.flatnonzero(board == -colour)
                if len(enemy):
                    board[rng.choice(enemy)] = 0
        colour = -colour
    black = int((board == schema.BLACK).sum())
    white = int((board == schema.WHITE).sum())
    score = black - white - komi
    ownership = board.copy()
    return GameRecord(
        board_size=n,
        komi=komi,
        game_id=uuid.UUID(bytes=rng.bytes(16)).hex,
        generation=generation,
        worker_id=worker_id,
        moves=np.array(moves, dtype=np.int16),
        planes=np.array(planes, dtype=np.uint8),
        policy_indices=indices,
        policy_values=values,
        root_values=np.array(roots, dtype=np.float32),
        full_search=np.array(full),
        winner=schema.BLACK if score > 0 else schema.WHITE,
        score=float(score),
        end_reason=schema.END_TWO_PASSES,
        ownership=ownership,
        ownership_source=schema.OWNERSHIP_FINAL_BOARD,
    )
