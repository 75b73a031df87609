/* unpack_kern.h - the unpacking of GGUF's 2-6-bit formats into the
 * matmul's code layout (unpack.h) with intrinsics, written once and built
 * per instruction set (unpack_v3.c: AVX2, unpack_v4.c: AVX-512). The codes
 * are split out with 128- and 256-bit integer operations both sets have;
 * the including file supplies
 *   U_BITS16(b): byte j 16 where bit j of the 16 bits b is set, else 0;
 *   U_UNPACK: the name of the exported function.
 * The scales are the reference's f32 products (unpack.c), so every build
 * writes its bytes. */
#include <stdbool.h>

#define QUANT_F16(h) _cvtsh_ss(h)
#include "backend/cpu/unpack.h"
#include "model/quant_dq.h"

/* ... of the 32 values of half h (0, 1) of a group: eight lanes each */
static inline void scales32(uint8_t *grp, int h, float s, float m)
{
    _mm256_storeu_ps((float *)(grp + 64) + 8 * h, _mm256_set1_ps(s));
    _mm256_storeu_ps((float *)(grp + 128) + 8 * h, _mm256_set1_ps(m));
}

/* The 32-blocks: value j in the low nibble of byte j, j + 16 in its high
 * one, a fifth bit (Q5_*) from bit j of a 32-bit word. Block b is half
 * b % 2 of group b / 2. Inlined once per format, so that the format's
 * tests leave the loop. */
static inline __attribute__((always_inline)) void q32_rows(enum dtype dt, const uint8_t *p,
                                                           uint8_t *dst, int64_t nb)
{
    const __m128i lo4 = _mm_set1_epi8(0x0F);
    const bool five = dt == DT_Q5_0 || dt == DT_Q5_1;
    const size_t bb = dtype_row_bytes(dt, 32);
    if (nb % 2) /* the last group's missing half */
        memset(dst + (size_t)(nb / 2) * UNPACK_GROUP_BYTES, 0, UNPACK_GROUP_BYTES);
    for (int64_t i = 0; i < nb; i++, p += bb) {
        uint8_t *grp = dst + (size_t)(i / 2) * UNPACK_GROUP_BYTES;
        const int h = (int)(i % 2);
        uint16_t dh, mh;
        uint32_t qh;
        const uint8_t *q = q32_fields(dt, p, &dh, &mh, &qh);
        const __m128i v = _mm_loadu_si128((const __m128i *)q);
        __m128i a = _mm_and_si128(v, lo4), b = _mm_and_si128(_mm_srli_epi16(v, 4), lo4);
        if (five) {
            a = _mm_or_si128(a, U_BITS16(qh & 0xFFFF));
            b = _mm_or_si128(b, U_BITS16(qh >> 16));
        }
        _mm_storeu_si128((__m128i *)(grp + 32 * h), a);
        _mm_storeu_si128((__m128i *)(grp + 32 * h + 16), b);
        const float d = _cvtsh_ss(dh);
        scales32(grp, h, d, q32_min(dt, d, _cvtsh_ss(mh)));
    }
}

/* A K block's eight group scales d sc and mins dmin mn (k_scale_min's
 * bits, all eight at once), as f32 vectors: the same products as
 * k_pair_scales' */
static inline void k_scales8(const uint8_t *q, float d, float dmin, __m256 *s8, __m256 *m8)
{
    uint64_t sc, mn;
    k_scale_bytes(q, &sc, &mn);
    *s8 = _mm256_mul_ps(_mm256_set1_ps(d),
                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc))));
    *m8 = _mm256_mul_ps(_mm256_set1_ps(dmin),
                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn))));
}

/* One group of a K block: groups 2c and 2c + 1's codes (lo, hi) and their
 * scales and mins, lanes of s8 and m8 */
static inline void k_group(uint8_t *grp, __m256 s8, __m256 m8, int c, __m256i lo, __m256i hi)
{
    const __m256i g1 = _mm256_set1_epi32(2 * c), g2 = _mm256_set1_epi32(2 * c + 1);
    _mm256_storeu_si256((__m256i *)grp, lo);
    _mm256_storeu_si256((__m256i *)(grp + 32), hi);
    _mm256_storeu_ps((float *)(grp + 64), _mm256_permutevar8x32_ps(s8, g1));
    _mm256_storeu_ps((float *)(grp + 64) + 8, _mm256_permutevar8x32_ps(s8, g2));
    _mm256_storeu_ps((float *)(grp + 128), _mm256_permutevar8x32_ps(m8, g1));
    _mm256_storeu_ps((float *)(grp + 128) + 8, _mm256_permutevar8x32_ps(m8, g2));
}

