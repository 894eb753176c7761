"""The rating ladder: Elo of published generations against fixed anchors.

    python -m arena.ladder --root ROOT                      # every published generation
    python -m arena.ladder --root gs://b/run --generations 1,5,9 --games 20

Players: generation G (``gen:G``, MCTS with the run's published model G at
``--visits``) and the anchors (``--anchors``, weakest first, as
`arena.match` player specs: ``random``, ``playouts:K``, ``gnugo:L``); every
game is played by `arena.match.play_games`, there is no second game loop.

Data flows: `Ladder.schedule_and_play` plays the pairings (``--games``
games each, colours alternating) -> ``ROOT/report/ladder/results.jsonl``
(one game a line, saved after every game, with its SGF and *digest*) ->
`Ladder.fit` (`arena.elo`, over the distinct games, with the stored anchor
games and the loop's closing matches folded in) -> the report
(`arena.ladder_report`, ``ROOT/report/``).

Terms: *conditions* (`ladder_conditions`: board size, komi, visits, opening
moves, move cap) are what a game counts under; a rerun with the same ones
plays only the games still missing, one with others starts its own set.
A *digest* (`game_digest`) hashes a game's colours, moves and result: equal
digests, the same game, which counts once (`distinct_games`).  *Stored
anchor games* (`ANCHOR_GAMES_DIR`) are anchor-against-anchor games shipped
with zerolake; a *closing match* (`ClosingMatch`) is the loop's last games.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shlex
import subprocess
import sys
import time
import zlib
from typing import Any, Callable, Sequence

from arena import elo
from arena.ladder_report import closing_player_name, generation_name, parse_generation_name, write_report
from arena.match import GameResult, MatchConfig, PlayerSpec, build_player, play_games, sgf_bytes
from arena.player import MctsConfig, SearchBudget
from cloud.base import NotFound, StorageError
from cloud.storage import open_storage
from engine.move_choice import MovePolicy
from format import layout, schema
from format.cli import RoleCli, max_moves_setting, root_setting, setting, setting_problems
from format.documents import document_value
from format.match_record import ClosingRecord, MatchRecord
from format.registry import RegistryError
from format.run_config import RunConfig, ensure_run_config, read_run_config, require_run_config
from format.sgf import game_from_sgf
from inference.loading import EvaluatorSource, load_evaluator
from inference.model_files import ModelCache
from processes.sigterm import EXIT_TERMINATED, Terminated, terminated_by_sigterm

DEFAULT_ANCHOR = "gnugo:1"
"""The player rated 0 (``--anchor``).  A rating is finite only inside the anchor's mutual-win group
(`arena.elo`), so ``random``, which every trained generation beats 10-0, would leave them all
unbounded above.  When the anchor did not play or no rating against it is finite, the anchor of
``--anchors`` with the largest mutual-win group is used, and the report says so
(`arena.elo.choose_anchor`)."""
RESULTS_VERSION = 1
DEFAULT_ANCHORS = "random,playouts:8,playouts:32,playouts:128,gnugo:1,gnugo:5,gnugo:10"
COMPARISON_PRIOR_DRAWS = 2.0
"""The prior the report compares with when the fit uses none (BayesElo's default, the ladder's earlier one)."""
FIXED_ANCHOR_KINDS = ("random", "playouts", "gnugo")
ANCHOR_GAMES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "anchor_games")
"""The stored anchor games shipped with zerolake.

Anchor-against-anchor games are the same experiment in every lake, and the slow ones (GNU Go 10
against GNU Go 5) cost minutes, so they are stored here: ``<conditions>/`` (the conditions with
dashes for spaces, e.g. ``9x9-komi-7.5-visits-64-opening-4-cap-0``) holds ``results.jsonl`` in the
results format (``sgf`` relative to the folder), the SGFs (``sgf/<pairing>/<index>.sgf``) and
``made.json`` (each recording session: command, date, games added, GNU Go's version).  A ladder
loads the stored games of its own conditions between two of its ``--anchors`` and counts them with
the lake's: a pairing plays in the lake only the games the two lack together, and a game in both
counts once.  ``--no-stored-anchor-games`` plays every anchor game in the lake;
``--record-anchor-games`` plays only the anchor chain in ROOT and adds its games to the store."""
STORE_RESULTS = "results.jsonl"
STORE_MADE = "made.json"
STORE_VERSION = 1
CLOSING_MATCHES = {"vs_gnugo_1": "gnugo:1"}
"""The closing results of operations.loop's final marker that the ladder folds in: key -> the opponent."""
_MATCH_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(MatchConfig)}
"""arena.match's defaults: the loop's closing matches leave opening moves and the move cap to them."""


