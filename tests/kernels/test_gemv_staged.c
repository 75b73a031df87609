/* test_gemv_staged - the staged GEMV (cuk_gemv_staged) of 1-4 input rows
 * against the register-streamed one (cuk_gemv_fused), bit for bit, over every
 * input and output kind a decode layer uses, bf16 and f16, widths with a
 * partial last copy, launch shapes from a ring of two slots per warp to
 * the default, and more warps than rows; that it runs (not falls back)
 * where it should and declines what it does not take; against a
 * double-precision host product; and in a chain of 48 dependent launches
 * under programmatic dependent launch, where each kernel issues its weight
 * copies before waiting for its predecessor. Links the kernel library
 * directly; prints "skipped: no GPU" and passes without a Hopper GPU. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "model/tensor.h"
#include "testutil.h"
#include "kernels/half_host.h"

struct mat {
    struct cuk_weight w;
    uint16_t *host;
};

static void mat_make(struct mat *m, int dt, int rows, int cols)
{
    size_t n = (size_t)rows * cols;
    m->host = malloc(n * 2);
    for (size_t i = 0; i < n; i++)
        m->host[i] = to_half(frand() * 0.5f, dt);
    void *d = NULL;
    cudaMalloc(&d, n * 2);
    cudaMemcpy(d, m->host, n * 2, cudaMemcpyHostToDevice);
    m->w = (struct cuk_weight){.dtype = dt, .rows = rows, .cols = cols, .data = d};
}

static void mat_free(struct mat *m)
{
    cudaFree((void *)m->w.data);
    free(m->host);
}

static float *dev_floats(const float *h, size_t n)
{
    float *d = NULL;
    cudaMalloc((void **)&d, n * 4 + 16);
    if (h)
        cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice);
    return d;
}

static float *fetch(const float *d, size_t n)
{
    float *h = malloc(n * 4);
    cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost);
    return h;
}

struct kcase {
    const char *what;
    int kind, k, out;
    int supported;
};

static const struct kcase cases[] = {
    {"q/k/v: rmsnorm(x) . W, 3 matrices", CUK_IN_RMSNORM, 3, CUK_OUT_STORE, 1},
    {"o: x += a . W", CUK_IN_X, 1, CUK_OUT_ADD, 1},
    {"down: x += swiglu(g, u) . W", CUK_IN_SWIGLU, 1, CUK_OUT_ADD, 1},
    {"outs += rmsnorm(x) . W, 2 matrices", CUK_IN_RMSNORM, 2, CUK_OUT_ADD, 1},
    {"outs = x . W, 2 matrices", CUK_IN_X, 2, CUK_OUT_STORE, 1},
    {"gate/up: swiglu(rmsnorm(x) . Wg, rmsnorm(x) . Wu)", CUK_IN_RMSNORM, 2, CUK_OUT_SWIGLU, 1},
    {"swiglu(x . Wg, x . Wu): not taken", CUK_IN_X, 2, CUK_OUT_SWIGLU, 0},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* One width and nt input rows: every case and dtype under each launch
 * shape. */
