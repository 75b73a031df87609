/* parse.c - the strict integer, number and switch rules (see parse.h). */
#include "base/parse.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

bool parse_double(const char *s, double lo, double hi, double *out)
{
    if (!s)
        return false;
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || end == s || *end || isnan(x) || x < lo || x > hi)
        return false;
    *out = x;
    return true;
}

bool parse_switch(const char *s, bool *out)
{
    if (s && (!strcmp(s, "true") || !strcmp(s, "on") || !strcmp(s, "1")))
        *out = true;
    else if (s && (!strcmp(s, "false") || !strcmp(s, "off") || !strcmp(s, "0")))
        *out = false;
    else
        return false;
    return true;
}
