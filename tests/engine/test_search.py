"""Tests of the search tree (`engine.search`) and of whole searches on Go
positions through the batched driver (`engine.driver`).

Tree-level tests drive `Tree` by hand (expand / evaluate / backup), so each
statistic can be checked against the formula it should follow.  Perspective
reminder: a child's W is seen by the player choosing it, so backing up value v
(seen by the player to move *at the child*) adds -v to the child's W.
"""
import math

import numpy as np
import pytest

from engine.search import Random, Tree, gumbel_visit_sequence

ROOT = 0


def expanded_root(num_actions, logits, value=0.0, moves=None):
    tree = Tree(num_actions)
    moves = list(range(num_actions)) if moves is None else moves
    tree.expand_node(ROOT, moves)
    tree.evaluate_node(ROOT, np.asarray(logits, np.float32), value)
    tree.virtual_loss(ROOT)
    tree.backup_value(ROOT, value)   # the root's own evaluation is its first visit
    return tree


def visit_child(tree, child, value_for_chooser):
    """One completed simulation through `child` with the chooser's value."""
    tree.virtual_loss(child)
    tree.backup_value(child, -value_for_chooser)


def puct_published(tree, node, *, c_init=1.25, c_base=19652.0, fpu_reduction=0.0):
    """Scores Q(s,a) + U(s,a) of `node`'s children by the published PUCT rule.

    Published (AlphaGo Zero, Silver et al. 2017, Methods "Select"; AlphaZero,
    Silver et al. 2018, pseudocode ``ucb_score`` for the growing c(s))::

        a* = argmax_a  Q(s,a) + U(s,a)
        U(s,a) = c(s) * P(s,a) * sqrt(N(s)) / (1 + N(s,a)),   N(s) = sum_b N(s,b)
        c(s)   = c_init + log((1 + N(s) + c_base) / c_base)

    with Q(s,a) = W(s,a) / N(s,a), the mean value for the player choosing a.
    Three rules the papers leave open, stated as this engine's:

    * first-play urgency (FPU, Leela Zero's rule): an unvisited child
      (N(s,a) = 0) takes Q(s,a) = Q(s) - fpu_reduction, where Q(s) is the
      parent's mean value for its own player to move (visits in flight not
      counted).  The papers leave it open (AlphaZero's pseudocode uses 0).
    * virtual loss: each visit in flight counts as a finished visit that the
      choosing player lost: N(s,a) += VL(s,a), W(s,a) -= VL(s,a); N(s) is the
      sum of those, so it includes the visits in flight too.
    * first selection: at N(s) = 0 sqrt(N(s)) is taken as 1, so the priors
      rank the (all unvisited) children; by the formula every U would be 0.

    Returns (child node indices, scores).  Nothing here reads the engine's
    code: only its statistics (N, W, P, VL) through `Tree.node`/`children`.
    """
    parent, children = tree.node(node), tree.children(node)
    n_sa = children["N"] + children["VL"]                       # virtual loss: in flight = visited
    w_sa = children["W"].astype(np.float64) - children["VL"]    # ... and lost
    n_s = n_sa.sum()
    q_s = -parent["W"] / parent["N"]                            # parent's value for its player to move
    q_sa = np.where(n_sa > 0, w_sa / np.maximum(n_sa, 1), q_s - fpu_reduction)
    c_s = c_init + math.log((1 + n_s + c_base) / c_base)
    u_sa = c_s * children["P"] * math.sqrt(n_s if n_s > 0 else 1) / (1 + n_sa)
    return children["index"], q_sa + u_sa


def published_pick(tree, node, **rule):
    """The move the published rule picks (ties: the first child, as children are in action order)."""
    index, scores = puct_published(tree, node, **rule)
    return tree.node(int(index[np.argmax(scores)]))["move"]


def engine_pick(tree, node, **rule):
    return tree.node(tree.select(node, **rule))["move"]


QUARTERS = np.log([0.5, 0.25, 0.125, 0.125])
"""Logits whose softmax is exactly P = (1/2, 1/4, 1/8, 1/8): priors a reader can check by hand."""


