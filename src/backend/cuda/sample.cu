/* sample.cu - the sampler on the device (the sample_rows op): one block per
 * row picks the token sampler_pick (engine/sampler.c) picks for the row's
 * parameters and uniform draw u, so a sampled step copies ids to the host
 * instead of its logits rows.
 *
 * The host sorts; a block cannot sort a 152k-entry row in shared memory, so
 * every question the sampler asks becomes "where does a running weight,
 * walking the candidates in the host's order, first exceed a target":
 *   - top-k: the k-th candidate in descending order (weight 1 each);
 *   - top-p: the first where the descending mass reaches top_p * sum;
 *   - the draw: the first where the running mass exceeds u * sum, walking
 *     in descending order when top-k or top-p is on, else in id order (the
 *     host's order then; see sampler_pick).
 * Descending walks (smp_select) are radix selects over the float's
 * order-preserving bits, 4-bit digits from the top, each pass a 16-bin
 * histogram of count and mass over the candidates whose higher digits
 * match; the ties at the found value then go in id order. Id-order walks
 * (smp_idscan) split the range into one contiguous chunk per thread, sum
 * the chunks, scan the sums and recurse into the chunk holding the target.
 *
 * Histograms are lane-private (a slot per thread and bin, no atomics:
 * logits share their top bits, so shared atomics on 16 bins would
 * serialize). Once the candidates from the top down to the current bin fit
 * in shared memory (SMP_CAP: a top-k of up to 4096, or a top-p prefix that
 * short) they are copied there in id order, and the rest of the walk and
 * every later one read only them.
 *
 * Arithmetic matches the host's where it decides: x = logit * (1 /
 * temperature) rounded as the host rounds it (__fmul_rn, never fused),
 * ranks by value then id, p = exp(x - max) from the float difference,
 * rounded to float through double (within an ulp of the host's expf, equal
 * nearly always). Masses are summed as integers in units of 2^-40 (p <= 1,
 * at most 2^21 of them: no overflow in 64 bits, and the sum is the same in
 * any order), where the host sums doubles in its order; so a pick can
 * differ from the host's only where a target lies within about 1e-12 of a
 * boundary between two tokens, or where exp rounded the other way.
 *
 * Kept to a subset that tests/test_sample_emu.cpp runs on the host (CUDA
 * C++ without warp intrinsics or atomics: shared memory and barriers only),
 * so the kernel's logic is tested on machines without a GPU.
 *
 * The fast path (cuk_sample_rows with a struct cuk_sample_ws; the three
 * preparation kernels at the end use atomics and are not emulated: the
 * test makes what they make on the host) moves the work off the row's one
 * block: each row's maximum, probabilities, masses and largest
 * probabilities are made over the whole device first, and the block then
 * answers from a block's span (temperature alone) or from its candidates,
 * sorted once (top-k, top-p), walking the row only where an answer might
 * lie past them. Each walk still asks for the first token, in the same
 * order, at which the same integer sum exceeds the same target: the same
 * ids. */
#ifdef CLLM_CUDA_EMU
#include "cuda_emu.h"
#include "backend/cuda/cuda_backend.h"
#else
#include "backend/cuda/cuda_common.cuh"
#endif
#include "backend/cuda/order_key.cuh"
#include "backend/cuda/row_split.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>

#define SMP_THREADS 512 /* = 16 bins x 32: smp_hist_sum and smp_scan rely on it */
#define SMP_BINS 16
#define SMP_CAP 4096
/* A histogram slot packs count << SMP_CBIT | mass: a thread adds at most
 * CUK_SAMPLE_MAX_N / SMP_THREADS = 4095 candidates of mass <= 2^40 per pass. */
#define SMP_CBIT 52
#define SMP_MMASK ((1ull << SMP_CBIT) - 1)

typedef unsigned long long u64;

/* Where thread i's entry of smp_scan / smp_max sits: one pad entry per 16,
 * so the 32 threads that each fold 16 consecutive entries hit distinct
 * banks. */
#define SMP_PAD(i) ((i) + ((i) >> 4))

/* A position in the host's descending walk: every candidate whose key is
 * larger, or equal with an id no larger, is at or before it. */
struct smp_bound {
    unsigned key;
    int id;
};

/* Which candidates a walk or a sum counts. */
struct smp_filter {
    smp_bound k, p;   /* at or before both (top-k, top-p); {0, INT_MAX}: all */
    float min_p;      /* > 0: only p >= min_p */
    bool tie;         /* only key == tie_key (the id-order walk over ties) */
    unsigned tie_key;
};

struct smp_shared {
    u64 hist[SMP_BINS][SMP_THREADS]; /* [bin][thread]: lane-private slots */
    u64 scan[SMP_PAD(SMP_THREADS)];
    u64 seg[32];
    u64 pw[SMP_BINS][33]; /* rows padded: the 16 folding threads hit distinct banks */
    unsigned pc[SMP_BINS][33];
    u64 tot_w[SMP_BINS];
    unsigned tot_c[SMP_BINS];
    unsigned key[SMP_CAP]; /* the gathered candidates, in id order */
    int id[SMP_CAP];
    u64 total;
    int loc_lo, loc_hi;    /* smp_idscan: the chunk holding the target */
    int cut;               /* the fast path's smp_cut, from thread 0 */
    u64 loc_excl, loc_own;
    int n_sh;              /* < 0: the candidates are the row; else key/id[0, n_sh) */
};

struct smp_row {
    const float *x;
    const float *p; /* the row's p = expf(x - max), made by k_smp_prob, or NULL */
    int n;
    float inv_t;
    float max; /* the largest x (once known) */
};

