/* test_sampler.c - the host sampler (engine/sampler.c):
 *   1. seeded sampler_sample draws the same ids as before sampler_pick was
 *      split out (hashes recorded from that version), so a seed's output
 *      never changes;
 *   2. sampler_sample is one rng_uniform draw and sampler_pick per token;
 *   3. sampler_pick equals the contract as written out in sample_ref (a
 *      full sort) for every draw, over every filter alone and together,
 *      ties, -0, -inf and NaN;
 *   4. defined edges: NaN never wins, all-NaN gives 0, all -inf the first
 *      candidate, +inf the first +inf, top_k = 1 and a tiny top_p the
 *      argmax, min_p = 1 only the tokens at the maximum, ties at the k-th
 *      value go to the lower ids, u = 0 the first kept token;
 *   5. over many uniform draws, each top token's frequency is within 5
 *      sigma of its probability. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/logits.h"
#include "engine/sampler.h"
#include "sample_ref.h"
#include "testutil.h"

static uint64_t st = 0x243F6A8885A308D3ull;
static double u01(void)
{
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return (double)(st >> 11) * 0x1.0p-53;
}

static float gauss(void)
{
    double a = u01(), b = u01();
    return (float)(sqrt(-2 * log(a + 1e-300)) * cos(6.283185307179586 * b));
}

/* 1. The ids seeded sampling gave before the split (FNV-1a over 250 draws
 * from 10 rows per config and vocabulary, recorded with the sampler of
 * commit 5ebd8b7). */
static void check_recorded(void)
{
    struct sampler_params cfg[] = {
        {1.0f, 0, 1.0f, 0, 0},     {0.7f, 50, 1.0f, 0, 0},      {1.3f, 0, 0.9f, 0, 0},
        {0.8f, 0, 1.0f, 0.05f, 0}, {1.0f, 40, 0.95f, 0.02f, 0}, {0.5f, 1, 1.0f, 0, 0},
        {1.0f, 0, 0.001f, 0, 0},   {1.0f, 0, 1.0f, 1.0f, 0},    {2.0f, 0, 0.5f, 0.1f, 0},
        {1.0f, 5000, 1.0f, 0, 0},
    };
    static const uint64_t want[2][10] = {
        {0x520f5def14d43934ull, 0x8a468be2a60ca8ecull, 0x7ff86d396d3138f1ull,
         0x122849f7739accd2ull, 0x34a5b748da80f643ull, 0xb5ad3dc9eeb90174ull,
         0x594409c7d89f5d06ull, 0xbdf34349834336b4ull, 0x17830996bd5ecd98ull,
         0x0a047c978163efa1ull},
        {0x342f5175f81296f3ull, 0x2890b7497a2e2005ull, 0xae6211ad63aa4ab2ull,
         0xdea9b04055c5ae7bull, 0xbee32a8be0677b4dull, 0x7bc12104d1052141ull,
         0x457decb2a7bc0fb7ull, 0x72d0f444bf758254ull, 0x9ad3906478e0fa51ull,
         0xf0b2a2441aeece6eull},
    };
    int vocabs[] = {1000, 8000};
    st = 0x243F6A8885A308D3ull;
    for (int vi = 0; vi < 2; vi++) {
        int n = vocabs[vi];
        float *l = malloc(sizeof(float) * (size_t)n);
        for (int c = 0; c < 10; c++) {
            struct sampler s;
            struct err e = {{0}};
            cfg[c].seed = 1000 + (uint64_t)c * 7 + (uint64_t)vi;
            CHECK(sampler_init(&s, &cfg[c], n, &e) == 0, "sampler_init: %s", e.msg);
            uint64_t h = 0xcbf29ce484222325ull;
            for (int row = 0; row < 10; row++) {
                float scale = 1.0f + 2.0f * (float)u01();
                for (int i = 0; i < n; i++)
                    l[i] = gauss() * scale;
                for (int d = 0; d < 25; d++) {
                    int id = sampler_sample(&s, l);
                    for (int b = 0; b < 4; b++) {
                        h ^= (uint64_t)((id >> (8 * b)) & 0xff);
                        h *= 0x100000001b3ull;
                    }
                }
            }
            CHECK(h == want[vi][c], "vocab %d config %d: seeded ids changed (hash %016llx)", n,
                  c, (unsigned long long)h);
            sampler_free(&s);
        }
        free(l);
    }
}

