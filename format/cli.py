"""One way to turn a role's config dataclass into command-line flags.

Every entry point keeps its settings in one frozen dataclass whose fields carry their help text
and valid values (`setting`: ``choices``, ``at_least``, ``above``, ``at_most``, ``below``); this
module builds the argparse flags from the fields and the config from the parsed flags, so every
role has the same conventions:
* a field ``board_size`` is the flag ``--board-size``, its one name; a ``bool`` is ``--x`` /
  ``--no-x``; ``int | None`` takes a value or stays None; ``--help`` shows help, default and range;
* `setting_problems` checks declared values in one wording (``--reuse: must be in (0, 16], got
  17``); ``__post_init__`` keeps only checks that span fields or need code; a bad value exits 2
  with one line naming the flag, never a traceback.
Shared settings (``root``, ``board_size``, ``komi``...) are declared once each (`root_setting`,
`board_size_setting`...).  Beam's options keep Beam's spelling and pass through; `add_storage_flags`
adds the storage retry flags.  A field whose metadata has a ``flag_group`` stands for a group of
flags (a launcher's prefixed role flags, ``--worker-visits``, declared by `operations.roles`);
a `nested_setting` holds a whole config whose fields are the holder's flags under their own names
(``TrainConfig.network``: ``--blocks``; see `nested_flag_fields`, `changed_argv`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing

from format import schema
from format.run_config import komi_problem

_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def setting(
    default=dataclasses.MISSING,
    help: str = "",
    *,
    default_factory=dataclasses.MISSING,  # noqa: A002
    choices=None,
    required: bool = False,
    metavar: str | None = None,
    hidden: bool = False,
    at_least=None,
    above=None,
    at_most=None,
    below=None,
    **metadata,
):
    """A config field with its flag's help text, options and valid range.

    ``required`` makes the flag mandatory on the command line (the dataclass
    may still have a default for library callers); ``hidden`` keeps a field
    out of the flags altogether (set by code, not by users).  ``choices`` and
    the bounds (``at_least`` <=, ``above`` <, ``at_most`` >=, ``below`` >)
    declare what a valid value is: :func:`setting_problems` checks them for
    every role in one wording, and ``--help`` shows the range.  Extra keyword
    arguments are kept in the field's metadata for the role's own use.
    """
    info = {
        "help": help,
        "choices": choices,
        "required": required,
        "metavar": metavar,
        "hidden": hidden,
        "bounds": tuple(
            (op, limit)
            for op, limit in ((">=", at_least), (">", above), ("<=", at_most), ("<", below))
            if limit is not None
        ),
        **metadata,
    }
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=info)
    return dataclasses.field(default=default, metadata=info)


# --------------------------------------------------------------------------
# Settings shared by several roles: one constructor each (module docstring)
# --------------------------------------------------------------------------


def _with_note(text: str, note: str) -> str:
    return f"{text}; {note}" if note else text


def _check_root(value, info) -> str | None:
    # None: a role that can run without a lake (GTP); '' is never a root.
    return "a storage root is required" if value == "" else None


def root_setting(default: str | None = "", *, required: bool = True, note: str = ""):
    """The lake root (``--root``): a local folder or gs://bucket/prefix.

    ``required``: the flag must be given (library callers still get the
    default); a launcher that makes its own lake defaults to ``./lake``; a
    role that may run without a lake (GTP) has ``None``.
    """
    return setting(
        default,
        _with_note("lake root: a local folder or gs://bucket/prefix", note),
        required=required,
        check=_check_root,
    )


def _check_board_size(value, info) -> str | None:
    if value is None or (value == 0 and info["from_run"]):
        return None
    if not schema.MIN_BOARD_SIZE <= value <= schema.MAX_BOARD_SIZE:
        return f"{value} is outside {schema.MIN_BOARD_SIZE}..{schema.MAX_BOARD_SIZE}"
    return None


def board_size_setting(default: int | None = schema.DEFAULT_BOARD_SIZE, *, note: str = ""):
    """The board size (``--board-size``), checked against ROOT/run.json by every role that has a lake.

    A default of 0 means "take ROOT/run.json's" (roles that only read the
    lake); None means the role finds it elsewhere (the note says where).
    """
    text = "board size (N of an N x N board; must match ROOT/run.json when there is one)"
    if default == 0:
        text += "; 0 = take ROOT/run.json's"
    return setting(default, _with_note(text, note), check=_check_board_size, from_run=default == 0)


def _check_komi(value, info) -> str | None:
    return None if value is None else komi_problem(value)


def komi_setting(default: float | None = schema.DEFAULT_KOMI, *, note: str = ""):
    """Komi (``--komi``), points given to White; a multiple of 0.5 as in run.json."""
    return setting(
        default,
        _with_note(
            "komi: points added to White's area score (a multiple of 0.5; must match ROOT/run.json when there is one)",
            note,
        ),
        check=_check_komi,
    )


def _check_max_moves(value, info) -> str | None:
    return "must be >= 0 (0 = 3 x N x N)" if value < 0 else None


def max_moves_setting(default: int = 0):
    """The move cap per game (``--max-moves``), passes included; 0 = the engine's 3 x N x N."""
    return setting(default, "move cap per game, passes included (0 = the engine's 3 x N x N)", check=_check_max_moves)


