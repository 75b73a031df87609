/* tok_internal.h - what the tokenizer's files share and nothing outside
 * src/tokenizer/ (and its tests) may use: the struct tokenizer layout, the
 * hash maps, the added-token trie, Unicode and regex helpers, the HF
 * normalizer and pre-tokenizer steps, the merge heap and the models
 * (score-ordered SentencePiece, rank-ordered BPE, WordPiece). */
#ifndef CLLM_TOKENIZER_TOK_INTERNAL_H
#define CLLM_TOKENIZER_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "tokenizer/tokenizer.h"

/* ---- arena: stable storage for strings, freed all at once ---- */

struct tok_arena_blk;
struct tok_arena {
    struct tok_arena_blk *head;
};

/* Copies n bytes and a NUL; NULL on out-of-memory. */
char *tok_arena_strdup(struct tok_arena *a, const char *s, size_t n);
void tok_arena_free(struct tok_arena *a);

/* ---- growable byte buffer and int vector ---- */

struct tok_buf {
    char *p;
    size_t n, cap;
};
int tok_buf_put(struct tok_buf *b, const void *s, size_t n); /* 0 / -1 (OOM) */

struct tok_ivec {
    int *p;
    size_t n, cap;
};
int tok_ivec_push(struct tok_ivec *v, int x); /* 0 / -1 (OOM) */
/* Appends to a malloc'd int array with a separate count; 0 / -1 (OOM). */
int tok_ids_push(int **ids, int *n, int id);

/* ---- string -> id map (open addressing; keys are borrowed pointers) ---- */

struct tok_strmap_slot {
    const char *key; /* NULL: empty */
    uint32_t len;
    int32_t val;
    uint64_t hash;
};

struct tok_strmap {
    struct tok_strmap_slot *slots;
    size_t cap, n; /* cap is a power of two */
};

int tok_strmap_init(struct tok_strmap *m, size_t expected);
/* Inserts key -> val unless key is already there (the first id wins). The
 * key bytes must outlive the map. Returns 0, or -1 on OOM. */
int tok_strmap_put(struct tok_strmap *m, const char *key, size_t len, int val);
int tok_strmap_get(const struct tok_strmap *m, const char *key, size_t len); /* -1 if absent */
void tok_strmap_free(struct tok_strmap *m);

/* ---- (id, id) -> (rank, merged id) map for BPE merges ---- */

struct tok_pairmap_slot {
    uint64_t key; /* (a << 32 | b) + 1; 0: empty */
    int32_t rank;
    int32_t id;
};

struct tok_pairmap {
    struct tok_pairmap_slot *slots;
    size_t cap, n;
};

int tok_pairmap_init(struct tok_pairmap *m, size_t expected);
int tok_pairmap_put(struct tok_pairmap *m, int a, int b, int rank, int id); /* keeps the first */
/* Returns true and fills rank/id when the pair merges. */
bool tok_pairmap_get(const struct tok_pairmap *m, int a, int b, int *rank, int *id);
void tok_pairmap_free(struct tok_pairmap *m);

/* ---- trie of added/special token strings, leftmost-longest matching ---- */

struct tok_trie_node {
    int first_child, next_sibling;
    int value; /* index of the token ending here, or -1 */
    unsigned char byte;
};

struct tok_trie {
    struct tok_trie_node *nodes;
    int n, cap;
    bool first_byte[256];
};

int tok_trie_init(struct tok_trie *tr);
int tok_trie_add(struct tok_trie *tr, const char *s, size_t n, int value);
/* Finds the leftmost position in s[from, n) where some key starts, taking the
 * longest key there. Returns the start offset (or -1) and fills mlen and value. */
long tok_trie_find(const struct tok_trie *tr, const char *s, size_t n, size_t from,
                   size_t *mlen, int *value);
void tok_trie_free(struct tok_trie *tr);

/* ---- UTF-8 ---- */

/* Length of the UTF-8 sequence that starts at s (1 for invalid lead bytes or
 * a sequence cut short by n), never more than n. */
