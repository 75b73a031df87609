/* test_head_pick.c - the CPU backend's head_pick (backend/cpu/head_pick.c):
 * over f32, f16 and bf16 heads of several shapes, with every kernel and a
 * pool, for greedy picks and top-k draws: the pick argmax_f32 makes over
 * its row is the one it makes over the full product, every row it keeps
 * holds the full product's bits, every one of the k largest is kept, the
 * sampler's top-k draws are the same tokens, and it keeps few; ties, near
 * ties, an outlier input, a head of identical rows (the full product
 * instead), and the cases it refuses. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/head_pick.h"
#include "backend/head_bound.h"
#include "engine/sampler.h"
#include "base/argmax.h"
#include "base/half.h"
#include "base/threadpool.h"
#include "model/quant.h"
#include "testutil.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;

static float gauss(void)
{
    double a, b;
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    a = (double)(rng >> 11) / 9007199254740992.0 + 1e-300;
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    b = (double)(rng >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(a)) * cos(6.283185307179586 * b));
}

/* A head of rows x cols in dt from f32 values (rounded to dt). */
static void *make_head(enum dtype dt, const float *w, int64_t rows, int64_t cols)
{
    size_t n = (size_t)rows * (size_t)cols;
    if (quant_is_low_bit(dt)) {
        const size_t rb = dtype_row_bytes(dt, cols);
        uint8_t *h = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++)
            quant_quantize_row(dt, w + r * cols, h + (size_t)r * rb, cols);
        return h;
    }
    if (dt == DT_F32) {
        float *h = malloc(n * 4);
        memcpy(h, w, n * 4);
        return h;
    }
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++)
        h[i] = dt == DT_F16 ? f32_to_f16(w[i]) : f32_to_bf16(w[i]);
    return h;
}

struct stats {
    int cases, kept_max;
};

/* One check: head_pick's row for a pick among the k largest against the
 * full product: the same argmax; for k > 1 every one of the k largest
 * kept, and sampler_pick's top-k draws (40 uniforms) the same tokens. */
static void check_pick(struct cpu_matmul *mm, struct head_screen *hs, const struct tensor *h,
                       const float *x, int k, const char *what, struct stats *st)
{
    const size_t rows = (size_t)h->rows;
    float *full = malloc(rows * 4), *got = malloc(rows * 4), *pr = malloc(rows * 4);
    int *idx = malloc(rows * sizeof *idx);
    struct err e = {{0}};
    CHECK(cpu_matmul(mm, full, x, 1, h, &e) == 0, "%s: matmul: %s", what, e.msg);
    int rc = head_screen_pick(hs, mm, got, x, h, k, &e);
    CHECK(rc == 0, "%s: head_pick returned %d (%s)", what, rc, e.msg);
    if (rc == 0) {
        int want = argmax_f32(full, (int)rows), pick = argmax_f32(got, (int)rows);
        int kept = 0, same = 1, higher_dropped = 0;
        for (size_t r = 0; r < rows; r++) {
            if (got[r] == -INFINITY && full[r] != -INFINITY)
                continue;
            kept++;
            same &= memcmp(&got[r], &full[r], 4) == 0;
        }
        /* a dropped row must have a logit below the k-th largest kept one */
        float kth = INFINITY;
        if (kept >= k) {
            float *kv = malloc(sizeof *kv * (size_t)kept);
            int n = 0;
            for (size_t r = 0; r < rows; r++)
                if (got[r] != -INFINITY)
                    kv[n++] = got[r];
            for (int i = 0; i < k; i++) { /* selection of the k-th largest */
                int b = i;
                for (int j = i + 1; j < n; j++)
                    if (kv[j] > kv[b])
                        b = j;
                float tmp = kv[i];
                kv[i] = kv[b];
                kv[b] = tmp;
            }
            kth = kv[k - 1];
            free(kv);
        }
        for (size_t r = 0; r < rows; r++)
            higher_dropped += got[r] == -INFINITY && full[r] > kth;
        CHECK(pick == want, "%s: picked %d, the full product %d", what, pick, want);
        CHECK(same, "%s: a kept row differs from the full product's", what);
        CHECK(kept >= k && !higher_dropped, "%s: %d kept, %d above the k-th dropped", what, kept,
              higher_dropped);
        if (k > 1) {
            const struct sampler_params sp = {.temperature = 0.7f, .top_k = k, .top_p = 0.9f,
                                              .min_p = 0.02f};
            int diff = 0;
            for (int i = 0; i < 40; i++) {
                const double u = (i + 0.5) / 40;
                diff += sampler_pick(&sp, full, (int)rows, u, pr, idx) !=
                        sampler_pick(&sp, got, (int)rows, u, pr, idx);
            }
            CHECK(!diff, "%s: %d of 40 top-%d draws differ", what, diff, k);
        }
        st->cases++;
        st->kept_max = kept > st->kept_max ? kept : st->kept_max;
    }
    free(full);
    free(got);
    free(pr);
    free(idx);
}

