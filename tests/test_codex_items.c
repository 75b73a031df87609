/* test_codex_items.c - Codex's custom and local_shell Responses tools
 * (serve/codex_items.c): the functions the chat template is given for
 * them, the output items the model's calls become, the history items
 * going back in as tool calls, and the round trip between the two. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "serve/codex_items.h"
#include "testutil.h"

static json_t *parse(const char *s)
{
    json_t *v = json_loads(s, 0, NULL);
    CHECK(v, "test JSON does not parse: %s", s);
    return v;
}

static const char *str(const json_t *obj, const char *path)
{
    /* "a.b.c": nested object keys */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const json_t *v = obj;
    for (char *k = strtok(buf, "."); k && v; k = strtok(NULL, "."))
        v = json_object_get(v, k);
    return json_string_value(v);
}

/* The string at path is want (a missing one is not). */
static bool is(const json_t *obj, const char *path, const char *want)
{
    const char *v = str(obj, path);
    return v && !strcmp(v, want);
}

/* The call's arguments, parsed. */
static json_t *call_args(const json_t *call)
{
    const char *a = str(call, "function.arguments");
    return a ? json_loads(a, 0, NULL) : NULL;
}

static void test_tools(void)
{
    enum codex_kind kind = CODEX_FUNCTION;
    json_t *t = parse("{\"type\":\"custom\",\"name\":\"apply_patch\",\"description\":\"Edit files.\","
                      "\"format\":{\"type\":\"grammar\",\"syntax\":\"lark\",\"definition\":"
                      "\"start: begin_patch hunk+ end_patch\"}}");
    json_t *fn = codex_tool_function(t, &kind);
    CHECK(fn && kind == CODEX_CUSTOM, "a custom tool becomes a function");
    const char *d = str(fn, "function.description");
    CHECK(str(fn, "type") && is(fn, "type", "function") &&
              is(fn, "function.name", "apply_patch"),
          "name kept");
    CHECK(d && !strncmp(d, "Edit files.\n\n", 13) && strstr(d, "lark grammar") &&
              strstr(d, "start: begin_patch hunk+ end_patch"),
          "the grammar is in the description: %s", d ? d : "(null)");
    const json_t *par = json_object_get(json_object_get(fn, "function"), "parameters");
    json_t *req = json_pack("[s]", "input");
    CHECK(is(par, "properties.input.type", "string") &&
              json_equal(json_object_get(par, "required"), req) &&
              json_is_false(json_object_get(par, "additionalProperties")),
          "one required string, input");
    json_decref(req);
    json_decref(fn);
    json_decref(t);

    t = parse("{\"type\":\"custom\",\"name\":\"note\",\"format\":{\"type\":\"text\"}}");
    fn = codex_tool_function(t, &kind);
    CHECK(fn && kind == CODEX_CUSTOM && is(fn, "function.description", ""),
          "a text-format custom tool without a description");
    json_decref(fn);
    json_decref(t);

    t = parse("{\"type\":\"local_shell\"}");
    fn = codex_tool_function(t, &kind);
    CHECK(fn && kind == CODEX_LOCAL_SHELL && is(fn, "function.name", "local_shell") &&
              is(fn, "function.parameters.properties.command.type", "array") &&
              is(fn, "function.parameters.properties.command.items.type", "string"),
          "local_shell becomes a function taking argv");
    json_decref(fn);
    json_decref(t);

    const char *others[] = {"{\"type\":\"function\",\"name\":\"f\"}", "{\"type\":\"web_search\"}",
                            "{\"type\":\"custom\"}", "{\"name\":\"x\"}"};
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        t = parse(others[i]);
        CHECK(!codex_tool_function(t, &kind), "not one of Codex's kinds: %s", others[i]);
        json_decref(t);
    }
}

