# cython: language_level=3
"""One game's Monte Carlo tree search: the tree, PUCT, Gumbel root, noise.

Node ``i`` is the position reached by playing ``move[i]`` (``row * N + col`` or PASS = N*N) from its
parent; the root is node 0 (`ROOT_INDEX`).  ``N[i]`` visits, ``W[i]`` total value, ``Q = W / N``,
``P[i]`` prior of ``move[i]`` at the parent, ``VL[i]`` visits in flight.  Perspective: **``W[i]`` is
seen by the player who played ``move[i]``**, so the player to move picks the child with the best
``Q + U`` with no sign flips; values enter seen by the player to move at the *leaf*, and `backup`
negates once a level (a node's value for its own player to move is ``-W[i] / N[i]``).

Layout: struct of arrays grown by doubling (`reserve`); a node's children are one contiguous range
(Minigo's child arrays), created for legal moves when a leaf is first reached (`expand`: PENDING
until `set_priors`); `promote` keeps the played move's subtree (tree reuse), compacted.
Phases, driven by `engine.driver`, which owns the boards: select (`select_child`,
`select_root_gumbel` at the root) while EXPANDED; expand, or `set_terminal` a game-over leaf;
`set_priors`, then `backup`.  Virtual loss counts an in-flight visit as a loss for its chooser.
Gumbel root (Danihelka et al., 2022; mctx ``gumbel_muzero_policy``): sequential halving over the
top-m actions by g + logits, the move the best survivor by g + logits + sigma(q), the policy target
softmax(logits + sigma(completed q)); interior nodes use PUCT.
"""
from libc.math cimport exp, log, sqrt, pow, cos, INFINITY
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy
from libc.stdint cimport int16_t, int32_t, uint8_t, uint64_t

import numpy as np
cimport numpy as cnp

from engine.rng cimport rng_next, rng_seed

cnp.import_array()

cdef double TWO_PI = 6.283185307179586
cdef float LOG_PRIOR_FLOOR = -30.0   # log of a zero prior (exp(-30) ~ 1e-13)


# --------------------------------------------------------------------------
# Random draws (nogil).  xorshift64* words from engine.rng.
# --------------------------------------------------------------------------

cdef double rand_uniform(uint64_t* rng) noexcept nogil:
    # 53 random bits, shifted off zero so log() is always finite.
    return ((rng_next(rng) >> 11) + 0.5) * (1.0 / 9007199254740992.0)


cdef double rand_normal(uint64_t* rng) noexcept nogil:
    # Box-Muller; one of the pair is thrown away (noise is drawn once a move).
    return sqrt(-2.0 * log(rand_uniform(rng))) * cos(TWO_PI * rand_uniform(rng))


cdef double rand_gamma(uint64_t* rng, double alpha) noexcept nogil:
    """Gamma(alpha, 1) by Marsaglia and Tsang (2000); alpha < 1 by boosting.

    Dirichlet alphas here are ~0.03-0.15, so the boost path
    Gamma(alpha + 1) * U ** (1 / alpha) is the common one.
    """
    cdef double d, c, x, v, u
    if alpha <= 0.0:
        return 0.0
    if alpha < 1.0:
        return rand_gamma(rng, alpha + 1.0) * pow(rand_uniform(rng), 1.0 / alpha)
    d = alpha - 1.0 / 3.0
    c = 1.0 / sqrt(9.0 * d)
    while True:
        x = rand_normal(rng)
        v = 1.0 + c * x
        if v <= 0.0:
            continue
        v = v * v * v
        u = rand_uniform(rng)
        if log(u) < 0.5 * x * x + d - d * v + d * log(v):
            return d * v


cdef double rand_gumbel(uint64_t* rng) noexcept nogil:
    return -log(-log(rand_uniform(rng)))


cdef inline float safe_log(float p) noexcept nogil:
    return <float>log(p) if p > 0.0 else LOG_PRIOR_FLOOR


# Node states for Python callers (Tree.node(i)["state"]); see NodeState in search.pxd.
STATE_UNEXPANDED = UNEXPANDED
STATE_PENDING = PENDING
STATE_EXPANDED = EXPANDED
STATE_TERMINAL = TERMINAL


