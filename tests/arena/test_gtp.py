"""Tests of the GTP engine (`python -m arena.gtp`), driven over pipes.

`Engine` is a scripted controller: it writes one command line and reads the
raw reply up to its terminating blank line, so ids and the '='/'?' markers
are checked as a controller sees them.  The last test is a whole 9x9 game
against GNU Go, refereed by the test: moves are relayed between the two
engines until two passes, and neither may answer '?'.
"""
import os
import random
import subprocess
import sys
import time

import pytest

from format import schema
from engine.board import Board, board_from_ascii
from format.coords import gtp_to_move, move_to_gtp
from format import layout
from arena.gtp_engine import GtpEngine
from arena.gtp_game import TimeControl, format_score, move_time_allotment
from arena.gtp_client import GnuGo, GnuGoNotFound, find_gnugo

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIRED_COMMANDS = [
    "protocol_version", "name", "version", "known_command", "list_commands", "quit", "boardsize",
    "clear_board", "komi", "play", "genmove", "undo", "showboard", "final_score", "time_settings",
    "time_left",
]


class Engine:
    """`python -m arena.gtp` as a subprocess; `ask` returns the raw reply."""

    def __init__(self, *flags):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "arena.gtp", "--quiet", *flags], cwd=REPO,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def send_raw(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read_reply(self) -> str:
        lines = []
        while True:
            line = self.proc.stdout.readline()
            assert line, f"engine closed its output; stderr: {self.proc.stderr.read().decode()[-2000:]}"
            line = line.decode().rstrip("\n")
            if line == "":
                return "\n".join(lines)
            lines.append(line)

    def ask(self, command: str) -> str:
        self.send_raw(command.encode() + b"\n")
        return self.read_reply()

    def ok(self, command: str) -> str:
        """The text of a '=' reply (fails the test on '?')."""
        reply = self.ask(command)
        assert reply.startswith("="), f"{command!r} -> {reply!r}"
        return reply[1:].strip()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send_raw(b"quit\n")
                self.proc.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()


@pytest.fixture
def engine():
    e = Engine("--visits", "16")
    yield e
    e.close()


def showboard_stones(text: str, size: int) -> dict:
    """{(GTP vertex): 'X'/'O'} from a showboard reply."""
    stones = {}
    rows = [line for line in text.splitlines() if line[:2].strip().isdigit()]
    assert len(rows) == size
    for line in rows:
        number = int(line[:2])
        cells = line[3:3 + 2 * size:2]
        for col, cell in enumerate(cells):
            if cell in "XO":
                stones[f"{'ABCDEFGHJKLMNOPQRST'[col]}{number}"] = cell
    return stones


def test_administrative_commands(engine):
    assert engine.ask("protocol_version") == "= 2"
    assert engine.ok("name") == "zerolake"
    assert engine.ok("version")
    listed = engine.ok("list_commands").split("\n")
    assert set(REQUIRED_COMMANDS) <= set(listed)
    for command in REQUIRED_COMMANDS:
        assert engine.ok(f"known_command {command}") == "true"
    assert engine.ok("known_command frobnicate") == "false"
    assert engine.ask("frobnicate 3").startswith("? unknown command")


def test_ids_are_echoed_on_success_and_failure(engine):
    assert engine.ask("12 name") == "=12 zerolake"
    assert engine.ask("7 boardsize 9") == "=7"
    reply = engine.ask("12 genmove b")
    assert reply.startswith("=12 ")
    gtp_to_move(reply.split()[1], 9)          # a real vertex (or pass)
    assert engine.ask("99 frobnicate").startswith("?99 ")
    assert engine.ask("5 play b Z77").startswith("?5 ")
    # Comments and tabs are handled before the id is read; blank lines get no reply.
    engine.send_raw(b"\n   \n# just a comment\n")
    assert engine.ask("3\tname # trailing comment") == "=3 zerolake"


def test_play_showboard_undo_and_illegal_moves(engine):
    engine.ok("boardsize 9")
    engine.ok("clear_board")
    engine.ok("play b D4")
    engine.ok("play white E5")
    stones = showboard_stones(engine.ok("showboard"), 9)
    assert stones == {"D4": "X", "E5": "O"}
    assert engine.ask("play b D4") == "? illegal move (occupied)"
    engine.ok("undo")
    assert showboard_stones(engine.ok("showboard"), 9) == {"D4": "X"}
    engine.ok("undo")
    assert engine.ask("undo") == "? cannot undo"
    # Ko: Black's F5 captures White's E5; White may not retake at once
    # (it would repeat the position: positional superko).
    engine.ok("clear_board")
    ko_moves = [("b", "D5"), ("w", "E5"), ("b", "E6"), ("w", "F6"), ("b", "E4"), ("w", "F4"),
                ("b", "A1"), ("w", "G5")]
    for color, vertex in ko_moves:
        engine.ok(f"play {color} {vertex}")
    engine.ok("play b F5")                        # captures E5: a ko
    assert engine.ask("play w E5") == "? illegal move (superko)"
    # Suicide: a lone stone into a point with no liberty and no capture.
    engine.ok("clear_board")
    for color, vertex in [("b", "A2"), ("w", "J9"), ("b", "B1")]:
        engine.ok(f"play {color} {vertex}")
    assert engine.ask("play w A1") == "? illegal move (suicide)"
    # Malformed arguments are syntax errors, not crashes.
    for bad in ("play", "play b", "play purple D4", "play b D44", "play b I5", "genmove",
                "boardsize x", "boardsize 3", "boardsize 25", "komi", "komi seven", "komi nan",
                "time_settings 1 2", "time_left b x 0", "known_command"):
        assert engine.ask(bad).startswith("? "), bad
    assert engine.ok("name") == "zerolake"


def test_final_score_on_an_ascii_position(engine):
    # Black owns columns A-B (10 points), White C-E (15 points).
    position = """
        .XO..
        .XO..
        .XO..
        .XO..
        .XO..
    """
    board = board_from_ascii(position, komi=0.5)
    engine.ok("boardsize 5")
    engine.ok("clear_board")
    stones = board.stones()
    for row in range(5):
        for col in range(5):
            if stones[row, col]:
                color = "b" if stones[row, col] == schema.BLACK else "w"
                engine.ok(f"play {color} {move_to_gtp(row * 5 + col, 5)}")   # same colour twice is allowed
    for komi, expected in ((0.5, "W+5.5"), (-5, "0"), (-6.5, "B+1.5")):
        engine.ok(f"komi {komi}")
        assert engine.ok("final_score") == expected
    assert board.area_score() == -5.5
    assert format_score(board.area_score()) == "W+5.5"


def test_genmove_plays_for_the_asked_colour_and_boardsize_changes(engine):
    engine.ok("boardsize 7")
    engine.ok("clear_board")
    first = engine.ok("genmove w")           # White first: allowed by GTP
    second = engine.ok("genmove w")          # and twice in a row
    stones = showboard_stones(engine.ok("showboard"), 7)
    placed = [v for v in (first, second) if v != "pass"]
    assert all(stones[v.upper()] == "O" for v in placed) and len(stones) == len(placed)
    # Play goes on after two passes (the controller decides when a game ends).
    engine.ok("clear_board")
    engine.ok("play b pass")
    engine.ok("play w pass")
    assert engine.ok("final_score") == "W+7.5"
    engine.ok("play b D4")
    assert engine.ok("genmove w") != "D4"
    engine.ok("boardsize 19")
    assert showboard_stones(engine.ok("showboard"), 19) == {}
    vertex = engine.ok("genmove b")
    gtp_to_move(vertex, 19)


def test_time_settings_limit_the_move_time():
    e = Engine("--visits", "1000000")        # only the clock can stop this search
    try:
        e.ok("boardsize 9")
        e.ok("time_settings 60 0 0")
        e.ok("time_left b 1 0")
        started = time.monotonic()
        e.ok("genmove b")
        assert time.monotonic() - started < 3.0
    finally:
        e.close()


def test_move_time_allotment():
    absolute = TimeControl(main_time=300, byo_yomi_time=0, byo_yomi_stones=0)
    # 9x9 at move 0: (0.75 * 81) / 2 = 30.4 own moves left; 80% safety.
    assert move_time_allotment(absolute, 300, 0, 9, 0) == pytest.approx(0.8 * 300 / 30.375)
    # Late in the game the floor (N^2 / 6 moves) keeps some time back.
    assert move_time_allotment(absolute, 60, 0, 9, 200) == pytest.approx(0.8 * 60 / 13.5)
    byo = TimeControl(main_time=0, byo_yomi_time=30, byo_yomi_stones=5)
    assert move_time_allotment(byo, 20, 4, 9, 50) == pytest.approx(0.8 * 20 / 4)
    assert move_time_allotment(byo, None, None, 9, 0) == pytest.approx(0.8 * 30 / 5)
    assert move_time_allotment(TimeControl(0, 10, 0), None, None, 9, 0) is None   # no limit
    assert move_time_allotment(absolute, 0.001, 0, 9, 0) == 0.05


def test_fuzzed_garbage_gets_error_replies_and_no_crash():
    tokens = REQUIRED_COMMANDS[:]
    tokens.remove("quit")
    tokens += ["b", "w", "black", "white", "pass", "resign", "A1", "J9", "T19", "Z0", "0", "-1",
               "9", "19", "7.5", "nan", "inf", "1e309", "#", "=", "?", "\t", "\x00", "é", "\u202e"]
    rng = random.Random(1234)
    lines = []
    for _ in range(300):
        if rng.random() < 0.4:
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        else:
            raw = " ".join(rng.choice(tokens) for _ in range(rng.randrange(1, 6))).encode()
            if rng.random() < 0.3:
                raw = str(rng.randrange(1000)).encode() + b" " + raw
        raw = raw.replace(b"\n", b" ").replace(b"quit", b"quiz")
        lines.append(raw)
    engine = Engine("--visits", "4")
    try:
        engine.ok("boardsize 5")                # keep fuzzed genmoves quick
        for number, raw in enumerate(lines):
            engine.send_raw(raw + b"\n" + f"{100000 + number} name\n".encode())
            while True:                         # replies to the garbage (0 or 1), then ours
                reply = engine.read_reply()
                assert reply[:1] in ("=", "?"), (raw, reply)
                if reply == f"={100000 + number} zerolake":
                    break
        assert engine.proc.poll() is None
    finally:
        engine.close()
    assert engine.proc.returncode == 0


def test_preprocess_follows_the_spec():
    assert GtpEngine.preprocess("\x01na\x7fme\t# x") == "name"
    assert GtpEngine.preprocess("  \t ") == ""


def test_bad_flags_give_a_clear_error():
    out = subprocess.run([sys.executable, "-m", "arena.gtp", "--model", "/tmp/not-a-model"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"ROOT/{layout.models_prefix()}<generation>" in out.stderr
    assert "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "arena.gtp", "--visits", "0"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "visits or seconds" in out.stderr


def require_gnugo():
    try:
        return find_gnugo()
    except GnuGoNotFound as exc:
        pytest.fail(f"{exc}; run scripts/setup.sh --test")


def test_whole_game_against_gnugo():
    require_gnugo()
    ours = Engine("--visits", "16")
    gnugo = GnuGo(level=1, board_size=9, komi=7.5)
    moves = []
    try:
        ours.ok("boardsize 9")
        ours.ok("komi 7.5")
        ours.ok("clear_board")
        players = {"b": ("ours", "gnugo"), "w": ("gnugo", "ours")}
        board = Board(9, 7.5)
        passes = 0
        color = "b"
        while passes < 2 and len(moves) < 300:
            mover, other = players[color]
            if mover == "ours":
                vertex = ours.ok(f"genmove {color}")
                gnugo.send(f"play {color} {vertex}")          # raises on '?'
            else:
                vertex = gnugo.send(f"genmove {color}")
                ours.ok(f"play {color} {vertex}")
            assert vertex.lower() != "resign" or mover == "gnugo"
            if vertex.lower() == "resign":
                break
            board.play(gtp_to_move(vertex, 9))                 # the referee's own rules check
            moves.append(vertex)
            passes = passes + 1 if vertex.lower() == "pass" else 0
            color = "w" if color == "b" else "b"
        assert passes == 2 or vertex.lower() == "resign", f"no end after {len(moves)} moves"
        # Both engines agree on the position and our score is the referee's.
        ours_stones = showboard_stones(ours.ok("showboard"), 9)
        expected = {move_to_gtp(p, 9): ("X" if c > 0 else "O")
                    for p, c in enumerate(board.stones().reshape(-1)) if c}
        assert ours_stones == expected
        assert ours.ok("final_score") == format_score(board.area_score())
    finally:
        ours.close()
        gnugo.close()
    assert ours.proc.returncode == 0


def test_engine_plays_a_published_model(tmp_path, capsys):
    from tests.arena.test_match import publish_tiny_model

    root = str(tmp_path / "lake")
    publish_tiny_model(root, generation=2)
    e = Engine("--root", root, "--visits", "8")
    try:
        assert "model-g2" in e.ok("version")
        e.ok("clear_board")
        gtp_to_move(e.ok("genmove b"), 9)
        assert e.ask("boardsize 13").startswith("? unacceptable size")   # the model is 9x9
        gtp_to_move(e.ok("genmove w"), 9)
    finally:
        e.close()
    from arena.gtp import main

    assert main(["--root", root, "--generation", "5"]) == 2     # fails before reading stdin
    assert "generation 5 is not published" in capsys.readouterr().err


def test_genmove_resigns_a_hopeless_position_only_when_enabled():
    import numpy as np

    from engine.move_choice import MovePolicy
    from arena.player import MctsConfig, MctsPlayer, SearchBudget

    def black_is_lost(planes):       # value for the side to move: -1 for Black, +1 for White
        black_to_move = planes[:, 0, 0, 16] > 0.5
        return (np.zeros((len(planes), planes.shape[1] ** 2 + 1), np.float32),
                np.where(black_to_move, -1.0, 1.0).astype(np.float32))

    for threshold, expected in ((-0.9, "= resign"), (None, None)):
        config = MctsConfig(budget=SearchBudget(8), moves=MovePolicy(resign_threshold=threshold))
        engine = GtpEngine(lambda size: MctsPlayer(black_is_lost, config), config.budget)
        reply = engine.handle("genmove b").strip()
        if expected:
            assert reply == expected
            assert engine.moves == []                 # resigning plays nothing
        else:
            gtp_to_move(reply[2:], 9)
        assert engine.handle("genmove w").strip() != "= resign"


def test_genmove_answers_a_pass_with_a_pass_when_ahead_only_with_the_pass_rule():
    from arena.gtp import CLI, GtpConfig, build_engine
    from tests.engine.test_board import SEKI_9

    # The seki of tests/engine/test_board.py: Black is ahead by 5.5 as the board stands and
    # its only other moves fill a shared liberty, B9 or B8, which loses the seki.
    stones = board_from_ascii(SEKI_9).stones().reshape(-1)
    setup = [f"play {'b' if stones[p] > 0 else 'w'} {move_to_gtp(p, 9)}"
             for p in sorted(range(81), key=lambda p: stones[p]) if stones[p]]      # White's first, Black's last
    for rule, expected in ((True, {"PASS"}), (False, {"B9", "B8"})):
        config = GtpConfig(visits=16, komi=7.5, pass_when_winning=rule)
        engine = build_engine(config)
        for command in ["boardsize 9", "clear_board", *setup, "play w pass"]:
            assert engine.handle(command).startswith("="), command
        assert engine.handle("genmove b").strip()[2:].upper() in expected
        if rule:
            assert engine.handle("final_score").strip() == "= B+5.5"
    assert CLI.parse(["--pass-when-winning"])[0].pass_when_winning
    assert not CLI.parse([])[0].pass_when_winning


class _EndlessLine:
    """A controller that sends `size` bytes with no newline, then real commands."""

    def __init__(self, size: int, then: bytes):
        self.left, self.then = size, then

    def readline(self, limit: int) -> bytes:
        if self.left > 0:
            piece = min(limit, self.left)
            self.left -= piece
            return b"x" * piece
        line, _, self.then = self.then.partition(b"\n")
        return line + b"\n" if line or self.then else b""


def test_an_endless_line_is_refused_in_bounded_memory():
    import io
    import tracemalloc

    from arena.gtp import MAX_LINE_BYTES, GtpConfig, build_engine, serve

    engine = build_engine(GtpConfig(visits=2, quiet=True))
    out = io.StringIO()
    tracemalloc.start()
    serve(engine, _EndlessLine(100 * 1024 * 1024, b"\nname\nquit\n"), out)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    replies = out.getvalue().split("\n\n")
    assert replies[0] == f"? command longer than {MAX_LINE_BYTES} bytes"
    assert replies[1] == "= zerolake"
    assert peak < 5 * 1024 * 1024, f"peak {peak} bytes while reading a 100 MB line"


LIBRARY_NOISE = (b"= 0.5 from a library\n? 12\ninfo move D4 visits 3\nplay D4\n"
                 b"D4 -> 123 (V: 50.1%)\nkomi=7.5\nI0000 port.cc:153] oneDNN custom operations are on\n"
                 b"= no newline at the end")
"""What a library might write on fd 2: each line but the oneDNN notice is one Lizzie
0.7.4 (Leelaz.parseLine) would act on, reading the engine's stderr as its output."""


def test_library_writes_on_stderr_cannot_read_as_gtp_output():
    # A library writing straight to fd 2 while the model loads, as TensorFlow's C++ code does.
    script = ("import os, sys\n"
              "from arena import gtp\n"
              "load = gtp.build_engine\n"
              "def noisy(*args, **kwargs):\n"
              f"    os.write(2, {LIBRARY_NOISE!r})\n"
              "    print('=7 from python', file=sys.stderr)\n"
              "    return load(*args, **kwargs)\n"
              "gtp.build_engine = noisy\n"
              "sys.exit(gtp.main(['--quiet']))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, input=b"1 name\nquit\n",
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"=1 zerolake\n\n=\n\n"
    err = done.stderr.decode().splitlines()
    # Every line came through; the unterminated one goes on with Python's line.
    assert len(err) == 8 and err[-1] == "stderr: = no newline at the end=7 from python", err
    for line in err:
        assert not line.startswith(("=", "?", "info", "play", "komi=")) and " -> " not in line, line
    assert "stderr: D4 => 123 (V: 50.1%)" in err and "I0000 port.cc:153] oneDNN custom operations are on" in err