def test_puct_hand_computed_root_case():
    # Root value 0.1 (its own evaluation is its first visit).  Then, with the
    # chooser's values: move 0 once at -0.5, move 1 twice at 0.2 and 0.0.
    tree = expanded_root(4, QUARTERS, value=0.1)
    children = tree.children(ROOT)["index"]
    visit_child(tree, children[0], -0.5)
    visit_child(tree, children[1], 0.2)
    visit_child(tree, children[1], 0.0)
    # N(s) = 1 + 2 = 3.  c(s) = 1.25 + ln(19656 / 19652) = 1.250204.
    # c(s) * sqrt(3) = 1.250204 * 1.732051 = 2.165417.
    # Q(s) for the root player = (0.1 - 0.5 + 0.2 + 0.0) / 4 = -0.05; FPU = -0.05 - 0.25 = -0.30.
    #   move 0: Q = -0.5          U = 2.165417 * 0.5   / 2 = 0.541354   -> 0.041354
    #   move 1: Q = 0.2 / 2 = 0.1 U = 2.165417 * 0.25  / 3 = 0.180451   -> 0.280451  <- best
    #   move 2: Q = FPU = -0.30   U = 2.165417 * 0.125 / 1 = 0.270677   -> -0.029323
    #   move 3: the same as move 2.
    rule = {"fpu_reduction_root": 0.25}
    _, scores = puct_published(tree, ROOT, fpu_reduction=0.25)
    np.testing.assert_allclose(scores, [0.041354, 0.280451, -0.029323, -0.029323], atol=2e-6)
    assert engine_pick(tree, ROOT, **rule) == 1
    # Move 1 goes in flight (virtual loss): it counts as a third visit, lost.
    # N(s) = 4, c(s) * sqrt(4) = 1.250254 * 2 = 2.500509; Q(s) stays -0.05 (in-flight visits do not count).
    #   move 0: Q = -0.5                      U = 2.500509 * 0.5   / 2 = 0.625127 -> 0.125127  <- best
    #   move 1: Q = (0.2 - 1) / 3 = -0.266667 U = 2.500509 * 0.25  / 4 = 0.156282 -> -0.110385
    #   move 2: Q = FPU = -0.30               U = 2.500509 * 0.125 / 1 = 0.312564 -> 0.012564
    tree.virtual_loss(children[1])
    _, scores = puct_published(tree, ROOT, fpu_reduction=0.25)
    np.testing.assert_allclose(scores, [0.125127, -0.110385, 0.012564, 0.012564], atol=2e-6)
    assert engine_pick(tree, ROOT, **rule) == 0


def interior_node(priors=(0.6, 0.3, 0.1)):
    """Root -> move 0 -> node X (expanded, priors `priors`); X's value 0 at its
    evaluation, then X's move 0 visited once at -0.2 (seen by X's player)."""
    tree = expanded_root(3, [0.0, 0.0, 0.0], value=0.0)
    x = tree.children(ROOT)["index"][0]
    tree.expand_node(x, [0, 1, 2])
    tree.evaluate_node(x, np.log(np.asarray(priors, np.float32)), 0.0)
    tree.virtual_loss(x)
    tree.backup_value(x, 0.0)                      # X's own evaluation: its first visit
    visit_child(tree, tree.children(x)["index"][0], -0.2)
    return tree, x


def test_puct_hand_computed_fpu_cases():
    # At X: N(s) = 1, c(s) * sqrt(1) = 1.25 + ln(19654 / 19652) = 1.250102.
    # Q(s) for X's player = (0.0 - 0.2) / 2 = -0.1.
    #   move 0: Q = -0.2   U = 1.250102 * 0.6 / 2 = 0.375031            -> 0.175031
    #   move 1: Q = FPU    U = 1.250102 * 0.3     = 0.375031            -> FPU + 0.375031
    #   move 2: Q = FPU    U = 1.250102 * 0.1     = 0.125010            -> FPU + 0.125010
    # FPU reduction 0:    FPU = -0.1,  move 1 scores 0.275031: the unvisited move wins.
    # FPU reduction 0.25: FPU = -0.35, move 1 scores 0.025031: the visited move 0 wins.
    tree, x = interior_node()
    _, scores = puct_published(tree, x, fpu_reduction=0.0)
    np.testing.assert_allclose(scores, [0.175031, 0.275031, 0.025010], atol=2e-6)
    _, scores = puct_published(tree, x, fpu_reduction=0.25)
    np.testing.assert_allclose(scores, [0.175031, 0.025031, -0.224990], atol=2e-6)
    assert engine_pick(tree, x, fpu_reduction=0.0, fpu_reduction_root=0.25) == 1
    assert engine_pick(tree, x, fpu_reduction=0.25, fpu_reduction_root=0.0) == 0   # X is not the root
    # The same statistics at the root: there fpu_reduction_root applies instead.
    root = expanded_root(3, np.log([0.6, 0.3, 0.1]), value=0.0)
    visit_child(root, root.children(ROOT)["index"][0], -0.2)
    assert engine_pick(root, ROOT, fpu_reduction=0.25, fpu_reduction_root=0.0) == 1
    assert engine_pick(root, ROOT, fpu_reduction=0.0, fpu_reduction_root=0.25) == 0


