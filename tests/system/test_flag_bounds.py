"""Every numeric flag of every role is bounded: absurd values get one usage line naming the flag.

A value such as ``--komi 1e300`` used to pass: it was written to run.json
(create-only) as float32 inf, and every later chunk of the lake verified
bad.  Here each entry point's parser is read for its numeric flags (the
launchers' ``--worker-*``, ``--train-*`` and ``--shuffle-*`` included), and
each flag is given 1e300, -1e300, NaN, 2**63 and 1.7e308.  Parsing must exit with
status 2 and an ``error:`` line that names the flag (argparse's own
"invalid int value" for an int flag given a float counts: it names the flag
too); nothing is run, so the whole sweep takes a few seconds.
"""
from __future__ import annotations

import argparse
import contextlib
import io

import pytest

ABSURD = ("1e300", "-1e300", "nan", str(2 ** 63), "1.7e308")   # 1.7e308: doubling it overflows to inf


def _role_cli(module: str, *required: str):
    def parse(argv):
        import importlib
        cli = importlib.import_module(module).CLI
        return cli.parse([*required, *argv])

    def parser():
        import importlib
        return importlib.import_module(module).CLI.parser()
    return parser, parse


def _shuffle():
    from pipeline import shuffle
    from pipeline.config import from_args

    def parse(argv):
        parser = shuffle.build_parser()
        args, _ = parser.parse_known_args(["--root", "/tmp/unused", *argv])
        return from_args(args, parser)
    return shuffle.build_parser, parse


def _deploy():
    from operations.deploy import __main__ as deploy
    from operations.deploy.config import DeployConfig
    from format.cli import config_from_namespace
    required = ["plan", "--project", "p", "--root", "gs://bucket/run"]

    def parser():
        plan = [action for action in deploy.build_parser()._actions if isinstance(action, argparse._SubParsersAction)]
        return plan[0].choices["plan"]

    def parse(argv):
        full = deploy.build_parser()
        args = full.parse_args([*required, *argv])
        return config_from_namespace(DeployConfig, args, full)
    return parser, parse


def _subcommand(build_parser, command: str, *required: str):
    """(the subcommand's parser, parse) for a tool whose numeric flags belong to one subcommand."""
    def parser():
        [sub] = [action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)]
        return sub.choices[command]

    def parse(argv):
        return build_parser().parse_args([command, *required, *argv])
    return parser, parse


def _deploy_subcommand(command: str, *required: str):
    """deploy down / status, parsed and then checked as their main() checks them (down: the deployment's
    config; status: the storage retry flags)."""
    from operations.deploy import __main__ as deploy
    from operations.deploy.config import DeployConfig
    from format.cli import config_from_namespace, storage_retry
    parser, _ = _subcommand(deploy.build_parser, command, *required)

    def parse(argv):
        full = deploy.build_parser()
        args = full.parse_args([command, *required, *argv])
        return config_from_namespace(DeployConfig, args, full) if command == "down" else storage_retry(args, full)
    return parser, parse


def _inspect(command: str, *required: str):
    from format import inspect
    return _subcommand(inspect.build_parser, command, *required)


def _demo():
    from testdata import demo
    return demo.build_parser, lambda argv: demo.build_parser().parse_args(argv)


ROLES = {
    "worker": lambda: _role_cli("selfplay.config", "--root", "/tmp/unused"),
    "train": lambda: _role_cli("model.config", "--root", "/tmp/unused"),
    "shuffle": _shuffle,
    "loop": lambda: _role_cli("operations.loop"),
    "cluster": lambda: _role_cli("operations.cluster", "--root", "/tmp/unused"),
    "match": lambda: _role_cli("arena.match", "random", "uniform"),
    "gtp": lambda: _role_cli("arena.gtp"),
    "ladder": lambda: _role_cli("arena.ladder", "--root", "/tmp/unused"),
    "run-page": lambda: _role_cli("arena.run_page", "--root", "/tmp/unused", "--out", "/tmp/unused.html"),
    "deploy": _deploy,
    "deploy-down": lambda: _deploy_subcommand("down", "--project", "p", "--root", "gs://bucket/run"),
    "deploy-status": lambda: _deploy_subcommand("status", "--root", "/tmp/unused"),
    "inspect-game": lambda: _inspect("game", "x.chunk", "--sgf", "/tmp/unused.sgf"),
    "inspect-position": lambda: _inspect("position", "x.chunk", "--move", "0"),
    "demo": _demo,
}


def numeric_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The first long spelling of every option whose value is an int or a float."""
    flags = []
    for action in parser._actions:
        kind = getattr(action.type, "number_kind", action.type)     # format.cli.bounded_number's, or plain
        if kind in (int, float) and action.option_strings and action.help != argparse.SUPPRESS:
            flags.append(next(s for s in action.option_strings if s.startswith("--")))
    return flags


def names_for(parser: argparse.ArgumentParser, flag: str) -> set[str]:
    action = next(a for a in parser._actions if flag in a.option_strings)
    return {s for s in action.option_strings if s.startswith("--")}


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_numeric_flag_refuses_absurd_values_in_one_line(role):
    make_parser, parse = ROLES[role]()
    parser = make_parser()
    flags = numeric_flags(parser)
    assert flags, f"{role}: no numeric flags found"
    failures = []
    for flag in flags:
        names = names_for(parser, flag)
        for value in ABSURD:
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    parse([flag, value])
                    outcome = "accepted"
                except SystemExit as exc:
                    outcome = exc.code
                except Exception as exc:  # noqa: BLE001 - a traceback is the failure reported
                    outcome = f"{type(exc).__name__}: {exc}"
            lines = [line for line in err.getvalue().splitlines() if "error:" in line]
            if outcome != 2 or len(lines) != 1 or not any(name in lines[0] for name in names):
                failures.append(f"{flag} {value}: {outcome!r} {lines}")
    assert not failures, f"{role}: {len(failures)} of {len(flags) * len(ABSURD)} cases:\n" + "\n".join(failures)


def test_komi_has_one_bound_in_every_role_and_in_run_json():
    from format import schema
    from format.run_config import RunConfig

    with pytest.raises(ValueError, match="komi"):
        RunConfig(board_size=9, komi=1e300)
    with pytest.raises(ValueError, match="komi"):
        RunConfig(board_size=9, komi=schema.MAX_KOMI + 0.5)
    assert RunConfig(board_size=9, komi=-schema.MAX_KOMI).komi == -schema.MAX_KOMI
    for role in ("worker", "match", "gtp", "loop"):
        _, parse = ROLES[role]()
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
            parse(["--komi", str(schema.MAX_KOMI + 0.5)])
        assert exit_.value.code == 2 and f"in [-{schema.MAX_KOMI:g}, {schema.MAX_KOMI:g}]" in err.getvalue(), role
