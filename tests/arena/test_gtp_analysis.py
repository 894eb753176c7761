"""Tests of live analysis over GTP (arena/gtp_engine.py: lz-analyze, kata-analyze and
their genmove_analyze forms), driven over pipes as the two GUIs drive it.

The command sequences are the clients' own (read from their sources):

* Lizzie (featurecat/lizzie, src/main/java/featurecat/lizzie/analysis/Leelaz.java):
  every command numbered (``12 play B E5``); at start ``name``, ``version``,
  ``boardsize N``, ``komi K``; analysis on: ``lz-analyze 10``; a move is
  ``play B E5`` sent while the analysis runs (which stops it), then
  ``lz-analyze 10`` again; analysis off: ``name``.
* Sabaki (SabakiHQ/Sabaki src/modules/enginesyncer.js and sabaki.js,
  @sabaki/gtp src/ControllerStateTracker.js and StreamController.js):
  ``name``, ``version``, ``protocol_version``, ``list_commands``; the first
  of ``analyze``, ``kata-analyze``, ``lz-analyze`` (setting
  ``engines.analyze_commands``) that the engine lists, sent as
  ``kata-analyze B 50`` (colour, ``board.analysis_interval`` 50); before
  any other command it aborts the analysis, with ``protocol_version``
  (enginesyncer.js) or a bare newline (StreamController.sendAbort); the
  position is synced with ``komi``, ``boardsize``, ``clear_board`` and
  ``play`` commands.

Every report line is checked against the grammar (field names and order,
value ranges, ``pv`` legal from the position, visits adding up), and a
command sent mid-stream must be answered within STOP_SECONDS.  Each test
runs against the engine without a model (uniform evaluator) and with a
model trained on a lake the test builds from self-play games (`model_root`).
"""
from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time

import pytest

from engine.board import Board
from format import layout, schema
from format.coords import gtp_to_move
from tests.arena.test_gtp import Engine, showboard_stones

SIZE = 9
KOMI = 7.5
STOP_SECONDS = 3.0
"""How soon a command sent during an analysis must be answered: the engine
checks its input between two evaluator batches (8 positions here, a few
milliseconds), so this only allows for a loaded machine."""
REPLY_SECONDS = 90.0
"""Longest wait for any reply (a model's first evaluation compiles it)."""

LZ_KEYS = ["move", "visits", "winrate", "prior", "lcb", "order"]
KATA_KEYS = ["move", "visits", "utility", "winrate", "prior", "lcb", "utilityLcb", "order"]
KATA_SCORED_KEYS = ["move", "visits", "utility", "winrate", "scoreMean", "scoreLead", "prior", "lcb",
                    "utilityLcb", "order"]
"""kata-analyze's fields without a score head (the uniform evaluator) and with one (a model)."""


class StreamingEngine(Engine):
    """`Engine` whose output is read by a thread, so that a reply that never
    comes fails the test (after REPLY_SECONDS) instead of hanging it, and
    so that lines can be read one at a time while an analysis streams."""

    def __init__(self, *flags, scored: bool = False):
        super().__init__("--visits", "64", *flags)
        self.scored = scored          # kata-analyze writes the network's score fields
        self.out: queue.Queue = queue.Queue()
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self):
        for raw in iter(self.proc.stdout.readline, b""):
            self.out.put(raw.decode().rstrip("\n"))
        self.out.put(None)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send_raw(b"\nquit\n")
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._pump_thread.join(timeout=10)          # it has read to the end: the streams may close
        super().close()
        # A daemon input thread must not break the exit (see arena.gtp._load_and_serve).
        assert self.proc.returncode == 0, f"engine exited with {self.proc.returncode}"

    def line(self, timeout: float = REPLY_SECONDS) -> str:
        try:
            text = self.out.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no output from the engine within {timeout} s")
        assert text is not None, "engine closed its output"
        return text

    def read_reply(self) -> str:
        lines = []
        while (text := self.line()) != "":
            lines.append(text)
        return "\n".join(lines)

    def start_stream(self, command: str, command_id: int | None = None) -> None:
        """Send an analysis command and read its header line."""
        prefix = "" if command_id is None else f"{command_id} "
        self.send_raw(f"{prefix}{command}\n".encode())
        assert self.line() == "=" + prefix.strip(), command

    def reports(self, count: int) -> list[str]:
        """The next `count` report lines of a running analysis."""
        got = [self.line() for _ in range(count)]
        assert all(text.startswith("info ") for text in got), got
        return got

    def stop_with(self, stop: str) -> tuple[list[str], str, float]:
        """Send `stop` (a command, or '' for a bare newline) during an analysis:
        (the reports still coming, the reply to `stop` ('' for a newline), seconds to it)."""
        started = time.monotonic()
        self.send_raw(stop.encode() + b"\n")
        rest = []
        while (text := self.line()) != "":
            rest.append(text)
        ended = time.monotonic()
        reply = self.read_reply() if stop.strip() else ""
        return rest, reply, (time.monotonic() if stop.strip() else ended) - started

    def resync(self) -> None:
        """Drain anything left by an earlier test (the engines are shared)."""
        self.send_raw(b"\n9999 name\n")
        while self.line() != "=9999 zerolake":
            pass
        assert self.line() == ""


