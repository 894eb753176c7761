"""Legal random Go games recorded the way self-play records them, for tests and benchmarks.

`testdata.synthetic_games` makes game records without a Go engine: its stone
placements are not legal games, so they exercise the format but not what
consumes real games (the shuffle job replays every game on the engine to
label it, and plays resigned games out).  This module plays real games on
the Cython engine instead, cheaply (random moves, no network, no search),
and records them as `selfplay.worker` would:

    rng --> engine_game()  --GameRecord (two passes, final-board ownership)-->
            symmetric_copy() --the same game under one of the 8 board symmetries-->
            resigned_copy()  --its first part, recorded as a resignation-->
            codec.encode_chunk() --> a lake (tests, bench/pipeline.py)

Moves are uniformly random among the legal points that do not fill a point
whose four neighbours are all the mover's own stones (or the edge); a player
passes when nothing else is left, so games end by two passes with live
groups on the board.  Policy targets are either a tiny fixed target
(``visits == 0``, what the pipeline tests check against) or visit counts
shaped like a real search's (``visits > 0``, `testdata.synthetic_games`'s
`synthetic_visit_counts`, with playout-cap randomization).
"""

from __future__ import annotations

import dataclasses
import uuid

import numpy as np

from format import schema, symmetry
from format.codec import GameRecord
from testdata.synthetic_games import synthetic_visit_counts


def _points_enclosed_by(stones: np.ndarray, colour: int) -> np.ndarray:
    """bool[N*N]: points whose four neighbours are each ``colour`` or off the board.

    Filling such a point is filling one's own single-point eye (false eyes
    included, unlike the engine's `Board.sensible_mask`, whose true-eye rule
    lets a player fill a false eye).  Vectorized: the old per-point Python
    check dominated the cost of a game.
    """
    own = np.pad(stones == colour, 1, constant_values=True)
    return (own[:-2, 1:-1] & own[2:, 1:-1] & own[1:-1, :-2] & own[1:-1, 2:]).ravel()


def random_move(board, rng: np.random.Generator, stones=None, legal_mask=None) -> int:
    """This module's move rule: uniform over the legal points that do not fill one of the
    mover's own single-point eyes; pass (N*N) when none is left.  ``stones`` and
    ``legal_mask`` may be passed when the caller already has them."""
    points = board.N * board.N
    stones = board.stones() if stones is None else stones
    legal_mask = board.legal_mask() if legal_mask is None else legal_mask
    playable = np.flatnonzero(legal_mask[:points].astype(bool) & ~_points_enclosed_by(stones, board.to_play))
    return int(rng.choice(playable)) if len(playable) else points


