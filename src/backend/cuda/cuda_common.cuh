/* cuda_common.cuh - device helpers shared by the CUDA kernels: exact
 * f16/bf16 widening, weight element loads for every dtype, warp sums and
 * the paged-KV address of a position. */
#ifndef CLLM_BACKEND_CUDA_COMMON_CUH
#define CLLM_BACKEND_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include <utility>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/quant_dq.cuh"
#include "model/tensor.h"

static __device__ __forceinline__ float cuk_bf16(uint16_t v)
{
    return __uint_as_float((uint32_t)v << 16);
}

static __device__ __forceinline__ float cuk_f16(uint16_t v)
{
    return __half2float(__ushort_as_half(v));
}

/* v rounded to nearest-even bf16 (bf16 != 0) or f16: the half copies of
 * activations a tensor-core product reads (k_to_half, the norms' and
 * SwiGLU's copies, the batched GEMV's staged x). */
static __device__ __forceinline__ uint16_t cuk_to_half(float v, int bf16)
{
    return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
}

/* Element (r, j) of a weight matrix widened to f32 (exact for every dtype
 * the backend uploads; any other reads as zero, and load_weights refuses
 * those). */
static __device__ __forceinline__ float cuk_load_weight(const struct cuk_weight *w, size_t r, int j)
{
    size_t i = r * (size_t)w->cols + j;
    switch (w->dtype) {
    case DT_F32: return ((const float *)w->data)[i];
    case DT_F16: return cuk_f16(((const uint16_t *)w->data)[i]);
    case DT_BF16: return cuk_bf16(((const uint16_t *)w->data)[i]);
    case DT_Q8_0: return cuk_f16(w->scales[i / Q8_0_BLOCK]) * (float)((const int8_t *)w->data)[i];
    default: { /* GGUF's low-bit blocks: the value's eight (slow; the embedding's rows) */
        float v[8];
        cuk_dq8_any(w->dtype, (const uint8_t *)w->data + r * cuk_q_row_bytes(w->dtype, w->cols),
                    j & ~7, v);
        return v[j & 7];
    }
    }
}

static __device__ __forceinline__ float cuk_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ double cuk_warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---- RMSNorm and SwiGLU arithmetic, shared by the plain kernels
 * (kernels.cu) and the launches that fuse them into a neighbour (gemv.cu's
 * input prologues, the q/k norm of RoPE + K/V store), so that fused and
 * plain launches give the same bits. The order in which a row's squares
 * are summed is the other half of that; see launch_rmsnorm in kernels.cu. */

/* The squares of a float4 summed in double (each square is exact). */
static __device__ __forceinline__ double cuk_rms_sq(float4 v)
{
    return (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
}

/* A block sum in two halves, for callers that sum several values with
 * one barrier: cuk_warp_part_d leaves each warp's sum of v in
 * part[warp]; after a barrier, cuk_parts_sum_d is the sum of the nw
 * warps' partials, in warp order, in whichever warp calls it. */
static __device__ __forceinline__ void cuk_warp_part_d(double v, double *part)
{
    v = cuk_warp_sum_d(v);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x / 32] = v;
}

static __device__ __forceinline__ double cuk_parts_sum_d(const double *part, int nw)
{
    const int lane = threadIdx.x & 31;
    return cuk_warp_sum_d(lane < nw ? part[lane] : 0.0);
}

/* The sum of every thread's v over the block (part: 32 doubles of shared
 * memory), the same in every thread: warp 0 sums the partials and
 * publishes the total, so part may be reused after the call. */
static __device__ __forceinline__ double cuk_block_sum_d(double v, double *part)
{
    cuk_warp_part_d(v, part);
    __syncthreads();
    if (threadIdx.x < 32) {
        v = cuk_parts_sum_d(part, blockDim.x / 32);
        if (threadIdx.x == 0)
            part[0] = v;
    }
    __syncthreads();
    return part[0];
}

