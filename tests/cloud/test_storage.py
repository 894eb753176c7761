"""Storage interface on the local backend: semantics, path rules, and the
whole-object promise under racing writers and killed writers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import pickle
import signal
import subprocess
import sys
import threading
import time

import pytest

from cloud.base import TEMP_MARKER, RetryPolicy, validate_path
from cloud.gcs import GcsStorage
from cloud.local import LocalStorage
from cloud.storage import AlreadyExists, NotFound, ObjectInfo, StorageError, open_storage

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def lake(tmp_path):
    return open_storage(str(tmp_path / "lake"))


def test_round_trip_list_and_delete(lake, tmp_path):
    lake.write_new("data/000001/b.bin", b"bb")
    lake.write_new("data/000001/a.bin", b"a")
    lake.write_new("data/000002/c.bin", b"")
    lake.write_new("settings.json", b"{}")

    assert lake.read("data/000001/b.bin") == b"bb"
    assert lake.read("data/000002/c.bin") == b""
    assert lake.exists("settings.json") and not lake.exists("data/000001/zzz")
    assert not lake.exists("data/000001")  # a directory is not an object
    assert lake.list() == [ObjectInfo("data/000001/a.bin", 1), ObjectInfo("data/000001/b.bin", 2),
                           ObjectInfo("data/000002/c.bin", 0), ObjectInfo("settings.json", 2)]
    assert lake.url("settings.json") == str(tmp_path / "lake" / "settings.json")
    assert lake.url("") == str(tmp_path / "lake")

    lake.delete("data/000001/a.bin")
    assert [i.path for i in lake.list("data/")] == ["data/000001/b.bin", "data/000002/c.bin"]
    with pytest.raises(NotFound, match="data/000001/a.bin"):
        lake.read("data/000001/a.bin")
    with pytest.raises(NotFound, match="data/000001/a.bin"):
        lake.delete("data/000001/a.bin")
    lake.delete("data/000001/a.bin", missing_ok=True)


def test_list_uses_string_prefixes_and_tolerates_a_missing_root(lake, tmp_path):
    assert open_storage(str(tmp_path / "nowhere")).list() == []
    for path in ("data/000001/x", "data/000010/y", "data/000100/z", "datax/w", "meta/head"):
        lake.write_new(path, b"1")
    assert [i.path for i in lake.list("data/0000")] == ["data/000001/x", "data/000010/y"]
    assert [i.path for i in lake.list("data")] == ["data/000001/x", "data/000010/y",
                                                   "data/000100/z", "datax/w"]
    assert [i.path for i in lake.list("data/000100/")] == ["data/000100/z"]
    assert lake.list("other/") == []


def test_write_new_never_overwrites(lake):
    lake.write_new("meta/000001/index.json", b"first")
    with pytest.raises(AlreadyExists) as caught:
        lake.write_new("meta/000001/index.json", b"second")
    assert caught.value.url == lake.url("meta/000001/index.json")
    assert "meta/000001/index.json" in str(caught.value)
    assert isinstance(caught.value, StorageError)
    assert lake.read("meta/000001/index.json") == b"first"
    assert not _temp_files(lake.url(""))


def test_write_replace_creates_and_replaces(lake):
    lake.write_replace("meta/head", b"1\n")
    lake.write_replace("meta/head", b"2\n")
    assert lake.read("meta/head") == b"2\n"
    assert lake.list() == [ObjectInfo("meta/head", 2)]
    assert not _temp_files(lake.url(""))


@pytest.mark.parametrize("bad", ["", "/abs", "a/", "a//b", "../x", "a/../b", "./a", "a\\b",
                                 f"data/{TEMP_MARKER}x", "a\nb"])
def test_bad_paths_are_refused_before_touching_disk(lake, bad):
    with pytest.raises(ValueError, match="storage path"):
        lake.write_new(bad, b"x")
    with pytest.raises(ValueError):
        lake.read(bad)
    assert lake.list() == []


def test_bad_prefixes_are_refused(lake):
    for bad in ("/x", "../", "a//"):
        with pytest.raises(ValueError):
            lake.list(bad)
    assert validate_path("data/000001/x.tfrecord.zst") == "data/000001/x.tfrecord.zst"


def test_open_storage_forms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = open_storage("lake")
    assert isinstance(relative, LocalStorage) and relative.root_url == str(tmp_path / "lake")
    assert open_storage(f"file://{tmp_path}/lake").root_url == str(tmp_path / "lake")
    gcs = open_storage("gs://my-bucket/runs/r1/")
    assert isinstance(gcs, GcsStorage)
    assert gcs.root_url == "gs://my-bucket/runs/r1"
    assert gcs.url("meta/head") == "gs://my-bucket/runs/r1/meta/head"
    assert open_storage("gs://my-bucket").url("settings.json") == "gs://my-bucket/settings.json"
    for bad, message in [("", "non-empty"), ("s3://b/x", "unsupported"), ("gs://B_ad/x", "bucket"),
                         ("gs://bucket/a/../b", "'..'"), ("file://otherhost/x", "remote host")]:
        with pytest.raises(ValueError, match=message):
            open_storage(bad)


def test_missing_google_credentials_give_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    with pytest.raises(StorageError, match="no Google credentials found for gs://my-bucket/p"):
        open_storage("gs://my-bucket/p").exists("settings.json")


def test_storages_pickle_to_their_root(lake):
    lake.write_new("x", b"1")
    assert pickle.loads(pickle.dumps(lake)).read("x") == b"1"
    gcs = open_storage("gs://my-bucket/p", retry=RetryPolicy(max_attempts=2))
    clone = pickle.loads(pickle.dumps(gcs))
    assert clone.root_url == "gs://my-bucket/p" and clone.retry_policy == RetryPolicy(max_attempts=2)


def test_retry_policy_validates_and_bounds_sleeps():
    policy = RetryPolicy(initial_delay_s=0.5, multiplier=2.0, max_delay_s=3.0)
    assert [policy.max_sleep_after(k) for k in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]
    for bad in (dict(max_attempts=0), dict(initial_delay_s=-1), dict(multiplier=0.5),
                dict(deadline_s=0), dict(request_timeout_s=-2)):
        with pytest.raises(ValueError, match="RetryPolicy"):
            RetryPolicy(**bad)


def test_retry_flags_build_a_policy_and_name_bad_flags():
    import argparse

    from cloud.storage import add_retry_flags, retry_policy_from_args

    parser = argparse.ArgumentParser()
    add_retry_flags(parser)
    assert retry_policy_from_args(parser.parse_args([])) == RetryPolicy()
    args = parser.parse_args(["--storage-max-attempts", "3", "--storage-deadline-s", "9.5"])
    assert retry_policy_from_args(args) == RetryPolicy(max_attempts=3, deadline_s=9.5)
    with pytest.raises(ValueError, match=re.escape("--storage-max-attempts must be in [1, 1000], got 0")):
        retry_policy_from_args(parser.parse_args(["--storage-max-attempts", "0"]))


def test_data_must_be_bytes(lake):
    with pytest.raises(TypeError, match="must be bytes, got str"):
        lake.write_new("x", "text")
    lake.write_new("y", bytearray(b"ok"))
    assert lake.read("y") == b"ok"


def test_local_copy_downloads_a_directory(lake, tmp_path):
    lake.write_new("meta/000003/saved_model.pb", b"graph")
    lake.write_new("meta/000003/variables/variables.index", b"index")
    lake.write_new("meta/000030/other", b"no")
    written = lake.local_copy("meta/000003/", str(tmp_path / "copy"))
    assert written == [str(tmp_path / "copy" / "saved_model.pb"),
                       str(tmp_path / "copy" / "variables" / "variables.index")]
    assert (tmp_path / "copy" / "variables" / "variables.index").read_bytes() == b"index"
    assert not _temp_files(str(tmp_path / "copy"))
    with pytest.raises(NotFound, match="meta/000009"):
        lake.local_copy("meta/000009/", str(tmp_path / "none"))


# --- temp files and crashes --------------------------------------------------

def _temp_files(root: str) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.startswith(TEMP_MARKER)]


def test_a_crash_remnant_is_invisible_and_removable(lake):
    """What a writer killed between the temp write and the link leaves behind:
    a temp file beside the object's name.  It is no object."""
    lake.write_new("data/000001/done", b"complete")
    directory = os.path.dirname(lake.url("data/000001/done"))
    remnant = os.path.join(directory, f"{TEMP_MARKER}chunk.1234.abcdef")
    with open(remnant, "wb") as f:
        f.write(b"half a chu")

    assert lake.list() == [ObjectInfo("data/000001/done", 8)]
    assert not lake.exists("data/000001/chunk")
    with pytest.raises(NotFound):
        lake.read("data/000001/chunk")
    lake.write_new("data/000001/chunk", b"the whole chunk")  # the name is still free
    assert lake.read("data/000001/chunk") == b"the whole chunk"

    assert lake.remove_stale_temp_files(older_than_s=3600) == 0  # young: may be a live writer's
    os.utime(remnant, (time.time() - 7200, time.time() - 7200))
    assert lake.remove_stale_temp_files(older_than_s=3600) == 1
    assert not _temp_files(lake.url(""))


