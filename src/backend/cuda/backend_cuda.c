/* backend_cuda.c - the CUDA implementation of the op set (host side, C17).
 *
 * Weights: load_weights copies every tensor of the model to the device once
 * (plain cudaMalloc) and records it in a hash map keyed by the tensor's host
 * data pointer, so the model description stays the host's and the ops find
 * the device copy of whatever tensor (or norm/bias vector) they are given.
 * Q8_0 is repacked on the device into int8 quants + f16 scales.
 *
 * Per-call inputs that live on the host (token ids, the sequence's block
 * table, the RoPE frequency table) are copied to device buffers with
 * stream-ordered copies; the block table and frequencies only when they
 * change. All work goes to one stream; download waits for it.
 *
 * Matmul: f32 weights -> cuBLAS SGEMM (CUBLAS_COMPUTE_32F, default math: no
 * TF32), so the f32 path meets the oracle's 1e-4; f16/bf16/Q8_0 with
 * n <= CUK_GEMV_MAX tokens -> our GEMV kernels (f32 activations); larger n
 * with f16/bf16 -> activations rounded to the weight dtype and a cuBLAS
 * tensor-core GEMM with f32 accumulation ("fast", the default), or, with
 * CLLM_CUDA_PRECISE=1 and for Q8_0, weights widened to f32 in row chunks and
 * SGEMM (activations never rounded, like the CPU backend).
 *
 * Decode graphs: a decode step (one token, logits wanted) is recorded with
 * stream capture into a CUDA graph the second time a step of its shape
 * comes (the first runs eagerly and warms everything up), then replayed.
 * The graph's first node copies a pinned [pos0, token id, block table]
 * record to the device, and the position-dependent kernels (rope, kv_store,
 * attention) read pos0 from there, so one graph serves every position.
 * Graphs are keyed by (forward state, KV pool, block-table bucket: a power
 * of two >= 64 blocks); attention splits its key range by that bucket's
 * capacity in eager steps too, so replays are bit-identical to eager
 * steps. Any free or reallocation of memory a graph may reference drops
 * all graphs. CLLM_COMPILED_DECODE=0 turns them off.
 *
 * Decode fixed costs: greedy decoding takes the argmax on the device
 * (argmax op) and copies one id to pinned memory instead of the logits row;
 * the optional fused ops cut the launches of a step, with the same
 * arithmetic as the plain ops (CLLM_CUDA_FUSE=0 issues the plain kernels):
 * matmul_fused at GEMV sizes is one launch that normalizes its input
 * (q/k/v, gate/up), applies SwiGLU to it (down) and adds its result into
 * the residual (o, down); rope_kv_store does Qwen3's q/k norm, RoPE and the
 * K/V store in one; matmul_multi and add_rmsnorm serve the plain path.
 * CLLM_CUDA_TIMING=1 prints where decode steps spent their time at exit.
 *
 * Void ops cannot return errors: the first CUDA failure is kept ("sticky")
 * and reported by the next matmul, attention or finish.
 *
 * The host side is one file per concern, sharing cuda_internal.h: this
 * one (failures, work buffers, copies; create, destroy, the op table),
 * cuda_weights.c, cuda_memory.c (buffers and results), cuda_matmul.c,
 * cuda_attention.c and cuda_graphs.c. */
#include "backend/cuda/cuda_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_module.h"
#include "base/env.h"


bool fail_cuda(struct cuda_backend *c, const char *what, cudaError_t err)
{
    if (err == cudaSuccess)
        return false;
    if (!c->err[0])
        snprintf(c->err, sizeof c->err, "%s: %s: %s", c->name, what, cudaGetErrorString(err));
    return true;
}

void fail_msg(struct cuda_backend *c, const char *msg)
{
    if (!c->err[0])
        snprintf(c->err, sizeof c->err, "%s: %s", c->name, msg);
}

struct cuda_backend *op_begin(struct backend *be)
{
    struct cuda_backend *c = cb(be);
    pend_settle(c);
    c->op_seq++;
    return c;
}

int sticky(struct cuda_backend *c, struct err *e)
{
    return c->err[0] ? err_set(e, "%s", c->err) : 0;
}

size_t dbuf_bytes(const struct cuda_backend *c)
{
    return c->ids.cap + c->table.cap + c->ws.cap + c->cnt.cap + c->dn.cap + c->xh.cap + c->wf.cap +
           c->invf.cap + c->mega_buf.cap +
           c->step.cap + c->mm_in.cap + c->mm_out.cap + c->smp.cap +
           (c->blas_ws ? BLAS_WS_BYTES : 0) + c->tc_ws_bytes;
}

void graphs_flush(struct cuda_backend *c)
{
    for (int i = 0; i < c->n_graphs; i++)
        cudaGraphExecDestroy(c->cache[i].exec);
    c->n_graphs = 0;
}

