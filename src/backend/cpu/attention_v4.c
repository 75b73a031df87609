/* attention_v4.c - the attention kernels built for AVX-512 (F, BW, VL, DQ: CPU_ISA_AVX512);
 * CMake compiles this file for that instruction set on x86-64, and
 * attention.c calls them only where the CPU has it. */
#if defined(__x86_64__)
#define ATT_KERNELS att_kernels_v4
#include "backend/cpu/attention_kern.h"
#else
typedef int attention_v4_unused; /* ISO C wants something in a file */
#endif
