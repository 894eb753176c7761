"""Rules of the Cython engine on hand-drawn ASCII positions.

'X' is Black, 'O' White, '.' empty; row 0 is the top line, so the flat point
of (row, col) is row * N + col.  Each position is set with board_from_ascii
(which makes it the first position of the game line) and driven with the
Python API.
"""
import numpy as np
import pytest

from engine.board import (
    EMPTY_BOARD_HASH,
    IllegalMove,
    Board,
    board_from_ascii,
)
from engine.playouts import playout_ownership

BLACK, WHITE = 1, -1


def pt(row, col, size):
    return row * size + col


def snapshot(board):
    return (board.to_ascii(), board.hash, board.move_number, board.to_play,
            board.consecutive_passes, board.is_over, board.legal_mask().tobytes(),
            board.features().tobytes())


# --- captures ---------------------------------------------------------------

def test_single_stone_capture_and_liberties():
    board = board_from_ascii("""
        .......
        ...X...
        ..XO...
        ...X...
        .......
        .......
        .......
    """)
    n = 7
    assert board.liberties(pt(2, 3, n)) == 1
    assert board.in_atari_at(pt(2, 3, n))
    assert board.liberties(pt(1, 3, n)) == 3
    board.play(pt(2, 4, n))
    assert board.to_ascii().splitlines()[2] == "..X.X.."
    assert board.liberties(pt(2, 3, n)) == 0
    assert board.liberties(pt(2, 4, n)) == 4
    assert board.to_play == WHITE


def test_edge_chain_capture():
    board = board_from_ascii("""
        OOO.X..
        XXXX...
        .......
        .......
        .......
        .......
        .......
    """)
    n = 7
    assert board.liberties(pt(0, 0, n)) == 1
    board.play(pt(0, 3, n))
    assert board.to_ascii().splitlines()[0] == "...XX.."
    # The merged chain: row 1 cols 0-3, (0,3), (0,4): 9 liberties.
    assert board.liberties(pt(0, 3, n)) == 9
    assert board.area_score() == 49 - 7.5  # every empty point now reaches only Black


def test_one_move_captures_two_chains():
    board = board_from_ascii("""
        .XO.OX.
        ..XOX..
        ...X...
        .......
        .......
        .......
        .......
    """)
    n = 7
    # White (0,2) has liberty (0,3) only; white (1,3) has (0,3) only; (0,4) too.
    for p in [(0, 2), (1, 3), (0, 4)]:
        assert board.liberties(pt(*p, n)) == 1
    board.play(pt(0, 3, n))
    assert board.to_ascii().splitlines()[:2] == [".X.X.X.", "..X.X.."]
    assert board.liberties(pt(0, 3, n)) == 3


def test_set_position_rejects_chain_without_liberty():
    with pytest.raises(ValueError, match="no liberty"):
        board_from_ascii("""
            XO...
            O....
            .....
            .....
            .....
        """)


# --- suicide ------------------------------------------------------------------

def test_single_point_and_multi_stone_suicide_are_illegal():
    board = board_from_ascii("""
        .X.....
        X......
        .......
        .......
        ....XXX
        ....XOO
        ....XO.
    """, to_play=WHITE)
    n = 7
    before = snapshot(board)
    with pytest.raises(IllegalMove) as err:
        board.play(pt(0, 0, n))
    assert err.value.reason == "suicide"
    assert snapshot(board) == before
    # (6,6) would leave the white chain of four with no liberty.
    assert board.illegal_reason(pt(6, 6, n)) == "suicide"
    assert not board.legal_mask()[pt(6, 6, n)]
    # For Black the same point captures the chain, so it is legal.
    board.play(board.size * board.size)  # White passes
    board.play(pt(6, 6, n))
    assert board.to_ascii().splitlines()[5:] == ["....X..", "....X.X"]


