# cython: language_level=3
"""Contract of the batched self-play driver (see driver.pyx)."""
from cpython.ref cimport PyObject
from libc.stdint cimport int16_t, int32_t, uint8_t, uint64_t

from engine.board cimport Board
from engine.search cimport PuctParams, GumbelParams, Tree


cdef class GameBatch:
    cdef readonly int board_size
    cdef readonly int num_actions
    cdef readonly int num_games
    cdef readonly int num_groups        # games are split in groups (halves) by index
    cdef readonly int batch_rows        # rows of one group's batch buffer
    cdef readonly int leaves_per_game   # in-flight leaves a game may add per pass
    cdef readonly int max_passes        # passes over a group's games per gather
    cdef readonly bint sensible_moves   # expand only moves that don't fill the
                                        #   mover's own eye; PASS only when none is left
    cdef readonly bint pass_when_winning  # with sensible_moves: PASS also whenever the board
                                          #   as it stands wins for the mover (Tromp-Taylor)
    cdef int candidate_rule             # board.pxd's CANDIDATES_* from the two flags above;
                                        #   what expand_leaf asks the board for
    cdef int channels                   # input planes of the batch being gathered (17 or 22)
    cdef int feature_size               # N * N * channels floats per batch row

    cdef PuctParams puct
    cdef GumbelParams gumbel
    cdef float dirichlet_alpha_total
    cdef float dirichlet_epsilon

    # Python objects kept alive by these lists; the arrays below borrow them
    # so the nogil loops can reach every game without touching refcounts.
    cdef list roots_list                # Board per game: the game's position (owner)
    cdef list scratch_list              # Board per game: replay board for selection
    cdef list trees_list                # Tree per game
    cdef PyObject** roots
    cdef PyObject** scratches
    cdef PyObject** trees

    # Per game (arrays of length num_games):
    cdef uint64_t* rng                  # xorshift64* state
    cdef uint8_t* use_gumbel            # this move's search uses the Gumbel root
    cdef uint8_t* noise_pending         # add Dirichlet noise once the root is evaluated
    cdef uint8_t* searching             # a move's search is in progress

    # Per group (arrays of length num_groups * batch_rows):
    cdef int32_t* row_game              # game of each row of the last gather
    cdef int32_t* row_node              # leaf node of each row
    cdef int32_t* rows_pending          # [num_groups] rows gathered, not yet applied
    cdef int32_t* rotation              # [num_groups] first game of the next pass

    # Workspace (one per driver; gather runs on one thread at a time).
    cdef uint8_t* legal_mask            # [num_actions]
    cdef int16_t* legal_moves           # [num_actions]

    # Statistics.
    cdef readonly long long leaves_evaluated    # rows applied (root evaluations included)
    cdef readonly long long root_evaluations    # rows that were a search root's own evaluation:
                                                #   not a simulation, so not a visit
    cdef readonly long long terminal_visits
    cdef readonly long long collisions

    cdef int group_start(self, int group) noexcept nogil
    cdef int group_stop(self, int group) noexcept nogil
    cdef int gather_leaf(self, int game, Tree tree, Board root, Board scratch,
                         float* row_out, int32_t* leaf_out) except -2 nogil
    cdef int32_t select_leaf(self, int game, Tree tree, Board root, Board scratch) except -2 nogil
    cdef void score_terminal(self, Tree tree, int32_t node, Board board) noexcept nogil
    cdef int expand_leaf(self, Tree tree, int32_t node, Board board, float* row_out) except -1 nogil
    cdef int gather_group(self, int group, float* out) except -1 nogil
    cdef void apply_group(self, int group, const float* logits, const float* values) noexcept nogil
    cdef void apply_row(self, Tree tree, int game, int32_t node, const float* logits,
                        float value) noexcept nogil
