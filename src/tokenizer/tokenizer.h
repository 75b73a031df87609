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
/* A Hugging Face tokenizer.json (BPE, byte-level or SentencePiece-style, or
 * WordPiece; docs/tokenizers.md lists the supported components), with the
 * tokenizer_config.json beside it when there is one. */
struct tokenizer *tok_load_hf_json(const char *tokenizer_json_path, struct err *e);
struct tokenizer *tok_load_llama2c(const char *tok_bin_path, int vocab_size, struct err *e);
/* The vocabulary in a .gguf model's tokenizer.ggml.* metadata: "llama"
 * (SentencePiece), "gpt2" (byte-level BPE, pre-tokenizer chosen by
 * tokenizer.ggml.pre) or "bert" (WordPiece). */
struct tokenizer *tok_load_gguf_file(const char *gguf_path, struct err *e);
void tok_free(struct tokenizer *t);

/* --tokenizer PATH (`cllm serve`, `cllm run`): a directory holding
 * tokenizer.json (and optionally tokenizer_config.json with the chat
 * template) or a tokenizer.json file, used instead of the model's own.
 * tok_override_dir checks the path and writes the directory to look for the
 * chat template in to dir; tok_load_override loads the tokenizer and refuses
 * a vocabulary larger than model_vocab (a smaller one is fine: models pad
 * their embedding tables). Messages start with "--tokenizer PATH". */
int tok_override_dir(const char *path, char *dir, size_t cap, struct err *e);
struct tokenizer *tok_load_override(const char *path, int model_vocab, struct err *e);

int tok_vocab_size(const struct tokenizer *t);
int tok_bos_id(const struct tokenizer *t); /* -1 when none */
int tok_eos_id(const struct tokenizer *t); /* -1 when none */

/* Encodes text into ids (caller frees *ids). add_special: add BOS/EOS the
 * way the tokenizer's post-processor (or add_bos_token) says. Special and
 * added token strings in the text ("<s>", "[INST]") become those ids, as HF
 * tokenizers do by default. Returns the number of ids, or -1 with a
 * message. The tokenizer is read-only here: threads may share it. */
int tok_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
               int **ids, struct err *e);

/* The raw piece bytes of one id (before decoding byte-fallback/▁), for
 * --print-ids and debugging. NULL for an out-of-range id. */
const char *tok_piece(const struct tokenizer *t, int id);

/* The id whose raw piece is exactly `piece` (model vocabulary, then added
 * tokens), or -1. */
int tok_piece_to_id(const struct tokenizer *t, const char *piece);
/* True for ids that skip_special hides (BOS, EOS, control, unk, ...). */
bool tok_is_special(const struct tokenizer *t, int id);

/* A SentencePiece vocabulary from GGUF metadata (tokenizer.ggml.model ==
 * "llama"): tokens[n] and scores[n] are required, token_types[n] (GGUF token
 * types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)
 * may be NULL. bos/eos are ids or -1. Arrays are copied. A "▁" (U+2581)
 * dummy prefix is added unless tok_set_add_space_prefix says otherwise
 * (tokenizer.ggml.add_space_prefix). */
struct tokenizer *tok_load_gguf_vocab(char **tokens, const float *scores, const int *token_types,
                                      int n, int bos, int eos, bool add_bos, struct err *e);
void tok_set_add_space_prefix(struct tokenizer *t, bool on);

/* The bytes id adds to a text after other text (what detok_feed writes for
 * it mid-sequence, before UTF-8 completion): returns their number and points
 * *s at them (at *byte for a byte-fallback token), or -1 for a special
 * token (BOS, EOS, control, unk) or an id out of range. */
int tok_id_bytes(const struct tokenizer *t, int id, const char **s, char *byte);
/* Streaming detokenizer: feed ids one at a time, get back only complete
 * UTF-8 text (bytes of a partial character are held until completed). */
struct detok {
    const struct tokenizer *tok;
    int prev_id;       /* -1 at start */
    unsigned char pending[8];
    int n_pending;
    bool skip_special; /* don't print BOS/EOS/control tokens */
    bool started;      /* some text has come out */
};

/* The first token of a text loses its leading space (SentencePiece dummy
 * prefix). To decode only generated ids after a prompt, set d->prev_id to the
 * last prompt id after detok_init so that rule does not fire mid-text. */
void detok_init(struct detok *d, const struct tokenizer *t, bool skip_special);
/* Appends decoded text for id to out (cap bytes, NUL-terminated); returns the
 * number of bytes written. Output is always valid UTF-8. With cap at least
 * detok_max_bytes(t) nothing is ever cut off. */
size_t detok_feed(struct detok *d, int id, char *out, size_t cap);
/* Flushes held bytes (invalid UTF-8 is emitted as U+FFFD). */
size_t detok_flush(struct detok *d, char *out, size_t cap);
/* A buffer size for detok_feed/detok_flush that always suffices. */
size_t detok_max_bytes(const struct tokenizer *t);

/* Whole-sequence decode (caller frees). */
char *tok_decode(const struct tokenizer *t, const int *ids, int n, bool skip_special,
                 struct err *e);

#endif
