"""``python -m selfplay.match``, the old name of ``python -m arena.match``: forwards to it with a one-line warning
(processes.renamed)."""

from processes.renamed import forward

if __name__ == "__main__":
    forward("selfplay.match", "arena.match")
