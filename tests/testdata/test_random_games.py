"""Tests of testdata.random_games: the legal random games tests and benchmarks build lakes from.

Each game is checked against an independent replay on a fresh engine board:
the recorded planes must be the board before every move, the recorded result
and ownership the final board's, and the policy targets what the docstrings
promise.  Symmetric copies must replay as legally as the original.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from format import codec
from format import schema
from format.symmetry import NUM_SYMMETRIES, symmetry_permutations
from engine.board import Board
from testdata.random_games import engine_game, resigned_copy, symmetric_copy


def _enclosed_by_own(stones: np.ndarray, point: int, colour: int) -> bool:
    """Reference rule, point by point: every neighbour is ``colour`` or off the board."""
    n = stones.shape[0]
    r, c = divmod(point, n)
    return all(stones[rr, cc] == colour for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1))
               if 0 <= rr < n and 0 <= cc < n)


def _replay_checking_planes(game) -> Board:
    """Replay ``game`` on a fresh board, checking each position's planes; returns the final board."""
    n = game.board_size
    board = Board(n, game.komi)
    for i, move in enumerate(game.moves.tolist()):
        stones = board.stones()
        assert np.array_equal(game.planes[i, 0], stones == schema.BLACK), i
        assert np.array_equal(game.planes[i, 1], stones == schema.WHITE), i
        board.play(move)  # raises IllegalMove on an illegal move
    return board


@pytest.fixture(scope="module")
def searched_game():
    return engine_game(np.random.default_rng(5), 9, visits=50, full_search_fraction=0.5)


def test_a_searched_engine_game_replays_and_records_its_final_board(searched_game):
    game = searched_game
    final = _replay_checking_planes(game)
    assert final.is_over and game.end_reason == schema.END_TWO_PASSES
    assert game.moves[-1] == game.moves[-2] == 81
    assert game.score == pytest.approx(final.area_score())
    assert game.winner == (schema.BLACK if game.score > 0 else schema.WHITE)
    assert np.array_equal(game.ownership, final.ownership())
    assert game.ownership_source == schema.OWNERSHIP_FINAL_BOARD
    # Survives the codec (its writer validates every field).
    decoded = codec.decode_game(codec.encode_game(game))
    assert np.array_equal(decoded.moves, game.moves) and decoded.score == pytest.approx(game.score)


def test_moves_never_fill_own_eyes_and_pass_only_when_nothing_else_is_left(searched_game):
    game = searched_game
    n = game.board_size
    board = Board(n, game.komi)
    for move in game.moves.tolist():
        stones = board.stones()
        legal = np.flatnonzero(board.legal_mask()[: n * n])
        playable = [p for p in legal.tolist() if not _enclosed_by_own(stones, p, board.to_play)]
        if move == n * n:
            assert playable == []
        else:
            assert move in playable
        board.play(move)


def test_only_fully_searched_positions_have_a_search_shaped_policy(searched_game):
    game = searched_game
    n = game.board_size
    assert 0 < game.full_search.sum() < game.num_positions  # fraction 0.5: both kinds occur
    board = Board(n, game.komi)
    for i, move in enumerate(game.moves.tolist()):
        indices, values = game.policy_indices[i], game.policy_values[i]
        if game.full_search[i]:
            assert np.all(np.diff(indices) > 0) and np.all(values > 0)
            assert values.sum() == 50 + 1  # the search's visits plus one on the played move
            assert move in indices.tolist()
            assert board.legal_mask()[indices].all()
        else:
            assert len(indices) == 0 and len(values) == 0
        board.play(move)
    assert np.all(np.abs(game.root_values) <= 1)


@pytest.mark.parametrize("visits", [0, 30])
def test_symmetric_copies_replay_legally_with_transformed_ownership(visits):
    game = engine_game(np.random.default_rng(7), 9, visits=visits, full_search_fraction=0.5)
    n, points = game.board_size, game.board_size ** 2
    for k in range(NUM_SYMMETRIES):
        where = symmetry_permutations(n)[k]
        copy = symmetric_copy(game, k, f"copy{k}")
        assert copy.game_id == f"copy{k}"
        final = _replay_checking_planes(copy)
        assert final.is_over and final.area_score() == pytest.approx(game.score)
        expected_ownership = np.zeros(points, np.int8)
        expected_ownership[where[:points]] = game.ownership
        assert np.array_equal(copy.ownership, expected_ownership)
        assert np.array_equal(final.ownership(), expected_ownership)
        assert np.all((copy.moves == points) == (game.moves == points))  # pass stays pass
        for i in range(game.num_positions):
            original = dict(zip(game.policy_indices[i].tolist(), game.policy_values[i].tolist()))
            moved = dict(zip(copy.policy_indices[i].tolist(), copy.policy_values[i].tolist()))
            assert moved == {int(where[a]): v for a, v in original.items()}
            assert np.all(np.diff(copy.policy_indices[i]) > 0)
        if k:
            assert not np.array_equal(copy.moves, game.moves)


def test_a_resigned_copy_is_the_games_start_with_its_winner():
    game = engine_game(np.random.default_rng(9), 9, visits=20, full_search_fraction=0.25)
    cut = resigned_copy(game, 0.6)
    assert cut.num_positions == int(game.num_positions * 0.6)
    assert cut.end_reason == schema.END_RESIGN and cut.winner == game.winner
    assert math.isnan(cut.score) and cut.ownership is None and cut.ownership_source == schema.OWNERSHIP_NONE
    assert np.array_equal(cut.moves, game.moves[: cut.num_positions])
    assert np.array_equal(cut.planes, game.planes[: cut.num_positions])
    decoded = codec.decode_game(codec.encode_game(cut))
    assert decoded.end_reason == schema.END_RESIGN and decoded.winner == game.winner
