"""TFRecord framing and whole-file compression, in memory.

A TFRecord file is a sequence of frames::

    uint64 length (little-endian)
    uint32 masked_crc32c(length bytes)
    byte   data[length]
    uint32 masked_crc32c(data)

with ``masked(crc) = ((crc >> 15 | crc << 17) + 0xa282ead8) mod 2**32``.
The whole file may then be compressed: chunks are one zstd frame (with its
content checksum on), training shards are gzip.  Beam's TFRecord source reads
both (compression detected from the ``.zst`` / ``.gz`` suffix), and tf.data
reads the gzip shards natively.

Files in the lake are small enough (a chunk is a few hundred KB) to frame and
compress in memory, which is what lets every write be one create-only object.
"""

from __future__ import annotations

import struct
import zlib
from typing import Iterator

import google_crc32c
import zstandard
from isal import igzip

_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")

ZSTD_LEVEL = 10
"""zstd level for chunks: close to level 19's size at a fraction of its time (docs/measured.md)."""

GZIP_LEVELS = range(0, 4)
"""Compression levels of ISA-L's gzip writer (0 fastest .. 3 smallest)."""

SHARD_GZIP_LEVEL = 2
"""Default level of training shards: near zlib's sizes at several times its speed (docs/measured.md)."""

MAX_RECORD_BYTES = 64 << 20
"""No record in the lake is this large; a bigger length field is corruption."""


MAX_EXPANSION = 64
"""No file zerolake writes expands more than this many times when decompressed (its records are
compact already; the measured ratios are in docs/measured.md).  A file that expands further is a
decompression bomb and is refused before it costs more memory; it is skipped, never deleted, so a
bound found too tight later costs no data."""

MIN_DECOMPRESSED_LIMIT = 64 << 20
"""Every file may expand to at least this much, whatever its size: small files
cannot hurt, and the ratio bound is meant for large ones."""

MAX_DECOMPRESSED_BYTES = 1 << 30
"""No file in the lake decompresses to more than this (a 2000-game 19x19 chunk
is about 100 MB raw, a 100k-position shard a few MB)."""

_OUTPUT_PIECE = 1 << 20
"""Decompressed bytes produced per step, so the bound is checked before memory
grows past it by more than one piece."""

_INPUT_PIECE = 1024
"""Compressed bytes fed to zstd per step.  zstd's decompressor has no output
cap, but 1 KB of input cannot expand past ~32 MB (RLE blocks of 128 KB from 4
bytes each), so feeding it in small pieces bounds each step."""


class RecordError(ValueError):
    """A TFRecord or compression frame is damaged.  ``str()`` names the file."""


class TooLarge(RecordError):
    """A compressed file expands past its bound (`decompressed_limit`): a
    decompression bomb, or a file that is not the lake's."""


def decompressed_limit(compressed_bytes: int) -> int:
    """How many bytes a lake file of ``compressed_bytes`` may decompress to."""
    return min(MAX_DECOMPRESSED_BYTES, max(MIN_DECOMPRESSED_LIMIT, MAX_EXPANSION * compressed_bytes))


def _too_large(source: str, compressed: int, limit: int) -> TooLarge:
    return TooLarge(
        f"{source}: expands past {limit:,} bytes from {compressed:,} "
        f"(more than any file the lake holds: at most {MAX_EXPANSION}x, at least "
        f"{MIN_DECOMPRESSED_LIMIT >> 20} MB allowed); not read further"
    )


def masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_header(length: int) -> bytes:
    """The 12 bytes in front of a record of ``length`` bytes: length, masked CRC of it."""
    packed = _LENGTH.pack(length)
    return packed + _CRC.pack(masked_crc32c(packed))


def frame_records(records) -> bytes:
    """Frame serialized records as an uncompressed TFRecord file."""
    headers: dict = {}  # records of one kind share a few lengths: one CRC each
    parts = []
    for record in records:
        header = headers.get(len(record))
        if header is None:
            header = headers[len(record)] = frame_header(len(record))
        parts += [header, record, _CRC.pack(masked_crc32c(record))]
    return b"".join(parts)


def iter_framed_records(data: bytes, source: str) -> Iterator[bytes]:
    """Yield each record of an uncompressed TFRecord file, checking both CRCs."""
    view = memoryview(data)
    offset, index, end = 0, 0, len(data)
    while offset < end:
        if end - offset < 12:
            raise RecordError(f"{source}: record {index}: truncated header ({end - offset} bytes left)")
        (length,) = _LENGTH.unpack_from(view, offset)
        (length_crc,) = _CRC.unpack_from(view, offset + 8)
        if length_crc != masked_crc32c(bytes(view[offset : offset + 8])):
            raise RecordError(f"{source}: record {index}: length CRC mismatch at byte {offset}")
        if length > MAX_RECORD_BYTES or offset + 12 + length + 4 > end:
            raise RecordError(f"{source}: record {index}: truncated data (needs {length} bytes)")
        body = bytes(view[offset + 12 : offset + 12 + length])
        (data_crc,) = _CRC.unpack_from(view, offset + 12 + length)
        if data_crc != masked_crc32c(body):
            raise RecordError(f"{source}: record {index}: data CRC mismatch")
        yield body
        offset += 16 + length
        index += 1


def compress_zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True).compress(data)


