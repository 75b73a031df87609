/* test_engine.c - the engine thread and its request channels: greedy output
 * through the engine equals the recorded ids, requests queue in order, the
 * queue bound holds, cancellation stops a request at the next step, and
 * shutdown ends every request with a final event. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <math.h>

#include "base/clock.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "oracle.h"
#include "tokenizer/tokenizer.h"
#include "testutil.h"


/* Reads events until the final one; returns the number of tokens. Every
 * event must carry the same n_cached as the final one, and a time stamp
 * (engine_event.t) no earlier than the one before and no later than its
 * reading. */
static int drain(struct engine_request *r, int *out, int cap, struct engine_event *last)
{
    int n = 0, cached = -1;
    double t_prev = 0;
    struct engine_event ev;
    while (engine_request_next(r, &ev, 30000) == 1) {
        if (cached >= 0 && ev.n_cached != cached)
            CHECK(0, "n_cached changed mid-stream: %d -> %d", cached, ev.n_cached);
        cached = ev.n_cached;
        if (!(ev.t >= t_prev && ev.t > 0 && ev.t <= clock_now_s()))
            CHECK(0, "event time %.6f after %.6f, read at %.6f", ev.t, t_prev, clock_now_s());
        t_prev = ev.t;
        if (ev.finish != ENGINE_FINISH_NONE) {
            *last = ev;
            return n;
        }
        if (n < cap)
            out[n] = ev.token;
        n++;
    }
    CHECK(0, "timed out waiting for events");
    return n;
}

/* Submits a request and drains it; returns the token count. */
static int run_one(struct engine *eng, const int *prompt, int n_prompt, int max_tokens, int *out,
                   struct engine_event *last)
{
    struct err e = {{0}};
    struct engine_params p = {.sp = {.temperature = 0, .top_p = 1}, .max_tokens = max_tokens};
    struct engine_request *r = engine_request_new(prompt, n_prompt, &p, &e);
    if (!r || engine_submit(eng, r, &e)) {
        CHECK(0, "submit: %s", e.msg);
        engine_request_release(r);
        memset(last, 0, sizeof *last);
        return 0;
    }
    int n = drain(r, out, 512, last);
    engine_request_release(r);
    return n;
}

/* The prefix cache through the engine: reuse counts, identical greedy
 * output with and without it, eviction, and no leaks under churn. */
static void prefix_cache_tests(const struct model *m, const int *want)
{
    struct err e = {{0}};
    struct engine_config cfg = {.n_threads = 2, .ctx_len = 512, .prefill_chunk = 8, .max_queue = 64};
    struct engine *eng = engine_create(m, &cfg, &e);
    CHECK(eng != NULL, "engine_create: %s", e.msg);
    if (!eng)
        return;
    struct engine_event last;
    int a[512], b[512];

    /* 1. The same greedy request twice: the second reuses every full block
     * of the prompt but its last token, and the tokens are identical. The
     * prompt is BOS + the first 50 greedy ids, so the output continues them. */
    int P[51];
    P[0] = 1;
    memcpy(P + 1, want, sizeof(int) * 50);
    int na = run_one(eng, P, 51, 30, a, &last);
    CHECK(last.n_cached == 0 && na == 30 && !memcmp(a, want + 50, sizeof(int) * 30),
          "first run: %d cached, %d tokens", last.n_cached, na);
    int nb = run_one(eng, P, 51, 30, b, &last);
    CHECK(last.n_cached == (51 - 1) / 16 * 16, "second run cached %d, want 48", last.n_cached);
    CHECK(nb == na && !memcmp(a, b, sizeof(int) * (size_t)na), "cache hit changed the output");
    /* a prompt of exactly 3 blocks still computes its last token */
    int n48 = run_one(eng, P, 48, 5, b, &last);
    CHECK(last.n_cached == 32 && n48 == 5 && !memcmp(b, want + 47, sizeof(int) * 5),
          "48-token prompt: %d cached", last.n_cached);

    /* 2. Sharing only the first 2 blocks: exactly 32 tokens reused, output
     * equal to the run with the cache disabled. */
    int Q[52];
    memcpy(Q, P, sizeof(int) * 32);
    for (int i = 32; i < 52; i++)
        Q[i] = 100 + 7 * i % 300;
    struct engine_stats st;
    test_wait_idle(eng, &st); /* the cap applies at once only when idle */
    engine_set_prompt_cache(eng, -1);
    engine_get_stats(eng, &st);
    CHECK(st.cache_blocks == 0 && st.cache_max_blocks == 0 && st.kv_blocks_free == st.kv_blocks_total,
          "disabled: %d cached, %d of %d free", st.cache_blocks, st.kv_blocks_free, st.kv_blocks_total);
    int nq = run_one(eng, Q, 52, 40, a, &last);
    CHECK(last.n_cached == 0 && nq > 0, "uncached Q: %d", last.n_cached);
    test_wait_idle(eng, &st);
    CHECK(st.kv_blocks_free == st.kv_blocks_total, "disabled cache keeps nothing");
    engine_set_prompt_cache(eng, 0);
    run_one(eng, P, 51, 30, b, &last);
    CHECK(last.n_cached == 0, "index was emptied by disabling");
    int nq2 = run_one(eng, Q, 52, 40, b, &last);
    CHECK(last.n_cached == 32, "Q reused %d tokens, want 32", last.n_cached);
    CHECK(nq2 == nq && !memcmp(a, b, sizeof(int) * (size_t)nq), "Q output differs with the cache");
    engine_get_stats(eng, &st);
    CHECK(st.cache_hits >= 2 && st.cache_misses >= 2 && st.cache_tokens >= 48 + 32 + 32,
          "stats: %llu hits %llu misses %llu tokens", (unsigned long long)st.cache_hits,
          (unsigned long long)st.cache_misses, (unsigned long long)st.cache_tokens);
    engine_destroy(eng);

    /* 3. A pool of 8 blocks: three 5-block requests evict each other's
     * blocks; every output equals the uncached reference. */
    struct engine_config small = {.n_threads = 2, .ctx_len = 128, .kv_tokens = 128,
                                  .prefill_chunk = 8, .max_queue = 64, .prompt_cache_bytes = -1};
    int prompts[3][41], ref[3][64], nref[3];
    for (int k = 0; k < 3; k++) {
        prompts[k][0] = 1;
        for (int i = 1; i < 41; i++)
            prompts[k][i] = k == 0 ? want[i - 1] : 20 + (i * (k + 3) * 13) % 400;
    }
    eng = engine_create(m, &small, &e);
    CHECK(eng != NULL, "small engine: %s", e.msg);
    if (!eng)
        return;
    for (int k = 0; k < 3; k++)
        nref[k] = run_one(eng, prompts[k], 41, 40, ref[k], &last);
    engine_set_prompt_cache(eng, 0); /* applies before the next request if not idle */
    int order[7] = {0, 0, 1, 2, 0, 1, 1};
    for (int j = 0; j < 7; j++) {
        int k = order[j];
        int n = run_one(eng, prompts[k], 41, 40, a, &last);
        CHECK(n == nref[k] && !memcmp(a, ref[k], sizeof(int) * (size_t)n),
              "small pool, run %d (prompt %d, %d cached): output differs", j, k, last.n_cached);
        if (j == 1 || j == 6)
            CHECK(last.n_cached == 32, "run %d cached %d, want 32", j, last.n_cached);
    }
    test_wait_idle(eng, &st);
    CHECK(st.cache_evictions > 0 && test_pool_idle(&st), "small pool: %llu evictions, %d free %d idle",
          (unsigned long long)st.cache_evictions, st.kv_blocks_free, st.cache_blocks_idle);
    engine_destroy(eng);

    /* 4. Churn: 200 randomized requests over shared prefixes, random
     * lengths, random cancellations (queued or running); then idle means
     * every block free or index-only, and disabling the cache frees all. */
    struct engine_config mid = {.n_threads = 2, .ctx_len = 256, .kv_tokens = 256,
                                .prefill_chunk = 8, .max_queue = 64};
    eng = engine_create(m, &mid, &e);
    CHECK(eng != NULL, "churn engine: %s", e.msg);
    if (!eng)
        return;
    unsigned seed = 12345;
    int bases[3][64];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 64; i++)
            bases[k][i] = i == 0 ? 1 : 2 + (int)(rand_r(&seed) % 500);
    int done = 0, cancelled = 0;
    while (done < 200) {
        struct engine_request *rs[8];
        int mode[8], nr = 0;
        for (; nr < 8 && done + nr < 200; nr++) {
            int pr[100], np = 0;
            int k = (int)(rand_r(&seed) % 3), shared = (int)(rand_r(&seed) % 64);
            memcpy(pr, bases[k], sizeof(int) * (size_t)shared);
            np = shared;
            int extra = 1 + (int)(rand_r(&seed) % 30);
            for (int i = 0; i < extra; i++)
                pr[np++] = 2 + (int)(rand_r(&seed) % 500);
            struct engine_params p = {.sp = {.temperature = 0, .top_p = 1},
                                      .max_tokens = 1 + (int)(rand_r(&seed) % 60)};
            if (rand_r(&seed) % 4 == 0) { /* sampled, not greedy */
                p.sp.temperature = 0.8f;
                p.sp.seed = rand_r(&seed);
            }
            rs[nr] = engine_request_new(pr, np, &p, &e);
            CHECK(rs[nr] && engine_submit(eng, rs[nr], &e) == 0, "churn submit: %s", e.msg);
            mode[nr] = (int)(rand_r(&seed) % 6); /* 0: cancel now, 1: after one event */
            if (mode[nr] == 0)
                engine_request_cancel(rs[nr]);
        }
        for (int i = 0; i < nr; i++) {
            struct engine_event ev;
            if (mode[i] == 1 && engine_request_next(rs[i], &ev, 30000) == 1 &&
                ev.finish == ENGINE_FINISH_NONE)
                engine_request_cancel(rs[i]);
            drain(rs[i], a, 512, &last);
            cancelled += last.finish == ENGINE_FINISH_CANCELLED;
            CHECK(last.finish != ENGINE_FINISH_ERROR, "churn error: %s", last.error);
            engine_request_release(rs[i]);
        }
        done += nr;
    }
    test_wait_idle(eng, &st);
    CHECK(cancelled > 10 && st.cache_hits > 20 && st.cache_evictions > 0,
          "churn: %d cancelled, %llu hits, %llu evictions", cancelled,
          (unsigned long long)st.cache_hits, (unsigned long long)st.cache_evictions);
    CHECK(test_pool_idle(&st), "churn leak: %d of %d free, %d cached, %d idle", st.kv_blocks_free,
          st.kv_blocks_total, st.cache_blocks, st.cache_blocks_idle);
    /* still correct after the churn */
    na = run_one(eng, P, 51, 30, a, &last);
    CHECK(na == 30 && !memcmp(a, want + 50, sizeof(int) * 30), "greedy after churn");
    test_wait_idle(eng, &st);
    engine_set_prompt_cache(eng, -1);
    engine_get_stats(eng, &st);
    CHECK(st.kv_blocks_free == st.kv_blocks_total && st.cache_blocks == 0,
          "cache off: %d of %d free", st.kv_blocks_free, st.kv_blocks_total);
    engine_destroy(eng);
}