def test_suicide_that_captures_is_legal():
    board = board_from_ascii("""
        .XO....
        XO.....
        O......
        .......
        .......
        .......
        .......
    """, to_play=WHITE)
    n = 7
    # White at (0,0) has no empty neighbour but captures Black (0,1)+(1,0)? No:
    # those are separate stones, each with its last liberty at (0,0).
    assert board.is_legal(pt(0, 0, n))
    board.play(pt(0, 0, n))
    assert board.to_ascii().splitlines()[:2] == ["O.O....", ".O....."]


# --- ko and superko -------------------------------------------------------------

KO = """
    .XO......
    XO.O.....
    .XO......
    .........
    .........
    .........
    .XO......
    XO.O.....
    .XO......
"""


def test_simple_ko_recapture_is_illegal_until_a_move_elsewhere():
    board = board_from_ascii(KO)
    n = 9
    board.play(pt(1, 2, n))  # Black takes the ko
    assert board.to_ascii().splitlines()[1] == "X.XO....."
    before = snapshot(board)
    with pytest.raises(IllegalMove, match="superko") as err:
        board.play(pt(1, 1, n))
    assert err.value.reason == "superko"
    assert snapshot(board) == before
    assert not board.legal_mask()[pt(1, 1, n)]
    board.play(pt(4, 8, n))  # White plays elsewhere (a ko threat)
    board.play(pt(4, 0, n))  # Black answers
    board.play(pt(1, 1, n))  # now White may retake
    assert board.to_ascii().splitlines()[1] == "XO.O....."


@pytest.mark.parametrize("on_copy", [False, True], ids=["game-board", "copy"])
def test_positional_superko_beyond_simple_ko(on_copy):
    """Two kos and passes bring back the first position five moves later,
    which simple ko allows and positional superko forbids."""
    n = 9
    board = board_from_ascii(KO)
    if on_copy:  # the copy keeps these positions in its private suffix
        board = board.copy()
    start = board.hash
    passed = n * n
    board.play(pt(1, 2, n))   # B takes ko 1
    board.play(passed)        # W
    board.play(pt(7, 2, n))   # B takes ko 2
    board.play(pt(1, 1, n))   # W retakes ko 1: a new position, legal
    board.play(passed)        # B
    assert board.illegal_reason(pt(7, 1, n)) == "superko"   # would recreate the start
    with pytest.raises(IllegalMove, match="superko"):
        board.play(pt(7, 1, n))
    assert board.hash != start
    assert board.to_play == WHITE


def test_copy_ignores_positions_the_original_reached_later():
    n = 9
    root = board_from_ascii(KO)
    fork = root.copy()
    for move in (pt(1, 2, n), pt(4, 4, n), pt(4, 5, n)):
        root.play(move)
    for move in (pt(1, 2, n), pt(4, 4, n)):
        fork.play(move)
    # The root's line contains the position after 4,5, but the fork's doesn't.
    assert fork.is_legal(pt(4, 5, n))
    fork.play(pt(4, 5, n))
    assert fork.hash == root.hash
    # Both lines now forbid retaking ko 1 into their own earlier positions.
    assert fork.illegal_reason(pt(4, 5, n)) == "occupied"


# --- passes, end of game, illegal input ---------------------------------------

def test_two_passes_end_the_game_and_every_move_is_then_refused():
    board = Board(9)
    board.play(40)
    board.play(81)
    assert not board.is_over and board.consecutive_passes == 1
    board.play(81)
    assert board.is_over and board.consecutive_passes == 2
    assert board.legal_mask().sum() == 0
    before = snapshot(board)
    with pytest.raises(IllegalMove, match="game over"):
        board.play(81)
    assert snapshot(board) == before


def test_move_cap_ends_the_game():
    board = Board(9, max_moves=4)
    for move in (0, 1, 2, 3):
        board.play(move)
    assert board.is_over and board.consecutive_passes == 0
    assert Board(9).max_moves == 3 * 81 and Board(19).max_moves == 3 * 361


@pytest.mark.parametrize("move", [-1, 82, 10**9])
def test_off_board_moves_raise_and_change_nothing(move):
    board = Board(9)
    board.play(40)
    before = snapshot(board)
    with pytest.raises(IllegalMove, match="off-board"):
        board.play(move)
    assert not board.is_legal(move)
    assert snapshot(board) == before


