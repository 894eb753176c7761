"""Where everything lives in a lake: the one owner of every path, and of each manifest.

Every role meets the others only through one storage root (a local folder or
``gs://bucket/prefix``).  This module is the only place that spells a path in
it; every other module asks it (a test scans the code for stray literals).
Paths are relative to the root, '/'-separated, as `cloud.base` defines them::

    run.json                                        the run's fixed settings (create-only)
    games/<gen>/<worker>-<ms:013d>-<seq:06d>.tfrecord.zst   self-play chunks
    windows/<gen>/<attempt>-<k>-of-<n>.tfrecord.gz  training shards for model <gen>
    windows/<gen>/<attempt>-games.table.gz          the window's game table (record version 3)
    windows/<gen>/MANIFEST.json                     written last: the window is complete
    models/<gen>/...  + models/<gen>/MANIFEST.json   published inference models
    models/LATEST                                   newest published generation
    checkpoints/...                                 the trainer's state
    loop/<marker>                                   the one-machine loop's phase markers
    loop/settings/<run>.json                        each loop invocation's full settings (create-only)
    tmp/<job>-<gen>-<attempt>/...                   a job's temporary pieces
    cluster/trainer-lease.json                      which trainer owns the root, until when
    cluster/claims/window-<gen>.json                which shuffle follower makes window <gen>
    cluster/settings/<run>.json                     each launcher invocation's full settings (create-only)
    report/...                                      derived views (plots, tables); replaceable

``<gen>`` is a generation number, zero-padded to six digits.

Manifests
---------
Each manifest kind has one version constant here and one validating reader,
which every role uses, so that a damaged or foreign manifest is refused the
same way everywhere, with a :class:`ManifestError` that names the object and
the field.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re

from cloud.base import validate_path
from format import lake_json, schema
from format.tfrecord import MAX_EXPANSION

RUN_CONFIG = "run.json"
GAMES_DIR = "games"
WINDOWS_DIR = "windows"
MODELS_DIR = "models"
CHECKPOINTS_DIR = "checkpoints"
LOOP_DIR = "loop"
TMP_DIR = "tmp"
CLUSTER_DIR = "cluster"
REPORT_DIR = "report"
MANIFEST = "MANIFEST.json"
LATEST = f"{MODELS_DIR}/LATEST"
DEMO_MARKER = "DEMO"
"""Written first by ``python -m testdata.demo``: this root holds synthetic games (not Go), never a real run."""
TRAINER_LEASE = f"{CLUSTER_DIR}/trainer-lease.json"
LOOP_LEASE = f"{LOOP_DIR}/lease.json"
"""Which ``operations.loop`` drives this root: a second loop is refused (format.leases)."""

MAX_DOCUMENT_BYTES = 64 << 20
"""The most a JSON document of the lake may hold (window and model manifests,
settings records): a window manifest lists its games at ~40 bytes each, so this
is some 1.5M games.  Readers refuse a larger object before reading it whole."""

MAX_POINTER_BYTES = 64 << 10
"""The most a small record may hold: run.json, models/LATEST, the trainer's
lease and window claims (each a few hundred bytes)."""



def too_large(max_bytes: int) -> str:
    """What a reader says of a document past its bound (after the object's URL)."""
    return lake_json.too_large(max_bytes)


WINDOW_MANIFEST_VERSION = 1
MODEL_MANIFEST_VERSION = 1

# Names are parsed with [0-9], never \d or str.isdigit(): those take any Unicode
# digit ('²', '٣'), which int() then refuses or reads as another number.  And with
# a bound: int() refuses a string of more than 4,300 digits.
_CHUNK_NAME = re.compile(r"(?P<worker>[A-Za-z0-9_.]+)-(?P<ms>[0-9]{13})-(?P<seq>[0-9]{6,18})"
                         + re.escape(schema.CHUNK_SUFFIX))
_GENERATION_NAME = re.compile(r"[0-9]{6,18}")
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*")


class ManifestError(ValueError):
    """A manifest is missing, unreadable or not what its reader expects.

    ``url`` names the object, ``field`` the offending field ('' for the file
    as a whole); the message says both.
    """

    def __init__(self, url: str, field: str, problem: str):
        where = f"{url}: field '{field}'" if field else url
        super().__init__(f"{where}: {problem}")
        self.url = url
        self.field = field


def generation_dir(generation: int) -> str:
    """Zero-padded folder name of a generation: 7 -> '000007'."""
    if isinstance(generation, bool) or int(generation) != generation or generation < 0:
        raise ValueError(f"generation must be a non-negative int, got {generation!r}")
    return f"{int(generation):06d}"


def parse_generation(name: str) -> int | None:
    """The generation of a folder name ('000007' -> 7), None for anything else:
    only what `generation_dir` writes (ASCII digits, six or more, no extra
    leading zero) is a generation."""
    if not _GENERATION_NAME.fullmatch(name):
        return None
    generation = int(name)
    return generation if generation_dir(generation) == name else None


# ---- games ---------------------------------------------------------------

def games_prefix(generation: int | None = None) -> str:
    """Listing prefix of every chunk, or of one generation's chunks."""
    if generation is None:
        return f"{GAMES_DIR}/"
    return f"{GAMES_DIR}/{generation_dir(generation)}/"


def chunk_path(generation: int, worker_id: str, time_ms: int, seq: int) -> str:
    """``games/<gen>/<worker>-<ms>-<seq>.tfrecord.zst``; ms and seq make names sort by time."""
    if not worker_id or not re.fullmatch(r"[A-Za-z0-9_.]+", worker_id):
        raise ValueError(f"worker id {worker_id!r} may hold only letters, digits, '_' and '.'")
    return f"{games_prefix(generation)}{worker_id}-{int(time_ms):013d}-{int(seq):06d}{schema.CHUNK_SUFFIX}"


@dataclasses.dataclass(frozen=True)
class ChunkName:
    """What a chunk's path says about it."""

    generation: int
    worker_id: str
    time_ms: int
    seq: int


def parse_chunk_path(path: str) -> ChunkName | None:
    """The parts of a chunk path, or None if ``path`` is not a chunk of this layout."""
    parts = path.split("/")
    if len(parts) != 3 or parts[0] != GAMES_DIR:
        return None
    generation = parse_generation(parts[1])
    match = _CHUNK_NAME.fullmatch(parts[2])
    if generation is None or not match:
        return None
    return ChunkName(generation, match["worker"], int(match["ms"]), int(match["seq"]))


# ---- windows -------------------------------------------------------------

def windows_prefix() -> str:
    return f"{WINDOWS_DIR}/"


def window_dir(generation: int) -> str:
    return f"{WINDOWS_DIR}/{generation_dir(generation)}"


def window_manifest(generation: int) -> str:
    return f"{window_dir(generation)}/{MANIFEST}"


def shard_path(generation: int, name: str) -> str:
    return f"{window_dir(generation)}/{name}"


def shard_name(attempt: str, shard: int, num_shards: int) -> str:
    """``<attempt>-<k:05d>-of-<n:05d>.tfrecord.gz``: shard k of a job attempt's window."""
    _check_attempt(attempt)
    return f"{attempt}-{int(shard):05d}-of-{int(num_shards):05d}{schema.SHARD_SUFFIX}"


def game_table_name(attempt: str) -> str:
    """``<attempt>-games.table.gz``: the game table a job attempt writes beside its shards
    (SPEC.md "Window game table"; named by the manifest's ``game_table``)."""
    _check_attempt(attempt)
    return _game_table_file(attempt)


def _game_table_file(attempt: str) -> str:
    return f"{attempt}-games{schema.GAME_TABLE_SUFFIX}"


def game_table_path(generation: int, name: str) -> str:
    return f"{window_dir(generation)}/{name}"


def game_table_beside(shard: str) -> str:
    """The game table of the window a shard belongs to, in the shard's own folder.

    ``shard`` is any path or URL of a shard named by `shard_name` (a lake
    path, ``gs://...``, or a local copy such as the trainer's staged one):
    the table is the file the same attempt wrote in the same folder.  Any
    other name gives a path that simply does not exist (never an error:
    tools call this on whatever they are pointed at).
    """
    folder, _, name = shard.rpartition("/")
    table = _game_table_file(name.split("-", 1)[0])
    return f"{folder}/{table}" if folder else table


def is_window_file_name(name, suffix: str) -> bool:
    """Whether a window manifest may name ``name`` as a file of its folder: one path
    segment of the layout's characters ending in ``suffix`` (`schema.SHARD_SUFFIX` or
    `schema.GAME_TABLE_SUFFIX`), as `shard_name` and `game_table_name` write them, and
    a valid object path there (so never '.', '..' or a storage temp-file name)."""
    if not (isinstance(name, str) and _SAFE_NAME.fullmatch(name) and name.endswith(suffix)
            and len(name) > len(suffix)):
        return False
    try:
        validate_path(name)
    except ValueError:
        return False
    return True


def _check_attempt(attempt: str) -> None:
    if not attempt or not re.fullmatch(r"[A-Za-z0-9_.]+", attempt):
        raise ValueError(f"attempt id {attempt!r} may hold only letters, digits, '_' and '.'")


def window_generation(path: str) -> int | None:
    """The generation of any path under ``windows/<gen>/``, else None."""
    parts = path.split("/")
    if len(parts) >= 3 and parts[0] == WINDOWS_DIR:
        return parse_generation(parts[1])
    return None


def is_window_manifest(path: str) -> bool:
    parts = path.split("/")
    return len(parts) == 3 and parts[0] == WINDOWS_DIR and parse_generation(parts[1]) is not None \
        and parts[2] == MANIFEST


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
    """Position-record version of every shard (SPEC.md; manifests before version 2 records lack the field)."""
    document: dict = dataclasses.field(repr=False, compare=False, default_factory=dict)
    game_table: str | None = None
    """Path (relative to the root) of the window's game table; None before record version 3."""
    games: tuple[str, ...] | None = None
    """The window's game ids, in the order a version-2 or 3 record's 'game' field indexes them (None:
    the manifest lists none, as before record version 2)."""
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
    document = _json_object(data, url)

    def need(name, kind):
        if name not in document:
            raise ManifestError(url, name, "is missing")
        return document_value(document[name], kind, lambda problem: ManifestError(url, name, problem))

    version = need("version", int)
    if version != WINDOW_MANIFEST_VERSION:
        raise ManifestError(url, "version", f"is {version}; this reader knows version {WINDOW_MANIFEST_VERSION}")
    generation = need("target_generation", int)
    if generation < 0 or window_manifest(generation) != path:
        raise ManifestError(url, "target_generation", f"{generation} does not match the manifest's folder")
    board_size = need("board_size", int)
    if not schema.MIN_BOARD_SIZE <= board_size <= schema.MAX_BOARD_SIZE:
        raise ManifestError(url, "board_size", f"{board_size} is outside {schema.MIN_BOARD_SIZE}..{schema.MAX_BOARD_SIZE}")
    shards = need("shards", list)
    bad = [s for s in shards if not is_window_file_name(s, schema.SHARD_SUFFIX)]
    if not shards or bad or len(set(shards)) != len(shards):
        named = f" ({_shown(bad[0])} is not one)" if bad else ""
        raise ManifestError(url, "shards", f"must list the window's shard file names, each once "
                                           f"(letters, digits, '_', '.', '-', ending in {schema.SHARD_SUFFIX}){named}")
    _check_numbers(document, url)
    positions = need("positions", int)
    if not 0 < positions <= MAX_WINDOW_POSITIONS:
        raise ManifestError(url, "positions", f"is {positions}, expected 1..{MAX_WINDOW_POSITIONS:,}")
    _check_counts(document, "shard_positions", shards, positions, url)
    _check_counts(document, "generations", None, positions, url)
    if not all(parse_generation(f"{g:0>6}") is not None for g in document.get("generations", {})):
        raise ManifestError(url, "generations", "must be keyed by generation numbers")
    komi = document.get("komi", 0.0)
    if not isinstance(komi, (int, float)) or isinstance(komi, bool) or abs(komi) > schema.MAX_KOMI:
        raise ManifestError(url, "komi", f"is {komi!r}, expected a number in [-{schema.MAX_KOMI:g}, {schema.MAX_KOMI:g}]")
    record_version = need("record_version", int) if "record_version" in document else 1
    if record_version not in schema.POSITION_RECORD_VERSIONS:
        raise ManifestError(url, "record_version", f"is {record_version}; this reader knows versions "
                            f"{sorted(schema.POSITION_RECORD_VERSIONS)} (update zerolake)")
    games = document.get("games", [])
    if not isinstance(games, list) or not all(isinstance(g, str) for g in games):
        raise ManifestError(url, "games", "must be a list of game ids (what a version-2 or 3 record's 'game' indexes)")
    table = document.get("game_table")
    if record_version >= 3 or table is not None:
        if not is_window_file_name(table, schema.GAME_TABLE_SUFFIX) or table in shards:
            raise ManifestError(url, "game_table", f"is {_shown(table)}; it must name the window's game table "
                                                   f"file, ending in {schema.GAME_TABLE_SUFFIX} (record version 3 "
                                                   "keeps each game's ownership label and generation there)")
        table = game_table_path(generation, table)
    attempt = document.get("attempt")
    if attempt is not None and not (isinstance(attempt, str) and _SAFE_NAME.fullmatch(attempt)):
        raise ManifestError(url, "attempt", "must be the id of the attempt that wrote the window")
    plan = document.get("window", {})
    if not isinstance(plan, dict):
        raise ManifestError(url, "window", "must be an object (the window's plan)")
    per_byte = plan.get("positions_per_byte")
    per_byte = float(per_byte) if isinstance(per_byte, (int, float)) and not isinstance(per_byte, bool) \
        and per_byte > 0 else None
    lake_bytes = plan.get("lake_bytes")
    lake_bytes = lake_bytes if isinstance(lake_bytes, int) and not isinstance(lake_bytes, bool) else None
    planned = plan.get("chunks", [])
    planned = tuple(planned) if isinstance(planned, list) and all(isinstance(c, str) for c in planned) else ()
    return WindowManifest(target_generation=generation, board_size=board_size,
                          shards=tuple(shard_path(generation, s) for s in shards), positions=positions,
                          path=path, record_version=record_version, document=document, game_table=table,
                          games=tuple(games) if "games" in document else None, attempt=attempt,
                          positions_per_byte=per_byte, planned_lake_bytes=lake_bytes, planned_chunks=planned,
                          **_window_statistics(document, url))


def _shown(value) -> str:
    """``value`` as an error message shows it: repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:36] + "..."


def _window_statistics(document: dict, url: str) -> dict:
    """The job's statistics as WindowManifest fields; absent ones are 0 (or none skipped), a
    present one of the wrong type is a ManifestError naming it."""
    def count(section: str, name: str) -> int:
        part = document.get(section, {})
        value = part.get(name, 0) if isinstance(part, dict) else None
        return document_value(value, int, lambda problem: ManifestError(url, f"{section}.{name}", problem),
                              at_least=0)

    skipped = document.get("chunks_skipped", [])
    if not isinstance(skipped, list) or not all(
            isinstance(entry, dict) and isinstance(entry.get("chunk"), str) and isinstance(entry.get("reason"), str)
            for entry in skipped):
        raise ManifestError(url, "chunks_skipped", 'must list {"chunk": path, "reason": text} objects')
    return {"positions_read": count("input", "positions_read"),
            "chunks_skipped": tuple((entry["chunk"], entry["reason"]) for entry in skipped),
            "duplicate_games": count("dedup", "duplicate_games"),
            "capped_positions_removed": count("dedup", "capped_positions_removed")}


MAX_WINDOW_POSITIONS = 10 ** 9
"""No window holds more position records than this (a billion: 1,000x the
default window's growth at any lake size people run); a manifest that says
more is damaged, not a plan for billions of training steps."""

MAX_DOCUMENT_NUMBER = 2 ** 53
"""No number in a lake document is larger in magnitude (the last integer a
JSON reader's double holds exactly)."""


def document_value(value, kinds, fail, at_least: int | None = None):
    """``value``, read from a field of a lake document, if it is of one of the field's ``kinds``;
    otherwise raises ``fail(problem)``, the reader's own error naming the document and field.

    The one rule every document owner in format/ applies: a bool is no number; an int
    stands for a float (and comes back as one); a number is finite and at most
    MAX_DOCUMENT_NUMBER in magnitude; an int is at least ``at_least`` when given.
    """
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    # An int is compared as it is: a JSON integer of 400 digits overflows float() and isfinite().
    in_range = number and abs(value) <= MAX_DOCUMENT_NUMBER and (isinstance(value, int) or math.isfinite(value))
    if in_range and float in kinds and isinstance(value, int):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, kinds) or (number and not in_range) or \
            (number and at_least is not None and isinstance(value, int) and value < at_least):
        names = " or ".join("null" if kind is type(None) else kind.__name__ for kind in kinds)
        bound = f" >= {at_least}" if at_least is not None and int in kinds else ""
        raise fail(f"is {_shown(value)}, expected {names}{bound}")
    return value


def _check_numbers(value, url: str, where: str = "") -> None:
    """Every number anywhere in a document is finite and at most MAX_DOCUMENT_NUMBER
    in magnitude (Python's json reads NaN and Infinity; statistics are nested)."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_numbers(item, url, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_numbers(item, url, f"{where}[{index}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not (abs(value) <= MAX_DOCUMENT_NUMBER and (isinstance(value, int) or math.isfinite(value))):
            raise ManifestError(url, where, f"is {value}, not a number a lake document holds "
                                            f"(finite, at most {MAX_DOCUMENT_NUMBER:,} in magnitude)")


def _check_counts(document: dict, name: str, keys, total: int, url: str) -> None:
    """``document[name]``, when present, maps names (``keys``, when given, exactly) to
    position counts that add up to ``total``, the window's positions."""
    counts = document.get(name)
    if counts is None:
        return
    if not isinstance(counts, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                               for v in counts.values()):
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
            raise ManifestError(storage.url(path), "positions",
                                f"is {window.positions}, more than its shards' {most // MAX_EXPANSION:,} bytes can "
                                f"hold (at most {MAX_EXPANSION} positions a byte)")
        if window.game_table and window.game_table not in sizes:
            raise ManifestError(storage.url(path), "game_table",
                                f"names {storage.url(window.game_table)}, which is missing")
    return window


# ---- models --------------------------------------------------------------

def models_prefix() -> str:
    return f"{MODELS_DIR}/"


def model_dir(generation: int) -> str:
    return f"{MODELS_DIR}/{generation_dir(generation)}"


def model_manifest(generation: int) -> str:
    return f"{model_dir(generation)}/{MANIFEST}"


def model_file(generation: int, relative: str) -> str:
    return f"{model_dir(generation)}/{relative}"


CPU_INT8_XML = "cpu_int8/model.xml"
"""Inside a model's folder: the optional int8 OpenVINO copy for CPU workers
(``model.cpu_int8``); its weights are the .bin beside it."""


@dataclasses.dataclass(frozen=True)
class ModelFile:
    """One file of a published model: its sha256 (64 hex digits) and size in bytes."""

    sha256: str
    size: int


@dataclasses.dataclass(frozen=True)
class ModelManifest:
    """A published generation's manifest, ``models/<gen>/MANIFEST.json`` (format/SPEC.md, "Model
    manifest"): the one owner of its schema.

    ``files`` maps each file's '/'-separated path inside the model folder to
    its ModelFile; ``metadata`` is the whole record the trainer wrote
    (board_size, global_step, network, the int8 copy's figures, ...), which
    readers may show but the format only requires board_size of (the
    `board_size` property).  The registry writes it with `to_bytes` after the
    files and reads it with `from_bytes`.
    """

    generation: int
    files: dict
    metadata: dict

    @property
    def board_size(self) -> int:
        """The network's board (``metadata.board_size``, checked by `parse_model_manifest`)."""
        return self.metadata["board_size"]

    @property
    def input_planes(self) -> int:
        """The network's input width, 17 or 22 (`model_input_planes`)."""
        return model_input_planes(self.metadata)

    def to_bytes(self) -> bytes:
        document = {"version": MODEL_MANIFEST_VERSION, "generation": self.generation,
                    "files": {path: {"sha256": f.sha256, "size": f.size} for path, f in self.files.items()},
                    "metadata": self.metadata}
        return json.dumps(document, indent=2, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, generation: int, url: str) -> "ModelManifest":
        return parse_model_manifest(data, generation, url)


_SHA256 = re.compile(r"[0-9a-f]{64}")


def model_input_planes(metadata: dict) -> int:
    """A model's input width, 17 or 22, from its manifest's ``metadata.feature_set_planes``
    (checked by `parse_model_manifest`; 17 when absent: every model before liberty planes)."""
    return int(metadata.get("feature_set_planes", schema.BASIC_INPUT_PLANES))


def parse_model_manifest(data: bytes, generation: int, url: str) -> ModelManifest:
    """Validate a model manifest (``{"version", "generation", "files", "metadata"}``); ManifestError
    names the object and the field (a file entry by its name)."""
    document = _json_object(data, url)
    if document.get("version") != MODEL_MANIFEST_VERSION:
        raise ManifestError(url, "version", f"is {document.get('version')!r}; this reader knows "
                                            f"version {MODEL_MANIFEST_VERSION}")
    if document.get("generation") != generation:
        raise ManifestError(url, "generation", f"is {document.get('generation')!r}, expected {generation}")
    if not isinstance(document.get("files"), dict) or not document["files"]:
        raise ManifestError(url, "files", "must map file names to {sha256, size}")
    files = {}
    for relative, entry in document["files"].items():
        if (not relative or relative.startswith("/")
                or any(part in ("", ".", "..") for part in relative.split("/"))):
            raise ManifestError(url, "files", f"names a file {relative!r} outside the model's folder")
        if (not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str)
                or not _SHA256.fullmatch(entry["sha256"]) or not isinstance(entry.get("size"), int)
                or isinstance(entry["size"], bool) or entry["size"] < 0):
            raise ManifestError(url, f"files.{relative}", 'must be {"sha256": 64 hex digits, "size": int >= 0}')
        files[relative] = ModelFile(entry["sha256"], entry["size"])
    metadata = document.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("board_size"), int):
        raise ManifestError(url, "metadata", "must be an object with an int board_size")
    if not schema.MIN_BOARD_SIZE <= metadata["board_size"] <= schema.MAX_BOARD_SIZE:
        raise ManifestError(url, "metadata.board_size", f"{metadata['board_size']} is outside "
                                                        f"{schema.MIN_BOARD_SIZE}..{schema.MAX_BOARD_SIZE}")
    planes = metadata.get("feature_set_planes", schema.BASIC_INPUT_PLANES)
    if planes not in schema.INPUT_PLANE_CHOICES or isinstance(planes, bool):
        raise ManifestError(url, "metadata.feature_set_planes", f"is {planes!r}; a model takes one of "
                                                                f"{schema.INPUT_PLANE_CHOICES} input planes")
    _check_numbers(document, url)
    return ModelManifest(generation=generation, files=files, metadata=metadata)


