/* attention.c - the CPU's paged attention over the KV cache (f32 or bf16) as an
 * online softmax over tiles of keys, chunk by chunk: the jobs and threads.
 * A prompt's job takes a KV head (or some of the query heads sharing it)
 * and a tile of query tokens, and reads each tile of keys and values once
 * for all of its rows, so a long prompt's K/V come from cache rather than
 * memory once per (token, head); a tile's scores are a small matrix
 * product over K's transposed panels (kv_k_offset). A decode step's job
 * takes a chunk of keys for every head, reading its cache blocks whole,
 * and the chunks are merged after. The kernels (attention_kern.h) are
 * built once per instruction set and picked by the backend's. */
#include "backend/cpu/attention.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "backend/cpu/attention_impl.h"
#include "base/threadpool.h"
#include "model/tensor.h"

static void att_worker(void *ctx, int ith, int nth)
{
    (void)nth;
    struct att_job *j = ctx;
    float *scratch = j->scratch + (size_t)ith * j->per_slot;
    const bool bf16 = j->pool->dtype == DT_BF16;
    for (;;) {
        int jb = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (jb >= j->n_jobs)
            return;
        if (j->part)
            j->kern->chunk[bf16](j, jb, scratch);
        else
            j->kern->job[bf16](j, jb, scratch);
    }
}

/* At least nth slots of per floats in s. */
static int att_slots(struct cpu_att_scratch *s, int nth, size_t per, struct err *e)
{
    if (s->slots >= nth && s->floats_per_slot >= per)
        return 0;
    per = s->floats_per_slot > per ? s->floats_per_slot : per;
    float *b = malloc(per * (size_t)nth * sizeof(float));
    if (!b)
        return err_set(e, "attention: out of memory for %d threads' scratch", nth);
    free(s->buf);
    s->buf = b;
    s->floats_per_slot = per;
    s->slots = nth;
    return 0;
}

static void att_go(struct threadpool *tp, struct att_job *j)
{
    atomic_init(&j->next, 0);
    if (tp_size(tp) > 1 && j->n_jobs > 1)
        tp_run(tp, att_worker, j);
    else
        att_worker(j, 0, 1);
}

/* A decode step whose keys span chunks: a job a chunk (or a share of its
 * KV heads, when there are too few chunks to keep the threads busy), then
 * the chunks folded. */
static int att_by_chunks(struct threadpool *tp, struct cpu_att_scratch *s, struct att_job *j,
                         struct err *e)
{
    const struct attn_args *a = j->a;
    int nth = tp_size(tp);
    j->kv_parts = 1;
    while (j->kv_parts < a->n_kv_heads && j->n_chunks * j->kv_parts < 2 * nth)
        j->kv_parts *= 2;
    if (j->kv_parts > a->n_kv_heads)
        j->kv_parts = a->n_kv_heads;
    j->n_jobs = j->n_chunks * j->kv_parts;
    size_t need = (size_t)j->n_chunks * a->n * a->n_heads * (a->head_dim + 2);
    if (s->part_floats < need) {
        float *b = malloc(need * sizeof(float));
        if (!b)
            return err_set(e, "attention: out of memory for %d chunks' partial sums", j->n_chunks);
        free(s->part);
        s->part = b;
        s->part_floats = need;
    }
    j->part = s->part;
    if (att_slots(s, nth, (size_t)ATT_KT * a->n * j->group, e))
        return -1;
    j->per_slot = s->floats_per_slot;
    j->scratch = s->buf;
    att_go(tp, j);
    j->kern->fold_chunks(j);
    return 0;
}

/* The kernels built for isa, or the best of those below it. */
static const struct att_kernels *att_kernels_for(enum cpu_isa isa)
{
#if defined(__x86_64__)
    if (isa >= CPU_ISA_AVX512)
        return &att_kernels_v4;
    if (isa >= CPU_ISA_AVX2)
        return &att_kernels_v3;
#endif
    (void)isa;
    return &att_kernels_base;
}

int cpu_paged_attention(struct threadpool *tp, struct cpu_att_scratch *s, enum cpu_isa isa,
                        float *out, const float *q, const struct kv_pool *pool,
                        const struct kv_seq *seq, int layer, const struct attn_args *a,
                        struct err *e)
{
    if (a->n <= 0)
        return 0;
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0 || a->head_dim <= 0)
        return err_set(e, "attention: %d query heads do not group over %d KV heads",
                       a->n_heads, a->n_kv_heads);
    if (pool->dtype != DT_F32 && pool->dtype != DT_BF16)
        return err_set(e, "attention: the CPU reads K/V in f32 or bf16, not %s",
                       dtype_name((enum dtype)pool->dtype));
    int nth = tp_size(tp);
    struct att_job j = {.out = out, .q = q, .pool = pool, .seq = seq, .layer = layer, .a = a,
                        .kern = att_kernels_for(isa)};
    j.group = a->n_heads / a->n_kv_heads;
    int lo = att_start(a, a->pos0), hi = a->pos0 + a->n - 1;
    j.c0 = (lo - lo % ATT_KT) / ATT_KC;
    j.n_chunks = hi / ATT_KC - j.c0 + 1;
    if (a->n <= ATT_PF_ROWS && j.n_chunks > 1)
        return att_by_chunks(tp, s, &j, e);
    /* Too few jobs to keep every thread busy: smaller query tiles, then
     * (one token, few KV heads) the query heads of a KV head split, each
     * part reading its keys. */
    j.qt = ATT_QT;
    while (j.qt > ATT_QT_MIN && a->n_kv_heads * ((a->n + j.qt - 1) / j.qt) < 4 * nth)
        j.qt /= 2;
    j.n_qt = (a->n + j.qt - 1) / j.qt;
    j.head_parts = 1;
    while (j.head_parts < j.group && a->n_kv_heads * j.n_qt * j.head_parts < 2 * nth)
        j.head_parts *= 2;
    if (j.head_parts > j.group)
        j.head_parts = j.group;
    j.n_jobs = j.n_qt * a->n_kv_heads * j.head_parts;
    j.per_slot = (size_t)j.qt * j.group * (ATT_KT + 4 + (size_t)a->head_dim);
    if (att_slots(s, nth, j.per_slot, e))
        return -1;
    j.per_slot = s->floats_per_slot;
    j.scratch = s->buf;
    att_go(tp, &j);
    return 0;
}

void cpu_att_scratch_free(struct cpu_att_scratch *s)
{
    free(s->buf);
    free(s->part);
    s->part = NULL;
    s->part_floats = 0;
    s->buf = NULL;
    s->floats_per_slot = 0;
    s->slots = 0;
}
