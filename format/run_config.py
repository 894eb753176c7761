"""``ROOT/run.json``: the run's fixed settings, written once, checked by every role.

A lake mixes output from many processes over weeks.  Anything that would make
their records incompatible (board size, komi, rules, the feature set) is
fixed when the run starts: the first role to touch an empty root writes
``run.json`` create-only; every later role compares its own settings with it
and refuses to run on a mismatch, naming the field and both values.
"""

from __future__ import annotations

import dataclasses
import json
import math

from format import lake_json, layout, schema
from format.documents import MAX_POINTER_BYTES, too_large

FEATURE_SET = "agz17-v1"
"""Name of the planes the lake's records store (AlphaGo Zero's stone history, format/schema.py);
format/planes.py builds either model input width (17 or 22) from them, so models of both widths
share one lake."""


def komi_problem(komi: float) -> str | None:
    """What is wrong with ``komi`` as a run's komi, or None: the one rule that run.json and every
    role's --komi flag (format.cli.komi_setting) apply.

    A multiple of 0.5, because area scoring makes any other fraction pointless;
    within +-schema.MAX_KOMI, because it is stored as float32.  The range is
    checked first: doubling a huge float gives inf, round(inf) raises
    OverflowError, and so does isfinite() of a JSON integer of 400 digits.
    """
    if not (abs(komi) <= schema.MAX_KOMI and math.isfinite(komi) and komi * 2 == round(komi * 2)):
        return f"must be a multiple of 0.5 in [-{schema.MAX_KOMI:g}, {schema.MAX_KOMI:g}], got {komi}"
    return None


class RunConfigMismatch(ValueError):
    """The settings of this process disagree with the root's run.json."""


class NoRun(ValueError):
    """The root has no run.json: no role has written to it yet."""


_FIELD_TYPES = (
    ("board_size", int, "a JSON integer"),
    ("komi", (int, float), "a JSON number"),
    ("rules", str, "a string"),
    ("feature_set", str, "a string"),
    ("format_version", int, "a JSON integer"),
)
"""Each run.json field, the Python types its JSON value may have (never a bool), and how to say it."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    board_size: int = schema.DEFAULT_BOARD_SIZE
    komi: float = schema.DEFAULT_KOMI
    rules: str = schema.RULES_TROMP_TAYLOR
    feature_set: str = FEATURE_SET
    format_version: int = schema.FORMAT_VERSION

    def __post_init__(self):
        # Types first: json.loads gives 9.0 for "9.0" and True for "true", which compare equal to
        # 9 and 1, so a run.json saying 9.0 passed every role that compares and killed the one
        # that builds a network of it (Keras refuses a float shape, deep inside).
        for name, kinds, what in _FIELD_TYPES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise ValueError(f"field '{name}' must be {what}, got {value!r}")
        if not schema.MIN_BOARD_SIZE <= self.board_size <= schema.MAX_BOARD_SIZE:
            raise ValueError(
                f"board size {self.board_size} is outside {schema.MIN_BOARD_SIZE}..{schema.MAX_BOARD_SIZE}"
            )
        problem = komi_problem(self.komi)
        if problem:
            raise ValueError(f"komi {problem}")
        if self.rules != schema.RULES_TROMP_TAYLOR:
            raise ValueError(f"rules {self.rules!r} are not supported (only {schema.RULES_TROMP_TAYLOR!r})")

    def to_json(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, source: str = layout.RUN_CONFIG) -> "RunConfig":
        try:
            fields = lake_json.parse(data, MAX_POINTER_BYTES)
        except lake_json.NotADocument as exc:
            raise RunConfigMismatch(f"{source}: {exc}") from None
        if not isinstance(fields, dict):
            raise RunConfigMismatch(f"{source}: expected a JSON object, got {type(fields).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        if set(fields) - known:
            raise RunConfigMismatch(f"{source}: unexpected fields {sorted(set(fields) - known)}")
        try:
            return cls(**fields)
        except (TypeError, ValueError) as exc:
            raise RunConfigMismatch(f"{source}: {exc}") from None


def read_run_config(storage) -> RunConfig | None:
    """The root's run.json, or None when the root has none yet."""
    if not storage.exists(layout.RUN_CONFIG):
        return None
    from cloud.base import TooLarge

    url = storage.url(layout.RUN_CONFIG)
    try:
        data = storage.read(layout.RUN_CONFIG, max_bytes=MAX_POINTER_BYTES)
    except TooLarge:
        raise RunConfigMismatch(f"{url}: {too_large(MAX_POINTER_BYTES)}") from None
    return RunConfig.from_json(data, url)


def require_run_config(storage, board_size_flag: int | None = None, *, creator: str = "self-play") -> RunConfig:
    """The root's run.json, which must exist and, given a ``--board-size`` (not 0 or None), agree with it.

    The one check every role that reads a run makes before anything else: NoRun names the file and
    who creates it (``creator``); RunConfigMismatch names the file and, for a disagreeing flag, the
    flag and both values."""
    run = read_run_config(storage)
    if run is None:
        raise NoRun(f"{storage.url(layout.RUN_CONFIG)} does not exist: this root has no run yet ({creator} creates it)")
    if board_size_flag and board_size_flag != run.board_size:
        raise RunConfigMismatch(
            f"--board-size {board_size_flag} disagrees with {storage.url(layout.RUN_CONFIG)}, "
            f"which says board_size {run.board_size}"
        )
    return run


def ensure_run_config(storage, config: RunConfig) -> RunConfig:
    """Write run.json if the root has none; otherwise require it to match ``config``.

    Raises RunConfigMismatch naming every field that differs.  Two processes
    starting at once are safe: the create-only write lets exactly one win and
    the other then compares against the winner's file.
    """
    from cloud.storage import AlreadyExists  # the storage layer imports nothing from format

    existing = read_run_config(storage)
    if existing is None:
        try:
            storage.write_new(layout.RUN_CONFIG, config.to_json())
            return config
        except AlreadyExists:  # another process's write won; compare against it (NoRun if it is gone again)
            existing = require_run_config(storage)
    differences = [
        f"{f.name}: run.json has {getattr(existing, f.name)!r}, this process was given {getattr(config, f.name)!r}"
        for f in dataclasses.fields(RunConfig)
        if getattr(existing, f.name) != getattr(config, f.name)
    ]
    if differences:
        raise RunConfigMismatch(
            f"{storage.url(layout.RUN_CONFIG)} disagrees with this process's settings:\n  "
            + "\n  ".join(differences)
            + "\nUse a fresh --root, or pass the run's settings."
        )
    return existing