/* 1 / rms of a row of dim elements whose squares sum to ss. */
static __device__ __forceinline__ float cuk_rms_inv(double ss, int dim, float eps)
{
    return 1.0f / sqrtf((float)(ss / dim) + eps);
}

/* One normalized element: weight w, input x, inv from cuk_rms_inv. */
static __device__ __forceinline__ float cuk_rms_scale(float w, float x, float inv)
{
    return w * (x * inv);
}

/* Whether cuk_warp_rms_inv sums x's squares by float4 (lane l: float4 l,
 * l + 32, ...) rather than by element (l, l + 32, ...): the two orders
 * differ in the last bits, so whoever repeats the sum repeats the choice. */
static __device__ __forceinline__ bool cuk_rms_vec(const float *x, const float *w, int dim)
{
    return dim % 128 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)w & 15) == 0;
}

/* 1 / rms of one head (dim <= 512 floats at x, weights w) for the calling
 * warp, with the squares summed in the order launch_rmsnorm gives rows of
 * dim <= 512: k_rmsnorm_warp_vec when dim is a multiple of 128 and x and w
 * are 16-byte aligned (out is x: normed in place), else k_rmsnorm_warp. */
static __device__ __forceinline__ float cuk_warp_rms_inv(const float *x, const float *w, int dim,
                                                         float eps, int lane)
{
    double ss = 0;
    if (cuk_rms_vec(x, w, dim)) {
        for (int i = lane; i < dim / 4; i += 32)
            ss += cuk_rms_sq(((const float4 *)x)[i]);
    } else {
        for (int i = lane; i < dim; i += 32)
            ss += (double)x[i] * x[i];
    }
    return cuk_rms_inv(cuk_warp_sum_d(ss), dim, eps);
}

/* silu(g) * u, as HF computes SwiGLU in f32. The _rn operations are never
 * contracted into an FMA with a neighbour (here: expf's last multiply), so
 * every kernel that inlines this gives the same bits. */
static __device__ __forceinline__ float cuk_silu_mul1(float g, float u)
{
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

/* The RoPE angle of position pos for frequency f, rounded in f32 as HF
 * computes it (pos * inv_freq), never contracted into cosf/sinf. */
static __device__ __forceinline__ float cuk_rope_angle(int pos, float f)
{
    return __fmul_rn((float)pos, f);
}

/* One RoPE rotation of the pair (x0, x1) by (cs, sn), every product
 * rounded on its own (no FMA contraction), so every kernel that rotates
 * gives the same bits whatever the compiler makes of its surroundings. */
static __device__ __forceinline__ void cuk_rope_rot(float x0, float x1, float cs, float sn,
                                                   float &ra, float &rb)
{
    ra = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
    rb = __fadd_rn(__fmul_rn(x1, cs), __fmul_rn(x0, sn));
}

/* The pair (x0, x1) of a head, normalized when norm (weights w0, w1,
 * 1/rms inv) and rotated by (cs, sn): what the RoPE kernels and the decode
 * attention kernel's fused RoPE compute, the same bits. cuk_norm_rope: the
 * same for the pair (x[a], x[b]) read from memory, weights nw (or none). */
static __device__ __forceinline__ void cuk_norm_rope_v(float x0, float x1, bool norm, float w0,
                                                      float w1, float inv, float cs, float sn,
                                                      float &ra, float &rb)
{
    if (norm) {
        x0 = cuk_rms_scale(w0, x0, inv);
        x1 = cuk_rms_scale(w1, x1, inv);
    }
    cuk_rope_rot(x0, x1, cs, sn, ra, rb);
}

static __device__ __forceinline__ void cuk_norm_rope(const float *x, const float *nw, float inv,
                                                    int a, int b, float cs, float sn, float &ra,
                                                    float &rb)
{
    cuk_norm_rope_v(x[a], x[b], nw != nullptr, nw ? nw[a] : 0.0f, nw ? nw[b] : 0.0f, inv, cs, sn,
                    ra, rb);
}

/* The key-split merge's weights for one row (merge_splits and
 * cluster_merge in attention_mma.cu, the staged GEMV's CUK_IN_SPLITS,
 * which must give the same bits): m[s] (base-2 maxima) become c[s] =
 * 2^(m[s] - max m), 0 for a split that saw no key of the row; returns the
 * sum of l[s] c[s] in split order. NMAX > 0: m and l hold at most NMAX
 * (n <= NMAX): loops of a constant count, which the compiler unrolls, so
 * arrays in registers stay there. */
template <int NMAX = 0>
static __device__ __forceinline__ float cuk_split_weights(float *m, const float *l, int n)
{
    const int hi = NMAX > 0 ? NMAX : n;
    float M = -INFINITY, L = 0.0f;
    for (int s = 0; s < hi; s++)
        if (s < n)
            M = fmaxf(M, m[s]);
    for (int s = 0; s < hi; s++)
        if (s < n) {
            const float ms = m[s], c = ms == -INFINITY ? 0.0f : exp2f(ms - M);
            m[s] = c;
            L = fmaf(l[s], c, L);
        }
    return L;
}

/* The one-thread form of cuk_last_block, for kernels whose thread 0
 * speaks for its block: the caller's writes made visible, then whether it
 * is the last of n arrivals at *cnt, which the last re-arms. */
static __device__ __forceinline__ bool cuk_last_arrival(unsigned *cnt, unsigned n)
{
    __threadfence();
    const bool last = atomicAdd(cnt, 1u) == n - 1;
    if (last)
        *cnt = 0;
    return last;
}

/* Whether the calling block is the last of n to get here on the counter
 * *cnt (split-K attention: the last split merges them all); the last one
 * re-arms *cnt for the next call, and every block's writes before the call
 * are visible to it. Every thread of the block calls it. */
static __device__ __forceinline__ bool cuk_last_block(unsigned *cnt, unsigned n)
{
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(cnt, 1u) == n - 1;
        if (last)
            *cnt = 0;
    }
    __syncthreads();
    const bool l = last;
    if (l)
        __threadfence();
    return l;
}

