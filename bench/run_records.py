"""What a run's own records say about its labels and its trainer, read back from its lake.

    python bench/run_records.py --root RUNS/two
    python bench/run_records.py --root RUNS/two --events RUNS/two-train-events.jsonl --from-generation 1

From the chunks (every game of generation ``--from-generation`` on, or the newest ``--max-chunks``):

* *resigned*: games that ended by resignation, and the share of positions recorded after it (the
  worker finishes a resigned game with cheap moves, ``accelerated_from`` on; those rows carry the
  resignation's result and, when the game reached two passes, that random ending's ownership);
* *played out against the resignation*: resigned games whose played-out board (two passes) scores
  for the side that resigned;
* *false resignations*: of the games whose resignation was disabled (``--resign-disabled-fraction``),
  those in which a player would have resigned (``would_resign``) and then won;
* the full-search share, moves a game, and positions by generation.

From the trainer's ``--events`` file(s) (format/events.py, role train), when given: wall time spent
training windows (``window_started`` to ``published``), waiting between windows, and the steps.

Ends with one JSON line; progress goes to stderr.  It only reads.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from cloud.storage import open_storage  # noqa: E402
from format import codec, layout, schema  # noqa: E402


def share(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole else None


def chunk_paths(storage, from_generation: int, max_chunks: int) -> list[str]:
    found = []
    for info in storage.list(layout.games_prefix()):
        chunk = layout.parse_chunk_path(info.path)
        if chunk is not None and chunk.generation >= from_generation:
            found.append((chunk.generation, info.path))
    found.sort()
    return [path for _, path in (found[-max_chunks:] if max_chunks else found)]


class LabelTally:
    """Counts over games, filled one game at a time (`add`), reported by `as_json`."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.by_generation: collections.Counter = collections.Counter()

    def add(self, game) -> None:
        c = self.counts
        moves = game.num_positions
        c["games"] += 1
        c["positions"] += moves
        c["full_search"] += int(np.count_nonzero(game.full_search))
        self.by_generation[int(game.generation)] += moves
        if game.end_reason == schema.END_RESIGN:
            c["resigned"] += 1
            if game.accelerated_from >= 0:
                c["after_resignation"] += moves - int(game.accelerated_from)
            if not math.isnan(game.score):
                c["resigned_played_out"] += 1
                # winner is the resignation's; the played-out board's sign is what the ending says.
                c["played_out_against"] += int(np.sign(game.score) == -game.winner)
        if not game.resign_enabled:
            c["resign_disabled"] += 1
            if game.would_resign:
                c["would_resign"] += 1
                c["false_resignations"] += int(game.winner == game.would_resign)

    def as_json(self) -> dict:
        c = self.counts
        return {
            "games": c["games"],
            "positions": c["positions"],
            "moves_per_game": round(c["positions"] / c["games"], 1) if c["games"] else None,
            "full_search_share": share(c["full_search"], c["positions"]),
            "resigned_games": c["resigned"],
            "resigned_share": share(c["resigned"], c["games"]),
            "rows_after_resignation": c["after_resignation"],
            "rows_after_resignation_share": share(c["after_resignation"], c["positions"]),
            "resigned_played_out": c["resigned_played_out"],
            "played_out_against_resignation": c["played_out_against"],
            "played_out_against_share": share(c["played_out_against"], c["resigned_played_out"]),
            "resign_disabled_games": c["resign_disabled"],
            "would_resign_games": c["would_resign"],
            "false_resignations": c["false_resignations"],
            "false_resignation_rate": share(c["false_resignations"], c["would_resign"]),
            "positions_by_generation": {str(g): n for g, n in sorted(self.by_generation.items())},
        }


def trainer_time(paths: list[str]) -> dict:
    """Training, waiting and steps from the trainer's event files (window_started .. published)."""
    training = waiting = 0.0
    windows = steps = 0
    for path in paths:
        started_at = last_published = None
        with open(path) as handle:
            for number, line in enumerate(handle, 1):
                try:
                    event = json.loads(line)
                except ValueError:
                    raise SystemExit(f"bench/run_records.py: {path}:{number} is not a JSON event line") from None
                if event.get("role") != "train":
                    continue
                when = float(event.get("time", 0.0))
                if event.get("event") == "window_started":
                    started_at = when
                    if last_published is not None:
                        waiting += when - last_published
                elif event.get("event") == "published" and started_at is not None:
                    training += when - started_at
                    windows += 1
                    steps = max(steps, int(event.get("step", 0)))
                    started_at, last_published = None, when
    total = training + waiting
    return {
        "windows": windows,
        "last_step": steps,
        "training_s": round(training, 1),
        "waiting_s": round(waiting, 1),
        "waiting_share": share(waiting, total),
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/run_records.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--root", required=True, help="the run's lake (a folder or gs://bucket/prefix)")
    parser.add_argument(
        "--from-generation", type=int, default=1, help="read games of this generation on (0 = with the random player's)"
    )
    parser.add_argument("--max-chunks", type=int, default=0, help="read only the newest this many chunks (0 = all)")
    parser.add_argument("--events", action="append", default=[], help="a trainer --events file, repeated")
    args = parser.parse_args(argv)
    if args.from_generation < 0 or args.max_chunks < 0:
        parser.error("--from-generation and --max-chunks must be at least 0")
    for path in args.events:
        if not os.path.isfile(path):
            parser.error(f"--events {path}: no such file")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    storage = open_storage(args.root)
    paths = chunk_paths(storage, args.from_generation, args.max_chunks)
    if not paths:
        print(
            f"bench/run_records.py: {args.root} holds no chunks of generation {args.from_generation} or later",
            file=sys.stderr,
        )
        return 2
    tally, damaged, started = LabelTally(), 0, time.perf_counter()
    for number, path in enumerate(paths, 1):
        for game in codec.iter_chunk(storage.read(path), storage.url(path)):
            if isinstance(game, codec.FormatError):
                damaged += 1
                continue
            tally.add(game)
        if number % 200 == 0:
            print(
                f"[run_records] {number}/{len(paths)} chunks, {tally.counts['games']} games",
                file=sys.stderr,
                flush=True,
            )
    result = {
        "bench": "run_records",
        "root": args.root,
        "from_generation": args.from_generation,
        "chunks": len(paths),
        "damaged_records": damaged,
        **tally.as_json(),
    }
    if args.events:
        result["trainer"] = trainer_time(args.events)
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
