/* cuda_attention.c - the CUDA backend's RoPE, K/V store and attention:
 * block tables on the device, the kernel each shape goes to (decode,
 * tiled, tensor-core), the key-split merge left to the o projection, and
 * a batch step's plan and metadata. */
#include "backend/cuda/cuda_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The device copy of the RoPE frequency table, copied again only when it
 * changed; NULL (with the failure kept) on error. */
const float *dev_invf(struct cuda_backend *c, const float *inv_freq, int half)
{
    if (half != c->invf_n || memcmp(c->invf_host, inv_freq, sizeof(float) * (size_t)half)) {
        if (c->capturing) {
            fail_msg(c, "rope: the frequency table changed while recording a graph");
            return NULL;
        }
        float *h = realloc(c->invf_host, sizeof(float) * (size_t)(half ? half : 1));
        float *d = dbuf_get(c, &c->invf, sizeof(float) * (size_t)(half ? half : 1), "rope table");
        if (!h || !d) {
            fail_msg(c, "rope: out of memory");
            return NULL;
        }
        c->invf_host = h;
        memcpy(h, inv_freq, sizeof(float) * (size_t)half);
        c->invf_n = half;
        if (fail_cuda(c, "copy rope table", cudaMemcpyAsync(d, h, sizeof(float) * (size_t)half,
                                                            cudaMemcpyHostToDevice, c->stream)))
            return NULL;
    }
    return c->invf.p;
}

void cu_rope(struct backend *be, float *x, int n, int n_heads, int head_dim, int pos0,
             const float *inv_freq, bool interleaved)
{
    struct cuda_backend *c = op_begin(be);
    if (c->err[0])
        return;
    const float *invf = dev_invf(c, inv_freq, head_dim / 2);
    if (!invf)
        return;
    fail_cuda(c, "rope", cuk_rope(c->stream, x, n, n_heads, head_dim, pos0,
                                  c->capturing ? (const int *)c->step.p : NULL, invf,
                                  interleaved));
}

int table_bucket(int n_blocks)
{
    int b = 64;
    while (b < n_blocks)
        b *= 2;
    return b;
}

const int *dev_table(struct cuda_backend *c, const struct kv_seq *seq)
{
    if (c->capturing) /* the table comes with the step record, after its ids */
        return (const int *)c->step.p + 1 + c->rec_n;
    int nb = seq->n_blocks;
    if (nb == c->tab_n && c->table.p && !memcmp(c->tab_host, seq->blocks, sizeof(int) * (size_t)nb))
        return c->table.p;
    if (nb > c->tab_cap) {
        int cap = c->tab_cap ? c->tab_cap : 64;
        while (cap < nb)
            cap *= 2;
        int *h = realloc(c->tab_host, sizeof(int) * (size_t)cap);
        if (!h) {
            fail_msg(c, "block table: out of memory");
            return NULL;
        }
        c->tab_host = h;
        c->tab_cap = cap;
    }
    if (!dbuf_get(c, &c->table, sizeof(int) * (size_t)c->tab_cap, "block table"))
        return NULL;
    memcpy(c->tab_host, seq->blocks, sizeof(int) * (size_t)nb);
    c->tab_n = nb;
    if (!upload_async(c, &c->up_tab, c->table.p, c->tab_host, sizeof(int) * (size_t)nb,
                      "copy block table"))
        return NULL;
    return c->table.p;
}

unsigned *att_counters(struct cuda_backend *c, size_t count)
{
    size_t bytes = (count ? count : 1) * sizeof(unsigned);
    if (c->cnt.p && c->cnt.cap >= bytes)
        return c->cnt.p;
    void *p = dbuf_get(c, &c->cnt, bytes, "attention split counters");
    if (p && fail_cuda(c, "zero split counters", cudaMemsetAsync(p, 0, c->cnt.cap, c->stream)))
        return NULL;
    return p;
}

