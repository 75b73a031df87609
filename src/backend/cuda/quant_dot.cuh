/* quant_dot.cuh - GGUF's 2-6-bit block formats (quant_dq.cuh's nine) and
 * Q8_0 read as small integer codes for byte dot products (dp4a) against
 * activations rounded to 8 bits a 32-block, as the CPU's matmul and
 * llama.cpp's kernels multiply them. A widened value costs ~18
 * instructions (quant_dq.cuh); four codes times four activations cost one.
 *
 * A lane's unit is 32 values of a row that share their groups: eight
 * 32-bit words of four byte codes, and per group of 32 / G values a scale
 * s and a min m, so that value = s * code - m (codes signed, m = 0, where
 * the format has no min). s and m are the host's products
 * (quant_dequantize_row's, llama.cpp's), so s * code - m is the host's
 * value to the bit. Four shapes, from where the formats keep their bits:
 *   BYTES (Q8_0, as the device keeps it: int8 values in row order, an f16
 *     scale a 32 in a table of their own, cuda_weights.c): unit u (lane l
 *     of step s) = values 1024s + 16l .. +15 (words 0-3) and 1024s + 512
 *     + 16l .. +15 (4-7), so that each of a warp's two 16-byte loads
 *     reads 512 bytes in a run (one 32-value run a lane read every sector
 *     in two halves, 5 % slower). Two groups: half blocks of two blocks.
 *   NIB16 (Q4_0, Q4_1, Q5_0, Q5_1: 32-blocks, value i in the low nibble of
 *     byte i < 16, else the high nibble of byte i - 16): unit = block u;
 *     words 0-3 the low nibbles, 4-7 the high ones: in order. One group.
 *   NIB32 (Q4_K, Q5_K: 64-value chunks j, group 2j in the low nibbles of
 *     32 bytes, 2j + 1 in the high): unit = bytes 16p .. 16p + 15 of chunk
 *     j: values 64j + 16p .. +15 (group 2j, words 0-3) and 64j + 32 + 16p
 *     .. +15 (2j + 1, words 4-7). Two groups.
 *   QUARTER (Q2_K, Q3_K, Q6_K: 128-value halves n of four 32-value
 *     quarters k in bit fields of the same 32 bytes): unit = positions 8g
 *     .. 8g + 7 of every quarter of half n, words 2k and 2k + 1 quarter
 *     k's. Four groups (the formats' 16-value scales).
 * Q6_K's and Q3_K's blocks (210 and 110 bytes) are only 2-aligned: their
 * 8-byte runs are read as three aligned words and funnel shifts, not four
 * 2-byte loads (gd_bytes8_fwd, gd_words_back; H100, 8B decode Q6_K 206 ->
 * 234 tok/s, Q3_K 226 -> 257, docs/benchmarks.md, session 52).
 * One scale decode and one address a 32 values: with 16-value units the
 * decode, not the dot products, was most of a step (docs/benchmarks.md,
 * session 50). Every shape takes 8 units a 256 values, so a warp's 32
 * lanes cover 1,024 columns (a step), unit u of a row being lane u % 32 of
 * step u / 32. The activations are staged in the units' order: word i of
 * lane l at gd_slot(l, i), two planes of 128 words, so a lane reads its
 * 32 codes as two 16-byte words and a warp's reads of a plane do not
 * share banks. */
#ifndef CLLM_BACKEND_CUDA_QUANT_DOT_CUH
#define CLLM_BACKEND_CUDA_QUANT_DOT_CUH

#include "backend/cuda/quant_dq.cuh"

#define GD_STEP 1024 /* columns of a warp's step: 32 units of 32 */

enum { GD_BYTES, GD_NIB16, GD_NIB32, GD_QUARTER };

template <int DT> struct gd_fmt {
    static constexpr int SHAPE = DT == DT_Q8_0 ? GD_BYTES
                                 : DT == DT_Q4_0 || DT == DT_Q4_1 || DT == DT_Q5_0 || DT == DT_Q5_1
                                     ? GD_NIB16
                                 : DT == DT_Q4_K || DT == DT_Q5_K ? GD_NIB32
                                                                  : GD_QUARTER;
    static constexpr int G = SHAPE == GD_NIB16 ? 1 : SHAPE == GD_QUARTER ? 4 : 2;
    static constexpr int PER = 8 / G; /* words a group */
    /* the activation blocks of groups g and g + 1 are GSTEP apart */
    static constexpr int GSTEP = SHAPE == GD_BYTES ? 16 : 1;
    /* a min per group (unsigned codes) rather than signed codes */
    static constexpr bool MIN = DT == DT_Q4_1 || DT == DT_Q5_1 || DT == DT_Q4_K ||
                                DT == DT_Q5_K || DT == DT_Q2_K;
    static constexpr int UB = SHAPE == GD_BYTES || SHAPE == GD_NIB16 ? 1 : 8; /* units a block */
};