def test_puct_first_selection_follows_the_priors():
    # Nothing visited below the root: N(s) = 0, every child unvisited.  By the
    # formula U = 0 for all and every score is the same FPU (a tie); the
    # engine's first-selection rule (sqrt(N(s)) taken as 1) lets the prior
    # decide: U = c(s) * P = (1.25 + ln(19653 / 19652)) * P = 1.250051 * P,
    # so the highest prior wins wherever it is.
    for priors, best in (([0.2, 0.5, 0.3], 1), ([0.1, 0.2, 0.7], 2), ([0.6, 0.3, 0.1], 0)):
        tree = expanded_root(3, np.log(priors), value=0.4)
        _, scores = puct_published(tree, ROOT, fpu_reduction=0.25)
        np.testing.assert_allclose(scores - scores.min(), 1.250051 * (np.array(priors) - min(priors)), atol=1e-6)
        assert engine_pick(tree, ROOT, fpu_reduction_root=0.25) == best


def test_puct_matches_the_published_rule_on_random_trees():
    """Random statistics (visits, values, visits in flight, priors, c_init,
    c_base, FPU reduction) at the root: the engine picks what the published
    rule picks.  Skipped: near-ties (float32 statistics), and the trees where
    the one known difference decides the pick: the engine's c(s) counts the
    node's own evaluation as a visit (N(s) + 1 in the logarithm), which moves
    c(s) by ln((c_base + N(s) + 2) / (c_base + N(s) + 1)): < 5.1e-5 at the
    default c_base, enough to matter only with a small c_base such as 50."""
    rng = np.random.default_rng(5)
    checked = 0
    for trial in range(300):
        tree = expanded_root(6, rng.normal(size=6) * 2, value=float(rng.uniform(-1, 1)))
        children = tree.children(ROOT)["index"]
        for _ in range(int(rng.integers(0, 30))):
            visit_child(tree, children[int(rng.integers(6))], float(rng.uniform(-1, 1)))
        for _ in range(int(rng.integers(0, 4))):
            tree.virtual_loss(children[int(rng.integers(6))])
        c_init, c_base = float(rng.choice([0.5, 1.25, 2.5])), float(rng.choice([19652.0, 50.0]))
        fpu = float(rng.choice([0.0, 0.25, 0.5]))
        _, scores = puct_published(tree, ROOT, c_init=c_init, c_base=c_base, fpu_reduction=fpu)
        top = np.sort(scores)[::-1]
        # c(s) as the engine counts it, ln((2 + N + c_base) / c_base), is the published
        # c(s) with c_base' = c_base + 1 and c_init' = c_init + ln((c_base + 1) / c_base).
        _, shifted = puct_published(tree, ROOT, c_init=c_init + math.log((c_base + 1) / c_base),
                                    c_base=c_base + 1, fpu_reduction=fpu)
        if top[0] - top[1] < 1e-4 or np.argmax(shifted) != np.argmax(scores):
            continue
        engine = engine_pick(tree, ROOT, c_puct_init=c_init, c_puct_base=c_base, fpu_reduction_root=fpu)
        assert engine == published_pick(tree, ROOT, c_init=c_init, c_base=c_base, fpu_reduction=fpu), \
            (trial, scores)
        checked += 1
    assert checked > 270