void pend_settle(struct cuda_backend *c)
{
    if (!c->pend.out)
        return;
    float *out = c->pend.out;
    c->pend.out = NULL;
    use_device(c); /* some ops call it before their own use_device */
    fail_cuda(c, "attention merge",
              cuk_attention_merge(c->stream, out, c->pend.ws, (const int *)c->dn.p,
                                  c->pend.n_heads, c->pend.n_kv_heads, c->pend.head_dim,
                                  c->pend.splits));
}

/* Whether leaving a one-query decode step's merge of `splits` key splits
 * to the o projection pays: every block of that GEMV then reads all the
 * partials (heads x head_dim x splits floats), which must stay below its
 * share of o's weights (model_dim rows of the same columns, bf16) for the
 * saved merge stage to win. Measured on the H200 (docs/benchmarks.md,
 * eleventh pass): Llama-3.1-8B (4,096 rows, 9 splits: 36 bytes a column
 * of partials against 62 of weights) 241.8 -> 243.9 tok/s; Qwen3-0.6B
 * (1,024 rows, 16 splits: 64 against 15.5) 1,134 -> 1,109. */
static bool defer_pays(const struct cuda_backend *c, int splits)
{
    return 4L * splits * c->n_sms <= 2L * c->model_dim;
}

cudaError_t pend_o_gemv(struct cuda_backend *c, float *out, const struct tensor *t)
{
    if (!c->fuse || !c->gemv_staged || c->gemv_max < 1 ||
        (size_t)t->cols != (size_t)c->pend.n_heads * (size_t)c->pend.head_dim)
        return cudaErrorNotSupported;
    const struct cuk_weight *w = dev_weight(c, t, "matmul");
    if (!w)
        return cudaErrorNotSupported;
    struct cuk_gemv_in gi = {.kind = CUK_IN_SPLITS, .x = c->pend.ws, .nused = (const int *)c->dn.p,
                             .n_splits = c->pend.splits, .head_dim = c->pend.head_dim};
    cudaError_t err = cuk_gemv_staged(c->stream, &out, &gi, 1, &w, 1, CUK_OUT_ADD, &c->stage);
    if (err == cudaSuccess)
        c->pend.out = NULL;
    return err;
}

bool pool_takes(const struct kv_pool *pool, int n_kv_heads, int head_dim)
{
    return n_kv_heads == pool->n_kv_heads && head_dim == pool->head_dim;
}

struct cuk_attn attn_geom(const struct cuda_backend *c, const struct kv_pool *pool, int layer,
                          int n, int pos0)
{
    struct cuk_attn g = {0};
    g.n_sms = c->n_sms;
    g.rows_per_warp = c->att_rpw;
    g.mma = c->att_mma;
    g.pf_mt = c->att_pf_mt;
    g.kv_bf16 = pool->dtype == DT_BF16;
    g.n = n;
    g.pos0 = pos0;
    g.n_layers = pool->n_layers;
    g.layer = layer;
    g.block_size = pool->block_size;
    g.kv_dim = pool->kv_dim;
    /* the pool's layout (cuk_kv_row, cuk_kv_col) */
    g.n_kv_heads = pool->n_kv_heads;
    g.head_dim = pool->head_dim;
    g.pool_blocks = pool->n_blocks;
    g.kv_swz = g.kv_bf16 && pool->head_dim % 64 == 0;
    return g;
}

void cu_kv_store(struct backend *be, struct kv_pool *pool, const struct kv_seq *seq,
                 int layer, const float *k, const float *v, int n, int pos0)
{
    struct cuda_backend *c = op_begin(be);
    if (c->err[0])
        return;
    if (pos0 + n > seq->n_blocks * pool->block_size) {
        fail_msg(c, "kv_store: positions beyond the sequence's blocks");
        return;
    }
    const int *tab = dev_table(c, seq);
    struct cuk_attn g = attn_geom(c, pool, layer, n, pos0);
    if (tab)
        fail_cuda(c, "kv_store", cuk_kv_store(c->stream, pool->k, pool->v, tab, &g,
                                              c->capturing ? (const int *)c->step.p : NULL, k, v));
}

