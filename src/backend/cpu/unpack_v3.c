/* unpack_v3.c - unpack_kern.h built for AVX2 (CMake compiles this file for
 * it on x86-64; cpu_unpack_for calls it only where the CPU has it): the
 * fifth bits by a byte shuffle and compare. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>

#define U_BITS16(b) bits16(b)
#define U_UNPACK cpu_unpack_avx2

/* Byte j: 16 where bit j of the 16 bits b is set, else 0 */
static inline __m128i bits16(uint32_t b)
{
    const __m128i rep = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)b),
                                         _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m128i bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(rep, bit), bit), _mm_set1_epi8(16));
}

#include "backend/cpu/unpack_kern.h"
#else
typedef int unpack_v3_unused; /* ISO C wants something in a file */
#endif
