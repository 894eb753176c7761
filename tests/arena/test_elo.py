"""arena.elo: the maximum-likelihood Bradley-Terry fit and its profile-likelihood intervals
against hand-computed and brute-force cases (the statistical check is tests/arena/test_elo_coverage.py)."""
import math

import pytest

from arena.elo import (CHI2_95, ELO_PER_NAT, SHUTOUT_DEVIANCE_95, PairRecord, choose_anchor, elo_gap,
                       expected_score, fit_ratings, merge_pairs, win_groups)


def log_likelihood(pairs, elo):
    """Bradley-Terry log-likelihood of ``pairs`` (a, b, games, score_a) at ratings ``elo`` (a dict)."""
    total = 0.0
    for a, b, games, score in pairs:
        p = expected_score(elo[a], elo[b])
        total += (score * math.log(p) if score else 0.0) + ((games - score) * math.log(1 - p) if games - score else 0.0)
    return total


def maximise(f, low, high, steps=200):
    """Maximum of a concave function of one variable on [low, high] by ternary search."""
    for _ in range(steps):
        left, right = low + (high - low) / 3, high - (high - low) / 3
        if f(left) < f(right):
            low = left
        else:
            high = right
    return f((low + high) / 2)


def crossing(f, inside, outside, level, steps=200):
    """The point between ``inside`` (f < level) and ``outside`` (f > level) where f = level, by bisection."""
    for _ in range(steps):
        middle = (inside + outside) / 2
        inside, outside = (middle, outside) if f(middle) < level else (inside, middle)
    return (inside + outside) / 2


def test_expected_score_and_gap_are_inverse():
    assert expected_score(0, 0) == 0.5
    assert expected_score(400, 0) == pytest.approx(10 / 11)
    assert elo_gap(0.75) == pytest.approx(400 * math.log10(3))
    assert elo_gap(expected_score(123.0, 0.0)) == pytest.approx(123.0)
    with pytest.raises(ValueError):
        elo_gap(1.0)


def test_symmetric_results_give_equal_ratings():
    records = [PairRecord("random", "a", 10, 5), PairRecord("random", "b", 10, 5), PairRecord("a", "b", 8, 4)]
    fit = fit_ratings(records, prior_draws=2.0)
    assert fit.ratings["a"].elo == pytest.approx(0.0, abs=1e-6)
    assert fit.ratings["b"].elo == pytest.approx(0.0, abs=1e-6)
    low, high = fit.ratings["a"].low, fit.ratings["a"].high
    assert low == pytest.approx(-high) and high > 0


def test_a_known_win_ratio_gives_its_elo_gap():
    """30 of 40 points: the gap is 400 log10(3) without a prior, and with d virtual draws
    the fraction (30 + d/2) / (40 + d)."""
    records = [PairRecord("a", "random", 40, 30)]
    assert fit_ratings(records, prior_draws=0.0).ratings["a"].elo == pytest.approx(elo_gap(0.75), abs=1e-6)
    assert fit_ratings(records, prior_draws=2.0).ratings["a"].elo == pytest.approx(elo_gap(31 / 42), abs=1e-6)
    # Order of the pair and splitting it into several records change nothing.
    split = [PairRecord("random", "a", 20, 5), PairRecord("a", "random", 20, 15)]
    assert fit_ratings(split, prior_draws=2.0).ratings["a"].elo == pytest.approx(elo_gap(31 / 42), abs=1e-6)


def test_gaps_add_along_a_chain_and_transitive_evidence_is_combined():
    chain = [PairRecord("a", "random", 40, 30), PairRecord("b", "a", 40, 30)]
    fit = fit_ratings(chain, prior_draws=0.0)
    assert fit.ratings["b"].elo == pytest.approx(2 * elo_gap(0.75), abs=1e-5)
    # The chain's interval for b is wider than a's: two pairs of uncertainty.
    assert fit.ratings["b"].high - fit.ratings["b"].low > fit.ratings["a"].high - fit.ratings["a"].low


