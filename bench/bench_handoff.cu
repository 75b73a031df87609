/* bench_handoff.cu - what one hand-off between blocks costs by itself: a
 * value written by one block as a (value, tag) pair in one 8-byte store
 * and polled by another until it carries the tag, the primitive every
 * exchange of the one-launch decode step is made of (decode_mega.cu).
 *
 * Why: the thirty-ninth pass's profile of that kernel (docs/benchmarks.md)
 * put most of its warps' time in polls for values other blocks had not
 * sent yet, and a 0.6B layer has six such exchanges. This measures the
 * primitive on an otherwise idle GPU, with no work between exchanges, so
 * the layer's floor under this design is known:
 *
 *   ping-pong: two blocks on two SMs hand one value back and forth; a
 *     round is two hand-offs.
 *   all-to-all n: one block a multiprocessor (a cooperative launch); each
 *     round every block sends its share of n tagged values (n / blocks,
 *     as a GEMV phase's rows), then reads all n by 16-byte loads (two
 *     pairs), 1, 2 or 4 in flight a thread (mg_recv_ss keeps 2), or the
 *     first polled until it is there and then 7 more at once; rounds
 *     alternate between two buffers. A round is one exchange of a layer.
 *
 *   loaded: the all-to-all again while a ninth warp of every block
 *     streams a 4 GB buffer into a ring of 16 KB shared-memory slots by
 *     bulk copies, 1 or 4 in flight (the one-launch step's copying warp,
 *     and the staged GEMV's ring, do this beside the exchanges): how much
 *     an exchange slows when the weights stream at the same time.
 *
 * Times come from %globaltimer inside the kernel (block 0), so no launch
 * is counted.
 *
 * bench_handoff [--rounds 2000]
 */
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "bench_cuda.cuh"

#define THREADS 256
#define LD_SLOT (16 * 1024) /* bytes of one ring slot of the streaming warp */
#define LD_NS 4             /* its slots */

static __device__ __forceinline__ unsigned ld_tag(const uint2 *p)
{
    unsigned t;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(t) : "l"((const char *)p + 4)
                 : "memory");
    return t;
}

/* Blocks 0 and `other` hand a value back and forth `rounds` times (slot 0
 * carries it out, slot 1 back); out[0] = ns a round. */
__global__ void k_pingpong(uint2 *slot, int other, int rounds, unsigned base, double *out)
{
    if (threadIdx.x != 0 || (blockIdx.x != 0 && (int)blockIdx.x != other))
        return;
    const bool a = blockIdx.x == 0;
    const unsigned long long t0 = cuk_globaltimer();
    for (int r = 1; r <= rounds; r++) {
        const unsigned tag = base + (unsigned)r;
        if (a) {
            cuk_tag_send(slot, (float)r, tag);
            while (ld_tag(slot + 1) != tag)
                ;
        } else {
            while (ld_tag(slot) != tag)
                ;
            cuk_tag_send(slot + 1, (float)r, tag);
        }
    }
    if (a)
        out[0] = (double)(cuk_globaltimer() - t0) / rounds;
}

/* Every block sends its n / gridDim.x of n values and reads all n, each
 * round, RB 16-byte loads (two pairs) in flight a thread; BURST: the first
 * of them polled until it carries the round's tag before the others are
 * asked for. LOAD > 0: warp THREADS / 32 streams src (src_bytes, a
 * multiple of gridDim.x slots) into LOAD slots of the ring meanwhile, and
 * adds the bytes it brought to *copied. out[0] = ns a round (block 0),
 * out[1] = how many values block 0 read that were not their round's (0). */
