"""Elo ratings from game results: one maximum-likelihood fit over all of them.

Terms
-----
* *player*: a name (``random``, ``gnugo:1``, ``gen:12``).
* *pair record*: ``(a, b, games, score_a)``: ``games`` games between a and b,
  of which a scored ``score_a`` (a win 1, a draw 1/2, a loss 0).
* *rating* ``r`` in Elo points.  The model is Bradley-Terry (as BayesElo
  and Ordo): a player rated ``r_a`` scores against one rated ``r_b`` with
  expectation ``P = 1 / (1 + 10^((r_b - r_a) / 400))``, the same in every
  game, colours ignored (the ladder alternates them).

The fit maximises the log-likelihood ``sum s log P + (g - s) log (1 - P)``
over every pair record, plus a weak prior: BayesElo's ``prior_draws``
virtual draws added to every pair that played.  Without it a player who won
every game would have an infinite rating; with it the rating is large but
finite, and it pulls a gap towards 0 by about as much as ``prior_draws``
real draws would.  The *anchor* (``random``) is fixed at 0; players with no
chain of games to it cannot be rated and are left out (``unrated``).

Newton's method in natural units (``x = r ln 10 / 400``): the
log-likelihood is concave, so it converges in a few steps from all zeros.

Intervals: 95% = rating +- 1.96 standard errors, the standard errors from the
inverse of the negative Hessian of the log-posterior at the maximum
(the Laplace / Fisher-information approximation).  They are relative to the
anchor: the anchor's own interval is zero width.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

import numpy as np

ELO_PER_NAT = 400.0 / math.log(10.0)
"""Elo points per natural-log unit of the odds."""
Z_95 = 1.959963984540054


@dataclasses.dataclass(frozen=True)
class PairRecord:
    """``games`` games between ``a`` and ``b``; ``score_a`` = a's wins + draws / 2."""

    a: str
    b: str
    games: int
    score_a: float

    def __post_init__(self):
        if self.a == self.b:
            raise ValueError(f"a pair record needs two players, got {self.a!r} twice")
        if self.games < 0 or not 0 <= self.score_a <= self.games:
            raise ValueError(f"{self.a} vs {self.b}: need 0 <= score ({self.score_a}) <= games ({self.games})")


@dataclasses.dataclass(frozen=True)
class Rating:
    """A fitted rating with its 95% interval, all in Elo, relative to the anchor."""

    player: str
    elo: float
    low: float
    high: float
    games: int


@dataclasses.dataclass(frozen=True)
class Fit:
    """The result of `fit_ratings`: ratings of the players connected to the anchor."""

    anchor: str
    ratings: dict[str, Rating]
    unrated: tuple[str, ...]
    """Players with games but no chain of games to the anchor."""


def expected_score(elo_a: float, elo_b: float) -> float:
    """Bradley-Terry expectation of a's score in one game against b."""
    return 1.0 / (1.0 + 10.0 ** ((elo_b - elo_a) / 400.0))


def elo_gap(score_fraction: float) -> float:
    """Elo difference that makes ``score_fraction`` the expected score (0 < f < 1)."""
    if not 0.0 < score_fraction < 1.0:
        raise ValueError(f"score fraction must be in (0, 1), got {score_fraction}")
    return 400.0 * math.log10(score_fraction / (1.0 - score_fraction))


def merge_pairs(records: Iterable[PairRecord]) -> list[PairRecord]:
    """One record per unordered pair, scores from the alphabetically first player's side."""
    totals: dict[tuple[str, str], list[float]] = {}
    for r in records:
        a, b, score = (r.a, r.b, r.score_a) if r.a < r.b else (r.b, r.a, r.games - r.score_a)
        entry = totals.setdefault((a, b), [0, 0.0])
        entry[0] += r.games
        entry[1] += score
    return [PairRecord(a, b, int(g), s) for (a, b), (g, s) in sorted(totals.items()) if g > 0]


