"""The worker's local spool: finished games live on local disk until their chunk is in the lake.

A preemptible worker can be SIGKILLed at any moment, and a game that waited
in memory for its chunk (up to ``--chunk-seconds``) would die with it.  So a
finished game is on local disk, checksummed and fsync'ed, before the worker
says it exists (the ``game_finished`` event), and it leaves the disk only once
the chunk that holds it is in the lake.

Terms: an *entry* is one finished game's file: a header (magic, generation,
payload length, sha256 of the payload) and the payload, the game's record as
`format.codec.encode_game` serializes it, written whole or not at all
(`cloud.local.write_local_file`).  A *loose* entry is one no batch lists yet.
A *batch* (`Batch`) fixes a list of entries of one generation and the chunk
path they will be uploaded as.  A *corrupt* entry (`CorruptEntry`) costs only
itself.  A full disk raises `SpoolFull` and changes nothing.

Data flow: a game ends → `Spool.add` (entry, fsync, rename) → ``game_finished``
→ `Spool.make_batch` once ``--chunk-games`` entries of a generation are loose
(or the oldest has waited ``--chunk-seconds``) → `Spool.upload` frames them
(`format.codec.frame_chunk`) and writes the chunk create-only → the entries are
deleted, then the batch file.  A kill between any two steps leaves a state that
opening the spool again (`Spool`) and `Spool.upload` finish without losing or
duplicating a game: entries are deleted before their batch file, so a batch
whose entries are partly gone has its chunk in the lake.  Folder layout: `Spool`.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import struct
import time

from cloud.base import TEMP_MARKER, AlreadyExists, NotFound, StorageError
from cloud.local import fsync_directory, write_local_file
from format import layout
from format.codec import chunk_records, frame_chunk
from format.tfrecord import RecordError

log = logging.getLogger("selfplay.spool")

MAGIC = b"ZLSPOOL1"
_HEADER = struct.Struct(">8sIQ32s")  # magic, generation, payload bytes, sha256(payload)
BATCH_VERSION = 1
ENTRY_SUFFIX = ".game"
SERIAL_BLOCK = 4096
"""Game serials reserved per durable write of the high-water mark."""
_ENTRY_NAME = re.compile(r"(?P<gen>\d{6})-(?P<game>[A-Za-z0-9_.]+)" + re.escape(ENTRY_SUFFIX))
_BATCH_NAME = re.compile(r"batch-(?P<seq>\d{8})\.json")
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
RESERVE_BYTES = 1 << 20
"""Room kept for batch files: the file of a batch of 2,000 games (the default --chunk-games) is
100-200 KB, and a batch that does not fit is made smaller."""


def entries_dir(directory: str) -> str:
    """The folder of a spool's entries (``SPOOL/games/``), where a finished game waits for its chunk."""
    return os.path.join(directory, "games")


class SpoolError(RuntimeError):
    """The spool folder cannot be used (the message names it)."""


class SpoolLocked(SpoolError):
    """Another live process holds the spool's lock."""

    def __init__(self, directory: str, holder: str):
        super().__init__(
            f"spool {directory} is in use by another worker (pid {holder}); give this worker its own --spool-dir"
        )
        self.directory = directory
        self.holder = holder


class SpoolOfOtherLake(SpoolError):
    """The spool holds (or held) games of another lake than the one asked for."""

    def __init__(self, directory: str, holds: str, wanted: str):
        super().__init__(
            f"spool {directory} belongs to the lake {holds}, not {wanted}: its games are uploaded "
            f"only there (run a worker on that root to upload them); give this worker another "
            f"--spool-dir"
        )
        self.directory = directory
        self.holds = holds


class SpoolFull(SpoolError):
    """The spool's disk has no room for a write (ENOSPC, or EDQUOT on a quota); nothing was changed.

    Uploading is what makes room, and it needs small writes itself (a batch
    file), so the spool keeps ``RESERVE``, `RESERVE_BYTES` allocated bytes
    that it gives up only to write a batch file on a full disk (a batch that
    still does not fit is made smaller, down to one game), and allocates again
    once uploads have made room.  Game entries and serial marks never use it:
    the worker stops playing until there is room (see `selfplay.worker`).
    """


class CorruptEntry(SpoolError):
    """An entry's header or checksum is wrong (a torn disk, a truncated copy): it is moved to
    ``corrupt/`` and reported, and costs only itself."""