def _parse_int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{flag}: want comma-separated non-negative integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise ValueError(f"{flag}: want comma-separated non-negative integers, got {text!r}")
    return values


@dataclasses.dataclass(frozen=True)
class LadderConfig:
    """Settings of `python -m arena.ladder` (see --help)."""

    root: str = root_setting()
    generations: str | None = setting(None, "comma-separated generations to rate (default: every published one)")
    anchors: str = setting(DEFAULT_ANCHORS, "anchor players, weakest first: random, playouts:K, gnugo:L")
    anchor: str = setting(
        DEFAULT_ANCHOR,
        "the player rated 0 (random, playouts:K or gnugo:L); when it has no "
        "games, or nobody both beat it and lost to it (directly or through "
        "others), the anchor with the largest group of mutual wins is used, "
        "and the report says so",
    )
    games: int = setting(10, "games per pairing, colours alternating; a rerun plays only the missing ones", at_least=1)
    visits: int = setting(64, "MCTS simulations per move of the generations and the playouts anchors", at_least=1)
    opening_moves: int = setting(
        4, "MCTS players sample their first this many moves by visit count, so that games differ"
    )
    max_moves: int = max_moves_setting()
    parallel_games: int = setting(16, "games played at once when no GNU Go plays", at_least=1)
    give_up_score: float = setting(
        0.0,
        "a generation stops climbing the anchors after one against which "
        "it scored at most this fraction of the points (negative: never)",
        below=1.0,
    )
    adjacent: bool = setting(True, "consecutive rated generations also play each other")
    prior_draws: float = setting(
        0.0,
        "virtual draws added to every pairing (BayesElo's prior; 0 = a pure "
        "maximum-likelihood fit); the report also shows the ratings under the "
        "other choice",
        at_least=0,
    )
    seed: int = setting(0, "seed of the players' random choices")
    stored_anchor_games: bool = setting(
        True,
        "count the anchor-against-anchor games stored with zerolake "
        "(arena/anchor_games/) for these conditions, and play in ROOT "
        "only the anchor games they lack",
    )
    record_anchor_games: bool = setting(
        False,
        "play only the anchor chain in ROOT (a root without run.json gets "
        "the default board size and komi) and add ROOT's anchor games of "
        "these conditions that the store lacks to arena/anchor_games/",
    )
    plots: bool = setting(True, "write the PNG plots to ROOT/report/")
    json: bool = setting(False, "print the ratings as one JSON object instead of the table")

    def __post_init__(self):
        for problem in setting_problems(self):  # root, max moves, declared ranges (format.cli)
            raise ValueError(problem)
        if self.generations is not None:
            _parse_int_list(self.generations, "--generations")
        anchors = self.anchor_names()
        for name in anchors:
            try:
                spec = PlayerSpec.parse(name)
            except ValueError as exc:
                raise ValueError(f"--anchors: {exc}") from None
            if spec.kind not in FIXED_ANCHOR_KINDS:
                raise ValueError(f"--anchors: {name!r} is not a fixed anchor (random, playouts:K, gnugo:L)")
        try:
            anchor_kind = PlayerSpec.parse(self.anchor).kind
        except ValueError as exc:
            raise ValueError(f"--anchor: {exc}") from None
        if anchor_kind not in FIXED_ANCHOR_KINDS:
            raise ValueError(f"--anchor: {self.anchor!r} is not a fixed anchor (random, playouts:K, gnugo:L)")
        if len(set(anchors)) != len(anchors):
            raise ValueError(f"--anchors names a player twice: {self.anchors!r}")
        MovePolicy(sampled_moves=self.opening_moves)
        if self.record_anchor_games and self.generations is not None:
            raise ValueError("--record-anchor-games plays anchor games only: drop --generations")
        if self.record_anchor_games and not self.stored_anchor_games:
            raise ValueError("--record-anchor-games adds to the stored anchor games: drop --no-stored-anchor-games")

    def anchor_names(self) -> tuple[str, ...]:
        return tuple(part.strip() for part in self.anchors.split(",") if part.strip())

    def generation_list(self) -> tuple[int, ...] | None:
        return (
            None if self.generations is None else tuple(sorted(set(_parse_int_list(self.generations, "--generations"))))
        )


CLI = RoleCli(
    LadderConfig,
    prog="python -m arena.ladder",
    description="Rate published generations against fixed anchors (random moves, pure Monte-Carlo "
    "players, GNU Go) by one maximum-likelihood Elo fit over every distinct game played, "
    "with profile-likelihood 95% intervals; saves "
    "every game as SGF and the ratings, a table and plots under ROOT/report/. A rerun "
    "adds games instead of replaying them.",
)


