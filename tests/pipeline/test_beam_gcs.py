"""Apache Beam's gs:// filesystem against gcp-storage-emulator, following the
recipe in tests/gcs_emulators.py: a tiny real pipeline on the in-process
FnApiRunner reads zstd TFRecord chunks from gs:// and writes GZIP TFRecord
shards to gs://, the way the lake's Beam job does."""

from __future__ import annotations

import gzip
import logging
import os
import struct
import subprocess
import sys

import apache_beam as beam
import google_crc32c
import zstandard
from apache_beam.io.tfrecordio import ReadFromTFRecord, WriteToTFRecord
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NO_CREDENTIALS_WARNING = "Unable to find default credentials"


def _masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C (see tensorflow/core/lib/hash/crc32c.h)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecords(records: list[bytes]) -> bytes:
    """Frame records as a TFRecord file: length, CRC of length, data, CRC of data."""
    out = bytearray()
    for record in records:
        length = struct.pack("<Q", len(record))
        out += length + struct.pack("<I", _masked_crc(length)) + record + struct.pack("<I", _masked_crc(record))
    return bytes(out)


def parse_tfrecords(data: bytes) -> list[bytes]:
    records, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        assert struct.unpack_from("<I", data, offset + 8)[0] == _masked_crc(data[offset:offset + 8])
        record = data[offset + 12:offset + 12 + length]
        assert struct.unpack_from("<I", data, offset + 12 + length)[0] == _masked_crc(record)
        records.append(record)
        offset += 16 + length
    return records


def _seed_chunks(lake) -> None:
    compress = zstandard.ZstdCompressor().compress
    lake.write_new("data/000001/w1-0001.tfrecord.zst", compress(tfrecords([b"game-1", b"game-2"])))
    lake.write_new("data/000001/w2-0001.tfrecord.zst", compress(tfrecords([b"game-3"])))


def _shard_records(lake) -> tuple[list[str], list[bytes]]:
    shards = [info.path for info in lake.list("out/000001/")]
    records = sorted(r for path in shards for r in parse_tfrecords(gzip.decompress(lake.read(path))))
    return shards, records


def build(pipeline: beam.Pipeline, root_url: str) -> None:
    """Chunks under data/000001 -> labelled records -> two GZIP shards."""
    (pipeline
     | "ReadChunks" >> ReadFromTFRecord(f"{root_url}/data/000001/*.tfrecord.zst")
     | "Label" >> beam.Map(lambda record: record + b"/labelled")
     | "WriteShards" >> WriteToTFRecord(f"{root_url}/out/000001/shard", file_name_suffix=".tfrecord.gz",
                                        num_shards=2))


def test_beam_pipeline_reads_and_writes_gs_in_process(gcs_emulator, caplog):
    lake = gcs_emulator.storage
    _seed_chunks(lake)
    with caplog.at_level(logging.WARNING):
        with beam.Pipeline(runner=FnApiRunner()) as pipeline:
            build(pipeline, lake.root_url)

    shards, records = _shard_records(lake)
    assert shards == ["out/000001/shard-00000-of-00002.tfrecord.gz",
                      "out/000001/shard-00001-of-00002.tfrecord.gz"]
    assert records == [b"game-1/labelled", b"game-2/labelled", b"game-3/labelled"]
    assert NO_CREDENTIALS_WARNING not in caplog.text
    # Beam's temp files were finalised (batch copy + delete) and removed.
    assert [i.path for i in lake.list()] == sorted(
        ["data/000001/w1-0001.tfrecord.zst", "data/000001/w2-0001.tfrecord.zst", *shards])


_SUBPROCESS_JOB = """
import sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from tests.pipeline.test_beam_gcs import build
options = PipelineOptions(["--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner"])
with beam.Pipeline(options=options) as pipeline:
    build(pipeline, sys.argv[1])
"""


def test_beam_pipeline_in_a_subprocess_needs_only_the_fixture_env(gcs_emulator):
    """A fresh process gets everything from ``gcs_emulator.env``; with the fake
    service-account key Beam finds credentials at once instead of retrying
    google.auth.default() for ~25 s and then connecting anonymously."""
    lake = gcs_emulator.storage
    _seed_chunks(lake)
    env = {k: v for k, v in os.environ.items() if k not in gcs_emulator.env}
    job = subprocess.run([sys.executable, "-c", _SUBPROCESS_JOB, lake.root_url], cwd=REPO_ROOT,
                         env={**env, **gcs_emulator.env}, capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    assert NO_CREDENTIALS_WARNING not in job.stderr
    assert _shard_records(lake)[1] == [b"game-1/labelled", b"game-2/labelled", b"game-3/labelled"]
