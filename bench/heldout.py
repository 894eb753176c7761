"""Held-out check of training changes: arms trained alike on one run's games, scored on another run's.

Before an A/B of a change to what the shuffle job writes or how the trainer weighs it
(``--shuffle-value-only-rows``, ``--train-loss-normalization``...): does the change fit unseen
games better, against targets no arm chose?  For each arm and training seed, on the same games:
1. a scratch lake gets ``--lake``'s run.json and its chunks below ``--window`` (copies), and the
   shuffle job builds one window with the arm's ``--shuffle-*`` flags;
2. a fresh network of the loop's shape trains ``--steps`` steps on it with the arm's
   ``--train-*`` flags and the seed (same initial weights in every arm);
3. it is scored on ``--heldout-lake``'s chunks of generation 1 and above (another run's) against
   targets no arm chose: each full-search move's recorded policy and each decided game's result.

Reported per arm (mean over seeds, and each seed's): policy cross-entropy, top-1 agreement, value
MSE, and ``delta_*`` from the first arm (negative: better).  One JSON line.  Run it alone.

    python bench/heldout.py --lake RUNS/a1 --heldout-lake RUNS/a2 --window 8 \\
        --arm base= --arm weight='--train-loss-normalization weight' \\
        --arm value0='--shuffle-value-only-rows 0' --seeds 2
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

REPORTED = ("policy_ce", "policy_top1", "value_mse")
HELDOUT_BATCH = 512


def parse_arm(text: str) -> tuple[str, list[str], list[str]]:
    """``NAME=FLAGS`` -> (name, shuffle argv, train argv).  Flags are ``--shuffle-X V`` or
    ``--train-X V`` (as operations.loop and operations.cluster spell role settings)."""
    name, sep, flags = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(
            f"--arm {text!r}: write NAME=FLAGS, e.g. weight='--train-loss-"
            "normalization weight' (NAME letters, digits, _)"
        )
    shuffle: list[str] = []
    train: list[str] = []
    words = shlex.split(flags)
    for i, word in enumerate(words):
        if word.startswith("--shuffle-"):
            target, word = shuffle, "--" + word[len("--shuffle-") :]
        elif word.startswith("--train-"):
            target, word = train, "--" + word[len("--train-") :]
        elif word.startswith("--"):
            raise argparse.ArgumentTypeError(f"--arm {name}: {word} is neither --shuffle-* nor --train-*")
        else:
            if i == 0:
                raise argparse.ArgumentTypeError(f"--arm {name}: {word!r} follows no flag")
            target.append(word)
            continue
        target.append(word)
    return name, shuffle, train


def chunk_paths(lake: str, generations) -> list[str]:
    """Chunk paths (relative to the lake) of the given generations, oldest generation first."""
    from cloud.storage import open_storage
    from format import layout

    found = []
    for info in open_storage(lake).list(layout.games_prefix()):
        chunk = layout.parse_chunk_path(info.path)
        if chunk is not None and chunk.generation in generations:
            found.append((chunk.generation, info.path))
    return [path for _, path in sorted(found)]


def scratch_lake(lake: str, window: int, folder: str) -> str:
    """A new lake in ``folder``: ``lake``'s run.json and its chunks of generations below ``window``."""
    from cloud.storage import open_storage
    from format import layout

    source, target = open_storage(lake), open_storage(folder)
    target.write_new(layout.RUN_CONFIG, source.read(layout.RUN_CONFIG))
    paths = chunk_paths(lake, range(window))
    if not paths:
        raise SystemExit(f"bench/heldout.py: {lake} holds no chunks of generations below {window}")
    for path in paths:
        target.write_new(path, source.read(path))
    return folder


def build_window(root: str, shuffle_flags: list[str], seed: int) -> list[str]:
    """Run the shuffle job on ``root``; the shard URLs of the window it wrote (the one after LATEST)."""
    from cloud.storage import open_storage
    from format import registry
    from format.window_manifest import read_window_manifest

    done = subprocess.run(
        [sys.executable, "-m", "pipeline.shuffle", "--root", root, "--seed", str(seed + 1), *shuffle_flags],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"bench/heldout.py: the shuffle job failed ({shlex.join(shuffle_flags)}):\n" + done.stderr[-3000:]
        )
    storage = open_storage(root)
    manifest = read_window_manifest(storage, (registry.latest_generation(storage) or 0) + 1, check_shards=True)
    return [storage.url(path) for path in manifest.shards]


