"""Window retention (pipeline.retention): which windows go, in what order, and recovery.

The rule under test: a window whose generation is <= models/LATEST is
finished and may be deleted beyond the newest K; a window newer than LATEST
(one a checkpoint may still read) never is.  Deletion removes the manifest
first, so a reader looking at any moment sees a whole window or none (never
a manifest naming a missing shard), and a crash mid-delete leaves a
manifest-less folder that the next run deletes.

Windows are written with testdata.synthetic_windows (real shards, in the
lake layout); LATEST with format.registry.advance_latest.  Each behaviour
runs on a local root and on gs:// (gcp-storage-emulator, which implements
listing and deletes; see tests/gcs_emulators.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from cloud.base import NotFound, ObjectInfo, StorageError
from cloud.storage import open_storage
from format import layout
from format.window_manifest import read_window_manifest
from format.registry import advance_latest
from model.windows import plan_next, scan_windows
from pipeline.config import ShuffleConfig, window_argv
from pipeline.retention import KEEP_ALL, apply_retention, plan_retention
from pipeline.shuffle import main as shuffle_main, retain_windows
from testdata.random_games import engine_game
from testdata.synthetic_windows import write_run_config, write_synthetic_window
from tests.pipeline.support import write_chunk

BOARD = 9


WINDOW_OBJECTS = 5
"""Objects of one window make_lake writes: 3 shards, the game table and the manifest."""


def make_lake(storage, generations, latest):
    write_run_config(storage, board_size=BOARD)
    for generation in generations:
        write_synthetic_window(storage, target_generation=generation, board_size=BOARD, positions=6,
                               shards=3, seed=generation)
    if latest is not None:
        advance_latest(storage, latest)
    return storage


def present(storage) -> dict[int, int]:
    """Generation -> objects left under windows/<gen>/."""
    counts: dict[int, int] = {}
    for info in storage.list(layout.windows_prefix()):
        generation = layout.window_generation(info.path)
        counts[generation] = counts.get(generation, 0) + 1
    return counts


@pytest.fixture(params=["local", "gcs"])
def lake(request, tmp_path):
    """An empty lake root: a local folder, or a fresh gs:// prefix on the emulator."""
    if request.param == "local":
        return open_storage(str(tmp_path / "lake"))
    return request.getfixturevalue("gcs_emulator").storage


# ---- the decision (pure) ------------------------------------------------------

def listing(folders):
    """ObjectInfos for {generation: complete?}: two shards each, plus the manifest if complete."""
    infos = []
    for generation, complete in folders.items():
        infos += [ObjectInfo(layout.shard_path(generation, f"s{i}.tfrecord.gz"), 10) for i in range(2)]
        if complete:
            infos.append(ObjectInfo(layout.window_manifest(generation), 1))
    return infos


def test_plan_keeps_the_newest_k_finished_and_never_an_open_window():
    folders = {1: True, 2: True, 3: False, 4: True, 5: True, 6: True, 7: False}
    plan = plan_retention(listing(folders), latest=5, keep=2)
    assert plan.kept == (4, 5)                   # the newest two finished windows
    assert plan.delete == (1, 2)                 # older finished windows
    assert plan.leftovers == (3,)                # finished, no manifest: an interrupted delete
    assert plan.open == (6, 7)                   # newer than LATEST: untouched, complete or not
    # K larger than the finished windows: nothing to delete but leftovers.
    assert plan_retention(listing(folders), latest=5, keep=10).delete == ()
    # K = 1: only the newest finished window stays, however many open ones exist.
    assert plan_retention(listing(folders), latest=5, keep=1).kept == (5,)


def test_plan_before_any_model_and_with_retention_off():
    folders = {1: True, 2: True, 3: False}
    before = plan_retention(listing(folders), latest=None, keep=1)
    assert before.delete == before.leftovers == () and before.open == (1, 2, 3)
    off = plan_retention(listing(folders), latest=3, keep=KEEP_ALL)
    assert off.delete == off.leftovers == ()
    with pytest.raises(ValueError, match="keep must be >= 0"):
        plan_retention(listing(folders), latest=3, keep=-1)


