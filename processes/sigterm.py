"""Stopping on SIGTERM: the one way the programs that hold resources stop when told to.

A GUI closing its GTP engine, systemd stopping a unit, or a launcher stopping
a one-shot shuffle job sends SIGTERM.  Its default action ends the process
without unwinding: no ``finally`` runs.  Within `terminated_by_sigterm`,
SIGTERM raises `Terminated` instead, every ``finally`` runs (players closed,
model caches removed, a window claim released), and the program says so in
one line and exits `EXIT_TERMINATED`.  `sigterm_when_orphaned` turns a dead parent into that signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time


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


def sigterm_when_orphaned(poll_seconds: float = 1.0) -> threading.Thread:
    """Send this process SIGTERM when its parent dies (its parent pid changes), from a daemon thread.

    A GUI that starts an engine through a shell (KaTrain's custom engine command runs under ``sh -c``)
    stops it by signalling the shell: Debian's dash does not exec the command, so the engine outlived
    the shell, holding the GUI's pipes open, and the GUI hung joining its reader threads.  Polling the
    parent pid works whatever thread started us (PR_SET_PDEATHSIG fires when the starting *thread*
    exits) and on every POSIX system.  With `terminated_by_sigterm` the signal unwinds as a stop would.
    """
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="orphan-watch", daemon=True)
    thread.start()
    return thread
