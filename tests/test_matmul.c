/* test_matmul.c - the CPU matmul kernels against the double-precision
 * reference (every dtype x every ISA this machine runs x odd shapes and
 * token counts x 1-3 threads), Q8_0 conversions, and the thread pool. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_impl.h"
#include "backend/cpu/unpack.h"
#include "base/half.h"
#include "model/quant.h"
#include "base/threadpool.h"
#include "testutil.h"

/* Unit roundoff of f32. */
#define U32 (1.0 / 16777216.0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Uniform in [-1, 1). */
static float rng_f(void) { return (float)rng_u32() / 2147483648.0f - 1.0f; }

/* ---- thread pool ---- */

/* One run's record: how often each ith was called, and by which threads. */
struct tp_probe {
    atomic_int hits[8];
    atomic_int bad_nth;
    int want_nth;
    pthread_t caller;
    atomic_int by_caller; /* calls made on the thread that called tp_run */
};

static void tp_probe_fn(void *ctx, int ith, int nth)
{
    struct tp_probe *p = ctx;
    if (nth != p->want_nth || ith < 0 || ith >= nth)
        atomic_fetch_add(&p->bad_nth, 1);
    else
        atomic_fetch_add(&p->hits[ith], 1);
    if (pthread_equal(pthread_self(), p->caller))
        atomic_fetch_add(&p->by_caller, 1);
}

/* Runs the pool `runs` times, each run with a fresh probe (so a call made
 * with an earlier run's ctx shows as a miscount), and checks that every ith
 * was called exactly once in each run. Returns how many runs had the
 * caller make more than one of the calls, or -1 after a failure. */
static int tp_check_runs(struct threadpool *tp, int runs, const char *what)
{
    int n = tp_size(tp), several = 0;
    struct tp_probe probes[2];
    for (int r = 0; r < runs; r++) {
        struct tp_probe *p = &probes[r & 1];
        memset(p, 0, sizeof *p);
        p->want_nth = n;
        p->caller = pthread_self();
        tp_run(tp, tp_probe_fn, p);
        bool ok = atomic_load(&p->bad_nth) == 0;
        for (int i = 0; i < n; i++)
            ok = ok && atomic_load(&p->hits[i]) == 1;
        if (!ok) {
            CHECK(false, "%s, pool of %d, run %d: bad ith/nth %d, ith 0 called %d times, ith %d %d times",
                  what, n, r, atomic_load(&p->bad_nth), atomic_load(&p->hits[0]), n - 1,
                  atomic_load(&p->hits[n - 1]));
            return -1;
        }
        several += atomic_load(&p->by_caller) > 1;
    }
    return several;
}

static void test_threadpool(void)
{
    struct err e;
    for (int n = 1; n <= 3; n++) {
        struct threadpool *tp = tp_create(n, &e);
        CHECK(tp != NULL, "tp_create(%d): %s", n, e.msg);
        if (!tp)
            continue;
        CHECK(tp_size(tp) == n, "tp_size %d != %d", tp_size(tp), n);
        tp_check_runs(tp, 2000, "back to back");
        /* Long enough for the workers to give up spinning and sleep: the
         * wake-up from the condition variable must work too. */
        for (int i = 0; i < 3; i++) {
            nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
            tp_check_runs(tp, 1, "after a sleep");
        }
        tp_destroy(tp);
    }

    /* More threads than CPUs, all on one CPU: workers are preempted at any
     * point, come late to a run or not at all, and the threads that do run
     * take the calls of those that do not. Every call must still be made
     * exactly once per run, with that run's ctx. The pool's threads inherit
     * the creating thread's CPU mask, which is restored after. */
    cpu_set_t before, one;
    if (sched_getaffinity(0, sizeof before, &before) == 0) {
        int cpu = 0;
        while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &before))
            cpu++;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "cannot limit the test to CPU %d", cpu);
        struct threadpool *tp = tp_create(6, &e);
        CHECK(tp != NULL, "tp_create(6) on one CPU: %s", e.msg);
        if (tp) {
            int several = tp_check_runs(tp, 3000, "6 threads on one CPU");
            printf("  pool of 6 on one CPU: the caller made several calls in %d of 3000 runs\n",
                   several);
            /* The caller takes the calls of workers that are not running: on
             * one CPU it nearly always gets through several before they are
             * scheduled (3000 of 3000 here). A pool that waits for each
             * worker to make its own call never does. */
            CHECK(several > 0, "on one CPU the caller never made the calls of absent workers");
            tp_destroy(tp);
        }
        sched_setaffinity(0, sizeof before, &before);
    }

    struct threadpool *tp = tp_create(0, &e);
    CHECK(tp && tp_size(tp) >= 1, "tp_create(0) uses the online CPUs");
    tp_destroy(tp);
    tp_destroy(NULL);
}

/* ---- Q8_0 conversions ---- */

