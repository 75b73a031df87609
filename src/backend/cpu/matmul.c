/* matmul.c - CPU linear layers: argument checks, the choice of kernel family,
 * splitting output rows over the thread pool, cache blocking over tokens,
 * and the portable scalar kernels (fallback and test reference).
 *
 * Work is split by weight rows: every thread streams a disjoint part of W,
 * which is what both regimes want (decode reads each weight byte once;
 * prefill reuses a few weight rows from L1 across all tokens of a group). */
#include "backend/cpu/matmul.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul_impl.h"
#include "backend/cpu/unpack.h"
#include "base/half.h"
#include "model/quant.h"

/* Chunks of output rows handed to threads are multiples of this (and so of
 * every kernel's nr). */
#define MM_ROW_ALIGN 16
/* Aim for this many chunks per thread so a thread slowed down by the OS
 * does not hold up the others for long. */
#define MM_CHUNKS_PER_THREAD 4
/* Activations of one token group stay in L2 while every weight tile of a
 * chunk passes over them. */
#define MM_XGROUP_BYTES (256 * 1024)
/* Below this many activation values quantizing on one thread is cheaper
 * than waking the pool for it. */
#define MM_PAR_QUANT_MIN 32768
/* Rows of an integer-code format (unpack.h) are unpacked a slab at a
 * time into the thread's scratch and multiplied from there, while the
 * slab is still in L1 (at 3 bytes a value, a slab of 16 rows of 1,024
 * columns in L2 ran at half the speed, decode and prefill): as many rows
 * as fit MM_SLAB_BYTES, at least one, and for prompts a multiple of the
 * tiles' 4 rows, at most MM_SLAB_ROWS. */
#define MM_SLAB_BYTES (12 * 1024)
#define MM_SLAB_ROWS 16

/* ---- Q8_0 conversions (public; ggml-compatible) ---- */

void quantize_row_q8_0(const float *x, struct block_q8_0 *y, int64_t n)
{
    for (int64_t b = 0; b < n / Q8_0_BLOCK; b++) {
        const float *xb = x + b * Q8_0_BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < Q8_0_BLOCK; i++)
            amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_f16(d);
        for (int i = 0; i < Q8_0_BLOCK; i++)
            y[b].qs[i] = (int8_t)roundf(xb[i] * id);
    }
}

void dequantize_row_q8_0(const struct block_q8_0 *x, float *y, int64_t n)
{
    quant_dequantize_row(DT_Q8_0, x, y, n);
}

/* ---- reference ---- */

/* Row r of w widened to f32, which is exact for every dtype. */
static void ref_widen_row(const struct tensor *w, int64_t r, float *out)
{
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * dtype_row_bytes(w->dtype, w->cols);
    quant_dequantize_row(w->dtype, row, out, w->cols);
}

void cpu_matmul_ref(float *out, const float *x, int n, const struct tensor *w)
{
    float *wrow = malloc((size_t)w->cols * sizeof(float));
    if (!wrow)
        abort(); /* test-only code: no caller could do better */
    for (int64_t r = 0; r < w->rows; r++) {
        ref_widen_row(w, r, wrow);
        for (int t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * w->cols;
            double s = 0.0;
            for (int64_t k = 0; k < w->cols; k++)
                s += (double)xt[k] * wrow[k];
            out[(size_t)t * w->rows + r] = (float)s;
        }
    }
    free(wrow);
}

/* ---- scalar kernels (1 x 1 tiles) ---- */

static float scalar_weight(enum dtype dt, const uint8_t *row, int64_t k)
{
    switch (dt) {
    case DT_F16: return f16_to_f32(((const uint16_t *)row)[k]);
    case DT_BF16: return bf16_to_f32(((const uint16_t *)row)[k]);
    default: return ((const float *)row)[k];
    }
}

