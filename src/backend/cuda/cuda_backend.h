/* cuda_backend.h - the C-linkage entry points of the CUDA kernels (*.cu).
 * The host C files (backend_cuda.c and its siblings, C17) implement the
 * op set and call only these; each launcher enqueues its kernel(s) on
 * stream s and returns the launch status. All pointers are device
 * pointers unless a comment says otherwise.
 *
 * Weight layouts on the device: f32/f16/bf16 as in the file (row-major
 * [rows][cols]); Q8_0 repacked at upload into int8 quants [rows][cols] plus
 * f16 scales [rows][cols/32] (qs, scales), so rows are 16-byte aligned;
 * GGUF's low-bit formats (Q4_0 ... Q3_K) as in the file, row after row of
 * blocks (quant_dq.cuh reads them). */
#ifndef CLLM_BACKEND_CUDA_CUDA_BACKEND_H
#define CLLM_BACKEND_CUDA_CUDA_BACKEND_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix as the kernels see it; dtype is an enum dtype value. */
struct cuk_weight {
    int dtype;
    int rows, cols;
    const void *data;        /* elements, or Q8_0 int8 quants */
    const uint16_t *scales;  /* Q8_0 only: f16 scale per 32 elements */
};

/* Geometry of one attention call over the paged cache
 * ([n_blocks][n_layers][block_size][kv_dim] elements for K and for V: f32,
 * or bf16 when kv_bf16; the kernels round K/V to bf16 when storing and
 * widen them exactly when reading). */
struct cuk_attn {
    int n, pos0;
    int n_heads, n_kv_heads, head_dim;
    int window; /* 0 = unlimited */
    float scale;
    int n_layers, layer, block_size, kv_dim;
    int pool_blocks; /* the pool's blocks: a stride of its layout (cuk_kv_row) */
    int kv_bf16;
    int kv_swz;      /* rows' 16-byte chunks swizzled (cuk_kv_col): bf16, head_dim % 64 == 0 */
    /* launch choices: the GPU's multiprocessors, and the tiled kernel's
     * rows per warp (4 or 8; 0: chosen by size) */
    int n_sms, rows_per_warp;
    /* 1: attention over a bf16 cache may run on tensor cores
     * (cuk_attention_mma_ok, cuk_attention_dec_rows are 0 without it) */
    int mma;
    /* the tensor-core prefill kernel's 16-row slices a warp: 1 or 2 (a
     * test lever), 0: 2 for a long chunk (cuk_attention_mma) */
    int pf_mt;
    /* 1: a one-sequence decode step with RoPE (cuk_attention_dec, no
     * dnused) runs its key splits as one thread-block cluster a KV head and
     * merges them there, through shared memory; only where
     * cuk_attention_dec_cluster_ok says the device runs such clusters
     * (cuk_attention_dec refuses it otherwise) */
    int dec_cluster;
};

/* Process-wide: launch kernels with programmatic dependent launch (on by
 * default in the backend; CLLM_CUDA_PDL=0 turns it off). Results do not
 * depend on it. */
void cuk_set_pdl(int on);

/* out[i][:] = row ids[i] of table as f32 (ids on the device); an id < 0
 * stands for *last (device: the id a previous cuk_argmax left; may be NULL
 * when no id is negative). */
cudaError_t cuk_embed(cudaStream_t s, float *out, const struct cuk_weight *table, const int *ids,
                      const int *last, int n);
/* out = x / rms(x) * w row-wise; out may equal x. out_half (may be NULL):
 * out rounded to nearest-even bf16 (bf16 != 0) or f16 too, exactly what
 * cuk_f32_to_half would make of it. */
cudaError_t cuk_rmsnorm(cudaStream_t s, float *out, const float *x, const float *w, int n,
                        int dim, float eps, uint16_t *out_half, int bf16);
/* x += y, then out = x / rms(x) * w, in one launch (the same arithmetic as
 * cuk_add then cuk_rmsnorm); out may equal y, not x. */
cudaError_t cuk_add_rmsnorm(cudaStream_t s, float *out, float *x, const float *y, const float *w,
                            int n, int dim, float eps, uint16_t *out_half, int bf16);
cudaError_t cuk_add_bias(cudaStream_t s, float *x, const float *b, int n, int dim);
/* g_half (may be NULL): the result rounded to bf16/f16 as well. */
cudaError_t cuk_silu_mul(cudaStream_t s, float *g, const float *u, size_t n, uint16_t *g_half,
                         int bf16);
cudaError_t cuk_add(cudaStream_t s, float *x, const float *y, size_t n);
/* dpos (device, may be NULL): when given, *dpos replaces pos0 / g->pos0 at
 * run time, so a recorded graph serves every decode position. */
cudaError_t cuk_rope(cudaStream_t s, float *x, int n, int n_heads, int head_dim, int pos0,
                     const int *dpos, const float *inv_freq, int interleaved);
/* Writes k/v rows [n][kv_dim] of positions pos0.. through the block table. */
cudaError_t cuk_kv_store(cudaStream_t s, void *kc, void *vc, const int *table,
                         const struct cuk_attn *g, const int *dpos, const float *k,
                         const float *v);
