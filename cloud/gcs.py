"""Google Cloud Storage backend of the storage interface (see cloud.base for terms).

A root ``gs://bucket/some/prefix`` maps path ``games/x`` to object ``some/prefix/games/x``.  Every
request goes through `GcsStorage._with_retries` under one `~cloud.base.RetryPolicy` (the client
library's own retries are off).  ``write_new`` uploads with ``if_generation_match=0``: a 412 on
the first attempt is `AlreadyExists`; a 412 on a retry may be our own lost-response write, so
the stored object's size and CRC32C (or bytes) are compared with ours, and identical is success.
A 404 on a retried delete likewise means gone.  The client is built on first use
(``google.cloud.storage.Client``: ``STORAGE_EMULATOR_HOST`` selects an emulator with anonymous
credentials, else Application Default Credentials), or passed as ``client=``.  Errors name the
URL, operation and HTTP status and are raised without ``__cause__`` or ``__context__``, since the
library's exception holds the Authorization header.
"""

from __future__ import annotations

import base64
import logging
import random
import re
import struct
import threading
import time
from typing import Callable, TypeVar

import google_crc32c

from cloud.base import (
    AlreadyExists,
    NotFound,
    ObjectInfo,
    PreconditionFailed,
    RetryPolicy,
    Storage,
    StorageError,
    TooLarge,
    check_listed_name,
    check_size,
    validate_data,
    validate_path,
    validate_prefix,
)

_log = logging.getLogger(__name__)

TRANSIENT_HTTP_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP statuses worth retrying (GCS documents 408, 429 and 5xx as retryable)."""

_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_SECRET_PATTERNS = (
    re.compile(r"(?i)bearer\s+[^\s'\",]+"),
    re.compile(r"(?i)(access_token|refresh_token|client_secret|private_key|signature)=[^&\s'\",]+"),
    re.compile(r"ya29\.[0-9A-Za-z._-]+"),
)
_MAX_REASON_CHARS = 300

T = TypeVar("T")


def parse_gs_url(url: str) -> tuple[str, str]:
    """Split ``gs://bucket[/prefix]`` into (bucket, prefix without surrounding '/')."""
    if not url.startswith("gs://"):
        raise ValueError(f"not a gs:// URL: {url!r}")
    bucket, _, prefix = url[len("gs://") :].partition("/")
    if not _BUCKET_NAME.match(bucket):
        raise ValueError(f"invalid bucket name {bucket!r} in storage URL {url!r}")
    prefix = prefix.strip("/")
    if prefix:
        validate_path(prefix, what=f"prefix of {url!r}")
    return bucket, prefix


def default_client(for_url: str = "gs://"):
    """A ``google.cloud.storage.Client`` configured from the environment now:
    emulator (STORAGE_EMULATOR_HOST, anonymous) or GCS (Application Default
    Credentials).  No project is needed for object operations, so none is
    looked up."""
    import google.auth.exceptions
    import google.cloud.storage as storage

    try:
        return storage.Client(project=None)
    except google.auth.exceptions.DefaultCredentialsError:
        raise StorageError(
            f"no Google credentials found for {for_url}: set GOOGLE_APPLICATION_CREDENTIALS, "
            "run `gcloud auth application-default login`, run on GCP, or set "
            "STORAGE_EMULATOR_HOST for an emulator",
            url=for_url,
        ) from None


def crc32c_base64(data: bytes) -> str:
    """CRC32C of ``data`` as GCS reports it: base64 of the big-endian uint32."""
    return base64.b64encode(struct.pack(">I", google_crc32c.value(data))).decode("ascii")


def redact(text: str) -> str:
    """``text`` with anything that looks like a credential replaced by '<redacted>'."""
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub("<redacted>", text)
    return text


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a google-api-core error, else None."""
    from google.api_core import exceptions as api_exceptions

    if isinstance(exc, api_exceptions.GoogleAPICallError) and isinstance(exc.code, int):
        return exc.code
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying: HTTP 408/429/5xx, a dropped or refused
    connection, a timeout, or a download whose checksum did not match."""
    import google.auth.exceptions
    import requests
    from google.cloud.storage.exceptions import DataCorruption

    status = http_status(exc)
    if status is not None:
        return status in TRANSIENT_HTTP_STATUSES or status >= 500
    return isinstance(
        exc,
        (
            requests.ConnectionError,
            requests.Timeout,
            requests.exceptions.ChunkedEncodingError,
            ConnectionError,
            TimeoutError,
            google.auth.exceptions.TransportError,
            DataCorruption,
        ),
    )


def describe(exc: BaseException) -> str:
    """A short, credential-free description: 'HTTP 503 (reason)' or the error type and text."""
    status = http_status(exc)
    if status is not None:
        reason = getattr(exc, "message", "") or ""
        head = f"HTTP {status}"
    else:
        reason = str(exc)
        head = type(exc).__name__
    reason = redact(" ".join(reason.split()))[:_MAX_REASON_CHARS]
    return f"{head} ({reason})" if reason else head


