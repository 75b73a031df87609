/* quant.c - GGUF's block formats besides Q8_0: widened to f32 (the
 * arithmetic of quant_dq.h, built for the baseline instruction set) and
 * quantized plainly for test models. */
#include "model/quant.h"

#include <math.h>
#include <string.h>

#include "base/half.h"
#include "model/quant_dq.h"

bool quant_is_low_bit(enum dtype dt)
{
    return dt >= DT_Q4_0 && dt <= DT_Q3_K;
}

void quant_dequantize_row(enum dtype dt, const void *src, float *y, int64_t n)
{
    quant_dq_row(dt, src, y, n);
}

static void k_put_scale_min(int j, uint8_t *q, uint8_t sc, uint8_t mn)
{
    if (j < 4) {
        q[j] = (uint8_t)((q[j] & 0xC0) | sc);
        q[j + 4] = (uint8_t)((q[j + 4] & 0xC0) | mn);
    } else {
        q[j + 4] = (uint8_t)((sc & 0xF) | ((mn & 0xF) << 4));
        q[j - 4] = (uint8_t)((q[j - 4] & 0x3F) | ((sc >> 4) << 6));
        q[j] = (uint8_t)((q[j] & 0x3F) | ((mn >> 4) << 6));
    }
}

/* ---- quantizing (test models) ---- */

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The value of x[0..n) with the largest magnitude, sign kept. */
static float signed_absmax(const float *x, int n)
{
    float v = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(v))
            v = x[i];
    return v;
}

/* A 32-block's codes into its bytes: code j's low nibble in byte j, code
 * j + 16's in its high nibble, and (qhb, Q5_*) the fifth bits as bit j of
 * a 32-bit word. */
static void pack32(const int *q, uint8_t *qs, uint8_t *qhb)
{
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
        qh |= (uint32_t)((q[j] >> 4) & 1) << j | (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    if (qhb)
        memcpy(qhb, &qh, 4);
}

/* Symmetric 32-blocks (Q4_0, Q5_0): value = (q - half) * d. */
static void q_sym32(const float *x, uint16_t *dh, uint8_t *qs, uint8_t *qhb, int half)
{
    const float d = signed_absmax(x, 32) / (float)-half;
    *dh = f32_to_f16(d);
    const float df = f16_to_f32(*dh), id = df != 0.0f ? 1.0f / df : 0.0f;
    int q[32];
    for (int j = 0; j < 32; j++)
        q[j] = clampi((int)lrintf(x[j] * id) + half, 0, 2 * half - 1);
    pack32(q, qs, qhb);
}

/* Affine 32-blocks (Q4_1, Q5_1): value = q * d + m. */
static void q_aff32(const float *x, uint16_t *dh, uint16_t *mh, uint8_t *qs, uint8_t *qhb,
                    int levels)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    *dh = f32_to_f16((hi - lo) / (float)(levels - 1));
    *mh = f32_to_f16(lo);
    const float df = f16_to_f32(*dh), mf = f16_to_f32(*mh), id = df != 0.0f ? 1.0f / df : 0.0f;
    int q[32];
    for (int j = 0; j < 32; j++)
        q[j] = clampi((int)lrintf((x[j] - mf) * id), 0, levels - 1);
    pack32(q, qs, qhb);
}

/* The range of x[0..n) widened to hold 0, so a min below it is >= 0 */
static void range0(const float *x, int n, float *lo, float *hi)
{
    *lo = 0.0f;
    *hi = 0.0f;
    for (int l = 0; l < n; l++) {
        *lo = fminf(*lo, x[l]);
        *hi = fmaxf(*hi, x[l]);
    }
}

/* A K block's eight 32-groups (Q4_K, Q5_K): value = d sc q - dmin mn, q in
 * [0, levels). The group scales and mins go to 6 bits of d and dmin. */
