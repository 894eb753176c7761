"""Publish a network with untrained (random) weights into a lake, for tests and benches.

It takes the same path as ``model.train`` when it publishes: model.export
writes the inference SavedModel into a scratch folder outside the lake, then
format.registry.publish_model uploads its files and manifest and moves
LATEST.  The network's shape is the caller's: tests use `TINY_NETWORK`
(one block of 8 filters, seconds to build), benches pin their own.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np

from format import schema

TINY_NETWORK = dict(blocks=1, filters=8, global_pool_every=1, global_pool_channels=4, value_hidden=8)
"""The smallest network that has every head: enough to exercise the code that loads and runs a model."""


def random_game_planes(
    board_size: int, count: int, seed: int = 0, games: int = 16, channels: int = schema.BASIC_INPUT_PLANES
) -> np.ndarray:
    """float32 [count, N, N, channels]: input planes of positions from legal random games.

    Moves are uniformly random among the legal ones that do not fill the
    mover's own single-point eye (as in `testdata.random_games`); the
    positions are drawn evenly from ``games`` games, so early, middle and
    late positions all appear.  Calibration data for an untrained network's
    int8 copy (`model.cpu_int8`), which plays games that look just as random.
    """
    from engine.board import Board
    from testdata.random_games import random_move

    rng = np.random.default_rng(seed)
    positions = []
    for _ in range(games):
        board = Board(board_size, schema.DEFAULT_KOMI)
        game = []
        while not board.is_over:
            game.append(board.features(channels))
            board.play(random_move(board, rng))
        positions.extend(game)
    chosen = rng.choice(len(positions), size=min(count, len(positions)), replace=False)
    return np.stack([positions[i] for i in chosen]).astype(np.float32)


def publish_untrained_model(
    root: str,
    generation: int,
    board_size: int,
    *,
    network: dict | None = None,
    seed: int | None = None,
    metadata: dict | None = None,
    cpu_int8: bool = False,
) -> dict | None:
    """Publish a randomly initialised network as ``generation`` of the lake at ``root`` (LATEST moves to it).

    ``network``: NetworkConfig fields besides the board size (default
    `TINY_NETWORK`); ``seed`` fixes the initial weights; ``metadata`` is
    added to the model manifest's metadata.  ``cpu_int8``: also publish the
    int8 OpenVINO copy for CPU workers, calibrated on `random_game_planes`,
    as ``model.train`` does with its window's positions; returns its
    manifest entry (None without ``cpu_int8``).
    """
    import tensorflow as tf

    from cloud.storage import open_storage
    from format.registry import publish_model
    from model.config import NetworkConfig
    from model.export import export_inference_model
    from model.network import build_network

    if seed is not None:
        tf.keras.utils.set_random_seed(seed)
    config = NetworkConfig(board_size=board_size, **(TINY_NETWORK if network is None else network))
    weights = [w.numpy() for w in build_network(config).weights]
    with tempfile.TemporaryDirectory(prefix="zerolake-untrained-model-") as scratch:
        local = os.path.join(scratch, "model")  # outside the lake: only the registry writes there
        export_inference_model(config, weights, local)
        extra = {}
        if cpu_int8:
            from model.cpu_int8 import CALIBRATION_POSITIONS, CHECK_POSITIONS, add_cpu_int8

            planes = random_game_planes(
                board_size, CALIBRATION_POSITIONS + CHECK_POSITIONS, seed=seed or 0, channels=config.input_planes
            )
            extra["cpu_int8"] = add_cpu_int8(local, planes)
        publish_model(
            open_storage(root),
            generation,
            local,
            {
                "board_size": board_size,
                "generation": generation,
                "network": dataclasses.asdict(config),
                "feature_set_planes": config.input_planes,
                "source": "untrained (testdata.models)",
                **extra,
                **(metadata or {}),
            },
        )
    return extra.get("cpu_int8")
