/* quant_dq.cuh - GGUF's 2-6-bit block formats (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) widened to f32 on the device, eight
 * consecutive values at a time, from the file's own block bytes (the
 * device keeps them as uploaded). Each value has the bits
 * quant_dequantize_row (model/quant_dq.h, llama.cpp's dequantize_row_*)
 * gives it on the host: the same products in the same order, each rounded
 * (__fmul_rn / __fadd_rn / __fsub_rn, so nothing is contracted into a
 * multiply-add). Block layouts: the structs of model/quant_dq.h. */
#ifndef CLLM_BACKEND_CUDA_QUANT_DQ_CUH
#define CLLM_BACKEND_CUDA_QUANT_DQ_CUH

#include <stdint.h>

#include <type_traits>

#include "model/tensor.h"

/* Values and bytes of one block of a low-bit dtype (0 for any other). */
static __host__ __device__ __forceinline__ int cuk_q_block_elems(int dt)
{
    return dt >= DT_Q4_0 && dt <= DT_Q5_1 ? 32 : dt >= DT_Q4_K && dt <= DT_Q3_K ? 256 : 0;
}
static __host__ __device__ __forceinline__ int cuk_q_block_bytes(int dt)
{
    switch (dt) {
    case DT_Q4_0: return 18;
    case DT_Q4_1: return 20;
    case DT_Q5_0: return 22;
    case DT_Q5_1: return 24;
    case DT_Q4_K: return 144;
    case DT_Q5_K: return 176;
    case DT_Q6_K: return 210;
    case DT_Q2_K: return 84;
    case DT_Q3_K: return 110;
    default: return 0;
    }
}
static __host__ __device__ __forceinline__ bool cuk_q_low_bit(int dt)
{
    return cuk_q_block_elems(dt) > 0;
}

/* Host code's one switch from a dtype known at run time to a template
 * instance: f(std::integral_constant<int, DT>{}) for DT one of the
 * low-bit dtypes or Q8_0 (the dtypes the quantized kernels are
 * instantiated for), `other` for any other dtype. */
template <class R, class F>
static inline R cuk_q_dispatch(int dt, R other, F &&f)
{
    switch (dt) {
    case DT_Q8_0: return f(std::integral_constant<int, DT_Q8_0>{});
    case DT_Q4_0: return f(std::integral_constant<int, DT_Q4_0>{});
    case DT_Q4_1: return f(std::integral_constant<int, DT_Q4_1>{});
    case DT_Q5_0: return f(std::integral_constant<int, DT_Q5_0>{});
    case DT_Q5_1: return f(std::integral_constant<int, DT_Q5_1>{});
    case DT_Q4_K: return f(std::integral_constant<int, DT_Q4_K>{});
    case DT_Q5_K: return f(std::integral_constant<int, DT_Q5_K>{});
    case DT_Q6_K: return f(std::integral_constant<int, DT_Q6_K>{});
    case DT_Q2_K: return f(std::integral_constant<int, DT_Q2_K>{});
    case DT_Q3_K: return f(std::integral_constant<int, DT_Q3_K>{});
    default: return other;
    }
}

/* A read-only load from global memory (__ldg), or with SH from shared
 * memory, where the staged quantized GEMV (gemv_quant.cu) keeps its
 * copies of the blocks. */
template <bool SH, typename T> static __device__ __forceinline__ T qd_ld(const T *p)
{
    if constexpr (SH)
        return *p;
    else
        return __ldg(p);
}

/* Loads that the formats' alignments allow: every block starts at an even
 * offset (all block sizes are even), so 16-bit loads are always safe. */
template <bool SH = false> static __device__ __forceinline__ uint32_t qd_u16(const uint8_t *p)
{
    return qd_ld<SH>((const uint16_t *)p);
}
template <bool SH = false> static __device__ __forceinline__ float qd_f16(const uint8_t *p)
{
    return __half2float(__ushort_as_half((unsigned short)qd_u16<SH>(p)));
}
/* Eight bytes at an address A-aligned (2, 4 or 8) as two 32-bit words
 * (b0 = bytes 0-3), in as few loads as that allows. */
template <int A, bool SH = false>
static __device__ __forceinline__ void qd_bytes8(const uint8_t *p, uint32_t &b0, uint32_t &b1)
{
    if constexpr (A == 8) {
        const uint2 u = qd_ld<SH>((const uint2 *)p);
        b0 = u.x;
        b1 = u.y;
    } else if constexpr (A == 4) {
        b0 = qd_ld<SH>((const uint32_t *)p);
        b1 = qd_ld<SH>((const uint32_t *)p + 1);
    } else {
        const uint16_t *h = (const uint16_t *)p;
        b0 = (uint32_t)qd_ld<SH>(h) | (uint32_t)qd_ld<SH>(h + 1) << 16;
        b1 = (uint32_t)qd_ld<SH>(h + 2) | (uint32_t)qd_ld<SH>(h + 3) << 16;
    }
}

/* The alignment every 8-byte run cuk_dq8_block reads has, in a row of
 * blocks starting 8-aligned: the block size's (its fields' offsets are
 * multiples of 8 within the block where the size is). */
