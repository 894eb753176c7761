# cython: language_level=3
"""Batched search over many self-play games: gather leaves, apply evaluations.

One `GameBatch` holds ``num_games`` games, each a root `Board`, a scratch `Board` (selection replays
moves on it) and a `Tree` (engine.search), split by index into ``num_groups`` groups (two: halves)
so search and inference overlap: while the network evaluates one group's batch (releasing the GIL),
the calling thread applies the other's results and gathers its next batch without the GIL.

    gather(0) -> network(0) ...........
                 gather(1) -> network(1) .........
                 apply(0), moves(0), gather(0) -> network(0) ...

* `gather(group, out)`: round-robin over the group's games, each adding up to ``leaves_per_game``
  leaves (virtual loss keeps them distinct) and writing their input planes (the first C channels of
  format/planes.py's layout; ``out`` is float32 [batch_rows, N, N, C]); game-over leaves are scored
  by the rules and backed up at once, without a row.
* `apply(group, logits, values)`: priors from logits, backup of values (side to move at the leaf, [-1, 1]).
* `done_games(group)`: games whose search used its budget (new simulations); the worker picks the
  move (`choose_move`), `play`s it (tree reuse) and calls `start_search`.
"""
from cpython.ref cimport PyObject
from libc.stdlib cimport malloc, free, calloc
from libc.stdint cimport int16_t, int32_t, uint8_t, uint64_t

import numpy as np

from format.schema import DEFAULT_KOMI
cimport numpy as cnp

from format.planes cimport BASIC_INPUT_PLANES
from engine.board cimport (Board, CANDIDATES_LEGAL, CANDIDATES_PASS_WHEN_WINNING, CANDIDATES_SENSIBLE, MOVE_OK,
                             NUM_PLANES)
from engine.board import Board as PyBoard
from engine.rng cimport rng_seed
from engine.search cimport (
    Tree, ROOT_INDEX, NO_NODE, UNEXPANDED, PENDING, EXPANDED, TERMINAL,
)

cnp.import_array()

# Answers of gather_leaf.
cdef enum:
    LEAF_QUEUED = 1      # a row was written; evaluation pending
    LEAF_SCORED = 0      # a game-over leaf was backed up from the rules
    LEAF_BLOCKED = -1    # the game cannot add a leaf now (budget, collision)
    LEAF_ERROR = -2      # exception set


cdef inline float rules_value(Board board) noexcept nogil:
    """+1/-1/0: the Tromp-Taylor result for the player to move on `board`."""
    cdef double score = board.mover_score_c()
    if score > 0.0:
        return 1.0
    if score < 0.0:
        return -1.0
    return 0.0


