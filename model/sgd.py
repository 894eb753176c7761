"""SGD: the distribution strategy, the losses, the multi-step training loop, checkpoints.

    TrainConfig --resolve_strategy--> ResolvedStrategy (TPU, Mirrored or default; devices: inference.devices)
    global batches (model.tfdata) --Trainer.train_steps(iterator, n)--> metric sums (METRIC_NAMES)
    Trainer.checkpoint <--> the run's checkpoints (model.cycle); Trainer.published_weights() --> a published model

Training is a custom loop, not ``Model.fit`` (Keras 3's fit fails under
Mirrored once steps_per_execution > 1): ``Trainer.train_steps`` is a
``tf.function`` that runs ``n`` steps over ``tf.range(n)``, each one
``strategy.run(self._replica_step, ...)`` on a global batch split across
replicas, and returns the summed metrics of those steps.  Metrics leave the
step as sums (weighted loss, weight, correct top-1 moves...) so that they can
be added over steps and replicas and divided once (`summarize`).  The losses
per head are `head_losses`'; the step loss is `Trainer._replica_step`'s.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from format import planes as plane_layout
from inference.devices import AcceleratorMissing, connect_tpu, cpu_has_bf16_matrix_unit
from model.config import NetworkConfig, TrainConfig
from model.network import build_network

log = logging.getLogger(__name__)

METRIC_NAMES = (
    "examples",
    "policy_loss_sum",
    "policy_weight_sum",
    "policy_correct_sum",
    "value_loss_sum",
    "value_weight_sum",
    "value_sq_error_sum",
    "ownership_loss_sum",
    "ownership_weight_sum",
    "score_loss_sum",
    "score_weight_sum",
    "total_loss_sum",
    "occupied_mass_sum",
)

WIN, DRAW, LOSS = 0, 1, 2
"""Classes of the wdl head's ``value_logits``, from the side to move."""


@dataclass(frozen=True)
class ResolvedStrategy:
    strategy: tf.distribute.Strategy
    kind: str
    """'tpu', 'gpu' or 'cpu': the device type the replicas run on."""
    description: str

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync


def _split_cpu(logical_cpus: int) -> None:
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(logical_cpus)]
    )


def _tpu_address(config: TrainConfig) -> str:
    """Where to look for a TPU: --tpu, else $TPU_NAME, else 'local' on a TPU VM, else ''."""
    if config.tpu:
        return config.tpu
    if os.environ.get("TPU_NAME"):
        return os.environ["TPU_NAME"]
    return "local" if os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0") else ""


def resolve_strategy(config: TrainConfig) -> ResolvedStrategy:
    """The tf.distribute strategy for ``config.strategy`` (must run before other TF work).

    ``auto`` tries a TPU only where one may exist (--tpu, $TPU_NAME, or a TPU
    VM's /dev/accel0), so that it never waits on a metadata server elsewhere.
    """
    if config.logical_cpus:
        _split_cpu(config.logical_cpus)
    gpus = tf.config.list_logical_devices("GPU")
    tpu = _tpu_address(config)
    if config.strategy == "tpu" or (config.strategy == "auto" and tpu):
        flag = f"--strategy {config.strategy}" + (f" --tpu {config.tpu}" if config.tpu else "")
        try:
            strategy = connect_tpu(tpu, flag)
            return ResolvedStrategy(strategy, "tpu", f"TPUStrategy ({strategy.num_replicas_in_sync} cores)")
        except AcceleratorMissing as exc:
            if config.strategy == "tpu":
                raise
            log.warning("--strategy auto: no TPU came up at %r (%s); trying GPUs", tpu, exc.detail)
    if config.strategy == "gpu" and not gpus:
        raise AcceleratorMissing("--strategy gpu", "gpu")
    if config.strategy == "mirrored" or (config.strategy in ("auto", "gpu") and len(gpus) > 1):
        if gpus:
            devices, kind = [d.name for d in gpus], "gpu"
        else:
            devices, kind = [d.name for d in tf.config.list_logical_devices("CPU")], "cpu"
        strategy = tf.distribute.MirroredStrategy(devices=devices)
        return ResolvedStrategy(strategy, kind, f"MirroredStrategy over {len(devices)} {kind} device(s)")
    kind = "gpu" if gpus else "cpu"
    return ResolvedStrategy(tf.distribute.get_strategy(), kind, f"default strategy on one {kind}")


