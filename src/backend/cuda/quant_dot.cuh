/* quant_dot.cuh - GGUF's 2-6-bit block formats (quant_dq.cuh's nine) and
 * Q8_0 read as small integer codes for byte dot products (dp4a) against
 * activations rounded to 8 bits a 32-block, as the CPU's matmul and
 * llama.cpp's kernels multiply them. A widened value costs ~18
 * instructions (quant_dq.cuh); four codes times four activations cost one.
 *
 * A lane's unit is 16 values of a row: four 32-bit words of four byte
 * codes, and per group of 16 / G values a scale s and a min m, so that
 * value = s * code - m (codes signed, m = 0, where the format has no min).
 * s and m are the host's products (quant_dequantize_row's, llama.cpp's),
 * so s * code - m is the host's value to the bit. Three shapes, from where
 * the formats keep their bits:
 *   BYTES (Q8_0, as the device keeps it: int8 values in row order, an f16
 *     scale a 32 in a table of their own, cuda_weights.c): unit = values
 *     16u .. 16u + 15. One group, one activation block.
 *   NIB16 (Q4_0, Q4_1, Q5_0, Q5_1: 32-blocks, value i in the low nibble of
 *     byte i < 16, else the high nibble of byte i - 16): unit = bytes
 *     8p .. 8p + 7 of block b: values 8p .. 8p + 7 and 16 + 8p .. 23 + 8p.
 *     One group, one activation block.
 *   NIB32 (Q4_K, Q5_K: 64-value chunks j, group 2j in the low nibbles of
 *     32 bytes, 2j + 1 in the high): unit = bytes 8p .. 8p + 7 of chunk j:
 *     values 64j + 8p .. +7 (group 2j) and 64j + 32 + 8p .. +7 (2j + 1).
 *     Two groups, two activation blocks.
 *   QUARTER (Q2_K, Q3_K, Q6_K: 128-value halves n of four 32-value
 *     quarters k in bit fields of the same 32 bytes): unit = positions
 *     4g .. 4g + 3 of every quarter of half n. Four groups (the formats'
 *     16-value scales), four activation blocks.
 * Every shape takes 16 units a 256 values, so a warp's 32 lanes cover 512
 * columns (a step), unit u of a row being lane u % 32 of step u / 32; word
 * i of a unit is the run of four columns gd_perm maps to 4 lane + i. The
 * activations are staged in that order, so a lane reads its 16 as one
 * 16-byte word. */
#ifndef CLLM_BACKEND_CUDA_QUANT_DOT_CUH
#define CLLM_BACKEND_CUDA_QUANT_DOT_CUH

#include "backend/cuda/quant_dq.cuh"

#define GD_STEP 512 /* columns of a warp's step: 32 units of 16 */

enum { GD_BYTES, GD_NIB16, GD_NIB32, GD_QUARTER };

template <int DT> struct gd_fmt {
    static constexpr int SHAPE = DT == DT_Q8_0 ? GD_BYTES
                                 : DT == DT_Q4_0 || DT == DT_Q4_1 || DT == DT_Q5_0 || DT == DT_Q5_1
                                     ? GD_NIB16
                                 : DT == DT_Q4_K || DT == DT_Q5_K ? GD_NIB32
                                                                  : GD_QUARTER;
    static constexpr int G = SHAPE == GD_BYTES || SHAPE == GD_NIB16 ? 1 : SHAPE == GD_NIB32 ? 2 : 4;
    /* a min per group (unsigned codes) rather than signed codes */
    static constexpr bool MIN = DT == DT_Q4_1 || DT == DT_Q5_1 || DT == DT_Q4_K ||
                                DT == DT_Q5_K || DT == DT_Q2_K;
    static constexpr int UB = SHAPE == GD_BYTES || SHAPE == GD_NIB16 ? 2 : 16; /* units a block */
};

/* One lane's 16 values of a row. */
struct gd_unit {
    int q[4];
    float s[4], m[4]; /* groups 0 .. G-1: words i * G / 4 */
};

/* The word (0..127) of a step that the four columns r .. r+3 (r a
 * multiple of 4 below GD_STEP) go to. */
