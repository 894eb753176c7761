"""Where a process runs its network: device flags, GPU memory, TPU connection.

Device code only, no evaluation: the worker (``--device``), the evaluators
(`inference.evaluator.ModelEvaluator` splits batches over the devices chosen
here) and the trainer (``--strategy``, `model.sgd`) all pick their devices here.

`configure_accelerator(device)` runs once per process, before TensorFlow
touches a GPU (before the first model load), and returns a `Placement`: where
the network runs.  ``device`` is the worker's ``--device`` (`parse_device`):

* ``""``: TensorFlow's choice; with several GPUs each batch is split across
  all of them (one thread per GPU);
* ``cpu``: the CPU only, GPUs hidden;
* ``gpu`` / ``gpu:K``: GPU K (default 0) only.  The others are hidden from
  this process, so it creates no CUDA context on them: several worker
  processes share a machine, one ``--device gpu:K`` each;
* ``tpu``: the TPU cores of this TPU VM through a ``TPUStrategy`` (`connect_tpu`).

It turns GPU memory growth on for every visible GPU, so a process takes GPU
memory as it needs it instead of nearly all of it at start-up, and several
processes can share one GPU.  The model is then loaded inside
``placement.scope()`` so its variables live where it runs.  A device a flag
asks for that is not there raises `AcceleratorMissing`.  TensorFlow is
imported inside the functions, never at import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
from typing import Any

log = logging.getLogger("inference.devices")


def accelerator_devices() -> list[str]:
    """Names of the TensorFlow accelerators (GPUs, then TPUs) on this machine."""
    import tensorflow as tf

    return [d.name for d in tf.config.list_logical_devices("GPU")] or [
        d.name for d in tf.config.list_logical_devices("TPU")
    ]


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


def cpu_has_bf16_matrix_unit(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has AMX's bfloat16 tile unit (the ``amx_bf16`` flag; Intel Sapphire Rapids on).

    oneDNN runs bfloat16 convolutions on it: the trainer's step is 1.1-1.7x faster in bfloat16
    there, and slower than float32 on CPUs without it.  False where the file is not Linux's.
    """
    try:
        with open(cpuinfo) as handle:
            for line in handle:
                if line.startswith("flags"):
                    return "amx_bf16" in line.split(":", 1)[-1].split()
    except OSError:
        pass
    return False


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
    strategy: Any = None
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

    REMEDY = {
        "gpu": "is the CPU-only TensorFlow installed? scripts/setup.sh --accelerator gpu installs the GPU "
        "build; on a VM, check the NVIDIA driver with nvidia-smi",
        "tpu": "run on a Cloud TPU VM set up with scripts/setup.sh --accelerator tpu",
    }

    def __init__(self, flag: str, kind: str, detail: str = "", where: str = "on this machine"):
        super().__init__(
            f"{flag}: TensorFlow sees no {kind.upper()} {where}{f' ({detail})' if detail else ''}; {self.REMEDY[kind]}"
        )
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
        except RuntimeError:  # the GPUs are initialised already
            if not tf.config.experimental.get_memory_growth(gpu):
                log.warning(
                    "GPU memory growth is off for %s: TensorFlow touched the GPU before configure_accelerator ran",
                    gpu.name,
                )


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
