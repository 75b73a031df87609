/* cuda_weights.c - the CUDA backend's weights: the map from a tensor's host
 * data to its device copy (what the ops look weights up in), and
 * load_weights, which copies every tensor to the device once (Q8_0
 * repacked, GGUF's low-bit blocks as they are; k/v and gate/up pairs in
 * one allocation each). */
#include "backend/cuda/cuda_internal.h"
#include "base/clock.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/quant.h"

/* ---- weight map ---- */

static size_t hash_ptr(const void *p, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

struct wentry *map_find(const struct cuda_backend *c, const void *host)
{
    if (!c->map_cap || !host)
        return NULL;
    for (size_t i = hash_ptr(host, c->map_cap);; i = (i + 1) & (c->map_cap - 1)) {
        if (c->map[i].host == host)
            return &c->map[i];
        if (!c->map[i].host)
            return NULL;
    }
}

static struct wentry *map_insert(struct cuda_backend *c, const void *host)
{
    size_t i = hash_ptr(host, c->map_cap);
    while (c->map[i].host)
        i = (i + 1) & (c->map_cap - 1);
    c->map[i].host = host;
    c->map_n++;
    return &c->map[i];
}

const float *dev_vec(struct cuda_backend *c, const float *host, const char *op)
{
    struct wentry *w = map_find(c, host);
    if (!w) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s: a weight vector was not uploaded (load_weights first)", op);
        fail_msg(c, msg);
        return NULL;
    }
    return w->w.data;
}

/* ---- weights ---- */

static size_t tensor_bytes(const struct tensor *t)
{
    return (size_t)t->rows * dtype_row_bytes(t->dtype, t->cols);
}

/* Device bytes a tensor takes (Q8_0 repacked: 1 byte per element + scales). */
static size_t tensor_dev_bytes(const struct tensor *t)
{
    if (t->dtype == DT_Q8_0)
        return (size_t)t->rows * (size_t)t->cols + (size_t)t->rows * (size_t)(t->cols / 32) * 2;
    return tensor_bytes(t);
}

/* Every tensor of m, in *out; (*pair)[i] marks a tensor uploaded together
 * with the one after it (k and v, gate and up: upload_pair). */
static int collect_tensors(const struct model *m, const struct tensor ***out, bool **pair,
                           struct err *e)
{
    int per = 14, n = 0;
    size_t cap = (size_t)(3 + per * m->cfg.n_layers);
    const struct tensor **ts = malloc(sizeof *ts * cap);
    bool *pr = calloc(cap, sizeof *pr);
    if (!ts || !pr) {
        free(ts);
        free(pr);
        return err_set(e, "out of memory");
    }
    ts[n++] = &m->tok_embd;
    ts[n++] = &m->out_norm;
    ts[n++] = &m->lm_head;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct layer_weights *w = &m->layers[l];
        const struct tensor *lt[] = {&w->attn_norm, &w->wq, &w->wk, &w->wv, &w->wo,
                                     &w->bq, &w->bk, &w->bv, &w->q_norm, &w->k_norm,
                                     &w->ffn_norm, &w->w_gate, &w->w_up, &w->w_down};
        for (int i = 0; i < per; i++) {
            pr[n] = lt[i] == &w->wk || lt[i] == &w->w_gate;
            ts[n++] = lt[i];
        }
    }
    *out = ts;
    *pair = pr;
    return n;
}

/* place: device memory (of the tensor's size) to copy it into, owned
 * elsewhere (upload_pair); NULL: an allocation of its own. */