@pytest.fixture(scope="module")
def model_root(tmp_path_factory):
    """A lake the test builds as a run does, and generation 1 trained on it: the self-play worker plays
    24 games of generation 0 (random-playout MCTS, 8 visits) into it, the shuffle job makes window 1 of
    them, and ``python -m model.train`` trains a 1x8 network 20 steps on that window and publishes it
    as it publishes every model (SavedModel, int8 CPU copy, LATEST)."""
    from cloud.storage import open_storage
    from tests.arena.test_gtp import REPO

    work = tmp_path_factory.mktemp("analysis-lake")
    root = str(work / "lake")

    def run(*argv):
        done = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{argv[0]}: " + done.stdout[-2000:] + done.stderr[-2000:]

    run("selfplay.worker", "--root", root, "--board-size", str(SIZE), "--seed", "3", "--games", "24",
        "--max-games", "24", "--visits", "8", "--fast-visits", "4", "--spool-dir", str(work / "spool"),
        "--chunk-seconds", "1")
    run("pipeline.shuffle", "--root", root, "--workers", "1", "--seed", "3", "--window-min-positions",
        "1000000", "--reuse", "1.0")
    run("model.train", "--root", root, "--blocks", "1", "--filters", "8", "--value-hidden", "8", "--batch-size",
        "32", "--steps-per-window", "20", "--steps-per-call", "10", "--warmup-steps", "5", "--log-every", "10")
    assert open_storage(root).read(layout.LATEST).decode().strip() == "1"
    return root


@pytest.fixture(scope="module", params=["uniform", "model"])
def engine(request):
    flags = ("--root", request.getfixturevalue("model_root")) if request.param == "model" else ()
    e = StreamingEngine(*flags, scored=request.param == "model")
    yield e
    e.close()


@pytest.fixture
def fresh(engine):
    engine.resync()
    return engine


# --------------------------------------------------------------------------
# the grammar
# --------------------------------------------------------------------------

def parse_report(line: str) -> tuple[list[dict], list[float] | None]:
    """([{key: text, 'pv': [...], 'pvVisits': [...]}], ownership or None)."""
    tokens = line.split()
    ownership = None
    if "ownership" in tokens:
        cut = tokens.index("ownership")
        ownership = [float(t) for t in tokens[cut + 1:]]
        tokens = tokens[:cut]
    blocks: list[dict] = []
    i = 0
    while i < len(tokens):
        assert tokens[i] == "info", (i, line)
        block: dict = {"keys": [], "pvVisits": []}
        i += 1
        while tokens[i] != "pv":
            block["keys"].append(tokens[i])
            block[tokens[i]] = tokens[i + 1]
            i += 2
        i += 1
        for name in ("pv", "pvVisits"):
            values = []
            while i < len(tokens) and tokens[i] not in ("info", "pvVisits"):
                values.append(tokens[i])
                i += 1
            block[name] = values
            if i < len(tokens) and tokens[i] == "pvVisits":
                i += 1
            else:
                break
        blocks.append(block)
    return blocks, ownership


