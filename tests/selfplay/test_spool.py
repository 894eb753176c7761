"""The worker's spool (`selfplay.spool`): no finished game is lost, none is written twice.

Subprocess tests run ``python -m selfplay.worker`` as a machine would and
SIGKILL it; the spool-level tests simulate a kill between two steps of an
upload by building that state by hand (a batch file whose chunk is already
stored, an entry with a flipped byte).  9x9 games with a handful of visits.
"""
import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cloud.local import LocalStorage
from cloud.storage import open_storage
from format import layout
from format import schema
from format.codec import read_chunk
from format.events import read_events
from selfplay.config import WorkerConfig, default_spool_base
from format.codec import chunk_records, frame_chunk
from selfplay.spool import Spool, SpoolLocked, SpoolOfOtherLake
from selfplay.worker import main, open_worker_spool
from tests.selfplay.test_worker import wait_for

REPO = Path(__file__).resolve().parents[2]
FAST_FLAGS = ["--board-size", "9", "--games", "4", "--visits", "2", "--fast-visits", "2",
              "--full-search-fraction", "0.5", "--progress-seconds", "0.5", "--poll-seconds", "0.5",
              "--leaves-per-game", "2"]


def run_worker(root, *flags, state=None, wait=True, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    if state is not None:
        env["XDG_STATE_HOME"] = str(state)
    proc = subprocess.Popen([sys.executable, "-m", "selfplay.worker", "--root", str(root), *FAST_FLAGS, *flags],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def lake_games(root):
    """{chunk path: [GameRecord]} of every chunk in the lake."""
    storage = open_storage(str(root))
    return {info.path: read_chunk(storage.read(info.path), info.path)
            for info in storage.list(layout.games_prefix())}


def finished_ids(events_path):
    return [e["game_id"] for e in read_events(str(events_path)) if e["event"] == "game_finished"]


# ---- kills ------------------------------------------------------------------

def test_a_game_finished_before_a_sigkill_is_uploaded_by_the_restarted_worker(tmp_path):
    lake, spool, first_events = tmp_path / "lake", tmp_path / "spool", tmp_path / "first.jsonl"
    # Chunks that never fill or time out: every finished game is only in the spool.
    proc = run_worker(lake, "--seed", "5", "--chunk-games", "100000", "--chunk-seconds", "100000",
                      "--spool-dir", str(spool), "--events", str(first_events), wait=False)
    try:
        wait_for(lambda: len(finished_ids(first_events)) >= 3, 90, "three game_finished events")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    killed = finished_ids(first_events)
    assert lake_games(lake) == {}
    # Same spool, same --seed: the leftovers go up first, and the new games are new.
    code, out, err = run_worker(lake, "--seed", "5", "--max-games", "2", "--chunk-games", "2",
                                "--spool-dir", str(spool), "--events", str(tmp_path / "second.jsonl"))
    assert code == 0, out + err
    chunks = lake_games(lake)
    stored = [g.game_id for games in chunks.values() for g in games]
    for game_id in killed:
        assert stored.count(game_id) == 1, game_id
    assert len(stored) == len(set(stored))
    moves = [g.moves.tobytes() for games in chunks.values() for g in games]
    assert len(moves) == len(set(moves)), "a restarted worker replayed a game"
    assert not os.listdir(spool / "games") and not os.listdir(spool / "batches")
    uploaded = [e for e in read_events(str(tmp_path / "second.jsonl")) if e["event"] == "chunk_uploaded"]
    assert {e["path"] for e in uploaded} == set(chunks)


def spool_with_batch(tmp_path, payloads):
    spool = Spool(str(tmp_path / "spool"))
    for i, payload in enumerate(payloads):
        spool.add(0, f"w.{i}", payload)
    return spool, spool.make_batch(0, "w_host_1_ab", chunk_games=100)


def test_a_batch_whose_chunk_was_stored_before_the_kill_counts_as_done(tmp_path):
    storage = LocalStorage(str(tmp_path / "lake"))
    payloads = [b"game one", b"game two", b"game three"]
    spool, batch = spool_with_batch(tmp_path, payloads)
    storage.write_new(batch.chunk, frame_chunk(payloads))   # the upload went through, then SIGKILL
    spool.close()
    spool = Spool(str(tmp_path / "spool"))                 # the restart
    assert [b.chunk for b in spool.batches] == [batch.chunk] and not any(spool.loose.values())
    assert spool.upload(storage, spool.batches[0], "w_host_2_cd") == ("present", 3)
    assert [info.path for info in storage.list(layout.games_prefix())] == [batch.chunk]
    assert spool.spooled == 0 and not os.listdir(spool.games_dir) and not os.listdir(spool.batches_dir)


def test_a_kill_while_deleting_the_uploaded_entries_neither_loses_nor_repeats(tmp_path):
    storage = LocalStorage(str(tmp_path / "lake"))
    payloads = [b"game one", b"game two"]
    spool, batch = spool_with_batch(tmp_path, payloads)
    storage.write_new(batch.chunk, frame_chunk(payloads))
    os.unlink(os.path.join(spool.games_dir, batch.entries[0]))   # killed after deleting one entry
    spool.close()
    spool = Spool(str(tmp_path / "spool"))
    assert spool.upload(storage, spool.batches[0], "w2") == ("present", 2)
    assert len(storage.list(layout.games_prefix())) == 1 and spool.spooled == 0


def test_a_different_object_under_the_chunk_name_keeps_the_games(tmp_path, caplog):
    storage = LocalStorage(str(tmp_path / "lake"))
    payloads = [b"game one", b"game two"]
    spool, batch = spool_with_batch(tmp_path, payloads)
    storage.write_new(batch.chunk, frame_chunk([b"someone else's game"]))
    assert spool.upload(storage, batch, "w_host_2_cd") == ("rebatched", 0)
    assert "COLLISION" in caplog.text and batch.chunk in caplog.text
    assert spool.spooled == 2 and len(spool.batches) == 1 and spool.batches[0].chunk != batch.chunk
    assert spool.upload(storage, spool.batches[0], "w_host_2_cd") == ("uploaded", 2)
    assert storage.read(batch.chunk) == frame_chunk([b"someone else's game"])
    assert list(chunk_records(storage.read(spool_chunk := storage.list(layout.games_prefix())[1].path),
                              spool_chunk)) == payloads


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupt_spool_entry_costs_only_itself(tmp_path, damage):
    storage = LocalStorage(str(tmp_path / "lake"))
    spool = Spool(str(tmp_path / "spool"))
    names = [spool.add(0, f"w.{i}", b"game %d" % i) for i in range(3)]
    spool.close()
    victim = os.path.join(tmp_path / "spool" / "games", names[1])
    data = bytearray(open(victim, "rb").read())
    if damage == "flip":
        data[-1] ^= 0xFF
    else:
        del data[-3:]
    open(victim, "wb").write(bytes(data))
    spool = Spool(str(tmp_path / "spool"))
    batch = spool.make_batch(0, "w2", chunk_games=10)
    assert spool.upload(storage, batch, "w2") == ("rebatched", 0)   # rebuilt without the bad entry
    assert spool.upload(storage, spool.batches[0], "w2") == ("uploaded", 2)
    [info] = storage.list(layout.games_prefix())
    assert list(chunk_records(storage.read(info.path), info.path)) == [b"game 0", b"game 2"]
    assert len(os.listdir(spool.corrupt_dir)) == 1
    assert any(names[1] in message for message in spool.corrupt)


def test_a_corrupt_entry_does_not_stop_the_worker(tmp_path):
    lake, spool_dir = tmp_path / "lake", tmp_path / "spool"
    spool = Spool(str(spool_dir))
    spool.add(0, "old.1", b"\x00" * 10)   # not a game record, but the checksum holds: a bad entry
    spool.close()
    name = os.listdir(spool_dir / "games")[0]
    path = spool_dir / "games" / name
    path.write_bytes(path.read_bytes()[:-1] + b"\x01")
    code, out, err = run_worker(lake, "--max-games", "2", "--chunk-games", "2", "--spool-dir", str(spool_dir))
    assert code == 0, out + err
    assert "corrupt" in err and name in err and "Traceback" not in err
    assert sum(len(g) for g in lake_games(lake).values()) >= 2


# ---- one process per spool, unique names ------------------------------------

def test_a_second_process_on_the_same_spool_is_refused(tmp_path):
    held = Spool(str(tmp_path / "spool"))
    try:
        with pytest.raises(SpoolLocked, match=str(os.getpid())):
            Spool(str(tmp_path / "spool"))
        code, out, err = run_worker(tmp_path / "lake", "--max-games", "1", "--spool-dir", str(tmp_path / "spool"))
    finally:
        held.close()
    assert code == 2, out + err
    [line] = err.strip().splitlines()
    assert str(tmp_path / "spool") in line and f"pid {os.getpid()}" in line
    assert lake_games(tmp_path / "lake") == {}


def test_two_workers_given_the_same_worker_id_write_distinct_chunk_names(tmp_path):
    lake = tmp_path / "lake"
    # No --spool-dir: both take a slot of the default spool under XDG_STATE_HOME.
    procs = [run_worker(lake, "--worker-id", "same", "--max-games", "3", "--chunk-games", "1", "--seed", "7",
                        state=tmp_path / "state", wait=False) for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
    chunks = lake_games(lake)
    names = {layout.parse_chunk_path(path).worker_id for path in chunks}
    assert len(names) == 2 and all(name.startswith("same_") for name in names)
    assert sum(len(games) for games in chunks.values()) >= 6
    assert WorkerConfig(root="x", worker_id="same").worker_name != WorkerConfig(root="x", worker_id="same").worker_name


def test_a_worker_whose_default_spool_slot_is_held_takes_the_next_slot(tmp_path, monkeypatch):
    # Holding slot 0 here stands in for a worker still running: two real
    # workers race (the first may finish and free slot 0 before the second
    # starts, which is correct reuse), so the test holds the lock itself.
    lake, state = tmp_path / "lake", tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    base = default_spool_base(str(lake), "same")
    held = Spool(f"{base}-0")
    try:
        code, out, err = run_worker(lake, "--worker-id", "same", "--max-games", "1", state=state)
    finally:
        held.close()
    assert code == 0, out + err
    slots = sorted(p.name for p in (state / "zerolake" / "spool").iterdir())
    assert slots == [os.path.basename(base) + "-0", os.path.basename(base) + "-1"]
    assert sum(len(games) for games in lake_games(lake).values()) >= 1


def test_the_default_spool_follows_the_lake_not_the_spelling_of_its_root(tmp_path, monkeypatch):
    # A worker killed on `--root lake` and restarted on the same lake's absolute path
    # (or a symlink to it) must find its spooled games; a run in another folder also
    # given `--root lake` is another lake and must not (it would upload them there).
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (tmp_path / "link").symlink_to(first / "lake", target_is_directory=False)
    monkeypatch.chdir(first)
    killed = open_worker_spool(WorkerConfig(root="lake", worker_id="w"))
    killed.add(0, "killed.1", b"a finished game")
    killed.close()
    for spelling in (str(first / "lake"), str(first / "lake") + "/", str(tmp_path / "link"), "./lake"):
        restarted = open_worker_spool(WorkerConfig(root=spelling, worker_id="w"))
        try:
            assert restarted.directory == killed.directory and restarted.loose == {0: [os.listdir(
                os.path.join(killed.directory, "games"))[0]]}, spelling
        finally:
            restarted.close()
    monkeypatch.chdir(second)
    other_run = open_worker_spool(WorkerConfig(root="lake", worker_id="w"))
    try:
        assert other_run.directory != killed.directory and other_run.loose == {}
    finally:
        other_run.close()


def test_a_spool_dir_that_holds_another_lakes_games_is_refused_in_one_line(tmp_path):
    spool_dir = tmp_path / "spool"
    first = Spool(str(spool_dir), lake=str(tmp_path / "a"))
    first.add(0, "a.1", b"a game of lake a")
    first.close()
    with pytest.raises(SpoolOfOtherLake):
        Spool(str(spool_dir), lake=str(tmp_path / "b"))
    Spool(str(spool_dir), lake=str(tmp_path / "a")).close()   # its own lake still opens it (the lock was freed)
    code, out, err = run_worker(tmp_path / "b", "--max-games", "1", "--spool-dir", str(spool_dir))
    assert code == 2 and "Traceback" not in err
    assert err.strip().count("\n") == 0 and "--spool-dir" in err and str(tmp_path / "a") in err
    assert not (tmp_path / "b" / "games").exists()


# ---- models and roots ----------------------------------------------------------

def publish_fake_model(storage, tmp_path):
    from format import registry

    local = tmp_path / "export"
    (local / "variables").mkdir(parents=True)
    (local / "saved_model.pb").write_bytes(b"graph")
    (local / "variables" / "data").write_bytes(b"weights" * 10)
    registry.publish_model(storage, 1, str(local), {"board_size": 9})
    return layout.model_file(1, "variables/data")


@pytest.mark.parametrize("broken", ["latest", "checksum"])
def test_a_broken_model_never_makes_the_worker_play_generation_0(tmp_path, broken):
    lake = tmp_path / "lake"
    storage = LocalStorage(str(lake))
    if broken == "latest":
        storage.write_replace(layout.LATEST, b"not a number\n")
    else:
        data = publish_fake_model(storage, tmp_path)
        os.chmod(storage.url(data), 0o644)
        Path(storage.url(data)).write_bytes(b"WEIGHTS" * 10)   # its manifest's size, other bytes
    events = tmp_path / "events.jsonl"
    # The checksum case imports TensorFlow (seconds) before its first rejection.
    code, out, err = run_worker(lake, "--max-seconds", "3" if broken == "latest" else "8", "--spool-dir", str(tmp_path / "spool"),
                                "--model-cache", str(tmp_path / "cache"), "--events", str(events))
    assert code == 0, out + err
    assert lake_games(lake) == {}
    rejected = [e for e in read_events(str(events)) if e["event"] == "model_rejected"]
    # Retried, saying so each time (the checksum case spends its seconds importing TensorFlow).
    assert len(rejected) >= (2 if broken == "latest" else 1), err
    assert err.count("rejected") == len(rejected) and "retrying in" in err and "Traceback" not in err
    if broken == "checksum":
        assert all(e["generation"] == 1 for e in rejected) and "sha256" in rejected[0]["error"]
    assert not any(e["event"] in ("started", "game_finished") for e in read_events(str(events)))


def test_a_root_that_cannot_be_written_exits_2_with_one_line(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_bytes(b"")
    code = main(["--root", str(blocker / "lake"), "--spool-dir", str(tmp_path / "spool"), "--max-games", "1"])
    err = capsys.readouterr().err
    assert code == 2
    [line] = err.strip().splitlines()
    assert "not writable" in line and str(blocker / "lake") in line


def test_a_failing_bucket_keeps_games_spooled_and_retries(tmp_path):
    """Uploads fail for a while: one line per failure, no traceback, nothing lost."""
    from cloud.base import StorageError
    from selfplay.worker import SelfPlayWorker

    class Flaky(LocalStorage):
        failures = 2

        def write_new(self, path, data):
            if path.startswith(layout.GAMES_DIR) and Flaky.failures:
                Flaky.failures -= 1
                raise StorageError("503 Service Unavailable", url=path)
            super().write_new(path, data)

    storage = Flaky(str(tmp_path / "lake"))
    config = WorkerConfig(root=str(tmp_path / "lake"), games=4, visits=2, fast_visits=2, max_games=2,
                          chunk_games=1, spool_dir=str(tmp_path / "spool"), worker_id="flaky", seed=1)
    worker = SelfPlayWorker(config, storage)
    worker.run()
    assert worker.final_upload_ok and Flaky.failures == 0
    assert sum(len(g) for g in lake_games(tmp_path / "lake").values()) == worker.counters.games


def test_a_sigkilled_worker_on_a_gcs_emulator_root_loses_and_repeats_nothing(tmp_path, fake_gcs):
    """What the cluster launcher checks, once: kill, restart, every finished game in exactly one chunk."""
    root, spool, events = fake_gcs.root_url("spool"), tmp_path / "spool", tmp_path / "events.jsonl"
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", **fake_gcs.env)

    def start(*flags):
        return subprocess.Popen([sys.executable, "-m", "selfplay.worker", "--root", root, *FAST_FLAGS,
                                 "--spool-dir", str(spool), "--events", str(events), *flags],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    proc = start("--chunk-games", "3")
    try:
        wait_for(lambda: len(finished_ids(events)) >= 5, 90, "five game_finished events")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    proc = start("--chunk-games", "3", "--max-games", "2")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    storage = fake_gcs.open(root)
    stored = [g.game_id for info in storage.list(layout.games_prefix())
              for g in read_chunk(storage.read(info.path), info.path)]
    for game_id in finished_ids(events):
        assert stored.count(game_id) == 1, game_id


# ---- a full spool disk: play pauses, the spool goes up, no game is lost -----------------

def small_worker_config(tmp_path, spool_dir, **changes):
    fields = dict(root=str(tmp_path / "lake"), games=4, visits=2, fast_visits=2, chunk_games=1000,
                  chunk_seconds=1000.0, spool_dir=str(spool_dir), worker_id="full", seed=3)
    return WorkerConfig(**{**fields, **changes})


def test_a_full_spool_pauses_play_uploads_what_is_spooled_and_resumes(tmp_path, monkeypatch, capsys):
    """The disk holds three games: the fourth finds no room (ENOSPC), play pauses with one line,
    the three go up (making room), play resumes; no game is lost or stored twice."""
    from selfplay.worker import SelfPlayWorker

    spool_dir = tmp_path / "spool"
    no_room_for(monkeypatch, lambda path, data: (os.sep + "games" + os.sep in path
                                                 and len(os.listdir(spool_dir / "games")) >= 3))
    worker = SelfPlayWorker(small_worker_config(tmp_path, spool_dir, max_games=8),
                            LocalStorage(str(tmp_path / "lake")))
    worker.run()
    out, err = capsys.readouterr()
    paused = [line for line in err.splitlines() if "is full" in line]
    resumed = [line for line in out.splitlines() if "has room again" in line]
    assert worker.final_upload_ok and len(paused) >= 2 and len(resumed) == len(paused), out + err
    assert all(str(spool_dir) in line and "paused" in line for line in paused)
    games = [g.game_id for chunk in lake_games(tmp_path / "lake").values() for g in chunk]
    assert len(games) == len(set(games)) == worker.counters.games >= 8
    assert "Traceback" not in err


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (as root; a machine that refuses the mount skips the test)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill ({result.stderr.strip() or 'not root'}); "
                    "the injected-ENOSPC tests cover the same paths")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_worker_started_on_a_full_spool_uploads_it_first(tmp_path, small_disk, capsys):
    """A real full disk: a killed worker's loose games filled it, so not even a batch file fits.

    Before, the batch file's ENOSPC crashed the worker at start-up, before any
    upload: a crash loop.  Now the spool gives up its reserve for the batch
    file, uploads, and every game goes up before new ones are played.
    """
    from selfplay.spool import encode_entry
    from selfplay.worker import SelfPlayWorker

    spool_dir = small_disk / "spool"
    Spool(str(spool_dir)).close()
    left = 0
    while True:   # entries as Spool.add names them, until the disk is full
        entry = spool_dir / "games" / f"000000-old.{left}.game"
        try:
            entry.write_bytes(encode_entry(0, b"a game left by a killed worker " * 40))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            entry.unlink()
            break
        left += 1
    assert left > 100
    worker = SelfPlayWorker(small_worker_config(tmp_path, spool_dir, max_games=2),
                            LocalStorage(str(tmp_path / "lake")))
    worker.run()
    out, err = capsys.readouterr()
    assert worker.final_upload_ok and f"uploading {left} games left by an earlier run" in out, out + err
    storage = LocalStorage(str(tmp_path / "lake"))
    stored = [record for info in storage.list(layout.games_prefix())
              for record in chunk_records(storage.read(info.path), info.path)]
    assert len(stored) == left + worker.counters.games and worker.counters.games >= 2
    assert os.listdir(spool_dir / "games") == [] and "Traceback" not in err


def no_room_for(monkeypatch, refuse):
    """Make the spool's writes of files for which ``refuse(path, data)`` holds find a full disk."""
    import selfplay.spool as spool_module

    real_write = spool_module.write_local_file

    def write(path, data):
        if refuse(path, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        real_write(path, data)

    monkeypatch.setattr(spool_module, "write_local_file", write)


def test_the_reserve_pays_for_a_batch_file_on_a_full_disk_and_comes_back(tmp_path, monkeypatch):
    from selfplay.spool import SpoolFull

    spool = Spool(str(tmp_path / "spool"), reserve_bytes=8192)
    for i in range(5):
        spool.add(0, f"g.{i}", b"game %d" % i)
    no_room_for(monkeypatch, lambda path, data: os.path.exists(spool.reserve_path))   # full while it exists
    with pytest.raises(SpoolFull, match=f"the spool at {tmp_path / 'spool'} is full"):
        spool.add(0, "g.5", b"game 5")
    batch = spool.make_batch(0, "w", 1000)
    assert len(batch.entries) == 5 and not os.path.exists(spool.reserve_path)
    assert spool.upload(LocalStorage(str(tmp_path / "lake")), batch, "w") == ("uploaded", 5)
    assert os.path.getsize(spool.reserve_path) == 8192 and spool.spooled == 0
    spool.close()


def test_a_batch_file_that_does_not_fit_gets_fewer_games(tmp_path, monkeypatch):
    spool = Spool(str(tmp_path / "spool"), reserve_bytes=0)
    names = [spool.add(0, f"g.{i}", b"game") for i in range(16)]
    no_room_for(monkeypatch, lambda path, data: "batches" in path and len(data) > 500)
    batch = spool.make_batch(0, "w", 1000)
    assert 1 <= len(batch.entries) < 16 and list(batch.entries) + spool.loose[0] == names
    spool.close()
