/* err.c - formatting of user-facing error messages: each one line of UTF-8
 * (utf8_one_line), whatever names from files or requests it quotes. */
#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/utf8.h"

int err_set(struct err *e, const char *fmt, ...)
{
    if (!e)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    utf8_one_line(e->msg);
    return -1;
}

int err_wrap(struct err *e, const char *fmt, ...)
{
    if (!e)
        return -1;
    char prefix[256], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    snprintf(e->msg, sizeof e->msg, "%s: %s", prefix, old);
    utf8_one_line(e->msg);
    return -1;
}