def test_the_stale_temp_file_sweep_follows_links_keeps_locks_and_never_fails(lake, tmp_path, monkeypatch, caplog):
    lake.write_if_generation("meta/head", b"1", 0)                  # leaves the lock file of meta/head
    lake.write_new("data/000001/done", b"x")
    os.rename(lake.url("data/000001"), tmp_path / "disk2")
    os.symlink(tmp_path / "disk2", lake.url("data/000001"))
    os.symlink(lake.url(""), lake.url("data/loop"))                 # a loop: the sweep ends all the same
    os.symlink(tmp_path / "unmounted", lake.url("data/dangling"))   # nothing to sweep there
    remnant = tmp_path / "disk2" / f"{TEMP_MARKER}done.1.abc"
    remnant.write_bytes(b"half")
    old = time.time() - 7200
    for path in [remnant, *_temp_files(lake.url("meta"))]:
        os.utime(path, (old, old))
    [lock] = _temp_files(lake.url("meta"))

    def unlink_refused(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    with monkeypatch.context() as patched:
        patched.setattr(os, "unlink", unlink_refused)
        caplog.set_level("WARNING", logger="cloud.base")
        assert lake.remove_stale_temp_files(older_than_s=3600) == 0   # reported, kept, never raised
    swept = os.path.join(lake.url("data/000001"), remnant.name)   # found under the lake's name for it
    assert [r.getMessage() for r in caplog.records if repr(swept) in r.getMessage()] == [
        f"cannot remove the stale temp file {swept!r} (Permission denied); kept"], caplog.text
    assert lake.remove_stale_temp_files(older_than_s=3600) == 1
    assert not remnant.exists() and os.path.exists(lock)            # a lock file is never swept
    assert lake.write_if_generation("meta/head", b"2", lake.read_versioned("meta/head")[1]) > 0


_KILLED_WRITER = """
import sys
from cloud.storage import open_storage
lake = open_storage(sys.argv[1])
size = int(sys.argv[2])
for i in range(100000):
    lake.write_new(f"chunks/{i:05d}", bytes([i % 251]) * size)
"""


def test_a_killed_writer_leaves_only_whole_objects(lake):
    size = 2 << 20
    writer = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, lake.url(""), str(size)], cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 30
        while len(lake.list("chunks/")) < 3 and time.monotonic() < deadline:
            assert writer.poll() is None, "writer died on its own"
            time.sleep(0.01)
        time.sleep(0.013)  # land the kill at an arbitrary point of a write
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()

    listed = lake.list("chunks/")
    assert len(listed) >= 3
    for info in listed:
        index = int(info.path.rsplit("/", 1)[1])
        assert info.size == size, f"{info.path} is partial"
        assert lake.read(info.path) == bytes([index % 251]) * size
    assert [info.path for info in listed] == [f"chunks/{i:05d}" for i in range(len(listed))]


