/* widen_v4.c - GGUF's 4-6-bit formats widened to f32 on AVX-512 (CMake
 * compiles this file for it on x86-64; cpu_widen_for calls it only where
 * the CPU has it), with intrinsics: the compiler's vectorization of
 * quant_dq.h's loops left them at about half a cycle a value, the bound
 * of their decode (docs/benchmarks.md). Each value is the same operations
 * on the same operands as quant_dq.h's (a group's scale d * sc in f32,
 * then scale * code, then minus the group's min: no fused multiply-add),
 * so the same bits. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdbool.h>
#define QUANT_F16(h) _cvtsh_ss(h)
#include "model/quant_dq.h"

void cpu_widen_avx512(enum dtype dt, const void *src, float *y, int64_t n);

/* 16 codes (bytes) as f32, times s, minus m */
static inline __m512 q16(__m128i codes, __m512 s, __m512 m, int is_signed)
{
    __m512i i = is_signed ? _mm512_cvtepi8_epi32(codes) : _mm512_cvtepu8_epi32(codes);
    return _mm512_sub_ps(_mm512_mul_ps(s, _mm512_cvtepi32_ps(i)), m);
}

/* 64 values of a K block's groups 2c and 2c + 1: the low nibbles' (lo,
 * 32 codes) and the high nibbles' (hi) codes, each scaled and shifted by
 * their group's */
static inline void k_pair_store(float *o, const uint8_t *scales, int c, float d, float dmin,
                                __m256i lo, __m256i hi)
{
    float d1, m1, d2, m2;
    k_pair_scales(scales, 2 * c, d, dmin, &d1, &m1, &d2, &m2);
    const __m512 vd1 = _mm512_set1_ps(d1), vm1 = _mm512_set1_ps(m1);
    const __m512 vd2 = _mm512_set1_ps(d2), vm2 = _mm512_set1_ps(m2);
    _mm512_storeu_ps(o, q16(_mm256_castsi256_si128(lo), vd1, vm1, 0));
    _mm512_storeu_ps(o + 16, q16(_mm256_extracti128_si256(lo, 1), vd1, vm1, 0));
    _mm512_storeu_ps(o + 32, q16(_mm256_castsi256_si128(hi), vd2, vm2, 0));
    _mm512_storeu_ps(o + 48, q16(_mm256_extracti128_si256(hi, 1), vd2, vm2, 0));
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
    const __m512 zero = _mm512_setzero_ps();
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
                _mm512_storeu_ps(o, q16(q1, _mm512_set1_ps(d * (float)sc[h]), zero, 1));
                _mm512_storeu_ps(o + 32, q16(q2, _mm512_set1_ps(d * (float)sc[h + 2]), zero, 1));
                _mm512_storeu_ps(o + 64, q16(q3, _mm512_set1_ps(d * (float)sc[h + 4]), zero, 1));
                _mm512_storeu_ps(o + 96, q16(q4, _mm512_set1_ps(d * (float)sc[h + 6]), zero, 1));
            }
        }
    }
}

/* The 32-blocks: value j in the low nibble of byte j, j + 16 in its high
 * one, a fifth bit (Q5_*) from bit j of a 32-bit word; Q4_0 / Q5_0 are
 * (code - half) d, Q4_1 / Q5_1 code d + m (as d code - (-m): the same
 * sum). */
static void q32_rows(enum dtype dt, const uint8_t *p, float *y, int64_t nb)
{
    const __m128i lo4 = _mm_set1_epi8(0x0F), b16 = _mm_set1_epi8(16);
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
            a = _mm_or_si128(a, _mm_maskz_mov_epi8((__mmask16)(qh & 0xFFFF), b16));
            b = _mm_or_si128(b, _mm_maskz_mov_epi8((__mmask16)(qh >> 16), b16));
        }
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(dh));
        const __m512 m = _mm512_set1_ps(affine ? -_cvtsh_ss(mh) : 0.0f);
        _mm512_storeu_ps(y, q16(_mm_sub_epi8(a, half), d, m, !affine));
        _mm512_storeu_ps(y + 16, q16(_mm_sub_epi8(b, half), d, m, !affine));
    }
}

void cpu_widen_avx512(enum dtype dt, const void *src, float *y, int64_t n)
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
#else
typedef int widen_v4_unused; /* ISO C wants something in a file */
#endif
