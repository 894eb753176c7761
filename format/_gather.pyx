# cython: language_level=3
"""Byte-assembly kernels of the position codec: segment gather and TFRecord CRCs.

The shuffle job writes hundreds of thousands of records a second, each made
of ~35 byte segments (feature names, varints, the caller's arrays).  Python
decides *what* goes where (``format.codec._Gather`` builds, for every
record, the pool offsets and lengths of its segments); these loops only copy
and checksum, with the GIL released so that other threads of a Beam worker
keep running.

* `gather_segments` copies segment (i, k) of ``pool`` to the output, record
  after record.  The caller guarantees (and `codec` checks, vectorized) that
  every segment lies inside ``pool`` and that record i's segments exactly
  fill ``out[offsets[i]:offsets[i+1]]``.
* `fill_frame_crcs` writes the masked CRC-32C of each TFRecord frame's data
  into the frame's last 4 bytes (framing: ``format/tfrecord.py``).  CRC-32C
  is computed slicing-by-8 (eight 256-entry tables, eight bytes a step),
  portable C that runs at ~1-2 GB/s on one core.
"""
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef uint32_t CRC_TABLE[8][256]
# Constants above 2**31 are set here, with the GIL: Cython would treat such
# literals as Python ints inside nogil code.
cdef uint32_t CASTAGNOLI_REFLECTED = 0x82F63B78
cdef uint32_t ALL_ONES = 0xFFFFFFFF
cdef uint32_t MASK_DELTA = 0xA282EAD8


cdef void _init_crc_tables() noexcept nogil:
    # Reflected CRC-32C (Castagnoli) polynomial.
    cdef uint32_t poly = CASTAGNOLI_REFLECTED
    cdef uint32_t crc
    cdef int i, j, t
    for i in range(256):
        crc = <uint32_t>i
        for j in range(8):
            crc = (crc >> 1) ^ (poly if crc & 1 else 0)
        CRC_TABLE[0][i] = crc
    # Table t advances a byte's contribution by t more zero bytes.
    for i in range(256):
        for t in range(1, 8):
            CRC_TABLE[t][i] = (CRC_TABLE[t - 1][i] >> 8) ^ CRC_TABLE[0][CRC_TABLE[t - 1][i] & 0xFF]


_init_crc_tables()


cdef uint32_t _crc32c(const uint8_t* data, int64_t length) noexcept nogil:
    cdef uint32_t crc = ALL_ONES
    cdef uint64_t word
    while length >= 8:
        # Little-endian load of 8 bytes, byte by byte (no alignment needed).
        word = (<uint64_t>data[0] | <uint64_t>data[1] << 8 | <uint64_t>data[2] << 16 |
                <uint64_t>data[3] << 24 | <uint64_t>data[4] << 32 | <uint64_t>data[5] << 40 |
                <uint64_t>data[6] << 48 | <uint64_t>data[7] << 56)
        word ^= crc
        crc = (CRC_TABLE[7][word & 0xFF] ^ CRC_TABLE[6][(word >> 8) & 0xFF] ^
               CRC_TABLE[5][(word >> 16) & 0xFF] ^ CRC_TABLE[4][(word >> 24) & 0xFF] ^
               CRC_TABLE[3][(word >> 32) & 0xFF] ^ CRC_TABLE[2][(word >> 40) & 0xFF] ^
               CRC_TABLE[1][(word >> 48) & 0xFF] ^ CRC_TABLE[0][(word >> 56) & 0xFF])
        data += 8
        length -= 8
    while length > 0:
        crc = (crc >> 8) ^ CRC_TABLE[0][(crc ^ data[0]) & 0xFF]
        data += 1
        length -= 1
    return crc ^ ALL_ONES


def crc32c(const uint8_t[::1] data):
    """CRC-32C of ``data`` (unmasked); the tests compare it with google_crc32c."""
    cdef uint32_t crc
    with nogil:
        crc = _crc32c(&data[0] if data.shape[0] else NULL, data.shape[0])
    return crc


def gather_segments(const uint8_t[::1] pool, const int64_t[:, ::1] starts, const int64_t[:, ::1] lengths,
                    uint8_t[::1] out):
    """Copy segment (i, k) = ``pool[starts[i, k]:starts[i, k] + lengths[i, k]]`` to ``out``, in order.

    Record after record, column after column, with no gaps: the caller has
    checked the bounds and sized ``out`` to the sum of ``lengths``.
    """
    cdef Py_ssize_t count = starts.shape[0], columns = starts.shape[1], i, k
    cdef int64_t at = 0, length
    with nogil:
        for i in range(count):
            for k in range(columns):
                length = lengths[i, k]
                if length > 0:
                    memcpy(&out[at], &pool[starts[i, k]], length)
                    at += length


def fill_frame_crcs(uint8_t[::1] frames, const int64_t[::1] offsets):
    """Write each frame's masked data CRC into its last 4 bytes (little-endian).

    Frame i is ``frames[offsets[i]:offsets[i+1]]``: 12 header bytes, the
    data, then the 4 CRC bytes written here.  masked(c) = rotr15(c) + 0xa282ead8.
    """
    cdef Py_ssize_t count = offsets.shape[0] - 1, i
    cdef int64_t lo, hi
    cdef uint32_t crc
    with nogil:
        for i in range(count):
            lo = offsets[i]
            hi = offsets[i + 1]
            crc = _crc32c(&frames[lo + 12], hi - lo - 16)
            crc = ((crc >> 15) | (crc << 17)) + MASK_DELTA
            frames[hi - 4] = crc & 0xFF
            frames[hi - 3] = (crc >> 8) & 0xFF
            frames[hi - 2] = (crc >> 16) & 0xFF
            frames[hi - 1] = (crc >> 24) & 0xFF