template <int RB, bool BURST, int LOAD>
__global__ void __launch_bounds__(THREADS + 32)
    k_all(uint2 *buf, int n, int rounds, unsigned base, double *out, const char *src,
          size_t src_bytes, unsigned long long *copied)
{
    __shared__ unsigned sink[THREADS];
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ uint64_t bar[LD_NS];
    __shared__ volatile int stop;
    if (threadIdx.x == 0) {
        stop = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        for (int s = 0; s < LD_NS; s++)
            cuk_mbar_init(&bar[s], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
    }
    __syncthreads();
    const int nb = gridDim.x, per = (n + nb - 1) / nb;
    if (threadIdx.x >= THREADS) { /* the streaming warp (LOAD > 0 only) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if constexpr (LOAD > 0) {
            if (threadIdx.x == THREADS) {
                const uint64_t pol = cuk_l2_evict_first();
                const size_t step = (size_t)nb * LD_SLOT;
                size_t off = (size_t)blockIdx.x * LD_SLOT;
                unsigned long long k = 0;
                while (!stop) {
                    const int s = (int)(k % LOAD);
                    if (k >= (unsigned long long)LOAD)
                        cuk_mbar_wait(&bar[s], (unsigned)((k / LOAD - 1) & 1));
                    cuk_mbar_expect(&bar[s], LD_SLOT);
                    cuk_bulk_copy(ring + (size_t)s * LD_SLOT, src + off, LD_SLOT, &bar[s], pol);
                    off += step;
                    if (off + LD_SLOT > src_bytes)
                        off = (size_t)blockIdx.x * LD_SLOT;
                    k++;
                }
                /* the last copies land before the block ends */
                for (unsigned long long j = k > (unsigned long long)LOAD ? k - LOAD : 0; j < k; j++)
                    cuk_mbar_wait(&bar[j % LOAD], (unsigned)((j / LOAD) & 1));
                atomicAdd(copied, k * LD_SLOT);
            }
            __syncwarp(); /* lane 0 back with the others before the block meets */
        }
#endif
        __syncthreads();
        return;
    }
    unsigned bad = 0;
    const unsigned long long t0 = cuk_globaltimer();
    for (int r = 1; r <= rounds; r++) {
        const unsigned tag = base + (unsigned)r;
        uint2 *b = buf + (size_t)(r & 1) * n;
        for (int i = blockIdx.x * per + threadIdx.x; i < min(n, (int)(blockIdx.x + 1) * per);
             i += THREADS)
            cuk_tag_send(b + i, (float)r, tag);
        for (int i0 = 2 * threadIdx.x; i0 < n; i0 += 2 * THREADS * RB) {
            uint4 v[RB];
            if (BURST) {
                v[0] = cuk_tag_ld2(b + i0);
                while (v[0].y != tag || v[0].w != tag)
                    v[0] = cuk_tag_ld2(b + i0);
            }
#pragma unroll
            for (int j = BURST ? 1 : 0; j < RB; j++)
                if (i0 + j * 2 * THREADS < n)
                    v[j] = cuk_tag_ld2(b + i0 + j * 2 * THREADS);
#pragma unroll
            for (int j = 0; j < RB; j++)
                if (i0 + j * 2 * THREADS < n) {
                    const uint2 *p = b + i0 + j * 2 * THREADS;
                    while (v[j].y != tag || v[j].w != tag)
                        v[j] = cuk_tag_ld2(p);
                    bad += (__uint_as_float(v[j].x) != (float)r) +
                           (__uint_as_float(v[j].z) != (float)r);
                }
        }
        /* as a layer's warps meet before using what they read (the
         * multiplying warps only: the streaming warp never meets them) */
        asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory");
    }
    const unsigned long long t1 = cuk_globaltimer();
    sink[threadIdx.x] = bad;
    if (threadIdx.x == 0)
        stop = 1;
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        double s = 0.0;
        for (int t = 0; t < THREADS; t++)
            s += sink[t];
        out[0] = (double)(t1 - t0) / rounds;
        out[1] = s;
    }
}

/* What run_all streams while it exchanges (LOAD > 0). */
struct load_src {
    const char *p;
    size_t bytes;
    unsigned long long *copied; /* device counter */
};

/* ns a round of k_all<RB, BURST, LOAD> on one block a multiprocessor;
 * *bad: its out[1]; *gbs: with LOAD, the streaming warps' GB/s over the
 * rounds (their bytes over block 0's time). */
template <int RB, bool BURST, int LOAD = 0>
static double run_all(int nsm, uint2 *buf, int n, int rounds, unsigned *base, double *dout,
                      double *bad, const struct load_src *ld = nullptr, double *gbs = nullptr)
{
    const char *src = ld ? ld->p : nullptr;
    size_t src_bytes = ld ? ld->bytes : 0;
    unsigned long long *copied = ld ? ld->copied : nullptr;
    const int smem = LOAD * LD_SLOT;
    CK(cudaFuncSetAttribute(k_all<RB, BURST, LOAD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            smem));
    if (copied)
        CK(cudaMemset(copied, 0, sizeof *copied));
    void *args[] = {&buf, &n, &rounds, base, &dout, &src, &src_bytes, &copied};
    CK(cudaLaunchCooperativeKernel((const void *)k_all<RB, BURST, LOAD>, dim3(nsm),
                                   dim3(THREADS + (LOAD > 0 ? 32 : 0)), args, smem, 0));
    CK(cudaDeviceSynchronize());
    double h[2];
    CK(cudaMemcpy(h, dout, sizeof h, cudaMemcpyDeviceToHost));
    *base += (unsigned)rounds + 1;
    *bad = h[1];
    if (copied && gbs) {
        unsigned long long c = 0;
        CK(cudaMemcpy(&c, copied, sizeof c, cudaMemcpyDeviceToHost));
        *gbs = (double)c / (h[0] * rounds); /* bytes per ns = GB/s */
    }
    return h[0];
}

