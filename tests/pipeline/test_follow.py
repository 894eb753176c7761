"""``python -m pipeline.shuffle --follow``: claims, cadence, dead attempts, untrusted manifests.

The followers run as real subprocesses (signals, SIGKILL and the child job
are what is tested); the claim and tmp-cleanup rules are also tested
in-process against a local storage root.  Lakes are tiny (a few chunks of
synthetic 9x9 games), so each window costs a few seconds of Beam.
"""
from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from cloud.storage import open_storage
from format import layout
from format.window_manifest import read_window_manifest, WINDOW_MANIFEST_VERSION, WindowManifest
from format.events import read_events
from format.leases import Lease, LeaseLost, LeaseRecord, read_record
from pipeline import follow as F
from pipeline import lake_view as LW
from pipeline.config import ShuffleConfig, window_argv
from pipeline.shuffle import build_parser, main
from testdata.synthetic_games import synthetic_game
from testdata.synthetic_windows import write_run_config, write_synthetic_window
from tests.pipeline.support import write_chunk, write_run_json

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GAMES_PER_CHUNK = 6


def make_lake(root: str, chunks: int, seed: int = 1, first_seq: int = 0) -> None:
    if not os.path.exists(os.path.join(root, layout.RUN_CONFIG)):
        write_run_json(root, 9)
    add_chunks(root, chunks, seed, first_seq)


def add_chunks(root: str, chunks: int, seed: int, first_seq: int) -> None:
    rng = np.random.default_rng(seed)
    for seq in range(first_seq, first_seq + chunks):
        games = [synthetic_game(rng, 9, visits=8, generation=0) for _ in range(GAMES_PER_CHUNK)]
        write_chunk(root, 0, games, seq)


