"""Network evaluators: input planes in, policy logits and values out.

An evaluator is a callable ``evaluate(planes) -> (logits, values)`` with

* ``planes``: float32 [B, N, N, C], the NHWC input planes of format/planes.py,
  C the evaluator's ``input_planes`` (`format.planes.input_planes_of`);
* ``logits``: float32 [B, N*N + 1] policy logits (pass last);
* ``values``: float32 [B] in [-1, 1], seen by the side to move;

and an attribute ``generation``: the model generation whose games it plays
(0 = generation 0, before any model is published: the uniform evaluator
here, or `inference.loading.PlayoutEvaluator`, the worker's default).

The worker calls it from its inference thread while the search thread keeps
working (TensorFlow releases the GIL), so an evaluator must not touch the
search's state.  `ModelEvaluator` runs a published model where
`inference.devices` placed it.  A TPU compiles one XLA program per input
shape, while the worker's batches vary in rows, so `ModelEvaluator` can pad
each batch up to one of a few bucket sizes (``pad_to``) and slice the outputs
back; the network then runs through `FixedShapeFunction`, traced once per
bucket.  Rows are independent at inference (batch norm uses its moving
averages), so padding changes no real row's output.  Padding is on by default
on a TPU and off elsewhere.  TensorFlow is imported only inside functions.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from format import schema
from format.planes import input_planes_of
from inference.devices import Placement, accelerator_devices

UNIFORM_GENERATION = 0


@runtime_checkable
class Evaluator(Protocol):
    """The one evaluator interface (see the module docstring): what the search calls.

    ``evaluator(planes)`` with float32 planes [B, N, N, C] returns
    ``(logits, values)``: float32 [B, N*N + 1] policy logits and float32 [B]
    values in [-1, 1] for the side to move.  ``generation`` names the model
    generation that plays (0 = the uniform evaluator).  C is the
    evaluator's ``input_planes`` (format/planes.py; the basic width for one
    that does not say, `format.planes.input_planes_of`).  `ModelEvaluator`
    wraps a published model (whose own call returns every head as a dict)
    into this shape.
    """

    generation: int

    def __call__(self, planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


class UniformEvaluator:
    """Uniform policy, value 0: the network before any model exists.

    With it the search is a uniform tree search whose only signal is the
    rules' result at game-over leaves.
    """

    generation = UNIFORM_GENERATION
    input_planes = schema.BASIC_INPUT_PLANES  # reads none of them: the cheapest width

    def __init__(self, board_size: int):
        self.num_actions = board_size * board_size + 1

    def __call__(self, planes: np.ndarray):
        batch = len(planes)
        return np.zeros((batch, self.num_actions), np.float32), np.zeros(batch, np.float32)


# ---- fixed-shape inference ------------------------------------------------

PAD_AUTO = "auto"
"""`ModelEvaluator`'s default ``pad_to``: `TPU_BUCKETS` on a TPU, no padding elsewhere."""

TPU_BUCKETS = (64, 128, 256, 512, 1024)
"""Batch sizes a TPU compiles for: at most five XLA programs, at most 2x padding.
The default worker's batch is 256 / 2 games x 8 leaves = 1024 rows; larger
batches run in 1024-row pieces."""


