"""ShuffleConfig: every setting of the shuffle job, validated once, exposed as flags.

One frozen dataclass; format.cli turns its fields into dashed flags (``--window-exponent``) and
back, so the CLI and the library cannot drift apart.  Beam's own options keep Beam's underscores
and pass through, but an underscore spelling of the job's own flags is refused (`pipeline.shuffle`).
Follow-mode fields (``follow``, ``follow_new_positions``, ``poll_seconds``, ``claim_seconds``,
``events``, ``dataflow_above_positions``) steer `pipeline.follow` and are left out of a
one-window child's command (`window_argv`).  Units: positions are training examples; "reuse" is
how many times a position appears in the window's shards in expectation.
"""

from __future__ import annotations

import argparse
import dataclasses

from cloud.base import RetryPolicy
from cloud.storage import retry_flags_argv
from format.cli import (
    board_size_setting,
    config_from_namespace,
    events_setting,
    flag_name,
    poll_seconds_setting,
    root_setting,
    setting,
    setting_problems,
    settings_error,
    storage_retry,
)
from format.leases import MAX_LEASE_SECONDS
from format.tfrecord import GZIP_LEVELS, SHARD_GZIP_LEVEL

LABEL_AUTO = "auto"
LABEL_MODEL = "model"
LABEL_RANDOM = "random"
PLAYOUT_LABEL_MODES = (LABEL_AUTO, LABEL_MODEL, LABEL_RANDOM)


FOLLOW_WINDOW_FRACTION = 0.25
"""Default follow cadence: a new window once new positions reach this fraction of the window."""


def _field(default, help_text, *, follow=False, **valid):
    """A config field (format.cli.setting, ``valid``: its choices and bounds); ``follow``:
    a setting of the follower only, never passed to a window's child job."""
    return setting(default, help_text, follow=follow, **valid)


