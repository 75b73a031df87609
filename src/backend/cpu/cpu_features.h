/* cpu_features.h - which SIMD kernels this CPU can run, decided once at run
 * time (CLLM_ISA=scalar|avx2|avx512 lowers the choice, for tests/benchmarks). */
#ifndef CLLM_BACKEND_CPU_FEATURES_H
#define CLLM_BACKEND_CPU_FEATURES_H

#include "base/err.h"

enum cpu_isa {
    CPU_ISA_SCALAR = 0,
    CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    CPU_ISA_AVX512 = 2, /* AVX-512 F/BW/VL (+VNNI when present) */
};

/* The ISA the kernels use: the best the hardware has, lowered by CLLM_ISA
 * (a wider one than the hardware has is ignored: it would crash with
 * SIGILL); -1 with a message naming the allowed values when CLLM_ISA is set
 * to something else. */
int cpu_isa_detect(struct err *e);
const char *cpu_isa_name(enum cpu_isa isa);
/* The ISA cpu_isa_name calls s; -1 for any other string. */
int cpu_isa_from_name(const char *s);

/* The best ISA the hardware and OS support, ignoring CLLM_ISA (tests use it
 * to enumerate every kernel family the machine can run). */
enum cpu_isa cpu_isa_hw(void);

/* AVX-512 VNNI (vpdpbusd): the AVX-512 Q8_0 kernels need it; without it the
 * AVX2 Q8_0 kernel is used even when the ISA is AVX-512. */
int cpu_has_avx512_vnni(void);

/* AVX512_BF16 (vdpbf16ps): bf16 weights' prompts by bf16 dot products
 * (matmul.h's bf16dot). */
int cpu_has_avx512_bf16(void);

#endif
