"""format.cli: one way from a role's config dataclass to flags, used by every entry point."""
import dataclasses

import pytest

from format.cli import RoleCli, setting


def entry_point_parsers():
    from model.config import CLI as TRAIN
    from pipeline import cluster, shuffle
    from pipeline.loop import CLI as LOOP
    from selfplay import match
    from selfplay.config import CLI as WORKER
    from selfplay.gtp import CLI as GTP

    return {"selfplay.worker": WORKER.parser(), "model.train": TRAIN.parser(), "selfplay.gtp": GTP.parser(),
            "pipeline.loop": LOOP.parser(), "pipeline.cluster": cluster.build_parser(),
            "pipeline.shuffle": shuffle.build_parser(), "selfplay.match": match.build_arg_parser()}


def test_every_entry_point_spells_the_board_size_the_same_way():
    for name, parser in entry_point_parsers().items():
        assert "--board-size" in parser.format_help(), name


def test_roles_that_write_to_a_bucket_take_the_storage_retry_flags():
    parsers = entry_point_parsers()
    for name in ("selfplay.worker", "model.train", "pipeline.shuffle", "pipeline.loop", "pipeline.cluster"):
        assert "--storage-max-attempts" in parsers[name].format_help(), name


def test_old_spellings_stay_accepted():
    from pipeline import shuffle

    args, _ = shuffle.build_parser().parse_known_args(["--root", "r", "--board", "9", "--window_exponent", "0.5",
                                                       "--reuse", "2"])
    assert (args.board_size, args.window_exponent, args.reuse) == (9, 0.5, 2.0)


@dataclasses.dataclass(frozen=True)
class Example:
    root: str = setting("", "where", required=True)
    visits: int = setting(8, "simulations")
    limit: float | None = setting(None, "optional limit")
    fast: bool = setting(False, "go fast")
    hidden_thing: int = setting(3, hidden=True)

    def __post_init__(self):
        if self.visits < 1:
            raise ValueError(f"--visits must be >= 1, got {self.visits}")


def test_flags_follow_the_fields(capsys):
    cli = RoleCli(Example, prog="example", description="d", storage=False)
    config, retry = cli.parse(["--root", "x", "--visits", "4", "--limit", "2.5", "--fast"])
    assert config == Example(root="x", visits=4, limit=2.5, fast=True) and retry is None
    assert cli.parse(["--root", "x", "--no-fast"])[0] == Example(root="x")
    text = cli.parser().format_help()
    assert "simulations (default: 8)" in text and "hidden" not in text
    with pytest.raises(SystemExit) as exit_info:
        cli.parse(["--root", "x", "--visits", "0"])
    assert exit_info.value.code == 2 and "--visits must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse([])                                      # --root is required
    assert "--root" in capsys.readouterr().err
