"""Synthetic, learnable training windows for tests and benchmarks.

Self-play data takes hours to make; the trainer's tests need a window of
training shards in seconds.  This module writes one in the exact lake layout
and in the record version production writes (format/SPEC.md "Shards":
groups of compact positions, ``windows/<gen>/<attempt>-XXXXX-of-YYYYY.tfrecord.gz``,
the window's game table beside them, ``MANIFEST.json`` last), through the
same encoder as the shuffle job (``format.codec.encode_groups``).

The boards are random, but every target is a simple function of the board,
so a network can learn each head and a test can watch every loss fall:

* ownership: own stone +1, opponent stone -1, empty point: the sign of the
  stone balance among its four neighbours (0 if balanced);
* score: the sum of ownership (an area count), minus komi for Black;
* value: the sign of the score (0 on a tie);
* policy: 0.75 on the first empty point (row-major) touching an opponent
  stone, 0.25 spread over the empty points touching own stones; some
  records have no policy (``policy_weight`` 0, no entries).

A record keeps the board at t and the last 7 moves, from which
the reader rebuilds the 7 older boards.  Here the last 7 moves are stones of
the board at t, alternating colours back from the side that just moved, with
no captures, so the history planes look like a board that filled up over
time.  Each position is its own game: row g of the window's game table holds
position g's ownership (from Black's side) and generation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from format import codec, layout, schema
from format.run_config import RunConfig, ensure_run_config
from format.window_manifest import WINDOW_MANIFEST_VERSION, window_manifest_bytes

SYNTHETIC_KOMI = schema.DEFAULT_KOMI


@dataclass(frozen=True)
class SyntheticPosition:
    """One position: its board, how the last moves reached it, and its targets (NN = N * N)."""

    board: np.ndarray  # int8 [N, N]: BLACK, WHITE or EMPTY (absolute colours)
    to_play: int  # schema.BLACK or schema.WHITE
    last_moves: np.ndarray  # int32 [7]: moves t-1 .. t-7, newest first (PASS = NN)
    policy_index: np.ndarray  # int64 [K], ascending
    policy_prob: np.ndarray  # float32 [K]
    value: float  # side to move's view, like score and ownership
    score: float
    ownership: np.ndarray  # float32 [NN] in {-1, 0, 1}


def _neighbour_sum(board: np.ndarray) -> np.ndarray:
    padded = np.pad(board, 1)
    return padded[:-2, 1:-1] + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:]


def synthetic_position(rng: np.random.Generator, board_size: int) -> SyntheticPosition:
    """A random board (own = +1, opponent = -1 from the side to move) and targets derived from it."""
    n = board_size
    density = rng.uniform(0.1, 0.6)
    mine = rng.choice([1, -1, 0], size=(n, n), p=[density * 0.5, density * 0.5, 1 - density]).astype(np.int8)
    empty = mine == 0
    neighbours = _neighbour_sum(mine.astype(np.int32))
    ownership = np.where(empty, np.sign(neighbours), mine).astype(np.float32)
    to_play = schema.BLACK if rng.random() < 0.5 else schema.WHITE
    komi_for_me = -SYNTHETIC_KOMI if to_play == schema.BLACK else SYNTHETIC_KOMI
    score = float(ownership.sum() + komi_for_me)
    policy_index, policy_prob = _policy_target(rng, mine, neighbours)
    board = (mine * to_play).astype(np.int8)
    return SyntheticPosition(
        board,
        to_play,
        _last_moves(rng, board, to_play),
        policy_index,
        policy_prob,
        float(np.sign(score)),
        score,
        ownership.reshape(-1),
    )


def _last_moves(rng, board: np.ndarray, to_play: int) -> np.ndarray:
    """Moves t-1 .. t-7: distinct stones of the board, the colour alternating back from the side
    that just moved (the opponent of ``to_play``); a pass where that colour has no stone left."""
    n = board.shape[0]
    flat = board.reshape(-1)
    taken = np.zeros(n * n, bool)
    moves = np.full(schema.HISTORY_LENGTH - 1, n * n, np.int32)
    for age in range(1, schema.HISTORY_LENGTH):
        colour = -to_play if age % 2 else to_play
        free = np.flatnonzero((flat == colour) & ~taken)
        if free.size:
            moves[age - 1] = point = rng.choice(free)
            taken[point] = True
    return moves


def _policy_target(rng, board, neighbours):
    n = board.shape[0]
    padded = np.pad(board == -1, 1)
    touches_opponent = padded[:-2, 1:-1] | padded[2:, 1:-1] | padded[1:-1, :-2] | padded[1:-1, 2:]
    empty = (board == 0).reshape(-1)
    main = np.flatnonzero(empty & touches_opponent.reshape(-1))
    rest = np.flatnonzero(empty & (neighbours.reshape(-1) > 0))
    if rng.random() < 0.1:  # no policy target for this record
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    if main.size == 0:
        return np.array([n * n], np.int64), np.array([1.0], np.float32)  # pass
    rest = rest[rest != main[0]]
    if rest.size == 0:
        return main[:1].astype(np.int64), np.array([1.0], np.float32)
    index = np.concatenate([main[:1], rest]).astype(np.int64)
    prob = np.concatenate([[0.75], np.full(rest.size, 0.25 / rest.size)]).astype(np.float32)
    order = np.argsort(index)  # records keep a position's entries in ascending action order
    return index[order], prob[order]


def compact_positions(
    positions: list[SyntheticPosition], *, board_size: int, first_game: int
) -> codec.CompactPositions:
    """The positions in the at-rest form the shuffle job writes (codec.CompactPositions, the policy as
    codec.policy_columns makes it); position i is game ``first_game + i`` of the window's game table (its
    ownership is that row, so no position keeps its own)."""
    count, nn = len(positions), board_size * board_size
    policy_counts = [p.policy_index.size for p in positions]
    offsets = np.concatenate([[0], np.cumsum(policy_counts)]).astype(np.int64)
    policy_prob = np.concatenate([p.policy_prob for p in positions]) if count else np.zeros(0, np.float32)
    policy_index = np.concatenate([p.policy_index for p in positions]).astype(np.int64)
    offsets, policy_index, policy_value = codec.policy_columns(policy_index, policy_prob, offsets)
    has_policy = np.array([c > 0 for c in policy_counts], np.float32)
    ones = np.ones(count, np.float32)
    return codec.CompactPositions(
        board_size=board_size,
        board=codec.pack_trits(codec.colour_codes(np.stack([p.board.reshape(-1) for p in positions]))),
        moves=np.stack([p.last_moves for p in positions]),
        capture_offsets=np.zeros(count + 1, np.int64),
        captures=np.zeros(0, np.int64),
        to_play=np.array([p.to_play for p in positions], np.int8),
        fine=np.zeros(count, bool),
        ownership_fine=np.zeros((0, nn), np.int8),
        value=np.array([p.value for p in positions], np.float32),
        score=np.array([p.score for p in positions], np.float32),
        policy_weight=has_policy,
        value_weight=ones,
        ownership_weight=ones,
        score_weight=ones,
        policy_offsets=offsets,
        policy_index=policy_index,
        policy_value=policy_value,
        game=np.arange(first_game, first_game + count, dtype=np.int64),
        move_number=np.arange(count, dtype=np.int64),
    )


def write_synthetic_window(
    storage, *, target_generation: int, board_size: int, positions: int, shards: int = 2, seed: int = 0
) -> dict:
    """Write ``windows/<target_generation>/`` (shards and game table, then MANIFEST.json); return the manifest."""
    rng = np.random.default_rng(seed)
    generation = max(target_generation - 1, 0)
    attempt = f"synthetic{seed}"
    made = [synthetic_position(rng, board_size) for _ in range(positions)]
    names = [layout.shard_name(attempt, i, shards) for i in range(shards)]
    shard_positions = {}
    for name, rows in zip(names, np.array_split(np.arange(positions), shards)):
        compact = compact_positions(
            [made[i] for i in rows], board_size=board_size, first_game=int(rows[0]) if len(rows) else 0
        )
        storage.write_new(layout.shard_path(target_generation, name), codec.encode_shard(codec.encode_groups(compact)))
        shard_positions[name] = len(rows)
    black_view = [np.round(p.ownership * p.to_play * schema.OWNERSHIP_SCALE).astype(np.int8) for p in made]
    table = codec.GameTable(
        board_size=board_size,
        generation=np.full(positions, generation, np.int64),
        ownership=np.stack(black_view) if made else np.zeros((0, board_size**2), np.int8),
    )
    table_name = layout.game_table_name(attempt)
    storage.write_new(layout.game_table_path(target_generation, table_name), codec.encode_game_table(table))
    manifest = {
        "version": WINDOW_MANIFEST_VERSION,
        "record_version": schema.POSITION_RECORD_VERSION,
        "target_generation": target_generation,
        "board_size": board_size,
        "komi": SYNTHETIC_KOMI,
        "attempt": attempt,
        "shards": names,
        "shard_positions": shard_positions,
        "positions": positions,
        "generations": {str(generation): positions},
        "games": [f"synthetic-{seed}-{i}" for i in range(positions)],
        "game_table": table_name,
        "source": "testdata.synthetic_windows",
    }
    storage.write_new(layout.window_manifest(target_generation), window_manifest_bytes(manifest))
    return manifest


def write_run_config(storage, *, board_size: int, komi: float = SYNTHETIC_KOMI) -> RunConfig:
    """The lake's ``run.json`` for a synthetic run (created if absent, else checked)."""
    return ensure_run_config(storage, RunConfig(board_size=board_size, komi=komi))