def test_priors_are_softmax_over_legal_children_only():
    logits = np.array([1.0, 2.0, 3.0, 50.0, 0.5], np.float32)
    tree = Tree(5)
    tree.expand_node(ROOT, [0, 1, 2, 4])        # action 3 illegal: its logit ignored
    tree.evaluate_node(ROOT, logits, 0.0)
    legal = logits[[0, 1, 2, 4]]
    expected = np.exp(legal - legal.max()) / np.exp(legal - legal.max()).sum()
    np.testing.assert_allclose(tree.children(ROOT)["P"], expected, rtol=1e-6)


def test_puct_picks_follow_the_formula():
    tree = expanded_root(4, [0.0, 1.0, 0.5, -1.0], value=0.1)
    # Unvisited: FPU; highest prior wins.
    assert tree.node(tree.select(ROOT, fpu_reduction=0.25, fpu_reduction_root=0.25))["move"] == 1
    children = tree.children(ROOT)["index"]
    visit_child(tree, children[1], -0.9)           # the favourite turns out bad
    visit_child(tree, children[2], 0.8)
    visit_child(tree, children[2], 0.6)
    for _ in range(3):
        pick = tree.select(ROOT, fpu_reduction_root=0.25)
        assert tree.node(pick)["move"] == published_pick(tree, ROOT, fpu_reduction=0.25)
        visit_child(tree, pick, 0.2)
    # The good move has most visits now, the refuted one stays at one.
    counts = tree.visit_counts()
    assert counts[1] == 1 and counts[2] == counts.max()


def test_virtual_loss_spreads_leaves_within_a_batch():
    tree = expanded_root(6, np.zeros(6), value=0.0)
    picked = []
    for _ in range(6):
        leaf = tree.select(ROOT)
        tree.virtual_loss(leaf)                 # in flight: not backed up yet
        picked.append(leaf)
    assert len(set(picked)) == 6                # six different leaves in one batch
    assert tree.node(ROOT)["VL"] == 6
    for leaf in picked:
        tree.backup_value(leaf, 0.0)
    assert tree.node(ROOT)["VL"] == 0 and tree.node(ROOT)["N"] == 7
    assert all(tree.children(ROOT)["VL"] == 0)


def test_backup_alternates_perspective_and_terminal_value_propagates():
    tree = expanded_root(3, np.zeros(3))
    child = tree.children(ROOT)["index"][0]
    tree.expand_node(child, [0, 2])
    tree.evaluate_node(child, np.zeros(3, np.float32), 0.0)
    grandchild = tree.children(child)["index"][1]
    # A won game for the player to move at the grandchild (the root player).
    tree.mark_terminal(grandchild, 1.0)
    tree.virtual_loss(grandchild)
    tree.backup_value(grandchild, 1.0)
    assert tree.node(grandchild)["W"] == -1.0    # seen by its mover (the opponent)
    assert tree.node(child)["W"] == 1.0          # seen by the root player
    assert tree.node(ROOT)["W"] == -1.0
    assert tree.node(grandchild)["state"] == 3   # TERMINAL


def test_dirichlet_noise_keeps_priors_normalised():
    tree = expanded_root(82, np.linspace(-1, 1, 82))
    before = tree.children(ROOT)["P"].copy()
    tree.dirichlet(10.83, 0.25, Random(7))
    after = tree.children(ROOT)["P"]
    assert after.sum() == pytest.approx(1.0, abs=1e-5)
    assert np.all(after >= 0.75 * before - 1e-7)
    assert np.abs(after - before).max() > 1e-3  # something moved


def test_gamma_draws_have_the_right_mean():
    rng = Random(3)
    for alpha in (0.1, 0.5, 2.0):
        draws = np.array([rng.gamma(alpha) for _ in range(20000)])
        assert draws.mean() == pytest.approx(alpha, rel=0.06)
        assert draws.min() >= 0.0