static void q4_k_rows(const struct blk_q4_k *b, uint8_t *dst, int64_t nb)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; i++, b++) {
        __m256 s8, m8;
        k_scales8(b->scales, _cvtsh_ss(b->d), _cvtsh_ss(b->dmin), &s8, &m8);
        for (int c = 0; c < 4; c++, dst += UNPACK_GROUP_BYTES) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
            k_group(dst, s8, m8, c, _mm256_and_si256(q, lo4),
                    _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4));
        }
    }
}

static void q5_k_rows(const struct blk_q5_k *b, uint8_t *dst, int64_t nb)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < nb; i++, b++) {
        __m256 s8, m8;
        k_scales8(b->scales, _cvtsh_ss(b->d), _cvtsh_ss(b->dmin), &s8, &m8);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
        for (int c = 0; c < 4; c++, dst += UNPACK_GROUP_BYTES) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
            /* fifth bits: bit 2c of qh[l] for the low group, 2c + 1 for the high */
            const __m128i s1 = _mm_cvtsi32_si128(2 * c), s2 = _mm_cvtsi32_si128(2 * c + 1);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s1), one), 4);
            const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s2), one), 4);
            k_group(dst, s8, m8, c, _mm256_or_si256(_mm256_and_si256(q, lo4), h1),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), lo4), h2));
        }
    }
}

/* s and m of a group's 16 lanes from eight units' scales sv and mins mv:
 * lanes 4k .. 4k + 3 take unit b + k (b 0 or 4) */
static inline void unit_scales(uint8_t *grp, __m256 sv, __m256 mv, int b)
{
    const __m256i i1 = _mm256_setr_epi32(b, b, b, b, b + 1, b + 1, b + 1, b + 1);
    const __m256i i2 = _mm256_add_epi32(i1, _mm256_set1_epi32(2));
    _mm256_storeu_ps((float *)(grp + 64), _mm256_permutevar8x32_ps(sv, i1));
    _mm256_storeu_ps((float *)(grp + 64) + 8, _mm256_permutevar8x32_ps(sv, i2));
    _mm256_storeu_ps((float *)(grp + 128), _mm256_permutevar8x32_ps(mv, i1));
    _mm256_storeu_ps((float *)(grp + 128) + 8, _mm256_permutevar8x32_ps(mv, i2));
}

/* Eight bytes at b (unsigned) as f32 times d */
static inline __m256 scaled8(__m128i b, float d)
{
    return _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)));
}

/* Q2_K / Q3_K: half n's 32 bytes of qs hold runs j = 0..3 of 32 values in
 * bits 2j, run j going to half j % 2 of group 2n + j / 2; Q3_K's third bit
 * of run j is bit 4n + j of hmask's 32 bytes. The block's 16 units' s and
 * m come in sv[2] and mv[2] (units 0-7, 8-15). */
static inline __attribute__((always_inline)) void k23_codes(const uint8_t *qs, const uint8_t *hmask,
                                                           const __m256 sv[2], const __m256 mv[2],
                                                           uint8_t *dst)
{
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m256i hm = hmask ? _mm256_loadu_si256((const __m256i *)hmask) : _mm256_setzero_si256();
    for (int n = 0; n < 2; n++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * n));
        for (int j = 0; j < 4; j++) {
            const __m128i sh = _mm_cvtsi32_si128(2 * j), sb = _mm_cvtsi32_si128(4 * n + j);
            __m256i c = _mm256_and_si256(_mm256_srl_epi16(q, sh), three);
            if (hmask)
                c = _mm256_or_si256(
                    c, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hm, sb), one), 2));
            _mm256_storeu_si256(
                (__m256i *)(dst + (size_t)(2 * n + j / 2) * UNPACK_GROUP_BYTES + 32 * (j % 2)), c);
        }
    }
    for (int g = 0; g < 4; g++)
        unit_scales(dst + (size_t)g * UNPACK_GROUP_BYTES, sv[g / 2], mv[g / 2], 4 * (g % 2));
}

static void q2_k_rows(const struct blk_q2_k *b, uint8_t *dst, int64_t nb)
{
    const __m128i lo4 = _mm_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; i++, b++, dst += 4 * UNPACK_GROUP_BYTES) {
        const float d = _cvtsh_ss(b->d), dmin = _cvtsh_ss(b->dmin);
        const __m128i sc = _mm_loadu_si128((const __m128i *)b->scales);
        const __m128i lo = _mm_and_si128(sc, lo4), hi = _mm_and_si128(_mm_srli_epi16(sc, 4), lo4);
        const __m256 sv[2] = {scaled8(lo, d), scaled8(_mm_srli_si128(lo, 8), d)};
        const __m256 mv[2] = {scaled8(hi, dmin), scaled8(_mm_srli_si128(hi, 8), dmin)};
        k23_codes(b->qs, NULL, sv, mv, dst);
    }
}

