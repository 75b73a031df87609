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
 * and reported by the next matmul, attention or finish. */
#include "backend/backend.h"
#include "base/env.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_module.h"
#include "model/model.h"

#ifndef CLLM_CUDA_ARCH_MIN
#define CLLM_CUDA_ARCH_MIN 90 /* CMake passes the lowest of CMAKE_CUDA_ARCHITECTURES */
#endif
#ifndef CLLM_CUDA_ARCH_MAX
#define CLLM_CUDA_ARCH_MAX 90 /* and the highest (0: "native" or "all", no number) */
#endif

/* Bytes of f32 weights one chunk of the widening path may take. */
#define WIDEN_CHUNK_BYTES ((size_t)256 << 20)
#define MAX_GRAPHS 32
#define SEEN_KEYS 16 /* batched decode shapes remembered from one eager step */
#define MAX_SPLITS 64 /* cuk_attention_splits never exceeds it */
#define BLAS_WS_BYTES ((size_t)32 << 20)
/* The most shared memory the x tiles of a GEMV of more than
 * CUK_GEMV_DEFAULT tokens may take (gemv_rows): measured on the H200, an
 * 8B model's 4,096-column matrices staged and its down projection on
 * cuBLAS, 3 streams 516 -> 543-563 tok/s (48 KB of x tiles), 4 streams
 * 733 -> 654-658 (64 KB of x tiles: more x read from shared memory per
 * weight byte than the SM reads a clock; a ring as deep as one token's
 * beside them did no better), so 4 tokens of 4,096 columns stay with
 * cuBLAS; a 0.6B model's widest, 4 x 3,072 columns, is staged. */
#define STAGED_X_BYTES ((size_t)48 << 10)
/* Most weight megabytes of a tensor-core GEMV launch, and most elements
 * of the x it stages (n x cols): see mma_takes. */
#define MMA_MAX_MB 64
#define MMA_MAX_X 32768
/* GEMMs of up to LT_MAX_N rows of x on 2-byte weights (a batched decode
 * step's) go through cuBLASLt with their descriptors and algorithm chosen
 * once per shape (lt_plan), LT_PLANS shapes kept. */
#define LT_MAX_N 64
#define LT_PLANS 64

struct step_graph {
    const void *owner, *kpool; /* forward state and KV pool it was recorded for */
    int bucket;                /* block-table entries its record carries (per sequence) */
    int n_seg;                 /* 1: a single decode; > 1: a batched decode of n_seg sequences */
    struct attn_args att;      /* batched: the attention geometry its metadata is built for */
    cudaGraphExec_t exec;
};

struct wentry {
    const void *host;      /* key: the tensor's host data pointer */
    struct cuk_weight w;   /* device copy */
    void *mem, *mem2;      /* allocations (quants and scales for Q8_0) */
};

struct dbuf { /* a growable device buffer */
    void *p;
    size_t cap;
};

/* Pinned staging for host-to-device copies of per-step inputs: a copy
 * from pageable memory makes the host wait for the stream, which would
 * serialize issuing a step's ops with running the previous ones. */
struct pinned {
    void *p;
    size_t cap;
    cudaEvent_t ev;  /* recorded after the last copy out of p */
    bool pending;
};

struct alloc_rec {
    void *p;
    size_t bytes;
};

/* One GEMM shape's cuBLASLt setup (see gemm). */
struct lt_plan {
    int rows, n, cols, ldc, type, align; /* the key; rows == 0: an empty slot */
    int batch; /* 1, or 2: a pair of same-shape matrices over one x (gemm_pair) */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    bool usable; /* set up, and the heuristic found an algorithm */
};

struct cuda_backend {
    struct backend be;
    struct backend_ops ops; /* cuda_ops, less what the environment turns off */
    int device, n_sms;
    char name[128];
    cudaStream_t stream;
    cublasHandle_t blas;
    bool precise;
    bool fuse;         /* fused launches (CLLM_CUDA_FUSE != 0) */
    bool rope_att;     /* the decode attention kernel does RoPE + K/V store
                        * (CLLM_CUDA_ROPE_ATT != 0; with fuse) */
    bool swiglu_out;   /* the gate/up GEMV writes SwiGLU's output
                        * (CLLM_CUDA_SWIGLU_OUT != 0; with fuse) */
    bool gemm_pair;    /* k/v and gate/up GEMMs as one batched cuBLASLt call
                        * (CLLM_CUDA_GEMM_PAIR != 0) */
    bool gemv_staged;  /* few-row bf16/f16 GEMVs stage their weights in shared
                        * memory (cuk_gemv_staged; Hopper and newer,
                        * CLLM_CUDA_GEMV_STAGED != 0) */
    struct cuk_stage_cfg stage; /* its launch shape */
    bool gemv_mma;     /* batched steps past the GEMVs' rows go to the
                        * tensor-core GEMV (cuk_gemv_mma) where it takes the
                        * shape, not cuBLAS (CLLM_CUDA_GEMV_MMA != 0) */
    struct cuk_mma_cfg mma; /* the device as cuk_gemv_mma needs it */
    size_t mma_max_bytes; /* weights of its largest launch (CLLM_CUDA_MMA_MAX_MB) */
    size_t mma_max_x;  /* most n x cols of x it takes (CLLM_CUDA_MMA_MAX_X) */
    int defer_merge;   /* a decode step's key-split merge is left to the o
                        * projection's staged GEMV when the model says that
                        * comes next (attn_args.o_next): 0 never, 1 always,
                        * -1 (default) when it pays (defer_pays);
                        * CLLM_CUDA_DEFER_MERGE=0/1 */
    /* A merge left undone (pend.out != NULL): the o projection's GEMV
     * does it (cu_matmul_fused), any other op first settles it. */
    struct {
        float *out;
        const float *ws;
        int splits, n_heads, n_kv_heads, head_dim;
    } pend;
    bool kv_bf16;      /* K/V cache in bf16 (the default; f32 when precise or
                        * CLLM_KV_DTYPE=f32) */

    struct wentry *map; /* open addressing, capacity map_cap (power of 2) */
    size_t map_cap, map_n;
    size_t weight_bytes;

    struct alloc_rec *allocs;
    size_t n_allocs, cap_allocs, alloc_bytes;

    struct dbuf ids, table, ws, xh, wf, invf;
    struct dbuf mm_in, mm_out; /* matmul_fused's temporaries when it issues the plain ops */
    struct dbuf cnt;   /* attention split counters, kept zero between calls */
    struct dbuf dn;    /* int: splits with keys of a deferred merge */
    /* xh holds xh_src (xh_n elements) rounded to xh_type, valid while
     * op_seq == xh_valid_at: every op bumps op_seq, so a copy made by an op
     * for its successor (half_out) or by a matmul for the rest of its own
     * call never outlives a change of xh_src. */
    const float *xh_src;
    size_t xh_n;
    int xh_type;
    unsigned long op_seq, xh_valid_at;
    int half_type;     /* DT_BF16/DT_F16 of the 2-byte matrices, -1: none */
    int model_dim, ffn_dim; /* of the loaded model: inputs of q/k/v, gate/up (model_dim) and down (ffn_dim) */
    int gemv_max;      /* n <= gemv_max rows: GEMV kernels, else GEMM (see gemv_rows) */
    size_t stage_x_max; /* from CUK_GEMV_DEFAULT rows: most bytes of x tiles a GEMV takes */
    bool gemv_max_env; /* set by CLLM_CUDA_GEMV_MAX, not by the model's shape */
    int att_rpw;       /* CLLM_ATT_RPW (0: automatic) */
    int att_mma;       /* prefill attention on tensor cores (CLLM_CUDA_ATT_MMA=0: off) */
    int dec_blocks;    /* decode attention blocks the GPU runs at once (key splits) */
    struct pinned up_ids, up_tab, up_bat, up_smp; /* staging of ids, block table, batch
                                                   * metadata, sampling parameters */
    struct dbuf smp;   /* device copy of the sampling parameters (cu_sample_rows) */
    struct cuk_sample_param *smp_host; /* their host form */
    int smp_cap;
    /* cuk_sample_rows' fast path, for smp_rows rows of smp_n: made on
     * first use, left off where they cannot be had (CLLM_CUDA_SAMPLE_PREP=0:
     * always) */
    struct cuk_sample_ws smp_fw;
    int smp_rows, smp_n;
    bool smp_prep;
    struct dbuf bat;   /* device copy of bat_host */
    int *bat_host;     /* batch step metadata last copied to `bat` (see cuk_bseg) */
    int *bat_tmp;      /* the metadata bat_plan built, compared with bat_host */
    size_t bat_n, bat_cap; /* ints (bat_host and bat_tmp, each) */
    int *tab_host;  /* the block table last copied to `table` */
    int tab_n, tab_cap;
    float *invf_host; /* the RoPE table last copied to `invf` */
    int invf_n;

    char err[256]; /* first deferred failure */

