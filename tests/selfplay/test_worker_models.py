"""A worker refuses a published model that does not fit the run or whose outputs are not finite.

Before, a model whose manifest named another board size loaded ("model
generation N loaded") and then killed the worker with a ValueError raised
in the inference thread (`inference.model_files.LoadedModel` refusing the run's
planes); under a restart policy every worker crash-looped.  A diverged
model (NaN weights) loaded too, and every game then played moves 0, 1, 2,
... into the lake.  Now the watcher checks the manifest against run.json,
the registry checks the SavedModel's shapes against its manifest, and the
watcher evaluates a few real positions before any game moves to a model: a
misfit is one ``rejected`` line and a ``model_rejected`` event, and play
goes on with the model it has (or waits, before the first).  In play every
batch is checked as well, so a model that turns non-finite on a position
the probe did not cover is refused there (`test_a_model_that_turns_*`).

The lakes are real: models are published with `format.registry.publish_model`
(tiny networks, seconds to build) and the worker runs through `main`.
"""
from __future__ import annotations

import os
import signal
import tempfile
import threading
import time

import numpy as np
import pytest

from cloud.storage import open_storage
from format import layout
from format import registry
from format.codec import read_chunk
from format.events import EventLog, read_events
from format.run_config import RunConfig, ensure_run_config
from testdata.models import TINY_NETWORK, publish_untrained_model

FAST = ["--games", "2", "--visits", "4", "--fast-visits", "2", "--leaves-per-game", "2", "--chunk-games", "1",
        "--poll-seconds", "0.2", "--progress-seconds", "60", "--seed", "1"]


def new_lake(tmp_path) -> str:
    root = str(tmp_path / "lake")
    ensure_run_config(open_storage(root), RunConfig(board_size=9))
    return root


def publish_nan_model(root: str, generation: int, board_size: int = 9) -> None:
    """A network of the run's shape whose weights are NaN (a diverged one), published as the trainer would."""
    from model.export import export_inference_model
    from model.config import NetworkConfig
    from model.network import build_network

    config = NetworkConfig(board_size=board_size, **TINY_NETWORK)
    weights = [np.full_like(value, np.nan) if np.issubdtype(value.dtype, np.floating) else value
               for value in (w.numpy() for w in build_network(config).weights)]
    with tempfile.TemporaryDirectory() as scratch:
        export_inference_model(config, weights, os.path.join(scratch, "model"))
        registry.publish_model(open_storage(root), generation, os.path.join(scratch, "model"),
                               {"board_size": board_size, "generation": generation})


def set_latest(root: str, generation: int) -> None:
    """LATEST as it was before a later publish (models are published up front, revealed one by one)."""
    open_storage(root).write_replace(layout.LATEST, f"{generation}\n".encode())


def lake_games(root: str) -> dict[str, list]:
    storage = open_storage(root)
    return {info.path: read_chunk(storage.read(info.path), info.path)
            for info in storage.list(layout.GAMES_DIR + "/")}


def watcher_for(root: str, tmp_path):
    from selfplay.worker import ModelWatcher

    return ModelWatcher(open_storage(root), 0.1, str(tmp_path / "cache"), current_generation=None, board_size=9)


def test_the_watcher_checks_a_model_against_the_run_and_probes_it(tmp_path):
    from selfplay.worker import ModelMisfit

    root = new_lake(tmp_path)
    publish_untrained_model(root, 1, 7)                                   # a 7x7 model in a 9x9 run
    with pytest.raises(ModelMisfit, match=r"000001/MANIFEST.json: field 'board_size' is 7, but this run plays 9x9"):
        watcher_for(root, tmp_path).poll_once()
    assert not (tmp_path / "cache" / "000001").exists(), "refused from its manifest, before fetching its files"
    publish_untrained_model(root, 2, 7, metadata={"board_size": 9})      # a 7x7 network whose manifest says 9
    with pytest.raises(registry.ModelIntegrityError) as info:
        watcher_for(root, tmp_path).poll_once()
    message = str(info.value)
    assert ("000002/MANIFEST.json: field 'metadata.board_size' is 9, but the SavedModel's 'planes' is "
            "[B, 7, 7, 17], not [B, 9, 9, 17]") in message and len(message) < 300, message
    publish_nan_model(root, 3)
    with pytest.raises(ModelMisfit, match="generation 3 answers 6 probe positions with outputs that are not finite"):
        watcher_for(root, tmp_path).poll_once()
    publish_untrained_model(root, 4, 9, seed=4)
    assert watcher_for(root, tmp_path).poll_once().generation == 4


