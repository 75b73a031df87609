/* args.c - the integer, number and on/off flag values of the verbs' own parsers
 * (`run`, `bench`): the strict rule (the whole string, in range), the
 * message on stderr. */
#include <float.h>
#include <stdio.h>

#include "base/parse.h"
#include "cli/cli.h"

int cli_parse_int(const char *cmd, const char *flag, const char *v, int lo, int hi, int *out)
{
    long x;
    if (!parse_long(v, lo, hi, &x)) {
        fprintf(stderr, "%s: %s needs an integer in [%d, %d] (got \"%s\")\n", cmd, flag, lo, hi,
                v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

int cli_parse_float(const char *cmd, const char *flag, const char *v, float *out)
{
    double x;
    if (!parse_double(v, -FLT_MAX, FLT_MAX, &x)) {
        fprintf(stderr, "%s: %s needs a number (got \"%s\")\n", cmd, flag, v ? v : "");
        return -1;
    }
    *out = (float)x;
    return 0;
}

int cli_parse_onoff(const char *cmd, const char *flag, const char *v, int *out)
{
    bool on;
    if (!parse_switch(v, &on)) {
        fprintf(stderr, "%s: %s needs on or off (got \"%s\")\n", cmd, flag, v ? v : "");
        return -1;
    }
    *out = on ? 1 : -1;
    return 0;
}
