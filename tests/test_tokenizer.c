/* test_tokenizer.c - the tokenizer against known ids: llama2.c stories260K
 * and TinyStories-656K expected_greedy.json (encode and decode), Mistral's
 * tokenizer.json (hand-checked ids), llama.cpp's HF-generated vectors for
 * the Llama-2 SPM vocab (GGUF metadata read here) and for Gemma's
 * tokenizer.json, the streaming detokenizer on partial UTF-8, error
 * messages, and encode speed on 1 MB of text. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pthread.h>

#include "base/clock.h"
#include "model/gguf.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

#define SHARED CLLM_SHARED_DIR


static bool file_exists(const char *p)
{
    return access(p, R_OK) == 0;
}

static void ids_str(const int *ids, int n, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < n && k + 16 < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? " " : "", ids[i]);
    if (n > 0 && k + 16 >= cap)
        snprintf(buf + k, cap - k, " ...");
}

static bool ids_equal(const int *a, int na, const int *b, int nb)
{
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

/* Encodes text and compares with want; prints both on mismatch. */
static void check_encode(const struct tokenizer *t, const char *what, const char *text,
                         bool add_special, const int *want, int nwant)
{
    struct err e = {{0}};
    int *ids = NULL;
    int n = tok_encode(t, text, strlen(text), add_special, &ids, &e);
    char got_s[2048], want_s[2048];
    ids_str(ids, n, got_s, sizeof got_s);
    ids_str(want, nwant, want_s, sizeof want_s);
    CHECK(n >= 0 && ids_equal(ids, n, want, nwant), "%s: encode \"%s\": got [%s] want [%s] %s",
          what, text, got_s, want_s, n < 0 ? e.msg : "");
    free(ids);
}

/* True when s[0, n) is valid UTF-8 (no overlongs, surrogates, > U+10FFFF). */
static bool valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            k = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 3;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 4;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else {
            return false;
        }
        if (i + k > n || s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (size_t j = 2; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
        i += k;
    }
    return true;
}

/* Streams ids through a detok; checks every chunk is valid UTF-8 and
 * returns the concatenation (caller frees). */
static char *stream_decode(const struct tokenizer *t, const int *ids, int n, bool skip,
                           int *bad_chunks)
{
    struct detok d;
    detok_init(&d, t, skip);
    size_t cap = detok_max_bytes(t);
    char *chunk = malloc(cap);
    size_t total = 0, tcap = 256;
    char *all = malloc(tcap);
    *bad_chunks = 0;
    for (int i = 0; i <= n; i++) {
        size_t k = i < n ? detok_feed(&d, ids[i], chunk, cap) : detok_flush(&d, chunk, cap);
        if (!valid_utf8((unsigned char *)chunk, k) || strlen(chunk) != k)
            (*bad_chunks)++;
        while (total + k + 1 > tcap)
            tcap *= 2;
        all = realloc(all, tcap);
        memcpy(all + total, chunk, k);
        total += k;
    }
    all[total] = 0;
    free(chunk);
    return all;
}

/* ---- expected_greedy.json cases ---- */

static void check_greedy_cases(const struct tokenizer *t, const char *json_path, const char *what)
{
    json_t *root = test_json_load(json_path);
    if (!root)
        return;
    size_t i;
    json_t *c;
    int ncases = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        const char *text = json_string_value(json_object_get(c, "text"));
        int np, ng;
        int *pids = test_json_ids(json_object_get(c, "prompt_ids"), &np);
        int *gids = test_json_ids(json_object_get(c, "generated_ids"), &ng);
        char label[256];
        snprintf(label, sizeof label, "%s/%s", what, name);
        check_encode(t, label, prompt, true, pids, np);

        /* The text covers the prompt and the generation. In stories260K's
         * zoo case generated_ids already repeats the forced prompt tokens
         * after BOS (see its "note"); then only BOS comes from prompt_ids. */
        int keep = np;
        if (np >= 1 && ng >= np - 1 && memcmp(gids, pids + 1, (size_t)(np - 1) * sizeof(int)) == 0 &&
            json_object_get(c, "note"))
            keep = 1;
        int n = keep + ng;
        int *all = malloc((size_t)n * sizeof *all);
        memcpy(all, pids, (size_t)keep * sizeof *all);
        memcpy(all + keep, gids, (size_t)ng * sizeof *all);
        struct err e = {{0}};
        char *dec = tok_decode(t, all, n, true, &e);
        CHECK(dec && strcmp(dec, text) == 0, "%s: decode:\n got  \"%s\"\n want \"%s\"", label,
              dec ? dec : e.msg, text);
        int bad;
        char *streamed = stream_decode(t, all, n, true, &bad);
        CHECK(strcmp(streamed, text) == 0 && bad == 0, "%s: streamed decode differs (%d bad chunks)",
              label, bad);
        free(streamed);
        free(dec);
        free(all);
        free(pids);
        free(gids);
        ncases++;
    }
    CHECK(ncases >= 1, "%s: no cases in %s", what, json_path);
    json_decref(root);
}

