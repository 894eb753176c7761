"""format.sgf's full games: setup stones, moves of either colour, and the bounded file reader (the plain
games' view, game_from_sgf/game_to_sgf, is tests/format/test_coords_sgf.py's)."""
import os
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
from sgfmill import sgf

from format.schema import BLACK, WHITE
from format.sgf import read_sgf, read_sgf_file, write_sgf, write_sgf_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
    with pytest.raises(ValueError, match="not a regular file"):
        read_sgf_file(str(tmp_path))                # a directory


FIFO_PROBE = """
import os, sys
from format.sgf import read_sgf_file, write_sgf_file
for call in (lambda: read_sgf_file(sys.argv[1]), lambda: write_sgf_file(sys.argv[1], b"(;SZ[9])")):
    try:
        call()
    except ValueError as exc:
        print(exc)
"""


def test_a_fifo_is_refused_by_the_sgf_file_reader_and_writer_at_once(tmp_path):
    """open() of a FIFO waits for its other end for ever: GTP's loadsgf and printsgf hung on one."""
    fifo = tmp_path / "game.sgf"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-c", FIFO_PROBE, str(fifo)], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.splitlines() == ["not a regular file"] * 2, done.stderr[-2000:]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)        # left as it was


def test_write_sgf_file_writes_a_regular_file_and_refuses_a_device(tmp_path):
    path = tmp_path / "game.sgf"
    path.write_bytes(b"x" * 1000)                       # replaced whole
    write_sgf_file(str(path), write_sgf(9, 7.5, [(BLACK, 40)]))
    assert read_sgf_file(str(path)).moves == [(BLACK, 40)]
    with pytest.raises(ValueError, match="not a regular file"):
        write_sgf_file("/dev/null", b"(;SZ[9])")
    with pytest.raises(ValueError, match="not a regular file"):
        write_sgf_file(str(tmp_path), b"(;SZ[9])")


def test_writing_a_long_game_takes_time_linear_in_its_moves():
    """sgfmill's extend_main_sequence walks the line from the root for every move: 30,000 moves took
    minutes, a 1 MB game (250,000 passes, which loadsgf accepts) 45 minutes of GTP's printsgf."""
    moves = [(BLACK if i % 2 == 0 else WHITE, 81) for i in range(30_000)]
    started = time.monotonic()
    data = write_sgf(9, 7.5, moves)
    assert time.monotonic() - started < 15, "quadratic in the moves"
    assert read_sgf(data).moves == moves
