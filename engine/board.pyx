# cython: language_level=3
"""The Go rules engine: board, legality, scoring, features and the random playout.

Rules (format/schema.py's RULES_TROMP_TAYLOR): Tromp-Taylor area scoring with komi, positional
superko, suicide illegal; the game ends after two consecutive passes or at the move cap.
* *move / action*: ``p = row * N + col`` (row 0 the *top* edge) or ``PASS = N * N``; never text.
* *chain*: connected stones of one colour; each stone stores its chain's root (`chain_id`) and the
  next stone of a circular list (`chain_next`), so a merge relabels only the smaller chain.
* *pseudo-liberties*: per chain ``libs`` (stone, empty neighbour) pairs, and ``lib_sum`` /
  ``lib_sum2`` the sum and sum of squares of those points, O(1) to update: ``libs == 0`` is
  "captured", ``libs * lib_sum2 == lib_sum**2`` is "in atari" (Cauchy-Schwarz).
* *position hash*: 64-bit Zobrist hash of the stones only, fixed-seed keys (the same in every
  process); the empty board is EMPTY_BOARD_HASH, not 0.
Copy, not undo: search refreshes a scratch board with `copy_from`, a fixed-size memcpy; the
superko history (HashLog) is owned by the constructed board and shared read-only by its copies, so
don't play on an owner while other threads search from copies of it.  A ring of the last
HISTORY_LENGTH boards gives the input planes of format/planes.py (constants: format/planes.pxd).
Random playouts (`Board.playout`; evaluators in `engine.playouts`) play uniformly over legal moves
that fill no own single-point eye, with xorshift64* (engine/rng.pxd) seeded explicitly.
"""
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset

cimport cython
import numpy as np

from format.schema import DEFAULT_KOMI  # the lake format owns the default komi
cimport numpy as cnp

from format.planes cimport (BASIC_INPUT_PLANES, COLOUR_PLANE, COLOUR_PLANE_SIDE, LEGAL, LIBERTIES_1, ON_BOARD,
                            OPPONENT_STONES, OWN_STONES)
from engine.rng cimport rng_below, rng_seed, splitmix64

cnp.import_array()

cdef extern from *:
    """
    #ifndef ZEROLAKE_BOUNDSCHECK
    #define ZEROLAKE_BOUNDSCHECK 0
    #endif
    static inline int zl_atomic_add(int *p, int delta) {
        return __atomic_add_fetch(p, delta, __ATOMIC_SEQ_CST);
    }
    """
    const int ZEROLAKE_BOUNDSCHECK
    int zl_atomic_add(int* p, int delta) noexcept nogil

BOUNDSCHECK = bool(ZEROLAKE_BOUNDSCHECK)
"""True when this extension was built with ZEROLAKE_BOUNDSCHECK=1 (slow)."""

BLACK_STONE = 1
WHITE_STONE = -1

MOVE_STATUS_NAMES = {
    MOVE_OK: "ok",
    MOVE_OFF_BOARD: "off-board",
    MOVE_OCCUPIED: "occupied",
    MOVE_SUICIDE: "suicide",
    MOVE_SUPERKO: "superko",
    MOVE_GAME_OVER: "game over",
}
"""Status code of `play_move`/`check_move` -> the reason IllegalMove gives."""


class IllegalMove(ValueError):
    """A move the rules forbid.  `reason` is one of MOVE_STATUS_NAMES' values;
    the board it was tried on is unchanged."""

    def __init__(self, message, reason, move):
        super().__init__(message)
        self.reason = reason
        self.move = move


# ---- Zobrist keys, indexed by padded point ------------------------------
cdef uint64_t ZOBRIST_BLACK[MAX_PADDED]
cdef uint64_t ZOBRIST_WHITE[MAX_PADDED]
cdef uint64_t EMPTY_HASH
cdef uint64_t ZOBRIST_SEED_C = 0x5A45524F4C414B45  # "ZEROLAKE"
ZOBRIST_SEED = ZOBRIST_SEED_C


cdef void _init_zobrist() noexcept nogil:
    global EMPTY_HASH
    cdef uint64_t state = ZOBRIST_SEED_C
    cdef int i
    for i in range(MAX_PADDED):
        ZOBRIST_BLACK[i] = splitmix64(&state)
        ZOBRIST_WHITE[i] = splitmix64(&state)
    EMPTY_HASH = splitmix64(&state) | 1


_init_zobrist()
EMPTY_BOARD_HASH = EMPTY_HASH
"""Hash of a board with no stones (any size)."""


cdef inline uint64_t zkey(int v, int c) noexcept nogil:
    return ZOBRIST_BLACK[v] if c == 1 else ZOBRIST_WHITE[v]


