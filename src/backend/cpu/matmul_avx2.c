/* matmul_avx2.c - AVX2+FMA+F16C kernels: f32/f16/bf16 weights with f32 FMA,
 * and Q8_0 and the integer-code formats (GGUF's 2-6-bit ones) with 8-bit
 * integer dot products (maddubs).
 *
 * Each function carries its own target attribute so the binary still runs
 * on CPUs without AVX2; matmul.c only calls in here after cpu_isa_hw() said
 * yes. The structure mirrors matmul_avx512.c (see there and matmul_impl.h):
 * templates over (tokens mr, weight rows nr, accumulator sets u). With 16
 * ymm registers the main tile is 2 tokens x 4 weight rows. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cpu/matmul_impl.h"
#include "backend/cpu/unpack.h"
#include "model/quant_dq.h"

#define T256 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

#define MR 2   /* tokens per main tile */
#define NR 4   /* weight rows per tile */
#define MMAX 4 /* most tokens per row in the streaming kernel */
#define UMAX 4
#define STREAM_MAX_N 4

/* Accumulator sets needed to keep about four FMA chains in flight. */
#define UNROLL(mr, nr) ((mr) * (nr) >= 4 ? 1 : 4 / ((mr) * (nr)))

/* See prefetch_next_tile in matmul_avx512.c: two tiles ahead, into L2. */
INLINE T256 void prefetch_next_tile(int nr, const void *p, size_t stride)
{
    if (nr == NR)
        _mm_prefetch((const char *)((uintptr_t)p + 2 * NR * stride), _MM_HINT_T1);
}

/* {sum a, sum b, sum c, sum d} with the shuffles shared. */
INLINE T256 __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

INLINE T256 float hsum(__m256 a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE T256 void zero_acc(int mr, int nr, int u, __m256 acc[UMAX][MMAX][NR])
{
#pragma GCC unroll 4
    for (int q = 0; q < u; q++)
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
            for (int c = 0; c < nr; c++)
                acc[q][i][c] = _mm256_setzero_ps();
}

INLINE T256 void store_tile(const struct mm_job *j, int64_t t, int64_t r, int mr, int nr, int u,
                            __m256 acc[UMAX][MMAX][NR])
{
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
#pragma GCC unroll 4
        for (int c = 0; c < nr; c++)
#pragma GCC unroll 4
            for (int q = 1; q < u; q++)
                acc[0][i][c] = _mm256_add_ps(acc[0][i][c], acc[q][i][c]);
        float *o = j->out + (t + i) * j->rows + r;
        if (nr == 4) {
            _mm_storeu_ps(o, hsum4(acc[0][i][0], acc[0][i][1], acc[0][i][2], acc[0][i][3]));
        } else {
#pragma GCC unroll 4
            for (int c = 0; c < nr; c++)
                o[c] = hsum(acc[0][i][c]);
        }
    }
}

/* ---- f32 / f16 / bf16 ---- */

INLINE T256 __m256 load_w8(enum dtype dt, const void *p)
{
    switch (dt) {
    case DT_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    case DT_BF16: /* bf16 is the top half of an f32 */
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    default: return _mm256_loadu_ps((const float *)p);
    }
}

INLINE T256 void ftile_step(enum dtype dt, int mr, int nr, const float *const *x,
                            const uint8_t *const *w, size_t stride, int64_t k,
                            __m256 acc[MMAX][NR])
{
    size_t es = dt == DT_F32 ? 4 : 2;
    __m256 wv[NR];
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++) {
        wv[c] = load_w8(dt, w[c] + k * es);
        if ((k * es) % 64 == 0) /* once per line: load slots are scarce here */
            prefetch_next_tile(nr, w[c] + k * es, stride);
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        __m256 xv = _mm256_loadu_ps(x[i] + k);
#pragma GCC unroll 4
        for (int c = 0; c < nr; c++)
            acc[i][c] = _mm256_fmadd_ps(xv, wv[c], acc[i][c]);
    }
}

/* The last cols % 8 columns: copied into zero-padded buffers so the same
 * step applies (AVX2 has no masked 16-bit loads). */