static void test_stories260k(void)
{
    struct err e = {{0}};
    struct tokenizer *t = tok_load_for_model(SHARED "/models/stories260K", &e);
    CHECK(t != NULL, "stories260K dir: %s", e.msg);
    if (!t)
        return;
    CHECK(tok_vocab_size(t) == 512, "vocab %d", tok_vocab_size(t));
    CHECK(tok_bos_id(t) == 1 && tok_eos_id(t) == 2, "bos %d eos %d", tok_bos_id(t), tok_eos_id(t));
    CHECK(strcmp(tok_piece(t, 1), "\n<s>\n") == 0, "BOS piece");
    CHECK(tok_piece(t, 512) == NULL && tok_piece(t, -1) == NULL, "out-of-range piece");
    CHECK(tok_piece_to_id(t, " ") == 410, "id of \" \": %d", tok_piece_to_id(t, " "));
    check_greedy_cases(t, SHARED "/models/stories260K/expected_greedy.json", "stories260K");

    /* "Zoo" -> 4 tokens (llama2.c64 README); empty -> BOS only */
    check_encode(t, "stories260K", "Zoo", true, (int[]){1, 410, 469, 347}, 4);
    check_encode(t, "stories260K", "", true, (int[]){1}, 1);
    check_encode(t, "stories260K", "", false, NULL, 0);

    /* skip_special=false shows BOS/EOS pieces */
    char *s = tok_decode(t, (int[]){1, 410, 469, 347, 2}, 5, false, &e);
    CHECK(s && strcmp(s, "\n<s>\nZoo\n</s>\n") == 0, "decode with specials: \"%s\"", s ? s : e.msg);
    free(s);

    /* Byte fallback and streaming: é and 🦙 have no pieces in a 512 vocab */
    const char *in = "h\xc3\xa9llo \xf0\x9f\xa6\x99 and caf\xc3\xa9\n\xe4\xb8\xad";
    int *ids = NULL;
    int n = tok_encode(t, in, strlen(in), true, &ids, &e);
    CHECK(n > 0, "encode: %s", e.msg);
    int nbytes = 0;
    for (int i = 0; i < n; i++)
        nbytes += ids[i] >= 3 && ids[i] <= 258;
    CHECK(nbytes >= 4 + 2, "expected byte-fallback ids, got %d", nbytes);
    int bad;
    char *out = stream_decode(t, ids, n, true, &bad);
    CHECK(strcmp(out, in) == 0, "round trip: \"%s\"", out);
    CHECK(bad == 0, "%d chunks were not valid UTF-8 on their own", bad);
    free(out);
    /* the 4 bytes of 🦙 arrive one token at a time: nothing until the last */
    struct detok d;
    detok_init(&d, t, true);
    char buf[256];
    int emoji[4] = {0xf0 + 3, 0x9f + 3, 0xa6 + 3, 0x99 + 3};
    size_t k0 = detok_feed(&d, 1, buf, sizeof buf);
    size_t k1 = detok_feed(&d, emoji[0], buf, sizeof buf);
    size_t k2 = detok_feed(&d, emoji[1], buf, sizeof buf);
    size_t k3 = detok_feed(&d, emoji[2], buf, sizeof buf);
    CHECK(k0 == 0 && k1 == 0 && k2 == 0 && k3 == 0, "partial emoji emitted early");
    size_t k4 = detok_feed(&d, emoji[3], buf, sizeof buf);
    CHECK(k4 == 4 && memcmp(buf, "\xf0\x9f\xa6\x99", 4) == 0, "emoji completed: %zu bytes", k4);
    /* a cut-off sequence becomes U+FFFD at flush; a broken one right away */
    detok_feed(&d, 0xe4 + 3, buf, sizeof buf);
    size_t kf = detok_flush(&d, buf, sizeof buf);
    CHECK(kf == 3 && memcmp(buf, "\xef\xbf\xbd", 3) == 0, "flush of a held byte: %zu", kf);
    detok_feed(&d, 0xe4 + 3, buf, sizeof buf);
    size_t kb = detok_feed(&d, 'A' + 3, buf, sizeof buf);
    CHECK(kb == 4 && memcmp(buf, "\xef\xbf\xbd" "A", 4) == 0, "broken sequence: \"%s\"", buf);
    size_t kx = detok_feed(&d, 0xff + 3, buf, sizeof buf);
    CHECK(kx == 3 && memcmp(buf, "\xef\xbf\xbd", 3) == 0, "0xFF byte: %zu", kx);
    /* after a non-BOS token a leading space stays */
    detok_init(&d, t, true);
    d.prev_id = 300;
    size_t ks = detok_feed(&d, 410, buf, sizeof buf);
    CHECK(ks == 1 && buf[0] == ' ', "space after a prompt token kept");
    free(ids);

    /* the checkpoint file itself also finds its tokenizer */
    struct tokenizer *t2 = tok_load_for_model(SHARED "/models/stories260K/stories260K.bin", &e);
    CHECK(t2 && tok_vocab_size(t2) == 512, "stories260K.bin: %s", t2 ? "" : e.msg);
    tok_free(t2);
    tok_free(t);
}

