/* cuda_mega.c - the decode_layers op: a one-token decode step of one
 * sequence runs every layer in one persistent launch (decode_mega.cu)
 * where the model has the shapes that kernel takes, set up once per model
 * on the first step that asks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "base/env.h"

/* The device copy of a layer matrix when it is bf16 on the device, else
 * NULL. */
static const uint16_t *mega_mat(const struct cuda_backend *c, const struct tensor *t)
{
    const struct wentry *w = tensor_present(t) ? map_find(c, t->data) : NULL;
    return w && w->w.dtype == DT_BF16 ? w->w.data : NULL;
}

/* A norm or bias vector's device copy; NULL when the model has none (ok
 * stays) or when it was not uploaded (ok cleared). */
static const float *mega_vec(const struct cuda_backend *c, const struct tensor *t, bool *ok)
{
    if (!t->data)
        return NULL;
    const struct wentry *w = map_find(c, t->data);
    if (!w || w->w.dtype != DT_F32)
        *ok = false;
    return w ? w->w.data : NULL;
}

/* The probe's host copies (none when it is off). */
static void mega_rec_free(struct cuda_backend *c)
{
    free(c->mega_rec);
    free(c->mega_tr);
    free(c->mega_skew);
    free(c->mega_trid);
    free(c->mega_lag);
    free(c->mega_sm);
    c->mega_rec = c->mega_trid = c->mega_sm = NULL;
    c->mega_tr = c->mega_skew = c->mega_lag = NULL;
}

/* Sets up c->mega_args for m (its layer table and buffers on the device);
 * returns 1 when the kernel takes it, 0 with the reason in c->mega_why. */
static int mega_setup(struct cuda_backend *c, const struct model *m)
{
    const struct model_config *cf = &m->cfg;
    struct cuk_mega *a = &c->mega_args;
    memset(a, 0, sizeof *a);
    c->mega_why[0] = 0;
#define NO(...) (snprintf(c->mega_why, sizeof c->mega_why, __VA_ARGS__), 0)
    if (cf->sliding_window > 0)
        return NO("it has a sliding window");
    if (!c->kv_bf16)
        return NO("needs a bf16 K/V cache");
    int L = cf->n_layers;
    struct cuk_mega_layer *h = calloc((size_t)L, sizeof *h);
    if (!h)
        return NO("out of memory");
    bool ok = true;
    for (int l = 0; l < L && ok; l++) {
        const struct layer_weights *w = &m->layers[l];
        struct cuk_mega_layer *d = &h[l];
        ok = (d->wq = mega_mat(c, &w->wq)) && (d->wk = mega_mat(c, &w->wk)) &&
             (d->wv = mega_mat(c, &w->wv)) && (d->wo = mega_mat(c, &w->wo)) &&
             (d->wg = mega_mat(c, &w->w_gate)) && (d->wu = mega_mat(c, &w->w_up)) &&
             (d->wd = mega_mat(c, &w->w_down));
        if (!ok)
            break;
        d->attn_norm = mega_vec(c, &w->attn_norm, &ok);
        d->ffn_norm = mega_vec(c, &w->ffn_norm, &ok);
        ok = ok && d->attn_norm && d->ffn_norm;
        if (cf->qk_norm) {
            d->qn = mega_vec(c, &w->q_norm, &ok);
            d->kn = mega_vec(c, &w->k_norm, &ok);
            ok = ok && d->qn && d->kn;
        }
        if (cf->qkv_bias) {
            d->bq = mega_vec(c, &w->bq, &ok);
            d->bk = mega_vec(c, &w->bk, &ok);
            d->bv = mega_vec(c, &w->bv, &ok);
        }
    }
    if (!ok) {
        free(h);
        return NO("needs every layer matrix in bf16");
    }
    a->n_layers = L;
    a->dim = cf->dim;
    a->ffn = cf->hidden_dim;
    a->n_heads = cf->n_heads;
    a->eps = cf->norm_eps;
    a->interleaved = cf->rope_interleaved;
    a->g.n_kv_heads = cf->n_kv_heads;
    a->g.head_dim = cf->head_dim;
    a->g.kv_bf16 = 1;
    a->g.scale = 1.0f / sqrtf((float)cf->head_dim);
    long slots = 0;
    struct err se = {{0}};
    if (env_long("CLLM_CUDA_MEGA_SLOTS", 0, 16, &slots, &se) < 0)
        fprintf(stderr, "cllm: %s (ignored)\n", se.msg);
    a->ns_max = (int)slots;
    /* two: what it buys is measured at mg_produce (decode_mega.cu) */
    long inflight = 2;
    if (env_long("CLLM_CUDA_MEGA_INFLIGHT", 0, 16, &inflight, &se) < 0)
        fprintf(stderr, "cllm: %s (ignored)\n", se.msg);
    a->inflight = (int)inflight;
    if (!cuk_mega_plan(a, c->n_sms, c->mega_why, sizeof c->mega_why)) {
        free(h);
        return 0;
    }
    /* one buffer: the step counter, the layer table, the workspace (all
     * zero to begin with, then the kernel's), the probe's record */
    size_t lay_off = 256;
    size_t ws_off = (lay_off + (size_t)L * sizeof *h + 255) / 256 * 256;
    size_t rec_off = ws_off + (cuk_mega_ws_floats(a) * sizeof(float) + 255) / 256 * 256;
    size_t rec_words = c->mega_probe ? cuk_mega_probe_words(a) : 0;
    size_t bytes = rec_off + rec_words * sizeof(unsigned);
    mega_rec_free(c);
    c->mega_rec = rec_words ? calloc(rec_words, sizeof(unsigned)) : NULL;
    c->mega_tr = rec_words ? calloc((size_t)a->nb * CUK_MEGA_TR_MAX * 2, sizeof(double)) : NULL;
    c->mega_skew = rec_words ? calloc((size_t)a->nb, sizeof(double)) : NULL;
    c->mega_trid = rec_words ? calloc((size_t)a->nb * CUK_MEGA_TR_MAX, sizeof(unsigned)) : NULL;
    c->mega_lag = rec_words ? calloc((size_t)a->nb, sizeof(double)) : NULL;
    c->mega_sm = rec_words ? calloc((size_t)a->nb, sizeof(unsigned)) : NULL;
    c->mega_trn = 0;
    if (rec_words && (!c->mega_rec || !c->mega_tr || !c->mega_skew || !c->mega_trid ||
                      !c->mega_lag || !c->mega_sm)) {
        free(h);
        return NO("out of memory");
    }
    char *buf = dbuf_get(c, &c->mega_buf, bytes, "decode step");
    if (!buf || fail_cuda(c, "decode step setup", cudaMemsetAsync(buf, 0, bytes, c->stream)) ||
        fail_cuda(c, "decode step setup",
                  cudaMemcpyAsync(buf + lay_off, h, (size_t)L * sizeof *h,
                                  cudaMemcpyHostToDevice, c->stream)) ||
        fail_cuda(c, "decode step setup", cudaStreamSynchronize(c->stream))) {
        free(h);
        return NO("its buffers could not be made");
    }
    free(h);
    a->gen = (unsigned *)buf;
    a->layers = (const struct cuk_mega_layer *)(buf + lay_off);
    a->ws = (float *)(buf + ws_off);
    a->probe = rec_words ? (unsigned *)(buf + rec_off) : NULL;
    long nap = 0;
    struct err ne = {{0}};
    if (env_long("CLLM_CUDA_MEGA_POLL_NS", 0, 100000, &nap, &ne) < 0)
        fprintf(stderr, "cllm: %s (ignored)\n", ne.msg);
    a->poll_ns = (int)nap;
    return 1;
#undef NO
}

