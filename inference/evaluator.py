"""Network evaluators for self-play: planes in, policy logits and values out.

An evaluator is a callable ``evaluate(planes) -> (logits, values)`` with

* ``planes``: float32 [B, N, N, 17], the NHWC input of format/schema.py;
* ``logits``: float32 [B, N*N + 1] policy logits (pass last);
* ``values``: float32 [B] in [-1, 1], seen by the side to move;

and an attribute ``generation``: the model generation whose games it plays
(0 = generation 0, before any model is published: the uniform evaluator
here, or `inference.loading.PlayoutEvaluator`, the worker's default).

The worker calls it from its inference thread while the search thread keeps
working (TensorFlow releases the GIL), so an evaluator must not touch the
search's state.  TensorFlow is imported only by `ModelEvaluator` and the
accelerator functions, never at import.

Accelerators
------------
`configure_accelerator(device)` runs once per process, before TensorFlow
touches a GPU (before the first model load), and returns a `Placement`: where
the network runs.  ``device`` is the worker's ``--device``:

* ``""``: TensorFlow's choice; with several GPUs each batch is split across
  all of them (one thread per GPU);
* ``cpu``: the CPU only, GPUs hidden;
* ``gpu`` / ``gpu:K``: GPU K (default 0) only.  The others are hidden from
  this process, so it creates no CUDA context on them: several worker
  processes share a machine, one ``--device gpu:K`` each;
* ``tpu``: the TPU cores of this TPU VM through a ``TPUStrategy``.

It turns GPU memory growth on for every visible GPU, so a process takes GPU
memory as it needs it instead of nearly all of it at start-up, and several
processes can share one GPU.  The model is then loaded inside
``placement.scope()`` so its variables live where it runs.

Fixed shapes
------------
The worker's batches vary in rows from call to call (games resigned and
played out, simulations that hit a game-over leaf).  A TPU compiles one XLA
program per input shape, so `ModelEvaluator` can pad each batch up to one of
a few bucket sizes (``pad_to``) and slice the outputs back; the network then
runs through `FixedShapeFunction`, traced once per bucket with a fixed input
signature.  Rows are independent at inference (batch norm uses its moving
averages), so padding changes no real row's output, and rows keep their
order.  Padding is on by default on a TPU and off elsewhere (on CPU it cost
time, see `ModelEvaluator`).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import re
import threading
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from format import schema
from format.planes import input_planes_of

log = logging.getLogger("inference.evaluator")

UNIFORM_GENERATION = 0


@runtime_checkable
class Evaluator(Protocol):
    """The one evaluator interface (see the module docstring): what the search calls.

    ``evaluator(planes)`` with float32 planes [B, N, N, C] returns
    ``(logits, values)``: float32 [B, N*N + 1] policy logits and float32 [B]
    values in [-1, 1] for the side to move.  ``generation`` names the model
    generation that plays (0 = the uniform evaluator).  C is the
    evaluator's ``input_planes`` (17 or 22, format/planes.py), 17 for one
    that does not say (`format.planes.input_planes_of`).  `ModelEvaluator`
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
    input_planes = schema.BASIC_INPUT_PLANES   # reads none of them: the cheapest width

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


# ---- accelerators ---------------------------------------------------------

DEVICE_CHOICES = "'' (TensorFlow's choice), 'cpu', 'gpu', 'gpu:K' or 'tpu'"


