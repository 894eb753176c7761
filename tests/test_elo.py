"""selfplay.elo: the maximum-likelihood Bradley-Terry fit against hand-computed cases."""
import math

import pytest

from selfplay.elo import ELO_PER_NAT, PairRecord, elo_gap, expected_score, fit_ratings, merge_pairs


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


def test_the_interval_is_the_inverse_hessian_of_one_pair():
    """One pair, no prior: the standard error is 1 / sqrt(n p (1 - p)) nats."""
    fit = fit_ratings([PairRecord("a", "random", 40, 30)], prior_draws=0.0)
    se = ELO_PER_NAT / math.sqrt(40 * 0.75 * 0.25)
    rating = fit.ratings["a"]
    assert rating.high - rating.elo == pytest.approx(1.959963984540054 * se, rel=1e-6)
    assert rating.elo - rating.low == pytest.approx(rating.high - rating.elo)
    assert fit.ratings["random"].low == fit.ratings["random"].high == 0.0


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
