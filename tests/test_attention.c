/* test_attention.c - the CPU attention (attention.c) against a double
 * precision softmax over a paged cache with a shuffled block table: GQA
 * groups of 1-4, head sizes with and without SIMD tails, sliding windows,
 * a cached prefix, 1-3 threads, f32 and bf16 caches; and the same bits whatever the thread count
 * or the way the query rows are split into calls (a prompt in chunks, then
 * decode steps). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/attention.h"
#include "base/half.h"
#include "base/threadpool.h"
#include "testutil.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f; /* [-1, 1) */
}

struct shape {
    int n_heads, n_kv, hd, window;
    bool bf16; /* the cache in bf16 (CLLM_KV_DTYPE=bf16) */
    int ctx;   /* past 512, decode steps span key chunks (ATT_KC 256) */
    int bs;    /* tokens per block (0: 16); 8 makes K panels of 8 (kv_panel) */
};

/* Element i of a cache array, as a float. */
static float elt(const struct kv_pool *p, const void *base, size_t i)
{
    return p->dtype == DT_BF16 ? bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

enum { LAYERS = 2, LAYER = 1, CTX = 150, CTX_MAX = 1024 };

/* out for rows [0, n) at positions pos0.., in double. */
static void reference(double *out, const float *q, const struct kv_pool *p,
                      const struct kv_seq *s, const struct attn_args *a)
{
    int g = a->n_heads / a->n_kv_heads, hd = a->head_dim;
    double *sc = malloc(sizeof(double) * CTX_MAX);
    for (int i = 0; i < a->n; i++)
        for (int h = 0; h < a->n_heads; h++) {
            int pos = a->pos0 + i, start = 0;
            if (a->sliding_window > 0 && pos - a->sliding_window + 1 > 0)
                start = pos - a->sliding_window + 1;
            const float *qr = q + ((size_t)i * a->n_heads + h) * hd;
            double mx = -INFINITY, sum = 0;
            for (int t = start; t <= pos; t++) {
                size_t k = kv_k_offset(p, s, LAYER, t, h / g), pw = (size_t)kv_panel(p);
                double d = 0;
                for (int c = 0; c < hd; c++)
                    d += (double)qr[c] * elt(p, p->k, k + c * pw);
                sc[t] = d * a->scale;
                mx = sc[t] > mx ? sc[t] : mx;
            }
            for (int t = start; t <= pos; t++)
                sum += (sc[t] = exp(sc[t] - mx));
            double *o = out + ((size_t)i * a->n_heads + h) * hd;
            for (int c = 0; c < hd; c++)
                o[c] = 0;
            for (int t = start; t <= pos; t++) {
                size_t v = kv_offset(p, s, LAYER, t, h / g);
                for (int c = 0; c < hd; c++)
                    o[c] += sc[t] / sum * elt(p, p->v, v + c);
            }
        }
    free(sc);
}

/* Checks one shape with isa's kernels; returns its rows from one call (the
 * caller frees them), or NULL. */
static float *test_shape(const struct shape *sh, struct threadpool *const *pools, enum cpu_isa isa)
{
    /* the same data for every isa */
    rng = 0x2545f4914f6cdd1dull ^ (uint64_t)(sh->n_heads * 131 + sh->hd * 7 + sh->ctx);
    int kvd = sh->n_kv * sh->hd, qd = sh->n_heads * sh->hd, ctx = sh->ctx;
    int bs = sh->bs ? sh->bs : 16, nblk = (ctx + bs - 1) / bs;
    struct kv_pool p = {.n_layers = LAYERS, .n_kv_heads = sh->n_kv, .head_dim = sh->hd,
                        .kv_dim = kvd, .block_size = bs, .n_blocks = nblk,
                        .dtype = sh->bf16 ? DT_BF16 : DT_F32, .elt_bytes = sh->bf16 ? 2 : 4};
    size_t elts = (size_t)nblk * LAYERS * bs * kvd;
    p.k = malloc(elts * p.elt_bytes);
    p.v = malloc(elts * p.elt_bytes);
    int blocks[(CTX_MAX + 7) / 8]; /* 8: the smallest block size here */
    /* a shuffled table: block b holds logical block (b*7) % nblk (a
     * permutation: no context here has a multiple of 7 blocks) */
    for (int b = 0; b < nblk; b++)
        blocks[(b * 7) % nblk] = b;
    CHECK(nblk % 7 != 0, "context %d: %d blocks do not shuffle", ctx, nblk);
    struct kv_seq s = {.blocks = blocks, .n_blocks = nblk, .cap_blocks = nblk, .n_tokens = ctx};
    for (size_t i = 0; i < elts; i++) {
        float k = rnd(), v = rnd();
        if (sh->bf16) {
            ((uint16_t *)p.k)[i] = f32_to_bf16(k);
            ((uint16_t *)p.v)[i] = f32_to_bf16(v);
        } else {
            ((float *)p.k)[i] = k;
            ((float *)p.v)[i] = v;
        }
    }
    /* Rows for positions [P, ctx): a cached prefix of P, then the rest. */
    const int P = 21, n = ctx - P;
    float *q = malloc(sizeof(float) * n * qd);
    for (int i = 0; i < n * qd; i++)
        q[i] = rnd() * 2.0f;
    float *out[3], *chunked = malloc(sizeof(float) * n * qd);
    double *ref = malloc(sizeof(double) * n * qd);
    struct attn_args a = {.n = n, .pos0 = P, .n_heads = sh->n_heads, .n_kv_heads = sh->n_kv,
                          .head_dim = sh->hd, .sliding_window = sh->window,
                          .scale = 1.0f / sqrtf((float)sh->hd)};
    reference(ref, q, &p, &s, &a);
    struct err e;
    for (int t = 0; t < 3; t++) {
        struct cpu_att_scratch sc = {0};
        out[t] = malloc(sizeof(float) * n * qd);
        CHECK(cpu_paged_attention(pools[t], &sc, isa, out[t], q, &p, &s, LAYER, &a, &e) == 0, "%s", e.msg);
        double err = 0, mx = 0;
        for (int i = 0; i < n * qd; i++) {
            err = fmax(err, fabs(out[t][i] - ref[i]));
            mx = fmax(mx, fabs(ref[i]));
        }
        CHECK(err <= 2e-6 * mx, "%s: heads %d/%d, head_dim %d, window %d, %s, %d threads: max error %g of %g",
              cpu_isa_name(isa), sh->n_heads, sh->n_kv, sh->hd, sh->window,
              sh->bf16 ? "bf16" : "f32", t + 1, err, mx);
        CHECK(memcmp(out[t], out[0], sizeof(float) * n * qd) == 0,
              "heads %d/%d, head_dim %d: %d threads differ from 1 thread", sh->n_heads, sh->n_kv,
              sh->hd, t + 1);
        cpu_att_scratch_free(&sc);
    }
    /* The same rows in calls of 1, 5, 17, 40, ... rows (a chunked prompt,
     * then steps of 1-3 tokens, which past 512 keys go by chunks) on 2
     * threads: the same bits. */
    struct cpu_att_scratch sc = {0};
    static const int sizes[] = {1, 5, 17, 40, 1, 1, 33, 3, 2, 1, 70};
    const int ns = sizeof sizes / sizeof sizes[0];
    for (int r = 0, c = 0; r < n; c++) {
        struct attn_args b = a;
        b.n = sizes[c % ns] < n - r ? sizes[c % ns] : n - r;
        b.pos0 = P + r;
        CHECK(cpu_paged_attention(pools[1], &sc, isa, chunked + (size_t)r * qd, q + (size_t)r * qd, &p, &s,
                                LAYER, &b, &e) == 0, "%s", e.msg);
        r += b.n;
    }
    CHECK(memcmp(chunked, out[0], sizeof(float) * n * qd) == 0,
          "%s: heads %d/%d, head_dim %d, window %d, context %d, block %d: rows computed in chunks "
          "differ from one call",
          cpu_isa_name(isa), sh->n_heads, sh->n_kv, sh->hd, sh->window, ctx, bs);
    cpu_att_scratch_free(&sc);
    for (int t = 1; t < 3; t++)
        free(out[t]);
    free(chunked);
    free(ref);
    free(q);
    free(p.k);
    free(p.v);
    return out[0];
}

int main(void)
{
    struct err e;
    struct threadpool *pools[3];
    for (int t = 0; t < 3; t++) {
        pools[t] = tp_create(t + 1, &e);
        if (!pools[t]) {
            fprintf(stderr, "tp_create: %s\n", e.msg);
            return 1;
        }
    }
    static const struct shape shapes[] = {
        {4, 4, 64, 0, false, CTX, 16},  {8, 2, 128, 0, false, CTX, 16}, {6, 2, 80, 0, false, CTX, 16},
        {3, 1, 16, 0, false, CTX, 16},  {4, 2, 20, 0, false, CTX, 16},  {8, 2, 128, 37, false, CTX, 16},
        {2, 2, 256, 5, false, CTX, 16},
        {8, 2, 128, 0, true, CTX, 16}, {4, 2, 20, 9, true, CTX, 16}, {6, 2, 80, 0, true, CTX, 16},
        /* decode steps by chunks of keys: f32 and bf16, a window across
         * chunk bounds, one that fits in one chunk, a tail head_dim */
        {8, 2, 128, 0, false, 700, 16}, {4, 2, 20, 300, false, 990, 16}, {6, 2, 80, 100, true, 600, 16},
        {4, 1, 64, 0, true, 1024, 16},
        /* K panels of 8 positions (8-token blocks), and of 16 within
         * larger blocks */
        {8, 2, 128, 0, false, CTX, 8}, {4, 2, 20, 9, true, CTX, 8}, {6, 2, 80, 100, true, 600, 8},
        {8, 2, 128, 37, false, 700, 64}, {4, 1, 64, 0, true, CTX, 256},
    };
    /* Every kernel family the machine runs; AVX2's and AVX-512's (both fuse
     * their multiply-adds, each lane the same operations whatever the
     * vector width) give the same bits. */
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const struct shape *sh = &shapes[i];
        float *rows[3] = {NULL, NULL, NULL};
        for (int isa = CPU_ISA_SCALAR; isa <= (int)cpu_isa_hw(); isa++)
            rows[isa] = test_shape(sh, pools, (enum cpu_isa)isa);
        if (rows[CPU_ISA_AVX2] && rows[CPU_ISA_AVX512])
            CHECK(memcmp(rows[CPU_ISA_AVX2], rows[CPU_ISA_AVX512],
                         sizeof(float) * (size_t)(sh->ctx - 21) * sh->n_heads * sh->hd) == 0,
                  "heads %d/%d, head_dim %d, window %d, context %d: AVX2 and AVX-512 differ",
                  sh->n_heads, sh->n_kv, sh->hd, sh->window, sh->ctx);
        for (int t = 0; t < 3; t++)
            free(rows[t]);
    }

    /* A KV-head count that does not divide the query heads, and a cache
     * element type the CPU does not read, are refused. */
    struct attn_args bad = {.n = 1, .n_heads = 6, .n_kv_heads = 4, .head_dim = 16};
    struct cpu_att_scratch sc = {0};
    float x[96] = {0};
    CHECK(cpu_paged_attention(pools[0], &sc, cpu_isa_hw(), x, x, NULL, NULL, 0, &bad, &e) != 0 &&
              strstr(e.msg, "6 query heads"), "6 heads over 4 KV heads accepted");
    struct kv_pool f16 = {.dtype = DT_F16};
    struct attn_args one = {.n = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 16};
    CHECK(cpu_paged_attention(pools[0], &sc, cpu_isa_hw(), x, x, &f16, NULL, 0, &one, &e) != 0 &&
              strstr(e.msg, "f32 or bf16"), "an f16 cache accepted: %s", e.msg);
    for (int t = 0; t < 3; t++)
        tp_destroy(pools[t]);
    return test_summary("test_attention");
}
