"""Stage mode (``--stage-dir DIR``): TensorFlow reads and writes only local files.

TensorFlow's own gs:// cannot reach a GCS emulator (docs/measured.md), and local SSDs are faster
than the bucket; so in stage mode every byte between the lake (``ROOT``) and the machine goes
through `cloud.base.Storage`, and TensorFlow sees only ``DIR``.  A *checkpoint* is the files
``ckpt-N.*`` (``N`` its step); the *state file* ``checkpoint`` names the latest and kept ones.

``DIR`` holds ``STAGE_ROOT`` (the one root it stages), ``windows/<gen>/`` (copies of the window
being trained only), ``checkpoints/`` and ``logs/``.  Data flow::

    start   pull ROOT/checkpoints if its step is higher (or DIR has none), else push DIR's
    window  ROOT/windows/<gen>/shards --> DIR/windows/<gen>/   (same name and size: already there)
    save    push every kept checkpoint's files create-only, then the state file LAST (so ROOT
            never names a checkpoint whose files are missing), then delete dropped ones
    logs    DIR/logs --> ROOT/logs, changed files whole, at most every ``at_most_every`` s

A pull lands in ``DIR/checkpoints.incoming`` and is swapped in whole.  Failed log uploads are
retried at the next push; training never waits on them.  Nothing under ROOT/windows is deleted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass

from cloud.base import AlreadyExists, NotFound, StorageError
from cloud.local import write_local_file
from cloud.storage import is_remote
from format import layout

log = logging.getLogger(__name__)

STAGE_MARKER = "STAGE_ROOT"
STATE_FILE = "checkpoint"
EMULATOR_VARIABLE = "STORAGE_EMULATOR_HOST"

_PREFIX = re.compile(r"^[A-Za-z0-9_.]+-\d+$")
_CHECKPOINT_FILE = re.compile(r"^(?P<prefix>[A-Za-z0-9_.]+-\d+)\.(?:index|data-\d{5}-of-\d{5})$")
_STATE_LINE = re.compile(r'^(model_checkpoint_path|all_model_checkpoint_paths)\s*:\s*"([^"\\]*)"$')


class StagingError(RuntimeError):
    """The stage directory or ROOT/checkpoints cannot be used as asked; the message says why."""


# --- choosing the mode ------------------------------------------------------------


def default_stage_dir(root_url: str, environ) -> str:
    """``<cache>/zerolake/stage/<hash of the root>``: the same root always gets the same DIR.

    ``<cache>`` is the user's ($XDG_CACHE_HOME, else ~/.cache), not the shared
    temporary folder: a predictable name there could be made first by another
    user (a symlink, or a folder they can write), and TensorFlow would then read
    their shards and write our checkpoints into their hands.
    """
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tag = hashlib.sha256(root_url.encode()).hexdigest()[:12]
    return os.path.join(cache, "zerolake", "stage", tag)


def resolve_stage_dir(stage_dir: str, root_url: str, environ) -> tuple[str, str]:
    """``(DIR, why)`` for stage mode, or ``("", why)`` for direct TensorFlow I/O on ROOT.

    ``--stage-dir`` wins.  Without it, a gs:// root is staged under the
    user's cache folder only when $STORAGE_EMULATOR_HOST is set, because an
    emulator cannot be reached any other way; real GCS is read directly.
    """
    if stage_dir:
        return os.path.abspath(os.path.expanduser(stage_dir)), "--stage-dir"
    if is_remote(root_url) and environ.get(EMULATOR_VARIABLE):
        return default_stage_dir(root_url, environ), (
            f"${EMULATOR_VARIABLE} is set and TensorFlow's gs:// filesystem cannot reach an emulator"
        )
    return "", "no --stage-dir"


# --- checkpoint state files -------------------------------------------------------


def checkpoint_step(prefix: str) -> int:
    """N of ``ckpt-N``."""
    return int(prefix.rsplit("-", 1)[1])


@dataclass(frozen=True)
class CheckpointState:
    """What a state file says: the latest prefix and every kept prefix (oldest first)."""

    latest: str
    kept: tuple[str, ...]

    @property
    def step(self) -> int:
        return checkpoint_step(self.latest)


def parse_checkpoint_state(text: str, where: str) -> CheckpointState | None:
    """The state in a ``checkpoint`` file's text (None if it names no checkpoint).

    Only the two path fields matter here; timestamps are dropped.  Paths are
    reduced to their base names (TensorFlow writes relative ones, but an old
    file may hold absolute ones).
    """
    latest, kept = None, []
    for line in text.splitlines():
        match = _STATE_LINE.match(line.strip())
        if not match:
            continue
        prefix = match.group(2).replace("\\", "/").rsplit("/", 1)[-1]
        if not _PREFIX.match(prefix):
            raise StagingError(f"{where}: {match.group(1)} {match.group(2)!r} is not a checkpoint prefix like ckpt-123")
        if match.group(1) == "model_checkpoint_path":
            latest = prefix
        else:
            kept.append(prefix)
    if latest is None:
        return None
    if latest not in kept:
        kept.append(latest)
    return CheckpointState(latest, tuple(kept))


def format_checkpoint_state(state: CheckpointState) -> str:
    """A state file TensorFlow's CheckpointManager reads (relative paths, no timestamps)."""
    lines = [f'model_checkpoint_path: "{state.latest}"']
    lines += [f'all_model_checkpoint_paths: "{prefix}"' for prefix in state.kept]
    return "\n".join(lines) + "\n"


