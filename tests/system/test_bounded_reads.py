"""Decompression bombs: every reader of compressed lake bytes refuses one within its bound.

A few KB of zstd or gzip can hold gigabytes of zeros.  Each case here plants
such a file where the lake keeps real ones (a chunk, a shard, a game table)
and runs the reader that meets it in a subprocess whose memory is capped at
512 MB (``RLIMIT_AS``; the shuffle job's Beam runner reserves address space
for its threads, so it is capped by ``RLIMIT_DATA`` instead).  Every bomb
expands to about 1 GB, so a reader without the bound dies of MemoryError;
with it, the file is named once as bad and skipped, and the rest is read.

The bound itself (`format.tfrecord.decompressed_limit`) is also checked on
its own: real files pass, and damage is still told apart from size.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest
import zstandard

from cloud.storage import open_storage
from format import codec, layout
from format.documents import ManifestError, MAX_DOCUMENT_BYTES, MAX_POINTER_BYTES
from format.model_manifest import ModelFile, ModelManifest
from format.window_manifest import read_window_manifest
from format.tfrecord import (MAX_EXPANSION, RecordError, TooLarge, check_gzip_frames, compress_gzip, compress_zstd,
                             decompress_gzip, decompress_zstd, decompressed_limit, frame_header, frame_records,
                             iter_framed_records)
from testdata.random_games import engine_game
from testdata.synthetic_windows import write_run_config

BOARD = 9
MEMORY_LIMIT = 512 << 20
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def zstd_bomb() -> bytes:
    """About 40 KB of zstd (four frames) that expands to 1 GB of zeros."""
    frame = zstandard.ZstdCompressor(level=1).compress(bytes(256 << 20))
    return frame * 4


def gzip_bomb() -> bytes:
    """About 1 MB of gzip (four members) that expands to 1 GB of zeros."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    member = compressor.compress(bytes(256 << 20)) + compressor.flush()
    return member * 4


LYING_LENGTH = 900 << 20


def lying_frame_bomb() -> bytes:
    """About a megabyte of gzip: one TFRecord frame whose length field (its CRC valid) says 900 MB,
    then 900 MB of zeros.  A reader that trusts the framing (tf.data) allocates all of it."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(16 << 20)
    parts = [compressor.compress(frame_header(LYING_LENGTH))]
    parts += [compressor.compress(zeros) for _ in range(LYING_LENGTH // len(zeros))]
    parts += [compressor.compress(bytes(4)), compressor.flush()]
    return b"".join(parts)


def run_capped(args: list[str], *, limit=resource.RLIMIT_AS, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``python args...`` from the repository root with its memory capped."""
    def cap():
        resource.setrlimit(limit, (MEMORY_LIMIT, MEMORY_LIMIT))
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=cap)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> dict:
    """Two chunks of legal games, a zstd bomb among them, and the window the
    shuffle job built from that lake (its run output kept for the test)."""
    root = str(tmp_path_factory.mktemp("bombs") / "lake")
    storage = open_storage(root)
    write_run_config(storage, board_size=BOARD)
    rng = np.random.default_rng(3)
    for seq in range(2):
        games = [engine_game(rng, BOARD, worker_id=f"w{seq}") for _ in range(30)]
        storage.write_new(layout.chunk_path(0, "good", 1_700_000_000_000 + seq, seq), codec.encode_chunk(games))
    bomb = layout.chunk_path(0, "bomb", 1_700_000_000_100, 0)
    storage.write_new(bomb, zstd_bomb())
    shuffle = run_capped(["-m", "pipeline.shuffle", "--root", root, "--window-min-positions", "100",
                          "--workers", "1"], limit=resource.RLIMIT_DATA)
    return {"root": root, "storage": storage, "bomb": storage.url(bomb), "shuffle": shuffle}


def test_bounds_pass_real_files_and_refuse_bombs():
    rng = np.random.default_rng(0)
    chunk = codec.encode_chunk([engine_game(rng, BOARD) for _ in range(20)])
    assert codec.read_chunk(chunk, "real.tfrecord.zst")  # a real chunk is well inside its bound
    assert decompressed_limit(10) == decompressed_limit(0) >= 64 << 20
    assert decompressed_limit(100 << 20) == MAX_EXPANSION * (100 << 20) or decompressed_limit(100 << 20) == 1 << 30
    data = bytes(range(256)) * 4096
    assert decompress_zstd(compress_zstd(data) + compress_zstd(b"tail"), "two frames") == data + b"tail"
    assert decompress_gzip(compress_gzip(data) + compress_gzip(b"tail"), "two members") == data + b"tail"
    with pytest.raises(TooLarge, match="bomb.zst: expands past"):
        decompress_zstd(compress_zstd(bytes(1 << 20)), "bomb.zst", limit=1000)
    with pytest.raises(TooLarge, match="bomb.gz: expands past"):
        decompress_gzip(compress_gzip(bytes(1 << 20)), "bomb.gz", limit=1000)
    # Damage is still damage, not size.
    whole = compress_zstd(data)
    with pytest.raises(RecordError, match="truncated") as err:
        decompress_zstd(whole[:-5], "cut.zst")
    assert not isinstance(err.value, TooLarge)
    with pytest.raises(RecordError, match="truncated"):
        decompress_gzip(compress_gzip(data)[:-5], "cut.gz")