/* cuk_rope of q (n_heads) and k (g->n_kv_heads heads of head_dim <= 512)
 * at positions g->pos0.. (or *dpos..), then cuk_kv_store of the rotated k
 * and v, in one launch with the same results. q_norm / k_norm (head_dim
 * floats, may be NULL): each head of q / k is first normalized in place as
 * cuk_rmsnorm over rows of head_dim would (Qwen3's q/k norm), to the bit.
 * The positions, block table and rotation are read before the wait for the
 * previous kernel: dpos and table must come from copies, not kernels. */
cudaError_t cuk_rope_kv_store(cudaStream_t s, float *q, float *k, const float *v, void *kc,
                              void *vc, const int *table, const struct cuk_attn *g, int n_heads,
                              int head_dim, const int *dpos, const float *inv_freq,
                              int interleaved, const float *q_norm, const float *k_norm,
                              float eps);

/* Splits of the key range attention uses for n queries of n_heads heads
 * over at most kv_cap keys on a GPU with n_sms multiprocessors (1 = no
 * split, no workspace). Callers pass a capacity (not the exact length) so
 * that eager and graph-replayed decode steps split the same way. */
int cuk_attention_splits(int n, int n_heads, int kv_cap, int n_sms);
/* Floats of workspace cuk_attention needs for n_splits > 1, and its split
 * counters: cnt holds g->n * g->n_heads unsigned ints, zero before the call
 * and zero again after it (the last split of a row merges and re-arms). */
size_t cuk_attention_ws_floats(const struct cuk_attn *g, int n_splits);
/* out[n][n_heads*head_dim] = causal softmax(q k^T * scale) v; head_dim <= 256.
 * Uses cuk_attention_tiled when n_splits == 1 and cuk_attention_tiled_ok. */
cudaError_t cuk_attention(cudaStream_t s, float *out, const float *q, const void *kc,
                          const void *vc, const int *table, const struct cuk_attn *g,
                          const int *dpos, int n_splits, float *ws, unsigned *cnt);

/* Whether cuk_attention_tiled takes g: prefill-sized n (>= 8 queries),
 * head_dim 64 or 128, at most 64 query heads per KV head. */
int cuk_attention_tiled_ok(const struct cuk_attn *g);
/* cuk_attention for prefill chunks, without splits: a block takes a tile of
 * queries of every query head that shares one KV head, stages K/V tiles in
 * shared memory once for all of them and keeps an online softmax per row.
 * Per row the arithmetic does not depend on how queries are tiled (key
 * tiles are aligned to multiples of 32 positions), so a row's result is the
 * same whatever chunk it is computed in. */
cudaError_t cuk_attention_tiled(cudaStream_t s, float *out, const float *q, const void *kc,
                                const void *vc, const int *table, const struct cuk_attn *g);
/* Whether cuk_attention_mma takes g: g->mma, a bf16 cache, head_dim 64 or 128, at
 * most 64 query heads per KV head (any n; cuk_attention_tiled hands it
 * n >= 8, the backend smaller chunks the decode kernel does not take). */
int cuk_attention_mma_ok(const struct cuk_attn *g);
/* cuk_attention_tiled on tensor cores (bf16 cache only; q and the softmax
 * probabilities are rounded to bf16 for the products, f32 accumulation).
 * Key tiles are aligned to multiples of 64 positions, so without splits a
 * row's result does not depend on the chunk it is computed in either.
 * n_splits > 1 (a short chunk over a long context, too few blocks to fill
 * the GPU): each block takes a run of key tiles; ws and cnt as for
 * cuk_attention. cuk_attention_tiled calls it (unsplit) when
 * cuk_attention_mma_ok. */
cudaError_t cuk_attention_mma(cudaStream_t s, float *out, const float *q, const void *kc,
                              const void *vc, const int *table, const struct cuk_attn *g,
                              int n_splits, float *ws, unsigned *cnt);
/* Its key splits for g (g->n queries over kv_len keys): 1 unless its
 * blocks would leave multiprocessors idle; at most 32. Both take the
 * block shape from g (g->pf_mt, and g->n_sms for a long chunk, whose
 * blocks take twice the rows: attention_mma.cu's k_attention_mma2). */
int cuk_attention_mma_splits(const struct cuk_attn *g, int kv_len, int n_sms);

/* Decode on tensor cores (bf16 cache): one block per (sequence, KV head,
 * key split) reads each K/V row once for every query head sharing it; the
 * products are done as bf16 high + remainder pairs, about f32 precision.
 * cuk_attention_dec_rows: the most queries per sequence it takes for g's
 * geometry (16 / group), 0 when it cannot (g->mma off, f32 cache, head_dim
 * not 64/128, group > 16). cuk_attention_dec_splits: its key splits for n_seqs
 * sequences of at most kv_cap keys (<= 64): as many as let all the blocks
 * (n_seqs x n_kv_heads x splits) run at once when the GPU runs max_blocks
 * of them (CUK_DEC_BLOCKS_PER_SM per SM), at least one. */
#define CUK_DEC_BLOCKS_PER_SM 2
/* Most key splits a one-sequence RoPE decode step merges in one thread-block
 * cluster (struct cuk_attn.dec_cluster): the hardware's largest cluster. */
#define CUK_DEC_CLUSTER_MAX 16
/* Keys in one tile of the decode kernel (a split takes whole tiles). */
#define CUK_DEC_TILE_KEYS 64
/* Whether cuk_attention_dec can merge n_splits key splits of head_dim in a
 * cluster on the current device (2..CUK_DEC_CLUSTER_MAX splits, head_dim
 * 64 or 128, Hopper, and such clusters fit); asked of the device once per
 * size, then cached. */