static void test_tinystories(void)
{
    struct err e = {{0}};
    struct tokenizer *t = tok_load_for_model(SHARED "/models/tinystories-656k", &e);
    CHECK(t != NULL, "tinystories-656k: %s", e.msg);
    if (!t)
        return;
    CHECK(tok_vocab_size(t) == 2048, "vocab %d", tok_vocab_size(t));
    CHECK(tok_bos_id(t) == 1 && tok_eos_id(t) == 2, "bos %d eos %d", tok_bos_id(t), tok_eos_id(t));
    check_greedy_cases(t, SHARED "/models/tinystories-656k/expected_greedy.json",
                       "tinystories-656k");
    check_encode(t, "tinystories", "Once upon a time", false, (int[]){80, 147, 201, 282, 57}, 5);
    tok_free(t);
}

/* ---- Mistral ---- */

static void test_mistral(void)
{
    struct err e = {{0}};
    struct tokenizer *t = tok_load_hf_json(SHARED "/tokenizers/mistral/tokenizer.json", &e);
    CHECK(t != NULL, "mistral: %s", e.msg);
    if (!t)
        return;
    CHECK(tok_vocab_size(t) == 32000 && tok_bos_id(t) == 1 && tok_eos_id(t) == 2,
          "vocab %d bos %d eos %d", tok_vocab_size(t), tok_bos_id(t), tok_eos_id(t));
    /* Hand-checked against the vocab: ▁Hello 22557, ▁world 1526, ▁ 28705,
     * <0x0A> 13, ▁[ 733, INST 16289, ] 28793 (shared/tokenizers/README.md),
     * ▁▁ 259; "\n" has no piece so it falls back to its byte. */
    check_encode(t, "mistral", "Hello world", true, (int[]){1, 22557, 1526}, 3);
    check_encode(t, "mistral", "Hello world", false, (int[]){22557, 1526}, 2);
    check_encode(t, "mistral", "[INST]", true, (int[]){1, 733, 16289, 28793}, 4);
    check_encode(t, "mistral", "\n", false, (int[]){28705, 13}, 2);
    check_encode(t, "mistral", " ", false, (int[]){259}, 1);
    check_encode(t, "mistral", "", true, (int[]){1}, 1);
    /* special tokens in the text are matched whole; the text after one gets
     * its own "▁" prefix (HF's legacy Prepend normalizer, per fragment) */
    check_encode(t, "mistral", "<s>Hello", false, (int[]){1, 22557}, 2);
    check_encode(t, "mistral", "Hello</s>", false, (int[]){22557, 2}, 2);

    int *ids = NULL;
    const char *in = "Hello world, \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\xa6\x99!\n  indented";
    int n = tok_encode(t, in, strlen(in), true, &ids, &e);
    CHECK(n > 0, "encode: %s", e.msg);
    char *out = tok_decode(t, ids, n, true, &e);
    CHECK(out && strcmp(out, in) == 0, "mistral round trip: \"%s\"", out ? out : e.msg);
    free(out);
    out = tok_decode(t, ids, n, false, &e);
    CHECK(out && strncmp(out, "<s> Hello", 9) == 0, "with specials: \"%s\"", out ? out : e.msg);
    free(out);
    free(ids);

    /* speed: ~1 MB of mixed text, one BPE word (Mistral has no pre-tokenizer) */
    const char *para = "The quick brown fox jumps over the lazy dog. Once upon a time, there "
                       "was a little girl named Lily, who loved to play in the park near her "
                       "house; she counted 1234567 leaves and said \"h\xc3\xa9llo\" to "
                       "\xe4\xbd\xa0\xe5\xa5\xbd friends \xf0\x9f\xa6\x99.\n";
    size_t plen = strlen(para), total = 1 << 20;
    char *big = malloc(total + 1);
    for (size_t i = 0; i < total; i += plen)
        memcpy(big + i, para, i + plen <= total ? plen : total - i);
    big[total] = 0;
    double t0 = clock_now_s();
    n = tok_encode(t, big, total, true, &ids, &e);
    double dt = clock_now_s() - t0;
    CHECK(n > 0, "1 MB encode: %s", e.msg);
    printf("mistral encode: %zu bytes -> %d tokens in %.3f s (%.1f MB/s, %.0f tokens/s)\n", total,
           n, dt, total / dt / 1e6, n / dt);
    CHECK(dt < 5.0, "1 MB encode took %.2f s", dt);
    out = tok_decode(t, ids, n, true, &e);
    CHECK(out && strcmp(out, big) == 0, "1 MB round trip");
    free(out);
    free(ids);
    free(big);
    tok_free(t);
}

