/* test_grammar.c - the GBNF compiler and the matcher (src/grammar): which
 * texts a grammar accepts, the messages of bad grammars, and token masks over
 * real vocabularies checked against feeding each token's bytes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"
#include "testutil.h"

static struct grammar *parse(const char *text)
{
    struct err e = {{0}};
    struct grammar *g = grammar_parse(text, strlen(text), &e);
    CHECK(g != NULL, "grammar did not compile: %s\n%s", e.msg, text);
    return g;
}

static void accepts(const char *gtext, const char *const *yes, const char *const *no)
{
    struct grammar *g = parse(gtext);
    if (!g)
        return;
    for (int i = 0; yes && yes[i]; i++)
        CHECK(grammar_accepts(g, yes[i], strlen(yes[i])), "should accept \"%s\" in\n%s", yes[i],
              gtext);
    for (int i = 0; no && no[i]; i++)
        CHECK(!grammar_accepts(g, no[i], strlen(no[i])), "should reject \"%s\" in\n%s", no[i],
              gtext);
    grammar_free(g);
}

static void refuses(const char *gtext, const char *want)
{
    struct err e = {{0}};
    struct grammar *g = grammar_parse(gtext, strlen(gtext), &e);
    CHECK(g == NULL, "should not compile: %s", gtext);
    CHECK(strstr(e.msg, want) != NULL, "message \"%s\" lacks \"%s\"", e.msg, want);
    grammar_free(g);
}

static void test_language(void)
{
    accepts("root ::= \"ab\" | \"c\"", (const char *[]){"ab", "c", NULL},
            (const char *[]){"", "a", "abc", "b", NULL});
    accepts("root ::= [a-c]* \"!\"", (const char *[]){"!", "a!", "abcabc!", NULL},
            (const char *[]){"", "d!", "ab", "!!", NULL});
    accepts("root ::= (\"x\" | \"yz\")+", (const char *[]){"x", "yz", "xyzx", NULL},
            (const char *[]){"", "y", "xy", NULL});
    accepts("root ::= \"a\"? \"b\"{2,3} [0-9]{2}", (const char *[]){"bb12", "abbb00", NULL},
            (const char *[]){"b12", "abbbb00", "bb1", NULL});
    accepts("root ::= \"ab\"{2,}", (const char *[]){"abab", "ababab", NULL},
            (const char *[]){"ab", "aba", NULL});
    /* rules across lines, comments, forward references, recursion */
    accepts("# balanced\nroot ::= item*\nitem ::= \"(\" root \")\"\n   | \"x\"  # leaf\n",
            (const char *[]){"", "x", "(x)", "((x)x)()", NULL},
            (const char *[]){"(", ")", "(x", "y", NULL});
    /* classes past ASCII: UTF-8 of each length, negation over Unicode */
    accepts("root ::= [^\"\\\\]+", (const char *[]){"a", "é", "日本", "😀x", NULL},
            (const char *[]){"", "\"", "a\\", "\xff", "\xc3", "\xed\xa0\x80", NULL});
    accepts("root ::= [α-ω]+ [\\u00e9\\U0001F600]", (const char *[]){"αβé", "ω😀", NULL},
            (const char *[]){"αβ", "aé", "Ωé", NULL});
    accepts("root ::= \"\\x41\\u00e9\\n\\t\"", (const char *[]){"Aé\n\t", NULL},
            (const char *[]){"A", NULL});
    accepts("root ::= . .", (const char *[]){"ab", "éé", "a😀", NULL},
            (const char *[]){"a", "abc", NULL});
    /* ambiguity: both readings kept until one dies */
    accepts("root ::= \"a\" \"b\"* \"bc\" | \"ab\" \"d\"",
            (const char *[]){"abc", "abbbc", "abd", NULL},
            (const char *[]){"ab", "abbd", NULL});
    /* nullable rules that are not left-recursive */
    accepts("root ::= opt opt \"x\" opt\nopt ::= \"o\"?", (const char *[]){"x", "ox", "oox", "oxo",
                                                               NULL},
            (const char *[]){"ooox", "xoo", NULL});
}

