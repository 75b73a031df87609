/* bench_persist - how much of a decode step's GEMV time is the boundary
 * between dependent launches: the GEMV chain of a decode step (per layer
 * q/k/v, o + residual, gate/up + SwiGLU, down + residual; then the LM
 * head) of the Qwen3-0.6B and Llama-3.1-8B shapes in bf16, run two ways by
 * the same kernel code:
 *
 *   launch:  one launch per matrix, chained with programmatic dependent
 *            launch (each launch's first copies go out before its wait);
 *   persist: one launch for the step; blocks meet at a grid barrier
 *            between matrices, and each warp's copy ring runs on into
 *            the next matrices' weights while it waits there.
 *
 * Both replay a CUDA graph; the two final vectors must be equal bit for
 * bit (same arithmetic, same order). Prints µs per step and % of the
 * weight bytes ÷ --bw, and for the persistent run where a matrix's time
 * goes (per block, from %globaltimer: the barrier, staging x, the rows).
 * Findings: docs/benchmarks.md, seventh pass.
 *
 *   bench_persist [--bw BYTES_PER_S] [--reps N] [--slot KB] [--ring KB]
 *                 [--shape 0.6b|8b|tiny|both] [--layers N] [--barrier 0|1]
 *                 [--ahead N]
 *
 * --slot, --ring: bytes per copy slot and per block's ring; tiny: matrices
 * of ~0.3 MB, whose time is the fixed cost; --barrier 1: the barrier's
 * arrival as red.release (0: fence + atomicAdd); --ahead N: each warp also
 * pulls its next N items into L2 (cp.async.bulk.prefetch.L2).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "bench_cuda.cuh"

#define PW 8 /* warps per block */
#define PT (PW * 32)
#define P_MAX_SLOTS 16
#define P_MAX_PHASES 160

struct phase {
    const char *w0, *w1; /* w1: up of a (gate, up) pair, else NULL */
    const float *x;
    float *y;
    int units, cols, add, chunk; /* chunk: columns per slot */
};

static __device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* The warp's share of phase ph: units ubase, ubase + PW, ... (nu of them),
 * each in nch column chunks. */
struct share {
    int ubase, nu, nch;
};

static __device__ __forceinline__ share share_of(const phase &ph, int warp)
{
    share s;
    int u0 = (int)((unsigned)ph.units * blockIdx.x / gridDim.x); /* units < 2^24 */
    int u1 = (int)((unsigned)ph.units * (blockIdx.x + 1) / gridDim.x);
    s.ubase = u0 + warp;
    s.nu = u1 - s.ubase > 0 ? (u1 - s.ubase + PW - 1) / PW : 0;
    s.nch = (ph.cols + ph.chunk - 1) / ph.chunk;
    return s;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* A position in the warp's stream of items: phase ip, its unit j, column
 * chunk ch. */
struct pos {
    int ip, j, ch;
    share sh;
};

/* Moves q to the first item at or after it (false: none before p1). */
static __device__ __forceinline__ bool settle(pos &q, int p1, const phase *phs, int warp)
{
    while (q.ip < p1 && q.j >= q.sh.nu) {
        if (++q.ip < p1)
            q.sh = share_of(phs[q.ip], warp);
        q.j = q.ch = 0;
    }
    return q.ip < p1;
}

static __device__ __forceinline__ void step(pos &q)
{
    if (++q.ch == q.sh.nch) {
        q.ch = 0;
        q.j++;
    }
}

/* Lane 0's cursors: the next item to copy into the ring (issued so far:
 * issued) and the next to pull into L2 (pulled so far: pulled), which runs
 * up to `ahead` items in front. */
struct cursor {
    pos c, l;
    unsigned issued, pulled;
};

static __device__ __forceinline__ void fill(cursor &c, unsigned consumed, int p1,
                                            const phase *phs, int warp, int slots, int slot_bytes,
                                            unsigned char *ring, uint64_t *bar, int ahead)
{
    while (c.issued - consumed < (unsigned)slots && settle(c.c, p1, phs, warp)) {
        const phase &ph = phs[c.c.ip];
        int u = c.c.sh.ubase + c.c.j * PW, c0 = c.c.ch * ph.chunk, nc = min(ph.chunk, ph.cols - c0);
        unsigned bytes = (unsigned)nc * 2, s = c.issued % (unsigned)slots;
        unsigned char *dst = ring + (size_t)s * slot_bytes;
        size_t off = ((size_t)u * ph.cols + c0) * 2;
        cuk_mbar_expect(bar + s, ph.w1 ? 2 * bytes : bytes);
        const uint64_t pol = cuk_l2_evict_first();
        cuk_bulk_copy(dst, ph.w0 + off, bytes, bar + s, pol);
        if (ph.w1)
            cuk_bulk_copy(dst + (size_t)ph.chunk * 2, ph.w1 + off, bytes, bar + s, pol);
        c.issued++;
        step(c.c);
    }
    if (c.pulled < c.issued) { /* the L2 cursor never trails the ring's */
        c.l = c.c;
        c.pulled = c.issued;
    }
    while (c.pulled < c.issued + (unsigned)ahead && settle(c.l, p1, phs, warp)) {
        const phase &ph = phs[c.l.ip];
        int u = c.l.sh.ubase + c.l.j * PW, c0 = c.l.ch * ph.chunk, nc = min(ph.chunk, ph.cols - c0);
        size_t off = ((size_t)u * ph.cols + c0) * 2;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(ph.w0 + off), "r"(nc * 2)
                     : "memory");
        if (ph.w1)
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(ph.w1 + off),
                         "r"(nc * 2)
                         : "memory");
        c.pulled++;
        step(c.l);
    }
}

