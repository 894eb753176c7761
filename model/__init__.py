"""The trainer role: ``python -m model.train`` (see model/train.py).

Modules, in the order data flows through them:

* ``config``         TrainConfig, the CLI flags and their validation (no TensorFlow).
* ``windows``        run.json's board size and the complete training windows in the lake.
* ``lease``          one trainer per lake root (format.leases, with the trainer's rules).
* ``tfdata``         the tf.data input pipeline: shards (and game tables) -> training batches.
* ``network``        the residual policy/value/ownership/score network (Keras 3).
* ``sgd``            strategy resolution, losses, the multi-step SGD tf.function, checkpoint state.
* ``staging``        --stage-dir: shards and checkpoints through local disk and the storage layer.
* ``cycle``          one training cycle: choose a window, train it resumably, publish it.
* ``export``         the float32 inference SavedModel that format.registry publishes.
* ``cpu_int8``       its int8 OpenVINO copy for CPU workers, gated on measured agreement.
* ``train``          the entry point: flags, strategy, and the run.
"""
