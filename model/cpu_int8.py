"""An int8 copy of the inference model for CPU workers (OpenVINO), made when a model is published.

On a CPU-only worker the network is nearly all of self-play's cost, and OpenVINO's int8 kernels run
it several times as fast as TensorFlow's float32 (docs/measured.md).  TensorFlow stays the reference:
the SavedModel is always published, and GPU/TPU workers use it.  Once a generation
(``model.cycle`` and ``testdata.models`` call `add_cpu_int8`)::

    SavedModel dir --ov.convert_model--> float32 OpenVINO model (policy_logits and value only)
        --nncf.quantize on calibration planes (the window's own positions)--> int8 model
        --accuracy check against the SavedModel on held-out planes-->
    SavedModel dir/<layout.CPU_INT8_XML, .bin>  (published with the model's other files)

The conversion, quantization and check run in a child process (`quantize_in_child`), which
returns the figures and the files; the calling process applies the gate.  A trainer publishes
every window for weeks, and what OpenVINO and NNCF allocate in a process is not all given back.

The check is the gate: on held-out positions, mean policy KL within `MAX_POLICY_KL`, top-move
agreement at least `MIN_TOP1_AGREEMENT` (an untrained network's near-tied moves swap under any
rounding) and mean value error at most `MAX_VALUE_MAE`; else CPU workers run float32 OpenVINO.
The figures go into the manifest's ``cpu_int8`` metadata either way.  Quantization: PERFORMANCE
preset, full bias correction, dense layers and convolutions of at most `KEEP_FLOAT_MAX_CHANNELS`
outputs (little arithmetic, most of the value's error) kept float32.  No OpenVINO: no copy.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from format import layout
from inference.openvino_evaluator import (
    OpenVinoEvaluator,
    compile_for_cpu,
    float_openvino_model,
    import_nncf,
    import_openvino,
)
from processes.children import die_with_parent, start_child

CALIBRATION_POSITIONS = 256
"""Positions NNCF collects activation ranges on (more cost time, not agreement: docs/measured.md)."""
CALIBRATION_BATCH = 32
"""Positions per NNCF calibration step (faster and more accurate than one a step: docs/measured.md)."""
CHECK_POSITIONS = 256
"""Held-out positions the accuracy gate compares the two networks on."""
MIN_TOP1_AGREEMENT = 0.80
MAX_POLICY_KL = 0.02
MAX_VALUE_MAE = 0.03
KEEP_FLOAT_MAX_CHANNELS = 2


def available() -> str | None:
    """None when OpenVINO and NNCF are installed, else why not (for the log and the manifest).
    Looked up, not imported: only the child process (`quantize_in_child`) imports them."""
    missing = [name for name in ("openvino", "nncf") if importlib.util.find_spec(name) is None]
    return f"OpenVINO/NNCF not installed (no module named {missing[0]!r})" if missing else None


def _reference(signature, planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    outputs = signature(planes=planes)
    return (np.asarray(outputs["policy_logits"], np.float32), np.asarray(outputs["value"], np.float32).reshape(-1))


def _kept_in_float(model) -> list[str]:
    """Names of the operations quantization leaves in float32 (see the module docstring)."""
    names = []
    for op in model.get_ops():
        kind = op.get_type_name()
        if kind == "MatMul":
            names.append(op.get_friendly_name())
        elif kind == "Convolution":
            channels = op.get_output_partial_shape(0)[1]  # OpenVINO's convolutions are NCHW
            if channels.is_static and channels.get_length() <= KEEP_FLOAT_MAX_CHANNELS:
                names.append(op.get_friendly_name())
    return names


def agreement(reference: tuple[np.ndarray, np.ndarray], candidate: tuple[np.ndarray, np.ndarray]) -> dict:
    """How closely ``candidate``'s (logits, values) follow ``reference``'s on the same positions:
    top-move agreement, mean absolute value difference, mean KL(reference || candidate) of the policies."""
    ref_logits, ref_values = reference
    logits, values = candidate

    def log_softmax(x):
        x = x - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))

    ref_log, log = log_softmax(ref_logits.astype(np.float64)), log_softmax(logits.astype(np.float64))
    return {
        "top1_agreement": float(np.mean(ref_logits.argmax(1) == logits.argmax(1))),
        "value_mae": float(np.mean(np.abs(ref_values - values))),
        "policy_kl": float(np.mean(np.sum(np.exp(ref_log) * (ref_log - log), axis=1))),
    }


def add_cpu_int8(saved_model_dir: str, planes: np.ndarray, *, log=print) -> dict:
    """Quantize the SavedModel in ``saved_model_dir`` and, if it passes the gate, write the
    int8 copy into that directory at `layout.CPU_INT8_XML` (and its .bin).

    ``planes``: float32 [M, N, N, C] (C: the network's input planes)
    positions like the ones the network will see (the trainer passes its
    window's); the first `CALIBRATION_POSITIONS`
    calibrate, the next `CHECK_POSITIONS` check.  Returns the manifest
    metadata entry: ``{"written": bool, ...figures or the reason}``.  Never
    raises for a failed quantization: the model is still published, without
    the copy, and the reason is returned.

    The quantizing runs in a child process (`quantize_in_child`); this one only applies the gate.
    """
    missing = available()
    if missing is not None:
        return {"written": False, "reason": missing}
    planes = np.asarray(planes, np.float32)
    if len(planes) < 2:
        return {"written": False, "reason": f"only {len(planes)} calibration positions"}
    held_out = min(CHECK_POSITIONS, len(planes) // 3)
    calibrate = planes[: min(CALIBRATION_POSITIONS, len(planes) - held_out)]
    check = planes[len(calibrate) : len(calibrate) + held_out]
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="zerolake-int8-") as scratch:
        xml = os.path.join(scratch, "int8.xml")
        try:
            figures = quantize_in_child(saved_model_dir, calibrate, check, xml)
        except QuantizationFailed as exc:  # a failed quantization must not stop the publish
            return {"written": False, "reason": f"quantization failed: {exc}"[:500]}
        entry = {
            "calibration_positions": len(calibrate),
            "check_positions": len(check),
            **{k: round(v, 5) for k, v in figures.items()},
            "seconds": round(time.time() - started, 1),
        }
        if (
            figures["top1_agreement"] < MIN_TOP1_AGREEMENT
            or figures["policy_kl"] > MAX_POLICY_KL
            or figures["value_mae"] > MAX_VALUE_MAE
        ):
            log(
                f"int8 CPU copy not written: top-1 agreement {figures['top1_agreement']:.3f} "
                f"(needs >= {MIN_TOP1_AGREEMENT}), policy KL {figures['policy_kl']:.4f} "
                f"(needs <= {MAX_POLICY_KL}), value error {figures['value_mae']:.4f} (needs <= {MAX_VALUE_MAE})"
            )
            return {"written": False, "reason": "accuracy gate", **entry}
        target = os.path.join(saved_model_dir, layout.CPU_INT8_XML)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        for made, final in ((xml, target), (_weights_file(xml), _weights_file(target))):
            shutil.move(made, final)
    log(
        f"int8 CPU copy written: top-1 agreement {figures['top1_agreement']:.3f}, value error "
        f"{figures['value_mae']:.4f}, {entry['seconds']} s"
    )
    return {"written": True, "file": layout.CPU_INT8_XML, **entry}


class QuantizationFailed(Exception):
    """The child process made no int8 model (the message says why)."""


CHILD_TIMEOUT_S = 1800
"""Longest a quantization may take (a 19x19 20-block network calibrates in minutes)."""


def quantize_in_child(saved_model_dir: str, calibrate: np.ndarray, check: np.ndarray, xml: str) -> dict:
    """`quantize` run by ``python -m model.cpu_int8`` in a child process: the int8 model is
    written to ``xml`` (and its .bin), the agreement figures are returned.

    A child, because what OpenVINO and NNCF allocate while quantizing is not all returned to a
    process that goes on: in the trainer, which makes a copy every window, resident memory grew
    about 0.3 MB a window, and a trainer runs for weeks.  The child's start (Python, TensorFlow
    to load the SavedModel the check compares with) costs about 4 s.
    """
    scratch = os.path.dirname(xml)
    np.save(os.path.join(scratch, "calibrate.npy"), calibrate)
    np.save(os.path.join(scratch, "check.npy"), check)
    # A session of its own (a Ctrl-C reaches only the trainer, which stops it here), killed with a
    # trainer that is SIGKILLed: an orphan would calibrate on for minutes.
    child = start_child(
        ["model.cpu_int8", saved_model_dir, scratch, xml],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent(os.getpid()),
    )
    try:
        stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise QuantizationFailed(f"took over {CHILD_TIMEOUT_S} s") from None
    except BaseException:
        child.kill()
        child.wait()
        raise
    answer = stdout.strip().splitlines()[-1:]
    try:
        result = json.loads(answer[0]) if answer else None
    except ValueError:
        result = None
    if child.returncode != 0 or not isinstance(result, dict):
        said = (stderr.strip().splitlines() or ["no message"])[-1]
        raise QuantizationFailed(f"the quantizing process exited with {child.returncode}: {said}")
    if "error" in result:
        raise QuantizationFailed(result["error"])
    return result["figures"]


def quantize(saved_model_dir: str, calibrate: np.ndarray, check: np.ndarray, xml: str) -> dict:
    """Quantize the SavedModel on ``calibrate``, save it at ``xml``, and return its agreement with
    the float32 network on ``check`` (`agreement`)."""
    nncf = import_nncf()
    ov = import_openvino()

    nncf.set_log_level(logging.ERROR)  # it lists every node it skips at INFO

    float_model, signature = float_openvino_model(saved_model_dir)
    # Batches of CALIBRATION_BATCH positions: NNCF runs the network once per item.
    items = np.array_split(calibrate, max(1, len(calibrate) // CALIBRATION_BATCH))
    quantized = nncf.quantize(
        float_model,
        nncf.Dataset(items),
        preset=nncf.QuantizationPreset.PERFORMANCE,
        subset_size=len(items),
        fast_bias_correction=False,
        ignored_scope=nncf.IgnoredScope(names=_kept_in_float(float_model), validate=False),
    )
    int8 = OpenVinoEvaluator(compile_for_cpu(quantized), 0, check.shape[1], input_planes=check.shape[3])
    figures = agreement(_reference(signature, check), int8(check))
    ov.save_model(quantized, xml, compress_to_fp16=False)
    return figures


def _weights_file(xml: str) -> str:
    return xml[: -len(".xml")] + ".bin"


def _child_main(argv: list[str]) -> int:
    """``python -m model.cpu_int8 SAVED_MODEL_DIR SCRATCH XML``: one JSON line on stdout,
    ``{"figures": ...}`` or ``{"error": ...}``."""
    saved_model_dir, scratch, xml = argv
    try:
        calibrate = np.load(os.path.join(scratch, "calibrate.npy"))
        check = np.load(os.path.join(scratch, "check.npy"))
        result: dict = {"figures": quantize(saved_model_dir, calibrate, check, xml)}
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