static void test_q8_0_roundtrip(void)
{
    CHECK(sizeof(struct block_q8_0) == 34, "block_q8_0 is %zu bytes, GGUF needs 34",
          sizeof(struct block_q8_0));
    enum { N = 32 * 64 };
    float x[N], y[N];
    struct block_q8_0 q[N / 32];
    for (int i = 0; i < N; i++)
        x[i] = rng_f() * (float)(1 << (i / 32 % 12)) / 64.0f;
    for (int i = 64; i < 96; i++) /* an all-zero block: scale 0, no NaN */
        x[i] = 0.0f;
    for (int i = 0; i < 32; i++) /* a ramp with a known quantization */
        x[i] = (float)i;
    quantize_row_q8_0(x, q, N);
    dequantize_row_q8_0(q, y, N);
    CHECK(q[0].qs[31] == 127 && q[0].qs[0] == 0 && fabsf(f16_to_f32(q[0].d) - 31.0f / 127) < 1e-4f,
          "ramp block: d=%g qs[31]=%d", f16_to_f32(q[0].d), q[0].qs[31]);
    CHECK(q[2].d == 0 && y[70] == 0.0f, "zero block gives d=0 and zeros");
    int bad = 0;
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[b * 32 + i]));
        /* Rounding to the grid costs d/2; storing d as f16 moves the grid by
         * at most 127 * d * 2^-11 (f16 has 11 significant bits). */
        double d = amax / 127.0;
        double tol = d * (0.5 + 127.0 / 2048.0) + 1e-12;
        for (int i = 0; i < 32; i++)
            if (fabs((double)x[b * 32 + i] - y[b * 32 + i]) > tol)
                bad++;
    }
    CHECK(bad == 0, "%d values off by more than the Q8_0 rounding bound", bad);
}

/* ---- matmul vs reference ---- */

struct shape {
    int64_t rows, cols;
};

/* Random weights of dtype dt; the caller frees. For Q8_0 the full int8
 * range, -128 included (legal in files though ggml never writes it). */
static void *make_weights(enum dtype dt, int64_t rows, int64_t cols)
{
    size_t rb = dtype_row_bytes(dt, cols);
    uint8_t *w = malloc(rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = w + (size_t)r * rb;
        for (int64_t k = 0; k < cols; k++) {
            float v = rng_f();
            if (dt == DT_F32)
                ((float *)row)[k] = v;
            else if (dt == DT_F16)
                ((uint16_t *)row)[k] = f32_to_f16(v);
            else if (dt == DT_BF16)
                ((uint16_t *)row)[k] = f32_to_bf16(v);
        }
        if (quant_is_low_bit(dt)) { /* valid blocks of values of several magnitudes */
            float *v = malloc(sizeof(float) * (size_t)cols);
            for (int64_t k = 0; k < cols; k++)
                v[k] = rng_f() * (float)(1 + (k / 32) % 3) / 8.0f;
            quant_quantize_row(dt, v, row, cols);
            free(v);
        }
        if (dt == DT_Q8_0) {
            struct block_q8_0 *b = (struct block_q8_0 *)row;
            for (int64_t i = 0; i < cols / 32; i++) {
                b[i].d = f32_to_f16(rng_f() / 64.0f);
                for (int k = 0; k < 32; k++)
                    b[i].qs[k] = (int8_t)(rng_u32() & 0xff);
            }
        }
    }
    return w;
}

/* Per output, the bound the kernel must meet (see check_against_ref);
 * wrow is the weight row widened to f32, split (the integer-code formats,
 * else NULL) each value's |s u| + |m| (unpack.h). */
static double tolerance(enum dtype dt, const float *wrow, const float *split, const float *x,
                        int64_t cols, bool x_bf16)
{
    double abssum = 0, qerr = 0;
    for (int64_t k = 0; k < cols; k++)
        abssum += fabs((double)x[k]) * (split ? split[k] : fabs(wrow[k]));
    if (x_bf16) /* x rounded to bf16: 2^-8 of each |x| at most */
        qerr = abssum / 256.0;
    if (dt == DT_Q8_0 || split) {
        for (int64_t b = 0; b < cols / 32; b++) {
            double amax = 0, wabs = 0;
            for (int k = 0; k < 32; k++) {
                amax = fmax(amax, fabs(x[b * 32 + k]));
                wabs += fabs(wrow[b * 32 + k]);
            }
            qerr += 0.501 * (amax / 127.0) * wabs;
        }
    }
    return qerr + (double)(cols + 32) * U32 * (abssum + qerr) + 1e-30;
}

/* Value k of an unpacked row (unpack.h): its code, returned, and its
 * group's s and m */
static int unpacked_value(const uint8_t *row, int64_t k, float *s, float *m)
{
    const uint8_t *g = row + (size_t)(k / UNPACK_GROUP) * UNPACK_GROUP_BYTES;
    const int v = (int)(k % UNPACK_GROUP);
    memcpy(s, g + 64 + 4 * (v / 4), 4);
    memcpy(m, g + 128 + 4 * (v / 4), 4);
    return g[v];
}

/* For an integer-code format, each value's |s u| + |m| (the magnitudes
 * the kernels' sums meet, not just |s u - m|), from the reference
 * unpacking; NULL for the others. */