cdef class GameBatch:
    """Many games searched together (see the module docstring).

    GameBatch(board_size, num_games, *, komi=DEFAULT_KOMI, max_moves=0, num_groups=2,
              leaves_per_game=8, batch_rows=None, max_passes=4,
              c_puct_init=1.25, c_puct_base=19652, fpu_reduction=0.25,
              fpu_reduction_root=0.0, gumbel_max_considered=16,
              gumbel_c_visit=50, gumbel_c_scale=0.1,
              dirichlet_alpha_total=10.83, dirichlet_epsilon=0.25, seed=0,
              sensible_moves=True, pass_when_winning=False)

    ``batch_rows`` defaults to games per group x leaves_per_game.
    ``sensible_moves`` restricts children to legal moves that do not fill the
    mover's own single-point eye, PASS only once none is left
    (Board.write_sensible_mask_ptr): without it an untrained network's games
    end with scores that carry no signal (docs/measured.md).
    ``pass_when_winning`` (with ``sensible_moves``) adds PASS whenever the
    board's Tromp-Taylor score as it stands wins for the player to move
    (CANDIDATES_PASS_WHEN_WINNING), so a won game may end pass for pass.
    """

    def __cinit__(self, int board_size, int num_games, *, double komi=DEFAULT_KOMI, int max_moves=0,
                  int num_groups=2, int leaves_per_game=8, batch_rows=None, int max_passes=4,
                  float c_puct_init=1.25, float c_puct_base=19652.0,
                  float fpu_reduction=0.25, float fpu_reduction_root=0.0,
                  int gumbel_max_considered=16, float gumbel_c_visit=50.0,
                  float gumbel_c_scale=0.1, float dirichlet_alpha_total=10.83,
                  float dirichlet_epsilon=0.25, uint64_t seed=0, bint sensible_moves=True,
                  bint pass_when_winning=False):
        self.roots = NULL
        self.scratches = NULL
        self.trees = NULL
        if num_games < 1 or num_groups < 1 or num_groups > num_games:
            raise ValueError(f"need 1 <= num_groups ({num_groups}) <= num_games ({num_games})")
        if leaves_per_game < 1 or max_passes < 1:
            raise ValueError("leaves_per_game and max_passes must be >= 1")
        if gumbel_max_considered < 1:
            raise ValueError("gumbel_max_considered must be >= 1")
        self.board_size = board_size
        self.num_actions = board_size * board_size + 1
        self.num_games = num_games
        self.num_groups = num_groups
        self.leaves_per_game = leaves_per_game
        self.max_passes = max_passes
        self.sensible_moves = sensible_moves
        self.pass_when_winning = pass_when_winning
        # Without sensible_moves every legal move is a child already, PASS included.
        self.candidate_rule = (CANDIDATES_LEGAL if not sensible_moves else
                               CANDIDATES_PASS_WHEN_WINNING if pass_when_winning else CANDIDATES_SENSIBLE)
        largest_group = -(-num_games // num_groups)
        self.batch_rows = int(batch_rows) if batch_rows is not None else largest_group * leaves_per_game
        if self.batch_rows < 1:
            raise ValueError("batch_rows must be >= 1")
        self.channels = NUM_PLANES  # set by each gather from its buffer
        self.feature_size = board_size * board_size * NUM_PLANES
        self.puct.c_puct_init = c_puct_init
        self.puct.c_puct_base = c_puct_base
        self.puct.fpu_reduction = fpu_reduction
        self.puct.fpu_reduction_root = fpu_reduction_root
        self.gumbel.max_considered = gumbel_max_considered
        self.gumbel.c_visit = gumbel_c_visit
        self.gumbel.c_scale = gumbel_c_scale
        self.dirichlet_alpha_total = dirichlet_alpha_total
        self.dirichlet_epsilon = dirichlet_epsilon

        self.roots_list = [PyBoard(board_size, komi, max_moves) for _ in range(num_games)]
        self.scratch_list = [PyBoard(board_size, komi, max_moves) for _ in range(num_games)]
        self.trees_list = [Tree(self.num_actions) for _ in range(num_games)]
        self.roots = <PyObject**>malloc(num_games * sizeof(PyObject*))
        self.scratches = <PyObject**>malloc(num_games * sizeof(PyObject*))
        self.trees = <PyObject**>malloc(num_games * sizeof(PyObject*))
        self.rng = <uint64_t*>malloc(num_games * sizeof(uint64_t))
        self.use_gumbel = <uint8_t*>calloc(num_games, sizeof(uint8_t))
        self.noise_pending = <uint8_t*>calloc(num_games, sizeof(uint8_t))
        self.searching = <uint8_t*>calloc(num_games, sizeof(uint8_t))
        self.row_game = <int32_t*>malloc(num_groups * self.batch_rows * sizeof(int32_t))
        self.row_node = <int32_t*>malloc(num_groups * self.batch_rows * sizeof(int32_t))
        self.rows_pending = <int32_t*>calloc(num_groups, sizeof(int32_t))
        self.rotation = <int32_t*>calloc(num_groups, sizeof(int32_t))
        self.legal_mask = <uint8_t*>malloc(self.num_actions * sizeof(uint8_t))
        self.legal_moves = <int16_t*>malloc(self.num_actions * sizeof(int16_t))
        if (self.roots == NULL or self.scratches == NULL or self.trees == NULL or self.rng == NULL
                or self.use_gumbel == NULL or self.noise_pending == NULL or self.searching == NULL
                or self.row_game == NULL or self.row_node == NULL or self.rows_pending == NULL
                or self.rotation == NULL or self.legal_mask == NULL or self.legal_moves == NULL):
            raise MemoryError()
        cdef int g
        for g in range(num_games):
            self.roots[g] = <PyObject*>self.roots_list[g]
            self.scratches[g] = <PyObject*>self.scratch_list[g]
            self.trees[g] = <PyObject*>self.trees_list[g]
            self.rng[g] = rng_seed(seed * 1000003 + g)

    def __dealloc__(self):
        free(self.roots); free(self.scratches); free(self.trees); free(self.rng)
        free(self.use_gumbel); free(self.noise_pending); free(self.searching)
        free(self.row_game); free(self.row_node); free(self.rows_pending)
        free(self.rotation); free(self.legal_mask); free(self.legal_moves)

    # ------------------------------------------------------------------
    # groups
    # ------------------------------------------------------------------

    cdef int group_start(self, int group) noexcept nogil:
        return group * self.num_games // self.num_groups

    cdef int group_stop(self, int group) noexcept nogil:
        return (group + 1) * self.num_games // self.num_groups

    # ------------------------------------------------------------------
    # gather: select (+ virtual loss) and expand, features into the batch
    # ------------------------------------------------------------------

    cdef int gather_leaf(self, int game, Tree tree, Board root, Board scratch,
                         float* row_out, int32_t* leaf_out) except -2 nogil:
        """One simulation of `game`: select a leaf (`select_leaf`), then score it if the game is over
        there (`score_terminal`) or expand it for the network (`expand_leaf`).

        Returns LEAF_QUEUED (features written at row_out, leaf in leaf_out),
        LEAF_SCORED (game-over leaf, backed up already) or LEAF_BLOCKED (the
        budget is spent, the root awaits its evaluation, or the path ran into
        a leaf already in flight: a collision, undone).  The objects are
        passed in (borrowed) because nogil code cannot assign object locals.
        """
        cdef int32_t node
        cdef uint8_t root_state = tree.state[ROOT_INDEX]
        if not self.searching[game] or root_state == PENDING or root_state == TERMINAL:
            return LEAF_BLOCKED
        if root_state == UNEXPANDED:
            # The root's own evaluation: not counted in the budget, nor as a visit.
            self.expand_leaf(tree, ROOT_INDEX, root, row_out)
            self.root_evaluations += 1
            leaf_out[0] = ROOT_INDEX
            return LEAF_QUEUED
        if tree.sims_started >= tree.sims_budget:
            return LEAF_BLOCKED
        node = self.select_leaf(game, tree, root, scratch)
        if node == NO_NODE:
            return LEAF_BLOCKED
        tree.sims_started += 1
        if tree.state[node] == TERMINAL or scratch.st.over:
            self.score_terminal(tree, node, scratch)
            return LEAF_SCORED
        self.expand_leaf(tree, node, scratch, row_out)
        leaf_out[0] = node
        return LEAF_QUEUED

    cdef int32_t select_leaf(self, int game, Tree tree, Board root, Board scratch) except -2 nogil:
        """select: from the root (Gumbel's sequential halving there when the game uses it, PUCT
        below), play each chosen move on ``scratch`` (a copy of ``root``) while the node has
        children; their legality was checked when they were created.

        Returns the leaf, or NO_NODE when the Gumbel root has no move to start this round or the
        path ran into a leaf already in flight (a collision: the Gumbel root's selection undone,
        counted in ``collisions``).
        """
        cdef int32_t node, first
        scratch.copy_from(root)
        if self.use_gumbel[game]:
            node = tree.select_root_gumbel(&self.gumbel, &self.rng[game])
            if node == NO_NODE:
                return NO_NODE
        else:
            node = tree.select_child(ROOT_INDEX, &self.puct)
        first = node
        while True:
            if scratch.play_move(tree.move[node]) != MOVE_OK:
                with gil:
                    raise RuntimeError(
                        f"search replayed an illegal move {tree.move[node]} in game {game}")
            if tree.state[node] != EXPANDED:
                break
            node = tree.select_child(node, &self.puct)
        if tree.state[node] == PENDING:
            if self.use_gumbel[game]:
                tree.cancel_root_selection(first)
            self.collisions += 1
            return NO_NODE
        return node

    cdef void score_terminal(self, Tree tree, int32_t node, Board board) noexcept nogil:
        """A game-over leaf, found by this simulation (``board`` is over: its value by the rules,
        kept on the node) or an earlier one (TERMINAL: the kept value): a visit backed up with no
        network evaluation."""
        if tree.state[node] != TERMINAL:
            tree.set_terminal(node, rules_value(board))
        tree.add_virtual_loss(node)
        tree.backup(node, tree.raw_value[node])
        self.terminal_visits += 1

    cdef int expand_leaf(self, Tree tree, int32_t node, Board board, float* row_out) except -1 nogil:
        """expand: children for the candidate moves (`candidate_rule`, in action
        order), a virtual loss on the path, and the leaf's input planes into the batch row."""
        cdef int32_t count = 0, a
        board.write_candidate_mask_ptr(self.legal_mask, self.candidate_rule)
        for a in range(self.num_actions):
            if self.legal_mask[a]:
                self.legal_moves[count] = <int16_t>a
                count += 1
        tree.expand(node, self.legal_moves, count)
        tree.add_virtual_loss(node)
        board.write_features_ptr(row_out, self.channels)
        return 0

    cdef int gather_group(self, int group, float* out) except -1 nogil:
        """Fill `out` with up to batch_rows leaves of the group's games.

        Invariant: rows [0, rows) of `out`, row_game and row_node describe
        leaves in flight.  Passes go round the games (starting one game later
        each call, for fairness when the batch fills) until the batch is full
        or a pass adds nothing.
        """
        cdef int start = self.group_start(group)
        cdef int count = self.group_stop(group) - start
        cdef int base = group * self.batch_rows
        cdef int rows = 0, p, i, g, added, status
        cdef bint progress
        cdef int32_t leaf
        for p in range(self.max_passes):
            progress = False
            for i in range(count):
                g = start + (self.rotation[group] + i) % count
                added = 0
                while added < self.leaves_per_game and rows < self.batch_rows:
                    status = self.gather_leaf(
                        g, <Tree>self.trees[g], <Board>self.roots[g], <Board>self.scratches[g],
                        out + <size_t>rows * self.feature_size, &leaf)
                    if status == LEAF_QUEUED:
                        self.row_game[base + rows] = g
                        self.row_node[base + rows] = leaf
                        rows += 1
                        added += 1
                        progress = True
                    elif status == LEAF_SCORED:
                        progress = True
                    else:
                        break
                if rows >= self.batch_rows:
                    break
            if rows >= self.batch_rows or not progress:
                break
        self.rotation[group] = (self.rotation[group] + 1) % count
        self.rows_pending[group] = rows
        return rows

    # ------------------------------------------------------------------
    # apply: expand's priors and backup
    # ------------------------------------------------------------------

    cdef void apply_group(self, int group, const float* logits, const float* values) noexcept nogil:
        cdef int base = group * self.batch_rows
        cdef int rows = self.rows_pending[group]
        cdef int r, g
        cdef int32_t node
        for r in range(rows):
            g = self.row_game[base + r]
            node = self.row_node[base + r]
            self.apply_row(<Tree>self.trees[g], g, node, logits + <size_t>r * self.num_actions, values[r])
        self.leaves_evaluated += rows
        self.rows_pending[group] = 0

    cdef void apply_row(self, Tree tree, int game, int32_t node, const float* logits,
                        float value) noexcept nogil:
        tree.set_priors(node, logits, value)
        tree.backup(node, value)
        if node == ROOT_INDEX and self.noise_pending[game]:
            tree.add_dirichlet_noise(self.dirichlet_alpha_total, self.dirichlet_epsilon, &self.rng[game])
            self.noise_pending[game] = 0

    # ------------------------------------------------------------------
    # Python API
    # ------------------------------------------------------------------

    def group_games(self, int group):
        """range of the game indices in `group`."""
        self._check_group(group)
        return range(self.group_start(group), self.group_stop(group))

    def _check_group(self, int group):
        if not 0 <= group < self.num_groups:
            raise IndexError(f"group {group} not in 0..{self.num_groups - 1}")

    def _check_game(self, int game):
        if not 0 <= game < self.num_games:
            raise IndexError(f"game {game} not in 0..{self.num_games - 1}")

    def gather(self, int group, float[:, :, :, ::1] out not None):
        """Gather the group's next batch into `out` [batch_rows, N, N, C]; returns rows.

        C is the evaluating model's input planes, 17 or 22 (format/planes.py):
        the leaves get the layout's first C channels."""
        self._check_group(group)
        if (out.shape[0] < self.batch_rows or out.shape[1] != self.board_size
                or out.shape[2] != self.board_size or out.shape[3] not in (BASIC_INPUT_PLANES, NUM_PLANES)):
            raise ValueError(f"batch buffer must be float32 [>= {self.batch_rows}, "
                             f"{self.board_size}, {self.board_size}, {BASIC_INPUT_PLANES} or {NUM_PLANES}]")
        if self.rows_pending[group]:
            raise RuntimeError(f"group {group} still has {self.rows_pending[group]} rows in flight")
        cdef int rows
        self.channels = out.shape[3]
        self.feature_size = self.board_size * self.board_size * self.channels
        with nogil:
            rows = self.gather_group(group, &out[0, 0, 0, 0])
        return rows

    def apply(self, int group, logits, values):
        """Back up the evaluations of the group's last gather.

        logits: float32 [rows, N*N+1]; values: float32 [rows], side to move."""
        self._check_group(group)
        cdef int rows = self.rows_pending[group]
        cdef const float[:, ::1] lg = np.ascontiguousarray(logits, dtype=np.float32)
        cdef const float[::1] vl = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        if lg.shape[0] < rows or lg.shape[1] != self.num_actions or vl.shape[0] < rows:
            raise ValueError(f"evaluation shapes ({lg.shape[0]}, {lg.shape[1]}), ({vl.shape[0]},) do not cover "
                             f"{rows} rows of {self.num_actions} actions")
        if rows == 0:
            return
        with nogil:
            self.apply_group(group, &lg[0, 0], &vl[0])

    def start_search(self, int game, int budget, *, bint gumbel=False, bint noise=False, float gumbel_noise=1.0):
        """Begin the search for the next move of `game` with `budget` simulations.

        ``gumbel_noise`` scales the Gumbel root's draws for this search (`Tree.gumbel_noise`)."""
        self._check_game(game)
        if budget < 0:
            raise ValueError("budget must be >= 0")
        if not 0.0 <= gumbel_noise <= 1.0:
            raise ValueError(f"gumbel_noise must be in [0, 1], got {gumbel_noise}")
        cdef Tree tree = self.trees_list[game]
        cdef Board root = self.roots_list[game]
        if root.st.over:
            raise ValueError(f"game {game} is over")
        tree.begin_search(budget)
        tree.gumbel_noise = gumbel_noise
        self.use_gumbel[game] = gumbel
        self.searching[game] = 1
        self.noise_pending[game] = 0
        if noise and not gumbel:
            if tree.state[ROOT_INDEX] == EXPANDED:
                tree.add_dirichlet_noise(self.dirichlet_alpha_total, self.dirichlet_epsilon, &self.rng[game])
            else:
                self.noise_pending[game] = 1

    def search_done(self, int game):
        """The move search of `game` has spent its budget and has nothing in flight."""
        self._check_game(game)
        cdef Tree tree = self.trees_list[game]
        return bool(self.searching[game] and tree.state[ROOT_INDEX] == EXPANDED
                    and tree.sims_started >= tree.sims_budget and tree.VL[ROOT_INDEX] == 0)

    def done_games(self, int group):
        """Games of `group` whose search is done (see `search_done`)."""
        return [g for g in self.group_games(group) if self.search_done(g)]

    def choose_move(self, int game, float temperature=0.0):
        """The move to play: Gumbel's choice, or by visit counts at `temperature`."""
        self._check_game(game)
        cdef Tree tree = self.trees_list[game]
        if tree.state[ROOT_INDEX] != EXPANDED:
            raise ValueError(f"game {game} has no search result")
        if self.use_gumbel[game]:
            return tree.pick_move_gumbel(&self.gumbel)
        return tree.pick_move_by_visits(temperature, &self.rng[game])

    def visit_target(self, int game):
        """(moves int64, visit counts int64) of the root children with visits."""
        ch = self.trees_list[game].children(ROOT_INDEX)
        keep = ch["N"] > 0
        return ch["move"][keep].astype(np.int64), ch["N"][keep].astype(np.int64)

    def improved_policy(self, int game):
        """(moves int64, probabilities float32) of Gumbel's improved policy."""
        cdef Tree tree = self.trees_list[game]
        moves = tree.children(ROOT_INDEX)["move"].astype(np.int64)
        probs = np.zeros(self.num_actions, np.float32)
        cdef float[::1] view = probs
        cdef int count = tree.improved_policy(&self.gumbel, &view[0])
        return moves, probs[:count].copy()

    def root_value(self, int game):
        """Mean value of the root for the player to move, in [-1, 1]."""
        return self.trees_list[game].root_value

    def move_value(self, int game, int move):
        """Mean value of the root's child for `move`, for the player to move at the root; the root's
        mean value when that child has no visits."""
        self._check_game(game)
        cdef Tree tree = self.trees_list[game]
        children = tree.children(ROOT_INDEX)
        hit = np.flatnonzero((children["move"] == move) & (children["N"] > 0))
        if not len(hit):
            return float(tree.root_value)
        return float(children["W"][hit[0]] / children["N"][hit[0]])

    def used_gumbel(self, int game):
        return bool(self.use_gumbel[game])

    def play(self, int game, int move):
        """Play `move` in `game` (IllegalMove if illegal) and reuse its subtree."""
        self._check_game(game)
        cdef Tree tree = self.trees_list[game]
        cdef Board root = self.roots_list[game]
        if tree.VL[ROOT_INDEX] != 0:
            raise RuntimeError(f"game {game} has simulations in flight")
        root.play(move)
        tree.promote(move)
        self.searching[game] = 0

    def new_game(self, int game, seed=None):
        """Start `game` over on an empty board with an empty tree.

        With ``seed`` (an int below 2**64) the game's random stream (noise,
        move sampling, Gumbel draws) restarts from it, so the same seed and
        the same network replay the same game whatever slot it is played in.
        """
        self._check_game(game)
        if seed is not None:
            if not 0 <= seed < 2 ** 64:
                raise ValueError(f"seed must be in [0, 2**64), got {seed}")
            self.rng[game] = rng_seed(<uint64_t>seed)
        cdef Board old = self.roots_list[game]
        board = PyBoard(self.board_size, old.komi_, old.max_moves_)
        self.roots_list[game] = board
        self.roots[game] = <PyObject*>board
        (<Tree>self.trees_list[game]).clear()
        self.searching[game] = 0
        self.noise_pending[game] = 0

    def set_board(self, int game, Board board not None):
        """Replace `game`'s position (tests: start from an ASCII board)."""
        self._check_game(game)
        if board.N != self.board_size:
            raise ValueError(f"board is {board.N}x{board.N}, batch plays {self.board_size}x{self.board_size}")
        scratch = PyBoard(board.N, board.komi_, board.max_moves_)
        self.roots_list[game] = board
        self.roots[game] = <PyObject*>board
        self.scratch_list[game] = scratch
        self.scratches[game] = <PyObject*>scratch
        (<Tree>self.trees_list[game]).clear()
        self.searching[game] = 0

    def board(self, int game):
        self._check_game(game)
        return self.roots_list[game]

    def tree(self, int game):
        self._check_game(game)
        return self.trees_list[game]

    def stats(self):
        """Counters since construction.

        A *visit* is one new simulation: ``leaves_evaluated - root_evaluations
        + terminal_visits`` (a root's own evaluation starts a search but is no
        simulation; visits kept with a reused subtree are not counted at all).
        """
        return {"leaves_evaluated": self.leaves_evaluated, "root_evaluations": self.root_evaluations,
                "terminal_visits": self.terminal_visits, "collisions": self.collisions,
                "visits": self.leaves_evaluated - self.root_evaluations + self.terminal_visits}