static void q_kgroups(const float *x, uint16_t *dh, uint16_t *dminh, uint8_t *scales, int *q,
                      int levels)
{
    float scale[8], mins[8], smax = 0.0f, mmax = 0.0f;
    for (int g = 0; g < 8; g++) {
        float lo, hi;
        range0(x + 32 * g, 32, &lo, &hi);
        scale[g] = (hi - lo) / (float)(levels - 1);
        mins[g] = -lo;
        smax = fmaxf(smax, scale[g]);
        mmax = fmaxf(mmax, mins[g]);
    }
    *dh = f32_to_f16(smax / 63.0f);
    *dminh = f32_to_f16(mmax / 63.0f);
    const float d = f16_to_f32(*dh), dmin = f16_to_f32(*dminh);
    memset(scales, 0, 12);
    for (int g = 0; g < 8; g++) {
        const uint8_t sc = (uint8_t)clampi(d > 0 ? (int)lrintf(scale[g] / d) : 0, 0, 63);
        const uint8_t mn = (uint8_t)clampi(dmin > 0 ? (int)lrintf(mins[g] / dmin) : 0, 0, 63);
        k_put_scale_min(g, scales, sc, mn);
        const float dd = d * (float)sc, dm = dmin * (float)mn;
        for (int l = 0; l < 32; l++)
            q[32 * g + l] =
                dd > 0 ? clampi((int)lrintf((x[32 * g + l] + dm) / dd), 0, levels - 1) : 0;
    }
}

/* The signed scales of a K block's sixteen 16-groups (Q3_K, Q6_K), each
 * taking its largest magnitude to code -half, and the block's f16 scale
 * d (dh) over them with top steps; returns d as read back */
static float sym16_scales(const float *x, float half, float top, float *scale, uint16_t *dh)
{
    float smax = 0.0f;
    for (int g = 0; g < 16; g++) {
        scale[g] = signed_absmax(x + 16 * g, 16) / -half;
        smax = fmaxf(smax, fabsf(scale[g]));
    }
    *dh = f32_to_f16(smax / top);
    return f16_to_f32(*dh);
}

/* Q2_K: sixteen 16-groups, value = d sc q - dmin mn, q in 0..3, sc and mn
 * 4 bits of d and dmin; value e's code in bits 2 (e % 128 / 32) of byte
 * 32 (e / 128) + e % 32 */
static void q_q2_k(const float *x, struct blk_q2_k *b)
{
    float scale[16], mins[16], smax = 0.0f, mmax = 0.0f;
    for (int g = 0; g < 16; g++) {
        float lo, hi;
        range0(x + 16 * g, 16, &lo, &hi);
        scale[g] = (hi - lo) / 3.0f;
        mins[g] = -lo;
        smax = fmaxf(smax, scale[g]);
        mmax = fmaxf(mmax, mins[g]);
    }
    b->d = f32_to_f16(smax / 15.0f);
    b->dmin = f32_to_f16(mmax / 15.0f);
    const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
    memset(b->qs, 0, sizeof b->qs);
    for (int g = 0; g < 16; g++) {
        const int sc = clampi(d > 0 ? (int)lrintf(scale[g] / d) : 0, 0, 15);
        const int mn = clampi(dmin > 0 ? (int)lrintf(mins[g] / dmin) : 0, 0, 15);
        b->scales[g] = (uint8_t)(sc | mn << 4);
        const float dd = d * (float)sc, dm = dmin * (float)mn;
        for (int l = 0; l < 16; l++) {
            const int e = 16 * g + l;
            const int q = dd > 0 ? clampi((int)lrintf((x[e] + dm) / dd), 0, 3) : 0;
            b->qs[32 * (e / 128) + e % 32] |= (uint8_t)(q << (2 * (e % 128 / 32)));
        }
    }
}

/* Q3_K: sixteen 16-groups, value = d (sc - 32) (u - 4), u in 0..7 (its
 * low two bits placed as Q2_K's, the third in bit 4 (e / 128) + e % 128 /
 * 32 of hmask byte e % 32), sc 6 bits packed as q3_k_scales reads them */
static void q_q3_k(const float *x, struct blk_q3_k *b)
{
    float scale[16];
    const float d = sym16_scales(x, 4.0f, 31.0f, scale, &b->d);
    memset(b->qs, 0, sizeof b->qs);
    memset(b->hmask, 0, sizeof b->hmask);
    memset(b->scales, 0, sizeof b->scales);
    for (int g = 0; g < 16; g++) {
        const int sc = clampi(d > 0 ? (int)lrintf(scale[g] / d) : 0, -32, 31);
        const int s6 = sc + 32;
        b->scales[g % 8] |= (uint8_t)((s6 & 0xF) << (g < 8 ? 0 : 4));
        b->scales[8 + g % 4] |= (uint8_t)((s6 >> 4) << (2 * (g / 4)));
        const float dd = d * (float)sc;
        for (int l = 0; l < 16; l++) {
            const int e = 16 * g + l, run = e % 128 / 32;
            const int u = (dd != 0.0f ? clampi((int)lrintf(x[e] / dd), -4, 3) : 0) + 4;
            b->qs[32 * (e / 128) + e % 32] |= (uint8_t)((u & 3) << (2 * run));
            if (u & 4)
                b->hmask[e % 32] |= (uint8_t)(1 << (4 * (e / 128) + run));
        }
    }
}