# --------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LadderGame:
    """One finished ladder game, as a line of the results file.

    ``a`` and ``b`` are the pairing's players (a is Black in even-numbered
    games); ``winner`` is schema.BLACK, schema.WHITE or schema.EMPTY (a draw); ``score`` is
    the area score from Black's side, None after a resignation or a forfeit;
    ``digest`` is `game_digest` of the game, None in lines written before
    digests were kept.
    """

    pairing: str
    index: int
    a: str
    b: str
    black: str
    white: str
    winner: int
    score: float | None
    end_reason: str
    moves: int
    conditions: str
    sgf: str
    time: float
    digest: str | None = None

    @property
    def score_a(self) -> float:
        """a's points from this game: 1 win, 1/2 draw, 0 loss."""
        if self.winner == schema.EMPTY:
            return 0.5
        return 1.0 if (self.winner == schema.BLACK) == (self.black == self.a) else 0.0

    def to_json(self) -> str:
        return json.dumps({"version": RESULTS_VERSION, **dataclasses.asdict(self)}, sort_keys=True)


def pairing_name(a: str, b: str) -> str:
    """A file-safe name of the pairing a vs b (``gen:3`` vs ``gnugo:1`` -> ``gen-3_vs_gnugo-1``)."""
    return f"{a.replace(':', '-')}_vs_{b.replace(':', '-')}"


def ladder_conditions(board_size: int, komi: float, visits: int, opening_moves: int, max_moves: int) -> str:
    """The conditions a game counts under: ``9x9 komi 7.5 visits 64 opening 4 cap 0``."""
    return f"{board_size}x{board_size} komi {komi:g} visits {visits} opening {opening_moves} cap {max_moves}"


def read_results(storage, path: str | None = None) -> list[LadderGame]:
    """Every game of a results file (default the lake's; none when it does not exist); a bad line
    names the file and line."""
    path = path or layout.ladder_results()
    try:
        data = storage.read(path)
    except NotFound:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            f"{storage.url(path)}: not UTF-8 text, so not a ladder results file; fix or delete the file to start afresh"
        ) from None
    games = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            document = json.loads(line)
            if document.get("version") != RESULTS_VERSION:
                raise ValueError(f"version {document.get('version')!r}, this reader knows {RESULTS_VERSION}")
            games.append(_ladder_game(document))
        except (ValueError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"{storage.url(path)} line {number}: not a ladder game ({exc}); fix or delete the file to start afresh"
            ) from None
    return games


_LADDER_GAME_TYPES = {
    "pairing": str,
    "index": int,
    "a": str,
    "b": str,
    "black": str,
    "white": str,
    "winner": int,
    "score": (float, type(None)),
    "end_reason": str,
    "moves": int,
    "conditions": str,
    "sgf": str,
    "time": float,
    "digest": (str, type(None)),
}


def _ladder_game(document: dict) -> LadderGame:
    """One results line's game, each field of its type and in range (format.documents.document_value's rule);
    ValueError names the field."""
    values = {}
    for field in dataclasses.fields(LadderGame):
        if field.name not in document:
            if field.default is dataclasses.MISSING:
                raise ValueError(f"no {field.name!r}")
            continue
        values[field.name] = document_value(
            document[field.name],
            _LADDER_GAME_TYPES[field.name],
            lambda problem, name=field.name: ValueError(f"{name} {problem}"),
            at_least=None if field.name == "winner" else 0,
        )
    if values["winner"] not in (schema.BLACK, schema.WHITE, schema.EMPTY):
        raise ValueError(
            f"winner is {values['winner']}, not {schema.BLACK} (Black), {schema.WHITE} (White) "
            f"or {schema.EMPTY} (a draw)"
        )
    return LadderGame(**values)


def write_results(storage, games: Sequence[LadderGame], path: str | None = None) -> None:
    data = "".join(game.to_json() + "\n" for game in games).encode("utf-8")
    storage.write_replace(path or layout.ladder_results(), data)


def game_digest(black: str, white: str, moves: Sequence[int], winner: int, end_reason: str) -> str:
    """A short hash of a game's colours, moves and result: equal digests, the same game."""
    text = json.dumps([black, white, [int(m) for m in moves], int(winner), end_reason])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def distinct_games(games: Sequence[LadderGame], conditions: str) -> tuple[list[LadderGame], int]:
    """(the games of ``conditions``, each distinct game once, first played first; how many repeats
    were dropped).  Games without a digest are all kept."""
    kept, seen = [], set()
    for game in games:
        if game.conditions != conditions:
            continue
        key = (game.a, game.b, game.digest)
        if game.digest is not None and key in seen:
            continue
        seen.add(key)
        kept.append(game)
    return kept, sum(1 for g in games if g.conditions == conditions) - len(kept)


