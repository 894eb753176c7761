"""Elo ratings from game results: a maximum-likelihood Bradley-Terry fit with
profile-likelihood 95% intervals.

Data flows: pair records -> `merge_pairs` -> `fit_ratings(records, anchor)`
-> a `Fit` of one `Rating` per player (estimate, interval ends, games);
`choose_anchor` picks the anchor and `win_groups` shows the groups.
`fit_ratings`' docstring says when an estimate is finite and how the
intervals are defined and computed.

Terms:
* *player*: a name (``random``, ``gnugo:1``, ``gen:12``).
* *pair record*: ``(a, b, games, score_a)``: ``games`` games between a and b,
  of which a scored ``score_a`` (a win 1, a draw 1/2, a loss 0).
* *rating* ``r`` in Elo points; *natural units* ``x = r ln 10 / 400``.  A
  player rated ``r_a`` scores against one rated ``r_b`` with expectation
  ``P = 1 / (1 + 10^((r_b - r_a) / 400))`` in every game, colours ignored
  (Bradley-Terry, as BayesElo and Ordo).
* *log-likelihood* ``LL = sum over pairs of s log P + (g - s) log (1 - P)``.
* *anchor*: the player held at 0; every rating is a gap to it.  Players
  with no chain of games to it are *unrated* (left out).
* *win graph*: an arrow ``u -> v`` when u scored at least once against v; u
  *reaches* v along arrows.  A *mutual-win group* is a largest set of
  players who all reach each other (a strongly connected component).
* ``prior_draws``: BayesElo's weak prior, that many virtual draws added to
  every pair that played (every connected player is then finite, and each
  gap is pulled towards 0); ``interval="none"`` skips the intervals.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

import numpy as np

ELO_PER_NAT = 400.0 / math.log(10.0)
"""Elo points per natural-log unit of the odds."""
Z_95 = 1.959963984540054
"""Two-sided 95% quantile of the standard normal (the Wilson intervals of arena.match use it too)."""
CHI2_95 = Z_95**2
"""95% point of chi-square with one degree of freedom: the deviance limit of a finite estimate's interval."""
SHUTOUT_DEVIANCE_95 = -2.0 * math.log(0.025)
"""The deviance limit of a one-sided interval's end (an infinite estimate): where the shut-out
the games show had a 2.5% chance (`fit_ratings`)."""
INTERVALS = ("profile", "none")

_MAX_PROFILE_STEP = 4.0
"""Largest move of a profile end per Newton step, in natural units (~700 Elo): a step from near
the maximum (slope ~0) would otherwise land where the inner fit is needlessly hard."""


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
    """A rating and its 95% interval, in Elo relative to the anchor.

    ``elo`` is the maximum-likelihood estimate (maximum-posterior with a prior),
    or ``+inf`` / ``-inf`` / ``nan`` where the likelihood has no finite maximum
    (module docstring): then only ``low`` (for ``+inf``) or ``high`` (for
    ``-inf``) is a statement about the player.  ``low`` may be ``-inf`` and
    ``high`` ``+inf`` (one-sided intervals); both are NaN with ``interval="none"``.
    """

    player: str
    elo: float
    low: float
    high: float
    games: int

    @property
    def finite(self) -> bool:
        return math.isfinite(self.elo)

    def estimate_text(self) -> str:
        """The estimate as a reader should take it: ``412``, ``>= 140`` (a bound), or ``?``."""
        if self.finite:
            return f"{self.elo:.0f}"
        if self.elo > 0 and math.isfinite(self.low):
            return f">= {self.low:.0f}"
        if self.elo < 0 and math.isfinite(self.high):
            return f"<= {self.high:.0f}"
        return "?"

    def interval_text(self) -> str:
        """``[low, high]`` with open ends written ``(-inf`` and ``+inf)``."""
        if math.isnan(self.low) or math.isnan(self.high):
            return ""
        left = "(-inf" if self.low == -math.inf else f"[{self.low:.0f}"
        right = "+inf)" if self.high == math.inf else f"{self.high:.0f}]"
        return f"{left}, {right}"