/* One lane's 32 values of a row. */
struct gd_unit {
    int q[8];
    float s[4], m[4]; /* groups 0 .. G-1: words g * 8 / G .. */
};

/* Where word i (0..7) of lane's unit is staged within a step's 256 words. */
static __host__ __device__ __forceinline__ int gd_slot(int lane, int i)
{
    return 128 * (i / 4) + 4 * lane + i % 4;
}

/* The slot (gd_slot) the four columns r .. r+3 of a step (r a multiple of
 * 4 below GD_STEP) go to. */
template <int SHAPE>
static __host__ __device__ __forceinline__ int gd_perm(int r)
{
    int lane, word;
    if (SHAPE == GD_BYTES) { /* 16 values a lane in each half step */
        lane = r % 512 / 16;
        word = 4 * (r / 512) + r % 16 / 4;
    } else if (SHAPE == GD_NIB16) { /* a 32-block a lane, in order */
        lane = r / 32;
        word = r % 32 / 4;
    } else if (SHAPE == GD_NIB32) { /* super-block, chunk j, half p; nibble h */
        lane = 8 * (r / 256) + 2 * (r % 256 / 64) + r % 32 / 16;
        word = 4 * (r % 64 / 32) + r % 16 / 4;
    } else { /* super-block, half n, positions 8g ..; quarter k */
        lane = 8 * (r / 256) + 4 * (r % 256 / 128) + r % 32 / 8;
        word = 2 * (r % 128 / 32) + r % 8 / 4;
    }
    return gd_slot(lane, word);
}

