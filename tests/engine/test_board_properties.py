"""Property tests (hypothesis) of the engine's incremental state and of the
board symmetries.

Random games are drawn as sequences of raw integers, each taken modulo the
number of actions, so they include illegal tries (occupied points, suicides,
ko recaptures); an illegal try must raise and leave everything unchanged.
After every move the incremental state is compared with a recomputation from
scratch: the Zobrist hash, and for every chain its size, its pseudo-liberty
counters (count, sum and sum of squares of padded liberty indices), its true
liberty count by flood fill and its atari flag.
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from format.symmetry import (
    INVERSE,
    apply_symmetry_nhwc,
    apply_symmetry_to_planes,
    apply_symmetry_to_policy,
    inverse_permutations,
    symmetry_permutations,
)
from engine.board import EMPTY_BOARD_HASH, Board, IllegalMove, zobrist_key

SIZES = st.sampled_from([5, 9, 13, 19])
RAW_MOVES = st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=250)


def neighbours(p, n):
    r, c = divmod(p, n)
    for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        if 0 <= r + dr < n and 0 <= c + dc < n:
            yield (r + dr) * n + c + dc


def recomputed_hash(board):
    stones = board.stones().reshape(-1)
    h = EMPTY_BOARD_HASH
    for p in np.flatnonzero(stones):
        h ^= zobrist_key(board.size, int(p), int(stones[p]))
    return h


def check_chains(board):
    n = board.size
    stones = board.stones().reshape(-1)
    seen = set()
    for start in np.flatnonzero(stones):
        start = int(start)
        if start in seen:
            continue
        colour = stones[start]
        chain, frontier = {start}, [start]
        while frontier:
            p = frontier.pop()
            for q in neighbours(p, n):
                if stones[q] == colour and q not in chain:
                    chain.add(q)
                    frontier.append(q)
        seen |= chain
        pseudo = [board.padded_index(q) for p in chain for q in neighbours(p, n) if stones[q] == 0]
        true_libs = {q for p in chain for q in neighbours(p, n) if stones[q] == 0}
        expected = (len(chain), len(pseudo), sum(pseudo), sum(v * v for v in pseudo))
        for p in chain:
            assert board.chain_counters(p) == expected
            assert board.liberties(p) == len(true_libs) > 0
            assert board.in_atari_at(p) == (len(true_libs) == 1)


def state(board):
    return (board.stones().tobytes(), board.hash, board.move_number, board.to_play,
            board.consecutive_passes, board.is_over, board.legal_mask().tobytes(),
            board.features().tobytes(), board.area_score())


@settings(max_examples=40, deadline=None)
@given(size=SIZES, raw=RAW_MOVES)
def test_incremental_state_matches_recomputation_and_illegal_moves_change_nothing(size, raw):
    board = Board(size)
    actions = size * size + 1
    for r in raw:
        move = r % actions
        mask = board.legal_mask()
        if board.is_legal(move):
            assert mask[move] == 1
            board.play(move)
        else:
            assert mask[move] == 0
            before = state(board)
            try:
                board.play(move)
            except IllegalMove as err:
                assert err.reason == board.illegal_reason(move)
            else:
                raise AssertionError(f"illegal move {move} was played")
            assert state(board) == before
        assert board.hash == recomputed_hash(board)
        check_chains(board)
        if board.is_over:
            break


@settings(max_examples=25, deadline=None)
@given(size=SIZES, raw=RAW_MOVES, seed=st.integers(0, 2**64 - 1))
def test_copies_are_independent_and_identical(size, raw, seed):
    board = Board(size)
    for r in raw:
        move = r % (size * size + 1)
        if board.is_legal(move):
            board.play(move)
        if board.is_over:
            return
    copy = board.copy()
    assert state(copy) == state(board)
    before = state(board)
    copy.random_playout(seed)
    assert state(board) == before
    assert copy.is_over and copy.hash == recomputed_hash(copy)
    check_chains(copy)


@settings(max_examples=20, deadline=None)
@given(size=st.sampled_from([5, 9, 19]), k=st.integers(0, 7), raw=RAW_MOVES)
def test_engine_commutes_with_symmetries(size, k, raw):
    """Playing the transformed game gives transformed stones, features,
    legal mask and ownership, and the same score."""
    perm = symmetry_permutations(size)[k]
    board, mirrored = Board(size), Board(size)
    for r in raw[:60]:
        move = r % (size * size + 1)
        if board.is_legal(move):
            assert mirrored.is_legal(int(perm[move]))
            board.play(move)
            mirrored.play(int(perm[move]))
        if board.is_over:
            break
    np.testing.assert_array_equal(apply_symmetry_to_planes(board.stones(), k), mirrored.stones())
    np.testing.assert_array_equal(apply_symmetry_nhwc(board.features(), k), mirrored.features())
    np.testing.assert_array_equal(apply_symmetry_to_policy(board.legal_mask(), k), mirrored.legal_mask())
    own = board.ownership().reshape(size, size)
    np.testing.assert_array_equal(apply_symmetry_to_planes(own, k).reshape(-1), mirrored.ownership())
    assert board.area_score() == mirrored.area_score()


@settings(max_examples=30, deadline=None)
@given(size=st.integers(5, 19), k=st.integers(0, 7), batch=st.integers(1, 3))
def test_symmetry_round_trips_and_tables_agree(size, k, batch):
    rng = np.random.default_rng(size * 8 + k)
    planes = rng.random((batch, 4, size, size)).astype(np.float32)
    nhwc = rng.random((batch, size, size, 17)).astype(np.float32)
    policy = rng.random((batch, size * size + 1)).astype(np.float32)
    inv = INVERSE[k]
    np.testing.assert_array_equal(apply_symmetry_to_planes(apply_symmetry_to_planes(planes, k), inv), planes)
    np.testing.assert_array_equal(apply_symmetry_nhwc(apply_symmetry_nhwc(nhwc, k), inv), nhwc)
    np.testing.assert_array_equal(apply_symmetry_to_policy(apply_symmetry_to_policy(policy, k), inv), policy)
    perm = symmetry_permutations(size)
    assert perm.shape == (8, size * size + 1) and perm.dtype == np.int32
    assert perm[k, -1] == size * size                     # pass is fixed
    assert sorted(perm[k].tolist()) == list(range(size * size + 1))
    np.testing.assert_array_equal(inverse_permutations(size)[k][perm[k]], np.arange(size * size + 1))
    # perm[k][p] is where point p goes: a one-hot plane at p lands at perm[k][p].
    p = int(rng.integers(size * size))
    onehot = np.zeros(size * size, dtype=np.int8)
    onehot[p] = 1
    moved = apply_symmetry_to_planes(onehot.reshape(size, size), k).reshape(-1)
    assert np.flatnonzero(moved).tolist() == [perm[k][p]]
    # NHWC and [..., N, N] layouts agree.
    np.testing.assert_array_equal(
        apply_symmetry_nhwc(nhwc, k), np.moveaxis(apply_symmetry_to_planes(np.moveaxis(nhwc, -1, 1), k), 1, -1))


def test_symmetries_are_the_eight_distinct_dihedral_maps():
    size = 7
    perm = symmetry_permutations(size)
    assert len({tuple(row) for row in perm}) == 8
    assert (perm[0] == np.arange(size * size + 1)).all()
    grid = np.arange(size * size).reshape(size, size)
    rotations = {tuple(apply_symmetry_to_planes(grid, k).reshape(-1)) for k in range(8)}
    expected = set()
    for flip in (False, True):
        g = grid.T if flip else grid
        for turns in range(4):
            expected.add(tuple(np.rot90(g, turns).reshape(-1)))
    assert rotations == expected
