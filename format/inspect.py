"""``python -m format.inspect``: look inside chunks, shards and whole lakes.

Subcommands::

    summary PATH|ROOT [--json]        games, positions, bytes/position, generations,
                                      results and how games ended
    game PATH --index N --sgf OUT     export one game as SGF (policy top moves as comments)
    position PATH --game N --move M   ASCII board, top policy moves, value, ownership heatmap
    verify PATH|ROOT                  check every CRC and decode every record;
                                      exit 1 naming each bad file

PATH is one chunk (``*.tfrecord.zst``), shard (``*.tfrecord.gz``) or window
game table (``*.table.gz``); ROOT is a lake root or any folder/prefix under
it.  Both may be local or ``gs://``.  A shard is read with the game
table beside it (format.layout.game_table_beside).
Data flows storage -> ``format.codec`` -> tables; nothing here writes.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import posixpath
import sys
from dataclasses import dataclass, field

import numpy as np

from format import codec, layout, schema
from format.cli import bounded_number
from format.documents import printable

EXIT_OK, EXIT_BAD_DATA, EXIT_USAGE = 0, 1, 2


# --------------------------------------------------------------------------
# Locating files
# --------------------------------------------------------------------------


def _is_record_file(path: str) -> bool:
    return path.endswith((schema.CHUNK_SUFFIX, schema.SHARD_SUFFIX, schema.GAME_TABLE_SUFFIX))


def locate(target: str):
    """(storage, [relative paths of record files]) for a file or a folder/prefix."""
    from cloud.storage import open_storage

    if not target.endswith("://"):
        target = target.rstrip("/")
    folder = False
    if "://" not in target and not target.startswith("file:"):
        import os

        if not os.path.exists(target):
            raise InspectError(f"{target}: no such file or folder")
        folder = os.path.isdir(target)
        if not folder and not os.path.isfile(target):
            # A FIFO would block the read for ever, a device would never end.
            raise InspectError(f"{target}: not a regular file or a folder; nothing to read")
    if _is_record_file(target) and not folder:
        parent, name = posixpath.split(target) if target.startswith("gs://") else _split_local(target)
        return open_storage(parent or "."), [name]
    storage = open_storage(target)
    return storage, [info.path for info in storage.list("") if _is_record_file(info.path)]


class InspectError(Exception):
    """Bad command-line input: printed as one line, exit status 2."""


def _split_local(path: str):
    import os

    return os.path.dirname(path) or ".", os.path.basename(path)


# --------------------------------------------------------------------------
# summary / verify
# --------------------------------------------------------------------------


@dataclass
class Summary:
    chunks: int = 0
    shards: int = 0
    games: int = 0
    positions: int = 0
    full_search_positions: int = 0
    chunk_bytes: int = 0
    shard_positions: int = 0
    shard_bytes: int = 0
    game_tables: int = 0
    generations: collections.Counter = field(default_factory=collections.Counter)
    board_sizes: collections.Counter = field(default_factory=collections.Counter)
    winners: collections.Counter = field(default_factory=collections.Counter)
    end_reasons: collections.Counter = field(default_factory=collections.Counter)
    ownership_sources: collections.Counter = field(default_factory=collections.Counter)
    resign_disabled_games: int = 0
    resign_would_have_been_wrong: int = 0
    bad_files: dict = field(default_factory=dict)

    def add_game(self, game: codec.GameRecord) -> None:
        self.games += 1
        self.positions += game.num_positions
        self.full_search_positions += int(np.count_nonzero(game.full_search))
        self.generations[game.generation] += 1
        self.board_sizes[game.board_size] += 1
        self.winners[{schema.BLACK: "B", schema.WHITE: "W"}.get(game.winner, "draw")] += 1
        self.end_reasons[schema.END_REASONS[game.end_reason]] += 1
        self.ownership_sources[schema.OWNERSHIP_SOURCES[game.ownership_source]] += 1
        if not game.resign_enabled:
            self.resign_disabled_games += 1
            if game.would_resign and game.would_resign == game.winner:
                self.resign_would_have_been_wrong += 1

    def as_dict(self) -> dict:
        return {
            "chunks": self.chunks,
            "shards": self.shards,
            "games": self.games,
            "positions": self.positions,
            "full_search_positions": self.full_search_positions,
            "chunk_bytes": self.chunk_bytes,
            "bytes_per_position": self.chunk_bytes / self.positions if self.positions else None,
            "shard_positions": self.shard_positions,
            "shard_bytes_per_position": self.shard_bytes / self.shard_positions if self.shard_positions else None,
            "game_tables": self.game_tables,
            "generations": {str(k): v for k, v in sorted(self.generations.items())},
            "board_sizes": {str(k): v for k, v in sorted(self.board_sizes.items())},
            "results": dict(self.winners),
            "end_reasons": dict(self.end_reasons),
            "ownership_sources": dict(self.ownership_sources),
            "resign_disabled_games": self.resign_disabled_games,
            "resign_would_have_been_wrong": self.resign_would_have_been_wrong,
            "bad_files": self.bad_files,
        }


def _game_table(storage, path: str, tables: dict):
    """The game table beside shard ``path`` (cached), or None when it is missing or damaged
    (a shard then reports what is wrong with it)."""
    table_path = layout.game_table_beside(path)
    if table_path not in tables:
        tables[table_path] = None
        try:
            if storage.exists(table_path):
                tables[table_path] = codec.decode_game_table(storage.read(table_path), storage.url(table_path))
        except Exception as exc:  # damaged or unreadable: the shards that need it say so
            tables[table_path] = exc
    return tables[table_path]


def scan(storage, paths, *, progress=True) -> Summary:
    """Decode every record of every file; bad files are noted, never fatal."""
    summary = Summary()
    tables: dict = {}
    for number, path in enumerate(paths, 1):
        url = storage.url(path)
        try:
            data = storage.read(path)
        except Exception as exc:  # a storage error costs only this file
            summary.bad_files[url] = f"unreadable: {exc}"
            continue
        if not data:
            # Writers never create an empty chunk or shard (each holds at least
            # one record, in a compressed frame), so 0 bytes is damage.
            summary.bad_files[url] = "empty file (0 bytes): a chunk or shard always holds at least one record"
            continue
        if path.endswith(schema.CHUNK_SUFFIX):
            good: list[codec.GameRecord] = []
            problems: list[codec.FormatError] = []
            for item in codec.iter_chunk(data, url):
                if isinstance(item, codec.FormatError):
                    problems.append(item)
                else:
                    good.append(item)
            if problems:
                summary.bad_files[url] = "; ".join(str(p) for p in problems[:3])
            # A damaged chunk's good records still count (they are on disk and
            # readable), but its bytes are left out of bytes/position.
            for game in good:
                summary.add_game(game)
            if not problems:
                summary.chunks += 1
                summary.chunk_bytes += len(data)
        elif path.endswith(schema.GAME_TABLE_SUFFIX):
            try:
                codec.decode_game_table(data, url)
            except codec.FormatError as exc:
                summary.bad_files[url] = str(exc)
                continue
            summary.game_tables += 1
        else:
            table = _game_table(storage, path, tables)
            try:
                records = codec.read_shard(data, url, table=table if isinstance(table, codec.GameTable) else None)
            except codec.FormatError as exc:
                why = str(exc)
                if exc.field == schema.P_GAME and not isinstance(table, codec.GameTable):
                    table_url = storage.url(layout.game_table_beside(path))
                    why += f" (its game table {table_url} is " + (f"damaged: {table})" if table else "missing)")
                summary.bad_files[url] = why
                continue
            summary.shards += 1
            summary.shard_positions += len(records)
            summary.shard_bytes += len(data)
        if progress and number % 50 == 0:
            print(f"[inspect] {number}/{len(paths)} files", file=sys.stderr)
    return summary


def _table(summary: Summary) -> str:
    d = summary.as_dict()
    rows = [
        ("chunks", d["chunks"]),
        ("games", d["games"]),
        ("positions", d["positions"]),
        ("full-search positions", d["full_search_positions"]),
        ("bytes/position", f"{d['bytes_per_position']:.1f}" if d["bytes_per_position"] else "-"),
        ("board sizes", _fmt_counter(d["board_sizes"])),
        ("generations", _fmt_counter(d["generations"])),
        ("results", _fmt_counter(d["results"])),
        ("ended by", _fmt_counter(d["end_reasons"])),
        ("ownership from", _fmt_counter(d["ownership_sources"])),
        (
            "resign-disabled games",
            f"{d['resign_disabled_games']} ({d['resign_would_have_been_wrong']} would have resigned wrongly)",
        ),
        ("shards", d["shards"]),
        ("shard positions", d["shard_positions"]),
        ("game tables", d["game_tables"]),
        ("bad files", len(d["bad_files"])),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"  BAD {url}: {why}" for url, why in d["bad_files"].items()]
    return "\n".join(lines)


def _fmt_counter(counter: dict) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counter.items()) or "-"


def cmd_summary(args) -> int:
    storage, paths = locate(args.target)
    summary = scan(storage, paths, progress=not args.json)
    print(json.dumps(summary.as_dict(), indent=2) if args.json else _table(summary))
    return EXIT_OK


def cmd_verify(args) -> int:
    storage, paths = locate(args.target)
    if not paths:
        print(f"no chunks, shards or game tables under {args.target}", file=sys.stderr)
        return EXIT_BAD_DATA
    summary = scan(storage, paths)
    for url, why in summary.bad_files.items():
        print(f"BAD {url}: {why}")
    good = len(paths) - len(summary.bad_files)
    print(f"verified {len(paths)} files: {good} good, {len(summary.bad_files)} bad")
    return EXIT_BAD_DATA if summary.bad_files else EXIT_OK


# --------------------------------------------------------------------------
# game / position
# --------------------------------------------------------------------------


def _load_game(target: str, index: int) -> codec.GameRecord:
    storage, paths = locate(target)
    if len(paths) != 1 or not paths[0].endswith(schema.CHUNK_SUFFIX):
        raise SystemExit(f"error: {target} is not a chunk file (*{schema.CHUNK_SUFFIX})")
    games = codec.read_chunk(storage.read(paths[0]), storage.url(paths[0]))
    if not 0 <= index < len(games):
        raise SystemExit(f"error: --index/--game {index} out of range: {target} holds {len(games)} games")
    return games[index]


def _top_moves(game: codec.GameRecord, move: int, k: int = 5) -> list[tuple[str, float]]:
    from format.coords import move_to_gtp as to_gtp

    indices, probs = game.policy_probs(move)
    order = np.argsort(-probs, kind="stable")[:k]
    return [(to_gtp(int(indices[i]), game.board_size), float(probs[i])) for i in order]


def _result_string(game: codec.GameRecord) -> str | None:
    if game.winner == 0:
        return "0" if game.end_reason == schema.END_TWO_PASSES else None
    colour = "B" if game.winner == schema.BLACK else "W"
    if game.end_reason == schema.END_RESIGN:
        return f"{colour}+R"
    if math.isfinite(game.score):
        return f"{colour}+{abs(game.score):g}"
    return f"{colour}+"


def cmd_game(args) -> int:
    from format.sgf import game_to_sgf

    game = _load_game(args.target, args.index)
    comments = []
    for i in range(game.num_positions):
        parts = [f"value {game.root_values[i]:+.2f}"]
        if game.full_search[i] and len(game.policy_indices[i]):
            parts.append("policy " + " ".join(f"{m}:{p:.2f}" for m, p in _top_moves(game, i)))
        else:
            parts.append("fast search")
        comments.append("; ".join(parts))
    data = game_to_sgf(
        game.board_size, game.komi, [int(m) for m in game.moves], result=_result_string(game), comments=comments
    )
    try:
        with open(args.sgf, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise InspectError(f"--sgf {args.sgf}: cannot write it ({exc.strerror})") from None
    print(f"wrote {args.sgf}: {game.num_positions} moves, result {_result_string(game) or '?'}")
    return EXIT_OK


def _heat(value: float) -> str:
    """Ownership in [-1, 1] (Black positive) as one character."""
    if value > 0.6:
        return "X"
    if value > 0.2:
        return "x"
    if value < -0.6:
        return "O"
    if value < -0.2:
        return "o"
    return "."


def render_position(game: codec.GameRecord, move: int) -> str:
    from format.coords import move_to_gtp as to_gtp

    n = game.board_size
    letters = [c for c in "ABCDEFGHJKLMNOPQRST"][:n]
    black, white = game.planes[move, 0], game.planes[move, 1]
    to_move = "Black" if move % 2 == 0 else "White"
    played = to_gtp(int(game.moves[move]), n)
    lines = [f"game {printable(game.game_id)} move {move}: {to_move} to play, played {played}", ""]
    own = game.ownership.reshape(n, n) if game.ownership is not None else None
    header = "   " + " ".join(letters)
    lines.append(header + ("      ownership (X Black, O White)" if own is not None else ""))
    for row in range(n):
        cells = ["X" if black[row, col] else "O" if white[row, col] else "." for col in range(n)]
        line = f"{n - row:2d} " + " ".join(cells)
        if own is not None:
            line += "      " + " ".join(_heat(float(v)) for v in own[row])
        lines.append(line)
    lines.append("")
    lines.append(f"root value (side to move): {game.root_values[move]:+.3f}")
    if game.full_search[move] and len(game.policy_indices[move]):
        lines.append("policy: " + "  ".join(f"{m} {p:.1%}" for m, p in _top_moves(game, move)))
    else:
        lines.append("policy: none recorded (fast search)")
    lines.append(f"ownership from: {schema.OWNERSHIP_SOURCES[game.ownership_source]}")
    return "\n".join(lines)


def cmd_position(args) -> int:
    game = _load_game(args.target, args.game)
    if not 0 <= args.move < game.num_positions:
        raise SystemExit(f"error: --move {args.move} out of range: the game has {game.num_positions} positions")
    print(render_position(game, args.move))
    return EXIT_OK


# --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m format.inspect",
        description="Inspect zerolake chunks (*.tfrecord.zst), shards (*.tfrecord.gz), window game tables "
        "(*.table.gz) and lakes, local or gs://.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("summary", help="games, positions, bytes/position, generations, results")
    p.add_argument("target", help="a chunk, shard or game table file, or a lake root / folder / gs:// prefix")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=cmd_summary)
    p = sub.add_parser("game", help="export one game of a chunk as SGF")
    p.add_argument("target", help="a chunk file")
    p.add_argument(
        "--index", type=bounded_number(int, at_least=0), default=0, help="game number within the chunk (from 0)"
    )
    p.add_argument("--sgf", required=True, help="output .sgf path")
    p.set_defaults(run=cmd_game)
    p = sub.add_parser("position", help="show one position: board, policy, value, ownership")
    p.add_argument("target", help="a chunk file")
    p.add_argument(
        "--game", type=bounded_number(int, at_least=0), default=0, help="game number within the chunk (from 0)"
    )
    p.add_argument(
        "--move", type=bounded_number(int, at_least=0), required=True, help="position number (0 = empty board)"
    )
    p.set_defaults(run=cmd_position)
    p = sub.add_parser("verify", help="check CRCs and decode every record; exit 1 on any bad file")
    p.add_argument("target", help="a chunk, shard or game table file, or a lake root / folder / gs:// prefix")
    p.set_defaults(run=cmd_verify)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from cloud.storage import StorageError

    try:
        return args.run(args)
    except (StorageError, InspectError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