int cuk_attention_dec_cluster_ok(int head_dim, int n_splits);
int cuk_attention_dec_rows(const struct cuk_attn *g);
int cuk_attention_dec_splits(int n_kv_heads, int kv_cap, int max_blocks, int n_seqs);
/* What cuk_rope_kv_store would do before the decode kernel, for it to do
 * itself (cuk_attention_dec's rope): the new positions' raw k and v rows
 * ([g->n][kv_dim]), the RoPE frequencies (head_dim / 2) and convention,
 * and Qwen3's q/k norm weights (NULL: none). */
struct cuk_dec_rope {
    const float *k, *v;
    const float *inv_freq;
    const float *qn, *kn;
    float eps;
    int interleaved;
};
/* A one-token decode step's every layer in one persistent launch
 * (decode_mega.cu): the layer's weights as the kernel reads them (bf16
 * matrices [rows][cols]; norm vectors and biases f32, NULL where the model
 * has none). */
struct cuk_mega_layer {
    const uint16_t *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    const float *attn_norm, *ffn_norm;
    const float *qn, *kn;      /* Qwen3's q/k norm */
    const float *bq, *bk, *bv; /* Qwen2's q/k/v biases */
};
struct cuk_mega {
    const struct cuk_mega_layer *layers; /* device, [n_layers] */
    int n_layers, dim, ffn, n_heads;
    float eps;
    int interleaved;
    const float *inv_freq; /* head_dim / 2 */
    float *x;              /* [dim]: the token's embedding in, the last layer's residual out */
    float *ws;             /* cuk_mega_ws_floats, zero when made */
    unsigned *gen;         /* the steps run so far (the kernel's; zero when made) */
    const int *table, *dpos; /* block table; dpos as for cuk_rope (NULL: g.pos0) */
    void *kc, *vc;
    struct cuk_attn g;     /* the pool's layout, pos0, scale (layer: set per layer) */
    /* cuk_mega_plan's: rows per ring slot, chunks of the four GEMV jobs of
     * a layer and where each starts in the layer's deal, ring slots, the
     * shared memory and blocks of a launch */
    int lk[4], chunks[4], pre[4], tot, ns, nb; /* rows a slot: 1 << lk */
    /* and the dealing's constants: a block's chunks of job j are mq +
     * (first < mr); nbr rows a warp multiplies together; tm = tot mod nb */
    int mq[4], mr[4], nbr[4], tm;
    int npre; /* keys of an attention split fetched ahead (the most the shared memory allows) */
    size_t smem;
    /* NULL, or cuk_mega_probe_words of record (a measurement): for each
     * layer, phase and block, when its input was in and when its outputs
     * were sent, ns since the block began */
    unsigned *probe;
    int poll_ns; /* a reader's pause between polls of a value not there yet (0: none) */
    int ns_max;  /* most ring slots (0: the kernel's default); never fewer than a GEMV batch needs */
    int inflight; /* most chunks whose copies a block keeps in flight (0: every free slot) */
};
/* Whether cuk_mega_decode takes a's shapes on the current device with at
 * most n_sms blocks (fills the plan fields); 0 with the reason in why. */
int cuk_mega_plan(struct cuk_mega *a, int n_sms, char *why, size_t why_len);
size_t cuk_mega_ws_floats(const struct cuk_mega *a);
size_t cuk_mega_probe_words(const struct cuk_mega *a);
/* The probe's record ends with a trace of the middle layer: per block,
 * CUK_MEGA_TR_MAX events (id, %globaltimer, clock; 0 ids unused). */
#define CUK_MEGA_TR_MAX 128
/* x = the layers applied to x for one token at position *dpos (or
 * g.pos0), its K/V stored in every layer. */
cudaError_t cuk_mega_decode(cudaStream_t s, const struct cuk_mega *a);

/* The measurement builds' records (dec_probe.cuh, gemv_probe.cuh): zeroed
 * when the backend is created, printed when it is destroyed. */
#ifdef CUK_GEMV_PROBE
void cuk_gemv_probe_init(void);
void cuk_gemv_probe_report(int skip);
void cuk_gq_probe_init(void); /* k_gemv_qstaged's (gemv_quant.cu) */
void cuk_gq_probe_report(int skip);
#endif
#ifdef CUK_DEC_PROBE
void cuk_dec_probe_init(void);
void cuk_dec_probe_report(int skip);
#endif
/* cuk_attention for g->n <= cuk_attention_dec_rows queries (positions
 * g->pos0.., or *dpos.. when dpos); ws and cnt as for cuk_attention with
 * n_splits (cnt: one counter per KV head used). rope (may be NULL): q is
 * the raw (un-rotated) query and the new positions' K/V are not in the
 * cache yet: the kernel does cuk_rope_kv_store's work first, with the same
 * results (q itself is left as it was), saving its launch. */
/* dnused (with rope, g->n == 1 and n_splits > 1; else NULL): the key-split
 * merge is left to the next kernel: out is not written; every split's
 * partial is in ws (cuk_attention's workspace layout) and the number of
 * splits that hold keys goes to *dnused, for cuk_gemv_staged's
 * CUK_IN_SPLITS or cuk_attention_merge. */
cudaError_t cuk_attention_dec(cudaStream_t s, float *out, const float *q, void *kc, void *vc,
                              const int *table, const struct cuk_attn *g, const int *dpos,
                              int n_splits, float *ws, unsigned *cnt,
                              const struct cuk_dec_rope *rope, int *dnused);