/* q/k norm, rope(q), rope(k), kv_store(k, v) in one launch. */
void cu_rope_kv_store(struct backend *be, float *q, float *k, const float *v, int n,
                      int n_heads, int n_kv_heads, int head_dim, int pos0,
                      const float *inv_freq, bool interleaved, const struct qk_norm *norm,
                      struct kv_pool *pool, const struct kv_seq *seq, int layer)
{
    struct cuda_backend *c = op_begin(be);
    if (c->err[0])
        return;
    const float *qn = norm ? norm->q : NULL, *kn = norm ? norm->k : NULL;
    float eps = norm ? norm->eps : 0.0f;
    /* the kernel's norm follows the rmsnorm kernels of rows <= 512 */
    if (!c->fuse || !pool_takes(pool, n_kv_heads, head_dim) || ((qn || kn) && head_dim > 512)) {
        if (qn)
            cu_rmsnorm(be, q, q, qn, n * n_heads, head_dim, eps);
        if (kn)
            cu_rmsnorm(be, k, k, kn, n * n_kv_heads, head_dim, eps);
        cu_rope(be, q, n, n_heads, head_dim, pos0, inv_freq, interleaved);
        cu_rope(be, k, n, n_kv_heads, head_dim, pos0, inv_freq, interleaved);
        cu_kv_store(be, pool, seq, layer, k, v, n, pos0);
        return;
    }
    if (pos0 + n > seq->n_blocks * pool->block_size) {
        fail_msg(c, "kv_store: positions beyond the sequence's blocks");
        return;
    }
    const float *dqn = qn ? dev_vec(c, qn, "rope_kv_store") : NULL;
    const float *dkn = kn ? dev_vec(c, kn, "rope_kv_store") : NULL;
    if ((qn && !dqn) || (kn && !dkn))
        return;
    const float *invf = dev_invf(c, inv_freq, head_dim / 2);
    const int *tab = invf ? dev_table(c, seq) : NULL;
    if (!tab)
        return;
    struct cuk_attn g = attn_geom(c, pool, layer, n, pos0);
    fail_cuda(c, "rope_kv_store",
              cuk_rope_kv_store(c->stream, q, k, v, pool->k, pool->v, tab, &g, n_heads, head_dim,
                                c->capturing ? (const int *)c->step.p : NULL, invf,
                                interleaved, dqn, dkn, eps));
}

/* cu_attention's work; with rope (only where the tensor-core decode
 * kernel takes the step: rope_dec_ok) that kernel also does the RoPE + K/V
 * store of the new positions. */
