"""Names and numbers of the on-disk contract (see format/SPEC.md).

Every reader and writer of the lake imports its constants from here, so the
writer (`format.codec`), the tf.data reader (`model.tfdata`) and the Beam job
cannot drift apart.  Nothing here imports TensorFlow.

Conventions used throughout the project
---------------------------------------
* A board has ``N`` points a side, 5 <= N <= 19.
* A point is a flat index ``p = row * N + col``.  Row 0 is the *top* edge
  (GTP row ``N``), column 0 is GTP column ``A``.  ``PASS = N * N``; the
  action space has ``N * N + 1`` entries.
* Colours: ``BLACK = 1``, ``WHITE = -1``, ``EMPTY = 0`` (int8).
* Scores are Tromp-Taylor area scores from Black's side:
  ``black_area - white_area - komi``.  Ownership is +1 Black, -1 White, 0
  neutral (dame, seki).
* Network input is NHWC ``[B, N, N, 17]``: channels 0-7 are the stones of the
  side to move at t, t-1, ..., t-7; channels 8-15 the opponent's at the same
  times; channel 16 is 1 when Black is to move.  `format.planes` owns that
  layout (channel indices, colour convention, the reference builder); the
  plane counts below are its numbers.
"""

FORMAT_VERSION = 1
"""Version of run.json and of game records (chunks).  Readers refuse any other value."""

SUPPORTED_VERSIONS = frozenset({1})

POSITION_RECORD_VERSION = 4
"""Version of the position records in a window's shards (SPEC.md "Shards": groups of
compact positions whose ownership label and generation are rows of the window's game
table).  Shards are derived data: a reader refuses every other version
(`position_record_version_problem`), and an older window is rebuilt from the lake's
games, which did not change (chunks and run.json keep their own version)."""

REBUILD_WINDOW = "python -m pipeline.shuffle --root ROOT"
"""The command that rebuilds a lake's windows in the current record version."""


def position_record_version_problem(version: int) -> str | None:
    """None when position records of ``version`` are readable; else the one line that says what to do."""
    if version == POSITION_RECORD_VERSION:
        return None
    if 0 < version < POSITION_RECORD_VERSION:
        return (
            f"holds version-{version} position records, which this release no longer reads (it reads version "
            f"{POSITION_RECORD_VERSION}): rebuild the window from the lake's games with `{REBUILD_WINDOW}`"
        )
    return (
        f"holds version-{version} position records, which this release does not know (it reads version "
        f"{POSITION_RECORD_VERSION}); update zerolake to read it"
    )


MIN_BOARD_SIZE = 5
MAX_BOARD_SIZE = 19

DEFAULT_BOARD_SIZE = 9
"""The board size of a new run when no flag or run.json says otherwise."""

DEFAULT_KOMI = 7.5
"""The komi of a new run when no flag or run.json says otherwise (area scoring's usual 7.5)."""

MAX_KOMI = 1000.0
"""|komi| is at most this, in run.json, every role's --komi and GTP's komi
command alike: more than any board's area (19 x 19 = 361), and exact in the
float32 that records store it in (1e300 would become inf and make every chunk
of the lake unreadable)."""

BLACK = 1
WHITE = -1
EMPTY = 0

RULES_TROMP_TAYLOR = "tromp-taylor"
"""Area scoring, positional superko, suicide illegal: the only rules used."""

# The network input's plane counts; the layout is format/planes.py's, and
# compiled code gets the same numbers from format/planes.pxd (tested equal).
HISTORY_LENGTH = 8
"""Board positions of history in the network input."""
BASIC_INPUT_PLANES = 2 * HISTORY_LENGTH + 1
"""Channels of AlphaGo Zero's input (stone history and colour), what every model before
liberty planes takes: the first 17 channels of the full layout."""
INPUT_PLANES = BASIC_INPUT_PLANES + 5
"""Channels of the full network input: the basic 17, then on-board, liberties 1/2/3+ and legal."""
INPUT_PLANE_CHOICES = (BASIC_INPUT_PLANES, INPUT_PLANES)
"""The input widths a model may take: a model reads the first C channels of the layout."""
PACKED_PLANES = 2 * HISTORY_LENGTH
"""The history planes (channels 0 .. 15): a decoded position record's planes, and what the shuffle job's
dedup key hashes, bit-packed (the colour plane is a scalar)."""

# --- game records (chunks) -------------------------------------------------

CHUNK_SUFFIX = ".tfrecord.zst"
SHARD_SUFFIX = ".tfrecord.gz"

# How a game ended (field ``end_reason``).
END_TWO_PASSES = 0
END_RESIGN = 1
END_MOVE_CAP = 2
END_REASONS = {END_TWO_PASSES: "two-passes", END_RESIGN: "resign", END_MOVE_CAP: "move-cap"}

# Where an ownership map came from (field ``ownership_source``).
OWNERSHIP_NONE = 0
"""No ownership recorded (resigned and not accelerated, move cap...)."""
OWNERSHIP_FINAL_BOARD = 1
"""Tromp-Taylor ownership of the final board after two passes."""
OWNERSHIP_ACCELERATED = 2
"""Self-play finished the game in acceleration mode; then as FINAL_BOARD."""
OWNERSHIP_MODEL_PLAYOUT = 3
"""The Beam job played the game out with a published model."""
OWNERSHIP_RANDOM_PLAYOUTS = 4
"""The Beam job averaged many random playouts (sign kept)."""
OWNERSHIP_SOURCES = {
    OWNERSHIP_NONE: "none",
    OWNERSHIP_FINAL_BOARD: "final-board",
    OWNERSHIP_ACCELERATED: "accelerated",
    OWNERSHIP_MODEL_PLAYOUT: "model-playout",
    OWNERSHIP_RANDOM_PLAYOUTS: "random-playouts",
}