    /* decode graphs */
    bool graphs;       /* enabled (CLLM_COMPILED_DECODE != 0) */
    bool capturing;    /* ops are being recorded, not run */
    bool bgraphs;      /* batched decode steps too (off after a failed recording) */
    int eager_decodes; /* decode steps run eagerly so far */
    /* The batched decode step in progress (see batch_step_begin): its
     * block-table bucket, 0 when the step is not one. */
    int bstep;
    const void *bowner;
    /* The attention geometry the last batched decode step's op got, for
     * building a step's metadata before its ops run (recording, replay). */
    struct attn_args batt;
    const void *batt_owner; /* NULL: none yet */
    struct step_graph seen[SEEN_KEYS];
    int n_seen;
    long g_rec[2], g_rep[2]; /* graphs recorded / replayed: single, batched */
    int att_heads, att_hd;
    struct step_graph cache[MAX_GRAPHS];
    int n_graphs;
    struct step_graph rec; /* key of the graph being recorded */
    int *h_step;       /* pinned [pos0, id, table[cap]] */
    int step_cap;      /* table entries h_step and `step` hold */
    struct dbuf step;  /* device copy of h_step */
    void *blas_ws;
    void *tc_ws;       /* cuk_gemm_tc's workspace (NULL, the default: every
                        * GEMM through cuBLAS; CLLM_CUDA_GEMM_TC=1 on Hopper
                        * sets it up) */
    size_t tc_ws_bytes;
    int tc_blocks;     /* its blocks: CLLM_CUDA_TC_CTAS (1 or 2) per SM */
    struct cuk_tc_cfg tc_cfg; /* CLLM_CUDA_TC_SMEM (measurement) */
    cublasLtHandle_t lt; /* NULL: every GEMM through cublasGemmEx (CLLM_CUDA_LT=0) */
    struct lt_plan *lt_plans; /* [LT_PLANS] */
    int lt_next;              /* the slot the next new shape takes */
    void *am_ws;       /* cuk_argmax workspace + the result id (device) */
    int *am_host;      /* pinned: the id copied back */
    int *amr_dev, *amr_host; /* cu_argmax_rows, cu_sample_rows: ids on the device, pinned copy */
    int amr_cap;             /* ids both hold */
    void *amr_ws;            /* cuk_argmax_rows's workspace for amr_cap rows, after amr_dev's ids */

    /* CLLM_CUDA_TIMING=1: where a decode step's time goes (printed at exit) */
    bool timing, t_open;
    int t_b;                 /* bucket of the open step: 0 one row (decode), 1 several
                              * decodes, 2 steps with prefill */
    double t_mark;           /* host clock when the step's last op was issued */
    cudaEvent_t ev[3];       /* step start, logits copy start, copy end */
    double t_begin, t_end;   /* host clock at step_begin / after download */
    long t_steps[3], t_gaps[3];
    double t_gpu[3], t_copy[3], t_wall[3], t_enq[3], t_gap[3]; /* sums, ms */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static struct cuda_backend *cb(struct backend *be) { return be->impl; }

static void use_device(struct cuda_backend *c) { cudaSetDevice(c->device); }

/* Records the first failure of a void op; returns true when err != success. */
static bool fail_cuda(struct cuda_backend *c, const char *what, cudaError_t err)
{
    if (err == cudaSuccess)
        return false;
    if (!c->err[0])
        snprintf(c->err, sizeof c->err, "%s: %s: %s", c->name, what, cudaGetErrorString(err));
    return true;
}

static void fail_msg(struct cuda_backend *c, const char *msg)
{
    if (!c->err[0])
        snprintf(c->err, sizeof c->err, "%s: %s", c->name, msg);
}

static void pend_settle(struct cuda_backend *c);

/* The entry of every op that issues work: a merge the decode attention
 * left to the o projection is completed first (c->pend; cu_matmul_fused,
 * which may consume it, settles it itself), and the op counter moves on
 * (see half_x). */
static struct cuda_backend *op_begin(struct backend *be)
{
    struct cuda_backend *c = cb(be);
    pend_settle(c);
    c->op_seq++;
    return c;
}

static int sticky(struct cuda_backend *c, struct err *e)
{
    return c->err[0] ? err_set(e, "%s", c->err) : 0;
}

static size_t dbuf_bytes(const struct cuda_backend *c)
{
    return c->ids.cap + c->table.cap + c->ws.cap + c->cnt.cap + c->dn.cap + c->xh.cap + c->wf.cap +
           c->invf.cap +
           c->step.cap + c->mm_in.cap + c->mm_out.cap + c->smp.cap +
           (c->blas_ws ? BLAS_WS_BYTES : 0) + c->tc_ws_bytes;
}

static void graphs_flush(struct cuda_backend *c)
{
    for (int i = 0; i < c->n_graphs; i++)
        cudaGraphExecDestroy(c->cache[i].exec);
    c->n_graphs = 0;
}

/* Grows a work buffer to at least bytes (contents are not kept). */
static void *dbuf_get(struct cuda_backend *c, struct dbuf *b, size_t bytes, const char *what)
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

static void dbuf_free(struct dbuf *b)
{
    if (b->p)
        cudaFree(b->p);
    b->p = NULL;
    b->cap = 0;
}

/* Copies bytes of host memory to dst on the stream through pin: waits for
 * pin's previous copy only (usually long done), never for the stream. */
static bool upload_async(struct cuda_backend *c, struct pinned *pin, void *dst, const void *src,
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

/* ---- weight map ---- */

static size_t hash_ptr(const void *p, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static struct wentry *map_find(const struct cuda_backend *c, const void *host)
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

static const float *dev_vec(struct cuda_backend *c, const float *host, const char *op)
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

/* ---- memory ---- */

static void *cu_alloc(struct backend *be, size_t bytes)
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

static void cu_free(struct backend *be, void *p)
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
        c->t_mark = now_s();
        cudaEventRecord(c->ev[1], c->stream);
    }
    return timed;
}

static void timing_done(struct cuda_backend *c)
{
    float a = 0, b = 0;
    cudaEventElapsedTime(&a, c->ev[0], c->ev[1]);
    cudaEventElapsedTime(&b, c->ev[1], c->ev[2]);
    c->t_end = now_s();
    int k = c->t_b;
    c->t_gpu[k] += a;
    c->t_copy[k] += b;
    c->t_wall[k] += (c->t_end - c->t_begin) * 1e3;
    c->t_enq[k] += (c->t_mark - c->t_begin) * 1e3;
    c->t_steps[k]++;
    c->t_open = false;
}

static void cu_download(struct backend *be, float *dst, const float *src, size_t n)
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

/* Copies rows token ids from the device to pinned host memory and waits:
 * the one wait of a greedy or sampled step (its copy timed under
 * CLLM_CUDA_TIMING). Returns -1 with the failure kept (sticky). */
static int fetch_ids(struct cuda_backend *c, int *host, const int *dev, int rows, bool timed,
                     struct err *e)
{
    if (fail_cuda(c, "copy token ids", cudaMemcpyAsync(host, dev, sizeof(int) * (size_t)rows,
                                                       cudaMemcpyDeviceToHost, c->stream)))
        return sticky(c, e);
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
static int cu_argmax(struct backend *be, int *out, const float *x, int n, struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    use_device(c);
    if (sticky(c, e))
        return -1;
    bool timed = timing_mark(c);
    int *dout = (int *)((char *)c->am_ws + CUK_ARGMAX_WS_BYTES - sizeof(int));
    if (fail_cuda(c, "argmax", cuk_argmax(c->stream, dout, x, n, c->am_ws)) ||
        fetch_ids(c, c->am_host, dout, 1, timed, e))
        return sticky(c, e);
    *out = *c->am_host;
    return 0;
}

/* Makes amr_dev / amr_host hold rows ids (and amr_ws the argmax's
 * workspace for as many rows, zeroed); -1 with the failure kept. */
static int ids_reserve(struct cuda_backend *c, int rows, struct err *e)
{
    if (rows > c->amr_cap) { /* grows rarely: the batch size bounds rows */
        int cap = rows > 64 ? rows : 64;
        if (fail_cuda(c, "synchronize before growing the id buffers",
                      cudaStreamSynchronize(c->stream)))
            return sticky(c, e);
        if (c->amr_dev)
            cudaFree(c->amr_dev);
        if (c->amr_host)
            cudaFreeHost(c->amr_host);
        c->amr_dev = NULL;
        c->amr_host = NULL;
        c->amr_ws = NULL;
        c->amr_cap = 0;
        const size_t ids = ((size_t)cap * sizeof(int) + 15) / 16 * 16;
        const size_t wsb = CUK_ARGMAX_ROWS_WS_BYTES(cap);
        if (fail_cuda(c, "allocate token ids",
                      cudaMalloc((void **)&c->amr_dev, ids + wsb)) ||
            fail_cuda(c, "zero the argmax workspace",
                      cudaMemsetAsync((char *)c->amr_dev + ids, 0, wsb, c->stream)) ||
            fail_cuda(c, "allocate token ids (host)",
                      cudaHostAlloc((void **)&c->amr_host, sizeof(int) * (size_t)cap, 0)))
            return sticky(c, e);
        c->amr_ws = (char *)c->amr_dev + ids;
        c->amr_cap = cap;
    }
    return 0;
}

/* A batched step's greedy sequences: one launch over their logits rows and
 * one copy of rows ids to pinned memory, instead of rows x n floats. */
static int cu_argmax_rows(struct backend *be, int *out, const float *x, int rows, int n,
                          struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    use_device(c);
    if (sticky(c, e) || ids_reserve(c, rows, e))
        return -1;
    bool timed = timing_mark(c);
    if (fail_cuda(c, "argmax rows", cuk_argmax_rows(c->stream, c->amr_dev, x, rows, n, c->amr_ws,
                                                         2 * c->n_sms)) ||
        fetch_ids(c, c->amr_host, c->amr_dev, rows, timed, e))
        return sticky(c, e);
    memcpy(out, c->amr_host, sizeof(int) * (size_t)rows);
    return 0;
}

static void smp_prep_free(struct cuda_backend *c)
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
static int cu_sample_rows(struct backend *be, int *out, const float *x, int rows, int n,
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
                  cuk_sample_rows(c->stream, c->amr_dev, x, rows, n, dp,
                                  prep ? &c->smp_fw : NULL)) ||
        fetch_ids(c, c->amr_host, c->amr_dev, rows, timed, e))
        return sticky(c, e);
    memcpy(out, c->amr_host, sizeof(int) * (size_t)rows);
    return 0;
}

