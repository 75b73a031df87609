/* gemv_probe.cuh - where a staged GEMV launch (gemv_staged.cu's, and the
 * quantized k_gemv_qstaged of gemv_quant.cu) spends its
 * time in a decode step, for a measurement build only (-DCUK_GEMV_PROBE in
 * both the CUDA and the C flags): per launch, the earliest and latest
 * %globaltimer of each stage over the block's warps, and each warp's
 * longest time since its release from the PDL wait; the report groups
 * launches by matrix shape and rows of x (tokens). Stamps are lane 0's:
 * no barrier is added. The launch's record slot is read after the wait
 * (the previous launch has finished counting by then: PDL lets launches
 * overlap). */
#pragma once

#ifdef CUK_GEMV_PROBE
#include "backend/cuda/probe_common.cuh"
#include <array>
#include <math.h>

/* One set of records a kernel file: gemv_staged.cu's by default,
 * gemv_quant.cu's (k_gemv_qstaged) under its own names (it defines these
 * before including this). */
#ifndef GP_NS
#define GP_NS gp_bf16
#define GP_WHAT "gemv probe"
#define GP_INIT cuk_gemv_probe_init
#define GP_REPORT cuk_gemv_probe_report
#endif

namespace GP_NS {

#define GP_L 16384
#define GP_S 5
__device__ unsigned long long gp_min[GP_L][GP_S], gp_max[GP_L][GP_S], gp_wmax[GP_L][GP_S];
__device__ int gp_cols[GP_L], gp_units[GP_L], gp_nt[GP_L];
/* per launch and block: its warps' earliest and latest end, and its SM */
#define GP_B 144
__device__ unsigned long long gp_bmin[GP_L][GP_B], gp_bmax[GP_L][GP_B];
__device__ int gp_bsm[GP_L][GP_B];
__device__ unsigned gp_seq, gp_done;

struct gp_warp {
    unsigned long long t0, t1;
    unsigned slot;
};
static __device__ __forceinline__ void gp_put(const gp_warp &w, int st, unsigned long long t)
{
    atomicMin(&gp_min[w.slot][st], t);
    atomicMax(&gp_max[w.slot][st], t);
    if (st > 1)
        atomicMax(&gp_wmax[w.slot][st], t - w.t1);
}
/* after the wait: the slot, then stages 0 and 1 */
static __device__ __forceinline__ void gp_released(gp_warp &w, int cols, int units, int nt)
{
    if ((threadIdx.x & 31) == 0) {
        w.t1 = cuk_globaltimer();
        w.slot = *(volatile unsigned *)&gp_seq % GP_L;
        gp_put(w, 0, w.t0);
        gp_put(w, 1, w.t1);
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            gp_cols[w.slot] = cols;
            gp_units[w.slot] = units;
            gp_nt[w.slot] = nt;
        }
    }
}
static __device__ __forceinline__ void gp_stage(const gp_warp &w, int st)
{
    if ((threadIdx.x & 31) == 0)
        gp_put(w, st, cuk_globaltimer());
}
/* the launch's last warp to finish moves the record on */
static __device__ __forceinline__ void gp_end(const gp_warp &w)
{
    if ((threadIdx.x & 31) == 0) {
        const unsigned long long t = cuk_globaltimer();
        gp_put(w, GP_S - 1, t);
        if (blockIdx.x < GP_B) {
            atomicMin(&gp_bmin[w.slot][blockIdx.x], t);
            atomicMax(&gp_bmax[w.slot][blockIdx.x], t);
            if (threadIdx.x == 0) {
                unsigned sm;
                asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
                gp_bsm[w.slot][blockIdx.x] = (int)sm;
            }
        }
        probe_advance(&gp_done, &gp_seq, gridDim.x * (blockDim.x / 32));
    }
}

static void init(void)
{
    probe_fill(gp_min, 0xff);
    probe_fill(gp_max, 0);
    probe_fill(gp_wmax, 0);
    probe_fill(gp_bmin, 0xff);
    probe_fill(gp_bmax, 0);
    probe_fill(gp_bsm, 0xff);
}