static __device__ __forceinline__ int smp_min(int a, int b) { return a < b ? a : b; }

static __device__ __forceinline__ bool smp_is_nan(float v)
{
    return (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u;
}

static __device__ __forceinline__ bool smp_at_or_before(unsigned key, int id, smp_bound b)
{
    return key > b.key || (key == b.key && id <= b.id);
}

/* p = expf(x - max) as the host forms it (see the top of the file). */
static __device__ __forceinline__ float smp_prob(unsigned key, float mx)
{
    return (float)exp((double)__fsub_rn(cuk_order_value(key), mx));
}

/* p in units of 2^-40; a positive p counts at least 1, so the tokens with
 * weight are exactly those the host can pick (its u = 0 takes the first
 * positive p, however small). */
static __device__ __forceinline__ u64 smp_weight(float p)
{
    u64 w = __float2ull_rn(p * 0x1p40f);
    return w == 0 && p > 0 ? 1 : w;
}

/* Whether the thread whose weights are own, after excl before it in a
 * block scan, holds the target (the running sum first exceeds it in its
 * share): exactly one thread does when the total exceeds the target. */
static __device__ __forceinline__ bool smp_holds(u64 own, u64 excl, u64 target)
{
    return own > 0 && excl <= target && target - excl < own;
}

/* Whether P's top-k cuts a row of m candidates (else every one is kept). */
static __device__ __forceinline__ bool smp_topk(const cuk_sample_param &P, u64 m)
{
    return P.top_k > 0 && (u64)P.top_k < m;
}

/* The host's u * sum as a target for "first running sum > target" over
 * integers: floor, and below the total however the product rounds. */
static __device__ __forceinline__ u64 smp_target(double u, u64 total)
{
    double t = floor(u * (double)total);
    return t >= (double)(total - 1) ? total - 1 : t > 0 ? (u64)t : 0;
}

/* Whether a candidate passes F; *p gets its probability when need_p or
 * min-p asks for it: pv when that was loaded (>= 0), else worked out. */
static __device__ __forceinline__ bool smp_pass(const smp_row &R, const smp_filter &F,
                                                unsigned key, int id, float pv, bool need_p,
                                                float *p)
{
    if (!smp_at_or_before(key, id, F.k) || !smp_at_or_before(key, id, F.p) ||
        (F.tie && key != F.tie_key))
        return false;
    if (need_p || F.min_p > 0)
        *p = pv >= 0 ? pv : smp_prob(key, R.max);
    return !(F.min_p > 0) || *p >= F.min_p;
}

/* f(key, id, pv) for every candidate, in no set order (the callers only
 * add integers or take a maximum), pv its probability from R.p when
 * want_p and the source is the row, else -1. The row is read 16 bytes a
 * load where aligned, several loads in flight per thread. */
template <typename Fn>
static __device__ __forceinline__ void smp_each(const smp_row &R, const smp_shared *S,
                                                bool want_p, Fn f)
{
    const int t = threadIdx.x, m = S->n_sh;
    if (m >= 0) {
        for (int j = t; j < m; j += SMP_THREADS)
            f(S->key[j], S->id[j], -1.0f);
        return;
    }
    const bool lp = want_p && R.p;
    int j = t;
#ifndef CLLM_CUDA_EMU
    if (((uintptr_t)R.x & 15) == 0 && ((uintptr_t)R.p & 15) == 0) {
        const int nv = R.n / 4;
        const float4 *xv = (const float4 *)R.x, *pv = (const float4 *)R.p;
        int q = t;
        for (; q < nv; q += 4 * SMP_THREADS) {
            float4 v[4], w[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int k = q + u * SMP_THREADS;
                v[u] = k < nv ? xv[k] : make_float4(NAN, NAN, NAN, NAN);
                w[u] = lp && k < nv ? pv[k] : make_float4(-1.0f, -1.0f, -1.0f, -1.0f);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w},
                            pe[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    float y = __fmul_rn(e[c], R.inv_t);
                    if (!smp_is_nan(y))
                        f(cuk_order_key(y), 4 * (q + u * SMP_THREADS) + c, pe[c]);
                }
            }
        }
        for (j = 4 * nv + t; j < R.n; j += SMP_THREADS) {
            float y = __fmul_rn(R.x[j], R.inv_t);
            if (!smp_is_nan(y))
                f(cuk_order_key(y), j, lp ? R.p[j] : -1.0f);
        }
        return;
    }
#endif
    for (; j + 7 * SMP_THREADS < R.n; j += 8 * SMP_THREADS) {
        float v[8], w[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            v[u] = R.x[j + u * SMP_THREADS];
            w[u] = lp ? R.p[j + u * SMP_THREADS] : -1.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            float y = __fmul_rn(v[u], R.inv_t);
            if (!smp_is_nan(y))
                f(cuk_order_key(y), j + u * SMP_THREADS, w[u]);
        }
    }
    for (; j < R.n; j += SMP_THREADS) {
        float y = __fmul_rn(R.x[j], R.inv_t);
        if (!smp_is_nan(y))
            f(cuk_order_key(y), j, lp ? R.p[j] : -1.0f);
    }
}

/* f(key, id, pv) for the candidates at positions [a, b) of the source, in
 * order (one thread's chunk); pv as for smp_each. */
