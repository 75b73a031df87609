/* parse.c - the strict integer rule (see parse.h). */
#include "base/parse.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

bool parse_long(const char *s, long lo, long hi, long *out)
{
    /* strtol would also skip leading white space */
    if (!s || !(isdigit((unsigned char)*s) || *s == '-' || *s == '+'))
        return false;
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi)
        return false;
    *out = x;
    return true;
}
