/* attention.h - the CPU backend's paged attention over an f32 or bf16 KV cache. */
#ifndef CLLM_BACKEND_CPU_ATTENTION_H
#define CLLM_BACKEND_CPU_ATTENTION_H

#include <stddef.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "base/err.h"
#include "kv/kv_cache.h"

struct threadpool;

/* Per-slot working memory, grown on demand. Owned by the CPU backend. */
struct cpu_att_scratch {
    float *buf;
    size_t floats_per_slot;
    int slots;
    float *part; /* a decode step's chunk partials */
    size_t part_floats;
};

/* out[i][h] = softmax(q[i][h] . K[0..pos] * scale) . V[0..pos] for the n
 * query rows at positions pos0.. (causal, within a->sliding_window), K and
 * V read from layer `layer` of seq's blocks (pool->dtype DT_F32 or
 * DT_BF16; anything else is refused). Threaded on tp over (KV head, tile
 * of query tokens), or for a decode step of a few tokens over chunks of
 * its keys. A row's arithmetic depends only on its position and its keys
 * (key tiles and chunks sit at fixed multiples of positions), not on how
 * the rows were split into calls or jobs, nor on the thread count. The
 * kernels are those built for isa (cpu_isa_detect's), or the best below
 * it that was built; AVX2 and AVX-512 give the same bits. */
int cpu_paged_attention(struct threadpool *tp, struct cpu_att_scratch *s, enum cpu_isa isa,
                        float *out, const float *q, const struct kv_pool *pool,
                        const struct kv_seq *seq, int layer, const struct attn_args *a,
                        struct err *e);

void cpu_att_scratch_free(struct cpu_att_scratch *s);

#endif