static void cu_upload(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cuda_backend *c = op_begin(be);
    use_device(c);
    if (!fail_cuda(c, "upload", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream)))
        fail_cuda(c, "synchronize after upload", cudaStreamSynchronize(c->stream));
}

static int cu_finish(struct backend *be, struct err *e)
{
    pend_settle(cb(be)); /* see c->pend */
    struct cuda_backend *c = cb(be);
    use_device(c);
    if (!c->err[0])
        fail_cuda(c, "synchronize", cudaStreamSynchronize(c->stream));
    return sticky(c, e);
}

static void cu_mem_info(struct backend *be, struct backend_mem *out)
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

static int cu_load_weights(struct backend *be, const struct model *m, struct err *e)
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
    size_t dfree = 0, dtotal = 0;
    cudaMemGetInfo(&dfree, &dtotal);
    size_t reserve = (size_t)512 << 20; /* activations, KV, cuBLAS workspace come after */
    if (need + reserve > dfree) {
        free(ts);
        free(pair);
        return err_set(e, "%s: the model's weights need %.1f GiB but only %.1f of %.1f GiB are free "
                          "(plus %.1f GiB kept for activations and KV); use a smaller or more "
                          "quantized model, or --device cpu",
                       c->name, need / 1073741824.0, dfree / 1073741824.0, dtotal / 1073741824.0,
                       reserve / 1073741824.0);
    }
    fprintf(stderr, "%s: loading %d tensors, %.1f MiB of weights (%.1f GiB free)\n", c->name, uniq,
            need / 1048576.0, dfree / 1073741824.0);
    double t0 = now_s(), last = t0;
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
        double t = now_s();
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
    if (rc)
        return -1;
    if (serr != cudaSuccess)
        return err_set(e, "%s: uploading weights: %s", c->name, cudaGetErrorString(serr));
    double dt = now_s() - t0;
    fprintf(stderr, "%s%s: weights loaded in %.2f s (%.2f GB/s)\n", isatty(2) ? "\r" : "", c->name,
            dt, dt > 0 ? need / dt / 1e9 : 0.0);
    return 0;
}

/* ---- ops ---- */

static const struct cuk_weight *dev_weight(struct cuda_backend *c, const struct tensor *t,
                                           const char *op)
{
    struct wentry *w = map_find(c, t->data);
    if (!w) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: a %s tensor [%lld x %lld] was not uploaded (load_weights "
                                  "first)", op, dtype_name(t->dtype), (long long)t->rows,
                 (long long)t->cols);
        fail_msg(c, msg);
        return NULL;
    }
    return &w->w;
}

/* The device copy of n token ids (c->ids), copied on the stream; NULL
 * with the failure kept. */
static const int *ids_upload(struct cuda_backend *c, const int *ids, int n)
{
    int *dids = dbuf_get(c, &c->ids, (size_t)n * sizeof(int), "token ids");
    if (!dids || !upload_async(c, &c->up_ids, dids, ids, (size_t)n * sizeof(int), "copy token ids"))
        return NULL;
    return dids;
}

static void cu_embed(struct backend *be, float *out, const struct tensor *t, const int *ids, int n)
{
    struct cuda_backend *c = op_begin(be);
    if (!c->capturing)
        use_device(c);
    const struct cuk_weight *w = dev_weight(c, t, "embed");
    if (!w || c->err[0])
        return;
    if (c->bstep) { /* a batched decode: step_begin copied the ids */
        fail_cuda(c, "embed", cuk_embed(c->stream, out, w, c->ids.p, n));
        return;
    }
    if (c->capturing) { /* the id comes with the step record */
        fail_cuda(c, "embed", cuk_embed(c->stream, out, w, (const int *)c->step.p + 1, n));
        return;
    }
    const int *dids = ids_upload(c, ids, n);
    if (dids)
        fail_cuda(c, "embed", cuk_embed(c->stream, out, w, dids, n));
}

/* Destroys what a plan holds; its key stays. */
static void lt_plan_clear(struct lt_plan *pl)
{
    if (pl->op)
        cublasLtMatmulDescDestroy(pl->op);
    if (pl->a)
        cublasLtMatrixLayoutDestroy(pl->a);
    if (pl->b)
        cublasLtMatrixLayoutDestroy(pl->b);
    if (pl->c)
        cublasLtMatrixLayoutDestroy(pl->c);
    pl->op = NULL;
    pl->a = pl->b = pl->c = NULL;
    pl->usable = false;
}

/* The largest power of two up to 256 that every one of the n pointers ps
 * is a multiple of. */
static int ptrs_align(const void *const *ps, size_t n)
{
    uintptr_t u = 256;
    for (size_t i = 0; i < n; i++)
        u |= (uintptr_t)ps[i];
    return (int)(u & -u);
}

/* The strides of a batch of two: in elements, from the first matrix (and
 * output) to the second; the x layout's is 0 (shared). */
static bool lt_set_strides(struct lt_plan *pl, int64_t sa, int64_t sc)
{
    const int64_t zero = 0;
    return cublasLtMatrixLayoutSetAttribute(pl->a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &sa, sizeof sa) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutSetAttribute(pl->b, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &zero, sizeof zero) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutSetAttribute(pl->c, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &sc, sizeof sc) == CUBLAS_STATUS_SUCCESS;
}

/* The cuBLASLt setup of out^T[rows x n] (+)= (W^T)^T . x^T, made on first
 * use: cublasGemmEx makes it on every call, ~8.6 us of host time each
 * (measured on the H200: 1.45 ms of a 0.6B model's 8-stream decode step,
 * a step bound by the host). batch 2: a pair over one x (gemm_pair), its
 * heuristic run with the strides sa, sc, which each call sets again. NULL
 * when it cannot be set up (the caller then uses cublasGemmEx, or two
 * calls); a shape that failed stays cached as unusable. */
static struct lt_plan *lt_plan_get(struct cuda_backend *c, int rows, int n, int cols, int ldc,
                                   cudaDataType t, int align, int batch, int64_t sa, int64_t sc)
{
    for (int i = 0; i < LT_PLANS; i++) {
        struct lt_plan *pl = &c->lt_plans[i];
        if (pl->rows == rows && pl->n == n && pl->cols == cols && pl->ldc == ldc &&
            pl->type == (int)t && pl->align == align && pl->batch == batch)
            return pl->usable ? pl : NULL;
    }
    struct lt_plan *pl = &c->lt_plans[c->lt_next];
    c->lt_next = (c->lt_next + 1) % LT_PLANS;
    lt_plan_clear(pl);
    *pl = (struct lt_plan){.rows = rows, .n = n, .cols = cols, .ldc = ldc, .type = (int)t,
                           .align = align, .batch = batch};
    static const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    uint32_t al = (uint32_t)align;
    uint64_t ws = BLAS_WS_BYTES;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    /* column-major, as gemm's cublasGemmEx call: W is cols x rows (op T),
     * x cols x n, out rows x n with leading dimension ldc */
    bool ok =
        cublasLtMatmulDescCreate(&pl->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&pl->a, t, (uint64_t)cols, (uint64_t)rows, cols) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&pl->b, t, (uint64_t)cols, (uint64_t)n, cols) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&pl->c, CUDA_R_32F, (uint64_t)rows, (uint64_t)n, ldc) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                             sizeof ws) == CUBLAS_STATUS_SUCCESS;
    for (size_t i = 0; ok && i < sizeof aligns / sizeof aligns[0]; i++)
        ok = cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &al, sizeof al) ==
             CUBLAS_STATUS_SUCCESS;
    if (ok && batch > 1) {
        const int32_t bc = batch;
        cublasLtMatrixLayout_t ls[3] = {pl->a, pl->b, pl->c};
        for (int i = 0; ok && i < 3; i++)
            ok = cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc,
                                                  sizeof bc) == CUBLAS_STATUS_SUCCESS;
        ok = ok && lt_set_strides(pl, sa, sc);
    }
    ok = ok &&
         cublasLtMatmulAlgoGetHeuristic(c->lt, pl->op, pl->a, pl->b, pl->c, pl->c, pref, 1, &res,
                                        &found) == CUBLAS_STATUS_SUCCESS &&
         found > 0;
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (!ok) {
        lt_plan_clear(pl); /* the key stays: the shape stays unusable */
        return NULL;
    }
    pl->algo = res.algo;
    pl->usable = true;
    return pl;
}