def check_report(line: str, board: Board, kata: bool, pv_visits: bool = False, scored: bool = False) -> int:
    """Assert the grammar of one report on `board` (its side to move is the
    analysed colour); returns the total visits of the reported moves.
    `scored`: kata's score fields are there (the engine plays a model)."""
    blocks, ownership = parse_report(line)
    assert blocks
    last_visits = None
    for order, block in enumerate(blocks):
        assert block["keys"] == ((KATA_SCORED_KEYS if scored else KATA_KEYS) if kata else LZ_KEYS), block["keys"]
        assert int(block["order"]) == order
        visits = int(block["visits"])
        assert visits >= 1 and (last_visits is None or visits <= last_visits)   # most visited first
        last_visits = visits
        if kata:
            assert all("." in block[k] for k in ("winrate", "prior", "lcb"))     # Sabaki tells the scales apart so
            winrate, prior, lcb = (float(block[k]) for k in ("winrate", "prior", "lcb"))
            assert 0.0 <= lcb <= winrate <= 1.0 and 0.0 <= prior <= 1.0
            assert float(block["utility"]) == pytest.approx(2 * winrate - 1, abs=2e-6)
            assert float(block["utilityLcb"]) == pytest.approx(2 * lcb - 1, abs=2e-6)
            if scored:
                assert float(block["scoreMean"]) == float(block["scoreLead"])
                assert abs(float(block["scoreLead"])) <= 2 * board.size * board.size
        else:
            winrate, prior, lcb = (int(block[k]) for k in ("winrate", "prior", "lcb"))   # Lizzie: Integer.parseInt
            assert 0 <= lcb <= winrate <= 10000 and 0 <= prior <= 10000
        pv = block["pv"]
        assert pv and pv[0] == block["move"]
        replay = board.copy()
        for vertex in pv:
            move = gtp_to_move(vertex, board.size)
            assert replay.is_legal(move), (vertex, pv)
            replay.play(move)
            if replay.is_over:
                break
        if pv_visits:
            counts = [int(v) for v in block["pvVisits"]]
            assert len(counts) == len(pv) and counts[0] == visits
            # A node's visits are its own first evaluation plus its children's.
            assert all(child < parent for parent, child in zip(counts, counts[1:])), counts
        else:
            assert block["pvVisits"] == []
    if ownership is not None:
        sign = 1 if board.to_play == schema.BLACK else -1
        assert ownership == [float(sign * int(o)) for o in board.ownership()]
    return sum(int(block["visits"]) for block in blocks)


def check_stream(lines: list[str], board: Board, kata: bool, **options) -> None:
    """Every report well formed; the search keeps running between reports."""
    totals = [check_report(line, board, kata, **options) for line in lines]
    assert totals == sorted(totals), totals
    assert totals[-1] > totals[0], totals


# --------------------------------------------------------------------------
# the clients' sessions
# --------------------------------------------------------------------------

def lizzie_version_check(reply: str) -> None:
    """What Lizzie 0.7.4 does with the reply to ``version``
    (src/main/java/featurecat/lizzie/analysis/Leelaz.java, parseLine, tag 0.7.4):

        String[] params = line.trim().split(" ");
        currentCmdNum = Integer.parseInt(params[0].substring(1).trim());
        ...
        } else if (isCheckingVersion && !isKataGo) {
          String[] ver = params[1].split("\\.");
          int minor = Integer.parseInt(ver[1]);
          // Gtp support added in version 15
          if (minor < 15) {
            JOptionPane.showMessageDialog(
                Lizzie.frame,
                "Lizzie requires version 0.15 or later of Leela Zero for analysis (found "

    A parse failure (``0.17-zl``) throws in Lizzie's reading thread, which
    then reads the engine no more; a minor below 15 opens the dialog."""
    params = reply.strip().split(" ")
    int(params[0][1:].strip())
    minor = int(params[1].split(".")[1])
    assert minor >= 15, f"Lizzie 0.7.4 opens its 'requires version 0.15' dialog for {reply!r}"


