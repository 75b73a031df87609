/* backend.h - the op set model code is written against. A backend (CPU,
 * CUDA) implements every op; model/ never knows which one runs.
 * Activation pointers are backend memory (host memory for the CPU backend,
 * device memory for CUDA), obtained from ops->alloc. Weight tensors and
 * norm/bias vectors are passed as the host pointers of struct model; a
 * backend whose memory is not the host's uploads them once in
 * ops->load_weights and finds its copy by that host pointer. */
#ifndef CLLM_BACKEND_BACKEND_H
#define CLLM_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "kv/kv_cache.h"
#include "model/tensor.h"

struct backend;
struct model;

/* Memory a device backend holds, for the allocation plan printed at load. */
struct backend_mem {
    size_t weights;      /* bytes of weights uploaded by load_weights */
    size_t allocated;    /* bytes handed out by alloc (activations, KV) */
    size_t scratch;      /* bytes of the backend's own work buffers */
    size_t dev_free, dev_total;
    char device[128];    /* "cuda:0 NVIDIA H200" */
};

/* Geometry of one attention call: n query tokens of one sequence at
 * positions pos0 .. pos0+n-1, attending causally to the sequence's cache. */
struct attn_args {
    int n, pos0;
    int n_heads, n_kv_heads, head_dim;
    int sliding_window; /* 0 = unlimited */
    float scale;        /* usually 1/sqrt(head_dim) */
    /* The caller's next op on this backend is matmul_fused of this call's
     * out (MATMUL_IN_X, MATMUL_OUT_ADD, the same rows: the o projection):
     * the backend may leave the end of the attention to it (the CUDA
     * backend: the key-split merge, done as that GEMV stages its input).
     * Any other op first completes it. Only the rope_kv_attention op uses it. */
    bool o_next;
};

/* One sequence's rows of a multi-sequence step. */
struct batch_seg {
    const struct kv_seq *seq;
    int n, pos0;
};

/* Per-head RMSNorm of q and k before RoPE (Qwen3's q_norm/k_norm):
 * weights of head_dim floats (host pointers of struct model; either may be
 * NULL: that one is not normalized). */
struct qk_norm {
    const float *q, *k;
    float eps;
};

/* The input rows of matmul_fused: x itself, or what the op that comes
 * before the matmul in a layer (RMSNorm, SwiGLU) makes of it. */
enum matmul_in_kind {
    MATMUL_IN_X,       /* x as it is */
    MATMUL_IN_RMSNORM, /* rmsnorm(x) with norm (cols floats, a host pointer of
                        * struct model) and eps */
    MATMUL_IN_SWIGLU   /* silu(x) * x2; x may be left holding it (silu_mul's
                        * in-place result) or as it was */
};
/* What matmul_fused does with its products. */
enum matmul_out {
    MATMUL_OUT_STORE, /* outs[i] = in . W_i^T */
    MATMUL_OUT_ADD,   /* outs[i] += in . W_i^T (the residual add) */
    MATMUL_OUT_SWIGLU /* k = 2 (gate, up) of equal rows: outs[0] =
                       * silu(in . W_0^T) * (in . W_1^T); outs[1] is
                       * scratch (left holding the up product or not) */
};
struct matmul_in {
    enum matmul_in_kind kind;
    float *x;         /* [n][cols] */
    const float *x2;  /* MATMUL_IN_SWIGLU: [n][cols] */
    const float *norm;
    float eps;
};