def pair_records(games: Sequence[LadderGame], conditions: str) -> list[elo.PairRecord]:
    """The distinct games of ``conditions`` (`distinct_games`) as one Bradley-Terry record each."""
    return [elo.PairRecord(g.a, g.b, 1, g.score_a) for g in distinct_games(games, conditions)[0]]


# --------------------------------------------------------------------------
# stored anchor games (ANCHOR_GAMES_DIR)
# --------------------------------------------------------------------------


def store_folder(store: str, conditions: str) -> str:
    """The folder of ``conditions``' stored games: ``<store>/9x9-komi-7.5-visits-64-opening-4-cap-0``."""
    return os.path.join(store, conditions.replace(" ", "-"))


def store_sgf(pairing: str, index: int) -> str:
    """A stored game's SGF, relative to its conditions' folder."""
    return f"sgf/{pairing}/{int(index):05d}.sgf"


def _is_fixed_anchor(name: str) -> bool:
    try:
        return PlayerSpec.parse(name).kind in FIXED_ANCHOR_KINDS
    except ValueError:  # gen:G, gen:G@V
        return False


def read_stored_games(store: str, conditions: str, anchors: Sequence[str]) -> list[LadderGame]:
    """The stored games of ``conditions`` between two of ``anchors``; none when the store has no
    folder for them.  A line of other conditions, without a digest or with a player that is not a
    fixed anchor is refused in one line naming the file."""
    storage = open_storage(store_folder(store, conditions))
    games = read_results(storage, STORE_RESULTS)
    for game in games:
        problem = (
            "is of other conditions"
            if game.conditions != conditions
            else "has no digest"
            if not game.digest
            else "is not between fixed anchors"
            if not (_is_fixed_anchor(game.a) and _is_fixed_anchor(game.b))
            else None
        )
        if problem:
            raise ValueError(
                f"{storage.url(STORE_RESULTS)}: {game.pairing} game {game.index} {problem}; "
                "a stored game must be an anchor game of its folder's conditions, with a digest"
            )
    wanted = set(anchors)
    return [game for game in games if game.a in wanted and game.b in wanted]


def gnugo_version() -> str | None:
    """GNU Go's ``--version`` first line (stored games against it depend on it); None if it has none."""
    from arena.gtp_client import find_gnugo

    lines = subprocess.run([find_gnugo(), "--version"], capture_output=True, text=True, timeout=60).stdout
    return lines.splitlines()[0].strip() if lines.strip() else None


# --------------------------------------------------------------------------
# the loop's closing match (ClosingMatch)
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ClosingMatch:
    """One closing result of ``operations.loop`` as the ladder folds it in.

    The loop ends a long run with games of its last generation G against GNU
    Go level 1 at V visits a move (``loop/final-<G>.json``,
    ``layout.loop_marker``).  The ladder fits them as their own player
    ``gen:G@V``, the same network at V visits, so one table shows the
    ladder's view (``gen:G`` at ``--visits``) and the closing match's.

    ``player`` is ``gen:G@V`` and ``opponent`` the anchor it met; ``games``
    holds one LadderGame a game when the loop kept per-game results
    (``conditions`` the match's own), else ``total`` holds them all as one
    record (every game counted as distinct).
    """

    player: str
    opponent: str
    source: str
    visits: int
    conditions: str
    games: tuple[LadderGame, ...] = ()
    total: elo.PairRecord | None = None

    def distinct(self) -> tuple[list[LadderGame], int]:
        return distinct_games(self.games, self.conditions)

    def records(self) -> list[elo.PairRecord]:
        return [self.total] if self.total is not None else pair_records(self.games, self.conditions)

    def summary(self) -> dict:
        """What the report says of it: player, source, games, distinct games, whether per game."""
        kept, repeats = self.distinct()
        games = self.total.games if self.total is not None else len(self.games)
        return {
            "player": self.player,
            "opponent": self.opponent,
            "source": self.source,
            "visits": self.visits,
            "games": games,
            "distinct": games if self.total is not None else len(kept),
            "repeats": 0 if self.total is not None else repeats,
            "per_game": self.total is None,
        }


