"""Open a lake root by URL: the one entry point roles use for storage.

    from cloud.storage import open_storage, AlreadyExists

    lake = open_storage("gs://my-bucket/run1")      # or "lake", "/data/lake", "file:///data/lake"
    lake.write_new("games/000001/w1-0001.tfrecord.zst", chunk_bytes)
    for info in lake.list("games/000001/"):
        print(info.path, info.size)
    lake.url("windows/000001")                      # -> "gs://my-bucket/run1/windows/000001"

Terms and write semantics are defined in :mod:`cloud.base`; the backends are
:mod:`cloud.local` and :mod:`cloud.gcs`.  Nothing is read from the
environment until a GCS object is first touched.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import urllib.parse

from cloud.base import AlreadyExists, NotFound, ObjectInfo, PreconditionFailed, RetryPolicy, Storage, StorageError

__all__ = [
    "AlreadyExists",
    "NotFound",
    "ObjectInfo",
    "PreconditionFailed",
    "RetryPolicy",
    "Storage",
    "StorageError",
    "add_retry_flags",
    "canonical_root",
    "is_remote",
    "local_folder_overlaps_root",
    "open_storage",
    "retry_flags_argv",
    "retry_policy_from_args",
]

_RETRY_FLAGS = {
    "max_attempts": ("--storage-max-attempts", int, "attempts per gs:// request before giving up"),
    "deadline_s": ("--storage-deadline-s", float, "seconds after which a gs:// request stops retrying"),
    "request_timeout_s": ("--storage-request-timeout-s", float, "timeout of one gs:// HTTP request, seconds"),
}


def is_remote(root_url: str) -> bool:
    """Whether ``root_url`` names cloud storage (gs://) rather than a local path."""
    return root_url.startswith("gs://")


def open_storage(root_url: str, *, retry: RetryPolicy | None = None, client=None) -> Storage:
    """The storage rooted at ``root_url``.

    Args:
      root_url: a local directory (relative or absolute), ``file:///abs/dir``,
        or ``gs://bucket[/prefix]``.
      retry: retry policy for remote backends (default: ``RetryPolicy()``).
      client: a ``google.cloud.storage.Client`` to use for gs:// instead of
        one built from the environment on first use.

    Raises:
      ValueError: the URL is empty, has an unsupported scheme, or a bad bucket/prefix.
    """
    if not isinstance(root_url, str) or not root_url.strip():
        raise ValueError(f"storage root URL must be a non-empty string, got {root_url!r}")
    if is_remote(root_url):
        from cloud.gcs import GcsStorage

        return GcsStorage(root_url, client=client, retry=retry or RetryPolicy())
    if client is not None:
        raise ValueError(f"a GCS client was given for the local root {root_url!r}")
    from cloud.local import LocalStorage

    scheme = urllib.parse.urlsplit(root_url).scheme
    if scheme == "file":
        parts = urllib.parse.urlsplit(root_url)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file:// URL {root_url!r} names a remote host; only local files are supported")
        return LocalStorage(urllib.parse.unquote(parts.path))
    if "://" in root_url:
        raise ValueError(f"unsupported storage URL {root_url!r}: use a local path, file:// or gs://")
    return LocalStorage(root_url)


def canonical_root(root_url: str) -> str:
    """The one spelling of the lake ``root_url`` names, for keying state kept outside the lake.

    ``lake``, ``./lake``, ``/abs/lake/``, ``file:///abs/lake`` and a symlink to
    it are one lake: a local root is its absolute path with symlinks resolved.
    A gs:// root is ``gs://bucket[/prefix]`` without trailing slashes.  A
    worker's spool is keyed by this, so a worker restarted on the same lake
    spelled another way finds what its predecessor spooled, and two runs whose
    roots are spelled alike but lie in different folders never share a spool.
    Touches no network.  Raises ValueError as `open_storage` does.
    """
    storage = open_storage(root_url)
    return storage.root_url if is_remote(storage.root_url) else os.path.realpath(storage.root_url)


def local_folder_overlaps_root(folder: str, root_url: str) -> bool:
    """Whether the local ``folder`` is the lake root, lies inside it, or holds it.

    A folder a role keeps for itself (a spool, a model cache, a trainer's stage
    dir) must do none of these: its clean-up would delete lake objects, or the
    lake's listings would find its files.  Symlinks are resolved on both sides.
    Always False for a gs:// root.
    """
    if is_remote(root_url):
        return False
    folder, root = os.path.realpath(os.path.expanduser(folder)), canonical_root(root_url)
    return folder == root or folder.startswith(root + os.sep) or root.startswith(folder.rstrip(os.sep) + os.sep)


def add_retry_flags(parser: argparse.ArgumentParser) -> None:
    """Add the ``--storage-*`` retry flags (gs:// only) to an entry point's parser."""
    defaults = RetryPolicy()
    group = parser.add_argument_group("storage retries (gs:// roots only)")
    for field, (flag, kind, help_text) in _RETRY_FLAGS.items():
        default = getattr(defaults, field)
        group.add_argument(flag, type=kind, default=default, help=f"{help_text} (default: {default})")


def retry_flags_argv(policy: RetryPolicy) -> list[str]:
    """The --storage-* flags that rebuild ``policy`` (for a parent starting a child role)."""
    argv = []
    for field, (flag, _, _) in _RETRY_FLAGS.items():
        argv += [flag, str(getattr(policy, field))]
    return argv


def retry_policy_from_args(args: argparse.Namespace) -> RetryPolicy:
    """The RetryPolicy named by :func:`add_retry_flags`'s flags.  A bad value
    raises ValueError naming the flag."""
    values = {field: getattr(args, flag[2:].replace("-", "_")) for field, (flag, _, _) in _RETRY_FLAGS.items()}
    try:
        return dataclasses.replace(RetryPolicy(), **values)
    except ValueError as exc:
        message = str(exc)
        for field, (flag, _, _) in _RETRY_FLAGS.items():
            message = message.replace(f"RetryPolicy.{field}", flag)
        raise ValueError(message) from None