def engine_game(
    rng: np.random.Generator,
    board_size: int,
    *,
    generation: int = 0,
    komi: float = schema.DEFAULT_KOMI,
    worker_id: str = "test",
    visits: int = 0,
    full_search_fraction: float = 1.0,
) -> GameRecord:
    """A legal random game to two passes, recorded as self-play would.

    ``visits == 0``: every position is fully searched with the target
    {played move: 3, one random action: 1} and root values are 0 (the
    pipeline tests rely on this exact shape and on the draws from ``rng``).
    ``visits > 0``: like `testdata.synthetic_games.synthetic_game`, a position is
    fully searched with probability ``full_search_fraction`` and then gets
    ``visits`` search-shaped visit counts over the legal actions plus one on
    the played move; other positions get no policy target.  Root values are
    a slow random walk, from the side to move.
    """
    # Imported late: importing this module (and the test helpers that
    # re-export it) must not need the compiled engine.
    from engine.board import Board

    n = board_size
    points = n * n
    board = Board(n, komi)
    moves, planes, indices, values, full = [], [], [], [], []
    while not board.is_over:
        stones = board.stones()
        planes.append(np.stack([stones == schema.BLACK, stones == schema.WHITE]).astype(np.uint8))
        legal_mask = board.legal_mask()
        move = random_move(board, rng, stones, legal_mask)
        if visits == 0:
            # A one-hot "search" target on the played move plus one other move.
            other = int(rng.integers(0, points + 1))
            target = {move: 3, other: 1} if other != move else {move: 4}
            indices.append(np.array(sorted(target), np.int64))
            values.append(np.array([target[k] for k in sorted(target)], np.int64))
            full.append(True)
        elif rng.random() < full_search_fraction:
            # Searched over every legal action (pass included, as the search does).
            counts = synthetic_visit_counts(rng, np.flatnonzero(legal_mask), visits)
            counts[move] += 1  # the played move was searched
            nonzero = np.flatnonzero(counts)
            indices.append(nonzero.astype(np.int64))
            values.append(counts[nonzero].astype(np.int64))
            full.append(True)
        else:
            # A fast (playout-cap) search: self-play records no policy target.
            indices.append(np.zeros(0, np.int64))
            values.append(np.zeros(0, np.int64))
            full.append(False)
        board.play(move)
        moves.append(move)
    m = len(moves)
    if visits == 0:
        root_values = np.zeros(m, np.float32)
    else:
        walk = np.clip(np.cumsum(rng.normal(0, 0.05, m)), -1, 1)
        to_play = np.where(np.arange(m) % 2 == 0, schema.BLACK, schema.WHITE)
        root_values = (walk * to_play).astype(np.float32)
    score = float(board.area_score())
    return GameRecord(
        board_size=n,
        komi=komi,
        game_id=uuid.UUID(bytes=rng.bytes(16)).hex,
        generation=generation,
        worker_id=worker_id,
        moves=np.array(moves, np.int16),
        planes=np.array(planes, np.uint8),
        policy_indices=indices,
        policy_values=values,
        root_values=root_values,
        full_search=np.array(full, bool),
        winner=schema.BLACK if score > 0 else schema.WHITE,
        score=score,
        end_reason=schema.END_TWO_PASSES,
        ownership=board.ownership(),
        ownership_source=schema.OWNERSHIP_FINAL_BOARD,
    )


def resigned_copy(game: GameRecord, fraction: float) -> GameRecord:
    """The first ``fraction`` of ``game``, recorded as a resignation by the loser.

    The winner stays the finished game's; score and ownership become unknown,
    so whoever labels the copy has to play its last position out.
    """
    cut = max(1, int(game.num_positions * fraction))
    return GameRecord(
        board_size=game.board_size,
        komi=game.komi,
        game_id=game.game_id + "r",
        generation=game.generation,
        worker_id=game.worker_id,
        moves=game.moves[:cut],
        planes=game.planes[:cut],
        policy_indices=game.policy_indices[:cut],
        policy_values=game.policy_values[:cut],
        root_values=game.root_values[:cut],
        full_search=game.full_search[:cut],
        winner=game.winner,
        score=float("nan"),
        end_reason=schema.END_RESIGN,
        ownership=None,
        ownership_source=schema.OWNERSHIP_NONE,
    )


def symmetric_copy(game: GameRecord, symmetry_index: int, game_id: str) -> GameRecord:
    """``game`` under board symmetry ``symmetry_index`` (0..7, format.symmetry), as ``game_id``.

    Planes, moves, policy indices and ownership move with the board; PASS
    stays PASS.  Go's rules (captures, suicide, superko, area score) do not
    depend on orientation, so the copy is as legal as the original and has
    the same result.  Policy indices are re-sorted, as the format requires.
    """
    n = game.board_size
    where = symmetry.symmetry_permutations(n)[symmetry_index]  # where[a] = image of action a
    indices, values = [], []
    for idx, val in zip(game.policy_indices, game.policy_values):
        moved = where[np.asarray(idx, np.int64)].astype(np.int64)
        order = np.argsort(moved, kind="stable")
        indices.append(moved[order])
        values.append(np.asarray(val)[order])
    ownership = None
    if game.ownership is not None:
        ownership = symmetry.apply_symmetry_to_planes(np.asarray(game.ownership).reshape(n, n), symmetry_index).reshape(
            -1
        )
    return dataclasses.replace(
        game,
        game_id=game_id,
        moves=where[np.asarray(game.moves, np.int64)].astype(np.int16),
        planes=symmetry.apply_symmetry_to_planes(game.planes, symmetry_index),
        policy_indices=indices,
        policy_values=values,
        ownership=ownership,
    )
