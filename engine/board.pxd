# cython: language_level=3
"""C-level contract of the Go engine (`engine/board.pyx`).

Search code does `from engine.board cimport Board, ...` and drives it with
the `noexcept nogil` methods below; Python code uses the Python API described
in the .pyx docstring.  Conventions follow `format/schema.py`: a *move* (or
action) is a flat index ``p = row * N + col`` (row 0 = top edge) or
``PASS = N * N``; colours are BLACK = 1, WHITE = -1, EMPTY = 0.

Inside the engine points live on a *padded* grid with a one-point border all
round: stride ``S = N + 2``, ``v = (row + 1) * S + (col + 1)``, neighbours are
``v - S, v - 1, v + 1, v + S`` and border points hold the colour BORDER, so no
loop ever tests coordinates.  Translate with `to_padded` / `to_flat`.

Copy, not undo: a scratch board is refreshed from the search root with
`copy_from`, which is one `memcpy` of the per-point block plus the scalar
struct (about 4 KB on 9x9, 12 KB on 19x19), independent of game length,
because the superko history is shared read-only (see HashLog).
"""
from libc.stdint cimport int8_t, int16_t, int32_t, uint8_t, uint32_t, uint64_t

from format.planes cimport BASIC_INPUT_PLANES, HISTORY_LENGTH, INPUT_PLANES

# ---- status codes of `play_move` / `check_move` (0 = legal / played) ----
cdef enum:
    MOVE_OK = 0
    MOVE_OFF_BOARD = -1   # not in [0, N*N] (PASS = N*N is on the board)
    MOVE_OCCUPIED = -2
    MOVE_SUICIDE = -3
    MOVE_SUPERKO = -4     # would repeat an earlier whole-board position
    MOVE_GAME_OVER = -5

# ---- candidate-move rules of `write_candidate_mask_ptr` (what search expands) ----
cdef enum:
    CANDIDATES_LEGAL = 0              # every legal move, PASS included
    CANDIDATES_SENSIBLE = 1           # legal moves that don't fill the mover's own single-point
                                      #   eye; PASS only when no such move is left
    CANDIDATES_PASS_WHEN_WINNING = 2  # CANDIDATES_SENSIBLE, plus PASS whenever the board as it
                                      #   stands wins for the mover (mover_score_c() > 0)

cdef enum:
    BORDER = 2            # colour of the padding points around the board
    MAX_SIZE = 19
    MAX_PADDED = 441      # (MAX_SIZE + 2) ** 2
    # The input-plane layout is format/planes.py's (cimported from its .pxd):
    HISTORY = HISTORY_LENGTH  # positions kept in the history ring (t .. t-7); a power of two
    NUM_PLANES = INPUT_PLANES  # channels of the full layout; `write_features_ptr` writes 17 or all


cdef struct HashLog:
    # Positional-superko history of one game line, shared read-only by every
    # copy of the board that owns it.  Append-only; sized at creation for the
    # whole game (max_moves + 2 entries), so it is never reallocated while
    # copies on other threads read it.
    int refcount          # boards referencing it (atomic updates)
    int length            # entries in `seq`
    int capacity          # entries `seq` can hold
    uint32_t mask         # open-addressing table size - 1 (a power of two - 1)
    uint64_t* seq         # position hashes in game order
    int32_t* table        # open addressing: 0 = empty slot, else index+1 into seq


cdef struct LocalEntry:
    # One slot of a board's private hash set of positions it reached itself.
    uint64_t hash
    uint32_t stamp        # slot is live only when stamp == the board's stamp


cdef struct BoardState:
    # Every scalar of the position; copied by plain struct assignment.
    uint64_t hash         # Zobrist hash of the stones (not of the side to move)
    int to_play           # BLACK or WHITE
    int move_number       # moves played so far, passes included
    int passes            # consecutive passes just played
    int over              # 1 once two passes or the move cap ended the game
    int num_empty         # live length of `empty_list`
    int last_move         # flat action of the previous move, -1 at the start
    int hist_valid        # how many of the newest history slots are valid (1..8)
    int log_len           # prefix of the shared HashLog that is this line's past
    int local_len         # hashes this board appended to its private suffix


