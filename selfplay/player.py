"""Players: things that choose a move for a position, for GTP and evaluation.

A *player* answers ``select_move(board) -> move`` for the side to move on a
`selfplay.board.Board`, where a move is a flat action ``p = row * N + col``
(row 0 = top edge) or ``PASS = N * N`` (format/schema.py), or `RESIGN`.
Players that keep their own copy of the game (an external GTP engine) learn
every move through `observe`; the others ignore it.  The game loop
(`selfplay.match.play_games`, the GTP engine `selfplay.gtp`) calls::

    player.start_game(board_size, komi)          # once per game
    move = player.select_move(board)             # the side to move's player
    player.observe(move, color)                  # both players, every move
    player.close()                               # once, at the end

Players here:

* `RandomPlayer`: uniform over legal moves that don't fill the mover's own
  eye (the engine's playout policy), passing when none is left.  Seeded.
* `MctsPlayer`: the project's batched Cython search (`selfplay.driver`'s
  `GameBatch`, trees from `selfplay.search`) with an evaluator (uniform or a
  published model, `selfplay.evaluator`).  Budget: visits, seconds, or both
  (whichever ends first).  `select_moves` searches several games' positions
  in one GameBatch, so the evaluator sees one batch per step for all of them.
* `GtpPlayer`: an external GTP engine (GNU Go via `selfplay.gtp_client`);
  its ``genmove`` is the move.

Evaluators are callables ``features float32[B, N, N, 17] -> (policy_logits
float32[B, N*N+1], value float32[B])`` with the value seen by the side to move
at each row (see `call_evaluator` for the accepted return shapes).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import time
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from format import layout
from format import schema
from format.coords import gtp_to_move, move_to_gtp
from format.planes import input_planes_of
from selfplay.board import Board
from selfplay.playouts import playout_values
from selfplay.move_policy import MovePolicy, ResignationCounter
from selfplay.search import STATE_EXPANDED

RESIGN = -1
"""What `select_move` returns to resign (never a board action)."""

COLOR_NAMES = {schema.BLACK: "b", schema.WHITE: "w"}

TIME_ONLY_VISIT_CAP = 1_000_000
"""Visit budget of a search limited by time only (the tree preallocates a
table of this many int32 for Gumbel schedules, so it must stay finite)."""



@runtime_checkable
class Player(Protocol):
    """Chooses moves; see the module docstring for the call order."""

    name: str

    def start_game(self, board_size: int, komi: float) -> None: ...

    def select_move(self, board: Board) -> int: ...

    def observe(self, move: int, color: int) -> None: ...

    def close(self) -> None: ...


class BasePlayer:
    """No-op lifecycle hooks, for players that read everything off the board."""

    name = "player"
    max_parallel_games: int | None = None
    """How many games this player can be in at once (None = any number)."""

    def start_game(self, board_size: int, komi: float) -> None:
        pass

    def observe(self, move: int, color: int) -> None:
        pass

    def close(self) -> None:
        pass

    def select_moves(self, boards: Sequence[Board], slots: Sequence[int] | None = None) -> list[int]:
        """Moves for several games' positions (one by one unless overridden)."""
        return [self.select_move(board) for board in boards]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --------------------------------------------------------------------------
# Random
# --------------------------------------------------------------------------

class RandomPlayer(BasePlayer):
    """Uniform over legal moves that don't fill the mover's own eye; else PASS.

    Uses the engine's playout policy (`Board.playout_policy_move`), drawing a
    fresh 64-bit seed per move from a numpy generator seeded by `seed`, so a
    game is reproducible from (seed, opponent's moves)."""

    def __init__(self, seed: int = 0, name: str = "random"):
        self.name = name
        self._rng = np.random.default_rng(seed)

    def select_move(self, board: Board) -> int:
        return int(board.playout_policy_move(int(self._rng.integers(0, 2**63))))


# --------------------------------------------------------------------------
# MCTS
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SearchBudget:
    """When a move's search stops: after `visits` new simulations or
    `seconds` of wall time, whichever comes first (None = no limit; at least
    one must be set)."""

    visits: int | None = 64
    seconds: float | None = None

    def __post_init__(self):
        if self.visits is None and self.seconds is None:
            raise ValueError("a search budget needs visits or seconds (or both)")
        if self.visits is not None and (not isinstance(self.visits, int) or self.visits < 1):
            raise ValueError(f"visits must be a positive int, got {self.visits!r}")
        if self.seconds is not None and not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"seconds must be a positive number, got {self.seconds!r}")


