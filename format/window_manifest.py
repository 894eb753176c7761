"""The window manifest, ``windows/<gen>/MANIFEST.json`` (format/SPEC.md): written last by the shuffle job,
it makes a window complete, and names its shards, its game table and the job's statistics.

`window_manifest_bytes` is the writer's half (it validates what it writes), `parse_window_manifest`
the reader's, and `read_window_manifest` reads one from a storage (optionally checking that every
file it names is there).  Each returns or checks a `WindowManifest`; a damaged manifest is a
ManifestError (format.documents) naming the object and the field.
"""

from __future__ import annotations

import dataclasses
import json

from format import schema
from format.documents import (
    MAX_DOCUMENT_BYTES,
    ManifestError,
    check_numbers,
    document_value,
    json_object,
    required_field,
    shown,
    too_large,
)
from format.layout import (
    SAFE_NAME,
    game_table_path,
    is_window_file_name,
    parse_generation,
    shard_path,
    window_dir,
    window_manifest,
)
from format.tfrecord import MAX_EXPANSION

WINDOW_MANIFEST_VERSION = 1


MAX_WINDOW_POSITIONS = 10**9
"""No window holds more position records than this (a billion: 1,000x the
default window's growth at any lake size people run); a manifest that says
more is damaged, not a plan for billions of training steps."""


@dataclasses.dataclass(frozen=True)
class WindowManifest:
    """A complete window, as its manifest describes it.

    ``shards`` are paths relative to the root; the job's statistics that
    readers report are typed fields too; ``document`` is the whole manifest
    as read, for tools that show or rewrite it.
    """

    target_generation: int
    board_size: int
    shards: tuple[str, ...]
    positions: int
    path: str
    record_version: int = 1
    """Position-record version of every shard (SPEC.md); the reader accepts only the current one."""
    document: dict = dataclasses.field(repr=False, compare=False, default_factory=dict)
    game_table: str | None = None
    """Path (relative to the root) of the window's game table."""
    games: tuple[str, ...] | None = None
    """The window's game ids, in the order a record's 'game' field indexes them (None: the manifest
    lists none)."""
    attempt: str | None = None
    """The id of the shuffle attempt that wrote the window (None in manifests that do not say)."""
    positions_per_byte: float | None = None
    """The planner's positions per compressed chunk byte ('window.positions_per_byte'), which the
    follower reuses to estimate new games' positions; None when the manifest does not say."""
    planned_lake_bytes: int | None = None
    """The lake's chunk bytes when the window was planned ('window.lake_bytes'); None in older manifests."""
    planned_chunks: tuple[str, ...] = ()
    """The chunks the window took ('window.chunks'), for a manifest without 'window.lake_bytes'."""
    positions_read: int = 0
    """Positions the job read from the window's chunks ('input.positions_read'), before dedup and caps."""
    chunks_skipped: tuple[tuple[str, str], ...] = ()
    """(chunk path, reason) of each chunk the job skipped as damaged ('chunks_skipped')."""
    duplicate_games: int = 0
    """Games dropped as copies of others ('dedup.duplicate_games')."""
    capped_positions_removed: int = 0
    """Positions removed by the per-game cap ('dedup.capped_positions_removed')."""

    @property
    def files(self) -> tuple[str, ...]:
        """Every data file the window needs: its shards, then its game table if it has one."""
        return self.shards + ((self.game_table,) if self.game_table else ())


def window_manifest_bytes(document: dict) -> bytes:
    """Serialize a window manifest (the writer's half of the contract)."""
    if document.get("version") != WINDOW_MANIFEST_VERSION:
        raise ValueError(f"a window manifest must carry version {WINDOW_MANIFEST_VERSION}")
    parse_window_manifest(json.dumps(document).encode(), window_manifest(document["target_generation"]))
    return (json.dumps(document, indent=1) + "\n").encode()


