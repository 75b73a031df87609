/* fuzz_turn.c - libFuzzer target: the assistant turn's parser (turn.c) on
 * arbitrary text. The first byte picks the syntax (tool format, <think>,
 * an open <think>, a schema for XML calls) and a cut step; the rest is the
 * turn. Fed whole and fed in pieces of that step, it must emit the same
 * reasoning, content and calls (the contract: cuts change nothing), and
 * every call's arguments must be a JSON object.
 * Run: build-fuzz/fuzz_turn -max_total_time=60 -dict=tests/fuzz/turn.dict */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/turn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct got {
    char *buf[3]; /* reasoning, content, calls ("name\0args\0" each) */
    size_t n[3];
};

static void put(struct got *g, int k, const char *p, size_t n)
{
    g->buf[k] = realloc(g->buf[k], g->n[k] + n + 1);
    if (!g->buf[k])
        abort();
    memcpy(g->buf[k] + g->n[k], p, n);
    g->n[k] += n;
}

static void on_event(void *ctx, const struct turn_event *ev)
{
    struct got *g = ctx;
    if (ev->kind == TURN_TOOL_CALL) {
        json_t *a = json_loads(ev->args, 0, NULL);
        if (!json_is_object(a) || !ev->name[0])
            abort(); /* a call's arguments are always an object, its name non-empty */
        json_decref(a);
        put(g, 2, ev->name, strlen(ev->name) + 1);
        put(g, 2, ev->args, strlen(ev->args) + 1);
    } else {
        if (!ev->n)
            abort(); /* no empty text events */
        put(g, ev->kind == TURN_REASONING ? 0 : 1, ev->text, ev->n);
    }
}

static void run(struct turn_syntax syn, const char *p, size_t n, size_t step, struct got *g)
{
    struct turn t;
    turn_init(&t, syn, on_event, g);
    for (size_t at = 0; at < n; at += step)
        turn_feed(&t, p + at, at + step < n ? step : n - at);
    turn_finish(&t);
    turn_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *schema;
    if (!schema)
        schema = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                            "\"parameters\": {\"properties\": {\"s\": {\"type\": \"string\"}}}}}]",
                            0, NULL);
    if (size < 1)
        return 0;
    const uint8_t c = data[0];
    struct turn_syntax syn = {.tools = (enum turn_tools)(c % 3), .think = c & 4,
                              .think_open = c & 8, .schema = c & 16 ? schema : NULL};
    size_t step = 1 + (c >> 5);
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    struct got a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    run(syn, p, n, n ? n : 1, &a);
    run(syn, p, n, step, &b);
    for (int k = 0; k < 3; k++) {
        if (a.n[k] != b.n[k] || (a.n[k] && memcmp(a.buf[k], b.buf[k], a.n[k])))
            abort(); /* cut into pieces, the turn split otherwise */
        free(a.buf[k]);
        free(b.buf[k]);
    }
    return 0;
}
