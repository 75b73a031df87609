/* cuda_internal.h - what the CUDA backend's host files share: its state
 * (struct cuda_backend), its limits, and what one file defines for the
 * others (backend_cuda.c's file comment says how the backend works). Only
 * src/backend/cuda's C files include it. */
#ifndef CLLM_BACKEND_CUDA_INTERNAL_H
#define CLLM_BACKEND_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/qmma_rule.h"
#include "model/model.h"

#ifndef CLLM_CUDA_ARCH_MIN
#define CLLM_CUDA_ARCH_MIN 90 /* CMake passes the lowest of CMAKE_CUDA_ARCHITECTURES */
#endif
#ifndef CLLM_CUDA_ARCH_MAX
#define CLLM_CUDA_ARCH_MAX 90 /* and the highest (0: "native" or "all", no number) */
#endif

/* Most bytes of widened weights (f32 or bf16) one chunk of the widening
 * path may take (CLLM_CUDA_WIDEN_MB). */
#define WIDEN_CHUNK_BYTES ((size_t)256 << 20)
/* Most tokens a matmul over GGUF's quantized weights runs as their GEMV
 * (one launch) rather than widening the weights for a GEMM (without bf16
 * copies: WIDE_FROM_N). The GEMV's products, not its bytes, bound it
 * past a token or two (H100, 8B Q4_K: a step of 8 tokens 16 ms against
 * 2.5 for one in session 56's k_gemv_qdot, 12.4 ms staged), and the
 * widened GEMM costs ~17 ms a step from 8 tokens on: 64 streams decoded
 * at 519 tok/s through GEMVs of 8 tokens a launch, at 3,392 through the
 * GEMM (docs/benchmarks.md, session 56). It was 64, from counting bytes
 * alone. */
#define QUANT_GEMV_MAX_N 8
/* Fewest tokens of a step that multiply the quantized matrices' bf16
 * copies (where made: CLLM_CUDA_WIDE_COPY) rather than the quantized
 * blocks. H100, aggregate tok/s of 3 / 4 / 6 / 8 streams, the staged
 * quantized GEMV against the copies: 8B Q4_K 700 / 768 / 844 / 647
 * against 444 / 598 / 877 / 1,163; 0.6B Q4_K 2,207 / 2,446 / 2,747 /
 * 2,926 against 2,457 / 3,243 / 4,567 / 5,830 (docs/benchmarks.md,
 * session 57). 5 is the 8B's crossover, and larger models read more
 * bytes still; the 0.6B gives up 9-23 % at 3-4 streams. */
#define WIDE_FROM_N 5
/* The same for launches the tensor-core GEMV takes from the copies (at
 * most mma_max_bytes of them: a 0.6B's every matrix but the LM head, an
 * 8B's q/k/v and o). H100, 3 / 4 streams, from 3 against from 5: 0.6B
 * Q4_K 2,207 / 2,454 -> 2,601 / 3,413 tok/s, an 8-layer 8B Q4_K 2,520 /
 * 2,739 -> 2,310 / 2,742 (docs/benchmarks.md, session 57): 4. */
#define WIDE_SMALL_FROM_N 4
/* Most tokens the staged quantized GEMV takes (CLLM_CUDA_GQ_STAGED_MAX_N;
 * past them, or where it declines the shape, k_gemv_qdot). H100, no
 * copies, 3 / 4 / 6 / 8 streams against 2 (k_gemv_qdot from 3): 8B Q4_K
 * 473 / 411 / 483 / 494 -> 700 / 768 / 844 / 872 tok/s (at 8, the down
 * projection's x, 14,336 columns, in halves: gqs_split), 0.6B 1,502 /
 * 1,588 / 1,733 / 1,836 -> 2,203 / 2,446 / 2,747 / 2,948. */
#define GQ_STAGED_MAX_N 8
#define MAX_GRAPHS 32
#define SEEN_KEYS 16 /* batched decode shapes remembered from one eager step */
/* Most tokens a step record carries (a few tokens' step, cu_step_begin;
 * the tensor-core decode kernel takes at most 16 queries) */
