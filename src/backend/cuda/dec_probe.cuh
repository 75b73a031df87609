/* dec_probe.cuh - where the single-sequence decode attention kernel spends
 * its time, for a measurement build only (-DCUK_DEC_PROBE in both the CUDA
 * and the C flags): per launch, the earliest and latest %globaltimer of
 * each stage over its blocks, and each block's longest time and SM cycles
 * since its release from the PDL wait; cuk_dec_probe_report prints the
 * means when the backend is destroyed. A stamp costs a block barrier and
 * fire-and-forget reductions, no load. Without the define every marker is
 * empty. Usage and readings: docs/benchmarks.md, "ninth pass" (and the
 * twelfth for the "first tile in" stage). */
#pragma once

#ifdef CUK_DEC_PROBE
#include "backend/cuda/probe_common.cuh"

#define PROBE_L 4096 /* launches kept (a ring) */
#define PROBE_S 8    /* stages: see the names in cuk_dec_probe_report */
#define PROBE_EXIT 6 /* the stage PROBE_END stamps */
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
        const unsigned long long c = clock64(), t = cuk_globaltimer();
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
    if (threadIdx.x == 0)
        probe_advance(&cuk_probe_done, &cuk_probe_seq, gridDim.x * gridDim.y * gridDim.z);
}
/* The host side (cuda_backend.h declares it): zero the record at start-up,
 * print the means when the backend is destroyed. */
extern "C" void cuk_dec_probe_init(void)
{
    probe_fill(cuk_probe_min, 0xff);
    probe_fill(cuk_probe_max, 0);
    probe_fill(cuk_probe_dt, 0);
    probe_fill(cuk_probe_dc, 0);
}

extern "C" void cuk_dec_probe_report(int skip)
{
    unsigned seq = probe_launches(cuk_probe_seq, PROBE_L, "dec probe");
    if (!seq)
        return;
    std::vector<unsigned long long> mn = probe_read<unsigned long long>(cuk_probe_min),
                                    mx = probe_read<unsigned long long>(cuk_probe_max),
                                    dt = probe_read<unsigned long long>(cuk_probe_dt),
                                    dc = probe_read<unsigned long long>(cuk_probe_dc);
    double a[PROBE_S][4] = {};
    int ks[PROBE_S] = {};
    for (unsigned l = (unsigned)skip; l < seq; l++) {
        double t0 = (double)mn[l * PROBE_S + 1];
        for (int st = 0; st < PROBE_S; st++) {
            size_t i = l * PROBE_S + st;
            if (mn[i] == ~0ull) /* no block got there (no merge) */
                continue;
            a[st][0] += ((double)mn[i] - t0) / 1e3;
            a[st][1] += ((double)mx[i] - t0) / 1e3;
            a[st][2] += (double)dt[i] / 1e3;
            a[st][3] += (double)dc[i];
            ks[st]++;
        }
    }
    static const char *nm[PROBE_S] = {"entry",  "after wait", "after rope",
                                      "after tiles", "partial written", "merged",
                                      "exit", "first tile in"};
    fprintf(stderr, "dec probe: %u launches; us from the first block's release; a block's "
                    "longest time since its release, us and SM cycles\n", seq);
    for (int st = 0; st < PROBE_S; st++) {
        double k = ks[st] ? ks[st] : 1;
        fprintf(stderr, "  %-16s earliest %8.2f latest %8.2f  block %8.2f us %9.0f cycles (%d)\n",
                nm[st], a[st][0] / k, a[st][1] / k, st > 1 ? a[st][2] / k : 0.0,
                st > 1 ? a[st][3] / k : 0.0, ks[st]);
    }
}

#define PROBE(on, st) do { if (on) probe(st); } while (0)
#define PROBE_END(on) do { if (on) { probe(PROBE_EXIT); probe_end(); } } while (0)
#else
#define PROBE(on, st) do { (void)(on); } while (0)
#define PROBE_END(on) do { (void)(on); } while (0)
#endif