size_t tok_utf8_seq_len(const unsigned char *s, size_t n);
/* The code point at s (len gets its byte length; an invalid byte decodes
 * as itself with length 1), the one that ends at s + n, and its encoding
 * (up to 4 bytes written to out). */
uint32_t tok_utf8_next(const char *s, size_t n, size_t *len);
uint32_t tok_utf8_prev(const char *s, size_t n, size_t *len);
size_t tok_utf8_put(uint32_t cp, char *out);
/* Well-formed UTF-8? */
bool tok_utf8_valid(const char *s, size_t n);
/* Appends s with every maximal ill-formed subpart replaced by U+FFFD. */
int tok_utf8_sanitize(const char *s, size_t n, struct tok_buf *out);

/* ---- Unicode classes and normalization (tok_unicode.c) ---- */

bool tok_cp_is_space(uint32_t cp);   /* White_Space (Rust char::is_whitespace) */
bool tok_cp_is_numeric(uint32_t cp); /* Nd, Nl, No (Rust char::is_numeric) */
bool tok_cp_is_punct(uint32_t cp);   /* ASCII punctuation or P* */
bool tok_cp_is_word(uint32_t cp);    /* \w: letters, marks, Nd, Nl, Pc, ZWJ/ZWNJ */
bool tok_cp_is_other(uint32_t cp);   /* C* (control, format, unassigned, ...) */
bool tok_cp_is_mark(uint32_t cp, bool nonspacing_only); /* M* (or only Mn) */
bool tok_cp_is_cjk(uint32_t cp);     /* CJK ideographs as BERT defines them */

enum tok_nf { TOK_NF_C, TOK_NF_D, TOK_NF_KC, TOK_NF_KD };
/* Appends the normalization form of s (valid UTF-8) to out; -1 on OOM. */
int tok_nf_apply(enum tok_nf f, const char *s, size_t n, struct tok_buf *out);
/* Appends s lowercased as Rust's char::to_lowercase does; -1 on OOM. */
int tok_lower_apply(const char *s, size_t n, struct tok_buf *out);

/* GPT-2's byte-level alphabet: the character that stands for byte b, and
 * the byte a character stands for (-1 for characters outside it). */
uint32_t tok_bytelevel_cp(unsigned b);
int tok_bytelevel_byte(uint32_t cp);

/* ---- regular expressions (tok_regex.c, PCRE2) ---- */

struct tok_regex;
/* Compiles a tokenizer.json (Oniguruma) pattern; NULL with a message. */
struct tok_regex *tok_regex_new(const char *pat, size_t len, struct err *e);
void tok_regex_free(struct tok_regex *re);
/* Per-call matching state; zero-initialize, free with tok_rx_scratch_free. */
struct tok_rx_scratch {
    void *md, *mctx, *jit_stack;
};
void tok_rx_scratch_free(struct tok_rx_scratch *sc);
/* Finds the leftmost match in s[0, n) at or after `from` (s is the whole
 * subject: look-around sees nothing outside it). Returns 1 and the match
 * [*ms, *me), 0 when there is none, -1 with a message. */
int tok_regex_next(const struct tok_regex *re, const char *s, size_t n, size_t from, size_t *ms,
                   size_t *me, struct tok_rx_scratch *sc, struct err *e);

/* ---- the tokenizer ---- */

enum tok_kind {
    TOK_KIND_LLAMA2C, /* tok*.bin: per-codepoint ids, score merges */
    TOK_KIND_SPM,     /* SentencePiece vocab (GGUF "llama"): score merges */
    TOK_KIND_HF_BPE,  /* tokenizer.json, BPE model with rank-ordered merges */
};

enum {
    TOK_ATTR_SPECIAL = 1, /* hidden by skip_special (BOS/EOS/control/unk) */
    TOK_ATTR_BYTE = 2,    /* <0xXX>: decodes to one raw byte */
    TOK_ATTR_MATCH = 4,   /* matched as a whole string in the input (GGUF) */
};

/* How the first token's leading space is removed when decoding. */
enum tok_strip {
    TOK_STRIP_NONE,
    TOK_STRIP_AFTER_BOS, /* llama2.c run.c: strip when the previous id is BOS */
    TOK_STRIP_AT_START,  /* SentencePiece/HF Strip decoder: strip the start of the text */
    TOK_STRIP_FIRST_ALL, /* HF Metaspace decoder: no spaces at all in the first token */
};

