/* utf8.h - one code point to and from UTF-8, strictly: what the grammar
 * compiler, the regular-expression reader and the tokenizer share. */
#ifndef CLLM_BASE_UTF8_H
#define CLLM_BASE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Writes cp (<= U+10FFFF) as UTF-8 to out (room for 4); returns the byte
 * count. */
static inline size_t utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The byte count a sequence led by b declares (1-4), or 0 for a byte
 * that cannot lead one (a continuation byte, 0xF8 and up). */
static inline int utf8_lead_len(unsigned char b)
{
    return b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
}

/* The code point at s (n bytes available) into *cp; returns its byte count,
 * or 0 when the bytes are not UTF-8: a bad lead or continuation byte, a
 * sequence cut short, an overlong form, a surrogate, a value past
 * U+10FFFF (so a character reads back as the very bytes it was written
 * with). */
static inline int utf8_get(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *p = (const unsigned char *)s;
    if (n == 0)
        return 0;
    const int len = utf8_lead_len(p[0]);
    if (len == 0 || (size_t)len > n)
        return 0;
    uint32_t c = len == 1 ? p[0] : p[0] & (0x7Fu >> len);
    for (int k = 1; k < len; k++) {
        if ((p[k] & 0xC0) != 0x80)
            return 0;
        c = c << 6 | (p[k] & 0x3F);
    }
    static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < least[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    *cp = c;
    return len;
}

/* Makes s (NUL-terminated, edited in place) one line of UTF-8 text, as a
 * user-facing message must be (err.h; an HTTP error body, which jansson
 * refuses to hold invalid UTF-8): a character cut short by the end of the
 * string (a message truncated to its buffer) is dropped, any other byte
 * that is not UTF-8 becomes '?', a tab or line break a space, and any
 * other control character '?'. Names read from a file or a request thus
 * reach a terminal or a log as text, never as escape sequences. */
static inline void utf8_one_line(char *s)
{
    const size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        const int len = utf8_get(s + i, n - i, &cp);
        if (len > 0) {
            if (cp == '\t' || cp == '\n' || cp == '\r')
                s[i] = ' ';
            else if (cp < 0x20 || cp == 0x7F)
                s[i] = '?';
            i += (size_t)len;
            continue;
        }
        /* a lead byte whose sequence runs past the end, with only
         * continuation bytes after it: the cut of a truncation */
        const int want = utf8_lead_len((unsigned char)s[i]);
        bool cut = want > 1 && (size_t)want > n - i;
        for (size_t k = i + 1; cut && k < n; k++)
            cut = ((unsigned char)s[k] & 0xC0) == 0x80;
        if (cut) {
            s[i] = 0;
            return;
        }
        s[i++] = '?';
    }
}

#endif