@dataclasses.dataclass(frozen=True)
class MctsConfig:
    """Search settings of an `MctsPlayer`.

    budget: default per-move budget (`select_move` may be given another).
    leaves_per_game: leaves one game adds to a batch per pass (virtual loss
        spreads them); more means bigger, fewer evaluator calls.
    c_puct_init, c_puct_base, fpu_reduction: PUCT (AlphaZero's c(s); first-
        play urgency Q(parent) - fpu_reduction for unvisited interior children).
    moves: how a finished search becomes a move and when to resign
        (`selfplay.move_policy`, the rule self-play uses too): the first
        ``moves.sampled_moves`` moves by visit count, then the most visited;
        resign after ``moves.resign_consecutive`` own moves valued below
        ``moves.resign_threshold`` (None = never).
    tree_reuse: keep the subtree of the moves played between two searches.
    seed: seeds the search's random draws and the tie-breaks.
    pass_when_winning: the search may also pass whenever the board as it
        stands wins for the mover under Tromp-Taylor (selfplay.driver's
        ``pass_when_winning``, the rule self-play's ``--pass-when-winning``
        uses); off, PASS only when every other move fills one's own eye.
    """

    budget: SearchBudget = SearchBudget()
    leaves_per_game: int = 8
    c_puct_init: float = 1.25
    c_puct_base: float = 19652.0
    fpu_reduction: float = 0.25
    moves: MovePolicy = MovePolicy()
    tree_reuse: bool = True
    seed: int = 0
    pass_when_winning: bool = False

    def __post_init__(self):
        if not 1 <= self.leaves_per_game <= 256:
            raise ValueError(f"leaves_per_game must be in 1..256, got {self.leaves_per_game}")


