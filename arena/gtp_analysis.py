"""Live analysis over GTP (Sabaki, Lizzie): the requests and ``info`` report lines of ``lz-analyze``,
``kata-analyze`` and their ``*-genmove_analyze`` forms (Leela Zero's and KataGo's extensions).

Data flows: `parse_request` reads a command's ``[COLOR] [INTERVAL] [KEY VALUE]...``
(``avoid``/``allow`` restrict the root's moves: `root_moves`); `AnalysisRun`
steps a search generator of `arena.player.MctsPlayer` one evaluator batch
at a time and keeps its latest tree (`engine.search.Tree`); `report_line`
reads the root's visited moves (`root_move_stats`, most visited first) into
one line.  The commands themselves, and when a reply stops, are
`arena.gtp_engine.GtpEngine`'s (`cmd_lz_analyze`).

A report line holds one block per move with visits::

    info move D4 visits 31 winrate 5210 prior 1204 lcb 4903 order 0 pv D4 E5 E4 info move ...

for lz-analyze (winrate, prior, lcb: integers in 0..10000); kata-analyze
writes ``utility winrate [scoreMean scoreLead] prior lcb utilityLcb order pv
[pvVisits]`` with decimals (win rates in [0, 1], utilities in [-1, 1]), then
with ``ownership true`` N*N values in [-1, 1], row-major from the top left.
All values are for COLOR: ``winrate`` = (Q + 1) / 2 of the move's mean value
Q, ``utility`` = Q, ``lcb`` = `winrate_lcb`; ``order`` 0 is genmove's move;
``pv`` follows the most visited child (PV_MAX_MOVES at most).  The score
fields (points COLOR leads by, komi included) are the network's score head
on the position after the move (`NetworkScore`; the rules' count once the
game is over there), and are left out when the model has no score head (the
uniform evaluator).  Ownership comes from the rules: `ownership_values`
(Tromp-Taylor, board as it stands).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Sequence

import numpy as np

from arena.match import wilson_interval
from engine.board import Board
from engine.search import STATE_EXPANDED
from format import schema
from format.coords import gtp_to_move, move_to_gtp
from format.planes import input_planes_of

ANALYSIS_MAX_NODES = 8_000_000
"""Largest tree an endless analysis grows, in nodes (about 36 bytes each, so
some 300 MB): a search expands one node per legal move at each leaf, so the
visit cap is this divided by the board's actions (`max_analysis_visits`):
about 97,000 visits on 9x9 and 22,000 on 19x19.  At the cap the search stops
and the reports go on, unchanged, until the controller stops them."""

PV_MAX_MOVES = 30
"""Longest principal variation reported (a line stays a few hundred bytes)."""

MAX_INTERVAL_CENTISECONDS = 8_640_000
"""Longest report interval taken (a day): a longer one is refused, as the
clock cannot wait that long (Python's timeouts overflow)."""

_COLORS = {"b": schema.BLACK, "black": schema.BLACK, "w": schema.WHITE, "white": schema.WHITE}
_FLAGS = {"true": True, "false": False}


@dataclasses.dataclass(frozen=True)
class MoveRestriction:
    """One ``avoid``/``allow`` option: COLOR's `moves` (flat actions), for
    the first `until_depth` plies of the search (1: the root's moves)."""

    color: int
    moves: frozenset
    until_depth: int


@dataclasses.dataclass(frozen=True)
class AnalysisRequest:
    """The arguments of one analysis command.

    kata: KataGo's output (win rates in [0, 1], score fields) rather than
        Leela Zero's (integers in 0..10000).
    color: the player whose moves are analysed (None: the side to move).
    interval: seconds between reports (None: no reports, as Leela Zero
        does for an interval of 0 or none).
    ownership: kata only, end each report with the ownership list.
    pv_visits: kata only, follow each ``pv`` with ``pvVisits``.
    max_moves: report at most this many moves (None: every visited move).
    avoid: moves the search must not play (`root_moves`).
    allow: the only moves the search may play (PASS stays allowed, as in
        Leela Zero).
    """

    kata: bool
    color: int | None = None
    interval: float | None = None
    ownership: bool = False
    pv_visits: bool = False
    max_moves: int | None = None
    avoid: tuple[MoveRestriction, ...] = ()
    allow: tuple[MoveRestriction, ...] = ()


def _count(text: str, what: str, least: int, most: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not an integer") from None
    if value < least:
        raise ValueError(f"{what} {text!r} is below {least}")
    if most is not None and value > most:
        raise ValueError(f"{what} {text!r} is above {most}")
    return value


def _vertices(text: str, board_size: int) -> frozenset:
    """Leela Zero's vertex list: ``D4,E5,pass`` and rectangles ``A1:C3``."""
    moves = set()
    for item in text.split(","):
        corners = item.split(":")
        if len(corners) == 1:
            moves.add(gtp_to_move(item, board_size))
            continue
        if len(corners) != 2:
            raise ValueError(f"vertex range {item!r} is not FIRST:LAST")
        (r1, c1), (r2, c2) = (divmod(gtp_to_move(corner, board_size), board_size) for corner in corners)
        if board_size * board_size in (r1 * board_size + c1, r2 * board_size + c2):
            raise ValueError(f"vertex range {item!r} has a pass in it")
        moves.update(
            r * board_size + c for r in range(min(r1, r2), max(r1, r2) + 1) for c in range(min(c1, c2), max(c1, c2) + 1)
        )
    return frozenset(moves)


def _restriction(rest: list[str], key: str, board_size: int) -> MoveRestriction:
    """``COLOR VERTICES UNTIL_DEPTH`` after ``avoid``/``allow``, taken from `rest`."""
    if len(rest) < 3:
        raise ValueError(f"{key} wants COLOR VERTICES UNTIL_DEPTH")
    color, vertices, depth = rest.pop(0), rest.pop(0), rest.pop(0)
    if color.lower() not in _COLORS:
        raise ValueError(f"{key}: {color!r} is not a colour")
    return MoveRestriction(_COLORS[color.lower()], _vertices(vertices, board_size), _count(depth, f"{key} depth", 1))


def parse_request(args: list[str], kata: bool, board_size: int) -> AnalysisRequest:
    """``[color] [interval] [key value]...`` as Leela Zero and KataGo take
    them (interval in centiseconds, at most MAX_INTERVAL_CENTISECONDS; keys
    ``interval``, ``maxmoves``, ``avoid COLOR VERTICES UNTIL_DEPTH`` and
    ``allow ...`` (Leela Zero's: vertices comma-separated, ``A1:C3`` a
    rectangle; repeatable, but no allow with an avoid other than pass for
    one colour), and for kata ``ownership`` and ``pvVisits`` with
    ``true``/``false``).  Raises ValueError naming the bad argument."""
    rest = list(args)
    fields: dict = {"kata": kata}
    restrictions: dict = {"avoid": [], "allow": []}
    if rest and rest[0].lower() in _COLORS:
        fields["color"] = _COLORS[rest.pop(0).lower()]
    centiseconds = 0
    if rest and rest[0].lstrip("-").isdigit():
        centiseconds = _count(rest.pop(0), "interval", 0, MAX_INTERVAL_CENTISECONDS)
    while rest:
        key = rest.pop(0)
        if key.lower() in restrictions:
            restrictions[key.lower()].append(_restriction(rest, key.lower(), board_size))
            continue
        if not rest:
            raise ValueError(f"option {key!r} has no value")
        value, name = rest.pop(0), key.lower()
        if name == "interval":
            centiseconds = _count(value, "interval", 0, MAX_INTERVAL_CENTISECONDS)
        elif name == "maxmoves":
            fields["max_moves"] = _count(value, "maxmoves", 1)
        elif kata and name in ("ownership", "pvvisits") and value.lower() in _FLAGS:
            fields["ownership" if name == "ownership" else "pv_visits"] = _FLAGS[value.lower()]
        else:
            raise ValueError(f"unknown analysis option {key} {value}")
    pass_move = board_size * board_size
    for allowed in restrictions["allow"]:
        if any(a.color == allowed.color and a.moves - {pass_move} for a in restrictions["avoid"]):
            raise ValueError("allow and avoid (other than pass) for the same colour")
    fields["interval"] = centiseconds / 100.0 if centiseconds > 0 else None
    return AnalysisRequest(avoid=tuple(restrictions["avoid"]), allow=tuple(restrictions["allow"]), **fields)


def root_moves(request: AnalysisRequest, color: int, candidates: np.ndarray) -> list[int] | None:
    """The root's moves under the request's avoid/allow for `color` (the
    analysed player, to move at the root), from `candidates` (the search's
    own mask, uint8 [N*N+1]); None when nothing restricts them.  Every
    restriction reaches at least the root (its depth is at least 1); the
    plies below are searched unrestricted.  Nothing left: PASS alone."""
    avoid = [r for r in request.avoid if r.color == color]
    allow = [r for r in request.allow if r.color == color]
    if not avoid and not allow:
        return None
    pass_move = len(candidates) - 1
    moves = [int(a) for a in np.flatnonzero(candidates)]
    if allow:
        allowed = frozenset().union(*(r.moves for r in allow)) | {pass_move}
        moves = [m for m in moves if m in allowed]
    banned = frozenset().union(*(r.moves for r in avoid)) if avoid else frozenset()
    moves = [m for m in moves if m not in banned]
    return moves or [pass_move]


def max_analysis_visits(board_size: int) -> int:
    """Root visits at which an endless analysis stops growing its tree."""
    return max(1, ANALYSIS_MAX_NODES // (board_size * board_size + 1))


# --------------------------------------------------------------------------
# reading the tree
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MoveStats:
    """One root move as a report shows it.  `value` is the mean value of
    the move for the root's player to move, in [-1, 1] (a child's W is seen
    by the player who played its move, engine/search.pyx); `pv` starts with
    the move, `pv_visits` are the visits of its nodes."""

    move: int
    visits: int
    value: float
    prior: float
    pv: list[int]
    pv_visits: list[int]


def principal_variation(tree, node: int, limit: int = PV_MAX_MOVES) -> tuple[list[int], list[int]]:
    """(moves, visits) from `node` down its most visited children, while they
    have visits."""
    moves: list[int] = []
    visits: list[int] = []
    while len(moves) < limit:
        info = tree.node(node)
        moves.append(int(info["move"]))
        visits.append(int(info["N"]))
        if info["state"] != STATE_EXPANDED or info["num_children"] <= 0:
            break
        children = tree.children(node)
        best = int(children["N"].argmax())
        if children["N"][best] <= 0:
            break
        node = int(children["index"][best])
    return moves, visits


def root_move_stats(tree, max_moves: int | None = None, pv_length: int = PV_MAX_MOVES) -> list[MoveStats]:
    """The root's visited moves, most visited first (then by value): the
    first is the move genmove would play at temperature 0; each with its
    principal variation of at most `pv_length` moves."""
    if tree.node(0)["state"] != STATE_EXPANDED:
        return []
    children = tree.children(0)
    visited = [k for k in range(len(children["N"])) if children["N"][k] > 0]
    visited.sort(key=lambda k: (-int(children["N"][k]), -float(children["W"][k]) / int(children["N"][k])))
    stats = []
    for k in visited[:max_moves]:
        pv, pv_visits = principal_variation(tree, int(children["index"][k]), pv_length)
        n = int(children["N"][k])
        stats.append(
            MoveStats(int(children["move"][k]), n, float(children["W"][k]) / n, float(children["P"][k]), pv, pv_visits)
        )
    return stats


def winrate_lcb(winrate: float, visits: int) -> float:
    """The low end of the Wilson interval (`arena.match.wilson_interval`, 95%) of a win rate in [0, 1]
    measured over `visits`.

    The search keeps no variance per move, so each visit counts as a draw in
    [0, 1] with mean `winrate`, whose variance is at most w(1 - w): the bound
    is conservative, lies in [0, winrate], and rises with visits."""
    n = max(visits, 1)
    return min(wilson_interval(winrate * n, n)[0], winrate)


# --------------------------------------------------------------------------
# writing a report
# --------------------------------------------------------------------------


class NetworkScore:
    """A published model's score head as a scorer: ``scorer(boards)`` is
    float [B], each board's expected final area score in points (komi
    included) for its player to move.  `model` is an
    `inference.model_files.LoadedModel` (planes -> dict of every head)."""

    def __init__(self, model):
        self.model = model
        self.channels = input_planes_of(model)

    def __call__(self, boards: Sequence[Board]) -> np.ndarray:
        planes = np.stack([board.features(self.channels) for board in boards])
        return np.asarray(self.model(planes)["score"], np.float64).reshape(-1)


def score_leads(board: Board, moves: Sequence[int], scorer: Callable[[Sequence[Board]], np.ndarray]) -> list[float]:
    """The points by which the player to move on `board` leads after each
    of `moves`: minus `scorer`'s score of the position after it (one batch),
    or the rules' count (Tromp-Taylor) where the game is over."""
    afters = []
    for move in moves:
        after = board.copy()
        after.play(move)
        afters.append(after)
    playing = [after for after in afters if not after.is_over]
    estimates = iter(scorer(playing) if playing else [])
    return [-float(after.mover_score()) if after.is_over else -float(next(estimates)) for after in afters]


def ownership_values(board: Board) -> list[float]:
    """Ownership of every point, row-major from the top left, +1 for the
    player to move: Tromp-Taylor on the board as it stands (`Board.ownership`,
    the engine's one owner of who owns a point)."""
    sign = 1 if board.to_play == schema.BLACK else -1
    return [float(sign * int(owner)) for owner in board.ownership()]


def _clamp01(x: float) -> float:
    return min(max(x, 0.0), 1.0)


def move_fields(
    stats: MoveStats, order: int, board: Board, request: AnalysisRequest, score: float | None = None
) -> str:
    """One move's ``info ...`` block; ``pv`` (and pvVisits) last, as clients
    read the variation to the end of the block.  `score`: the move's
    lead in points for the player to move (kata only; None: no score fields)."""
    size = board.size
    winrate = _clamp01((stats.value + 1.0) / 2.0)
    lcb = winrate_lcb(winrate, stats.visits)
    pv = " ".join(move_to_gtp(m, size) for m in stats.pv)
    if not request.kata:
        return (
            f"info move {move_to_gtp(stats.move, size)} visits {stats.visits} "
            f"winrate {round(10000 * winrate)} prior {round(10000 * _clamp01(stats.prior))} "
            f"lcb {round(10000 * lcb)} order {order} pv {pv}"
        )
    scores = "" if score is None else f"scoreMean {score:.6f} scoreLead {score:.6f} "
    text = (
        f"info move {move_to_gtp(stats.move, size)} visits {stats.visits} utility {stats.value:.6f} "
        f"winrate {winrate:.6f} {scores}prior {_clamp01(stats.prior):.6f} lcb {lcb:.6f} "
        f"utilityLcb {2.0 * lcb - 1.0:.6f} order {order} pv {pv}"
    )
    if request.pv_visits:
        text += " pvVisits " + " ".join(str(v) for v in stats.pv_visits)
    return text


def report_line(tree, board: Board, request: AnalysisRequest, scores: dict[int, float] | None = None) -> str:
    """One report: the moves' blocks on one line (then ``ownership ...``
    when asked); '' while no move has a visit yet.  `scores`: move ->
    lead for kata's score fields (None: none written)."""
    stats = root_move_stats(tree, request.max_moves)
    if not stats:
        return ""
    line = " ".join(
        move_fields(s, order, board, request, None if scores is None else scores[s.move])
        for order, s in enumerate(stats)
    )
    if request.kata and request.ownership:
        line += " ownership " + " ".join(f"{v:.6f}" for v in ownership_values(board))
    return line


class AnalysisRun:
    """A search generator stepped one evaluator batch at a time (`step`),
    with the latest tree kept for `report`.  `result` is the generator's
    return value once `step` has answered False (genmove_analyze's move).
    `scorer` (`NetworkScore`, or None) gives kata's score fields; each
    reported move's lead is computed once (`score_leads`) and kept."""

    def __init__(
        self,
        steps: Iterator,
        board: Board,
        request: AnalysisRequest,
        scorer: Callable[[Sequence[Board]], np.ndarray] | None = None,
    ):
        self._steps = steps
        self.board = board
        self.request = request
        self.scorer = scorer if request.kata else None
        self.leads: dict[int, float] = {}
        self.tree = None
        self.result: int | None = None

    def step(self) -> bool:
        """One batch of the search; False once the search has ended."""
        try:
            self.tree = next(self._steps)
        except StopIteration as stop:
            self.result = stop.value
            return False
        return True

    def report(self) -> str:
        if self.tree is None:
            return ""
        if self.scorer is None:
            return report_line(self.tree, self.board, self.request)
        new = [s.move for s in root_move_stats(self.tree, self.request.max_moves) if s.move not in self.leads]
        if new:
            self.leads.update(zip(new, score_leads(self.board, new, self.scorer)))
        return report_line(self.tree, self.board, self.request, self.leads)