def test_shuffle_job_skips_a_bomb_chunk_and_builds_the_window(lake):
    run = lake["shuffle"]
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "MemoryError" not in run.stderr
    assert "skipped 1 chunks" in run.stdout, run.stdout[-2000:]
    assert "expands past" in run.stdout + run.stderr
    manifest = read_window_manifest(lake["storage"], 1)
    assert manifest.positions > 0


def test_verify_names_the_bomb_and_checks_every_other_file(lake):
    run = run_capped(["-m", "format.inspect", "verify", lake["root"]])
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert "Traceback" not in out and "MemoryError" not in out
    assert lake["bomb"] in out and "expands past" in out
    files = len([o for o in lake["storage"].list("") if o.path.endswith((".zst", ".gz"))])
    assert f"verified {files} files: {files - 1} good, 1 bad" in out, out[-2000:]


@pytest.mark.parametrize("kind", ["shard", "game table"])
def test_window_readers_refuse_a_bomb_shard_or_table(lake, tmp_path, kind):
    root = str(tmp_path / "lake")
    shutil.copytree(lake["root"], root)
    storage = open_storage(root)
    window = read_window_manifest(storage, 1)
    target = window.shards[0] if kind == "shard" else window.game_table
    os.remove(storage.url(target))
    storage.write_new(target, gzip_bomb())
    # The trainer reads a window's table and its first shard through these two.
    script = ("import sys\n"
              "from cloud.storage import open_storage\n"
              "from format import codec\n"
              "from format.game_table import read_window_table\n"
              "from format.window_manifest import read_window_manifest\n"
              "storage = open_storage(sys.argv[1])\n"
              "window = read_window_manifest(storage, 1)\n"
              "try:\n"
              "    table = read_window_table(storage, window)\n"
              "    codec.read_shard(storage.read(window.shards[0]), storage.url(window.shards[0]), table=table)\n"
              "except codec.FormatError as exc:\n"
              "    print(exc); sys.exit(2)\n")
    run = run_capped(["-c", script, root])
    assert run.returncode == 2, run.stdout + run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert storage.url(target) in run.stdout and "expands past" in run.stdout


def test_oversized_documents_are_named_damage(tmp_path):
    """A document past its format bound is refused by its one reader, naming it,
    before it is read whole (the bounds: format.documents.MAX_*_BYTES)."""
    from format import registry
    from format.leases import LeaseDamaged, read_record
    from format.run_config import RunConfigMismatch, read_run_config

    storage = open_storage(str(tmp_path / "lake"))
    padding = b" " * (MAX_POINTER_BYTES + 1)
    storage.write_new(layout.RUN_CONFIG, b"{}" + padding)
    storage.write_new(layout.LATEST, b"1\n" + padding)
    storage.write_new(layout.TRAINER_LEASE, b"{}" + padding)
    storage.write_new(layout.window_manifest(1), b"{}" + b" " * (MAX_DOCUMENT_BYTES + 1))
    storage.write_new(registry.manifest_path(1), b"{}" + b" " * (MAX_DOCUMENT_BYTES + 1))
    cases = [(RunConfigMismatch, lambda: read_run_config(storage), layout.RUN_CONFIG),
             (registry.RegistryError, lambda: registry.latest_generation(storage), layout.LATEST),
             (registry.RegistryError, lambda: registry.advance_latest(storage, 2), layout.LATEST),
             (LeaseDamaged, lambda: read_record(storage, layout.TRAINER_LEASE), layout.TRAINER_LEASE),
             (ManifestError, lambda: read_window_manifest(storage, 1), layout.window_manifest(1)),
             (registry.ModelIntegrityError, lambda: registry.read_manifest(storage, 1), registry.manifest_path(1))]
    for error, read, path in cases:
        with pytest.raises(error, match="is larger than") as err:
            read()
        assert storage.url(path) in str(err.value)
    assert storage.read(layout.LATEST).startswith(b"1\n")   # refused, never replaced


def test_a_shards_framing_is_checked_in_bounded_memory(lake):
    """format.tfrecord.check_gzip_frames, what the trainer runs on each shard before tf.data reads it."""
    storage = lake["storage"]
    shard = read_window_manifest(storage, 1).shards[0]
    data = storage.read(shard)
    assert check_gzip_frames(data, "real.gz") == len(list(iter_framed_records(decompress_gzip(data, "real.gz"),
                                                                              "real.gz")))
    with pytest.raises(RecordError, match=f"lie.gz: record 0: its length field says {LYING_LENGTH:,} bytes"):
        check_gzip_frames(lying_frame_bomb(), "lie.gz")
    many = compress_gzip(frame_records([bytes(1 << 20)] * 100), level=1)      # 100 MB of honest frames
    with pytest.raises(TooLarge, match="many.gz: expands past"):
        check_gzip_frames(many, "many.gz")
    with pytest.raises(RecordError, match="zeros.gz: record 0: length CRC mismatch"):
        check_gzip_frames(gzip_bomb(), "zeros.gz")
    framed = frame_records([b"x" * 100, b"y" * 100])
    with pytest.raises(RecordError, match="cut.gz: record 1: truncated"):
        check_gzip_frames(compress_gzip(framed[:-10]), "cut.gz")
    with pytest.raises(RecordError, match="cut.gz: gzip stream is truncated"):
        check_gzip_frames(compress_gzip(framed)[:-12], "cut.gz")


