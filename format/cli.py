"""One way to turn a role's config dataclass into command-line flags.

Every entry point (worker, shuffle, train, loop, cluster, GTP, match) keeps
its settings in one frozen dataclass whose fields carry their own help text
(:func:`setting`) and whose ``__post_init__`` validates them, raising
ValueError with a message that names the flag.  This module builds the
argparse flags from the fields and the config from the parsed flags, so that
every role has the same conventions:

* a field ``board_size`` is the flag ``--board-size`` (dashed); old
  spellings stay accepted as aliases (``aliases=("--board",)``, or every
  ``--snake_case`` form with ``underscore_aliases=True`` for a role whose
  flags used to be spelled that way);
* a ``bool`` field is ``--x`` / ``--no-x``;
* a field typed ``int | None`` (or float/str) takes a value or stays None;
* ``--help`` shows each field's help and its default;
* a bad value exits with status 2 and one line naming the flag (argparse's
  usage error), never a traceback.

Beam's own pipeline options keep Beam's spelling (``--temp_location``); the
shuffle job passes what it does not know on to Beam.  The storage layer's
retry flags (``--storage-max-attempts``...) are added by
:func:`add_storage_flags` for every role that reads or writes a bucket.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing

_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def setting(default=dataclasses.MISSING, help: str = "", *, default_factory=dataclasses.MISSING,  # noqa: A002
            aliases: tuple[str, ...] = (), choices=None, required: bool = False, metavar: str | None = None,
            hidden: bool = False, **metadata):
    """A config field with its flag's help text and options.

    ``required`` makes the flag mandatory on the command line (the dataclass
    may still have a default for library callers); ``hidden`` keeps a field
    out of the flags altogether (set by code, not by users).  Extra keyword
    arguments are kept in the field's metadata for the role's own use.
    """
    info = {"help": help, "aliases": tuple(aliases), "choices": choices, "required": required,
            "metavar": metavar, "hidden": hidden, **metadata}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=info)
    return dataclasses.field(default=default, metadata=info)


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
        raise TypeError(f"{config_cls.__name__}.{field.name}: flags support int, float, str, bool "
                        f"(optionally | None), not {field.type!r}")
    return _TYPES[names[0]], optional


def _default(field: dataclasses.Field):
    """The flag's default: the field's, or None (required, or filled in by the
    field's default_factory when the flag is not given)."""
    return None if field.default is dataclasses.MISSING else field.default


def add_config_flags(parser: argparse.ArgumentParser, config_cls, *, exclude: typing.Iterable[str] = (),
                     underscore_aliases: bool = False, group_title: str | None = None) -> None:
    """Add one flag per field of ``config_cls`` (see the module docstring)."""
    target = parser.add_argument_group(group_title) if group_title else parser
    excluded = set(exclude)
    for field in dataclasses.fields(config_cls):
        info = field.metadata
        if field.name in excluded or info.get("hidden") or not field.init:
            continue
        names = [flag_name(field.name)]
        if underscore_aliases and "_" in field.name:
            names.append("--" + field.name)
        names += [alias for alias in info.get("aliases", ()) if alias not in names]
        kind, optional = _field_type(config_cls, field)
        default = _default(field)
        text = info.get("help", "")
        if kind is bool:
            target.add_argument(*names, dest=field.name, action=argparse.BooleanOptionalAction,
                                default=default, help=text)
            continue
        shown = "" if default is None or info.get("required") else \
            f" (default: {default!r})" if isinstance(default, str) else f" (default: {default})"
        target.add_argument(*names, dest=field.name, type=kind, default=default, choices=info.get("choices"),
                            required=bool(info.get("required")), metavar=info.get("metavar"),
                            help=(text + shown).strip() or None)


def config_from_namespace(config_cls, namespace: argparse.Namespace, parser: argparse.ArgumentParser, **extra):
    """Build and validate ``config_cls`` from parsed flags (plus ``extra`` fields).

    A ValueError from the dataclass's validation becomes a usage error
    (exit 2, one line naming the flag).
    """
    values = dict(extra)
    for field in dataclasses.fields(config_cls):
        if field.name in values or not hasattr(namespace, field.name):
            continue
        value = getattr(namespace, field.name)
        if value is None and field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            continue       # not given: the dataclass's own factory decides
        values[field.name] = value
    try:
        return config_cls(**values)
    except ValueError as exc:
        parser.error(str(exc))


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

    def parser(self) -> argparse.ArgumentParser:
        return role_parser(self.config_cls, prog=self.prog, description=self.description, storage=self.storage)

    def parse(self, argv=None, **extra):
        return parse_config(self.config_cls, self.parser(), argv, **extra)


def role_parser(config_cls, *, prog: str, description: str, epilog: str | None = None, storage: bool = True,
                underscore_aliases: bool = False) -> argparse.ArgumentParser:
    """An entry point's parser: one flag per config field, plus the storage retry
    flags for a role that reads or writes a bucket (``storage``)."""
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog)
    add_config_flags(parser, config_cls, underscore_aliases=underscore_aliases)
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
