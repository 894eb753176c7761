"""Replay test of a lever: arms trained alike on one frozen lake (or one frozen model's self-play), judged
by games and held-out losses.  Runs of one configuration spread ~60 Elo, mostly from self-play; a replay
takes that out: every arm gets the same positions and seeds, only its flags differ.

    python bench/replay.py --lake RUNS/two --window 40 --steps 6000 --out /work/replay/anneal \\
        --arm base= --arm anneal='--train-lr-schedule anneal --train-lr-anneal-from 4500 --train-lr-anneal-to 6000' \\
        --heldout-sgf RUNS/two/strength/gnugo-1/games
    python bench/replay.py --generator RUNS/two@20 --selfplay-minutes 10 --steps 3000 --out /work/replay/search \\
        --arm base= --arm deeper='--worker-gumbel-considered 4' --heldout-sgf RUNS/two/strength/gnugo-1/games

For each arm (``NAME=FLAGS``: ``--shuffle-*``, ``--train-*``, with ``--generator`` ``--worker-*``, as
operations.loop spells them) and seed, ``OUT/runs/ARM-SEED`` gets the frozen lake's run.json and chunks
below ``--window`` (hard links), or the generator's model and what the loop's worker plays with it in
``--selfplay-minutes``; the shuffle job builds one window (random-playout labels); ``model.train`` trains a
fresh network ``--steps`` steps and publishes it; the model is scored on held-out positions (``--heldout-sgf``:
finished games, the move played and the result as targets; ``--heldout-lake``: another run's chunks, the
recorded policy).  Then bench/strength.py's matches: each arm against ``--opponent`` and every arm against
the first, split over the seeds.  One JSON line: each arm's held-out figures (mean and per seed), its tally
against the opponent with a Wilson interval, its head-to-head Elo over the first arm with a 95% interval, and
each match's entry (seed, tally, digest).  The same command resumes; it holds both cores: run it alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

import strength  # noqa: E402  (bench/strength.py: the match protocol)

heldout = strength._load_bench("heldout")
learning = strength.learning
learning.PROG = "bench/replay.py"

HELDOUT_KEYS = ("policy_ce", "policy_top1", "value_mse")


def say(text: str) -> None:
    print(f"[replay {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def parse_arm(text: str) -> tuple[str, list[str], list[str], list[str]]:
    """``NAME=FLAGS`` -> (name, shuffle argv, train argv, worker flags).  Shuffle and train flags as
    bench/heldout.py reads them (``--shuffle-X``/``--train-X`` -> ``--X``); ``--worker-X`` flags stay as
    operations.loop spells them (the worker's settings are the loop's, changed by these)."""
    import shlex

    name, sep, flags = text.partition("=")
    words = shlex.split(flags) if sep else []
    rest: list[str] = []
    worker: list[str] = []
    target = rest
    for word in words:
        if word.startswith("--"):
            target = worker if word.startswith("--worker-") else rest
        target.append(word)
    name, shuffle, train = heldout.parse_arm(f"{name}{sep}{shlex.join(rest)}")
    return name, shuffle, train, worker


def link_or_copy(source: str, target: str) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def scratch_lake(lake: str, window: int, root: str) -> int:
    """``root`` gets ``lake``'s run.json and chunks of generations below ``window``; their count."""
    from format import layout

    paths = heldout.chunk_paths(lake, range(window))
    if not paths:
        raise SystemExit(f"bench/replay.py: {lake} holds no chunks of generations below {window}")
    for relative in [layout.RUN_CONFIG, *paths]:
        link_or_copy(os.path.join(lake, relative), os.path.join(root, relative))
    return len(paths)


