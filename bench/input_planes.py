"""Held-out losses of a 17-plane and a 22-plane network trained alike on one saved window.

Before an input-planes A/B: does the wider input (format/planes.py) let the same network fit the
same data better on positions it never trained on?  For each width, in the same run: a fresh
network of the loop's shape (TrainConfig defaults) trains ``--steps`` steps on window ``--window``
of ``--lake`` with the same seed, then the first `HELDOUT_POSITIONS` positions of that window of
``--heldout-lake`` (another run's, so unseen but alike in strength) are evaluated without
augmentation: policy cross-entropy, top-1 accuracy, value MSE, ownership and score losses.
Ends with one JSON line; ``delta_*`` is 22 planes minus 17 (negative: the wider input fits better).

    python bench/input_planes.py --lake RUNS/a1 --heldout-lake RUNS/a2 --window 6 [--steps 500]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WIDTHS = (17, 22)
HELDOUT_BATCH = 512
HELDOUT_POSITIONS = 65536
"""Held-out positions measured: the window's first ones (its shards are shuffled, so a fair sample);
a whole 1M-position window would take minutes to evaluate for no more information."""
REPORTED = ("policy_loss", "policy_accuracy", "value_mse", "ownership_loss", "score_loss")


def window_shards(lake: str, generation: int) -> tuple[list[str], int]:
    """(the window's shard paths, its board size), read through the lake's one manifest reader."""
    from cloud.storage import open_storage
    from format.window_manifest import read_window_manifest

    storage = open_storage(lake)
    manifest = read_window_manifest(storage, generation, check_shards=True)
    return [storage.url(path) for path in manifest.shards], manifest.board_size


def heldout_metrics(trainer, shards: list[str], board_size: int, input_planes: int) -> dict:
    """Mean losses of ``trainer``'s network over every position of ``shards`` (no augmentation, one pass)."""
    import tensorflow as tf

    from model.sgd import head_losses, summarize
    from model.tfdata import training_dataset

    dataset = training_dataset(
        shards,
        board_size=board_size,
        batch_size=HELDOUT_BATCH,
        seed=0,
        augment=False,
        repeat=False,
        input_planes=input_planes,
    ).take(HELDOUT_POSITIONS // HELDOUT_BATCH)

    @tf.function
    def sums_of(batch):
        outputs = trainer.model(batch["planes"], training=False)
        heads = head_losses(outputs, batch, trainer.net_config)
        heads["examples"] = tf.cast(tf.shape(batch["value"])[0], tf.float32)
        heads["total_loss_sum"] = tf.constant(0.0)
        return heads

    totals: dict = {}
    for batch in dataset:
        for key, value in sums_of(batch).items():
            totals[key] = totals.get(key, 0.0) + float(value)
    return {**summarize(totals), "positions": int(totals.get("examples", 0))}


def train_and_measure(
    width: int, train: list[str], heldout: list[str], board_size: int, steps: int, scratch: str
) -> dict:
    from model.config import NetworkConfig, TrainConfig
    from model.sgd import Trainer, resolve_strategy
    from model.tfdata import training_dataset

    config = TrainConfig(
        root=os.path.join(scratch, f"lake{width}"),
        network=NetworkConfig(input_planes=width),
        warmup_steps=50,
        steps_per_call=50,
        seed=0,
    )
    resolved = resolve_strategy(config)
    trainer = Trainer(config, config.network_for(board_size), resolved)
    dataset = training_dataset(
        train, board_size=board_size, batch_size=trainer.global_batch, seed=1, input_planes=width
    )
    iterator = iter(resolved.strategy.experimental_distribute_dataset(dataset))
    started = time.perf_counter()
    for _ in range(steps // config.steps_per_call):
        trainer.train_steps(iterator, config.steps_per_call)
    seconds = time.perf_counter() - started
    result = heldout_metrics(trainer, heldout, board_size, width)
    result["train_seconds"] = round(seconds, 1)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lake", required=True, help="the lake to train on (e.g. a bench/learning.py run)")
    parser.add_argument("--heldout-lake", required=True, help="another run's lake, to measure on (unseen games)")
    parser.add_argument("--window", type=int, required=True, help="generation of the window, in both lakes")
    parser.add_argument("--steps", type=int, default=500, help="training steps of 256 (the loop's per window)")
    args = parser.parse_args(argv)
    if os.path.realpath(args.lake) == os.path.realpath(args.heldout_lake):
        parser.error("--heldout-lake must be another run's lake: a lake's windows share their games")
    train, board_size = window_shards(args.lake, args.window)
    heldout, heldout_size = window_shards(args.heldout_lake, args.window)
    if heldout_size != board_size:
        parser.error(f"the windows are {board_size}x{board_size} and {heldout_size}x{heldout_size}")
    result: dict = {
        "bench": "input_planes",
        "lake": args.lake,
        "heldout_lake": args.heldout_lake,
        "window": args.window,
        "steps": args.steps,
    }
    with tempfile.TemporaryDirectory(prefix="zerolake-bench-") as scratch:
        for width in WIDTHS:
            metrics = train_and_measure(width, train, heldout, board_size, args.steps, scratch)
            print(
                f"{width} planes: "
                + ", ".join(f"{key} {metrics[key]:.4f}" for key in REPORTED)
                + f" on {metrics['positions']} held-out positions; trained in {metrics['train_seconds']} s",
                flush=True,
            )
            for key in (*REPORTED, "positions", "train_seconds"):
                result[f"{key}_{width}"] = round(metrics[key], 4) if isinstance(metrics[key], float) else metrics[key]
    for key in REPORTED:
        result[f"delta_{key}"] = round(result[f"{key}_22"] - result[f"{key}_17"], 4)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
