/* test_json_schema.c - JSON Schema to GBNF (src/grammar/json_schema.c): for
 * each schema the grammar compiles, accepts the valid texts (compact and
 * spaced out) and refuses the invalid ones; unsupported schemas are refused
 * with their path; and, as a property, random values valid under a schema
 * are accepted however jansson prints them, while a mutated text the grammar
 * accepts always parses and is valid under the schema. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "testutil.h"

#include <jansson.h>

#define MAXT 24

struct tcase {
    const char *name, *schema; /* schema NULL: json_schema_gbnf(NULL) */
    const char *good[MAXT], *bad[MAXT];
};

/* The schema's grammar, compiled; NULL (a failed CHECK) if either step fails. */
static struct grammar *compile(const json_t *schema, const char *name)
{
    struct err e = {{0}};
    char *text = json_schema_gbnf(schema, &e);
    CHECK(text, "%s: json_schema_gbnf: %s", name, e.msg);
    if (!text)
        return NULL;
    struct grammar *g = grammar_parse(text, strlen(text), &e);
    CHECK(g, "%s: grammar_parse: %s\n%s", name, e.msg, text);
    free(text);
    return g;
}

/* The JSON text with blanks a person might add: a space after ',' and ':',
 * a newline and indent after '{' and '[', a newline before '}' and ']'
 * (empty ones stay "{}" and "[]");
 * nothing inside strings, nothing around the whole (the grammar allows no
 * blanks there). Caller frees. */
static char *spaced(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(4 * n + 8), *o = out;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (in_str) {
            *o++ = ch;
            if (ch == '\\' && i + 1 < n)
                *o++ = s[++i];
            else if (ch == '"')
                in_str = false;
            continue;
        }
        bool empty = (ch == '{' || ch == '[') && i + 1 < n && (s[i + 1] == '}' || s[i + 1] == ']');
        if ((ch == '}' || ch == ']') && !(i > 0 && (s[i - 1] == '{' || s[i - 1] == '[')))
            *o++ = '\n';
        *o++ = ch;
        if (ch == '"')
            in_str = true;
        else if (ch == ',' || ch == ':')
            *o++ = ' ';
        else if ((ch == '{' || ch == '[') && !empty)
            o += sprintf(o, "\n  ");
    }
    *o = 0;
    return out;
}

/* spaced_too: also the good texts with blanks added (not for enum members
 * that are objects or arrays: those are compact literals). */
static void run_case(const struct tcase *t, bool spaced_too)
{
    json_error_t je;
    json_t *schema = NULL;
    if (t->schema) {
        schema = json_loads(t->schema, JSON_DECODE_ANY, &je);
        CHECK(schema, "%s: the test's schema does not parse: %s", t->name, je.text);
        if (!schema)
            return;
    }
    struct grammar *g = compile(schema, t->name);
    json_decref(schema);
    if (!g)
        return;
    for (int i = 0; i < MAXT && t->good[i]; i++) {
        const char *s = t->good[i];
        json_t *v = json_loads(s, JSON_DECODE_ANY, &je);
        CHECK(v, "%s: the test's good text %s is not JSON: %s", t->name, s, je.text);
        json_decref(v);
        CHECK(grammar_accepts(g, s, strlen(s)), "%s: refuses %s", t->name, s);
        if (!spaced_too)
            continue;
        char *sp = spaced(s);
        CHECK(grammar_accepts(g, sp, strlen(sp)), "%s: refuses spaced [%s]", t->name, sp);
        free(sp);
    }
    for (int i = 0; i < MAXT && t->bad[i]; i++)
        CHECK(!grammar_accepts(g, t->bad[i], strlen(t->bad[i])), "%s: accepts %s", t->name,
              t->bad[i]);
    grammar_free(g);
}

#define FLAT                                                                                    \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"    \
    "\"integer\"},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\",\"ok\"],"       \
    "\"additionalProperties\":false}"