/* --kv-budget: a request projected over the budget alone is refused with
 * ENGINE_SUBMIT_ADMISSION and the numbers; joiners that fit alone but not
 * together wait in the queue, in order, and each still gives the recorded
 * greedy ids. stories260K: 20480 bytes a block; BOS + 100 tokens = 7
 * blocks = 143360 bytes, so a 200000-byte budget runs one at a time. */
static void kv_budget_tests(const struct model *m, const int *want)
{
    struct err e = {{0}};
    struct engine_config cfg = {.n_threads = 2, .ctx_len = 512, .prefill_chunk = 8,
                                .max_queue = 8, .max_running = 8, .kv_budget_bytes = 200000};
    struct engine *eng = engine_create(m, &cfg, &e);
    CHECK(eng != NULL, "engine_create: %s", e.msg);
    if (!eng)
        return;
    int bos = 1;
    struct engine_params p = {.sp = {.temperature = 0, .top_p = 1}, .max_tokens = 0};
    struct engine_request *r = engine_request_new(&bos, 1, &p, &e);
    int rc = r ? engine_submit(eng, r, &e) : 0;
    CHECK(rc == ENGINE_SUBMIT_ADMISSION && strstr(e.msg, "655360 bytes") &&
              strstr(e.msg, "200000 bytes"),
          "over-budget submit: %d %s", rc, e.msg);
    engine_request_release(r);

    struct engine_request *rs[3];
    p.max_tokens = 100;
    for (int i = 0; i < 3; i++) {
        rs[i] = engine_request_new(&bos, 1, &p, &e);
        CHECK(rs[i] && engine_submit(eng, rs[i], &e) == 0, "submit %d: %s", i, e.msg);
    }
    struct engine_stats st;
    engine_get_stats(eng, &st);
    CHECK(st.running <= 1 && st.kv_budget_bytes == 200000 && st.kv_projected_bytes <= 200000,
          "budget respected: running %d, projected %lld", st.running, st.kv_projected_bytes);
    for (int i = 0; i < 3; i++) {
        int got[512];
        struct engine_event last;
        int n = drain(rs[i], got, 512, &last);
        CHECK(n == 100 && last.finish == ENGINE_FINISH_LENGTH &&
                  memcmp(got, want, sizeof(int) * 100) == 0,
              "budgeted request %d: %d tokens, finish %d", i, n, (int)last.finish);
        engine_request_release(rs[i]);
    }
    test_wait_idle(eng, &st);
    CHECK(st.batch_rows == st.batch_steps && st.kv_projected_bytes == 0 && st.kv_seq_bytes == 0,
          "one at a time under the budget: %llu rows over %llu steps, projected %lld, held %lld",
          (unsigned long long)st.batch_rows, (unsigned long long)st.batch_steps,
          st.kv_projected_bytes, st.kv_seq_bytes);
    engine_destroy(eng);
}

/* The prefill chunk beside decodes, for all prefills of a step together:
 * two 100-token prompts B and C admitted with a 4-token one A go in
 * 64-token chunks while nothing decodes, then share prefill_chunk_shared
 * tokens a step while A decodes, then, A done, take what is left.
 * Chunks of 8 beside decodes: step 1 A 4, B 64, C 64; steps 2-4 A's
 * tokens 2-4 and B 8 each (C none: the 8 are spent); step 5 B 12, C 36:
 * 5 steps, 11 rows. Chunks of 64: step 1 the same; step 2 A, B 36, C 28;
 * step 3 A, C 8; step 4 A: 4 steps, 9 rows. The same tokens either way. */
static void shared_chunk_tests(const struct model *m)
{
    int out[2][3][8], steps[2] = {0, 0}, rows[2] = {0, 0};
    for (int v = 0; v < 2; v++) {
        struct err e = {{0}};
        struct engine_config cfg = {.n_threads = 2, .ctx_len = 512, .prefill_chunk = 64,
                                    .prefill_chunk_shared = v == 0 ? 8 : 64,
                                    .batch_tokens = 200, .max_queue = 8, .max_running = 3,
                                    .prompt_cache_bytes = -1};
        struct engine *eng = engine_create(m, &cfg, &e);
        CHECK(eng != NULL, "engine_create: %s", e.msg);
        if (!eng)
            return;
        struct engine_stats st;
        engine_get_stats(eng, &st);
        CHECK(st.prefill_chunk == 64 && st.prefill_chunk_shared == (v == 0 ? 8 : 64),
              "chunks in the stats: %d, %d", st.prefill_chunk, st.prefill_chunk_shared);
        int pa[4] = {1, 20, 30, 40}, pb[100], pc[100];
        for (int i = 0; i < 100; i++) {
            pb[i] = 1 + (i * 7) % 500;
            pc[i] = 1 + (i * 11 + 3) % 500;
        }
        struct engine_params p = {.sp = {.temperature = 0, .top_p = 1}, .max_tokens = 4,
                                  .ignore_eos = true};
        struct engine_request *rs[3] = {engine_request_new(pa, 4, &p, &e), NULL, NULL};
        p.max_tokens = 1;
        rs[1] = engine_request_new(pb, 100, &p, &e);
        rs[2] = engine_request_new(pc, 100, &p, &e);
        CHECK(rs[0] && rs[1] && rs[2] && engine_submit_many(eng, rs, 3, &e) == 0, "submit: %s",
              e.msg);
        for (int i = 0; i < 3; i++) {
            struct engine_event last;
            int n = rs[i] ? drain(rs[i], out[v][i], 8, &last) : 0;
            CHECK(n == (i == 0 ? 4 : 1) && last.finish == ENGINE_FINISH_LENGTH,
                  "request %d: %d tokens, finish %d", i, n, (int)last.finish);
            engine_request_release(rs[i]);
        }
        test_wait_idle(eng, &st);
        steps[v] = (int)st.batch_steps;
        rows[v] = (int)st.batch_rows;
        engine_destroy(eng);
    }
    CHECK(steps[0] == 5 && rows[0] == 11 && steps[1] == 4 && rows[1] == 9,
          "steps / rows with chunks of 8 and 64 beside decodes: %d / %d, %d / %d", steps[0],
          rows[0], steps[1], rows[1]);
    CHECK(!memcmp(out[0][0], out[1][0], sizeof(int) * 4) && out[0][1][0] == out[1][1][0] &&
              out[0][2][0] == out[1][2][0],
          "the same tokens whatever the chunks");
}

