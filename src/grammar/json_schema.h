/* json_schema.h - a JSON Schema turned into a GBNF grammar (docs/grammar.md)
 * whose sentences are the JSON texts the schema accepts, so structured output
 * (response_format, --json-schema) is a grammar like any other.
 *
 * Supported: type (one or a list), enum, const, anyOf, oneOf (as anyOf: a
 * value valid under two members is not refused), allOf of one schema, $ref
 * to "#" and JSON pointers inside the schema (#/$defs/NAME, recursion
 * included), nullable (OpenAPI), properties / required / additionalProperties
 * (keys in the order `properties` lists them, each at most once), items /
 * prefixItems / minItems / maxItems, minLength / maxLength, pattern
 * (grammar/regex.h, a search unless anchored), and format date, time,
 * date-time, uuid. Annotations (title, description, default, ...) and
 * unknown formats are ignored. minimum, maximum, exclusiveMinimum,
 * exclusiveMaximum and multipleOf are accepted but NOT enforced: a grammar
 * cannot count. Anything else that constrains values (not, if,
 * uniqueItems, ...) is refused rather than silently widened.
 *
 * The grammar only narrows JSON where it must stay finite or parseable:
 * integers of at most 16 digits, fractions of at most 16, exponents of at
 * most 2 (every number is a finite double), between tokens nothing, one space
 * or tab, or a newline and at most 20 spaces or tabs (none around the whole),
 * no \u0000 and no lone surrogate escapes in strings, enum values written
 * compactly as jansson prints them. */
#ifndef CLLM_GRAMMAR_JSON_SCHEMA_H
#define CLLM_GRAMMAR_JSON_SCHEMA_H

#include <jansson.h>

#include "base/err.h"

/* Returns malloc'ed GBNF text (start rule `root`), or NULL with a message a
 * user can act on, naming the schema path (e.g. "schema: properties.age:
 * unsupported keyword \"not\"" or "schema: $ref \"#/x\" does not resolve").
 * schema NULL, true or {} means any JSON value. The schema is only read: the
 * caller keeps it. */
char *json_schema_gbnf(const json_t *schema, struct err *e);

#endif
