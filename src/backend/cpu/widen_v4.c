/* widen_v4.c - widen_kern.h built for AVX-512 (CMake compiles this file
 * for it on x86-64; cpu_widen_for calls it only where the CPU has it):
 * sixteen values a vector, the fifth bits by mask moves. The compiler's
 * vectorization of quant_dq.h's portable loops had left these formats at
 * about half a cycle a value, the bound of their decode
 * (docs/benchmarks.md). */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>

#define W_VEC __m512
#define W_SET1(x) _mm512_set1_ps(x)
#define W_BITS16(b) _mm_maskz_mov_epi8((__mmask16)(b), _mm_set1_epi8(16))
#define W_WIDEN cpu_widen_avx512

static inline void q16(float *o, __m128i codes, __m512 s, __m512 m, int is_signed)
{
    const __m512i i = is_signed ? _mm512_cvtepi8_epi32(codes) : _mm512_cvtepu8_epi32(codes);
    _mm512_storeu_ps(o, _mm512_sub_ps(_mm512_mul_ps(s, _mm512_cvtepi32_ps(i)), m));
}

#include "backend/cpu/widen_kern.h"
#else
typedef int widen_v4_unused; /* ISO C wants something in a file */
#endif