#define REC_MAX_TOKENS 16
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
    int n_tok;                 /* n_seg 1: its tokens (> 1: a few tokens' step, see cu_step_begin) */
    bool rows;                 /* such a step ends with every row's logits, not the last's */
    bool pick;                 /* its head is head_pick's (backend_step.pick_k 1) */
    int par;                   /* n_seg 1: which half of h_step its record is copied from */
    struct attn_args att;      /* batched: the attention geometry its metadata is built for */
    cudaGraphExec_t exec;
};

struct wentry {
    const void *host;      /* key: the tensor's host data pointer */
    struct cuk_weight w;   /* device copy */
    void *mem, *mem2;      /* allocations (quants and scales for Q8_0) */
    struct cuk_weight wide; /* a quantized matrix's bf16 copy (CLLM_CUDA_WIDE_COPY;
                             * data NULL: none), which steps of wide_from
                             * tokens or more multiply instead (mm_weights) */
};

/* The map entry whose device copy w is (dev_weight's result, not a bf16
 * copy): its other fields (the bf16 copy) without a second lookup. */
static inline const struct wentry *wentry_of(const struct cuk_weight *w)
{
    return (const struct wentry *)(const void *)((const char *)w - offsetof(struct wentry, w));
}

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
    bool split_dtypes; /* a fused op over matrices of two dtypes as a fused
                        * launch a dtype (CLLM_CUDA_SPLIT_DTYPES != 0) */
    bool dec_cluster;  /* a one-sequence RoPE decode step merges its key splits in
                        * a thread-block cluster (CLLM_CUDA_DEC_CLUSTER) */
    int dec_cluster_tiles; /* and at most CUK_DEC_CLUSTER_MAX splits when that
                            * leaves a block no more key tiles than this
                            * (CLLM_CUDA_DEC_CLUSTER_TILES) */
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
    bool stage_big;    /* batched steps' launches too big for the tensor-core
                        * GEMV go to the staged GEMV, not cuBLAS, where their
                        * x tiles fit (CLLM_CUDA_STAGE_BIG != 0) */
    bool gemv_mma;     /* batched steps past the GEMVs' rows go to the
                        * tensor-core GEMV (cuk_gemv_mma) where it takes the
                        * shape, not cuBLAS (CLLM_CUDA_GEMV_MMA != 0) */
    struct cuk_mma_cfg mma; /* the device as cuk_gemv_mma needs it */
    struct cuk_gq_cfg gq;   /* the device as cuk_gemv_quant needs it */
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
    bool mega;         /* one-token decode steps of one sequence run every layer
                        * in one persistent launch where it takes the model
                        * (cu_decode_layers; CLLM_CUDA_MEGA) */
    /* its setup, made for mega_model on the first step that asks: mega_ok
     * 1 taken, 0 not (mega_why says why), -1 not set up yet */
    const struct model *mega_model;
    int mega_ok;
    char mega_why[160];
    struct cuk_mega mega_args;
    struct dbuf mega_buf; /* step counter, layer table, workspace, probe record */
    /* CLLM_CUDA_MEGA_PROBE=1 (a measurement; eager steps only, each then
     * waited for): the kernel's record (after mega_buf's workspace), its
     * host copy, and per phase of a layer the sums over steps and middle
     * layers that mega_report prints when the backend goes */
    bool mega_probe;
    unsigned *mega_rec;
    double mega_sum[6][10], mega_late[5];
    double *mega_tr; /* per block and trace event: ns, cycles from its first, summed */
    double *mega_skew; /* per block: its first event's ns after block 0's, summed */
    unsigned *mega_trid; /* per block and trace event: its id, as last recorded */
    long mega_trn;       /* steps traced */
    double *mega_lag;    /* per block: how much later than the median it sent, summed */
    /* per phase: the latest sender's sent, input in, rows begun, each
     * after the median block's, and its and the median's rows begun to
     * sent, summed over layers (ns) */
    double mega_lat[5][5];
    unsigned *mega_sm;   /* per block: its SM (the trace's event 92) */
    long mega_n;

    struct wentry *map; /* open addressing, capacity map_cap (power of 2) */
    size_t map_cap, map_n;
    size_t weight_bytes;
    /* head_pick (unless CLLM_CUDA_HEAD_SCREEN=0): the LM head's int8 copy in one
     * allocation, and the host pointer of the head it was made from */
    struct cuk_head_copy head;
    void *head_mem;
    const void *head_host;

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
    /* The quantized matrices' dtype (layer 0's q), whose prompts widen
     * them to bf16 for a GEMM with x rounded to bf16; -1: none. Such a
     * model's norms and SwiGLU make bf16 copies (half_out) as a bf16
     * model's do. */
    int quant_type;
    int model_dim, ffn_dim; /* of the loaded model: inputs of q/k/v, gate/up (model_dim) and down (ffn_dim) */
    int gemv_max;      /* n <= gemv_max rows: GEMV kernels, else GEMM (see gemv_rows) */
    size_t stage_x_max; /* from CUK_GEMV_DEFAULT rows: most bytes of x tiles a GEMV takes */
    size_t widen_bytes; /* most bytes of one chunk of widened weights (WIDEN_CHUNK_BYTES) */
    /* CLLM_CUDA_WIDE_COPY: the quantized matrices' bf16 copies made at
     * load (1, before the KV pool), from the memory the pool leaves
     * (-1, the default: cu_load_spare) or never (0) */
    int wide_copy;
    size_t wide_bytes;  /* their bytes (0: none made) */
    int wide_from;      /* fewest tokens that multiply the copies (CLLM_CUDA_WIDE_FROM) */
    int wide_small_from; /* the same where the tensor-core GEMV takes them (CLLM_CUDA_WIDE_FROM_SMALL) */
    bool qmma;          /* quantized matrices on the tensor-core GEMV (CLLM_CUDA_QMMA) */
    int qmma_from;      /* from that many tokens (CLLM_CUDA_QMMA_FROM; 0: qmma_rule.h's
                         * rule by columns, cu_qmma_from) */
    int qmma_window;    /* most columns a window of its where x is too wide to
                         * stage whole (-1: as many as fit); set
                         * (CLLM_CUDA_QMMA_WINDOW, for measurement and tests),
                         * also where it fits; 0: runs of tokens instead */
    bool gemv_max_env; /* set by CLLM_CUDA_GEMV_MAX, not by the model's shape */
    int att_rpw;       /* CLLM_ATT_RPW (0: automatic) */
    int att_mma;       /* prefill attention on tensor cores (CLLM_CUDA_ATT_MMA=0: off) */
    int att_pf_mt;     /* its blocks' 16-row slices a warp (CLLM_CUDA_PF_MT; 0: by length) */
    int dec_blocks;    /* decode attention blocks the GPU runs at once (key splits) */
    struct pinned up_ids, up_tab, up_bat, up_smp; /* staging of ids, block table, batch
                                                   * metadata, sampling parameters */
    struct dbuf smp;   /* device copy of the sampling parameters (cu_sample_rows) */
    struct dbuf rl;    /* cu_row_logprobs: the picked ids, then the rows' statistics */
    struct pinned up_rl;
    struct cuk_row_logprobs *rl_host; /* pinned: the statistics copied back */
    int rl_cap;
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
    bool rgraphs;      /* steps of a few tokens of one sequence too (off after a failed
                        * recording) */
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
    /* one-sequence RoPE decode attention launches of several key splits,
     * as issued (a graph's once), by where the splits were merged: in a
     * thread-block cluster, by the o projection, through global memory in
     * the kernel (CLLM_CUDA_TIMING prints them) */
    long att_merges[3];
    int att_heads, att_hd;
    /* queries the tensor-core decode kernel takes in one launch (the last
     * attention op's geometry; 0: none seen): the most tokens of a few
     * tokens' step that is recorded (its attention splits by the bucket
     * there) */
    int att_dec_rows;
    int rec_n;         /* tokens of the step record being built: ids at [1, 1 + rec_n),
                        * the block table after them */
    struct step_graph cache[MAX_GRAPHS];
    int n_graphs;
    struct step_graph rec; /* key of the graph being recorded */
    /* pinned, two halves of step_ints, each [pos0, ids[rec_n], table[cap]]:
     * single decodes alternate between them, so a step's record can be
     * written while the step before it is still queued (forward_pipe_issue);
     * rec_ev[h] marks the end of the last step that read half h */
    int *h_step;
    size_t step_ints;
    int rec_par;       /* the half the next single decode uses */
    cudaEvent_t rec_ev[2];
    bool rec_pending[2];
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
    int *am_host;      /* pinned, mapped: the id, written by the argmax; [1 + slot]: argmax_async's */
    int *am_host_dev;  /* am_host as the device addresses it (mapped) */
    cudaEvent_t am_ev[2];  /* argmax_async: the argmax writing slot i is done */
    bool am_queued[2];     /* an id for slot i awaits argmax_take */
    long steps_ahead;      /* argmax_async calls (CLLM_CUDA_TIMING prints them) */
    int *amr_host;           /* cu_argmax_rows, cu_sample_rows: the ids, pinned and mapped
                              * (the kernels write them there) */
    int *amr_host_dev;       /* amr_host as the device addresses it */
    int amr_cap;             /* rows amr_host and amr_ws hold */
    void *amr_ws;            /* device: cuk_argmax_rows's workspace for amr_cap rows */

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