template <typename Fn>
static __device__ __forceinline__ void smp_range(const smp_row &R, const smp_shared *S, int a,
                                                 int b, bool want_p, Fn f)
{
    if (S->n_sh >= 0) {
        for (int j = a; j < b; j++)
            f(S->key[j], S->id[j], -1.0f);
        return;
    }
    const bool lp = want_p && R.p;
    int j = a;
    for (; j + 8 <= b; j += 8) {
        float v[8], w[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            v[u] = R.x[j + u];
            w[u] = lp ? R.p[j + u] : -1.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            float y = __fmul_rn(v[u], R.inv_t);
            if (!smp_is_nan(y))
                f(cuk_order_key(y), j + u, w[u]);
        }
    }
    for (; j < b; j++) {
        float y = __fmul_rn(R.x[j], R.inv_t);
        if (!smp_is_nan(y))
            f(cuk_order_key(y), j, lp ? R.p[j] : -1.0f);
    }
}

/* Exclusive prefix sum of v over the block in thread order: *excl gets
 * this thread's offset; returns the total. Ends on a barrier, so the
 * scratch may be reused at once. */
static __device__ u64 smp_scan(smp_shared *S, u64 v, u64 *excl)
{
    const int t = threadIdx.x;
    S->scan[SMP_PAD(t)] = v;
    __syncthreads();
    if (t < 32) {
        u64 run = 0;
        for (int i = 0; i < 16; i++) {
            u64 x = S->scan[t * 17 + i];
            S->scan[t * 17 + i] = run;
            run += x;
        }
        S->seg[t] = run;
    }
    __syncthreads();
    if (t == 0) {
        u64 run = 0;
        for (int i = 0; i < 32; i++) {
            u64 x = S->seg[i];
            S->seg[i] = run;
            run += x;
        }
        S->total = run;
    }
    __syncthreads();
    *excl = S->scan[SMP_PAD(t)] + S->seg[t >> 4];
    u64 total = S->total;
    __syncthreads();
    return total;
}

/* The largest v over the block; ends on a barrier. */
static __device__ u64 smp_max(smp_shared *S, u64 v)
{
    const int t = threadIdx.x;
    S->scan[SMP_PAD(t)] = v;
    __syncthreads();
    if (t < 32) {
        u64 m = 0;
        for (int i = 0; i < 16; i++)
            m = S->scan[t * 17 + i] > m ? S->scan[t * 17 + i] : m;
        S->seg[t] = m;
    }
    __syncthreads();
    if (t == 0) {
        u64 m = 0;
        for (int i = 0; i < 32; i++)
            m = S->seg[i] > m ? S->seg[i] : m;
        S->total = m;
    }
    __syncthreads();
    u64 r = S->total;
    __syncthreads();
    return r;
}

/* tot_c / tot_w[bin] = the sums of every thread's slot of that bin: the 32
 * threads of warp b fold bin b's 512 slots. */
static __device__ void smp_hist_sum(smp_shared *S)
{
    const int t = threadIdx.x, b = t >> 5, l = t & 31;
    u64 w = 0;
    unsigned c = 0;
    for (int i = 0; i < SMP_THREADS / 32; i++) {
        u64 v = S->hist[b][l + 32 * i];
        w += v & SMP_MMASK;
        c += (unsigned)(v >> SMP_CBIT);
    }
    S->pw[b][l] = w;
    S->pc[b][l] = c;
    __syncthreads();
    if (t < SMP_BINS) {
        u64 tw = 0;
        unsigned tc = 0;
        for (int i = 0; i < 32; i++) {
            tw += S->pw[t][i];
            tc += S->pc[t][i];
        }
        S->tot_w[t] = tw;
        S->tot_c[t] = tc;
    }
    __syncthreads();
}

/* Mass of the candidates passing F. */
static __device__ u64 smp_sum(const smp_row &R, smp_shared *S, const smp_filter &F)
{
    u64 own = 0, excl;
    smp_each(R, S, true, [&](unsigned key, int id, float pv) {
        float p;
        if (smp_pass(R, F, key, id, pv, true, &p))
            own += smp_weight(p);
    });
    return smp_scan(S, own, &excl);
}

/* Copies the candidates of the row that pass F with a key in [lo, hi]
 * (the caller counted them: at most SMP_CAP) into key/id, in id order;
 * from then on they are the source. */
static __device__ void smp_gather(const smp_row &R, smp_shared *S, const smp_filter &F,
                                  unsigned lo, unsigned hi)
{
    const int t = threadIdx.x, c = (R.n + SMP_THREADS - 1) / SMP_THREADS;
    const int a = smp_min(t * c, R.n), b = smp_min(a + c, R.n);
    u64 own = 0, excl;
    smp_range(R, S, a, b, F.min_p > 0, [&](unsigned key, int id, float pv) {
        float p;
        if (key >= lo && key <= hi && smp_pass(R, F, key, id, pv, false, &p))
            own++;
    });
    u64 total = smp_scan(S, own, &excl);
    int w = (int)excl;
    smp_range(R, S, a, b, F.min_p > 0, [&](unsigned key, int id, float pv) {
        float p;
        if (key >= lo && key <= hi && smp_pass(R, F, key, id, pv, false, &p)) {
            if (w < SMP_CAP) { /* never false; memory safety if the count were wrong */
                S->key[w] = key;
                S->id[w] = id;
            }
            w++;
        }
    });
    __syncthreads(); /* every read of the row is done before the source switches */
    if (t == 0)
        S->n_sh = total < SMP_CAP ? (int)total : SMP_CAP;
    __syncthreads();
}

/* Id-order walk over the candidates passing F (those at positions [lo,
 * hi) of the source: the whole source by default): the first at which the
 * running weight (1 each, or its mass) exceeds target, or, when frac >= 0,
 * frac * (total weight) as the host's u * sum. false when the total does not
 * exceed the target; else *id and *cum (the running weight including it). */