INLINE T256 void ftile_tail(enum dtype dt, int mr, int nr, const float *const *x,
                            const uint8_t *const *w, int64_t k, int64_t cols,
                            __m256 acc[MMAX][NR])
{
    size_t es = dt == DT_F32 ? 4 : 2, len = (size_t)(cols - k);
    _Alignas(32) float xb[MMAX][8];
    _Alignas(32) uint8_t wb[NR][32];
    const float *xp[MMAX];
    const uint8_t *wp[NR];
    memset(xb, 0, sizeof xb);
    memset(wb, 0, sizeof wb);
    for (int i = 0; i < mr; i++) {
        memcpy(xb[i], x[i] + k, len * sizeof(float));
        xp[i] = xb[i];
    }
    for (int c = 0; c < nr; c++) {
        memcpy(wb[c], w[c] + k * es, len * es);
        wp[c] = wb[c];
    }
    ftile_step(dt, mr, nr, xp, wp, 0, 0, acc);
}

INLINE T256 void ftile(enum dtype dt, int mr, int nr, const struct mm_job *j, int64_t t,
                       int64_t r)
{
    const int u = UNROLL(mr, nr);
    const float *x[MMAX];
    const uint8_t *w[NR];
    __m256 acc[UMAX][MMAX][NR];
    zero_acc(mr, nr, u, acc);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
        x[i] = j->x + (t + i) * j->cols;
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++)
        w[c] = j->w + (r + c) * j->w_stride;
    int64_t k = 0;
    for (; k + 8 * u <= j->cols; k += 8 * u)
#pragma GCC unroll 4
        for (int q = 0; q < u; q++)
            ftile_step(dt, mr, nr, x, w, j->w_stride, k + 8 * q, acc[q]);
    for (; k + 8 <= j->cols; k += 8)
        ftile_step(dt, mr, nr, x, w, j->w_stride, k, acc[0]);
    if (k < j->cols)
        ftile_tail(dt, mr, nr, x, w, k, j->cols, acc[0]);
    store_tile(j, t, r, mr, nr, u, acc);
}

INLINE T256 void frows(enum dtype dt, int nt, const struct mm_job *j, int64_t t, int64_t r0,
                       int64_t r1)
{
    for (int64_t r = r0; r < r1; r++)
        ftile(dt, nt, 1, j, t, r);
}

