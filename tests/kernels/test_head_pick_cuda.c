/* test_head_pick_cuda - the device head_pick (head_pick.cu: cuk_head_quant,
 * cuk_head_pick) against a double-precision host product: over f32, bf16
 * and f16 heads of several shapes (Qwen3-0.6B's and Llama-3's vocab among
 * them), the row's argmax is the host's, every kept row holds the host's
 * logit to double rounding, few rows are kept, and a second call (the
 * kernels re-arm their workspace) gives the same row; a tie and near ties;
 * an input with one outlier; a head with a NaN is reported; shapes it
 * does not take are declined. Links the kernel library directly; prints
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

static int n_sms;

struct dev_head {
    struct cuk_head_copy c;
    struct cuk_weight w;
    void *mem, *wmem;
};

/* The head (rows x cols of h, rounded to dt) and its copy on the device;
 * false when the copy reports a weight that is not finite. */
static bool head_up(struct dev_head *d, const float *h, int rows, int cols, int dt)
{
    size_t n = (size_t)rows * cols, es = dt == DT_F32 ? 4 : 2;
    void *host = malloc(n * es);
    for (size_t i = 0; i < n; i++)
        if (dt == DT_F32)
            ((float *)host)[i] = h[i];
        else
            ((uint16_t *)host)[i] = to_half(h[i], dt);
    cudaMalloc(&d->wmem, n * es);
    cudaMemcpy(d->wmem, host, n * es, cudaMemcpyHostToDevice);
    free(host);
    d->w = (struct cuk_weight){.dtype = dt, .rows = rows, .cols = cols, .data = d->wmem};
    size_t q = (n + 255) / 256 * 256, r4 = ((size_t)rows * 4 + 255) / 256 * 256;
    cudaMalloc(&d->mem, q + 2 * r4 + 2 * r4 + 256);
    char *b = d->mem;
    d->c = (struct cuk_head_copy){.q = (int8_t *)b, .scale = (float *)(b + q),
                                  .qabs = (float *)(b + q + r4), .ab = (float *)(b + q + 2 * r4),
                                  .ws = (unsigned *)(b + q + 4 * r4), .rows = rows, .cols = cols};
    cudaMemset(d->c.ws, 0, 256);
    CHECK(cuk_head_quant(0, &d->c, &d->w, d->c.ws + 2) == cudaSuccess, "cuk_head_quant");
    unsigned bad = 0;
    cudaMemcpy(&bad, d->c.ws + 2, 4, cudaMemcpyDeviceToHost);
    return bad == 0;
}

static void head_down(struct dev_head *d)
{
    cudaFree(d->mem);
    cudaFree(d->wmem);
}

/* One call and a second with the same input, against the host. */
static int check_call(struct dev_head *d, const float *h, const float *x, int dt, const char *what)
{
    const int rows = d->c.rows, cols = d->c.cols;
    double *ref = malloc(sizeof *ref * rows);
    int want = 0;
    for (int r = 0; r < rows; r++) {
        double z = 0.0;
        for (int j = 0; j < cols; j++) {
            const float w = dt == DT_F32 ? h[(size_t)r * cols + j]
                                         : from_half(to_half(h[(size_t)r * cols + j], dt), dt);
            z += (double)w * x[j];
        }
        ref[r] = z;
        if (z > ref[want])
            want = r;
    }
    float *dx = NULL, *dl = NULL, *got = malloc(sizeof *got * rows);
    cudaMalloc((void **)&dx, sizeof(float) * cols);
    cudaMalloc((void **)&dl, sizeof(float) * rows);
    cudaMemcpy(dx, x, sizeof(float) * cols, cudaMemcpyHostToDevice);
    int kept = 0, pick[2] = {-1, -1};
    for (int call = 0; call < 2; call++) {
        CHECK(cuk_head_pick(0, &d->c, &d->w, dx, dl, n_sms) == cudaSuccess &&
                  cudaDeviceSynchronize() == cudaSuccess,
              "%s: cuk_head_pick: %s", what, cudaGetErrorString(cudaGetLastError()));
        cudaMemcpy(got, dl, sizeof(float) * rows, cudaMemcpyDeviceToHost);
        bool close = true;
        kept = 0;
        for (int r = 0; r < rows; r++) {
            if (got[r] == -INFINITY)
                continue;
            kept++;
            close = close && fabs(got[r] - ref[r]) <= 1e-6 * fabs(ref[r]) + 1e-30;
            if (pick[call] < 0 || got[r] > got[pick[call]])
                pick[call] = r;
        }
        CHECK(close, "%s: a kept row's logit is not the host's", what);
    }
    CHECK(pick[0] == want && pick[1] == want, "%s: picked %d then %d, the host %d", what, pick[0],
          pick[1], want);
    CHECK(kept >= 1 && kept <= rows / 64 + 64, "%s: %d of %d rows kept", what, kept, rows);
    cudaFree(dx);
    cudaFree(dl);
    free(got);
    free(ref);
    return kept;
}