/* 2. One draw per token, taken before the pick. */
static void check_one_draw(void)
{
    int n = 500;
    float *l = malloc(sizeof(float) * (size_t)n), *pr = malloc(sizeof(float) * (size_t)n);
    int *idx = malloc(sizeof(int) * (size_t)n);
    struct sampler_params p = {0.9f, 20, 0.9f, 0.01f, 4242};
    struct sampler s;
    struct err e = {{0}};
    CHECK(sampler_init(&s, &p, n, &e) == 0, "sampler_init: %s", e.msg);
    struct rng r;
    rng_seed(&r, p.seed);
    int bad = 0;
    for (int t = 0; t < 200; t++) {
        for (int i = 0; i < n; i++)
            l[i] = gauss() * 2;
        int a = sampler_sample(&s, l);
        int b = sampler_pick(&p, l, n, rng_uniform(&r), pr, idx);
        bad += a != b;
    }
    CHECK(bad == 0, "sampler_sample differs from rng_uniform + sampler_pick in %d of 200", bad);
    sampler_free(&s);
    free(l);
    free(pr);
    free(idx);
}

/* 3. sampler_pick == the contract, bit for bit. */
static void check_contract(void)
{
    int vocabs[] = {7, 300, 6000};
    long draws = 0, bad = 0;
    uint64_t rng = 0x853c49e6748fea9bull;
    for (int vi = 0; vi < 3; vi++) {
        int n = vocabs[vi];
        float *x = malloc(sizeof(float) * (size_t)n), *pr = malloc(sizeof(float) * (size_t)n);
        int *idx = malloc(sizeof(int) * (size_t)n);
        for (int shape = 0; shape < SAMPLE_TEST_SHAPES; shape++)
            for (int variant = 0; variant < (shape == 5 ? 4 : 1); variant++) {
                sample_test_row(x, n, shape, variant, &rng);
                for (int c = 0; c < sample_test_n_combos; c++) {
                    const struct sampler_params *p = &sample_test_combos[c];
                    struct sample_ref ref;
                    sample_ref_init(&ref, p, x, n);
                    for (int d = 0; d < (n > 1000 ? 16 : 60); d++) {
                        double u = d == 0 ? 0 : d == 1 ? 1 - 0x1p-53 : sample_test_u(&rng);
                        int a = sampler_pick(p, x, n, u, pr, idx);
                        int b = sample_ref_pick(&ref, u);
                        draws++;
                        if (a != b && bad++ < 5)
                            CHECK(0, "n %d shape %d/%d combo %d u %.17g: sampler_pick %d, "
                                     "contract %d", n, shape, variant, c, u, a, b);
                        if (sample_ref_prob(&ref, b) <= 0)
                            CHECK(0, "n %d shape %d combo %d: the contract picks %d of "
                                     "probability 0", n, shape, c, b);
                    }
                    sample_ref_free(&ref);
                }
            }
        free(x);
        free(pr);
        free(idx);
    }
    CHECK(bad == 0, "%ld of %ld draws differ from the contract", bad, draws);
    printf("sampler_pick vs contract: %ld draws, %ld differ\n", draws, bad);
}

static int pick(const struct sampler_params *p, const float *x, int n, double u)
{
    float pr[64];
    int idx[64];
    return sampler_pick(p, x, n, u, pr, idx);
}

