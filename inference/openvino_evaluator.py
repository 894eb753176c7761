"""Self-play on a CPU with OpenVINO: the int8 copy of a published model, or its float32 network.

A model's folder may hold an int8 copy of its network (``format.layout.
CPU_INT8_XML``; ``model.cpu_int8`` writes it at publish time, after checking
it against the float32 SavedModel).  On a CPU-only worker it evaluates about
2.5x as many positions per CPU second as TensorFlow (module docstring of
``model.cpu_int8``), so `make_evaluator` picks it there by default.  A model
published without the copy (its int8 error was over the gate) still runs
through OpenVINO on the CPU: the SavedModel's float32 network converted when
it is loaded (`openvino_from_signature`), the same function as TensorFlow's at
float32 precision, and faster.  GPU and TPU workers use
`inference.evaluator.ModelEvaluator` (TensorFlow, the reference), as does a
CPU worker where OpenVINO is missing or the conversion fails.

How a batch runs: the copy is compiled with one OpenVINO *stream* per core
(throughput mode, one thread each).  A single synchronous call would use one
stream, so each batch is cut into one piece per stream, the pieces start
together as asynchronous requests, and the results are put back in order.
``wait()`` releases the GIL, so the worker's search thread keeps playing
while the network runs, as it does with TensorFlow.

OpenVINO is imported only when a copy is actually compiled, and only through
`import_openvino` (NNCF through `import_nncf`), which turns their usage
telemetry off first: nothing leaves the machine but what the run needs.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from format import layout, schema
from inference.evaluator import ModelEvaluator

INFERENCE_CHOICES = ("auto", "tensorflow", "openvino")
"""``--inference``: auto = the int8 copy on a CPU-only worker when the model has one, else TensorFlow."""
MIN_ROWS_PER_REQUEST = 8
"""Smaller pieces cost more in per-request overhead than they gain in parallelism."""
SERVED_OUTPUTS = ("policy_logits", "value")
"""The SavedModel signature's outputs that the search reads; an OpenVINO copy keeps only these."""


TELEMETRY_MODULE = "openvino_telemetry"
"""The package through which OpenVINO's converter and NNCF send usage telemetry."""


def block_usage_telemetry() -> None:
    """Make OpenVINO and NNCF send no usage telemetry from this process (and its children).

    Left alone, every ``ov.convert_model`` and ``nncf.quantize`` sends usage
    events to an analytics service through the `TELEMETRY_MODULE` package
    (about 55 from one GTP start; one batch per generation from the trainer's
    int8 copy), writes a persistent client id under the home folder, and forks
    a copy of the whole process for each send, which can deadlock or outlive a
    stopped role.  Both libraries fall back to a silent stub when that package
    cannot be imported, and a ``None`` entry in ``sys.modules`` makes every
    import of a module fail (the import system's documented way to block one).
    Done by the project's code, so no user environment or consent file is needed,
    and before OpenVINO is first imported, so nothing has sent by then.
    """
    sys.modules[TELEMETRY_MODULE] = None  # type: ignore[assignment]  # typeshed omits the documented None


def import_openvino():
    """The ``openvino`` module, imported with its usage telemetry off (`block_usage_telemetry`)."""
    block_usage_telemetry()
    import openvino

    return openvino


def import_nncf():
    """The ``nncf`` module (int8 quantization), imported with its usage telemetry off."""
    block_usage_telemetry()
    import nncf

    return nncf


def openvino_missing() -> str | None:
    """None when OpenVINO imports, else why not."""
    try:
        import_openvino()
    except ImportError as exc:
        return f"OpenVINO is not installed ({exc})"
    return None


def compile_for_cpu(model_or_path, threads: int | None = None, *, float32: bool = False):
    """An OpenVINO compiled model on the CPU, one single-threaded stream per core.

    ``float32``: keep float32 arithmetic (OpenVINO would otherwise run a float
    network in bf16 on a CPU that has it, which is not the published model)."""
    ov = import_openvino()

    threads = threads or len(os.sched_getaffinity(0))
    config = {"PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": threads}
    if float32:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    return ov.Core().compile_model(model_or_path, "CPU", config)


def float_openvino_model(saved_model_dir: str):
    """(the SavedModel's serving signature as a float32 OpenVINO model with only `SERVED_OUTPUTS`,
    the TensorFlow signature itself, the reference for checking a copy made from it)."""
    import tensorflow as tf

    loaded = tf.saved_model.load(saved_model_dir)
    signature = loaded.signatures["serving_default"]
    signature.keep_alive = loaded  # the signature's variables live as long as the loaded object
    return openvino_from_signature(signature, saved_model_dir), signature


def openvino_from_signature(signature, where: str):
    """A loaded serving signature as a float32 OpenVINO model with only `SERVED_OUTPUTS`
    (``where`` names the model in errors).  A worker that already holds the
    model (`inference.model_files.LoadedModel.signature`) converts it without loading
    the SavedModel a second time."""
    ov = import_openvino()

    converted = ov.convert_model(signature)
    by_name = {}
    for output in converted.outputs:
        for name in output.get_names():
            by_name[name] = output
    missing = [name for name in SERVED_OUTPUTS if name not in by_name]
    if missing:
        raise ValueError(f"{where}: the serving signature has no output {missing[0]!r}")
    return ov.Model([by_name[name] for name in SERVED_OUTPUTS], converted.get_parameters(), "zerolake_cpu")


