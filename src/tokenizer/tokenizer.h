/* tokenizer.h - text <-> token ids for a model: the contract the engine and
 * the CLI use, whatever file the vocabulary came from (tokenizer.json, a
 * llama2.c tok*.bin, or GGUF tokenizer.ggml.* metadata). */
#ifndef CLLM_TOKENIZER_TOKENIZER_H
#define CLLM_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"

struct tokenizer;

/* Finds and loads the tokenizer that belongs with a model path: a directory
 * with tokenizer.json, a llama2.c directory/file with tok*.bin next to it, or
 * a .gguf file's metadata. */
struct tokenizer *tok_load_for_model(const char *model_path, struct err *e);
struct tokenizer *tok_load_hf_json(const char *tokenizer_json_path, struct err *e);
struct tokenizer *tok_load_llama2c(const char *tok_bin_path, int vocab_size, struct err *e);
void tok_free(struct tokenizer *t);

int tok_vocab_size(const struct tokenizer *t);
int tok_bos_id(const struct tokenizer *t); /* -1 when none */
int tok_eos_id(const struct tokenizer *t); /* -1 when none */

/* Encodes text into ids (caller frees *ids). add_special: add BOS/EOS the
 * way the tokenizer's post-processor (or add_bos_token) says. Returns the
 * number of ids, or -1 with a message. */
int tok_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
               int **ids, struct err *e);

/* The raw piece bytes of one id (before decoding byte-fallback/▁), for
 * --print-ids and debugging. NULL for an out-of-range id. */
const char *tok_piece(const struct tokenizer *t, int id);

/* Streaming detokenizer: feed ids one at a time, get back only complete
 * UTF-8 text (bytes of a partial character are held until completed). */
struct detok {
    const struct tokenizer *tok;
    int prev_id;       /* -1 at start */
    unsigned char pending[8];
    int n_pending;
    bool skip_special; /* don't print BOS/EOS/control tokens */
};

void detok_init(struct detok *d, const struct tokenizer *t, bool skip_special);
/* Appends decoded text for id to out (cap bytes, NUL-terminated); returns the
 * number of bytes written. */
size_t detok_feed(struct detok *d, int id, char *out, size_t cap);
/* Flushes held bytes (invalid UTF-8 is emitted as U+FFFD). */
size_t detok_flush(struct detok *d, char *out, size_t cap);

/* Whole-sequence decode (caller frees). */
char *tok_decode(const struct tokenizer *t, const int *ids, int n, bool skip_special,
                 struct err *e);

#endif
