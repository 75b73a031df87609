/* fuzz_tmp.h - what the fuzz targets that hand their input to a loader as a
 * file share: a directory of their own, made once, and a file written whole
 * (any failure aborts: it is the fuzzing machine's, not a finding). */
#ifndef CLLM_FUZZ_TMP_H
#define CLLM_FUZZ_TMP_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* dir (cap bytes) = a new directory $TMPDIR/<name>.XXXXXX (or /tmp/...). */
static void fuzz_tmpdir(const char *name, char *dir, size_t cap)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, cap, "%s/%s.XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
    if (!mkdtemp(dir)) {
        perror(name);
        abort();
    }
}

static void fuzz_put(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(b, 1, n, f) != n) || fclose(f)) {
        perror(path);
        abort();
    }
}

#endif