def dtype_policy_for(config: TrainConfig, kind: str, *, cpu_bf16: bool | None = None) -> str:
    """The Keras dtype policy for ``--precision`` on a ``kind`` device: ``auto`` is bfloat16 on TPUs,
    GPUs and CPUs with AMX (``cpu_bf16``: read from the CPU when None), float32 on other CPUs.
    Variables stay float32 either way, so checkpoints move between the two."""
    if config.precision == "auto" and kind == "cpu":
        bf16 = cpu_has_bf16_matrix_unit() if cpu_bf16 is None else cpu_bf16
        return "mixed_bfloat16" if bf16 else "float32"
    return "float32" if config.precision == "float32" else "mixed_bfloat16"


class LearningRateSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to the peak, then constant, cosine, step decay or an anneal (global step).

    The anneal holds the peak until ``lr_anneal_from`` and falls along a half cosine to the floor at
    ``lr_anneal_to``.  Counted in steps it is a function of the step; counted by the clock its
    progress is ``clock_progress``, a variable the trainer sets before each call (`anneal_progress`).
    """

    def __init__(self, config: TrainConfig, clock_progress=None):
        self.peak = config.learning_rate
        self.warmup = config.warmup_steps
        self.kind = config.lr_schedule
        self.decay_steps = config.lr_decay_steps
        self.final_fraction = config.lr_final_fraction
        self.boundaries = config.lr_boundary_steps()
        self.anneal_from, self.anneal_to = config.lr_anneal_from, config.lr_anneal_to
        self.clock_progress = clock_progress

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warm = tf.minimum(1.0, (step + 1.0) / float(max(self.warmup, 1)))
        if self.kind == "cosine":
            progress = tf.minimum(1.0, step / float(self.decay_steps))
            cosine = 0.5 * (1.0 + tf.cos(math.pi * progress))
            factor = self.final_fraction + (1.0 - self.final_fraction) * cosine
        elif self.kind == "step":
            passed = tf.add_n([tf.cast(step >= b, tf.float32) for b in self.boundaries])
            factor = tf.pow(0.1, passed)
        elif self.kind == "anneal":
            if self.clock_progress is not None:
                progress = tf.cast(self.clock_progress, tf.float32)
            else:
                progress = tf.clip_by_value(
                    (step - self.anneal_from) / float(self.anneal_to - self.anneal_from), 0.0, 1.0
                )
            cosine = 0.5 * (1.0 + tf.cos(math.pi * progress))
            factor = self.final_fraction + (1.0 - self.final_fraction) * cosine
        else:
            factor = tf.constant(1.0)
        return self.peak * warm * factor

    def get_config(self):
        return {"peak": self.peak, "warmup": self.warmup, "kind": self.kind}


def anneal_progress(config: TrainConfig, now: float) -> float:
    """How far a clock-counted anneal has gone at Unix time ``now``: 0 before it starts, 1 after."""
    span = config.lr_anneal_to - config.lr_anneal_from
    return min(1.0, max(0.0, (now - config.lr_anneal_from) / span)) if span > 0 else 1.0


class Trainer:
    """Model, optimizer, window position and the multi-step training function.

    Build it once per process; ``train_steps(iterator, n)`` runs n steps on
    a distributed iterator of global batches and returns a dict of metric
    sums (``METRIC_NAMES``) as float64 numpy scalars.

    Checkpoint state (``self.checkpoint``): the model, the optimizer (its
    ``iterations`` is the global step that drives the learning rate), the SWA
    average, and the window position: which window (``window_generation``),
    how many of its steps are done (``window_step``) and how many it has in
    all (``window_steps_total``).  The data order of a window depends only on
    its shards and seed (``model.tfdata``), so resuming skips ``window_step``
    batches and sees exactly what the killed run would have seen.
    """

    def __init__(
        self,
        config: TrainConfig,
        net_config: NetworkConfig,
        resolved: ResolvedStrategy,
        *,
        draws_possible: bool = False,
    ):
        """``draws_possible``: the run's komi is a whole number (see `wdl_target`)."""
        self.config = config
        self.draws_possible = draws_possible
        self.net_config = net_config
        self.strategy = resolved.strategy
        self.replicas = resolved.replicas
        self.global_batch = config.batch_size * self.replicas
        self.dtype_policy = dtype_policy_for(config, resolved.kind)
        keras.utils.set_random_seed(config.seed)
        with self.strategy.scope():
            self.model = build_network(net_config, self.dtype_policy)
            self.clock_progress = (
                tf.Variable(anneal_progress(config, time.time()), trainable=False)
                if config.lr_schedule == "anneal" and config.lr_anneal_by == "clock"
                else None
            )
            self.optimizer = keras.optimizers.SGD(
                learning_rate=LearningRateSchedule(config, self.clock_progress), momentum=config.momentum, nesterov=True
            )
            self.optimizer.build(self.model.trainable_variables)
            self.window_generation = tf.Variable(-1, dtype=tf.int64, trainable=False)
            self.window_step = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.window_steps_total = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.swa = [tf.Variable(w, trainable=False) for w in self.model.weights] if config.swa_decay > 0 else []
        self._kernels = [v for v in self.model.trainable_variables if "kernel" in v.path]
        tracked = dict(
            model=self.model,
            optimizer=self.optimizer,
            window_generation=self.window_generation,
            window_step=self.window_step,
            window_steps_total=self.window_steps_total,
        )
        if self.swa:
            tracked["swa"] = self.swa
        self.checkpoint = tf.train.Checkpoint(**tracked)
        self._train_steps = tf.function(self._train_steps_impl)

    # --- state ---------------------------------------------------------------
    @property
    def global_step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def learning_rate(self) -> float:
        """The rate the next step will use."""
        return float(np.asarray(self.optimizer.learning_rate))

    def start_window(self, generation: int, total_steps: int) -> None:
        self.window_generation.assign(generation)
        self.window_step.assign(0)
        self.window_steps_total.assign(total_steps)

    def abandon_window(self) -> None:
        """No window in progress: a checkpoint saved now resumes none (its window could not be read)."""
        self.start_window(-1, 0)

    def non_finite_state(self) -> list[str]:
        """Names of the checkpointed float variables (weights, optimizer slots, SWA average) that
        hold NaN or infinity: a diverged network, which no checkpoint may keep.  Cheap next to the
        checkpoint write, which reads every one of them too."""
        bad = []
        for variable in [*self.model.weights, *self.optimizer.variables, *self.swa]:
            value = np.asarray(variable.numpy())
            # Integer and bool variables (the step counters) cannot be non-finite; float32 first,
            # since numpy's isfinite does not know bfloat16.
            if value.dtype.kind not in "iub" and not np.isfinite(value.astype(np.float32)).all():
                bad.append(getattr(variable, "path", variable.name))
        return bad

    def published_weights(self) -> list:
        """Weights to export: the SWA average when on, else the live weights."""
        source = self.swa if self.swa else self.model.weights
        return [np.asarray(v.numpy()) for v in source]

    # --- training ------------------------------------------------------------
    def train_steps(self, iterator, steps: int) -> dict:
        if self.clock_progress is not None:
            self.clock_progress.assign(anneal_progress(self.config, time.time()))
        sums = self._train_steps(iterator, tf.constant(steps, tf.int32))
        self.window_step.assign_add(steps)
        return {k: float(v) for k, v in sums.items()}

    def _train_steps_impl(self, iterator, steps):
        totals = tuple(tf.constant(0.0, tf.float32) for _ in METRIC_NAMES)
        for _ in tf.range(steps):  # AutoGraph: a tf.while_loop over `totals`
            per_replica = self.strategy.run(self._replica_step, args=(next(iterator),))
            totals = tuple(
                total + self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica[name], axis=None)
                for total, name in zip(totals, METRIC_NAMES)
            )
        if self.swa:
            decay = self.config.swa_decay
            for average, weight in zip(self.swa, self.model.weights):
                average.assign(decay * average + (1.0 - decay) * tf.cast(weight, average.dtype))
        return dict(zip(METRIC_NAMES, totals))

    def _normalized_data_loss(self, weighted: dict, heads: dict):
        """This replica's share of the step's data loss, each head's weighted sum divided per
        ``--loss-normalization``.

        ``batch``: by the global batch size.  A head's gradient then scales with the share of
        rows carrying its target: with playout-cap randomization about a quarter of the rows
        carry a policy target and nearly all a value target, so the policy trains at about a
        quarter of its nominal weight and the value head at full weight.
        ``weight``: by the global batch's sum of that head's weights (summed over replicas, so
        every replica divides by the same number and the replica gradients still add up to the
        gradient of one loss), at least 1: each head trains at its nominal weight whatever share
        of rows carry its target.  A batch without any target of a head adds nothing for it.
        """
        if self.config.loss_normalization == "batch":
            return tf.add_n(list(weighted.values())) / self.global_batch
        context = tf.distribute.get_replica_context()
        terms = []
        for head, term in weighted.items():
            weight_sum = context.all_reduce(tf.distribute.ReduceOp.SUM, heads[f"{head}_weight_sum"])
            terms.append(term / tf.maximum(weight_sum, 1.0))
        return tf.add_n(terms)

    def _replica_step(self, batch):
        """One replica's share of a step.  The step loss is ``sum_h lambda_h sum_i w_ih loss_ih / D_h``
        (`head_losses`, `_normalized_data_loss`) plus ``l2 * sum ||kernel||^2`` divided by the
        replica count, because Keras sums gradients across replicas."""
        with tf.GradientTape() as tape:
            outputs = self.model(batch["planes"], training=True)
            heads = head_losses(outputs, batch, self.net_config, draws_possible=self.draws_possible)
            weighted = {
                head: getattr(self.config, f"{head}_loss_weight") * heads[f"{head}_loss_sum"] for head in LOSS_HEADS
            }
            data_loss = tf.add_n(list(weighted.values()))
            penalty = self.config.l2 * tf.add_n([tf.reduce_sum(tf.square(k)) for k in self._kernels])
            loss = self._normalized_data_loss(weighted, heads) + penalty / self.replicas
        gradients = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables))
        heads["total_loss_sum"] = data_loss
        heads["examples"] = tf.cast(tf.shape(batch["value"])[0], tf.float32)
        return heads


