/* tool_grammar.c - tool_choice "required" or a named tool as a grammar: the
 * answer is held to tool calls written the way the chat template's model
 * writes them (turn.h's syntax), each call's arguments to its tool's
 * parameter schema, after the reasoning the model may write first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "serve/internal.h"
#include "serve/tool_grammar.h"

static void put_lit(struct buf *b, const char *s)
{
    size_t n = strlen(s);
    char *q = malloc(4 * n + 3);
    if (!q) {
        b->oom = true;
        return;
    }
    buf_putn(b, q, grammar_literal(s, n, q));
    free(q);
}

/* Rules `<name>-0 .. <name>-(m-1)`: any text up to and including the first
 * occurrence of stop (ASCII). A KMP automaton written as rules: state i has
 * matched i bytes of stop; a byte of stop moves where the failure function
 * says, any other byte back to state 0. */
static void put_upto(struct buf *b, const char *name, const char *stop)
{
    int m = (int)strlen(stop), fail[64] = {0};
    for (int i = 1, k = 0; i < m; i++) {
        while (k && stop[i] != stop[k])
            k = fail[k - 1];
        if (stop[i] == stop[k])
            k++;
        fail[i] = k;
    }
    char distinct[64];
    int nd = 0;
    for (int i = 0; i < m; i++)
        if (!memchr(distinct, stop[i], (size_t)nd))
            distinct[nd++] = stop[i];
    for (int i = 0; i < m; i++) {
        buf_printf(b, "%s-%d ::= [^", name, i);
        for (int d = 0; d < nd; d++)
            buf_printf(b, "\\x%02x", (unsigned char)distinct[d]);
        buf_printf(b, "] %s-0", name);
        for (int d = 0; d < nd; d++) {
            int k = i; /* the state after distinct[d] in state i */
            while (k && stop[k] != distinct[d])
                k = fail[k - 1];
            if (stop[k] == distinct[d])
                k++;
            buf_printf(b, " | \"\\x%02x\"", (unsigned char)distinct[d]);
            if (k < m)
                buf_printf(b, " %s-%d", name, k);
        }
        buf_puts(b, "\n");
    }
}

/* The JSON-form call of one tool: its name, then its arguments under
 * args_key, held to the parameters' rules (prefix). */
static void put_json_call(struct buf *b, const char *name, const char *args_key,
                          const char *prefix)
{
    json_t *jn = json_string(name);
    char *quoted = jn ? json_dumps(jn, JSON_ENCODE_ANY) : NULL;
    char head[600];
    snprintf(head, sizeof head, "{\"name\": %s, \"%s\": ", quoted ? quoted : "\"\"", args_key);
    put_lit(b, head);
    buf_printf(b, " %sroot \"}\"", prefix);
    free(quoted);
    json_decref(jn);
}

/* Qwen3-Coder's XML body: parameters by name, each value free text. */
static void put_xml_call(struct buf *b, const char *name, const json_t *params, int k)
{
    char head[600];
    snprintf(head, sizeof head, "<function=%s>\n", name);
    put_lit(b, head);
    const json_t *props = json_object_get(params, "properties");
    if (json_object_size(props)) {
        buf_printf(b, " xparam-%d*", k);
    }
    buf_puts(b, " \"</function>\"");
}

static void put_xml_params(struct buf *b, const json_t *params, int k)
{
    const json_t *props = json_object_get(params, "properties");
    if (!json_object_size(props))
        return;
    buf_printf(b, "xparam-%d ::= \"<parameter=\" (", k);
    const char *key;
    const json_t *v;
    int i = 0;
    json_object_foreach((json_t *)props, key, v) {
        buf_puts(b, i++ ? " | " : " ");
        put_lit(b, key);
    }
    buf_puts(b, " ) \">\\n\" xvalue-0 \"\\n\"\n");
}

char *tool_call_gbnf(const struct turn_syntax *syn, const json_t *tools, const char *only,
                     bool single, struct err *e)
{
    struct buf b = {0}, rules = {0};
    int n = 0;
    if (syn->tools == TURN_TOOLS_NONE) {
        err_set(e, "the model's chat template writes tool calls in no format cllm knows");
        return NULL;
    }
    size_t i;
    const json_t *t;
    buf_puts(&b, "call ::= ");
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || (only && strcmp(name, only)))
            continue;
        if (strlen(name) > 256) {
            err_set(e, "tool %zu: the name is longer than 256 bytes", i);
            goto fail;
        }
        const json_t *params = json_object_get(fn, "parameters");
        buf_puts(&b, n ? " | " : "");
        char prefix[32];
        snprintf(prefix, sizeof prefix, "t%d-", n);
        if (syn->tools == TURN_TOOLS_HERMES && syn->xml_calls) {
            put_xml_call(&b, name, params, n);
            put_xml_params(&rules, params, n);
        } else {
            put_json_call(&b, name, syn->tools == TURN_TOOLS_JSON ? "parameters" : "arguments",
                          prefix);
            /* a schema outside the supported subset still gets a call: its
             * arguments are then any object (the model's call is what the
             * client asked for; its arguments are the client's to check) */
            struct err se = {{0}};
            json_t *any = json_pack("{s:s}", "type", "object");
            char *g = json_schema_gbnf(json_is_object(params) ? params : any, &se);
            if (!g)
                g = json_schema_gbnf(any, &se);
            json_decref(any);
            char *pg = g ? grammar_prefix_rules(g, prefix, e) : NULL;
            free(g);
            if (!pg)
                goto fail;
            buf_puts(&rules, pg);
            buf_puts(&rules, "\n");
            free(pg);
        }
        n++;
    }
    if (n == 0) {
        err_set(e, only ? "no tool named \"%s\" is in 'tools'" : "'tools' has no function to call",
                only ? only : "");
        goto fail;
    }
    buf_puts(&b, "\n");
    if (syn->tools == TURN_TOOLS_HERMES) {
        /* as the templates write them: <tool_call>\n BODY \n</tool_call>,
         * several separated by a newline */
        buf_puts(&b, "one ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\n");
        buf_puts(&b, single ? "calls ::= one\n" : "calls ::= one (\"\\n\" one)*\n");
        if (syn->xml_calls)
            put_upto(&rules, "xvalue", "</parameter>"); /* as turn.c ends a value */
    } else {
        buf_puts(&b, "one ::= call\n");
        buf_puts(&b, single ? "calls ::= one\n" : "calls ::= one (\"; \" one)*\n");
    }
    if (syn->think && syn->think_open) { /* the prompt opened the reasoning */
        buf_puts(&b, "root ::= think-0 [ \\n]{0,4} calls\n");
        put_upto(&rules, "think", "</think>");
    } else if (syn->think && !syn->think_done) {
        buf_puts(&b, "root ::= (\"<think>\" think-0 [ \\n]{0,4})? calls\n");
        put_upto(&rules, "think", "</think>");
    } else {
        buf_puts(&b, "root ::= calls\n");
    }
    buf_putn(&b, rules.p, rules.n);
    buf_free(&rules);
    if (b.oom) {
        err_set(e, "out of memory");
        buf_free(&b);
        return NULL;
    }
    buf_putn(&b, "", 1);
    return b.p;
fail:
    buf_free(&b);
    buf_free(&rules);
    return NULL;
}