/* Four partial sums so the compiler can keep several adds in flight. */
static float scalar_dot(enum dtype dt, const float *x, const uint8_t *row, int64_t cols)
{
    float s[4] = {0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 4 <= cols; k += 4)
        for (int i = 0; i < 4; i++)
            s[i] += x[k + i] * scalar_weight(dt, row, k + i);
    for (; k < cols; k++)
        s[0] += x[k] * scalar_weight(dt, row, k);
    return (s[0] + s[1]) + (s[2] + s[3]);
}

#define SCALAR_FTILE(name, dt)                                                 \
    static void name(const struct mm_job *j, int64_t t, int64_t r)             \
    {                                                                          \
        j->out[t * j->rows + r] =                                              \
            scalar_dot(dt, j->x + t * j->cols, j->w + r * j->w_stride, j->cols); \
    }
SCALAR_FTILE(scalar_tile_f32, DT_F32)
SCALAR_FTILE(scalar_tile_f16, DT_F16)
SCALAR_FTILE(scalar_tile_bf16, DT_BF16)

/* Scalar Q8_0 activation row: nb blocks of 32 int8, then nb f32 scales
 * (f32 rather than ggml's f16 scale: free here, and more accurate). */
static size_t scalar_xq_row_bytes(int64_t cols)
{
    int64_t nb = cols / Q8_0_BLOCK;
    return mm_round_up((size_t)nb * (Q8_0_BLOCK + sizeof(float)), 64);
}

static void scalar_xq_quantize(const float *x, uint8_t *dst, int64_t cols)
{
    int64_t nb = cols / Q8_0_BLOCK;
    int8_t *qs = (int8_t *)dst;
    float *ds = (float *)(dst + nb * Q8_0_BLOCK);
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * Q8_0_BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < Q8_0_BLOCK; i++)
            amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        ds[b] = d;
        for (int i = 0; i < Q8_0_BLOCK; i++)
            qs[b * Q8_0_BLOCK + i] = (int8_t)roundf(xb[i] * id);
    }
}

static void scalar_tile_q8_0(const struct mm_job *j, int64_t t, int64_t r)
{
    int64_t nb = j->cols / Q8_0_BLOCK;
    const int8_t *xs = (const int8_t *)(j->xq + t * j->xq_stride);
    const float *xd = (const float *)(j->xq + t * j->xq_stride + nb * Q8_0_BLOCK);
    const struct block_q8_0 *wb = (const struct block_q8_0 *)(j->w + r * j->w_stride);
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int32_t s = 0;
        for (int i = 0; i < Q8_0_BLOCK; i++)
            s += (int32_t)wb[b].qs[i] * xs[b * Q8_0_BLOCK + i];
        acc += (float)s * (xd[b] * f16_to_f32(wb[b].d));
    }
    j->out[t * j->rows + r] = acc;
}

/* ---- the integer-code formats (matmul_impl.h, unpack.h) ---- */

size_t mm_codes_xq_row_bytes(int64_t cols) { return unpack_row_bytes(cols); }

/* Written for every family: quantizing is one pass over the activations,
 * next to a matmul's pass over the weights for each of them. Rounds to
 * nearest, ties to even, as the SIMD quantizers of Q8_0 do. */
void mm_codes_xq_quantize(const float *x, uint8_t *dst, int64_t cols)
{
    const int64_t nb = cols / 32;
    if (nb % 2) /* the last group's missing half */
        memset(dst + (size_t)(nb / 2) * UNPACK_GROUP_BYTES, 0, UNPACK_GROUP_BYTES);
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * 32;
        uint8_t *grp = dst + (size_t)(b / 2) * UNPACK_GROUP_BYTES;
        const int h = (int)(b % 2);
        int8_t *qs = (int8_t *)grp + 32 * h;
        float *d = (float *)(grp + 64) + 8 * h, *xs = (float *)(grp + 128) + 8 * h;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(xb[i]));
        const float db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
        for (int i = 0; i < 32; i++)
            qs[i] = (int8_t)nearbyintf(xb[i] * id);
        for (int l = 0; l < 8; l++) {
            d[l] = db;
            xs[l] = db * (float)(qs[4 * l] + qs[4 * l + 1] + qs[4 * l + 2] + qs[4 * l + 3]);
        }
    }
}

