"""The int8 OpenVINO copy CPU workers run: made at publish, checked against the float32 model,
chosen by ``--inference``, and falling back to TensorFlow wherever it cannot be used."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cloud.storage import open_storage
from format import layout, registry
from inference import model_files
from model import cpu_int8
from inference.devices import Placement
from inference.evaluator import ModelEvaluator
from inference.openvino_evaluator import OpenVinoEvaluator, make_evaluator
from testdata.models import publish_untrained_model, random_game_planes

N = 9
SMALL_NETWORK = dict(blocks=2, filters=16, global_pool_every=1, global_pool_channels=8, value_hidden=16)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A lake with generation 1 published with its int8 copy, loaded back through the registry."""
    root = str(tmp_path_factory.mktemp("lake"))
    entry = publish_untrained_model(root, 1, N, network=SMALL_NETWORK, seed=5, cpu_int8=True)
    model = model_files.load_model(open_storage(root), 1, cache_dir=str(tmp_path_factory.mktemp("cache")))
    return root, entry, model


def test_the_copy_is_published_with_its_figures_in_the_manifest(published):
    root, entry, model = published
    assert entry["written"] is True, entry
    manifest = json.loads(open_storage(root).read(layout.model_manifest(1)))
    files = manifest["files"]
    assert layout.CPU_INT8_XML in files and layout.CPU_INT8_XML.replace(".xml", ".bin") in files
    recorded = manifest["metadata"]["cpu_int8"]
    assert recorded["top1_agreement"] >= cpu_int8.MIN_TOP1_AGREEMENT
    assert recorded["value_mae"] <= cpu_int8.MAX_VALUE_MAE
    assert recorded["calibration_positions"] > 0 and recorded["check_positions"] > 0


def test_the_copy_plays_like_the_float32_model_on_unseen_positions(published):
    _, _, model = published
    evaluator = make_evaluator(model, Placement("cpu", "/device:CPU:0"), "auto")
    assert isinstance(evaluator, OpenVinoEvaluator) and evaluator.generation == 1
    planes = random_game_planes(N, 200, seed=99)      # not the calibration positions (seed 5)
    logits, values = evaluator(planes)
    ref_logits, ref_values = ModelEvaluator(model, devices=[])(planes)
    assert logits.shape == (200, N * N + 1) and values.shape == (200,)
    assert logits.dtype == np.float32 and values.dtype == np.float32
    figures = cpu_int8.agreement((ref_logits, ref_values), (logits, values))
    assert figures["top1_agreement"] >= 0.9, figures
    assert figures["value_mae"] <= 0.03, figures


