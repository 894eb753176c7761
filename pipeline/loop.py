"""``python -m pipeline.loop``, the old name of ``python -m operations.loop``: forwards to it with a one-line warning
(processes.renamed)."""

from processes.renamed import forward

if __name__ == "__main__":
    forward("pipeline.loop", "operations.loop")
