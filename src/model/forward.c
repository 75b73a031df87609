/* forward.c - the llama-family forward pass, written once over the backend
 * op set: embed, then per layer RMSNorm -> q/k/v (+bias, +q/k norm) -> RoPE
 * -> paged attention -> o_proj residual -> RMSNorm -> SwiGLU MLP residual,
 * then the final norm and the LM head. */
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/head_bound.h"
#include "base/argmax.h"

void rope_inv_freq(const struct model_config *c, float *inv_freq)
{
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* HF: 1 / theta ** (arange(0, d, 2) / d), evaluated in float32. */
        float expo = (float)(2 * i) / (float)c->head_dim;
        float f = 1.0f / powf(c->rope_theta, expo);
        if (c->rope_scaling == ROPE_SCALING_LINEAR) {
            f /= c->rope_factor;
        } else if (c->rope_scaling == ROPE_SCALING_FREQS) {
            f /= c->rope_freqs[i];
        } else if (c->rope_scaling == ROPE_SCALING_LLAMA3) {
            float lo_wl = (float)c->rope_orig_max_seq / c->rope_low_freq_factor;
            float hi_wl = (float)c->rope_orig_max_seq / c->rope_high_freq_factor;
            float wl = 2.0f * (float)M_PI / f;
            if (wl > lo_wl) {
                f /= c->rope_factor;
            } else if (wl >= hi_wl) {
                float s = ((float)c->rope_orig_max_seq / wl - c->rope_low_freq_factor) /
                          (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1.0f - s) * f / c->rope_factor + s * f;
            }
        }
        inv_freq[i] = f;
    }
}

int forward_init(struct forward_state *fs, const struct model *m, struct backend *be,
                 int max_tokens, struct err *e)
{
    return forward_init_rows(fs, m, be, max_tokens, max_tokens, e);
}

int forward_init_rows(struct forward_state *fs, const struct model *m, struct backend *be,
                      int max_tokens, int logit_rows, struct err *e)
{
    memset(fs, 0, sizeof *fs);
    if (max_tokens < 1 || logit_rows < 1 || logit_rows > max_tokens)
        return err_set(e, "forward: %d tokens a call with logits for %d rows (1..tokens)",
                       max_tokens, logit_rows);
    const struct model_config *c = &m->cfg;
    fs->m = m;
    fs->be = be;
    fs->max_tokens = max_tokens;
    fs->logit_rows = logit_rows;
    size_t n = (size_t)max_tokens;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    fs->inv_freq = malloc(sizeof(float) * (size_t)(c->head_dim / 2));
    fs->ids = malloc(sizeof(int) * n);
    fs->greedy = malloc(sizeof(int) * n);
    fs->sparams = malloc(sizeof *fs->sparams * n);
    fs->bsegs = malloc(sizeof *fs->bsegs * n);
    void *(*al)(struct backend *, size_t) = be->ops->alloc;
    fs->x = al(be, n * c->dim * 4);
    fs->xb = al(be, n * (c->dim > (int)qd ? (size_t)c->dim : qd) * 4);
    fs->q = al(be, n * qd * 4);
    /* k and v side by side, in that order, as gate's and up's outputs
     * are: a device whose paired weights lie the same way runs each pair
     * as one strided batched GEMM (CUDA: gemm_pair) */
    fs->k = al(be, 2 * n * kvd * 4);
    fs->v = fs->k ? fs->k + n * kvd : NULL;
    fs->att = al(be, n * qd * 4);
    fs->hb = al(be, 2 * n * c->hidden_dim * 4);
    fs->hb2 = fs->hb ? fs->hb + n * c->hidden_dim : NULL;
    fs->logits = al(be, (size_t)logit_rows * c->vocab_size * 4);
    if (!fs->inv_freq || !fs->ids || !fs->greedy || !fs->sparams || !fs->bsegs || !fs->x || !fs->xb || !fs->q || !fs->k || !fs->v || !fs->att || !fs->hb ||
        !fs->hb2 || !fs->logits) {
        forward_free(fs);
        return err_set(e, "out of memory for activations of %d tokens", max_tokens);
    }
    rope_inv_freq(c, fs->inv_freq);
    return 0;
}

void forward_free(struct forward_state *fs)
{
    if (!fs->be)
        return;
    fs->v = fs->hb2 = NULL; /* inside k's and hb's allocations */
    float **bufs[] = {&fs->x, &fs->xb, &fs->q, &fs->k, &fs->att, &fs->hb, &fs->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i])
            fs->be->ops->free(fs->be, *bufs[i]);
        *bufs[i] = NULL;
    }
    free(fs->inv_freq);
    fs->inv_freq = NULL;
    free(fs->ids);
    fs->ids = NULL;
    free(fs->greedy);
    fs->greedy = NULL;
    free(fs->sparams);
    fs->sparams = NULL;
    free(fs->lps);
    fs->lps = NULL;
    free(fs->bsegs);
    fs->bsegs = NULL;
    free(fs->pipe.row);
    fs->pipe.row = NULL;
}

