/* widen_v4.c - quant_dq.h's widening built for AVX-512 (CMake compiles this
 * file for it on x86-64; cpu_widen_for calls it only where the CPU has it). */
#if defined(__x86_64__)
#include <immintrin.h>
#define QUANT_F16(h) _cvtsh_ss(h)
#include "model/quant_dq.h"

void cpu_widen_avx512(enum dtype dt, const void *src, float *y, int64_t n);
void cpu_widen_avx512(enum dtype dt, const void *src, float *y, int64_t n)
{
    quant_dq_row(dt, src, y, n);
}
#else
typedef int widen_v4_unused; /* ISO C wants something in a file */
#endif
