"""What the launcher tests share: whether a process still runs."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: not gone, and not a zombie waiting for init to reap it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[1].split()[0] != "Z"