/* The fewest tokens of a step the tensor-core GEMV takes for K-quant
 * matrices of cols columns: CLLM_CUDA_QMMA_FROM where set, else the rule
 * of qmma_rule.h (the one test_cuda reads). */
static inline int cu_qmma_from(const struct cuda_backend *c, int cols)
{
    return c->qmma_from > 0 ? c->qmma_from : qmma_from_n(cols);
}

/* A batch step's attention plan (bat_plan): what its launches need. */
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

/* ---- backend_cuda.c: failures, work buffers, host-to-device copies ---- */


static inline struct cuda_backend *cb(struct backend *be) { return be->impl; }

/* Makes c's GPU the calling thread's current device (the thread calling
 * an op need not be the one that created the backend). */
static inline void use_device(struct cuda_backend *c) { cudaSetDevice(c->device); }

/* Records the first failure of a void op; returns true when err != success. */
bool fail_cuda(struct cuda_backend *c, const char *what, cudaError_t err);

/* fail_cuda for a failure that is not a CUDA error (msg as it is). */
void fail_msg(struct cuda_backend *c, const char *msg);

/* The entry of every op that issues work: a merge the decode attention
 * left to the o projection is completed first (c->pend; cu_matmul_fused,
 * which may consume it, settles it itself), and the op counter moves on
 * (see half_x). */