cdef class Board:
    # ---- geometry, fixed at construction ----
    cdef readonly int N               # board size (5..19)
    cdef int stride                   # N + 2
    cdef int num_padded               # stride * stride
    cdef int num_points               # N * N  (== PASS)
    cdef int max_moves_               # move cap; the game ends when reached
    cdef double komi_
    cdef int16_t* to_padded           # [N*N] flat point -> padded point
    cdef int16_t* to_flat             # [num_padded] padded -> flat, -1 on border

    # ---- the position ----
    cdef BoardState st
    # One malloc'd block holds every per-point array below, so that
    # `copy_from` is a single memcpy of `block_bytes`.  Chain fields are
    # meaningful only at a chain's root (its representative stone).
    cdef char* block
    cdef size_t block_bytes
    cdef int8_t* color                # [num_padded] BLACK/WHITE/EMPTY/BORDER
    cdef int16_t* chain_id            # [num_padded] root of the stone's chain
    cdef int16_t* chain_next          # [num_padded] circular list of the chain's stones
    cdef int16_t* chain_size          # [num_padded] stones in the chain (at root)
    cdef int16_t* libs                # [num_padded] pseudo-liberties (at root):
                                      #   sum over stones of adjacent empty points
    cdef int32_t* lib_sum             # [num_padded] sum of those liberty points
    cdef int32_t* lib_sum2            # [num_padded] sum of their squares; with
                                      #   libs this answers "in atari" exactly
    cdef int16_t* empty_list          # [N*N] padded empty points, first num_empty live
    cdef int16_t* empty_pos           # [num_padded] index of a point in empty_list
    cdef int8_t* hist                 # [HISTORY][num_padded] ring of colour arrays;
                                      #   slot (m & 7) = position after move m

    # ---- superko history: shared game line + private suffix ----
    cdef HashLog* log
    cdef bint owns_log                # only the owner appends to `log`
    cdef uint64_t* local_seq          # [max_moves + 2] hashes past log_len
    cdef LocalEntry* local_table      # private open-addressing set of local_seq
    cdef uint32_t local_mask
    cdef uint32_t local_stamp

    # ---- C API for search (all nogil, none raise) ----
    cdef int check_move(self, int move, uint64_t* new_hash) noexcept nogil
    # MOVE_OK if `move` is legal for the side to move, else a negative code;
    # on MOVE_OK stores the hash of the resulting position in new_hash.
    cdef bint is_legal_move(self, int move) noexcept nogil
    cdef int play_move(self, int move) noexcept nogil
    # Full legality check (superko included), then play; returns MOVE_OK or a
    # negative code and leaves the board untouched on failure.
    cdef int copy_from(self, Board other) noexcept nogil
    # Make self an exact copy of `other` (same N and max_moves, else returns
    # -1 and does nothing).  O(board) memcpy; history is shared, not copied.
    cdef void write_features_ptr(self, float* out, int channels) noexcept nogil
    # The network input (format/planes.py), NHWC [N, N, channels] float32,
    # C-contiguous at `out`: the layout's first `channels` channels, which
    # must be BASIC_INPUT_PLANES (17) or INPUT_PLANES (22); callers check.
    cdef void _write_position_planes(self, float* out, int channels, bint has_previous) noexcept nogil
    # write_features_ptr's channels ON_BOARD .. LEGAL (22-channel layout only).
    cdef void write_legal_mask_ptr(self, uint8_t* out) noexcept nogil
    # [N*N + 1] uint8; out[PASS] = 1 unless the game is over.
    cdef void write_sensible_mask_ptr(self, uint8_t* out) noexcept nogil
    # Legal mask without moves filling the mover's own single-point eye;
    # out[PASS] = 1 only when no other move is left.
    cdef void write_candidate_mask_ptr(self, uint8_t* out, int rule) noexcept nogil
    # [N*N + 1] uint8: the moves search may expand under `rule` (a CANDIDATES_*
    # value; any other is CANDIDATES_LEGAL).  All zero once the game is over.
    cdef double area_score_c(self) noexcept nogil
    # Tromp-Taylor black_area - white_area - komi.
    cdef double mover_score_c(self) noexcept nogil
    # area_score_c() seen by the side to move: > 0 when the board as it stands
    # (no stone judged dead) wins for the player to move, < 0 when it loses.
    cdef void ownership_ptr(self, int8_t* out) noexcept nogil
    # [N*N] +1 Black / -1 White / 0 neutral (Tromp-Taylor).
    cdef int playout(self, uint64_t* rng_state) noexcept nogil
    # Random playout to the end (two passes or the cap) on self; returns the
    # number of moves it played.  Skips history upkeep: afterwards only the
    # final position is in the feature history.
    cdef int playout_move(self, uint64_t* rng_state) noexcept nogil
    # The playout policy's choice for the side to move (not played): uniform
    # over legal moves that don't fill the mover's own eye, else PASS.
    cdef bint in_atari(self, int move) noexcept nogil
    # The chain at flat point `move` has exactly one liberty (False if empty).
    cdef void chain_labels_ptr(self, int16_t* out) noexcept nogil
    # [N*N] int16: each stone's chain label, the lowest flat point of its chain
    # (so labels run in GTP order, top row first); -1 on empty points.
    cdef bint fills_safely(self, int move, Board probe) noexcept nogil
    # The side to move may play `move` (legal: empty, no suicide, no superko)
    # and the chain it then belongs to keeps two or more liberties.  Played
    # on `probe`, a board of the same size and move cap, which it overwrites.

    # ---- internals (declared here so subclasses / search may inline) ----
    cdef void _place(self, int v, int c) noexcept nogil
    cdef void _merge(self, int root_a, int root_b) noexcept nogil
    cdef void _capture(self, int root) noexcept nogil
    cdef int _check_padded(self, int v, int c, uint64_t* new_hash) noexcept nogil
    cdef void _commit(self, int move, bint keep_history) noexcept nogil
    cdef bint _seen(self, uint64_t h) noexcept nogil
    cdef void _remember(self, uint64_t h) noexcept nogil
    cdef void _rebuild_local_table(self) noexcept nogil
    cdef bint _is_own_eye(self, int v, int c) noexcept nogil
    cdef void _ownership_padded(self, int8_t* owner) noexcept nogil
    cdef void _set_history_slot(self) noexcept nogil
    cdef void _reset_geometry_and_stones(self) noexcept nogil
    cdef int _load_stones(self, const int8_t* stones, int to_play) noexcept nogil
    # set_position's work on an owner board: flat stones [N*N] (+1/-1/0) with `to_play`
    # to move; returns -1, or the first point whose chain has no liberty (board reset).
    cdef void _reset(self) noexcept nogil