/* 4. The edges the device sampler must match too. */
static void check_edges(void)
{
    const float nan = NAN, inf = INFINITY;
    struct sampler_params t1 = {1.0f, 0, 1.0f, 0, 0};
    float all_nan[] = {nan, nan, nan};
    CHECK(pick(&t1, all_nan, 3, 0.5) == 0, "all NaN gives 0");
    float all_ninf[] = {nan, -inf, -inf, -inf};
    CHECK(pick(&t1, all_ninf, 4, 0.9) == 1, "all -inf gives the first candidate");
    float pinf[] = {1, inf, 3, inf};
    CHECK(pick(&t1, pinf, 4, 0.9) == 1, "+inf gives the first +inf");
    float one[] = {nan, -inf, 2.0f, nan};
    for (int d = 0; d < 20; d++)
        CHECK(pick(&t1, one, 4, d / 20.0) == 2, "the one finite candidate");
    float big[] = {1e30f, 2e30f, 0};
    struct sampler_params cold = {1e-10f, 0, 1.0f, 0, 0}; /* scaling overflows to +inf */
    CHECK(pick(&cold, big, 3, 0.5) == 0, "overflow to +inf: the first +inf");

    float row[8] = {1, 3, 2, 3, nan, 0.5f, 3, -inf};
    struct sampler_params k1 = {1.0f, 1, 1.0f, 0, 0}, tp = {1.0f, 0, 1e-6f, 0, 0};
    struct sampler_params mp = {1.0f, 0, 1.0f, 1.0f, 0}, k2 = {1.0f, 2, 1.0f, 0, 0};
    int seen_mp[8] = {0}, seen_k2[8] = {0};
    for (int d = 0; d < 400; d++) {
        double u = d / 400.0;
        CHECK(pick(&k1, row, 8, u) == 1, "top_k 1 is the argmax (lowest id of the ties)");
        CHECK(pick(&tp, row, 8, u) == 1, "a tiny top_p is the argmax");
        seen_mp[pick(&mp, row, 8, u)]++;
        seen_k2[pick(&k2, row, 8, u)]++;
        int t = pick(&t1, row, 8, u);
        CHECK(t != 4 && t != 7, "NaN or -inf picked (%d)", t);
    }
    CHECK(seen_mp[1] > 100 && seen_mp[3] > 100 && seen_mp[6] > 100 &&
              seen_mp[1] + seen_mp[3] + seen_mp[6] == 400,
          "min_p 1: only the tokens at the maximum (%d %d %d)", seen_mp[1], seen_mp[3],
          seen_mp[6]);
    CHECK(seen_k2[1] > 150 && seen_k2[3] > 150 && seen_k2[1] + seen_k2[3] == 400,
          "top_k 2 among three tied: the two lower ids (%d %d %d)", seen_k2[1], seen_k2[3],
          seen_k2[6]);
    /* u = 0: the first kept token of the walk; the descending walk puts
     * the lower id first among equals, the id-order walk the lowest id. */
    CHECK(pick(&k2, row, 8, 0) == 1, "u 0, descending walk");
    CHECK(pick(&t1, row, 8, 0) == 0, "u 0, id-order walk");
    float zeros[] = {-0.0f, 0.0f, -0.0f};
    struct sampler_params k1z = {1.0f, 1, 1.0f, 0, 0};
    CHECK(pick(&k1z, zeros, 3, 0.7) == 0, "-0 ranks as +0 (a tie: the lower id)");
    struct sampler_params greedy = {0.0f, 5, 0.5f, 0.5f, 0};
    CHECK(pick(&greedy, row, 8, 0.99) == 1, "temperature 0 is sample_argmax");
}

