"""Stopping on SIGTERM: the one way the programs that hold resources stop when told to.

A GUI closing its GTP engine, systemd stopping a unit, or a launcher stopping
a one-shot shuffle job sends SIGTERM.  Its default action ends the process
without unwinding: no ``finally`` runs.  Within `terminated_by_sigterm`,
SIGTERM raises `Terminated` instead, every ``finally`` runs (players closed,
model caches removed, a window claim released), and the program says so in
one line and exits `EXIT_TERMINATED`.
"""

from __future__ import annotations

import contextlib
import signal


class Terminated(BaseException):
    """SIGTERM arrived (a BaseException, so no player's ``except Exception`` swallows it)."""


@contextlib.contextmanager
def terminated_by_sigterm():
    """Within the block, SIGTERM raises `Terminated` in the main thread: the one way the
    programs that load models and start players (match, GTP, the ladder) stop on SIGTERM.

    SIGTERM's default action (a GUI closing its engine, systemd stopping a
    unit) ends the process without unwinding, so the temporary model cache
    (`inference.model_files.ModelCache`, removed on close or at exit) stayed in
    TMPDIR and GNU Go kept running.  An exception runs every ``finally``
    (players closed, caches closed) and then the atexit handlers.  A second
    SIGTERM is ignored so that it cannot interrupt that clean-up.  The caller
    catches `Terminated`, says so in one line and exits 128 + SIGTERM.
    """

    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


EXIT_TERMINATED = 128 + signal.SIGTERM
"""The exit status of a program stopped by SIGTERM through `terminated_by_sigterm` (the shell's convention)."""
