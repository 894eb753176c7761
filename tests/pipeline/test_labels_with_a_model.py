"""The generation-1 path of the shuffle job, end to end: a lake with a published model.

From the first published model on, ``python -m pipeline.shuffle`` (its
``main()``, the real Beam job on the in-process FnApiRunner) labels resigned
games by playing them out with that model (pipeline.labels, ModelPlayout)
instead of by random playouts.  One lake: legal engine games, some finished
by two passes and some resigned, beside an untrained 1-block model published
as generation 1 (so LATEST = 1 and the job builds window 2).

What the label path records, checked here:

* the manifest: ``label_model_generation`` names the model, every resigned
  game is counted in ``labels.played_out_model`` and none in
  ``played_out_random``, every finished game in ``final_board``;
* the shards (resigned and finished games are told apart by their
  generation, which every record keeps): a resigned game's records carry
  the played-out ownership weight and one settled board per game (every
  point -1, 0 or +1); a finished game's records carry its exact final-board
  ownership at weight 1.  Which playout made a label is recorded only in the
  manifest (records keep no label provenance), so the manifest checks are
  what tells the model path from the random one: with ``--playout-labels
  random`` the first test fails.
"""
from __future__ import annotations

import collections

import numpy as np
import pytest

from pipeline import labels as L
from pipeline.shuffle import main
from tests.arena.test_match import publish_tiny_model
from tests.pipeline.support import engine_game, read_window, resigned_copy, write_chunk, write_run_json

PLAYOUT_WEIGHT = 0.5
MODEL_GENERATION = 1
FINISHED_GEN, RESIGNED_GEN = 0, 1
"""Game generations that tell the two kinds apart in the shards: a position record
keeps its game's generation (and, from record version 2 on, no game id)."""


@pytest.fixture(scope="module")
def window(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("lake"))
    write_run_json(root, 9)
    rng = np.random.default_rng(11)
    finished = [engine_game(rng, 9, generation=FINISHED_GEN) for _ in range(4)]
    resigned = [resigned_copy(engine_game(rng, 9, generation=RESIGNED_GEN), 0.6) for _ in range(8)]
    write_chunk(root, FINISHED_GEN, finished, 0)
    write_chunk(root, RESIGNED_GEN, resigned, 1)
    publish_tiny_model(root, generation=MODEL_GENERATION)
    code = main(["--root", root, "--window-min-positions", "1000000", "--workers", "1", "--seed", "3",
                 "--dedup-max-move", "0", "--reuse", "1.0", "--playout-ownership-weight", str(PLAYOUT_WEIGHT),
                 "--model-playout-moves", "40"])
    assert code == 0
    manifest, shards = read_window(root, MODEL_GENERATION + 1)
    records = collections.defaultdict(list)
    for shard in shards.values():
        for record in shard:
            records[record.generation].append(record)
    return {"manifest": manifest, "records": records, "finished": finished, "resigned": resigned}


def test_the_manifest_records_model_playout_labels(window):
    manifest = window["manifest"]
    assert manifest["target_generation"] == MODEL_GENERATION + 1
    assert manifest["label_model_generation"] == MODEL_GENERATION
    labels = manifest["labels"]
    assert labels["played_out_model"] == len(window["resigned"])
    assert labels["played_out_random"] == 0
    assert labels["final_board"] == len(window["finished"])
    assert labels["replay_failed"] == labels["unlabelled"] == 0
    assert labels["playout_winner_checked"] == len(window["resigned"])


def test_resigned_games_carry_hard_model_playout_labels(window):
    records = window["records"][RESIGNED_GEN]
    assert len(records) == sum(g.num_positions for g in window["resigned"])   # reuse 1, nothing capped
    for record in records:
        assert record.ownership_weight == PLAYOUT_WEIGHT
        # One played-out board: every point settled.
        assert set(np.unique(record.ownership)) <= {-1.0, 0.0, 1.0}
    # One label per game, the same at each of its positions (from Black's side):
    # at most one distinct ownership map per resigned game.
    black_view = {tuple(r.ownership * r.to_play) for r in records}
    assert 1 <= len(black_view) <= len(window["resigned"])


def test_finished_games_keep_their_exact_final_board(window):
    records = window["records"][FINISHED_GEN]
    assert len(records) == sum(g.num_positions for g in window["finished"])
    finals = {tuple(L.replay(g).ownership().astype(np.float32)) for g in window["finished"]}
    for record in records:
        assert record.ownership_weight == 1.0
        assert tuple(record.ownership * record.to_play) in finals
