/* tokenizer.c - what every tokenizer kind shares: the per-id tables, encode
 * dispatch, the streaming UTF-8-safe detokenizer, and finding the tokenizer
 * that belongs with a model path. */
#include "tokenizer/tok_internal.h"

#include "base/parse.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- construction ---- */

struct tokenizer *tok_alloc(enum tok_kind kind, int n_vocab, const char *path, struct err *e)
{
    if (n_vocab <= 0 || n_vocab > (1 << 26)) {
        err_set(e, "%s: implausible vocabulary size %d", path, n_vocab);
        return NULL;
    }
    struct tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        err_set(e, "%s: out of memory", path);
        return NULL;
    }
    t->kind = kind;
    t->n_vocab = n_vocab;
    t->bos = t->eos = t->unk = -1;
    snprintf(t->path, sizeof t->path, "%s", path);
    for (int i = 0; i < 256; i++)
        t->byte_id[i] = -1;
    size_t n = (size_t)n_vocab;
    t->pieces = calloc(n, sizeof *t->pieces);
    t->piece_len = calloc(n, sizeof *t->piece_len);
    t->dec = calloc(n, sizeof *t->dec);
    t->dec_len = calloc(n, sizeof *t->dec_len);
    t->attr = calloc(n, 1);
    t->byte_val = calloc(n, 1);
    if (!t->pieces || !t->piece_len || !t->dec || !t->dec_len || !t->attr || !t->byte_val) {
        tok_free(t);
        err_set(e, "%s: out of memory for %d tokens", path, n_vocab);
        return NULL;
    }
    return t;
}

int tok_set_piece(struct tokenizer *t, int id, const char *s, size_t n)
{
    char *p = tok_arena_strdup(&t->arena, s, n);
    if (!p)
        return -1;
    t->pieces[id] = p;
    t->piece_len[id] = (uint32_t)n;
    t->dec[id] = p;
    t->dec_len[id] = (uint32_t)n;
    return 0;
}

int tok_set_dec(struct tokenizer *t, int id, const char *s, size_t n)
{
    char *p = tok_arena_strdup(&t->arena, s, n);
    if (!p)
        return -1;
    t->dec[id] = p;
    t->dec_len[id] = (uint32_t)n;
    return 0;
}

void tok_mark_byte_pieces(struct tokenizer *t)
{
    for (int id = 0; id < t->n_vocab; id++) {
        const char *p = t->pieces[id];
        if (!p || t->piece_len[id] != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>')
            continue;
        int hi = hex_value(p[3]), lo = hex_value(p[4]);
        if (hi < 0 || lo < 0)
            continue;
        unsigned b = (unsigned)(hi * 16 + lo);
        t->attr[id] |= TOK_ATTR_BYTE;
        t->byte_val[id] = (uint8_t)b;
        if (t->byte_id[b] < 0)
            t->byte_id[b] = id;
    }
}

int tok_build_vocab_map(struct tokenizer *t)
{
    if (tok_strmap_init(&t->vocab, (size_t)t->n_vocab))
        return -1;
    for (int id = 0; id < t->n_vocab; id++)
        if (t->pieces[id] && tok_strmap_put(&t->vocab, t->pieces[id], t->piece_len[id], id))
            return -1;
    return 0;
}

void tok_finish(struct tokenizer *t)
{
    t->max_dec_len = 1;
    for (int id = 0; id < t->n_vocab; id++)
        if (t->dec[id] && t->dec_len[id] > t->max_dec_len)
            t->max_dec_len = t->dec_len[id];
}

void tok_free(struct tokenizer *t)
{
    if (!t)
        return;
    free(t->pieces);
    free(t->piece_len);
    free(t->dec);
    free(t->dec_len);
    free(t->attr);
    free(t->byte_val);
    free(t->scores);
    tok_strmap_free(&t->vocab);
    tok_pairmap_free(&t->merges);
    free(t->added);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    tok_trie_free(&t->trie_special);
    tok_free_steps(t);
    tok_strmap_free(&t->bvocab);
    free(t->prefix_ids);
    free(t->suffix_ids);
    tok_arena_free(&t->arena);
    free(t);
}

/* ---- queries ---- */

int tok_vocab_size(const struct tokenizer *t) { return t->n_vocab; }
int tok_bos_id(const struct tokenizer *t) { return t->bos; }
int tok_eos_id(const struct tokenizer *t) { return t->eos; }

const char *tok_piece(const struct tokenizer *t, int id)
{
    if (id < 0 || id >= t->n_vocab)
        return NULL;
    return t->pieces[id] ? t->pieces[id] : "";
}

int tok_piece_to_id(const struct tokenizer *t, const char *piece)
{
    size_t n = strlen(piece);
    int id = tok_strmap_get(&t->vocab, piece, n);
    for (int i = 0; id < 0 && i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].content, piece, n) == 0)
            id = t->added[i].id;
    return id;
}