/* ---- llama.cpp vectors ---- */

struct vectors {
    char *inp;
    char **tests;
    int n;
    char *out;
    char **lines;
};

static bool load_vectors(struct vectors *v, const char *base)
{
    char p[1024];
    memset(v, 0, sizeof *v);
    snprintf(p, sizeof p, "%s.inp", base);
    size_t len;
    v->inp = test_read_file(p, &len);
    snprintf(p, sizeof p, "%s.out", base);
    v->out = test_read_file(p, NULL);
    if (!v->inp || !v->out)
        return false;
    static const char SEP[] = "\n__ggml_vocab_test__\n";
    v->tests = malloc(sizeof(char *) * 256);
    size_t pos = 0;
    while (pos < len && v->n < 256) {
        char *next = strstr(v->inp + pos, SEP);
        v->tests[v->n++] = v->inp + pos;
        if (!next)
            break;
        *next = 0;
        pos = (size_t)(next - v->inp) + strlen(SEP);
    }
    v->lines = malloc(sizeof(char *) * (size_t)(v->n + 1));
    char *s = v->out;
    for (int i = 0; i < v->n; i++) {
        v->lines[i] = s;
        char *nl = s ? strchr(s, '\n') : NULL;
        if (nl) {
            *nl = 0;
            s = nl + 1;
        } else {
            s = NULL;
        }
    }
    return true;
}

static void free_vectors(struct vectors *v)
{
    free(v->inp);
    free(v->out);
    free(v->tests);
    free(v->lines);
}

/* Runs every vector without special tokens; returns the number passed. */
static int run_vectors(const struct tokenizer *t, const struct vectors *v, const char *what)
{
    int pass = 0;
    for (int i = 0; i < v->n; i++) {
        int want[512], nw = 0;
        for (char *s = v->lines[i] ? v->lines[i] : ""; *s && nw < 512;) {
            char *end;
            long x = strtol(s, &end, 10);
            if (end == s)
                break;
            want[nw++] = (int)x;
            s = end;
        }
        int before = test_failed;
        check_encode(t, what, v->tests[i], false, want, nw);
        pass += test_failed == before;
    }
    return pass;
}

/* A minimal GGUF metadata reader, enough for the tokenizer arrays. */
struct raw_vocab {
    char **tokens;
    float *scores;
    int *types;
    int n, bos, eos;
    bool add_bos;
};

static bool rd(const unsigned char **p, const unsigned char *end, void *dst, size_t n)
{
    if ((size_t)(end - *p) < n)
        return false;
    memcpy(dst, *p, n);
    *p += n;
    return true;
}

static size_t gguf_scalar_size(uint32_t type)
{
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type < 13 ? sz[type] : 0;
}

static bool gguf_skip(const unsigned char **p, const unsigned char *end, uint32_t type)
{
    if (type == 8) {
        uint64_t n;
        if (!rd(p, end, &n, 8) || (uint64_t)(end - *p) < n)
            return false;
        *p += n;
        return true;
    }
    if (type == 9) {
        uint32_t et;
        uint64_t n;
        if (!rd(p, end, &et, 4) || !rd(p, end, &n, 8))
            return false;
        for (uint64_t i = 0; i < n; i++)
            if (!gguf_skip(p, end, et))
                return false;
        return true;
    }
    size_t s = gguf_scalar_size(type);
    if (!s || (size_t)(end - *p) < s)
        return false;
    *p += s;
    return true;
}

