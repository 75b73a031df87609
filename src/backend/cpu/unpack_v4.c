/* unpack_v4.c - unpack_kern.h built for AVX-512 (CMake compiles this file
 * for it on x86-64; cpu_unpack_for calls it only where the CPU has it):
 * the fifth bits by mask moves. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>

#define U_BITS16(b) _mm_maskz_mov_epi8((__mmask16)(b), _mm_set1_epi8(16))
#define U_UNPACK cpu_unpack_avx512

#include "backend/cpu/unpack_kern.h"
#else
typedef int unpack_v4_unused; /* ISO C wants something in a file */
#endif
