"""The SDK worker process of the shuffle job's local runner.

``python -m pipeline.shuffle`` runs locally on Beam's FnApiRunner with one
worker process per ``--workers``.  Each process runs Beam's own SDK harness
(``apache_beam.runners.worker.sdk_worker_main``) unchanged; this entry point
only changes how it ends.  When the runner closes the control channel the
harness finishes its work, flushes its logs and returns; after that,
Python's ordinary interpreter teardown (gRPC channels and threads) took
~0.4 s per worker here, and the runner stops its workers one after another,
so every local job paid ~0.4 s x workers doing nothing.  Here the process
exits right after the harness returns.

Nothing is lost by skipping the teardown: every object the job writes goes
through `cloud.storage` calls that have completed (files written and closed)
before the harness returns, and stdout/stderr are flushed first.  If the
harness raises, the exception propagates and the process exits the ordinary
way, with the traceback and a non-zero status.

Dataflow and other runners start their own workers and never use this file.
"""
from __future__ import annotations

import os
import sys


def main() -> None:
    from apache_beam.runners.worker import sdk_worker_main

    sdk_worker_main.main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
