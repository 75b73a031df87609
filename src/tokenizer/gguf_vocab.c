/* gguf_vocab.c - tokenizers from GGUF tokenizer.ggml.* metadata. A
 * SentencePiece vocabulary ("llama": tokens, scores, token types) has its
 * own encoder here: control and user-defined tokens are matched as whole
 * strings, each remaining text fragment gets a "▁" prefix when it starts
 * the text or follows such a token, spaces become "▁", then best-score pair
 * merging over characters, with <0xXX> byte ids for characters that have no
 * piece. Byte-level BPE ("gpt2") and WordPiece ("bert") vocabularies are
 * described as the tokenizer.json pipeline of their model family and go
 * through the tokenizer.json loader. */
#include "model/gguf.h"
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GGUF token types (llama.cpp's convention) */
enum {
    GGUF_TT_NORMAL = 1,
    GGUF_TT_UNKNOWN = 2,
    GGUF_TT_CONTROL = 3,
    GGUF_TT_USER_DEFINED = 4,
    GGUF_TT_UNUSED = 5,
    GGUF_TT_BYTE = 6,
};

static const char SPACE_MARK[] = "\xe2\x96\x81"; /* U+2581 */

/* Copies s with each "▁" turned into " " (into the arena). */
static int set_dec_unescaped(struct tokenizer *t, int id)
{
    const char *s = t->pieces[id];
    size_t n = t->piece_len[id];
    if (!memmem(s, n, SPACE_MARK, 3))
        return 0;
    struct tok_buf b = {0};
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && memcmp(s + i, SPACE_MARK, 3) == 0) {
            if (tok_buf_put(&b, " ", 1))
                goto oom;
            i += 3;
        } else {
            if (tok_buf_put(&b, s + i, 1))
                goto oom;
            i++;
        }
    }
    int rc = tok_set_dec(t, id, b.p, b.n);
    free(b.p);
    return rc;
oom:
    free(b.p);
    return -1;
}

struct tokenizer *tok_load_gguf_vocab(char **tokens, const float *scores, const int *token_types,
                                      int n, int bos, int eos, bool add_bos, struct err *e)
{
    if (!tokens || !scores) {
        err_set(e, "GGUF tokenizer: tokenizer.ggml.tokens and .scores are required for a "
                   "\"llama\" (SentencePiece) vocabulary");
        return NULL;
    }
    struct tokenizer *t = tok_alloc(TOK_KIND_SPM, n, "GGUF tokenizer", e);
    if (!t)
        return NULL;
    t->scores = malloc((size_t)n * sizeof *t->scores);
    if (!t->scores || tok_trie_init(&t->trie_special))
        goto oom;
    for (int id = 0; id < n; id++) {
        const char *s = tokens[id] ? tokens[id] : "";
        if (tok_set_piece(t, id, s, strlen(s)))
            goto oom;
        t->scores[id] = scores[id];
    }
    if (tok_build_vocab_map(t))
        goto oom;
    for (int id = 0; id < n; id++) {
        int tt = token_types ? token_types[id] : GGUF_TT_NORMAL;
        if (tt == GGUF_TT_BYTE || !token_types) {
            /* byte pieces are <0xXX>; without types, recognise them by name */
            const char *p = t->pieces[id];
            if (t->piece_len[id] == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>') {
                unsigned v = (unsigned)strtoul(p + 3, NULL, 16);
                t->attr[id] |= TOK_ATTR_BYTE;
                t->byte_val[id] = (uint8_t)v;
                if (t->byte_id[v & 255] < 0)
                    t->byte_id[v & 255] = id;
            }
        }
        if (tt == GGUF_TT_CONTROL || tt == GGUF_TT_UNKNOWN || tt == GGUF_TT_UNUSED)
            t->attr[id] |= TOK_ATTR_SPECIAL;
        if (tt == GGUF_TT_UNKNOWN && t->unk < 0)
            t->unk = id;
        if (tt == GGUF_TT_CONTROL || tt == GGUF_TT_USER_DEFINED || tt == GGUF_TT_UNKNOWN) {
            t->attr[id] |= TOK_ATTR_MATCH;
            if (tok_trie_add(&t->trie_special, t->pieces[id], t->piece_len[id], id))
                goto oom;
        }
        if (!(t->attr[id] & TOK_ATTR_BYTE) && set_dec_unescaped(t, id))
            goto oom;
    }
    t->bos = bos >= 0 && bos < n ? bos : -1;
    t->eos = eos >= 0 && eos < n ? eos : -1;
    if (t->bos >= 0)
        t->attr[t->bos] |= TOK_ATTR_SPECIAL;
    if (t->eos >= 0)
        t->attr[t->eos] |= TOK_ATTR_SPECIAL;
    t->add_bos = add_bos;
    t->add_space_prefix = true;
    t->escape_spaces = true;
    t->strip = TOK_STRIP_AT_START;
    tok_check_split_mark(t, SPACE_MARK, 3);
    tok_finish(t);
    return t;
oom:
    err_set(e, "GGUF tokenizer: out of memory");
    tok_free(t);
    return NULL;
}