def decompress_zstd(data: bytes, source: str, limit: int | None = None) -> bytes:
    """Decompress one or more zstd frames; truncation and damage raise RecordError, and
    output past ``limit`` bytes (default `decompressed_limit`) raises TooLarge."""
    limit = decompressed_limit(len(data)) if limit is None else limit
    decompressor = zstandard.ZstdDecompressor()
    view = memoryview(data)
    out, total, start = [], 0, 0
    try:
        while start < len(view):  # one zstd frame a pass; a file may hold several
            frame = decompressor.decompressobj(write_size=_OUTPUT_PIECE)
            position = start
            while position < len(view) and not frame.eof:
                piece = frame.decompress(view[position : position + _INPUT_PIECE])
                position = min(position + _INPUT_PIECE, len(view))
                total += len(piece)
                if total > limit:
                    raise _too_large(source, len(data), limit)
                out.append(piece)
            if not frame.eof:
                raise RecordError(f"{source}: zstd stream is truncated")
            # The frame ended inside the last piece fed: what followed it is unused_data.
            start = position - len(frame.unused_data)
    except zstandard.ZstdError as exc:
        raise RecordError(f"{source}: not a valid zstd stream ({exc})") from None
    return b"".join(out)


def compress_gzip(data: bytes, level: int = SHARD_GZIP_LEVEL) -> bytes:
    """A standard gzip file (RFC 1952) of ``data``, written by ISA-L's igzip.

    Any gzip reader (tf.data, Beam, the gzip module) reads it.  ISA-L is used
    instead of zlib because the shuffle job compresses every record copy it
    writes; see SHARD_GZIP_LEVEL for the figures.  mtime 0 keeps the bytes
    reproducible.
    """
    if level not in GZIP_LEVELS:
        raise ValueError(f"gzip level must be in {GZIP_LEVELS.start}..{GZIP_LEVELS.stop - 1}, got {level}")
    return igzip.compress(data, compresslevel=level, mtime=0)


def decompress_gzip(data: bytes, source: str, limit: int | None = None) -> bytes:
    """Decompress a gzip file (one or more members); damage raises RecordError, and
    output past ``limit`` bytes (default `decompressed_limit`) raises TooLarge."""
    return b"".join(_gzip_pieces(data, source, limit))


def _gzip_pieces(data: bytes, source: str, limit: int | None = None) -> Iterator[bytes]:
    """The decompressed bytes of a gzip file, at most _OUTPUT_PIECE at a time (`decompress_gzip`)."""
    limit = decompressed_limit(len(data)) if limit is None else limit
    total, rest = 0, bytes(data)
    try:
        while rest:  # one gzip member a pass
            member = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            pending = rest
            while not member.eof:
                # max_length caps each step's output; the input it did not reach waits
                # in unconsumed_tail.  Once the input is all in, flush what zlib holds.
                piece = member.decompress(pending, _OUTPUT_PIECE) if pending else member.flush()
                total += len(piece)
                if total > limit:
                    raise _too_large(source, len(data), limit)
                yield piece
                if not pending and not member.eof:
                    raise RecordError(f"{source}: gzip stream is truncated")
                pending = member.unconsumed_tail
            rest = member.unused_data
    except zlib.error as exc:
        raise RecordError(f"{source}: not a valid gzip stream ({exc})") from None


def check_gzip_frames(data: bytes, source: str, limit: int | None = None) -> int:
    """How many records a GZIP TFRecord file holds, its framing checked in bounded memory.

    For a reader that trusts the framing: tf.data allocates whatever a
    record's length field says, so a few hundred KB of gzip whose first
    length field says 900 MB (and whose zeros follow) would cost the
    trainer 900 MB before anything fails.  Here the file is streamed one
    piece at a time: it must stay within its expansion bound (TooLarge past
    ``limit``, default `decompressed_limit`), every length field's CRC must
    hold, no length may pass MAX_RECORD_BYTES, and nothing may be cut short
    (RecordError naming the file and record).  Record bodies are only
    skipped: their CRCs and contents are left to the reader.
    """
    header = bytearray()  # the current frame header, while it is incomplete
    to_skip = 0  # bytes of the current record (body, then its CRC) still ahead
    records = 0
    for piece in _gzip_pieces(data, source, limit):
        view, offset = memoryview(piece), 0
        while offset < len(view):
            if to_skip:
                step = min(to_skip, len(view) - offset)
                to_skip -= step
                offset += step
                continue
            taken = view[offset : offset + 12 - len(header)]
            header += taken
            offset += len(taken)
            if len(header) < 12:
                break  # the header goes on in the next piece
            (length,) = _LENGTH.unpack_from(header, 0)
            (length_crc,) = _CRC.unpack_from(header, 8)
            if length_crc != masked_crc32c(bytes(header[:8])):
                raise RecordError(f"{source}: record {records}: length CRC mismatch")
            if length > MAX_RECORD_BYTES:
                raise RecordError(
                    f"{source}: record {records}: its length field says {length:,} bytes, more "
                    f"than any record of the lake ({MAX_RECORD_BYTES:,}); not read"
                )
            header.clear()
            to_skip = length + 4
            records += 1
    if header or to_skip:
        raise RecordError(f"{source}: record {records - 1 if to_skip else records}: truncated")
    return records


def decompress_for(path: str, data: bytes, limit: int | None = None) -> bytes:
    """Undo the whole-file compression implied by a file name's suffix, within
    ``limit`` bytes (default `decompressed_limit`; TooLarge past it)."""
    if path.endswith(".zst"):
        return decompress_zstd(data, path, limit)
    if path.endswith(".gz"):
        return decompress_gzip(data, path, limit)
    return data
