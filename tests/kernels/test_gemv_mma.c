/* test_gemv_mma - the tensor-core GEMV of batched decode steps
 * (cuk_gemv_mma) against a double-precision host product of the half
 * copies the unfused path makes (cuk_rmsnorm's and cuk_silu_mul's, or x
 * rounded by cuk_f32_to_half): bf16 and f16, 1 to 16 tokens, each input op
 * (x, rmsnorm(x), silu(x) * x2) and output op (store, residual add, the
 * SwiGLU of a gate/up pair), up to three matrices of other row counts,
 * rows that end inside a tile, few SMs (many rounds of units) and many
 * (column slices summed across warps); that nothing past the n output
 * rows is written, that a call repeats its bits (with x copied in as f32
 * where it fits, and staged through registers), and that it declines
 * what it does not take. Links the kernel library directly; prints
 * "skipped: no GPU" and passes without a Hopper GPU. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "kernels/half_host.h"
#include "model/tensor.h"
#include "testutil.h"

static struct cuk_mma_cfg dev_cfg;

struct mcase {
    int n, cols, k, rows[3];
    int in, out; /* CUK_IN_*, CUK_OUT_* */
    int n_sms;   /* 0: the GPU's */
};

static float *dev_floats(const float *h, size_t n)
{
    float *d = NULL;
    cudaMalloc((void **)&d, n * 4);
    cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice);
    return d;
}

static float *rand_floats(size_t n, float scale)
{
    float *h = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        h[i] = frand() * scale;
    return h;
}

static const char *dt_name(int dt) { return dt == DT_BF16 ? "bf16" : "f16"; }

static double silu(double g) { return g / (1.0 + exp(-g)); }