def test_occupied_and_bad_types():
    board = Board(9)
    board.play(40)
    with pytest.raises(IllegalMove, match="occupied"):
        board.play(40)
    with pytest.raises(TypeError):
        board.play("E5")
    with pytest.raises(ValueError, match="board size"):
        Board(4)
    with pytest.raises(ValueError, match="board size"):
        Board(20)


# --- scoring and ownership ------------------------------------------------------

def test_empty_board_scores_minus_komi_and_owns_nothing():
    for size in (9, 13, 19):
        board = Board(size, komi=6.5)
        assert board.area_score() == -6.5
        assert not board.ownership().any()
        assert board.hash == EMPTY_BOARD_HASH


def test_area_score_with_territory_dame_and_komi():
    board = board_from_ascii("""
        ..XO.
        ..XO.
        ..X.O
        .XXO.
        .X.O.
    """, komi=0.5)
    own = board.ownership().reshape(5, 5)
    expected = np.array([
        [1, 1, 1, -1, -1],
        [1, 1, 1, -1, -1],
        [1, 1, 1, 0, -1],   # (2,3) touches X at (2,2) and O at (3,3): dame
        [1, 1, 1, -1, -1],
        [1, 1, 0, -1, -1],  # (4,2) touches X and O: dame
    ])
    np.testing.assert_array_equal(own, expected)
    # Black: 6 stones + 8 points; White: 5 stones + 4 points; 2 dame.
    assert board.area_score() == (14 - 9) - 0.5


def test_regions_touching_both_colours_are_neutral():
    """Tromp-Taylor gives a shared empty region (dame, or the shared liberties
    of a seki) to nobody, however large; a region reaching one colour only is
    that colour's, eye or not."""
    board = board_from_ascii("""
        .O.X...
        OOXX...
        XXX....
        .......
        .......
        .......
        .......
    """)
    n = 7
    own = board.ownership().reshape(n, n)
    assert own[0, 2] == 0      # touches White (0,1) and Black (0,3), (1,2)
    assert own[0, 0] == -1     # reaches White only
    assert (own[3:, :] == 1).all()
    board2 = board_from_ascii("""
        X.O..
        X.O..
        X.O..
        X.O..
        X.O..
    """)
    own2 = board2.ownership().reshape(5, 5)
    assert (own2[:, 1] == 0).all() and (own2[:, 0] == 1).all() and (own2[:, 3:] == -1).all()
    assert board2.area_score() == 5 - 15 - 7.5


# Seki, one eye each plus a shared liberty at (0,2): Black's corner chain
# has the eye (0,0), White's chain along the top the eye (0,4); both outer
# groups have two eyes.  Whoever fills (0,2) puts itself in atari.
SEKI = """
    .X.O.OO
    XXOOOOO
    OOXXXXX
    .OX.X.X
    OOXXXXX
    .OX....
    OOX....
"""
SEKI_SHARED = [(0, 2)]


def test_seki_shared_liberties_are_neutral():
    """The shared liberty of a seki is neutral; each side's eye is its own
    (Tromp-Taylor counts the eyes, and the stones, of both seki groups)."""
    board = board_from_ascii(SEKI)
    own = board.ownership().reshape(7, 7)
    for shared in SEKI_SHARED:
        assert own[shared] == 0
        for to_play in (1, -1):
            trial = board_from_ascii(SEKI, to_play=to_play)
            trial.play(pt(*shared, 7))
            assert trial.in_atari_at(pt(*shared, 7)), f"{shared} is not self-atari for {to_play}"
    assert own[0, 0] == 1 and own[0, 4] == -1
    # Each side's eye is suicide for the other.
    assert board.illegal_reason(pt(0, 4, 7)) == "suicide"
    assert board_from_ascii(SEKI, to_play=-1).illegal_reason(pt(0, 0, 7)) == "suicide"


# --- the score as it stands and the pass rule ------------------------------------