/* 5. Frequencies over uniform draws against the contract's probabilities. */
static void check_distribution(void)
{
    int n = 2000, draws = 50000;
    float *x = malloc(sizeof(float) * (size_t)n), *pr = malloc(sizeof(float) * (size_t)n);
    int *idx = malloc(sizeof(int) * (size_t)n), *count = calloc((size_t)n, sizeof(int));
    uint64_t rng = 12345;
    sample_test_row(x, n, 2, 0, &rng);
    struct sampler_params p = {1.5f, 30, 0.97f, 0.01f, 99};
    struct sample_ref ref;
    sample_ref_init(&ref, &p, x, n);
    struct rng r;
    rng_seed(&r, 7);
    for (int d = 0; d < draws; d++)
        count[sampler_pick(&p, x, n, rng_uniform(&r), pr, idx)]++;
    int checked = 0, outside = 0;
    for (int i = 0; i < n; i++) {
        double q = sample_ref_prob(&ref, i), mean = q * draws;
        if (q == 0) {
            outside += count[i] != 0;
            continue;
        }
        double sd = sqrt(mean * (1 - q));
        checked++;
        if (fabs(count[i] - mean) > 5 * sd + 1) {
            outside++;
            CHECK(0, "token %d: %d draws, expected %.1f +- %.1f", i, count[i], mean, sd);
        }
    }
    CHECK(checked >= 3 && outside == 0, "distribution: %d tokens checked, %d outside", checked,
          outside);
    printf("sampler distribution: %d kept tokens within 5 sigma over %d draws\n", checked,
           draws);
    sample_ref_free(&ref);
    free(x);
    free(pr);
    free(idx);
    free(count);
}

/* Speculative sampling's step keeps a draft d with probability P(d) and
 * otherwise draws from P without d, so its output is distributed as P for
 * every d: on a grid of (u_accept, u), its frequencies equal sampler_pick's
 * on a grid of u. */
static void check_verify(void)
{
    const float row[6] = {2.0f, 1.5f, 1.5f, 0.2f, -1.0f, -30.0f};
    const struct sampler_params ps[] = {
        {.temperature = 1, .top_p = 1}, {.temperature = 0.7f, .top_k = 3, .top_p = 1},
        {.temperature = 1.3f, .top_p = 0.8f}, {.temperature = 1, .top_p = 1, .min_p = 0.2f},
        {.temperature = 0, .top_p = 1}};
    float pr[6];
    int idx[6];
    enum { M = 400 };
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
        double want[6] = {0};
        for (int j = 0; j < M; j++)
            want[sampler_pick(&ps[k], row, 6, (j + 0.5) / M, pr, idx)] += 1.0 / M;
        for (int d = 0; d < 6; d++) {
            double got[6] = {0};
            for (int a = 0; a < M; a++)
                for (int j = 0; j < M; j++)
                    got[sampler_verify(&ps[k], row, 6, d, (a + 0.5) / M, (j + 0.5) / M, pr,
                                       idx)] += 1.0 / ((double)M * M);
            double worst = 0;
            for (int t = 0; t < 6; t++)
                worst = fmax(worst, fabs(got[t] - want[t]));
            CHECK(worst < 6.0 / M, "params %zu, draft %d: off by %.4f", k, d, worst);
        }
    }
}