/* The merge cuk_attention_dec left undone (dnused): out[n_heads][head_dim]
 * from ws's n_splits partials of one query, the first *dnused of them, in
 * the order and arithmetic of the kernels' own merge (the same bits). */
cudaError_t cuk_attention_merge(cudaStream_t s, float *out, const float *ws, const int *dnused,
                                int n_heads, int n_kv_heads, int head_dim, int n_splits);
/* cuk_attention_short_batch's job (segments with cuk_bseg.tiled == 2, the
 * same meta, workspace and counter layout) on tensor cores, for segments of
 * at most cuk_attention_dec_rows queries. (It never does the RoPE + K/V
 * store itself: the rotated rows' shared memory would cost a batch's many
 * blocks a third of their occupancy, measured slower on the H200.) */
cudaError_t cuk_attention_dec_batch(cudaStream_t s, float *out, const float *q, const void *kc,
                                    const void *vc, const int *meta, const struct cuk_attn *g,
                                    int max_splits, float *ws, unsigned *cnt);

/* Queries per segment cuk_attention_short_batch takes for g's geometry
 * (8 / group), 0 when it cannot (head_dim not 64/128, group > 8). */
int cuk_attention_short_rows(const struct cuk_attn *g);
/* Attention of the short segments of a batch step (cuk_bseg.tiled == 2,
 * n <= cuk_attention_short_rows): one block per (segment, KV head, key
 * split) with the arithmetic of cuk_attention_tiled, so each K/V row is
 * read once for all query heads that share it; a segment's key range is
 * split in cuk_bseg.splits 32-aligned chunks whose partials the last
 * block merges. g and meta as for
 * cuk_rope_kv_attention_batch, which must have stored the K/V first. */
cudaError_t cuk_attention_short_batch(cudaStream_t s, float *out, const float *q, const void *kc,
                                      const void *vc, const int *meta, const struct cuk_attn *g,
                                      int max_splits, float *ws, unsigned *cnt);
/* Its workspace for the largest key split count of its segments
 * (cuk_bseg.splits; 1: none); cnt as for cuk_attention (g->n * n_heads). */
size_t cuk_attention_short_ws_floats(const struct cuk_attn *g, int max_splits);

/* One sequence of a batch step (8 ints): rows row0..row0+n-1 of the
 * concatenated q/k/v are its positions pos0..; splits as cuk_attention
 * would use for it alone; its block table at meta + tab_off; its attention
 * workspace (splits > 1) at ws + ws_off. */
struct cuk_bseg {
    int row0, n, pos0, splits, tab_off;
    int tiled; /* 0: cuk_rope_kv_attention_batch does its attention; 1: the
                * caller runs cuk_attention_tiled for it, 2: the caller runs
                * cuk_attention_short_batch (the batch kernel only stores
                * its K/V) */
    long long ws_off;
};
/* (q/k norm +) RoPE + K/V store + attention of every sequence of a batch
 * step, with the results of cuk_rope_kv_store then cuk_attention per
 * sequence. meta
 * (device ints): [n_seg cuk_bseg][row map: segment of each of g->n rows, at
 * offset g->pos0][block tables]; g->n = rows in all, g->n_heads,
 * n_kv_heads, head_dim, window, scale, layer geometry as usual;
 * max_splits = the largest splits of the segments it does attention for,
 * 0 when it does none (every segment tiled: it only stores K/V). */
cudaError_t cuk_rope_kv_store_batch(cudaStream_t s, float *q, float *k, const float *v, void *kc,
                                    void *vc, const int *meta, const struct cuk_attn *g,
                                    const float *inv_freq, int interleaved, const float *q_norm,
                                    const float *k_norm, float eps);
cudaError_t cuk_rope_kv_attention_batch(cudaStream_t s, float *out, float *q, float *k,
                                        const float *v, void *kc, void *vc, const int *meta,
                                        const struct cuk_attn *g, int max_splits,
                                        const float *inv_freq, int interleaved,
                                        const float *q_norm, const float *k_norm, float eps,
                                        float *ws, unsigned *cnt);

/* Largest n the GEMV kernels take. */
#define CUK_GEMV_MAX 8
/* Rows up to which the backend uses them by default where the tensor-core
 * GEMV (cuk_gemv_mma) is off (CLLM_CUDA_GEMV_MAX changes it; with it on,
 * 1): measured on the H200 with the 8B shape, the tensor-core GEMM is
 * faster from 3 rows on (4 rows: 540 vs 496 tok/s; 8 rows: 1026 vs 658),
 * the GEMV reads the weights once at 1 and 2 rows (88%, 80% of the
 * floor). */
#define CUK_GEMV_DEFAULT 2
/* out[n][rows] = x[n][cols] . W^T for n <= CUK_GEMV_MAX, f32 accumulation,
 * any weight dtype. */
cudaError_t cuk_gemv(cudaStream_t s, float *out, const float *x, int n, const struct cuk_weight *w);
/* outs[i][n][ws[i]->rows] = x[n][cols] . W_i^T for k <= 3 matrices of one
 * f16/bf16/Q8_0 dtype and one cols, in one launch, with cuk_gemv's
 * arithmetic; cudaErrorNotSupported (nothing launched) for other shapes or
 * dtypes. cuk_gemv_fused with the rows of x as they are. */