template <int DT> struct qd_align {
    static constexpr int BB = DT == DT_Q4_0   ? 18
                              : DT == DT_Q4_1 ? 20
                              : DT == DT_Q5_0 ? 22
                              : DT == DT_Q5_1 ? 24
                              : DT == DT_Q4_K ? 144
                              : DT == DT_Q5_K ? 176
                              : DT == DT_Q6_K ? 210
                              : DT == DT_Q2_K ? 84
                                              : 110;
    static constexpr int A = BB % 8 == 0 ? 8 : BB % 4 == 0 ? 4 : 2;
};
static __device__ __forceinline__ uint32_t qd_byte(uint32_t b0, uint32_t b1, int i)
{
    return ((i < 4 ? b0 : b1) >> (8 * (i & 3))) & 0xFF;
}
/* The fifth bits of a 32-block (qh: 4 bytes at an even address). */
template <bool SH = false> static __device__ __forceinline__ uint32_t qd_u32(const uint8_t *p)
{
    return qd_u16<SH>(p) | qd_u16<SH>(p + 2) << 16;
}

/* The small integer q - bias (0 <= q < 2^23) as f32, exactly: q's bits
 * under 2^23's exponent, less 2^23 + bias. Full-rate logic and an add,
 * where a conversion instruction runs at a quarter of the rate. */
static __device__ __forceinline__ float qd_float(uint32_t q, float bias)
{
    return __fsub_rn(__uint_as_float(0x4B000000u | q), 8388608.0f + bias);
}

/* K blocks' group j scale and min (model/quant_dq.h's k_scale_min). */
static __device__ __forceinline__ void qd_k_scale_min(const uint8_t *q, int j, int &sc, int &mn)
{
    if (j < 4) {
        sc = __ldg(q + j) & 63;
        mn = __ldg(q + j + 4) & 63;
    } else {
        const int a = __ldg(q + j + 4), lo = __ldg(q + j - 4), hi = __ldg(q + j);
        sc = (a & 0xF) | ((lo >> 6) << 4);
        mn = (a >> 4) | ((hi >> 6) << 4);
    }
}

/* Values o..o+7 (o a multiple of 8, below the block's values) of the
 * block at b, into v. */
