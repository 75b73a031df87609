/* test_models.c - the forward pass against oracles: the two real trained
 * models in ../shared/models reproduce their recorded greedy ids, and the
 * random-weight fixtures made with Hugging Face transformers
 * (tests/fixtures/gen_oracle.py) match its float32 logits and greedy ids. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "base/argmax.h"
#include "engine/sampler.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "oracle.h"
#include "testutil.h"

/* A runner on a CPU backend of `threads` threads. */
static int cpu_runner(struct runner *r, const char *path, int threads, int batch)
{
    struct err e = {{0}};
    struct backend *be = backend_cpu_create(threads, &e);
    CHECK(be != NULL, "cpu backend: %s", e.msg);
    return runner_open(r, path, be, true, batch, 64);
}

/* The expected_greedy.json of a shared model: steps counts positions, so
 * steps - n_prompt + 1 ids follow the prompt (for stories260K the recorded
 * ids also repeat the forced prompt tokens after BOS). */
static void check_expected_greedy(const char *model_dir, int threads)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/expected_greedy.json", model_dir);
    json_t *root = test_json_load(path);
    if (!root)
        return;
    struct runner r;
    if (cpu_runner(&r, model_dir, threads, 7) == 0) {
        json_t *cases = json_object_get(root, "cases");
        for (size_t i = 0; i < json_array_size(cases); i++) {
            json_t *c = json_array_get(cases, i);
            int np, ne;
            int *prompt = test_json_ids(json_object_get(c, "prompt_ids"), &np);
            int *want = test_json_ids(json_object_get(c, "generated_ids"), &ne);
            int forced = ne - ((int)json_integer_value(json_object_get(c, "steps")) - np + 1);
            int n_gen = ne - forced;
            int *got = calloc((size_t)ne + 1, sizeof(int));
            int n = runner_greedy(&r, prompt, np, n_gen, got, false, NULL);
            int same = n == n_gen && !memcmp(got, want + forced, sizeof(int) * (size_t)n_gen);
            int k = 0;
            while (k < n && k < n_gen && got[k] == want[forced + k])
                k++;
            const char *isa = getenv("CLLM_ISA");
            CHECK(same, "%s case %s (threads %d, %s): first mismatch at generated id %d of %d (got %d)",
                  model_dir, json_string_value(json_object_get(c, "name")), threads,
                  isa ? isa : "the best ISA", k, n_gen, n);
            for (int f = 0; f < forced; f++)
                CHECK(want[f] == prompt[f + 1], "forced ids follow the prompt");
            free(prompt);
            free(want);
            free(got);
        }
        runner_close(&r);
    }
    json_decref(root);
}

/* tol: relative logits error allowed against ref.json's logits; kv: the
 * cache's element type (CLLM_KV_DTYPE). With a bf16 cache only the first 4
 * greedy ids must match: it moves logits by ~1e-2 relative, and the
 * random-weight fixtures have near-ties that then flip (as on CUDA). */
static void check_oracle(const char *dir, int threads, int batch, double tol, const char *kv)
{
    setenv("CLLM_KV_DTYPE", kv, 1);
    struct runner r;
    int rc = cpu_runner(&r, dir, threads, batch);
    unsetenv("CLLM_KV_DTYPE");
    if (rc)
        return;
    bool bf16 = strcmp(kv, "bf16") == 0;
    char label[64];
    snprintf(label, sizeof label, "threads %d, batch %d, %s K/V", threads, batch, kv);
    double worst = oracle_check(&r, dir, tol, bf16 ? 4 : -1, true, label);
    if (bf16) {
        const char *slash = strrchr(dir, '/');
        printf("oracle %-12s %s: max logits rel err %.2e (tol %.0e)\n", slash ? slash + 1 : dir,
               label, worst, tol);
    }
    runner_close(&r);
}

/* The same oracle through GGUF: the HF model is converted with our writer
 * (llama q/k permuted as llama.cpp does, so the interleaved-rope path runs)
 * and reloaded. f32 must still meet the 1e-4 contract. Q8_0 quantizes both
 * weights and activations to 8 bits per 32-block; measured error is 2-4% of
 * the logit range, so 8e-2 is the stated bound. */
