"""KaTrain reviews a game through ``python -m arena.analysis``, driven by KaTrain's own engine client.

KaTrain (from PyPI, a test dependency) talks to a custom engine with `katrain.core.engine.KataGoEngine`:
it starts the command through a shell, writes one JSON query per node of the game, reads the answers
into its `GameNode`s and, on shutdown, signals the shell and joins its reader threads.  Here that
client analyses every position of a short game with a published (untrained) network, then shuts
down: each node holds the engine's winrate, score and candidate moves, KaTrain computes the points
each move lost from them, and the engine is gone (it watched its parent: the shell KaTrain
signalled did not pass the signal on, and KaTrain's shutdown hung in its thread joins).
"""
from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time

import pytest

from testdata.models import publish_untrained_model

GAME = "(;GM[1]FF[4]SZ[9]KM[7.5]RU[Chinese];B[ee];W[gc];B[cg];W[ge];B[gg];W[eg];B[dc];W[hg];B[gh];W[fh];B[hh])"


class KaTrainHost:
    """What KataGoEngine calls on KaTrain: ``log(message, level)``, and popups through a call."""

    def __init__(self):
        self.lines: list[tuple[object, str]] = []

    def log(self, message, level=0):
        self.lines.append((level, str(message)))

    def __call__(self, *args):
        self.lines.append(("popup", repr(args)))


@pytest.fixture
def katrain(tmp_path, monkeypatch):
    # Kivy writes its configuration and logs under KIVY_HOME when imported, and reads argv unless told not to.
    monkeypatch.setenv("KIVY_HOME", str(tmp_path / "kivy"))
    monkeypatch.setenv("KIVY_NO_ARGS", "1")
    monkeypatch.setenv("KIVY_NO_CONSOLELOG", "1")
    from katrain.core import engine, game

    return engine, game


def test_katrains_engine_client_reviews_a_game_and_stops_the_engine(tmp_path, katrain):
    engine_module, game_module = katrain
    root = str(tmp_path / "lake")
    publish_untrained_model(root, 1, 9, seed=3)
    nodes = [game_module.KaTrainSGF.parse_sgf(GAME)]
    while nodes[-1].children:
        nodes.append(nodes[-1].children[0])
    assert len(nodes) == 12

    host = KaTrainHost()
    command = f"{shlex.quote(sys.executable)} -m arena.analysis --root {shlex.quote(root)} --visits 16"
    engine = engine_module.KataGoEngine(host, {"altcommand": command, "max_visits": 16, "fast_visits": 16,
                                               "max_time": 30.0, "wide_root_noise": 0.0, "_enable_ownership": True})
    finished = threading.Semaphore(0)

    def store(node):
        def callback(analysis, partial):
            node.set_analysis(analysis, partial_result=partial)
            if not partial:
                finished.release()
        return callback

    try:
        for node in nodes:
            engine.request_analysis(node, store(node))
        for _ in nodes:
            assert finished.acquire(timeout=120), [line for line in host.lines if line[0] != 0][-8:]
        shell = engine.katago_process
        # KaTrain's shutdown signals the shell and joins its reader threads: the engine's pipes must close.
        stopping = threading.Thread(target=engine.shutdown, kwargs={"finish": True}, daemon=True)
        stopping.start()
        stopping.join(timeout=20)
        assert not stopping.is_alive(), "KaTrain's shutdown hangs: the engine outlived the shell KaTrain signalled"
        assert shell.wait(timeout=5) is not None
        # The engine's own process is gone too, not only the shell KaTrain started it with.
        deadline = time.monotonic() + 10
        while _analysis_processes(root) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _analysis_processes(root)
    finally:
        for pid in _analysis_processes(root):         # a failed run leaves no engine behind
            os.kill(pid, signal.SIGKILL)

    assert not [line for line in host.lines if line[0] == "popup"], host.lines
    for node in nodes:
        assert node.analysis_complete and node.root_visits >= 16
        assert 0 <= node.winrate <= 1 and isinstance(node.score, float)
        assert node.candidate_moves and all(m["visits"] > 0 for m in node.candidate_moves)
        assert len(node.analysis["ownership"]) == 81 and len(node.analysis["policy"]) == 82
    for node in nodes[1:]:                            # KaTrain's review: what each move cost, from the scores
        assert isinstance(node.points_lost, float)


def _analysis_processes(root: str) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if b"arena.analysis" in words and root.encode() in words:
            pids.append(int(pid))
    return pids