#define FKERNEL(name, dt)                                                      \
    static T256 void name##_main(const struct mm_job *j, int64_t t, int64_t r) \
    { ftile(dt, MR, NR, j, t, r); }                                            \
    static T256 void name##_t1(const struct mm_job *j, int64_t t, int64_t r)   \
    { ftile(dt, 1, NR, j, t, r); }                                             \
    static T256 void name##_r1(const struct mm_job *j, int64_t t, int64_t r)   \
    { ftile(dt, MR, 1, j, t, r); }                                             \
    static T256 void name##_1x1(const struct mm_job *j, int64_t t, int64_t r)  \
    { ftile(dt, 1, 1, j, t, r); }                                              \
    static T256 void name##_stream(const struct mm_job *j, int64_t t, int nt,    \
                                 int64_t r0, int64_t r1)                       \
    {                                                                          \
        switch (nt) {                                                          \
        case 1: frows(dt, 1, j, t, r0, r1); break;                             \
        case 2: frows(dt, 2, j, t, r0, r1); break;                             \
        case 3: frows(dt, 3, j, t, r0, r1); break;                             \
        default: frows(dt, 4, j, t, r0, r1); break;                            \
        }                                                                      \
    }                                                                          \
    static const struct mm_kernel name = {                                     \
        MR, NR, STREAM_MAX_N, name##_stream, name##_main, name##_t1,             \
        name##_r1, name##_1x1, NULL, NULL};
FKERNEL(k256_f32, DT_F32)
FKERNEL(k256_f16, DT_F16)
FKERNEL(k256_bf16, DT_BF16)


/* ---- Q8_0 ----
 *
 * maddubs multiplies unsigned by signed bytes into saturating int16 pairs.
 * With a = |w| and b = x * sign(w) every pair is at most 2 * 128 * 127,
 * below the int16 limit, so nothing saturates. (Not the other way round:
 * a weight of -128, legal in a file, has no positive int8 negation, while
 * our quantized x never leaves [-127, 127].) madd with ones widens the
 * pairs to int32 lanes; one block of 32 is one ymm.
 *
 * Activation row layout (64-byte aligned stride):
 *   qs [nb * 32] int8   quantized values
 *   d  [nb]      f32    block scales
 */

static size_t avx2_xq_row_bytes(int64_t cols)
{
    int64_t nb = cols / Q8_0_BLOCK;
    return mm_round_up((size_t)nb * (Q8_0_BLOCK + sizeof(float)), 64);
}

/* One 32-block of activations at xb rounded to 8 bits: scale *d = absmax
 * / 127 as ggml does, values rounded to nearest (ties to even), returned
 * in order. */
INLINE T256 __m256i q8_block32(const float *xb, float *d)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(xb + 8 * i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    *d = _mm_cvtss_f32(m4) / 127.0f;
    const __m256 id = _mm256_set1_ps(*d != 0.0f ? 1.0f / *d : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; i++)
        q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
    /* packs interleave 128-bit lanes; the permute puts bytes back in order */
    const __m256i q8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                          _mm256_packs_epi32(q[2], q[3]));
    return _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static T256 void avx2_xq_quantize(const float *x, uint8_t *dst, int64_t cols)
{
    int64_t nb = cols / Q8_0_BLOCK;
    float *ds = (float *)(dst + nb * Q8_0_BLOCK);
    for (int64_t b = 0; b < nb; b++)
        _mm256_store_si256((__m256i *)(dst + b * Q8_0_BLOCK),
                           q8_block32(x + b * Q8_0_BLOCK, &ds[b]));
}

INLINE T256 void q8_step(int mr, int nr, const int8_t *const *xq, const float *const *xd,
                         const struct block_q8_0 *const *w, size_t stride, int64_t b,
                         __m256 acc[MMAX][NR])
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i xs[MMAX];
    __m256 dx[MMAX];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        xs[i] = _mm256_load_si256((const __m256i *)(xq[i] + b * Q8_0_BLOCK));
        dx[i] = _mm256_broadcast_ss(xd[i] + b);
    }
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++) {
        const struct block_q8_0 *wb = w[c] + b;
        prefetch_next_tile(nr, wb, stride);
        __m256i wv = _mm256_loadu_si256((const __m256i *)wb->qs);
        __m256i aw = _mm256_abs_epi8(wv);
        __m256 dw = _mm256_set1_ps(_cvtsh_ss(wb->d));
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xs[i], wv));
            p = _mm256_madd_epi16(p, ones);
            acc[i][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dx[i], dw), acc[i][c]);
        }
    }
}

INLINE T256 void q8_tile(int mr, int nr, const struct mm_job *j, int64_t t, int64_t r)
{
    const int u = UNROLL(mr, nr);
    int64_t nb = j->cols / Q8_0_BLOCK;
    const int8_t *xq[MMAX];
    const float *xd[MMAX];
    const struct block_q8_0 *w[NR];
    __m256 acc[UMAX][MMAX][NR];
    zero_acc(mr, nr, u, acc);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        xq[i] = (const int8_t *)(j->xq + (t + i) * j->xq_stride);
        xd[i] = (const float *)(xq[i] + nb * Q8_0_BLOCK);
    }
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++)
        w[c] = (const struct block_q8_0 *)(j->w + (r + c) * j->w_stride);
    int64_t b = 0;
    for (; b + u <= nb; b += u)
#pragma GCC unroll 4
        for (int q = 0; q < u; q++)
            q8_step(mr, nr, xq, xd, w, j->w_stride, b + q, acc[q]);
    for (; b < nb; b++)
        q8_step(mr, nr, xq, xd, w, j->w_stride, b, acc[0]);
    store_tile(j, t, r, mr, nr, u, acc);
}

MM_INT_KERNEL(T256, k256_q8_0, q8_tile, avx2_xq_row_bytes, avx2_xq_quantize)

/* mm_codes_xq_quantize's bytes (matmul_impl.h), eight values a vector:
 * the same products, rounding (ties to even) and lane sums, which are
 * exact in int32. Shared by the AVX-512 families, for which a vector of
 * 32 values spans a 32-block in two halves anyway. */
