/* env.h - numeric environment levers read strictly: a variable that is set
 * but does not hold an integer in the allowed range is an error naming it,
 * never a silent default (a typo in a measurement lever would otherwise
 * measure the default and be reported as the lever's effect). */
#ifndef CLLM_BASE_ENV_H
#define CLLM_BASE_ENV_H

#include <stdbool.h>

#include "base/err.h"

/* The decimal integer in $name: 1 with *out set when it is in [lo, hi]; 0
 * with *out untouched when the variable is unset or empty; -1 with a
 * message naming the variable, its value and the range otherwise. */
int env_long(const char *name, long lo, long hi, long *out, struct err *e);

/* A boolean lever, read as the spec's flagOn: true for "1", false for
 * "0", dflt when unset or set to anything else. */
bool env_flag(const char *name, bool dflt);

/* env_long for a value that must also be one of the n values in allowed
 * (lo and hi are their least and greatest); the message lists them. */
int env_long_of(const char *name, const long *allowed, int n, long *out, struct err *e);

#endif
