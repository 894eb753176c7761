"""Benchmark of the whole shuffle job, run locally as a user would run it.

Builds lakes of legal random games in a temp folder (a 9x9 window, the same doubled, a 19x19
window) and runs ``python -m pipeline.shuffle`` on each in a subprocess while a thread samples the
summed RSS of its process tree every 0.1 s.  Reported: input positions per second end to end
(Beam start-up included), peak RSS, and how much the peak grows when the 9x9 window doubles (a
bounded design grows by the duplicate check's few bytes a game, not by the window's size).

The data is made to take self-play's code paths: a pool of distinct engine games with
search-shaped targets and playout-cap randomization, each written as a random pool game under a
random symmetry with a fresh id (so the opening cap trims about as much as in self-play), a third
of them resigned (a resigned game has no final board, so the job labels it by playouts, its
costliest path).  ``positions_per_s_9_model_labels``: the doubled 9x9 lake beside a published,
untrained generation-1 model (``MODEL_NETWORK``, pinned), so resigned games are labelled by model
playouts (pipeline.labels); the run is refused unless its manifest shows that path taken, and
its peak memory is reported apart (``peak_rss_mb_model_labels``).

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from format import codec, layout  # noqa: E402
from format.run_config import RunConfig  # noqa: E402
from format.symmetry import NUM_SYMMETRIES  # noqa: E402
from testdata.models import publish_untrained_model  # noqa: E402
from testdata.random_games import engine_game, resigned_copy, symmetric_copy  # noqa: E402

GAMES_PER_CHUNK = 64
POOL_GAMES = {9: 400, 19: 150}
"""Distinct engine games per board size."""
RESIGNED_SHARE = 1 / 3
"""Share of written games recorded as resignations: an assumption, since the real share depends on
a run's resignation settings."""
RESIGN_AT = (0.5, 0.9)
"""A resigned game keeps a uniform fraction in this range of its pool game."""
MODEL_GENERATION = 1
"""The published model of the generation-1 lake; its window is MODEL_GENERATION + 1."""
MODEL_NETWORK = {
    "blocks": 4,
    "filters": 32,
    "global_pool_every": 0,
    "global_pool_channels": 8,
    "value_head": "tanh",
    "value_hidden": 64,
    "policy_head": "dense",
}
"""The model's shape: model.train's defaults when first measured, pinned like the job's flags."""


@functools.lru_cache(maxsize=None)
def game_pool(board_size: int, seed: int) -> tuple:
    """Distinct legal games of ``board_size``, played on the engine (cached: both 9x9 lakes share one)."""
    rng = np.random.default_rng([seed, 0])
    return tuple(
        engine_game(rng, board_size, visits=100, full_search_fraction=0.25, worker_id="bench")
        for _ in range(POOL_GAMES[board_size])
    )


def build_lake(root: str, board_size: int, positions: int, seed: int) -> tuple[int, int, int]:
    """A lake of about ``positions`` positions in 4 generations.

    Returns (exact positions, games, resigned games).
    """
    os.makedirs(root)
    with open(os.path.join(root, layout.RUN_CONFIG), "wb") as f:
        f.write(RunConfig(board_size=board_size).to_json())
    pool = game_pool(board_size, seed)
    rng = np.random.default_rng([seed, 1])  # apart from the pool's, so a cached pool changes nothing
    mean_length = np.mean([g.num_positions for g in pool])
    per_game = mean_length * (1 - RESIGNED_SHARE + RESIGNED_SHARE * np.mean(RESIGN_AT))
    chunks = max(4, int(round(positions / per_game / GAMES_PER_CHUNK)))
    total = games_written = resigned = 0
    for seq in range(chunks):
        gen = seq * 4 // chunks
        games = []
        for _ in range(GAMES_PER_CHUNK):
            game_id = uuid.UUID(bytes=rng.bytes(16)).hex
            game = symmetric_copy(pool[int(rng.integers(len(pool)))], int(rng.integers(NUM_SYMMETRIES)), game_id)
            if rng.random() < RESIGNED_SHARE:
                game = resigned_copy(game, float(rng.uniform(*RESIGN_AT)))
                resigned += 1
            games.append(dataclasses.replace(game, game_id=game_id, generation=gen))
        total += sum(g.num_positions for g in games)
        games_written += len(games)
        path = os.path.join(root, layout.chunk_path(gen, "bench", 1_700_000_000_000 + seq, seq))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(codec.encode_chunk(games))
    return total, games_written, resigned


