/* test_env.c - strict numeric environment levers (base/env.c) and the
 * integer rule they share with the flags (base/parse.c):
 *   0. parse_long takes a whole decimal integer in range and nothing else;
 *   1. unset and empty leave the value alone and return 0;
 *   2. an integer in range is taken (1), at both ends and with a sign;
 *   3. out of range, trailing text, no digits, spaces and overflow are
 *      errors (-1) naming the variable, its value and the range, and leave
 *      the value alone;
 *   4. env_long_of takes only its listed values and names them all;
 *   5. env_flag is the spec's flagOn: "1" on, "0" off, else the default;
 *   6. every message err_set / err_wrap make is one line of UTF-8: line
 *      breaks and tabs become spaces, other control bytes and bytes that
 *      are not UTF-8 '?', and a character cut by the buffer's end goes. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "base/parse.h"
#include "base/utf8.h"
#include "testutil.h"

#define VAR "CLLM_TEST_ENV_LEVER"

static int parse(const char *val, long lo, long hi, long *out, struct err *e)
{
    if (val)
        setenv(VAR, val, 1);
    else
        unsetenv(VAR);
    e->msg[0] = 0;
    return env_long(VAR, lo, hi, out, e);
}

/* Whether s is UTF-8 with no control character. */
static int one_line_utf8(const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int len = utf8_get(s + i, n - i, &cp);
        if (len == 0 || cp < 0x20 || cp == 0x7F)
            return 0;
        i += (size_t)len;
    }
    return 1;
}

static void check_err_line(void)
{
    struct err e;
    err_set(&e, "m.gguf: metadata '%s' has type 9", "a\nb\tc\x1b[31md\xff\xc3");
    CHECK(!strcmp(e.msg, "m.gguf: metadata 'a b c?[31md?" "?' has type 9"), "controls: \"%s\"", e.msg);
    /* 300 three-byte characters overflow the 512-byte message mid-character */
    char name[901];
    for (int i = 0; i < 300; i++)
        memcpy(name + 3 * i, "\xe5\x90\x8d", 3);
    name[900] = 0;
    err_set(&e, "x: %s", name);
    CHECK(one_line_utf8(e.msg) && strlen(e.msg) == 3 + 3 * 169, "cut: %zu bytes, UTF-8 %d",
          strlen(e.msg), one_line_utf8(e.msg));
    err_set(&e, "%s", name + 1); /* starts with two continuation bytes */
    CHECK(one_line_utf8(e.msg) && !strncmp(e.msg, "??\xe5\x90\x8d", 5), "stray continuation: %.8s",
          e.msg);
    err_set(&e, "%s", name);
    err_wrap(&e, "loading %s", "y\r");
    CHECK(one_line_utf8(e.msg) && !strncmp(e.msg, "loading y : \xe5", 13), "wrapped: %.16s", e.msg);
    err_set(&e, "plain: %d", 7);
    CHECK(!strcmp(e.msg, "plain: 7"), "plain message changed: %s", e.msg);
}