static void shapes(struct cpu_matmul *mm, const char *pool)
{
    static const int64_t dims[][2] = {{4099, 64}, {3001, 1000}, {2, 8}, {20000, 256}, {700, 37}};
    static const enum dtype dts[] = {DT_F32, DT_F16, DT_BF16};
    struct stats st = {0};
    int want_cases = 0;
    for (size_t d = 0; d < sizeof dims / sizeof *dims; d++)
        for (size_t t = 0; t < sizeof dts / sizeof *dts; t++) {
            const int64_t rows = dims[d][0], cols = dims[d][1];
            if (cols % dtype_block_elems(dts[t]))
                continue;
            want_cases += 4;
            float *w = malloc(sizeof *w * (size_t)(rows * cols)), *x = malloc(sizeof *x * (size_t)cols);
            for (int64_t i = 0; i < rows * cols; i++)
                w[i] = 0.02f * gauss();
            void *data = make_head(dts[t], w, rows, cols);
            struct tensor h = {dts[t], rows, cols, data};
            struct head_screen hs = {0};
            static const int ks[] = {1, 1, 20, HEAD_PICK_MAX_K};
            for (int trial = 0; trial < 4; trial++) {
                for (int64_t i = 0; i < cols; i++)
                    x[i] = gauss();
                if (trial == 1)
                    x[cols / 2] = 300.0f; /* one outlier dimension */
                const int k = ks[trial] < rows ? ks[trial] : (int)rows;
                char what[96];
                snprintf(what, sizeof what, "%s %s %lldx%lld trial %d k %d", pool,
                         dtype_name(dts[t]), (long long)rows, (long long)cols, trial, k);
                check_pick(mm, &hs, &h, x, k, what, &st);
            }
            head_screen_free(&hs);
            free(data);
            free(w);
            free(x);
        }
    CHECK(st.cases == want_cases && want_cases == 60, "%s: %d cases checked", pool,
          st.cases);
    printf("test_head_pick: %s, %d cases, at most %d rows kept\n", pool, st.cases, st.kept_max);
}

