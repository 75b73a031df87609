/* matmul_avx512.c - AVX-512 kernels: f32/f16/bf16 weights with f32 FMA, and
 * Q8_0 and the integer-code formats (GGUF's 2-6-bit ones) with VNNI
 * integer dot products.
 *
 * Every function carries its own target attribute so the rest of the binary
 * stays runnable on CPUs without AVX-512; matmul.c only calls in here after
 * cpu_isa_hw() said yes. Tiles are written once as always-inline templates
 * over (tokens mr, weight rows nr, independent accumulator sets u) and
 * instantiated for the shapes the driver needs; u > 1 hides the FMA latency
 * when a tile is too small to have enough independent sums of its own. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cpu/matmul_impl.h"
#include "backend/cpu/unpack.h"
#include "model/quant_dq.h"

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define T512VNNI                                                               \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

#define MR 4 /* tokens per tile */
#define NR 4 /* weight rows per tile */
#define UMAX 4
#define STREAM_MAX_N 4 /* = MR: the streaming kernel reads weights once for n <= 4 */

/* Accumulator sets needed to keep about four FMA chains in flight. */
#define UNROLL(mr, nr) ((mr) * (nr) >= 4 ? 1 : 4 / ((mr) * (nr)))

/* Sums of four vectors: returns {sum a, sum b, sum c, sum d}. Cheaper than
 * four separate reductions because the shuffles are shared. */
INLINE T512 __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d)
{
#define HALF8(v)                                                               \
    _mm256_add_ps(_mm512_castps512_ps256(v),                                   \
                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
    __m256 ab = _mm256_hadd_ps(HALF8(a), HALF8(b));
    __m256 cd = _mm256_hadd_ps(HALF8(c), HALF8(d));
#undef HALF8
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* Folds the u accumulator sets into the first and writes the mr x nr sums
 * to out[t + i][r + c]. */
INLINE T512 void store_tile(const struct mm_job *j, int64_t t, int64_t r, int mr, int nr, int u,
                            __m512 acc[UMAX][MR][NR])
{
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
#pragma GCC unroll 4
        for (int c = 0; c < nr; c++) {
#pragma GCC unroll 4
            for (int q = 1; q < u; q++)
                acc[0][i][c] = _mm512_add_ps(acc[0][i][c], acc[q][i][c]);
        }
        float *o = j->out + (t + i) * j->rows + r;
        if (nr == 4) {
            _mm_storeu_ps(o, hsum4(acc[0][i][0], acc[0][i][1], acc[0][i][2], acc[0][i][3]));
        } else {
#pragma GCC unroll 4
            for (int c = 0; c < nr; c++)
                o[c] = _mm512_reduce_add_ps(acc[0][i][c]);
        }
    }
}

INLINE T512 void zero_acc(int mr, int nr, int u, __m512 acc[UMAX][MR][NR])
{
#pragma GCC unroll 4
    for (int q = 0; q < u; q++)
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
            for (int c = 0; c < nr; c++)
                acc[q][i][c] = _mm512_setzero_ps();
}

/* Tiles of nr rows read nr interleaved runs of memory, which the hardware
 * prefetchers follow badly, so a full tile asks for the same columns of
 * the rows two tiles ahead, into L2 (measured on Zen 4 for n = 5..16: 1.4x
 * over no prefetch; two tiles beat one, and L2 beats L1, whose few miss
 * buffers then fill up). Only the first token tile of a row tile misses in
 * cache; for the others these are cheap hits. Prefetches never fault, even
 * past the end of the matrix. */
INLINE T512 void prefetch_next_tile(int nr, const void *p, size_t stride)
{
    if (nr == NR)
        _mm_prefetch((const char *)((uintptr_t)p + 2 * NR * stride), _MM_HINT_T1);
}

/* ---- f32 / f16 / bf16 ---- */

/* 16 weights from element k of a row, widened to f32; m masks the tail. */
INLINE T512 __m512 load_w16(enum dtype dt, const uint8_t *row, int64_t k, __mmask16 m)
{
    switch (dt) {
    case DT_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k));
    case DT_BF16: /* bf16 is the top half of an f32 */
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k)), 16));
    default:
        return _mm512_maskz_loadu_ps(m, (const float *)row + k);
    }
}

/* One step of 16 columns for the whole tile. */
INLINE T512 void ftile_step(enum dtype dt, int mr, int nr, const float *const *x,
                            const uint8_t *const *w, size_t stride, int64_t k, __mmask16 m,
                            __m512 acc[MR][NR])
{
    __m512 wv[NR];
    size_t es = dt == DT_F32 ? 4 : 2;
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++) {
        wv[c] = load_w16(dt, w[c], k, m);
        /* every step, not once per line: a branch here stops clang from
         * keeping the accumulators in registers */
        prefetch_next_tile(nr, w[c] + k * es, stride);
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        __m512 xv = _mm512_maskz_loadu_ps(m, x[i] + k);
#pragma GCC unroll 4
        for (int c = 0; c < nr; c++)
            acc[i][c] = _mm512_fmadd_ps(xv, wv[c], acc[i][c]);
    }
}

INLINE T512 void ftile(enum dtype dt, int mr, int nr, const struct mm_job *j, int64_t t,
                       int64_t r)
{
    const int u = UNROLL(mr, nr);
    const float *x[MR];
    const uint8_t *w[NR];
    __m512 acc[UMAX][MR][NR];
    zero_acc(mr, nr, u, acc);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
        x[i] = j->x + (t + i) * j->cols;
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++)
        w[c] = j->w + (r + c) * j->w_stride;
    int64_t k = 0;
    for (; k + 16 * u <= j->cols; k += 16 * u)