def pass_when_winning_setting():
    """The search's pass rule (``--pass-when-winning``), one wording for every role that searches."""
    return setting(
        False,
        "the search may also pass whenever the Tromp-Taylor score of the board as it stands "
        "(no stone judged dead, komi included) wins for the player to move, so a won game "
        "ends by answering a pass with a pass and a seki can be left alone; off: PASS only "
        "when every other legal move fills one's own eye (engine.board's "
        "CANDIDATES_PASS_WHEN_WINNING)",
    )


def events_setting(*, what: str = "", empty: str = "none", **metadata):
    """The JSON-lines progress events file (``--events``, format/events.py).

    ``what`` says which events (a launcher's own...), ``empty`` what '' means.
    """
    subject = f"{what} " if what else ""
    return setting(
        "",
        f"append {subject}JSON-lines events (format/events.py) to this file ('-' = stdout, '' = {empty})",
        **metadata,
    )


def _check_poll_seconds(value, info) -> str | None:
    return None if math.isfinite(value) and value > 0 else f"must be > 0, got {value}"


def poll_seconds_setting(default: float, *, looks_at: str, **metadata):
    """How often a long-running role looks at the lake (``--poll-seconds``); ``looks_at``: at what."""
    return setting(default, f"seconds between looks at {looks_at}", check=_check_poll_seconds, **metadata)


def setting_problems(config) -> list[str]:
    """``--flag: problem`` for each shared setting of ``config`` (see above) whose value is invalid.

    Each role's ``__post_init__`` adds these to its own checks, so a shared
    setting is validated by one rule, worded one way, in every role.
    """
    problems = []
    for field in dataclasses.fields(config):
        check = field.metadata.get("check")
        value = getattr(config, field.name)
        # The field's own rule words the problem when it has one; the magnitude rule
        # catches what a rule without an upper (lower) bound lets through.
        problem = (
            check(value, field.metadata) if check else _declared_problem(value, field.metadata)
        ) or _magnitude_problem(value, field.metadata)
        if problem:
            problems.append(f"{flag_name(field.name)}: {problem}")
    return problems


_HOLDS = {">=": lambda v, x: v >= x, ">": lambda v, x: v > x, "<=": lambda v, x: v <= x, "<": lambda v, x: v < x}


def range_text(bounds) -> str:
    """A field's declared range in words: '>= 1', 'in [0, 1]', 'in (0, 1]'..."""
    lower = [(op, x) for op, x in bounds if op in (">=", ">")]
    upper = [(op, x) for op, x in bounds if op in ("<=", "<")]
    if lower and upper:
        (low_op, low), (high_op, high) = lower[0], upper[0]
        return f"in {'[' if low_op == '>=' else '('}{low}, {high}{']' if high_op == '<=' else ')'}"
    return " and ".join(f"{op} {x}" for op, x in bounds)


def settings_error(problems: list[str], what: str = "invalid flags") -> str:
    """One line for a role's invalid settings: the problem itself when there is one
    (``--reuse: must be in (0, 16], got 17``), else ``what: p1; p2; ...``."""
    return problems[0] if len(problems) == 1 else f"{what}: " + "; ".join(problems)