static const struct tcase CASES[] = {
    {"flat", FLAT,
     {"{\"name\":\"Al\",\"age\":30,\"ok\":true}", "{\"name\":\"\",\"age\":-5,\"ok\":false}",
      "{\"name\":\"\\u00e9\\n\\\"q\\\" \\\\ \\/\",\"age\":0,\"ok\":true}",
      "{\"name\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\",\"age\":1234567890123456,\"ok\":true}"},
     {"{\"name\":\"Al\",\"age\":30}", "{\"name\":\"Al\",\"age\":\"30\",\"ok\":true}",
      "{\"name\":\"Al\",\"age\":30,\"ok\":true,\"x\":1}",
      "{\"age\":30,\"name\":\"Al\",\"ok\":true}",
      "{\"name\":\"Al,\"age\":30,\"ok\":true}", "{\"name\":\"Al\",\"age\":30,\"ok\":true}x",
      "{\"name\":\"Al\",\"age\":01,\"ok\":true}", "{\"name\":\"Al\",\"age\":1.5,\"ok\":true}",
      "{\"name\":\"Al\",\"age\":30,\"ok\":true,}", "{\"name\":\"A\tl\",\"age\":30,\"ok\":true}",
      "{\"name\":\"\\x\",\"age\":30,\"ok\":true}", "{\"name\":\"Al\",\"age\":30,\"ok\":True}",
      "{\"name\":\"Al\",\"age\":30,\"ok\":true",
      "{\"name\":\"Al\",\"age\":12345678901234567,\"ok\":true}",
      "{name:\"Al\",\"age\":30,\"ok\":true}", "{\"name\":\"Al\" \"age\":30,\"ok\":true}"}},
    {"optional",
     "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":"
     "\"number\"},\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}",
     {"{\"b\":1}", "{\"a\":\"x\",\"b\":1.5e3}", "{\"b\":-0.5,\"c\":true}",
      "{\"a\":\"x\",\"b\":2,\"c\":false}", "{\"b\":1,\"zz\":[1,{\"q\":null}]}",
      "{\"a\":\"x\",\"b\":2,\"c\":false,\"d\":\"e\",\"f\":1}"},
     {"{}", "{\"a\":\"x\"}", "{\"c\":true,\"b\":1}", "{\"a\":1,\"b\":1}", "{\"b\":1,}",
      "{\"b\":1 \"c\":true}"}},
    {"all optional, closed",
     "{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"},\"c\":{\"type\":"
     "\"integer\"}},\"additionalProperties\":false}",
     {"{}", "{\"a\":1}", "{\"b\":1}", "{\"c\":1}", "{\"a\":1,\"c\":3}", "{\"b\":2,\"c\":3}",
      "{\"a\":1,\"b\":2,\"c\":3}"},
     {"{\"d\":1}", "{\"a\":1,\"a\":1}", "{\"b\":1,\"a\":1}", "{,}", "{\"a\":1,}", "[]"}},
    {"nested",
     "{\"type\":\"object\",\"properties\":{\"user\":{\"type\":\"object\",\"properties\":{\"id\":"
     "{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
     "\"required\":[\"id\"],\"additionalProperties\":false},\"meta\":{\"type\":\"object\"}},"
     "\"required\":[\"user\"],\"additionalProperties\":false}",
     {"{\"user\":{\"id\":1}}", "{\"user\":{\"id\":1,\"tags\":[\"a\",\"b\"]},\"meta\":{}}",
      "{\"user\":{\"id\":1,\"tags\":[]},\"meta\":{\"x\":{\"y\":[1,2,{\"z\":null}]}}}"},
     {"{\"user\":{}}", "{\"user\":{\"id\":1,\"x\":2}}", "{\"user\":{\"id\":1},\"meta\":[]}",
      "{\"user\":{\"id\":1,\"tags\":[1]}}", "{\"user\":{\"id\":1}", "{}"}},
    {"array bounds",
     "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
     {"[1]", "[1,2,3]", "[-1,0]"},
     {"[]", "[1,2,3,4]", "[1,\"a\"]", "[1,]", "[01]", "[1 2]", "[1,2", "1"}},
    {"enum and const",
     "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",null,7,0.5]},"
     "\"kind\":{\"const\":\"fixed\"}},"
     "\"required\":[\"color\",\"kind\"],\"additionalProperties\":false}",
     {"{\"color\":\"red\",\"kind\":\"fixed\"}", "{\"color\":null,\"kind\":\"fixed\"}",
      "{\"color\":7,\"kind\":\"fixed\"}", "{\"color\":0.5,\"kind\":\"fixed\"}"},
     {"{\"color\":\"blue\",\"kind\":\"fixed\"}", "{\"color\":\"red\",\"kind\":\"other\"}",
      "{\"color\":\"Red\",\"kind\":\"fixed\"}", "{\"color\":8,\"kind\":\"fixed\"}",
      "{\"color\":\"red\"}"}},
    {"typed enum", "{\"type\":\"string\",\"enum\":[\"a\",1,\"b\"]}", {"\"a\"", "\"b\""},
     {"1", "\"c\"", "a"}},
    {"anyOf",
     "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"integer\"},{\"type\":"
     "\"array\",\"items\":{\"type\":\"boolean\"}}],\"description\":\"d\"}",
     {"\"ab\"", "\"\"", "42", "[true,false]", "[]"},
     {"\"abc\"", "1.5", "[1]", "{}", "null"}},
    {"oneOf and allOf",
     "{\"oneOf\":[{\"allOf\":[{\"type\":\"boolean\"}]},{\"type\":\"null\"}]}",
     {"true", "false", "null"}, {"0", "\"true\""}},
    {"tree ($defs recursion)",
     "{\"$defs\":{\"Node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\"},"
     "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/Node\"}}},\"required\":["
     "\"value\",\"children\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/Node\"}",
     {"{\"value\":1,\"children\":[]}",
      "{\"value\":1,\"children\":[{\"value\":2,\"children\":[{\"value\":3,\"children\":[]}]},"
      "{\"value\":4,\"children\":[]}]}"},
     {"{\"value\":1}", "{\"value\":1,\"children\":[{\"value\":2}]}",
      "{\"value\":1,\"children\":[1]}", "{\"children\":[],\"value\":1}"}},
    {"list (# recursion, definitions, ~1)",
     "{\"definitions\":{\"a/b\":{\"type\":\"string\"}},\"type\":\"object\",\"properties\":{"
     "\"name\":{\"$ref\":\"#/definitions/a~1b\"},\"next\":{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":"
     "\"null\"}]}},\"required\":[\"name\",\"next\"],\"additionalProperties\":false}",
     {"{\"name\":\"a\",\"next\":null}", "{\"name\":\"a\",\"next\":{\"name\":\"b\",\"next\":null}}"},
     {"{\"name\":\"a\",\"next\":{\"name\":\"b\"}}", "{\"name\":1,\"next\":null}"}},
    {"additionalProperties schema",
     "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\"}},\"required\":[\"id\"],"
     "\"additionalProperties\":{\"type\":\"number\"}}",
     {"{\"id\":\"x\"}", "{\"id\":\"x\",\"a\":1,\"b\":2.5}"},
     {"{\"id\":\"x\",\"a\":\"s\"}", "{\"a\":1}", "{\"id\":\"x\",\"a\":1,}"}},
    {"map", "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
     {"{}", "{\"a\":1}", "{\"a\":1,\"\":2}"}, {"{\"a\":true}", "{\"a\"}", "[]"}},
    {"required, not listed",
     "{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\",\"z\"]}",
     {"{\"a\":1,\"z\":null}", "{\"a\":1,\"z\":[2],\"y\":3}"}, {"{\"a\":1}", "{\"z\":1}"}},
    {"type list", "{\"type\":[\"string\",\"integer\",\"null\"]}", {"\"x\"", "5", "null"},
     {"1.5", "true", "[]", "{}"}},
    {"nullable",
     "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"nullable\":true},\"e\":"
     "{\"enum\":[\"a\",\"b\"],\"nullable\":true},\"r\":{\"$ref\":\"#/$defs/s\",\"nullable\":true}"
     "},\"required\":[\"n\",\"e\",\"r\"],\"additionalProperties\":false,\"$defs\":{\"s\":{"
     "\"type\":\"string\"}}}",
     {"{\"n\":null,\"e\":null,\"r\":null}", "{\"n\":3,\"e\":\"a\",\"r\":\"s\"}"},
     {"{\"n\":\"3\",\"e\":\"a\",\"r\":null}", "{\"n\":1,\"e\":\"c\",\"r\":null}",
      "{\"n\":1,\"e\":\"a\",\"r\":1}"}},
    {"any (NULL)", NULL,
     {"{}", "[]", "\"s\"", "0", "-0.5e-7", "true", "false", "null",
      "{\"a\":[1,{\"b\":{\"c\":[[[]]]}}],\"d\":\"\\ud83d\\ude00\"}", "[1,\"2\",[3],{\"4\":5}]"},
     {"{\"a\":}", "[1,]", "tru", "\"abc", "01", "1.", ".5", "{\"a\" 1}", "'x'", "[1 2]",
      "\"\\x\"", "\"\\ud800\"", "\"\\u0000\"", "nul", "+1", "1e", "1e999", "NaN", "", "{}}",
      "\"a\x01\"", "\"\xff\""}},
    {"any ({})", "{}", {"{\"a\":1}", "[null]", "1e10"}, {"", "x", "{\"a\":1"}},
    {"any (true)", "true", {"{\"a\":1}", "\"x\""}, {"[", "]"}},
    {"json_object", "{\"type\":\"object\"}", {"{}", "{\"a\":1}", "{\"a\":{\"b\":[]}}"},
     {"[]", "\"x\"", "1", "{\"a\"}", "null"}},
    {"tuple",
     "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
     "\"items\":false,\"minItems\":1}",
     {"[\"a\"]", "[\"a\",1]"}, {"[]", "[1]", "[\"a\",1,2]", "[\"a\",\"b\"]"}},
    {"tuple then items",
     "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"}],\"items\":{\"type\":\"null\"},"
     "\"maxItems\":3}",
     {"[]", "[\"a\"]", "[\"a\",null,null]"}, {"[null]", "[\"a\",null,null,null]", "[\"a\",1]"}},
    {"string length", "{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}",
     {"\"ab\"", "\"abcd\"", "\"\xc3\xa9\xe2\x82\xacx\"", "\"\\u00e9\\n\"", "\"\\ud83d\\ude00x\""},
     {"\"a\"", "\"abcde\"", "\"\\ud83d\\ude00\"", "\"\xf0\x9f\x98\x80\"", "ab"}},
    {"formats",
     "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"t\":"
     "{\"format\":\"date-time\"},\"u\":{\"type\":\"string\",\"format\":\"uuid\"},\"h\":{\"type\":"
     "\"string\",\"format\":\"time\"},\"e\":{\"type\":\"string\",\"format\":\"email\"}},"
     "\"additionalProperties\":false}",
     {"{\"d\":\"2024-02-29\",\"t\":\"2023-12-31T23:59:59.123Z\",\"u\":\"123e4567-e89b-12d3-a456-"
      "426614174000\",\"h\":\"08:30:00+02:00\",\"e\":\"anything\"}",
      "{\"d\":\"2000-02-29\",\"t\":\"2023-01-01t00:00:00-05:30\"}", "{\"d\":\"2023-04-30\"}",
      "{\"d\":\"1996-12-31\"}"},
     {"{\"d\":\"2023-02-29\"}", "{\"d\":\"1900-02-29\"}", "{\"d\":\"2023-04-31\"}",
      "{\"d\":\"2023-13-01\"}", "{\"d\":\"2023-1-01\"}", "{\"t\":\"2023-01-01T00:00:00\"}",
      "{\"t\":\"2023-01-01 00:00:00Z\"}", "{\"h\":\"24:00:00Z\"}",
      "{\"u\":\"123e4567e89b12d3a456426614174000\"}",
      "{\"u\":\"123e4567-e89b-12d3-a456-42661417400g\"}"}},
    {"number", "{\"type\":\"number\",\"minimum\":0,\"multipleOf\":2}",
     {"0", "-1", "1.5", "1e10", "-0.25E-3", "1234567890123456", "3e+07"},
     {"01", "1.", ".5", "+1", "1e", "1e999", "12345678901234567", "NaN", "\"1\"", "0x1", "- 1"}},
    {"integer", "{\"type\":\"integer\",\"exclusiveMaximum\":3}", {"0", "-7", "99"},
     {"1.0", "1e2", "-", "--1", "-01"}},
    {"pattern",
     "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"pattern\":"
     "\"^[A-Z]{2}-\\\\d{3}$\"},\"q\":{\"type\":\"string\",\"pattern\":\"\\\"\"}},"
     "\"required\":[\"id\",\"q\"]}",
     {"{\"id\":\"AB-123\",\"q\":\"\\\"\"}", "{\"id\":\"ZZ-000\",\"q\":\"say \\\"hi\\\"\"}"},
     {"{\"id\":\"AB-12\",\"q\":\"\\\"\"}", "{\"id\":\"ab-123\",\"q\":\"\\\"\"}",
      "{\"id\":\"AB-123\",\"q\":\"hi\"}", "{\"id\":\"AB-1234\",\"q\":\"\\\"\"}"}},
    {"large counts",
     "{\"type\":\"array\",\"items\":{\"const\":0},\"minItems\":1001,\"maxItems\":2502}",
     {NULL}, {NULL}},
};

