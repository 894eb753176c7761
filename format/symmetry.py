"""The 8 dihedral symmetries of the Go board, for planes and policy vectors.

Pure numpy, no engine import: the trainer's input pipeline (model.tfdata), the tests and the test
data use it.  Conventions (format/schema.py): a point is ``p = row * N + col`` with row 0 the top
edge; actions are ``0 .. N*N`` with ``PASS = N*N``.

Symmetry ``k`` (0..7) acts on ``a[row, col]`` in this order: if ``k & 4`` transpose; if ``k & 1``
flip rows (``r -> N-1-r``); if ``k & 2`` flip columns.  ``k = 0`` is the identity, 1-3 the two
mirrors and the 180-degree rotation (self-inverse), 5 and 6 the 90-degree rotations (each other's
inverse), 4 and 7 the diagonal mirrors.

Tables: ``perm = symmetry_permutations(N)``, int32 ``[8, N*N + 1]``: ``perm[k][p]`` is *where
point p goes* under k (``perm[k][PASS] == PASS``), for planes and for policies alike
(``apply_symmetry_to_policy(pi, k)[perm[k][a]] == pi[a]``).  ``INVERSE[k]`` undoes k, and
``inverse_permutations(N)[k] == perm[INVERSE[k]]``.  The round trips are tested in
tests/engine/test_board_properties.py.
"""

import functools

import numpy as np

NUM_SYMMETRIES = 8

INVERSE = (0, 1, 2, 3, 4, 6, 5, 7)
"""INVERSE[k] undoes symmetry k (the two quarter turns, 5 and 6, swap)."""


def _check_k(k):
    if not 0 <= int(k) < NUM_SYMMETRIES:
        raise ValueError(f"symmetry index must be in 0..7, got {k!r}")
    return int(k)


def apply_symmetry_to_planes(planes, k):
    """Transform the last two axes ``[..., N, N]`` (rows, cols) by symmetry k."""
    k = _check_k(k)
    x = np.asarray(planes)
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"planes must end with two equal board axes [..., N, N], got shape {x.shape}")
    if k & 4:
        x = np.swapaxes(x, -1, -2)
    if k & 1:
        x = x[..., ::-1, :]
    if k & 2:
        x = x[..., :, ::-1]
    return np.ascontiguousarray(x)


def apply_symmetry_nhwc(planes, k):
    """Transform a channels-last array ``[..., N, N, C]`` by symmetry k
    (the network input layout, one position or a batch)."""
    x = np.asarray(planes)
    if x.ndim < 3 or x.shape[-2] != x.shape[-3]:
        raise ValueError(f"NHWC planes must be [..., N, N, C], got shape {x.shape}")
    moved = np.moveaxis(x, -1, 0)  # [C, ..., N, N]
    return np.ascontiguousarray(np.moveaxis(apply_symmetry_to_planes(moved, k), 0, -1))


@functools.lru_cache(maxsize=None)
def _permutations(board_size):
    n2 = board_size * board_size
    grid = np.arange(n2, dtype=np.int32).reshape(board_size, board_size)
    perm = np.empty((NUM_SYMMETRIES, n2 + 1), dtype=np.int32)
    for k in range(NUM_SYMMETRIES):
        moved = apply_symmetry_to_planes(grid, k).reshape(-1)  # moved[q] = point that lands on q
        perm[k, moved] = np.arange(n2, dtype=np.int32)
        perm[k, n2] = n2
    perm.flags.writeable = False
    return perm


def symmetry_permutations(board_size):
    """int32 [8, N*N + 1]; perm[k][p] = where action p goes under symmetry k."""
    if not isinstance(board_size, (int, np.integer)) or board_size < 1:
        raise ValueError(f"board size must be a positive int, got {board_size!r}")
    return _permutations(int(board_size))


def inverse_permutations(board_size):
    """int32 [8, N*N + 1]; inv[k][perm[k][p]] == p."""
    perm = symmetry_permutations(board_size)
    return perm[list(INVERSE)]


def apply_symmetry_to_policy(policy, k):
    """Transform action-indexed values ``[..., N*N + 1]`` (pass last, fixed)."""
    k = _check_k(k)
    x = np.asarray(policy)
    n2 = x.shape[-1] - 1
    size = int(round(n2**0.5))
    if size * size != n2:
        raise ValueError(f"policy must end with N*N + 1 actions, got {x.shape[-1]}")
    out = np.empty_like(x)
    out[..., symmetry_permutations(size)[k]] = x
    return out
