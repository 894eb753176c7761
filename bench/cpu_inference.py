"""CPU inference of a trained network: TensorFlow, float32 OpenVINO and the int8 copy, side by side.

A CPU worker runs a published model's int8 OpenVINO copy when the trainer wrote one, else the
float32 network through OpenVINO (`inference.openvino_evaluator.make_evaluator`).  Unlike
bench/selfplay.py's untrained network, this measures a trained one: docs/baseline-2026-11-25/'s
4x32 9x9 model.  The backends are timed in interleaved rounds on the same batches (best round each):
* ``evals_per_s_tensorflow`` / ``_openvino_float32`` / ``_openvino_int8``: evaluations per second
  at the worker's batch (``BATCH``), and the ratios ``float32_vs_tensorflow``, ``int8_vs_tensorflow``;
* ``int8_*``: a copy made as the trainer makes one (`model.cpu_int8.add_cpu_int8`), its agreement
  with float32 and ``int8_gate_passed``; ``float32_max_abs_logit_diff``: OpenVINO against TensorFlow.
Positions come from random games (a mini-lake holds none), so the gate's verdict is indicative.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cloud.storage import open_storage  # noqa: E402
from format import layout, registry  # noqa: E402
from inference import model_files
from inference.devices import Placement, use_every_cpu_core  # noqa: E402
from inference.openvino_evaluator import (
    OpenVinoEvaluator,
    compile_for_cpu,
    make_evaluator,
    openvino_from_signature,  # noqa: E402
)
from model import cpu_int8  # noqa: E402
from testdata.models import random_game_planes  # noqa: E402

DEFAULT_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "baseline-2026-11-25")
BATCH = 128
CALIBRATION = cpu_int8.CALIBRATION_POSITIONS
CHECK = cpu_int8.CHECK_POSITIONS
ROUNDS = 5
ROUND_SECONDS = 2.0


def rates(evaluators: dict, planes: np.ndarray) -> dict:
    """Evaluations per second of each evaluator: interleaved rounds, the best of each."""
    best = {name: 0.0 for name in evaluators}
    for evaluator in evaluators.values():
        evaluator(planes)  # compile, trace, warm caches
    for _ in range(ROUNDS):
        for name, evaluator in evaluators.items():
            start, done = time.perf_counter(), 0
            while time.perf_counter() - start < ROUND_SECONDS:
                evaluator(planes)
                done += len(planes)
            best[name] = max(best[name], done / (time.perf_counter() - start))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=DEFAULT_ROOT, help="lake (or mini-lake) whose LATEST model is measured")
    args = parser.parse_args()
    started = time.time()
    use_every_cpu_core()
    storage = open_storage(args.root)
    generation = registry.latest_generation(storage)
    if generation is None:
        print(f"bench/cpu_inference.py: {args.root} has no published model", file=sys.stderr)
        return 2
    scratch = tempfile.mkdtemp(prefix="zerolake-cpu-inference-")
    try:
        model = model_files.load_model(storage, generation, cache_dir=os.path.join(scratch, "cache"))
        n = int(model.board_size)
        positions = random_game_planes(n, CALIBRATION + CHECK + BATCH, seed=11)
        # add_cpu_int8 takes both sets in one array, as in training: it calibrates on the first
        # CALIBRATION and checks on the next CHECK (``check`` is the same held-out slice).
        calibrate_then_check = positions[: CALIBRATION + CHECK]
        check, batch = positions[CALIBRATION : CALIBRATION + CHECK], positions[-BATCH:]
        cpu = Placement("cpu", "/device:CPU:0")
        tensorflow = make_evaluator(model, cpu, "tensorflow")
        network = openvino_from_signature(model.signature, model.local_dir)
        float32 = OpenVinoEvaluator(compile_for_cpu(network, float32=True), generation, n, "openvino-float32")
        # The int8 copy, made as the trainer makes it, in a copy of the model folder.
        copy_dir = os.path.join(scratch, "model")
        shutil.copytree(model.local_dir, copy_dir)
        shutil.rmtree(os.path.join(copy_dir, os.path.dirname(layout.CPU_INT8_XML)), ignore_errors=True)
        entry = cpu_int8.add_cpu_int8(copy_dir, calibrate_then_check, log=lambda text: None)
        figures = {k: entry[k] for k in ("top1_agreement", "policy_kl", "value_mae") if k in entry}
        evaluators = {"tensorflow": tensorflow, "openvino_float32": float32}
        if entry.get("written"):  # a copy the gate refused is not written, so not timed
            evaluators["openvino_int8"] = OpenVinoEvaluator(
                compile_for_cpu(os.path.join(copy_dir, layout.CPU_INT8_XML)), generation, n
            )
        measured = rates(evaluators, batch)
        reference = tensorflow(check)
        ov_logits, _ = float32(check)
        result = {
            "bench": "cpu_inference",
            "model": f"{os.path.relpath(args.root)}@{generation}",
            "network": model.metadata.get("network"),
            "board_size": n,
            "batch": BATCH,
            "cores": len(os.sched_getaffinity(0)),
            "positions": "random games (testdata.models)",
            **{f"evals_per_s_{name}": round(rate) for name, rate in measured.items()},
            "float32_vs_tensorflow": round(measured["openvino_float32"] / measured["tensorflow"], 2),
            "float32_max_abs_logit_diff": float(np.abs(ov_logits - reference[0]).max()),
            "int8_gate_passed": bool(entry.get("written")),
            **{f"int8_{k}": v for k, v in figures.items()},
        }
        if "openvino_int8" in measured:
            result["int8_vs_tensorflow"] = round(measured["openvino_int8"] / measured["tensorflow"], 2)
        result["seconds"] = round(time.time() - started)
        print(json.dumps(result))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
