"""Compare-and-swap on one object (``read_versioned`` + ``write_if_generation``),
the primitive under LATEST, the trainer's lease and window claims.

Run against a local folder and against fake-gcs-server (the emulator that
enforces generation preconditions), with racing writers: of two writers that
read the same generation, exactly one wins.
"""
from __future__ import annotations

import os
import threading

import pytest

from cloud.base import TEMP_MARKER, PreconditionFailed, TooLarge
from cloud.storage import NotFound, open_storage


@pytest.fixture(params=["local", "fake-gcs"])
def lake(request, tmp_path):
    if request.param == "local":
        return open_storage(str(tmp_path / "lake"))
    return request.getfixturevalue("fake_gcs").storage


def test_create_only_then_compare_and_swap(lake):
    with pytest.raises(NotFound):
        lake.read_versioned("cluster/lease")
    first = lake.write_if_generation("cluster/lease", b"one", 0)
    assert first > 0
    with pytest.raises(PreconditionFailed):
        lake.write_if_generation("cluster/lease", b"again", 0)          # exists now
    data, generation = lake.read_versioned("cluster/lease")
    assert (data, generation) == (b"one", first)
    second = lake.write_if_generation("cluster/lease", b"two", first)
    assert second > first
    with pytest.raises(PreconditionFailed):
        lake.write_if_generation("cluster/lease", b"stale", first)      # a writer that read 'one'
    assert lake.read_versioned("cluster/lease") == (b"two", second)


def test_of_racing_writers_exactly_one_wins(lake):
    lake.write_if_generation("meta/head", b"0\n", 0)
    rounds, writers = 5, 4
    for _ in range(rounds):
        _, generation = lake.read_versioned("meta/head")
        wins, barrier = [], threading.Barrier(writers)

        def write(k):
            barrier.wait()
            try:
                lake.write_if_generation("meta/head", f"{k}\n".encode(), generation)
                wins.append(k)
            except PreconditionFailed:
                pass

        threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(wins) == 1
        assert lake.read("meta/head") == f"{wins[0]}\n".encode()


def test_a_deleted_object_takes_its_lock_file_and_create_only_races_still_have_one_winner(tmp_path):
    # Claims are written conditionally and deleted with their window: their lock files must go
    # too, or one stays for every window ever made.  Deleting a lock file that racing writers
    # wait on must not let two of them hold "the" lock at once.
    lake = open_storage(str(tmp_path / "lake"))
    folder = lake.url("claims")
    for _ in range(20):
        wins, barrier = [], threading.Barrier(5)

        def create(k):
            barrier.wait()
            try:
                lake.write_if_generation("claims/window", f"{k}\n".encode(), 0)
                wins.append(k)
            except PreconditionFailed:
                pass

        def remove():
            barrier.wait()
            lake.delete("claims/window", missing_ok=True)

        threads = [threading.Thread(target=create, args=(k,)) for k in range(4)]
        threads.append(threading.Thread(target=remove))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # One create wins, or two when the delete fell between them; never more, never none.
        assert len(wins) in (1, 2), wins
        if lake.exists("claims/window"):
            assert lake.read("claims/window") in {f"{k}\n".encode() for k in wins}
        lake.delete("claims/window", missing_ok=True)
        assert not os.path.exists(folder) or not os.listdir(folder), os.listdir(folder)   # no lock file left


def test_plain_writes_move_the_generation_too(lake):
    lake.write_new("claims/a", b"x")
    _, generation = lake.read_versioned("claims/a")
    lake.delete("claims/a")
    lake.write_new("claims/a", b"y")
    with pytest.raises(PreconditionFailed):
        lake.write_if_generation("claims/a", b"z", generation)


def test_a_bounded_read_refuses_a_larger_object_without_reading_it_whole(lake):
    lake.write_new("docs/big.json", b"x" * 5000)
    assert lake.read("docs/big.json", max_bytes=5000) == b"x" * 5000
    with pytest.raises(TooLarge, match="larger than 4,999 bytes") as err:
        lake.read("docs/big.json", max_bytes=4999)
    assert "docs/big.json" in str(err.value)
    generation = lake.write_if_generation("cluster/lease", b"y" * 300, 0)
    assert lake.read_versioned("cluster/lease", max_bytes=300) == (b"y" * 300, generation)
    with pytest.raises(TooLarge) as err:
        lake.read_versioned("cluster/lease", max_bytes=299)
    assert err.value.generation == generation   # so a damaged record can still be replaced by CAS


def test_a_conditional_write_that_cannot_write_names_the_object(tmp_path):
    """What the lease, the claims and LATEST meet on a broken disk: a StorageError
    naming the object, never a raw OSError (tests run as root, where a chmod stops
    no write, so each case is something in the way that stops root too)."""
    from cloud.base import StorageError

    lake = open_storage(str(tmp_path / "lake"))
    lake.write_new("cluster", b"a file where the folder should be")
    lake.write_new("meta/x", b"x")
    os.makedirs(lake.url("claims/lease"))                                   # a folder at the object's name
    os.makedirs(os.path.join(lake.url("locks"), f"{TEMP_MARKER}lock-head"))  # a folder at its lock file's
    for path, why in (("cluster/lease", "a file is where a folder should be"),
                      ("claims/lease", "a folder is in the way"), ("locks/head", "Is a directory")):
        with pytest.raises(StorageError, match=why) as caught:
            lake.write_if_generation(path, b"new", 0)
        assert type(caught.value) is StorageError and caught.value.url == lake.url(path), caught.value
        assert lake.url(path) in str(caught.value)
