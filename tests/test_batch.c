/* test_batch.c - continuous batching never changes results: the greedy
 * output of every request is the same run alone (--batch 1) and inside a
 * batch of 16 with staggered arrivals, departures and cancellations, after a
 * prefix-cache hit and after preemption in a tiny KV pool; 1,000 randomized
 * requests with random cancellations leak no block; --batch 1 is strictly
 * serial; greedy and seeded sampled requests mixed in one batch match their
 * runs alone. Also measures whether the CPU matmul kernels give a row the same
 * bits whatever the number of rows in the call (batch invariance). Models:
 * stories260K and the oracle fixtures. CLLM_TEST_DEVICE=cuda runs the engine
 * parts on the GPU. */
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "base/half.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/quant.h"
#include "testutil.h"

#define NREQ 16
#define MAXTOK 128

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

struct req_spec {
    int prompt[96];
    int n_prompt, max_tokens;
    int cancel_at; /* cancel after this many tokens; 0 = never */
    float temperature; /* 0: greedy */
    int top_k;
    uint64_t seed;
    bool logprobs; /* its rows come back to the host (logits.h) */
};

struct live {
    struct engine_request *r;
    int out[MAXTOK];
    int n;
    enum engine_finish fin;
    bool cancelled;
};

static struct engine_params greedy(int max_tokens)
{
    struct engine_params p = {.sp = {.temperature = 0, .top_p = 1}, .max_tokens = max_tokens,
                              .ignore_eos = true};
    return p;
}

/* Sampled requests must match their runs alone exactly on the CPU; on a
 * device (CLLM_TEST_DEVICE other than cpu) only their first tokens. */
static bool device_tolerant(void)
{
    const char *d = getenv("CLLM_TEST_DEVICE");
    return d && *d && strcmp(d, "cpu") != 0;
}

/* Reads what is ready (waiting up to ms for the first event); returns true
 * once the final event arrived. */
static bool pump(struct live *l, int ms)
{
    struct engine_event ev;
    while (l->fin == ENGINE_FINISH_NONE && engine_request_next(l->r, &ev, ms) == 1) {
        ms = 0;
        if (ev.finish != ENGINE_FINISH_NONE) {
            l->fin = ev.finish;
            if (ev.finish == ENGINE_FINISH_ERROR)
                CHECK(0, "request failed: %s", ev.error);
            break;
        }
        if (l->n < MAXTOK)
            l->out[l->n] = ev.token;
        l->n++;
    }
    return l->fin != ENGINE_FINISH_NONE;
}

static struct engine_request *request_of(const struct req_spec *s)
{
    struct err e = {{0}};
    struct engine_params p = greedy(s->max_tokens);
    p.sp.temperature = s->temperature;
    p.sp.top_k = s->top_k;
    p.sp.seed = s->seed;
    p.logprobs = s->logprobs;
    p.top_logprobs = s->logprobs ? 2 : 0;
    struct engine_request *r = engine_request_new(s->prompt, s->n_prompt, &p, &e);
    CHECK(r != NULL, "request: %s", e.msg);
    return r;
}

static struct engine_request *submit(struct engine *eng, const struct req_spec *s)
{
    struct err e = {{0}};
    struct engine_request *r = request_of(s);
    CHECK(r && engine_submit(eng, r, &e) == 0, "submit: %s", e.msg);
    return r;
}

/* Reference: each request alone on a strict serial engine, no cache. */
static void run_alone(const struct model *m, const struct engine_config *base,
                      const struct req_spec *specs, int n, struct live *ref)
{
    struct err e = {{0}};
    struct engine_config cfg = *base;
    cfg.max_running = 1;
    cfg.prompt_cache_bytes = -1;
    struct engine *eng = engine_create(m, &cfg, &e);
    CHECK(eng != NULL, "engine_create: %s", e.msg);
    if (!eng)
        return;
    for (int i = 0; i < n; i++) {
        memset(&ref[i], 0, sizeof ref[i]);
        ref[i].r = submit(eng, &specs[i]);
        while (!pump(&ref[i], 30000))
            ;
        engine_request_release(ref[i].r);
    }
    engine_destroy(eng);
}

/* Runs specs on eng, cancelling those with cancel_at, and compares each
 * with ref. Arrivals are staggered (a new request every few polls), or
 * with burst all in one engine_submit_many, so the engine's first step
 * sees every one of them whatever the threads' timing (they compete for
 * the pool however fast the device or loaded the machine). */
static void run_batched(struct engine *eng, const struct req_spec *specs, int n,
                        const struct live *ref, const char *what, bool burst)
{
    struct live *l = calloc((size_t)n, sizeof *l);
    int submitted = 0, done = 0;
    if (burst) {
        struct engine_request **rs = calloc((size_t)n, sizeof *rs);
        struct err e = {{0}};
        for (int i = 0; i < n; i++)
            rs[i] = l[i].r = request_of(&specs[i]);
        CHECK(engine_submit_many(eng, rs, n, &e) == 0, "submit_many: %s", e.msg);
        submitted = n;
        free(rs);
    }
    for (int it = 0; done < n; it++) {
        if (submitted < n && (it % 3 == 0 || submitted < 4))
            l[submitted].r = submit(eng, &specs[submitted]), submitted++;
        done = 0;
        for (int i = 0; i < submitted; i++) {
            if (!pump(&l[i], 1) && specs[i].cancel_at && l[i].n >= specs[i].cancel_at &&
                !l[i].cancelled) {
                engine_request_cancel(l[i].r);
                l[i].cancelled = true;
            }
            done += l[i].fin != ENGINE_FINISH_NONE;
        }
        if (submitted < n)
            done = 0;
    }
    for (int i = 0; i < n; i++) {
        int k = l[i].n < MAXTOK ? l[i].n : MAXTOK;
        if (l[i].cancelled) {
            CHECK(k <= ref[i].n && !memcmp(l[i].out, ref[i].out, sizeof(int) * (size_t)k),
                  "%s: request %d (cancelled) diverged", what, i);
            CHECK(l[i].fin == ENGINE_FINISH_CANCELLED || l[i].fin == ENGINE_FINISH_LENGTH,
                  "%s: request %d finish %d", what, i, (int)l[i].fin);
        } else {
            int j = 0;
            while (j < k && j < ref[i].n && l[i].out[j] == ref[i].out[j])
                j++;
            if (specs[i].temperature > 0 && device_tolerant()) {
                /* A device's batched logits differ from alone in the last
                 * bits (bf16 K/V rounding, GEMM shapes), enough to move a
                 * draw later on: the row mapping shows in the first tokens. */
                int need = ref[i].n < 4 ? ref[i].n : 4;
                CHECK(j >= need, "%s: request %d (sampled) differs from alone at token %d", what,
                      i, j);
                if (j < ref[i].n)
                    printf("%s: request %d (sampled) leaves its run alone at token %d of %d\n",
                           what, i, j, ref[i].n);
                engine_request_release(l[i].r);
                continue;
            }
            CHECK(l[i].n == ref[i].n && j == k && l[i].fin == ref[i].fin,
                  "%s: request %d differs from alone: %d vs %d tokens, first difference at %d",
                  what, i, l[i].n, ref[i].n, j);
        }
        engine_request_release(l[i].r);
    }
    free(l);
}

/* Requests sharing a system prefix (so the cache hits), mixed lengths. */
static void make_specs(struct req_spec *s, int n, int vocab, int shared, int max_prompt,
                       int max_tokens, bool cancels)
{
    int sys[96];
    for (int i = 0; i < shared; i++)
        sys[i] = 3 + (int)(rnd() % (uint32_t)(vocab - 3));
    for (int i = 0; i < n; i++) {
        memset(&s[i], 0, sizeof s[i]);
        int extra = 1 + (int)(rnd() % (uint32_t)(max_prompt - shared));
        int use_sys = i % 4 != 3 ? shared : 0;
        s[i].n_prompt = use_sys + extra;
        memcpy(s[i].prompt, sys, sizeof(int) * (size_t)use_sys);
        for (int j = use_sys; j < s[i].n_prompt; j++)
            s[i].prompt[j] = 3 + (int)(rnd() % (uint32_t)(vocab - 3));
        s[i].max_tokens = 4 + (int)(rnd() % (uint32_t)(max_tokens - 4));
        if (cancels && i % 5 == 2)
            s[i].cancel_at = 1 + s[i].max_tokens / 3;
    }
}

/* The n specs alone (into ref), then an engine of base with max_running
 * sequences for them batched; NULL (checked) when it cannot start. */
static struct engine *alone_then_engine(const struct model *m, const struct engine_config *base,
                                        int max_running, const struct req_spec *specs, int n,
                                        struct live *ref)
{
    struct err e = {{0}};
    run_alone(m, base, specs, n, ref);
    struct engine_config cfg = *base;
    cfg.max_running = max_running;
    struct engine *eng = engine_create(m, &cfg, &e);
    CHECK(eng != NULL, "engine_create: %s", e.msg);
    return eng;
}

static void equivalence(const char *name, const struct model *m)
{
    int vocab = m->cfg.vocab_size;
    static struct req_spec specs[NREQ];
    static struct live ref[NREQ];
    struct engine_config base = {.n_threads = 2, .ctx_len = 256, .kv_tokens = 4096,
                                 .prefill_chunk = 8, .max_queue = 64,
                                 .device = getenv("CLLM_TEST_DEVICE")};

    /* 1. Batch of 16, staggered, cancellations; then the same prompts again
     * (prefix-cache hits) on the same engine. */
    make_specs(specs, NREQ, vocab, 40, 90, 60, true);
    struct engine *eng = alone_then_engine(m, &base, 16, specs, NREQ, ref);
    if (!eng)
        return;
    char what[128];
    snprintf(what, sizeof what, "%s batch of 16", name);
    run_batched(eng, specs, NREQ, ref, what, false);
    for (int i = 0; i < NREQ; i++)
        specs[i].cancel_at = 0;
    snprintf(what, sizeof what, "%s after prefix hits", name);
    struct engine_stats st0, st;
    engine_get_stats(eng, &st0);
    run_batched(eng, specs, NREQ, ref, what, false);
    test_wait_idle(eng, &st);
    CHECK(st.cache_hits > st0.cache_hits && st.cache_tokens > st0.cache_tokens,
          "%s: no prefix hits (%llu)", name, (unsigned long long)st.cache_hits);
    CHECK(test_pool_idle(&st), "%s: blocks leaked", name);
    engine_destroy(eng);

    /* 2. Preemption: a pool of 10 blocks for 4 sequences that need ~6 each. */
    make_specs(specs, 6, vocab, 16, 40, 60, false);
    base.ctx_len = 128;
    base.kv_tokens = 160;
    if (!(eng = alone_then_engine(m, &base, 4, specs, 6, ref)))
        return;
    snprintf(what, sizeof what, "%s with preemption", name);
    run_batched(eng, specs, 6, ref, what, true);
    test_wait_idle(eng, &st);
    CHECK(st.preemptions > 0, "%s: no preemption happened", name);
    CHECK(test_pool_idle(&st), "%s: blocks leaked after preemption", name);
    printf("%s: 16-batch, prefix-hit and preemption runs identical to alone (%llu preemptions)\n",
           name, (unsigned long long)st.preemptions);
    engine_destroy(eng);

    /* 3. Greedy and sampled sequences in one batch: the greedy ones take
     * their ids from the step (no logits row) while the sampled ones get
     * theirs, so the rows must map back to the right sequences; a seeded
     * sampled request draws the same tokens batched as alone. */
    make_specs(specs, 12, vocab, 16, 40, 60, false);
    for (int i = 0; i < 12; i++)
        if (i % 3 != 1) {
            specs[i].temperature = i % 3 == 0 ? 0.8f : 1.3f;
            specs[i].top_k = i % 2 ? 40 : 0;
            specs[i].seed = 1000 + (uint64_t)i;
        }
    base.ctx_len = 256;
    base.kv_tokens = 4096;
    if (!(eng = alone_then_engine(m, &base, 12, specs, 12, ref)))
        return;
    snprintf(what, sizeof what, "%s greedy + sampled batch", name);
    run_batched(eng, specs, 12, ref, what, false);
    test_wait_idle(eng, &st);
    CHECK(test_pool_idle(&st), "%s: blocks leaked in the mixed batch", name);
    printf("%s: mixed greedy/sampled batch of 12 checked against alone (%.2f sequences per step)\n",
           name, st.batch_steps ? (double)st.batch_rows / (double)st.batch_steps : 0.0);
    engine_destroy(eng);

    /* 4. The same batch with some sequences taking their rows to the host
     * (logprobs): a batched decode step's rows are in segment order, the
     * host's packed out of them and the others picked, and every request
     * still matches its run alone without logprobs (the references of 3). */
    for (int i = 0; i < 12; i++)
        specs[i].logprobs = i % 4 == 0 || i == 5;
    struct engine_config cfg4 = base;
    cfg4.max_running = 12;
    struct err e4 = {{0}};
    if (!(eng = engine_create(m, &cfg4, &e4))) {
        CHECK(0, "engine_create: %s", e4.msg);
        return;
    }
    snprintf(what, sizeof what, "%s batch with host rows", name);
    run_batched(eng, specs, 12, ref, what, false);
    test_wait_idle(eng, &st);
    CHECK(test_pool_idle(&st), "%s: blocks leaked in the batch with host rows", name);
    printf("%s: batch of 12 with 4 taking rows to the host checked against alone\n", name);
    engine_destroy(eng);
}