int main(int argc, char **argv)
{
    int rounds = 2000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_handoff [--rounds N]\n");
            return 2;
        }
    }
    if (rounds < 1) {
        fprintf(stderr, "bench_handoff: --rounds must be at least 1\n");
        return 2;
    }
    int dev = 0, nsm = 0, coop = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
    if (!coop) {
        fprintf(stderr, "bench_handoff: the device has no cooperative launches\n");
        return 1;
    }
    const int nmax = 8192;
    uint2 *buf;
    double *dout;
    CK(cudaMalloc(&buf, sizeof(uint2) * 2 * nmax));
    CK(cudaMemset(buf, 0, sizeof(uint2) * 2 * nmax));
    CK(cudaMalloc(&dout, sizeof(double) * 2));
    unsigned base = 1;
    printf("bench_handoff: %d SMs, %d rounds, no work between hand-offs\n", nsm, rounds);
    for (int other = 1; other < nsm; other *= 4) {
        k_pingpong<<<nsm, 32>>>(buf, other, rounds, base, dout);
        CK(cudaDeviceSynchronize());
        base += (unsigned)rounds + 1;
        double ns;
        CK(cudaMemcpy(&ns, dout, sizeof ns, cudaMemcpyDeviceToHost));
        printf("ping-pong blocks 0 and %3d: %.3f us a hand-off\n", other, ns / 2000.0);
    }
    static const int ns_[] = {256, 1024, 2048, 3072, 4096};
    for (size_t k = 0; k < sizeof ns_ / sizeof ns_[0]; k++) {
        const int n = ns_[k];
        double s1, s2, s4, sb;
        const double t1 = run_all<1, false>(nsm, buf, n, rounds, &base, dout, &s1);
        const double t2 = run_all<2, false>(nsm, buf, n, rounds, &base, dout, &s2);
        const double t4 = run_all<4, false>(nsm, buf, n, rounds, &base, dout, &s4);
        const double tb = run_all<8, true>(nsm, buf, n, rounds, &base, dout, &sb);
        const bool ok = s1 == 0 && s2 == 0 && s4 == 0 && sb == 0; /* every value its round's */
        printf("all-to-all n %4d: %.3f / %.3f / %.3f us a round (1 / 2 / 4 loads in flight), "
               "%.3f the first pair polled, then 7 more at once%s\n",
               n, t1 / 1000.0, t2 / 1000.0, t4 / 1000.0, tb / 1000.0, ok ? "" : "  VALUES WRONG");
    }
    /* the same exchanges with every block's ninth warp streaming 4 GB
     * (weights-like: read once, evict-first) by bulk copies */
    struct load_src ld;
    ld.bytes = (size_t)(((4ull << 30) / ((size_t)nsm * LD_SLOT)) * nsm * LD_SLOT);
    CK(cudaMalloc((void **)&ld.p, ld.bytes));
    CK(cudaMemset((void *)ld.p, 0, ld.bytes));
    CK(cudaMalloc(&ld.copied, sizeof *ld.copied));
    printf("loaded: every block also streams by 16 KB bulk copies (2 loads in flight a "
           "thread, as the kernel)\n");
    static const int nl_[] = {1024, 2048, 3072};
    for (size_t k = 0; k < sizeof nl_ / sizeof nl_[0]; k++) {
        const int n = nl_[k];
        double s0, s1, s4, g1 = 0, g4 = 0;
        const double t0 = run_all<2, false>(nsm, buf, n, rounds, &base, dout, &s0);
        const double t1 = run_all<2, false, 1>(nsm, buf, n, rounds, &base, dout, &s1, &ld, &g1);
        const double t4 = run_all<2, false, 4>(nsm, buf, n, rounds, &base, dout, &s4, &ld, &g4);
        printf("all-to-all n %4d: %.3f us idle / %.3f with 1 copy in flight an SM (%.0f GB/s) "
               "/ %.3f with 4 (%.0f GB/s)%s\n",
               n, t0 / 1000.0, t1 / 1000.0, g1, t4 / 1000.0, g4,
               s0 == 0 && s1 == 0 && s4 == 0 ? "" : "  VALUES WRONG");
    }
    CK(cudaFree((void *)ld.p));
    CK(cudaFree(ld.copied));
    CK(cudaFree(buf));
    CK(cudaFree(dout));
    return 0;
}
