# cython: language_level=3
"""History planes of training positions, assembled bit-packed in one pass.

A position record's planes (format/SPEC.md) are 16 board planes of N*N bits
each, concatenated and packed most significant bit first, in the layout of
format/planes.py (constants from format/planes.pxd): planes 0-7 hold the
side to move's stones at t, t-1 .. t-7, planes 8-15 the opponent's, zeros
before the game's start.  Planes are N*N bits long (81 on 9x9), not a
whole number of bytes, so plane k starts in the middle of a byte and numpy
can only build the record by unpacking every plane to one byte a point and
packing again (~1.3 KB of traffic per 9x9 position).

Here each fresh plane (one colour of one position) is packed once into
64-bit words, most significant bit first; each record is then 16 shifted
word copies into a 64-bit word buffer, byte-swapped to big-endian at the
end.  A fresh plane serves the 8 positions whose history it is part of.
"""
from libc.stdint cimport int32_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from format.planes cimport HISTORY_LENGTH, OPPONENT_STONES, OWN_STONES, PACKED_PLANES


cdef inline void _store_big_endian(uint64_t word, uint8_t* out, int count) noexcept nogil:
    """The first ``count`` (<= 8) bytes of ``word`` in big-endian order."""
    cdef int b
    for b in range(count):
        out[b] = (word >> (56 - 8 * b)) & 0xFF


def pack_history(const uint8_t[:, :, ::1] fresh, const int32_t[::1] move_number, uint8_t[:, ::1] out):
    """Write the packed 16 history planes of every position into ``out``.

    ``fresh`` is uint8[P, 2, NN] (0/1; colour 0 Black, 1 White) for whole
    games laid end to end; ``move_number[p]`` is position p's index in its
    game, so rows p - k for k <= move_number[p] are the same game.  The side
    to move is Black on even move numbers.  ``out`` is uint8[P, ceil(16 NN / 8)].
    """
    cdef Py_ssize_t p, i, w, slot, age, bit, at, shift, nbits, source
    cdef int colour, mover
    cdef uint64_t word
    cdef Py_ssize_t positions = fresh.shape[0], points = fresh.shape[2]
    cdef Py_ssize_t plane_words = (points + 63) // 64
    cdef Py_ssize_t record_bits = PACKED_PLANES * points
    cdef Py_ssize_t record_words = (record_bits + 63) // 64
    cdef Py_ssize_t record_bytes = (record_bits + 7) // 8
    if move_number.shape[0] != positions or out.shape[0] != positions:
        raise ValueError("fresh, move_number and out must have one row per position")
    if fresh.shape[1] != 2 or out.shape[1] != record_bytes:
        raise ValueError(f"expected fresh [P, 2, NN] and out [P, {record_bytes}]")
    for p in range(positions):
        if move_number[p] < 0 or move_number[p] > p:
            raise ValueError(f"move number {move_number[p]} at row {p} reaches before the first row")
    cdef uint64_t* packed = <uint64_t*>malloc(max(1, positions * 2 * plane_words) * sizeof(uint64_t))
    cdef uint64_t* record = <uint64_t*>malloc(max(1, record_words + 1) * sizeof(uint64_t))
    if packed == NULL or record == NULL:
        free(packed)
        free(record)
        raise MemoryError()
    try:
        with nogil:
            # 1. Every fresh plane as MSB-first words.
            memset(packed, 0, positions * 2 * plane_words * sizeof(uint64_t))
            for p in range(positions):
                for colour in range(2):
                    for i in range(points):
                        if fresh[p, colour, i]:
                            packed[(p * 2 + colour) * plane_words + i // 64] |= (<uint64_t>1) << (63 - i % 64)
            # 2. Each record: 16 planes appended at bit offsets 0, NN, 2 NN, ...;
            #    plane `slot` is the mover's (OWN_STONES block) or the other
            #    colour's (OPPONENT_STONES block) stones `age` moves ago.
            for p in range(positions):
                memset(record, 0, (record_words + 1) * sizeof(uint64_t))
                mover = move_number[p] % 2  # 0: Black to move
                bit = 0
                for slot in range(PACKED_PLANES):
                    if OWN_STONES <= slot < OWN_STONES + HISTORY_LENGTH:
                        age, colour = slot - OWN_STONES, mover
                    else:
                        age, colour = slot - OPPONENT_STONES, 1 - mover
                    if age <= move_number[p]:
                        source = p - age
                        for w in range(plane_words):
                            word = packed[(source * 2 + colour) * plane_words + w]
                            nbits = min(64, points - 64 * w)
                            at = (bit + 64 * w) // 64
                            shift = (bit + 64 * w) % 64
                            record[at] |= word >> shift
                            if shift and shift + nbits > 64:
                                record[at + 1] |= word << (64 - shift)
                    bit += points
                for w in range(record_words):
                    _store_big_endian(record[w], &out[p, 8 * w], min(8, record_bytes - 8 * w))
    finally:
        free(packed)
        free(record)
