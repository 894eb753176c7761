"""GTP coordinates and SGF game I/O: round trips and clear errors."""
import pytest
from sgfmill import sgf

from engine.board import Board
from format.coords import gtp_to_move, move_to_gtp
from format.sgf import game_from_sgf, game_to_sgf


@pytest.mark.parametrize("size, text, move", [
    (9, "A9", 0), (9, "J9", 8), (9, "A1", 72), (9, "J1", 80), (9, "E5", 40), (9, "pass", 81),
    (19, "A19", 0), (19, "T1", 360), (19, "K10", 9 * 19 + 9), (19, "PASS", 361),
    (13, "H8", 5 * 13 + 7), (13, "n1", 168),
])
def test_gtp_table(size, text, move):
    assert gtp_to_move(text, size) == move
    assert move_to_gtp(move, size) == (text.upper() if text.lower() != "pass" else "pass")


@pytest.mark.parametrize("size", [9, 13, 19])
def test_gtp_round_trip_every_action(size):
    for move in range(size * size + 1):
        assert gtp_to_move(move_to_gtp(move, size), size) == move
    assert "I" not in "".join(move_to_gtp(m, size) for m in range(size * size))


@pytest.mark.parametrize("text", ["I5", "Z1", "E", "5E", "", "E5x", "E0", "E-1", None])
def test_malformed_gtp_names_the_text(text):
    with pytest.raises(ValueError) as err:
        gtp_to_move(text, 9)
    assert repr(text) in str(err.value)


@pytest.mark.parametrize("text", ["K5", "A10", "T19"])
def test_gtp_off_board_for_this_size(text):
    with pytest.raises(ValueError, match=f"'{text}' is off a 9x9 board"):
        gtp_to_move(text, 9)


def test_move_to_gtp_rejects_out_of_range():
    with pytest.raises(ValueError, match="off a 9x9"):
        move_to_gtp(82, 9)
    with pytest.raises(ValueError, match="off a 9x9"):
        move_to_gtp(-1, 9)


@pytest.mark.parametrize("size", [9, 19])
def test_sgf_round_trip_of_a_real_game(size):
    board = Board(size)
    moves = []
    seed = 0
    while not board.is_over and len(moves) < 150:
        move = board.playout_policy_move(seed)
        board.play(move)
        moves.append(move)
        seed += 1
    data = game_to_sgf(size, 6.5, moves, result="B+R", comments={0: "first", len(moves) - 1: "last"})
    assert isinstance(data, bytes)
    assert game_from_sgf(data) == (size, 6.5, moves, "B+R")
    parsed = sgf.Sgf_game.from_bytes(data)
    nodes = parsed.get_main_sequence()
    assert nodes[1].get("C") == "first" and nodes[len(moves)].get("C") == "last"
    assert nodes[1].get_move() == ("b", None if moves[0] == size * size
                                   else (size - 1 - moves[0] // size, moves[0] % size))


def test_sgf_orientation_matches_gtp():
    # SGF 'cg' on 9x9 is column C, 7th row from the top = GTP C3.
    size, komi, moves, result = game_from_sgf(b"(;GM[1]FF[4]SZ[9]KM[7.5];B[cg];W[];B[ai])")
    assert (size, komi, result) == (9, 7.5, None)
    assert [move_to_gtp(m, 9) for m in moves] == ["C3", "pass", "A1"]


@pytest.mark.parametrize("data, message", [
    (b"(;GM[1]SZ[9];B[zz])", "malformed move coordinate 'zz'"),
    (b"(;GM[1]SZ[9];B[a])", "malformed move coordinate 'a'"),
    (b"(;GM[1]SZ[9];B[aa];B[bb])", "out of turn"),
    (b"(;GM[1]SZ[9]AB[aa];B[bb])", "setup stones"),
    (b"(;GM[1]SZ[25];B[aa])", "board size"),
    (b"no sgf here", "malformed SGF"),
    (b"(;GM[1]SZ[9]KM[seven])", "malformed SGF root"),
])
def test_malformed_sgf_raises_clear_errors(data, message):
    with pytest.raises(ValueError, match=message):
        game_from_sgf(data)


def test_game_to_sgf_rejects_bad_input():
    with pytest.raises(ValueError, match="not an action"):
        game_to_sgf(9, 7.5, [82])
    with pytest.raises(ValueError, match="board size"):
        game_to_sgf(4, 7.5, [])