struct cuda_backend *op_begin(struct backend *be);

/* Where cuk_argmax leaves its id (device): the end of its workspace;
 * BACKEND_TOKEN_LAST reads it. */
static inline int *am_last(struct cuda_backend *c)
{
    return (int *)((char *)c->am_ws + CUK_ARGMAX_WS_BYTES - sizeof(int));
}

/* -1 with the first kept failure in e, 0 when there is none. */
int sticky(struct cuda_backend *c, struct err *e);

/* Device bytes the backend's own work buffers hold (mem_info's scratch). */
size_t dbuf_bytes(const struct cuda_backend *c);

/* Drops every recorded decode graph (before memory they may reference is
 * freed or reallocated). */
void graphs_flush(struct cuda_backend *c);

/* Grows a work buffer to at least bytes (contents are not kept). */
void *dbuf_get(struct cuda_backend *c, struct dbuf *b, size_t bytes, const char *what);

/* Frees a work buffer and leaves it empty. */
void dbuf_free(struct dbuf *b);

/* Copies bytes of host memory to dst on the stream through pin: waits for
 * pin's previous copy only (usually long done), never for the stream. */
bool upload_async(struct cuda_backend *c, struct pinned *pin, void *dst, const void *src,
                  size_t bytes, const char *what);

/* ---- cuda_attention.c: what the attention ops share ---- */

/* True when the pool was made for this KV head geometry: its layout
 * (cuk_kv_row) depends on it, and attn_geom takes it from the pool. */
bool pool_takes(const struct kv_pool *pool, int n_kv_heads, int head_dim);

/* The geometry of n queries at positions pos0.. over layer `layer` of
 * pool, as the kernels see it (the pool's layout, the device's launch
 * choices); n_heads, window and scale are the caller's to set. */
struct cuk_attn attn_geom(const struct cuda_backend *c, const struct kv_pool *pool, int layer,
                          int n, int pos0);

/* The device copy of seq's block table (the step record's while
 * recording), copied again only when it changed; NULL with the failure
 * kept. */
const int *dev_table(struct cuda_backend *c, const struct kv_seq *seq);

