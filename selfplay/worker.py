"""Self-play worker: plays many games at once and writes them to the lake.

    python -m selfplay.worker --root ROOT [flags]     (ROOT: folder or gs://bucket/prefix)

Data flow
---------
* `selfplay.driver.GameBatch` holds ``--games`` games split in two halves.
  The loop alternates: while the inference thread evaluates one half's batch,
  this thread backs up the other half's results, plays the moves whose search
  is done, and gathers that half's next batch (Cython, GIL released).
* Each move gets a full search (``--visits``, Dirichlet noise, recorded as a
  policy target) with probability ``--full-search-fraction``, else a fast one
  (``--fast-visits``, ``full_search=False``): KataGo's playout-cap
  randomization.  The first ``--temperature-moves`` moves are sampled in
  proportion to visits, later ones are the most visited (Gumbel: the
  sequential-halving winner).
* Resignation: a player whose root value stays below ``--resign-threshold``
  for ``--resign-consecutive`` own moves resigns.  The game is then finished
  in acceleration mode (``--accelerated-visits``, no policy targets) down to
  two passes, so the record carries the exact Tromp-Taylor ownership of the
  final board (ownership_source ACCELERATED) and ``accelerated_from``; its
  winner is the resignation's.  A ``--resign-disabled-fraction`` of games
  never resigns and records ``would_resign`` instead, which measures how often
  resigning would have been wrong (printed as "false resign").
* Finished games wait in memory, grouped by generation (the model generation
  that played most of the game's moves), and are written
  ``--chunk-games`` at a time (or after ``--chunk-seconds``) as one chunk,
  create-only, to ``games/<generation>/``.  So every chunk holds the games of
  one generation, and no partial chunk is ever visible.
* A watcher thread reads ``models/LATEST`` every ``--poll-seconds``; a newer
  model is loaded (the registry verifies its checksums) and the games in
  progress continue on it from their next move.
* SIGTERM: stop searching, write every finished game, exit 0.  SIGKILL loses
  only unfinished games (and finished ones not yet written).
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import math
import signal
import sys
import threading
import time

import numpy as np

from format import schema as S
from format.codec import GameRecord, chunk_path, encode_chunk, quantize_policy
from format.run_config import RunConfig, RunConfigMismatch, ensure_run_config
from selfplay.config import WorkerConfig, from_argv
from selfplay.driver import GameBatch
from selfplay.evaluator import ModelEvaluator, UniformEvaluator, use_every_cpu_core

log = logging.getLogger("selfplay.worker")

POLICY_DENOMINATOR = 1023
"""Quantization of Gumbel's improved policy (PUCT targets are raw visit counts)."""


@dataclasses.dataclass
class GameInProgress:
    """What is recorded of one game while it is played (lists grow per move)."""

    game_id: str
    seed: int
    """Seed of this game's random streams (the engine's and ``rng``)."""
    rng: np.random.Generator
    """This game's own Python-side draws: resignation on/off, full or fast search."""
    resign_enabled: bool
    moves: list = dataclasses.field(default_factory=list)
    planes: list = dataclasses.field(default_factory=list)
    policy_indices: list = dataclasses.field(default_factory=list)
    policy_values: list = dataclasses.field(default_factory=list)
    root_values: list = dataclasses.field(default_factory=list)
    full_search: list = dataclasses.field(default_factory=list)
    generation_moves: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    low_value_moves: dict = dataclasses.field(default_factory=lambda: {S.BLACK: 0, S.WHITE: 0})
    resigned_by: int = 0
    would_resign: int = 0
    accelerated_from: int = -1
    this_search_full: bool = False

    @property
    def accelerating(self) -> bool:
        return self.resigned_by != 0


def game_seed(worker_seed: int, serial: int) -> int:
    """The seed of a worker's ``serial``-th game: distinct per game and per worker seed.

    numpy's SeedSequence hashes (worker seed, serial) into well-spread
    state, so neighbouring serials or seeds share no stream.  63 bits, so it
    fits the record's int64 field.
    """
    sequence = np.random.SeedSequence(entropy=worker_seed, spawn_key=(serial,))
    return int(sequence.generate_state(1, np.uint64)[0] >> np.uint64(1))


@dataclasses.dataclass
class Counters:
    games: int = 0
    positions: int = 0
    evaluations: int = 0
    batches: int = 0
    batch_rows: int = 0
    network_seconds: float = 0.0
    resign_disabled_games: int = 0
    would_resign_games: int = 0
    false_resignations: int = 0
    chunks: int = 0


