/* widen_v3.c - quant_dq.h's widening built for AVX2 (CMake compiles this
 * file for it on x86-64; cpu_widen_for calls it only where the CPU has it),
 * and cpu_widen_for, which picks a build. */
#include "backend/cpu/widen.h"

#include "model/quant.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define QUANT_F16(h) _cvtsh_ss(h)
#include "model/quant_dq.h"

void cpu_widen_avx512(enum dtype dt, const void *src, float *y, int64_t n);

static void cpu_widen_avx2(enum dtype dt, const void *src, float *y, int64_t n)
{
    quant_dq_row(dt, src, y, n);
}
#endif

cpu_widen_fn cpu_widen_for(enum cpu_isa isa)
{
#if defined(__x86_64__)
    if (isa >= CPU_ISA_AVX512)
        return cpu_widen_avx512;
    if (isa >= CPU_ISA_AVX2)
        return cpu_widen_avx2;
#else
    (void)isa;
#endif
    return quant_dequantize_row;
}