# ---- the trainer's checkpoints, the loop, jobs, the cluster, reports -----

def checkpoints_prefix() -> str:
    return f"{CHECKPOINTS_DIR}/"


def checkpoint_file(name: str) -> str:
    return f"{CHECKPOINTS_DIR}/{name}"


def trainer_logs_dir() -> str:
    """Where the trainer writes TensorBoard summaries when it writes ROOT directly (``logs``)."""
    return "logs"


def loop_marker(name: str) -> str:
    """A create-only marker of the one-machine loop (``loop/selfplay-3.done``...)."""
    return f"{LOOP_DIR}/{name}"


SETTINGS_RECORD_VERSION = 1
_LAUNCHER_DIRS = {"loop": LOOP_DIR, "cluster": CLUSTER_DIR}


def settings_record(launcher: str, run_id: str) -> str:
    """Create-only record of one launcher invocation's full settings
    (``loop/settings/<run_id>.json``, ``cluster/settings/<run_id>.json``).

    ``run_id`` is unique per invocation (operations.roles.record_settings makes it),
    so a resumed or a second run adds its own record and never overwrites one.
    """
    if launcher not in _LAUNCHER_DIRS:
        raise ValueError(f"launcher {launcher!r} is not one of {sorted(_LAUNCHER_DIRS)}")
    if not _SAFE_NAME.fullmatch(run_id):
        raise ValueError(f"run id {run_id!r} may hold only letters, digits, '_', '.' and '-'")
    return f"{_LAUNCHER_DIRS[launcher]}/settings/{run_id}.json"


