"""The policy/value network: a residual tower with four heads.

Input: format/planes.py's planes ``[B, N, N, C]``, C = ``input_planes``.  Outputs, float32, from
the side to move (``A = N*N + 1`` actions, pass last):

=====================  ==========  ==========================================
``policy_logits``      [B, A]      move logits (softmax gives the policy)
``value``              [B]         expected outcome in [-1, 1]
``value_logits``       [B, 3]      ``value_head="wdl"`` only: value = P(win) - P(loss)
``ownership_logits``   [B, N*N]    ``ownership = tanh(ownership_logits)``, in [-1, 1]
``score``              [B]         final area score (points, komi included)
=====================  ==========  ==========================================

Tower: a 3x3 stem, then ``blocks`` residual blocks of two 3x3 convolutions with batch norm
(AlphaGo Zero; optionally synchronized across replicas); every ``global_pool_every``-th block is a
KataGo global-pooling block.  Policy head: ``conv`` (default, `_conv_policy_head`) or AlphaGo
Zero's ``dense``, kept so that runs started with it resume.  ``dtype_policy="mixed_bfloat16"``
computes in bfloat16; exported models are float32 (``model.export``).  Shape: model.config's NetworkConfig.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers

from format import schema
from model.config import NetworkConfig


def _conv(filters, kernel, dtype, name):
    return layers.Conv2D(
        filters, kernel, padding="same", use_bias=False, kernel_initializer="he_normal", dtype=dtype, name=name
    )


def _batchnorm(config, dtype, name, zero_init=False):
    return layers.BatchNormalization(
        momentum=0.99,
        epsilon=1e-3,
        synchronized=config.sync_batchnorm,
        dtype=dtype,
        gamma_initializer="zeros" if zero_init else "ones",
        name=name,
    )


def _residual_block(x, config, dtype, index, global_pool):
    """x + BN(conv(relu(BN(conv(x)) [+ global pooling bias]))), then ReLU.

    The last batch norm of each block starts at zero (gamma = 0) so that a
    fresh tower is close to the identity and trains faster.
    """
    name = f"block{index}"
    y = _conv(config.filters, 3, dtype, f"{name}_conv1")(x)
    y = _batchnorm(config, dtype, f"{name}_bn1")(y)
    y = layers.ReLU(dtype=dtype, name=f"{name}_relu1")(y)
    if global_pool:
        y = _global_pool_bias(y, config, dtype, name)
    y = _conv(config.filters, 3, dtype, f"{name}_conv2")(y)
    y = _batchnorm(config, dtype, f"{name}_bn2", zero_init=True)(y)
    y = layers.Add(dtype=dtype, name=f"{name}_add")([x, y])
    return layers.ReLU(dtype=dtype, name=f"{name}_out")(y)


def _global_pool_bias(y, config, dtype, name):
    """KataGo's global pooling: pooled channels become a bias on the others.

    Splits ``filters`` channels into ``g = global_pool_channels`` pooled ones
    and ``filters - g`` regular ones; the mean and max over the board of the
    pooled ones (2g numbers) go through a dense layer to a bias for every
    regular channel.  Output has ``filters - g`` channels; the next
    convolution brings it back to ``filters``.
    """
    g = config.global_pool_channels
    pooled = layers.Lambda(lambda t: t[..., :g], dtype=dtype, name=f"{name}_gp_split")(y)
    regular = layers.Lambda(lambda t: t[..., g:], dtype=dtype, name=f"{name}_regular")(y)
    mean = layers.GlobalAveragePooling2D(dtype=dtype, name=f"{name}_gp_mean")(pooled)
    maximum = layers.GlobalMaxPooling2D(dtype=dtype, name=f"{name}_gp_max")(pooled)
    summary = layers.Concatenate(dtype=dtype, name=f"{name}_gp_concat")([mean, maximum])
    bias = layers.Dense(config.filters - g, dtype=dtype, name=f"{name}_gp_dense")(summary)
    bias = layers.Reshape((1, 1, config.filters - g), dtype=dtype, name=f"{name}_gp_bias")(bias)
    return layers.Add(dtype=dtype, name=f"{name}_gp_add")([regular, bias])


def _head_trunk(x, config, dtype, filters, name):
    y = _conv(filters, 1, dtype, f"{name}_conv")(x)
    y = _batchnorm(config, dtype, f"{name}_bn")(y)
    return layers.ReLU(dtype=dtype, name=f"{name}_relu")(y)


def _conv_policy_head(x, config, dtype):
    """Policy logits [B, N*N + 1]: one 1x1 convolution per point, pass from the board's mean.

    Every point's logit comes from the same weights applied to that point's
    features (as in Leela Zero's and KataGo's heads), so a rule learnt at one
    point, such as "an occupied point is never played", holds at all of them.
    The dense head of AlphaGo Zero must learn it point by point, which at
    this scale it did not (docs/results.md, the demo's defaults).
    """
    n = config.board_size
    y = _head_trunk(x, config, dtype, config.policy_channels, "policy")
    board = layers.Conv2D(1, 1, dtype="float32", name="policy_board_conv")(y)
    board = layers.Reshape((n * n,), dtype="float32", name="policy_board_logits")(board)
    pooled = layers.GlobalAveragePooling2D(dtype="float32", name="policy_pool")(y)
    pass_logit = layers.Dense(1, dtype="float32", name="policy_pass")(pooled)
    return layers.Concatenate(dtype="float32", name="policy_logits")([board, pass_logit])


def build_network(config: NetworkConfig, dtype_policy: str = "float32") -> keras.Model:
    """A Keras functional model: planes [B, N, N, input_planes] -> dict of outputs (module doc)."""
    if not config.board_size:
        raise ValueError(
            "NetworkConfig.board_size is 0 (not known yet): build TrainConfig.network_for(the run's board size)"
        )
    n = config.board_size
    points = n * n
    actions = schema.num_actions(n)
    planes = keras.Input(shape=(n, n, config.input_planes), dtype="float32", name="planes")
    dt = dtype_policy
    x = _conv(config.filters, 3, dt, "stem_conv")(planes)
    x = _batchnorm(config, dt, "stem_bn")(x)
    x = layers.ReLU(dtype=dt, name="stem_relu")(x)
    for index in range(config.blocks):
        global_pool = bool(config.global_pool_every) and (index + 1) % config.global_pool_every == 0
        x = _residual_block(x, config, dt, index, global_pool)

    if config.policy_head == "conv":
        policy_logits = _conv_policy_head(x, config, dt)
    else:
        policy = _head_trunk(x, config, dt, config.head_filters, "policy")
        policy = layers.Flatten(dtype=dt, name="policy_flat")(policy)
        policy_logits = layers.Dense(actions, dtype="float32", name="policy_logits")(policy)

    ownership_logits = layers.Conv2D(1, 1, dtype="float32", name="ownership_conv")(x)
    ownership_logits = layers.Reshape((points,), dtype="float32", name="ownership_logits")(ownership_logits)
    ownership = layers.Activation("tanh", dtype="float32", name="ownership")(ownership_logits)

    value = _head_trunk(x, config, dt, config.head_filters, "value")
    value = layers.Flatten(dtype=dt, name="value_flat")(value)
    hidden = layers.Dense(config.value_hidden, activation="relu", dtype=dt, name="value_hidden")(value)
    outputs = {"policy_logits": policy_logits, "ownership_logits": ownership_logits, "ownership": ownership}
    if config.value_head == "wdl":
        logits = layers.Dense(3, dtype="float32", name="value_logits")(hidden)
        outputs["value_logits"] = logits
        outputs["value"] = layers.Lambda(_win_minus_loss, dtype="float32", name="value")(logits)
    else:
        raw = layers.Dense(1, dtype="float32", name="value_dense")(hidden)
        outputs["value"] = layers.Lambda(lambda t: tf.tanh(t[:, 0]), dtype="float32", name="value")(raw)
    # Scores span about +-N*N points; the dense layer predicts score / N so
    # that its initial outputs and gradients are of order one.
    raw_score = layers.Dense(1, dtype="float32", name="score_dense")(hidden)
    outputs["score"] = layers.Lambda(lambda t: t[:, 0] * float(n), dtype="float32", name="score")(raw_score)
    return keras.Model(inputs=planes, outputs=outputs, name=f"zerolake_{n}x{n}")


def _win_minus_loss(logits):
    probabilities = tf.nn.softmax(logits, axis=-1)  # [win, draw, loss]
    return probabilities[:, 0] - probabilities[:, 2]
