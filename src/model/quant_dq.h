/* quant_dq.h - the arithmetic of widening a row of any dtype to f32, GGUF's
 * block formats (llama.cpp's dequantize_row_*: the same operations in the same
 * order, so the same f32 bits), and their block layouts, byte for byte.
 * Included by model/quant.c, whose compiler vectorizes these loops and must
 * leave multiply-adds unfused (ISO C's default), or the bits would differ;
 * the CPU matmul's unpacking of these formats into integer codes
 * (backend/cpu/unpack.c, unpack_kern.h) takes the block layouts and the
 * scale bits from here. */
#ifndef CLLM_MODEL_QUANT_DQ_H
#define CLLM_MODEL_QUANT_DQ_H

#include <stdint.h>
#include <string.h>

#include "base/half.h"
#include "model/tensor.h"

#define Q_K_BLOCK 256

/* f16 scales to f32: exact either way; a build with F16C defines it as the
 * instruction, which the loops then keep in registers */
#ifndef QUANT_F16
#define QUANT_F16(h) f16_to_f32(h)
#endif

struct blk_q4_0 {
    uint16_t d;
    uint8_t qs[16];
};
struct blk_q4_1 {
    uint16_t d, m;
    uint8_t qs[16];
};
struct blk_q5_0 {
    uint16_t d;
    uint8_t qh[4]; /* bit j: the fifth bit of value j */
    uint8_t qs[16];
};
struct blk_q5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[16];
};
/* Eight groups of 32: group g's 6-bit scale and min packed in scales[12]
 * (k_scale_min) */
struct blk_q4_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[Q_K_BLOCK / 2]; /* 64 values a 32 bytes: low nibbles first 32, high next 32 */
};
struct blk_q5_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[Q_K_BLOCK / 8]; /* byte l, bit 2c / 2c+1: fifth bit of value l of group 2c / 2c+1 */
    uint8_t qs[Q_K_BLOCK / 2];
};
/* Sixteen groups of 16 with int8 scales; values 6-bit, stored + 32 */
struct blk_q6_k {
    uint8_t ql[Q_K_BLOCK / 2];
    uint8_t qh[Q_K_BLOCK / 4];
    int8_t scales[Q_K_BLOCK / 16];
    uint16_t d;
};
/* Sixteen groups of 16: each group's 4-bit scale (low nibble) and min
 * (high nibble) in a byte; value l of half n, run j (0..3) of 32 in bits
 * 2j of byte 32n + l % 32 (unpack.c's codes_q2_k) */
struct blk_q2_k {
    uint8_t scales[Q_K_BLOCK / 16];
    uint8_t qs[Q_K_BLOCK / 4];
    uint16_t d, dmin;
};
/* Sixteen groups of 16 with 6-bit scales stored + 32 (q3_k_scales); the
 * low two bits of each value as Q2_K's, the third in hmask (set: the code
 * as it is; clear: minus 4) */
struct blk_q3_k {
    uint8_t hmask[Q_K_BLOCK / 8];
    uint8_t qs[Q_K_BLOCK / 4];
    uint8_t scales[12];
    uint16_t d;
};
_Static_assert(sizeof(struct blk_q2_k) == 84 && sizeof(struct blk_q3_k) == 110,
               "GGUF K block sizes");
_Static_assert(sizeof(struct blk_q4_0) == 18 && sizeof(struct blk_q4_1) == 20 &&
                   sizeof(struct blk_q5_0) == 22 && sizeof(struct blk_q5_1) == 24 &&
                   sizeof(struct blk_q4_k) == 144 && sizeof(struct blk_q5_k) == 176 &&
                   sizeof(struct blk_q6_k) == 210,
               "GGUF block sizes");


/* A 32-block of Q4_0, Q4_1, Q5_0 or Q5_1 at p as its fields, the layouts
 * of the structs above: the f16 scale dh, the f16 min mh (Q4_1 and Q5_1;
 * else 0), the fifth bits qh (Q5_*; else 0); returns its 16 bytes of
 * nibbles. For code that takes the four formats in one loop. */