static int attention_run(struct backend *be, float *out, const float *q,
                         const struct kv_pool *pool, const struct kv_seq *seq, int layer,
                         const struct attn_args *a, const struct cuk_dec_rope *rope,
                         struct err *e)
{
    struct cuda_backend *c = op_begin(be); /* settles before ws is written again */
    if (sticky(c, e))
        return -1;
    if (a->head_dim > 256 || a->head_dim < 1 || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads)
        return err_set(e, "%s: attention with %d heads, %d kv heads of dim %d is not supported "
                          "(head_dim <= 256, heads a multiple of kv heads)",
                       c->name, a->n_heads, a->n_kv_heads, a->head_dim);
    if (!pool_takes(pool, a->n_kv_heads, a->head_dim))
        return err_set(e, "%s: attention with %d kv heads of dim %d over a KV pool made for %d of "
                          "dim %d",
                       c->name, a->n_kv_heads, a->head_dim, pool->n_kv_heads, pool->head_dim);
    if (a->pos0 + a->n > seq->n_blocks * pool->block_size)
        return err_set(e, "%s: attention beyond the sequence's cached positions", c->name);
    const int *tab = dev_table(c, seq);
    if (!tab)
        return sticky(c, e);
    struct cuk_attn g = attn_geom(c, pool, layer, a->n, a->pos0);
    g.n_heads = a->n_heads;
    g.window = a->sliding_window;
    g.scale = a->scale;
    /* Split by the block-table bucket, not the exact length: eager and
     * replayed decode steps then reduce in the same order. */
    int kv_cap = table_bucket(seq->n_blocks) * pool->block_size;
    if (a->sliding_window > 0 && a->sliding_window < kv_cap)
        kv_cap = a->sliding_window;
    /* a few queries over a bf16 cache: the tensor-core decode kernel */
    bool dec = a->n <= cuk_attention_dec_rows(&g);
    /* more: the tensor-core prefill kernel, which needs no key splits
     * (never a decode step, which graph replays must split alike) */
    bool pre = !dec && a->n > 1 && cuk_attention_mma_ok(&g);
    int splits = dec ? cuk_attention_dec_splits(a->n_kv_heads, kv_cap, c->dec_blocks, 1)
                 : pre ? cuk_attention_mma_splits(&g, a->pos0 + a->n, c->n_sms)
                       : cuk_attention_splits(a->n, a->n_heads, kv_cap, c->n_sms);
    /* A one-sequence decode step with RoPE merges its key splits in a
     * thread-block cluster of at most CUK_DEC_CLUSTER_MAX blocks: up to
     * dec_cluster_tiles (4) 64-key tiles a block, fewer splits merged there
     * beat more merged through global memory (H200, a 1,536-token context:
     * 0.6B 1,109 -> 1,179 tok/s, 8B 240.7 -> 241.8; 2,600 tokens, four
     * tiles against global: 0.6B 1,010 -> 1,105, 8B 229.0 -> 240.2;
     * docs/benchmarks.md, twenty-seventh and twenty-ninth passes). Decided
     * by the bucket's tiles, as the split count is, so replays split like
     * eager steps. */
    const bool cluster = c->dec_cluster && rope && dec;
    if (cluster && splits > CUK_DEC_CLUSTER_MAX &&
        (kv_cap + CUK_DEC_TILE_KEYS - 1) / CUK_DEC_TILE_KEYS <=
            (long)CUK_DEC_CLUSTER_MAX * c->dec_cluster_tiles)
        splits = CUK_DEC_CLUSTER_MAX;
    if (a->n == 1) {
        c->att_heads = a->n_heads;
        c->att_hd = a->head_dim;
    }
    c->att_dec_rows = cuk_attention_dec_rows(&g);
    float *ws = NULL;
    if (splits > 1 && !(ws = dbuf_get(c, &c->ws, cuk_attention_ws_floats(&g, splits) * 4,
                                      "attention workspace")))
        return sticky(c, e);
    unsigned *cnt = NULL;
    if (splits > 1 && !(cnt = att_counters(c, (size_t)a->n * (size_t)a->n_heads)))
        return sticky(c, e);
    if (rope && !dec)
        return err_set(e, "%s: internal: RoPE in a non-decode attention kernel", c->name);
    const int *dpos = c->capturing ? (const int *)c->step.p : NULL;
    /* one query with RoPE whose o projection comes next: that GEMV merges
     * the key splits as it stages its input (cu_matmul_fused) */
    int *dn = NULL;
    g.dec_cluster = cluster && cuk_attention_dec_cluster_ok(a->head_dim, splits);
    bool defer = !g.dec_cluster && rope && a->o_next && c->gemv_staged && dec && a->n == 1 &&
                 splits > 1 &&
                 (c->defer_merge == 1 || (c->defer_merge == -1 && defer_pays(c, splits))) &&
                 (c->dn.p || !c->capturing); /* no buffer can be made while recording */
    if (defer && !(dn = dbuf_get(c, &c->dn, sizeof(int), "deferred merge count")))
        return sticky(c, e);
    if (rope && splits > 1) /* issued, not replayed: a graph records it once */
        c->att_merges[g.dec_cluster ? 0 : dn ? 1 : 2]++;
    if (fail_cuda(c, "attention",
                  dec ? cuk_attention_dec(c->stream, out, q, pool->k, pool->v, tab, &g, dpos,
                                          splits, ws, cnt, rope, dn)
                  : pre ? cuk_attention_mma(c->stream, out, q, pool->k, pool->v, tab, &g, splits,
                                            ws, cnt)
                      : cuk_attention(c->stream, out, q, pool->k, pool->v, tab, &g, dpos, splits,
                                      ws, cnt)))
        return sticky(c, e);
    if (dn) {
        c->pend.out = out;
        c->pend.ws = ws;
        c->pend.splits = splits;
        c->pend.n_heads = a->n_heads;
        c->pend.n_kv_heads = a->n_kv_heads;
        c->pend.head_dim = a->head_dim;
    }
    return 0;
}

