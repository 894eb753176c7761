"""``python -m arena.analysis``: a published network behind KataGo's JSON analysis protocol (KaTrain).

    python -m arena.analysis --root ROOT [--generation G] [--visits 200]
    python -m arena.analysis --model ROOT/models/<generation>

One JSON query a line on stdin, one JSON response a line on stdout, as KataGo's ``katago analysis``
(its docs/Analysis_Engine.md): KaTrain, pointed at this command as its engine, reviews games with a
zerolake network.  Data flows: a reader thread queues input lines; `Server` takes them in order.
An action (``query_version``, ``clear_cache``, ``terminate``, ``terminate_all``) is answered at once.
An analysis query is checked field by field (`parse_query`: an error names the field in KataGo's
words and the query is dropped; a setting zerolake lacks is a warning, and the query goes on), its
moves are replayed (`positions`) and each turn it asks for becomes a task, taken by priority, then
in order.  A task is searched (`arena.player.MctsPlayer.analysis_steps`, the GTP engine's search, to
``maxVisits``), the published model's heads are read on the position and after each searched move
(`NetworkHeads`), and `turn_response` writes the line.  Input is polled between search batches, so
a terminate stops the search in flight (its response holds what was searched; ``noResults`` when
nothing was) and drops queued turns.  At the end of input the queued work is finished, then exit 0.

What a response holds (every value from ``reportAnalysisWinratesAs``'s side, Black unless
``--report-as`` or the query's ``overrideSettings`` say otherwise): per searched move ``move``,
``visits``, ``winrate`` ((Q+1)/2 of its mean value Q), ``utility`` (Q), ``lcb`` and ``utilityLcb``
(`arena.gtp_analysis.winrate_lcb`), ``scoreLead`` (= ``scoreMean`` = ``scoreSelfplay``: the score
head after the move, the rules' count where the game ends there), ``prior``, ``order`` (0 = the
search's choice), ``pv`` (``pvVisits``, ``ownership`` when asked); ``rootInfo`` the same for the
position; ``ownership`` (the ownership head, row-major from the top left) and ``policy`` (N*N+1
probabilities, -1 where illegal, pass last) when asked.  Rules are the engine's (area scoring,
positional superko, suicide illegal): other rules are a warning, as KataGo warns for rules its net
lacks.  ``avoidMoves``/``allowMoves`` restrict the root's moves (a warning when ``untilDepth`` asks
for more).  There is no ``scoreStdev``: the network has no head for it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
import json
import math
import queue
import sys
import threading
import time
from typing import Callable

import numpy as np

from arena.gtp_analysis import (
    PV_MAX_MOVES,
    AnalysisRequest,
    MoveRestriction,
    max_analysis_visits,
    root_move_stats,
    root_moves,
    winrate_lcb,
)
from arena.gtp_game import board_for, new_board
from engine.board import Board, IllegalMove
from format import lake_json, schema
from format.cli import RoleCli, root_setting, setting, setting_problems
from format.coords import gtp_to_move, move_to_gtp
from format.planes import input_planes_of

VERSION = "1.16.0"
"""What ``query_version`` answers: the KataGo release whose analysis protocol this speaks, as clients
compare it to decide which fields they may send."""
MAX_LINE_BYTES = 4 * 1024 * 1024
"""Longest query line read (a 19x19 game of 400 moves is some 10 KB); a longer one is an error."""
RULES = frozenset(
    {"tromp-taylor", "chinese", "chinese-ogs", "chinese-kgs", "japanese", "korean", "stone-scoring", "aga",
     "bga", "new-zealand", "aga-button"}
)  # fmt: skip
"""The rule shorthands KataGo parses; each is taken with a warning unless the engine's own."""
ENGINE_RULES = "chinese"
"""KataGo's name for the engine's rules (area scoring, suicide illegal; the engine's ko rule is
positional superko, which only differs from it in rare cycles)."""
PERSPECTIVES = {"BLACK": schema.BLACK, "WHITE": schema.WHITE, "SIDETOMOVE": 0}
SETTINGS = frozenset({"reportAnalysisWinratesAs", "maxTime", "maxVisits"})
"""``overrideSettings`` keys that change something here; any other is a warning, as KataGo's unknown ones."""
_PLAYERS = {"b": schema.BLACK, "black": schema.BLACK, "w": schema.WHITE, "white": schema.WHITE}
_PAIRS = 'Must be an array of pairs of the form: ["b" or "w", GTP board vertex]'