# A 9x9 seki in the top-left corner: Black's chain A9-A7 and White's chain
# C9-C8-B7-C7-A6-B6 share the liberties B9 and B8 and have no other.  Whoever
# fills one puts its own chain in atari and the other side captures.  As the
# board stands Black wins by 5.5 (46 points to White's 33, the shared
# liberties are nobody's, komi 7.5); after Black fills B9 and White captures
# three stones at B8, White wins by 2.5.  Every other empty point is a
# single-point eye of its owner.
SEKI_9 = """
    X.OX.XO.O
    X.OXXXOOO
    XOOX.XO.O
    OOXXXXOOO
    XXX.XXO.O
    X.XXXXOOO
    XXX.XXO.O
    X.XXXXOOO
    XXX.XXO.O
"""
SEKI_9_SHARED = (pt(0, 1, 9), pt(1, 1, 9))

# 19x19: Black walls off columns A-J, White K-T, and one Black stone sits
# alone in White's area at P10.  Nothing is ever judged dead: as the board
# stands that stone is Black's and makes White's whole area neutral.
INVADED_19 = """
    ........XO.........
    ........XO.........
    ........XO.........
    ........XO.........
    ........XO.........
    ........XO.........
    ........XO.........
    ........XO.........
    ........XO.........
    ........XO....X....
    ........XO.........
    ........XO.........
    ........XO.........
    ........XO.........
    ........XO.........
    ........XO.........
    ........XO.........
    ........XO.........
    ........XO.........
"""


def test_mover_score_is_the_tromp_taylor_score_as_it_stands_for_the_side_to_move():
    for to_play in (BLACK, WHITE):
        seki = board_from_ascii(SEKI_9, to_play=to_play, komi=7.5)
        assert seki.area_score() == 46 - 33 - 7.5
        assert seki.mover_score() == to_play * 5.5
        assert all(seki.ownership()[p] == 0 for p in SEKI_9_SHARED)
    # Filling a shared liberty loses the game: White captures and wins.
    filled = board_from_ascii(SEKI_9, to_play=BLACK, komi=7.5)
    filled.play(SEKI_9_SHARED[0])
    assert filled.in_atari_at(SEKI_9_SHARED[0])
    filled.play(SEKI_9_SHARED[1])
    assert filled.stones()[0:3, 0].tolist() == [0, 0, 0]
    assert filled.mover_score() == -2.5 and filled.to_play == BLACK
    # 19x19: the lone stone counts for Black, and White's area is neutral.
    invaded = board_from_ascii(INVADED_19, to_play=WHITE, komi=7.5)
    assert invaded.area_score() == (9 * 19 + 1) - 19 - 7.5
    assert invaded.mover_score() == -invaded.area_score()
    assert invaded.ownership().reshape(19, 19)[0, 18] == 0


def test_candidates_add_pass_exactly_when_the_board_as_it_stands_wins_for_the_mover():
    # The seki: Black, ahead, may pass and leave it alone; the sensible rule
    # alone offers only the two shared liberties, each a losing self-atari.
    black = board_from_ascii(SEKI_9, to_play=BLACK, komi=7.5)
    sensible = black.candidate_mask(sensible=True)
    np.testing.assert_array_equal(sensible, black.sensible_mask())
    assert np.flatnonzero(sensible).tolist() == list(SEKI_9_SHARED)
    assert np.flatnonzero(black.candidate_mask(pass_when_winning=True)).tolist() == [*SEKI_9_SHARED, 81]
    # White, behind, gets no PASS; nor does Black once komi makes it lose.
    white = board_from_ascii(SEKI_9, to_play=WHITE, komi=7.5)
    assert np.flatnonzero(white.candidate_mask(pass_when_winning=True)).tolist() == list(SEKI_9_SHARED)
    losing = board_from_ascii(SEKI_9, to_play=BLACK, komi=13.5)
    assert losing.mover_score() == -0.5
    assert losing.candidate_mask(pass_when_winning=True)[81] == 0
    # Without the sensible rule every legal move is a candidate, PASS included.
    np.testing.assert_array_equal(white.candidate_mask(sensible=False, pass_when_winning=True),
                                  white.legal_mask())
    # 19x19: White, behind as the board stands, must capture the stone
    # before it may pass; Black may pass all along.
    board = board_from_ascii(INVADED_19, to_play=WHITE, komi=7.5)
    for move in (pt(8, 14, 19), pt(10, 14, 19), pt(9, 13, 19)):
        assert board.candidate_mask(pass_when_winning=True)[361] == 0     # White, behind
        board.play(move)
        assert board.candidate_mask(pass_when_winning=True)[361] == 1     # Black, ahead
        board.play(361)
    board.play(pt(9, 15, 19))                                             # White captures
    assert board.stones()[9, 14] == 0 and board.mover_score() == 171 - 190 - 7.5
    assert board.candidate_mask(pass_when_winning=True)[361] == 0         # now Black is behind
    board.play(361)
    assert board.candidate_mask(pass_when_winning=True)[361] == 1         # and White may end it
    board.play(361)
    assert board.is_over and not board.candidate_mask(pass_when_winning=True).any()