#endif

/* trace (block 0, thread 0, when not NULL): per phase the times at which
 * it arrived at the barrier, left it, had x staged, and finished its rows.
 * how: 0 fence + atomicAdd, 1 red.release */
__global__ void __launch_bounds__(PT, 1)
    k_chain(const phase *phs, int p0, int p1, unsigned *gbar, int slots, int slot_bytes,
            int tile_cols, unsigned long long *trace, int how, int ahead)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ phase sph[P_MAX_PHASES]; /* the table, read on every copy */
    for (int i = threadIdx.x; i < (p1 - p0) * (int)sizeof(phase) / 4; i += PT)
        ((int *)sph)[i] = ((const int *)(phs + p0))[i];
    __syncthreads();
    phs = sph - p0;
    float4 *xs = (float4 *)smem;
    uint64_t *bars = (uint64_t *)(smem + (size_t)tile_cols * 4);
    unsigned char *ring = smem + (size_t)tile_cols * 4 + (PW * P_MAX_SLOTS * 8);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint64_t *bar = bars + warp * slots;
    unsigned char *wring = ring + (size_t)warp * slots * slot_bytes;
    cursor c = {};
    unsigned consumed = 0;
    if (lane == 0) {
        for (int s = 0; s < slots; s++)
            cuk_mbar_init(bar + s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        c.c.ip = p0;
        c.c.sh = share_of(phs[p0], warp);
        c.l = c.c;
        fill(c, 0, p1, phs, warp, slots, slot_bytes, wring, bar, ahead);
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const bool tr = trace && threadIdx.x == 0;
    unsigned long long *trb = trace ? trace + (size_t)blockIdx.x * 6 : NULL;
    const size_t tstride = (size_t)gridDim.x * 6;
    phase ph = phs[p0];
    for (int p = p0; p < p1; p++) {
        if (p > p0) { /* every block's outputs of phase p - 1 are written */
            __syncthreads();
            if (tr)
                trb[p * tstride + 0] = cuk_globaltimer();
            if (threadIdx.x == 0) {
                if (how == 0) {
                    __threadfence();
                    atomicAdd(gbar, 1u);
                } else {
                    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(gbar) : "memory");
                }
                unsigned target = (unsigned)(p - p0) * gridDim.x;
                while (ld_acquire(gbar) < target)
                    ;
            }
            __syncthreads();
            if (tr)
                trb[p * tstride + 1] = cuk_globaltimer();
        }
        /* x into the tile, in gemv_stage's layout */
        for (int f = threadIdx.x; f < ph.cols / 4; f += PT)
            xs[gemv_xs_slot<8>(f)] = __ldcg((const float4 *)ph.x + f);
        __syncthreads();
        if (tr)
            trb[p * tstride + 2] = cuk_globaltimer();
        share sh = share_of(ph, warp);
        const int cvec = ph.chunk / 8;
        for (int j = 0; j < sh.nu; j++) {
            float acc0 = 0.0f, acc1 = 0.0f;
            /* the residual, read now so its latency hides behind the row */
            const float yold = ph.add && lane == 0 ? __ldcg(ph.y + sh.ubase + j * PW) : 0.0f;
            for (int ch = 0; ch < sh.nch; ch++) {
                unsigned s = consumed % (unsigned)slots;
                cuk_mbar_wait(bar + s, (consumed / (unsigned)slots) & 1u);
                if (tr && j == 0 && ch == 0)
                    trb[p * tstride + 4] = cuk_globaltimer();
                const uint4 *wv = (const uint4 *)(wring + (size_t)s * slot_bytes);
                const int nvec = min(ph.chunk, ph.cols - ch * ph.chunk) / 8;
                const float4 *xc = xs + (size_t)(ch * cvec / 32) * 64 + lane;
                for (int v0 = 0; v0 < nvec; v0 += 128) {
                    uint4 wb[4], ub[4];
                    float4 xb[4][2];
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        const int v = v0 + 32 * b + lane;
                        if (v < nvec) {
                            wb[b] = wv[v];
                            if (ph.w1)
                                ub[b] = wv[cvec + v];
                            xb[b][0] = xc[(v0 / 32 + b) * 64];
                            xb[b][1] = xc[(v0 / 32 + b) * 64 + 32];
                        }
                    }
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        if (v0 + 32 * b + lane >= nvec)
                            break;
                        float f[8];
                        const float *xv = (const float *)xb[b];
                        unpack<WT_BF16>(wb[b], f);
#pragma unroll
                        for (int e = 0; e < 8; e++)
                            acc0 = fmaf(f[e], xv[e], acc0);
                        if (ph.w1) {
                            unpack<WT_BF16>(ub[b], f);
#pragma unroll
                            for (int e = 0; e < 8; e++)
                                acc1 = fmaf(f[e], xv[e], acc1);
                        }
                    }
                }
                __syncwarp();
                consumed++;
                if (lane == 0)
                    fill(c, consumed, p1, phs, warp, slots, slot_bytes, wring, bar, ahead);
            }
            const int u = sh.ubase + j * PW;
            if (tr && j == sh.nu - 1)
                trb[p * tstride + 5] = cuk_globaltimer();
            float g = cuk_warp_sum(acc0);
            if (ph.w1) {
                float uv = cuk_warp_sum(acc1);
                if (lane == 0)
                    ph.y[u] = cuk_silu_mul1(g, uv);
            } else if (lane == 0) {
                ph.y[u] = ph.add ? yold + g : g;
            }
        }
        if (tr)
            trb[p * tstride + 3] = cuk_globaltimer();
        if (p + 1 < p1)
            ph = phs[p + 1];
    }
    if (p1 - p0 > 1 && threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(gbar + 1, 1u) == gridDim.x - 1) { /* every block is past every wait */
            gbar[0] = 0;
            gbar[1] = 0;
        }
    }
