/* cuda_matmul.c - the CUDA backend's embedding, matmuls and element-wise
 * ops: which kernel takes a matmul (our GEMV kernels, the tensor-core
 * GEMV, cuBLASLt / cuBLAS with plans kept per shape), the fused launches
 * (norm, SwiGLU, residual add inside the matmul), RMSNorm, bias, SwiGLU,
 * add. */
#include "backend/cuda/cuda_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/quant.h"

const struct cuk_weight *dev_weight(struct cuda_backend *c, const struct tensor *t,
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

const int *ids_upload(struct cuda_backend *c, const int *ids, int n)
{
    int *dids = dbuf_get(c, &c->ids, (size_t)n * sizeof(int), "token ids");
    if (!dids || !upload_async(c, &c->up_ids, dids, ids, (size_t)n * sizeof(int), "copy token ids"))
        return NULL;
    return dids;
}

void cu_embed(struct backend *be, float *out, const struct tensor *t, const int *ids, int n)
{
    struct cuda_backend *c = op_begin(be);
    if (!c->capturing)
        use_device(c);
    const struct cuk_weight *w = dev_weight(c, t, "embed");
    if (!w || c->err[0])
        return;
    if (c->bstep) { /* a batched decode: step_begin copied the ids */
        fail_cuda(c, "embed", cuk_embed(c->stream, out, w, c->ids.p, NULL, n));
        return;
    }
    if (c->capturing) { /* the ids come with the step record */
        fail_cuda(c, "embed", cuk_embed(c->stream, out, w, (const int *)c->step.p + 1, am_last(c), n));
        return;
    }
    const int *dids = ids_upload(c, ids, n);
    if (dids)
        fail_cuda(c, "embed", cuk_embed(c->stream, out, w, dids, am_last(c), n));
}

void lt_plan_clear(struct lt_plan *pl)
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

/* The half type a GEMM reads activations in: the 2-byte matrices', bf16
 * where quantized matrices are widened for it (matmul_widened), -1 in
 * precise mode or for f32 matrices. */
static int act_half(const struct cuda_backend *c)
{
    return c->precise ? -1 : c->half_type >= 0 ? c->half_type : c->quant_type >= 0 ? DT_BF16 : -1;
}

/* Where an op's f32 result (nel elements at out) will feed a tensor-core
 * GEMM (gemm_next: see feeds_gemm; 2-byte or widened weights, not
 * precise): a buffer for its half copy, valid for the next op; NULL when
 * not worth it. */
static uint16_t *half_out(struct cuda_backend *c, const float *out, size_t nel, bool gemm_next)
{
    const int t = act_half(c);
    if (!gemm_next || t < 0 || c->err[0])
        return NULL;
    uint16_t *h = dbuf_get(c, &c->xh, nel * 2, "half activations");
    if (!h)
        return NULL;
    c->xh_src = out;
    c->xh_n = nel;
    c->xh_type = t;
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

/* The weight bytes of the k matrices ws when all are bf16 or all f16 (the
 * tensor-core and staged GEMVs' dtypes), else 0. */
static size_t half_bytes(const struct cuk_weight *const *ws, int k)
{
    size_t bytes = 0;
    for (int i = 0; i < k; i++) {
        if ((ws[i]->dtype != DT_BF16 && ws[i]->dtype != DT_F16) || ws[i]->dtype != ws[0]->dtype)
            return 0;
        bytes += (size_t)ws[i]->rows * (size_t)ws[i]->cols * 2;
    }
    return bytes;
}

/* Which kernel takes n rows of x times one launch's matrices. */
enum mm_route {
    MM_GEMM,       /* cuBLAS (or the f32 widening path) */
    MM_GEMV,       /* the staged or register GEMV: up to gemv_max rows */
    MM_MMA,        /* the tensor-core GEMV (cuk_gemv_mma) */
    MM_STAGED_BIG, /* the staged GEMV past gemv_max rows: staged_big */
};

/* Whether n rows of x past the GEMVs' rows times matrices of `bytes`
 * 2-byte weights (0: not all bf16 or all f16) and cols columns go to the
 * tensor-core GEMV (x rounded to half as cuBLAS reads it, the input and
 * output ops in its launch) rather than cuBLAS: a 2-byte model, not
 * precise, up to CUK_MMA_MAX_N rows, and where it wins (H200,
 * docs/benchmarks.md, seventeenth pass): launches of at most
 * mma_max_bytes of weights (it streams them at ~75 % of the copy
 * bandwidth to cuBLAS's ~90 %, so an 8B model's gate/up and down lose what
 * the saved launches gain) and x of at most mma_max_x elements (every
 * block stages all of x from L2 before its first product: at 16 tokens x
 * 4,096 columns, 256 KB of f32 a block). So an 8B model's step of 2-8
 * tokens takes it for q/k/v and o, a 0.6B model's for every matrix but the
 * LM head and, past 10 tokens, the down projection. */
static bool mma_takes(const struct cuda_backend *c, size_t cols, size_t bytes, int n)
{
    return c->gemv_mma && !c->precise && (c->half_type >= 0 || c->wide_bytes) &&
           n <= CUK_MMA_MAX_N && cols % 32 == 0 && (size_t)n * cols <= c->mma_max_x &&
           cuk_gemv_mma_smem(n, (int)cols) <= (size_t)c->mma.smem_max && bytes > 0 &&
           bytes <= c->mma_max_bytes;
}

/* Whether a step of n tokens is one the tensor-core GEMV on K-quant blocks
 * takes, where its matrices are (qmma_takes) and have cols columns. */
static bool qmma_tokens(const struct cuda_backend *c, int n, size_t cols)
{
    return c->qmma && c->gemv_mma && !c->precise && n >= cu_qmma_from(c, (int)cols) &&
           n <= CUK_MMA_MAX_N;
}

/* Whether dt is one the tensor-core GEMV on K-quant blocks takes (Q4_K,
 * Q5_K, Q6_K; cuk_gemv_qmma_smem is 0 for any other). */
static bool qmma_dtype(int dt)
{
    return cuk_gemv_qmma_smem(dt, 1, 256) > 0;
}

/* Whether that kernel stages n rows of x over cols columns beside its ring. */
static bool qmma_fits(const struct cuda_backend *c, int dt, int n, size_t cols)
{
    return cuk_gemv_qmma_smem(dt, n, (int)cols) <= (size_t)c->mma.smem_max;
}

/* How many of ws[0..k) from the first share its dtype and columns, as
 * one GEMV launch's matrices must. */
static int same_run(const struct cuk_weight *const *ws, int k)
{
    int i = 1;
    while (i < k && ws[i]->dtype == ws[0]->dtype && ws[i]->cols == ws[0]->cols)
        i++;
    return i;
}

/* Whether n rows of x times the k matrices ws (cols columns) go to the
 * tensor-core GEMV on Q4_K, Q5_K or Q6_K blocks (gemv_mma_quant.cu; all
 * k of one dtype) rather than the staged quantized GEMV or the widened
 * GEMM: cu_qmma_from's tokens (fewer for narrow matrices: qmma_tokens) to
 * CUK_MMA_MAX_N rows, not in precise mode; x staged in
 * windows of columns or runs of tokens where all of x does not fit a
 * block's shared memory (gemv_fused). Where bf16 copies exist,
 * mm_weights keeps the blocks for these steps (faster since session 60;
 * session 58's kernel had lost to the copies). */
static bool qmma_takes(const struct cuda_backend *c, const struct cuk_weight *const *ws, int k,
                       int n)
{
    const size_t cols = (size_t)ws[0]->cols;
    const int dt = ws[0]->dtype;
    return qmma_tokens(c, n, cols) && qmma_dtype(dt) && cols % 256 == 0 &&
           qmma_fits(c, dt, 1, cols) && same_run(ws, k) == k;
}

/* Most of n tokens over cols columns one launch of the tensor-core GEMV
 * stages (at least 1 where qmma_takes). */
static int qmma_fit(const struct cuda_backend *c, int dt, size_t cols, int n)
{
    while (n > 1 && !qmma_fits(c, dt, n, cols))
        n--;
    return n;
}

/* Most whole blocks (256 columns) of a window of n tokens the tensor-core
 * GEMV on K-quant blocks stages (cuk_gemv_qmma_window), at most blocks
 * and CLLM_CUDA_QMMA_WINDOW's; 0 where none does. */
static int qmma_window_blocks(const struct cuda_backend *c, int dt, int blocks, int n)
{
    if (c->qmma_window > 0 && blocks > c->qmma_window / 256)
        blocks = c->qmma_window / 256;
    while (blocks > 0 && !qmma_fits(c, dt, n, (size_t)blocks * 256))
        blocks--;
    return blocks;
}

/* Whether a step of n tokens multiplies the quantized matrices' bf16
 * copies wherever they exist (wide_from; see wide_make). */
static bool wide_step(const struct cuda_backend *c, int n)
{
    return c->wide_bytes && n >= c->wide_from;
}

/* The device matrices n rows of x multiply for ts[0..k) (k <= 3; ws):
 * each one's upload, or its bf16 copy where every one of them has one
 * and the step is a wide_step, or of wide_small_from tokens or more where
 * the tensor-core GEMV takes the copies (a launch of at most
 * mma_max_bytes: WIDE_SMALL_FROM_N); the copies then route as a bf16
 * model's matrices. But where the tensor-core GEMV on K-quant blocks
 * takes the uploads (qmma_takes: 3-16 tokens), they stay: it reads a
 * quarter to two fifths of the copies' bytes and measured faster (H100,
 * 8-layer 8B Q4_K, 8 / 16 streams: copies 4,005 / 7,520 tok/s, blocks
 * 6,761 / 10,117; docs/benchmarks.md, session 60). -1 (the sticky
 * error) where one was not uploaded. */
static int mm_weights(struct cuda_backend *c, const struct tensor *const *ts, int k, int n,
                      const struct cuk_weight **ws)
{
    bool wide = k <= 3 && (wide_step(c, n) || (c->wide_bytes && n >= c->wide_small_from));
    const struct cuk_weight *cp[3] = {NULL, NULL, NULL};
    for (int i = 0; i < k; i++) {
        if (!(ws[i] = dev_weight(c, ts[i], "matmul")))
            return -1;
        wide = wide && wentry_of(ws[i])->wide.data;
        if (wide)
            cp[i] = &wentry_of(ws[i])->wide;
    }
    if (wide && !qmma_takes(c, ws, k, n) &&
        (wide_step(c, n) || mma_takes(c, (size_t)cp[0]->cols, half_bytes(cp, k), n)))
        memcpy(ws, cp, sizeof *ws * (size_t)k);
    return 0;
}

/* Whether n rows of x past the GEMVs' rows (at most CUK_STAGE_MAX_N) times
 * matrices of `bytes` 2-byte weights and cols columns go to the staged
 * GEMV although the tensor-core GEMV is on: launches it declines for their
 * size (mma_max_bytes: an 8B model's gate/up; an LM head is a plain
 * matmul, matmul_x, and stays on cuBLAS) whose x tiles fit (stage_x_max).
 * cuBLAS, which took them, needs the input's norm or SwiGLU as launches of
 * their own and launches without PDL; the staged GEMV fuses both (H200, 8B
 * at 2 streams: gate/up with its norm and SwiGLU 66 -> 58 us a layer;
 * docs/benchmarks.md, thirty-third pass). Past stage_x_max, with the
 * block's shared memory grown for x beside a 112 KB ring, it lost: 8B at
 * 3-4 streams -3 to -5 %, and nothing gained at 2 streams by the down
 * projection (thirty-fourth pass). Not where CLLM_CUDA_GEMV_MAX chose the
 * rows. */
static bool staged_big(const struct cuda_backend *c, size_t cols, size_t bytes, int n)
{
    return c->stage_big && c->gemv_staged && c->gemv_mma && !c->precise && !c->gemv_max_env &&
           n > c->gemv_max && n <= CUK_STAGE_MAX_N && (size_t)n * cols * 4 <= c->stage_x_max &&
           cols * 2 >= 4096 && bytes > c->mma_max_bytes; /* rows of a slot's 4 KB or more */
}

/* Whether decode-sized steps of dt weights take cuk_gemv_quant: GGUF's
 * low-bit formats always (in precise mode its exact kernel), Q8_0 by
 * default (activations rounded to 8 bits as the CPU and llama.cpp round
 * them; in precise mode gemv.cu's f32 kernels). */
static bool quant_gemv(const struct cuda_backend *c, enum dtype dt)
{
    return quant_is_low_bit(dt) || (dt == DT_Q8_0 && !c->precise);
}

/* Most tokens a quantized matmul runs as that GEMV (QUANT_GEMV_MAX_N, or
 * CLLM_CUDA_GEMV_MAX's bound); past them, the widened weights' GEMM. */
static int quant_gemv_max_n(const struct cuda_backend *c)
{
    return c->gemv_max_env ? c->gemv_max : QUANT_GEMV_MAX_N;
}

/* Whether n rows of activations over cols columns feed a GEMM, so that
 * the op making them should make their half copy too (half_out): past
 * the quantized GEMV's rows in a model of quantized matrices (mm_route's
 * split), else past gemv_rows. A wrong guess costs only time: half_x
 * checks that a copy is of its x. */
static bool feeds_gemm(const struct cuda_backend *c, size_t cols, int n)
{
    /* the copies' routes, a bf16 model's, unless the K-quants' tensor-core
     * GEMV keeps the blocks (mm_weights) */
    if (c->quant_type >= 0 && quant_gemv(c, (enum dtype)c->quant_type) &&
        (!wide_step(c, n) || (qmma_tokens(c, n, cols) && qmma_dtype(c->quant_type))))
        return n > quant_gemv_max_n(c) && !qmma_tokens(c, n, cols); /* qmma_takes' x: f32 */
    return !gemv_rows(c, cols, n);
}

static enum mm_route mm_route(const struct cuda_backend *c, const struct cuk_weight *const *ws,
                              int k, int n)
{
    const size_t cols = (size_t)ws[0]->cols;
    /* the tensor-core GEMV (qmma_takes), else cuk_gemv_quant up to
     * QUANT_GEMV_MAX_N tokens; past that, the weights widened chunk by
     * chunk for a GEMM */
    if (quant_gemv(c, (enum dtype)ws[0]->dtype))
        return qmma_takes(c, ws, k, n)            ? MM_MMA
               : n <= quant_gemv_max_n(c)         ? MM_GEMV
                                                  : MM_GEMM;
    if (gemv_rows(c, cols, n))
        return MM_GEMV;
    const size_t bytes = half_bytes(ws, k);
    return mma_takes(c, cols, bytes, n)     ? MM_MMA
           : staged_big(c, cols, bytes, n) ? MM_STAGED_BIG
                                           : MM_GEMM;
}

/* The kernel matmul_x takes for n rows of x times t: mm_route's, but a
 * plain matmul that staged_big would take (an LM head too big for the
 * tensor-core GEMV) stays on cuBLAS, which streams it at its floor. */
static enum mm_route plain_route(const struct cuda_backend *c, const struct cuk_weight *w, int n)
{
    const enum mm_route r = mm_route(c, &w, 1, n);
    return r == MM_STAGED_BIG ? MM_GEMM : r;
}

/* Whether matmul_x multiplies x . W^T with a cuBLAS GEMM (which can add
 * into its output) rather than a GEMV kernel; w: mm_weights'. */
static bool matmul_is_gemm(const struct cuda_backend *c, const struct cuk_weight *w, int n)
{
    return w->dtype == DT_F32 || plain_route(c, w, n) == MM_GEMM;
}

/* Most output rows the register-streamed GEMV takes with the RMSNorm in:
 * each of its blocks (a few warps of rows each) stages the norm itself,
 * which over a vocabulary of rows costs more than the norm's own launch
 * (H200, a 0.6B model's 151,936-row LM head: decode 1,154 -> 1,114 tok/s
 * fused). The staged GEMV, one block per SM, takes any count. */
#define NORM_FUSE_MAX_ROWS 32768

/* The tensor-core GEMV on K-quant blocks (qmma_takes' launches): one
 * launch where x of all n tokens fits a block's shared memory, else
 * windows of the weights' columns, else (a SwiGLU pair) runs of tokens.
 * cudaErrorNotSupported (nothing launched) where the first declines. */
static cudaError_t gemv_qmma(struct cuda_backend *c, float *const *outs,
                             const struct cuk_gemv_in *in, int n,
                             const struct cuk_weight *const *ws, int k, int out)
{
    const int blocks = ws[0]->cols / 256;
    const int dt = ws[0]->dtype, cols = ws[0]->cols;
    /* in clusters (cuk_qmma_cluster) a block stages its share of x; and
     * where that takes runs of tokens, the shortest run must be clustered
     * too, or it would stage all of its columns */
    int cl = cuk_qmma_cluster(&c->mma, dt, cols, n);
    int fit = qmma_fit(c, dt, (size_t)cols / cl, n);
    if (cl > 1 && cuk_qmma_cluster(&c->mma, dt, cols, n / ((n + fit - 1) / fit)) != cl) {
        cl = 1;
        fit = qmma_fit(c, dt, (size_t)cols, n);
    }
    const bool narrow = c->qmma_window > 0 && blocks * 256 > c->qmma_window; /* (asked) */
    const int per = (fit < n || narrow) && out != CUK_OUT_SWIGLU && c->qmma_window != 0
                        ? qmma_window_blocks(c, dt, blocks, n)
                        : 0;
    if (per > 0) {
        /* x too wide to stage whole (an 8B model's down projection:
         * 16 tokens of 14,336 columns): windows of its columns, sized
         * alike, each reading its columns of the weights once, the
         * first storing or adding, the others adding (H100, 8-layer
         * 8B Q4_K, 16 streams: the runs of tokens below read the
         * down projection's weights four times; docs/benchmarks.md,
         * session 60) */
        const int wins = (blocks + per - 1) / per;
        for (int b0 = 0, i = 0; i < wins; i++) {
            const int nb = (blocks - b0) / (wins - i);
            cudaError_t err =
                cuk_gemv_qmma_window(c->stream, outs, in, n, ws, k,
                                     i == 0 ? out : CUK_OUT_ADD, b0 * 256, nb * 256, &c->mma);
            if (err != cudaSuccess)
                return err; /* (every window has at most per blocks, which
                             * fit: a later one fails only on an error) */
            b0 += nb;
        }
        return cudaSuccess;
    }
    /* else runs of as many tokens as x's staging takes, sized alike,
     * each a launch reading the weights again */
    const int runs = (n + fit - 1) / fit;
    for (int t0 = 0, r = 0; r < runs; r++) {
        const int m = (n - t0) / (runs - r);
        float *o[3];
        for (int i = 0; i < k; i++)
            o[i] = outs[i] ? outs[i] + (size_t)t0 * ws[i]->rows : NULL;
        const struct cuk_gemv_in part = cuk_gemv_in_from(in, t0, ws[0]->cols);
        cudaError_t err = cuk_gemv_mma(c->stream, o, &part, m, ws, k, out, &c->mma);
        if (err != cudaSuccess)
            return err; /* (only the first run can decline: nothing issued) */
        t0 += m;
    }
    return cudaSuccess;
}

/* A GEMV launch of cuk_gemv_fused's contract on the kernel `route` (not
 * MM_GEMM) chose: the tensor-core GEMV; the staged GEMV; else (MM_GEMV) the
 * staged kernel for up to CUK_STAGE_MAX_N rows where it is on and takes
 * the shape, else the register-streamed one. cudaErrorNotSupported
 * (nothing launched) where none does. */
static cudaError_t gemv_fused(struct cuda_backend *c, enum mm_route route, float *const *outs,
                              const struct cuk_gemv_in *in, int n,
                              const struct cuk_weight *const *ws, int k, int out)
{
    if (route != MM_MMA && quant_gemv(c, (enum dtype)ws[0]->dtype)) /* one launch */
        return cuk_gemv_quant(c->stream, outs, in, n, ws, k, out, c->precise, &c->gq);
    if (route == MM_MMA && qmma_dtype(ws[0]->dtype))
        return gemv_qmma(c, outs, in, n, ws, k, out);
    if (route == MM_MMA)
        return cuk_gemv_mma(c->stream, outs, in, n, ws, k, out, &c->mma);
    if (route == MM_STAGED_BIG)
        return cuk_gemv_staged(c->stream, outs, in, n, ws, k, out, &c->stage);
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

/* out (+)= x . W^T by GEMMs over row chunks of w widened into a buffer of
 * c->widen_bytes: to f32 for SGEMM with x as it is (precise mode), or
 * else rounded to bf16 with x rounded to bf16 as a
 * bf16 model's GEMM reads it, for a tensor-core GEMM with f32
 * accumulation (bf16, not f16: activations past f16's range stay finite).
 * The weights' rounding, 2^-9 of each value, is inside their format's own
 * error: Q8_0's step is a 254th of its block's largest value, the 2-6-bit
 * formats' coarser; and x's is finer than the 8-bit rounding the
 * quantized GEMVs (and the CPU) apply to it. Q8_0 through SGEMM ran an 8B
 * prompt at 2,617 tok/s, through this 23,500 (H200, session 52). */
static int matmul_widened(struct cuda_backend *c, float *out, const float *x, int n,
                          const struct cuk_weight *w, bool acc, struct err *e)
{
    const bool bf16 = !c->precise;
    const void *xg = x;
    if (bf16) {
        const struct cuk_weight as_bf16 = {.dtype = DT_BF16, .rows = w->rows, .cols = w->cols};
        if (!(xg = half_x(c, x, n, &as_bf16)))
            return sticky(c, e);
    }
    const size_t vb = bf16 ? 2 : 4, fit = c->widen_bytes / vb / (size_t)w->cols;
    const int chunk = fit < 1 ? 1 : fit > (size_t)w->rows ? w->rows : (int)fit;
    void *wc = dbuf_get(c, &c->wf, (size_t)chunk * w->cols * vb, "widened weights");
    if (!wc)
        return sticky(c, e);
    for (int r0 = 0; r0 < w->rows; r0 += chunk) {
        int nr = w->rows - r0 < chunk ? w->rows - r0 : chunk;
        cudaError_t err = bf16 ? cuk_dequant_half(c->stream, wc, w, r0, nr, 1)
                               : cuk_dequant_f32(c->stream, wc, w, r0, nr);
        if (fail_cuda(c, "widen weights", err))
            return sticky(c, e);
        if (gemm(c, out + r0, w->rows, wc, xg, bf16 ? CUDA_R_16BF : CUDA_R_32F, nr, n, w->cols,
                 acc, e))
            return -1;
    }
    return 0;
}

/* out = x . W^T; out += x . W^T when acc (only where matmul_is_gemm). */
static int matmul_x(struct backend *be, float *out, const float *x, int n, const struct tensor *t,
                    bool acc, struct err *e)
{
    struct cuda_backend *c = cb(be);
    const struct cuk_weight *w;
    if (mm_weights(c, &t, 1, n, &w) || sticky(c, e))
        return sticky(c, e);
    if (w->dtype == DT_F32)
        return gemm(c, out, w->rows, w->data, x, CUDA_R_32F, w->rows, n, w->cols, acc, e);
    const enum mm_route route = plain_route(c, w, n);
    if (route == MM_GEMV) {
        if (acc)
            return err_set(e, "%s: internal: accumulating GEMV", c->name);
        struct cuk_gemv_in gi = {.kind = CUK_IN_X, .x = x};
        cudaError_t err = gemv_fused(c, route, &out, &gi, n, &w, 1, CUK_OUT_STORE);
        if (err == cudaErrorNotSupported && n <= CUK_GEMV_MAX) /* the scalar kernel takes any shape */
            err = cuk_gemv(c->stream, out, x, n, w);
        if (err != cudaErrorNotSupported) {
            if (fail_cuda(c, "gemv", err))
                return sticky(c, e);
            return 0;
        }
        /* more tokens than the scalar kernel takes (a low-bit matrix's
         * GEMV route) declined: the GEMM below */
    }
    if (!acc && route == MM_MMA) {
        struct cuk_gemv_in gi = {.kind = CUK_IN_X, .x = x};
        cudaError_t err = gemv_fused(c, route, &out, &gi, n, &w, 1, CUK_OUT_STORE);
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
    return matmul_widened(c, out, x, n, w, acc, e);
}

int cu_matmul(struct backend *be, float *out, const float *x, int n, const struct tensor *t,
              struct err *e)
{
    op_begin(be);
    return matmul_x(be, out, x, n, t, false, e);
}

/* Several matmuls over the same x (q/k/v, gate/up): one GEMV launch for
 * decode-sized n and f16/bf16/Q8_0 weights, else one matmul each. */
int cu_matmul_multi(struct backend *be, float *const *outs, const float *x, int n,
                    const struct tensor *const *ts, int k, struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    const struct cuk_weight *ws[3];
    const bool few = k >= 1 && k <= 3;
    if (few && mm_weights(c, ts, k, n, ws))
        return sticky(c, e);
    if (sticky(c, e))
        return -1;
    const enum mm_route route = few ? mm_route(c, ws, k, n) : MM_GEMM;
    if (c->fuse && route != MM_GEMM) {
        struct cuk_gemv_in gi = {.kind = CUK_IN_X, .x = x};
        cudaError_t err = gemv_fused(c, route, outs, &gi, n, ws, k, CUK_OUT_STORE);
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
    if (pair >= 0 && route == MM_GEMM && !c->precise && !c->tc_ws && c->gemm_pair) {
        const struct cuk_weight *p0 = ws[pair], *p1 = ws[pair + 1];
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
                            dim == c->model_dim && feeds_gemm(c, (size_t)dim, n));
    int bf = act_half(c) == DT_BF16;
    if (y && c->fuse) {
        fail_cuda(c, "add_rmsnorm", cuk_add_rmsnorm(c->stream, out, x, y, dw, n, dim, eps, oh, bf));
        return;
    }
    if (y && fail_cuda(c, "add", cuk_add(c->stream, x, y, (size_t)n * dim)))
        return;
    fail_cuda(c, "rmsnorm", cuk_rmsnorm(c->stream, out, x, dw, n, dim, eps, oh, bf));
}

void cu_add_rmsnorm(struct backend *be, float *out, float *x, const float *y,
                    const float *w, int n, int dim, float eps)
{
    norm_run(be, out, x, y, w, n, dim, eps);
}

void cu_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n,
                int dim, float eps)
{
    norm_run(be, out, (float *)x, NULL, w, n, dim, eps); /* no y: x is not written */
}

void cu_add_bias(struct backend *be, float *x, const float *b, int n, int dim)
{
    struct cuda_backend *c = op_begin(be);
    const float *db = dev_vec(c, b, "add_bias");
    if (db && !c->err[0])
        fail_cuda(c, "add_bias", cuk_add_bias(c->stream, x, db, n, dim));
}

void cu_silu_mul(struct backend *be, float *g, const float *u, size_t n)
{
    struct cuda_backend *c = op_begin(be);
    if (c->err[0])
        return;
    /* gate of a GEMM-sized chunk: the input of the down projection */
    bool gemm_next = c->ffn_dim > 0 && n % (size_t)c->ffn_dim == 0 &&
                     feeds_gemm(c, (size_t)c->ffn_dim, (int)(n / (size_t)c->ffn_dim));
    uint16_t *gh = half_out(c, g, n, gemm_next);
    fail_cuda(c, "silu_mul", cuk_silu_mul(c->stream, g, u, n, gh, act_half(c) == DT_BF16));
}

void cu_add(struct backend *be, float *x, const float *y, size_t n)
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
int cu_matmul_fused(struct backend *be, float *const *outs, const struct matmul_in *in,
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
    const struct cuk_weight *ws[3];
    if (mm_weights(c, ts, k, n, ws))
        return sticky(c, e);
    const enum mm_route route = mm_route(c, ws, k, n);
    /* Matrices of two dtypes (a Q4_K_M file's q/k/v where v is Q6_K, in
     * half its layers): no GEMV launch takes them together, and the plain
     * ops below would launch the norm and then each matrix alone. So each
     * dtype's run is a fused launch of its own, each applying the input
     * op itself, where both runs take a GEMV. Not a SwiGLU pair, whose
     * launch needs both sums, nor a SwiGLU input, which the plain ops
     * write in place. */
    const int run = same_run(ws, k);
    if (c->fuse && c->split_dtypes && run < k && out != MATMUL_OUT_SWIGLU &&
        in->kind != MATMUL_IN_SWIGLU && mm_route(c, ws, run, n) != MM_GEMM &&
        mm_route(c, ws + run, k - run, n) != MM_GEMM)
        return cu_matmul_fused(be, outs, in, n, ts, run, out, e) ||
                       cu_matmul_fused(be, outs + run, in, n, ts + run, k - run, out, e)
                   ? -1
                   : 0;
    if (c->fuse && route != MM_GEMM) {
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
        cudaError_t err = gemv_fused(c, route, outs, &gi, n, ws, k,
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
        gemms = gemms && matmul_is_gemm(c, ws[i], n);
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