static bool read_gguf_vocab(const char *path, struct raw_vocab *g)
{
    size_t len;
    unsigned char *buf = (unsigned char *)test_read_file(path, &len);
    memset(g, 0, sizeof *g);
    g->bos = g->eos = -1;
    g->add_bos = true;
    if (!buf)
        return false;
    const unsigned char *p = buf, *end = buf + len;
    uint32_t magic, version;
    uint64_t ntensors, nkv;
    bool ok = rd(&p, end, &magic, 4) && magic == 0x46554747 && rd(&p, end, &version, 4) &&
              rd(&p, end, &ntensors, 8) && rd(&p, end, &nkv, 8);
    for (uint64_t i = 0; ok && i < nkv; i++) {
        uint64_t klen;
        uint32_t type;
        char key[256] = "";
        ok = rd(&p, end, &klen, 8) && klen < sizeof key && rd(&p, end, key, klen) &&
             rd(&p, end, &type, 4);
        if (!ok)
            break;
        if (strcmp(key, "tokenizer.ggml.tokens") == 0 && type == 9) {
            uint32_t et = 0;
            uint64_t n = 0;
            ok = rd(&p, end, &et, 4) && et == 8 && rd(&p, end, &n, 8) && n < (1u << 24);
            g->n = (int)n;
            g->tokens = calloc(n, sizeof *g->tokens);
            for (uint64_t j = 0; ok && j < n; j++) {
                uint64_t sl;
                ok = rd(&p, end, &sl, 8) && (uint64_t)(end - p) >= sl;
                if (ok) {
                    g->tokens[j] = strndup((const char *)p, sl);
                    p += sl;
                }
            }
        } else if ((strcmp(key, "tokenizer.ggml.scores") == 0 ||
                    strcmp(key, "tokenizer.ggml.token_type") == 0) &&
                   type == 9) {
            uint32_t et = 0;
            uint64_t n = 0;
            ok = rd(&p, end, &et, 4) && (et == 6 || et == 5) && rd(&p, end, &n, 8) &&
                 (uint64_t)(end - p) >= n * 4;
            if (ok) {
                void *arr = malloc(n * 4);
                memcpy(arr, p, n * 4);
                p += n * 4;
                if (key[15] == 's')
                    g->scores = arr;
                else
                    g->types = arr;
            }
        } else if ((strcmp(key, "tokenizer.ggml.bos_token_id") == 0 ||
                    strcmp(key, "tokenizer.ggml.eos_token_id") == 0) &&
                   (type == 4 || type == 5)) {
            int32_t v;
            ok = rd(&p, end, &v, 4);
            if (key[15] == 'b')
                g->bos = v;
            else
                g->eos = v;
        } else if (strcmp(key, "tokenizer.ggml.add_bos_token") == 0 && type == 7) {
            uint8_t v;
            ok = rd(&p, end, &v, 1);
            g->add_bos = v != 0;
        } else {
            ok = gguf_skip(&p, end, type);
        }
    }
    free(buf);
    return ok && g->tokens && g->scores;
}

static void free_gguf_vocab(struct raw_vocab *g)
{
    for (int i = 0; g->tokens && i < g->n; i++)
        free(g->tokens[i]);
    free(g->tokens);
    free(g->scores);
    free(g->types);
}

static void test_llama_spm_vectors(void)
{
    const char *base = SHARED "/testdata/tokenizer-vectors/ggml-vocab-llama-spm.gguf";
    struct raw_vocab g;
    bool ok = read_gguf_vocab(base, &g);
    CHECK(ok && g.n == 32000, "%s: could not read the vocab (n=%d)", base, g.n);
    if (!ok) {
        free_gguf_vocab(&g);
        return;
    }
    struct err e = {{0}};
    struct tokenizer *t = tok_load_gguf_vocab(g.tokens, g.scores, g.types, g.n, g.bos, g.eos,
                                              g.add_bos, &e);
    CHECK(t != NULL, "gguf vocab: %s", e.msg);
    if (t) {
        CHECK(tok_bos_id(t) == 1 && tok_eos_id(t) == 2, "bos %d eos %d", tok_bos_id(t),
              tok_eos_id(t));
        check_encode(t, "llama-spm", "Hello world", true, (int[]){1, 15043, 3186}, 3);
        struct vectors v;
        if (load_vectors(&v, base)) {
            int pass = run_vectors(t, &v, "llama-spm");
            printf("llama-spm (GGUF vocab) vectors: %d/%d\n", pass, v.n);
            CHECK(v.n == 46, "%d vectors", v.n);
            /* decoding gives the text back (the vectors are all valid UTF-8) */
            for (int i = 0; i < v.n; i++) {
                int *ids = NULL;
                int n = tok_encode(t, v.tests[i], strlen(v.tests[i]), true, &ids, &e);
                char *s = n >= 0 ? tok_decode(t, ids, n, true, &e) : NULL;
                CHECK(s && strcmp(s, v.tests[i]) == 0, "llama-spm decode #%d: \"%s\"", i,
                      s ? s : e.msg);
                free(s);
                free(ids);
            }
        }
        free_vectors(&v);
    }
    tok_free(t);
    free_gguf_vocab(&g);
}

static void test_gemma_vectors(void)
{
    const char *json = SHARED "/tokenizers/gemma3/tokenizer.json";
    if (!file_exists(json)) {
        printf("gemma3 tokenizer.json missing: skipped\n");
        return;
    }
    struct err e = {{0}};
    double t0 = clock_now_s();
    struct tokenizer *t = tok_load_hf_json(json, &e);
    double dt = clock_now_s() - t0;
    CHECK(t != NULL, "gemma3: %s", e.msg);
    if (!t)
        return;
    printf("gemma3 tokenizer.json (262k vocab, 515k merges) loaded in %.2f s\n", dt);
    /* tokenizer_config.json names <end_of_turn> (106) as eos_token */
    CHECK(tok_bos_id(t) == 2 && tok_eos_id(t) == 106, "bos %d eos %d", tok_bos_id(t),
          tok_eos_id(t));
    struct vectors v;
    if (load_vectors(&v, SHARED "/testdata/tokenizer-vectors/ggml-vocab-gemma-4.gguf")) {
        int pass = run_vectors(t, &v, "gemma");
        printf("gemma3 tokenizer.json vs gemma-4 vectors: %d/%d\n", pass, v.n);
        CHECK(v.n == 46, "%d vectors", v.n);
    }
    free_vectors(&v);
    /* add_special puts <bos> first; no dummy prefix, no leading-space strip */
    int *ids = NULL;
    int n = tok_encode(t, " Hello", 6, true, &ids, &e);
    CHECK(n >= 2 && ids[0] == 2, "gemma BOS first");
    char *s = tok_decode(t, ids, n, true, &e);
    CHECK(s && strcmp(s, " Hello") == 0, "gemma decode keeps the space: \"%s\"", s ? s : e.msg);
    free(s);
    free(ids);
    tok_free(t);
}

