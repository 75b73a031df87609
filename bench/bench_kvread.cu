/* bench_kvread.cu - how fast one layer's keys can be read from a paged K/V
 * pool for a one-query decode step, by pool layout, with no arithmetic:
 * the bound the decode attention kernel (attention_mma.cu) works against at
 * long contexts, where ncu puts it at ~54 % of DRAM bandwidth.
 *
 * The grid is the kernel's: one block of 128 threads per (KV head, key
 * split), each thread reading 16-byte chunk t % (HD / 8) of keys
 * t / (HD / 8) + STEP u, a 64-key tile per trip, DEPTH tiles' loads issued
 * before any is used. Pool blocks of bs positions are placed by a table
 * (shuffled or in order), as a pool that has served many requests holds
 * them. Layouts of element (block, layer, position, head, d):
 *   pos:  [block][layer][position][head][d] (cllm's: a position's heads
 *         together, so one head's key is 256 B every kv_dim * 2 bytes);
 *   head: [block][layer][head][position][d] (a head's bs keys contiguous);
 *   seq:  each block's keys of its head as one contiguous run (the bound).
 * Each call reads one layer of `layers`, cycling, so L2 holds nothing of
 * the next call's bytes.
 *
 * --bulk NB reads the tiles as the staged GEMV reads its weights instead:
 * bulk asynchronous copies (one per key row, into rows padded to 272 bytes,
 * as ldmatrix would want them) completing on an mbarrier per tile, NB
 * tiles in flight, issued by one warp; the block waits for a tile, reads
 * it from shared memory and hands the buffer back. With --runs 1 each copy
 * takes a run of keys contiguous in the pool instead (the head layout: a
 * pool block's keys of one head, bs * 256 bytes; seq: the whole tile),
 * into unpadded rows (a pool that stores each row swizzled, as the
 * tiles' ldmatrix reads want it, would need no padding).
 *
 * Usage: bench_kvread [--ctx 32768] [--heads 8] [--hd 128] [--bs 16]
 *        [--splits 33] [--layers 28] [--reps 20] [--depth 1|2|4]
 *        [--bulk 0|2|4] [--runs 0|1] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "bench_cuda.cuh"

enum { LAYOUT_POS, LAYOUT_HEAD, LAYOUT_SEQ };

struct geo {
    int ctx, heads, hd, bs, layers, layer, splits;
};

static __device__ __forceinline__ size_t elem_of(const struct geo &g, int layout, int blk, int pos,
                                                 int head)
{
    const size_t kv_dim = (size_t)g.heads * g.hd;
    if (layout == LAYOUT_POS)
        return (((size_t)blk * g.layers + g.layer) * g.bs + pos) * kv_dim + (size_t)head * g.hd;
    return ((((size_t)blk * g.layers + g.layer) * g.heads + head) * g.bs + pos) * g.hd;
}

/* Element of key `key` of head `head` in the pool: through the table, or
 * (seq) in the head's one run of keys. */
static __device__ __forceinline__ size_t key_elem(const struct geo &g, int layout,
                                                  const int *table, int key, int head)
{
    if (layout == LAYOUT_SEQ)
        return ((size_t)g.layer * g.heads + head) * (size_t)g.ctx * g.hd + (size_t)key * g.hd;
    return elem_of(g, layout, table[key / g.bs], key % g.bs, head);
}

template <int DEPTH>
static __global__ void __launch_bounds__(128)
    k_read(const uint16_t *pool, const int *table, struct geo g, int layout, uint32_t *sink)
{
    const int nch = g.hd / 8, step = 128 / nch, c = threadIdx.x % nch, j0 = threadIdx.x / nch;
    const int head = blockIdx.x, sp = blockIdx.y;
    const int per = (g.ctx + g.splits - 1) / g.splits;
    const int k0 = sp * per, k1 = min(g.ctx, k0 + per);
    uint32_t acc = 0;
    for (int t0 = k0; t0 < k1; t0 += 64 * DEPTH) {
        uint4 v[DEPTH][8];
#pragma unroll
        for (int d = 0; d < DEPTH; d++)
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int key = t0 + 64 * d + j0 + u * step;
                v[d][u] = make_uint4(0, 0, 0, 0);
                if (u * step < 64 && key < k1)
                    v[d][u] = __ldcs((const uint4 *)(pool + key_elem(g, layout, table, key, head) +
                                                     (size_t)c * 8));
            }
#pragma unroll
        for (int d = 0; d < DEPTH; d++)
#pragma unroll
            for (int u = 0; u < 8; u++)
                acc ^= v[d][u].x ^ v[d][u].y ^ v[d][u].z ^ v[d][u].w;
    }
    if (acc == 0x12345678u) /* never, in practice: keeps the loads */
        sink[blockIdx.y * gridDim.x + blockIdx.x] = acc;
}

