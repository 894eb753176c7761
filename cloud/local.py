"""Local-directory backend of the storage interface (see cloud.base for terms).

How a whole-object write works here
-----------------------------------
1. The bytes go to a temp file in the object's own directory, named
   ``.zl-tmp-<name>.<pid>.<random>`` (same directory = same filesystem, so
   the next step is atomic), and are fsync'ed.
2. ``write_new`` then *hard-links* the temp file to the final name.  link(2)
   fails with EEXIST when the name is taken, so of two racing writers exactly
   one wins, and the object appears under its name only when complete.
   ``write_replace`` uses rename(2), which atomically replaces.
3. The temp name is unlinked and the directory fsync'ed, so the new name
   survives a power cut.

A process killed between steps 1 and 2 leaves only a temp file: never
listed, never readable as an object, and removable with
:meth:`LocalStorage.remove_stale_temp_files`.

Folders are made on the first write under them and, as in an object store
where a prefix exists only while objects have it, removed by the delete that
leaves them empty (up to, not including, the root).
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
import uuid

from cloud.base import (
    TEMP_MARKER,
    AlreadyExists,
    NotFound,
    PreconditionFailed,
    ObjectInfo,
    Storage,
    StorageError,
    check_size,
    validate_data,
    validate_path,
    validate_prefix,
)


class LocalStorage(Storage):
    """Objects are files under ``root`` (created on first write)."""

    def __init__(self, root: str):
        self._root = os.path.abspath(os.path.expanduser(root))
        self.root_url = self._root

    # --- paths -------------------------------------------------------------

    def url(self, path: str = "") -> str:
        return self._root if path == "" else self._file(path)

    def _file(self, path: str) -> str:
        """Absolute file name of the object ``path`` (validated)."""
        return os.path.join(self._root, *validate_path(path).split("/"))

    def _relative(self, full_path: str) -> str:
        return os.path.relpath(full_path, self._root).replace(os.sep, "/")

    # --- writes ------------------------------------------------------------

    def write_new(self, path: str, data: bytes) -> None:
        target = self._file(path)
        directory = os.path.dirname(target)
        temp = self._write_temp(directory, target, data)
        try:
            try:
                os.link(temp, target)
            except FileExistsError:
                raise AlreadyExists(f"{target} already exists; write_new never overwrites",
                                    url=target) from None
            except OSError as exc:
                raise StorageError(f"cannot create {target}: {exc.strerror}", url=target) from None
            fsync_directory(directory)
        finally:
            _unlink_if_present(temp)

    def write_replace(self, path: str, data: bytes, *, durable: bool = True) -> None:
        target = self._file(path)
        directory = os.path.dirname(target)
        temp = self._write_temp(directory, target, data, durable)
        try:
            os.replace(temp, target)
        except OSError as exc:
            _unlink_if_present(temp)
            raise StorageError(f"cannot replace {target}: {exc.strerror}", url=target) from None
        if durable:
            fsync_directory(directory)

    @staticmethod
    def _write_temp(directory: str, target: str, data: bytes, durable: bool = True) -> str:
        """Write ``data`` to a fresh temp file beside ``target`` (fsync'ed if durable); return its path."""
        validate_data(data, target)
        temp = os.path.join(directory, f"{TEMP_MARKER}{os.path.basename(target)}."
                                       f"{os.getpid()}.{uuid.uuid4().hex[:12]}")
        try:
            # 0o666 minus the umask, like any ordinary file: lakes are shared.
            fd = _open_in_folder(directory, temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC)
        except OSError as exc:
            raise StorageError(f"cannot write {target}: {exc.strerror}", url=target) from None
        try:
            with open(fd, "wb") as out:
                out.write(data)
                out.flush()
                if durable:
                    os.fsync(out.fileno())
        except OSError as exc:
            _unlink_if_present(temp)
            raise StorageError(f"cannot write {target}: {exc.strerror}", url=target) from None
        except BaseException:
            _unlink_if_present(temp)
            raise
        return temp

    # --- reads -------------------------------------------------------------

    def read(self, path: str, *, max_bytes: int | None = None) -> bytes:
        target = self._file(path)
        try:
            with open(target, "rb") as f:
                return check_size(f.read(-1 if max_bytes is None else max_bytes + 1), max_bytes, target)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"no object at {target}", url=target) from None
        except OSError as exc:
            raise StorageError(f"cannot read {target}: {exc.strerror}", url=target) from None

    def read_versioned(self, path: str, *, max_bytes: int | None = None) -> tuple[bytes, int]:
        target = self._file(path)
        try:
            with open(target, "rb") as f:
                # fstat of the open file: the generation of the very bytes read,
                # even if a writer renames a new version over the name meanwhile.
                generation = os.fstat(f.fileno()).st_mtime_ns
                data = f.read(-1 if max_bytes is None else max_bytes + 1)
                return check_size(data, max_bytes, target, generation), generation
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"no object at {target}", url=target) from None
        except OSError as exc:
            raise StorageError(f"cannot read {target}: {exc.strerror}", url=target) from None

    def write_if_generation(self, path: str, data: bytes, generation: int) -> int:
        """Compare-and-swap under an flock on a lock file beside the object.

        The generation is the file's st_mtime_ns.  Each conditional write
        sets it explicitly to max(now, previous + 1), so it grows with every
        write even when two land within the clock's resolution.  Writers on
        other machines sharing the folder over a network filesystem are only
        as safe as its flock.
        """
        target = self._file(path)
        directory = os.path.dirname(target)
        lock_path = os.path.join(directory, f"{TEMP_MARKER}lock-{os.path.basename(target)}")
        with open(_open_in_folder(directory, lock_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC),
                  "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                current = os.stat(target).st_mtime_ns
            except FileNotFoundError:
                current = 0
            if current != generation:
                raise PreconditionFailed(f"{target} is at generation {current}, not {generation}; "
                                         "another writer changed it", url=target)
            new_generation = max(time.time_ns(), current + 1)
            temp = self._write_temp(directory, target, data)
            try:
                os.utime(temp, ns=(new_generation, new_generation))
                os.replace(temp, target)
            except OSError as exc:
                _unlink_if_present(temp)
                raise StorageError(f"cannot replace {target}: {exc.strerror}", url=target) from None
            fsync_directory(directory)
            return new_generation

    def exists(self, path: str) -> bool:
        return os.path.isfile(self._file(path))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        validate_prefix(prefix)
        directory_part = prefix.rpartition("/")[0]
        start = self._file(directory_part) if directory_part else self._root
        found = []

        def unreadable(error: OSError) -> None:
            # A folder deleted while we list it is simply gone; one we cannot
            # read would hide objects, so it is an error, never a silent skip.
            if not isinstance(error, FileNotFoundError):
                raise StorageError(f"cannot list {error.filename}: {error.strerror}", url=error.filename or "")

        for dirpath, dirnames, filenames in os.walk(start, onerror=unreadable):
            # Descend only into directories that can hold matching paths.
            dirnames[:] = sorted(d for d in dirnames if _may_hold(self._relative(os.path.join(dirpath, d)), prefix))
            for name in filenames:
                if name.startswith(TEMP_MARKER):
                    continue
                full = os.path.join(dirpath, name)
                relative = self._relative(full)
                if not relative.startswith(prefix):
                    continue
                try:
                    info = os.stat(full)
                except FileNotFoundError:  # deleted while we listed
                    continue
                except OSError as exc:     # a symlink loop (ELOOP), a dangling or unreadable entry
                    raise StorageError(f"cannot list {full}: {exc.strerror}", url=full) from None
                if stat.S_ISREG(info.st_mode):
                    found.append(ObjectInfo(relative, info.st_size))
        found.sort()
        return found

    # --- deletes -----------------------------------------------------------

    def delete(self, path: str, *, missing_ok: bool = False) -> None:
        target = self._file(path)
        try:
            os.unlink(target)
        except FileNotFoundError:
            if not missing_ok:
                raise NotFound(f"no object at {target}", url=target) from None
        except OSError as exc:
            raise StorageError(f"cannot delete {target}: {exc.strerror}", url=target) from None
        self._prune_empty_folders(os.path.dirname(target))

    def _prune_empty_folders(self, directory: str) -> None:
        """Remove ``directory`` and its parents below the root while they are empty.

        An object store has no folders: a prefix exists while objects have it.
        Without this, every job's ``tmp/<job>-<gen>-<attempt>/`` pieces would
        leave their empty folders behind for ever.  A writer racing this finds
        its folder gone between making it and creating its temp file, and makes
        it again (`_open_in_folder`).
        """
        while directory.startswith(self._root + os.sep):
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                pass                  # already pruned by another delete: its parent may still be empty
            except OSError:
                return                # not empty (or not ours to remove): every parent holds it
            directory = os.path.dirname(directory)

    def remove_stale_temp_files(self, older_than_s: float = 3600.0) -> int:
        """Delete temp files left by crashed writers that are older than
        ``older_than_s`` seconds (younger ones may belong to a live writer).
        Returns how many were removed."""
        cutoff = time.time() - older_than_s
        removed = 0
        for dirpath, _, filenames in os.walk(self._root):
            for name in filenames:
                full = os.path.join(dirpath, name)
                try:
                    if name.startswith(TEMP_MARKER) and os.stat(full).st_mtime < cutoff:
                        os.unlink(full)
                        removed += 1
                except FileNotFoundError:
                    continue
        return removed


def write_local_file(target: str, data: bytes) -> None:
    """Atomically create or replace one local file (temp file, fsync, rename).

    For caches and stage directories outside any lake root: the same
    machinery as LocalStorage.write_replace, so no reader ever sees a partial
    file under ``target``'s name.
    """
    directory, name = os.path.split(os.path.abspath(target))
    LocalStorage(directory).write_replace(name, data)


def _may_hold(relative_dir: str, prefix: str) -> bool:
    """Whether the directory ``relative_dir`` can contain paths starting with ``prefix``."""
    with_slash = relative_dir + "/"
    return with_slash.startswith(prefix) or prefix.startswith(with_slash)


def fsync_directory(directory: str) -> None:
    """Make a directory entry change durable (POSIX needs an fsync of the directory)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_in_folder(directory: str, path: str, flags: int, attempts: int = 5) -> int:
    """os.open(path, flags, 0o666) in ``directory``, made first if missing.

    A delete in another process prunes folders it leaves empty
    (`LocalStorage._prune_empty_folders`), possibly between our makedirs and
    open: then the folder is made again.
    """
    for _ in range(attempts - 1):
        try:
            os.makedirs(directory, exist_ok=True)
            return os.open(path, flags, 0o666)
        except FileNotFoundError:
            continue
    os.makedirs(directory, exist_ok=True)
    return os.open(path, flags, 0o666)


def _unlink_if_present(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