cudaError_t cuk_gemv_multi(cudaStream_t s, float *const *outs, const float *x, int n,
                           const struct cuk_weight *const *ws, int k);

/* The input rows of a fused GEMV, made from x as the kernel stages it. */
enum {
    CUK_IN_X,       /* x as it is */
    CUK_IN_RMSNORM, /* rmsnorm(x) with weights nw (cols floats) and eps: what
                     * cuk_rmsnorm would write, to the bit */
    CUK_IN_SWIGLU,  /* silu(x) * x2: what cuk_silu_mul would write, to the bit */
    CUK_IN_SPLITS   /* cuk_gemv_staged, n = 1 only: the attention output
                     * cuk_attention_merge would write (cols = heads x
                     * head_dim) from x = the partials cuk_attention_dec
                     * left (dnused), to the bit */
};
struct cuk_gemv_in {
    int kind;            /* CUK_IN_* */
    const float *x, *x2; /* [n][cols]; x2 only for CUK_IN_SWIGLU */
    const float *nw;     /* CUK_IN_RMSNORM */
    float eps;
    const int *nused;    /* CUK_IN_SPLITS: the attention's dnused */
    int n_splits, head_dim; /* CUK_IN_SPLITS */
};
/* in's rows from token t on (x, and SwiGLU's x2, of cols columns): what
 * a launch for a run of a step's tokens reads (not CUK_IN_SPLITS). */
static inline struct cuk_gemv_in cuk_gemv_in_from(const struct cuk_gemv_in *in, int t, int cols)
{
    struct cuk_gemv_in r = *in;
    r.x += (size_t)t * cols;
    if (r.x2)
        r.x2 += (size_t)t * cols;
    return r;
}
/* What a fused GEMV does with its results. */
enum {
    CUK_OUT_STORE,  /* outs[i] = result */
    CUK_OUT_ADD,    /* outs[i] += result (the residual add) */
    CUK_OUT_SWIGLU  /* k = 2 matrices of equal rows (gate, up), input
                     * CUK_IN_RMSNORM only: outs[0] = silu(result 0) *
                     * result 1, what cuk_silu_mul would write, to the bit;
                     * outs[1] is not written */
};
/* outs[i][n][ws[i]->rows] = in . W_i^T as `out` (CUK_OUT_*) says, for n <=
 * CUK_GEMV_MAX rows and k <= 3 matrices of one f16/bf16/Q8_0 dtype and one
 * cols, in one launch with cuk_gemv's arithmetic on the rows `in`
 * describes (the add: each output is read and written by the one warp
 * that computes it, so no atomics). Outputs must not overlap inputs.
 * cudaErrorNotSupported (nothing launched) for shapes, dtypes or alignments
 * the vector path does not take; the caller then issues the plain kernels. */
cudaError_t cuk_gemv_fused(cudaStream_t s, float *const *outs, const struct cuk_gemv_in *in,
                           int n, const struct cuk_weight *const *ws, int k, int out);
/* Dtype values below this have a row in cuk_gq_cfg (tensor.h's DT_*). */
#define CUK_GQ_DTS 16
/* The device as cuk_gemv_quant's integer kernel shapes its launches for
 * it (cuk_gemv_quant_init fills it once): where x fits its shared memory
 * in one tile, a launch has at most bps[dtype][n - 1] blocks an SM (the
 * most the SM holds at once; 0: no limit), so that a block stages x once
 * for several row pairs rather than once for each (H100, 8B Q4_K decode
 * 300.4 -> 331.2 tok/s; docs/benchmarks.md, session 52). */
struct cuk_gq_cfg {
    int n_sms;
    unsigned char bps[CUK_GQ_DTS][CUK_GEMV_MAX];
    int max_blocks; /* tests: this many blocks at most instead (0: unset) */
    /* The staged kernel (on by default on sm_90, CLLM_CUDA_GQ_STAGED): for up
     * to staged_max_n (at most 8) rows of x, the weights copied into a ring
     * in shared memory by bulk copies. staged_bps: its blocks an SM (0:
     * off); staged_smem: shared memory a block; staged_steps: GD_STEP-column
     * steps a copy covers at most (0: 4 KB of a row). Set by the caller
     * after cuk_gemv_quant_init. staged_strict (tests): a shape the staged
     * kernel declines is cudaErrorNotPermitted, not k_gemv_qdot's.
     * staged_res_late (measurement): a residual add reads the output's old
     * values after the sums, not before the products. staged_norm_apart
     * (measurement): one token's norm takes its own pass over x before
     * the staging, not one pass for both. staged_prewait (measurement):
     * a warp's ring copies issued before the PDL wait (0: as many as it
     * has slots); its other slots are filled once x is staged, so that
     * x's loads do not queue behind them. staged_late_launch
     * (measurement): the next kernel may launch once this one's x is
     * staged, not at its wait (both lost here, unlike cuk_stage_cfg's:
     * docs/benchmarks.md, session 65). */
    int staged_bps, staged_smem, staged_steps, staged_strict, staged_max_n, staged_res_late,
        staged_norm_apart, staged_prewait, staged_late_launch;
};
/* cfg for a device of n_sms SMs; persist 0: no limit (measurement,
 * CLLM_CUDA_GQ_PERSIST=0); max_blocks: cuk_gq_cfg's (CLLM_CUDA_GQ_BLOCKS). */
