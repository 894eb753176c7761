"""Launchers' composition of the roles' configs: one role's whole config as one field of a launcher's.

A launcher (``operations.loop``, ``operations.cluster``) starts the roles as child processes and holds
each role's own config as a field declared with :func:`role_setting` (``worker: WorkerConfig``,
``train: TrainConfig``, ``shuffle: ShuffleConfig``).  One convention for every launcher:

* the role field ``R`` exposes each field ``F`` of the role's config as the flag ``--R-F``
  (``--worker-visits``; a nested config's field too: ``--train-blocks``), with the role's help text,
  in a ``--help`` group of its own; that is the setting's one name on the launcher;
* *shared* fields (``root``, ``board_size``, ``komi``) are the launcher's own flags, copied into
  every role; *managed* fields (events file, seed, spool...) are set per child and are not flags;
* the launcher may give a role field its own default; the role's ``__post_init__`` validates, and
  its error names the launcher's flag (``--worker-visits: must be >= 1``).

Data flow: flags -> format.cli -> the launcher's config (role fields included) -> :func:`role_argv`,
the child's command line (one function for every child; nothing is forwarded flag by flag).
:func:`hold_root` takes the root's one launcher lease; :func:`open_launch` is a launcher's start: open
the root, check run.json, and write the full settings once per invocation (:func:`record_settings`,
``layout.settings_record``).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import secrets
import socket
import sys
import time
import typing

from format import layout
from format.cli import (
    add_flag,
    changed_argv,
    config_flag_argv,
    config_from_paths,
    field_default,
    flag_name,
    nested_flag_fields,
)
from format.settings_record import SettingsRecord


def role_setting(
    config_cls,
    help: str,
    *,
    shared: typing.Iterable[str] = (),  # noqa: A002
    managed: typing.Iterable[str] = (),
    **defaults,
):
    """A launcher's field that holds one role's whole config.

    ``shared``: the role's fields the launcher copies from its own fields of
    the same name (``root``, ``board_size``...).  ``managed``: fields the
    launcher sets per child process (:func:`role_argv` takes them); neither is
    a flag.  ``defaults``: the launcher's own defaults for role fields (a
    field of a nested config, such as TrainConfig.network's ``blocks``, by
    its own name, as its flag is named).  The field's value is None until the
    launcher's ``__post_init__`` calls :func:`complete_roles`.
    """
    shared, managed = tuple(shared), tuple(managed)
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    nested = {f.name: path for path, f, _ in nested_flag_fields(config_cls) if "." in path}
    unknown = sorted(((set(shared) | set(managed)) - set(fields)) | (set(defaults) - set(fields) - set(nested)))
    if unknown:
        raise TypeError(f"role_setting({config_cls.__name__}): no such fields: {unknown}")
    for f in fields.values():
        unset = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.init and (unset or f.metadata.get("required")) and f.name not in (*shared, *managed, *defaults):
            raise TypeError(
                f"role_setting({config_cls.__name__}): required field {f.name!r} must be shared, "
                f"managed or given a default"
            )
    return dataclasses.field(
        default=None,
        metadata={
            "role": config_cls,
            "help": help,
            "shared": shared,
            "managed": managed,
            "defaults": {name if name in fields else nested[name]: value for name, value in defaults.items()},
            "flag_group": ROLE_FLAGS,
        },
    )


def _role_field(config, role: str) -> dataclasses.Field:
    for field in dataclasses.fields(config):
        if field.name == role and "role" in field.metadata:
            return field
    raise TypeError(f"{type(config).__name__} has no role field {role!r}")


def _role_flag_fields(role_field: dataclasses.Field) -> list[tuple[str, dataclasses.Field, type]]:
    """``(path, field, declaring class)`` of the role's fields that are the launcher's ``--<role>-*``
    flags; a nested config's fields (TrainConfig.network's) by their own names, path ``network.blocks``."""
    info = role_field.metadata
    kept = set(info["shared"]) | set(info["managed"])
    return [
        (path, f, owner) for path, f, owner in nested_flag_fields(info["role"]) if path.partition(".")[0] not in kept
    ]


def _role_dest(role_field: dataclasses.Field, path: str) -> str:
    return f"{role_field.name}.{path}"


def _add_role_flags(parser: argparse.ArgumentParser, role_field: dataclasses.Field) -> None:
    info = role_field.metadata
    group = parser.add_argument_group(f"{role_field.name} settings (--{role_field.name}-*)", info["help"])
    for path, field, owner in _role_flag_fields(role_field):
        default = info["defaults"].get(path, field_default(field))
        add_flag(
            group,
            owner,
            field,
            [f"--{role_field.name}-{field.name.replace('_', '-')}"],
            _role_dest(role_field, path),
            default,
        )


def _roles_epilog(config_cls) -> str | None:
    """For a launcher's --help: how its role flags are named."""
    roles = [f for f in dataclasses.fields(config_cls) if "role" in f.metadata]
    if not roles:
        return None
    example = flag_name(_role_flag_fields(roles[0])[0][1].name)
    return (
        f"Role settings: --ROLE-FIELD (ROLE one of {', '.join(f.name for f in roles)}) is that role's own "
        f"--FIELD (e.g. --{roles[0].name}-{example[2:]} is the {roles[0].name} role's {example}) and is passed "
        f"to every process of the role; the groups above list them, with this launcher's defaults."
    )