static void test_call_items(void)
{
    /* a custom tool's input, as the model wrote it in the function form */
    json_t *it = codex_call_item(CODEX_CUSTOM, "ctc_1", "call_1", "completed", "apply_patch",
                                 "{\"input\":\"*** Begin Patch\\n*** End Patch\"}");
    CHECK(it && is(it, "type", "custom_tool_call") && is(it, "id", "ctc_1") &&
              is(it, "call_id", "call_1") && is(it, "name", "apply_patch") &&
              is(it, "status", "completed") &&
              !strcmp(codex_call_input(it), "*** Begin Patch\n*** End Patch"),
          "custom_tool_call with its input");
    json_decref(it);
    /* arguments that are not {"input": string}: the text itself */
    const char *odd[] = {"{\"days\":3}", "plain text", "{\"input\":7}"};
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) {
        it = codex_call_item(CODEX_CUSTOM, "ctc_2", "call_2", "completed", "n", odd[i]);
        CHECK(it && !strcmp(codex_call_input(it), odd[i]), "input %s: %s", odd[i],
              it ? codex_call_input(it) : "(null)");
        json_decref(it);
    }
    it = codex_call_item(CODEX_CUSTOM, "ctc_3", "call_3", "in_progress", "n", "{\"input\":\"x\"}");
    CHECK(it && !strcmp(codex_call_input(it), "") && is(it, "status", "in_progress"),
          "a streamed item starts empty");
    json_decref(it);

    it = codex_call_item(CODEX_LOCAL_SHELL, "lsc_1", "call_4", "completed", "local_shell",
                         "{\"command\":[\"bash\",\"-lc\",\"ls\"],\"workdir\":\"/tmp\","
                         "\"timeout_ms\":5000}");
    json_t *want = parse("{\"type\":\"exec\",\"command\":[\"bash\",\"-lc\",\"ls\"],"
                         "\"working_directory\":\"/tmp\",\"timeout_ms\":5000,\"env\":{},"
                         "\"user\":null}");
    CHECK(it && is(it, "type", "local_shell_call") &&
              is(it, "call_id", "call_4") &&
              json_equal(json_object_get(it, "action"), want),
          "local_shell_call's exec action");
    json_decref(want);
    json_decref(it);
    it = codex_call_item(CODEX_LOCAL_SHELL, "lsc_2", "call_5", "completed", "local_shell",
                         "{\"command\":[\"ls\"]}");
    CHECK(it && json_is_null(json_object_get(json_object_get(it, "action"), "working_directory")) &&
              json_is_null(json_object_get(json_object_get(it, "action"), "timeout_ms")),
          "optional action fields null");
    json_decref(it);
    const char *bad[] = {"{\"command\":\"ls\"}", "{\"command\":[]}", "{\"command\":[1]}",
                         "{}", "not json"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(!codex_call_item(CODEX_LOCAL_SHELL, "l", "c", "completed", "local_shell", bad[i]),
              "no local_shell_call from %s", bad[i]);
    CHECK(!codex_call_item(CODEX_FUNCTION, "f", "c", "completed", "f", "{}"),
          "a function's call is the caller's");
}

static void test_history(void)
{
    struct api_error ae;
    json_t *it = parse("{\"type\":\"custom_tool_call\",\"id\":\"ctc_1\",\"call_id\":\"call_9\","
                       "\"name\":\"apply_patch\",\"input\":\"*** Begin Patch\"}");
    json_t *call = codex_item_call(it, "input[3]", &ae);
    json_t *a = call ? call_args(call) : NULL;
    CHECK(call && is(call, "id", "call_9") && is(call, "type", "function") &&
              is(call, "function.name", "apply_patch") && a &&
              is(a, "input", "*** Begin Patch"),
          "custom_tool_call -> a call with {input}");
    /* and back: the model's own form gives the same input */
    json_t *back = call ? codex_call_item(CODEX_CUSTOM, "x", "y", "completed", "apply_patch",
                                          str(call, "function.arguments"))
                        : NULL;
    CHECK(back && !strcmp(codex_call_input(back), "*** Begin Patch"), "custom round trip");
    json_decref(back);
    json_decref(a);
    json_decref(call);
    json_decref(it);

    it = parse("{\"type\":\"local_shell_call\",\"id\":\"lsc_7\",\"status\":\"completed\","
               "\"action\":{\"type\":\"exec\",\"command\":[\"ls\",\"-a\"],"
               "\"working_directory\":\"/w\",\"timeout_ms\":100,\"env\":{}}}");
    call = codex_item_call(it, "input[4]", &ae);
    a = call ? call_args(call) : NULL;
    json_t *want = parse("{\"command\":[\"ls\",\"-a\"],\"workdir\":\"/w\",\"timeout_ms\":100}");
    CHECK(call && is(call, "id", "lsc_7") &&
              is(call, "function.name", "local_shell") && json_equal(a, want),
          "local_shell_call -> a local_shell call (its id where there is no call_id)");
    back = call ? codex_call_item(CODEX_LOCAL_SHELL, "x", "y", "completed", "local_shell",
                                  str(call, "function.arguments"))
                : NULL;
    CHECK(back && json_equal(json_object_get(json_object_get(back, "action"), "command"),
                             json_object_get(want, "command")),
          "local_shell round trip");
    json_decref(back);
    json_decref(want);
    json_decref(a);
    json_decref(call);
    json_decref(it);

    const char *bad[][2] = {
        {"{\"type\":\"custom_tool_call\",\"input\":\"x\"}", "'input[0].name' must be a string"},
        {"{\"type\":\"custom_tool_call\",\"name\":\"n\",\"input\":3}", "'input[0].input' must be a string"},
        {"{\"type\":\"local_shell_call\",\"action\":{}}", "'input[0].action.command' must be an array of strings"},
        {"{\"type\":\"local_shell_call\",\"action\":{\"command\":[\"ls\",2]}}", "'input[0].action.command' must be an array of strings"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        it = parse(bad[i][0]);
        memset(&ae, 0, sizeof ae);
        call = codex_item_call(it, "input[0]", &ae);
        CHECK(!call && ae.status == 400 && !strcmp(ae.message, bad[i][1]) &&
                  !strcmp(ae.param, "input[0]"),
              "%s: %d %s", bad[i][0], ae.status, ae.message);
        json_decref(call);
        json_decref(it);
    }
}

int main(void)
{
    test_tools();
    test_call_items();
    test_history();
    return test_summary("test_codex_items");
}
