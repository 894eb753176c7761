"""Shared helpers of the pipeline tests: lakes on disk and real engine games.

(No tests here; the name keeps it among the files the pipeline owns.)

`engine_game` plays a legal game with the Cython engine: uniformly random
moves that never fill the mover's own single-point eye (the engine's playout
rule), passing when nothing else is left, so games end by two passes with
live groups on the board, as self-play games do.  `resigned_copy` cuts such a
game where the final margin shows one side clearly ahead and records it as a
resignation: the labeller must then play it out.
"""
from __future__ import annotations

import json
import os
import uuid

import numpy as np

from format import codec
from format import schema as S
from format.codec import GameRecord
from format.run_config import RunConfig


def _fills_own_eye(stones: np.ndarray, move: int, colour: int) -> bool:
    n = stones.shape[0]
    r, c = divmod(move, n)
    for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
        if 0 <= rr < n and 0 <= cc < n and stones[rr, cc] != colour:
            return False
    return True


def engine_game(rng: np.random.Generator, board_size: int, *, generation: int = 0, komi: float = 7.5,
                worker_id: str = "test") -> GameRecord:
    """A legal random game to two passes, recorded as self-play would."""
    from selfplay.board import Board

    n = board_size
    board = Board(n, komi)
    moves, planes, indices, values = [], [], [], []
    while not board.is_over:
        stones = board.stones()
        planes.append(np.stack([stones == S.BLACK, stones == S.WHITE]).astype(np.uint8))
        legal = np.flatnonzero(board.legal_mask()[: n * n])
        legal = [int(m) for m in legal if not _fills_own_eye(stones, int(m), board.to_play)]
        move = int(rng.choice(legal)) if legal else n * n
        # A one-hot "search" target on the played move plus one other move.
        other = int(rng.integers(0, n * n + 1))
        target = {move: 3, other: 1} if other != move else {move: 4}
        indices.append(np.array(sorted(target), np.int64))
        values.append(np.array([target[k] for k in sorted(target)], np.int64))
        board.play(move)
        moves.append(move)
    score = float(board.area_score())
    m = len(moves)
    return GameRecord(
        board_size=n, komi=komi, game_id=uuid.UUID(bytes=rng.bytes(16)).hex, generation=generation,
        worker_id=worker_id, moves=np.array(moves, np.int16), planes=np.array(planes, np.uint8),
        policy_indices=indices, policy_values=values, root_values=np.zeros(m, np.float32),
        full_search=np.ones(m, bool), winner=S.BLACK if score > 0 else S.WHITE, score=score,
        end_reason=S.END_TWO_PASSES, ownership=board.ownership(), ownership_source=S.OWNERSHIP_FINAL_BOARD)


def resigned_copy(game: GameRecord, fraction: float) -> GameRecord:
    """The first ``fraction`` of ``game``, recorded as a resignation by the loser."""
    cut = max(1, int(game.num_positions * fraction))
    return GameRecord(
        board_size=game.board_size, komi=game.komi, game_id=game.game_id + "r", generation=game.generation,
        worker_id=game.worker_id, moves=game.moves[:cut], planes=game.planes[:cut],
        policy_indices=game.policy_indices[:cut], policy_values=game.policy_values[:cut],
        root_values=game.root_values[:cut], full_search=game.full_search[:cut], winner=game.winner,
        score=float("nan"), end_reason=S.END_RESIGN, ownership=None, ownership_source=S.OWNERSHIP_NONE)


def write_run_json(root: str, board_size: int, komi: float = 7.5) -> None:
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, S.RUN_CONFIG), "wb") as f:
        f.write(RunConfig(board_size=board_size, komi=komi).to_json())


def write_chunk(root: str, generation: int, games, seq: int, worker: str = "w1", time_ms: int = 0) -> str:
    """Write a chunk file into a local lake; returns its lake path."""
    path = codec.chunk_path(generation, worker, seq, time_ms or 1_700_000_000_000 + seq)
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as f:
        f.write(codec.encode_chunk(games))
    return path


def read_window(root: str, target_generation: int):
    """(manifest, {shard name: [PositionRecord]}) of a finished local window."""
    folder = os.path.join(root, S.WINDOWS_DIR, S.generation_dir(target_generation))
    with open(os.path.join(folder, S.MANIFEST)) as f:
        manifest = json.load(f)
    shards = {}
    for name in manifest["shards"]:
        with open(os.path.join(folder, name), "rb") as f:
            shards[name] = codec.read_shard(f.read(), name)
    return manifest, shards