/* outs[i] = x . W_i^T, in one fused call when the backend has one. */
static int matmuls(struct forward_state *fs, float *const *outs, const float *x, int n,
                   const struct tensor *const *ws, int k, struct err *e)
{
    const struct backend_ops *op = fs->be->ops;
    if (op->matmul_multi)
        return op->matmul_multi(fs->be, outs, x, n, ws, k, e);
    for (int i = 0; i < k; i++)
        if (op->matmul(fs->be, outs[i], x, n, ws[i], e))
            return -1;
    return 0;
}

/* x += y; xb = rmsnorm(x), in one call when the backend has add_rmsnorm. */
static void add_norm(struct forward_state *fs, const float *y, const float *w, int n)
{
    const struct model_config *c = &fs->m->cfg;
    const struct backend_ops *op = fs->be->ops;
    if (op->add_rmsnorm) {
        op->add_rmsnorm(fs->be, fs->xb, fs->x, y, w, n, c->dim, c->norm_eps);
        return;
    }
    op->add(fs->be, fs->x, y, (size_t)n * c->dim);
    op->rmsnorm(fs->be, fs->xb, fs->x, w, n, c->dim, c->norm_eps);
}

enum logits_mode { LOGITS_NONE, LOGITS_LAST, LOGITS_ALL };

/* Whether the step returns the segment's token (next) rather than its
 * logits row: greedy ones always, sampled ones when the backend samples. */
static bool seg_picked(const struct forward_state *fs, const struct forward_seg *s)
{
    return s->logits && s->next &&
           (!s->sample || s->sample->temperature <= 0 || fs->be->ops->sample_rows);
}

/* Whether a picked segment is sampled rather than greedy. */
static bool seg_sampled(const struct forward_seg *s)
{
    return s->sample && s->sample->temperature > 0;
}

/* k when a segment's logits row serves only a pick among its k largest
 * logits, so the head may be head_pick's: 1 for a greedy pick, the top-k
 * of a draw that keeps at most HEAD_PICK_MAX_K (the sampler keeps the k
 * largest first: engine/sampler.c); 0 when the row serves more (logprobs,
 * the host's own processing, a draw over the whole row). */
static int seg_pick_k(const struct forward_state *fs, const struct forward_seg *s)
{
    if (!s->logits || !s->next || s->lp || !fs->be->ops->head_pick)
        return 0;
    if (!seg_sampled(s))
        return 1;
    return s->sample->top_k > 0 && s->sample->top_k <= HEAD_PICK_MAX_K ? s->sample->top_k : 0;
}

/* The matmuls of the fused path (backends with matmul_fused), one call
 * each: outs = rmsnorm(x) . W for n rows of x (q/k/v; gate/up with
 * SwiGLU's output; the LM head), and x += in . W (o_proj over att,
 * down_proj over swiglu(gate, up)). */
static int fused_norm_matmul(struct forward_state *fs, float *x, float *const *outs,
                             const float *norm, const struct tensor *const *ws, int k,
                             enum matmul_out out, int n, struct err *e)
{
    struct matmul_in in = {.kind = MATMUL_IN_RMSNORM, .x = x, .norm = norm,
                           .eps = fs->m->cfg.norm_eps};
    return fs->be->ops->matmul_fused(fs->be, outs, &in, n, ws, k, out, e);
}

static int fused_residual_matmul(struct forward_state *fs, struct matmul_in in,
                                 const struct tensor *w, int n, struct err *e)
{
    float *x[] = {fs->x};
    return fs->be->ops->matmul_fused(fs->be, x, &in, n, &w, 1, MATMUL_OUT_ADD, e);
}

/* *normed (plain path only): on entry, xb already holds rmsnorm(x) with
 * this layer's attn_norm; on return, the same for the next layer's
 * (backends with add_rmsnorm fuse the closing residual add with it). A
 * backend with matmul_fused takes the norms, SwiGLU and residual adds into
 * its matmuls instead (the same results: backend.h defines it as these
 * ops). Every matmul runs once over all n rows of the batch; RoPE, the K/V
 * store and attention run per segment (its own sequence, positions and
 * block table). */
static int layer_forward(struct forward_state *fs, struct kv_pool *pool,
                         const struct forward_seg *segs, int n_seg, int l, int n, bool *normed,
                         struct err *e)
{
    const struct model_config *c = &fs->m->cfg;
    const struct layer_weights *w = &fs->m->layers[l];
    const struct backend_ops *op = fs->be->ops;
    struct backend *be = fs->be;
    int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    bool fused = op->matmul_fused != NULL;