def test_tree_reuse_keeps_the_subtree_statistics():
    tree = expanded_root(4, [0.0, 1.0, 0.0, 0.0])
    child = tree.children(ROOT)["index"][1]
    tree.expand_node(child, [0, 2, 3])
    tree.virtual_loss(child)
    tree.evaluate_node(child, np.array([0.0, 0.0, 2.0, 0.0], np.float32), 0.3)
    tree.backup_value(child, 0.3)
    grand = tree.children(child)["index"]
    visit_child(tree, grand[1], 0.5)
    visit_child(tree, grand[1], 0.1)
    visit_child(tree, grand[0], -0.2)
    old_child = tree.node(child)
    old_grand = tree.children(child)
    tree.promote_move(1)
    root = tree.node(ROOT)
    assert (root["N"], root["W"], root["move"], root["parent"]) == (
        old_child["N"], old_child["W"], 1, -1)
    new = tree.children(ROOT)
    for key in ("move", "N", "W", "P"):
        np.testing.assert_array_equal(new[key], old_grand[key])
    assert tree.size == 1 + 3                   # siblings of the move were dropped
    assert tree.root_value == pytest.approx(-old_child["W"] / old_child["N"])
    # A move that was never expanded restarts from an empty root.
    tree.promote_move(0)
    assert tree.size == 1 and tree.node(ROOT)["state"] == 0


def test_gumbel_visit_sequence_is_sequential_halving():
    # m = 4, n = 8: phase 1 visits 4 actions once, then 2 actions twice more.
    assert gumbel_visit_sequence(4, 8) == [0, 0, 0, 0, 1, 1, 2, 2]
    # m = 16, n = 32: 16 x 1 (level 0), then 8 x 1, then 4 x 2 (levels 2, 3)
    sequence = gumbel_visit_sequence(16, 32)
    assert sequence[:16] == [0] * 16 and sequence[16:24] == [1] * 8
    assert sequence[24:] == [2, 2, 2, 2, 3, 3, 3, 3]
    assert gumbel_visit_sequence(1, 3) == [0, 1, 2]


def completed_sigma_reference(tree, c_visit=50.0, c_scale=0.1):
    ch = tree.children(ROOT)
    root = tree.node(ROOT)
    visited = ch["N"] > 0
    q = np.where(visited, ch["W"] / np.maximum(ch["N"], 1), 0.0)
    sum_n = ch["N"].sum()
    weighted = (ch["P"][visited] * q[visited]).sum() / max(ch["P"][visited].sum(), 1e-30)
    mixed = (root["raw_value"] + sum_n * weighted) / (sum_n + 1)
    completed = np.where(visited, q, mixed)
    completed = (completed - completed.min()) / max(completed.max() - completed.min(), 1e-8)
    return (c_visit + ch["N"].max()) * c_scale * completed


@pytest.mark.parametrize("budget", [2, 3, 16, 64])
def test_gumbel_halving_returns_the_improved_policy(budget):
    # A bandit: action 5 is the only good move but has a small prior.
    values = np.full(8, -0.5)
    values[5] = 0.9
    logits = np.array([2.0, 1.5, 1.0, 1.0, 0.5, 0.4, 0.0, 0.0], np.float32)
    best_moves = []
    for seed in range(20):
        tree = expanded_root(8, logits, value=0.0)
        tree.start_search(budget)
        rng = Random(seed)
        for _ in range(budget):
            child = tree.select_root(rng, max_considered=8)
            visit_child(tree, child, values[tree.node(child)["move"]])
        assert tree.select_root(rng, max_considered=8) == -1  # budget spent
        policy, move = tree.gumbel_policy(max_considered=8)
        prior = tree.children(ROOT)["P"]
        expected = np.log(prior) + completed_sigma_reference(tree)
        expected = np.exp(expected - expected.max())
        np.testing.assert_allclose(policy, expected / expected.sum(), rtol=1e-4, atol=1e-6)
        assert tree.visit_counts().sum() == budget
        best_moves.append(move)
        if tree.visit_counts()[5] > 0:
            # Once seen, the good move gains mass over its prior: the target
            # improves the policy even with 2 visits.
            assert policy[5] > prior[5]
    if budget >= 16:
        assert all(m == 5 for m in best_moves)
    else:
        assert 5 in best_moves


def test_pick_move_by_visits_temperature():
    tree = expanded_root(3, np.zeros(3))
    children = tree.children(ROOT)["index"]
    for _ in range(30):
        visit_child(tree, children[2], 0.0)
    for _ in range(10):
        visit_child(tree, children[0], 0.0)
    assert tree.pick_move(0.0, Random(1)) == 2
    rng = Random(5)
    picks = [tree.pick_move(1.0, rng) for _ in range(4000)]
    assert picks.count(1) == 0
    assert picks.count(2) / 4000 == pytest.approx(0.75, abs=0.03)


