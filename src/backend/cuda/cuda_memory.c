/* cuda_memory.c - the CUDA backend's buffers and copies as the engine sees
 * them: allocations of activations and the K/V pool, uploads and
 * downloads, and the results that cross back to the host each step
 * (greedy ids, sampled ids), with CLLM_CUDA_TIMING's accounting. */
#include "backend/cuda/cuda_internal.h"
#include "base/clock.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *cu_alloc(struct backend *be, size_t bytes)
{
    cb(be)->op_seq++; /* see half_x */
    struct cuda_backend *c = cb(be);
    use_device(c);
    if (c->n_allocs == c->cap_allocs) {
        size_t cap = c->cap_allocs ? 2 * c->cap_allocs : 32;
        struct alloc_rec *a = realloc(c->allocs, cap * sizeof *a);
        if (!a)
            return NULL;
        c->allocs = a;
        c->cap_allocs = cap;
    }
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is reported by the caller */
        return NULL;
    }
    /* Zeroed like the CPU backend's memory: nothing reads uninitialized data. */
    if (cudaMemsetAsync(p, 0, bytes, c->stream) != cudaSuccess) {
        cudaFree(p);
        return NULL;
    }
    c->allocs[c->n_allocs++] = (struct alloc_rec){p, bytes};
    c->alloc_bytes += bytes;
    return p;
}

void cu_free(struct backend *be, void *p)
{
    struct cuda_backend *c = op_begin(be);
    use_device(c);
    for (size_t i = 0; i < c->n_allocs; i++)
        if (c->allocs[i].p == p) {
            c->alloc_bytes -= c->allocs[i].bytes;
            c->allocs[i] = c->allocs[--c->n_allocs];
            break;
        }
    cudaStreamSynchronize(c->stream);
    graphs_flush(c);
    cudaFree(p);
}

/* CLLM_CUDA_TIMING: marks the start of a decode step's result copy
 * (logits or argmax) and, after it completed, adds the step up. */
static bool timing_mark(struct cuda_backend *c)
{
    bool timed = c->timing && c->t_open;
    if (timed) {
        c->t_mark = clock_now_s();
        cudaEventRecord(c->ev[1], c->stream);
    }
    return timed;
}

static void timing_done(struct cuda_backend *c)
{
    float a = 0, b = 0;
    cudaEventElapsedTime(&a, c->ev[0], c->ev[1]);
    cudaEventElapsedTime(&b, c->ev[1], c->ev[2]);
    c->t_end = clock_now_s();
    int k = c->t_b;
    c->t_gpu[k] += a;
    c->t_copy[k] += b;
    c->t_wall[k] += (c->t_end - c->t_begin) * 1e3;
    c->t_enq[k] += (c->t_mark - c->t_begin) * 1e3;
    c->t_steps[k]++;
    c->t_open = false;
}

void cu_download(struct backend *be, float *dst, const float *src, size_t n)
{
    pend_settle(cb(be)); /* see c->pend */
    struct cuda_backend *c = cb(be);
    use_device(c);
    if (c->err[0])
        return;
    bool timed = timing_mark(c);
    if (!fail_cuda(c, "download", cudaMemcpyAsync(dst, src, n * sizeof(float),
                                                  cudaMemcpyDeviceToHost, c->stream))) {
        if (timed)
            cudaEventRecord(c->ev[2], c->stream);
        fail_cuda(c, "synchronize after download", cudaStreamSynchronize(c->stream));
    }
    if (timed)
        timing_done(c);
}

/* Waits for the step whose kernel wrote its token ids to mapped pinned
 * memory (no copy after it): the one wait of a greedy or sampled step
 * (timed under CLLM_CUDA_TIMING). Returns -1 with the failure kept
 * (sticky). */
static int wait_ids(struct cuda_backend *c, bool timed, struct err *e)
{
    if (timed)
        cudaEventRecord(c->ev[2], c->stream);
    if (fail_cuda(c, "synchronize after the token ids", cudaStreamSynchronize(c->stream)))
        return sticky(c, e);
    if (timed)
        timing_done(c);
    return 0;
}

/* Greedy decoding: the argmax runs on the device and only the id is copied
 * back (to pinned memory), instead of the [vocab] f32 logits row. */
int cu_argmax(struct backend *be, int *out, const float *x, int n, struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    use_device(c);
    if (sticky(c, e))
        return -1;
    bool timed = timing_mark(c);
    int *dout = am_last(c);
    if (fail_cuda(c, "argmax", cuk_argmax(c->stream, dout, c->am_host_dev, x, n, c->am_ws)) ||
        wait_ids(c, timed, e))
        return sticky(c, e);
    *out = *c->am_host;
    return 0;
}