def zobrist_key(int board_size, int point, int color):
    """Zobrist key XORed into the hash by a stone of `color` at flat `point`.

    Lets tests recompute a hash from scratch: EMPTY_BOARD_HASH ^ key(stone)...
    """
    check_board_size(board_size)
    if not 0 <= point < board_size * board_size or color not in (1, -1):
        raise ValueError(f"no Zobrist key for point {point} colour {color} on {board_size}x{board_size}")
    cdef int stride = board_size + 2
    cdef int v = (point // board_size + 1) * stride + point % board_size + 1
    return zkey(v, color)


def check_board_size(int size):
    """Refuse a board size the engine does not support (ValueError naming it)."""
    if not 5 <= size <= MAX_SIZE:
        raise ValueError(f"board size must be between 5 and {MAX_SIZE}, got {size}")


# ---- shared superko history ----------------------------------------------
cdef HashLog* _log_new(int capacity) noexcept nogil:
    cdef uint32_t table_size = 1
    while table_size < <uint32_t>(2 * capacity):
        table_size <<= 1
    cdef HashLog* log = <HashLog*>malloc(sizeof(HashLog))
    if log == NULL:
        return NULL
    log.refcount = 1
    log.length = 0
    log.capacity = capacity
    log.mask = table_size - 1
    log.seq = <uint64_t*>malloc(capacity * sizeof(uint64_t))
    log.table = <int32_t*>calloc(table_size, sizeof(int32_t))
    if log.seq == NULL or log.table == NULL:
        free(log.seq)
        free(log.table)
        free(log)
        return NULL
    return log


cdef void _log_release(HashLog* log) noexcept nogil:
    if log != NULL and zl_atomic_add(&log.refcount, -1) == 0:
        free(log.seq)
        free(log.table)
        free(log)


cdef void _log_append(HashLog* log, uint64_t h) noexcept nogil:
    # Caller guarantees h is not yet in the log (superko made it legal).
    if log.length >= log.capacity:
        return
    cdef uint32_t i = <uint32_t>h & log.mask
    while log.table[i] != 0:
        i = (i + 1) & log.mask
    log.seq[log.length] = h
    log.length += 1
    log.table[i] = log.length


cdef inline bint _in_atari_root(Board b, int r) noexcept nogil:
    cdef int64_t n = b.libs[r]
    cdef int64_t s = b.lib_sum[r]
    return n > 0 and n * <int64_t>b.lib_sum2[r] == s * s


@cython.final
cdef class Board:
    """A Go position plus the game state around it (see the module docstring).

    Board(size, komi=DEFAULT_KOMI, max_moves=0): an empty board, Black to play.
    ``max_moves=0`` means the default cap of 3 * size * size moves (passes
    count), which random games on 9x9 and 19x19 almost never reach.
    """

    def __cinit__(self, int size, double komi=DEFAULT_KOMI, int max_moves=0):
        check_board_size(size)
        if max_moves < 0:
            raise ValueError(f"max_moves must be >= 0 (0 = default 3*N*N), got {max_moves}")
        self.N = size
        self.stride = size + 2
        self.num_padded = self.stride * self.stride
        self.num_points = size * size
        self.max_moves_ = max_moves if max_moves > 0 else 3 * size * size
        self.komi_ = komi
        cdef int np_ = self.num_padded
        cdef size_t offset = 0
        cdef size_t o_sum, o_sum2, o_id, o_next, o_size, o_libs, o_epos, o_elist, o_color, o_hist
        # Layout of the copied block: widest fields first keeps them aligned.
        o_sum = offset
        offset += np_ * sizeof(int32_t)
        o_sum2 = offset
        offset += np_ * sizeof(int32_t)
        o_id = offset
        offset += np_ * sizeof(int16_t)
        o_next = offset
        offset += np_ * sizeof(int16_t)
        o_size = offset
        offset += np_ * sizeof(int16_t)
        o_libs = offset
        offset += np_ * sizeof(int16_t)
        o_epos = offset
        offset += np_ * sizeof(int16_t)
        o_elist = offset
        offset += self.num_points * sizeof(int16_t)
        o_color = offset
        offset += np_
        o_hist = offset
        offset += HISTORY * np_
        self.block_bytes = (offset + 63) & ~(<size_t>63)
        self.block = <char*>calloc(self.block_bytes, 1)
        self.to_padded = <int16_t*>PyMem_Malloc(self.num_points * sizeof(int16_t))
        self.to_flat = <int16_t*>PyMem_Malloc(np_ * sizeof(int16_t))
        cdef int capacity = self.max_moves_ + 2
        self.log = _log_new(capacity)
        self.owns_log = True
        self.local_seq = <uint64_t*>PyMem_Malloc(capacity * sizeof(uint64_t))
        cdef uint32_t table_size = 1
        while table_size < <uint32_t>(2 * capacity):
            table_size <<= 1
        self.local_table = <LocalEntry*>calloc(table_size, sizeof(LocalEntry))
        self.local_mask = table_size - 1
        self.local_stamp = 1
        if (self.block == NULL or self.to_padded == NULL or self.to_flat == NULL
                or self.log == NULL or self.local_seq == NULL or self.local_table == NULL):
            raise MemoryError("cannot allocate a Board")
        self.lib_sum = <int32_t*>(self.block + o_sum)
        self.lib_sum2 = <int32_t*>(self.block + o_sum2)
        self.chain_id = <int16_t*>(self.block + o_id)
        self.chain_next = <int16_t*>(self.block + o_next)
        self.chain_size = <int16_t*>(self.block + o_size)
        self.libs = <int16_t*>(self.block + o_libs)
        self.empty_pos = <int16_t*>(self.block + o_epos)
        self.empty_list = <int16_t*>(self.block + o_elist)
        self.color = <int8_t*>(self.block + o_color)
        self.hist = <int8_t*>(self.block + o_hist)
        self._reset()

    def __dealloc__(self):
        free(self.block)
        PyMem_Free(self.to_padded)
        PyMem_Free(self.to_flat)
        _log_release(self.log)
        PyMem_Free(self.local_seq)
        free(self.local_table)

    cdef void _reset_geometry_and_stones(self) noexcept nogil:
        cdef int v, p, row, col
        for v in range(self.num_padded):
            self.color[v] = BORDER
            self.to_flat[v] = -1
            self.chain_id[v] = 0
        for p in range(self.num_points):
            row = p // self.N
            col = p % self.N
            v = (row + 1) * self.stride + col + 1
            self.to_padded[p] = v
            self.to_flat[v] = p
            self.color[v] = 0
            self.empty_list[p] = v
            self.empty_pos[v] = p
        self.st.num_empty = self.num_points
        self.st.hash = EMPTY_HASH

    cdef void _reset(self) noexcept nogil:
        self._reset_geometry_and_stones()
        self.st.to_play = 1
        self.st.move_number = 0
        self.st.passes = 0
        self.st.over = 0
        self.st.last_move = -1
        self.st.local_len = 0
        self.log.length = 0
        _log_append(self.log, self.st.hash)
        self.st.log_len = self.log.length
        self.st.hist_valid = 0
        self._set_history_slot()

    # ------------------------------------------------------------------
    # C API
    # ------------------------------------------------------------------
    cdef bint _seen(self, uint64_t h) noexcept nogil:
        """Is `h` one of the positions of this board's game line?"""
        cdef HashLog* log = self.log
        cdef uint32_t i = <uint32_t>h & log.mask
        cdef int32_t entry
        while True:
            entry = log.table[i]
            if entry == 0:
                break
            if log.seq[entry - 1] == h:
                # At most one entry per hash; a later one is another line's.
                if entry <= self.st.log_len:
                    return True
                break
            i = (i + 1) & log.mask
        if self.st.local_len == 0:
            return False
        i = <uint32_t>h & self.local_mask
        while self.local_table[i].stamp == self.local_stamp:
            if self.local_table[i].hash == h:
                return True
            i = (i + 1) & self.local_mask
        return False

    cdef void _remember(self, uint64_t h) noexcept nogil:
        """Add the position just reached to the game line."""
        cdef uint32_t i
        if self.owns_log:
            _log_append(self.log, h)
            self.st.log_len = self.log.length
            return
        if self.st.local_len >= self.max_moves_ + 2:
            return
        self.local_seq[self.st.local_len] = h
        self.st.local_len += 1
        i = <uint32_t>h & self.local_mask
        while self.local_table[i].stamp == self.local_stamp:
            i = (i + 1) & self.local_mask
        self.local_table[i].hash = h
        self.local_table[i].stamp = self.local_stamp

    cdef void _rebuild_local_table(self) noexcept nogil:
        """Forget the private hash set in O(1) and refill it from local_seq."""
        cdef int k
        cdef uint32_t i
        cdef uint64_t h
        self.local_stamp += 1
        if self.local_stamp == 0:  # wrapped after 2**32 copies: really clear
            memset(self.local_table, 0, (self.local_mask + 1) * sizeof(LocalEntry))
            self.local_stamp = 1
        for k in range(self.st.local_len):
            h = self.local_seq[k]
            i = <uint32_t>h & self.local_mask
            while self.local_table[i].stamp == self.local_stamp:
                i = (i + 1) & self.local_mask
            self.local_table[i].hash = h
            self.local_table[i].stamp = self.local_stamp

    cdef int _check_padded(self, int v, int c, uint64_t* new_hash) noexcept nogil:
        """Legality of a stone of colour c at empty-or-not padded point v."""
        cdef int8_t* color = self.color
        if color[v] != 0:
            return MOVE_OCCUPIED
        cdef int S = self.stride
        cdef int nbrs[4]
        nbrs[0] = v - S
        nbrs[1] = v - 1
        nbrs[2] = v + 1
        nbrs[3] = v + S
        cdef uint64_t h = self.st.hash ^ zkey(v, c)
        cdef bint has_liberty = False
        cdef int captured[4]
        cdef int num_captured = 0
        cdef int k, j, n, col, r, s
        cdef bint dup
        for k in range(4):
            n = nbrs[k]
            col = color[n]
            if col == 0:
                has_liberty = True
            elif col == c:
                # A friendly chain not in atari has a liberty besides v.
                if not _in_atari_root(self, self.chain_id[n]):
                    has_liberty = True
            elif col == -c:
                r = self.chain_id[n]
                if _in_atari_root(self, r):  # its last liberty is v
                    dup = False
                    for j in range(num_captured):
                        if captured[j] == r:
                            dup = True
                    if not dup:
                        captured[num_captured] = r
                        num_captured += 1
                        s = r
                        while True:
                            h ^= zkey(s, -c)
                            s = self.chain_next[s]
                            if s == r:
                                break
        if not has_liberty and num_captured == 0:
            return MOVE_SUICIDE
        if self._seen(h):
            return MOVE_SUPERKO
        new_hash[0] = h
        return MOVE_OK

    cdef int check_move(self, int move, uint64_t* new_hash) noexcept nogil:
        if self.st.over:
            return MOVE_GAME_OVER
        if move < 0 or move > self.num_points:
            return MOVE_OFF_BOARD
        if move == self.num_points:
            new_hash[0] = self.st.hash
            return MOVE_OK
        return self._check_padded(self.to_padded[move], self.st.to_play, new_hash)

    cdef bint is_legal_move(self, int move) noexcept nogil:
        cdef uint64_t h
        return self.check_move(move, &h) == MOVE_OK

    cdef bint in_atari(self, int move) noexcept nogil:
        if move < 0 or move >= self.num_points:
            return False
        cdef int v = self.to_padded[move]
        if self.color[v] != 1 and self.color[v] != -1:
            return False
        return _in_atari_root(self, self.chain_id[v])

    cdef void chain_labels_ptr(self, int16_t* out) noexcept nogil:
        """[N*N]: each stone's chain label, the lowest flat point of its chain; -1 on empty points."""
        cdef int16_t first[MAX_PADDED]      # chain root -> its lowest flat point; -1 = not met yet
        cdef int p, v, r
        for v in range(self.num_padded):
            first[v] = -1
        for p in range(self.num_points):    # ascending, so a chain's first point met is its lowest
            v = self.to_padded[p]
            if self.color[v] != 1 and self.color[v] != -1:
                out[p] = -1
                continue
            r = self.chain_id[v]
            if first[r] < 0:
                first[r] = p
            out[p] = first[r]

    cdef bint fills_safely(self, int move, Board probe) noexcept nogil:
        # Played on `probe` (overwritten with a copy of self), so self is unchanged.
        if probe.copy_from(self) != 0 or probe.play_move(move) != MOVE_OK:
            return False
        return not probe.in_atari(move)

    cdef void _place(self, int v, int c) noexcept nogil:
        """Put a stone of colour c on empty point v; update chains and their
        pseudo-liberties, merging with friendly neighbours.  No captures."""
        cdef int S = self.stride
        cdef int nbrs[4]
        nbrs[0] = v - S
        nbrs[1] = v - 1
        nbrs[2] = v + 1
        nbrs[3] = v + S
        cdef int k, n, col, r, last, i
        self.color[v] = c
        self.st.hash ^= zkey(v, c)
        # Swap-remove v from the empty list.
        self.st.num_empty -= 1
        i = self.empty_pos[v]
        last = self.empty_list[self.st.num_empty]
        self.empty_list[i] = last
        self.empty_pos[last] = i
        self.chain_id[v] = v
        self.chain_next[v] = v
        self.chain_size[v] = 1
        self.libs[v] = 0
        self.lib_sum[v] = 0
        self.lib_sum2[v] = 0
        for k in range(4):
            n = nbrs[k]
            col = self.color[n]
            if col == 0:
                self.libs[v] += 1
                self.lib_sum[v] += n
                self.lib_sum2[v] += n * n
            elif col != BORDER:
                # v was a pseudo-liberty of that chain once per adjacency.
                r = self.chain_id[n]
                self.libs[r] -= 1
                self.lib_sum[r] -= v
                self.lib_sum2[r] -= v * v
        for k in range(4):
            n = nbrs[k]
            if self.color[n] == c and self.chain_id[n] != self.chain_id[v]:
                self._merge(self.chain_id[v], self.chain_id[n])

    cdef void _merge(self, int root_a, int root_b) noexcept nogil:
        """Join two chains, relabelling the smaller one."""
        cdef int big = root_a
        cdef int small = root_b
        if self.chain_size[root_a] < self.chain_size[root_b]:
            big = root_b
            small = root_a
        cdef int s = small
        while True:
            self.chain_id[s] = big
            s = self.chain_next[s]
            if s == small:
                break
        cdef int tmp = self.chain_next[big]
        self.chain_next[big] = self.chain_next[small]
        self.chain_next[small] = tmp
        self.chain_size[big] += self.chain_size[small]
        self.libs[big] += self.libs[small]
        self.lib_sum[big] += self.lib_sum[small]
        self.lib_sum2[big] += self.lib_sum2[small]

    cdef void _capture(self, int root) noexcept nogil:
        """Remove a chain; its stones become liberties of the capturer's chains."""
        cdef int victim = self.color[root]
        cdef int capturer = -victim
        cdef int S = self.stride
        cdef int s = root
        cdef int n, k, r
        cdef int nbrs[4]
        while True:
            self.color[s] = 0
            self.st.hash ^= zkey(s, victim)
            self.empty_list[self.st.num_empty] = s
            self.empty_pos[s] = self.st.num_empty
            self.st.num_empty += 1
            nbrs[0] = s - S
            nbrs[1] = s - 1
            nbrs[2] = s + 1
            nbrs[3] = s + S
            for k in range(4):
                n = nbrs[k]
                # Victim-coloured neighbours are the same chain: skip them.
                if self.color[n] == capturer:
                    r = self.chain_id[n]
                    self.libs[r] += 1
                    self.lib_sum[r] += s
                    self.lib_sum2[r] += s * s
            s = self.chain_next[s]
            if s == root:
                break

    cdef void _set_history_slot(self) noexcept nogil:
        memcpy(self.hist + (self.st.move_number & (HISTORY - 1)) * self.num_padded,
               self.color, self.num_padded)
        if self.st.hist_valid < HISTORY:
            self.st.hist_valid += 1

    cdef void _commit(self, int move, bint keep_history) noexcept nogil:
        """Play a move already known to be legal."""
        cdef int c = self.st.to_play
        cdef int v, k, n, S
        if move == self.num_points:
            self.st.passes += 1
        else:
            v = self.to_padded[move]
            S = self.stride
            self._place(v, c)
            for k in range(4):
                n = v - S if k == 0 else (v - 1 if k == 1 else (v + 1 if k == 2 else v + S))
                if self.color[n] == -c and self.libs[self.chain_id[n]] == 0:
                    self._capture(self.chain_id[n])
            self.st.passes = 0
            self._remember(self.st.hash)
        self.st.move_number += 1
        self.st.to_play = -c
        self.st.last_move = move
        if self.st.passes >= 2 or self.st.move_number >= self.max_moves_:
            self.st.over = 1
        if keep_history:
            self._set_history_slot()
        else:
            self.st.hist_valid = 0

    cdef int play_move(self, int move) noexcept nogil:
        cdef uint64_t h
        cdef int status = self.check_move(move, &h)
        if status == MOVE_OK:
            self._commit(move, True)
        return status

    cdef int copy_from(self, Board other) noexcept nogil:
        if <void*>other is <void*>self:
            return 0
        if other.N != self.N or other.max_moves_ != self.max_moves_:
            return -1
        self.st = other.st
        memcpy(self.block, other.block, self.block_bytes)
        if self.log != other.log:
            zl_atomic_add(&other.log.refcount, 1)
            _log_release(self.log)
            self.log = other.log
        self.owns_log = False
        if self.st.local_len > 0:
            memcpy(self.local_seq, other.local_seq, self.st.local_len * sizeof(uint64_t))
        self._rebuild_local_table()
        self.komi_ = other.komi_
        return 0

    cdef void write_features_ptr(self, float* out, int channels) noexcept nogil:
        # The layout is format/planes.py's; tests/format/test_planes.py checks
        # this against its reference builder.  `channels` is 17 or 22 (the
        # callers check), and the row of point p starts at out[p * channels].
        cdef int N2 = self.num_points
        cdef int me = self.st.to_play
        cdef int m = self.st.move_number
        cdef int num_valid = self.st.hist_valid
        cdef int k, p, s
        cdef int8_t* slot
        cdef int16_t* to_padded = self.to_padded
        memset(out, 0, N2 * channels * sizeof(float))
        if num_valid > m + 1:
            num_valid = m + 1
        for k in range(num_valid):  # k = age: the position after move m - k
            slot = self.hist + ((m - k) & (HISTORY - 1)) * self.num_padded
            for p in range(N2):
                s = slot[to_padded[p]]
                if s == me:
                    out[p * channels + OWN_STONES + k] = 1.0
                elif s == -me:
                    out[p * channels + OPPONENT_STONES + k] = 1.0
        if me == COLOUR_PLANE_SIDE:
            for p in range(N2):
                out[p * channels + COLOUR_PLANE] = 1.0
        if channels > BASIC_INPUT_PLANES:
            self._write_position_planes(out, channels, num_valid >= 2)

    cdef void _write_position_planes(self, float* out, int channels, bint has_previous) noexcept nogil:
        # Channels ON_BOARD .. LEGAL (format/planes.py), from the position at t
        # and, for the ko recapture, the history slot of t-1.
        #
        # True liberties per chain: walk each chain once (from the first of
        # its stones met) and count its distinct empty neighbours, marking
        # each counted point with the chain's root so that no reset is
        # needed between chains.  O(stones * 4); the pseudo-liberty counters
        # cannot tell 2 liberties from 3.
        cdef int counted_by[MAX_PADDED]     # root of the chain that last counted this empty point
        cdef int chain_libs[MAX_PADDED]     # true liberties, at each chain's root; -1 = not yet counted
        cdef int N2 = self.num_points
        cdef int S = self.stride
        cdef int me = self.st.to_play
        cdef int8_t* color = self.color
        cdef int16_t* to_padded = self.to_padded
        cdef int p, v, r, s, n, k, c, libs, count, taken_count, taken_at, placed
        cdef int nbrs[4]
        cdef bint legal
        cdef int8_t* before
        memset(counted_by, 0xff, self.num_padded * sizeof(int))
        memset(chain_libs, 0xff, self.num_padded * sizeof(int))
        nbrs[0] = -S
        nbrs[1] = -1
        nbrs[2] = 1
        nbrs[3] = S
        for p in range(N2):
            v = to_padded[p]
            out[p * channels + ON_BOARD] = 1.0
            c = color[v]
            if c != 1 and c != -1:
                continue
            r = self.chain_id[v]
            if chain_libs[r] < 0:
                count = 0
                s = r
                while True:
                    for k in range(4):
                        n = s + nbrs[k]
                        if color[n] == 0 and counted_by[n] != r:
                            counted_by[n] = r
                            count += 1
                    s = self.chain_next[s]
                    if s == r:
                        break
                chain_libs[r] = count
            libs = chain_libs[r]
            out[p * channels + LIBERTIES_1 + (libs - 1 if libs < 3 else 2)] = 1.0
        # The ko recapture: one stone of ours taken by the last move, which
        # was a lone stone now in atari (format/planes.py).
        taken_count = 0
        taken_at = -1
        placed = self.st.last_move
        if has_previous and 0 <= placed < N2 and color[to_padded[placed]] == -me:
            before = self.hist + ((self.st.move_number - 1) & (HISTORY - 1)) * self.num_padded
            for p in range(N2):
                v = to_padded[p]
                if before[v] == me and color[v] == 0:
                    taken_count += 1
                    taken_at = p
            v = to_padded[placed]
            if taken_count != 1 or self.chain_size[self.chain_id[v]] != 1 or chain_libs[self.chain_id[v]] != 1:
                taken_at = -1
        else:
            taken_at = -1
        for p in range(N2):
            v = to_padded[p]
            if color[v] != 0 or p == taken_at:
                continue
            legal = False
            for k in range(4):
                n = v + nbrs[k]
                c = color[n]
                if (c == 0 or (c == me and chain_libs[self.chain_id[n]] >= 2)
                        or (c == -me and chain_libs[self.chain_id[n]] == 1)):
                    legal = True
                    break
            if legal:
                out[p * channels + LEGAL] = 1.0

    cdef void write_legal_mask_ptr(self, uint8_t* out) noexcept nogil:
        cdef int p
        cdef uint64_t h
        cdef int c = self.st.to_play
        if self.st.over:
            memset(out, 0, self.num_points + 1)
            return
        for p in range(self.num_points):
            out[p] = self._check_padded(self.to_padded[p], c, &h) == MOVE_OK
        out[self.num_points] = 1

    cdef void write_sensible_mask_ptr(self, uint8_t* out) noexcept nogil:
        """Legal moves that do not fill the mover's own single-point eye; PASS
        only when no such move is left (the random-playout rule).

        Search uses this by default (engine.driver's `sensible_moves`): a
        network that has not learnt yet otherwise passes or fills its own
        eyes, and games between such players end with scores that say nothing.
        """
        cdef int p, any_move = 0
        cdef int c = self.st.to_play
        self.write_legal_mask_ptr(out)
        if self.st.over:
            return
        for p in range(self.num_points):
            if out[p]:
                if self._is_own_eye(self.to_padded[p], c):
                    out[p] = 0
                else:
                    any_move = 1
        out[self.num_points] = 0 if any_move else 1

    cdef void write_candidate_mask_ptr(self, uint8_t* out, int rule) noexcept nogil:
        """The moves search expands under `rule` (board.pxd's CANDIDATES_*).

        CANDIDATES_PASS_WHEN_WINNING is the sensible mask plus PASS whenever
        the Tromp-Taylor score of the board as it stands, komi included, wins
        for the player to move (`mover_score_c` > 0), so a player that is
        ahead may pass and the search decides whether it should: after the
        opponent's pass, our PASS ends the game (two passes) and scores the
        very board that made it a candidate, so the search sees it as a sure
        win; and since the rules count every stone, a pass never gives away stones
        the final score would count, and a seki can be left alone.  A player
        that is behind (or level) still passes only when no sensible move is
        left, so the game goes on until the board as it stands says who won.
        """
        if rule == CANDIDATES_SENSIBLE or rule == CANDIDATES_PASS_WHEN_WINNING:
            self.write_sensible_mask_ptr(out)
            if rule == CANDIDATES_PASS_WHEN_WINNING and not self.st.over and self.mover_score_c() > 0.0:
                out[self.num_points] = 1
        else:
            self.write_legal_mask_ptr(out)

    cdef void _ownership_padded(self, int8_t* owner) noexcept nogil:
        """Tromp-Taylor owner of every padded point (border left as is).

        Stones own their point; an empty region owns to a colour when it
        reaches stones of that colour only, else it is neutral (0).

        This is the engine's one judge of who owns a point under the rules
        (every stone on the board is alive: the rules' "board as it stands").
        The final score (`area_score_c`), the ownership targets
        (`ownership_ptr`), the pass rule (`mover_score_c`,
        `write_candidate_mask_ptr`) and GTP's scoring all read it.  What a
        referee calls dead (GTP's final_status_list, engine.playouts.stone_statuses)
        builds on it rather than judging again: it is this count at the end
        of random playouts (engine.playouts.playout_ownership).
        """
        cdef int16_t stack[MAX_PADDED]
        cdef int16_t region[MAX_PADDED]
        cdef int8_t seen[MAX_PADDED]
        cdef int S = self.stride
        cdef int p, v, w, n, k, top, size, reach, col, fill
        memset(seen, 0, self.num_padded)
        for p in range(self.num_points):
            v = self.to_padded[p]
            col = self.color[v]
            if col != 0:
                owner[v] = col
                continue
            if seen[v]:
                continue
            # Flood fill the empty region; reach bit 1 = Black, 2 = White.
            reach = 0
            top = 0
            size = 0
            stack[top] = v
            top += 1
            seen[v] = 1
            while top > 0:
                top -= 1
                w = stack[top]
                region[size] = w
                size += 1
                for k in range(4):
                    n = w - S if k == 0 else (w - 1 if k == 1 else (w + 1 if k == 2 else w + S))
                    col = self.color[n]
                    if col == 0:
                        if not seen[n]:
                            seen[n] = 1
                            stack[top] = n
                            top += 1
                    elif col == 1:
                        reach |= 1
                    elif col == -1:
                        reach |= 2
            fill = 1 if reach == 1 else (-1 if reach == 2 else 0)
            for k in range(size):
                owner[region[k]] = fill

    cdef void ownership_ptr(self, int8_t* out) noexcept nogil:
        cdef int8_t owner[MAX_PADDED]
        cdef int p
        self._ownership_padded(owner)
        for p in range(self.num_points):
            out[p] = owner[self.to_padded[p]]

    cdef double area_score_c(self) noexcept nogil:
        cdef int8_t owner[MAX_PADDED]
        cdef int p
        cdef int total = 0
        self._ownership_padded(owner)
        for p in range(self.num_points):
            total += owner[self.to_padded[p]]
        return total - self.komi_

    cdef double mover_score_c(self) noexcept nogil:
        """The Tromp-Taylor score of the board as it stands, for the player to move.

        ``area_score_c() * to_play``: own area minus the opponent's, komi on
        White's side; > 0 means the mover wins if the game ended now.  The
        points' owners come from `_ownership_padded`, the one owner of that
        judgement (see there).
        """
        return self.area_score_c() * self.st.to_play

    cdef bint _is_own_eye(self, int v, int c) noexcept nogil:
        """Empty v is a single-point eye of colour c, and not a false eye: every orthogonal
        neighbour is c's or the edge, and fewer than two diagonals are the opponent's (none on the edge)."""
        cdef int S = self.stride
        cdef int8_t* color = self.color
        cdef int a = color[v - S]
        cdef int b = color[v - 1]
        cdef int d = color[v + 1]
        cdef int e = color[v + S]
        if ((a != c and a != BORDER) or (b != c and b != BORDER)
                or (d != c and d != BORDER) or (e != c and e != BORDER)):
            return False
        cdef int bad = 0
        cdef int on_edge = 0
        cdef int diag[4]
        diag[0] = color[v - S - 1]
        diag[1] = color[v - S + 1]
        diag[2] = color[v + S - 1]
        diag[3] = color[v + S + 1]
        cdef int k
        for k in range(4):
            if diag[k] == -c:
                bad += 1
            elif diag[k] == BORDER:
                on_edge = 1
        return bad + on_edge < 2

    cdef int playout_move(self, uint64_t* rng_state) noexcept nogil:
        cdef int c = self.st.to_play
        cdef int k = self.st.num_empty
        cdef int i, v, tmp
        cdef uint64_t h
        cdef int16_t* empty_list = self.empty_list
        cdef int16_t* empty_pos = self.empty_pos
        # Draw without replacement: rejected points are swapped to the end of
        # the live range [0, k) of the empty list (its order means nothing).
        while k > 0:
            i = rng_below(rng_state, k)
            v = empty_list[i]
            if not self._is_own_eye(v, c) and self._check_padded(v, c, &h) == MOVE_OK:
                return self.to_flat[v]
            k -= 1
            tmp = empty_list[k]
            empty_list[k] = v
            empty_pos[v] = k
            empty_list[i] = tmp
            empty_pos[tmp] = i
        return self.num_points

    cdef int playout(self, uint64_t* rng_state) noexcept nogil:
        cdef int moves = 0
        while not self.st.over:
            self._commit(self.playout_move(rng_state), False)
            moves += 1
        self.st.hist_valid = 0
        self._set_history_slot()
        return moves

    # ------------------------------------------------------------------
    # Python API
    # ------------------------------------------------------------------
    @property
    def size(self):
        return self.N

    @property
    def komi(self):
        return self.komi_

    @property
    def max_moves(self):
        """The move cap (passes count); the game ends when it is reached."""
        return self.max_moves_

    @property
    def to_play(self):
        """BLACK (1) or WHITE (-1)."""
        return self.st.to_play

    @property
    def move_number(self):
        return self.st.move_number

    @property
    def consecutive_passes(self):
        return self.st.passes

    @property
    def is_over(self):
        return bool(self.st.over)

    @property
    def hash(self):
        """Zobrist hash of the stones as a Python int in [0, 2**64)."""
        return self.st.hash

    @property
    def last_move(self):
        """Flat action of the previous move, or -1 before the first."""
        return self.st.last_move

    @property
    def num_actions(self):
        return self.num_points + 1

    @property
    def pass_move(self):
        return self.num_points

    def _describe(self, move):
        from format.coords import move_to_gtp
        try:
            return f"{move} ({move_to_gtp(move, self.N)})"
        except ValueError:
            return str(move)

    def illegal_reason(self, move):
        """None if `move` is legal, else the reason ('occupied', 'suicide'...)."""
        cdef uint64_t h
        cdef int status = self.check_move(_as_move(move), &h)
        return None if status == MOVE_OK else MOVE_STATUS_NAMES[status]

    def is_legal(self, move):
        """Whether the side to move may play `move` (False when off-board)."""
        return self.is_legal_move(_as_move(move))

    def play(self, move):
        """Play a flat action for the side to move.

        Raises IllegalMove (a ValueError) naming the reason, leaving the
        board unchanged, for off-board, occupied, suicide, superko and moves
        after the game is over.
        """
        cdef int m = _as_move(move)
        cdef int status = self.play_move(m)
        if status != MOVE_OK:
            reason = MOVE_STATUS_NAMES[status]
            raise IllegalMove(
                f"illegal move {self._describe(move)} on {self.N}x{self.N} at move "
                f"{self.st.move_number}: {reason}", reason, move)

    def legal_mask(self):
        """uint8[N*N + 1]: 1 where the side to move may play (PASS last)."""
        out = np.empty(self.num_points + 1, dtype=np.uint8)
        cdef uint8_t[::1] view = out
        with nogil:
            self.write_legal_mask_ptr(&view[0])
        return out

    def sensible_mask(self):
        """uint8[N*N + 1]: legal moves that don't fill the mover's own eye;
        PASS only when none is left."""
        out = np.empty(self.num_points + 1, dtype=np.uint8)
        cdef uint8_t[::1] view = out
        with nogil:
            self.write_sensible_mask_ptr(&view[0])
        return out

    def candidate_mask(self, bint sensible=True, bint pass_when_winning=False):
        """uint8[N*N + 1]: the moves search expands (`write_candidate_mask_ptr`).

        ``sensible``: no own-eye fills, PASS only when nothing else is left
        (`sensible_mask`); otherwise every legal move (`legal_mask`).
        ``pass_when_winning`` (with ``sensible``): PASS also whenever the board
        as it stands wins for the mover (`mover_score` > 0)."""
        out = np.empty(self.num_points + 1, dtype=np.uint8)
        cdef uint8_t[::1] view = out
        cdef int rule = (CANDIDATES_LEGAL if not sensible else
                         CANDIDATES_PASS_WHEN_WINNING if pass_when_winning else CANDIDATES_SENSIBLE)
        with nogil:
            self.write_candidate_mask_ptr(&view[0], rule)
        return out

    def write_features(self, float[:, :, ::1] out not None):
        """Write the input planes (format/planes.py) into a caller's float32 [N, N, C] buffer.

        C, the buffer's last dimension, is 17 (AlphaGo Zero's planes) or 22
        (the full layout): the layout's first C channels are written."""
        if (out.shape[0] != self.N or out.shape[1] != self.N
                or out.shape[2] not in (BASIC_INPUT_PLANES, NUM_PLANES)):
            raise ValueError(
                f"features buffer must have shape ({self.N}, {self.N}, {BASIC_INPUT_PLANES} or {NUM_PLANES}), "
                f"got {(out.shape[0], out.shape[1], out.shape[2])}")
        cdef int channels = out.shape[2]
        with nogil:
            self.write_features_ptr(&out[0, 0, 0], channels)

    def features(self, int channels=BASIC_INPUT_PLANES):
        """A new float32 [N, N, channels] array of the input planes (layout: format/planes.py).

        ``channels`` is 17 (AlphaGo Zero's planes, the default) or 22 (the full layout)."""
        if channels != BASIC_INPUT_PLANES and channels != NUM_PLANES:
            raise ValueError(f"channels must be {BASIC_INPUT_PLANES} or {NUM_PLANES}, got {channels}")
        out = np.empty((self.N, self.N, channels), dtype=np.float32)
        self.write_features(out)
        return out

    def stones(self):
        """int8[N, N]: +1 Black, -1 White, 0 empty; row 0 is the top edge."""
        out = np.empty((self.N, self.N), dtype=np.int8)
        cdef int8_t[:, ::1] view = out
        cdef int p
        for p in range(self.num_points):
            view[p // self.N, p % self.N] = self.color[self.to_padded[p]]
        return out

    def copy(self):
        """An independent board with the same position, history and game line.

        O(board size): the superko history is shared read-only, as for
        `copy_from`; moves played on the copy never affect this board.
        """
        cdef Board other = Board(self.N, self.komi_, self.max_moves_)
        other.copy_from(self)
        return other

    def __copy__(self):
        return self.copy()

    def area_score(self):
        """Tromp-Taylor black_area - white_area - komi of the current position."""
        return self.area_score_c()

    def mover_score(self):
        """`area_score` seen by the side to move (> 0: the board as it stands wins for it)."""
        return self.mover_score_c()

    def ownership(self):
        """int8[N*N] Tromp-Taylor ownership (+1/-1; 0 for dame and seki)."""
        out = np.empty(self.num_points, dtype=np.int8)
        cdef int8_t[::1] view = out
        self.ownership_ptr(&view[0])
        return out

    def liberties(self, int point):
        """True liberty count of the chain at flat `point` (0 if empty).

        Walks the chain (for tests and tools; search uses `in_atari`)."""
        if not 0 <= point < self.num_points:
            raise ValueError(f"point {point} is off a {self.N}x{self.N} board")
        cdef int v = self.to_padded[point]
        if self.color[v] != 1 and self.color[v] != -1:
            return 0
        cdef int root = self.chain_id[v]
        cdef int s = root
        cdef int n, k, count = 0
        seen = set()
        while True:
            for k in range(4):
                n = s - self.stride if k == 0 else (s - 1 if k == 1 else (s + 1 if k == 2 else s + self.stride))
                if self.color[n] == 0 and n not in seen:
                    seen.add(n)
                    count += 1
            s = self.chain_next[s]
            if s == root:
                break
        return count

    def chains(self):
        """The chains on the board, each a sorted list of flat points, in the
        order of their lowest point (GTP order: top row first)."""
        labels = np.empty(self.num_points, dtype=np.int16)
        cdef int16_t[::1] view = labels
        with nogil:
            self.chain_labels_ptr(&view[0])
        found = {}
        for p in np.flatnonzero(labels >= 0):
            found.setdefault(int(labels[p]), []).append(int(p))
        return list(found.values())

    def chain_counters(self, int point):
        """(size, pseudo_libs, lib_sum, lib_sum2) kept for the chain at `point`,
        as sums of padded indices (see padded_index); for tests that recompute them from scratch."""
        if not 0 <= point < self.num_points or self.color[self.to_padded[point]] == 0:
            raise ValueError(f"no stone at point {point}")
        cdef int r = self.chain_id[self.to_padded[point]]
        return (self.chain_size[r], self.libs[r], self.lib_sum[r], self.lib_sum2[r])

    def padded_index(self, int point):
        """The engine's padded index of flat `point` (see chain_counters)."""
        if not 0 <= point < self.num_points:
            raise ValueError(f"point {point} is off a {self.N}x{self.N} board")
        return self.to_padded[point]

    def in_atari_at(self, int point):
        """Whether the chain at flat `point` has exactly one liberty."""
        return self.in_atari(point)

    def random_playout(self, uint64_t seed):
        """Play this board out randomly to the end (see the module docstring).

        Returns the number of moves played.  The board ends game-over."""
        cdef uint64_t state = rng_seed(seed)
        cdef int moves
        with nogil:
            moves = self.playout(&state)
        return moves

    def playout_policy_move(self, uint64_t seed):
        """The move a random playout would play here (not played; PASS if
        nothing but own eyes and illegal points is left)."""
        cdef uint64_t state = rng_seed(seed)
        if self.st.over:
            raise IllegalMove(f"game over on {self.N}x{self.N} at move {self.st.move_number}",
                              "game over", self.num_points)
        return self.playout_move(&state)

    def set_position(self, stones, int to_play=1):
        """Put a whole position on a fresh board (move_number 0).

        `stones` is int8-like [N, N] (+1/-1/0, row 0 on top).  The position
        becomes the first entry of the game line.  Raises ValueError if the
        board has moves already or a chain would have no liberty."""
        arr = np.asarray(stones)
        if arr.shape != (self.N, self.N):
            raise ValueError(f"stones must have shape ({self.N}, {self.N}), got {arr.shape}")
        if not np.isin(arr, (-1, 0, 1)).all():
            raise ValueError("stones must hold only -1, 0, 1")
        if to_play not in (1, -1):
            raise ValueError(f"to_play must be 1 (Black) or -1 (White), got {to_play}")
        if self.st.move_number != 0 or not self.owns_log:
            raise ValueError("set_position needs a fresh board (no moves, not a copy)")
        cdef int8_t[::1] flat = np.ascontiguousarray(arr, dtype=np.int8).reshape(-1)
        cdef int dead = self._load_stones(&flat[0], to_play)
        if dead >= 0:
            raise ValueError(f"the chain at point {dead} has no liberty")

    cdef int _load_stones(self, const int8_t* stones, int to_play) noexcept nogil:
        """`set_position`'s work, unchecked: flat stones [N*N] (+1/-1/0) -> this owner board.

        Returns -1, or the first point whose chain has no liberty (the board
        is then reset to empty)."""
        self._reset_geometry_and_stones()
        cdef int p
        for p in range(self.num_points):
            if stones[p] != 0:
                self._place(self.to_padded[p], stones[p])
        for p in range(self.num_points):
            if self.color[self.to_padded[p]] != 0 and self.libs[self.chain_id[self.to_padded[p]]] == 0:
                self._reset()
                return p
        self.st.to_play = to_play
        self.st.move_number = 0
        self.st.passes = 0
        self.st.over = 0
        self.st.last_move = -1
        self.st.local_len = 0
        memset(self.log.table, 0, (self.log.mask + 1) * sizeof(int32_t))
        self.log.length = 0
        _log_append(self.log, self.st.hash)
        self.st.log_len = self.log.length
        self.st.hist_valid = 0
        self._set_history_slot()
        return -1

    def to_ascii(self):
        """Rows top to bottom: 'X' Black, 'O' White, '.' empty."""
        rows = []
        for row in range(self.N):
            rows.append("".join(
                _ASCII[<int>self.color[self.to_padded[row * self.N + col]]]
                for col in range(self.N)))
        return "\n".join(rows)

    def __repr__(self):
        side = "Black" if self.st.to_play == 1 else "White"
        return (f"<Board {self.N}x{self.N} move {self.st.move_number}, {side} to play"
                f"{', over' if self.st.over else ''}>\n{self.to_ascii()}")


cdef int _as_move(move) except? -9:
    if isinstance(move, bool) or not isinstance(move, (int, np.integer)):
        raise TypeError(f"a move is a flat int action, got {move!r}")
    if move < -1000000 or move > 1000000:
        return -1
    return <int>move


_ASCII = {0: ".", 1: "X", -1: "O"}


def board_from_ascii(text, int to_play=1, double komi=DEFAULT_KOMI, int max_moves=0):
    """A fresh Board from rows of 'X' (Black), 'O' (White), '.' (empty).

    Blank lines and spaces are ignored; the row count sets the size."""
    rows = ["".join(line.split()) for line in text.strip().splitlines() if line.strip()]
    size = len(rows)
    for i, row in enumerate(rows):
        if len(row) != size or set(row) - set("XO."):
            raise ValueError(f"ASCII board row {i} {row!r}: want {size} of 'X', 'O', '.'")
    stones = np.array([[{"X": 1, "O": -1, ".": 0}[ch] for ch in row] for row in rows], dtype=np.int8)
    board = Board(size, komi, max_moves)
    board.set_position(stones, to_play)
    return board
