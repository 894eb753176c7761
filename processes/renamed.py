"""Old ``python -m`` names of moved entry points: each still works, forwarding to its new name.

A script, a systemd unit or a GUI's engine command written before the move
names, say, ``python -m selfplay.gtp``.  The module left at that name calls
`forward`, which says in one line on stderr where the program lives now and
replaces this process with ``python -m NEW`` and the same arguments
(``os.execv``: the same pid, so a unit keeps tracking it, and the same
stdin and stdout, so a GTP engine's protocol stream is untouched).

Nothing here imports the new module: the forward is a new program, not an
import, so an old name on a low floor never imports a floor above it.
"""

from __future__ import annotations

import os
import sys


def forward(old: str, new: str) -> None:
    """Run ``python -m new`` with this process's arguments, after a one-line warning naming both."""
    print(
        f"{old}: this command moved; running python -m {new} (use that name from now on)", file=sys.stderr, flush=True
    )
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", new, *sys.argv[1:]])
