"""engine.move_choice: one move-choice and resignation rule for self-play and the players."""
import numpy as np
import pytest

from format import schema
from engine.board import Board
from engine.move_choice import MovePolicy, ResignationCounter
from arena.player import RESIGN, MctsConfig, MctsPlayer, SearchBudget


def test_opening_moves_are_sampled_then_the_best_is_played():
    policy = MovePolicy(sampled_moves=3)
    assert [policy.temperature(m) for m in range(5)] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert MovePolicy().temperature(0) == 0.0


def test_resignation_needs_consecutive_low_values_of_the_same_side():
    counter = ResignationCounter(MovePolicy(resign_threshold=-0.8, resign_consecutive=3))
    # Black is low twice, White's values do not interrupt Black's count ...
    assert not counter.observe(schema.BLACK, -0.9)
    assert not counter.observe(schema.WHITE, 0.9)
    assert not counter.observe(schema.BLACK, -0.95)
    # ... but one good value of Black's own resets it.
    assert not counter.observe(schema.BLACK, -0.5)
    assert not counter.observe(schema.BLACK, -0.9)
    assert not counter.observe(schema.BLACK, -0.9)
    assert counter.observe(schema.BLACK, -0.9)
    assert not ResignationCounter(MovePolicy()).observe(schema.BLACK, -1.0)      # no threshold: never


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="resign_consecutive"):
        MovePolicy(resign_threshold=-0.9, resign_consecutive=0)
    with pytest.raises(ValueError, match="sampled_moves"):
        MovePolicy(sampled_moves=-1)


def black_is_lost(planes):
    black_to_move = planes[:, 0, 0, 16] > 0.5
    return (np.zeros((len(planes), planes.shape[1] ** 2 + 1), np.float32),
            np.where(black_to_move, -1.0, 1.0).astype(np.float32))


def test_a_player_resigns_only_after_the_consecutive_low_moves():
    player = MctsPlayer(black_is_lost, MctsConfig(budget=SearchBudget(8),
                                                  moves=MovePolicy(resign_threshold=-0.9, resign_consecutive=2)))
    player.start_game(9, 7.5)
    board = Board(9, 7.5)
    first = player.select_move(board)
    assert first != RESIGN
    board.play(first)
    board.play(player.select_move(board))           # White's move: not lost
    assert player.select_move(board) == RESIGN       # Black's second low search
