"""The shuffle job drops a game whose moves repeat another's, whatever its id.

Two loops on one root both seeded their workers 1000 + generation: 533 games
were written twice under different ids, and the window kept both.  The
duplicate check now keys games by board size, komi and moves.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from cloud.storage import open_storage
from format import codec, layout
from pipeline.positions import game_digest
from testdata.random_games import engine_game
from testdata.synthetic_windows import write_run_config


def test_the_digest_ignores_ids_and_sees_every_move():
    rng = np.random.default_rng(1)
    game = engine_game(rng, 9)
    renamed = dataclasses.replace(game, game_id=game.game_id + "-again")
    assert game_digest(renamed) == game_digest(game)
    other = dataclasses.replace(game, moves=np.r_[game.moves[:-3], game.moves[-2], game.moves[-3], game.moves[-1]])
    assert game_digest(other) != game_digest(game)
    assert game_digest(dataclasses.replace(game, komi=6.5)) != game_digest(game)


def test_the_same_games_under_new_ids_are_dropped_from_the_window(tmp_path):
    from pipeline import shuffle

    root = str(tmp_path / "lake")
    storage = open_storage(root)
    write_run_config(storage, board_size=9)
    rng = np.random.default_rng(7)
    games = [engine_game(rng, 9, worker_id="a") for _ in range(10)]
    storage.write_new(layout.chunk_path(0, "a", 1_700_000_000_000, 0), codec.encode_chunk(games))
    twins = [dataclasses.replace(g, game_id=g.game_id.replace("a", "b", 1) + "b") for g in games[:4]]
    storage.write_new(layout.chunk_path(0, "b", 1_700_000_000_001, 0), codec.encode_chunk(twins))
    assert shuffle.main(["--root", root, "--window-min-positions", "100", "--workers", "1"]) == 0
    manifest = json.loads(storage.read(layout.window_manifest(1)))
    assert manifest["dedup"]["duplicate_games"] == 4
    assert manifest["input"]["games_read"] == 14