class ChunkWriter:
    """Finished games, grouped by generation, written as create-only chunks."""

    def __init__(self, storage, worker_id: str, chunk_games: int, chunk_seconds: float):
        self.storage = storage
        self.worker_id = worker_id
        self.chunk_games = chunk_games
        self.chunk_seconds = chunk_seconds
        self.pending: dict[int, list[GameRecord]] = collections.defaultdict(list)
        self.oldest: dict[int, float] = {}
        self.seq = 0
        self.written: list[str] = []

    def add(self, record: GameRecord) -> None:
        if not self.pending[record.generation]:
            self.oldest[record.generation] = time.monotonic()
        self.pending[record.generation].append(record)

    def flush_due(self) -> int:
        """Write the chunks that are full or old enough; returns chunks written."""
        now = time.monotonic()
        due = [gen for gen, games in self.pending.items()
               if games and (len(games) >= self.chunk_games or now - self.oldest[gen] >= self.chunk_seconds)]
        return sum(self._flush(gen) for gen in due)

    def flush_all(self) -> int:
        return sum(self._flush(gen) for gen in list(self.pending) if self.pending[gen])

    def _flush(self, generation: int) -> int:
        from cloud.base import AlreadyExists

        games = self.pending[generation]
        written = 0
        while games:
            part, rest = games[:self.chunk_games], games[self.chunk_games:]
            data = encode_chunk(part)
            while True:
                path = chunk_path(generation, self.worker_id, self.seq, int(time.time() * 1000))
                self.seq += 1
                try:
                    self.storage.write_new(path, data)
                    break
                except AlreadyExists:
                    continue   # a restarted worker with the same id in the same ms
            self.written.append(path)
            written += 1
            games = rest
        self.pending[generation] = []
        return written


class ModelWatcher:
    """Background thread: polls models/LATEST, loads newer models.

    `take()` hands the newest loaded evaluator to the play loop (or None).
    A model that fails verification is logged and retried at the next poll.
    """

    def __init__(self, storage, poll_seconds: float, cache_dir: str, current_generation: int | None):
        self.storage = storage
        self.poll_seconds = poll_seconds
        self.cache_dir = cache_dir
        self.known = current_generation
        self._ready = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="model-watcher", daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()

    def take(self):
        with self._lock:
            ready, self._ready = self._ready, None
        return ready

    def poll_once(self):
        """Load the newest model if it is newer than the last one; returns it or None."""
        from format import registry

        generation = registry.latest_generation(self.storage)
        if generation is None or (self.known is not None and generation <= self.known):
            return None
        if self.known is None:
            use_every_cpu_core()   # before TensorFlow builds its thread pools
        model = registry.load_model(self.storage, generation, cache_dir=self.cache_dir)
        evaluator = ModelEvaluator(model)
        self.known = generation
        registry.clear_cache(self.cache_dir, keep_generations={generation})
        with self._lock:
            self._ready = evaluator
        return evaluator

    def _run(self):
        while not self._stop.wait(self.poll_seconds):
            try:
                self.poll_once()
            except Exception as exc:  # noqa: BLE001 - a bad model must not stop play
                log.warning("model poll failed (will retry): %s", exc)


