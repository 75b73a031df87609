/* gemv_probe.cuh - where a staged GEMV launch (gemv_staged.cu) spends its
 * time in a decode step, for a measurement build only (-DCUK_GEMV_PROBE in
 * both the CUDA and the C flags): per launch, the earliest and latest
 * %globaltimer of each stage over the block's warps, and each warp's
 * longest time since its release from the PDL wait; the report groups
 * launches by matrix shape. Stamps are lane 0's: no barrier is added. The
 * launch's record slot is read after the wait (the previous launch has
 * finished counting by then: PDL lets launches overlap). */
#pragma once

#ifdef CUK_GEMV_PROBE
#include "backend/cuda/probe_common.cuh"

#define GP_L 16384
#define GP_S 5
__device__ unsigned long long gp_min[GP_L][GP_S], gp_max[GP_L][GP_S], gp_wmax[GP_L][GP_S];
__device__ int gp_cols[GP_L], gp_units[GP_L];
__device__ unsigned gp_seq, gp_done;

struct gp_warp {
    unsigned long long t0, t1;
    unsigned slot;
};
static __device__ __forceinline__ unsigned long long gp_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
static __device__ __forceinline__ void gp_put(const gp_warp &w, int st, unsigned long long t)
{
    atomicMin(&gp_min[w.slot][st], t);
    atomicMax(&gp_max[w.slot][st], t);
    if (st > 1)
        atomicMax(&gp_wmax[w.slot][st], t - w.t1);
}
/* after the wait: the slot, then stages 0 and 1 */
static __device__ __forceinline__ void gp_released(gp_warp &w, int cols, int units)
{
    if ((threadIdx.x & 31) == 0) {
        w.t1 = gp_now();
        w.slot = *(volatile unsigned *)&gp_seq % GP_L;
        gp_put(w, 0, w.t0);
        gp_put(w, 1, w.t1);
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            gp_cols[w.slot] = cols;
            gp_units[w.slot] = units;
        }
    }
}
static __device__ __forceinline__ void gp_stage(const gp_warp &w, int st)
{
    if ((threadIdx.x & 31) == 0)
        gp_put(w, st, gp_now());
}
/* the launch's last warp to finish moves the record on */
static __device__ __forceinline__ void gp_end(const gp_warp &w)
{
    if ((threadIdx.x & 31) == 0) {
        gp_put(w, GP_S - 1, gp_now());
        probe_advance(&gp_done, &gp_seq, gridDim.x * (blockDim.x / 32));
    }
}

extern "C" void cuk_gemv_probe_init(void)
{
    probe_fill(gp_min, 0xff);
    probe_fill(gp_max, 0);
    probe_fill(gp_wmax, 0);
}

extern "C" void cuk_gemv_probe_report(int skip)
{
    unsigned seq = probe_launches(gp_seq, GP_L, "gemv probe");
    if (!seq)
        return;
    std::vector<unsigned long long> mn = probe_read<unsigned long long>(gp_min),
                                    mx = probe_read<unsigned long long>(gp_max),
                                    wm = probe_read<unsigned long long>(gp_wmax);
    std::vector<int> cols = probe_read<int>(gp_cols), units = probe_read<int>(gp_units);
    static const char *nm[GP_S] = {"entry", "after wait", "x staged", "first slot", "done"};
    std::vector<std::pair<int, int>> keys;
    for (unsigned l = (unsigned)skip; l < seq; l++) {
        std::pair<int, int> k(cols[l], units[l]);
        bool seen = false;
        for (auto &q : keys)
            seen |= q == k;
        if (!seen)
            keys.push_back(k);
    }
    fprintf(stderr, "gemv probe: %u launches; us from the first warp's release (earliest, "
                    "latest), a warp's longest time since its release\n", seq);
    for (auto &k : keys) {
        double a[GP_S][3] = {};
        int cnt = 0;
        for (unsigned l = (unsigned)skip; l < seq; l++) {
            if (cols[l] != k.first || units[l] != k.second)
                continue;
            double t1 = (double)mn[l * GP_S + 1];
            for (int st = 0; st < GP_S; st++) {
                a[st][0] += ((double)mn[l * GP_S + st] - t1) / 1e3;
                a[st][1] += ((double)mx[l * GP_S + st] - t1) / 1e3;
                a[st][2] += (double)wm[l * GP_S + st] / 1e3;
            }
            cnt++;
        }
        fprintf(stderr, "  cols %d, units %d: %d launches\n", k.first, k.second, cnt);
        for (int st = 0; st < GP_S; st++)
            fprintf(stderr, "    %-11s %8.2f %8.2f  warp %8.2f\n", nm[st], a[st][0] / cnt,
                    a[st][1] / cnt, a[st][2] / cnt);
    }
}
#endif