/* An HF tokenizer.json added token. */
struct tok_added {
    const char *content; /* matched text (normalized content when normalized) */
    size_t len;
    int id;
    bool special, lstrip, rstrip, normalized, single_word;
};

/* How a split's pieces are kept (HF SplitDelimiterBehavior). */
enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS
};

/* One step of the HF normalizer (applied in order). */
struct tok_norm_step {
    enum {
        TOK_NORM_PREPEND,     /* a before non-empty text */
        TOK_NORM_REPLACE,     /* every a (or match of re) -> b */
        TOK_NORM_NF,          /* Unicode normalization form nf */
        TOK_NORM_LOWERCASE,
        TOK_NORM_STRIP,       /* whitespace at the left and/or right */
        TOK_NORM_STRIP_ACCENTS, /* drop combining marks */
        TOK_NORM_BERT,        /* BertNormalizer */
    } kind;
    const char *a; /* prepend text, or the string pattern */
    const char *b; /* replacement content */
    size_t alen, blen;
    struct tok_regex *re; /* Replace with a Regex pattern */
    enum tok_nf nf;
    bool left, right;     /* Strip */
    bool clean_text, chinese_chars, strip_accents, lowercase; /* Bert */
};

/* One step of the HF pre-tokenizer (applied in order). */
struct tok_pre_step {
    enum {
        TOK_PRE_METASPACE,
        TOK_PRE_SPLIT,     /* on a string or a regex */
        TOK_PRE_CHARS,     /* on characters of a class (Digits, Punctuation, ...) */
        TOK_PRE_BYTELEVEL, /* prefix space, GPT-2 regex, then bytes as characters */
    } kind;
    /* Metaspace */
    const char *repl; /* "▁" */
    size_t repl_len;
    enum { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER } prepend;
    bool split;
    /* Split / chars */
    const char *pat;      /* string pattern (NULL for regex and chars) */
    size_t pat_len;
    struct tok_regex *re; /* regex pattern; also ByteLevel's GPT-2 regex */
    enum { TOK_CC_DIGIT, TOK_CC_PUNCT, TOK_CC_SPACE } cls;
    bool invert;
    enum tok_split_behavior behavior;
    /* ByteLevel */
    bool add_prefix_space;
    /* Runs after ByteLevel: sees each byte as its byte-level character */
    bool mapped;
};

struct tokenizer {
    enum tok_kind kind;
    int n_vocab;
    char **pieces;       /* [n_vocab] raw pieces (arena), NULL for unused ids */
    uint32_t *piece_len; /* [n_vocab] */
    char **dec;          /* [n_vocab] decoded text (arena), for non-byte ids */
    uint32_t *dec_len;
    uint8_t *attr;       /* [n_vocab] TOK_ATTR_* */
    uint8_t *byte_val;   /* [n_vocab] value of a TOK_ATTR_BYTE id */
    float *scores;       /* [n_vocab] SentencePiece scores (llama2c, SPM), else NULL */
    int byte_id[256];    /* id of <0xXX>, or -1 */
    int bos, eos, unk;
    size_t max_dec_len;
    enum tok_strip strip;
    struct tok_strmap vocab;
    struct tok_arena arena;
    char path[512]; /* the file it came from, for messages */

    /* When no piece has this mark after a character that is not the mark
     * itself, no merge can cross the start of a run of marks: text is cut
     * there and merged word by word (same ids, far smaller heaps). */
    const char *split_mark; /* "▁" or " " */
    size_t split_mark_len;

    /* SentencePiece-style (llama2c, SPM) */
    bool add_bos, add_eos;
    bool add_space_prefix; /* dummy " " before the text */
    bool escape_spaces;    /* spaces become U+2581 (SPM; not llama2c) */

