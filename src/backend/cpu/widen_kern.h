/* widen_kern.h - the widening of GGUF's 4-6-bit formats with intrinsics,
 * written once and built per instruction set (widen_v3.c: AVX2,
 * widen_v4.c: AVX-512): the codes are unpacked with 128- and 256-bit
 * integer operations both sets have, and the including file supplies
 *   q16(o, codes, s, m, is_signed): 16 byte codes as f32 into o[0..16),
 *       s * code - m (a W_VEC of s and of m);
 *   W_SET1(x): a W_VEC of x;
 *   W_BITS16(b): byte j 16 where bit j of the 16 bits b is set, else 0;
 *   W_WIDEN: the name of the exported function.
 * Each value is the same operations on the same operands as quant_dq.h's
 * (a group's scale d * sc in f32, then scale * code, then minus the
 * group's min; no fused multiply-add), so every build gives its bits. */
#include <stdbool.h>

#define QUANT_F16(h) _cvtsh_ss(h)
#include "model/quant_dq.h"

/* The 32-blocks: value j in the low nibble of byte j, j + 16 in its high
 * one, a fifth bit (Q5_*) from bit j of a 32-bit word; Q4_0 / Q5_0 are
 * (code - half) d, Q4_1 / Q5_1 code d + m (as d code - (-m): the same
 * sum). */
static void q32_rows(enum dtype dt, const uint8_t *p, float *y, int64_t nb)
{
    const __m128i lo4 = _mm_set1_epi8(0x0F);
    const bool five = dt == DT_Q5_0 || dt == DT_Q5_1, affine = dt == DT_Q4_1 || dt == DT_Q5_1;
    const __m128i half = _mm_set1_epi8(affine ? 0 : five ? 16 : 8);
    const size_t bb = dtype_row_bytes(dt, 32);
    for (int64_t i = 0; i < nb; i++, p += bb, y += 32) {
        uint16_t dh, mh = 0;
        memcpy(&dh, p, 2);
        if (affine)
            memcpy(&mh, p + 2, 2);
        const uint8_t *q = p + (affine ? 4 : 2);
        uint32_t qh = 0;
        if (five) {
            memcpy(&qh, q, 4);
            q += 4;
        }
        const __m128i v = _mm_loadu_si128((const __m128i *)q);
        __m128i a = _mm_and_si128(v, lo4), b = _mm_and_si128(_mm_srli_epi16(v, 4), lo4);
        if (five) {
            a = _mm_or_si128(a, W_BITS16(qh & 0xFFFF));
            b = _mm_or_si128(b, W_BITS16(qh >> 16));
        }
        const W_VEC d = W_SET1(_cvtsh_ss(dh)), m = W_SET1(affine ? -_cvtsh_ss(mh) : 0.0f);
        q16(y, _mm_sub_epi8(a, half), d, m, !affine);
        q16(y + 16, _mm_sub_epi8(b, half), d, m, !affine);
    }
}

/* 64 values of a K block's groups 2c and 2c + 1: the low nibbles' (lo,
 * 32 codes) and the high nibbles' (hi) codes, each scaled and shifted by
 * their group's */
static inline void k_pair_store(float *o, const uint8_t *scales, int c, float d, float dmin,
                                __m256i lo, __m256i hi)
{
    float d1, m1, d2, m2;
    k_pair_scales(scales, 2 * c, d, dmin, &d1, &m1, &d2, &m2);
    const W_VEC vd1 = W_SET1(d1), vm1 = W_SET1(m1), vd2 = W_SET1(d2), vm2 = W_SET1(m2);
    q16(o, _mm256_castsi256_si128(lo), vd1, vm1, 0);
    q16(o + 16, _mm256_extracti128_si256(lo, 1), vd1, vm1, 0);
    q16(o + 32, _mm256_castsi256_si128(hi), vd2, vm2, 0);
    q16(o + 48, _mm256_extracti128_si256(hi, 1), vd2, vm2, 0);
}