NUMBER_LIMIT = 10**9
"""A numeric setting with no declared bound is within +-this: no real setting comes near it, and a
value past it (1e300, 2**63) would overflow or exhaust memory deep inside a role instead of one line here."""


def _magnitude_problem(value, info) -> str | None:
    """Every numeric setting: finite, and within NUMBER_LIMIT on each side that declares no bound."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    bounds = info.get("bounds", ())
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number{' ' + range_text(bounds) if bounds else ''}, got {value}"
    declared = {op for op, _ in bounds}
    if not declared & {"<=", "<"} and value > NUMBER_LIMIT:
        return f"must be at most {NUMBER_LIMIT:,}, got {value}"
    if not declared & {">=", ">"} and value < -NUMBER_LIMIT:
        return f"must be at least {-NUMBER_LIMIT:,}, got {value}"
    return None


def bounded_number(kind, *, at_least=None, above=None, at_most=None):
    """An argparse ``type`` for a plain numeric flag (one no config dataclass declares: a subcommand's
    own flag), under the settings' rules: its declared bounds, a finite value, and NUMBER_LIMIT on a
    side with no bound.  A bad value is argparse's usage error naming the flag (exit 2)."""
    bounds = tuple((op, limit) for op, limit in ((">=", at_least), (">", above), ("<=", at_most)) if limit is not None)

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
        problem = _declared_problem(value, {"bounds": bounds}) or _magnitude_problem(value, {"bounds": bounds})
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    parse.number_kind = kind  # what tests/system/test_flag_bounds.py looks for
    return parse


def _declared_problem(value, info) -> str | None:
    """The declared choices and bounds of a field (see :func:`setting`), checked on ``value``."""
    choices = info.get("choices")
    if choices is not None and value not in choices:
        return f"{value!r} is not one of {', '.join(map(str, choices))}"
    bounds = info.get("bounds", ())
    if not bounds or value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number {range_text(bounds)}, got {value}"
    if not all(_HOLDS[op](value, limit) for op, limit in bounds):
        return f"must be {range_text(bounds)}, got {value}"
    return None


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _field_type(config_cls, field: dataclasses.Field) -> tuple[type, bool]:
    """(python type, optional) of a field, from its (possibly string) annotation."""
    annotation = field.type
    if not isinstance(annotation, str):
        annotation = getattr(annotation, "__name__", str(annotation))
    parts = [part.strip() for part in annotation.replace("Optional[", "").rstrip("]").split("|")]
    optional = "None" in parts
    names = [part for part in parts if part != "None"]
    if len(names) != 1 or names[0] not in _TYPES:
        raise TypeError(
            f"{config_cls.__name__}.{field.name}: flags support int, float, str, bool "
            f"(optionally | None), not {field.type!r}"
        )
    return _TYPES[names[0]], optional


def field_default(field: dataclasses.Field):
    """The flag's default: the field's, or None (required, or filled in by the
    field's default_factory when the flag is not given)."""
    return None if field.default is dataclasses.MISSING else field.default


def add_config_flags(
    parser: argparse.ArgumentParser, config_cls, *, exclude: typing.Iterable[str] = (), group_title: str | None = None
) -> None:
    """Add one flag per field of ``config_cls`` (see the module docstring);
    a field with a ``flag_group`` (a launcher's role field) adds its own flags."""
    target = parser.add_argument_group(group_title) if group_title else parser
    excluded = set(exclude)
    groups = []
    for field in dataclasses.fields(config_cls):
        info = field.metadata
        if field.name in excluded or info.get("hidden") or not field.init:
            continue
        if "flag_group" in info:
            groups.append(field)
            continue
        add_flag(target, config_cls, field, [flag_name(field.name)], field.name, field_default(field))
    for field in groups:
        field.metadata["flag_group"].add_flags(parser, field)


