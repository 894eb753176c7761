# cython: language_level=3
"""Evaluators built on random playouts, and positions read back from network input planes.

Everything here drives `engine.board.Board` (its cdef interface,
engine/board.pxd) from outside the GIL: each function takes a position (a
board, or a batch of network input planes), plays it out many times on a
scratch copy with `Board.playout`, and averages.

* `playout_ownership`: mean Tromp-Taylor ownership of a board (the shuffle
  job's label for a resigned game without a model: pipeline.labels).
* `playout_values`: the value of each position of a batch of planes for its
  side to move (generation 0's evaluator: inference.loading.PlayoutEvaluator).
* `positions_from_planes`: the stones and side to move that planes encode,
  the one reading `playout_values` rebuilds each leaf with.
* `run_playouts`: the unit bench/board.py times.

Seeds are explicit (xorshift64*, engine/rng.pxd), so every result is
deterministic for a given seed.
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t

cimport cython
import numpy as np

from format.planes cimport COLOUR_PLANE, COLOUR_PLANE_SIDE, OPPONENT_STONES, OWN_STONES
from engine.board cimport MAX_SIZE, Board
from engine.board import check_board_size
from engine.rng cimport rng_seed


def playout_ownership(Board board not None, int num_playouts, uint64_t seed):
    """Mean Tromp-Taylor ownership over `num_playouts` random playouts.

    Returns float32[N*N] in [-1, 1]; `board` is left unchanged (each playout
    runs on a scratch copy).  Deterministic for a given seed."""
    if num_playouts <= 0:
        raise ValueError(f"num_playouts must be positive, got {num_playouts}")
    cdef Board scratch = Board(board.N, board.komi_, board.max_moves_)
    cdef int N2 = board.num_points
    totals = np.zeros(N2, dtype=np.int32)
    cdef int32_t[::1] tot = totals
    cdef int8_t owner[MAX_SIZE * MAX_SIZE]
    cdef uint64_t state = rng_seed(seed)
    cdef int i, p
    with nogil:
        for i in range(num_playouts):
            scratch.copy_from(board)
            scratch.playout(&state)
            scratch.ownership_ptr(owner)
            for p in range(N2):
                tot[p] += owner[p]
    return (totals / np.float32(num_playouts)).astype(np.float32)


def run_playouts(Board board not None, int num_playouts, uint64_t seed):
    """Benchmark unit: `num_playouts` playouts from `board` (left unchanged).

    Returns the total number of moves played."""
    cdef Board scratch = Board(board.N, board.komi_, board.max_moves_)
    cdef uint64_t state = rng_seed(seed)
    cdef int64_t moves = 0
    cdef int i
    with nogil:
        for i in range(num_playouts):
            scratch.copy_from(board)
            moves += scratch.playout(&state)
    return moves


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _position_from_planes(const float[:, :, :, ::1] planes, int row, int8_t* stones) noexcept nogil:
    """Row ``row``'s position at t into flat ``stones`` [N*N] (+1 Black / -1 White); returns the side to move.

    Reads the newest own and opponent stones and the colour plane (all ones
    when Black, COLOUR_PLANE_SIDE, moves): format/planes.py's layout."""
    cdef int n = planes.shape[1]
    cdef int to_play = COLOUR_PLANE_SIDE if planes[row, 0, 0, COLOUR_PLANE] > 0.5 else -COLOUR_PLANE_SIDE
    cdef int p, own, other
    for p in range(n * n):
        own = planes[row, p // n, p % n, OWN_STONES] > 0.5
        other = planes[row, p // n, p % n, OPPONENT_STONES] > 0.5
        stones[p] = <int8_t>((own - other) * to_play)
    return to_play


def _check_planes(const float[:, :, :, ::1] planes):
    """Refuse planes that are not network input [B, N, N, 17] of a supported board size."""
    cdef int n = planes.shape[1]
    if planes.shape[2] != n or planes.shape[3] != COLOUR_PLANE + 1:
        raise ValueError(f"planes must be [B, N, N, {COLOUR_PLANE + 1}], got "
                         f"{tuple([planes.shape[i] for i in range(4)])}")
    check_board_size(n)


def positions_from_planes(const float[:, :, :, ::1] planes not None):
    """(int8 [B, N, N] stones, int8 [B] side to move) that network input planes encode.

    The reading `playout_values` rebuilds each leaf with (one routine for
    both), exposed so that it can be checked against the games' boards."""
    cdef int rows = planes.shape[0]
    cdef int n = planes.shape[1]
    _check_planes(planes)
    stones = np.zeros((rows, n, n), dtype=np.int8)
    to_play = np.zeros(rows, dtype=np.int8)
    cdef int8_t[:, :, ::1] out = stones
    cdef int8_t[::1] sides = to_play
    cdef int row
    for row in range(rows):
        sides[row] = <int8_t>_position_from_planes(planes, row, &out[row, 0, 0])
    return stones, to_play


@cython.boundscheck(False)
@cython.wraparound(False)
def playout_values(const float[:, :, :, ::1] planes not None, double komi, int playouts, uint64_t seed):
    """float32[B]: each position's value from random playouts, for the side to move.

    `planes` is network input, float32 [B, N, N, 17] (format/planes.py).  Each
    row's position is rebuilt from its newest stones and its colour plane (so
    superko history before it is not seen), then played out `playouts` times
    on a scratch copy; a playout scores +1 when the side to move wins under
    Tromp-Taylor with `komi`, -1 when it loses, 0 on a tie.  The value is
    their mean.  A row whose stones are not a position (a chain without a
    liberty) gets 0.  The whole batch runs outside the GIL, so the search
    thread keeps working; deterministic for a given seed.  This is the value
    of `inference.loading.PlayoutEvaluator` (pure Monte-Carlo, and the
    evaluator of generation 0).
    """
    cdef int rows = planes.shape[0]
    cdef int n = planes.shape[1]
    _check_planes(planes)
    if playouts <= 0:
        raise ValueError(f"playouts must be positive, got {playouts}")
    values = np.zeros(rows, dtype=np.float32)
    if rows == 0:
        return values
    cdef float[::1] out = values
    cdef Board position = Board(n, komi)
    cdef Board scratch = Board(n, komi)
    cdef int8_t stones[MAX_SIZE * MAX_SIZE]
    cdef uint64_t state = rng_seed(seed)
    cdef int row, k, to_play
    cdef double total, score
    with nogil:
        for row in range(rows):
            to_play = _position_from_planes(planes, row, stones)
            if position._load_stones(stones, to_play) >= 0:
                continue
            total = 0.0
            for k in range(playouts):
                scratch.copy_from(position)
                scratch.playout(&state)
                score = scratch.area_score_c()
                if score > 0:
                    total += to_play
                elif score < 0:
                    total -= to_play
            out[row] = <float>(total / playouts)
    return values