def generator_lake(generator: str, root: str) -> int:
    """``root`` gets the generator lake's run.json and one published model (``ROOT[@GEN]``, default
    its LATEST) as its LATEST; that generation."""
    from cloud.storage import open_storage
    from format import layout, registry

    lake, _, wanted = generator.partition("@")
    storage = open_storage(lake)
    generation = int(wanted) if wanted else registry.latest_generation(storage)
    if generation is None or not registry.is_published(storage, generation):
        raise SystemExit(f"bench/replay.py: --generator {generator}: no such published model")
    link_or_copy(os.path.join(lake, layout.RUN_CONFIG), os.path.join(root, layout.RUN_CONFIG))
    prefix = layout.model_dir(generation)
    for info in storage.list(prefix):
        link_or_copy(os.path.join(lake, info.path), os.path.join(root, info.path))
    registry.advance_latest(open_storage(root), generation)
    return generation


def self_play(root: str, worker_flags: list[str], seed: int, minutes: float, log_path: str) -> int:
    """The loop's worker (its settings, then ``worker_flags``) for ``minutes`` on ``root``; positions made."""
    from cloud.storage import open_storage
    from operations import loop
    from operations.roles import role_argv

    config = loop.CLI.parse(["--root", root, *worker_flags])[0]
    argv = [
        sys.executable,
        "-m",
        "selfplay.worker",
        *role_argv(config, "worker", seed=1000 * seed + 7, max_seconds=60.0 * minutes, worker_id=f"replay{seed}"),
    ]
    with open(log_path, "w") as log:
        done = subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"bench/replay.py: self-play failed (exit {done.returncode}); see {log_path}")
    from format import codec

    storage = open_storage(root)
    return sum(
        game.num_positions
        for path in heldout.chunk_paths(root, range(1 << 30))
        for game in codec.iter_chunk(storage.read(path), path)
        if not isinstance(game, codec.FormatError)
    )


def train(root: str, train_flags: list[str], seed: int, steps: int, log_path: str) -> None:
    """The production trainer on ``root``'s one window: ``steps`` steps, then publish."""
    argv = [
        sys.executable,
        "-m",
        "model.train",
        "--root",
        root,
        "--seed",
        str(seed),
        "--windows",
        "1",
        "--steps-per-window",
        str(steps),
        "--checkpoint-every",
        str(max(steps, 1)),
        *train_flags,
    ]
    with open(log_path, "w") as log:
        done = subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"bench/replay.py: training failed (exit {done.returncode}); see {log_path}")


def heldout_from_sgf(folders: list[str], board_size: int, channels: int, max_positions: int) -> dict:
    """Held-out positions of finished games kept as SGF: the input planes before each move, the move
    played as a one-hot policy target, and the game's result from the mover's side as the value target
    (heldout.heldout_set's layout)."""
    import glob

    from engine.board import Board
    from format.sgf import game_from_sgf

    planes, index, offsets, value, known = [], [], [0], [], []
    paths = sorted(path for folder in folders for path in glob.glob(os.path.join(folder, "*.sgf")))
    for path in paths:
        with open(path, "rb") as handle:
            size, komi, moves, result = game_from_sgf(handle.read())
        if size != board_size or not result or result[:2] not in ("B+", "W+"):
            continue
        winner = 1 if result.startswith("B+") else -1
        board = Board(size, komi)
        for number, move in enumerate(moves):
            mover = 1 if number % 2 == 0 else -1
            planes.append(board.features(channels))
            index.append(move)
            offsets.append(offsets[-1] + 1)
            value.append(float(winner * mover))
            known.append(True)
            board.play(move)
            if len(planes) >= max_positions:
                break
        if len(planes) >= max_positions:
            break
    if not planes:
        raise SystemExit(f"bench/replay.py: no finished {board_size}x{board_size} game in {', '.join(folders)}")
    return {
        "planes": np.stack(planes),
        "policy_index": np.asarray(index, np.int64),
        "policy_prob": np.ones(len(index), np.float32),
        "policy_offsets": np.asarray(offsets, np.int64),
        "value": np.asarray(value, np.float32),
        "value_known": np.asarray(known, bool),
    }


