"""format.cli: one way from a role's config dataclass to flags, used by every entry point."""

import dataclasses
import re

import pytest

from format.cli import RoleCli, setting, setting_problems


def entry_point_parsers():
    from model.config import CLI as TRAIN
    from operations import cluster
    from pipeline import shuffle
    from operations.loop import CLI as LOOP
    from arena import match
    from selfplay.config import CLI as WORKER
    from arena.gtp import CLI as GTP

    return {"selfplay.worker": WORKER.parser(), "model.train": TRAIN.parser(), "arena.gtp": GTP.parser(),
            "operations.loop": LOOP.parser(), "operations.cluster": cluster.build_parser(),
            "pipeline.shuffle": shuffle.build_parser(), "arena.match": match.build_arg_parser()}


def test_every_entry_point_spells_the_board_size_the_same_way():
    for name, parser in entry_point_parsers().items():
        assert "--board-size" in parser.format_help(), name


def test_roles_that_write_to_a_bucket_take_the_storage_retry_flags():
    parsers = entry_point_parsers()
    for name in ("selfplay.worker", "model.train", "pipeline.shuffle", "operations.loop", "operations.cluster"):
        assert "--storage-max-attempts" in parsers[name].format_help(), name


def test_each_setting_has_one_name(capsys):
    """No alias beside a setting's dashed flag: the shuffle job refuses an underscore spelling of its own
    flags (it would otherwise go on to Beam and be dropped) and still passes Beam's own options on."""
    from pipeline import shuffle

    with pytest.raises(SystemExit) as exit_info:
        shuffle.main(["--root", "r", "--window_exponent", "0.5", "--reuse", "2"])
    assert exit_info.value.code == 2
    assert "--window_exponent: this job's flags are dashed, use --window-exponent" in capsys.readouterr().err
    assert shuffle.misspelled_own_flags(["--shard_positions=4000"]) == [("--shard_positions", "--shard-positions")]
    args, beam_args = shuffle.build_parser().parse_known_args(
        ["--root", "r", "--window-exponent", "0.5", "--temp_location", "gs://b/tmp", "--runner=DataflowRunner"])
    assert args.window_exponent == 0.5 and beam_args == ["--temp_location", "gs://b/tmp", "--runner=DataflowRunner"]
    assert shuffle.misspelled_own_flags(beam_args) == []


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


def role_configs():
    """One valid config of every role, built as a library caller would."""
    from model.config import TrainConfig
    from operations.cluster import ClusterConfig
    from pipeline.config import ShuffleConfig
    from operations.loop.settings import LoopConfig
    from arena.gtp import GtpConfig
    from arena.ladder import LadderConfig
    from arena.match import MatchConfig, PlayerSpec
    from selfplay.config import WorkerConfig

    return [WorkerConfig(root="r"), TrainConfig(root="r"), ShuffleConfig(root="r"), LoopConfig(), ClusterConfig(),
            GtpConfig(), LadderConfig(root="r"),
            MatchConfig(player_a=PlayerSpec.parse("random"), player_b=PlayerSpec.parse("random"))]


SHARED = {"root": "lake root: a local folder or gs://bucket/prefix", "board_size": "board size (N of an N x N board",
          "komi": "komi: points added to White's area score", "max_moves": "move cap per game, passes included",
          "poll_seconds": "seconds between looks at", "events": "append "}


def test_every_role_declares_a_shared_setting_through_its_one_constructor():
    for config in role_configs():
        for field in dataclasses.fields(config):
            if field.name in SHARED and field.init:
                assert field.metadata["help"].startswith(SHARED[field.name]), (type(config).__name__, field.name)
                assert field.name == "events" or field.metadata.get("check"), (type(config).__name__, field.name)


