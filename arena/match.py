"""Match play: player A against player B, with a win rate and its confidence.

    python -m arena.match model:ROOT random --games 100 --visits 16
    python -m arena.match model:ROOT@12 model:ROOT@10 --games 200 --json
    python -m arena.match uniform gnugo:1 --games 10 --sgf-dir /tmp/games

A *player spec* is ``model:ROOT[@GEN]`` (MCTS with a run's published model,
default the latest), ``uniform`` (MCTS with uniform priors and value 0),
``random`` (legal moves that don't fill an own eye), ``playouts[:K]`` (MCTS
valued by K random playouts, default 16: `inference.loading.PlayoutEvaluator`)
or ``gnugo[:LEVEL]`` (GNU Go over GTP, level 0-10, default 1).

Data flows: `evaluate(player_a, player_b, games, board_size, komi, ...) ->
EvalResult` (the training loop's entry point) plays up to ``parallel_games``
games in lockstep, each player searching all games where it is to move in
one call (`MctsPlayer.select_moves`: one evaluator batch per step; GNU Go
holds one game at a time).  A plays Black in even-numbered games; with
``--paired-openings K`` games 2k and 2k+1 share K random opening moves.  A
game ends after two passes, a resignation, an illegal move (a forfeit) or
the move cap, scored by Tromp-Taylor area with komi from Black's side.
Terms: a draw (score exactly 0) counts half a win; the win rate is A's, with
a 95% Wilson score interval (`wilson_interval`); ``distinct_games`` counts
games differing in colours or moves (a deterministic player's repeat is no
new evidence).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time
from typing import Callable, Sequence

from arena.elo import Z_95
from arena.player import RESIGN, MctsConfig, MctsPlayer, Player, RandomPlayer, SearchBudget, gnugo_player
from engine.board import Board, IllegalMove
from engine.move_choice import MovePolicy
from format import schema
from format.cli import (
    RoleCli,
    board_size_setting,
    config_from_namespace,
    events_setting,
    komi_setting,
    max_moves_setting,
    pass_when_winning_setting,
    setting,
    setting_problems,
    storage_retry,
)
from format.match_record import MatchGame, MatchRecord
from inference.loading import EvaluatorSource, PlayoutEvaluator, load_evaluator
from processes.sigterm import EXIT_TERMINATED, Terminated, terminated_by_sigterm

END_TWO_PASSES = schema.END_REASONS[schema.END_TWO_PASSES]
END_RESIGN = schema.END_REASONS[schema.END_RESIGN]
END_MOVE_CAP = schema.END_REASONS[schema.END_MOVE_CAP]
END_ILLEGAL = "illegal-move"


def wilson_interval(successes: float, trials: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson, 1927).

    Better than the normal approximation p +- z sqrt(p(1-p)/n) at small n
    and near 0 or 1: it never leaves [0, 1] and is not empty at p = 0 or 1.
    `successes` may be fractional (draws count half).  (0, 1) when trials=0.
    """
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes ({successes}) <= trials ({trials})")
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    z2 = z * z
    denominator = 1.0 + z2 / trials
    centre = (p + z2 / (2 * trials)) / denominator
    half_width = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denominator
    return max(0.0, centre - half_width), min(1.0, centre + half_width)


@dataclasses.dataclass(frozen=True)
class GameResult:
    """One finished game.

    moves: flat actions in order (Black first), PASS = N*N.
    winner: BLACK, WHITE, or EMPTY (0) for a draw.
    score: Tromp-Taylor area score from Black's side; None when the game
        ended by resignation or forfeit.
    end_reason: 'two-passes', 'resign', 'move-cap' or 'illegal-move'.
    """

    index: int
    black: str
    white: str
    moves: tuple[int, ...]
    winner: int
    score: float | None
    end_reason: str
    sgf_path: str | None = None

    @property
    def result_text(self) -> str:
        """SGF/GTP style: 'B+3.5', 'W+R' (resign), 'B+F' (forfeit), '0' (draw)."""
        if self.winner == schema.EMPTY:
            return "0"
        side = "B" if self.winner == schema.BLACK else "W"
        if self.end_reason == END_RESIGN:
            return f"{side}+R"
        if self.end_reason == END_ILLEGAL:
            return f"{side}+F"
        if self.score is None:
            raise ValueError(f"game {self.index} ended by {self.end_reason} but has no score")
        return f"{side}+{abs(self.score):g}"