static float *split_weights(const struct tensor *w)
{
    if (w->dtype == DT_Q8_0) { /* as the VNNI panels take it: code q + 128, m = 128 d */
        float *all = malloc(sizeof(float) * (size_t)(w->rows * w->cols));
        const size_t rb = dtype_row_bytes(w->dtype, w->cols);
        for (int64_t r = 0; r < w->rows; r++) {
            const struct block_q8_0 *b =
                (const struct block_q8_0 *)((const uint8_t *)w->data + (size_t)r * rb);
            for (int64_t k = 0; k < w->cols; k++) {
                const float d = fabsf(f16_to_f32(b[k / 32].d));
                all[r * w->cols + k] = d * (float)(b[k / 32].qs[k % 32] + 128) + 128.0f * d;
            }
        }
        return all;
    }
    if (!quant_is_low_bit(w->dtype))
        return NULL;
    float *all = malloc(sizeof(float) * (size_t)(w->rows * w->cols));
    uint8_t *grp = malloc(unpack_row_bytes(w->cols));
    const size_t rb = dtype_row_bytes(w->dtype, w->cols);
    for (int64_t r = 0; r < w->rows; r++) {
        cpu_unpack_ref(w->dtype, (const uint8_t *)w->data + (size_t)r * rb, grp, w->cols);
        for (int64_t k = 0; k < w->cols; k++) {
            float sv, mv;
            const int u = unpacked_value(grp, k, &sv, &mv);
            all[r * w->cols + k] = fabsf(sv) * (float)u + fabsf(mv);
        }
    }
    free(grp);
    return all;
}

/* The weights widened to f32 (exact for every dtype), for the bounds:
 * quant_dequantize_row, the one widening of a row of any dtype. */
static float *widen_weights(const struct tensor *w)
{
    float *all = malloc(sizeof(float) * (size_t)(w->rows * w->cols));
    size_t rb = dtype_row_bytes(w->dtype, w->cols);
    for (int64_t r = 0; r < w->rows; r++)
        quant_dequantize_row(w->dtype, (const uint8_t *)w->data + (size_t)r * rb,
                             all + r * w->cols, w->cols);
    return all;
}

/* Tolerances. f32/f16/bf16: the weights widen to f32 exactly, so the only
 * error is f32 summation of cols products in some order (lanes, tiles,
 * FMA): the classic bound is cols * u * sum|x_k w_k|, u = 2^-24; +32 covers
 * the final lane reduction and the store. q8_0: the kernel rounds each x to
 * its block's grid, an error of at most d/2 per value with d = absmax/127
 * (0.501: the 1/d used for rounding is itself rounded), weighted by |w|;
 * the integer block sums are exact, and the per-block f32 scaling and
 * accumulation adds the same summation term as above. */
static int check_against_ref(const struct tensor *w, int n, const float *out, const float *ref,
                             const double *tol, const char *what)
{
    int bad = 0;
    for (int64_t i = 0; i < n * w->rows; i++) {
        if (!(fabs((double)out[i] - ref[i]) <= tol[i])) {
            if (bad++ < 3)
                fprintf(stderr, "%s: out[%lld][%lld] = %.9g, ref %.9g, tol %.3g\n", what,
                        (long long)(i / w->rows), (long long)(i % w->rows), out[i], ref[i],
                        tol[i]);
        }
    }
    return bad;
}

static void fill_x(float *x, int n, int64_t cols)
{
    for (int64_t i = 0; i < n * cols; i++)
        x[i] = rng_f();
    /* One block of zeros and one of large values: scale-0 blocks and blocks
     * whose scale differs wildly from their neighbours. */
    if (cols >= 64) {
        for (int k = 0; k < 32; k++) {
            x[k] = 0.0f;
            x[32 + k] *= 1000.0f;
        }
    }
}

