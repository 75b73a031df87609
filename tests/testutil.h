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

struct json_t;
/* A JSON array of integers as a malloc'ed int array (one spare slot); *n
 * gets its length. */
int *test_json_ids(struct json_t *arr, int *n);
/* The JSON file at path, parsed; NULL (a failed CHECK naming the file and
 * the parser's reason) when it cannot be. Caller json_decref()s. */
struct json_t *test_json_load(const char *path);
/* Reads a raw float32 file that must hold exactly `want` floats (CHECKed);
 * NULL otherwise. Caller frees. */
float *test_read_f32(const char *path, size_t want);
/* max|a - ref| / max|ref| (a NaN counts as infinite error): the oracle
 * contract's relative logits error. */
double test_rel_err(const float *a, const float *ref, size_t n);

struct engine;
struct engine_stats;
/* Polls the engine's stats (into st) until nothing is queued, running or
 * preempted; CHECKs that it got there within 30 s. */
void test_wait_idle(struct engine *eng, struct engine_stats *st);
/* Every KV block is free or held only by the prefix index. */
int test_pool_idle(const struct engine_stats *st);

#endif