/* logits.h's rules on a row small enough to work out by hand. */
static void check_processors(void)
{
    const float row0[8] = {2, -2, 1, 0.5f, -1, 3, 0, 4};
    const int toks[6] = {5, 1, 1, 3, 1, 7};
    uint8_t mark[8] = {0};
    struct {
        struct logits_params p;
        float want[8];
    } cases[] = {
        /* the window's distinct tokens 1, 3, 7: negative times, positive over */
        {{.repetition = 2, .repetition_window = 4}, {2, -4, 1, 0.25f, -1, 3, 0, 2}},
        {{.repetition = 1}, {2, -2, 1, 0.5f, -1, 3, 0, 4}},
        /* once per distinct token of the window (3, 1, 7; then 1, 3, 7) */
        {{.presence = 0.5f, .presence_window = 3}, {2, -2.5f, 1, 0, -1, 3, 0, 3.5f}},
        {{.presence = 0.5f, .presence_window = 5}, {2, -2.5f, 1, 0, -1, 3, 0, 3.5f}},
        /* per occurrence: 1 three times */
        {{.frequency = 0.5f, .frequency_window = 5}, {2, -3.5f, 1, 0, -1, 3, 0, 3.5f}},
        /* a window <= 0 is 20: every token, 5 too */
        {{.frequency = 0.5f}, {2, -3.5f, 1, 0, -1, 2.5f, 0, 3.5f}},
        /* bias first, then the factor sees the biased value */
        {{.bias_ids = (int[]){7, 0}, .bias = (float[]){-5, 1}, .n_bias = 2, .repetition = 2,
          .repetition_window = 1},
         {3, -2, 1, 0.5f, -1, 3, 0, -2}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float row[8];
        memcpy(row, row0, sizeof row);
        CHECK(logits_params_active(&cases[c].p) == (c != 1), "case %zu: active", c);
        logits_process(&cases[c].p, toks, 6, row, mark);
        for (int i = 0; i < 8; i++)
            CHECK(row[i] == cases[c].want[i], "case %zu: row[%d] = %g, want %g", c, i, row[i],
                  cases[c].want[i]);
        for (int i = 0; i < 8; i++)
            CHECK(mark[i] == 0, "case %zu: scratch left dirty at %d", c, i);
    }
    struct err e = {{0}};
    struct logits_params bad = {.bias_ids = (int[]){8}, .bias = (float[]){1}, .n_bias = 1};
    CHECK(logits_params_check(&bad, 8, &e) && strstr(e.msg, "vocabulary"), "%s", e.msg);
    bad = (struct logits_params){.bias_ids = (int[]){1}, .bias = (float[]){101}, .n_bias = 1};
    CHECK(logits_params_check(&bad, 8, &e) && strstr(e.msg, "[-100, 100]"), "%s", e.msg);
    bad = (struct logits_params){.repetition = -1};
    CHECK(logits_params_check(&bad, 8, &e) && strstr(e.msg, "repetition"), "%s", e.msg);
    bad = (struct logits_params){.frequency = NAN};
    CHECK(logits_params_check(&bad, 8, &e) && strstr(e.msg, "frequency"), "%s", e.msg);

    /* log-probabilities: the normalizer skips NaN; the top list is larger
     * first, the lower id on ties, NaN never */
    const float lr[6] = {1, NAN, 3, 3, -INFINITY, 2};
    double lse = logits_lse(lr, 6);
    double want = log(exp(1.0) + 2 * exp(3.0) + exp(2.0));
    CHECK(fabs(lse - want) < 1e-6, "lse %.15g, want %.15g", lse, want);
    struct token_logprobs lp;
    logprobs_top(lr, 6, 4, lse, &lp);
    int ids[4] = {2, 3, 5, 0};
    CHECK(lp.n_top == 4, "n_top %d", lp.n_top);
    for (int j = 0; j < 4 && j < lp.n_top; j++)
        CHECK(lp.top_id[j] == ids[j] && fabs(lp.top_lp[j] - (lr[ids[j]] - want)) < 1e-6,
              "top %d: id %d lp %g", j, lp.top_id[j], lp.top_lp[j]);
    logprobs_top(lr, 6, 1, lse, &lp); /* a tie at the cut: the lower id */
    CHECK(lp.n_top == 1 && lp.top_id[0] == 2, "tie at the cut went to %d", lp.top_id[0]);
    logprobs_top(lr, 6, 30, lse, &lp); /* more than there are: the non-NaN ones */
    CHECK(lp.n_top == 5 && lp.top_id[4] == 4 && isinf(lp.top_lp[4]), "n_top %d", lp.n_top);
    CHECK(isinf(logits_lse((const float[]){-INFINITY, NAN}, 2)), "nothing finite: -inf");
}

int main(void)
{
    check_recorded();
    check_one_draw();
    check_contract();
    check_edges();
    check_distribution();
    check_verify();
    check_processors();
    return test_summary("test_sampler");
}
