/* decode_mega.cu - every layer of a one-token decode step in one persistent
 * launch, for models small enough that a step is bound by the boundaries
 * between dependent kernels rather than by their bytes (Qwen3-0.6B: 28
 * layers of five launches, ~26 µs a layer against ~7 µs of weights).
 *
 * One block per SM (fewer when a GEMV has fewer row chunks than SMs), all
 * resident at once (a cooperative launch). A ninth warp streams the step's
 * weights, layer after layer, into a ring of shared-memory slots by bulk
 * copies; it never waits for an activation, so a phase's weights are in
 * shared memory before its input is. The eight multiplying warps go
 * through the phases of each layer:
 *
 *   q/k/v = rmsnorm(x) . Wqkv (+ bias)           rows dealt over blocks
 *   attention: q/k norm, RoPE, the new K/V row stored, key splits of
 *              (KV head, split) items, split 0 of a head merges
 *   x += att . Wo
 *   h = silu(rmsnorm(x) . Wgate) * (rmsnorm(x) . Wup)
 *   x += h . Wdown
 *
 * Blocks never meet at a barrier. Every value one block hands another
 * travels with a tag, (value, tag) in one 8-byte store, the tag naming
 * the step, layer and exchange; a reader polls each pair until it holds
 * the tag it wants. A fence and a counter would cost two more trips
 * through L2 per exchange. Reuse of a buffer is safe because every block
 * owns rows of every GEMV (the grid is at most the fewest chunks of a
 * job): a block cannot write a layer's value before every block has read
 * the last one, which the all-to-all exchanges in between order. The
 * residual stream alternates between two buffers (after o, after down).
 *
 * The arithmetic is the layer ops' (f32 sums of bf16 weights times f32
 * inputs, norms summed in double, the same RoPE, SwiGLU and bf16 K/V
 * rounding), in another order: results agree with the launch-per-op path
 * to float rounding, not to the bit. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_common.cuh"

#define MG_WARPS 8                 /* multiplying warps */
#define MG_CT (MG_WARPS * 32)      /* their threads */
#define MG_THREADS (MG_CT + 32)    /* and the copying warp */
#define MG_SLOT (16 * 1024)        /* bytes of one ring slot */
#define MG_NS_MAX 16
#define MG_NS_DEF 6                /* ring slots unless CLLM_CUDA_MEGA_SLOTS says */
#define MG_HD 128                  /* head_dim */
#define MG_GMAX 4                  /* query heads per KV head */
#define MG_SMAX 16                 /* key splits per KV head */
#define MG_PART (MG_HD + 2)        /* pairs of one split's partial: acc, m, l */
#define MG_KPS 56                  /* keys a split while that needs at most MG_SMAX splits */
#define MG_PRE 128                 /* most keys of a split fetched before the q/k/v projection */
#ifndef MG_RB /* -DMG_RB=N to measure another (x329: 1 a thread, 3.4 % slower) */
#define MG_RB 2                    /* loads of tagged pairs a thread keeps in flight */
#endif
#define MG_LOG2E 1.4426950408889634f
#ifndef MG_KB /* -DMG_KB=2 or 4 to measure another: less code (x442, not run) */
#define MG_KB 8                    /* keys a warp of mg_keys takes at once (at most 4 for 3-4 heads) */
#endif

/* The measurement record (cuk_mega.probe): for each layer l, phase p
 * (q/k/v, attention, o, gate/up, down) and block, MG_PROBE_K words: when
 * its input was in, its outputs sent, its rows began, its first batch's
 * chunks were in and its first batch done (ns since the block began), and
 * how many of the barriers it waited on (a chunk's, or a group's: see
 * mg_group) had not completed when warp 0 first looked. */
#define MG_PROBE_K 6
#define MG_PROBE_AT(l, p) (((size_t)(l) * 5 + (p)) * MG_PROBE_K * gridDim.x)
/* After it, the trace of the middle layer: per block, up to MG_TR_MAX
 * events of warp 0's lane 0, each (id, %globaltimer, clock) in 32 bits:
 * where the time of a phase goes, in cycles as well as nanoseconds. */
#define MG_TR_MAX CUK_MEGA_TR_MAX

/* Shared memory ahead of the inputs. */
struct mg_head {
    uint64_t full[MG_NS_MAX], empty[MG_NS_MAX];
    double part[32];
    /* layer 0's cache rows (elements) of the attention item's first
     * npre keys and, at MG_PRE, of the step's position: found in the block
     * table once a step, not once a layer (each lookup a trip to L2 on
     * the way to the next layer's norm) */
    unsigned long long krow[MG_PRE + 1];
};

/* Floats of the region the phases' inputs and the attention share. */
static __host__ __device__ int mg_vec_floats(int dim, int qd, int ffn, int group)
{
    int v = dim > qd ? dim : qd;
    v = v > ffn ? v : ffn;
    v = (v + 255) / 256 * 256; /* whole groups of mg_xi's layout */
    /* attention: q heads, new k and v, per-warp m and l, per-warp acc */
    int a = group * MG_HD + 2 * MG_HD + 2 * MG_WARPS * group + MG_WARPS * group * MG_HD;
    return v > a ? v : a;
}

/* Where each region starts in shared memory (128-byte aligned: float4
 * and bulk-copy targets): the inputs (vec), the residual stream as last
 * received (xr), the fetched K/V rows, the next norm's weights, the q/k
 * norm weights, the ring. */
#define MG_VEC_OFF ((sizeof(struct mg_head) + 127) / 128 * 128)
struct mg_layout {
    size_t xr, kvs, nrm, qkn, ring; /* byte offsets */
};
static __host__ __device__ mg_layout mg_layout_of(int dim, int qd, int ffn, int group, int npre)
{
    mg_layout o;
    o.xr = (MG_VEC_OFF + (size_t)mg_vec_floats(dim, qd, ffn, group) * 4 + 127) / 128 * 128;
    o.kvs = o.xr + ((size_t)dim * 4 + 127) / 128 * 128;
    o.nrm = o.kvs + (size_t)2 * npre * MG_HD * 2;
    o.qkn = o.nrm + ((size_t)dim * 4 + 127) / 128 * 128;
    o.ring = o.qkn + (size_t)2 * MG_HD * 4;
    return o;
}

extern "C" size_t cuk_mega_ws_floats(const struct cuk_mega *a)
{
    int qd = a->n_heads * MG_HD, kvd = a->g.n_kv_heads * MG_HD;
    int group = a->n_heads / a->g.n_kv_heads;
    size_t pairs = (size_t)qd * 2 + (size_t)kvd * 2 + (size_t)a->ffn + (size_t)a->dim * 2 +
                   (size_t)a->g.n_kv_heads * MG_SMAX * group * MG_PART;
    return pairs * 2;
}

/* Most rows of one GEMV job a warp multiplies together (a 0.6B block's
 * q/k/v rows are ~4 a warp, gate/up pairs ~3, o and down rows 1; a warp
 * short of them computes repeats). */
