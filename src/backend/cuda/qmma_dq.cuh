/* qmma_dq.cuh - how the tensor-core GEMV on Q4_K, Q5_K and Q6_K blocks
 * (gemv_mma_quant.cu) reads a block: a 32-value group's scale d1 and
 * 128 d1 + m1 from the block's 16-byte header (Q6_K: its two 16-value
 * scales d sc), and its values as bf16 pairs 128 + q, 128 + q' that the
 * mma takes as A. A header of
 * its own so that tests/test_quant_dq_emu.cpp holds these to the host's
 * widening (quant_dequantize_row) where there is no GPU. */
#ifndef CLLM_BACKEND_CUDA_QMMA_DQ_CUH
#define CLLM_BACKEND_CUDA_QMMA_DQ_CUH

#include <stdint.h>

#include "model/tensor.h"

/* Groups 2j, 2j + 1, 2j + 4, 2j + 5 (j: 0 or 1) of a block's header:
 * their d1 (a[]) and 128 d1 + m1 (b[]), model/quant_dq.h's k_scale_min
 * and the host's products. A lane makes four of a slot's 16 rows x 8
 * groups: every lane runs the same code, the high groups' scales being
 * bytes 2j, 2j + 1 of the header's words as the low ones' are. */
static __device__ __forceinline__ void qmma_coef4(const uint4 &hd, int j, float (&a)[4],
                                                  float (&b)[4])
{
    const uint32_t y = hd.y >> (16 * j), z = hd.z >> (16 * j), w = hd.w >> (16 * j);
    const float d = __half2float(__ushort_as_half((unsigned short)(hd.x & 0xFFFF))),
                dmin = __half2float(__ushort_as_half((unsigned short)(hd.x >> 16)));
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const uint32_t sh = 8 * k;
        const uint32_t sc[2] = {(y >> sh) & 63,
                                ((w >> sh) & 0xF) | ((y >> (sh + 6)) & 3) << 4};
        const uint32_t mn[2] = {(z >> sh) & 63,
                                ((w >> (sh + 4)) & 0xF) | ((z >> (sh + 6)) & 3) << 4};
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            const float d1 = __fmul_rn(d, (float)sc[hi]);
            a[2 * hi + k] = d1;
            b[2 * hi + k] = fmaf(128.0f, d1, __fmul_rn(dmin, (float)mn[hi]));
        }
    }
}

/* Group i's codes (0..7) of the four bytes w of its run (low nibbles for
 * even i, high for odd), one a byte; Q5_K: bit i of the same bytes of hw,
 * its fifth bits, as 16 more. */
template <int DT>
static __device__ __forceinline__ uint32_t qmma_codes(uint32_t w, uint32_t hw, int i)
{
    uint32_t m = (i & 1 ? w >> 4 : w) & 0x0F0F0F0Fu;
    if (DT == DT_Q5_K)
        m |= (i <= 4 ? hw << (4 - i) : hw >> (i - 4)) & 0x10101010u;
    return m;
}

/* Q6_K: groups 2j, 2j + 1, 2j + 4, 2j + 5 of a block (j: lane half):
 * from d (hd.x's low 16 bits) and scale words j, 2 + j (hd.y, hd.z:
 * group i's int8 scales are bytes 2i, 2i + 1), d sc of the group's
 * columns 0-15 (a[]) and 16-31 (b[]), the host's products. */
static __device__ __forceinline__ void qmma_coef6(const uint4 &hd, float (&a)[4], float (&b)[4])
{
    const float d = __half2float(__ushort_as_half((unsigned short)(hd.x & 0xFFFF)));
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t w = (k < 2 ? hd.y : hd.z) >> (16 * (k & 1));
        a[k] = __fmul_rn(d, (float)(int8_t)(w & 0xFF));
        b[k] = __fmul_rn(d, (float)(int8_t)((w >> 8) & 0xFF));
    }
}

/* Q6_K: group 4n + k's codes (k: 0..3) of four bytes w of its run of low
 * nibbles (high ones from k = 2) and the same bytes h of its half's bit
 * pairs (bits 2k), one a byte: q in 0..63, the value q - 32. */
static __device__ __forceinline__ uint32_t qmma_codes6(uint32_t w, uint32_t h, int k)
{
    const uint32_t lo = (k & 2 ? w >> 4 : w) & 0x0F0F0F0Fu;
    return lo | ((k == 3 ? h >> 2 : h << (4 - 2 * k)) & 0x30303030u);
}

/* Codes 2e, 2e + 1 of qmma_codes' (or qmma_codes6') word as the bf16 pair 128 + q,
 * 128 + q': the bits 0x4300 | q, one byte permute. */
static __device__ __forceinline__ uint32_t qmma_pair(uint32_t m, int e)
{
    return __byte_perm(m, 0x43434343u, e ? 0x4342 : 0x4140);
}

#endif
