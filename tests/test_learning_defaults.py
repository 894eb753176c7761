"""The learning defaults of issue 16, part 3, each pinned by the behaviour that made it the default.

* Generation 0 searches with random playouts (`selfplay.playouts.playout_values`
  behind `PlayoutEvaluator`): its values must be those of real playouts,
  seen from the side to move, reproducible, and a non-position must not
  crash a worker's batch.
* The conv policy head learns a rule that holds at every point ("never play
  on a stone") from a few hundred examples, where AlphaGo Zero's dense head
  has to learn it point by point.  A run started with the dense head still
  resumes with ``--policy-head dense``; without it the trainer names the flag.
* The loop's long-run mode (``--hours``) resolves its 'auto' settings, and
  its closing match against generation 0 plays the run's own generation-0
  player.
"""
import numpy as np
import pytest

from selfplay.board import Board, board_from_ascii
from selfplay.playouts import playout_values
from selfplay.config import WorkerConfig
from selfplay.evaluator import UniformEvaluator
from selfplay.player import PlayoutEvaluator
from selfplay.worker import generation0_evaluator

# Black owns the left five columns with two eyes, White the right three: the
# game is decided whatever random moves follow (Black 45 - White 27 - 7.5).
DECIDED = """
    XXXX.XOOO
    X.XXXXO.O
    XXXXXXOOO
    XXXXXXO.O
    XXXXXXOOO
    XXXXXXOOO
    XXXXXXO.O
    XXX.XXOOO
    XXXXXXOOO
"""


def planes_of(*boards):
    return np.stack([board.features() for board in boards]).astype(np.float32)


def test_playout_values_score_a_decided_position_for_the_side_to_move():
    black_to_move = board_from_ascii(DECIDED, to_play=1)
    white_to_move = board_from_ascii(DECIDED, to_play=-1)
    values = playout_values(planes_of(black_to_move, white_to_move), 7.5, 4, 1)
    assert values.dtype == np.float32 and values.tolist() == [1.0, -1.0]
    # Komi large enough to turn the result turns the values.
    assert playout_values(planes_of(black_to_move), 40.5, 4, 1).tolist() == [-1.0]