T256 void mm_codes_xq_quantize_avx2(const float *x, uint8_t *dst, int64_t cols)
{
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const int64_t nb = cols / 32;
    if (nb % 2) /* the last group's missing half */
        memset(dst + (size_t)(nb / 2) * UNPACK_GROUP_BYTES, 0, UNPACK_GROUP_BYTES);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *grp = dst + (size_t)(b / 2) * UNPACK_GROUP_BYTES;
        const int h = (int)(b % 2);
        float db;
        const __m256i q8 = q8_block32(x + b * 32, &db);
        _mm256_storeu_si256((__m256i *)(grp + 32 * h), q8);
        const __m256i sum4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q8), ones16);
        const __m256 d8 = _mm256_set1_ps(db);
        _mm256_storeu_ps((float *)(grp + 64) + 8 * h, d8);
        _mm256_storeu_ps((float *)(grp + 128) + 8 * h, _mm256_mul_ps(d8, _mm256_cvtepi32_ps(sum4)));
    }
}

/* ---- the integer-code formats (matmul_impl.h, unpack.h) ----
 *
 * A group of 64 values is two ymm halves; maddubs then madd with ones
 * gives vpdpbusd's four-value lanes, which are the lanes of the group's s,
 * m, d and xs (see matmul_avx512.c). Codes are at most 63, so a pair of
 * products is at most 2 * 63 * 127 and maddubs never saturates. */

INLINE T256 void codes_step(int mr, int nr, const uint8_t *const *x, const uint8_t *const *w,
                            int64_t g, int h, __m256 acc[MMAX][NR])
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i xv[MMAX];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
        xv[i] = _mm256_loadu_si256((const __m256i *)(x[i] + g * UNPACK_GROUP_BYTES + 32 * h));
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++) {
        const uint8_t *p = w[c] + g * UNPACK_GROUP_BYTES;
        const __m256i wu = _mm256_loadu_si256((const __m256i *)(p + 32 * h));
        const __m256 ws = _mm256_loadu_ps((const float *)(p + 64) + 8 * h);
        const __m256 wm = _mm256_loadu_ps((const float *)(p + 128) + 8 * h);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            const float *q = (const float *)(x[i] + g * UNPACK_GROUP_BYTES);
            const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wu, xv[i]), ones);
            __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                       _mm256_mul_ps(ws, _mm256_loadu_ps(q + 16 + 8 * h)), acc[i][c]);
            acc[i][c] = _mm256_fnmadd_ps(wm, _mm256_loadu_ps(q + 32 + 8 * h), a);
        }
    }
}

INLINE T256 void codes_tile(int mr, int nr, const struct mm_job *j, int64_t t, int64_t r)
{
    const int u = UNROLL(mr, nr);
    const int64_t nh = j->cols / 32; /* halves of groups */
    const uint8_t *x[MMAX], *w[NR];
    __m256 acc[UMAX][MMAX][NR];
    zero_acc(mr, nr, u, acc);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
        x[i] = j->xq + (t + i) * j->xq_stride;
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++)
        w[c] = j->w + (r + c) * j->w_stride;
    int64_t k = 0;
    for (; k + u <= nh; k += u)
#pragma GCC unroll 4
        for (int q = 0; q < u; q++)
            codes_step(mr, nr, x, w, (k + q) / 2, (int)((k + q) % 2), acc[q]);
    for (; k < nh; k++)
        codes_step(mr, nr, x, w, k / 2, (int)(k % 2), acc[0]);
    store_tile(j, t, r, mr, nr, u, acc);
}

MM_INT_KERNEL(T256, k256_codes, codes_tile, mm_codes_xq_row_bytes, mm_codes_xq_quantize_avx2)

const struct mm_kernel *mm_codes_kernel_avx2(void) { return &k256_codes; }

/* ---- Q4_0, Q4_1, Q5_0, Q5_1 and the K formats read from their blocks,
 * for up to STREAM_MAX_N tokens (matmul_impl.h's direct kernels;
 * matmul_avx512.c says why), in halves of 32 values: codes_step's arithmetic on the vectors the
 * unpacking would have written, with codes_tile's accumulators, so the
 * slab path's bits. ---- */

/* The products of half hh of one group g of a direct kernel's row (its
 * codes wu, its lanes' s and m) with each of nt tokens' activations, into
 * ac: codes_step's arithmetic for one row. */