void cuk_gemv_quant_init(struct cuk_gq_cfg *cfg, int n_sms, int persist, int max_blocks);
/* cuk_gemv_fused's contract for k <= 3 matrices of one of GGUF's low-bit
 * dtypes (Q4_0, Q4_1, Q5_0, Q5_1, Q2_K ... Q6_K: their own blocks, as
 * uploaded), or of Q8_0 (as repacked; not exact), and one cols, f32
 * accumulation. By default the staged input is rounded to 8 bits a
 * 32-block (absmax / 127, nearest, ties to even: the CPU's rounding) and
 * multiplied with the weights' integer codes by byte dot products
 * (quant_dot.cuh); exact: each weight widened to f32 with the host's bits
 * (quant_dequantize_row's) times the f32 input (precise mode). The SwiGLU
 * output only after a norm. cudaErrorNotSupported (nothing launched) for
 * other dtypes, unaligned inputs, and weights not 8-aligned (by default
 * Q8_0, Q4_K and Q5_K: not 16-aligned, for 16-byte loads). */
cudaError_t cuk_gemv_quant(cudaStream_t s, float *const *outs, const struct cuk_gemv_in *in,
                           int n, const struct cuk_weight *const *ws, int k, int out, int exact,
                           const struct cuk_gq_cfg *cfg);
/* Launch shape of cuk_gemv_staged; zeros take the defaults. */
struct cuk_stage_cfg {
    int blocks;     /* blocks (one per SM) */
    int chunk_cols; /* most columns per bulk copy, a multiple of 256 (default 2048) */
    int smem_bytes; /* shared memory per block (default CUK_STAGE_SMEM) */
    int any_size;   /* also take rows under 4 KB (tests; declined
                     * otherwise, see cuk_gemv_staged) */
    /* One token's launches only (more fill every slot before the wait and
     * let the next kernel launch at it): a warp fills prewait ring slots
     * before the PDL wait and the rest once x is staged (0: one where its
     * whole share of the weights fits its ring, CUK_STAGE_PREWAIT
     * otherwise; 32 or more: all), and the next kernel may launch once x
     * is staged too, or at the wait with early_launch. */
    int prewait;
    int early_launch;
};
/* Default shared memory of a staged GEMV block (measured on the H200:
 * 160 KB beat 112, 200 and 227 on an 8B model's decode). */
#define CUK_STAGE_SMEM (160 * 1024)
/* Ring slots a warp of a one-token launch fills before its PDL wait where
 * its share does not fit its ring (H100: 0.6B bf16 1,249 -> 1,267 tok/s,
 * 8-layer 8B bf16 671 -> 675 against all slots and the early launch;
 * docs/benchmarks.md, sessions 65-66). */
#define CUK_STAGE_PREWAIT 2
/* cuk_gemv_fused for 1..CUK_STAGE_MAX_N input rows (tokens) of bf16/f16
 * weights, the same bits, by a kernel that copies each block's share of
 * the weights into a ring in shared memory (bulk asynchronous copies), the
 * first copies issued before it waits for the previous kernel: deeper in
 * flight than registers allow; every row of x is staged beside the ring,
 * so each weight is read once for all n rows. cudaErrorNotSupported
 * (nothing launched) for what it does not take: Q8_0, n rows of x too wide
 * to leave two copies per warp beside them, the SwiGLU output without the
 * norm, and (unless cfg->any_size) rows under 4 KB (pairs of gate/up rows
 * count together), where cuk_gemv_fused is faster. Hopper (sm_90) and
 * newer. */
#define CUK_STAGE_MAX_N 4
cudaError_t cuk_gemv_staged(cudaStream_t s, float *const *outs, const struct cuk_gemv_in *in,
                            int n, const struct cuk_weight *const *ws, int k, int out,
                            const struct cuk_stage_cfg *cfg);
/* Most tokens cuk_gemv_mma takes. */
#define CUK_MMA_MAX_N 16
/* The device as cuk_gemv_mma shapes its launch for it. */
struct cuk_mma_cfg {
    int n_sms;    /* SMs */
    int smem_max; /* shared memory a block may opt into (bytes) */
    int smem_sm;  /* shared memory of an SM (bytes): two blocks where they fit */
    int blocks_per_sm, ks, warps; /* measurement: at most this many blocks an
                                   * SM, column slices a tile (1, 2, 4, 8,
                                   * and 16 with 16 warps),
                                   * warps a block (8, 16); 0: automatic */
    int stage_regs; /* measurement: x staged through registers even where
                     * its f32 rows fit in shared memory (the same bits) */
    int qmma_warps; /* warps a block of the K-quant kernel (8, 16; 0: 16
                     * where its blocks fill the SMs, else 8) */
    int qmma_stage_rows; /* measurement: that kernel stages x a warp a row,
                          * eight loads a lane (session 60's staging) */
    int qmma_cluster; /* that kernel's blocks in clusters of this many
                       * (2, 4), each 1 / qmma_cluster of the columns; 1:
                       * none; 0: cuk_qmma_cluster's choice */
};
/* Shared memory cuk_gemv_mma needs for n rows of x over cols columns with
 * room to sum column slices across warps (8-warp blocks): what the backend
 * requires before sending it a shape. It declines only where x alone does
 * not fit cfg->smem_max. */
size_t cuk_gemv_mma_smem(int n, int cols);
/* The same for Q4_K, Q5_K or Q6_K weights of dtype dt (their kernel's
 * ring at its shallowest, 8-warp blocks); 0 for any other dtype. */