@pytest.mark.parametrize("size", [9, 19])
def test_playout_values_match_python_playouts_on_average_and_are_reproducible(size):
    board = Board(size)
    board.play(size * size // 2)       # White to move after Black's centre stone
    planes = planes_of(*[board] * 64)
    values = playout_values(planes, 7.5, 32, 5)
    assert np.array_equal(values, playout_values(planes, 7.5, 32, 5))
    assert not np.array_equal(values, playout_values(planes, 7.5, 32, 6))
    assert np.all(np.abs(values) <= 1)
    # The same playouts run from Python: the means agree within sampling error
    # (64 x 32 playouts each; the standard error of a difference is ~0.03).
    reference = []
    for seed in range(2048):
        leaf = Board(size)
        leaf.set_position(board.stones(), board.to_play)
        leaf.random_playout(seed)
        reference.append(np.sign(leaf.area_score()) * board.to_play)
    assert abs(values.mean() - np.mean(reference)) < 0.12


def test_playout_values_give_zero_to_a_row_that_is_not_a_position_and_refuse_bad_shapes():
    good = Board(9).features()
    broken = good.copy()
    broken[0, 0, 0] = broken[0, 1, 8] = broken[1, 0, 8] = 1.0   # a stone with no liberty
    values = playout_values(np.stack([broken, good]), 7.5, 2, 1)
    assert values[0] == 0.0
    with pytest.raises(ValueError, match=r"\[B, N, N, 17\]"):
        playout_values(np.zeros((2, 9, 9, 16), np.float32), 7.5, 1, 1)
    with pytest.raises(ValueError, match="playouts"):
        playout_values(np.stack([good]), 7.5, 0, 1)
    assert playout_values(np.zeros((0, 9, 9, 17), np.float32), 7.5, 1, 1).shape == (0,)


def test_generation_0_plays_with_random_playouts_unless_told_otherwise(tmp_path):
    config = WorkerConfig(root=str(tmp_path / "lake"), board_size=9, seed=3)
    evaluator = generation0_evaluator(config)
    assert isinstance(evaluator, PlayoutEvaluator) and evaluator.playouts == 1 and evaluator.generation == 0
    assert isinstance(generation0_evaluator(WorkerConfig(root=str(tmp_path / "lake"), board_size=9,
                                                         generation0_playouts=0)), UniformEvaluator)
    with pytest.raises(ValueError, match="--generation0-playouts"):
        WorkerConfig(root=str(tmp_path / "lake"), generation0_playouts=-1)
    # Its output has the evaluator shape: logits [B, N*N + 1] (uniform priors) and values [B].
    logits, values = evaluator(planes_of(Board(9), Board(9)))
    assert logits.shape == (2, 82) and not logits.any() and values.shape == (2,)


# --- the conv policy head ------------------------------------------------------

def _occupied_mass_after_training(policy_head: str, steps: int = 150) -> float:
    """Train a one-block network's policy on positions whose targets are uniform over the empty points."""
    import tensorflow as tf

    from model.network import NetworkConfig, build_network

    tf.keras.utils.set_random_seed(1)
    rng = np.random.default_rng(1)
    n = 9
    network = build_network(NetworkConfig(board_size=n, blocks=1, filters=16, policy_head=policy_head,
                                          sync_batchnorm=False))
    optimizer = tf.keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True)   # the trainer's optimiser

    def batch(size=64):
        planes = np.zeros((size, n, n, 17), np.float32)
        stones = rng.random((size, n, n)) < rng.uniform(0.2, 0.6, (size, 1, 1))
        own = stones & (rng.random((size, n, n)) < 0.5)
        planes[..., 0], planes[..., 8], planes[..., 16] = own, stones & ~own, 1.0
        empty = (~stones).reshape(size, -1).astype(np.float32)
        target = np.concatenate([empty, np.zeros((size, 1), np.float32)], 1)
        return planes, target / target.sum(1, keepdims=True), stones.reshape(size, -1)

    variables = network.trainable_variables

    @tf.function
    def step(planes, target):
        with tf.GradientTape() as tape:
            logits = network(planes, training=True)["policy_logits"]
            loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=logits))
        # The policy loss only: the other heads get no gradient (None), so leave them out.
        gradients = tape.gradient(loss, variables)
        optimizer.apply_gradients([(g, v) for g, v in zip(gradients, variables) if g is not None])

    for _ in range(steps):
        planes, target, _ = batch()
        step(planes, target)
    planes, _, stones = batch(256)
    probabilities = tf.nn.softmax(network(planes, training=False)["policy_logits"]).numpy()
    return float((probabilities[:, :-1] * stones).sum(1).mean())


def test_the_conv_policy_head_learns_a_rule_of_every_point_that_the_dense_head_does_not():
    conv, dense = _occupied_mass_after_training("conv"), _occupied_mass_after_training("dense")
    # An untrained policy puts about 40% of its mass on stones (the share of occupied points).
    assert conv < 0.1, conv
    assert dense > 2 * conv, (dense, conv)


def test_a_conv_head_has_one_weight_set_for_all_points_and_the_dense_head_still_builds():
    from model.network import NetworkConfig, build_network

    for head in ("conv", "dense"):
        network = build_network(NetworkConfig(board_size=9, blocks=1, filters=8, policy_head=head))
        outputs = network(np.zeros((3, 9, 9, 17), np.float32))
        assert outputs["policy_logits"].shape == (3, 82)
    conv = build_network(NetworkConfig(board_size=19, blocks=1, filters=8))
    assert conv.get_layer("policy_board_conv").kernel.shape == (1, 1, 16, 1)
    with pytest.raises(ValueError, match="policy_head"):
        NetworkConfig(board_size=9, policy_head="attention")


def test_the_trainer_names_the_policy_head_flag():
    from model.config import ConfigError, TrainConfig
    from model.trainer import network_config

    assert network_config(TrainConfig(root="/tmp/x", policy_head="dense"), 9).policy_head == "dense"
    assert TrainConfig(root="/tmp/x").policy_head == "conv"
    with pytest.raises(ConfigError, match="--policy-head"):
        TrainConfig(root="/tmp/x", policy_head="attention")


