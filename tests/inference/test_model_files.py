"""The model cache (inference.model_files): ``--model-cache ROOT/games`` once deleted every chunk folder
(``clear_cache`` removed any all-digit entry of the folder it was given), and the default cache sat at
a predictable shared path that followed symlinks.  Now a cache deletes only the generation folders it
created, refuses foreign folders and symlinks, and its default is a private 0700 folder removed on exit.
"""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cloud.storage import open_storage
from format import layout
from format import registry
from format import schema
from inference import model_files

REPO = Path(__file__).resolve().parents[2]


def publish_fake_model(storage, generation, tmp_path):
    """A 'model' of two plain files: the cache never needs TensorFlow to fetch."""
    local = tmp_path / f"export{generation}"
    (local / "variables").mkdir(parents=True)
    (local / "saved_model.pb").write_bytes(b"graph %d" % generation)
    (local / "variables" / "data").write_bytes(os.urandom(64))
    registry.publish_model(storage, generation, str(local), {"board_size": 9})


def make_lake_folders(root: Path) -> list[Path]:
    """Numbered folders of 'chunks', as games/ of a real lake holds."""
    made = []
    for generation in range(3):
        folder = root / layout.GAMES_DIR / layout.generation_dir(generation)
        folder.mkdir(parents=True)
        chunk = folder / f"w0-0000000000001-00000{generation}{schema.CHUNK_SUFFIX}"
        chunk.write_bytes(b"a week of self-play")
        made.append(chunk)
    return made


def test_a_cache_pointed_at_lake_folders_deletes_nothing(tmp_path):
    other_lake = tmp_path / "other"
    chunks = make_lake_folders(other_lake)
    cache = model_files.ModelCache(str(other_lake / layout.GAMES_DIR))
    model_files.clear_cache(cache, keep_generations={7})          # the call that used to delete them
    model_files.clear_cache(str(other_lake / layout.GAMES_DIR), keep_generations={7})
    assert all(chunk.read_bytes() == b"a week of self-play" for chunk in chunks)
    with pytest.raises(model_files.ModelCacheError, match="not created by the model cache"):
        cache.generation_dir(1)                                  # nor does it write into them
    assert all(chunk.read_bytes() == b"a week of self-play" for chunk in chunks)


def test_the_cache_removes_only_generations_it_created(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    for generation in (1, 2):
        publish_fake_model(storage, generation, tmp_path)
    cache = model_files.ModelCache(str(tmp_path / "cache"))
    first, _ = model_files.fetch_model_files(storage, 1, cache)
    second, _ = model_files.fetch_model_files(storage, 2, cache)
    stranger = tmp_path / "cache" / "000009"
    stranger.mkdir()
    (stranger / "keep").write_text("not the cache's")
    model_files.clear_cache(cache, keep_generations={2})
    assert not os.path.exists(first)
    assert os.path.isfile(os.path.join(second, "saved_model.pb"))
    assert (stranger / "keep").read_text() == "not the cache's"


def test_the_worker_refuses_a_model_cache_inside_its_root(tmp_path):
    chunks = make_lake_folders(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    for cache in (tmp_path / layout.GAMES_DIR, tmp_path / layout.MODELS_DIR):
        proc = subprocess.run(
            [sys.executable, "-m", "selfplay.worker", "--root", str(tmp_path), "--games", "2", "--visits", "4",
             "--fast-visits", "2", "--max-games", "2", "--max-seconds", "10", "--model-cache", str(cache)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "--model-cache" in proc.stderr and "inside the lake root" in proc.stderr
    assert all(chunk.read_bytes() == b"a week of self-play" for chunk in chunks)


def test_the_default_cache_is_private_and_removed_on_close(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    publish_fake_model(storage, 1, tmp_path)
    first, second = model_files.ModelCache(), model_files.ModelCache()
    assert first.directory != second.directory                  # not a predictable shared path
    assert stat.S_IMODE(os.stat(first.directory).st_mode) == 0o700
    local, _ = model_files.fetch_model_files(storage, 1, first)
    assert local.startswith(first.directory)
    first.close()
    second.close()
    assert not os.path.exists(first.directory) and not os.path.exists(second.directory)


def test_the_cache_refuses_symlinks(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    publish_fake_model(storage, 1, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    # A symlinked cache folder, a planted generation link, and a link inside a generation.
    os.symlink(outside, tmp_path / "linked-cache")
    with pytest.raises(model_files.ModelCacheError, match="symlink"):
        model_files.ModelCache(str(tmp_path / "linked-cache"))
    cache = model_files.ModelCache(str(tmp_path / "cache"))
    os.symlink(outside, tmp_path / "cache" / layout.generation_dir(1))
    with pytest.raises(model_files.ModelCacheError, match="symlink"):
        model_files.fetch_model_files(storage, 1, cache)
    os.unlink(tmp_path / "cache" / layout.generation_dir(1))
    generation_dir = cache.generation_dir(1)
    os.symlink(outside, os.path.join(generation_dir, "variables"))
    with pytest.raises(model_files.ModelCacheError, match="symlink"):
        model_files.fetch_model_files(storage, 1, cache)
    assert list(outside.iterdir()) == []                         # nothing landed outside


def test_a_group_writable_cache_folder_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(model_files.ModelCacheError, match="writable by group or others"):
        model_files.ModelCache(str(shared))


def test_a_malformed_manifest_entry_is_a_clear_integrity_error(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    publish_fake_model(storage, 1, tmp_path)
    path = registry.manifest_path(1)
    import json
    manifest = json.loads(storage.read(path))
    manifest["files"]["saved_model.pb"] = "not a dict"
    storage.delete(path)
    storage.write_new(path, json.dumps(manifest).encode())
    with pytest.raises(registry.ModelIntegrityError, match="saved_model.pb"):
        model_files.fetch_model_files(storage, 1, model_files.ModelCache(str(tmp_path / "cache")))