void *dbuf_get(struct cuda_backend *c, struct dbuf *b, size_t bytes, const char *what)
{
    if (b->cap >= bytes && b->p)
        return b->p;
    if (c->capturing) { /* no synchronization while recording: the recording fails */
        fail_msg(c, "a work buffer had to grow while recording a graph");
        return NULL;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < bytes)
        cap *= 2;
    if (b->p) { /* queued kernels may still read it, and graphs may name it */
        cudaStreamSynchronize(c->stream);
        graphs_flush(c);
        cudaFree(b->p);
    }
    b->p = NULL;
    b->cap = 0;
    cudaError_t err = cudaMalloc(&b->p, cap);
    if (err != cudaSuccess) {
        char msg[160];
        snprintf(msg, sizeof msg, "cannot allocate %zu MiB for %s", cap >> 20, what);
        b->p = NULL;
        fail_cuda(c, msg, err);
        return NULL;
    }
    b->cap = cap;
    return b->p;
}

void dbuf_free(struct dbuf *b)
{
    if (b->p)
        cudaFree(b->p);
    b->p = NULL;
    b->cap = 0;
}

bool upload_async(struct cuda_backend *c, struct pinned *pin, void *dst, const void *src,
                  size_t bytes, const char *what)
{
    if (pin->pending) {
        cudaEventSynchronize(pin->ev);
        pin->pending = false;
    }
    if (!pin->ev && cudaEventCreateWithFlags(&pin->ev, cudaEventDisableTiming) != cudaSuccess)
        pin->ev = NULL;
    if (bytes > pin->cap || !pin->p) {
        if (pin->p)
            cudaFreeHost(pin->p);
        pin->p = NULL;
        pin->cap = 0;
        size_t cap = 4096;
        while (cap < bytes)
            cap *= 2;
        if (cudaHostAlloc(&pin->p, cap, 0) == cudaSuccess)
            pin->cap = cap;
        else
            pin->p = NULL;
    }
    if (!pin->p || !pin->ev) /* no pinned memory: the synchronous way */
        return !fail_cuda(c, what, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                                                   c->stream));
    memcpy(pin->p, src, bytes);
    if (fail_cuda(c, what, cudaMemcpyAsync(dst, pin->p, bytes, cudaMemcpyHostToDevice, c->stream)))
        return false;
    pin->pending = cudaEventRecord(pin->ev, c->stream) == cudaSuccess;
    if (!pin->pending)
        cudaStreamSynchronize(c->stream); /* the copy must be done before p is reused */
    return true;
}

static void pinned_free(struct pinned *pin)
{
    if (pin->pending)
        cudaEventSynchronize(pin->ev);
    if (pin->p)
        cudaFreeHost(pin->p);
    if (pin->ev)
        cudaEventDestroy(pin->ev);
    memset(pin, 0, sizeof *pin);
}

static int cu_kv_dtype(struct backend *be)
{
    return cb(be)->kv_bf16 ? DT_BF16 : DT_F32;
}

/* Destroys the events of ev[0..n) that exist. */
static void events_destroy(cudaEvent_t *ev, int n)
{
    for (int i = 0; i < n; i++) {
        if (ev[i])
            cudaEventDestroy(ev[i]);
        ev[i] = NULL;
    }
}

