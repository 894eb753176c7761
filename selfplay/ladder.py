"""``python -m selfplay.ladder``, the old name of ``python -m arena.ladder``: forwards to it with a one-line warning
(processes.renamed)."""

from processes.renamed import forward

if __name__ == "__main__":
    forward("selfplay.ladder", "arena.ladder")
