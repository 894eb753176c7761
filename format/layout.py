"""Where everything lives in a lake: the one owner of every path.

Every role meets the others only through one storage root (a local folder or
``gs://bucket/prefix``).  This module is the only place that spells a path in
it; every other module asks it (a test scans the code for stray literals).
Paths are relative to the root, '/'-separated, as `cloud.base` defines them::

    run.json                                        the run's fixed settings (create-only)
    games/<gen>/<worker>-<ms:013d>-<seq:06d>.tfrecord.zst   self-play chunks
    windows/<gen>/<attempt>-<k>-of-<n>.tfrecord.gz  training shards for model <gen>
    windows/<gen>/<attempt>-games.table.gz          the window's game table (format.game_table)
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

The JSON documents at these paths have their own modules: format.window_manifest,
format.model_manifest, format.settings_record, and what they share, format.documents.
"""

from __future__ import annotations

import dataclasses
import re

from cloud.base import validate_path
from format import schema

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
LAUNCHER_LEASE = f"{LOOP_DIR}/lease.json"
"""Which launcher (``operations.loop`` or ``operations.cluster``) drives this root: a second one is
refused (format.leases)."""
LOOP_BUDGET = f"{LOOP_DIR}/budget.json"
"""How much of its --hours/--minutes the one-machine loop has run on this root (format.loop_budget):
a rerun continues the budget."""


# Names are parsed with [0-9], never \d or str.isdigit(): those take any Unicode
# digit ('²', '٣'), which int() then refuses or reads as another number.  And with
# a bound: int() refuses a string of more than 4,300 digits.
_CHUNK_NAME = re.compile(
    r"(?P<worker>[A-Za-z0-9_.]+)-(?P<ms>[0-9]{13})-(?P<seq>[0-9]{6,18})" + re.escape(schema.CHUNK_SUFFIX)
)
_GENERATION_NAME = re.compile(r"[0-9]{6,18}")
SAFE_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*")
"""A name the lake takes inside a path (a run id, an attempt, a pairing): no '/', not starting with '-'."""


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
    if not (isinstance(name, str) and SAFE_NAME.fullmatch(name) and name.endswith(suffix) and len(name) > len(suffix)):
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
    return (
        len(parts) == 3 and parts[0] == WINDOWS_DIR and parse_generation(parts[1]) is not None and parts[2] == MANIFEST
    )


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


_LAUNCHER_DIRS = {"loop": LOOP_DIR, "cluster": CLUSTER_DIR}


def settings_record(launcher: str, run_id: str) -> str:
    """Create-only record of one launcher invocation's full settings
    (``loop/settings/<run_id>.json``, ``cluster/settings/<run_id>.json``).

    ``run_id`` is unique per invocation (operations.roles.record_settings makes it),
    so a resumed or a second run adds its own record and never overwrites one.
    """
    if launcher not in _LAUNCHER_DIRS:
        raise ValueError(f"launcher {launcher!r} is not one of {sorted(_LAUNCHER_DIRS)}")
    if not SAFE_NAME.fullmatch(run_id):
        raise ValueError(f"run id {run_id!r} may hold only letters, digits, '_', '.' and '-'")
    return f"{_LAUNCHER_DIRS[launcher]}/settings/{run_id}.json"


def settings_records_prefix(launcher: str) -> str:
    """Listing prefix of one launcher's settings records."""
    return settings_record(launcher, "x").rsplit("/", 1)[0] + "/"


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
    if match is None:
        return None
    generation = parse_generation(match["gen"])
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
    if not SAFE_NAME.fullmatch(pairing):
        raise ValueError(f"pairing {pairing!r} may hold only letters, digits, '_', '.' and '-'")
    if isinstance(index, bool) or int(index) != index or index < 0:
        raise ValueError(f"game index must be a non-negative int, got {index!r}")
    return f"{LADDER_DIR}/games/{pairing}/{int(index):05d}.sgf"