/* ---- errors ---- */

static char tmpdir[256];

static const char *write_tmp_n(const char *name, const char *content, size_t n)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(content, 1, n, f);
        fclose(f);
    }
    return path;
}

static const char *write_tmp(const char *name, const char *content)
{
    return write_tmp_n(name, content, strlen(content));
}

static void check_load_error(struct tokenizer *t, const struct err *e, const char *path,
                             const char *needle)
{
    CHECK(t == NULL, "expected failure for %s", path);
    CHECK(strstr(e->msg, path) != NULL, "message does not name %s: \"%s\"", path, e->msg);
    CHECK(!needle || strstr(e->msg, needle) != NULL, "message lacks \"%s\": \"%s\"", needle,
          e->msg);
    tok_free(t);
}

static void test_errors(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_tokenizer.XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL, "mkdtemp");
    struct err e = {{0}};
    char path[512];

    snprintf(path, sizeof path, "%s/nope/tokenizer.json", tmpdir);
    check_load_error(tok_load_hf_json(path, &e), &e, path, NULL);
    snprintf(path, sizeof path, "%s/nope/tok512.bin", tmpdir);
    check_load_error(tok_load_llama2c(path, 512, &e), &e, path, NULL);
    snprintf(path, sizeof path, "%s/nope", tmpdir);
    check_load_error(tok_load_for_model(path, &e), &e, path, NULL);
    check_load_error(tok_load_for_model(tmpdir, &e), &e, tmpdir, "no tokenizer");

    const char *p = write_tmp("bad.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,}");
    snprintf(path, sizeof path, "%s", p);
    check_load_error(tok_load_hf_json(path, &e), &e, path, "line 1");

    p = write_tmp("unigram.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", -1.0]]}}");
    snprintf(path, sizeof path, "%s", p);
    check_load_error(tok_load_hf_json(path, &e), &e, path, "Unigram");

    /* a tiny byte-level BPE: " " is "Ġ" in the vocabulary */
    p = write_tmp("bytelevel.json",
                  "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"\u0120\": 2,"
                  " \"ab\": 3}, \"merges\": [\"a b\"]},"
                  " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
                  " \"decoder\": {\"type\": \"ByteLevel\"}}");
    snprintf(path, sizeof path, "%s", p);
    struct tokenizer *bl = tok_load_hf_json(path, &e);
    CHECK(bl != NULL, "bytelevel.json: %s", e.msg);
    if (bl) {
        check_encode(bl, "bytelevel", "ab ab", false, (int[]){3, 2, 3}, 3);
        char *d = tok_decode(bl, (int[]){3, 2, 3}, 3, false, &e);
        CHECK(d && strcmp(d, "ab ab") == 0, "bytelevel decode: \"%s\"", d ? d : e.msg);
        free(d);
        tok_free(bl);
    }

    p = write_tmp("regex.json",
                  "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"bb\": 2},"
                  " \"merges\": [\"b b\"]}, \"pre_tokenizer\": {\"type\": \"Split\","
                  " \"pattern\": {\"Regex\": \"b+\"}, \"behavior\": \"Isolated\"}}");
    snprintf(path, sizeof path, "%s", p);
    bl = tok_load_hf_json(path, &e);
    CHECK(bl != NULL, "regex.json: %s", e.msg);
    if (bl) {
        check_encode(bl, "regex split", "abbba", false, (int[]){0, 2, 1, 0}, 4);
        tok_free(bl);
    }
    /* BPE without an unk token: a word of pieces the vocabulary lacks
     * comes out as no ids, as HF's BPE drops them (fuzz_tokenizer_json
     * found the empty output handed to the word cache as NULL + 0) */
    p = write_tmp("nounk.json",
                  "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []},"
                  " \"pre_tokenizer\": {\"type\": \"Whitespace\"}}");
    snprintf(path, sizeof path, "%s", p);
    bl = tok_load_hf_json(path, &e);
    CHECK(bl != NULL, "nounk.json: %s", e.msg);
    if (bl) {
        check_encode(bl, "no unk", "a xyz b", false, (int[]){0, 1}, 2);
        check_encode(bl, "no unk, repeated word (cached)", "xyz xyz a", false, (int[]){0}, 1);
        tok_free(bl);
    }
    p = write_tmp("badregex.json",
                  "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                  " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}}}");
    snprintf(path, sizeof path, "%s", p);
    check_load_error(tok_load_hf_json(path, &e), &e, path, "regex");

    /* max_token_length 7, then one record: score 0, length 5, only "ab" */
    p = write_tmp_n("tok9.bin", "\x07\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00"
                                    "ab",
                    14);
    snprintf(path, sizeof path, "%s", p);
    check_load_error(tok_load_llama2c(path, 9, &e), &e, path, "truncated");

    p = write_tmp("m.gguf", "GGUF");
    snprintf(path, sizeof path, "%s", p);
    check_load_error(tok_load_for_model(path, &e), &e, path, "");

    /* a .gguf model path loads the vocabulary from its metadata */
    const char *spm = SHARED "/testdata/tokenizer-vectors/ggml-vocab-llama-spm.gguf";
    struct tokenizer *gt = tok_load_for_model(spm, &e);
    CHECK(gt != NULL, "tok_load_for_model(%s): %s", spm, e.msg);
    if (gt) {
        int *ids = NULL;
        int n = tok_encode(gt, "Hello world", 11, true, &ids, &e);
        CHECK(n == 3 && ids[0] == 1 && ids[1] == 15043 && ids[2] == 3186,
              "llama-spm gguf: \"Hello world\" -> %d ids", n);
        free(ids);
        tok_free(gt);
    }

    /* Llama 3: byte-level BPE, BOS from the post-processor */
    const char *l3 = SHARED "/tokenizers/llama3_1/tokenizer.json";
    if (file_exists(l3)) {
        struct tokenizer *lt = tok_load_hf_json(l3, &e);
        CHECK(lt != NULL, "%s: %s", l3, e.msg);
        if (lt) {
            check_encode(lt, "llama3", "Hello world", true, (int[]){128000, 9906, 1917}, 3);
            CHECK(tok_bos_id(lt) == 128000 && tok_eos_id(lt) == 128009, "llama3 bos %d eos %d",
                  tok_bos_id(lt), tok_eos_id(lt));
            tok_free(lt);
        }
    }

    /* a tiny BPE without byte fallback or unk cannot encode unknown text */
    p = write_tmp("tiny.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, "
                               "\"ab\": 2}, \"merges\": [[\"a\", \"b\"]]}}");
    snprintf(path, sizeof path, "%s", p);
    struct tokenizer *t = tok_load_hf_json(path, &e);
    CHECK(t != NULL, "tiny.json: %s", e.msg);
    if (t) {
        check_encode(t, "tiny", "abab", true, (int[]){2, 2}, 2);
        /* as in HF: a character with no piece, no byte fallback and no unk
         * is dropped */
        check_encode(t, "tiny", "abc", false, (int[]){2}, 1);
        tok_free(t);
    }
    /* Metaspace pre-tokenizer (prepend_scheme first, split) + decoder */
    p = write_tmp("meta.json",
                  "{\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", \"special\": true}],"
                  " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": {\"<unk>\": 0,"
                  " \"<s>\": 1, \"\u2581\": 2, \"a\": 3, \"b\": 4, \"\u2581a\": 5, \"ab\": 6,"
                  " \"\u2581ab\": 7, \"\u2581a\u2581\": 7},"
                  " \"merges\": [\"\u2581 a\", \"a b\", \"\u2581a b\"]},"
                  " \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\","
                  " \"prepend_scheme\": \"first\", \"split\": true},"
                  " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
                  "{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}],"
                  " \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1]}}},"
                  " \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\","
                  " \"prepend_scheme\": \"first\", \"split\": true}}");
    snprintf(path, sizeof path, "%s", p);
    t = tok_load_hf_json(path, &e);
    CHECK(t != NULL, "meta.json: %s", e.msg);
    if (t) {
        CHECK(tok_bos_id(t) == 1, "bos from the template: %d", tok_bos_id(t));
        check_encode(t, "metaspace", "ab ab", true, (int[]){1, 7, 7}, 3);
        check_encode(t, "metaspace", "b a", false, (int[]){2, 4, 5}, 3);
        /* after a special token the text is not "first": no prefix */
        check_encode(t, "metaspace", "<s>ab", false, (int[]){1, 6}, 2);
        check_encode(t, "metaspace", "c", false, (int[]){2, 0}, 2);
        /* a second string for id 7 (duplicate id) still encodes to it */
        CHECK(tok_piece_to_id(t, "\xe2\x96\x81" "a" "\xe2\x96\x81") == 7, "duplicate id string");
        char *d = tok_decode(t, (int[]){1, 7, 7, 2, 4}, 5, true, &e);
        CHECK(d && strcmp(d, "ab ab b") == 0, "metaspace decode: \"%s\"", d ? d : e.msg);
        free(d);
        tok_free(t);
    }

    /* Split on a string, Isolated and Removed */
    for (int k = 0; k < 2; k++) {
        char js[512];
        snprintf(js, sizeof js,
                 "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"-\": 2,"
                 " \"ab\": 3, \"b-\": 4}, \"merges\": [\"b -\", \"a b\"]},"
                 " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"},"
                 " \"behavior\": \"%s\", \"invert\": false}}",
                 k ? "Removed" : "Isolated");
        p = write_tmp("split.json", js);
        snprintf(path, sizeof path, "%s", p);
        t = tok_load_hf_json(path, &e);
        CHECK(t != NULL, "split.json: %s", e.msg);
        if (t) {
            if (k == 0)
                check_encode(t, "split isolated", "ab-ab", false, (int[]){3, 2, 3}, 3);
            else
                check_encode(t, "split removed", "ab-ab", false, (int[]){3, 3}, 2);
            tok_free(t);
        }
    }

    const char *names[] = {"bad.json",  "unigram.json", "bytelevel.json", "regex.json",
                           "tok9.bin",  "m.gguf",       "tiny.json",      "meta.json",
                           "split.json", "badregex.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", tmpdir, names[i]);
        unlink(path);
    }
}

