"""TrainConfig: every setting of ``python -m model.train``, validated once;
NetworkConfig: the network's shape, which TrainConfig holds as ``network``.

The dataclasses are the single source of defaults; format.cli turns each field into a ``--flag``
with its help text.  Nothing here imports TensorFlow, so a bad flag fails fast.  ``batch_size`` is
per replica (global batch = ``batch_size x replicas``); a window is trained ``steps_per_window``
steps, or when 0 ``ceil(positions x epochs_per_window / global batch)``; the learning-rate
schedule runs on the global step, which counts across windows (``model.sgd``).  NetworkConfig's
fields are the trainer's flags under their own names (``--blocks``; a launcher's
``--train-blocks``), and every published model records it as ``network``.  Its board size may be
0 (run.json's, read later): the trainer builds ``network_for(board size)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cloud.storage import local_folder_overlaps_root
from format import schema
from format.cli import (
    RoleCli,
    board_size_setting,
    events_setting,
    nested_setting,
    poll_seconds_setting,
    root_setting,
    setting,
    setting_problems,
    settings_error,
)
from format.leases import MAX_LEASE_SECONDS

LOSS_NORMALIZATIONS = ("batch", "weight")
"""``--loss-normalization`` choices (`model.sgd.Trainer._replica_step` says what each does)."""

STRATEGIES = ("auto", "tpu", "gpu", "mirrored", "default")
PRECISIONS = ("auto", "float32", "bfloat16")
LR_SCHEDULES = ("constant", "cosine", "step", "anneal")
LR_ANNEAL_CLOCKS = ("steps", "clock")
VALUE_HEADS = ("tanh", "wdl")
POLICY_HEADS = ("conv", "dense")


class ConfigError(ValueError):
    """A flag (or a combination of flags) is invalid; the message names it."""


def _check_network_board_size(value, info) -> str | None:
    if value == 0 or schema.MIN_BOARD_SIZE <= value <= schema.MAX_BOARD_SIZE:
        return None
    return f"{value} is outside {schema.MIN_BOARD_SIZE}..{schema.MAX_BOARD_SIZE}"


@dataclass(frozen=True)
class NetworkConfig:
    """The network's shape (model.network builds it); saved with every published model.

    Each field but the hidden ones is a trainer flag of the same name
    (TrainConfig.network).  The published record (``dataclasses.asdict``,
    metadata ``network``) keeps this field order.
    """

    board_size: int = setting(
        0,
        "board size the network is built for; 0 = not known yet (TrainConfig.network "
        "holds the shape, and the trainer builds network_for(the run's board size))",
        hidden=True,
        check=_check_network_board_size,
    )
    input_planes: int = setting(
        schema.BASIC_INPUT_PLANES,
        "input planes of a new network: 17 (AlphaGo Zero's stone history and colour) or 22 (those, then "
        "on-board, liberties 1/2/3+ and legal moves; format/planes.py); a checkpoint resumes only with its own",
        choices=schema.INPUT_PLANE_CHOICES,
    )
    blocks: int = setting(4, "residual blocks", at_least=1)
    filters: int = setting(32, "channels of the residual tower", at_least=1)
    global_pool_every: int = setting(0, "every k-th block gets a KataGo global-pooling bias; 0 = none", at_least=0)
    global_pool_channels: int = setting(8, "channels pooled by those blocks (smaller than --filters)", at_least=1)
    value_head: str = setting("tanh", "tanh (win/loss) or wdl (win/draw/loss softmax)", choices=VALUE_HEADS)
    policy_head: str = setting(
        "conv",
        "conv (each point's logit from a 1x1 convolution: learns the rules at "
        "every point at once) or dense (AlphaGo Zero's dense layer; runs started "
        "before conv became the default)",
        choices=POLICY_HEADS,
    )
    policy_channels: int = setting(
        16, "channels of the conv policy head's hidden 1x1 convolution", hidden=True, at_least=1
    )
    head_filters: int = setting(
        2, "channels of the value head's (and the dense policy head's) 1x1 convolution", hidden=True, at_least=1
    )
    value_hidden: int = setting(64, "hidden units of the value/score head", at_least=1)
    sync_batchnorm: bool = setting(
        True, "batch-norm statistics over the global batch (identical results on any replica count)"
    )

    def __post_init__(self):
        problems = setting_problems(self)  # declared choices and ranges (format.cli)
        if self.global_pool_every and self.global_pool_channels >= self.filters:
            problems.append(f"--global-pool-channels: must be smaller than --filters ({self.filters})")
        if problems:
            raise ConfigError(settings_error(problems, "invalid network"))


@dataclass(frozen=True)
class TrainConfig:
    root: str = root_setting()
    board_size: int = board_size_setting(0)
    # --- devices -----------------------------------------------------------
    strategy: str = setting(
        "auto",
        "auto = TPU if one resolves, Mirrored if >1 GPU, else the default strategy; tpu, gpu = that "
        "accelerator or an error (gpu: Mirrored over several); mirrored = over every GPU, or the CPU's "
        "--logical-cpus; default = TensorFlow's placement",
        choices=STRATEGIES,
    )
    tpu: str = setting("", "TPU name or grpc:// address for --strategy tpu/auto")
    logical_cpus: int = setting(
        0, "split the CPU into this many logical devices (Mirrored on CPU, for tests); 0 = off", at_least=0
    )
    precision: str = setting(
        "auto",
        "compute precision; auto = bfloat16 on TPU, GPU and CPUs with AMX (amx_bf16), float32 on other CPUs",
        choices=PRECISIONS,
    )
    # --- network: its flags are NetworkConfig's fields (--blocks, --filters...) ---
    network: NetworkConfig = nested_setting(
        NetworkConfig, "network (the shape of a new network; a checkpoint resumes only with its own)"
    )
    # --- losses ------------------------------------------------------------
    # Upper bounds: a loss weight or L2 penalty past them only scales the gradient
    # into divergence (the weights are relative; 1e-4 is the usual L2).
    policy_loss_weight: float = setting(1.0, "weight of the policy cross-entropy", at_least=0, at_most=100)
    value_loss_weight: float = setting(1.0, "weight of the value loss", at_least=0, at_most=100)
    ownership_loss_weight: float = setting(0.5, "weight of the ownership loss", at_least=0, at_most=100)
    score_loss_weight: float = setting(0.2, "weight of the score loss", at_least=0, at_most=100)
    l2: float = setting(1e-4, "L2 penalty on convolution and dense kernels", at_least=0, at_most=1)
    loss_normalization: str = setting(
        "batch",
        "what divides each head's weighted loss sum: batch (the global batch size, so a head is "
        "as strong as the share of rows that carry its target: the policy about a quarter with "
        "playout-cap randomization) or weight (the global batch's sum of that head's weights, so "
        "each head's strength does not depend on how many rows carry its target)",
        choices=LOSS_NORMALIZATIONS,
    )
    # --- optimisation ------------------------------------------------------
    batch_size: int = setting(256, "examples per replica per step", at_least=1)
    steps_per_window: int = setting(
        0,
        "steps per window; 0 = automatic: --samples-per-row's rule, or positions x epochs-per-window / global batch",
        at_least=0,
    )
    epochs_per_window: float = setting(
        1.0,
        "passes over a window when steps are automatic and "
        "--samples-per-row is 0 (or the window's new rows are unknown)",
        above=0,
        at_most=1000,
    )
    samples_per_row: float = setting(
        0.0,
        "automatic steps: train each window ceil(new rows x this / global batch) steps, where new rows are "
        "those that arrived in the lake between the plan of the window the published model (LATEST) was "
        "trained on and this window's plan (KataGo's samples per new row; 4-8 there), so each row is trained "
        "about this many times over the windows it is in; 0 = off: --epochs-per-window",
        at_least=0,
        at_most=1000,
    )
    min_steps_per_window: int = setting(1, "with --samples-per-row: at least this many steps per window", at_least=1)
    max_steps_per_window: int = setting(
        0,
        "with --samples-per-row: at most this many steps per window, so "
        "that a trainer slower than self-play still publishes a model "
        "every so often (0 = no limit)",
        at_least=0,
    )
    steps_per_call: int = setting(20, "training steps per tf.function call", at_least=1)
    # At most 10: SGD with momentum diverges within a few steps far below that (about 5 on
    # the small test networks), and a rate past it is a typo, not an experiment.
    learning_rate: float = setting(
        0.02,
        "peak learning rate (a run whose loss stops being finite stops, exit 4, saving and publishing nothing of it)",
        above=0,
        at_most=10,
    )
    momentum: float = setting(0.9, "SGD momentum (Nesterov)", at_least=0, below=1)
    warmup_steps: int = setting(200, "linear warm-up from 0 to the peak rate", at_least=0)
    lr_schedule: str = setting(
        "constant",
        "after warm-up: constant, cosine (to lr x lr-final-fraction at lr-decay-steps) "
        "step (x0.1 at each of lr-boundaries) or anneal (the peak until lr-anneal-from, then a cosine to "
        "lr x lr-final-fraction at lr-anneal-to)",
        choices=LR_SCHEDULES,
    )
    lr_decay_steps: int = setting(100_000, "global step where the cosine ends", at_least=1)
    lr_final_fraction: float = setting(0.05, "cosine floor, as a fraction of the peak", above=0, at_most=1)
    lr_boundaries: str = setting("", "comma-separated global steps for --lr-schedule step")
    lr_anneal_by: str = setting(
        "steps",
        "what --lr-anneal-from/--lr-anneal-to count: global steps, or clock "
        "(Unix seconds: a run of planned length anneals its last part whatever "
        "its speed; operations.loop plans them from --hours)",
        choices=LR_ANNEAL_CLOCKS,
    )
    # Up to 4e9: a Unix time (about 1.8e9 now) is past the flags' usual 1e9 bound.
    lr_anneal_from: float = setting(0.0, "--lr-schedule anneal: where the rate starts to fall", at_least=0, at_most=4e9)
    lr_anneal_to: float = setting(
        0.0, "--lr-schedule anneal: where it reaches lr x lr-final-fraction", at_least=0, at_most=4e9
    )
    swa_decay: float = setting(
        0.0,
        "publish an exponential average of the weights with this decay per call (e.g. 0.9); 0 = off",
        at_least=0,
        below=1,
    )
    # --- data --------------------------------------------------------------
    shuffle_buffer: int = setting(8192, "records in the tf.data shuffle buffer", at_least=0)
    seed: int = setting(0, "seed for the data order, symmetries and initial weights")
    # --- publishing --------------------------------------------------------
    cpu_int8: bool = setting(
        True,
        "publish with each model an int8 OpenVINO copy for CPU workers, calibrated "
        "on the window's positions and published only if it agrees with the float32 "
        "model (model.cpu_int8); needs OpenVINO and NNCF, else skipped with a note",
    )
    # --- bookkeeping -------------------------------------------------------
    checkpoint_every: int = setting(500, "steps between checkpoints", at_least=1)
    keep_checkpoints: int = setting(3, "checkpoints kept under ROOT/checkpoints", at_least=1)
    log_every: int = setting(100, "steps between progress lines and TensorBoard points", at_least=1)
    log_dir: str = setting("", "TensorBoard directory; default ROOT/logs, or STAGE_DIR/logs in stage mode")
    stage_dir: str = setting(
        "",
        "stage mode: copy the window's shards into this local directory and read them there, "
        "write checkpoints here and upload each one to ROOT/checkpoints through the storage layer "
        "(downloading ROOT's checkpoint first when it is newer, e.g. on a fresh disk), and write "
        "summaries to STAGE_DIR/logs; TensorFlow then touches only local files. Empty = TensorFlow "
        "reads and writes ROOT directly, except for a gs:// root while $STORAGE_EMULATOR_HOST is "
        "set (TensorFlow cannot reach an emulator): then a directory under the system temp folder",
    )
    windows: int = setting(1, "windows to train and publish before exiting", at_least=1)
    follow: bool = setting(False, "keep waiting for new windows instead of exiting")
    poll_seconds: float = poll_seconds_setting(30.0, looks_at="ROOT/windows with --follow (for a new window)")
    events: str = events_setting()
    # --- one trainer per root (model.lease) ---------------------------------
    lease_seconds: float = setting(
        60.0,
        "lifetime of the trainer lease on ROOT (renewed every quarter of it); a second trainer "
        "is refused until it expires",
        at_least=1,
        at_most=MAX_LEASE_SECONDS,
    )
    lease_wait: bool = setting(
        False, "when another trainer holds the lease, wait for it to expire instead of exiting with status 2"
    )

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ConfigError(settings_error(problems))

    def problems(self) -> list[str]:
        """Every invalid setting, each naming its flag."""
        out = []

        def need(condition, flag, text):
            if not condition:
                out.append(f"--{flag}: {text}")

        out += setting_problems(self)  # shared settings, declared choices and ranges (format.cli)
        need(
            self.network.board_size == 0,
            "board-size",
            f"the network's board size is {self.network.board_size}, but it is --board-size's: give the "
            "network without one (TrainConfig.network_for builds it on the run's)",
        )
        need(
            "://" not in self.stage_dir and not self.stage_dir.startswith("gs:"),
            "stage-dir",
            f"{self.stage_dir!r} must be a local directory, not a URL",
        )
        # The stage clean-up deletes every window folder of DIR/windows but the one in
        # training: at, inside or above the lake root it would delete the lake's windows.
        need(
            not self.stage_dir
            or "://" in self.stage_dir
            or self.stage_dir.startswith("gs:")
            or not local_folder_overlaps_root(self.stage_dir, self.root),
            "stage-dir",
            f"{self.stage_dir} is, holds or lies inside the lake root {self.root}; give the stage a folder of its own",
        )
        need(
            not self.max_steps_per_window or self.max_steps_per_window >= self.min_steps_per_window,
            "max-steps-per-window",
            f"must be 0 or at least --min-steps-per-window ({self.min_steps_per_window})",
        )
        need(self.strategy != "tpu" or self.logical_cpus == 0, "logical-cpus", "cannot be used with --strategy tpu")
        try:
            boundaries = self.lr_boundary_steps()
            need(self.lr_schedule != "step" or boundaries, "lr-boundaries", "is required by --lr-schedule step")
        except ValueError:
            out.append(
                f"--lr-boundaries: {self.lr_boundaries!r} is not a comma-separated list of increasing positive integers"
            )
        need(
            self.lr_schedule != "anneal" or self.lr_anneal_to > self.lr_anneal_from,
            "lr-anneal-to",
            f"must be above --lr-anneal-from ({self.lr_anneal_from:g}) with --lr-schedule anneal",
        )
        return out

    def network_for(self, board_size: int) -> NetworkConfig:
        """The network to build and publish: the flags' shape on a board of ``board_size``
        (the run's, once known)."""
        return dataclasses.replace(self.network, board_size=board_size)

    def lr_boundary_steps(self) -> tuple[int, ...]:
        if not self.lr_boundaries.strip():
            return ()
        steps = tuple(int(part) for part in self.lr_boundaries.split(","))
        if any(s <= 0 for s in steps) or list(steps) != sorted(set(steps)):
            raise ValueError(self.lr_boundaries)
        return steps


CLI = RoleCli(
    TrainConfig,
    prog="python -m model.train",
    description="Train the zerolake network on the newest complete training window "
    "under ROOT/windows, publish it to ROOT/models, and exit (or --follow). "
    "Rerunning the same command resumes a killed run from its last checkpoint.",
)
"""The trainer's command line: ``CLI.parse(argv)`` -> (TrainConfig, storage RetryPolicy)."""