int main(void)
{
    struct cudaDeviceProp prop;
    if (!hopper_present(&prop, "device head_pick"))
        return 0;
    n_sms = prop.multiProcessorCount;
    static const int shapes[][2] = {{151936, 1024}, {128256, 4096}, {5000, 64}, {3001, 1008}};
    static const int dts[] = {DT_BF16, DT_F16, DT_F32};
    int most = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (size_t t = 0; t < sizeof dts / sizeof *dts; t++) {
            const int rows = shapes[s][0], cols = shapes[s][1];
            if (rows > 100000 && dts[t] != DT_BF16)
                continue; /* the large shapes in the models' dtype only */
            float *h = malloc(sizeof *h * (size_t)rows * cols), *x = malloc(sizeof *x * cols);
            for (size_t i = 0; i < (size_t)rows * cols; i++)
                h[i] = 0.035f * frand(); /* about N(0, 0.02)'s spread */
            struct dev_head d;
            CHECK(head_up(&d, h, rows, cols, dts[t]), "a finite head reported as not");
            for (int trial = 0; trial < 3; trial++) {
                for (int j = 0; j < cols; j++)
                    x[j] = 1.7f * frand();
                if (trial == 2)
                    x[cols / 3] = 250.0f;
                char what[96];
                snprintf(what, sizeof what, "%dx%d dtype %d trial %d", rows, cols, dts[t], trial);
                int k = check_call(&d, h, x, dts[t], what);
                most = k > most ? k : most;
            }
            head_down(&d);
            free(h);
            free(x);
        }
    /* a tie (the lowest row wins) and near ties */
    {
        const int rows = 4096, cols = 256;
        float *h = malloc(sizeof *h * rows * cols), *x = malloc(sizeof *x * cols);
        for (int i = 0; i < rows * cols; i++)
            h[i] = 0.035f * frand();
        for (int j = 0; j < cols; j++)
            x[j] = frand();
        memcpy(h + 3000 * cols, h + 100 * cols, sizeof *h * cols);
        for (int k = 1; k <= 8; k++) { /* copies of row 100, one weight lower by k steps */
            memcpy(h + (200 + k) * cols, h + 100 * cols, sizeof *h * cols);
            h[(200 + k) * cols + 7] -= 0.0004f * k;
        }
        h[100 * cols + 9] += 0.05f; /* row 100 (and 3000) the best by a margin */
        h[3000 * cols + 9] += 0.05f;
        struct dev_head d;
        head_up(&d, h, rows, cols, DT_F32);
        check_call(&d, h, x, DT_F32, "tie");
        head_down(&d);
        /* a NaN weight is reported */
        h[55] = NAN;
        CHECK(!head_up(&d, h, rows, cols, DT_F32), "a NaN weight is not reported");
        head_down(&d);
        free(h);
        free(x);
    }
    /* declined shapes */
    struct cuk_head_copy c = {.rows = 10, .cols = 20};
    struct cuk_weight w = {.dtype = DT_BF16, .rows = 10, .cols = 20};
    CHECK(cuk_head_pick(0, &c, &w, NULL, NULL, n_sms) == cudaErrorInvalidValue,
          "columns not a multiple of 16 are declined");
    c.cols = w.cols = CUK_HEAD_MAX_COLS + 16;
    CHECK(cuk_head_pick(0, &c, &w, NULL, NULL, n_sms) == cudaErrorInvalidValue,
          "too many columns are declined");
    printf("test_head_pick_cuda: at most %d rows kept\n", most);
    return test_summary("test_head_pick_cuda");
}