/* The device copy of the RoPE frequencies (half floats); NULL with the
 * failure kept. */
const float *dev_invf(struct cuda_backend *c, const float *inv_freq, int half);

/* ---- cuda_weights.c: the weight map ---- */

/* The device copy of the tensor or vector whose host data is host; NULL
 * when it was not uploaded. */
struct wentry *map_find(const struct cuda_backend *c, const void *host);

/* The device copy of a norm or bias vector; NULL with the failure kept
 * (naming op) when it was not uploaded. */
const float *dev_vec(struct cuda_backend *c, const float *host, const char *op);

/* ---- cuda_memory.c: the sampler's buffers ---- */

/* Frees the device sampler's fast-path buffers (cu_sample_rows makes them
 * again when needed). */
void smp_prep_free(struct cuda_backend *c);

/* ---- cuda_matmul.c: weights as the ops see them, ids, cuBLASLt plans ---- */

/* dev_vec for a weight matrix (its cuk_weight view). */
const struct cuk_weight *dev_weight(struct cuda_backend *c, const struct tensor *t,
                                    const char *op);

/* The device copy of n token ids (c->ids), copied on the stream; NULL
 * with the failure kept. */
const int *ids_upload(struct cuda_backend *c, const int *ids, int n);

/* Destroys what a plan holds; its key stays. */
void lt_plan_clear(struct lt_plan *pl);

/* ---- cuda_attention.c: block tables, split counters, the deferred merge, batch plans ---- */

/* Block-table entries a decode graph carries: a power of two >= 64. */
int table_bucket(int n_blocks);

/* The split counters of count (query, head) rows; zeroed when (re)made,
 * and the attention kernels leave them zero. */
unsigned *att_counters(struct cuda_backend *c, size_t count);

/* Completes a key-split merge the decode attention left to the o
 * projection (c->pend) when another op comes first. Every op that reads
 * or writes device memory calls it before its work: through op_begin, or
 * itself where the op leaves the op counter alone (download, finish,
 * load_weights, step_end). */
void pend_settle(struct cuda_backend *c);

/* The o projection of a deferred merge (c->pend), out += merged . W^T in
 * one staged GEMV that merges as it stages x; cudaErrorNotSupported when
 * that GEMV does not take the shape (the caller settles instead). */
cudaError_t pend_o_gemv(struct cuda_backend *c, float *out, const struct tensor *t);

/* Plans the attention of a batch step's segments and builds its metadata
 * in c->bat_tmp. bucket > 0 (a batched decode step, see batch_step_begin):
 * every block table is padded to bucket entries and every key range split
 * by the bucket's capacity rather than by its length, so the metadata's
 * layout and the launches' grids depend only on (segments, bucket): a
 * recorded step replays with new positions and tables, and eager steps
 * split alike, so replays are bit-identical to them. */
int bat_plan(struct cuda_backend *c, const struct batch_seg *segs, int n_seg,
             const struct kv_pool *pool, int layer, const struct attn_args *a, int bucket,
             struct bat_plan *p, struct err *e);

/* The workspace and split counters a plan needs (*ws, *cnt: NULL where it
 * needs none), and its metadata on the device (bat_upload); false with
 * the failure kept. */
bool bat_buffers(struct cuda_backend *c, const struct bat_plan *p, float **ws,
                 unsigned **cnt);

/* ---- the op set's entries (backend.h has their contracts), for
 * backend_cuda.c's op table, by the file that defines them ---- */

/* cuda_weights.c */
int cu_load_weights(struct backend *be, const struct model *m, struct err *e);
int cu_load_spare(struct backend *be, const struct model *m, size_t spare, struct err *e);
/* cuda_memory.c */
void *cu_alloc(struct backend *be, size_t bytes);
void cu_free(struct backend *be, void *p);
void cu_upload(struct backend *be, void *dst, const void *src, size_t bytes);
int cu_kv_block_copy(struct backend *be, const struct kv_pool *p, int block, void *k, void *v,
                     bool to_host, struct err *e);
void cu_download(struct backend *be, float *dst, const float *src, size_t n);
int cu_argmax(struct backend *be, int *out, const float *x, int n, struct err *e);
int cu_argmax_async(struct backend *be, const float *x, int n, int slot, struct err *e);
int cu_argmax_take(struct backend *be, int slot, int *out, struct err *e);
int cu_argmax_rows(struct backend *be, int *out, const float *x, int rows, int n,
                   struct err *e);