@dataclasses.dataclass(frozen=True)
class Batch:
    """A batch file's contents: ``batches/batch-<seq:08d>.json``, a fixed list of entries (one generation).

    The chunk's name (worker id, the batch's creation time, its seq) is fixed
    when the batch is written, before any upload, so re-uploading a batch
    after a kill aims at the same object: the lake's create-only write then
    refuses it, and an identical stored object (the same records) means the
    earlier upload succeeded.
    """

    seq: int
    created_ms: int
    generation: int
    worker_id: str
    chunk: str
    """Lake path the batch is uploaded as (from format.layout.chunk_path)."""
    entries: tuple[str, ...]

    @property
    def file_name(self) -> str:
        return f"batch-{self.seq:08d}.json"


def encode_entry(generation: int, payload: bytes) -> bytes:
    return _HEADER.pack(MAGIC, generation, len(payload), hashlib.sha256(payload).digest()) + payload


def decode_entry(data: bytes, name: str) -> tuple[int, bytes]:
    """(generation, payload) of an entry's bytes; CorruptEntry names what is wrong."""
    if len(data) < _HEADER.size:
        raise CorruptEntry(f"{name}: truncated header ({len(data)} bytes)")
    magic, generation, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptEntry(f"{name}: not a spool entry (magic {magic!r})")
    payload = data[_HEADER.size :]
    if len(payload) != length:
        raise CorruptEntry(f"{name}: payload is {len(payload)} bytes, header says {length}")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptEntry(f"{name}: sha256 mismatch")
    return generation, payload