def heldout_set(lake: str, max_positions: int, channels: int) -> dict:
    """Input planes and fixed targets of held-out positions (module docstring, step 3).

    ``planes`` float32[P, N, N, C]; ``policy_index``/``policy_prob``/``policy_offsets``: each
    full-search position's recorded policy (sparse, as the chunk holds it), empty for others;
    ``value`` float32[P] the result from the side to move, ``value_known`` bool[P].
    """
    from cloud.storage import open_storage
    from format import codec, schema
    from format.planes import input_planes

    storage = open_storage(lake)
    paths = chunk_paths(lake, range(1, 1 << 30))
    planes, index, prob, offsets, value, known = [], [], [], [0], [], []
    for path in paths:
        for game in codec.iter_chunk(storage.read(path), storage.url(path)):
            if isinstance(game, codec.FormatError):
                continue
            boards = [black.astype(np.int8) - white.astype(np.int8) for black, white in game.planes]
            for i in range(game.num_positions):
                mover = schema.BLACK if i % 2 == 0 else schema.WHITE
                planes.append(
                    input_planes(boards[max(0, i - schema.HISTORY_LENGTH + 1) : i + 1][::-1], mover, channels)
                )
                if game.full_search[i]:
                    entries, probs = game.policy_probs(i)
                    index.append(entries)
                    prob.append(probs)
                    offsets.append(offsets[-1] + len(entries))
                else:
                    offsets.append(offsets[-1])
                value.append(float(game.winner * mover))
                known.append(game.winner != 0)
                if len(planes) >= max_positions:
                    break
            if len(planes) >= max_positions:
                break
        if len(planes) >= max_positions:
            break
    if not planes:
        raise SystemExit(f"bench/heldout.py: {lake} holds no readable chunks of generation 1 or later")
    return {
        "planes": np.stack(planes),
        "policy_index": np.concatenate(index) if index else np.zeros(0, np.int64),
        "policy_prob": np.concatenate(prob) if prob else np.zeros(0, np.float32),
        "policy_offsets": np.asarray(offsets, np.int64),
        "value": np.asarray(value, np.float32),
        "value_known": np.asarray(known, bool),
    }


def score(model, held: dict) -> dict:
    """Policy cross-entropy and top-1 agreement against the recorded policies, value MSE against results."""
    ce_sum = top1 = policy_rows = 0.0
    sq_sum = value_rows = 0.0
    offsets = held["policy_offsets"]
    for lo in range(0, len(held["planes"]), HELDOUT_BATCH):
        hi = min(lo + HELDOUT_BATCH, len(held["planes"]))
        outputs = model(held["planes"][lo:hi], training=False)
        logits = np.asarray(outputs["policy_logits"], np.float64)
        log_probs = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
        values = np.asarray(outputs["value"], np.float64)
        for row in range(lo, hi):
            start, stop = offsets[row], offsets[row + 1]
            if stop > start:
                entries, probs = held["policy_index"][start:stop], held["policy_prob"][start:stop]
                ce_sum -= float(np.dot(probs, log_probs[row - lo, entries]))
                top1 += float(np.argmax(logits[row - lo]) == entries[np.argmax(probs)])
                policy_rows += 1
        known = held["value_known"][lo:hi]
        sq_sum += float(np.sum((values[known] - held["value"][lo:hi][known]) ** 2))
        value_rows += float(np.count_nonzero(known))
    return {
        "policy_ce": ce_sum / max(policy_rows, 1),
        "policy_top1": top1 / max(policy_rows, 1),
        "value_mse": sq_sum / max(value_rows, 1),
        "policy_rows": int(policy_rows),
        "value_rows": int(value_rows),
    }


