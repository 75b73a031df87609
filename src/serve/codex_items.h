/* codex_items.h - the Responses tools that are not functions but that
 * Codex CLI relies on, a custom (freeform) tool such as its apply_patch and
 * the local_shell tool: offered to the chat template as functions, and the
 * model's calls of them given back as their own item types; the same
 * items in a request's history become the template's tool calls again.
 *
 * The function a custom tool becomes takes one string, "input" (its
 * format's grammar, if any, appended to the description for the model to
 * follow); local_shell's takes the exec action's fields: command (argv),
 * workdir, timeout_ms. */
#ifndef CLLM_SERVE_CODEX_ITEMS_H
#define CLLM_SERVE_CODEX_ITEMS_H

#include <jansson.h>

#include "serve/internal.h"

enum codex_kind { CODEX_FUNCTION, CODEX_CUSTOM, CODEX_LOCAL_SHELL };

/* The chat-form tool ({type: "function", function: {name, description,
 * parameters}}) for a Responses tool of type "custom" (with a string
 * name) or "local_shell", and its kind in *kind; NULL for any other tool. */
json_t *codex_tool_function(const json_t *tool, enum codex_kind *kind);

/* The Responses output item for the model's call (name, args: the JSON
 * arguments it wrote) of a tool of kind: a custom_tool_call whose input is
 * the call's "input" string (the arguments' text itself where they are not
 * an object with one), or a local_shell_call with an exec action. NULL for
 * CODEX_FUNCTION, or a local_shell call without a command array of strings:
 * the caller reports a function_call. status: "completed" or "in_progress"
 * (a streamed item's first event, input or action still empty). */
json_t *codex_call_item(enum codex_kind kind, const char *id, const char *call_id,
                        const char *status, const char *name, const char *args);

/* The input string of codex_call_item's custom_tool_call (a reference into
 * item), "" for other items. */
const char *codex_call_input(const json_t *item);

/* A history item of type "custom_tool_call" or "local_shell_call" (param
 * names it in errors) as the chat form's tool call: {id: its call_id,
 * type: "function", function: {name, arguments}}. NULL with a 400 in ae
 * when a field the call needs is missing or of the wrong type. */
json_t *codex_item_call(const json_t *item, const char *param, struct api_error *ae);

#endif
