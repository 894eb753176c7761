"""The pass rule's setting (``--pass-when-winning``) reaches every search it governs.

The rule itself is tested where it lives: the candidate moves and the score
as it stands in tests/engine/test_board.py, the search in tests/engine/test_search.py,
matches in tests/arena/test_match.py, GTP in tests/arena/test_gtp.py and GNU Go's scores
of games played under it in tests/engine/test_rules_against_gnugo.py.  Here: the
worker's search gets it from its config, and the loop hands its worker's
setting to both the self-play worker and its evaluation matches, so a model
is measured under the rule it plays by.
"""
import pytest

from cloud.storage import open_storage
from selfplay.config import CLI as WORKER_CLI
from selfplay.config import WorkerConfig
from selfplay.worker import SelfPlayWorker


@pytest.fixture(autouse=True)
def _state_in_tmp(tmp_path, monkeypatch):
    """A loop keeps its local state (the phases' events) under ./loop-state: here, the test's own folder."""
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("rule", [False, True])
def test_the_worker_searches_with_its_pass_rule(tmp_path, rule):
    config = WorkerConfig(root=str(tmp_path / "lake"), board_size=9, games=2, visits=2, fast_visits=1,
                          spool_dir=str(tmp_path / "spool"), pass_when_winning=rule)
    worker = SelfPlayWorker(config, open_storage(config.root))
    try:
        assert worker.batch.pass_when_winning == rule and worker.batch.sensible_moves
    finally:
        worker.spool.close()
    assert WORKER_CLI.parse(["--root", config.root] + (["--pass-when-winning"] if rule else []))[0] \
        .pass_when_winning == rule
    assert not WorkerConfig.__dataclass_fields__["pass_when_winning"].default      # off until its A/B


@pytest.mark.parametrize("rule", [False, True])
def test_the_loop_passes_its_workers_pass_rule_to_self_play_and_its_matches(tmp_path, monkeypatch, rule):
    from operations import loop as L

    argv = ["--root", str(tmp_path / "lake")] + (["--worker-pass-when-winning"] if rule else [])
    config, retry = L.CLI.parse(argv)
    loop = L.Loop(config, open_storage(config.root), retry)
    commands = []
    monkeypatch.setattr(loop, "run_child", lambda phase, argv, *rest, **named: commands.append(argv) or [])
    loop.selfplay(0, loop.selfplay_seconds(0))
    with pytest.raises(L.PhaseFailed):            # the stand-in child reports no result
        loop.evaluate("model:x@1", "random", 2, seed=1)
    worker, match = commands
    assert worker[0] == "selfplay.worker" and match[0] == "arena.match"
    assert ("--pass-when-winning" in worker) == rule and ("--pass-when-winning" in match) == rule
