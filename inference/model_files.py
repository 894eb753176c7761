"""Published models on this machine: the local cache of their verified files, and TensorFlow loading.

`format.registry` says what a published model is in the lake (its files, its
manifest, LATEST) and publishes one; this module brings one to a process
that will run it:

    storage --read_manifest--> manifest --fetch_model_files--> ModelCache/<gen>/ (each sha256 checked)
            --load_model--> LoadedModel (the SavedModel's serving signature, its shapes checked)

Workers, players, the Beam job's labeller and the benchmarks load models
through here; `inference.loading.load_published_evaluator` wraps the result
in the evaluator a search calls.  TensorFlow is imported only by :func:`load_model`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cloud.base import NotFound, TooLarge
from cloud.local import write_local_file
from format import layout
from format.model_manifest import ModelManifest, model_input_planes
from format.registry import (
    MAX_MODEL_FILE_BYTES,
    OUTPUTS,
    SIGNATURE,
    ModelIntegrityError,
    RegistryError,
    manifest_path,
    model_dir,
    read_manifest,
    sha256_hex,
)


class ModelCacheError(RegistryError):
    """The local model cache cannot be used safely; the message names the folder."""


CACHE_MARKER = ".zerolake-model-cache"
"""File written into every generation folder the cache creates.  The cache
only ever reuses or deletes folders holding it, so pointing ``--model-cache``
at the wrong folder (a lake's ``games/``, say) refuses instead of deleting."""


class ModelCache:
    """A private local folder of verified model files, one sub-folder a generation.

    * ``ModelCache()`` makes a fresh folder with ``tempfile.mkdtemp`` (mode
      0700, an unpredictable name, so no other user can plant files or
      symlinks in it) and removes it when the process exits or on
      :meth:`close`.
    * ``ModelCache(path)`` uses a folder the user chose (``--model-cache``),
      created with mode 0700 when missing.  It must be a real directory (not a
      symlink), owned by this user and not writable by group or others.

    Either way the cache creates ``<gen:06d>/`` folders marked with
    :data:`CACHE_MARKER`, refuses a generation folder it did not create,
    refuses symlinks anywhere below it, and deletes only marked folders.
    """

    def __init__(self, directory: str | None = None):
        if directory is None:
            self.directory = tempfile.mkdtemp(prefix="zerolake-models-")
            self.temporary = True
            atexit.register(self.close)
        else:
            self.directory = os.path.abspath(directory)
            self.temporary = False
            _make_private_dir(self.directory)

    def __repr__(self) -> str:
        return f"ModelCache({self.directory!r})"

    def generation_dir(self, generation: int) -> str:
        """The generation's folder, created and marked if new; refuses a foreign one."""
        path = os.path.join(self.directory, layout.generation_dir(generation))
        if os.path.lexists(path):
            if os.path.islink(path) or not os.path.isdir(path):
                raise ModelCacheError(f"{path} is a symlink or not a folder; the model cache refuses it")
            if not os.path.isfile(os.path.join(path, CACHE_MARKER)):
                raise ModelCacheError(
                    f"{path} exists and was not created by the model cache; refusing to "
                    "use or delete it (give --model-cache a folder of its own)"
                )
            return path
        os.mkdir(path, 0o700)
        with open(os.path.join(path, CACHE_MARKER), "x") as handle:
            handle.write("zerolake model cache: this folder may be deleted\n")
        return path

    def file_path(self, generation_dir: str, relative: str) -> str:
        """Where a manifest entry lives locally; no component may be a symlink."""
        parts = relative.split("/")
        current = generation_dir
        for part in parts:
            current = os.path.join(current, part)
            if os.path.islink(current):
                raise ModelCacheError(f"{current} is a symlink; the model cache refuses to follow it")
        return current

    def clear(self, keep_generations: set[int]) -> None:
        """Remove this cache's generation folders except ``keep_generations``."""
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if (
                name.isdigit()
                and int(name) not in keep_generations
                and not os.path.islink(path)
                and os.path.isdir(path)
                and os.path.isfile(os.path.join(path, CACHE_MARKER))
            ):
                shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        """Remove a temporary cache (a user-chosen folder stays)."""
        if self.temporary:
            shutil.rmtree(self.directory, ignore_errors=True)


def _make_private_dir(path: str) -> None:
    if os.path.islink(path):
        raise ModelCacheError(f"model cache {path} is a symlink; give a real folder")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ModelCacheError(f"model cache {path}: cannot create it ({exc.strerror})") from None
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise ModelCacheError(f"model cache {path} is not a folder")
    if info.st_uid != os.getuid():
        raise ModelCacheError(f"model cache {path} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o022:
        raise ModelCacheError(
            f"model cache {path} is writable by group or others "
            f"(mode {stat.S_IMODE(info.st_mode):o}); use a private folder (chmod 700)"
        )


def _as_cache(cache) -> ModelCache:
    if isinstance(cache, ModelCache):
        return cache
    return ModelCache(cache)


def fetch_model_files(
    storage, generation: int, cache_dir: "ModelCache | str | None" = None
) -> tuple[str, ModelManifest]:
    """Local directory holding the verified files of ``generation``, and its manifest.

    ``cache_dir`` is a :class:`ModelCache`, a folder for one, or None for a
    private temporary cache.  Files already in the cache are re-hashed and
    reused when they match; anything else is downloaded.  A download whose
    sha256 differs from the manifest raises ModelIntegrityError naming the
    file, and the cached copy is removed.
    """
    manifest = read_manifest(storage, generation)  # every file entry validated there
    cache = _as_cache(cache_dir)
    local = cache.generation_dir(generation)
    for relative, entry in sorted(manifest.files.items()):
        if entry.size > MAX_MODEL_FILE_BYTES:  # before any file is fetched
            raise ModelIntegrityError(
                f"{storage.url(manifest_path(generation))}: field 'files.{relative}.size' is {entry.size:,}, "
                f"more than the {MAX_MODEL_FILE_BYTES:,} bytes a model file may hold; refusing to load",
                manifest_path(generation),
            )
    for relative, entry in sorted(manifest.files.items()):
        remote = layout.model_file(generation, relative)
        target = cache.file_path(local, relative)
        if os.path.isfile(target) and os.path.getsize(target) == entry.size and _file_sha256(target) == entry.sha256:
            continue
        try:
            # At most the manifest's size (plus the one byte that shows it is more): a file
            # replaced by a larger one must not fill memory before its hash refuses it.
            data = storage.read(remote, max_bytes=entry.size)
        except NotFound:
            raise ModelIntegrityError(f"{storage.url(remote)} is listed in the manifest but missing", remote) from None
        except TooLarge:
            raise ModelIntegrityError(
                f"{storage.url(remote)} is larger than the {entry.size:,} bytes its manifest "
                "says (file corrupted or replaced); refusing to load",
                remote,
            ) from None
        if sha256_hex(data) != entry.sha256:
            if os.path.exists(target):
                os.unlink(target)
            raise ModelIntegrityError(
                f"{storage.url(remote)}: sha256 {sha256_hex(data)[:16]}... does not match the "
                f"manifest's {entry.sha256[:16]}... (file corrupted or replaced); refusing to load",
                remote,
            )
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        cache.file_path(local, relative)  # re-check: nothing may have become a symlink meanwhile
        write_local_file(target, data)
    return local, manifest


def _file_sha256(path: str) -> str:
    with open(path, "rb") as handle:
        return sha256_hex(handle.read())


@dataclass
class LoadedModel:
    """A published model ready to evaluate positions.

    ``model(planes)`` takes float32 [B, N, N, C] (numpy), C = `input_planes`,
    and returns a dict of numpy arrays: policy_logits [B, N*N+1], value [B],
    ownership [B, N*N], score [B].  The call runs the SavedModel's compiled
    graph.
    """

    generation: int
    board_size: int
    metadata: dict
    local_dir: str
    _signature: Any = field(repr=False, default=None)  # TensorFlow's ConcreteFunction (untyped)
    _saved: Any = field(repr=False, default=None)  # keeps the SavedModel's variables alive

    @property
    def input_planes(self) -> int:
        """The network's input width, 17 or 22: the first C channels of format/planes.py's layout."""
        return model_input_planes(self.metadata)

    @property
    def signature(self):
        """The SavedModel's serving function (``planes=`` float32 tensor -> dict of tensors),
        for callers that run it inside their own tf.function (fixed-shape inference)."""
        return self._signature

    def __call__(self, planes) -> dict:
        planes = np.asarray(planes, dtype=np.float32)
        n = self.board_size
        if planes.ndim != 4 or planes.shape[1:] != (n, n, self.input_planes):
            raise ValueError(f"planes must be [B, {n}, {n}, {self.input_planes}], got {planes.shape}")
        outputs = self._signature(planes=planes)
        return {name: outputs[name].numpy() for name in OUTPUTS}


def load_model(storage, generation: int, cache_dir: "ModelCache | str | None" = None) -> LoadedModel:
    """Download (or reuse from cache), verify and load a published generation."""
    import tensorflow as tf  # deferred: polling LATEST must not pay for TensorFlow

    local, manifest = fetch_model_files(storage, generation, cache_dir)
    saved = tf.saved_model.load(local)
    if SIGNATURE not in saved.signatures:
        raise ModelIntegrityError(
            f"{storage.url(model_dir(generation))}: SavedModel has no '{SIGNATURE}' signature", model_dir(generation)
        )
    board_size = manifest.board_size
    _check_signature(storage, generation, saved.signatures[SIGNATURE], board_size, manifest.input_planes)
    return LoadedModel(
        generation=int(generation),
        board_size=board_size,
        metadata=manifest.metadata,
        local_dir=local,
        _signature=saved.signatures[SIGNATURE],
        _saved=saved,
    )


def _shape_text(shape) -> str:
    """[B, 9, 9, 17]: the batch dimension as B, any other unknown one as ?."""
    return "[" + ", ".join(str(d) if d is not None else "B" if i == 0 else "?" for i, d in enumerate(shape)) + "]"


def _check_signature(storage, generation: int, signature, board_size: int, input_planes: int) -> None:
    """The SavedModel's declared input and output shapes must be those of its manifest's board size
    and input planes.

    A manifest that names another board than the network was built for (or a
    network exported for the wrong board) otherwise loads fine and fails only
    when the first batch runs, deep inside whoever evaluates it.  The shapes
    are read from the signature itself, so nothing is run here.
    """
    n = board_size
    expected = {
        "planes": (None, n, n, input_planes),
        "policy_logits": (None, n * n + 1),
        "value": (None,),
        "ownership": (None, n * n),
        "score": (None,),
    }
    try:
        declared = dict(signature.structured_input_signature[1])
        declared.update(signature.structured_outputs)
        shapes = {name: tuple(spec.shape.as_list()) for name, spec in declared.items()}
    except (AttributeError, TypeError, ValueError, IndexError):
        return  # shapes not declared (unknown rank): nothing to compare before it runs
    where = storage.url(manifest_path(generation))
    for name, want in expected.items():
        if name not in shapes:
            raise ModelIntegrityError(
                f"{where}: the SavedModel's '{SIGNATURE}' signature has no '{name}'", manifest_path(generation)
            )
        got = shapes[name]
        # An unknown dimension (None) may fit; only a declared size that differs is refused.
        if len(got) != len(want) or any(None not in (g, w) and g != w for g, w in zip(got, want)):
            field_name = (
                "metadata.feature_set_planes" if name == "planes" and got[1:3] == want[1:3] else "metadata.board_size"
            )
            field_value = input_planes if field_name == "metadata.feature_set_planes" else n
            raise ModelIntegrityError(
                f"{where}: field '{field_name}' is {field_value}, but the SavedModel's '{name}' is "
                f"{_shape_text(got)}, not {_shape_text(want)}",
                manifest_path(generation),
            )


def clear_cache(cache: "ModelCache | str", keep_generations: set[int]) -> None:
    """Remove cached generations not in ``keep_generations`` (workers call it after a switch).

    Only folders the cache created (marked with CACHE_MARKER) are removed.
    """
    if isinstance(cache, str) and not os.path.isdir(cache):
        return
    _as_cache(cache).clear(keep_generations)