static void test_shape(enum dtype dt, struct shape s, const int *ns, int n_ns,
                       struct threadpool **pools, int n_pools)
{
    int nmax = 0;
    for (int i = 0; i < n_ns; i++)
        nmax = ns[i] > nmax ? ns[i] : nmax;
    void *wdata = make_weights(dt, s.rows, s.cols);
    struct tensor w = {dt, s.rows, s.cols, wdata};
    float *wide = widen_weights(&w), *split = split_weights(&w);
    float *x = malloc(sizeof(float) * (size_t)(nmax * s.cols));
    float *ref = malloc(sizeof(float) * (size_t)(nmax * s.rows));
    double *tol = malloc(sizeof(double) * (size_t)(2 * nmax * s.rows));
    float *out = malloc(sizeof(float) * (size_t)(nmax * s.rows));
    enum cpu_isa hw = cpu_isa_hw();
    for (int ni = 0; ni < n_ns; ni++) {
        int n = ns[ni];
        fill_x(x, n, s.cols);
        cpu_matmul_ref(ref, x, n, &w);
        for (int t = 0; t < n; t++)
            for (int64_t r = 0; r < s.rows; r++)
                tol[t * s.rows + r] = tolerance(dt, wide + r * s.cols,
                                                split && dt != DT_Q8_0 ? split + r * s.cols : NULL,
                                                x + t * s.cols, s.cols, false);
        /* the same with x rounded to bf16: prompts on bf16 weights where
         * the CPU has bf16 dot products (matmul.h's bf16dot) */
        const bool bf16dot = dt == DT_BF16 && hw == CPU_ISA_AVX512 && cpu_has_avx512_bf16() &&
                             n >= CPU_MATMUL_BF16DOT_MIN_TOKENS;
        /* the other bound: x rounded to bf16 (bf16dot), or Q8_0's values
         * split as the VNNI panels take them (prompts) */
        const bool q8_panels = dt == DT_Q8_0 && hw == CPU_ISA_AVX512 && cpu_has_avx512_vnni() &&
                               n >= MM_PANEL_MIN_TOKENS;
        double *tol_alt = tol + (size_t)nmax * s.rows;
        for (int t = 0; (bf16dot || q8_panels) && t < n; t++)
            for (int64_t r = 0; r < s.rows; r++)
                tol_alt[t * s.rows + r] = tolerance(dt, wide + r * s.cols,
                                                    q8_panels ? split + r * s.cols : NULL,
                                                    x + t * s.cols, s.cols, bf16dot);
        /* isa = hw + 1 stands for AVX-512 without VNNI, whose Q8_0 falls
         * back to the AVX2 kernel (the CI machine may be one). */
        int last = hw == CPU_ISA_AVX512 && cpu_has_avx512_vnni() ? (int)hw + 1 : (int)hw;
        for (int isa = CPU_ISA_SCALAR; isa <= last; isa++) {
            /* p >= n_pools, one thread: the code tiles instead of the
             * direct kernels' passes and the panels (CLLM_CPU_QDIRECT=0,
             * CLLM_CPU_QPANEL=0), or bf16 on f32 FMAs instead of bf16 dot
             * products (CLLM_CPU_BF16DOT=0) */
            const bool rounds = bf16dot && isa >= (int)CPU_ISA_AVX512;
            const bool panels = q8_panels && isa == (int)CPU_ISA_AVX512;
            const bool tiles_too =
                (isa >= (int)CPU_ISA_AVX2 && quant_is_low_bit(dt)) || rounds || panels;
            for (int p = 0; p < n_pools + (tiles_too ? 1 : 0); p++) {
                struct cpu_matmul mm;
                struct err e;
                int novnni = isa > (int)hw;
                CHECK(cpu_matmul_init(&mm, pools[p < n_pools ? p : 0],
                                      novnni ? hw : (enum cpu_isa)isa, &e) == 0,
                      "init: %s", e.msg);
                if (novnni)
                    mm.vnni = 0;
                if (p >= n_pools)
                    mm.panel = mm.bf16dot = mm.direct = 0;
                for (int64_t i = 0; i < n * s.rows; i++)
                    out[i] = NAN;
                int rc = cpu_matmul(&mm, out, x, n, &w, &e);
                CHECK(rc == 0, "cpu_matmul: %s", e.msg);
                char what[128];
                const char *isa_name = novnni ? "avx512-novnni" : cpu_isa_name((enum cpu_isa)isa);
                snprintf(what, sizeof what, "%s %s%s n=%d %lldx%lld threads=%d", dtype_name(dt),
                         isa_name, p < n_pools ? "" : rounds ? " f32-fma" : " tiles", n,
                         (long long)s.rows, (long long)s.cols,
                         tp_size(pools[p < n_pools ? p : 0]));
                int bad = check_against_ref(&w, n, out, ref,
                                            (rounds || panels) && p < n_pools ? tol_alt : tol,
                                            what);
                CHECK(bad == 0, "%s: %d outputs outside tolerance", what, bad);
                cpu_matmul_free(&mm);
            }
        }
    }
    free(out);
    free(wide);
    free(split);
    free(tol);
    free(ref);
    free(x);
    free(wdata);
}

static void test_matmul_all(void)
{
    struct err e;
    struct threadpool *pools[3];
    for (int i = 0; i < 3; i++)
        pools[i] = tp_create(i + 1, &e);
    /* Row counts straddle tile (4) and chunk (16) multiples; cols for
     * f32/f16/bf16 hit every remainder class of 8 and 16 lanes. */
    const struct shape fshapes[] = {{1, 1}, {5, 7}, {3, 17}, {37, 100}, {67, 129},
                                    {200, 40}, {19, 1000}, {6, 4099}};
    const struct shape qshapes[] = {{1, 32}, {5, 64}, {37, 96}, {67, 160}, {200, 64},
                                    {19, 1024}, {6, 4096}, {9, 12288}};
    /* 1-4 take the streaming kernels, the rest the tiles (the 2-6-bit
     * formats: 7 the direct kernels' passes, 33 and 130 the panels, and
     * both the tiles in the one-thread variant); 130 spans several token
     * groups for the widest shapes. */
    /* the widened formats: rows of their blocks, tiles and slabs (16 rows)
     * straddled; the 32-blocks take every block shape of Q8_0 */
    const struct shape kshapes[] = {{1, 256}, {5, 512}, {37, 256}, {67, 768}, {19, 1024},
                                    {6, 4096}};
    const int ns[] = {1, 3, 4, 7, 33, 130};
    for (int dt = 0; dt < DT_COUNT; dt++) {
        const bool k256 = dtype_block_elems((enum dtype)dt) == 256;
        const struct shape *sh = k256 ? kshapes : dt == DT_Q8_0 || quant_is_low_bit((enum dtype)dt) ? qshapes : fshapes;
        size_t count = k256 ? sizeof kshapes / sizeof *kshapes
                       : sh == qshapes ? sizeof qshapes / sizeof *qshapes
                                       : sizeof fshapes / sizeof *fshapes;
        for (size_t i = 0; i < count; i++)
            test_shape((enum dtype)dt, sh[i], ns, 6, pools, 3);
    }
    for (int i = 0; i < 3; i++)
        tp_destroy(pools[i]);
}