def settings_records_prefix(launcher: str) -> str:
    """Listing prefix of one launcher's settings records."""
    return settings_record(launcher, "x").rsplit("/", 1)[0] + "/"


@dataclasses.dataclass(frozen=True)
class SettingsRecord:
    """One launcher invocation's full settings, ``loop/settings/<run_id>.json`` (or ``cluster/``).

    ``settings`` is every field of the launcher's config (its role configs
    nested), ``argv`` its command line, ``storage_retry`` the retry policy's
    fields (None: the default); ``host`` the machine it ran on.  Written once
    at start by `operations.roles.record_settings` with `to_bytes`."""

    launcher: str
    run_id: str
    started: str
    argv: tuple[str, ...]
    settings: dict
    host: str = ""
    storage_retry: dict | None = None

    def to_bytes(self) -> bytes:
        document = {"version": SETTINGS_RECORD_VERSION, "launcher": self.launcher, "run_id": self.run_id,
                    "started": self.started, "host": self.host, "argv": list(self.argv),
                    "settings": self.settings, "storage_retry": self.storage_retry}
        return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, url: str) -> "SettingsRecord":
        return parse_settings_record(data, url)


def parse_settings_record(data: bytes, url: str) -> SettingsRecord:
    """Validate a settings record (``{"version", "launcher", "run_id", "started", "argv", "settings"}``)."""
    document = _json_object(data, url)
    if document.get("version") != SETTINGS_RECORD_VERSION:
        raise ManifestError(url, "version", f"is {document.get('version')!r}; this reader knows "
                                            f"version {SETTINGS_RECORD_VERSION}")
    for name, kind in (("launcher", str), ("run_id", str), ("started", str), ("argv", list), ("settings", dict)):
        if not isinstance(document.get(name), kind):
            raise ManifestError(url, name, f"is missing or not {kind.__name__}")
    if not all(isinstance(word, str) for word in document["argv"]):
        raise ManifestError(url, "argv", "must be the command line's words")
    retry = document.get("storage_retry")
    if retry is not None and not isinstance(retry, dict):
        raise ManifestError(url, "storage_retry", "must be the retry policy's fields or null")
    host = document.get("host", "")
    return SettingsRecord(launcher=document["launcher"], run_id=document["run_id"], started=document["started"],
                          argv=tuple(document["argv"]), settings=document["settings"],
                          host=host if isinstance(host, str) else "", storage_retry=retry)


