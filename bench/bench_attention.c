/* bench_attention.c - the CPU attention (attention.c) alone, on one layer of
 * a Qwen3-0.6B-shaped cache (16 query heads over 8 KV heads, head_dim 128,
 * 16-token blocks): a prompt of P tokens in one call (GFLOP/s, 2 per
 * multiply-add of q.k and p.v) and one decode step at context P (GB/s of
 * K/V read), best of R. --layers L lays the cache out as a model of L
 * layers would (each block holds every layer's rows; layer 0 is read), and
 * --thp asks for transparent huge pages for it.
 *
 *   bench_attention [--ctx P] [--threads T] [--kv f32|bf16] [--reps R] [--decode-only]
 *                   [--layers L] [--thp] */
#include <math.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "backend/cpu/attention.h"
#include "base/half.h"
#include "base/threadpool.h"

/* A uniform value in [-0.5, 0.5) from the generator state *r. */
static float urand(unsigned *r)
{
    *r = *r * 1103515245u + 12345u;
    return (float)(*r >> 8) / 16777216.0f - 0.5f;
}


int main(int argc, char **argv)
{
    int ctx = 2048, threads = 0, reps = 3, bf16 = 0, decode_only = 0, layers = 1, thp = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ctx") && i + 1 < argc)
            ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc && !strcmp(argv[i + 1], "bf16"))
            bf16 = 1, i++;
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc && !strcmp(argv[i + 1], "f32"))
            i++;
        else if (!strcmp(argv[i], "--decode-only"))
            decode_only = 1;
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--thp"))
            thp = 1;
        else {
            fprintf(stderr,
                    "usage: bench_attention [--ctx P] [--threads T] [--kv f32|bf16] [--reps R] "
                    "[--decode-only] [--layers L] [--thp]\n");
            return 2;
        }
    }
    if (ctx < 1 || reps < 1 || layers < 1) {
        fprintf(stderr, "bench_attention: --ctx, --reps and --layers must be at least 1\n");
        return 2;
    }
    enum { HEADS = 16, KV = 8, HD = 128, BS = 16 };
    struct err e;
    struct threadpool *tp = tp_create(threads, &e);
    if (!tp) {
        fprintf(stderr, "bench_attention: %s\n", e.msg);
        return 1;
    }
    int nblk = (ctx + BS - 1) / BS;
    struct kv_pool pool = {.n_layers = layers, .n_kv_heads = KV, .head_dim = HD, .kv_dim = KV * HD,
                           .block_size = BS, .n_blocks = nblk,
                           .dtype = bf16 ? DT_BF16 : DT_F32, .elt_bytes = bf16 ? 2 : 4};
    size_t elts = (size_t)nblk * layers * BS * KV * HD, bytes = elts * pool.elt_bytes;
    size_t huge = (size_t)1 << 21, rounded = (bytes + huge - 1) & ~(huge - 1);
    pool.k = aligned_alloc(huge, rounded);
    pool.v = aligned_alloc(huge, rounded);
    if (thp && pool.k && pool.v) { /* as the CPU backend's pool (cpu_alloc) */
        madvise(pool.k, bytes, MADV_HUGEPAGE);
        madvise(pool.v, bytes, MADV_HUGEPAGE);
    }
    int *blocks = malloc(sizeof(int) * nblk);
    float *q = malloc(sizeof(float) * (size_t)ctx * HEADS * HD);
    float *out = malloc(sizeof(float) * (size_t)ctx * HEADS * HD);
    if (!pool.k || !pool.v || !blocks || !q || !out) {
        fprintf(stderr, "bench_attention: out of memory for a context of %d\n", ctx);
        return 1;
    }
    for (int b = 0; b < nblk; b++)
        blocks[b] = b;
    unsigned r = 1;
    for (size_t i = 0; i < elts; i++) {
        float k = urand(&r), v = urand(&r);
        if (bf16) {
            ((uint16_t *)pool.k)[i] = f32_to_bf16(k);
            ((uint16_t *)pool.v)[i] = f32_to_bf16(v);
        } else {
            ((float *)pool.k)[i] = k;
            ((float *)pool.v)[i] = v;
        }
    }
    for (size_t i = 0; i < (size_t)ctx * HEADS * HD; i++)
        q[i] = urand(&r);
    struct kv_seq seq = {.blocks = blocks, .n_blocks = nblk, .cap_blocks = nblk, .n_tokens = ctx};
    struct cpu_att_scratch sc = {0};
    int found = cpu_isa_detect(&e); /* CLLM_ISA=avx2|scalar measures the others */
    if (found < 0) {
        fprintf(stderr, "bench_attention: %s\n", e.msg);
        return 1;
    }
    const enum cpu_isa isa = (enum cpu_isa)found;
    struct attn_args pre = {.n = ctx, .pos0 = 0, .n_heads = HEADS, .n_kv_heads = KV,
                            .head_dim = HD, .scale = 1.0f / sqrtf((float)HD)};
    struct attn_args dec = pre;
    dec.n = 1;
    dec.pos0 = ctx - 1;
    double best_p = INFINITY, best_d = INFINITY;
    for (int i = 0; i < reps; i++) {
        double t0 = clock_now_s();
        if (!decode_only && cpu_paged_attention(tp, &sc, isa, out, q, &pool, &seq, 0, &pre, &e)) {
            fprintf(stderr, "bench_attention: %s\n", e.msg);
            return 1;
        }
        double t1 = clock_now_s();
        for (int s = 0; s < 20; s++)
            cpu_paged_attention(tp, &sc, isa, out, q, &pool, &seq, 0, &dec, &e);
        double t2 = clock_now_s();
        best_p = fmin(best_p, t1 - t0);
        best_d = fmin(best_d, (t2 - t1) / 20);
    }
    double macs = (double)ctx * (ctx + 1) / 2 * HEADS * HD * 2; /* q.k and p.v */
    double kv_bytes = (double)ctx * KV * HD * 2 * pool.elt_bytes;
    printf("attention  ctx %d  %s K/V  %d threads  %s\n", ctx, bf16 ? "bf16" : "f32", tp_size(tp),
           cpu_isa_name(isa));
    if (!decode_only)
        printf("prefill    %8.2f ms  %7.1f GFLOP/s\n", best_p * 1e3, 2 * macs / best_p / 1e9);
    printf("decode     %8.3f ms  %7.1f GB/s of K/V\n", best_d * 1e3, kv_bytes / best_d / 1e9);
    cpu_att_scratch_free(&sc);
    tp_destroy(tp);
    free(pool.k);
    free(pool.v);
    free(blocks);
    free(q);
    free(out);
    return 0;
}