def gumbel_visit_sequence(int32_t num_considered, int32_t num_simulations):
    """mctx's `get_sequence_of_considered_visits`, for tests and docs.

    Entry k is the visit count the k-th simulation's root action must have
    before it is visited: sequential halving spends the budget in
    ceil(log2(m)) phases over m, m/2, ... (at least 2) considered actions.
    """
    cdef int32_t* out = <int32_t*>malloc(max(num_simulations, 1) * sizeof(int32_t))
    if out == NULL:
        raise MemoryError()
    try:
        _fill_visit_sequence(num_considered, num_simulations, out)
        return [out[i] for i in range(num_simulations)]
    finally:
        free(out)


cdef void _fill_visit_sequence(int32_t num_considered, int32_t num_simulations,
                               int32_t* out) noexcept nogil:
    cdef int32_t length = 0, i, r, extra, log2max = 0, considered = num_considered
    cdef int32_t visits_level = 0
    if num_considered <= 1:
        for i in range(num_simulations):
            out[i] = i
        return
    while (1 << log2max) < num_considered:
        log2max += 1
    # The actions still considered all have the same visit count at the end
    # of each phase, so the table is one counter per phase (`visits_level`).
    while length < num_simulations:
        extra = <int32_t>(num_simulations / (log2max * considered))
        if extra < 1:
            extra = 1
        for r in range(extra):
            for i in range(considered):
                if length >= num_simulations:
                    return
                out[length] = visits_level
                length += 1
            visits_level += 1
        considered = considered // 2
        if considered < 2:
            considered = 2


