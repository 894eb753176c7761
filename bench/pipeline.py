"""Benchmark of the whole shuffle job, run locally as a user would run it.

Builds lakes of synthetic chunks (format.synthetic) in a temp folder: a 9x9
window, the same doubled, and a 19x19 window.  Each job runs as
``python -m pipeline.shuffle`` in a subprocess (default local runner:
FnApiRunner with 2 worker processes) while a thread samples the summed RSS of
that process and all its children every 0.1 s.

Reported: input positions per second end to end (window positions / wall
time of the whole command, Beam start-up included), peak RSS of the process
tree, and how much the peak grows when the 9x9 window doubles (a bounded
design grows by the few bytes per game of the duplicate check, not by the
window's size).

Synthetic games are made once per board size (a pool) and written with fresh
game ids, so the lakes build in seconds.  Timings are noisy: other work
shares this machine's 2 cores.  Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import dataclasses
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

from format import codec  # noqa: E402
from format.run_config import RunConfig  # noqa: E402
from format.synthetic import synthetic_game  # noqa: E402
from format import schema as S  # noqa: E402

GAMES_PER_CHUNK = 64


def build_lake(root: str, board_size: int, positions: int, seed: int) -> int:
    """A lake of about ``positions`` positions in 4 generations; returns the exact count."""
    os.makedirs(root)
    with open(os.path.join(root, S.RUN_CONFIG), "wb") as f:
        f.write(RunConfig(board_size=board_size).to_json())
    rng = np.random.default_rng(seed)
    pool = [synthetic_game(rng, board_size, visits=100, full_search_fraction=0.25) for _ in range(48)]
    per_game = np.mean([g.num_positions for g in pool])
    chunks = max(4, int(round(positions / per_game / GAMES_PER_CHUNK)))
    total = 0
    for seq in range(chunks):
        gen = seq * 4 // chunks
        games = [dataclasses.replace(pool[int(rng.integers(len(pool)))], game_id=uuid.uuid4().hex, generation=gen)
                 for _ in range(GAMES_PER_CHUNK)]
        total += sum(g.num_positions for g in games)
        path = os.path.join(root, codec.chunk_path(gen, "bench", seq, 1_700_000_000_000 + seq))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(codec.encode_chunk(games))
    return total


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


def run_job(root: str, extra: list[str]) -> tuple[float, int, dict]:
    """(wall seconds, peak tree RSS bytes, manifest) of one job."""
    cmd = [sys.executable, "-m", "pipeline.shuffle", "--root", root, "--window_min_positions", "100000000",
           "--seed", "1", *extra]
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
    with open(os.path.join(root, S.WINDOWS_DIR, S.generation_dir(1), S.MANIFEST)) as f:
        manifest = json.load(f)
    return wall, peak[0], manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions_9", type=int, default=200_000, help="9x9 window (doubled once)")
    parser.add_argument("--positions_19", type=int, default=150_000, help="19x19 window")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--job_args", default="", help="extra flags for pipeline.shuffle, e.g. '--bundle_positions 60000'")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="zerolake-bench-pipeline-")
    results = {}
    try:
        for name, size, positions in (("9", 9, args.positions_9), ("9x2", 9, 2 * args.positions_9),
                                      ("19", 19, args.positions_19)):
            root = os.path.join(work, f"lake{name}")
            t = time.monotonic()
            total = build_lake(root, size, positions, seed=size)
            print(f"{size}x{size}: lake of {total} positions built in {time.monotonic() - t:.1f}s; shuffling")
            wall, peak, manifest = run_job(root, ["--workers", str(args.workers), *args.job_args.split()])
            read = manifest["input"]["positions_read"]
            results[name] = {"positions": read, "wall_s": wall, "positions_per_s": read / wall,
                             "peak_rss_mb": peak / 2 ** 20, "records": manifest["positions"],
                             "shards": len(manifest["shards"])}
            print(f"  {read} positions -> {manifest['positions']} records in {len(manifest['shards'])} shards: "
                  f"{wall:.1f}s, {read / wall:.0f} positions/s, peak RSS (process tree) {peak / 2 ** 20:.0f} MB")
            shutil.rmtree(root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    growth = results["9x2"]["peak_rss_mb"] - results["9"]["peak_rss_mb"]
    print(f"peak RSS {results['9']['peak_rss_mb']:.0f} MB -> {results['9x2']['peak_rss_mb']:.0f} MB "
          f"when the 9x9 window doubles ({growth:+.0f} MB)")
    print(json.dumps({
        "bench": "pipeline",
        "positions_per_s_9": round(results["9x2"]["positions_per_s"]),
        "positions_per_s_19": round(results["19"]["positions_per_s"]),
        "peak_rss_mb": round(max(r["peak_rss_mb"] for r in results.values())),
        "rss_growth_per_window_doubling": round(growth, 1),
        "window_positions_9": results["9x2"]["positions"],
        "window_positions_19": results["19"]["positions"],
        "workers": args.workers,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
