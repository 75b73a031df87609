/* sbuf.c - what the HTTP side writes into its buffers (base/buf.h): a
 * server-sent event, compact JSON, text as a JSON string; plus ids and a
 * clock. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "serve/internal.h"

char *json_compact(const json_t *v, size_t *len)
{
    /* 15 significant digits: a double written from a float's short
     * decimal (json_float) prints as that decimal, not its 17-digit
     * expansion, and other doubles keep their value to 1e-15 */
    char *s = json_dumps(v, JSON_COMPACT | JSON_REAL_PRECISION(15));
    if (s && len)
        *len = strlen(s);
    return s;
}

void sbuf_sse(struct buf *b, const char *name, const json_t *data)
{
    size_t n;
    char *s = json_compact(data, &n);
    if (!s) {
        b->oom = true;
        return;
    }
    if (name)
        buf_printf(b, "event: %s\n", name);
    buf_puts(b, "data: ");
    buf_putn(b, s, n);
    buf_puts(b, "\n\n");
    free(s);
}

void serve_make_id(char *out, size_t cap, const char *prefix)
{
    unsigned char r[12];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) { /* never expected; still unique-ish */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)(uintptr_t)out;
        for (size_t i = 0; i < sizeof r; i++, x = x * 6364136223846793005ULL + 1442695040888963407ULL)
            r[i] = (unsigned char)(x >> 56);
    }
    size_t k = (size_t)snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof r && k + 2 < cap; i++, k += 2)
        snprintf(out + k, cap - k, "%02x", r[i]);
}


json_t *json_text(const char *p, size_t n)
{
    json_t *s = json_stringn(p ? p : "", n);
    if (s || !p)
        return s ? s : json_string("");
    /* Not valid UTF-8 (the detokenizer should never produce that): replace
     * each bad byte with U+FFFD rather than fail the response. */
    struct buf b = {0};
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = k > 0 && i + k <= n;
        for (size_t j = 1; ok && j < k; j++)
            ok = ((unsigned char)p[i + j] >> 6) == 2;
        if (ok) { /* let jansson judge overlong forms and surrogates */
            json_t *t = json_stringn(p + i, k);
            ok = t != NULL;
            json_decref(t);
        }
        if (ok) {
            buf_putn(&b, p + i, k);
            i += k;
        } else {
            buf_puts(&b, "\xef\xbf\xbd");
            i++;
        }
    }
    s = json_stringn(b.p ? b.p : "", b.n);
    buf_free(&b);
    return s ? s : json_string("");
}

json_t *json_float(float v)
{
    char b[32];
    snprintf(b, sizeof b, "%.7g", (double)v);
    return json_real(strtod(b, NULL));
}
