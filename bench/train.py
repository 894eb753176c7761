"""Benchmark: the training input pipeline against the training step, on this CPU.

1. Input, no model: examples/s ``model.tfdata.training_dataset`` delivers from GZIP shards (read, shuffle,
   batch, decode, a random symmetry each), 9x9 and 19x19, batch 1024 (``input_examples_per_s_<N>``, per CPU
   second ``input_examples_per_cpu_s_<N>``, ``shard_bytes_per_position_<N>`` with the game table), for the
   17-plane network and a 22-plane one (``..._22_planes``: those planes are computed in the graph).
2. Training: steps/s of the 9x9 network at pinned settings (4 blocks x 32, batch 256, float32; `PINNED_*`),
   and with ``--variants`` the same in bfloat16 (``train_steps_per_s_9_<variant>``).
3. Supply over demand: the input's examples/s over training's (above 1: input is not the bottleneck).

The positions are legal random games (`testdata.random_games.engine_game`, search-shaped targets on a quarter
of the moves) written by the shuffle job's own code into 4 shards and a game table.  On a shared machine the
per-CPU-second rate is the steadier figure.  Ends with one JSON line.

    python bench/train.py [--seconds 8] [--positions 16384] [--variants bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

PIPELINE_BATCH = 1024


VISITS = {9: 200, 19: 800}
SHARDS = 4


def write_shards(folder: str, board_size: int, positions: int) -> list[str]:
    """Paths of shards holding ``positions`` shuffled positions, with their game table beside them."""
    from format import codec, layout
    from pipeline import labels as L
    from pipeline import positions as P
    from testdata.random_games import engine_game

    rng = np.random.default_rng(board_size)
    games, total = [], 0
    while total < positions:
        games.append(engine_game(rng, board_size, visits=VISITS[board_size], full_search_fraction=0.25))
        total += games[-1].num_positions
    labels = L.label_games(
        games,
        policy_fn=None,
        random_playouts=1,
        model_playout_moves=0,
        temperature=1.0,
        playout_weight=0.5,
        rng=rng,
        stats=L.empty_stats(),
    )
    batch = P.games_positions(games, labels, list(range(len(games))), dedup_max_move=0)
    assert batch is not None  # None only for games without positions
    batch = batch.take(rng.permutation(len(batch))[:positions])
    # instance = game index: the game table's rows are the games in order.
    table = codec.GameTable(
        board_size=board_size, generation=np.array([g.generation for g in games]), ownership=P.game_label_rows(labels)
    )
    paths, attempt = [], f"n{board_size}"
    for shard, rows in enumerate(np.array_split(np.arange(len(batch)), SHARDS)):
        path = os.path.join(folder, layout.shard_name(attempt, shard, SHARDS))
        with open(path, "wb") as f:  # what the shuffle job writes (pipeline.transforms.WriteShardFn)
            f.write(codec.encode_shard(batch.take(rows).encode(None, table)))
        paths.append(path)
    with open(os.path.join(folder, layout.game_table_name(attempt)), "wb") as f:
        f.write(codec.encode_game_table(table))
    return paths


def pipeline_rate(shards: list[str], board_size: int, seconds: float, input_planes: int = 17) -> tuple[float, float]:
    """(examples per wall second, examples per CPU second of this process)."""
    from model.tfdata import training_dataset

    dataset = training_dataset(
        shards, board_size=board_size, batch_size=PIPELINE_BATCH, seed=1, input_planes=input_planes
    )
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
PINNED_NETWORK_SETTINGS: dict[str, Any] = dict(
    blocks=4,
    filters=32,
    global_pool_every=0,
    global_pool_channels=8,
    value_head="tanh",
    value_hidden=64,
    policy_head="dense",
)
PINNED_TRAIN_SETTINGS: dict[str, Any] = dict(
    strategy="auto",
    precision="float32",  # "auto" is bfloat16 on AMX CPUs: the --variants measure it
    policy_loss_weight=1.0,
    value_loss_weight=1.0,
    ownership_loss_weight=0.5,
    score_loss_weight=0.2,
    batch_size=256,
    steps_per_call=20,
    learning_rate=0.02,
    momentum=0.9,
    warmup_steps=200,
    lr_schedule="constant",
    swa_decay=0.0,
    shuffle_buffer=8192,
    seed=0,
)


TRAIN_VARIANTS: dict[str, dict[str, Any]] = {"bfloat16": {"precision": "bfloat16"}}
"""``--variants``: trainer settings measured beside the pinned ones, in the same run, each as
``train_steps_per_s_9_<name>``."""


def train_rate(shards: list[str], root: str, seconds: float, **overrides) -> tuple[float, int]:
    from model.config import NetworkConfig, TrainConfig
    from model.sgd import Trainer, resolve_strategy
    from model.tfdata import training_dataset

    config = TrainConfig(
        root=root, network=NetworkConfig(**PINNED_NETWORK_SETTINGS), **{**PINNED_TRAIN_SETTINGS, **overrides}
    )
    resolved = resolve_strategy(config)
    trainer = Trainer(config, config.network_for(9), resolved)
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
    parser.add_argument(
        "--positions", type=int, default=16384, help="9x9 positions (19x19: half); fewer only for a smoke run"
    )
    parser.add_argument(
        "--variants",
        default="",
        help=f"comma-separated trainer variants also timed on 9x9: {', '.join(TRAIN_VARIANTS)}",
    )
    args = parser.parse_args(argv)
    variants = [name for name in args.variants.split(",") if name]
    unknown = [name for name in variants if name not in TRAIN_VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(TRAIN_VARIANTS)})")
    from format import layout
    from format.schema import POSITION_RECORD_VERSION

    result: dict[str, Any] = {"bench": "train"}
    with tempfile.TemporaryDirectory(prefix="zerolake-bench-") as scratch:
        counts = {9: args.positions, 19: args.positions // 2}
        shards = {n: write_shards(scratch, n, counts[n]) for n in (9, 19)}
        for n in (9, 19):
            rate, cpu = pipeline_rate(shards[n], n, args.seconds)
            files = shards[n] + [layout.game_table_beside(shards[n][0])]
            size = sum(os.path.getsize(p) for p in files) / counts[n]
            print(
                f"input pipeline {n:2d}x{n:<2d}: {rate:10.0f} examples/s, {cpu:8.0f} per CPU "
                f"second (batch {PIPELINE_BATCH}, no model; {size:.0f} bytes a position at rest)"
            )
            result[f"input_examples_per_s_{n}"] = round(rate)
            result[f"input_examples_per_cpu_s_{n}"] = round(cpu)
            result[f"shard_bytes_per_position_{n}"] = round(size, 1)
            rate, cpu = pipeline_rate(shards[n], n, args.seconds, input_planes=22)
            print(
                f"input pipeline {n:2d}x{n:<2d}, 22 planes: {rate:10.0f} examples/s, "
                f"{cpu:8.0f} per CPU second (liberties and legal moves computed in the graph)"
            )
            result[f"input_examples_per_s_{n}_22_planes"] = round(rate)
            result[f"input_examples_per_cpu_s_{n}_22_planes"] = round(cpu)
        steps, batch = train_rate(shards[9], os.path.join(scratch, "lake9"), args.seconds)
        consumed = steps * batch
        print(f"training 9x9 default net: {steps:.2f} steps/s at batch {batch} = {consumed:.0f} examples/s")
        ratio = result["input_examples_per_s_9"] / consumed
        print(f"pipeline supply / training demand (9x9): {ratio:.1f}x")
        for name in variants:
            rate, _ = train_rate(
                shards[9], os.path.join(scratch, f"lake9-{name}"), args.seconds, **TRAIN_VARIANTS[name]
            )
            print(f"training 9x9 default net, {name}: {rate:.2f} steps/s ({rate / steps:.2f}x)")
            result[f"train_steps_per_s_9_{name}"] = round(rate, 3)
    result.update(
        {
            "positions_9": args.positions,
            "seconds": args.seconds,
            "record_version": POSITION_RECORD_VERSION,
            "train_steps_per_s_9": round(steps, 3),
            "train_batch_9": batch,
            "train_examples_per_s_9": round(consumed),
            "supply_over_demand_9": round(ratio, 2),
            "cpus": os.cpu_count(),
        }
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