static void check_cols(int cols, int nt, int n_sms, int *ran, int *same)
{
    /* launch shapes: all slots before the wait and the next launch at it
     * (the order before session 65); 256-column copies with shared memory
     * for two slots per warp beside the x tile, in that order too; three
     * blocks, so warps take many units each (all taking sizes the default
     * declines), in that order, with one slot a warp filled before the
     * wait and the rest and the next launch after x is staged, and in the
     * default order (one token; more keep the old order) */
    int tight = nt * ((cols + 255) / 256 * 256 * 4) + 1024 + 8 * 2 * 2 * 256 * 2;
    const struct cuk_stage_cfg cfgs[] = {{n_sms, 0, 0, 1, 32, 1},
                                         {n_sms, 256, tight, 1, 32, 1},
                                         {3, 512, 0, 1, 32, 1},
                                         {3, 512, 0, 1, 1, 0},
                                         {3, 512, 0, 1, 0, 0}};
    const int ncfg = (int)(sizeof cfgs / sizeof cfgs[0]);
    static const int dts[2] = {DT_BF16, DT_F16};
    static const int rows[3] = {300, 71, 71}; /* 71: odd, pairs run past the end */
    for (int d = 0; d < 2; d++) {
        struct mat m[3];
        for (int i = 0; i < 3; i++)
            mat_make(&m[i], dts[d], rows[i], cols);
        size_t nx = (size_t)nt * cols, no = (size_t)nt * 300;
        float *hx = malloc(nx * 4), *hx2 = malloc(nx * 4), *hnw = malloc((size_t)cols * 4),
              *hinit = malloc(no * 4);
        for (size_t i = 0; i < nx; i++) {
            hx[i] = frand() * 3.0f;
            hx2[i] = frand();
        }
        for (int i = 0; i < cols; i++)
            hnw[i] = 1.0f + frand() * 0.2f;
        for (size_t i = 0; i < no; i++)
            hinit[i] = frand() * 2.0f;
        float *dx = dev_floats(hx, nx), *dx2 = dev_floats(hx2, nx),
              *dnw = dev_floats(hnw, (size_t)cols);
        float *got[3], *want[3];
        for (int i = 0; i < 3; i++) {
            got[i] = dev_floats(NULL, no);
            want[i] = dev_floats(NULL, no);
        }
        for (int ci = 0; ci < NCASES; ci++)
            for (int fi = 0; fi < ncfg; fi++) {
                const struct kcase *cs = &cases[ci];
                const struct cuk_weight *ws[3];
                for (int i = 0; i < cs->k; i++)
                    ws[i] = &m[cs->out == CUK_OUT_SWIGLU ? 1 + i : i].w;
                for (int i = 0; i < 3; i++) {
                    cudaMemcpy(got[i], hinit, no * 4, cudaMemcpyHostToDevice);
                    cudaMemcpy(want[i], hinit, no * 4, cudaMemcpyHostToDevice);
                }
                struct cuk_gemv_in in = {.kind = cs->kind, .x = dx, .x2 = dx2, .nw = dnw,
                                         .eps = 1e-6f};
                cudaError_t e1 = cuk_gemv_staged(0, got, &in, nt, ws, cs->k, cs->out, &cfgs[fi]);
                if (!cs->supported) {
                    CHECK(e1 == cudaErrorNotSupported, "%s cols %d: staged returned %s, want "
                          "not supported", cs->what, cols, cudaGetErrorString(e1));
                    continue;
                }
                cudaError_t e2 = cuk_gemv_fused(0, want, &in, nt, ws, cs->k, cs->out);
                cudaError_t e3 = cudaDeviceSynchronize();
                CHECK(e1 == cudaSuccess && e2 == cudaSuccess && e3 == cudaSuccess,
                      "%s cols %d rows of x %d cfg %d: staged %s, fused %s, sync %s", cs->what,
                      cols, nt, fi, cudaGetErrorString(e1), cudaGetErrorString(e2),
                      cudaGetErrorString(e3));
                *ran += e1 == cudaSuccess;
                int nout = cs->out == CUK_OUT_SWIGLU ? 1 : cs->k;
                for (int i = 0; i < nout; i++) {
                    size_t r = (size_t)nt * ws[i]->rows;
                    float *a = fetch(got[i], r), *b = fetch(want[i], r);
                    bool eq = !memcmp(a, b, r * 4);
                    CHECK(eq, "%s, %s cols %d, rows of x %d, cfg %d (chunk %d, smem %d, blocks "
                              "%d), output %d: staged != register-streamed",
                          cs->what, dts[d] == DT_BF16 ? "bf16" : "f16", cols, nt, fi,
                          cfgs[fi].chunk_cols, cfgs[fi].smem_bytes, cfgs[fi].blocks, i);
                    *same += eq;
                    free(a);
                    free(b);
                }
            }
        /* the plain product against doubles on the host (both kernels
         * could share a mistake the bit comparison cannot see) */
        {
            const struct cuk_weight *w0 = &m[0].w;
            struct cuk_gemv_in in = {.kind = CUK_IN_X, .x = dx};
            CHECK(cuk_gemv_staged(0, got, &in, nt, &w0, 1, CUK_OUT_STORE, &cfgs[0]) == cudaSuccess,
                  "staged plain product cols %d rows of x %d", cols, nt);
            float *a = fetch(got[0], no);
            double worst = 0, scale = 0;
            for (int j = 0; j < nt; j++)
                for (int r = 0; r < 300; r++) {
                    double ref = 0;
                    for (int c = 0; c < cols; c++)
                        ref += (double)from_half(m[0].host[(size_t)r * cols + c], dts[d]) *
                               hx[(size_t)j * cols + c];
                    worst = fmax(worst, fabs(a[(size_t)j * 300 + r] - ref));
                    scale = fmax(scale, fabs(ref));
                }
            CHECK(worst <= 1e-4 * scale, "staged plain product cols %d: error %.3g of %.3g",
                  cols, worst, scale);
            free(a);
        }
        for (int i = 0; i < 3; i++) {
            cudaFree(got[i]);
            cudaFree(want[i]);
            mat_free(&m[i]);
        }
        cudaFree(dx);
        cudaFree(dx2);
        cudaFree(dnw);
        free(hx);
        free(hx2);
        free(hnw);
        free(hinit);
    }
}

/* Q8_0 and unaligned rows are declined, nothing launched; small
 * matrices too, unless asked. */