def start_follower(root: str, events: str, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "pipeline.shuffle", "--root", root, "--follow", "--events", events,
            "--poll-seconds", "0.3", "--workers", "1", "--random-playouts", "4", *extra]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(process: subprocess.Popen) -> tuple[int, str, str]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def wait_for(condition, what: str, timeout: float = 60.0, processes=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        for p in processes:
            assert p.poll() is None, f"a follower exited early ({p.returncode}) while waiting for {what}"
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def looks(*event_files) -> int:
    """How many times the followers looked at the lake (one ``looked`` event per poll)."""
    return sum(1 for path in event_files for e in read_events(path) if e["event"] == "looked")


def wait_for_looks(event_files, more: int, processes=()) -> None:
    """Until the followers have looked ``more`` more times: a check that nothing happened is then
    a check over that many polls, however slow the machine, never a sleep that hopes."""
    target = looks(*event_files) + more
    wait_for(lambda: looks(*event_files) >= target, f"{more} more looks", processes=processes)


def published(*event_files) -> list[int]:
    return [e["generation"] for path in event_files for e in read_events(path) if e["event"] == "window_published"]


def tmp_files(root: str) -> list[str]:
    return [f for _, _, files in os.walk(os.path.join(root, layout.TMP_DIR)) for f in files]


def window_files(root: str, generation: int) -> list[str]:
    return sorted(os.listdir(os.path.join(root, layout.window_dir(generation))))


# ---------------------------------------------------------------------------
# Followers as processes
# ---------------------------------------------------------------------------

def test_two_followers_publish_each_window_once_and_wait_for_new_games(tmp_path):
    root = str(tmp_path / "lake")
    make_lake(root, 2)
    events = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    # A chunk of these games holds ~360 positions: 2 chunks are enough for a first window.
    followers = [start_follower(root, path, "--follow-new-positions", "500") for path in events]
    try:
        # Both see a lake without windows: every position is new, so both race for window 1.
        wait_for(lambda: published(*events) == [1], "window 1", processes=followers)
        waiting = wait_for(lambda: [e for path in events for e in read_events(path)
                                    if e["event"] == "waiting" and e["generation"] == 2], "a waiting event")
        assert all(e["new_positions"] < e["needed"] == 500 for e in waiting)
        wait_for_looks(events, 4, processes=followers)
        assert published(*events) == [1]  # nothing new: no second window
        add_chunks(root, 3, seed=2, first_seq=100)
        wait_for(lambda: sorted(published(*events)) == [1, 2], "window 2", processes=followers)
        wait_for_looks(events, 4, processes=followers)
    finally:
        results = [stop(p) for p in followers]
    for code, _, err in results:
        assert code == 0, err
        assert "Traceback" not in err, err
    assert sorted(published(*events)) == [1, 2]
    for generation in (1, 2):
        manifest = json.loads(open(os.path.join(root, layout.window_manifest(generation))).read())
        # Only the winner's shards: a loser that built anyway would leave its own attempt's shards.
        assert window_files(root, generation) == sorted(manifest["shards"] + [manifest["game_table"], layout.MANIFEST])
    assert not os.path.exists(os.path.join(root, layout.window_dir(3)))
    assert tmp_files(root) == []
    for path in events:
        names = [e["event"] for e in read_events(path)]
        assert names[0] == "started" and names[-1] == "stopped"


def test_an_expired_claim_of_a_killed_follower_is_taken_over(tmp_path):
    root = str(tmp_path / "lake")
    make_lake(root, 3)
    storage = open_storage(root)
    # Pieces of an attempt killed long ago (no claim): deleted on start.
    storage.write_new(layout.job_tmp_dir("shuffle", 1, "old0") + "/parts/00000/b000000.npz", b"x")
    first = start_follower(root, str(tmp_path / "a.jsonl"), "--claim-seconds", "3")
    try:
        claim = wait_for(lambda: LW.live_claim(storage, 1), "the first follower's claim", processes=[first])
    finally:
        first.kill()
        first.communicate(timeout=30)
    # Its child job dies with it (PR_SET_PDEATHSIG): nothing may publish window 1 now.
    # Plant pieces under the killed attempt's name too, as if it had got that far.
    attempt = LW.claim_attempt(claim)
    storage.write_replace(layout.job_tmp_dir("shuffle", 1, attempt) + "/parts/00000/b000000.npz", b"x")
    stray = layout.shard_path(1, layout.shard_name(attempt, 0, 1))
    storage.write_replace(stray, b"x")
    storage.write_replace(layout.game_table_path(1, layout.game_table_name(attempt)), b"x")  # its table, too
    # That nothing publishes window 1 now is shown below: the second follower must publish it itself
    # (it would find it published otherwise), under an attempt other than the killed one.
    events = str(tmp_path / "b.jsonl")
    second = start_follower(root, events, "--claim-seconds", "3")
    try:
        wait_for(lambda: published(events) == [1], "window 1 by the second follower", processes=[second])
    finally:
        code, out, err = stop(second)
    assert code == 0, err
    names = [e["event"] for e in read_events(events)]
    # The dead claim was still live when the second follower started (unless it started late).
    assert names.index("window_published") > names.index("started")
    manifest = read_window_manifest(storage, 1, check_shards=True)
    assert manifest.document["attempt"] != attempt
    assert "took over the expired claim" in out
    assert tmp_files(root) == []
    # The killed attempt's shard is not part of the published window: removed.
    assert window_files(root, 1) == sorted(manifest.document["shards"] + [manifest.document["game_table"],
                                                                       layout.MANIFEST])


def test_sigterm_in_the_middle_of_a_window_leaves_it_unpublished(tmp_path):
    root = str(tmp_path / "lake")
    make_lake(root, 2)
    storage = open_storage(root)
    events = str(tmp_path / "events.jsonl")
    follower = start_follower(root, events)
    claim = wait_for(lambda: LW.live_claim(storage, 1), "the claim of window 1", processes=[follower])
    code, _, err = stop(follower)
    assert code == 0, err
    assert not storage.exists(layout.window_manifest(1))
    assert LW.live_claim(storage, 1) is None            # released: the next follower need not wait
    assert tmp_files(root) == []
    record, _ = read_record(storage, layout.window_claim(1))
    assert record.released and LW.claim_attempt(record) == LW.claim_attempt(claim)
    assert [e["event"] for e in read_events(events)][-1] == "stopped"


def test_follower_refuses_to_build_past_an_untrusted_window(tmp_path):
    root = str(tmp_path / "lake")
    make_lake(root, 2)
    storage = open_storage(root)
    storage.write_new(layout.window_manifest(1), b"{not json")
    events = str(tmp_path / "events.jsonl")
    follower = start_follower(root, events)
    try:
        wait_for(lambda: read_events(events), "the started event", processes=[follower])
        wait_for_looks([events], 5, processes=[follower])  # several polls, counted
    finally:
        code, out, err = stop(follower)
    assert code == 0, err
    assert "Traceback" not in err
    assert err.count(storage.url(layout.window_manifest(1))) == 1, err  # logged once, not every poll
    assert "not valid JSON" in err and "move" in err
    assert storage.read(layout.window_manifest(1)) == b"{not json"  # never overwritten
    assert not storage.exists(layout.window_dir(2)) and not os.path.exists(os.path.join(root, layout.window_dir(2)))
    assert published(events) == []


def test_sigterm_while_waiting_exits_zero_with_a_stopped_event(tmp_path):
    root = str(tmp_path / "lake")
    write_run_json(root, 9)  # no games at all: the follower waits
    events = str(tmp_path / "events.jsonl")
    follower = start_follower(root, events)
    wait_for(lambda: any(e["event"] == "waiting" for e in read_events(events)), "waiting", processes=[follower])
    code, _, err = stop(follower)
    assert code == 0, err
    last = read_events(events)[-1]
    assert last["event"] == "stopped" and last["reason"] == "SIGTERM"


# ---------------------------------------------------------------------------
# Untrusted manifests, one-shot
# ---------------------------------------------------------------------------

def _bad_manifest(kind: str) -> tuple[bytes, str]:
    good = {"version": WINDOW_MANIFEST_VERSION, "target_generation": 1, "board_size": 9,
            "shards": ["a-00000-of-00001.tfrecord.gz"], "positions": 10, "record_version": 4,
            "game_table": "a-games.table.gz"}
    if kind == "json":
        return b'{"version": 1, "shards": [', "not valid JSON"
    if kind == "nested":            # json's RecursionError: a traceback at every start of the job
        return b'{"shards": ' + b"[" * 3000 + b"]" * 3000 + b"}", "nested too deeply"
    if kind == "version":
        return json.dumps({**good, "version": 99}).encode(), "field 'version'"
    if kind == "no_game_table":
        return json.dumps({k: v for k, v in good.items() if k != "game_table"}).encode(), "field 'game_table'"
    return json.dumps(good).encode(), "field 'shards'"  # the shard file is missing


@pytest.mark.parametrize("kind", ["json", "nested", "version", "no_game_table", "missing_shard"])
def test_one_shot_job_refuses_an_untrusted_manifest(tmp_path, kind, capsys):
    root = str(tmp_path / "lake")
    make_lake(root, 1)
    data, field = _bad_manifest(kind)
    storage = open_storage(root)
    storage.write_new(layout.window_manifest(1), data)
    # In-process (Beam is imported once per test session): any exception but
    # the job's own clear error would escape main() and fail the test.
    assert main(["--root", root, "--workers", "1"]) == 2
    out, err = capsys.readouterr()
    assert "nothing to do" not in out
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and storage.url(layout.window_manifest(1)) in errors[0] and field in errors[0], err
    assert storage.read(layout.window_manifest(1)) == data


def test_a_one_shot_job_stopped_by_sigterm_removes_its_pieces_and_releases_its_claim(tmp_path):
    """Stopped as operations.loop stops it (SIGTERM to its process group, Beam's workers included):
    one line, exit 143, no window, none of its pieces left, its claim released.  While it ran, its
    attempt held the claim of its window, so a follower's clean-up kept its pieces."""
    root = str(tmp_path / "lake")
    make_lake(root, 4)
    storage = open_storage(root)
    # Bundles of one chunk each: the job is still labelling the others when the first pieces appear.
    job = subprocess.Popen([sys.executable, "-m", "pipeline.shuffle", "--root", root, "--workers", "2",
                            "--bundle-positions", "100", "--random-playouts", "16"], cwd=REPO, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        pieces = wait_for(lambda: storage.list(layout.tmp_prefix()), "the job's first pieces", processes=[job])
        attempt = layout.parse_job_tmp_dir(pieces[0].path)[2]
        assert LW.claim_attempt(LW.live_claim(storage, 1)) == attempt
        assert LW.remove_dead_tmp(storage) == []                   # a follower's clean-up keeps them
        os.killpg(job.pid, signal.SIGTERM)
        out, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 128 + signal.SIGTERM, err
    assert err.splitlines() == ["stopped by SIGTERM: no window published, the job's temporary files removed"]
    assert storage.list(layout.tmp_prefix()) == []
    assert not storage.exists(layout.window_manifest(1))
    assert LW.live_claim(storage, 1) is None


def test_a_one_shot_job_cleans_what_killed_jobs_and_writers_left(tmp_path, capsys):
    """At start, the pieces of attempts no live job owns, and writers' temporary files older than an
    hour (a young one may be a live writer's); then it builds its window as usual.  A one-shot job
    SIGKILLed on this host left its claim unexpired: the rerun takes it over, not waits it out."""
    root = str(tmp_path / "lake")
    make_lake(root, 1)
    storage = open_storage(root)
    for attempt in ("killed0", "killed1"):
        storage.write_new(layout.job_tmp_dir("shuffle", 1, attempt) + "/shards/00000/b000000.npz", b"x")
    gone = subprocess.Popen(["true"])
    gone.wait()                                                      # a pid of this host that no longer runs
    now = time.time()
    storage.write_new(layout.window_claim(1), LeaseRecord(
        holder="killed-job", host=socket.gethostname(), pid=gone.pid, acquired=now, renewed=now, expires=now + 60,
        details={"attempt": "killed1"}).to_bytes())
    games = os.path.join(root, layout.GAMES_DIR)
    old, young = (os.path.join(games, name) for name in (".zl-tmp-old.1.a", ".zl-tmp-young.1.b"))
    for path in (old, young):
        open(path, "wb").close()
    os.utime(old, (time.time() - 2 * LW.STALE_TEMP_SECONDS,) * 2)
    assert main(["--root", root, "--workers", "1", "--random-playouts", "4"]) == 0
    assert storage.list(layout.tmp_prefix()) == [] and not os.path.exists(old) and os.path.exists(young)
    assert storage.exists(layout.window_manifest(1))
    out = capsys.readouterr().out
    assert "killed0" in out and "killed1" in out and "removed 1 temporary files of killed writers" in out
    assert "took over the claim of killed-job" in out


def test_a_one_shot_job_waits_for_no_window_a_follower_builds(tmp_path, capsys):
    """A live claim on its window (a follower building it): one line naming the holder, exit 2, and the
    holder's pieces untouched."""
    root = str(tmp_path / "lake")
    make_lake(root, 1)
    storage = open_storage(root)
    held = LW.try_claim(storage, 1, "follower-a", "theirs1", ttl=60)
    piece = layout.job_tmp_dir("shuffle", 1, "theirs1") + "/parts/00000/b000000.npz"
    storage.write_new(piece, b"x")
    assert main(["--root", root, "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "window 1 is being built by follower-a" in err
    assert storage.url(layout.window_claim(1)) in err
    assert storage.exists(piece) and not storage.exists(layout.window_manifest(1))
    assert held.release()


# ---------------------------------------------------------------------------
# Claims and tmp cleanup, in-process
# ---------------------------------------------------------------------------

def test_claims_are_exclusive_until_they_expire(tmp_path):
    storage = open_storage(str(tmp_path))
    held = LW.try_claim(storage, 4, "a", "att1", ttl=0.3)
    assert isinstance(held, Lease) and held.took_over is None
    other = LW.try_claim(storage, 4, "b", "att2", ttl=60)
    assert isinstance(other, LeaseRecord) and other.holder == "a"      # lost: told who holds it
    assert held.renew().details == {"attempt": "att1"}
    time.sleep(0.35)
    taken = LW.try_claim(storage, 4, "b", "att2", ttl=60)                # expired: taken over
    assert isinstance(taken, Lease) and LW.claim_attempt(taken.took_over) == "att1"
    with pytest.raises(LeaseLost, match="claim of window 4.* held by b"):
        held.renew()                                                    # the old holder learns it lost
    assert not held.release()                                           # and cannot release the new one
    assert LW.claim_attempt(LW.live_claim(storage, 4)) == "att2"
    assert taken.release()
    assert LW.live_claim(storage, 4) is None


def test_a_damaged_claim_counts_as_expired(tmp_path):
    storage = open_storage(str(tmp_path))
    storage.write_new(layout.window_claim(6), b"{not json")
    assert LW.live_claim(storage, 6) is None
    taken = LW.try_claim(storage, 6, "a", "att1", ttl=60)
    assert isinstance(taken, Lease) and taken.took_over is None
    assert LW.claim_attempt(LW.live_claim(storage, 6)) == "att1"


def test_only_tmp_pieces_of_dead_attempts_are_removed(tmp_path):
    root = str(tmp_path)
    storage = open_storage(root)
    piece = "/parts/00000/b000000.npz"
    live = LW.try_claim(storage, 2, "a", "live1", ttl=60)
    assert isinstance(live, Lease)
    for generation, attempt in ((2, "live1"), (2, "dead1"), (3, "mine1"), (5, "noclaim1")):
        storage.write_new(layout.job_tmp_dir("shuffle", generation, attempt) + piece, b"x")
    removed = LW.remove_dead_tmp(storage, keep_attempt="mine1")
    assert removed == [layout.job_tmp_dir("shuffle", 2, "dead1"), layout.job_tmp_dir("shuffle", 5, "noclaim1")]
    # Once its window is published, even the claim holder's pieces are dead.
    storage.write_new(layout.window_manifest(2), b"{}")
    assert LW.remove_dead_tmp(storage, keep_attempt="mine1") == [layout.job_tmp_dir("shuffle", 2, "live1")]
    assert [i.path for i in storage.list(layout.tmp_prefix())] == [layout.job_tmp_dir("shuffle", 3, "mine1") + piece]


def test_a_follower_keeps_one_window_manifest_however_many_windows_it_reads(tmp_path):
    """A manifest lists every game id of its window (MBs at scale): a follower running for weeks may
    hold the newest one only, not one per window it has read."""
    def manifests_alive() -> int:
        gc.collect()
        return sum(isinstance(o, WindowManifest) for o in gc.get_objects())

    storage = open_storage(str(tmp_path))
    write_run_config(storage, board_size=9)
    follower = F.Follower(ShuffleConfig(root=str(tmp_path), follow=True), [], storage, events=None)
    before = manifests_alive()
    for generation in range(1, 7):
        write_synthetic_window(storage, target_generation=generation, board_size=9, positions=3, shards=1,
                               seed=generation)
        assert follower.look().target == generation + 1       # it read window `generation` to measure against
        assert manifests_alive() - before <= 1


def test_a_look_lists_the_newest_folders_and_the_whole_lake_once_an_hour(tmp_path, monkeypatch):
    """The follower listed every chunk of games/ at each poll: at a hundred workers for a month, the
    listing was the cost of a poll.  A look lists the newest generations' folders; the whole once an hour.
    Only those folders' chunks are held; older folders are byte and chunk totals."""
    storage = open_storage(str(tmp_path))
    write_run_config(storage, board_size=9)

    def add(generation: int, ms: int) -> None:
        storage.write_new(layout.chunk_path(generation, "w1", ms, 0), b"not decoded by a look")

    for generation in range(10):
        for i in range(5):
            add(generation, 1000 * generation + i)
    listed = []
    real_list = storage.list

    def counting(prefix=""):
        found = real_list(prefix)
        if prefix.startswith(layout.games_prefix()):
            listed.append(len(found))
        return found

    monkeypatch.setattr(storage, "list", counting)
    follower = F.Follower(ShuffleConfig(root=str(tmp_path), follow=True), [], storage, events=None)
    first = follower.list_chunks(0)
    assert first.lake_chunks == 50 and sum(listed) == 50 == follower.listed
    assert first.lake_bytes == 50 * len(b"not decoded by a look")
    assert {c.generation for c in first.recent} == {7, 8, 9}   # older folders are kept as totals only
    listed.clear()
    add(9, 99_000)
    add(2, 99_001)                                        # a straggler under an old generation
    listing = follower.list_chunks(0)
    assert sum(listed) == 16 == follower.listed           # folders 7, 8 and 9 (RECENT_GENERATIONS = 2)
    assert listing.lake_chunks == 51 and listing.recent[0].time_ms == 99_000
    assert [c.time_ms for c in listing.recent] == sorted((c.time_ms for c in listing.recent), reverse=True)
    add(10, 100_000)                                      # a new generation: listed up to models/LATEST
    listing = follower.list_chunks(10)
    assert listing.lake_chunks == 52 and len(listed) == 3 + 4
    assert {c.generation for c in listing.recent} == {8, 9, 10}   # folder 7 became a total
    now = time.monotonic()
    monkeypatch.setattr(F.time, "monotonic", lambda: now + F.FULL_LISTING_SECONDS + 1)
    full = follower.list_chunks(10)
    assert (full.lake_chunks, follower.listed) == (53, 53)   # the hour's full listing


# ---------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------

def test_flags_are_dashed():
    parser = build_parser()
    args, _ = parser.parse_known_args(["--root", "r", "--board-size", "9", "--follow", "--follow-new-positions",
                                       "7", "--poll-seconds", "2", "--events", "e.jsonl"])
    assert (args.board_size, args.follow, args.follow_new_positions, args.poll_seconds, args.events) == \
        (9, True, 7, 2.0, "e.jsonl")
    args, _ = parser.parse_known_args(["--root", "r", "--board-size", "19", "--window-exponent", "0.5"])
    assert args.board_size == 19 and args.follow is False and args.window_exponent == 0.5


def test_the_child_job_gets_every_setting_but_the_follow_ones():
    from cloud.base import RetryPolicy

    retry = RetryPolicy(max_attempts=3, deadline_s=20.0)
    config = ShuffleConfig(root="r", board_size=9, reuse=2.5, window_exponent=0.7, follow=True, poll_seconds=1,
                           events="e", follow_new_positions=5, storage_retry=retry)
    parser = build_parser()
    args, _ = parser.parse_known_args(window_argv(config))
    from pipeline.config import from_args
    child = from_args(args, parser)
    assert child == ShuffleConfig(root="r", board_size=9, reuse=2.5, window_exponent=0.7, storage_retry=retry)


def test_follow_flags_are_validated(capsys):
    with pytest.raises(SystemExit):
        main(["--root", "r", "--follow", "--poll-seconds", "0"])
    assert "--poll-seconds: must be > 0" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# Per-window runner: small windows in-process, large ones on Dataflow
# ---------------------------------------------------------------------------

DATAFLOW_FLAGS = ["--runner", "DataflowRunner", "--project", "p", "--region", "us-central1",
                  "--temp_location", "gs://b/tmp"]


def test_each_window_gets_the_dataflow_flags_only_above_the_threshold(tmp_path):
    config = ShuffleConfig(root=str(tmp_path), follow=True, dataflow_above_positions=500_000, reuse=2.0)
    follower = F.Follower(config, DATAFLOW_FLAGS, open_storage(str(tmp_path)), events=None)
    small = follower.window_command(3, "att1", 500_000)
    large = follower.window_command(4, "att2", 500_001)
    assert small[small.index("--window-generation"):] == ["--window-generation", "3", "--attempt", "att1"]
    run = follower.run_label
    assert large[large.index("--window-generation"):] == ["--window-generation", "4", "--attempt", "att2",
                                                          *DATAFLOW_FLAGS, f"--job_name=zerolake-{run}-w4-att2",
                                                          f"--labels=zerolake-run={run}", "--labels=zerolake-window=4",
                                                          "--labels=zerolake-role=shuffle",
                                                          "--labels=zerolake-attempt=att2"]
    for command in (small, large):                      # the window's own settings either way, no follow flags
        assert "--reuse" in command and "--dataflow-above-positions" not in command and "--follow" not in command
    assert not F.names_dataflow(small) and F.names_dataflow(large)
    # Without the setting every window goes where the Beam flags say.
    everywhere = F.Follower(ShuffleConfig(root=str(tmp_path), follow=True), DATAFLOW_FLAGS, None, events=None)
    command = everywhere.window_command(3, "a", 10)
    assert command[command.index("--attempt") + 2:][:len(DATAFLOW_FLAGS)] == DATAFLOW_FLAGS


def test_the_runner_flag_is_read_in_every_spelling():
    assert F.names_dataflow(["--runner=DataflowRunner"]) and F.names_dataflow(["--runner", "dataflow"])
    assert not F.names_dataflow(["--runner", "DirectRunner"]) and not F.names_dataflow(["--project", "dataflow"])
    # The last --runner wins, as Beam reads it: the follower must agree with the job it launches.
    assert not F.names_dataflow(["--runner", "DataflowRunner", "--runner=DirectRunner"])
    assert F.names_dataflow(["--runner=DirectRunner", "--runner", "DataflowRunner"])


def test_the_threshold_without_dataflow_flags_is_one_clear_error(capsys):
    assert main(["--root", "r", "--follow", "--dataflow-above-positions", "1000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--dataflow-above-positions" in err and "DataflowRunner" in err
    assert "--dataflow-above-positions" in build_parser().format_help()


# ---------------------------------------------------------------------------
# Shuffle only what training reads: pacing by the trainer, windows sized to its reads
# ---------------------------------------------------------------------------

def test_a_window_holds_about_what_the_trainer_reads_and_none_is_built_to_be_superseded(tmp_path):
    config = ShuffleConfig(root=str(tmp_path), follow=True, reuse=1.5, samples_per_row=4.0, follow_min_rows=1000,
                           follow_max_rows=64_000, follow_max_untrained=2)
    follower = F.Follower(config, [], open_storage(str(tmp_path)), events=None)
    # 10,000 new rows x 4 = 40,000 rows drawn from a window of 400,000: reuse 0.1.
    assert follower.window_reuse(10_000, 400_000) == 0.1
    assert follower.window_reuse(100_000, 400_000) == 0.16                # at most --follow-max-rows
    assert follower.window_reuse(10, 400_000) == 0.0025                   # at least --follow-min-rows
    assert follower.window_reuse(1_000_000, 400_000) == 0.16
    assert follower.window_reuse(10_000, 20_000) == 1.5                    # never above --reuse
    command = follower.window_command(3, "att", 400_000, follower.window_reuse(10_000, 400_000))
    assert command[command.index("--reuse") + 1] == "0.1"
    # Two windows newer than LATEST (one in training, one ready): a third would supersede the ready one.
    assert not follower.trainer_behind(F.Outlook(target=2, new_positions=5, needed=1, untrained=1))
    assert follower.trainer_behind(F.Outlook(target=3, new_positions=5, needed=1, untrained=2))
    off = F.Follower(ShuffleConfig(root=str(tmp_path), follow=True), [], None, events=None)
    assert off.window_reuse(10_000, 400_000) is None and not off.trainer_behind(F.Outlook(9, 5, 1, untrained=8))


def test_the_follower_counts_the_windows_newer_than_latest(tmp_path):
    from testdata.models import publish_untrained_model

    storage = open_storage(str(tmp_path))
    write_run_config(storage, board_size=9)
    for generation in (1, 2, 3):
        write_synthetic_window(storage, target_generation=generation, board_size=9, positions=3, shards=1,
                               seed=generation)
    follower = F.Follower(ShuffleConfig(root=str(tmp_path), follow=True, follow_max_untrained=2), [], storage,
                          events=None)
    assert (follower.look().target, follower.look().untrained) == (4, 3)
    publish_untrained_model(str(tmp_path), 1, 9, seed=1)
    outlook = follower.look()
    assert (outlook.target, outlook.untrained) == (4, 2) and follower.trainer_behind(outlook)


def test_sigterm_inside_a_dofn_of_an_in_process_job_is_one_line_and_143(tmp_path, monkeypatch, capsys):
    """With --workers 1 (the cluster follower's default) Beam runs the DoFns in the job's own process, so
    SIGTERM's Terminated can rise inside one: Beam re-raised it as a RuntimeError and logged it, three
    tracebacks and exit 1.  Here the labelling DoFn meets it at once, where a signal lands by chance."""
    from pipeline.transforms import LabelBundleFn
    from processes.sigterm import EXIT_TERMINATED, Terminated

    def stopped(self, element):
        raise Terminated
    monkeypatch.setattr(LabelBundleFn, "process", stopped)
    root = str(tmp_path / "lake")
    make_lake(root, 2)
    assert main(["--root", root, "--workers", "1"]) == EXIT_TERMINATED
    err = capsys.readouterr().err
    assert err.splitlines() == ["stopped by SIGTERM: no window published, the job's temporary files removed"], err
    assert tmp_files(root) == [] and LW.live_claim(open_storage(root), 1) is None


def test_a_follower_stopped_by_sigterm_while_its_one_worker_job_labels_prints_no_traceback(tmp_path):
    """The same stop as the cluster launcher makes it: SIGTERM to the follower, which stops its window's
    job (--workers 1) while the job labels games, most of its Beam run on a lake of 150 chunks."""
    root = str(tmp_path / "lake")
    make_lake(root, 150)
    events = str(tmp_path / "events.jsonl")
    follower = start_follower(root, events)
    try:
        # The first temporary piece: the labelling DoFn has finished one bundle and works on the next.
        wait_for(lambda: tmp_files(root), "the job's first temporary piece", timeout=120, processes=[follower])
    finally:
        code, _, err = stop(follower)
    assert code == 0, err
    assert "Traceback" not in err and "Terminated" not in err, err[-3000:]
    assert not published(events) and not open_storage(root).exists(layout.window_manifest(1))
    assert tmp_files(root) == []