static void report(int skip)
{
    unsigned seq = probe_launches(gp_seq, GP_L, GP_WHAT);
    if (!seq)
        return;
    std::vector<unsigned long long> mn = probe_read<unsigned long long>(gp_min),
                                    mx = probe_read<unsigned long long>(gp_max),
                                    wm = probe_read<unsigned long long>(gp_wmax),
                                    bmn = probe_read<unsigned long long>(gp_bmin),
                                    bmx = probe_read<unsigned long long>(gp_bmax);
    std::vector<int> bsm = probe_read<int>(gp_bsm);
    std::vector<int> cols = probe_read<int>(gp_cols), units = probe_read<int>(gp_units),
                     nt = probe_read<int>(gp_nt);
    static const char *nm[GP_S] = {"entry", "after wait", "x staged", "first slot", "done"};
    /* a launch's key: its columns, units and rows of x */
    auto key = [&](unsigned l) { return std::array<int, 3>{cols[l], units[l], nt[l]}; };
    std::vector<std::array<int, 3>> keys;
    for (unsigned l = (unsigned)skip; l < seq; l++) {
        std::array<int, 3> k = key(l);
        bool seen = false;
        for (auto &q : keys)
            seen |= q == k;
        if (!seen)
            keys.push_back(k);
    }
    fprintf(stderr, "%s: %u launches; us from the first warp's release (earliest, "
                    "latest), a warp's longest time since its release\n", GP_WHAT, seq);
    for (auto &k : keys) {
        double a[GP_S][3] = {};
        int cnt = 0;
        for (unsigned l = (unsigned)skip; l < seq; l++) {
            if (key(l) != k)
                continue;
            double t1 = (double)mn[l * GP_S + 1];
            for (int st = 0; st < GP_S; st++) {
                a[st][0] += ((double)mn[l * GP_S + st] - t1) / 1e3;
                a[st][1] += ((double)mx[l * GP_S + st] - t1) / 1e3;
                a[st][2] += (double)wm[l * GP_S + st] / 1e3;
            }
            cnt++;
        }
        fprintf(stderr, "  cols %d, units %d, rows of x %d: %d launches\n", k[0], k[1], k[2],
                cnt);
        /* Where the end spread lies: within a block (its warps) or between
         * blocks, and whether the late blocks are the same SMs each time. */
        double within = 0, between = 0, var_all = 0;
        std::vector<double> sm_late(256, 0.0);
        std::vector<int> sm_n(256, 0);
        int nl = 0, nbt = 0;
        for (unsigned l = (unsigned)skip; l < seq; l++) {
            if (key(l) != k)
                continue;
            double lo = 1e30, hi = -1e30, mean = 0;
            int nb = 0;
            for (int b = 0; b < GP_B; b++) {
                if (bmx[(size_t)l * GP_B + b] == 0)
                    continue;
                double e = (double)bmx[(size_t)l * GP_B + b] / 1e3;
                within += e - (double)bmn[(size_t)l * GP_B + b] / 1e3;
                lo = e < lo ? e : lo;
                hi = e > hi ? e : hi;
                mean += e;
                nb++;
            }
            if (!nb)
                continue;
            mean /= nb;
            between += hi - lo;
            for (int b = 0; b < GP_B; b++) {
                if (bmx[(size_t)l * GP_B + b] == 0)
                    continue;
                double d = (double)bmx[(size_t)l * GP_B + b] / 1e3 - mean;
                var_all += d * d / nb;
                int sm = bsm[(size_t)l * GP_B + b];
                if (sm >= 0 && sm < 256) {
                    sm_late[sm] += d;
                    sm_n[sm]++;
                }
            }
            nbt += nb;
            nl++;
        }
        if (nl) {
            double var_sm = 0;
            int nsm = 0;
            for (int i = 0; i < 256; i++)
                if (sm_n[i]) {
                    double m = sm_late[i] / sm_n[i];
                    var_sm += m * m;
                    nsm++;
                }
            var_sm /= nsm ? nsm : 1;
            fprintf(stderr,
                    "    block ends: within a block %.2f us (mean over blocks), first to last "
                    "block %.2f us, sd %.2f us of which an SM's mean lateness sd %.2f us\n",
                    within / nbt, between / nl, sqrt(var_all / nl), sqrt(var_sm));
            /* the five latest SMs on average */
            for (int rep = 0; rep < 5; rep++) {
                int best = -1;
                for (int i = 0; i < 256; i++)
                    if (sm_n[i] && (best < 0 || sm_late[i] / sm_n[i] > sm_late[best] / sm_n[best]))
                        best = i;
                if (best < 0)
                    break;
                fprintf(stderr, "      late SM %d: +%.2f us\n", best, sm_late[best] / sm_n[best]);
                sm_n[best] = 0;
            }
        }
        for (int st = 0; st < GP_S; st++)
            fprintf(stderr, "    %-11s %8.2f %8.2f  warp %8.2f\n", nm[st], a[st][0] / cnt,
                    a[st][1] / cnt, a[st][2] / cnt);
    }
}
} /* namespace GP_NS */
using namespace GP_NS;

extern "C" void GP_INIT(void)
{
    GP_NS::init();
}

extern "C" void GP_REPORT(int skip)
{
    GP_NS::report(skip);
}
#endif