def _closing_match(
    storage,
    generation: int,
    source: str,
    key: str,
    result: MatchRecord,
    board_size: int,
    komi: float,
    log: Callable[[str], None],
) -> ClosingMatch | None:
    """The ClosingMatch of one closing result; None (with a line to ``log``) when it was played on
    another board or komi than the lake's run.json."""
    if (result.board_size, result.komi) != (board_size, float(komi)):
        log(
            f"{storage.url(source)}: {key} was played on {result.board_size}x{result.board_size} with "
            f"komi {result.komi:g}, not this lake's; left out of the fit"
        )
        return None
    if result.visits is None:
        raise ValueError("the closing result does not say the model's visits")
    visits = result.visits
    player, opponent = closing_player_name(generation, visits), CLOSING_MATCHES[key]
    conditions = ladder_conditions(
        board_size, komi, visits, _MATCH_DEFAULTS["opening_moves"], _MATCH_DEFAULTS["max_moves"]
    )
    match = ClosingMatch(player, opponent, source, visits, conditions)
    if result.game_results is None:
        return dataclasses.replace(
            match, total=elo.PairRecord(player, opponent, result.games, result.wins + result.draws / 2)
        )
    games = []
    for entry in result.game_results:
        index = entry.index
        black, white = (player, opponent) if index % 2 == 0 else (opponent, player)  # A is Black in even games
        winner = {"B": schema.BLACK, "W": schema.WHITE}.get(entry.result[:1], schema.EMPTY)
        digest = None
        try:
            if entry.sgf is None:
                raise ValueError("the result names no SGF")
            _, _, moves, _ = game_from_sgf(storage.read(entry.sgf))
            digest = game_digest(black, white, moves, winner, entry.end_reason)
        except (NotFound, ValueError) as exc:
            log(f"  {storage.url(source)} game {index}: no digest ({exc}); counted as distinct")
        games.append(
            LadderGame(
                pairing=pairing_name(player, opponent),
                index=index,
                a=player,
                b=opponent,
                black=black,
                white=white,
                winner=winner,
                score=entry.score,
                end_reason=entry.end_reason,
                moves=entry.moves,
                conditions=conditions,
                sgf=entry.sgf or "",
                time=0.0,
                digest=digest,
            )
        )
    return dataclasses.replace(match, games=tuple(games))


def read_closing_matches(
    storage, board_size: int, komi: float, log: Callable[[str], None] = print
) -> list[ClosingMatch]:
    """Every closing result of ``loop/final-<G>.json`` in the lake that the ladder folds in, by
    generation; a result the ladder cannot read is refused in one line naming the file and field."""
    matches = []
    prefix = layout.loop_marker("final-")
    for info in sorted(storage.list(prefix), key=lambda info: info.path):
        name = info.path[len(prefix) :]
        generation = layout.parse_generation(name[: -len(".json")]) if name.endswith(".json") else None
        if generation is None:
            continue
        closing = ClosingRecord.from_bytes(storage.read(info.path), storage.url(info.path))
        for key in CLOSING_MATCHES:
            if getattr(closing, key) is None:
                continue
            try:
                match = _closing_match(
                    storage, generation, info.path, key, getattr(closing, key), board_size, komi, log
                )
            except ValueError as exc:
                raise ValueError(
                    f"{storage.url(info.path)}: {key} is not a match result the ladder reads ({exc})"
                ) from None
            if match is not None:
                matches.append(match)
    return matches


# --------------------------------------------------------------------------
# the schedule
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pairing:
    a: str
    b: str

    @property
    def name(self) -> str:
        return pairing_name(self.a, self.b)


def anchor_chain(anchors: Sequence[str]) -> list[Pairing]:
    return [Pairing(stronger, weaker) for weaker, stronger in zip(anchors, anchors[1:])]


def score_fraction(games: Sequence[LadderGame], pairing: Pairing, conditions: str) -> tuple[int, float]:
    """(games played, a's score fraction) of a pairing under ``conditions``."""
    mine = [g for g in games if g.pairing == pairing.name and g.conditions == conditions]
    return len(mine), (sum(g.score_a for g in mine) / len(mine) if mine else math.nan)


# --------------------------------------------------------------------------
# playing
# --------------------------------------------------------------------------


