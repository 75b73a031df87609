/* order_key.cuh - a value and its index as unsigned integers that order as
 * the greedy pick does: the larger value first (-0 and +0 as one), then the
 * lower index; so a row's pick is the largest key, found by any maximum
 * (a reduction, atomicMax). Shared by the argmax kernels (kernels.cu) and
 * the sampler (sample.cu, which test_sample_emu also builds on the host).
 * NaN has no place in the order: callers skip it. */
#ifndef CLLM_CUDA_ORDER_KEY_CUH
#define CLLM_CUDA_ORDER_KEY_CUH

/* v as an unsigned that orders as v does. */
static __device__ __forceinline__ unsigned cuk_order_key(float v)
{
    unsigned b = __float_as_uint(v);
    if (b == 0x80000000u)
        b = 0;
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

/* The value of a key (-0 comes back as +0). */
static __device__ __forceinline__ float cuk_order_value(unsigned key)
{
    return __uint_as_float((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

/* Value key and index id as one number: the larger value, then the lower
 * index, is the larger number; 0 is below every one of them. */
static __device__ __forceinline__ unsigned long long cuk_best_key(unsigned key, int id)
{
    return (unsigned long long)key << 32 | (0xffffffffu - (unsigned)id);
}

static __device__ __forceinline__ int cuk_best_id(unsigned long long best)
{
    return (int)(0xffffffffu - (unsigned)best);
}

#endif
