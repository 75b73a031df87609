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

#include "backend/cuda/quant_dq.cuh"
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

/* A block's layout. Q4_K: d, dmin (f16) and 12 scale bytes, then (Q5_K)
 * 32 bytes of fifth bits, then 128 bytes of 4-bit codes. Q6_K: 128
 * bytes of low nibbles, 64 of high bit pairs, 16 int8 scales (one a 16
 * values), d (f16): 210 bytes, so a block is 2-aligned and its slot row
 * the 14 aligned 16-byte pieces that cover it (BB), the block starting
 * at its address % 16 in them. */
template <int DT> struct qmma_fmt {
    static constexpr bool K6 = DT == DT_Q6_K;
    static constexpr int BYTES = qd_align<DT>::BB; /* a block (quant_dq.cuh's) */
    static constexpr int BB = K6 ? 224 : BYTES;            /* a slot row */
    static constexpr int QS = DT == DT_Q5_K ? 48 : 16;     /* Q4/5_K: where the codes start */
};

/* A lane's codes of one block of its two rows (h: row g, g + 8). Q4_K,
 * Q5_K: bytes 8t .. 8t + 7 of code run k (low nibbles group 2k, high
 * 2k + 1) and of the fifth bits (bit i: group i). Q6_K: of half n, run
 * k (ql bytes 64n + 32k ..), the words of bytes 4t .. 4t + 3 and 16 +
 * 4t .. (x, y: the group's columns 4t .., 16 + 4t ..), low nibbles for
 * groups 4n + k, high for 4n + k + 2; qh[h][n], the same words of its
 * 32 bytes of bit pairs (bits 2k: group 4n + k). */
struct qmma_raw {
    uint2 q[2][4];
    uint2 qh[2][2];
};

/* The 4 bytes at row + o (o even; a Q6_K slot row's 2-aligned words).
 * It loads the aligned words at o & ~3 and after, so bytes up to
 * (o & ~3) + 7 must be the caller's: within the slot row. */
static __device__ __forceinline__ uint32_t qmma_word2(const unsigned char *row, int o)
{
    const uint32_t *w = (const uint32_t *)(row + (o & ~3));
    return __funnelshift_r(w[0], w[1], 8 * (o & 3));
}

/* The lane's codes of the chunk in the slot at sl (rows g, g + 8). */
template <int DT>
static __device__ __forceinline__ void qmma_read(qmma_raw &r, const unsigned char *sl, int g,
                                                 int tig, const int (&skew)[2])
{
    using F = qmma_fmt<DT>;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const unsigned char *row = sl + (g + 8 * h) * F::BB;
        if constexpr (F::K6) {
            const int o = skew[h] + 4 * tig;
#pragma unroll
            for (int k = 0; k < 4; k++) /* half k / 2, run k % 2 */
                r.q[h][k] = make_uint2(qmma_word2(row, o + 32 * k), qmma_word2(row, o + 32 * k + 16));
#pragma unroll
            for (int n = 0; n < 2; n++)
                r.qh[h][n] = make_uint2(qmma_word2(row, o + 128 + 32 * n),
                                        qmma_word2(row, o + 144 + 32 * n));
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++)
                r.q[h][k] = *(const uint2 *)(row + F::QS + 32 * k + 8 * tig);
            r.qh[h][0] = DT == DT_Q5_K ? *(const uint2 *)(row + 16 + 8 * tig) : make_uint2(0, 0);
        }
    }
}

/* The header qmma_coefs reads of row r's block at skew o of the slot:
 * Q4_K / Q5_K its 16 bytes; Q6_K d in x and, for lane half j, scale
 * words j and 2 + j in y and z. d, the block's last two bytes, is read
 * alone: qmma_word2 there read 4 to 6 bytes past the block, beyond the
 * slot row at skews 12 and 14, into the bytes of a copy in flight (the
 * next row's, or another warp's ring: racecheck's errors on the 8B's
 * Q6_K down projection at 8 streams, docs/benchmarks.md, session 64). */