# ---------------------------------------------------------------------------
# Whole searches on Go positions (engine.driver + engine.board)
# ---------------------------------------------------------------------------

from engine.board import Board, board_from_ascii  # noqa: E402
from engine.driver import GameBatch  # noqa: E402

from engine.search import STATE_TERMINAL as TERMINAL  # noqa: E402


def material_evaluator(planes):
    """A 'strong' fake network: uniform policy, value = stone balance.

    Channel 0 is the side to move's stones now, channel 8 the opponent's, so
    the value is already from the side to move's view."""
    own = planes[..., 0].sum(axis=(1, 2))
    opp = planes[..., 8].sum(axis=(1, 2))
    size = planes.shape[1]
    return np.zeros((len(planes), size * size + 1), np.float32), np.tanh((own - opp) / 3.0).astype(np.float32)


def uniform_evaluator(planes):
    size = planes.shape[1]
    return np.zeros((len(planes), size * size + 1), np.float32), np.zeros(len(planes), np.float32)


def search(batch, game, budget, evaluator, **kwargs):
    """Run one move's search of `game` to completion; returns rows per gather."""
    buffer = np.zeros((batch.batch_rows, batch.board_size, batch.board_size, 17), np.float32)
    batch.start_search(game, budget, **kwargs)
    fills = []
    while not batch.search_done(game):
        rows = batch.gather(0, buffer)
        if rows == 0:       # the rest of the budget went to game-over leaves
            assert batch.search_done(game), "search stalled"
            break
        fills.append(rows)
        logits, values = evaluator(buffer[:rows])
        assert logits.shape == (rows, batch.num_actions) and values.shape == (rows,)
        batch.apply(0, logits, values)
    return fills


CAPTURE_9 = """
. . . . . . . . .
. . . . . . . . .
. . X X X X . . .
. X O O O O . . .
. . X X X X . . .
. . . . . . . . .
. . . . . . . . .
. . . . . . . . .
. . . . . . . . .
"""
"""Black to play; White's chain of four has one liberty left, at row 3 col 6."""


def embed(ascii_board, size):
    """The ASCII board in the top-left corner of an empty size x size board."""
    rows = [r.split() for r in ascii_board.strip().splitlines()]
    grid = [["."] * size for _ in range(size)]
    for r, row in enumerate(rows):
        grid[r][:len(row)] = row
    return "\n".join(" ".join(r) for r in grid)


@pytest.mark.parametrize("size", [9, 19])
@pytest.mark.parametrize("gumbel", [False, True])
def test_search_with_a_material_evaluator_finds_the_capture(size, gumbel):
    board = board_from_ascii(embed(CAPTURE_9, size), to_play=1)
    capture = 3 * size + 6
    # The fake network's policy is uniform, so Gumbel must consider every
    # move to be sure to sample the capture (a real prior would favour it).
    batch = GameBatch(size, 1, num_groups=1, leaves_per_game=8, seed=3,
                      gumbel_max_considered=size * size + 1)
    batch.set_board(0, board)
    search(batch, 0, 256 if size == 9 else 800, material_evaluator, gumbel=gumbel)
    move = batch.choose_move(0, 0.0)
    assert move == capture
    if not gumbel:
        counts = batch.visit_target(0)
        assert counts[0][np.argmax(counts[1])] == capture
    batch.play(0, move)
    assert batch.board(0).stones()[3, 2:6].tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("size", [9, 19])
def test_terminal_positions_are_scored_by_the_rules_not_the_network(size):
    # Empty board, Black passed: White passing ends the game, and White wins
    # by komi.  The evaluator claims the opposite everywhere (+1 for the side
    # to move after White's pass, i.e. Black): the tree must believe the rules.
    board = Board(size, 7.5)
    board.play(size * size)
    # The plain legal-move tree: with sensible_moves PASS is not a child here.
    batch = GameBatch(size, 1, num_groups=1, seed=1, sensible_moves=False)
    batch.set_board(0, board)

    def lying_evaluator(planes):
        logits, _ = uniform_evaluator(planes)
        logits[:, -1] = 3.0                         # and it likes passing
        return logits, np.ones(len(planes), np.float32)

    search(batch, 0, 200, lying_evaluator)
    tree = batch.tree(0)
    children = tree.children(0)
    pass_child = int(children["index"][children["move"] == size * size][0])
    info = tree.node(pass_child)
    assert info["state"] == TERMINAL
    assert info["raw_value"] == -1.0               # Black to move there, Black lost
    assert info["W"] == pytest.approx(info["N"])   # every visit a win for White
    assert batch.choose_move(0, 0.0) == size * size


