/* buf.h - a growable byte buffer for text built piece by piece (grammars,
 * JSON bodies, server-sent events): always NUL-terminated, and a failed
 * allocation is remembered (oom) and reported once by the caller, not at
 * every append. */
#ifndef CLLM_BASE_BUF_H
#define CLLM_BASE_BUF_H

#include <stdbool.h>
#include <stddef.h>

struct buf {
    char *p; /* NULL until something is appended */
    size_t n, cap;
    bool oom;
};

void buf_putn(struct buf *b, const void *s, size_t n);
void buf_puts(struct buf *b, const char *s);
/* Appends src (its oom too). */
void buf_putb(struct buf *b, const struct buf *src);
void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes. */
void buf_consume(struct buf *b, size_t n);
void buf_free(struct buf *b);

#endif
