"""Synthetic, learnable training windows for tests and benchmarks.

Self-play data takes hours to make; the trainer's tests and ``bench/train.py``
need a window of training shards in seconds.  This module writes one in the
exact lake layout (``windows/<gen>/shard-XXXXX-of-YYYYY.tfrecord.gz`` plus
``MANIFEST.json`` written last), through ``format.codec`` like the Beam job.

The boards are random, but every target is a simple function of the board,
so a network can learn each head and a test can watch every loss fall:

* ownership: own stone +1, opponent stone -1, empty point: the sign of the
  stone balance among its four neighbours (0 if balanced);
* score: the sum of ownership (an area count), minus komi for Black;
* value: the sign of the score (0 on a tie);
* policy: 0.75 on the first empty point (row-major) touching an opponent
  stone, 0.25 spread over the empty points touching own stones; some
  records have no policy (``policy_weight`` 0, an empty list).

History planes t-1..t-7 are the position at t with stones removed at random,
so they look like a board that filled up over time.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from format import layout, schema
from format.codec import encode_position, encode_shard
from format.run_config import RunConfig, ensure_run_config

SYNTHETIC_KOMI = schema.DEFAULT_KOMI


@dataclass(frozen=True)
class SyntheticPosition:
    """One position's arrays, side-to-move perspective (NN = N * N)."""

    planes: np.ndarray  # uint8 [16, N, N]
    to_play: int  # schema.BLACK or schema.WHITE
    policy_index: np.ndarray  # int64 [K]
    policy_prob: np.ndarray  # float32 [K]
    value: float
    score: float
    ownership: np.ndarray  # float32 [NN] in [-1, 1]


def _neighbour_sum(board: np.ndarray) -> np.ndarray:
    padded = np.pad(board, 1)
    return padded[:-2, 1:-1] + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:]


def synthetic_position(rng: np.random.Generator, board_size: int) -> SyntheticPosition:
    """A random board (own = +1, opponent = -1) and targets derived from it."""
    n = board_size
    density = rng.uniform(0.1, 0.6)
    board = rng.choice([1, -1, 0], size=(n, n),
                       p=[density * 0.5, density * 0.5, 1 - density]).astype(np.int8)
    empty = board == 0
    neighbours = _neighbour_sum(board.astype(np.int32))
    ownership = np.where(empty, np.sign(neighbours), board).astype(np.float32)
    to_play = schema.BLACK if rng.random() < 0.5 else schema.WHITE
    komi_for_me = -SYNTHETIC_KOMI if to_play == schema.BLACK else SYNTHETIC_KOMI
    score = float(ownership.sum() + komi_for_me)
    planes = np.zeros((schema.PACKED_PLANES, n, n), dtype=np.uint8)
    own, opp = board == 1, board == -1
    for age in range(schema.HISTORY_LENGTH):
        keep = rng.random((n, n)) >= 0.08 * age
        planes[age] = own & keep
        planes[schema.HISTORY_LENGTH + age] = opp & keep
    policy_index, policy_prob = _policy_target(rng, board, neighbours)
    return SyntheticPosition(planes, to_play, policy_index, policy_prob,
                             float(np.sign(score)), score, ownership.reshape(-1))


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
    return index, prob


def encode_synthetic(position: SyntheticPosition, *, board_size: int, generation: int,
                     game_id: str, move_number: int) -> bytes:
    """Serialize a synthetic position with the project's codec."""
    has_policy = position.policy_index.size > 0
    return encode_position(
        board_size=board_size,
        planes_packed=np.packbits(position.planes.reshape(-1), bitorder="big").tobytes(),
        to_play=position.to_play,
        policy_index=position.policy_index.tolist(),
        policy_prob=position.policy_prob.tolist(),
        value=position.value,
        score=position.score,
        ownership_int8=np.round(position.ownership * schema.OWNERSHIP_SCALE).astype(np.int8).tobytes(),
        policy_weight=1.0 if has_policy else 0.0,
        value_weight=1.0,
        ownership_weight=1.0,
        score_weight=1.0,
        game_id=game_id,
        move_number=move_number,
        generation=generation,
    )


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}{schema.SHARD_SUFFIX}"


def write_synthetic_window(storage, *, target_generation: int, board_size: int,
                           positions: int, shards: int = 2, seed: int = 0) -> dict:
    """Write ``windows/<target_generation>/`` (shards, then MANIFEST.json); return the manifest."""
    rng = np.random.default_rng(seed)
    names = [shard_name(i, shards) for i in range(shards)]
    per_shard = [len(part) for part in np.array_split(np.arange(positions), shards)]
    for shard_index, (name, count) in enumerate(zip(names, per_shard)):
        records = [
            encode_synthetic(synthetic_position(rng, board_size), board_size=board_size,
                             generation=max(target_generation - 1, 0),
                             game_id=f"synthetic-{seed}-{shard_index}-{i}", move_number=i)
            for i in range(count)
        ]
        storage.write_new(layout.shard_path(target_generation, name), encode_shard(records))
    manifest = {"version": 1, "target_generation": target_generation,
                "board_size": board_size, "shards": names, "positions": positions,
                "source": "testdata.synthetic_windows"}
    storage.write_new(layout.window_manifest(target_generation), layout.window_manifest_bytes(manifest))
    return manifest


def write_run_config(storage, *, board_size: int, komi: float = SYNTHETIC_KOMI) -> RunConfig:
    """The lake's ``run.json`` for a synthetic run (created if absent, else checked)."""
    return ensure_run_config(storage, RunConfig(board_size=board_size, komi=komi))
