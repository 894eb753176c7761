"""Endstate labels: final ownership and score for every game of the window.

A game record carries its result (the value target) but an ownership map only when it ended on
the board.  This module gives every game an ownership label, float32[N*N] in [-1, 1] from Black's
side, and its source (schema.OWNERSHIP_*):
* the moves reach two passes (`ended_by_two_passes`: `END_TWO_PASSES`, or a resignation played out
  by self-play, `OWNERSHIP_ACCELERATED`): replayed with the Cython engine, labelled with the exact
  Tromp-Taylor ownership of the final board (weight 1).  Its score's disagreements with the
  recorded winner are counted, never "fixed"; moves that do not replay fall back to the recorded
  final planes.
* resigned without play-out, or stopped at the move cap: the final position is *played out*,
  with a published model (`model_playout_labels`: policy-sampled moves, one batched call per move for a
  bundle's games, then one random playout; OWNERSHIP_MODEL_PLAYOUT) or else as the mean of many
  random playouts (a soft label, OWNERSHIP_RANDOM_PLAYOUTS).  Played-out labels weigh less.

The shard writer turns labels to the side to move's view as int8 ``round(o * 127)``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from format import schema
from format.codec import GameRecord
from format.planes import input_planes_of

PolicyFn = Callable[[np.ndarray], dict]
"""A model: float32[B, N, N, C] -> {'policy_logits': [B, N*N+1], ...}; C is its ``input_planes``
attribute (inference.model_files.LoadedModel's), 17 when it has none."""

LABEL_STATS = (
    "games_labelled",
    "final_board",
    "final_board_result_disagreements",
    "replay_failed",
    "replay_board_mismatch",
    "played_out_model",
    "played_out_random",
    "playout_winner_checked",
    "playout_winner_agreements",
    "unlabelled",
)
"""Counters this module reports, summed over bundles into the manifest."""


@dataclasses.dataclass
class EndstateLabel:
    """The endstate label of one game (Black's side)."""

    ownership: np.ndarray
    """float32[N*N] in [-1, 1]."""
    score: float
    """Final area score, Black's side, komi included; NaN when unknown."""
    source: int
    """schema.OWNERSHIP_*; OWNERSHIP_NONE means no label (weight 0)."""
    weight: float
    """Loss weight of the ownership and score targets."""


def _engine():
    # Imported late: the compiled engine must not be needed to import the
    # pipeline package (e.g. the driver on a machine without a build).
    from engine import board

    return board


def tromp_taylor_ownership(stones: np.ndarray) -> np.ndarray:
    """int8[N*N] Tromp-Taylor ownership of a stone array, in plain numpy/Python.

    Used only when a record's moves do not replay on the engine (so
    `Board.set_position` may refuse its board, e.g. a chain without
    liberties).  A stone owns its point; an empty region reaching only one
    colour belongs to it; otherwise it is neutral.
    """
    stones = np.asarray(stones, dtype=np.int8)
    n = stones.shape[0]
    flat = stones.ravel()
    owner = flat.copy()
    seen = np.zeros(n * n, dtype=bool)
    for start in np.flatnonzero(flat == 0):
        if seen[start]:
            continue
        region, reaches, stack = [], set(), [int(start)]
        seen[start] = True
        while stack:
            p = stack.pop()
            region.append(p)
            r, c = divmod(p, n)
            for q in (
                (p - n) if r else -1,
                (p + n) if r < n - 1 else -1,
                (p - 1) if c else -1,
                (p + 1) if c < n - 1 else -1,
            ):
                if q < 0:
                    continue
                if flat[q] == 0:
                    if not seen[q]:
                        seen[q] = True
                        stack.append(q)
                else:
                    reaches.add(int(flat[q]))
        owner[region] = reaches.pop() if len(reaches) == 1 else 0
    return owner


def final_board(game: GameRecord) -> np.ndarray:
    """int8[N, N] board after the last move of a game that ended by passing.

    Position i is the board *before* move i, so when the last move is a pass
    the last position is the final board.
    """
    planes = game.planes[-1]
    return planes[0].astype(np.int8) - planes[1].astype(np.int8)


def replay(game: GameRecord):
    """The engine board after every move of ``game``, or None if a move is illegal.

    The cap leaves room for a playout of 3*N*N more moves after the game.
    """
    engine = _engine()
    n = game.board_size
    board = engine.Board(n, game.komi, len(game.moves) + 3 * n * n)
    try:
        for move in game.moves.tolist():
            board.play(move)
    except engine.IllegalMove:
        return None
    return board


def winner_of(score: float) -> int:
    return schema.BLACK if score > 0 else (schema.WHITE if score < 0 else 0)


def ended_by_two_passes(game: GameRecord) -> bool:
    """Whether the record's moves reach two passes, so its final board is exact.

    A resigned game keeps ``END_RESIGN`` (its winner is the resignation's)
    even when self-play played it on to two passes; the record says so with
    ownership source ``OWNERSHIP_ACCELERATED`` (SPEC.md, chunk table).
    Playing such a final board out again would only cost time and, worse,
    give an exact label the lower played-out weight.
    """
    return game.end_reason == schema.END_TWO_PASSES or game.ownership_source == schema.OWNERSHIP_ACCELERATED


def final_board_label(game: GameRecord, board, stats: dict, accelerated_weight: float = 1.0) -> EndstateLabel:
    """Exact label of a game whose moves reach two passes (see module docstring): weight 1, or
    ``accelerated_weight`` when its source is ACCELERATED (a resigned game that self-play finished
    with cheap moves: exact for that ending, which is near random)."""
    stats["final_board"] += 1
    n = game.board_size
    if board is not None:
        ownership = board.ownership()
        score = float(board.area_score())
        if len(game.moves) and game.moves[-1] == n * n and not np.array_equal(board.stones(), final_board(game)):
            stats["replay_board_mismatch"] += 1
    else:
        ownership = tromp_taylor_ownership(final_board(game))
        score = float(ownership.sum()) - game.komi
    if game.winner and winner_of(score) != game.winner:
        stats["final_board_result_disagreements"] += 1
    if game.ownership_source == schema.OWNERSHIP_ACCELERATED:
        return EndstateLabel(ownership.astype(np.float32), score, schema.OWNERSHIP_ACCELERATED, accelerated_weight)
    return EndstateLabel(ownership.astype(np.float32), score, schema.OWNERSHIP_FINAL_BOARD, 1.0)


def random_playout_label(board, num_playouts: int, seed: int, weight: float) -> EndstateLabel:
    """Mean ownership over random playouts (eye rule) from ``board``."""
    from engine.playouts import playout_ownership  # late, as _engine: the compiled engine

    mean = playout_ownership(board, num_playouts, seed)
    score = float(mean.sum()) - board.komi
    return EndstateLabel(mean.astype(np.float32), score, schema.OWNERSHIP_RANDOM_PLAYOUTS, weight)


def _sample_moves(logits: np.ndarray, legal: np.ndarray, temperature: float, rng: np.random.Generator):
    """One move per row from softmax(logits / T) over the legal actions."""
    scaled = np.where(legal, logits / temperature, -np.inf)
    scaled -= scaled.max(axis=1, keepdims=True)
    probs = np.exp(scaled)
    probs /= probs.sum(axis=1, keepdims=True)
    cumulative = probs.cumsum(axis=1)
    draws = rng.random(len(probs))[:, None] * cumulative[:, -1:]
    return np.minimum((cumulative < draws).sum(axis=1), probs.shape[1] - 1)


def model_playout_labels(
    boards: Sequence,
    policy_fn: PolicyFn,
    *,
    max_moves: int,
    temperature: float,
    rng: np.random.Generator,
    weight: float,
) -> list[EndstateLabel]:
    """Play every board out with the model, batched, then finish randomly.

    Each step makes one network call for all boards still playing.  A board
    leaves the model phase when the model picks pass (passing is left to the
    eye-rule random playout, which only passes once nothing useful is left)
    or after ``max_moves``.  ``boards`` are not modified.
    """
    boards = [b.copy() for b in boards]
    if not boards:
        return []
    n = boards[0].size
    playing = [i for i, b in enumerate(boards) if not b.is_over]
    channels = input_planes_of(policy_fn)
    for _ in range(max_moves):
        if not playing:
            break
        features = np.stack([boards[i].features(channels) for i in playing]).astype(np.float32)
        logits = np.asarray(policy_fn(features)["policy_logits"], dtype=np.float64)
        if logits.shape != (len(playing), n * n + 1):
            raise ValueError(
                f"model returned policy_logits of shape {logits.shape}, expected {(len(playing), n * n + 1)}"
            )
        legal = np.stack([boards[i].legal_mask() for i in playing]).astype(bool)
        moves = _sample_moves(logits, legal, temperature, rng)
        still = []
        for i, move in zip(playing, moves.tolist()):
            if move == n * n:
                continue
            boards[i].play(move)
            if not boards[i].is_over:
                still.append(i)
        playing = still
    labels = []
    for board in boards:
        if not board.is_over:
            board.random_playout(int(rng.integers(1 << 62)))
        labels.append(
            EndstateLabel(
                board.ownership().astype(np.float32), float(board.area_score()), schema.OWNERSHIP_MODEL_PLAYOUT, weight
            )
        )
    return labels


def empty_stats() -> dict:
    return {name: 0 for name in LABEL_STATS}


def label_games(
    games: Sequence[GameRecord],
    *,
    policy_fn: PolicyFn | None,
    random_playouts: int,
    model_playout_moves: int,
    temperature: float,
    playout_weight: float,
    rng: np.random.Generator,
    stats: dict,
    accelerated_weight: float = 1.0,
) -> list[EndstateLabel]:
    """An EndstateLabel per game; counts what happened into ``stats``."""
    labels: list[EndstateLabel | None] = [None] * len(games)
    to_play_out = []  # (game index, engine board at the end of the record)
    for i, game in enumerate(games):
        board = replay(game)
        if board is None:
            stats["replay_failed"] += 1
        if ended_by_two_passes(game):
            labels[i] = final_board_label(game, board, stats, accelerated_weight)
        elif board is not None:
            to_play_out.append((i, board))
    if to_play_out:
        boards = [b for _, b in to_play_out]
        if policy_fn is not None:
            n = games[to_play_out[0][0]].board_size
            played = model_playout_labels(
                boards,
                policy_fn,
                max_moves=model_playout_moves or 2 * n * n,
                temperature=temperature,
                rng=rng,
                weight=playout_weight,
            )
            stats["played_out_model"] += len(played)
        else:
            played = [
                random_playout_label(b, random_playouts, int(rng.integers(1 << 62)), playout_weight) for b in boards
            ]
            stats["played_out_random"] += len(played)
        for (i, _), label in zip(to_play_out, played):
            labels[i] = label
            if games[i].winner:
                stats["playout_winner_checked"] += 1
                stats["playout_winner_agreements"] += int(winner_of(label.score) == games[i].winner)
    labelled = []
    for game, final in zip(games, labels):
        if final is None:  # not two passes and the moves do not replay
            stats["unlabelled"] += 1
            final = EndstateLabel(np.zeros(game.board_size**2, np.float32), math.nan, schema.OWNERSHIP_NONE, 0.0)
        labelled.append(final)
    stats["games_labelled"] += len(games)
    return labelled
