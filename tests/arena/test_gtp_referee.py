"""Tests of the GTP commands referees and servers send (arena/gtp_referee.py, arena/gtp_engine.py):
final_status_list, the three handicap commands, loadsgf/printsgf,
kgs-genmove_cleanup and reg_genmove.

Most are driven through the engine's stdin as a GUI would (tests/arena/test_gtp.py's
`Engine`); fixed_handicap's points are checked against GNU Go's answers to
the same commands, and the stone statuses against the board's ownership.
"""
import os
import subprocess
import sys

import pytest
from sgfmill import sgf

from format import schema
from format.coords import gtp_to_move
from engine.board import board_from_ascii
from format.sgf import MAX_SGF_BYTES
from arena.gtp import GtpConfig, build_engine
from arena.gtp_game import fixed_handicap_points
from arena.gtp_client import GnuGo
from tests.engine.test_board import SEKI_9
from tests.engine.test_playouts import INVADED_9
from tests.arena.test_gtp import REPO, Engine, require_gnugo, showboard_stones

NEW_COMMANDS = ["final_status_list", "fixed_handicap", "place_free_handicap", "set_free_handicap", "loadsgf",
                "printsgf", "kgs-genmove_cleanup", "reg_genmove"]

STREAMING_COMMANDS = {"lz-analyze", "kata-analyze"}
"""Live analysis (tests/arena/test_gtp_analysis.py): no reports without an interval."""

# The seki of SEKI_9 (tests/engine/test_board.py): Black's A9-A7 and White's six stones
# share B9 and B8 as their only liberties.
SEKI_CHAINS = {"A9 A8 A7", "C9 C8 B7 C7 A6 B6"}


def position_sgf(ascii_position: str, komi: float = 7.5, moves: str = "") -> bytes:
    """SGF of an ASCII position as AB/AW setup stones, then `moves` (SGF nodes)."""
    board = board_from_ascii(ascii_position)
    size = board.size
    stones = board.stones().reshape(-1)
    props = {schema.BLACK: "AB", schema.WHITE: "AW"}
    setup = "".join(
        props[colour] + "".join(f"[{'abcdefghijklmnopqrs'[p % size]}{'abcdefghijklmnopqrs'[p // size]}]"
                                for p in range(size * size) if stones[p] == colour)
        for colour in props)
    return f"(;GM[1]FF[4]SZ[{size}]KM[{komi}]{setup}{moves})".encode()


@pytest.fixture
def engine():
    e = Engine("--visits", "4")
    yield e
    e.close()


def test_list_commands_lists_exactly_what_is_answered(engine):
    listed = engine.ok("list_commands").split("\n")
    assert set(NEW_COMMANDS) <= set(listed) and len(set(listed)) == len(listed)
    for command in listed:
        assert engine.ok(f"known_command {command}") == "true"
        if command in STREAMING_COMMANDS:      # they reply until the next line: a bare newline stops them
            engine.send_raw(f"{command}\n\n".encode())
            assert engine.read_reply() == "=", command
        elif command != "quit":
            assert not engine.ask(command).startswith("? unknown command"), command


def test_handicap_commands_on_9x9_and_19x19(engine):
    engine.ok("boardsize 19")
    placed = engine.ok("fixed_handicap 9").split()
    assert placed == ["D16", "K16", "Q16", "D10", "K10", "Q10", "D4", "K4", "Q4"]
    board = engine.ok("showboard")
    assert showboard_stones(board, 19) == {v: "X" for v in placed}
    assert "White to play" in board                           # after a handicap White moves first
    assert engine.ask("fixed_handicap 2") == "? board not empty"
    assert engine.ask("undo") == "? cannot undo"              # handicap stones are not moves
    white = engine.ok("genmove w")
    assert showboard_stones(engine.ok("showboard"), 19)[white] == "O"

    engine.ok("boardsize 9")
    for bad in ("fixed_handicap 1", "fixed_handicap 10", "place_free_handicap 1", "place_free_handicap 81"):
        assert engine.ask(bad) == "? invalid number of stones", bad
    assert engine.ask("fixed_handicap two").startswith("? syntax error")
    assert engine.ok("place_free_handicap 4").split() == ["C7", "G7", "C3", "G3"]   # the fixed points first
    engine.ok("clear_board")
    for bad in ("A1", "A1 A1", "A1 pass", "A1 Z9", "A1 B2 C3 xx"):
        assert engine.ask(f"set_free_handicap {bad}") == "? bad vertex list", bad
    engine.ok("set_free_handicap A1 E5 J9")
    assert showboard_stones(engine.ok("showboard"), 9) == {"A1": "X", "E5": "X", "J9": "X"}
    assert engine.ask("set_free_handicap B2 C3") == "? board not empty"

    # 5x5 has no fixed points: the search chooses them (it may stop early by passing).
    engine.ok("boardsize 5")
    chosen = engine.ok("place_free_handicap 3").split()
    assert 1 <= len(chosen) <= 3 and len(set(chosen)) == len(chosen)
    assert showboard_stones(engine.ok("showboard"), 5) == {v: "X" for v in chosen}