def tmp_prefix() -> str:
    return f"{TMP_DIR}/"


def job_tmp_dir(job: str, generation: int, attempt: str) -> str:
    """Temporary pieces of one attempt of a job (``tmp/shuffle-000003-<attempt>``)."""
    return f"{TMP_DIR}/{job}-{generation_dir(generation)}-{attempt}"


def probe_path(worker_id: str) -> str:
    """A small object a role writes and deletes at start-up to prove the root is writable
    (``tmp/probe-<worker>``; one per worker id, so concurrent probes never meet)."""
    if not worker_id or not re.fullmatch(r"[A-Za-z0-9_.]+", worker_id):
        raise ValueError(f"worker id {worker_id!r} may hold only letters, digits, '_' and '.'")
    return f"{TMP_DIR}/probe-{worker_id}"


def parse_job_tmp_dir(path: str) -> tuple[str, int, str] | None:
    """(job, generation, attempt) of any path under ``tmp/<job>-<gen>-<attempt>/``, else None."""
    parts = path.split("/")
    if len(parts) < 2 or parts[0] != TMP_DIR:
        return None
    match = re.fullmatch(r"(?P<job>[a-z]+)-(?P<gen>[0-9]+)-(?P<attempt>[A-Za-z0-9_.]+)", parts[1])
    generation = parse_generation(match["gen"]) if match else None
    if generation is None:
        return None
    return match["job"], generation, match["attempt"]


