/* file.c - whole files into memory. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

char *read_stream(FILE *f, size_t *len)
{
    size_t n = 0, cap = 0;
    char *buf = NULL;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0)
            break;
    }
    if (ferror(f)) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

char *read_file(const char *path, size_t *len, struct err *e)
{
    bool std = !strcmp(path, "-");
    FILE *f = std ? stdin : fopen(path, "rb");
    if (!f) {
        err_set(e, "%s: cannot open (%s)", path, strerror(errno));
        return NULL;
    }
    char *buf = read_stream(f, len);
    int saved = errno;
    if (!std)
        fclose(f);
    if (!buf)
        err_set(e, "%s: cannot read (%s)", path, strerror(saved));
    return buf;
}
