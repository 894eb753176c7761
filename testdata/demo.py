"""``python -m testdata.demo``: write a small synthetic lake and inspect it.

Shows the storage layer and the inspect tools end to end without a Go engine
or a network: synthetic games (``testdata.synthetic_games``) are written as chunks
create-only under ``ROOT/games/000000/``, then summarized and verified.

Synthetic games break Go's rules and carry random policy targets: a shuffle
job would train on them like any other chunk.  So the demo writes only into
an empty root or a root it made itself (``layout.DEMO_MARKER``, written first),
and refuses any other with one line; its default root, ``./demo-lake``, is
not the loop's ``./lake``.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from format import codec, layout, schema
from format.cli import bounded_number
from format.inspect import main as inspect_main
from format.run_config import RunConfig, ensure_run_config
from testdata.synthetic_games import synthetic_game


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testdata.demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root",
        default="./demo-lake",
        help="an empty folder or gs:// root, or one this demo made (default ./demo-lake)",
    )
    parser.add_argument(
        "--board-size",
        type=bounded_number(int, at_least=schema.MIN_BOARD_SIZE, at_most=schema.MAX_BOARD_SIZE),
        default=9,
        help=f"board size, {schema.MIN_BOARD_SIZE}..{schema.MAX_BOARD_SIZE} (default 9)",
    )
    parser.add_argument(
        "--chunks",
        type=bounded_number(int, at_least=1, at_most=100),
        default=4,
        help="chunks to write, 1..100 (default 4)",
    )
    parser.add_argument(
        "--games-per-chunk",
        type=bounded_number(int, at_least=1, at_most=1000),
        default=16,
        help="games per chunk, 1..1000 (default 16)",
    )
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from cloud.storage import open_storage

    storage = open_storage(args.root)
    if not storage.exists(layout.DEMO_MARKER):
        held = storage.list("")
        if held:
            print(
                f"python -m testdata.demo: error: {storage.url('')} already holds {len(held)} object(s) "
                f"(e.g. {held[0].path}) and is not a demo lake; its synthetic games would be trained on. "
                "Give an empty folder, e.g. --root ./demo-lake",
                file=sys.stderr,
            )
            return 2
        storage.write_new(layout.DEMO_MARKER, b"synthetic games of python -m testdata.demo: train nothing on them\n")
    ensure_run_config(storage, RunConfig(board_size=args.board_size))
    rng = np.random.default_rng()
    for seq in range(args.chunks):
        games = [
            synthetic_game(rng, args.board_size, visits=200, full_search_fraction=0.25, worker_id="demo")
            for _ in range(args.games_per_chunk)
        ]
        path = layout.chunk_path(0, "demo", int(time.time() * 1000), seq)
        storage.write_new(path, codec.encode_chunk(games))
        print(f"wrote {storage.url(path)}")
    inspect_main(["summary", args.root])
    return inspect_main(["verify", args.root])


if __name__ == "__main__":
    sys.exit(main())