static int upload_tensor(struct cuda_backend *c, const struct tensor *t, struct dbuf *tmp,
                         void *place, struct err *e)
{
    if (t->rows > INT32_MAX || t->cols > INT32_MAX)
        return err_set(e, "%s: tensor [%lld x %lld] is too large", c->name, (long long)t->rows,
                       (long long)t->cols);
    struct wentry *w = map_insert(c, t->data);
    w->w.dtype = t->dtype;
    w->w.rows = (int)t->rows;
    w->w.cols = (int)t->cols;
    size_t bytes = tensor_bytes(t);
    cudaError_t err;
    if (t->dtype == DT_Q8_0) {
        size_t nel = (size_t)t->rows * (size_t)t->cols, nblk = nel / Q8_0_BLOCK;
        if ((err = cudaMalloc(&w->mem, nel)) != cudaSuccess ||
            (err = cudaMalloc(&w->mem2, nblk * 2)) != cudaSuccess)
            goto cuda_fail;
        if (!dbuf_get(c, tmp, bytes, "the Q8_0 upload buffer")) {
            err = cudaErrorMemoryAllocation;
            goto cuda_fail;
        }
        if ((err = cudaMemcpyAsync(tmp->p, t->data, bytes, cudaMemcpyHostToDevice, c->stream)) !=
                cudaSuccess ||
            (err = cuk_q8_repack(c->stream, w->mem, w->mem2, tmp->p, nblk)) != cudaSuccess)
            goto cuda_fail;
        w->w.data = w->mem;
        w->w.scales = w->mem2;
    } else {
        if (!place && (err = cudaMalloc(&w->mem, bytes)) != cudaSuccess)
            goto cuda_fail;
        void *dst = place ? place : w->mem;
        if ((err = cudaMemcpyAsync(dst, t->data, bytes, cudaMemcpyHostToDevice, c->stream)) !=
            cudaSuccess)
            goto cuda_fail;
        w->w.data = dst;
    }
    c->weight_bytes += tensor_dev_bytes(t);
    return 0;
cuda_fail:
    return err_set(e, "%s: uploading a %s tensor [%lld x %lld] (%zu MiB): %s", c->name,
                   dtype_name(t->dtype), (long long)t->rows, (long long)t->cols, bytes >> 20,
                   cudaGetErrorString(err));
}

/* Two same-shape half matrices over one input (k and v, gate and up)
 * uploaded into one allocation, the first below the second: their
 * outputs lie that way too (forward.c), so gemm_pair can always run them
 * as one strided batch; with an allocation each, the driver's placement
 * decided it layer by layer (a 0.6B model's batched step paired about
 * half of them, CUPTI trace). 1: uploaded; 0: not a pair (the caller
 * uploads them one by one); -1: error. */
static int upload_pair(struct cuda_backend *c, const struct tensor *t0, const struct tensor *t1,
                       struct dbuf *tmp, struct err *e)
{
    if (!t0->data || !t1->data || t0->data == t1->data || t0->dtype != t1->dtype ||
        (t0->dtype != DT_BF16 && t0->dtype != DT_F16) || t0->rows != t1->rows ||
        t0->cols != t1->cols || map_find(c, t0->data) || map_find(c, t1->data))
        return 0;
    size_t bytes = tensor_bytes(t0), off = (bytes + 255) & ~(size_t)255;
    void *blk = NULL;
    cudaError_t err = cudaMalloc(&blk, off + bytes);
    if (err != cudaSuccess)
        return err_set(e, "%s: uploading a pair of %s tensors [%lld x %lld] (%zu MiB each): %s",
                       c->name, dtype_name(t0->dtype), (long long)t0->rows, (long long)t0->cols,
                       bytes >> 20, cudaGetErrorString(err));
    if (upload_tensor(c, t0, tmp, blk, e)) {
        cudaFree(blk);
        return -1;
    }
    map_find(c, t0->data)->mem = blk; /* the first owns the pair's allocation */
    if (upload_tensor(c, t1, tmp, (char *)blk + off, e))
        return -1;
    return 1;
}

/* CLLM_CUDA_WIDE_COPY: each quantized matrix a matmul reads (the layers'
 * and the LM head) widened once into a bf16 copy of its own, which steps
 * of wide_from tokens or more multiply as a bf16 model's matrices
 * (mm_weights) instead of widening the rows again at every call or
 * computing the quantized GEMV's products token by token. H100, 8B
 * Q4_K: a 512-token prompt 21,487 -> 34,301 tok/s, 16 streams 903 ->
 * 1,939 (docs/benchmarks.md, session 57), for 2 bytes a weight more
 * device memory; single-stream decode still reads the quantized blocks.
 * wide_matrices: the tensors that get one, n of them at most 7 a layer
 * + 1. */