/* ---- byte-level extras: invalid UTF-8, threads, GGUF errors ---- */

struct enc_job {
    const struct tokenizer *t;
    const char *text;
    size_t len;
    int *ids, n;
};

static void *enc_thread(void *arg)
{
    struct enc_job *j = arg;
    struct err e = {{0}};
    j->n = tok_encode(j->t, j->text, j->len, true, &j->ids, &e);
    return NULL;
}

static void test_bytelevel_extras(void)
{
    const char *q3 = SHARED "/tokenizers/qwen3/tokenizer.json";
    if (!file_exists(q3)) {
        printf("qwen3 tokenizer.json missing: skipped\n");
        return;
    }
    struct err e = {{0}};
    struct tokenizer *t = tok_load_hf_json(q3, &e);
    CHECK(t != NULL, "qwen3: %s", e.msg);
    if (!t)
        return;
    /* bytes that are not UTF-8 are read as U+FFFD, one per bad sequence */
    int *a = NULL, *b = NULL;
    int na = tok_encode(t, "a\xff\xc3(b\xe2\x82", 8, false, &a, &e);
    int nb = tok_encode(t, "a\xef\xbf\xbd\xef\xbf\xbd(b\xef\xbf\xbd", 13, false, &b, &e);
    CHECK(na > 0 && na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0,
          "invalid UTF-8 encodes as U+FFFD (%d vs %d ids)", na, nb);
    free(a);
    free(b);

    /* one tokenizer, four threads at once: the same ids as alone */
    size_t len = 0, cap = 1 << 18;
    char *text = malloc(cap + 256);
    for (int i = 0; len < cap; i++)
        len += (size_t)snprintf(text + len, 256,
                                "Line %d: the quick brown fox, 数字 %d, emoji \xf0\x9f\x98\x80 x%d\n",
                                i, i * 7, i % 13);
    struct enc_job one = {t, text, len, NULL, 0}, jobs[4];
    enc_thread(&one);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = one;
        jobs[i].ids = NULL;
        pthread_create(&th[i], NULL, enc_thread, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].n == one.n && one.n > 0 &&
                  memcmp(jobs[i].ids, one.ids, (size_t)one.n * sizeof(int)) == 0,
              "thread %d: %d ids vs %d alone", i, jobs[i].n, one.n);
        free(jobs[i].ids);
    }
    free(one.ids);
    free(text);
    tok_free(t);

    /* a "gpt2" GGUF vocabulary whose pre-tokenizer is unknown is refused */
    char path[512];
    snprintf(path, sizeof path, "%s/prebogus.gguf", tmpdir);
    struct gguf_writer *w = gguf_writer_new(&e);
    const char *toks[] = {"a", "b", "ab"}, *merges[] = {"a b"};
    bool ok = w && !gguf_writer_kv_str(w, "general.architecture", "gpt2", &e) &&
              !gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2", &e) &&
              !gguf_writer_kv_str(w, "tokenizer.ggml.pre", "bogus-pre", &e) &&
              !gguf_writer_kv_arr_str(w, "tokenizer.ggml.tokens", toks, 3, &e) &&
              !gguf_writer_kv_arr_str(w, "tokenizer.ggml.merges", merges, 1, &e) &&
              !gguf_writer_open(w, path, &e) && !gguf_writer_close(w, &e);
    gguf_writer_free(w);
    CHECK(ok, "writing %s: %s", path, e.msg);
    if (ok) {
        check_load_error(tok_load_gguf_file(path, &e), &e, path, "bogus-pre");
        unlink(path);
    }
    rmdir(tmpdir);
}

int main(void)
{
    test_stories260k();
    test_tinystories();
    test_mistral();
    test_llama_spm_vectors();
    test_gemma_vectors();
    test_errors();
    test_bytelevel_extras();
    return test_summary("test_tokenizer");
}
