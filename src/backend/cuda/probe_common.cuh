/* probe_common.cuh - what the measurement builds (dec_probe.cuh,
 * gemv_probe.cuh) share: moving a launch ring on once the launch's last
 * thread group is done, and setting a device record before a run. */
#pragma once

#include <cuda_runtime.h>

/* The caller's launch is done once n groups have called this; the last
 * one re-arms *done and moves *seq (the launch's record slot) on. */
static __device__ __forceinline__ void probe_advance(unsigned *done, unsigned *seq, unsigned n)
{
    __threadfence();
    if (atomicAdd(done, 1) == n - 1) {
        *done = 0;
        __threadfence();
        atomicAdd(seq, 1);
    }
}

/* Every byte of the __device__ record sym set to byte. */
template <typename T> static void probe_fill(const T &sym, int byte)
{
    void *p;
    if (cudaGetSymbolAddress(&p, sym) == cudaSuccess)
        cudaMemset(p, byte, sizeof sym);
}
