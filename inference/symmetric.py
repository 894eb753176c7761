"""An evaluator that sees each position under a random board symmetry.

A network is not exactly symmetric: its policy and value for a position and for the position turned
or mirrored differ a little, and a search that always asks in one orientation keeps that bias.
`RandomSymmetryEvaluator` wraps any evaluator (`inference.evaluator.Evaluator`): for each row of a
batch it draws one of the 8 symmetries (format/symmetry.py), evaluates the transformed planes, and
maps the policy logits back, so the search sees the original position's actions:

    planes [B, N, N, C] --k[b] ~ U{0..7}--> sym_k(planes) --inner--> logits' [B, A], values [B]
    logits[b, a] = logits'[b, perm[k[b]][a]]        (perm: where action a goes under k; pass stays)

Values need no mapping (a symmetry changes no result).  The draws come from the wrapper's own seeded
generator, so a seeded game stays reproducible.
"""

from __future__ import annotations

import numpy as np

from format.symmetry import NUM_SYMMETRIES, apply_symmetry_nhwc, symmetry_permutations


class RandomSymmetryEvaluator:
    """``inner`` evaluated on each row under a random symmetry (module docstring); every other
    attribute (``generation``, ``input_planes``, ``close`` ...) is the inner evaluator's."""

    def __init__(self, inner, board_size: int, seed: int):
        self.inner = inner
        self.perm = symmetry_permutations(board_size)
        self.rng = np.random.default_rng(seed)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, planes: np.ndarray):
        ks = self.rng.integers(0, NUM_SYMMETRIES, len(planes))
        turned = np.empty_like(planes)
        for k in np.unique(ks).tolist():
            rows = ks == k
            turned[rows] = apply_symmetry_nhwc(planes[rows], k)
        logits, values = self.inner(turned)
        return np.take_along_axis(np.asarray(logits), self.perm[ks], axis=1), values
