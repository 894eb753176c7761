"""The storage interface every role uses, and the pieces both backends share.

Terms: a *root* is where a lake lives, given as a URL (``lake``, ``/data/lake``, ``file:///...``
or ``gs://bucket[/prefix]``).  A *path* names an object relative to the root, '/'-separated, with
no leading or trailing '/' and no empty, '.' or '..' segments (`validate_path`), so it cannot
escape its root.  An *object* is the bytes under a path, written whole (a reader sees nothing or
everything).  A *prefix* is a plain string prefix of paths (``list("games/")``).  A *stray name*
is a name under the root that is no valid path; listings skip it with one warning
(`skip_stray_name`), and names starting with `TEMP_MARKER` are the layer's own.

Writes: ``write_new`` creates and refuses to overwrite (`AlreadyExists`: chunks, shards, model
files); ``write_replace`` atomically replaces a small scratch object; ``read_versioned`` +
``write_if_generation`` are compare-and-swap on one small object (``models/LATEST``, leases):
the write succeeds only at the *generation* read (0 = must not exist), else
`PreconditionFailed`.  A generation grows with every write (GCS's object generation; locally the
nanosecond mtime, forced to grow).  Nothing relies on a conditional delete.  Errors name the
object's URL and, for GCS, the HTTP status, never credentials or headers.
"""

from __future__ import annotations

import abc
import builtins
import dataclasses
import logging
import os
import tempfile
import threading

_log = logging.getLogger(__name__)

TEMP_MARKER = ".zl-tmp-"
"""Names starting with this are a local writer's in-flight temp files (and the
lock files of its conditional writes).  Listings skip them, and no object path
may use one as a segment."""


class StorageError(Exception):
    """A storage operation failed.  ``url`` names the object (or prefix);
    ``status`` is the HTTP status for GCS errors, else None."""

    def __init__(self, message: str, *, url: str = "", status: int | None = None):
        super().__init__(message)
        self.url = url
        self.status = status


class AlreadyExists(StorageError):
    """``write_new`` found an object already at the path; it was left unchanged."""


class NotFound(StorageError):
    """No object at the path."""


class TooLarge(StorageError):
    """A read with ``max_bytes`` found a larger object; nothing past the bound was kept.
    ``generation`` is the object's when the read was versioned (to replace it
    conditionally), else None."""

    def __init__(self, message: str, *, url: str = "", generation: int | None = None):
        super().__init__(message, url=url)
        self.generation = generation


class PreconditionFailed(StorageError):
    """``write_if_generation`` found the object at another generation than the
    caller read (someone else wrote it since); the object is unchanged."""


