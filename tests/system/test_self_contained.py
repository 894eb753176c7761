"""The repository stands on its own: no file points at documents outside it.

Facts the code relies on live in docs/ (docs/measured.md); a reference to a
notes file that only some checkouts have is a dead link for everyone else.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ("../" + "shared", "DESIGN" + ".md", "STYLE" + ".md")   # spelled apart: this file is no reference


def test_no_file_refers_to_a_document_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in tracked:
        if name.endswith((".png", ".gz", ".zst")):
            continue
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        hits += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if any(o in line for o in OUTSIDE)]
    assert not hits, "references to files outside the repository:\n" + "\n".join(hits)