def score_model(root: str, heldout_sets: dict) -> dict:
    """The published model of ``root`` scored on each held-out set: {set: {policy_ce, ...}}."""
    from cloud.storage import open_storage
    from format import registry
    from inference import model_files

    storage = open_storage(root)
    generation = registry.latest_generation(storage)
    if generation is None:
        raise SystemExit(f"bench/replay.py: {root} has published no model (models/LATEST is missing)")
    model = model_files.load_model(storage, generation)
    call = lambda planes, training=False: model(planes)  # noqa: E731  (heldout.score's model signature)
    out = {}
    for name, make in heldout_sets.items():
        measured = heldout.score(call, make(model.input_planes))
        out[name] = {key: round(measured[key], 5) for key in HELDOUT_KEYS}
    return out


def run_arm(
    args, name: str, shuffle_flags: list[str], train_flags: list[str], worker_flags: list[str], seed: int, heldout_sets
) -> dict:
    """Train (or reuse) one arm's seed and score its model; its entry for the JSON line."""
    root = os.path.join(args.out, "runs", f"{name}-{seed}")
    provenance_path = root + ".provenance.json"
    source = (
        {"generator": args.generator, "selfplay_minutes": args.selfplay_minutes, "worker": worker_flags}
        if args.generator
        else {"lake": os.path.realpath(args.lake), "window": args.window}
    )
    wanted = learning.provenance(
        {**source, "steps": args.steps, "seed": seed, "shuffle": shuffle_flags, "train": train_flags}
    )
    positions_path = root + ".positions.json"
    scores_path = root + ".heldout.json"
    if os.path.exists(provenance_path):
        cache_args = argparse.Namespace(allow_stale_cache=args.allow_stale_cache, stale_caches=[])
        learning.check_cache(cache_args, f"run {name}-{seed} ({root})", provenance_path, wanted)
        say(f"{name} seed {seed}: reusing {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)  # an attempt that did not finish
        started = time.perf_counter()
        if args.generator:
            generation = generator_lake(args.generator, root)
            say(
                f"{name} seed {seed}: {args.selfplay_minutes:g} minutes of self-play with generation {generation} "
                f"({' '.join(worker_flags) or 'the loop worker'})"
            )
            positions = self_play(root, worker_flags, seed, args.selfplay_minutes, root + ".selfplay.log")
        else:
            chunks = scratch_lake(args.lake, args.window, root)
            positions = None
            say(f"{name} seed {seed}: {chunks} chunks")
        with open(positions_path, "w") as handle:
            json.dump({"selfplay_positions": positions}, handle)
        say(f"{name} seed {seed}: shuffling ({' '.join(shuffle_flags) or 'defaults'})")
        heldout.build_window(root, shuffle_flags, seed)
        say(f"{name} seed {seed}: training {args.steps} steps ({' '.join(train_flags) or 'defaults'})")
        train(root, train_flags, seed, args.steps, root + ".train.log")
        shutil.rmtree(os.path.join(root, "windows"), ignore_errors=True)  # the shards: big, and done with
        shutil.rmtree(os.path.join(root, "games"), ignore_errors=True)  # links to the frozen lake
        learning.write_provenance(provenance_path, wanted)
        say(f"{name} seed {seed}: trained in {time.perf_counter() - started:.0f} s")
    if not os.path.exists(scores_path):
        with open(scores_path + ".tmp", "w") as handle:
            json.dump(score_model(root, heldout_sets), handle)
        os.replace(scores_path + ".tmp", scores_path)
    with open(scores_path) as handle:
        scores = json.load(handle)
    say(
        f"{name} seed {seed}: "
        + "; ".join(
            f"{kind} " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items()) for kind, figures in scores.items()
        )
    )
    with open(positions_path) as handle:
        positions = json.load(handle)["selfplay_positions"]
    return {
        "root": root,
        "heldout": scores,
        "provenance": learning.provenance_digest(wanted),
        "selfplay_positions": positions,
    }


def games_per_seed(total: int, seeds: int) -> int:
    """An even share of ``total`` games for each seed (each opening is played with both colours)."""
    return max(2, 2 * math.ceil(total / seeds / 2))