/* out = x . W^T, or out += x . W^T when acc (added in the f32 epilogue:
 * no scratch, no add launch). With CLLM_CUDA_GEMM_TC=1 a batched decode
 * step's few tokens go to our tensor-core kernel (cuk_gemm_tc: ~2 us of
 * host time a call against cuBLAS's ~6, but 10-25 % slower on the GPU,
 * so off by default; docs/benchmarks.md), the rest to cuBLAS. */
static int gemm(struct cuda_backend *c, float *out, int ldc, const void *w, const void *x,
                cudaDataType t, int rows, int n, int cols, bool acc, struct err *e)
{
    const float one = 1.0f, beta = acc ? 1.0f : 0.0f;
    if (c->tc_ws && n <= CUK_TC_MAX_N && t != CUDA_R_32F) {
        cudaError_t err = cuk_gemm_tc(c->stream, out, ldc, w, t == CUDA_R_16BF ? DT_BF16 : DT_F16,
                                      x, rows, n, cols, acc, c->tc_ws, c->tc_blocks, &c->tc_cfg);
        if (err != cudaErrorNotSupported)
            return fail_cuda(c, "tensor-core GEMM", err) ? sticky(c, e) : 0;
    }
    if (c->lt && n <= LT_MAX_N && t != CUDA_R_32F) {
        const void *ps[] = {w, x, out};
        int align = ptrs_align(ps, 3);
        struct lt_plan *pl = lt_plan_get(c, rows, n, cols, ldc, t, align, 1, 0, 0);
        if (pl) {
            if (cublasLtMatmul(c->lt, pl->op, &one, w, pl->a, x, pl->b, &beta, out, pl->c, out,
                               pl->c, &pl->algo, c->blas_ws, BLAS_WS_BYTES,
                               c->stream) == CUBLAS_STATUS_SUCCESS)
                return 0;
            pl->usable = false; /* refused at the call (nothing launched): not again */
        }
    }
    /* Column-major view: out^T[rows x n] = (W^T)^T[rows x cols] . x^T[cols x n]. */
    cublasStatus_t st = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w, t,
                                     cols, x, t, cols, &beta, out, CUDA_R_32F, ldc,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        return err_set(e, "%s: cuBLAS GEMM [%d x %d x %d]: %s", c->name, rows, n, cols,
                       cublasGetStatusString(st));
    return 0;
}

/* outs[0] = x . W0^T and outs[1] = x . W1^T for two matrices of one
 * shape and half type (k/v, gate/up) in one cuBLASLt call: a strided
 * batch of two, the weights and the outputs each a pointer difference
 * apart, x shared. A batched decode step then issues 5 GEMMs a layer
 * instead of 7. False (nothing issued) when it cannot: the caller issues
 * two GEMMs. */
static bool gemm_pair(struct cuda_backend *c, float *const *outs, const struct cuk_weight *w0,
                      const struct cuk_weight *w1, const uint16_t *xh, int n)
{
    if (!c->lt || !c->gemm_pair || n > LT_MAX_N || w0->dtype != w1->dtype ||
        w0->rows != w1->rows || w0->cols != w1->cols)
        return false;
    /* separate allocations: their distance as integers */
    float *o0 = outs[0], *o1 = outs[1];
    const void *a0 = w0->data, *a1 = w1->data;
    if ((uintptr_t)a1 < (uintptr_t)a0) { /* both strides positive: the lower matrix first */
        const void *ta = a0;
        a0 = a1;
        a1 = ta;
        float *to = o0;
        o0 = o1;
        o1 = to;
    }
    uintptr_t da = (uintptr_t)a1 - (uintptr_t)a0;
    if ((uintptr_t)o1 <= (uintptr_t)o0 || da % 2 || ((uintptr_t)o1 - (uintptr_t)o0) % 4)
        return false; /* the outputs in the other order (or one buffer) */
    int64_t sa = (int64_t)(da / 2), sc = (int64_t)(((uintptr_t)o1 - (uintptr_t)o0) / 4);
    const void *ps[] = {a0, a1, xh, o0, o1};
    int align = ptrs_align(ps, sizeof ps / sizeof ps[0]);
    cudaDataType t = w0->dtype == DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    struct lt_plan *pl = lt_plan_get(c, w0->rows, n, w0->cols, w0->rows, t, align, 2, sa, sc);
    if (!pl || !lt_set_strides(pl, sa, sc))
        return false;
    const float one = 1.0f, zero = 0.0f;
    if (cublasLtMatmul(c->lt, pl->op, &one, a0, pl->a, xh, pl->b, &zero, o0, pl->c, o0, pl->c,
                       &pl->algo, c->blas_ws, BLAS_WS_BYTES, c->stream) != CUBLAS_STATUS_SUCCESS) {
        pl->usable = false; /* refused at the call (nothing launched): not again */
        return false;
    }
    return true;
}

/* x rounded to w's half type for a tensor-core GEMM: the copy the
 * previous op made (half_out) or the previous matmul of this call made
 * (q/k/v, gate/up share x), else a conversion now. */
static const uint16_t *half_x(struct cuda_backend *c, const float *x, int n,
                              const struct cuk_weight *w)
{
    size_t nel = (size_t)n * (size_t)w->cols;
    if (c->xh_src == x && c->xh_n == nel && c->xh_type == w->dtype &&
        c->xh_valid_at == c->op_seq && c->xh.p)
        return c->xh.p;
    uint16_t *xh = dbuf_get(c, &c->xh, nel * 2, "half activations");
    c->xh_src = NULL;
    if (!xh || fail_cuda(c, "convert activations",
                         cuk_f32_to_half(c->stream, xh, x, nel, w->dtype == DT_BF16)))
        return NULL;
    c->xh_src = x;
    c->xh_n = nel;
    c->xh_type = w->dtype;
    c->xh_valid_at = c->op_seq;
    return xh;
}

/* Where an op's f32 result (nel elements at out) will feed a tensor-core
 * GEMM (more than gemv_max rows, 2-byte weights, not precise): a buffer
 * for its half copy, valid for the next op; NULL when not worth it. */
static uint16_t *half_out(struct cuda_backend *c, const float *out, size_t nel, bool gemm_next)
{
    if (!gemm_next || c->precise || c->half_type < 0 || c->err[0])
        return NULL;
    uint16_t *h = dbuf_get(c, &c->xh, nel * 2, "half activations");
    if (!h)
        return NULL;
    c->xh_src = out;
    c->xh_n = nel;
    c->xh_type = c->half_type;
    c->xh_valid_at = c->op_seq + 1;
    return h;
}

/* Whether n rows of x over cols columns go to the GEMV kernels (f32
 * activations) rather than a tensor-core GEMM: up to gemv_max rows, and
 * past CUK_GEMV_DEFAULT rows only where their x tiles fit in
 * stage_x_max bytes beside the staged GEMV's ring (unless
 * CLLM_CUDA_GEMV_MAX chose; gemv_max is 1 where the tensor-core GEMV is
 * on: see cu_load_weights). So where it is off, a batched step of 3-4
 * tokens may mix the two: an 8B model's down projection (14,336 columns)
 * on cuBLAS, its other matrices staged. */
static bool gemv_rows(const struct cuda_backend *c, size_t cols, int n)
{
    return n <= c->gemv_max &&
           (n <= CUK_GEMV_DEFAULT || c->gemv_max_env || (size_t)n * cols * 4 <= c->stage_x_max);
}

/* Whether n rows of x times the k matrices ts (one launch) that the GEMVs
 * leave go to the tensor-core GEMV (cuk_gemv_mma: x rounded to half as
 * cuBLAS reads it, the input and output ops in its launch) rather than
 * cuBLAS: bf16/f16 matrices of one dtype in a 2-byte model, not precise, up
 * to CUK_MMA_MAX_N rows, and where it wins (H200, docs/benchmarks.md,
 * seventeenth pass): launches of at most mma_max_bytes of weights (it
 * streams them at ~75 % of the copy bandwidth to cuBLAS's ~90 %, so an 8B
 * model's gate/up and down lose what the saved launches gain) and x of at
 * most mma_max_x elements (every block stages all of x from L2 before its
 * first product: at 16 tokens x 4,096 columns, 256 KB of f32 a block). So
 * an 8B model's step of 2-8 tokens takes it for q/k/v and o, a 0.6B
 * model's for every matrix but the LM head and, past 10 tokens, the down
 * projection. */
static bool mma_takes(const struct cuda_backend *c, const struct tensor *const *ts, int k,
                      int n)
{
    const size_t cols = (size_t)ts[0]->cols;
    if (!c->gemv_mma || c->precise || c->half_type < 0 || n > CUK_MMA_MAX_N ||
        gemv_rows(c, cols, n) || cols % 32 || (size_t)n * cols > c->mma_max_x ||
        cuk_gemv_mma_smem(n, (int)cols) > (size_t)c->mma.smem_max)
        return false;
    size_t bytes = 0;
    for (int i = 0; i < k; i++) {
        if ((ts[i]->dtype != DT_BF16 && ts[i]->dtype != DT_F16) || ts[i]->dtype != ts[0]->dtype)
            return false;
        bytes += (size_t)ts[i]->rows * (size_t)ts[i]->cols * 2;
    }
    return bytes <= c->mma_max_bytes;
}

