/* backend_cpu.c - the CPU implementation of the op set: matmul goes to the
 * SIMD kernels in matmul.c, attention to attention.c; the element-wise ops
 * are here. */
#include "backend/backend.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/attention.h"
#include "backend/cpu/head_pick.h"
#include "backend/cpu/matmul.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/half.h"
#include "base/threadpool.h"
#include "model/quant.h"

struct cpu_backend {
    struct backend be;
    struct threadpool *tp;
    struct cpu_matmul mm;
    struct cpu_att_scratch att;
    enum cpu_isa isa; /* the kernels' instruction set (cpu_isa_detect) */
    int kv_dtype; /* DT_F32, or DT_BF16 with CLLM_KV_DTYPE=bf16 */
    bool screen;  /* head_pick on (CLLM_HEAD_SCREEN, default 1) */
    struct head_screen hs;
};

static struct cpu_backend *cpu(struct backend *be) { return be->impl; }

static void cpu_destroy(struct backend *be)
{
    struct cpu_backend *c = cpu(be);
    cpu_matmul_free(&c->mm);
    head_screen_free(&c->hs);
    tp_destroy(c->tp);
    cpu_att_scratch_free(&c->att);
    free(c);
}

/* Zeroed and 64-byte aligned. The memory comes from calloc, which for
 * large blocks maps fresh zero pages without touching them: a KV pool sized
 * by default at up to 75% of RAM only becomes resident as sequences use it.
 * The block calloc returned sits just before the aligned pointer. */
static void *cpu_alloc(struct backend *be, size_t bytes)
{
    (void)be;
    size_t n = bytes ? bytes : 64, extra = 64 + sizeof(void *);
    if (n > SIZE_MAX - extra)
        return NULL;
    char *raw = calloc(1, n + extra);
    if (!raw)
        return NULL;
    uintptr_t a = ((uintptr_t)raw + sizeof(void *) + 63) & ~(uintptr_t)63;
    ((void **)a)[-1] = raw;
    return (void *)a;
}

static void cpu_free(struct backend *be, void *p)
{
    (void)be;
    if (p)
        free(((void **)p)[-1]);
}

static void cpu_download(struct backend *be, float *dst, const float *src, size_t n)
{
    (void)be;
    memcpy(dst, src, n * sizeof(float));
}

static void cpu_embed(struct backend *be, float *out, const struct tensor *t, const int *ids, int n)
{
    (void)be;
    int64_t d = t->cols;
    size_t rb = dtype_row_bytes(t->dtype, d);
    for (int i = 0; i < n; i++) {
        const char *row = (const char *)t->data + (size_t)ids[i] * rb;
        float *o = out + (size_t)i * d;
        quant_dequantize_row(t->dtype, row, o, d);
    }
}

static int cpu_mm(struct backend *be, float *out, const float *x, int n, const struct tensor *w,
                  struct err *e)
{
    return cpu_matmul(&cpu(be)->mm, out, x, n, w, e);
}

static int cpu_head_pick(struct backend *be, float *logits, const float *x,
                         const struct tensor *head, int k, struct err *e)
{
    struct cpu_backend *c = cpu(be);
    return c->screen ? head_screen_pick(&c->hs, &c->mm, logits, x, head, k, e) : 1;
}

static void cpu_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n,
                        int dim, float eps)
{
    (void)be;
    for (int i = 0; i < n; i++) {
        const float *xr = x + (size_t)i * dim;
        float *o = out + (size_t)i * dim;
        /* f32 sum like torch's x.pow(2).mean(); double keeps it order-independent. */
        double ss = 0;
        for (int j = 0; j < dim; j++)
            ss += (double)xr[j] * xr[j];
        float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int j = 0; j < dim; j++)
            o[j] = w[j] * (xr[j] * inv);
    }
}

static void cpu_add_bias(struct backend *be, float *x, const float *b, int n, int dim)
{
    (void)be;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < dim; j++)
            x[(size_t)i * dim + j] += b[j];
}

static void cpu_rope(struct backend *be, float *x, int n, int n_heads, int head_dim, int pos0,
                     const float *inv_freq, bool interleaved)
{
    (void)be;
    int half = head_dim / 2;
    float cs[512], sn[512];
    for (int i = 0; i < n; i++) {
        for (int f = 0; f < half; f++) {
            /* HF computes the angle in f32 (pos * inv_freq), then cos/sin. */
            float ang = (float)(pos0 + i) * inv_freq[f];
            cs[f] = cosf(ang);
            sn[f] = sinf(ang);
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)i * n_heads + h) * head_dim;
            for (int f = 0; f < half; f++) {
                int a = interleaved ? 2 * f : f, b = interleaved ? 2 * f + 1 : f + half;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * cs[f] - x1 * sn[f];
                v[b] = x1 * cs[f] + x0 * sn[f];
            }
        }
    }
}

static void cpu_kv_store(struct backend *be, struct kv_pool *pool, const struct kv_seq *seq,
                         int layer, const float *k, const float *v, int n, int pos0)
{
    (void)be;
    size_t d = (size_t)pool->kv_dim, hd = (size_t)pool->head_dim, pw = (size_t)kv_panel(pool);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < pool->n_kv_heads; h++) {
            size_t off = kv_offset(pool, seq, layer, pos0 + i, h);
            size_t koff = kv_k_offset(pool, seq, layer, pos0 + i, h);
            const float *ks = k + i * d + h * hd, *vs = v + i * d + h * hd;
            if (pool->dtype == DT_BF16) {
                uint16_t *kd = (uint16_t *)pool->k + koff, *vd = (uint16_t *)pool->v + off;
                for (size_t c = 0; c < hd; c++) {
                    kd[c * pw] = f32_to_bf16(ks[c]);
                    vd[c] = f32_to_bf16(vs[c]);
                }
            } else {
                float *kd = (float *)pool->k + koff;
                for (size_t c = 0; c < hd; c++)
                    kd[c * pw] = ks[c];
                memcpy((float *)pool->v + off, vs, hd * sizeof(float));
            }
        }
}

