# cython: language_level=3
"""A small, fast pseudo-random generator for the engine's hot loops.

xorshift64* (Vigna, "An experimental exploration of Marsaglia's xorshift
generators", 2016): one 64-bit word of state, three shifts and a multiply per
draw, good enough statistically for random playouts and far cheaper than
numpy's generators, which cannot be called without the GIL.  The state must
never be zero; `rng_seed` runs the caller's seed through splitmix64, whose
output is never stuck at zero for two consecutive seeds, and forces a non-zero
word.  Everything is inline and `nogil`, so `cimport` it from any .pyx.
"""
from libc.stdint cimport uint32_t, uint64_t


cdef inline uint64_t splitmix64(uint64_t* state) noexcept nogil:
    """Next output of splitmix64 (used to spread seeds and make Zobrist keys)."""
    state[0] += <uint64_t>0x9E3779B97F4A7C15
    cdef uint64_t z = state[0]
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EB
    return z ^ (z >> 31)


cdef inline uint64_t rng_seed(uint64_t seed) noexcept nogil:
    """A valid (non-zero) xorshift64* state derived from any 64-bit seed."""
    cdef uint64_t s = seed
    cdef uint64_t out = splitmix64(&s)
    if out == 0:
        out = <uint64_t>0x9E3779B97F4A7C15
    return out


cdef inline uint64_t rng_next(uint64_t* state) noexcept nogil:
    """Next 64-bit draw of xorshift64*; advances `state` in place."""
    cdef uint64_t x = state[0]
    x ^= x >> 12
    x ^= x << 25
    x ^= x >> 27
    state[0] = x
    return x * <uint64_t>0x2545F4914F6CDD1D


cdef inline uint32_t rng_below(uint64_t* state, uint32_t bound) noexcept nogil:
    """Uniform integer in [0, bound) by Lemire's multiply-shift (no division).

    The bias is at most bound / 2**32, far below anything a playout can see.
    """
    return <uint32_t>(((rng_next(state) >> 32) * <uint64_t>bound) >> 32)
