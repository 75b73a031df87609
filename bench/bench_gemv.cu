/* bench_gemv - times cuk_gemv / cuk_gemv_multi on decode shapes (Llama-3-8B
 * and Qwen3-0.6B, bf16; Q8_0 for a few) for n = 1, 2, 4, 8 tokens, checks
 * every result against a double-precision reference kernel, and prints
 * weight bandwidth, % of --bw, and the GEMV time of one whole decode step.
 * Then, per shape, cuk_gemv_fused with the neighbour a decode layer fuses
 * into it (rmsnorm before q/k/v and gate/up, the residual add after o,
 * SwiGLU before and the residual add after down) against the kernels it
 * replaces (cuk_rmsnorm / cuk_silu_mul, cuk_gemv, cuk_add): bit for bit,
 * and the time of both.
 *
 *   bench_gemv [--bw BYTES_PER_S] [--reps N] [--quick] [--pdl] [--staged KB,...]
 *              [--stage-cols N] [--stage-blocks N]
 *
 * --pdl launches with programmatic dependent launch (as decode does);
 * --staged also times cuk_gemv_staged (one row) with each shared-memory
 * budget, on every shape (cfg.any_size: the sizes it declines by default
 * too).
 *
 * Timing replays a CUDA graph of --reps calls (as decode runs). Each
 * timed matrix is cycled through enough copies (>= 256 MB in all)
 * that the weights do not stay in the 50 MB L2. Exit status 1 on a CUDA error,
 * a relative error above 1e-5, or fused (multi, fused neighbours) != unfused
 * bit for bit. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "bench_cuda.cuh"
#include "model/tensor.h"

__global__ void k_fill_i8(int8_t *q, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        q[i] = (int8_t)((int)(hash32(i, seed) % 255u) - 127);
}

__global__ void k_fill_scales(uint16_t *s, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        s[i] = __half_as_ushort(__float2half(0.004f + 0.004f * fabsf(urand(i, seed))));
}


/* One warp per row, double accumulation, all n tokens. */
__global__ void k_ref(double *out, const float *x, const void *w, const uint16_t *sc, int q8,
                      int rows, int cols, int n)
{
    int row = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    for (int j = 0; j < n; j++) {
        double s = 0;
        for (int c = lane; c < cols; c += 32) {
            size_t i = (size_t)row * cols + c;
            double wv;
            if (q8)
                wv = (double)__half2float(__ushort_as_half(sc[i / 32])) * ((const int8_t *)w)[i];
            else
                wv = (double)__uint_as_float((uint32_t)((const uint16_t *)w)[i] << 16);
            s += wv * x[(size_t)j * cols + c];
        }
        for (int o = 16; o > 0; o >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0)
            out[(size_t)j * rows + row] = s;
    }
}

struct mat {
    int rows, cols, q8;
    int copies;
    void **data;      /* [copies] */
    uint16_t **scales; /* [copies], Q8_0 */
};

static size_t mat_bytes(const struct mat *m)
{
    size_t b = (size_t)m->rows * m->cols * (m->q8 ? 1 : 2);
    if (m->q8)
        b += (size_t)m->rows * (m->cols / 32) * 2;
    return b;
}

static void mat_init(struct mat *m, int rows, int cols, int q8, int copies, uint32_t seed)
{
    m->rows = rows;
    m->cols = cols;
    m->q8 = q8;
    m->copies = copies;
    m->data = (void **)calloc((size_t)copies, sizeof(void *));
    m->scales = (uint16_t **)calloc((size_t)copies, sizeof(uint16_t *));
    size_t nel = (size_t)rows * cols;
    for (int c = 0; c < copies; c++) {
        if (q8) {
            CK(cudaMalloc(&m->data[c], nel));
            CK(cudaMalloc((void **)&m->scales[c], nel / 32 * 2));
        } else {
            CK(cudaMalloc(&m->data[c], nel * 2));
        }
    }
    /* copy 0 random; the others equal copies (timing only) */
    if (q8) {
        k_fill_i8<<<1024, 256>>>((int8_t *)m->data[0], nel, seed);
        k_fill_scales<<<1024, 256>>>(m->scales[0], nel / 32, seed + 1);
    } else {
        k_fill_bf16<<<1024, 256>>>((uint16_t *)m->data[0], nel, seed, 1.0f);
    }
    CK(cudaGetLastError());
    for (int c = 1; c < copies; c++) {
        CK(cudaMemcpy(m->data[c], m->data[0], q8 ? nel : nel * 2, cudaMemcpyDeviceToDevice));
        if (q8)
            CK(cudaMemcpy(m->scales[c], m->scales[0], nel / 32 * 2, cudaMemcpyDeviceToDevice));
    }
}

