"""Settings of a self-play worker: one frozen dataclass, exposed as CLI flags.

`WorkerConfig` is built once (from flags by `CLI.parse`, or directly by tests
and benchmarks), validated in `__post_init__`, and passed explicitly to the
library code; nothing reads flags or the environment elsewhere.

Units: visits are simulations per move (new ones; tree reuse adds the
subtree's), seconds are wall-clock, fractions are in [0, 1].
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import secrets
import socket

from cloud.storage import canonical_root, local_folder_overlaps_root
from format.cli import (
    RoleCli,
    board_size_setting,
    events_setting,
    komi_setting,
    max_moves_setting,
    pass_when_winning_setting,
    poll_seconds_setting,
    root_setting,
    setting,
    setting_problems,
)
from inference.devices import parse_device
from inference.eval_cache import DEFAULT_CAPACITY
from inference.openvino_evaluator import INFERENCE_CHOICES

RESIGN_VALUES = ("root", "move")
"""``--resign-value``: what resignation reads (the root's mean value, or the played move's)."""


def host_name() -> str:
    """This machine's name, with only the characters a chunk name allows."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())[:40] or "host"


def default_worker_id() -> str:
    """The default --worker-id prefix: the host name."""
    return host_name()


def unique_worker_name(prefix: str) -> str:
    """``<prefix>_<host>_<pid>_<8 random hex>`` (``<host>_<pid>_<hex>`` when the prefix is the host).

    Unique by construction: two processes given the same --worker-id differ in
    pid or host, and the random part separates pid reuse, restarts and clones.
    """
    host = host_name()
    head = prefix if prefix == host else f"{prefix}_{host}"
    return f"{head}_{os.getpid()}_{secrets.token_hex(4)}"


def state_dir() -> str:
    """The user's state folder ($XDG_STATE_HOME, else ~/.local/state)."""
    return os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")