class SelfPlayWorker:
    """The play loop (see the module docstring).  `run()` returns the Counters."""

    def __init__(self, config: WorkerConfig, storage, evaluator=None):
        self.config = config
        self.storage = storage
        self.evaluator = evaluator or UniformEvaluator(config.board_size)
        self.batch = GameBatch(
            config.board_size, config.games, komi=config.komi, max_moves=config.max_moves,
            num_groups=2, leaves_per_game=config.leaves_per_game, c_puct_init=config.c_puct,
            fpu_reduction=config.fpu_reduction, gumbel_max_considered=config.gumbel_considered,
            dirichlet_alpha_total=config.dirichlet_alpha_total,
            dirichlet_epsilon=config.dirichlet_epsilon, seed=config.seed)
        n = config.board_size
        self.buffers = [np.zeros((self.batch.batch_rows, n, n, S.INPUT_PLANES), np.float32) for _ in range(2)]
        self.writer = ChunkWriter(storage, config.worker_id, config.chunk_games, config.chunk_seconds)
        self.counters = Counters()
        self.games: list[GameInProgress] = [None] * config.games
        self.stop_requested = threading.Event()
        self.started = time.monotonic()
        self._game_serial = 0
        self._run_tag = f"{config.worker_id}.{int(time.time() * 1000)}"

    # ---- games ------------------------------------------------------------

    def _new_game(self, g: int) -> None:
        seed = game_seed(self.config.seed, self._game_serial)
        self.batch.new_game(g, seed=seed)
        rng = np.random.default_rng(seed)
        resign_enabled = bool(rng.random() >= self.config.resign_disabled_fraction)
        self.games[g] = GameInProgress(game_id=f"{self._run_tag}.{self._game_serial}", seed=seed, rng=rng,
                                       resign_enabled=resign_enabled)
        self._game_serial += 1
        self._start_search(g)

    def _start_search(self, g: int) -> None:
        game = self.games[g]
        cfg = self.config
        if game.accelerating:
            game.this_search_full = False
            self.batch.start_search(g, cfg.accelerated_visits, gumbel=cfg.gumbel, noise=False)
            return
        game.this_search_full = bool(game.rng.random() < cfg.full_search_fraction)
        budget = cfg.visits if game.this_search_full else cfg.fast_visits
        self.batch.start_search(g, budget, gumbel=cfg.gumbel, noise=game.this_search_full)

    def _finish_move(self, g: int) -> None:
        """Record the position, decide resignation, play the move."""
        cfg = self.config
        game = self.games[g]
        board = self.batch.board(g)
        to_play = board.to_play
        value = float(self.batch.root_value(g))
        if not game.accelerating:
            self._update_resignation(game, to_play, value)
        stones = board.stones()
        game.planes.append(np.stack([stones == S.BLACK, stones == S.WHITE]).astype(np.uint8))
        game.root_values.append(value)
        recorded = game.this_search_full and game.accelerated_from < 0
        game.full_search.append(recorded)
        if recorded and self.batch.used_gumbel(g):
            moves, probs = self.batch.improved_policy(g)
            index, values = quantize_policy(probs, POLICY_DENOMINATOR)
            game.policy_indices.append(moves[index])
            game.policy_values.append(values)
        elif recorded:
            moves, visits = self.batch.visit_target(g)
            game.policy_indices.append(moves)
            game.policy_values.append(visits)
        else:
            game.policy_indices.append(np.zeros(0, np.int64))
            game.policy_values.append(np.zeros(0, np.int64))
        sampling = len(game.moves) < cfg.sampled_moves and not game.accelerating
        move = int(self.batch.choose_move(g, 1.0 if sampling else 0.0))
        game.moves.append(move)
        game.generation_moves[self.evaluator.generation] += 1
        if game.resigned_by and game.accelerated_from < 0:
            game.accelerated_from = len(game.moves)
        self.batch.play(g, move)
        self.counters.positions += 1
        if board.is_over:
            self.writer.add(self._game_record(g))
            self.counters.games += 1
            self._new_game(g)
        else:
            self._start_search(g)

    def _update_resignation(self, game: GameInProgress, to_play: int, value: float) -> None:
        if value >= self.config.resign_threshold:
            game.low_value_moves[to_play] = 0
            return
        game.low_value_moves[to_play] += 1
        if game.low_value_moves[to_play] < self.config.resign_consecutive:
            return
        if game.resign_enabled:
            game.resigned_by = to_play
        elif game.would_resign == 0:
            game.would_resign = to_play

    def _game_record(self, g: int) -> GameRecord:
        cfg = self.config
        game = self.games[g]
        board = self.batch.board(g)
        n = cfg.board_size
        two_passes = board.consecutive_passes >= 2
        score = float(board.area_score())
        ownership, source = None, S.OWNERSHIP_NONE
        if game.resigned_by:
            winner, end_reason = -game.resigned_by, S.END_RESIGN
            if two_passes:
                ownership, source = board.ownership(), S.OWNERSHIP_ACCELERATED
            else:
                score = math.nan
        else:
            winner = int(np.sign(score))
            end_reason = S.END_TWO_PASSES if two_passes else S.END_MOVE_CAP
            if two_passes:
                ownership, source = board.ownership(), S.OWNERSHIP_FINAL_BOARD
        if not game.resign_enabled:
            self.counters.resign_disabled_games += 1
            if game.would_resign:
                self.counters.would_resign_games += 1
                self.counters.false_resignations += int(winner == game.would_resign)
        generation = max(game.generation_moves.items(), key=lambda kv: (kv[1], kv[0]))[0]
        m = len(game.moves)
        return GameRecord(
            board_size=n, komi=cfg.komi, game_id=game.game_id, generation=int(generation),
            worker_id=cfg.worker_id, moves=np.asarray(game.moves, np.int16),
            planes=np.asarray(game.planes, np.uint8).reshape(m, 2, n, n),
            policy_indices=game.policy_indices, policy_values=game.policy_values,
            root_values=np.asarray(game.root_values, np.float32),
            full_search=np.asarray(game.full_search, bool), winner=int(winner), score=score,
            end_reason=end_reason, ownership=ownership, ownership_source=source,
            resign_enabled=game.resign_enabled, would_resign=game.would_resign,
            accelerated_from=game.accelerated_from, seed=game.seed)

    # ---- the loop ---------------------------------------------------------

    def _evaluate(self, evaluator, group: int, rows: int):
        start = time.perf_counter()
        logits, values = evaluator(self.buffers[group][:rows])
        return logits, values, time.perf_counter() - start

    def _should_stop(self) -> bool:
        cfg = self.config
        return (self.stop_requested.is_set()
                or (cfg.max_games and self.counters.games >= cfg.max_games)
                or (cfg.max_seconds and time.monotonic() - self.started >= cfg.max_seconds))

    def run(self, watcher: ModelWatcher | None = None) -> Counters:
        for g in range(self.config.games):
            self._new_game(g)
        in_flight: dict[int, concurrent.futures.Future] = {}
        next_progress = time.monotonic() + self.config.progress_seconds
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="inference") as inference:
            while not self._should_stop():
                for group in (0, 1):
                    if group in in_flight:
                        logits, values, seconds = in_flight.pop(group).result()
                        self.counters.network_seconds += seconds
                        self.batch.apply(group, logits, values)
                        for g in self.batch.done_games(group):
                            self._finish_move(g)
                    if watcher is not None:
                        self._maybe_switch_model(watcher)
                    rows = self.batch.gather(group, self.buffers[group])
                    if rows:
                        self.counters.evaluations += rows
                        self.counters.batches += 1
                        self.counters.batch_rows += self.batch.batch_rows
                        in_flight[group] = inference.submit(self._evaluate, self.evaluator, group, rows)
                    else:
                        # Every remaining simulation hit a game-over leaf.
                        for g in self.batch.done_games(group):
                            self._finish_move(g)
                self.counters.chunks += self.writer.flush_due()
                if time.monotonic() >= next_progress:
                    self._print_progress()
                    next_progress = time.monotonic() + self.config.progress_seconds
            for future in in_flight.values():
                future.result()   # let the inference thread finish; results discarded
        self.counters.chunks += self.writer.flush_all()
        self._print_progress()
        return self.counters

    def _maybe_switch_model(self, watcher: ModelWatcher) -> None:
        evaluator = watcher.take()
        if evaluator is not None:
            log.info("switching to model generation %d", evaluator.generation)
            print(f"[selfplay] model generation {evaluator.generation} loaded; games in progress continue on it",
                  flush=True)
            self.evaluator = evaluator

    def _print_progress(self) -> None:
        c = self.counters
        elapsed = max(time.monotonic() - self.started, 1e-9)
        fill = c.evaluations / c.batch_rows if c.batch_rows else 0.0
        false_rate = (f"{c.false_resignations}/{c.would_resign_games}"
                      if c.would_resign_games else "0/0")
        print(f"[selfplay] {elapsed:7.1f}s games {c.games} ({c.games / elapsed:.2f}/s) "
              f"positions {c.positions} ({c.positions / elapsed:.1f}/s) "
              f"evals {c.evaluations / elapsed:.0f}/s batch fill {fill:.1%} "
              f"network {c.network_seconds / elapsed:.0%} chunks {c.chunks} "
              f"generation {self.evaluator.generation} false resign {false_rate}", flush=True)


