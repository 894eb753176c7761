"""Self-play worker: plays many games at once and writes them to the lake.

    python -m selfplay.worker --root ROOT [flags]   (ROOT: folder or gs://bucket/prefix; flags: selfplay.config)

Data flow::

    models/LATEST --ModelWatcher thread, inference.loading--> evaluator (checked against run.json, probed)
    GameBatch (engine.driver) --input planes--> evaluator --logits, values--> GameBatch
    finished search --engine.move_choice--> move; finished game --format.codec.encode_game-->
    selfplay.spool entry (fsync'ed; then ``game_finished``) --batch of one generation-->
    chunk games/<generation>/... (create-only) --> entries deleted

``--games`` games are split in two halves: while the inference thread
evaluates one half's batch, this thread backs up the other half's results,
plays the moves whose search is done and gathers that half's next batch
(Cython, GIL released).  Until a model is published, generation 0 plays
(`generation0_evaluator`); a newer model takes over the games in progress at
their next move, and a model that fails a check is refused (`ModelWatcher`,
`SelfPlayWorker._refuse_in_play`).  A finished game is on disk before it
counts, so SIGKILL loses only unfinished games (a worker restarted on the same
spool uploads the rest); SIGTERM, --max-games or --max-seconds stop play,
upload every spooled game and exit 0.  The root must be writable and agree
with its run.json, else exit 2 (`open_root`).
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
from typing import Any

import numpy as np

from cloud.storage import canonical_root
from engine.driver import GameBatch
from engine.move_choice import MovePolicy, ResignationCounter
from format import layout, schema
from format.codec import GameRecord, encode_game, quantize_policy
from format.events import EventLog
from format.planes import convert_input_planes, input_planes_of
from format.run_config import RunConfig, RunConfigMismatch, ensure_run_config
from inference.devices import configure_accelerator, use_every_cpu_core
from inference.eval_cache import with_evaluation_cache
from inference.evaluator import UniformEvaluator
from inference.loading import PlayoutEvaluator, load_published_evaluator
from inference.model_probe import ModelMisfit, check_outputs, one_line
from inference.symmetric import RandomSymmetryEvaluator
from selfplay.config import CLI, WorkerConfig, default_spool_base
from selfplay.spool import Spool, SpoolError, SpoolFull, open_spool

log = logging.getLogger("selfplay.worker")

SPOOL_FULL_RETRY_SECONDS = 1.0
"""While the spool's disk is full: how often to upload and try the write again."""
PAUSED_POLL_SECONDS = 0.2
"""While no model may play (one was refused in play with none to fall back to): how often to look for a newer one."""
POLICY_DENOMINATOR = 1023
"""Quantization of Gumbel's improved policy (PUCT targets are raw visit counts)."""


@dataclasses.dataclass
class GameInProgress:
    """What is recorded of one game while it is played (lists grow per move).

    Resignation (`engine.move_choice`'s rule, per colour): a side whose root
    value stays below ``--resign-threshold`` for ``--resign-consecutive`` own
    moves resigns; the game is then finished in acceleration mode
    (``--accelerated-visits``, no policy targets) down to two passes, so the
    record carries the exact Tromp-Taylor ownership of the final board
    (ownership_source ACCELERATED) and ``accelerated_from``, with the
    resignation's winner.  A ``--resign-disabled-fraction`` of games never
    resigns and records ``would_resign`` instead: how often resigning would
    have been wrong (printed as "false resign").
    """

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
    resignation: ResignationCounter | None = None
    """Consecutive low root values per colour (engine.move_choice's rule)."""
    resigned_by: int = 0
    would_resign: int = 0
    accelerated_from: int = -1
    this_search_full: bool = False
    dropped: bool = False
    """Its model was refused in play (`SelfPlayWorker._refuse_in_play`): restarted, never written."""

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
    finished_positions: int = 0
    """Positions of the finished (spooled) games; ``positions`` also counts games still in play."""


def backoff_seconds(failures: int, base: float, cap: float = 300.0) -> float:
    """Wait before retry number ``failures`` (1, 2, ...): base doubling, at most ``cap``."""
    return min(cap, base * 2 ** max(0, failures - 1))


