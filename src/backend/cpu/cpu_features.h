/* cpu_features.h - which SIMD kernels this CPU can run, decided once at run
 * time (CLLM_ISA=scalar|avx2|avx512 lowers the choice, for tests/benchmarks). */
#ifndef CLLM_BACKEND_CPU_FEATURES_H
#define CLLM_BACKEND_CPU_FEATURES_H

enum cpu_isa {
    CPU_ISA_SCALAR = 0,
    CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    CPU_ISA_AVX512 = 2, /* AVX-512 F/BW/VL (+VNNI when present) */
};

enum cpu_isa cpu_isa_detect(void);
const char *cpu_isa_name(enum cpu_isa isa);

#endif
