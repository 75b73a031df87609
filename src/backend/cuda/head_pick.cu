/* head_pick.cu - a greedy step's LM head read as an int8 copy that rules
 * rows out, on the device (the CUDA backend's head_pick; host side in
 * cuda_head.c). The copy and the bound are the CPU's
 * (backend/head_bound.h): a_r = s_r dx (q_r . xq), an exact integer dot
 * product of the int8 copy and the input as int16, is within e_r of the
 * exact logit. k_head_screen writes (a_r, e_r) and the largest
 * a_r - e_r, L; k_head_rescore keeps the rows with a_r + e_r >= L, whose
 * logits it computes in double precision, and writes -inf at the others.
 * The row with the largest exact logit is always kept, so the argmax over
 * the row is the head's, computed more exactly than an f32 GEMV does: a
 * pick can differ from the f32 head's only where two logits tie to f32
 * rounding. */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/head_bound.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/order_key.cuh"

#define HP_THREADS 256
#define HP_WARPS (HP_THREADS / 32)
#define HP_CHUNK 512 /* columns a warp covers with one 16-byte load a lane */
#define HP_ROWS 4    /* rows a warp screens at once */

/* ---- the copy ---- */

/* One warp a row: q, s and sum|q|; *bad = 1 where a weight is not finite. */
__global__ void __launch_bounds__(HP_THREADS)
    k_head_quant(const struct cuk_weight w, int8_t *q, float *scale, float *qabs, unsigned *bad)
{
    cuk_pdl_start();
    const int lane = threadIdx.x & 31;
    for (int r = blockIdx.x * HP_WARPS + threadIdx.x / 32; r < w.rows; r += gridDim.x * HP_WARPS) {
        float m = 0.0f;
        bool fin = true;
        for (int j = lane; j < w.cols; j += 32) {
            const float v = cuk_load_weight(&w, r, j);
            fin = fin && isfinite(v);
            m = fmaxf(m, fabsf(v));
        }
        for (int o = 16; o > 0; o >>= 1)
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (!__all_sync(0xffffffffu, fin) && lane == 0)
            atomicExch(bad, 1u);
        const float s = m / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
        int qa = 0;
        for (int j = lane; j < w.cols; j += 32) {
            int v = __float2int_rn(cuk_load_weight(&w, r, j) * inv);
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            q[(size_t)r * w.cols + j] = (int8_t)v;
            qa += v < 0 ? -v : v;
        }
        for (int o = 16; o > 0; o >>= 1)
            qa += __shfl_xor_sync(0xffffffffu, qa, o);
        if (lane == 0) {
            scale[r] = s;
            qabs[r] = (float)qa; /* exact below 2^24 */
        }
    }
}

extern "C" cudaError_t cuk_head_quant(cudaStream_t s, const struct cuk_head_copy *c,
                                      const struct cuk_weight *w, unsigned *bad)
{
    if (w->rows != c->rows || w->cols != c->cols || c->cols % 16 != 0 ||
        c->cols > CUK_HEAD_MAX_COLS)
        return cudaErrorInvalidValue;
    int blocks = (w->rows + HP_WARPS - 1) / HP_WARPS;
    blocks = blocks > 4096 ? 4096 : blocks;
    cuk_launch(k_head_quant, blocks, HP_THREADS, 0, s, *w, c->q, c->scale, c->qabs, bad);
    return cudaGetLastError();
}

/* ---- a step ---- */

/* The block's copy of the input as int16 (xq, shared), its step dx, and
 * sum|x| (double): every block computes the same values in the same order. */