size_t cuk_gemv_qmma_smem(int dt, int n, int cols);
/* Blocks a thread-block cluster of that kernel has for n rows of x times
 * matrices of dtype dt and cols columns, all of them (no window): 1, or
 * the 2 or 4 cfg->qmma_cluster asks where cols / 256 divides by it, else
 * (0) 2 from QMMA_CLUSTER_COLS columns and QMMA_CLUSTER_FROM_N rows. */
int cuk_qmma_cluster(const struct cuk_mma_cfg *cfg, int dt, int cols, int n);
/* cuk_gemv_fused's contract for n <= CUK_MMA_MAX_N rows on the tensor
 * cores (sm_80 and newer), except that the input rows, after the input
 * op, are rounded to the weights' half type (nearest even) before the
 * product, as a half-precision GEMM reads them, and that the RMSNorm's
 * sums of squares are f32 (cuk_rmsnorm's f64: a last bit may differ
 * before the rounding); f32 accumulation. In one
 * launch (under programmatic dependent launch where that is on): x
 * staged once per block, the weights read once, every output summed in an
 * order fixed by (rows, cols, n, cfg): the same bits on every call.
 * cudaErrorNotSupported (nothing launched) for what it does not take:
 * CUK_IN_SPLITS, dtypes other than bf16/f16, cols not a multiple of 32,
 * unaligned rows, the SwiGLU output without the norm, and n rows of x too
 * wide for cfg->smem_max. */
cudaError_t cuk_gemv_mma(cudaStream_t s, float *const *outs, const struct cuk_gemv_in *in,
                         int n, const struct cuk_weight *const *ws, int k, int out,
                         const struct cuk_mma_cfg *cfg);
/* cuk_gemv_mma on Q4_K, Q5_K or Q6_K weights over a window of their
 * columns, [c0, c0 + cw) (multiples of 256: whole blocks), and the same
 * columns of x, whose rows stay ws[0]->cols apart (a norm's still over
 * the whole row): that window's part of the product, stored or added by
 * out (not CUK_OUT_SWIGLU, whose sums must be whole). So n rows of x too
 * wide to stage whole (an 8B model's down projection at 16 tokens) run as
 * windows that read each weight once, the first storing or adding, the
 * others adding, rather than as runs of tokens each reading every weight
 * again. cudaErrorInvalidValue for another dtype or window. */
cudaError_t cuk_gemv_qmma_window(cudaStream_t s, float *const *outs,
                                 const struct cuk_gemv_in *in, int n,
                                 const struct cuk_weight *const *ws, int k, int out, int c0,
                                 int cw, const struct cuk_mma_cfg *cfg);
/* Most tokens cuk_gemm_tc takes, and most 128-row blocks of W. */
#define CUK_TC_MAX_N 64
#define CUK_TC_MAX_RB 8192
/* Bytes of the workspace cuk_gemm_tc needs for `blocks` blocks; zeroed
 * once before first use (the kernel leaves its counters re-armed). */
size_t cuk_gemm_tc_ws_bytes(int blocks);
/* Launch shape of cuk_gemm_tc (measurement); zeros take the defaults. */
struct cuk_tc_cfg {
    int smem_bytes; /* shared memory per block (default 120 KB, at most 226) */
};
/* out[t * ldc + r] = (acc ? out[t * ldc + r] : 0) + x[t] . W[r] for n <=
 * CUK_TC_MAX_N rows of x (bf16/f16, W's type, cols apart) and the rows x
 * cols matrix W, f32 accumulation on the tensor cores, one launch of at
 * most `blocks` blocks (one per SM) over the workspace ws
 * (cuk_gemm_tc_ws_bytes of at least `blocks`), shaped by cfg (NULL:
 * the defaults). Every output is summed in an order fixed by (rows, cols,
 * n, blocks): the same bits on every call. cudaErrorNotSupported
 * (nothing launched) for other dtypes, rows or cols not multiples of 16,
 * unaligned w or x. Hopper (sm_90) and newer. */
cudaError_t cuk_gemm_tc(cudaStream_t s, float *out, int ldc, const void *w, int dtype,
                        const uint16_t *x, int rows, int n, int cols, int acc, void *ws,
                        int blocks, const struct cuk_tc_cfg *cfg);
/* dst[r - row0][cols] = rows [row0, row0+nrows) of w widened to f32. */
cudaError_t cuk_dequant_f32(cudaStream_t s, float *dst, const struct cuk_weight *w, int row0,
                            int nrows);
/* The same rows of a Q8_0 or low-bit w (GGUF Q4_0 ... Q3_K) rounded from
 * those f32 values to nearest-even bf16 (bf16 != 0) or f16, for a
 * tensor-core GEMM; dst 16-byte aligned, cols a multiple of 8.
 * cudaErrorNotSupported for other dtypes. */
cudaError_t cuk_dequant_half(cudaStream_t s, uint16_t *dst, const struct cuk_weight *w, int row0,
                             int nrows, int bf16);
/* dst[i] = x[i] rounded to nearest-even bf16 (bf16 != 0) or f16. */
cudaError_t cuk_f32_to_half(cudaStream_t s, uint16_t *dst, const float *x, size_t n, int bf16);
/* Q8_0 repack on the device: src holds nrows*cols/32 GGUF blocks (34 bytes). */
cudaError_t cuk_q8_repack(cudaStream_t s, int8_t *qs, uint16_t *scales, const void *src,
                          size_t n_blocks);

