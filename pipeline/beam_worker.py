"""The SDK worker process of the shuffle job's local runner.

``python -m pipeline.shuffle`` runs locally on Beam's FnApiRunner with ``--workers`` worker
processes, each running Beam's SDK harness unchanged; this entry point changes only how it ends
and what it prints.  Dataflow and other runners start their own workers and never use it.

* Ending: the process exits right after the harness returns, skipping the interpreter teardown
  that the runner would wait for worker by worker.  Nothing is lost: every write has completed
  through `cloud.storage` by then, streams are flushed, and the model cache lives in a job folder
  the driver removes.  A harness exception exits the ordinary way, with its traceback.
* Stopping: SIGTERM is ignored, so a launcher stopping the job's process group does not kill a
  worker mid-bundle; the driver stops instead and closes the control channel, on which each worker
  finishes and exits.  SIGKILL still ends a worker at once.
* Printing: a failed instruction's traceback is not printed by the worker
  (`WithoutInstructionTracebacks`): the runner receives it and decides what the person sees.
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
        whole_traceback = text.startswith(TRACEBACK_HEADER) and "\n" in text[len(TRACEBACK_HEADER) :]
        if whole_traceback or (self._dropped and text == "\n"):
            self._dropped = whole_traceback
            return len(text)
        self._dropped = False
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def main() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the driver stops its workers (module docstring)
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
