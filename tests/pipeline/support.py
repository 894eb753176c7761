"""Shared helpers of the pipeline tests: lakes on disk and real engine games.

(No tests here; the name keeps it among the files the pipeline owns.)

`engine_game` and `resigned_copy` live in `testdata.random_games` (one
implementation, shared with bench/pipeline.py) and are re-exported here for
the pipeline tests.  `engine_game` plays a legal game with the Cython engine:
uniformly random moves that never fill the mover's own single-point eye,
passing when nothing else is left, so games end by two passes with live
groups on the board, as self-play games do.  `resigned_copy` cuts such a
game and records it as a resignation: the labeller must then play it out.
Lakes are written with `write_run_json` and `write_chunk`; `read_window`
reads a finished window back.
"""
from __future__ import annotations

import os

from format import layout
from format.window_manifest import read_window_manifest
from format import codec
from format import schema
from format.run_config import RunConfig
from testdata.random_games import engine_game, resigned_copy  # noqa: F401 (re-exported)


def write_run_json(root: str, board_size: int, komi: float = 7.5) -> None:
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, layout.RUN_CONFIG), "wb") as f:
        f.write(RunConfig(board_size=board_size, komi=komi).to_json())


def write_chunk(root: str, generation: int, games, seq: int, worker: str = "w1", time_ms: int = 0) -> str:
    """Write a chunk file into a local lake; returns its lake path."""
    path = layout.chunk_path(generation, worker, time_ms or 1_700_000_000_000 + seq, seq)
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as f:
        f.write(codec.encode_chunk(games))
    return path


def read_window(root: str, target_generation: int):
    """(manifest, {shard name: [PositionRecord]}) of a finished local window (through the validating readers:
    the manifest's, the game table's, the shards')."""
    from cloud.storage import open_storage

    storage = open_storage(root)
    window = read_window_manifest(storage, target_generation, check_shards=True)
    manifest = window.document
    table = codec.read_window_table(storage, window) if window.game_table else None
    shards = {}
    for path in window.shards:
        name = path.rsplit("/", 1)[-1]
        shards[name] = codec.read_shard(storage.read(path), name, games=manifest.get("games"), table=table)
    return manifest, shards