template <int SHAPE>
static __host__ __device__ __forceinline__ int gd_perm(int r)
{
    if (SHAPE == GD_BYTES) /* in order */
        return r / 4;
    if (SHAPE == GD_QUARTER) /* half r / 128, quarter k, positions 4g .. */
        return 4 * (8 * (r / 128) + (r % 32) / 4) + (r % 128) / 32;
    constexpr int S = SHAPE == GD_NIB16 ? 16 : 32; /* the low nibbles' span */
    const int lane = (r / (2 * S)) * (S / 8) + (r % S) / 8;
    return 4 * lane + 2 * ((r % (2 * S)) / S) + (r % 8) / 4;
}

/* The activation block (0..15 in the step) of lane's group g. */
template <int SHAPE>
static __host__ __device__ __forceinline__ int gd_block(int lane, int g)
{
    return SHAPE == GD_BYTES || SHAPE == GD_NIB16 ? lane / 2 : SHAPE == GD_NIB32 ? 2 * (lane / 4) + g : 4 * (lane / 8) + g;
}

/* The four bits b0..b3 of x as bit 0 of bytes 0..3: the shifted copies
 * x, x << 7, x << 14, x << 21 do not overlap, so the product has no carry. */
static __device__ __forceinline__ uint32_t gd_spread4(uint32_t x)
{
    return ((x & 0xF) * 0x00204081u) & 0x01010101u;
}

static __device__ __forceinline__ uint32_t gd_byte(uint32_t w, int i)
{
    return (w >> (8 * i)) & 0xFF;
}

/* f16 half h (0: bits 0-15) of a 32-bit word as f32. */
static __device__ __forceinline__ float gd_f16(uint32_t w, int h)
{
    return __half2float(__ushort_as_half((unsigned short)(w >> (16 * h))));
}

/* Unit u of a row at row of dtype DT (Q8_0: its values, and its scales
 * at srow; the other formats' blocks hold their scales). */