def test_the_trainer_refuses_a_shard_whose_length_field_lies_before_tf_data_reads_it(lake, tmp_path):
    root = str(tmp_path / "lake")
    shutil.copytree(lake["root"], root)
    storage = open_storage(root)
    shard = read_window_manifest(storage, 1).shards[0]
    os.remove(storage.url(shard))
    storage.write_new(shard, lying_frame_bomb())
    events = str(tmp_path / "train.jsonl")
    run = subprocess.run([sys.executable, "-m", "model.train", "--root", root, "--blocks", "1", "--filters", "16",
                          "--events", events], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "MemoryError" not in run.stderr
    # The framing check's words: tf.data never met the shard (it would have allocated 900 MB first).
    assert f"{storage.url(shard)}: record 0: its length field says {LYING_LENGTH:,} bytes" in run.stderr
    skipped = [json.loads(line) for line in open(events) if '"window_skipped"' in line]
    assert [event["generation"] for event in skipped] == [1]


FETCH_MODEL = ("import sys; from cloud.storage import open_storage; from format import registry\n"
               "from inference import model_files\n"
               "try:\n    model_files.fetch_model_files(open_storage(sys.argv[1]), 1, sys.argv[2])\n"
               "except registry.RegistryError as exc:\n    print(exc)\n")


def test_a_model_file_larger_than_its_manifest_says_is_refused_in_bounded_memory(tmp_path):
    """A model file is read up to the size its manifest gives, never whole: a variables file replaced by
    a 1 GB one (sparse on disk) used to be read whole, MemoryError under the cap (a worker OOM-killed,
    restarted and reading it again).  A manifest whose size itself is past the bound is refused unread."""
    from format import registry
    from inference import model_files

    export = tmp_path / "export"
    (export / "variables").mkdir(parents=True)
    (export / "saved_model.pb").write_bytes(b"graph")
    (export / "variables" / "data").write_bytes(b"weights" * 10)
    storage = open_storage(str(tmp_path / "lake"))
    manifest = registry.publish_model(storage, 1, str(export), {"board_size": BOARD})
    os.truncate(storage.url(layout.model_file(1, "variables/data")), 1 << 30)
    run = run_capped(["-c", FETCH_MODEL, storage.url(""), str(tmp_path / "cache")], timeout=60)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.stdout.strip() == (f"{storage.url(layout.model_file(1, 'variables/data'))} is larger than the 70 "
                                  "bytes its manifest says (file corrupted or replaced); refusing to load")

    files = dict(manifest.files, **{"variables/data": ModelFile("0" * 64, registry.MAX_MODEL_FILE_BYTES + 1)})
    storage.write_new(registry.manifest_path(2), ModelManifest(2, files, manifest.metadata).to_bytes())
    with pytest.raises(registry.ModelIntegrityError, match=r"field 'files.variables/data.size' is 2,147,483,649, "
                                                           "more than the 2,147,483,648 bytes") as err:
        model_files.fetch_model_files(storage, 2, str(tmp_path / "cache"))
    assert storage.url(registry.manifest_path(2)) in str(err.value)


def test_the_run_page_names_an_oversized_chunk_and_chunk_count_cache_and_draws_the_rest(lake, tmp_path):
    """arena.run_page read the ladder's chunk-count cache and every chunk whole: a 1 GB file in either
    place (sparse here) was a MemoryError under the cap, and no page.  Past its bound (a chunk:
    arena.ladder_report.MAX_CHUNK_BYTES, what a chunk may expand to; the cache: a lake document's) each
    is named on the page and left out: the chunk unread, the cache read no further than its bound."""
    from arena.ladder_report import MAX_CHUNK_BYTES

    root = str(tmp_path / "lake")
    shutil.copytree(lake["root"], root)
    storage = open_storage(root)
    huge_chunk = layout.chunk_path(0, "huge", 1_700_000_000_200, 0)
    for path in (huge_chunk, layout.ladder_chunk_counts()):
        storage.write_new(path, b"x")
        os.truncate(storage.url(path), MAX_CHUNK_BYTES + 1)
    out = tmp_path / "run.html"
    run = run_capped(["-m", "arena.run_page", "--root", root, "--out", str(out)], timeout=120)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    page = out.read_text()
    assert (f"{storage.url(huge_chunk)} is larger than {MAX_CHUNK_BYTES:,} bytes, more than any chunk holds; "
            "not read; not counted") in page
    assert (f"{storage.url(layout.ladder_chunk_counts())} is larger than {MAX_DOCUMENT_BYTES:,} bytes"
            in page and "its chunks are counted again" in page)
    assert "60 games" in run.stdout, run.stdout              # the two good chunks' games are all counted
