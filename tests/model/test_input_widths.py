"""A model of either input width (17 or 22 planes, format/planes.py) trains, publishes and plays.

tests/format/test_planes.py checks that every builder makes the same planes;
this file checks that the width a model was built for travels with it: the
trainer's ``--input-planes 22`` trains on 22-plane batches and publishes
``metadata.feature_set_planes``, the registry refuses a manifest whose width
is impossible or is not its network's, and a worker that meets models of
both widths in one lake feeds each its own.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from cloud.storage import open_storage
from format import layout, planes, registry, schema
from inference import model_files
from engine.board import Board
from testdata import synthetic_windows as synthetic
from testdata.models import publish_untrained_model
from testdata.random_games import random_move
from tests.selfplay.test_worker_models import finished, new_lake, run_worker, set_latest, wait_for_event

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_rows_change_width_without_changing_what_they_say():
    """`convert_input_planes` (a worker's rows left over for a model of the other width) gives what the
    engine builds at that width, on positions with captures and ko."""
    rng = np.random.default_rng(3)
    board, rows17, rows22 = Board(9, schema.DEFAULT_KOMI), [], []
    while not board.is_over:
        rows17.append(board.features(17))
        rows22.append(board.features(22))
        board.play(random_move(board, rng))
    rows17, rows22 = np.stack(rows17), np.stack(rows22)
    np.testing.assert_array_equal(planes.convert_input_planes(rows17, 22), rows22)
    np.testing.assert_array_equal(planes.convert_input_planes(rows22, 17), rows17)
    with pytest.raises(ValueError, match=r"input planes must be one of \(17, 22\), got 18"):
        planes.convert_input_planes(rows17, 18)


def test_a_22_plane_model_trains_publishes_and_plays_beside_a_17_plane_one(tmp_path):
    """The trainer's ``--input-planes 22`` publishes generation 1 (with its int8 copy, as a CPU worker
    runs it); an untrained 17-plane generation 2 follows; one worker plays games with each."""
    root = new_lake(tmp_path)
    storage = open_storage(root)
    synthetic.write_synthetic_window(storage, target_generation=1, board_size=9, positions=1200, shards=1, seed=2)
    trained = subprocess.run(
        [sys.executable, "-m", "model.train", "--root", root, "--input-planes", "22", "--blocks", "1",
         "--filters", "8", "--value-hidden", "8", "--batch-size", "32", "--steps-per-window", "20",
         "--steps-per-call", "10", "--warmup-steps", "5", "--log-every", "10"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    metadata = json.loads(storage.read(layout.model_manifest(1)))["metadata"]
    assert metadata["feature_set_planes"] == 22 and metadata["network"]["input_planes"] == 22
    assert metadata["cpu_int8"]["written"], metadata["cpu_int8"]
    model = model_files.load_model(storage, 1, cache_dir=str(tmp_path / "cache"))
    assert model.input_planes == 22
    with pytest.raises(ValueError, match=r"planes must be \[B, 9, 9, 22\]"):
        model(np.zeros((1, 9, 9, 17), np.float32))
    publish_untrained_model(root, 2, 9, seed=2)
    set_latest(root, 1)

    def script(events, returned):
        first = wait_for_event(events, returned, finished(1), "a game of the 22-plane generation 1")
        set_latest(root, 2)
        wait_for_event(events, returned, finished(2), "a game of the 17-plane generation 2", after=first)

    code, events = run_worker(root, tmp_path, [], script)
    assert code == 0
    assert {1, 2} <= {e["generation"] for e in events if e["event"] == "game_finished"}


def test_a_manifest_whose_width_is_impossible_or_not_its_networks_is_refused_by_field(tmp_path):
    root = str(tmp_path / "lake")
    publish_untrained_model(root, 1, 9, seed=1, metadata={"feature_set_planes": 23})
    with pytest.raises(registry.ModelIntegrityError, match=r"field 'metadata\.feature_set_planes': is 23"):
        model_files.load_model(open_storage(root), 1, cache_dir=str(tmp_path / "cache"))
    publish_untrained_model(root, 2, 9, seed=2, metadata={"feature_set_planes": 22})   # a 17-plane network
    with pytest.raises(registry.ModelIntegrityError,
                       match=r"field 'metadata\.feature_set_planes' is 22, but the SavedModel's 'planes' is "
                             r"\[B, 9, 9, 17\]"):
        model_files.load_model(open_storage(root), 2, cache_dir=str(tmp_path / "cache"))