/* One forward step, as model/forward.c issues it. */
struct backend_step {
    const void *owner;          /* the forward state whose buffers the ops use */
    int n, pos0;                /* tokens and the position of the first */
    int n_seg;                  /* sequences in the step (n == n_seg: all decodes) */
    const int *tokens;          /* host, n ids */
    const struct kv_pool *pool;
    const struct kv_seq *seq;   /* the first segment's sequence */
    const struct batch_seg *segs; /* n_seg > 1: the segments, as the ops get them */
    bool logits;                /* one segment: ends with the logits of its last row */
    /* with logits: that row serves only a pick among its pick_k largest
     * logits (1: greedy; 0: the row serves more), so the step may use
     * head_pick (a backend that records steps keys them on it) */
    int pick_k;
    /* n_seg > 1 one-token segments that all want their logits, which the
     * step ends with in segment order (n_seg rows; a batched decode step):
     * a shape the backend may record and replay like a single decode. */
    bool decodes;
    /* One segment that ends with the logits of every row (a speculative
     * step's verification). With few tokens, this and a logits step of
     * one segment are shapes the backend may record and replay too (the
     * CUDA backend: as many as its decode attention takes, which splits
     * by the block-table bucket as a decode does). */
    bool rows;
};

/* How one row of a step's logits becomes a token on the device
 * (sample_rows): the sampler's parameters (engine/sampler.h) and the
 * request's uniform draw u in [0, 1). temperature <= 0 asks for the argmax. */
struct sample_params {
    float temperature; /* <= 0: greedy */
    int top_k;         /* <= 0: off */
    float top_p;       /* >= 1: off */
    float min_p;       /* <= 0: off */
    double u;
};

#define LOGPROBS_TOP_MAX 20 /* top_logprobs' cap (OpenAI's) */

/* A generated token's log-probability and the most likely alternatives,
 * from the log-softmax of the model's logits row (row_logprobs, and
 * engine/logits.h on the host). */
struct token_logprobs {
    float logprob;
    int n_top;                    /* larger first, the lower id on ties */
    int top_id[LOGPROBS_TOP_MAX];
    float top_lp[LOGPROBS_TOP_MAX];
};

struct backend_ops {
    const char *name;
    /* The version of the backend's K/V block layout: the SSD tier's files
     * of another version are not read. Bump it when the layout changes. */
    int kv_layout;
    void (*destroy)(struct backend *be);
    void *(*alloc)(struct backend *be, size_t bytes);
    void (*free)(struct backend *be, void *p);
    /* Copies n floats of backend memory to the host. */
    void (*download)(struct backend *be, float *dst, const float *src, size_t n);

    /* out[i][:] = row ids[i] of table (any dtype) as f32; ids (host) may
     * hold BACKEND_TOKEN_LAST on a backend with argmax_async. */
    void (*embed)(struct backend *be, float *out, const struct tensor *table, const int *ids, int n);
    /* out[n][w->rows] = x[n][w->cols] . W^T */
    int (*matmul)(struct backend *be, float *out, const float *x, int n, const struct tensor *w,
                  struct err *e);
    /* Row-wise RMSNorm of n rows of dim: out = x / rms(x) * w (w is f32). */
    void (*rmsnorm)(struct backend *be, float *out, const float *x, const float *w, int n, int dim,
                    float eps);
    /* x[n][dim] += b[dim] */
    void (*add_bias)(struct backend *be, float *x, const float *b, int n, int dim);
    /* Rotates n rows of n_heads*head_dim in place; position of row i is
     * pos0+i; inv_freq has head_dim/2 entries (scaling already applied). */
    void (*rope)(struct backend *be, float *x, int n, int n_heads, int head_dim, int pos0,
                 const float *inv_freq, bool interleaved);
    /* Writes k/v rows [n][kv_dim] for positions pos0.. into the cache. */
    void (*kv_store)(struct backend *be, struct kv_pool *pool, const struct kv_seq *seq, int layer,
                     const float *k, const float *v, int n, int pos0);
    /* out[n][n_heads*head_dim] = softmax(q k^T * scale) v over the cache. */
    int (*attention)(struct backend *be, float *out, const float *q, const struct kv_pool *pool,
                     const struct kv_seq *seq, int layer, const struct attn_args *a, struct err *e);
    /* gate[i] = silu(gate[i]) * up[i] */
    void (*silu_mul)(struct backend *be, float *gate, const float *up, size_t n);
    /* x[i] += y[i] */
    void (*add)(struct backend *be, float *x, const float *y, size_t n);