/* Files of the SSD tier's identity directories under dir. */
static int count_files(const char *dir)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "find '%s' -name '*.kvb' | sort", dir);
    FILE *f = popen(cmd, "r");
    int n = 0;
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        n++;
    }
    if (f)
        pclose(f);
    return n;
}

/* The SSD tier: blocks written at shutdown are restored by the next engine
 * (same output, the prompt's full blocks cached); a damaged file is refused
 * and recomputed; RAM eviction spills to it; the byte cap holds; another KV
 * block size is another identity. */
static void ssd_tests(const struct model *m, const int *want)
{
    char dir[] = "/tmp/cllm_ssd_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    struct err e = {{0}};
    struct engine_config cfg = {.n_threads = 2, .ctx_len = 512, .prefill_chunk = 8, .max_queue = 64,
                                .ssd_dir = dir};
    int P[51], a[512] = {0}, b[512] = {0};
    P[0] = 1;
    memcpy(P + 1, want, sizeof(int) * 50);
    struct engine_event last;
    struct engine_stats st;

    struct engine *eng = engine_create(m, &cfg, &e);
    CHECK(eng != NULL, "engine_create with --ssd-cache: %s", e.msg);
    if (!eng)
        return;
    int na = run_one(eng, P, 51, 30, a, &last);
    CHECK(na == 30 && !memcmp(a, want + 50, sizeof(int) * 30), "first run");
    engine_destroy(eng); /* flushes every indexed block */
    int files = count_files(dir);
    CHECK(files == (51 + 30 - 1) / 16, "files after shutdown: %d", files);

    eng = engine_create(m, &cfg, &e);
    int nb = eng ? run_one(eng, P, 51, 30, b, &last) : 0;
    CHECK(last.n_cached == 48 && nb == 30 && !memcmp(a, b, sizeof(int) * 30),
          "restart: %d cached (want 48), %d tokens, same output %d", last.n_cached, nb,
          !memcmp(a, b, sizeof(int) * 30));
    if (eng) {
        engine_get_stats(eng, &st);
        CHECK(st.ssd && st.ssd_reads == 3 && st.ssd_files == files && strstr(st.ssd_dir, dir),
              "stats: ssd %d reads %llu files %lld dir %s", st.ssd, (unsigned long long)st.ssd_reads,
              st.ssd_files, st.ssd_dir);
    }
    engine_destroy(eng);

    /* damage every file: each is refused (removed), the output recomputed */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "for f in $(find '%s' -name '*.kvb'); do truncate -s -7 \"$f\"; done", dir);
    CHECK(system(cmd) == 0, "truncate");
    eng = engine_create(m, &cfg, &e);
    nb = eng ? run_one(eng, P, 51, 30, b, &last) : 0;
    CHECK(last.n_cached == 0 && nb == 30 && !memcmp(a, b, sizeof(int) * 30),
          "damaged files: %d cached, same output %d", last.n_cached, !memcmp(a, b, sizeof(int) * 30));
    if (eng) {
        engine_get_stats(eng, &st);
        CHECK(st.ssd_bad >= 1 && st.ssd_reads == 0, "damaged: %llu refused, %llu read",
              (unsigned long long)st.ssd_bad, (unsigned long long)st.ssd_reads);
    }
    engine_destroy(eng);

    /* RAM eviction spills: a prompt cache of one block keeps little in RAM,
     * the rest of the chain comes back from files in the same engine */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/*", dir);
    CHECK(system(cmd) == 0, "rm");
    struct engine_config small = cfg;
    small.prompt_cache_bytes = 2 * 20480; /* two stories260K blocks (5 layers x 16 x 2 x 64 x f32) */
    eng = engine_create(m, &small, &e);
    na = eng ? run_one(eng, P, 51, 30, a, &last) : 0;
    int Q[40];
    for (int i = 0; i < 40; i++)
        Q[i] = 1 + (i * 7) % 300; /* another prompt, to push P's blocks out */
    run_one(eng, Q, 40, 20, b, &last);
    nb = eng ? run_one(eng, P, 51, 30, b, &last) : 0;
    if (eng)
        engine_get_stats(eng, &st);
    CHECK(eng && last.n_cached == 48 && !memcmp(a, b, sizeof(int) * 30) && st.ssd_reads >= 1 &&
              st.ssd_writes >= 3,
          "spilled and restored: %d cached, %llu read, %llu written", last.n_cached,
          (unsigned long long)st.ssd_reads, (unsigned long long)st.ssd_writes);
    engine_destroy(eng);

    /* the cap: a byte leaves no file; another block size, another identity */
    int files0 = count_files(dir);
    snprintf(cmd, sizeof cmd, "ls '%s' | wc -l", dir);
    FILE *f = popen(cmd, "r");
    int dirs0 = 0, dirs1 = 0;
    CHECK(f && fscanf(f, "%d", &dirs0) == 1, "ls");
    if (f)
        pclose(f);
    struct engine_config capped = cfg;
    capped.ssd_max_bytes = 1;
    capped.kv_block_size = 32;
    eng = engine_create(m, &capped, &e);
    nb = eng ? run_one(eng, P, 51, 30, b, &last) : 0;
    CHECK(last.n_cached == 0 && !memcmp(a, b, sizeof(int) * 30), "block size 32: nothing shared");
    engine_destroy(eng);
    f = popen(cmd, "r");
    CHECK(f && fscanf(f, "%d", &dirs1) == 1, "ls");
    if (f)
        pclose(f);
    CHECK(dirs1 == dirs0 + 1 && count_files(dir) == files0,
          "capped, block 32: %d -> %d identity dirs, %d -> %d files", dirs0, dirs1, files0,
          count_files(dir));
    /* a directory that cannot be made is a clear error */
    struct engine_config bad = cfg;
    bad.ssd_dir = "/proc/nope/cache";
    CHECK(engine_create(m, &bad, &e) == NULL && strstr(e.msg, "--ssd-cache"), "bad dir: %s", e.msg);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

/* Waits up to 30 s for nothing to be queued or running (cancelled
 * requests end asynchronously); *st: the last stats read. */