def test_fixed_handicap_points_match_gnugo():
    require_gnugo()
    ours = build_engine(GtpConfig(visits=2, quiet=True))
    cases = [(size, count) for size in (7, 8, 9, 10, 11, 12, 13, 15, 19) for count in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)]
    with GnuGo(level=0) as gnugo:
        commands = [c for size, count in cases for c in (f"boardsize {size}", "clear_board", f"fixed_handicap {count}")]
        replies = gnugo.send_many(commands)[2::3]
    try:
        for (size, count), theirs in zip(cases, replies):
            assert ours.handle(f"boardsize {size}").startswith("=")
            reply = ours.handle(f"fixed_handicap {count}").strip()
            if theirs.ok and theirs.text:
                assert sorted(reply[2:].split()) == sorted(theirs.text.split()), (size, count)
            else:                                  # GNU Go: invalid handicap (or, for 1, places nothing)
                assert reply == "? invalid number of stones", (size, count, reply)
                assert fixed_handicap_points(size, count) is None
    finally:
        ours.close()


def test_printsgf_and_loadsgf_round_trip_with_setup_stones(engine, tmp_path):
    engine.ok("boardsize 9")
    engine.ok("komi 0.5")
    engine.ok("fixed_handicap 2")
    for command in ("play w E5", "play b D5", "play w pass", "play w F5"):   # White twice: GTP allows it
        engine.ok(command)
    text = engine.ok("printsgf")
    game = sgf.Sgf_game.from_bytes(text.encode())
    assert game.get_size() == 9 and game.get_komi() == 0.5 and game.get_handicap() == 2
    assert game.get_root().get_setup_stones()[0] == {(6, 6), (2, 2)}          # G7 C3 as sgfmill (row, col)
    assert [node.get_move() for node in game.get_main_sequence()[1:]] == [
        ("w", (4, 4)), ("b", (4, 3)), ("w", None), ("w", (4, 5))]
    before = showboard_stones(engine.ok("showboard"), 9)
    path = tmp_path / "game.sgf"
    engine.ok(f"printsgf {path}")
    assert path.read_bytes().decode().strip() == text

    engine.ok("boardsize 13")
    engine.ok("komi 7.5")
    assert engine.ask(f"loadsgf {path}") == "="
    board = engine.ok("showboard")
    assert showboard_stones(board, 9) == before and "komi 0.5" in board       # size and komi from the file
    engine.ok("undo")                                          # the moves are moves: F5 goes
    assert "F5" not in showboard_stones(engine.ok("showboard"), 9)
    engine.ok(f"loadsgf {path} 2")                              # the position before move 2
    assert showboard_stones(engine.ok("showboard"), 9) == {"G7": "X", "C3": "X", "E5": "O"}
    assert engine.ask("undo") == "="
    assert engine.ask("undo") == "? cannot undo"


