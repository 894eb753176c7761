"""A trainer that runs forever, alone on its root.

* the trainer lease (model.lease): a second trainer is refused naming the
  holder, takes over only after expiry (or from a dead process on the same
  host), a renewal that finds another holder stops the first one; on a local
  root and on fake-gcs-server (the emulator that enforces preconditions);
* LATEST only moves forward and is written with a precondition
  (format.registry.advance_latest);
* window choice (model.windows.plan_next) and ``--follow``: the newest
  window is trained, the rest are skipped and recorded;
* bad window manifests and a broken LATEST: one clear line, exit 2.

The CLI runs use a 1-block, 8-filter network and a handful of steps, so each
process spends most of its time importing TensorFlow.
"""
from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from cloud.base import PreconditionFailed
from cloud.storage import open_storage
from format import layout
from format.events import read_events
from format.registry import RegistryError, advance_latest, latest_generation, publish_model
from model.lease import LeaseHeld, LeaseLost, LeaseRecord, TrainerLease
from model.train import main
from model.windows import Skipped, Window, WindowScan, plan_next
from testdata import synthetic_windows as synthetic

REPO = pathlib.Path(__file__).resolve().parents[2]


# --- helpers ---------------------------------------------------------------------

class Clock:
    """A settable clock for leases (unix seconds)."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def fake_model_dir(tmp_path) -> str:
    """publish_model needs only files: a tiny stand-in for a SavedModel folder."""
    local = tmp_path / "model"
    local.mkdir(exist_ok=True)
    (local / "saved_model.pb").write_bytes(b"not really a model")
    return str(local)


def lake_with_windows(root, generations, positions=64):
    storage = open_storage(str(root))
    synthetic.write_run_config(storage, board_size=9)
    for generation in generations:
        synthetic.write_synthetic_window(storage, target_generation=generation, board_size=9,
                                         positions=positions, shards=1, seed=generation)
    return storage


def write_bad_manifest(storage, generation, data: bytes):
    storage.write_new(layout.window_manifest(generation), data)


def train_command(root, *extra):
    return [sys.executable, "-m", "model.train", "--root", str(root), "--blocks", "1", "--filters", "8",
            "--value-hidden", "8", "--batch-size", "16", "--steps-per-window", "4",
            "--steps-per-call", "2", "--log-every", "2", "--checkpoint-every", "4",
            "--warmup-steps", "1", "--shuffle-buffer", "64", *extra]


def run_main(argv, capsys):
    """main(argv) in this process (it fails before importing TensorFlow): (status, stderr)."""
    status = main(argv)
    return status, capsys.readouterr().err


# --- LATEST ---------------------------------------------------------------------------

def test_latest_never_moves_backwards(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    local = fake_model_dir(tmp_path)
    publish_model(storage, 3, local, {"board_size": 9})
    publish_model(storage, 2, local, {"board_size": 9})
    assert latest_generation(storage) == 3
    assert storage.exists(layout.model_manifest(2))
    publish_model(storage, 4, local, {"board_size": 9})
    assert latest_generation(storage) == 4


class RacingStorage:
    """Wraps a storage: right after the first ``read_versioned`` of LATEST, another
    publisher moves LATEST to ``to`` (a blind overwrite, between our read and write)."""

    def __init__(self, inner, to: int):
        self.inner, self.to, self.raced = inner, to, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def read_versioned(self, path, **kwargs):
        result = self.inner.read_versioned(path, **kwargs)
        if path == layout.LATEST and not self.raced:
            self.raced += 1
            time.sleep(0.002)   # the local generation is the mtime in ns: make sure it moves
            self.inner.write_replace(layout.LATEST, f"{self.to}\n".encode())
        return result


def test_latest_is_written_with_a_precondition_on_what_it_replaces(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    advance_latest(storage, 3)
    racing = RacingStorage(storage, to=7)
    # Our read saw 3; the other publisher moved it to 7; a blind write would set 5.
    assert advance_latest(racing, 5) == 7
    assert racing.raced == 1 and latest_generation(storage) == 7
    # The bare CAS refuses a stale generation, which is what makes the above safe.
    _, generation = storage.read_versioned(layout.LATEST)
    storage.write_replace(layout.LATEST, b"8\n")
    with pytest.raises(PreconditionFailed):
        storage.write_if_generation(layout.LATEST, b"9\n", generation)
    assert latest_generation(storage) == 8


def test_latest_race_that_it_wins_after_rereading(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    advance_latest(storage, 3)
    racing = RacingStorage(storage, to=4)   # moved to 4, we publish 6: we still win, on the reread
    assert advance_latest(racing, 6) == 6 and latest_generation(storage) == 6


def test_broken_latest_is_one_clear_error_not_overwritten(tmp_path, capsys):
    storage = lake_with_windows(tmp_path / "lake", [1])
    storage.write_replace(layout.LATEST, b"garbage")
    with pytest.raises(RegistryError, match="LATEST: expected a generation number"):
        advance_latest(storage, 2)
    assert storage.read(layout.LATEST) == b"garbage"
    status, err = run_main(["--root", str(tmp_path / "lake")], capsys)
    assert status == 2
    assert err.count("\n") == 1 and "LATEST: expected a generation number, got 'garbage'" in err, err


# --- the lease ----------------------------------------------------------------------------

def test_second_trainer_is_refused_naming_the_holder_then_takes_over_after_expiry(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    clock = Clock()
    first = TrainerLease(storage, 60, clock=clock)
    mine = first.acquire()
    assert mine.expires == clock.now + 60
    second = TrainerLease(storage, 60, clock=clock)
    clock.now += 30
    with pytest.raises(LeaseHeld) as refused:
        second.acquire()
    message = str(refused.value)
    assert first.holder in message and "expires" in message and "(in 30 s)" in message, message
    assert layout.TRAINER_LEASE in message

    first.renew()                      # renewed at +30: now expires at +90
    clock.now += 45                    # +75: still held
    with pytest.raises(LeaseHeld):
        second.acquire()
    clock.now += 20                    # +95: expired
    taken = second.acquire()
    assert taken.holder == second.holder
    with pytest.raises(LeaseLost, match=second.holder):
        first.renew()
    with pytest.raises(LeaseLost):
        first.check()                  # the trainer's step-call boundary sees it too
    first.release()                    # a lost lease is not released over the new holder
    record, _ = second.read()
    assert record.holder == second.holder and not record.released


def test_takeover_is_conditional_on_the_generation_read(tmp_path, monkeypatch):
    storage = open_storage(str(tmp_path / "lake"))
    clock = Clock()
    TrainerLease(storage, 10, clock=clock).acquire()
    clock.now += 11                    # expired: two trainers race to take it
    late, early = TrainerLease(storage, 10, clock=clock), TrainerLease(storage, 10, clock=clock)
    real_read = late.read

    def read_then_lose_the_race():
        result = real_read()
        if not early.record:
            time.sleep(0.002)
            early.acquire()            # between late's read and its conditional write
        return result

    monkeypatch.setattr(late, "read", read_then_lose_the_race)
    with pytest.raises(LeaseHeld, match=early.holder):
        late.acquire()
    record, _ = early.read()
    assert record.holder == early.holder


def test_release_lets_the_next_trainer_in_at_once_and_renewal_thread_extends(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    first = TrainerLease(storage, 1.0)
    first.acquire()
    expires = first.record.expires
    first.start_renewing()             # every 0.25 s
    time.sleep(0.8)
    first.check()
    assert first.record.expires > expires + 0.4
    first.release()
    record, _ = first.read()
    assert record.released and record.holder == first.holder
    assert TrainerLease(storage, 1.0).acquire()


def test_a_dead_trainer_on_this_host_is_taken_over_at_once(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lease = TrainerLease(storage, 60)
    now = time.time()
    ghost = LeaseRecord(holder=f"{lease.host}:{dead.pid}:dead", host=lease.host, pid=dead.pid,
                        acquired=now, renewed=now, expires=now + 60)
    storage.write_if_generation(layout.TRAINER_LEASE, ghost.to_bytes(), 0)
    assert lease.acquire().holder == lease.holder
    # The same record on another host must be waited out.
    other = LeaseRecord(holder="elsewhere:1:x", host="elsewhere", pid=dead.pid,
                        acquired=now, renewed=now, expires=now + 60)
    _, generation = storage.read_versioned(layout.TRAINER_LEASE)
    storage.write_if_generation(layout.TRAINER_LEASE, other.to_bytes(), generation)
    with pytest.raises(LeaseHeld, match="elsewhere:1:x"):
        TrainerLease(storage, 60).acquire()


def test_lease_on_fake_gcs_server_enforces_preconditions(fake_gcs):
    storage = fake_gcs.storage
    clock = Clock(time.time())
    first = TrainerLease(storage, 60, clock=clock)
    first.acquire()
    second = TrainerLease(storage, 60, clock=clock)
    with pytest.raises(LeaseHeld, match=first.holder):
        second.acquire()
    first.renew()
    # A writer holding a stale generation is refused by the server itself.
    _, generation = storage.read_versioned(layout.TRAINER_LEASE)
    first.renew()
    with pytest.raises(PreconditionFailed):
        storage.write_if_generation(layout.TRAINER_LEASE, b"{}", generation)
    clock.now += 61
    assert second.acquire().holder == second.holder
    with pytest.raises(LeaseLost, match=second.holder):
        first.renew()
    second.release()
    record, _ = second.read()
    assert record.released
    assert TrainerLease(storage, 60, clock=clock).acquire()


def test_second_trainer_process_is_refused_with_one_line_before_tensorflow(tmp_path):
    root = tmp_path / "lake"
    storage = lake_with_windows(root, [1])
    holder = TrainerLease(storage, 60)        # this (live) test process holds the lease
    holder.acquire()
    events = tmp_path / "events.jsonl"
    code = ("import sys, json\nfrom model.train import main\n"
            f"rc = main({['--root', str(root), '--events', str(events)]!r})\n"
            "print(json.dumps([rc, 'tensorflow' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    rc, imported_tf = json.loads(done.stdout.strip().splitlines()[-1])
    assert (rc, imported_tf) == (2, False), done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and holder.holder in lines[0] and "expires" in lines[0], done.stderr
    assert [e["event"] for e in read_events(str(events))] == ["started", "stopped"]
    record, _ = holder.read()
    assert record.holder == holder.holder and not record.released   # the refused one wrote nothing


# --- choosing windows ------------------------------------------------------------------------

def window(generation):
    return Window(generation, 9, (f"w{generation}",), 100, layout.window_manifest(generation))


def test_plan_trains_the_newest_and_skips_the_rest():
    scan = WindowScan(good=(window(1), window(2), window(3), window(5)), bad=(Skipped(4, "bad manifest"),
                                                                             Skipped(6, "bad too")))
    plan = plan_next(scan, latest=1)
    assert plan.window.target_generation == 5 and not plan.resume
    assert [s.generation for s in plan.skipped] == [2, 3, 4, 6]
    assert [s.generation for s in plan.skipped_below()] == [2, 3, 4]
    assert "superseded" in plan.skipped[0].reason and plan.skipped[2].reason == "bad manifest"
    # A window being trained is finished first, even when newer ones appeared.
    plan = plan_next(scan, latest=1, current=3)
    assert plan.window.target_generation == 3 and plan.resume
    assert [s.generation for s in plan.skipped_below()] == [2]
    # ...unless LATEST passed it meanwhile: then it is stale and never published.
    plan = plan_next(scan, latest=3, current=2)
    assert plan.window.target_generation == 5 and not plan.resume
    assert any(s.generation == 2 and "stale" in s.reason for s in plan.skipped)
    assert plan_next(scan, latest=5).window is None


@pytest.mark.parametrize("data, field", [
    (b"{not json", "not valid JSON"),
    (json.dumps({"version": 99, "target_generation": 2, "board_size": 9, "shards": ["a"],
                 "positions": 5}).encode(), "field 'version': is 99"),
    (json.dumps({"version": 1, "target_generation": 2, "board_size": 9, "record_version": 4,
                 "shards": ["shard-missing.tfrecord.gz"], "positions": 5, "game_table": "a-games.table.gz"}).encode(),
     "field 'shards'"),
])
def test_bad_manifest_is_one_clear_error_in_one_shot_mode(tmp_path, capsys, data, field):
    root = tmp_path / "lake"
    storage = lake_with_windows(root, [1])
    write_bad_manifest(storage, 2, data)
    status, err = run_main(["--root", str(root)], capsys)
    assert status == 2
    assert err.count("\n") == 1, err
    assert storage.url(layout.window_manifest(2)) in err and field in err, err
    assert not storage.exists(layout.TRAINER_LEASE)   # refused before taking the lease


# --- the CLI in follow mode -------------------------------------------------------------------

def wait_for(predicate, process, timeout=120.0, what=""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if process.poll() is not None:
            raise AssertionError(f"trainer exited ({process.returncode}) while waiting for {what}: "
                                 + process.stdout.read()[-3000:])
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def events_named(path, name):
    return [e for e in read_events(str(path)) if e["event"] == name]


def test_follow_trains_the_newest_window_records_skips_and_stops_on_sigterm(tmp_path):
    root = tmp_path / "lake"
    storage = lake_with_windows(root, [1, 2])
    write_bad_manifest(storage, 3, b"{not json")
    events = tmp_path / "events.jsonl"
    process = subprocess.Popen(train_command(root, "--follow", "--poll-seconds", "0.2", "--events", str(events)),
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: events_named(events, "published"), process, what="the first publish")
        # A newer window appears (4; 3 stays bad): the trainer moves on to it.
        synthetic.write_synthetic_window(storage, target_generation=4, board_size=9, positions=64,
                                         shards=1, seed=4)
        wait_for(lambda: len(events_named(events, "published")) == 2, process, what="the second publish")
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, out[-3000:]
    assert [e["generation"] for e in events_named(events, "published")] == [2, 4]
    assert [e["generation"] for e in events_named(events, "window_started")] == [2, 4]
    skipped = {e["generation"]: e["reason"] for e in events_named(events, "window_skipped")}
    assert sorted(skipped) == [1, 3], skipped
    assert "superseded" in skipped[1] and "field" not in skipped[1]
    assert storage.url(layout.window_manifest(3)) in skipped[3] and "not valid JSON" in skipped[3]
    assert len(events_named(events, "window_skipped")) == 2           # each recorded once
    assert out.count("skipping window 000003") == 1, out[-3000:]      # ...and logged once
    assert events_named(events, "lease_acquired")[0]["holder"] in out
    assert events_named(events, "stopped")[-1]["reason"] == "SIGTERM"
    progress = events_named(events, "progress")
    assert progress and {"loss", "policy_loss", "value_loss", "accuracy", "examples_per_s"} <= set(progress[0])
    assert "loss" in out and "step 4/4" in out                       # the human lines are unchanged
    metadata = [json.loads(storage.read(layout.model_manifest(g)))["metadata"] for g in (2, 4)]
    assert metadata[0]["skipped_windows"] == [{"generation": 1, "reason": skipped[1]}]
    assert metadata[1]["skipped_windows"] == [{"generation": 3, "reason": skipped[3]}]
    # Each publish quantized the int8 CPU copy on the window's own positions and checked it
    # (published or not, the figures are recorded; a failure to quantize would have no figures).
    for generation, entry in zip((2, 4), (m["cpu_int8"] for m in metadata)):
        assert "policy_kl" in entry and 0 < entry["calibration_positions"] <= 64, entry
        files = json.loads(storage.read(layout.model_manifest(generation)))["files"]
        assert (layout.CPU_INT8_XML in files) == entry["written"]
    assert latest_generation(storage) == 4
    record = LeaseRecord.from_bytes(storage.read(layout.TRAINER_LEASE), "lease")
    assert record.released
    assert not storage.exists(layout.model_manifest(1)) and not storage.exists(layout.model_manifest(3))


def test_a_trainer_whose_lease_is_taken_stops_without_publishing(tmp_path):
    root = tmp_path / "lake"
    storage = lake_with_windows(root, [1])
    command = train_command(root, "--follow", "--lease-seconds", "2", "--steps-per-window", "100000",
                            "--log-every", "2")
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in process.stdout:
            if "window 000001 step" in line:
                break
        now = time.time()
        thief = LeaseRecord("thief:1:x", "thief", 1, now, now, now + 600)
        storage.write_replace(layout.TRAINER_LEASE, thief.to_bytes())
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 3, out[-3000:]
    assert "lost the trainer lease" in out and "thief:1:x" in out, out[-3000:]
    assert not storage.exists(layout.model_manifest(1)) and latest_generation(storage) is None
    assert LeaseRecord.from_bytes(storage.read(layout.TRAINER_LEASE), "lease").holder == "thief:1:x"


def test_a_publish_killed_before_latest_moved_is_completed_not_retrained(tmp_path):
    root = tmp_path / "lake"
    storage = lake_with_windows(root, [1])
    publish_model(storage, 1, fake_model_dir(tmp_path), {"board_size": 9, "global_step": 7})
    storage.delete(layout.LATEST)      # the publisher died after the manifest, before LATEST
    events = tmp_path / "events.jsonl"
    done = subprocess.run(train_command(root, "--events", str(events)), cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "moved LATEST to 1" in done.stdout and latest_generation(storage) == 1
    assert [(e["generation"], e["step"]) for e in events_named(events, "published")] == [(1, 7)]
    assert not events_named(events, "window_started")   # nothing was trained again


def test_sigterm_mid_window_saves_a_checkpoint_releases_the_lease_and_exits_0(tmp_path):
    root = tmp_path / "lake"
    storage = lake_with_windows(root, [1])
    events = tmp_path / "events.jsonl"
    command = train_command(root, "--follow", "--steps-per-window", "100000", "--checkpoint-every", "100000",
                            "--events", str(events))
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in process.stdout:
            if "window 000001 step" in line:
                break
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, out[-3000:]
    assert "checkpoint" in out and "at window step" in out, out[-3000:]
    assert storage.exists(layout.checkpoint_file("checkpoint"))
    assert events_named(events, "stopped")[-1]["reason"] == "SIGTERM"
    assert LeaseRecord.from_bytes(storage.read(layout.TRAINER_LEASE), "lease").released
    assert not storage.exists(layout.model_manifest(1))


def test_a_trainer_holds_no_more_dataset_functions_after_many_windows_than_after_one(tmp_path):
    """Each window's tf.data pipeline registers its functions with TensorFlow's eager context and
    lives on in reference cycles: without a full collection per window a following trainer held
    every window's pipeline until Python's rare full collection (about 0.3 MB a window in a soak)."""
    from tensorflow.python.eager import context

    from model.cycle import TrainingRun
    from model.config import CLI
    from model.sgd import resolve_strategy
    from model.windows import read_window

    root = tmp_path / "lake"
    storage = lake_with_windows(root, [1, 2, 3, 4, 5])
    config, _ = CLI.parse(train_command(root)[3:])
    run = TrainingRun(config, storage, 9, resolve_strategy(config))
    held = []
    for generation in (1, 2, 3, 4, 5):
        run.trainer.start_window(generation, 4)
        assert run.train_window(read_window(storage, generation, 9))
        held.append(len(context.context().list_function_names()))
    assert held[1:] == [held[1]] * 4, held