int cu_attention_stats(struct backend *be, long merges[3])
{
    struct cuda_backend *c = cb(be);
    for (int i = 0; i < 3; i++)
        merges[i] = c->att_merges[i];
    return c->dec_cluster;
}

int cu_attention(struct backend *be, float *out, const float *q, const struct kv_pool *pool,
                 const struct kv_seq *seq, int layer, const struct attn_args *a,
                 struct err *e)
{
    return attention_run(be, out, q, pool, seq, layer, a, NULL, e);
}

/* rope_kv_store then attention of one sequence. A decode-sized step on a
 * bf16 cache is one launch: the tensor-core decode kernel rotates q and
 * the new k itself (the same arithmetic as the RoPE + K/V store kernel,
 * so the same bits) and writes the new K/V to the cache; anything else
 * issues the two ops. */
int cu_rope_kv_attention(struct backend *be, float *out, float *q, float *k,
                         const float *v, const float *inv_freq, bool interleaved,
                         const struct qk_norm *norm, struct kv_pool *pool,
                         const struct kv_seq *seq, int layer, const struct attn_args *a,
                         struct err *e)
{
    struct cuda_backend *c = cb(be);
    if (sticky(c, e))
        return -1;
    struct cuk_attn g = attn_geom(c, pool, layer, a->n, a->pos0);
    g.n_heads = a->n_heads;
    bool one = c->fuse && c->rope_att && pool_takes(pool, a->n_kv_heads, a->head_dim) &&
               a->n_heads % a->n_kv_heads == 0 && a->n <= cuk_attention_dec_rows(&g);
    if (!one) {
        cu_rope_kv_store(be, q, k, v, a->n, a->n_heads, a->n_kv_heads, a->head_dim, a->pos0,
                         inv_freq, interleaved, norm, pool, seq, layer);
        return attention_run(be, out, q, pool, seq, layer, a, NULL, e);
    }
    struct cuk_dec_rope rope = {.k = k, .v = v, .eps = norm ? norm->eps : 0.0f,
                                .interleaved = interleaved};
    if ((norm && norm->q && !(rope.qn = dev_vec(c, norm->q, "rope_kv_attention"))) ||
        (norm && norm->k && !(rope.kn = dev_vec(c, norm->k, "rope_kv_attention"))) ||
        !(rope.inv_freq = dev_invf(c, inv_freq, a->head_dim / 2)))
        return sticky(c, e);
    return attention_run(be, out, q, pool, seq, layer, a, &rope, e);
}

/* How a batch step's attention runs, as bat_plan works it out from the
 * step's segments; the metadata it implies (cuk_bseg) is in c->bat_tmp. */

