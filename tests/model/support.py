"""Shared helper of the trainer tests: run `python -m model.train` and SIGKILL it mid-run.

(No tests here; the name keeps pytest from collecting it.)
"""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]


def run_until_killed(command, marker: str, env=None) -> str:
    """Run ``command`` from the repo root, SIGKILL it at the first output line holding
    ``marker``, and return everything it printed (asserting it died of the SIGKILL)."""
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if marker in line:
                os.kill(process.pid, signal.SIGKILL)
                break
        lines.extend(process.stdout.read().splitlines(keepends=True))
    finally:
        process.kill()
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL, "".join(lines)
    return "".join(lines)
