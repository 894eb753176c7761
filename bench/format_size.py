"""Bytes at rest per position, counted on real self-play games and a real small run.

    python bench/format_size.py      # on files this run writes in a temporary folder:
1. *Games*: ``python -m selfplay.worker`` (settings pinned, `PINNED_WORKER_FLAGS`) plays 9x9 and
   19x19 games into a local lake, first with the uniform evaluator, then with a small untrained
   network published as generation 1.
2. *Chunks*: ``bytes_per_position_<N>``, every chunk byte over its positions;
   ``bytes_per_full_search_position_<N>``, the same when every move is fully searched (worst case).
3. *Shards*: ``python -m pipeline.shuffle`` (`PINNED_SHUFFLE_FLAGS`) writes one window from each
   lake; ``shard_bytes_per_record_<N>`` counts shard and game-table bytes (the table holds each
   game's labels once) over the positions; ``lake_bytes_per_position_9`` every file under games/
   and windows/ over the chunks' positions.
4. *Peers* on the same positions in shard order: Minigo's tf.train.Example layout (ZLIB) and, on
   19x19, Leela Zero's v2 training text (gzip -9); positions without a policy target get a
   uniform one there.

Must hold: bytes_per_full_search_position_9 <= 40, ..._19 <= 96, shard_bytes_per_record_<N> <=
0.5 x minigo_bytes_per_record_<N>.  Ends with one JSON line.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from format import codec, layout  # noqa: E402
from format.example_proto import Example  # noqa: E402
from format.tfrecord import frame_records  # noqa: E402

GAMES = {9: 96, 19: 12}
"""Games per evaluator (uniform, then the small network) and board size: ~30k 9x9 positions in all."""
FULL_SEARCH_GAMES = {9: 48, 19: 6}
NETWORK = dict(blocks=1, filters=8, global_pool_every=1, global_pool_channels=4, value_hidden=8, policy_head="dense")
PINNED_WORKER_FLAGS = [
    "--generation0-playouts",
    "0",
    "--visits",
    "64",
    "--fast-visits",
    "16",
    "--full-search-fraction",
    "0.25",
    "--resign-threshold",
    "-0.9",
    "--resign-consecutive",
    "3",
    "--resign-disabled-fraction",
    "0.1",
    "--accelerated-visits",
    "2",
]
"""Every worker setting the sizes depend on (how many moves get a full search and so a policy target, how
long games run), pinned at the values first measured with: the learning work moves the defaults."""
PINNED_SHUFFLE_FLAGS = ["--reuse", "1.5", "--shard-gzip-level", "2", "--position-cap", "8", "--dedup-max-move", "20"]
"""The shuffle job's settings the shard bytes depend on (copies of each position, compression, dedup), pinned."""


def _env(root: Path) -> dict:
    # The worker's spool defaults to the user's state folder: keep it beside the lake.
    return dict(
        os.environ,
        PYTHONPATH=str(REPO),
        TF_CPP_MIN_LOG_LEVEL="3",
        XDG_STATE_HOME=str(root.parent / f"state-{root.name}"),
    )


