/* bench_tokenizer.c - single-thread encode speed of the real tokenizers on
 * about 1 MB of mixed text, and the time to encode a 100k-token prompt.
 *
 *   bench_tokenizer [--text FILE] [--shared DIR] [--runs N] [NAME...]
 *
 * NAME is a directory under DIR/tokenizers (default: llama3_1 qwen3 mistral
 * gemma3). --text takes the benchmark text HF tokenizers was measured on
 * (tests/fixtures/gen_tokenizer_cases.py --bench-text-only writes it; its
 * numbers are in tests/fixtures/tokenizers/hf_speed.json); without it a
 * built-in generator makes a deterministic 1 MB mix of English prose, code,
 * CJK, other scripts, emoji, numbers and whitespace runs. Each figure is
 * the median of N runs (default 5) after a first, cold run; MB = 10^6
 * bytes. Every encode is checked to round-trip (decode gives the text). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "tokenizer/tokenizer.h"

#ifndef CLLM_SHARED_DEFAULT
#define CLLM_SHARED_DEFAULT "../shared"
#endif


/* ---- the built-in text ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

struct text {
    char *p;
    size_t n, cap;
};

static void put(struct text *t, const char *s)
{
    size_t k = strlen(s);
    if (t->n + k + 1 > t->cap) {
        t->cap = (t->n + k + 1) * 2;
        t->p = realloc(t->p, t->cap);
        if (!t->p) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
    }
    memcpy(t->p + t->n, s, k + 1);
    t->n += k;
}

static const char *const WORDS[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "tokenizer", "benchmark",
    "throughput", "language", "model", "inference", "server", "request", "latency", "memory",
    "Hello", "World", "However", "Meanwhile", "Although", "Therefore", "unbelievable",
    "internationalization", "re-evaluate", "don't", "it's", "they're", "we've", "I'll"};
static const char *const CODE[] = {
    "def encode(self, text: str) -> list[int]:\n    ids = []\n    for word in self.split(text):\n"
    "        ids.extend(self.bpe(word))\n    return ids\n",
    "static int add(int a, int b)\n{\n    return a + b; /* sum */\n}\n",
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}}, \"merges\": [[\"a\", \"b\"]]}\n",
    "<div class=\"row\"><span id=\"x1\">&nbsp;Total: $42.00</span></div>\n",
    "for f in *.txt; do grep -n 'TODO' \"$f\" | wc -l; done\n",
    "    if (x->next != NULL && x->len >= 0x7f) { return -EINVAL; }\n"};
static const char *const OTHER[] = {
    "\xe6\x88\x91\xe6\x83\xb3\xe5\x9c\xa8\xe5\x8c\x97\xe4\xba\xac\xe5\xb7\xa5\xe4\xbd\x9c\xe3\x80"
    "\x82",                                                       /* Chinese */
    "\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf\xe4\xb8\x96\xe7\x95\x8c", /* Japanese */
    "\xec\x95\x88\xeb\x85\x95\xed\x95\x98\xec\x84\xb8\xec\x9a\x94",                         /* Korean */
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xd0\xbc\xd0\xb8\xd1\x80",            /* Russian */
    "\xce\x9a\xce\xb1\xce\xbb\xce\xb7\xce\xbc\xce\xad\xcf\x81\xce\xb1",                     /* Greek */
    "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7",                                             /* Arabic */
    "C\xe1\xbb\xad\x61 Vi\xe1\xbb\x87t caf\xc3\xa9 na\xc3\xafve",                           /* Latin */
    "\xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x9a\x80 \xe2\x9c\x85",       /* emoji */
    "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7",             /* ZWJ */
};

static void make_text(struct text *t, size_t want)
{
    char num[64];
    while (t->n < want) {
        uint32_t kind = rnd(100);
        if (kind < 55) { /* a prose sentence */
            int n = 5 + (int)rnd(20);
            for (int i = 0; i < n; i++) {
                put(t, i ? " " : "");
                put(t, WORDS[rnd(sizeof WORDS / sizeof WORDS[0])]);
                if (rnd(12) == 0)
                    put(t, ",");
            }
            put(t, rnd(5) ? ". " : ".\n\n");
        } else if (kind < 70) {
            put(t, CODE[rnd(sizeof CODE / sizeof CODE[0])]);
        } else if (kind < 85) {
            put(t, OTHER[rnd(sizeof OTHER / sizeof OTHER[0])]);
            put(t, rnd(2) ? " " : "\n");
        } else if (kind < 95) { /* numbers */
            snprintf(num, sizeof num, "%u %u.%02u %u,%03u ", rnd(100000), rnd(1000), rnd(100),
                     rnd(1000), rnd(1000));
            put(t, num);
        } else { /* whitespace runs */
            int n = 1 + (int)rnd(40);
            for (int i = 0; i < n; i++)
                put(t, rnd(4) ? " " : rnd(2) ? "\t" : "\n");
        }
    }
}

