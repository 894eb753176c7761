"""Model registry: published inference models in the lake, how to publish one and find the latest.

A published model's files, ``MANIFEST.json`` and LATEST are format/SPEC.md's "Model manifest";
`format.model_manifest.ModelManifest` owns the manifest's schema and every path comes from `format.layout`.
Rules kept here: a generation *exists* once its manifest does (files without one are an
interrupted publish's leftovers, replaced by the next attempt); files and manifest are
create-only, so a generation is published once and never overwritten (`AlreadyPublished`); a
reader reads a file only up to its manifest's size (and `MAX_MODEL_FILE_BYTES`).  LATEST only
moves forward, by compare-and-swap (``read_versioned`` + ``write_if_generation``), so racing
publishers can never move it back.

Readers poll `latest_generation`, then `inference.model_files.load_model`, which checks every
sha256 (`ModelIntegrityError`).  The SavedModel's ``serving_default`` takes ``planes`` float32
[B, N, N, C] (C: the manifest's ``metadata.feature_set_planes``, 17 when absent) and returns
``policy_logits`` [B, N*N+1], ``value`` [B], ``ownership`` [B, N*N] and ``score`` [B], from the
side to move; other declared shapes are refused.  Nothing here imports TensorFlow.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from cloud.base import AlreadyExists, NotFound, PreconditionFailed, TooLarge
from format import layout
from format.documents import MAX_DOCUMENT_BYTES, MAX_POINTER_BYTES, ManifestError, too_large
from format.model_manifest import ModelFile, ModelManifest

SIGNATURE = "serving_default"
LATEST_ATTEMPTS = 8
"""Conditional writes publish_model tries on LATEST before giving up (each
failed one means another writer moved LATEST between our read and write)."""
OUTPUTS = ("policy_logits", "value", "ownership", "score")
MAX_MODEL_FILE_BYTES = 2 << 30
"""The largest file a published model may hold (publish_model refuses more): files are read whole into
memory, so readers need a bound even when the manifest lies; far past any network the trainer builds."""


class RegistryError(RuntimeError):
    """The registry is not in the state an operation needs; the message says why."""


class AlreadyPublished(RegistryError):
    """``publish_model`` was asked to publish a generation that already exists."""


class ModelIntegrityError(RegistryError):
    """A model file does not match its manifest; ``path`` names the file."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


def model_dir(generation: int) -> str:
    return layout.model_dir(generation)


def manifest_path(generation: int) -> str:
    return layout.model_manifest(generation)


def _check_generation(generation) -> int:
    if isinstance(generation, bool) or not isinstance(generation, (int, np.integer)) or generation < 0:
        raise ValueError(f"generation must be a non-negative int, got {generation!r}")
    return int(generation)


def _parse_latest(storage, data: bytes) -> int:
    """LATEST's generation; RegistryError naming the file for anything but ASCII digits."""
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        # Show the bytes themselves: decoding with replacement hid what was there.
        raise RegistryError(
            f"{storage.url(layout.LATEST)}: expected a generation number, got non-ASCII bytes {data[:40]!r}"
        ) from None
    if not text.isdigit():
        raise RegistryError(f"{storage.url(layout.LATEST)}: expected a generation number, got {text[:40]!r}")
    return int(text)


def latest_generation(storage) -> int | None:
    """The generation in ``models/LATEST``, or None before the first publish."""
    try:
        return _parse_latest(storage, storage.read(layout.LATEST, max_bytes=MAX_POINTER_BYTES))
    except NotFound:
        return None
    except TooLarge:
        raise RegistryError(f"{storage.url(layout.LATEST)}: {too_large(MAX_POINTER_BYTES)}") from None


def advance_latest(storage, generation: int) -> int:
    """Move LATEST forward to ``generation`` unless it already names it or a newer one.

    Compare-and-swap: read LATEST with its storage generation, then write
    only if it is still at that generation (0 = absent).  A PreconditionFailed
    means someone else wrote LATEST in between; read again and decide again.
    Returns the generation LATEST names afterwards.  A LATEST that is not a
    number raises RegistryError naming it (nothing is overwritten).
    """
    generation = _check_generation(generation)
    for _ in range(LATEST_ATTEMPTS):
        try:
            data, version = storage.read_versioned(layout.LATEST, max_bytes=MAX_POINTER_BYTES)
            current = _parse_latest(storage, data)
        except NotFound:
            version, current = 0, None
        except TooLarge:
            raise RegistryError(f"{storage.url(layout.LATEST)}: {too_large(MAX_POINTER_BYTES)}") from None
        if current is not None and current >= generation:
            return current
        try:
            storage.write_if_generation(layout.LATEST, f"{generation}\n".encode(), version)
            return generation
        except PreconditionFailed:
            continue
    raise RegistryError(
        f"{storage.url(layout.LATEST)} changed under each of {LATEST_ATTEMPTS} conditional "
        f"writes; could not move it to generation {generation}"
    )