class Ladder:
    """Plays a config's pairings into the results file and fits the ratings.

    ``log`` receives one human line per game and per pairing.  ``games`` are
    the lake's, ``stored`` the stored anchor games of these conditions (from
    ``anchor_store``, the shipped store by default; none with
    ``--no-stored-anchor-games``), ``closing`` the loop's closing matches.
    """

    def __init__(
        self,
        config: LadderConfig,
        storage=None,
        *,
        retry=None,
        log: Callable[[str], None] = print,
        anchor_store: str = ANCHOR_GAMES_DIR,
    ):
        self.config = config
        self.storage = storage or open_storage(config.root, retry=retry)
        self.retry = retry
        self.log = log
        if config.record_anchor_games and read_run_config(self.storage) is None:
            ensure_run_config(self.storage, RunConfig())  # anchor games need no run but its board
        run = require_run_config(self.storage, creator="self-play")
        self.board_size, self.komi = run.board_size, run.komi
        self.conditions = ladder_conditions(
            self.board_size, self.komi, config.visits, config.opening_moves, config.max_moves
        )
        self.games = read_results(self.storage)
        self.anchor_store = anchor_store if config.stored_anchor_games else None
        self.stored = self._read_stored()
        self.closing = (
            [] if config.record_anchor_games else read_closing_matches(self.storage, self.board_size, self.komi, log)
        )
        self._loaded: dict[int, object] = {}
        self._model_cache: ModelCache | None = None
        """Every generation's model files, in one temporary folder made at the first load and removed by close."""
        self.generations = [] if config.record_anchor_games else self._choose_generations()

    def _read_stored(self) -> list[LadderGame]:
        if self.anchor_store is None:
            return []
        return read_stored_games(self.anchor_store, self.conditions, self.config.anchor_names())

    def all_games(self) -> list[LadderGame]:
        """The stored anchor games, then the lake's games that the store does not hold: a game the
        store took from this lake (same digest and time) counts once.  A lake game that merely
        repeats a stored one still counts towards ``--games``, as a repeat within the lake does, so
        a deterministic pairing is not replayed on every run; the fit counts it once."""
        stored = {(g.a, g.b, g.digest, g.time) for g in self.stored}
        return self.stored + [g for g in self.games if (g.a, g.b, g.digest, g.time) not in stored]

    # ---- what to rate --------------------------------------------------------
    def published_generations(self) -> list[int]:
        found = set()
        for info in self.storage.list(layout.models_prefix()):
            parts = info.path.split("/")
            generation = layout.parse_generation(parts[1]) if len(parts) == 3 else None
            if generation is not None and info.path == layout.model_manifest(generation):
                found.add(generation)
        return sorted(found)

    def _choose_generations(self) -> list[int]:
        published = self.published_generations()
        chosen = self.config.generation_list()
        if chosen is None:
            return published
        missing = sorted(set(chosen) - set(published))
        if missing:
            raise LookupError(
                f"--generations: {missing} not published under "
                f"{self.storage.url(layout.MODELS_DIR)} (published: {published or 'none'})"
            )
        return list(chosen)

    # ---- players -------------------------------------------------------------
    def _player(self, name: str, seed: int):
        cfg = self.config
        mcts = MctsConfig(budget=SearchBudget(cfg.visits), moves=MovePolicy(sampled_moves=cfg.opening_moves))
        generation = parse_generation_name(name)
        if generation is None:
            return build_player(PlayerSpec.parse(name), self.board_size, self.komi, mcts, seed)
        if generation not in self._loaded:
            if self._model_cache is None:
                self._model_cache = ModelCache()
            self._loaded[generation] = load_evaluator(
                EvaluatorSource(self.config.root, generation), cache_dir=self._model_cache, retry=self.retry
            )
        spec = PlayerSpec("model", root=self.config.root, generation=generation)
        return build_player(spec, self.board_size, self.komi, mcts, seed, self._loaded[generation])

    # ---- one pairing -----------------------------------------------------------
    def play_pairing(self, pairing: Pairing) -> int:
        """Play the games the lake and the store lack together; returns how many were played."""
        done, _ = score_fraction(self.all_games(), pairing, self.conditions)
        missing = self.config.games - done
        if missing <= 0:
            return 0
        # Distinct seeds for each batch of a pairing, so a rerun plays new games.
        seed = zlib.crc32(f"{self.config.seed}/{pairing.name}/{done}/{self.conditions}".encode())
        player_a, player_b = self._player(pairing.a, seed), self._player(pairing.b, seed + 1)
        # play_games gives its first player Black in its even-numbered games; the
        # pairing's a is Black in even-numbered games overall, so an odd number of
        # games already played swaps the two.
        first, second = (player_a, player_b) if done % 2 == 0 else (player_b, player_a)
        started = time.monotonic()
        try:
            play_games(
                first,
                second,
                missing,
                self.board_size,
                self.komi,
                max_moves=self.config.max_moves,
                parallel_games=self.config.parallel_games,
                on_game=lambda result: self._record(pairing, done, result),
            )
        finally:
            player_a.close()
            player_b.close()
        played, fraction = score_fraction(self.all_games(), pairing, self.conditions)
        self.log(
            f"{pairing.a} vs {pairing.b}: {fraction:.2f} of the points for {pairing.a} over {played} games "
            f"({missing} new, {time.monotonic() - started:.1f} s)"
        )
        return missing

    def _record(self, pairing: Pairing, done: int, result: GameResult) -> None:
        """Save one finished game: its SGF, then the results file with it added."""
        index = done + result.index
        black, white = (pairing.a, pairing.b) if index % 2 == 0 else (pairing.b, pairing.a)
        named = dataclasses.replace(result, index=index, black=black, white=white)
        path = layout.ladder_game_sgf(pairing.name, index)
        self.storage.write_replace(path, sgf_bytes(named, self.board_size, self.komi))
        self.games.append(
            LadderGame(
                pairing=pairing.name,
                index=index,
                a=pairing.a,
                b=pairing.b,
                black=black,
                white=white,
                winner=int(result.winner),
                score=result.score,
                end_reason=result.end_reason,
                moves=len(result.moves),
                conditions=self.conditions,
                sgf=path,
                time=time.time(),
                digest=game_digest(black, white, result.moves, result.winner, result.end_reason),
            )
        )
        write_results(self.storage, self.games)
        self.log(
            f"  game {index} {black} (B) vs {white} (W): {named.result_text} after {len(result.moves)} "
            f"moves ({result.end_reason})"
        )

    # ---- the whole ladder --------------------------------------------------------
    def schedule_and_play(self) -> int:
        """Play every pairing the schedule asks for; returns games played.

        The schedule: the anchor chain (each anchor against the next, so the
        anchors are rated against each other too); each generation against
        the anchors, weakest first, stopping after the first it scored at most
        ``--give-up-score`` against; with ``--adjacent``, consecutive rated
        generations."""
        anchors = self.config.anchor_names()
        played = 0
        for pairing in anchor_chain(anchors):
            played += self.play_pairing(pairing)
        for generation in self.generations:
            for anchor in anchors:
                pairing = Pairing(generation_name(generation), anchor)
                played += self.play_pairing(pairing)
                _, fraction = score_fraction(self.all_games(), pairing, self.conditions)
                if fraction <= self.config.give_up_score:
                    break
        if self.config.adjacent:
            for older, newer in zip(self.generations, self.generations[1:]):
                played += self.play_pairing(Pairing(generation_name(newer), generation_name(older)))
        return played

    def add_missing_digests(self) -> int:
        """Give each game of the current conditions recorded without a digest one from its SGF,
        and save them; returns how many.  A game whose SGF cannot be read keeps none (and counts
        as distinct)."""
        added = 0
        for i, game in enumerate(self.games):
            if game.digest is not None or game.conditions != self.conditions:
                continue
            try:
                _, _, moves, _ = game_from_sgf(self.storage.read(game.sgf))
            except (NotFound, ValueError) as exc:
                self.log(f"  {game.pairing} game {game.index}: no digest ({exc}); counted as distinct")
                continue
            self.games[i] = dataclasses.replace(
                game, digest=game_digest(game.black, game.white, moves, game.winner, game.end_reason)
            )
            added += 1
        if added:
            write_results(self.storage, self.games)
        return added

    def add_to_store(self, command: str) -> dict[str, int]:
        """Add this lake's anchor games of its conditions that the store lacks (by digest) to the
        store, with a session in its made.json (``command``, the date, GNU Go's version when it
        played); returns the games added per pairing."""
        if self.anchor_store is None:
            raise ValueError("--record-anchor-games adds to the stored anchor games: drop --no-stored-anchor-games")
        store = open_storage(store_folder(self.anchor_store, self.conditions))
        stored = read_results(store, STORE_RESULTS)
        known = {(g.a, g.b, g.digest) for g in stored}
        taken = {(g.pairing, g.index) for g in stored}
        anchors = set(self.config.anchor_names())
        added: dict[str, int] = {}
        players: set[str] = set()
        for game in self.games:
            if (
                game.conditions != self.conditions
                or not {game.a, game.b} <= anchors
                or game.digest is None
                or (game.a, game.b, game.digest) in known
            ):
                continue
            index = game.index
            while (game.pairing, index) in taken:  # a lake game played before the store: a free index
                index += 2  # of its parity, so a is still Black in even ones
            path = store_sgf(game.pairing, index)
            store.write_replace(path, self.storage.read(game.sgf))
            stored.append(dataclasses.replace(game, index=index, sgf=path))
            known.add((game.a, game.b, game.digest))
            taken.add((game.pairing, index))
            added[game.pairing] = added.get(game.pairing, 0) + 1
            players |= {game.a, game.b}
        if not added:
            return added
        write_results(store, stored, STORE_RESULTS)
        try:
            made = json.loads(store.read(STORE_MADE))
        except NotFound:
            made = {"version": STORE_VERSION, "conditions": self.conditions, "sessions": []}
        gnugo = any(PlayerSpec.parse(p).kind == "gnugo" for p in players)
        made["sessions"].append(
            {
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "command": command,
                "games_added": added,
                "games_held": len(stored),
                "seed": self.config.seed,
                "gnugo": gnugo_version() if gnugo else None,
            }
        )
        store.write_replace(STORE_MADE, (json.dumps(made, indent=1, sort_keys=True) + "\n").encode())
        self.stored = self._read_stored()
        return added

    def records(self) -> list[elo.PairRecord]:
        """The fit's games: the distinct games of the lake and the store, and the closing matches'."""
        return pair_records(self.all_games(), self.conditions) + [
            record for match in self.closing for record in match.records()
        ]

    def fit(self) -> elo.Fit:
        """The fit of the distinct games (`records`); ``anchor_reason`` says which anchor and why
        (DEFAULT_ANCHOR).  A player with no finite estimate shows as a bound, ``>= low`` or ``<= high``."""
        prior = self.config.prior_draws
        records = self.records()
        anchor, why = elo.choose_anchor(records, self.config.anchor, self.config.anchor_names(), prior_draws=prior)
        return dataclasses.replace(elo.fit_ratings(records, anchor, prior_draws=prior), anchor_reason=why)

    def comparison_fit(self, fit: elo.Fit) -> elo.Fit:
        """The same games and anchor under the other prior (none, or COMPARISON_PRIOR_DRAWS when the
        fit has none): estimates only, for the report's sensitivity column."""
        prior = COMPARISON_PRIOR_DRAWS if fit.prior_draws == 0 else 0.0
        return elo.fit_ratings(self.records(), fit.anchor, prior_draws=prior, interval="none")

    def close(self) -> None:
        self._loaded.clear()
        if self._model_cache is not None:
            self._model_cache.close()
            self._model_cache = None