/* ---- Asynchronous 16-byte copies global -> shared (sm_80 cp.async):
 * no registers held while they fly, so a thread may have many out at
 * once. The attention tiles (attention_mma.cu) and the tensor-core GEMV's
 * staging of x (gemv_mma.cu) use them. */

/* 16 bytes, zero-filled when !ok (keys past the range: V rows must be
 * zeros, as 0 * garbage may be NaN). dst: a shared-memory address. */
static __device__ __forceinline__ void cuk_cp_async16(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0));
}

static __device__ __forceinline__ void cuk_cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* Until at most N of this thread's committed groups are still in flight. */
template <int N> static __device__ __forceinline__ void cuk_cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* The GPU's nanosecond clock, comparable across multiprocessors (the
 * measurement probes and traces, the benches). */
static __device__ __forceinline__ unsigned long long cuk_globaltimer()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* A value handed to other blocks of a running grid as (value, tag) in one
 * 8-byte store (single-copy atomic): a reader polling the pair has the
 * value it waits for once the pair carries its tag (decode_mega.cu's
 * exchanges, bench/bench_handoff.cu). */
static __device__ __forceinline__ void cuk_tag_send(uint2 *dst, float v, unsigned tag)
{
    asm volatile("st.relaxed.gpu.global.v2.u32 [%0], {%1, %2};" ::"l"(dst),
                 "r"(__float_as_uint(v)), "r"(tag)
                 : "memory");
}

/* Two tagged pairs (16 bytes, one access), read at the GPU's coherence
 * point, never from L1. */