static int wide_matrices(const struct model *m, const struct tensor **out)
{
    int n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct layer_weights *w = &m->layers[l];
        const struct tensor *lt[] = {&w->wq, &w->wk, &w->wv, &w->wo,
                                     &w->w_gate, &w->w_up, &w->w_down};
        for (int i = 0; i < 7; i++)
            out[n++] = lt[i];
    }
    out[n++] = &m->lm_head;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (out[i]->data && (quant_is_low_bit(out[i]->dtype) || out[i]->dtype == DT_Q8_0))
            out[k++] = out[i];
    return k;
}

/* The tensors that get a bf16 copy (a new array: free it) and their
 * count in *n, their bytes in *bytes; NULL when out of memory. */
static const struct tensor **wide_list(const struct model *m, int *n, size_t *bytes)
{
    const struct tensor **ts = malloc(sizeof *ts * (size_t)(7 * m->cfg.n_layers + 1));
    if (!ts)
        return NULL;
    *n = wide_matrices(m, ts);
    *bytes = 0;
    for (int i = 0; i < *n; i++)
        *bytes += (size_t)ts[i]->rows * (size_t)ts[i]->cols * 2;
    return ts;
}

/* Drops every bf16 copy made. */
static void wide_drop(struct cuda_backend *c)
{
    for (size_t i = 0; i < c->map_cap; i++)
        if (c->map[i].wide.data) {
            cudaFree((void *)c->map[i].wide.data);
            c->map[i].wide = (struct cuk_weight){0};
        }
    c->wide_bytes = 0;
}

/* The copies of the n tensors ts, after the weights are uploaded. A
 * failure drops those made; the caller says whether it is an error. */
static cudaError_t wide_make(struct cuda_backend *c, const struct tensor **ts, int n)
{
    cudaError_t err = cudaSuccess;
    for (int i = 0; i < n && err == cudaSuccess; i++) {
        struct wentry *we = map_find(c, ts[i]->data);
        if (!we || we->wide.data)
            continue;
        const size_t bytes = (size_t)we->w.rows * (size_t)we->w.cols * 2;
        void *p = NULL;
        err = cudaMalloc(&p, bytes);
        if (err != cudaSuccess)
            break;
        we->wide = (struct cuk_weight){.dtype = DT_BF16, .rows = we->w.rows, .cols = we->w.cols,
                                       .data = p};
        c->wide_bytes += bytes;
        err = cuk_dequant_half(c->stream, p, &we->w, 0, we->w.rows, 1);
    }
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(c->stream);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* an allocation's failure is not sticky */
        wide_drop(c);
        return err;
    }
    c->weight_bytes += c->wide_bytes;
    /* the copies route as a bf16 model's matrices: gemv_max 1, as
     * cu_load_weights sets it for one, so the tensor-core GEMV takes their
     * small steps */
    if (!c->gemv_max_env && c->gemv_mma && !c->precise)
        c->gemv_max = 1;
    return cudaSuccess;
}

static void wide_report(const struct cuda_backend *c, const char *when)
{
    /* (the K-quants' steps of cu_qmma_from-16 tokens stay on their
     * blocks: mm_weights) */
    char kq[128] = "";
    if (c->qmma && c->gemv_mma)
        snprintf(kq, sizeof kq, ", but Q4_K/Q5_K/Q6_K steps of %d-%d (%d-%d up to %d columns) on "
                 "their blocks", cu_qmma_from(c, QMMA_NARROW_COLS + 1), CUK_MMA_MAX_N,
                 cu_qmma_from(c, QMMA_NARROW_COLS), CUK_MMA_MAX_N, QMMA_NARROW_COLS);
    fprintf(stderr, "%s: bf16 copies of the quantized matrices for prompts and steps of %d+ "
                    "tokens%s: %.1f MiB (%s; CLLM_CUDA_WIDE_COPY=0 goes without)\n",
            c->name, c->wide_from, kq, c->wide_bytes / 1048576.0, when);
}