#pragma GCC unroll 4
        for (int q = 0; q < u; q++)
            ftile_step(dt, mr, nr, x, w, j->w_stride, k + 16 * q, 0xffff, acc[q]);
    for (; k + 16 <= j->cols; k += 16)
        ftile_step(dt, mr, nr, x, w, j->w_stride, k, 0xffff, acc[0]);
    if (k < j->cols) {
        __mmask16 tail = (__mmask16)((1u << (j->cols - k)) - 1);
        ftile_step(dt, mr, nr, x, w, j->w_stride, k, tail, acc[0]);
    }
    store_tile(j, t, r, mr, nr, u, acc);
}

INLINE T512 void frows(enum dtype dt, int nt, const struct mm_job *j, int64_t t, int64_t r0,
                       int64_t r1)
{
    for (int64_t r = r0; r < r1; r++)
        ftile(dt, nt, 1, j, t, r);
}

#define FKERNEL(name, dt)                                                      \
    static T512 void name##_4x4(const struct mm_job *j, int64_t t, int64_t r)  \
    { ftile(dt, 4, 4, j, t, r); }                                              \
    static T512 void name##_1x4(const struct mm_job *j, int64_t t, int64_t r)  \
    { ftile(dt, 1, 4, j, t, r); }                                              \
    static T512 void name##_4x1(const struct mm_job *j, int64_t t, int64_t r)  \
    { ftile(dt, 4, 1, j, t, r); }                                              \
    static T512 void name##_1x1(const struct mm_job *j, int64_t t, int64_t r)  \
    { ftile(dt, 1, 1, j, t, r); }                                              \
    static T512 void name##_stream(const struct mm_job *j, int64_t t, int nt,    \
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
        MR, NR, STREAM_MAX_N, name##_stream, name##_4x4, name##_1x4,             \
        name##_4x1, name##_1x1, NULL, NULL};

FKERNEL(k512_f32, DT_F32)
FKERNEL(k512_f16, DT_F16)
FKERNEL(k512_bf16, DT_BF16)

/* ---- bf16 weights by bf16 dot products (AVX512_BF16), for prompts ----
 *
 * The f32 tiles above widen every bf16 weight and spend one FMA a value:
 * at 16 multiply-adds an instruction they are at the FMA pipes' peak.
 * vdpbf16ps multiplies 32 pairs of bf16 and adds them into 16 f32 sums,
 * twice the work an instruction, with no widening, once the activations
 * are rounded to bf16 too (nearest even; a relative 2^-9 a value, what a
 * bf16 model's own activations carry in the framework it was trained in).
 * The driver takes it for prompts only (matmul.c), so decoding keeps its
 * f32 activations.
 *
 * Activation row: cols bf16 values, zeros up to a multiple of 32. */

#define T512BF16                                                               \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))

static size_t bf16dot_xq_row_bytes(int64_t cols)
{
    return mm_round_up((size_t)cols * 2, 64);
}

static T512BF16 void bf16dot_xq_quantize(const float *x, uint8_t *dst, int64_t cols)
{
    for (int64_t k = 0; k < cols; k += 32) {
        const int64_t left = cols - k;
        const __mmask16 lo = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        const __mmask16 hi = left >= 32 ? 0xffff : left <= 16 ? 0
                           : (__mmask16)((1u << (left - 16)) - 1);
        const __m512 a = _mm512_maskz_loadu_ps(lo, x + k);
        const __m512 b = _mm512_maskz_loadu_ps(hi, x + k + 16);
        _mm512_storeu_si512(dst + 2 * k, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
}

/* One step of 32 columns for the whole tile; m masks the weights' tail
 * (the activations' is zeros). */
INLINE T512BF16 void btile_step(int mr, int nr, const uint8_t *const *x,
                                const uint8_t *const *w, size_t stride, int64_t k,
                                __mmask32 m, __m512 acc[MR][NR])
{
    __m512i wv[NR];
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++) {
        wv[c] = _mm512_maskz_loadu_epi16(m, w[c] + 2 * k);
        prefetch_next_tile(nr, w[c] + 2 * k, stride);
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        const __m512i xv = _mm512_loadu_si512(x[i] + 2 * k);
#pragma GCC unroll 4
        for (int c = 0; c < nr; c++)
            acc[i][c] = _mm512_dpbf16_ps(acc[i][c], (__m512bh)xv, (__m512bh)wv[c]);
    }
}

INLINE T512BF16 void btile(int mr, int nr, const struct mm_job *j, int64_t t, int64_t r)
{
    const int u = UNROLL(mr, nr);
    const uint8_t *x[MR], *w[NR];
    __m512 acc[UMAX][MR][NR];
    zero_acc(mr, nr, u, acc);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
        x[i] = j->xq + (t + i) * j->xq_stride;
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++)
        w[c] = j->w + (r + c) * j->w_stride;
    int64_t k = 0;
    for (; k + 32 * u <= j->cols; k += 32 * u)
#pragma GCC unroll 4
        for (int q = 0; q < u; q++)
            btile_step(mr, nr, x, w, j->w_stride, k + 32 * q, 0xffffffffu, acc[q]);
    for (; k + 32 <= j->cols; k += 32)
        btile_step(mr, nr, x, w, j->w_stride, k, 0xffffffffu, acc[0]);
    if (k < j->cols)
        btile_step(mr, nr, x, w, j->w_stride, k, (__mmask32)((1ull << (j->cols - k)) - 1),
                   acc[0]);
    store_tile(j, t, r, mr, nr, u, acc);
}

