/* err.h - error reporting contract: functions return 0 / -1 and fill a
 * caller-owned struct err with one line a user can act on. No global state. */
#ifndef CLLM_BASE_ERR_H
#define CLLM_BASE_ERR_H

struct err {
    char msg[512];
};

/* Formats msg into e (when e is non-NULL) and returns -1 so callers can
 * write `return err_set(e, "...")`. */
int err_set(struct err *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to an existing message (adds context on the way up). */
int err_wrap(struct err *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
