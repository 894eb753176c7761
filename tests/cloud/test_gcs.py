"""The gs:// backend against real emulator servers on 127.0.0.1 (see
tests/gcs_emulators.py): round trips on gcp-storage-emulator, create-only
writes on fake-gcs-server, retries through a failure-injecting proxy, and
credentials that never leak into errors or logs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import traceback

import pytest

from cloud.base import RetryPolicy
from cloud.gcs import crc32c_base64, redact
from cloud.storage import AlreadyExists, NotFound, ObjectInfo, StorageError, open_storage
from tests.gcs_emulators import FaultInjectingProxy, Fault, free_port

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = RetryPolicy(max_attempts=4, initial_delay_s=0.01, max_delay_s=0.05, deadline_s=20, request_timeout_s=10)


# --- semantics on gcp-storage-emulator ----------------------------------------

def test_round_trip_list_and_delete(gcs_emulator):
    lake = gcs_emulator.storage
    lake.write_new("data/000001/b.bin", b"bb")
    lake.write_new("data/000001/a.bin", b"a")
    lake.write_new("data/000010/c.bin", b"")
    lake.write_new("datax/d", b"dddd")
    lake.write_replace("meta/head", b"1\n")
    lake.write_replace("meta/head", b"2\n")

    assert lake.read("data/000001/b.bin") == b"bb"
    assert lake.read("meta/head") == b"2\n"
    assert lake.exists("datax/d") and not lake.exists("data/000001/zz")
    assert lake.list() == [ObjectInfo("data/000001/a.bin", 1), ObjectInfo("data/000001/b.bin", 2),
                           ObjectInfo("data/000010/c.bin", 0), ObjectInfo("datax/d", 4),
                           ObjectInfo("meta/head", 2)]
    assert [i.path for i in lake.list("data/00000")] == ["data/000001/a.bin", "data/000001/b.bin"]
    assert [i.path for i in lake.list("data/")] == ["data/000001/a.bin", "data/000001/b.bin",
                                                    "data/000010/c.bin"]
    root = lake.root_url
    assert root.startswith(f"gs://{gcs_emulator.bucket}/t-")
    assert lake.url("datax/d") == f"{root}/datax/d"

    lake.delete("data/000001/a.bin")
    with pytest.raises(NotFound) as caught:
        lake.read("data/000001/a.bin")
    assert caught.value.url == f"{root}/data/000001/a.bin" and caught.value.url in str(caught.value)
    with pytest.raises(NotFound, match="data/000001/a.bin"):
        lake.delete("data/000001/a.bin")
    lake.delete("data/000001/a.bin", missing_ok=True)
    # Another root in the same bucket sees none of it.
    assert gcs_emulator.open().list() == []


def test_large_objects_use_resumable_uploads_and_survive(gcs_emulator, tmp_path):
    data = os.urandom(9 << 20)  # above the library's 8 MiB multipart limit
    gcs_emulator.storage.write_new("meta/000001/variables.data", data)
    gcs_emulator.storage.write_new("meta/000001/saved_model.pb", memoryview(b"pb"))
    assert gcs_emulator.storage.read("meta/000001/variables.data") == data
    written = gcs_emulator.storage.local_copy("meta/000001/", str(tmp_path))
    assert [os.path.basename(p) for p in written] == ["saved_model.pb", "variables.data"]
    assert (tmp_path / "variables.data").read_bytes() == data


def test_environment_selects_the_emulator_at_call_time(gcs_emulator):
    """open_storage without a client builds one from the environment on first
    use: STORAGE_EMULATOR_HOST (set by the fixture) routes it to the emulator."""
    root = gcs_emulator.root_url("env")
    lake = open_storage(root)
    lake.write_new("settings.json", b"{}")
    assert gcs_emulator.open(root).read("settings.json") == b"{}"


def test_a_subprocess_reaches_the_emulator_through_env(gcs_emulator):
    root = gcs_emulator.root_url("sub")
    script = ("import sys; from cloud.storage import open_storage; "
              "open_storage(sys.argv[1]).write_new('data/000001/w.bin', b'from a subprocess')")
    env = {k: v for k, v in os.environ.items() if k not in gcs_emulator.env}
    subprocess.run([sys.executable, "-c", script, root], cwd=REPO_ROOT, check=True,
                   env={**env, **gcs_emulator.env}, timeout=60)
    assert gcs_emulator.open(root).read("data/000001/w.bin") == b"from a subprocess"


# --- create-only writes on fake-gcs-server ------------------------------------

def test_write_new_refuses_to_overwrite(fake_gcs):
    lake = fake_gcs.storage
    lake.write_new("data/000001/chunk", b"first")
    for second in (b"second", b"first"):  # even identical bytes: the object was already there
        with pytest.raises(AlreadyExists) as caught:
            lake.write_new("data/000001/chunk", second)
        assert caught.value.status == 412
        assert caught.value.url == lake.url("data/000001/chunk") and caught.value.url in str(caught.value)
    assert lake.read("data/000001/chunk") == b"first"
    assert lake.list() == [ObjectInfo("data/000001/chunk", 5)]


def test_crc32c_matches_what_the_server_reports(fake_gcs):
    fake_gcs.storage.write_new("x", b"hello world")
    blob = fake_gcs.client().bucket(fake_gcs.bucket).get_blob(fake_gcs.storage.root_url.split("/", 3)[3] + "/x")
    assert blob.crc32c == crc32c_base64(b"hello world")


# --- retries through a failure-injecting proxy ---------------------------------

@pytest.fixture
def proxy(fake_gcs):
    with FaultInjectingProxy(fake_gcs.endpoint) as p:
        yield p


def _through(proxy, fake_gcs, retry=FAST, sleep=time.sleep):
    from cloud.gcs import GcsStorage

    return GcsStorage(fake_gcs.root_url("retry"), client=proxy.client(), retry=retry, sleep=sleep)


# The client library also fetches bucket metadata in background threads
# (GET /storage/v1/b/<bucket>), so every fault and count below names the
# endpoint of the operation under test.
UPLOAD, DOWNLOAD, OBJECT, LISTING = "/upload/", "/download/", "/o/", "/o?"


def _outcomes(proxy, endpoint):
    return [outcome for _, path, outcome in proxy.requests if endpoint in path]


def test_every_operation_recovers_from_transient_failures(proxy, fake_gcs):
    lake = _through(proxy, fake_gcs)
    proxy.inject(Fault(503, path_contains=UPLOAD), Fault(429, path_contains=UPLOAD),
                 Fault(drop=True, path_contains=UPLOAD))
    lake.write_new("a", b"aaa")
    assert _outcomes(proxy, UPLOAD) == ["failed 503", "failed 429", "dropped", "forwarded 200"]
    for endpoint, operation in ((DOWNLOAD, lambda: lake.read("a")), (OBJECT, lambda: lake.exists("a")),
                                (LISTING, lambda: lake.list()), (UPLOAD, lambda: lake.write_replace("b", b"b"))):
        proxy.requests.clear()
        proxy.inject(Fault(503, path_contains=endpoint), Fault(502, path_contains=endpoint))
        operation()
        assert _outcomes(proxy, endpoint) == ["failed 503", "failed 502", "forwarded 200"]
    assert lake.read("a") == b"aaa" and [i.path for i in lake.list()] == ["a", "b"]
    # Deleted, but the answer is lost: the retry sees 404 and knows the object is gone.
    proxy.requests.clear()
    proxy.inject(Fault(500, forward=True, path_contains=OBJECT))
    lake.delete("a")
    assert _outcomes(proxy, OBJECT) == ["forwarded, then failed 500", "forwarded 404"]
    assert not lake.exists("a")


def test_a_lost_create_response_is_recognised_as_our_own_write(proxy, fake_gcs):
    lake = _through(proxy, fake_gcs)
    proxy.inject(Fault(503, forward=True, path_contains=UPLOAD))
    lake.write_new("data/000001/chunk", b"the chunk")
    assert _outcomes(proxy, UPLOAD) == ["forwarded, then failed 503", "forwarded 412"]
    assert lake.read("data/000001/chunk") == b"the chunk"


def test_a_retry_that_finds_someone_elses_object_fails(proxy, fake_gcs):
    """Attempt 1 fails without reaching the server; while we back off another
    writer creates the object with other bytes; attempt 2 gets 412."""
    other = fake_gcs.open()

    def sleep_while_another_writer_wins(_seconds):
        other.write_new("data/000001/chunk", b"another writer's chunk")

    from cloud.gcs import GcsStorage
    lake = GcsStorage(other.root_url, client=proxy.client(), retry=FAST, sleep=sleep_while_another_writer_wins)
    proxy.inject(Fault(503, path_contains=UPLOAD))
    with pytest.raises(AlreadyExists, match="data/000001/chunk"):
        lake.write_new("data/000001/chunk", b"our chunk")
    assert other.read("data/000001/chunk") == b"another writer's chunk"


def test_gives_up_after_max_attempts_with_a_clear_error(proxy, fake_gcs):
    lake = _through(proxy, fake_gcs, retry=RetryPolicy(max_attempts=3, initial_delay_s=0.01, max_delay_s=0.02))
    proxy.fail_always(Fault(503))
    with pytest.raises(StorageError) as caught:
        lake.read("data/000001/chunk")
    message = str(caught.value)
    assert lake.url("data/000001/chunk") in message
    assert "gave up after 3 attempt(s)" in message and "HTTP 503" in message
    assert caught.value.status == 503
    assert _outcomes(proxy, DOWNLOAD) == ["failed 503"] * 3


def test_gives_up_at_the_deadline(proxy, fake_gcs):
    policy = RetryPolicy(max_attempts=1000, initial_delay_s=0.05, max_delay_s=0.1, deadline_s=0.5)
    lake = _through(proxy, fake_gcs, retry=policy)
    proxy.fail_always(Fault(504))
    started = time.monotonic()
    with pytest.raises(StorageError, match="gave up after .* attempt"):
        lake.write_replace("x", b"x")
    assert time.monotonic() - started < 3.0
    assert 2 <= len(_outcomes(proxy, UPLOAD)) < 1000


def test_permanent_errors_are_not_retried(proxy, fake_gcs):
    lake = _through(proxy, fake_gcs)
    proxy.inject(Fault(403, path_contains=LISTING))
    with pytest.raises(StorageError) as caught:
        lake.list("data/")
    assert caught.value.status == 403 and "HTTP 403" in str(caught.value)
    assert "gave up" not in str(caught.value)
    assert _outcomes(proxy, LISTING) == ["failed 403"]


def test_an_unreachable_endpoint_gives_up_with_a_connection_error():
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="p", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": f"http://127.0.0.1:{free_port()}"})
    lake = open_storage("gs://nowhere-bucket/x", client=client,
                        retry=RetryPolicy(max_attempts=2, initial_delay_s=0.01))
    with pytest.raises(StorageError, match=r"gs://nowhere-bucket/x/a.*gave up after 2 attempt.*ConnectionError"):
        lake.read("a")


# --- credentials never leak ----------------------------------------------------

def test_credentials_never_appear_in_errors_or_logs(proxy, fake_gcs, fake_google_auth, caplog):
    from google.oauth2 import service_account
    from cloud.gcs import GcsStorage
    from google.cloud import storage

    credentials = service_account.Credentials.from_service_account_file(
        fake_google_auth.credentials_file, scopes=["https://www.googleapis.com/auth/devstorage.read_write"])
    client = storage.Client(project="p", credentials=credentials, client_options={"api_endpoint": proxy.endpoint})
    lake = GcsStorage(fake_gcs.root_url("creds"), client=client,
                      retry=RetryPolicy(max_attempts=2, initial_delay_s=0.01))
    caught = []
    with caplog.at_level(logging.DEBUG):
        lake.write_new("a", b"a")
        for provoke in (
            lambda: lake.write_new("a", b"b"),                                  # 412
            lambda: lake.read("missing"),                                       # 404
            lambda: (proxy.inject(Fault(403, path_contains=DOWNLOAD)), lake.read("a")),                 # permanent
            lambda: (proxy.fail_always(Fault(503)), lake.list()),               # gave up
        ):
            with pytest.raises(StorageError) as error:
                provoke()
            caught.append(error.value)
        proxy.heal()

    token = fake_google_auth.access_token
    # The token really was on the wire, so its absence below means something.
    assert f"Bearer {token}" in proxy.authorizations
    for error in caught:
        text = "".join(traceback.format_exception(error)) + repr(error)
        assert token not in text and "Bearer" not in text
        assert error.url.startswith("gs://")
        assert error.__cause__ is None and error.__context__ is None
    assert token not in caplog.text
    assert any("retrying list" in record.getMessage() for record in caplog.records)


def test_redact_removes_token_shapes():
    text = "401 GET x: Authorization: Bearer ya29.abc-DEF ... ?access_token=s3cr3t&x=1 ya29.zzz"
    cleaned = redact(text)
    assert "abc-DEF" not in cleaned and "s3cr3t" not in cleaned and "ya29.zzz" not in cleaned
    assert cleaned.count("<redacted>") == 3


# --- stray names: skipped and reported once, listing and reading agree ----------------

def test_a_stray_object_name_is_skipped_and_reported_once(fake_gcs, caplog):
    """Object names that read and delete refuse ('//', '.', '..', a backslash) are not
    listed, each reported once; a temp file copied from a local lake and a folder
    placeholder are skipped without a word."""
    lake = fake_gcs.storage
    lake.write_new("data/000001/ok", b"1")
    prefix = lake.root_url.split("/", 3)[3]
    bucket = fake_gcs.client().bucket(fake_gcs.bucket)
    stray = ["data//x", "data/./y", "data/../z", "data/a\\b"]
    for name in stray + ["data/000001/.zl-tmp-lock-head", "data/000002/"]:
        bucket.blob(f"{prefix}/{name}").upload_from_string(b"s")
    caplog.set_level("WARNING", logger="cloud.base")
    for _ in range(2):
        assert lake.list() == [ObjectInfo("data/000001/ok", 1)]
        assert lake.list("data/") == [ObjectInfo("data/000001/ok", 1)]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name == "cloud.base"]
    assert len(warned) == len(stray), warned
    for name in stray:
        assert sum(repr(f"{lake.root_url}/{name}") in line for line in warned) == 1, (name, warned)
    for info in lake.list():
        lake.delete(info.path)
    assert sorted(b.name[len(prefix) + 1:] for b in bucket.list_blobs(prefix=prefix + "/")) == sorted(
        stray + ["data/000001/.zl-tmp-lock-head", "data/000002/"])