static __device__ bool smp_idscan(const smp_row &R, smp_shared *S, const smp_filter &F,
                                  bool mass, u64 target, double frac, int *id, u64 *cum,
                                  int lo = 0, int hi = -1)
{
    const int t = threadIdx.x;
    if (hi < 0)
        hi = S->n_sh >= 0 ? S->n_sh : R.n;
    u64 base = 0;
    for (bool first = true;; first = false) {
        const int c = (hi - lo + SMP_THREADS - 1) / SMP_THREADS;
        const int a = smp_min(lo + t * c, hi), b = smp_min(a + c, hi);
        u64 own = 0, excl;
        smp_range(R, S, a, b, mass || F.min_p > 0, [&](unsigned key, int i, float pv) {
            float p;
            if (smp_pass(R, F, key, i, pv, mass, &p))
                own += mass ? smp_weight(p) : 1;
        });
        u64 total = smp_scan(S, own, &excl);
        if (first && frac >= 0) {
            if (total == 0)
                return false;
            target = smp_target(frac, total);
        }
        if (total <= target)
            return false;
        if (smp_holds(own, excl, target)) {
            S->loc_lo = a;
            S->loc_hi = b;
            S->loc_excl = excl;
            S->loc_own = own;
        }
        __syncthreads();
        lo = S->loc_lo;
        hi = S->loc_hi;
        target -= S->loc_excl;
        base += S->loc_excl;
        const u64 own_loc = S->loc_own;
        __syncthreads(); /* loc_* are rewritten by the next level */
        if (hi - lo == 1) {
            if (S->n_sh >= 0) {
                *id = S->id[lo];
            } else {
                *id = lo;
            }
            *cum = base + own_loc;
            return true;
        }
    }
}

/* Descending walk (key, then id) over the candidates passing F: the first
 * at which the running weight (1 each, or its mass) exceeds target. false
 * when the total does not; else *b and *cum (the running weight including
 * it). While the source is the row, a bin that fits in shared memory is
 * gathered there: with everything above it for good (see the top), or
 * alone for the rest of this walk (the row is the source again after). */
static __device__ bool smp_select(const smp_row &R, smp_shared *S, const smp_filter &F,
                                  bool mass, u64 target, smp_bound *b, u64 *cum)
{
    const int t = threadIdx.x;
    unsigned prefix = 0;
    u64 above_w = 0, above_c = 0; /* weight of the bins above the current one */
    bool found = true, local = false;
    for (int shift = 28; shift >= 0; shift -= 4) {
        /* Only this thread reads or writes its slots until the barrier;
         * the previous pass's smp_hist_sum is past its last read of them. */
        for (int d = 0; d < SMP_BINS; d++)
            S->hist[d][t] = 0;
        smp_each(R, S, mass || F.min_p > 0, [&](unsigned key, int id, float pv) {
            float p;
            if ((shift < 28 && (key >> (shift + 4)) != prefix) ||
                !smp_pass(R, F, key, id, pv, mass, &p))
                return;
            S->hist[(key >> shift) & (SMP_BINS - 1)][t] +=
                (1ull << SMP_CBIT) | (mass ? smp_weight(p) : 0);
        });
        __syncthreads();
        smp_hist_sum(S);
        int sel = -1; /* every thread walks the same totals to the same bin */
        for (int d = SMP_BINS - 1; d >= 0; d--) {
            u64 w = mass ? S->tot_w[d] : S->tot_c[d];
            if ((mass ? above_w : above_c) + w > target) {
                sel = d;
                break;
            }
            above_w += S->tot_w[d];
            above_c += S->tot_c[d];
        }
        if (sel < 0) {
            found = false;
            break;
        }
        prefix = prefix << 4 | (unsigned)sel;
        /* tot_* are rewritten only after two barriers of the next pass */
        const unsigned lo = prefix << shift, hi = lo | ((1u << shift) - 1);
        if (S->n_sh < 0 && above_c + S->tot_c[sel] <= SMP_CAP) {
            smp_gather(R, S, F, lo, 0xffffffffu);
        } else if (S->n_sh < 0 && S->tot_c[sel] <= SMP_CAP) {
            smp_gather(R, S, F, lo, hi);
            local = true;
        }
    }
    if (found) {
        smp_filter G = F; /* the ties at the found value, in id order */
        G.tie = true;
        G.tie_key = prefix;
        const u64 above = mass ? above_w : above_c;
        u64 in_tie = 0;
        found = smp_idscan(R, S, G, mass, target - above, -1.0, &b->id, &in_tie);
        b->key = prefix;
        *cum = above + in_tie;
    }
    if (local) { /* back to the row */
        __syncthreads();
        if (t == 0)
            S->n_sh = -1;
        __syncthreads();
    }
    return found;
}

#ifdef CLLM_CUDA_EMU
/* What the fast path did (test_sample_emu): [0] walked the row after
 * all, [1] answered from its candidates, [2] walked one block's span. */
static long smp_emu_fast[3];
#endif

/* The fast path's workspace, per row (u64 units; zero between calls but
 * for the block counts): */
#define SMP_WS_BEST 0  /* cuk_best_key of the row (k_smp_max) */
#define SMP_WS_CNT 1   /* its non-NaN values (k_smp_max) */
#define SMP_WS_MASS 2  /* the sum of smp_weight(p) over them (k_smp_prob) */
#define SMP_WS_HIST 4  /* SMP_PBINS counts of p by binary exponent (k_smp_prob) */
#define SMP_PBINS 64
#define SMP_WS_BLK (SMP_WS_HIST + SMP_PBINS) /* candidates each block gathered */
#define SMP_MAX_BLOCKS 512                  /* preparation blocks a row at most */
#define SMP_WS_BMASS (SMP_WS_BLK + SMP_MAX_BLOCKS) /* each block's mass (k_smp_prob) */
#define SMP_WS (SMP_WS_BMASS + SMP_MAX_BLOCKS)