def parse_window_manifest(data: bytes, path: str, url: str | None = None) -> WindowManifest:
    """Validate a window manifest's bytes; ManifestError names the object and field.

    ``path`` is the manifest's path in the lake (it must be the manifest of
    the window its ``target_generation`` names); ``url`` is how to name it
    in errors (default: ``path``).
    """
    url = url or path
    document = json_object(data, url)

    def need(name, kind):
        return required_field(document, name, kind, url)

    version = need("version", int)
    if version != WINDOW_MANIFEST_VERSION:
        raise ManifestError(url, "version", f"is {version}; this reader knows version {WINDOW_MANIFEST_VERSION}")
    generation = need("target_generation", int)
    if generation < 0 or window_manifest(generation) != path:
        raise ManifestError(url, "target_generation", f"{generation} does not match the manifest's folder")
    board_size = need("board_size", int)
    if not schema.MIN_BOARD_SIZE <= board_size <= schema.MAX_BOARD_SIZE:
        raise ManifestError(
            url, "board_size", f"{board_size} is outside {schema.MIN_BOARD_SIZE}..{schema.MAX_BOARD_SIZE}"
        )
    shards = need("shards", list)
    bad = [s for s in shards if not is_window_file_name(s, schema.SHARD_SUFFIX)]
    if not shards or bad or len(set(shards)) != len(shards):
        named = f" ({shown(bad[0])} is not one)" if bad else ""
        raise ManifestError(
            url,
            "shards",
            f"must list the window's shard file names, each once "
            f"(letters, digits, '_', '.', '-', ending in {schema.SHARD_SUFFIX}){named}",
        )
    check_numbers(document, url)
    positions = need("positions", int)
    if not 0 < positions <= MAX_WINDOW_POSITIONS:
        raise ManifestError(url, "positions", f"is {positions}, expected 1..{MAX_WINDOW_POSITIONS:,}")
    _check_counts(document, "shard_positions", shards, positions, url)
    _check_counts(document, "generations", None, positions, url)
    if not all(parse_generation(f"{g:0>6}") is not None for g in document.get("generations", {})):
        raise ManifestError(url, "generations", "must be keyed by generation numbers")
    komi = document.get("komi", 0.0)
    if not isinstance(komi, (int, float)) or isinstance(komi, bool) or abs(komi) > schema.MAX_KOMI:
        raise ManifestError(
            url, "komi", f"is {komi!r}, expected a number in [-{schema.MAX_KOMI:g}, {schema.MAX_KOMI:g}]"
        )
    record_version = need("record_version", int) if "record_version" in document else 1
    problem = schema.position_record_version_problem(record_version)
    if problem:
        raise ManifestError(url, "record_version", problem)
    games = document.get("games", [])
    if not isinstance(games, list) or not all(isinstance(g, str) for g in games):
        raise ManifestError(url, "games", "must be a list of game ids (what a record's 'game' indexes)")
    table = document.get("game_table")
    if not isinstance(table, str) or not is_window_file_name(table, schema.GAME_TABLE_SUFFIX) or table in shards:
        raise ManifestError(
            url,
            "game_table",
            f"is {shown(table)}; it must name the window's game table "
            f"file, ending in {schema.GAME_TABLE_SUFFIX} (the records "
            "keep each game's ownership label and generation there)",
        )
    table = game_table_path(generation, table)
    attempt = document.get("attempt")
    if attempt is not None and not (isinstance(attempt, str) and SAFE_NAME.fullmatch(attempt)):
        raise ManifestError(url, "attempt", "must be the id of the attempt that wrote the window")
    plan = document.get("window", {})
    if not isinstance(plan, dict):
        raise ManifestError(url, "window", "must be an object (the window's plan)")
    per_byte = plan.get("positions_per_byte")
    per_byte = (
        float(per_byte)
        if isinstance(per_byte, (int, float)) and not isinstance(per_byte, bool) and per_byte > 0
        else None
    )
    lake_bytes = plan.get("lake_bytes")
    lake_bytes = lake_bytes if isinstance(lake_bytes, int) and not isinstance(lake_bytes, bool) else None
    planned = plan.get("chunks", [])
    planned = tuple(planned) if isinstance(planned, list) and all(isinstance(c, str) for c in planned) else ()
    return WindowManifest(
        target_generation=generation,
        board_size=board_size,
        shards=tuple(shard_path(generation, s) for s in shards),
        positions=positions,
        path=path,
        record_version=record_version,
        document=document,
        game_table=table,
        games=tuple(games) if "games" in document else None,
        attempt=attempt,
        positions_per_byte=per_byte,
        planned_lake_bytes=lake_bytes,
        planned_chunks=planned,
        **_window_statistics(document, url),
    )


