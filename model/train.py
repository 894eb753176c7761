"""``python -m model.train --root ROOT``: train on the newest window and publish.

Wiring only: flags -> TrainConfig (model.config) -> checks that need no
TensorFlow (run.json's board size, a complete window to train) -> strategy
-> model.training_run.TrainingRun.  Every refusal is one clear line on stderr and
exit status 2, before TensorFlow is imported where possible.

Examples::

    python -m model.train --root lake                       # one window, then exit
    python -m model.train --root lake --follow              # keep training new windows
    python -m model.train --root gs://bucket/run1 --strategy tpu --tpu my-tpu --batch-size 512
    python -m model.train --root gs://bucket/run1 --stage-dir /mnt/ssd/stage   # via local disk
"""
from __future__ import annotations

import logging
import sys

from format.registry import latest_generation
from model.config import TrainConfig, config_from_args
from model.windows import LakeError, complete_windows, lake_board_size, newest_untrained


def _fail(message: str) -> int:
    print(f"model.train: error: {message}", file=sys.stderr, flush=True)
    return 2


def preflight(config: TrainConfig, storage) -> int:
    """Board size of the run; LakeError if there is nothing this command could do."""
    board_size = lake_board_size(storage, config.board_size)
    if not config.follow:
        windows = complete_windows(storage, board_size)
        latest = latest_generation(storage)
        if newest_untrained(windows, latest) is None:
            where = storage.url("windows")
            raise LakeError(
                f"no window to train under {where}: none has a complete MANIFEST.json for "
                f"{board_size}x{board_size} newer than published generation {latest}"
                + (f" (found complete windows {[w.target_generation for w in windows]})" if windows else ""))
    return board_size


def main(argv=None) -> int:
    config = config_from_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from cloud.storage import StorageError, open_storage

    try:
        storage = open_storage(config.root)
        board_size = preflight(config, storage)
    except (LakeError, ValueError, StorageError) as exc:
        return _fail(str(exc))

    from model.training_run import CheckpointMismatch, TrainingRun  # TensorFlow from here on
    from model.staging import StagingError
    from model.trainer import StrategyUnavailable, resolve_strategy

    try:
        resolved = resolve_strategy(config)
    except StrategyUnavailable as exc:
        return _fail(str(exc))
    try:
        return TrainingRun(config, storage, board_size, resolved).run()
    except (LakeError, CheckpointMismatch, StagingError, StorageError) as exc:
        return _fail(str(exc))


if __name__ == "__main__":
    sys.exit(main())
