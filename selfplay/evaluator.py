"""Network evaluators for self-play: planes in, policy logits and values out.

An evaluator is a callable ``evaluate(planes) -> (logits, values)`` with

* ``planes``: float32 [B, N, N, 17], the NHWC input of format/schema.py;
* ``logits``: float32 [B, N*N + 1] policy logits (pass last);
* ``values``: float32 [B] in [-1, 1], seen by the side to move;

and an attribute ``generation``: the model generation whose games it plays
(0 = the uniform evaluator, used before any model is published).

The worker calls it from its inference thread while the search thread keeps
working (TensorFlow releases the GIL), so an evaluator must not touch the
search's state.  TensorFlow is imported only by `ModelEvaluator`.
"""
from __future__ import annotations

import concurrent.futures
import os

import numpy as np

UNIFORM_GENERATION = 0


class UniformEvaluator:
    """Uniform policy, value 0: the network before any model exists.

    With it the search is a uniform tree search whose only signal is the
    rules' result at game-over leaves.
    """

    generation = UNIFORM_GENERATION

    def __init__(self, board_size: int):
        self.num_actions = board_size * board_size + 1

    def __call__(self, planes: np.ndarray):
        batch = len(planes)
        return np.zeros((batch, self.num_actions), np.float32), np.zeros(batch, np.float32)


def accelerator_devices() -> list[str]:
    """Names of the TensorFlow accelerators (GPUs, then TPUs) on this machine."""
    import tensorflow as tf

    return [d.name for d in tf.config.list_logical_devices("GPU")] or [
        d.name for d in tf.config.list_logical_devices("TPU")]


def use_every_cpu_core() -> None:
    """Let TensorFlow's CPU kernels use every core (call before TF runs anything).

    TensorFlow's default already sizes its pools to the cores it sees; this
    pins that explicitly so a container's CPU quota does not shrink it.
    """
    import tensorflow as tf

    cores = os.cpu_count() or 1
    try:
        tf.config.threading.set_intra_op_parallelism_threads(cores)
        tf.config.threading.set_inter_op_parallelism_threads(2)
    except RuntimeError:
        pass  # TensorFlow already initialised: its pools keep their sizes


class ModelEvaluator:
    """A published model (``format.registry.LoadedModel``) as an evaluator.

    The model's call is a compiled TensorFlow function.  With several
    accelerators the batch is split evenly across them and the parts run in
    parallel (one thread per device; TensorFlow releases the GIL); with none,
    one call runs on the CPU with every core.
    """

    def __init__(self, model, devices: list[str] | None = None):
        self.model = model
        self.generation = int(model.generation)
        self.devices = accelerator_devices() if devices is None else list(devices)
        self._pool = (concurrent.futures.ThreadPoolExecutor(len(self.devices))
                      if len(self.devices) > 1 else None)

    def _run(self, planes: np.ndarray, device: str | None):
        if device is None:
            out = self.model(planes)
        else:
            import tensorflow as tf

            with tf.device(device):
                out = self.model(planes)
        return (np.asarray(out["policy_logits"], np.float32),
                np.asarray(out["value"], np.float32).reshape(-1))

    def __call__(self, planes: np.ndarray):
        if self._pool is None or len(planes) < len(self.devices):
            return self._run(planes, self.devices[0] if self.devices else None)
        parts = np.array_split(planes, len(self.devices))
        results = list(self._pool.map(self._run, parts, self.devices))
        return (np.concatenate([r[0] for r in results]),
                np.concatenate([r[1] for r in results]))

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=False)
