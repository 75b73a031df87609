/* fuzz_tokenizer.c - libFuzzer target: encode arbitrary bytes with a real
 * byte-level tokenizer (Llama-3's, no normalizer) and require that decoding
 * gives back exactly the input whenever the input is valid UTF-8; invalid
 * UTF-8 must be refused or encoded without crashing.
 * Run: build-fuzz/fuzz_tokenizer -max_total_time=60 (CLLM_FUZZ_TOKENIZER
 * overrides the tokenizer.json path). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static struct tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *path = getenv("CLLM_FUZZ_TOKENIZER");
    if (!path)
        path = CLLM_SHARED_DIR "/tokenizers/llama3_1/tokenizer.json";
    struct err e = {{0}};
    tok = tok_load_hf_json(path, &e);
    if (!tok) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", e.msg);
        abort();
    }
    return 0;
}

static int valid_utf8(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n || c == 0)
            return 0;
        uint32_t cp = len == 1 ? c : c & (0x7f >> len);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += len;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct err e = {{0}};
    int *ids = NULL;
    int n = tok_encode(tok, (const char *)data, size, false, &ids, &e);
    if (n < 0) {
        if (valid_utf8(data, size))
            abort(); /* valid text must always encode */
        return 0;
    }
    char *back = tok_decode(tok, ids, n, false, &e);
    if (valid_utf8(data, size) && (!back || strlen(back) != size || memcmp(back, data, size)))
        abort(); /* byte-level BPE without a normalizer is lossless */
    free(back);
    free(ids);
    return 0;
}