def test_all_wins_stay_finite_with_the_prior_and_unconnected_players_are_unrated():
    records = [PairRecord("a", "random", 10, 10), PairRecord("x", "y", 4, 2)]
    fit = fit_ratings(records, prior_draws=2.0)
    assert math.isfinite(fit.ratings["a"].elo) and fit.ratings["a"].elo == pytest.approx(elo_gap(11 / 12))
    assert fit.unrated == ("x", "y") and "x" not in fit.ratings


def test_bad_records_are_refused():
    with pytest.raises(ValueError, match="score"):
        PairRecord("a", "b", 2, 3)
    with pytest.raises(ValueError, match="two players"):
        PairRecord("a", "a", 2, 1)
    assert merge_pairs([PairRecord("b", "a", 2, 2), PairRecord("a", "b", 2, 1)]) == [PairRecord("a", "b", 4, 1)]


def test_the_interval_of_one_pair_is_where_the_deviance_reaches_the_chi_square_point():
    """30 of 40: the ends are where 2 (LL_max - LL(r)) = 3.841, found here by bisection; the
    interval is not symmetric about the estimate (the Hessian's would be)."""
    pairs = [("a", "random", 40, 30)]
    rating = fit_ratings([PairRecord(*pairs[0])]).ratings["a"]
    best = log_likelihood(pairs, {"a": rating.elo, "random": 0.0})

    def deviance(r):
        return 2 * (best - log_likelihood(pairs, {"a": r, "random": 0.0}))

    assert rating.low == pytest.approx(crossing(deviance, rating.elo, -1000, CHI2_95), abs=1e-6)
    assert rating.high == pytest.approx(crossing(deviance, rating.elo, 2000, CHI2_95), abs=1e-6)
    assert rating.high - rating.elo > rating.elo - rating.low + 5


def test_the_profile_maximises_over_the_other_players():
    """b's interval: at each end the deviance, with a re-fitted for b's rating there, is 3.841."""
    pairs = [("a", "random", 20, 14), ("b", "a", 20, 13), ("b", "random", 20, 16)]
    fit = fit_ratings([PairRecord(*p) for p in pairs])
    best = log_likelihood(pairs, {"random": 0.0, "a": fit.ratings["a"].elo, "b": fit.ratings["b"].elo})

    def profile(r):
        return maximise(lambda a: log_likelihood(pairs, {"random": 0.0, "a": a, "b": r}), -2000, 2000)

    assert maximise(profile, -2000, 2000) == pytest.approx(best, abs=1e-9)
    for end in (fit.ratings["b"].low, fit.ratings["b"].high):
        assert 2 * (best - profile(end)) == pytest.approx(CHI2_95, abs=1e-6)


def test_a_shut_out_has_no_estimate_only_a_one_sided_bound():
    """10-0 over the anchor: no finite maximum.  The bound is where 10-0 had a 2.5% chance:
    P(r)^10 = 0.025, 140 Elo (the deviance there, -20 ln P, is -2 ln 0.025)."""
    bound = elo_gap(0.025 ** (1 / 10))
    won = fit_ratings([PairRecord("a", "random", 10, 10)]).ratings["a"]
    assert won.elo == math.inf and won.high == math.inf and not won.finite
    assert won.low == pytest.approx(bound, abs=1e-6) and round(bound) == 140
    assert (won.estimate_text(), won.interval_text()) == (">= 140", "[140, +inf)")
    assert SHUTOUT_DEVIANCE_95 == pytest.approx(-2 * math.log(0.025))
    lost = fit_ratings([PairRecord("a", "random", 10, 0)]).ratings["a"]
    assert (lost.elo, lost.low) == (-math.inf, -math.inf) and lost.high == pytest.approx(-bound, abs=1e-6)
    assert (lost.estimate_text(), lost.interval_text()) == ("<= -140", "(-inf, -140]")