/* The panel of 16 unpacked rows (matmul_impl.h); rows past ns are zeros.
 * Baseline ISA: both the AVX2 and the AVX-512 panel kernels read it. */
size_t mm_panel_bytes(int64_t cols)
{
    return (size_t)((cols + UNPACK_GROUP - 1) / UNPACK_GROUP) * MM_PANEL_GROUP_BYTES;
}

size_t mm_panel_xu_floats(int64_t cols)
{
    return (size_t)((cols + UNPACK_GROUP - 1) / UNPACK_GROUP) * 8;
}

void mm_panel_unit_sums(const uint8_t *xq, int64_t cols, int unit, float *xu)
{
    const int64_t ng = (cols + UNPACK_GROUP - 1) / UNPACK_GROUP;
    for (int64_t g = 0; g < ng; g++) {
        const float *d = (const float *)(xq + g * UNPACK_GROUP_BYTES + 64), *xs = d + 16;
        float q16[4];
        for (int q = 0; q < 4; q++)
            q16[q] = (xs[4 * q] + xs[4 * q + 1]) + (xs[4 * q + 2] + xs[4 * q + 3]);
        for (int q = 0; q < UNPACK_GROUP / unit; q++) {
            xu[8 * g + 2 * q] = d[unit / 4 * q];
            xu[8 * g + 2 * q + 1] = unit == 32 ? q16[2 * q] + q16[2 * q + 1] : q16[q];
        }
    }
}

void mm_panel_build(const uint8_t *slab, size_t stride, int64_t ns, int64_t cols, uint8_t *panel)
{
    const int64_t ng = (cols + UNPACK_GROUP - 1) / UNPACK_GROUP;
    for (int64_t g = 0; g < ng; g++) {
        uint8_t *pg = panel + g * MM_PANEL_GROUP_BYTES;
        uint32_t *u = (uint32_t *)pg;
        float *s = (float *)(pg + MM_PANEL_S), *m = (float *)(pg + MM_PANEL_M);
        for (int64_t r = 0; r < MM_PANEL_ROWS; r++) {
            if (r >= ns) {
                for (int k = 0; k < 16; k++)
                    u[k * MM_PANEL_ROWS + r] = 0;
                for (int q = 0; q < 4; q++)
                    s[q * MM_PANEL_ROWS + r] = m[q * MM_PANEL_ROWS + r] = 0.0f;
                continue;
            }
            const uint8_t *src = slab + (size_t)r * stride + (size_t)g * UNPACK_GROUP_BYTES;
            for (int k = 0; k < 16; k++)
                memcpy(&u[k * MM_PANEL_ROWS + r], src + 4 * k, 4);
            for (int q = 0; q < 4; q++) {
                memcpy(&s[q * MM_PANEL_ROWS + r], src + 64 + 16 * q, 4);
                memcpy(&m[q * MM_PANEL_ROWS + r], src + 128 + 16 * q, 4);
            }
        }
    }
}

/* The same panel straight from ns Q8_0 rows (stride bytes apart): value
 * d q as code q + 128 (0..255) with s = d and m = 128 d, so only the
 * AVX-512 VNNI panel kernel, whose unit sums are int32, takes it (the
 * AVX2 one adds pairs of products in int16, which codes past 63 overflow). */