cdef class Tree:
    """A search tree over ``num_actions`` actions (see the module docstring).

    Python API (tests, tools): `reset`, `select`, `expand_node`,
    `evaluate_node`, `mark_terminal`, `virtual_loss`, `backup_value`,
    `promote_move`, `dirichlet`, `start_search`, `select_root`,
    `children`, `node`, `visit_counts`, `gumbel_policy`, `pick_move`.
    """

    def __cinit__(self, int32_t num_actions, int32_t capacity=256):
        if num_actions < 2:
            raise ValueError(f"num_actions must be >= 2, got {num_actions}")
        self.num_actions = num_actions
        self.capacity = 0
        self.size = 0
        self.gumbel_noise = 1.0
        self.root_gumbel = <float*>malloc(num_actions * sizeof(float))
        self.root_search_visits = <int32_t*>malloc(num_actions * sizeof(int32_t))
        self.scratch = <float*>malloc(num_actions * sizeof(float))
        self.visit_sequence = NULL
        self.sequence_capacity = 0
        if self.root_gumbel == NULL or self.root_search_visits == NULL or self.scratch == NULL:
            raise MemoryError()
        self.reserve(max(capacity, 1))
        self.clear()

    def __dealloc__(self):
        free(self.N); free(self.W); free(self.P); free(self.VL)
        free(self.raw_value); free(self.parent); free(self.first_child)
        free(self.num_children); free(self.move); free(self.state)
        free(self.root_gumbel); free(self.root_search_visits)
        free(self.scratch); free(self.visit_sequence)

    # ------------------------------------------------------------------
    # storage
    # ------------------------------------------------------------------

    cdef int reserve(self, int32_t extra) except -1 nogil:
        """Make room for `extra` more nodes (capacity doubles, so amortised O(1))."""
        cdef int32_t need = self.size + extra
        cdef int32_t cap = self.capacity
        if need <= cap:
            return 0
        if cap < 64:
            cap = 64
        while cap < need:
            cap *= 2
        cdef void* p
        p = realloc(self.N, cap * sizeof(int32_t))
        if p == NULL:
            with gil:
                raise MemoryError("search tree")
        self.N = <int32_t*>p
        p = realloc(self.W, cap * sizeof(float))
        if p == NULL:
            with gil:
                raise MemoryError("search tree")
        self.W = <float*>p
        p = realloc(self.P, cap * sizeof(float))
        if p == NULL:
            with gil:
                raise MemoryError("search tree")
        self.P = <float*>p
        p = realloc(self.VL, cap * sizeof(int32_t))
        if p == NULL:
            with gil:
                raise MemoryError("search tree")
        self.VL = <int32_t*>p
        p = realloc(self.raw_value, cap * sizeof(float))
        if p == NULL:
            with gil:
                raise MemoryError("search tree")
        self.raw_value = <float*>p
        p = realloc(self.parent, cap * sizeof(int32_t))
        if p == NULL:
            with gil:
                raise MemoryError("search tree")
        self.parent = <int32_t*>p
        p = realloc(self.first_child, cap * sizeof(int32_t))
        if p == NULL:
            with gil:
                raise MemoryError("search tree")
        self.first_child = <int32_t*>p
        p = realloc(self.num_children, cap * sizeof(int16_t))
        if p == NULL:
            with gil:
                raise MemoryError("search tree")
        self.num_children = <int16_t*>p
        p = realloc(self.move, cap * sizeof(int16_t))
        if p == NULL:
            with gil:
                raise MemoryError("search tree")
        self.move = <int16_t*>p
        p = realloc(self.state, cap * sizeof(uint8_t))
        if p == NULL:
            with gil:
                raise MemoryError("search tree")
        self.state = <uint8_t*>p
        self.capacity = cap
        return 0

    cdef void _init_node(self, int32_t i, int32_t parent, int32_t move) noexcept nogil:
        self.N[i] = 0
        self.W[i] = 0.0
        self.P[i] = 0.0
        self.VL[i] = 0
        self.raw_value[i] = 0.0
        self.parent[i] = parent
        self.first_child[i] = NO_CHILDREN
        self.num_children[i] = 0
        self.move[i] = <int16_t>move
        self.state[i] = UNEXPANDED

    cdef void clear(self) noexcept nogil:
        """Forget everything: a single unexpanded root."""
        self.size = 1
        self._init_node(ROOT_INDEX, NO_PARENT, -1)
        self.P[ROOT_INDEX] = 1.0
        self.gumbel_ready = False
        self.sims_started = 0
        self.sims_budget = 0
        self.num_considered = 0

    # ------------------------------------------------------------------
    # select
    # ------------------------------------------------------------------

    cdef float node_q(self, int32_t node) noexcept nogil:
        """Value of `node` for its own player to move (mean, else network)."""
        if self.N[node] > 0:
            return -self.W[node] / self.N[node]
        return self.raw_value[node]

    cdef int32_t select_child(self, int32_t node, const PuctParams* params) noexcept nogil:
        """PUCT: argmax over children of Q + c(s) * P * sqrt(N_parent) / (1 + N).

        In-flight visits count as visits that lost (virtual loss):
        Q = (W - VL) / (N + VL).  An unvisited child gets the first-play
        urgency Q = Q(node) - fpu_reduction.  Ties go to the first child
        (children are in action order).
        """
        cdef int32_t first = self.first_child[node]
        cdef int32_t count = self.num_children[node]
        cdef int32_t k, c, best = first, visits
        cdef double parent_visits = self.N[node] + self.VL[node]
        cdef double c_puct = params.c_puct_init + log(
            (1.0 + parent_visits + params.c_puct_base) / params.c_puct_base)
        cdef double explore = c_puct * sqrt(parent_visits - 1.0 if parent_visits > 2.0 else 1.0)
        cdef double reduction = params.fpu_reduction_root if node == ROOT_INDEX else params.fpu_reduction
        cdef double fpu = self.node_q(node) - reduction
        cdef double q, score, best_score = -INFINITY
        # Copies of the array pointers in locals: the loop is the search's
        # hottest code (about 80 children on 9x9, 360 on 19x19).
        cdef int32_t* n_arr = self.N
        cdef int32_t* vl_arr = self.VL
        cdef float* w_arr = self.W
        cdef float* p_arr = self.P
        for k in range(count):
            c = first + k
            visits = n_arr[c] + vl_arr[c]
            if visits == 0:
                # Most children are unvisited: no divisions for them.
                score = fpu + explore * p_arr[c]
            else:
                q = (w_arr[c] - vl_arr[c]) / visits
                score = q + explore * p_arr[c] / (1.0 + visits)
            if score > best_score:
                best_score = score
                best = c
        return best

    cdef int32_t select_root_gumbel(self, const GumbelParams* params, uint64_t* rng) noexcept nogil:
        """Next root action of sequential halving (mctx's root selection).

        The k-th simulation of the search visits, among the root actions whose
        visits this search equal `visit_sequence[k]`, the one with the best
        g + logits + sigma(completed q).  Visits in flight count, so several
        simulations of one batch follow the table; their q values are those
        known at gather time.  Returns NO_NODE when the budget is spent.
        """
        cdef int32_t first = self.first_child[ROOT_INDEX]
        cdef int32_t count = self.num_children[ROOT_INDEX]
        cdef int32_t k, best = -1, target
        cdef double score, best_score = -INFINITY
        if self.sims_started >= self.sims_budget:
            return NO_NODE
        if not self.gumbel_ready:
            self._draw_gumbel(params, rng)
        target = self.visit_sequence[self.sims_started]
        self.completed_q_sigma(params, self.scratch)
        for k in range(count):
            if self.root_search_visits[k] != target:
                continue
            score = self.root_gumbel[k] + safe_log(self.P[first + k]) + self.scratch[k]
            if score > best_score:
                best_score = score
                best = k
        if best < 0:
            # Cannot happen with the table; be safe: least-visited action.
            best = 0
            for k in range(count):
                if self.root_search_visits[k] < self.root_search_visits[best]:
                    best = k
        self.root_search_visits[best] += 1
        return first + best

    cdef void _draw_gumbel(self, const GumbelParams* params, uint64_t* rng) noexcept nogil:
        cdef int32_t count = self.num_children[ROOT_INDEX]
        cdef int32_t k
        for k in range(count):
            # Drawn whatever the scale, so the random stream does not depend on it.
            self.root_gumbel[k] = self.gumbel_noise * <float>rand_gumbel(rng)
            self.root_search_visits[k] = 0
        self.num_considered = params.max_considered if params.max_considered < count else count
        _fill_visit_sequence(self.num_considered, self.sims_budget, self.visit_sequence)
        self.gumbel_ready = True

    cdef void cancel_root_selection(self, int32_t child) noexcept nogil:
        """Undo `select_root_gumbel`'s count when its simulation collided."""
        cdef int32_t k = child - self.first_child[ROOT_INDEX]
        if self.gumbel_ready and 0 <= k < self.num_children[ROOT_INDEX]:
            self.root_search_visits[k] -= 1

    cdef void add_virtual_loss(self, int32_t leaf) noexcept nogil:
        cdef int32_t node = leaf
        while node != NO_PARENT:
            self.VL[node] += 1
            node = self.parent[node]

    cdef void revert_virtual_loss(self, int32_t leaf) noexcept nogil:
        cdef int32_t node = leaf
        while node != NO_PARENT:
            self.VL[node] -= 1
            node = self.parent[node]

    # ------------------------------------------------------------------
    # expand
    # ------------------------------------------------------------------

    cdef int expand(self, int32_t node, const int16_t* moves, int32_t count) except -1 nogil:
        """Create `count` children (the legal moves, in action order); PENDING."""
        cdef int32_t k, first
        self.reserve(count)
        first = self.size
        for k in range(count):
            self._init_node(first + k, node, moves[k])
        self.size += count
        self.first_child[node] = first
        self.num_children[node] = <int16_t>count
        self.state[node] = PENDING
        return 0

    cdef void set_priors(self, int32_t node, const float* logits, float value) noexcept nogil:
        """Priors = softmax of the network's logits over the legal children.

        `logits` is indexed by action (length num_actions); `value` is the
        network's value for the player to move at `node`.
        """
        cdef int32_t first = self.first_child[node]
        cdef int32_t count = self.num_children[node]
        cdef int32_t k
        cdef float top = -INFINITY, x
        cdef double total = 0.0
        for k in range(count):
            x = logits[self.move[first + k]]
            if x > top:
                top = x
        for k in range(count):
            x = <float>exp(logits[self.move[first + k]] - top)
            self.P[first + k] = x
            total += x
        for k in range(count):
            self.P[first + k] = <float>(self.P[first + k] / total)
        self.raw_value[node] = value
        self.state[node] = EXPANDED

    cdef void set_terminal(self, int32_t node, float value) noexcept nogil:
        """Mark a game-over position; `value` is the rules' result for its
        player to move (+1 win, -1 loss, 0 draw)."""
        self.raw_value[node] = value
        self.state[node] = TERMINAL

    # ------------------------------------------------------------------
    # backup
    # ------------------------------------------------------------------

    cdef void backup(self, int32_t leaf, float value) noexcept nogil:
        """Add `value` (seen by the player to move at `leaf`) up the path.

        Each node's W is seen by the player who moved into it, i.e. the
        opponent of its player to move, hence the negation before each add.
        Also removes the virtual loss `add_virtual_loss` put on the path.
        """
        cdef int32_t node = leaf
        cdef float v = value
        while node != NO_PARENT:
            v = -v
            self.W[node] += v
            self.N[node] += 1
            self.VL[node] -= 1
            node = self.parent[node]

    # ------------------------------------------------------------------
    # tree reuse
    # ------------------------------------------------------------------

    cdef int promote(self, int32_t move) except -1 nogil:
        """Make the child reached by `move` the new root, keeping its subtree.

        The subtree is copied breadth-first into new arrays so that it is
        dense from index 0 and every child range stays contiguous.  If the
        move was never expanded, the tree restarts from an empty root.
        Must not be called with simulations in flight.
        """
        cdef int32_t first = self.first_child[ROOT_INDEX]
        cdef int32_t count = self.num_children[ROOT_INDEX]
        cdef int32_t k, child = NO_NODE
        if self.state[ROOT_INDEX] == EXPANDED:
            for k in range(count):
                if self.move[first + k] == move:
                    child = first + k
                    break
        if child == NO_NODE:
            self.clear()
            return 0
        cdef int32_t* old_of = <int32_t*>malloc(self.size * sizeof(int32_t))
        if old_of == NULL:
            with gil:
                raise MemoryError("search tree")
        # Allocate the destination arrays with the same capacity.
        cdef int32_t cap = self.capacity
        cdef int32_t* nN = <int32_t*>malloc(cap * sizeof(int32_t))
        cdef float* nW = <float*>malloc(cap * sizeof(float))
        cdef float* nP = <float*>malloc(cap * sizeof(float))
        cdef int32_t* nVL = <int32_t*>malloc(cap * sizeof(int32_t))
        cdef float* nraw = <float*>malloc(cap * sizeof(float))
        cdef int32_t* nparent = <int32_t*>malloc(cap * sizeof(int32_t))
        cdef int32_t* nfirst = <int32_t*>malloc(cap * sizeof(int32_t))
        cdef int16_t* ncount = <int16_t*>malloc(cap * sizeof(int16_t))
        cdef int16_t* nmove = <int16_t*>malloc(cap * sizeof(int16_t))
        cdef uint8_t* nstate = <uint8_t*>malloc(cap * sizeof(uint8_t))
        if (nN == NULL or nW == NULL or nP == NULL or nVL == NULL or nraw == NULL
                or nparent == NULL or nfirst == NULL or ncount == NULL
                or nmove == NULL or nstate == NULL):
            free(old_of); free(nN); free(nW); free(nP); free(nVL); free(nraw)
            free(nparent); free(nfirst); free(ncount); free(nmove); free(nstate)
            with gil:
                raise MemoryError("search tree")
        # Invariant: nodes [0, new_size) have their old index in old_of and
        # their parent set; nodes [0, i) are fully copied.  The destination
        # arrays double as the BFS queue.
        cdef int32_t i = 0, new_size = 1, o, nc
        old_of[0] = child
        nparent[0] = NO_PARENT
        while i < new_size:
            o = old_of[i]
            nN[i] = self.N[o]
            nW[i] = self.W[o]
            nP[i] = self.P[o]
            nVL[i] = 0
            nraw[i] = self.raw_value[o]
            nmove[i] = self.move[o]
            nstate[i] = self.state[o]
            nc = self.num_children[o]
            ncount[i] = <int16_t>nc
            if self.first_child[o] == NO_CHILDREN:
                nfirst[i] = NO_CHILDREN
            else:
                nfirst[i] = new_size
                for k in range(nc):
                    old_of[new_size + k] = self.first_child[o] + k
                    nparent[new_size + k] = i
                new_size += nc
            i += 1
        nP[0] = 1.0
        free(old_of)
        free(self.N); free(self.W); free(self.P); free(self.VL)
        free(self.raw_value); free(self.parent); free(self.first_child)
        free(self.num_children); free(self.move); free(self.state)
        self.N = nN; self.W = nW; self.P = nP; self.VL = nVL
        self.raw_value = nraw; self.parent = nparent; self.first_child = nfirst
        self.num_children = ncount; self.move = nmove; self.state = nstate
        self.size = new_size
        self.gumbel_ready = False
        self.sims_started = 0
        self.sims_budget = 0
        self.num_considered = 0
        return 0

    # ------------------------------------------------------------------
    # root policies
    # ------------------------------------------------------------------

    cdef void add_dirichlet_noise(self, float alpha_total, float epsilon, uint64_t* rng) noexcept nogil:
        """P <- (1 - eps) P + eps Dir(alpha) on the root's children.

        alpha = alpha_total / number of legal moves (KataGo's scaling; 10.83
        gives AlphaGo Zero's 0.03 on an empty 19x19 board).  The noise is
        normalised, so the priors still sum to 1.
        """
        cdef int32_t first = self.first_child[ROOT_INDEX]
        cdef int32_t count = self.num_children[ROOT_INDEX]
        cdef int32_t k
        cdef double alpha, total = 0.0, g
        if self.state[ROOT_INDEX] != EXPANDED or count == 0 or epsilon <= 0.0:
            return
        alpha = alpha_total / count
        for k in range(count):
            g = rand_gamma(rng, alpha)
            self.scratch[k] = <float>g
            total += g
        if not total > 0.0:
            return          # every draw underflowed: no noise this time
        for k in range(count):
            self.P[first + k] = <float>((1.0 - epsilon) * self.P[first + k]
                                        + epsilon * self.scratch[k] / total)

    cdef int begin_search(self, int32_t budget) except -1 nogil:
        """Start a move's search: `budget` new simulations from the root."""
        if budget > self.sequence_capacity:
            free(self.visit_sequence)
            self.visit_sequence = <int32_t*>malloc(budget * sizeof(int32_t))
            if self.visit_sequence == NULL:
                self.sequence_capacity = 0
                with gil:
                    raise MemoryError("search tree")
            self.sequence_capacity = budget
        self.sims_budget = budget
        self.sims_started = 0
        self.gumbel_ready = False
        return 0

    cdef void completed_q_sigma(self, const GumbelParams* params, float* out) noexcept nogil:
        """sigma(completed q) for every root child, into out[k] (mctx's
        `qtransform_completed_by_mix_value`).

        q of a visited child is its Q (root player's view); an unvisited
        child gets the mixed value (raw value mixed with the prior-weighted
        mean Q of the visited ones); then q is rescaled to [0, 1] by the
        min and max over children and multiplied by (c_visit + max N) * c_scale.
        """
        cdef int32_t first = self.first_child[ROOT_INDEX]
        cdef int32_t count = self.num_children[ROOT_INDEX]
        cdef int32_t k, c, max_n = 0
        cdef double sum_n = 0.0, sum_p = 0.0, weighted = 0.0, mixed
        cdef double lo = INFINITY, hi = -INFINITY, q, scale
        for k in range(count):
            c = first + k
            if self.N[c] > 0:
                sum_n += self.N[c]
                sum_p += self.P[c]
                if self.N[c] > max_n:
                    max_n = self.N[c]
        if sum_p > 0.0:
            for k in range(count):
                c = first + k
                if self.N[c] > 0:
                    weighted += self.P[c] * (self.W[c] / self.N[c]) / sum_p
        mixed = (self.raw_value[ROOT_INDEX] + sum_n * weighted) / (sum_n + 1.0)
        for k in range(count):
            c = first + k
            q = self.W[c] / self.N[c] if self.N[c] > 0 else mixed
            out[k] = <float>q
            if q < lo:
                lo = q
            if q > hi:
                hi = q
        scale = (params.c_visit + max_n) * params.c_scale
        for k in range(count):
            out[k] = <float>(scale * (out[k] - lo) / (hi - lo if hi - lo > 1e-8 else 1e-8))

    cdef int32_t pick_move_by_visits(self, float temperature, uint64_t* rng) noexcept nogil:
        """Move to play after a PUCT search.

        temperature > 0: sample with probability proportional to N^(1/T);
        otherwise the most visited move (ties: higher prior, then uniformly
        at random, so that equal children, e.g. under a uniform prior, do not
        always resolve to the lowest move index).
        """
        cdef int32_t first = self.first_child[ROOT_INDEX]
        cdef int32_t count = self.num_children[ROOT_INDEX]
        cdef int32_t k, c, best = first, tied = 1
        cdef double total = 0.0, r, w
        if count == 0:
            return -1
        if temperature > 0.0:
            for k in range(count):
                c = first + k
                w = pow(<double>self.N[c], 1.0 / temperature) if self.N[c] > 0 else 0.0
                total += w
            if total > 0.0:
                r = rand_uniform(rng) * total
                for k in range(count):
                    c = first + k
                    w = pow(<double>self.N[c], 1.0 / temperature) if self.N[c] > 0 else 0.0
                    r -= w
                    if r <= 0.0 and w > 0.0:
                        return self.move[c]
        for k in range(1, count):
            c = first + k
            if (self.N[c] > self.N[best]
                    or (self.N[c] == self.N[best] and self.P[c] > self.P[best])):
                best = c
                tied = 1
            elif self.N[c] == self.N[best] and self.P[c] == self.P[best]:
                # Reservoir sampling over the exact ties seen so far.
                tied += 1
                if rand_uniform(rng) * tied < 1.0:
                    best = c
        return self.move[best]

    cdef int32_t pick_move_gumbel(self, const GumbelParams* params) noexcept nogil:
        """Move to play after a Gumbel search: among the actions visited most
        this search, the best by g + logits + sigma(completed q)."""
        cdef int32_t first = self.first_child[ROOT_INDEX]
        cdef int32_t count = self.num_children[ROOT_INDEX]
        cdef int32_t k, best = 0, most = -1
        cdef double score, best_score = -INFINITY
        if count == 0:
            return -1
        if not self.gumbel_ready:
            # No simulation ran (budget 0): Gumbel-max sampling of the prior.
            return self.move[first + self._argmax_gumbel_prior()]
        for k in range(count):
            if self.root_search_visits[k] > most:
                most = self.root_search_visits[k]
        self.completed_q_sigma(params, self.scratch)
        for k in range(count):
            if self.root_search_visits[k] != most:
                continue
            score = self.root_gumbel[k] + safe_log(self.P[first + k]) + self.scratch[k]
            if score > best_score:
                best_score = score
                best = k
        return self.move[first + best]

    cdef int32_t _argmax_gumbel_prior(self) noexcept nogil:
        cdef int32_t first = self.first_child[ROOT_INDEX]
        cdef int32_t k, best = 0
        for k in range(1, self.num_children[ROOT_INDEX]):
            if self.P[first + k] > self.P[first + best]:
                best = k
        return best

    cdef int32_t improved_policy(self, const GumbelParams* params, float* probs) noexcept nogil:
        """Gumbel policy target softmax(logits + sigma(completed q)) into
        probs[k] for root child k; returns the number of children."""
        cdef int32_t first = self.first_child[ROOT_INDEX]
        cdef int32_t count = self.num_children[ROOT_INDEX]
        cdef int32_t k
        cdef double top = -INFINITY, total = 0.0, x
        self.completed_q_sigma(params, probs)
        for k in range(count):
            x = safe_log(self.P[first + k]) + probs[k]
            probs[k] = <float>x
            if x > top:
                top = x
        for k in range(count):
            x = exp(probs[k] - top)
            probs[k] = <float>x
            total += x
        for k in range(count):
            probs[k] = <float>(probs[k] / total)
        return count

    # ------------------------------------------------------------------
    # Python API (tests and tools; the driver uses the cdef methods)
    # ------------------------------------------------------------------

    def reset(self):
        self.clear()

    @property
    def root_visits(self):
        return self.N[ROOT_INDEX]

    @property
    def root_value(self):
        """Mean value of the root for its player to move."""
        return self.node_q(ROOT_INDEX)

    def node(self, int32_t i):
        """Dict of node i's fields."""
        self._check_node(i)
        return {"state": self.state[i], "N": self.N[i], "W": self.W[i], "P": self.P[i],
                "VL": self.VL[i], "parent": self.parent[i], "move": self.move[i],
                "raw_value": self.raw_value[i], "first_child": self.first_child[i],
                "num_children": self.num_children[i]}

    def children(self, int32_t i):
        """The child arrays of node i: dict of numpy arrays (index, move, N, W, P, VL)."""
        self._check_node(i)
        cdef int32_t first = self.first_child[i], count = self.num_children[i], k
        if first == NO_CHILDREN:
            count = 0
        out = {name: np.zeros(count, dtype) for name, dtype in
               (("index", np.int32), ("move", np.int32), ("N", np.int32),
                ("W", np.float32), ("P", np.float32), ("VL", np.int32))}
        for k in range(count):
            out["index"][k] = first + k
            out["move"][k] = self.move[first + k]
            out["N"][k] = self.N[first + k]
            out["W"][k] = self.W[first + k]
            out["P"][k] = self.P[first + k]
            out["VL"][k] = self.VL[first + k]
        return out

    def _check_node(self, int32_t i):
        if not 0 <= i < self.size:
            raise IndexError(f"node {i} not in tree of {self.size} nodes")

    def select(self, int32_t node, *, float c_puct_init=1.25, float c_puct_base=19652.0,
               float fpu_reduction=0.25, float fpu_reduction_root=0.0):
        """PUCT child of an EXPANDED node (see `select_child`)."""
        self._check_node(node)
        if self.state[node] != EXPANDED:
            raise ValueError(f"node {node} is not expanded")
        cdef PuctParams params
        params.c_puct_init = c_puct_init
        params.c_puct_base = c_puct_base
        params.fpu_reduction = fpu_reduction
        params.fpu_reduction_root = fpu_reduction_root
        return self.select_child(node, &params)

    def expand_node(self, int32_t node, moves):
        self._check_node(node)
        cdef cnp.ndarray[cnp.int16_t, ndim=1] arr = np.ascontiguousarray(moves, dtype=np.int16)
        if arr.shape[0] == 0 or arr.max() >= self.num_actions or arr.min() < 0:
            raise ValueError("moves must be a non-empty list of actions")
        self.expand(node, <int16_t*>arr.data, arr.shape[0])

    def evaluate_node(self, int32_t node, logits, float value):
        """set_priors with a length-num_actions logits vector."""
        self._check_node(node)
        cdef cnp.ndarray[cnp.float32_t, ndim=1] arr = np.ascontiguousarray(logits, dtype=np.float32)
        if arr.shape[0] != self.num_actions:
            raise ValueError(f"logits must have {self.num_actions} entries")
        if self.state[node] != PENDING:
            raise ValueError(f"node {node} is not pending")
        self.set_priors(node, <float*>arr.data, value)

    def mark_terminal(self, int32_t node, float value):
        self._check_node(node)
        self.set_terminal(node, value)

    def virtual_loss(self, int32_t leaf):
        self._check_node(leaf)
        self.add_virtual_loss(leaf)

    def backup_value(self, int32_t leaf, float value):
        """Backup (removes one virtual loss from the path: add one first)."""
        self._check_node(leaf)
        self.backup(leaf, value)

    def promote_move(self, int32_t move):
        self.promote(move)

    def dirichlet(self, float alpha_total, float epsilon, Random rng):
        self.add_dirichlet_noise(alpha_total, epsilon, &rng.state)

    def start_search(self, int32_t budget):
        self.begin_search(budget)

    def select_root(self, Random rng, *, int32_t max_considered=16,
                    float c_visit=50.0, float c_scale=0.1):
        """Gumbel root selection (counts the simulation as started)."""
        if self.state[ROOT_INDEX] != EXPANDED:
            raise ValueError("root is not expanded")
        cdef GumbelParams params
        params.max_considered = max_considered
        params.c_visit = c_visit
        params.c_scale = c_scale
        cdef int32_t child = self.select_root_gumbel(&params, &rng.state)
        if child != NO_NODE:
            self.sims_started += 1
        return child

    def gumbel_policy(self, *, int32_t max_considered=16, float c_visit=50.0, float c_scale=0.1):
        """(improved policy over the root children, move chosen)."""
        cdef GumbelParams params
        params.max_considered = max_considered
        params.c_visit = c_visit
        params.c_scale = c_scale
        cdef cnp.ndarray[cnp.float32_t, ndim=1] probs = np.zeros(self.num_actions, np.float32)
        cdef int32_t count = self.improved_policy(&params, <float*>probs.data)
        return probs[:count].copy(), self.pick_move_gumbel(&params)

    def pick_move(self, float temperature, Random rng):
        return self.pick_move_by_visits(temperature, &rng.state)

    def visit_counts(self):
        """Dense int32[num_actions] visit counts of the root's children."""
        out = np.zeros(self.num_actions, np.int32)
        ch = self.children(ROOT_INDEX)
        out[ch["move"]] = ch["N"]
        return out


cdef class Random:
    """Python handle on a xorshift64* state (for tests and tools)."""

    def __cinit__(self, uint64_t seed=0):
        self.state = rng_seed(seed)

    def uniform(self):
        return rand_uniform(&self.state)

    def gamma(self, double alpha):
        return rand_gamma(&self.state, alpha)

    def gumbel(self):
        return rand_gumbel(&self.state)
