"""``python -m cloud.deploy``, the old name of ``python -m operations.deploy``: forwards to it with a one-line warning
(processes.renamed)."""

from processes.renamed import forward

if __name__ == "__main__":
    forward("cloud.deploy", "operations.deploy")
