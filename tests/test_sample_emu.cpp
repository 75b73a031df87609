/* test_sample_emu.cpp - the device sampler's kernel (src/backend/cuda/
 * sample.cu) run on the host through tests/emu/cuda_emu.h, against the host
 * sampler (sampler_pick) and the contract's statement (sample_ref): every
 * pick must equal sampler_pick's for the same u (at most a few near-
 * boundary exceptions) and be a token the host keeps, on rows small enough
 * to sit in shared memory from the start, rows that are gathered there part
 * way and rows walked in global memory throughout; ties, -0, -inf, NaN,
 * +inf, all-NaN and all -inf rows; every filter alone and together. A
 * second run with another thread schedule must give the same ids, and so
 * must a run on the fast path, from the maxima, probabilities and
 * candidates its preparation kernels make (made here on the host). Runs
 * without a GPU; test_cuda runs the same cases on one. */
#include "emu/cuda_emu.h"

#include "backend/cuda/sample.cu"

extern "C" {
#include "sample_ref.h"
#include "testutil.h"
}

alignas(16) unsigned char smp_smem[sizeof(smp_shared)];

/* What k_smp_max, k_smp_prob and k_smp_gather make on a GPU
 * (cuk_sample_rows' fast path, nblk blocks a row), made here with the
 * kernel's own helpers. */
static void prep_rows(const float *x, int n, const cuk_sample_param *ps, int rows, int nblk,
                      std::vector<float> &pr, std::vector<int> &cand, std::vector<u64> &ws)
{
    pr.assign((size_t)rows * n, 0.0f);
    cand.assign((size_t)rows * n, -1);
    ws.assign((size_t)rows * SMP_WS, 0);
    for (int r = 0; r < rows; r++) {
        const float inv_t = ps[r].greedy ? 1.0f : ps[r].inv_t;
        const float *row = x + (size_t)r * n;
        u64 *w = &ws[(size_t)r * SMP_WS], best = 0, cnt = 0;
        for (int j = 0; j < n; j++) {
            float y = __fmul_rn(row[j], inv_t);
            if (smp_is_nan(y))
                continue;
            u64 v = cuk_best_key(cuk_order_key(y), j);
            best = v > best ? v : best;
            cnt++;
        }
        w[SMP_WS_BEST] = best;
        w[SMP_WS_CNT] = cnt;
        if (ps[r].greedy)
            continue;
        const float mx = cuk_order_value((unsigned)(best >> 32));
        float *p = &pr[(size_t)r * n];
        for (int j = 0; j < n; j++) {
            float y = __fmul_rn(row[j], inv_t);
            if (smp_is_nan(y))
                continue;
            p[j] = smp_prob(cuk_order_key(y), mx);
            w[SMP_WS_MASS] += smp_weight(p[j]);
            w[SMP_WS_HIST + smp_pbin(p[j])]++;
        }
        const int cut = smp_cut(w + SMP_WS_HIST);
        for (int b = 0; b < nblk; b++) { /* each block's mass and candidates */
            int a, e, k = 0;
            smp_span(n, nblk, b, &a, &e);
            for (int j = a; j < e; j++) {
                w[SMP_WS_BMASS + b] += smp_weight(p[j]);
                if (cut >= 0 && smp_pbin(p[j]) <= cut)
                    cand[(size_t)r * n + a + k++] = j;
            }
            w[SMP_WS_BLK + b] = (u64)k;
        }
    }
}