static T512BF16 void k512_bf16dot_4x4(const struct mm_job *j, int64_t t, int64_t r)
{ btile(4, 4, j, t, r); }
static T512BF16 void k512_bf16dot_1x4(const struct mm_job *j, int64_t t, int64_t r)
{ btile(1, 4, j, t, r); }
static T512BF16 void k512_bf16dot_4x1(const struct mm_job *j, int64_t t, int64_t r)
{ btile(4, 1, j, t, r); }
static T512BF16 void k512_bf16dot_1x1(const struct mm_job *j, int64_t t, int64_t r)
{ btile(1, 1, j, t, r); }
static const struct mm_kernel k512_bf16dot = {
    MR, NR, 0, NULL, k512_bf16dot_4x4, k512_bf16dot_1x4, k512_bf16dot_4x1, k512_bf16dot_1x1,
    bf16dot_xq_row_bytes, bf16dot_xq_quantize};

const struct mm_kernel *mm_bf16dot_kernel_avx512(void) { return &k512_bf16dot; }


/* ---- Q8_0 with VNNI ----
 *
 * vpdpbusd multiplies unsigned by signed bytes. The weights are made
 * unsigned by flipping their sign bit (w + 128), which costs one xor per
 * weight vector, shared by the mr tokens of a tile; the extra 128 * sum(x)
 * is cancelled by starting each block's int32 sum at -128 * sum(x), a
 * constant of the activation block computed when x is quantized. Unlike the
 * abs/sign trick this is exact for a weight of -128 too.
 *
 * A 512-bit vector holds two blocks (qs of blocks 2g and 2g+1; lanes 0-7
 * belong to the first, 8-15 to the second), so per-lane scales are the two
 * block scales each broadcast to eight lanes.
 *
 * Activation row layout: ng groups of 192 bytes, each
 *   qs   [64] int8    blocks 2g and 2g+1 (an odd last block is padded with
 *                     a zero block)
 *   d    [16] f32     the two block scales, each in eight lanes
 *   corr [16] int32   -128 * sum(qs) of each block, in lanes 0 and 8
 * The scales are stored expanded, three times the bytes of a packed form,
 * so that the inner loop uses them straight from memory instead of
 * spending two shuffles per activation vector on them.
 */

#define XG_BYTES 192

static size_t vnni_xq_row_bytes(int64_t cols)
{
    int64_t ng = (cols / Q8_0_BLOCK + 1) / 2;
    return (size_t)ng * XG_BYTES;
}

/* One block: scale = absmax / 127 as ggml does, values rounded to nearest
 * (ties to even; ggml rounds ties away, a difference far below the
 * quantization error). Returns the sum of the quantized values. */
INLINE T512 int32_t vnni_quantize_block(const float *x, int8_t *qs, float *d)
{
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    __m512 m = _mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b));
    float amax = _mm512_reduce_max_ps(m);
    float dd = amax / 127.0f;
    __m512 id = _mm512_set1_ps(dd != 0.0f ? 1.0f / dd : 0.0f);
    __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, id));
    __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, id));
    _mm_storeu_si128((__m128i *)qs, _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtepi32_epi8(qb));
    *d = dd;
    return _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
}

static T512 void vnni_xq_quantize(const float *x, uint8_t *dst, int64_t cols)
{
    int64_t nb = cols / Q8_0_BLOCK;
    for (int64_t b = 0; b < nb + (nb % 2); b++) {
        uint8_t *grp = dst + (b / 2) * XG_BYTES;
        int8_t *qs = (int8_t *)grp + (b % 2) * Q8_0_BLOCK;
        float *d = (float *)(grp + 64) + (b % 2) * 8;
        int32_t *corr = (int32_t *)(grp + 128) + (b % 2) * 8;
        float db = 0.0f;
        int32_t sum = 0;
        if (b < nb)
            sum = vnni_quantize_block(x + b * Q8_0_BLOCK, qs, &db);
        else
            memset(qs, 0, Q8_0_BLOCK);
        for (int i = 0; i < 8; i++) {
            d[i] = db;
            corr[i] = i == 0 ? -128 * sum : 0;
        }
    }
}

/* Accumulates group g (blocks 2g, 2g+1) of the tile. `whole` is false for
 * an odd last block, whose missing partner must not be read. */
INLINE T512VNNI void vnni_step(int mr, int nr, const uint8_t *const *x,
                               const struct block_q8_0 *const *w, size_t stride, int64_t g,
                               int whole, __m512 acc[MR][NR])
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512i wu[NR];
    __m512 wd[NR];
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++) {
        const struct block_q8_0 *b = w[c] + 2 * g;
        prefetch_next_tile(nr, b, stride);
        __m256i lo = _mm256_loadu_si256((const __m256i *)b[0].qs);
        __m256i hi = whole ? _mm256_loadu_si256((const __m256i *)b[1].qs) : _mm256_setzero_si256();
        wu[c] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), flip);
        uint32_t dd = b[0].d | (whole ? (uint32_t)b[1].d << 16 : 0);
        __m128 d2 = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd));
        wd[c] = _mm512_permutexvar_ps(pair, _mm512_castps128_ps512(d2));
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        const uint8_t *grp = x[i] + g * XG_BYTES;
        __m512i xv = _mm512_load_si512(grp);
        __m512 xd = _mm512_load_ps(grp + 64);
        __m512i corr = _mm512_load_si512(grp + 128);
#pragma GCC unroll 4
        for (int c = 0; c < nr; c++) {
            __m512i dot = _mm512_dpbusd_epi32(corr, wu[c], xv);
            acc[i][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(xd, wd[c]),
                                        acc[i][c]);
        }
    }
}

INLINE T512VNNI void vnni_tile(int mr, int nr, const struct mm_job *j, int64_t t, int64_t r)
{
    /* A group holds 64 values, so half the unroll of the f32 tiles keeps
     * the same number of sums in flight per byte. */
    const int u = UNROLL(mr, nr) > 1 ? UNROLL(mr, nr) / 2 : 1;
    int64_t nb = j->cols / Q8_0_BLOCK;
    const uint8_t *x[MR];
    const struct block_q8_0 *w[NR];
    __m512 acc[UMAX][MR][NR];
    zero_acc(mr, nr, u, acc);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
        x[i] = j->xq + (t + i) * j->xq_stride;
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++)
        w[c] = (const struct block_q8_0 *)(j->w + (r + c) * j->w_stride);
    int64_t g = 0;
    for (; g + u <= nb / 2; g += u)