/* bf16 weights' prompts round x to bf16 (nearest, ties to even) where the
 * CPU has bf16 dot products; fewer tokens, or bf16dot off, keep f32 x.
 * Weights of 1 and a constant x make every sum exact, so the outputs name
 * the x the kernel used. */
static void test_bf16dot_rounding(void)
{
    if (cpu_isa_hw() < CPU_ISA_AVX512 || !cpu_has_avx512_bf16()) {
        printf("test_bf16dot_rounding: skipped: this CPU has no AVX512_BF16\n");
        return;
    }
    enum { ROWS = 5, COLS = 64, NT = CPU_MATMUL_BF16DOT_MIN_TOKENS };
    /* x, and x rounded to bf16 (8 significant bits): down; a tie to the
     * even 1; a tie to the even 1 + 2^-6; up to 1 + 2^-7 */
    const float v[4] = {1.0f + 3.0f / 1024, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256,
                        1.0f + 5.0f / 512};
    const float rv[4] = {1.0f, 1.0f, 1.0f + 1.0f / 64, 1.0f + 1.0f / 128};
    uint16_t wdata[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++)
        wdata[i] = f32_to_bf16(1.0f);
    struct tensor w = {DT_BF16, ROWS, COLS, wdata};
    static float x[NT * COLS], out[NT * ROWS];
    for (int t = 0; t < NT; t++)
        for (int k = 0; k < COLS; k++)
            x[t * COLS + k] = v[t % 4];
    struct { int n, on; bool rounded; } cases[] = {{NT, 1, true}, {NT - 1, 1, false},
                                                   {NT, 0, false}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        struct cpu_matmul mm;
        struct err e;
        CHECK(cpu_matmul_init(&mm, NULL, CPU_ISA_AVX512, &e) == 0, "init: %s", e.msg);
        CHECK(mm.bf16dot == 1, "bf16dot off on a CPU with AVX512_BF16");
        mm.bf16dot = cases[c].on;
        CHECK(cpu_matmul(&mm, out, x, cases[c].n, &w, &e) == 0, "cpu_matmul: %s", e.msg);
        int bad = 0;
        for (int t = 0; t < cases[c].n; t++)
            for (int r = 0; r < ROWS; r++) {
                const float want = COLS * (cases[c].rounded ? rv[t % 4] : v[t % 4]);
                if (out[t * ROWS + r] != want && bad++ < 3)
                    fprintf(stderr, "bf16dot n=%d on=%d: out[%d][%d] = %.9g, want %.9g\n",
                            cases[c].n, cases[c].on, t, r, out[t * ROWS + r], want);
            }
        CHECK(bad == 0, "bf16dot n=%d on=%d: %d outputs not from the %s x", cases[c].n,
              cases[c].on, bad, cases[c].rounded ? "bf16-rounded" : "f32");
        cpu_matmul_free(&mm);
    }
}

static void test_matmul_errors(void)
{
    struct cpu_matmul mm;
    struct err e;
    CHECK(cpu_matmul_init(&mm, NULL, CPU_ISA_SCALAR, &e) == 0, "init without a pool");
    struct block_q8_0 blk[2] = {0};
    float x[48] = {0}, out[1];
    struct tensor w = {DT_Q8_0, 1, 48, blk};
    CHECK(cpu_matmul(&mm, out, x, 1, &w, &e) == -1 && strstr(e.msg, "multiple"),
          "q8_0 with cols %% 32 != 0 is refused: %s", e.msg);
    w.data = NULL;
    CHECK(cpu_matmul(&mm, out, x, 1, &w, &e) == -1, "missing weight is refused");
    cpu_matmul_free(&mm);
    if (cpu_isa_hw() < CPU_ISA_AVX512)
        CHECK(cpu_matmul_init(&mm, NULL, CPU_ISA_AVX512, &e) == -1,
              "asking for an ISA the CPU lacks fails");
}

/* GGUF's 2-6-bit formats with the offsets of each block's f16 fields
 * (scales, mins), which random blocks must hold finite. */
static const struct {
    enum dtype dt;
    int f16_at[2], n_f16;
} low_bit_fm[] = {{DT_Q4_0, {0}, 1}, {DT_Q4_1, {0, 2}, 2}, {DT_Q5_0, {0}, 1},
                  {DT_Q5_1, {0, 2}, 2}, {DT_Q4_K, {0, 2}, 2}, {DT_Q5_K, {0, 2}, 2},
                  {DT_Q6_K, {208}, 1}, {DT_Q2_K, {80, 82}, 2}, {DT_Q3_K, {108}, 1}};
#define N_LOW_BIT_FM (sizeof low_bit_fm / sizeof low_bit_fm[0])

/* bytes of low_bit_fm[f]'s blocks of arbitrary bits, their f16 fields
 * small finite values (every seventh block's zero) */
static void random_blocks(size_t f, uint8_t *blk, size_t bytes)
{
    const enum dtype dt = low_bit_fm[f].dt;
    const size_t bb = dtype_row_bytes(dt, dtype_block_elems(dt));
    for (size_t i = 0; i < bytes; i++)
        blk[i] = (uint8_t)rng_u32();
    for (size_t b = 0; b < bytes / bb; b++)
        for (int k = 0; k < low_bit_fm[f].n_f16; k++) {
            uint16_t h = f32_to_f16(rng_f() * (b % 7 == 3 ? 0.0f : 0.05f));
            memcpy(blk + b * bb + low_bit_fm[f].f16_at[k], &h, 2);
        }
}