static void ties_and_refusals(struct cpu_matmul *mm)
{
    const int64_t rows = 2000, cols = 128;
    float *w = malloc(sizeof *w * (size_t)(rows * cols)), *x = malloc(sizeof *x * cols);
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = 0.02f * gauss();
    for (int64_t i = 0; i < cols; i++)
        x[i] = gauss();
    /* the best row copied to rows 1500 and 700 (a tie: the lowest wins),
     * and to row 900 with one weight a step of bf16 lower (a near tie) */
    float best = -INFINITY;
    int64_t b = 0;
    for (int64_t r = 0; r < rows; r++) {
        float z = 0.0f;
        for (int64_t i = 0; i < cols; i++)
            z += w[r * cols + i] * x[i];
        if (z > best)
            best = z, b = r;
    }
    memcpy(w + 1500 * cols, w + b * cols, sizeof *w * cols);
    memcpy(w + 700 * cols, w + b * cols, sizeof *w * cols);
    memcpy(w + 900 * cols, w + b * cols, sizeof *w * cols);
    w[900 * cols + 3] = bf16_to_f32(f32_to_bf16(w[900 * cols + 3])) - 0.0001f;
    struct stats st = {0};
    struct head_screen hs = {0};
    void *data = make_head(DT_BF16, w, rows, cols);
    struct tensor h = {DT_BF16, rows, cols, data};
    check_pick(mm, &hs, &h, x, 1, "ties", &st);
    check_pick(mm, &hs, &h, x, 3, "ties, top 3", &st);
    /* every row the same: past the cap, the full product (no -inf) */
    for (int64_t r = 1; r < rows; r++)
        memcpy(w + r * cols, w, sizeof *w * cols);
    void *same = make_head(DT_F32, w, rows, cols);
    struct tensor hsame = {DT_F32, rows, cols, same};
    float *got = malloc(sizeof *got * rows);
    struct err e = {{0}};
    CHECK(head_screen_pick(&hs, mm, got, x, &hsame, 1, &e) == 0 && argmax_f32(got, (int)rows) == 0 &&
              got[rows - 1] == got[0],
          "identical rows: the full product, row 0");
    /* refusals: a Q8_0 head and GGUF's 2-6-bit ones (their matmul rounds
     * the input to 8 bits), an input that is not finite or all zero, a
     * head with a NaN */
    struct tensor q8 = {DT_Q8_0, rows, cols, data};
    const enum dtype low[] = {DT_Q4_0, DT_Q5_1, DT_Q4_K, DT_Q6_K};
    for (size_t i = 0; i < sizeof low / sizeof *low; i++) {
        const int64_t lc = 256, lr = rows * cols / lc; /* w's values, rows of 256 */
        void *ld = make_head(low[i], w, lr, lc);
        struct tensor lh = {low[i], lr, lc, ld};
        float *lx = calloc((size_t)lc, sizeof *lx);
        lx[0] = 1.0f;
        CHECK(head_screen_pick(&hs, mm, got, lx, &lh, 1, &e) == 1, "a %s head is refused",
              dtype_name(low[i]));
        free(lx);
        free(ld);
    }
    CHECK(head_screen_pick(&hs, mm, got, x, &h, HEAD_PICK_MAX_K + 1, &e) == 1 &&
              head_screen_pick(&hs, mm, got, x, &h, 0, &e) == 1,
          "k outside 1..HEAD_PICK_MAX_K is refused");
    CHECK(head_screen_pick(&hs, mm, got, x, &q8, 1, &e) == 1, "a Q8_0 head is refused");
    x[5] = INFINITY;
    CHECK(head_screen_pick(&hs, mm, got, x, &hsame, 1, &e) == 1, "an infinite input is refused");
    memset(x, 0, sizeof *x * cols);
    CHECK(head_screen_pick(&hs, mm, got, x, &hsame, 1, &e) == 1, "a zero input is refused");
    x[0] = 1.0f;
    ((float *)same)[17] = NAN;
    hsame.data = same; /* same pointer: mark it new by freeing the copy */
    head_screen_free(&hs);
    CHECK(head_screen_pick(&hs, mm, got, x, &hsame, 1, &e) == 1, "a head with a NaN is refused");
    head_screen_free(&hs);
    free(got);
    free(same);
    free(data);
    free(w);
    free(x);
}

int main(void)
{
    struct err e = {{0}};
    int isa = cpu_isa_detect(&e);
    CHECK(isa >= 0, "cpu_isa_detect: %s", e.msg);
    /* every kernel this machine runs (scalar, AVX2, AVX-512 with VNNI),
     * one thread; the best with a pool */
    for (int k = CPU_ISA_SCALAR; k <= isa; k++) {
        struct cpu_matmul one;
        CHECK(cpu_matmul_init(&one, NULL, (enum cpu_isa)k, &e) == 0, "%s", e.msg);
        char name[64];
        snprintf(name, sizeof name, "isa %d%s, 1 thread", k, one.vnni ? " (vnni)" : "");
        shapes(&one, name);
        ties_and_refusals(&one);
        cpu_matmul_free(&one);
    }
    struct threadpool *tp = tp_create(3, &e);
    struct cpu_matmul pool;
    CHECK(tp && cpu_matmul_init(&pool, tp, (enum cpu_isa)isa, &e) == 0, "%s", e.msg);
    shapes(&pool, "3 threads");
    ties_and_refusals(&pool);
    cpu_matmul_free(&pool);
    tp_destroy(tp);
    return test_summary("test_head_pick");
}