#pragma GCC unroll 4
        for (int q = 0; q < u; q++)
            vnni_step(mr, nr, x, w, j->w_stride, g + q, 1, acc[q]);
    for (; g < nb / 2; g++)
        vnni_step(mr, nr, x, w, j->w_stride, g, 1, acc[0]);
    if (nb % 2)
        vnni_step(mr, nr, x, w, j->w_stride, nb / 2, 0, acc[0]);
    store_tile(j, t, r, mr, nr, u, acc);
}

MM_INT_KERNEL(T512VNNI, k512_q8_0, vnni_tile, vnni_xq_row_bytes, vnni_xq_quantize)

/* ---- the integer-code formats with VNNI (matmul_impl.h, unpack.h) ----
 *
 * A group of 64 values is one vector of codes and one of activations;
 * vpdpbusd's lanes (four values each) are the lanes of the group's s, m,
 * d and xs, so a lane's sum is scaled and its min taken straight from
 * memory: dot, convert, (s d) dot + acc, acc - m xs. The codes are at most
 * 63, so vpdpbusd's unsigned operand needs no flip as Q8_0's does. */

INLINE T512VNNI void codes_step(int mr, int nr, const uint8_t *const *x, const uint8_t *const *w,
                                int64_t g, __m512 acc[MR][NR])
{
    __m512i wu[NR];
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++)
        wu[c] = _mm512_loadu_si512(w[c] + g * UNPACK_GROUP_BYTES);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        const uint8_t *q = x[i] + g * UNPACK_GROUP_BYTES;
        const __m512i xv = _mm512_loadu_si512(q);
        const __m512 xd = _mm512_loadu_ps(q + 64), xs = _mm512_loadu_ps(q + 128);
#pragma GCC unroll 4
        for (int c = 0; c < nr; c++) {
            const float *sm = (const float *)(w[c] + g * UNPACK_GROUP_BYTES + 64);
            const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wu[c], xv);
            __m512 a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                       _mm512_mul_ps(_mm512_loadu_ps(sm), xd), acc[i][c]);
            acc[i][c] = _mm512_fnmadd_ps(_mm512_loadu_ps(sm + 16), xs, a);
        }
    }
}

INLINE T512VNNI void codes_tile(int mr, int nr, const struct mm_job *j, int64_t t, int64_t r)
{
    const int u = UNROLL(mr, nr);
    const int64_t ng = (j->cols + UNPACK_GROUP - 1) / UNPACK_GROUP;
    const uint8_t *x[MR], *w[NR];
    __m512 acc[UMAX][MR][NR];
    zero_acc(mr, nr, u, acc);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
        x[i] = j->xq + (t + i) * j->xq_stride;
#pragma GCC unroll 4
    for (int c = 0; c < nr; c++)
        w[c] = j->w + (r + c) * j->w_stride;
    int64_t g = 0;
    for (; g + u <= ng; g += u)
#pragma GCC unroll 4
        for (int q = 0; q < u; q++)
            codes_step(mr, nr, x, w, g + q, acc[q]);
    for (; g < ng; g++)
        codes_step(mr, nr, x, w, g, acc[0]);
    store_tile(j, t, r, mr, nr, u, acc);
}

MM_INT_KERNEL(T512VNNI, k512_codes, codes_tile, mm_codes_xq_row_bytes,
              mm_codes_xq_quantize_avx2)

const struct mm_kernel *mm_codes_kernel_avx512(int vnni)
{
    return vnni ? &k512_codes : NULL; /* the AVX2 kernel covers it */
}

/* ---- Q4_0, Q4_1, Q5_0, Q5_1 and the K formats read from their blocks,
 * for up to STREAM_MAX_N tokens (matmul_impl.h's direct kernels) ----
 *
 * For a few tokens, the slab path's unpacking (192 bytes written and read
 * back for every 64 values) is most of a row's work. These kernels build
 * the two vectors a group takes (its 64 codes, its lanes' s and m: the
 * unpacking's products, in its lanes) in registers from the row's blocks,
 * and run codes_step's arithmetic on them with codes_tile's accumulators,
 * so their outputs have the slab path's bits. */

/* The products of one group g of a direct kernel's row (its codes wu, its
 * lanes' s and m) with each of nt tokens' activations, into ac:
 * codes_step's arithmetic for one row. */
INLINE T512VNNI void direct_group(int nt, const uint8_t *const *x, int64_t g, __m512i wu,
                                  __m512 sl, __m512 ml, __m512 ac[MR][NR])
{
#pragma GCC unroll 4
    for (int i = 0; i < nt; i++) {
        const uint8_t *qx = x[i] + g * UNPACK_GROUP_BYTES;
        const __m512i xv = _mm512_loadu_si512(qx);
        const __m512 xd = _mm512_loadu_ps(qx + 64), xs = _mm512_loadu_ps(qx + 128);
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wu, xv);
        __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sl, xd), ac[i][0]);
        ac[i][0] = _mm512_fnmadd_ps(ml, xs, t);
    }
}

/* A Q4_K or (five) Q5_K block ib into acc: group c is its 32 bytes of qs
 * 32c .. in both nibbles (low: values 64c .., high: 64c + 32 ..; Q5_K's
 * fifth bits from bits 2c and 2c + 1 of qh), with k_scales8's s and m of
 * groups 2c and 2c + 1, permuted as k_group places them. */