def train_arm(root: str, shards: list[str], train_flags: list[str], seed: int, steps: int, board_size: int):
    """A fresh network trained ``steps`` steps on ``shards`` with the arm's trainer flags; its Keras model."""
    from model.config import CLI as TRAIN_CLI
    from model.sgd import Trainer, resolve_strategy
    from model.tfdata import training_dataset

    config, _ = TRAIN_CLI.parse(["--root", root, "--seed", str(seed), "--warmup-steps", "50", *train_flags])
    call = min(config.steps_per_call, steps)
    resolved = resolve_strategy(config)
    trainer = Trainer(config, config.network_for(board_size), resolved)
    dataset = training_dataset(
        shards,
        board_size=board_size,
        batch_size=trainer.global_batch,
        seed=seed,
        input_planes=config.network.input_planes,
    )
    iterator = iter(resolved.strategy.experimental_distribute_dataset(dataset))
    for _ in range(max(1, steps // call)):
        trainer.train_steps(iterator, call)
    return trainer.model, config.network.input_planes


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/heldout.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lake", required=True, help="the run whose games every arm trains on")
    parser.add_argument(
        "--heldout-lake",
        required=True,
        help="another run's lake: its games of generation 1 and later are the held-out set",
    )
    parser.add_argument(
        "--window", type=int, required=True, help="train on --lake's chunks of generations below this (>= 1)"
    )
    parser.add_argument(
        "--arm",
        action="append",
        type=parse_arm,
        required=True,
        help="NAME=FLAGS, repeated; the first arm is the reference of the deltas. FLAGS are "
        "--shuffle-* and --train-* settings, e.g. base= (the defaults)",
    )
    parser.add_argument("--seeds", type=int, default=2, help="training seeds per arm (default: 2)")
    parser.add_argument(
        "--steps", type=int, default=500, help="training steps per arm and seed (default: 500, the loop's per window)"
    )
    parser.add_argument("--heldout-positions", type=int, default=20000, help="held-out positions scored")
    args = parser.parse_args(argv)
    if os.path.realpath(args.lake) == os.path.realpath(args.heldout_lake):
        parser.error("--heldout-lake must be another run's lake: a lake's windows share their games")
    names = [name for name, _, _ in args.arm]
    if len(set(names)) != len(names):
        parser.error("--arm names must differ")
    for flag, value, least in (
        ("--window", args.window, 1),
        ("--seeds", args.seeds, 1),
        ("--steps", args.steps, 1),
        ("--heldout-positions", args.heldout_positions, 1),
    ):
        if value < least:
            parser.error(f"{flag} must be at least {least}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from cloud.storage import open_storage
    from format.run_config import read_run_config

    run = read_run_config(open_storage(args.lake))
    if run is None:
        print(f"bench/heldout.py: --lake {args.lake} has no run.json", file=sys.stderr)
        return 2
    board_size = run.board_size
    result: dict = {
        "bench": "heldout",
        "lake": args.lake,
        "heldout_lake": args.heldout_lake,
        "window": args.window,
        "steps": args.steps,
        "seeds": args.seeds,
    }
    held_by_width: dict = {}
    with tempfile.TemporaryDirectory(prefix="zerolake-heldout-") as scratch:
        for name, shuffle_flags, train_flags in args.arm:
            figures: dict[str, list[float]] = {key: [] for key in REPORTED}
            for seed in range(args.seeds):
                started = time.perf_counter()
                root = scratch_lake(args.lake, args.window, os.path.join(scratch, f"{name}-{seed}"))
                shards = build_window(root, shuffle_flags, seed)
                model, width = train_arm(root, shards, train_flags, seed, args.steps, board_size)
                if width not in held_by_width:
                    held_by_width[width] = heldout_set(args.heldout_lake, args.heldout_positions, width)
                measured = score(model, held_by_width[width])
                for key in REPORTED:
                    figures[key].append(round(measured[key], 5))
                result.setdefault("policy_rows", measured["policy_rows"])
                result.setdefault("value_rows", measured["value_rows"])
                shutil.rmtree(root, ignore_errors=True)
                print(
                    f"[heldout] {name} seed {seed}: "
                    + ", ".join(f"{k} {measured[k]:.4f}" for k in REPORTED)
                    + f" ({time.perf_counter() - started:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
            for key in REPORTED:
                result[f"{key}_{name}"] = round(float(np.mean(figures[key])), 5)
                result[f"{key}_{name}_seeds"] = figures[key]
    reference = args.arm[0][0]
    for name, _, _ in args.arm[1:]:
        for key in REPORTED:
            result[f"delta_{key}_{name}"] = round(result[f"{key}_{name}"] - result[f"{key}_{reference}"], 5)
    print(json.dumps(result, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