def play(args, first: dict, second: str, label: str, games: int, seed: int, extra: dict) -> dict:
    return strength.measure(
        f"model:{first['root']}",
        second,
        os.path.join(args.out, "matches", label),
        games=games,
        visits=args.visits,
        seed=seed,
        allow_stale_cache=args.allow_stale_cache,
        provenance_extra=extra,
    )


def run_replay(args) -> dict:
    from cloud.storage import open_storage
    from format.run_config import read_run_config

    source = args.generator.partition("@")[0] if args.generator else args.lake
    run = read_run_config(open_storage(source))
    if run is None:
        raise SystemExit(f"bench/replay.py: {source} has no run.json")
    heldout_sets: dict = {}
    cache: dict = {}
    if args.heldout_sgf:
        heldout_sets["sgf"] = lambda width: cache.setdefault(
            ("sgf", width), heldout_from_sgf(args.heldout_sgf, run.board_size, width, args.heldout_positions)
        )
    if args.heldout_lake:
        heldout_sets["lake"] = lambda width: cache.setdefault(
            ("lake", width), heldout.heldout_set(args.heldout_lake, args.heldout_positions, width)
        )
    arms: dict = {}
    for name, shuffle_flags, train_flags, worker_flags in args.arm:
        arms[name] = [
            run_arm(args, name, shuffle_flags, train_flags, worker_flags, seed, heldout_sets)
            for seed in range(args.seeds)
        ]
    result: dict = {
        "bench": "replay",
        "lake": args.lake,
        "window": args.window,
        "generator": args.generator,
        "selfplay_minutes": args.selfplay_minutes,
        "steps": args.steps,
        "seeds": args.seeds,
        "visits": args.visits,
        "opponent": args.opponent,
        "commit": learning.current_commit()[0],
        "machine": learning.machine(),
        "arms": {},
    }
    reference = args.arm[0][0]
    for name, shuffle_flags, train_flags, worker_flags in args.arm:
        entry = {"shuffle": shuffle_flags, "train": train_flags, "worker": worker_flags, "heldout": {}, "matches": []}
        if args.generator:
            entry["selfplay_positions"] = [seed_run["selfplay_positions"] for seed_run in arms[name]]
        for kind in heldout_sets:
            for key in HELDOUT_KEYS:
                figures = [seed_run["heldout"][kind][key] for seed_run in arms[name]]
                entry["heldout"][f"{kind}_{key}"] = round(float(np.mean(figures)), 5)
                entry["heldout"][f"{kind}_{key}_seeds"] = figures
        if args.gnugo_games:
            tally = learning.MatchTally(0, 0.0)
            for seed, seed_run in enumerate(arms[name]):
                match = play(
                    args,
                    seed_run,
                    args.opponent,
                    f"{name}-{seed}-vs-{args.opponent.replace(':', '-')}",
                    games_per_seed(args.gnugo_games, args.seeds),
                    seed,
                    {"model": seed_run["provenance"]},
                )
                entry["matches"].append(match)
                tally = tally + learning.MatchTally(match["games"], match["score"])
            entry["opponent_games"], entry["opponent_score"] = tally.games, tally.score
            entry["opponent_wilson95"] = [round(x, 4) for x in learning.wilson_interval(tally.score, tally.games)]
        if name != reference and args.head_to_head_games:
            tally = learning.MatchTally(0, 0.0)
            for seed, (mine, theirs) in enumerate(zip(arms[name], arms[reference])):
                match = play(
                    args,
                    mine,
                    f"model:{theirs['root']}",
                    f"{name}-{seed}-vs-{reference}-{seed}",
                    games_per_seed(args.head_to_head_games, args.seeds),
                    seed,
                    {"model": mine["provenance"], "opponent": theirs["provenance"]},
                )
                entry["matches"].append(match)
                tally = tally + learning.MatchTally(match["games"], match["score"])
            elo, low, high = tally.elo()
            entry["head_to_head"] = {
                "over": reference,
                "games": tally.games,
                "score": tally.score,
                "elo": round(elo, 1),
                "elo95": [round(low, 1), round(high, 1)],
            }
        result["arms"][name] = entry
    return result


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/replay.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--lake", default="", help="the frozen lake every arm trains on (a local folder)")
    parser.add_argument(
        "--window", type=int, default=0, help="with --lake: train on the lake's chunks of generations below this"
    )
    parser.add_argument(
        "--generator",
        default="",
        help="instead of --lake: LAKE[@GEN], the frozen model every arm's worker self-plays with",
    )
    parser.add_argument(
        "--selfplay-minutes",
        type=float,
        default=10.0,
        help="with --generator: each arm's self-play time (one worker, the loop's settings)",
    )
    parser.add_argument(
        "--arm",
        action="append",
        type=parse_arm,
        required=True,
        help="NAME=FLAGS, repeated; the first is the reference (e.g. base=, the defaults); "
        "FLAGS are --shuffle-*, --train-* and (with --generator) --worker-* settings",
    )
    parser.add_argument("--out", required=True, help="folder for the arms' runs, the matches and their games")
    parser.add_argument("--seeds", type=int, default=2, help="training seeds per arm")
    parser.add_argument("--steps", type=int, default=6000, help="training steps per arm and seed")
    parser.add_argument(
        "--heldout-sgf",
        action="append",
        default=[],
        help="a folder of finished games (e.g. a closing match's SGFs), repeated",
    )
    parser.add_argument("--heldout-lake", default="", help="another run's lake, whose chunks are held out")
    parser.add_argument("--heldout-positions", type=int, default=20000, help="held-out positions per set")
    parser.add_argument("--opponent", default="gnugo:1", help="the fixed opponent of every arm")
    parser.add_argument(
        "--gnugo-games",
        type=int,
        default=strength.GNUGO_GAMES,
        help="games of each arm against --opponent, over all seeds (0 = none)",
    )
    parser.add_argument(
        "--head-to-head-games",
        type=int,
        default=strength.HEAD_TO_HEAD_GAMES,
        help="games of each arm against the first, over all seeds (0 = none)",
    )
    parser.add_argument("--visits", type=int, default=strength.VISITS, help="simulations a move in the matches")
    parser.add_argument(
        "--allow-stale-cache",
        action="store_true",
        help="reuse runs and matches made with other settings, commit or machine (and say so)",
    )
    args = parser.parse_args(argv)
    names = [name for name, *_ in args.arm]
    if len(set(names)) != len(names):
        parser.error("--arm names must differ")
    from format import layout

    if bool(args.lake) == bool(args.generator):
        parser.error("give --lake (a training lever) or --generator (a self-play lever), not both")
    if args.lake and args.window < 1:
        parser.error("--lake needs --window (at least 1): the generations every arm trains on")
    if args.lake and any(worker for *_, worker in args.arm):
        parser.error("--worker-* flags need --generator: with --lake no arm plays")
    if args.generator and args.selfplay_minutes <= 0:
        parser.error(f"--selfplay-minutes must be above 0, not {args.selfplay_minutes}")
    lake = args.lake or args.generator.partition("@")[0]
    if not os.path.isfile(os.path.join(lake, layout.RUN_CONFIG)):
        parser.error(f"{lake}: no run.json there (a local lake folder is needed)")
    if not args.heldout_sgf and not args.heldout_lake:
        parser.error("give --heldout-sgf or --heldout-lake (or both): the held-out positions")
    if args.lake and args.heldout_lake and os.path.realpath(args.heldout_lake) == os.path.realpath(args.lake):
        parser.error("--heldout-lake must be another run's lake: the arms train on --lake's games")
    for flag in ("seeds", "steps", "heldout_positions", "visits"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, not {getattr(args, flag)}")
    for flag in ("gnugo_games", "head_to_head_games"):
        if getattr(args, flag) < 0:
            parser.error(f"--{flag.replace('_', '-')} must be at least 0, not {getattr(args, flag)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    result = run_replay(args)
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
