"""Benchmark of the Go engine: random playouts per second on one thread.

Measures the Cython engine (engine/board.pyx) on 9x9 and 19x19 from the empty board, playouts and
moves per second (every move fully checked: suicide, positional superko, eye rule), then the naive
pure-Python board (bench/naive_board.py) on the same rules as the floor.  Each figure runs about
``--seconds`` and is per second of this process's CPU time, so other jobs add noise but little
skew.  Peers' rates on this machine: docs/measured.md.

    .venv/bin/python bench/board.py [--seconds 3] [--naive-seconds 5]

The last line printed is one JSON object:
{"bench":"board","playouts_per_s_9":...,"playouts_per_s_19":...,
 "moves_per_s_9":...,"moves_per_s_19":...,"naive_playouts_per_s_9":...,
 "vs_naive_9":...}
"""

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

from naive_board import NaiveBoard  # noqa: E402

from engine.board import BOUNDSCHECK, Board  # noqa: E402
from engine.playouts import run_playouts  # noqa: E402


@dataclass(frozen=True)
class BenchConfig:
    seconds: float = 3.0  # CPU time per engine measurement
    naive_seconds: float = 5.0  # CPU time per naive-board measurement
    seed: int = 1

    def __post_init__(self):
        if self.seconds <= 0 or self.naive_seconds <= 0:
            raise ValueError("--seconds and --naive-seconds must be positive")


def engine_rate(size, seconds, seed):
    """(playouts/s, moves/s) of the Cython engine from an empty board."""
    board = Board(size)
    run_playouts(board, 50, seed)  # warm caches
    batch = 2000 if size <= 9 else 400
    playouts = moves = 0
    start = time.process_time()
    while time.process_time() - start < seconds:
        moves += run_playouts(board, batch, seed + playouts)
        playouts += batch
    elapsed = time.process_time() - start
    return playouts / elapsed, moves / elapsed


def naive_rate(size, seconds, seed):
    """(playouts/s, moves/s) of the pure-Python board."""
    rng = random.Random(seed)
    playouts = moves = 0
    start = time.process_time()
    while time.process_time() - start < seconds or playouts == 0:
        moves += NaiveBoard(size).random_playout(rng)
        playouts += 1
    elapsed = time.process_time() - start
    return playouts / elapsed, moves / elapsed


def run(config):
    if BOUNDSCHECK:
        print(
            "WARNING: engine.board was built with ZEROLAKE_BOUNDSCHECK=1; these figures are "
            "for the slow checked build. Rebuild with `python setup.py build_ext --inplace`."
        )
    result = {"bench": "board"}
    for size in (9, 19):
        playouts, moves = engine_rate(size, config.seconds, config.seed)
        print(
            f"engine {size}x{size}: {playouts:,.0f} playouts/s, {moves:,.0f} moves/s "
            f"({moves / playouts:.0f} moves per playout)"
        )
        result[f"playouts_per_s_{size}"] = round(playouts, 1)
        result[f"moves_per_s_{size}"] = round(moves, 1)
    for size in (9, 19):
        playouts, moves = naive_rate(size, config.naive_seconds if size == 9 else config.naive_seconds / 2, config.seed)
        print(f"naive  {size}x{size}: {playouts:,.1f} playouts/s, {moves:,.0f} moves/s")
        result[f"naive_playouts_per_s_{size}"] = round(playouts, 2)
    result["vs_naive_9"] = round(result["playouts_per_s_9"] / result["naive_playouts_per_s_9"], 1)
    result["vs_naive_19"] = round(result["playouts_per_s_19"] / result["naive_playouts_per_s_19"], 1)
    result["boundscheck"] = BOUNDSCHECK
    print(
        f"engine vs naive: {result['vs_naive_9']:,.0f}x on 9x9, {result['vs_naive_19']:,.0f}x on 19x19; "
        f"vs libego (157k / 33.9k): {result['playouts_per_s_9'] / 157000:.2f} / "
        f"{result['playouts_per_s_19'] / 33900:.2f}"
    )
    print(json.dumps(result))
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds",
        type=float,
        default=BenchConfig.seconds,
        help="CPU seconds per engine measurement (default %(default)s)",
    )
    parser.add_argument(
        "--naive-seconds",
        type=float,
        default=BenchConfig.naive_seconds,
        help="CPU seconds for the naive 9x9 measurement; 19x19 gets half (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=BenchConfig.seed, help="playout seed")
    args = parser.parse_args(argv)
    try:
        config = BenchConfig(args.seconds, args.naive_seconds, args.seed)
    except ValueError as err:
        parser.error(str(err))
    run(config)


if __name__ == "__main__":
    main()