static __device__ __forceinline__ uint4 cuk_tag_ld2(const uint2 *p)
{
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

/* ---- Bulk asynchronous copies into shared memory, completing on an
 * mbarrier (Hopper, sm_90): what the staged kernels (gemv_staged.cu,
 * gemm_tc.cu) fill their rings with. A slot's barrier is armed by one
 * arrival that announces the bytes (cuk_mbar_expect), then its copies
 * complete it; readers wait on its phase parity. */
static __device__ __forceinline__ uint32_t cuk_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* An L2 policy for data read once per step (the weights): evicted first,
 * so that streaming gigabytes through the 50 MB L2 does not push out what
 * the next kernels read soon (activations, K/V, split partials, likely
 * kernel code). Measured in docs/benchmarks.md, ninth pass. */
static __device__ __forceinline__ uint64_t cuk_l2_evict_first()
{
    uint64_t pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    /* not volatile: the same value every time, so the compiler may make it
     * once for all the loads of a kernel */
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
    return pol;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* A barrier whose phase completes after `count` arrivals (and the bytes
 * announced with them). */
static __device__ __forceinline__ void cuk_mbar_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(cuk_smem_addr(bar)), "r"(count)
                 : "memory");
}

/* One arrival on bar, announcing the bytes its copies bring. */
static __device__ __forceinline__ void cuk_mbar_expect(uint64_t *bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                     cuk_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

/* One plain arrival (a reader saying it is done with the slot). */
static __device__ __forceinline__ void cuk_mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(cuk_smem_addr(bar)) : "memory");
}

/* pol: an L2 cache policy (cuk_l2_evict_first) */
static __device__ __forceinline__ void cuk_bulk_copy(void *dst, const void *src, unsigned bytes,
                                                     uint64_t *bar, uint64_t pol)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
                 "[%0], [%1], %2, [%3], %4;" ::"r"(cuk_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(cuk_smem_addr(bar)), "l"(pol)
                 : "memory");
}

/* Whether bar's phase of this parity has completed, without waiting. */
static __device__ __forceinline__ bool cuk_mbar_done(uint64_t *bar, unsigned parity)
{
    uint32_t done;
    asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; "
                 "selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(cuk_smem_addr(bar)), "r"(parity)
                 : "memory");
    return done;
}