static inline const uint8_t *q32_fields(enum dtype dt, const uint8_t *p, uint16_t *dh,
                                        uint16_t *mh, uint32_t *qh)
{
    const int affine = dt == DT_Q4_1 || dt == DT_Q5_1, five = dt == DT_Q5_0 || dt == DT_Q5_1;
    memcpy(dh, p, 2);
    *mh = 0;
    if (affine)
        memcpy(mh, p + 2, 2);
    p += affine ? 4 : 2;
    *qh = 0;
    if (five) {
        memcpy(qh, p, 4);
        p += 4;
    }
    return p;
}

/* The min m of a 32-block of d (its f16 scale widened) as the code
 * layouts write value = d u - m: Q4_1 / Q5_1 store -m (mn, widened);
 * Q4_0 / Q5_0 centre their codes at 8 and 16. */
static inline float q32_min(enum dtype dt, float d, float mn)
{
    if (dt == DT_Q4_1 || dt == DT_Q5_1)
        return -mn;
    return (dt == DT_Q5_0 ? 16.0f : 8.0f) * d;
}

/* Group j's scale and min (6 bits each) from a K block's 12 scale bytes:
 * groups 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins),
 * groups 4-7 in bytes 8-11 (low nibble scale, high nibble min) plus the
 * top 2 bits of bytes 0-7. */
static inline void k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* All eight groups' k_scale_min at once: byte j of *sc and *mn is group
 * j's (word-wide bit operations, for the SIMD unpacking and kernels). */
static inline void k_scale_bytes(const uint8_t *q, uint64_t *sc, uint64_t *mn)
{
    uint32_t a, b, c;
    memcpy(&a, q, 4);
    memcpy(&b, q + 4, 4);
    memcpy(&c, q + 8, 4);
    const uint32_t lo6 = 0x3f3f3f3f, lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
    *sc = (uint64_t)(a & lo6) | (uint64_t)((c & lo4) | ((a >> 6) & lo2) << 4) << 32;
    *mn = (uint64_t)(b & lo6) | (uint64_t)(((c >> 4) & lo4) | ((b >> 6) & lo2) << 4) << 32;
}

static inline void dq_q4_0(const struct blk_q4_0 *restrict b, float *restrict y)
{
    const float d = QUANT_F16(b->d);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((b->qs[j] & 0x0F) - 8) * d;
        y[j + 16] = (float)((b->qs[j] >> 4) - 8) * d;
    }
}

static inline void dq_q4_1(const struct blk_q4_1 *restrict b, float *restrict y)
{
    const float d = QUANT_F16(b->d), m = QUANT_F16(b->m);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(b->qs[j] & 0x0F) * d + m;
        y[j + 16] = (float)(b->qs[j] >> 4) * d + m;
    }
}

static inline void dq_q5_0(const struct blk_q5_0 *restrict b, float *restrict y)
{
    const float d = QUANT_F16(b->d);
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    for (int j = 0; j < 16; j++) {
        const int h0 = (int)(((qh >> j) << 4) & 0x10), h1 = (int)((qh >> (j + 12)) & 0x10);
        y[j] = (float)(((b->qs[j] & 0x0F) | h0) - 16) * d;
        y[j + 16] = (float)(((b->qs[j] >> 4) | h1) - 16) * d;
    }
}

static inline void dq_q5_1(const struct blk_q5_1 *restrict b, float *restrict y)
{
    const float d = QUANT_F16(b->d), m = QUANT_F16(b->m);
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    for (int j = 0; j < 16; j++) {
        const int h0 = (int)(((qh >> j) << 4) & 0x10), h1 = (int)((qh >> (j + 12)) & 0x10);
        y[j] = (float)((b->qs[j] & 0x0F) | h0) * d + m;
        y[j + 16] = (float)((b->qs[j] >> 4) | h1) * d + m;
    }
}

/* The scales d * sc and mins dmin * mn of a K block's groups g and g + 1,
 * ggml's f32 products. */
static inline void k_pair_scales(const uint8_t *scales, int g, float d, float dmin, float *d1,
                                 float *m1, float *d2, float *m2)
{
    uint8_t sc, mn;
    k_scale_min(g, scales, &sc, &mn);
    *d1 = d * (float)sc;
    *m1 = dmin * (float)mn;
    k_scale_min(g + 1, scales, &sc, &mn);
    *d2 = d * (float)sc;
    *m2 = dmin * (float)mn;
}