void mm_panel_build_q8_0(const uint8_t *rows, size_t stride, int64_t ns, int64_t cols,
                         uint8_t *panel)
{
    const int64_t nb = cols / Q8_0_BLOCK;
    memset(panel, 0, mm_panel_bytes(cols));
    for (int64_t r = 0; r < ns; r++) {
        const struct block_q8_0 *b = (const struct block_q8_0 *)(rows + (size_t)r * stride);
        for (int64_t ib = 0; ib < nb; ib++) {
            uint8_t *pg = panel + (ib / 2) * MM_PANEL_GROUP_BYTES;
            uint32_t *u = (uint32_t *)pg;
            float *sv = (float *)(pg + MM_PANEL_S), *mv = (float *)(pg + MM_PANEL_M);
            const int h = (int)(ib % 2); /* lanes 8h .. 8h + 7, units 2h, 2h + 1 */
            for (int l = 0; l < 8; l++) {
                uint32_t q;
                memcpy(&q, b[ib].qs + 4 * l, 4);
                u[(8 * h + l) * MM_PANEL_ROWS + r] = q ^ 0x80808080u;
            }
            const float d = f16_to_f32(b[ib].d);
            for (int q = 2 * h; q < 2 * h + 2; q++) {
                sv[q * MM_PANEL_ROWS + r] = d;
                mv[q * MM_PANEL_ROWS + r] = 128.0f * d;
            }
        }
    }
}

static void scalar_tile_codes(const struct mm_job *j, int64_t t, int64_t r)
{
    const int64_t ng = (j->cols + UNPACK_GROUP - 1) / UNPACK_GROUP;
    const uint8_t *x = j->xq + t * j->xq_stride, *w = j->w + r * j->w_stride;
    float acc = 0.0f;
    for (int64_t g = 0; g < ng; g++, x += UNPACK_GROUP_BYTES, w += UNPACK_GROUP_BYTES) {
        const int8_t *q = (const int8_t *)x;
        const float *xd = (const float *)(x + 64), *xs = (const float *)(x + 128);
        const float *ws = (const float *)(w + 64), *wm = (const float *)(w + 128);
        for (int l = 0; l < 16; l++) {
            int32_t dot = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++)
                dot += (int32_t)w[i] * q[i];
            acc += (float)dot * (ws[l] * xd[l]) - wm[l] * xs[l];
        }
    }
    j->out[t * j->rows + r] = acc;
}

#define SCALAR_KERNEL(fn) {1, 1, 0, NULL, fn, fn, fn, fn, NULL, NULL}
static const struct mm_kernel scalar_kernels[DT_COUNT] = {
    [DT_F32] = SCALAR_KERNEL(scalar_tile_f32),
    [DT_F16] = SCALAR_KERNEL(scalar_tile_f16),
    [DT_BF16] = SCALAR_KERNEL(scalar_tile_bf16),
    [DT_Q8_0] = {1, 1, 0, NULL, scalar_tile_q8_0, scalar_tile_q8_0, scalar_tile_q8_0,
                 scalar_tile_q8_0, scalar_xq_row_bytes, scalar_xq_quantize},
};
static const struct mm_kernel scalar_codes = {
    1, 1, 0, NULL, scalar_tile_codes, scalar_tile_codes, scalar_tile_codes, scalar_tile_codes,
    mm_codes_xq_row_bytes, mm_codes_xq_quantize};

/* ---- driver ---- */

/* The family whose kernels take the integer-code formats (codes tiles,
 * direct kernels, panels, all with the same family's bits): AVX-512 only
 * with VNNI, else AVX2, else the portable one. */
static enum cpu_isa mm_codes_isa(const struct cpu_matmul *mm)
{
    if (mm->isa >= CPU_ISA_AVX512 && mm->vnni)
        return CPU_ISA_AVX512;
    return mm->isa >= CPU_ISA_AVX2 ? CPU_ISA_AVX2 : CPU_ISA_SCALAR;
}

static const struct mm_kernel *mm_pick_kernel(const struct cpu_matmul *mm, enum dtype dt)
{
    const struct mm_kernel *k = NULL;
    enum cpu_isa isa = mm->isa;
    if (quant_is_low_bit(dt)) {
        switch (mm_codes_isa(mm)) {
        case CPU_ISA_AVX512: return mm_codes_kernel_avx512(1);
        case CPU_ISA_AVX2: return mm_codes_kernel_avx2();
        default: return &scalar_codes;
        }
    }
    if (isa >= CPU_ISA_AVX512)
        k = mm_kernel_avx512(dt, mm->vnni);
    if (!k && isa >= CPU_ISA_AVX2)
        k = mm_kernel_avx2(dt);
    return k ? k : &scalar_kernels[dt];
}