static __device__ __forceinline__ void cuk_mbar_wait(uint64_t *bar, unsigned parity)
{
    uint32_t done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                     "selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(cuk_smem_addr(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}
#endif

/* ---- Tensor-core fragments (mma.sync m16n8k16), shared by the attention
 * kernels (attention_mma.cu) and the batched GEMM (gemm_tc.cu). */

/* D += A B: A 16x16 (row), B 16x8 (col), bf16 in (f16 with F16), f32
 * accumulators. */
template <bool F16 = false>
static __device__ __forceinline__ void cuk_mma16816(float (&d)[4], const uint32_t (&a)[4],
                                                    uint32_t b0, uint32_t b1)
{
    if (F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four (two) 8x8 b16 matrices from shared memory at addr (a shared-window
 * address), lanes 0-7 giving the first one's row addresses, 8-15 the
 * second's, and so on. */
static __device__ __forceinline__ void cuk_ldsm_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

static __device__ __forceinline__ void cuk_ldsm_x2(uint32_t (&r)[2], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
}

/* K/V cache elements: T is float (f32 pool) or uint16_t (bf16 pool);
 * stores round to nearest even, loads widen exactly. */
static __device__ __forceinline__ float kv_ld(const float *p, size_t i) { return p[i]; }
static __device__ __forceinline__ float kv_ld(const uint16_t *p, size_t i) { return cuk_bf16(p[i]); }
static __device__ __forceinline__ void kv_st(float *p, size_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void kv_st(uint16_t *p, size_t i, float v)
{
    p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

/* Element offset of the row of position pos, KV head h, layer g->layer in
 * the K (or V) pool. The CUDA backend lays a pool out as [layer][KV head]
 * [pool block][position in the block][head_dim]: a head's keys of one pool
 * block are one run of rows, and the runs of consecutive pool blocks
 * adjoin, so the decode attention kernel reads a tile of keys with one bulk
 * copy per run of adjacent blocks instead of 16-byte loads (bench_kvread on
 * the H200, one layer at 32K: 1.95 TB/s by loads, 3.1-4.0 by such copies).
 * cuk_kv_head0: where KV head h's rows of layer g->layer start (pool block
 * 0, position 0); pool block b's follow at b * block_size rows. */
static __device__ __forceinline__ size_t cuk_kv_head0(const struct cuk_attn *g, int h)
{
    return ((size_t)g->layer * g->n_kv_heads + h) * g->pool_blocks * g->block_size *
           (size_t)g->head_dim;
}

static __device__ __forceinline__ size_t cuk_kv_row(const struct cuk_attn *g, const int *table,
                                                    int pos, int h)
{
    const size_t blk = (size_t)table[pos / g->block_size];
    return cuk_kv_head0(g, h) + (blk * g->block_size + pos % g->block_size) * (size_t)g->head_dim;
}

/* Where element d of position pos's row sits in the row: a bf16 pool with
 * head_dim a multiple of 64 (kv_swz) keeps 16-byte chunk c at chunk
 * c ^ (pos & 7), the order in which the tensor-core kernels' tiles hold it
 * in shared memory (tile_addr in attention_mma.cu), so that rows copied
 * as they are land ready for ldmatrix without bank conflicts. */
static __device__ __forceinline__ int cuk_kv_col(const struct cuk_attn *g, int pos, int d)
{
    return g->kv_swz ? (((d >> 3) ^ (pos & 7)) << 3) | (d & 7) : d;
}

/* The short segment (cuk_bseg.tiled == 2) whose work this block of a
 * batch-step attention kernel does: blockIdx.x runs over the step's rows
 * (the row map at meta + g.pos0) and the block of a segment's first row
 * takes it, for blockIdx.z below its split count; *gs gets the segment's
 * geometry. NULL for every other block. */
static __device__ __forceinline__ const struct cuk_bseg *cuk_bseg_of_block(const int *meta,
                                                                         const struct cuk_attn &g,
                                                                         struct cuk_attn *gs)
{
    const struct cuk_bseg *sg = (const struct cuk_bseg *)meta + meta[g.pos0 + blockIdx.x];
    if (sg->tiled != 2 || (int)blockIdx.x != sg->row0 || (int)blockIdx.z >= sg->splits)
        return nullptr;
    *gs = g;
    gs->n = sg->n;
    gs->pos0 = sg->pos0;
    return sg;
}

/* A short segment's key-split partials (NULL without splits): its rows of
 * a [g.n rows][n_heads][max_splits] layout of hd + 2 floats each, so
 * segments never overlap (cuk_attention_short_ws_floats sizes it); and its
 * split counter for KV head kvh. */
static __device__ __forceinline__ float *cuk_bseg_ws(const struct cuk_bseg *sg,
                                                     const struct cuk_attn &g, float *ws,
                                                     int max_splits, int hd)
{
    return sg->splits > 1 ? ws + (size_t)sg->row0 * g.n_heads * max_splits * (hd + 2) : nullptr;
}

static __device__ __forceinline__ unsigned *cuk_bseg_cnt(const struct cuk_bseg *sg,
                                                         const struct cuk_attn &g, unsigned *cnt,
                                                         int kvh)
{
    return cnt + (size_t)sg->row0 * g.n_kv_heads + kvh;
}

/* Programmatic dependent launch (Hopper): with it on (cuk_set_pdl), each
 * kernel is launched while its predecessor in the stream still runs, so
 * launch latency and block start-up overlap the predecessor's tail. Every
 * kernel must begin with cuk_pdl_start(): it waits until the preceding
 * grid has completed and its writes are visible (a no-op when launched
 * without the attribute), then lets the next kernel launch. Waiting first,
 * in every thread, keeps stream order for all reads and writes. */
static __device__ __forceinline__ void cuk_pdl_start()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* cuk_pdl_start, or with hold its wait alone: the kernel then lets the
 * next one launch later, by cuk_pdl_release in every thread (the staged
 * GEMV of one token, once its x is staged: the invariant below holds). */
static __device__ __forceinline__ void cuk_pdl_enter(bool hold)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (!hold)
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#else
    (void)hold;
#endif
}

/* Lets the next kernel launch without waiting for the previous one: only
 * for a block that reads and writes nothing the previous kernel touches
 * and does not leave at once (a block that leaves counts as released).
 * The next kernel still launches only once every block has released or
 * left, so while one block of this grid waits in cuk_pdl_start, the
 * invariant that kernel relies on (its predecessor's predecessor has
 * completed) holds. */
static __device__ __forceinline__ void cuk_pdl_release()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Whether launches carry the programmatic-serialization attribute. */
int cuk_pdl_enabled(void);

/* k<<<grid, block, smem, s>>>(args...), with programmatic dependent launch
 * when enabled, and with the blocks grouped in thread-block clusters of
 * `cluster` when that is more than one block (Hopper): the blocks of a
 * cluster run at once on one GPC and may read each other's shared memory
 * (cuk_dsmem_ld) and meet at cuk_cluster_sync. */
template <typename... KArgs, typename... Args>
static inline cudaError_t cuk_launch_cluster(void (*k)(KArgs...), dim3 grid, dim3 block,
                                             size_t smem, cudaStream_t s, dim3 cluster,
                                             Args &&...args)
{
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    if (cuk_pdl_enabled()) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster.x * cluster.y * cluster.z > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = cluster.x;
        at[n].val.clusterDim.y = cluster.y;
        at[n++].val.clusterDim.z = cluster.z;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, k, std::forward<Args>(args)...);
}

template <typename... KArgs, typename... Args>
static inline cudaError_t cuk_launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                     cudaStream_t s, Args &&...args)
{
    return cuk_launch_cluster(k, grid, block, smem, s, dim3(1, 1, 1),
                              std::forward<Args>(args)...);
}

/* Every thread of every block of the cluster gets here before any goes
 * on; the writes before it (shared memory included) are visible to the
 * cluster after it. Called by all threads of a block, uniformly. */
static __device__ __forceinline__ void cuk_cluster_sync()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

/* cuk_cluster_sync without the release: a meeting that orders no memory
 * access (the caller's loads from other blocks are complete, their values
 * used), so no wait for its stores to be seen. */
static __device__ __forceinline__ void cuk_cluster_sync_relaxed()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\t"
                 "barrier.cluster.wait.aligned;" ::: "memory");
#endif
}