static __device__ __forceinline__ void hp_input(const float *x, int cols, int16_t *xq, float *dx_out,
                                double *x1_out)
{
    __shared__ float wm[HP_WARPS];
    __shared__ double ws[HP_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    float m = 0.0f;
    double a = 0.0;
    for (int j = threadIdx.x; j < cols; j += HP_THREADS) {
        const float v = x[j];
        m = fmaxf(m, fabsf(v));
        a += fabs((double)v);
    }
    for (int o = 16; o > 0; o >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        a += __shfl_xor_sync(0xffffffffu, a, o);
    }
    if (lane == 0) {
        wm[warp] = m;
        ws[warp] = a;
    }
    __syncthreads();
    m = 0.0f;
    a = 0.0;
    for (int k = 0; k < HP_WARPS; k++) { /* warp order: the same sum in every block */
        m = fmaxf(m, wm[k]);
        a += ws[k];
    }
    const float dx = m / (float)HEAD_XQ_MAX;
    for (int j = threadIdx.x; j < cols; j += HP_THREADS) {
        int v = dx > 0.0f ? __float2int_rn(x[j] / dx) : 0;
        xq[j] = (int16_t)(v > HEAD_XQ_MAX ? HEAD_XQ_MAX : v < -HEAD_XQ_MAX ? -HEAD_XQ_MAX : v);
    }
    __syncthreads();
    *dx_out = dx;
    *x1_out = a;
}

/* A warp HP_ROWS rows at a time: lane l takes 16 columns of every 512 of
 * each, one 16-byte load of the copy; the products go through dp2a (int16 pairs times int8
 * pairs, exact in int32: a lane's sum is at most cols / 32 x 16 x 127 x
 * 16383 < 2^31 for cols <= CUK_HEAD_MAX_COLS). */
__global__ void __launch_bounds__(HP_THREADS)
    k_head_screen(const struct cuk_head_copy c, const float *x)
{
    cuk_pdl_start();
    extern __shared__ __align__(16) int16_t hp_xq[];
    __shared__ unsigned best[HP_WARPS];
    float dx;
    double x1;
    hp_input(x, c.cols, hp_xq, &dx, &x1);
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    /* the kept rows are summed in double: no f32 sum to cover */
    const double t1 = head_bound_t1(x1, c.cols, 0), tq = head_bound_tq(dx);
    float lo_best = -INFINITY;
    /* HP_ROWS rows a warp at a time: their loads in flight together, and
     * each 16-byte chunk of the input read from shared memory once for all */
    for (int r0 = (blockIdx.x * HP_WARPS + warp) * HP_ROWS; r0 < c.rows;
         r0 += gridDim.x * HP_WARPS * HP_ROWS) {
        int acc[HP_ROWS];
        const int8_t *qr[HP_ROWS];
#pragma unroll
        for (int u = 0; u < HP_ROWS; u++) {
            acc[u] = 0;
            qr[u] = c.q + (size_t)(r0 + u < c.rows ? r0 + u : r0) * c.cols;
        }
        for (int j = 16 * lane; j < c.cols; j += HP_CHUNK) {
            int4 w[HP_ROWS];
#pragma unroll
            for (int u = 0; u < HP_ROWS; u++)
                w[u] = __ldcs((const int4 *)(qr[u] + j)); /* read once: evict first */
            const int4 xa = *(const int4 *)(hp_xq + j), xb = *(const int4 *)(hp_xq + j + 8);
#pragma unroll
            for (int u = 0; u < HP_ROWS; u++) {
                acc[u] = __dp2a_lo(xa.x, w[u].x, acc[u]);
                acc[u] = __dp2a_hi(xa.y, w[u].x, acc[u]);
                acc[u] = __dp2a_lo(xa.z, w[u].y, acc[u]);
                acc[u] = __dp2a_hi(xa.w, w[u].y, acc[u]);
                acc[u] = __dp2a_lo(xb.x, w[u].z, acc[u]);
                acc[u] = __dp2a_hi(xb.y, w[u].z, acc[u]);
                acc[u] = __dp2a_lo(xb.z, w[u].w, acc[u]);
                acc[u] = __dp2a_hi(xb.w, w[u].w, acc[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < HP_ROWS; u++) {
            long long d = acc[u];
            for (int o = 16; o > 0; o >>= 1)
                d += __shfl_xor_sync(0xffffffffu, d, o);
            const int r = r0 + u;
            if (lane == 0 && r < c.rows) {
                const double s = c.scale[r], a = s * (double)dx * (double)d;
                const float af = (float)a, bf = head_bound_e(a, s, t1, tq, c.qabs[r]);
                c.ab[2 * (size_t)r] = af;
                c.ab[2 * (size_t)r + 1] = bf;
                lo_best = fmaxf(lo_best, (float)((double)af - (double)bf));
            }
        }
    }
    /* lo_best rounded down to a float can exceed the double it came from:
     * one step lower keeps L a lower bound */
    if (lane == 0)
        best[warp] = cuk_order_key(nextafterf(lo_best, -INFINITY));
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned k = 0;
        for (int i = 0; i < HP_WARPS; i++)
            k = best[i] > k ? best[i] : k;
        atomicMax(c.ws, k);
    }
}

/* Rows whose a_r + e_r reaches L get their logit in double precision
 * (one warp a row), the others -inf; the last block re-arms c.ws. */
__global__ void __launch_bounds__(HP_THREADS)
    k_head_rescore(const struct cuk_head_copy c, const struct cuk_weight w, const float *x,
                   float *logits)
{
    cuk_pdl_start();
    __shared__ bool last;
    const double L = (double)cuk_order_value(*(volatile unsigned *)c.ws);
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    for (int r0 = (blockIdx.x * HP_WARPS + warp) * 32; r0 < c.rows; r0 += gridDim.x * HP_WARPS * 32) {
        const int r = r0 + lane;
        bool keep = false;
        if (r < c.rows) {
            keep = (double)c.ab[2 * (size_t)r] + (double)c.ab[2 * (size_t)r + 1] >= L;
            if (!keep)
                logits[r] = -INFINITY;
        }
        unsigned todo = __ballot_sync(0xffffffffu, keep);
        while (todo) {
            const int k = __ffs(todo) - 1;
            todo &= todo - 1;
            const int rr = r0 + k;
            double z = 0.0;
            for (int j = lane; j < w.cols; j += 32)
                z += (double)cuk_load_weight(&w, rr, j) * (double)x[j];
            for (int o = 16; o > 0; o >>= 1)
                z += __shfl_xor_sync(0xffffffffu, z, o);
            if (lane == 0)
                logits[rr] = (float)z;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0)
        last = cuk_last_arrival(c.ws + 1, gridDim.x);
    __syncthreads();
    if (last && threadIdx.x == 0)
        *c.ws = 0; /* below every key: the next step's L starts here */
}

extern "C" size_t cuk_head_smem(int cols) { return (size_t)cols * sizeof(int16_t); }

extern "C" cudaError_t cuk_head_pick(cudaStream_t s, const struct cuk_head_copy *c,
                                     const struct cuk_weight *w, const float *x, float *logits,
                                     int n_sms)
{
    if (w->rows != c->rows || w->cols != c->cols || c->cols % 16 != 0 ||
        c->cols > CUK_HEAD_MAX_COLS || n_sms < 1)
        return cudaErrorInvalidValue;
    int blocks = (c->rows + HP_WARPS * HP_ROWS - 1) / (HP_WARPS * HP_ROWS);
    blocks = blocks > 8 * n_sms ? 8 * n_sms : blocks;
    cuk_launch(k_head_screen, blocks, HP_THREADS, cuk_head_smem(c->cols), s, *c, x);
    int rb = (c->rows + HP_THREADS - 1) / HP_THREADS;
    rb = rb > 4 * n_sms ? 4 * n_sms : rb;
    cuk_launch(k_head_rescore, rb, HP_THREADS, 0, s, *c, *w, x, logits);
    return cudaGetLastError();
}
