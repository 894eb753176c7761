"""Does the engine call the same stones dead as GNU Go?  ``final_status_list dead`` on a closing match.

A referee (gogui-twogtp, a KGS client) scores a game without the stones both engines list as
dead, so the engine's list must agree with a sound judge.  This bench plays (or reads) a closing
match against GNU Go level 1 at operations.loop's closing settings and asks both engines, after
``loadsgf FILE MOVE_NUMBER``, about two positions a game: *finished* (after the last move) and
*first pass* (right after the game's first pass, where a person would count, dead stones still
standing).  GNU Go is the reference: **precision** is the share of the engine's dead stones GNU
Go calls dead, **recall** the share of GNU Go's that the engine calls dead, over every stone of
every position of a kind.  Ends with one JSON line.

    python bench/final_status.py [--games 100] [--model docs/record-2026-11-26]
    python bench/final_status.py --sgf-dir DIR     # the SGFs of an earlier arena.match --sgf-dir
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CLOSING = {"visits": 256, "paired_openings": 4, "gnugo_level": 1}
"""The closing match's settings (operations.loop: LONG_RUN's GNU Go visits, GNUGO_PAIRED_OPENINGS)."""


def play_match(model: str, games: int, seed: int, sgf_dir: str) -> None:
    """The closing match, model against GNU Go level 1, its SGFs written to ``sgf_dir``."""
    command = [
        sys.executable,
        "-m",
        "arena.match",
        f"model:{model}",
        f"gnugo:{CLOSING['gnugo_level']}",
        "--games",
        str(games),
        "--visits",
        str(CLOSING["visits"]),
        "--paired-openings",
        str(CLOSING["paired_openings"]),
        "--seed",
        str(seed),
        "--sgf-dir",
        sgf_dir,
    ]
    print("playing:", " ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def judged_positions(path: str) -> dict[str, int]:
    """``{kind: MOVE_NUMBER}`` for ``loadsgf PATH MOVE_NUMBER`` (the position before that move):
    'finished' after the last move, 'first_pass' right after the first pass (when there is one)."""
    from sgfmill import sgf

    with open(path, "rb") as handle:
        game = sgf.Sgf_game.from_bytes(handle.read())
    moves = [node.get_move()[1] for node in game.get_main_sequence()[1:] if node.get_move()[0] is not None]
    positions = {"finished": len(moves) + 1}
    passes = [number for number, move in enumerate(moves, start=1) if move is None]
    if passes and passes[0] < len(moves):
        positions["first_pass"] = passes[0] + 1
    return positions


def dead_vertices(reply: str) -> set[str]:
    """The vertices of a ``final_status_list`` reply (one chain a line, vertices split by spaces)."""
    return {vertex.upper() for vertex in reply.split()}


def plain_reply(engine, line: str) -> str:
    """The engine's reply to ``line``, a command that does not stream (only analysis commands do)."""
    reply = engine.handle(line)
    assert isinstance(reply, str), line
    return reply


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="docs/record-2026-11-26", help="the model's run root (model:ROOT)")
    parser.add_argument("--games", type=int, default=100, help="games of the closing match to play")
    parser.add_argument("--seed", type=int, default=7, help="the match's seed")
    parser.add_argument(
        "--sgf-dir", default="", help="judge these SGFs (an arena.match --sgf-dir) instead of playing a match"
    )
    args = parser.parse_args(argv)

    from arena.gtp import GtpConfig, build_engine
    from arena.gtp_client import GnuGo

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        sgf_dir = args.sgf_dir
        if not sgf_dir:
            sgf_dir = os.path.join(scratch, "games")
            play_match(args.model, args.games, args.seed, sgf_dir)
        paths = sorted(glob.glob(os.path.join(sgf_dir, "*.sgf")))
        if not paths:
            parser.error(f"--sgf-dir {sgf_dir}: no .sgf files there")
        engine = build_engine(GtpConfig(visits=1, quiet=True))  # final_status_list does not search
        gnugo = GnuGo(level=CLOSING["gnugo_level"])
        counts: dict[str, dict[str, int]] = {}
        judge_seconds = 0.0
        try:
            for path in paths:
                for kind, move_number in judged_positions(path).items():
                    gnugo.send(f"loadsgf {path} {move_number}")
                    reference = dead_vertices(gnugo.send("final_status_list dead"))
                    begun = time.perf_counter()
                    loaded = plain_reply(engine, f"loadsgf {path} {move_number}")
                    if not loaded.startswith("="):
                        raise SystemExit(f"{path}: the engine refused loadsgf: {loaded.strip()}")
                    ours = dead_vertices(plain_reply(engine, "final_status_list dead").strip()[1:])
                    judge_seconds += time.perf_counter() - begun
                    tally = counts.setdefault(
                        kind, {"positions": 0, "with_dead": 0, "reference_dead": 0, "called_dead": 0, "agreed": 0}
                    )
                    tally["positions"] += 1
                    tally["with_dead"] += bool(reference)
                    tally["reference_dead"] += len(reference)
                    tally["called_dead"] += len(ours)
                    tally["agreed"] += len(reference & ours)
        finally:
            engine.close()
            gnugo.close()

    result = {
        "bench": "final_status",
        "games": len(paths),
        "model": args.model,
        **CLOSING,
        "judge_ms_per_position": round(1000 * judge_seconds / max(1, sum(c["positions"] for c in counts.values())), 1),
    }
    for kind, tally in counts.items():
        precision = tally["agreed"] / tally["called_dead"] if tally["called_dead"] else None
        recall = tally["agreed"] / tally["reference_dead"] if tally["reference_dead"] else None
        print(
            f"{kind:>10}: {tally['positions']} positions ({tally['with_dead']} with dead stones by GNU Go), "
            f"GNU Go {tally['reference_dead']} dead stones, the engine {tally['called_dead']}, both "
            f"{tally['agreed']}: precision {precision if precision is None else f'{precision:.3f}'}, "
            f"recall {recall if recall is None else f'{recall:.3f}'}"
        )
        result.update({f"{kind}_{key}": value for key, value in tally.items()})
        result[f"{kind}_precision"] = None if precision is None else round(precision, 4)
        result[f"{kind}_recall"] = None if recall is None else round(recall, 4)
    print(f"{time.perf_counter() - started:.0f} s")
    print(json.dumps(result, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
