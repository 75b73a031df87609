/* test_tokenizer_vectors.c - every case of llama.cpp's HF-generated
 * tokenizer vectors (shared/testdata/tokenizer-vectors): the vocab-only
 * GGUFs through tok_load_gguf_file and tok_load_for_model, and the three
 * families without a GGUF through the real tokenizer.json that reproduces
 * them (llama-bpe: llama3_1, qwen2: qwen3, gemma-4: gemma3). Decoding the
 * ids must give the text back wherever the tokenizer is lossless. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "tokenizer/tokenizer.h"

#define SHARED CLLM_SHARED_DIR
#define VEC SHARED "/testdata/tokenizer-vectors/ggml-vocab-"

struct vectors {
    char *inp, *out;
    char **tests, **lines;
    int n;
};

static void free_vectors(struct vectors *v)
{
    free(v->inp);
    free(v->out);
    free(v->tests);
    free(v->lines);
    memset(v, 0, sizeof *v);
}

/* Splits <base>.inp on the separator (never trimming) and <base>.out on
 * newlines, as llama.cpp's test-tokenizer-0 does. */
static bool load_vectors(struct vectors *v, const char *base)
{
    static const char SEP[] = "\n__ggml_vocab_test__\n";
    char p[1024];
    size_t len;
    memset(v, 0, sizeof *v);
    snprintf(p, sizeof p, "%s.inp", base);
    v->inp = test_read_file(p, &len);
    snprintf(p, sizeof p, "%s.out", base);
    v->out = test_read_file(p, NULL);
    if (!v->inp || !v->out)
        return false;
    v->tests = malloc(sizeof(char *) * (len / 21 + 2));
    for (size_t pos = 0; pos < len;) {
        char *next = strstr(v->inp + pos, SEP);
        v->tests[v->n++] = v->inp + pos;
        if (!next)
            break;
        *next = 0;
        pos = (size_t)(next - v->inp) + strlen(SEP);
    }
    v->lines = calloc((size_t)v->n + 1, sizeof(char *));
    char *s = v->out;
    for (int i = 0; i < v->n && s; i++) {
        v->lines[i] = s;
        char *nl = strchr(s, '\n');
        if (nl)
            *nl = 0;
        s = nl ? nl + 1 : NULL;
    }
    return true;
}

static int parse_ids(const char *s, int *ids, int cap)
{
    int n = 0;
    while (s && *s && n < cap) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s)
            break;
        ids[n++] = (int)x;
        s = end;
    }
    return n;
}

static void ids_str(const int *ids, int n, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < n && k + 16 < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? " " : "", ids[i]);
}

/* A case left out, with the reason (also listed in docs/tokenizers.md). */
struct excluded {
    const char *name;
    int index;
    const char *why;
};
static const struct excluded EXCLUDED[] = {
    {NULL, 0, NULL},
};

static const char *excluded_why(const char *name, int i)
{
    for (const struct excluded *x = EXCLUDED; x->name; x++)
        if (strcmp(x->name, name) == 0 && x->index == i)
            return x->why;
    return NULL;
}

static int total_pass, total_cases, total_excluded;

/* Encodes every case without special tokens; with round_trip, decoding
 * the ids must give the text back. */
static void run_file(const struct tokenizer *t, const char *name, const char *base,
                     bool round_trip)
{
    struct vectors v;
    if (!load_vectors(&v, base)) {
        CHECK(0, "%s: cannot read %s.inp/.out", name, base);
        free_vectors(&v);
        return;
    }
    CHECK(v.n == 46, "%s: %d cases (expected 46)", name, v.n);
    int pass = 0, excl = 0;
    for (int i = 0; i < v.n; i++) {
        const char *why = excluded_why(name, i);
        if (why) {
            excl++;
            continue;
        }
        int want[1024];
        int nw = parse_ids(v.lines[i], want, 1024);
        struct err e = {{0}};
        int *ids = NULL;
        int n = tok_encode(t, v.tests[i], strlen(v.tests[i]), false, &ids, &e);
        bool ok = n == nw && (n == 0 || memcmp(ids, want, (size_t)n * sizeof *ids) == 0);
        if (!ok) {
            char got_s[4096], want_s[4096];
            ids_str(ids, n, got_s, sizeof got_s);
            ids_str(want, nw, want_s, sizeof want_s);
            CHECK(ok, "%s #%d \"%.60s\": got [%s] want [%s] %s", name, i, v.tests[i], got_s,
                  want_s, n < 0 ? e.msg : "");
        } else {
            test_passed++;
            pass++;
        }
        if (round_trip && n >= 0) {
            char *s = tok_decode(t, ids, n, false, &e);
            CHECK(s && strcmp(s, v.tests[i]) == 0, "%s #%d: decode gives \"%s\" for \"%s\"", name,
                  i, s ? s : e.msg, v.tests[i]);
            free(s);
        }
        free(ids);
    }
    printf("%-16s %2d/%2d vectors pass, %d excluded\n", name, pass, v.n - excl, excl);
    total_pass += pass;
    total_cases += v.n - excl;
    total_excluded += excl;
    free_vectors(&v);
}

static void gguf_family(const char *name, bool round_trip)
{
    char path[512];
    snprintf(path, sizeof path, VEC "%s.gguf", name);
    struct err e = {{0}};
    struct tokenizer *t = tok_load_gguf_file(path, &e);
    CHECK(t != NULL, "%s: %s", name, e.msg);
    if (t)
        run_file(t, name, path, round_trip);
    tok_free(t);
    /* the same file as a model path */
    t = tok_load_for_model(path, &e);
    CHECK(t != NULL, "tok_load_for_model(%s): %s", path, e.msg);
    tok_free(t);
}

static void json_family(const char *name, const char *dir, bool round_trip)
{
    char path[512], base[512];
    snprintf(path, sizeof path, SHARED "/tokenizers/%s/tokenizer.json", dir);
    snprintf(base, sizeof base, VEC "%s.gguf", name);
    if (access(path, R_OK) != 0) {
        printf("%s missing: %s skipped\n", path, name);
        return;
    }
    struct err e = {{0}};
    struct tokenizer *t = tok_load_hf_json(path, &e);
    CHECK(t != NULL, "%s: %s", dir, e.msg);
    if (t)
        run_file(t, name, base, round_trip);
    tok_free(t);
}

int main(void)
{
    /* byte-level BPE: decoding is lossless */
    static const char *const bpe[] = {"gpt-2",   "deepseek-llm", "deepseek-coder", "falcon",
                                      "mpt",     "starcoder",    "refact"};
    for (size_t i = 0; i < sizeof bpe / sizeof bpe[0]; i++)
        gguf_family(bpe[i], true);
    gguf_family("llama-spm", true);
    gguf_family("phi-3", true);
    gguf_family("bert-bge", false); /* lowercases and drops accents: not lossless */
    json_family("llama-bpe", "llama3_1", true);
    json_family("qwen2", "qwen3", true);
    json_family("gemma-4", "gemma3", true);
    printf("all vectors: %d/%d pass, %d excluded\n", total_pass, total_cases, total_excluded);
    return test_summary("test_tokenizer_vectors");
}
