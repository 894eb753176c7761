"""``python -m selfplay.gtp``, the old name of ``python -m arena.gtp``: forwards to it with a one-line warning
(processes.renamed)."""

from processes.renamed import forward

if __name__ == "__main__":
    forward("selfplay.gtp", "arena.gtp")