@pytest.mark.parametrize("name, bad, message", [
    ("board_size", 1, "--board-size: 1 is outside 5..19"), ("board_size", 20, "--board-size: 20 is outside"),
    ("komi", 6.3, "--komi: must be a multiple of 0.5 in [-1000, 1000], got 6.3"),
    ("komi", 1e300, "--komi: must be a multiple of 0.5 in [-1000, 1000], got 1e+300"),
    ("komi", float("nan"), "--komi: must be a multiple of 0.5 in [-1000, 1000], got nan"),
    ("max_moves", -1, "--max-moves: must be >= 0"), ("poll_seconds", 0.0, "--poll-seconds: must be > 0"),
    ("root", "", "--root: a storage root is required")])
def test_a_shared_setting_is_refused_by_one_rule_worded_one_way_in_every_role(name, bad, message):
    checked = 0
    for config in role_configs():
        if name not in {f.name for f in dataclasses.fields(config)}:
            continue
        with pytest.raises(ValueError, match=re.escape(message)):
            dataclasses.replace(config, **{name: bad})
        checked += 1
    assert checked >= 2, name                       # shared by several roles, or not worth a constructor


def test_zero_board_size_means_run_json_only_where_the_role_says_so():
    from model.config import TrainConfig
    from selfplay.config import WorkerConfig

    assert TrainConfig(root="r", board_size=0).board_size == 0
    with pytest.raises(ValueError, match="--board-size: 0 is outside"):
        WorkerConfig(root="r", board_size=0)


@dataclasses.dataclass(frozen=True)
class Ranged:
    fraction: float = setting(0.5, "a share", at_least=0.0, at_most=1.0)
    rate: float = setting(0.1, "a rate", above=0, below=1)
    count: int = setting(1, "a count", at_least=1)
    mode: str = setting("a", "a mode", choices=("a", "b"))
    free: int = setting(-5, "no bounds")

    def __post_init__(self):
        for problem in setting_problems(self):
            raise ValueError(problem)


@pytest.mark.parametrize("name, bad, message", [
    ("fraction", 1.5, "--fraction: must be in [0.0, 1.0], got 1.5"),
    ("fraction", -0.1, "--fraction: must be in [0.0, 1.0], got -0.1"),
    ("fraction", float("nan"), "--fraction: must be a finite number in [0.0, 1.0], got nan"),
    ("rate", 0.0, "--rate: must be in (0, 1), got 0.0"), ("rate", 1.0, "--rate: must be in (0, 1), got 1.0"),
    ("count", 0, "--count: must be >= 1, got 0"), ("mode", "c", "--mode: 'c' is not one of a, b")])
def test_declared_ranges_and_choices_are_checked_in_one_wording(name, bad, message):
    Ranged(**{name: {"fraction": 0.0, "rate": 0.5, "count": 7, "mode": "b"}[name]})    # the edges that hold
    with pytest.raises(ValueError, match=re.escape(message)):
        Ranged(**{name: bad})
    assert Ranged(free=-10**9).free == -10**9                                    # undeclared: anything


def test_help_shows_a_declared_range():
    text = " ".join(RoleCli(Ranged, prog="ranged", description="d", storage=False).parser().format_help().split())
    assert "a share (in [0.0, 1.0]) (default: 0.5)" in text and "a count (>= 1)" in text
    assert "a rate (in (0, 1))" in text and "no bounds (default: -5)" in text


def test_every_role_declares_its_numeric_ranges_instead_of_checking_them_by_hand():
    """The roles' validation of plain ranges lives in their fields (one wording, shown in --help):
    a sample of settings from each role is refused through the declared bound."""
    samples = {"TrainConfig": ("learning_rate", 0.0), "WorkerConfig": ("full_search_fraction", 1.5),
               "ShuffleConfig": ("reuse", 17.0), "LoopConfig": ("generations", -1),
               "ClusterConfig": ("workers", 0), "LadderConfig": ("prior_draws", -1.0)}
    seen = set()
    for config in role_configs():
        kind = type(config).__name__
        if kind in samples:
            name, bad = samples[kind]
            field = next(f for f in dataclasses.fields(config) if f.name == name)
            assert field.metadata["bounds"], (kind, name)
            with pytest.raises(ValueError, match=re.escape(f"--{name.replace('_', '-')}: must be")):
                dataclasses.replace(config, **{name: bad})
            seen.add(kind)
    assert seen == set(samples), seen