/* warps: a block's (0: automatic) */
static void check_case(int dt, struct mcase m, int warps)
{
    const int n = m.n, cols = m.cols, k = m.k, pair = m.out == CUK_OUT_SWIGLU;
    const int bf = dt == DT_BF16;
    const float eps = 1e-6f;
    char what[160];
    snprintf(what, sizeof what, "%s n %d cols %d rows %d/%d/%d in %d out %d sms %d warps %d",
             dt_name(dt), n, cols, m.rows[0], k > 1 ? m.rows[1] : 0, k > 2 ? m.rows[2] : 0, m.in,
             m.out, m.n_sms, warps);
    /* the input rows and the half copy the unfused path would make */
    float *hx = rand_floats((size_t)n * cols, 2.0f), *hx2 = rand_floats((size_t)n * cols, 2.0f);
    float *hnw = rand_floats((size_t)cols, 1.0f);
    float *dx = dev_floats(hx, (size_t)n * cols), *dx2 = dev_floats(hx2, (size_t)n * cols);
    float *dnw = dev_floats(hnw, (size_t)cols), *dtmp = NULL;
    uint16_t *dxh = NULL, *xh = malloc((size_t)n * cols * 2);
    cudaMalloc((void **)&dtmp, (size_t)n * cols * 4);
    cudaMalloc((void **)&dxh, (size_t)n * cols * 2);
    if (m.in == CUK_IN_RMSNORM)
        cuk_rmsnorm(0, dtmp, dx, dnw, n, cols, eps, dxh, bf);
    else if (m.in == CUK_IN_SWIGLU) {
        cudaMemcpy(dtmp, dx, (size_t)n * cols * 4, cudaMemcpyDeviceToDevice);
        cuk_silu_mul(0, dtmp, dx2, (size_t)n * cols, dxh, bf);
    } else
        cuk_f32_to_half(0, dxh, dx, (size_t)n * cols, bf);
    cudaMemcpy(xh, dxh, (size_t)n * cols * 2, cudaMemcpyDeviceToHost);

    struct cuk_weight w[3];
    const struct cuk_weight *wp[3];
    uint16_t *hw[3];
    float *dout[3], *init[3], *got[3];
    for (int i = 0; i < k; i++) {
        size_t nw = (size_t)m.rows[i] * cols;
        hw[i] = malloc(nw * 2);
        for (size_t j = 0; j < nw; j++)
            hw[i][j] = to_half(frand() * 0.5f, dt);
        void *d = NULL;
        cudaMalloc(&d, nw * 2);
        cudaMemcpy(d, hw[i], nw * 2, cudaMemcpyHostToDevice);
        w[i] = (struct cuk_weight){.dtype = dt, .rows = m.rows[i], .cols = cols, .data = d};
        wp[i] = &w[i];
        /* n rows of output and one more (a sentinel row) */
        size_t no = (size_t)(n + 1) * m.rows[i];
        init[i] = rand_floats(no, 1.0f);
        got[i] = malloc(no * 4);
        dout[i] = dev_floats(init[i], no);
    }
    const struct cuk_gemv_in in = {.kind = m.in, .x = dx, .x2 = dx2, .nw = dnw, .eps = eps};
    struct cuk_mma_cfg cfg = dev_cfg;
    if (m.n_sms > 0)
        cfg.n_sms = m.n_sms;
    cfg.warps = warps;
    cudaError_t err = cuk_gemv_mma(0, dout, &in, n, wp, k, m.out, &cfg);
    cudaError_t sync = cudaDeviceSynchronize();
    CHECK(err == cudaSuccess && sync == cudaSuccess, "%s: %s / %s", what, cudaGetErrorString(err),
          cudaGetErrorString(sync));
    for (int i = 0; i < k; i++)
        cudaMemcpy(got[i], dout[i], (size_t)(n + 1) * m.rows[i] * 4, cudaMemcpyDeviceToHost);

    double worst = 0;
    bool kept = true;
    for (int i = 0; i < (pair ? 1 : k); i++) {
        const int rows = m.rows[i];
        for (int t = 0; t < n; t++)
            for (int r = 0; r < rows; r++) {
                double v[2] = {0, 0}, mag[2] = {0, 0};
                for (int h = 0; h < (pair ? 2 : 1); h++)
                    for (int c = 0; c < cols; c++) {
                        double p = (double)from_half(hw[i + h][(size_t)r * cols + c], dt) *
                                   from_half(xh[(size_t)t * cols + c], dt);
                        v[h] += p;
                        mag[h] += fabs(p);
                    }
                size_t o = (size_t)t * rows + r;
                double want, tol;
                if (pair) { /* d(silu(g) u) = silu'(g) u dg + silu(g) du, |silu'| < 1.1 */
                    want = silu(v[0]) * v[1];
                    tol = 1.1 * fabs(v[1]) * mag[0] + fabs(silu(v[0])) * mag[1];
                } else {
                    want = v[0] + (m.out == CUK_OUT_ADD ? init[i][o] : 0.0);
                    tol = mag[0];
                }
                double e = fabs(got[i][o] - want) / (tol + 1e-30);
                if (!(e <= worst))
                    worst = isnan(e) ? INFINITY : e;
            }
        for (int r = 0; r < rows; r++) /* the row past n */
            kept = kept && got[i][(size_t)n * rows + r] == init[i][(size_t)n * rows + r];
    }
    if (pair) /* the up output is not written */
        kept = kept && !memcmp(got[1], init[1], (size_t)(n + 1) * m.rows[1] * 4);
    CHECK(worst <= 1e-5, "%s: error %.3g of the terms' sum", what, worst);
    CHECK(kept, "%s: wrote past the n output rows (or the up output)", what);

    /* the same call again: the same bits; and with x staged through
     * registers instead of copied in (where it fits, the default): the
     * same bits too */
    if (m.out == CUK_OUT_STORE) {
        float *again = malloc((size_t)n * m.rows[0] * 4);
        for (int regs = 0; regs < 2; regs++) {
            struct cuk_mma_cfg c2 = cfg;
            c2.stage_regs = regs;
            cudaMemset(dout[0], 0xff, (size_t)n * m.rows[0] * 4);
            err = cuk_gemv_mma(0, dout, &in, n, wp, k, m.out, &c2);
            sync = cudaDeviceSynchronize();
            cudaMemcpy(again, dout[0], (size_t)n * m.rows[0] * 4, cudaMemcpyDeviceToHost);
            CHECK(err == cudaSuccess && sync == cudaSuccess &&
                      !memcmp(again, got[0], (size_t)n * m.rows[0] * 4),
                  "%s: a repeated call%s gave other bits", what,
                  regs ? " staging x through registers" : "");
        }
        free(again);
    }
    for (int i = 0; i < k; i++) {
        free(hw[i]);
        free(init[i]);
        free(got[i]);
        cudaFree((void *)w[i].data);
        cudaFree(dout[i]);
    }
    free(hx);
    free(hx2);
    free(hnw);
    free(xh);
    cudaFree(dx);
    cudaFree(dx2);
    cudaFree(dnw);
    cudaFree(dtmp);
    cudaFree(dxh);
}

