"""The job's composite PTransforms in a TestPipeline, checked with assert_that."""
from __future__ import annotations

import numpy as np
import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from format import codec
from format import schema
from testdata.synthetic_games import synthetic_game
from pipeline import window_plan as W
from pipeline.config import ShuffleConfig
from pipeline.transforms import FindDuplicateGames, JobContext, ShuffleWindow
from tests.pipeline.support import read_window, write_chunk, write_run_json


def _pipeline():
    return test_pipeline.TestPipeline(runner=FnApiRunner())


def test_find_duplicate_games_drops_every_copy_but_the_first():
    bundles = [
        (np.array([1, 2, 3], np.int64), np.array([b"a" * 16, b"b" * 16, b"c" * 16], dtype="S16")),
        (np.array([10, 11], np.int64), np.array([b"b" * 16, b"d" * 16], dtype="S16")),
        (np.array([20], np.int64), np.array([b"b" * 16], dtype="S16")),
    ]
    with _pipeline() as p:
        dropped = (p | beam.Create(bundles) | FindDuplicateGames()
                   | beam.Map(lambda a: sorted(a.tolist())))
        assert_that(dropped, equal_to([[10, 20]]))


def test_shuffle_window_writes_shards_and_outputs_the_manifest(tmp_path):
    root = str(tmp_path)
    write_run_json(root, 9)
    rng = np.random.default_rng(8)
    games = [synthetic_game(rng, 9, visits=20, generation=4) for _ in range(10)]
    path = write_chunk(root, 4, games, 0)
    positions = sum(g.num_positions for g in games)
    chunk = W.ChunkRef(path, 4, 0, 0)
    context = JobContext(
        root_url=root, config=ShuffleConfig(root=root, reuse=2.0, dedup_max_move=0), board_size=9, komi=7.5,
        target_generation=3, attempt="testattempt", seed=1, num_shards=3, num_partitions=1,
        model_generation=None)
    with _pipeline() as p:
        manifest = (p | beam.Create([(0, [(0, chunk)])]) | ShuffleWindow(context)
                    | beam.Map(lambda m: (m["positions"], len(m["shards"]), m["input"]["games_read"])))
        assert_that(manifest, equal_to([(2 * positions, 3, 10)]))
    written, shards = read_window(root, 3)
    assert sorted(written["shards"]) == [f"testattempt-{i:05d}-of-00003{schema.SHARD_SUFFIX}" for i in range(3)]
    assert sum(len(r) for r in shards.values()) == 2 * positions
