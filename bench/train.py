"""Benchmark: training input pipeline vs training speed, on this CPU.

1. Input pipeline, no model: examples/s that ``format.tfdata.training_dataset``
   delivers from GZIP shards (read, shuffle, batch, parse, unpack, random
   symmetry per example), for 9x9 and 19x19, batch 1024.
2. Training: steps/s of the default 9x9 network (TrainConfig defaults:
   4 blocks x 32 filters, batch 256, float32, default strategy) fed by the
   same pipeline.
3. The ratio: examples/s the pipeline can supply over examples/s training
   consumes (above 1 means the input is not the bottleneck).

Shards are synthetic (testdata.synthetic_windows) in a temporary lake.  Timings on a
shared 2-core machine are noisy, so the pipeline is also measured per CPU
second of this process (all its threads), which other load disturbs much
less; on two idle cores the wall rate approaches twice that figure.  Ends
with one JSON line.

    python bench/train.py [--seconds 8]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cloud.storage import open_storage  # noqa: E402
from format import layout  # noqa: E402
from testdata import synthetic_windows as synthetic  # noqa: E402

PIPELINE_BATCH = 1024


def write_window(root: str, board_size: int, positions: int) -> list[str]:
    storage = open_storage(root)
    manifest = synthetic.write_synthetic_window(storage, target_generation=1, board_size=board_size,
                                                positions=positions, shards=4, seed=board_size)
    return [storage.url(layout.shard_path(1, name)) for name in manifest["shards"]]


def pipeline_rate(shards: list[str], board_size: int, seconds: float) -> tuple[float, float]:
    """(examples per wall second, examples per CPU second of this process)."""
    from format.tfdata import training_dataset

    dataset = training_dataset(shards, board_size=board_size, batch_size=PIPELINE_BATCH, seed=1)
    iterator = iter(dataset)
    for _ in range(5):  # warm-up: tracing, XLA compilation, buffers filling
        next(iterator)
    examples, start, cpu_start = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        batch = next(iterator)
        examples += int(batch["value"].shape[0])
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return examples / wall, examples / cpu


# The network and step settings the steps/s figure depends on, pinned at the
# values it was first measured with: changing TrainConfig's defaults (the
# learning work tunes them) moves no bench figure.
PINNED_TRAIN_SETTINGS = dict(
    strategy="auto", precision="auto", blocks=4, filters=32, global_pool_every=0, global_pool_channels=8,
    value_head="tanh", value_hidden=64, policy_loss_weight=1.0, value_loss_weight=1.0,
    ownership_loss_weight=0.5, score_loss_weight=0.2, batch_size=256, steps_per_call=20, learning_rate=0.02,
    momentum=0.9, warmup_steps=200, lr_schedule="constant", swa_decay=0.0, shuffle_buffer=8192, seed=0,
)


def train_rate(shards: list[str], root: str, seconds: float) -> tuple[float, int]:
    from format.tfdata import training_dataset
    from model.config import TrainConfig
    from model.trainer import Trainer, network_config, resolve_strategy

    config = TrainConfig(root=root, **PINNED_TRAIN_SETTINGS)
    resolved = resolve_strategy(config)
    trainer = Trainer(config, network_config(config, 9), resolved)
    dataset = training_dataset(shards, board_size=9, batch_size=trainer.global_batch, seed=2)
    iterator = iter(resolved.strategy.experimental_distribute_dataset(dataset))
    trainer.train_steps(iterator, config.steps_per_call)  # warm-up: tracing
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        trainer.train_steps(iterator, config.steps_per_call)
        steps += config.steps_per_call
    return steps / (time.perf_counter() - start), trainer.global_batch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds per measurement")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zerolake-bench-") as scratch:
        shards9 = write_window(os.path.join(scratch, "lake9"), 9, 16384)
        shards19 = write_window(os.path.join(scratch, "lake19"), 19, 8192)
        rate9, cpu9 = pipeline_rate(shards9, 9, args.seconds)
        print(f"input pipeline  9x9 : {rate9:10.0f} examples/s, {cpu9:8.0f} per CPU second "
              f"(batch {PIPELINE_BATCH}, no model)")
        rate19, cpu19 = pipeline_rate(shards19, 19, args.seconds)
        print(f"input pipeline 19x19: {rate19:10.0f} examples/s, {cpu19:8.0f} per CPU second "
              f"(batch {PIPELINE_BATCH}, no model)")
        steps, batch = train_rate(shards9, os.path.join(scratch, "lake9"), args.seconds)
        consumed = steps * batch
        print(f"training 9x9 default net: {steps:.2f} steps/s at batch {batch} = {consumed:.0f} examples/s")
        ratio = rate9 / consumed
        print(f"pipeline supply / training demand (9x9): {ratio:.1f}x")
    print(json.dumps({"bench": "train", "input_examples_per_s_9": round(rate9),
                      "input_examples_per_s_19": round(rate19),
                      "input_examples_per_cpu_s_9": round(cpu9), "input_examples_per_cpu_s_19": round(cpu19),
                      "train_steps_per_s_9": round(steps, 3), "train_batch_9": batch,
                      "train_examples_per_s_9": round(consumed), "supply_over_demand_9": round(ratio, 2),
                      "cpus": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
