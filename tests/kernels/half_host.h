/* half_host.h - what the kernel tests (test_gemv_staged, test_gemm_tc)
 * need on the host: whether there is a GPU to run on, a reproducible
 * uniform draw, and f32 <-> bf16/f16 rounding as the device rounds
 * (nearest even). Header-only: each test is one translation unit. */
#ifndef CLLM_TESTS_KERNELS_HALF_HOST_H
#define CLLM_TESTS_KERNELS_HALF_HOST_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Whether GPU 0 is a Hopper or newer (*prop: its properties); otherwise
 * prints "skipped: no GPU (the <what> needs ...)" so the test passes. */
static inline bool hopper_present(struct cudaDeviceProp *prop, const char *what)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n >= 1 &&
        cudaGetDeviceProperties(prop, 0) == cudaSuccess && prop->major >= 9)
        return true;
    printf("skipped: no GPU (the %s needs a Hopper or newer GPU)\n", what);
    return false;
}

#include "model/tensor.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static inline float frand(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

static inline uint16_t to_half(float f, int dt)
{
    if (dt == DT_BF16) {
        uint32_t u;
        memcpy(&u, &f, 4);
        return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    }
    /* f16 of |f| < 2: normal numbers only (the test's values) */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int ex = (int)((u >> 23) & 0xff) - 127 + 15;
    if (ex <= 0)
        return (uint16_t)sign;
    uint32_t m = u & 0x7fffffu, r = m >> 13, rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1)))
        r++;
    return (uint16_t)(sign | (((uint32_t)ex << 10) + r));
}

static inline float from_half(uint16_t h, int dt)
{
    if (dt == DT_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    int ex = (h >> 10) & 0x1f;
    float m = (float)(h & 0x3ff);
    float v = ex ? ldexpf(1.0f + m / 1024.0f, ex - 15) : ldexpf(m / 1024.0f, -14);
    return (h & 0x8000) ? -v : v;
}

#endif