/* Greedy decoding one step ahead (forward_pipe_issue): the pick stays in
 * am_last for the next step's embed, and the kernel writes it to the
 * slot's pinned int as well (mapped: no copy between this step and the
 * next one queued behind it), which argmax_take waits for by the slot's
 * event instead of the stream, so that next step need not finish first.
 * Not timed under CLLM_CUDA_TIMING (its marks assume one step in
 * flight). */
int cu_argmax_async(struct backend *be, const float *x, int n, int slot, struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    use_device(c);
    if (sticky(c, e))
        return -1;
    if (slot < 0 || slot > 1)
        return err_set(e, "argmax_async: slot %d, not 0 or 1", slot);
    c->t_open = false;
    int *dout = am_last(c);
    if (fail_cuda(c, "argmax",
                  cuk_argmax(c->stream, dout, c->am_host_dev + 1 + slot, x, n, c->am_ws)) ||
        fail_cuda(c, "mark the token id", cudaEventRecord(c->am_ev[slot], c->stream)))
        return sticky(c, e);
    c->am_queued[slot] = true;
    c->steps_ahead++;
    return 0;
}

int cu_argmax_take(struct backend *be, int slot, int *out, struct err *e)
{
    struct cuda_backend *c = cb(be);
    use_device(c);
    if (sticky(c, e))
        return -1;
    if (slot < 0 || slot > 1 || !c->am_queued[slot])
        return err_set(e, "argmax_take: nothing queued in slot %d", slot);
    c->am_queued[slot] = false;
    if (fail_cuda(c, "wait for the token id", cudaEventSynchronize(c->am_ev[slot])))
        return sticky(c, e);
    *out = c->am_host[1 + slot];
    return 0;
}

/* Makes amr_host hold rows ids (and amr_ws the argmax's workspace for as
 * many rows, zeroed); -1 with the failure kept. */
static int ids_reserve(struct cuda_backend *c, int rows, struct err *e)
{
    if (rows > c->amr_cap) { /* grows rarely: the batch size bounds rows */
        int cap = rows > 64 ? rows : 64;
        if (fail_cuda(c, "synchronize before growing the id buffers",
                      cudaStreamSynchronize(c->stream)))
            return sticky(c, e);
        if (c->amr_ws)
            cudaFree(c->amr_ws);
        if (c->amr_host)
            cudaFreeHost(c->amr_host);
        c->amr_ws = NULL;
        c->amr_host = c->amr_host_dev = NULL;
        c->amr_cap = 0;
        const size_t wsb = CUK_ARGMAX_ROWS_WS_BYTES(cap);
        if (fail_cuda(c, "allocate the argmax workspace", cudaMalloc(&c->amr_ws, wsb)) ||
            fail_cuda(c, "zero the argmax workspace",
                      cudaMemsetAsync(c->amr_ws, 0, wsb, c->stream)) ||
            fail_cuda(c, "allocate token ids (host)",
                      cudaHostAlloc((void **)&c->amr_host, sizeof(int) * (size_t)cap,
                                    cudaHostAllocMapped)) ||
            fail_cuda(c, "map token ids",
                      cudaHostGetDevicePointer((void **)&c->amr_host_dev, c->amr_host, 0)))
            return sticky(c, e);
        c->amr_cap = cap;
    }
    return 0;
}

/* A batched step's greedy sequences: one launch over their logits rows,
 * which writes rows ids to pinned memory, instead of rows x n floats. */
int cu_argmax_rows(struct backend *be, int *out, const float *x, int rows, int n,
                   struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    use_device(c);
    if (sticky(c, e) || ids_reserve(c, rows, e))
        return -1;
    bool timed = timing_mark(c);
    if (fail_cuda(c, "argmax rows", cuk_argmax_rows(c->stream, c->amr_host_dev, x, rows, n,
                                                         c->amr_ws, 2 * c->n_sms)) ||
        wait_ids(c, timed, e))
        return sticky(c, e);
    memcpy(out, c->amr_host, sizeof(int) * (size_t)rows);
    return 0;
}

void smp_prep_free(struct cuda_backend *c)
{
    if (c->smp_fw.pr)
        cudaFree(c->smp_fw.pr);
    if (c->smp_fw.cand)
        cudaFree(c->smp_fw.cand);
    if (c->smp_fw.ws)
        cudaFree(c->smp_fw.ws);
    c->smp_fw = (struct cuk_sample_ws){0};
    c->smp_rows = c->smp_n = 0;
}