static void wait_idle(struct engine *eng, struct engine_stats *st)
{
    for (int i = 0; i < 3000; i++) {
        engine_get_stats(eng, st);
        if (st->queued == 0 && st->running == 0)
            return;
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
}

/* A greedy request from BOS with the stop id `stop`, first met at
 * want[first]: the ids before it, then STOP. */
static void check_stop(struct engine *eng, const int *want, int stop, int first, const char *what)
{
    struct err e = {{0}};
    int bos = 1, got[512], n = 0;
    struct engine_event last = {0};
    struct engine_params p = {.sp = {.temperature = 0, .top_p = 1}, .max_tokens = 200,
                              .stop_ids = &stop, .n_stop_ids = 1};
    struct engine_request *r = engine_request_new(&bos, 1, &p, &e);
    CHECK(r && engine_submit(eng, r, &e) == 0, "submit: %s", e.msg);
    n = r ? drain(r, got, 512, &last) : 0;
    CHECK(n == first && !memcmp(got, want, sizeof(int) * (size_t)n) &&
              last.finish == ENGINE_FINISH_STOP,
          "%s, stop id %d: %d tokens (want %d)", what, stop, n, first);
    engine_request_release(r);
}

/* One step ahead (decode_ahead 1: on the CPU each step runs at once, a
 * step ahead of the events; CLLM_TEST_DEVICE=cuda: on the GPU, by
 * default): a greedy sequence alone gives the plain
 * ids; max_tokens and a stop id land on the same token, and the step fed
 * the stop id leaves no K/V behind (a prompt continuing from the cached
 * chain decodes on as plain greedy does); a cancel and a request joining
 * mid-stream end the step in flight cleanly; the pool is whole after. */
static void ahead_tests(const struct model *m, const int *want)
{
    struct err e = {{0}};
    /* CLLM_TEST_DEVICE=cuda: the device's own way (argmax_async) */
    const char *dev = getenv("CLLM_TEST_DEVICE");
    bool cpu = !dev || !strcmp(dev, "cpu");
    struct engine_config cfg = {.n_threads = 2, .ctx_len = 512, .prefill_chunk = 8,
                                .max_queue = 64, .device = dev, .decode_ahead = cpu ? 1 : 0};
    struct engine *eng = engine_create(m, &cfg, &e);
    CHECK(eng != NULL, "engine_create one step ahead: %s", e.msg);
    if (!eng)
        return;
    int bos = 1, got[512];
    struct engine_event last;
    int n = run_one(eng, &bos, 1, 200, got, &last);
    CHECK(n == 200 && !memcmp(got, want, sizeof(int) * 200) && last.finish == ENGINE_FINISH_LENGTH,
          "greedy one step ahead: %d tokens", n);
    struct engine_stats st;
    engine_get_stats(eng, &st);
    CHECK(st.steps_ahead >= 190, "steps queued ahead: %llu of 200",
          (unsigned long long)st.steps_ahead);
    for (int len = 1; len < 40; len += 9) {
        n = run_one(eng, &bos, 1, len, got, &last);
        CHECK(n == len && !memcmp(got, want, sizeof(int) * (size_t)len) &&
                  last.finish == ENGINE_FINISH_LENGTH,
              "one step ahead, max_tokens %d: %d tokens", len, n);
    }
    /* A stop id first met where the step fed it would complete a 16-token
     * block (BOS, the ids before it, itself): were its K/V kept, that block
     * would enter the cache under ids the sequence does not have. Every
     * other block of the chain is cached already (the runs above). */
    int first = 30;
    for (;; first++) {
        bool seen = false;
        for (int i = 0; i < first; i++)
            seen = seen || want[i] == want[first];
        if (!seen && (first + 2) % 16 == 0)
            break;
    }
    int stop = want[first];
    engine_get_stats(eng, &st);
    int blocks0 = st.cache_blocks;
    check_stop(eng, want, stop, first, "one step ahead");
    engine_get_stats(eng, &st);
    CHECK(st.cache_blocks == blocks0, "the stopped sequence cached %d new blocks (none expected)",
          st.cache_blocks - blocks0);
    /* the stopped sequence's blocks are cached: its prompt and ids, then on */
    int chain[256];
    chain[0] = bos;
    memcpy(chain + 1, want, sizeof(int) * (size_t)first);
    engine_get_stats(eng, &st);
    uint64_t cached0 = st.cache_tokens;
    n = run_one(eng, chain, first + 1, 40, got, &last);
    engine_get_stats(eng, &st);
    CHECK(n == 40 && !memcmp(got, want + first, sizeof(int) * 40) && st.cache_tokens > cached0,
          "after the stopped chain (%llu tokens cached): %d tokens",
          (unsigned long long)(st.cache_tokens - cached0), n);
    /* a request joining mid-stream, and a cancel */
    struct engine_params lp = {.sp = {.temperature = 0, .top_p = 1}, .max_tokens = 240};
    struct engine_request *a = engine_request_new(&bos, 1, &lp, &e);
    CHECK(a && engine_submit(eng, a, &e) == 0, "submit: %s", e.msg);
    struct engine_event ev;
    int ga[512], na = 0;
    while (na < 30 && engine_request_next(a, &ev, 30000) == 1 && ev.finish == ENGINE_FINISH_NONE)
        ga[na++] = ev.token;
    struct engine_params bp = {.sp = {.temperature = 0, .top_p = 1}, .max_tokens = 50};
    struct engine_request *b = engine_request_new(&bos, 1, &bp, &e);
    CHECK(b && engine_submit(eng, b, &e) == 0, "submit: %s", e.msg);
    int nb = b ? drain(b, got, 512, &last) : 0;
    CHECK(nb == 50 && !memcmp(got, want, sizeof(int) * 50), "joiner mid-stream: %d tokens", nb);
    na += drain(a, ga + na, 512 - na, &last);
    CHECK(na == 240 && !memcmp(ga, want, sizeof(int) * 240) && last.finish == ENGINE_FINISH_LENGTH,
          "the stream joined mid-way: %d tokens", na);
    engine_request_release(a);
    engine_request_release(b);
    struct engine_params cp = {.sp = {.temperature = 0, .top_p = 1}, .ignore_eos = true};
    struct engine_request *c = engine_request_new(&bos, 1, &cp, &e);
    CHECK(c && engine_submit(eng, c, &e) == 0, "submit: %s", e.msg);
    for (int i = 0; i < 20 && engine_request_next(c, &ev, 30000) == 1; i++)
        ;
    engine_request_cancel(c);
    n = drain(c, got, 512, &last);
    CHECK(last.finish == ENGINE_FINISH_CANCELLED, "one step ahead, cancelled: finish %d after %d",
          last.finish, n);
    engine_request_release(c);
    wait_idle(eng, &st);
    CHECK(st.running == 0 && st.kv_blocks_free + st.cache_blocks_idle == st.kv_blocks_total,
          "one step ahead: %d running, %d of %d blocks free, %d cached idle", st.running,
          st.kv_blocks_free, st.kv_blocks_total, st.cache_blocks_idle);
    engine_destroy(eng);
}

/* Speculation, by prompt lookup (draft NULL) or with a draft model: a
 * lone greedy sequence's output is the one token a step gives (the CPU's
 * rows do not depend on the span), in fewer steps; max_tokens and stop ids
 * land on the same token; a seed repeats. The model as its own draft keeps
 * every draft. */
static void spec_tests(const struct model *m, const int *want, const struct model *draft,
                       const char *what)
{
    struct err e = {{0}};
    struct engine_config cfg = {.n_threads = 2, .ctx_len = 512, .prefill_chunk = 8, .max_queue = 64,
                                .spec_draft = draft ? 4 : 8, .ngram_min = 1, .ngram_max = 3,
                                .draft_model = draft};
    struct engine *eng = engine_create(m, &cfg, &e);
    CHECK(eng != NULL, "engine_create with speculation (%s): %s", what, e.msg);
    if (!eng)
        return;
    int bos = 1, got[512];
    struct engine_event last;
    int n = run_one(eng, &bos, 1, 256, got, &last);
    CHECK(n == 256 && !memcmp(got, want, sizeof(int) * 256), "speculative greedy differs (%s)",
          what);
    struct engine_stats st;
    engine_get_stats(eng, &st);
    /* prompt lookup and the model itself draft well; a weaker draft's
     * rounds may keep nothing and back off */
    bool strong = !draft || draft == m;
    CHECK(st.spec_steps > 0 && (!strong || (st.spec_accepted > 0 && st.batch_steps < 256)) &&
              (draft != m || st.spec_accepted == st.spec_drafted) &&
              (draft == m || st.spec_accepted < st.spec_drafted),
          "speculation (%s): %llu verify steps, %llu of %llu drafts kept, %llu steps for 256 "
          "tokens", what, (unsigned long long)st.spec_steps, (unsigned long long)st.spec_accepted,
          (unsigned long long)st.spec_drafted, (unsigned long long)st.batch_steps);
    for (int len = 1; len < 60; len += 7) {
        n = run_one(eng, &bos, 1, len, got, &last);
        CHECK(n == len && !memcmp(got, want, sizeof(int) * (size_t)len) &&
                  last.finish == ENGINE_FINISH_LENGTH,
              "max_tokens %d: %d tokens", len, n);
    }
    /* a stop id met inside the kept drafts ends there */
    int stop = want[40];
    int first = 0;
    while (want[first] != stop)
        first++;
    check_stop(eng, want, stop, first, "speculation");
    /* sampled: the same seed gives the same tokens, drafts are kept, and
     * the length holds */
    uint64_t kept0 = st.spec_accepted;
    int s1[512], s2[512];
    for (int run = 0; run < 2; run++) {
        struct engine_params sp = {.sp = {.temperature = 0.6f, .top_p = 0.95f, .seed = 11},
                                   .max_tokens = 150, .ignore_eos = true};
        struct engine_request *r = engine_request_new(&bos, 1, &sp, &e);
        CHECK(r && engine_submit(eng, r, &e) == 0, "submit: %s", e.msg);
        n = r ? drain(r, run ? s2 : s1, 512, &last) : 0;
        CHECK(n == 150 && last.finish == ENGINE_FINISH_LENGTH, "sampled: %d tokens", n);
        engine_request_release(r);
    }
    engine_get_stats(eng, &st);
    CHECK(!memcmp(s1, s2, sizeof(int) * 150) && (!strong || st.spec_accepted > kept0),
          "sampled speculation: same seed same tokens %d, %llu drafts kept",
          !memcmp(s1, s2, sizeof(int) * 150), (unsigned long long)(st.spec_accepted - kept0));
    CHECK(st.kv_blocks_free + st.cache_blocks_idle == st.kv_blocks_total,
          "blocks after speculation: %d free + %d cached of %d", st.kv_blocks_free,
          st.cache_blocks_idle, st.kv_blocks_total);
    engine_destroy(eng);
    if (draft)
        return;
    struct engine_config bad = cfg;
    bad.ngram_min = 4;
    CHECK(engine_create(m, &bad, &e) == NULL && strstr(e.msg, "n-grams"), "bad n-grams: %s", e.msg);
}

/* Two-model speculation: the model drafting for itself (every draft kept),
 * its first layer alone drafting (an early-exit draft sharing the weights:
 * some drafts rejected, the output still the model's), and that draft with
 * a context of 100 tokens, which stops drafting past it. */
static void draft_tests(const struct model *m, const int *want)
{
    spec_tests(m, want, m, "self-draft");
    struct model early = *m;
    early.cfg.n_layers = 1;
    spec_tests(m, want, &early, "first layer");
    early.cfg.max_seq = 100;
    spec_tests(m, want, &early, "first layer, 100 positions");
    /* a confidence floor for the first 4 of 5 layers' drafts: the same
     * output, fewer drafts, a larger share of them kept */
    early = *m;
    early.cfg.n_layers = 4;
    uint64_t drafted[2] = {0}, kept[2] = {0};
    for (int i = 0; i < 2; i++) {
        struct err e = {{0}};
        struct engine_config cfg = {.n_threads = 2, .ctx_len = 512, .prefill_chunk = 8,
                                    .max_queue = 64, .spec_draft = 8, .draft_model = &early,
                                    .draft_p_min = i ? 0.8f : 0.0f};
        struct engine *eng = engine_create(m, &cfg, &e);
        CHECK(eng != NULL, "engine_create (p-min %d): %s", i, e.msg);
        if (!eng)
            return;
        int bos = 1, got[512];
        struct engine_event last;
        int n = run_one(eng, &bos, 1, 256, got, &last);
        CHECK(n == 256 && !memcmp(got, want, sizeof(int) * 256), "p-min %d: output differs", i);
        struct engine_stats st;
        engine_get_stats(eng, &st);
        drafted[i] = st.spec_drafted;
        kept[i] = st.spec_accepted;
        engine_destroy(eng);
    }
    CHECK(drafted[1] > 0 && drafted[1] < drafted[0] && kept[1] * drafted[0] > kept[0] * drafted[1],
          "draft p-min 0.8: %llu of %llu drafts kept, against %llu of %llu without",
          (unsigned long long)kept[1], (unsigned long long)drafted[1],
          (unsigned long long)kept[0], (unsigned long long)drafted[0]);
    /* agents taking turns: A, B, A. The draft model's index gives the
     * second A its prompt's full blocks back; every answer is the model's
     * own (the same as the first A's, and the engine's without drafts) */
    {
        struct err e = {{0}};
        struct engine_config cfg = {.n_threads = 2, .ctx_len = 512, .prefill_chunk = 8,
                                    .max_queue = 64, .spec_draft = 4, .draft_model = m};
        struct engine *eng = engine_create(m, &cfg, &e);
        struct engine_config plain_cfg = cfg;
        plain_cfg.spec_draft = 0;
        plain_cfg.draft_model = NULL;
        struct engine *plain = eng ? engine_create(m, &plain_cfg, &e) : NULL;
        CHECK(eng && plain, "engine_create (turns): %s", e.msg);
        int pa[61], pb[61], got[3][64], ref[64];
        for (int i = 0; i < 61; i++) {
            pa[i] = i ? 3 + (i * 37) % 500 : 1;
            pb[i] = i ? 3 + (i * 101 + 7) % 500 : 1;
        }
        struct engine_event last;
        int n[3] = {0}, nref = 0;
        uint64_t cached_before_third = 0;
        struct engine_stats st = {0};
        for (int t = 0; eng && plain && t < 3; t++) {
            if (t == 2) {
                engine_get_stats(eng, &st);
                cached_before_third = st.draft_cached;
            }
            n[t] = run_one(eng, t == 1 ? pb : pa, 61, 20, got[t], &last);
        }
        if (eng && plain) {
            nref = run_one(plain, pa, 61, 20, ref, &last);
            engine_get_stats(eng, &st);
        }
        CHECK(n[0] == 20 && n[2] == 20 && nref == 20 && !memcmp(got[0], ref, sizeof(int) * 20) &&
                  !memcmp(got[2], ref, sizeof(int) * 20),
              "turns: the answers differ from the model's own (%d, %d, %d tokens)", n[0], n[2],
              nref);
        CHECK(st.draft_cached >= cached_before_third + 48 && st.spec_accepted > 0,
              "turns: the draft model took %llu tokens from its index for the second A (%llu "
              "computed in all)", (unsigned long long)(st.draft_cached - cached_before_third),
              (unsigned long long)st.draft_computed);
        engine_destroy(eng);
        engine_destroy(plain);
    }
    struct err e = {{0}};
    struct engine_config bad = {.n_threads = 2, .ctx_len = 512, .spec_draft = 4,
                                .draft_model = &early, .draft_p_min = 1.5f};
    CHECK(engine_create(m, &bad, &e) == NULL && strstr(e.msg, "p-min"), "bad p-min: %s", e.msg);
    /* a draft whose id j is the model's j + 1 (its output rows shifted by
     * one): its drafts are rarely the model's picks, and rounds that keep
     * nothing back off to one in 17 steps */
    early = *m;
    early.cfg.vocab_size--;
    early.lm_head.rows--;
    early.lm_head.data = (const char *)m->lm_head.data +
                         dtype_row_bytes(m->lm_head.dtype, m->lm_head.cols);
    spec_tests(m, want, &early, "shifted ids");
    e = (struct err){{0}};
    struct engine_config cfg = {.n_threads = 2, .ctx_len = 512, .prefill_chunk = 8,
                                .max_queue = 64, .spec_draft = 4, .draft_model = &early};
    struct engine *eng = engine_create(m, &cfg, &e);
    CHECK(eng != NULL, "engine_create: %s", e.msg);
    if (!eng)
        return;
    int bos = 1, got[512];
    struct engine_event last;
    int n = run_one(eng, &bos, 1, 256, got, &last);
    struct engine_stats st;
    engine_get_stats(eng, &st);
    CHECK(n == 256 && !memcmp(got, want, sizeof(int) * 256) && st.spec_steps >= 5 &&
              st.spec_steps <= 5 + (256 - 31) / 17 + st.spec_accepted,
          "back-off: %llu verify steps, %llu of %llu drafts kept for 256 tokens",
          (unsigned long long)st.spec_steps, (unsigned long long)st.spec_accepted,
          (unsigned long long)st.spec_drafted);
    engine_destroy(eng);
}

/* The bytes of ids as the grammar sees them (mid-text: no first-token
 * space rule). */
static size_t ids_text(const struct tokenizer *t, const int *ids, int n, char *out, size_t cap)
{
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        const char *s;
        char byte;
        int len = tok_id_bytes(t, ids[i], &s, &byte);
        for (int j = 0; j < len && k + 1 < cap; j++)
            out[k++] = s[j];
    }
    out[k] = 0;
    return k;
}

