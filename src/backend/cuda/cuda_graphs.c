/* cuda_graphs.c - decode steps as CUDA graphs (see backend_cuda.c's file
 * comment): graph keys, recording and replay in the step_begin / step_end
 * hooks, and their counts. */
#include "backend/cuda/cuda_internal.h"
#include "base/clock.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool graph_key_eq(const struct step_graph *a, const struct step_graph *b)
{
    return a->owner == b->owner && a->kpool == b->kpool && a->bucket == b->bucket &&
           a->n_seg == b->n_seg && a->n_tok == b->n_tok && a->rows == b->rows &&
           a->pick == b->pick && a->par == b->par;
}

static struct step_graph *graph_find(struct cuda_backend *c, const struct step_graph *key)
{
    for (int i = 0; i < c->n_graphs; i++)
        if (graph_key_eq(&c->cache[i], key))
            return &c->cache[i];
    return NULL;
}

/* Whether a batched decode shape was seen before (it is remembered now):
 * a shape's first step runs eagerly and sizes every buffer, the next
 * records. */
static bool seen_before(struct cuda_backend *c, const struct step_graph *key)
{
    for (int i = 0; i < c->n_seen; i++)
        if (graph_key_eq(&c->seen[i], key))
            return true;
    if (c->n_seen == SEEN_KEYS) { /* forget the oldest */
        memmove(c->seen, c->seen + 1, sizeof c->seen[0] * (SEEN_KEYS - 1));
        c->n_seen--;
    }
    c->seen[c->n_seen++] = *key;
    return false;
}

/* Makes h_step's halves and step hold at least cap table entries. */
static int step_reserve(struct cuda_backend *c, int cap)
{
    if (c->h_step && c->step_cap >= cap)
        return 0;
    cudaStreamSynchronize(c->stream);
    c->rec_pending[0] = c->rec_pending[1] = false;
    graphs_flush(c); /* graphs name the old buffers */
    if (c->h_step)
        cudaFreeHost(c->h_step);
    c->h_step = NULL;
    c->step_cap = 0;
    size_t ints = (size_t)cap + 1 + REC_MAX_TOKENS;
    if (fail_cuda(c, "pinned step record",
                  cudaHostAlloc((void **)&c->h_step, 2 * sizeof(int) * ints, 0)) ||
        !dbuf_get(c, &c->step, sizeof(int) * ints, "step record")) {
        c->h_step = NULL;
        return -1;
    }
    c->step_ints = ints;
    c->step_cap = cap;
    return 0;
}

/* The half of h_step a single-sequence step writes its record to, once
 * the last step that read it has finished: a decode takes the halves in
 * turn (a few tokens' step the first: its graphs stay one per shape). */
static int *record_half(struct cuda_backend *c, bool few, int *par)
{
    *par = few ? 0 : c->rec_par;
    if (!few)
        c->rec_par ^= 1;
    if (c->rec_pending[*par]) {
        fail_cuda(c, "wait for the step record", cudaEventSynchronize(c->rec_ev[*par]));
        c->rec_pending[*par] = false;
    }
    return c->h_step + (size_t)*par * c->step_ints;
}

/* Marks the end of the step (replayed or just recorded) that reads the
 * record half par. */
static void record_read(struct cuda_backend *c, int par)
{
    c->rec_pending[par] = cudaEventRecord(c->rec_ev[par], c->stream) == cudaSuccess;
}

/* Starts recording the stream's ops as the graph of key; false with the
 * failure kept. */
static bool capture_begin(struct cuda_backend *c, const struct step_graph *key)
{
    if (fail_cuda(c, "begin graph capture",
                  cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal)))
        return false;
    c->capturing = true;
    c->rec = *key;
    return true;
}

/* A batched decode step (st->decodes): its ids go to the device first, so
 * embed reads them from there in every form of the step. Graphs are keyed
 * by (forward state, KV pool, sequences, block-table bucket of the longest
 * table); the metadata (positions, padded tables: bat_plan) is copied
 * before the step's ops or its replay, which reads it where the recording
 * did. Recording needs the attention geometry, which a previous step's
 * attention op left in batt. */
static int batch_step_begin(struct cuda_backend *c, const struct backend_step *st, struct err *e)
{
    int bucket = 0;
    for (int s = 0; s < st->n_seg; s++) {
        int b = table_bucket(st->segs[s].seq->n_blocks);
        bucket = b > bucket ? b : bucket;
    }
    if (!ids_upload(c, st->tokens, st->n))
        return sticky(c, e);
    c->bstep = bucket;
    c->bowner = st->owner;
    if (!c->graphs || !c->bgraphs || c->batt_owner != st->owner)
        return 0;
    struct step_graph key = {.owner = st->owner, .kpool = st->pool->k, .bucket = bucket,
                             .n_seg = st->n_seg};
    struct step_graph *g = graph_find(c, &key);
    if (!g && !seen_before(c, &key))
        return 0;
    struct attn_args att = g ? g->att : c->batt;
    struct bat_plan p;
    if (bat_plan(c, st->segs, st->n_seg, st->pool, 0, &att, bucket, &p, e))
        return -1;
    /* Size what the step uses while synchronizing is still allowed (a
     * buffer that grows drops every graph: look the graph up after). */
    float *ws;
    unsigned *cnt;
    if (!bat_buffers(c, &p, &ws, &cnt))
        return sticky(c, e);
    if ((g = graph_find(c, &key))) {
        if (fail_cuda(c, "graph launch", cudaGraphLaunch(g->exec, c->stream)))
            return sticky(c, e);
        c->g_rep[1]++;
        return 1;
    }
    key.att = att;
    return capture_begin(c, &key) ? 0 : sticky(c, e);
}