static void cu_destroy(struct backend *be)
{
    struct cuda_backend *c = cb(be);
    use_device(c);
    cudaStreamSynchronize(c->stream);
    mega_report(c);
#ifdef CUK_DEC_PROBE
    cuk_dec_probe_report(64);
#endif
#ifdef CUK_GEMV_PROBE
    cuk_gemv_probe_report(300);
    cuk_gq_probe_report(300);
#endif
    if (c->timing) {
        static const char *what[] = {"decode", "batched decode", "prefill"};
        for (int b = 0; b < 3; b++) {
            long k = c->t_steps[b] > 0 ? c->t_steps[b] : 1;
            if (!c->t_steps[b])
                continue;
            fprintf(stderr, "%s: timing of %ld %s steps, per step: %.1f us on the GPU before "
                            "the result, %.1f us result (the logits' copy, or the ids' "
                            "kernel), %.1f us host wall (step_begin to after the result), "
                            "%.1f us host issuing the ops%s",
                    c->name, c->t_steps[b], what[b], 1e3 * c->t_gpu[b] / k,
                    1e3 * c->t_copy[b] / k, 1e3 * c->t_wall[b] / k, 1e3 * c->t_enq[b] / k,
                    b == 2 ? "\n" : "");
            if (b < 2)
                fprintf(stderr, ", %.1f us host between steps (sampling, loop)\n",
                        1e3 * c->t_gap[b] / (c->t_gaps[b] > 0 ? c->t_gaps[b] : 1));
        }
        fprintf(stderr, "%s: decode graphs recorded / replayed: %ld / %ld single, %ld / %ld "
                        "batched\n", c->name, c->g_rec[0], c->g_rep[0], c->g_rec[1], c->g_rep[1]);
        fprintf(stderr, "%s: decode attention launches issued, key splits merged: %ld in a "
                        "cluster, %ld by the o projection, %ld through global memory\n",
                c->name, c->att_merges[0], c->att_merges[1], c->att_merges[2]);
        if (c->steps_ahead) /* their steps are not in the timing above */
            fprintf(stderr, "%s: %ld greedy decode steps issued one step ahead of the host\n",
                    c->name, c->steps_ahead);
        for (int i = 0; i < 3; i++)
            cudaEventDestroy(c->ev[i]);
    }
    for (size_t i = 0; i < c->map_cap; i++) {
        if (c->map[i].mem)
            cudaFree(c->map[i].mem);
        if (c->map[i].mem2)
            cudaFree(c->map[i].mem2);
        if (c->map[i].wide.data)
            cudaFree((void *)c->map[i].wide.data);
    }
    free(c->map);
    cu_head_free(c);
    graphs_flush(c);
    if (c->h_step)
        cudaFreeHost(c->h_step);
    if (c->blas_ws)
        cudaFree(c->blas_ws);
    if (c->tc_ws)
        cudaFree(c->tc_ws);
    if (c->am_ws)
        cudaFree(c->am_ws);
    if (c->am_host)
        cudaFreeHost(c->am_host);
    events_destroy(c->am_ev, 2);
    events_destroy(c->rec_ev, 2);
    smp_prep_free(c);
    if (c->amr_ws)
        cudaFree(c->amr_ws);
    if (c->amr_host)
        cudaFreeHost(c->amr_host);
    /* Buffers callers did not free (they should have) go with the backend. */
    for (size_t i = 0; i < c->n_allocs; i++)
        cudaFree(c->allocs[i].p);
    free(c->allocs);
    struct dbuf *bufs[] = {&c->ids, &c->table, &c->ws, &c->cnt, &c->dn, &c->xh, &c->wf, &c->invf,
                           &c->step, &c->bat, &c->mm_in, &c->mm_out, &c->smp, &c->rl,
                           &c->mega_buf};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        dbuf_free(bufs[i]);
    free(c->tab_host);
    free(c->bat_host);
    free(c->bat_tmp);
    pinned_free(&c->up_ids);
    pinned_free(&c->up_tab);
    pinned_free(&c->up_bat);
    pinned_free(&c->up_smp);
    pinned_free(&c->up_rl);
    if (c->rl_host)
        cudaFreeHost(c->rl_host);
    free(c->smp_host);
    free(c->invf_host);
    if (c->lt_plans)
        for (int i = 0; i < LT_PLANS; i++)
            lt_plan_clear(&c->lt_plans[i]);
    free(c->lt_plans);
    if (c->lt)
        cublasLtDestroy(c->lt);
    cublasDestroy(c->blas);
    cudaStreamDestroy(c->stream);
    free(c);
}

/* Device-to-device copies of up to 1 GiB on the backend's stream, timed
 * with events, best of 5 after one untimed copy; each copy reads and writes
 * its size, so 2 x size bytes are counted. A failure here is reported
 * through e and leaves the backend usable (no sticky error). */
static double cu_mem_bandwidth(struct backend *be, struct err *e)
{
    struct cuda_backend *c = cb(be);
    use_device(c);
    size_t dev_free = 0, dev_total = 0, bytes = (size_t)1 << 30;
    cudaMemGetInfo(&dev_free, &dev_total);
    if (bytes > dev_free / 4)
        bytes = dev_free / 4 / (1 << 20) * (1 << 20);
    if (bytes < ((size_t)64 << 20)) {
        err_set(e, "%s: too little free device memory to measure bandwidth (%zu MiB free)",
                c->name, dev_free >> 20);
        return -1;
    }
    void *src = NULL, *dst = NULL;
    cudaEvent_t ev0 = NULL, ev1 = NULL;
    double best = -1;
    float ms = 0;
    cudaError_t err;
    if ((err = cudaMalloc(&src, bytes)) != cudaSuccess ||
        (err = cudaMalloc(&dst, bytes)) != cudaSuccess ||
        (err = cudaMemsetAsync(src, 1, bytes, c->stream)) != cudaSuccess ||
        (err = cudaEventCreate(&ev0)) != cudaSuccess ||
        (err = cudaEventCreate(&ev1)) != cudaSuccess ||
        (err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream)) != cudaSuccess)
        goto out;
    for (int rep = 0; rep < 5; rep++) {
        if ((err = cudaEventRecord(ev0, c->stream)) != cudaSuccess ||
            (err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream)) !=
                cudaSuccess ||
            (err = cudaEventRecord(ev1, c->stream)) != cudaSuccess ||
            (err = cudaEventSynchronize(ev1)) != cudaSuccess ||
            (err = cudaEventElapsedTime(&ms, ev0, ev1)) != cudaSuccess)
            goto out;
        double bw = ms > 0 ? 2.0 * (double)bytes / (ms * 1e-3) : 0;
        best = bw > best ? bw : best;
    }