INLINE T256 void direct_half(int nt, const uint8_t *const *x, int64_t g, int hh, __m256i wu,
                             __m256 ws, __m256 wm, __m256 ac[MMAX][NR])
{
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int i = 0; i < nt; i++) {
        const uint8_t *qx = x[i] + g * UNPACK_GROUP_BYTES;
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(qx + 32 * hh));
        const float *qf = (const float *)qx;
        const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wu, xv), ones);
        __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                   _mm256_mul_ps(ws, _mm256_loadu_ps(qf + 16 + 8 * hh)), ac[i][0]);
        ac[i][0] = _mm256_fnmadd_ps(wm, _mm256_loadu_ps(qf + 32 + 8 * hh), t);
    }
}

/* A Q4_K or (five) Q5_K block ib into acc (matmul_avx512.c's k45_block
 * in halves): half hh of group c is its 32 bytes of qs 32c .. in the low
 * (hh = 0) or high nibbles, with group 2c + hh's s and m (and Q5_K's
 * fifth bits from bit 2c + hh of qh). */
INLINE T256 void k45_block(int nt, const uint8_t *const *x, int64_t ib, const uint8_t *blk,
                           bool five, int u, __m256 acc[UMAX][MMAX][NR])
{
    const struct blk_q4_k *b4 = (const struct blk_q4_k *)blk;
    const struct blk_q5_k *b5 = (const struct blk_q5_k *)blk;
    const uint8_t *qs = five ? b5->qs : b4->qs; /* d, dmin, scales: the same offsets */
    const __m256i lo4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)b5->qh) : _mm256_setzero_si256();
    uint64_t sc, mn;
    k_scale_bytes(b4->scales, &sc, &mn);
    const __m256 s8 =
        _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b4->d)),
                      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc))));
    const __m256 m8 =
        _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b4->dmin)),
                      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn))));
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
#pragma GCC unroll 2
        for (int hh = 0; hh < 2; hh++) {
            __m256i wu = hh ? _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4)
                            : _mm256_and_si256(q, lo4);
            if (five)
                wu = _mm256_or_si256(
                    wu, _mm256_slli_epi16(
                            _mm256_and_si256(
                                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + hh)), one),
                            4));
            const __m256i gi = _mm256_set1_epi32(2 * c + hh);
            /* codes_tile's accumulators: half k = 2g + hh in set k % u */
            direct_half(nt, x, 4 * ib + c, hh, wu, _mm256_permutevar8x32_ps(s8, gi),
                        _mm256_permutevar8x32_ps(m8, gi), acc[(2 * c + hh) % u]);
        }
    }
}

/* A Q6_K block ib into acc (matmul_avx512.c's q6k_block in halves): half
 * hh of group 2n + k is run hh of ql's low (k = 0) or high nibbles with
 * qh's bits 4k + 2hh, 4k + 2hh + 1; its lanes take units 4k + 2hh and
 * 4k + 2hh + 1 of half n, four lanes each. */
INLINE T256 void q6k_block(int nt, const uint8_t *const *x, int64_t ib, const struct blk_q6_k *b,
                           int u, __m256 acc[UMAX][MMAX][NR])
{
    const __m256i lo4 = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    const __m256 k32 = _mm256_set1_ps(32.0f);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
    const __m128i sc = _mm_loadu_si128((const __m128i *)b->scales);
#pragma GCC unroll 2
    for (int n = 0; n < 2; n++) {
        const __m256 v = _mm256_mul_ps(
            d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(n ? _mm_srli_si128(sc, 8) : sc)));
        const __m256i a = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * n));
        const __m256i c = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * n + 32));
        const __m256i e = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * n));
#pragma GCC unroll 2
        for (int k = 0; k < 2; k++) {
            const int64_t g = 4 * ib + 2 * n + k;
#pragma GCC unroll 2
            for (int hh = 0; hh < 2; hh++) {
                const __m256i q = hh ? c : a;
                const __m256i ql = k ? _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4)
                                     : _mm256_and_si256(q, lo4);
                const __m256i qh = _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srli_epi16(e, 4 * k + 2 * hh), three), 4);
                const int un = 4 * k + 2 * hh;
                const __m256 ws = _mm256_permutevar8x32_ps(
                    v, _mm256_setr_epi32(un, un, un, un, un + 1, un + 1, un + 1, un + 1));
                direct_half(nt, x, g, hh, _mm256_or_si256(ql, qh), ws, _mm256_mul_ps(k32, ws),
                            acc[(2 * (2 * n + k) + hh) % u]);
            }
        }
    }
}

