/* test_turn.c - the assistant turn's split into reasoning, content and tool
 * calls (src/serve/turn.c): each case fed whole, cut at every byte into two
 * pieces, and a byte at a time must give the same reasoning, content and
 * calls; the syntax read from the shared models' real chat templates. */
#include <stdlib.h>
#include <string.h>

#include "serve/turn.h"
#include "testutil.h"

#include <jansson.h>

struct got {
    char reasoning[1024], content[1024], calls[1024]; /* calls: "name args|" each */
    int n_events;
    enum turn_kind last;
};

static void cat(char *dst, const char *p, size_t n)
{
    size_t l = strlen(dst);
    if (l + n < 1024) {
        memcpy(dst + l, p, n);
        dst[l + n] = 0;
    }
}

static void on_event(void *ctx, const struct turn_event *ev)
{
    struct got *g = ctx;
    g->n_events++;
    g->last = ev->kind;
    if (ev->kind == TURN_REASONING) {
        CHECK(ev->n > 0, "an empty reasoning event");
        cat(g->reasoning, ev->text, ev->n);
    } else if (ev->kind == TURN_CONTENT) {
        CHECK(ev->n > 0, "an empty content event");
        cat(g->content, ev->text, ev->n);
    } else {
        cat(g->calls, ev->name, strlen(ev->name));
        cat(g->calls, " ", 1);
        cat(g->calls, ev->args, strlen(ev->args));
        cat(g->calls, "|", 1);
    }
}

/* Feeds text cut at the given offsets (sorted, within the text). */
static void run(struct turn_syntax syn, const char *text, const size_t *cuts, int n_cuts,
                struct got *g)
{
    memset(g, 0, sizeof *g);
    struct turn t;
    turn_init(&t, syn, on_event, g);
    size_t at = 0, n = strlen(text);
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : n;
        CHECK(turn_feed(&t, text + at, end - at) == 0, "turn_feed failed");
        at = end;
    }
    CHECK(turn_finish(&t) == 0, "turn_finish failed");
    turn_free(&t);
}

static int n_cases;

static void expect(struct turn_syntax syn, const char *text, const char *reasoning,
                   const char *content, const char *calls)
{
    n_cases++;
    struct got g;
    run(syn, text, NULL, 0, &g);
    CHECK(!strcmp(g.reasoning, reasoning), "%s: reasoning [%s], want [%s]", text, g.reasoning,
          reasoning);
    CHECK(!strcmp(g.content, content), "%s: content [%s], want [%s]", text, g.content, content);
    CHECK(!strcmp(g.calls, calls), "%s: calls [%s], want [%s]", text, g.calls, calls);
    size_t n = strlen(text);
    int bad = 0;
    for (size_t c = 1; c < n; c++) { /* two pieces */
        struct got h;
        run(syn, text, &c, 1, &h);
        bad += strcmp(h.reasoning, g.reasoning) || strcmp(h.content, g.content) ||
               strcmp(h.calls, g.calls);
    }
    size_t *every = malloc(n * sizeof *every);
    for (size_t c = 1; c < n; c++)
        every[c - 1] = c;
    struct got h;
    run(syn, text, every, n ? (int)n - 1 : 0, &h); /* a byte at a time */
    free(every);
    bad += strcmp(h.reasoning, g.reasoning) || strcmp(h.content, g.content) ||
           strcmp(h.calls, g.calls);
    CHECK(bad == 0, "%s: %d cuts changed the result", text, bad);
}

/* Reasoning text streams before the turn ends: the events of a turn fed up
 * to its middle already hold its start. */