    /* HF tokenizer.json */
    bool wordpiece;      /* model WordPiece (else BPE) */
    struct tok_pairmap merges;
    bool byte_fallback, ignore_merges, fuse_unk;
    bool unk_missing;    /* unk_token named but not in the vocab: encode fails on use */
    /* ByteLevel pre-tokenizer: the model works on raw bytes. Pieces are
     * stored as in the file ("Ġhello"); bvocab maps their bytes (" hello")
     * to ids and byte_tok[b] is the id of the one-byte piece. */
    bool byte_level;
    struct tok_strmap bvocab;
    int byte_tok[256];
    const char *cont_prefix, *eow_suffix; /* continuing_subword_prefix, end_of_word_suffix */
    size_t cont_prefix_len, eow_suffix_len;
    int wp_max_chars;    /* WordPiece max_input_chars_per_word */
    bool needs_utf8;     /* regex or Unicode normalizer: input made valid UTF-8 first */
    struct tok_added *added;
    int n_added;
    struct tok_trie trie_raw;  /* added tokens with normalized == false */
    struct tok_trie trie_norm; /* added tokens with normalized == true */
    struct tok_norm_step *norm;
    int n_norm;
    struct tok_pre_step *pre;
    int n_pre;
    int *prefix_ids, n_prefix; /* post_processor: before the sequence */
    int *suffix_ids, n_suffix; /* ... and after it */

    /* GGUF SPM: control/user-defined tokens matched in the input */
    struct tok_trie trie_special;
};

/* Allocates a zeroed tokenizer with n_vocab ids and the per-id arrays. */
struct tokenizer *tok_alloc(enum tok_kind kind, int n_vocab, const char *path,
                            struct err *e);
/* Stores piece `id` (copied into the arena); decoded text defaults to it. */
int tok_set_piece(struct tokenizer *t, int id, const char *s, size_t n);
/* Fills byte_id/attr for ids whose piece is exactly <0xXX>. */
void tok_mark_byte_pieces(struct tokenizer *t);
/* Builds the piece -> id map over every stored piece. */
int tok_build_vocab_map(struct tokenizer *t);
/* Sets the decoded text of id (copied). */
int tok_set_dec(struct tokenizer *t, int id, const char *s, size_t n);
/* Recomputes max_dec_len after the decoded texts are final. */
void tok_finish(struct tokenizer *t);

/* Scratch memory of one encode call, reused across words; also a cache of
 * the ids of words seen in this call (most words of a text repeat). */
struct tok_wcache_slot {
    uint64_t hash; /* 0: empty */
    uint32_t key_off, key_len, ids_off, n_ids;
};
struct tok_wcache {
    struct tok_wcache_slot *slots;
    size_t cap, n;
    struct tok_buf keys;
    struct tok_ivec ids;
};
/* Scratch memory of one encode call, reused across words. */
struct tok_sym {
    int start, len; /* bytes of the text this symbol covers */
    int prev, next; /* neighbours in the live list, -1 at the ends */
    int id;         /* vocab id, -1 when not (yet) known */
    bool frozen;    /* never merges (llama2.c byte-fallback symbols) */
};
struct tok_heap_ent {
    uint64_t key; /* priority (rank, or score made ascending) << 32 | left */
    int right, rlen;
};
struct tok_work {
    struct tok_sym *syms;
    size_t syms_cap;
    struct tok_heap_ent *heap;
    size_t heap_n, heap_cap;
    struct tok_wcache cache;
    struct tok_buf key; /* scratch for prefixed/suffixed lookups */
};
void tok_work_free(struct tok_work *w);

/* Sets split_mark when the vocabulary allows cutting text before it. */
void tok_check_split_mark(struct tokenizer *t, const char *mark, size_t len);

/* Score-ordered merging (SentencePiece / llama2.c) of text s[0, n): one
 * symbol per UTF-8 character; characters not in the vocab become byte ids
 * up front when bytes_first (llama2.c) or after merging (SPM). Appends ids. */
int tok_spm_encode(const struct tokenizer *t, const char *s, size_t n, bool bytes_first,
                   struct tok_work *w, struct tok_ivec *out, struct err *e);

/* The model (BPE or WordPiece, HF semantics) on one pre-token s[0, n):
 * raw bytes when t->byte_level. Appends ids. */