/* Bin of a probability p in [0, 1]: b for p in [2^-b, 2^(1-b)) (0: p = 1),
 * the last for 0 and anything under 2^-62. */
static __device__ __forceinline__ int smp_pbin(float p)
{
    const int e = (int)((__float_as_uint(p) >> 23) & 0xffu);
    const int b = 127 - e;
    return b < 0 ? 0 : b > SMP_PBINS - 1 ? SMP_PBINS - 1 : b;
}

/* Elements [*a, *e) of an n-element row: the span of preparation block b
 * of nblk, which k_smp_gather writes and the sampling block reads by. */
static __device__ __forceinline__ void smp_span(int n, int nblk, int b, int *a, int *e)
{
    const int per = (n + nblk - 1) / nblk;
    *a = smp_min(b * per, n);
    *e = smp_min(*a + per, n);
}

/* The largest bin B whose candidates (every p >= 2^-B) fit in shared
 * memory, from a row's histogram; -1 when even p = 1 does not. */
static __device__ __forceinline__ int smp_cut(const u64 *hist)
{
    u64 cum = 0;
    int cut = -1;
    for (int b = 0; b < SMP_PBINS - 1; b++) {
        cum += hist[b];
        if (cum > SMP_CAP)
            break;
        cut = b;
    }
    return cut;
}

/* The walks of the host sampler (see the top) over the candidates S holds,
 * or the row; *pick gets the answer (unchanged if a walk found nothing,
 * which the totals rule out). */
static __device__ void smp_walks(const smp_row &R, smp_shared *S, const cuk_sample_param &P,
                                 u64 m, int *pick)
{
    smp_filter F = {{0, INT_MAX}, {0, INT_MAX}, 0.0f, false, 0};
    const bool topk = smp_topk(P, m);
    u64 cum;
    if (!topk && !(P.top_p < 1)) { /* the host walks in id order */
        F.min_p = P.min_p > 0 ? P.min_p : 0.0f;
        int id;
        if (smp_idscan(R, S, F, true, 0, P.u, &id, &cum))
            *pick = id;
        return;
    }
    smp_bound b;
    if (topk && smp_select(R, S, F, false, (u64)P.top_k - 1, &b, &cum))
        F.k = b;
    u64 kept = smp_sum(R, S, F);
    if (P.top_p < 1) { /* the first where the running mass >= top_p * sum */
        double need = ceil((double)P.top_p * (double)kept);
        u64 nd = need < 1 ? 1 : (u64)need;
        if (nd <= kept && smp_select(R, S, F, true, nd - 1, &b, &cum)) {
            F.p = b;
            kept = cum;
        }
    }
    if (P.min_p > 0) {
        F.min_p = P.min_p;
        kept = smp_sum(R, S, F);
    }
    if (kept > 0 && smp_select(R, S, F, true, smp_target(P.u, kept), &b, &cum))
        *pick = b.id;
}

/* Sorted candidates (smp_walks_sorted): over entries [0, end) of wt, the
 * weights of the sorted candidates: *tot gets their sum; the first index
 * at which the running sum exceeds target (*cum the sum through it), or
 * -1 when the sum does not. */
static __device__ int smp_sorted_first(smp_shared *S, const u64 *wt, int end, u64 target,
                                       u64 *tot, u64 *cum)
{
    const int t = threadIdx.x, c = (end + SMP_THREADS - 1) / SMP_THREADS;
    const int a = smp_min(t * c, end), b = smp_min(a + c, end);
    u64 own = 0, excl;
    for (int i = a; i < b; i++)
        own += wt[i];
    const u64 total = smp_scan(S, own, &excl);
    *tot = total;
    if (total <= target)
        return -1;
    if (smp_holds(own, excl, target)) {
        u64 run = excl;
        for (int i = a; i < b; i++) {
            run += wt[i];
            if (run > target) {
                S->loc_lo = i;
                S->loc_own = run;
                break;
            }
        }
    }
    __syncthreads();
    const int i = S->loc_lo;
    *cum = S->loc_own;
    __syncthreads(); /* loc_* may be rewritten next */
    return i;
}

/* smp_walks on the fast path's candidates (descending walks only: top-k or
 * top-p on), sorted once in descending (key, id) order, so that each walk
 * is one prefix sum instead of a radix select's eight histogram passes:
 * the same answers, as every walk asks for the first candidate in that
 * order at which a running weight exceeds a target. false where an answer
 * might lie past the candidates. */