#define BULK_ROW 272 /* a key row's 256 bytes and 16 of padding */

template <int NB>
static __global__ void __launch_bounds__(128)
    k_read_bulk(const uint16_t *pool, const int *table, struct geo g, int layout, uint32_t *sink,
                int runs)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char sm[];
    uint64_t *bar = (uint64_t *)(sm + NB * 64 * BULK_ROW);
    const int head = blockIdx.x, sp = blockIdx.y, lane = threadIdx.x & 31;
    const int per = (g.ctx + g.splits - 1) / g.splits;
    const int k0 = sp * per, k1 = min(g.ctx, k0 + per), rowb = g.hd * 2;
    const int ntile = k1 > k0 ? (k1 - k0 + 63) / 64 : 0;
    const int stride = runs && layout != LAYOUT_POS ? rowb : BULK_ROW;
    const uint64_t pol = cuk_l2_evict_first();
    if (threadIdx.x == 0) {
        for (int b = 0; b < NB; b++)
            cuk_mbar_init(bar + b, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int t, int b) { /* warp 0 */
        const int t0 = k0 + t * 64, nk = min(64, k1 - t0);
        if (lane == 0)
            cuk_mbar_expect(bar + b, (unsigned)(nk * rowb));
        __syncwarp();
        if (runs && layout != LAYOUT_POS) { /* lane 0: one copy per contiguous run */
            if (lane == 0)
                for (int j = 0; j < nk;) {
                    const int key = t0 + j;
                    const int run = layout == LAYOUT_SEQ ? nk - j : min(nk - j, g.bs - key % g.bs);
                    cuk_bulk_copy(sm + (size_t)(b * 64 + j) * rowb,
                                  pool + key_elem(g, layout, table, key, head),
                                  (unsigned)(run * rowb), bar + b, pol);
                    j += run;
                }
            return;
        }
        for (int j = lane; j < nk; j += 32) {
            cuk_bulk_copy(sm + (size_t)(b * 64 + j) * BULK_ROW,
                          pool + key_elem(g, layout, table, t0 + j, head), (unsigned)rowb,
                          bar + b, pol);
        }
    };
    if (threadIdx.x < 32)
        for (int t = 0; t < NB && t < ntile; t++)
            issue(t, t);
    uint32_t acc = 0;
    for (int t = 0; t < ntile; t++) {
        const int b = t % NB;
        cuk_mbar_wait(bar + b, (unsigned)(t / NB) & 1u);
        const uint4 v = *(const uint4 *)(sm + (size_t)(b * 64 + threadIdx.x / 2) * stride +
                                         (threadIdx.x & 1) * 16);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
        __syncthreads();
        if (threadIdx.x < 32 && t + NB < ntile)
            issue(t + NB, b);
    }
    if (acc == 0x12345678u)
        sink[blockIdx.y * gridDim.x + blockIdx.x] = acc;
#else
    (void)pool, (void)table, (void)g, (void)layout, (void)sink;
#endif
}