/* Structured output through the engine: a permissive grammar leaves greedy
 * output as it was; a narrow one holds greedy and sampled output, alone and
 * batched, to its sentences and stops the sequence once nothing may follow. */
static void grammar_tests(const struct model *m, const char *model_dir, const int *want)
{
    struct err e = {{0}};
    struct tokenizer *t = tok_load_for_model(model_dir, &e);
    CHECK(t != NULL, "tokenizer: %s", e.msg);
    if (!t)
        return;
    struct grammar_vocab *v = grammar_vocab_new(t, m->cfg.vocab_size, &e);
    struct engine_config cfg = {.n_threads = 2, .ctx_len = 512, .prefill_chunk = 8, .max_queue = 64,
                                .max_running = 4};
    struct engine *eng = engine_create(m, &cfg, &e);
    CHECK(v && eng, "setup: %s", e.msg);
    if (!v || !eng)
        goto out;
    int bos = 1, got[512];
    struct engine_event last;
    const char *any = "root ::= .*";
    struct engine_params p = {.sp = {.temperature = 0, .top_p = 1}, .max_tokens = 60,
                              .grammar = grammar_parse(any, strlen(any), &e), .grammar_vocab = v};
    struct engine_request *r = engine_request_new(&bos, 1, &p, &e);
    CHECK(r && engine_submit(eng, r, &e) == 0, "submit: %s", e.msg);
    int n = r ? drain(r, got, 512, &last) : 0;
    CHECK(n == 60 && !memcmp(got, want, sizeof(int) * 60), "'.*' changed greedy output (%d ids)", n);
    engine_request_release(r);

    /* lowercase words, then a period: at most 30 bytes before it */
    const char *words = "root ::= [a-z ]{1,30} \".\"";
    struct grammar *g = grammar_parse(words, strlen(words), &e);
    CHECK(g != NULL, "%s", e.msg);
    struct engine_request *rs[6];
    for (int i = 0; i < 6; i++) {
        struct engine_params pi = {.sp = {.temperature = i < 2 ? 0.0f : 1.0f, .top_p = 1,
                                          .seed = (uint64_t)i},
                                   .max_tokens = 200,
                                   .grammar = grammar_parse(words, strlen(words), &e),
                                   .grammar_vocab = v};
        rs[i] = engine_request_new(&bos, 1, &pi, &e);
    }
    CHECK(engine_submit_many(eng, rs, 6, &e) == 0, "submit: %s", e.msg);
    for (int i = 0; i < 6; i++) {
        n = drain(rs[i], got, 512, &last);
        char text[2048];
        size_t len = ids_text(t, got, n, text, sizeof text);
        CHECK(last.finish == ENGINE_FINISH_STOP, "request %d: finish %d after %d ids", i,
              last.finish, n);
        CHECK(g && grammar_accepts(g, text, len), "request %d: \"%s\" is not a sentence", i, text);
        engine_request_release(rs[i]);
    }
    grammar_free(g);

    /* a grammar without the vocabulary is refused up front */
    struct engine_params bad = {.sp = {.top_p = 1}, .grammar = grammar_parse(any, 11, &e)};
    CHECK(engine_request_new(&bos, 1, &bad, &e) == NULL && strstr(e.msg, "vocabulary"),
          "grammar without vocabulary: %s", e.msg);
    grammar_free(bad.grammar);
out:
    engine_destroy(eng);
    grammar_vocab_free(v);
    tok_free(t);
}

/* The test's own reading of mlx-lm's processors (logits.h), to check the
 * engine's against: bias, then the sign-aware repetition factor and the
 * presence penalty once per distinct token of their windows, then the
 * frequency penalty per occurrence. */
static void ref_process(const struct logits_params *p, const int *t, int n, float *row)
{
    for (int i = 0; i < p->n_bias; i++)
        row[p->bias_ids[i]] += p->bias[i];
    int wr = n - p->repetition_window, wp = n - p->presence_window, wf = n - p->frequency_window;
    for (int i = wr > 0 ? wr : 0; i < n; i++) {
        bool first = true;
        for (int j = wr > 0 ? wr : 0; j < i; j++)
            first = first && t[j] != t[i];
        if (first)
            row[t[i]] = row[t[i]] < 0 ? row[t[i]] * p->repetition : row[t[i]] / p->repetition;
    }
    for (int i = wp > 0 ? wp : 0; i < n; i++) {
        bool first = true;
        for (int j = wp > 0 ? wp : 0; j < i; j++)
            first = first && t[j] != t[i];
        if (first)
            row[t[i]] -= p->presence;
    }
    for (int i = wf > 0 ? wf : 0; i < n; i++)
        row[t[i]] -= p->frequency;
}

static double ref_lse(const float *row, int n)
{
    double m = -INFINITY, s = 0;
    for (int i = 0; i < n; i++)
        m = row[i] > m ? row[i] : m;
    for (int i = 0; i < n; i++)
        s += exp((double)row[i] - m);
    return m + log(s);
}

/* Runs p after prompt and collects every token event. */
static int run_events(struct engine *eng, const int *prompt, int n_prompt,
                      const struct engine_params *p, struct engine_event *evs, int cap)
{
    struct err e = {{0}};
    struct engine_request *r = engine_request_new(prompt, n_prompt, p, &e);
    if (!r || engine_submit(eng, r, &e)) {
        CHECK(0, "submit: %s", e.msg);
        engine_request_release(r);
        return 0;
    }
    int n = 0;
    struct engine_event ev;
    while (engine_request_next(r, &ev, 30000) == 1 && ev.finish == ENGINE_FINISH_NONE)
        if (n < cap)
            evs[n++] = ev;
    CHECK(ev.finish == ENGINE_FINISH_LENGTH, "finish %d: %s", ev.finish, ev.error);
    engine_request_release(r);
    return n;
}

/* logprobs and logits processing through the engine, against the model's
 * own rows (the oracle runner, one forward over the whole text): each
 * token's log-probability and top alternatives are the log-softmax of the
 * unprocessed row; greedy with a bias and penalties picks what the test's
 * reading of the rules picks. Two requests in one step share the batch. */
static void logits_tests(const struct model *m, const char *path, const int *want)
{
    struct err e = {{0}};
    struct engine_config cfg = {.n_threads = 2, .ctx_len = 256, .prefill_chunk = 8,
                                .max_queue = 8, .max_running = 4};
    struct engine *eng = engine_create(m, &cfg, &e);
    struct runner ref;
    bool ok = eng && runner_open(&ref, path, backend_create("cpu", 1, &e), true, 64, 32) == 0;
    CHECK(ok, "engine / runner: %s", e.msg);
    if (!ok) {
        engine_destroy(eng);
        return;
    }
    const int V = m->cfg.vocab_size, N = 40, bos = 1;
    int bias_ids[2] = {want[3], 50};
    float bias[2] = {-10.0f, 1.5f};
    struct engine_params plain = {.sp = {.temperature = 0, .top_p = 1}, .max_tokens = N,
                                  .logprobs = true, .top_logprobs = 5};
    /* each processor alone, then all together */
    const struct logits_params procs[] = {
        {.bias_ids = bias_ids, .bias = bias, .n_bias = 2},
        {.repetition = 1.5f, .repetition_window = 8},
        {.repetition = 0.8f},
        {.presence = 1.0f, .presence_window = 16},
        {.frequency = 0.7f, .frequency_window = 12},
        {.frequency = -1.5f, .frequency_window = 30},
        {.bias_ids = bias_ids, .bias = bias, .n_bias = 2, .repetition = 1.3f,
         .repetition_window = 8, .presence = 0.5f, .presence_window = 16, .frequency = 0.3f,
         .frequency_window = 12},
    };
    struct engine_event a[64], b[64];
    int na = run_events(eng, &bos, 1, &plain, a, 64);
    CHECK(na == N, "%d tokens", na);

    /* plain greedy: the recorded ids, and the model's log-softmax */
    int seq[64] = {bos};
    for (int i = 0; i < na; i++) {
        CHECK(a[i].token == want[i] && a[i].has_logprobs, "token %d: %d", i, a[i].token);
        seq[i + 1] = a[i].token;
    }
    float *rows = runner_logits(&ref, seq, na);
    double worst = 0;
    for (int i = 0; rows && i < na; i++) {
        const float *row = rows + (size_t)i * V;
        double lse = ref_lse(row, V);
        worst = fmax(worst, fabs(a[i].lp.logprob - (row[a[i].token] - lse)));
        CHECK(a[i].lp.n_top == 5 && a[i].lp.top_id[0] == a[i].token &&
                  a[i].lp.top_lp[0] == a[i].lp.logprob,
              "step %d: greedy pick is not the top entry", i);
        for (int j = 0; j < a[i].lp.n_top; j++) {
            worst = fmax(worst, fabs(a[i].lp.top_lp[j] - (row[a[i].lp.top_id[j]] - lse)));
            if (j > 0)
                CHECK(a[i].lp.top_lp[j] <= a[i].lp.top_lp[j - 1], "step %d: top not sorted", i);
        }
        int above = 0; /* entries of the row above the 5th: exactly the other four */
        for (int v = 0; v < V; v++)
            above += row[v] > row[a[i].lp.top_id[4]];
        CHECK(above <= 4, "step %d: %d ids rank above the fifth entry", i, above);
    }
    CHECK(rows && worst < 1e-4, "logprobs against the model's rows: worst %.3g", worst);
    free(rows);

    /* processed greedy: the test's reading of the rules, step by step on
     * the model's rows; the logprobs stay those of the raw rows */
    for (size_t c = 0; c < sizeof procs / sizeof procs[0]; c++) {
        struct engine_params pp = plain;
        pp.proc = procs[c];
        int nb = run_events(eng, &bos, 1, &pp, b, 64);
        struct logits_params rp = procs[c]; /* the windows as the engine reads them */
        rp.repetition_window = rp.repetition_window > 0 ? rp.repetition_window : 20;
        rp.presence_window = rp.presence_window > 0 ? rp.presence_window : 20;
        rp.frequency_window = rp.frequency_window > 0 ? rp.frequency_window : 20;
        if (rp.repetition == 0)
            rp.repetition = 1;
        int diverged = 0, changed = 0;
        worst = 0;
        for (int i = 0; i < nb; i++) {
            float *row = runner_logits(&ref, seq, i + 1);
            if (!row)
                break;
            float *last = row + (size_t)i * V;
            double lse = ref_lse(last, V);
            worst = fmax(worst, fabs(b[i].lp.logprob - (last[b[i].token] - lse)));
            ref_process(&rp, seq, i + 1, last);
            int best = 0;
            for (int v = 1; v < V; v++)
                best = last[v] > last[best] ? v : best;
            diverged += best != b[i].token;
            changed += b[i].token != a[i].token;
            seq[i + 1] = b[i].token;
            free(row);
        }
        CHECK(nb == N && diverged == 0, "processors %zu: %d of %d steps differ from the rules", c,
              diverged, nb);
        CHECK(changed > 0, "processors %zu changed no token", c);
        CHECK(worst < 1e-4, "processors %zu: logprobs off the raw rows by %.3g", c, worst);
    }

    /* Prompt logprobs: every prompt token's entry from the row before it
     * (two chunks of rows), then the usual greedy continuation; a plain
     * request beside it is not disturbed. */
    {
        int P[31] = {bos};
        memcpy(P + 1, want, sizeof(int) * 30);
        struct engine_params pl = plain;
        pl.max_tokens = 5;
        pl.top_logprobs = 3;
        pl.prompt_logprobs = true;
        struct engine_request *rq[2] = {engine_request_new(P, 31, &pl, &e),
                                        engine_request_new(P, 31, &plain, &e)};
        CHECK(rq[0] && rq[1] && engine_submit_many(eng, rq, 2, &e) == 0, "submit: %s", e.msg);
        struct engine_event ev, pe[40];
        int np = 0, ng = 0, gen[8];
        while (rq[0] && engine_request_next(rq[0], &ev, 30000) == 1 &&
               ev.finish == ENGINE_FINISH_NONE) {
            if (ev.prompt) {
                CHECK(ng == 0, "a prompt event after a generated one");
                if (np < 40)
                    pe[np] = ev;
                np++;
            } else if (ng < 8) {
                gen[ng++] = ev.token;
            }
        }
        CHECK(np == 31 && ng == 5 && !memcmp(gen, want + 30, sizeof(int) * 5),
              "prompt logprobs: %d prompt events, %d generated", np, ng);
        float *pr = runner_logits(&ref, P, 31);
        worst = 0;
        for (int i = 0; pr && i < np && i < 31; i++) {
            CHECK(pe[i].token == P[i] && pe[i].has_logprobs == (i > 0), "prompt event %d", i);
            if (i == 0)
                continue;
            const float *row = pr + (size_t)(i - 1) * V;
            double lse = ref_lse(row, V);
            worst = fmax(worst, fabs(pe[i].lp.logprob - (row[P[i]] - lse)));
            CHECK(pe[i].lp.n_top == 3, "prompt event %d: %d top", i, pe[i].lp.n_top);
            for (int j = 0; j < pe[i].lp.n_top; j++)
                worst = fmax(worst, fabs(pe[i].lp.top_lp[j] - (row[pe[i].lp.top_id[j]] - lse)));
        }
        CHECK(pr && worst < 1e-4, "prompt logprobs against the model's rows: worst %.3g", worst);
        free(pr);
        int n1 = drain(rq[1], gen, 8, &ev);
        CHECK(n1 == N && ev.finish == ENGINE_FINISH_LENGTH, "the request beside it: %d", n1);
        engine_request_release(rq[0]);
        engine_request_release(rq[1]);
        /* the prompt alone (completions' max_tokens 0): every prompt
         * event, the same values, nothing generated; without logprobs it
         * ends at once */
        for (int with_lp = 1; with_lp >= 0; with_lp--) {
            struct engine_params po = pl;
            po.prompt_only = true;
            po.prompt_logprobs = with_lp;
            po.logprobs = with_lp;
            struct engine_request *q = engine_request_new(P, 31, &po, &e);
            CHECK(q && engine_submit(eng, q, &e) == 0, "submit: %s", e.msg);
            int npo = 0, ngo = 0, diff = 0;
            while (q && engine_request_next(q, &ev, 30000) == 1 && ev.finish == ENGINE_FINISH_NONE) {
                if (!ev.prompt)
                    ngo++;
                else if (npo < 31 && npo > 0 && (ev.token != pe[npo].token ||
                                                 ev.lp.logprob != pe[npo].lp.logprob))
                    diff++;
                npo += ev.prompt;
            }
            CHECK(npo == (with_lp ? 31 : 0) && ngo == 0 && diff == 0 &&
                      ev.finish == ENGINE_FINISH_LENGTH && ev.n_generated == 0,
                  "prompt only (logprobs %d): %d prompt events (%d differ), %d generated, "
                  "finish %d", with_lp, npo, diff, ngo, (int)ev.finish);
            engine_request_release(q);
        }
    }

    /* Out-of-range values are refused, naming the field. */
    struct engine_params bad = plain;
    bad.top_logprobs = 21;
    CHECK(!engine_request_new(&bos, 1, &bad, &e) && strstr(e.msg, "top_logprobs"), "%s", e.msg);
    bad = plain;
    bad.proc.presence = 3;
    CHECK(!engine_request_new(&bos, 1, &bad, &e) && strstr(e.msg, "presence"), "%s", e.msg);
    int far = V;
    bad.proc = (struct logits_params){.bias_ids = &far, .bias = bias, .n_bias = 1};
    struct engine_request *r = engine_request_new(&bos, 1, &bad, &e);
    CHECK(r && engine_submit(eng, r, &e) == ENGINE_SUBMIT_INVALID && strstr(e.msg, "logit_bias"),
          "bias id past the vocabulary: %s", e.msg);
    engine_request_release(r);
    runner_close(&ref);
    engine_destroy(eng);
}