/* ---- measuring ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Encodes text runs+1 times; returns the median of the warm runs. */
static double time_encode(const struct tokenizer *t, const char *s, size_t n, int runs,
                          int *ntok, double *first)
{
    double ts[64];
    for (int r = 0; r <= runs; r++) {
        struct err e = {{0}};
        int *ids = NULL;
        double t0 = clock_now_s();
        int k = tok_encode(t, s, n, false, &ids, &e);
        double dt = clock_now_s() - t0;
        if (k < 0) {
            fprintf(stderr, "encode failed: %s\n", e.msg);
            exit(1);
        }
        *ntok = k;
        free(ids);
        if (r == 0)
            *first = dt;
        else
            ts[r - 1] = dt;
    }
    qsort(ts, (size_t)runs, sizeof ts[0], cmp_double);
    return ts[runs / 2];
}

int main(int argc, char **argv)
{
    const char *text_path = NULL, *shared = CLLM_SHARED_DEFAULT;
    int runs = 5;
    const char *names[16];
    int nn = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--text") && i + 1 < argc)
            text_path = argv[++i];
        else if (!strcmp(argv[i], "--shared") && i + 1 < argc)
            shared = argv[++i];
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (argv[i][0] != '-' && nn < 16)
            names[nn++] = argv[i];
        else {
            fprintf(stderr, "usage: %s [--text FILE] [--shared DIR] [--runs N] [NAME...]\n",
                    argv[0]);
            return 2;
        }
    }
    if (runs < 1 || runs > 63)
        runs = 5;
    if (nn == 0) {
        static const char *const dflt[] = {"llama3_1", "qwen3", "mistral", "gemma3"};
        for (int i = 0; i < 4; i++)
            names[nn++] = dflt[i];
    }
    struct text txt = {0};
    if (text_path) {
        FILE *f = fopen(text_path, "rb");
        if (!f) {
            perror(text_path);
            return 1;
        }
        char buf[65536];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf - 1, f)) > 0) {
            buf[k] = 0;
            if (memchr(buf, 0, k)) {
                fprintf(stderr, "%s: contains NUL bytes\n", text_path);
                return 1;
            }
            put(&txt, buf);
        }
        fclose(f);
    } else {
        make_text(&txt, 1000000);
    }
    printf("text: %s, %zu bytes; single thread; median of %d runs after a cold one\n",
           text_path ? text_path : "built-in generator", txt.n, runs);
    printf("%-10s %8s %9s %9s %10s %12s %10s\n", "tokenizer", "load_s", "tokens", "MB/s",
           "cold_MB/s", "100k_tok_ms", "roundtrip");
    for (int k = 0; k < nn; k++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tokenizers/%s/tokenizer.json", shared, names[k]);
        struct err e = {{0}};
        double t0 = clock_now_s();
        struct tokenizer *t = tok_load_hf_json(path, &e);
        double load = clock_now_s() - t0;
        if (!t) {
            printf("%-10s %s\n", names[k], e.msg);
            continue;
        }
        int ntok;
        double first;
        double med = time_encode(t, txt.p, txt.n, runs, &ntok, &first);
        /* a prompt of 100k tokens: the prefix before token 100000 */
        int *ids = NULL;
        int n = tok_encode(t, txt.p, txt.n, false, &ids, &e);
        size_t cut = txt.n;
        double ms100k = -1;
        bool rt = false;
        if (n > 0) {
            char *dec = tok_decode(t, ids, n, false, &e);
            rt = dec && strcmp(dec, txt.p) == 0;
            free(dec);
        }
        if (n > 100000) {
            /* the byte length of the first 100000 tokens' text */
            char *pre = tok_decode(t, ids, 100000, false, &e);
            if (pre) {
                cut = strlen(pre);
                if (cut > txt.n || memcmp(pre, txt.p, cut) != 0)
                    cut = txt.n; /* not a byte prefix (normalization): time it all */
                free(pre);
            }
            int ptok;
            double pf;
            ms100k = 1e3 * time_encode(t, txt.p, cut, runs, &ptok, &pf);
        }
        free(ids);
        printf("%-10s %8.2f %9d %9.2f %10.2f %12.1f %10s\n", names[k], load, ntok,
               (double)txt.n / med / 1e6, (double)txt.n / first / 1e6, ms100k,
               rt ? "ok" : "DIFFERS");
        tok_free(t);
    }
    free(txt.p);
    return 0;
}