/* The shared-memory address a (of this block's window) in the block of
 * cluster rank `rank`, for cuk_dsmem_ld. */
static __device__ __forceinline__ uint32_t cuk_dsmem_addr(uint32_t a, int rank)
{
    uint32_t r = a;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
#endif
    return r;
}

static __device__ __forceinline__ float cuk_dsmem_ld(uint32_t a)
{
    float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
#endif
    return v;
}

/* Lets kernel (one instantiation) take smem bytes of dynamic shared memory
 * (above the default 48 KB a kernel must opt in) and, with max_carveout,
 * prefer all of the SM's unified memory as shared memory, on the current
 * device. Done once per size and device: setting it may wait for the
 * device, which would stall issuing every step. The caller keeps the record
 * (struct cuk_opted, a static per instantiation) of the largest size set up
 * on each device, since the setting is per device. */
#define CUK_MAX_DEVICES 64
struct cuk_opted {
    int smem[CUK_MAX_DEVICES];
};
template <typename K>
static inline cudaError_t cuk_smem_opt_in(K kernel, size_t smem, struct cuk_opted *opted,
                                          bool max_carveout = false)
{
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess)
        return err;
    bool known = dev >= 0 && dev < CUK_MAX_DEVICES; /* past it: set up every time */
    if (known && (int)smem <= opted->smem[dev])
        return cudaSuccess;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err == cudaSuccess && max_carveout)
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   (int)cudaSharedmemCarveoutMaxShared);
    if (err == cudaSuccess && known)
        opted->smem[dev] = (int)smem;
    return err;
}

#endif