static void check_declined(void)
{
    struct cuk_weight q8 = {.dtype = DT_Q8_0, .rows = 8, .cols = 64};
    float *x = dev_floats(NULL, 64), *out = dev_floats(NULL, 8);
    q8.data = x;
    const struct cuk_weight *ws[1] = {&q8};
    struct cuk_gemv_in in = {.kind = CUK_IN_X, .x = x};
    CHECK(cuk_gemv_staged(0, &out, &in, 1, ws, 1, CUK_OUT_STORE, NULL) == cudaErrorNotSupported,
          "Q8_0 should be declined");
    struct cuk_weight odd = {.dtype = DT_BF16, .rows = 8, .cols = 60, .data = x};
    ws[0] = &odd;
    CHECK(cuk_gemv_staged(0, &out, &in, 1, ws, 1, CUK_OUT_STORE, NULL) == cudaErrorNotSupported,
          "cols %% 8 != 0 should be declined");
    cudaFree(x);
    cudaFree(out);
    /* by default, only rows of 4 KB or more: 1,024 bf16 columns are
     * declined, an 8B model's o projection (4,096) is taken */
    struct mat small, large;
    mat_make(&small, DT_BF16, 512, 1024);
    mat_make(&large, DT_BF16, 4096, 4096);
    float *x4 = dev_floats(NULL, 4096), *o4 = dev_floats(NULL, 4096);
    cudaMemset(x4, 0, 4096 * 4);
    in.x = x4;
    ws[0] = &small.w;
    CHECK(cuk_gemv_staged(0, &o4, &in, 1, ws, 1, CUK_OUT_STORE, NULL) == cudaErrorNotSupported,
          "2 KB rows should be left to the register-streamed kernel");
    ws[0] = &large.w;
    CHECK(cuk_gemv_staged(0, &o4, &in, 1, ws, 1, CUK_OUT_STORE, NULL) == cudaSuccess &&
              cudaDeviceSynchronize() == cudaSuccess,
          "a 4096 x 4096 bf16 matrix should be staged");
    cudaFree(x4);
    cudaFree(o4);
    mat_free(&small);
    mat_free(&large);
}

/* x_{i+1} += W_i . rmsnorm(x_i) for 48 launches in one stream with
 * programmatic dependent launch: every kernel reads what the one before
 * wrote, so a read before the wait would show up as a difference from the
 * register-streamed chain. */
static void check_chain(void)
{
    enum { DIM = 2048, STEPS = 48 };
    struct mat w[4];
    for (int i = 0; i < 4; i++)
        mat_make(&w[i], DT_BF16, DIM, DIM);
    float *hx = malloc(DIM * 4), *hnw = malloc(DIM * 4);
    for (int i = 0; i < DIM; i++) {
        hx[i] = frand();
        hnw[i] = 1.0f;
    }
    float *res[2];
    const struct cuk_stage_cfg any = {.any_size = 1};
    for (int pass = 0; pass < 2; pass++) {
        float *a = dev_floats(hx, DIM), *b = dev_floats(hx, DIM), *nw = dev_floats(hnw, DIM);
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaError_t err = cudaSuccess;
        for (int i = 0; i < STEPS && err == cudaSuccess; i++) {
            float *src = i % 2 ? b : a, *dst = i % 2 ? a : b;
            const struct cuk_weight *ws[1] = {&w[i % 4].w};
            struct cuk_gemv_in in = {.kind = CUK_IN_RMSNORM, .x = src, .nw = nw, .eps = 1e-6f};
            err = pass ? cuk_gemv_fused(s, &dst, &in, 1, ws, 1, CUK_OUT_ADD)
                       : cuk_gemv_staged(s, &dst, &in, 1, ws, 1, CUK_OUT_ADD, &any);
        }
        if (err == cudaSuccess)
            err = cudaStreamSynchronize(s);
        CHECK(err == cudaSuccess, "chain pass %d: %s", pass, cudaGetErrorString(err));
        res[pass] = fetch(a, DIM);
        cudaStreamDestroy(s);
        cudaFree(a);
        cudaFree(b);
        cudaFree(nw);
    }
    bool eq = !memcmp(res[0], res[1], DIM * 4);
    bool finite = true;
    for (int i = 0; i < DIM; i++)
        finite = finite && isfinite(res[0][i]);
    CHECK(eq && finite, "a chain of %d dependent staged launches differs from the "
                        "register-streamed chain (finite: %d)", STEPS, finite);
    printf("chain of %d dependent launches under programmatic dependent launch: %s\n", STEPS,
           eq ? "identical" : "DIFFERS");
    free(res[0]);
    free(res[1]);
    free(hx);
    free(hnw);
    for (int i = 0; i < 4; i++)
        mat_free(&w[i]);
}

int main(void)
{
    struct cudaDeviceProp prop;
    if (!hopper_present(&prop, "staged GEMV"))
        return 0;
    cuk_set_pdl(1);
    /* 1000 and 2056: a partial last copy; 64: fewer columns than a copy;
     * 4096 and 14336: an 8B model's widths */
    static const int widths[] = {64, 1000, 1024, 2056, 4096, 14336};
    int ran = 0, same = 0;
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        check_cols(widths[i], 1, prop.multiProcessorCount, &ran, &same);
    /* 2-4 rows of x (a batched decode step's tokens): their tiles beside
     * the ring; an 8B model's down projection takes two */
    static const int wide[][2] = {{1000, 4}, {2056, 3}, {4096, 2}, {4096, 4}, {14336, 2}};
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++)
        check_cols(wide[i][0], wide[i][1], prop.multiProcessorCount, &ran, &same);
    printf("staged GEMV: ran %d launches, %d outputs bit-identical to the register-streamed "
           "kernel\n", ran, same);
    check_declined();
    check_chain();
    return test_summary("test_gemv_staged");
}