static void mat_free(struct mat *m)
{
    for (int c = 0; c < m->copies; c++) {
        CK(cudaFree(m->data[c]));
        if (m->scales[c])
            CK(cudaFree(m->scales[c]));
    }
    free(m->data);
    free(m->scales);
}

static struct cuk_weight mat_w(const struct mat *m, int c)
{
    struct cuk_weight w;
    w.dtype = m->q8 ? DT_Q8_0 : DT_BF16;
    w.rows = m->rows;
    w.cols = m->cols;
    w.data = m->data[c];
    w.scales = m->q8 ? m->scales[c] : NULL;
    return w;
}

struct shape {
    const char *name;
    int k, rows[3], cols, q8;
    int in, add; /* the neighbours a decode layer fuses into it (CUK_IN_*, residual add) */
};

static int g_fail = 0;
/* --staged KB,...: for one row, also time cuk_gemv_staged with each of
 * these shared-memory budgets (KB; the default when 0), after the fused
 * kernel; --stage-cols N: its columns per copy; --stage-blocks N: its
 * blocks (default one per SM) */
static int g_stage_kb[8], g_n_stage, g_stage_cols, g_stage_blocks;

/* Runs shape sh (k matrices over one x) for n tokens: check, then time.
 * Returns microseconds per call. */
