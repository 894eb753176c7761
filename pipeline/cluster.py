"""``python -m pipeline.cluster``, the old name of ``python -m operations.cluster``: forwards to it with a one-line
warning (processes.renamed)."""

from processes.renamed import forward

if __name__ == "__main__":
    forward("pipeline.cluster", "operations.cluster")