static void check_gguf_oracle(const char *dir, const char *name)
{
    struct model m;
    struct err e = {{0}};
    if (model_load(&m, dir, &e)) {
        CHECK(0, "%s: %s", dir, e.msg);
        return;
    }
    /* llama3's scaling goes to GGUF as llama.cpp stores it, a rope_freqs
     * tensor, read back as per-frequency divisors */
    const bool freqs = m.cfg.rope_scaling == ROPE_SCALING_LLAMA3;
    enum dtype dts[] = {DT_F32, DT_Q8_0};
    double tols[] = {1e-4, 8e-2};
    for (int k = 0; k < 2; k++) {
        char out[1100];
        snprintf(out, sizeof out, "/tmp/cllm_test_%s_%d_%s.gguf", name, (int)getpid(), dtype_name(dts[k]));
        int rc = gguf_write_model(&m, dts[k], out, &e);
        CHECK(rc == 0, "%s -> gguf %s: %s", name, dtype_name(dts[k]), e.msg);
        if (rc)
            continue;
        struct runner r;
        if (cpu_runner(&r, out, 2, 16) == 0) {
            CHECK(!freqs || (r.m.cfg.rope_scaling == ROPE_SCALING_FREQS && r.m.cfg.rope_freqs),
                  "%s: llama3 scaling read back from rope_freqs.weight", name);
            CHECK(r.m.cfg.rope_interleaved == (!strcmp(m.cfg.arch, "llama") || !strcmp(m.cfg.arch, "mistral")),
                  "%s: rope convention after GGUF round trip", name);
            double re = oracle_case_err(&r, dir, 2);
            CHECK(re <= tols[k], "%s via GGUF %s: logits rel err %.3g > %.3g", name,
                  dtype_name(dts[k]), re, tols[k]);
            if (dts[k] == DT_Q8_0)
                printf("%s via GGUF q8_0: logits rel err %.4f\n", name, re);
            runner_close(&r);
        }
        unlink(out);
    }
    model_free(&m);
}

/* GGUF's 2-6-bit formats through the whole model: dir's model written in
 * each (rows their blocks do not divide fall back to Q8_0 or f32, as the
 * writer does), then the same weights widened to f32 (the quantized model
 * written back as an f32 GGUF): the two must give the same logits up to
 * the rounding of the activations to 8 bits, which these formats' matmul
 * does as Q8_0's does (check_gguf_oracle's Q8_0 bound), so every tensor's
 * blocks were read as the f32 file holds them (embedding, layers, head). */
static void check_gguf_widened(const char *dir, const char *name)
{
    struct model m;
    struct err e = {{0}};
    if (model_load(&m, dir, &e)) {
        CHECK(0, "%s: %s", dir, e.msg);
        return;
    }
    const enum dtype dts[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K,
                              DT_Q5_K, DT_Q6_K, DT_Q2_K, DT_Q3_K};
    const int prompt[] = {1, 5, 9, 200, 31, 7, 77, 13, 400, 2, 99, 64};
    const int np = (int)(sizeof prompt / sizeof prompt[0]);
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        char q[1100], f[1100];
        snprintf(q, sizeof q, "/tmp/cllm_test_%s_%d_%s.gguf", name, (int)getpid(), dtype_name(dts[k]));
        snprintf(f, sizeof f, "/tmp/cllm_test_%s_%d_%s_f32.gguf", name, (int)getpid(), dtype_name(dts[k]));
        const int wide = oracle_gguf_pair(&m, dts[k], q, f, name); /* matrices in the format */
        const int rc = wide < 0 ? -1 : 0;
        CHECK(wide != 0 || dtype_block_elems(dts[k]) > m.cfg.hidden_dim,
              "%s %s: no matrix in the format", name, dtype_name(dts[k]));
        struct runner rq, rf;
        if (rc == 0 && cpu_runner(&rq, q, 2, 16) == 0) {
            if (cpu_runner(&rf, f, 2, 16) == 0) {
                float *lq = runner_logits(&rq, prompt, np), *lf = runner_logits(&rf, prompt, np);
                double num = 0, den = 0;
                for (size_t i = 0; lq && lf && i < (size_t)np * (size_t)m.cfg.vocab_size; i++) {
                    num = fmax(num, fabs((double)lq[i] - lf[i]));
                    den = fmax(den, fabs((double)lf[i]));
                }
                CHECK(lq && lf && num <= 8e-2 * den, "%s %s: logits %.3g (relative) from its f32 widening",
                      name, dtype_name(dts[k]), den > 0 ? num / den : INFINITY);
                printf("%s %s: logits %.4f (relative) from its f32 widening\n", name,
                       dtype_name(dts[k]), den > 0 ? num / den : INFINITY);
                free(lq);
                free(lf);
                runner_close(&rf);
            }
            runner_close(&rq);
        }
        unlink(q);
        unlink(f);
    }
    model_free(&m);
}