def run(
    config: LadderConfig,
    *,
    retry=None,
    log: Callable[[str], None] = print,
    anchor_store: str = ANCHOR_GAMES_DIR,
    command: str = "",
) -> dict:
    """Play the ladder, fit it and write the report; returns the report document.  ``command``: the
    command line a recording session (--record-anchor-games) notes in the store."""
    ladder = Ladder(config, retry=retry, log=log, anchor_store=anchor_store)
    store = None if ladder.anchor_store is None else store_folder(ladder.anchor_store, ladder.conditions)
    try:
        log(
            f"ladder on {ladder.storage.url('')}: generations {ladder.generations or 'none'}; "
            f"anchors {', '.join(config.anchor_names())}; {config.games} games per pairing; "
            f"conditions: {ladder.conditions}; "
            + (f"{len(ladder.stored)} stored anchor games from {store}" if store else "no stored anchor games")
        )
        for match in ladder.closing:
            log(f"closing match {ladder.storage.url(match.source)}: {match.player} vs {match.opponent}")
        played = ladder.schedule_and_play()
        ladder.add_missing_digests()
        if config.record_anchor_games:
            added = ladder.add_to_store(command or "arena.ladder.run")
            log(f"added to {store}: {added or 'nothing (it holds every anchor game of this lake)'}")
        fit = ladder.fit()
        comparison = ladder.comparison_fit(fit)
    finally:
        ladder.close()
    distinct, duplicates = distinct_games(ladder.all_games(), ladder.conditions)
    stored_ids = {id(game) for game in ladder.stored}
    closing = [match.summary() for match in ladder.closing]
    return write_report(
        ladder.storage,
        fit,
        ladder.games,
        ladder.conditions,
        ladder.generations,
        plots=config.plots,
        played=played,
        comparison=comparison,
        distinct=len(distinct) + sum(c["distinct"] for c in closing),
        duplicates=duplicates + sum(c["repeats"] for c in closing),
        stored=None
        if store is None
        else {
            "folder": store,
            "held": len(ladder.stored),
            "in_fit": sum(1 for game in distinct if id(game) in stored_ids),
        },
        closing=closing,
    )


def main(argv=None) -> int:
    config, retry = CLI.parse(argv)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    command = shlex.join(["python", "-m", "arena.ladder", *(sys.argv[1:] if argv is None else argv)])
    try:
        with terminated_by_sigterm():  # run()'s finally removes the model cache, closes GNU Go
            report = run(config, retry=retry, log=log, command=command)
    except (OSError, ValueError, LookupError, RegistryError, StorageError) as exc:
        print(f"arena.ladder: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print("arena.ladder: stopped by SIGTERM; every game played so far is kept (rerun to go on)", file=sys.stderr)
        return EXIT_TERMINATED
    print(json.dumps(report, sort_keys=True) if config.json else report["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