    float *qkv[] = {fs->q, fs->k, fs->v};
    const struct tensor *wqkv[] = {&w->wq, &w->wk, &w->wv};
    if (fused) {
        if (fused_norm_matmul(fs, fs->x, qkv, w->attn_norm.data, wqkv, 3, MATMUL_OUT_STORE, n, e))
            return -1;
    } else {
        if (!*normed)
            op->rmsnorm(be, fs->xb, fs->x, w->attn_norm.data, n, c->dim, c->norm_eps);
        if (matmuls(fs, qkv, fs->xb, n, wqkv, 3, e))
            return -1;
    }
    if (c->qkv_bias) {
        op->add_bias(be, fs->q, w->bq.data, n, qd);
        op->add_bias(be, fs->k, w->bk.data, n, kvd);
        op->add_bias(be, fs->v, w->bv.data, n, kvd);
    }
    /* Qwen3's per-head q/k norm: inside the RoPE op when the backend has
     * the op this step uses, else its own rmsnorms first. */
    bool batch = n_seg > 1 && op->rope_kv_attention_batch;
    struct qk_norm qkn = {.q = w->q_norm.data, .k = w->k_norm.data, .eps = c->norm_eps};
    const struct qk_norm *norm = c->qk_norm ? &qkn : NULL;
    if (norm && !batch && !op->rope_kv_store) {
        op->rmsnorm(be, fs->q, fs->q, w->q_norm.data, n * c->n_heads, c->head_dim, c->norm_eps);
        op->rmsnorm(be, fs->k, fs->k, w->k_norm.data, n * c->n_kv_heads, c->head_dim, c->norm_eps);
    }
    if (batch) { /* fs->bsegs: filled by step_forward */
        struct attn_args a = {
            .n = n, .pos0 = 0, .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads,
            .head_dim = c->head_dim, .sliding_window = c->sliding_window,
            .scale = 1.0f / sqrtf((float)c->head_dim),
        };
        if (op->rope_kv_attention_batch(be, fs->att, fs->q, fs->k, fs->v, fs->bsegs, n_seg,
                                        fs->inv_freq, c->rope_interleaved, norm, pool, l, &a, e))
            return -1;
        n_seg = 0; /* done: skip the per-sequence loop */
    }
    for (int s = 0, row = 0; s < n_seg; row += segs[s].n, s++) {
        struct kv_seq *seq = segs[s].seq;
        int m = segs[s].n, pos0 = seq->n_tokens;
        float *q = fs->q + (size_t)row * qd, *k = fs->k + (size_t)row * kvd;
        const float *v = fs->v + (size_t)row * kvd;
        struct attn_args a = {
            .n = m, .pos0 = pos0, .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads,
            .head_dim = c->head_dim, .sliding_window = c->sliding_window,
            .scale = 1.0f / sqrtf((float)c->head_dim),
            .o_next = fused && n_seg == 1, /* fused_residual_matmul(att) below */
        };
        if (op->rope_kv_attention) {
            if (op->rope_kv_attention(be, fs->att + (size_t)row * qd, q, k, v, fs->inv_freq,
                                      c->rope_interleaved, norm, pool, seq, l, &a, e))
                return -1;
            continue;
        }
        if (op->rope_kv_store) {
            op->rope_kv_store(be, q, k, v, m, c->n_heads, c->n_kv_heads, c->head_dim, pos0,
                              fs->inv_freq, c->rope_interleaved, norm, pool, seq, l);
        } else {
            op->rope(be, q, m, c->n_heads, c->head_dim, pos0, fs->inv_freq, c->rope_interleaved);
            op->rope(be, k, m, c->n_kv_heads, c->head_dim, pos0, fs->inv_freq,
                     c->rope_interleaved);
            op->kv_store(be, pool, seq, l, k, v, m, pos0);
        }
        if (op->attention(be, fs->att + (size_t)row * qd, q, pool, seq, l, &a, e))
            return -1;
    }
    float *gu[] = {fs->hb, fs->hb2};
    const struct tensor *wgu[] = {&w->w_gate, &w->w_up};
    if (fused) {
        struct matmul_in att = {.kind = MATMUL_IN_X, .x = fs->att};
        struct matmul_in h = {.kind = MATMUL_IN_X, .x = fs->hb};
        if (fused_residual_matmul(fs, att, &w->wo, n, e) ||
            fused_norm_matmul(fs, fs->x, gu, w->ffn_norm.data, wgu, 2, MATMUL_OUT_SWIGLU, n, e) ||
            fused_residual_matmul(fs, h, &w->w_down, n, e))
            return -1;
        return 0;
    }
    if (op->matmul(be, fs->xb, fs->att, n, &w->wo, e))
        return -1;
    add_norm(fs, fs->xb, w->ffn_norm.data, n);
    if (matmuls(fs, gu, fs->xb, n, wgu, 2, e))
        return -1;
    op->silu_mul(be, fs->hb, fs->hb2, (size_t)n * c->hidden_dim);
    if (op->matmul(be, fs->xb, fs->hb, n, &w->w_down, e))
        return -1;
    *normed = op->add_rmsnorm && l + 1 < c->n_layers;
    if (*normed)
        add_norm(fs, fs->xb, fs->m->layers[l + 1].attn_norm.data, n);
    else
        op->add(be, fs->x, fs->xb, (size_t)n * c->dim);
    return 0;
}