def wdl_target(value, draws_possible: bool):
    """float32[B, 3] win/draw/loss target for value targets ``value`` float[B] in [-1, 1].

    A value target is a result z in {-1, 0, +1} (loss, draw, win), or the
    mean of several results where the pipeline merged the copies of one
    opening position: ``z = (W - L) / n`` for W wins, D draws and L losses
    among n games.  The mean of their one-hot targets, (W, D, L) / n, is
    what the head should learn, but D is gone from a mean.  Taking the mean
    as wins and losses only gives ``((1 + z) / 2, 0, (1 - z) / 2)``: its
    expectation ``P(win) - P(loss)`` is z again, and it is exact for z = +-1
    and for every mean when draws cannot happen (a komi with a half point,
    the default 7.5).  When they can (``draws_possible``: a whole-number
    komi) a z of exactly 0 is read as a draw, which is exact for an
    unmerged drawn game; a fractional z stays decisive.  (Taking
    ``round(1 - z)`` as a class instead would turn every merged value in
    (-0.5, 0.5) into a certain draw.)
    """
    value = tf.cast(value, tf.float32)
    win, loss = (1.0 + value) / 2.0, (1.0 - value) / 2.0
    decisive = tf.stack([win, tf.zeros_like(value), loss], axis=-1)
    if not draws_possible:
        return decisive
    draw = tf.one_hot(tf.fill(tf.shape(value), DRAW), 3, dtype=tf.float32)
    return tf.where(tf.equal(value, 0.0)[:, None], draw, decisive)


