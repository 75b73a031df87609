/* ids.c - the comma-separated token id lists the verbs take on the command
 * line (`run --prompt-ids`, `tokenize --decode`). */
#include <errno.h>
#include <stdlib.h>

#include "cli/cli.h"

int cli_parse_ids(const char *flag, const char *s, long limit, int **out, struct err *e)
{
    size_t cap = 16;
    int n = 0;
    int *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return err_set(e, "out of memory");
    for (const char *p = s; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 0x7fffffffL) {
            free(ids);
            return err_set(e, "%s: \"%s\" is not a comma-separated list of token ids", flag, s);
        }
        if (v >= limit) {
            free(ids);
            return err_set(e, "%s: id %ld is outside the vocabulary (%ld tokens)", flag, v, limit);
        }
        if ((size_t)n == cap) {
            int *ni = realloc(ids, (cap *= 2) * sizeof *ni);
            if (!ni) {
                free(ids);
                return err_set(e, "out of memory");
            }
            ids = ni;
        }
        ids[n++] = (int)v;
        p = end;
    }
    *out = ids;
    return n;
}
