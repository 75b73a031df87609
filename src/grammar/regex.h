/* regex.h - a regular expression turned into a GBNF expression whose
 * sentences are the strings it matches: vLLM's guided_regex, and JSON
 * Schema's pattern inside a JSON string (docs/grammar.md).
 *
 * The syntax is the part ECMAScript and Python share: literals (UTF-8),
 * `.`, classes `[...]` / `[^...]` with ranges, the escapes \d \D \w \W \s
 * \S \t \n \r \f \v \0 \xHH \uHHHH and any escaped punctuation, groups
 * `(...)`, `(?:...)`, `(?P<name>...)`, `(?<name>...)`, alternation, and
 * the quantifiers * + ? {m} {m,} {m,n} (lazy forms match the same
 * strings). `^` may open the pattern and `$` close it. Refused, naming
 * what: lookaround, backreferences, word boundaries, inline flags,
 * possessive quantifiers, Unicode properties, anchors elsewhere. `.`
 * matches any character but a newline. */
#ifndef CLLM_GRAMMAR_REGEX_H
#define CLLM_GRAMMAR_REGEX_H

#include <stdbool.h>

#include "base/err.h"

enum regex_target {
    REGEX_TEXT,        /* the text itself */
    REGEX_JSON_STRING, /* what sits between a JSON string's quotes: '"', '\' and
                        * control characters written escaped (\", \\, \n, \t,
                        * \r, \b, \f, else \u00XX) */
};

/* Returns a malloc'ed GBNF expression (parenthesized, no rule names: it can
 * stand anywhere a rule's item can), or NULL with a message naming the
 * position. search: the pattern may match anywhere in the string, as JSON
 * Schema's pattern does, unless `^` / `$` anchor it; otherwise the whole
 * string must match (guided_regex), anchors or not. */
char *regex_gbnf(const char *re, enum regex_target t, bool search, struct err *e);

#endif