/* Whether the sampler's fast-path buffers hold rows rows of n, making them
 * when not. A failure to allocate (they are rows x n x 8 bytes) is no
 * error: the sampler works without them from then on, as it always can,
 * rather than try again (a synchronization and three allocations) every
 * step. */
static bool smp_prep_reserve(struct cuda_backend *c, int rows, int n)
{
    if (!c->smp_prep)
        return false;
    if (c->smp_fw.pr && rows <= c->smp_rows && n == c->smp_n)
        return true;
    if (fail_cuda(c, "synchronize before growing the sampler's buffers",
                  cudaStreamSynchronize(c->stream)))
        return false;
    smp_prep_free(c);
    int cap = rows > 16 ? rows : 16; /* rows grow with the batch: rarely past it */
    size_t row_bytes = 4 * (size_t)cap * (size_t)n, ws = cuk_sample_ws_bytes(cap);
    struct cuk_sample_ws *f = &c->smp_fw;
    if (cudaMalloc((void **)&f->pr, row_bytes) != cudaSuccess ||
        cudaMalloc((void **)&f->cand, row_bytes) != cudaSuccess ||
        cudaMalloc(&f->ws, ws) != cudaSuccess ||
        cudaMemsetAsync(f->ws, 0, ws, c->stream) != cudaSuccess) {
        cudaError_t err = cudaGetLastError(); /* not sticky: the plain path needs none of it */
        smp_prep_free(c);
        c->smp_prep = false;
        fprintf(stderr, "%s: no room for the sampler's fast path (%.1f MiB for %d rows: %s); "
                        "sampling goes on without it\n", c->name,
                (2.0 * (double)row_bytes + (double)ws) / (1 << 20), cap, cudaGetErrorString(err));
        return false;
    }
    f->blocks = 4 * c->n_sms;
    c->smp_rows = cap;
    c->smp_n = n;
    return true;
}

/* A step's sampled (and greedy) sequences: their parameters go up through
 * pinned staging, one launch picks every row's token (sample.cu), one copy
 * brings the ids back, instead of rows x n floats and a host sort. Runs
 * after step_end, outside any recorded graph, like the argmax. */
int cu_sample_rows(struct backend *be, int *out, const float *x, int rows, int n,
                   const struct sample_params *p, struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    use_device(c);
    if (sticky(c, e))
        return -1;
    if (n > CUK_SAMPLE_MAX_N)
        return err_set(e, "%s: the device sampler takes rows of at most %d tokens, not %d; "
                          "set CLLM_CUDA_SAMPLE=0 to sample on the host", c->name,
                       CUK_SAMPLE_MAX_N, n);
    if (ids_reserve(c, rows, e))
        return -1;
    if (rows > c->smp_cap) {
        struct cuk_sample_param *h = realloc(c->smp_host, sizeof *h * (size_t)rows);
        if (!h)
            return err_set(e, "out of memory");
        c->smp_host = h;
        c->smp_cap = rows;
    }
    for (int r = 0; r < rows; r++) {
        bool sampled = p[r].temperature > 0;
        c->smp_host[r] = (struct cuk_sample_param){
            .u = p[r].u, .inv_t = sampled ? 1.0f / p[r].temperature : 1.0f,
            .top_p = p[r].top_p, .min_p = p[r].min_p, .top_k = p[r].top_k, .greedy = !sampled};
    }
    size_t bytes = sizeof *c->smp_host * (size_t)rows;
    void *dp = dbuf_get(c, &c->smp, bytes, "sampling parameters");
    if (!dp || !upload_async(c, &c->up_smp, dp, c->smp_host, bytes, "copy sampling parameters"))
        return sticky(c, e);
    const bool prep = smp_prep_reserve(c, rows, n);
    bool timed = timing_mark(c);
    if (fail_cuda(c, "sample rows",
                  cuk_sample_rows(c->stream, c->amr_host_dev, x, rows, n, dp,
                                  prep ? &c->smp_fw : NULL)) ||
        wait_ids(c, timed, e))
        return sticky(c, e);
    memcpy(out, c->amr_host, sizeof(int) * (size_t)rows);
    return 0;
}

/* Reported log-probabilities: the picked ids go up through pinned staging,
 * one launch (logprobs.cu) makes every row's statistics, one copy brings
 * them back, instead of rows x n floats and a pass over each on the host. */
