"""format.sgf's full games: setup stones, moves of either colour, and the bounded file reader (the plain
games' view, game_from_sgf/game_to_sgf, is tests/format/test_coords_sgf.py's)."""
import numpy as np
import pytest
from sgfmill import sgf

from format.schema import BLACK, WHITE
from format.sgf import read_sgf, read_sgf_file, write_sgf


def test_a_game_with_setup_stones_and_either_colour_round_trips():
    setup = np.zeros(81, np.int8)
    setup[[20, 60]] = BLACK                                      # C7 and G3: a two-stone handicap
    moves = [(WHITE, 40), (BLACK, 39), (WHITE, 81), (WHITE, 41)]   # White twice: GTP allows it
    data = write_sgf(9, 0.5, moves, setup=setup, to_play=WHITE)
    game = read_sgf(data)
    assert (game.size, game.komi, game.to_play, game.moves, game.result) == (9, 0.5, WHITE, moves, None)
    assert (game.setup == setup).all()
    root = sgf.Sgf_game.from_bytes(data).get_root()
    assert root.get("HA") == 2 and root.get("PL") == "w"
    assert root.get_setup_stones()[0] == {(6, 2), (2, 6)}        # sgfmill counts rows from the bottom


def test_setup_stones_without_pl_and_files_without_km():
    handicap = read_sgf(b"(;GM[1]SZ[9]AB[cc][gg];W[ee])")
    assert handicap.to_play == WHITE and handicap.komi is None     # Black stones only: White moves first
    mixed = read_sgf(b"(;GM[1]SZ[9]AB[cc]AW[gg];B[ee])")
    assert mixed.to_play == BLACK and mixed.setup[20] == BLACK and mixed.setup[60] == WHITE
    plain = read_sgf(b"(;GM[1]SZ[9]KM[6.5];B[ee])")
    assert plain.setup is None and plain.komi == 6.5


@pytest.mark.parametrize("data, message", [
    (b"(;GM[1]SZ[9];B[ee];AB[aa])", "setup stones after the first move"),
    (b"(;GM[2]SZ[9];B[ee])", "not a game of Go"),
    (b"(;GM[1]SZ[9]AB[zz])", "malformed setup stones"),
    (b"(;GM[1]SZ[9]PL[x]AB[aa])", "malformed PL"),
])
def test_malformed_full_games_name_the_problem(data, message):
    with pytest.raises(ValueError, match=message):
        read_sgf(data)


def test_read_sgf_file_refuses_big_files_and_non_files(tmp_path):
    path = tmp_path / "game.sgf"
    path.write_bytes(b"(;GM[1]SZ[9];B[ee])")
    assert read_sgf_file(str(path)).moves == [(BLACK, 40)]
    with pytest.raises(ValueError, match="larger than 10 bytes"):
        read_sgf_file(str(path), limit=10)
    with pytest.raises(ValueError, match="not a regular file"):
        read_sgf_file("/dev/zero")                  # a device would never end
    with pytest.raises(OSError):
        read_sgf_file(str(tmp_path))                # a directory