/* Rules renamed apart join into one grammar. */
static void test_prefix(void)
{
    struct err e = {{0}};
    char *a = grammar_prefix_rules("root ::= x{2} \"root\" [a-z] # root x\nx ::= \"\\\"\" | x-y\n"
                                   "x-y ::= [\\]q]",
                                   "p-", &e);
    CHECK(a && !strcmp(a, "p-root ::= p-x{2} \"root\" [a-z] # root x\np-x ::= \"\\\"\" | p-x-y\n"
                          "p-x-y ::= [\\]q]"),
          "prefixed: %s", a ? a : e.msg);
    char *b = grammar_prefix_rules("root ::= \"b\"+", "q-", &e);
    size_t n = strlen(a) + strlen(b) + 64;
    char *both = malloc(n);
    snprintf(both, n, "root ::= p-root | q-root\n%s\n%s", a, b);
    accepts(both, (const char *[]){"\"\"rootq", "]]roota", "bbb", NULL},
            (const char *[]){"\"root", "b\"", NULL});
    CHECK(!grammar_prefix_rules("root ::= \"open", "p-", &e) && strstr(e.msg, "unterminated"),
          "unterminated literal: %s", e.msg);
    free(a);
    free(b);
    free(both);
}

/* A literal of any bytes is a grammar of exactly those bytes. */
static void test_literal(void)
{
    const char *texts[] = {"plain", "q\"uo\\te", "line\nbreak\ttab\x01\x7f", "日本 😀", ""};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        char q[128], g[160];
        size_t n = strlen(texts[i]);
        size_t k = grammar_literal(texts[i], n, q);
        CHECK(k == strlen(q) && k <= 4 * n + 2, "length %zu", k);
        snprintf(g, sizeof g, "root ::= %s", q);
        char longer[64];
        snprintf(longer, sizeof longer, "%sx", texts[i]);
        accepts(g, (const char *[]){texts[i], NULL}, (const char *[]){longer, NULL});
    }
}

static void test_refusals(void)
{
    refuses("item ::= \"x\"", "no rule named 'root'");
    refuses("root ::= thing", "'thing' is used but not defined");
    refuses("root ::= \"x\"\nroot ::= \"y\"", "defined twice");
    refuses("root ::= root \"x\" | \"y\"", "left recursion");
    refuses("root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"b\"", "left recursion");
    refuses("root ::= \"abc", "line 1: unterminated string literal");
    refuses("root ::= \"a\"\n\nx ::= [abc", "line 3: unterminated character class");
    refuses("root ::= [z-a]", "out of order");
    refuses("root ::= (\"a\"", "missing ')'");
    refuses("root ::= \"a\")", "unmatched ')'");
    refuses("root ::= \"a\"{3,2}", "n < m");
    refuses("root ::= \"a\"{5000}", "over 1000");
    refuses("root ::= \"\\q\"", "unknown escape");
    refuses("root = \"a\"", "expected '::='");
    refuses("root ::= \"\xc1\x81\"", "invalid UTF-8");       /* overlong 'A' */
    refuses("root ::= \"\xed\xa0\x80\"", "invalid UTF-8");   /* a surrogate */
    refuses("root ::= \"\xf4\x90\x80\x80\"", "invalid UTF-8"); /* past U+10FFFF */
    refuses("root ::= \"a\" @", "unexpected '@'");
}

/* The mask of every state met along a text equals, token by token, whether
 * feeding that token's bytes succeeds. */