def checkpoint_prefix_of(name: str) -> str | None:
    """``ckpt-N`` for ``ckpt-N.index`` / ``ckpt-N.data-...``; None for any other name."""
    match = _CHECKPOINT_FILE.match(name)
    return match.group("prefix") if match else None


# --- results ----------------------------------------------------------------------


@dataclass(frozen=True)
class StagedWindow:
    """Local shard files of a window, and what staging it cost."""

    paths: tuple[str, ...]
    copied: int
    already_present: int
    bytes_copied: int


@dataclass(frozen=True)
class PushResult:
    """What one push did: files uploaded, files already in ROOT, old files deleted."""

    latest: str
    uploaded: int
    already_there: int
    deleted: int


class Stage:
    """One stage directory serving one lake root (see the module docstring)."""

    def __init__(self, storage, directory: str):
        self.storage = storage
        self.directory = os.path.abspath(directory)
        self.windows_dir = os.path.join(self.directory, layout.WINDOWS_DIR)
        self.checkpoint_dir = os.path.join(self.directory, layout.CHECKPOINTS_DIR)
        self.log_dir = os.path.join(self.directory, layout.trainer_logs_dir())
        self._logs_pushed: dict[str, int] = {}  # DIR/logs-relative name -> size last uploaded
        self._logs_pushed_at = float("-inf")

    @property
    def remote_checkpoints(self) -> str:
        return self.storage.url(layout.CHECKPOINTS_DIR)

    def claim(self) -> None:
        """Create DIR and bind it to ROOT; refuse a DIR that stages another root.

        Without this a reused DIR could hand another run's checkpoint to this one.
        """
        marker = os.path.join(self.directory, STAGE_MARKER)
        root = self.storage.url("")
        try:
            os.makedirs(self.directory, exist_ok=True)
            if os.path.exists(marker):
                with open(marker, encoding="utf-8") as handle:
                    owner = handle.read().strip()
                if owner != root:
                    raise StagingError(
                        f"--stage-dir {self.directory} stages {owner}, not {root}; "
                        "give each root its own stage directory"
                    )
                return
            write_local_file(marker, (root + "\n").encode())
        except (OSError, StorageError) as exc:
            raise StagingError(f"--stage-dir {self.directory}: cannot use it ({exc})") from None

    # --- windows ----------------------------------------------------------------
    def stage_window(self, generation: int, shards: tuple[str, ...]) -> StagedWindow:
        """Copy a window's files (storage paths: its shards, and its game table when it has
        one) to ``DIR/windows/<gen>/``, keeping their names; ``paths`` are in the same order.

        A local file with the shard's name and size is taken as already
        copied (shards are create-only, never rewritten).  Staged windows of
        other generations are removed from DIR (local copies only: nothing
        under ROOT/windows is ever deleted), so DIR holds one window at a time.
        """
        target_dir = os.path.join(self.windows_dir, layout.generation_dir(generation))
        self._remove_other_windows(layout.generation_dir(generation))
        sizes = {info.path: info.size for info in self.storage.list(layout.window_dir(generation) + "/")}
        paths, copied, present, copied_bytes = [], 0, 0, 0
        for shard in shards:
            local = os.path.join(target_dir, shard.rsplit("/", 1)[-1])
            paths.append(local)
            if shard not in sizes:
                raise StagingError(f"{self.storage.url(shard)} is listed in its window's manifest but does not exist")
            if os.path.isfile(local) and os.path.getsize(local) == sizes[shard]:
                present += 1
                continue
            data = self.storage.read(shard)
            write_local_file(local, data)
            copied += 1
            copied_bytes += len(data)
        return StagedWindow(tuple(paths), copied, present, copied_bytes)

    def _remove_other_windows(self, keep: str) -> None:
        """Delete local copies in DIR/windows except ``keep``; never touches the storage root."""
        if not os.path.isdir(self.windows_dir):
            return
        for name in os.listdir(self.windows_dir):
            if name != keep:
                shutil.rmtree(os.path.join(self.windows_dir, name), ignore_errors=True)

    # --- checkpoint states --------------------------------------------------------
    def local_state(self) -> CheckpointState | None:
        """DIR's state, or None when DIR has no usable checkpoint (no state, or its
        latest checkpoint's index file is missing)."""
        path = os.path.join(self.checkpoint_dir, STATE_FILE)
        try:
            with open(path, encoding="utf-8") as handle:
                state = parse_checkpoint_state(handle.read(), path)
        except FileNotFoundError:
            return None
        if state is None or not os.path.isfile(os.path.join(self.checkpoint_dir, state.latest + ".index")):
            return None
        return state

    def remote_state(self) -> CheckpointState | None:
        path = layout.checkpoint_file(STATE_FILE)
        try:
            data = self.storage.read(path)
        except NotFound:
            return None
        return parse_checkpoint_state(data.decode("utf-8", errors="replace"), self.storage.url(path))

    def _remote_files(self) -> dict[str, int]:
        """Checkpoint file name -> size, for the files directly under ROOT/checkpoints."""
        prefix = layout.checkpoints_prefix()
        found = {}
        for info in self.storage.list(prefix):
            name = info.path[len(prefix) :]
            if "/" not in name and checkpoint_prefix_of(name):
                found[name] = info.size
        return found

    def _local_files(self, prefix: str) -> dict[str, int]:
        if not os.path.isdir(self.checkpoint_dir):
            return {}
        return {
            name: os.path.getsize(os.path.join(self.checkpoint_dir, name))
            for name in sorted(os.listdir(self.checkpoint_dir))
            if checkpoint_prefix_of(name) == prefix
        }

    # --- start: the higher step wins -------------------------------------------------
    def sync_on_start(self) -> str:
        """Make DIR/checkpoints hold the newest checkpoint of DIR and ROOT; say what was done."""
        local, remote = self.local_state(), self.remote_state()
        where = self.remote_checkpoints
        if remote is not None and (local is None or remote.step > local.step):
            self.pull(remote)
            beaten = "none" if local is None else local.latest
            return f"downloaded {remote.latest} from {where} (the stage directory had {beaten})"
        if local is not None and (remote is None or local.step > remote.step):
            pushed = self.push()
            older = "none" if remote is None else remote.latest
            return (
                f"kept {local.latest} from {self.checkpoint_dir} and uploaded it to {where} "
                f"(which had {older}): {pushed.uploaded} file(s) uploaded"
            )
        if local is not None:
            return f"{self.checkpoint_dir} and {where} agree on {local.latest}"
        return f"no checkpoint in {self.checkpoint_dir} or {where}"

    def pull(self, remote: CheckpointState) -> None:
        """Replace DIR/checkpoints by ROOT's latest checkpoint (and ROOT's kept list)."""
        files = {
            name: size for name, size in self._remote_files().items() if checkpoint_prefix_of(name) == remote.latest
        }
        where = self.storage.url(layout.checkpoint_file(remote.latest))
        if f"{remote.latest}.index" not in files or not any(".data-" in name for name in files):
            raise StagingError(
                f"{self.storage.url(layout.checkpoint_file(STATE_FILE))} names "
                f"{remote.latest}, but {where}.index or its data files are missing"
            )
        incoming = self.checkpoint_dir + ".incoming"
        shutil.rmtree(incoming, ignore_errors=True)
        os.makedirs(incoming)
        for name in sorted(files):
            data = self.storage.read(layout.checkpoint_file(name))
            with open(os.path.join(incoming, name), "wb") as out:
                out.write(data)
        # The older kept prefixes stay listed although only ROOT has them: the
        # manager then keeps counting them, and push keeps ROOT's retention right.
        with open(os.path.join(incoming, STATE_FILE), "w", encoding="utf-8") as out:
            out.write(format_checkpoint_state(remote))
        shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
        os.rename(incoming, self.checkpoint_dir)

    # --- after every save -------------------------------------------------------------
    def push(self) -> PushResult:
        """Upload DIR's kept checkpoints, then the state file, then delete dropped ones."""
        local = self.local_state()
        if local is None:
            raise StagingError(f"{self.checkpoint_dir} has no complete checkpoint to upload")
        remote = self.remote_state()
        referenced = set(remote.kept) if remote is not None else set()
        remote_files = self._remote_files()
        uploaded = already = 0
        in_root = []
        for prefix in local.kept:
            files = self._local_files(prefix)
            if not files:  # pulled from ROOT without its files: ROOT still holds them
                if f"{prefix}.index" in remote_files:
                    in_root.append(prefix)
                continue
            if prefix in referenced and all(remote_files.get(name) == size for name, size in files.items()):
                already += len(files)
                in_root.append(prefix)
                continue
            for name in files:
                if self._upload(name, prefix in referenced):
                    uploaded += 1
                else:
                    already += 1
            in_root.append(prefix)
        if local.latest not in in_root:
            raise StagingError(f"{self.checkpoint_dir} names {local.latest} but holds none of its files")
        state = CheckpointState(local.latest, tuple(in_root))
        self.storage.write_replace(layout.checkpoint_file(STATE_FILE), format_checkpoint_state(state).encode())
        deleted = self._delete_dropped(state, remote_files)
        return PushResult(local.latest, uploaded, already, deleted)

    def _upload(self, name: str, referenced: bool) -> bool:
        """Create ROOT/checkpoints/<name> from DIR; False if an identical object was there."""
        path = layout.checkpoint_file(name)
        with open(os.path.join(self.checkpoint_dir, name), "rb") as handle:
            data = handle.read()
        try:
            self.storage.write_new(path, data)
            return True
        except AlreadyExists:
            pass
        if self.storage.read(path) == data:
            return False
        if referenced:
            raise StagingError(
                f"{self.storage.url(path)} differs from {self.checkpoint_dir}/{name}, and "
                f"{self.remote_checkpoints}/{STATE_FILE} names it: another trainer is "
                "writing checkpoints to this root"
            )
        # Not named by ROOT's state file: a leftover of an upload killed before
        # its state file went up.  Nothing can be restoring from it.
        log.info("replacing %s, left over from an interrupted upload", self.storage.url(path))
        self.storage.write_replace(path, data)
        return True

    def _delete_dropped(self, state: CheckpointState, remote_files: dict[str, int]) -> int:
        """Best effort: remove ROOT's files of checkpoints older than ``state.latest`` that it no
        longer keeps.  Newer ones are never touched (they cannot be ours to drop)."""
        deleted = 0
        for name in sorted(remote_files):
            prefix = checkpoint_prefix_of(name)
            if prefix is None or prefix in state.kept or checkpoint_step(prefix) >= state.step:  # None: not ours
                continue
            try:
                self.storage.delete(layout.checkpoint_file(name), missing_ok=True)
                deleted += 1
            except StorageError as exc:
                log.warning("could not delete old checkpoint file %s: %s", name, exc)
        return deleted

    # --- TensorBoard summaries --------------------------------------------------------
    def push_logs(self, *, at_most_every: float = 0.0, now: float | None = None) -> int:
        """Upload DIR/logs' files that grew since their last upload to ROOT/logs (same names); how many.

        Event files only grow, so a file whose size is the one last uploaded is
        skipped.  ``at_most_every`` seconds must have passed since the last
        push (0: always push).  A storage error is logged, not raised: the
        next push tries again, and training goes on.
        """
        now = time.monotonic() if now is None else now
        if now - self._logs_pushed_at < at_most_every or not os.path.isdir(self.log_dir):
            return 0
        self._logs_pushed_at = now
        uploaded = 0
        for folder, _, names in os.walk(self.log_dir):
            for name in sorted(names):
                local = os.path.join(folder, name)
                relative = os.path.relpath(local, self.log_dir).replace(os.sep, "/")
                size = os.path.getsize(local)
                if self._logs_pushed.get(relative) == size:
                    continue
                with open(local, "rb") as handle:
                    data = handle.read()
                try:
                    self.storage.write_replace(f"{layout.trainer_logs_dir()}/{relative}", data)
                except StorageError as exc:
                    log.warning(
                        "could not upload summaries %s to %s (tried again at the next push): %s",
                        relative,
                        self.storage.url(layout.trainer_logs_dir()),
                        exc,
                    )
                    continue
                self._logs_pushed[relative] = len(data)
                uploaded += 1
        return uploaded