/* The direct kernel (matmul_impl.h) of a low-bit dtype in the codes
 * family (mm_codes_isa), whose bits it has; or NULL. */
static const struct mm_kernel *mm_pick_direct(const struct cpu_matmul *mm, enum dtype dt)
{
    if (!mm->direct || !quant_is_low_bit(dt))
        return NULL;
    switch (mm_codes_isa(mm)) {
    case CPU_ISA_AVX512: return mm_direct_kernel_avx512(dt, 1);
    case CPU_ISA_AVX2: return mm_direct_kernel_avx2(dt);
    default: return NULL;
    }
}

/* The panel kernel of the codes family for n tokens, or NULL (the tiles). */
static mm_panel_fn mm_pick_panel(const struct cpu_matmul *mm, int n)
{
    if (!mm->panel || n < MM_PANEL_MIN_TOKENS)
        return NULL;
    switch (mm_codes_isa(mm)) {
    case CPU_ISA_AVX512: return mm_panel_run_avx512;
    case CPU_ISA_AVX2: return mm_panel_run_avx2;
    default: return NULL;
    }
}

/* Tokens per group: as many as keep the group's activations in L2. */
static int64_t mm_token_group(const struct mm_job *j, const struct mm_kernel *k)
{
    size_t row = j->xq ? j->xq_stride : (size_t)j->cols * sizeof(float);
    int64_t g = (int64_t)(MM_XGROUP_BYTES / row);
    g -= g % k->mr;
    if (g < k->mr)
        g = k->mr;
    return g < j->n ? g : j->n;
}

/* Rows a direct kernel takes before its next tokens where a call has more
 * tokens than one pass takes: 16 rows of 1,024-4,096 columns of a 2-6-bit
 * format (9-37 KB) stay in L1 for the passes after the first. */
#define MM_DIRECT_ROW_BLOCK 16

/* Rows [r0, r1) for every token. Few tokens: one sequential pass over the
 * rows. Else token groups outside so a group stays in L2, weight tiles next
 * so each tile stays in L1 across the group. */
static void mm_run_chunk(const struct mm_job *j, const struct mm_kernel *k, int64_t r0,
                         int64_t r1)
{
    if (k->stream && j->n <= k->stream_max_n) {
        k->stream(j, 0, (int)j->n, r0, r1);
        return;
    }
    if (k->stream && !k->tile) {
        /* a stream-only family (the direct kernels) past its tokens: the
         * rows in blocks that stay in L1, each block's tokens
         * stream_max_n at a time */
        for (int64_t rb = r0; rb < r1; rb += MM_DIRECT_ROW_BLOCK) {
            const int64_t re = rb + MM_DIRECT_ROW_BLOCK < r1 ? rb + MM_DIRECT_ROW_BLOCK : r1;
            for (int64_t t = 0; t < j->n; t += k->stream_max_n)
                k->stream(j, t, (int)(j->n - t < k->stream_max_n ? j->n - t : k->stream_max_n),
                          rb, re);
        }
        return;
    }
    int64_t group = mm_token_group(j, k);
    for (int64_t t0 = 0; t0 < j->n; t0 += group) {
        int64_t t1 = t0 + group < j->n ? t0 + group : j->n;
        int64_t r = r0;
        for (; r + k->nr <= r1; r += k->nr) {
            int64_t t = t0;
            for (; t + k->mr <= t1; t += k->mr)
                k->tile(j, t, r);
            for (; t < t1; t++)
                k->tile_t1(j, t, r);
        }
        for (; r < r1; r++) {
            int64_t t = t0;
            for (; t + k->mr <= t1; t += k->mr)
                k->tile_r1(j, t, r);
            for (; t < t1; t++)
                k->tile_1x1(j, t, r);
        }
    }
}

