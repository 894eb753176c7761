"""Writes tests/data/savedmodel-tf2.20/: a SavedModel exported by the TPU trainer's TensorFlow.

The TPU trainer installs tensorflow-tpu 2.20 (the last release with TPU
wheels, setup.py) while CPU workers on Debian 12 install TensorFlow 2.21
(operations/vm/constraints.txt), so every model a TPU trainer publishes is read by
a newer TensorFlow.  tests/operations/deploy/test_tpu.py loads this fixture with the
TensorFlow installed here (the workers') and compares its outputs with those
recorded at export.  Rebuild it (not part of the suite; needs a second
environment with TensorFlow 2.20):

    python3 -m venv /tmp/tf220 && /tmp/tf220/bin/pip install tensorflow-cpu==2.20.0
    PYTHONPATH=. /tmp/tf220/bin/python tests/tf_compat_fixture.py tests/data/savedmodel-tf2.20

It exports through model.export (the trainer's own exporter) a small network
with seeded weights, and records the outputs of that TensorFlow on seeded
planes in expected.npz beside the SavedModel.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

NETWORK = {"board_size": 9, "blocks": 2, "filters": 16}
SEED = 38


def main(target: str) -> None:
    import tensorflow as tf

    from model.export import export_inference_model
    from model.config import NetworkConfig
    from model.network import build_network

    config = NetworkConfig(**NETWORK)
    rng = np.random.default_rng(SEED)
    model = build_network(config, "float32")
    weights = [rng.normal(0, 0.2, w.shape).astype(np.float32) for w in model.get_weights()]
    saved = os.path.join(target, "saved_model")
    export_inference_model(config, weights, saved)
    planes = rng.integers(0, 2, (4, 9, 9, config.input_planes)).astype(np.float32)
    outputs = tf.saved_model.load(saved).signatures["serving_default"](planes=tf.constant(planes))
    np.savez(os.path.join(target, "expected.npz"), planes=planes,
             **{name: value.numpy() for name, value in outputs.items()})
    with open(os.path.join(target, "exported_by.json"), "w", encoding="utf-8") as out:
        json.dump({"tensorflow": tf.__version__, "network": NETWORK,
                   "input_planes": config.input_planes}, out, indent=1)
        out.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
