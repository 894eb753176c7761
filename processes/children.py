"""Child processes: how zerolake starts a role as a child process, stops it, and talks meanwhile.

`start_child` runs ``python -m`` in a session and process group of its own (its id is the
child's pid), unbuffered, so a Ctrl-C reaches only the parent, which decides how to stop the
child.  `STOP_GRACE_SECONDS` gives each role's stop time, the same as its systemd unit's
``TimeoutStopSec`` (operations/vm/systemd/).  A launcher turns SIGTERM into KeyboardInterrupt
(`stop_on_sigint_and_sigterm`), so a preempted VM stops it as a Ctrl-C does.

`stop_groups` signals the whole group, not only the child, since a child's own processes (the
shuffle job's Beam workers) would otherwise be left as orphans: SIGTERM (each role's graceful
path), a grace period, then SIGKILL to what is left.  `cpu_seconds_of_trees` (live, from /proc),
`waited_children_cpu_seconds` and `cpu_share` report the CPU the children used.

It imports nothing of the project, so every floor may use it.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
import typing

STOP_GRACE_SECONDS = {"worker": 25.0, "shuffle": 60.0, "train": 120.0, "window": 10.0, "evaluate": 10.0}
"""Seconds a child's process group has after SIGTERM before SIGKILL: the time its graceful path takes
(a worker uploads its spool, the follower releases its claim, a trainer checkpoints), the same as its
systemd unit's TimeoutStopSec, so a role stops alike on a VM and under a launcher."""


def say(message: str) -> None:
    """One line for the person at the terminal, flushed at once (a launcher's output is often piped)."""
    print(message, flush=True)


def start_child(module_argv: typing.Sequence[str], *, env: dict | None = None, **popen) -> subprocess.Popen:
    """``python -m MODULE ARGS...`` as a child in a session of its own (module docstring), unbuffered;
    ``env`` is added to this process's environment; other keywords go to `subprocess.Popen`."""
    return subprocess.Popen(
        [sys.executable, "-m", *module_argv],
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        **popen,
    )


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def stop_on_sigint_and_sigterm() -> None:
    """Ctrl-C and SIGTERM (a preempted VM, systemd) both raise KeyboardInterrupt in the launcher.

    Installed explicitly: a shell that starts a launcher in the background
    hands it SIGINT ignored, which would make Ctrl-C do nothing."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)


def ignore_sigint_and_sigterm() -> None:
    """While a launcher stops its children: the stop itself is not interrupted."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def signal_group(process: subprocess.Popen, signum: int) -> bool:
    """Send ``signum`` to the process group led by ``process``; False when the group is gone."""
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        return False
    return True


def stop_groups(
    processes: typing.Iterable[subprocess.Popen], grace: float | typing.Sequence[float]
) -> list[subprocess.Popen]:
    """Stop the groups of ``processes`` (module docstring); returns those that needed SIGKILL.

    ``grace``: seconds after SIGTERM, one for all or one per process (a
    launcher passes each child's own `STOP_GRACE_SECONDS`).  Every group gets
    SIGTERM at once and the graces run together, so stopping N children takes
    at most the longest grace, not their sum, and a hung worker is killed at
    its own 25 s even while a trainer still has its 120 s.  Each process is
    reaped (``returncode`` is set) on return.
    """
    processes = list(processes)
    graces = [float(grace)] * len(processes) if isinstance(grace, (int, float)) else [float(g) for g in grace]
    if len(graces) != len(processes):
        raise ValueError(f"stop_groups: {len(graces)} grace periods for {len(processes)} processes")
    started = time.monotonic()
    # Shortest grace first: waiting is sequential, so a long grace waited first would delay the
    # kill of a hung child whose own grace ended long before.
    pending = sorted(((started + g, p) for g, p in zip(graces, processes) if p is not None), key=lambda d: d[0])
    for _, process in pending:
        if process.poll() is None:
            signal_group(process, signal.SIGTERM)
    killed = []
    for deadline, process in pending:
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


def waited_children_cpu_seconds() -> float:
    """User + system CPU seconds of every child this process has waited for (and of what they waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_seconds_of_trees(pids: typing.Iterable[int]) -> dict[int, float]:
    """User + system CPU seconds so far of each live process in ``pids`` with every live descendant
    (a follower's window job runs in a session of its own, its Beam workers in the job's), each with
    the children it has waited for, from /proc/<pid>/stat.  A process gone before it was read is left
    out; so is a pid that is not alive.  Empty where there is no /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    own: dict[int, float] = {}
    try:
        listed = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return {}
    for pid in listed:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
        fields = stat[stat.rindex(b")") + 2 :].split()
        parent[pid] = int(fields[1])
        own[pid] = sum(int(f) for f in fields[11:15]) / ticks  # utime, stime, cutime, cstime
    seconds = {}
    for root in pids:
        if root not in own:
            continue
        total = 0.0
        for pid in own:
            ancestor = pid
            while ancestor > 1 and ancestor != root:  # walk up to init, or to the root
                ancestor = parent.get(ancestor, 0)
            if ancestor == root:
                total += own[pid]
        seconds[root] = total
    return seconds


def cpu_share(cpu_seconds: float, wall_seconds: float, cores: int | None = None) -> float:
    """``cpu_seconds`` as a share of every core over ``wall_seconds`` (1.0 = every core all the time)."""
    cores = cores or os.cpu_count() or 1
    return cpu_seconds / wall_seconds / cores if wall_seconds > 0 else 0.0
