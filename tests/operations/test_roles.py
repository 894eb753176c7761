"""operations.roles: a launcher holds each role's whole config as one field, flags and child command lines included."""

import dataclasses

import pytest

from format import layout
from format.documents import ManifestError
from format.settings_record import parse_settings_record, SettingsRecord
from format.cli import RoleCli, nested_setting, setting, setting_problems
from operations.roles import complete_roles, record_settings, role_argv, role_setting
from tests.format.test_cli import Example


@dataclasses.dataclass(frozen=True)
class Launcher:
    root: str = setting("./lake", "where")
    seed: int = setting(1, "seed")
    role: Example = role_setting(Example, "the example role", shared=("root",), managed=("fast",), visits=16)

    def __post_init__(self):
        complete_roles(self)


def test_role_flags_round_trip_through_the_roles_own_cli(capsys):
    launcher_cli = RoleCli(Launcher, prog="launcher", description="d", storage=False)
    config, _ = launcher_cli.parse(["--root", "r", "--role-limit", "2.5"])
    assert config.role == Example(root="r", visits=16, limit=2.5)       # the launcher's default for visits
    assert launcher_cli.parse(["--role-visits", "3"])[0].role.visits == 3
    with pytest.raises(SystemExit) as exit_info:           # one name per setting: no short alias beside it
        launcher_cli.parse(["--visits", "3"])
    assert exit_info.value.code == 2
    text = launcher_cli.parser().format_help()
    assert "--role-visits VISITS" in text and "--visits VISITS" not in text
    assert "--role-fast" not in text                                    # managed: no flag
    assert "--role-root" not in text and "--ROLE-FIELD" in text
    argv = role_argv(config, "role", fast=True)
    assert argv == ["--root", "r", "--visits", "16", "--limit", "2.5", "--fast"]
    role_cli = RoleCli(Example, prog="example", description="d", storage=False)
    assert role_cli.parse(argv)[0] == dataclasses.replace(config.role, fast=True)
    with pytest.raises(TypeError, match="not declared managed"):
        role_argv(config, "role", visits=3)


def test_a_bad_role_setting_names_the_launchers_flag(capsys):
    cli = RoleCli(Launcher, prog="launcher", description="d", storage=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.parse(["--role-visits", "0"])
    assert exit_info.value.code == 2 and "--role-visits must be >= 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="role.root"):
        Launcher(root="a", role=Example(root="b"))
    with pytest.raises(TypeError, match="required field 'root'"):
        role_setting(Example, "no way to fill in root")


def test_the_settings_record_is_written_once_per_invocation(tmp_path):
    from cloud.storage import RetryPolicy, open_storage

    storage = open_storage(str(tmp_path))
    config = Launcher(root=str(tmp_path))
    first = record_settings(storage, "loop", config, argv=["--seed", "1"], retry=RetryPolicy())
    second = record_settings(storage, "loop", config, argv=[])
    assert first != second and first.startswith(layout.settings_records_prefix("loop"))
    record = SettingsRecord.from_bytes(storage.read(first), first)
    assert record.settings["role"]["visits"] == 16 and record.argv == ("--seed", "1")
    assert record.storage_retry["max_attempts"] == RetryPolicy().max_attempts
    with pytest.raises(ManifestError, match="version"):
        parse_settings_record(b'{"version": 99}', first)




@dataclasses.dataclass(frozen=True)
class Shape:
    width: int = setting(4, "width", at_least=1)
    tall: bool = setting(True, "tall")

    def __post_init__(self):
        for problem in setting_problems(self):
            raise ValueError(problem)


@dataclasses.dataclass(frozen=True)
class Holder:
    root: str = setting("", "where", required=True)
    shape: Shape = nested_setting(Shape, "the shape")


@dataclasses.dataclass(frozen=True)
class HolderLauncher:
    root: str = setting("./lake", "where")
    holder: Holder = role_setting(Holder, "the holder", shared=("root",), width=2)

    def __post_init__(self):
        complete_roles(self)


def test_a_nested_config_is_flags_under_its_own_names(capsys):
    """As TrainConfig.network: a role's nested config is --F on the role, --R-F on its launcher, and
    --F again on the child's command line; its own validation names the launcher's flag."""
    holder_cli = RoleCli(Holder, prog="holder", description="d", storage=False)
    config, _ = holder_cli.parse(["--root", "r", "--width", "3", "--no-tall"])
    assert config == Holder(root="r", shape=Shape(width=3, tall=False))
    launcher_cli = RoleCli(HolderLauncher, prog="launcher", description="d", storage=False)
    assert launcher_cli.parse(["--root", "r"])[0].holder.shape == Shape(width=2)    # the launcher's default
    launcher, _ = launcher_cli.parse(["--root", "r", "--holder-width", "5", "--no-holder-tall"])
    argv = role_argv(launcher, "holder")
    assert argv == ["--root", "r", "--width", "5", "--no-tall"]
    assert holder_cli.parse(argv)[0] == launcher.holder
    with pytest.raises(SystemExit):
        launcher_cli.parse(["--holder-width", "0"])
    assert "--holder-width: must be >= 1, got 0" in capsys.readouterr().err