@dataclasses.dataclass(frozen=True)
class EvalResult(MatchRecord):
    """A match from player A's side, as played: its record (`format.match_record.MatchRecord`: the
    totals, win_rate = (wins + draws / 2) / games, and each game's result) plus each game's moves."""

    played: tuple[GameResult, ...] = ()

    def summary(self) -> str:
        return (
            f"{self.player_a} vs {self.player_b} on {self.board_size}x{self.board_size}, komi {self.komi:g}: "
            f"{self.wins} wins, {self.losses} losses, {self.draws} draws in {self.games} games "
            f"(as Black {self.wins_as_black}, as White {self.wins_as_white}); "
            f"win rate {self.win_rate:.3f}, 95% CI [{self.ci_low:.3f}, {self.ci_high:.3f}]; "
            f"{self.distinct_games} distinct games; "
            f"{self.mean_moves:.1f} moves per game, {self.seconds:.1f} s"
        )

    def to_record(self) -> MatchRecord:
        """The result as the lake keeps it (format.match_record), without the moves."""
        return MatchRecord(**{f.name: getattr(self, f.name) for f in dataclasses.fields(MatchRecord)})

    def to_json_dict(self) -> dict:
        return self.to_record().to_json_dict()


def summarize(
    player_a: str, player_b: str, board_size: int, komi: float, results: Sequence[GameResult], seconds: float
) -> EvalResult:
    """Count A's wins (A is Black in even-numbered games) into an EvalResult."""
    wins = losses = draws = wins_black = wins_white = 0
    for game in results:
        a_color = schema.BLACK if game.index % 2 == 0 else schema.WHITE
        if game.winner == schema.EMPTY:
            draws += 1
        elif game.winner == a_color:
            wins += 1
            wins_black += a_color == schema.BLACK
            wins_white += a_color == schema.WHITE
        else:
            losses += 1
    total = len(results)
    successes = wins + 0.5 * draws
    low, high = wilson_interval(successes, total)
    return EvalResult(
        player_a=player_a,
        player_b=player_b,
        board_size=board_size,
        komi=komi,
        games=total,
        wins=wins,
        losses=losses,
        draws=draws,
        wins_as_black=wins_black,
        wins_as_white=wins_white,
        win_rate=successes / total if total else 0.0,
        ci_low=low,
        ci_high=high,
        mean_moves=sum(len(g.moves) for g in results) / total if total else 0.0,
        seconds=seconds,
        distinct_games=len({(g.black, g.moves) for g in results}),
        played=tuple(results),
        game_results=tuple(
            MatchGame(g.index, g.black, g.white, g.result_text, g.score, g.end_reason, len(g.moves), g.sgf_path)
            for g in results
        ),
    )


# --------------------------------------------------------------------------
# playing
# --------------------------------------------------------------------------


@dataclasses.dataclass
class _LiveGame:
    """A game in progress: its slot (the players' search slot), board, moves."""

    index: int
    slot: int
    board: Board
    black: Player
    white: Player
    moves: list[int] = dataclasses.field(default_factory=list)

    def player_to_move(self):
        return self.black if self.board.to_play == schema.BLACK else self.white


def _finish(game: _LiveGame, end_reason: str, loser: int | None = None) -> GameResult:
    """Score a finished game; `loser` is set for a resignation or a forfeit."""
    if loser is not None:
        winner, score = -loser, None
    else:
        score = float(game.board.area_score())
        winner = schema.BLACK if score > 0 else schema.WHITE if score < 0 else schema.EMPTY
    return GameResult(game.index, game.black.name, game.white.name, tuple(game.moves), winner, score, end_reason)


def _apply_move(game: _LiveGame, move: int) -> GameResult | None:
    """Play `move` for the side to move and tell both players; the result if the game ended."""
    board = game.board
    color = board.to_play
    if move == RESIGN:
        return _finish(game, END_RESIGN, loser=color)
    try:
        board.play(move)
    except IllegalMove:
        return _finish(game, END_ILLEGAL, loser=color)
    game.moves.append(move)
    for player in {id(game.black): game.black, id(game.white): game.white}.values():
        player.observe(move, color)
    if board.is_over:
        return _finish(game, END_TWO_PASSES if board.consecutive_passes >= 2 else END_MOVE_CAP)
    return None


def random_openings(count: int, moves: int, board_size: int, komi: float, seed: int) -> list[tuple[int, ...]]:
    """``count`` openings of ``moves`` moves each: uniform over legal moves that fill no own eye
    (`RandomPlayer`), from ``seed``.  Fair only when each is played with both colours."""
    player = RandomPlayer(seed=seed)
    openings = []
    for _ in range(count):
        board = Board(board_size, komi, 0)
        opening: list[int] = []
        while len(opening) < moves and not board.is_over:
            move = player.select_move(board)
            board.play(move)
            opening.append(move)
        openings.append(tuple(opening))
    return openings