    /* Optional fused forms (NULL: model code issues the plain ops; results
     * are the same). outs[i] = x . W_i^T for k <= 3 weights of the same
     * cols (q/k/v, gate/up): */
    int (*matmul_multi)(struct backend *be, float *const *outs, const float *x, int n,
                        const struct tensor *const *ws, int k, struct err *e);
    /* x += y, then out = rmsnorm(x) (out may equal y, not x): */
    void (*add_rmsnorm)(struct backend *be, float *out, float *x, const float *y, const float *w,
                        int n, int dim, float eps);

    /* With norm (NULL: none): rmsnorm of each head of q with norm->q and of
     * k with norm->k (rows of head_dim, in place); then rope(q), rope(k),
     * then kv_store(k, v), as those ops: */
    void (*rope_kv_store)(struct backend *be, float *q, float *k, const float *v, int n,
                          int n_heads, int n_kv_heads, int head_dim, int pos0,
                          const float *inv_freq, bool interleaved, const struct qk_norm *norm,
                          struct kv_pool *pool, const struct kv_seq *seq, int layer);

    /* rope_kv_store (with norm) then attention, for one sequence, with the
     * same results; q and k are scratch afterwards (rotated or not). */
    int (*rope_kv_attention)(struct backend *be, float *out, float *q, float *k, const float *v,
                             const float *inv_freq, bool interleaved, const struct qk_norm *norm,
                             struct kv_pool *pool, const struct kv_seq *seq, int layer,
                             const struct attn_args *a, struct err *e);

    /* Several sequences of one step: segment s is rows segs[s].n of the
     * concatenated q/k/v/out, at positions segs[s].pos0.. of segs[s].seq.
     * Does, for every segment in order, rope_kv_store (with norm) then
     * attention (with a's geometry; a->n and a->pos0 are ignored), with the
     * same results. */
    int (*rope_kv_attention_batch)(struct backend *be, float *out, float *q, float *k,
                                   const float *v, const struct batch_seg *segs, int n_seg,
                                   const float *inv_freq, bool interleaved,
                                   const struct qk_norm *norm, struct kv_pool *pool, int layer,
                                   const struct attn_args *a, struct err *e);

    /* Optional: every layer of a one-token step of one sequence (forward.c's
     * layer loop for a decode) in one call: x (dim floats of backend
     * memory) goes in as the token's embedding and comes out as the last
     * layer's residual stream; the token's K/V at position pos of seq are
     * stored in every layer (its blocks reserved by the caller). The
     * results are those of the layer ops up to float rounding (the sums
     * run in another order). Returns 1 when done, 0 when the backend does
     * not take this model or step (the caller runs the layer ops; nothing
     * was issued), -1 on failure. */
    int (*decode_layers)(struct backend *be, const struct model *m, float *x,
                         struct kv_pool *pool, const struct kv_seq *seq, int pos,
                         const float *inv_freq, struct err *e);

    /* A matmul that brings its neighbours in the layer along, so a decode
     * step launches one kernel where it launched two or three:
     *   outs[i] = in . W_i^T        (MATMUL_OUT_STORE),
     *   outs[i] += in . W_i^T       (MATMUL_OUT_ADD: the residual add), or
     *   outs[0] = silu(in . W_0^T) * (in . W_1^T)   (MATMUL_OUT_SWIGLU)
     * for k <= 3 weights of one cols, where the rows `in` are made from
     * in->x as struct matmul_in says. It is defined as the plain ops it
     * replaces: rmsnorm (MATMUL_IN_RMSNORM) into a temporary or silu_mul
     * (MATMUL_IN_SWIGLU) in place, then matmul (matmul_multi) into outs, or
     * for the add into a temporary that add() adds to outs, or for SwiGLU
     * silu_mul(outs[0], outs[1]). One op with an input kind and an output
     * kind, rather than one op per pairing, because the pairings are one
     * kernel with a prologue and an epilogue. A layer: [q,k,v] =
     * rmsnorm(x).W; x += att.Wo; h = swiglu(rmsnorm(x).Wgate,
     * rmsnorm(x).Wup); x += h.Wdown. Outputs must not overlap inputs. */
    int (*matmul_fused)(struct backend *be, float *const *outs, const struct matmul_in *in,
                        int n, const struct tensor *const *ws, int k, enum matmul_out out,
                        struct err *e);

