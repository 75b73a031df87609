/* test_tokenizer_cases.c - tokenizers against the ids and texts Hugging
 * Face `tokenizers` produced for them: the real tokenizers in
 * shared/tokenizers (tests/fixtures/tokenizers/<name>/encode_cases.json,
 * made by tests/fixtures/gen_tokenizer_cases.py) and variants that exercise
 * the tokenizer.json components those do not use
 * (tests/fixtures/tokenizers/components.json, made by
 * gen_component_cases.py). Each case: encode with and without special
 * tokens, the pieces, decode with and without skip_special; streaming
 * decode of the same ids must equal whole decode, chunk by chunk whole
 * UTF-8 characters. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#define SHARED CLLM_SHARED_DIR
#define FIX CLLM_FIXTURES_DIR

static void ids_str(const int *ids, int n, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < n && k + 16 < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? " " : "", ids[i]);
}

static bool check_ids(const struct tokenizer *t, const char *what, const char *name,
                      const char *text, size_t len, bool special, json_t *want_arr)
{
    int nw;
    int *want = test_json_ids(want_arr, &nw);
    struct err e = {{0}};
    int *ids = NULL;
    int n = tok_encode(t, text, len, special, &ids, &e);
    bool ok = n == nw && (n == 0 || memcmp(ids, want, (size_t)n * sizeof *ids) == 0);
    if (!ok) {
        char g[2048], w[2048];
        ids_str(ids, n, g, sizeof g);
        ids_str(want, nw, w, sizeof w);
        CHECK(ok, "%s %s (special=%d): got [%s] want [%s] %s", what, name, special, g, w,
              n < 0 ? e.msg : "");
    } else {
        test_passed++;
    }
    free(ids);
    free(want);
    return ok;
}

/* Streams ids through a detok: the concatenation must equal `whole` and
 * every chunk must be complete UTF-8 (no partial character). */
static void check_stream(const struct tokenizer *t, const int *ids, int n, bool skip,
                         const char *whole, const char *what, const char *name)
{
    struct detok d;
    detok_init(&d, t, skip);
    size_t cap = detok_max_bytes(t);
    char *chunk = malloc(cap);
    size_t total = 0;
    char *all = malloc(strlen(whole) * 3 + 64);
    bool chunks_ok = true;
    for (int i = 0; i <= n; i++) {
        size_t k = i < n ? detok_feed(&d, ids[i], chunk, cap) : detok_flush(&d, chunk, cap);
        /* a chunk never ends inside a character */
        if (k > 0) {
            unsigned char last = (unsigned char)chunk[k - 1];
            if (last >= 0xC0)
                chunks_ok = false;
        }
        if (total + k < strlen(whole) * 3 + 64) {
            memcpy(all + total, chunk, k);
            total += k;
        }
    }
    all[total] = 0;
    CHECK(chunks_ok, "%s %s: a streamed chunk ends inside a character", what, name);
    CHECK(strcmp(all, whole) == 0, "%s %s: streamed \"%s\" != decoded \"%s\"", what, name, all,
          whole);
    free(all);
    free(chunk);
}

/* Every case of a list; returns how many passed entirely. */
static int run_cases(const struct tokenizer *t, json_t *root, const char *dir)
{
    struct err e = {{0}};
    int n_ok = 0;
    size_t i;
    json_t *c;
    json_array_foreach(root, i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        char idx[32];
        if (!name) {
            snprintf(idx, sizeof idx, "case %zu", i);
            name = idx;
        }
        json_t *jt = json_object_get(c, "text");
        const char *text = json_string_value(jt);
        size_t len = json_string_length(jt);
        int before = test_failed;
        check_ids(t, dir, name, text, len, false, json_object_get(c, "ids"));
        check_ids(t, dir, name, text, len, true, json_object_get(c, "ids_special"));
        /* the pieces of the ids */
        json_t *toks = json_object_get(c, "tokens");
        int nid;
        int *ids = test_json_ids(json_object_get(c, "ids"), &nid);
        for (int k = 0; k < nid && k < (int)json_array_size(toks); k++) {
            const char *want = json_string_value(json_array_get(toks, (size_t)k));
            const char *got = tok_piece(t, ids[k]);
            /* an added token with lstrip/rstrip shows the spaces it took in
             * HF's tokens; its piece is the token itself */
            size_t wl = want ? strlen(want) : 0, skip = 0;
            while (want && skip < wl && strchr(" \t\n", want[skip]))
                skip++;
            while (want && wl > skip && strchr(" \t\n", want[wl - 1]))
                wl--;
            bool same = got && want &&
                        (strcmp(got, want) == 0 ||
                         (strlen(got) == wl - skip && memcmp(got, want + skip, wl - skip) == 0));
            CHECK(same, "%s %s: piece of %d is \"%s\", want \"%s\"", dir, name, ids[k],
                  got ? got : "(null)", want ? want : "");
        }
        free(ids);
        /* decode the special ids both ways, whole and streamed */
        ids = test_json_ids(json_object_get(c, "ids_special"), &nid);
        for (int skip = 0; skip < 2; skip++) {
            const char *want =
                json_string_value(json_object_get(c, skip ? "decoded_skip_special" : "decoded"));
            char *got = tok_decode(t, ids, nid, skip, &e);
            CHECK(got && want && strcmp(got, want) == 0,
                  "%s %s: decode(skip_special=%d) \"%s\" want \"%s\"", dir, name, skip,
                  got ? got : e.msg, want ? want : "");
            if (got)
                check_stream(t, ids, nid, skip, got, dir, name);
            free(got);
        }
        free(ids);
        n_ok += test_failed == before;
    }
    return n_ok;
}

static void run_tokenizer(const char *dir)
{
    char path[512], cases[512];
    snprintf(path, sizeof path, SHARED "/tokenizers/%s/tokenizer.json", dir);
    snprintf(cases, sizeof cases, FIX "/tokenizers/%s/encode_cases.json", dir);
    if (access(path, R_OK) != 0 || access(cases, R_OK) != 0) {
        printf("%s: tokenizer or cases missing, skipped\n", dir);
        return;
    }
    struct err e = {{0}};
    struct tokenizer *t = tok_load_hf_json(path, &e);
    CHECK(t != NULL, "%s: %s", dir, e.msg);
    json_error_t je;
    json_t *root = json_load_file(cases, 0, &je);
    CHECK(root && json_is_array(root), "%s: %s", cases, root ? "not a list" : je.text);
    if (!t || !root) {
        tok_free(t);
        json_decref(root);
        return;
    }
    int n_ok = run_cases(t, root, dir), n_cases = (int)json_array_size(root);
    printf("%-9s %3d/%3d HF cases pass (encode both ways, pieces, decode both ways)\n", dir, n_ok,
           n_cases);
    json_decref(root);
    tok_free(t);
}

/* components.json: each variant is a real tokenizer.json with some keys
 * replaced, or a whole small tokenizer. */
static void run_components(void)
{
    json_error_t je;
    json_t *all = json_load_file(FIX "/tokenizers/components.json", 0, &je);
    if (!all) {
        printf("components.json missing: skipped\n");
        return;
    }
    json_t *bases[2] = {NULL, NULL};
    static const char *const base_names[2] = {"qwen3", "mistral"};
    int variants = 0, clean = 0;
    size_t i;
    json_t *v;
    json_array_foreach(all, i, v)
    {
        const char *name = json_string_value(json_object_get(v, "name"));
        const char *base = json_string_value(json_object_get(v, "base"));
        json_t *root = NULL;
        json_t *saved[8] = {NULL};
        const char *keys[8];
        int nsaved = 0, b = -1;
        if (base) {
            b = strcmp(base, "qwen3") == 0 ? 0 : 1;
            if (!bases[b]) {
                char p[512];
                snprintf(p, sizeof p, SHARED "/tokenizers/%s/tokenizer.json", base_names[b]);
                bases[b] = json_load_file(p, JSON_ALLOW_NUL, &je);
            }
            root = bases[b];
            if (!root) {
                printf("%s: base %s missing, skipped\n", name, base);
                continue;
            }
            /* replace the patched keys, remember the originals */
            const char *key;
            json_t *val;
            json_object_foreach(json_object_get(v, "patch"), key, val)
            {
                if (nsaved == 8)
                    break;
                keys[nsaved] = key;
                saved[nsaved] = json_incref(json_object_get(root, key));
                nsaved++;
                json_object_set(root, key, val);
            }
        } else {
            root = json_object_get(v, "tokenizer");
        }
        struct err e = {{0}};
        struct tok_hf_src src = {.root = root, .bos = -1, .eos = -1};
        struct tokenizer *t = tok_load_hf_src(&src, name, &e);
        CHECK(t != NULL, "component %s: %s", name, e.msg);
        if (t) {
            json_t *cases = json_object_get(v, "cases");
            int ok = run_cases(t, cases, name);
            variants++;
            clean += ok == (int)json_array_size(cases);
            if (ok != (int)json_array_size(cases))
                printf("component %-34s %2d/%2zu cases pass\n", name, ok, json_array_size(cases));
        }
        tok_free(t);
        for (int k = 0; k < nsaved; k++) {
            if (saved[k])
                json_object_set_new(root, keys[k], saved[k]);
            else
                json_object_del(root, keys[k]);
        }
    }
    printf("components: %d/%d variants pass every case\n", clean, variants);
    json_decref(bases[0]);
    json_decref(bases[1]);
    json_decref(all);
}

int main(void)
{
    static const char *const dirs[] = {"qwen3", "llama3_1", "gemma3", "mistral"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
        run_tokenizer(dirs[i]);
    run_components();
    return test_summary("test_tokenizer_cases");
}
