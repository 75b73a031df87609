/* testutil.h - a tiny assertion harness: CHECK records a failure and goes
 * on; main returns test_summary(), which prints "N passed, N failed". */
#ifndef CLLM_TESTS_TESTUTIL_H
#define CLLM_TESTS_TESTUTIL_H

#include <stdio.h>

extern int test_passed, test_failed;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (cond) {                                                            \
            test_passed++;                                                     \
        } else {                                                               \
            test_failed++;                                                     \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__,   \
                    #cond);                                                    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
        }                                                                      \
    } while (0)

int test_summary(const char *name);
/* Reads a whole file; returns NULL if missing. Caller frees. */
char *test_read_file(const char *path, size_t *len);

#endif
