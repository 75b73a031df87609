/* grammar.h - constrained generation: a context-free grammar over bytes,
 * written in GBNF (docs/grammar.md gives the dialect), and a matcher that
 * says, state by state, which tokens of a vocabulary may come next.
 *
 * A grammar is compiled once and is read-only afterwards, so requests may
 * share one. A matcher is one generation's position in it: not shared. The
 * vocabulary view (every token's bytes, sorted so that tokens sharing a
 * prefix are walked once) is built once per tokenizer and shared too. */
#ifndef CLLM_GRAMMAR_GRAMMAR_H
#define CLLM_GRAMMAR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"

struct grammar;
struct grammar_vocab;
struct grammar_matcher;
struct tokenizer;

/* Compiles GBNF text; the start rule is `root`. Fails with a message naming
 * the line for a syntax error, an undefined rule, a missing root, or a rule
 * that can reach itself without consuming a byte (left recursion). */
struct grammar *grammar_parse(const char *text, size_t len, struct err *e);
void grammar_free(struct grammar *g);

/* GBNF text with every rule name prefixed (`root` becomes `<prefix>root`),
 * so that grammars written apart can be joined into one text. Literals,
 * classes, repetition counts and comments are left as they are. Caller
 * frees; NULL when out of memory or the text has an unterminated literal
 * or class (message in e). */
char *grammar_prefix_rules(const char *text, const char *prefix, struct err *e);

/* The GBNF literal (quotes and escapes) whose sentence is exactly the n
 * bytes of s, into out (at least 4 * n + 3 bytes); returns its length. s
 * must be UTF-8 (as JSON strings are): GBNF is text, so a byte that is not
 * makes a literal grammar_parse refuses. */
size_t grammar_literal(const char *s, size_t n, char *out);

/* Whether the n bytes of s are a whole sentence of g. */
bool grammar_accepts(const struct grammar *g, const char *s, size_t n);

/* The bytes each token adds to the text mid-sequence (the detokenizer's
 * output for it after other text), for ids [0, n_vocab). Special tokens
 * (BOS, EOS, control) and tokens with no bytes are never allowed by a mask;
 * the caller decides about end-of-sequence ids. */
struct grammar_vocab *grammar_vocab_new(const struct tokenizer *t, int n_vocab,
                                        struct err *e);
void grammar_vocab_free(struct grammar_vocab *v);

/* A matcher at the start of g. v may be NULL for a matcher fed bytes only. */
struct grammar_matcher *grammar_matcher_new(const struct grammar *g,
                                            const struct grammar_vocab *v, struct err *e);
void grammar_matcher_free(struct grammar_matcher *m);

/* Advances by n bytes. 0, or -1 when the bytes cannot follow (the matcher
 * is then unchanged) or the matcher ran out of room (message in e). */
int grammar_matcher_feed(struct grammar_matcher *m, const char *s, size_t n, struct err *e);
/* Advances by one token's bytes (the vocabulary's); -1 as above, also for
 * a token the vocabulary has no bytes for. */
int grammar_matcher_feed_token(struct grammar_matcher *m, int id, struct err *e);
/* The text so far is a whole sentence: generation may end here. */
bool grammar_matcher_can_end(const struct grammar_matcher *m);
/* The text so far is a whole sentence and no byte may follow it. */
bool grammar_matcher_must_end(const struct grammar_matcher *m);

/* Sets to -INFINITY the logits[n_vocab] of every token that cannot come
 * next: a token is allowed when all of its bytes can follow the text so far.
 * The end_ids (EOS, stop tokens) are allowed exactly when the matcher can
 * end. Returns the number of ids left allowed, end ids included (0 means
 * the grammar is stuck: nothing in the vocabulary continues it), or -1 when
 * the matcher ran out of room (message in e). Each state's set of tokens is
 * worked out once and kept, so a state met again costs one pass over the
 * logits. */
int grammar_matcher_mask(struct grammar_matcher *m, float *logits, const int *end_ids,
                         int n_end, struct err *e);

#endif