def _launcher_flags(role_field: dataclasses.Field, message: str) -> str:
    """A role's validation message with its flags spelled as the launcher's (``--visits`` -> ``--worker-visits``)."""
    own = {f.name.replace("_", "-") for _, f, _ in _role_flag_fields(role_field)}
    return re.sub(
        r"(?<![\w-])--([a-z][a-z0-9-]*)", lambda m: f"--{role_field.name}-{m[1]}" if m[1] in own else m[0], message
    )


def _role_from_namespace(role_field: dataclasses.Field, namespace: argparse.Namespace, parser):
    info = role_field.metadata
    values = {name: getattr(namespace, name) for name in info["shared"] if getattr(namespace, name, None) is not None}
    for path, field, _ in _role_flag_fields(role_field):
        value = getattr(namespace, _role_dest(role_field, path), None)
        if value is None and field.default_factory is not dataclasses.MISSING:
            continue
        values[path] = value
    try:
        return config_from_paths(info["role"], values)
    except ValueError as exc:
        parser.error(_launcher_flags(role_field, str(exc)))


class RoleFlags:
    """How `format.cli` builds, reads and explains a role field's ``--<role>-*`` flags (its ``flag_group``)."""

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
        _add_role_flags(parser, field)

    @staticmethod
    def value(field: dataclasses.Field, namespace: argparse.Namespace, parser):
        return _role_from_namespace(field, namespace, parser)

    @staticmethod
    def epilog(config_cls) -> str | None:
        return _roles_epilog(config_cls)


ROLE_FLAGS = RoleFlags()


def complete_roles(config) -> None:
    """For a launcher's ``__post_init__``: build each role config left None
    (from the shared fields and the launcher's defaults), and check that a
    given one agrees with the launcher on the shared fields."""
    for field in dataclasses.fields(config):
        info = field.metadata
        if "role" not in info:
            continue
        shared = {name: getattr(config, name) for name in info["shared"]}
        role_config = getattr(config, field.name)
        if role_config is None:
            try:
                role_config = config_from_paths(info["role"], {**shared, **info["defaults"]})
            except ValueError as exc:
                raise ValueError(_launcher_flags(field, str(exc))) from None
            object.__setattr__(config, field.name, role_config)
            continue
        for name, value in shared.items():
            if getattr(role_config, name) != value:
                raise ValueError(
                    f"{field.name}.{name} is {getattr(role_config, name)!r} but the launcher's "
                    f"{flag_name(name)} is {value!r}"
                )