out:
    if (err != cudaSuccess) {
        err_set(e, "%s: bandwidth measurement: %s", c->name, cudaGetErrorString(err));
        cudaGetLastError(); /* not sticky: the backend stays usable */
        best = -1;
    } else if (best <= 0) {
        err_set(e, "%s: bandwidth measurement took no measurable time", c->name);
        best = -1;
    }
    cudaStreamSynchronize(c->stream);
    if (ev0)
        cudaEventDestroy(ev0);
    if (ev1)
        cudaEventDestroy(ev1);
    cudaFree(src);
    cudaFree(dst);
    return best;
}

/* Before the first step (backend.h): no graph recorded yet to drop. */
static void cu_set_compiled_decode(struct backend *be, bool on) { cb(be)->graphs = on; }

static const struct backend_ops cuda_ops = {
    .name = "cuda",
    .kv_layout = 1,
    .destroy = cu_destroy,
    .alloc = cu_alloc,
    .free = cu_free,
    .download = cu_download,
    .argmax = cu_argmax,
    .embed = cu_embed,
    .matmul = cu_matmul,
    .rmsnorm = cu_rmsnorm,
    .add_bias = cu_add_bias,
    .rope = cu_rope,
    .kv_store = cu_kv_store,
    .attention = cu_attention,
    .silu_mul = cu_silu_mul,
    .add = cu_add,
    .matmul_multi = cu_matmul_multi,
    .add_rmsnorm = cu_add_rmsnorm,
    .rope_kv_store = cu_rope_kv_store,
    .rope_kv_attention = cu_rope_kv_attention,
    .rope_kv_attention_batch = cu_rope_kv_attention_batch,
    .decode_layers = cu_decode_layers,
    .matmul_fused = cu_matmul_fused,
    .load_weights = cu_load_weights,
    .load_spare = cu_load_spare,
    .finish = cu_finish,
    .upload = cu_upload,
    .kv_block_copy = cu_kv_block_copy,
    .step_begin = cu_step_begin,
    .step_end = cu_step_end,
    .step_stats = cu_step_stats,
    .attention_stats = cu_attention_stats,
    .mem_info = cu_mem_info,
    .kv_dtype = cu_kv_dtype,
    .mem_bandwidth = cu_mem_bandwidth,
    .argmax_rows = cu_argmax_rows,
    .sample_rows = cu_sample_rows,
    .row_logprobs = cu_row_logprobs,
    .argmax_async = cu_argmax_async,
    .argmax_take = cu_argmax_take,
    .head_pick = cu_head_pick,
    .set_compiled_decode = cu_set_compiled_decode,
};

/* Creates n events without timing; false (none left) when one fails. */
static bool events_create(cudaEvent_t *ev, int n)
{
    for (int i = 0; i < n; i++)
        if (cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming) != cudaSuccess) {
            ev[i] = NULL;
            events_destroy(ev, i);
            return false;
        }
    return true;
}

/* The driver's device count; 0 with "no CUDA device found (why)" and the
 * hint after it in e. */
static int device_count(struct err *e, const char *hint)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        err_set(e, "no CUDA device found (%s)%s",
                err != cudaSuccess ? cudaGetErrorString(err) : "the driver reports none", hint);
        cudaGetLastError();
        return 0;
    }
    return n;
}

static int cuda_device_count(struct err *e)
{
    return device_count(e, "");
}

/* The numeric levers (docs/config.md), read before anything is allocated
 * so that a bad value is the same error with or without a GPU. 0 means
 * unset (gemv_max, gq_staged: -1, since 0 is a value). */
struct cuda_levers {
    long gemv_max, stage_x_max, att_rpw, dec_bps, mma_bps, mma_ks, mma_max_mb, mma_max_x,
        mma_warps, tc_ctas, tc_smem, stage_cols, stage_kb, stage_prewait, pf_mt,
        dec_cluster_tiles, widen_mb, gq_blocks, gq_staged, gq_staged_kb, gq_staged_steps,
        gq_staged_max_n, gq_prewait, wide_copy,
        wide_from, wide_small_from, qmma_from, qmma_warps, qmma_window, qmma_cluster;
};