/* The probe's record of the step just issued, added to the sums: per
 * phase of the middle layers, over blocks, the median and the latest of
 * when its input was in and when its outputs were sent, from the block's
 * own start of the layer (its q/k/v input in). */
static int cmp_u(const void *x, const void *y)
{
    unsigned a = *(const unsigned *)x, b = *(const unsigned *)y;
    return (a > b) - (a < b);
}

static int cmp_i(const void *x, const void *y)
{
    int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

/* The median over n blocks of s[b] - from[each ? b : 0] in ns (signed:
 * the stamps are the global timer's low 32 bits); tmp holds n ints. */
static int median_since(const unsigned *s, const unsigned *from, bool each, int n, int *tmp)
{
    for (int b = 0; b < n; b++)
        tmp[b] = (int)(s[b] - from[each ? b : 0]);
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_i);
    return tmp[n / 2];
}

static void mega_collect(struct cuda_backend *c)
{
    const struct cuk_mega *a = &c->mega_args;
    const int nb = a->nb;
    size_t words = cuk_mega_probe_words(a);
    if (cudaMemcpyAsync(c->mega_rec, a->probe, words * sizeof(unsigned), cudaMemcpyDeviceToHost,
                        c->stream) != cudaSuccess ||
        cudaStreamSynchronize(c->stream) != cudaSuccess)
        return;
    const unsigned *r = c->mega_rec;
    unsigned *v = malloc(sizeof(unsigned) * (size_t)nb);
    if (!v)
        return;
#define AT(l, p, k, b) r[(((size_t)(l) * 5 + (p)) * 6 + (k)) * nb + (b)]
    for (int l = 1; l + 1 < a->n_layers; l++)
        for (int p = 0; p < 6; p++)
            for (int k = 0; k < 5; k++) {
                /* the next layer has only its start; the attention no
                 * rows stamps (on the common timer those read as the
                 * timer itself) */
                if ((p == 5 && k > 0) || (p == 1 && k > 1))
                    continue;
                for (int b = 0; b < nb; b++) /* p 5: the next layer's start */
                    v[b] = (p < 5 ? AT(l, p, k, b) : AT(l + 1, 0, 0, b)) - AT(l, 0, 0, b);
                qsort(v, (size_t)nb, sizeof *v, cmp_u);
                c->mega_sum[p][2 * k] += v[nb / 2];
                c->mega_sum[p][2 * k + 1] += v[nb - 1];
                if (p < 5 && k == 1) { /* outputs sent, on the common timer */
                    const unsigned ref = AT(l, 0, 0, 0);
                    int *tmp = (int *)v;
                    const int med = median_since(&AT(l, p, 1, 0), &ref, false, nb, tmp);
                    int late = 0;
                    for (int b = 0; b < nb; b++) {
                        const int t = (int)(AT(l, p, 1, b) - ref);
                        c->mega_lag[b] += (double)(t - med);
                        late = t > (int)(AT(l, p, 1, late) - ref) ? b : late;
                    }
                    /* the latest sender against the median block: was its
                     * input late, or its rows slow? */
                    const int in_med = median_since(&AT(l, p, 0, 0), &ref, false, nb, tmp);
                    c->mega_lat[p][0] += (int)(AT(l, p, 1, late) - ref) - med;
                    c->mega_lat[p][1] += (int)(AT(l, p, 0, late) - ref) - in_med;
                    if (p == 1) /* the attention has no rows stamp */
                        continue;
                    const int rb_med = median_since(&AT(l, p, 2, 0), &ref, false, nb, tmp);
                    c->mega_lat[p][2] += (int)(AT(l, p, 2, late) - ref) - rb_med;
                    c->mega_lat[p][3] += (int)(AT(l, p, 1, late) - AT(l, p, 2, late));
                    c->mega_lat[p][4] +=
                        median_since(&AT(l, p, 1, 0), &AT(l, p, 2, 0), true, nb, tmp);
                }
            }
    for (int l = 1; l + 1 < a->n_layers; l++) /* chunks not yet landed at first look */
        for (int p = 0; p < 5; p++)
            for (int b = 0; b < nb; b++)
                c->mega_late[p] += (double)AT(l, p, 5, b) / nb;
#undef AT
    /* the middle layer's trace: each block's events from its first */
    const unsigned *t = r + (size_t)a->n_layers * 5 * 6 * nb;
    for (int b = 0; b < nb; b++) {
        const unsigned *q = t + (size_t)b * CUK_MEGA_TR_MAX * 3;
        c->mega_skew[b] += (double)(int)(q[1] - t[1]);
        if (q[6] == 92) /* the third event carries the block's SM */
            c->mega_sm[b] = q[7];
        for (int i = 0; i < CUK_MEGA_TR_MAX && q[3 * i]; i++) {
            c->mega_trid[b * CUK_MEGA_TR_MAX + i] = q[3 * i];
            c->mega_tr[((size_t)b * CUK_MEGA_TR_MAX + i) * 2] += (double)(q[3 * i + 1] - q[1]);
            c->mega_tr[((size_t)b * CUK_MEGA_TR_MAX + i) * 2 + 1] +=
                (double)(q[3 * i + 2] - q[2]);
        }
    }
    c->mega_trn++;
    free(v);
    c->mega_n += a->n_layers - 2;
}