void tok_set_add_space_prefix(struct tokenizer *t, bool on)
{
    if (t->kind != TOK_KIND_SPM)
        return;
    t->add_space_prefix = on;
    t->strip = on ? TOK_STRIP_AT_START : TOK_STRIP_NONE;
}

/* One fragment: optional "▁" prefix, spaces -> "▁", then merging. */
static int spm_fragment(const struct tokenizer *t, const char *s, size_t n, bool prefix,
                        struct tok_buf *b, struct tok_work *w, struct tok_ivec *out,
                        struct err *e)
{
    b->n = 0;
    if (prefix && tok_buf_put(b, t->escape_spaces ? SPACE_MARK : " ", t->escape_spaces ? 3 : 1))
        return err_set(e, "out of memory");
    size_t run = 0; /* copy runs without spaces in one go */
    for (size_t i = 0; i <= n; i++) {
        if (i == n || (s[i] == ' ' && t->escape_spaces)) {
            if (tok_buf_put(b, s + run, i - run))
                return err_set(e, "out of memory");
            if (i < n && tok_buf_put(b, SPACE_MARK, 3))
                return err_set(e, "out of memory");
            run = i + 1;
        }
    }
    return tok_spm_encode(t, b->p, b->n, false, w, out, e);
}

int tok_spm_encode_text(const struct tokenizer *t, const char *text, size_t len,
                        bool add_special, struct tok_ivec *out, struct err *e)
{
    if (add_special && t->add_bos && t->bos >= 0 && tok_ivec_push(out, t->bos))
        return err_set(e, "out of memory");
    struct tok_buf b = {0};
    struct tok_work w = {0};
    int rc = 0;
    bool prev_special = true; /* the first fragment gets the prefix too */
    size_t pos = 0;
    while (pos < len && rc == 0) {
        size_t mlen = 0;
        int id = -1;
        long m = tok_trie_find(&t->trie_special, text, len, pos, &mlen, &id);
        size_t end = m < 0 ? len : (size_t)m;
        if (end > pos) {
            rc = spm_fragment(t, text + pos, end - pos, t->add_space_prefix && prev_special, &b,
                              &w, out, e);
            prev_special = false;
        }
        if (m < 0 || rc)
            break;
        if (tok_ivec_push(out, id))
            rc = err_set(e, "out of memory");
        prev_special = true;
        pos = end + mlen;
    }
    free(b.p);
    tok_work_free(&w);
    if (rc)
        return -1;
    if (add_special && t->add_eos && t->eos >= 0 && tok_ivec_push(out, t->eos))
        return err_set(e, "out of memory");
    return 0;
}

/* ---- byte-level BPE ("gpt2") and WordPiece ("bert") vocabularies ----
 *
 * tokenizer.ggml.pre names the model family whose pre-tokenizer to use.
 * Each family below is described as the tokenizer.json pipeline its Hugging
 * Face tokenizer has (that tokenizer is the oracle), and the vocabulary then
 * goes through the same loader as tokenizer.json. */

