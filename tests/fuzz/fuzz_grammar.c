/* fuzz_grammar.c - libFuzzer target: the GBNF compiler and the matcher on
 * arbitrary text, since a request's guided_grammar is untrusted. The input
 * is a grammar, then (after the first NUL, if any) a text: the grammar
 * either compiles or is refused with a message; a compiled one accepts or
 * refuses the text without crashing, and agrees with a byte-at-a-time
 * matcher fed the same text; the text's literal is a grammar that accepts
 * exactly the text. JSON Schemas go the same way: the input parsed as JSON
 * either converts to GBNF that compiles, or is refused; and so does the
 * input read as a regular expression, as text and inside a JSON string.
 * Run: build-fuzz/fuzz_grammar -max_total_time=60 -dict=tests/fuzz/grammar.dict */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whether the n bytes are UTF-8 (the literals' contract: GBNF is text). */
static bool utf8(const unsigned char *s, size_t n)
{
    uint32_t cp;
    for (size_t i = 0, k; i < n; i += k)
        if ((k = (size_t)utf8_get((const char *)s + i, n - i, &cp)) == 0)
            return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    const char *nul = memchr(p, 0, size);
    size_t gn = nul ? (size_t)(nul - p) : size;
    const char *text = nul ? nul + 1 : "";
    size_t tn = nul ? size - gn - 1 : 0;
    struct err e = {{0}};
    struct grammar *g = grammar_parse(p, gn, &e);
    if (!g && !e.msg[0])
        abort(); /* a refusal always says why */
    if (g) {
        bool whole = grammar_accepts(g, text, tn);
        struct grammar_matcher *m = grammar_matcher_new(g, NULL, &e);
        bool ok = m != NULL;
        for (size_t i = 0; ok && i < tn; i++)
            ok = grammar_matcher_feed(m, text + i, 1, &e) == 0;
        bool bytewise = ok && grammar_matcher_can_end(m);
        if (m && bytewise != whole && !strstr(e.msg, "limit"))
            abort(); /* fed whole or byte by byte, the same answer */
        grammar_matcher_free(m);
        grammar_free(g);
    }
    if (tn < 256 && utf8((const unsigned char *)text, tn)) { /* a literal of the text is a grammar of exactly it */
        char q[4 * 256 + 16], gt[4 * 256 + 32];
        grammar_literal(text, tn, q);
        snprintf(gt, sizeof gt, "root ::= %s", q);
        struct grammar *lg = grammar_parse(gt, strlen(gt), &e);
        if (!lg || !grammar_accepts(lg, text, tn))
            abort();
        grammar_free(lg);
    }
    char *re = malloc(gn + 1);
    if (re) {
        memcpy(re, p, gn);
        re[gn] = 0;
        for (int mode = 0; mode < 4; mode++) {
            enum regex_target t = mode & 1 ? REGEX_JSON_STRING : REGEX_TEXT;
            char *expr = regex_gbnf(re, t, mode & 2, &e);
            if (!expr) {
                if (!e.msg[0])
                    abort();
                continue;
            }
            size_t n = strlen(expr) + 32;
            char *gt = malloc(n);
            snprintf(gt, n, t == REGEX_JSON_STRING ? "root ::= \"\\\"\" %s \"\\\"\"" : "root ::= %s",
                     expr);
            struct grammar *rg = grammar_parse(gt, strlen(gt), &e);
            if (!rg && !strstr(e.msg, "limit"))
                abort(); /* the compiler's output always compiles */
            if (rg && t == REGEX_TEXT)
                (void)grammar_accepts(rg, text, tn);
            grammar_free(rg);
            free(gt);
            free(expr);
        }
        free(re);
    }
    json_error_t je;
    json_t *schema = json_loadb(p, gn, JSON_DECODE_ANY, &je);
    if (schema) {
        char *gb = json_schema_gbnf(schema, &e);
        if (gb) {
            struct grammar *sg = grammar_parse(gb, strlen(gb), &e);
            if (!sg)
                abort(); /* the converter's output always compiles */
            grammar_free(sg);
            free(gb);
        } else if (!e.msg[0]) {
            abort();
        }
        json_decref(schema);
    }
    return 0;
}
