/* test_gemm_tc - the tensor-core GEMM of batched decode steps (cuk_gemm_tc)
 * against a double-precision host product: bf16 and f16, 1 to 64 tokens
 * (every token-tile width), the default ring and the deepest, one stage
 * and many, a partial last row block and last column stage, row blocks
 * split over several blocks (the partial sums and their counters) and
 * not, the accumulating form, an output stride wider than the rows; that
 * a call gives the same bits when repeated after calls of other shapes
 * (the counters re-arm); that a chain of accumulating launches under
 * programmatic dependent launch gives the bits it gives without; and that
 * it declines what it does not take. Links the kernel library directly;
 * prints "skipped: no GPU" and passes without a Hopper GPU. */
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

static void *ws;
static int ws_blocks;

static uint16_t *halves(int dt, size_t n, float scale, uint16_t **dev)
{
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++)
        h[i] = to_half(frand() * scale, dt);
    cudaMalloc((void **)dev, n * 2);
    cudaMemcpy(*dev, h, n * 2, cudaMemcpyHostToDevice);
    return h;
}

struct shape {
    int rows, cols, n, blocks;
};

/* out (n x ldc, with a sentinel in the gap) against the host product,
 * plain and accumulating. */
static void check_product(int dt, struct shape s, int smem)
{
    const struct cuk_tc_cfg cfg = {.smem_bytes = smem};
    const int ldc = s.rows + 32;
    uint16_t *dw, *dx;
    uint16_t *hw = halves(dt, (size_t)s.rows * s.cols, 0.5f, &dw);
    uint16_t *hx = halves(dt, (size_t)s.n * s.cols, 1.0f, &dx);
    size_t nout = (size_t)s.n * ldc;
    float *init = malloc(nout * 4), *got = malloc(nout * 4), *dout;
    for (size_t i = 0; i < nout; i++)
        init[i] = frand();
    cudaMalloc((void **)&dout, nout * 4);
    double *ref = malloc((size_t)s.n * s.rows * sizeof(double));
    double *mag = malloc((size_t)s.n * s.rows * sizeof(double));
    for (int t = 0; t < s.n; t++)
        for (int r = 0; r < s.rows; r++) {
            double v = 0, m = 0;
            for (int k = 0; k < s.cols; k++) {
                double p = (double)from_half(hw[(size_t)r * s.cols + k], dt) *
                           from_half(hx[(size_t)t * s.cols + k], dt);
                v += p;
                m += fabs(p);
            }
            ref[(size_t)t * s.rows + r] = v;
            mag[(size_t)t * s.rows + r] = m;
        }
    for (int acc = 0; acc < 2; acc++) {
        cudaMemcpy(dout, init, nout * 4, cudaMemcpyHostToDevice);
        cudaError_t err = cuk_gemm_tc(0, dout, ldc, dw, dt, dx, s.rows, s.n, s.cols, acc, ws,
                                      s.blocks, &cfg);
        cudaError_t sync = cudaDeviceSynchronize();
        CHECK(err == cudaSuccess && sync == cudaSuccess,
              "%s %dx%d n %d blocks %d smem %d acc %d: %s / %s", dt == DT_BF16 ? "bf16" : "f16",
              s.rows, s.cols, s.n, s.blocks, smem, acc,
              cudaGetErrorString(err), cudaGetErrorString(sync));
        cudaMemcpy(got, dout, nout * 4, cudaMemcpyDeviceToHost);
        double worst = 0;
        bool gap_kept = true;
        for (int t = 0; t < s.n; t++) {
            for (int r = 0; r < s.rows; r++) {
                size_t i = (size_t)t * ldc + r;
                double want = ref[(size_t)t * s.rows + r] + (acc ? init[i] : 0.0);
                double e = fabs(got[i] - want) / (mag[(size_t)t * s.rows + r] + 1e-30);
                if (!(e <= worst))
                    worst = isnan(e) ? INFINITY : e;
            }
            for (int r = s.rows; r < ldc; r++)
                gap_kept = gap_kept && got[(size_t)t * ldc + r] == init[(size_t)t * ldc + r];
        }
        CHECK(worst <= 1e-5,
              "%s %dx%d n %d blocks %d smem %d acc %d: error %.3g of the terms' sum",
              dt == DT_BF16 ? "bf16" : "f16", s.rows, s.cols, s.n, s.blocks, smem, acc, worst);
        CHECK(gap_kept, "%dx%d n %d: wrote between rows and ldc", s.rows, s.cols, s.n);
    }
    free(hw);
    free(hx);
    free(init);
    free(got);
    free(ref);
    free(mag);
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dout);
}

/* The same call three times, with calls of other batch sizes between
 * (which leave other partial sums behind): the same bits each time. */
static void check_repeatable(int rows, int cols, int blocks)
{
    const int dt = DT_BF16, nmax = 64, ns[] = {64, 1, 64, 9, 64};
    uint16_t *dw, *dx;
    uint16_t *hw = halves(dt, (size_t)rows * cols, 0.5f, &dw);
    uint16_t *hx = halves(dt, (size_t)nmax * cols, 1.0f, &dx);
    float *dout, *first = malloc((size_t)nmax * rows * 4), *got = malloc((size_t)nmax * rows * 4);
    cudaMalloc((void **)&dout, (size_t)nmax * rows * 4);
    for (int i = 0; i < 5; i++) {
        int n = ns[i];
        cudaMemset(dout, 0xff, (size_t)nmax * rows * 4);
        cudaError_t err = cuk_gemm_tc(0, dout, rows, dw, dt, dx, rows, n, cols, 0, ws, blocks, NULL);
        CHECK(err == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess,
              "batch %d of %dx%d: %s", n, rows, cols, cudaGetErrorString(err));
        if (n != nmax)
            continue;
        cudaMemcpy(i ? got : first, dout, (size_t)n * rows * 4, cudaMemcpyDeviceToHost);
        if (i)
            CHECK(memcmp(got, first, (size_t)n * rows * 4) == 0,
                  "%dx%d blocks %d: a repeated call gave other bits", rows, cols, blocks);
    }
    free(hw);
    free(hx);
    free(first);
    free(got);
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dout);
}