/* The int8 copy of an LM head that rules rows out of a greedy step's
 * pick (head_pick.cu): q (rows x cols quants), per row its scale and
 * sum |q|, per row scratch ab (a_r, e_r), and ws (2 unsigned, zero before
 * first use; the kernels leave them re-armed). cols a multiple of 16, at
 * most CUK_HEAD_MAX_COLS (the int32 sums stay exact). */
#define CUK_HEAD_MAX_COLS 16384
struct cuk_head_copy {
    int8_t *q;
    float *scale, *qabs, *ab;
    unsigned *ws;
    int rows, cols;
};
/* c's q, scale and qabs from w (f32, f16 or bf16 on the device, c's
 * shape); *bad (device, zero before) becomes 1 where a weight is not
 * finite, and c must not be used then. */
cudaError_t cuk_head_quant(cudaStream_t s, const struct cuk_head_copy *c,
                           const struct cuk_weight *w, unsigned *bad);
/* Shared memory bytes cuk_head_pick's screening launch takes. */
size_t cuk_head_smem(int cols);
/* logits[w->rows] = x . w^T where a greedy pick needs it: in double
 * precision (rounded to f32) at every row the copy cannot rule out, -inf
 * at the others; x (device, w->cols floats) is the normed row. Two
 * launches of up to 8 and 4 blocks an SM. */
cudaError_t cuk_head_pick(cudaStream_t s, const struct cuk_head_copy *c,
                          const struct cuk_weight *w, const float *x, float *logits, int n_sms);

/* Bytes of device workspace cuk_argmax takes; zeroed once before first use
 * (the kernel leaves it re-armed). */
#define CUK_ARGMAX_WS_BYTES (128 * 8 + 16)
/* *out (device) = index of the largest of x[0..n), the lowest on ties; NaNs
 * are skipped (0 when nothing compares); and *host too unless it is NULL
 * (pinned host memory mapped for the device: the host reads it once the
 * launch is done, with no copy after it). One launch. */
cudaError_t cuk_argmax(cudaStream_t s, int *out, int *host, const float *x, int n, void *ws);
/* out[r] (device) = cuk_argmax of row r of x[rows][n], for every row; one
 * launch of about `blocks` blocks (each row split over blocks / rows of
 * them); rows <= 65535. ws: 8-byte aligned device memory of at least
 * CUK_ARGMAX_ROWS_WS_BYTES(rows), all zero before the call and all zero
 * again after it (the kernel re-arms what it used), so one workspace
 * zeroed once serves every later call of as many rows or fewer. */
#define CUK_ARGMAX_ROWS_WS_BYTES(rows) ((size_t)(rows) * 12)
cudaError_t cuk_argmax_rows(cudaStream_t s, int *out, const float *x, int rows, int n, void *ws,
                            int blocks);

/* One row of cuk_sample_rows: the host sampler's parameters as
 * sampler_pick uses them (engine/sampler.c). */
struct cuk_sample_param {
    double u;     /* the uniform draw in [0, 1) */
    float inv_t;  /* 1.0f / temperature, rounded as the host rounds it */
    float top_p;  /* >= 1: off */
    float min_p;  /* <= 0: off */
    int top_k;    /* <= 0: off */
    int greedy;   /* the argmax (cuk_argmax's rules); the rest is unused */
    int pad_;
};
/* Largest n cuk_sample_rows takes (its histograms count up to 4095
 * elements per thread). */
#define CUK_SAMPLE_MAX_N (4095 * 512)
/* The sampler's fast path (device buffers): pr and cand rows x n each,
 * ws cuk_sample_ws_bytes(rows), zeroed once before first use (each call
 * leaves it so); blocks: the preparation launches' blocks in all (about
 * four an SM), split evenly over the rows. */
struct cuk_sample_ws {
    float *pr;
    int *cand;
    void *ws;
    int blocks;
};
size_t cuk_sample_ws_bytes(int rows);
/* out[r] (device) = the id sampler_pick gives for row r of x[rows][n] with
 * ps[r] (device) and its draw, a block per row. With fw, three launches
 * over the whole device first work out every row's maximum, probabilities
 * and its largest ones, so that the blocks mostly walk those in shared
 * memory instead of the row, again and again: the same ids, faster. NULL:
 * one launch. */
cudaError_t cuk_sample_rows(cudaStream_t s, int *out, const float *x, int rows, int n,
                            const struct cuk_sample_param *ps, const struct cuk_sample_ws *fw);

/* One row of cuk_row_logprobs: the row's log-sum-exp, pick's entry and
 * the k largest as log-probabilities (x - lse). */
#define CUK_ROW_TOP_MAX 20
struct cuk_row_logprobs {
    double lse;
    float pick;
    int n_top;
    int id[CUK_ROW_TOP_MAX];
    float val[CUK_ROW_TOP_MAX];
};
/* out[r] (device) for row r of x[rows][n]: lse = log of the sum of exp over
 * the row (NaN entries skipped), pick = x[r][pick[r]] - lse (pick: device
 * ids; NaN for an id outside the row), and the k (<= CUK_ROW_TOP_MAX)
 * largest entries, larger first, the lower id on ties, NaN never. A block
 * per row. */
cudaError_t cuk_row_logprobs(cudaStream_t s, struct cuk_row_logprobs *out, const float *x,
                             int rows, int n, const int *pick, int k);

#ifdef __cplusplus
}
#endif

#endif
