/* grammar_internal.h - the compiled form of a grammar, shared by the GBNF
 * compiler (grammar.c) and the matcher (matcher.c).
 *
 * Every rule is a run of elements: its alternatives one after another, each
 * ended by GEL_ALT except the last, ended by GEL_END. An element is a byte
 * set (one byte of input from the set) or a reference to a rule. Repetition,
 * groups and character classes past ASCII are compiled into rules of these,
 * so the matcher knows only bytes, sequences and alternatives. */
#ifndef CLLM_GRAMMAR_INTERNAL_H
#define CLLM_GRAMMAR_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

enum gel_type { GEL_END, GEL_ALT, GEL_REF, GEL_SET };

struct gel {
    uint32_t type : 2;
    uint32_t v : 30; /* GEL_REF: rule index; GEL_SET: index into sets */
};

struct byteset {
    uint64_t w[4];
};

static inline bool byteset_has(const struct byteset *s, unsigned char b)
{
    return (s->w[b >> 6] >> (b & 63)) & 1;
}

struct grammar {
    struct gel *el;
    int n_el;
    int *rule_start; /* [n_rules] index of the rule's first element */
    int n_rules;
    struct byteset *sets;
    int n_sets;
    int root;
};

/* The element after the alternative that starts at a (its GEL_ALT or
 * GEL_END). */
static inline int grammar_alt_end(const struct grammar *g, int a)
{
    while (g->el[a].type != GEL_END && g->el[a].type != GEL_ALT)
        a++;
    return a;
}

#endif