def test_virtual_loss_puts_several_leaves_of_one_game_in_a_batch():
    batch = GameBatch(9, 1, num_groups=1, leaves_per_game=8, seed=0)
    buffer = np.zeros((batch.batch_rows, 9, 9, 17), np.float32)
    batch.start_search(0, 64)
    assert batch.gather(0, buffer) == 1            # only the root until it is evaluated
    batch.apply(0, *uniform_evaluator(buffer[:1]))
    rows = batch.gather(0, buffer)
    assert rows == 8
    tree = batch.tree(0)
    assert tree.node(0)["VL"] == 8
    assert len({buffer[r].tobytes() for r in range(rows)}) == 8   # eight different positions
    batch.apply(0, *uniform_evaluator(buffer[:rows]))
    assert tree.node(0)["VL"] == 0 and tree.node(0)["N"] == 9


def test_tree_reuse_across_moves_in_the_driver():
    batch = GameBatch(9, 1, num_groups=1, seed=5)
    search(batch, 0, 128, material_evaluator)
    move = batch.choose_move(0, 0.0)
    child = batch.tree(0).children(0)
    kept = int(child["N"][child["move"] == move][0])
    batch.play(0, move)
    assert batch.tree(0).root_visits == kept
    search(batch, 0, 64, material_evaluator)
    assert batch.tree(0).root_visits == kept + 64  # budget counts new simulations


def test_dirichlet_noise_on_a_full_search_root():
    batch = GameBatch(9, 1, num_groups=1, seed=2)
    buffer = np.zeros((batch.batch_rows, 9, 9, 17), np.float32)
    batch.start_search(0, 16, noise=True)
    rows = batch.gather(0, buffer)
    batch.apply(0, *uniform_evaluator(buffer[:rows]))
    priors = batch.tree(0).children(0)["P"]
    assert priors.sum() == pytest.approx(1.0, abs=1e-5)
    assert priors.std() > 1e-3                     # no longer uniform


@pytest.mark.parametrize("budget", [1, 2, 4])
def test_gumbel_search_with_few_visits_gives_a_policy_target(budget):
    batch = GameBatch(9, 1, num_groups=1, seed=9)
    search(batch, 0, budget, material_evaluator, gumbel=True)
    moves, probs = batch.improved_policy(0)
    assert len(moves) == 81 and probs.sum() == pytest.approx(1.0, abs=1e-5)  # no PASS: sensible moves
    assert batch.tree(0).visit_counts().sum() == budget
    assert batch.choose_move(0) in moves


@pytest.mark.parametrize("gumbel", [False, True])
def test_with_the_pass_rule_the_winner_answers_a_pass_with_a_pass_and_leaves_the_seki(gumbel):
    from tests.engine.test_board import SEKI_9, SEKI_9_SHARED

    # Black is ahead by 5.5 as the board stands and White has just passed.
    # Black's only sensible moves fill a shared liberty of the seki, which
    # loses; with the rule Black passes, which ends the game and wins it.
    for rule, expect in ((True, "pass"), (False, "fill")):
        board = board_from_ascii(SEKI_9, to_play=-1, komi=7.5)
        board.play(81)
        batch = GameBatch(9, 1, num_groups=1, seed=6, pass_when_winning=rule)
        assert batch.pass_when_winning == rule and batch.sensible_moves
        batch.set_board(0, board)
        search(batch, 0, 32, uniform_evaluator, gumbel=gumbel)
        move = batch.choose_move(0, 0.0)
        if expect == "fill":
            assert move in SEKI_9_SHARED
            continue
        assert move == 81
        children = batch.tree(0).children(0)
        assert sorted(children["move"].tolist()) == [*SEKI_9_SHARED, 81]
        assert batch.tree(0).node(int(children["index"][children["move"] == 81][0]))["state"] == TERMINAL
        batch.play(0, move)
        final = batch.board(0)
        assert final.is_over and final.consecutive_passes == 2
        assert final.area_score() == 5.5           # Black wins, both seki chains standing
        assert final.stones()[0:3, 0].tolist() == [1, 1, 1]