@pytest.mark.parametrize("size", [9, 19])
def test_the_pass_rule_changes_nothing_but_pass_along_random_games(size):
    rng = np.random.default_rng(size)
    added = 0
    for game in range(2):
        board = Board(size, komi=7.5)
        while not board.is_over:
            sensible = board.sensible_mask()
            candidates = board.candidate_mask(pass_when_winning=True)
            np.testing.assert_array_equal(candidates[:-1], sensible[:-1])
            assert candidates[-1] == (sensible[-1] or board.mover_score() > 0)
            added += int(candidates[-1] and not sensible[-1])
            board.play(board.playout_policy_move(int(rng.integers(2 ** 63))))
    assert added > 10      # the rule did add PASS along the way


@pytest.mark.parametrize("size", [9, 13, 19])
def test_random_games_finish_and_score_consistently(size):
    board = Board(size)
    moves = board.random_playout(seed=size)
    assert board.is_over and board.consecutive_passes == 2 and moves == board.move_number
    own = board.ownership()
    assert own.shape == (size * size,) and own.dtype == np.int8
    assert board.area_score() == own.sum() - board.komi
    stones = board.stones().reshape(-1)
    assert (own[stones != 0] == stones[stones != 0]).all()
    # No empty point left is a legal non-eye move for either side: every empty
    # point is a single-point region owned by one colour.
    assert (own[stones == 0] != 0).all()


def test_playout_ownership_leaves_board_unchanged_and_is_deterministic():
    board = board_from_ascii("""
        .........
        .........
        ..XXX....
        ..X.X....
        ..XXX....
        .........
        ......OO.
        ......O.O
        .......O.
    """)
    before = snapshot(board)
    own = playout_ownership(board, 200, seed=7)
    assert snapshot(board) == before
    assert own.dtype == np.float32 and own.shape == (81,)
    assert np.array_equal(own, playout_ownership(board, 200, seed=7))
    assert not np.array_equal(own, playout_ownership(board, 200, seed=8))
    assert np.all(np.abs(own) <= 1)
    # The Black group with an eye and the White one are mostly their owners'.
    assert own[pt(3, 3, 9)] > 0.5 and own[pt(7, 7, 9)] < -0.5
    with pytest.raises(ValueError):
        playout_ownership(board, 0, seed=1)


# --- playout policy (eye rule) ------------------------------------------------

def test_playout_policy_never_fills_own_eyes_and_passes_when_done():
    board = board_from_ascii("""
        .X.X.
        XXXXX
        XXXXX
        OOOOO
        O.O.O
    """)
    # Black's empty points are its eyes, White's are White's, and each side's
    # eyes are suicide for the other: both pass.
    for seed in range(20):
        assert board.playout_policy_move(seed) == 25
    board.play(25)
    for seed in range(20):
        assert board.playout_policy_move(seed) == 25


