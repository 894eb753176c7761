"""The worker's health answer (selfplay/health.py), which a deployed worker group's autohealing probes.

* The server alone, on a stepped clock: 200 while the progress counter moves or in the start-up grace,
  503 once it has not moved for the stall time, 200 again when it moves; other paths are 404.
* A real worker (``python -m selfplay.worker --health-port``) answers 200 with the positions it played;
  a port already taken is refused in one line, before anything is played.
"""
from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

from selfplay.health import HealthServer
from tests.selfplay.test_worker import start_worker, wait_for


def _get(port: int, path: str = "/health") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_healthy_while_the_counter_moves_and_503_once_it_stalls():
    now, count = [1000.0], [0]
    server = HealthServer(0, lambda: count[0], 600, host="127.0.0.1", clock=lambda: now[0])
    try:
        assert _get(server.port)[0] == 200                      # the start-up grace
        now[0] += 599
        assert _get(server.port)[0] == 200
        now[0] += 2                                             # 601 s and nothing played: not playing
        status, text = _get(server.port)
        assert status == 503 and text.startswith("stalled: 0 positions, no change for 601 s")
        count[0] = 40                                           # it plays again
        status, text = _get(server.port)
        assert status == 200 and "40 positions" in text
        now[0] += 601
        assert _get(server.port)[0] == 503
        assert _get(server.port, "/")[0] == 404
    finally:
        server.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_playing_worker_answers_200_and_a_taken_port_is_refused_in_one_line(tmp_path):
    port = _free_port()
    worker = start_worker(tmp_path / "lake", "--health-port", str(port), "--max-seconds", "60")
    try:
        def playing():
            try:
                status, text = _get(port)
            except OSError:
                return False
            return status == 200 and not text.startswith("playing: 0 ")
        wait_for(playing, 60, "a health answer with positions played")

        with socket.socket() as taken:
            taken.bind(("0.0.0.0", 0))
            taken.listen()
            second = start_worker(tmp_path / "lake2", "--health-port", str(taken.getsockname()[1]))
            out, _ = second.communicate(timeout=60)
        assert second.returncode == 2
        [line] = [line for line in out.splitlines() if "health-port" in line]
        assert line.startswith("selfplay.worker: --health-port ") and "in use" in line
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.parametrize("flag, value", [("--health-port", "70000"), ("--health-stall-seconds", "0")])
def test_bad_health_flags_are_refused(tmp_path, flag, value):
    worker = start_worker(tmp_path / "lake", flag, value)
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 2 and flag in out and "Traceback" not in out
