/* testutil.c - counters and helpers for the test programs. */
#include "testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "engine/engine.h"

int test_passed, test_failed;

int test_summary(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, test_passed, test_failed);
    return test_failed ? 1 : 0;
}

char *test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

json_t *test_json_load(const char *path)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    CHECK(root != NULL, "%s: %s", path, je.text);
    return root;
}

int *test_json_ids(json_t *arr, int *n)
{
    *n = (int)json_array_size(arr);
    int *ids = malloc(((size_t)*n + 1) * sizeof *ids);
    for (int i = 0; i < *n; i++)
        ids[i] = (int)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

float *test_read_f32(const char *path, size_t want)
{
    size_t len = 0;
    char *buf = test_read_file(path, &len);
    CHECK(buf && len == want * 4, "%s: expected %zu floats, file has %zu bytes", path, want, len);
    if (buf && len != want * 4) {
        free(buf);
        return NULL;
    }
    return (float *)buf;
}

double test_rel_err(const float *a, const float *ref, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (d > md || isnan(d))
            md = isnan(d) ? INFINITY : d;
        if (fabs(ref[i]) > mr)
            mr = fabs(ref[i]);
    }
    return md / (mr > 0 ? mr : 1);
}

void test_wait_idle(struct engine *eng, struct engine_stats *st)
{
    for (int i = 0; i < 3000; i++) {
        engine_get_stats(eng, st);
        if (st->queued == 0 && st->running == 0 && st->pending == 0)
            return;
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    CHECK(0, "engine never went idle");
}

int test_pool_idle(const struct engine_stats *st)
{
    return st->kv_blocks_free + st->cache_blocks_idle == st->kv_blocks_total &&
           st->cache_blocks == st->cache_blocks_idle;
}