INLINE T512VNNI void k45_block(int nt, const uint8_t *const *x, int64_t ib, const uint8_t *blk,
                               bool five, int u, __m512 acc[UMAX][MR][NR])
{
    const struct blk_q4_k *b4 = (const struct blk_q4_k *)blk;
    const struct blk_q5_k *b5 = (const struct blk_q5_k *)blk;
    const uint8_t *qs = five ? b5->qs : b4->qs; /* d, dmin, scales: the same offsets */
    const __m256i lo4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)b5->qh) : _mm256_setzero_si256();
    uint64_t sc, mn;
    k_scale_bytes(b4->scales, &sc, &mn);
    const __m512 s16 = _mm512_castps256_ps512(_mm256_mul_ps(
        _mm256_set1_ps(_cvtsh_ss(b4->d)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)))));
    const __m512 m16 = _mm512_castps256_ps512(_mm256_mul_ps(
        _mm256_set1_ps(_cvtsh_ss(b4->dmin)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)))));
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(q, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4);
        if (five) {
            const __m128i s1 = _mm_cvtsi32_si128(2 * c), s2 = _mm_cvtsi32_si128(2 * c + 1);
            lo = _mm256_or_si256(
                lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s1), one), 4));
            hi = _mm256_or_si256(
                hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s2), one), 4));
        }
        const __m512i wu = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        /* lanes 0-7: group 2c's s and m, 8-15: group 2c + 1's */
        const __m512i gi =
            _mm512_inserti64x4(_mm512_set1_epi32(2 * c), _mm256_set1_epi32(2 * c + 1), 1);
        const __m512 sl = _mm512_permutexvar_ps(gi, s16), ml = _mm512_permutexvar_ps(gi, m16);
        /* codes_tile's accumulators: group g in set g % u */
        direct_group(nt, x, 4 * ib + c, wu, sl, ml, acc[c % u]);
    }
}

/* A Q6_K block ib into acc (q6_k_rows in registers): half n is groups 2n
 * (runs of ql[0..32) and ql[32..64), low nibbles, with qh's bits 0-1 and
 * 2-3) and 2n + 1 (their high nibbles, qh's bits 4-5 and 6-7); lane l of
 * group 2n + k takes unit 8n + 4k + l / 4's scale, d times the int8
 * scale, and m = 32 s. */
INLINE T512VNNI void q6k_block(int nt, const uint8_t *const *x, int64_t ib,
                               const struct blk_q6_k *b, int u, __m512 acc[UMAX][MR][NR])
{
    const __m256i lo4 = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    const __m512 k32 = _mm512_set1_ps(32.0f);
    const __m512i ui[2] = {
        _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
        _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7)};
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
    const __m128i sc = _mm_loadu_si128((const __m128i *)b->scales);
#pragma GCC unroll 2
    for (int n = 0; n < 2; n++) {
        /* d sc of half n's eight units, the reference's products */
        const __m512 v = _mm512_castps256_ps512(_mm256_mul_ps(
            d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(n ? _mm_srli_si128(sc, 8) : sc))));
        const __m256i a = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * n));
        const __m256i c = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * n + 32));
        const __m256i e = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * n));
#pragma GCC unroll 2
        for (int k = 0; k < 2; k++) {
            /* byte shifts through 16-bit lanes, masked after */
            const __m256i al = k ? _mm256_and_si256(_mm256_srli_epi16(a, 4), lo4)
                                 : _mm256_and_si256(a, lo4);
            const __m256i cl = k ? _mm256_and_si256(_mm256_srli_epi16(c, 4), lo4)
                                 : _mm256_and_si256(c, lo4);
            const __m256i h0 =
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(e, 4 * k), three), 4);
            const __m256i h1 =
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(e, 4 * k + 2), three), 4);
            const __m512i wu = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_or_si256(al, h0)), _mm256_or_si256(cl, h1), 1);
            const __m512 sl = _mm512_permutexvar_ps(ui[k], v), ml = _mm512_mul_ps(k32, sl);
            direct_group(nt, x, 4 * ib + 2 * n + k, wu, sl, ml, acc[(2 * n + k) % u]);
        }
    }
}

/* Bit b of each byte of hm moved to bit 2, the rest cleared (Q3_K's
 * third bit of a code): one shift through 16-bit lanes, then the mask. */
INLINE T512VNNI __m256i hmask_bit(__m256i hm, int b)
{
    const __m256i v = b >= 2 ? _mm256_srli_epi16(hm, b - 2) : _mm256_slli_epi16(hm, 2 - b);
    return _mm256_and_si256(v, _mm256_set1_epi8(4));
}

/* A Q2_K or (three) Q3_K block ib into acc (unpack.c's codes_q2_k /
 * codes_q3_k in registers): group g = 2n + k is runs 2k and 2k + 1 of
 * half n, the two bits at 2 run of qs[32n ..) (Q3_K's third from bit
 * 4n + run of hmask); lane l takes 16-unit 4g + l / 4's s and m. */
INLINE T512VNNI void k23_block(int nt, const uint8_t *const *x, int64_t ib, const uint8_t *blk,
                               bool three, int u, __m512 acc[UMAX][MR][NR])
{
    const struct blk_q2_k *b2 = (const struct blk_q2_k *)blk;
    const struct blk_q3_k *b3 = (const struct blk_q3_k *)blk;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m512i quarter = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const uint8_t *qs = three ? b3->qs : b2->qs;
    const __m256i hm =
        three ? _mm256_loadu_si256((const __m256i *)b3->hmask) : _mm256_setzero_si256();
    __m512 s16, m16; /* the reference's products */
    if (three) {
        uint32_t sc[4];
        q3_k_scale_words(b3->scales, sc);
        const __m128i sc16 = _mm_setr_epi32((int)sc[0], (int)sc[1], (int)sc[2], (int)sc[3]);
        const __m512i v = _mm512_sub_epi32(_mm512_cvtepi8_epi32(sc16), _mm512_set1_epi32(32));
        s16 = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b3->d)), _mm512_cvtepi32_ps(v));
        m16 = _mm512_mul_ps(_mm512_set1_ps(4.0f), s16);
    } else {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b2->scales));
        s16 = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b2->d)),
                            _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xF))));
        m16 = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b2->dmin)),
                            _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)));
    }