def run_worker(root, tmp_path, flags, script):
    """`selfplay.worker.main` on ``root``; ``script(events_path)`` runs beside it in a thread,
    moving LATEST as the worker's events show it reached each step, and returns when done.
    Then the worker gets the SIGTERM a deployment sends.  Returns (exit code, events)."""
    from selfplay import worker

    events = str(tmp_path / "worker.jsonl")
    failures = []
    returned = threading.Event()
    lock = threading.Lock()   # no SIGTERM once main has returned (and its handler is gone)

    def drive():
        try:
            script(events, returned)
        except Exception as exc:  # noqa: BLE001 - reported by the test, after the worker stops
            failures.append(exc)
        with lock:
            if not returned.is_set():
                os.kill(os.getpid(), signal.SIGTERM)   # main's handler turns it into a clean stop

    previous = signal.getsignal(signal.SIGTERM)
    driver = threading.Thread(target=drive, daemon=True)
    try:
        driver.start()
        code = worker.main(["--root", root, *FAST, "--max-seconds", "90", "--spool-dir", str(tmp_path / "spool"),
                            "--events", events, *flags])
    finally:
        with lock:
            returned.set()
        driver.join(30)
        signal.signal(signal.SIGTERM, previous)
    assert not failures, failures[0]
    return code, read_events(events)