static __device__ bool smp_walks_sorted(const smp_row &R, smp_shared *S,
                                        const cuk_sample_param &P, u64 m, u64 row_mass,
                                        int *pick)
{
    const int t = threadIdx.x, c = S->n_sh;
    u64 *sk = (u64 *)S->hist, *wt = sk + SMP_CAP; /* the histograms' room, unused here */
    int np = 1;
    while (np < c)
        np <<= 1;
    for (int i = t; i < np; i += SMP_THREADS)
        sk[i] = i < c ? cuk_best_key(S->key[i], S->id[i]) : 0; /* 0: below every candidate */
    __syncthreads();
    for (int k = 2; k <= np; k <<= 1) /* bitonic, descending */
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = t; i < np; i += SMP_THREADS) {
                const int o = i ^ j;
                if (o > i) {
                    const u64 a = sk[i], b = sk[o];
                    if ((i & k) == 0 ? a < b : a > b) {
                        sk[i] = b;
                        sk[o] = a;
                    }
                }
            }
            __syncthreads();
        }
    for (int i = t; i < c; i += SMP_THREADS)
        wt[i] = smp_weight(smp_prob((unsigned)(sk[i] >> 32), R.max));
    __syncthreads();
    /* bounded: the walks' candidates end before the row's do */
    bool bounded = smp_topk(P, m);
    int end = c;
    u64 kept = row_mass, tot, cum;
    if (bounded) {
        if ((u64)P.top_k > (u64)c)
            return false;
        end = P.top_k;
        smp_sorted_first(S, wt, end, ~0ull, &kept, &cum);
    }
    if (P.top_p < 1) { /* the first where the running mass >= top_p * sum */
        double need = ceil((double)P.top_p * (double)kept);
        u64 nd = need < 1 ? 1 : (u64)need;
        if (nd <= kept) {
            const int i = smp_sorted_first(S, wt, end, nd - 1, &tot, &cum);
            if (i < 0)
                return false; /* the boundary lies past the candidates */
            end = i + 1;
            kept = cum;
            bounded = true;
        }
    }
    if (!bounded)
        return false;
    if (P.min_p > 0) { /* those under min_p weigh nothing from here on */
        for (int i = t; i < end; i += SMP_THREADS)
            if (smp_prob((unsigned)(sk[i] >> 32), R.max) < P.min_p)
                wt[i] = 0;
        __syncthreads();
        smp_sorted_first(S, wt, end, ~0ull, &kept, &cum);
    }
    if (kept > 0) {
        const int i = smp_sorted_first(S, wt, end, smp_target(P.u, kept), &tot, &cum);
        if (i >= 0)
            *pick = cuk_best_id(sk[i]);
    }
    return true;
}

/* The id-order walk over the whole row (temperature alone) from the
 * preparation's block masses: the block holding the host's target u *
 * row_mass, then the walk inside its span alone. */
static __device__ int smp_block_walk(const smp_row &R, smp_shared *S, const u64 *wsr, int nblk,
                                     double u, u64 row_mass)
{
    const int t = threadIdx.x;
    const u64 target = smp_target(u, row_mass);
    u64 excl;
    const u64 own = t < nblk ? wsr[SMP_WS_BMASS + t] : 0;
    smp_scan(S, own, &excl);
    if (smp_holds(own, excl, target)) {
        S->loc_lo = t;
        S->loc_excl = excl;
    }
    __syncthreads();
    const int blk = S->loc_lo;
    const u64 before = S->loc_excl;
    __syncthreads(); /* loc_* are the walk's next */
    smp_filter all = {{0, INT_MAX}, {0, INT_MAX}, 0.0f, false, 0};
    int id = -1, a, e;
    u64 cum;
    smp_span(R.n, nblk, blk, &a, &e);
    smp_idscan(R, S, all, true, target - before, -1.0, &id, &cum, a, e);
    return id;
}

/* S takes the candidates k_smp_gather left for this row: nblk blocks'
 * lists, each in id order, block after block (so id order in all). */
static __device__ void smp_load_cands(const smp_row &R, smp_shared *S, const int *cand,
                                      const u64 *wsr, int nblk)
{
    const int t = threadIdx.x;
    int *boff = (int *)S->hist; /* free until a histogram pass */
    u64 excl;
    const u64 c = t < nblk ? wsr[SMP_WS_BLK + t] : 0;
    const u64 total = smp_scan(S, c, &excl);
    if (t < nblk)
        boff[t] = (int)excl;
    __syncthreads();
    for (int o = t; o < (int)total && o < SMP_CAP; o += SMP_THREADS) {
        int lo = 0, hi = nblk - 1; /* the last block starting at or before o */
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (boff[mid] <= o)
                lo = mid;
            else
                hi = mid - 1;
        }
        int a, e;
        smp_span(R.n, nblk, lo, &a, &e);
        const int id = cand[a + (o - boff[lo])];
        S->key[o] = cuk_order_key(__fmul_rn(R.x[id], R.inv_t));
        S->id[o] = id;
    }
    __syncthreads();
    if (t == 0)
        S->n_sh = total < SMP_CAP ? (int)total : SMP_CAP;
    __syncthreads();
}

/* The fast path (cuk_sample_rows with a struct cuk_sample_ws: pr, ws and
 * cand all given): the row's best value, count, mass and probability
 * histogram from ws (SMP_WS u64 a row), its probabilities from pr and its
 * largest ones from cand (k_smp_gather, nblk blocks), read here and ws
 * zeroed for the next call. Without them (NULL) the block works it all
 * out from the row. */
