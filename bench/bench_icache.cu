/* bench_icache.cu - what a decode kernel pays to fetch its code after its
 * programmatic-dependent-launch wait, and whether running that code once
 * before the wait (a dry pass, results thrown away) takes the cost away.
 *
 * Why: the eleventh pass (docs/benchmarks.md) measured that straight-line
 * code after a decode kernel's griddepcontrol.wait costs ~0.15-0.2 us per
 * KB beyond its execution: the code is fetched again at each launch, while
 * the kernel is on the step's critical path. A kernel waits for its
 * predecessor anyway: if code it ran before the wait stayed cached until
 * after it, the post-wait code of the decode kernels (the attention's ~25
 * KB, a GEMV's 5-9 KB) would cost only its execution. This measures the
 * cache and that idea (docs/benchmarks.md, twenty-sixth pass: a ~32 KB
 * cache; the early run helps only small code and is not free).
 *
 * The chain: D distinct kernels (each its own code, the same shape),
 * launched L times over in a CUDA graph under programmatic dependent launch
 * as decode's layers are. Each kernel streams `mb` MB of its own part of a
 * buffer after its wait (a GEMV's weight read: while it streams, the next
 * kernel's dry pass can run) and, before that, NI rounds of straight-line
 * integer code; "dry first" runs the same code (the same instructions: one
 * loop, two passes) once before the wait too.
 *
 * bench_icache [--layers 28] [--mb 4] [--warps 8] [--replays 20]
 * Prints us per launch for each code size and kernel count: the code run
 * cold after the wait, run dry first, and looped (an eighth of the code,
 * the same instructions executed). */
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "bench_cuda.cuh"

#define THREADS 256

/* NI unrolled rounds of 8 independent multiply-xor chains; the constants
 * depend on K and the round, so no two kernels or rounds share code and
 * the compiler cannot fold rounds together. */