int tok_bpe_word(const struct tokenizer *t, const char *s, size_t n, struct tok_work *w,
                 struct tok_ivec *out, struct err *e);
int tok_wordpiece_word(const struct tokenizer *t, const char *s, size_t n, struct tok_work *w,
                       struct tok_ivec *out, struct err *e);

/* ---- HF normalizer and pre-tokenizer (hf_norm.c, hf_pretok.c) ---- */

struct json_t;
/* A tokenizer.json-shaped description: root holds the pipeline; the
 * vocabulary and merges may come as arrays instead (GGUF metadata). */
struct tok_hf_src {
    struct json_t *root;
    char **tokens; /* pieces by id, instead of model.vocab (NULL: use it) */
    int n_tokens;
    char **merges; /* "a b" strings, instead of model.merges */
    int n_merges;
    int bos, eos;     /* >= 0: these ids instead of guessing from names */
    bool read_config; /* apply tokenizer_config.json next to path */
};
struct tokenizer *tok_load_hf_src(const struct tok_hf_src *src, const char *path, struct err *e);
/* tokenizer.json parsing helpers shared by the normalizer, pre-tokenizer and
 * decoder parsers. */
const char *tok_json_str(struct json_t *o, const char *key);
bool tok_json_bool(struct json_t *o, const char *key, bool dflt);
/* Copies a JSON string into the tokenizer's arena (NULL when out of memory). */
char *tok_arena_jstr(struct tokenizer *t, struct json_t *s, size_t *len);
/* A Replace step (normalizer or decoder, named by `what` in messages):
 * pattern {String|Regex} -> content. A String pattern goes to a and alen,
 * a Regex to re; the content goes to b and blen. */
int tok_parse_replace(struct tokenizer *t, struct json_t *node, const char *what, const char **a,
                      size_t *alen, const char **b, size_t *blen, struct tok_regex **re,
                      struct err *e);

int tok_parse_metaspace(struct tokenizer *t, struct json_t *node, const char **repl, size_t *rlen,
                        int *prepend, struct err *e);
int tok_parse_normalizer(struct tokenizer *t, struct json_t *node, struct err *e);
int tok_parse_pre_tokenizer(struct tokenizer *t, struct json_t *node, struct err *e);
void tok_free_steps(struct tokenizer *t);

/* Normalizes s[0, n) into out (replaced); tmp is scratch. */
int tok_normalize(const struct tokenizer *t, const char *s, size_t n, struct tok_buf *out,
                  struct tok_buf *tmp, struct tok_rx_scratch *rx, struct err *e);

struct tok_span {
    size_t off, len;
};
struct tok_spans {
    struct tok_span *p;
    size_t n, cap;
};
/* Pre-tokenizer scratch; after tok_pretokenize the pieces are spans of buf. */
struct tok_pre_ctx {
    struct tok_buf buf, buf2;
    struct tok_spans sp, sp2;
    void *segs; /* matcher output, reused */
    size_t segs_cap;
    struct tok_buf mapped; /* a span as byte-level characters */
    uint32_t *moff;        /* mapped offset -> byte offset in the span */
    size_t moff_cap;
    struct tok_rx_scratch rx;
};
/* Splits s[0, n) into pieces; first: s starts the input (Metaspace
 * prepend_scheme "first"). */
int tok_pretokenize(const struct tokenizer *t, const char *s, size_t n, bool first,
                    struct tok_pre_ctx *c, struct err *e);
void tok_pre_ctx_free(struct tok_pre_ctx *c);
int tok_spans_push(struct tok_spans *s, size_t off, size_t len); /* drops empty pieces */

uint64_t tok_hash_bytes(const char *s, size_t n);

/* Kind-specific encoders (tok_encode dispatches). */
int tok_llama2c_encode(const struct tokenizer *t, const char *text, size_t len,
                       bool add_special, struct tok_ivec *out, struct err *e);
int tok_spm_encode_text(const struct tokenizer *t, const char *text, size_t len,
                        bool add_special, struct tok_ivec *out, struct err *e);
int tok_hf_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                  struct tok_ivec *out, struct err *e);

#endif