__global__ void __launch_bounds__(SMP_THREADS)
    k_sample_rows(int *out, const float *x, int n, const struct cuk_sample_param *ps,
                  const float *pr, u64 *ws, const int *cand, int nblk)
{
    cuk_pdl_start();
    extern __shared__ __align__(16) unsigned char smp_smem[];
    smp_shared *S = (smp_shared *)smp_smem;
    const struct cuk_sample_param P = ps[blockIdx.x];
    const size_t off = (size_t)blockIdx.x * (size_t)n;
    smp_row R = {x + off, pr ? pr + off : NULL, n, P.greedy ? 1.0f : P.inv_t, 0.0f};
    u64 *wsr = ws ? ws + (size_t)blockIdx.x * SMP_WS : NULL;
    const int t = threadIdx.x;
    if (t == 0)
        S->n_sh = -1;
    u64 best = 0, cnt = 0, excl, m, row_mass = 0;
    int cut = -1;
    if (wsr) {
        best = wsr[SMP_WS_BEST];
        m = wsr[SMP_WS_CNT];
        row_mass = wsr[SMP_WS_MASS];
        if (t == 0)
            S->cut = smp_cut(wsr + SMP_WS_HIST);
        __syncthreads(); /* every thread has read them */
        cut = S->cut;
        for (int i = t; i < SMP_WS_BLK; i += SMP_THREADS)
            wsr[i] = 0;
    } else {
        __syncthreads();
        /* The largest value (the lowest id among equals) and the candidates. */
        smp_each(R, S, false, [&](unsigned key, int id, float) {
            u64 v = cuk_best_key(key, id);
            best = v > best ? v : best;
            cnt++;
        });
        best = smp_max(S, best);
        m = smp_scan(S, cnt, &excl);
    }
    const int amax = cuk_best_id(best);
    R.max = cuk_order_value((unsigned)(best >> 32));
    /* All NaN: 0. Greedy, or nothing to normalize (all -inf, or an
     * infinite maximum): the argmax. As sampler_pick. */
    if (m == 0 || P.greedy || (__float_as_uint(R.max) & 0x7fffffffu) == 0x7f800000u) {
        if (t == 0)
            out[blockIdx.x] = m == 0 ? 0 : amax;
        return;
    }
    int pick = amax; /* only if a walk found nothing, which the totals rule out */
    bool done = false;
    const bool id_order = !smp_topk(P, m) && !(P.top_p < 1);
    if (m > SMP_CAP && wsr && id_order && !(P.min_p > 0)) {
        const int id = smp_block_walk(R, S, wsr, nblk, P.u, row_mass);
        pick = id >= 0 ? id : pick;
        done = true;
#ifdef CLLM_CUDA_EMU
        if (t == 0)
            smp_emu_fast[2]++;
#endif
    } else if (m > SMP_CAP && cut >= 0) {
        smp_load_cands(R, S, cand + off, wsr, nblk);
        if (!id_order) {
            done = smp_walks_sorted(R, S, P, m, row_mass, &pick);
        } else if (P.min_p >= __uint_as_float((127u - cut) << 23)) {
            /* min-p: every token it keeps is a candidate, in id order */
            smp_walks(R, S, P, m, &pick);
            done = true;
        }
#ifdef CLLM_CUDA_EMU
        if (t == 0)
            smp_emu_fast[done]++;
#endif
        if (!done) { /* back to the row */
            __syncthreads();
            if (t == 0)
                S->n_sh = -1;
            __syncthreads();
        }
    }
    if (!done) {
        if (m <= SMP_CAP) { /* a small vocabulary: everything in shared memory */
            smp_filter all = {{0, INT_MAX}, {0, INT_MAX}, 0.0f, false, 0};
            smp_gather(R, S, all, 0, 0xffffffffu);
        }
        smp_walks(R, S, P, m, &pick);
    }
    if (t == 0)
        out[blockIdx.x] = pick;
}

#ifndef CLLM_CUDA_EMU
/* ---- The fast path's preparation, over the whole device, where the
 * sampling block alone on its SM would walk the row again and again (H200,
 * 0.6B, top-p: ~800 us a step; docs/benchmarks.md, eighteenth pass): the
 * rows' maxima (k_smp_max), their probabilities, masses and a histogram of
 * the probabilities by binary exponent (k_smp_prob), and the largest
 * probabilities that fit the sampling block's shared memory, gathered in
 * id order (k_smp_gather). Block b of row r (blockIdx.y) takes the
 * elements of smp_span(n, gridDim.x, b). */
#define SMP_PREP_THREADS 256
#define SMP_PREP_WARPS (SMP_PREP_THREADS / 32)

/* The block's sum of v (every thread's), at thread 0. */
static __device__ __forceinline__ u64 smp_block_sum(u64 v, u64 *part)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int i = 1; i < SMP_PREP_WARPS; i++)
            v += part[i];
    return v;
}

/* ws row r: the largest cuk_best_key and the non-NaN count. */
__global__ void __launch_bounds__(SMP_PREP_THREADS)
    k_smp_max(const float *x, int n, const struct cuk_sample_param *ps, u64 *ws)
{
    cuk_pdl_start();
    __shared__ u64 sb[SMP_PREP_WARPS], sc[SMP_PREP_WARPS];
    const int r = blockIdx.y;
    const float inv_t = ps[r].greedy ? 1.0f : ps[r].inv_t;
    const float *row = x + (size_t)r * n;
    int a, b;
    smp_span(n, (int)gridDim.x, (int)blockIdx.x, &a, &b);
    u64 best = 0, cnt = 0;
    for (int j = a + threadIdx.x; j < b; j += SMP_PREP_THREADS) {
        const float y = __fmul_rn(row[j], inv_t);
        if (smp_is_nan(y))
            continue;
        const u64 v = cuk_best_key(cuk_order_key(y), j);
        best = v > best ? v : best;
        cnt++;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const u64 v = __shfl_xor_sync(0xffffffffu, best, o);
        best = v > best ? v : best;
    }
    if ((threadIdx.x & 31) == 0)
        sb[threadIdx.x >> 5] = best;
    cnt = smp_block_sum(cnt, sc); /* its barrier covers sb too */
    if (threadIdx.x == 0) {
        for (int i = 1; i < SMP_PREP_WARPS; i++)
            best = sb[i] > best ? sb[i] : best;
        u64 *w = ws + (size_t)r * SMP_WS;
        if (best)
            atomicMax((unsigned long long *)&w[SMP_WS_BEST], (unsigned long long)best);
        if (cnt)
            atomicAdd((unsigned long long *)&w[SMP_WS_CNT], (unsigned long long)cnt);
    }
}

/* pr row r = smp_prob of each element (0 for NaN, which no walk reads);
 * ws row r: the mass, the block's own mass and the histogram. Sampled rows
 * only. */
