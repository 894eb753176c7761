"""``python -m model.train --root ROOT``: train on the newest window and publish.

Wiring only: flags -> TrainConfig (model.config) -> checks that need no TensorFlow (run.json's
board size, a complete window) -> the trainer lease (model.lease) -> strategy ->
model.cycle.TrainingRun.  Exit status: 0 done (one-shot) or stopped by SIGTERM after a checkpoint;
2 refused with one line on stderr (a bad flag, nothing to train, a bad manifest, another trainer's
lease...), before TensorFlow is imported where possible; 3 the lease was lost while training,
nothing published; 4 training diverged, nothing since the last checkpoint kept.  After SIGKILL
the same command resumes from the checkpoint (on the same machine it takes the dead process's
lease at once, elsewhere it waits up to ``--lease-wait``).

    python -m model.train --root lake                       # one window, then exit
    python -m model.train --root lake --follow --events train.jsonl   # forever
    python -m model.train --root gs://bucket/run1 --strategy tpu --tpu my-tpu --batch-size 512
    python -m model.train --root gs://bucket/run1 --stage-dir /mnt/ssd/stage   # via local disk
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

from format import layout
from format.documents import ManifestError
from format.events import EventLog
from format.registry import RegistryError, latest_generation
from model.config import CLI, TrainConfig
from model.lease import LeaseError, LeaseHeld, LeaseLost, TrainerLease
from model.windows import LakeError, lake_board_size, plan_next, scan_windows

EXIT_OK, EXIT_REFUSED, EXIT_LEASE_LOST, EXIT_DIVERGED = 0, 2, 3, 4


def _fail(message: str) -> int:
    print(f"model.train: error: {message}", file=sys.stderr, flush=True)
    return EXIT_REFUSED


def preflight(config: TrainConfig, storage) -> int:
    """Board size of the run; LakeError (or ManifestError) if there is nothing this command could do."""
    board_size = lake_board_size(storage, config.board_size)
    if not config.follow:
        latest = latest_generation(storage)
        scan = scan_windows(storage, board_size, latest)
        if scan.bad:
            others = f" (and {len(scan.bad) - 1} more bad window(s))" if len(scan.bad) > 1 else ""
            raise LakeError(scan.bad[-1].reason + others)
        if plan_next(scan, latest).window is None:
            where = storage.url(layout.WINDOWS_DIR)
            raise LakeError(
                f"no window to train under {where}: none has a complete manifest for "
                f"{board_size}x{board_size} newer than published generation {latest}"
            )
    return board_size


def _install_sigterm(stop: threading.Event) -> None:
    """SIGTERM sets ``stop``: the run saves a checkpoint at the next step-call boundary and exits 0."""

    def handler(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, handler)


def main(argv=None) -> int:
    config, retry = CLI.parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from cloud.storage import StorageError, open_storage

    events = EventLog(config.events or None, "train")
    stop = threading.Event()
    _install_sigterm(stop)
    events.emit("started", strategy=config.strategy, follow=config.follow, root=config.root)
    lease = None

    def refuse(message: str, reason: str) -> int:
        if lease is not None:
            lease.release()
        events.emit("stopped", reason=reason, error=message)
        return _fail(message)

    try:
        storage = open_storage(config.root, retry=retry)
        board_size = preflight(config, storage)
        lease = TrainerLease(storage, config.lease_seconds)
        record = lease.acquire(wait=config.lease_wait, stop=stop)
    except LeaseHeld as exc:
        lease = None  # not ours: nothing to release
        if stop.is_set():  # SIGTERM while --lease-wait waited
            events.emit("stopped", reason="SIGTERM")
            return EXIT_OK
        return refuse(str(exc), "lease held")
    except (LakeError, ValueError, StorageError, RegistryError, LeaseError) as exc:
        lease = None
        return refuse(str(exc), "refused")
    print(
        f"[train] holding the trainer lease {lease.url} as {record.holder} (expires after "
        f"{config.lease_seconds:.0f} s unless renewed every {lease.renew_every:.0f} s)",
        flush=True,
    )
    events.emit("lease_acquired", holder=record.holder, expires=record.expires)
    lease.start_renewing()

    from inference.devices import AcceleratorMissing
    from model.cycle import (  # TensorFlow from here on
        CheckpointMismatch,
        CheckpointStateError,
        CheckpointWriteError,
        Diverged,
        TrainingRun,
    )
    from model.sgd import resolve_strategy
    from model.staging import StagingError

    try:
        resolved = resolve_strategy(config)
        run = TrainingRun(config, storage, board_size, resolved, lease=lease, events=events, stop=stop)
        status = run.run()
    except LeaseLost as exc:
        lease.stop_renewing()
        events.emit("stopped", reason="lease lost", error=str(exc))
        print(f"model.train: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_LEASE_LOST
    except Diverged as exc:
        lease.release()
        events.emit("stopped", reason="diverged", error=str(exc))
        print(f"model.train: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_DIVERGED
    except (
        LakeError,
        CheckpointMismatch,
        CheckpointStateError,
        CheckpointWriteError,
        StagingError,
        StorageError,
        AcceleratorMissing,
        RegistryError,
        LeaseError,
        ManifestError,
    ) as exc:
        return refuse(str(exc), "error")
    lease.release()
    events.emit("stopped", reason=run.stop_reason)
    if run.stop_reason == "SIGTERM":
        print("[train] stopped by SIGTERM", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