def play(root: Path, board_size: int, games: int, *flags: str) -> None:
    """``games`` finished games of the worker into ``root``, with whatever model LATEST names."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "selfplay.worker",
            "--root",
            str(root),
            "--board-size",
            str(board_size),
            "--games",
            str(min(games, 64)),
            "--max-games",
            str(games),
            "--chunk-games",
            "32",
            "--progress-seconds",
            "600",
            *PINNED_WORKER_FLAGS,
            *flags,
        ],
        cwd=REPO,
        env=_env(root),
        check=True,
        stdout=subprocess.DEVNULL,
    )


def shuffle(root: Path) -> dict:
    """Run the shuffle job on ``root`` at the pinned settings; return the window's manifest."""
    subprocess.run(
        [sys.executable, "-m", "pipeline.shuffle", "--root", str(root), *PINNED_SHUFFLE_FLAGS],
        cwd=REPO,
        env=_env(root),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    windows = root / layout.WINDOWS_DIR
    (folder,) = [p for p in windows.iterdir() if (p / layout.MANIFEST).exists()]
    return json.loads((folder / layout.MANIFEST).read_text()) | {"folder": str(folder)}


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def chunk_positions(root: Path) -> tuple[int, int]:
    """(bytes, positions) of every chunk under ``root``."""
    size = positions = 0
    for path in _files(root / layout.GAMES_DIR):
        data = path.read_bytes()
        size += len(data)
        positions += sum(game.num_positions for game in codec.read_chunk(data, str(path)))
    return size, positions


def shard_positions(manifest: dict) -> tuple[int, list]:
    """(bytes, decoded positions) of a window's shards, in shard order; the bytes include the
    window's game table, which the shards need (record version 3)."""
    folder = Path(manifest["folder"])
    size, positions, table = 0, [], None
    if manifest.get("game_table"):
        data = (folder / manifest["game_table"]).read_bytes()
        size += len(data)
        table = codec.decode_game_table(data, manifest["game_table"], games=manifest.get("games"))
    for name in manifest["shards"]:
        data = (folder / name).read_bytes()
        size += len(data)
        positions += codec.read_shard(data, name, games=manifest.get("games"), table=table)
    return size, positions


def _dense_policy(position) -> np.ndarray:
    actions = position.board_size**2 + 1
    pi = np.zeros(actions, np.float32)
    if len(position.policy_index):
        pi[position.policy_index] = position.policy_prob
    else:
        pi[:] = 1.0 / actions
    return pi


def minigo_records(positions: list) -> list[bytes]:
    """Minigo's record of each position: x uint8[N, N, 17] (16 planes, then 1s for Black to move),
    pi float32[N²+1], outcome."""
    records = []
    for position in positions:
        x = np.concatenate(
            [position.planes, np.full((1,) + position.planes.shape[1:], 1 if position.to_play == 1 else 0, np.uint8)]
        )
        ex = Example()
        ex.features.feature["x"].bytes_list.value.append(np.ascontiguousarray(x.transpose(1, 2, 0)).tobytes())
        ex.features.feature["pi"].bytes_list.value.append(_dense_policy(position).tobytes())
        ex.features.feature["outcome"].float_list.value.append(float(position.value))
        records.append(ex.SerializeToString())
    return records


def minigo_bytes_per_record(positions: list) -> float:
    """Minigo's layout of ``positions`` as a ZLIB TFRecord file (zlib's default level, as TFRecordWriter)."""
    records = minigo_records(positions)
    return len(zlib.compress(frame_records(records), zlib.Z_DEFAULT_COMPRESSION)) / len(records)


def leela_zero_text(position) -> str:
    """One position in Leela Zero's v2 training format (19x19): 19 lines.

    Lines 1-16: the side to move's stones at t..t-7, then the opponent's,
    each 361 bits as 90 hex digits (4 points each, most significant first)
    plus one digit for the last point; line 17: 0 Black / 1 White to move;
    line 18: the 362 search probabilities; line 19: the winner from the
    side to move's view (1 or -1; 0 here for a drawn or unknown result).
    """
    lines = []
    for plane in position.planes.reshape(16, -1):
        bits = "".join("1" if b else "0" for b in plane.tolist())
        lines.append(f"{int(bits[:360], 2):090x}{bits[360]}")
    lines.append("0" if position.to_play == 1 else "1")
    lines.append(" ".join(f"{p:g}" for p in _dense_policy(position).tolist()))
    lines.append(str(int(np.sign(position.value))))
    return "\n".join(lines) + "\n"


def lz_bytes_per_record(positions: list) -> float:
    text = "".join(leela_zero_text(p) for p in positions).encode()
    return len(gzip.compress(text, compresslevel=9, mtime=0)) / len(positions)


def measure(scratch: Path, n: int, result: dict) -> None:
    from testdata.models import publish_untrained_model

    lake = scratch / f"lake{n}"
    play(lake, n, GAMES[n])  # uniform evaluator: no model yet
    publish_untrained_model(str(lake), 1, n, network=NETWORK, seed=n)
    play(lake, n, GAMES[n])  # the worker starts on LATEST = generation 1
    chunk_bytes, positions = chunk_positions(lake)
    full = scratch / f"full{n}"
    play(full, n, FULL_SEARCH_GAMES[n], "--full-search-fraction", "1.0")
    full_bytes, full_positions = chunk_positions(full)
    manifest = shuffle(lake)
    shard_bytes, shard_records = shard_positions(manifest)
    result[f"bytes_per_position_{n}"] = round(chunk_bytes / positions, 2)
    result[f"bytes_per_full_search_position_{n}"] = round(full_bytes / full_positions, 2)
    result[f"shard_bytes_per_record_{n}"] = round(shard_bytes / len(shard_records), 2)
    result[f"record_version_{n}"] = manifest.get("record_version", 1)
    result[f"minigo_bytes_per_record_{n}"] = round(minigo_bytes_per_record(shard_records), 2)
    result[f"positions_{n}"] = positions
    result[f"shard_records_{n}"] = len(shard_records)
    result[f"policy_entries_per_full_search_{n}"] = round(
        float(np.mean([len(r.policy_index) for r in shard_records if r.policy_weight > 0] or [0])), 1
    )
    if n == 19:
        result["lz_bytes_per_record_19"] = round(lz_bytes_per_record(shard_records), 2)
    if n == 9:
        kept = _files(lake / layout.GAMES_DIR) + _files(lake / layout.WINDOWS_DIR)
        result["lake_bytes_per_position_9"] = round(sum(p.stat().st_size for p in kept) / positions, 2)
        result["lake_windows_9"] = len(list((lake / layout.WINDOWS_DIR).iterdir()))
    print(
        f"{n}x{n}: {positions} positions in chunks, {chunk_bytes / positions:.1f} B each "
        f"(full search {full_bytes / full_positions:.1f}); shards {shard_bytes / len(shard_records):.1f} B "
        f"a record vs Minigo's {result[f'minigo_bytes_per_record_{n}']:.1f}",
        flush=True,
    )


def main() -> int:
    started = time.time()
    result: dict[str, Any] = {
        "bench": "format_size",
        "worker_flags": " ".join(PINNED_WORKER_FLAGS),
        "shuffle_flags": " ".join(PINNED_SHUFFLE_FLAGS),
    }
    with tempfile.TemporaryDirectory(prefix="zerolake-format-size-") as scratch:
        for n in (9, 19):
            measure(Path(scratch), n, result)
    for n in (9, 19):
        result[f"shard_over_minigo_{n}"] = round(
            result[f"shard_bytes_per_record_{n}"] / result[f"minigo_bytes_per_record_{n}"], 3
        )
    result["seconds"] = round(time.time() - started)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
