/* parse.h - the strict rules of cllm's flags and environment levers: the
 * whole string is one decimal integer (an optional sign, no spaces, no
 * trailing text) within [lo, hi], or one number (strtod's syntax, no
 * trailing text, not NaN, no overflow or underflow) within [lo, hi], or
 * a switch's word. Callers word the error. */
#ifndef CLLM_BASE_PARSE_H
#define CLLM_BASE_PARSE_H

#include <stdbool.h>

/* true with *out set when s (may be NULL) holds such an integer; false
 * with *out untouched otherwise. */
bool parse_long(const char *s, long lo, long hi, long *out);
/* The same for a number. */
bool parse_double(const char *s, double lo, double hi, double *out);

/* true with *out set when s (may be NULL) is a switch's value: true, on
 * or 1; false, off or 0. */
bool parse_switch(const char *s, bool *out);

/* The value of a hexadecimal digit, or -1 (the GBNF and Jinja lexers and
 * the <0xXX> byte tokens read them). */
static inline int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif
