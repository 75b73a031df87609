/* bench_head_screen.c - how many rows an exact greedy pick has to rescore
 * when an int8 copy of the LM head screens them first (the CPU's
 * head_pick, src/backend/cpu/head_pick.c, and the plan for the GPU's;
 * docs/benchmarks.md, "An exact greedy pick from half the head's bytes").
 *
 * The idea: the head is the largest matrix of a small model's step (the
 * Qwen3-0.6B's is 311 MB of its 1.2 GB), and a greedy step wants only its
 * argmax. Row r's int8 copy q_r with scale s_r = max|w_r| / 127 gives an
 * approximate logit a_r = s_r (q_r . x) whose error is at most
 * e_r = s_r ||x||_1 / 2 (each weight off by at most s_r / 2), plus float
 * rounding. So the true argmax is among the rows with a_r + e_r >= max_r
 * (a_r - e_r): reading half the bytes, then the bf16 rows of those
 * candidates alone, picks exactly the row the full head would. This
 * program counts the candidates for random weights N(0, std) and inputs
 * N(0, 1) (a normed state), and checks that the argmax is always among
 * them; bound = 0.53 instead of 0.5 covers both sums' f32 rounding (1,024
 * products: relative 6.1e-5 of sum |x| |w| each, 0.8 % of e_r).
 *
 *   bench_head_screen [--vocab 151936] [--dim 1024] [--std 0.02] [--trials 4] [--seed 1]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;

static double uniform01(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static float normal(void)
{
    const double a = uniform01(), b = uniform01();
    return (float)(sqrt(-2.0 * log(a + 1e-300)) * cos(6.283185307179586 * b));
}

int main(int argc, char **argv)
{
    long vocab = 151936, dim = 1024, trials = 4, seed = 1;
    double std = 0.02;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--vocab"))
            vocab = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--dim"))
            dim = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--std"))
            std = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--trials"))
            trials = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed"))
            seed = atol(argv[i + 1]);
        else {
            fprintf(stderr, "bench_head_screen: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (vocab < 2 || dim < 1 || trials < 1 || !(std > 0)) {
        fprintf(stderr, "bench_head_screen: --vocab >= 2, --dim, --trials >= 1, --std > 0\n");
        return 2;
    }
    rng_state = 0x9E3779B97F4A7C15ull * (uint64_t)(seed + 1);
    float *w = malloc(sizeof *w * (size_t)vocab * (size_t)dim);
    int8_t *q = malloc((size_t)vocab * (size_t)dim);
    float *s = malloc(sizeof *s * (size_t)vocab), *x = malloc(sizeof *x * (size_t)dim);
    double *a = malloc(sizeof *a * (size_t)vocab);
    if (!w || !q || !s || !x || !a) {
        fprintf(stderr, "bench_head_screen: out of memory\n");
        return 1;
    }
    for (long r = 0; r < vocab; r++) {
        float *row = w + (size_t)r * (size_t)dim, m = 0.0f;
        for (long i = 0; i < dim; i++) {
            row[i] = (float)std * normal();
            m = fmaxf(m, fabsf(row[i]));
        }
        s[r] = m > 0.0f ? m / 127.0f : 1.0f;
        for (long i = 0; i < dim; i++)
            q[(size_t)r * (size_t)dim + i] = (int8_t)lrintf(row[i] / s[r]);
    }
    printf("vocab %ld, dim %ld, weights N(0, %g): bf16 head %.1f MB, int8 copy + f32 scales "
           "%.1f MB\n",
           vocab, dim, std, vocab * dim * 2 / 1e6, (vocab * dim + vocab * 4) / 1e6);
    int all_in = 1;
    for (long t = 0; t < trials; t++) {
        double x1 = 0.0;
        for (long i = 0; i < dim; i++) {
            x[i] = normal();
            x1 += fabs(x[i]);
        }
        long best = 0;
        double best_z = -INFINITY, low = -INFINITY;
        for (long r = 0; r < vocab; r++) {
            const float *row = w + (size_t)r * (size_t)dim;
            const int8_t *qr = q + (size_t)r * (size_t)dim;
            double z = 0.0, ap = 0.0;
            for (long i = 0; i < dim; i++) {
                z += (double)row[i] * x[i];
                ap += (double)qr[i] * x[i];
            }
            if (z > best_z) {
                best_z = z;
                best = r;
            }
            a[r] = ap * s[r];
            const double lo = a[r] - 0.53 * x1 * s[r];
            low = lo > low ? lo : low;
        }
        long cand = 0;
        int in = 0;
        for (long r = 0; r < vocab; r++)
            if (a[r] + 0.53 * x1 * s[r] >= low) {
                cand++;
                in |= r == best;
            }
        all_in &= in;
        printf("trial %ld: argmax row %ld (logit %.3f, its bound %.3f) %s; %ld candidate rows "
               "to rescore\n",
               t, best, best_z, 0.53 * x1 * s[best], in ? "among them" : "MISSED", cand);
    }
    free(w);
    free(q);
    free(s);
    free(x);
    free(a);
    return all_in ? 0 : 1;
}