bool tok_is_special(const struct tokenizer *t, int id)
{
    return id >= 0 && id < t->n_vocab && (t->attr[id] & TOK_ATTR_SPECIAL);
}

/* ---- encode ---- */

int tok_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
               int **ids, struct err *e)
{
    struct tok_ivec out = {0};
    int rc;
    *ids = NULL;
    switch (t->kind) {
    case TOK_KIND_LLAMA2C:
        rc = tok_llama2c_encode(t, text, len, add_special, &out, e);
        break;
    case TOK_KIND_SPM:
        rc = tok_spm_encode_text(t, text, len, add_special, &out, e);
        break;
    case TOK_KIND_HF_BPE:
        rc = tok_hf_encode(t, text, len, add_special, &out, e);
        break;
    default:
        rc = err_set(e, "%s: unknown tokenizer kind", t->path);
    }
    if (rc == 0 && out.n > (size_t)0x7fffffff)
        rc = err_set(e, "%s: too many tokens (%zu)", t->path, out.n);
    if (rc) {
        free(out.p);
        return -1;
    }
    if (!out.p) /* zero tokens: still hand back a freeable pointer */
        out.p = malloc(sizeof(int));
    if (!out.p)
        return err_set(e, "out of memory");
    *ids = out.p;
    return (int)out.n;
}

/* ---- streaming detokenizer ---- */

void detok_init(struct detok *d, const struct tokenizer *t, bool skip_special)
{
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->prev_id = -1;
    d->skip_special = skip_special;
}

size_t detok_max_bytes(const struct tokenizer *t)
{
    /* worst case: every byte of a piece (plus up to 3 held ones) is invalid
     * and becomes a 3-byte U+FFFD; one more for the NUL. */
    return 3 * (t->max_dec_len + 8) + 1;
}

struct outw {
    char *p;
    size_t cap, n;
};

static void out_put(struct outw *o, const void *s, size_t n)
{
    /* Keeps room for the NUL; drops what does not fit (callers size the
     * buffer with detok_max_bytes to never lose anything). */
    if (o->cap == 0 || o->n + n + 1 > o->cap)
        return;
    memcpy(o->p + o->n, s, n);
    o->n += n;
}

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Length of a complete, valid UTF-8 sequence at s, 0 when s[0,n) is a valid
 * but incomplete start, -k when the first k bytes are an invalid (maximal)
 * subpart that should become one U+FFFD. */
static int utf8_check(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    int want;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        want = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        want = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        want = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        return -1;
    }
    for (int i = 1; i < want; i++) {
        if ((size_t)i >= n)
            return 0;
        unsigned b = s[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h)
            return -i;
    }
    return want;
}

/* Emits the complete characters of pending + s, keeps an incomplete tail. */
static void detok_push(struct detok *d, const unsigned char *s, size_t n, struct outw *o)
{
    unsigned char buf[16];
    while (n > 0 || d->n_pending > 0) {
        /* work on pending bytes plus as much of s as a character can need */
        size_t np = (size_t)d->n_pending;
        if (np == 0) {
            /* fast path: run of ASCII / complete sequences straight from s */
            size_t i = 0;
            while (i < n) {
                int k = utf8_check(s + i, n - i);
                if (k <= 0)
                    break;
                i += (size_t)k;
            }
            out_put(o, s, i);
            s += i;
            n -= i;
            if (n == 0)
                return;
        }
        size_t take = n < 4 ? n : 4;
        memcpy(buf, d->pending, np);
        memcpy(buf + np, s, take);
        int k = utf8_check(buf, np + take);
        if (k == 0) { /* incomplete: all of it must be pending now (n < 4) */
            memcpy(d->pending + np, s, n);
            d->n_pending += (int)n;
            return;
        }
        size_t used = (size_t)(k > 0 ? k : -k);
        if (k > 0)
            out_put(o, buf, used);
        else
            out_put(o, REPLACEMENT, 3);
        /* consume `used` bytes: first from pending, then from s */
        if (used <= np) {
            memmove(d->pending, d->pending + used, np - used);
            d->n_pending -= (int)used;
        } else {
            s += used - np;
            n -= used - np;
            d->n_pending = 0;
        }
    }
}

static bool strip_now(const struct detok *d)
{
    const struct tokenizer *t = d->tok;
    switch (t->strip) {
    case TOK_STRIP_AFTER_BOS:
        return d->prev_id >= 0 && d->prev_id == t->bos;
    case TOK_STRIP_AT_START:
    case TOK_STRIP_FIRST_ALL:
        /* the start of the text: nothing came out yet and nothing but
         * skipped special tokens was fed (prev_id < 0 at the very start) */
        return !d->started &&
               (d->prev_id < 0 || (d->skip_special && d->prev_id < t->n_vocab &&
                                   (t->attr[d->prev_id] & TOK_ATTR_SPECIAL)));
    default:
        return false;
    }
}

