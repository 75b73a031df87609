// logprobs.cu - the statistics a reported log-probability needs, made where
// the logits are (cuk_row_logprobs, cuda_backend.h): a block per row finds
// the maximum, the sum of exponentials, and the k largest entries one
// after another, each the largest of those ranking after the last (larger
// first, the lower id on ties), so nothing but those numbers leaves the
// device.
#include <math.h>

#include "cuda_backend.h"

#define RL_THREADS 512
#define RL_WARPS (RL_THREADS / 32)

// Whether (v, i) ranks before (w, j): larger value, or equal and lower id.
// An id < 0 is no entry and ranks after everything.
__device__ static bool ranks_before(float v, int i, float w, int j)
{
    return i >= 0 && (j < 0 || v > w || (v == w && i < j));
}

__global__ void __launch_bounds__(RL_THREADS)
    row_logprobs_kernel(struct cuk_row_logprobs *out, const float *x, int n, const int *pick, int k)
{
    const float *row = x + (size_t)blockIdx.x * n;
    __shared__ float sv[RL_WARPS];
    __shared__ int si[RL_WARPS];
    __shared__ double sd[RL_WARPS];
    __shared__ float s_max, s_best;
    __shared__ int s_id;
    __shared__ double s_lse;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    float m = -INFINITY;
    for (int i = threadIdx.x; i < n; i += RL_THREADS)
        m = row[i] > m ? row[i] : m; // NaN never wins
    for (int o = 16; o; o >>= 1) {
        float t = __shfl_xor_sync(0xffffffffu, m, o);
        m = t > m ? t : m;
    }
    if (lane == 0)
        sv[warp] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        float mm = -INFINITY;
        for (int w = 0; w < RL_WARPS; w++)
            mm = sv[w] > mm ? sv[w] : mm;
        s_max = mm;
    }
    __syncthreads();
    m = s_max;

    // float exponentials a thread (a few hundred terms of at most 1),
    // summed across threads in double
    float fs = 0.0f;
    if (!isinf(m))
        for (int i = threadIdx.x; i < n; i += RL_THREADS)
            if (!isnan(row[i]))
                fs += expf(row[i] - m);
    double s = fs;
    for (int o = 16; o; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0)
        sd[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int w = 0; w < RL_WARPS; w++)
            t += sd[w];
        s_lse = isinf(m) ? (double)m : (double)m + log(t);
    }
    __syncthreads();
    const double lse = s_lse;
    struct cuk_row_logprobs *o = out + blockIdx.x;

    float pv = INFINITY;
    int pid = -1, got = 0;
    for (int r = 0; r < k && r < CUK_ROW_TOP_MAX; r++) {
        float bv = -INFINITY;
        int bi = -1;
        for (int i = threadIdx.x; i < n; i += RL_THREADS) {
            float v = row[i];
            if (isnan(v) || !(v < pv || (v == pv && i > pid)))
                continue; // taken already, or ranks before what was
            if (ranks_before(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
        for (int off = 16; off; off >>= 1) {
            float tv = __shfl_xor_sync(0xffffffffu, bv, off);
            int ti = __shfl_xor_sync(0xffffffffu, bi, off);
            if (ranks_before(tv, ti, bv, bi)) {
                bv = tv;
                bi = ti;
            }
        }
        if (lane == 0) {
            sv[warp] = bv;
            si[warp] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float b = -INFINITY;
            int id = -1;
            for (int w = 0; w < RL_WARPS; w++)
                if (ranks_before(sv[w], si[w], b, id)) {
                    b = sv[w];
                    id = si[w];
                }
            s_best = b;
            s_id = id;
            if (id >= 0) {
                o->id[r] = id;
                o->val[r] = (float)((double)b - lse);
            }
        }
        __syncthreads();
        pv = s_best;
        pid = s_id;
        __syncthreads(); // s_best, s_id, sv, si are written again next round
        if (pid < 0)
            break;
        got++;
    }
    if (threadIdx.x == 0) {
        int p = pick[blockIdx.x];
        o->lse = lse;
        o->n_top = got;
        o->pick = p >= 0 && p < n ? (float)((double)row[p] - lse) : NAN;
    }
}

extern "C" cudaError_t cuk_row_logprobs(cudaStream_t s, struct cuk_row_logprobs *out,
                                        const float *x, int rows, int n, const int *pick, int k)
{
    if (rows <= 0)
        return cudaSuccess;
    row_logprobs_kernel<<<rows, RL_THREADS, 0, s>>>(out, x, n, pick, k);
    return cudaGetLastError();
}