int cu_load_spare(struct backend *be, const struct model *m, size_t spare, struct err *e)
{
    struct cuda_backend *c = cb(be);
    (void)e;
    if (c->wide_copy >= 0 || c->wide_bytes || c->quant_type < 0)
        return 0; /* asked for at load, or off, or nothing quantized */
    use_device(c);
    int n = 0;
    size_t bytes = 0;
    const struct tensor **ts = wide_list(m, &n, &bytes);
    if (!ts || n == 0) {
        free(ts);
        return 0;
    }
    if (bytes > spare) {
        fprintf(stderr, "%s: no bf16 copies of the quantized matrices: they need %.0f MiB and "
                        "%.0f MiB are spare beside the KV pool; prompts and batched steps widen "
                        "the weights call by call (a smaller --ctx or --batch leaves room, "
                        "CLLM_CUDA_WIDE_COPY=1 makes them before the pool)\n",
                c->name, bytes / 1048576.0, spare / 1048576.0);
        free(ts);
        return 0;
    }
    cudaError_t err = wide_make(c, ts, n);
    free(ts);
    if (err != cudaSuccess) {
        fprintf(stderr, "%s: no bf16 copies of the quantized matrices: %s\n", c->name,
                cudaGetErrorString(err));
        return 0;
    }
    wide_report(c, "memory the KV pool leaves");
    return 0;
}