def test_lizzie_session(fresh):
    e = fresh
    board = Board(SIZE, KOMI)
    assert e.ask("1 name") == "=1 zerolake"
    version = e.ask("2 version")
    lizzie_version_check(version)
    assert "zerolake" in version and ("model-g1" if e.scored else "uniform") in version    # says what it is
    assert e.ask(f"3 boardsize {SIZE}") == "=3"
    assert e.ask(f"4 komi {KOMI}") == "=4"
    e.start_stream("lz-analyze 10", 5)                         # pondering on
    check_stream(e.reports(3), board, kata=False)
    rest, reply, seconds = e.stop_with("6 play B E5")          # a move while pondering
    assert reply == "=6" and seconds < STOP_SECONDS, (reply, seconds)
    for line in rest:                                          # reports written before the stop was read
        check_report(line, board, kata=False)
    board.play(gtp_to_move("E5", SIZE))
    e.start_stream("lz-analyze 10", 7)
    check_stream(e.reports(3), board, kata=False)
    rest, reply, seconds = e.stop_with("8 name")               # pondering off
    assert reply == "=8 zerolake" and seconds < STOP_SECONDS, (reply, seconds)
    for line in rest:
        check_report(line, board, kata=False)
    assert showboard_stones(e.ok("showboard"), SIZE) == {"E5": "X"}


def test_sabaki_session(fresh):
    e = fresh
    board = Board(SIZE, KOMI)
    e.ok("name")
    e.ok("version")
    assert e.ok("protocol_version") == "2"
    listed = e.ok("list_commands").split("\n")
    chosen = next(c for c in ["analyze", "kata-analyze", "lz-analyze"] if c in listed)
    assert chosen == "kata-analyze"
    e.ok(f"komi {KOMI}")
    e.ok(f"boardsize {SIZE}")
    e.ok("clear_board")
    e.start_stream(f"{chosen} B 50")
    check_stream(e.reports(3), board, kata=True, scored=e.scored)
    rest, reply, seconds = e.stop_with("protocol_version")     # enginesyncer.js's abort
    assert reply == "= 2" and seconds < STOP_SECONDS, (reply, seconds)
    for command in ("play B E5", "play W C3"):
        e.ok(command)
        board.play(gtp_to_move(command.split()[2], SIZE))
    e.start_stream(f"{chosen} B 50")
    check_stream(e.reports(3), board, kata=True, scored=e.scored)
    rest, reply, seconds = e.stop_with("")                     # StreamController.sendAbort: a bare newline
    assert seconds < STOP_SECONDS, seconds
    for line in rest:
        check_report(line, board, kata=True, scored=e.scored)
    e.ok("undo")                                               # Sabaki's sync after going back a move
    board = Board(SIZE, KOMI)
    board.play(gtp_to_move("E5", SIZE))
    e.start_stream(f"{chosen} W 50")
    check_stream(e.reports(2), board, kata=True, scored=e.scored)
    rest, reply, seconds = e.stop_with("protocol_version")
    assert reply == "= 2" and seconds < STOP_SECONDS


def test_kata_analyze_ownership_and_pv_visits(fresh):
    e = fresh
    for command in (f"boardsize {SIZE}", "clear_board", "play B E5", "play W E4", "play B D4"):
        e.ok(command)
    board = Board(SIZE, KOMI)
    for vertex in ("E5", "E4", "D4"):
        board.play(gtp_to_move(vertex, SIZE))
    e.start_stream("kata-analyze interval 10 ownership true pvVisits true maxmoves 3", 21)
    lines = e.reports(3)
    check_stream(lines, board, kata=True, pv_visits=True, scored=e.scored)
    assert all(len(parse_report(line)[0]) <= 3 for line in lines)
    assert all(len(parse_report(line)[1]) == SIZE * SIZE for line in lines)
    rest, reply, seconds = e.stop_with("22 final_score")
    assert reply.startswith("=22 ") and seconds < STOP_SECONDS
    # Black's analysis of White's turn: the stones re-entered with Black to move.
    black = Board(SIZE, KOMI)
    black.set_position(board.stones(), schema.BLACK)
    e.start_stream("lz-analyze b 10", 23)
    check_stream(e.reports(2), black, kata=False)
    e.stop_with("")


