/* test_tool_grammar.c - a forced tool call as a grammar (serve/tool_grammar.c):
 * in each format the chat templates write, what the models write is a
 * sentence and what they must not is not; and every sentence checked is
 * split by the turn parser (serve/turn.c) into exactly the calls it holds,
 * so the grammar cannot force text the server would not read as calls. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "serve/tool_grammar.h"
#include "serve/turn.h"
#include "testutil.h"

#include <jansson.h>

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},"
    "\"required\":[\"city\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"ls\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"path\":{\"type\":\"string\",\"pattern\":\"^/\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";

struct calls {
    char names[512];
    int n, content;
};

static void on_event(void *ctx, const struct turn_event *ev)
{
    struct calls *c = ctx;
    if (ev->kind == TURN_TOOL_CALL) {
        strcat(c->names, ev->name);
        strcat(c->names, ";");
        c->n++;
    } else if (ev->kind == TURN_CONTENT) {
        for (size_t i = 0; i < ev->n; i++)
            c->content += ev->text[i] != '\n' && ev->text[i] != ' ';
    }
}

/* text must be a sentence and parse as exactly the calls named in want
 * ("a;b;"). */
static void yes(const struct grammar *g, struct turn_syntax syn, const char *text, const char *want)
{
    CHECK(grammar_accepts(g, text, strlen(text)), "should accept:\n%s", text);
    struct calls c = {{0}, 0, 0};
    struct turn t;
    turn_init(&t, syn, on_event, &c);
    turn_feed(&t, text, strlen(text));
    turn_finish(&t);
    turn_free(&t);
    CHECK(!strcmp(c.names, want) && c.content == 0, "parsed as calls \"%s\" (want \"%s\"), %d content bytes:\n%s",
          c.names, want, c.content, text);
}

static void no(const struct grammar *g, const char *text)
{
    CHECK(!grammar_accepts(g, text, strlen(text)), "should refuse:\n%s", text);
}

static struct grammar *make(struct turn_syntax *syn, const json_t *tools, const char *only,
                            bool single)
{
    struct err e = {{0}};
    syn->schema = tools;
    char *text = tool_call_gbnf(syn, tools, only, single, &e);
    CHECK(text != NULL, "tool_call_gbnf: %s", e.msg);
    if (!text)
        return NULL;
    struct grammar *g = grammar_parse(text, strlen(text), &e);
    CHECK(g != NULL, "%s\n%s", e.msg, text);
    free(text);
    return g;
}

int main(void)
{
    json_error_t je;
    json_t *tools = json_loads(TOOLS, 0, &je);
    CHECK(tools != NULL, "%s", je.text);

    /* Qwen2.5 / Qwen3 (Hermes JSON bodies), reasoning allowed first */
    struct turn_syntax q = {.tools = TURN_TOOLS_HERMES, .think = true};
    struct grammar *g = make(&q, tools, NULL, false);
    const char *w = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                    "</tool_call>";
    yes(g, q, w, "get_weather;");
    yes(g, q, "<think>\nThe user wants weather. <b>bold</b> </thin\n</think>\n\n<tool_call>\n"
              "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}\n"
              "</tool_call>", "get_weather;");
    yes(g, q, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
              "{\"name\": \"ls\", \"arguments\": {\"path\": \"/tmp\", \"extra\": [1]}}\n</tool_call>",
        "now;ls;");
    no(g, "Sure! <tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>");
    no(g, "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>");
    no(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 3}}\n</tool_call>");
    no(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 7}}\n</tool_call>");
    no(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call> and more");
    no(g, "<think>unclosed <tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>");
    no(g, "");
    grammar_free(g);

    /* one call: a second is refused; named: other tools are refused */
    g = make(&q, tools, NULL, true);
    yes(g, q, w, "get_weather;");
    no(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
          "{\"name\": \"now\", \"arguments\": {}}\n</tool_call>");
    grammar_free(g);
    g = make(&q, tools, "now", true);
    yes(g, q, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>", "now;");
    no(g, w);
    grammar_free(g);

    /* the prompt opened the reasoning: it must close before the call */
    struct turn_syntax open = {.tools = TURN_TOOLS_HERMES, .think = true, .think_open = true};
    g = make(&open, tools, NULL, false);
    yes(g, open, "Let me look.</think>\n\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n"
                 "</tool_call>", "now;");
    no(g, w);
    grammar_free(g);

    /* Qwen3-Coder's XML bodies */
    struct turn_syntax x = {.tools = TURN_TOOLS_HERMES, .xml_calls = true};
    g = make(&x, tools, NULL, false);
    yes(g, x, "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
              "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>", "get_weather;");
    yes(g, x, "<tool_call>\n<function=now>\n</function>\n</tool_call>", "now;");
    yes(g, x, "<tool_call>\n<function=ls>\n<parameter=path>\na </param b\n</parameter>\n"
              "</function>\n</tool_call>", "ls;");
    no(g, "<tool_call>\n<function=ls>\n<parameter=path>\na </parameter> b\n</parameter>\n"
          "</function>\n</tool_call>");
    no(g, "<tool_call>\n<function=get_weather>\n<parameter=town>\nX\n</parameter>\n</function>\n"
          "</tool_call>");
    grammar_free(g);

    /* Llama 3.x: the whole turn is JSON with "parameters", ';' between */
    struct turn_syntax l = {.tools = TURN_TOOLS_JSON};
    g = make(&l, tools, NULL, false);
    yes(g, l, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", "get_weather;");
    yes(g, l, "{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"now\", \"parameters\": {}}",
        "now;now;");
    no(g, "{\"name\": \"now\", \"arguments\": {}}");
    grammar_free(g);

    /* refusals */
    struct err e = {{0}};
    CHECK(!tool_call_gbnf(&q, tools, "rm", false, &e) && strstr(e.msg, "no tool named \"rm\""),
          "unknown name: %s", e.msg);
    struct turn_syntax none = {.tools = TURN_TOOLS_NONE};
    CHECK(!tool_call_gbnf(&none, tools, NULL, false, &e) && strstr(e.msg, "no format"),
          "no format: %s", e.msg);
    json_decref(tools);
    return test_summary("test_tool_grammar");
}