# --- the loop's modes --------------------------------------------------------------

def test_the_long_run_mode_resolves_its_auto_settings(tmp_path):
    from pipeline.loop import DEMO_GENERATIONS, LONG_RUN, Loop, LoopConfig

    root = str(tmp_path / "lake")
    demo = LoopConfig(root=root)
    assert (demo.budget_seconds, demo.generation_limit, demo.gnugo_games) == (900, DEMO_GENERATIONS, 0)
    assert demo.generation0_player == "playouts:1"
    long_run = LoopConfig(root=root, hours=2)
    assert long_run.budget_seconds == 7200 and long_run.generation_limit is None
    assert long_run.gnugo_games == LONG_RUN["final_gnugo_games"]
    assert (demo.gnugo_visits, long_run.gnugo_visits) == (demo.eval_visits, LONG_RUN["final_gnugo_visits"])
    # Explicit flags win over the mode's choices.
    assert LoopConfig(root=root, hours=2, generations=5, final_gnugo_games=0).generation_limit == 5
    assert LoopConfig(root=root, hours=2, final_gnugo_games=0).gnugo_games == 0
    uniform = LoopConfig(root=root, worker=WorkerConfig(root=root, generation0_playouts=0))
    assert uniform.generation0_player == "uniform"

    loop = Loop(long_run, storage=None)
    assert loop.selfplay_seconds(0) == LONG_RUN["selfplay_seconds"]
    # Its closing GNU Go games (40 at 256 visits) are planned for: 5 minutes or more on top of the demo's.
    assert loop.final_eval_seconds() - Loop(demo, storage=None).final_eval_seconds() >= 300
    # What the end of the budget must also hold: the closing matches and this generation's other phases.
    reserved = loop.final_eval_seconds() + sum(loop.phase_seconds.values())
    full = LONG_RUN["selfplay_seconds"]
    loop.deadline = loop.status.started + reserved + 0.8 * full   # near the end the last generation is cut...
    assert full / 2 <= loop.selfplay_seconds(7) < full
    loop.deadline = loop.status.started + reserved + 0.4 * full   # ...but never below half a generation
    assert loop.selfplay_seconds(7) == 0
    assert Loop(LoopConfig(root=root, hours=2, selfplay_seconds=60), storage=None).selfplay_seconds(0) == 60


def test_the_loop_self_plays_with_its_own_search_and_flags_override_it(tmp_path):
    from pipeline import loop as L

    root = str(tmp_path / "lake")
    config = L.CLI.parse(["--root", root])[0]
    assert {name: getattr(config.worker, name) for name in L.LOOP_SEARCH} == L.LOOP_SEARCH
    assert WorkerConfig(root=root).gumbel is False          # the worker's own defaults are not the loop's
    config = L.CLI.parse(["--root", root, "--no-worker-gumbel", "--worker-visits", "64",
                          "--worker-fast-visits", "16"])[0]
    assert (config.worker.gumbel, config.worker.visits, config.worker.fast_visits) == (False, 64, 16)


def test_the_summary_names_the_closing_opponents_and_the_gnugo_visits():
    from pipeline.loop import GenerationRecord, summary_table

    from format.match_record import ClosingRecord, MatchRecord

    def result(opponent, wins, visits=32):
        return MatchRecord(player_a="model-g1", player_b=opponent, board_size=9, komi=7.5, games=40, wins=wins,
                           losses=40 - wins, draws=0, wins_as_black=wins // 2, wins_as_white=wins - wins // 2,
                           win_rate=wins / 40, ci_low=0.1, ci_high=0.9, mean_moves=60.0, seconds=1.0, visits=visits)

    table = summary_table([GenerationRecord(0), GenerationRecord(1)], 1, ClosingRecord(
        vs_random=result("random", 40), vs_generation_0=result("playouts1", 38),
        vs_gnugo_1=result("gnugo-l1", 21, visits=256)))
    assert "vs generation 0 (playouts1 MCTS): 38/40" in table
    assert "vs GNU Go level 1 (the model at 256 visits a move, 4-move paired openings): 21/40" in table