def test_bad_requests_fail_and_leave_no_stream(fresh):
    e = fresh
    for bad in ("lz-analyze 10 ownership true", "kata-analyze b -5", "kata-analyze b 10 ownership maybe",
                "lz-analyze 10 maxmoves 0", "kata-analyze 10 interval", "lz-genmove_analyze b 10 frob 1"):
        assert e.ask(bad).startswith("? syntax error"), bad
    assert e.ask("31 name") == "=31 zerolake"


def test_genmove_analyze_streams_then_plays(fresh):
    e = fresh
    e.ok(f"boardsize {SIZE}")
    e.ok("clear_board")
    board = Board(SIZE, KOMI)
    for kata, command in ((False, "lz-genmove_analyze b 1"), (True, "kata-genmove_analyze W 1 pvVisits true")):
        e.start_stream(command, 41)
        e.send_raw(b"\n")                       # does not stop it: genmove_analyze runs its budget out
        lines = []
        while not (text := e.line()).startswith("play "):
            lines.append(text)
        assert e.line() == ""
        for line in lines:
            check_report(line, board, kata, pv_visits=kata, scored=kata and e.scored)
        vertex = text.split()[1]
        move = gtp_to_move(vertex, SIZE)
        assert board.is_legal(move)
        board.play(move)
    stones = showboard_stones(e.ok("showboard"), SIZE)
    assert set(stones.values()) <= {"X", "O"} and len(stones) == 2


def test_an_endless_analysis_stops_growing_at_the_cap(monkeypatch):
    from arena import gtp_analysis
    from arena.gtp import GtpConfig, build_engine
    from arena.gtp_engine import StreamingReply

    monkeypatch.setattr(gtp_analysis, "ANALYSIS_MAX_NODES", 40 * (SIZE * SIZE + 1))
    engine = build_engine(GtpConfig(visits=4, quiet=True))
    try:
        reply = engine.handle("7 kata-analyze b 1")
        assert isinstance(reply, StreamingReply) and reply.head == "=7" and reply.stoppable
        steps = 0
        while reply.step():
            steps += 1
            assert steps < 1000, "the search did not stop at the cap"
        first = reply.report()
        # The root's 40 visits: its own evaluation, and 39 through its moves.
        assert check_report(first, Board(SIZE, KOMI), kata=True) == 39
        assert not reply.step() and reply.report() == first               # reports go on, unchanged
        assert engine.handle("name") == "= zerolake\n\n"
    finally:
        engine.close()


# --------------------------------------------------------------------------
# in-process: avoid/allow, intervals, the score head
# --------------------------------------------------------------------------

def analyse(engine, command: str, steps: int = 40) -> str:
    """The report of an in-process analysis after `steps` evaluator batches."""
    from arena.gtp_engine import StreamingReply

    reply = engine.handle(command)
    assert isinstance(reply, StreamingReply), reply
    for _ in range(steps):
        if not reply.step():
            break
    return reply.report()


def reported_moves(line: str) -> set[str]:
    return {block["move"] for block in parse_report(line)[0]}


