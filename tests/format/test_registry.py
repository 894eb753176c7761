"""format.registry: publish a model, load it back verified, refuse tampering.

A tiny network is exported with model.export into a local lake; the loaded
model must compute what the Keras model computes, a corrupted file must be
refused with an error naming it, and a generation is never republished.
"""

import numpy as np
import pytest
import tensorflow as tf

from format import layout
from format.registry import (AlreadyPublished, ModelIntegrityError, is_published, latest_generation, publish_model,
                             read_manifest)
from inference.model_files import load_model
from cloud.storage import open_storage
from format import schema
from model.export import export_inference_model
from model.config import NetworkConfig
from model.network import build_network

VARIABLES_FILE = "variables/variables.data-00000-of-00001"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(network config, keras model, local SavedModel dir) for a tiny 9x9 net."""
    config = NetworkConfig(board_size=9, blocks=1, filters=8, global_pool_every=1,
                           global_pool_channels=4, value_hidden=8)
    model = build_network(config)
    local = str(tmp_path_factory.mktemp("export") / "model")
    export_inference_model(config, [w.numpy() for w in model.weights], local)
    return config, model, local


def random_planes(rng, batch, n):
    planes = (rng.random((batch, n, n, schema.BASIC_INPUT_PLANES)) < 0.3).astype(np.float32)
    planes[..., 16] = rng.integers(0, 2, size=(batch, 1, 1))
    return planes


def test_published_model_loads_and_matches_the_keras_model(tmp_path, exported):
    config, model, local = exported
    storage = open_storage(str(tmp_path / "lake"))
    assert latest_generation(storage) is None
    manifest = publish_model(storage, 1, local, {"board_size": 9})
    assert latest_generation(storage) == 1
    assert set(manifest.files) >= {"saved_model.pb", VARIABLES_FILE}

    loaded = load_model(storage, 1, cache_dir=str(tmp_path / "cache"))
    assert (loaded.generation, loaded.board_size) == (1, 9)
    planes = random_planes(np.random.default_rng(0), 5, 9)
    out = loaded(planes)
    assert out["policy_logits"].shape == (5, 82)
    assert out["value"].shape == (5,) and out["score"].shape == (5,)
    assert out["ownership"].shape == (5, 81)
    assert np.all(np.abs(out["value"]) <= 1) and np.all(np.abs(out["ownership"]) <= 1)
    reference = model(planes, training=False)
    for name in ("policy_logits", "value", "ownership", "score"):
        np.testing.assert_allclose(out[name], np.asarray(reference[name]), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"\[B, 9, 9, 17\]"):
        loaded(np.zeros((1, 19, 19, 17), np.float32))


def fake_export(folder, weights: bytes) -> str:
    """A folder shaped like a SavedModel (what publish_model uploads; nothing here loads it)."""
    (folder / "variables").mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"graph")
    (folder / "variables" / "data").write_bytes(weights)
    return str(folder)


def test_a_late_publisher_never_overwrites_a_published_generations_files(tmp_path, monkeypatch):
    """A trainer that lost its lease checked before its export that generation 5 was not published;
    the new holder then published it.  Its uploads used to replace the published files (its manifest
    write then failed), so every worker refused generation 5's sha256.  Files are create-only now."""
    from format import registry
    from inference import model_files

    storage = open_storage(str(tmp_path / "lake"))
    first = fake_export(tmp_path / "first", b"weights of the lease holder")
    late = fake_export(tmp_path / "late", b"weights of the trainer that lost its lease")
    publish_model(storage, 5, first, {"board_size": 9})
    real_is_published = registry.is_published
    checks = []

    def stale_first_check(storage, generation):   # the late publisher's check came before the publish
        checks.append(generation)
        return len(checks) > 1 and real_is_published(storage, generation)

    monkeypatch.setattr(registry, "is_published", stale_first_check)
    with pytest.raises(AlreadyPublished, match="000005/variables/data belongs to generation 5"):
        publish_model(storage, 5, late, {"board_size": 9})
    monkeypatch.undo()
    local, _ = model_files.fetch_model_files(storage, 5, str(tmp_path / "cache"))   # every sha256 still matches
    assert open(f"{local}/variables/data", "rb").read() == b"weights of the lease holder"

    # The commit hook (the trainer's lease renewal) can stop a publish before its manifest.
    def lease_lost():
        raise RuntimeError("lease lost")

    with pytest.raises(RuntimeError, match="lease lost"):
        publish_model(storage, 6, late, {"board_size": 9}, before_commit=lease_lost)
    assert not is_published(storage, 6) and latest_generation(storage) == 5
    publish_model(storage, 6, first, {"board_size": 9})      # its files were leftovers: replaced
    assert storage.read(layout.model_file(6, "variables/data")) == b"weights of the lease holder"


def test_corrupted_file_is_refused_naming_the_file(tmp_path, exported):
    _, _, local = exported
    storage = open_storage(str(tmp_path / "lake"))
    publish_model(storage, 2, local, {"board_size": 9})
    remote = layout.model_file(2, VARIABLES_FILE)
    data = bytearray(storage.read(remote))
    data[len(data) // 2] ^= 0xFF
    storage.write_replace(remote, bytes(data))
    with pytest.raises(ModelIntegrityError, match="variables.data-00000-of-00001") as info:
        load_model(storage, 2, cache_dir=str(tmp_path / "cache"))
    assert info.value.path == remote


def test_tampered_cache_is_detected_and_refetched(tmp_path, exported):
    _, _, local = exported
    storage = open_storage(str(tmp_path / "lake"))
    publish_model(storage, 3, local, {"board_size": 9})
    cache = tmp_path / "cache"
    load_model(storage, 3, cache_dir=str(cache))
    cached = cache / "000003" / "saved_model.pb"
    cached.write_bytes(b"not a saved model")
    loaded = load_model(storage, 3, cache_dir=str(cache))  # re-downloads the bad copy
    assert cached.read_bytes() == storage.read(layout.model_file(3, "saved_model.pb"))
    assert loaded(np.zeros((1, 9, 9, 17), np.float32))["value"].shape == (1,)


def test_a_generation_is_never_republished_and_latest_only_moves_forward(tmp_path, exported):
    _, _, local = exported
    storage = open_storage(str(tmp_path / "lake"))
    # Leftovers of an interrupted publish (no manifest) do not count as published.
    storage.write_new(layout.model_file(5, "saved_model.pb"), b"partial")
    assert not is_published(storage, 5)
    first = publish_model(storage, 5, local, {"board_size": 9, "note": "first"})
    with pytest.raises(AlreadyPublished, match="000005"):
        publish_model(storage, 5, local, {"board_size": 9, "note": "second"})
    assert read_manifest(storage, 5) == first and first.metadata["note"] == "first"
    publish_model(storage, 4, local, {"board_size": 9})
    assert latest_generation(storage) == 5
    assert storage.read(layout.LATEST).strip() == b"5"
