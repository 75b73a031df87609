/* probe_common.cuh - what the measurement builds (dec_probe.cuh,
 * gemv_probe.cuh) share: moving a launch ring on once the launch's last
 * thread group is done, and setting a device record before a run. */
#pragma once

#include <cuda_runtime.h>
#include <stdio.h>
#include <vector>

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

/* A copy of the __device__ record sym as elements of E. */
template <typename E, typename T> static std::vector<E> probe_read(const T &sym)
{
    std::vector<E> v(sizeof sym / sizeof(E));
    cudaMemcpyFromSymbol(v.data(), sym, sizeof sym);
    return v;
}

/* The launches recorded in seq_sym, or 0 (with a line saying so) when
 * more than the kept ones ran: the ring went round, a launch's slot mixes
 * two launches. */
static unsigned probe_launches(const unsigned &seq_sym, unsigned kept, const char *what)
{
    unsigned seq = 0;
    cudaMemcpyFromSymbol(&seq, seq_sym, sizeof seq);
    if (seq <= kept)
        return seq;
    fprintf(stderr, "%s: %u launches, more than the %u kept: run fewer steps\n", what, seq, kept);
    return 0;
}

/* Every byte of the __device__ record sym set to byte. */
template <typename T> static void probe_fill(const T &sym, int byte)
{
    void *p;
    if (cudaGetSymbolAddress(&p, sym) == cudaSuccess)
        cudaMemset(p, byte, sizeof sym);
}
