/* attention_impl.h - what the CPU attention's scheduler (attention.c) and
 * its kernels, built once per instruction set (attention_kern.h through
 * attention_v4.c, attention_v3.c, attention_base.c), share: the tiling
 * constants, a job's description and the kernels' table. Internal to the
 * CPU backend. */
#ifndef CLLM_BACKEND_CPU_ATTENTION_IMPL_H
#define CLLM_BACKEND_CPU_ATTENTION_IMPL_H

#include <stdatomic.h>
#include <stddef.h>

#include "backend/backend.h"
#include "kv/kv_cache.h"

/* Query tokens per prompt job, at most: with 2-8 query heads per KV head,
 * 128-512 rows share each key tile. A prompt's tiles come from L3 or
 * memory, and 16 tokens (reading them four times as often) ran at ~60 % of
 * the speed. A prompt with too few jobs for the threads takes smaller
 * tiles, down to ATT_QT_MIN: a row's arithmetic does not depend on the
 * rows beside it. */
#define ATT_QT 64
#define ATT_QT_MIN 16
/* Keys per tile. Tiles start at multiples of ATT_KT positions, so a row's
 * online softmax steps through the same tiles whatever call or job it is
 * in: prefilling a prompt in one call or in chunks gives the same bits.
 * 64 rather than 32: each tile costs a pass over the rows' outputs and
 * softmax bookkeeping besides its multiply-adds (prompt +12 %, measured). */
#define ATT_KT 64
/* A job of at most ATT_PF_ROWS query tokens (decode, keys within one
 * chunk) asks for its K/V rows ATT_PF_TILES tiles ahead, into L2: a decode
 * row has little arithmetic per key to cover a miss with. (Measured when
 * a head's keys were 4 KB apart, one a page, where the hardware
 * prefetchers stop; now a block's rows of a head lie together.) Prompt
 * tiles do enough arithmetic per row to cover the misses. */
#define ATT_PF_ROWS 4
#define ATT_PF_TILES 4
/* Keys per chunk (a multiple of ATT_KT, chunks at multiples of it). A row
 * attends chunk by chunk: an online softmax over the chunk's tiles from
 * nothing, then folded into the chunks before it, in order (att_fold). A
 * prompt's job folds each row's chunks as it passes them; a decode step of
 * at most ATT_PF_ROWS tokens whose keys span chunks makes each chunk a job
 * of its own (att_chunk_body), all heads at once, and folds them after.
 * Either way the same operations in the same order: the same bits.
 *
 * Why decode goes by chunks: a job a KV head (the other path) gives a
 * step only n_kv_heads jobs, and with more threads than that it splits a
 * KV head's query heads, each part reading the same keys again; chunks
 * give any thread count work without reading a key twice, and a job's
 * reads are its chunk's blocks, whole (docs/benchmarks.md). */
#define ATT_KC 256

struct att_kernels;

struct att_job {
    float *out;
    const float *q;
    const struct kv_pool *pool;
    const struct kv_seq *seq;
    int layer;
    const struct attn_args *a;
    int group;      /* query heads per KV head */
    int head_parts; /* jobs a KV head's query heads are split into */
    int qt;         /* query tokens per tile */
    int n_qt;       /* query token tiles */
    int n_jobs;
    float *scratch;
    size_t per_slot;
    /* decode by chunks (att_chunk_body): chunks c0.., each in kv_parts jobs
     * of KV heads; chunk c's (token i, head h) partial at
     * part + ((c - c0) * n + i) * n_heads + h, hd + 2 floats (o, m, l) */
    int c0, n_chunks, kv_parts;
    float *part;
    const struct att_kernels *kern; /* the instruction set's kernels */
    atomic_int next;
};

static inline int att_start(const struct attn_args *a, int pos)
{
    return a->sliding_window > 0 && pos - a->sliding_window + 1 > 0 ? pos - a->sliding_window + 1
                                                                     : 0;
}

/* One instruction set's kernels. job and chunk run job jb of j with a
 * thread's scratch, [0] for an f32 cache, [1] for bf16; fold_chunks folds
 * a decode step's chunk partials into its rows. A row gets the same bits
 * from every kernel of one table. */
struct att_kernels {
    void (*job[2])(const struct att_job *j, int jb, float *scratch);
    void (*chunk[2])(const struct att_job *j, int jb, float *scratch);
    void (*fold_chunks)(const struct att_job *j);
};

/* Built for AVX-512 (F, BW, VL, DQ) and for AVX2 + FMA + F16C on x86-64;
 * base for the build's own target everywhere. */
#if defined(__x86_64__)
extern const struct att_kernels att_kernels_v4, att_kernels_v3;
#endif
extern const struct att_kernels att_kernels_base;

#endif
