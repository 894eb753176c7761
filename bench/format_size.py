"""Bytes per position at rest, for 9x9 and 19x19 chunks.

Games come from ``testdata.synthetic_games``: random play with policy targets shaped
like search output (200 visits on 9x9, 800 on 19x19, most on a few moves with
a tail of exploration visits).  Two figures per size:

* all positions, with playout-cap randomization keeping a full-search policy
  target on 25% of moves (KataGo's default share);
* full-search positions, from chunks where *every* position has a target
  (the worst case, and the acceptance figure).

As a peer measured in the same run, the same positions are also written the
way Minigo stores them (17 uint8 feature planes + dense float32 policy +
outcome in a tf.train.Example, ZLIB-compressed TFRecord).

Ends with one JSON line.
"""
from __future__ import annotations

import json
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from format import codec  # noqa: E402
from format.example_proto import Example  # noqa: E402
from testdata.synthetic_games import synthetic_game  # noqa: E402
from format.tfrecord import frame_records  # noqa: E402

GAMES_PER_CHUNK = 64
VISITS = {9: 200, 19: 800}


def chunk_bytes_per_position(n: int, full_fraction: float, chunks: int, seed: int) -> tuple[float, list]:
    rng = np.random.default_rng(seed)
    total_bytes = total_positions = 0
    sample = []
    for _ in range(chunks):
        games = [synthetic_game(rng, n, visits=VISITS[n], full_search_fraction=full_fraction)
                 for _ in range(GAMES_PER_CHUNK)]
        data = codec.encode_chunk(games)
        total_bytes += len(data)
        total_positions += sum(g.num_positions for g in games)
        sample = games[:8]
    return total_bytes / total_positions, sample


def minigo_bytes_per_position(games: list) -> float:
    """Minigo's at-rest layout for the same positions (features uint8, pi float32, ZLIB)."""
    records = []
    for game in games:
        n = game.board_size
        for i in range(game.num_positions):
            x = np.zeros((n, n, 17), dtype=np.uint8)
            me = 0 if i % 2 == 0 else 1
            for h in range(8):
                j = i - h
                if j < 0:
                    break
                x[:, :, h] = game.planes[j, me]
                x[:, :, 8 + h] = game.planes[j, 1 - me]
            x[:, :, 16] = 1 if me == 0 else 0
            pi = np.zeros(n * n + 1, dtype=np.float32)
            idx, probs = game.policy_probs(i)
            pi[idx] = probs
            ex = Example()
            ex.features.feature["x"].bytes_list.value.append(x.tobytes())
            ex.features.feature["pi"].bytes_list.value.append(pi.tobytes())
            ex.features.feature["outcome"].float_list.value.append(float(game.winner))
            records.append(ex.SerializeToString())
    return len(zlib.compress(frame_records(records), 6)) / len(records)


def main() -> None:
    started = time.time()
    result = {"bench": "format_size"}
    print(f"{'board':>5}  {'positions':>22}  {'bytes/position':>14}")
    for n, chunks in ((9, 6), (19, 3)):
        all_bpp, _ = chunk_bytes_per_position(n, 0.25, chunks, seed=n)
        full_bpp, sample = chunk_bytes_per_position(n, 1.0, chunks, seed=100 + n)
        minigo = minigo_bytes_per_position(sample)
        print(f"{n:>3}x{n:<2}  {'all (25% full search)':>22}  {all_bpp:14.1f}")
        print(f"{n:>3}x{n:<2}  {'full search':>22}  {full_bpp:14.1f}")
        print(f"{n:>3}x{n:<2}  {'Minigo layout, same pos':>22}  {minigo:14.1f}   ({minigo / full_bpp:.0f}x ours)")
        result[f"bytes_per_position_{n}"] = round(all_bpp, 2)
        result[f"bytes_per_full_search_position_{n}"] = round(full_bpp, 2)
        result[f"minigo_bytes_per_position_{n}"] = round(minigo, 1)
    print(f"(visits: 9x9 {VISITS[9]}, 19x19 {VISITS[19]}; {GAMES_PER_CHUNK} games per chunk; "
          f"references: KataGo ~900 B/position compressed, Minigo ~7.6 KB raw; {time.time() - started:.0f} s)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