struct mm_task {
    const struct mm_job *job;
    const struct mm_kernel *kern;
    int64_t chunk, n_chunks;
    atomic_llong next; /* next chunk to hand out */
    /* an integer-code format: job->w holds its blocks, and each thread
     * unpacks slab_rows rows at a time into its slab (slab_bytes apart
     * from slabs) for kern; or a Q8_0 prompt on panels, built straight
     * from its rows into the slab */
    enum dtype packed;
    int64_t slab_rows;
    cpu_unpack_fn unpack;
    uint8_t *slabs;
    size_t slab_bytes;
    /* a prompt (mm_pick_panel): each slab of MM_PANEL_ROWS rows (in L2,
     * not L1: a panel is read once per 8 tokens, or 4 on AVX2) is rebuilt
     * as a panel (matmul_impl.h), panel_offset bytes into the slab, for
     * that kernel */
    mm_panel_fn panel;
    mm_panel_build_fn panel_build; /* its build, of the panel's ISA */
    size_t panel_offset;
};

/* Rows [r0, r1) of an integer-code format: a slab of rows at a time
 * unpacked, then the kernel over the slab as a job of its own whose
 * outputs start at the slab's first row. */
static void mm_run_slabs(const struct mm_task *task, uint8_t *slab, int64_t r0, int64_t r1)
{
    const struct mm_job *j = task->job;
    struct mm_job f = *j;
    f.w = slab;
    f.w_stride = unpack_row_bytes(j->cols);
    for (int64_t s = r0; s < r1; s += task->slab_rows) {
        const int64_t ns = r1 - s < task->slab_rows ? r1 - s : task->slab_rows;
        f.out = j->out + s;
        if (!task->unpack) { /* Q8_0: a panel straight from the rows, no slab */
            task->panel_build(j->w + (size_t)s * j->w_stride, j->w_stride, ns, j->cols, slab);
            task->panel(&f, slab, ns);
            continue;
        }
        for (int64_t r = 0; r < ns; r++)
            task->unpack(task->packed, j->w + (size_t)(s + r) * j->w_stride,
                         slab + (size_t)r * f.w_stride, j->cols);
        if (task->panel) {
            task->panel_build(slab, f.w_stride, ns, j->cols, slab + task->panel_offset);
            task->panel(&f, slab + task->panel_offset, ns);
        } else {
            mm_run_chunk(&f, task->kern, 0, ns);
        }
    }
}

static void mm_task_worker(void *ctx, int ith, int nth)
{
    (void)nth;
    struct mm_task *task = ctx;
    const struct mm_job *j = task->job;
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&task->next, 1, memory_order_relaxed);
        if (c >= task->n_chunks)
            break;
        int64_t r0 = c * task->chunk;
        int64_t r1 = r0 + task->chunk < j->rows ? r0 + task->chunk : j->rows;
        if (task->slabs)
            mm_run_slabs(task, task->slabs + (size_t)ith * task->slab_bytes, r0, r1);
        else
            mm_run_chunk(j, task->kern, r0, r1);
    }
}

struct mm_quant_task {
    const struct mm_job *job;
    const struct mm_kernel *kern;
    uint8_t *dst; /* = job->xq, writable */
    float *xu;    /* = job->xu (panels), writable, or NULL */
};

static void mm_quant_worker(void *ctx, int ith, int nth)
{
    const struct mm_quant_task *q = ctx;
    const struct mm_job *j = q->job;
    for (int64_t t = ith; t < j->n; t += nth) {
        q->kern->xq_quantize(j->x + t * j->cols, q->dst + t * j->xq_stride, j->cols);
        if (q->xu)
            mm_panel_unit_sums(q->dst + t * j->xq_stride, j->cols, j->panel_unit,
                               q->xu + t * j->xu_stride);
    }
}