def test_avoid_and_allow_restrict_the_searched_moves():
    from arena.gtp import GtpConfig, build_engine

    engine = build_engine(GtpConfig(visits=4, quiet=True))
    try:
        board = Board(SIZE, KOMI)
        everything = analyse(engine, "lz-analyze b 1")
        assert {"D4", "E5", "C3"} <= reported_moves(everything)
        # Lizzie's right-click "avoid": both colours, avoid-keep-variations (30) plies.
        line = analyse(engine, "lz-analyze 10 avoid b D4,E5 30 avoid w D4,E5 30")
        check_report(line, board, kata=False)
        moves = reported_moves(line)
        assert len(moves) > 20 and not moves & {"D4", "E5"}, moves
        line = analyse(engine, "kata-analyze b 10 allow b E5,C3 1")
        check_report(line, board, kata=True)
        assert reported_moves(line) == {"E5", "C3"}
        line = analyse(engine, "lz-analyze b 10 allow b A1:B2 1 avoid b pass 1")       # a rectangle
        assert reported_moves(line) == {"A1", "A2", "B1", "B2"}
        line = analyse(engine, "lz-analyze b 10 avoid w E5 1")         # White's moves: not the root's
        assert "E5" in reported_moves(line)
        # The restricted tree is not reused: the next plain analysis sees every move again.
        assert {"D4", "E5", "C3"} <= reported_moves(analyse(engine, "lz-analyze b 1"))
        for bad in ("lz-analyze 10 avoid b D4", "lz-analyze 10 avoid x D4 1", "lz-analyze 10 avoid b D4 0",
                    "lz-analyze 10 avoid b Z4 1", "lz-analyze 10 allow b E5 1 avoid b D4 1",
                    "lz-analyze 10 avoid b A1:B2:C3 1", "lz-genmove_analyze b 10 avoid b D4 1"):
            assert engine.handle(bad).startswith("? syntax error"), bad
        assert engine.handle("name") == "= zerolake\n\n"
    finally:
        engine.close()


def test_an_out_of_range_interval_is_refused():
    from arena.gtp import GtpConfig, build_engine

    engine = build_engine(GtpConfig(visits=4, quiet=True))
    try:
        for command in ("lz-analyze 1000000000000", "kata-analyze b interval 99999999999999999999"):
            reply = engine.handle(command)
            assert isinstance(reply, str) and reply.startswith("? syntax error"), (command, reply)
            assert "interval" in reply
        from arena.gtp_engine import StreamingReply

        assert isinstance(engine.handle("lz-analyze 8640000"), StreamingReply)        # a day: taken
    finally:
        engine.close()


def test_kata_scores_are_the_networks_estimate(tmp_path):
    """scoreLead/scoreMean of each move: minus the score head's value of the position
    after it (its player to move is the opponent); none at all without a score head."""
    from arena.gtp import GtpConfig, build_engine
    from cloud.storage import open_storage
    from inference.model_files import load_model
    from testdata.models import publish_untrained_model

    root = str(tmp_path / "lake")
    publish_untrained_model(root, 1, SIZE, seed=5)
    model = load_model(open_storage(root), 1, cache_dir=str(tmp_path / "cache"))
    engine = build_engine(GtpConfig(model=f"{root}/{layout.MODELS_DIR}/000001", visits=4, quiet=True))
    try:
        engine.handle("play b E5")
        board = Board(SIZE, KOMI)
        board.play(gtp_to_move("E5", SIZE))
        line = analyse(engine, "kata-analyze w 10 maxmoves 6")
        blocks = parse_report(line)[0]
        assert blocks and all(block["keys"] == KATA_SCORED_KEYS for block in blocks)
        for block in blocks:
            after = board.copy()
            after.play(gtp_to_move(block["move"], SIZE))
            expected = -float(model(after.features(model.input_planes)[None])["score"][0])
            assert float(block["scoreLead"]) == pytest.approx(expected, abs=1e-3), block
            assert float(block["scoreMean"]) == float(block["scoreLead"])
    finally:
        engine.close()
    uniform = build_engine(GtpConfig(visits=4, quiet=True))
    try:
        blocks = parse_report(analyse(uniform, "kata-analyze b 10"))[0]
        assert blocks and all(block["keys"] == KATA_KEYS for block in blocks)
    finally:
        uniform.close()


def test_version_is_one_lizzie_accepts_and_names_the_engine():
    from arena.gtp import GtpConfig, build_engine

    engine = build_engine(GtpConfig(visits=4, quiet=True))
    try:
        reply = engine.handle("2 version").strip()
        lizzie_version_check(reply)
        assert "zerolake" in reply and "uniform" in reply, reply
    finally:
        engine.close()