    /* Optional (NULL on the CPU, whose memory is the host's). */
    /* Copies every tensor of m to the device once, before the first op that
     * reads it; m must outlive the backend's use of it. */
    int (*load_weights)(struct backend *be, const struct model *m, struct err *e);
    /* After the KV pool: copies of m's weights that make some ops faster
     * (the CUDA backend's bf16 copies of quantized matrices), made only
     * where they fit in `spare` bytes of device memory nothing else will
     * use; none made is no error. */
    int (*load_spare)(struct backend *be, const struct model *m, size_t spare, struct err *e);
    /* Waits for queued work and reports an error a void op deferred. */
    int (*finish)(struct backend *be, struct err *e);
    /* Copies bytes of host memory into backend memory (tests, host-made
     * tables); NULL means plain memcpy. */
    void (*upload)(struct backend *be, void *dst, const void *src, size_t bytes);
    /* Bracket the ops of one step so the backend may record them once and
     * replay the recording for later steps of the same shape (CUDA graphs
     * for decode). step_begin returns 1 when it replayed a recording (the
     * caller skips the ops), 0 when the caller must issue them, -1 on error.
     * step_end gets the status of the issued ops and returns 1 when a
     * recording failed and the ops must be issued again (they then run
     * eagerly), 0 when done, -1 on error. Replays produce bit-identical
     * results to eager steps. Only steps with logits (one segment) or
     * decodes (every segment) are ever replayed. */
    int (*step_begin)(struct backend *be, const struct backend_step *st, struct err *e);
    int (*step_end)(struct backend *be, int ops_rc, struct err *e);
    /* Optional: logits[head->rows] = x . head^T for one row x whose
     * logits serve only a pick among its k largest (see
     * backend_step.pick_k: 1 a greedy pick, up to HEAD_PICK_MAX_K a top-k
     * draw): exact (matmul's values) at every row that may be among the k
     * largest and -INFINITY at the others, so argmax, and a sampler that
     * keeps the k largest before anything else, pick as over the full
     * product, having read less of the head (the CPU: an int8 copy rules
     * rows out, cpu/head_pick.h). Returns 0; 1 when it does not take this
     * head or k, and the caller runs matmul; -1 with a message. */
    int (*head_pick)(struct backend *be, float *logits, const float *x, const struct tensor *head,
                     int k, struct err *e);
    /* *out (host) = the index of the largest of n floats of backend memory
     * x, the lowest index on ties (NaNs never win), waiting for queued work;
     * greedy decoding then copies one id to the host instead of a logits
     * row (see forward_tokens_greedy). */
    int (*argmax)(struct backend *be, int *out, const float *x, int n, struct err *e);
    void (*mem_info)(struct backend *be, struct backend_mem *out);
    /* Optional: the element type of the KV cache this backend keeps
     * (enum dtype; NULL means DT_F32). Its kv_store/attention ops read and
     * write pools of that type. */
    int (*kv_dtype)(struct backend *be);
    /* Optional: measured device memory bandwidth in bytes/s, or < 0 with e
     * set. CUDA: a device-to-device copy of a large buffer, read + write
     * counted; CPU: a multi-threaded read of a large buffer, bytes read
     * counted. Decode streams the weights at about this rate, so `cllm
     * bench` sets its floor by it. Takes well under a second. */
    double (*mem_bandwidth)(struct backend *be, struct err *e);
    /* Optional: argmax over rows consecutive rows of n floats of backend
     * memory x; out (host) gets rows ids, each by argmax's rules (the lowest
     * index on ties, NaNs never win, 0 when nothing compares). Waits for
     * queued work. A batched step copies its greedy sequences' ids instead
     * of their logits rows (struct forward_seg's next). */
    int (*argmax_rows)(struct backend *be, int *out, const float *x, int rows, int n,
                       struct err *e);
    /* Optional: out[r] (host) = the token sampler_pick (engine/sampler.c)
     * picks from row r of rows consecutive rows of n floats of backend
     * memory x with p[r]'s parameters and draw p[r].u (argmax's rules for
     * temperature <= 0), for every row; one launch, one copy of the ids, one
     * wait. Sums are formed in another order (and exp may round the other
     * way), so a pick may differ from the host's where u, a top_p or a
     * min_p falls within rounding of a boundary between two tokens
     * (test_cuda measures it). A batched step copies its sampled (and
     * greedy) sequences' ids instead of their logits rows (struct
     * forward_seg's sample). */
    int (*sample_rows)(struct backend *be, int *out, const float *x, int rows, int n,
                       const struct sample_params *p, struct err *e);
    /* Optional: lp[r] (host) = the log-probabilities of row r of rows
     * consecutive rows of n floats of backend memory x, as logits_lse and
     * logprobs_top (engine/logits.h) make them on the host: logprob for
     * the id pick[r] (host ids), and the k (<= LOGPROBS_TOP_MAX) largest
     * entries, larger first, the lower id on ties, NaN never; the
     * normalizer's sum in another order, so within a few float ulps of the
     * host's. One launch, one copy, one wait. A step then copies a
     * sequence's statistics instead of its logits row. */
    int (*row_logprobs)(struct backend *be, struct token_logprobs *lp, const float *x, int rows,
                        int n, const int *pick, int k, struct err *e);
    /* Optional: copies pool block `block`'s K (into or from k) and V (v),
     * every layer, kv_pool_bytes_per_block / 2 bytes each, between backend
     * and host memory, in the backend's own layout (the SSD tier's files
     * hold it as it is); waits. NULL: the pool is host memory laid out as
     * kv_offset says, one contiguous span a block. */
    int (*kv_block_copy)(struct backend *be, const struct kv_pool *p, int block, void *k,
                         void *v, bool to_host, struct err *e);
    /* Optional: steps recorded (step_begin/step_end) and replayed so far,
     * by kind: [0] single-sequence decodes, [1] batched decodes. */
    void (*step_stats)(struct backend *be, long recorded[2], long replayed[2]);
    /* Optional: one-sequence decode attention launches with RoPE and
     * several key splits issued so far (a recorded step's once), by where
     * the splits were merged: [0] in a thread-block cluster, [1] by the o
     * projection's GEMV, [2] through global memory by the kernel. Returns
     * whether the backend merges in clusters at all. */
    int (*attention_stats)(struct backend *be, long merges[3]);
    /* Optional: greedy decoding one step ahead of the host
     * (forward_pipe_issue). argmax_async queues argmax's pick over the n
     * floats of backend memory x without waiting for it: the id stays on
     * the device, where a later step's token BACKEND_TOKEN_LAST reads it
     * (embed, and a recorded step's replay), and its copy lands in the
     * host slot `slot` (0 or 1). argmax_take waits for the last copy into
     * slot and sets *out to it. The slot's copy must have been taken
     * before it is queued again. */
    int (*argmax_async)(struct backend *be, const float *x, int n, int slot, struct err *e);
    int (*argmax_take)(struct backend *be, int slot, int *out, struct err *e);
    /* Optional: whether decode steps are recorded as graphs once and
     * replayed (the spec's --compiled-decode; the backend's default is on,
     * or CLLM_COMPILED_DECODE). Called before the first step; outputs are
     * the same bits either way. A backend without graphs has none. */
    void (*set_compiled_decode)(struct backend *be, bool on);
};

