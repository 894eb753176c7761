"""The local backend keeps no empty folders once their objects are deleted, and a write whose folder a
concurrent delete prunes makes it again."""

import os

from cloud.local import LocalStorage


def test_a_delete_removes_the_folders_it_leaves_empty_up_to_the_root(tmp_path):
    root = tmp_path / "lake"
    storage = LocalStorage(str(root))
    storage.write_new("tmp/shuffle-000001-a/parts/00000/b0.npz", b"x")
    storage.write_new("tmp/shuffle-000001-a/parts/00001/b0.npz", b"x")
    storage.write_new("tmp/shuffle-000001-a/shards/00000/c0.npz", b"x")
    storage.delete("tmp/shuffle-000001-a/parts/00000/b0.npz")
    assert sorted(os.listdir(root / "tmp/shuffle-000001-a/parts")) == ["00001"]
    storage.delete("tmp/shuffle-000001-a/parts/00001/b0.npz")
    assert os.listdir(root / "tmp/shuffle-000001-a") == ["shards"]
    storage.delete("tmp/shuffle-000001-a/shards/00000/c0.npz")
    assert os.listdir(root) == []                      # the root itself stays
    storage.delete("tmp/shuffle-000001-a/shards/00000/c0.npz", missing_ok=True)
    assert os.listdir(root) == []


def test_a_write_whose_folder_a_concurrent_delete_prunes_makes_it_again(tmp_path, monkeypatch):
    """Another process's delete may remove the (empty) folder between this writer's makedirs and open."""
    import cloud.local

    storage = LocalStorage(str(tmp_path / "lake"))
    real_open = os.open
    pruned = []

    def open_after_a_prune(path, flags, mode=0o777):
        folder = os.path.dirname(path)
        if not pruned and os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)
            pruned.append(folder)
        return real_open(path, flags, mode)

    monkeypatch.setattr(cloud.local.os, "open", open_after_a_prune)
    storage.write_new("tmp/probe-w1", b"probe")
    assert pruned and storage.read("tmp/probe-w1") == b"probe"


def test_a_stop_that_lands_as_the_temp_file_is_created_leaves_no_temp_file(tmp_path, monkeypatch):
    """SIGTERM's handler runs right after the C call it interrupted: when that call is the open that
    created the temp file, Terminated rises before the writer holds the file's descriptor.  A shuffle
    job stopped so left its piece's temp file in the attempt's folder, which its clean-up does not list."""
    import cloud.local
    from processes.sigterm import Terminated

    storage = LocalStorage(str(tmp_path / "lake"))
    storage.write_new("tmp/a/kept.npz", b"x")
    real_open = os.open

    def open_then_stopped(path, flags, mode=0o777):
        os.close(real_open(path, flags, mode))
        raise Terminated

    monkeypatch.setattr(cloud.local.os, "open", open_then_stopped)
    for write in (lambda: storage.write_new("tmp/a/b1.npz", b"y"),
                  lambda: storage.write_replace("tmp/a/b2.npz", b"y", durable=False)):
        try:
            write()
        except Terminated:
            pass
        else:
            raise AssertionError("the write went on past the stop")
    assert os.listdir(tmp_path / "lake/tmp/a") == ["kept.npz"]


def test_a_write_the_full_disk_refuses_leaves_no_folder_it_made(tmp_path, monkeypatch):
    """A shuffle job retried every 30 s on a full disk, and each try left its tmp/shuffle-* chain."""
    import errno

    import cloud.local
    from cloud.base import StorageError

    storage = LocalStorage(str(tmp_path / "lake"))
    storage.write_new("tmp/other/kept.npz", b"x")
    real_open = os.open

    def full(path, flags, mode=0o777):
        if os.path.basename(path).startswith(".zl-tmp-"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_open(path, flags, mode)

    monkeypatch.setattr(cloud.local.os, "open", full)
    for write in (storage.write_new, storage.write_replace):
        try:
            write("tmp/shuffle-000003-a1/parts/00000/b000001.npz", b"y")
        except StorageError as exc:
            assert "No space left" in str(exc)
        else:
            raise AssertionError("the write succeeded on a full disk")
        assert sorted(os.listdir(tmp_path / "lake/tmp")) == ["other"]
