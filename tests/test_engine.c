/* test_engine.c - the engine thread and its request channels: greedy output
 * through the engine equals the recorded ids, requests queue in order, the
 * queue bound holds, cancellation stops a request at the next step, and
 * shutdown ends every request with a final event. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "testutil.h"

/* Reads events until the final one; returns the number of tokens. */
static int drain(struct engine_request *r, int *out, int cap, struct engine_event *last)
{
    int n = 0;
    struct engine_event ev;
    while (engine_request_next(r, &ev, 30000) == 1) {
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

int main(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K", CLLM_SHARED_DIR);
    struct model m;
    struct err e = {{0}};
    if (model_load(&m, path, &e)) {
        CHECK(0, "%s", e.msg);
        return test_summary("test_engine");
    }
    snprintf(path, sizeof path, "%s/models/stories260K/expected_greedy.json", CLLM_SHARED_DIR);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    json_t *c = json_array_get(json_object_get(root, "cases"), 0); /* BOS only, 256 steps */
    int want[256];
    for (int i = 0; i < 256; i++)
        want[i] = (int)json_integer_value(json_array_get(json_object_get(c, "generated_ids"), i));

    struct engine_config cfg = {.n_threads = 2, .ctx_len = 512, .prefill_chunk = 8, .max_queue = 2};
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
    CHECK(engine_submit(eng, w3, &e) == -1 && strstr(e.msg, "too many"), "third refused: %s", e.msg);
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
    CHECK(engine_submit(eng, r, &e) == -1 && strstr(e.msg, "600"), "too long: %s", e.msg);
    engine_request_release(r);
    int badid = 9999;
    r = engine_request_new(&badid, 1, &p, &e);
    CHECK(engine_submit(eng, r, &e) == -1 && strstr(e.msg, "vocabulary"), "bad id: %s", e.msg);
    engine_request_release(r);
    struct engine_params badp = p;
    badp.sp.top_p = 3;
    CHECK(engine_request_new(&bos, 1, &badp, &e) == NULL && strstr(e.msg, "top_p"), "bad params");

    /* 6. Stats add up and the KV pool is whole again. */
    struct engine_stats st;
    for (int i = 0; i < 3000; i++) { /* the cancelled waiter drains asynchronously */
        engine_get_stats(eng, &st);
        if (st.queued == 0 && st.running == 0)
            break;
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    CHECK(st.queued == 0 && st.running == 0, "idle: %d queued %d running", st.queued, st.running);
    CHECK(st.kv_blocks_free == st.kv_blocks_total, "kv blocks leaked: %d of %d free",
          st.kv_blocks_free, st.kv_blocks_total);
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
    json_decref(root);
    model_free(&m);
    return test_summary("test_engine");
}
