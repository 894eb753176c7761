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

TINY_NETWORK = dict(blocks=1, filters=8, global_pool_every=1, global_pool_channels=4, value_hidden=8)
"""The smallest network that has every head: enough to exercise the code that loads and runs a model."""


def publish_untrained_model(root: str, generation: int, board_size: int, *, network: dict | None = None,
                            seed: int | None = None, metadata: dict | None = None) -> None:
    """Publish a randomly initialised network as ``generation`` of the lake at ``root`` (LATEST moves to it).

    ``network``: NetworkConfig fields besides the board size (default
    `TINY_NETWORK`); ``seed`` fixes the initial weights; ``metadata`` is
    added to the model manifest's metadata.
    """
    import tensorflow as tf

    from cloud.storage import open_storage
    from format.registry import publish_model
    from model.export import export_inference_model
    from model.network import NetworkConfig, build_network

    if seed is not None:
        tf.keras.utils.set_random_seed(seed)
    config = NetworkConfig(board_size=board_size, **(TINY_NETWORK if network is None else network))
    weights = [w.numpy() for w in build_network(config).weights]
    with tempfile.TemporaryDirectory(prefix="zerolake-untrained-model-") as scratch:
        local = os.path.join(scratch, "model")     # outside the lake: only the registry writes there
        export_inference_model(config, weights, local)
        publish_model(open_storage(root), generation, local,
                      {"board_size": board_size, "generation": generation,
                       "network": dataclasses.asdict(config), "source": "untrained (testdata.models)",
                       **(metadata or {})})