def add_flag(target, config_cls, field: dataclasses.Field, names: list[str], dest: str, default) -> None:
    """One flag for one field: typed, with its help text and default."""
    info = field.metadata
    metavar = info.get("metavar") or (None if info.get("choices") else field.name.upper())
    kind, optional = _field_type(config_cls, field)
    text = info.get("help", "")
    if info.get("bounds"):
        text = f"{text} ({range_text(info['bounds'])})" if text else range_text(info["bounds"])
    if kind is bool:
        target.add_argument(*names, dest=dest, action=argparse.BooleanOptionalAction, default=default, help=text)
        return
    shown = (
        ""
        if default is None or info.get("required")
        else f" (default: {default!r})"
        if isinstance(default, str)
        else f" (default: {default})"
    )
    target.add_argument(
        *names,
        dest=dest,
        type=kind,
        default=default,
        choices=info.get("choices"),
        required=bool(info.get("required")),
        metavar=metavar,
        help=(text + shown).strip() or None,
    )


def config_from_namespace(config_cls, namespace: argparse.Namespace, parser: argparse.ArgumentParser, **extra):
    """Build and validate ``config_cls`` from parsed flags (plus ``extra`` fields).

    A ValueError from the dataclass's validation becomes a usage error
    (exit 2, one line naming the flag).
    """
    values = dict(extra)
    for field in dataclasses.fields(config_cls):
        if field.name not in values and "flag_group" in field.metadata:
            values[field.name] = field.metadata["flag_group"].value(field, namespace, parser)
            continue
        if field.name in values or not hasattr(namespace, field.name):
            continue
        value = getattr(namespace, field.name)
        if value is None and field.default_factory is not dataclasses.MISSING:
            continue  # not given: the dataclass's own factory decides
        values[field.name] = value
    try:
        return config_cls(**values)
    except ValueError as exc:
        parser.error(str(exc))


def nested_setting(config_cls, help: str = ""):  # noqa: A002
    """A field holding a whole config of ``config_cls`` (default: its defaults) whose flag fields are
    the holder's flags under their own names (module docstring); ``config_cls`` validates them."""
    return dataclasses.field(
        default_factory=config_cls, metadata={"help": help, "nested": config_cls, "flag_group": NESTED_FLAGS}
    )


def nested_flag_fields(config_cls, prefix: str = "") -> list[tuple[str, dataclasses.Field, type]]:
    """``(path, field, declaring class)`` of every flag field of ``config_cls``, a nested config's
    (:func:`nested_setting`) in its place with the path ``holder.field``; hidden fields, fields not in
    ``__init__`` and fields with another flag group (a launcher's role) are left out."""
    out = []
    for field in dataclasses.fields(config_cls):
        if not field.init or field.metadata.get("hidden"):
            continue
        nested = field.metadata.get("nested")
        if nested is not None:
            out += nested_flag_fields(nested, f"{prefix}{field.name}.")
        elif "flag_group" not in field.metadata:
            out.append((prefix + field.name, field, config_cls))
    return out


def config_from_paths(config_cls, values: dict):
    """``config_cls(...)`` from values keyed by path (``seed``, or ``network.blocks`` for a field of
    the nested config ``network``, which is built from them)."""
    own: dict = {}
    inner: dict = {}
    for path, value in values.items():
        head, dot, rest = path.partition(".")
        if dot:
            inner.setdefault(head, {})[rest] = value
        else:
            own[head] = value
    fields = {field.name: field for field in dataclasses.fields(config_cls)}
    for name, nested_values in inner.items():
        if name not in own:
            own[name] = config_from_paths(fields[name].metadata["nested"], nested_values)
    return config_cls(**own)


def changed_argv(config, *, skip: typing.Iterable[str] = (), always: typing.Iterable[str] = ()) -> list[str]:
    """The flags of ``config``'s flag fields that differ from their defaults (a nested config's under
    their own names), leaving out the fields named in ``skip`` and giving those in ``always`` even at
    their default: what a child's command line needs to rebuild ``config``."""
    skip, always = set(skip), set(always)
    argv: list[str] = []
    for field in dataclasses.fields(config):
        if not field.init or field.metadata.get("hidden") or field.name in skip:
            continue
        value = getattr(config, field.name)
        if "nested" in field.metadata:
            argv += changed_argv(value)
        elif field.name in always or field.default is dataclasses.MISSING or value != field.default:
            argv += config_flag_argv(field.name, value)
    return argv