void mega_report(struct cuda_backend *c)
{
    if (!c->mega_n) {
        mega_rec_free(c);
        return;
    }
    static const char *what[] = {"q/k/v", "attention", "o", "gate/up", "down", "next layer"};
    fprintf(stderr, "mega probe: %ld layers; us from each block's layer start, median / "
                    "latest block: input in, outputs sent, rows begin, first batch's chunks "
                    "in, first batch done; late: a block's waits on weights (a chunk's, or a "
                    "job's chunks together) that had not landed when its rows reached them\n",
            c->mega_n);
    const double us = 1e-3 / (double)c->mega_n; /* summed ns to us a layer */
    for (int p = 0; p < 6; p++) {
        fprintf(stderr, "  %-10s", what[p]);
        for (int j = 0; j < 5; j++)
            fprintf(stderr, "  %6.2f %6.2f", c->mega_sum[p][2 * j] * us,
                    c->mega_sum[p][2 * j + 1] * us);
        if (p < 5)
            fprintf(stderr, "   late %.2f", c->mega_late[p] / (double)c->mega_n);
        fprintf(stderr, "\n");
    }
    /* the eight blocks latest to send, on average, and their SMs (each
     * printed block's sum is then marked -INFINITY) */
    const int nb = c->mega_args.nb;
    fprintf(stderr, "mega latest senders (block/SM: us after the median, per phase):");
    for (int k = 0; k < 8 && k < nb; k++) {
        int w = 0;
        for (int b = 1; b < nb; b++)
            w = c->mega_lag[b] > c->mega_lag[w] ? b : w;
        fprintf(stderr, " %d/%u: %.2f", w, c->mega_sm[w], c->mega_lag[w] * us / 5);
        c->mega_lag[w] = -INFINITY;
    }
    fprintf(stderr, "\n");
    fprintf(stderr, "mega latest sender of each phase, on the common timer (us after the "
                    "median block): sent, input in, rows begun; its rows begun to sent, and "
                    "the median block's\n");
    for (int p = 0; p < 5; p++) {
        const double *q = c->mega_lat[p];
        if (p == 1) /* the attention: no rows stamp */
            fprintf(stderr, "  %-10s  %6.2f %6.2f\n", what[p], q[0] * us, q[1] * us);
        else
            fprintf(stderr, "  %-10s  %6.2f %6.2f %6.2f   %6.2f %6.2f\n", what[p], q[0] * us,
                    q[1] * us, q[2] * us, q[3] * us, q[4] * us);
    }
    /* the trace of four blocks (0 merges a head, 1 does not) */
    const int show[4] = {0, 1, nb / 2, nb - 1};
    fprintf(stderr, "mega trace of layer %d, warp 0 of blocks %d, %d, %d, %d: event id, ns "
                    "and cycles from the block's first event (%ld steps)\n",
            c->mega_args.n_layers / 2, show[0], show[1], show[2], show[3], c->mega_trn);
    for (int k = 0; k < 4; k++) {
        const int b = show[k];
        fprintf(stderr, "  block %d starts %.0f ns after block 0:", b,
                c->mega_skew[b] / (double)c->mega_trn);
        for (int i = 0; i < CUK_MEGA_TR_MAX && c->mega_trid[b * CUK_MEGA_TR_MAX + i]; i++)
            fprintf(stderr, "%s%u:%.0f/%.0f", i % 8 ? " " : "\n    ",
                    c->mega_trid[b * CUK_MEGA_TR_MAX + i],
                    c->mega_tr[((size_t)b * CUK_MEGA_TR_MAX + i) * 2] / (double)c->mega_trn,
                    c->mega_tr[((size_t)b * CUK_MEGA_TR_MAX + i) * 2 + 1] / (double)c->mega_trn);
        fprintf(stderr, "\n");
    }
    mega_rec_free(c);
}