/* Bit b of each byte of hm moved to bit 2, the rest cleared (Q3_K's
 * third bit of a code): one shift through 16-bit lanes, then the mask. */
INLINE T256 __m256i hmask_bit(__m256i hm, int b)
{
    const __m256i v = b >= 2 ? _mm256_srli_epi16(hm, b - 2) : _mm256_slli_epi16(hm, 2 - b);
    return _mm256_and_si256(v, _mm256_set1_epi8(4));
}

/* A Q2_K or (three) Q3_K block ib into acc (matmul_avx512.c's k23_block
 * in halves): half hh of group g = 2n + k is run 2k + hh of half n; its
 * lanes take 16-units 4g + 2hh and 4g + 2hh + 1, four lanes each. */
INLINE T256 void k23_block(int nt, const uint8_t *const *x, int64_t ib, const uint8_t *blk,
                           bool three, int u, __m256 acc[UMAX][MMAX][NR])
{
    const struct blk_q2_k *b2 = (const struct blk_q2_k *)blk;
    const struct blk_q3_k *b3 = (const struct blk_q3_k *)blk;
    const __m256i m3 = _mm256_set1_epi8(3);
    const uint8_t *qs = three ? b3->qs : b2->qs;
    const __m256i hm =
        three ? _mm256_loadu_si256((const __m256i *)b3->hmask) : _mm256_setzero_si256();
    __m256 s8[2], m8[2]; /* units 0-7 and 8-15: the reference's products */
    if (three) {
        uint32_t sc[4];
        q3_k_scale_words(b3->scales, sc);
        const __m128i v = _mm_setr_epi32((int)sc[0], (int)sc[1], (int)sc[2], (int)sc[3]);
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b3->d));
        for (int h = 0; h < 2; h++) {
            const __m256i w = _mm256_sub_epi32(_mm256_cvtepi8_epi32(h ? _mm_srli_si128(v, 8) : v),
                                               _mm256_set1_epi32(32));
            s8[h] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(w));
            m8[h] = _mm256_mul_ps(_mm256_set1_ps(4.0f), s8[h]);
        }
    } else {
        const __m128i v = _mm_loadu_si128((const __m128i *)b2->scales);
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b2->d)), dm = _mm256_set1_ps(_cvtsh_ss(b2->dmin));
        for (int h = 0; h < 2; h++) {
            const __m256i w = _mm256_cvtepu8_epi32(h ? _mm_srli_si128(v, 8) : v);
            s8[h] = _mm256_mul_ps(
                d, _mm256_cvtepi32_ps(_mm256_and_si256(w, _mm256_set1_epi32(0xF))));
            m8[h] = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_srli_epi32(w, 4)));
        }
    }
#pragma GCC unroll 2
    for (int n = 0; n < 2; n++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * n));
#pragma GCC unroll 2
        for (int k = 0; k < 2; k++) {
            const int g = 2 * n + k;
#pragma GCC unroll 2
            for (int hh = 0; hh < 2; hh++) {
                const int run = 2 * k + hh, un = (4 * g + 2 * hh) % 8;
                __m256i c = _mm256_and_si256(_mm256_srli_epi16(q, 2 * run), m3);
                if (three)
                    c = _mm256_or_si256(c, hmask_bit(hm, 4 * n + run));
                const __m256i idx =
                    _mm256_setr_epi32(un, un, un, un, un + 1, un + 1, un + 1, un + 1);
                /* codes_tile's accumulators: half 2g + hh in set (2g + hh) % u */
                direct_half(nt, x, 4 * ib + g, hh, c, _mm256_permutevar8x32_ps(s8[n], idx),
                            _mm256_permutevar8x32_ps(m8[n], idx), acc[(2 * g + hh) % u]);
            }
        }
    }
}

/* A Q4_0, Q4_1, Q5_0 or Q5_1 32-block at p as unpack.c's codes_q32 has
 * it: its 32 codes in value order (low nibbles, then high, with the
 * fifth bits of the Q5_* ones), its s and m. */