template <int DT>
static __device__ __forceinline__ void gd_load(const uint8_t *row, const uint16_t *srow, int u,
                                               gd_unit &w)
{
    using F = gd_fmt<DT>;
    /* the block of unit u (BYTES: no blocks), and the unit within it */
    constexpr int A = qd_align<DT>::A, BB = F::SHAPE == GD_BYTES ? 0 : qd_align<DT>::BB;
    const uint8_t *b = row + (size_t)(u / F::UB) * BB;
    const int v = u % F::UB;
    if constexpr (F::SHAPE == GD_BYTES) {
        (void)b, (void)v;
        const uint4 q = __ldg((const uint4 *)(row + 16 * (size_t)u));
        w.q[0] = (int)q.x, w.q[1] = (int)q.y, w.q[2] = (int)q.z, w.q[3] = (int)q.w;
        w.s[0] = __half2float(__ushort_as_half(__ldg(srow + u / 2)));
        w.m[0] = 0.0f;
    } else if constexpr (F::SHAPE == GD_NIB16) {
        constexpr bool affine = DT == DT_Q4_1 || DT == DT_Q5_1, five = DT == DT_Q5_0 || DT == DT_Q5_1;
        const int p = v;
        const float d = qd_f16(b), mn = affine ? qd_f16(b + 2) : 0.0f;
        const uint8_t *qs = b + (affine ? 4 : 2) + (five ? 4 : 0);
        uint32_t lo, hi;
        qd_bytes8<A>(qs + 8 * p, lo, hi);
        uint32_t q[4] = {lo & 0x0F0F0F0Fu, hi & 0x0F0F0F0Fu, (lo >> 4) & 0x0F0F0F0Fu,
                         (hi >> 4) & 0x0F0F0F0Fu};
        if (five) { /* value i's fifth bit: bit i of qh */
            const uint32_t qh = qd_u32(b + (affine ? 4 : 2));
#pragma unroll
            for (int i = 0; i < 4; i++)
                q[i] |= gd_spread4(qh >> (8 * p + 16 * (i / 2) + 4 * (i % 2))) << 4;
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
            w.q[i] = (int)(affine ? q[i] : __vsub4(q[i], five ? 0x10101010u : 0x08080808u));
        w.s[0] = d;
        w.m[0] = -mn; /* value = d q + min */
    } else if constexpr (F::SHAPE == GD_NIB32) {
        const int j = v / 4, p = v % 4;
        const uint32_t dd = __ldg((const uint32_t *)b);
        /* scales: 6-bit sc and m of groups 2j, 2j + 1 (model/quant_dq.h's
         * k_scale_min), two at a time as 16-bit pairs: pair k of the 12
         * bytes is half k % 2 of word k / 2 */
        const uint32_t *sw = (const uint32_t *)(b + 4);
        const uint32_t w0 = __ldg(sw), w1 = __ldg(sw + 1), w2 = __ldg(sw + 2);
        const int sh = 16 * (j & 1);
        const uint32_t pj = ((j < 2 ? w0 : w1) >> sh) & 0xFFFF, /* pair j */
            pj2 = ((j < 2 ? w1 : w2) >> sh) & 0xFFFF,           /* pair j + 2 */
            pjm = (w0 >> sh) & 0xFFFF;                          /* pair j - 2 (j >= 2) */
        const uint32_t sc = j < 2 ? pj & 0x3F3F : (pj2 & 0x0F0F) | ((pjm & 0xC0C0) >> 2);
        const uint32_t mn = j < 2 ? pj2 & 0x3F3F : ((pj2 >> 4) & 0x0F0F) | ((pj & 0xC0C0) >> 2);
        const float d = gd_f16(dd, 0), dmin = gd_f16(dd, 1);
#pragma unroll
        for (int g = 0; g < 2; g++) {
            w.s[g] = __fmul_rn(d, qd_float(gd_byte(sc, g), 0.0f));
            w.m[g] = __fmul_rn(dmin, qd_float(gd_byte(mn, g), 0.0f));
        }
        uint32_t lo, hi;
        qd_bytes8<A>(b + (DT == DT_Q5_K ? 48 : 16) + 32 * j + 8 * p, lo, hi);
        uint32_t q[4] = {lo & 0x0F0F0F0Fu, hi & 0x0F0F0F0Fu, (lo >> 4) & 0x0F0F0F0Fu,
                         (hi >> 4) & 0x0F0F0F0Fu};
        if (DT == DT_Q5_K) { /* fifth bits: bit 2j (2j + 1) of qh[l] */
            uint32_t h0, h1;
            qd_bytes8<A>(b + 16 + 8 * p, h0, h1);
#pragma unroll
            for (int i = 0; i < 4; i++)
                q[i] |= (((i % 2 ? h1 : h0) >> (2 * j + i / 2)) & 0x01010101u) << 4;
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
            w.q[i] = (int)q[i];
    } else { /* QUARTER: word k = quarter k, positions 4g .. 4g + 3 of half n */
        const int n = v / 8, g = v % 8;
        if constexpr (DT == DT_Q6_K) {
            /* low bits in ql[64n + 32 (k & 1) + l] (high nibble for k >= 2),
             * high bits 2k of qh[32n + l], scale sc[8n + l / 16 + 2k] */
            const uint32_t l0 = qd_u32(b + 64 * n + 4 * g), l1 = qd_u32(b + 64 * n + 32 + 4 * g),
                           qh = qd_u32(b + 128 + 32 * n + 4 * g);
            const float d = qd_f16(b + 208);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint32_t lq = ((k & 1 ? l1 : l0) >> (k < 2 ? 0 : 4)) & 0x0F0F0F0Fu;
                w.q[k] = (int)__vsub4(lq | ((qh >> (2 * k)) & 0x03030303u) << 4, 0x20202020u);
                const int sc = (int8_t)__ldg(b + 192 + 8 * n + g / 4 + 2 * k);
                w.s[k] = __fmul_rn(d, qd_float((uint32_t)(sc + 128), 128.0f));
            }
        } else if constexpr (DT == DT_Q2_K) {
            /* bits 2k of qs[32n + l]; group 8n + 2k + l / 16: its scale
             * byte's low nibble (sc), high nibble (m) */
            const uint32_t qs = __ldg((const uint32_t *)(b + 16 + 32 * n + 4 * g));
            const uint32_t s0 = __ldg((const uint32_t *)(b + 8 * n)),
                           s1 = __ldg((const uint32_t *)(b + 8 * n + 4)),
                           dd = __ldg((const uint32_t *)(b + 80));
            const float d = gd_f16(dd, 0), dmin = gd_f16(dd, 1);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                w.q[k] = (int)((qs >> (2 * k)) & 0x03030303u);
                const uint32_t sb = gd_byte(k < 2 ? s0 : s1, 2 * (k & 1) + g / 4);
                w.s[k] = __fmul_rn(d, qd_float(sb & 0xF, 0.0f));
                w.m[k] = __fmul_rn(dmin, qd_float(sb >> 4, 0.0f));
            }
        } else { /* Q3_K */
            /* bits 2k of qs[32n + l], less 4 unless bit 4n + k of
             * hmask[l] is set; the 16 6-bit scales (less 32) of group
             * 8n + 2k + l / 16, bytes 4h .. 4h + 3 of half n's eight
             * being low nibbles (n = 0) or high ones (n = 1) of bytes
             * 4h .. 4h + 3 and their top bits 2 (2n + h) of bytes 8 .. 11 */
            const uint32_t hm = qd_u32(b + 4 * g), qs = qd_u32(b + 32 + 32 * n + 4 * g);
            const uint32_t w0 = qd_u32(b + 96), w1 = qd_u32(b + 100), w2 = qd_u32(b + 104);
            const uint32_t sa = ((w0 >> (4 * n)) & 0x0F0F0F0Fu) | ((w2 >> (4 * n)) & 0x03030303u) << 4,
                           sb = ((w1 >> (4 * n)) & 0x0F0F0F0Fu) |
                                ((w2 >> (4 * n + 2)) & 0x03030303u) << 4;
            const float d = qd_f16(b + 108);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint32_t q = ((qs >> (2 * k)) & 0x03030303u) |
                                   ((hm >> (4 * n + k)) & 0x01010101u) << 2;
                w.q[k] = (int)__vsub4(q, 0x04040404u);
                const uint32_t sc = gd_byte(k < 2 ? sa : sb, 2 * (k & 1) + g / 4);
                w.s[k] = __fmul_rn(d, qd_float(sc, 32.0f));
            }
        }
    }
}

