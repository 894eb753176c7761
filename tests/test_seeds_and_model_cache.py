"""Two data-losing or data-exposing faults, each reproduced and then shown fixed.

* The model cache: ``--model-cache ROOT/games`` deleted every chunk folder
  (``clear_cache`` removed any all-digit entry of the folder it was given),
  and the default cache sat at a predictable shared path that followed
  symlinks.  Now a cache deletes only the generation folders it created,
  refuses foreign folders and symlinks, and its default is a private 0700
  folder removed on exit.
* The shared seed: the default ``--seed`` was 0, so every worker played the
  same games.  Now the default seed comes from the OS's entropy, each game
  has its own stream, and the record carries that stream's seed so the game
  can be replayed.
"""
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cloud.storage import open_storage
from format import layout
from format import registry
from format import schema
from format.codec import read_chunk
from selfplay.config import WorkerConfig
from selfplay.worker import SelfPlayWorker, game_seed

REPO = Path(__file__).resolve().parents[1]


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


# ---- the model cache ------------------------------------------------------

def test_a_cache_pointed_at_lake_folders_deletes_nothing(tmp_path):
    other_lake = tmp_path / "other"
    chunks = make_lake_folders(other_lake)
    cache = registry.ModelCache(str(other_lake / layout.GAMES_DIR))
    registry.clear_cache(cache, keep_generations={7})          # the call that used to delete them
    registry.clear_cache(str(other_lake / layout.GAMES_DIR), keep_generations={7})
    assert all(chunk.read_bytes() == b"a week of self-play" for chunk in chunks)
    with pytest.raises(registry.ModelCacheError, match="not created by the model cache"):
        cache.generation_dir(1)                                  # nor does it write into them
    assert all(chunk.read_bytes() == b"a week of self-play" for chunk in chunks)


def test_the_cache_removes_only_generations_it_created(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    for generation in (1, 2):
        publish_fake_model(storage, generation, tmp_path)
    cache = registry.ModelCache(str(tmp_path / "cache"))
    first, _ = registry.fetch_model_files(storage, 1, cache)
    second, _ = registry.fetch_model_files(storage, 2, cache)
    stranger = tmp_path / "cache" / "000009"
    stranger.mkdir()
    (stranger / "keep").write_text("not the cache's")
    registry.clear_cache(cache, keep_generations={2})
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
    first, second = registry.ModelCache(), registry.ModelCache()
    assert first.directory != second.directory                  # not a predictable shared path
    assert stat.S_IMODE(os.stat(first.directory).st_mode) == 0o700
    local, _ = registry.fetch_model_files(storage, 1, first)
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
    with pytest.raises(registry.ModelCacheError, match="symlink"):
        registry.ModelCache(str(tmp_path / "linked-cache"))
    cache = registry.ModelCache(str(tmp_path / "cache"))
    os.symlink(outside, tmp_path / "cache" / layout.generation_dir(1))
    with pytest.raises(registry.ModelCacheError, match="symlink"):
        registry.fetch_model_files(storage, 1, cache)
    os.unlink(tmp_path / "cache" / layout.generation_dir(1))
    generation_dir = cache.generation_dir(1)
    os.symlink(outside, os.path.join(generation_dir, "variables"))
    with pytest.raises(registry.ModelCacheError, match="symlink"):
        registry.fetch_model_files(storage, 1, cache)
    assert list(outside.iterdir()) == []                         # nothing landed outside


def test_a_group_writable_cache_folder_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(registry.ModelCacheError, match="writable by group or others"):
        registry.ModelCache(str(shared))


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
        registry.fetch_model_files(storage, 1, registry.ModelCache(str(tmp_path / "cache")))


# ---- seeds ----------------------------------------------------------------

def worker_config(root, **overrides):
    settings = dict(root=str(root), board_size=9, games=4, visits=4, fast_visits=2, leaves_per_game=2,
                    full_search_fraction=0.5, max_games=4, chunk_games=100, progress_seconds=60.0,
                    spool_dir=str(root) + "-spool")   # beside the lake, not under ~/.local/state
    settings.update(overrides)
    return WorkerConfig(**settings)


def play(config):
    storage = open_storage(config.root)
    worker = SelfPlayWorker(config, storage)
    worker.run(None)
    return [game for info in storage.list(layout.GAMES_DIR + "/") for game in read_chunk(storage.read(info.path), info.path)]


def test_default_seeds_differ_and_two_workers_play_different_games(tmp_path):
    first, second = worker_config(tmp_path / "a"), worker_config(tmp_path / "b")
    assert first.seed != second.seed and 0 <= first.seed < 2 ** 63
    games = play(first) + play(second)
    assert len(games) >= 8
    moves = {tuple(game.moves.tolist()) for game in games}
    assert len(moves) == len(games), "two games are identical move for move"


def test_each_game_records_its_seed_and_replays_from_it(tmp_path, monkeypatch):
    games = play(worker_config(tmp_path / "a", seed=1234, generation0_playouts=0))
    assert [g.seed for g in games] and all(g.seed >= 0 for g in games)
    assert len({g.seed for g in games}) == len(games)
    assert {g.seed for g in games} <= {game_seed(1234, serial) for serial in range(len(games) + 4)}
    # Replay it in another worker with another seed, in whatever slots: every
    # game there gets the recorded seed.  Same seed, same (uniform) network,
    # same game, move for move.  (Generation 0's default random playouts draw
    # from the worker's stream, not the game's, so this plays it uniform.)
    target = games[-1]
    import selfplay.worker as worker_module
    monkeypatch.setattr(worker_module, "game_seed", lambda worker_seed, serial: target.seed)
    replayed = play(worker_config(tmp_path / "b", seed=99, max_games=2, generation0_playouts=0))
    assert len(replayed) >= 2 and all(g.seed == target.seed for g in replayed)
    for again in replayed:
        np.testing.assert_array_equal(again.moves, target.moves)
        np.testing.assert_array_equal(again.full_search, target.full_search)
        assert again.resign_enabled == target.resign_enabled


def test_seed_flag_is_validated():
    with pytest.raises(ValueError, match="--seed"):
        WorkerConfig(root="lake", seed=-5)
