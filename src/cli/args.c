/* args.c - the integer flag values of the verbs' own parsers (`run`,
 * `bench`): the strict rule of base/parse.h, the message on stderr. */
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