def _window_statistics(document: dict, url: str) -> dict:
    """The job's statistics as WindowManifest fields; absent ones are 0 (or none skipped), a
    present one of the wrong type is a ManifestError naming it."""

    def count(section: str, name: str) -> int:
        part = document.get(section, {})
        value = part.get(name, 0) if isinstance(part, dict) else None
        return document_value(value, int, lambda problem: ManifestError(url, f"{section}.{name}", problem), at_least=0)

    skipped = document.get("chunks_skipped", [])
    if not isinstance(skipped, list) or not all(
        isinstance(entry, dict) and isinstance(entry.get("chunk"), str) and isinstance(entry.get("reason"), str)
        for entry in skipped
    ):
        raise ManifestError(url, "chunks_skipped", 'must list {"chunk": path, "reason": text} objects')
    return {
        "positions_read": count("input", "positions_read"),
        "chunks_skipped": tuple((entry["chunk"], entry["reason"]) for entry in skipped),
        "duplicate_games": count("dedup", "duplicate_games"),
        "capped_positions_removed": count("dedup", "capped_positions_removed"),
    }


def _check_counts(document: dict, name: str, keys, total: int, url: str) -> None:
    """``document[name]``, when present, maps names (``keys``, when given, exactly) to
    position counts that add up to ``total``, the window's positions."""
    counts = document.get(name)
    if counts is None:
        return
    if not isinstance(counts, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts.values()
    ):
        raise ManifestError(url, name, "must map names to position counts (ints >= 0)")
    if keys is not None and set(counts) != set(keys):
        raise ManifestError(url, name, "must give the count of exactly the shards the manifest lists")
    if sum(counts.values()) != total:
        raise ManifestError(url, name, f"adds up to {sum(counts.values())}, but 'positions' is {total}")


def read_window_manifest(storage, generation: int, *, check_shards: bool = False) -> WindowManifest:
    """Read and validate ``windows/<gen>/MANIFEST.json``.

    With ``check_shards`` every shard it names, and its game table, must
    exist, or ManifestError names the first missing one.  A missing manifest
    raises the storage layer's NotFound (the window is not complete yet).
    """
    from cloud.base import TooLarge

    path = window_manifest(generation)
    try:
        data = storage.read(path, max_bytes=MAX_DOCUMENT_BYTES)
    except TooLarge:
        raise ManifestError(storage.url(path), "", too_large(MAX_DOCUMENT_BYTES)) from None
    window = parse_window_manifest(data, path, storage.url(path))
    if check_shards:
        sizes = {info.path: info.size for info in storage.list(window_dir(generation) + "/")}
        for shard in window.shards:
            if shard not in sizes:
                raise ManifestError(storage.url(path), "shards", f"names {storage.url(shard)}, which is missing")
        # Each record holds at least one byte, and a shard may expand at most
        # MAX_EXPANSION times (format.tfrecord), so its bytes bound its positions.
        most = MAX_EXPANSION * sum(sizes[shard] for shard in window.shards)
        if window.positions > most:
            raise ManifestError(
                storage.url(path),
                "positions",
                f"is {window.positions}, more than its shards' {most // MAX_EXPANSION:,} bytes can "
                f"hold (at most {MAX_EXPANSION} positions a byte)",
            )
        if window.game_table and window.game_table not in sizes:
            raise ManifestError(
                storage.url(path), "game_table", f"names {storage.url(window.game_table)}, which is missing"
            )
    return window
