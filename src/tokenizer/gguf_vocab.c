/* gguf_vocab.c - a SentencePiece vocabulary handed over as arrays (GGUF
 * tokenizer.ggml.model == "llama": tokens, scores, token types) and its
 * encoder: control and user-defined tokens are matched as whole strings,
 * each remaining text fragment gets a "▁" prefix when it starts the text or
 * follows such a token, spaces become "▁", then best-score pair merging over
 * characters, with <0xXX> byte ids for characters that have no piece. */
#include "model/gguf.h"
#include "tokenizer/tok_internal.h"

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

/* The tokenizer stored in a model .gguf's metadata. Only SentencePiece
 * ("llama") vocabularies are handled so far; byte-level BPE ("gpt2") comes
 * with the byte-level tokenizer. */
struct tokenizer *tok_load_gguf_file(const char *path, struct err *e)
{
    struct gguf_vocab v;
    if (gguf_read_vocab(path, &v, e))
        return NULL;
    struct tokenizer *t = NULL;
    if (v.n_tokens == 0) {
        err_set(e, "%s: no tokenizer metadata (tokenizer.ggml.tokens); use --prompt-ids", path);
    } else if (strcmp(v.model, "llama")) {
        err_set(e, "%s: GGUF tokenizer model \"%s\" is not supported yet (only \"llama\")", path,
                v.model);
    } else {
        t = tok_load_gguf_vocab(v.tokens, v.scores, v.token_type, v.n_tokens, v.bos_id, v.eos_id,
                                v.add_bos != 0, e);
        if (!t)
            err_wrap(e, "%s", path);
    }
    gguf_vocab_free(&v);
    return t;
}
