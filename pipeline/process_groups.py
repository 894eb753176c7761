"""Child processes that run in a process group of their own, and the one way to stop them.

The launchers (pipeline.loop, pipeline.cluster) and the shuffle follower
(pipeline.follow) start each child with ``start_new_session=True``: the child
leads a new session and process group whose id is its pid, so a Ctrl-C at the
terminal reaches only the parent, which then decides how to stop the child.

*Why the group, not only the child.*  A child may start processes of its own:
the shuffle job runs Beam's SDK worker processes (``--workers``), which
inherit its group.  Signalling only the child can leave them running as
orphans (still writing temporary pieces, still holding CPU); signalling the
group reaches every one of them.  So :func:`stop_groups` sends SIGTERM to each
group (the roles' graceful path: a worker uploads its spool, a trainer
checkpoints, a follower releases its claim), waits up to a grace period,
SIGKILLs the groups whose leader is still running, and finally SIGKILLs
whatever is left in every group (processes that outlived their leader).

This module lives in ``pipeline`` (layer 3 of tests/test_layering.py) so that
both the follower and the launchers above it may import it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
import typing


def signal_group(process: subprocess.Popen, signum: int) -> bool:
    """Send ``signum`` to the process group led by ``process``; False when the group is gone."""
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        return False
    return True


def stop_groups(processes: typing.Iterable[subprocess.Popen], grace: float) -> list[subprocess.Popen]:
    """Stop the groups of ``processes`` (module docstring); returns those that needed SIGKILL.

    Every group gets SIGTERM at once and the ``grace`` seconds run for all of
    them together, so stopping N children takes at most ``grace``, not N
    times it.  Each process is reaped (``returncode`` is set) on return.
    """
    processes = [p for p in processes if p is not None]
    for process in processes:
        if process.poll() is None:
            signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace
    killed = []
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(process, signal.SIGKILL)
            process.wait()
            killed.append(process)
        signal_group(process, signal.SIGKILL)  # what outlived its leader (Beam's SDK workers)
    return killed


def die_with_parent(parent_pid: int):
    """A ``preexec_fn``: the child gets SIGKILL when its parent dies (Linux PR_SET_PDEATHSIG).

    For a child that must not outlive a parent that was SIGKILLed (the
    follower's window job, which would otherwise build on with nobody
    renewing its claim).  ``parent_pid``: the parent's pid, read before the
    fork, to catch a parent that died before prctl took effect.
    """
    def setup():
        try:
            import ctypes  # in the forked child only: ctypes is not needed elsewhere

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() != parent_pid:
            os._exit(1)  # the parent died before prctl took effect
    return setup