def open_root(config: WorkerConfig):
    """Open the storage root and check (or create) its run.json."""
    from cloud.storage import open_storage

    storage = open_storage(config.root)
    ensure_run_config(storage, RunConfig(board_size=config.board_size, komi=config.komi))
    return storage


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = from_argv(argv)
    try:
        storage = open_root(config)
    except RunConfigMismatch as exc:
        print(f"selfplay.worker: refusing to run: {exc}", file=sys.stderr)
        return 2
    from format import registry

    try:
        cache = registry.ModelCache(config.model_cache or None)
    except registry.ModelCacheError as exc:
        print(f"selfplay.worker: --model-cache: {exc}", file=sys.stderr)
        return 2
    watcher = ModelWatcher(storage, config.poll_seconds, cache, current_generation=None)
    evaluator = None
    try:
        evaluator = watcher.poll_once()
        watcher.take()
    except Exception as exc:  # noqa: BLE001 - play with the uniform evaluator until a model loads
        log.warning("could not load the latest model yet: %s", exc)

    print(f"[selfplay] worker {config.worker_id} seed {config.seed}", flush=True)
    worker = SelfPlayWorker(config, storage, evaluator)
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.stop_requested.set())
    watcher.start()
    try:
        worker.run(watcher)
    finally:
        watcher.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