template <int J> struct mg_nr { /* cuk_mega_plan's too */
    static constexpr int v = J == 0 ? 4 : J == 2 ? 3 : 1;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MG_ARCH_OK 1
#else
#define MG_ARCH_OK 0
#endif

#if MG_ARCH_OK
/* The workspace of tagged pairs: q/k/v, attention output, SwiGLU output,
 * the residual after o and after down, the key splits' partials. */
struct mg_ws {
    uint2 *qkv, *att, *h, *xo, *xd, *part;
};
static __device__ __forceinline__ mg_ws mg_ws_of(const struct cuk_mega &a)
{
    const int qd = a.n_heads * MG_HD, kvd = a.g.n_kv_heads * MG_HD;
    mg_ws w;
    w.qkv = (uint2 *)a.ws;
    w.att = w.qkv + qd + 2 * kvd;
    w.h = w.att + qd;
    w.xo = w.h + a.ffn;
    w.xd = w.xo + a.dim;
    w.part = w.xd + a.dim;
    return w;
}

/* The trace's cursor: p NULL for every thread and layer not traced. */
struct mg_tr {
    unsigned *p;
    unsigned n;
};

/* An event: its id and two words, when and in which clock cycle it
 * happened (mg_ev), or a value in place of the time (mg_ev_val). */
static __device__ __forceinline__ void mg_ev_put(mg_tr &t, unsigned id, unsigned w1, unsigned w2)
{
    if (t.n < MG_TR_MAX) {
        unsigned *q = t.p + 3 * t.n;
        q[0] = id;
        q[1] = w1;
        q[2] = w2;
    }
    t.n++;
}

static __device__ __forceinline__ void mg_ev(mg_tr &t, unsigned id)
{
    if (t.p)
        mg_ev_put(t, id, (unsigned)cuk_globaltimer(), (unsigned)clock64());
}

static __device__ __forceinline__ void mg_ev_val(mg_tr &t, unsigned id, unsigned v)
{
    if (t.p)
        mg_ev_put(t, id, v, 0);
}

static __device__ __forceinline__ unsigned mg_smid()
{
    unsigned v;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
    return v;
}

static __device__ __forceinline__ void mg_stamp(unsigned *pr, int l, int p, int k,
                                                unsigned long long t0)
{
    if (pr && threadIdx.x == 0)
        pr[MG_PROBE_AT(l, p) + k * gridDim.x + blockIdx.x] = (unsigned)(cuk_globaltimer() - t0);
}

/* The eight multiplying warps meet (the copying warp goes its own way). */
static __device__ __forceinline__ void mg_sync()
{
    asm volatile("bar.sync 1, %0;" ::"n"(MG_CT) : "memory");
}

/* v, already loaded from p, reloaded until both its pairs carry tag. */
static __device__ __forceinline__ void mg_until(const uint2 *p, unsigned tag, uint4 &v, int nap)
{
    while (v.y != tag || v.w != tag) {
        if (nap) /* fewer polls in flight: the L2 serves the copies and stores */
            __nanosleep(nap);
        v = cuk_tag_ld2(p);
    }
}

/* Where a GEMV's input sits in shared memory: a warp's lane takes the 8
 * floats of one 16-byte weight load (group e = i / 8), and the two float4s
 * of a group lie 512 bytes apart, so that each float4 load of the warp
 * reads 512 contiguous bytes (in order, the float4s 32 bytes apart were
 * read with 2-way bank conflicts: 8 wavefronts a load instead of 4).
 * mg_xe: the first float4 of group e (the second is 32 float4s on);
 * mg_xi: float i. */
static __device__ __forceinline__ int mg_xe(int e)
{
    return (e >> 5) * 64 + (e & 31);
}

static __device__ __forceinline__ int mg_xi(int i)
{
    return ((mg_xe(i >> 3) + ((i >> 2) & 1) * 32) << 2) + (i & 3);
}

/* dst[0..n) = the values of n tagged pairs (n even; SW: at mg_xi(i)), by
 * the multiplying threads; returns the sum of the squares of the calling
 * thread's values.
 * A thread's loads go out together, MG_RB at a time: each is a trip to L2,
 * and one after another they were most of a phase's wait (x271). */
template <bool SW>
static __device__ __forceinline__ double mg_recv_ss(const uint2 *src, int n, unsigned tag,
                                                    float *dst, int nap)
{
    double ss = 0.0;
    for (int i0 = 2 * threadIdx.x; i0 < n; i0 += 2 * MG_CT * MG_RB) {
        uint4 v[MG_RB];
#pragma unroll
        for (int j = 0; j < MG_RB; j++)
            if (i0 + j * 2 * MG_CT < n)
                v[j] = cuk_tag_ld2(src + i0 + j * 2 * MG_CT);
#pragma unroll
        for (int j = 0; j < MG_RB; j++) {
            const int i = i0 + j * 2 * MG_CT;
            if (i < n) {
                mg_until(src + i, tag, v[j], nap);
                const float x0 = __uint_as_float(v[j].x), x1 = __uint_as_float(v[j].z);
                const int at = SW ? mg_xi(i) : i; /* SW: a GEMV's input */
                dst[at] = x0;
                dst[at + 1] = x1;
                ss += (double)x0 * x0 + (double)x1 * x1;
            }
        }
    }
    return ss;
}

/* The same into a GEMV's input (mg_xi's layout), the threads meeting
 * after. */
static __device__ __forceinline__ void mg_recv(const uint2 *src, int n, unsigned tag, float *dst,
                                               int nap)
{
    mg_recv_ss<true>(src, n, tag, dst, nap);
    mg_sync();
}

/* Chunks of a layer's four GEMV jobs (q/k/v, o, gate/up, down) are dealt
 * round-robin over the blocks, each job starting where the last ended so
 * that blocks short in one job are long in the next: job j of layer l
 * starts at block (l tot + pre[j]) mod nb. A block's cursor holds, per
 * job, its first chunk of the current layer, stepped without a division
 * (integer divisions were a tenth of a layer, x275). */
struct mg_deal {
    int c[4];
};

/* A place in the ring: a slot, and the parity its barriers complete with
 * on this pass over the ring. */
struct mg_ringpos {
    int slot;
    unsigned par;
};

/* The next slot; whether the ring wrapped. */
static __device__ __forceinline__ bool mg_ring_step(mg_ringpos &p, int ns)
{
    if (++p.slot < ns)
        return false;
    p.slot = 0;
    p.par ^= 1;
    return true;
}

static __device__ __forceinline__ mg_deal mg_deal_first(const struct cuk_mega &a)
{
    mg_deal d;
    const int nb = gridDim.x;
#pragma unroll
    for (int j = 0; j < 4; j++)
        d.c[j] = ((int)blockIdx.x - a.pre[j] % nb + nb) % nb;
    return d;
}

static __device__ __forceinline__ void mg_deal_next(const struct cuk_mega &a, mg_deal &d)
{
#pragma unroll
    for (int j = 0; j < 4; j++) {
        d.c[j] -= a.tm;
        d.c[j] += d.c[j] < 0 ? (int)gridDim.x : 0;
    }
}

/* The block's chunks of job j this layer: c0, c0 + nb, ... (m of them). */
static __device__ __forceinline__ void mg_mine(const struct cuk_mega &a, const mg_deal &d, int j,
                                               int &c0, int &m)
{
    c0 = d.c[j];
    m = a.mq[j] + (c0 < a.mr[j] ? 1 : 0);
}

/* Chunks of a block's m of a job that complete on one barrier: all m
 * when they are one of mg_gemv's batches (nb rows a warp, 1 << lk rows a
 * chunk), so that a warp waits once a job (x296: waiting on each landed
 * chunk cost ~0.1 us); else 1, since a job of several batches is bound
 * by the weights landing, and a group would hold its rows back until the
 * last of its chunks lands (x296: Qwen3-1.7B 5 % slower). */
static __device__ __forceinline__ int mg_group(int m, int nb, int lk)
{
    return m <= (MG_WARPS * nb) >> lk ? m : 1;
}

/* A warp past its job's next chunk (waited): the barrier waited on first
 * when the chunk leads a group (mg_group), then the next lead gs chunks
 * on. look: the wait is the batch's own (not a release's), so the probe
 * counts it late if not complete and the trace records it. */
static __device__ __forceinline__ void mg_pass(const struct cuk_mega &a, mg_head *hd,
                                               mg_ringpos &rp, int ns, int waited, int &lead,
                                               int gs, bool look, unsigned &late, mg_tr &tr,
                                               unsigned ev)
{
    if (waited == lead) {
        if (look && a.probe && threadIdx.x == 0)
            late += !cuk_mbar_done(&hd->full[rp.slot], rp.par);
        if (look)
            mg_ev(tr, ev);
        cuk_mbar_wait(&hd->full[rp.slot], rp.par);
        if (look)
            mg_ev(tr, ev + 1);
        lead += gs;
    }
    mg_ring_step(rp, ns);
}

/* The weights of chunk c of job j of layer L: up to two pieces of bytes
 * each (gate/up: the gate rows, then the same rows of up). */
static __device__ __forceinline__ int mg_src(const struct cuk_mega &a, const cuk_mega_layer &L,
                                             int j, int c, const void **src, unsigned &bytes)
{
    const int k = 1 << a.lk[j];
    const size_t r0 = (size_t)c * k;
    const int qd = a.n_heads * MG_HD, kvd = a.g.n_kv_heads * MG_HD;
    switch (j) {
    case 0:
        bytes = (unsigned)(k * a.dim * 2);
        src[0] = r0 < (size_t)qd ? L.wq + r0 * a.dim
                 : r0 < (size_t)(qd + kvd) ? L.wk + (r0 - qd) * a.dim
                                           : L.wv + (r0 - qd - kvd) * a.dim;
        return 1;
    case 1:
        bytes = (unsigned)(k * qd * 2);
        src[0] = L.wo + r0 * qd;
        return 1;
    case 2:
        bytes = (unsigned)(k * a.dim * 2);
        src[0] = L.wg + r0 * a.dim;
        src[1] = L.wu + r0 * a.dim;
        return 2;
    default:
        bytes = (unsigned)(k * a.ffn * 2);
        src[0] = L.wd + r0 * a.ffn;
        return 1;
    }
}

/* The copying warp's lane 0: every chunk of every layer this block owns,
 * in the order the multiplying warps take them.
 *
 * With a.inflight = K > 0 it keeps at most about K chunks' copies in
 * flight: before a chunk's copies it waits for whole groups issued
 * earlier to land (a group completes on its lead slot's barrier, which
 * counts the bytes of all its chunks, so only a group fully issued can
 * be waited for; the group being issued is never waited on, and may
 * alone exceed K). bench_handoff put an exchange at 3-4x its idle cost
 * while every SM kept four 16 KB copies in flight, and at 1.1-1.3x with
 * one, which still streamed 2.5 TB/s on an H100. K < ns, so a slot
 * waited on is not yet refilled. The ring's other slots hold chunks
 * already landed ahead of the rows; only fewer copies are in flight at
 * once (session 69, H100, 0.6B: 6 slots uncapped 1,207.6 tok/s, capped
 * at 2 1,259.0, at 2,048 tokens 1,017.0 -> 1,046.8). */
static __device__ void mg_produce(const struct cuk_mega &a, mg_head *hd, unsigned char *ring,
                                  int ns)
{
    const uint64_t pol = cuk_l2_evict_first();
    const int cap = a.inflight < ns ? a.inflight : ns - 1;
    struct {
        mg_ringpos lead;
        int end; /* chunks issued up to its last */
    } pend[MG_NS_MAX]; /* groups issued and not yet seen landed, oldest at ph */
    int ph = 0, pn = 0;
    int issued = 0, landed = 0; /* chunks issued, and of them seen landed */
    mg_ringpos w = {0, 0};
    bool again = false; /* past the first pass: a slot is refilled once emptied */
    mg_deal d = mg_deal_first(a);
    for (int l = 0; l < a.n_layers; l++, mg_deal_next(a, d)) {
        const cuk_mega_layer &L = a.layers[l];
        for (int j = 0; j < 4; j++) {
            int c0, m;
            mg_mine(a, d, j, c0, m);
            /* a group's chunks complete on the first one's barrier (the
             * others' complete at once: their phases still turn) */
            const int gs = mg_group(m, a.nbr[j], a.lk[j]);
            mg_ringpos lead = w; /* the group's first slot */
            for (int i = 0, left = 0; i < m; i++, left--) {
                if (again) /* the last pass's use emptied */
                    cuk_mbar_wait(&hd->empty[w.slot], w.par ^ 1);
                if (cap > 0)
                    for (; pn > 0 && issued + 1 - landed > cap; pn--, ph = (ph + 1) % MG_NS_MAX) {
                        cuk_mbar_wait(&hd->full[pend[ph].lead.slot], pend[ph].lead.par);
                        landed = pend[ph].end;
                    }
                const void *src[2];
                unsigned bytes;
                const int pieces = mg_src(a, L, j, c0 + i * gridDim.x, src, bytes);
                unsigned char *dst = ring + (size_t)w.slot * MG_SLOT;
                if (left == 0) {
                    left = min(gs, m - i);
                    lead = w;
                    cuk_mbar_expect(&hd->full[lead.slot], bytes * pieces * left);
                } else {
                    cuk_mbar_arrive(&hd->full[w.slot]);
                }
                for (int p = 0; p < pieces; p++)
                    cuk_bulk_copy(dst + (size_t)p * bytes, src[p], bytes, &hd->full[lead.slot],
                                  pol);
                issued++;
                if (cap > 0 && left == 1) /* the group's last chunk: it can be waited for */
                    pend[(ph + pn++) % MG_NS_MAX] = {lead, issued};
                again |= mg_ring_step(w, ns);
            }
        }
    }
}

/* One GEMV job of layer l over this block's m chunks, its input in vec,
 * the residual stream as received in xr (o, down). The block's m k rows
 * (chunk i's row r is block row i k + r) go in batches of 8 nb rows,
 * block row j to warp j % 8, and each warp multiplies its nb rows of a
 * batch together once their chunks have landed: one load of x for all of
 * them, independent sums, their shuffles interleaved. A chunk at a time,
 * each row was one long dependent chain and a chunk cost ~1 us (x271).
 * nb is NR unless a batch's chunks would not fit the ring (rows of 1 or
 * 2 a chunk); a warp short of NR rows repeats its last (no branches in
 * the loop) and sends only its own. A warp releases a chunk once no later
 * batch of its reads it. rp: the ring position of the job's first chunk,
 * then of the next job's. Outputs are sent with tag. */
template <int J>
static __device__ __forceinline__ void mg_gemv(const struct cuk_mega &a, const cuk_mega_layer &L,
                                               int l, mg_head *hd, const unsigned char *ring,
                                               int ns, const float *vec, const float *xr,
                                               const mg_ws &w, unsigned tag, mg_ringpos &rp,
                                               const mg_deal &dl, unsigned long long t0,
                                               mg_tr &tr)
{
    constexpr int NR = mg_nr<J>::v;
    constexpr int R = J == 2 ? 2 : 1; /* weight rows of one output: gate and up */
    const int P = J == 0 ? 0 : J + 1; /* the probe's phase */
    const unsigned E = 20 + 10 * J;  /* the trace's ids */
    mg_ev(tr, E);
    mg_stamp(a.probe, l, P, 2, t0);
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int lk = a.lk[J], k = 1 << lk;
    const int qd = a.n_heads * MG_HD, kvd = a.g.n_kv_heads * MG_HD;
    const int cols = J == 1 ? qd : J == 3 ? a.ffn : a.dim;
    const unsigned rowb = (unsigned)cols * 2;
    const bool last = l + 1 == a.n_layers;
    int c0, m;
    mg_mine(a, dl, J, c0, m);
    const int nrows = m << lk;
    const int nb = a.nbr[J];
    /* the ring slot and parity of the job's next chunk to wait for, and
     * the chunks this warp has waited for and released */
    int waited = 0, released = 0;
    mg_ringpos rel = rp; /* the next chunk to release (its parity unused) */
    /* chunks that land on the first one's barrier (mg_produce), and the
     * next such first chunk */
    const int gs = mg_group(m, nb, lk);
    int lead = 0;
    unsigned late = 0;
    bool first = true;
    for (int b0 = 0; b0 < nrows; b0 += MG_WARPS * nb) {
        /* this batch's rows: block rows j0, j0 + 8, ... (the last repeated) */
        const int j0 = b0 + warp;
        const int jl = min(j0 + (nb - 1) * MG_WARPS,
                           j0 + ((nrows - 1 - j0) / MG_WARPS) * MG_WARPS);
        unsigned off[NR];
        int row[NR];
#pragma unroll
        for (int t = 0; t < NR; t++) {
            const int j = min(j0 + t * MG_WARPS, jl);
            const int ci = j >> lk, r = j & (k - 1);
            int s2 = rp.slot + (ci - waited); /* waited <= ci < waited + ns */
            s2 -= s2 >= ns ? ns : 0;
            off[t] = (unsigned)s2 * MG_SLOT + (unsigned)r * rowb;
            row[t] = (c0 + ci * (int)gridDim.x) * k + r;
        }
        /* every chunk up to the batch's last row's (none: no rows) */
        const int need = j0 < nrows ? jl >> lk : -1;
        for (; waited <= need; waited++)
            mg_pass(a, hd, rp, ns, waited, lead, gs, true, late, tr, E + 1);
        if (first && a.probe)
            mg_stamp(a.probe, l, P, 3, t0);
        if (j0 < nrows) {
            float acc[NR][R][2];
#pragma unroll
            for (int t = 0; t < NR; t++)
#pragma unroll
                for (int h = 0; h < R; h++)
                    acc[t][h][0] = acc[t][h][1] = 0.0f;
            const float4 *x = (const float4 *)vec;
#pragma unroll 2
            for (int e = lane; e < cols / 8; e += 32) {
                const int xe = mg_xe(e);
                const float4 x0 = x[xe], x1 = x[xe + 32];
                uint4 wv[NR][R];
#pragma unroll
                for (int t = 0; t < NR; t++)
#pragma unroll
                    for (int h = 0; h < R; h++)
                        wv[t][h] = *(const uint4 *)(ring + off[t] + (unsigned)(h * k) * rowb +
                                                    16u * (unsigned)e);
#pragma unroll
                for (int t = 0; t < NR; t++)
#pragma unroll
                    for (int h = 0; h < R; h++) {
                        float f[8];
                        unpack<WT_BF16>(wv[t][h], f);
                        float a0 = acc[t][h][0], a1 = acc[t][h][1];
                        a0 = fmaf(f[0], x0.x, a0);
                        a1 = fmaf(f[1], x0.y, a1);
                        a0 = fmaf(f[2], x0.z, a0);
                        a1 = fmaf(f[3], x0.w, a1);
                        a0 = fmaf(f[4], x1.x, a0);
                        a1 = fmaf(f[5], x1.y, a1);
                        a0 = fmaf(f[6], x1.z, a0);
                        a1 = fmaf(f[7], x1.w, a1);
                        acc[t][h][0] = a0;
                        acc[t][h][1] = a1;
                    }
            }
            float sum[NR][R];
#pragma unroll
            for (int t = 0; t < NR; t++)
#pragma unroll
                for (int h = 0; h < R; h++)
                    sum[t][h] = acc[t][h][0] + acc[t][h][1];
#pragma unroll
            for (int o2 = 16; o2 > 0; o2 >>= 1)
#pragma unroll
                for (int t = 0; t < NR; t++)
#pragma unroll
                    for (int h = 0; h < R; h++)
                        sum[t][h] += __shfl_xor_sync(0xffffffffu, sum[t][h], o2);
            mg_ev(tr, E + 3);
            /* lane t sends the batch's row t (rows past the warp's last are repeats) */
            float s0 = sum[0][0], s1 = sum[0][R - 1];
            int rw = row[0];
#pragma unroll
            for (int t = 1; t < NR; t++)
                if (lane == t) {
                    s0 = sum[t][0];
                    s1 = sum[t][R - 1];
                    rw = row[t];
                }
            if (lane < nb && j0 + lane * MG_WARPS < nrows) {
                if (J == 0) {
                    const float *b = rw < qd ? L.bq : rw < qd + kvd ? L.bk : L.bv;
                    const int br = rw < qd ? rw : rw < qd + kvd ? rw - qd : rw - qd - kvd;
                    /* as the plain path: the matmul's sum, then the bias added */
                    cuk_tag_send(w.qkv + rw, b ? s0 + b[br] : s0, tag);
                } else if (J == 2) {
                    cuk_tag_send(w.h + rw, cuk_silu_mul1(s0, s1), tag);
                } else if (J == 1) {
                    cuk_tag_send(w.xo + rw, xr[rw] + s0, tag + 1);
                } else if (last) { /* the step's result, for the LM head */
                    a.x[rw] = xr[rw] + s0;
                } else {
                    cuk_tag_send(w.xd + rw, xr[rw] + s0, tag + 2);
                }
            }
        }
        mg_ev(tr, E + 4);
        if (first)
            mg_stamp(a.probe, l, P, 4, t0);
        first = false;
        /* the chunks before the next batch's: waited for (a warp must not
         * arrive before the copy it releases has landed), then released */
        const int next = min((b0 + MG_WARPS * nb) >> lk, m);
        for (; waited < next; waited++)
            mg_pass(a, hd, rp, ns, waited, lead, gs, false, late, tr, E + 1);
        __syncwarp();
        if (lane == 0)
            for (; released < next; released++) {
                cuk_mbar_arrive(&hd->empty[rel.slot]);
                mg_ring_step(rel, ns);
            }
    }
    /* rp: every chunk of the job waited for, past them */
    mg_ev(tr, E + 9);
    if (a.probe && threadIdx.x == 0)
        a.probe[MG_PROBE_AT(l, P) + 5 * gridDim.x + blockIdx.x] = late;
}

/* vec = rmsnorm(xr) * w over dim (the multiplying threads; w in shared
 * memory). */
static __device__ __forceinline__ void mg_norm_end(const struct cuk_mega &a, double ss,
                                                   const float *xr, const float *w, float *vec,
                                                   mg_head *hd)
{
    cuk_warp_part_d(ss, hd->part); /* ss: the calling thread's share of the squares */
    mg_sync();
    const float inv = cuk_rms_inv(cuk_parts_sum_d(hd->part, MG_WARPS), a.dim, a.eps);
    for (int i = threadIdx.x; i < a.dim; i += MG_CT)
        vec[mg_xi(i)] = cuk_rms_scale(w[i], xr[i], inv);
    mg_sync();
}

static __device__ __forceinline__ void mg_norm(const struct cuk_mega &a, const float *xr,
                                               const float *w, float *vec, mg_head *hd)
{
    double ss = 0.0;
    for (int i = threadIdx.x; i < a.dim / 4; i += MG_CT)
        ss += cuk_rms_sq(((const float4 *)xr)[i]);
    mg_norm_end(a, ss, xr, w, vec, hd);
}

/* xr = the residual stream's a.dim tagged pairs at src, and vec =
 * rmsnorm(xr) * w (w: shared memory, the cp.async group PEND groups
 * back), with two meetings rather than mg_recv's and mg_norm's three:
 * each thread sums the squares of the values it received. */
template <int PEND>
static __device__ __forceinline__ void mg_recv_norm(const struct cuk_mega &a, const uint2 *src,
                                                    unsigned tag, float *xr, const float *w,
                                                    float *vec, mg_head *hd)
{
    const double ss = mg_recv_ss<false>(src, a.dim, tag, xr, a.poll_ns);
    cuk_cp_async_wait<PEND>();
    mg_norm_end(a, ss, xr, w, vec, hd);
}

/* One head (128 floats at x, shared memory) normed with nw (NULL: not)
 * and rotated for the step's position, in place, by the calling warp: the
 * RoPE kernels' arithmetic (cuk_norm_rope). */
static __device__ __forceinline__ void mg_norm_rope(float *x, const float *nw, float eps,
                                                    const float *cs, const float *sn,
                                                    int interleaved, int lane)
{
    __syncwarp();
    const float inv = nw ? cuk_warp_rms_inv(x, nw, MG_HD, eps, lane) : 0.0f;
    __syncwarp();
    float ra[2], rb[2];
    int ia[2], ib[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int f = lane + 32 * r;
        ia[r] = interleaved ? 2 * f : f;
        ib[r] = interleaved ? 2 * f + 1 : f + MG_HD / 2;
        cuk_norm_rope(x, nw, inv, ia[r], ib[r], cs[r], sn[r], ra[r], rb[r]);
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        x[ia[r]] = ra[r];
        x[ib[r]] = rb[r];
    }
    __syncwarp();
}

static __device__ __forceinline__ float mg_bf16_round(float v)
{
    return __bfloat162float(__float2bfloat16_rn(v));
}

/* This block's attention item for the step: (KV head h, key split s) of
 * keys [k0, k1), on = false for a block without one. S splits a head: at
 * most MG_KPS keys a split unless that takes more than MG_SMAX splits,
 * and no more items than blocks (so a block has at most one); split 0's
 * block merges the head. */
struct mg_item {
    int pos, S, h, s, k0, k1;
    bool on;
};

static __device__ __forceinline__ mg_item mg_item_of(const struct cuk_mega &a, int pos)
{
    const int nkv = a.g.n_kv_heads, ctx = pos + 1;
    /* fewer splits for the merge to wait for (x299: 1,267 tok/s at 56
     * keys a split against 1,250 at 32; capping at 12 splits instead cost
     * 8 % at 2,048 tokens) */
    int S = (ctx + MG_KPS - 1) / MG_KPS;
    S = S > MG_SMAX ? MG_SMAX : S;
    const int fit = (int)gridDim.x / nkv;
    S = S > fit ? fit : S;
    S = S < 1 ? 1 : S;
    const int kps = (ctx + S - 1) / S;
    mg_item it;
    it.pos = pos;
    it.S = S;
    it.on = (int)blockIdx.x < nkv * S;
    it.h = blockIdx.x / S;
    it.s = blockIdx.x % S;
    it.k0 = it.s * kps;
    it.k1 = min(ctx, it.k0 + kps);
    return it;
}

/* Where layer l's cache rows start after layer 0's (elements). */
static __device__ __forceinline__ unsigned long long mg_layer_rows(const struct cuk_mega &a, int l)
{
    return (unsigned long long)l * a.g.n_kv_heads * a.g.pool_blocks * a.g.block_size * MG_HD;
}

/* hd->krow: the item's rows in layer 0 (the multiplying threads, which
 * meet after). */
static __device__ __forceinline__ void mg_key_rows(const struct cuk_mega &a, const mg_item &it,
                                                   mg_head *hd)
{
    if (it.on) {
        struct cuk_attn g = a.g;
        g.layer = 0;
        const int npre = min(it.k1 - it.k0, a.npre);
        for (int t = threadIdx.x; t <= npre; t += MG_CT)
            hd->krow[t < npre ? t : MG_PRE] = cuk_kv_row(&g, a.table, t < npre ? it.k0 + t : it.pos,
                                                         it.h);
    }
    mg_sync();
}

/* Asynchronous copies into shared memory (each call's copies are one
 * group once the caller commits): a vector of n floats (n % 4 == 0,
 * 16-byte aligned) ... */
static __device__ __forceinline__ void mg_fetch_vec(const float *w, int n, float *dst)
{
    for (int i = threadIdx.x; i < n / 4; i += MG_CT)
        cuk_cp_async16(cuk_smem_addr(dst + 4 * i), w + 4 * i, true);
}

/* ... and the item's first a.npre keys' K and V rows of layer l (all but
 * the step's own, which the attention makes), with the q/k norm weights:
 * none of it depends on this step's results, so it flies while the
 * q/k/v projection runs. */
static __device__ __forceinline__ void mg_fetch_kv(const struct cuk_mega &a,
                                                   const cuk_mega_layer &L, int l,
                                                   const mg_item &it, const mg_head *hd,
                                                   uint16_t *kvs, float *qkn)
{
    if (it.on) {
        const unsigned long long *krow = hd->krow, lrow = mg_layer_rows(a, l);
        const int npre = min(it.k1 - it.k0, a.npre);
        for (int t = threadIdx.x; t < npre * 32; t += MG_CT) {
            const int key = t >> 5, half = (t >> 4) & 1, ch = t & 15, p = it.k0 + key;
            if (p == it.pos)
                continue;
            const size_t row = krow[key] + lrow;
            const uint16_t *src = (const uint16_t *)(half ? a.vc : a.kc) + row + ch * 8;
            cuk_cp_async16(cuk_smem_addr(kvs + ((size_t)half * a.npre + key) * MG_HD + ch * 8), src,
                           true);
        }
        if (L.qn) {
            mg_fetch_vec(L.qn, MG_HD, qkn);
            mg_fetch_vec(L.kn, MG_HD, qkn + MG_HD);
        }
    }
    cuk_cp_async_commit();
}

/* Warp-wide: head[0..128) = the 128 tagged values at src. */
static __device__ __forceinline__ void mg_take_head(const uint2 *src, unsigned tag, float *head,
                                                    int lane, int nap)
{
    uint4 v0 = cuk_tag_ld2(src + 4 * lane), v1 = cuk_tag_ld2(src + 4 * lane + 2);
    mg_until(src + 4 * lane, tag, v0, nap);
    mg_until(src + 4 * lane + 2, tag, v1, nap);
    head[4 * lane] = __uint_as_float(v0.x);
    head[4 * lane + 1] = __uint_as_float(v0.z);
    head[4 * lane + 2] = __uint_as_float(v1.x);
    head[4 * lane + 3] = __uint_as_float(v1.z);
    __syncwarp();
}

/* dims 4 lane .. 4 lane + 3 of key p's K and V rows as bf16 pairs (kk,
 * vv): the step's own (kn, vn, already rounded to bf16, so exact), one
 * fetched ahead (kvs), or one from the cache. Kept packed until used: a
 * batch of keys in registers is half the size. */
static __device__ __forceinline__ void mg_key(const struct cuk_mega &a, const cuk_attn &g, int h,
                                              int pos, int k0, int p, const float *kn,
                                              const float *vn, const uint16_t *kvs, uint2 &kk,
                                              uint2 &vv)
{
    const int lane = threadIdx.x & 31;
    if (p == pos) {
        const float4 k4 = ((const float4 *)kn)[lane], v4 = ((const float4 *)vn)[lane];
        kk.x = __float_as_uint(k4.x) >> 16 | (__float_as_uint(k4.y) & 0xffff0000u);
        kk.y = __float_as_uint(k4.z) >> 16 | (__float_as_uint(k4.w) & 0xffff0000u);
        vv.x = __float_as_uint(v4.x) >> 16 | (__float_as_uint(v4.y) & 0xffff0000u);
        vv.y = __float_as_uint(v4.z) >> 16 | (__float_as_uint(v4.w) & 0xffff0000u);
        return;
    }
    const int col = cuk_kv_col(&g, p, 4 * lane);
    if (p - k0 < a.npre) { /* fetched before the q/k/v projection */
        kk = *(const uint2 *)(kvs + (size_t)(p - k0) * MG_HD + col);
        vv = *(const uint2 *)(kvs + (size_t)(a.npre + p - k0) * MG_HD + col);
    } else {
        const size_t at = cuk_kv_row(&g, a.table, p, h) + col;
        kk = *(const uint2 *)((const uint16_t *)a.kc + at);
        vv = *(const uint2 *)((const uint16_t *)a.vc + at);
    }
}

/* The four floats of a pair of bf16 pairs. */
static __device__ __forceinline__ void mg_unpack4(uint2 b, float *f)
{
    f[0] = __uint_as_float(b.x << 16);
    f[1] = __uint_as_float(b.x & 0xffff0000u);
    f[2] = __uint_as_float(b.y << 16);
    f[3] = __uint_as_float(b.y & 0xffff0000u);
}

/* One step of the halving over lanes lane ^ o: the lane keeps sums
 * [0, H) or (lane & o) [H, 2H) of its 2H, as v[0, H), each plus its
 * partner's; H = 0: the step of a lane left with one sum, both keep it. */
template <int H>
static __device__ __forceinline__ void mg_halve(float *v, int lane, int o)
{
    if constexpr (H == 0) {
        v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
    } else {
        const bool up = lane & o;
#pragma unroll
        for (int j = 0; j < H; j++) {
            const float send = up ? v[j] : v[j + H];
            const float keep = up ? v[j + H] : v[j];
            v[j] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
}

/* The calling warp's keys of a split, k0 + warp, k0 + warp + 8, ... below
 * k1, 8 at a time (4 with 3-4 heads), against the G query heads at qs
 * (lane: dims 4 lane .. 4 lane + 3): its maxima, sums and weighted V rows
 * to wm, wl, wacc. A batch's keys x heads dot products are summed over
 * the warp together by recursive halving (mg_halve): 16 shuffles for 16
 * sums where a butterfly a sum takes 80, and each sum ends in lanes of its
 * own, so a lane takes one exponential, not one per key and head; then
 * one rescale a batch. Against two keys at a time, each sum by its own
 * butterfly (x440, H100): 0.6B +2.5 % at 2,048 tokens, +0.4 % at 512,
 * where a warp's 7 keys are one batch run once a layer and its ~16 KB of
 * straight-line code, fetched cold, costs about what the arithmetic saves
 * (the stage 1.50-1.82 us against 1.73, x441). */
template <int G>
static __device__ __forceinline__ void mg_keys(const struct cuk_mega &a, const cuk_attn &g, int h,
                                               int pos, int k0, int k1, const float *qs,
                                               const float *kn, const float *vn,
                                               const uint16_t *kvs, float *wm, float *wl,
                                               float *wacc)
{
    constexpr int GP = G == 3 ? 4 : G;          /* heads padded to a power of two */
    constexpr int KB = GP > 2 ? (MG_KB < 4 ? MG_KB : 4) : MG_KB; /* keys a warp takes at once */
    constexpr int NV = KB * GP;              /* sums a batch: 2 to 16 */
    constexpr int LNV = NV == 2 ? 1 : NV == 4 ? 2 : NV == 8 ? 3 : 4;
    constexpr int SH = 5 - LNV;                 /* sum i ends in lanes i << SH .. */
    constexpr int KOFF = GP << SH;              /* the lowest lane bit of a sum's key */
    static_assert(NV >= 2 && NV <= 16 && (NV & (NV - 1)) == 0, "a batch's sums fit the warp's lanes");
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const float sc = a.g.scale * MG_LOG2E;
    float qr[G][4], m[G], ls[G], acc[G][4];
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        m[gi] = -INFINITY;
        ls[gi] = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            qr[gi][e] = qs[gi * MG_HD + 4 * lane + e] * sc;
            acc[gi][e] = 0.0f;
        }
    }
    /* this lane's sum: key mu of the batch, head mg */
    const int mi = lane >> SH, mu = mi / GP, mg = mi % GP;
    for (int p0 = k0 + warp; p0 < k1; p0 += KB * MG_WARPS) {
        uint2 kb[KB], vb[KB];
#pragma unroll
        for (int u = 0; u < KB; u++) {
            kb[u] = vb[u] = make_uint2(0, 0);
            if (p0 + u * MG_WARPS < k1)
                mg_key(a, g, h, pos, k0, p0 + u * MG_WARPS, kn, vn, kvs, kb[u], vb[u]);
        }
        float v[NV];
#pragma unroll
        for (int u = 0; u < KB; u++) {
            float kf[4];
            mg_unpack4(kb[u], kf);
#pragma unroll
            for (int gi = 0; gi < GP; gi++) {
                float t = 0.0f;
                if (gi < G) {
                    t = qr[gi][0] * kf[0];
                    t = fmaf(qr[gi][1], kf[1], t);
                    t = fmaf(qr[gi][2], kf[2], t);
                    t = fmaf(qr[gi][3], kf[3], t);
                }
                v[u * GP + gi] = t;
            }
        }
        mg_halve<NV / 2>(v, lane, 16);
        mg_halve<NV / 4>(v, lane, 8);
        mg_halve<NV / 8>(v, lane, 4);
        mg_halve<NV / 16>(v, lane, 2);
        mg_halve<NV / 32>(v, lane, 1);
        /* the batch's maximum of each head: over the keys' lanes (lane
         * bits from KOFF up), then the running one */
        const bool ok = mg < G && p0 + mu * MG_WARPS < k1;
        const float d = ok ? v[0] : -INFINITY;
        float mx = d;
#pragma unroll
        for (int o = 16; o >= KOFF; o >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float mn[G], mine = 0.0f;
#pragma unroll
        for (int gi = 0; gi < G; gi++) {
            mn[gi] = fmaxf(m[gi], __shfl_sync(0xffffffffu, mx, gi << SH));
            mine = gi == mg ? mn[gi] : mine;
        }
        const float pe = ok ? exp2f(d - mine) : 0.0f;
#pragma unroll
        for (int gi = 0; gi < G; gi++) {
            const float corr = exp2f(m[gi] - mn[gi]);
            float s = 0.0f, t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int u = 0; u < KB; u++) {
                const float pk = __shfl_sync(0xffffffffu, pe, (u * GP + gi) << SH);
                float vf[4];
                mg_unpack4(vb[u], vf);
                s += pk;
#pragma unroll
                for (int e = 0; e < 4; e++)
                    t[e] = fmaf(pk, vf[e], t[e]);
            }
            ls[gi] = fmaf(ls[gi], corr, s);
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[gi][e] = fmaf(acc[gi][e], corr, t[e]);
            m[gi] = mn[gi];
        }
    }
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        if (lane == 0) {
            wm[warp * G + gi] = m[gi];
            wl[warp * G + gi] = ls[gi];
        }
        ((float4 *)(wacc + (size_t)(warp * G + gi) * MG_HD))[lane] =
            make_float4(acc[gi][0], acc[gi][1], acc[gi][2], acc[gi][3]);
    }
}