def test_keep_windows_flag_validation():
    assert ShuffleConfig(root="x").keep_windows == 2
    assert ShuffleConfig(root="x", keep_windows=0).keep_windows == KEEP_ALL
    with pytest.raises(ValueError, match="--keep-windows: must be >= 0"):
        ShuffleConfig(root="x", keep_windows=-1)


# ---- deleting, local and gs:// -------------------------------------------------

def test_deletes_finished_windows_beyond_k_and_never_one_newer_than_latest(lake):
    make_lake(lake, [1, 2, 3, 4, 5], latest=3)
    result = apply_retention(lake, keep=1)
    assert result.deleted == (1, 2)
    assert result.objects_deleted == 2 * WINDOW_OBJECTS
    assert present(lake) == {3: WINDOW_OBJECTS, 4: WINDOW_OBJECTS, 5: WINDOW_OBJECTS}
    assert "deleted finished windows 000001, 000002" in result.describe()
    # The trainer's view is unchanged: windows 4 and 5 are still whole candidates.
    scan = scan_windows(lake, BOARD, newer_than=3)
    assert [w.target_generation for w in scan.good] == [4, 5] and scan.bad == ()
    assert plan_next(scan, latest=3, current=4).window.target_generation == 4   # the checkpoint's window resumes
    # A second run has nothing left to do.
    assert apply_retention(lake, keep=1).deleted == ()


def test_a_deleted_window_takes_its_claim_with_it(lake):
    # Every window a follower makes leaves its claim: kept for good, they grew with the number
    # of windows (the soak check found one object a window).  A kept or open window keeps its claim.
    make_lake(lake, [1, 2, 3, 4], latest=3)
    for generation in (1, 2, 3, 4):
        lake.write_new(layout.window_claim(generation), b"{}")
    assert apply_retention(lake, keep=1).deleted == (1, 2)
    assert [lake.exists(layout.window_claim(g)) for g in (1, 2, 3, 4)] == [False, False, True, True]


def test_an_open_window_survives_any_k(lake):
    make_lake(lake, [1, 2], latest=1)           # window 2: newer than LATEST, a checkpoint may read it
    for keep in (1, 5):
        apply_retention(lake, keep=keep)
        assert present(lake) == {1: WINDOW_OBJECTS, 2: WINDOW_OBJECTS}
    assert apply_retention(lake, keep=KEEP_ALL).describe().startswith("retention: off")


class CrashingStorage:
    """Forwards to a storage; the ``crash_after``-th delete from now raises, and
    after every delete ``check`` looks at the lake as a concurrent reader would."""

    def __init__(self, inner, crash_after=None, check=None):
        self.inner, self.crash_after, self.check, self.deletes = inner, crash_after, check, []

    def delete(self, path, *, missing_ok=False):
        if self.crash_after is not None and len(self.deletes) == self.crash_after:
            raise StorageError(f"simulated crash before deleting {path}")
        self.inner.delete(path, missing_ok=missing_ok)
        self.deletes.append(path)
        if self.check:
            self.check()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_reader_never_trusts_a_half_deleted_window(lake):
    make_lake(lake, [1, 2], latest=2)
    seen = []

    def reader():
        # What the shuffle job and the trainer do: read the manifest with every shard checked.
        try:
            read_window_manifest(lake, 1, check_shards=True)
            seen.append("whole")
        except NotFound:
            seen.append("gone")              # no manifest: ignored as incomplete
        # A ManifestError (a manifest naming a missing shard) would propagate and fail the test.

    wrapped = CrashingStorage(lake, check=reader)
    assert apply_retention(wrapped, keep=1).deleted == (1,)
    assert wrapped.deletes[0] == layout.window_manifest(1)       # the manifest goes first
    assert seen == ["gone"] * (WINDOW_OBJECTS + 1)                 # each object, then the window's claim
    assert present(lake) == {2: WINDOW_OBJECTS}