def occupied_mass(policy_logits, planes):
    """float32[B]: the softmax policy's mass on occupied points (moves the planes show are illegal).

    ``planes`` is the network input [B, N, N, C]: the side to move's and
    the opponent's stones now are channels OWN_STONES and OPPONENT_STONES
    (format/planes.py).  Pass (the last action) is always legal.
    """
    probs = tf.nn.softmax(tf.cast(policy_logits, tf.float32), axis=-1)
    planes = tf.cast(planes, tf.float32)
    stones = planes[..., plane_layout.OWN_STONES] + planes[..., plane_layout.OPPONENT_STONES]
    occupied = tf.reshape(tf.minimum(stones, 1.0), [tf.shape(planes)[0], -1])
    return tf.reduce_sum(probs[:, :-1] * occupied, axis=-1)


LOSS_HEADS = ("policy", "value", "ownership", "score")
"""The heads with a loss; each has ``<head>_loss_weight`` in TrainConfig and ``<head>_loss_sum``,
``<head>_weight_sum`` in `head_losses`."""


def head_losses(outputs: dict, batch: dict, net_config: NetworkConfig, *, draws_possible: bool = False) -> dict:
    """Weighted per-head loss sums, weight sums and accuracy counts over a batch.

    Losses per example (``w`` = the record's weight for that head, targets
    from the side to move; ``NN`` = points):

    * policy: cross-entropy ``-sum_a pi_a log softmax(logits)_a``;
    * value: ``(v - z)^2`` for the tanh head, win/draw/loss cross-entropy for
      the wdl head against ``wdl_target(z)``.  ``z`` is a game result in
      {-1, 0, +1}, or for a merged opening position (pipeline.positions.
      cap_positions) the weighted mean of several, so a fraction;
    * ownership: per point, binary cross-entropy between ``(1 + o) / 2`` and
      ``sigmoid(2 * ownership_logit)`` (= ``(1 + tanh) / 2``), averaged over NN;
    * score: Huber (delta 1) on ``(predicted - actual) / N``.

    Also ``occupied_mass_sum`` (`occupied_mass`, unweighted: every example
    shows how the policy treats the rules, with or without a target): the
    softmax policy's mass on occupied points, which a network that has
    learnt the rules keeps near zero.
    """
    n = float(net_config.board_size)
    pw, vw = batch["policy_weight"], batch["value_weight"]
    ow, sw = batch["ownership_weight"], batch["score_weight"]
    policy_ce = tf.nn.softmax_cross_entropy_with_logits(labels=batch["policy"], logits=outputs["policy_logits"])
    correct = tf.cast(tf.equal(tf.argmax(outputs["policy_logits"], -1), tf.argmax(batch["policy"], -1)), tf.float32)
    value = outputs["value"]
    if net_config.value_head == "wdl":
        value_loss = tf.nn.softmax_cross_entropy_with_logits(
            labels=wdl_target(batch["value"], draws_possible), logits=tf.cast(outputs["value_logits"], tf.float32)
        )
    else:
        value_loss = tf.square(value - batch["value"])
    ownership_loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(
            labels=(1.0 + batch["ownership"]) / 2.0, logits=2.0 * outputs["ownership_logits"]
        ),
        axis=-1,
    )
    score_loss = keras.losses.huber(
        ((outputs["score"] - batch["score"]) / n)[:, None], tf.zeros_like(batch["score"])[:, None], delta=1.0
    )
    return {
        "policy_loss_sum": tf.reduce_sum(pw * policy_ce),
        "policy_weight_sum": tf.reduce_sum(pw),
        "policy_correct_sum": tf.reduce_sum(pw * correct),
        "value_loss_sum": tf.reduce_sum(vw * value_loss),
        "value_weight_sum": tf.reduce_sum(vw),
        "value_sq_error_sum": tf.reduce_sum(vw * tf.square(value - batch["value"])),
        "ownership_loss_sum": tf.reduce_sum(ow * ownership_loss),
        "ownership_weight_sum": tf.reduce_sum(ow),
        "score_loss_sum": tf.reduce_sum(sw * score_loss),
        "score_weight_sum": tf.reduce_sum(sw),
        "occupied_mass_sum": tf.reduce_sum(occupied_mass(outputs["policy_logits"], batch["planes"])),
    }


def summarize(sums: dict) -> dict:
    """Means from metric sums: each head's loss, policy top-1 accuracy, value MSE, occupied mass."""

    def ratio(a, b):
        return sums[a] / sums[b] if sums[b] > 0 else float("nan")

    return {
        "loss": ratio("total_loss_sum", "examples"),
        "policy_loss": ratio("policy_loss_sum", "policy_weight_sum"),
        "policy_accuracy": ratio("policy_correct_sum", "policy_weight_sum"),
        "value_loss": ratio("value_loss_sum", "value_weight_sum"),
        "value_mse": ratio("value_sq_error_sum", "value_weight_sum"),
        "ownership_loss": ratio("ownership_loss_sum", "ownership_weight_sum"),
        "score_loss": ratio("score_loss_sum", "score_weight_sum"),
        "occupied_policy_mass": ratio("occupied_mass_sum", "examples"),
    }