def _call_allowing(call: Callable[[], T], *statuses: int) -> tuple[T | None, int | None]:
    """``(call(), None)``, or ``(None, status)`` when the call fails with one
    of the HTTP ``statuses``; other errors propagate.  Callers then raise
    their own errors outside any except block, so no library exception
    (which holds the request, Authorization header included) is attached."""
    from google.api_core import exceptions as api_exceptions

    try:
        return call(), None
    except api_exceptions.GoogleAPICallError as exc:
        if exc.code in statuses:
            failed = exc.code
        else:
            raise
    return None, failed


class GcsStorage(Storage):
    """Objects in a GCS bucket under an optional prefix."""

    def __init__(
        self,
        root_url: str,
        *,
        client=None,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] = time.sleep,
    ):
        self._bucket_name, self._prefix = parse_gs_url(root_url)
        self.root_url = f"gs://{self._bucket_name}" + (f"/{self._prefix}" if self._prefix else "")
        self.retry_policy = retry
        self._client = client
        self._client_lock = threading.Lock()
        self._sleep = sleep

    # --- pickling: Beam DoFns may hold a storage; clients do not pickle ----

    def __getstate__(self):
        return {"root_url": self.root_url, "retry": self.retry_policy}

    def __setstate__(self, state):
        self.__init__(state["root_url"], retry=state["retry"])

    # --- paths and client --------------------------------------------------

    def _object_name(self, path: str) -> str:
        validate_path(path)
        return f"{self._prefix}/{path}" if self._prefix else path

    def url(self, path: str = "") -> str:
        if path == "":
            return self.root_url
        return f"gs://{self._bucket_name}/{self._object_name(path)}"

    def _bucket(self):
        with self._client_lock:
            if self._client is None:
                self._client = default_client(self.root_url)
            client = self._client
        return client.bucket(self._bucket_name)

    def _blob(self, path: str):
        return self._bucket().blob(self._object_name(path))

    # --- retry engine ------------------------------------------------------

    def _with_retries(self, operation: str, url: str, attempt: Callable[[bool], T]) -> T:
        """Run ``attempt(is_retry)`` until it returns, raises a non-transient
        error (translated to StorageError unless it already is one), or the
        policy runs out."""
        policy = self.retry_policy
        started = time.monotonic()
        for number in range(1, policy.max_attempts + 1):
            try:
                return attempt(number > 1)
            except StorageError:
                raise
            except Exception as exc:  # noqa: BLE001 - classified just below
                last = exc
            # Raised outside the except block so that the library's exception
            # is not even attached as __context__ (see the module docstring).
            if not is_transient(last):
                raise StorageError(f"{operation} {url} failed: {describe(last)}", url=url, status=http_status(last))
            elapsed = time.monotonic() - started
            pause = random.uniform(0.0, policy.max_sleep_after(number))
            if number == policy.max_attempts or elapsed + pause > policy.deadline_s:
                break
            _log.warning(
                "retrying %s %s after %s (attempt %d of %d failed, sleeping %.2fs)",
                operation,
                url,
                describe(last),
                number,
                policy.max_attempts,
                pause,
            )
            self._sleep(pause)
        elapsed = time.monotonic() - started
        raise StorageError(
            f"{operation} {url} failed: gave up after {number} attempt(s) in {elapsed:.1f}s; "
            f"last error: {describe(last)}",
            url=url,
            status=http_status(last),
        )

    # --- operations --------------------------------------------------------

    def write_new(self, path: str, data: bytes) -> None:
        url, blob, timeout = self.url(path), self._blob(path), self.retry_policy.request_timeout_s
        validate_data(data, url)
        data = bytes(data)  # the client library takes bytes or str only

        def attempt(is_retry: bool) -> None:
            _, status = _call_allowing(
                lambda: blob.upload_from_string(
                    data, content_type="application/octet-stream", if_generation_match=0, retry=None, timeout=timeout
                ),
                412,
            )
            if status is None:
                return
            # See the module docstring: after a retry, our own earlier
            # attempt may be the object that is in the way.
            if is_retry and self._stored_object_equals(blob, data, timeout):
                _log.info("write_new %s: a retried upload found its own earlier write", url)
                return
            raise AlreadyExists(f"{url} already exists; write_new never overwrites", url=url, status=412)

        self._with_retries("write_new", url, attempt)

    def _stored_object_equals(self, blob, data: bytes, timeout: float) -> bool:
        _, status = _call_allowing(lambda: blob.reload(retry=None, timeout=timeout), 404)
        if status == 404:  # deleted since: not ours to claim
            return False
        if blob.size != len(data):
            return False
        if blob.crc32c:
            return blob.crc32c == crc32c_base64(data)
        return blob.download_as_bytes(retry=None, timeout=timeout) == data

    def write_replace(self, path: str, data: bytes, *, durable: bool = True) -> None:
        url, blob, timeout = self.url(path), self._blob(path), self.retry_policy.request_timeout_s
        validate_data(data, url)
        data = bytes(data)
        # Repeating a whole-object overwrite is harmless, so retries need no care.
        self._with_retries(
            "write_replace",
            url,
            lambda _: blob.upload_from_string(
                data, content_type="application/octet-stream", retry=None, timeout=timeout
            ),
        )

    def read_versioned(self, path: str, *, max_bytes: int | None = None) -> tuple[bytes, int]:
        url, blob, timeout = self.url(path), self._blob(path), self.retry_policy.request_timeout_s

        def attempt(_is_retry: bool) -> tuple[bytes, int]:
            while True:
                _, status = _call_allowing(lambda: blob.reload(retry=None, timeout=timeout), 404)
                if status == 404:
                    raise NotFound(f"no object at {url}", url=url, status=404)
                generation = int(blob.generation)
                if max_bytes is not None and blob.size is not None and blob.size > max_bytes:
                    raise TooLarge(
                        f"{url} is {blob.size:,} bytes, more than {max_bytes:,}, the most an "
                        "object of its kind holds; not read",
                        url=url,
                        generation=generation,
                    )
                # Download exactly that generation; 412/404 = it changed in between: look again.
                # _call_allowing calls the lambda at once, in this iteration, so it sees this `generation`.
                data, status = _call_allowing(
                    lambda: blob.download_as_bytes(if_generation_match=generation, retry=None, timeout=timeout),  # noqa: B023
                    404,
                    412,
                )
                if status is None:
                    assert data is not None  # no status: the download returned
                    return data, generation

        return self._with_retries("read_versioned", url, attempt)

    def write_if_generation(self, path: str, data: bytes, generation: int) -> int:
        url, blob, timeout = self.url(path), self._blob(path), self.retry_policy.request_timeout_s
        validate_data(data, url)
        data = bytes(data)

        def attempt(is_retry: bool) -> int:
            _, status = _call_allowing(
                lambda: blob.upload_from_string(
                    data,
                    content_type="application/octet-stream",
                    if_generation_match=int(generation),
                    retry=None,
                    timeout=timeout,
                ),
                412,
            )
            if status is None:
                return int(blob.generation)
            # As in write_new: after a retry, our own earlier attempt may be
            # what moved the generation on.
            if is_retry and self._stored_object_equals(blob, data, timeout):
                return int(blob.generation)
            raise PreconditionFailed(
                f"{url} is no longer at generation {generation}; another writer changed it", url=url, status=412
            )

        return self._with_retries("write_if_generation", url, attempt)

    def read(self, path: str, *, max_bytes: int | None = None) -> bytes:
        url, blob, timeout = self.url(path), self._blob(path), self.retry_policy.request_timeout_s
        # A ranged download (``end`` is inclusive) never fetches more than one byte past the bound.
        end = None if max_bytes is None else max_bytes

        def attempt(_: bool) -> bytes:
            data, status = _call_allowing(
                lambda: blob.download_as_bytes(
                    start=0 if end is not None else None, end=end, retry=None, timeout=timeout
                ),
                404,
            )
            if status == 404:
                raise NotFound(f"no object at {url}", url=url, status=404)
            assert data is not None  # no status: the download returned
            return check_size(data, max_bytes, url)

        return self._with_retries("read", url, attempt)

    def exists(self, path: str) -> bool:
        url, blob, timeout = self.url(path), self._blob(path), self.retry_policy.request_timeout_s
        return self._with_retries("exists", url, lambda _: blob.exists(retry=None, timeout=timeout))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        validate_prefix(prefix)
        root = f"{self._prefix}/" if self._prefix else ""
        url = f"gs://{self._bucket_name}/{root}{prefix}"
        timeout = self.retry_policy.request_timeout_s

        def attempt(_: bool) -> list[ObjectInfo]:
            # A failure on any page restarts the listing: pages are cheap and a
            # half-collected listing must never be returned.
            blobs = self._bucket().list_blobs(prefix=root + prefix, retry=None, timeout=timeout)
            found = []
            for blob in blobs:
                relative = blob.name[len(root) :]
                # Folder placeholders ('dir/', made by consoles and gsutil) are no objects; a
                # name that read and delete would refuse ('a//b', 'a/./b', a temp file copied
                # from a local lake) is skipped, and a stray one reported once (cloud.base).
                if relative.endswith("/") or not check_listed_name(f"gs://{self._bucket_name}/{blob.name}", relative):
                    continue
                found.append(ObjectInfo(relative, int(blob.size or 0)))
            found.sort()
            return found

        return self._with_retries("list", url, attempt)

    def delete(self, path: str, *, missing_ok: bool = False) -> None:
        url, blob, timeout = self.url(path), self._blob(path), self.retry_policy.request_timeout_s

        def attempt(is_retry: bool) -> None:
            _, status = _call_allowing(lambda: blob.delete(retry=None, timeout=timeout), 404)
            # On a retry, our earlier attempt may have deleted it.
            if status == 404 and not (missing_ok or is_retry):
                raise NotFound(f"no object at {url}", url=url, status=404)

        self._with_retries("delete", url, attempt)