static void check_streams(void)
{
    struct turn_syntax syn = {.tools = TURN_TOOLS_HERMES, .think = true};
    struct got g = {0};
    struct turn t;
    turn_init(&t, syn, on_event, &g);
    const char *a = "<think>\nweighing it up\n", *b = "so</think>\n\nThe answer <tool_";
    turn_feed(&t, a, strlen(a));
    CHECK(!strcmp(g.reasoning, "weighing it up"), "reasoning not streamed: [%s]", g.reasoning);
    turn_feed(&t, b, strlen(b));
    CHECK(!strcmp(g.reasoning, "weighing it up\nso"), "reasoning [%s]", g.reasoning);
    CHECK(!strcmp(g.content, "The answer"), "content streamed up to a possible marker: [%s]",
          g.content);
    turn_feed(&t, "x", 1);
    CHECK(!strcmp(g.content, "The answer <tool_x"), "a marker that was not one: [%s]", g.content);
    turn_finish(&t);
    turn_free(&t);
}

static void check_syntax(void)
{
    const char *shared = getenv("CLLM_SHARED_DIR") ? getenv("CLLM_SHARED_DIR") : CLLM_SHARED_DIR;
    char path[1024];
    struct {
        const char *dir;
        enum turn_tools tools;
        bool think;
    } want[] = {{"qwen3", TURN_TOOLS_HERMES, true}, {"gemma3", TURN_TOOLS_NONE, false}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        snprintf(path, sizeof path, "%s/tokenizers/%s/tokenizer_config.json", shared, want[i].dir);
        json_t *cfg = test_json_load(path);
        const char *src = json_string_value(json_object_get(cfg, "chat_template"));
        CHECK(src != NULL, "%s: no chat_template", path);
        struct turn_syntax s = turn_syntax_of(src, "", 0, true);
        CHECK(s.tools == want[i].tools && s.think == want[i].think && !s.xml_calls,
              "%s: tools %d think %d, want %d %d", want[i].dir, (int)s.tools, (int)s.think,
              (int)want[i].tools, (int)want[i].think);
        s = turn_syntax_of(src, "", 0, false);
        CHECK(s.tools == TURN_TOOLS_NONE, "%s: tool calls parsed without tools", want[i].dir);
        json_decref(cfg);
    }
    const char *p = "<|im_start|>assistant\n<think>\n";
    struct turn_syntax s = turn_syntax_of("{{ '</think>' }}", p, strlen(p), false);
    CHECK(s.think && s.think_open, "a prompt ending in <think> opens the reasoning");
    p = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    s = turn_syntax_of("{{ '</think>' }}", p, strlen(p), false);
    CHECK(s.think && !s.think_open && s.think_done, "thinking off: the prompt closed it");
    CHECK(!turn_syntax_of("{{ '</think>' }}", "x", 1, false).think_done, "think_done unprompted");
    s = turn_syntax_of("{{ '<tool_call>\n<function=' }}", "", 0, true);
    CHECK(s.tools == TURN_TOOLS_HERMES && s.xml_calls, "Qwen3-Coder's template: XML bodies");
    s = turn_syntax_of("<|start_header_id|>{% if tools %}", "", 0, true);
    CHECK(s.tools == TURN_TOOLS_JSON, "a Llama 3 template with tools: JSON calls");
    s = turn_syntax_of(NULL, "", 0, true);
    CHECK(s.tools == TURN_TOOLS_NONE && !s.think, "no template: plain text");
}

/* A NUL byte in an XML parameter value (a byte-fallback token can write
 * one): not a call, whole and cut at every byte; the turn comes back as
 * content, the NUL included. */
struct raw {
    char content[256];
    size_t n;
    int calls;
};

static void on_raw(void *ctx, const struct turn_event *ev)
{
    struct raw *r = ctx;
    if (ev->kind == TURN_TOOL_CALL) {
        r->calls++;
    } else if (r->n + ev->n <= sizeof r->content) {
        memcpy(r->content + r->n, ev->text, ev->n);
        r->n += ev->n;
    }
}