def is_published(storage, generation: int) -> bool:
    return storage.exists(manifest_path(_check_generation(generation)))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _local_files(local_dir: str) -> list[str]:
    """Relative '/'-separated paths of every file under local_dir, sorted."""
    found = []
    for directory, _, names in os.walk(local_dir):
        for name in names:
            relative = os.path.relpath(os.path.join(directory, name), local_dir)
            found.append(relative.replace(os.sep, "/"))
    return sorted(found)


def publish_model(storage, generation: int, local_dir: str, metadata: dict, *, before_commit=None) -> ModelManifest:
    """Upload ``local_dir`` as ``models/<generation>/``, then its manifest, then LATEST.

    Raises AlreadyPublished if the generation's manifest exists (before
    uploading anything, when a file is found written by a publisher that
    won the race, and when another publisher's manifest comes first).
    Every file is written create-only (:func:`_write_model_file`), so a
    published generation's files are never overwritten.  ``before_commit``
    is called after the files and before the manifest: the trainer renews
    its lease there (raising to publish nothing), so the commit point comes
    right after a proof that the root is still its own.  LATEST moves only
    forward (:func:`advance_latest`): publishing 2 after 3 leaves it at 3.
    Returns the manifest.
    """
    generation = _check_generation(generation)
    if "board_size" not in metadata:
        raise ValueError("publish_model metadata must include board_size")
    if is_published(storage, generation):
        raise AlreadyPublished(
            f"{storage.url(model_dir(generation))} is already published; a generation is never republished"
        )
    relative_paths = _local_files(local_dir)
    if not relative_paths:
        raise ValueError(f"{local_dir} holds no files to publish")
    files = {}
    for relative in relative_paths:
        local_path = os.path.join(local_dir, *relative.split("/"))
        if os.path.getsize(local_path) > MAX_MODEL_FILE_BYTES:
            raise RegistryError(
                f"{local_path} is larger than {MAX_MODEL_FILE_BYTES:,} bytes, the most a model "
                "file may hold (readers would refuse it); not published"
            )
        with open(local_path, "rb") as handle:
            data = handle.read()
        _write_model_file(storage, generation, relative, data)
        files[relative] = ModelFile(sha256_hex(data), len(data))
    manifest = ModelManifest(generation=generation, files=files, metadata=metadata)
    if before_commit is not None:
        before_commit()
    try:
        storage.write_new(manifest_path(generation), manifest.to_bytes())
    except AlreadyExists:
        raise AlreadyPublished(
            f"{storage.url(manifest_path(generation))} was written by another publisher first"
        ) from None
    advance_latest(storage, generation)
    return manifest


def _write_model_file(storage, generation: int, relative: str, data: bytes) -> None:
    """Create one file of an unpublished generation, never overwriting a published one.

    The write is create-only.  An object already there with the same bytes
    is kept.  Other bytes under a manifest mean another publisher won
    (AlreadyPublished: the generation's files stay as its manifest says).
    Other bytes and no manifest are a leftover of an interrupted publish,
    referenced by nothing: it is deleted and written again create-only, so
    that if a second publisher recreates it meanwhile, one of the two stops
    here with a RegistryError rather than both writing the same object.
    """
    path = layout.model_file(generation, relative)
    try:
        storage.write_new(path, data)
        return
    except AlreadyExists:
        pass
    try:
        existing = storage.read(path, max_bytes=len(data))
    except (NotFound, TooLarge):
        existing = None
    if existing == data:
        return
    if is_published(storage, generation):
        raise AlreadyPublished(
            f"{storage.url(path)} belongs to generation {generation}, published by another "
            "publisher meanwhile; not overwriting it"
        )
    storage.delete(path, missing_ok=True)
    try:
        storage.write_new(path, data)
    except AlreadyExists:
        raise RegistryError(
            f"{storage.url(path)} was written again by another publisher of generation "
            f"{generation} while this one replaced a leftover; stopping (one trainer per root)"
        ) from None


def read_manifest(storage, generation: int) -> ModelManifest:
    path = manifest_path(_check_generation(generation))
    try:
        data = storage.read(path, max_bytes=MAX_DOCUMENT_BYTES)
    except NotFound:
        raise RegistryError(f"{storage.url(path)} does not exist: generation {generation} is not published") from None
    except TooLarge:
        raise ModelIntegrityError(f"{storage.url(path)}: {too_large(MAX_DOCUMENT_BYTES)}", path) from None
    try:
        return ModelManifest.from_bytes(data, generation, storage.url(path))  # the one owner of its schema
    except ManifestError as exc:
        raise ModelIntegrityError(str(exc), path) from None