def bucket_sizes(pad_to, multiple: int = 1) -> tuple[int, ...] | None:
    """``pad_to`` (None, one size, or sizes) as sorted sizes, each rounded up to ``multiple``."""
    if pad_to is None:
        return None
    sizes = [pad_to] if isinstance(pad_to, int) else list(pad_to)
    if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"pad_to must be None, a batch size >= 1 or a list of them, got {pad_to!r}")
    return tuple(sorted({-(-s // multiple) * multiple for s in sizes}))


def padded_pieces(rows: int, buckets: Sequence[int]) -> list[tuple[int, int, int]]:
    """Split ``rows`` rows into (start, stop, padded size) pieces, in row order.

    Each piece is padded to the smallest bucket that holds it; rows beyond the
    largest bucket go in pieces of the largest, so no other shape ever runs.
    """
    largest = buckets[-1]
    pieces = []
    for start in range(0, rows, largest):
        stop = min(start + largest, rows)
        pieces.append((start, stop, next(b for b in buckets if b >= stop - start)))
    return pieces


class FixedShapeFunction:
    """A TensorFlow network function run only at fixed batch sizes.

    ``fn(planes)`` maps a float32 tensor [B, N, N, C] to a dict with
    'policy_logits' [B, N*N+1] and 'value' [B] (a SavedModel's serving
    signature; C its ``input_planes``).  Each batch size gets its own
    tf.function with the fixed input signature [size, N, N, C], traced on
    its first call, so a TPU compiles one program per size.  ``traces``
    counts traces.

    With a TPUStrategy every replica (TPU core) runs its own slice of the
    rows, so each size must be a multiple of the replica count.
    """

    def __init__(self, fn: Callable, board_size: int, strategy=None, input_planes: int = schema.BASIC_INPUT_PLANES):
        self._fn = fn
        self.board_size = board_size
        self.input_planes = input_planes
        self.strategy = strategy
        self.traces = 0
        self._functions: dict[int, Callable] = {}
        self._lock = threading.Lock()  # one trace per size even with several device threads

    def _outputs(self, planes):
        import tensorflow as tf

        out = self._fn(planes)
        return out["policy_logits"], tf.reshape(out["value"], [-1])

    def _replica_slice(self, planes):
        """On one TPU core: the outputs of this replica's equal share of the rows."""
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        share = planes.shape[0] // context.num_replicas_in_sync
        begin = context.replica_id_in_sync_group * share
        return self._outputs(tf.slice(planes, [begin, 0, 0, 0], [share, *planes.shape[1:]]))

    def _body(self, planes):
        import tensorflow as tf

        self.traces += 1  # Python runs only while tracing
        if self.strategy is None:
            return self._outputs(planes)
        per_replica = self.strategy.run(self._replica_slice, args=(planes,))
        return tuple(tf.concat(self.strategy.experimental_local_results(part), axis=0) for part in per_replica)

    def function_for(self, size: int) -> Callable:
        """The tf.function for ``size`` rows (traced on first use)."""
        with self._lock:
            function = self._functions.get(size)
            if function is None:
                import tensorflow as tf

                n = self.board_size
                spec = tf.TensorSpec([size, n, n, self.input_planes], tf.float32, name="planes")
                function = self._functions[size] = tf.function(self._body, input_signature=[spec])
        return function

    def __call__(self, planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logits, values = self.function_for(len(planes))(planes)
        return np.asarray(logits, np.float32), np.asarray(values, np.float32)


def _tensorflow_function(model) -> Callable | None:
    """The TensorFlow function inside a `inference.model_files.LoadedModel` (its
    ``signature``), or None: a model without one is padded in numpy and called
    as it is.
    """
    signature = getattr(model, "signature", None)
    if signature is None:
        return None
    return lambda planes: signature(planes=planes)


class ModelEvaluator:
    """A published model (``inference.model_files.LoadedModel``) as an evaluator.

    The model's call is a compiled TensorFlow function.  Where it runs comes
    from ``placement`` (`inference.devices.configure_accelerator`); without one, or for the
    'default' placement, it runs on every accelerator: with several the batch
    is split evenly across them and the parts run in parallel (one thread per
    device; TensorFlow releases the GIL); with none, one call runs on the CPU
    with every core.  ``devices`` overrides the list (``[]``: no device scope).

    ``pad_to`` (None, a batch size, or several) pads each batch (each part,
    when split) up to the smallest size that holds it and slices the outputs
    back, so the network sees only those shapes; `PAD_AUTO` pads to
    `TPU_BUCKETS` on a TPU, where it is required, and not elsewhere: on the
    CPU padded rows cost their full compute and there is no per-shape compile
    to save (9x9 4x32 net, 2 shared cores, medians: batches of 1..1024 rows
    +24% with `TPU_BUCKETS`, +77% padded to 1024; worker-like batches 85-100%
    full +4..6%; full batches the same as unpadded).
    """

    def __init__(self, model, devices: list[str] | None = None, *, placement: Placement | None = None, pad_to=PAD_AUTO):
        self.model = model
        self.generation = int(model.generation)
        self.input_planes = input_planes_of(model)
        if devices is None and placement is not None:
            devices = placement.run_devices()
        self.devices = accelerator_devices() if devices is None else list(devices)
        strategy = placement.strategy if placement is not None else None
        if pad_to == PAD_AUTO:
            pad_to = TPU_BUCKETS if strategy is not None else None
        replicas = strategy.num_replicas_in_sync if strategy is not None else 1
        self.buckets = bucket_sizes(pad_to, multiple=replicas)
        if strategy is not None and self.buckets is None:
            raise ValueError("on a TPU the evaluator needs fixed shapes: pad_to must not be None")
        fn = _tensorflow_function(model) if self.buckets is not None else None
        self.fixed = (
            FixedShapeFunction(fn, int(model.board_size), strategy, self.input_planes) if fn is not None else None
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(len(self.devices)) if len(self.devices) > 1 else None

    def _call_model(self, planes: np.ndarray):
        out = self.model(planes)
        return (np.asarray(out["policy_logits"], np.float32), np.asarray(out["value"], np.float32).reshape(-1))

    def _call_padded(self, planes: np.ndarray):
        """Pad each piece to its bucket, run it, keep its real rows (in order)."""
        if self.buckets is None:
            raise RuntimeError("ModelEvaluator._call_padded needs batch sizes to pad to (pad_to is None)")
        results = []
        for start, stop, size in padded_pieces(len(planes), self.buckets):
            piece = planes[start:stop]
            if size > len(piece):
                padded = np.zeros((size, *planes.shape[1:]), np.float32)
                padded[: len(piece)] = piece
                piece = padded
            logits, values = self.fixed(piece) if self.fixed is not None else self._call_model(piece)
            results.append((logits[: stop - start], values[: stop - start]))
        if len(results) == 1:
            return results[0]
        return (np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results]))

    def _run(self, planes: np.ndarray, device: str | None):
        call = self._call_model if self.buckets is None or not len(planes) else self._call_padded
        if device is None:
            return call(planes)
        import tensorflow as tf

        with tf.device(device):
            return call(planes)

    def __call__(self, planes: np.ndarray):
        if self._pool is None or len(planes) < len(self.devices):
            return self._run(planes, self.devices[0] if self.devices else None)
        parts = np.array_split(planes, len(self.devices))
        results = list(self._pool.map(self._run, parts, self.devices))
        return (np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results]))

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=False)