static int cpu_attention(struct backend *be, float *out, const float *q,
                         const struct kv_pool *pool, const struct kv_seq *seq, int layer,
                         const struct attn_args *a, struct err *e)
{
    struct cpu_backend *c = cpu(be);
    return cpu_paged_attention(c->tp, &c->att, c->isa, out, q, pool, seq, layer, a, e);
}

static void cpu_silu_mul(struct backend *be, float *g, const float *u, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void cpu_add(struct backend *be, float *x, const float *y, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

/* ---- memory bandwidth ---- */

#define BW_BYTES ((size_t)256 << 20) /* far past any last-level cache */
#define BW_REPS 3

typedef uint64_t bw_vec __attribute__((vector_size(16)));

struct bw_job {
    uint8_t *buf;
    size_t part;      /* bytes per worker, a multiple of 64 */
    uint64_t sums[64]; /* per worker (mod 64): the sums are kept, so the reads are too */
    bool fill;
};

/* Each worker first-touches (fill) or sums (read) its own slice; four
 * independent vector accumulators keep enough loads in flight. */
static void bw_worker(void *ctx, int ith, int nth)
{
    (void)nth;
    struct bw_job *j = ctx;
    uint8_t *p = j->buf + j->part * (size_t)ith;
    if (j->fill) {
        memset(p, ith + 1, j->part);
        return;
    }
    bw_vec a0 = {0, 0}, a1 = a0, a2 = a0, a3 = a0, t;
    for (size_t i = 0; i < j->part; i += 64) {
        memcpy(&t, p + i, 16);
        a0 += t;
        memcpy(&t, p + i + 16, 16);
        a1 += t;
        memcpy(&t, p + i + 32, 16);
        a2 += t;
        memcpy(&t, p + i + 48, 16);
        a3 += t;
    }
    bw_vec s = a0 + a1 + a2 + a3;
    j->sums[ith & 63] = s[0] + s[1];
}

/* Read bandwidth of all workers over a 256 MiB buffer, best of 3: decode
 * on the CPU reads weights and hardly writes, so bytes read is the rate
 * that bounds it (bench/bench_matmul measures the same with 1 GiB). */
static double cpu_mem_bandwidth(struct backend *be, struct err *e)
{
    struct cpu_backend *c = cpu(be);
    int nth = tp_size(c->tp);
    struct bw_job j = {.part = BW_BYTES / (size_t)nth / 64 * 64, .fill = true};
    if (posix_memalign((void **)&j.buf, 64, j.part * (size_t)nth)) {
        err_set(e, "out of memory for the %zu MiB bandwidth buffer", BW_BYTES >> 20);
        return -1;
    }
    tp_run(c->tp, bw_worker, &j); /* pages land near the worker that reads them */
    j.fill = false;
    double best = 0;
    for (int rep = 0; rep < BW_REPS; rep++) {
        const double t0 = clock_now_s();
        tp_run(c->tp, bw_worker, &j);
        double dt = clock_now_s() - t0;
        double bw = dt > 0 ? (double)(j.part * (size_t)nth) / dt : 0;
        best = bw > best ? bw : best;
    }
    free(j.buf);
    if (best <= 0) {
        err_set(e, "memory bandwidth measurement took no measurable time");
        return -1;
    }
    return best;
}

static int cpu_kv_dtype(struct backend *be) { return cpu(be)->kv_dtype; }

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .kv_layout = 3, /* 3: V's rows head by head (kv_offset), K's in transposed panels
                    * (kv_k_offset); 2: K as V; 1: token by token */
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .download = cpu_download,
    .embed = cpu_embed,
    .matmul = cpu_mm,
    .head_pick = cpu_head_pick,
    .rmsnorm = cpu_rmsnorm,
    .add_bias = cpu_add_bias,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .mem_bandwidth = cpu_mem_bandwidth,
    .kv_dtype = cpu_kv_dtype,
};

struct backend *backend_cpu_create(int n_threads, struct err *e)
{
    struct cpu_backend *c = calloc(1, sizeof *c);
    if (!c) {
        err_set(e, "out of memory");
        return NULL;
    }
    /* f32 by default: the CPU is the exact path the oracle tests hold to
     * 1e-4. bf16 halves the cache's memory and what decode reads of it. */
    c->kv_dtype = backend_kv_dtype_env(DT_F32, e);
    if (c->kv_dtype < 0) {
        free(c);
        return NULL;
    }
    int isa = cpu_isa_detect(e);
    c->tp = isa < 0 ? NULL : tp_create(n_threads, e);
    if (!c->tp || cpu_matmul_init(&c->mm, c->tp, (enum cpu_isa)isa, e)) {
        if (c->tp)
            tp_destroy(c->tp);
        free(c);
        return NULL;
    }
    c->isa = (enum cpu_isa)isa;
    c->screen = env_flag("CLLM_HEAD_SCREEN", true);
    c->mm.direct = env_flag("CLLM_CPU_QDIRECT", true);
    c->mm.panel = env_flag("CLLM_CPU_QPANEL", true);
    if (!env_flag("CLLM_CPU_BF16DOT", true))
        c->mm.bf16dot = 0;
    c->be.ops = &cpu_ops;
    c->be.impl = c;
    return &c->be;
}

void backend_destroy(struct backend *be)
{
    if (be)
        be->ops->destroy(be);
}
