/* gemv.cu - matrix-vector products for decode and short prefill chunks
 * (n <= CUK_GEMV_MAX tokens): out[n][rows] = x[n][cols] . W^T with f32
 * activations and f32 accumulation, reading each weight byte once. One
 * warp per output row; each lane streams 16-byte weight vectors (8 f16/bf16
 * or 16 int8 quants) and multiplies them with the n activation rows (which
 * stay in L1/L2). A scalar fallback handles shapes the vector path cannot. */
#include <math.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

#define GEMV_WARPS 8

static __device__ __forceinline__ void unpack8_bf16(uint4 p, float *f)
{
    uint32_t u[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        f[2 * k] = __uint_as_float(u[k] << 16);
        f[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
    }
}

static __device__ __forceinline__ void unpack8_f16(uint4 p, float *f)
{
    uint32_t u[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        f[2 * k] = cuk_f16((uint16_t)(u[k] & 0xffffu));
        f[2 * k + 1] = cuk_f16((uint16_t)(u[k] >> 16));
    }
}

static __device__ __forceinline__ float dot8(const float *w, const float *x)
{
    float4 a = *(const float4 *)x, b = *(const float4 *)(x + 4);
    float s = w[0] * a.x;
    s = fmaf(w[1], a.y, s);
    s = fmaf(w[2], a.z, s);
    s = fmaf(w[3], a.w, s);
    s = fmaf(w[4], b.x, s);
    s = fmaf(w[5], b.y, s);
    s = fmaf(w[6], b.z, s);
    s = fmaf(w[7], b.w, s);
    return s;
}

/* One output row of a 2-byte-weight GEMV (BF: bf16, else f16), computed by
 * one warp; cols % 8 == 0, 16-byte aligned rows. */
template <bool BF, int NT>
static __device__ __forceinline__ void gemv_row_h(float *out, const float *x, const uint16_t *w,
                                                  int rows, int cols, int row, int lane)
{
    const uint4 *wr = (const uint4 *)(w + (size_t)row * cols);
    int nv = cols / 8;
    float acc[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j] = 0.0f;
#pragma unroll 4
    for (int c = lane; c < nv; c += 32) {
        uint4 p = __ldcs(wr + c);
        float f[8];
        if (BF)
            unpack8_bf16(p, f);
        else
            unpack8_f16(p, f);
#pragma unroll
        for (int j = 0; j < NT; j++)
            acc[j] += dot8(f, x + (size_t)j * cols + 8 * c);
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float v = cuk_warp_sum(acc[j]);
        if (lane == 0)
            out[(size_t)j * rows + row] = v;
    }
}

template <bool BF, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_h(float *out, const float *x, const uint16_t *w, int rows, int cols)
{
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    gemv_row_h<BF, NT>(out, x, w, rows, cols, row, lane);
}

/* Up to 3 matrices of the same cols and dtype over the same x in one launch
 * (q/k/v, gate/up): warps take rows of the concatenation. */
struct gemv3 {
    float *out[3];
    const uint16_t *w[3];
    int rows[3];
};

template <bool BF, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_h3(struct gemv3 p, const float *x, int cols)
{
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row < p.rows[0]) {
        gemv_row_h<BF, NT>(p.out[0], x, p.w[0], p.rows[0], cols, row, lane);
        return;
    }
    row -= p.rows[0];
    if (row < p.rows[1]) {
        gemv_row_h<BF, NT>(p.out[1], x, p.w[1], p.rows[1], cols, row, lane);
        return;
    }
    row -= p.rows[1];
    if (row < p.rows[2])
        gemv_row_h<BF, NT>(p.out[2], x, p.w[2], p.rows[2], cols, row, lane);
}

