/* qmma_dq.cuh - how the tensor-core GEMV on Q4_K and Q5_K blocks
 * (gemv_mma_quant.cu) reads a block: a 32-value group's scale d1 and
 * 128 d1 + m1 from the block's 16-byte header, and two of its values as
 * the bf16 pair 128 + q, 128 + q' that the mma takes as A. A header of
 * its own so that tests/test_quant_dq_emu.cpp holds these to the host's
 * widening (quant_dequantize_row) where there is no GPU. */
#ifndef CLLM_BACKEND_CUDA_QMMA_DQ_CUH
#define CLLM_BACKEND_CUDA_QMMA_DQ_CUH

#include <stdint.h>

#include "model/tensor.h"

static __device__ __forceinline__ uint32_t qmma_byte(const uint4 &hd, int k)
{
    const uint32_t w = k < 4 ? hd.y : k < 8 ? hd.z : hd.w; /* scale bytes 0-3, 4-7, 8-11 */
    return (w >> (8 * (k & 3))) & 0xFF;
}

/* Group i's (0..7) d1 and 128 d1 + m1 from a block's header
 * (model/quant_dq.h's k_scale_min). */
static __device__ __forceinline__ void qmma_coef(const uint4 &hd, int i, float &a, float &b)
{
    uint32_t sc, mn;
    if (i < 4) {
        sc = qmma_byte(hd, i) & 63;
        mn = qmma_byte(hd, i + 4) & 63;
    } else {
        sc = (qmma_byte(hd, i + 4) & 0xF) | (qmma_byte(hd, i - 4) >> 6) << 4;
        mn = (qmma_byte(hd, i + 4) >> 4) | (qmma_byte(hd, i) >> 6) << 4;
    }
    const float d = __half2float(__ushort_as_half((unsigned short)(hd.x & 0xFFFF))),
                dmin = __half2float(__ushort_as_half((unsigned short)(hd.x >> 16)));
    a = __fmul_rn(d, (float)sc);
    b = fmaf(128.0f, a, __fmul_rn(dmin, (float)mn));
}

/* Values 128 + q of bytes 2e, 2e + 1 of w (low nibbles, or high with
 * HI; Q5_K: bit b of the same bytes of hw, its fifth bits, as 16 more)
 * as a bf16 pair. */
template <int DT, bool HI>
static __device__ __forceinline__ uint32_t qmma_pair(uint32_t w, uint32_t hw, int b, int e)
{
    const uint32_t sel = e ? 0x4342 : 0x4140;
    uint32_t p = __byte_perm(w, 0, sel);
    if (HI)
        p >>= 4;
    p = (p & 0x000F000Fu) | 0x43004300u;
    if (DT == DT_Q5_K)
        p |= ((__byte_perm(hw, 0, sel) >> b) & 0x00010001u) << 4;
    return p;
}

#endif