/* The small integer i (|i| < 2^22) as f32, exactly: full-rate logic and
 * an add, where a conversion runs at a quarter of the rate. */
static __device__ __forceinline__ float gd_i2f(int i)
{
    return __int_as_float(i + 0x4B400000) - 12582912.0f;
}

/* Four activations rounded to 8 bits at 1 / scale id (the CPU's
 * mm_codes_xq_quantize: nearest, ties to even), as one word of bytes.
 * v + 1.5 * 2^23 (|v| < 2^22) lands where the spacing of floats is 1, so
 * the add rounds v to an integer, ties to even, as rint does, and the
 * sum's low byte is that integer's: two full-rate adds where a conversion
 * runs at a quarter of the rate. */
static __device__ __forceinline__ uint32_t gd_round8(float v, float id)
{
    return __float_as_uint(__fadd_rn(__fmul_rn(v, id), 12582912.0f));
}
static __device__ __forceinline__ uint32_t gd_quant4(float a, float b, float c, float d, float id)
{
    const uint32_t lo = __byte_perm(gd_round8(a, id), gd_round8(b, id), 0x0040),
                   hi = __byte_perm(gd_round8(c, id), gd_round8(d, id), 0x0040);
    return __byte_perm(lo, hi, 0x5410);
}

/* The sums of each group's activation codes (formats with a min only):
 * shared by every row a warp's lane multiplies them with. */
template <int DT>
static __device__ __forceinline__ void gd_sums(const int (&x)[4], int (&sums)[4])
{
    constexpr int G = gd_fmt<DT>::G, PER = 4 / G;
#pragma unroll
    for (int g = 0; g < G; g++) {
        int s = 0;
#pragma unroll
        for (int i = 0; i < PER; i++)
            s = __dp4a(x[g * PER + i], 0x01010101, s);
        sums[g] = s;
    }
}

/* sum over the unit's 16 values of value * (dx[g] * code) for activation
 * codes x (gd_perm's order), their groups' block scales dx and code sums. */
template <int DT>
static __device__ __forceinline__ float gd_dot(const gd_unit &w, const int (&x)[4],
                                               const float (&dx)[4], const int (&sums)[4])
{
    constexpr int G = gd_fmt<DT>::G, PER = 4 / G;
    float a = 0.0f;
#pragma unroll
    for (int g = 0; g < G; g++) {
        int dot = 0;
#pragma unroll
        for (int i = 0; i < PER; i++)
            dot = __dp4a(w.q[g * PER + i], x[g * PER + i], dot);
        float t = w.s[g] * gd_i2f(dot);
        if (gd_fmt<DT>::MIN)
            t -= w.m[g] * gd_i2f(sums[g]);
        a = fmaf(dx[g], t, a);
    }
    return a;
}

#endif
