/* bench_cuda.cuh - what the CUDA benchmarks share: a CUDA call that exits
 * with its error, reproducible random fills on the device (a splitmix hash
 * of the index and a seed), and timing calls replayed from a CUDA graph.
 * Header-only: each benchmark is one translation unit. */
#ifndef CLLM_BENCH_CUDA_CUH
#define CLLM_BENCH_CUDA_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                        \
    do {                                                                                \
        cudaError_t err_ = (call);                                                      \
        if (err_ != cudaSuccess) {                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
                    cudaGetErrorString(err_));                                          \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

static __device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed)
{
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 16);
}

static __device__ __forceinline__ float urand(uint64_t i, uint32_t seed) /* [-1, 1) */
{
    return (float)(hash32(i, seed) & 0xffffff) / 8388608.0f - 1.0f;
}

/* w[i] = scale * urand, truncated to bf16 (any bf16 pattern is a weight). */
static __global__ void k_fill_bf16(uint16_t *w, size_t n, uint32_t seed, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        w[i] = (uint16_t)(__float_as_uint(scale * urand(i, seed)) >> 16);
}

static __global__ void k_fill_f32(float *x, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = urand(i, seed);
}

/* Microseconds per call of issue(stream, copy): reps calls (cycling
 * through copy 0..copies-1) captured into a CUDA graph, which is replayed
 * once to warm up, then `replays` times timed. */
template <typename F> static double time_graph(int replays, int reps, int copies, F issue)
{
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int it = 0; it < reps; it++)
        issue(st, it % copies);
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaGraphLaunch(exec, st));
    CK(cudaEventRecord(e0, st));
    for (int r = 0; r < replays; r++)
        CK(cudaGraphLaunch(exec, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms_el = 0;
    CK(cudaEventElapsedTime(&ms_el, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(st));
    return ms_el * 1000.0 / ((double)replays * reps);
}

#endif