static void q_q4_k(const float *x, struct blk_q4_k *b)
{
    int q[Q_K_BLOCK];
    q_kgroups(x, &b->d, &b->dmin, b->scales, q, 16);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            b->qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
}

static void q_q5_k(const float *x, struct blk_q5_k *b)
{
    int q[Q_K_BLOCK];
    q_kgroups(x, &b->d, &b->dmin, b->scales, q, 32);
    memset(b->qh, 0, sizeof b->qh);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const int a = q[64 * c + l], h = q[64 * c + 32 + l];
            b->qs[32 * c + l] = (uint8_t)((a & 0xF) | ((h & 0xF) << 4));
            b->qh[l] |= (uint8_t)(((a >> 4) << (2 * c)) | ((h >> 4) << (2 * c + 1)));
        }
}

static void q_q6_k(const float *x, struct blk_q6_k *b)
{
    float scale[16];
    const float d = sym16_scales(x, 32.0f, 127.0f, scale, &b->d);
    int q[Q_K_BLOCK];
    for (int g = 0; g < 16; g++) {
        b->scales[g] = (int8_t)clampi(d > 0 ? (int)lrintf(scale[g] / d) : 0, -128, 127);
        const float dd = d * (float)b->scales[g];
        for (int l = 0; l < 16; l++)
            q[16 * g + l] =
                (dd != 0.0f ? clampi((int)lrintf(x[16 * g + l] / dd), -32, 31) : 0) + 32;
    }
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            const int *h = q + 128 * n + l;
            b->ql[64 * n + l] = (uint8_t)((h[0] & 0xF) | ((h[64] & 0xF) << 4));
            b->ql[64 * n + l + 32] = (uint8_t)((h[32] & 0xF) | ((h[96] & 0xF) << 4));
            b->qh[32 * n + l] = (uint8_t)((h[0] >> 4) | ((h[32] >> 4) << 2) |
                                          ((h[64] >> 4) << 4) | ((h[96] >> 4) << 6));
        }
}

void quant_quantize_row(enum dtype dt, const float *x, void *dst, int64_t n)
{
    uint8_t *p = dst;
    const int64_t be = dtype_block_elems(dt);
    const size_t bb = dtype_row_bytes(dt, be);
    for (int64_t i = 0; i < n / be; i++, p += bb, x += be)
        switch (dt) {
        case DT_Q4_0: {
            struct blk_q4_0 *b = (struct blk_q4_0 *)p;
            q_sym32(x, &b->d, b->qs, NULL, 8);
            break;
        }
        case DT_Q5_0: {
            struct blk_q5_0 *b = (struct blk_q5_0 *)p;
            q_sym32(x, &b->d, b->qs, b->qh, 16);
            break;
        }
        case DT_Q4_1: {
            struct blk_q4_1 *b = (struct blk_q4_1 *)p;
            q_aff32(x, &b->d, &b->m, b->qs, NULL, 16);
            break;
        }
        case DT_Q5_1: {
            struct blk_q5_1 *b = (struct blk_q5_1 *)p;
            q_aff32(x, &b->d, &b->m, b->qs, b->qh, 32);
            break;
        }
        case DT_Q4_K: q_q4_k(x, (struct blk_q4_k *)p); break;
        case DT_Q5_K: q_q5_k(x, (struct blk_q5_k *)p); break;
        case DT_Q6_K: q_q6_k(x, (struct blk_q6_k *)p); break;
        case DT_Q2_K: q_q2_k(x, (struct blk_q2_k *)p); break;
        case DT_Q3_K: q_q3_k(x, (struct blk_q3_k *)p); break;
        default: memset(p, 0, bb); break;
        }
}
