"""RandomSymmetryEvaluator: each row evaluated under a drawn symmetry, its policy read back in the
position's own orientation."""
from __future__ import annotations

import numpy as np

from engine.board import Board
from format.symmetry import apply_symmetry_nhwc, symmetry_permutations
from inference.symmetric import RandomSymmetryEvaluator

N = 9


class PointsAtStones:
    """A deliberately asymmetric 'network': each point's logit is the first plane there plus a
    tilt towards the top-left corner; the value reads the bottom-right stone."""

    generation = 7
    input_planes = 17

    def __init__(self):
        self.calls = []
        self.tilt = -np.arange(N * N, dtype=np.float32) / 100.0

    def __call__(self, planes):
        self.calls.append(planes.copy())
        logits = np.concatenate([planes[..., 0].reshape(len(planes), -1) + self.tilt,
                                 np.zeros((len(planes), 1), np.float32)], axis=1)
        return logits, planes[:, N - 1, N - 1, 0].astype(np.float32)


def _positions(count: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        board = Board(N, 7.5)
        for _ in range(int(rng.integers(3, 15))):
            legal = np.flatnonzero(board.legal_mask()[:-1])
            board.play(int(rng.choice(legal)))
        out.append(board.features(17))
    return np.stack(out)


def test_each_row_is_evaluated_under_its_symmetry_and_its_policy_mapped_back():
    inner = PointsAtStones()
    wrapped = RandomSymmetryEvaluator(inner, N, seed=3)
    planes = _positions(64)
    logits, values = wrapped(planes)
    turned = inner.calls[0]
    perm = symmetry_permutations(N)
    seen = set()
    for row in range(len(planes)):
        # Which symmetry turned this row: exactly one maps the planes onto what the inner evaluator saw.
        matches = [k for k in range(8) if np.array_equal(apply_symmetry_nhwc(planes[row], k), turned[row])]
        assert matches
        k = matches[0]
        seen.add(k)
        # The stones' part of each point's logit is the position's own stone there, whatever the turn;
        # the tilt is the turned point's (where the point went).
        assert np.allclose(logits[row, :N * N] - inner.tilt[perm[k][:N * N]], planes[row, ..., 0].ravel())
        assert values[row] == turned[row, N - 1, N - 1, 0]
    assert len(seen) >= 6                      # 64 draws: nearly every symmetry appears
    assert logits[:, N * N].tolist() == [0.0] * len(planes)      # pass stays pass
    assert wrapped.generation == 7 and wrapped.input_planes == 17


def test_the_draws_are_the_seeds():
    planes = _positions(16)
    a = RandomSymmetryEvaluator(PointsAtStones(), N, seed=5)(planes)[0]
    b = RandomSymmetryEvaluator(PointsAtStones(), N, seed=5)(planes)[0]
    c = RandomSymmetryEvaluator(PointsAtStones(), N, seed=6)(planes)[0]
    assert np.array_equal(a, b) and not np.array_equal(a, c)
