"""model.sgd's targets and diagnostics.

* The wdl head's target for a fractional (merged) value is a fractional
  win/loss distribution whose expectation is the value, not the class
  ``round(1 - v)`` (which made every |v| < 0.5 a certain draw: a learning
  bug, pinned by a test that failed before its fix).
* The occupied-policy-mass diagnostic.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from format import schema
from model.config import NetworkConfig
from model.sgd import DRAW, LOSS, WIN, head_losses, occupied_mass, wdl_target


def test_wdl_targets_keep_the_value_of_merged_positions():
    values = np.array([1.0, -1.0, 0.5, 0.2, -0.6, 0.0], np.float32)
    decisive = wdl_target(values, draws_possible=False).numpy()
    np.testing.assert_allclose(decisive, [[1, 0, 0], [0, 0, 1], [0.75, 0, 0.25], [0.6, 0, 0.4],
                                          [0.2, 0, 0.8], [0.5, 0, 0.5]], atol=1e-6)
    with_draws = wdl_target(values, draws_possible=True).numpy()
    np.testing.assert_allclose(with_draws[:5], decisive[:5], atol=1e-6)
    np.testing.assert_allclose(with_draws[5], [0, 1, 0])  # an exact 0 is a drawn game
    for target in (decisive, with_draws):
        np.testing.assert_allclose(target.sum(axis=1), 1.0, atol=1e-6)
        np.testing.assert_allclose(target[:, WIN] - target[:, LOSS], values, atol=1e-6)


def test_the_wdl_loss_is_smallest_at_the_merged_distribution():
    """A merged value of 0.2 (3 wins, 2 losses) is learnt as 60/40, not as a certain draw."""
    n = 5
    net = NetworkConfig(board_size=n, blocks=1, filters=4, value_head="wdl")
    batch = {
        "policy": tf.one_hot([0], n * n + 1), "value": tf.constant([0.2]), "score": tf.constant([0.0]),
        "ownership": tf.zeros([1, n * n]), "planes": tf.zeros([1, n, n, schema.BASIC_INPUT_PLANES]),
        "policy_weight": tf.constant([1.0]), "value_weight": tf.constant([1.0]),
        "ownership_weight": tf.constant([0.0]), "score_weight": tf.constant([0.0]),
    }

    def value_loss(probabilities):
        outputs = {"policy_logits": tf.zeros([1, n * n + 1]), "value": tf.constant([0.0]),
                   "value_logits": tf.math.log(tf.constant([probabilities], tf.float32)),
                   "ownership_logits": tf.zeros([1, n * n]), "score": tf.constant([0.0])}
        return float(head_losses(outputs, batch, net)["value_loss_sum"])

    merged = value_loss([0.6, 1e-6, 0.4 - 1e-6])
    assert merged == pytest.approx(-(0.6 * math.log(0.6) + 0.4 * math.log(0.4)), rel=1e-4)
    assert merged < value_loss([0.1, 0.8, 0.1]) and merged < value_loss([0.8, 1e-6, 0.2 - 1e-6])
    assert DRAW == 1


def test_occupied_mass_counts_both_colours_and_never_pass():
    n = 5
    planes = np.zeros((2, n, n, schema.BASIC_INPUT_PLANES), np.float32)
    planes[0, 0, 0, 0] = 1.0            # own stone now
    planes[0, 1, 1, 8] = 1.0            # opponent stone now
    planes[0, 2, 2, 1] = 1.0            # an own stone one move ago only: the point is empty now
    planes[:, :, :, 16] = 1.0           # colour plane: not a stone
    logits = np.zeros((2, n * n + 1), np.float32)
    logits[1, n * n] = 50.0             # the second position passes with near certainty
    planes[1, :, :, 0] = 1.0            # a full board
    mass = occupied_mass(tf.constant(logits), tf.constant(planes)).numpy()
    assert mass[0] == pytest.approx(2 / (n * n + 1))
    assert mass[1] == pytest.approx(0.0, abs=1e-6)
