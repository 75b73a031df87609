/* tok_unicode.c - the Unicode facts the tokenizer needs: UTF-8 decoding and
 * repair, character classes as Rust's char methods and the regex crate
 * define them (HF tokenizers is written in Rust), NFC/NFD/NFKC/NFKD and
 * lowercasing through utf8proc with an ASCII fast path, and GPT-2's
 * byte <-> printable-character table for byte-level BPE. */
#include "base/utf8.h"
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- UTF-8 ---- */

uint32_t tok_utf8_next(const char *s, size_t n, size_t *len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t k = tok_utf8_seq_len(u, n);
    *len = k;
    switch (k) {
    case 2:
        return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
    case 3:
        return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    case 4:
        return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 |
               (uint32_t)(u[2] & 0x3F) << 6 | (u[3] & 0x3F);
    default:
        return u[0];
    }
}

uint32_t tok_utf8_prev(const char *s, size_t n, size_t *len)
{
    size_t k = 1;
    while (k < n && k < 4 && ((unsigned char)s[n - k] & 0xC0) == 0x80)
        k++;
    size_t got;
    uint32_t cp = tok_utf8_next(s + n - k, k, &got);
    if (got != k) { /* not a well-formed sequence: the last byte alone */
        *len = 1;
        return (unsigned char)s[n - 1];
    }
    *len = k;
    return cp;
}

size_t tok_utf8_put(uint32_t cp, char *o) { return utf8_put(cp, o); }

/* The sequence at s: its length (> 0) when well-formed (no overlongs,
 * surrogates or values past U+10FFFF), else minus the length of its maximal
 * ill-formed subpart (the bytes that one U+FFFD replaces). */
static long utf8_check(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t k;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        k = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        return -1;
    }
    for (size_t i = 1; i < k; i++) {
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (i >= n || s[i] < l || s[i] > h)
            return -(long)i;
    }
    return (long)k;
}

bool tok_utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        long k = utf8_check(u + i, n - i);
        if (k < 0)
            return false;
        i += (size_t)k;
    }
    return true;
}

int tok_utf8_sanitize(const char *s, size_t n, struct tok_buf *out)
{
    /* one U+FFFD per maximal ill-formed subpart, as Python's
     * errors="replace" and Rust's from_utf8_lossy do */
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        long k = u[i] < 0x80 ? 1 : utf8_check(u + i, n - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (tok_buf_put(out, s + run, i - run) || tok_buf_put(out, "\xEF\xBF\xBD", 3))
            return -1;
        i += (size_t)-k;
        run = i;
    }
    return tok_buf_put(out, s + run, n - run);
}

/* ---- character classes ---- */