#else
    (void)phs, (void)p0, (void)p1, (void)gbar, (void)slots, (void)slot_bytes, (void)tile_cols;
    (void)trace, (void)how, (void)ahead;
#endif
}

struct shape {
    const char *name;
    int layers, hidden, q, kv, inter, vocab;
};

static char *weights(size_t rows, size_t cols, uint32_t seed, size_t *total)
{
    uint16_t *w;
    CK(cudaMalloc(&w, rows * cols * 2));
    k_fill_bf16<<<1024, 256>>>(w, rows * cols, seed, 0.02f);
    CK(cudaGetLastError());
    *total += rows * cols * 2;
    return (char *)w;
}

static int pick_chunk(int cols, int pair, int slot_bytes)
{
    int c = slot_bytes / (2 * (pair ? 2 : 1));
    c = c / 256 * 256;
    int tile = (cols + 255) / 256 * 256;
    return c > tile ? tile : c;
}

static void run_shape(const shape &sh, double bw, int reps, int slot_kb, int ring_kb, int sms,
                      int how, int ahead)
{
    /* the chain's vectors: x (hidden), qkv (q + 2 kv), h (inter), logits */
    float *x, *x0, *qkv, *h, *logits;
    int nqkv = sh.q + 2 * sh.kv;
    CK(cudaMalloc(&x, sh.hidden * 4));
    CK(cudaMalloc(&x0, sh.hidden * 4));
    CK(cudaMalloc(&qkv, nqkv * 4));
    CK(cudaMalloc(&h, sh.inter * 4));
    CK(cudaMalloc(&logits, (size_t)sh.vocab * 4));
    k_fill_f32<<<64, 256>>>(x0, sh.hidden, 7);
    size_t bytes = 0;
    int np = sh.layers * 4 + 1, slot_bytes = slot_kb * 1024;
    if (np > P_MAX_PHASES) {
        fprintf(stderr, "too many matrices (%d > %d)\n", np, P_MAX_PHASES);
        exit(2);
    }
    phase *hp = (phase *)calloc(np, sizeof(phase));
    int maxcols = 0;
    for (int l = 0; l < sh.layers; l++) {
        phase *p = hp + 4 * l;
        p[0] = {weights(nqkv, sh.hidden, 100 + l, &bytes), NULL, x, qkv, nqkv, sh.hidden, 0, 0};
        /* o reads q (standing in for attention's output) */
        p[1] = {weights(sh.hidden, sh.q, 200 + l, &bytes), NULL, qkv, x, sh.hidden, sh.q, 1, 0};
        p[2] = {weights(sh.inter, sh.hidden, 300 + l, &bytes), weights(sh.inter, sh.hidden, 400 + l, &bytes),
                x, h, sh.inter, sh.hidden, 0, 0};
        p[3] = {weights(sh.hidden, sh.inter, 500 + l, &bytes), NULL, h, x, sh.hidden, sh.inter, 1, 0};
    }
    hp[np - 1] = {weights(sh.vocab, sh.hidden, 900, &bytes), NULL, x, logits, sh.vocab, sh.hidden, 0, 0};
    for (int i = 0; i < np; i++) {
        hp[i].chunk = pick_chunk(hp[i].cols, hp[i].w1 != NULL, slot_bytes);
        int t = (hp[i].cols + 255) / 256 * 256;
        if (t > maxcols)
            maxcols = t;
    }
    phase *dp;
    CK(cudaMalloc(&dp, np * sizeof(phase)));
    CK(cudaMemcpy(dp, hp, np * sizeof(phase), cudaMemcpyHostToDevice));
    unsigned *gbar;
    CK(cudaMalloc(&gbar, 64));
    CK(cudaMemset(gbar, 0, 64));
    int slots = ring_kb * 1024 / PW / slot_bytes;
    if (slots > P_MAX_SLOTS)
        slots = P_MAX_SLOTS;
    size_t smem = (size_t)maxcols * 4 + PW * P_MAX_SLOTS * 8 + (size_t)PW * slots * slot_bytes;
    CK(cudaFuncSetAttribute(k_chain, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    printf("%s: %d matrices, %.1f MB, slots %d x %d KB per warp, smem %zu KB, floor %.1f us\n",
           sh.name, np, bytes / 1e6, slots, slot_kb, smem / 1024, bytes / bw * 1e6);

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    float *res[2];
    unsigned long long *dtrace;
    CK(cudaMalloc(&dtrace, (size_t)np * sms * 6 * 8));
    CK(cudaMemset(dtrace, 0, (size_t)np * sms * 6 * 8));
    for (int mode = 0; mode < 2; mode++) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        CK(cudaMemcpyAsync(x, x0, sh.hidden * 4, cudaMemcpyDeviceToDevice, st));
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(sms);
        cfg.blockDim = dim3(PT);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = st;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        if (mode == 0) {
            for (int i = 0; i < np; i++)
                CK(cudaLaunchKernelEx(&cfg, k_chain, (const phase *)dp, i, i + 1, gbar, slots,
                                      slot_bytes, maxcols, (unsigned long long *)NULL, how, ahead));
        } else {
            CK(cudaLaunchKernelEx(&cfg, k_chain, (const phase *)dp, 0, np, gbar, slots,
                                  slot_bytes, maxcols, dtrace, how, ahead));
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        res[mode] = (float *)malloc((size_t)sh.vocab * 4);
        CK(cudaMemcpy(res[mode], logits, (size_t)sh.vocab * 4, cudaMemcpyDeviceToHost));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaEventRecord(e0, st));
        for (int r = 0; r < reps; r++)
            CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        double us = ms * 1e3 / reps;
        printf("  %-8s %9.1f us per step  %5.1f %% of floor  (%.1f us per matrix)\n",
               mode ? "persist" : "launch", us, 100.0 * bytes / bw / (us * 1e-6), us / np);
        if (mode == 1) { /* the last replay's trace: barrier, staging, rows (us, mean) */
            size_t nt = (size_t)np * sms * 6;
            unsigned long long *t = (unsigned long long *)malloc(nt * 8);
            CK(cudaMemcpy(t, dtrace, nt * 8, cudaMemcpyDeviceToHost));
            /* per matrix: last arrival at the barrier before it (A), last
             * release (R), mean release - last arrival, mean staging, mean
             * and max rows (warp 0), and the next last arrival */
            double sb = 0, ss = 0, sr = 0, smr = 0, sw = 0, fw = 0, cw = 0;
            long nw = 0;
            for (int i = 1; i + 1 < np; i++) {
                unsigned long long A = 0, An = 0, R = 0;
                double mr = 0, st = 0, rw = 0, rmax = 0;
                for (int b = 0; b < sms; b++) {
                    unsigned long long *q = t + ((size_t)i * sms + b) * 6;
                    unsigned long long *qn = t + ((size_t)(i + 1) * sms + b) * 6;
                    if (q[0] > A) A = q[0];
                    if (qn[0] > An) An = qn[0];
                    if (q[1] > R) R = q[1];
                }
                for (int b = 0; b < sms; b++) {
                    unsigned long long *q = t + ((size_t)i * sms + b) * 6;
                    if (q[4] >= q[2] && q[5] >= q[4]) { /* warp 0 had rows */
                        fw += (double)(q[4] - q[2]);
                        cw += (double)(q[5] - q[4]);
                        nw++;
                    }
                    mr += (double)(q[1] - A);
                    st += (double)(q[2] - q[1]);
                    rw += (double)(q[3] - q[2]);
                    if ((double)(q[3] - q[2]) > rmax) rmax = (double)(q[3] - q[2]);
                }
                sb += mr / sms; ss += st / sms; sr += rw / sms; smr += rmax;
                sw += (double)(An - A);
            }
            int n = np - 2;
            printf("  per matrix (us): last arrival -> release %.2f (mean block), staging %.2f, "
                   "rows %.2f mean / %.2f max, last arrival to last arrival %.2f\n",
                   sb / 1e3 / n, ss / 1e3 / n, sr / 1e3 / n, smr / 1e3 / n, sw / 1e3 / n);
            printf("  warp 0: staged -> first weights %.2f us, first weights -> last row summed %.2f us\n",
                   nw ? fw / 1e3 / nw : 0.0, nw ? cw / 1e3 / nw : 0.0);
            free(t);
        }
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    int same = memcmp(res[0], res[1], (size_t)sh.vocab * 4) == 0;
    printf("  logits equal bit for bit: %s (logit[0] %g)\n", same ? "yes" : "NO", res[0][0]);
    if (!same)
        exit(1);
    for (int i = 0; i < np; i++) {
        cudaFree((void *)hp[i].w0);
        if (hp[i].w1)
            cudaFree((void *)hp[i].w1);
    }
    free(hp);
    free(res[0]);
    free(res[1]);
    cudaFree(dp);
    cudaFree(dtrace);
    cudaFree(gbar);
    cudaFree(x);
    cudaFree(x0);
    cudaFree(qkv);
    cudaFree(h);
    cudaFree(logits);
    cudaStreamDestroy(st);
}

int main(int argc, char **argv)
{
    double bw = 4.26e12;
    int reps = 20, slot_kb = 4, ring_kb = 160, layers = 0, how = 0, ahead = 0;
    const char *which = "both";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bw") && i + 1 < argc)
            bw = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--slot") && i + 1 < argc)
            slot_kb = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ring") && i + 1 < argc)
            ring_kb = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc)
            which = argv[++i];
        else if (!strcmp(argv[i], "--ahead") && i + 1 < argc)
            ahead = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--barrier") && i + 1 < argc)
            how = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_persist [--bw B] [--reps N] [--slot KB] [--ring KB] "
                            "[--shape 0.6b|8b|tiny|both] [--layers N] [--barrier 0|1] "
                            "[--ahead N]\n");
            return 2;
        }
    }
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    shape small = {"Qwen3-0.6B", 28, 1024, 2048, 1024, 3072, 151936};
    shape big = {"Llama-3.1-8B", 32, 4096, 4096, 1024, 14336, 128256};
    if (layers > 0)
        small.layers = big.layers = layers;
    shape tiny = {"tiny", 28, 256, 256, 128, 512, 2048};
    if (!strcmp(which, "tiny"))
        run_shape(tiny, bw, reps, slot_kb, ring_kb, sms, how, ahead);
    else if (strcmp(which, "8b"))
        run_shape(small, bw, reps, slot_kb, ring_kb, sms, how, ahead);
    if (strcmp(which, "0.6b") && strcmp(which, "tiny"))
        run_shape(big, bw, reps, slot_kb, ring_kb, sms, how, ahead);
    return 0;
}