static const struct tcase COMPACT_CASES[] = {
    {"enum of structures",
     "{\"type\":\"object\",\"properties\":{\"pt\":{\"enum\":[{\"x\":1},[1,\"a\"]]}},"
     "\"required\":[\"pt\"]}",
     {"{\"pt\":{\"x\":1}}", "{\"pt\":[1,\"a\"]}", "{ \"pt\" : [1,\"a\"] }"},
     {"{\"pt\":{\"x\":2}}", "{\"pt\":{\"x\": 1}}", "{\"pt\":[1]}"}},
};

/* "[0,0,...]" of n zeros (with n = 0: "[]"); caller frees. */
static char *zeros(int n)
{
    char *s = malloc(2 * (size_t)n + 3), *o = s;
    *o++ = '[';
    for (int i = 0; i < n; i++)
        o += sprintf(o, i ? ",0" : "0");
    strcpy(o, "]");
    return s;
}

/* Counts past grammar.c's 1000 are written in chunks: check the edges. */
static void test_large_counts(void)
{
    json_t *s = json_loads(CASES[sizeof CASES / sizeof *CASES - 1].schema, 0, NULL);
    struct grammar *g = compile(s, "large counts");
    json_decref(s);
    if (g) {
        int ns[] = {0, 1, 1000, 1001, 1002, 1999, 2000, 2001, 2501, 2502, 2503};
        for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
            char *t = zeros(ns[i]);
            bool want = ns[i] >= 1001 && ns[i] <= 2502;
            CHECK(grammar_accepts(g, t, strlen(t)) == want, "large counts: %d items: %s", ns[i],
                  want ? "refused" : "accepted");
            free(t);
        }
        grammar_free(g);
    }
    s = json_loads("{\"type\":\"string\",\"minLength\":1500,\"maxLength\":3100}", 0, NULL);
    g = compile(s, "long string");
    json_decref(s);
    if (!g)
        return;
    char *t = malloc(3200);
    int ns[] = {1499, 1500, 1501, 2500, 3099, 3100, 3101};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        t[0] = '"';
        memset(t + 1, 'a', (size_t)ns[i]);
        t[ns[i] + 1] = '"';
        bool want = ns[i] >= 1500 && ns[i] <= 3100;
        CHECK(grammar_accepts(g, t, (size_t)ns[i] + 2) == want, "long string: %d chars: %s",
              ns[i], want ? "refused" : "accepted");
    }
    free(t);
    grammar_free(g);
}

static void test_refusals(void)
{
    static const struct {
        const char *schema, *want[3];
    } R[] = {
        {"{\"type\":\"string\",\"pattern\":\"a(?=b)\"}", {"pattern: ", "lookaround"}},
        {"{\"type\":\"string\",\"pattern\":\"^a+$\",\"maxLength\":3}",
         {"\"pattern\" with minLength/maxLength"}},
        {"{\"properties\":{\"age\":{\"not\":{\"type\":\"string\"}}}}",
         {"schema: properties.age: ", "unsupported keyword \"not\""}},
        {"{\"$ref\":\"#/x\"}", {"schema: ", "$ref \"#/x\"", "does not resolve"}},
        {"{\"items\":{\"$ref\":\"#/$defs/nope\"}}", {"items: ", "does not resolve"}},
        {"{\"$ref\":\"https://example.com/s.json\"}", {"$ref", "not supported"}},
        {"{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}", {"allOf"}},
        {"{\"type\":\"array\",\"uniqueItems\":true}", {"uniqueItems"}},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"$ref\":\"#\"}]}", {"anyOf[1]", "#"}},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":"
         "\"#/$defs/a\"}",
         {"$defs.b: ", "#/$defs/a"}},
        {"{\"type\":\"strin\"}", {"unknown type \"strin\""}},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", {"minItems", "maxItems"}},
        {"{\"type\":\"object\",\"required\":[\"x\"],\"additionalProperties\":false}",
         {"\"x\"", "additionalProperties"}},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"patternProperties\":"
         "{}}}}",
         {"properties.a: ", "patternProperties"}},
        {"{\"type\":\"string\",\"maxLength\":1000001}", {"maxLength"}},
        {"{\"type\":\"array\",\"maxItems\":1e300}", {"maxItems"}},
        {"{\"type\":\"string\",\"minLength\":1.5}", {"minLength", "integer"}},
        {"{\"type\":\"string\",\"enum\":[1,2]}", {"enum"}},
        {"{\"type\":\"object\",\"anyOf\":[{\"required\":[\"a\"]}]}", {"type", "anyOf"}},
        {"{\"prefixItems\":[{\"type\":\"integer\"}],\"items\":false,\"minItems\":2}",
         {"minItems"}},
        {"false", {"false"}},
        {"{\"oneOf\":[]}", {"oneOf"}},
        {"{\"if\":{},\"then\":{}}", {"unsupported keyword \"if\""}},
        {"{\"type\":\"object\",\"minProperties\":1}", {"minProperties"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"contains\":{}}}}",
         {"items.items: ", "contains"}},
    };
    for (size_t i = 0; i < sizeof R / sizeof *R; i++) {
        json_t *s = json_loads(R[i].schema, JSON_DECODE_ANY, NULL);
        CHECK(s, "refusal %zu: the test's schema does not parse", i);
        struct err e = {{0}};
        char *g = json_schema_gbnf(s, &e);
        CHECK(!g, "%s: converted, want a refusal:\n%s", R[i].schema, g ? g : "");
        CHECK(!strncmp(e.msg, "schema: ", 8), "%s: message [%s]", R[i].schema, e.msg);
        for (int k = 0; k < 3 && R[i].want[k]; k++)
            CHECK(strstr(e.msg, R[i].want[k]), "%s: message [%s] lacks [%s]", R[i].schema, e.msg,
                  R[i].want[k]);
        free(g);
        json_decref(s);
    }
    /* Too deep a schema is refused, not walked until the stack runs out. */
    char deep[2048] = "";
    for (int i = 0; i < 100; i++)
        strcat(deep, "{\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 100; i++)
        strcat(deep, "}");
    json_t *d = json_loads(deep, 0, NULL);
    struct err e = {{0}};
    char *text = json_schema_gbnf(d, &e);
    CHECK(!text && strstr(e.msg, "deeper"), "a 100-deep schema: [%s]", e.msg);
    free(text);
    json_decref(d);
    /* Each schema is written once: nested objects whose unlisted required key
     * and extra members share additionalProperties stay linear in size. */
    char nest[4096] = "";
    for (int i = 0; i < 40; i++)
        strcat(nest, "{\"type\":\"object\",\"required\":[\"k\"],\"additionalProperties\":");
    strcat(nest, "{\"type\":\"integer\"}");
    for (int i = 0; i < 40; i++)
        strcat(nest, "}");
    d = json_loads(nest, 0, NULL);
    text = json_schema_gbnf(d, &e);
    CHECK(text && strlen(text) < 20000, "40 nested maps: %s (%zu bytes)", text ? "" : e.msg,
          text ? strlen(text) : 0);
    free(text);
    json_decref(d);

    /* Annotations and unknown formats are accepted and ignored. */
    json_t *s = json_loads("{\"title\":\"t\",\"description\":\"d\",\"$schema\":\"x\",\"$id\":\"i\","
                           "\"examples\":[1],\"default\":1,\"deprecated\":false,\"readOnly\":true,"
                           "\"writeOnly\":false,\"$comment\":\"c\",\"strict\":true,\"type\":"
                           "\"string\",\"format\":\"hostname\"}",
                           0, NULL);
    struct grammar *g = compile(s, "annotations");
    json_decref(s);
    CHECK(g && grammar_accepts(g, "\"x y\"", 5), "annotations: a plain string refused");
    grammar_free(g);
}

/* ---- property test */

struct rng {
    uint64_t s;
};

static uint64_t next(struct rng *r) /* xorshift64* */
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 2685821657736338717ull;
}

static long pick(struct rng *r, long n) { return n > 0 ? (long)(next(r) % (uint64_t)n) : 0; }

static const json_t *deref(const json_t *root, const json_t *s)
{
    const char *ref = json_string_value(json_object_get(s, "$ref"));
    if (!ref)
        return s;
    if (!strcmp(ref, "#"))
        return root;
    return json_object_get(json_object_get(root, "$defs"), ref + strlen("#/$defs/"));
}

static size_t utf8_len(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static json_t *random_any(struct rng *r, int depth)
{
    switch (pick(r, depth > 2 ? 4 : 6)) {
    case 0: return json_integer(pick(r, 2001) - 1000);
    case 1: return json_real((double)(pick(r, 20001) - 10000) / 8);
    case 2: return json_string(pick(r, 2) ? "x" : "\xc3\xa9\"\\\n");
    case 3: return pick(r, 3) ? json_boolean(pick(r, 2)) : json_null();
    case 4: {
        json_t *a = json_array();
        for (long i = pick(r, 3); i > 0; i--)
            json_array_append_new(a, random_any(r, depth + 1));
        return a;
    }
    default: {
        json_t *o = json_object();
        for (long i = pick(r, 3); i > 0; i--) {
            char k[16];
            snprintf(k, sizeof k, "k%ld", pick(r, 5));
            json_object_set_new(o, k, random_any(r, depth + 1));
        }
        return o;
    }
    }
}

static const char *const PIECES[] = {"a", "Z", " ", "\"", "\\", "\n", "\t", "\x01", "/",
                                     "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "0", "{"};

/* A random value valid under s (the subset the property schemas use). */
static json_t *random_valid(struct rng *r, const json_t *root, const json_t *s, int depth)
{
    s = deref(root, s);
    if (json_is_true(json_object_get(s, "nullable")) && !pick(r, 4))
        return json_null();
    const json_t *v;
    if ((v = json_object_get(s, "anyOf")))
        return random_valid(r, root, json_array_get(v, (size_t)pick(r, (long)json_array_size(v))),
                            depth);
    if ((v = json_object_get(s, "enum")))
        return json_deep_copy(json_array_get(v, (size_t)pick(r, (long)json_array_size(v))));
    if ((v = json_object_get(s, "const")))
        return json_deep_copy(v);
    const json_t *ty = json_object_get(s, "type");
    if (json_is_array(ty))
        ty = json_array_get(ty, (size_t)pick(r, (long)json_array_size(ty)));
    const char *t = json_string_value(ty);
    if (!t)
        return random_any(r, depth);
    if (!strcmp(t, "integer"))
        return json_integer(pick(r, 2000001) - 1000000);
    if (!strcmp(t, "number"))
        return pick(r, 2) ? json_integer(pick(r, 100) - 50)
                          : json_real((double)(pick(r, 2000001) - 1000000) / 64);
    if (!strcmp(t, "boolean"))
        return json_boolean(pick(r, 2));
    if (!strcmp(t, "null"))
        return json_null();
    if (!strcmp(t, "string")) {
        long lo = json_integer_value(json_object_get(s, "minLength"));
        const json_t *mx = json_object_get(s, "maxLength");
        long hi = mx ? json_integer_value(mx) : lo + 8;
        long n = lo + pick(r, hi - lo + 1);
        char buf[256] = "";
        for (long i = 0; i < n; i++)
            strcat(buf, PIECES[pick(r, sizeof PIECES / sizeof *PIECES)]);
        return json_string(buf);
    }
    if (!strcmp(t, "array")) {
        long lo = json_integer_value(json_object_get(s, "minItems"));
        const json_t *mx = json_object_get(s, "maxItems");
        long hi = mx ? json_integer_value(mx) : lo + 3;
        long n = depth > 3 ? lo : lo + pick(r, hi - lo + 1);
        json_t *a = json_array();
        const json_t *items = json_object_get(s, "items");
        for (long i = 0; i < n; i++)
            json_array_append_new(a, items ? random_valid(r, root, items, depth + 1)
                                           : random_any(r, depth + 1));
        return a;
    }
    json_t *o = json_object(); /* object */
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const char *key;
    json_object_foreach((json_t *)props, key, v) {
        bool must = false;
        for (size_t i = 0; i < json_array_size(req); i++)
            must |= !strcmp(json_string_value(json_array_get(req, i)), key);
        if (must || (depth < 4 && pick(r, 2)))
            json_object_set_new(o, key, random_valid(r, root, v, depth + 1));
    }
    const json_t *add = json_object_get(s, "additionalProperties");
    if (!json_is_false(add) && depth < 3) /* extra keys: "x_" names no schema lists */
        for (long i = pick(r, 3); i > 0; i--) {
            char k[16];
            snprintf(k, sizeof k, "x_%ld", pick(r, 100));
            json_object_set_new(o, k, json_is_object(add) ? random_valid(r, root, add, depth + 1)
                                                          : random_any(r, depth + 1));
        }
    return o;
}

/* Whether v is valid under s (the same subset). */
static bool valid(const json_t *root, const json_t *s, const json_t *v)
{
    s = deref(root, s);
    if (json_is_true(s) || (json_is_null(v) && json_is_true(json_object_get(s, "nullable"))))
        return true;
    const json_t *x;
    if ((x = json_object_get(s, "anyOf"))) {
        for (size_t i = 0; i < json_array_size(x); i++)
            if (valid(root, json_array_get(x, i), v))
                return true;
        return false;
    }
    if ((x = json_object_get(s, "enum"))) {
        for (size_t i = 0; i < json_array_size(x); i++)
            if (json_equal(json_array_get(x, i), (json_t *)v))
                return true;
        return false;
    }
    if ((x = json_object_get(s, "const")))
        return json_equal((json_t *)x, (json_t *)v);
    const json_t *ty = json_object_get(s, "type");
    if (json_is_array(ty)) {
        for (size_t i = 0; i < json_array_size(ty); i++) {
            json_t *one = json_deep_copy(s);
            json_object_set(one, "type", json_array_get(ty, i));
            bool ok = valid(root, one, v);
            json_decref(one);
            if (ok)
                return true;
        }
        return false;
    }
    const char *t = json_string_value(ty);
    if (!t)
        return true;
    if (!strcmp(t, "integer"))
        return json_is_integer(v);
    if (!strcmp(t, "number"))
        return json_is_number(v);
    if (!strcmp(t, "boolean"))
        return json_is_boolean(v);
    if (!strcmp(t, "null"))
        return json_is_null(v);
    if (!strcmp(t, "string")) {
        if (!json_is_string(v))
            return false;
        size_t n = utf8_len(json_string_value(v));
        const json_t *lo = json_object_get(s, "minLength"), *hi = json_object_get(s, "maxLength");
        return (!lo || n >= (size_t)json_integer_value(lo)) &&
               (!hi || n <= (size_t)json_integer_value(hi));
    }
    if (!strcmp(t, "array")) {
        if (!json_is_array(v))
            return false;
        size_t n = json_array_size(v);
        const json_t *lo = json_object_get(s, "minItems"), *hi = json_object_get(s, "maxItems");
        if (lo && n < (size_t)json_integer_value(lo))
            return false;
        if (hi && n > (size_t)json_integer_value(hi))
            return false;
        const json_t *items = json_object_get(s, "items");
        for (size_t i = 0; items && i < n; i++)
            if (!valid(root, items, json_array_get(v, i)))
                return false;
        return true;
    }
    if (!json_is_object(v))
        return false;
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    for (size_t i = 0; i < json_array_size(req); i++)
        if (!json_object_get(v, json_string_value(json_array_get(req, i))))
            return false;
    const json_t *add = json_object_get(s, "additionalProperties");
    const char *key;
    json_object_foreach((json_t *)v, key, x) {
        const json_t *ps = json_object_get(props, key);
        if (ps ? !valid(root, ps, x) : json_is_false(add) || (add && !valid(root, add, x)))
            return false;
    }
    return true;
}

static const char *const PROP_SCHEMAS[] = {
    FLAT,
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"name\":{\"type\":"
    "\"string\",\"minLength\":1,\"maxLength\":6},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":"
    "[\"a\",\"b\",3,null]},\"minItems\":1,\"maxItems\":4},\"score\":{\"type\":\"number\"}},"
    "\"required\":[\"name\",\"tags\"],\"additionalProperties\":{\"type\":\"boolean\"}}",
    "{\"$defs\":{\"Node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":[\"integer\","
    "\"string\"]},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/Node\"}}},"
    "\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/Node\"}",
    "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":"
    "\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"nullable\":true},\"b\":{\"const\":"
    "\"k\"}},\"additionalProperties\":false},{\"type\":\"null\"}]},\"maxItems\":5}",
    "{}",
};

static const char MUT_BYTES[] = "{}[],:\" \\0123456789-+.eEtrufalsn\n\x01\x80\xc3\xa9";

static void test_property(void)
{
    struct rng r = {0x9E3779B97F4A7C15ull};
    int n_accepted_mutants = 0, n_mutants = 0;
    for (size_t si = 0; si < sizeof PROP_SCHEMAS / sizeof *PROP_SCHEMAS; si++) {
        json_t *schema = json_loads(PROP_SCHEMAS[si], 0, NULL);
        CHECK(schema, "property schema %zu does not parse", si);
        struct grammar *g = compile(schema, PROP_SCHEMAS[si]);
        if (!g) {
            json_decref(schema);
            continue;
        }
        int bad = 0;
        for (int it = 0; it < 300 && bad < 5; it++) {
            json_t *v = random_valid(&r, schema, schema, 0);
            if (!valid(schema, schema, v)) {
                CHECK(0, "the generator made an invalid value for schema %zu", si);
                bad++;
            }
            /* compact; ", " and ": "; indented (the depth keeps it within
             * the blanks' bound); surrogate-pair escapes */
            const size_t flags[] = {JSON_COMPACT, 0, JSON_INDENT(2),
                                    JSON_COMPACT | JSON_ENSURE_ASCII};
            for (size_t f = 0; f < sizeof flags / sizeof *flags; f++) {
                char *text = json_dumps(v, flags[f] | JSON_ENCODE_ANY);
                bool ok = grammar_accepts(g, text, strlen(text));
                CHECK(ok, "schema %zu refuses the valid %s", si, text);
                bad += !ok;
                free(text);
            }
            char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            size_t n = strlen(text);
            char *m = malloc(n + 2);
            for (int k = 0; k < 10; k++) {
                size_t at = (size_t)pick(&r, (long)n + 1), mn;
                if (pick(&r, 2) && at < n) { /* delete a byte */
                    memcpy(m, text, at);
                    memcpy(m + at, text + at + 1, n - at - 1);
                    mn = n - 1;
                } else { /* insert one */
                    char b = pick(&r, 4) ? MUT_BYTES[pick(&r, sizeof MUT_BYTES - 1)]
                                         : (char)pick(&r, 256);
                    memcpy(m, text, at);
                    m[at] = b;
                    memcpy(m + at + 1, text + at, n - at);
                    mn = n + 1;
                }
                n_mutants++;
                if (!grammar_accepts(g, m, mn))
                    continue;
                n_accepted_mutants++;
                json_error_t je;
                json_t *back = json_loadb(m, mn, JSON_DECODE_ANY, &je);
                CHECK(back, "schema %zu accepts [%.*s], which jansson refuses: %s", si, (int)mn, m,
                      je.text);
                CHECK(!back || valid(schema, schema, back),
                      "schema %zu accepts [%.*s], which is not valid under it", si, (int)mn, m);
                bad += !back;
                json_decref(back);
            }
            free(m);
            free(text);
            json_decref(v);
        }
        grammar_free(g);
        json_decref(schema);
    }
    CHECK(n_accepted_mutants > 0, "no mutant was accepted: the mutation test tests nothing");
    printf("property: %d mutants, %d accepted (each parsed and valid)\n", n_mutants,
           n_accepted_mutants);
}

int main(void)
{
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++)
        if (CASES[i].good[0] || CASES[i].bad[0])
            run_case(&CASES[i], true);
    run_case(&COMPACT_CASES[0], false);
    test_large_counts();
    test_refusals();
    test_property();
    return test_summary("test_json_schema");
}