static int cuda_levers_read(struct cuda_levers *l, struct err *e)
{
    static const long rpw[] = {4, 8}, ks[] = {1, 2, 4, 8, 16}, warps[] = {8, 16},
                      clusters[] = {1, 2, 4};
    *l = (struct cuda_levers){.gemv_max = -1, .gq_staged = -1, .wide_copy = -1, .qmma_window = -1};
    if (env_long("CLLM_CUDA_GEMV_MAX", 0, CUK_GEMV_MAX, &l->gemv_max, e) < 0 ||
        env_long("CLLM_CUDA_STAGE_X_MAX", 1, 1L << 30, &l->stage_x_max, e) < 0 ||
        env_long_of("CLLM_ATT_RPW", rpw, 2, &l->att_rpw, e) < 0 ||
        env_long("CLLM_CUDA_DEC_BPS", 1, 8, &l->dec_bps, e) < 0 ||
        env_long("CLLM_CUDA_MMA_BPS", 1, 2, &l->mma_bps, e) < 0 ||
        env_long_of("CLLM_CUDA_MMA_KS", ks, 5, &l->mma_ks, e) < 0 ||
        env_long("CLLM_CUDA_MMA_MAX_MB", 1, 1L << 20, &l->mma_max_mb, e) < 0 ||
        env_long("CLLM_CUDA_MMA_MAX_X", 1, 1L << 30, &l->mma_max_x, e) < 0 ||
        env_long_of("CLLM_CUDA_MMA_WARPS", warps, 2, &l->mma_warps, e) < 0 ||
        env_long_of("CLLM_CUDA_QMMA_WARPS", warps, 2, &l->qmma_warps, e) < 0 ||
        env_long("CLLM_CUDA_TC_CTAS", 1, 2, &l->tc_ctas, e) < 0 ||
        env_long("CLLM_CUDA_TC_SMEM", 1, 227 * 1024, &l->tc_smem, e) < 0 ||
        env_long("CLLM_CUDA_STAGE_COLS", 256, 1L << 16, &l->stage_cols, e) < 0 ||
        env_long("CLLM_CUDA_STAGE_KB", 16, 227, &l->stage_kb, e) < 0 ||
        env_long("CLLM_CUDA_STAGE_PREWAIT", 1, 32, &l->stage_prewait, e) < 0 ||
        env_long("CLLM_CUDA_PF_MT", 1, 2, &l->pf_mt, e) < 0 ||
        env_long("CLLM_CUDA_DEC_CLUSTER_TILES", 1, 64, &l->dec_cluster_tiles, e) < 0 ||
        env_long("CLLM_CUDA_WIDEN_MB", 1, 4096, &l->widen_mb, e) < 0 ||
        env_long("CLLM_CUDA_GQ_BLOCKS", 1, 1L << 20, &l->gq_blocks, e) < 0 ||
        env_long("CLLM_CUDA_GQ_STAGED", 0, 4, &l->gq_staged, e) < 0 ||
        env_long("CLLM_CUDA_GQ_STAGED_KB", 16, 227, &l->gq_staged_kb, e) < 0 ||
        env_long("CLLM_CUDA_GQ_STAGED_STEPS", 1, 64, &l->gq_staged_steps, e) < 0 ||
        env_long("CLLM_CUDA_GQ_STAGED_MAX_N", 1, 8, &l->gq_staged_max_n, e) < 0 ||
        env_long("CLLM_CUDA_GQ_PREWAIT", 1, 16, &l->gq_prewait, e) < 0 ||
        env_long("CLLM_CUDA_WIDE_COPY", 0, 1, &l->wide_copy, e) < 0 ||
        env_long("CLLM_CUDA_WIDE_FROM", 1, 1L << 20, &l->wide_from, e) < 0 ||
        env_long("CLLM_CUDA_WIDE_FROM_SMALL", 1, 1L << 20, &l->wide_small_from, e) < 0 ||
        env_long("CLLM_CUDA_QMMA_FROM", 1, CUK_MMA_MAX_N, &l->qmma_from, e) < 0 ||
        env_long("CLLM_CUDA_QMMA_WINDOW", 0, 1L << 20, &l->qmma_window, e) < 0 ||
        env_long_of("CLLM_CUDA_QMMA_CLUSTER", clusters, 3, &l->qmma_cluster, e) < 0)
        return -1;
    if (l->qmma_window > 0 && l->qmma_window % 256)
        return err_set(e, "CLLM_CUDA_QMMA_WINDOW=\"%ld\": needs a multiple of 256", l->qmma_window);
    if (l->stage_cols % 256)
        return err_set(e, "CLLM_CUDA_STAGE_COLS=\"%ld\": needs a multiple of 256", l->stage_cols);
    return 0;
}