def test_playout_policy_fills_false_eyes_and_plays_legal_moves_only():
    board = board_from_ascii("""
        .XO..
        X.X..
        .XO..
        .....
        .....
    """)
    choices = {board.playout_policy_move(seed) for seed in range(300)}
    assert pt(0, 0, 5) not in choices   # corner eye: both neighbours Black, no White diagonal
    assert pt(1, 1, 5) in choices       # two White diagonals make it a false eye
    assert all(board.is_legal(move) for move in choices)


# --- features and legal mask ------------------------------------------------------

def test_features_follow_side_to_move_and_history():
    size = 9
    board = Board(size)
    planes = board.features()
    assert planes.shape == (size, size, 17) and planes.dtype == np.float32
    assert not planes[..., :16].any() and planes[..., 16].all()
    moves = [pt(0, 0, size), pt(8, 8, size), pt(0, 8, size)]
    for move in moves:
        board.play(move)
    planes = board.features()
    # White to move: channel 16 is 0; White's stones at t are channel 0.
    assert not planes[..., 16].any()
    assert planes[8, 8, 0] == 1 and planes[..., 0].sum() == 1
    assert planes[0, 0, 8] == 1 and planes[0, 8, 8] == 1 and planes[..., 8].sum() == 2
    # One move ago (t-1) Black had only (0,0); two ago (t-2) White had nothing.
    assert planes[..., 9].sum() == 1 and planes[0, 0, 9] == 1
    assert planes[..., 2].sum() == 0 and planes[..., 10].sum() == 1
    # Before the game started (t-3 and older): zeros.
    assert not planes[..., 3:8].any() and not planes[..., 11:16].any()


def test_features_keep_exactly_eight_positions_and_count_passes():
    size = 9
    board = Board(size)
    for col in range(9):
        board.play(pt(0, col, size) if board.to_play == BLACK else pt(8, col, size))
    planes = board.features()  # after 9 moves, White to move
    counts_me = [planes[..., k].sum() for k in range(8)]
    counts_opp = [planes[..., 8 + k].sum() for k in range(8)]
    # Black played columns 0,2,4,6,8 on moves 1,3,5,7,9; White 1,3,5,7.
    assert counts_me == [4, 4, 3, 3, 2, 2, 1, 1]
    assert counts_opp == [5, 4, 4, 3, 3, 2, 2, 1]
    board.play(81)  # a pass adds a history slot with the same stones
    planes = board.features()  # Black to move
    assert planes[..., 0].sum() == 5 and planes[..., 1].sum() == 5


def test_write_features_into_caller_buffer_and_shape_check():
    board = Board(13)
    board.play(0)
    out = np.full((13, 13, 17), 7.0, dtype=np.float32)
    board.write_features(out)
    np.testing.assert_array_equal(out, board.features())
    with pytest.raises(ValueError, match="shape"):
        board.write_features(np.zeros((9, 9, 17), dtype=np.float32))


def test_legal_mask_marks_occupied_suicide_ko_and_pass():
    board = board_from_ascii(KO)
    board.play(pt(1, 2, 9))  # Black takes ko 1; White to move
    mask = board.legal_mask()
    assert mask.shape == (82,) and mask.dtype == np.uint8
    assert mask[81] == 1
    assert mask[pt(1, 1, 9)] == 0          # ko recapture
    assert mask[pt(1, 2, 9)] == 0          # occupied
    assert mask[pt(0, 0, 9)] == 0          # suicide for White
    assert board.illegal_reason(pt(0, 0, 9)) == "suicide"
    assert mask[pt(7, 2, 9)] == 1          # White filling its own ko eye is legal
    for p in range(81):
        assert mask[p] == board.is_legal(p)


def test_sizes_9_13_19_play_and_copy():
    for size in (9, 13, 19):
        board = Board(size)
        board.play(pt(3, 3, size))
        copy = board.copy()
        copy.play(pt(size - 4, size - 4, size))
        assert board.move_number == 1 and copy.move_number == 2
        assert board.stones()[size - 4, size - 4] == 0 and copy.stones()[size - 4, size - 4] == WHITE
        assert copy.stones().shape == (size, size)