template <int DT>
static __device__ __forceinline__ void cuk_dq8_block(const uint8_t *b, int o, float *v)
{
    if constexpr (DT == DT_Q4_0 || DT == DT_Q4_1 || DT == DT_Q5_0 || DT == DT_Q5_1) {
        constexpr bool affine = DT == DT_Q4_1 || DT == DT_Q5_1, five = DT == DT_Q5_0 || DT == DT_Q5_1;
        const float d = qd_f16(b), m = affine ? qd_f16(b + 2) : 0.0f;
        const uint8_t *p = b + (affine ? 4 : 2);
        uint32_t qh = 0;
        if (five) {
            qh = qd_u32(p);
            p += 4;
        }
        uint32_t b0, b1; /* value i of 32: low nibble of byte i (< 16), else high of i - 16 */
        qd_bytes8<qd_align<DT>::A>(p + (o & 15), b0, b1);
        const int shift = o < 16 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t q = (qd_byte(b0, b1, i) >> shift) & 0xF;
            if (five)
                q |= ((qh >> (o + i)) & 1) << 4;
            if (affine)
                v[i] = __fadd_rn(__fmul_rn(qd_float(q, 0.0f), d), m);
            else
                v[i] = __fmul_rn(qd_float(q, five ? 16.0f : 8.0f), d);
        }
    } else if constexpr (DT == DT_Q4_K || DT == DT_Q5_K) {
        /* 64-value chunks: group 2c in the low nibbles of 32 bytes, 2c + 1
         * in the high ones; Q5_K's fifth bits in qh[l], bit 2c / 2c + 1 */
        const float d = qd_f16(b), dmin = qd_f16(b + 2);
        const int g = o / 32, l = o % 32, c = o / 64;
        int sc, mn;
        qd_k_scale_min(b + 4, g, sc, mn);
        const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)mn);
        const uint8_t *qs = b + (DT == DT_Q5_K ? 48 : 16) + 32 * c + l;
        uint32_t b0, b1, h0 = 0, h1 = 0;
        qd_bytes8<qd_align<DT>::A>(qs, b0, b1);
        if (DT == DT_Q5_K)
            qd_bytes8<qd_align<DT>::A>(b + 16 + l, h0, h1);
        const int shift = g & 1 ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t q = (qd_byte(b0, b1, i) >> shift) & 0xF;
            if (DT == DT_Q5_K)
                q |= ((qd_byte(h0, h1, i) >> g) & 1) << 4;
            v[i] = __fsub_rn(__fmul_rn(d1, qd_float(q, 0.0f)), m1);
        }
    } else if constexpr (DT == DT_Q6_K) {
        /* half n (128 values), quarter qq (32), value l: low bits in
         * ql[64 n + l + 32 (qq & 1)] (low nibble for qq < 2), high bits
         * 2 qq of qh[32 n + l], scale sc[8 n + l / 16 + 2 qq] */
        const int n = o / 128, qq = (o % 128) / 32, l = o % 32;
        const float s = __fmul_rn(qd_f16(b + 208), (float)(int8_t)__ldg(b + 192 + 8 * n + l / 16 + 2 * qq));
        uint32_t b0, b1, h0, h1;
        qd_bytes8<qd_align<DT>::A>(b + 64 * n + l + 32 * (qq & 1), b0, b1);
        qd_bytes8<qd_align<DT>::A>(b + 128 + 32 * n + l, h0, h1);
        const int shift = qq < 2 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t q = ((qd_byte(b0, b1, i) >> shift) & 0xF) |
                               ((qd_byte(h0, h1, i) >> (2 * qq)) & 3) << 4;
            v[i] = __fmul_rn(s, qd_float(q, 32.0f));
        }
    } else { /* Q2_K, Q3_K */
        /* half n, run j (32 values), half-run h (16): bits 2j of byte
         * 32 n + 16 h + l of qs, group 8 n + 2 j + h */
        const int n = o / 128, j = (o % 128) / 32, h = (o % 32) / 16, l = o % 16;
        const int grp = 8 * n + 2 * j + h;
        const uint8_t *qs = b + (DT == DT_Q2_K ? 16 : 32) + 32 * n + 16 * h + l;
        uint32_t b0, b1;
        qd_bytes8<qd_align<DT>::A>(qs, b0, b1);
        if constexpr (DT == DT_Q2_K) {
            const int sc = __ldg(b + grp);
            const float d = qd_f16(b + 80), dmin = qd_f16(b + 82);
            const float dl = __fmul_rn(d, (float)(sc & 0xF)), ml = __fmul_rn(dmin, (float)(sc >> 4));
#pragma unroll
            for (int i = 0; i < 8; i++)
                v[i] = __fsub_rn(__fmul_rn(dl, qd_float((qd_byte(b0, b1, i) >> (2 * j)) & 3, 0.0f)), ml);
        } else {
            /* scale grp: low nibble of byte grp (< 8) or high of grp - 8,
             * top two bits 2 (grp / 4) of byte 8 + grp % 4 (q3_k_scales) */
            const uint8_t *sb = b + 96;
            const int lo = grp < 8 ? __ldg(sb + grp) & 0xF : __ldg(sb + grp - 8) >> 4;
            const int hi = (__ldg(sb + 8 + grp % 4) >> (2 * (grp / 4))) & 3;
            const float dl = __fmul_rn(qd_f16(b + 108), (float)((lo | hi << 4) - 32));
            uint32_t m0, m1;
            qd_bytes8<qd_align<DT>::A>(b + 16 * h + l, m0, m1);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                /* the code less 4 unless its hmask bit is set */
                const uint32_t q = ((qd_byte(b0, b1, i) >> (2 * j)) & 3) |
                                   ((qd_byte(m0, m1, i) >> (4 * n + j)) & 1) << 2;
                v[i] = __fmul_rn(dl, qd_float(q, 4.0f));
            }
        }
    }
}

/* Values c..c+7 (c a multiple of 8) of a row at row of a low-bit dtype. */
template <int DT>
static __device__ __forceinline__ void cuk_dq8(const uint8_t *row, int c, float *v)
{
    constexpr int BE = DT >= DT_Q4_0 && DT <= DT_Q5_1 ? 32 : 256;
    cuk_dq8_block<DT>(row + (size_t)(c / BE) * qd_align<DT>::BB, c % BE, v);
}

/* cuk_dq8 with the dtype known at run time (zeros for any other). */
static __device__ __forceinline__ void cuk_dq8_any(int dt, const uint8_t *row, int c, float *v)
{
    switch (dt) {
    case DT_Q4_0: cuk_dq8<DT_Q4_0>(row, c, v); return;
    case DT_Q4_1: cuk_dq8<DT_Q4_1>(row, c, v); return;
    case DT_Q5_0: cuk_dq8<DT_Q5_0>(row, c, v); return;
    case DT_Q5_1: cuk_dq8<DT_Q5_1>(row, c, v); return;
    case DT_Q4_K: cuk_dq8<DT_Q4_K>(row, c, v); return;
    case DT_Q5_K: cuk_dq8<DT_Q5_K>(row, c, v); return;
    case DT_Q6_K: cuk_dq8<DT_Q6_K>(row, c, v); return;
    case DT_Q2_K: cuk_dq8<DT_Q2_K>(row, c, v); return;
    case DT_Q3_K: cuk_dq8<DT_Q3_K>(row, c, v); return;
    default:
        for (int i = 0; i < 8; i++)
            v[i] = 0.0f;
    }
}

/* Bytes of a row of cols values of a low-bit dtype. */
static __host__ __device__ __forceinline__ size_t cuk_q_row_bytes(int dt, int cols)
{
    return (size_t)(cols / cuk_q_block_elems(dt)) * (size_t)cuk_q_block_bytes(dt);
}

#endif