int main(void)
{
    char path[1024];
    /* the GPU machine's copy of ../shared (tests/gpu) */
    const char *shared = getenv("CLLM_SHARED_DIR") ? getenv("CLLM_SHARED_DIR") : CLLM_SHARED_DIR;
    snprintf(path, sizeof path, "%s/models/stories260K", shared);
    struct model m;
    struct err e = {{0}};
    if (model_load(&m, path, &e)) {
        CHECK(0, "%s", e.msg);
        return test_summary("test_engine");
    }
    snprintf(path, sizeof path, "%s/models/stories260K/expected_greedy.json", shared);
    json_t *root = test_json_load(path);
    json_t *c = json_array_get(json_object_get(root, "cases"), 0); /* BOS only, 256 steps */
    int want[256];
    for (int i = 0; i < 256; i++)
        want[i] = (int)json_integer_value(json_array_get(json_object_get(c, "generated_ids"), i));

    /* --batch 1 (strict serial): the queue-bound and waiter checks below
     * rely on one request running while the others wait. */
    struct engine_config cfg = {.n_threads = 2, .ctx_len = 512, .prefill_chunk = 8, .max_queue = 2,
                                .max_running = 1};
    struct engine *eng = engine_create(&m, &cfg, &e);
    CHECK(eng != NULL, "engine_create: %s", e.msg);
    if (!eng)
        return test_summary("test_engine");
    int bos = 1;
    struct engine_params p = {.sp = {.temperature = 0, .top_p = 1}, .max_tokens = 100};

    /* 1. Greedy through the engine = the recorded ids; max_tokens -> LENGTH. */
    struct engine_request *r = engine_request_new(&bos, 1, &p, &e);
    CHECK(r && engine_submit(eng, r, &e) == 0, "submit: %s", e.msg);
    int got[512];
    struct engine_event last;
    int n = drain(r, got, 512, &last);
    CHECK(n == 100 && !memcmp(got, want, sizeof(int) * 100), "greedy via engine: %d tokens", n);
    CHECK(last.finish == ENGINE_FINISH_LENGTH && last.n_generated == 100 && last.n_prompt == 1,
          "final event: finish %d, %d generated", last.finish, last.n_generated);
    engine_request_release(r);

    /* 2. Three requests in flight: each gets its own, correct stream. */
    struct engine_request *rs[3];
    int taken[3];
    for (int i = 0; i < 3; i++) {
        struct engine_params pi = p;
        pi.max_tokens = 20 + i;
        rs[i] = engine_request_new(&bos, 1, &pi, &e);
        taken[i] = engine_submit(eng, rs[i], &e) == 0;
        /* max_queue 2: the third may be refused if the first has not started. */
        CHECK(taken[i] || i == 2, "submit %d: %s", i, e.msg);
    }
    for (int i = 0; i < 3; i++) {
        if (taken[i]) {
            int k = drain(rs[i], got, 512, &last);
            CHECK(k == 20 + i && !memcmp(got, want, sizeof(int) * (size_t)k), "stream %d: %d", i, k);
        }
        engine_request_release(rs[i]);
    }

    /* 3. Queue bound: a long request runs, two wait, the next is refused. */
    struct engine_params longp = p;
    longp.max_tokens = 0;
    longp.ignore_eos = true; /* runs to the context limit */
    struct engine_request *lr = engine_request_new(&bos, 1, &longp, &e);
    CHECK(engine_submit(eng, lr, &e) == 0, "submit long: %s", e.msg);
    struct engine_event ev;
    CHECK(engine_request_next(lr, &ev, 30000) == 1 && ev.finish == ENGINE_FINISH_NONE,
          "long request started");
    struct engine_request *w1 = engine_request_new(&bos, 1, &p, &e);
    struct engine_request *w2 = engine_request_new(&bos, 1, &p, &e);
    struct engine_request *w3 = engine_request_new(&bos, 1, &p, &e);
    CHECK(engine_submit(eng, w1, &e) == 0 && engine_submit(eng, w2, &e) == 0, "two wait");
    CHECK(engine_submit(eng, w3, &e) == ENGINE_SUBMIT_BUSY && strstr(e.msg, "too many"), "third refused: %s", e.msg);
    engine_request_release(w3);

    /* 4. Cancel: the long request stops at its next step. */
    engine_request_cancel(lr);
    n = drain(lr, got, 512, &last);
    CHECK(last.finish == ENGINE_FINISH_CANCELLED && n < 500, "cancelled after %d tokens", n);
    engine_request_release(lr);
    /* A waiter cancelled by its client leaves the queue at once. */
    struct engine_stats qs;
    engine_get_stats(eng, &qs);
    int before = qs.queued;
    engine_request_cancel(w2);
    engine_get_stats(eng, &qs);
    CHECK(qs.queued <= before - 1 || before == 0, "cancelled waiter still queued (%d -> %d)", before, qs.queued);
    CHECK(engine_request_next(w2, &ev, 1000) == 1 && ev.finish == ENGINE_FINISH_CANCELLED,
          "cancelled waiter gets its final event");
    engine_request_release(w2);
    n = drain(w1, got, 512, &last);
    CHECK(n == 100 && last.finish == ENGINE_FINISH_LENGTH, "waiter ran: %d", n);
    engine_request_release(w1);

    /* 5. Bad input is refused up front. */
    int big[600];
    for (int i = 0; i < 600; i++)
        big[i] = 5;
    r = engine_request_new(big, 600, &p, &e);
    CHECK(engine_submit(eng, r, &e) == ENGINE_SUBMIT_INVALID && strstr(e.msg, "600"),
          "too long: %s", e.msg);
    engine_request_release(r);
    int badid = 9999;
    r = engine_request_new(&badid, 1, &p, &e);
    CHECK(engine_submit(eng, r, &e) == ENGINE_SUBMIT_INVALID && strstr(e.msg, "vocabulary"),
          "bad id: %s", e.msg);
    engine_request_release(r);
    struct engine_params badp = p;
    badp.sp.top_p = 3;
    CHECK(engine_request_new(&bos, 1, &badp, &e) == NULL && strstr(e.msg, "top_p"), "bad params");

    /* 6. Stats add up and the KV pool is whole again. */
    struct engine_stats st;
    wait_idle(eng, &st); /* the cancelled waiter drains asynchronously */
    CHECK(st.queued == 0 && st.running == 0, "idle: %d queued %d running", st.queued, st.running);
    CHECK(st.kv_blocks_free + st.cache_blocks_idle == st.kv_blocks_total &&
              st.cache_blocks == st.cache_blocks_idle,
          "kv blocks leaked: %d of %d free, %d cached (%d idle)", st.kv_blocks_free,
          st.kv_blocks_total, st.cache_blocks, st.cache_blocks_idle);
    CHECK(st.requests_cancelled >= 2, "cancel count %llu", (unsigned long long)st.requests_cancelled);

    /* 7. Shutdown with queued work: every request gets a final event. */
    struct engine_request *lr2 = engine_request_new(&bos, 1, &longp, &e);
    struct engine_request *q2 = engine_request_new(&bos, 1, &p, &e);
    CHECK(engine_submit(eng, lr2, &e) == 0 && engine_submit(eng, q2, &e) == 0, "%s", e.msg);
    engine_destroy(eng);
    drain(lr2, got, 512, &last);
    CHECK(last.finish == ENGINE_FINISH_CANCELLED || last.finish == ENGINE_FINISH_LENGTH, "lr2 ended");
    drain(q2, got, 512, &last);
    CHECK(last.finish != ENGINE_FINISH_NONE, "q2 ended");
    engine_request_release(lr2);
    engine_request_release(q2);
    prefix_cache_tests(&m, want);
    ahead_tests(&m, want);
    kv_budget_tests(&m, want);
    shared_chunk_tests(&m);
    snprintf(path, sizeof path, "%s/models/stories260K", shared);
    grammar_tests(&m, path, want);
    logits_tests(&m, path, want);
    ssd_tests(&m, want);
    spec_tests(&m, want, NULL, "ngram");
    draft_tests(&m, want);
    json_decref(root);
    model_free(&m);
    return test_summary("test_engine");
}