def window_claim(generation: int) -> str:
    """Create-only claim: the shuffle follower that wrote it makes window <gen>."""
    return f"{CLUSTER_DIR}/claims/window-{generation_dir(generation)}.json"


def report_path(name: str) -> str:
    return f"{REPORT_DIR}/{name}"


# The rating ladder (arena.ladder).  Its results file is the one piece of
# the report that is not re-derived: it accumulates games, so that a rerun adds
# to it instead of replaying them; it is still replaced whole (atomic replace)
# and may be deleted to start the ladder afresh.
LADDER_DIR = f"{REPORT_DIR}/ladder"


def ladder_results() -> str:
    """The ladder's game results, one JSON object per line (``report/ladder/results.jsonl``)."""
    return f"{LADDER_DIR}/results.jsonl"


def ladder_chunk_counts() -> str:
    """Games and positions per chunk, cached by the ladder (chunks never change)."""
    return f"{LADDER_DIR}/chunk-counts.json"


def ladder_game_sgf(pairing: str, index: int) -> str:
    """SGF of game ``index`` of one ladder pairing (``report/ladder/games/<pairing>/<index:05d>.sgf``)."""
    if not _SAFE_NAME.fullmatch(pairing):
        raise ValueError(f"pairing {pairing!r} may hold only letters, digits, '_', '.' and '-'")
    if isinstance(index, bool) or int(index) != index or index < 0:
        raise ValueError(f"game index must be a non-negative int, got {index!r}")
    return f"{LADDER_DIR}/games/{pairing}/{int(index):05d}.sgf"


def _json_object(data: bytes, url: str) -> dict:
    try:
        document = lake_json.parse(data, MAX_DOCUMENT_BYTES)
    except lake_json.NotADocument as exc:
        raise ManifestError(url, "", str(exc)) from None
    if not isinstance(document, dict):
        raise ManifestError(url, "", "is not a JSON object")
    return document
