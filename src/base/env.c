/* env.c - strict parsing of numeric environment levers (see env.h). */
#include "base/env.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"

int env_long(const char *name, long lo, long hi, long *out, struct err *e)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    if (!parse_long(v, lo, hi, out))
        return err_set(e, "%s=\"%s\": needs an integer in [%ld, %ld]", name, v, lo, hi);
    return 1;
}

bool env_flag(const char *name, bool dflt)
{
    const char *v = getenv(name);
    return v && !strcmp(v, "1") ? true : v && !strcmp(v, "0") ? false : dflt;
}

int env_long_of(const char *name, const long *allowed, int n, long *out, struct err *e)
{
    long lo = allowed[0], hi = allowed[0];
    for (int i = 1; i < n; i++) {
        lo = allowed[i] < lo ? allowed[i] : lo;
        hi = allowed[i] > hi ? allowed[i] : hi;
    }
    long x = 0;
    int rc = env_long(name, lo, hi, &x, NULL);
    bool ok = rc == 0;
    for (int i = 0; rc == 1 && i < n && !ok; i++)
        ok = x == allowed[i];
    if (!ok) {
        char list[160] = "";
        size_t l = 0;
        for (int i = 0; i < n && l < sizeof list; i++) {
            const char *sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
            l += (size_t)snprintf(list + l, sizeof list - l, "%s%ld", sep, allowed[i]);
        }
        return err_set(e, "%s=\"%s\": needs %s", name, getenv(name), list);
    }
    if (rc == 1)
        *out = x;
    return rc;
}
