"""engine.playouts and generation 0's evaluator (inference.loading.PlayoutEvaluator): its values must be
those of real playouts, seen from the side to move, reproducible, and a non-position must not crash a
worker's batch; generation 0 searches with random playouts unless told otherwise.  Also the judge of
dead stones and seki (`stone_statuses`) and the board's chain listing it reports by."""

import numpy as np
import pytest

from engine.board import Board, board_from_ascii
from engine.playouts import STATUS_ALIVE, STATUS_DEAD, STATUS_SEKI, playout_values, stone_statuses
from inference.evaluator import UniformEvaluator
from inference.loading import PlayoutEvaluator
from selfplay.config import WorkerConfig
from selfplay.worker import generation0_evaluator
from tests.engine.test_board import SEKI_9

# Black owns the left five columns with two eyes, White the right three: the
# game is decided whatever random moves follow (Black 45 - White 27 - 7.5).
DECIDED = """
    XXXX.XOOO
    X.XXXXO.O
    XXXXXXOOO
    XXXXXXO.O
    XXXXXXOOO
    XXXXXXOOO
    XXXXXXO.O
    XXX.XXOOO
    XXXXXXOOO
"""


def planes_of(*boards):
    return np.stack([board.features() for board in boards]).astype(np.float32)


def test_playout_values_score_a_decided_position_for_the_side_to_move():
    black_to_move = board_from_ascii(DECIDED, to_play=1)
    white_to_move = board_from_ascii(DECIDED, to_play=-1)
    values = playout_values(planes_of(black_to_move, white_to_move), 7.5, 4, 1)
    assert values.dtype == np.float32 and values.tolist() == [1.0, -1.0]
    # Komi large enough to turn the result turns the values.
    assert playout_values(planes_of(black_to_move), 40.5, 4, 1).tolist() == [-1.0]


@pytest.mark.parametrize("size", [9, 19])
def test_playout_values_match_python_playouts_on_average_and_are_reproducible(size):
    board = Board(size)
    board.play(size * size // 2)       # White to move after Black's centre stone
    planes = planes_of(*[board] * 64)
    values = playout_values(planes, 7.5, 32, 5)
    assert np.array_equal(values, playout_values(planes, 7.5, 32, 5))
    assert not np.array_equal(values, playout_values(planes, 7.5, 32, 6))
    assert np.all(np.abs(values) <= 1)
    # The same playouts run from Python: the means agree within sampling error
    # (64 x 32 playouts each; the standard error of a difference is ~0.03).
    reference = []
    for seed in range(2048):
        leaf = Board(size)
        leaf.set_position(board.stones(), board.to_play)
        leaf.random_playout(seed)
        reference.append(np.sign(leaf.area_score()) * board.to_play)
    assert abs(values.mean() - np.mean(reference)) < 0.12


def test_playout_values_give_zero_to_a_row_that_is_not_a_position_and_refuse_bad_shapes():
    good = Board(9).features()
    broken = good.copy()
    broken[0, 0, 0] = broken[0, 1, 8] = broken[1, 0, 8] = 1.0   # a stone with no liberty
    values = playout_values(np.stack([broken, good]), 7.5, 2, 1)
    assert values[0] == 0.0
    with pytest.raises(ValueError, match=r"\[B, N, N, 17\]"):
        playout_values(np.zeros((2, 9, 9, 16), np.float32), 7.5, 1, 1)
    with pytest.raises(ValueError, match="playouts"):
        playout_values(np.stack([good]), 7.5, 0, 1)
    assert playout_values(np.zeros((0, 9, 9, 17), np.float32), 7.5, 1, 1).shape == (0,)


def test_generation_0_plays_with_random_playouts_unless_told_otherwise(tmp_path):
    config = WorkerConfig(root=str(tmp_path / "lake"), board_size=9, seed=3)
    evaluator = generation0_evaluator(config)
    assert isinstance(evaluator, PlayoutEvaluator) and evaluator.playouts == 1 and evaluator.generation == 0
    assert isinstance(generation0_evaluator(WorkerConfig(root=str(tmp_path / "lake"), board_size=9,
                                                         generation0_playouts=0)), UniformEvaluator)
    with pytest.raises(ValueError, match="--generation0-playouts"):
        WorkerConfig(root=str(tmp_path / "lake"), generation0_playouts=-1)
    # Its output has the evaluator shape: logits [B, N*N + 1] (uniform priors) and values [B].
    logits, values = evaluator(planes_of(Board(9), Board(9)))
    assert logits.shape == (2, 82) and not logits.any() and values.shape == (2,)




# --------------------------------------------------------------------------
# stone_statuses: seki by the rules, death by playouts (GTP's final_status_list)
# --------------------------------------------------------------------------

INVADED_9 = """
    ...X.O...
    ...X.O...
    .O.X.O...
    ...X.O...
    ...X.O.X.
    ...X.O...
    ...X.O...
    ...X.O...
    ...X.O...
"""
"""Two living walls, a lone White stone (B7) in Black's area and a lone Black one (H5) in White's:
dead, by GNU Go's judgement and the engine's."""


def flat(text: str, size: int = 9) -> int:
    """A GTP vertex ('B7') as a flat point."""
    return (size - int(text[1:])) * size + "ABCDEFGHJKLMNOPQRST".index(text[0])


def test_chains_lists_each_chain_once_in_order_of_its_lowest_point():
    board = board_from_ascii("""
        XX.O.
        .X.OO
        X..O.
        .....
        ..XX.
    """)
    assert board.chains() == [[0, 1, 6], [3, 8, 9, 13], [10], [22, 23]]
    assert Board(5).chains() == []
    full = board_from_ascii(SEKI_9)
    points = sorted(p for chain in full.chains() for p in chain)
    assert points == list(np.flatnonzero(full.stones().reshape(-1)))   # every stone in exactly one chain


def test_stone_statuses_judge_seki_by_the_rules_and_death_by_playouts():
    # Dame between two living walls: neutral points, but no seki (filling one keeps liberties).
    walls = board_from_ascii("""
        .X.O.
        .X.O.
        .X.O.
        .X.O.
        .X.O.
    """)
    assert set(stone_statuses(walls)[walls.stones().reshape(-1) != 0]) == {STATUS_ALIVE}
    assert not stone_statuses(Board(9)).any()
    seki = board_from_ascii(SEKI_9)
    before = seki.stones().copy()
    status = stone_statuses(seki)
    assert (seki.stones() == before).all() and seki.move_number == 0       # the board is left alone
    in_seki = set(np.flatnonzero(status == STATUS_SEKI))
    # Black's A9-A7 and White's six stones share B9 and B8 as their only liberties.
    assert in_seki == {flat(v) for v in "A9 A8 A7 C9 C8 B7 C7 A6 B6".split()}
    assert ((status == STATUS_ALIVE) | (status == STATUS_SEKI)).sum() == (before != 0).sum()
    # A lone White stone inside Black's living area and a Black stone inside White's are dead,
    # whoever is to move; the walls, with room for two eyes each, live.
    for to_play in (1, -1):
        board = board_from_ascii(INVADED_9, to_play=to_play)
        status = stone_statuses(board)
        assert set(np.flatnonzero(status == STATUS_DEAD)) == {flat("B7"), flat("H5")}, to_play
        # The rules still count every stone: the Tromp-Taylor area is not the referee's.
        assert board.ownership()[flat("B7")] == -1
    # The verdict does not hang on the seed.
    assert all((stone_statuses(board_from_ascii(INVADED_9), seed=seed) == status).all() for seed in range(1, 4))
    with pytest.raises(ValueError, match="num_playouts"):
        stone_statuses(walls, 0)
