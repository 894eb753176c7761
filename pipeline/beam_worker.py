"""The SDK worker process of the shuffle job's local runner.

``python -m pipeline.shuffle`` runs locally on Beam's FnApiRunner with one
worker process per ``--workers``.  Each process runs Beam's own SDK harness
(``apache_beam.runners.worker.sdk_worker_main``) unchanged; this entry point
changes only how it ends and what it prints.

How it ends: when the runner closes the control channel the harness finishes
its work, flushes its logs and returns; after that, Python's ordinary
interpreter teardown (gRPC channels and threads) took ~0.4 s per worker here,
and the runner stops its workers one after another, so every local job paid
~0.4 s x workers doing nothing.  Here the process exits right after the
harness returns.  Nothing is lost by skipping the teardown: every object the
job writes goes through `cloud.storage` calls that have completed (files
written and closed) before the harness returns, stdout/stderr are flushed
first, and what a worker keeps in local temporary folders (the model it
labels with) lives in a folder of the job's that the driver removes
(pipeline.transforms.LabelBundleFn.model_cache), since nothing of the
worker's own runs at exit.  If the harness raises, the exception propagates
and the process exits the ordinary way, with the traceback and a non-zero
status.

How it stops: SIGTERM is ignored.  The worker shares its driver's process
group, so a launcher stopping the job's group (operations.loop, a follower)
reaches every worker too; killed in the middle of a bundle, a worker left a
half-written temporary file and made the runner's threads print tracebacks
about it.  The driver stops on SIGTERM instead (pipeline.shuffle), and Beam's
runner then closes the control channel, on which each worker finishes and
exits, before the driver removes the job's temporary files.  A driver that
dies outright closes the channel too; SIGKILL still ends a worker at once.

What it prints: the harness prints the traceback of every instruction (a
bundle) that failed to stderr, and also sends it to the runner, in the
instruction's response and its log service.  The runner's side decides what
the person sees (pipeline.shuffle: a lake error, such as a full disk, in one
line; anything else, a bug, with its traceback), so the worker's own copy is
not printed (`WithoutInstructionTracebacks`).

Dataflow and other runners start their own workers and never use this file.
"""
from __future__ import annotations

import os
import signal
import sys

TRACEBACK_HEADER = "Traceback (most recent call last):\n"


class WithoutInstructionTracebacks:
    """A text stream that passes everything to ``stream`` but whole formatted tracebacks.

    The harness prints a failed instruction's traceback in one write (the text
    of ``traceback.format_exc()``), then a newline; Python's own reports (an
    exception in a thread, at exit) are written line by line, and pass.
    """

    def __init__(self, stream):
        self.stream = stream
        self._dropped = False

    def write(self, text: str) -> int:
        whole_traceback = text.startswith(TRACEBACK_HEADER) and "\n" in text[len(TRACEBACK_HEADER):]
        if whole_traceback or (self._dropped and text == "\n"):
            self._dropped = whole_traceback
            return len(text)
        self._dropped = False
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def main() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # the driver stops its workers (module docstring)
    from apache_beam.runners.worker import sdk_worker_main

    stderr = sys.stderr
    sys.stderr = WithoutInstructionTracebacks(stderr)
    try:
        sdk_worker_main.main(sys.argv)
    finally:
        sys.stderr = stderr
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
