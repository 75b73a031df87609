/* cpu_features.c - run-time choice of the SIMD kernel family.
 *
 * Read from CPUID directly rather than __builtin_cpu_supports, whose
 * feature names differ between compilers and versions. A feature counts
 * only when the OS also saves its registers on context switch (XCR0), or
 * the first wide instruction would fault. */
#include "backend/cpu/cpu_features.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

struct cpu_flags {
    int avx2, avx512, vnni, bf16;
};

static unsigned long long cpu_xcr0(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static struct cpu_flags cpu_read_flags(void)
{
    struct cpu_flags f = {0, 0, 0, 0};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return f;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx)
        return f;
    unsigned long long xcr0 = cpu_xcr0();
    int ymm_state = (xcr0 & 0x6) == 0x6;            /* SSE + AVX */
    int zmm_state = ymm_state && (xcr0 & 0xe0) == 0xe0; /* opmask + ZMM */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return f;
    f.avx2 = ymm_state && fma && f16c && ((b >> 5) & 1);
    int avx512f = (b >> 16) & 1, avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1;
    f.avx512 = f.avx2 && zmm_state && avx512f && avx512bw && avx512vl;
    f.vnni = f.avx512 && ((c >> 11) & 1);
    if (f.avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
        f.bf16 = (a >> 5) & 1;
    return f;
}
#endif

enum cpu_isa cpu_isa_hw(void)
{
#if defined(__x86_64__) || defined(__i386__)
    struct cpu_flags f = cpu_read_flags();
    if (f.avx512)
        return CPU_ISA_AVX512;
    if (f.avx2)
        return CPU_ISA_AVX2;
#endif
    return CPU_ISA_SCALAR;
}

int cpu_has_avx512_vnni(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return cpu_read_flags().vnni;
#else
    return 0;
#endif
}

int cpu_has_avx512_bf16(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return cpu_read_flags().bf16;
#else
    return 0;
#endif
}

int cpu_isa_detect(struct err *e)
{
    enum cpu_isa isa = cpu_isa_hw();
    const char *env = getenv("CLLM_ISA");
    if (!env || !*env)
        return isa;
    int want = cpu_isa_from_name(env);
    if (want < 0)
        return err_set(e, "CLLM_ISA=\"%s\": needs scalar, avx2 or avx512", env);
    return want < (int)isa ? want : (int)isa;
}

int cpu_isa_from_name(const char *s)
{
    for (int i = CPU_ISA_SCALAR; i <= CPU_ISA_AVX512; i++)
        if (!strcmp(s, cpu_isa_name((enum cpu_isa)i)))
            return i;
    return -1;
}

const char *cpu_isa_name(enum cpu_isa isa)
{
    switch (isa) {
    case CPU_ISA_SCALAR: return "scalar";
    case CPU_ISA_AVX2: return "avx2";
    case CPU_ISA_AVX512: return "avx512";
    default: return "?";
    }
}