/* The ops of one step, from the embedding to the logits in fs->logits:
 * every row when all_rows (one segment), else the last row of each segment
 * with logits set: in segment order for a batched decode step (decodes:
 * the same ops whichever rows the host takes, so one recording serves
 * every mix), else first those whose rows go to the host (in segment
 * order), then those whose token the step picks (seg_picked, in segment
 * order), so each group is one contiguous block. Returns the logits row
 * count. */
static int batch_ops(struct forward_state *fs, struct kv_pool *pool,
                     const struct forward_seg *segs, int n_seg, const int *tokens, int n,
                     bool all_rows, bool decodes, struct err *e)
{
    const struct model *m = fs->m;
    const struct model_config *c = &m->cfg;
    const struct backend_ops *op = fs->be->ops;
    op->embed(fs->be, fs->x, &m->tok_embd, tokens, n);
    /* a decode step of one sequence: all layers in one call where the
     * backend has one for this model */
    int whole = 0;
    if (n == 1 && n_seg == 1 && op->decode_layers &&
        (whole = op->decode_layers(fs->be, m, fs->x, pool, segs[0].seq, segs[0].seq->n_tokens,
                                   fs->inv_freq, e)) < 0)
        return -1;
    bool normed = false;
    for (int l = 0; l < c->n_layers && !whole; l++)
        if (layer_forward(fs, pool, segs, n_seg, l, n, &normed, e))
            return -1;
    /* Only the rows whose logits are wanted go through the (large) head:
     * the final norm gathers them into consecutive rows of xb. */
    int rows = 0;
    if (all_rows) {
        op->rmsnorm(fs->be, fs->xb, fs->x, m->out_norm.data, n, c->dim, c->norm_eps);
        rows = n;
    } else if (n_seg == 1) {
        if (!segs[0].logits)
            return 0;
        float *last = fs->x + (size_t)(n - 1) * c->dim;
        const int pick_k = seg_pick_k(fs, &segs[0]);
        const bool pick = pick_k > 0;
        if (pick) { /* a pick among the k largest alone: less of the head */
            op->rmsnorm(fs->be, fs->xb, last, m->out_norm.data, 1, c->dim, c->norm_eps);
            int rc = op->head_pick(fs->be, fs->logits, fs->xb, &m->lm_head, pick_k, e);
            if (rc <= 0)
                return rc < 0 ? -1 : 1;
        }
        if (op->matmul_fused) { /* the norm in the head's launch where that pays */
            const struct tensor *head = &m->lm_head;
            return fused_norm_matmul(fs, last, &fs->logits,
                                     m->out_norm.data, &head, 1, MATMUL_OUT_STORE, 1, e)
                       ? -1
                       : 1;
        }
        if (!pick) /* else xb holds it: head_pick declined this head */
            op->rmsnorm(fs->be, fs->xb, last, m->out_norm.data, 1, c->dim, c->norm_eps);
        rows = 1;
    } else {
        /* Gathered rows that are also consecutive in x (neighbouring
         * one-token segments, e.g. a batch of decodes) go through one norm
         * launch per run instead of one per sequence. */
        int run_src = 0, run_len = 0;
        for (int picked = 0; picked < (decodes ? 1 : 2); picked++)
            for (int s = 0, row = 0; s < n_seg; s++) {
                row += segs[s].n;
                if (!segs[s].logits || (!decodes && seg_picked(fs, &segs[s]) != (picked == 1)))
                    continue;
                if (run_len > 0 && row - 1 != run_src + run_len) {
                    op->rmsnorm(fs->be, fs->xb + (size_t)(rows - run_len) * c->dim,
                                fs->x + (size_t)run_src * c->dim, m->out_norm.data, run_len,
                                c->dim, c->norm_eps);
                    run_len = 0;
                }
                if (run_len == 0)
                    run_src = row - 1;
                run_len++;
                rows++;
            }
        if (run_len > 0)
            op->rmsnorm(fs->be, fs->xb + (size_t)(rows - run_len) * c->dim,
                        fs->x + (size_t)run_src * c->dim, m->out_norm.data, run_len, c->dim,
                        c->norm_eps);
    }
    if (rows > 0 && op->matmul(fs->be, fs->logits, fs->xb, rows, &m->lm_head, e))
        return -1;
    return rows;
}