@dataclasses.dataclass(frozen=True, order=True)
class ObjectInfo:
    """One listed object: ``path`` relative to the storage root, ``size`` in bytes."""

    path: str
    size: int


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How hard a remote backend retries transient failures (HTTP 408, 429 and
    5xx, dropped connections, timeouts).

    Attempt ``k`` (k = 1, 2, ...) that fails transiently is followed by a sleep
    drawn uniformly from ``[0, min(max_delay_s, initial_delay_s * multiplier**(k-1))]``
    ("full jitter", so that many workers hit by the same outage do not retry in
    lockstep).  The call gives up after ``max_attempts`` attempts, or earlier
    when the next sleep would end past ``deadline_s`` seconds since the first
    attempt.  ``request_timeout_s`` bounds each single HTTP request.
    """

    max_attempts: int = 8
    initial_delay_s: float = 0.5
    max_delay_s: float = 16.0
    multiplier: float = 2.0
    deadline_s: float = 300.0
    request_timeout_s: float = 120.0

    def __post_init__(self):
        # Upper bounds too (NaN fails every comparison): a day of retrying, an hour a
        # request, are past anything useful, and 1e300 must not reach time.sleep.
        checks = (
            ("max_attempts", 1 <= self.max_attempts <= 1000, "in [1, 1000]"),
            ("initial_delay_s", 0 <= self.initial_delay_s <= 3600, "in [0, 3600]"),
            ("max_delay_s", 0 <= self.max_delay_s <= 3600, "in [0, 3600]"),
            ("multiplier", 1 <= self.multiplier <= 100, "in [1, 100]"),
            ("deadline_s", 0 < self.deadline_s <= 86400, "in (0, 86400]"),
            ("request_timeout_s", 0 < self.request_timeout_s <= 3600, "in (0, 3600]"),
        )
        for field, ok, requirement in checks:
            if not ok:
                raise ValueError(f"RetryPolicy.{field} must be {requirement}, got {getattr(self, field)!r}")

    def max_sleep_after(self, attempt: int) -> float:
        """Upper bound of the jittered sleep after failed attempt ``attempt`` (1-based)."""
        return min(self.max_delay_s, self.initial_delay_s * self.multiplier ** (attempt - 1))


def validate_path(path: str, *, what: str = "path") -> str:
    """Return ``path`` if it is a valid object path (see module docstring), else
    raise ValueError naming it."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"storage {what} must be a non-empty string, got {path!r}")
    if path.startswith("/") or path.endswith("/"):
        raise ValueError(f"storage {what} {path!r} must not start or end with '/'")
    if "\\" in path or "\x00" in path or "\n" in path or "\r" in path:
        raise ValueError(f"storage {what} {path!r} contains a backslash, NUL or newline")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # a local file name whose bytes are not UTF-8 (os.fsdecode's surrogates)
        raise ValueError(f"storage {what} {path!r} is not UTF-8 (an object name must be)") from None
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"storage {what} {path!r} has an empty, '.' or '..' segment")
        if segment.startswith(TEMP_MARKER):
            raise ValueError(f"storage {what} {path!r} uses the reserved temp-file marker {TEMP_MARKER!r}")
    return path


def is_reserved_name(path: str) -> bool:
    """Whether ``path`` has a segment starting with TEMP_MARKER: the storage layer's
    own in-flight temp and lock files (and their copies), which listings skip silently."""
    return any(segment.startswith(TEMP_MARKER) for segment in path.split("/"))


_warned_keys: set = set()
"""Keys `warn_once` has warned of in this process (one per stray name: bounded by the lake)."""
_warned_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    """Log the warning ``message`` once per process for each ``key`` (a file or
    object's full location): what a listing skips, it meets at every listing."""
    with _warned_lock:
        if key in _warned_keys:
            return
        _warned_keys.add(key)
    _log.warning("%s", message)


def skip_stray_name(where: str, problem: str) -> None:
    """Report once that a listing skipped ``where`` (a local file name or gs://
    URL); ``problem`` says why it is no object (see the module docstring)."""
    warn_once(where, f"listing skipped {where!r}: {problem}")


def check_listed_name(where: str, name: str) -> bool:
    """Whether the listed name ``name`` (a path relative to the root, found at
    ``where``) is a path to list: False for a reserved (temp-file) name, and
    for a stray name, which is reported once (`skip_stray_name`)."""
    if is_reserved_name(name):
        return False
    try:
        validate_path(name, what="name")
    except ValueError as exc:
        problem = str(exc).replace(f"storage name {name!r} ", "its name ", 1)
        skip_stray_name(where, f"{problem}, so it is no object path; no role reads it (rename or remove it)")
        return False
    return True


def validate_data(data, url: str) -> None:
    """Raise TypeError unless ``data`` is bytes-like: objects are bytes, and
    silently encoding a str would hide a caller's bug."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data for {url} must be bytes, got {type(data).__name__}")


def check_size(data: bytes, max_bytes: int | None, url: str, generation: int | None = None) -> bytes:
    """``data`` if it is within ``max_bytes`` (None: any size), else TooLarge naming ``url``."""
    if max_bytes is not None and len(data) > max_bytes:
        raise TooLarge(
            f"{url} is larger than {max_bytes:,} bytes, the most an object of its kind holds; not read further",
            url=url,
            generation=generation,
        )
    return data


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is '' or a path-like string prefix (which may end
    in '/'), else raise ValueError."""
    if prefix == "":
        return prefix
    validate_path(prefix[:-1] if prefix.endswith("/") else prefix, what="prefix")
    return prefix