class ModelWatcher:
    """Background thread: polls models/LATEST every ``--poll-seconds``, loads newer models.

    A newer model is checked against the run (its manifest's board size
    against run.json's), loaded (the registry verifies its checksums and that
    the SavedModel's shapes are its manifest's board size) and probed: a few
    real positions, each colour to move, must come back with outputs of the
    right shapes, all finite (`inference.loading.load_published_evaluator`).
    `take()` then hands it to the play loop (or None).  A broken LATEST or a
    model that fails a check is rejected: one stderr line and a
    ``model_rejected`` event each time, and the next try waits longer
    (`backoff_seconds`); play goes on with the current model.  At start-up
    the worker waits for a loadable model (`load_first_model`).
    """

    def __init__(
        self,
        storage,
        poll_seconds: float,
        cache_dir: str,
        current_generation: int | None,
        placement=None,
        events: EventLog | None = None,
        inference: str = "auto",
        inference_threads: int = 0,
        board_size: int | None = None,
    ):
        self.storage = storage
        self.board_size = board_size  # the run's (run.json): a model for another board is refused
        self.inference = inference  # WorkerConfig.inference: auto, tensorflow or openvino
        self.inference_threads = inference_threads
        self.placement = placement  # inference.devices.Placement; None = set up at the first load
        self.poll_seconds = poll_seconds
        self.cache_dir = cache_dir
        self.known = current_generation
        self.events = events or EventLog(None, "worker")
        self.failures = 0
        """Consecutive rejected polls (0 after a good one)."""
        self._trying = None  # the generation being loaded, for the rejection message
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
        """Load the newest model if it is newer than the last one; returns it or None.

        The model is loaded and probed by `inference.loading.load_published_evaluator`
        once its manifest fits the run (`check_fits_run`).  Raises whatever the
        registry, the probe or TensorFlow raise (see `reject`).
        """
        from format import registry
        from inference import model_files

        self._trying = None
        generation = registry.latest_generation(self.storage)
        if generation is None or (self.known is not None and generation <= self.known):
            self.failures = 0
            return None
        self._trying = generation
        # The run's fixed settings first, from the manifest alone: a model for another board is
        # refused before its files are fetched or TensorFlow is loaded.
        self.check_fits_run(registry.read_manifest(self.storage, generation).metadata, generation)
        if self.placement is None:
            use_every_cpu_core()  # before TensorFlow builds its thread pools
            self.placement = configure_accelerator("")  # GPU memory growth before TF touches a GPU
        evaluator = load_published_evaluator(
            self.storage,
            generation,
            cache_dir=self.cache_dir,
            placement=self.placement,
            inference=self.inference,
            threads=self.inference_threads,
            log=lambda line: print(f"[selfplay] {line}", flush=True),
        ).evaluate
        self.known = generation
        self.failures = 0
        model_files.clear_cache(self.cache_dir, keep_generations={generation})
        self.events.emit("model_loaded", generation=generation)
        with self._lock:
            self._ready = evaluator
        return evaluator

    def check_fits_run(self, metadata: dict, generation: int) -> None:
        """ModelMisfit unless the model's manifest says it plays this run's board.

        run.json fixes the board size, komi, rules and feature set.  Komi and
        rules are not the network's business (the search applies them), and
        the feature set's planes are checked against the SavedModel's input
        by `inference.model_files.load_model`; the board size is in the manifest.
        """
        if self.board_size is None:
            return
        if metadata.get("board_size") != self.board_size:
            raise ModelMisfit(
                f"{self.storage.url(layout.model_manifest(generation))}: field 'board_size' is "
                f"{metadata.get('board_size')}, but this run plays {self.board_size}x{self.board_size} "
                f"({self.storage.url(layout.RUN_CONFIG)})"
            )

    def reject(self, exc: BaseException, keeping: str) -> float:
        """Report a failed poll; returns how long to wait before the next one."""
        self.failures += 1
        delay = backoff_seconds(self.failures, self.poll_seconds)
        what = f"model generation {self._trying}" if self._trying is not None else f"{self.storage.url(layout.LATEST)}"
        message = one_line(str(exc)) or type(exc).__name__
        print(
            f"selfplay.worker: rejected {what}: {message}; {keeping}, retrying in {delay:.3g} s",
            file=sys.stderr,
            flush=True,
        )
        self.events.emit("model_rejected", generation=self._trying, error=message[:500])
        return delay

    def _run(self):
        delay = self.poll_seconds
        while not self._stop.wait(delay):
            try:
                self.poll_once()
                delay = self.poll_seconds
            except Exception as exc:  # noqa: BLE001 - a bad model must not stop play
                keeping = (
                    f"keeping generation {self.known}"
                    if self.known is not None
                    else "keeping the generation-0 evaluator"
                )
                delay = self.reject(exc, keeping)