@pytest.mark.parametrize("crash_after", [0, 1, 3])
def test_a_crash_mid_delete_is_finished_by_the_next_run(lake, crash_after):
    make_lake(lake, [1, 2, 3], latest=3)
    with pytest.raises(StorageError, match="simulated crash"):
        apply_retention(CrashingStorage(lake, crash_after=crash_after), keep=1)
    left = present(lake)
    assert left[3] == WINDOW_OBJECTS             # the kept window is never touched
    if crash_after >= 1:
        # The manifest of the first window went first: what is left of it is not a window.
        assert not lake.exists(layout.window_manifest(1))
        assert 1 not in [w.target_generation for w in scan_windows(lake, BOARD, newer_than=None).good]
    result = apply_retention(lake, keep=1)
    assert present(lake) == {3: WINDOW_OBJECTS}
    if crash_after >= 1:
        assert result.plan.leftovers == (1,) and "interrupted deletes 000001" in result.describe()


def test_the_shuffle_command_applies_retention(lake, capsys):
    """`python -m pipeline.shuffle` deletes finished windows and says so (here the
    target window already exists, so no Beam job runs); --keep-windows is a flag."""
    make_lake(lake, [1, 2, 3, 4], latest=3)      # target = LATEST + 1 = 4: already complete
    root = lake.url("")
    assert shuffle_main(["--root", root, "--keep-windows", "2", "--playout-labels", "random"]) == 0
    out = capsys.readouterr().out
    assert "window 4 already has a manifest" in out
    assert f"retention: deleted finished windows 000001 ({WINDOW_OBJECTS} objects" in out
    assert present(lake) == {2: WINDOW_OBJECTS, 3: WINDOW_OBJECTS, 4: WINDOW_OBJECTS}
    with pytest.raises(SystemExit) as exc:
        shuffle_main(["--root", root, "--keep-windows", "-1"])
    assert exc.value.code == 2 and "--keep-windows: must be >= 0" in capsys.readouterr().err


def test_retention_runs_after_the_job_writes_a_window(tmp_path, capsys):
    """The real Beam job (in-process runner) builds window LATEST + 1, then deletes
    the finished windows beyond K.  Random playout labels: LATEST here is only the
    pointer (no model files), as retention reads nothing else of the registry."""
    root = str(tmp_path / "lake")
    lake = make_lake(open_storage(root), [1, 2], latest=2)
    write_chunk(root, 1, [engine_game(np.random.default_rng(4), BOARD, generation=1) for _ in range(3)], 0)
    assert shuffle_main(["--root", root, "--workers", "1", "--playout-labels", "random", "--keep-windows", "1",
                         "--random-playouts", "4", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "retention: deleted finished windows 000001" in out
    assert "open (newer than LATEST 2, never deleted): 000003" in out
    assert sorted(present(lake)) == [2, 3]
    assert read_window_manifest(lake, 3, check_shards=True).positions > 0


def test_a_follower_passes_k_to_the_job_it_starts():
    """--follow builds each window with a child `python -m pipeline.shuffle` whose flags
    come from window_argv: K must reach it, so retention runs after every window."""
    argv = window_argv(ShuffleConfig(root="lake", keep_windows=5, follow=True))
    assert argv[argv.index("--keep-windows") + 1] == "5"
    assert "--follow" not in argv


def test_a_storage_error_in_retention_is_a_warning_not_a_failed_job(tmp_path, capsys):
    lake = make_lake(open_storage(str(tmp_path / "lake")), [1, 2, 3], latest=3)
    assert retain_windows(ShuffleConfig(root=lake.url(""), keep_windows=1), CrashingStorage(lake, 0)) is None
    assert "warning: window retention stopped (simulated crash" in capsys.readouterr().err
    assert retain_windows(ShuffleConfig(root=lake.url(""), keep_windows=1), lake).deleted == (1, 2)