/* A token id meaning "the id of the last argmax or argmax_async", still on
 * the device: a backend with argmax_async takes it wherever a one-token
 * step's id goes (embed, step_begin's tokens). */
#define BACKEND_TOKEN_LAST (-1)

struct backend {
    const struct backend_ops *ops;
    void *impl;
};

/* n_threads <= 0: all online CPUs. */
struct backend *backend_cpu_create(int n_threads, struct err *e);
/* The CUDA backend on GPU `device`, from the CUDA backend module
 * (libcllm_cuda.so, dlopened on first use: next to the executable, then
 * $CLLM_CUDA_MODULE, then where the build put it). Fails with a message when
 * the build has no CUDA backend, the module is missing or cannot be loaded,
 * or no such device exists. */
struct backend *backend_cuda_create(int device, struct err *e);
/* CUDA devices usable by this build: 0 when it has no CUDA backend, when no
 * NVIDIA driver is visible (checked before loading the module, so a CPU-only
 * machine never loads the CUDA libraries) or when the module cannot be
 * loaded. */
int backend_cuda_device_count(void);
/* Loads the module without the driver check and returns the device count it
 * reports (0 with e set when none), or -1 with e set when there is no module
 * to load (tests exercise the loading code this way on GPU-less machines). */
int backend_cuda_module_device_count(struct err *e);
/* The path the module was loaded from (loading it if not yet tried), or
 * NULL (no CUDA build, or not found / not loadable). */