static int mm_reserve_scratch(struct cpu_matmul *mm, size_t bytes, struct err *e)
{
    if (bytes <= mm->scratch_cap)
        return 0;
    size_t cap = mm_round_up(bytes + bytes / 4, 64);
    void *p = aligned_alloc(64, cap);
    if (!p)
        return err_set(e, "matmul: cannot allocate %zu bytes of activation scratch", cap);
    free(mm->scratch);
    mm->scratch = p;
    mm->scratch_cap = cap;
    return 0;
}

static int mm_check(const float *out, const float *x, int n, const struct tensor *w, struct err *e)
{
    if (!w || !w->data || !out || !x)
        return err_set(e, "matmul: missing weight, input or output buffer");
    if ((unsigned)w->dtype >= DT_COUNT)
        return err_set(e, "matmul: unknown weight dtype %d", (int)w->dtype);
    if (n < 0 || w->rows <= 0 || w->cols <= 0)
        return err_set(e, "matmul: bad shape n=%d rows=%lld cols=%lld", n,
                       (long long)w->rows, (long long)w->cols);
    if (w->cols % dtype_block_elems(w->dtype) != 0)
        return err_set(e, "matmul: %s weight has %lld columns, not a multiple of %lld",
                       dtype_name(w->dtype), (long long)w->cols,
                       (long long)dtype_block_elems(w->dtype));
    return 0;
}

/* Row chunks: multiples of MM_ROW_ALIGN, about MM_CHUNKS_PER_THREAD per
 * thread. */
static int64_t mm_chunk_rows(int64_t rows, int nth)
{
    if (nth == 1)
        return rows;
    int64_t parts = (int64_t)nth * MM_CHUNKS_PER_THREAD;
    return (int64_t)mm_round_up((size_t)((rows + parts - 1) / parts), MM_ROW_ALIGN);
}

