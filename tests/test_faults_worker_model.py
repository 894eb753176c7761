"""A worker refuses a published model that does not fit the run or whose outputs are not finite.

Before, a model whose manifest named another board size loaded ("model
generation N loaded") and then killed the worker with a ValueError deep in
the search; under a restart policy every worker crash-looped.  A diverged
model (NaN weights) loaded too, and every game then played the same
nonsense into the lake.  Now the watcher checks the board size against
run.json and evaluates a few positions before any game moves to a model:
a misfit is one ``rejected`` line and a ``model_rejected`` event, and play
goes on with the model it has (or waits, before the first).
"""
from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pytest

from cloud.storage import open_storage
from format import layout
from format.run_config import RunConfig, ensure_run_config
from testdata.models import TINY_NETWORK, publish_untrained_model


def publish_nan_model(root: str, generation: int, board_size: int) -> None:
    """A network of the run's shape whose weights are NaN, published as the trainer would."""
    from format.registry import publish_model
    from model.export import export_inference_model
    from model.network import NetworkConfig, build_network

    config = NetworkConfig(board_size=board_size, **TINY_NETWORK)
    weights = [np.full_like(value, np.nan) if np.issubdtype(value.dtype, np.floating) else value
               for value in (w.numpy() for w in build_network(config).weights)]
    with tempfile.TemporaryDirectory() as scratch:
        export_inference_model(config, weights, os.path.join(scratch, "model"))
        publish_model(open_storage(root), generation, os.path.join(scratch, "model"),
                      {"board_size": board_size, "generation": generation})


def watcher_for(root: str, tmp_path):
    from selfplay.worker import ModelWatcher

    return ModelWatcher(open_storage(root), 0.1, str(tmp_path / "cache"), current_generation=None, board_size=9)


def test_the_watcher_refuses_a_model_of_another_board_and_a_diverged_one(tmp_path):
    from selfplay.worker import ModelMisfit

    root = str(tmp_path / "lake")
    ensure_run_config(open_storage(root), RunConfig(board_size=9))
    publish_untrained_model(root, 1, 7)
    with pytest.raises(ModelMisfit, match=r"000001/MANIFEST.json: field 'board_size' is 7, but this run plays 9x9"):
        watcher_for(root, tmp_path).poll_once()
    publish_nan_model(root, 2, 9)
    with pytest.raises(ModelMisfit, match="generation 2 answers with values that are not finite"):
        watcher_for(root, tmp_path).poll_once()
    publish_untrained_model(root, 3, 9, seed=3)
    assert watcher_for(root, tmp_path).poll_once().generation == 3


def test_a_worker_never_plays_a_diverged_latest_and_never_crashes_on_it(tmp_path, capsys):
    from selfplay import worker

    root, events = str(tmp_path / "lake"), str(tmp_path / "worker.jsonl")
    ensure_run_config(open_storage(root), RunConfig(board_size=9))
    publish_untrained_model(root, 1, 9, seed=1)
    publish_nan_model(root, 2, 9)                      # LATEST names the diverged one
    code = worker.main(["--root", root, "--games", "2", "--visits", "4", "--fast-visits", "2", "--max-games", "2",
                        "--max-seconds", "4", "--seed", "1", "--spool-dir", str(tmp_path / "spool"),
                        "--poll-seconds", "0.2", "--events", events])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err
    assert "rejected model generation 2" in err and "not finite" in err
    rejected = [json.loads(line) for line in open(events) if json.loads(line)["event"] == "model_rejected"]
    assert rejected and all(e["generation"] == 2 for e in rejected)
    # Nothing was played with it: the worker waits for a good model rather than play garbage.
    storage = open_storage(root)
    assert not [i for i in storage.list(layout.games_prefix()) if "/000002/" in i.path]