class Storage(abc.ABC):
    """A lake root: whole-object reads and writes under relative paths.

    Implementations: :class:`cloud.local.LocalStorage` and
    :class:`cloud.gcs.GcsStorage`; get one with :func:`cloud.storage.open_storage`.
    Instances are safe to share between threads; they pickle to their root
    URL (GCS clients are rebuilt on first use after unpickling), so Beam
    DoFns may hold one.
    """

    root_url: str
    """The root this storage was opened at, normalised (absolute local path or gs://bucket[/prefix])."""

    @abc.abstractmethod
    def write_new(self, path: str, data: bytes) -> None:
        """Create the object ``path`` with ``data``, whole.  Raise
        :class:`AlreadyExists` if it exists; the existing object is unchanged."""

    @abc.abstractmethod
    def write_replace(self, path: str, data: bytes, *, durable: bool = True) -> None:
        """Atomically create or replace the object ``path`` with ``data``.

        ``durable=False`` is for scratch objects that a crash may lose (a
        rerun recreates them): a local write then skips its fsyncs.  Object
        stores are always durable."""

    @abc.abstractmethod
    def read(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Every byte of the object ``path``; :class:`NotFound` if absent.

        ``max_bytes``: the most the caller accepts (a document's format bound);
        a larger object raises :class:`TooLarge` after reading at most one byte
        more, so a hostile object cannot fill memory."""

    @abc.abstractmethod
    def read_versioned(self, path: str, *, max_bytes: int | None = None) -> tuple[bytes, int]:
        """``(bytes, generation)`` of the object ``path``, read consistently
        (the bytes are those of that generation); :class:`NotFound` if absent;
        ``max_bytes`` as for `read`."""

    @abc.abstractmethod
    def write_if_generation(self, path: str, data: bytes, generation: int) -> int:
        """Replace the object ``path`` with ``data`` only if it is still at
        ``generation`` (0: only if it does not exist).  Returns the new
        generation; raises :class:`PreconditionFailed` otherwise, leaving the
        object unchanged."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Whether an object is stored at ``path``."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose path starts with ``prefix``, recursively, sorted
        by path.  Temp files of in-flight writes are never listed, nor are
        stray names (module docstring): each is logged once, and skipped."""

    @abc.abstractmethod
    def delete(self, path: str, *, missing_ok: bool = False) -> None:
        """Remove the object ``path``; :class:`NotFound` if absent unless ``missing_ok``."""

    @abc.abstractmethod
    def url(self, path: str = "") -> str:
        """Full URL (gs://...) or absolute local path of ``path``, for tools
        that take URLs (Beam, tf.data).  ``url("")`` is the root itself."""

    def local_copy(self, prefix: str, dest_dir: str) -> builtins.list[str]:  # list: the method above
        """Copy every object under ``prefix`` into the local directory
        ``dest_dir``, keeping paths relative to ``prefix``
        (``models/000004/`` + ``weights.h5`` -> ``dest_dir/weights.h5``).
        Each file is written to a temp name and renamed, so a crash leaves
        no partial file under its final name.  Returns the local file paths
        written, sorted.  Raises :class:`NotFound` if nothing matches."""
        validate_prefix(prefix)
        infos = self.list(prefix)
        if not infos:
            raise NotFound(f"no objects under {self.url(prefix.rstrip('/'))}", url=self.url(prefix.rstrip("/")))
        written = []
        for info in infos:
            relative = info.path[len(prefix) :].lstrip("/")
            if not relative:  # the prefix named a single object exactly
                relative = info.path.rsplit("/", 1)[-1]
            target = os.path.join(dest_dir, *relative.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=TEMP_MARKER, dir=os.path.dirname(target))
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(self.read(info.path))
                os.replace(temp, target)
            except BaseException:
                if os.path.exists(temp):
                    os.unlink(temp)
                raise
            written.append(target)
        return sorted(written)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root_url!r})"
