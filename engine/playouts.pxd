# cython: language_level=3
"""C-level contract of `engine/playouts.pyx`: playout evaluators and the judge of dead stones."""
from libc.stdint cimport int8_t, int32_t, uint64_t

from engine.board cimport Board

# ---- per-point verdicts of `judge_stones` (0 = empty point) ----
cdef enum:
    STONE_ALIVE = 1
    STONE_DEAD = 2
    STONE_SEKI = 3

cdef void ownership_totals(Board board, Board scratch, int num_playouts, uint64_t* rng_state,
                           int32_t* totals) noexcept nogil
# Adds to totals [N*N] the Tromp-Taylor owner (+1/-1/0) of every point at
# the end of `num_playouts` random playouts from `board`, each played on
# `scratch` (same size and move cap as `board`, overwritten).

cdef void judge_stones(Board position, Board flipped, Board probe, Board scratch, int num_playouts,
                       uint64_t seed, int8_t* status) noexcept nogil
# status [N*N]: 0 on empty points, else STONE_ALIVE / STONE_DEAD / STONE_SEKI
# for the stones of `position` (`stone_statuses` says how).  `flipped`: the
# same stones with the other colour to move; `probe` and `scratch`: boards
# of the same size and move cap, overwritten.