int cu_load_weights(struct backend *be, const struct model *m, struct err *e)
{
    pend_settle(cb(be)); /* see c->pend */
    struct cuda_backend *c = cb(be);
    use_device(c);
    if (c->map_n)
        return err_set(e, "%s: weights are already loaded (one model per backend)", c->name);
    /* What half_out needs to know: which activations feed which GEMMs. */
    c->model_dim = m->cfg.dim;
    c->ffn_dim = m->cfg.hidden_dim;
    c->half_type = -1;
    if (m->cfg.n_layers > 0 && (m->layers[0].wq.dtype == DT_BF16 || m->layers[0].wq.dtype == DT_F16))
        c->half_type = m->layers[0].wq.dtype;
    c->quant_type = -1;
    if (m->cfg.n_layers > 0 &&
        (quant_is_low_bit(m->layers[0].wq.dtype) || m->layers[0].wq.dtype == DT_Q8_0))
        c->quant_type = m->layers[0].wq.dtype;
    /* Steps of 2 tokens or more (batched decodes) go to the tensor-core
     * GEMV where it is on, and what it does not take to cuBLAS (H200,
     * docs/benchmarks.md, twentieth pass: against the staged GEMVs up to 4
     * tokens, 0.6B at 3 / 4 streams 2,193 -> 2,713 / 2,414 -> 3,563 tok/s;
     * against the GEMVs up to 2, 0.6B at 2 streams 1,769 -> 1,939).
     * Where it is off, steps of up to CUK_STAGE_MAX_N tokens take the
     * staged GEMVs (every weight read once, norms and SwiGLU fused) for
     * the matrices gemv_rows gives them, the rest cuBLAS (see
     * STAGED_X_BYTES; a 0.6B model, every matrix staged, at 3 / 4 streams
     * 1,190 -> 2,060 / 1,946 -> 2,226 tok/s against cuBLAS). */
    if (!c->gemv_max_env && c->half_type >= 0) {
        if (c->gemv_mma && !c->precise)
            c->gemv_max = 1;
        else if (c->gemv_staged)
            c->gemv_max = CUK_STAGE_MAX_N;
    }
    const struct tensor **ts = NULL;
    bool *pair = NULL;
    int n = collect_tensors(m, &ts, &pair, e);
    if (n < 0)
        return -1;
    /* a block format with no kernels here (none today: the loaders refuse
     * what model/quant.h does not read) is said, not computed as zeros */
    for (int i = 0; i < n; i++)
        if (ts[i]->data && dtype_block_elems(ts[i]->dtype) > 1 && ts[i]->dtype != DT_Q8_0 &&
            !quant_is_low_bit(ts[i]->dtype)) {
            enum dtype dt = ts[i]->dtype;
            free(ts);
            free(pair);
            return err_set(e, "%s: the model has %s weights, which the CUDA backend does not "
                              "compute (--device cpu)", c->name, dtype_name(dt));
        }
    size_t need = 0, cap = 16;
    int uniq = 0;
    for (int i = 0; i < n; i++)
        if (ts[i]->data)
            cap += 2;
    while (cap & (cap - 1))
        cap++;
    c->map = calloc(cap, sizeof *c->map);
    if (!c->map) {
        free(ts);
        free(pair);
        return err_set(e, "out of memory");
    }
    c->map_cap = cap;
    /* Sizes first (tied embeddings count once), so an oversized model fails
     * before anything is copied. */
    for (int i = 0; i < n; i++) {
        bool dup = !ts[i]->data;
        for (int j = 0; j < i && !dup; j++)
            dup = ts[j]->data == ts[i]->data;
        if (!dup) {
            need += tensor_dev_bytes(ts[i]);
            uniq++;
        }
    }
    const size_t head = cu_head_bytes(c, m); /* the head's int8 copy, where head_pick is on */
    size_t dfree = 0, dtotal = 0;
    cudaMemGetInfo(&dfree, &dtotal);
    size_t reserve = (size_t)512 << 20; /* activations, KV, cuBLAS workspace come after */
    /* the bf16 copies, where asked for and where they fit beside the rest */
    size_t wide = 0;
    int n_wide = 0;
    const struct tensor **wts = c->wide_copy > 0 ? wide_list(m, &n_wide, &wide) : NULL;
    if (wide && need + head + wide + reserve > dfree) {
        fprintf(stderr, "%s: no bf16 copies of the quantized matrices (CLLM_CUDA_WIDE_COPY): "
                        "%.1f GiB more than the %.1f GiB free holds; prompts and batched steps "
                        "widen the weights call by call\n",
                c->name, wide / 1073741824.0, dfree / 1073741824.0);
        wide = 0;
    }
    if (!wide) {
        free(wts);
        wts = NULL;
    }
    if (need + head + reserve > dfree) {
        free(wts);
        free(ts);
        free(pair);
        return err_set(e, "%s: the model's weights need %.1f GiB%s but only %.1f of %.1f GiB are "
                          "free (plus %.1f GiB kept for activations and KV); use a smaller or "
                          "more quantized model, or --device cpu",
                       c->name, (need + head) / 1073741824.0,
                       head ? " with the LM head's int8 copy (CLLM_CUDA_HEAD_SCREEN=0 drops it)" : "",
                       dfree / 1073741824.0, dtotal / 1073741824.0, reserve / 1073741824.0);
    }
    fprintf(stderr, "%s: loading %d tensors, %.1f MiB of weights (%.1f GiB free)\n", c->name, uniq,
            need / 1048576.0, dfree / 1073741824.0);
    double t0 = clock_now_s(), last = t0;
    size_t done = 0;
    struct dbuf tmp = {0};
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (!ts[i]->data || map_find(c, ts[i]->data))
            continue;
        int two = pair[i] && i + 1 < n ? upload_pair(c, ts[i], ts[i + 1], &tmp, e) : 0;
        if (two < 0) {
            rc = -1;
        } else if (two) {
            done += 2 * tensor_dev_bytes(ts[i]);
            i++;
        } else {
            rc = upload_tensor(c, ts[i], &tmp, NULL, e);
            done += tensor_dev_bytes(ts[i]);
        }
        double t = clock_now_s();
        if (t - last > 0.5 && isatty(2)) {
            fprintf(stderr, "\r%s: %.0f%% (%.0f MiB)", c->name, 100.0 * done / (need ? need : 1),
                    done / 1048576.0);
            last = t;
        }
    }
    cudaError_t serr = cudaStreamSynchronize(c->stream);
    dbuf_free(&tmp);
    free(ts);
    free(pair);
    if (rc || serr != cudaSuccess) {
        free(wts);
        return rc ? -1 : err_set(e, "%s: uploading weights: %s", c->name, cudaGetErrorString(serr));
    }
    double dt = clock_now_s() - t0;
    fprintf(stderr, "%s%s: weights loaded in %.2f s (%.2f GB/s)\n", isatty(2) ? "\r" : "", c->name,
            dt, dt > 0 ? need / dt / 1e9 : 0.0);
    if (wide) {
        cudaError_t err = wide_make(c, wts, n_wide);
        free(wts);
        if (err != cudaSuccess)
            return err_set(e, "%s: the bf16 copies of the quantized matrices (%.1f MiB; "
                              "CLLM_CUDA_WIDE_COPY=0 goes without): %s",
                           c->name, wide / 1048576.0, cudaGetErrorString(err));
        wide_report(c, "CLLM_CUDA_WIDE_COPY=1");
    }
    return cu_head_load(c, m, e);
}