/* Every build of the unpacking (cpu_unpack_for) writes the reference's
 * bytes on blocks of arbitrary bits, and the reference's s u - m is the
 * widened value (quant_dequantize_row) up to the f32 rounding of ggml's
 * own sum: only the f16 scale fields are held to finite values (their
 * offsets in each format). Rows of 4096 and of 4064 (an odd count of
 * 32-blocks, a half group). */
static void test_unpack_builds(void)
{
    for (size_t f = 0; f < N_LOW_BIT_FM; f++) {
        const enum dtype dt = low_bit_fm[f].dt;
        const int64_t be = dtype_block_elems(dt), n = be == 32 ? 4064 : 4096;
        const size_t rb = dtype_row_bytes(dt, n);
        const size_t ub = unpack_row_bytes(n);
        uint8_t *blk = malloc(rb), *ref = malloc(ub), *got = malloc(ub);
        float *wide = malloc(sizeof(float) * (size_t)n);
        random_blocks(f, blk, rb);
        memset(ref, 0xAB, ub);
        cpu_unpack_ref(dt, blk, ref, n);
        quant_dequantize_row(dt, blk, wide, n);
        int off = 0, big = 0;
        for (int64_t k = 0; k < n; k++) {
            float sv, mv;
            const int u = unpacked_value(ref, k, &sv, &mv);
            const double val = (double)sv * u - mv, mag = fabs((double)sv * u) + fabs(mv);
            big += u > 63;
            off += !(fabs(val - wide[k]) <= 2.0 * U32 * mag);
        }
        CHECK(big == 0 && off == 0, "%s unpacked: %d codes above 63, %d values not the widened ones",
              dtype_name(dt), big, off);
        /* the half group past an odd count of 32-blocks is zeros */
        const uint8_t *last = ref + ub - UNPACK_GROUP_BYTES;
        if (n % UNPACK_GROUP) {
            int nz = 0;
            for (int i = 32; i < 64; i++)
                nz += last[i] != 0;
            for (int l = 8; l < 16; l++)
                for (int b = 0; b < 4; b++)
                    nz += (last[64 + 4 * l + b] != 0) + (last[128 + 4 * l + b] != 0);
            CHECK(nz == 0, "%s: %d bytes of the missing half group are not zero", dtype_name(dt), nz);
        }
        for (int isa = CPU_ISA_SCALAR; isa <= (int)cpu_isa_hw(); isa++) {
            memset(got, 0xCD, ub);
            cpu_unpack_for((enum cpu_isa)isa)(dt, blk, got, n);
            CHECK(memcmp(ref, got, ub) == 0, "%s unpacked by the %s build differs from the reference",
                  dtype_name(dt), cpu_isa_name((enum cpu_isa)isa));
        }
        free(blk);
        free(ref);
        free(got);
        free(wide);
    }
}

/* The AVX2 quantizer of the integer-code formats' activations writes
 * mm_codes_xq_quantize's bytes: random rows, a block of zeros, blocks of
 * exact ties (an absmax of 127, so halves round to even), tiny and large
 * magnitudes, and odd block counts (the missing half group). */
/* The AVX-512 builds of a panel (from Q8_0 blocks, and from unpacked
 * rows) write the portable builds' bytes: whole panels, short ones (rows
 * past ns zeros) and odd block counts. */
static void test_panel_builds(void)
{
    if (cpu_isa_hw() < CPU_ISA_AVX512) {
        printf("test_matmul: panel builds skipped: no AVX-512\n");
        return;
    }
    static const struct { int64_t ns, cols; } cases[] = {
        {16, 64}, {16, 1024}, {16, 3072}, {16, 96}, {5, 1024}, {1, 64}, {15, 4096}};
    int panels = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const int64_t cols = cases[c].cols;
        const size_t stride = dtype_row_bytes(DT_Q8_0, cols) + 6; /* rows not packed */
        uint8_t *rows = malloc(stride * MM_PANEL_ROWS);
        for (size_t i = 0; i < stride * MM_PANEL_ROWS; i++)
            rows[i] = (uint8_t)rng_u32();
        for (int64_t r = 0; r < MM_PANEL_ROWS; r++) { /* finite scales */
            struct block_q8_0 *b = (struct block_q8_0 *)(rows + (size_t)r * stride);
            for (int64_t ib = 0; ib < cols / 32; ib++) {
                struct block_q8_0 blk;
                memcpy(&blk, &b[ib], sizeof blk);
                blk.d = f32_to_f16(rng_f());
                memcpy(&b[ib], &blk, sizeof blk);
            }
        }
        const size_t pb = mm_panel_bytes(cols);
        uint8_t *ref = malloc(pb), *got = malloc(pb);
        memset(got, 0xa5, pb);
        mm_panel_build_q8_0(rows, stride, cases[c].ns, cols, ref);
        mm_panel_build_q8_0_avx512(rows, stride, cases[c].ns, cols, got);
        CHECK(memcmp(ref, got, pb) == 0, "Q8_0 panel of %lld rows x %lld: builds differ",
              (long long)cases[c].ns, (long long)cols);
        /* the code formats' build, from rows of random bytes in the
         * unpacked layout (every byte lands somewhere) */
        const size_t ub = unpack_row_bytes(cols) + 64; /* rows not packed */
        uint8_t *slab = malloc(ub * MM_PANEL_ROWS);
        for (size_t i = 0; i < ub * MM_PANEL_ROWS; i++)
            slab[i] = (uint8_t)rng_u32();
        memset(got, 0xa5, pb);
        mm_panel_build(slab, ub, cases[c].ns, cols, ref);
        mm_panel_build_avx512(slab, ub, cases[c].ns, cols, got);
        CHECK(memcmp(ref, got, pb) == 0, "panel of %lld rows x %lld: builds differ",
              (long long)cases[c].ns, (long long)cols);
        free(slab);
        panels += 2;
        free(rows);
        free(ref);
        free(got);
    }
    printf("test_matmul: panel builds AVX-512 == portable on %d panels\n", panels);
}