/* The picked segments' log-probabilities (forward_seg.lp), from rows
 * consecutive rows x of backend memory whose picks are ids: row r belongs
 * to the segment rows_seg[r] (-1: none). */
static int row_stats(struct forward_state *fs, struct forward_seg *segs, const float *x,
                     const int *rows_seg, int rows, const int *ids, struct err *e)
{
    const struct backend_ops *op = fs->be->ops;
    int k = -1;
    for (int r = 0; r < rows; r++)
        if (rows_seg[r] >= 0 && segs[rows_seg[r]].lp && segs[rows_seg[r]].lp_k > k)
            k = segs[rows_seg[r]].lp_k;
    if (k < 0)
        return 0;
    if (!op->row_logprobs)
        return err_set(e, "logprobs of a picked token need the backend's row_logprobs");
    if (!fs->lps && !(fs->lps = malloc(sizeof *fs->lps * (size_t)fs->max_tokens)))
        return err_set(e, "out of memory");
    if (op->row_logprobs(fs->be, fs->lps, x, rows, fs->m->cfg.vocab_size, ids, k, e))
        return -1;
    for (int r = 0; r < rows; r++) {
        struct forward_seg *s = rows_seg[r] >= 0 ? &segs[rows_seg[r]] : NULL;
        if (s && s->lp) {
            *s->lp = fs->lps[r];
            if (s->lp->n_top > s->lp_k)
                s->lp->n_top = s->lp_k;
        }
    }
    return 0;
}

/* A batched decode step's rows (fs->logits, one a segment, in segment
 * order) to where forward_batch puts them: the rows of segments the host
 * takes packed at the front of logits, in segment order, and the tokens
 * of the others picked on the device when it can (over every row: a host
 * row's pick is dropped), else on the host from the downloaded rows. */
static int decode_rows(struct forward_state *fs, struct forward_seg *segs, int n_seg,
                       float *logits, struct err *e)
{
    const struct backend_ops *op = fs->be->ops;
    const int V = fs->m->cfg.vocab_size;
    const size_t vocab = (size_t)V;
    int n_pick = 0, n_smp = 0, only = -1;
    for (int s = 0; s < n_seg; s++)
        if (seg_picked(fs, &segs[s])) {
            n_pick++;
            n_smp += seg_sampled(&segs[s]);
            only = s;
        }
    bool dev = n_pick > 0 && (n_smp > 0 || op->argmax_rows || (n_pick == 1 && op->argmax));
    int *ids = fs->greedy;
    for (int s = 0; s < n_seg; s++)
        ids[s] = -1; /* rows no pick covers (row_stats reads every row's) */
    if (dev) {
        for (int s = 0, j = 0; s < n_seg; s++)
            if (!seg_picked(fs, &segs[s]))
                op->download(fs->be, logits + (size_t)j++ * vocab, fs->logits + (size_t)s * vocab,
                             vocab);
        int rc;
        if (n_smp > 0) { /* one launch for every row: the others as temperature 0 */
            for (int s = 0; s < n_seg; s++)
                fs->sparams[s] = seg_picked(fs, &segs[s]) && seg_sampled(&segs[s])
                                     ? *segs[s].sample
                                     : (struct sample_params){0};
            rc = op->sample_rows(fs->be, ids, fs->logits, n_seg, V, fs->sparams, e);
        } else if (n_pick == 1 && op->argmax) {
            rc = op->argmax(fs->be, ids + only, fs->logits + (size_t)only * vocab, V, e);
        } else {
            rc = op->argmax_rows(fs->be, ids, fs->logits, n_seg, V, e);
        }
        if (rc || (op->finish && op->finish(fs->be, e)))
            return -1;
    } else {
        op->download(fs->be, logits, fs->logits, (size_t)n_seg * vocab);
        if (op->finish && op->finish(fs->be, e))
            return -1;
        for (int s = 0, j = 0; s < n_seg; s++) {
            const float *row = logits + (size_t)s * vocab;
            if (seg_picked(fs, &segs[s])) {
                ids[s] = argmax_f32(row, V);
            } else {
                if (j != s) /* j < s: moving rows toward the front never overwrites one */
                    memmove(logits + (size_t)j * vocab, row, vocab * sizeof(float));
                j++;
            }
        }
    }
    int *rows_seg = fs->ids; /* the step's token ids are spent: reuse them */
    for (int s = 0; s < n_seg; s++) {
        rows_seg[s] = seg_picked(fs, &segs[s]) ? s : -1;
        if (seg_picked(fs, &segs[s]))
            *segs[s].next = ids[s];
        else if (segs[s].next)
            *segs[s].next = -1; /* sampled by the caller, from its row */
    }
    return row_stats(fs, segs, fs->logits, rows_seg, n_seg, ids, e);
}