int cpu_matmul(struct cpu_matmul *mm, float *out, const float *x, int n,
               const struct tensor *w, struct err *e)
{
    if (mm_check(out, x, n, w, e))
        return -1;
    if (n == 0)
        return 0;
    const struct mm_kernel *k = mm_pick_kernel(mm, w->dtype), *dk = mm_pick_direct(mm, w->dtype);
    /* Q8_0 prompts on AVX-512 VNNI: panels (mm_panel_build_q8_0), with the
     * code formats' activations */
    const bool q8_panel = w->dtype == DT_Q8_0 && mm_pick_panel(mm, n) == mm_panel_run_avx512;
    if (q8_panel)
        k = mm_codes_kernel_avx512(1);
    /* the direct kernel up to the panels' tokens, stream_max_n tokens a
     * pass (mm_run_chunk): a batched decode step of 8 streams of the 0.6B
     * shape at 2 threads, Q4_K 89-92 -> 117-133 tok/s, Q6_K 75-78 ->
     * 108-111, against the tiles over unpacked rows (docs/benchmarks.md,
     * session 56) */
    if (dk && n < MM_PANEL_MIN_TOKENS)
        k = dk;
    else
        dk = NULL;
    if (w->dtype == DT_BF16 && mm->bf16dot && n >= CPU_MATMUL_BF16DOT_MIN_TOKENS)
        k = mm_bf16dot_kernel_avx512();
    struct mm_job j = {
        .out = out, .x = x, .w = w->data,
        .w_stride = dtype_row_bytes(w->dtype, w->cols),
        .n = n, .rows = w->rows, .cols = w->cols,
    };
    int nth = mm->tp ? tp_size(mm->tp) : 1;
    struct mm_task task = {.job = &j, .kern = k, .chunk = mm_chunk_rows(w->rows, nth)};
    task.n_chunks = (w->rows + task.chunk - 1) / task.chunk;
    /* one reservation for the quantized activations and the slabs, which
     * follow them */
    size_t xq_bytes = 0;
    if (k->xq_quantize) {
        j.xq_stride = k->xq_row_bytes(w->cols);
        xq_bytes = mm_round_up(j.xq_stride * (size_t)n, 64);
    }
    if (q8_panel) {
        task.packed = DT_Q8_0;
        task.panel = mm_panel_run_avx512;
        task.panel_build = mm_panel_build_q8_0_avx512;
        task.slab_rows = MM_PANEL_ROWS;
        task.slab_bytes = mm_round_up(mm_panel_bytes(w->cols), 64);
    } else if (quant_is_low_bit(w->dtype) && !dk) {
        task.packed = w->dtype;
        task.unpack = cpu_unpack_for(mm->isa);
        const size_t rb = unpack_row_bytes(w->cols);
        task.panel = mm_pick_panel(mm, n);
        int64_t rows = MM_PANEL_ROWS;
        if (!task.panel) {
            rows = (int64_t)(MM_SLAB_BYTES / rb);
            if (n > k->stream_max_n)
                rows -= rows % 4;
            rows = rows < 1 ? (n > k->stream_max_n ? 4 : 1)
                 : rows > MM_SLAB_ROWS ? MM_SLAB_ROWS : rows;
        }
        task.slab_rows = rows;
        task.slab_bytes = mm_round_up((size_t)rows * rb, 64);
        if (task.panel) {
            task.panel_build =
                task.panel == mm_panel_run_avx512 ? mm_panel_build_avx512 : mm_panel_build;
            task.panel_offset = task.slab_bytes;
            task.slab_bytes += mm_round_up(mm_panel_bytes(w->cols), 64);
        }
    }
    size_t xu_bytes = 0;
    if (task.panel) {
        /* where a format's s and m hold for 32 values (the 32-block
         * formats; Q4_K's and Q5_K's 32-value sub-blocks, whose code
         * groups hold two of them: lanes 0-7 and 8-15), one float step for
         * both of a 32's 16-value units on AVX-512 */
        const bool s32 =
            dtype_block_elems(w->dtype) == 32 || w->dtype == DT_Q4_K || w->dtype == DT_Q5_K;
        j.panel_unit = task.panel == mm_panel_run_avx512 && s32 ? 32 : 16;
        j.xu_stride = mm_panel_xu_floats(w->cols);
        xu_bytes = mm_round_up(sizeof(float) * j.xu_stride * (size_t)n, 64);
    }
    if (mm_reserve_scratch(mm, xq_bytes + xu_bytes + task.slab_bytes * (size_t)nth, e))
        return -1;
    if (task.slab_bytes)
        task.slabs = (uint8_t *)mm->scratch + xq_bytes + xu_bytes;
    if (k->xq_quantize) {
        j.xq = mm->scratch;
        float *xu = task.panel ? (float *)((uint8_t *)mm->scratch + xq_bytes) : NULL;
        j.xu = xu;
        struct mm_quant_task q = {&j, k, mm->scratch, xu};
        if (nth > 1 && (int64_t)n * w->cols >= MM_PAR_QUANT_MIN)
            tp_run(mm->tp, mm_quant_worker, &q);
        else
            mm_quant_worker(&q, 0, 1);
    }
    atomic_init(&task.next, 0);
    if (nth > 1 && task.n_chunks > 1)
        tp_run(mm->tp, mm_task_worker, &task);
    else
        mm_task_worker(&task, 0, 1);
    return 0;
}

int cpu_matmul_init(struct cpu_matmul *mm, struct threadpool *tp, enum cpu_isa isa,
                    struct err *e)
{
    memset(mm, 0, sizeof *mm);
    enum cpu_isa hw = cpu_isa_hw();
    if (isa > hw)
        return err_set(e, "matmul: this CPU cannot run %s kernels (best is %s)",
                       cpu_isa_name(isa), cpu_isa_name(hw));
    mm->tp = tp;
    mm->isa = isa;
    mm->vnni = isa >= CPU_ISA_AVX512 && cpu_has_avx512_vnni();
    mm->bf16dot = isa >= CPU_ISA_AVX512 && cpu_has_avx512_bf16();
    mm->direct = 1;
    mm->panel = 1;
    return 0;
}

void cpu_matmul_free(struct cpu_matmul *mm)
{
    free(mm->scratch);
    mm->scratch = NULL;
    mm->scratch_cap = 0;
}