bool tok_cp_is_space(uint32_t c)
{
    /* Unicode White_Space (Rust char::is_whitespace, the regex crate's \s,
     * Oniguruma's \s) */
    if (c < 0x80)
        return c == ' ' || (c >= 0x09 && c <= 0x0D);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static int cat(uint32_t c)
{
    return c > 0x10FFFF ? UTF8PROC_CATEGORY_CN : (int)utf8proc_category((utf8proc_int32_t)c);
}

bool tok_cp_is_numeric(uint32_t c)
{
    if (c < 0x80)
        return c >= '0' && c <= '9';
    int k = cat(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool tok_cp_is_punct(uint32_t c)
{
    if (c < 0x80) /* Rust is_ascii_punctuation: all printable non-alphanumerics */
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
               (c >= 0x7B && c <= 0x7E);
    int k = cat(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

bool tok_cp_is_word(uint32_t c)
{
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               c == '_';
    if (c == 0x200C || c == 0x200D)
        return true;
    int k = cat(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC;
}

bool tok_cp_is_other(uint32_t c)
{
    int k = cat(c);
    return k == UTF8PROC_CATEGORY_CN || (k >= UTF8PROC_CATEGORY_CC && k <= UTF8PROC_CATEGORY_CO);
}

bool tok_cp_is_mark(uint32_t c, bool nonspacing_only)
{
    if (c < 0x300)
        return false;
    int k = cat(c);
    if (nonspacing_only)
        return k == UTF8PROC_CATEGORY_MN;
    return k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME;
}

bool tok_cp_is_cjk(uint32_t c)
{
    /* the CJK ideograph blocks BERT pads with spaces */
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* ---- normalization ---- */

/* utf8proc on one segment, appended to out. */
static int nf_segment(enum tok_nf f, const char *s, size_t n, struct tok_buf *out)
{
    int opt = UTF8PROC_STABLE;
    switch (f) {
    case TOK_NF_C:
        opt |= UTF8PROC_COMPOSE;
        break;
    case TOK_NF_D:
        opt |= UTF8PROC_DECOMPOSE;
        break;
    case TOK_NF_KC:
        opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        break;
    case TOK_NF_KD:
        opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
        break;
    }
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)opt);
    if (k < 0) /* only on invalid input, which callers never pass: keep it */
        return tok_buf_put(out, s, n);
    int rc = tok_buf_put(out, dst, (size_t)k);
    free(dst);
    return rc;
}

int tok_nf_apply(enum tok_nf f, const char *s, size_t n, struct tok_buf *out)
{
    /* An ASCII character is a starter that no normalization form changes
     * and that never combines with what precedes it, so text can be cut in
     * front of any ASCII character. Runs of ASCII are copied; each stretch
     * of non-ASCII text, with the one character before it (which a
     * combining mark may join), goes through utf8proc. */
    size_t i = 0, copied = 0;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        size_t start = i > copied && (unsigned char)s[i - 1] < 0x80 ? i - 1 : i;
        size_t end = i;
        while (end < n && (unsigned char)s[end] >= 0x80)
            end++;
        if (tok_buf_put(out, s + copied, start - copied) || nf_segment(f, s + start, end - start, out))
            return -1;
        copied = i = end;
    }
    return tok_buf_put(out, s + copied, n - copied);
}

int tok_lower_apply(const char *s, size_t n, struct tok_buf *out)
{
    size_t i = 0, copied = 0;
    char enc[8];
    while (i < n) {
        unsigned char b = (unsigned char)s[i];
        if (b < 0x80) {
            if (b >= 'A' && b <= 'Z') {
                if (tok_buf_put(out, s + copied, i - copied))
                    return -1;
                enc[0] = (char)(b + 32);
                if (tok_buf_put(out, enc, 1))
                    return -1;
                copied = i + 1;
            }
            i++;
            continue;
        }
        size_t len;
        uint32_t cp = tok_utf8_next(s + i, n - i, &len);
        /* Rust's to_lowercase is the full mapping; it differs from the
         * simple one only for U+0130 (İ -> i + combining dot above) */
        uint32_t lc = cp == 0x130 ? 'i' : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
        if (lc != cp || cp == 0x130) {
            if (tok_buf_put(out, s + copied, i - copied))
                return -1;
            size_t k = tok_utf8_put(lc, enc);
            if (cp == 0x130)
                k += tok_utf8_put(0x307, enc + k);
            if (tok_buf_put(out, enc, k))
                return -1;
            copied = i + len;
        }
        i += len;
    }
    return tok_buf_put(out, s + copied, n - copied);
}

/* ---- GPT-2 byte-level alphabet ---- */

/* Printable bytes stand for themselves; the 68 others get U+0100.. in byte
 * order: 0x00-0x20 (33 of them), 0x7F-0xA0 (34) and 0xAD. */
uint32_t tok_bytelevel_cp(unsigned b)
{
    if (b <= 0x20)
        return 0x100 + b;
    if (b >= 0x7F && b <= 0xA0)
        return 0x100 + 33 + (b - 0x7F);
    if (b == 0xAD)
        return 0x100 + 67;
    return b;
}

int tok_bytelevel_byte(uint32_t cp)
{
    if (cp < 0x100)
        return (cp <= 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) ? -1 : (int)cp;
    if (cp <= 0x100 + 0x20)
        return (int)(cp - 0x100);
    if (cp < 0x100 + 67)
        return (int)(cp - 0x100 - 33 + 0x7F);
    if (cp == 0x100 + 67)
        return 0xAD;
    return -1;
}