def cpu_int8_path(model) -> str | None:
    """The local path of a loaded model's int8 copy, or None when it was published without one."""
    path = os.path.join(model.local_dir, layout.CPU_INT8_XML)
    return path if os.path.exists(path) else None


class OpenVinoEvaluator:
    """An evaluator (``inference.evaluator.Evaluator``) running a compiled OpenVINO model.

    ``compiled`` must have the outputs ``policy_logits`` [B, N*N+1] and
    ``value`` [B] (or [B, 1]), as ``model.cpu_int8`` writes them, and take
    planes [B, N, N, ``input_planes``] (the model's width, 17 or 22).
    """

    def __init__(
        self,
        compiled,
        generation: int,
        board_size: int,
        backend: str = "openvino-int8",
        *,
        input_planes: int = schema.BASIC_INPUT_PLANES,
    ):
        self.compiled = compiled
        self.generation = int(generation)
        self.board_size = int(board_size)
        self.input_planes = int(input_planes)
        self.backend = backend
        streams = max(1, int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        self._requests = [compiled.create_infer_request() for _ in range(streams)]
        self._logits = compiled.output("policy_logits")
        self._value = compiled.output("value")

    def __call__(self, planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        planes = np.ascontiguousarray(planes, np.float32)
        n = self.board_size
        if planes.ndim != 4 or planes.shape[1:] != (n, n, self.input_planes):
            raise ValueError(f"planes must be [B, {n}, {n}, {self.input_planes}], got {planes.shape}")
        pieces = max(1, min(len(self._requests), len(planes) // MIN_ROWS_PER_REQUEST))
        bounds = np.linspace(0, len(planes), pieces + 1).astype(int)
        used = self._requests[:pieces]
        for request, lo, hi in zip(used, bounds[:-1], bounds[1:]):
            request.start_async({0: planes[lo:hi]})
        logits, values = [], []
        for request in used:
            request.wait()
            logits.append(np.array(request.get_tensor(self._logits).data, np.float32))
            values.append(np.array(request.get_tensor(self._value).data, np.float32).reshape(-1))
        if pieces == 1:
            return logits[0], values[0]
        return np.concatenate(logits), np.concatenate(values)

    def close(self):
        self._requests = []


def make_evaluator(model, placement=None, inference: str = "auto", *, threads: int = 0, log=None):
    """The evaluator a worker or player uses for a loaded model (``inference.model_files.LoadedModel``).

    ``inference`` (`INFERENCE_CHOICES`): ``tensorflow`` always uses the
    SavedModel; ``openvino`` requires the int8 copy and OpenVINO and raises
    ValueError naming what is missing; ``auto``, when this process runs its
    network on the CPU (``placement`` of kind 'cpu', or the default placement
    on a machine without accelerators) and OpenVINO imports, uses the int8
    copy, or the float32 network through OpenVINO for a model published
    without one; else TensorFlow.  ``threads``: OpenVINO's threads (0 = every
    core this process may use).
    """
    if inference not in INFERENCE_CHOICES:
        raise ValueError(f"--inference must be one of {', '.join(INFERENCE_CHOICES)}, not {inference!r}")
    if inference == "tensorflow":
        return ModelEvaluator(model, placement=placement)
    path = cpu_int8_path(model)
    missing = openvino_missing()
    if inference == "openvino":
        if path is None:
            raise ValueError(
                f"--inference openvino: model generation {model.generation} was published without "
                f"an int8 CPU copy ({layout.CPU_INT8_XML}); see its manifest's metadata.cpu_int8"
            )
        if missing:
            raise ValueError(f"--inference openvino: {missing}")
    elif missing or not _runs_on_cpu(placement):
        return ModelEvaluator(model, placement=placement)
    elif path is None:
        return _float32_on_openvino(model, threads, log)
    evaluator = OpenVinoEvaluator(
        compile_for_cpu(path, threads or None), model.generation, model.board_size, input_planes=model.input_planes
    )
    if log is not None:
        log(f"generation {model.generation}: int8 OpenVINO copy on the CPU")
    return evaluator


def _float32_on_openvino(model, threads: int, log):
    """A model published without an int8 copy, on the CPU: its float32 network through OpenVINO, or
    TensorFlow when the conversion fails (the SavedModel is the reference and always loads there)."""
    try:
        network = openvino_from_signature(model.signature, model.local_dir)
        compiled = compile_for_cpu(network, threads or None, float32=True)
    except Exception as exc:  # noqa: BLE001 - any converter failure: TensorFlow runs the same model
        if log is not None:
            log(
                f"generation {model.generation}: float32 OpenVINO failed ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:200]}); TensorFlow on the CPU"
            )
        return ModelEvaluator(model, placement=None)
    if log is not None:
        log(f"generation {model.generation}: float32 OpenVINO on the CPU (published without an int8 copy)")
    return OpenVinoEvaluator(
        compiled, model.generation, model.board_size, backend="openvino-float32", input_planes=model.input_planes
    )


def _runs_on_cpu(placement) -> bool:
    if placement is not None and placement.kind == "cpu":
        return True
    if placement is not None and placement.kind != "default":
        return False
    from inference.devices import accelerator_devices

    return not accelerator_devices()