INLINE T256 __m256i q32_codes(const uint8_t *p, enum dtype dt, float *s, float *m)
{
    const bool five = dt == DT_Q5_0 || dt == DT_Q5_1;
    uint16_t dh, mh;
    uint32_t qh;
    const uint8_t *q = q32_fields(dt, p, &dh, &mh, &qh);
    const __m128i v = _mm_loadu_si128((const __m128i *)q), lo4 = _mm_set1_epi8(0x0F);
    const float d = _cvtsh_ss(dh);
    *s = d;
    *m = q32_min(dt, d, _cvtsh_ss(mh));
    __m256i c = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), lo4), _mm_and_si128(v, lo4));
    if (five) {
        /* qh's bit k is value k's fifth bit: byte k of qh's bytes spread
         * eight a byte, tested against its bit */
        const __m256i spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32((int)qh),
            _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                             2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
        const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        c = _mm256_or_si256(c, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    return c;
}

/* Row r of a matrix of one of the 2-6-bit formats against nt tokens. */
INLINE T256 void direct_row(enum dtype dt, int nt, const struct mm_job *j, int64_t t,
                            int64_t r)
{
    const int u = UNROLL(nt, 1);
    const uint8_t *x[MMAX];
    __m256 acc[UMAX][MMAX][NR];
    zero_acc(nt, 1, u, acc);
#pragma GCC unroll 4
    for (int i = 0; i < nt; i++)
        x[i] = j->xq + (t + i) * j->xq_stride;
    const uint8_t *row = j->w + r * j->w_stride;
    if (dtype_block_elems(dt) == 32) {
        /* a block a half: codes_tile's accumulators, half k in set k % u
         * but the last nb % u halves in set 0 */
        const int64_t nb = j->cols / 32, main = nb - nb % u;
        const size_t bb = dtype_row_bytes(dt, 32);
        for (int64_t k = 0; k < nb; k++) {
            float s, m;
            const __m256i wu = q32_codes(row + (size_t)k * bb, dt, &s, &m);
            direct_half(nt, x, k / 2, (int)(k % 2), wu, _mm256_set1_ps(s), _mm256_set1_ps(m),
                        acc[k < main ? k % u : 0]);
        }
    } else {
        for (int64_t ib = 0; ib < j->cols / Q_K_BLOCK; ib++) {
            if (dt == DT_Q6_K)
                q6k_block(nt, x, ib, (const struct blk_q6_k *)row + ib, u, acc);
            else if (dt == DT_Q2_K || dt == DT_Q3_K)
                k23_block(nt, x, ib, row + ib * dtype_row_bytes(dt, Q_K_BLOCK), dt == DT_Q3_K, u,
                          acc);
            else if (dt == DT_Q5_K)
                k45_block(nt, x, ib, row + ib * sizeof(struct blk_q5_k), true, u, acc);
            else
                k45_block(nt, x, ib, row + ib * sizeof(struct blk_q4_k), false, u, acc);
        }
    }
    store_tile(j, t, r, nt, 1, u, acc);
}

MM_DIRECT_KERNEL(T256, k256_q40_direct, direct_row, DT_Q4_0)
MM_DIRECT_KERNEL(T256, k256_q41_direct, direct_row, DT_Q4_1)
MM_DIRECT_KERNEL(T256, k256_q50_direct, direct_row, DT_Q5_0)
MM_DIRECT_KERNEL(T256, k256_q51_direct, direct_row, DT_Q5_1)
MM_DIRECT_KERNEL(T256, k256_q4k_direct, direct_row, DT_Q4_K)
MM_DIRECT_KERNEL(T256, k256_q5k_direct, direct_row, DT_Q5_K)
MM_DIRECT_KERNEL(T256, k256_q6k_direct, direct_row, DT_Q6_K)
MM_DIRECT_KERNEL(T256, k256_q2k_direct, direct_row, DT_Q2_K)
MM_DIRECT_KERNEL(T256, k256_q3k_direct, direct_row, DT_Q3_K)

const struct mm_kernel *mm_direct_kernel_avx2(enum dtype dt)
{
    switch (dt) {
    case DT_Q4_0: return &k256_q40_direct;
    case DT_Q4_1: return &k256_q41_direct;
    case DT_Q5_0: return &k256_q50_direct;
    case DT_Q5_1: return &k256_q51_direct;
    case DT_Q4_K: return &k256_q4k_direct;
    case DT_Q5_K: return &k256_q5k_direct;
    case DT_Q6_K: return &k256_q6k_direct;
    case DT_Q2_K: return &k256_q2k_direct;
    case DT_Q3_K: return &k256_q3k_direct;
    default: return NULL;
    }
}

const struct mm_kernel *mm_kernel_avx2(enum dtype dt)
{
    switch (dt) {
    case DT_F32: return &k256_f32;
    case DT_F16: return &k256_f16;
    case DT_BF16: return &k256_bf16;
    case DT_Q8_0: return &k256_q8_0;
    default: return NULL;
    }
}

/* ---- prompts of the integer-code formats: 16-row panels (matmul_avx512.c
 * says why), as two halves of 8 rows a ymm ----
 *
 * Without vpdpbusd, four values of 8 rows against a token's four
 * (broadcast) are maddubs (pairs, int16), and a unit's four such steps
 * are added in pairs in int16 before madd widens them: a pair of products
 * is at most 2 * 63 * 127, so two of them still fit. */

#define PANEL_TOKENS 4 /* 4 int32 and 4 f32 accumulators of 16 ymm */

/* out[t0 .. t0 + nt)[8h .. 8h + 8) (the rows below ns) of a panel. */
INLINE T256 void panel_half(int nt, const struct mm_job *j, const uint8_t *panel, int64_t t0,
                            int h, int64_t ns)
{
    const int64_t ng = (j->cols + UNPACK_GROUP - 1) / UNPACK_GROUP;
    const __m256i ones = _mm256_set1_epi16(1);
    const uint8_t *x[PANEL_TOKENS];
    __m256 acc[PANEL_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        x[t] = j->xq + (t0 + t) * j->xq_stride;
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *pg = panel + g * MM_PANEL_GROUP_BYTES + 32 * h;
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            __m256i w[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
                w[k] = _mm256_loadu_si256((const __m256i *)(pg + 64 * (4 * q + k)));
            const __m256 s = _mm256_loadu_ps((const float *)(pg + MM_PANEL_S + 64 * q));
            const __m256 m = _mm256_loadu_ps((const float *)(pg + MM_PANEL_M + 64 * q));
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const uint8_t *xq = x[t] + g * UNPACK_GROUP_BYTES + 16 * q;
                int32_t xv[4];
                memcpy(xv, xq, 16);
                const __m256i p01 =
                    _mm256_add_epi16(_mm256_maddubs_epi16(w[0], _mm256_set1_epi32(xv[0])),
                                     _mm256_maddubs_epi16(w[1], _mm256_set1_epi32(xv[1])));
                const __m256i p23 =
                    _mm256_add_epi16(_mm256_maddubs_epi16(w[2], _mm256_set1_epi32(xv[2])),
                                     _mm256_maddubs_epi16(w[3], _mm256_set1_epi32(xv[3])));
                const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(p01, ones),
                                                     _mm256_madd_epi16(p23, ones));
                /* the unit's activation scale and sum (j->xu) */
                const float *u = j->xu + (t0 + t) * j->xu_stride + 8 * g + 2 * q;
                const __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                                 _mm256_mul_ps(s, _mm256_set1_ps(u[0])), acc[t]);
                acc[t] = _mm256_fnmadd_ps(m, _mm256_set1_ps(u[1]), a);
            }
        }
    }
    const int64_t live = ns - 8 * h; /* rows of this half below ns */
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)live),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++)
        _mm256_maskstore_ps(j->out + (t0 + t) * j->rows + 8 * h, keep, acc[t]);
}

T256 void mm_panel_run_avx2(const struct mm_job *j, const uint8_t *panel, int64_t ns)
{
    for (int h = 0; h < 2 && 8 * h < ns; h++) {
        int64_t t = 0;
        for (; t + PANEL_TOKENS <= j->n; t += PANEL_TOKENS)
            panel_half(PANEL_TOKENS, j, panel, t, h, ns);
        switch (j->n - t) {
        case 1: panel_half(1, j, panel, t, h, ns); break;
        case 2: panel_half(2, j, panel, t, h, ns); break;
        case 3: panel_half(3, j, panel, t, h, ns); break;
        default: break;
        }
    }
}