class Spool:
    """One worker's spool folder, locked for the life of the object (`close()` unlocks).

    Folder::

        SPOOL/LOCK            fcntl.flock'ed by the one process using the spool; holds its pid
        SPOOL/LAKE            the canonical root (`cloud.storage.canonical_root`) of the one lake
                              whose games this spool holds: a spool never uploads into another lake
        SPOOL/RESERVE         room kept for batch files on a full disk (`SpoolFull`)
        SPOOL/games/          entries: <gen:06d>-<game id>.game
        SPOOL/batches/        batch files (`Batch`)
        SPOOL/corrupt/        entries (and batch files) that failed their checks
        SPOOL/*/.zl-tmp-*     files being written (cloud.base.TEMP_MARKER; removed when the spool opens)
        SPOOL/serials/<seed>  high-water mark of the game serials handed out for a worker seed,
                              so a worker restarted with the same --seed never replays a game

    ``reserve_bytes``: the size of ``RESERVE`` (0: none; see `SpoolFull`).
    ``lake``: the canonical root of the lake it serves (`cloud.storage.
    canonical_root`); a spool bound to another lake raises `SpoolOfOtherLake`
    (its lock released), one bound to none is bound to this one.  None: no
    check (tools that only read a spool).
    """

    def __init__(self, directory: str, reserve_bytes: int = RESERVE_BYTES, *, lake: str | None = None):
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.reserve_path = os.path.join(self.directory, "RESERVE")
        self.reserve_bytes = reserve_bytes
        self.games_dir = entries_dir(self.directory)
        self.batches_dir = os.path.join(self.directory, "batches")
        self.corrupt_dir = os.path.join(self.directory, "corrupt")
        self.serials_dir = os.path.join(self.directory, "serials")
        try:
            for folder in (self.games_dir, self.batches_dir, self.corrupt_dir, self.serials_dir):
                os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise SpoolError(f"spool {self.directory}: cannot create it ({exc.strerror})") from None
        self._lock_fd: int | None = self._lock()
        if lake is not None:
            try:
                self._bind_lake(lake)
            except BaseException:
                self.close()
                raise
        # A killed writer's temp files (RESERVE's sits in the spool folder itself).
        for folder in (self.directory, self.games_dir, self.batches_dir, self.serials_dir):
            for name in os.listdir(folder):
                if name.startswith(TEMP_MARKER):
                    os.unlink(os.path.join(folder, name))
        self.corrupt: list[str] = []
        """Messages about entries and batch files moved to corrupt/ since the spool opened."""
        self.batches: list[Batch] = self._read_batches()
        batched = {name for batch in self.batches for name in batch.entries}
        self.loose: dict[int, list[str]] = {}
        """Loose entries by generation, oldest first."""
        self.oldest: dict[int, float] = {}
        """time.monotonic() of each generation's oldest loose entry (-inf for leftovers: due now)."""
        for name in sorted(os.listdir(self.games_dir)):
            match = _ENTRY_NAME.fullmatch(name)
            if not match:
                self._move_aside(self.games_dir, name, "not an entry name")
                continue
            if name in batched:
                continue
            generation = int(match["gen"])
            self.loose.setdefault(generation, []).append(name)
            self.oldest[generation] = -float("inf")
        self._next_seq = max((b.seq for b in self.batches), default=-1) + 1
        self._serial_limit: dict[int, int] = {}
        self.keep_reserve()

    # ---- the lock -----------------------------------------------------------

    def _lock(self) -> int:
        path = os.path.join(self.directory, "LOCK")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise SpoolLocked(self.directory, holder) from None
            raise SpoolError(f"spool {self.directory}: cannot lock {path} ({exc.strerror})") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            # The pid only names the holder in a refusal; a full disk must not stop
            # the worker that would upload the spool and so make room.
            if exc.errno not in NO_ROOM:
                raise
        return fd

    def _bind_lake(self, lake: str) -> None:
        """Check SPOOL/LAKE against ``lake``, writing it on first use (under the lock).

        Without it a spool is found by its folder name alone, and a spool
        reached from another lake (a reused --spool-dir, two runs on one
        machine) would upload one run's games into the other's lake.
        """
        path = os.path.join(self.directory, "LAKE")
        try:
            with open(path, "rb") as handle:
                holds = handle.read(4097).decode("utf-8", "replace").strip()
        except FileNotFoundError:
            for attempt in range(2):
                try:
                    write_local_file(path, (lake + "\n").encode())
                    return
                except StorageError as exc:
                    # A full disk must not stop the worker whose uploads would make room:
                    # the reserve pays for this small file as it does for batch files.
                    if attempt or not (_no_room(exc) and self._release_reserve()):
                        raise SpoolError(f"spool {self.directory}: cannot record its lake ({exc})") from None
        except OSError as exc:
            raise SpoolError(f"spool {self.directory}: cannot read {path} ({exc.strerror})") from None
        if holds != lake:
            raise SpoolOfOtherLake(self.directory, holds, lake)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    # ---- writes and the reserve ----------------------------------------------

    def _write(self, path: str, data: bytes, *, use_reserve: bool = False) -> None:
        """Write one spool file whole; SpoolFull when its disk has no room for it.

        ``use_reserve``: on a full disk, give up ``RESERVE`` and try once more
        (only for what uploading needs).
        """
        # A second try only after the reserve made room for it.
        for attempt in range(2):
            if attempt and not (use_reserve and self._release_reserve()):
                break
            try:
                write_local_file(path, data)
                return
            except (OSError, StorageError) as exc:
                if not _no_room(exc):
                    raise
        raise SpoolFull(
            f"the spool at {self.directory} is full (no room to write {os.path.relpath(path, self.directory)})"
        )

    def keep_reserve(self) -> None:
        """Allocate ``RESERVE`` if it is missing and the disk has room for it (else a later call does)."""
        if not self.reserve_bytes or os.path.isfile(self.reserve_path):
            return
        temp = os.path.join(self.directory, f"{TEMP_MARKER}RESERVE")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                try:
                    os.posix_fallocate(fd, 0, self.reserve_bytes)
                except OSError as exc:
                    if exc.errno in NO_ROOM:
                        raise
                    os.write(fd, bytes(self.reserve_bytes))  # a filesystem without fallocate
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, self.reserve_path)
        except OSError as exc:
            try:
                os.unlink(temp)
            except FileNotFoundError:
                pass
            if exc.errno not in NO_ROOM:
                log.warning(
                    "spool: cannot allocate %s (%s); a full disk may then stop uploads", self.reserve_path, exc.strerror
                )

    def _release_reserve(self) -> bool:
        try:
            os.unlink(self.reserve_path)
        except FileNotFoundError:
            return False
        return True

    # ---- entries ------------------------------------------------------------

    @property
    def spooled(self) -> int:
        """Games on disk: loose plus batched."""
        return sum(len(v) for v in self.loose.values()) + sum(len(b.entries) for b in self.batches)

    def add(self, generation: int, game_id: str, payload: bytes) -> str:
        """Spool one finished game durably; returns the entry's name."""
        name = f"{layout.generation_dir(generation)}-{game_id}{ENTRY_SUFFIX}"
        if not _ENTRY_NAME.fullmatch(name):
            raise ValueError(f"game id {game_id!r} may hold only letters, digits, '_' and '.'")
        self._write(os.path.join(self.games_dir, name), encode_entry(generation, payload))
        if not self.loose.get(generation):
            self.oldest[generation] = time.monotonic()
        self.loose.setdefault(generation, []).append(name)
        return name

    def read_entry(self, name: str) -> bytes | None:
        """An entry's payload; None if it is gone or corrupt (then moved aside and reported)."""
        try:
            with open(os.path.join(self.games_dir, name), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        try:
            generation, payload = decode_entry(data, os.path.join(self.games_dir, name))
            match = _ENTRY_NAME.fullmatch(name)
            if match is None:
                raise SpoolError(f"spool {self.directory}: a batch lists {name!r}, which is not an entry name")
            expected = int(match["gen"])
            if generation != expected:
                raise CorruptEntry(f"{name}: header says generation {generation}, the name {expected}")
        except CorruptEntry as exc:
            self._move_aside(self.games_dir, name, str(exc))
            return None
        return payload

    def _move_aside(self, folder: str, name: str, why: str) -> None:
        target = os.path.join(self.corrupt_dir, f"{name}.{int(time.time() * 1000)}")
        os.replace(os.path.join(folder, name), target)
        message = f"spool: moved {os.path.join(folder, name)} to {target}: {why}"
        log.error(message)
        self.corrupt.append(message)

    # ---- batches ------------------------------------------------------------

    def due(self, chunk_games: int, chunk_seconds: float, everything: bool = False) -> list[int]:
        """Generations whose loose entries should become a batch now."""
        now = time.monotonic()
        return [
            gen
            for gen, names in self.loose.items()
            if names and (everything or len(names) >= chunk_games or now - self.oldest[gen] >= chunk_seconds)
        ]

    def make_batch(self, generation: int, worker_id: str, chunk_games: int) -> Batch:
        """Write a batch file for up to ``chunk_games`` loose entries of a generation (oldest first).

        On a full disk the batch gets fewer games (down to one: SpoolFull) so
        that its file fits; its upload makes room for the rest.
        """
        names = self.loose[generation][:chunk_games]
        while True:
            try:
                batch = self._write_batch(generation, worker_id, tuple(names))
                break
            except SpoolFull:
                if len(names) == 1:
                    raise
                names = names[: len(names) // 2]
        self.loose[generation] = self.loose[generation][len(names) :]
        self.oldest[generation] = time.monotonic() if self.loose[generation] else 0.0
        return batch

    def _write_batch(self, generation: int, worker_id: str, names: tuple[str, ...]) -> Batch:
        created_ms = int(time.time() * 1000)
        seq = self._next_seq
        batch = Batch(
            seq=seq,
            created_ms=created_ms,
            generation=generation,
            worker_id=worker_id,
            chunk=layout.chunk_path(generation, worker_id, created_ms, seq),
            entries=names,
        )
        document = {"version": BATCH_VERSION, **dataclasses.asdict(batch), "entries": list(names)}
        self._write(
            os.path.join(self.batches_dir, batch.file_name), json.dumps(document, indent=1).encode(), use_reserve=True
        )
        self._next_seq += 1
        self.batches.append(batch)
        return batch

    def _read_batches(self) -> list[Batch]:
        batches = []
        for name in sorted(os.listdir(self.batches_dir)):
            if not _BATCH_NAME.fullmatch(name):
                self._move_aside(self.batches_dir, name, "not a batch file name")
                continue
            try:
                with open(os.path.join(self.batches_dir, name), "rb") as f:
                    document = json.loads(f.read())
                if document.get("version") != BATCH_VERSION:
                    raise ValueError(f"version {document.get('version')!r}, expected {BATCH_VERSION}")
                batch = Batch(
                    seq=int(document["seq"]),
                    created_ms=int(document["created_ms"]),
                    generation=int(document["generation"]),
                    worker_id=str(document["worker_id"]),
                    chunk=str(document["chunk"]),
                    entries=tuple(document["entries"]),
                )
                if batch.file_name != name or layout.parse_chunk_path(batch.chunk) is None:
                    raise ValueError("seq or chunk path does not match")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                # Its entries become loose again and go out in a new batch.
                self._move_aside(self.batches_dir, name, f"unreadable batch file ({exc})")
                continue
            batches.append(batch)
        return batches

    def _forget_batch(self, batch: Batch) -> None:
        os.unlink(os.path.join(self.batches_dir, batch.file_name))
        fsync_directory(self.batches_dir)
        self.batches.remove(batch)

    def upload(self, storage, batch: Batch, worker_id: str) -> tuple[str, int]:
        """Put a batch's chunk in the lake, then delete its entries and the batch file.

        Returns (what happened, games in the chunk): 'uploaded', 'present'
        (an earlier, killed attempt had stored it: same records), or
        'rebatched' (entries went corrupt before any upload, or the chunk name
        held another object: the games stay spooled under a new batch,
        returned as games 0).  Storage errors propagate; the spool is then
        unchanged, and a later call retries.
        """
        payloads = [self.read_entry(name) for name in batch.entries]
        present = [(name, p) for name, p in zip(batch.entries, payloads) if p is not None]
        url = storage.url(batch.chunk)
        if len(present) < len(batch.entries):
            # Entries are deleted only after the chunk is stored, so a batch
            # missing some either was uploaded (finish the clean-up) or lost
            # entries to corruption before its upload (re-batch the rest).
            try:
                stored = storage.read(batch.chunk)
            except NotFound:
                stored = None
            if stored is not None and self._holds(stored, [p for _, p in present], url):
                self._finish(batch)
                return "present", len(batch.entries)
            if stored is not None:
                log.error("spool: %s holds other games than batch %s; keeping its games spooled", url, batch.file_name)
            self._rebatch(batch, tuple(name for name, _ in present), worker_id)
            return "rebatched", 0
        whole = [p for _, p in present]  # every entry's payload, in the batch's order
        data = frame_chunk(whole)
        try:
            storage.write_new(batch.chunk, data)
            outcome = "uploaded"
        except AlreadyExists:
            stored = storage.read(batch.chunk)
            if stored != data and not self._holds(stored, whole, url, exact=True):
                log.error(
                    "spool: CHUNK NAME COLLISION: %s already holds a different object; "
                    "the %d games of %s stay spooled under a new batch",
                    url,
                    len(payloads),
                    batch.file_name,
                )
                self._rebatch(batch, batch.entries, worker_id)
                return "rebatched", 0
            outcome = "present"
        self._finish(batch)
        return outcome, len(payloads)

    @staticmethod
    def _holds(stored: bytes, payloads: list[bytes], url: str, exact: bool = False) -> bool:
        try:
            records = list(chunk_records(stored, url))
        except RecordError:
            return False  # not a readable chunk: not these games
        return records == payloads if exact else set(payloads) <= set(records)

    def _rebatch(self, batch: Batch, names: tuple[str, ...], worker_id: str) -> None:
        if names:
            self._write_batch(batch.generation, worker_id, names)
        self._forget_batch(batch)

    def _finish(self, batch: Batch) -> None:
        # Entries first, the batch file last: see the module docstring.
        for name in batch.entries:
            try:
                os.unlink(os.path.join(self.games_dir, name))
            except FileNotFoundError:
                pass
        fsync_directory(self.games_dir)
        self._forget_batch(batch)
        self.keep_reserve()  # the upload made room: take back what a full disk used

    # ---- game serials ---------------------------------------------------------

    def reserve_serial(self, seed: int, serial: int) -> int:
        """The first serial >= ``serial`` never handed out for ``seed`` on this spool.

        Called for every new game; writes the high-water mark durably once per
        SERIAL_BLOCK games, so a worker restarted with the same --seed starts
        past every game its predecessor may have played.
        """
        limit = self._serial_limit.get(seed)
        if limit is None:
            path = os.path.join(self.serials_dir, str(seed))
            try:
                with open(path) as f:
                    start = int(f.read().strip() or 0)
            except (FileNotFoundError, ValueError):
                start = 0
            serial = max(serial, start)
            limit = serial
        if serial >= limit:
            limit = serial + SERIAL_BLOCK
            self._write(os.path.join(self.serials_dir, str(seed)), f"{limit}\n".encode())
        self._serial_limit[seed] = limit
        return serial


def _no_room(exc: BaseException) -> bool:
    """Whether a failed write found its disk (or quota) full.

    `cloud.local.write_local_file` reports an OSError as a StorageError
    raised while handling it, so the errno is on the exception's context.
    """
    return any(isinstance(e, OSError) and e.errno in NO_ROOM for e in (exc, exc.__cause__, exc.__context__))


def open_spool(directory: str | None, default_base: str, max_slots: int = 64, *, lake: str) -> Spool:
    """The spool at ``directory``, or (None) the first free slot ``<default_base>-<k>``, for ``lake``.

    Slots let several workers with the same root and --worker-id share a
    machine without flags; a restarted worker adopts any slot left unlocked by
    a dead one (and uploads what it left).  ``lake`` is the canonical root
    (`cloud.storage.canonical_root`): a slot bound to another lake is passed
    over, an explicit ``directory`` bound to another raises `SpoolOfOtherLake`.
    """
    if directory:
        return Spool(directory, lake=lake)
    for k in range(max_slots):
        try:
            return Spool(f"{default_base}-{k}", lake=lake)
        except (SpoolLocked, SpoolOfOtherLake):
            continue
    raise SpoolError(f"all {max_slots} spool slots {default_base}-* are in use; give --spool-dir")