static struct backend *cuda_create(int device, struct err *e)
{
    int kv_dt = backend_kv_dtype_env(DT_BF16, e);
    if (kv_dt < 0)
        return NULL;
    struct cuda_levers lv;
    if (cuda_levers_read(&lv, e))
        return NULL;
    int count = device_count(e, "; use --device cpu");
    if (!count)
        return NULL;
    if (device < 0 || device >= count) {
        err_set(e, "cuda:%d: there %s only %d CUDA device%s (cuda:0..cuda:%d)", device,
                count == 1 ? "is" : "are", count, count == 1 ? "" : "s", count - 1);
        return NULL;
    }
    struct cuda_backend *c = calloc(1, sizeof *c);
    if (!c) {
        err_set(e, "out of memory");
        return NULL;
    }
    c->device = device;
    struct cudaDeviceProp prop;
    cudaError_t err;
    if ((err = cudaSetDevice(device)) != cudaSuccess ||
        (err = cudaGetDeviceProperties(&prop, device)) != cudaSuccess ||
        (err = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        err_set(e, "cuda:%d: %s", device, cudaGetErrorString(err));
        free(c);
        return NULL;
    }
#ifdef CUK_DEC_PROBE
    cuk_dec_probe_init();
#endif
#ifdef CUK_GEMV_PROBE
    cuk_gemv_probe_init();
    cuk_gq_probe_init();
#endif
    /* Below the lowest architecture the kernels were built for there is no
     * code the GPU can run: say so now, not as a CUDA error at the first
     * kernel of the first request. */
    if (prop.major * 10 + prop.minor < CLLM_CUDA_ARCH_MIN) {
        err_set(e, "cuda:%d: %s is compute capability %d.%d; this build's CUDA kernels need "
                   "%d.%d or newer (they are written and tuned for Hopper): use --device cpu, or "
                   "rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d%d (not tested)",
                device, prop.name, prop.major, prop.minor, CLLM_CUDA_ARCH_MIN / 10,
                CLLM_CUDA_ARCH_MIN % 10, prop.major, prop.minor);
        cudaStreamDestroy(c->stream);
        free(c);
        return NULL;
    }
    /* The kernels' Hopper paths exist only in sm_90+ code: a build for
     * older GPUs alone runs its compute_8x PTX on a Hopper GPU, where the
     * staged GEMV's body and the kernels' PDL waits were compiled out. */
    const bool hopper = prop.major >= 9 && (CLLM_CUDA_ARCH_MAX == 0 || CLLM_CUDA_ARCH_MAX >= 90);
    c->n_sms = prop.multiProcessorCount;
    snprintf(c->name, sizeof c->name, "cuda:%d (%s, %.0f GiB, %d SMs)", device, prop.name,
             prop.totalGlobalMem / 1073741824.0, c->n_sms);
    cublasStatus_t st = cublasCreate(&c->blas);
    if (st != CUBLAS_STATUS_SUCCESS || cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
        err_set(e, "cuda:%d: cuBLAS: %s", device, cublasGetStatusString(st));
        if (st == CUBLAS_STATUS_SUCCESS)
            cublasDestroy(c->blas);
        cudaStreamDestroy(c->stream);
        free(c);
        return NULL;
    }
    /* cuBLAS gets its workspace up front so it never allocates while a
     * graph is being recorded. */
    if (cudaMalloc(&c->blas_ws, BLAS_WS_BYTES) != cudaSuccess ||
        cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WS_BYTES) != CUBLAS_STATUS_SUCCESS) {
        err_set(e, "cuda:%d: cannot set up the cuBLAS workspace", device);
        if (c->blas_ws)
            cudaFree(c->blas_ws);
        cublasDestroy(c->blas);
        cudaStreamDestroy(c->stream);
        free(c);
        return NULL;
    }
    /* The argmax's workspace and pinned result, zeroed once. */
    if (cudaMalloc(&c->am_ws, CUK_ARGMAX_WS_BYTES) != cudaSuccess ||
        cudaMemsetAsync(c->am_ws, 0, CUK_ARGMAX_WS_BYTES, c->stream) != cudaSuccess ||
        cudaHostAlloc((void **)&c->am_host, 3 * sizeof(int), cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer((void **)&c->am_host_dev, c->am_host, 0) != cudaSuccess ||
        !events_create(c->am_ev, 2) || !events_create(c->rec_ev, 2)) {
        err_set(e, "cuda:%d: cannot allocate the argmax buffers", device);
        events_destroy(c->am_ev, 2);
        events_destroy(c->rec_ev, 2);
        if (c->am_host)
            cudaFreeHost(c->am_host);
        if (c->am_ws)
            cudaFree(c->am_ws);
        cudaFree(c->blas_ws);
        cublasDestroy(c->blas);
        cudaStreamDestroy(c->stream);
        free(c);
        return NULL;
    }
    c->precise = env_flag("CLLM_CUDA_PRECISE", false);
    /* Rows up to which matmuls use the GEMV kernels (f32 activations) rather
     * than a tensor-core GEMM (activations rounded to bf16/f16). */
    /* 0 (measurement): none, even for one token */
    c->gemv_max_env = lv.gemv_max >= 0;
    c->gemv_max = c->gemv_max_env ? (int)lv.gemv_max : CUK_GEMV_DEFAULT; /* see cu_load_weights */
    /* measurement and tests: another bound on the x tiles (gemv_rows) */
    c->stage_x_max = lv.stage_x_max ? (size_t)lv.stage_x_max : STAGED_X_BYTES;
    c->widen_bytes = lv.widen_mb ? (size_t)lv.widen_mb << 20 : WIDEN_CHUNK_BYTES;
    /* precise mode widens to f32 instead */
    c->wide_copy = c->precise ? 0 : (int)lv.wide_copy;
    c->wide_from = lv.wide_from ? (int)lv.wide_from : WIDE_FROM_N;
    c->wide_small_from = lv.wide_small_from ? (int)lv.wide_small_from : WIDE_SMALL_FROM_N;
    c->qmma = env_flag("CLLM_CUDA_QMMA", true);
    c->qmma_from = (int)lv.qmma_from;
    c->qmma_window = (int)lv.qmma_window;
    c->half_type = c->quant_type = -1;
    c->att_rpw = (int)lv.att_rpw; /* measurement: the tiled attention's rows per warp */
    c->att_mma = env_flag("CLLM_CUDA_ATT_MMA", true);
    c->att_pf_mt = (int)lv.pf_mt; /* tests: the prefill attention's block rows */
    /* measurement: decode attention blocks per SM */
    c->dec_blocks = c->n_sms * (lv.dec_bps ? (int)lv.dec_bps : CUK_DEC_BLOCKS_PER_SM);
    cuk_set_pdl(hopper && env_flag("CLLM_CUDA_PDL", true));
    c->kv_bf16 = !c->precise && kv_dt == DT_BF16;
    c->graphs = env_flag("CLLM_COMPILED_DECODE", true);
    c->bgraphs = env_flag("CLLM_COMPILED_BATCH", true);
    c->rgraphs = true;
    c->fuse = env_flag("CLLM_CUDA_FUSE", true);
    c->split_dtypes = env_flag("CLLM_CUDA_SPLIT_DTYPES", true); /* measurement */
    c->rope_att = env_flag("CLLM_CUDA_ROPE_ATT", true);
    c->mega = hopper && env_flag("CLLM_CUDA_MEGA", false);
    c->mega_probe = env_flag("CLLM_CUDA_MEGA_PROBE", false);
    c->mega_ok = -1;
    c->dec_cluster = hopper && env_flag("CLLM_CUDA_DEC_CLUSTER", true);
    /* four: a 4,096-key bucket (contexts of 2K-4K) in 16 splits; H200,
     * 2,600 tokens: 8B +4.9 %, 0.6B +9.4 %; at 512 no change
     * (docs/benchmarks.md, twenty-ninth pass) */
    c->dec_cluster_tiles = lv.dec_cluster_tiles ? (int)lv.dec_cluster_tiles : 4;
    c->swiglu_out = env_flag("CLLM_CUDA_SWIGLU_OUT", true);
    if (env_flag("CLLM_CUDA_LT", true) && (c->lt_plans = calloc(LT_PLANS, sizeof *c->lt_plans)) &&
        cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS)
        c->lt = NULL; /* cublasGemmEx for every GEMM */
    c->gemm_pair = env_flag("CLLM_CUDA_GEMM_PAIR", true);
    c->gemv_staged = hopper && env_flag("CLLM_CUDA_GEMV_STAGED", true);
    c->stage_big = env_flag("CLLM_CUDA_STAGE_BIG", true);
    c->smp_prep = env_flag("CLLM_CUDA_SAMPLE_PREP", true);
    /* mma.sync on bf16/f16: compute capability 8.0 and newer, in code
     * built for it (its body is compiled out below sm_80, like hopper's) */
    c->gemv_mma = prop.major >= 8 && (CLLM_CUDA_ARCH_MAX == 0 || CLLM_CUDA_ARCH_MAX >= 80) &&
                  env_flag("CLLM_CUDA_GEMV_MMA", true);
    cuk_gemv_quant_init(&c->gq, c->n_sms, env_flag("CLLM_CUDA_GQ_PERSIST", true),
                        (int)lv.gq_blocks);
    /* the quantized GEMV's weights staged in shared memory, gq_staged
     * blocks an SM sharing its memory (less 1 KB a block, which the
     * runtime keeps). 2 by default: H100, 8B decode Q4_K 330 -> 403
     * tok/s, Q8_0 240 -> 291, Q6_K 231 -> 293; 1, 3 and 4 were slower
     * there (docs/benchmarks.md, session 56) */
    if (lv.gq_staged < 0)
        lv.gq_staged = 2;
    if (hopper && lv.gq_staged > 0) {
        c->gq.staged_bps = (int)lv.gq_staged;
        c->gq.staged_smem = lv.gq_staged_kb
                                ? (int)lv.gq_staged_kb * 1024
                                : (int)prop.sharedMemPerMultiprocessor / (int)lv.gq_staged - 1024;
        if (c->gq.staged_smem > (int)prop.sharedMemPerBlockOptin)
            c->gq.staged_smem = (int)prop.sharedMemPerBlockOptin;
        c->gq.staged_steps = (int)lv.gq_staged_steps;
        c->gq.staged_max_n = lv.gq_staged_max_n ? (int)lv.gq_staged_max_n : GQ_STAGED_MAX_N;
        c->gq.staged_strict = env_flag("CLLM_CUDA_GQ_STAGED_STRICT", false);
        c->gq.staged_res_late = !env_flag("CLLM_CUDA_GQ_RES_EARLY", true); /* measurement */
        c->gq.staged_norm_apart = !env_flag("CLLM_CUDA_GQ_NORM_STAGE", true); /* measurement */
        c->gq.staged_prewait = (int)lv.gq_prewait; /* measurement */
        c->gq.staged_late_launch = env_flag("CLLM_CUDA_GQ_LATE", false); /* measurement */
    }
    c->mma.n_sms = c->n_sms;
    c->mma.smem_max = (int)prop.sharedMemPerBlockOptin;
    c->mma.smem_sm = (int)prop.sharedMemPerMultiprocessor;
    /* measurement: its blocks per SM, slices per tile, warps (0: automatic) */
    c->mma.blocks_per_sm = (int)lv.mma_bps;
    c->mma.ks = (int)lv.mma_ks;
    c->mma.warps = (int)lv.mma_warps;
    c->mma.qmma_warps = (int)lv.qmma_warps;
    c->mma_max_bytes = (lv.mma_max_mb ? (size_t)lv.mma_max_mb : MMA_MAX_MB) << 20;
    c->mma_max_x = lv.mma_max_x ? (size_t)lv.mma_max_x : MMA_MAX_X;
    c->mma.stage_regs = env_flag("CLLM_CUDA_MMA_STAGE_REGS", false); /* measurement */
    c->mma.qmma_stage_rows = env_flag("CLLM_CUDA_QMMA_STAGE_ROWS", false); /* measurement */
    c->mma.qmma_cluster = (int)lv.qmma_cluster;
    c->defer_merge = !env_flag("CLLM_CUDA_DEFER_MERGE", true)   ? 0
                     : env_flag("CLLM_CUDA_DEFER_MERGE", false) ? 1
                                                                : -1;
    /* The tensor-core GEMM's partial sums and counters (zeroed once), when
     * asked for; a failed allocation leaves those GEMMs to cuBLAS. */
    if (hopper && env_flag("CLLM_CUDA_GEMM_TC", false)) { /* opt-in */
        c->tc_blocks = c->n_sms * (lv.tc_ctas ? (int)lv.tc_ctas : 1);
        c->tc_cfg.smem_bytes = (int)lv.tc_smem;
        size_t b = cuk_gemm_tc_ws_bytes(c->tc_blocks);
        if (cudaMalloc(&c->tc_ws, b) == cudaSuccess &&
            cudaMemsetAsync(c->tc_ws, 0, b, c->stream) == cudaSuccess) {
            c->tc_ws_bytes = b;
        } else {
            if (c->tc_ws)
                cudaFree(c->tc_ws);
            c->tc_ws = NULL;
            cudaGetLastError(); /* not sticky: cuBLAS takes these GEMMs */
        }
    }
    c->stage.blocks = c->n_sms;
    /* measurement: the staged GEMV's columns per copy and shared memory */
    c->stage.chunk_cols = (int)lv.stage_cols;
    c->stage.smem_bytes = (int)lv.stage_kb * 1024;
    /* one token's launches (cuk_stage_cfg): the launcher's order unless
     * set; CLLM_CUDA_STAGE_PREWAIT_FIT=0 gives every launch two slots */
    c->stage.prewait = lv.stage_prewait                                  ? (int)lv.stage_prewait
                       : !env_flag("CLLM_CUDA_STAGE_PREWAIT_FIT", true) ? CUK_STAGE_PREWAIT
                                                                        : 0;
    c->stage.early_launch = !env_flag("CLLM_CUDA_STAGE_LATE", true);
    c->timing = env_flag("CLLM_CUDA_TIMING", false);
    for (int i = 0; i < 3 && c->timing; i++)
        if (cudaEventCreate(&c->ev[i]) != cudaSuccess)
            c->timing = false;
    c->ops = cuda_ops;
    if (!env_flag("CLLM_CUDA_SAMPLE", true)) /* sampled rows go to the host's sampler */
        c->ops.sample_rows = NULL;
    if (!env_flag("CLLM_CUDA_AHEAD", true)) { /* greedy decoding waits for every id */
        c->ops.argmax_async = NULL;
        c->ops.argmax_take = NULL;
    }
    /* a greedy step's head screened by an int8 copy (docs/benchmarks.md,
     * "An exact greedy pick from half the head's bytes"); =0 turns it off */
    if (!env_flag("CLLM_CUDA_HEAD_SCREEN", true))
        c->ops.head_pick = NULL;
    c->be.ops = &c->ops;
    c->be.impl = c;
    return &c->be;
}

/* The module's only exported symbol (see cuda_module.h). */
__attribute__((visibility("default"))) const struct cllm_cuda_module *cllm_cuda_module(void)
{
    static const struct cllm_cuda_module m = {
        .abi = CLLM_CUDA_MODULE_ABI,
        .err_size = sizeof(struct err),
        .ops_size = sizeof(struct backend_ops),
        .device_count = cuda_device_count,
        .create = cuda_create,
    };
    return &m;
}