class NestedFlags:
    """The ``flag_group`` of a :func:`nested_setting` field: its config's fields as the holder's flags."""

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
        group = parser.add_argument_group(field.metadata["help"] or None)
        for path, inner, owner in nested_flag_fields(field.metadata["nested"], f"{field.name}."):
            add_flag(group, owner, inner, [flag_name(inner.name)], path, field_default(inner))

    @staticmethod
    def value(field: dataclasses.Field, namespace: argparse.Namespace, parser):
        values = {}
        for path, inner, _ in nested_flag_fields(field.metadata["nested"], f"{field.name}."):
            value = getattr(namespace, path, None)
            if value is None and (not hasattr(namespace, path) or inner.default_factory is not dataclasses.MISSING):
                continue
            values[path.partition(".")[2]] = value
        try:
            return config_from_paths(field.metadata["nested"], values)
        except ValueError as exc:
            parser.error(str(exc))

    @staticmethod
    def epilog(config_cls) -> str | None:
        return None


NESTED_FLAGS = NestedFlags()


@dataclasses.dataclass(frozen=True)
class RoleCli:
    """An entry point's command line: its config class, name and description.

    ``parser()`` builds the argparse parser; ``parse(argv)`` returns
    ``(config, retry)`` as :func:`parse_config` does.
    """

    config_cls: type
    prog: str
    description: str
    storage: bool = True
    """Whether the role reads or writes a bucket (then it takes the --storage-* retry flags)."""
    arguments: tuple = ()
    """Arguments that are not config fields, as ``(names, argparse keywords)`` pairs: positional
    player specs, or a launcher's repeatable ``--role-args``; the entry point turns them into
    config values itself."""

    def parser(self) -> argparse.ArgumentParser:
        parser = role_parser(self.config_cls, prog=self.prog, description=self.description, storage=self.storage)
        for names, keywords in self.arguments:
            parser.add_argument(*names, **keywords)
        return parser

    def parse(self, argv=None, **extra):
        return parse_config(self.config_cls, self.parser(), argv, **extra)


def role_parser(
    config_cls, *, prog: str, description: str, epilog: str | None = None, storage: bool = True
) -> argparse.ArgumentParser:
    """An entry point's parser: one flag per config field, plus the storage retry
    flags for a role that reads or writes a bucket (``storage``)."""
    groups = [f for f in dataclasses.fields(config_cls) if "flag_group" in f.metadata and "nested" not in f.metadata]
    # A launcher has a hundred flags: its usage line names the groups, --help lists them.
    usage = f"%(prog)s [-h] [options] [{' '.join(f'--{f.name}-*' for f in groups)}]" if groups else None
    if epilog is None and groups:
        epilog = groups[0].metadata["flag_group"].epilog(config_cls)
    parser = argparse.ArgumentParser(prog=prog, description=description, usage=usage, epilog=epilog)
    add_config_flags(parser, config_cls)
    if storage:
        add_storage_flags(parser)
    return parser


def parse_config(config_cls, parser: argparse.ArgumentParser, argv=None, **extra):
    """``(config, retry)`` from the command line: the validated config and the
    storage RetryPolicy (None when the parser has no storage flags).  Bad
    values exit 2 with one line naming the flag."""
    args = parser.parse_args(argv)
    retry = storage_retry(args, parser) if hasattr(args, "storage_max_attempts") else None
    return config_from_namespace(config_cls, args, parser, **extra), retry


def add_storage_flags(parser: argparse.ArgumentParser) -> None:
    """The storage layer's retry flags, for every role that reads or writes a bucket."""
    from cloud.storage import add_retry_flags

    add_retry_flags(parser)


def storage_retry(namespace: argparse.Namespace, parser: argparse.ArgumentParser):
    """The RetryPolicy the storage flags ask for (usage error on a bad value)."""
    from cloud.storage import retry_policy_from_args

    try:
        return retry_policy_from_args(namespace)
    except ValueError as exc:
        parser.error(str(exc))


def config_flag_argv(name: str, value) -> list[str]:
    """One setting as flags: ``--x V``; a bool is ``--x`` / ``--no-x``; None is no flag."""
    if value is None:
        return []
    if isinstance(value, bool):
        return [flag_name(name) if value else "--no-" + name.replace("_", "-")]
    return [flag_name(name), str(value)]