template <int DT>
static __device__ __forceinline__ uint4 qmma_head(const unsigned char *sl, int r, int o, int j)
{
    using F = qmma_fmt<DT>;
    const unsigned char *row = sl + r * F::BB;
    if constexpr (F::K6)
        return make_uint4(*(const uint16_t *)(row + o + 208), qmma_word2(row, o + 192 + 4 * j),
                          qmma_word2(row, o + 200 + 4 * j), 0);
    else
        return *(const uint4 *)row;
}

/* The chunk's coefficients: lane L makes those of row L % 16, groups
 * 2j, 2j + 1, 2j + 4, 2j + 5 (j = L / 16), from the header hd it read
 * of the slot, and writes them over the slot (its codes are in the
 * lanes' registers by then): cf[8 i + g] = {d1, 128 d1 + m1 of row g,
 * the same of row g + 8} for group i (Q6_K: d sc of its columns 0-15,
 * of 16-31), one 16-byte read a group for a lane's two rows. */
template <int DT>
static __device__ __forceinline__ void qmma_coefs(float4 *cf, const uint4 &hd, int lane)
{
    const int r = lane & 15, j = lane >> 4;
    float a[4], b[4];
    if (DT == DT_Q6_K)
        qmma_coef6(hd, a, b);
    else
        qmma_coef4(hd, j, a, b);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int i = 2 * j + (k & 1) + 4 * (k >> 1);
        ((float2 *)&cf[8 * i + (r & 7)])[r >> 3] = make_float2(a[k], b[k]);
    }
}

/* A lane's x for a 32-column group of its columns: cols 8t .. 8t + 7
 * (Q4_K, Q5_K), or Q6_K's 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3 (each
 * k-step within one of its 16-value scales); zeros past n tokens. */
template <int DT>
static __device__ __forceinline__ uint4 qmma_x(const uint16_t *xs, int stride, int tok, int n,
                                               int col0, int tig)
{
    if (tok >= n)
        return make_uint4(0, 0, 0, 0);
    const uint16_t *row = xs + (size_t)tok * stride + col0;
    if (DT != DT_Q6_K)
        return *(const uint4 *)(row + 8 * tig);
    const uint2 a = *(const uint2 *)(row + 4 * tig), b = *(const uint2 *)(row + 16 + 4 * tig);
    return make_uint4(a.x, a.y, b.x, b.y);
}

/* Group i's (0..7) A fragments of a chunk's codes r (the lane's rows g,
 * g + 8): a0 the mma's first k-step, a1 its second. Q4_K / Q5_K: columns
 * 8t .. 8t + 3 of the group as k 2t, 2t + 1 | 2t + 8, 2t + 9, and 8t + 4
 * .. 8t + 7; Q6_K: columns 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3, so
 * each k-step lies in one 16-value scale (qmma_x reads x alike). */
template <int DT>
static __device__ __forceinline__ void qmma_a(const qmma_raw &r, int i, uint32_t (&a0)[4],
                                              uint32_t (&a1)[4])
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        /* Q6_K: half i / 4, run i % 2, high nibbles from i % 4 = 2 */
        const uint2 w = DT == DT_Q6_K ? r.q[h][2 * (i / 4) + (i & 1)] : r.q[h][i / 2];
        const uint2 hw = r.qh[h][DT == DT_Q6_K ? i / 4 : 0];
        const uint32_t mx = DT == DT_Q6_K ? qmma_codes6(w.x, hw.x, i & 3)
                                          : qmma_codes<DT>(w.x, hw.x, i),
                       my = DT == DT_Q6_K ? qmma_codes6(w.y, hw.y, i & 3)
                                          : qmma_codes<DT>(w.y, hw.y, i);
        a0[h] = qmma_pair(mx, 0);
        a0[2 + h] = qmma_pair(mx, 1);
        a1[h] = qmma_pair(my, 0);
        a1[2 + h] = qmma_pair(my, 1);
    }
}

#endif