int main(int argc, char **argv)
{
    struct geo g = {32768, 8, 128, 16, 28, 0, 33};
    int reps = 20, depth = 1, bulk = 0, runs = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--ctx")) g.ctx = v;
        else if (!strcmp(argv[i], "--heads")) g.heads = v;
        else if (!strcmp(argv[i], "--hd")) g.hd = v;
        else if (!strcmp(argv[i], "--bs")) g.bs = v;
        else if (!strcmp(argv[i], "--splits")) g.splits = v;
        else if (!strcmp(argv[i], "--layers")) g.layers = v;
        else if (!strcmp(argv[i], "--reps")) reps = v;
        else if (!strcmp(argv[i], "--depth")) depth = v;
        else if (!strcmp(argv[i], "--bulk")) bulk = v;
        else if (!strcmp(argv[i], "--runs")) runs = v;
        else {
            fprintf(stderr, "bench_kvread: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (g.ctx < 64 || g.heads < 1 || (g.hd != 64 && g.hd != 128) || g.bs < 1 || g.splits < 1 ||
        g.layers < 1 || reps < 1 || (depth != 1 && depth != 2 && depth != 4) ||
        (bulk != 0 && bulk != 2 && bulk != 4)) {
        fprintf(stderr, "bench_kvread: bad arguments\n");
        return 2;
    }
    const int nblk = (g.ctx + g.bs - 1) / g.bs;
    const size_t elems = (size_t)nblk * g.bs * g.layers * g.heads * g.hd;
    uint16_t *pool;
    int *table;
    uint32_t *sink;
    CK(cudaMalloc(&pool, elems * 2));
    CK(cudaMalloc(&table, nblk * sizeof(int)));
    CK(cudaMalloc(&sink, (size_t)g.heads * g.splits * 4));
    k_fill_bf16<<<1024, 256>>>(pool, elems, 7, 1.0f);
    CK(cudaGetLastError());
    int *perm = (int *)malloc(nblk * sizeof(int));
    const double bytes = (double)g.ctx * g.heads * g.hd * 2; /* one layer's keys */
    printf("ctx %d, %d heads of %d, pool blocks of %d, %d splits, %d layers cycled, %s %d: "
           "%.1f MB a call\n",
           g.ctx, g.heads, g.hd, g.bs, g.splits, g.layers,
           bulk ? runs ? "bulk copies of contiguous runs, tiles in flight"
                       : "bulk copies, tiles in flight"
                : "loads, tiles a trip",
           bulk ? bulk : depth, bytes / 1e6);
    const size_t bulk_smem = (size_t)(bulk ? bulk : 1) * 64 * BULK_ROW + 64;
    CK(cudaFuncSetAttribute(k_read_bulk<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)bulk_smem));
    CK(cudaFuncSetAttribute(k_read_bulk<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)bulk_smem));
    static const char *names[] = {"pos", "head", "seq"};
    for (int shuffled = 0; shuffled < 2; shuffled++) {
        for (int i = 0; i < nblk; i++)
            perm[i] = i;
        uint64_t r = 0x9e3779b97f4a7c15ull;
        for (int i = nblk - 1; shuffled && i > 0; i--) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            int j = (int)(r % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        CK(cudaMemcpy(table, perm, nblk * sizeof(int), cudaMemcpyHostToDevice));
        for (int layout = 0; layout < 3; layout++) {
            if (layout == LAYOUT_SEQ && shuffled)
                continue;
            double us = time_graph(5, reps, g.layers, [&](cudaStream_t st, int layer) {
                struct geo gl = g;
                gl.layer = layer;
                dim3 grid((unsigned)g.heads, (unsigned)g.splits);
                if (bulk == 4)
                    k_read_bulk<4><<<grid, 128, bulk_smem, st>>>(pool, table, gl, layout, sink,
                                                                   runs);
                else if (bulk == 2)
                    k_read_bulk<2><<<grid, 128, bulk_smem, st>>>(pool, table, gl, layout, sink,
                                                                   runs);
                else if (depth == 4)
                    k_read<4><<<grid, 128, 0, st>>>(pool, table, gl, layout, sink);
                else if (depth == 2)
                    k_read<2><<<grid, 128, 0, st>>>(pool, table, gl, layout, sink);
                else
                    k_read<1><<<grid, 128, 0, st>>>(pool, table, gl, layout, sink);
            });
            printf("%-5s %-9s %8.2f us  %7.0f GB/s\n", names[layout],
                   layout == LAYOUT_SEQ ? "" : shuffled ? "shuffled" : "in order", us,
                   bytes / us / 1e3);
        }
    }
    free(perm);
    CK(cudaFree(pool));
    CK(cudaFree(table));
    CK(cudaFree(sink));
    return 0;
}