def generation0_evaluator(config: WorkerConfig):
    """The evaluator of generation 0 (no model published yet): random playouts, or uniform (value 0).

    Playouts give the first games a value signal, so their searches prefer
    moves that win random continuations: the first network learns from
    targets that mean something instead of from near-random play.
    """
    if config.generation0_playouts:
        return PlayoutEvaluator(config.board_size, config.komi, config.generation0_playouts, seed=config.seed)
    return UniformEvaluator(config.board_size)


def open_worker_spool(config: WorkerConfig) -> Spool:
    """The spool ``config`` names (--spool-dir, else its default slot), bound to the config's lake."""
    return open_spool(
        config.spool_dir or None, default_spool_base(config.root, config.worker_id), lake=canonical_root(config.root)
    )


class SelfPlayWorker:
    """The play loop (see the module docstring).  `run()` returns the Counters.

    ``spool``: an open `selfplay.spool.Spool` (the caller closes it); None
    opens the one ``config`` names and closes it when `run()` ends.
    """

    def __init__(
        self, config: WorkerConfig, storage, evaluator=None, spool: Spool | None = None, events: EventLog | None = None
    ):
        self.config = config
        self.storage = storage
        self.evaluator = self._playing(evaluator or generation0_evaluator(config))
        self.worker_name = config.worker_name
        self.events = events or EventLog(None, "worker")
        self._own_spool = spool is None
        self.spool = spool or open_worker_spool(config)
        self.upload_failures = 0
        self._upload_retry_at = 0.0
        self._leftovers_done = False
        self._spool_full = False
        self.final_upload_ok = True
        self.batch = GameBatch(
            config.board_size,
            config.games,
            komi=config.komi,
            max_moves=config.max_moves,
            num_groups=2,
            leaves_per_game=config.leaves_per_game,
            c_puct_init=config.c_puct,
            fpu_reduction=config.fpu_reduction,
            gumbel_max_considered=config.gumbel_considered,
            gumbel_c_visit=config.gumbel_c_visit,
            gumbel_c_scale=config.gumbel_c_scale,
            dirichlet_alpha_total=config.dirichlet_alpha_total,
            dirichlet_epsilon=config.dirichlet_epsilon,
            seed=config.seed,
            pass_when_winning=config.pass_when_winning,
        )
        # One batch buffer per group, as wide as the input of the evaluator that gathers into it
        # (format/planes.py: 17 or 22 channels; `_buffer_for` follows a model of another width).
        self.buffers = [self._new_buffer(input_planes_of(self.evaluator)) for _ in range(2)]
        self.counters = Counters()
        self.move_policy = MovePolicy(
            sampled_moves=config.sampled_moves,
            resign_threshold=config.resign_threshold,
            resign_consecutive=config.resign_consecutive,
        )
        self.games: list[GameInProgress | None] = [None] * config.games  # each slot's game, once started
        self.stop_requested = threading.Event()
        self.started = time.monotonic()
        self._game_serial = 0
        self._run_tag = f"{self.worker_name}.{int(time.time() * 1000)}"
        self._previous = None
        """The model played before the current one (never generation 0): the fallback should the current fail."""
        self._refused: set[int] = set()
        """Generations refused in play: no batch they evaluate is backed up."""

    # ---- games ------------------------------------------------------------

    def _new_game(self, g: int) -> None:
        # Serials are reserved in the spool, so a restart with the same --seed plays new games.
        serial = self._while_spool_full(lambda: self.spool.reserve_serial(self.config.seed, self._game_serial))
        if serial is None:
            return  # stopping while the spool is full: the slot stays empty
        self._game_serial = serial
        seed = game_seed(self.config.seed, self._game_serial)
        self.batch.new_game(g, seed=seed)
        rng = np.random.default_rng(seed)
        resign_enabled = bool(rng.random() >= self.config.resign_disabled_fraction)
        self.games[g] = GameInProgress(
            game_id=f"{self._run_tag}.{self._game_serial}", seed=seed, rng=rng, resign_enabled=resign_enabled
        )
        self._game_serial += 1
        self._start_search(g)

    def _game(self, g: int) -> GameInProgress:
        """The game in slot ``g``, which `_new_game` has started."""
        game = self.games[g]
        if game is None:
            raise RuntimeError(f"self-play slot {g} has no game: _new_game starts one before it is searched")
        return game

    def _start_search(self, g: int) -> None:
        """Full search (``--visits``, Dirichlet noise, recorded as a policy target) with probability
        ``--full-search-fraction``, else a fast one (``--fast-visits``): KataGo's playout-cap
        randomization.  A resigned game's searches are accelerated (``--accelerated-visits``)."""
        game = self._game(g)
        cfg = self.config
        # Gumbel's draws at full scale in the opening, --gumbel-late-noise after it.
        gumbel_noise = 1.0 if len(game.moves) < cfg.sampled_moves else cfg.gumbel_late_noise
        if game.accelerating:
            game.this_search_full = False
            self.batch.start_search(
                g, cfg.accelerated_visits, gumbel=cfg.gumbel, noise=False, gumbel_noise=gumbel_noise
            )
            return
        game.this_search_full = bool(game.rng.random() < cfg.full_search_fraction)
        budget = cfg.visits if game.this_search_full else cfg.fast_visits
        self.batch.start_search(g, budget, gumbel=cfg.gumbel, noise=game.this_search_full, gumbel_noise=gumbel_noise)

    def _finish_move(self, g: int) -> None:
        """Record the position, decide resignation, play the move.

        The move follows `engine.move_choice`: the first ``--temperature-moves``
        moves are sampled in proportion to visits, later ones are the most
        visited (with ``--gumbel``, the sequential-halving winner).
        """
        game = self._game(g)
        if game.dropped:
            self._new_game(g)  # its search is done, so nothing of it is in flight
            return
        board = self.batch.board(g)
        to_play = board.to_play
        value = float(self.batch.root_value(g))
        if not game.accelerating and self.config.resign_value == "root":
            self._update_resignation(game, to_play, value)
        stones = board.stones()
        game.planes.append(np.stack([stones == schema.BLACK, stones == schema.WHITE]).astype(np.uint8))
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
        temperature = 0.0 if game.accelerating else self.move_policy.temperature(len(game.moves))
        move = int(self.batch.choose_move(g, temperature))
        if not game.accelerating and self.config.resign_value == "move":
            self._update_resignation(game, to_play, self.batch.move_value(g, move))
        game.moves.append(move)
        game.generation_moves[self.evaluator.generation] += 1
        if game.resigned_by and game.accelerated_from < 0:
            game.accelerated_from = len(game.moves)
        self.batch.play(g, move)
        self.counters.positions += 1
        if board.is_over:
            self._spool_game(self._game_record(g))
            self._new_game(g)
        else:
            self._start_search(g)

    def _update_resignation(self, game: GameInProgress, to_play: int, value: float) -> None:
        if game.resignation is None:
            game.resignation = ResignationCounter(self.move_policy)
        if not game.resignation.observe(to_play, value):
            return
        if game.resign_enabled:
            game.resigned_by = to_play
        elif game.would_resign == 0:
            game.would_resign = to_play

    def _game_record(self, g: int) -> GameRecord:
        cfg = self.config
        game = self._game(g)
        board = self.batch.board(g)
        n = cfg.board_size
        two_passes = board.consecutive_passes >= 2
        score = float(board.area_score())
        ownership, source = None, schema.OWNERSHIP_NONE
        if game.resigned_by:
            winner, end_reason = -game.resigned_by, schema.END_RESIGN
            if two_passes:
                ownership, source = board.ownership(), schema.OWNERSHIP_ACCELERATED
            else:
                score = math.nan
        else:
            winner = int(np.sign(score))
            end_reason = schema.END_TWO_PASSES if two_passes else schema.END_MOVE_CAP
            if two_passes:
                ownership, source = board.ownership(), schema.OWNERSHIP_FINAL_BOARD
        if not game.resign_enabled:
            self.counters.resign_disabled_games += 1
            if game.would_resign:
                self.counters.would_resign_games += 1
                self.counters.false_resignations += int(winner == game.would_resign)
        # The game's generation (its chunk's) is the one that played most of its moves.
        generation = max(game.generation_moves.items(), key=lambda kv: (kv[1], kv[0]))[0]
        m = len(game.moves)
        return GameRecord(
            board_size=n,
            komi=cfg.komi,
            game_id=game.game_id,
            generation=int(generation),
            worker_id=self.worker_name,
            moves=np.asarray(game.moves, np.int16),
            planes=np.asarray(game.planes, np.uint8).reshape(m, 2, n, n),
            policy_indices=game.policy_indices,
            policy_values=game.policy_values,
            root_values=np.asarray(game.root_values, np.float32),
            full_search=np.asarray(game.full_search, bool),
            winner=int(winner),
            score=score,
            end_reason=end_reason,
            ownership=ownership,
            ownership_source=source,
            resign_enabled=game.resign_enabled,
            would_resign=game.would_resign,
            accelerated_from=game.accelerated_from,
            seed=game.seed,
        )

    # ---- the loop ---------------------------------------------------------

    def _new_buffer(self, channels: int) -> np.ndarray:
        n = self.config.board_size
        return np.zeros((self.batch.batch_rows, n, n, channels), np.float32)

    def _buffer_for(self, group: int) -> np.ndarray:
        """The group's batch buffer, as wide as the current evaluator's input (replaced if it was not)."""
        channels = input_planes_of(self.evaluator)
        if self.buffers[group].shape[3] != channels:
            self.buffers[group] = self._new_buffer(channels)
        return self.buffers[group]

    def _evaluate(self, evaluator, group: int, rows: int):
        """On the inference thread: (logits, values, seconds, what is wrong with them or None)."""
        start = time.perf_counter()
        planes = self.buffers[group][:rows]
        if planes.shape[3] != input_planes_of(evaluator):
            # Rows gathered for a model of the other width, left over when it was refused.
            planes = convert_input_planes(planes, input_planes_of(evaluator))
        logits, values = evaluator(planes)
        seconds = time.perf_counter() - start
        return logits, values, seconds, check_outputs(logits, values, rows, self.config.board_size)

    def _should_stop(self) -> bool:
        cfg = self.config
        return bool(
            self.stop_requested.is_set()
            or (cfg.max_games and self.counters.games >= cfg.max_games)
            or (cfg.max_positions and self.counters.finished_positions >= cfg.max_positions)
            or (cfg.max_seconds and time.monotonic() - self.started >= cfg.max_seconds)
        )

    def run(self, watcher: ModelWatcher | None = None) -> Counters:
        """Play until stopped, upload every spooled game; `final_upload_ok` says whether that worked."""
        try:
            self.upload_leftovers()
            self._play(watcher)
            self.final_upload_ok = self.upload_everything()
        finally:
            if self._own_spool:
                self.spool.close()
        self.events.emit("stopped", reason=self.stop_reason(), games=self.counters.games)
        return self.counters

    def stop_reason(self) -> str:
        cfg = self.config
        if self.stop_requested.is_set():
            return "signal"
        if cfg.max_games and self.counters.games >= cfg.max_games:
            return "max_games"
        if cfg.max_positions and self.counters.finished_positions >= cfg.max_positions:
            return "max_positions"
        return "max_seconds"

    def _play(self, watcher: ModelWatcher | None) -> None:
        for g in range(self.config.games):
            self._new_game(g)
        # group -> (evaluator, rows, future) of the batch the inference thread is evaluating
        in_flight: dict[int, tuple[Any, int, concurrent.futures.Future]] = {}
        # group -> rows gathered whose evaluation was refused: the group's buffer still holds
        # them (it is only refilled by the group's next gather), so another model evaluates them
        unevaluated: dict[int, int] = {}
        next_progress = time.monotonic() + self.config.progress_seconds
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="inference") as inference:
            while not self._should_stop():
                for group in (0, 1):
                    if group in in_flight:
                        evaluator, rows, future = in_flight.pop(group)
                        logits, values, seconds, problem = future.result()
                        self.counters.network_seconds += seconds
                        if problem is not None:
                            self._refuse_in_play(evaluator, problem)
                        if self.evaluator is None or evaluator.generation in self._refused:
                            unevaluated[group] = rows
                        else:
                            self.batch.apply(group, logits, values)
                            for g in self.batch.done_games(group):
                                self._finish_move(g)
                    if watcher is not None:
                        self._maybe_switch_model(watcher)
                    if self.evaluator is None:
                        continue  # paused: no model may play until a newer one loads
                    rows = unevaluated.pop(group, 0)
                    if not rows:
                        rows = self.batch.gather(group, self._buffer_for(group))
                        if not rows:
                            # Every remaining simulation hit a game-over leaf.
                            for g in self.batch.done_games(group):
                                self._finish_move(g)
                            continue
                        self.counters.evaluations += rows
                        self.counters.batches += 1
                        self.counters.batch_rows += self.batch.batch_rows
                    in_flight[group] = (
                        self.evaluator,
                        rows,
                        inference.submit(self._evaluate, self.evaluator, group, rows),
                    )
                if self.evaluator is None and not in_flight:
                    self.stop_requested.wait(PAUSED_POLL_SECONDS)
                self._ship()
                if time.monotonic() >= next_progress:
                    self._print_progress()
                    next_progress = time.monotonic() + self.config.progress_seconds
            for _, _, future in in_flight.values():
                future.result()  # let the inference thread finish; results discarded

    # ---- the spool and the lake ---------------------------------------------

    def _spool_game(self, record: GameRecord) -> None:
        """A finished game goes to disk first; only then does it count (and get its event)."""
        payload = encode_game(record)
        entry = self._while_spool_full(lambda: self.spool.add(record.generation, record.game_id, payload))
        if entry is None:
            print(
                f"selfplay.worker: game {record.game_id} is lost: stopping while the spool at "
                f"{self.spool.directory} has no room for it",
                file=sys.stderr,
                flush=True,
            )
            return
        self.counters.games += 1
        self.counters.finished_positions += record.num_positions
        self.events.emit(
            "game_finished",
            game_id=record.game_id,
            generation=record.generation,
            moves=len(record.moves),
            spool_entry=entry,
        )

    def _while_spool_full(self, write):
        """``write()``, a spool write; while the spool's disk is full, play pauses in here.

        Each round uploads every spooled game (that makes room) and tries again.
        None when the worker is to stop before there is room.
        """
        paused = False
        while True:
            try:
                result = write()
            except SpoolFull as exc:
                if paused and (self._should_stop() or self.stop_requested.wait(SPOOL_FULL_RETRY_SECONDS)):
                    return None
                paused = True
                self._say_spool_full(exc)
                self._ship(everything=True)
                continue
            if paused:
                print(f"[selfplay] the spool at {self.spool.directory} has room again; play resumed", flush=True)
            self._spool_full = False  # the next time it is full is a new episode, with its own line
            return result

    def _say_spool_full(self, exc: SpoolFull) -> None:
        if not self._spool_full:  # once per episode
            self._spool_full = True
            print(f"selfplay.worker: {exc}; new games paused until uploads make room", file=sys.stderr, flush=True)

    def _make_batches(self, everything: bool) -> SpoolFull | None:
        """Batch what is due; the SpoolFull that stopped it early (the batches made so far go out first)."""
        cfg, spool = self.config, self.spool
        try:
            for generation in spool.due(cfg.chunk_games, cfg.chunk_seconds, everything):
                timed_out = everything or time.monotonic() - spool.oldest[generation] >= cfg.chunk_seconds
                while spool.loose[generation] and (timed_out or len(spool.loose[generation]) >= cfg.chunk_games):
                    spool.make_batch(generation, self.worker_name, cfg.chunk_games)
        except SpoolFull as exc:
            return exc
        return None

    def _ship(self, everything: bool = False) -> bool:
        """Batch what is due, upload every batch; False when an upload failed.

        A failing bucket costs one stderr line: the games stay spooled and the
        upload is retried with backoff while play goes on.
        """
        while True:
            full = self._make_batches(everything)
            if not self.spool.batches:
                if full is not None:
                    self._say_spool_full(full)
                return True
            if time.monotonic() < self._upload_retry_at:
                return False
            for batch in list(self.spool.batches):
                try:
                    outcome, games = self.spool.upload(self.storage, batch, self.worker_name)
                except Exception as exc:  # noqa: BLE001 - a failing bucket must not lose games or stop play
                    self.upload_failures += 1
                    delay = backoff_seconds(self.upload_failures, 2.0)
                    self._upload_retry_at = time.monotonic() + delay
                    message = " ".join(str(exc).split()) or type(exc).__name__
                    print(
                        f"selfplay.worker: upload of {self.storage.url(batch.chunk)} failed ({message}); "
                        f"{self.spool.spooled} games stay spooled in {self.spool.directory}, "
                        f"retrying in {delay:.3g} s",
                        file=sys.stderr,
                        flush=True,
                    )
                    return False
                if outcome != "rebatched":
                    self.counters.chunks += 1
                    self.events.emit("chunk_uploaded", path=batch.chunk, games=games, generation=batch.generation)
            self.upload_failures = 0
            for message in self.spool.corrupt:
                print(f"selfplay.worker: {message}", file=sys.stderr, flush=True)
            self.spool.corrupt.clear()
            if not self.spool.batches and full is None:
                return True
            # Again: re-batched games go out now, and so do the ones that found no room for a
            # batch file before these uploads made some.

    def upload_leftovers(self) -> None:
        """At start-up: upload what a killed predecessor left in the spool (once).

        Complete batches go first, then loose games in new batches; uploading
        never waits for room, so a full spool is emptied before play starts.
        """
        if self._leftovers_done:
            return
        self._leftovers_done = True
        before = self.spool.spooled
        if before or self.spool.corrupt:
            print(
                f"[selfplay] spool {self.spool.directory}: uploading {before} games left by an earlier run", flush=True
            )
        self._ship(everything=True)

    def upload_everything(self, attempts: int = 5) -> bool:
        """At exit: batch and upload every spooled game, retrying a failing bucket a few times."""
        for attempt in range(attempts):
            if attempt:
                time.sleep(max(0.0, self._upload_retry_at - time.monotonic()))
            if self._ship(everything=True) and not self.spool.spooled:
                self._print_progress()
                return True
        print(
            f"selfplay.worker: {self.spool.spooled} games stay spooled in {self.spool.directory}; "
            f"a worker started on that spool uploads them",
            file=sys.stderr,
            flush=True,
        )
        self._print_progress()
        return False

    def _maybe_switch_model(self, watcher: ModelWatcher) -> None:
        """Games in progress continue on a newly loaded model from their next move.  Every model
        gets a fresh evaluation cache (`inference.eval_cache`): rows whose input planes it has
        already evaluated, in any of the worker's games, skip the network."""
        evaluator = watcher.take()
        if evaluator is not None:
            log.info("switching to model generation %d", evaluator.generation)
            print(
                f"[selfplay] model generation {evaluator.generation} loaded; games in progress continue on it",
                flush=True,
            )
            if self.evaluator is not None and self.evaluator.generation > 0:
                self._previous = self.evaluator  # the fallback should this one fail in play
            self.evaluator = self._playing(evaluator)

    def _playing(self, evaluator):
        """``evaluator`` as the search calls it: under random symmetries (``--symmetry``, a model's
        only: the playouts of generation 0 have no orientation), behind the evaluation cache."""
        if self.config.symmetry and evaluator.generation > 0:
            evaluator = RandomSymmetryEvaluator(
                evaluator, self.config.board_size, seed=(self.config.seed + evaluator.generation) % 2**63
            )
        return with_evaluation_cache(evaluator, self.config.eval_cache_entries)

    def _refuse_in_play(self, evaluator, problem: str) -> None:
        """A model answered a batch in play with outputs a search cannot use: refuse it for good.

        The probe at load time covers a few positions only.  The batch is not
        backed up (its rows go to the model played next), the model is never
        used again (the watcher only loads newer generations), play falls back
        to the model played before it, and with none (never generation 0 in a
        lake with models) pauses until a newer model loads.  Every game in
        progress is dropped at its next move: its tree holds this model's
        evaluations.  Games finished earlier are kept: every evaluation they
        used was checked finite.
        """
        generation = evaluator.generation
        if generation in self._refused:
            return  # a batch sent before the refusal: already reported
        self._refused.add(generation)  # a generation is never republished: it names the model
        if self._previous is not None and self._previous.generation == generation:
            self._previous = None
        if self.evaluator is not None and self.evaluator.generation == generation:
            self.evaluator, self._previous = self._previous, None
        dropped = 0
        for game in self.games:
            if game is not None and not game.dropped:
                game.dropped = True
                dropped += 1
        keeping = (
            f"back to generation {self.evaluator.generation}"
            if self.evaluator is not None
            else "play paused until a newer model loads"
        )
        message = f"a batch of positions in play got {problem}"
        print(
            f"selfplay.worker: rejected model generation {generation}: {message}; the {dropped} games "
            f"in progress are dropped; {keeping}",
            file=sys.stderr,
            flush=True,
        )
        self.events.emit("model_rejected", generation=generation, error=message, in_play=True, games_dropped=dropped)

    def _print_progress(self) -> None:
        c = self.counters
        elapsed = max(time.monotonic() - self.started, 1e-9)
        fill = c.evaluations / c.batch_rows if c.batch_rows else 0.0
        false_rate = f"{c.false_resignations}/{c.would_resign_games}" if c.would_resign_games else "0/0"
        generation = self.evaluator.generation if self.evaluator is not None else None  # None: paused
        print(
            f"[selfplay] {elapsed:7.1f}s games {c.games} ({c.games / elapsed:.2f}/s) "
            f"positions {c.positions} ({c.positions / elapsed:.1f}/s) "
            f"evals {c.evaluations / elapsed:.0f}/s batch fill {fill:.1%} "
            f"network {c.network_seconds / elapsed:.0%} chunks {c.chunks} "
            f"generation {'none (paused)' if generation is None else generation} false resign {false_rate}",
            flush=True,
        )
        self.events.emit(
            "progress",
            games=c.games,
            positions=c.positions,
            generation=generation,
            chunks=c.chunks,
            spooled=self.spool.spooled,
        )


