"""How a lake's self-play games end, and what their decided positions cost.

Before and after a change to how games end (``--worker-pass-when-winning``), read from the
chunks of a run's lake (local or gs://):
- **game length**: moves a game (passes included), overall and by ending (two passes,
  resignation, move cap), and the share of each ending;
- **decided positions**: a game is *decided* at the first move where one player's root value has
  been beyond ``--decided-value`` (either sign) on ``--decided-moves`` of its own moves in a row;
  reported as a share of all positions and of full-search positions;
- **their cost**: a move's simulations follow the worker's rule (``visits``, ``fast_visits``, or
  ``accelerated_visits`` from ``accelerated_from`` on), with the run's values from the newest
  settings record that ``operations.loop`` or ``operations.cluster`` wrote in the lake
  (``layout.settings_record``; flags override).  Self-play time is almost all network evaluations,
  one a simulation, so ``*_simulation_share`` is a proxy for the self-play CPU they took.

Generation 0 is left out by default (``--min-generation 1``).  Ends with one JSON line.

    python bench/game_stats.py --lake RUNS/a1 [--lake RUNS/a2 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from heldout import chunk_paths  # noqa: E402  (bench/heldout.py: the lake's chunks by generation)

END_NAMES = {0: "two_passes", 1: "resignation", 2: "move_cap"}


def run_search_settings(lake: str) -> dict:
    """The worker's visits, fast visits and accelerated visits from the lake's newest settings record
    (a loop's or a cluster's), or {} when it has none."""
    from cloud.storage import open_storage
    from format import layout

    storage = open_storage(lake)
    newest = None
    for launcher in ("loop", "cluster"):
        for info in storage.list(layout.settings_records_prefix(launcher)):
            if info.path.endswith(".json") and (
                newest is None or info.path.rsplit("/", 1)[-1] > newest.rsplit("/", 1)[-1]
            ):
                newest = info.path
    if newest is None:
        return {}
    worker = json.loads(storage.read(newest)).get("settings", {}).get("worker", {})
    return {key: worker[key] for key in ("visits", "fast_visits", "accelerated_visits") if key in worker}


def decided_from(game, threshold: float, moves: int) -> int:
    """Index of the first position after the game was decided (module docstring), or the game's length."""
    run = [0, 0]  # own moves in a row beyond the threshold, per side (0: Black, the even positions)
    for i, value in enumerate(game.root_values):
        side = i % 2
        run[side] = run[side] + 1 if abs(float(value)) > threshold else 0
        if run[side] >= moves:
            return i + 1
    return game.num_positions


def lake_stats(lake: str, generations: range, threshold: float, moves: int, visits: dict) -> dict:
    from cloud.storage import open_storage
    from format import codec

    storage = open_storage(lake)
    lengths, ends = [], []
    positions = decided = full = decided_full = 0
    simulations = decided_simulations = 0.0
    for path in chunk_paths(lake, generations):
        for game in codec.iter_chunk(storage.read(path), storage.url(path)):
            if isinstance(game, codec.FormatError):
                continue
            count = game.num_positions
            lengths.append(count)
            ends.append(game.end_reason)
            full_search = np.asarray(game.full_search, bool)
            cost = np.where(full_search, visits["visits"], visits["fast_visits"]).astype(np.float64)
            if game.accelerated_from >= 0:
                cost[game.accelerated_from :] = visits["accelerated_visits"]
            start = decided_from(game, threshold, moves)
            positions += count
            decided += count - start
            full += int(full_search.sum())
            decided_full += int(full_search[start:].sum())
            simulations += float(cost.sum())
            decided_simulations += float(cost[start:].sum())
    if not lengths:
        raise SystemExit(
            f"bench/game_stats.py: {lake} holds no readable games of generations "
            f"{generations.start}..{generations.stop - 1}"
        )
    game_moves, end_codes = np.asarray(lengths), np.asarray(ends)
    report: dict[str, float | None] = {
        "games": int(len(game_moves)),
        "positions": positions,
        "moves_per_game": round(float(game_moves.mean()), 2),
        "decided_position_share": round(decided / positions, 4),
        "decided_full_search_share": round(decided_full / max(full, 1), 4),
        "decided_simulation_share": round(decided_simulations / simulations, 4),
        "simulations_per_game": round(simulations / len(game_moves), 1),
    }
    for code, name in END_NAMES.items():
        mask = end_codes == code
        report[f"{name}_share"] = round(float(mask.mean()), 4)
        report[f"moves_per_game_{name}"] = round(float(game_moves[mask].mean()), 2) if mask.any() else None
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/game_stats.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--lake",
        action="append",
        required=True,
        help="a run's lake root (local folder or gs://); repeat to compare runs",
    )
    parser.add_argument(
        "--min-generation",
        type=int,
        default=1,
        help="count games of this generation and later (default 1: generation 0 left out)",
    )
    parser.add_argument(
        "--max-generation",
        type=int,
        default=-1,
        help="...and of this generation and earlier (default -1: no limit); to compare runs "
        "of different lengths on the same generations",
    )
    parser.add_argument(
        "--decided-value",
        type=float,
        default=0.9,
        help="|root value| beyond which a move counts toward 'decided' (default 0.9)",
    )
    parser.add_argument(
        "--decided-moves",
        type=int,
        default=3,
        help="own moves in a row beyond --decided-value that decide a game (default 3)",
    )
    for flag in ("visits", "fast-visits", "accelerated-visits"):
        parser.add_argument(
            f"--{flag}",
            type=int,
            default=None,
            help=f"the worker's --{flag} (default: the run's, from its settings record)",
        )
    args = parser.parse_args(argv)
    if not 0 < args.decided_value < 1 or args.decided_moves < 1 or args.min_generation < 0:
        parser.error("--decided-value must lie in (0, 1), --decided-moves >= 1, --min-generation >= 0")
    if args.max_generation != -1 and args.max_generation < args.min_generation:
        parser.error("--max-generation must be -1 (no limit) or at least --min-generation")
    generations = range(args.min_generation, (1 << 30) if args.max_generation == -1 else args.max_generation + 1)
    results = {}
    for lake in args.lake:
        visits = run_search_settings(lake)
        for key in ("visits", "fast_visits", "accelerated_visits"):
            if getattr(args, key) is not None:
                visits[key] = getattr(args, key)
        missing = [key for key in ("visits", "fast_visits", "accelerated_visits") if key not in visits]
        if missing:
            parser.error(
                f"{lake} has no loop or cluster settings record: give --"
                + ", --".join(key.replace("_", "-") for key in missing)
            )
        report = lake_stats(lake, generations, args.decided_value, args.decided_moves, visits)
        report["search"] = visits
        results[lake] = report
        print(
            f"{lake}: {report['games']} games, {report['moves_per_game']} moves a game "
            f"(two passes {report['two_passes_share']:.0%}, resigned {report['resignation_share']:.0%}, "
            f"cap {report['move_cap_share']:.0%}); decided positions {report['decided_position_share']:.1%} "
            f"of all, {report['decided_full_search_share']:.1%} of full searches, "
            f"{report['decided_simulation_share']:.1%} of simulations"
        )
    print(
        json.dumps(
            {
                "bench": "game_stats",
                "decided_value": args.decided_value,
                "decided_moves": args.decided_moves,
                "min_generation": args.min_generation,
                "max_generation": args.max_generation,
                "lakes": results,
            },
            allow_nan=False,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
