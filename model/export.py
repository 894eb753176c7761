"""Export the trained network as the inference SavedModel that self-play loads.

The exported model is rebuilt in float32 (whatever precision training used)
from a list of weights: the live model's, or their moving average when SWA
is on.  Its one signature, ``serving_default``, is::

    planes: float32 [None, N, N, C]  ->  policy_logits [B, N*N+1]
                                          value         [B]   in [-1, 1], side to move
                                          ownership     [B, N*N] in [-1, 1], side to move
                                          score         [B]   points, side to move

C is the network's ``input_planes`` (17 or 22, format/planes.py).

``format.registry`` publishes the directory and loads it back.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from model.config import NetworkConfig
from model.network import build_network


class InferenceModule(tf.Module):
    """Wraps a float32 Keras model behind a fixed serving signature."""

    def __init__(self, model, board_size: int):
        super().__init__(name="zerolake_inference")
        self.model = model
        channels = model.input_shape[-1]  # the network's input_planes (format/planes.py)
        spec = tf.TensorSpec([None, board_size, board_size, channels], tf.float32, name="planes")
        self.serve = tf.function(self._serve, input_signature=[spec])

    def _serve(self, planes):
        outputs = self.model(planes, training=False)
        return {
            "policy_logits": outputs["policy_logits"],
            "value": outputs["value"],
            "ownership": outputs["ownership"],
            "score": outputs["score"],
        }


def export_inference_model(net_config: NetworkConfig, weights: list, local_dir: str) -> None:
    """Write a SavedModel of ``net_config`` holding ``weights`` (numpy arrays, model.weights order)."""
    inference_config = dataclasses.replace(net_config, sync_batchnorm=False)
    model = build_network(inference_config, "float32")
    model.set_weights(weights)
    module = InferenceModule(model, net_config.board_size)
    tf.saved_model.save(module, local_dir, signatures={"serving_default": module.serve})