int cu_sample_rows(struct backend *be, int *out, const float *x, int rows, int n,
                   const struct sample_params *p, struct err *e);
int cu_row_logprobs(struct backend *be, struct token_logprobs *lp, const float *x, int rows,
                    int n, const int *pick, int k, struct err *e);
int cu_finish(struct backend *be, struct err *e);
void cu_mem_info(struct backend *be, struct backend_mem *out);
/* cuda_matmul.c */
void cu_embed(struct backend *be, float *out, const struct tensor *t, const int *ids, int n);
int cu_matmul(struct backend *be, float *out, const float *x, int n, const struct tensor *t,
              struct err *e);
int cu_matmul_multi(struct backend *be, float *const *outs, const float *x, int n,
                    const struct tensor *const *ts, int k, struct err *e);
int cu_matmul_fused(struct backend *be, float *const *outs, const struct matmul_in *in,
                    int n, const struct tensor *const *ts, int k, enum matmul_out out,
                    struct err *e);
void cu_add_rmsnorm(struct backend *be, float *out, float *x, const float *y,
                    const float *w, int n, int dim, float eps);
void cu_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n,
                int dim, float eps);
void cu_add_bias(struct backend *be, float *x, const float *b, int n, int dim);
void cu_silu_mul(struct backend *be, float *g, const float *u, size_t n);
void cu_add(struct backend *be, float *x, const float *y, size_t n);
/* cuda_attention.c */
void cu_rope(struct backend *be, float *x, int n, int n_heads, int head_dim, int pos0,
             const float *inv_freq, bool interleaved);
void cu_kv_store(struct backend *be, struct kv_pool *pool, const struct kv_seq *seq,
                 int layer, const float *k, const float *v, int n, int pos0);
void cu_rope_kv_store(struct backend *be, float *q, float *k, const float *v, int n,
                      int n_heads, int n_kv_heads, int head_dim, int pos0,
                      const float *inv_freq, bool interleaved, const struct qk_norm *norm,
                      struct kv_pool *pool, const struct kv_seq *seq, int layer);
int cu_attention(struct backend *be, float *out, const float *q, const struct kv_pool *pool,
                 const struct kv_seq *seq, int layer, const struct attn_args *a,
                 struct err *e);
int cu_rope_kv_attention(struct backend *be, float *out, float *q, float *k,
                         const float *v, const float *inv_freq, bool interleaved,
                         const struct qk_norm *norm, struct kv_pool *pool,
                         const struct kv_seq *seq, int layer, const struct attn_args *a,
                         struct err *e);
int cu_rope_kv_attention_batch(struct backend *be, float *out, float *q, float *k,
                               const float *v, const struct batch_seg *segs, int n_seg,
                               const float *inv_freq, bool interleaved,
                               const struct qk_norm *norm, struct kv_pool *pool,
                               int layer, const struct attn_args *a, struct err *e);
/* cuda_mega.c; mega_report prints the probe's sums (CLLM_CUDA_MEGA_PROBE) */
void mega_report(struct cuda_backend *c);
int cu_decode_layers(struct backend *be, const struct model *m, float *x, struct kv_pool *pool,
                     const struct kv_seq *seq, int pos, const float *inv_freq, struct err *e);
/* cuda_graphs.c */
/* cuda_head.c: the device bytes the LM head's int8 copy takes (0: not
 * made), making it after the weights are loaded, freeing it, the op. */
size_t cu_head_bytes(const struct cuda_backend *c, const struct model *m);
int cu_head_load(struct cuda_backend *c, const struct model *m, struct err *e);
void cu_head_free(struct cuda_backend *c);
int cu_head_pick(struct backend *be, float *logits, const float *x, const struct tensor *head,
                 int k, struct err *e);
int cu_step_begin(struct backend *be, const struct backend_step *st, struct err *e);
int cu_step_end(struct backend *be, int ops_rc, struct err *e);
void cu_step_stats(struct backend *be, long recorded[2], long replayed[2]);
int cu_attention_stats(struct backend *be, long merges[3]);

#endif
