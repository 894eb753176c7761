"""A worker's answer to its instance group's health check: ``GET /health`` over HTTP.

A deployed worker group probes each VM (operations/deploy/workers.py) and recreates one that stays
unhealthy: a VM whose image never started, whose GPU never came up or whose worker is stuck.  "Healthy"
means the worker is playing: the progress counter it already keeps (positions played, read on each
probe, so the search loop does nothing for this) moved within ``stall_seconds``, or the server started
less than ``stall_seconds`` ago (loading TensorFlow and the first model).  Any other path is 404.

    probe -> HealthServer.state(): counter changed since the last probe? note the time
          -> 200 "playing: ..." | 503 "stalled: no move for N s"
"""

from __future__ import annotations

import http.server
import threading
import time
from typing import Callable

PATH = "/health"


class HealthServer:
    """Serves ``PATH`` on ``port`` (0.0.0.0) from a daemon thread until `close`."""

    def __init__(
        self,
        port: int,
        progress: Callable[[], int],
        stall_seconds: float,
        *,
        host: str = "0.0.0.0",
        clock: Callable[[], float] = time.monotonic,
    ):
        self._progress, self._stall, self._clock = progress, stall_seconds, clock
        self._lock = threading.Lock()
        self._seen = progress()
        self._moved_at = clock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the http.server name)
                healthy, text = server.state() if self.path == PATH else (None, f"only {PATH} is served")
                body = (text + "\n").encode()
                self.send_response(404 if healthy is None else 200 if healthy else 503)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format, *args):  # noqa: A002 (the base class's name)
                pass  # stdout carries the worker's JSON events; a probe a minute is not news

        # Raises OSError (the port is taken, or not ours to bind): the caller names the flag.
        self._http = http.server.ThreadingHTTPServer((host, port), Handler)
        self._http.daemon_threads = True
        self.port = self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever, name="health", daemon=True)
        self._thread.start()

    def state(self) -> tuple[bool, str]:
        """(healthy, a line saying why)."""
        with self._lock:
            now, count = self._clock(), self._progress()
            if count != self._seen:
                self._seen, self._moved_at = count, now
            idle = now - self._moved_at
        if idle < self._stall:
            return True, f"playing: {count} positions, the last change {idle:.0f} s ago"
        return False, f"stalled: {count} positions, no change for {idle:.0f} s (limit {self._stall:.0f} s)"

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