int cu_step_begin(struct backend *be, const struct backend_step *st, struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    use_device(c);
    if (sticky(c, e))
        return -1;
    if (c->timing) {
        c->t_begin = clock_now_s();
        const int prev = c->t_b;
        c->t_b = st->n == 1 && st->logits ? 0 : st->n == st->n_seg ? 1 : 2;
        /* only from one decode step to the next of the same kind */
        if (c->t_end > 0 && c->t_b < 2 && c->t_b == prev) {
            c->t_gap[c->t_b] += (c->t_begin - c->t_end) * 1e3;
            c->t_gaps[c->t_b]++;
        }
        c->t_end = 0;
        c->t_open = cudaEventRecord(c->ev[0], c->stream) == cudaSuccess;
    }
    c->bstep = 0;
    if (st->decodes && st->n_seg > 1 && st->n == st->n_seg && st->segs)
        return batch_step_begin(c, st, e);
    /* A step of one sequence's few tokens that ends with logits, every
     * row's (a speculative step's verification) or the last's (a draft
     * model's catch-up), of as many tokens as the decode kernel takes:
     * recorded and replayed as a decode is, its shape's first step run
     * eagerly to size its buffers. */
    bool few = (st->rows || st->logits) && st->n_seg == 1 && st->n > 1 &&
                st->n <= c->att_dec_rows && st->n <= REC_MAX_TOKENS && c->rgraphs;
    if (!c->graphs || !(few || (st->n == 1 && st->logits)))
        return 0;
    if (!few && (c->eager_decodes < 1 || !c->att_heads)) { /* the first decode step warms up */
        c->eager_decodes++;
        return 0;
    }
    const struct kv_seq *seq = st->seq;
    struct step_graph key = {.owner = st->owner, .kpool = st->pool->k,
                             .bucket = table_bucket(seq->n_blocks), .n_seg = 1,
                             .n_tok = st->n, .rows = st->rows,
                             .pick = st->pick_k == 1 && c->head_mem}; /* the k it takes */
    if (few && !graph_find(c, &key) && !seen_before(c, &key))
        return 0;
    if (step_reserve(c, key.bucket))
        return sticky(c, e);
    int *rec = record_half(c, few, &key.par);
    if (sticky(c, e))
        return -1;
    c->rec_n = st->n;
    rec[0] = st->pos0;
    memcpy(rec + 1, st->tokens, sizeof(int) * (size_t)st->n);
    memcpy(rec + 1 + st->n, seq->blocks, sizeof(int) * (size_t)seq->n_blocks);
    struct step_graph *g = graph_find(c, &key);
    if (g) {
        if (fail_cuda(c, "graph launch", cudaGraphLaunch(g->exec, c->stream)))
            return sticky(c, e);
        record_read(c, key.par);
        c->g_rep[0]++;
        return 1;
    }
    /* Size what the recording will use while synchronizing is still allowed
     * (a few tokens' step: its shape's eager step did). */
    size_t ws = (size_t)c->att_heads * MAX_SPLITS * (size_t)(c->att_hd + 2) * sizeof(float);
    if (!few && (!dbuf_get(c, &c->ws, ws, "attention workspace") ||
                  !att_counters(c, (size_t)c->att_heads)))
        return sticky(c, e);
    if (!capture_begin(c, &key))
        return sticky(c, e);
    if (fail_cuda(c, "copy step record",
                  cudaMemcpyAsync(c->step.p, rec,
                                  sizeof(int) * (size_t)(key.bucket + 1 + key.n_tok),
                                  cudaMemcpyHostToDevice, c->stream))) {
        /* step_end abandons the recording */
    }
    return 0;
}

int cu_step_end(struct backend *be, int ops_rc, struct err *e)
{
    pend_settle(cb(be)); /* see c->pend */
    struct cuda_backend *c = cb(be);
    bool batch = c->bstep > 0;
    c->bstep = 0;
    if (!c->capturing)
        return 0;
    c->capturing = false;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t err = cudaStreamEndCapture(c->stream, &graph);
    bool ok = ops_rc == 0 && !c->err[0] && err == cudaSuccess && graph;
    if (ok)
        ok = (err = cudaGraphInstantiate(&exec, graph, 0)) == cudaSuccess;
    if (graph)
        cudaGraphDestroy(graph);
    if (!ok) {
        fprintf(stderr, "%s: recording the %s step as a CUDA graph failed (%s); decoding "
                        "without graphs\n", c->name, batch ? "batched decode" : "decode",
                c->err[0] ? c->err : ops_rc ? e->msg : cudaGetErrorString(err));
        c->err[0] = 0; /* nothing ran: the device state is intact */
        cudaGetLastError();
        if (batch) /* single decodes keep theirs */
            c->bgraphs = false;
        else if (c->rec.n_tok > 1) /* and so do they here */
            c->rgraphs = false;
        else
            c->graphs = false;
        return 1;
    }
    if (c->n_graphs == MAX_GRAPHS) { /* drop the oldest */
        cudaGraphExecDestroy(c->cache[0].exec);
        memmove(c->cache, c->cache + 1, sizeof c->cache[0] * (MAX_GRAPHS - 1));
        c->n_graphs--;
    }
    c->rec.exec = exec;
    c->cache[c->n_graphs++] = c->rec;
    c->g_rec[batch]++;
    if (fail_cuda(c, "graph launch", cudaGraphLaunch(exec, c->stream)))
        return sticky(c, e);
    if (!batch)
        record_read(c, c->rec.par);
    return 0;
}

void cu_step_stats(struct backend *be, long recorded[2], long replayed[2])
{
    struct cuda_backend *c = cb(be);
    for (int i = 0; i < 2; i++) {
        recorded[i] = c->g_rec[i];
        replayed[i] = c->g_rep[i];
    }
}