int main(void)
{
    check_err_line();
    /* a switch's words, and nothing else */
    static const char *const on_words[] = {"true", "on", "1"}, *const off_words[] = {"false", "off", "0"};
    for (int i = 0; i < 3; i++) {
        bool b = false, c = true;
        CHECK(parse_switch(on_words[i], &b) && b, "parse_switch %s", on_words[i]);
        CHECK(parse_switch(off_words[i], &c) && !c, "parse_switch %s", off_words[i]);
    }
    static const char *const not_switches[] = {NULL, "", "yes", "ON", "2", " on", "on "};
    for (size_t i = 0; i < sizeof not_switches / sizeof *not_switches; i++) {
        bool b = true;
        CHECK(!parse_switch(not_switches[i], &b) && b, "parse_switch \"%s\" taken",
              not_switches[i] ? not_switches[i] : "(null)");
    }
    long x = 7;
    CHECK(parse_long("-12", -12, 0, &x) && x == -12, "parse_long -12: %ld", x);
    CHECK(parse_long("0", 0, 0, &x) && x == 0, "parse_long 0: %ld", x);
    static const char *const not_ints[] = {NULL, "", " 1", "1 ", "1.0", "0x10", "--1", "1,2", "13"};
    for (size_t i = 0; i < sizeof not_ints / sizeof *not_ints; i++) {
        x = 7;
        CHECK(!parse_long(not_ints[i], -12, 12, &x) && x == 7, "parse_long \"%s\" took %ld",
              not_ints[i] ? not_ints[i] : "(null)", x);
    }

    struct err e;
    long v = 42;
    CHECK(parse(NULL, 1, 8, &v, &e) == 0 && v == 42, "unset: rc, v = %ld", v);
    CHECK(parse("", 1, 8, &v, &e) == 0 && v == 42, "empty: v = %ld", v);

    CHECK(parse("1", 1, 8, &v, &e) == 1 && v == 1, "low end: v = %ld", v);
    CHECK(parse("8", 1, 8, &v, &e) == 1 && v == 8, "high end: v = %ld", v);
    CHECK(parse("-3", -5, 5, &v, &e) == 1 && v == -3, "negative: v = %ld", v);
    CHECK(parse("+4", 0, 5, &v, &e) == 1 && v == 4, "plus sign: v = %ld", v);

    static const char *const bad[] = {"0", "9", "8x", "x8", " ", "4 ", "0x4", "1e3",
                                      "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        v = 42;
        int rc = parse(bad[i], 1, 8, &v, &e);
        char want[64];
        snprintf(want, sizeof want, VAR "=\"%s\"", bad[i]);
        CHECK(rc == -1 && v == 42, "\"%s\": rc %d, v %ld", bad[i], rc, v);
        CHECK(strstr(e.msg, want) && strstr(e.msg, "[1, 8]"), "\"%s\": message \"%s\"", bad[i],
              e.msg);
    }
    CHECK(parse("9223372036854775807", 0, LONG_MAX, &v, &e) == 1 && v == LONG_MAX,
          "LONG_MAX: v = %ld", v);

    static const long ks[] = {1, 2, 4, 8, 16};
    static const char *const ok_of[] = {"1", "2", "4", "8", "16"};
    for (int i = 0; i < 5; i++) {
        setenv(VAR, ok_of[i], 1);
        v = 0;
        CHECK(env_long_of(VAR, ks, 5, &v, &e) == 1 && v == ks[i], "of: %s gave %ld", ok_of[i], v);
    }
    static const char *const bad_of[] = {"3", "0", "17", "2k", "-1"};
    for (int i = 0; i < 5; i++) {
        setenv(VAR, bad_of[i], 1);
        v = 42;
        e.msg[0] = 0;
        int rc = env_long_of(VAR, ks, 5, &v, &e);
        CHECK(rc == -1 && v == 42, "of: \"%s\": rc %d, v %ld", bad_of[i], rc, v);
        CHECK(strstr(e.msg, "needs 1, 2, 4, 8 or 16") && strstr(e.msg, bad_of[i]),
              "of: \"%s\": message \"%s\"", bad_of[i], e.msg);
    }
    unsetenv(VAR);
    v = 42;
    CHECK(env_long_of(VAR, ks, 5, &v, &e) == 0 && v == 42, "of: unset: v = %ld", v);

    /* flagOn: "1" and "0" decide, anything else (or unset) is the default */
    CHECK(env_flag(VAR, true) && !env_flag(VAR, false), "flag: unset");
    static const char *const not_flags[] = {"", "true", "false", "yes", "2", " 1", "01"};
    for (size_t i = 0; i < sizeof not_flags / sizeof *not_flags; i++) {
        setenv(VAR, not_flags[i], 1);
        CHECK(env_flag(VAR, true) && !env_flag(VAR, false), "flag: \"%s\" not the default",
              not_flags[i]);
    }
    setenv(VAR, "1", 1);
    CHECK(env_flag(VAR, false) && env_flag(VAR, true), "flag: \"1\"");
    setenv(VAR, "0", 1);
    CHECK(!env_flag(VAR, true) && !env_flag(VAR, false), "flag: \"0\"");
    unsetenv(VAR);
    return test_summary("test_env");
}