# Two-bit ownership codes in a game record.
OWNERSHIP_CODE = {0: 0, BLACK: 1, WHITE: 2}

POLICY_SUM_TOLERANCE = 0.02
"""A policy whose quantized values sum further than this from its
denominator (relative) is corrupt."""

ROOT_VALUE_SCALE = 127
"""Root values in [-1, 1] are stored as int8 ``round(v * 127)``."""

# Feature names of a game record.
G_VERSION = "version"
G_BOARD_SIZE = "board_size"
G_KOMI = "komi"
G_RULES = "rules"
G_GAME_ID = "game_id"
G_GENERATION = "generation"
G_WORKER_ID = "worker_id"
G_MOVES = "moves"
G_PLANES = "planes"
G_POLICY_COUNT = "policy_count"
G_POLICY_DENOMINATOR = "policy_denominator"
G_POLICY_INDEX_DELTA = "policy_index_delta"
G_POLICY_VALUE = "policy_value"
G_ROOT_VALUE = "root_value"
G_FULL_SEARCH = "full_search"
G_WINNER = "winner"
G_SCORE = "score"
G_END_REASON = "end_reason"
G_OWNERSHIP = "ownership"
G_OWNERSHIP_SOURCE = "ownership_source"
G_RESIGN_ENABLED = "resign_enabled"
G_WOULD_RESIGN = "would_resign"
G_ACCELERATED_FROM = "accelerated_from"
G_SEED = "seed"

# --- position records (training shards) -----------------------------------

# A position record holds a group of up to POSITION_GROUP positions, stored
# column by column (SPEC.md "Position records"); flags bit 1 marks a position
# whose ownership label is its own (in ``ownership_fine``), every other
# position takes its game's row of the window's game table (SPEC.md "Window
# game table").
P_VERSION = "version"
P_BOARD_SIZE = "board_size"
POSITION_GROUP = 64
"""Positions per record (the last record of a shard may hold fewer)."""
HISTORY_MOVES = HISTORY_LENGTH - 1
"""Moves a position keeps (t-1 .. t-7): with the board at t they rebuild the history."""
NO_MOVE_OFFSET = 1
"""A move of ``PASS + NO_MOVE_OFFSET`` (= N*N + 1) means "before the game's start"."""
TRIT_POINTS = 5
"""A board byte holds 5 points in base 3 (3**5 = 243 <= 256)."""
TARGET_BYTES = 14
"""Bytes of one position's ``targets`` row (SPEC.md): flags, int8 value, float32 score, 4 float16 weights."""
P_COUNT = "count"
P_BOARD = "board"
P_MOVES = "moves"
P_CAPTURE_COUNT = "capture_count"
P_CAPTURES = "captures"
P_OWNERSHIP_FINE = "ownership_fine"
P_TARGETS = "targets"
P_POLICY_COUNT = "policy_count"
P_POLICY_INDEX_DELTA = "policy_index_delta"
P_POLICY_VALUE = "policy_value"
P_GAME = "game"
"""Each position's game, an index into the window's game table (the manifest's ``games``)."""
P_MOVE_NUMBER = "move_number"
TARGET_FLAG_WHITE = 1
"""Bit of a targets row's flags byte: White to move."""
TARGET_FLAG_OWN_OWNERSHIP = 2
"""Bit of a targets row's flags byte: the ownership row lies in ``ownership_fine`` (a label that is not the
game table's row)."""

# Policy values (SPEC.md "Position records"): a position's probabilities as
# integers proportional to them.
POLICY_UNITS = 16
"""A target is stored as whole multiples of one unit ``min(p) / k``, the first k in 1..POLICY_UNITS that works
(visit counts whose smallest is at most this come out as the counts)."""
POLICY_VALUE_MAX = 65535
"""Values are 1..65535; a target that is not whole multiples is ``round(65535 * p / max(p))``, the entries
that round to 0 dropped (none raised)."""


GAME_TABLE_VERSION = 1
"""Version of a window's game table file (one Example, SPEC.md "Window game table")."""
GAME_TABLE_SUFFIX = ".table.gz"
"""A game table is ``<attempt>-games`` + this, in its window's folder (format.layout)."""
GT_VERSION = "version"
GT_BOARD_SIZE = "board_size"
GT_COUNT = "count"
GT_GENERATION = "generation"
GT_FINE = "fine"
GT_OWNERSHIP = "ownership"
GT_OWNERSHIP_FINE = "ownership_fine"

OWNERSHIP_SCALE = 127
"""Shard ownership is int8 ``round(o * 127)`` with o in [-1, 1]."""


def num_actions(board_size: int) -> int:
    """Size of the action space: every point plus pass."""
    return board_size * board_size + 1


def trit_bytes(board_size: int) -> int:
    """Bytes of one board (or ternary ownership map, in a game table): 5 points a byte."""
    return (board_size * board_size + TRIT_POINTS - 1) // TRIT_POINTS


def move_bytes(board_size: int) -> int:
    """Bytes of one recorded move: uint8 while N*N + 1 (no move) fits, else uint16 little-endian."""
    return 1 if board_size * board_size + NO_MOVE_OFFSET < 256 else 2


def packed_plane_bytes(board_size: int, planes: int) -> int:
    """Bytes taken by ``planes`` bit-packed N x N planes."""
    return (planes * board_size * board_size + 7) // 8