def call_evaluator(evaluator, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run `evaluator` (a `selfplay.evaluator.Evaluator`) on float32 [B, N, N, 17];
    return (logits [B, N*N+1], values [B]).  Checks the one return shape,
    naming the evaluator on a mismatch (a published model must be wrapped in
    `ModelEvaluator` first)."""
    out = evaluator(features)
    if not isinstance(out, tuple) or len(out) != 2:
        raise TypeError(f"evaluator {getattr(evaluator, 'name', evaluator)!r} returned {type(out).__name__}; "
                        "an Evaluator returns (logits, values) (wrap a published model in ModelEvaluator)")
    logits, values = out
    logits = np.asarray(logits, dtype=np.float32)
    values = np.asarray(values, dtype=np.float32).reshape(-1)
    rows, size = features.shape[0], features.shape[1]
    if logits.shape != (rows, size * size + 1) or values.shape != (rows,):
        raise ValueError(
            f"evaluator {getattr(evaluator, 'name', evaluator)!r} returned logits {logits.shape} and "
            f"values {values.shape} for {rows} positions of {size}x{size}; want "
            f"({rows}, {size * size + 1}) and ({rows},)")
    return logits, values


class MctsPlayer(BasePlayer):
    """Monte Carlo tree search with `evaluator`, through `selfplay.driver.GameBatch`.

    One GameBatch slot per game searched at once (`select_moves` with slot
    ids, e.g. game indices, keeps each game's tree between its moves).  A
    slot's tree is reused when the new position is the slot's old root plus
    the moves played since (checked by Zobrist hash and move number); any
    other position starts a fresh tree.

    After each search `last_root_values` holds the root value (for the mover)
    per searched board and `last_visits` the root's visit count.
    """

    def __init__(self, evaluator, config: MctsConfig = MctsConfig(), name: str | None = None):
        self.evaluator = evaluator
        self.config = config
        self.name = name or f"mcts-{getattr(evaluator, 'name', 'evaluator')}"
        self._batch = None
        self._buffer = None
        self._live_slots: set[int] = set()   # slots whose tree matches their root
        self._resignation: dict[int, ResignationCounter] = {}   # per slot (one game each)
        self.last_root_values: list[float] = []
        self.last_visits: list[int] = []
        self.evaluator_calls = 0

    # ---- GameBatch management ------------------------------------------------

    def _ensure_batch(self, board_size: int, num_slots: int):
        from selfplay.driver import GameBatch

        batch = self._batch
        if batch is not None and batch.board_size == board_size and batch.num_games >= num_slots:
            return batch
        c = self.config
        self._batch = GameBatch(
            board_size, max(num_slots, 1), num_groups=1, leaves_per_game=c.leaves_per_game,
            c_puct_init=c.c_puct_init, c_puct_base=c.c_puct_base, fpu_reduction=c.fpu_reduction,
            fpu_reduction_root=0.0, seed=c.seed, pass_when_winning=c.pass_when_winning)
        self._buffer = np.zeros((self._batch.batch_rows, board_size, board_size, input_planes_of(self.evaluator)),
                                np.float32)
        self._live_slots.clear()
        return self._batch

    def _load_position(self, slot: int, board: Board) -> None:
        """Make the slot's root `board`, reusing its tree when `board` continues it."""
        batch = self._batch
        root = batch.board(slot)
        if self.config.tree_reuse and slot in self._live_slots and self._continues(root, board):
            played = board.move_number - root.move_number
            if played == 0:
                return
            if played == 1 and board.last_move >= 0:
                batch.play(slot, board.last_move)  # promotes the opponent's move's subtree
                return
        batch.set_board(slot, board.copy())
        self._live_slots.add(slot)

    @staticmethod
    def _continues(root: Board, board: Board) -> bool:
        """`board` is `root` or `root` plus the one move `board.last_move`."""
        if root.size != board.size or root.komi != board.komi or root.max_moves != board.max_moves:
            return False
        if board.move_number == root.move_number:
            return root.hash == board.hash and root.to_play == board.to_play
        if board.move_number != root.move_number + 1 or board.last_move < 0 or root.is_over:
            return False
        if not root.is_legal(board.last_move):
            return False
        probe = root.copy()
        probe.play(board.last_move)
        return probe.hash == board.hash and probe.consecutive_passes == board.consecutive_passes

    # ---- search ----------------------------------------------------------------

    def select_move(self, board: Board, budget: SearchBudget | None = None) -> int:
        return self.select_moves([board], [0], budget)[0]

    def select_moves(self, boards: Sequence[Board], slots: Sequence[int] | None = None,
                     budget: SearchBudget | None = None) -> list[int]:
        """Search every board at once (one evaluator batch per step); one move each."""
        if not boards:
            return []
        slots = list(range(len(boards))) if slots is None else [int(s) for s in slots]
        if len(slots) != len(boards) or len(set(slots)) != len(slots) or min(slots) < 0:
            raise ValueError(f"need one distinct non-negative slot per board, got {slots}")
        sizes = {board.size for board in boards}
        if len(sizes) != 1:
            raise ValueError(f"boards of one select_moves call must share a size, got {sorted(sizes)}")
        for board in boards:
            if board.is_over:
                raise ValueError(f"cannot search a finished game: {board!r}")
        budget = budget or self.config.budget
        batch = self._ensure_batch(sizes.pop(), max(slots) + 1)
        for slot, board in zip(slots, boards):
            self._load_position(slot, board)
            # A time-only budget gets an effectively endless visit count.
            batch.start_search(slot, budget.visits if budget.visits is not None else TIME_ONLY_VISIT_CAP)
        self._run_until_done(batch, slots, budget)
        moves = []
        self.last_root_values = []
        self.last_visits = []
        policy = self.config.moves
        for slot, board in zip(slots, boards):
            move = int(batch.choose_move(slot, policy.temperature(board.move_number)))
            value = float(batch.root_value(slot))
            self.last_root_values.append(value)
            self.last_visits.append(int(batch.tree(slot).root_visits))
            counter = self._resignation.setdefault(slot, ResignationCounter(policy))
            if counter.observe(board.to_play, value):
                moves.append(RESIGN)
                continue
            batch.play(slot, move)        # our move's subtree becomes the root
            moves.append(move)
        return moves

    def _run_until_done(self, batch, slots: list[int], budget: SearchBudget) -> None:
        """Gather -> evaluate -> apply until every slot's budget is spent.

        With a time budget the loop also stops at the deadline, between two
        batches (so nothing is in flight and the visit counts are complete)."""
        deadline = None if budget.seconds is None else time.monotonic() + budget.seconds
        while True:
            if all(batch.search_done(slot) for slot in slots):
                return
            rows = batch.gather(0, self._buffer)
            if rows:
                logits, values = call_evaluator(self.evaluator, self._buffer[:rows])
                self.evaluator_calls += 1
                batch.apply(0, logits, values)
            elif not any(self._can_progress(batch, slot) for slot in slots):
                return
            if deadline is not None and time.monotonic() >= deadline and self._all_roots_expanded(batch, slots):
                return

    @staticmethod
    def _all_roots_expanded(batch, slots) -> bool:
        return all(batch.tree(slot).node(0)["state"] == STATE_EXPANDED for slot in slots)

    @staticmethod
    def _can_progress(batch, slot) -> bool:
        tree = batch.tree(slot)
        return tree.sims_started < tree.sims_budget or tree.node(0)["state"] != STATE_EXPANDED

    def observe(self, move: int, color: int) -> None:
        pass  # positions are matched by hash in _load_position

    def start_game(self, board_size: int, komi: float) -> None:
        self._live_slots.clear()
        self._resignation.clear()


# --------------------------------------------------------------------------
# External GTP engine
# --------------------------------------------------------------------------

class GtpPlayer(BasePlayer):
    """An external GTP engine (`selfplay.gtp_client.GtpClient`, e.g. `GnuGo`).

    The engine keeps its own board: `start_game` sends boardsize/komi/
    clear_board, `observe` relays the opponent's moves with ``play``, and
    `select_move` asks ``genmove`` (the engine plays that move itself, so its
    own moves are not relayed back).  One engine process holds one game, so
    it plays one game at a time."""

    max_parallel_games = 1

    def __init__(self, client, name: str = "gtp"):
        self.client = client
        self.name = name
        self._own_move: tuple[int, int] | None = None
        self._board_size: int | None = None

    def start_game(self, board_size: int, komi: float) -> None:
        self._board_size = board_size
        self._own_move = None
        self.client.send(f"boardsize {board_size}")
        self.client.send(f"komi {komi}")
        self.client.send("clear_board")

    def select_move(self, board: Board) -> int:
        if self._board_size != board.size:
            raise RuntimeError(f"{self.name}: start_game({board.size}, ...) was not called")
        color = COLOR_NAMES[board.to_play]
        reply = self.client.send(f"genmove {color}").strip().lower()
        if reply == "resign":
            self._own_move = None
            return RESIGN
        move = gtp_to_move(reply, board.size)
        self._own_move = (move, board.to_play)
        return move

    def observe(self, move: int, color: int) -> None:
        if self._own_move == (move, color):
            self._own_move = None       # the engine played it during genmove
            return
        self._own_move = None
        self.client.send(f"play {COLOR_NAMES[color]} {move_to_gtp(move, self._board_size)}")

    def close(self) -> None:
        self.client.close()


def gnugo_player(level: int = 1, name: str | None = None) -> GtpPlayer:
    """GNU Go at `level` (0..10) with Chinese rules and positional superko."""
    from selfplay.gtp_client import GnuGo

    return GtpPlayer(GnuGo(level=level), name=name or f"gnugo-l{level}")


# --------------------------------------------------------------------------
# A network-free evaluator with a value signal
# --------------------------------------------------------------------------

class PlayoutEvaluator:
    """Uniform priors; value = mean result of random playouts from the leaf.

    The classic pure-MCTS baseline: unlike the uniform evaluator (value 0,
    whose search only sees game-over leaves, so it plays about as well as
    random moves), it beats `RandomPlayer` with a few dozen visits, so it
    is a yardstick that a young network must pass.

    The work is `selfplay.playouts.playout_values`, one Cython call per batch
    outside the GIL: each leaf position is rebuilt from its input planes
    (the stones at t and the colour plane) on a fresh board, so superko
    history before the leaf is not seen by the playouts.  A playout's
    result is +1/-1/0 for the side to move at the leaf.  It is also the
    evaluator of generation 0 (`selfplay.worker.generation0_evaluator`).
    """

    generation = 0
    input_planes = schema.BASIC_INPUT_PLANES   # playout_values reads channels 0, 8 and 16

    def __init__(self, board_size: int, komi: float, playouts: int = 1, seed: int = 0):
        if playouts < 1:
            raise ValueError(f"playouts must be >= 1, got {playouts}")
        self.board_size = board_size
        self.komi = float(komi)
        self.playouts = playouts
        self.name = f"playouts{playouts}"
        self._rng = np.random.default_rng(seed)

    def __call__(self, planes: np.ndarray):
        rows, size = planes.shape[0], self.board_size
        if planes.shape[1:] != (size, size, self.input_planes):
            raise ValueError(f"planes must be [B, {size}, {size}, {self.input_planes}], got {planes.shape}")
        values = playout_values(np.ascontiguousarray(planes, np.float32), self.komi, self.playouts,
                                int(self._rng.integers(0, 2**63)))
        return np.zeros((rows, size * size + 1), np.float32), values


# --------------------------------------------------------------------------
# Evaluators: uniform, or a published model
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EvaluatorSource:
    """Where an MCTS player's evaluations come from.

    model_root: storage root (local folder or gs://...) of a run with
        published models; None = the uniform evaluator (`selfplay.evaluator`).
    generation: the published generation to load; None = the latest.
    """

    model_root: str | None = None
    generation: int | None = None

    def __post_init__(self):
        if self.generation is not None and (self.model_root is None or self.generation < 0):
            raise ValueError(f"generation {self.generation!r} needs a model root and must be >= 0")

    @classmethod
    def from_model_dir(cls, path: str) -> "EvaluatorSource":
        """A published model folder ``ROOT/models/<generation>`` -> its root and generation."""
        trimmed = path.rstrip("/")
        parent, _, name = trimmed.rpartition("/")
        root, _, models = parent.rpartition("/")
        if models != layout.MODELS_DIR or not name.isdigit():
            raise ValueError(f"--model {path!r}: want a published model folder ROOT/{layout.MODELS_DIR}/<generation>")
        return cls(model_root=root or ".", generation=int(name))


class Terminated(BaseException):
    """SIGTERM arrived (a BaseException, so no player's ``except Exception`` swallows it)."""


@contextlib.contextmanager
def terminated_by_sigterm():
    """Within the block, SIGTERM raises `Terminated` in the main thread: the one way the
    programs that load models and start players (match, GTP, the ladder) stop on SIGTERM.

    SIGTERM's default action (a GUI closing its engine, systemd stopping a
    unit) ends the process without unwinding, so the temporary model cache
    (`format.registry.ModelCache`, removed on close or at exit) stayed in
    TMPDIR and GNU Go kept running.  An exception runs every ``finally``
    (players closed, caches closed) and then the atexit handlers.  A second
    SIGTERM is ignored so that it cannot interrupt that clean-up.  The caller
    catches `Terminated`, says so in one line and exits 128 + SIGTERM.
    """
    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


EXIT_TERMINATED = 128 + signal.SIGTERM
"""The exit status of a program stopped by SIGTERM through `terminated_by_sigterm` (the shell's convention)."""


@dataclasses.dataclass
class LoadedEvaluator:
    """An evaluator callable plus what it can play.

    board_size/komi: the run's settings (run.json) for a model; None for the
    uniform evaluator, which plays any size."""

    evaluate: object
    name: str
    generation: int
    board_size: int | None = None
    komi: float | None = None

    def for_board_size(self, board_size: int):
        """The callable for `board_size` (ValueError if the model can't play it)."""
        if self.board_size is None:
            from selfplay.evaluator import UniformEvaluator

            return UniformEvaluator(board_size)
        if board_size != self.board_size:
            raise ValueError(f"{self.name} plays {self.board_size}x{self.board_size} only, not {board_size}x{board_size}")
        return self.evaluate


def load_evaluator(source: EvaluatorSource, cache_dir: str | None = None, retry=None) -> LoadedEvaluator:
    """Load `source` once: the uniform evaluator, or a model from the registry.

    A model's board size is the one in its manifest; its komi is the run's
    (run.json), or None when the root has no run.json.  Raises LookupError
    when the root has no published model yet, and `format.registry`'s
    RegistryError for a generation that is not published or is corrupt, and
    `selfplay.model_probe.ModelMisfit` (a ValueError) for one whose outputs on
    real positions are misshapen or not finite (a diverged network).
    ``retry`` is the storage RetryPolicy for a gs:// root (None: the default);
    an unreachable bucket raises `cloud.base.StorageError` naming the object."""
    from selfplay.evaluator import UniformEvaluator

    if source.model_root is None:
        return LoadedEvaluator(UniformEvaluator(9), "uniform", 0)
    from format import registry
    from cloud.storage import open_storage
    from format.run_config import read_run_config
    from selfplay.model_probe import probe_model
    from selfplay.openvino_evaluator import make_evaluator

    storage = open_storage(source.model_root, retry=retry)
    generation = source.generation
    if generation is None:
        generation = registry.latest_generation(storage)
        if generation is None:
            raise LookupError(f"{storage.url(layout.LATEST)} is missing: {source.model_root} has no published model yet")
    model = registry.load_model(storage, generation, cache_dir=cache_dir)
    run = read_run_config(storage)
    evaluator = make_evaluator(model)
    probe_model(evaluator, int(model.board_size), generation)    # a diverged model is refused, not played
    return LoadedEvaluator(evaluator, f"model-g{generation}", generation,
                           board_size=int(model.board_size), komi=None if run is None else run.komi)