/* Whether n rows of x times the k matrices ts go to a kernel that takes
 * f32 rows (no half copy needed) and does the input and output ops
 * itself. */
static bool gemv_like(const struct cuda_backend *c, const struct tensor *const *ts, int k, int n)
{
    return gemv_rows(c, (size_t)ts[0]->cols, n) || mma_takes(c, ts, k, n);
}

/* Whether matmul_x multiplies x . W^T with a cuBLAS GEMM (which can add
 * into its output) rather than a GEMV kernel. */
static bool matmul_is_gemm(const struct cuda_backend *c, const struct tensor *t, int n)
{
    return t->dtype == DT_F32 || !gemv_like(c, &t, 1, n);
}

/* Most output rows the register-streamed GEMV takes with the RMSNorm in:
 * each of its blocks (a few warps of rows each) stages the norm itself,
 * which over a vocabulary of rows costs more than the norm's own launch
 * (H200, a 0.6B model's 151,936-row LM head: decode 1,154 -> 1,114 tok/s
 * fused). The staged GEMV, one block per SM, takes any count. */
#define NORM_FUSE_MAX_ROWS 32768

/* A GEMV launch of cuk_gemv_fused's contract: past the GEMVs' rows the
 * tensor-core GEMV (mma_takes); else the staged kernel for up to
 * CUK_STAGE_MAX_N rows where it is on and takes the shape, else the
 * register-streamed one; cudaErrorNotSupported (nothing launched) where
 * none does. */
static cudaError_t gemv_fused(struct cuda_backend *c, float *const *outs,
                              const struct cuk_gemv_in *in, int n,
                              const struct cuk_weight *const *ws, int k, int out)
{
    if (!gemv_rows(c, (size_t)ws[0]->cols, n)) /* the caller saw mma_takes */
        return cuk_gemv_mma(c->stream, outs, in, n, ws, k, out, &c->mma);
    if (n <= CUK_STAGE_MAX_N && c->gemv_staged) {
        cudaError_t err = cuk_gemv_staged(c->stream, outs, in, n, ws, k, out, &c->stage);
        if (err != cudaErrorNotSupported)
            return err;
    }
    long rows = 0;
    for (int i = 0; i < k; i++)
        rows += ws[i]->rows;
    if (in->kind == CUK_IN_RMSNORM && rows > NORM_FUSE_MAX_ROWS)
        return cudaErrorNotSupported;
    return cuk_gemv_fused(c->stream, outs, in, n, ws, k, out);
}

/* out = x . W^T; out += x . W^T when acc (only where matmul_is_gemm). */
static int matmul_x(struct backend *be, float *out, const float *x, int n, const struct tensor *t,
                    bool acc, struct err *e)
{
    struct cuda_backend *c = cb(be);
    const struct cuk_weight *w = dev_weight(c, t, "matmul");
    if (sticky(c, e))
        return -1;
    if (w->dtype == DT_F32)
        return gemm(c, out, w->rows, w->data, x, CUDA_R_32F, w->rows, n, w->cols, acc, e);
    if (gemv_rows(c, (size_t)w->cols, n)) {
        if (acc)
            return err_set(e, "%s: internal: accumulating GEMV", c->name);
        struct cuk_gemv_in gi = {.kind = CUK_IN_X, .x = x};
        cudaError_t err = gemv_fused(c, &out, &gi, n, &w, 1, CUK_OUT_STORE);
        if (err == cudaErrorNotSupported) /* the scalar kernel takes any shape */
            err = cuk_gemv(c->stream, out, x, n, w);
        if (fail_cuda(c, "gemv", err))
            return sticky(c, e);
        return 0;
    }
    if (!acc && mma_takes(c, &t, 1, n)) {
        struct cuk_gemv_in gi = {.kind = CUK_IN_X, .x = x};
        cudaError_t err = cuk_gemv_mma(c->stream, &out, &gi, n, &w, 1, CUK_OUT_STORE, &c->mma);
        if (err != cudaErrorNotSupported) /* else cuBLAS takes it */
            return fail_cuda(c, "gemv", err) ? sticky(c, e) : 0;
    }
    if (!c->precise && (w->dtype == DT_BF16 || w->dtype == DT_F16)) {
        const uint16_t *xh = half_x(c, x, n, w);
        if (!xh)
            return sticky(c, e);
        return gemm(c, out, w->rows, w->data, xh, w->dtype == DT_BF16 ? CUDA_R_16BF : CUDA_R_16F,
                    w->rows, n, w->cols, acc, e);
    }
    /* Widen row chunks of W to f32 and multiply in f32. */
    int chunk = (int)(WIDEN_CHUNK_BYTES / 4 / (size_t)w->cols);
    if (chunk < 1)
        chunk = 1;
    if (chunk > w->rows)
        chunk = w->rows;
    float *wf = dbuf_get(c, &c->wf, (size_t)chunk * w->cols * 4, "widened weights");
    if (!wf)
        return sticky(c, e);
    for (int r0 = 0; r0 < w->rows; r0 += chunk) {
        int nr = w->rows - r0 < chunk ? w->rows - r0 : chunk;
        if (fail_cuda(c, "widen weights", cuk_dequant_f32(c->stream, wf, w, r0, nr)))
            return sticky(c, e);
        if (gemm(c, out + r0, w->rows, wf, x, CUDA_R_32F, nr, n, w->cols, acc, e))
            return -1;
    }
    return 0;
}

static int cu_matmul(struct backend *be, float *out, const float *x, int n, const struct tensor *t,
                     struct err *e)
{
    op_begin(be);
    return matmul_x(be, out, x, n, t, false, e);
}

/* Several matmuls over the same x (q/k/v, gate/up): one GEMV launch for
 * decode-sized n and f16/bf16/Q8_0 weights, else one matmul each. */
static int cu_matmul_multi(struct backend *be, float *const *outs, const float *x, int n,
                           const struct tensor *const *ts, int k, struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    if (c->fuse && k >= 1 && k <= 3 && gemv_like(c, ts, k, n)) {
        const struct cuk_weight *ws[3];
        for (int i = 0; i < k; i++)
            if (!(ws[i] = dev_weight(c, ts[i], "matmul")))
                return sticky(c, e);
        if (sticky(c, e))
            return -1;
        struct cuk_gemv_in gi = {.kind = CUK_IN_X, .x = x};
        cudaError_t err = gemv_fused(c, outs, &gi, n, ws, k, CUK_OUT_STORE);
        if (err != cudaErrorNotSupported) {
            if (fail_cuda(c, "gemv", err))
                return sticky(c, e);
            return 0;
        }
    }
    /* k/v (the last two of q/k/v) and gate/up: one call where the GEMM
     * path takes them (gemm_pair) */
    int pair = k == 3 ? 1 : k == 2 ? 0 : -1;
    bool paired = false;
    if (pair >= 0 && !gemv_like(c, ts, k, n) && !c->precise && !c->tc_ws && c->gemm_pair) {
        const struct cuk_weight *p0 = dev_weight(c, ts[pair], "matmul");
        const struct cuk_weight *p1 = dev_weight(c, ts[pair + 1], "matmul");
        if (sticky(c, e))
            return -1;
        if (p0->dtype == DT_BF16 || p0->dtype == DT_F16) {
            const uint16_t *xh = half_x(c, x, n, p0);
            if (!xh)
                return sticky(c, e);
            paired = gemm_pair(c, outs + pair, p0, p1, xh, n);
        }
    }
    for (int i = 0; i < k; i++)
        if (!(paired && (i == pair || i == pair + 1)) &&
            matmul_x(be, outs[i], x, n, ts[i], false, e))
            return -1;
    return 0;
}

/* out = rmsnorm(x), after x += y when y is given (one launch, or add then
 * rmsnorm with CLLM_CUDA_FUSE=0); x is written only then. A model-width
 * norm of a GEMM-sized chunk feeds q/k/v or gate/up: its half copy is made
 * on the way (half_out). */
static void norm_run(struct backend *be, float *out, float *x, const float *y, const float *w,
                     int n, int dim, float eps)
{
    struct cuda_backend *c = op_begin(be);
    const float *dw = dev_vec(c, w, "rmsnorm");
    if (!dw || c->err[0])
        return;
    uint16_t *oh = half_out(c, out, (size_t)n * dim,
                            dim == c->model_dim && !gemv_rows(c, (size_t)dim, n));
    int bf = c->half_type == DT_BF16;
    if (y && c->fuse) {
        fail_cuda(c, "add_rmsnorm", cuk_add_rmsnorm(c->stream, out, x, y, dw, n, dim, eps, oh, bf));
        return;
    }
    if (y && fail_cuda(c, "add", cuk_add(c->stream, x, y, (size_t)n * dim)))
        return;
    fail_cuda(c, "rmsnorm", cuk_rmsnorm(c->stream, out, x, dw, n, dim, eps, oh, bf));
}

static void cu_add_rmsnorm(struct backend *be, float *out, float *x, const float *y,
                           const float *w, int n, int dim, float eps)
{
    norm_run(be, out, x, y, w, n, dim, eps);
}