#pragma GCC unroll 2
    for (int n = 0; n < 2; n++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * n));
#pragma GCC unroll 2
        for (int k = 0; k < 2; k++) {
            __m256i c[2];
#pragma GCC unroll 2
            for (int hh = 0; hh < 2; hh++) {
                /* byte shifts through 16-bit lanes, masked after */
                const int run = 2 * k + hh;
                c[hh] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * run), m3);
                if (three)
                    c[hh] = _mm256_or_si256(c[hh], hmask_bit(hm, 4 * n + run));
            }
            const int g = 2 * n + k;
            const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(4 * g), quarter);
            const __m512i wu = _mm512_inserti64x4(_mm512_castsi256_si512(c[0]), c[1], 1);
            direct_group(nt, x, 4 * ib + g, wu, _mm512_permutexvar_ps(idx, s16),
                         _mm512_permutexvar_ps(idx, m16), acc[g % u]);
        }
    }
}

/* A Q4_0, Q4_1, Q5_0 or Q5_1 32-block at p as unpack.c's codes_q32 has
 * it: its 32 codes in value order (low nibbles, then high, with the
 * fifth bits of the Q5_* ones), its s and m. */
INLINE T512VNNI __m256i q32_codes(const uint8_t *p, enum dtype dt, float *s, float *m)
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
        /* qh's bit k is value k's fifth bit */
        c = _mm256_or_si256(c, _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10)));
    }
    return c;
}

/* Group g of a row of one of the 32-block formats (blocks 2g and 2g + 1
 * of nb, bb bytes each; a missing second block is the slab's zeros) into
 * ac. */
INLINE T512VNNI void q32_group(int nt, const uint8_t *const *x, int64_t g, const uint8_t *row,
                               int64_t nb, size_t bb, enum dtype dt, __m512 ac[MR][NR])
{
    float s0, m0, s1 = 0.0f, m1 = 0.0f;
    const __m256i c0 = q32_codes(row + (size_t)(2 * g) * bb, dt, &s0, &m0);
    const __m256i c1 = 2 * g + 1 < nb ? q32_codes(row + (size_t)(2 * g + 1) * bb, dt, &s1, &m1)
                                      : _mm256_setzero_si256();
    /* lanes 0-7 the first block's, 8-15 the second's */
    const __m512 sl = _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castps_pd(_mm512_set1_ps(s0)), _mm256_castps_pd(_mm256_set1_ps(s1)), 1));
    const __m512 ml = _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castps_pd(_mm512_set1_ps(m0)), _mm256_castps_pd(_mm256_set1_ps(m1)), 1));
    direct_group(nt, x, g, _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1), sl, ml, ac);
}