static inline void dq_q4_k(const struct blk_q4_k *restrict b, float *restrict y)
{
    const float d = QUANT_F16(b->d), dmin = QUANT_F16(b->dmin);
    const uint8_t *q = b->qs;
    for (int g = 0; g < 8; g += 2, q += 32, y += 64) {
        float d1, m1, d2, m2;
        k_pair_scales(b->scales, g, d, dmin, &d1, &m1, &d2, &m2);
        for (int l = 0; l < 32; l++)
            y[l] = d1 * (float)(q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++)
            y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
    }
}

static inline void dq_q5_k(const struct blk_q5_k *restrict b, float *restrict y)
{
    const float d = QUANT_F16(b->d), dmin = QUANT_F16(b->dmin);
    const uint8_t *q = b->qs;
    uint8_t u1 = 1, u2 = 2;
    for (int g = 0; g < 8; g += 2, q += 32, y += 64, u1 <<= 2, u2 <<= 2) {
        float d1, m1, d2, m2;
        k_pair_scales(b->scales, g, d, dmin, &d1, &m1, &d2, &m2);
        for (int l = 0; l < 32; l++)
            y[l] = d1 * (float)((q[l] & 0xF) + (b->qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++)
            y[l + 32] = d2 * (float)((q[l] >> 4) + (b->qh[l] & u2 ? 16 : 0)) - m2;
    }
}

static inline void dq_q6_k(const struct blk_q6_k *restrict b, float *restrict y)
{
    const float d = QUANT_F16(b->d);
    const uint8_t *ql = b->ql, *qh = b->qh;
    const int8_t *sc = b->scales;
    /* (d sc) q, ggml's order; each 16 values of a quarter share a scale,
     * so the inner loop has none to pick and vectorizes */
    for (int n = 0; n < Q_K_BLOCK; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
        for (int h = 0; h < 2; h++) {
            const float s1 = d * (float)sc[h], s2 = d * (float)sc[h + 2];
            const float s3 = d * (float)sc[h + 4], s4 = d * (float)sc[h + 6];
            for (int l = 16 * h; l < 16 * h + 16; l++) {
                const int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = s1 * (float)q1;
                y[l + 32] = s2 * (float)q2;
                y[l + 64] = s3 * (float)q3;
                y[l + 96] = s4 * (float)q4;
            }
        }
}

/* Q3_K's sixteen 6-bit scales (still + 32) from its 12 bytes: scale j's
 * low nibble is the low one of byte j for j < 8, else the high one of
 * byte j - 8; its top two bits are bits 2 (j / 4) of byte 8 + j % 4 */
static inline void q3_k_scales(const uint8_t *q, int8_t *sc)
{
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? q[j] & 0xF : q[j - 8] >> 4;
        const int hi = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (int8_t)(lo | hi << 4);
    }
}

/* q3_k_scales' sixteen bytes four to a word (byte j of the 16 is sc[j]),
 * by word-wide bit operations, for the SIMD unpacking and kernels: low
 * nibbles from bytes 0-7, top bits from bytes 8-11 at 2 (j / 4). */
static inline void q3_k_scale_words(const uint8_t *q, uint32_t w[4])
{
    uint32_t a0, a1, c;
    memcpy(&a0, q, 4);
    memcpy(&a1, q + 4, 4);
    memcpy(&c, q + 8, 4);
    const uint32_t n4 = 0x0f0f0f0f, t2 = 0x03030303;
    w[0] = (a0 & n4) | (c & t2) << 4;
    w[1] = (a1 & n4) | ((c >> 2) & t2) << 4;
    w[2] = ((a0 >> 4) & n4) | ((c >> 4) & t2) << 4;
    w[3] = ((a1 >> 4) & n4) | ((c >> 6) & t2) << 4;
}

/* d (sc & 15) code - dmin (sc >> 4), ggml's order; run j of half n takes
 * bits 2j of bytes 32n + l, groups 8n + 2j (l < 16) and 8n + 2j + 1 */
static inline void dq_q2_k(const struct blk_q2_k *restrict b, float *restrict y)
{
    const float d = QUANT_F16(b->d), dmin = QUANT_F16(b->dmin);
    for (int n = 0; n < 2; n++)
        for (int j = 0; j < 4; j++)
            for (int h = 0; h < 2; h++, y += 16) {
                const uint8_t sc = b->scales[8 * n + 2 * j + h];
                const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
                const uint8_t *q = b->qs + 32 * n + 16 * h;
                for (int l = 0; l < 16; l++)
                    y[l] = dl * (float)((q[l] >> (2 * j)) & 3) - ml;
            }
}

/* d (sc - 32) (code - (hmask bit ? 0 : 4)); the hmask bit of run j of
 * half n is bit 4n + j of byte l */
static inline void dq_q3_k(const struct blk_q3_k *restrict b, float *restrict y)
{
    const float d = QUANT_F16(b->d);
    int8_t sc[16];
    q3_k_scales(b->scales, sc);
    for (int n = 0; n < 2; n++)
        for (int j = 0; j < 4; j++)
            for (int h = 0; h < 2; h++, y += 16) {
                const float dl = d * (float)(sc[8 * n + 2 * j + h] - 32);
                const uint8_t *q = b->qs + 32 * n + 16 * h, *hm = b->hmask + 16 * h;
                for (int l = 0; l < 16; l++)
                    y[l] = dl * (float)((int)((q[l] >> (2 * j)) & 3) -
                                        (hm[l] >> (4 * n + j) & 1 ? 0 : 4));
            }
}

/* One switch a row, the blocks' loop inside each case: the per-block
 * functions inline into loops the compiler can vectorize. */
#define QUANT_DQ_BLOCKS(fn, blk)                                                \
    for (int64_t i = 0; i < n / be; i++)                                        \
        fn((const struct blk *)(p + (size_t)i * bb), y + i * be)

/* ggml's Q8_0: d * code */
static inline void dq_q8_0(const struct block_q8_0 *restrict b, float *restrict y)
{
    const float d = QUANT_F16(b->d);
    for (int i = 0; i < Q8_0_BLOCK; i++)
        y[i] = d * (float)b->qs[i];
}

/* Any dtype's row: the exact values of f32, f16 and bf16 too. */
static inline void quant_dq_row(enum dtype dt, const void *src, float *y, int64_t n)
{
    const uint8_t *p = src;
    const int64_t be = dtype_block_elems(dt);
    const size_t bb = dtype_row_bytes(dt, be);
    switch (dt) {
    case DT_F32: memcpy(y, src, sizeof(float) * (size_t)n); break;
    case DT_F16:
        for (int64_t i = 0; i < n; i++)
            y[i] = QUANT_F16(((const uint16_t *)src)[i]);
        break;
    case DT_BF16:
        for (int64_t i = 0; i < n; i++)
            y[i] = bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case DT_Q8_0: QUANT_DQ_BLOCKS(dq_q8_0, block_q8_0); break;
    case DT_Q4_0: QUANT_DQ_BLOCKS(dq_q4_0, blk_q4_0); break;
    case DT_Q4_1: QUANT_DQ_BLOCKS(dq_q4_1, blk_q4_1); break;
    case DT_Q5_0: QUANT_DQ_BLOCKS(dq_q5_0, blk_q5_0); break;
    case DT_Q5_1: QUANT_DQ_BLOCKS(dq_q5_1, blk_q5_1); break;
    case DT_Q4_K: QUANT_DQ_BLOCKS(dq_q4_k, blk_q4_k); break;
    case DT_Q5_K: QUANT_DQ_BLOCKS(dq_q5_k, blk_q5_k); break;
    case DT_Q6_K: QUANT_DQ_BLOCKS(dq_q6_k, blk_q6_k); break;
    case DT_Q2_K: QUANT_DQ_BLOCKS(dq_q2_k, blk_q2_k); break;
    case DT_Q3_K: QUANT_DQ_BLOCKS(dq_q3_k, blk_q3_k); break;
    default: memset(y, 0, sizeof(float) * (size_t)n); break;
    }
}
#undef QUANT_DQ_BLOCKS

#endif