def _tree_rss_bytes(pid: int) -> int:
    """RSS of ``pid`` and every descendant, from /proc."""
    children: dict = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    total, stack = 0, [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
        stack.extend(children.get(p, []))
    return total


# The job settings the figures depend on, pinned at the values they were first
# measured with, so that changing the shuffle job's defaults moves no figure.
# (--window-min-positions above makes the window the whole lake.)
PINNED_JOB_FLAGS = [
    "--window-exponent",
    "0.65",
    "--window-scale",
    "250000",
    "--sample-chunks",
    "3",
    "--playout-labels",
    "auto",
    "--random-playouts",
    "64",
    "--model-playout-moves",
    "0",
    "--playout-ownership-weight",
    "0.5",
    "--dedup-max-move",
    "20",
    "--position-cap",
    "8",
    "--partition-positions",
    "200000",
    "--reuse",
    "1.5",
    "--shard-positions",
    "100000",
    "--shard-gzip-level",
    "2",
    "--bundle-positions",
    "20000",
    "--model-temperature",
    "1.0",
]


def run_job(root: str, extra: list[str], window: int = 1) -> tuple[float, int, dict]:
    """(wall seconds, peak tree RSS bytes, manifest of window ``window``) of one job."""
    cmd = [
        sys.executable,
        "-m",
        "pipeline.shuffle",
        "--root",
        root,
        "--window-min-positions",
        "100000000",
        "--seed",
        "1",
        *PINNED_JOB_FLAGS,
        *extra,
    ]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss_bytes(proc.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    wall = time.monotonic() - started
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"job failed ({proc.returncode}):\n{output[-4000:]}")
    for line in output.splitlines():
        if line.startswith("[shuffle"):
            print("   ", line)
    with open(os.path.join(root, *layout.window_manifest(window).split("/"))) as f:
        manifest = json.load(f)
    return wall, peak[0], manifest


def check_model_labels(manifest: dict, model: int) -> None:
    """Refuse a model-labels figure that did not time the model path (RuntimeError says why)."""
    labels = manifest.get("labels", {})
    if (
        manifest.get("label_model_generation") != model
        or not labels.get("played_out_model")
        or labels.get("played_out_random")
    ):
        raise RuntimeError(
            f"the job did not label by the model of generation {model}: "
            f"label_model_generation {manifest.get('label_model_generation')}, labels {labels}"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions_9", type=int, default=200_000, help="9x9 window (doubled once)")
    parser.add_argument("--positions_19", type=int, default=150_000, help="19x19 window")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--job_args", default="", help="extra flags for pipeline.shuffle, e.g. '--bundle-positions 60000'"
    )
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="zerolake-bench-pipeline-")
    results = {}
    try:
        # name, board size, positions, published model generation (None: no model)
        for name, size, positions, model in (
            ("9", 9, args.positions_9, None),
            ("9x2", 9, 2 * args.positions_9, None),
            ("19", 19, args.positions_19, None),
            ("9x2_model", 9, 2 * args.positions_9, MODEL_GENERATION),
        ):
            root = os.path.join(work, f"lake{name}")
            t = time.monotonic()
            total, games, resigned = build_lake(root, size, positions, seed=size)
            if model is not None:
                publish_untrained_model(
                    root,
                    model,
                    size,
                    network=MODEL_NETWORK,
                    seed=size,
                    metadata={"source": "bench/pipeline.py (untrained)"},
                )
            print(
                f"{size}x{size}: lake of {total} positions built in {time.monotonic() - t:.1f}s"
                + (f" beside a published model of generation {model}" if model is not None else "")
                + "; shuffling"
            )
            # A real lake was written by workers long before the job runs; without
            # this the kernel is still writing the fresh lake back while the job is timed.
            os.sync()
            wall, peak, manifest = run_job(
                root, ["--workers", str(args.workers), *args.job_args.split()], window=(model or 0) + 1
            )
            labels = manifest.get("labels", {})
            if model is not None:
                check_model_labels(manifest, model)
            read = manifest["input"]["positions_read"]
            results[name] = {
                "positions": read,
                "wall_s": wall,
                "positions_per_s": read / wall,
                "peak_rss_mb": peak / 2**20,
                "records": manifest["positions"],
                "shards": len(manifest["shards"]),
                "resigned_share": resigned / games,
                "replay_failed": labels.get("replay_failed"),
                "played_out_model": labels.get("played_out_model", 0),
                "played_out_random": labels.get("played_out_random", 0),
            }
            print(
                f"  {read} positions -> {manifest['positions']} records in {len(manifest['shards'])} shards: "
                f"{wall:.1f}s, {read / wall:.0f} positions/s, peak RSS (process tree) {peak / 2**20:.0f} MB"
            )
            shutil.rmtree(root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    growth = results["9x2"]["peak_rss_mb"] - results["9"]["peak_rss_mb"]
    print(
        f"peak RSS {results['9']['peak_rss_mb']:.0f} MB -> {results['9x2']['peak_rss_mb']:.0f} MB "
        f"when the 9x9 window doubles ({growth:+.0f} MB)"
    )
    print(
        json.dumps(
            {
                "bench": "pipeline",
                "positions_per_s_9": round(results["9x2"]["positions_per_s"]),
                # The smaller 9x9 window too: the job's fixed start-up weighs more there.
                "positions_per_s_9_small": round(results["9"]["positions_per_s"]),
                "window_positions_9_small": results["9"]["positions"],
                "positions_per_s_19": round(results["19"]["positions_per_s"]),
                "peak_rss_mb": round(max(results[name]["peak_rss_mb"] for name in ("9", "9x2", "19"))),
                "rss_growth_per_window_doubling": round(growth, 1),
                "window_positions_9": results["9x2"]["positions"],
                "window_positions_19": results["19"]["positions"],
                "workers": args.workers,
                "job_args": args.job_args,
                "resigned_share": round(results["9x2"]["resigned_share"], 3),
                # The same lake as positions_per_s_9, beside a published model: resigned games played out by it.
                "positions_per_s_9_model_labels": round(results["9x2_model"]["positions_per_s"]),
                "model_labels_games_played_out": results["9x2_model"]["played_out_model"],
                # Each Beam worker holds TensorFlow and the model: reported apart from peak_rss_mb.
                "peak_rss_mb_model_labels": round(results["9x2_model"]["peak_rss_mb"]),
                "model_network": "{blocks}x{filters}".format(**MODEL_NETWORK),
                # Games whose moves did not replay (0 for legal games; the job then scores recorded planes).
                "replay_failed": {name: r["replay_failed"] for name, r in results.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
