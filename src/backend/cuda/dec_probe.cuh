/* dec_probe.cuh - where the single-sequence decode attention kernel spends
 * its time, for a measurement build only (-DCUK_DEC_PROBE in both the CUDA
 * and the C flags): per launch, the earliest and latest %globaltimer of
 * each stage over its blocks, and each block's longest time and SM cycles
 * since its release from the PDL wait; cuk_dec_probe_report prints the
 * means when the backend is destroyed. A stamp costs a block barrier and
 * fire-and-forget reductions, no load. Without the define every marker is
 * empty. Usage and readings: docs/benchmarks.md, "ninth pass". */
#pragma once

#ifdef CUK_DEC_PROBE
#define PROBE_L 4096 /* launches kept (a ring) */
#define PROBE_S 7
__device__ unsigned long long cuk_probe_min[PROBE_L][PROBE_S], cuk_probe_max[PROBE_L][PROBE_S];
__device__ unsigned long long cuk_probe_dt[PROBE_L][PROBE_S], cuk_probe_dc[PROBE_L][PROBE_S];
__device__ unsigned cuk_probe_seq, cuk_probe_done;

static __device__ __forceinline__ unsigned &probe_slot()
{
    __shared__ unsigned slot;
    return slot;
}
static __device__ __forceinline__ unsigned long long *probe_t1()
{
    __shared__ unsigned long long t1[2];
    return t1;
}
/* every thread of the block, at a point all of them reach */
static __device__ __forceinline__ void probe(int stage)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long t, c = clock64();
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        unsigned l = probe_slot();
        if (stage == 0) {
            l = probe_slot() = *(volatile unsigned *)&cuk_probe_seq % PROBE_L;
            probe_t1()[0] = 0; /* a block with no keys never gets to stage 1 */
        }
        atomicMin(&cuk_probe_min[l][stage], t);
        atomicMax(&cuk_probe_max[l][stage], t);
        if (stage == 1) {
            probe_t1()[0] = t;
            probe_t1()[1] = c;
        } else if (stage > 1 && probe_t1()[0]) {
            atomicMax(&cuk_probe_dt[l][stage], t - probe_t1()[0]);
            atomicMax(&cuk_probe_dc[l][stage], c - probe_t1()[1]);
        }
    }
}
/* the last block of a launch to get here moves the ring on */
static __device__ __forceinline__ void probe_end()
{
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&cuk_probe_done, 1) == gridDim.x * gridDim.y * gridDim.z - 1) {
            cuk_probe_done = 0;
            __threadfence();
            atomicAdd(&cuk_probe_seq, 1);
        }
    }
}
#define PROBE(on, st) do { if (on) probe(st); } while (0)
#define PROBE_END(on) do { if (on) { probe(PROBE_S - 1); probe_end(); } } while (0)
#else
#define PROBE(on, st) do { } while (0)
#define PROBE_END(on) do { } while (0)
#endif
