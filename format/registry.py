"""Model registry: published inference models in the lake, and how to load one.

Layout (paths relative to the lake root)::

    models/<gen:06d>/<files of a SavedModel>   written first, any order
    models/<gen:06d>/MANIFEST.json            written next, create-only: the commit point
    models/LATEST                             "<gen>\\n", replaced last, only forward

``MANIFEST.json`` is ``{"version": 1, "generation": g, "files": {relative
path: {"sha256": hex, "size": bytes}}, "metadata": {...}}``; the metadata
carries at least ``board_size``.  A generation *exists* once its manifest
does; files without a manifest are leftovers of an interrupted publish and
are replaced by the next attempt.  Because the manifest and the files are
create-only, two trainers can never both publish one generation, a
generation is never republished, and a published generation's files are
never overwritten (a trainer that lost its lease stops with AlreadyPublished).
A reader reads each file only up to the size its manifest gives (and at most
MAX_MODEL_FILE_BYTES), so a file replaced by a huge one cannot fill memory.

LATEST only moves forward, and never by a blind overwrite: publish_model
reads it with its storage generation (``read_versioned``) and replaces it
with ``write_if_generation`` on exactly that generation.  If another writer
moved it in between, the write fails with PreconditionFailed and the loop
reads again; if LATEST already names our generation or a newer one, it is
left alone.  So two publishers racing (a trainer and the one that took over
its lease, say) can never move LATEST backwards.  Every lake path here comes
from :mod:`format.layout`.

Readers (self-play workers) poll :func:`latest_generation`, then
:func:`load_model`, which copies the files into a local cache, checks every
sha256 against the manifest, and refuses any mismatch with
:class:`ModelIntegrityError` naming the file.  The SavedModel's
``serving_default`` signature takes ``planes`` float32 [B, N, N, C] (C, 17
or 22, the manifest's ``metadata.feature_set_planes``, 17 when absent) and
returns ``policy_logits`` [B, N*N+1], ``value`` [B], ``ownership`` [B, N*N]
and ``score`` [B], all from the side to move (``model.export`` writes it),
N being the manifest's ``board_size``: a signature that declares other shapes
is refused the same way, naming the manifest.

TensorFlow is imported only by :func:`load_model`, so polling LATEST stays
cheap.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field

import numpy as np

from cloud.base import AlreadyExists, NotFound, PreconditionFailed, TooLarge
from cloud.local import write_local_file
from format import layout, schema

SIGNATURE = "serving_default"
LATEST_ATTEMPTS = 8
"""Conditional writes publish_model tries on LATEST before giving up (each
failed one means another writer moved LATEST between our read and write)."""
OUTPUTS = ("policy_logits", "value", "ownership", "score")
MAX_MODEL_FILE_BYTES = 2 << 30
"""The largest file a published model may hold.  A model file is read whole
into memory, so the reader needs a bound even when the manifest itself lies;
a 20-block, 256-filter network's variables are about 100 MB, so 2 GiB is past
any network the trainer builds while still fitting a worker's memory.
publish_model refuses to write a larger one."""


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
        raise RegistryError(f"{storage.url(layout.LATEST)}: expected a generation number, got non-ASCII "
                            f"bytes {data[:40]!r}") from None
    if not text.isdigit():
        raise RegistryError(f"{storage.url(layout.LATEST)}: expected a generation number, got {text[:40]!r}")
    return int(text)


def latest_generation(storage) -> int | None:
    """The generation in ``models/LATEST``, or None before the first publish."""
    try:
        return _parse_latest(storage, storage.read(layout.LATEST, max_bytes=layout.MAX_POINTER_BYTES))
    except NotFound:
        return None
    except TooLarge:
        raise RegistryError(f"{storage.url(layout.LATEST)}: {layout.too_large(layout.MAX_POINTER_BYTES)}") from None


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
            data, version = storage.read_versioned(layout.LATEST, max_bytes=layout.MAX_POINTER_BYTES)
            current = _parse_latest(storage, data)
        except NotFound:
            version, current = 0, None
        except TooLarge:
            raise RegistryError(f"{storage.url(layout.LATEST)}: {layout.too_large(layout.MAX_POINTER_BYTES)}") \
                from None
        if current is not None and current >= generation:
            return current
        try:
            storage.write_if_generation(layout.LATEST, f"{generation}\n".encode(), version)
            return generation
        except PreconditionFailed:
            continue
    raise RegistryError(f"{storage.url(layout.LATEST)} changed under each of {LATEST_ATTEMPTS} conditional "
                        f"writes; could not move it to generation {generation}")


def is_published(storage, generation: int) -> bool:
    return storage.exists(manifest_path(_check_generation(generation)))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _local_files(local_dir: str) -> list[str]:
    """Relative '/'-separated paths of every file under local_dir, sorted."""
    found = []
    for directory, _, names in os.walk(local_dir):
        for name in names:
            relative = os.path.relpath(os.path.join(directory, name), local_dir)
            found.append(relative.replace(os.sep, "/"))
    return sorted(found)


def publish_model(storage, generation: int, local_dir: str, metadata: dict, *,
                  before_commit=None) -> layout.ModelManifest:
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
        raise AlreadyPublished(f"{storage.url(model_dir(generation))} is already published; "
                               "a generation is never republished")
    relative_paths = _local_files(local_dir)
    if not relative_paths:
        raise ValueError(f"{local_dir} holds no files to publish")
    files = {}
    for relative in relative_paths:
        local_path = os.path.join(local_dir, *relative.split("/"))
        if os.path.getsize(local_path) > MAX_MODEL_FILE_BYTES:
            raise RegistryError(f"{local_path} is larger than {MAX_MODEL_FILE_BYTES:,} bytes, the most a model "
                                "file may hold (readers would refuse it); not published")
        with open(local_path, "rb") as handle:
            data = handle.read()
        _write_model_file(storage, generation, relative, data)
        files[relative] = layout.ModelFile(_sha256(data), len(data))
    manifest = layout.ModelManifest(generation=generation, files=files, metadata=metadata)
    if before_commit is not None:
        before_commit()
    try:
        storage.write_new(manifest_path(generation), manifest.to_bytes())
    except AlreadyExists:
        raise AlreadyPublished(f"{storage.url(manifest_path(generation))} was written by another "
                               "publisher first") from None
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
        raise AlreadyPublished(f"{storage.url(path)} belongs to generation {generation}, published by another "
                               "publisher meanwhile; not overwriting it")
    storage.delete(path, missing_ok=True)
    try:
        storage.write_new(path, data)
    except AlreadyExists:
        raise RegistryError(f"{storage.url(path)} was written again by another publisher of generation "
                            f"{generation} while this one replaced a leftover; stopping (one trainer per root)") \
            from None


def read_manifest(storage, generation: int) -> layout.ModelManifest:
    path = manifest_path(_check_generation(generation))
    try:
        data = storage.read(path, max_bytes=layout.MAX_DOCUMENT_BYTES)
    except NotFound:
        raise RegistryError(f"{storage.url(path)} does not exist: generation {generation} "
                            "is not published") from None
    except TooLarge:
        raise ModelIntegrityError(f"{storage.url(path)}: {layout.too_large(layout.MAX_DOCUMENT_BYTES)}", path) \
            from None
    try:
        return layout.ModelManifest.from_bytes(data, generation, storage.url(path))   # the one owner of its schema
    except layout.ManifestError as exc:
        raise ModelIntegrityError(str(exc), path) from None


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
                raise ModelCacheError(f"{path} exists and was not created by the model cache; refusing to "
                                      "use or delete it (give --model-cache a folder of its own)")
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
            if (name.isdigit() and int(name) not in keep_generations and not os.path.islink(path)
                    and os.path.isdir(path) and os.path.isfile(os.path.join(path, CACHE_MARKER))):
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
        raise ModelCacheError(f"model cache {path} is writable by group or others "
                              f"(mode {stat.S_IMODE(info.st_mode):o}); use a private folder (chmod 700)")


def _as_cache(cache) -> ModelCache:
    if isinstance(cache, ModelCache):
        return cache
    return ModelCache(cache)


def fetch_model_files(storage, generation: int,
                      cache_dir: "ModelCache | str | None" = None) -> tuple[str, layout.ModelManifest]:
    """Local directory holding the verified files of ``generation``, and its manifest.

    ``cache_dir`` is a :class:`ModelCache`, a folder for one, or None for a
    private temporary cache.  Files already in the cache are re-hashed and
    reused when they match; anything else is downloaded.  A download whose
    sha256 differs from the manifest raises ModelIntegrityError naming the
    file, and the cached copy is removed.
    """
    manifest = read_manifest(storage, generation)     # every file entry validated there
    cache = _as_cache(cache_dir)
    local = cache.generation_dir(generation)
    for relative, entry in sorted(manifest.files.items()):
        if entry.size > MAX_MODEL_FILE_BYTES:    # before any file is fetched
            raise ModelIntegrityError(
                f"{storage.url(manifest_path(generation))}: field 'files.{relative}.size' is {entry.size:,}, "
                f"more than the {MAX_MODEL_FILE_BYTES:,} bytes a model file may hold; refusing to load",
                manifest_path(generation))
    for relative, entry in sorted(manifest.files.items()):
        remote = layout.model_file(generation, relative)
        target = cache.file_path(local, relative)
        if (os.path.isfile(target) and os.path.getsize(target) == entry.size
                and _file_sha256(target) == entry.sha256):
            continue
        try:
            # At most the manifest's size (plus the one byte that shows it is more): a file
            # replaced by a larger one must not fill memory before its hash refuses it.
            data = storage.read(remote, max_bytes=entry.size)
        except NotFound:
            raise ModelIntegrityError(f"{storage.url(remote)} is listed in the manifest but missing",
                                      remote) from None
        except TooLarge:
            raise ModelIntegrityError(f"{storage.url(remote)} is larger than the {entry.size:,} bytes its manifest "
                                      "says (file corrupted or replaced); refusing to load", remote) from None
        if _sha256(data) != entry.sha256:
            if os.path.exists(target):
                os.unlink(target)
            raise ModelIntegrityError(
                f"{storage.url(remote)}: sha256 {_sha256(data)[:16]}... does not match the "
                f"manifest's {entry.sha256[:16]}... (file corrupted or replaced); refusing to load",
                remote)
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        cache.file_path(local, relative)   # re-check: nothing may have become a symlink meanwhile
        write_local_file(target, data)
    return local, manifest


def _file_sha256(path: str) -> str:
    with open(path, "rb") as handle:
        return _sha256(handle.read())


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
    _signature: object = field(repr=False, default=None)
    _saved: object = field(repr=False, default=None)  # keeps the SavedModel's variables alive

    @property
    def input_planes(self) -> int:
        """The network's input width, 17 or 22: the first C channels of format/planes.py's layout."""
        return layout.model_input_planes(self.metadata)

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
        raise ModelIntegrityError(f"{storage.url(model_dir(generation))}: SavedModel has no "
                                  f"'{SIGNATURE}' signature", model_dir(generation))
    board_size = manifest.board_size
    _check_signature(storage, generation, saved.signatures[SIGNATURE], board_size,
                     manifest.input_planes)
    return LoadedModel(generation=int(generation), board_size=board_size,
                       metadata=manifest.metadata, local_dir=local,
                       _signature=saved.signatures[SIGNATURE], _saved=saved)


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
    expected = {"planes": (None, n, n, input_planes), "policy_logits": (None, n * n + 1),
                "value": (None,), "ownership": (None, n * n), "score": (None,)}
    try:
        declared = dict(signature.structured_input_signature[1])
        declared.update(signature.structured_outputs)
        shapes = {name: tuple(spec.shape.as_list()) for name, spec in declared.items()}
    except (AttributeError, TypeError, ValueError, IndexError):
        return   # shapes not declared (unknown rank): nothing to compare before it runs
    where = storage.url(manifest_path(generation))
    for name, want in expected.items():
        if name not in shapes:
            raise ModelIntegrityError(f"{where}: the SavedModel's '{SIGNATURE}' signature has no "
                                      f"'{name}'", manifest_path(generation))
        got = shapes[name]
        # An unknown dimension (None) may fit; only a declared size that differs is refused.
        if len(got) != len(want) or any(None not in (g, w) and g != w for g, w in zip(got, want)):
            field_name = ("metadata.feature_set_planes" if name == "planes" and got[1:3] == want[1:3]
                          else "metadata.board_size")
            field_value = input_planes if field_name == "metadata.feature_set_planes" else n
            raise ModelIntegrityError(
                f"{where}: field '{field_name}' is {field_value}, but the SavedModel's '{name}' is "
                f"{_shape_text(got)}, not {_shape_text(want)}", manifest_path(generation))


def clear_cache(cache: "ModelCache | str", keep_generations: set[int]) -> None:
    """Remove cached generations not in ``keep_generations`` (workers call it after a switch).

    Only folders the cache created (marked with CACHE_MARKER) are removed.
    """
    if isinstance(cache, str) and not os.path.isdir(cache):
        return
    _as_cache(cache).clear(keep_generations)
