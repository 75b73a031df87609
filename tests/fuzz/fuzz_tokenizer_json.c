/* fuzz_tokenizer_json.c - libFuzzer target: arbitrary bytes as a
 * tokenizer.json (what --tokenizer and a model directory hand the loader)
 * load or are refused with a message naming the file; a loaded tokenizer
 * encodes a fixed text to ids it owns, decodes them, and decodes them
 * token by token to UTF-8 only (detok's contract), never crashing.
 *   python3 tests/fuzz/tokenizer_seeds.py /tmp/tseeds
 *   build-fuzz/fuzz_tokenizer_json /tmp/tcorpus /tmp/tseeds -max_total_time=300 -max_len=16384
 * The file goes to a directory of its own under $TMPDIR (or /tmp): fuzz_tmp.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_tmp.h"
#include "tokenizer/tok_internal.h" /* tok_utf8_valid */
#include "tokenizer/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[512], path[600];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_tmpdir("fuzz_tokenizer_json", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_put(path, data, size);
    struct err e = {{0}};
    struct tokenizer *t = tok_load_hf_json(path, &e);
    if (!t) {
        if (!strstr(e.msg, dir)) {
            fprintf(stderr, "fuzz_tokenizer_json: a refusal that names no file: \"%s\"\n", e.msg);
            abort();
        }
        return 0;
    }
    static const char text[] = "Hello world! 123 4567 <|im_start|>user\n\tyes WORD héllo naïve "
                               "日本語 [CLS] <s> \xf0\x9f\x98\x80  end ";
    for (int special = 0; special < 2; special++) {
        int *ids = NULL;
        const int n = tok_encode(t, text, sizeof text - 1, special, &ids, &e);
        if (n < 0) {
            free(ids);
            continue;
        }
        for (int i = 0; i < n; i++)
            if (!tok_piece(t, ids[i])) {
                fprintf(stderr, "fuzz_tokenizer_json: id %d of the encoding has no piece\n",
                        ids[i]);
                abort();
            }
        char *whole = tok_decode(t, ids, n, special, &e);
        free(whole);
        struct detok d;
        detok_init(&d, t, special);
        const size_t cap = detok_max_bytes(t);
        char *buf = malloc(cap + 1);
        for (int i = 0; i <= n; i++) {
            const size_t k = i < n ? detok_feed(&d, ids[i], buf, cap) : detok_flush(&d, buf, cap);
            if (!tok_utf8_valid(buf, k)) {
                fprintf(stderr, "fuzz_tokenizer_json: detok gave bytes that are not UTF-8\n");
                abort();
            }
        }
        free(buf);
        free(ids);
    }
    tok_free(t);
    return 0;
}