/* 1,000 random requests, random cancellations, small pool: no leaks. */
static void churn(const struct model *m)
{
    struct err e = {{0}};
    struct engine_config cfg = {.n_threads = 2, .ctx_len = 128, .kv_tokens = 320,
                                .prefill_chunk = 16, .max_queue = 64, .max_running = 8,
                                .device = getenv("CLLM_TEST_DEVICE")};
    struct engine *eng = engine_create(m, &cfg, &e);
    CHECK(eng != NULL, "engine_create: %s", e.msg);
    if (!eng)
        return;
    enum { TOTAL = 1000, LIVE = 24 };
    struct live *l = calloc(LIVE, sizeof *l);
    int cancel_at[LIVE] = {0};
    int submitted = 0, finished = 0;
    while (finished < TOTAL) {
        for (int i = 0; i < LIVE; i++) {
            if (!l[i].r && submitted < TOTAL) {
                struct req_spec s = {0};
                s.n_prompt = 1 + (int)(rnd() % 60);
                for (int j = 0; j < s.n_prompt; j++)
                    s.prompt[j] = j < 20 ? 5 + j : 3 + (int)(rnd() % 500);
                s.max_tokens = 1 + (int)(rnd() % 40);
                memset(&l[i], 0, sizeof l[i]);
                l[i].r = submit(eng, &s);
                cancel_at[i] = rnd() % 3 == 0 ? (int)(rnd() % 20) : -1;
                if (cancel_at[i] == 0) { /* cancel while (probably) still queued */
                    engine_request_cancel(l[i].r);
                    l[i].cancelled = true;
                }
                submitted++;
            }
            if (!l[i].r)
                continue;
            if (!pump(&l[i], 0) && !l[i].cancelled && cancel_at[i] > 0 && l[i].n >= cancel_at[i]) {
                engine_request_cancel(l[i].r);
                l[i].cancelled = true;
            }
            if (l[i].fin != ENGINE_FINISH_NONE) {
                engine_request_release(l[i].r);
                l[i].r = NULL;
                finished++;
            }
        }
        nanosleep(&(struct timespec){0, 200000}, NULL);
    }
    free(l);
    struct engine_stats st;
    test_wait_idle(eng, &st);
    CHECK(test_pool_idle(&st), "churn: kv blocks leaked: %d of %d free, %d cached (%d idle)",
          st.kv_blocks_free, st.kv_blocks_total, st.cache_blocks, st.cache_blocks_idle);
    CHECK(st.requests_total == TOTAL, "churn: %llu requests", (unsigned long long)st.requests_total);
    printf("churn: %d requests, %llu cancelled, %llu preemptions, %.2f sequences per step\n", TOTAL,
           (unsigned long long)st.requests_cancelled, (unsigned long long)st.preemptions,
           st.batch_steps ? (double)st.batch_rows / (double)st.batch_steps : 0.0);
    engine_set_prompt_cache(eng, -1); /* idle: empties the index at once */
    engine_get_stats(eng, &st);
    CHECK(st.kv_blocks_free == st.kv_blocks_total, "churn: pool not all free without the cache");
    engine_destroy(eng);
}