def default_spool_base(root: str, worker_id_prefix: str) -> str:
    """``<state>/zerolake/spool/<12 hex of sha256(canonical root)>-<prefix>``; the spool is its first free
    ``-<k>`` slot.

    Stable across restarts: the same lake and --worker-id give the same
    folders however the root is spelled (``lake``, its absolute path, a
    symlink: `cloud.storage.canonical_root`), so a restarted worker finds (and
    uploads) what a killed one spooled; and one spelling (``lake``) used in two
    folders names two lakes, so two runs never share a spool.
    """
    digest = hashlib.sha256(canonical_root(root).encode()).hexdigest()[:12]
    return os.path.join(state_dir(), "zerolake", "spool", f"{digest}-{worker_id_prefix}")


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Every setting of one worker process; each field is a flag (``--board-size``...)."""

    root: str = root_setting()
    board_size: int = board_size_setting()
    komi: float = komi_setting()
    max_moves: int = max_moves_setting()

    # --- search ---
    games: int = setting(256, "games played at once (split in two halves that alternate with the network)", at_least=2)
    visits: int = setting(64, "simulations of a full search (its policy is recorded as a training target)", at_least=1)
    fast_visits: int = setting(
        16, "simulations of a fast search (playout-cap randomization; no policy target)", at_least=1
    )
    full_search_fraction: float = setting(
        0.25, "share of moves that get the full search (KataGo's playout-cap randomization)", at_least=0.0, at_most=1.0
    )
    gumbel: bool = setting(False, "Gumbel root (sequential halving, improved-policy target) instead of PUCT + noise")
    gumbel_considered: int = setting(16, "moves the Gumbel root considers (sequential halving)", at_least=1)
    gumbel_c_scale: float = setting(
        0.1,
        "Gumbel: weight of the values against the priors, sigma(q) = (c_visit + "
        "max N) x c_scale x q (the Gumbel MuZero paper's 0.1)",
        above=0,
        at_most=100,
    )
    gumbel_c_visit: float = setting(
        50.0, "Gumbel: visits added to the largest child count in sigma(q) (the paper's 50)", at_least=0, at_most=1e6
    )
    gumbel_late_noise: float = setting(
        1.0,
        "Gumbel: scale of the root's Gumbel draws after the first "
        "--temperature-moves moves (1 = Gumbel MuZero's throughout; 0 = "
        "the later moves are the search's best, not sampled)",
        at_least=0.0,
        at_most=1.0,
    )
    symmetry: bool = setting(
        False,
        "evaluate each position under a random board symmetry, its policy mapped "
        "back (inference.symmetric), so the search keeps no orientation's bias",
    )
    leaves_per_game: int = setting(
        8, "leaves one game may put in a batch per pass (virtual loss keeps them apart)", at_least=1
    )
    c_puct: float = setting(1.25, "PUCT exploration constant", above=0)
    fpu_reduction: float = setting(0.25, "first-play urgency: unvisited children get Q(parent) minus this")
    dirichlet_alpha_total: float = setting(
        10.83, "Dirichlet alpha times the number of legal moves (0.03 on empty 19x19)", above=0
    )
    dirichlet_epsilon: float = setting(
        0.25, "weight of the Dirichlet noise in the root priors", at_least=0.0, at_most=1.0
    )
    pass_when_winning: bool = pass_when_winning_setting()
    temperature_moves: int = setting(
        -1,
        "moves sampled in proportion to visits before playing the best "
        "(with --gumbel: moves with the full Gumbel noise, the rest with "
        "--gumbel-late-noise); -1 = N*N // 12",
        at_least=-1,
    )
    generation0_playouts: int = setting(
        1,
        "before any model is published (generation 0), each leaf's value is "
        "the mean of this many random playouts from it (uniform priors); "
        "0 = the uniform evaluator (value 0 everywhere: near-random games "
        "whose policy targets teach nothing). The playouts draw from the "
        "worker's random stream, so these games do not replay from their "
        "recorded seed alone",
        at_least=0,
    )

    # --- resignation and endstate ---
    resign_threshold: float = setting(
        -0.9, "resign when the root value (side to move) stays below this...", at_least=-1.0, at_most=1.0
    )
    resign_consecutive: int = setting(3, "...for this many consecutive own moves", at_least=1)
    resign_value: str = setting(
        "root",
        "the value resignation reads: root (the root's mean value) or move "
        "(the mean value of the move played; with --gumbel the root's mean is "
        "pulled towards the worse of the considered moves, which get equal "
        "visits)",
        choices=RESIGN_VALUES,
    )
    resign_disabled_fraction: float = setting(
        0.1,
        "share of games played to the end with resignation off, to measure false resignations",
        at_least=0.0,
        at_most=1.0,
    )
    accelerated_visits: int = setting(
        2, "simulations per move once a game is resigned and played out to two passes", at_least=1
    )
    eval_cache_entries: int = setting(
        DEFAULT_CAPACITY,
        "network outputs kept per model for positions seen again "
        "in any of the worker's games (inference.eval_cache; "
        "about 1.5 KB each on 19x19); 0 = no cache",
        at_least=0,
    )

    # --- output and lifetime ---
    chunk_games: int = setting(
        2000,
        "games per chunk file (about what ChessCoach writes; few, large objects suit a shared bucket)...",
        at_least=1,
    )
    chunk_seconds: float = setting(
        600.0, "...or fewer, when the oldest finished game has waited this long (it waits safely in the spool)", above=0
    )
    spool_dir: str = setting(
        "", "local folder where finished games wait for their chunk ('' = a slot under ~/.local/state/zerolake/spool/)"
    )
    events: str = events_setting()
    max_games: int = setting(0, "stop after this many finished games (0 = no limit)", at_least=0)
    max_seconds: float = setting(0.0, "stop after this long (0 = no limit)", at_least=0)
    max_positions: int = setting(0, "stop once the finished games hold this many positions (0 = no limit)", at_least=0)
    poll_seconds: float = poll_seconds_setting(5.0, looks_at="models/LATEST (for a newer model)")
    progress_seconds: float = setting(10.0, "seconds between status lines (and progress events)", above=0)
    health_port: int = setting(
        0,
        "serve GET /health on this TCP port (an instance group's autohealing probe): 200 while the worker "
        "plays, 503 once it has made no move for --health-stall-seconds; 0 = off",
        at_least=0,
        at_most=65535,
    )
    health_stall_seconds: float = setting(
        600.0, "with --health-port: seconds without a move (or to start playing) before 503", above=0
    )
    seed: int = setting(
        -1,
        "seed of the worker's random streams; -1 = fresh from the OS's entropy, so no two workers share games",
        at_least=-1,
        at_most=2**63 - 1,
    )
    worker_id: str = setting(
        default_factory=default_worker_id,
        help="prefix of this process's worker name (host, pid and random hex are added, "
        "so names never repeat; default: the host name)",
    )
    model_cache: str = setting("", "local folder for downloaded models ('' = a private temporary folder)")
    device: str = setting(
        "", "where the network runs: '' (TensorFlow's choice), cpu, gpu, gpu:K (one GPU per process) or tpu"
    )
    inference: str = setting(
        "auto",
        "how the network runs: auto (the model's int8 OpenVINO copy when the "
        "network runs on the CPU and the model has one, else TensorFlow), "
        "tensorflow, or openvino (the copy, required)",
        choices=INFERENCE_CHOICES,
    )
    inference_threads: int = setting(
        0,
        "threads (one stream each) of the int8 CPU copy; 0 = every core this "
        "process may use. Several workers on one CPU machine: cores / workers",
        at_least=0,
    )
    worker_name: str = dataclasses.field(init=False, default="")
    """This process's unique worker name (chunk names, game ids), made from worker_id; not a flag."""

    def __post_init__(self):
        def need(ok, flag, message):
            if not ok:
                raise ValueError(f"--{flag.replace('_', '-')}: {message}")

        problems = setting_problems(self)  # shared settings, declared choices and ranges (format.cli)
        if problems:
            raise ValueError(problems[0])
        if self.seed == -1:
            # Resolved once here, so the config (and the worker's log) names the seed in use.
            object.__setattr__(self, "seed", secrets.randbits(63))
        need(
            not self.model_cache or not local_folder_overlaps_root(self.model_cache, self.root),
            "model_cache",
            f"{self.model_cache} is, holds or lies inside the lake root {self.root}; give the cache a folder "
            "of its own",
        )
        need(
            bool(re.fullmatch(r"[A-Za-z0-9_.]+", self.worker_id)),
            "worker_id",
            f"{self.worker_id!r} may hold only letters, digits, '_' and '.'",
        )
        need(len(self.worker_id) <= 80, "worker_id", "must be at most 80 characters")
        # Resolved once here, like the seed, so the config names the worker in use.
        object.__setattr__(self, "worker_name", unique_worker_name(self.worker_id))
        need(
            not self.spool_dir or not local_folder_overlaps_root(self.spool_dir, self.root),
            "spool_dir",
            f"{self.spool_dir} is, holds or lies inside the lake root {self.root}; give the spool a folder of its own",
        )
        try:
            parse_device(self.device)
        except ValueError as exc:
            need(False, "device", str(exc))

    @property
    def sampled_moves(self) -> int:
        """Moves played by sampling visits (temperature 1) at the start of a game."""
        if self.temperature_moves >= 0:
            return self.temperature_moves
        return self.board_size * self.board_size // 12


CLI = RoleCli(
    WorkerConfig,
    prog="python -m selfplay.worker",
    description="Play self-play games with the newest published model and write them "
    "to ROOT/games/<generation>/ as chunk files (through a local spool, so a "
    "killed worker loses no finished game).  Before any model is published it "
    "plays with a uniform policy (generation 0).",
)
"""The worker's command line: ``CLI.parse(argv)`` -> (WorkerConfig, storage RetryPolicy)."""