__global__ void __launch_bounds__(SMP_PREP_THREADS)
    k_smp_prob(const float *x, int n, const struct cuk_sample_param *ps, u64 *ws, float *pr)
{
    cuk_pdl_start();
    __shared__ unsigned hist[SMP_PBINS];
    __shared__ u64 part[SMP_PREP_WARPS];
    const int r = blockIdx.y;
    if (ps[r].greedy)
        return;
    u64 *w = ws + (size_t)r * SMP_WS;
    const float inv_t = ps[r].inv_t, mx = cuk_order_value((unsigned)(w[SMP_WS_BEST] >> 32));
    const float *row = x + (size_t)r * n;
    float *out = pr + (size_t)r * n;
    for (int i = threadIdx.x; i < SMP_PBINS; i += SMP_PREP_THREADS)
        hist[i] = 0;
    __syncthreads();
    int a, b;
    smp_span(n, (int)gridDim.x, (int)blockIdx.x, &a, &b);
    u64 mass = 0;
    for (int j = a + threadIdx.x; j < b; j += SMP_PREP_THREADS) {
        const float y = __fmul_rn(row[j], inv_t);
        float p = 0.0f;
        if (!smp_is_nan(y)) {
            p = smp_prob(cuk_order_key(y), mx);
            mass += smp_weight(p);
            atomicAdd(&hist[smp_pbin(p)], 1u);
        }
        out[j] = p;
    }
    mass = smp_block_sum(mass, part); /* its barrier covers hist too */
    if (threadIdx.x == 0) {
        w[SMP_WS_BMASS + blockIdx.x] = mass;
        if (mass)
            atomicAdd((unsigned long long *)&w[SMP_WS_MASS], (unsigned long long)mass);
    }
    for (int i = threadIdx.x; i < SMP_PBINS; i += SMP_PREP_THREADS)
        if (hist[i])
            atomicAdd((unsigned long long *)&w[SMP_WS_HIST + i], (unsigned long long)hist[i]);
}

/* cand row r, from the block's first element on: the ids of its elements
 * with p >= 2^-cut (smp_cut), in id order; ws: their count. Sampled rows
 * only. */
__global__ void __launch_bounds__(SMP_PREP_THREADS)
    k_smp_gather(int n, const struct cuk_sample_param *ps, u64 *ws, const float *pr, int *cand)
{
    cuk_pdl_start();
    __shared__ int cut_s, wcount[SMP_PREP_WARPS];
    const int r = blockIdx.y;
    if (ps[r].greedy)
        return;
    u64 *w = ws + (size_t)r * SMP_WS;
    if (threadIdx.x == 0)
        cut_s = smp_cut(w + SMP_WS_HIST);
    __syncthreads();
    const int cut = cut_s, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int a, b;
    smp_span(n, (int)gridDim.x, (int)blockIdx.x, &a, &b);
    const float *p = pr + (size_t)r * n;
    int *dst = cand + (size_t)r * n + a, total = 0;
    for (int base = a; base < b && cut >= 0; base += SMP_PREP_THREADS) {
        const int j = base + threadIdx.x;
        const bool take = j < b && smp_pbin(p[j]) <= cut;
        const unsigned bal = __ballot_sync(0xffffffffu, take);
        if (lane == 0)
            wcount[warp] = __popc(bal);
        __syncthreads();
        int before = total, all = total;
        for (int i = 0; i < SMP_PREP_WARPS; i++) {
            before += i < warp ? wcount[i] : 0;
            all += wcount[i];
        }
        if (take)
            dst[before + __popc(bal & ((1u << lane) - 1))] = j;
        total = all;
        __syncthreads(); /* wcount is rewritten next round */
    }
    if (threadIdx.x == 0)
        w[SMP_WS_BLK + blockIdx.x] = (u64)total;
}

extern "C" size_t cuk_sample_ws_bytes(int rows)
{
    return (size_t)rows * SMP_WS * sizeof(u64);
}

extern "C" cudaError_t cuk_sample_rows(cudaStream_t s, int *out, const float *x, int rows, int n,
                                       const struct cuk_sample_param *ps,
                                       const struct cuk_sample_ws *fw)
{
    if (n < 1 || n > CUK_SAMPLE_MAX_N || rows < 1 || rows > 65535 ||
        (fw && (!fw->pr || !fw->ws || !fw->cand)))
        return cudaErrorInvalidValue;
    const int smem = (int)sizeof(smp_shared);
    /* Over the 48 KiB default: opted into per call (cheap, and per device). */
    cudaError_t err = cudaFuncSetAttribute(k_sample_rows,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess)
        return err;
    int per_row = 0;
    if (fw) {
        /* the caller's blocks, each at least 2048 elements */
        per_row = cuk_row_blocks(fw->blocks, rows, n, 2048, SMP_MAX_BLOCKS);
        const dim3 grid((unsigned)per_row, (unsigned)rows);
        u64 *ws = (u64 *)fw->ws;
        cuk_launch(k_smp_max, grid, SMP_PREP_THREADS, 0, s, x, n, ps, ws);
        cuk_launch(k_smp_prob, grid, SMP_PREP_THREADS, 0, s, x, n, ps, ws, fw->pr);
        cuk_launch(k_smp_gather, grid, SMP_PREP_THREADS, 0, s, n, ps, ws, (const float *)fw->pr,
                   fw->cand);
    }
    cuk_launch(k_sample_rows, rows, SMP_THREADS, (size_t)smem, s, out, x, n, ps,
               (const float *)(fw ? fw->pr : NULL), (u64 *)(fw ? fw->ws : NULL),
               (const int *)(fw ? fw->cand : NULL), per_row);
    return cudaGetLastError();
}
#endif