static void q4_k_rows(const struct blk_q4_k *b, float *y, int64_t nb)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; i++, b++, y += Q_K_BLOCK) {
        const float d = _cvtsh_ss(b->d), dmin = _cvtsh_ss(b->dmin);
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
            const __m256i lo = _mm256_and_si256(q, lo4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4);
            k_pair_store(y + 64 * c, b->scales, c, d, dmin, lo, hi);
        }
    }
}

static void q5_k_rows(const struct blk_q5_k *b, float *y, int64_t nb)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < nb; i++, b++, y += Q_K_BLOCK) {
        const float d = _cvtsh_ss(b->d), dmin = _cvtsh_ss(b->dmin);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
            /* fifth bits: bit 2c of qh[l] for the low group, 2c + 1 for the high */
            const __m128i s1 = _mm_cvtsi32_si128(2 * c), s2 = _mm_cvtsi32_si128(2 * c + 1);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s1), one), 4);
            const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s2), one), 4);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, lo4), h1);
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), lo4), h2);
            k_pair_store(y + 64 * c, b->scales, c, d, dmin, lo, hi);
        }
    }
}

/* (d sc) (code - 32): quant_dq.h's order; the minus is of zero */
static void q6_k_rows(const struct blk_q6_k *b, float *y, int64_t nb)
{
    const __m128i lo4 = _mm_set1_epi8(0x0F), three = _mm_set1_epi8(3), k32 = _mm_set1_epi8(32);
    const W_VEC zero = W_SET1(0.0f);
    for (int64_t i = 0; i < nb; i++, b++) {
        const float d = _cvtsh_ss(b->d);
        for (int n = 0; n < 2; n++, y += 128) {
            const uint8_t *ql = b->ql + 64 * n, *qh = b->qh + 32 * n;
            const int8_t *sc = b->scales + 8 * n;
            for (int h = 0; h < 2; h++) {
                const __m128i a = _mm_loadu_si128((const __m128i *)(ql + 16 * h));
                const __m128i c = _mm_loadu_si128((const __m128i *)(ql + 32 + 16 * h));
                const __m128i e = _mm_loadu_si128((const __m128i *)(qh + 16 * h));
                /* byte shifts through 16-bit lanes, masked after */
                const __m128i h0 = _mm_slli_epi16(_mm_and_si128(e, three), 4);
                const __m128i h1 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(e, 2), three), 4);
                const __m128i h2 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(e, 4), three), 4);
                const __m128i h3 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(e, 6), three), 4);
                const __m128i q1 = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(a, lo4), h0), k32);
                const __m128i q2 = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(c, lo4), h1), k32);
                const __m128i q3 =
                    _mm_sub_epi8(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), lo4), h2), k32);
                const __m128i q4 =
                    _mm_sub_epi8(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(c, 4), lo4), h3), k32);
                float *o = y + 16 * h;
                q16(o, q1, W_SET1(d * (float)sc[h]), zero, 1);
                q16(o + 32, q2, W_SET1(d * (float)sc[h + 2]), zero, 1);
                q16(o + 64, q3, W_SET1(d * (float)sc[h + 4]), zero, 1);
                q16(o + 96, q4, W_SET1(d * (float)sc[h + 6]), zero, 1);
            }
        }
    }
}

void W_WIDEN(enum dtype dt, const void *src, float *y, int64_t n);
void W_WIDEN(enum dtype dt, const void *src, float *y, int64_t n)
{
    switch (dt) {
    case DT_Q4_0:
    case DT_Q4_1:
    case DT_Q5_0:
    case DT_Q5_1: q32_rows(dt, src, y, n / 32); break;
    case DT_Q4_K: q4_k_rows(src, y, n / Q_K_BLOCK); break;
    case DT_Q5_K: q5_k_rows(src, y, n / Q_K_BLOCK); break;
    case DT_Q6_K: q6_k_rows(src, y, n / Q_K_BLOCK); break;
    default: quant_dq_row(dt, src, y, n); break;
    }
}