@dataclasses.dataclass(frozen=True)
class ShuffleConfig:
    """Settings of one shuffle run.  ``root`` is a folder or gs://bucket/prefix."""

    root: str = root_setting()
    board_size: int = board_size_setting(0)
    # --- window (power law in the manner of KataGo's shuffle.py) ---
    window_min_positions: int = _field(
        250_000, "below this many positions in the lake the window is the whole lake", at_least=1
    )
    window_exponent: float = _field(
        0.65, "growth exponent of the window beyond the minimum (1 = keep everything)", above=0, at_most=1
    )
    window_scale: int = _field(250_000, "positions over which the power law bends", at_least=1)
    window_slope: float = _field(
        1.0,
        "new window positions per new lake position just past the minimum, decaying by the power law "
        "after (1 = every new position joins at first; KataGo uses 0.4)",
        above=0,
        at_most=1,
    )
    window_max_positions: int = _field(0, "hard cap on the window (0 = none)", at_least=0)
    sample_chunks: int = _field(
        3, "newest chunks decoded up front to estimate positions per byte for the window rule", at_least=1
    )
    # --- labels ---
    playout_labels: str = _field(
        LABEL_AUTO,
        "how games without an exact endstate are played out: auto (model if the lake has one, "
        "else random), model, random",
        choices=PLAYOUT_LABEL_MODES,
    )
    random_playouts: int = _field(64, "random playouts averaged per game when no model is used", at_least=1)
    model_playout_moves: int = _field(
        0, "moves the model plays per game before random playouts finish it (0 = 2*N*N)", at_least=0
    )
    model_temperature: float = _field(1.0, "softmax temperature of the model's policy while playing out", above=0)
    playout_ownership_weight: float = _field(
        0.5, "ownership and score loss weight of played-out labels (exact endstates get 1)", at_least=0, at_most=1
    )
    accelerated_label_weight: float = _field(
        1.0,
        "ownership and score loss weight of a resigned game's label when self-play finished it with "
        "cheap moves (its ending is near random; a game played to two passes gets 1)",
        at_least=0,
        at_most=1,
    )
    after_resignation_rows: float = _field(
        1.0,
        "share of the positions recorded after a resignation (the cheap moves that finish the game) kept "
        "as training rows: 1 keeps them all, 0 drops them all. Windows are sized by the rows kept",
        at_least=0,
        at_most=1,
    )
    value_only_rows: float = _field(
        1.0,
        "share of the positions without a policy target (moves chosen by a fast search) kept as "
        "value-only training rows: 1 keeps them all, 0 drops them all (KataGo writes no row for a "
        "cheap search). Windows are sized by the rows kept",
        at_least=0,
        at_most=1,
    )
    # --- dedup ---
    dedup_max_move: int = _field(
        20, "only positions before this move number can be capped (bounds dedup memory; 0 = no cap)", at_least=0
    )
    position_cap: int = _field(
        8,
        "a position (board + history + side to move) is kept at most this many times; the targets of "
        "all its occurrences are averaged into the kept copies",
        at_least=1,
    )
    partition_positions: int = _field(
        200_000, "early positions per dedup partition (memory of one dedup step)", at_least=1
    )
    # --- shuffle ---
    reuse: float = _field(
        1.5, "expected copies of each position in the shards (floor(r) + Bernoulli(frac(r)))", above=0, at_most=16
    )
    sample_games: float = _field(
        0.0,
        "with --reuse below 1 (a window sized to what the trainer reads): decode and label only a random "
        "share min(1, reuse x this) of the window's games and keep their positions at reuse / that share, "
        "the same rows in expectation for a fraction of the work, each sampled game giving about 1/this "
        "of its positions; 0 = decode every game",
        at_least=0,
        at_most=1000,
    )
    shard_positions: int = _field(
        100_000, "target records per output shard; the shard count grows with the window", at_least=1
    )
    shard_gzip_level: int = _field(
        SHARD_GZIP_LEVEL,
        "gzip level of the shards, ISA-L's scale: 0 fastest .. 3 smallest",
        at_least=GZIP_LEVELS.start,
        at_most=GZIP_LEVELS.stop - 1,
    )
    bundle_positions: int = _field(20_000, "positions per work bundle (a group of whole chunks)", at_least=1)
    seed: int = _field(0, "seed of every random choice (0 = derive one from the attempt id)", at_least=0)
    # --- retention (pipeline.retention) ---
    keep_windows: int = _field(
        2,
        "after each run, keep this many of the windows the trainer has finished (generation <= "
        "models/LATEST) and delete older finished ones; windows newer than LATEST are never deleted "
        "(0 = keep every window)",
        at_least=0,
    )
    # --- local runner ---
    workers: int = _field(2, "worker processes of the local in-process runner (FnApiRunner)", at_least=1)
    # --- follow mode (pipeline.follow) ---
    follow: bool = _field(
        False, "run forever: wait for enough new positions, write the next window, wait again", follow=True
    )
    follow_new_positions: int = _field(
        0,
        f"with --follow: new positions since the last window that trigger the next one (0 = "
        f"{FOLLOW_WINDOW_FRACTION:g} of the window the rule would take now)",
        follow=True,
        at_least=0,
    )
    follow_max_untrained: int = _field(
        0,
        "with --follow: build a window only while fewer than this many windows newer than models/LATEST "
        "exist (2 = the one the trainer is training and one ready for it), so that no window is built only "
        "to be superseded before the trainer reaches it (0 = no limit)",
        follow=True,
        at_least=0,
    )
    samples_per_row: float = _field(
        0.0,
        "with --follow: size each window's shards to what the trainer will read, about this many samples "
        "per row new since the previous window (the trainer's --samples-per-row), by lowering --reuse for "
        "that window; never above --reuse (0 = off: every window holds its positions x --reuse)",
        follow=True,
        at_least=0,
        at_most=1000,
    )
    follow_min_rows: int = _field(
        0,
        "with --samples-per-row: at least this many rows in a window's shards (the trainer's "
        "--min-steps-per-window x global batch)",
        follow=True,
        at_least=0,
    )
    follow_max_rows: int = _field(
        0,
        "with --samples-per-row: at most this many rows in a window's shards (the trainer's "
        "--max-steps-per-window x global batch; 0 = no limit)",
        follow=True,
        at_least=0,
    )
    poll_seconds: float = poll_seconds_setting(5.0, looks_at="the lake with --follow", follow=True)
    claim_seconds: float = _field(
        180.0,
        "with --follow: a window claim expires this long after its last renewal (renewed every "
        "quarter of it while the window is built), so a killed follower blocks nobody for long",
        follow=True,
        at_least=1,
        at_most=MAX_LEASE_SECONDS,
    )
    events: str = events_setting(what="the follower's", follow=True)
    dataflow_above_positions: int = _field(
        0,
        "with --follow and Beam flags that name Dataflow (--runner DataflowRunner ...): a window of at most "
        "this many positions is built on this machine by the in-process runner (the Beam flags are left out), "
        "a larger one on Dataflow, so small windows do not wait minutes for Dataflow's workers to start "
        "(0 = every window where the Beam flags say)",
        follow=True,
        at_least=0,
    )
    storage_retry: RetryPolicy = setting(default_factory=RetryPolicy, hidden=True)
    """How hard gs:// requests retry (the --storage-* flags; the DoFns open the lake with it too)."""

    @property
    def game_share(self) -> float:
        """The share of the window's games decoded and labelled (``--sample-games``)."""
        return min(1.0, self.reuse * self.sample_games) if self.sample_games and self.reuse < 1 else 1.0

    @property
    def row_reuse(self) -> float:
        """Expected shard copies of each position of a decoded game: --reuse over the games' share."""
        return self.reuse / self.game_share

    def __post_init__(self):
        errors = setting_problems(self)  # shared settings, declared choices and ranges (format.cli)
        if self.window_max_positions and self.window_max_positions < self.window_min_positions:
            errors.append("--window-max-positions must be 0 or at least --window-min-positions")
        if errors:
            raise ValueError(settings_error(errors, "invalid shuffle settings"))


def window_argv(config: ShuffleConfig) -> list[str]:
    """Flags that rebuild ``config`` without its follow-mode settings (a one-window child job)."""
    argv = []
    for f in dataclasses.fields(ShuffleConfig):
        value = getattr(config, f.name)
        if f.metadata.get("follow") or f.metadata.get("hidden") or (value == f.default and f.name != "root"):
            continue
        argv += [flag_name(f.name), str(value)]
    return argv + retry_flags_argv(config.storage_retry)


def from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ShuffleConfig:
    """The config named by parsed flags; a bad value exits 2 naming the flag."""
    return config_from_namespace(ShuffleConfig, args, parser, storage_retry=storage_retry(args, parser))
