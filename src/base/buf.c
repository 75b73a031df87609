/* buf.c - the growable byte buffer of buf.h. */
#include "base/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for extra bytes and the NUL; false (oom set) when there is none. */
static bool grow(struct buf *b, size_t extra)
{
    if (b->oom)
        return false;
    if (b->n + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void buf_putn(struct buf *b, const void *s, size_t n)
{
    if (!grow(b, n))
        return;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void buf_puts(struct buf *b, const char *s) { buf_putn(b, s, strlen(s)); }

void buf_putb(struct buf *b, const struct buf *src)
{
    b->oom |= src->oom;
    if (src->n)
        buf_putn(b, src->p, src->n);
}

void buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0 || !grow(b, (size_t)k))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

void buf_consume(struct buf *b, size_t n)
{
    if (n >= b->n) {
        b->n = 0;
    } else {
        memmove(b->p, b->p + n, b->n - n);
        b->n -= n;
    }
    if (b->p)
        b->p[b->n] = 0;
}

void buf_free(struct buf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
    b->oom = false;
}