def wait_for_event(events_path, returned, predicate, what, after=0, timeout=30.0) -> int:
    """Index of the first event past ``after`` for which ``predicate`` holds (waits for it,
    unless the worker has returned)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not returned.is_set():
        found = read_events(events_path)
        for index in range(after, len(found)):
            if predicate(found[index]):
                return index
        time.sleep(0.05)
    raise AssertionError(f"{'the worker returned before' if returned.is_set() else 'timed out waiting for'} {what}")


def finished(generation):
    return lambda e: e["event"] == "game_finished" and e["generation"] == generation


def rejected(generation):
    return lambda e: e["event"] == "model_rejected" and e["generation"] == generation


def test_a_worker_keeps_playing_its_model_when_a_misfit_or_a_diverged_one_is_published(tmp_path, capsys):
    root = new_lake(tmp_path)
    publish_untrained_model(root, 1, 9, seed=1)
    publish_untrained_model(root, 2, 7, seed=2)     # trained for another board than run.json's
    publish_nan_model(root, 3)                     # diverged
    set_latest(root, 1)

    def script(events, returned):
        step = wait_for_event(events, returned, finished(1), "a game of generation 1")
        registry.advance_latest(open_storage(root), 2)
        step = wait_for_event(events, returned, rejected(2), "generation 2 rejected", step)
        step = wait_for_event(events, returned, finished(1), "a generation-1 game after it", step)
        registry.advance_latest(open_storage(root), 3)
        step = wait_for_event(events, returned, rejected(3), "generation 3 rejected", step)
        wait_for_event(events, returned, finished(1), "a generation-1 game after it", step)

    code, events = run_worker(root, tmp_path, [], script)
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "rejected model generation" in line]
    assert any("000002/MANIFEST.json: field 'board_size' is 7, but this run plays 9x9" in line
               and "keeping generation 1" in line for line in lines), err
    assert any("generation 3" in line and "not finite" in line and "keeping generation 1" in line
               for line in lines), err
    assert all(len(line) < 600 for line in lines)
    assert {e["generation"] for e in events if e["event"] == "model_rejected"} == {2, 3}
    assert not [e for e in events if e["event"] == "model_loaded" and e["generation"] in (2, 3)]
    games = lake_games(root)
    assert games and all(path.startswith(layout.games_prefix(1)) for path in games), sorted(games)
    assert all(g.generation == 1 for chunk in games.values() for g in chunk)


def test_a_worker_whose_first_model_is_diverged_waits_for_a_good_one_and_never_plays_it(tmp_path, capsys):
    root = new_lake(tmp_path)
    publish_untrained_model(root, 1, 9, seed=1)
    publish_untrained_model(root, 3, 9, seed=3)
    publish_nan_model(root, 2)
    set_latest(root, 2)                            # the worker starts while LATEST names the diverged one

    def script(events, returned):
        step = wait_for_event(events, returned, rejected(2), "generation 2 rejected")
        step = wait_for_event(events, returned, rejected(2), "generation 2 rejected again, after a backoff", step + 1)
        registry.advance_latest(open_storage(root), 3)
        wait_for_event(events, returned, finished(3), "a game of generation 3", step)

    code, events = run_worker(root, tmp_path, [], script)
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    assert "rejected model generation 2" in err and "not finite" in err and "not playing until a model loads" in err
    assert [e["generation"] for e in events if e["event"] == "started"] == [3]
    games = lake_games(root)
    # No game of the diverged model, and none of generation 0 in a lake that has models.
    assert games and all(path.startswith(layout.games_prefix(3)) for path in games), sorted(games)


class FlakyEvaluator:
    """Finite outputs for the first ``good_calls`` batches, then NaN: a model that diverges on
    positions its probe did not cover (a real one is hard to make; the play loop is what is tested)."""

    def __init__(self, generation: int, good_calls: int):
        self.generation, self.good_calls, self.calls = generation, good_calls, 0

    def __call__(self, planes):
        self.calls += 1
        logits = np.zeros((len(planes), planes.shape[1] ** 2 + 1), np.float32)
        values = np.tanh(planes[..., 0].sum(axis=(1, 2)) - planes[..., 8].sum(axis=(1, 2))).astype(np.float32)
        if self.calls > self.good_calls:
            logits[:] = np.nan
            values[:] = np.nan
        return logits, values


class QueuedWatcher:
    """Stands in for `ModelWatcher` in the play loop: hands over each queued evaluator once its
    condition on the worker holds."""

    def __init__(self, *queued):
        self.queued = list(queued)
        self.worker = None

    def take(self):
        if self.queued and self.queued[0][0](self.worker):
            return self.queued.pop(0)[1]
        return None


def play_in_process(tmp_path, first, watcher, max_games):
    from selfplay.config import WorkerConfig
    from selfplay.worker import SelfPlayWorker

    root = new_lake(tmp_path)
    config = WorkerConfig(root=root, board_size=9, games=4, visits=4, fast_visits=2, leaves_per_game=2,
                          chunk_games=1, max_games=max_games, max_seconds=60, progress_seconds=60.0, seed=5,
                          spool_dir=str(tmp_path / "spool"))
    events = EventLog(str(tmp_path / "worker.jsonl"), "worker")
    worker = SelfPlayWorker(config, open_storage(root), first, events=events)
    watcher.worker = worker
    worker.run(watcher)
    events.close()
    return worker, read_events(str(tmp_path / "worker.jsonl")), lake_games(root)


def test_a_model_that_turns_non_finite_in_play_is_refused_and_play_falls_back(tmp_path, capsys):
    good, flaky = FlakyEvaluator(4, good_calls=10 ** 9), FlakyEvaluator(5, good_calls=3)
    worker, events, games = play_in_process(tmp_path, good, QueuedWatcher((lambda w: True, flaky)), max_games=4)
    err = capsys.readouterr().err
    refusals = [e for e in events if e["event"] == "model_rejected"]
    assert [(e["generation"], e["in_play"]) for e in refusals] == [(5, True)], err
    assert "not finite" in refusals[0]["error"]
    assert ("rejected model generation 5: a batch of positions in play got outputs that are not finite" in err
            and "back to generation 4" in err), err
    # Asked no more after the refusal: the NaN batch, and at most the other group's one already sent.
    assert flaky.calls <= 5
    played = [g for chunk in games.values() for g in chunk]
    assert len(played) == worker.counters.games >= 4 and worker.final_upload_ok
    # No game of the refused model: the games in progress were dropped, every later one is generation 4's.
    assert all(g.generation == 4 and np.isfinite(g.root_values).all() for g in played)


def test_a_first_model_that_turns_non_finite_in_play_pauses_play_until_a_newer_one(tmp_path, capsys):
    first, newer = FlakyEvaluator(4, good_calls=3), FlakyEvaluator(6, good_calls=10 ** 9)
    watcher = QueuedWatcher((lambda w: w.evaluator is None, newer))   # offered only once play has paused
    worker, events, games = play_in_process(tmp_path, first, watcher, max_games=4)
    err = capsys.readouterr().err
    assert [e["generation"] for e in events if e["event"] == "model_rejected"] == [4], err
    assert "rejected model generation 4" in err and "play paused until a newer model loads" in err, err
    played = [g for chunk in games.values() for g in chunk]
    assert len(played) >= 4 and all(g.generation == 6 for g in played)


@pytest.mark.parametrize("role", ["arena.match", "arena.gtp"])
def test_a_match_or_the_gtp_engine_refuses_a_diverged_model_in_one_line(role, tmp_path, capsys):
    # The worker is not the only player of models: a match (and the loop's evaluations, the ladder) or a
    # GTP controller given a diverged model would otherwise play moves 0, 1, 2, ... and report them.
    import importlib

    root = new_lake(tmp_path)
    publish_nan_model(root, 1)
    argv = ([f"model:{root}", "random", "--games", "2", "--visits", "2"] if role == "arena.match"
            else ["--root", root])
    assert importlib.import_module(role).main(argv) == 2
    err = capsys.readouterr().err
    assert "generation 1 answers 6 probe positions with outputs that are not finite" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