/* --batch 1: while one request runs, the next produces nothing. */
static void strict_serial(const struct model *m)
{
    struct err e = {{0}};
    struct engine_config cfg = {.n_threads = 2, .ctx_len = 512, .prefill_chunk = 8,
                                .max_queue = 8, .max_running = 1};
    struct engine *eng = engine_create(m, &cfg, &e);
    CHECK(eng != NULL, "engine_create: %s", e.msg);
    if (!eng)
        return;
    struct req_spec a = {.prompt = {1}, .n_prompt = 1, .max_tokens = 300};
    struct req_spec b = {.prompt = {1, 5}, .n_prompt = 2, .max_tokens = 5};
    struct live la = {0}, lb = {0};
    la.r = submit(eng, &a);
    lb.r = submit(eng, &b);
    bool overlap = false;
    int max_running = 0;
    while (!pump(&la, 1)) {
        struct engine_stats st;
        engine_get_stats(eng, &st);
        if (st.running > max_running)
            max_running = st.running;
        /* B's first token was pushed after every event of A that came
         * before it, so once B shows a token, draining A must give all of
         * A's tokens; fewer means B ran while A still had tokens to make.
         * (Checking B between A's last token and A's finish event would
         * race: the engine starts B the moment A finishes.) */
        if (pump(&lb, 0) || lb.n > 0) {
            pump(&la, 0);
            if (la.n < 300)
                overlap = true;
        }
    }
    while (!pump(&lb, 1000))
        ;
    CHECK(!overlap && max_running <= 1 && la.n == 300 && lb.n == 5,
          "--batch 1 not serial: overlap %d, running %d", overlap, max_running);
    engine_request_release(la.r);
    engine_request_release(lb.r);
    engine_destroy(eng);
}

/* Batch invariance of the CPU matmul: row i computed in a call of n rows
 * vs alone. Returns the largest difference relative to the row's largest
 * output magnitude (0 = bit-identical); *over counts the outputs further
 * apart than 1e-5 of that magnitude plus xround sum_k |w_k x_k| (x rounded
 * in one of the calls to a grid that fine, relatively). */
static double matmul_invariance(struct backend *be, enum dtype dt, int n, int rows, int cols,
                                double xround, int *over)
{
    struct err e = {{0}};
    size_t rb = dtype_row_bytes(dt, cols);
    uint8_t *w = malloc(rb * (size_t)rows);
    float *x = malloc(sizeof(float) * (size_t)n * cols);
    float *all = malloc(sizeof(float) * (size_t)n * rows), *one = malloc(sizeof(float) * rows);
    for (int64_t r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
            float v = ((float)(rnd() % 20001) - 10000.0f) / 10000.0f;
            uint8_t *row = w + (size_t)r * rb;
            if (dt == DT_F32)
                ((float *)row)[c] = v;
            else if (dt == DT_F16)
                ((uint16_t *)row)[c] = f32_to_f16(v);
            else if (dt == DT_BF16)
                ((uint16_t *)row)[c] = f32_to_bf16(v);
        }
        if (dt == DT_Q8_0) {
            float tmp[4096];
            for (int c = 0; c < cols; c++)
                tmp[c] = ((float)(rnd() % 20001) - 10000.0f) / 10000.0f;
            quantize_row_q8_0(tmp, (struct block_q8_0 *)(w + (size_t)r * rb), cols);
        }
    }
    for (size_t i = 0; i < (size_t)n * cols; i++)
        x[i] = ((float)(rnd() % 20001) - 10000.0f) / 10000.0f;
    struct tensor t = {.dtype = dt, .rows = rows, .cols = cols, .data = w};
    float *wf = malloc(sizeof(float) * (size_t)rows * cols); /* widened once */
    for (int r = 0; r < rows; r++)
        quant_dequantize_row(dt, w + (size_t)r * rb, wf + (size_t)r * cols, cols);
    double worst = 0;
    *over = 0;
    CHECK(be->ops->matmul(be, all, x, n, &t, &e) == 0, "matmul: %s", e.msg);
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * cols;
        CHECK(be->ops->matmul(be, one, xi, 1, &t, &e) == 0, "matmul: %s", e.msg);
        double scale = 0; /* relative to the output row's largest magnitude */
        for (int r = 0; r < rows; r++)
            scale = fmax(scale, fabs(one[r]));
        for (int r = 0; r < rows; r++) {
            double abssum = 0;
            for (int c = 0; c < cols; c++)
                abssum += fabs((double)wf[(size_t)r * cols + c] * xi[c]);
            double d = fabs(all[(size_t)i * rows + r] - one[r]);
            *over += d > 1e-5 * scale + xround * abssum;
            if (d / scale > worst)
                worst = d / scale;
        }
    }
    free(wf);
    free(w);
    free(x);
    free(all);
    free(one);
    return worst;
}