bool forward_pipe_on_device(const struct forward_state *fs)
{
    return fs->be->ops->argmax_async && fs->be->ops->argmax_take;
}

/* Issues the ops of one step over n_seg segments (see forward_batch) and
 * moves every segment's sequence past its tokens; returns the rows of
 * logits the step left in fs->logits (0 or more) or -1. all_rows: logits of
 * every row (one segment only, without next). last_ok: the one token may be
 * BACKEND_TOKEN_LAST (forward_pipe_issue). *decodes: a batched decode. */
static int step_issue(struct forward_state *fs, struct kv_pool *pool, struct forward_seg *segs,
                      int n_seg, bool all_rows, bool last_ok, bool *decodes_out, struct err *e)
{
    const struct model_config *c = &fs->m->cfg;
    const struct backend_ops *op = fs->be->ops;
    int n = 0, want = 0;
    if (n_seg <= 0)
        return err_set(e, "forward: no sequences");
    /* logits rows, all in fs->logits: checked before any block is reserved */
    for (int s = 0; s < n_seg; s++)
        want += all_rows ? segs[s].n : segs[s].logits;
    if (want > fs->logit_rows)
        return err_set(e, "forward: logits of %d rows in one step, at most %d", want,
                       fs->logit_rows);
    for (int s = 0; s < n_seg; s++) {
        if (segs[s].n <= 0)
            return err_set(e, "forward: a sequence without tokens");
        if (n + segs[s].n > fs->max_tokens)
            return err_set(e, "forward: %d+ tokens in one step, at most %d", n + segs[s].n,
                           fs->max_tokens);
        for (int i = 0; i < segs[s].n; i++) {
            int t = segs[s].tokens[i];
            if ((t < 0 || t >= c->vocab_size) && !(last_ok && t == BACKEND_TOKEN_LAST))
                return err_set(e, "token id %d is outside the vocabulary (0..%d)", t,
                               c->vocab_size - 1);
            fs->ids[n + i] = t;
        }
        n += segs[s].n;
        if (kv_seq_reserve(pool, segs[s].seq, segs[s].seq->n_tokens + segs[s].n, e))
            return -1;
    }
    /* fs->bsegs: what the batched ops and the step get, once per step */
    bool decodes = n_seg > 1 && n == n_seg && !all_rows;
    for (int s = 0; s < n_seg && n_seg > 1; s++) {
        fs->bsegs[s] = (struct batch_seg){.seq = segs[s].seq, .n = segs[s].n,
                                          .pos0 = segs[s].seq->n_tokens};
        decodes = decodes && segs[s].logits;
    }
    /* A backend may record the step's ops and replay them for later steps
     * of the same shape (CUDA graphs for decode, single or batched); see
     * backend.h. A batched decode's rows are in segment order whichever
     * of them the host takes (a grammar, logprobs), so its recording does
     * not depend on that. */
    struct backend_step st = {.owner = fs, .n = n, .n_seg = n_seg, .pos0 = segs[0].seq->n_tokens,
                              .tokens = fs->ids, .pool = pool, .seq = segs[0].seq,
                              .segs = n_seg > 1 ? fs->bsegs : NULL,
                              .logits = n_seg == 1 && !all_rows && segs[0].logits,
                              .pick_k = n_seg == 1 && !all_rows ? seg_pick_k(fs, &segs[0]) : 0,
                              .decodes = decodes, .rows = n_seg == 1 && all_rows};
    int rows = 0;
    for (int attempt = 0;; attempt++) {
        int r = op->step_begin ? op->step_begin(fs->be, &st, e) : 0;
        if (r < 0)
            return -1;
        int rc = 0;
        if (r == 1) { /* replayed: a decode, single or batched, or every row's logits */
            rows = decodes ? n_seg : all_rows ? n : 1;
        } else {
            rows = batch_ops(fs, pool, segs, n_seg, fs->ids, n, all_rows, decodes, e);
            rc = rows < 0 ? -1 : 0;
        }
        int end = op->step_end ? op->step_end(fs->be, rc, e) : 0;
        if (end == 1 && attempt == 0) { /* the recording failed: issue the ops again, eagerly */
            e->msg[0] = 0;
            continue;
        }
        if (rc || end)
            return -1;
        break;
    }
    for (int s = 0; s < n_seg; s++)
        segs[s].seq->n_tokens += segs[s].n;
    *decodes_out = decodes;
    return rows;
}