int cu_decode_layers(struct backend *be, const struct model *m, float *x, struct kv_pool *pool,
                     const struct kv_seq *seq, int pos, const float *inv_freq, struct err *e)
{
    struct cuda_backend *c = cb(be);
    if (!c->mega)
        return 0;
    if (!c->capturing)
        use_device(c);
    if (c->mega_model != m) {
        if (c->capturing) /* set up on an eager step (the first decode is one) */
            return 0;
        pend_settle(c);
        c->mega_ok = mega_setup(c, m);
        c->mega_model = m;
        if (c->err[0])
            return sticky(c, e);
        if (!c->mega_ok) /* asked for, so say why the layer launches run instead */
            fprintf(stderr, "cllm: CLLM_CUDA_MEGA: %s: the one-launch decode step does not take "
                            "this model (%s); each layer's ops run instead\n",
                    c->name, c->mega_why);
    }
    const struct model_config *cf = &m->cfg;
    if (c->mega_ok != 1 || pool->dtype != DT_BF16 ||
        !pool_takes(pool, cf->n_kv_heads, cf->head_dim))
        return 0;
    c = op_begin(be); /* settles a pending merge; x changes */
    if (sticky(c, e))
        return -1;
    if (pos + 1 > seq->n_blocks * pool->block_size)
        return err_set(e, "%s: decode beyond the sequence's cached positions", c->name);
    struct cuk_mega *a = &c->mega_args;
    const float *invf = dev_invf(c, inv_freq, cf->head_dim / 2);
    const int *tab = invf ? dev_table(c, seq) : NULL;
    if (!tab)
        return sticky(c, e);
    a->x = x;
    a->inv_freq = invf;
    a->table = tab;
    a->dpos = c->capturing ? (const int *)c->step.p : NULL;
    a->kc = pool->k;
    a->vc = pool->v;
    a->g = attn_geom(c, pool, 0, 1, pos); /* the kernel sets the layer */
    a->g.scale = 1.0f / sqrtf((float)cf->head_dim);
    if (fail_cuda(c, "decode step", cuk_mega_decode(c->stream, a)))
        return sticky(c, e);
    if (a->probe && !c->capturing)
        mega_collect(c);
    return 1;
}