/* Row r of a matrix of one of the 2-6-bit formats against nt tokens. */
INLINE T512VNNI void direct_row(enum dtype dt, int nt, const struct mm_job *j,
                                int64_t t, int64_t r)
{
    const int u = UNROLL(nt, 1);
    const uint8_t *x[MR];
    __m512 acc[UMAX][MR][NR];
    zero_acc(nt, 1, u, acc);
#pragma GCC unroll 4
    for (int i = 0; i < nt; i++)
        x[i] = j->xq + (t + i) * j->xq_stride;
    const uint8_t *row = j->w + r * j->w_stride;
    if (dtype_block_elems(dt) == 32) {
        /* codes_tile's accumulators: group g in set g % u, but the last
         * ng % u groups in set 0 */
        const int64_t nb = j->cols / 32, ng = (nb + 1) / 2, main = ng - ng % u;
        const size_t bb = dtype_row_bytes(dt, 32);
        for (int64_t g = 0; g < ng; g++)
            q32_group(nt, x, g, row, nb, bb, dt, acc[g < main ? g % u : 0]);
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

MM_DIRECT_KERNEL(T512VNNI, k512_q40_direct, direct_row, DT_Q4_0)
MM_DIRECT_KERNEL(T512VNNI, k512_q41_direct, direct_row, DT_Q4_1)
MM_DIRECT_KERNEL(T512VNNI, k512_q50_direct, direct_row, DT_Q5_0)
MM_DIRECT_KERNEL(T512VNNI, k512_q51_direct, direct_row, DT_Q5_1)
MM_DIRECT_KERNEL(T512VNNI, k512_q4k_direct, direct_row, DT_Q4_K)
MM_DIRECT_KERNEL(T512VNNI, k512_q5k_direct, direct_row, DT_Q5_K)
MM_DIRECT_KERNEL(T512VNNI, k512_q6k_direct, direct_row, DT_Q6_K)
MM_DIRECT_KERNEL(T512VNNI, k512_q2k_direct, direct_row, DT_Q2_K)
MM_DIRECT_KERNEL(T512VNNI, k512_q3k_direct, direct_row, DT_Q3_K)

const struct mm_kernel *mm_direct_kernel_avx512(enum dtype dt, int vnni)
{
    if (!vnni)
        return NULL; /* the AVX2 kernels, as for the slab path */
    switch (dt) {
    case DT_Q4_0: return &k512_q40_direct;
    case DT_Q4_1: return &k512_q41_direct;
    case DT_Q5_0: return &k512_q50_direct;
    case DT_Q5_1: return &k512_q51_direct;
    case DT_Q4_K: return &k512_q4k_direct;
    case DT_Q5_K: return &k512_q5k_direct;
    case DT_Q6_K: return &k512_q6k_direct;
    case DT_Q2_K: return &k512_q2k_direct;
    case DT_Q3_K: return &k512_q3k_direct;
    default: return NULL;
    }
}

const struct mm_kernel *mm_kernel_avx512(enum dtype dt, int vnni)
{
    switch (dt) {
    case DT_F32: return &k512_f32;
    case DT_F16: return &k512_f16;
    case DT_BF16: return &k512_bf16;
    case DT_Q8_0: return vnni ? &k512_q8_0 : NULL; /* the AVX2 kernel covers it */
    default: return NULL;
    }
}

/* ---- prompts of the integer-code formats: 16-row panels (VNNI) ----
 *
 * codes_tile scales every 4-value lane of a group per token and row
 * (convert, two multiplies, two multiply-adds a 64-value group), so its
 * float work is as large as its integer work. A panel puts 16 rows side
 * by side instead: lane r of a vector is row r, so vpdpbusd sums four
 * values of 16 rows against one token's four (broadcast), four of them
 * sum a 16-value unit in int32, and the unit's s and m (one per row, a
 * vector) scale it once: float work a quarter of the integer work, and
 * no horizontal sums. The panel's layout is matmul_impl.h's. */

#define PANEL_ROWS MM_PANEL_ROWS
_Static_assert(PANEL_ROWS == 16, "a panel's rows are the 16 lanes of a vector");
#define PANEL_TOKENS 8 /* 8 int32 and 8 f32 accumulators; 12 measured no faster */

/* The last round of a 16 x 16 dword transpose: v[i] holds, in 128-bit
 * lane j, one dword of rows 4i .. 4i + 3; the vector of all 16 rows'
 * dword from lane j goes to dst + j * step. */
INLINE T512 void transpose_last(const __m512i v[4], uint8_t *dst, size_t step)
{
    const __m512i lo01 = _mm512_shuffle_i32x4(v[0], v[1], 0x44); /* lanes 0, 1 of each */
    const __m512i hi01 = _mm512_shuffle_i32x4(v[0], v[1], 0xee); /* lanes 2, 3 */
    const __m512i lo23 = _mm512_shuffle_i32x4(v[2], v[3], 0x44);
    const __m512i hi23 = _mm512_shuffle_i32x4(v[2], v[3], 0xee);
    _mm512_storeu_si512(dst, _mm512_shuffle_i32x4(lo01, lo23, 0x88));
    _mm512_storeu_si512(dst + step, _mm512_shuffle_i32x4(lo01, lo23, 0xdd));
    _mm512_storeu_si512(dst + 2 * step, _mm512_shuffle_i32x4(hi01, hi23, 0x88));
    _mm512_storeu_si512(dst + 3 * step, _mm512_shuffle_i32x4(hi01, hi23, 0xdd));
}

/* A group's s (or m) of 16 slab rows (16 floats a row, a unit's value in
 * four lanes) as the panel has them: [4 units][16 rows], unit q from
 * lane 4q of each row; the dword transpose below, only what lanes 0, 4,
 * 8 and 12 need. */
INLINE T512 void panel_units(const uint8_t *src, size_t stride, uint8_t *dst)
{
    __m512i a[4];
    for (int i = 0; i < 4; i++) {
        const uint8_t *p = src + (size_t)(4 * i) * stride;
        const __m512i r01 = _mm512_unpacklo_epi32(_mm512_loadu_si512(p),
                                                  _mm512_loadu_si512(p + stride));
        const __m512i r23 = _mm512_unpacklo_epi32(_mm512_loadu_si512(p + 2 * stride),
                                                  _mm512_loadu_si512(p + 3 * stride));
        a[i] = _mm512_unpacklo_epi64(r01, r23); /* 128-bit lane j: lane 4j of rows 4i .. */
    }
    transpose_last(a, dst, 64);
}

/* mm_panel_build by shuffles: a 16 x 16 transpose of each group's code
 * dwords (row r's lane k to lane r of vector k), and of its s and m the
 * lanes a unit's value is read from. Whole panels only; short ones go
 * to the portable build (the same bytes). */
T512 void mm_panel_build_avx512(const uint8_t *slab, size_t stride, int64_t ns, int64_t cols,
                                uint8_t *panel)
{
    if (ns < MM_PANEL_ROWS) {
        mm_panel_build(slab, stride, ns, cols, panel);
        return;
    }
    const int64_t ng = (cols + UNPACK_GROUP - 1) / UNPACK_GROUP;
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *src = slab + g * UNPACK_GROUP_BYTES;
        uint8_t *pg = panel + g * MM_PANEL_GROUP_BYTES;
        /* the codes, in four rounds of shuffles */
        __m512i a[16], b[16];
        for (int r = 0; r < 16; r++)
            a[r] = _mm512_loadu_si512(src + (size_t)r * stride);
        for (int r = 0; r < 16; r += 2) {
            b[r] = _mm512_unpacklo_epi32(a[r], a[r + 1]);
            b[r + 1] = _mm512_unpackhi_epi32(a[r], a[r + 1]);
        }
        for (int r = 0; r < 16; r += 4) {
            a[r] = _mm512_unpacklo_epi64(b[r], b[r + 2]);
            a[r + 1] = _mm512_unpackhi_epi64(b[r], b[r + 2]);
            a[r + 2] = _mm512_unpacklo_epi64(b[r + 1], b[r + 3]);
            a[r + 3] = _mm512_unpackhi_epi64(b[r + 1], b[r + 3]);
        }
        /* a[4i + c] now holds, in 128-bit lane j, code dword 4j + c of
         * rows 4i .. 4i + 3 */
        for (int i = 0; i < 4; i++)
            for (int c = 0; c < 4; c++)
                b[4 * c + i] = a[4 * i + c];
        /* b[4c + i]: rows 4i .. 4i + 3, 128-bit lane j = lane 4j + c of the
         * codes */
        for (int c = 0; c < 4; c++)
            transpose_last(b + 4 * c, pg + 64 * c, 256);
        panel_units(src + 64, stride, pg + MM_PANEL_S);
        panel_units(src + 128, stride, pg + MM_PANEL_M);
    }
}

/* mm_panel_build_q8_0 by gathers: lane r of each vector from row r, a
 * 4-value lane of a block (xor 0x80: the code) or its scale at a time.
 * Whole panels of an even count of blocks only; the rest go to the
 * portable build (the same bytes). */
T512 void mm_panel_build_q8_0_avx512(const uint8_t *rows, size_t stride, int64_t ns,
                                     int64_t cols, uint8_t *panel)
{
    const int64_t nb = cols / Q8_0_BLOCK;
    if (ns < MM_PANEL_ROWS || nb % 2 || stride * MM_PANEL_ROWS > INT32_MAX) {
        mm_panel_build_q8_0(rows, stride, ns, cols, panel);
        return;
    }
    const __m512i at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6,
                                                           5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32((int)stride));
    const __m512i flip = _mm512_set1_epi32((int)0x80808080u);
    const __m512 m128 = _mm512_set1_ps(128.0f);
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t *b = rows + ib * sizeof(struct block_q8_0);
        uint8_t *pg = panel + (ib / 2) * MM_PANEL_GROUP_BYTES;
        const int h = (int)(ib % 2);
        for (int l = 0; l < 8; l++) {
            const __m512i q = _mm512_i32gather_epi32(at, b + 2 + 4 * l, 1);
            _mm512_storeu_si512(pg + 64 * (8 * h + l), _mm512_xor_si512(q, flip));
        }
        /* the f16 scale is the block's first two bytes */
        const __m512i dw = _mm512_i32gather_epi32(at, b, 1);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw));
        for (int q = 2 * h; q < 2 * h + 2; q++) {
            _mm512_storeu_ps(pg + MM_PANEL_S + 64 * q, d);
            _mm512_storeu_ps(pg + MM_PANEL_M + 64 * q, _mm512_mul_ps(m128, d));
        }
    }
}