int bat_plan(struct cuda_backend *c, const struct batch_seg *segs, int n_seg,
             const struct kv_pool *pool, int layer, const struct attn_args *a, int bucket,
             struct bat_plan *p, struct err *e)
{
    size_t rows = 0, tabs = 0;
    for (int s = 0; s < n_seg; s++) {
        int nb = segs[s].seq->n_blocks;
        if (segs[s].pos0 + segs[s].n > nb * pool->block_size || (bucket && nb > bucket))
            return err_set(e, "%s: attention beyond the sequence's cached positions", c->name);
        rows += (size_t)segs[s].n;
        tabs += (size_t)(bucket ? bucket : nb);
    }
    size_t need = (size_t)n_seg * 8 + rows + tabs;
    if (need > c->bat_cap) {
        size_t cap = c->bat_cap ? c->bat_cap : 1024;
        while (cap < need)
            cap *= 2;
        int *h = realloc(c->bat_host, sizeof(int) * cap), *t = h ? c->bat_tmp : NULL;
        if (h)
            c->bat_host = h;
        if (!h || !(t = realloc(c->bat_tmp, sizeof(int) * cap)))
            return err_set(e, "%s: batch metadata: out of memory", c->name);
        c->bat_tmp = t;
        c->bat_cap = cap;
        c->bat_n = 0; /* contents no longer known to match */
    }
    int *tmp = c->bat_tmp;
    *p = (struct bat_plan){.need = need};
    struct cuk_attn g = attn_geom(c, pool, layer, (int)rows, n_seg * 8);
    g.n_heads = a->n_heads; /* the KV heads' geometry is the pool's (checked by the caller) */
    g.window = a->sliding_window;
    g.scale = a->scale;
    int row = 0, toff = n_seg * 8 + (int)rows, pre_splits = 1, short_splits = 1;
    long long ws_off = 0;
    /* Many short segments (decodes): one block per (segment, KV head)
     * without key splits reads each K/V row once for its whole query-head
     * group; worth it once those blocks alone fill the GPU. */
    /* On a bf16 cache the tensor-core decode kernel takes them instead,
     * however few: its key splits fill the GPU. */
    int dec_rows = c->fuse ? cuk_attention_dec_rows(&g) : 0;
    int short_rows = dec_rows ? dec_rows : c->fuse ? cuk_attention_short_rows(&g) : 0;
    int n_short = 0;
    for (int s = 0; s < n_seg && short_rows; s++)
        n_short += segs[s].n <= short_rows;
    bool use_short = short_rows && (dec_rows ? n_short > 0
                                             : (long)n_short * a->n_kv_heads >= c->n_sms);
    size_t ws_pre = 0;
    for (int s = 0; s < n_seg; s++) {
        const struct kv_seq *seq = segs[s].seq;
        int kv_cap = (bucket ? bucket : table_bucket(seq->n_blocks)) * pool->block_size;
        if (a->sliding_window > 0 && a->sliding_window < kv_cap)
            kv_cap = a->sliding_window;
        int splits = cuk_attention_splits(segs[s].n, a->n_heads, kv_cap, c->n_sms);
        struct cuk_attn gs = g;
        gs.n = segs[s].n;
        gs.pos0 = segs[s].pos0;
        /* chunks of more than one query: the tensor-core prefill kernel on
         * a bf16 cache, split as the single-sequence path splits it (so the
         * results are the same bits), else the tiled one */
        bool mma = segs[s].n > 1 && cuk_attention_mma_ok(&gs);
        if (mma)
            splits = cuk_attention_mma_splits(&gs, gs.pos0 + gs.n, c->n_sms);
        int tiled = mma || (splits == 1 && cuk_attention_tiled_ok(&gs));
        if (use_short && segs[s].n <= short_rows) {
            /* key splits of >= 128 keys: a long context is read by several
             * blocks at once (one block per sequence and KV head alone
             * walks it tile by tile, far from the bandwidth) */
            int keys = bucket ? kv_cap : segs[s].pos0 + segs[s].n;
            if (a->sliding_window > 0 && a->sliding_window < keys)
                keys = a->sliding_window;
            tiled = 2;
            if (dec_rows) {
                splits = cuk_attention_dec_splits(a->n_kv_heads, keys, c->dec_blocks, n_short);
            } else {
                splits = (keys + 127) / 128;
                splits = splits < 1 ? 1 : splits > 8 ? 8 : splits;
            }
            if (splits > short_splits)
                short_splits = splits;
        }
        struct cuk_bseg b = {.row0 = row, .n = segs[s].n, .pos0 = segs[s].pos0,
                             .splits = splits, .tab_off = toff, .tiled = tiled,
                             .ws_off = ws_off};
        memcpy(tmp + (size_t)s * 8, &b, sizeof b);
        for (int i = 0; i < segs[s].n; i++)
            tmp[n_seg * 8 + row + i] = s;
        memcpy(tmp + toff, seq->blocks, sizeof(int) * (size_t)seq->n_blocks);
        int tab_n = bucket ? bucket : seq->n_blocks;
        if (tab_n > seq->n_blocks) /* never read: past the last key */
            memset(tmp + toff + seq->n_blocks, 0, sizeof(int) * (size_t)(tab_n - seq->n_blocks));
        if (splits > 1 && tiled == 1 && cuk_attention_ws_floats(&gs, splits) > ws_pre)
            ws_pre = cuk_attention_ws_floats(&gs, splits); /* one chunk at a time */
        if (splits > 1 && tiled == 1 && splits > pre_splits)
            pre_splits = splits;
        if (splits > 1 && !tiled)
            ws_off += (long long)cuk_attention_ws_floats(&gs, splits);
        if (!tiled && splits > p->max_splits)
            p->max_splits = splits;
        row += segs[s].n;
        toff += tab_n;
    }
    /* The batch kernel, the short-segment kernel and the prefill chunks
     * use the same workspace and counters, one after the other. */
    size_t ws_need = (size_t)ws_off, ws_short = 0;
    if (use_short && n_short > 0)
        ws_short = cuk_attention_short_ws_floats(&g, short_splits);
    if (ws_short > ws_need)
        ws_need = ws_short;
    if (ws_pre > ws_need)
        ws_need = ws_pre;
    p->g = g;
    p->dec_rows = dec_rows;
    p->n_short = n_short;
    p->use_short = use_short;
    p->short_splits = short_splits;
    p->ws_floats = ws_need;
    if (p->max_splits > 1 || short_splits > 1 || pre_splits > 1)
        p->n_cnt = rows * (size_t)a->n_heads;
    return 0;
}