size_t detok_feed(struct detok *d, int id, char *out, size_t cap)
{
    const struct tokenizer *t = d->tok;
    struct outw o = {out, cap, 0};
    if (id >= 0 && id < t->n_vocab && !(d->skip_special && (t->attr[id] & TOK_ATTR_SPECIAL))) {
        bool strip = strip_now(d);
        if (t->attr[id] & TOK_ATTR_BYTE) {
            unsigned char b = t->byte_val[id];
            /* llama2.c strips a space from the piece text, never from <0x20> */
            if (!(strip && b == ' ' && t->strip == TOK_STRIP_AT_START))
                detok_push(d, &b, 1, &o);
        } else if (t->dec[id]) {
            const unsigned char *s = (const unsigned char *)t->dec[id];
            size_t n = t->dec_len[id];
            if (strip && t->strip == TOK_STRIP_FIRST_ALL) {
                /* every space of the first token goes, run by run */
                size_t run = 0;
                for (size_t i = 0; i <= n; i++) {
                    if (i < n && s[i] != ' ')
                        continue;
                    detok_push(d, s + run, i - run, &o);
                    run = i + 1;
                }
                n = 0;
            } else if (strip && n > 0 && s[0] == ' ') {
                s++;
                n--;
            }
            detok_push(d, s, n, &o);
        }
    }
    d->prev_id = id;
    if (o.n > 0 || d->n_pending > 0)
        d->started = true;
    if (cap)
        out[o.n] = 0;
    return o.n;
}

int tok_id_bytes(const struct tokenizer *t, int id, const char **s, char *byte)
{
    if (id < 0 || id >= t->n_vocab || (t->attr[id] & TOK_ATTR_SPECIAL))
        return -1;
    if (t->attr[id] & TOK_ATTR_BYTE) {
        *byte = (char)t->byte_val[id];
        *s = byte;
        return 1;
    }
    *s = t->dec[id] ? t->dec[id] : "";
    return t->dec[id] ? (int)t->dec_len[id] : 0;
}

size_t detok_flush(struct detok *d, char *out, size_t cap)
{
    struct outw o = {out, cap, 0};
    /* whatever is held cannot complete any more: each maximal subpart is
     * one U+FFFD (held bytes are always one incomplete sequence) */
    if (d->n_pending > 0)
        out_put(&o, REPLACEMENT, 3);
    d->n_pending = 0;
    if (cap)
        out[o.n] = 0;
    return o.n;
}

char *tok_decode(const struct tokenizer *t, const int *ids, int n, bool skip_special,
                 struct err *e)
{
    struct detok d;
    detok_init(&d, t, skip_special);
    size_t cap = detok_max_bytes(t);
    char *chunk = malloc(cap);
    struct tok_buf b = {0};
    if (!chunk || tok_buf_put(&b, "", 0))
        goto oom;
    for (int i = 0; i < n; i++) {
        size_t k = detok_feed(&d, ids[i], chunk, cap);
        if (tok_buf_put(&b, chunk, k))
            goto oom;
    }
    size_t k = detok_flush(&d, chunk, cap);
    if (tok_buf_put(&b, chunk, k))
        goto oom;
    free(chunk);
    return b.p;
oom:
    free(chunk);
    free(b.p);
    err_set(e, "out of memory decoding %d tokens", n);
    return NULL;
}

/* ---- finding the tokenizer of a model ---- */

static bool is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* vocab_size from a llama2.c checkpoint header (7 int32; negative vocab
 * means an unshared classifier). 0 when unreadable. */
static int llama2c_ckpt_vocab(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    int hdr[7];
    size_t got = fread(hdr, sizeof hdr[0], 7, f);
    fclose(f);
    if (got != 7 || hdr[0] <= 0 || hdr[2] <= 0)
        return 0;
    int v = hdr[5] < 0 ? -hdr[5] : hdr[5];
    return v > 0 && v < (1 << 24) ? v : 0;
}

/* Picks the llama2.c tokenizer in dir: tok<vocab>.bin, then tokenizer.bin,
 * then the first tok*.bin by name. Also finds a checkpoint (*.bin that is
 * not a tokenizer) when ckpt is empty. Returns 0 when found. */