static void check_declined(void)
{
    void *p = NULL;
    cudaMalloc(&p, 1 << 22);
    float *out = p;
    const struct cuk_gemv_in in = {.kind = CUK_IN_X, .x = p};
    struct cuk_weight w = {.dtype = DT_BF16, .rows = 64, .cols = 256, .data = p};
    const struct cuk_weight *wp[2] = {&w, &w};
    float *outs[2] = {out, out};
    CHECK(cuk_gemv_mma(0, outs, &in, 17, wp, 1, CUK_OUT_STORE, &dev_cfg) == cudaErrorInvalidValue,
          "n > CUK_MMA_MAX_N is an error");
    w.cols = 48;
    CHECK(cuk_gemv_mma(0, outs, &in, 4, wp, 1, CUK_OUT_STORE, &dev_cfg) == cudaErrorNotSupported,
          "cols %% 32 != 0 should be declined");
    w.cols = 256;
    w.dtype = DT_F32;
    CHECK(cuk_gemv_mma(0, outs, &in, 4, wp, 1, CUK_OUT_STORE, &dev_cfg) == cudaErrorNotSupported,
          "f32 weights should be declined");
    w.dtype = DT_BF16;
    CHECK(cuk_gemv_mma(0, outs, &in, 4, wp, 2, CUK_OUT_SWIGLU, &dev_cfg) == cudaErrorNotSupported,
          "the SwiGLU output without the norm should be declined");
    const struct cuk_gemv_in odd = {.kind = CUK_IN_X, .x = (const float *)((char *)p + 4)};
    CHECK(cuk_gemv_mma(0, outs, &odd, 4, wp, 1, CUK_OUT_STORE, &dev_cfg) == cudaErrorNotSupported,
          "unaligned x should be declined");
    struct cuk_mma_cfg small = dev_cfg;
    small.smem_max = 1024; /* less than 8 rows of 256 halves */
    CHECK(cuk_gemv_mma(0, outs, &in, 8, wp, 1, CUK_OUT_STORE, &small) == cudaErrorNotSupported,
          "x wider than the shared memory should be declined");
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "declined calls launched nothing");
    cudaFree(p);
}

int main(void)
{
    struct cudaDeviceProp prop;
    if (!hopper_present(&prop, "tensor-core GEMV"))
        return 0;
    dev_cfg = (struct cuk_mma_cfg){.n_sms = prop.multiProcessorCount,
                                   .smem_max = (int)prop.sharedMemPerBlockOptin,
                                   .smem_sm = (int)prop.sharedMemPerMultiprocessor};
    const struct mcase cases[] = {
        {8, 1024, 3, {2048, 1024, 1024}, CUK_IN_RMSNORM, CUK_OUT_STORE, 0}, /* q/k/v */
        {5, 2048, 1, {1024}, CUK_IN_X, CUK_OUT_ADD, 0},                      /* o */
        {8, 1024, 2, {3072, 3072}, CUK_IN_RMSNORM, CUK_OUT_SWIGLU, 0},      /* gate/up */
        {16, 3072, 1, {1024}, CUK_IN_SWIGLU, CUK_OUT_ADD, 0},               /* down */
        {1, 512, 1, {1000}, CUK_IN_X, CUK_OUT_STORE, 0},   /* one token, a partial tile */
        {12, 4096, 1, {520}, CUK_IN_RMSNORM, CUK_OUT_ADD, 0},
        {9, 160, 3, {40, 24, 8}, CUK_IN_X, CUK_OUT_STORE, 0}, /* tiny matrices */
        {16, 4096, 2, {1000, 1000}, CUK_IN_RMSNORM, CUK_OUT_SWIGLU, 3}, /* many rounds */
        {7, 14336, 1, {256}, CUK_IN_X, CUK_OUT_STORE, 0}, /* wide: the most x */
        {3, 96, 1, {33}, CUK_IN_SWIGLU, CUK_OUT_STORE, 1},
        {16, 1024, 1, {8192}, CUK_IN_X, CUK_OUT_STORE, 2},
    };
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            for (int w = 0; w <= 8; w += 8) /* the automatic block shape, and 8 warps */
                check_case(d ? DT_F16 : DT_BF16, cases[i], w);
    check_declined();
    return test_summary("test_gemv_mma");
}