_RACER = """
import json, os, sys, time
from cloud.storage import AlreadyExists, open_storage
root, writer, count, size, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
lake = open_storage(root)
payloads = [bytes([writer]) * size + f"{writer}:{i}".encode() for i in range(count)]
while not os.path.exists(go):
    time.sleep(0.0005)
wins = []
for i in range(count):
    try:
        lake.write_new(f"race/{i:03d}", payloads[i])
        wins.append(i)
    except AlreadyExists:
        pass
print(json.dumps(wins))
"""


def test_racing_writers_exactly_one_wins_each_object(lake, tmp_path):
    count, size = 40, 64 << 10
    go = tmp_path / "go"
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, lake.url(""), str(w), str(count), str(size), str(go)],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True) for w in (1, 2)]
    time.sleep(0.5)  # both interpreters up and spinning on the go file
    go.write_text("go")
    wins = {}
    for writer, racer in zip((1, 2), racers):
        out, _ = racer.communicate(timeout=60)
        assert racer.returncode == 0
        wins[writer] = set(json.loads(out))

    assert wins[1] | wins[2] == set(range(count))
    assert not wins[1] & wins[2], "two writers both created the same object"
    for i in range(count):
        winner = 1 if i in wins[1] else 2
        assert lake.read(f"race/{i:03d}") == bytes([winner]) * size + f"{winner}:{i}".encode()
    assert len(lake.list("race/")) == count
    assert not _temp_files(lake.url(""))


