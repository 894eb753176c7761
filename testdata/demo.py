"""``python -m testdata.demo``: write a small synthetic lake and inspect it.

Shows the storage layer and the inspect tools end to end without a Go engine
or a network: synthetic games (``testdata.synthetic_games``) are written as chunks
create-only under ``ROOT/games/000000/``, then summarized and verified.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from format import layout
from format import codec
from format.inspect import main as inspect_main
from format.run_config import RunConfig, ensure_run_config
from testdata.synthetic_games import synthetic_game


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testdata.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="./lake", help="lake root, local folder or gs:// (default ./lake)")
    parser.add_argument("--board", type=int, default=9, help="board size (default 9)")
    parser.add_argument("--chunks", type=int, default=4, help="chunks to write (default 4)")
    parser.add_argument("--games-per-chunk", type=int, default=16, help="games per chunk (default 16)")
    args = parser.parse_args(argv)
    from cloud.storage import open_storage

    storage = open_storage(args.root)
    ensure_run_config(storage, RunConfig(board_size=args.board))
    rng = np.random.default_rng()
    for seq in range(args.chunks):
        games = [synthetic_game(rng, args.board, visits=200, full_search_fraction=0.25, worker_id="demo")
                 for _ in range(args.games_per_chunk)]
        path = layout.chunk_path(0, "demo", int(time.time() * 1000), seq)
        storage.write_new(path, codec.encode_chunk(games))
        print(f"wrote {storage.url(path)}")
    inspect_main(["summary", args.root])
    return inspect_main(["verify", args.root])


if __name__ == "__main__":
    sys.exit(main())
