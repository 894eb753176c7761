"""One strength figure: a match of enough games under the one protocol, kept with what made it.

    python bench/strength.py model:RUNS/two gnugo:1 --out RUNS/two/strength/gnugo-1
    python bench/strength.py model:RUNS/two model:docs/record-2026-11-26 --games 200 --out RUNS/two/strength/h2h
    python bench/strength.py gnugo:10 gnugo:1 --out /work/gnugo-10-vs-1     # the ladder's own anchor

The protocol (every figure against GNU Go, and every head to head, is measured this way, so figures
compare): ``--games`` (400; 200 for a head to head) at ``--visits`` (256) a move, PUCT, no sampled
moves; games 2k and 2k+1 start from the same random ``--paired-openings`` (4) moves with the colours
swapped, so an opening's edge for one colour cancels.  400 games put the 95% interval at about
+-35 Elo near an even score; 100 games at +-70.

The match runs as ``python -m arena.match`` with its SGFs kept in ``OUT/games/`` and its JSON in
``OUT/match.json``.  Only distinct games count (two deterministic players can repeat a game; a repeat
is no evidence).  Rerunning the same command reuses a finished match when its players, settings,
commit and machine are the same (``OUT/match.provenance.json``); otherwise it stops with one line
naming what differs, and ``--allow-stale-cache`` reuses it anyway and says so.

Ends with one JSON line: the players, the seed, the tally (games, score, wins as each colour), the
win rate with its 95% Wilson interval, the Elo of A over B with the interval's Elo, the sha256 of
the match JSON and its SGFs (``digest``: what the tally was made of), the commit and the machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from format.match_record import MatchRecord  # noqa: E402


def _load_bench(name: str):
    """Another bench script as a module (bench/ holds scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"zerolake_bench_{name}", os.path.join(REPO, "bench", f"{name}.py"))
    if spec is None or spec.loader is None:
        raise SystemExit(f"bench/{name}.py cannot be loaded as a module (is it missing?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being made
    spec.loader.exec_module(module)
    return module


# The A/B bench owns match statistics and provenance; a figure is made of the same pieces.
learning = _load_bench("learning")
learning.PROG = "bench/strength.py"

GNUGO_GAMES = 400
HEAD_TO_HEAD_GAMES = 200
VISITS = 256
PAIRED_OPENINGS = 4


def say(text: str) -> None:
    print(f"[strength {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def match_argv(
    player_a: str, player_b: str, games: int, visits: int, paired_openings: int, seed: int, sgf_dir: str
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "arena.match",
        player_a,
        player_b,
        "--games",
        str(games),
        "--visits",
        str(visits),
        "--opening-moves",
        "0",
        "--paired-openings",
        str(paired_openings),
        "--seed",
        str(seed),
        "--json",
        "--sgf-dir",
        sgf_dir,
    ]


def measure(
    player_a: str,
    player_b: str,
    out: str,
    *,
    games: int,
    visits: int = VISITS,
    paired_openings: int = PAIRED_OPENINGS,
    seed: int = 0,
    allow_stale_cache: bool = False,
    provenance_extra: dict | None = None,
) -> dict:
    """Play (or reuse) one match in ``out`` and return its JSON entry (module docstring).

    ``provenance_extra``: what else the players depend on (a model's digest, say), so that a match of
    other players under the same names is not reused.
    """
    os.makedirs(out, exist_ok=True)
    result_path = os.path.join(out, "match.json")
    provenance_path = os.path.join(out, "match.provenance.json")
    wanted = learning.provenance(
        {
            "player_a": player_a,
            "player_b": player_b,
            "games": games,
            "visits": visits,
            "paired_openings": paired_openings,
            "seed": seed,
            **(provenance_extra or {}),
        }
    )
    if os.path.exists(result_path):
        cache_args = argparse.Namespace(allow_stale_cache=allow_stale_cache, stale_caches=[])
        learning.check_cache(cache_args, f"the match in {out}", provenance_path, wanted)
        say(f"reusing {result_path}")
    else:
        sgf_dir = os.path.join(out, "games")
        shutil.rmtree(sgf_dir, ignore_errors=True)  # the games of an attempt that did not finish
        say(
            f"{player_a} vs {player_b}: {games} games at {visits} visits, {paired_openings}-move paired openings, "
            f"seed {seed}"
        )
        started = time.perf_counter()
        done = subprocess.run(
            match_argv(player_a, player_b, games, visits, paired_openings, seed, sgf_dir),
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(
                f"bench/strength.py: the match {player_a} vs {player_b} failed (exit {done.returncode}; "
                f"arena.match said why above)"
            )
        with open(result_path + ".tmp", "w") as handle:
            handle.write(done.stdout.strip().splitlines()[-1])
        os.replace(result_path + ".tmp", result_path)
        learning.write_provenance(provenance_path, wanted)
        say(f"done in {time.perf_counter() - started:.0f} s")
    with open(result_path, "rb") as handle:
        record = MatchRecord.from_bytes(handle.read(), result_path)
    tally = learning.tally_match(record)
    elo, elo_low, elo_high = tally.elo()
    recorded = learning.read_provenance(provenance_path) if os.path.exists(provenance_path) else {}
    return {
        "player_a": player_a,
        "player_b": player_b,
        "seed": seed,
        "visits": visits,
        "paired_openings": paired_openings,
        "games_played": len(record.game_results or ()),
        "games": tally.games,
        "score": tally.score,
        "wins_as_black": record.wins_as_black,
        "wins_as_white": record.wins_as_white,
        "win_rate": round(tally.score / max(tally.games, 1), 4),
        "wilson95": [round(x, 4) for x in learning.wilson_interval(tally.score, tally.games)],
        "elo": round(elo, 1),
        "elo95": [round(elo_low, 1), round(elo_high, 1)],
        "digest": learning.match_digest(result_path, record),
        "commit": recorded.get("commit"),
        "machine": recorded.get("machine"),
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/strength.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("player_a", help="the player measured: model:ROOT[@GEN], gnugo:LEVEL, random, ...")
    parser.add_argument("player_b", help="its opponent, e.g. gnugo:1, or model:docs/record-2026-11-26")
    parser.add_argument("--out", required=True, help="folder for the match's JSON, SGFs and provenance")
    parser.add_argument(
        "--games", type=int, default=0, help=f"games; 0 = {GNUGO_GAMES} against GNU Go, {HEAD_TO_HEAD_GAMES} otherwise"
    )
    parser.add_argument("--visits", type=int, default=VISITS, help="simulations a move of the searching players")
    parser.add_argument(
        "--paired-openings",
        type=int,
        default=PAIRED_OPENINGS,
        help="random moves each opening starts with, played once with each colour",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the openings")
    parser.add_argument(
        "--allow-stale-cache",
        action="store_true",
        help="reuse a finished match made with other settings, commit or machine (and say so)",
    )
    args = parser.parse_args(argv)
    if args.games == 0:
        args.games = GNUGO_GAMES if args.player_b.startswith("gnugo") else HEAD_TO_HEAD_GAMES
    if args.games < 2 or args.games % 2:
        parser.error(
            f"--games must be even and at least 2 (each opening is played with both colours), not {args.games}"
        )
    if args.visits < 1:
        parser.error(f"--visits must be at least 1, not {args.visits}")
    if not 1 <= args.paired_openings <= 60:
        parser.error(f"--paired-openings must be in [1, 60], not {args.paired_openings}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    entry = measure(
        args.player_a,
        args.player_b,
        args.out,
        games=args.games,
        visits=args.visits,
        paired_openings=args.paired_openings,
        seed=args.seed,
        allow_stale_cache=args.allow_stale_cache,
    )
    print(
        json.dumps({"bench": "strength", **entry, "seconds": round(time.perf_counter() - started, 1)}, allow_nan=False)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