/* The activation block (0..31 in the step) of lane's group g. */
template <int SHAPE>
static __host__ __device__ __forceinline__ int gd_block(int lane, int g)
{
    return SHAPE == GD_BYTES   ? lane / 2 + 16 * g
           : SHAPE == GD_NIB16 ? lane
           : SHAPE == GD_NIB32 ? 2 * (lane / 2) + g
                               : 4 * (lane / 4) + g;
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

/* Sixteen bytes at p, 16-aligned, as four words (Q8_0's repacked values
 * and Q4_K / Q5_K's blocks, 144 and 176 bytes: cuk_gemv_quant checks the
 * data's alignment). */
template <bool SH = false>
static __device__ __forceinline__ void gd_bytes16(const uint8_t *p, uint32_t (&b)[4])
{
    const uint4 v = qd_ld<SH>((const uint4 *)p);
    b[0] = v.x, b[1] = v.y, b[2] = v.z, b[3] = v.w;
}

/* Eight bytes at p, 2-aligned, from the three aligned words at p & ~3
 * and funnel shifts: three 4-byte loads where 2-byte ones take four
 * (Q6_K's 210-byte and Q3_K's 110-byte blocks are 2-aligned). Reads
 * [p & ~3, (p & ~3) + 12), up to 4 bytes past p + 8: callers keep that
 * inside the block. */
template <bool SH = false>
static __device__ __forceinline__ void gd_bytes8_fwd(const uint8_t *p, uint32_t &b0, uint32_t &b1)
{
    const uint32_t *w = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const unsigned sh = 8u * (unsigned)((uintptr_t)p & 3);
    const uint32_t w0 = qd_ld<SH>(w), w1 = qd_ld<SH>(w + 1), w2 = qd_ld<SH>(w + 2);
    b0 = __funnelshift_r(w0, w1, sh);
    b1 = __funnelshift_r(w1, w2, sh);
}

/* The n (2 or 3) words of the 4n bytes at p, 2-aligned, from the n + 1
 * aligned words at (p - 2) & ~3: reads [p - 4, p + 4n + 2) at most, for
 * bytes near a block's end (Q6_K's and Q3_K's scales, which 2 bytes of d
 * follow; gd_bytes8_fwd's reads could pass the end). */
template <int N, bool SH = false>
static __device__ __forceinline__ void gd_words_back(const uint8_t *p, uint32_t (&b)[N])
{
    const uintptr_t a = ((uintptr_t)p - 2) & ~(uintptr_t)3;
    const uint32_t *w = (const uint32_t *)a;
    const unsigned sh = 8u * (unsigned)((uintptr_t)p - a); /* 16 or 32 */
    uint32_t v[N + 1];
#pragma unroll
    for (int i = 0; i <= N; i++)
        v[i] = qd_ld<SH>(w + i);
#pragma unroll
    for (int i = 0; i < N; i++)
        b[i] = __funnelshift_rc(v[i], v[i + 1], sh);
}

/* Unit u of a row of cols values at row, of dtype DT (Q8_0: its values,
 * and its scales at srow; the other formats' blocks hold their scales).
 * Q8_0's halves past the row's end read its last 16 values (the staged
 * activations there are zeros); the other shapes' units lie in the row.
 * SH: row and srow are in shared memory (a staged copy of whole steps of
 * the row, u and cols counted from the copy's first column). */
template <int DT, bool SH = false>
static __device__ __forceinline__ void gd_load(const uint8_t *row, const uint16_t *srow, int u,
                                               int cols, gd_unit &w)
{
    using F = gd_fmt<DT>;
    (void)cols;
    /* the block of unit u (BYTES: no blocks), and the unit within it */
    constexpr int A = qd_align<DT>::A, BB = F::SHAPE == GD_BYTES ? 0 : qd_align<DT>::BB;
    const uint8_t *b = row + (size_t)(u / F::UB) * BB;
    const int v = u % F::UB;
    if constexpr (F::SHAPE == GD_BYTES) {
        (void)b, (void)v;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int c = min(1024 * (u / 32) + 512 * h + 16 * (u % 32), cols - 16);
            uint32_t q[4];
            gd_bytes16<SH>(row + c, q);
#pragma unroll
            for (int i = 0; i < 4; i++)
                w.q[4 * h + i] = (int)q[i];
            w.s[h] = __half2float(__ushort_as_half(qd_ld<SH>(srow + c / 32)));
            w.m[h] = 0.0f;
        }
    } else if constexpr (F::SHAPE == GD_NIB16) {
        constexpr bool affine = DT == DT_Q4_1 || DT == DT_Q5_1, five = DT == DT_Q5_0 || DT == DT_Q5_1;
        (void)v;
        const float d = qd_f16<SH>(b), mn = affine ? qd_f16<SH>(b + 2) : 0.0f;
        const uint8_t *qs = b + (affine ? 4 : 2) + (five ? 4 : 0);
        uint32_t l[4];
        qd_bytes8<A, SH>(qs, l[0], l[1]);
        qd_bytes8<A, SH>(qs + 8, l[2], l[3]);
        uint32_t q[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            q[i] = l[i] & 0x0F0F0F0Fu;
            q[4 + i] = (l[i] >> 4) & 0x0F0F0F0Fu;
        }
        if (five) { /* value i's fifth bit: bit i of qh */
            const uint32_t qh = qd_u32<SH>(b + (affine ? 4 : 2));
#pragma unroll
            for (int i = 0; i < 8; i++)
                q[i] |= gd_spread4(qh >> (4 * i)) << 4;
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
            w.q[i] = (int)(affine ? q[i] : __vsub4(q[i], five ? 0x10101010u : 0x08080808u));
        w.s[0] = d;
        w.m[0] = -mn; /* value = d q + min */
    } else if constexpr (F::SHAPE == GD_NIB32) {
        const int j = v / 2, p = v % 2;
        /* d, dmin, then the 12 scale bytes: one 16-byte load */
        uint32_t hd[4];
        gd_bytes16<SH>(b, hd);
        const uint32_t dd = hd[0], w0 = hd[1], w1 = hd[2], w2 = hd[3];
        /* scales: 6-bit sc and m of groups 2j, 2j + 1 (model/quant_dq.h's
         * k_scale_min), two at a time as 16-bit pairs: pair k of the 12
         * bytes is half k % 2 of word k / 2 */
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
        uint32_t l[4];
        gd_bytes16<SH>(b + (DT == DT_Q5_K ? 48 : 16) + 32 * j + 16 * p, l);
        uint32_t q[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            q[i] = l[i] & 0x0F0F0F0Fu;
            q[4 + i] = (l[i] >> 4) & 0x0F0F0F0Fu;
        }
        if (DT == DT_Q5_K) { /* fifth bits: bit 2j (2j + 1) of qh[l] */
            uint32_t h[4];
            gd_bytes16<SH>(b + 16 + 16 * p, h);
#pragma unroll
            for (int i = 0; i < 8; i++)
                q[i] |= ((h[i % 4] >> (2 * j + i / 4)) & 0x01010101u) << 4;
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
            w.q[i] = (int)q[i];
    } else { /* QUARTER: words 2k, 2k + 1 = quarter k, positions 8g .. 8g + 7 of half n */
        const int n = v / 4, g = v % 4;
        if constexpr (DT == DT_Q6_K) {
            /* low bits in ql[64n + 32 (k & 1) + l] (high nibble for k >= 2),
             * high bits 2k of qh[32n + l], scale sc[8n + l / 16 + 2k] */
            static_assert(A == 2, "Q6_K's 210-byte blocks are 2-aligned");
            uint32_t l0[2], l1[2], qh[2], sw[2];
            gd_bytes8_fwd<SH>(b + 64 * n + 8 * g, l0[0], l0[1]); /* bytes up to 196 read */
            gd_bytes8_fwd<SH>(b + 64 * n + 32 + 8 * g, l1[0], l1[1]);
            gd_bytes8_fwd<SH>(b + 128 + 32 * n + 8 * g, qh[0], qh[1]);
            gd_words_back<2, SH>(b + 192 + 8 * n, sw); /* half n's eight scales */
            const float d = qd_f16<SH>(b + 208);
#pragma unroll
            for (int k = 0; k < 4; k++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const uint32_t lq = ((k & 1 ? l1[e] : l0[e]) >> (k < 2 ? 0 : 4)) & 0x0F0F0F0Fu;
                    w.q[2 * k + e] =
                        (int)__vsub4(lq | ((qh[e] >> (2 * k)) & 0x03030303u) << 4, 0x20202020u);
                }
                const int sc = (int8_t)gd_byte(sw[k / 2], g / 2 + 2 * (k & 1));
                w.s[k] = __fmul_rn(d, qd_float((uint32_t)(sc + 128), 128.0f));
            }
        } else if constexpr (DT == DT_Q2_K) {
            /* bits 2k of qs[32n + l]; group 8n + 2k + l / 16: its scale
             * byte's low nibble (sc), high nibble (m) */
            uint32_t qs[2];
            qd_bytes8<A, SH>(b + 16 + 32 * n + 8 * g, qs[0], qs[1]);
            const uint32_t s0 = qd_ld<SH>((const uint32_t *)(b + 8 * n)),
                           s1 = qd_ld<SH>((const uint32_t *)(b + 8 * n + 4)),
                           dd = qd_ld<SH>((const uint32_t *)(b + 80));
            const float d = gd_f16(dd, 0), dmin = gd_f16(dd, 1);
#pragma unroll
            for (int k = 0; k < 4; k++) {
#pragma unroll
                for (int e = 0; e < 2; e++)
                    w.q[2 * k + e] = (int)((qs[e] >> (2 * k)) & 0x03030303u);
                const uint32_t sb = gd_byte(k < 2 ? s0 : s1, 2 * (k & 1) + g / 2);
                w.s[k] = __fmul_rn(d, qd_float(sb & 0xF, 0.0f));
                w.m[k] = __fmul_rn(dmin, qd_float(sb >> 4, 0.0f));
            }
        } else { /* Q3_K */
            /* bits 2k of qs[32n + l], less 4 unless bit 4n + k of
             * hmask[l] is set; the 16 6-bit scales (less 32) of group
             * 8n + 2k + l / 16, bytes 4h .. 4h + 3 of half n's eight
             * being low nibbles (n = 0) or high ones (n = 1) of bytes
             * 4h .. 4h + 3 and their top bits 2 (2n + h) of bytes 8 .. 11 */
            static_assert(A == 2, "Q3_K's 110-byte blocks are 2-aligned");
            uint32_t hm[2], qs[2], sw[3];
            gd_bytes8_fwd<SH>(b + 8 * g, hm[0], hm[1]); /* bytes up to 100 read */
            gd_bytes8_fwd<SH>(b + 32 + 32 * n + 8 * g, qs[0], qs[1]);
            gd_words_back<3, SH>(b + 96, sw); /* the 12 scale bytes */
            const uint32_t w0 = sw[0], w1 = sw[1], w2 = sw[2];
            const uint32_t sa = ((w0 >> (4 * n)) & 0x0F0F0F0Fu) | ((w2 >> (4 * n)) & 0x03030303u) << 4,
                           sb = ((w1 >> (4 * n)) & 0x0F0F0F0Fu) |
                                ((w2 >> (4 * n + 2)) & 0x03030303u) << 4;
            const float d = qd_f16<SH>(b + 108);
#pragma unroll
            for (int k = 0; k < 4; k++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const uint32_t q = ((qs[e] >> (2 * k)) & 0x03030303u) |
                                       ((hm[e] >> (4 * n + k)) & 0x01010101u) << 2;
                    w.q[2 * k + e] = (int)__vsub4(q, 0x04040404u);
                }
                const uint32_t sc = gd_byte(k < 2 ? sa : sb, 2 * (k & 1) + g / 2);
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
static __device__ __forceinline__ void gd_sums(const int (&x)[8], int (&sums)[4])
{
    constexpr int G = gd_fmt<DT>::G, PER = gd_fmt<DT>::PER;
#pragma unroll
    for (int g = 0; g < G; g++) {
        int s = 0;
#pragma unroll
        for (int i = 0; i < PER; i++)
            s = __dp4a(x[g * PER + i], 0x01010101, s);
        sums[g] = s;
    }
}

/* sum over the unit's 32 values of value * (dx[g] * code) for activation
 * codes x (gd_perm's order), their groups' block scales dx and code sums. */
template <int DT>
static __device__ __forceinline__ float gd_dot(const gd_unit &w, const int (&x)[8],
                                               const float (&dx)[4], const int (&sums)[4])
{
    constexpr int G = gd_fmt<DT>::G, PER = gd_fmt<DT>::PER;
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

/* A copy of whole steps of a row, as the staged quantized GEMV
 * (k_gemv_qstaged) keeps them in shared memory: chunk ch of steps
 * [ch * chunk_steps, +chunk_steps) is the row's bytes [off, off + bytes)
 * (Q8_0: its values; and its scales' bytes [soff, soff + sbytes) of the
 * row's table), holding the row's columns from ch * chunk_steps * GD_STEP,
 * cols of them (fewer in a row's last chunk). A lane's unit lu of the
 * chunk is gd_load<DT, true>'s unit gd_chunk_unit(lu) of the copy, with
 * the chunk's cols: the row's unit ch * chunk_steps * 32 + lu as the
 * unstaged kernel reads it, to the bit. */
struct gd_chunk {
    size_t off, soff;
    unsigned bytes, sbytes;
    int cols;
};

/* Bytes of one step of a row of dt (Q8_0 as the device keeps it: its
 * values; its scales are 2 bytes a 32 beside them). */
static __host__ __device__ __forceinline__ int gd_step_bytes(int dt)
{
    return dt == DT_Q8_0 ? GD_STEP : GD_STEP / cuk_q_block_elems(dt) * cuk_q_block_bytes(dt);
}

static __host__ __device__ __forceinline__ gd_chunk gd_chunk_of(int dt, size_t row_bytes,
                                                                int cols, int chunk_steps, int ch)
{
    const int sb = gd_step_bytes(dt), first = ch * chunk_steps;
    gd_chunk c;
    c.off = (size_t)first * sb;
    c.bytes = (unsigned)(row_bytes - c.off < (size_t)chunk_steps * sb ? row_bytes - c.off
                                                                      : (size_t)chunk_steps * sb);
    c.cols = cols - first * GD_STEP < chunk_steps * GD_STEP ? cols - first * GD_STEP
                                                             : chunk_steps * GD_STEP;
    c.soff = dt == DT_Q8_0 ? (size_t)first * (GD_STEP / 16) : 0;
    c.sbytes = dt == DT_Q8_0 ? (unsigned)(c.cols / 16) : 0;
    return c;
}

/* The unit of the copy that lane unit lu (0 .. 32 * chunk_steps - 1) of
 * a chunk of cols columns reads: past the row's last unit, that unit
 * again, as k_gemv_qdot's lanes do (Q8_0: gd_load clamps its halves). */
template <int DT>
static __host__ __device__ __forceinline__ int gd_chunk_unit(int lu, int cols)
{
    return gd_fmt<DT>::SHAPE == GD_BYTES || lu < cols / 32 ? lu : cols / 32 - 1;
}

#endif