static double run_shape(const struct shape *sh, struct mat *ms, int n, const float *dx,
                        float **douts, double *dref, int reps, double bw)
{
    int k = sh->k, cols = sh->cols;
    struct cuk_weight w[3];
    const struct cuk_weight *wp[3];
    size_t bytes = 0;
    for (int i = 0; i < k; i++)
        bytes += mat_bytes(&ms[i]);
    /* correctness, copy 0 */
    double maxrel = 0;
    for (int i = 0; i < k; i++) {
        w[i] = mat_w(&ms[i], 0);
        wp[i] = &w[i];
    }
    bool multi = k > 1;
    if (multi)
        CK(cuk_gemv_multi(0, douts, dx, n, wp, k));
    else
        for (int i = 0; i < k; i++)
            CK(cuk_gemv(0, douts[i], dx, n, wp[i]));
    CK(cudaDeviceSynchronize());
    for (int i = 0; i < k; i++) {
        int rows = ms[i].rows;
        size_t cnt = (size_t)n * rows;
        k_ref<<<(rows + 7) / 8, 256>>>(dref, dx, ms[i].data[0], ms[i].scales[0], ms[i].q8, rows,
                                       cols, n);
        CK(cudaGetLastError());
        float *got = (float *)malloc(cnt * 4);
        double *ref = (double *)malloc(cnt * 8);
        CK(cudaMemcpy(got, douts[i], cnt * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(ref, dref, cnt * 8, cudaMemcpyDeviceToHost));
        double md = 0, mr = 0;
        for (size_t e = 0; e < cnt; e++) {
            double d = fabs((double)got[e] - ref[e]);
            if (d > md || isnan(d))
                md = isnan(d) ? INFINITY : d;
            if (fabs(ref[e]) > mr)
                mr = fabs(ref[e]);
        }
        double rel = md / (mr > 0 ? mr : 1);
        if (rel > maxrel)
            maxrel = rel;
        if (multi) { /* fused == unfused, bit for bit */
            float *one = (float *)malloc(cnt * 4);
            CK(cuk_gemv(0, douts[i], dx, n, wp[i]));
            CK(cudaMemcpy(one, douts[i], cnt * 4, cudaMemcpyDeviceToHost));
            if (memcmp(one, got, cnt * 4)) {
                printf("FAIL %s n=%d: cuk_gemv_multi != cuk_gemv for matrix %d\n", sh->name, n,
                       i);
                g_fail = 1;
            }
            free(one);
        }
        free(got);
        free(ref);
    }
    if (!(maxrel <= 1e-5)) {
        printf("FAIL %s n=%d: max rel err %.3g > 1e-5\n", sh->name, n, maxrel);
        g_fail = 1;
    }
    /* timing: reps calls cycling the copies, recorded into one CUDA graph
     * (as decode runs); one warm-up replay, then one timed replay */
    double us = time_graph(1, reps, ms[0].copies, [&](cudaStream_t st, int c) {
        for (int i = 0; i < k; i++) {
            w[i] = mat_w(&ms[i], c);
            wp[i] = &w[i];
        }
        if (multi)
            CK(cuk_gemv_multi(st, douts, dx, n, wp, k));
        else
            for (int i = 0; i < k; i++)
                CK(cuk_gemv(st, douts[i], dx, n, wp[i]));
    });
    double gbs = bytes / (us * 1e-6) / 1e9;
    printf("%-22s n=%d %9.2f us %8.1f GB/s %5.1f%%  maxrel %.2e%s\n", sh->name, n, us, gbs,
           100.0 * gbs * 1e9 / bw, maxrel, multi ? "  (multi)" : "");
    for (int si = 0; n == 1 && si < g_n_stage; si++) {
        struct cuk_stage_cfg cfg = {g_stage_blocks, g_stage_cols, g_stage_kb[si] * 1024, 1, 0, 0};
        struct cuk_gemv_in in = {};
        in.kind = CUK_IN_X;
        in.x = dx;
        cudaError_t err = cuk_gemv_staged(0, douts, &in, 1, wp, k, CUK_OUT_STORE, &cfg);
        if (err == cudaErrorNotSupported) {
            printf("%-22s n=1 staged %3d KB: not taken\n", sh->name, g_stage_kb[si]);
            continue;
        }
        CK(err);
        double sus = time_graph(1, reps, ms[0].copies, [&](cudaStream_t st, int c) {
            for (int i = 0; i < k; i++) {
                w[i] = mat_w(&ms[i], c);
                wp[i] = &w[i];
            }
            CK(cuk_gemv_staged(st, douts, &in, 1, wp, k, CUK_OUT_STORE, &cfg));
        });
        double sg = bytes / (sus * 1e-6) / 1e9;
        printf("%-22s n=1 staged %3d KB %9.2f us %8.1f GB/s %5.1f%%\n", sh->name, g_stage_kb[si],
               sus, sg, 100.0 * sg * 1e9 / bw);
    }
    fflush(stdout);
    return us;
}

/* Work buffers of run_fused: x2 (SwiGLU's up), the norm weights, the
 * plain kernels' intermediate rows and products, the fused and the plain
 * outputs (which start from the same values when added to). */
struct fbufs {
    float *x2, *nw, *mid, *prod, *init[3], *ref[3];
};

/* The plain kernels sh's fused call replaces, into outs: for SwiGLU the
 * gate is fb->mid (silu_mul works in place; the caller puts x there). */
static void plain_issue(cudaStream_t st, const struct shape *sh, const struct cuk_weight *const *wp,
                        int n, const float *dx, float *const *outs, const struct fbufs *fb)
{
    const float eps = 1e-6f;
    size_t nx = (size_t)n * sh->cols;
    const float *in = dx;
    if (sh->in == CUK_IN_RMSNORM) {
        CK(cuk_rmsnorm(st, fb->mid, dx, fb->nw, n, sh->cols, eps, NULL, 0));
        in = fb->mid;
    } else if (sh->in == CUK_IN_SWIGLU) {
        CK(cuk_silu_mul(st, fb->mid, fb->x2, nx, NULL, 0));
        in = fb->mid;
    }
    for (int i = 0; i < sh->k; i++) {
        CK(cuk_gemv(st, sh->add ? fb->prod : outs[i], in, n, wp[i]));
        if (sh->add)
            CK(cuk_add(st, outs[i], fb->prod, (size_t)n * sh->rows[i]));
    }
}

/* cuk_gemv_fused with sh's neighbours against the plain kernels: bit for
 * bit, then the time of each. plain_us / fused_us get the times. */
static void run_fused(const struct shape *sh, struct mat *ms, int n, const float *dx,
                      float **douts, const struct fbufs *fb, int reps, double *plain_us,
                      double *fused_us)
{
    int k = sh->k;
    struct cuk_weight w[3];
    const struct cuk_weight *wp[3];
    for (int i = 0; i < k; i++) {
        w[i] = mat_w(&ms[i], 0);
        wp[i] = &w[i];
    }
    struct cuk_gemv_in in = {};
    in.kind = sh->in;
    in.x = dx;
    in.x2 = fb->x2;
    in.nw = fb->nw;
    in.eps = 1e-6f;
    for (int i = 0; i < k; i++) {
        size_t no = (size_t)n * sh->rows[i];
        CK(cudaMemcpy(douts[i], fb->init[i], no * 4, cudaMemcpyDeviceToDevice));
        CK(cudaMemcpy(fb->ref[i], fb->init[i], no * 4, cudaMemcpyDeviceToDevice));
    }
    CK(cuk_gemv_fused(0, douts, &in, n, wp, k, sh->add ? CUK_OUT_ADD : CUK_OUT_STORE));
    CK(cudaMemcpy(fb->mid, dx, (size_t)n * sh->cols * 4, cudaMemcpyDeviceToDevice));
    plain_issue(0, sh, wp, n, dx, fb->ref, fb);
    CK(cudaDeviceSynchronize());
    for (int i = 0; i < k; i++) {
        size_t no = (size_t)n * sh->rows[i];
        float *a = (float *)malloc(no * 4), *b = (float *)malloc(no * 4);
        CK(cudaMemcpy(a, douts[i], no * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b, fb->ref[i], no * 4, cudaMemcpyDeviceToHost));
        if (memcmp(a, b, no * 4)) {
            size_t bad = 0;
            for (size_t e = 0; e < no; e++)
                bad += a[e] != b[e];
            printf("FAIL %s n=%d fused: %zu of %zu outputs of matrix %d differ from the plain "
                   "kernels\n", sh->name, n, bad, no, i);
            g_fail = 1;
        }
        free(a);
        free(b);
    }
    int copies = ms[0].copies;
    *fused_us = time_graph(1, reps, copies, [&](cudaStream_t st, int c) {
        for (int i = 0; i < k; i++)
            w[i] = mat_w(&ms[i], c);
        CK(cuk_gemv_fused(st, douts, &in, n, wp, k, sh->add ? CUK_OUT_ADD : CUK_OUT_STORE));
    });
    *plain_us = time_graph(1, reps, copies, [&](cudaStream_t st, int c) {
        for (int i = 0; i < k; i++)
            w[i] = mat_w(&ms[i], c);
        plain_issue(st, sh, wp, n, dx, fb->ref, fb);
    });
    for (int si = 0; n == 1 && si < g_n_stage; si++) {
        struct cuk_stage_cfg cfg = {g_stage_blocks, g_stage_cols, g_stage_kb[si] * 1024, 1, 0, 0};
        double us = time_graph(1, reps, copies, [&](cudaStream_t st, int c) {
            for (int i = 0; i < k; i++)
                w[i] = mat_w(&ms[i], c);
            cudaError_t err = cuk_gemv_staged(st, douts, &in, 1, wp, k,
                                              sh->add ? CUK_OUT_ADD : CUK_OUT_STORE, &cfg);
            if (err != cudaErrorNotSupported)
                CK(err);
        });
        printf("%-22s n=%d staged %3d KB %9.2f us (%+.2f us vs fused)\n", sh->name, n,
               g_stage_kb[si], us, us - *fused_us);
    }
    static const char *what[] = {"", "+rmsnorm", "+swiglu"};
    printf("%-22s n=%d fused%s%s %9.2f us, plain kernels %9.2f us (%+.2f us)\n", sh->name, n,
           what[sh->in], sh->add ? "+add" : "", *fused_us, *plain_us, *fused_us - *plain_us);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    double bw = 4.26e12;
    int reps = 50, quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bw") && i + 1 < argc)
            bw = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--pdl"))
            cuk_set_pdl(1);
        else if (!strcmp(argv[i], "--stage-cols") && i + 1 < argc)
            g_stage_cols = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stage-blocks") && i + 1 < argc)
            g_stage_blocks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--staged") && i + 1 < argc)
            for (char *t = strtok(argv[++i], ","); t && g_n_stage < 8; t = strtok(NULL, ","))
                g_stage_kb[g_n_stage++] = atoi(t);
        else {
            fprintf(stderr, "usage: %s [--bw BYTES_PER_S] [--reps N] [--quick] [--pdl] [--staged KB,...] "
                            "[--stage-cols N] [--stage-blocks N]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1)
        reps = 1;
    int dev = 0;
    CK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("device: %s, %d SMs, L2 %d MB; floor bandwidth %.3g B/s, %d reps\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, bw, reps);

    /* model: 0 = Llama-3-8B (32 layers), 1 = Qwen3-0.6B (28 layers), 2 = Q8_0 extras;
     * per_step = times the shape runs in one decode step */
    struct {
        struct shape s;
        int model, per_step;
    } shapes[] = {
        {{"8B qkv", 3, {4096, 1024, 1024}, 4096, 0, CUK_IN_RMSNORM, 0}, 0, 32},
        {{"8B o", 1, {4096, 0, 0}, 4096, 0, CUK_IN_X, 1}, 0, 32},
        {{"8B gate/up", 2, {14336, 14336, 0}, 4096, 0, CUK_IN_RMSNORM, 0}, 0, 32},
        {{"8B down", 1, {4096, 0, 0}, 14336, 0, CUK_IN_SWIGLU, 1}, 0, 32},
        {{"8B lm_head", 1, {128256, 0, 0}, 4096, 0, CUK_IN_X, 0}, 0, 1},
        {{"0.6B qkv", 3, {2048, 1024, 1024}, 1024, 0, CUK_IN_RMSNORM, 0}, 1, 28},
        {{"0.6B o", 1, {1024, 0, 0}, 2048, 0, CUK_IN_X, 1}, 1, 28},
        {{"0.6B gate/up", 2, {3072, 3072, 0}, 1024, 0, CUK_IN_RMSNORM, 0}, 1, 28},
        {{"0.6B down", 1, {1024, 0, 0}, 3072, 0, CUK_IN_SWIGLU, 1}, 1, 28},
        {{"0.6B lm_head", 1, {151936, 0, 0}, 1024, 0, CUK_IN_X, 0}, 1, 1},
        {{"Q8 8B qkv", 3, {4096, 1024, 1024}, 4096, 1, CUK_IN_RMSNORM, 0}, 2, 0},
        {{"Q8 8B gate/up", 2, {14336, 14336, 0}, 4096, 1, CUK_IN_RMSNORM, 0}, 2, 0},
        {{"Q8 8B down", 1, {4096, 0, 0}, 14336, 1, CUK_IN_SWIGLU, 1}, 2, 0},
        {{"Q8 0.6B o", 1, {1024, 0, 0}, 2048, 1, CUK_IN_X, 1}, 2, 0},
    };
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    int ns[] = {1, 2, 4, 8};
    const int nn = 4;
    double step_us[2][4] = {{0}}, step_bytes[2] = {0};
    double step_fused[2][4] = {{0}}, step_plain[2][4] = {{0}};

    float *dx, *douts[3];
    double *dref;
    int maxcols = 14336, maxrows = 151936;
    CK(cudaMalloc((void **)&dx, (size_t)8 * maxcols * 4));
    for (int i = 0; i < 3; i++)
        CK(cudaMalloc((void **)&douts[i], (size_t)8 * maxrows * 4));
    CK(cudaMalloc((void **)&dref, (size_t)8 * maxrows * 8));
    struct fbufs fb;
    CK(cudaMalloc((void **)&fb.x2, (size_t)8 * maxcols * 4));
    CK(cudaMalloc((void **)&fb.nw, (size_t)maxcols * 4));
    CK(cudaMalloc((void **)&fb.mid, (size_t)8 * maxcols * 4));
    CK(cudaMalloc((void **)&fb.prod, (size_t)8 * maxrows * 4));
    for (int i = 0; i < 3; i++) {
        CK(cudaMalloc((void **)&fb.init[i], (size_t)8 * maxrows * 4));
        CK(cudaMalloc((void **)&fb.ref[i], (size_t)8 * maxrows * 4));
        k_fill_f32<<<256, 256>>>(fb.init[i], (size_t)8 * maxrows, 7u + i);
    }
    k_fill_f32<<<256, 256>>>(fb.x2, (size_t)8 * maxcols, 5u);
    k_fill_f32<<<256, 256>>>(fb.nw, (size_t)maxcols, 6u);
    CK(cudaGetLastError());

    for (int si = 0; si < nshapes; si++) {
        const struct shape *sh = &shapes[si].s;
        if (quick && shapes[si].model == 2)
            continue;
        size_t bytes = 0;
        for (int i = 0; i < sh->k; i++)
            bytes += (size_t)sh->rows[i] * sh->cols * (sh->q8 ? 1 : 2);
        int copies = (int)((256u << 20) / bytes) + 1;
        if (copies > 128)
            copies = 128;
        if (copies < 1)
            copies = 1;
        struct mat ms[3];
        for (int i = 0; i < sh->k; i++)
            mat_init(&ms[i], sh->rows[i], sh->cols, sh->q8, copies, 1234u + 17u * si + i);
        k_fill_f32<<<256, 256>>>(dx, (size_t)8 * sh->cols, 99u + si);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        for (int ni = 0; ni < nn; ni++) {
            double us = run_shape(sh, ms, ns[ni], dx, douts, dref, reps, bw);
            int md = shapes[si].model;
            if (md < 2)
                step_us[md][ni] += us * shapes[si].per_step;
        }
        for (int ni = 0; ni < nn && (sh->in != CUK_IN_X || sh->add); ni++) {
            double pu = 0, fu = 0;
            run_fused(sh, ms, ns[ni], dx, douts, &fb, reps, &pu, &fu);
            int md = shapes[si].model;
            if (md < 2) {
                step_plain[md][ni] += pu * shapes[si].per_step;
                step_fused[md][ni] += fu * shapes[si].per_step;
            }
        }
        int md = shapes[si].model;
        if (md < 2)
            for (int i = 0; i < sh->k; i++)
                step_bytes[md] += (double)mat_bytes(&ms[i]) * shapes[si].per_step;
        for (int i = 0; i < sh->k; i++)
            mat_free(&ms[i]);
    }
    const char *mname[2] = {"Llama-3-8B step (32 layers + lm_head)",
                            "Qwen3-0.6B step (28 layers + lm_head)"};
    for (int md = 0; md < 2; md++) {
        double floor_ms = step_bytes[md] / bw * 1e3;
        for (int ni = 0; ni < nn; ni++)
            printf("%s n=%d: %.3f ms GEMV, floor %.3f ms (%.2f GB), %.1f%% of floor\n", mname[md],
                   ns[ni], step_us[md][ni] / 1e3, floor_ms, step_bytes[md] / 1e9,
                   100.0 * floor_ms / (step_us[md][ni] / 1e3));
        for (int ni = 0; ni < nn; ni++)
            printf("%s n=%d: layer GEMVs with their neighbours fused %.3f ms, as plain kernels "
                   "%.3f ms\n", mname[md], ns[ni], step_fused[md][ni] / 1e3,
                   step_plain[md][ni] / 1e3);
    }
    CK(cudaFree(dx));
    for (int i = 0; i < 3; i++)
        CK(cudaFree(douts[i]));
    CK(cudaFree(dref));
    float *fbb[] = {fb.x2, fb.nw, fb.mid, fb.prod, fb.init[0], fb.init[1], fb.init[2], fb.ref[0],
                    fb.ref[1], fb.ref[2]};
    for (size_t i = 0; i < sizeof fbb / sizeof fbb[0]; i++)
        CK(cudaFree(fbb[i]));
    printf(g_fail ? "RESULT: FAIL\n" : "RESULT: OK\n");
    return g_fail;
}