static void invariance(void)
{
    /* bf16dot = 0: f32 activations everywhere (CLLM_CPU_BF16DOT=0); 1: the
     * default, where a call of CPU_MATMUL_BF16DOT_MIN_TOKENS tokens on bf16
     * weights rounds them to bf16 if the CPU has bf16 dot products */
    for (int bf16dot = 0; bf16dot < 2; bf16dot++) {
        struct err e = {{0}};
        setenv("CLLM_CPU_BF16DOT", bf16dot ? "1" : "0", 1);
        struct backend *be = backend_cpu_create(2, &e);
        unsetenv("CLLM_CPU_BF16DOT");
        CHECK(be != NULL, "cpu backend: %s", e.msg);
        if (!be)
            return;
        const enum dtype dts[] = {DT_F32, DT_F16, DT_BF16, DT_Q8_0};
        const int ns[] = {2, 7, 33};
        for (size_t d = 0; d < 4; d++)
            for (size_t k = 0; k < 3; k++) {
                /* The stated tolerance (docs/design.md): a few f32 ulps of
                 * the dot product's magnitude; and for a bf16 prompt with
                 * its activations rounded, that rounding (2^-8 of each
                 * |x| at most) on top */
                const bool rounded = bf16dot && dts[d] == DT_BF16 &&
                                     ns[k] >= CPU_MATMUL_BF16DOT_MIN_TOKENS;
                int over = 0;
                double rel = matmul_invariance(be, dts[d], ns[k], 67, 1024,
                                               rounded ? 1.0 / 256 : 0, &over);
                printf("matmul %s%s: row in a call of n=%d vs alone: max rel diff %.3g%s\n",
                       dtype_name(dts[d]), bf16dot ? "" : " (CLLM_CPU_BF16DOT=0)", ns[k], rel,
                       rel == 0 ? " (bit-identical)" : "");
                CHECK(over == 0, "matmul %s n=%d bf16dot=%d: %d outputs past the bound (max "
                      "rel diff %g)", dtype_name(dts[d]), ns[k], bf16dot, over, rel);
            }
        backend_destroy(be);
    }
}

int main(void)
{
    invariance();
    char path[1024];
    struct err e = {{0}};
    struct model m;
    /* The GPU machine runs a packed binary: env overrides the build paths. */
    const char *shared = getenv("CLLM_SHARED_DIR") ? getenv("CLLM_SHARED_DIR") : CLLM_SHARED_DIR;
    const char *fixtures = getenv("CLLM_FIXTURES_DIR") ? getenv("CLLM_FIXTURES_DIR") : CLLM_FIXTURES_DIR;
    snprintf(path, sizeof path, "%s/models/stories260K", shared);
    if (model_load(&m, path, &e)) {
        CHECK(0, "%s", e.msg);
        return test_summary("test_batch");
    }
    equivalence("stories260K", &m);
    strict_serial(&m);
    churn(&m);
    model_free(&m);
    const char *oracles[] = {"llama", "qwen2"};
    for (size_t i = 0; i < sizeof oracles / sizeof oracles[0]; i++) {
        snprintf(path, sizeof path, "%s/oracle/%s", fixtures, oracles[i]);
        if (model_load(&m, path, &e)) {
            CHECK(0, "%s", e.msg);
            continue;
        }
        equivalence(oracles[i], &m);
        model_free(&m);
    }
    return test_summary("test_batch");
}
