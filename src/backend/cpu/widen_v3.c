/* widen_v3.c - widen_kern.h built for AVX2 (CMake compiles this file for it
 * on x86-64; cpu_widen_for calls it only where the CPU has it): eight
 * values a vector, the fifth bits by a byte shuffle and compare. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>

#define W_VEC __m256
#define W_SET1(x) _mm256_set1_ps(x)
#define W_BITS16(b) bits16(b)
#define W_WIDEN cpu_widen_avx2

static inline void q16(float *o, __m128i codes, __m256 s, __m256 m, int is_signed)
{
    const __m128i up = _mm_srli_si128(codes, 8);
    const __m256i a = is_signed ? _mm256_cvtepi8_epi32(codes) : _mm256_cvtepu8_epi32(codes);
    const __m256i b = is_signed ? _mm256_cvtepi8_epi32(up) : _mm256_cvtepu8_epi32(up);
    _mm256_storeu_ps(o, _mm256_sub_ps(_mm256_mul_ps(s, _mm256_cvtepi32_ps(a)), m));
    _mm256_storeu_ps(o + 8, _mm256_sub_ps(_mm256_mul_ps(s, _mm256_cvtepi32_ps(b)), m));
}

/* Byte j: 16 where bit j of the 16 bits b is set, else 0 */
static inline __m128i bits16(uint32_t b)
{
    const __m128i rep = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)b),
                                         _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m128i bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(rep, bit), bit), _mm_set1_epi8(16));
}

#include "backend/cpu/widen_kern.h"
#else
typedef int widen_v3_unused; /* ISO C wants something in a file */
#endif