/* The attention of layer l for the block's item, G query heads a KV
 * head; see the file comment. kvs, qkn: mg_fetch_kv's copies (waited for
 * here). */
template <int G>
static __device__ void mg_attention(const struct cuk_mega &a, const cuk_mega_layer &L, int l,
                                    const mg_item &it, const float *cs, const float *sn,
                                    float *sm, const uint16_t *kvs, const float *qkn,
                                    const mg_ws &w, unsigned tag, unsigned long long prow,
                                    mg_tr &tr)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int nkv = a.g.n_kv_heads;
    const int qd = a.n_heads * MG_HD, kvd = nkv * MG_HD;
    const int pos = it.pos, S = it.S;
    cuk_cp_async_wait<0>();
    mg_ev(tr, 60);
    if (!it.on)
        return;
    struct cuk_attn g = a.g;
    g.layer = l;
    float *qs = sm, *kn = qs + G * MG_HD, *vn = kn + MG_HD, *wm = vn + MG_HD,
          *wl = wm + MG_WARPS * G, *wacc = wl + MG_WARPS * G;
    const float *qnw = L.qn ? qkn : nullptr, *knw = L.kn ? qkn + MG_HD : nullptr;
    const int h = it.h, s = it.s, k0 = it.k0, k1 = it.k1;
    mg_sync(); /* every thread's fetched rows in */
    mg_ev(tr, 61);
    if (warp < G) {
        float *x = qs + warp * MG_HD;
        mg_take_head(w.qkv + (size_t)(h * G + warp) * MG_HD, tag, x, lane, a.poll_ns);
        mg_ev(tr, 62);
        mg_norm_rope(x, qnw, a.eps, cs, sn, a.interleaved, lane);
        mg_ev(tr, 63);
    } else if (warp == MG_WARPS - 1 && pos >= k0 && pos < k1) {
        mg_take_head(w.qkv + qd + (size_t)h * MG_HD, tag, kn, lane, a.poll_ns);
        mg_take_head(w.qkv + qd + kvd + (size_t)h * MG_HD, tag, vn, lane, a.poll_ns);
        mg_norm_rope(kn, knw, a.eps, cs, sn, a.interleaved, lane);
        const size_t row = prow;
        for (int e = 0; e < 4; e++) {
            const int d = 4 * lane + e;
            const size_t at = row + cuk_kv_col(&g, pos, d);
            kv_st((uint16_t *)a.kc, at, kn[d]);
            kv_st((uint16_t *)a.vc, at, vn[d]);
            kn[d] = mg_bf16_round(kn[d]);
            vn[d] = mg_bf16_round(vn[d]);
        }
    }
    mg_sync();
    mg_ev(tr, 64);
    mg_keys<G>(a, g, h, pos, k0, k1, qs, kn, vn, kvs, wm, wl, wacc);
    mg_ev(tr, 65);
    mg_sync();
    mg_ev(tr, 66);
    if (warp < G) { /* the split's partial of query head h G + warp */
        const int gi = warp;
        float M = -INFINITY;
        for (int v = 0; v < MG_WARPS; v++)
            M = fmaxf(M, wm[v * G + gi]);
        float Ls = 0.0f, o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int v = 0; v < MG_WARPS; v++) {
            const float mw = wm[v * G + gi];
            const float c = mw == -INFINITY ? 0.0f : exp2f(mw - M);
            Ls = fmaf(wl[v * G + gi], c, Ls);
            const float4 v4 = ((const float4 *)(wacc + (size_t)(v * G + gi) * MG_HD))[lane];
            o[0] = fmaf(v4.x, c, o[0]);
            o[1] = fmaf(v4.y, c, o[1]);
            o[2] = fmaf(v4.z, c, o[2]);
            o[3] = fmaf(v4.w, c, o[3]);
        }
        uint2 *att = w.att + (size_t)(h * G + gi) * MG_HD;
        if (S == 1) {
            const float inv = 1.0f / Ls;
            for (int e = 0; e < 4; e++)
                cuk_tag_send(att + 4 * lane + e, o[e] * inv, tag);
        } else {
            uint2 *pp = w.part + ((size_t)(h * MG_SMAX + s) * G + gi) * MG_PART;
            for (int e = 0; e < 4; e++)
                cuk_tag_send(pp + 4 * lane + e, o[e], tag);
            if (lane == 0) {
                cuk_tag_send(pp + MG_HD, M, tag);
                cuk_tag_send(pp + MG_HD + 1, Ls, tag);
            }
        }
    }
    mg_ev(tr, 67);
    if (S == 1 || s != 0)
        return;
    /* Split 0's block merges the head's S splits with all its warps:
     * warp v takes query head v % G and splits v / G, v / G + 8 / G, ...,
     * their loads in flight together; every warp weighs them with the
     * maxima and sums of all S (lane t loads split t's). */
    mg_sync(); /* wacc is the warps' again */
    mg_ev(tr, 70);
    const int per = MG_WARPS / G, gi = warp % G;
    const uint2 *p0 = w.part + (size_t)h * MG_SMAX * G * MG_PART + (size_t)gi * MG_PART;
    const size_t stride = (size_t)G * MG_PART; /* pairs from one split to the next */
    /* the first splits' partials asked for before their maxima and sums
     * are waited for: one trip to L2 fewer */
    uint4 u[4][2];
    int t0s = warp / G;
    auto merge_loads = [&]() {
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (t0s + j * per < S) {
                u[j][0] = cuk_tag_ld2(p0 + (t0s + j * per) * stride + 4 * lane);
                u[j][1] = cuk_tag_ld2(p0 + (t0s + j * per) * stride + 4 * lane + 2);
            }
    };
    merge_loads();
    /* The first round's partials and every split's maximum and sum (lane t
     * has split t's) are polled together until all carry the tag: their
     * loads were issued before the slowest split had sent, and polling the
     * maxima first, then the partials, took a trip to L2 for each (x439:
     * 1.2 us, then 0.8). */
    uint4 ml = make_uint4(0, tag, 0, tag); /* past S: nothing to wait for */
    if (lane < S)
        ml = cuk_tag_ld2(p0 + lane * stride + MG_HD);
    for (;;) {
        bool ok = ml.y == tag && ml.w == tag;
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (t0s + j * per < S)
                ok = ok && u[j][0].y == tag && u[j][0].w == tag && u[j][1].y == tag &&
                     u[j][1].w == tag;
        if (__all_sync(0xffffffffu, ok))
            break;
        if (a.poll_ns)
            __nanosleep(a.poll_ns);
        if (ml.y != tag || ml.w != tag)
            ml = cuk_tag_ld2(p0 + lane * stride + MG_HD);
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (t0s + j * per < S) {
                const uint2 *pt = p0 + (t0s + j * per) * stride + 4 * lane;
                if (u[j][0].y != tag || u[j][0].w != tag)
                    u[j][0] = cuk_tag_ld2(pt);
                if (u[j][1].y != tag || u[j][1].w != tag)
                    u[j][1] = cuk_tag_ld2(pt + 2);
            }
    }
    const float mt = lane < S ? __uint_as_float(ml.x) : -INFINITY,
                lt = lane < S ? __uint_as_float(ml.z) : 0.0f;
    float M = mt;
    for (int o2 = 16; o2 > 0; o2 >>= 1)
        M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o2));
    mg_ev(tr, 71);
    const float ct = mt == -INFINITY ? 0.0f : exp2f(mt - M);
    const float Ls = cuk_warp_sum(lt * ct);
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (;;) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int t = t0s + j * per;
            const float c = __shfl_sync(0xffffffffu, ct, t & 31);
            if (t >= S)
                continue;
            const uint2 *pt = p0 + t * stride + 4 * lane;
            mg_until(pt, tag, u[j][0], a.poll_ns);
            mg_until(pt + 2, tag, u[j][1], a.poll_ns);
            o[0] = fmaf(__uint_as_float(u[j][0].x), c, o[0]);
            o[1] = fmaf(__uint_as_float(u[j][0].z), c, o[1]);
            o[2] = fmaf(__uint_as_float(u[j][1].x), c, o[2]);
            o[3] = fmaf(__uint_as_float(u[j][1].z), c, o[3]);
        }
        t0s += 4 * per;
        if (t0s >= S)
            break;
        merge_loads();
    }
    mg_ev(tr, 72);
    ((float4 *)(wacc + (size_t)warp * MG_HD))[lane] = make_float4(o[0], o[1], o[2], o[3]);
    mg_sync();
    mg_ev(tr, 73);
    if (warp < G) {
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int v = warp; v < MG_WARPS; v += G) { /* warp order: the same sum every step */
            const float4 t = ((const float4 *)(wacc + (size_t)v * MG_HD))[lane];
            sum.x += t.x;
            sum.y += t.y;
            sum.z += t.z;
            sum.w += t.w;
        }
        const float inv = 1.0f / Ls;
        uint2 *att = w.att + (size_t)(h * G + warp) * MG_HD;
        cuk_tag_send(att + 4 * lane, sum.x * inv, tag);
        cuk_tag_send(att + 4 * lane + 1, sum.y * inv, tag);
        cuk_tag_send(att + 4 * lane + 2, sum.z * inv, tag);
        cuk_tag_send(att + 4 * lane + 3, sum.w * inv, tag);
    }
    mg_ev(tr, 74);
}