static void q3_k_rows(const struct blk_q3_k *b, uint8_t *dst, int64_t nb)
{
    const __m256 k4 = _mm256_set1_ps(4.0f);
    const __m256i k32 = _mm256_set1_epi32(32);
    for (int64_t i = 0; i < nb; i++, b++, dst += 4 * UNPACK_GROUP_BYTES) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
        uint32_t w[4];
        q3_k_scale_words(b->scales, w);
        const __m128i s16 = _mm_setr_epi32((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
        __m256 sv[2], mv[2];
        for (int h = 0; h < 2; h++) {
            const __m256i s = _mm256_sub_epi32(_mm256_cvtepi8_epi32(h ? _mm_srli_si128(s16, 8) : s16), k32);
            sv[h] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(s));
            mv[h] = _mm256_mul_ps(k4, sv[h]);
        }
        k23_codes(b->qs, b->hmask, sv, mv, dst);
    }
}

/* Q6_K: half n of a block is groups 2n and 2n + 1: the first holds runs q1
 * and q2 of unpack.c's codes_q6_k, the second q3 and q4; group G of the
 * block (its 16-value units u) takes scales 4G + u. */
static void q6_k_rows(const struct blk_q6_k *b, uint8_t *dst, int64_t nb)
{
    const __m128i lo4 = _mm_set1_epi8(0x0F), three = _mm_set1_epi8(3);
    for (int64_t i = 0; i < nb; i++, b++) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
        const __m128i sc = _mm_loadu_si128((const __m128i *)b->scales);
        /* d sc, the reference's products: scales 0-7, 8-15 */
        const __m256 v0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        const __m256 v1 =
            _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
        for (int n = 0; n < 2; n++, dst += 2 * UNPACK_GROUP_BYTES) {
            const uint8_t *ql = b->ql + 64 * n, *qh = b->qh + 32 * n;
            uint8_t *g0 = dst, *g1 = dst + UNPACK_GROUP_BYTES;
            for (int h = 0; h < 2; h++) {
                const __m128i a = _mm_loadu_si128((const __m128i *)(ql + 16 * h));
                const __m128i c = _mm_loadu_si128((const __m128i *)(ql + 32 + 16 * h));
                const __m128i e = _mm_loadu_si128((const __m128i *)(qh + 16 * h));
                /* byte shifts through 16-bit lanes, masked after */
                const __m128i h0 = _mm_slli_epi16(_mm_and_si128(e, three), 4);
                const __m128i h1 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(e, 2), three), 4);
                const __m128i h2 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(e, 4), three), 4);
                const __m128i h3 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(e, 6), three), 4);
                _mm_storeu_si128((__m128i *)(g0 + 16 * h), _mm_or_si128(_mm_and_si128(a, lo4), h0));
                _mm_storeu_si128((__m128i *)(g0 + 32 + 16 * h),
                                 _mm_or_si128(_mm_and_si128(c, lo4), h1));
                _mm_storeu_si128((__m128i *)(g1 + 16 * h),
                                 _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), lo4), h2));
                _mm_storeu_si128((__m128i *)(g1 + 32 + 16 * h),
                                 _mm_or_si128(_mm_and_si128(_mm_srli_epi16(c, 4), lo4), h3));
            }
            const __m256 v = n ? v1 : v0, m = _mm256_mul_ps(_mm256_set1_ps(32.0f), v);
            unit_scales(g0, v, m, 0);
            unit_scales(g1, v, m, 4);
        }
    }
}

void U_UNPACK(enum dtype dt, const void *src, uint8_t *dst, int64_t cols);
void U_UNPACK(enum dtype dt, const void *src, uint8_t *dst, int64_t cols)
{
    switch (dt) {
    case DT_Q4_0: q32_rows(DT_Q4_0, src, dst, cols / 32); break;
    case DT_Q4_1: q32_rows(DT_Q4_1, src, dst, cols / 32); break;
    case DT_Q5_0: q32_rows(DT_Q5_0, src, dst, cols / 32); break;
    case DT_Q5_1: q32_rows(DT_Q5_1, src, dst, cols / 32); break;
    case DT_Q4_K: q4_k_rows(src, dst, cols / Q_K_BLOCK); break;
    case DT_Q5_K: q5_k_rows(src, dst, cols / Q_K_BLOCK); break;
    case DT_Q6_K: q6_k_rows(src, dst, cols / Q_K_BLOCK); break;
    case DT_Q2_K: q2_k_rows(src, dst, cols / Q_K_BLOCK); break;
    case DT_Q3_K: q3_k_rows(src, dst, cols / Q_K_BLOCK); break;
    default: cpu_unpack_ref(dt, src, dst, cols); break;
    }
}