def test_loadsgf_refuses_bad_files_and_keeps_the_game(engine, tmp_path):
    engine.ok("boardsize 9")
    engine.ok("play b E5")
    files = {
        "illegal.sgf": b"(;GM[1]FF[4]SZ[9];B[ee];W[dd];B[dd])",
        "small.sgf": b"(;GM[1]FF[4]SZ[4];B[aa])",
        "huge.sgf": b"(;GM[1]FF[4]SZ[9]" + b"C[" + b"x" * MAX_SGF_BYTES + b"])",
        "garbage.sgf": b"this is not sgf",
        "badmove.sgf": b"(;GM[1]FF[4]SZ[9];B[zz])",
        "nolib.sgf": b"(;GM[1]FF[4]SZ[9]AB[aa]AW[ba][ab])",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    assert engine.ask(f"loadsgf {tmp_path}/illegal.sgf 9") == \
        f"? illegal move in {tmp_path}/illegal.sgf at move 3 (B D6: occupied)"
    for name in files:
        assert engine.ask(f"loadsgf {tmp_path}/{name}").startswith(f"? cannot load {tmp_path}/{name}: ") or \
            name == "illegal.sgf", name
    assert "larger than" in engine.ask(f"loadsgf {tmp_path}/huge.sgf")
    assert engine.ask(f"loadsgf {tmp_path}/missing.sgf").startswith("? cannot load")
    assert engine.ask(f"loadsgf {tmp_path}").startswith("? cannot load")              # a directory
    assert engine.ask(f"loadsgf {tmp_path}/illegal.sgf 0").startswith("? syntax error")
    assert engine.ask(f"loadsgf {tmp_path}/illegal.sgf 3") == "="        # stops before the illegal move
    assert showboard_stones(engine.ok("showboard"), 9) == {"E5": "X", "D6": "O"}
    engine.ok("clear_board")
    engine.ok("play b E5")
    for name in files:
        engine.ask(f"loadsgf {tmp_path}/{name}")
    assert showboard_stones(engine.ok("showboard"), 9) == {"E5": "X"}   # every failure left the game alone
    assert engine.ok("name") == "zerolake"


def test_final_status_list_over_stdin(engine, tmp_path):
    path = tmp_path / "seki.sgf"
    path.write_bytes(position_sgf(SEKI_9))
    engine.ok(f"loadsgf {path}")
    seki = engine.ok("final_status_list seki").split("\n")
    assert set(seki) == SEKI_CHAINS
    assert engine.ok("final_status_list dead") == ""                 # no chain dies in the playouts
    alive = engine.ok("final_status_list alive").split("\n")
    listed = [v for line in alive + seki for v in line.split()]
    assert sorted(listed) == sorted(showboard_stones(engine.ok("showboard"), 9))   # each stone once
    assert engine.ask("final_status_list").startswith("? syntax error")
    path = tmp_path / "invaded.sgf"
    path.write_bytes(position_sgf(INVADED_9, moves=";B[];W[]"))
    engine.ok(f"loadsgf {path}")                     # after two passes: the referee's question
    assert engine.ok("final_status_list dead").split("\n") == ["B7", "H5"]
    assert engine.ok("final_status_list seki") == ""
    engine.ok(f"loadsgf {tmp_path / 'seki.sgf'}")
    assert engine.ask("final_status_list unknown").startswith("? syntax error")

    # reg_genmove answers without playing; kgs-genmove_cleanup plays.
    before = showboard_stones(engine.ok("showboard"), 9)
    gtp_to_move(engine.ok("reg_genmove w"), 9)
    assert showboard_stones(engine.ok("showboard"), 9) == before
    move = engine.ok("kgs-genmove_cleanup b")
    if move != "pass":
        assert showboard_stones(engine.ok("showboard"), 9)[move] == "X"


def test_kgs_genmove_cleanup_does_not_pass_early_under_the_pass_rule(tmp_path):
    # SEKI_9 with White's pass: the pass rule lets Black (ahead as the board
    # stands) pass; cleanup must play on (its only moves fill B9 or B8).
    path = tmp_path / "seki.sgf"
    path.write_bytes(position_sgf(SEKI_9, moves=";W[]"))
    engine = build_engine(GtpConfig(visits=16, komi=7.5, pass_when_winning=True, quiet=True))
    try:
        assert engine.handle(f"loadsgf {path}").startswith("=")
        assert engine.handle("reg_genmove b").strip() == "= pass"
        assert engine.handle("kgs-genmove_cleanup b").strip()[2:] in {"B9", "B8"}
        engine.handle("undo")
        assert engine.handle("genmove b").strip() == "= pass"   # the ordinary genmove keeps the rule
    finally:
        engine.close()


def test_loadsgf_and_printsgf_refuse_a_fifo_at_once(tmp_path):
    """open() of a FIFO waits for its other end for ever: the engine hung, quit included."""
    fifo = tmp_path / "game.sgf"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "arena.gtp", "--quiet", "--visits", "4"], cwd=REPO,
                          input=f"loadsgf {fifo}\nprintsgf {fifo}\nquit\n", capture_output=True, text=True,
                          timeout=120)
    replies = [line for line in done.stdout.splitlines() if line]
    assert replies == [f"? cannot load {fifo}: not a regular file", f"? cannot write {fifo}: not a regular file",
                       "="], done.stderr[-2000:]