int main(void)
{
    const struct sampler_params *combos = sample_test_combos;
    const int n_combo = sample_test_n_combos;
    uint64_t rng = 0x853c49e6748fea9bull;
#ifdef __SANITIZE_ADDRESS__ /* ~10x slower: the two smaller sizes still take every path */
    const int vocabs[] = {700, 6000}, draws = 4;
#else
    const int vocabs[] = {700, 6000, 16000}, draws = 6;
#endif
    long total = 0, same = 0, unkept = 0, sched_diff = 0, prep_diff = 0;
    std::vector<float> prv;
    std::vector<u64> wsv;
    std::vector<int> cav;
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
        const int n = vocabs[vi];
        std::vector<float> row(n), x((size_t)n * draws);
        std::vector<int> out(draws), out2(draws);
        std::vector<cuk_sample_param> ps(draws);
        std::vector<float> pr(n);
        std::vector<int> idx(n);
        for (int shape = 0; shape < SAMPLE_TEST_SHAPES; shape++)
            for (int variant = 0; variant < (shape == 5 ? 4 : 1); variant++) {
                sample_test_row(row.data(), n, shape, variant, &rng);
                for (int d = 0; d < draws; d++)
                    memcpy(&x[(size_t)d * n], row.data(), sizeof(float) * n);
                for (int ci = 0; ci < n_combo; ci++) {
                    const struct sampler_params *p = &combos[ci];
                    for (int d = 0; d < draws; d++) {
                        double u = d == 0 ? 0.0 : d == 1 ? 1.0 - 0x1p-53 : sample_test_u(&rng);
                        bool sampled = p->temperature > 0;
                        ps[d] = cuk_sample_param{u, sampled ? 1.0f / p->temperature : 1.0f,
                                                 p->top_p, p->min_p, p->top_k, !sampled, 0};
                    }
                    bool ok = emu_launch(draws, SMP_THREADS, 1 + ci, k_sample_rows, out.data(),
                                         (const float *)x.data(), n,
                                         (const cuk_sample_param *)ps.data(),
                                         (const float *)nullptr, (u64 *)nullptr,
                                         (const int *)nullptr, 0);
                    CHECK(ok, "vocab %d shape %d combo %d: barriers", n, shape, ci);
                    if (!ok)
                        return test_summary("test_sample_emu");
                    if (ci % 5 == 0) { /* another schedule, the same ids */
                        emu_launch(draws, SMP_THREADS, 1000 + ci, k_sample_rows, out2.data(),
                                   (const float *)x.data(), n, (const cuk_sample_param *)ps.data(),
                                   (const float *)nullptr, (u64 *)nullptr,
                                   (const int *)nullptr, 0);
                        for (int d = 0; d < draws; d++)
                            sched_diff += out[d] != out2[d];
                    }
                    { /* the fast path: maxima and probabilities made first */
                        const int nblk = 1 + ci % 5;
                        prep_rows(x.data(), n, ps.data(), draws, nblk, prv, cav, wsv);
                        emu_launch(draws, SMP_THREADS, 2000 + ci, k_sample_rows, out2.data(),
                                   (const float *)x.data(), n, (const cuk_sample_param *)ps.data(),
                                   (const float *)prv.data(), wsv.data(), (const int *)cav.data(),
                                   nblk);
                        for (int d = 0; d < draws; d++) {
                            bool rearmed = true;
                            for (int i = 0; i < SMP_WS_BLK; i++)
                                rearmed = rearmed && wsv[(size_t)d * SMP_WS + i] == 0;
                            prep_diff += out[d] != out2[d] || !rearmed;
                        }
                    }
                    struct sample_ref ref;
                    sample_ref_init(&ref, p, row.data(), n);
                    for (int d = 0; d < draws; d++) {
                        int want = sampler_pick(p, row.data(), n, ps[d].u, pr.data(), idx.data());
                        total++;
                        same += out[d] == want;
                        bool kept = out[d] >= 0 && out[d] < n && sample_ref_prob(&ref, out[d]) > 0;
                        unkept += !kept;
                        if (out[d] != want || !kept)
                            fprintf(stderr, "vocab %d shape %d/%d combo %d u=%.17g: kernel %d, "
                                            "host %d%s\n", n, shape, variant, ci, ps[d].u,
                                    out[d], want, kept ? "" : " (not kept)");
                    }
                    sample_ref_free(&ref);
                }
            }
    }
    printf("test_sample_emu: %ld draws, %ld equal to sampler_pick, %ld not kept, %ld differ "
           "between schedules, %ld with the fast path (%ld rows answered from its candidates, "
           "%ld from one block's span, %ld walked after all)\n", total, same, unkept, sched_diff,
           prep_diff, smp_emu_fast[1], smp_emu_fast[2], smp_emu_fast[0]);
    CHECK(same >= total - total / 200, "%ld of %ld picks differ from sampler_pick", total - same,
          total);
    CHECK(unkept == 0, "%ld picks are tokens the host never picks", unkept);
    CHECK(sched_diff == 0, "%ld picks depend on the thread schedule", sched_diff);
    CHECK(prep_diff == 0, "%ld picks differ (or ws not re-armed) on the fast path", prep_diff);
    CHECK(smp_emu_fast[1] > 0 && smp_emu_fast[2] > 0 && smp_emu_fast[0] > 0,
          "the fast path's outcomes not all taken: %ld answered from candidates, %ld from a "
          "block, %ld walked", smp_emu_fast[1], smp_emu_fast[2], smp_emu_fast[0]);
    return test_summary("test_sample_emu");
}