static int find_llama2c_files(const char *dir, char *tok, size_t tokcap, char *ckpt,
                              size_t ckptcap)
{
    DIR *dh = opendir(dir);
    if (!dh)
        return -1;
    char first_tok[256] = "", first_ckpt[256] = "";
    struct dirent *de;
    while ((de = readdir(dh))) {
        const char *nm = de->d_name;
        if (!ends_with(nm, ".bin") || strlen(nm) >= sizeof first_tok)
            continue;
        if (strncmp(nm, "tok", 3) == 0) {
            if (!first_tok[0] || strcmp(nm, first_tok) < 0)
                snprintf(first_tok, sizeof first_tok, "%s", nm);
        } else if (!first_ckpt[0] || strcmp(nm, first_ckpt) < 0) {
            snprintf(first_ckpt, sizeof first_ckpt, "%s", nm);
        }
    }
    closedir(dh);
    if (!ckpt[0] && first_ckpt[0] &&
        (size_t)snprintf(ckpt, ckptcap, "%s/%s", dir, first_ckpt) >= ckptcap)
        ckpt[0] = 0;
    int vocab = ckpt[0] ? llama2c_ckpt_vocab(ckpt) : 0;
    if (vocab > 0 && (size_t)snprintf(tok, tokcap, "%s/tok%d.bin", dir, vocab) < tokcap &&
        is_file(tok))
        return 0;
    if ((size_t)snprintf(tok, tokcap, "%s/tokenizer.bin", dir) < tokcap && is_file(tok))
        return 0;
    if (first_tok[0] && (size_t)snprintf(tok, tokcap, "%s/%s", dir, first_tok) < tokcap)
        return 0;
    return -1;
}

struct tokenizer *tok_load_for_model(const char *model_path, struct err *e)
{
    struct stat st;
    if (stat(model_path, &st) != 0) {
        err_set(e, "%s: %s", model_path, strerror(errno));
        return NULL;
    }
    char dir[1024], ckpt[1024] = "", path[1100];
    if (strlen(model_path) >= sizeof dir) {
        err_set(e, "%.200s...: path too long", model_path);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, sizeof dir, "%s", model_path);
    } else {
        if (ends_with(model_path, ".gguf"))
            return tok_load_gguf_file(model_path, e);
        if (ends_with(model_path, ".json"))
            return tok_load_hf_json(model_path, e);
        snprintf(dir, sizeof dir, "%s", model_path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof dir, ".");
        if (ends_with(model_path, ".bin"))
            snprintf(ckpt, sizeof ckpt, "%s", model_path);
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (!ckpt[0] && is_file(path))
        return tok_load_hf_json(path, e);
    char tok[1100];
    if (find_llama2c_files(dir, tok, sizeof tok, ckpt, sizeof ckpt) == 0) {
        int vocab = ckpt[0] ? llama2c_ckpt_vocab(ckpt) : 0;
        return tok_load_llama2c(tok, vocab, e);
    }
    if (is_file(path))
        return tok_load_hf_json(path, e);
    err_set(e, "%s: no tokenizer found (looked for tokenizer.json and a llama2.c tok*.bin in %s)",
            model_path, dir);
    return NULL;
}

int tok_override_dir(const char *path, char *dir, size_t cap, struct err *e)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return err_set(e, "--tokenizer %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        char json[4200];
        snprintf(json, sizeof json, "%s/tokenizer.json", path);
        if (!is_file(json))
            return err_set(e, "--tokenizer %s: no tokenizer.json in this directory", path);
        if ((size_t)snprintf(dir, cap, "%s", path) >= cap)
            return err_set(e, "--tokenizer %.200s...: path too long", path);
        return 0;
    }
    if (!ends_with(path, "tokenizer.json"))
        return err_set(e, "--tokenizer %s: not a tokenizer.json file or a directory holding one",
                       path);
    const char *slash = strrchr(path, '/');
    if ((size_t)snprintf(dir, cap, "%.*s", slash ? (int)(slash - path) : 1,
                         slash ? path : ".") >= cap)
        return err_set(e, "--tokenizer %.200s...: path too long", path);
    if (!dir[0]) /* "/tokenizer.json" */
        snprintf(dir, cap, "/");
    return 0;
}

struct tokenizer *tok_load_override(const char *path, int model_vocab, struct err *e)
{
    char dir[4096], json[4200];
    if (tok_override_dir(path, dir, sizeof dir, e))
        return NULL;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(json, sizeof json, "%s/tokenizer.json", path);
    else
        snprintf(json, sizeof json, "%s", path);
    struct tokenizer *t = tok_load_hf_json(json, e);
    if (!t) {
        err_wrap(e, "--tokenizer %s", path);
        return NULL;
    }
    if (t->n_vocab > model_vocab) {
        err_set(e, "--tokenizer %s: its vocabulary has %d tokens, more than the model's "
                   "vocab_size %d", path, t->n_vocab, model_vocab);
        tok_free(t);
        return NULL;
    }
    return t;
}
