"""Match results as the lake keeps them: the one owner of the loop's evaluation documents.

``arena.match`` reports a match as its ``result`` event; the loop keeps ``loop/eval-<G>.json`` (a
`MatchRecord`: generation G against uniform random moves, totals only) and ``loop/final-<G>.json``
(a `ClosingRecord`: the closing matches against random moves, generation 0's player and, when
played, GNU Go level 1 with each game's result and SGF path, which arena.ladder folds in).

Data flow: match event --`MatchRecord.from_json_dict`--> the loop --`to_bytes`--> the lake
--`from_bytes`--> the loop's summary and the ladder.  `from_json_dict` refuses anything else with
a ValueError naming the document and field, and ignores unknown fields (newer writers' extras).
"""

from __future__ import annotations

import dataclasses
import json

from format import lake_json
from format.documents import MAX_DOCUMENT_BYTES, document_value


@dataclasses.dataclass(frozen=True)
class MatchGame:
    """One game of a match, as the record keeps it (A is Black in even-numbered games)."""

    index: int
    black: str
    white: str
    result: str
    """SGF-style result text: ``B+R``, ``W+3.5``, ``0`` (a draw)."""
    score: float | None
    """The Tromp-Taylor area score from Black's side when the game was scored; None when it ended
    by resignation or forfeit."""
    end_reason: str
    moves: int
    sgf: str | None
    """Where the game's SGF is (a lake path once the loop copied it), or None."""


_GAME_FIELDS = {
    "index": int,
    "black": str,
    "white": str,
    "result": str,
    "score": (float, type(None)),
    "end_reason": str,
    "moves": int,
    "sgf": (str, type(None)),
}


@dataclasses.dataclass(frozen=True)
class MatchRecord:
    """Player A's result against player B (`arena.match.EvalResult`'s totals, plus ``visits``)."""

    player_a: str
    player_b: str
    board_size: int
    komi: float
    games: int
    wins: int
    losses: int
    draws: int
    wins_as_black: int
    wins_as_white: int
    win_rate: float
    ci_low: float
    ci_high: float
    mean_moves: float
    seconds: float
    distinct_games: int = 0
    """Games that differ from every other in colours or moves.  Deterministic players
    (two GNU Go processes, MCTS without sampled openings) can repeat a game exactly;
    a repeat is no new evidence, so a rating should count distinct games."""
    visits: int | None = None
    """The searching players' simulations a move, as the match or the loop asked for them (None: no
    visit limit, or a record that did not say)."""
    game_results: tuple[MatchGame, ...] | None = None
    """Each game, or None when the record keeps the totals only."""

    def text(self) -> str:
        """``21/40 vs gnugo-l1 (52%, 95% CI 37%-67%)``: one line for a person."""
        return (
            f"{self.wins}/{self.games} vs {self.player_b} "
            f"({self.win_rate:.0%}, 95% CI {self.ci_low:.0%}-{self.ci_high:.0%})"
        )

    def to_json_dict(self) -> dict:
        out = dataclasses.asdict(self)
        if self.game_results is None:
            del out["game_results"]
        else:
            out["game_results"] = [dataclasses.asdict(game) for game in self.game_results]
        return out

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json_dict()).encode()

    @classmethod
    def from_json_dict(cls, document, where: str) -> "MatchRecord":
        """The record in ``document`` (a match's ``result`` event, or what `to_json_dict` wrote);
        ValueError names ``where`` and the field."""
        if not isinstance(document, dict):
            raise ValueError(f"{where}: not a match result (a JSON object)")
        values = {}
        for field in dataclasses.fields(cls):
            if field.name == "game_results":
                continue
            if field.name not in document:
                if field.default is dataclasses.MISSING:
                    raise ValueError(f"{where}: the match result has no {field.name!r}")
                continue
            values[field.name] = _checked(document[field.name], field.name, where)
        games = document.get("game_results")
        if games is not None:
            if not isinstance(games, list):
                raise ValueError(f"{where}: game_results must be a list of games")
            values["game_results"] = tuple(_game(game, f"{where}: game_results[{i}]") for i, game in enumerate(games))
        record = cls(**values)
        if record.wins + record.losses + record.draws != record.games or not all(
            0 <= rate <= 1 for rate in (record.win_rate, record.ci_low, record.ci_high)
        ):
            raise ValueError(
                f"{where}: the match result's counts or rates do not add up "
                f"({record.wins}+{record.losses}+{record.draws} of {record.games}, "
                f"win rate {record.win_rate} in [{record.ci_low}, {record.ci_high}])"
            )
        return record

    @classmethod
    def from_bytes(cls, data: bytes, url: str) -> "MatchRecord":
        return cls.from_json_dict(_json(data, url), url)


_RECORD_TYPES = {
    "player_a": str,
    "player_b": str,
    "board_size": int,
    "komi": float,
    "games": int,
    "wins": int,
    "losses": int,
    "draws": int,
    "wins_as_black": int,
    "wins_as_white": int,
    "win_rate": float,
    "ci_low": float,
    "ci_high": float,
    "mean_moves": float,
    "seconds": float,
    "distinct_games": int,
    "visits": (int, type(None)),
}


def _checked(value, name: str, where: str, kind=None):
    """``value`` of the field ``name`` if it has the field's type (``kind``, else the record's), by
    the rule of every lake document (format.documents.document_value); an int is at least 0."""
    kind = _RECORD_TYPES[name] if kind is None else kind
    return document_value(value, kind, lambda problem: ValueError(f"{where}: {name} {problem}"), at_least=0)


def _game(document, where: str) -> MatchGame:
    if not isinstance(document, dict):
        raise ValueError(f"{where}: not a game (a JSON object)")
    return MatchGame(**{name: _checked(document.get(name), name, where, kind) for name, kind in _GAME_FIELDS.items()})


CLOSING_OPPONENTS = ("vs_random", "vs_generation_0", "vs_gnugo_1")
"""The closing matches' keys in ``loop/final-<G>.json``, in the order the summary shows them."""


@dataclasses.dataclass(frozen=True)
class ClosingRecord:
    """``loop/final-<G>.json``: the final generation's closing matches (vs_gnugo_1: None when the
    run played no GNU Go games)."""

    vs_random: MatchRecord
    vs_generation_0: MatchRecord
    vs_gnugo_1: MatchRecord | None = None

    def to_bytes(self) -> bytes:
        return json.dumps(
            {key: getattr(self, key).to_json_dict() for key in CLOSING_OPPONENTS if getattr(self, key) is not None}
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes, url: str) -> "ClosingRecord":
        document = _json(data, url)
        if not isinstance(document, dict):
            raise ValueError(f"{url}: not the closing matches (a JSON object)")
        missing = [key for key in CLOSING_OPPONENTS[:2] if key not in document]
        if missing:
            raise ValueError(f"{url}: the closing matches have no {missing[0]!r}")
        return cls(
            **{
                key: MatchRecord.from_json_dict(document[key], f"{url}: {key}")
                for key in CLOSING_OPPONENTS
                if document.get(key) is not None
            }
        )


def _json(data: bytes, url: str):
    try:
        return lake_json.parse(data, MAX_DOCUMENT_BYTES)
    except lake_json.NotADocument as exc:
        raise ValueError(f"{url}: {exc}") from None