@dataclasses.dataclass(frozen=True)
class Fit:
    """The result of `fit_ratings`: ratings of the players connected to the anchor."""

    anchor: str
    ratings: dict[str, Rating]
    unrated: tuple[str, ...]
    """Players with games but no chain of games to the anchor."""
    prior_draws: float = 0.0
    interval: str = "profile"
    anchor_reason: str = ""
    """Why this anchor, when a caller chose it by a rule (`choose_anchor`)."""

    def method_text(self) -> str:
        """One line saying what the numbers are."""
        fit = (
            "maximum likelihood (no prior)"
            if self.prior_draws == 0
            else f"maximum posterior with {self.prior_draws:g} virtual draws per pairing"
        )
        interval = {"profile": "95% profile-likelihood intervals", "none": "no intervals"}[self.interval]
        return f"Bradley-Terry {fit}, {self.anchor} = 0, {interval}"


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
    """Players reachable from ``anchor`` through pairs that played (any results)."""
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


# --------------------------------------------------------------------------
# the likelihood and its maximisation
# --------------------------------------------------------------------------


class _Games:
    """Pairs as arrays over players 0..n-1 (``index_a``, ``index_b``, ``games``, a's ``scores``);
    ``incidence`` is +1 at a's column and -1 at b's, so ``incidence @ x`` is each pair's rating
    difference in natural units."""

    def __init__(self, index_a: np.ndarray, index_b: np.ndarray, games: np.ndarray, scores: np.ndarray, players: int):
        self.index_a, self.index_b, self.games, self.scores = index_a, index_b, games, scores
        self.incidence = np.zeros((len(games), players))
        self.incidence[np.arange(len(games)), index_a] = 1.0
        self.incidence[np.arange(len(games)), index_b] = -1.0

    def subset(self, rows: np.ndarray, columns: np.ndarray) -> "_Games":
        """The pairs ``rows`` over the players ``columns`` (every row's two players among them),
        renumbered in the order of ``columns``."""
        number = np.full(self.incidence.shape[1], -1)
        number[columns] = np.arange(len(columns))
        return _Games(
            number[self.index_a[rows]], number[self.index_b[rows]], self.games[rows], self.scores[rows], len(columns)
        )

    def terms(self, x: np.ndarray) -> np.ndarray:
        """Each pair's log-likelihood; log P = -log(1 + e^-d), log(1 - P) = -log(1 + e^d), kept finite."""
        diff = self.incidence @ x
        return -self.scores * np.logaddexp(0.0, -diff) - (self.games - self.scores) * np.logaddexp(0.0, diff)

    def derivatives(self, x: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """Value, gradient and Hessian of the log-likelihood at ``x``."""
        diff = self.incidence @ x
        p = 0.5 * (1.0 + np.tanh(0.5 * diff))  # the logistic function, without overflow
        residual = self.scores - self.games * p  # d/d(diff) of each pair's log-likelihood
        curvature = self.games * p * (1.0 - p)  # -d2/d(diff)2
        value = float(
            np.sum(-self.scores * np.logaddexp(0.0, -diff) - (self.games - self.scores) * np.logaddexp(0.0, diff))
        )
        return value, self.incidence.T @ residual, -(self.incidence.T * curvature) @ self.incidence


def _maximise(
    model: _Games, x: np.ndarray, free: np.ndarray, max_iterations: int = 200
) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """Newton's method with step halving over ``x[free]``, the rest held.

    The caller guarantees a finite maximum (every free player has, through the games,
    a win and a loss relative to the held ones); the log-likelihood is concave, so
    each accepted step rises and the iteration converges from anywhere.
    """
    x = x.copy()
    value, grad, hess = model.derivatives(x)
    if not free.any():
        return x, value, grad, hess
    for _ in range(max_iterations):
        step = np.linalg.solve(hess[np.ix_(free, free)], -grad[free])
        scale = 1.0
        while True:
            trial = x.copy()
            trial[free] += scale * step
            t_value, t_grad, t_hess = model.derivatives(trial)
            if t_value >= value - 1e-12 or scale < 1e-9:
                break
            scale /= 2.0
        x, value, grad, hess = trial, t_value, t_grad, t_hess
        if np.max(np.abs(scale * step)) < 1e-10 or np.max(np.abs(grad[free])) < 1e-10:
            break
    return x, value, grad, hess


def _reach(wins: np.ndarray) -> np.ndarray:
    """``reach[u, v]``: a chain of arrows of ``wins`` leads from u to v (every u reaches itself)."""
    reach = wins | np.eye(len(wins), dtype=bool)
    while True:
        longer = reach | ((reach.astype(np.int64) @ reach.astype(np.int64)) > 0)
        if (longer == reach).all():
            return reach
        reach = longer


class _Profile:
    """``LL_profile`` of one player: the log-likelihood of the games among ``model``'s players,
    maximised over all but the anchor (column 0, held at 0) and the player (column ``j``, at r)."""

    def __init__(self, model: _Games, j: int):
        self.model, self.j = model, j
        players = model.incidence.shape[1]
        self.free = np.ones(players, dtype=bool)
        self.free[[0, j]] = False

    def at(self, r: float, start: np.ndarray) -> tuple[np.ndarray, float, float, float]:
        """(x, LL_profile(r), its slope in r, its curvature in r), from the guess ``start``."""
        x = start.copy()
        x[0], x[self.j] = 0.0, r
        x, value, grad, hess = _maximise(self.model, x, self.free)
        f, j = self.free, self.j
        curvature = hess[j, j]
        if f.any():  # the Schur complement: curvature along the profile
            curvature -= hess[j, f] @ np.linalg.solve(hess[np.ix_(f, f)], hess[f, j])
        return x, value, float(grad[j]), float(curvature)

    def moved(self, x: np.ndarray, r: float) -> np.ndarray:
        """A guess of the maximiser at ``r`` from the one at ``x[j]`` (first order in r)."""
        guess = x.copy()
        f, j = self.free, self.j
        if f.any():
            _, _, hess = self.model.derivatives(x)
            guess[f] -= (r - x[j]) * np.linalg.solve(hess[np.ix_(f, f)], hess[f, j])
        guess[j] = r
        return guess


def _profile_end(
    profile: _Profile, supremum: float, r: float, x: np.ndarray, direction: int, limit: float, max_iterations: int = 100
) -> float:
    """The r on the ``direction`` side (+1 upper, -1 lower) where 2 (supremum - LL_profile(r)) = ``limit``.

    The deviance is convex in r, so from outside the interval Newton's steps approach the end
    without overshooting, and a step from inside lands outside (or is capped and goes on).
    """
    for _ in range(max_iterations):
        x, value, slope, curvature = profile.at(r, x)
        excess = 2.0 * (supremum - value) - limit
        deviance_slope = -2.0 * slope
        if abs(excess) < 1e-9:
            return r
        if deviance_slope * direction > 1e-12:
            step = -excess / deviance_slope
        elif curvature < 0:  # at the maximum: the quadratic's way out
            step = direction * math.sqrt(limit / -curvature)
        else:
            step = direction * _MAX_PROFILE_STEP
        step = max(-_MAX_PROFILE_STEP, min(_MAX_PROFILE_STEP, step))
        if abs(step) < 1e-11 * (1.0 + abs(r)):
            return r + step
        x = profile.moved(x, r + step)
        r += step
    raise ArithmeticError(f"the profile-likelihood interval did not converge (last end {r * ELO_PER_NAT:.1f} Elo)")


# --------------------------------------------------------------------------
# the fit
# --------------------------------------------------------------------------


def win_groups(records: Iterable[PairRecord], prior_draws: float = 0.0) -> list[set[str]]:
    """The mutual-win groups of the players (module docstring), largest first.

    With ``prior_draws`` > 0 every pair that played has scored both ways, so the
    groups are the connected parts of the game graph.
    """
    pairs = merge_pairs(records)
    names = sorted({p.a for p in pairs} | {p.b for p in pairs})
    where = {name: i for i, name in enumerate(names)}
    wins = np.zeros((len(names), len(names)), dtype=bool)
    for p in pairs:
        wins[where[p.a], where[p.b]] |= p.score_a + prior_draws / 2 > 0
        wins[where[p.b], where[p.a]] |= p.games - p.score_a + prior_draws / 2 > 0
    reach = _reach(wins)
    groups: dict[int, set[str]] = {}
    for i, name in enumerate(names):
        groups.setdefault(int(np.argmax(reach[i] & reach[:, i])), set()).add(name)
    return sorted(groups.values(), key=lambda group: (-len(group), sorted(group)))


def choose_anchor(
    records: Iterable[PairRecord], preferred: str, candidates: Sequence[str] = (), *, prior_draws: float = 0.0
) -> tuple[str, str]:
    """(anchor, why): ``preferred`` when it played and someone's rating against it is finite,
    else the candidate whose mutual-win group is largest (then: more games inside the group,
    then the earlier candidate).

    A rating against a player is finite only inside that player's mutual-win group, so an
    anchor alone in its group (say GNU Go 1 that beat every model and random 10-0 and lost
    10-0 to GNU Go 5: nobody both beat it and lost to it, directly or through others) would
    leave every other player with a bound instead of a number.  When no candidate shares
    its group, ``preferred`` stays (or the first candidate that played).
    """
    records = list(records)
    groups = win_groups(records, prior_draws)
    group_of = {name: group for group in groups for name in group}
    if preferred in group_of and len(group_of[preferred]) > 1:
        return preferred, f"{preferred} (the chosen anchor)"
    played = [c for c in candidates if c in group_of]
    if not played:
        return preferred, f"{preferred} (the chosen anchor; no candidate has games)"

    def games_inside(group: set[str]) -> float:
        return sum(r.games for r in records if r.a in group and r.b in group)

    best = max(played, key=lambda c: (len(group_of[c]), games_inside(group_of[c]), -played.index(c)))
    if len(group_of[best]) == 1:
        chosen = preferred if preferred in group_of else played[0]
        return chosen, (
            f"{chosen} (every anchor is alone in its mutual-win group: no rating against any "
            "is finite, each is a bound)"
        )
    if preferred not in group_of:
        why = f"{preferred} has no games"
    else:
        why = (
            f"{preferred} is alone in its mutual-win group (nobody both beat it and lost to it, directly "
            "or through others), so no rating against it is finite"
        )
    return best, f"{best} ({why}; {best}'s mutual-win group is the largest: {len(group_of[best])} players)"


def fit_ratings(
    records: Iterable[PairRecord],
    anchor: str = "random",
    *,
    prior_draws: float = 0.0,
    interval: str = "profile",
    max_iterations: int = 100,
) -> Fit:
    """Elo of every player connected to ``anchor``: the maximum-likelihood (with ``prior_draws``,
    maximum-posterior) fit and its 95% intervals (terms: the module docstring).

    The estimate maximises ``LL`` with the anchor at 0.  It is finite exactly
    for the players in the anchor's mutual-win group (Zermelo's and Ford's
    condition); any other player's likelihood keeps rising as its gap grows:
    one that reaches the anchor but is not reached by it (e.g. 10-0) has
    ``+inf``, the reverse ``-inf``, one neither reaching nor reached ``nan``.

    The interval: ``LL_profile(r)`` is ``LL`` maximised over every other
    player with this one at ``r``; ``LL_sup`` is the supremum of ``LL``; the
    deviance is ``D(r) = 2 (LL_sup - LL_profile(r))``.  A finite estimate's
    interval is ``{r : D(r) <= CHI2_95}`` (Wilks).  An infinite one's is
    ``[low, +inf)`` (or ``(-inf, high]``) with ``D(low) =
    SHUTOUT_DEVIANCE_95``: there ``exp(-D / 2)`` is the chance of the shut-out
    the games show, and the end is where it falls to 2.5% (a 10-0 win over
    the anchor alone gives ``[140, +inf)``; why not CHI2_95 there:
    docs/measured.md, "Elo intervals").  ``nan`` gets ``(-inf, +inf)``.

    Computed per mutual-win group: within each the maximum is finite and the
    games between groups tend to certainty, so ``LL_sup`` is the sum of the
    groups' maxima.  ``LL_profile(r)`` needs one Newton maximisation over the
    players on a win chain between the anchor and this one (concave,
    warm-started), its slope in ``r`` is the player's own gradient (envelope
    theorem), and Newton's method on the convex deviance reaches each end
    from outside in a handful of maximisations."""
    if prior_draws < 0 or not math.isfinite(prior_draws):
        raise ValueError(f"prior_draws must be >= 0, got {prior_draws}")
    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {', '.join(INTERVALS)}, got {interval!r}")
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
    anchor_rating = Rating(anchor, 0.0, 0.0, 0.0, played[anchor])
    if not free:
        return Fit(anchor, {anchor: anchor_rating}, unrated, prior_draws, interval)
    names = [anchor] + free  # index 0 is the anchor, held at 0
    where = {name: i for i, name in enumerate(names)}
    index_a = np.array([where[p.a] for p in pairs])
    index_b = np.array([where[p.b] for p in pairs])
    games = np.array([p.games + prior_draws for p in pairs], np.float64)
    scores = np.array([p.score_a + prior_draws / 2.0 for p in pairs], np.float64)
    model = _Games(index_a, index_b, games, scores, len(names))

    wins = np.zeros((len(names), len(names)), dtype=bool)
    wins[index_a, index_b] |= scores > 0
    wins[index_b, index_a] |= games - scores > 0
    reach = _reach(wins)
    # Each group is labelled by its first player, held at 0 while the group's own games are
    # fitted (the anchor's group: by the anchor).  The games between groups drop out of
    # the supremum: their gaps tend to infinity, the winner's way.
    group = np.argmax(reach & reach.T, axis=1)
    inside = group[index_a] == group[index_b]
    within = model.subset(np.flatnonzero(inside), np.arange(len(names)))
    x_hat = _maximise(within, np.zeros(len(names)), group != np.arange(len(names)), max_iterations)[0]
    inside_terms = within.terms(x_hat)

    ratings = {anchor: anchor_rating}
    for j, name in enumerate(names[1:], start=1):
        reaches_anchor, reached_by_anchor = bool(reach[j, 0]), bool(reach[0, j])
        if reaches_anchor and reached_by_anchor:
            x = float(x_hat[j])
        else:
            x = math.inf if reaches_anchor else -math.inf if reached_by_anchor else math.nan
        if interval == "none":
            low = high = math.nan
        else:
            low, high = _profile_interval(
                model, reach, inside, inside_terms, x_hat, j, reaches_anchor, reached_by_anchor
            )
        ratings[name] = Rating(name, x * ELO_PER_NAT, low * ELO_PER_NAT, high * ELO_PER_NAT, played[name])
    return Fit(anchor, ratings, unrated, prior_draws, interval)


def _profile_interval(
    model: _Games,
    reach: np.ndarray,
    inside: np.ndarray,
    inside_terms: np.ndarray,
    x_hat: np.ndarray,
    j: int,
    reaches_anchor: bool,
    reached_by_anchor: bool,
) -> tuple[float, float]:
    """Player j's profile-likelihood 95% interval in natural units (`fit_ratings`)."""
    if not (reaches_anchor or reached_by_anchor):
        return -math.inf, math.inf
    # The players on a win chain between the anchor and j: the only ones whose ratings stay
    # finite relative to the two while j is held at a finite gap.  They are whole groups.
    chain = (reach[0] | reach[j]) & (reach[:, 0] | reach[:, j])
    others = chain.copy()
    others[[0, j]] = False
    columns = np.concatenate(([0, j], np.flatnonzero(others)))
    rows = np.flatnonzero(chain[model.index_a] & chain[model.index_b])
    # The groups inside the chain, each at its own maximum: the supremum of the chain's games.
    supremum = float(inside_terms[chain[model.index_a[inside]]].sum())
    profile = _Profile(model.subset(rows, columns), 1)
    if reaches_anchor and reached_by_anchor:  # the chain is the anchor's group: start at its fit
        r_hat, limit, start = float(x_hat[j]), CHI2_95, x_hat[columns]
    else:  # no estimate: start level with the anchor
        r_hat, limit, start = 0.0, SHUTOUT_DEVIANCE_95, np.zeros(len(columns))
    low = _profile_end(profile, supremum, r_hat, start, -1, limit) if reaches_anchor else -math.inf
    high = _profile_end(profile, supremum, r_hat, start, +1, limit) if reached_by_anchor else math.inf
    return low, high