/* Makes the device's metadata (`bat`) what bat_plan built: copied only
 * when it changed, so once per step however many layers ask. While a
 * graph is recorded it must not change (step_begin copied it first). */
static bool bat_upload(struct cuda_backend *c, size_t need)
{
    if (!dbuf_get(c, &c->bat, sizeof(int) * c->bat_cap, "batch metadata"))
        return false;
    if (need == c->bat_n && !memcmp(c->bat_tmp, c->bat_host, sizeof(int) * need))
        return true;
    if (c->capturing) {
        fail_msg(c, "the batch metadata changed while recording a graph");
        return false;
    }
    memcpy(c->bat_host, c->bat_tmp, sizeof(int) * need);
    c->bat_n = need;
    if (!upload_async(c, &c->up_bat, c->bat.p, c->bat_host, sizeof(int) * need,
                      "copy batch metadata")) {
        c->bat_n = 0;
        return false;
    }
    return true;
}

bool bat_buffers(struct cuda_backend *c, const struct bat_plan *p, float **ws,
                 unsigned **cnt)
{
    *ws = NULL;
    *cnt = NULL;
    if (p->ws_floats > 0 && !(*ws = dbuf_get(c, &c->ws, p->ws_floats * 4, "attention workspace")))
        return false;
    if (p->n_cnt > 0 && !(*cnt = att_counters(c, p->n_cnt)))
        return false;
    return bat_upload(c, p->need);
}

/* rope_kv_store + attention of every sequence of a batch step in two or
 * three launches (bat_plan). */