class QueryError(Exception):
    """A query field KataGo would refuse: ``field`` and the message in its words."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclasses.dataclass
class Query:
    """One analysis query as `parse_query` checked it (KataGo's field names in the comments)."""

    id: str
    size: int  # boardXSize = boardYSize
    komi: float
    moves: list  # [(colour, flat action)]                     moves
    stones: np.ndarray  # int8 [N*N]                            initialStones
    initial_player: int  # initialPlayer (0: as KataGo guesses it)
    turns: list  # analyzeTurns
    priorities: list  # per turn (priority, priorities)
    visits: int  # maxVisits
    max_time: float | None  # overrideSettings.maxTime
    perspective: int  # reportAnalysisWinratesAs: BLACK, WHITE, 0 = side to move
    pv_length: int  # analysisPVLen
    ownership: bool  # includeOwnership
    moves_ownership: bool  # includeMovesOwnership
    policy: bool  # includePolicy
    pv_visits: bool  # includePVVisits
    report_every: float | None  # reportDuringSearchEvery
    first_report: float | None  # firstReportDuringSearchAfter
    avoid: tuple = ()  # avoidMoves, as MoveRestrictions
    allow: tuple = ()  # allowMoves
    warnings: list = dataclasses.field(default_factory=list)  # (field, message)


def _integer(query: dict, field: str, least: int, most: int, message: str) -> int:
    value = query[field]
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise QueryError(field, message)
    return value


def _number(query: dict, field: str, least: float, most: float, message: str) -> float:
    value = query[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise QueryError(field, message)
    if not least <= value <= most:
        raise QueryError(field, message)
    return float(value)


def _boolean(query: dict, field: str) -> bool:
    if not isinstance(query.get(field, False), bool):
        raise QueryError(field, "Must be a boolean")
    return bool(query.get(field, False))


def _player(value, field: str, message: str) -> int:
    if not isinstance(value, str) or value.lower() not in _PLAYERS:
        raise QueryError(field, message)
    return _PLAYERS[value.lower()]


def _vertex(text, field: str, size: int, allow_pass: bool) -> int:
    try:
        move = gtp_to_move(text, size)
    except ValueError:
        raise QueryError(field, f"Could not parse board location: {text}") from None
    if move == size * size and not allow_pass:
        raise QueryError(field, f"Could not parse board location: {text}")
    return move


def _pairs(query: dict, field: str, size: int, allow_pass: bool) -> list:
    items = query[field]
    if not isinstance(items, list):
        raise QueryError(field, _PAIRS)
    pairs = []
    for item in items:
        if not isinstance(item, list) or len(item) != 2 or not all(isinstance(x, str) for x in item):
            raise QueryError(field, _PAIRS)
        colour = _player(item[0], field, f"Could not parse player: {item[0]}")
        pairs.append((colour, _vertex(item[1], field, size, allow_pass)))
    return pairs


def _restrictions(query: dict, size: int, warnings: list) -> tuple[tuple, tuple]:
    """avoidMoves / allowMoves as the GTP engine's root restrictions."""
    has_allow, has_avoid = "allowMoves" in query, "avoidMoves" in query
    if not (has_allow or has_avoid):
        return (), ()
    if has_allow and has_avoid:
        raise QueryError("allowMoves", "Cannot specify both allowMoves and avoidMoves")
    field = "allowMoves" if has_allow else "avoidMoves"
    shape = "Must be a list of dicts with subfields 'player', 'moves', 'untilDepth'"
    entries = query[field]
    if not isinstance(entries, list):
        raise QueryError(field, shape)
    if has_allow and len(entries) > 1:
        raise QueryError(field, "Currently allowMoves only allows one entry")
    found = []
    for entry in entries:
        if not isinstance(entry, dict) or not {"player", "moves", "untilDepth"} <= entry.keys():
            raise QueryError(field, shape)
        colour = _player(entry["player"], field, 'Must be "b" or "w"')
        if not isinstance(entry["moves"], list):
            raise QueryError(field, "Must be an array of GTP board vertices")
        moves = frozenset(_vertex(m, field, size, True) for m in entry["moves"])
        depth = _integer(entry, "untilDepth", 1, 1_000_000_000, "Must be a positive integer")
        if depth > 1:
            warnings.append((field, f"untilDepth {depth}: zerolake restricts the root's moves only (depth 1)"))
        found.append(MoveRestriction(colour, moves, depth))
    return (tuple(found), ()) if has_avoid else ((), tuple(found))


def parse_query(query: dict, board_size: int, komi: float, visits: int, perspective: int) -> Query:
    """The analysis query `query` (a JSON object with a string id), checked in KataGo's order; raises
    QueryError naming the first bad field.  ``board_size``/``komi``: the network's; ``visits`` and
    ``perspective``: this server's defaults."""
    warnings: list = []
    size_error = f"Must provide an integer from 2 to {schema.MAX_BOARD_SIZE}"
    for field in ("boardXSize", "boardYSize"):
        if field not in query:
            raise QueryError(field, size_error)
        _integer(query, field, 2, schema.MAX_BOARD_SIZE, size_error)
    for field in ("boardXSize", "boardYSize"):
        if query[field] != board_size:
            raise QueryError(field, f"Must be {board_size}: the network plays {board_size}x{board_size}")
    size = board_size
    stones = np.zeros(size * size, np.int8)
    if "initialStones" in query:
        for colour, point in _pairs(query, "initialStones", size, False):
            stones[point] = colour
    if "moves" not in query:
        raise QueryError("moves", "Must specify an array of [player,location] pairs")
    moves = _pairs(query, "moves", size, True)
    initial = 0
    if "initialPlayer" in query:
        initial = _player(query["initialPlayer"], "initialPlayer", 'Must be "b" or "w"')
    turns = [len(moves)]
    if "analyzeTurns" in query:
        asked = query["analyzeTurns"]
        if not isinstance(asked, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in asked):
            raise QueryError("analyzeTurns", "Must specify an array of integers indicating turns to analyze")
        for turn in asked:
            if not 0 <= turn <= len(moves):
                raise QueryError("analyzeTurns", f"Invalid turn number: {turn}")
        turns = sorted(set(asked))
    priority = {turn: 0 for turn in turns}
    if "priorities" in query:
        given = query["priorities"]
        if not isinstance(given, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in given):
            raise QueryError("priorities", "Must specify an array of integers indicating priorities")
        if "analyzeTurns" not in query:
            raise QueryError("priorities", "Can only specify when also specifying analyzeTurns")
        if len(given) != len(query["analyzeTurns"]):
            raise QueryError("priorities", "Must be of matching length to analyzeTurns")
        priority = dict(zip(query["analyzeTurns"], given))
    rules = query.get("rules")
    if rules is None:
        raise QueryError(
            "rules",
            'Must specify rules string, such as "chinese" or "tromp-taylor", or a JSON object with detailed '
            "rules parameters.",
        )
    if isinstance(rules, str) and rules.lower() not in RULES:
        raise QueryError("rules", f"Could not parse rules: {rules}")
    if not isinstance(rules, (str, dict)):
        raise QueryError("rules", 'Must specify rules string, such as "chinese" or "tromp-taylor"')
    if not (isinstance(rules, str) and rules.lower() == ENGINE_RULES):
        shown = rules if isinstance(rules, str) else json.dumps(rules, separators=(",", ":"))
        warnings.append(
            ("rules", f"Rules {shown} not supported by zerolake, using {ENGINE_RULES} (area scoring) instead")
        )
    if "komi" in query:
        message = "Must be a integer or half-integer from -150.0 to 150.0"
        komi = _number(query, "komi", -150.0, 150.0, message)
        if komi * 2 != int(komi * 2):
            raise QueryError("rules", message)
    if "whiteHandicapBonus" in query:
        warnings.append(("whiteHandicapBonus", "not supported: the komi is used as given"))
    max_time = None
    if "overrideSettings" in query:
        settings = query["overrideSettings"]
        if not isinstance(settings, dict):
            raise QueryError("overrideSettings", "Must be an object")
        unknown = sorted(set(settings) - SETTINGS)
        if unknown:
            warnings.append(("overrideSettings", "Unknown config params: " + ",".join(unknown)))
        if "reportAnalysisWinratesAs" in settings:
            side = str(settings["reportAnalysisWinratesAs"]).upper()
            if side not in PERSPECTIVES:
                raise QueryError(
                    "overrideSettings",
                    "Could not set settings: reportAnalysisWinratesAs must be BLACK, WHITE or SIDETOMOVE",
                )
            perspective = PERSPECTIVES[side]
        if "maxTime" in settings:
            max_time = _number(settings, "maxTime", 0.0, 1e20, "Could not set settings: maxTime must be a number")
        if "maxVisits" in settings:
            visits = _integer(settings, "maxVisits", 1, 1 << 50, "Could not set settings: maxVisits")
    if "maxVisits" in query:
        visits = _integer(query, "maxVisits", 1, 1 << 50, "Must be an integer from 1 to 2^50")
    pv_length = PV_MAX_MOVES
    if "analysisPVLen" in query:
        pv_length = _integer(query, "analysisPVLen", 1, 1000, "Must be an integer from 1 to 1000")
    for field, least, most, message in (
        ("rootFpuReductionMax", 0.0, 2.0, "Must be a number from 0.0 to 2.0"),
        ("rootPolicyTemperature", 0.01, 100.0, "Must be a number from 0.01 to 100.0"),
    ):
        if field in query:
            _number(query, field, least, most, message)
            warnings.append((field, "not supported: the search's own settings are used"))
    flags = {field: _boolean(query, field) for field in (
        "includeMovesOwnership", "includeMovesOwnershipStdev", "includeOwnership", "includeOwnershipStdev",
        "includePolicy", "includePVVisits")}  # fmt: skip
    for field in ("includeOwnershipStdev", "includeMovesOwnershipStdev"):
        if flags[field]:
            warnings.append((field, "not supported: the network has no ownership deviation"))
    every = first = None
    seconds = "Must be number of seconds from 0.001 to 1000000.0"
    if "reportDuringSearchEvery" in query:
        every = first = _number(query, "reportDuringSearchEvery", 0.001, 1e6, seconds)
    if "firstReportDuringSearchAfter" in query:
        first = _number(query, "firstReportDuringSearchAfter", 0.001, 1e6, seconds)
    if "priority" in query:
        if "priorities" in query:
            raise QueryError("priority", "Cannot specify both priority and priorities")
        value = _integer(query, "priority", -(2**62), 2**62, "Must be a number between -2^62 and 2^62")
        priority = {turn: value for turn in turns}
    avoid, allow = _restrictions(query, size, warnings)
    return Query(
        id=query["id"], size=size, komi=komi, moves=moves, stones=stones, initial_player=initial, turns=turns,
        priorities=[priority[t] for t in turns], visits=min(visits, max_analysis_visits(size)), max_time=max_time,
        perspective=perspective, pv_length=pv_length, ownership=flags["includeOwnership"],
        moves_ownership=flags["includeMovesOwnership"], policy=flags["includePolicy"],
        pv_visits=flags["includePVVisits"], report_every=every, first_report=first, avoid=avoid, allow=allow,
        warnings=warnings,
    )  # fmt: skip


def positions(query: Query) -> dict[int, Board]:
    """Turn -> the board after that many of the query's moves (turn 0: the initial stones).

    The engine's board alternates colours: a move by the player not to move re-enters the stones as
    a fresh position with that player to move (ko history before it is lost), as KataGo clears its
    history there.  Raises QueryError("moves", "Illegal move T: V") at the first illegal move."""
    size = query.size
    first = query.initial_player
    if not first:
        first = query.moves[0][0] if query.moves else (schema.WHITE if query.stones.any() else schema.BLACK)
    board = new_board(size, query.komi)
    board.set_position(query.stones.reshape(size, size), first)
    wanted, found = set(query.turns), {}
    for turn, (colour, move) in enumerate(query.moves):
        if turn in wanted:
            found[turn] = _searchable(board)
        if board.to_play != colour or board.is_over:
            fresh = new_board(size, query.komi)
            fresh.set_position(board.stones().reshape(size, size), colour)
            board = fresh
        try:
            board.play(move)
        except (IllegalMove, ValueError):
            raise QueryError("moves", f"Illegal move {turn}: {move_to_gtp(move, size)}") from None
    if len(query.moves) in wanted:
        found[len(query.moves)] = _searchable(board)
    return found


def _searchable(board: Board) -> Board:
    """A copy of ``board`` the search takes: a finished game (two passes) as a fresh position with the
    same player to move, since KataGo analyses a position whatever its history."""
    return board_for(board, board.to_play) if board.is_over else board.copy()


class NetworkHeads:
    """A published model's heads on boards, each for its player to move: ``policy_logits`` [B, N*N+1],
    ``ownership`` [B, N*N] in [-1, 1] and ``score`` [B] (area points, komi included).  `model` is an
    `inference.model_files.LoadedModel`."""

    def __init__(self, model):
        self.model = model
        self.channels = input_planes_of(model)

    def __call__(self, boards: list[Board]) -> dict[str, np.ndarray]:
        planes = np.stack([board.features(self.channels) for board in boards])
        out = self.model(planes)
        return {name: np.asarray(out[name], np.float64) for name in ("policy_logits", "ownership", "score")}


def policy_values(logits: np.ndarray, board: Board) -> list[float]:
    """Softmax of the logits over the legal moves; -1 where the move is illegal (pass last)."""
    legal = board.legal_mask().astype(bool)
    shifted = np.where(legal, logits - logits[legal].max(), -np.inf)
    probs = np.exp(shifted)
    probs /= probs.sum()
    return [round(float(p), 6) if ok else -1.0 for p, ok in zip(probs, legal)]


def position_hashes(board: Board) -> tuple[str, str]:
    """(thisHash, symHash): the position and the player to move, and the same up to the board's 8
    symmetries (the smallest digest of the 8 transformed positions)."""
    stones = np.asarray(board.stones(), np.int8).reshape(board.size, board.size)
    mover = bytes([board.to_play & 0xFF])
    variants = [np.rot90(s, k) for s in (stones, stones.T) for k in range(4)]
    digests = [hashlib.sha256(mover + np.ascontiguousarray(v).tobytes()).hexdigest()[:32].upper() for v in variants]
    return digests[0], min(digests)


@dataclasses.dataclass(order=True)
class Task:
    """One turn of one query, in the queue: highest priority first, then oldest."""

    key: tuple
    query: Query = dataclasses.field(compare=False)
    turn: int = dataclasses.field(compare=False)
    board: Board = dataclasses.field(compare=False)
    terminated: bool = dataclasses.field(default=False, compare=False)


class Server:
    """The protocol's loop (module docstring): `run` reads `lines` (a queue of str, None at the end)
    and writes one JSON object a line through `write`.  ``player``: an `arena.player.MctsPlayer` for
    the network's board; ``heads``: its `NetworkHeads`."""

    def __init__(self, player, heads: NetworkHeads, board_size: int, komi: float, visits: int, perspective: int,
                 lines: queue.Queue, write: Callable[[dict], None]):  # fmt: skip
        self.player, self.heads = player, heads
        self.board_size, self.komi, self.visits, self.perspective = board_size, komi, visits, perspective
        self.lines, self.write = lines, write
        self.pending: list[Task] = []
        self.current: Task | None = None
        self.counter = itertools.count()
        self.ended = False

    # ---- input --------------------------------------------------------------------
    def run(self) -> None:
        while True:
            self.take_input(block=not self.pending and not self.ended)
            if not self.pending:
                if self.ended:
                    return
                continue
            self.current = heapq.heappop(self.pending)
            try:
                self.analyze(self.current)
            finally:
                self.current = None

    def take_input(self, block: bool = False) -> None:
        """Handle the queued lines; with ``block``, wait for one first."""
        while not self.ended:
            try:
                line = self.lines.get(block=block)
            except queue.Empty:
                return
            block = False
            if line is None:
                self.ended = True
                return
            self.handle(line)

    def error(self, message: str, query_id: str | None = None, field: str | None = None) -> None:
        self.write({"error": message} if query_id is None else {"error": message, "field": field, "id": query_id})

    def handle(self, line: str) -> None:
        line = line.strip()
        if not line:
            return
        try:
            query = lake_json.parse(line, MAX_LINE_BYTES)  # bounded: length and nesting
        except lake_json.NotADocument as exc:
            self.error(f"{exc} - could not parse input line as json request: {line[:200]}")
            return
        if not isinstance(query, dict):
            self.error("Request line was valid json but was not an object, ignoring: " + json.dumps(query)[:200])
            return
        if not isinstance(query.get("id"), str):
            self.error('Request must have a string "id" field')
            return
        if isinstance(query.get("action"), str):
            self.action(query)
            return
        try:
            parsed = parse_query(query, self.board_size, self.komi, self.visits, self.perspective)
            boards = positions(parsed)
        except QueryError as exc:
            self.error(str(exc), query["id"], exc.field)
            return
        for field, message in parsed.warnings:
            self.write({"warning": message, "field": field, "id": parsed.id})
        for turn, priority in zip(parsed.turns, parsed.priorities):
            heapq.heappush(self.pending, Task((-priority, next(self.counter)), parsed, turn, boards[turn]))

    def action(self, query: dict) -> None:
        name = query["action"]
        if name == "query_version":
            self.write({**query, "version": VERSION, "git_hash": "<omitted>"})
        elif name == "clear_cache":
            self.write(query)  # the search keeps no cache between positions beyond its tree
        elif name in ("terminate", "terminate_all"):
            target = query.get("terminateId")
            if name == "terminate" and not isinstance(target, str):
                self.error('Requests for a terminate action must have a string "terminateId" field',
                           query["id"], "terminateId")  # fmt: skip
                return
            turns = query.get("turnNumbers")
            if turns is not None and not (isinstance(turns, list) and all(isinstance(t, int) for t in turns)):
                self.error("If provided, must be an array of integers indicating turns to terminate",
                           query["id"], "turnNumbers")  # fmt: skip
                return

            def chosen(task: Task) -> bool:
                return (name == "terminate_all" or task.query.id == target) and (turns is None or task.turn in turns)

            for task in [t for t in self.pending if chosen(t)]:
                self.write({"id": task.query.id, "isDuringSearch": False, "noResults": True, "turnNumber": task.turn})
            self.pending = [t for t in self.pending if not chosen(t)]
            heapq.heapify(self.pending)
            if self.current is not None and chosen(self.current):
                self.current.terminated = True
            self.write(query)
        else:
            self.error("'action' field must be 'query_version', 'clear_cache', 'terminate' or 'terminate_all'")

    # ---- one turn ----------------------------------------------------------------
    def analyze(self, task: Task) -> None:
        """Search the task's position and write its response (and the partial ones it asked for)."""
        query, board = task.query, task.board
        restricted = None
        if (query.avoid or query.allow) and not board.is_over:
            request = AnalysisRequest(kata=True, avoid=query.avoid, allow=query.allow)
            candidates = board.candidate_mask(True, self.player.config.pass_when_winning)
            restricted = root_moves(request, board.to_play, candidates)
        started = time.monotonic()
        next_report = None if query.first_report is None else started + query.first_report
        root = self.heads([board])
        tree = None
        for tree in self.player.analysis_steps(board, query.visits, root_moves=restricted):
            self.take_input()
            if task.terminated:
                break
            now = time.monotonic()
            if query.max_time is not None and now - started >= query.max_time:
                break
            if next_report is not None and now >= next_report:
                self.write(self.response(task, tree, root, during=True))
                next_report = now + (query.report_every or math.inf)
        if tree is None or int(tree.root_visits) == 0:
            self.write({"id": query.id, "isDuringSearch": False, "noResults": True, "turnNumber": task.turn})
            return
        self.write(self.response(task, tree, root, during=False))

    def response(self, task: Task, tree, root: dict, during: bool) -> dict:
        return turn_response(task.query, task.turn, task.board, tree, root, self.heads, during)


def turn_response(query: Query, turn: int, board: Board, tree, root: dict, heads: NetworkHeads,
                  during: bool) -> dict:  # fmt: skip
    """The response for one searched turn (module docstring): ``root`` is `NetworkHeads` on ``board``."""
    size, mover = board.size, board.to_play
    sign = 1.0 if query.perspective in (0, mover) else -1.0  # the reported side's values from the mover's

    def side(winrate: float) -> float:
        return winrate if sign > 0 else 1.0 - winrate

    infos = root_move_stats(tree, None, query.pv_length)
    afters = []
    for stats in infos:
        after = board.copy()
        after.play(stats.move)
        afters.append(after)
    playing = [after for after in afters if not after.is_over]
    after_heads = heads(playing) if playing else {}
    index = iter(range(len(playing)))
    move_infos = []
    for order, (stats, after) in enumerate(zip(infos, afters)):
        if after.is_over:  # the rules' count: ownership() is Black's, mover_score() the opponent's
            lead, owned = -float(after.mover_score()), [float(o) * mover for o in after.ownership()]
        else:
            k = next(index)
            # The heads are for the player to move after the move, the opponent: negated, the mover's.
            lead, owned = -float(after_heads["score"][k]), [-float(v) for v in after_heads["ownership"][k]]
        winrate = min(max((stats.value + 1.0) / 2.0, 0.0), 1.0)
        lcb = winrate_lcb(winrate, stats.visits)
        info = {
            "move": move_to_gtp(stats.move, size), "visits": stats.visits, "utility": round(sign * stats.value, 6),
            "winrate": round(side(winrate), 6), "scoreMean": round(sign * lead, 6),
            "scoreLead": round(sign * lead, 6), "scoreSelfplay": round(sign * lead, 6),
            "prior": round(min(max(stats.prior, 0.0), 1.0), 6), "lcb": round(side(lcb), 6),
            "utilityLcb": round(sign * (2.0 * lcb - 1.0), 6), "order": order,
            "pv": [move_to_gtp(m, size) for m in stats.pv],
        }  # fmt: skip
        if query.pv_visits:
            info["pvVisits"] = stats.pv_visits
        if query.moves_ownership:
            info["ownership"] = [round(sign * v, 6) for v in owned]
        move_infos.append(info)
    value = float(tree.root_value)
    winrate = min(max((value + 1.0) / 2.0, 0.0), 1.0)
    lead = float(root["score"][0])
    this_hash, sym_hash = position_hashes(board)
    root_info = {
        "winrate": round(side(winrate), 6), "scoreLead": round(sign * lead, 6),
        "scoreSelfplay": round(sign * lead, 6), "utility": round(sign * value, 6),
        "visits": int(tree.root_visits), "thisHash": this_hash, "symHash": sym_hash,
        "currentPlayer": "B" if mover == schema.BLACK else "W",
    }  # fmt: skip
    out = {"id": query.id, "isDuringSearch": during, "moveInfos": move_infos, "rootInfo": root_info,
           "turnNumber": turn}  # fmt: skip
    if query.ownership:
        out["ownership"] = [round(sign * float(v), 6) for v in root["ownership"][0]]
    if query.policy:
        out["policy"] = policy_values(root["policy_logits"][0], board)
    return out


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AnalysisConfig:
    """Settings of `python -m arena.analysis` (see --help)."""

    root: str | None = root_setting(
        None, required=False, note="analyses with the run's latest published model, or --generation"
    )
    model: str | None = setting(None, "folder of one published model (ROOT/models/<generation>)")
    generation: int | None = setting(None, "with --root: this generation instead of the latest")
    visits: int = setting(200, "maxVisits of a query that gives none", at_least=1)
    report_as: str = setting(
        "black", "whose side the values are from, unless a query's overrideSettings.reportAnalysisWinratesAs says "
        "(KataGo's reportAnalysisWinratesAs; KaTrain asks for black)", choices=("black", "white", "sidetomove"),
    )  # fmt: skip
    seed: int = setting(0, "seed of the search's random draws")

    def __post_init__(self):
        from inference.loading import EvaluatorSource

        if bool(self.root) == bool(self.model):
            raise ValueError("give --root or --model: the analysis needs a published network")
        if self.generation is not None and not self.root:
            raise ValueError("--generation needs --root")
        if self.model:
            EvaluatorSource.from_model_dir(self.model)
        for problem in setting_problems(self):
            raise ValueError(problem)


CLI = RoleCli(
    AnalysisConfig,
    prog="python -m arena.analysis",
    description="A published network behind KataGo's JSON analysis protocol (one query a line on stdin, one "
    "response a line on stdout): KaTrain's engine.",
)


def build_server(config: AnalysisConfig, lines: queue.Queue, write, retry=None) -> Server:
    """Load the network once: the search's evaluator and the model's heads."""
    from arena.player import MctsConfig, MctsPlayer, SearchBudget
    from cloud.storage import open_storage
    from inference.loading import EvaluatorSource, load_evaluator
    from inference.model_files import load_model

    source = (EvaluatorSource.from_model_dir(config.model) if config.model
              else EvaluatorSource(model_root=config.root, generation=config.generation))  # fmt: skip
    loaded = load_evaluator(source, retry=retry)
    if loaded.board_size is None or source.model_root is None:
        raise ValueError("no published model found")
    player = MctsPlayer(
        loaded.for_board_size(loaded.board_size),
        MctsConfig(budget=SearchBudget(config.visits, None), seed=config.seed),
        name=loaded.name,
    )
    heads = NetworkHeads(load_model(open_storage(source.model_root, retry=retry), loaded.generation))
    komi = schema.DEFAULT_KOMI if loaded.komi is None else loaded.komi
    return Server(player, heads, loaded.board_size, komi, config.visits, PERSPECTIVES[config.report_as.upper()],
                  lines, write)  # fmt: skip


def start_reader(stdin) -> queue.Queue:
    """A thread that queues each input line (text) and None at the end of input."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for raw in iter(lambda: stdin.readline(MAX_LINE_BYTES + 1), b""):
            lines.put(raw.decode("utf-8", errors="replace"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def main(argv=None) -> int:
    from arena.gtp import quiet_libraries
    from processes.sigterm import EXIT_TERMINATED, Terminated, sigterm_when_orphaned, terminated_by_sigterm

    config, retry = CLI.parse(argv)
    quiet_libraries()
    lock = threading.Lock()

    def write(obj: dict) -> None:
        with lock:
            sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
            sys.stdout.flush()

    stdin = open(sys.stdin.fileno(), "rb", closefd=False)
    try:
        with terminated_by_sigterm():
            sigterm_when_orphaned()  # KaTrain stops a custom engine by signalling the shell it started it with
            try:
                server = build_server(config, start_reader(stdin), write, retry)
            except (OSError, ValueError, LookupError) as exc:
                print(f"arena.analysis: cannot load the model: {exc}", file=sys.stderr)
                return 2
            server.run()
    except Terminated:
        print("arena.analysis: stopped by SIGTERM", file=sys.stderr)
        return EXIT_TERMINATED
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