static void test_codes_quantize(void)
{
    if (cpu_isa_hw() < CPU_ISA_AVX2) {
        printf("test_matmul: codes quantizer skipped: no AVX2\n");
        return;
    }
    static const int64_t cols[] = {32, 96, 1024, 4064, 4096};
    int rows = 0;
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
        const int64_t n = cols[c];
        const size_t rb = mm_codes_xq_row_bytes(n);
        float *x = malloc(sizeof(float) * (size_t)n);
        uint8_t *ref = malloc(rb), *got = malloc(rb);
        for (int v = 0; v < 6; v++) {
            const float scale = v == 4 ? 1e-30f : v == 5 ? 3e4f : 1.0f;
            for (int64_t k = 0; k < n; k++)
                x[k] = rng_f() * scale;
            if (v == 1) /* a block of zeros */
                memset(x + (n / 32 / 2) * 32, 0, 32 * sizeof(float));
            if (v >= 2) /* absmax 127: d = 1, so k + 0.5 is a tie */
                for (int64_t b = 0; b < n / 32; b += 2) {
                    x[b * 32] = v == 2 ? 127.0f : -127.0f;
                    for (int i = 1; i < 32; i++)
                        x[b * 32 + i] = (float)((int)(rng_u32() % 253) - 126) + 0.5f;
                }
            memset(ref, 0xAB, rb);
            memset(got, 0xCD, rb);
            mm_codes_xq_quantize(x, ref, n);
            mm_codes_xq_quantize_avx2(x, got, n);
            size_t differ = 0;
            for (size_t i = 0; i < rb; i++)
                differ += ref[i] != got[i];
            CHECK(differ == 0, "codes quantizer, %lld columns, case %d: %zu of %zu bytes differ "
                  "from mm_codes_xq_quantize's", (long long)n, v, differ, rb);
            rows++;
        }
        free(x);
        free(ref);
        free(got);
    }
    printf("test_matmul: AVX2 codes quantizer == scalar on %d rows\n", rows);
}

/* Calls of 5-31 tokens on a low-bit format take the direct kernel in
 * passes of 4 tokens over blocks of rows (matmul.c's mm_run_chunk): each
 * token's outputs have the bits of its pass run alone (a call of the 4
 * or fewer tokens of that pass), for every format, on every ISA with a
 * direct kernel, one and two threads, rows that leave a partial block. */
static void test_direct_passes(void)
{
    static const int ns[] = {5, 8, 13, 31};
    enum { ROWS = 37, COLS = 1024, NMAX = 31 };
    struct err e;
    struct threadpool *pools[2] = {tp_create(1, &e), tp_create(2, &e)};
    const enum cpu_isa hw = cpu_isa_hw();
    int compared = 0;
    for (int isa = CPU_ISA_AVX2; isa <= (int)hw; isa++) {
        for (size_t f = 0; f < N_LOW_BIT_FM; f++) {
            const enum dtype dt = low_bit_fm[f].dt;
            const size_t rb = dtype_row_bytes(dt, COLS);
            uint8_t *blk = malloc(rb * ROWS);
            random_blocks(f, blk, rb * ROWS);
            struct tensor w = {dt, ROWS, COLS, blk};
            float *x = malloc(sizeof(float) * NMAX * COLS);
            float *a = malloc(sizeof(float) * NMAX * ROWS), *b = malloc(sizeof(float) * NMAX * ROWS);
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                const int n = ns[ni];
                fill_x(x, n, COLS);
                for (int p = 0; p < 2; p++) {
                    struct cpu_matmul mm;
                    CHECK(cpu_matmul_init(&mm, pools[p], (enum cpu_isa)isa, &e) == 0, "init: %s",
                          e.msg);
                    CHECK(cpu_matmul(&mm, a, x, n, &w, &e) == 0, "%d tokens: %s", n, e.msg);
                    for (int t = 0; t < n; t += 4) {
                        const int nt = n - t < 4 ? n - t : 4;
                        CHECK(cpu_matmul(&mm, b + (size_t)t * ROWS, x + (size_t)t * COLS, nt, &w,
                                         &e) == 0,
                              "a pass alone: %s", e.msg);
                    }
                    int differ = 0;
                    for (size_t i = 0; i < (size_t)n * ROWS; i++)
                        differ += memcmp(&a[i], &b[i], sizeof(float)) != 0;
                    CHECK(differ == 0,
                          "%s %s n=%d threads=%d: %d of %d outputs differ from their pass's alone",
                          dtype_name(dt), cpu_isa_name((enum cpu_isa)isa), n, p + 1, differ,
                          n * ROWS);
                    compared += n * ROWS;
                    cpu_matmul_free(&mm);
                }
            }
            free(x);
            free(a);
            free(b);
            free(blk);
        }
    }
    printf("test_matmul: 5-31 tokens in direct passes == each pass alone on %d outputs\n",
           compared);
    for (int i = 0; i < 2; i++)
        tp_destroy(pools[i]);
}