/* One step over n_seg segments (see forward_batch). all_rows: logits of
 * every row (one segment only, without next); with all_ids, instead of
 * them every row's greedy pick (forward_tokens_argmax). */
static int step_forward(struct forward_state *fs, struct kv_pool *pool, struct forward_seg *segs,
                        int n_seg, bool all_rows, int *all_ids, float *logits, struct err *e)
{
    const struct model_config *c = &fs->m->cfg;
    const struct backend_ops *op = fs->be->ops;
    if (fs->pipe.n > 0 && forward_pipe_on_device(fs))
        return err_set(e, "forward: greedy steps are still in flight (forward_pipe_take or "
                          "forward_pipe_drop first)");
    bool decodes = false;
    int rows = step_issue(fs, pool, segs, n_seg, all_rows, false, &decodes, e);
    if (rows <= 0)
        return rows;
    const size_t vocab = (size_t)c->vocab_size;
    if (decodes)
        return decode_rows(fs, segs, n_seg, logits, e);
    if (all_ids && op->argmax_rows) /* only the ids cross to the host */
        return op->argmax_rows(fs->be, all_ids, fs->logits, rows, c->vocab_size, e);
    /* fs->logits: the rows for the host, then the picked rows. */
    int n_pick = 0, n_smp = 0;
    for (int s = 0; s < n_seg && !all_rows; s++)
        if (seg_picked(fs, &segs[s])) {
            n_pick++;
            n_smp += seg_sampled(&segs[s]);
        }
    int n_plain = rows - n_pick;
    /* Sampled rows are picked only by a backend with sample_rows. */
    bool dev = n_pick > 0 && (n_smp > 0 || op->argmax_rows || (n_pick == 1 && op->argmax));
    /* Without a device argmax the greedy rows are downloaded too, behind. */
    int n_down = dev ? n_plain : rows;
    if (n_down > 0) {
        op->download(fs->be, logits, fs->logits, (size_t)n_down * vocab);
        if (op->finish && op->finish(fs->be, e))
            return -1;
    }
    for (int i = 0; all_ids && i < rows; i++)
        all_ids[i] = argmax_f32(logits + (size_t)i * vocab, c->vocab_size);
    for (int s = 0; s < n_seg && !all_rows; s++) /* sampled by the caller, from its row */
        if (segs[s].logits && segs[s].next && !seg_picked(fs, &segs[s]))
            *segs[s].next = -1;
    if (n_pick == 0)
        return 0;
    int *ids = fs->greedy;
    if (dev) { /* only the ids cross to the host */
        const float *g = fs->logits + (size_t)n_plain * vocab;
        int rc;
        if (n_smp > 0) { /* one launch for all: greedy rows as temperature 0 */
            for (int s = 0, i = 0; s < n_seg; s++)
                if (seg_picked(fs, &segs[s]))
                    fs->sparams[i++] = seg_sampled(&segs[s]) ? *segs[s].sample
                                                             : (struct sample_params){0};
            rc = op->sample_rows(fs->be, ids, g, n_pick, c->vocab_size, fs->sparams, e);
        } else {
            rc = n_pick == 1 && op->argmax
                     ? op->argmax(fs->be, ids, g, c->vocab_size, e)
                     : op->argmax_rows(fs->be, ids, g, n_pick, c->vocab_size, e);
        }
        if (rc)
            return -1;
    } else {
        for (int i = 0; i < n_pick; i++)
            ids[i] = argmax_f32(logits + (size_t)(n_plain + i) * vocab, c->vocab_size);
    }
    int *rows_seg = fs->ids; /* the step's token ids are spent: reuse them */
    for (int s = 0, i = 0; s < n_seg; s++)
        if (seg_picked(fs, &segs[s])) {
            rows_seg[i] = s;
            *segs[s].next = ids[i++];
        }
    return row_stats(fs, segs, fs->logits + (size_t)n_plain * vocab, rows_seg, n_pick, ids, e);
}

int forward_batch(struct forward_state *fs, struct kv_pool *pool, struct forward_seg *segs,
                  int n_seg, float *logits, struct err *e)
{
    return step_forward(fs, pool, segs, n_seg, false, NULL, logits, e);
}

static int chunk_forward(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                         const int *tokens, int n, enum logits_mode mode, float *logits,
                         int *next, const struct sample_params *sp, struct err *e)
{
    struct forward_seg seg = {.seq = seq, .tokens = tokens, .n = n,
                              .logits = mode != LOGITS_NONE,
                              .next = mode == LOGITS_LAST ? next : NULL,
                              .sample = mode == LOGITS_LAST ? sp : NULL};
    return step_forward(fs, pool, &seg, 1, mode == LOGITS_ALL, NULL, logits, e);
}