# --- stray names, links and special files: skipped or refused, listing and reading agree


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_a_stray_name_is_skipped_and_reported_once(lake, caplog):
    """A listing yields only paths that read and delete accept: a name they refuse
    is skipped, with one warning naming it however often the lake is listed."""
    lake.write_new("data/000001/ok", b"1")
    folder = lake.url("data/000001")
    stray = [os.path.join(folder, "a\\b"), os.path.join(folder, "line\nbreak"),
             os.fsdecode(os.path.join(os.fsencode(folder), b"latin-\xe9")),   # bytes that are not UTF-8
             os.path.join(folder, "back\\slash", "inside")]                    # a stray folder: all under it
    for name in stray:
        os.makedirs(os.path.dirname(name), exist_ok=True)
        with open(name, "wb") as f:
            f.write(b"x")
    caplog.set_level("WARNING", logger="cloud.base")
    for _ in range(3):
        assert lake.list() == [ObjectInfo("data/000001/ok", 1)]
        assert lake.list("data/000001/") == [ObjectInfo("data/000001/ok", 1)]
    warned = _warnings(caplog)
    for name in stray[:3] + [os.path.dirname(stray[3])]:
        assert sum(repr(name) in line for line in warned) == 1, (name, warned)
    assert len(warned) == 4, warned
    assert all("no object path" in line and "rename or remove it" in line for line in warned)
    for info in lake.list():                # what is listed can be read and deleted
        lake.read(info.path)
        lake.delete(info.path)
    assert all(os.path.exists(name) for name in stray)   # strays are never touched