const char *backend_cuda_module_path(void);
/* "cpu", "cuda", "cuda:N" or "auto" (the first GPU when one is present, else
 * the CPU); NULL means "cpu". n_threads is for the CPU backend. */
struct backend *backend_create(const char *device, int n_threads, struct err *e);
void backend_destroy(struct backend *be);

/* ops->upload, or memcpy for backends whose memory is the host's. */
void backend_upload(struct backend *be, void *dst, const void *src, size_t bytes);
/* Whether the backend computes in memory of its own (a GPU: it reports
 * ops->mem_info), rather than the host's. */
bool backend_on_device(const struct backend *be);
/* The KV element type of the backend (ops->kv_dtype, else DT_F32). */
int backend_kv_dtype(struct backend *be);
/* The K/V element type CLLM_KV_DTYPE asks for: DT_F32 for "f32", DT_BF16
 * for "bf16", dflt when it is unset; -1 with a message naming the allowed
 * values for anything else. Inline: the CUDA module links none of
 * cllmcore's code but err_set's own copy. */
static inline int backend_kv_dtype_env(int dflt, struct err *e)
{
    const char *v = getenv("CLLM_KV_DTYPE");
    if (!v)
        return dflt;
    if (!strcmp(v, "f32"))
        return DT_F32;
    if (!strcmp(v, "bf16"))
        return DT_BF16;
    err_set(e, "CLLM_KV_DTYPE=%s: the K/V cache element type is f32 or bf16", v);
    return -1;
}
/* ops->set_compiled_decode for on > 0 (on) or on < 0 (off); 0 keeps the
 * backend's default, as does a backend without graphs. */
void backend_set_compiled_decode(struct backend *be, int on);
/* ops->load_weights when the backend has one (no-op otherwise). */
int backend_load_weights(struct backend *be, const struct model *m, struct err *e);
/* Free device memory in bytes (0 for the CPU). */
size_t backend_dev_free(struct backend *be);
/* Device memory kept free beside the KV pool for cuBLAS, graphs and
 * scratch when `free` bytes were free before it: max(1 GiB, a tenth). */
size_t backend_dev_margin(size_t free);
/* After the KV pool: ops->load_spare (no-op without one) with the device
 * memory free beyond backend_dev_margin(free_before) (free_before: what
 * was free when the pool was sized; 0: now). */
int backend_load_spare(struct backend *be, const struct model *m, size_t free_before,
                       struct err *e);
/* Prints the device allocation plan (weights, activations, KV, free) to f
 * for backends that report one; kv_bytes is the KV pool's share of
 * allocated. Prints nothing for the CPU. */
void backend_print_plan(struct backend *be, size_t kv_bytes, FILE *f);

#endif