/* acc + dot(w, the four signed bytes at p in every lane), the bytes read
 * by the instruction's own broadcast: GCC otherwise spends a separate
 * vpbroadcastd on each, a fifth of the panel's instructions. */
INLINE T512VNNI __m512i dpbusd_bcst(__m512i acc, __m512i w, const uint8_t *p)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const uint32_t *)p));
    return acc;
}

/* out[t0 .. t0 + nt)[0 .. ns) of a panel: nt tokens' sums in one vector
 * each (lane r: row r). */
INLINE T512VNNI void panel_tile(int nt, int uv, const struct mm_job *j, const uint8_t *panel,
                                int64_t t0, int64_t ns)
{
    const int64_t ng = (j->cols + UNPACK_GROUP - 1) / UNPACK_GROUP;
    const int nu = UNPACK_GROUP / uv, lanes = uv / 4; /* scale units a group, lanes a unit */
    const uint8_t *x[PANEL_TOKENS];
    __m512 acc[PANEL_TOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        x[t] = j->xq + (t0 + t) * j->xq_stride;
        acc[t] = _mm512_setzero_ps();
    }
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *pg = panel + g * MM_PANEL_GROUP_BYTES;
#pragma GCC unroll 4
        for (int q = 0; q < nu; q++) {
            __m512i ia[PANEL_TOKENS];
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                ia[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int k = lanes * q; k < lanes * q + lanes; k++) {
                const __m512i w = _mm512_loadu_si512(pg + 64 * k);
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    ia[t] = dpbusd_bcst(ia[t], w, x[t] + g * UNPACK_GROUP_BYTES + 4 * k);
                }
            }
            /* the scale unit's s and m: its first 16-value unit's */
            const __m512 s = _mm512_loadu_ps(pg + MM_PANEL_S + 64 * (lanes / 4) * q);
            const __m512 m = _mm512_loadu_ps(pg + MM_PANEL_M + 64 * (lanes / 4) * q);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                /* the unit's activation scale and sum (j->xu) */
                const float *u = j->xu + (t0 + t) * j->xu_stride + 8 * g + 2 * q;
                const __m512 a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t]),
                                                 _mm512_mul_ps(s, _mm512_set1_ps(u[0])), acc[t]);
                acc[t] = _mm512_fnmadd_ps(m, _mm512_set1_ps(u[1]), a);
            }
        }
    }
    const __mmask16 keep = (__mmask16)((1u << ns) - 1);
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++)
        _mm512_mask_storeu_ps(j->out + (t0 + t) * j->rows, keep, acc[t]);
}

INLINE T512VNNI void panel_run(int uv, const struct mm_job *j, const uint8_t *panel, int64_t ns)
{
    int64_t t = 0;
    for (; t + PANEL_TOKENS <= j->n; t += PANEL_TOKENS)
        panel_tile(PANEL_TOKENS, uv, j, panel, t, ns);
    switch (j->n - t) {
    case 1: panel_tile(1, uv, j, panel, t, ns); break;
    case 2: panel_tile(2, uv, j, panel, t, ns); break;
    case 3: panel_tile(3, uv, j, panel, t, ns); break;
    case 4: panel_tile(4, uv, j, panel, t, ns); break;
    case 5: panel_tile(5, uv, j, panel, t, ns); break;
    case 6: panel_tile(6, uv, j, panel, t, ns); break;
    case 7: panel_tile(7, uv, j, panel, t, ns); break;
    default: break;
    }
}

T512VNNI void mm_panel_run_avx512(const struct mm_job *j, const uint8_t *panel, int64_t ns)
{
    if (j->panel_unit == 32)
        panel_run(32, j, panel, ns);
    else
        panel_run(16, j, panel, ns);
}
