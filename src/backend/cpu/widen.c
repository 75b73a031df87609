/* widen.c - cpu_widen_for: which build of the widening a CPU runs. Built
 * for the baseline instruction set: it is called on every CPU, before any
 * check of what the CPU has could keep AVX2 code (widen_v3.c's) from it. */
#include "backend/cpu/widen.h"

#include "model/quant.h"

#if defined(__x86_64__)
void cpu_widen_avx2(enum dtype dt, const void *src, float *y, int64_t n);
void cpu_widen_avx512(enum dtype dt, const void *src, float *y, int64_t n);
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