/* Q8_0 repacked: int8 quants [rows][cols], f16 scales [rows][cols/32]. */
template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_q8(float *out, const float *x, const int8_t *qs, const uint16_t *sc, int rows, int cols)
{
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    const uint4 *wr = (const uint4 *)(qs + (size_t)row * cols);
    const uint16_t *sr = sc + (size_t)row * (cols / Q8_0_BLOCK);
    int nv = cols / 16;
    float acc[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j] = 0.0f;
#pragma unroll 4
    for (int c = lane; c < nv; c += 32) {
        uint4 p = __ldcs(wr + c);
        float d = cuk_f16(sr[c / 2]);
        uint32_t u[4] = {p.x, p.y, p.z, p.w};
        float f[16];
#pragma unroll
        for (int k = 0; k < 16; k++)
            f[k] = (float)(int8_t)(u[k / 4] >> (8 * (k % 4)));
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const float *xr = x + (size_t)j * cols + 16 * c;
            acc[j] = fmaf(d, dot8(f, xr) + dot8(f + 8, xr + 8), acc[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float v = cuk_warp_sum(acc[j]);
        if (lane == 0)
            out[(size_t)j * rows + row] = v;
    }
}

/* Any dtype, any shape: scalar loads. */
template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_any(float *out, const float *x, struct cuk_weight w)
{
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= w.rows)
        return;
    float acc[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j] = 0.0f;
    for (int c = lane; c < w.cols; c += 32) {
        float wv = cuk_load_weight(&w, (size_t)row, c);
#pragma unroll
        for (int j = 0; j < NT; j++)
            acc[j] = fmaf(wv, x[(size_t)j * w.cols + c], acc[j]);
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float v = cuk_warp_sum(acc[j]);
        if (lane == 0)
            out[(size_t)j * w.rows + row] = v;
    }
}

template <int NT>
static void launch(cudaStream_t s, float *out, const float *x, const struct cuk_weight *w,
                   bool vec)
{
    unsigned grid = (unsigned)((w->rows + GEMV_WARPS - 1) / GEMV_WARPS);
    int threads = GEMV_WARPS * 32;
    if (vec && w->dtype == DT_BF16)
        k_gemv_h<true, NT><<<grid, threads, 0, s>>>(out, x, (const uint16_t *)w->data, w->rows,
                                                    w->cols);
    else if (vec && w->dtype == DT_F16)
        k_gemv_h<false, NT><<<grid, threads, 0, s>>>(out, x, (const uint16_t *)w->data, w->rows,
                                                     w->cols);
    else if (vec && w->dtype == DT_Q8_0)
        k_gemv_q8<NT><<<grid, threads, 0, s>>>(out, x, (const int8_t *)w->data, w->scales, w->rows,
                                               w->cols);
    else
        k_gemv_any<NT><<<grid, threads, 0, s>>>(out, x, *w);
}

extern "C" cudaError_t cuk_gemv(cudaStream_t s, float *out, const float *x, int n,
                                const struct cuk_weight *w)
{
    if (n < 1 || n > CUK_GEMV_MAX)
        return cudaErrorInvalidValue;
    /* The vector paths need 16-byte aligned weight rows and activation rows. */
    int per_vec = w->dtype == DT_Q8_0 ? 16 : 8;
    bool vec = (w->dtype == DT_BF16 || w->dtype == DT_F16 || w->dtype == DT_Q8_0) &&
               w->cols % per_vec == 0 && w->cols % 4 == 0 && ((uintptr_t)x & 15) == 0 &&
               ((uintptr_t)w->data & 15) == 0;
    switch (n) {
    case 1: launch<1>(s, out, x, w, vec); break;
    case 2: launch<2>(s, out, x, w, vec); break;
    case 3: launch<3>(s, out, x, w, vec); break;
    case 4: launch<4>(s, out, x, w, vec); break;
    case 5: launch<5>(s, out, x, w, vec); break;
    case 6: launch<6>(s, out, x, w, vec); break;
    case 7: launch<7>(s, out, x, w, vec); break;
    default: launch<8>(s, out, x, w, vec); break;
    }
    return cudaGetLastError();
}

template <int NT>
static void launch3(cudaStream_t s, const struct gemv3 *p, const float *x, int cols, bool bf)
{
    long total = (long)p->rows[0] + p->rows[1] + p->rows[2];
    unsigned grid = (unsigned)((total + GEMV_WARPS - 1) / GEMV_WARPS);
    if (bf)
        k_gemv_h3<true, NT><<<grid, GEMV_WARPS * 32, 0, s>>>(*p, x, cols);
    else
        k_gemv_h3<false, NT><<<grid, GEMV_WARPS * 32, 0, s>>>(*p, x, cols);
}

extern "C" cudaError_t cuk_gemv_multi(cudaStream_t s, float *const *outs, const float *x, int n,
                                      const struct cuk_weight *const *ws, int k)
{
    if (n < 1 || n > CUK_GEMV_MAX || k < 1 || k > 3)
        return cudaErrorInvalidValue;
    struct gemv3 p = {{NULL, NULL, NULL}, {NULL, NULL, NULL}, {0, 0, 0}};
    int dt = ws[0]->dtype, cols = ws[0]->cols;
    if ((dt != DT_BF16 && dt != DT_F16) || cols % 8 || ((uintptr_t)x & 15))
        return cudaErrorNotSupported;
    for (int i = 0; i < k; i++) {
        if (ws[i]->dtype != dt || ws[i]->cols != cols || ((uintptr_t)ws[i]->data & 15))
            return cudaErrorNotSupported;
        p.out[i] = outs[i];
        p.w[i] = (const uint16_t *)ws[i]->data;
        p.rows[i] = ws[i]->rows;
    }
    bool bf = dt == DT_BF16;
    switch (n) {
    case 1: launch3<1>(s, &p, x, cols, bf); break;
    case 2: launch3<2>(s, &p, x, cols, bf); break;
    case 3: launch3<3>(s, &p, x, cols, bf); break;
    case 4: launch3<4>(s, &p, x, cols, bf); break;
    case 5: launch3<5>(s, &p, x, cols, bf); break;
    case 6: launch3<6>(s, &p, x, cols, bf); break;
    case 7: launch3<7>(s, &p, x, cols, bf); break;
    default: launch3<8>(s, &p, x, cols, bf); break;
    }
    return cudaGetLastError();
}