static void cu_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n,
                       int dim, float eps)
{
    norm_run(be, out, (float *)x, NULL, w, n, dim, eps); /* no y: x is not written */
}

static void cu_add_bias(struct backend *be, float *x, const float *b, int n, int dim)
{
    struct cuda_backend *c = op_begin(be);
    const float *db = dev_vec(c, b, "add_bias");
    if (db && !c->err[0])
        fail_cuda(c, "add_bias", cuk_add_bias(c->stream, x, db, n, dim));
}

/* The device copy of the RoPE frequency table, copied again only when it
 * changed; NULL (with the failure kept) on error. */
static const float *dev_invf(struct cuda_backend *c, const float *inv_freq, int half)
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

static void cu_rope(struct backend *be, float *x, int n, int n_heads, int head_dim, int pos0,
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

/* Block-table entries a decode graph carries: a power of two >= 64. */
static int table_bucket(int n_blocks)
{
    int b = 64;
    while (b < n_blocks)
        b *= 2;
    return b;
}

/* The device copy of seq's block table, copied again only when it changed. */
static const int *dev_table(struct cuda_backend *c, const struct kv_seq *seq)
{
    if (c->capturing) /* the table comes with the step record */
        return (const int *)c->step.p + 2;
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

/* The split counters of count (query, head) rows; zeroed when (re)made,
 * and the attention kernels leave them zero. */
static unsigned *att_counters(struct cuda_backend *c, size_t count)
{
    size_t bytes = (count ? count : 1) * sizeof(unsigned);
    if (c->cnt.p && c->cnt.cap >= bytes)
        return c->cnt.p;
    void *p = dbuf_get(c, &c->cnt, bytes, "attention split counters");
    if (p && fail_cuda(c, "zero split counters", cudaMemsetAsync(p, 0, c->cnt.cap, c->stream)))
        return NULL;
    return p;
}

/* Completes a key-split merge the decode attention left to the o
 * projection (c->pend) when another op comes first. Every op that reads
 * or writes device memory calls it before its work: through op_begin, or
 * itself where the op leaves the op counter alone (download, finish,
 * load_weights, step_end). */
static void pend_settle(struct cuda_backend *c)
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

/* The o projection of a deferred merge (c->pend), out += merged . W^T in
 * one staged GEMV that merges as it stages x; cudaErrorNotSupported when
 * that GEMV does not take the shape (the caller settles instead). */
static cudaError_t pend_o_gemv(struct cuda_backend *c, float *out, const struct tensor *t)
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

/* True when the pool was made for this KV head geometry: its layout
 * (cuk_kv_row) depends on it, and attn_geom takes it from the pool. */
static bool pool_takes(const struct kv_pool *pool, int n_kv_heads, int head_dim)
{
    return n_kv_heads == pool->n_kv_heads && head_dim == pool->head_dim;
}

static struct cuk_attn attn_geom(const struct cuda_backend *c, const struct kv_pool *pool,
                                 int layer, int n, int pos0)
{
    struct cuk_attn g = {0};
    g.n_sms = c->n_sms;
    g.rows_per_warp = c->att_rpw;
    g.mma = c->att_mma;
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

static void cu_kv_store(struct backend *be, struct kv_pool *pool, const struct kv_seq *seq,
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
static void cu_rope_kv_store(struct backend *be, float *q, float *k, const float *v, int n,
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
    if (a->n == 1) {
        c->att_heads = a->n_heads;
        c->att_hd = a->head_dim;
    }
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
    bool defer = rope && a->o_next && c->gemv_staged && dec && a->n == 1 && splits > 1 &&
                 (c->defer_merge == 1 || (c->defer_merge == -1 && defer_pays(c, splits))) &&
                 (c->dn.p || !c->capturing); /* no buffer can be made while recording */
    if (defer && !(dn = dbuf_get(c, &c->dn, sizeof(int), "deferred merge count")))
        return sticky(c, e);
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

static int cu_attention(struct backend *be, float *out, const float *q, const struct kv_pool *pool,
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
static int cu_rope_kv_attention(struct backend *be, float *out, float *q, float *k,
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
struct bat_plan {
    struct cuk_attn g;  /* the step's geometry (layer as asked) */
    size_t need;        /* ints of metadata */
    int max_splits;     /* the batch kernel's key splits (0: it only stores K/V) */
    int dec_rows;       /* > 0: short segments go to the tensor-core decode kernel */
    int n_short;        /* segments of at most short_rows queries */
    bool use_short;     /* those go to a short-segment kernel */
    int short_splits;   /* its grid depth */
    size_t ws_floats;   /* attention workspace */
    size_t n_cnt;       /* split counters (0: none) */
};

/* Plans the attention of a batch step's segments and builds its metadata
 * in c->bat_tmp. bucket > 0 (a batched decode step, see batch_step_begin):
 * every block table is padded to bucket entries and every key range split
 * by the bucket's capacity rather than by its length, so the metadata's
 * layout and the launches' grids depend only on (segments, bucket): a
 * recorded step replays with new positions and tables, and eager steps
 * split alike, so replays are bit-identical to them. */
static int bat_plan(struct cuda_backend *c, const struct batch_seg *segs, int n_seg,
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

/* The workspace and split counters a plan needs (*ws, *cnt: NULL where it
 * needs none), and its metadata on the device (bat_upload); false with
 * the failure kept. */
static bool bat_buffers(struct cuda_backend *c, const struct bat_plan *p, float **ws,
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
static int cu_rope_kv_attention_batch(struct backend *be, float *out, float *q, float *k,
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

static void cu_silu_mul(struct backend *be, float *g, const float *u, size_t n)
{
    struct cuda_backend *c = op_begin(be);
    if (c->err[0])
        return;
    /* gate of a GEMM-sized chunk: the input of the down projection */
    bool gemm_next = c->ffn_dim > 0 && n % (size_t)c->ffn_dim == 0 &&
                     !gemv_rows(c, (size_t)c->ffn_dim, (int)(n / (size_t)c->ffn_dim));
    uint16_t *gh = half_out(c, g, n, gemm_next);
    fail_cuda(c, "silu_mul", cuk_silu_mul(c->stream, g, u, n, gh, c->half_type == DT_BF16));
}

static void cu_add(struct backend *be, float *x, const float *y, size_t n)
{
    struct cuda_backend *c = op_begin(be);
    if (!c->err[0])
        fail_cuda(c, "add", cuk_add(c->stream, x, y, n));
}

#define SWIGLU_FUSE_MAX 8192 /* widest SwiGLU staged by the down GEMV itself */

/* A matmul with its input's op (rmsnorm, SwiGLU) and the residual add
 * fused in: one GEMV launch at decode sizes (cuk_gemv_fused), else the
 * plain ops it is defined as, through the same functions, so the prefill
 * GEMM path keeps its half-precision copies (half_out / half_x). */
static int cu_matmul_fused(struct backend *be, float *const *outs, const struct matmul_in *in,
                           int n, const struct tensor *const *ts, int k, enum matmul_out out,
                           struct err *e)
{
    cb(be)->op_seq++; /* see half_x */
    struct cuda_backend *c = cb(be);
    if (sticky(c, e))
        return -1;
    if (k < 1 || k > 3 || n < 1 || in->kind < MATMUL_IN_X || in->kind > MATMUL_IN_SWIGLU ||
        out < MATMUL_OUT_STORE || out > MATMUL_OUT_SWIGLU ||
        (out == MATMUL_OUT_SWIGLU && (k != 2 || ts[0]->rows != ts[1]->rows)))
        return err_set(e, "%s: matmul_fused of %d matrices over %d rows (input kind %d, output "
                          "kind %d)",
                       c->name, k, n, (int)in->kind, (int)out);
    if (c->pend.out && in->kind == MATMUL_IN_X && in->x == c->pend.out && n == 1 && k == 1 &&
        out == MATMUL_OUT_ADD) { /* the o projection after a deferred merge */
        cudaError_t err = pend_o_gemv(c, outs[0], ts[0]);
        if (err != cudaErrorNotSupported) {
            fail_cuda(c, "gemv", err);
            return sticky(c, e);
        }
        /* this model's o projection is no staged GEMV (f32 weights, rows
         * under 4 KB): deferring would only add a merge launch */
        c->defer_merge = 0;
    }
    pend_settle(c);
    bool add = out == MATMUL_OUT_ADD;
    size_t cols = (size_t)ts[0]->cols;
    enum matmul_in_kind kind = in->kind; /* what is left to apply to in->x */
    bool in_op = false;                  /* an input op (norm, SwiGLU) issued here */
    if (c->fuse && gemv_like(c, ts, k, n)) {
        const struct cuk_weight *ws[3];
        for (int i = 0; i < k; i++)
            if (!(ws[i] = dev_weight(c, ts[i], "matmul")))
                return sticky(c, e);
        struct cuk_gemv_in gi = {.kind = in->kind == MATMUL_IN_RMSNORM  ? CUK_IN_RMSNORM
                                         : in->kind == MATMUL_IN_SWIGLU ? CUK_IN_SWIGLU
                                                                        : CUK_IN_X,
                                 .x = in->x, .x2 = in->x2, .eps = in->eps};
        /* Every block of the down GEMV reads both gate and up rows: past
         * SWIGLU_FUSE_MAX columns that costs more than a separate SwiGLU
         * launch (bench_gemv on the H200: 3072 columns fused 1.1 us faster,
         * 14336 columns 3.1 us slower). The same bits either way. */
        if (gi.kind == CUK_IN_SWIGLU && cols > SWIGLU_FUSE_MAX) {
            cu_silu_mul(be, in->x, in->x2, (size_t)n * cols);
            in_op = true;
            kind = MATMUL_IN_X;
            gi.kind = CUK_IN_X;
            gi.x2 = NULL;
        }
        if (in->kind == MATMUL_IN_RMSNORM && !(gi.nw = dev_vec(c, in->norm, "rmsnorm")))
            return sticky(c, e);
        /* SwiGLU in the GEMV's epilogue, or its own launch after it */
        bool sw_launch = out == MATMUL_OUT_SWIGLU && !c->swiglu_out;
        cudaError_t err = gemv_fused(c, outs, &gi, n, ws, k,
                                         out == MATMUL_OUT_ADD ? CUK_OUT_ADD
                                         : out == MATMUL_OUT_SWIGLU && !sw_launch
                                             ? CUK_OUT_SWIGLU
                                             : CUK_OUT_STORE);
        if (err != cudaErrorNotSupported) {
            if (fail_cuda(c, "gemv", err))
                return sticky(c, e);
            if (sw_launch)
                cu_silu_mul(be, outs[0], outs[1], (size_t)n * (size_t)ts[0]->rows);
            return sticky(c, e);
        }
    }
    float *x = in->x;
    if (kind == MATMUL_IN_RMSNORM) {
        if (!(x = dbuf_get(c, &c->mm_in, (size_t)n * cols * 4, "normed activations")))
            return sticky(c, e);
        cu_rmsnorm(be, x, in->x, in->norm, n, (int)cols, in->eps);
        in_op = true;
    } else if (kind == MATMUL_IN_SWIGLU) {
        cu_silu_mul(be, in->x, in->x2, (size_t)n * cols);
        in_op = true;
    }
    if (out == MATMUL_OUT_SWIGLU) {
        if (cu_matmul_multi(be, outs, x, n, ts, k, e))
            return -1;
        cu_silu_mul(be, outs[0], outs[1], (size_t)n * (size_t)ts[0]->rows);
        return sticky(c, e);
    }
    if (!add)
        return cu_matmul_multi(be, outs, x, n, ts, k, e);
    bool gemms = true;
    for (int i = 0; i < k; i++)
        gemms = gemms && matmul_is_gemm(c, ts[i], n);
    if (gemms) { /* cuBLAS adds into the outputs itself */
        /* a half copy of the input is for the op after the one that made
         * it: the input op issued here, else the previous op (see half_x) */
        if (in_op)
            c->op_seq++;
        for (int i = 0; i < k; i++)
            if (matmul_x(be, outs[i], x, n, ts[i], true, e))
                return -1;
        return sticky(c, e);
    }
    size_t total = 0;
    for (int i = 0; i < k; i++)
        total += (size_t)n * (size_t)ts[i]->rows;
    float *t = dbuf_get(c, &c->mm_out, total * 4, "matmul products");
    if (!t)
        return sticky(c, e);
    float *tmp[3];
    for (int i = 0; i < k; i++) {
        tmp[i] = t;
        t += (size_t)n * (size_t)ts[i]->rows;
    }
    if (cu_matmul_multi(be, tmp, x, n, ts, k, e))
        return -1;
    for (int i = 0; i < k; i++)
        cu_add(be, outs[i], tmp[i], (size_t)n * (size_t)ts[i]->rows);
    return sticky(c, e);
}

/* ---- decode graphs ---- */

static bool graph_key_eq(const struct step_graph *a, const struct step_graph *b)
{
    return a->owner == b->owner && a->kpool == b->kpool && a->bucket == b->bucket &&
           a->n_seg == b->n_seg;
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

/* Makes h_step/step hold at least cap table entries. */
static int step_reserve(struct cuda_backend *c, int cap)
{
    if (c->h_step && c->step_cap >= cap)
        return 0;
    cudaStreamSynchronize(c->stream);
    graphs_flush(c); /* graphs name the old buffers */
    if (c->h_step)
        cudaFreeHost(c->h_step);
    c->h_step = NULL;
    c->step_cap = 0;
    if (fail_cuda(c, "pinned step record",
                  cudaHostAlloc((void **)&c->h_step, sizeof(int) * (size_t)(cap + 2), 0)) ||
        !dbuf_get(c, &c->step, sizeof(int) * (size_t)(cap + 2), "step record")) {
        c->h_step = NULL;
        return -1;
    }
    c->step_cap = cap;
    return 0;
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

static int cu_step_begin(struct backend *be, const struct backend_step *st, struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    use_device(c);
    if (sticky(c, e))
        return -1;
    if (c->timing) {
        c->t_begin = now_s();
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
    if (!c->graphs || st->n != 1 || !st->logits)
        return 0;
    if (c->eager_decodes < 1 || !c->att_heads) { /* the first decode step warms up */
        c->eager_decodes++;
        return 0;
    }
    const struct kv_seq *seq = st->seq;
    struct step_graph key = {.owner = st->owner, .kpool = st->pool->k,
                             .bucket = table_bucket(seq->n_blocks), .n_seg = 1};
    if (step_reserve(c, key.bucket))
        return sticky(c, e);
    /* The previous step's download waited for its replay, so the record is
     * free to change. */
    c->h_step[0] = st->pos0;
    c->h_step[1] = st->tokens[0];
    memcpy(c->h_step + 2, seq->blocks, sizeof(int) * (size_t)seq->n_blocks);
    struct step_graph *g = graph_find(c, &key);
    if (g) {
        if (fail_cuda(c, "graph launch", cudaGraphLaunch(g->exec, c->stream)))
            return sticky(c, e);
        c->g_rep[0]++;
        return 1;
    }
    /* Size what the recording will use while synchronizing is still allowed. */
    size_t ws = (size_t)c->att_heads * MAX_SPLITS * (size_t)(c->att_hd + 2) * sizeof(float);
    if (!dbuf_get(c, &c->ws, ws, "attention workspace") ||
        !att_counters(c, (size_t)c->att_heads))
        return sticky(c, e);
    if (!capture_begin(c, &key))
        return sticky(c, e);
    if (fail_cuda(c, "copy step record",
                  cudaMemcpyAsync(c->step.p, c->h_step, sizeof(int) * (size_t)(key.bucket + 2),
                                  cudaMemcpyHostToDevice, c->stream))) {
        /* step_end abandons the recording */
    }
    return 0;
}

static int cu_step_end(struct backend *be, int ops_rc, struct err *e)
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
    return 0;
}

static void cu_step_stats(struct backend *be, long recorded[2], long replayed[2])
{
    struct cuda_backend *c = cb(be);
    for (int i = 0; i < 2; i++) {
        recorded[i] = c->g_rec[i];
        replayed[i] = c->g_rep[i];
    }
}

static int cu_kv_dtype(struct backend *be)
{
    return cb(be)->kv_bf16 ? DT_BF16 : DT_F32;
}

static void cu_destroy(struct backend *be)
{
    struct cuda_backend *c = cb(be);
    use_device(c);
    cudaStreamSynchronize(c->stream);
#ifdef CUK_DEC_PROBE
    cuk_dec_probe_report(64);
#endif
#ifdef CUK_GEMV_PROBE
    cuk_gemv_probe_report(300);
#endif
    if (c->timing) {
        static const char *what[] = {"decode", "batched decode", "prefill"};
        for (int b = 0; b < 3; b++) {
            long k = c->t_steps[b] > 0 ? c->t_steps[b] : 1;
            if (!c->t_steps[b])
                continue;
            fprintf(stderr, "%s: timing of %ld %s steps, per step: %.1f us on the GPU before "
                            "the result copy, %.1f us copy, %.1f us host wall (step_begin to "
                            "after the copy), %.1f us host issuing the ops%s",
                    c->name, c->t_steps[b], what[b], 1e3 * c->t_gpu[b] / k,
                    1e3 * c->t_copy[b] / k, 1e3 * c->t_wall[b] / k, 1e3 * c->t_enq[b] / k,
                    b == 2 ? "\n" : "");
            if (b < 2)
                fprintf(stderr, ", %.1f us host between steps (sampling, loop)\n",
                        1e3 * c->t_gap[b] / (c->t_gaps[b] > 0 ? c->t_gaps[b] : 1));
        }
        fprintf(stderr, "%s: decode graphs recorded / replayed: %ld / %ld single, %ld / %ld "
                        "batched\n", c->name, c->g_rec[0], c->g_rep[0], c->g_rec[1], c->g_rep[1]);
        for (int i = 0; i < 3; i++)
            cudaEventDestroy(c->ev[i]);
    }
    for (size_t i = 0; i < c->map_cap; i++) {
        if (c->map[i].mem)
            cudaFree(c->map[i].mem);
        if (c->map[i].mem2)
            cudaFree(c->map[i].mem2);
    }
    free(c->map);
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
    smp_prep_free(c);
    if (c->amr_dev)
        cudaFree(c->amr_dev);
    if (c->amr_host)
        cudaFreeHost(c->amr_host);
    /* Buffers callers did not free (they should have) go with the backend. */
    for (size_t i = 0; i < c->n_allocs; i++)
        cudaFree(c->allocs[i].p);
    free(c->allocs);
    struct dbuf *bufs[] = {&c->ids, &c->table, &c->ws, &c->cnt, &c->dn, &c->xh, &c->wf, &c->invf,
                           &c->step, &c->bat, &c->mm_in, &c->mm_out, &c->smp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        dbuf_free(bufs[i]);
    free(c->tab_host);
    free(c->bat_host);
    free(c->bat_tmp);
    pinned_free(&c->up_ids);
    pinned_free(&c->up_tab);
    pinned_free(&c->up_bat);
    pinned_free(&c->up_smp);
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

static const struct backend_ops cuda_ops = {
    .name = "cuda",
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
    .matmul_fused = cu_matmul_fused,
    .load_weights = cu_load_weights,
    .finish = cu_finish,
    .upload = cu_upload,
    .step_begin = cu_step_begin,
    .step_end = cu_step_end,
    .step_stats = cu_step_stats,
    .mem_info = cu_mem_info,
    .kv_dtype = cu_kv_dtype,
    .mem_bandwidth = cu_mem_bandwidth,
    .argmax_rows = cu_argmax_rows,
    .sample_rows = cu_sample_rows,
};

static int cuda_device_count(struct err *e)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        err_set(e, "no CUDA device found (%s)", cudaGetErrorString(err));
        cudaGetLastError();
        return 0;
    }
    if (n == 0)
        err_set(e, "no CUDA device found (the driver reports none)");
    return n;
}

/* The environment's switches: env_off for those on unless set to "0",
 * env_on for those off unless set to something other than "" or "0". */
static bool env_off(const char *name)
{
    const char *p = getenv(name);
    return p && !strcmp(p, "0");
}

static bool env_on(const char *name)
{
    const char *p = getenv(name);
    return p && *p && strcmp(p, "0") != 0;
}

/* The numeric levers (docs/config.md), read before anything is allocated
 * so that a bad value is the same error with or without a GPU. 0 means
 * unset (gemv_max: -1, since 0 is a value). */
struct cuda_levers {
    long gemv_max, stage_x_max, att_rpw, dec_bps, mma_bps, mma_ks, mma_max_mb, mma_max_x,
        mma_warps, tc_ctas, tc_smem, stage_cols, stage_kb;
};

static int cuda_levers_read(struct cuda_levers *l, struct err *e)
{
    static const long rpw[] = {4, 8}, ks[] = {1, 2, 4, 8, 16}, warps[] = {8, 16};
    *l = (struct cuda_levers){.gemv_max = -1};
    if (env_long("CLLM_CUDA_GEMV_MAX", 0, CUK_GEMV_MAX, &l->gemv_max, e) < 0 ||
        env_long("CLLM_CUDA_STAGE_X_MAX", 1, 1L << 30, &l->stage_x_max, e) < 0 ||
        env_long_of("CLLM_ATT_RPW", rpw, 2, &l->att_rpw, e) < 0 ||
        env_long("CLLM_CUDA_DEC_BPS", 1, 8, &l->dec_bps, e) < 0 ||
        env_long("CLLM_CUDA_MMA_BPS", 1, 2, &l->mma_bps, e) < 0 ||
        env_long_of("CLLM_CUDA_MMA_KS", ks, 5, &l->mma_ks, e) < 0 ||
        env_long("CLLM_CUDA_MMA_MAX_MB", 1, 1L << 20, &l->mma_max_mb, e) < 0 ||
        env_long("CLLM_CUDA_MMA_MAX_X", 1, 1L << 30, &l->mma_max_x, e) < 0 ||
        env_long_of("CLLM_CUDA_MMA_WARPS", warps, 2, &l->mma_warps, e) < 0 ||
        env_long("CLLM_CUDA_TC_CTAS", 1, 2, &l->tc_ctas, e) < 0 ||
        env_long("CLLM_CUDA_TC_SMEM", 1, 227 * 1024, &l->tc_smem, e) < 0 ||
        env_long("CLLM_CUDA_STAGE_COLS", 256, 1L << 16, &l->stage_cols, e) < 0 ||
        env_long("CLLM_CUDA_STAGE_KB", 16, 227, &l->stage_kb, e) < 0)
        return -1;
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
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        err_set(e, "no CUDA device found (%s); use --device cpu",
                err != cudaSuccess ? cudaGetErrorString(err) : "the driver reports none");
        cudaGetLastError();
        return NULL;
    }
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
        cudaHostAlloc((void **)&c->am_host, sizeof(int), 0) != cudaSuccess) {
        err_set(e, "cuda:%d: cannot allocate the argmax buffers", device);
        if (c->am_ws)
            cudaFree(c->am_ws);
        cudaFree(c->blas_ws);
        cublasDestroy(c->blas);
        cudaStreamDestroy(c->stream);
        free(c);
        return NULL;
    }
    c->precise = env_on("CLLM_CUDA_PRECISE");
    /* Rows up to which matmuls use the GEMV kernels (f32 activations) rather
     * than a tensor-core GEMM (activations rounded to bf16/f16). */
    /* 0 (measurement): none, even for one token */
    c->gemv_max_env = lv.gemv_max >= 0;
    c->gemv_max = c->gemv_max_env ? (int)lv.gemv_max : CUK_GEMV_DEFAULT; /* see cu_load_weights */
    /* measurement and tests: another bound on the x tiles (gemv_rows) */
    c->stage_x_max = lv.stage_x_max ? (size_t)lv.stage_x_max : STAGED_X_BYTES;
    c->half_type = -1;
    c->att_rpw = (int)lv.att_rpw; /* measurement: the tiled attention's rows per warp */
    c->att_mma = !env_off("CLLM_CUDA_ATT_MMA");
    /* measurement: decode attention blocks per SM */
    c->dec_blocks = c->n_sms * (lv.dec_bps ? (int)lv.dec_bps : CUK_DEC_BLOCKS_PER_SM);
    cuk_set_pdl(hopper && !env_off("CLLM_CUDA_PDL"));
    c->kv_bf16 = !c->precise && kv_dt == DT_BF16;
    c->graphs = !env_off("CLLM_COMPILED_DECODE");
    c->bgraphs = !env_off("CLLM_COMPILED_BATCH");
    c->fuse = !env_off("CLLM_CUDA_FUSE");
    c->rope_att = !env_off("CLLM_CUDA_ROPE_ATT");
    c->swiglu_out = !env_off("CLLM_CUDA_SWIGLU_OUT");
    if (!env_off("CLLM_CUDA_LT") && (c->lt_plans = calloc(LT_PLANS, sizeof *c->lt_plans)) &&
        cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS)
        c->lt = NULL; /* cublasGemmEx for every GEMM */
    c->gemm_pair = !env_off("CLLM_CUDA_GEMM_PAIR");
    c->gemv_staged = hopper && !env_off("CLLM_CUDA_GEMV_STAGED");
    c->smp_prep = !env_off("CLLM_CUDA_SAMPLE_PREP");
    /* mma.sync on bf16/f16: compute capability 8.0 and newer, in code
     * built for it (its body is compiled out below sm_80, like hopper's) */
    c->gemv_mma = prop.major >= 8 && (CLLM_CUDA_ARCH_MAX == 0 || CLLM_CUDA_ARCH_MAX >= 80) &&
                  !env_off("CLLM_CUDA_GEMV_MMA");
    c->mma.n_sms = c->n_sms;
    c->mma.smem_max = (int)prop.sharedMemPerBlockOptin;
    c->mma.smem_sm = (int)prop.sharedMemPerMultiprocessor;
    /* measurement: its blocks per SM, slices per tile, warps (0: automatic) */
    c->mma.blocks_per_sm = (int)lv.mma_bps;
    c->mma.ks = (int)lv.mma_ks;
    c->mma.warps = (int)lv.mma_warps;
    c->mma_max_bytes = (lv.mma_max_mb ? (size_t)lv.mma_max_mb : MMA_MAX_MB) << 20;
    c->mma_max_x = lv.mma_max_x ? (size_t)lv.mma_max_x : MMA_MAX_X;
    c->mma.stage_regs = env_on("CLLM_CUDA_MMA_STAGE_REGS"); /* measurement */
    c->defer_merge = env_off("CLLM_CUDA_DEFER_MERGE")  ? 0
                     : env_on("CLLM_CUDA_DEFER_MERGE") ? 1
                                                       : -1;
    /* The tensor-core GEMM's partial sums and counters (zeroed once), when
     * asked for; a failed allocation leaves those GEMMs to cuBLAS. */
    const char *p = getenv("CLLM_CUDA_GEMM_TC");
    if (hopper && p && !strcmp(p, "1")) { /* opt-in: "1" only */
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
    c->timing = env_on("CLLM_CUDA_TIMING");
    for (int i = 0; i < 3 && c->timing; i++)
        if (cudaEventCreate(&c->ev[i]) != cudaSuccess)
            c->timing = false;
    c->ops = cuda_ops;
    if (env_off("CLLM_CUDA_SAMPLE")) /* sampled rows go to the host's sampler */
        c->ops.sample_rows = NULL;
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