def play_games(
    player_a,
    player_b,
    games: int,
    board_size: int,
    komi: float,
    *,
    max_moves: int = 0,
    parallel_games: int = 32,
    openings: Sequence[Sequence[int]] = (),
    on_game: Callable[[GameResult], None] | None = None,
) -> list[GameResult]:
    """Play `games` games, A Black in even-numbered ones; results in index order.

    Up to `parallel_games` games run in lockstep (1 when a player holds one
    game at a time, like GNU Go); `on_game` is called as each one ends.
    ``openings``: games 2k and 2k+1 (the same pair of players, colours
    swapped) both start with the moves of ``openings[k]``, played for the
    players and shown to them as any move is.
    """
    if games < 1:
        raise ValueError(f"games must be >= 1, got {games}")
    limits = [p.max_parallel_games for p in (player_a, player_b) if getattr(p, "max_parallel_games", None)]
    concurrency = max(1, min([parallel_games, games] + limits))
    next_index = 0
    free_slots = list(range(concurrency - 1, -1, -1))
    live: list[_LiveGame] = []
    results: list[GameResult] = []

    def end(game, result):
        live.remove(game)
        free_slots.append(game.slot)
        results.append(result)
        if on_game is not None:
            on_game(result)

    while live or next_index < games:
        while free_slots and next_index < games:
            black, white = (player_a, player_b) if next_index % 2 == 0 else (player_b, player_a)
            for player in {id(black): black, id(white): white}.values():
                player.start_game(board_size, komi)
            game = _LiveGame(next_index, free_slots.pop(), Board(board_size, komi, max_moves), black, white)
            live.append(game)
            next_index += 1
            for move in openings[game.index // 2] if game.index // 2 < len(openings) else ():
                result = _apply_move(game, move)
                if result is not None:  # an opening as long as the game: it ended there
                    end(game, result)
                    break
        for player in {id(player_a): player_a, id(player_b): player_b}.values():
            mine = [g for g in live if g.player_to_move() is player]
            if not mine:
                continue
            moves = player.select_moves([g.board for g in mine], [g.slot for g in mine])
            for game, move in zip(mine, moves):
                result = _apply_move(game, move)
                if result is not None:
                    end(game, result)
    return sorted(results, key=lambda g: g.index)


def sgf_bytes(result: GameResult, board_size: int, komi: float) -> bytes:
    """One game as SGF bytes, with the player names in PB/PW and the game's index in GN."""
    from sgfmill import sgf

    from format.sgf import game_to_sgf

    data = game_to_sgf(board_size, komi, list(result.moves), result=result.result_text)
    game = sgf.Sgf_game.from_bytes(data)
    root = game.get_root()
    root.set("PB", result.black)
    root.set("PW", result.white)
    root.set("GN", f"game {result.index} ({result.end_reason})")
    return game.serialise()


def write_sgf(result: GameResult, board_size: int, komi: float, folder: str) -> str:
    """Write one game as ``<index>-<black>-vs-<white>.sgf`` in a local folder; return its path."""
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{result.black}-vs-{result.white}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{result.index:05d}-{safe}.sgf")
    with open(path, "wb") as handle:
        handle.write(sgf_bytes(result, board_size, komi))
    return path


def evaluate(
    player_a,
    player_b,
    games: int,
    board_size: int,
    komi: float,
    *,
    max_moves: int = 0,
    parallel_games: int = 32,
    sgf_dir: str | None = None,
    openings: Sequence[Sequence[int]] = (),
    on_game: Callable[[GameResult], None] | None = None,
) -> EvalResult:
    """Play a match and count it from A's side (see the module docstring).

    `sgf_dir`: write every game there as ``<index>-<black>-vs-<white>.sgf``;
    `openings`: as for `play_games`.
    """
    started = time.monotonic()
    results = play_games(
        player_a,
        player_b,
        games,
        board_size,
        komi,
        max_moves=max_moves,
        parallel_games=parallel_games,
        openings=openings,
        on_game=on_game,
    )
    if sgf_dir is not None:
        results = [dataclasses.replace(r, sgf_path=write_sgf(r, board_size, komi, sgf_dir)) for r in results]
    return summarize(player_a.name, player_b.name, board_size, komi, results, time.monotonic() - started)


# --------------------------------------------------------------------------
# player specs and the command line
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlayerSpec:
    """A parsed player spec (see the module docstring)."""

    kind: str  # 'model', 'uniform', 'random', 'playouts', 'gnugo'
    root: str | None = None  # model: the run's storage root
    generation: int | None = None  # model: None = latest
    level: int = 1  # gnugo: 0..10
    playouts: int = 16  # playouts: random playouts per leaf

    @classmethod
    def parse(cls, text: str) -> "PlayerSpec":
        if text in ("uniform", "random"):
            return cls(text)
        if text == "gnugo" or text.startswith("gnugo:"):
            level_text = text.partition(":")[2] or "1"
            if not level_text.isdigit() or not 0 <= int(level_text) <= 10:
                raise ValueError(f"player {text!r}: GNU Go level must be 0..10")
            return cls("gnugo", level=int(level_text))
        if text == "playouts" or text.startswith("playouts:"):
            count_text = text.partition(":")[2] or "16"
            if not count_text.isdigit() or not 1 <= int(count_text) <= 1024:
                raise ValueError(f"player {text!r}: the playout count must be 1..1024")
            return cls("playouts", playouts=int(count_text))
        if text.startswith("model:") and len(text) > len("model:"):
            root = text[len("model:") :]
            generation = None
            head, at, tail = root.rpartition("@")
            if at:
                if not tail.isdigit() or not head:
                    raise ValueError(f"player {text!r}: want model:ROOT@GENERATION with a number after '@'")
                root, generation = head, int(tail)
            return cls("model", root=root, generation=generation)
        raise ValueError(f"player {text!r}: want model:ROOT[@GEN], uniform, random, playouts[:K] or gnugo[:LEVEL]")


@dataclasses.dataclass(frozen=True)
class MatchConfig:
    """Settings of `python -m arena.match` (see --help)."""

    player_a: PlayerSpec = setting(hidden=True)  # positional: see build_arg_parser
    player_b: PlayerSpec = setting(hidden=True)
    games: int = setting(20, "games to play", at_least=1)
    board_size: int | None = board_size_setting(None, note="default: the model's run.json, else 9")
    komi: float | None = komi_setting(None, note=f"default: the model's run.json, else {schema.DEFAULT_KOMI:g}")
    max_moves: int = max_moves_setting()
    visits: int | None = setting(32, "MCTS simulations per move (0 = none, needs --seconds-per-move)")
    seconds_per_move: float | None = setting(None, "MCTS wall-clock limit per move")
    opening_moves: int = setting(
        4,
        "MCTS players sample their moves by visit count for the game's first this many moves, so games differ",
        at_least=0,
        at_most=100,
    )
    paired_openings: int = setting(
        0,
        "play each opening with both colours: games 2k and 2k+1 start with the "
        "same this many random moves (legal, no own-eye fills, from --seed), "
        "so a colour's advantage in an opening cancels; 0 = off",
        at_least=0,
        at_most=60,
    )
    parallel_games: int = setting(32, "games played at once (1 when GNU Go plays)", at_least=1)
    pass_when_winning: bool = pass_when_winning_setting()
    sgf_dir: str | None = setting(None, "write every game there as SGF")
    seed: int = setting(0, "seed of the players' random choices")
    json: bool = setting(False, "print the result as one JSON object")
    events: str = events_setting()

    def __post_init__(self):
        if self.visits == 0:
            object.__setattr__(self, "visits", None)  # 0 on the command line = no visit limit
        for problem in setting_problems(self):  # board size, komi, max moves, declared ranges
            raise ValueError(problem)
        SearchBudget(self.visits, self.seconds_per_move)
        MovePolicy(sampled_moves=self.opening_moves)


def build_player(spec: PlayerSpec, board_size: int, komi: float, mcts: MctsConfig, seed: int, loaded=None):
    """The player for `spec`; `loaded` is the spec's LoadedEvaluator for models."""
    if spec.kind == "random":
        return RandomPlayer(seed=seed)
    if spec.kind == "gnugo":
        return gnugo_player(spec.level)
    config = dataclasses.replace(mcts, seed=seed)
    if spec.kind == "uniform":
        from inference.evaluator import UniformEvaluator

        return MctsPlayer(UniformEvaluator(board_size), config, name="uniform")
    if spec.kind == "playouts":
        evaluator = PlayoutEvaluator(board_size, komi, playouts=spec.playouts, seed=seed)
        return MctsPlayer(evaluator, config, name=evaluator.name)
    return MctsPlayer(loaded.for_board_size(board_size), config, name=loaded.name)


CLI = RoleCli(
    MatchConfig,
    prog="python -m arena.match",
    description="Play player A against player B (alternating colours, Tromp-Taylor scoring) "
    "and report A's win rate with a 95% Wilson interval. Players: model:ROOT[@GEN], "
    "uniform, random, playouts[:K], gnugo[:LEVEL].",
    arguments=(
        (("player_a",), dict(help="player A spec, e.g. model:/data/run or model:gs://b/run@12")),
        (("player_b",), dict(help="player B spec, e.g. random, uniform, gnugo:1")),
    ),
)


def build_arg_parser() -> argparse.ArgumentParser:
    return CLI.parser()


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> MatchConfig:
    try:
        players = {"player_a": PlayerSpec.parse(args.player_a), "player_b": PlayerSpec.parse(args.player_b)}
    except ValueError as exc:
        parser.error(str(exc))
    return config_from_namespace(MatchConfig, args, parser, **players)


def run(config: MatchConfig, log: Callable[[str], None] = lambda text: None, retry=None, events=None) -> EvalResult:
    """Load the players of `config`, play the match, close the players; ``retry``
    is the storage RetryPolicy for gs:// model roots; ``events``: an EventLog
    that gets each finished game.  Model files go to a temporary cache that is
    removed when this returns or raises."""
    from inference.model_files import ModelCache

    cache = ModelCache() if any(spec.kind == "model" for spec in (config.player_a, config.player_b)) else None
    try:
        return _run(config, log, retry, cache, events)
    finally:
        if cache is not None:
            cache.close()


def _run(config: MatchConfig, log: Callable[[str], None], retry, cache, events=None) -> EvalResult:
    loaded = {}
    for spec in (config.player_a, config.player_b):
        if spec.kind == "model" and spec not in loaded:
            loaded[spec] = load_evaluator(EvaluatorSource(spec.root, spec.generation), cache_dir=cache, retry=retry)
    model_sizes = {item.board_size for item in loaded.values() if item.board_size is not None}
    model_komis = {item.komi for item in loaded.values() if item.komi is not None}
    if len(model_sizes) > 1 and config.board_size is None:
        raise ValueError(f"the two models come from runs of different board sizes {sorted(model_sizes)}")
    board_size = config.board_size or (model_sizes.pop() if model_sizes else 9)
    komi = (
        config.komi if config.komi is not None else model_komis.pop() if len(model_komis) == 1 else schema.DEFAULT_KOMI
    )
    mcts = MctsConfig(
        budget=SearchBudget(config.visits, config.seconds_per_move),
        moves=MovePolicy(sampled_moves=config.opening_moves),
        pass_when_winning=config.pass_when_winning,
    )
    players = []
    try:
        for side, spec in enumerate((config.player_a, config.player_b)):
            players.append(build_player(spec, board_size, komi, mcts, config.seed * 2 + side, loaded.get(spec)))
        if players[0].name == players[1].name:
            players[1].name += "-b"

        def on_game(game: GameResult):
            log(
                f"game {game.index}: {game.black} (B) vs {game.white} (W): {game.result_text} "
                f"after {len(game.moves)} moves ({game.end_reason})"
            )
            if events is not None:
                events.emit(
                    "game_finished",
                    index=game.index,
                    black=game.black,
                    white=game.white,
                    result=game.result_text,
                    moves=len(game.moves),
                )

        openings = (
            random_openings((config.games + 1) // 2, config.paired_openings, board_size, komi, config.seed)
            if config.paired_openings
            else ()
        )
        result = evaluate(
            players[0],
            players[1],
            config.games,
            board_size,
            komi,
            max_moves=config.max_moves,
            parallel_games=config.parallel_games,
            sgf_dir=config.sgf_dir,
            openings=openings,
            on_game=on_game,
        )
        return dataclasses.replace(result, visits=config.visits)  # the record says how it was played
    finally:
        for player in players:
            player.close()


def main(argv=None) -> int:
    from cloud.base import StorageError
    from format.events import EventLog
    from format.registry import RegistryError

    parser = build_arg_parser()
    args = parser.parse_args(argv)
    config = config_from_args(args, parser)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    events = EventLog(config.events or None, "match")
    events.emit("started", player_a=args.player_a, player_b=args.player_b, games=config.games)
    try:
        with terminated_by_sigterm():  # run()'s finally removes the model cache, closes GNU Go
            result = run(config, log, storage_retry(args, parser), events)
    except (OSError, ValueError, LookupError, RegistryError, StorageError) as exc:
        print(f"arena.match: {exc}", file=sys.stderr)
        events.emit("stopped", reason="error", error=str(exc))
        return 2
    except Terminated:
        print("arena.match: stopped by SIGTERM; no result", file=sys.stderr)
        events.emit("stopped", reason="SIGTERM")
        return EXIT_TERMINATED
    events.emit("result", result=result.to_json_dict())
    events.emit("stopped", reason="done")
    if config.json:
        print(json.dumps(result.to_json_dict(), sort_keys=True))
    else:
        print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
