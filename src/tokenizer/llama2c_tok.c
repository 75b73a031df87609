/* llama2c_tok.c - llama2.c's tok*.bin vocabulary and its encoder: BOS, a
 * dummy " " when the text is non-empty, one id per code point (bytes + 3 when
 * the code point has no piece), then best-score pair merging. */
#include "tokenizer/tok_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tokenizer *tok_load_llama2c(const char *tok_bin_path, int vocab_size, struct err *e)
{
    FILE *f = fopen(tok_bin_path, "rb");
    if (!f) {
        err_set(e, "%s: %s", tok_bin_path, strerror(errno));
        return NULL;
    }
    struct tokenizer *t = NULL;
    char *piece = NULL;
    float *scores = NULL;
    char **pieces = NULL;
    int *lens = NULL;
    int n = 0, cap = 0;
    int32_t max_len;
    if (fread(&max_len, sizeof max_len, 1, f) != 1 || max_len <= 0 || max_len > (1 << 20)) {
        err_set(e, "%s: not a llama2.c tokenizer (bad max_token_length)", tok_bin_path);
        goto fail;
    }
    /* vocab_size <= 0: the caller does not know it; read to the end */
    for (;;) {
        if (vocab_size > 0 && n == vocab_size)
            break;
        float score;
        int32_t len;
        size_t got = fread(&score, sizeof score, 1, f);
        if (got != 1) {
            if (vocab_size <= 0 && feof(f) && n > 0)
                break;
            err_set(e, "%s: truncated at token %d (expected %d tokens)", tok_bin_path, n,
                    vocab_size);
            goto fail;
        }
        if (fread(&len, sizeof len, 1, f) != 1 || len < 0 || len > max_len * 4 + 64) {
            err_set(e, "%s: bad length of token %d", tok_bin_path, n);
            goto fail;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            char **np = realloc(pieces, (size_t)cap * sizeof *np);
            if (np)
                pieces = np;
            float *ns = realloc(scores, (size_t)cap * sizeof *ns);
            if (ns)
                scores = ns;
            int *nl = realloc(lens, (size_t)cap * sizeof *nl);
            if (nl)
                lens = nl;
            if (!np || !ns || !nl) {
                err_set(e, "%s: out of memory", tok_bin_path);
                goto fail;
            }
        }
        piece = malloc((size_t)len + 1);
        if (!piece) {
            err_set(e, "%s: out of memory", tok_bin_path);
            goto fail;
        }
        if (len && fread(piece, 1, (size_t)len, f) != (size_t)len) {
            err_set(e, "%s: truncated in token %d", tok_bin_path, n);
            goto fail;
        }
        piece[len] = 0;
        pieces[n] = piece;
        piece = NULL;
        scores[n] = score;
        lens[n] = len;
        n++;
    }
    fclose(f);
    f = NULL;

    t = tok_alloc(TOK_KIND_LLAMA2C, n, tok_bin_path, e);
    if (!t)
        goto fail;
    t->scores = malloc((size_t)n * sizeof *t->scores);
    if (!t->scores)
        goto oom;
    for (int i = 0; i < n; i++) {
        if (tok_set_piece(t, i, pieces[i], (size_t)lens[i]))
            goto oom;
        t->scores[i] = scores[i];
    }
    tok_mark_byte_pieces(t);
    if (tok_build_vocab_map(t))
        goto oom;
    /* llama2.c's fixed layout: 0 <unk>, 1 BOS, 2 EOS */
    t->unk = 0;
    t->bos = n > 1 ? 1 : -1;
    t->eos = n > 2 ? 2 : -1;
    for (int i = 0; i < 3 && i < n; i++)
        t->attr[i] |= TOK_ATTR_SPECIAL;
    t->add_bos = true;
    t->add_eos = false;
    t->add_space_prefix = true;
    t->escape_spaces = false;
    t->strip = TOK_STRIP_AFTER_BOS;
    tok_check_split_mark(t, " ", 1);
    tok_finish(t);
    for (int i = 0; i < n; i++)
        free(pieces[i]);
    free(pieces);
    free(scores);
    free(lens);
    return t;

oom:
    err_set(e, "%s: out of memory", tok_bin_path);
fail:
    if (f)
        fclose(f);
    free(piece);
    for (int i = 0; i < n; i++)
        free(pieces[i]);
    free(pieces);
    free(scores);
    free(lens);
    tok_free(t);
    return NULL;
}

int tok_llama2c_encode(const struct tokenizer *t, const char *text, size_t len,
                       bool add_special, struct tok_ivec *out, struct err *e)
{
    if (add_special && t->add_bos && t->bos >= 0 && tok_ivec_push(out, t->bos))
        return err_set(e, "out of memory");
    if (len > 0) {
        /* the dummy prefix is an ordinary " " symbol in front: it may merge */
        struct tok_buf b = {0};
        struct tok_work w = {0};
        int rc = -1;
        if (tok_buf_put(&b, " ", t->add_space_prefix ? 1 : 0) || tok_buf_put(&b, text, len)) {
            err_set(e, "out of memory");
        } else {
            rc = tok_spm_encode(t, b.p, b.n, true, &w, out, e);
        }
        free(b.p);
        tok_work_free(&w);
        if (rc)
            return -1;
    }
    if (add_special && t->add_eos && t->eos >= 0 && tok_ivec_push(out, t->eos))
        return err_set(e, "out of memory");
    return 0;
}