/* tinystories-656k against transformers itself (tinystories_hf.json): the
 * shared expected_greedy.json was made by an independent implementation. */
static void check_tinystories_hf(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/models/tinystories-656k", CLLM_SHARED_DIR);
    struct runner r;
    if (cpu_runner(&r, path, 2, 64) == 0) {
        oracle_tinystories(&r, CLLM_FIXTURES_DIR, "cpu");
        runner_close(&r);
    }
}

static void check_load_errors(void)
{
    struct model m;
    struct err e = {{0}};
    CHECK(model_load(&m, "/nonexistent/model", &e) == -1 && strstr(e.msg, "/nonexistent/model"),
          "missing path error names it: %s", e.msg);

    /* A truncated safetensors file must be reported, naming the file. */
    char dir[] = "/tmp/cllm_test_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char src[1024], dst[1100];
    snprintf(src, sizeof src, "%s/models/tinystories-656k/config.json", CLLM_SHARED_DIR);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    size_t len, cfg_len;
    char *cfg = test_read_file(src, &cfg_len);
    snprintf(src, sizeof src, "%s/models/tinystories-656k/model.safetensors", CLLM_SHARED_DIR);
    char *st = test_read_file(src, &len);
    snprintf(src, sizeof src, "%s/models/stories260K/stories260K.bin", CLLM_SHARED_DIR);
    size_t ck_len;
    char *ck = test_read_file(src, &ck_len);
    /* without the shared sample models: one failure, not a crash */
    CHECK(cfg && st && ck && ck_len > 4, "load errors: sample models under %s", CLLM_SHARED_DIR);
    if (!cfg || !st || !ck || ck_len <= 4) {
        free(cfg);
        free(st);
        free(ck);
        rmdir(dir);
        return;
    }
    FILE *f = fopen(dst, "wb");
    fwrite(cfg, 1, cfg_len, f);
    fclose(f);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    size_t cuts[] = {0, 4, 8, 100, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        f = fopen(dst, "wb");
        fwrite(st, 1, cuts[i], f);
        fclose(f);
        memset(&e, 0, sizeof e);
        CHECK(model_load(&m, dir, &e) == -1 && strstr(e.msg, "model.safetensors"),
              "truncated at %zu: error names the file: %s", cuts[i], e.msg);
    }
    /* Unsupported architecture. */
    f = fopen(dst, "wb");
    fwrite(st, 1, len, f);
    fclose(f);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    f = fopen(dst, "wb");
    fputs("{\"model_type\": \"gpt2\", \"hidden_size\": 8}", f);
    fclose(f);
    CHECK(model_load(&m, dir, &e) == -1 && strstr(e.msg, "gpt2") && strstr(e.msg, "config.json"),
          "unsupported arch: %s", e.msg);
    /* Config disagreeing with the weights. */
    char *bad = strdup(cfg);
    char *hs = strstr(bad, "\"num_hidden_layers\": 2");
    if (hs)
        hs[strlen("\"num_hidden_layers\": ")] = '3';
    f = fopen(dst, "wb");
    fputs(bad, f);
    fclose(f);
    CHECK(hs && model_load(&m, dir, &e) == -1 && strstr(e.msg, "missing tensor"),
          "inconsistent config: %s", e.msg);
    free(bad);
    /* Truncated llama2.c checkpoint. */
    snprintf(dst, sizeof dst, "%s/trunc.bin", dir);
    f = fopen(dst, "wb");
    fwrite(ck, 1, ck_len - 4, f);
    fclose(f);
    CHECK(model_load(&m, dst, &e) == -1 && strstr(e.msg, "trunc.bin"), "truncated llama2c: %s", e.msg);
    /* A header whose vocab_size is INT32_MIN (found by fuzz_model: its
     * negation overflowed): refused as not a checkpoint. */
    snprintf(dst, sizeof dst, "%s/minvocab.bin", dir);
    f = fopen(dst, "wb");
    const int32_t hdr[7] = {8, 16, 1, 2, 1, INT32_MIN, 64};
    fwrite(hdr, 1, sizeof hdr, f);
    fwrite(ck + sizeof hdr, 1, ck_len - sizeof hdr, f);
    fclose(f);
    CHECK(model_load(&m, dst, &e) == -1 && strstr(e.msg, "minvocab.bin") &&
              strstr(e.msg, "-2147483648"),
          "INT32_MIN vocab: %s", e.msg);
    free(ck);
    free(cfg);
    free(st);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

/* Every oracle fixture: 1 thread, whole prompt; 2 threads, chunks of 5
 * (prefill in chunks must not change results); a bf16 cache; then through
 * GGUF. */
static void check_fixture(const char *dir, const char *name)
{
    check_oracle(dir, 1, 64, 1e-4, "f32");
    check_oracle(dir, 2, 5, 1e-4, "f32");
    check_oracle(dir, 2, 5, 2e-2, "bf16");
    check_gguf_oracle(dir, name);
    check_gguf_widened(dir, name);
}

/* forward_init_rows: a state with logits for fewer rows than tokens gives
 * every row's logits in passes of that many rows, the same as one pass
 * (within the CPU kernels' rounding, which differs with the row count:
 * 4e-5 relative here; a row in the wrong place would be off by O(1)) and
 * the same greedy pick of each row, and refuses a step that
 * wants more rows, and rows past its tokens, with a message. */
static void check_logit_rows(const char *model_dir)
{
    struct runner r;
    if (cpu_runner(&r, model_dir, 2, 32))
        return;
    enum { N = 20, ROWS = 6 };
    int prompt[N];
    for (int i = 0; i < N; i++)
        prompt[i] = 1 + (i * 37) % (r.m.cfg.vocab_size - 1);
    float *one = runner_logits(&r, prompt, N);
    struct forward_state fs;
    struct err e = {{0}};
    CHECK(forward_init_rows(&fs, &r.m, r.be, 8, 9, &e) != 0 && strstr(e.msg, "logits for 9 rows"),
          "logit rows past the tokens refused: '%s'", e.msg);
    int rc = forward_init_rows(&fs, &r.m, r.be, 32, ROWS, &e);
    CHECK(rc == 0, "forward_init_rows: %s", e.msg);
    size_t V = (size_t)r.m.cfg.vocab_size;
    float *rows = malloc(sizeof(float) * N * V);
    if (rc == 0 && one && rows) {
        struct kv_seq seq = {0};
        rc = forward_tokens(&fs, &r.pool, &seq, prompt, N, true, rows, &e);
        CHECK(rc == 0, "all logits in passes of %d rows: %s", ROWS, e.msg);
        kv_seq_release(&r.pool, &seq);
        double worst = 0;
        for (size_t i = 0; rc == 0 && i < N * V; i++) {
            double d = fabs((double)rows[i] - one[i]) / (fabs((double)one[i]) + 1e-3);
            worst = d > worst ? d : worst;
        }
        int same = 0;
        for (int i = 0; rc == 0 && i < N; i++)
            same += argmax_f32(rows + i * V, (int)V) == argmax_f32(one + i * V, (int)V);
        CHECK(same == N, "greedy picks of passes of %d rows: %d of %d the same", ROWS, same, N);
        CHECK(rc == 0 && worst < 1e-3, "passes of %d rows against one pass: %g relative", ROWS,
              worst);
        int ids[N];
        seq = (struct kv_seq){0};
        e.msg[0] = 0;
        CHECK(forward_tokens_argmax(&fs, &r.pool, &seq, prompt, ROWS + 1, rows, ids, &e) != 0 &&
                  strstr(e.msg, "1..6"),
              "a pick of every row of %d refused: '%s'", ROWS + 1, e.msg);
        kv_seq_release(&r.pool, &seq);
        /* more rows with logits than the state holds, in one step */
        struct kv_seq seqs[ROWS + 1] = {{0}};
        struct forward_seg segs[ROWS + 1];
        for (int s = 0; s <= ROWS; s++)
            segs[s] = (struct forward_seg){.seq = &seqs[s], .tokens = prompt + s, .n = 1,
                                           .logits = true};
        e.msg[0] = 0;
        CHECK(forward_batch(&fs, &r.pool, segs, ROWS + 1, rows, &e) != 0 &&
                  strstr(e.msg, "logits of 7 rows in one step, at most 6"),
              "a step of %d rows with logits refused: '%s'", ROWS + 1, e.msg);
        for (int s = 0; s <= ROWS; s++)
            kv_seq_release(&r.pool, &seqs[s]);
    }
    if (rc == 0)
        forward_free(&fs);
    free(rows);
    free(one);
    runner_close(&r);
}

/* Decoding one step ahead (forward_pipe_*) on a backend without
 * argmax_async: every step runs at once and its id is queued, the ids
 * those of plain greedy decoding; and misuse is refused with a message. */
static void check_pipe(const char *model_dir)
{
    struct runner r;
    if (cpu_runner(&r, model_dir, 2, 8))
        return;
    enum { N = 24 };
    int prompt[] = {1, 403, 22, 97, 5}, want[N], got[N];
    int nw = runner_greedy(&r, prompt, 5, N, want, true, NULL);
    int ng = runner_greedy_ahead(&r, prompt, 5, N, got);
    CHECK(nw == N && ng == N && !memcmp(want, got, sizeof want),
          "%s: greedy one step ahead differs from plain greedy (%d, %d ids)", model_dir, nw, ng);
    struct err e = {{0}};
    struct kv_seq seq = {0};
    int id = -1, tok = prompt[1];
    CHECK(forward_pipe_take(&r.fs, &id, &e) != 0 && strstr(e.msg, "no greedy step in flight"),
          "a take with nothing in flight refused: '%s'", e.msg);
    e.msg[0] = 0;
    CHECK(forward_pipe_issue(&r.fs, &r.pool, &seq, NULL, &e) != 0 &&
              strstr(e.msg, "no greedy step in flight whose id"),
          "a step fed the id of none refused: '%s'", e.msg);
    e.msg[0] = 0;
    int rc = forward_pipe_issue(&r.fs, &r.pool, &seq, &tok, &e) ||
             forward_pipe_issue(&r.fs, &r.pool, &seq, NULL, &e);
    CHECK(rc == 0 && seq.n_tokens == 2, "two steps queued: %s (%d tokens)", e.msg, seq.n_tokens);
    CHECK(forward_pipe_issue(&r.fs, &r.pool, &seq, NULL, &e) != 0 && strstr(e.msg, "two greedy"),
          "a third step in flight refused: '%s'", e.msg);
    e.msg[0] = 0;
    CHECK(forward_pipe_drop(&r.fs, &e) == 0 && r.fs.pipe.n == 0 && seq.n_tokens == 2,
          "drop: %s (%d in flight, %d tokens)", e.msg, r.fs.pipe.n, seq.n_tokens);
    kv_seq_release(&r.pool, &seq);
    runner_close(&r);
}

int main(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K", CLLM_SHARED_DIR);
    check_expected_greedy(path, 1);
    check_expected_greedy(path, 2);
    check_logit_rows(path);
    check_pipe(path);
    snprintf(path, sizeof path, "%s/models/tinystories-656k", CLLM_SHARED_DIR);
    check_expected_greedy(path, 2);
    /* the same ids through every other kernel family the machine runs
     * (matmuls and attention: CLLM_ISA lowers the backend's choice) */
    for (int isa = CPU_ISA_SCALAR; isa < (int)cpu_isa_hw(); isa++) {
        setenv("CLLM_ISA", cpu_isa_name((enum cpu_isa)isa), 1);
        check_expected_greedy(path, 2);
        unsetenv("CLLM_ISA");
    }

    int n_models = oracle_each(CLLM_FIXTURES_DIR, check_fixture);
    CHECK(n_models >= 5, "expected oracle fixtures for llama, llama3, mistral, qwen2, qwen3 (found %d)",
          n_models);
    check_tinystories_hf();
    check_load_errors();
    return test_summary("test_models");
}