#endif

/* One instance a count of query heads a KV head (cuk_mega_plan's G): the
 * attention's sums interleave over heads known at compile time, and the
 * kernel carries the code of one count only (its code is fetched again
 * every layer; the other counts' cost 0.4 % on the 0.6B, x310). */
template <int G>
__global__ void __launch_bounds__(MG_THREADS, 1)
    k_decode_mega(const __grid_constant__ struct cuk_mega a, int ns)
{
#if MG_ARCH_OK
    extern __shared__ __align__(128) unsigned char smem[];
    mg_head *hd = (mg_head *)smem;
    float *vec = (float *)(smem + MG_VEC_OFF);
    const int qd = a.n_heads * MG_HD;
    const mg_layout lo = mg_layout_of(a.dim, qd, a.ffn, G, a.npre);
    float *xr = (float *)(smem + lo.xr);
    uint16_t *kvs = (uint16_t *)(smem + lo.kvs);
    float *nrm = (float *)(smem + lo.nrm), *qkn = (float *)(smem + lo.qkn);
    unsigned char *ring = smem + lo.ring;
    if (threadIdx.x == 0) {
        for (int i = 0; i < ns; i++) {
            cuk_mbar_init(&hd->full[i], 1);
            cuk_mbar_init(&hd->empty[i], MG_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x >= MG_CT) {
        if (threadIdx.x == MG_CT)
            mg_produce(a, hd, ring, ns);
        return;
    }
    const int lane = threadIdx.x & 31;
    const mg_item it = mg_item_of(a, a.dpos ? *a.dpos : a.g.pos0);
    /* the rotation of the step's position, the same for every layer */
    float cs[2], sn[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float ang = cuk_rope_angle(it.pos, a.inv_freq[lane + 32 * r]);
        cs[r] = cosf(ang);
        sn[r] = sinf(ang);
    }
    /* the step's tags: 4 a layer (q/k/v and the values that share its tag,
     * x after o, x after down), never 0 (the workspace starts zeroed) */
    const unsigned gen = *(volatile const unsigned *)a.gen;
    const mg_ws w = mg_ws_of(a);
    mg_ringpos rp = {0, 0};
    /* the probe's stamps are the global timer's low 32 bits (differences
     * wrap correctly), so blocks compare with one another as well as with
     * their own start of a layer */
    const unsigned long long t0 = 0;
    unsigned *pr = a.probe;
    /* cp.async groups in flight: the next norm's weights (one group),
     * then the layer's K/V rows (one group) */
    mg_fetch_vec(a.layers[0].attn_norm, a.dim, nrm);
    cuk_cp_async_commit();
    for (int i = threadIdx.x; i < a.dim / 4; i += MG_CT) /* the embedding, from the last kernel */
        ((float4 *)xr)[i] = __ldcg((const float4 *)a.x + i);
    mg_key_rows(a, it, hd);
    mg_deal dl = mg_deal_first(a);
    for (int l = 0; l < a.n_layers; l++, mg_deal_next(a, dl)) {
        const cuk_mega_layer &L = a.layers[l];
        const unsigned tag = (gen * (unsigned)a.n_layers + (unsigned)l) * 4u + 4u;
        mg_tr tr = {nullptr, 0};
        if (pr && threadIdx.x == 0 && l == a.n_layers / 2)
            tr.p = pr + (size_t)a.n_layers * 5 * MG_PROBE_K * gridDim.x +
                   (size_t)blockIdx.x * MG_TR_MAX * 3;
        mg_ev(tr, 90); /* two events back to back: what an event costs */
        mg_ev(tr, 91);
        mg_ev_val(tr, 92, mg_smid());
        mg_ev(tr, 1);
        mg_fetch_kv(a, L, l, it, hd, kvs, qkn);
        if (l > 0) {
            mg_recv_norm<1>(a, w.xd, tag - 2, xr, nrm, vec, hd); /* K/V rows may fly */
        } else {
            cuk_cp_async_wait<1>(); /* the norm (mg_norm's barrier shares it) */
            mg_norm(a, xr, nrm, vec, hd);
        }
        mg_stamp(pr, l, 0, 0, t0);
        mg_ev(tr, 3);
        mg_gemv<0>(a, L, l, hd, ring, ns, vec, xr, w, tag, rp, dl, t0, tr);
        mg_stamp(pr, l, 0, 1, t0);
        mg_stamp(pr, l, 1, 0, t0);
        mg_attention<G>(a, L, l, it, cs, sn, vec, kvs, qkn, w, tag,
                     hd->krow[MG_PRE] + mg_layer_rows(a, l), tr);
        mg_stamp(pr, l, 1, 1, t0);
        mg_sync(); /* the attention's shared memory is the o projection's input */
        mg_ev(tr, 4);
        mg_fetch_vec(L.ffn_norm, a.dim, nrm);
        cuk_cp_async_commit();
        mg_recv(w.att, qd, tag, vec, a.poll_ns);
        mg_ev(tr, 5);
        mg_stamp(pr, l, 2, 0, t0);
        mg_gemv<1>(a, L, l, hd, ring, ns, vec, xr, w, tag, rp, dl, t0, tr);
        mg_stamp(pr, l, 2, 1, t0);
        mg_sync(); /* every warp's rows done with xr */
        mg_ev(tr, 6);
        mg_recv_norm<0>(a, w.xo, tag + 1, xr, nrm, vec, hd);
        mg_stamp(pr, l, 3, 0, t0);
        mg_ev(tr, 8);
        mg_gemv<2>(a, L, l, hd, ring, ns, vec, xr, w, tag, rp, dl, t0, tr);
        mg_stamp(pr, l, 3, 1, t0);
        mg_sync(); /* every warp's rows done with vec and nrm */
        mg_ev(tr, 9);
        if (l + 1 < a.n_layers)
            mg_fetch_vec(a.layers[l + 1].attn_norm, a.dim, nrm);
        cuk_cp_async_commit();
        mg_recv(w.h, a.ffn, tag, vec, a.poll_ns);
        mg_ev(tr, 10);
        mg_stamp(pr, l, 4, 0, t0);
        mg_gemv<3>(a, L, l, hd, ring, ns, vec, xr, w, tag, rp, dl, t0, tr);
        mg_stamp(pr, l, 4, 1, t0);
        mg_sync(); /* every warp's rows done with vec and xr */
        mg_ev(tr, 11);
        if (tr.p && tr.n < MG_TR_MAX) /* the end of this step's events */
            tr.p[3 * tr.n] = 0;
    }
    /* Block 0 ends after every block has read this step's gen (it took
     * their values), so the next step's tags start past this one's. */
    if (blockIdx.x == 0 && threadIdx.x == 0)
        *(volatile unsigned *)a.gen = gen + 1;
#endif
}

/* Shared memory a launch takes for a's shapes: the head, the inputs, and
 * as many ring slots as fit the device's opt-in limit (0: too few); sets
 * a->npre, the keys of a split fetched ahead: MG_PRE where the ring still
 * gets its slots, else MG_KPS (x301: 128 against 56 keys, 974 -> 1,087
 * tok/s at 2,048 tokens). */
static size_t mg_smem(struct cuk_mega *a, int smem_max, int *ns)
{
    const int qd = a->n_heads * MG_HD;
    /* deeper rings queued more in L2 (x277), and more slots than fit
     * beside MG_PRE keys fetched ahead leave room for MG_KPS (x438:
     * the 0.6B with 11 slots against 8, 1,275.7 against 1,261.5 tok/s
     * at 512 tokens but 972.5 against 1,047.0 at 2,048); but a GEMV
     * batch of a job with k rows a chunk spans 8 / k chunks or more, all
     * held at once (mg_gemv), so the ring holds at least that many */
    int need = 1;
    for (int j = 0; j < 4; j++)
        need = (MG_WARPS >> a->lk[j]) > need ? MG_WARPS >> a->lk[j] : need;
    int cap = a->ns_max > 0 ? a->ns_max : MG_NS_DEF;
    cap = cap < need ? need : cap;
    size_t off = 0;
    int k = 0;
    for (int npre = MG_PRE;; npre = MG_KPS) {
        a->npre = npre;
        off = mg_layout_of(a->dim, qd, a->ffn, a->n_heads / a->g.n_kv_heads, npre).ring;
        k = smem_max > (int)off ? (int)((smem_max - off) / MG_SLOT) : 0;
        k = k > MG_NS_MAX ? MG_NS_MAX : k;
        if (k >= cap || npre == MG_KPS)
            break;
    }
    k = k > cap ? cap : k;
    k = k < need ? 0 : k;
    *ns = k;
    return off + (size_t)k * MG_SLOT;
}

/* The kernel's instance for G query heads a KV head (1..MG_GMAX). */
typedef void (*mg_kernel_fn)(const struct cuk_mega, int);
static mg_kernel_fn mg_kernel(int G)
{
    static const mg_kernel_fn k[MG_GMAX] = {k_decode_mega<1>, k_decode_mega<2>, k_decode_mega<3>,
                                            k_decode_mega<4>};
    return k[G - 1];
}

extern "C" int cuk_mega_plan(struct cuk_mega *a, int n_sms, char *why, size_t why_len)
{
    int dev = 0, major = 0, smem_max = 0, coop = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev);
    const int nkv = a->g.n_kv_heads;
#define MG_NO(...) (snprintf(why, why_len, __VA_ARGS__), 0)
    if (major < 9 || !coop)
        return MG_NO("needs a Hopper GPU with cooperative launches");
    if (a->g.head_dim != MG_HD || nkv < 1 || a->n_heads % nkv ||
        a->n_heads / nkv > MG_GMAX || !a->g.kv_bf16)
        return MG_NO("needs head_dim %d, at most %d query heads a KV head, a bf16 cache", MG_HD,
                     MG_GMAX);
    if (a->dim % 8 || a->ffn % 8)
        return MG_NO("needs widths that are multiples of 8");
    const int qd = a->n_heads * MG_HD, kvd = nkv * MG_HD;
    const int cols[4] = {a->dim, qd, a->dim, a->ffn};
    const int rows[4] = {qd + 2 * kvd, a->dim, a->ffn, a->dim};
    a->tot = 0;
    for (int j = 0; j < 4; j++) {
        int k = MG_SLOT / (cols[j] * 2 * (j == 2 ? 2 : 1));
        if (k < 1)
            return MG_NO("a row of %d columns does not fit a %d-byte slot", cols[j], MG_SLOT);
        int lk = 0; /* a power of two: the kernel divides by shifting */
        while (lk < 3 && (2 << lk) <= k)
            lk++;
        while (lk > 0 && (rows[j] % (1 << lk) || (j == 0 && (qd % (1 << lk) || kvd % (1 << lk)))))
            lk--;
        k = 1 << lk;
        a->lk[j] = lk;
        a->chunks[j] = rows[j] / k;
        a->pre[j] = a->tot;
        a->tot += a->chunks[j];
    }
    int ns = 0;
    size_t smem = mg_smem(a, smem_max, &ns);
    a->ns = ns;
    a->smem = smem;
    if (ns < 4)
        return MG_NO("the inputs leave too little shared memory for the ring");
    int per_sm = 0;
    const mg_kernel_fn kern = mg_kernel(a->n_heads / nkv);
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, MG_THREADS, smem) !=
            cudaSuccess ||
        per_sm < 1) {
        cudaGetLastError();
        return MG_NO("its blocks do not fit an SM");
    }
    /* every block owns rows of every job (the file comment says why) */
    int nb = n_sms;
    for (int j = 0; j < 4; j++)
        nb = a->chunks[j] < nb ? a->chunks[j] : nb;
    if (nb < nkv)
        return MG_NO("fewer blocks than KV heads");
    a->nb = nb;
    for (int j = 0; j < 4; j++) { /* the dealing's constants (mg_mine, mg_gemv) */
        static const int nr[4] = {mg_nr<0>::v, mg_nr<1>::v, mg_nr<2>::v, mg_nr<3>::v};
        a->mq[j] = a->chunks[j] / nb;
        a->mr[j] = a->chunks[j] % nb;
        int b = (ns << a->lk[j]) / MG_WARPS; /* a batch's chunks fit the ring */
        a->nbr[j] = b < 1 ? 1 : b > nr[j] ? nr[j] : b;
    }
    a->tm = a->tot % nb;
    return 1;
#undef MG_NO
}

extern "C" size_t cuk_mega_probe_words(const struct cuk_mega *a)
{
    return (size_t)a->n_layers * 5 * MG_PROBE_K * a->nb + (size_t)a->nb * MG_TR_MAX * 3;
}

extern "C" cudaError_t cuk_mega_decode(cudaStream_t s, const struct cuk_mega *a)
{
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeCooperative;
    at[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)a->nb);
    cfg.blockDim = dim3(MG_THREADS);
    cfg.dynamicSmemBytes = a->smem;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, mg_kernel(a->n_heads / a->g.n_kv_heads), *a, a->ns);
}