static void check_nul_value(const json_t *schema)
{
    static const char text[] = "<tool_call>\n<function=edit>\n<parameter=path>\na\0b\n</parameter>\n"
                               "</function>\n</tool_call>";
    const size_t n = sizeof text - 1;
    const struct turn_syntax syns[] = {{.tools = TURN_TOOLS_HERMES, .schema = schema},
                                       {.tools = TURN_TOOLS_HERMES}};
    for (int s = 0; s < 2; s++) {
        for (size_t cut = 0; cut < n; cut++) { /* cut 0: whole */
            struct raw r = {0};
            struct turn t;
            turn_init(&t, syns[s], on_raw, &r);
            CHECK(turn_feed(&t, text, cut) == 0 && turn_feed(&t, text + cut, n - cut) == 0 &&
                      turn_finish(&t) == 0,
                  "a NUL value: the turn is fed");
            turn_free(&t);
            CHECK(r.calls == 0 && r.n == n && !memcmp(r.content, text, n),
                  "a NUL in a parameter value (schema %d, cut at %zu): %d calls, %zu of %zu bytes "
                  "of content",
                  s, cut, r.calls, r.n, n);
        }
    }
}

int main(void)
{
    const struct turn_syntax plain = {.tools = TURN_TOOLS_NONE};
    const struct turn_syntax qwen = {.tools = TURN_TOOLS_HERMES, .think = true};
    const struct turn_syntax qwen_open = {.tools = TURN_TOOLS_HERMES, .think = true, .think_open = true};
    const struct turn_syntax think_only = {.tools = TURN_TOOLS_NONE, .think = true};
    const struct turn_syntax llama = {.tools = TURN_TOOLS_JSON};
    /* Qwen3-Coder's XML calls: values typed by the tools' schemas */
    json_t *schema = json_loads(
        "[{\"type\": \"function\", \"function\": {\"name\": \"edit\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"path\": {\"type\": \"string\"}, \"line\": {\"type\": "
        "\"integer\"}, \"zip\": {\"type\": [\"string\", \"null\"]}, \"opts\": {\"type\": "
        "\"object\"}}}}}]",
        0, NULL);
    CHECK(schema != NULL, "the test's schema parses");
    const struct turn_syntax coder = {.tools = TURN_TOOLS_HERMES, .schema = schema};
    check_nul_value(schema);

    /* plain text is untouched, markers and all */
    expect(plain, "Hello <think>x</think> <tool_call>{}</tool_call>", "",
           "Hello <think>x</think> <tool_call>{}</tool_call>", "");
    expect(plain, "  leading and trailing  ", "", "  leading and trailing  ", "");
    /* reasoning */
    expect(qwen, "<think>\nstep one\nstep two\n</think>\n\nThe answer.", "step one\nstep two",
           "The answer.", "");
    expect(think_only, "\n<think>a</think>b", "a", "b", "");
    expect(qwen_open, "still thinking\n</think>\n\nDone", "still thinking", "Done", "");
    expect(qwen, "<think>\n\n</think>\n\nNo thoughts.", "", "No thoughts.", "");
    expect(qwen, "<think>cut off mid-thought\n", "cut off mid-thought", "", "");
    expect(qwen, "Not <think>at the start</think>", "", "Not <think>at the start</think>", "");
    expect(qwen, "<thin", "", "<thin", "");
    expect(qwen, "<thinking>x", "", "<thinking>x", "");
    /* Hermes tool calls */
    expect(qwen, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
           "", "", "get_weather {\"city\": \"Paris\"}|");
    expect(qwen,
           "<think>\nneed weather\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"a\", "
           "\"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": "
           "{\"x\": [1, 2]}}\n</tool_call>",
           "need weather", "Let me check.", "a {}|b {\"x\": [1, 2]}|");
    expect(qwen, "<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"k\\\": 1}\"}</tool_call>", "",
           "", "f {\"k\": 1}|");
    expect(qwen, "<tool_call>{\"name\":\"f\",\"parameters\":{\"k\":\"é\"}}</tool_call>", "", "",
           "f {\"k\": \"é\"}|");
    expect(qwen, "<tool_call>{\"name\":\"f\"}</tool_call>", "", "", "f {}|");
    /* not calls: back as content, as written */
    expect(qwen, "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call> after", "",
           "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call> after", "");
    expect(qwen, "<tool_call>not json</tool_call>", "", "<tool_call>not json</tool_call>", "");
    expect(qwen, "Hi\n\n<tool_call>[]</tool_call>\n<tool_call>{\"name\":\"g\"}</tool_call>", "",
           "Hi\n\n<tool_call>[]</tool_call>", "g {}|");
    expect(qwen, "text <tool_call>{\"name\": \"f\", \"argu", "", "text <tool_call>{\"name\": \"f\", \"argu", "");
    /* ended without the closing tag (EOS or a stop string right after) */
    expect(qwen, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n", "", "",
           "f {\"a\": 1}|");
    expect(qwen, "a <tool_ca", "", "a <tool_ca", "");
    expect(qwen, "<tool_call>{\"name\":\"f\"}</tool_call>\n\n", "", "", "f {}|");
    expect(coder,
           "I will edit it.\n<tool_call>\n<function=edit>\n<parameter=path>\nsrc/a.c\n</parameter>\n"
           "<parameter=line>\n42\n</parameter>\n<parameter=zip>\n02134\n</parameter>\n"
           "<parameter=opts>\n{\"dry\": true}\n</parameter>\n<parameter=other>\n7\n</parameter>\n"
           "</function>\n</tool_call>",
           "", "I will edit it.",
           "edit {\"path\": \"src/a.c\", \"line\": 42, \"zip\": \"02134\", \"opts\": {\"dry\": true}, "
           "\"other\": 7}|");
    expect(coder, "<tool_call><function=edit><parameter=path>two\nlines\n\n</parameter></function></tool_call>",
           "", "", "edit {\"path\": \"two\\nlines\\n\"}|");
    expect(coder, "<tool_call>\n<function=edit>\n</function>\n</tool_call>", "", "", "edit {}|");
    expect(coder, "<tool_call>\n<function=edit>\n<parameter=path>\nx\n</parameter>\n", "", "",
           "edit {\"path\": \"x\"}|");
    expect(qwen, "<tool_call><function=f><parameter=a>1</parameter></function></tool_call>", "", "",
           "f {\"a\": 1}|");
    expect(coder, "<tool_call><function=edit><parameter=path>x</function></tool_call>", "",
           "<tool_call><function=edit><parameter=path>x</function></tool_call>", "");
    expect(coder, "<tool_call><function=a b></function></tool_call>", "",
           "<tool_call><function=a b></function></tool_call>", "");
    expect(qwen, "<tool_call>{\"name\": \"a\\u0000b\"}</tool_call>", "",
           "<tool_call>{\"name\": \"a\\u0000b\"}</tool_call>", "");
    expect(coder, "<tool_call><function=>x</function></tool_call>", "",
           "<tool_call><function=>x</function></tool_call>", "");
    expect(coder, "<tool_call><function=edit></function> trailing</tool_call>", "",
           "<tool_call><function=edit></function> trailing</tool_call>", "");
    /* Llama 3.x JSON calls: the whole turn */
    expect(llama, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", "", "",
           "get_weather {\"city\": \"Oslo\"}|");
    expect(llama, " {\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"n\": 2}}",
           "", "", "a {}|b {\"n\": 2}|");
    expect(llama, "{\"answer\": 42}", "", "{\"answer\": 42}", "");
    expect(llama, "{\"name\": \"a\", \"parameters\": {}} and more", "", "{\"name\": \"a\", \"parameters\": {}} and more", "");
    expect(llama, "Plain {\"name\": \"a\"}", "", "Plain {\"name\": \"a\"}", "");
    check_streams();
    check_syntax();
    json_decref(schema);
    printf("turn: %d cases, each fed whole, in two pieces at every cut and a byte at a time\n",
           n_cases);
    return test_summary("test_turn");
}