int forward_tokens_argmax(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                          const int *tokens, int n, float *logits, int *ids, struct err *e)
{
    if (n <= 0 || n > fs->logit_rows)
        return err_set(e, "forward: %d tokens to pick after, 1..%d", n, fs->logit_rows);
    struct forward_seg seg = {.seq = seq, .tokens = tokens, .n = n, .logits = true};
    return step_forward(fs, pool, &seg, 1, true, ids, logits, e);
}

static int forward_run(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                       const int *tokens, int n, bool all_logits, float *logits, int *next,
                       const struct sample_params *sp, struct err *e)
{
    if (n <= 0)
        return err_set(e, "forward: no tokens");
    const int most = all_logits ? fs->logit_rows : fs->max_tokens;
    for (int done = 0; done < n;) {
        int k = n - done < most ? n - done : most;
        bool last = done + k == n;
        float *out = all_logits ? logits + (size_t)done * fs->m->cfg.vocab_size : logits;
        enum logits_mode mode = all_logits ? LOGITS_ALL : last ? LOGITS_LAST : LOGITS_NONE;
        if (chunk_forward(fs, pool, seq, tokens + done, k, mode, out, last ? next : NULL, sp, e))
            return -1;
        done += k;
    }
    return 0;
}

int forward_tokens(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                   const int *tokens, int n, bool all_logits, float *logits, struct err *e)
{
    return forward_run(fs, pool, seq, tokens, n, all_logits, logits, NULL, NULL, e);
}

int forward_tokens_greedy(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                          const int *tokens, int n, float *logits, int *next, struct err *e)
{
    return forward_run(fs, pool, seq, tokens, n, false, logits, next, NULL, e);
}

int forward_tokens_sampled(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                           const int *tokens, int n, float *logits,
                           const struct sample_params *sp, int *next, struct err *e)
{
    return forward_run(fs, pool, seq, tokens, n, false, logits, next, sp, e);
}

/* ---- greedy decoding one step ahead of the host ----
 *
 * With argmax_async the pick of a step stays on the device and the next
 * step reads it there (BACKEND_TOKEN_LAST), so step i+1 is queued before
 * step i's id is read: the device goes from one step to the next without
 * waiting for the host to copy the id, decide and issue. Without it each
 * step runs at once and its id waits in the queue, the same loop either
 * way. */

int forward_pipe_issue(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                       const int *tok, struct err *e)
{
    const struct backend_ops *op = fs->be->ops;
    struct forward_pipe *p = &fs->pipe;
    if (p->n == 2)
        return err_set(e, "forward: two greedy steps in flight already (take one first)");
    if (!tok && p->n == 0)
        return err_set(e, "forward: no greedy step in flight whose id to feed");
    const int slot = (p->head + p->n) & 1, last = (slot + 1) & 1;
    if (!forward_pipe_on_device(fs)) {
        int t = tok ? *tok : p->ids[last];
        if (!p->row && !(p->row = malloc(sizeof(float) * (size_t)fs->m->cfg.vocab_size)))
            return err_set(e, "out of memory for a logits row");
        if (forward_tokens_greedy(fs, pool, seq, &t, 1, p->row, &p->ids[slot], e))
            return -1;
        p->n++;
        return 0;
    }
    /* a token of the host's after an id still in flight: the queue stays in
     * order, the device's pick of that step is simply not fed */
    int t = tok ? *tok : BACKEND_TOKEN_LAST;
    /* next: the row serves argmax_async's pick alone (seg_pick_k), which
     * lands in the slot, not through next */
    struct forward_seg seg = {.seq = seq, .tokens = &t, .n = 1, .logits = true,
                              .next = &p->ids[slot]};
    bool decodes = false;
    int rows = step_issue(fs, pool, &seg, 1, false, true, &decodes, e);
    if (rows < 0)
        return -1;
    if (op->argmax_async(fs->be, fs->logits, fs->m->cfg.vocab_size, slot, e))
        return -1;
    p->n++;
    return 0;
}

int forward_pipe_take(struct forward_state *fs, int *next, struct err *e)
{
    struct forward_pipe *p = &fs->pipe;
    if (p->n == 0)
        return err_set(e, "forward: no greedy step in flight");
    const int slot = p->head;
    p->head = (p->head + 1) & 1;
    p->n--;
    if (forward_pipe_on_device(fs) &&
        fs->be->ops->argmax_take(fs->be, slot, &p->ids[slot], e)) {
        p->n = 0; /* the backend keeps its failure: nothing more comes */
        return -1;
    }
    *next = p->ids[slot];
    return 0;
}

int forward_pipe_drop(struct forward_state *fs, struct err *e)
{
    int rc = 0, id;
    while (fs->pipe.n > 0 && !rc)
        rc = forward_pipe_take(fs, &id, e);
    return rc;
}