def role_argv(config, role: str, *, retry=None, **managed) -> list[str]:
    """The command line of a child process of ``config.<role>``.

    Every setting of the role's config that differs from the role's own
    default (the shared ones always; a nested config's fields under their own
    names, ``--blocks 2``), then ``managed`` (only fields the role
    setting declares managed), then the storage retry flags when ``retry``
    is given.  Parsing the result with the role's own CLI rebuilds the role
    config.
    """
    field = _role_field(config, role)
    info = field.metadata
    undeclared = sorted(set(managed) - set(info["managed"]))
    if undeclared:
        raise TypeError(f"{type(config).__name__}.{role}: {undeclared} are not declared managed")
    argv = changed_argv(getattr(config, role), skip=info["managed"], always=info["shared"])
    for name, value in managed.items():
        argv += config_flag_argv(name, value)
    if retry is not None:
        from cloud.storage import retry_flags_argv

        argv += retry_flags_argv(retry)
    return argv


def open_launch(prog: str, launcher: str, config, *, retry, argv: typing.Sequence[str]):
    """A launcher's start: open its root, check (or write) run.json for its
    board size and komi, and record its settings (:func:`record_settings`).

    Returns ``(storage, record path)``.  A root that cannot be opened, a
    run.json from another run or a refused write prints one line naming the
    problem and exits 2.
    """
    from cloud.storage import StorageError, open_storage
    from format.run_config import RunConfig, RunConfigMismatch, ensure_run_config

    try:
        storage = open_storage(config.root, retry=retry)
        ensure_run_config(storage, RunConfig(board_size=config.board_size, komi=config.komi))
        return storage, record_settings(storage, launcher, config, argv=argv, retry=retry)
    except (RunConfigMismatch, StorageError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


LAUNCHER_LEASE_SECONDS = 60.0
"""Lifetime of a launcher's lease on its root (renewed every quarter of it by a thread)."""


def hold_root(prog: str, root: str, retry):
    """This launcher's lease on ``root`` (``layout.LAUNCHER_LEASE``, renewing), or the one line that
    refuses a second launcher there.

    Two launchers on one root played the same seeds into it, shared the state folder's spools
    and trainer stage, and their trainers and workers crash-looped; one launcher per root, as one
    trainer per root.  A lease of a dead process on this host is taken over at once.
    """
    from cloud.storage import StorageError, open_storage
    from format.leases import DAMAGED_EXPIRED, Lease, Takeover, describe_time

    try:
        lease = Lease(
            open_storage(root, retry=retry),
            layout.LAUNCHER_LEASE,
            LAUNCHER_LEASE_SECONDS,
            takeover=Takeover(damaged=DAMAGED_EXPIRED, dead_local_holder=True),
            name="launcher lease",
            lost_note=f"; stopping (another launcher took this root from {prog})",
        )
        holder = lease.try_acquire()
    except (StorageError, ValueError) as exc:
        return f"cannot open {root}: {exc}"
    if holder is not None:
        return (
            f"another launcher ({holder.holder}) drives {root} ({lease.url}); it expires "
            f"{describe_time(holder.expires, time.time())} unless renewed. One operations.loop or "
            "operations.cluster per root: stop that one, or give this one another --root"
        )
    lease.start_renewing()
    return lease


def record_settings(storage, launcher: str, config, *, argv: typing.Sequence[str], retry=None) -> str:
    """Write this invocation's full settings to the lake, once, create-only;
    returns the record's path (``layout.settings_record``).

    The record is every field of ``config`` (role configs included, as each
    child gets them before its managed fields), the command line and the
    storage retry policy; the run id (UTC start time + random hex) is new
    each time, so no record is ever overwritten.
    """
    started = time.gmtime()
    run_id = f"{time.strftime('%Y%m%dT%H%M%SZ', started)}-{secrets.token_hex(4)}"
    record = SettingsRecord(
        launcher=launcher,
        run_id=run_id,
        started=time.strftime("%Y-%m-%dT%H:%M:%SZ", started),
        host=socket.gethostname(),
        argv=tuple(argv),
        settings=dataclasses.asdict(config),
        storage_retry=dataclasses.asdict(retry) if retry is not None else None,
    )
    path = layout.settings_record(launcher, run_id)
    data = record.to_bytes()
    SettingsRecord.from_bytes(data, path)  # what is written must read back
    storage.write_new(path, data)
    return path
