# cython: language_level=3
"""Evaluators built on random playouts, and positions read back from network input planes.

Everything here drives `engine.board.Board` (its cdef interface,
engine/board.pxd) from outside the GIL: each function takes a position (a
board, or a batch of network input planes), plays it out many times on a
scratch copy with `Board.playout`, and averages.

* `playout_ownership`: mean Tromp-Taylor ownership of a board (the shuffle
  job's label for a resigned game without a model: pipeline.labels).
* `stone_statuses`: which stones are alive, dead or in seki (GTP's
  final_status_list), seki by the rules and death by `playout_ownership`.
* `playout_values`: the value of each position of a batch of planes for its
  side to move (generation 0's evaluator: inference.loading.PlayoutEvaluator).
* `positions_from_planes`: the stones and side to move that planes encode,
  the one reading `playout_values` rebuilds each leaf with.
* `run_playouts`: the unit bench/board.py times.

Seeds are explicit (xorshift64*, engine/rng.pxd), so every result is
deterministic for a given seed.
"""
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memset

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
    totals = np.zeros(board.num_points, dtype=np.int32)
    cdef int32_t[::1] tot = totals
    cdef uint64_t state = rng_seed(seed)
    with nogil:
        ownership_totals(board, scratch, num_playouts, &state, &tot[0])
    return (totals / np.float32(num_playouts)).astype(np.float32)


cdef void ownership_totals(Board board, Board scratch, int num_playouts, uint64_t* rng_state,
                           int32_t* totals) noexcept nogil:
    cdef int8_t owner[MAX_SIZE * MAX_SIZE]
    cdef int i, p
    for i in range(num_playouts):
        scratch.copy_from(board)
        scratch.playout(rng_state)
        scratch.ownership_ptr(owner)
        for p in range(board.num_points):
            totals[p] += owner[p]


DEAD_STONE_PLAYOUTS = 400
"""Random playouts behind `stone_statuses`' verdict of dead chains (docs/measured.md, "Dead stones")."""

STATUS_ALIVE, STATUS_DEAD, STATUS_SEKI = STONE_ALIVE, STONE_DEAD, STONE_SEKI
"""`stone_statuses`' verdicts (0 marks an empty point)."""


def stone_statuses(Board board not None, int num_playouts=DEAD_STONE_PLAYOUTS, uint64_t seed=0):
    """int8[N*N]: 0 on empty points, else STATUS_ALIVE / STATUS_DEAD / STATUS_SEKI.

    The one judge of which stones are dead (GTP's final_status_list); the
    score stays the rules' Tromp-Taylor count of the board as it stands.
    Seki first: a chain touching a *seki point*, an empty point that
    Tromp-Taylor leaves neutral, next to a stone, where neither colour can
    play without suicide or leaving the played chain in atari (shared
    liberties; dame between living walls are not).  Then dead: a chain whose
    points the random playouts of `playout_ownership`, from the stones alone
    with `board`'s side to move, give to the other colour more often than to
    its own, summed over the chain.  A finished game (two passes) is played
    on: a dead chain is captured in most playouts, a chain with two eyes
    never.  `board` is unchanged; deterministic for a given seed."""
    if num_playouts <= 0:
        raise ValueError(f"num_playouts must be positive, got {num_playouts}")
    cdef int8_t[::1] stones = np.ascontiguousarray(board.stones(), dtype=np.int8).reshape(-1)
    cdef Board position = Board(board.N, board.komi_)
    cdef Board flipped = Board(board.N, board.komi_)
    cdef Board probe = Board(board.N, board.komi_)
    cdef Board scratch = Board(board.N, board.komi_)
    status = np.zeros(board.num_points, dtype=np.int8)
    cdef int8_t[::1] out = status
    cdef int to_play = board.st.to_play
    with nogil:
        # The stones of a board always load: every chain on it has a liberty.
        position._load_stones(&stones[0], to_play)
        flipped._load_stones(&stones[0], -to_play)
        judge_stones(position, flipped, probe, scratch, num_playouts, seed, &out[0])
    return status


cdef void judge_stones(Board position, Board flipped, Board probe, Board scratch, int num_playouts,
                       uint64_t seed, int8_t* status) noexcept nogil:
    cdef int16_t label[MAX_SIZE * MAX_SIZE]       # chain label of each point (-1: empty)
    cdef int8_t owner[MAX_SIZE * MAX_SIZE]
    cdef int32_t totals[MAX_SIZE * MAX_SIZE]      # playout ownership, summed over the playouts
    cdef int64_t chain_total[MAX_SIZE * MAX_SIZE]  # by chain label: totals summed over the chain
    cdef uint8_t in_seki[MAX_SIZE * MAX_SIZE]     # by chain label: touches a seki point
    cdef int N2 = position.num_points
    cdef int S = position.stride
    cdef int8_t* color = position.color
    cdef int p, v, k, n, living = 0
    cdef bint near_stone
    cdef uint64_t state
    position.chain_labels_ptr(label)
    position.ownership_ptr(owner)
    memset(in_seki, 0, N2)
    for p in range(N2):
        v = position.to_padded[p]
        if color[v] != 0 or owner[p] != 0:
            continue
        near_stone = False
        for k in range(4):
            n = v - S if k == 0 else (v - 1 if k == 1 else (v + 1 if k == 2 else v + S))
            near_stone = near_stone or color[n] == 1 or color[n] == -1
        if not near_stone or position.fills_safely(p, probe) or flipped.fills_safely(p, probe):
            continue
        for k in range(4):
            n = v - S if k == 0 else (v - 1 if k == 1 else (v + 1 if k == 2 else v + S))
            if color[n] == 1 or color[n] == -1:
                in_seki[label[position.to_flat[n]]] = 1
    for p in range(N2):
        if label[p] < 0:
            status[p] = 0
        elif in_seki[label[p]]:
            status[p] = STONE_SEKI
        else:
            status[p] = STONE_ALIVE
            living += 1
    if living == 0:
        return
    memset(totals, 0, N2 * sizeof(int32_t))
    memset(chain_total, 0, N2 * sizeof(int64_t))
    state = rng_seed(seed)
    ownership_totals(position, scratch, num_playouts, &state, totals)
    for p in range(N2):
        if label[p] >= 0:
            chain_total[label[p]] += totals[p]
    for p in range(N2):
        if status[p] == STONE_ALIVE and chain_total[label[p]] * color[position.to_padded[p]] < 0:
            status[p] = STONE_DEAD


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