def _connected(anchor: str, pairs: Sequence[PairRecord]) -> set[str]:
    """Players reachable from ``anchor`` through pairs that played."""
    neighbours: dict[str, set[str]] = {}
    for p in pairs:
        neighbours.setdefault(p.a, set()).add(p.b)
        neighbours.setdefault(p.b, set()).add(p.a)
    seen, stack = {anchor}, [anchor]
    while stack:
        for other in neighbours.get(stack.pop(), ()):
            if other not in seen:
                seen.add(other)
                stack.append(other)
    return seen


def _gradient_and_hessian(x: np.ndarray, index_a: np.ndarray, index_b: np.ndarray, games: np.ndarray,
                          scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Gradient, Hessian and value of the log-posterior at ``x`` (natural units)."""
    diff = x[index_a] - x[index_b]
    p = 1.0 / (1.0 + np.exp(-diff))
    residual = scores - games * p                # d/d(diff) of the pair's log-likelihood
    curvature = games * p * (1.0 - p)            # -d2/d(diff)2
    n = len(x)
    grad = np.zeros(n)
    np.add.at(grad, index_a, residual)
    np.add.at(grad, index_b, -residual)
    hess = np.zeros((n, n))
    np.add.at(hess, (index_a, index_a), -curvature)
    np.add.at(hess, (index_b, index_b), -curvature)
    np.add.at(hess, (index_a, index_b), curvature)
    np.add.at(hess, (index_b, index_a), curvature)
    # log P = -log(1 + e^-d), log(1 - P) = -log(1 + e^d), written to stay finite.
    value = float(np.sum(-scores * np.logaddexp(0.0, -diff) - (games - scores) * np.logaddexp(0.0, diff)))
    return grad, hess, value


def fit_ratings(records: Iterable[PairRecord], anchor: str = "random", *, prior_draws: float = 2.0,
                max_iterations: int = 100) -> Fit:
    """Maximum-a-posteriori Elo of every player connected to ``anchor`` (module docstring)."""
    if prior_draws < 0:
        raise ValueError(f"prior_draws must be >= 0, got {prior_draws}")
    pairs = merge_pairs(records)
    everyone = sorted({p.a for p in pairs} | {p.b for p in pairs})
    connected = _connected(anchor, pairs)
    unrated = tuple(p for p in everyone if p not in connected)
    pairs = [p for p in pairs if p.a in connected and p.b in connected]
    played = {name: 0 for name in connected}
    for p in pairs:
        played[p.a] += p.games
        played[p.b] += p.games
    free = sorted(connected - {anchor})
    if not free:
        return Fit(anchor, {anchor: Rating(anchor, 0.0, 0.0, 0.0, played[anchor])}, unrated)
    names = [anchor] + free                      # index 0 is the anchor, held at 0
    where = {name: i for i, name in enumerate(names)}
    index_a = np.array([where[p.a] for p in pairs])
    index_b = np.array([where[p.b] for p in pairs])
    games = np.array([p.games + prior_draws for p in pairs], np.float64)
    scores = np.array([p.score_a + prior_draws / 2.0 for p in pairs], np.float64)
    x = np.zeros(len(names))
    grad, hess, value = _gradient_and_hessian(x, index_a, index_b, games, scores)
    for _ in range(max_iterations):
        step = np.linalg.solve(hess[1:, 1:], -grad[1:])
        scale = 1.0
        while True:                               # halve the step until the posterior rises
            trial = x.copy()
            trial[1:] += scale * step
            t_grad, t_hess, t_value = _gradient_and_hessian(trial, index_a, index_b, games, scores)
            if t_value >= value - 1e-12 or scale < 1e-6:
                break
            scale /= 2.0
        x, grad, hess, value = trial, t_grad, t_hess, t_value
        if np.max(np.abs(scale * step)) < 1e-10:
            break
    covariance = np.linalg.inv(-hess[1:, 1:])
    errors = np.sqrt(np.maximum(np.diag(covariance), 0.0)) * ELO_PER_NAT
    ratings = {anchor: Rating(anchor, 0.0, 0.0, 0.0, played[anchor])}
    for i, name in enumerate(free, start=1):
        elo = float(x[i] * ELO_PER_NAT)
        half = Z_95 * float(errors[i - 1])
        ratings[name] = Rating(name, elo, elo - half, elo + half, played[name])
    return Fit(anchor, ratings, unrated)
