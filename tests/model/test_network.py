"""model.network's policy heads: the conv head learns a rule that holds at every point ("never play on
a stone") from a few hundred examples, where AlphaGo Zero's dense head has to learn it point by point.
A run started with the dense head still resumes with ``--policy-head dense``; without it the trainer
names the flag."""

import numpy as np
import pytest


def _occupied_mass_after_training(policy_head: str, steps: int = 150) -> float:
    """Train a one-block network's policy on positions whose targets are uniform over the empty points."""
    import tensorflow as tf

    from model.config import NetworkConfig

    from model.network import build_network

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
    from model.config import NetworkConfig
    from model.network import build_network

    for head in ("conv", "dense"):
        network = build_network(NetworkConfig(board_size=9, blocks=1, filters=8, policy_head=head))
        outputs = network(np.zeros((3, 9, 9, 17), np.float32))
        assert outputs["policy_logits"].shape == (3, 82)
    conv = build_network(NetworkConfig(board_size=19, blocks=1, filters=8))
    assert conv.get_layer("policy_board_conv").kernel.shape == (1, 1, 16, 1)
    with pytest.raises(ValueError, match="--policy-head"):
        NetworkConfig(board_size=9, policy_head="attention")


def test_the_trainer_names_the_policy_head_flag(capsys):
    """TrainConfig holds a NetworkConfig: its fields are the trainer's flags under their own names, it
    validates them, and the trainer builds it on the run's board (network_for)."""
    from model.config import CLI, ConfigError, NetworkConfig, TrainConfig

    config, _ = CLI.parse(["--root", "/tmp/x", "--policy-head", "dense", "--blocks", "2", "--no-sync-batchnorm"])
    assert config.network == NetworkConfig(policy_head="dense", blocks=2, sync_batchnorm=False)
    network = config.network_for(9)
    assert (network.board_size, network.policy_head, network.global_pool_channels) == (9, "dense", 8)
    default = TrainConfig(root="/tmp/x").network
    assert (default.policy_head, default.board_size) == ("conv", 0)
    with pytest.raises(ConfigError, match="--policy-head"):
        TrainConfig(root="/tmp/x", network=NetworkConfig(policy_head="attention"))
    with pytest.raises(ConfigError, match="--board-size"):       # the board size is the trainer's own flag
        TrainConfig(root="/tmp/x", network=NetworkConfig(board_size=9))
    for flags, message in ((["--blocks", "0"], "--blocks: must be >= 1, got 0"),
                           (["--global-pool-every", "1", "--global-pool-channels", "32"],
                            "--global-pool-channels: must be smaller than --filters (32)")):
        with pytest.raises(SystemExit) as exit_info:
            CLI.parse(["--root", "/tmp/x", *flags])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    from model.network import build_network
    with pytest.raises(ValueError, match="board_size is 0"):
        build_network(config.network)