def test_links_are_followed_by_every_listing(lake, tmp_path):
    """A folder moved to another disk and linked back (the whole ``data/``, or one
    generation of it) lists, reads and deletes as if it were in place."""
    for path in ("data/000001/a", "data/000001/b", "data/000002/c", "meta/head"):
        lake.write_new(path, path.encode())
    whole = lake.list()
    other_disk = tmp_path / "disk2"
    other_disk.mkdir()
    for moved in ("data", "data/000001"):      # each case from the original layout
        real = other_disk / moved.replace("/", "-")
        os.rename(lake.url(moved), real)
        os.symlink(real, lake.url(moved))
        assert lake.list() == whole
        assert lake.list("data/") == [i for i in whole if i.path.startswith("data/")]
        assert lake.list("data/000001/") == [i for i in whole if i.path.startswith("data/000001/")]
        assert lake.read("data/000001/a") == b"data/000001/a" and lake.exists("data/000001/b")
        os.unlink(lake.url(moved))
        os.rename(real, lake.url(moved))
    os.rename(lake.url("data/000001"), other_disk / "g1")
    os.symlink(other_disk / "g1", lake.url("data/000001"))
    lake.delete("data/000001/a")
    lake.delete("data/000001/b")               # the folder it empties is the link's target: the link stays
    assert os.path.islink(lake.url("data/000001")) and os.listdir(other_disk / "g1") == []
    assert [i.path for i in lake.list()] == ["data/000002/c", "meta/head"]
    os.symlink(lake.url("meta/head"), lake.url("data/000002/d"))   # a linked file is an object too
    assert lake.read("data/000002/d") == b"meta/head" and len(lake.list("data/")) == 2


def test_a_link_loop_is_skipped_and_reported_once(lake, caplog):
    lake.write_new("data/000001/a", b"a")
    os.symlink(lake.url(""), lake.url("data/000001/root"))     # to the root
    os.symlink("..", lake.url("data/000001/up"))               # to its parent
    caplog.set_level("WARNING", logger="cloud.base")
    for _ in range(2):
        assert lake.list() == [ObjectInfo("data/000001/a", 1)]
        assert lake.list("data/000001/") == [ObjectInfo("data/000001/a", 1)]
    warned = _warnings(caplog)
    assert len(warned) == 2 and all("(a loop)" in line for line in warned), warned


def test_a_dangling_link_is_an_error_never_an_empty_listing(lake, tmp_path):
    """``data/`` linked to a disk that is not mounted hides every object under it."""
    lake.write_new("meta/head", b"1")
    os.symlink(tmp_path / "unmounted", lake.url("data"))
    for prefix in ("", "data/", "data/000001/"):
        with pytest.raises(StorageError, match="data: a link to .*unmounted, which does not exist"):
            lake.list(prefix)
    assert lake.list("meta/") == [ObjectInfo("meta/head", 1)]


@contextlib.contextmanager
def unblocked_after(fifo: str, seconds: float = 20.0):
    """After ``seconds``, keep ending any read that waits on ``fifo`` (it gets EOF), so
    that a read which hangs fails its test instead of hanging the run."""
    done = threading.Event()

    def unblock():
        done.wait(seconds)
        while not done.wait(0.2):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:     # no reader waiting
                pass

    threading.Thread(target=unblock, daemon=True).start()
    try:
        yield
    finally:
        done.set()


def test_a_fifo_is_no_object_and_never_blocks_a_read(lake):
    lake.write_new("data/000001/a", b"a")
    os.mkfifo(lake.url("data/000001/pipe"))
    assert lake.list() == [ObjectInfo("data/000001/a", 1)] and not lake.exists("data/000001/pipe")
    with unblocked_after(lake.url("data/000001/pipe")):
        for read in (lake.read, lake.read_versioned):
            with pytest.raises(StorageError, match="pipe: a FIFO, not a regular file"):
                read("data/000001/pipe")
    with pytest.raises(NotFound, match="a folder"):
        lake.read("data/000001")


def test_a_file_where_a_folder_should_be(lake):
    """An object store lists nothing under an object's name; a write under it is a
    StorageError naming the object, never an OSError."""
    lake.write_new("data", b"x")
    assert lake.list("data/") == [] and lake.list("data") == [ObjectInfo("data", 1)]
    for write in (lambda p: lake.write_new(p, b"y"), lambda p: lake.write_replace(p, b"y"),
                  lambda p: lake.write_if_generation(p, b"y", 0)):
        with pytest.raises(StorageError, match="data/000001/a") as caught:
            write("data/000001/a")
        assert type(caught.value) is StorageError and caught.value.url == lake.url("data/000001/a")
    with pytest.raises(NotFound):
        lake.read("data/000001/a")