class StartupError(Exception):
    """A reason to exit 2 before playing; the message is the one line printed."""


def open_root(config: WorkerConfig, retry=None):
    """Open the storage root, prove it writable, and check (or create) its run.json."""
    from cloud.storage import open_storage

    try:
        storage = open_storage(config.root, retry=retry)
    except ValueError as exc:
        raise StartupError(f"--root: {exc}") from None
    probe = layout.probe_path(config.worker_name)
    try:
        storage.write_new(probe, b"zerolake worker write probe\n")
        storage.delete(probe, missing_ok=True)
    except Exception as exc:  # noqa: BLE001 - any failure means: cannot write chunks here
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise StartupError(f"the root {storage.url()} is not writable ({message})") from None
    try:
        ensure_run_config(storage, RunConfig(board_size=config.board_size, komi=config.komi))
    except RunConfigMismatch as exc:
        raise StartupError(f"refusing to run: {exc}") from None
    except Exception as exc:  # noqa: BLE001
        raise StartupError(
            f"cannot read or write {storage.url(layout.RUN_CONFIG)}: {' '.join(str(exc).split())}"
        ) from None
    return storage


def load_first_model(watcher: ModelWatcher, stop: threading.Event, max_seconds: float = 0.0):
    """The model to start with, and whether to play: (None, True) only when models/LATEST does not exist.

    While LATEST exists but cannot be loaded, wait and retry (never fall back
    to generation 0 in a lake that has models).  (None, False): ``stop`` was
    set, or ``max_seconds`` (the worker's --max-seconds, 0 = none) ran out,
    while waiting.
    """
    deadline = time.monotonic() + max_seconds if max_seconds else math.inf
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            evaluator = watcher.poll_once()
            watcher.take()
            return evaluator, True
        except Exception as exc:  # noqa: BLE001 - wait for a good model, do not play generation 0
            delay = watcher.reject(exc, "not playing until a model loads")
            stop.wait(min(delay, max(0.0, deadline - time.monotonic())))
    return None, False


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config, retry = CLI.parse(argv)
    try:
        events = EventLog(config.events or None, "worker")
    except OSError as exc:
        print(f"selfplay.worker: --events {config.events}: {exc.strerror}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        storage = open_root(config, retry)
    except StartupError as exc:
        print(f"selfplay.worker: {exc}", file=sys.stderr)
        return 2
    from inference import model_files

    try:
        cache = model_files.ModelCache(config.model_cache or None)
    except model_files.ModelCacheError as exc:
        print(f"selfplay.worker: --model-cache: {exc}", file=sys.stderr)
        return 2
    placement = None
    if config.device:  # fail now on a missing device; '' leaves TensorFlow unloaded until a model exists
        use_every_cpu_core()
        try:
            placement = configure_accelerator(config.device)
        except ValueError as exc:
            print(f"selfplay.worker: {exc}", file=sys.stderr)
            return 2
    try:
        spool = open_worker_spool(config)
    except SpoolError as exc:
        print(f"selfplay.worker: --spool-dir: {exc}", file=sys.stderr)
        return 2
    playing: list[SelfPlayWorker] = []  # the worker, once made: the health probe reads its positions
    health = None
    if config.health_port:
        from selfplay.health import HealthServer

        try:
            health = HealthServer(
                config.health_port,
                lambda: playing[0].counters.positions if playing else 0,
                config.health_stall_seconds,
            )
        except OSError as exc:
            print(f"selfplay.worker: --health-port {config.health_port}: {exc.strerror}", file=sys.stderr)
            spool.close()
            return 2
    try:
        return _run_worker(config, storage, spool, cache, placement, events, stop, playing)
    finally:
        if health is not None:
            health.close()
        spool.close()
        events.close()


def _run_worker(config, storage, spool, cache, placement, events, stop, playing: list) -> int:
    """Leftovers, first model, play, final upload (main's part after the checks)."""
    worker = SelfPlayWorker(config, storage, None, spool=spool, events=events)
    playing.append(worker)
    worker.stop_requested = stop
    worker.upload_leftovers()
    watcher = ModelWatcher(
        storage,
        config.poll_seconds,
        cache,
        current_generation=None,
        placement=placement,
        events=events,
        inference=config.inference,
        inference_threads=config.inference_threads,
        board_size=config.board_size,
    )
    evaluator, play = load_first_model(watcher, stop, config.max_seconds)
    if not play:
        reason = "signal" if stop.is_set() else "max_seconds"
        print(f"[selfplay] stopped ({reason}) before any model could be loaded; no games played", flush=True)
        events.emit("stopped", reason=reason, games=0)
        return 0
    if evaluator is not None:
        worker.evaluator = with_evaluation_cache(evaluator, config.eval_cache_entries)
    print(f"[selfplay] worker {worker.worker_name} seed {config.seed}", flush=True)
    events.emit("started", worker_id=worker.worker_name, seed=config.seed, generation=worker.evaluator.generation)
    watcher.start()
    try:
        worker.run(watcher)
    finally:
        watcher.stop()
    return 0 if worker.final_upload_ok else 1


if __name__ == "__main__":
    sys.exit(main())