/* The kernels that read a low-bit format's blocks directly (all nine
 * formats on AVX2 and AVX-512 VNNI, up to 4 tokens) give the
 * slab path's bits on the same ISA (mm.direct = 0: unpack, then the
 * codes kernel): blocks of arbitrary bits (finite f16 fields, some
 * zero), 1-4 tokens, one and two threads, rows of 96 to 4,096 values
 * (the 32-block formats also odd block counts: a half group), on every
 * ISA the CPU has (AVX-512 also without VNNI, which takes the AVX2
 * kernels). */
static void test_direct_kernels(void)
{
    static const struct shape ksh[] = {{37, 256}, {19, 1024}, {6, 4096}, {64, 2048}};
    static const struct shape qsh[] = {{37, 96}, {19, 1024}, {6, 4064}, {64, 160}};
    struct err e;
    struct threadpool *pools[2] = {tp_create(1, &e), tp_create(2, &e)};
    const enum cpu_isa hw = cpu_isa_hw();
    /* as test_shape: hw + 1 stands for AVX-512 without VNNI */
    const int last = hw == CPU_ISA_AVX512 && cpu_has_avx512_vnni() ? (int)hw + 1 : (int)hw;
    int compared = 0, isas = 0;
    for (int isa = CPU_ISA_AVX2; isa <= last; isa++) {
        const bool novnni = isa > (int)hw;
        isas++;
        for (size_t f = 0; f < N_LOW_BIT_FM; f++) {
            const enum dtype dt = low_bit_fm[f].dt;
            const int64_t be = dtype_block_elems(dt);
            for (size_t si = 0; si < sizeof ksh / sizeof ksh[0]; si++) {
                const struct shape sz = be == 256 ? ksh[si] : qsh[si];
                const size_t rb = dtype_row_bytes(dt, sz.cols);
                uint8_t *blk = malloc(rb * (size_t)sz.rows);
                random_blocks(f, blk, rb * (size_t)sz.rows);
                struct tensor w = {dt, sz.rows, sz.cols, blk};
                const size_t no = 4 * (size_t)sz.rows;
                float *x = malloc(sizeof(float) * 4 * (size_t)sz.cols);
                float *a = malloc(sizeof(float) * no), *b = malloc(sizeof(float) * no);
                for (int n = 1; n <= 4; n++) {
                    fill_x(x, n, sz.cols);
                    for (int p = 0; p < 2; p++) {
                        struct cpu_matmul mm;
                        CHECK(cpu_matmul_init(&mm, pools[p], novnni ? hw : (enum cpu_isa)isa,
                                              &e) == 0,
                              "init: %s", e.msg);
                        if (novnni)
                            mm.vnni = 0;
                        mm.direct = 1;
                        CHECK(cpu_matmul(&mm, a, x, n, &w, &e) == 0, "direct: %s", e.msg);
                        mm.direct = 0;
                        CHECK(cpu_matmul(&mm, b, x, n, &w, &e) == 0, "unpacked: %s", e.msg);
                        const size_t nn = (size_t)n * (size_t)sz.rows;
                        int differ = 0;
                        for (size_t i = 0; i < nn; i++)
                            differ += memcmp(&a[i], &b[i], sizeof(float)) != 0;
                        CHECK(differ == 0,
                              "%s direct %s n=%d %lldx%lld threads=%d: %d of %zu outputs "
                              "differ from the unpacked path's bits",
                              dtype_name(dt),
                              novnni ? "avx512-novnni" : cpu_isa_name((enum cpu_isa)isa), n,
                              (long long)sz.rows, (long long)sz.cols, p + 1, differ, nn);
                        compared += (int)nn;
                        cpu_matmul_free(&mm);
                    }
                }
                free(x);
                free(a);
                free(b);
                free(blk);
            }
        }
    }
    if (isas == 0)
        printf("test_matmul: direct kernels skipped: no AVX2\n");
    else
        printf("test_matmul: direct kernels of all nine 2-6-bit formats == unpacked path on %d "
               "outputs (%d ISAs)\n", compared, isas);
    for (int i = 0; i < 2; i++)
        tp_destroy(pools[i]);
}

int main(void)
{
    printf("test_matmul: hardware ISA %s, avx512 vnni %s, avx512 bf16 %s\n",
           cpu_isa_name(cpu_isa_hw()), cpu_has_avx512_vnni() ? "yes" : "no",
           cpu_has_avx512_bf16() ? "yes" : "no");
    test_threadpool();
    test_q8_0_roundtrip();
    test_matmul_errors();
    test_unpack_builds();
    test_codes_quantize();
    test_panel_builds();
    test_direct_kernels();
    test_direct_passes();
    test_bf16dot_rounding();
    test_matmul_all();
    return test_summary("test_matmul");
}
