/* codex_items.c - Codex's custom and local_shell tools as chat functions,
 * and their calls back as custom_tool_call / local_shell_call items (see
 * codex_items.h). */
#include <stdlib.h>
#include <string.h>

#include "serve/codex_items.h"

static json_t *string_prop(const char *description)
{
    return json_pack("{s:s, s:s}", "type", "string", "description", description);
}

static json_t *function_tool(const char *name, const char *description, json_t *properties,
                             json_t *required)
{
    return json_pack("{s:s, s:{s:s, s:s, s:{s:s, s:o, s:o, s:b}}}", "type", "function",
                     "function", "name", name, "description", description, "parameters", "type",
                     "object", "properties", properties, "required", required,
                     "additionalProperties", 0);
}

static json_t *local_shell_function(void)
{
    json_t *props = json_pack(
        "{s:{s:s, s:{s:s}, s:s}, s:o, s:{s:s, s:s}}", "command", "type", "array", "items", "type",
        "string", "description",
        "The command and its arguments, e.g. [\"bash\", \"-lc\", \"ls -la\"]", "workdir",
        string_prop("The directory to run it in"), "timeout_ms", "type", "integer",
        "description", "How long it may run, in milliseconds");
    return function_tool("local_shell", "Runs a command on the user's machine and returns its output.",
                         props, json_pack("[s]", "command"));
}

json_t *codex_tool_function(const json_t *tool, enum codex_kind *kind)
{
    const char *type = json_string_value(json_object_get(tool, "type"));
    if (type && !strcmp(type, "local_shell")) {
        *kind = CODEX_LOCAL_SHELL;
        return local_shell_function();
    }
    const char *name = json_string_value(json_object_get(tool, "name"));
    if (!type || strcmp(type, "custom") || !name)
        return NULL;
    /* The model cannot be held to a Lark grammar here, so it is told it. */
    struct buf d = {0};
    const char *desc = json_string_value(json_object_get(tool, "description"));
    buf_puts(&d, desc ? desc : "");
    const json_t *fmt = json_object_get(tool, "format");
    const char *ftype = json_string_value(json_object_get(fmt, "type"));
    const char *def = json_string_value(json_object_get(fmt, "definition"));
    if (ftype && !strcmp(ftype, "grammar") && def) {
        const char *syntax = json_string_value(json_object_get(fmt, "syntax"));
        buf_printf(&d, "%sThe input must follow this %s grammar:\n%s", d.n ? "\n\n" : "",
                   syntax ? syntax : "", def);
    }
    json_t *props = json_pack("{s:o}", "input",
                              string_prop("The tool's whole input, as raw text (not JSON)"));
    json_t *fn = function_tool(name, d.p ? d.p : "", props, json_pack("[s]", "input"));
    buf_free(&d);
    *kind = CODEX_CUSTOM;
    return fn;
}

/* An array of strings only. */
static bool strings(const json_t *a)
{
    size_t i;
    const json_t *v;
    json_array_foreach(a, i, v) if (!json_is_string(v)) return false;
    return json_is_array(a);
}

json_t *codex_call_item(enum codex_kind kind, const char *id, const char *call_id,
                        const char *status, const char *name, const char *args)
{
    if (kind == CODEX_FUNCTION)
        return NULL;
    const bool done = strcmp(status, "in_progress") != 0;
    json_t *a = json_loads(args ? args : "", JSON_DECODE_ANY, NULL);
    json_t *item = NULL;
    if (kind == CODEX_CUSTOM) {
        const json_t *in = json_object_get(a, "input");
        const char *input = !done ? "" : json_is_string(in) ? json_string_value(in) : args;
        item = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "custom_tool_call",
                         "status", status, "call_id", call_id, "name", name, "input",
                         input ? input : "");
    } else {
        json_t *cmd = json_object_get(a, "command");
        if (strings(cmd) && json_array_size(cmd) > 0) {
            const json_t *wd = json_object_get(a, "workdir"), *to = json_object_get(a, "timeout_ms");
            item = json_pack("{s:s, s:s, s:s, s:s, s:{s:s, s:O, s:O, s:O, s:{}, s:n}}", "id", id,
                             "type", "local_shell_call", "status", status, "call_id", call_id,
                             "action", "type", "exec", "command", cmd, "working_directory",
                             json_is_string(wd) ? wd : json_null(), "timeout_ms",
                             json_is_integer(to) ? to : json_null(), "env", "user");
        }
    }
    json_decref(a);
    return item;
}

const char *codex_call_input(const json_t *item)
{
    const char *s = json_string_value(json_object_get(item, "input"));
    return s ? s : "";
}

json_t *codex_item_call(const json_t *item, const char *param, struct api_error *ae)
{
    const char *type = json_string_value(json_object_get(item, "type"));
    const char *name = "local_shell";
    json_t *args = NULL;
    if (type && !strcmp(type, "custom_tool_call")) {
        const json_t *n = json_object_get(item, "name"), *in = json_object_get(item, "input");
        if (!json_is_string(n)) {
            api_fail(ae, 400, NULL, param, "'%s.name' must be a string", param);
            return NULL;
        }
        if (!json_is_string(in)) {
            api_fail(ae, 400, NULL, param, "'%s.input' must be a string", param);
            return NULL;
        }
        name = json_string_value(n);
        args = json_pack("{s:O}", "input", in);
    } else {
        const json_t *act = json_object_get(item, "action");
        const json_t *cmd = json_object_get(act, "command");
        if (!strings(cmd)) {
            api_fail(ae, 400, NULL, param, "'%s.action.command' must be an array of strings",
                     param);
            return NULL;
        }
        args = json_pack("{s:O}", "command", cmd);
        const json_t *wd = json_object_get(act, "working_directory");
        const json_t *to = json_object_get(act, "timeout_ms");
        if (args && json_is_string(wd))
            json_object_set(args, "workdir", (json_t *)wd);
        if (args && json_is_integer(to))
            json_object_set(args, "timeout_ms", (json_t *)to);
    }
    char *text = args ? json_dumps(args, JSON_COMPACT) : NULL;
    json_decref(args);
    const char *id = json_string_value(json_object_get(item, "call_id"));
    json_t *call = text ? chat_tool_call(id ? id : json_string_value(json_object_get(item, "id")),
                                         name, json_string(text))
                        : NULL;
    free(text);
    if (!call)
        api_fail(ae, 500, "server_error", NULL, "out of memory");
    return call;
}