template <int K, int NI> static __device__ __forceinline__ void body(uint32_t *v)
{
#pragma unroll
    for (int i = 0; i < NI; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = (v[j] * (0x9E3779B1u + 2654435761u * (uint32_t)(i * 8 + j + 1) +
                            (uint32_t)K * 40503u)) ^
                   (v[j] >> ((i + j + K) % 13 + 3));
}

/* dry: 0 the code once after the wait; 1 once before and once after it;
 * 2 the same number of instructions after the wait as 0, but as NI / 8
 * rounds run 8 times (one eighth of the code to fetch). Only the block's
 * first `warps` warps run it. */
template <int K, int NI>
__global__ void __launch_bounds__(THREADS)
    k_chain(const float4 *w, size_t n4, uint32_t *sink, int dry, int warps)
{
    uint32_t v[8];
#pragma unroll
    for (int j = 0; j < 8; j++)
        v[j] = threadIdx.x * 77u + blockIdx.x * 131u + (uint32_t)j;
    /* The weight stream, after the wait (a GEMV's, whose ring refills
     * after it); its sum keeps the loads. The code runs before it. */
    float acc = 0.0f;
    const size_t t = blockIdx.x * (size_t)THREADS + threadIdx.x, stride = (size_t)gridDim.x * THREADS;
    auto stream = [&]() {
        for (size_t i = t; i < n4; i += stride) {
            float4 x = __ldcs(w + i);
            acc += x.x + x.y + x.z + x.w;
        }
    };
    const bool runs = (int)(threadIdx.x / 32) < warps;
    if (dry == 2) {
        cuk_pdl_start();
        if (runs)
#pragma unroll 1
            for (int r = 0; r < 8; r++)
                body<K, NI / 8>(v);
        stream();
    } else {
        /* pass 0 (dry only) before the wait, pass 1 after it: one loop, so
         * the same instruction addresses run both times */
        const int first = dry ? 0 : 1;
#pragma unroll 1
        for (int pass = first; pass < 2; pass++) {
            if (pass == 1)
                cuk_pdl_start();
            if (runs)
                body<K, NI>(v);
        }
        stream();
    }
    uint32_t h = 0;
#pragma unroll
    for (int j = 0; j < 8; j++)
        h ^= v[j];
    if (h == 0x9E3779B9u || acc == 1234.5f) /* practically never: keeps the work */
        sink[t & 1023] = h;
}

typedef void (*kfn)(const float4 *, size_t, uint32_t *, int, int);

template <int NI> static void kernels_of(kfn *k)
{
    k[0] = k_chain<0, NI>;
    k[1] = k_chain<1, NI>;
    k[2] = k_chain<2, NI>;
    k[3] = k_chain<3, NI>;
    k[4] = k_chain<4, NI>;
}

int main(int argc, char **argv)
{
    int layers = 28, replays = 20, warps = THREADS / 32;
    double mb = 4.0;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        double x = v ? strtod(v, &end) : 0;
        const bool num = v && end != v && !*end;
        if (!strcmp(a, "--layers") && num && x >= 1 && x <= 1000)
            layers = (int)x;
        else if (!strcmp(a, "--mb") && num && x >= 0 && x <= 64)
            mb = x;
        else if (!strcmp(a, "--warps") && num && x >= 0 && x <= THREADS / 32)
            warps = (int)x;
        else if (!strcmp(a, "--replays") && num && x >= 1 && x <= 10000)
            replays = (int)x;
        else {
            fprintf(stderr,
                    "bench_icache: %s%s%s: not an option with a value in range\n"
                    "usage: bench_icache [--layers 1..1000] [--mb 0..64] [--warps 0..%d] "
                    "[--replays 1..10000]\n",
                    a, v ? " " : "", v ? v : "", THREADS / 32);
            return 2;
        }
    }
    if (mb * 5 * layers > 16000) { /* each launch streams its own part */
        fprintf(stderr, "bench_icache: --mb %.1f x 5 kernels x --layers %d is %.1f GB; at most 16\n",
                mb, layers, mb * 5 * layers / 1000);
        return 2;
    }
    cuk_set_pdl(1); /* as decode launches: each kernel while its predecessor runs */
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const size_t n4_each = (size_t)(mb * 1e6 / 16), n4_all = n4_each * 5 * (size_t)layers;
    float4 *w;
    uint32_t *sink;
    CK(cudaMalloc(&w, (n4_all ? n4_all : 1) * 16));
    CK(cudaMalloc(&sink, 1024 * 4));
    if (n4_all)
        k_fill_f32<<<1024, 256>>>((float *)w, n4_all * 4, 7);
    CK(cudaDeviceSynchronize());

    kfn sets[5][5];
    const int sizes[5] = {0, 16, 32, 64, 128}; /* ~0.4 KB of code a round */
    kernels_of<0>(sets[0]);
    kernels_of<16>(sets[1]);
    kernels_of<32>(sets[2]);
    kernels_of<64>(sets[3]);
    kernels_of<128>(sets[4]);
    printf("bench_icache: %d SMs, %d layers, %.1f MB streamed a launch, %d warps of %d run "
           "the code; us a launch\n",
           sms, layers, mb, warps, THREADS / 32);
    printf("%-8s %-8s %10s %10s %10s\n", "rounds", "kernels", "cold", "dry first", "looped");
    for (int si = 0; si < 5; si++)
        for (int nk = 1; nk <= 5; nk += 4) {
            double us[3];
            for (int dry = 0; dry < 3; dry++) {
                const int reps = layers * nk;
                int idx = 0; /* the launch index: time_graph's copy stays 0 */
                us[dry] = time_graph(replays, reps, 1, [&](cudaStream_t s, int) {
                    const int kk = idx % nk;
                    const float4 *wk = w + (size_t)idx * n4_each;
                    CK(cuk_launch(sets[si][kk], dim3((unsigned)sms), dim3(THREADS), 0, s, wk,
                                  n4_each, sink, dry, warps));
                    idx++;
                });
            }
            printf("%-8d %-8d %10.2f %10.2f %10.2f\n", sizes[si], nk, us[0], us[1], us[2]);
        }
    CK(cudaFree(w));
    CK(cudaFree(sink));
    return 0;
}
