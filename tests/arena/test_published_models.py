"""The two-hour runs' final models, published in the repository as mini-lakes.

docs/baseline-2026-11-25/ holds run.json, models/LATEST and models/000016/ (docs/record-2026-11-25/ and
docs/record-2026-11-26/ the same with generation 21), so that anyone can replay the claim
(`python -m arena.match model:docs/baseline-2026-11-25/ gnugo:1 --games 100 --visits 256`).
These tests keep those mini-lakes loadable by the registry and show, on a trained network (the int8
gate refused this generation's copy), that the float32 OpenVINO network a CPU worker then runs is the
same function as TensorFlow's.
"""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from cloud.storage import open_storage
from format import registry
from inference import model_files
from format.run_config import read_run_config
from inference.devices import Placement
from inference.evaluator import ModelEvaluator
from arena.match import main as match_main
from inference.openvino_evaluator import OpenVinoEvaluator, make_evaluator
from testdata.models import random_game_planes

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
BASELINE = DOCS / "baseline-2026-11-25"


@pytest.mark.parametrize("folder, generation", [("baseline-2026-11-25", 16), ("record-2026-11-25", 21),
                                                  ("record-2026-11-26", 21)])
def test_a_published_mini_lake_loads_as_a_lake(tmp_path, folder, generation):
    storage = open_storage(str(DOCS / folder))
    assert registry.latest_generation(storage) == generation
    run = read_run_config(storage)
    assert (run.board_size, run.komi) == (9, 7.5)
    model = model_files.load_model(storage, generation, cache_dir=str(tmp_path / "cache"))
    assert model.board_size == 9 and model.metadata["network"]["blocks"] == 4


def test_a_cpu_worker_runs_the_trained_baseline_through_openvino_as_tensorflow_does(tmp_path):
    model = model_files.load_model(open_storage(str(BASELINE)), 16, cache_dir=str(tmp_path / "cache"))
    evaluator = make_evaluator(model, Placement("cpu", "/device:CPU:0"), "auto")
    assert isinstance(evaluator, OpenVinoEvaluator) and evaluator.backend == "openvino-float32"
    planes = random_game_planes(9, 64, seed=21)
    logits, values = evaluator(planes)
    ref_logits, ref_values = ModelEvaluator(model, devices=[])(planes)
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(values, ref_values, rtol=1e-3, atol=1e-3)
    # A trained network: its policy on these positions is far from uniform over the 82 moves.
    probabilities = np.exp(ref_logits - ref_logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    assert np.median(probabilities.max(axis=1)) > 5 / 82


def test_the_baseline_beats_random_moves_through_the_match_command(capsys):
    assert match_main([f"model:{BASELINE}", "random", "--games", "2", "--visits", "8", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"wins": 2' in out and '"visits": 8' in out         # the record says how it was played


def test_the_int8_copy_of_the_trained_baseline_passes_the_trainers_gate(tmp_path):
    # The int8 figures used to come from untrained networks, where the gate passes easily; on this
    # trained one, NNCF's fast bias correction was refused (value error 0.044 here), the full one passes.
    import shutil

    from model import cpu_int8

    model = model_files.load_model(open_storage(str(BASELINE)), 16, cache_dir=str(tmp_path / "cache"))
    copy = tmp_path / "model"
    shutil.copytree(model.local_dir, copy)
    wanted = cpu_int8.CALIBRATION_POSITIONS + cpu_int8.CHECK_POSITIONS
    planes = random_game_planes(9, wanted + 128, seed=11)[:wanted]       # bench/cpu_inference.py's positions
    entry = cpu_int8.add_cpu_int8(str(copy), planes, log=lambda text: None)
    assert entry["written"], entry
    assert entry["value_mae"] <= cpu_int8.MAX_VALUE_MAE and entry["top1_agreement"] >= cpu_int8.MIN_TOP1_AGREEMENT