def test_with_the_pass_rule_a_19x19_winner_passes_instead_of_filling_its_area():
    from tests.engine.test_board import INVADED_19

    # White captures the lone Black stone, Black passes: White is ahead as the
    # board stands (190 to 171, komi 7.5) and has a whole area to fill.
    board = board_from_ascii(INVADED_19, to_play=-1, komi=7.5)
    for move in (8 * 19 + 14, 361, 10 * 19 + 14, 361, 9 * 19 + 13, 361, 9 * 19 + 15, 361):
        board.play(move)
    assert board.to_play == -1 and board.mover_score() == 26.5
    for rule in (True, False):
        batch = GameBatch(19, 1, num_groups=1, seed=7, pass_when_winning=rule)
        batch.set_board(0, board.copy())
        # Uniform priors over about 190 children: the budget lets the search try them all.
        search(batch, 0, 400, uniform_evaluator)
        move = batch.choose_move(0, 0.0)
        assert (move == 361) == rule
        batch.play(0, move)
        assert batch.board(0).is_over == rule
    assert batch.board(0).stones()[move // 19, move % 19] == -1     # without it: a stone in its own area


def test_sensible_moves_skip_own_eyes_and_pass_only_when_nothing_is_left():
    # Black owns the top-left corner with a real eye at A9 (point 0).
    board = board_from_ascii("""
        . X . . . . . . .
        X X . . . . . . .
        . . . . . . . . .
        . . . . . . . . .
        . . . . . . . . .
        . . . . . . . . .
        . . . . . . . . .
        . . . . . . . . .
        . . . . . . . . .
    """, to_play=1)
    for sensible, expect_eye, expect_pass in ((True, False, False), (False, True, True)):
        batch = GameBatch(9, 1, num_groups=1, seed=4, sensible_moves=sensible)
        batch.set_board(0, board)
        search(batch, 0, 8, uniform_evaluator)
        moves = set(batch.tree(0).children(0)["move"].tolist())
        assert (0 in moves) == expect_eye
        assert (81 in moves) == expect_pass
    # With only own eyes left, PASS is the one sensible move.
    full = Board(5, 0.5)
    for p in range(25):
        if p not in (0, 12, 24):
            full.play(p)
            full.play(25)  # White passes
    sensible = full.sensible_mask()
    assert sensible[:25].sum() == 0 and sensible[25] == 1


def tilted_evaluator(planes):
    """Priors that prefer lower-numbered points, value 0: a policy with a clear top few."""
    size = planes.shape[1]
    logits = np.concatenate([-np.arange(size * size, dtype=np.float32) / 10.0, [-50.0]]).astype(np.float32)
    return np.tile(logits, (len(planes), 1)), np.zeros(len(planes), np.float32)


def test_without_gumbel_noise_the_root_plays_the_same_move_whatever_the_seed():
    chosen = {}
    for noise in (1.0, 0.0):
        chosen[noise] = set()
        for seed in range(12):
            batch = GameBatch(9, 1, num_groups=1, seed=seed)
            search(batch, 0, 8, tilted_evaluator, gumbel=True, gumbel_noise=noise)
            assert batch.tree(0).gumbel_noise == noise
            chosen[noise].add(batch.choose_move(0))
    # With the draws at full scale the seeds sample several moves; with none the priors alone decide.
    assert len(chosen[1.0]) > 1 and chosen[0.0] == {0}
    with pytest.raises(ValueError, match="gumbel_noise must be in"):
        GameBatch(9, 1, num_groups=1, seed=0).start_search(0, 8, gumbel=True, gumbel_noise=1.5)


def test_a_moves_value_is_its_childs_mean_for_the_player_to_move():
    batch = GameBatch(9, 1, num_groups=1, seed=3)
    search(batch, 0, 32, material_evaluator)
    children = batch.tree(0).children(0)
    visited = np.flatnonzero(children["N"] > 0)
    for k in visited[:5]:
        assert batch.move_value(0, int(children["move"][k])) == pytest.approx(children["W"][k] / children["N"][k])
    unvisited = np.flatnonzero(children["N"] == 0)
    if len(unvisited):
        assert batch.move_value(0, int(children["move"][unvisited[0]])) == pytest.approx(batch.root_value(0))