int cu_row_logprobs(struct backend *be, struct token_logprobs *lp, const float *x, int rows,
                    int n, const int *pick, int k, struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    use_device(c);
    if (sticky(c, e))
        return -1;
    if (rows > c->rl_cap) {
        if (c->rl_host)
            cudaFreeHost(c->rl_host);
        c->rl_host = NULL;
        c->rl_cap = 0;
        if (fail_cuda(c, "allocate log-probability statistics (host)",
                      cudaHostAlloc((void **)&c->rl_host, sizeof *c->rl_host * (size_t)rows, 0)))
            return sticky(c, e);
        c->rl_cap = rows;
    }
    size_t ids = ((size_t)rows * sizeof(int) + 15) / 16 * 16;
    size_t stats = sizeof(struct cuk_row_logprobs) * (size_t)rows;
    char *d = dbuf_get(c, &c->rl, ids + stats, "log-probability statistics");
    if (!d || !upload_async(c, &c->up_rl, d, pick, sizeof(int) * (size_t)rows,
                            "copy the picked ids"))
        return sticky(c, e);
    struct cuk_row_logprobs *dout = (struct cuk_row_logprobs *)(d + ids);
    if (fail_cuda(c, "log-probability statistics",
                  cuk_row_logprobs(c->stream, dout, x, rows, n, (const int *)d, k)) ||
        fail_cuda(c, "copy log-probability statistics",
                  cudaMemcpyAsync(c->rl_host, dout, stats, cudaMemcpyDeviceToHost, c->stream)) ||
        fail_cuda(c, "synchronize after log-probability statistics",
                  cudaStreamSynchronize(c->stream)))
        return sticky(c, e);
    for (int r = 0; r < rows; r++) {
        const struct cuk_row_logprobs *h = &c->rl_host[r];
        lp[r].logprob = h->pick;
        lp[r].n_top = h->n_top < LOGPROBS_TOP_MAX ? h->n_top : LOGPROBS_TOP_MAX;
        for (int j = 0; j < lp[r].n_top; j++) {
            lp[r].top_id[j] = h->id[j];
            lp[r].top_lp[j] = h->val[j];
        }
    }
    return 0;
}

void cu_upload(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cuda_backend *c = op_begin(be);
    use_device(c);
    if (!fail_cuda(c, "upload", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream)))
        fail_cuda(c, "synchronize after upload", cudaStreamSynchronize(c->stream));
}

/* A pool block's rows: n_layers x n_kv_heads runs of block_size rows, one
 * pool stride apart (cuk_kv_row's layout), copied as one 2D copy each for
 * K and V. */
int cu_kv_block_copy(struct backend *be, const struct kv_pool *p, int block, void *k, void *v,
                     bool to_host, struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    use_device(c);
    size_t run = (size_t)p->block_size * (size_t)p->head_dim * (size_t)p->elt_bytes;
    size_t pitch = run * (size_t)p->n_blocks, rows = (size_t)p->n_layers * (size_t)p->n_kv_heads;
    size_t at = run * (size_t)block;
    for (int i = 0; i < 2; i++) {
        char *dev = (char *)(i ? p->v : p->k) + at;
        void *host = i ? v : k;
        cudaError_t err = to_host ? cudaMemcpy2DAsync(host, run, dev, pitch, run, rows,
                                                      cudaMemcpyDeviceToHost, c->stream)
                                  : cudaMemcpy2DAsync(dev, pitch, host, run, run, rows,
                                                      cudaMemcpyHostToDevice, c->stream);
        if (fail_cuda(c, "copy a KV block", err))
            return sticky(c, e);
    }
    if (fail_cuda(c, "synchronize after a KV block copy", cudaStreamSynchronize(c->stream)))
        return sticky(c, e);
    return 0;
}

int cu_finish(struct backend *be, struct err *e)
{
    pend_settle(cb(be)); /* see c->pend */
    struct cuda_backend *c = cb(be);
    use_device(c);
    if (!c->err[0])
        fail_cuda(c, "synchronize", cudaStreamSynchronize(c->stream));
    return sticky(c, e);
}

void cu_mem_info(struct backend *be, struct backend_mem *out)
{
    struct cuda_backend *c = cb(be);
    use_device(c);
    memset(out, 0, sizeof *out);
    out->weights = c->weight_bytes;
    out->allocated = c->alloc_bytes;
    out->scratch = dbuf_bytes(c);
    cudaMemGetInfo(&out->dev_free, &out->dev_total);
    snprintf(out->device, sizeof out->device, "%s", c->name);
}