/* Llama 3's pattern; Qwen2's is the same with single digits. */
#define LLAMA3_RE                                                                              \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+" \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_RE                                                                               \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"    \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* CJK ideographs, the range U+0800..U+4E00 and Hangul (DeepSeek) */
#define DEEPSEEK_CJK_RE "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"

enum pre_shape {
    PRE_SPLITS,          /* Split(regex, Isolated) for each regex, then ByteLevel */
    PRE_GPT2,            /* ByteLevel with the GPT-2 regex */
    PRE_DIGITS_GPT2,     /* Digits(individual), then ByteLevel with the GPT-2 regex */
    PRE_FALCON,          /* Punctuation, ByteLevel+regex, Digits, Split [0-9]{3} */
};

struct pre_def {
    const char *names; /* tokenizer.ggml.pre values, '|'-separated */
    enum pre_shape shape;
    bool nfc, ignore_merges;
    const char *re[6];
};

static const struct pre_def PRE_DEFS[] = {
    {"llama-bpe|llama3|llama-v3|falcon3", PRE_SPLITS, false, true, {LLAMA3_RE}},
    {"dbrx|smaug-bpe", PRE_SPLITS, false, false, {LLAMA3_RE}},
    {"qwen2|deepseek-r1-qwen", PRE_SPLITS, true, false, {QWEN2_RE}},
    {"deepseek-llm",
     PRE_SPLITS,
     false,
     false,
     {"[\\r\\n]",
      "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
      "\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
      "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-"
      "\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15"
      "\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-"
      "\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec"
      "\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
      "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b"
      "\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787"
      "\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-"
      "\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-"
      "\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
      "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", "\\s+$",
      DEEPSEEK_CJK_RE, "\\p{N}+"}},
    {"deepseek-coder",
     PRE_SPLITS,
     false,
     false,
     {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", DEEPSEEK_CJK_RE, "\\p{N}"}},
    {"deepseek-v3",
     PRE_SPLITS,
     false,
     false,
     {"\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}"
      "\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"tekken",
     PRE_SPLITS,
     false,
     false,
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
      "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"gpt-4o",
     PRE_SPLITS,
     false,
     false,
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
      "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}"
      "\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"gpt-2|phi-2|default", PRE_GPT2, false, false, {NULL}},
    {"mpt", PRE_GPT2, true, false, {NULL}},
    {"starcoder|refact|smollm|codeshell|command-r", PRE_DIGITS_GPT2, false, false, {NULL}},
    {"falcon", PRE_FALCON, false, false, {NULL}},
};

static bool name_in(const char *names, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = names; *p;) {
        const char *bar = strchr(p, '|');
        size_t k = bar ? (size_t)(bar - p) : strlen(p);
        if (k == n && memcmp(p, name, n) == 0)
            return true;
        if (!bar)
            break;
        p = bar + 1;
    }
    return false;
}

static json_t *jobj(const char *type)
{
    json_t *o = json_object();
    if (o)
        json_object_set_new(o, "type", json_string(type));
    return o;
}

static json_t *split_isolated(const char *re)
{
    json_t *o = jobj("Split");
    json_t *pat = json_object();
    json_object_set_new(pat, "Regex", json_string(re));
    json_object_set_new(o, "pattern", pat);
    json_object_set_new(o, "behavior", json_string("Isolated"));
    return o;
}

static json_t *byte_level(bool use_regex)
{
    json_t *o = jobj("ByteLevel");
    json_object_set_new(o, "add_prefix_space", json_false());
    json_object_set_new(o, "use_regex", json_boolean(use_regex));
    return o;
}

/* The pre_tokenizer of a family, as tokenizer.json would spell it. */
static json_t *pre_json(const struct pre_def *d)
{
    json_t *seq = json_array();
    json_t *o;
    switch (d->shape) {
    case PRE_SPLITS:
        for (int i = 0; i < 6 && d->re[i]; i++)
            json_array_append_new(seq, split_isolated(d->re[i]));
        json_array_append_new(seq, byte_level(false));
        break;
    case PRE_GPT2:
        json_array_append_new(seq, byte_level(true));
        break;
    case PRE_DIGITS_GPT2:
        o = jobj("Digits");
        json_object_set_new(o, "individual_digits", json_true());
        json_array_append_new(seq, o);
        json_array_append_new(seq, byte_level(true));
        break;
    case PRE_FALCON:
        o = jobj("Punctuation");
        json_object_set_new(o, "behavior", json_string("Contiguous"));
        json_array_append_new(seq, o);
        json_array_append_new(seq, byte_level(true));
        o = jobj("Digits");
        json_object_set_new(o, "individual_digits", json_false());
        json_array_append_new(seq, o);
        json_array_append_new(seq, split_isolated("[0-9][0-9][0-9]"));
        break;
    }
    json_t *pre = jobj("Sequence");
    json_object_set_new(pre, "pretokenizers", seq);
    return pre;
}

/* Control and user-defined tokens are matched in the text as HF's added
 * tokens are (control ones are special). */
static json_t *added_json(const struct gguf_vocab *v, const char *const *pieces)
{
    json_t *arr = json_array();
    for (int id = 0; v->token_type && id < v->n_tokens; id++) {
        int tt = v->token_type[id];
        if (tt != GGUF_TT_CONTROL && tt != GGUF_TT_USER_DEFINED)
            continue;
        json_t *a = json_object();
        json_object_set_new(a, "id", json_integer(id));
        json_object_set_new(a, "content", json_string(pieces[id] ? pieces[id] : ""));
        json_object_set_new(a, "special", json_boolean(tt == GGUF_TT_CONTROL));
        json_object_set_new(a, "normalized", json_false());
        json_array_append_new(arr, a);
    }
    return arr;
}

static struct tokenizer *load_gguf_bpe(const struct gguf_vocab *v, const char *path, struct err *e)
{
    const char *pre = v->pre[0] ? v->pre : "default";
    const struct pre_def *d = NULL;
    for (size_t i = 0; i < sizeof PRE_DEFS / sizeof PRE_DEFS[0] && !d; i++)
        if (name_in(PRE_DEFS[i].names, pre))
            d = &PRE_DEFS[i];
    if (!d) {
        err_set(e, "%s: GGUF pre-tokenizer \"%s\" is not supported", path, pre);
        return NULL;
    }
    if (!v->merges) {
        err_set(e, "%s: a \"gpt2\" vocabulary needs tokenizer.ggml.merges", path);
        return NULL;
    }
    json_t *root = json_object();
    json_t *model = jobj("BPE");
    json_object_set_new(model, "ignore_merges", json_boolean(d->ignore_merges));
    json_object_set_new(root, "model", model);
    if (d->nfc)
        json_object_set_new(root, "normalizer", jobj("NFC"));
    json_object_set_new(root, "pre_tokenizer", pre_json(d));
    json_object_set_new(root, "decoder", jobj("ByteLevel"));
    json_object_set_new(root, "added_tokens", added_json(v, (const char *const *)v->tokens));
    struct tok_hf_src src = {.root = root,
                             .tokens = v->tokens,
                             .n_tokens = v->n_tokens,
                             .merges = v->merges,
                             .n_merges = v->n_merges,
                             .bos = v->bos_id,
                             .eos = v->eos_id};
    struct tokenizer *t = tok_load_hf_src(&src, path, e);
    json_decref(root);
    if (t && t->bos >= 0 && v->add_bos == 1 && tok_ids_push(&t->prefix_ids, &t->n_prefix, t->bos))
        goto oom;
    if (t && t->eos >= 0 && v->add_eos == 1 && tok_ids_push(&t->suffix_ids, &t->n_suffix, t->eos))
        goto oom;
    return t;
oom:
    tok_free(t);
    err_set(e, "%s: out of memory", path);
    return NULL;
}

/* llama.cpp stores BERT's WordPiece vocabulary with "##" dropped from
 * continuation pieces and "▁" put before word-initial ones ("[...]" tokens
 * unchanged); this undoes it. */
static struct tokenizer *load_gguf_bert(const struct gguf_vocab *v, const char *path, struct err *e)
{
    char **pieces = calloc((size_t)v->n_tokens, sizeof *pieces);
    struct tokenizer *t = NULL;
    json_t *root = NULL;
    if (!pieces)
        goto oom;
    for (int id = 0; id < v->n_tokens; id++) {
        const char *s = v->tokens[id] ? v->tokens[id] : "";
        size_t n = strlen(s);
        bool bracket = n >= 2 && s[0] == '[' && s[n - 1] == ']';
        bool word = n >= 3 && memcmp(s, SPACE_MARK, 3) == 0;
        pieces[id] = malloc(n + 3);
        if (!pieces[id])
            goto oom;
        if (bracket)
            memcpy(pieces[id], s, n + 1);
        else if (word)
            memcpy(pieces[id], s + 3, n - 2);
        else
            snprintf(pieces[id], n + 3, "##%s", s);
    }
    root = json_object();
    json_t *model = jobj("WordPiece");
    int unk = v->unk_id >= 0 && v->unk_id < v->n_tokens ? v->unk_id : -1;
    json_object_set_new(model, "unk_token", json_string(unk >= 0 ? pieces[unk] : "[UNK]"));
    json_object_set_new(model, "continuing_subword_prefix", json_string("##"));
    json_object_set_new(model, "max_input_chars_per_word", json_integer(100));
    json_object_set_new(root, "model", model);
    json_t *norm = jobj("BertNormalizer");
    json_object_set_new(norm, "lowercase", json_true());
    json_object_set_new(root, "normalizer", norm);
    json_object_set_new(root, "pre_tokenizer", jobj("BertPreTokenizer"));
    json_object_set_new(root, "decoder", jobj("WordPiece"));
    json_object_set_new(root, "added_tokens", added_json(v, (const char *const *)pieces));
    struct tok_hf_src src = {.root = root,
                             .tokens = pieces,
                             .n_tokens = v->n_tokens,
                             .bos = -1,
                             .eos = -1};
    t = tok_load_hf_src(&src, path, e);
    if (t) {
        /* [CLS] text [SEP] */
        int cls = tok_piece_to_id(t, "[CLS]");
        int sep = v->sep_id >= 0 && v->sep_id < t->n_vocab ? v->sep_id : tok_piece_to_id(t, "[SEP]");
        if ((cls >= 0 && tok_ids_push(&t->prefix_ids, &t->n_prefix, cls)) ||
            (sep >= 0 && tok_ids_push(&t->suffix_ids, &t->n_suffix, sep))) {
            tok_free(t);
            t = NULL;
            goto oom;
        }
        t->bos = cls;
        t->eos = sep;
    }
    goto done;
oom:
    err_set(e, "%s: out of memory", path);
done:
    json_decref(root);
    for (int id = 0; pieces && id < v->n_tokens; id++)
        free(pieces[id]);
    free(pieces);
    return t;
}

/* The tokenizer stored in a model .gguf's metadata: SentencePiece
 * ("llama"), byte-level BPE ("gpt2") or WordPiece ("bert"). */
struct tokenizer *tok_load_gguf_file(const char *path, struct err *e)
{
    struct gguf_vocab v;
    if (gguf_read_vocab(path, &v, e))
        return NULL;
    struct tokenizer *t = NULL;
    if (v.n_tokens == 0) {
        err_set(e, "%s: no tokenizer metadata (tokenizer.ggml.tokens); use --prompt-ids", path);
    } else if (strcmp(v.model, "llama") == 0) {
        t = tok_load_gguf_vocab(v.tokens, v.scores, v.token_type, v.n_tokens, v.bos_id, v.eos_id,
                                v.add_bos != 0, e);
        if (!t)
            err_wrap(e, "%s", path);
    } else if (strcmp(v.model, "gpt2") == 0) {
        t = load_gguf_bpe(&v, path, e);
    } else if (strcmp(v.model, "bert") == 0) {
        t = load_gguf_bert(&v, path, e);
    } else {
        err_set(e, "%s: GGUF tokenizer model \"%s\" is not supported (llama, gpt2 and bert are)",
                path, v.model);
    }
    gguf_vocab_free(&v);
    return t;
}
