"""The trainer role: ``python -m model.train`` (see model/train.py).

Modules, in the order data flows through them:

* ``config``   TrainConfig, the CLI flags and their validation (no TensorFlow).
* ``windows``  run.json's board size and the complete training windows in the lake.
* ``network``  the residual policy/value/ownership/score network (Keras 3).
* ``trainer``  strategy resolution, losses, the multi-step tf.function, checkpoint state.
* ``staging``  --stage-dir: shards and checkpoints through local disk and the storage layer.
* ``loop``     one run: choose a window, train it resumably, publish it.
* ``export``   the float32 inference SavedModel that format.registry publishes.
* ``synthetic`` learnable synthetic windows for tests and benchmarks.
"""