static void check_masks(const struct tokenizer *t, const char *gtext, const char *text)
{
    struct grammar *g = parse(gtext);
    struct err e = {{0}};
    int nv = tok_vocab_size(t);
    struct grammar_vocab *v = grammar_vocab_new(t, nv, &e);
    CHECK(v != NULL, "vocab: %s", e.msg);
    struct grammar_matcher *m = g && v ? grammar_matcher_new(g, v, &e) : NULL;
    CHECK(m != NULL, "matcher: %s", e.msg);
    float *logits = malloc(sizeof *logits * (size_t)nv);
    int eos = tok_eos_id(t), n_states = 0, mismatches = 0;
    for (size_t at = 0; m && at <= strlen(text); at++) {
        for (int i = 0; i < nv; i++)
            logits[i] = 1.0f;
        int n = grammar_matcher_mask(m, logits, &eos, eos >= 0, &e);
        CHECK(n >= 0, "mask: %s", e.msg);
        int count = 0;
        for (int id = 0; id < nv; id++) {
            struct grammar_matcher *probe = grammar_matcher_new(g, v, &e);
            /* replay the text so far, then the token */
            bool ok = grammar_matcher_feed(probe, text, at, &e) == 0 &&
                      grammar_matcher_feed_token(probe, id, &e) == 0;
            if (id == eos)
                ok = grammar_matcher_can_end(m);
            grammar_matcher_free(probe);
            count += ok;
            if (ok != (logits[id] != -INFINITY) && mismatches++ < 5)
                CHECK(0, "at %zu of \"%s\": token %d (%s) masked %d, feeds %d", at, text, id,
                      tok_piece(t, id), logits[id] == -INFINITY, ok);
        }
        CHECK(count == n, "count %d vs %d allowed", n, count);
        n_states++;
        if (at < strlen(text))
            CHECK(grammar_matcher_feed(m, text + at, 1, &e) == 0, "feeding \"%s\": %s", text, e.msg);
    }
    CHECK(mismatches == 0, "%d mask mismatches", mismatches);
    CHECK(!m || grammar_matcher_can_end(m), "\"%s\" should be complete", text);
    free(logits);
    grammar_matcher_free(m);
    grammar_vocab_free(v);
    grammar_free(g);
}

static void test_masks(void)
{
    struct err e = {{0}};
    struct tokenizer *t = tok_load_for_model(CLLM_SHARED_DIR "/models/tinystories-656k", &e);
    CHECK(t != NULL, "tokenizer: %s", e.msg);
    if (!t)
        return;
    check_masks(t, "root ::= \"{\" ws \"\\\"ok\\\"\" ws \":\" ws (\"true\" | \"false\") ws \"}\"\n"
                   "ws ::= [ \\n]{0,3}",
                "{\"ok\": true}");
    check_masks(t, "root ::= [a-z ]+ \".\"", "once upon a time.");
    /* nothing but the end may follow a finished sentence */
    struct grammar *g = parse("root ::= \"hi\"");
    struct grammar_vocab *v = grammar_vocab_new(t, tok_vocab_size(t), &e);
    struct grammar_matcher *m = grammar_matcher_new(g, v, &e);
    CHECK(m && !grammar_matcher_can_end(m) && grammar_matcher_feed(m, "hi", 2, &e) == 0 &&
              grammar_matcher_must_end(m),
          "\"hi\" should finish the sentence");
    float *logits = malloc(sizeof *logits * (size_t)tok_vocab_size(t));
    for (int i = 0; i < tok_vocab_size(t); i++)
        logits[i] = 0.5f;
    int eos = tok_eos_id(t);
    CHECK(m && grammar_matcher_mask(m, logits, &eos, 1, &e) == 1 && logits[eos] == 0.5f,
          "only EOS should be left");
    CHECK(m && grammar_matcher_feed(m, "!", 1, &e) == -1 && grammar_matcher_must_end(m),
          "a byte past the end is refused, the matcher unchanged");
    /* a grammar whose stacks double with each byte fails its own mask
     * with a message, at once, instead of working without bound */
    grammar_matcher_free(m);
    grammar_free(g);
    g = parse("root ::= a\na ::= \"x\" a \"y\" | \"x\" a \"z\" | \"\"");
    m = g ? grammar_matcher_new(g, v, &e) : NULL;
    int rc = 0;
    for (int i = 0; m && i < 40 && rc >= 0; i++) {
        rc = grammar_matcher_mask(m, logits, &eos, 1, &e);
        if (rc >= 0 && grammar_matcher_feed(m, "x", 1, &e))
            break;
    }
    CHECK(rc == -1 && strstr(e.msg, "too ambiguous"), "ambiguity bound: rc %d, %s", rc, e.msg);
    free(logits);
    grammar_matcher_free(m);
    grammar_vocab_free(v);
    grammar_free(g);
    tok_free(t);
}

int main(void)
{
    test_language();
    test_refusals();
    test_prefix();
    test_literal();
    test_masks();
    return test_summary("test_grammar");
}
