# cython: language_level=3
"""Contract of the search tree (see search.pyx for the explanations).

A `Tree` is one game's Monte Carlo search tree stored as a struct of arrays
(mctx's `Tree`, sklearn's `_tree` style): node ``i`` is the position reached
by playing ``move[i]`` from node ``parent[i]``; node 0 is the root.  A node's
children occupy the contiguous range
``first_child[i] .. first_child[i] + num_children[i] - 1``, so the statistics
of every move considered at a position (N, W, P) are contiguous slices, the
"child arrays on the parent" of Minigo's mcts.py.
"""
from libc.stdint cimport int16_t, int32_t, uint8_t, uint64_t

# --- sentinels ------------------------------------------------------------
cdef enum:
    ROOT_INDEX = 0       # the root is always node 0 (promotion compacts the tree)
    NO_PARENT = -1       # parent[ROOT_INDEX]
    NO_CHILDREN = -1     # first_child of a node that has not been expanded
    NO_NODE = -1         # "no leaf" answer of a selection that collided

# Life cycle of a node: UNEXPANDED -> PENDING (children allocated, network
# evaluation in flight) -> EXPANDED.  TERMINAL nodes are game-over positions
# whose value comes from the rules and is backed up without the network.
cdef enum NodeState:
    UNEXPANDED = 0
    PENDING = 1
    EXPANDED = 2
    TERMINAL = 3


# --- random draws on top of engine.rng's xorshift64* state (nogil) ------
cdef double rand_uniform(uint64_t* rng) noexcept nogil            # in (0, 1)
cdef double rand_normal(uint64_t* rng) noexcept nogil             # N(0, 1)
cdef double rand_gamma(uint64_t* rng, double alpha) noexcept nogil  # Gamma(alpha, 1)
cdef double rand_gumbel(uint64_t* rng) noexcept nogil             # Gumbel(0, 1)


# --- hyperparameters --------------------------------------------------------
cdef struct PuctParams:
    float c_puct_init        # AlphaZero c(s) = log((1 + N + base) / base) + init
    float c_puct_base
    float fpu_reduction      # unvisited child Q = parent Q - this (interior)
    float fpu_reduction_root # the same at the root (0 with noise, as Leela)

cdef struct GumbelParams:
    int32_t max_considered   # m: root actions sampled by Gumbel-top-k
    float c_visit            # sigma(q) = (c_visit + max N) * c_scale * q
    float c_scale


cdef class Tree:
    cdef readonly int32_t num_actions   # N*N + 1; moves are 0..num_actions-1
    cdef readonly int32_t size          # nodes in use
    cdef int32_t capacity               # nodes allocated
    # Per node i (arrays of length capacity):
    cdef int32_t* N             # completed visits of the subtree at i
    cdef float* W               # sum of backed-up values, seen by the player
                                #   who played move[i] (the parent's player to
                                #   move), so Q(parent, move[i]) = W[i] / N[i]
    cdef float* P               # prior of move[i] at the parent
    cdef int32_t* VL            # visits in flight through i (virtual losses)
    cdef float* raw_value       # network value of i (or the rules' value if
                                #   TERMINAL), seen by the player to move at i
    cdef int32_t* parent
    cdef int32_t* first_child
    cdef int16_t* num_children
    cdef int16_t* move
    cdef uint8_t* state         # NodeState

    # Gumbel root state, reset by begin_search (arrays of length num_actions,
    # indexed by child offset k = child - first_child[ROOT_INDEX]).
    cdef float* root_gumbel         # g(a) ~ Gumbel(0, 1)
    cdef int32_t* root_search_visits # visits started this search (pending too)
    cdef int32_t* visit_sequence    # mctx's table of considered visits [sims_budget]
    cdef int32_t sequence_capacity
    cdef float* scratch             # num_actions floats of workspace
    cdef readonly int32_t sims_started  # simulations started this search
    cdef readonly int32_t sims_budget   # simulations this search may start
    cdef readonly bint gumbel_ready     # gumbels drawn for the current root
    cdef readonly int32_t num_considered
    cdef readonly float gumbel_noise    # scale of the root's Gumbel draws for this search: 1 is Gumbel
                                        #   MuZero's; 0 considers the top-m priors and plays without sampling

    cdef int reserve(self, int32_t extra) except -1 nogil
    cdef void _init_node(self, int32_t i, int32_t parent, int32_t move) noexcept nogil
    cdef void _draw_gumbel(self, const GumbelParams* params, uint64_t* rng) noexcept nogil
    cdef int32_t _argmax_gumbel_prior(self) noexcept nogil
    cdef void clear(self) noexcept nogil
    cdef float node_q(self, int32_t node) noexcept nogil
    cdef int32_t select_child(self, int32_t node, const PuctParams* params) noexcept nogil
    cdef int32_t select_root_gumbel(self, const GumbelParams* params, uint64_t* rng) noexcept nogil
    cdef void add_virtual_loss(self, int32_t leaf) noexcept nogil
    cdef void revert_virtual_loss(self, int32_t leaf) noexcept nogil
    cdef int expand(self, int32_t node, const int16_t* moves, int32_t count) except -1 nogil
    cdef void set_priors(self, int32_t node, const float* logits, float value) noexcept nogil
    cdef void set_terminal(self, int32_t node, float value) noexcept nogil
    cdef void backup(self, int32_t leaf, float value) noexcept nogil
    cdef int promote(self, int32_t move) except -1 nogil
    cdef void add_dirichlet_noise(self, float alpha_total, float epsilon, uint64_t* rng) noexcept nogil
    cdef int begin_search(self, int32_t budget) except -1 nogil
    cdef void cancel_root_selection(self, int32_t child) noexcept nogil
    cdef void completed_q_sigma(self, const GumbelParams* params, float* out) noexcept nogil
    cdef int32_t pick_move_by_visits(self, float temperature, uint64_t* rng) noexcept nogil
    cdef int32_t pick_move_gumbel(self, const GumbelParams* params) noexcept nogil
    cdef int32_t improved_policy(self, const GumbelParams* params, float* probs) noexcept nogil


cdef class Random:
    cdef public uint64_t state          # xorshift64* state (engine.rng)
