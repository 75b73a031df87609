/* tool_grammar.h - a forced tool call (tool_choice "required", {"type":
 * "any"}, or a named tool) as a grammar the answer is held to. */
#ifndef CLLM_SERVE_TOOL_GRAMMAR_H
#define CLLM_SERVE_TOOL_GRAMMAR_H

#include <jansson.h>
#include <stdbool.h>

#include "base/err.h"
#include "serve/turn.h"

/* GBNF text whose sentences are: the reasoning the model may write first
 * (syn->think, unless syn->think_done; already open when
 * syn->think_open), then one call (single,
 * or only named) or several, in syn's format (HERMES JSON or XML bodies,
 * JSON for Llama 3), to the tools ([{type, function: {name, parameters}}])
 * — each call's arguments held to its parameter schema, or to any object
 * where the schema is outside json_schema.c's subset. only: that tool's
 * calls alone. Caller frees; NULL with a message (no such tool, no tools,
 * or syn has no tool format). */
char *tool_call_gbnf(const struct turn_syntax *syn, const json_t *tools, const char *only,
                     bool single, struct err *e);

#endif