int cu_rope_kv_attention_batch(struct backend *be, float *out, float *q, float *k,
                               const float *v, const struct batch_seg *segs, int n_seg,
                               const float *inv_freq, bool interleaved,
                               const struct qk_norm *norm, struct kv_pool *pool,
                               int layer, const struct attn_args *a, struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    if (sticky(c, e))
        return -1;
    bool ok = c->fuse && a->head_dim <= 256 && a->head_dim >= 2 &&
              pool_takes(pool, a->n_kv_heads, a->head_dim) && a->n_heads % a->n_kv_heads == 0;
    if (!ok && c->capturing) { /* the per-sequence ops would read a single decode's record */
        fail_msg(c, "a batched step's attention cannot be recorded for this model");
        return sticky(c, e);
    }
    if (!ok) { /* the per-sequence ops */
        size_t qd = (size_t)a->n_heads * a->head_dim, kvd = (size_t)pool->kv_dim;
        for (int s = 0, row = 0; s < n_seg; row += segs[s].n, s++) {
            struct attn_args as = *a;
            as.n = segs[s].n;
            as.pos0 = segs[s].pos0;
            cu_rope_kv_store(be, q + row * qd, k + row * kvd, v + row * kvd, as.n, a->n_heads,
                             a->n_kv_heads, a->head_dim, as.pos0, inv_freq, interleaved, norm,
                             pool, segs[s].seq, layer);
            if (cu_attention(be, out + row * qd, q + row * qd, pool, segs[s].seq, layer, &as, e))
                return -1;
        }
        return 0;
    }
    if (c->bstep) { /* what a later step's recording or replay builds its metadata for */
        c->batt = *a;
        c->batt_owner = c->bowner;
    }
    struct bat_plan p;
    if (bat_plan(c, segs, n_seg, pool, layer, a, c->bstep, &p, e))
        return -1;
    struct cuk_attn g = p.g;
    float *ws;
    unsigned *cnt;
    if (!bat_buffers(c, &p, &ws, &cnt))
        return sticky(c, e);
    const float *invf = dev_invf(c, inv_freq, a->head_dim / 2);
    const float *qn = norm && norm->q ? dev_vec(c, norm->q, "rope_kv_attention_batch") : NULL;
    const float *kn = norm && norm->k ? dev_vec(c, norm->k, "rope_kv_attention_batch") : NULL;
    if (!invf || (norm && norm->q && !qn) || (norm && norm->k && !kn))
        return sticky(c, e);
    if (fail_cuda(c, "rope_kv_attention_batch",
                  cuk_rope_kv_attention_batch(c->stream, out, q, k, v, pool->k, pool->v,
                                              c->bat.p, &g, p.max_splits, invf, interleaved, qn,
                                              kn, norm ? norm->eps : 0.0f, ws, cnt)))
        return sticky(c, e);
    if (p.use_short && p.n_short > 0 &&
        fail_cuda(c, "attention (short segments)",
                  p.dec_rows ? cuk_attention_dec_batch(c->stream, out, q, pool->k, pool->v,
                                                       c->bat.p, &g, p.short_splits, ws, cnt)
                             : cuk_attention_short_batch(c->stream, out, q, pool->k, pool->v,
                                                         c->bat.p, &g, p.short_splits, ws, cnt)))
        return sticky(c, e);
    /* Prefill chunks: the tiled kernel, one launch per chunk (the batch
     * kernel skipped them). */
    size_t qd = (size_t)a->n_heads * a->head_dim;
    for (int s = 0; s < n_seg; s++) {
        struct cuk_bseg b;
        memcpy(&b, c->bat_tmp + (size_t)s * 8, sizeof b);
        if (b.tiled != 1)
            continue;
        struct cuk_attn gs = g;
        gs.n = b.n;
        gs.pos0 = b.pos0;
        const int *tab = (const int *)c->bat.p + b.tab_off;
        if (fail_cuda(c, "attention (prefill chunk)",
                      cuk_attention_mma_ok(&gs)
                          ? cuk_attention_mma(c->stream, out + (size_t)b.row0 * qd,
                                              q + (size_t)b.row0 * qd, pool->k, pool->v, tab,
                                              &gs, b.splits, ws, cnt)
                          : cuk_attention_tiled(c->stream, out + (size_t)b.row0 * qd,
                                                q + (size_t)b.row0 * qd, pool->k, pool->v, tab,
                                                &gs)))
            return sticky(c, e);
    }
    return 0;
}
