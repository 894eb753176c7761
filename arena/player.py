"""Players: things that choose a move for a position, for GTP and evaluation.

A *player* answers ``select_move(board) -> move`` for the side to move on a
`engine.board.Board`, where a move is a flat action ``p = row * N + col``
(row 0 = top edge) or ``PASS = N * N`` (format/schema.py), or `RESIGN`.
Players that keep their own copy of the game (an external GTP engine) learn
every move through `observe`; the others ignore it.  The game loop
(`arena.match.play_games`, the GTP engine `arena.gtp`) calls::

    player.start_game(board_size, komi)          # once per game
    move = player.select_move(board)             # the side to move's player
    player.observe(move, color)                  # both players, every move
    player.close()                               # once, at the end

Players here:
* `RandomPlayer`: the engine's playout policy (uniform over legal moves
  that don't fill the mover's own eye, else pass).  Seeded.
* `MctsPlayer`: the batched Cython search (`engine.driver.GameBatch`) with an
  evaluator (uniform or a published model); budget: visits, seconds, or both
  (whichever ends first).  `select_moves` searches several games at once.
* `GtpPlayer`: an external GTP engine (GNU Go via `arena.gtp_client`).

Evaluators are callables ``features float32[B, N, N, C] -> (policy_logits
float32[B, N*N+1], value float32[B])``, C the evaluator's input planes
(`format.planes.input_planes_of`; the layout is format/planes.py's), with
the value seen by the side to move at each row (`call_evaluator`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING, Generator, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from engine.board import Board
from engine.move_choice import MovePolicy, ResignationCounter
from engine.search import STATE_EXPANDED
from format import schema
from format.coords import gtp_to_move, move_to_gtp
from format.planes import input_planes_of

if TYPE_CHECKING:
    from engine.driver import GameBatch

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

    def select_move(self, board: Board) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define select_move (or select_moves)")

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
        (`engine.move_choice`, the rule self-play uses too): the first
        ``moves.sampled_moves`` moves by visit count, then the most visited;
        resign after ``moves.resign_consecutive`` own moves valued below
        ``moves.resign_threshold`` (None = never).
    tree_reuse: keep the subtree of the moves played between two searches.
    seed: seeds the search's random draws and the tie-breaks.
    pass_when_winning: the search may also pass whenever the board as it
        stands wins for the mover under Tromp-Taylor (engine.driver's
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
    """Run `evaluator` (a `inference.evaluator.Evaluator`) on float32 [B, N, N, C] input planes
    (format/planes.py; C = `format.planes.input_planes_of(evaluator)`);
    return (logits [B, N*N+1], values [B]).  Checks the one return shape,
    naming the evaluator on a mismatch (a published model must be wrapped in
    `ModelEvaluator` first)."""
    out = evaluator(features)
    if not isinstance(out, tuple) or len(out) != 2:
        raise TypeError(
            f"evaluator {getattr(evaluator, 'name', evaluator)!r} returned {type(out).__name__}; "
            "an Evaluator returns (logits, values) (wrap a published model in ModelEvaluator)"
        )
    logits, values = out
    logits = np.asarray(logits, dtype=np.float32)
    values = np.asarray(values, dtype=np.float32).reshape(-1)
    rows, size = features.shape[0], features.shape[1]
    if logits.shape != (rows, size * size + 1) or values.shape != (rows,):
        raise ValueError(
            f"evaluator {getattr(evaluator, 'name', evaluator)!r} returned logits {logits.shape} and "
            f"values {values.shape} for {rows} positions of {size}x{size}; want "
            f"({rows}, {size * size + 1}) and ({rows},)"
        )
    return logits, values


class MctsPlayer(BasePlayer):
    """Monte Carlo tree search with `evaluator`, through `engine.driver.GameBatch`.

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
        self._batch: GameBatch | None = None
        self._buffer: np.ndarray | None = None  # the batch's input planes, one row per leaf
        self._live_slots: set[int] = set()  # slots whose tree matches their root
        self._resignation: dict[int, ResignationCounter] = {}  # per slot (one game each)
        self.last_root_values: list[float] = []
        self.last_visits: list[int] = []
        self.evaluator_calls = 0

    # ---- GameBatch management ------------------------------------------------

    def _ensure_batch(self, board_size: int, num_slots: int):
        from engine.driver import GameBatch

        batch = self._batch
        if batch is not None and batch.board_size == board_size and batch.num_games >= num_slots:
            return batch
        c = self.config
        self._batch = GameBatch(
            board_size,
            max(num_slots, 1),
            num_groups=1,
            leaves_per_game=c.leaves_per_game,
            c_puct_init=c.c_puct_init,
            c_puct_base=c.c_puct_base,
            fpu_reduction=c.fpu_reduction,
            fpu_reduction_root=0.0,
            seed=c.seed,
            pass_when_winning=c.pass_when_winning,
        )
        self._buffer = np.zeros(
            (self._batch.batch_rows, board_size, board_size, input_planes_of(self.evaluator)), np.float32
        )
        self._live_slots.clear()
        return self._batch

    def _load_position(self, slot: int, board: Board) -> None:
        """Make the slot's root `board`, reusing its tree when `board` continues it."""
        batch = self._batch
        if batch is None:
            raise RuntimeError("MctsPlayer._load_position: no GameBatch yet (_ensure_batch makes it)")
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

    def select_moves(
        self, boards: Sequence[Board], slots: Sequence[int] | None = None, budget: SearchBudget | None = None
    ) -> list[int]:
        """Search every board at once (one evaluator batch per step); one move each."""
        if not boards:
            return []
        budget = budget or self.config.budget
        batch, slots = self._start_search(boards, slots, budget)
        self._run_until_done(batch, slots, budget)
        return self._choose_moves(batch, slots, boards)

    def select_move_steps(self, board: Board, budget: SearchBudget | None = None) -> Generator[object, None, int]:
        """`select_move`, one evaluator batch at a time: yields the search's
        tree (`engine.search.Tree`, rooted at `board`) after each batch and
        returns the move (or RESIGN) as the generator's value, so that a
        caller (the GTP engine's ``*-genmove_analyze``) can report while it
        searches."""
        budget = budget or self.config.budget
        batch, slots = self._start_search([board], [0], budget)
        for _ in self.search_steps(batch, slots, budget):
            yield batch.tree(0)
        return self._choose_moves(batch, slots, [board])[0]

    def analysis_steps(
        self, board: Board, max_visits: int, root_moves: Sequence[int] | None = None
    ) -> Iterator[object]:
        """Search `board` without choosing a move (live analysis): yields the
        tree after each evaluator batch until the root has `max_visits`
        visits, then ends.  Visits of a subtree kept from the last search
        count, so the bound is on the tree and memory stays bounded however
        long the caller lets it run.  The first yield is the tree as loaded
        (a kept subtree may hold visits already).  Nothing is in flight at a
        yield, so the caller may stop at any one; the next search of this
        or a following position reuses the tree as `select_move` does.

        `root_moves` (GTP's avoid/allow): the root's only children, in a
        fresh tree whose root is evaluated here; that tree is not reused
        by the next search, which starts afresh."""
        if root_moves is not None:
            yield from self._restricted_analysis_steps(board, max_visits, root_moves)
            return
        batch, slots = self._start_search([board], [0], None)
        tree = batch.tree(0)
        # A fresh root's own evaluation is a visit too (engine.driver), so it counts as one here.
        batch.start_search(0, max(0, max_visits - max(int(tree.root_visits), 1)))
        yield tree
        for _ in self.search_steps(batch, slots, None):
            yield tree

    def _restricted_analysis_steps(self, board: Board, max_visits: int, root_moves: Sequence[int]) -> Iterator[object]:
        """`analysis_steps` with the root's children set to `root_moves`: the
        root is expanded and evaluated here (as the driver would, a virtual
        loss then its backup, so it counts one visit), then the driver
        searches below it."""
        if board.is_over:
            raise ValueError(f"cannot search a finished game: {board!r}")
        batch = self._ensure_batch(board.size, 1)
        batch.set_board(0, board.copy())
        self._live_slots.discard(0)  # the next search must not reuse a restricted root
        tree = batch.tree(0)
        features = batch.board(0).features(input_planes_of(self.evaluator))[None]
        logits, values = call_evaluator(self.evaluator, features)
        self.evaluator_calls += 1
        tree.expand_node(0, np.asarray(sorted(root_moves), np.int16))
        tree.virtual_loss(0)
        tree.evaluate_node(0, logits[0], float(values[0]))
        tree.backup_value(0, float(values[0]))
        batch.start_search(0, max(0, max_visits - 1))
        yield tree
        for _ in self.search_steps(batch, [0], None):
            yield tree

    def _start_search(
        self, boards: Sequence[Board], slots: Sequence[int] | None, budget: SearchBudget | None
    ) -> tuple[GameBatch, list[int]]:
        """Check the boards, load each into its slot (reusing trees) and, given
        a `budget`, start each slot's search; returns (batch, slots)."""
        slots = list(range(len(boards))) if slots is None else [int(s) for s in slots]
        if len(slots) != len(boards) or len(set(slots)) != len(slots) or min(slots) < 0:
            raise ValueError(f"need one distinct non-negative slot per board, got {slots}")
        sizes = {board.size for board in boards}
        if len(sizes) != 1:
            raise ValueError(f"boards of one select_moves call must share a size, got {sorted(sizes)}")
        for board in boards:
            if board.is_over:
                raise ValueError(f"cannot search a finished game: {board!r}")
        batch = self._ensure_batch(sizes.pop(), max(slots) + 1)
        for slot, board in zip(slots, boards):
            self._load_position(slot, board)
            if budget is not None:
                # A time-only budget gets an effectively endless visit count.
                batch.start_search(slot, budget.visits if budget.visits is not None else TIME_ONLY_VISIT_CAP)
        return batch, slots

    def _choose_moves(self, batch, slots: list[int], boards: Sequence[Board]) -> list[int]:
        """The finished searches' moves (RESIGN by the resignation rule); each
        slot's tree moves on to its move; sets last_root_values/last_visits."""
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
            batch.play(slot, move)  # our move's subtree becomes the root
            moves.append(move)
        return moves

    def _run_until_done(self, batch, slots: list[int], budget: SearchBudget) -> None:
        for _ in self.search_steps(batch, slots, budget):
            pass

    def search_steps(self, batch, slots: list[int], budget: SearchBudget | None) -> Iterator[None]:
        """Gather -> evaluate -> apply until every slot's search is done,
        yielding after each step (the one search loop: `select_moves` runs it
        out, the GTP engine's analysis reports and reads its input between
        steps).

        With a time budget the loop also stops at the deadline, between two
        batches (so nothing is in flight and the visit counts are complete)."""
        seconds = None if budget is None else budget.seconds
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            if all(batch.search_done(slot) for slot in slots):
                return
            buffer = self._buffer
            if buffer is None:
                raise RuntimeError("MctsPlayer.search_steps: no input buffer yet (_ensure_batch makes it)")
            rows = batch.gather(0, buffer)
            if rows:
                logits, values = call_evaluator(self.evaluator, buffer[:rows])
                self.evaluator_calls += 1
                batch.apply(0, logits, values)
            elif not any(self._can_progress(batch, slot) for slot in slots):
                return
            if deadline is not None and time.monotonic() >= deadline and self._all_roots_expanded(batch, slots):
                return
            yield

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
    """An external GTP engine (`arena.gtp_client.GtpClient`, e.g. `GnuGo`).

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
            self._own_move = None  # the engine played it during genmove
            return
        self._own_move = None
        self.client.send(f"play {COLOR_NAMES[color]} {move_to_gtp(move, self._board_size)}")

    def close(self) -> None:
        self.client.close()


def gnugo_player(level: int = 1, name: str | None = None) -> GtpPlayer:
    """GNU Go at `level` (0..10) with Chinese rules and positional superko."""
    from arena.gtp_client import GnuGo

    return GtpPlayer(GnuGo(level=level), name=name or f"gnugo-l{level}")
