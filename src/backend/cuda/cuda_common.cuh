/* cuda_common.cuh - device helpers shared by the CUDA kernels: exact
 * f16/bf16 widening, weight element loads for every dtype, warp sums and
 * the paged-KV address of a position. */
#ifndef CLLM_BACKEND_CUDA_COMMON_CUH
#define CLLM_BACKEND_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "backend/cuda/cuda_backend.h"
#include "model/tensor.h"

static __device__ __forceinline__ float cuk_bf16(uint16_t v)
{
    return __uint_as_float((uint32_t)v << 16);
}

static __device__ __forceinline__ float cuk_f16(uint16_t v)
{
    return __half2float(__ushort_as_half(v));
}

/* Element (r, j) of a weight matrix widened to f32 (exact for every dtype). */
static __device__ __forceinline__ float cuk_load_weight(const struct cuk_weight *w, size_t r, int j)
{
    size_t i = r * (size_t)w->cols + j;
    switch (w->dtype) {
    case DT_F32: return ((const float *)w->data)[i];
    case DT_F16: return cuk_f16(((const uint16_t *)w->data)[i]);
    case DT_BF16: return cuk_bf16(((const uint16_t *)w->data)[i]);
    case DT_Q8_0: return cuk_f16(w->scales[i / Q8_0_BLOCK]) * (float)((const int8_t *)w->data)[i];
    default: return 0.0f;
    }
}

static __device__ __forceinline__ float cuk_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ double cuk_warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Float offset of position pos of layer g->layer in the K (or V) pool. */
static __device__ __forceinline__ size_t cuk_kv_offset(const struct cuk_attn *g, const int *table,
                                                       int pos)
{
    size_t blk = (size_t)table[pos / g->block_size];
    return ((blk * g->n_layers + g->layer) * g->block_size + pos % g->block_size) *
           (size_t)g->kv_dim;
}

#endif
