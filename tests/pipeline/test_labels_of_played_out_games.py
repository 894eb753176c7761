"""pipeline.labels: a resigned game that self-play played on to two passes (END_RESIGN, ownership
source ACCELERATED) has an exact final board, so its ownership label is that board's with weight 1,
not a played-out label with the lower played-out weight (a learning bug, pinned by a test that failed
before its fix)."""

import dataclasses
import math

import numpy as np
import pytest

from format import schema
from pipeline import labels as L
from testdata.random_games import engine_game, resigned_copy


def accelerated_resignation(game):
    """``game`` (to two passes) recorded as self-play records a resignation it then played out."""
    return dataclasses.replace(game, game_id=game.game_id + "a", end_reason=schema.END_RESIGN, score=math.nan,
                               winner=-game.winner, ownership_source=schema.OWNERSHIP_ACCELERATED)


@pytest.mark.parametrize("size", [9, 19])
def test_a_resignation_played_out_to_two_passes_gets_its_exact_final_board_at_full_weight(size):
    rng = np.random.default_rng(size)
    finished = engine_game(rng, size)
    games = [accelerated_resignation(finished), resigned_copy(engine_game(rng, size), 0.6)]
    stats = L.empty_stats()
    exact, played = L.label_games(games, policy_fn=None, random_playouts=8, model_playout_moves=0,
                                  temperature=1.0, playout_weight=0.5, rng=rng, stats=stats)
    assert exact.weight == 1.0 and exact.source == schema.OWNERSHIP_ACCELERATED
    assert np.array_equal(exact.ownership, L.replay(finished).ownership())
    assert exact.score == pytest.approx(finished.score)
    # The recorded winner (the resignation's) disagrees with this board: counted, not changed.
    assert stats["final_board"] == 1 and stats["final_board_result_disagreements"] == 1
    # A resignation that was not played out is still played out by the labeller, at the lower weight.
    assert played.weight == 0.5 and played.source == schema.OWNERSHIP_RANDOM_PLAYOUTS
    assert stats["played_out_random"] == 1