/* 16 accumulating launches into one output, each reading what the one
 * before wrote: with programmatic dependent launch the same bits as
 * without. */
static void check_chain(void)
{
    const int dt = DT_BF16, rows = 1024, cols = 2048, n = 8, len = 16;
    uint16_t *dw, *dx;
    uint16_t *hw = halves(dt, (size_t)rows * cols, 0.5f, &dw);
    uint16_t *hx = halves(dt, (size_t)n * cols, 1.0f, &dx);
    float *dout, *res[2];
    cudaMalloc((void **)&dout, (size_t)n * rows * 4);
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    for (int pdl = 0; pdl < 2; pdl++) {
        cuk_set_pdl(pdl);
        cudaMemsetAsync(dout, 0, (size_t)n * rows * 4, st);
        cudaError_t err = cudaSuccess;
        for (int i = 0; i < len && err == cudaSuccess; i++)
            err = cuk_gemm_tc(st, dout, rows, dw, dt, dx, rows, n, cols, 1, ws, ws_blocks, NULL);
        CHECK(err == cudaSuccess && cudaStreamSynchronize(st) == cudaSuccess, "chain pdl %d: %s",
              pdl, cudaGetErrorString(err));
        res[pdl] = malloc((size_t)n * rows * 4);
        cudaMemcpy(res[pdl], dout, (size_t)n * rows * 4, cudaMemcpyDeviceToHost);
    }
    cuk_set_pdl(1);
    CHECK(memcmp(res[0], res[1], (size_t)n * rows * 4) == 0,
          "a chain of %d accumulating launches differs with programmatic dependent launch", len);
    free(res[0]);
    free(res[1]);
    free(hw);
    free(hx);
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dout);
    cudaStreamDestroy(st);
}

static void check_declined(void)
{
    void *p = NULL;
    cudaMalloc(&p, 1 << 20);
    const uint16_t *x = p;
    float *out = p;
    CHECK(cuk_gemm_tc(0, out, 64, p, DT_F32, x, 64, 4, 64, 0, ws, 8, NULL) == cudaErrorNotSupported,
          "f32 weights should be declined");
    CHECK(cuk_gemm_tc(0, out, 72, p, DT_BF16, x, 72, 4, 64, 0, ws, 8, NULL) == cudaErrorNotSupported,
          "rows %% 16 != 0 should be declined");
    CHECK(cuk_gemm_tc(0, out, 64, p, DT_BF16, x, 64, 4, 72, 0, ws, 8, NULL) == cudaErrorNotSupported,
          "cols %% 16 != 0 should be declined");
    CHECK(cuk_gemm_tc(0, out, 64, p, DT_BF16, x, 64, 65, 64, 0, ws, 8, NULL) ==
              cudaErrorNotSupported,
          "n > CUK_TC_MAX_N should be declined");
    CHECK(cuk_gemm_tc(0, out, 64, (char *)p + 2, DT_BF16, x, 64, 4, 64, 0, ws, 8, NULL) ==
              cudaErrorNotSupported,
          "unaligned weights should be declined");
    CHECK(cuk_gemm_tc(0, out, 32, p, DT_BF16, x, 64, 4, 64, 0, ws, 8, NULL) == cudaErrorInvalidValue,
          "ldc < rows is an error");
    const struct cuk_tc_cfg tiny = {.smem_bytes = 40000};
    CHECK(cuk_gemm_tc(0, out, 64, p, DT_BF16, x, 64, 4, 64, 0, ws, 8, &tiny) ==
              cudaErrorNotSupported,
          "shared memory for fewer than two stages should be declined");
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "declined calls launched nothing");
    cudaFree(p);
}

int main(void)
{
    struct cudaDeviceProp prop;
    if (!hopper_present(&prop, "tensor-core GEMM"))
        return 0;
    ws_blocks = prop.multiProcessorCount;
    size_t wsb = cuk_gemm_tc_ws_bytes(ws_blocks);
    if (cudaMalloc(&ws, wsb) != cudaSuccess || cudaMemset(ws, 0, wsb) != cudaSuccess) {
        fprintf(stderr, "test_gemm_tc: cannot allocate the workspace\n");
        return 1;
    }
    const int sm = ws_blocks;
    const struct shape shapes[] = {
        {128, 128, 8, 1},     /* one stage, one block */
        {272, 208, 3, 7},     /* partial last row block and last stage */
        {256, 4096, 8, sm},   /* two row blocks, each split over many blocks */
        {4096, 512, 16, sm},  /* many row blocks, four stages each */
        {1024, 3072, 5, sm},  /* odd n, uneven runs */
        {512, 1024, 12, 50},  /* two token tiles */
        {512, 2048, 24, sm},  /* four */
        {1536, 4096, 64, sm}, /* eight, and the smallest ring */
        {2048, 1024, 33, 3},  /* eight tiles, mostly empty; long runs */
        {64, 8192, 2, sm},    /* one partial row block over many blocks */
    };
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int smem = 0; smem <= 226 * 1024; smem += 226 * 1024) /* default ring, deepest */
                check_product(d ? DT_F16 : DT_BF16, shapes[i], smem);
    check_repeatable(1024, 3072, sm);
    check_repeatable(4096, 1024, 17);
    check_chain();
    check_declined();
    cudaFree(ws);
    return test_summary("test_gemm_tc");
}