def test_batches_of_any_size_come_back_in_order(published):
    _, _, model = published
    evaluator = make_evaluator(model, Placement("cpu", "/device:CPU:0"), "openvino")
    planes = random_game_planes(N, 67, seed=3)
    whole_logits, whole_values = evaluator(planes)
    start = 0
    for size in (1, 7, 8, 16, 35):      # one request, and pieces split across the streams
        logits, values = evaluator(planes[start:start + size])
        np.testing.assert_allclose(logits, whole_logits[start:start + size], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(values, whole_values[start:start + size], rtol=1e-4, atol=1e-4)
        start += size


def test_the_copy_runs_one_stream_per_thread_asked_for(published):
    _, _, model = published
    one = make_evaluator(model, Placement("cpu", "/device:CPU:0"), "openvino", threads=1)
    assert len(one._requests) == 1
    planes = random_game_planes(N, 20, seed=4)
    np.testing.assert_allclose(one(planes)[0], make_evaluator(model, None, "openvino")(planes)[0],
                               rtol=1e-4, atol=1e-4)


def test_planes_of_the_wrong_shape_are_refused_by_name(published):
    _, _, model = published
    evaluator = make_evaluator(model, Placement("cpu", "/device:CPU:0"), "openvino")
    with pytest.raises(ValueError, match=r"planes must be \[B, 9, 9, 17\], got \(2, 19, 19, 17\)"):
        evaluator(np.zeros((2, 19, 19, 17), np.float32))


def test_tensorflow_is_used_off_the_cpu_or_when_asked(published):
    _, _, model = published
    assert isinstance(make_evaluator(model, Placement("cpu", "/device:CPU:0"), "tensorflow"), ModelEvaluator)
    assert isinstance(make_evaluator(model, Placement("gpu", "/device:GPU:0"), "auto"), ModelEvaluator)
    with pytest.raises(ValueError, match="--inference must be one of"):
        make_evaluator(model, None, "int4")


def test_a_model_without_the_copy_is_refused_by_name_when_openvino_int8_is_asked_for(tmp_path):
    publish_untrained_model(str(tmp_path), 1, N, seed=1)          # cpu_int8=False: no copy
    model = model_files.load_model(open_storage(str(tmp_path)), 1, cache_dir=str(tmp_path / "cache"))
    assert isinstance(make_evaluator(model, Placement("cpu", "/device:CPU:0"), "tensorflow"), ModelEvaluator)
    with pytest.raises(ValueError, match="generation 1 was published without an int8 CPU copy"):
        make_evaluator(model, Placement("cpu", "/device:CPU:0"), "openvino")


def test_a_copy_that_fails_the_accuracy_gate_is_not_written(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_int8, "MIN_TOP1_AGREEMENT", 1.01)      # no copy can agree more than always
    lines = []
    from model.export import export_inference_model
    from model.config import NetworkConfig
    from model.network import build_network

    config = NetworkConfig(board_size=N, **SMALL_NETWORK)
    export_inference_model(config, [w.numpy() for w in build_network(config).weights], str(tmp_path / "m"))
    entry = cpu_int8.add_cpu_int8(str(tmp_path / "m"), random_game_planes(N, 120, seed=2), log=lines.append)
    assert entry["written"] is False and entry["reason"] == "accuracy gate"
    assert not (tmp_path / "m" / layout.CPU_INT8_XML).exists()
    assert lines and "not written" in lines[0]


def test_a_failed_quantization_is_reported_not_raised(tmp_path):
    (tmp_path / "not-a-model").mkdir()
    entry = cpu_int8.add_cpu_int8(str(tmp_path / "not-a-model"), random_game_planes(N, 30, seed=2))
    assert entry["written"] is False and entry["reason"].startswith("quantization failed")


def test_a_model_without_the_copy_runs_its_float32_network_through_openvino(tmp_path):
    # A generation whose int8 error is over the gate is published without the copy; a CPU worker then
    # runs the same float32 network through OpenVINO (about as exact as TensorFlow, and faster) rather
    # than through TensorFlow.
    publish_untrained_model(str(tmp_path), 1, N, seed=1)          # cpu_int8=False: no copy
    model = model_files.load_model(open_storage(str(tmp_path)), 1, cache_dir=str(tmp_path / "cache"))
    said = []
    evaluator = make_evaluator(model, Placement("cpu", "/device:CPU:0"), "auto", log=said.append)
    assert isinstance(evaluator, OpenVinoEvaluator) and evaluator.backend == "openvino-float32"
    assert said == ["generation 1: float32 OpenVINO on the CPU (published without an int8 copy)"]
    planes = random_game_planes(N, 40, seed=12)
    logits, values = evaluator(planes)
    ref_logits, ref_values = ModelEvaluator(model, devices=[])(planes)
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(values, ref_values, rtol=1e-3, atol=1e-3)


def test_the_copy_is_quantized_in_a_child_so_the_publishing_process_keeps_none_of_it(tmp_path):
    # Quantized in the trainer itself, what OpenVINO and NNCF allocate kept the trainer growing
    # about 0.3 MB a window (docs/faults.md).  A fresh interpreter publishes a copy and must end
    # with the copy written and neither library (nor a loaded SavedModel's functions) in it.
    from model.config import NetworkConfig
    from model.export import export_inference_model
    from model.network import build_network

    config = NetworkConfig(board_size=N, **SMALL_NETWORK)
    export_inference_model(config, [w.numpy() for w in build_network(config).weights], str(tmp_path / "m"))
    np.save(tmp_path / "planes.npy", random_game_planes(N, 120, seed=2))
    script = (
        "import json, sys, numpy as np\n"
        "from model import cpu_int8\n"
        f"entry = cpu_int8.add_cpu_int8({str(tmp_path / 'm')!r}, np.load({str(tmp_path / 'planes.npy')!r}),"
        " log=lambda line: None)\n"
        "print(json.dumps({'written': entry['written'], 'reason': entry.get('reason'),"
        " 'loaded': sorted(m for m in ('openvino', 'nncf', 'tensorflow') if m in sys.modules)}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["written"] is True, answer
    assert answer["loaded"] == [], answer
    assert (tmp_path / "m" / layout.CPU_INT8_XML).exists()
