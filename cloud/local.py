"""Local-directory backend of the storage interface (see cloud.base for terms).

A whole-object write goes to a temp file ``.zl-tmp-<name>.<pid>.<random>`` in the object's own
directory (same filesystem), fsync'ed; ``write_new`` then hard-links it to the final name (link(2)
fails with EEXIST, so of two racing writers exactly one wins), ``write_replace`` renames it; the
temp name is unlinked and the directory fsync'ed.  A killed writer leaves only a temp file, never
listed (`LocalStorage.remove_stale_temp_files` sweeps them).  ``write_if_generation`` also holds an
flock on ``.zl-tmp-lock-<name>`` beside the object, which lives as long as the object does.

Every OS failure is a `StorageError` naming the object, never a raw OSError.  Folders appear with
the first write under them and go with the delete that empties them (the root stays).  Symbolic
links are followed anywhere (root, folder, file); a path is always the name under the root, a link
loop is skipped and logged once, and a dangling link is a StorageError, never an empty listing.
Only regular files are objects: FIFOs, sockets and devices are never listed or opened.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
import uuid

from cloud.base import (
    TEMP_MARKER,
    AlreadyExists,
    NotFound,
    ObjectInfo,
    PreconditionFailed,
    Storage,
    StorageError,
    check_listed_name,
    check_size,
    skip_stray_name,
    validate_data,
    validate_path,
    validate_prefix,
    warn_once,
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
                raise AlreadyExists(f"{target} already exists; write_new never overwrites", url=target) from None
            except OSError as exc:
                raise StorageError(f"cannot create {target}: {exc.strerror}", url=target) from None
            _fsync_folder(directory, target)
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
            _fsync_folder(directory, target)

    def _write_temp(self, directory: str, target: str, data: bytes, durable: bool = True) -> str:
        """Write ``data`` to a fresh temp file beside ``target`` (fsync'ed if durable); return its path.

        A write that fails (a full disk) removes the folders it made and left empty: a shuffle job
        retried every 30 s on a full disk left one ``tmp/shuffle-*`` chain a try."""
        validate_data(data, target)
        temp = os.path.join(directory, f"{TEMP_MARKER}{os.path.basename(target)}.{os.getpid()}.{uuid.uuid4().hex[:12]}")
        try:
            # 0o666 minus the umask, like any ordinary file: lakes are shared.
            fd = _open_in_folder(directory, temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC)
        except OSError as exc:
            self._prune_empty_folders(directory)
            raise StorageError(f"cannot write {target}: {exc.strerror}", url=target) from None
        except BaseException:
            # A SIGTERM handler (processes.sigterm) runs right after the C call it interrupted: when
            # that was the open, the file exists but its descriptor never reached us.  The name is ours.
            _unlink_if_present(temp)
            raise
        try:
            with open(fd, "wb") as out:
                out.write(data)
                out.flush()
                if durable:
                    os.fsync(out.fileno())
        except OSError as exc:
            _unlink_if_present(temp)
            self._prune_empty_folders(directory)
            raise StorageError(f"cannot write {target}: {exc.strerror}", url=target) from None
        except BaseException:
            _unlink_if_present(temp)
            raise
        return temp

    # --- reads -------------------------------------------------------------

    def read(self, path: str, *, max_bytes: int | None = None) -> bytes:
        target = self._file(path)
        with self._open_object(target) as f:
            try:
                return check_size(f.read(-1 if max_bytes is None else max_bytes + 1), max_bytes, target)
            except OSError as exc:
                raise StorageError(f"cannot read {target}: {exc.strerror}", url=target) from None

    def read_versioned(self, path: str, *, max_bytes: int | None = None) -> tuple[bytes, int]:
        target = self._file(path)
        with self._open_object(target) as f:
            try:
                # fstat of the open file: the generation of the very bytes read,
                # even if a writer renames a new version over the name meanwhile.
                generation = os.fstat(f.fileno()).st_mtime_ns
                data = f.read(-1 if max_bytes is None else max_bytes + 1)
            except OSError as exc:
                raise StorageError(f"cannot read {target}: {exc.strerror}", url=target) from None
            return check_size(data, max_bytes, target, generation), generation

    @staticmethod
    def _open_object(target: str):
        """The object file ``target`` open for reading: NotFound if absent (or a
        folder), StorageError if it is no regular file or cannot be opened.

        O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer
        for ever; for a regular file the flag changes nothing."""
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"no object at {target}", url=target) from None
        except OSError as exc:
            raise StorageError(f"cannot read {target}: {exc.strerror}", url=target) from None
        try:
            mode = os.fstat(fd).st_mode
        except OSError as exc:
            os.close(fd)
            raise StorageError(f"cannot read {target}: {exc.strerror}", url=target) from None
        if stat.S_ISREG(mode):
            return open(fd, "rb")
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise NotFound(f"no object at {target} (a folder)", url=target)
        raise StorageError(f"cannot read {target}: {_file_kind(mode)}, not a regular file", url=target)

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
        lock_path = os.path.join(directory, f"{LOCK_MARKER}{os.path.basename(target)}")
        with _locked(directory, lock_path, target):
            try:
                current = _generation_of(target)
            except OSError as exc:
                raise StorageError(f"cannot write {target}: {exc.strerror}", url=target) from None
            if current != generation:
                raise PreconditionFailed(
                    f"{target} is at generation {current}, not {generation}; another writer changed it", url=target
                )
            new_generation = max(time.time_ns(), current + 1)
            temp = self._write_temp(directory, target, data)
            try:
                os.utime(temp, ns=(new_generation, new_generation))
                os.replace(temp, target)
            except OSError as exc:
                _unlink_if_present(temp)
                raise StorageError(f"cannot replace {target}: {exc.strerror}", url=target) from None
            _fsync_folder(directory, target)
            return new_generation

    def exists(self, path: str) -> bool:
        return os.path.isfile(self._file(path))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        validate_prefix(prefix)
        directory_part = prefix.rpartition("/")[0]
        start = self._file(directory_part) if directory_part else self._root
        found = [
            ObjectInfo(relative, info.st_size)
            for name, full, relative, info in self._walk(start, prefix)
            if stat.S_ISREG(info.st_mode) and not name.startswith(TEMP_MARKER) and check_listed_name(full, relative)
        ]
        found.sort()
        return found

    def _walk(self, start: str, prefix: str, *, strict: bool = True):
        """(name, full file name, path, os.stat) of every entry that is no folder under
        the folder ``start`` whose path starts with ``prefix``, following links (module
        docstring), in no order; temp files and stray names included, unchecked.

        Folders that cannot hold such paths are not entered, nor are folders with
        stray names or links that loop (both reported once).  ``strict``: a folder
        that cannot be read, a dangling link or an entry that cannot be stat'ed is a
        StorageError (a listing must not hide objects); otherwise it is passed by.
        """
        chain = self._folder_chain(start, strict)
        if chain is None:
            return
        pending = [(start, "" if start == self._root else self._relative(start), chain)]
        while pending:
            directory, folder_path, chain = pending.pop()
            try:
                with os.scandir(directory) as listing:
                    names = [entry.name for entry in listing]
            except (FileNotFoundError, NotADirectoryError):
                continue  # deleted (or replaced by a file) while we listed: nothing under it now
            except OSError as exc:
                # A folder we cannot read would hide objects: an error, never a silent skip.
                if strict:
                    raise StorageError(f"cannot list {directory}: {exc.strerror}", url=directory) from None
                continue
            for name in names:
                full = os.path.join(directory, name)
                relative = f"{folder_path}/{name}" if folder_path else name
                if not (relative.startswith(prefix) or _may_hold(relative, prefix)):
                    continue  # neither a match nor a folder that may hold one: not even stat'ed
                info = _stat_listed(full, strict)
                if info is None:
                    continue  # deleted while we listed
                if not stat.S_ISDIR(info.st_mode):
                    if relative.startswith(prefix):
                        yield name, full, relative, info
                    continue
                if not _may_hold(relative, prefix) or not check_listed_name(full, relative):
                    continue
                folder = (info.st_dev, info.st_ino)
                if folder in chain:
                    skip_stray_name(
                        full, "a link to a folder that holds it (a loop); what is under it is listed under its own name"
                    )
                    continue
                pending.append((full, relative, chain | {folder}))

    def _folder_chain(self, start: str, strict: bool = True) -> frozenset | None:
        """(st_dev, st_ino) of the root and of each folder down to ``start`` (the
        loop guard's starting point), or None when ``start`` holds nothing: it is
        missing, or a file where a folder would be.  A component that is a
        dangling link, or a root that is no folder, raises StorageError when ``strict``."""
        names = [] if start == self._root else self._relative(start).split("/")
        chain, current = set(), self._root
        for name in [None, *names]:
            if name is not None:
                current = os.path.join(current, name)
            info = _stat_listed(current, strict)
            if info is None:
                return None
            if not stat.S_ISDIR(info.st_mode):
                if current == self._root and strict:
                    raise StorageError(f"cannot list {current}: {_file_kind(info.st_mode)}, not a folder", url=current)
                return None
            chain.add((info.st_dev, info.st_ino))
        return frozenset(chain)

    # --- deletes -----------------------------------------------------------

    def delete(self, path: str, *, missing_ok: bool = False) -> None:
        target = self._file(path)
        directory = os.path.dirname(target)
        lock_path = os.path.join(directory, f"{LOCK_MARKER}{os.path.basename(target)}")
        if os.path.exists(lock_path):
            # An object written conditionally (a claim, the lease) takes its lock file with it,
            # or one would stay for every claim ever made (the soak check counted one a window).
            # Both go under the lock: a writer waiting on it then finds the name no longer
            # names the file it locked, and locks a new one (`_locked`).
            with _locked(directory, lock_path, target):
                self._unlink(target, missing_ok)
                _unlink_if_present(lock_path)
        else:
            self._unlink(target, missing_ok)
        self._prune_empty_folders(directory)

    @staticmethod
    def _unlink(target: str, missing_ok: bool) -> None:
        try:
            os.unlink(target)
        except FileNotFoundError:
            if not missing_ok:
                raise NotFound(f"no object at {target}", url=target) from None
        except OSError as exc:
            raise StorageError(f"cannot delete {target}: {exc.strerror}", url=target) from None

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
                pass  # already pruned by another delete: its parent may still be empty
            except OSError:
                return  # not empty (or not ours to remove): every parent holds it
            directory = os.path.dirname(directory)

    def remove_stale_temp_files(self, older_than_s: float = 3600.0) -> int:
        """Delete temp files left by crashed writers that are older than
        ``older_than_s`` seconds (younger ones may belong to a live writer),
        under links too (module docstring).  Returns how many were removed.

        Lock files (`write_if_generation`) are kept: one per conditional
        object, never growing, and one in use must stay the file its writers
        lock.  Housekeeping never stops its caller: a temp file that cannot be
        removed (a read-only disk, another user's) is reported once and kept.
        """
        cutoff = time.time() - older_than_s
        removed = 0
        for name, full, _, info in self._walk(self._root, "", strict=False):
            if not name.startswith(TEMP_MARKER) or name.startswith(LOCK_MARKER) or info.st_mtime >= cutoff:
                continue
            try:
                os.unlink(full)
            except FileNotFoundError:
                continue
            except OSError as exc:
                warn_once(full, f"cannot remove the stale temp file {full!r} ({exc.strerror}); kept")
                continue
            removed += 1
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


LOCK_MARKER = f"{TEMP_MARKER}lock-"
"""Lock files of conditional writes: ``.zl-tmp-lock-<object name>`` beside the object."""


@contextlib.contextmanager
def _locked(directory: str, lock_path: str, target: str):
    """An exclusive flock on the lock file ``lock_path`` (made if missing) for the
    object ``target``, held for the ``with`` block.

    If the file was removed or replaced between our open and our flock (a
    cleaner of a crashed writer's files, an operator), the lock we hold locks
    nothing that the next writer will open: open the name again.  Every
    failure is a StorageError naming the object: a read-only disk, a
    permission denied, a file where a folder should be.
    """
    for _ in range(100):
        try:
            fd = _open_in_folder(directory, lock_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                current = _still_named(fd, lock_path)
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            raise StorageError(
                f"cannot write {target}: {exc.strerror} (its lock file {lock_path})", url=target
            ) from None
        try:
            if current:
                yield
                return
        finally:
            os.close(fd)
    raise StorageError(f"cannot write {target}: its lock file {lock_path} keeps being replaced", url=target)


def _still_named(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    held = os.fstat(fd)
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _stat_listed(full: str, strict: bool = True) -> os.stat_result | None:
    """os.stat of a listed entry (following a link); None if it was deleted
    meanwhile (or a file now stands where one of its folders was).  A dangling
    link, a link loop (ELOOP) or an entry that cannot be read: StorageError when
    ``strict``, else None."""
    try:
        return os.stat(full)
    except (FileNotFoundError, NotADirectoryError):
        if strict:
            _refuse_dangling_link(full)
        return None
    except OSError as exc:
        if strict:
            raise StorageError(f"cannot list {full}: {exc.strerror}", url=full) from None
        return None


def _refuse_dangling_link(full: str) -> None:
    """StorageError if ``full``, found missing, is a link whose target is missing
    (module docstring); nothing if it is simply not there."""
    try:
        target = os.readlink(full)
    except OSError:
        return
    raise StorageError(f"cannot list {full}: a link to {target}, which does not exist (a disk not mounted?)", url=full)


def _file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, kind in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return "a special file"


def _generation_of(target: str) -> int:
    """The generation of the object file ``target`` (its st_mtime_ns), 0 when absent."""
    try:
        info = os.stat(target)
    except FileNotFoundError:
        return 0
    if not stat.S_ISREG(info.st_mode):
        raise StorageError(f"cannot write {target}: {_file_kind(info.st_mode)} is in the way", url=target)
    return info.st_mtime_ns


def _fsync_folder(directory: str, target: str) -> None:
    """fsync_directory, its failure a StorageError naming the object ``target`` just written."""
    try:
        fsync_directory(directory)
    except OSError as exc:
        raise StorageError(f"cannot make {target} durable: {exc.strerror}", url=target) from None


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
            _make_folder(directory)
            return os.open(path, flags, 0o666)
        except FileNotFoundError:
            continue
    _make_folder(directory)
    return os.open(path, flags, 0o666)


def _make_folder(directory: str) -> None:
    """os.makedirs(directory, exist_ok=True), saying what its "File exists" means.

    makedirs also says "File exists" when a delete pruned the folder between its
    mkdir (EEXIST) and its check that the name is a folder: that is the race
    `_open_in_folder` retries (FileNotFoundError), not a file in the way.
    """
    for _ in range(5):
        try:
            os.makedirs(directory, exist_ok=True)
            return
        except FileExistsError:
            if os.path.lexists(directory) and not os.path.isdir(directory):
                raise NotADirectoryError(errno.ENOTDIR, "a file is where a folder should be", directory) from None
    raise FileNotFoundError(errno.ENOENT, "the folder keeps being removed while it is made", directory)


def _unlink_if_present(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
