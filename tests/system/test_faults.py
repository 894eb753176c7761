"""The fault suite: every object kind in a lake, tampered, read by each role that reads it.

One small real lake is built once for the module (worker games through the
worker's own ``main``, a run.json, a synthetic window for the trainer, a tiny
published model via ``model.export``); each case copies it, damages one
object, runs the command that reads that object, and checks the outcome:

* ``error``: exit 2 (1 for ``format.inspect verify``, whose "bad data" status
  is 1) and a line on stderr/stdout naming the object;
* ``skip``: the command succeeds, and says which object it skipped;
* never a traceback, a hang or a silent success.

Entry points run in-process (``main(argv)``) so TensorFlow and Beam are
imported once; "no traceback" is checked on the captured output, because a
traceback in-process is an exception escaping ``main``, which fails the
test by itself.  The roots that cannot be opened (a bucket-less ``gs://``,
an unreachable endpoint, a root that is a file, a broken LATEST) and the GTP
fuzz test are at the end.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable

import numpy as np
import pytest
import tensorflow as tf

from cloud.storage import open_storage
from format import layout
from format.window_manifest import read_window_manifest
from format.registry import publish_model
from model.staging import STATE_FILE
from testdata import synthetic_windows as synthetic

BOARD = 9
MODEL_GENERATION = 1          # published; LATEST names it
TRAIN_WINDOW = 2              # a window the trainer has not trained yet
VARIABLES_FILE = "variables/variables.data-00000-of-00001"


# --------------------------------------------------------------------------
# The lake, built once
# --------------------------------------------------------------------------

def tiny_train_flags() -> list[str]:
    return ["--blocks", "1", "--filters", "8", "--value-hidden", "8", "--batch-size", "16",
            "--steps-per-window", "4", "--steps-per-call", "2", "--log-every", "2",
            "--checkpoint-every", "4", "--warmup-steps", "1", "--shuffle-buffer", "64"]


def worker_flags(root: str, spool: str, *extra: str) -> list[str]:
    return ["--root", root, "--board-size", str(BOARD), "--games", "2", "--visits", "4", "--fast-visits", "2",
            "--max-games", "2", "--max-seconds", "20", "--seed", "1", "--spool-dir", spool,
            "--poll-seconds", "0.2", *extra]


@pytest.fixture(scope="module")
def pristine_lake(tmp_path_factory) -> str:
    """A lake with run.json, two chunks of worker games (generation 0), model 1
    published (LATEST = 1) and window 2 (synthetic, not trained yet)."""
    from model.export import export_inference_model
    from model.config import NetworkConfig
    from model.network import build_network
    from selfplay import worker

    base = tmp_path_factory.mktemp("pristine")
    root = str(base / "lake")
    for run in range(2):
        assert worker.main(worker_flags(root, str(base / f"spool{run}"), "--seed", str(run + 1))) == 0
    storage = open_storage(root)
    assert len(storage.list(layout.games_prefix())) == 2
    config = NetworkConfig(board_size=BOARD, blocks=1, filters=8, global_pool_every=1,
                           global_pool_channels=4, value_hidden=8)
    network = build_network(config)
    exported = str(base / "export")
    export_inference_model(config, [w.numpy() for w in network.weights], exported)
    publish_model(storage, MODEL_GENERATION, exported, {"board_size": BOARD})
    synthetic.write_synthetic_window(storage, target_generation=TRAIN_WINDOW, board_size=BOARD,
                                     positions=64, shards=1, seed=2)
    return root


@pytest.fixture
def lake(pristine_lake, tmp_path) -> str:
    """A private copy of the pristine lake, to damage."""
    root = str(tmp_path / "lake")
    shutil.copytree(pristine_lake, root, symlinks=True)
    return root


# --------------------------------------------------------------------------
# Tampering, one function per object kind
# --------------------------------------------------------------------------

def first_chunk(storage) -> str:
    return sorted(info.path for info in storage.list(layout.games_prefix()))[0]


def only_shard(storage) -> str:
    [shard] = read_window_manifest(storage, TRAIN_WINDOW).shards
    return shard


def _local(storage, path: str) -> str:
    """The file behind ``path`` in a local lake (tampering bypasses the
    storage layer, whose create-only writes would refuse it)."""
    return storage.url(path)


def overwrite(storage, path: str, data: bytes) -> str:
    with open(_local(storage, path), "wb") as handle:
        handle.write(data)
    return path


def flip_byte(storage, path: str, at: float = 0.5) -> str:
    data = bytearray(storage.read(path))
    data[int(len(data) * at)] ^= 0x55
    return overwrite(storage, path, bytes(data))


def garbage_chunk(storage) -> str:
    return overwrite(storage, first_chunk(storage), b"not a chunk at all")


def flip_chunk(storage) -> str:
    return flip_byte(storage, first_chunk(storage))


def flip_shard(storage) -> str:
    return flip_byte(storage, only_shard(storage))


def delete_shard(storage) -> str:
    os.unlink(_local(storage, only_shard(storage)))
    return layout.window_manifest(TRAIN_WINDOW)     # the manifest names the missing shard


def garbage_window_manifest(storage) -> str:
    return overwrite(storage, layout.window_manifest(TRAIN_WINDOW), b'{"version": 1, "shards": [')


def foreign_window_manifest(storage) -> str:
    document = json.loads(storage.read(layout.window_manifest(TRAIN_WINDOW)))
    return overwrite(storage, layout.window_manifest(TRAIN_WINDOW), json.dumps({**document, "version": 99}).encode())


def garbage_model_manifest(storage) -> str:
    return overwrite(storage, layout.model_manifest(MODEL_GENERATION), b"{not json")


def flip_model_file(storage) -> str:
    return flip_byte(storage, layout.model_file(MODEL_GENERATION, VARIABLES_FILE))


def delete_model_file(storage) -> str:
    path = layout.model_file(MODEL_GENERATION, VARIABLES_FILE)
    os.unlink(_local(storage, path))
    return path


def garbage_latest(storage) -> str:
    return overwrite(storage, layout.LATEST, b"garbage")


def non_ascii_latest(storage) -> str:
    return overwrite(storage, layout.LATEST, b"\xff\xfe1\n")


def garbage_run_json(storage) -> str:
    return overwrite(storage, layout.RUN_CONFIG, b"{oops")


def foreign_run_json(storage) -> str:
    document = json.loads(storage.read(layout.RUN_CONFIG))
    return overwrite(storage, layout.RUN_CONFIG, json.dumps({**document, "board_size": 13}).encode())


def float_board_size_run_json(storage) -> str:
    """9.0 == 9, so every role that only compared it accepted it, and the trainer died building a network."""
    document = json.loads(storage.read(layout.RUN_CONFIG))
    return overwrite(storage, layout.RUN_CONFIG, json.dumps({**document, "board_size": 9.0}).encode())


def garbage_checkpoint_state(storage) -> str:
    os.makedirs(_local(storage, layout.CHECKPOINTS_DIR), exist_ok=True)
    return overwrite(storage, layout.checkpoint_file(STATE_FILE), b"model_checkpoint_path: \x00\xff garbage {{{")


def dangling_checkpoint_state(storage) -> str:
    os.makedirs(_local(storage, layout.CHECKPOINTS_DIR), exist_ok=True)
    return overwrite(storage, layout.checkpoint_file(STATE_FILE),
                     b'model_checkpoint_path: "ckpt-7"\nall_model_checkpoint_paths: "ckpt-7"\n')


def _edit_window_manifest(storage, **changes) -> str:
    path = layout.window_manifest(TRAIN_WINDOW)
    document = json.loads(storage.read(path))
    return overwrite(storage, path, json.dumps({**document, **changes}).encode())


def dot_shard_manifest(storage) -> str:
    return _edit_window_manifest(storage, shards=["."], shard_positions={".": 64})


def dotdot_game_table_manifest(storage) -> str:
    return _edit_window_manifest(storage, game_table="..")


def file_for_cluster_folder(storage) -> str:
    with open(_local(storage, layout.CLUSTER_DIR), "wb") as handle:
        handle.write(b"not a folder")
    return layout.TRAINER_LEASE


# --------------------------------------------------------------------------
# Commands, one function per reader: (root, tmp_path) -> exit status
# --------------------------------------------------------------------------

def inspect_verify(root, tmp_path) -> int:
    from format import inspect
    return inspect.main(["verify", root])


def shuffle_once(root, tmp_path) -> int:
    from pipeline import shuffle
    return shuffle.main(["--root", root, "--workers", "1", "--playout-labels", "random", "--random-playouts", "2",
                         "--window-min-positions", "100", "--window-generation", str(TRAIN_WINDOW + 1)])


def shuffle_target_window(root, tmp_path) -> int:
    """The one-shot job asked for the (existing, tampered) window 2."""
    from pipeline import shuffle
    return shuffle.main(["--root", root, "--workers", "1", "--window-generation", str(TRAIN_WINDOW)])


def shuffle_default(root, tmp_path) -> int:
    from pipeline import shuffle
    return shuffle.main(["--root", root, "--workers", "1", "--playout-labels", "random"])


def train(root, tmp_path) -> int:
    from model import train as train_role
    return train_role.main(["--root", root, *tiny_train_flags()])


def gtp_load(root, tmp_path) -> int:
    from arena import gtp
    return gtp.main(["--root", root, "--quiet"])


def match_load(root, tmp_path) -> int:
    from arena import match
    return match.main([f"model:{root}", "random", "--games", "1"])


def worker_run(root, tmp_path) -> int:
    from selfplay import worker
    return worker.main(worker_flags(root, str(tmp_path / "spool"), "--max-seconds", "1.5"))


def model_games(root) -> int:
    """Chunks written for a generation above 0 (the worker must never play the
    published generation's games with a model it could not load, nor generation 0)."""
    storage = open_storage(root)
    return len(storage.list(layout.games_prefix()))


@dataclasses.dataclass(frozen=True)
class Fault:
    name: str
    tamper: Callable
    command: Callable
    outcome: str                  # "error" | "skip" | "wait"
    status: int = 2
    also: str = ""                # another string the output must hold (a field, a count)


FAULTS = [
    # chunk
    Fault("garbage chunk / inspect verify", garbage_chunk, inspect_verify, "error", status=1),
    Fault("flipped chunk / inspect verify", flip_chunk, inspect_verify, "error", status=1),
    Fault("garbage chunk / shuffle", garbage_chunk, shuffle_once, "skip", status=0),
    # shard
    Fault("flipped shard / inspect verify", flip_shard, inspect_verify, "error", status=1),
    Fault("missing shard / train", delete_shard, train, "error", also="shards"),
    # window manifest
    Fault("garbage window manifest / train", garbage_window_manifest, train, "error", also="JSON"),
    Fault("version-99 window manifest / train", foreign_window_manifest, train, "error", also="version"),
    Fault("garbage window manifest / shuffle", garbage_window_manifest, shuffle_target_window, "error"),
    # model manifest
    Fault("garbage model manifest / gtp", garbage_model_manifest, gtp_load, "error"),
    Fault("garbage model manifest / match", garbage_model_manifest, match_load, "error"),
    Fault("garbage model manifest / worker", garbage_model_manifest, worker_run, "wait", status=0),
    # model file
    Fault("flipped model file / gtp", flip_model_file, gtp_load, "error", also="sha256"),
    Fault("missing model file / gtp", delete_model_file, gtp_load, "error", also="missing"),
    Fault("flipped model file / worker", flip_model_file, worker_run, "wait", status=0),
    # LATEST
    Fault("garbage LATEST / shuffle", garbage_latest, shuffle_default, "error"),
    Fault("non-ASCII LATEST / shuffle", non_ascii_latest, shuffle_default, "error", also="non-ASCII"),
    Fault("garbage LATEST / train", garbage_latest, train, "error"),
    Fault("non-ASCII LATEST / train", non_ascii_latest, train, "error", also="non-ASCII"),
    Fault("garbage LATEST / gtp", garbage_latest, gtp_load, "error"),
    Fault("non-ASCII LATEST / worker", non_ascii_latest, worker_run, "wait", status=0),
    # run.json
    Fault("garbage run.json / worker", garbage_run_json, worker_run, "error"),
    Fault("other board size in run.json / worker", foreign_run_json, worker_run, "error", also="board"),
    Fault("garbage run.json / shuffle", garbage_run_json, shuffle_default, "error"),
    Fault("garbage run.json / train", garbage_run_json, train, "error"),
    Fault("board_size 9.0 in run.json / worker", float_board_size_run_json, worker_run, "error", also="board_size"),
    Fault("board_size 9.0 in run.json / shuffle", float_board_size_run_json, shuffle_default, "error",
          also="board_size"),
    Fault("board_size 9.0 in run.json / train", float_board_size_run_json, train, "error", also="board_size"),
    # checkpoint state
    Fault("garbage checkpoint state / train", garbage_checkpoint_state, train, "error"),
    Fault("dangling checkpoint state / train", dangling_checkpoint_state, train, "error"),
    # names the layout never writes, and something in the way of the lease
    Fault("'.' as a shard of the window manifest / train", dot_shard_manifest, train, "error", also="'shards'"),
    Fault("'.' as a shard of the window manifest / shuffle", dot_shard_manifest, shuffle_target_window, "error",
          also="'shards'"),
    Fault("'..' as the window's game table / train", dotdot_game_table_manifest, train, "error",
          also="'game_table'"),
    Fault("a file where the lease's folder should be / train", file_for_cluster_folder, train, "error",
          also="a file is where a folder should be"),
]


@pytest.mark.parametrize("fault", FAULTS, ids=[fault.name for fault in FAULTS])
def test_a_tampered_object_is_named_never_a_traceback(fault, lake, tmp_path, capsys):
    storage = open_storage(lake)
    chunks_before = model_games(lake)
    damaged = fault.tamper(storage)
    status = fault.command(lake, tmp_path)
    out, err = capsys.readouterr()
    output = out + err
    assert "Traceback" not in output, output
    assert status == fault.status, output
    assert storage.url(damaged) in output, f"{storage.url(damaged)} not named in:\n{output}"
    if fault.also:
        assert fault.also in output, output
    if fault.outcome == "skip":
        # Counted and named in the window's manifest, not only in a log line.
        document = read_window_manifest(storage, TRAIN_WINDOW + 1).document
        assert damaged in json.dumps(document["chunks_skipped"]), document["chunks_skipped"]
    if fault.outcome == "wait":
        # The worker said what it rejected, and played nothing without its model.
        assert "no games played" in output, output
        assert model_games(lake) == chunks_before


# --------------------------------------------------------------------------
# A root that cannot be opened: one line naming the root, exit 2, never a traceback
# --------------------------------------------------------------------------

def closed_port() -> int:
    """A local port nothing listens on (connections are refused at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


FAST_STORAGE = ["--storage-max-attempts", "1", "--storage-deadline-s", "2"]


def role_commands(root: str, tmp_path) -> dict[str, list]:
    """Each role's main and argv for ``root``; every one reads the root first."""
    from model import train as train_role
    from pipeline import shuffle
    from arena import gtp, match
    from selfplay import worker

    return {
        "worker": (worker.main, worker_flags(root, str(tmp_path / "spool"), *FAST_STORAGE)),
        "shuffle": (shuffle.main, ["--root", root, "--workers", "1", *FAST_STORAGE]),
        "shuffle --follow": (shuffle.main, ["--root", root, "--follow", "--poll-seconds", "0.1", *FAST_STORAGE]),
        "train": (train_role.main, ["--root", root, *tiny_train_flags(), *FAST_STORAGE]),
        "gtp": (gtp.main, ["--root", root, "--quiet", *FAST_STORAGE]),
        "match": (match.main, [f"model:{root}", "random", "--games", "1", *FAST_STORAGE]),
    }


def run_role(main, argv, capsys) -> tuple[int, str]:
    """(status, everything printed); a usage error's SystemExit counts as its status.
    Signal handlers a role installs (the follower's) are put back afterwards."""
    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    out, err = capsys.readouterr()
    return status, out + err


def assert_one_line_naming(root: str, status: int, output: str) -> None:
    assert "Traceback" not in output, output
    assert status == 2, output
    naming = [line for line in output.splitlines() if root in line]
    assert naming, f"no line names {root}:\n{output}"


ROLES = ["worker", "shuffle", "shuffle --follow", "train", "gtp", "match"]


@pytest.mark.parametrize("root", ["gs://", "gs:///x"])
@pytest.mark.parametrize("role", ROLES)
def test_a_gs_root_without_a_bucket_is_one_line(role, root, tmp_path, capsys):
    main, argv = role_commands(root, tmp_path)[role]
    status, output = run_role(main, argv, capsys)
    assert_one_line_naming(root, status, output)
    assert "bucket" in output


@pytest.mark.parametrize("role", ROLES)
def test_an_unreachable_bucket_is_one_line_and_quick(role, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{closed_port()}")
    root = "gs://zerolake-faults/lake"
    main, argv = role_commands(root, tmp_path)[role]
    started = time.monotonic()
    status, output = run_role(main, argv, capsys)
    assert_one_line_naming(root, status, output)
    assert time.monotonic() - started < 30, "the --storage-* flags did not bound the wait"


def test_a_root_that_is_a_file_is_one_line(tmp_path, capsys):
    from selfplay import worker

    root = tmp_path / "not-a-folder"
    root.write_text("x")
    status, output = run_role(worker.main, worker_flags(str(root), str(tmp_path / "spool")), capsys)
    assert_one_line_naming(str(root), status, output)


# --------------------------------------------------------------------------
# GTP: fuzzed input always gets one answer per command line
# --------------------------------------------------------------------------

def gtp_engine():
    from arena.gtp import GtpConfig, build_engine
    return build_engine(GtpConfig(visits=2, quiet=True))


def fuzz_lines(rng: np.random.Generator) -> list[bytes]:
    """Lines a confused or hostile controller might send (each without its '\\n')."""
    lines = [bytes(rng.integers(0, 256, size=int(rng.integers(1, 200)), dtype=np.uint8)).replace(b"\n", b" ")
             for _ in range(150)]
    lines += [
        "play B é5".encode("latin-1"), "boardsize 9 ÿ".encode("latin-1"),
        "\ufeffname".encode("utf-16"), "genmove b".encode("utf-16-le"),
        b"name\x00", b"\x00\x00\x00", b"play B D4\rgenmove W\r", b"list_commands\r",
        b"komi nan", b"komi 1e308", b"boardsize -1", b"boardsize 99999999999999999999",
        b"play " + b"B " * 2000, b"7 " + b"x" * 3000, b"12345678901234567890 name",
        b"play W " + b"Z9" * 1000, b"genmove", b"\xef\xbb\xbfprotocol_version", b"#only a comment",
        b"clear_board", b"genmove B", b"final_score", b"showboard",
    ]
    rng.shuffle(lines)
    return lines


def test_gtp_fuzz_every_command_line_gets_one_answer():
    import io

    from arena.gtp import serve

    engine = gtp_engine()
    lines = fuzz_lines(np.random.default_rng(13))
    out = io.StringIO()
    serve(engine, io.BytesIO(b"\n".join(lines) + b"\nname\n"), out)
    # A line that is blank once control characters and comments are removed
    # is no command (GTP ignores it); every other line gets one answer.
    commands = sum(1 for line in lines if engine.preprocess(line.decode("utf-8", errors="replace")))
    text = out.getvalue()
    assert text.endswith("\n\n")
    replies = text[:-2].split("\n\n")
    assert len(replies) == commands + 1, text[-2000:]
    assert all(reply[:1] in ("=", "?") for reply in replies), [r for r in replies if r[:1] not in "=?"][:3]
    assert replies[-1] == "= zerolake"          # still answering at the end
    assert "internal error" not in text, [r for r in replies if "internal error" in r][:3]


def _vm_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_gtp_process_memory_stays_bounded_under_100_mb_without_a_newline():
    """The real process over a pipe: its peak RSS grows by < 50 MB while 100 MB
    arrive with no newline, and it answers the next command."""
    engine = subprocess.Popen([sys.executable, "-m", "arena.gtp", "--quiet", "--visits", "2"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    watchdog = threading.Timer(60, engine.kill)     # a hang fails the test, not the run
    watchdog.start()
    try:
        engine.stdin.write(b"name\n")
        engine.stdin.flush()
        assert engine.stdout.readline() == b"= zerolake\n" and engine.stdout.readline() == b"\n"
        baseline = _vm_kib(engine.pid, "VmRSS")
        piece = b"y" * (1 << 20)
        for _ in range(100):
            engine.stdin.write(piece)
        engine.stdin.write(b"\nname\n")
        engine.stdin.flush()
        first = engine.stdout.readline()
        assert first.startswith(b"? command longer than"), first
        assert engine.stdout.readline() == b"\n"
        assert engine.stdout.readline() == b"= zerolake\n"
        growth_mib = (_vm_kib(engine.pid, "VmHWM") - baseline) / 1024
        assert growth_mib < 50, f"peak RSS grew by {growth_mib:.0f} MiB"
        engine.stdin.write(b"quit\n")
        engine.stdin.close()
        assert engine.wait(timeout=10) == 0
    finally:
        watchdog.cancel()
        engine.kill()
        engine.wait()
        engine.stdout.close()
        engine.stderr.close()


# --------------------------------------------------------------------------
# What else a lake may hold (stray names, links, something in the
# way of a write), met by the long-lived roles
# --------------------------------------------------------------------------

def _follower(root: str, tmp_path, *extra: str):
    from tests.pipeline.test_follow import start_follower

    events = str(tmp_path / "follow.jsonl")
    return start_follower(root, events, *extra), events


def _stop_follower(follower, events: str, looks: int = 4) -> str:
    """Let the follower look ``looks`` more times (it must stay alive), SIGTERM it; its stderr."""
    from tests.pipeline.test_follow import stop, wait_for, wait_for_looks

    try:
        wait_for(lambda: os.path.exists(events), "the follower's events", processes=[follower])
        wait_for_looks([events], looks, processes=[follower])
    finally:
        code, _, err = stop(follower)
    assert code == 0, err
    assert "Traceback" not in err, err
    return err


def _stray_file(storage, folder: str, name: str) -> str:
    """A file the storage layer never writes (its name is no object path), made beside its objects."""
    full = os.path.join(_local(storage, folder), name)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as handle:
        handle.write(b"stray")
    return full


def test_a_follower_past_a_manifest_naming_dot_logs_it_once_and_waits(lake, tmp_path):
    """'.' as a shard passed the manifest check and failed a path check later: the follower
    died at every start.  Now the manifest is refused, named once, and the follower waits."""
    storage = open_storage(lake)
    dot_shard_manifest(storage)
    follower, events = _follower(lake, tmp_path)
    err = _stop_follower(follower, events)
    url = storage.url(layout.window_manifest(TRAIN_WINDOW))
    assert err.count(url) == 1 and "field 'shards'" in err, err


def test_a_stray_name_in_a_dead_attempts_folder_does_not_stop_the_follower(lake, tmp_path):
    storage = open_storage(lake)
    dead = layout.job_tmp_dir("shuffle", TRAIN_WINDOW + 1, "dead1")
    storage.write_new(dead + "/parts/00000/b000000.npz", b"x")
    stray = _stray_file(storage, dead, "a\\b")
    follower, events = _follower(lake, tmp_path)
    err = _stop_follower(follower, events)
    assert err.count(repr(stray)) == 1, err                  # named once, however many looks
    assert os.path.exists(stray) and not storage.list(layout.tmp_prefix())   # the dead piece removed


def test_a_stray_name_in_an_old_window_does_not_stop_its_clean_up(tmp_path, caplog):
    from format.registry import advance_latest
    from pipeline.retention import apply_retention

    storage = open_storage(str(tmp_path / "lake"))
    for generation in (1, 2, 3):
        synthetic.write_synthetic_window(storage, target_generation=generation, board_size=BOARD, positions=6,
                                         shards=1, seed=generation)
    advance_latest(storage, 3)
    stray = _stray_file(storage, layout.window_dir(1), "a\\b")
    caplog.set_level("WARNING", logger="cloud.base")
    result = apply_retention(storage, 1)
    assert result.deleted == (1, 2) and result.objects_deleted == 6
    assert sorted({layout.window_generation(i.path) for i in storage.list(layout.windows_prefix())}) == [3]
    assert os.path.exists(stray)
    assert [r.getMessage() for r in caplog.records if repr(stray) in r.getMessage()]


def unicode_digit_window(storage) -> str:
    """A folder ``windows/00000²`` (str.isdigit() says yes; int() refuses it)."""
    return _stray_file(storage, layout.windows_prefix() + "00000\u00b2", layout.MANIFEST)


@pytest.mark.parametrize("command", [train, shuffle_once], ids=["train", "shuffle"])
def test_stray_names_under_windows_are_passed_by(command, lake, tmp_path, capsys, caplog):
    """A folder that is no generation of the layout, and a file no object path names
    beside a window's shards: the trainer and the shuffle job pass them by."""
    storage = open_storage(lake)
    unicode_digit_window(storage)
    stray = _stray_file(storage, layout.window_dir(TRAIN_WINDOW), "a\\b")
    caplog.set_level("WARNING", logger="cloud.base")
    status = command(lake, tmp_path)
    output = "".join(capsys.readouterr())
    assert status == 0 and "Traceback" not in output, output
    assert [r for r in caplog.records if repr(stray) in r.getMessage()]


def test_a_folder_named_with_a_unicode_digit_does_not_stop_the_follower(lake, tmp_path):
    unicode_digit_window(open_storage(lake))
    follower, events = _follower(lake, tmp_path)
    _stop_follower(follower, events)


def test_a_follower_that_cannot_write_its_claim_warns_and_retries(lake, tmp_path):
    """A file where cluster/claims/ should be: the claim's conditional write fails every
    time; the follower says so once and keeps trying (a fixed disk lets it go on)."""
    storage = open_storage(lake)
    in_the_way = _local(storage, layout.window_claim(TRAIN_WINDOW + 1).rsplit("/", 1)[0])
    os.makedirs(os.path.dirname(in_the_way), exist_ok=True)
    with open(in_the_way, "wb") as handle:
        handle.write(b"not a folder")
    follower, events = _follower(lake, tmp_path, "--follow-new-positions", "1")
    err = _stop_follower(follower, events)
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    claim = storage.url(layout.window_claim(TRAIN_WINDOW + 1))
    assert len(warnings) == 1 and claim in warnings[0] and "a file is where a folder should be" in warnings[0], err


@contextlib.contextmanager
def read_only(folder: str):
    """``folder`` bind-mounted read-only onto itself (a disk remounted read-only), or a skip
    where this machine cannot mount: tests run as root, where a chmod stops no write."""
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", folder, folder], capture_output=True).returncode:
        pytest.skip("needs root and mount(8) to make a read-only bind")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", folder], capture_output=True).returncode:
            pytest.skip("this machine cannot remount a bind read-only")
        yield folder
    finally:
        subprocess.run(["umount", folder], capture_output=True)


def test_a_follower_on_a_disk_remounted_read_only_warns_and_retries(lake, tmp_path):
    """Its first writes (deleting a dead attempt's pieces at start-up, then its claim) fail."""
    storage = open_storage(lake)
    dead = layout.job_tmp_dir("shuffle", TRAIN_WINDOW + 1, "dead1") + "/parts/00000/b000000.npz"
    storage.write_new(dead, b"x")
    with read_only(lake):
        follower, events = _follower(lake, tmp_path, "--follow-new-positions", "1")
        err = _stop_follower(follower, events)
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings and all("Read-only file system" in line for line in warnings), err
    assert storage.url(dead) in err and storage.exists(dead)


def test_chunks_under_a_linked_folder_are_the_shuffle_jobs_too(lake, tmp_path, capsys):
    """games/<gen> moved to another disk and linked back (as inspect sees it: tests/format/test_inspect.py)."""
    storage = open_storage(lake)
    chunks = storage.list(layout.games_prefix())
    folder = _local(storage, layout.games_prefix(0).rstrip("/"))
    os.rename(folder, tmp_path / "disk2")
    os.symlink(tmp_path / "disk2", folder)
    assert storage.list(layout.games_prefix()) == chunks
    assert shuffle_once(lake, tmp_path) == 0, "".join(capsys.readouterr())
    document = read_window_manifest(storage, TRAIN_WINDOW + 1).document
    assert document["input"]["chunks_read"] == len(chunks) == 2