def parse_device(device: str) -> tuple[str, int | None]:
    """``--device`` as (kind, GPU index): '' -> ('default', None), 'gpu:1' -> ('gpu', 1).

    The one place that knows the flag's grammar (`WorkerConfig` validates
    with it); raises ValueError for anything else.
    """
    if device == "":
        return "default", None
    match = re.fullmatch(r"(cpu|gpu|tpu)(?::(\d+))?", device.lower())
    if match is None or (match.group(2) is not None and match.group(1) != "gpu"):
        raise ValueError(f"{device!r} is not a device; use {DEVICE_CHOICES}")
    return match.group(1), None if match.group(2) is None else int(match.group(2))


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where this process runs its network; made once by `configure_accelerator`."""

    kind: str
    """'default' (TensorFlow's choice; several GPUs split each batch), 'cpu', 'gpu' or 'tpu'."""
    device: str = ""
    """TensorFlow device name the network runs on; '' for 'default' and 'tpu'."""
    strategy: object = None
    """The tf.distribute.TPUStrategy for 'tpu', else None."""

    def scope(self):
        """Context to load the model in, so that its variables live where it runs."""
        if self.strategy is not None:
            return self.strategy.scope()
        if self.device:
            import tensorflow as tf

            return tf.device(self.device)
        return contextlib.nullcontext()

    def run_devices(self) -> list[str] | None:
        """Devices a `ModelEvaluator` splits batches across; None = every accelerator."""
        if self.kind == "default":
            return None
        return [self.device] if self.device else []


class AcceleratorMissing(ValueError):
    """The accelerator a flag asked for is not on this machine: one error, worded once, for every
    role (the worker's --device, the trainer's --strategy), so that a role never runs on the host's
    CPU while the accelerator it was started for is billed."""

    REMEDY = {"gpu": "is the CPU-only TensorFlow installed? scripts/setup.sh --accelerator gpu installs the GPU "
                     "build; on a VM, check the NVIDIA driver with nvidia-smi",
              "tpu": "run on a Cloud TPU VM set up with scripts/setup.sh --accelerator tpu"}

    def __init__(self, flag: str, kind: str, detail: str = "", where: str = "on this machine"):
        super().__init__(f"{flag}: TensorFlow sees no {kind.upper()} {where}"
                         f"{f' ({detail})' if detail else ''}; {self.REMEDY[kind]}")
        self.flag, self.kind, self.detail = flag, kind, detail


def configure_accelerator(device: str = "") -> Placement:
    """Choose the worker's device and set GPU memory growth; call before the first model load.

    Memory growth and GPU visibility can only be set before TensorFlow
    initialises its GPUs; called later they are left as they are, with a
    warning.  Raises ValueError naming ``--device`` when the device is absent.
    """
    kind, index = parse_device(device)
    import tensorflow as tf

    if kind == "tpu":
        return Placement("tpu", "", connect_tpu("local", f"--device {device}"))
    gpus = tf.config.list_physical_devices("GPU")
    _grow_gpu_memory(gpus)
    if kind == "cpu":
        _show_gpus([])
        return Placement("cpu", "/device:CPU:0")
    if kind == "gpu":
        index = index or 0
        if not gpus:
            raise AcceleratorMissing(f"--device {device}", "gpu")
        if index >= len(gpus):
            raise ValueError(f"--device {device}: this machine has {len(gpus)} GPU(s), gpu:0..gpu:{len(gpus) - 1}")
        # With only GPU K visible it is GPU 0 to this process.
        logical = 0 if _show_gpus([gpus[index]]) else index
        return Placement("gpu", f"/device:GPU:{logical}")
    return Placement("default")


def _grow_gpu_memory(gpus) -> None:
    """Memory growth on every GPU: allocate as needed, so processes can share a GPU."""
    import tensorflow as tf

    for gpu in gpus:
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:   # the GPUs are initialised already
            if not tf.config.experimental.get_memory_growth(gpu):
                log.warning("GPU memory growth is off for %s: TensorFlow touched the GPU before "
                            "configure_accelerator ran", gpu.name)


def _show_gpus(gpus) -> bool:
    """Make only ``gpus`` visible; False when TensorFlow already initialised them."""
    import tensorflow as tf

    try:
        tf.config.set_visible_devices(gpus, "GPU")
        return True
    except RuntimeError:
        log.warning("GPU visibility unchanged: TensorFlow touched the GPUs before configure_accelerator ran")
        return False


def connect_tpu(address: str, flag: str):
    """A TPUStrategy over the TPU at ``address`` ('local' on a TPU VM, a name or grpc:// address),
    for the worker and the trainer alike; AcceleratorMissing naming ``flag`` when none comes up.
    (Never run in this project's CI: no TPU here.)"""
    import tensorflow as tf

    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address or None)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as exc:
        where = "on this machine" if address in ("", "local") else f"at {address}"
        raise AcceleratorMissing(flag, "tpu", str(exc), where) from None


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
        self._lock = threading.Lock()   # one trace per size even with several device threads

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

        self.traces += 1   # Python runs only while tracing
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
    from ``placement`` (`configure_accelerator`); without one, or for the
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

    def __init__(self, model, devices: list[str] | None = None, *,
                 placement: Placement | None = None, pad_to=PAD_AUTO):
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
        self.fixed = (FixedShapeFunction(fn, int(model.board_size), strategy, self.input_planes)
                      if fn is not None else None)
        self._pool = (concurrent.futures.ThreadPoolExecutor(len(self.devices))
                      if len(self.devices) > 1 else None)

    def _call_model(self, planes: np.ndarray):
        out = self.model(planes)
        return (np.asarray(out["policy_logits"], np.float32),
                np.asarray(out["value"], np.float32).reshape(-1))

    def _call_padded(self, planes: np.ndarray):
        """Pad each piece to its bucket, run it, keep its real rows (in order)."""
        results = []
        for start, stop, size in padded_pieces(len(planes), self.buckets):
            piece = planes[start:stop]
            if size > len(piece):
                padded = np.zeros((size, *planes.shape[1:]), np.float32)
                padded[:len(piece)] = piece
                piece = padded
            logits, values = self.fixed(piece) if self.fixed is not None else self._call_model(piece)
            results.append((logits[:stop - start], values[:stop - start]))
        if len(results) == 1:
            return results[0]
        return (np.concatenate([r[0] for r in results]),
                np.concatenate([r[1] for r in results]))

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
        return (np.concatenate([r[0] for r in results]),
                np.concatenate([r[1] for r in results]))

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=False)
