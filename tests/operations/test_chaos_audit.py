"""The chaos checker fails when it should: each zero-loss key, on a lake doctored to break it.

``operations.chaos_audit.audit_run`` is what bench/cluster.py's acceptance reads
(games_lost, games_in_spool_only, games_duplicated, chunk_verify_failures,
latest_regressions, games_identical_moves).  A checker that was only ever
seen reporting zeros proves nothing, so here one small real lake (worker
games through the worker's own ``main``, with its events file) is checked
clean, and then damaged one way at a time: a chunk lost, a chunk copied
under another name, a chunk of garbage, LATEST moved back, a game whose
chunk is gone but whose spool entry is still on disk.  Each must show up in
its key, and only there.
"""
from __future__ import annotations

import shutil

import pytest

from cloud.storage import open_storage
from format import layout
from operations.chaos_audit import ZERO_LOSS_KEYS, audit_run
from operations.cluster import Observer, Role, RoleSpec
from selfplay.spool import Spool

KEYS = (*ZERO_LOSS_KEYS, "games_in_spool_only", "games_identical_moves")


@pytest.fixture(scope="module")
def played(tmp_path_factory) -> str:
    """A lake of six generation-0 games in two chunks, and the worker's events file."""
    from selfplay import worker

    base = tmp_path_factory.mktemp("chaos")
    root, spool, events = str(base / "lake"), str(base / "spool"), str(base / "worker.events")
    assert worker.main(["--root", root, "--board-size", "9", "--games", "3", "--visits", "4", "--fast-visits", "2",
                        "--max-games", "6", "--chunk-games", "3", "--seed", "7", "--spool-dir", spool,
                        "--events", events, "--generation0-playouts", "0"]) == 0
    return str(base)


@pytest.fixture
def lake(played, tmp_path):
    """A fresh copy of the played lake: (storage, spool folder, role list)."""
    shutil.copytree(played, tmp_path / "copy")
    base = tmp_path / "copy"
    spec = RoleSpec(name="worker-0", kind="worker", argv=[], events_path=str(base / "worker.events"),
                    log_path=str(base / "worker.log"), spool_dir=str(base / "spool"))
    return open_storage(str(base / "lake")), str(base / "spool"), [Role(spec)]


def check(storage, roles, observer=None) -> dict:
    if observer is None:
        observer = Observer(storage, roles)
        observer.poll_events()
        observer.sample_latest()
    return audit_run(storage, observer, roles, wall_seconds=10.0, stopped_wall=0.0, kills_by_kind={})


def chunks(storage) -> list[str]:
    return sorted(i.path for i in storage.list(layout.games_prefix()) if layout.parse_chunk_path(i.path))


def only(report: dict, **expected) -> None:
    """``report`` has exactly the nonzero keys of ``expected`` among KEYS, with those values."""
    assert {key: report[key] for key in KEYS} == {key: expected.get(key, 0) for key in KEYS}, report


def test_the_clean_lake_passes(lake):
    storage, _, roles = lake
    report = check(storage, roles)
    assert report["games_finished"] == report["games_in_lake"] == 6 and len(chunks(storage)) == 2
    only(report)


def test_a_lost_chunk_shows_as_lost_games(lake):
    storage, _, roles = lake
    storage.delete(chunks(storage)[0])
    only(check(storage, roles), games_lost=3)


def test_a_game_still_in_a_spool_is_not_lost_but_counted(lake):
    storage, spool, roles = lake
    observer = Observer(storage, roles)
    observer.poll_events()
    event = next(e for e in observer.events["worker-0"] if e["event"] == "game_finished")
    # Its spool entry is still there, where the worker's spool keeps it (it used to be looked for at
    # SPOOL/<entry>, not SPOOL/games/<entry>, and such games were counted lost)...
    spooled = Spool(spool)
    try:
        assert spooled.add(event["generation"], event["game_id"], b"the game's record") == event["spool_entry"]
    finally:
        spooled.close()
    game_id = event["game_id"]
    holder = next(p for p in chunks(storage) if game_id.encode() in _raw(storage, p))
    storage.delete(holder)                     # ...and its chunk is not in the lake
    report = check(storage, roles, observer)
    assert report["games_in_spool_only"] == 1 and report["games_lost"] == 2


def test_a_copied_chunk_shows_as_duplicated_and_identical_games(lake):
    storage, _, roles = lake
    first = chunks(storage)[0]
    name = layout.parse_chunk_path(first)
    storage.write_new(layout.chunk_path(0, "copier", name.time_ms + 1, 0), storage.read(first))
    only(check(storage, roles), games_duplicated=3, games_identical_moves=0)


def test_a_garbage_chunk_shows_as_a_verify_failure(lake):
    storage, _, roles = lake
    storage.write_new(layout.chunk_path(0, "garbage", 1_700_000_000_000, 0), b"\x28\xb5\x2f\xfd not zstd")
    report = check(storage, roles)
    only(report, chunk_verify_failures=1)
    assert "garbage" in next(iter(report["bad_chunks"]))


def test_latest_moving_back_shows_as_a_regression(lake):
    storage, _, roles = lake
    observer = Observer(storage, roles)
    observer.poll_events()
    storage.write_replace(layout.LATEST, b"2\n")
    observer.sample_latest()
    storage.write_replace(layout.LATEST, b"1\n")
    observer.sample_latest()
    only(check(storage, roles, observer), latest_regressions=1)


def _raw(storage, path: str) -> bytes:
    from format.tfrecord import decompress_for
    return decompress_for(path, storage.read(path))


def test_the_same_moves_under_new_ids_show_as_identical_games(lake):
    import dataclasses

    from format import codec

    storage, _, roles = lake
    first = chunks(storage)[0]
    games = codec.read_chunk(storage.read(first), first)
    renamed = [dataclasses.replace(g, game_id=g.game_id + "x") for g in games]
    storage.write_new(layout.chunk_path(0, "replayer", 1_700_000_000_000, 0), codec.encode_chunk(renamed))
    report = check(storage, roles)
    only(report, games_identical_moves=3)
    assert report["games_in_lake"] == 9
