/* test_regex.c - regular expressions as grammars (src/grammar/regex.c)
 * against PCRE2 as the oracle: for each pattern, every string over a small
 * alphabet up to a length is accepted by the grammar exactly when PCRE2
 * matches it (whole, or anywhere for search patterns); inside a JSON string
 * the grammar accepts a value's JSON text exactly when PCRE2 matches the
 * value; refusals name what is not supported. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/regex.h"
#include "testutil.h"

static struct grammar *compile(const char *re, enum regex_target t, bool search)
{
    struct err e = {{0}};
    char *expr = regex_gbnf(re, t, search, &e);
    CHECK(expr != NULL, "/%s/ refused: %s", re, e.msg);
    if (!expr)
        return NULL;
    size_t n = strlen(expr) + 64;
    char *text = malloc(n);
    snprintf(text, n, t == REGEX_JSON_STRING ? "root ::= \"\\\"\" %s \"\\\"\"\n" : "root ::= %s\n",
             expr);
    struct grammar *g = grammar_parse(text, strlen(text), &e);
    CHECK(g != NULL, "/%s/: the GBNF does not compile: %s\n%s", re, e.msg, text);
    free(text);
    free(expr);
    return g;
}

static bool pcre_match(pcre2_code *code, const char *s, size_t n)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
    int rc = pcre2_match(code, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

/* Every string over alpha (UTF-8 pieces) of length <= maxlen. */
static int strings(const char *const *alpha, int na, int maxlen, void (*fn)(const char *, size_t, void *),
                   void *ctx)
{
    int idx[8] = {0}, count = 0;
    for (int len = 0; len <= maxlen; len++) {
        memset(idx, 0, sizeof idx);
        for (;;) {
            char s[64];
            size_t n = 0;
            for (int k = 0; k < len; k++) {
                size_t l = strlen(alpha[idx[k]]);
                memcpy(s + n, alpha[idx[k]], l);
                n += l;
            }
            fn(s, n, ctx);
            count++;
            int k = len - 1;
            while (k >= 0 && ++idx[k] == na)
                idx[k--] = 0;
            if (k < 0)
                break;
        }
    }
    return count;
}

struct run {
    const char *re;
    struct grammar *g;
    pcre2_code *code;
    bool json;
    int diff;
};

static void one(const char *s, size_t n, void *ctx)
{
    struct run *r = ctx;
    bool want = pcre_match(r->code, s, n), got;
    if (r->json) { /* the value's JSON text */
        json_t *v = json_stringn(s, n);
        char *text = json_dumps(v, JSON_ENCODE_ANY);
        got = grammar_accepts(r->g, text, strlen(text));
        free(text);
        json_decref(v);
    } else {
        got = grammar_accepts(r->g, s, n);
    }
    if (got != want && r->diff++ < 3)
        CHECK(0, "/%s/%s on \"%.*s\": grammar %d, PCRE2 %d", r->re, r->json ? " (JSON)" : "",
              (int)n, s, got, want);
}

/* The grammar of re against PCRE2 over every string of alpha up to maxlen. */
static void against_pcre(const char *re, bool search, bool json, const char *const *alpha, int na,
                         int maxlen)
{
    struct run r = {.re = re, .json = json};
    r.g = compile(re, json ? REGEX_JSON_STRING : REGEX_TEXT, search);
    /* PCRE2 as the dialects mean it: JSON Schema's pattern searches,
     * guided_regex matches whole, '.' stops at a newline in both, \uHHHH
     * is ECMAScript's (ALT_BSUX) */
    char anchored[512];
    snprintf(anchored, sizeof anchored, search ? "%s" : "^(?:%s)$", re);
    int ec;
    PCRE2_SIZE off;
    r.code = pcre2_compile((PCRE2_SPTR)anchored, PCRE2_ZERO_TERMINATED,
                           PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_ALT_BSUX, &ec, &off, NULL);
    CHECK(r.code != NULL, "PCRE2 refuses /%s/", anchored);
    if (r.g && r.code) {
        int n = strings(alpha, na, maxlen, one, &r);
        CHECK(r.diff == 0, "/%s/: %d of %d strings differ", re, r.diff, n);
    }
    grammar_free(r.g);
    pcre2_code_free(r.code);
}

static void refused(const char *re, const char *want)
{
    struct err e = {{0}};
    char *expr = regex_gbnf(re, REGEX_TEXT, false, &e);
    CHECK(!expr && strstr(e.msg, want), "/%s/: %s (want \"%s\")", re, expr ? expr : e.msg, want);
    free(expr);
}

int main(void)
{
    static const char *const ab[] = {"a", "b", "-", "1"};
    static const char *const mixed[] = {"a", "Z", "7", "_", " ", "\n", "\"", "\\", "é", "{"};
    /* whole-string patterns over a small alphabet */
    const char *full[] = {
        "a", "ab|b", "a*", "(ab)+", "a?b", "[ab]{2}", "[^a]{1,3}", "a{2,}", "(a|b-)*1",
        "\\d+", "\\w\\W?", "[\\d-]+", "[a-]", "-?\\d{1,2}", "(?:a|)b", "(?P<x>a)b", "a+?", "",
        "[]a]", "1{", "a{1}b{0,1}", "^ab$", "(((a)))", "[^\\d]", "(a?){2,3}", "(a|b?)-",
    };
    for (size_t i = 0; i < sizeof full / sizeof *full; i++)
        against_pcre(full[i], false, false, ab, 4, 5);
    /* classes and escapes over letters, digits, blanks, quotes, non-ASCII */
    const char *wide[] = {
        ".", "\\s", "\\S", "[^a-z]", "\\D\\w", "[\\u00e9\"]", "\\x5f|\\{", "\\\\", "\"", "[^\\n]",
        ".é", "[\\s\\\\]",
    };
    for (size_t i = 0; i < sizeof wide / sizeof *wide; i++) {
        against_pcre(wide[i], false, false, mixed, 10, 2);
        against_pcre(wide[i], false, true, mixed, 10, 2); /* inside a JSON string */
    }
    /* JSON Schema's pattern: a search unless anchored */
    const char *search[] = {"a", "^a", "b$", "^a-?1$", "\\d", "^(a|b)$", "a.b", ""};
    for (size_t i = 0; i < sizeof search / sizeof *search; i++) {
        against_pcre(search[i], true, false, ab, 4, 4);
        against_pcre(search[i], true, true, ab, 4, 4);
    }
    refused("a(?=b)", "lookaround");
    refused("(?i)a", "inline flags");
    refused("(a)\\1", "\\1");
    refused("\\bword", "word boundaries");
    refused("a^b", "'^'");
    refused("a*+", "possessive");
    refused("a**", "quantifier after a quantifier");
    refused("(a", "without its ')'");
    refused("a)", "without its '('");
    refused("[a", "without its ']'");
    refused("[b-a]", "below its start");
    refused("*a", "nothing to repeat");
    refused("a{5,2}", "below the minimum");
    refused("a{2000}", "over 1000");
    refused("\\p{L}", "\\p");
    refused("(a*)*", "can match nothing");
    refused("()()*", "can match nothing"); /* fuzz_grammar's first finding, as it came */
    refused("()+", "can match nothing");
    refused("(a|)*b", "can match nothing");
    refused("(a?){2,}", "can match nothing");
    struct err e = {{0}};
    char *x = regex_gbnf("^a|b$", REGEX_TEXT, true, &e);
    CHECK(!x && strstr(e.msg, "^(a|b)$"), "anchors beside a top-level '|': %s", e.msg);
    free(x);
    return test_summary("test_regex");
}