def test_a_group_that_lost_every_game_to_the_anchor_is_bounded_by_all_its_games():
    """a and b play each other (finite gap) and each lost 10-0 to the anchor: a's bound comes
    from the profile over b as well, with the supremum at the anchor's games' limit (probability 1)."""
    pairs = [("a", "b", 10, 6), ("a", "gnugo", 10, 0), ("b", "gnugo", 10, 0)]
    fit = fit_ratings([PairRecord(*p) for p in pairs], "gnugo")
    supremum = maximise(lambda b: log_likelihood([pairs[0]], {"a": 0.0, "b": b}), -2000, 2000)

    def deviance(r):
        return 2 * (supremum - maximise(lambda b: log_likelihood(pairs, {"gnugo": 0.0, "a": r, "b": b}),
                                        -3000, 3000))

    a = fit.ratings["a"]
    assert a.elo == -math.inf and a.low == -math.inf
    assert a.high == pytest.approx(crossing(deviance, -3000, 0, SHUTOUT_DEVIANCE_95), abs=1e-5)
    # 20 lost games bound the pair tighter than a's own 10 would.
    assert a.high < -elo_gap(0.025 ** (1 / 10))


def test_a_player_that_neither_beat_nor_lost_to_the_anchor_through_anyone_has_no_estimate():
    """a and b each beat random 10-0 and never met: the games say nothing about b - a."""
    fit = fit_ratings([PairRecord("a", "random", 10, 10), PairRecord("b", "random", 10, 10)], "a")
    b = fit.ratings["b"]
    assert math.isnan(b.elo) and (b.low, b.high) == (-math.inf, math.inf) and b.estimate_text() == "?"
    assert fit.ratings["random"].elo == -math.inf


def test_win_groups_and_the_anchor_rule():
    """The preferred anchor when a rating against it is finite; else the candidate with the largest
    mutual-win group; with every pairing a shut-out, the preferred one stays."""
    ladder = [PairRecord("playouts", "random", 10, 10), PairRecord("gnugo:1", "playouts", 10, 10),
              PairRecord("gen:1", "random", 10, 10), PairRecord("gen:1", "playouts", 10, 7),
              PairRecord("gen:2", "playouts", 10, 9), PairRecord("gen:2", "gen:1", 10, 6),
              PairRecord("gen:1", "gnugo:1", 10, 0), PairRecord("gen:2", "gnugo:1", 10, 0)]
    assert win_groups(ladder) == [{"gen:1", "gen:2", "playouts"}, {"gnugo:1"}, {"random"}]
    assert win_groups(ladder, prior_draws=2) == [{"gen:1", "gen:2", "playouts", "gnugo:1", "random"}]
    anchor, why = choose_anchor(ladder, "gnugo:1", ["random", "playouts", "gnugo:1"])
    assert anchor == "playouts" and "gnugo:1 is alone in its mutual-win group" in why
    assert choose_anchor(ladder, "gnugo:5", ["random", "playouts"])[1].startswith("playouts (gnugo:5 has no games")
    assert choose_anchor(ladder, "gnugo:1", ["random", "playouts"], prior_draws=2)[0] == "gnugo:1"
    closer = ladder + [PairRecord("gen:2", "gnugo:1", 10, 1)]
    assert choose_anchor(closer, "gnugo:1", ["random", "playouts", "gnugo:1"])[0] == "gnugo:1"
    shut_outs = [PairRecord("gnugo:1", "random", 10, 10), PairRecord("gnugo:5", "gnugo:1", 10, 10)]
    assert choose_anchor(shut_outs, "gnugo:1", ["random", "gnugo:1", "gnugo:5"])[0] == "gnugo:1"


def test_the_prior_option_and_bad_options():
    fit = fit_ratings([PairRecord("a", "random", 10, 10)], prior_draws=2.0)
    assert fit.ratings["a"].finite and fit.prior_draws == 2.0
    assert "2 virtual draws" in fit.method_text() and "profile-likelihood" in fit.method_text()
    assert "no prior" in fit_ratings([PairRecord("a", "random", 10, 10)]).method_text()
    with pytest.raises(ValueError, match="prior_draws"):
        fit_ratings([], prior_draws=-1)
    with pytest.raises(ValueError, match="interval must be one of"):
        fit_ratings([], interval="bootstrap")
