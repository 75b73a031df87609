/* turn.h - splits an assistant turn's generated text, as it streams in,
 * into reasoning, content and tool calls, in the formats chat models are
 * trained to write them.
 *
 * Contract: feed the text in any pieces (it is the same turn cut anywhere,
 * even inside a marker or a UTF-8 sequence); events come out in order, and
 * their texts concatenated by kind are the same whatever the cuts. Nothing
 * is lost: a tool call that does not parse comes back as content, markers
 * and all. Text that may still become a marker is held until it cannot. */
#ifndef CLLM_SERVE_TURN_H
#define CLLM_SERVE_TURN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

enum turn_tools {
    TURN_TOOLS_NONE,   /* no tool calls are parsed */
    TURN_TOOLS_HERMES, /* <tool_call>{"name": .., "arguments": {..}}</tool_call>, any
                        * number (Qwen2.5, Qwen3, Hermes, ...); the body may
                        * also be <function=NAME><parameter=KEY>VALUE</parameter>
                        * ...</function> (Qwen3-Coder) */
    TURN_TOOLS_JSON    /* the whole turn is {"name": .., "parameters": {..}} (or
                        * "arguments"), or several separated by ';' (Llama 3.1-3.3) */
};

struct turn_syntax {
    enum turn_tools tools;
    bool think;      /* <think>..</think> opening the turn is reasoning */
    bool think_open; /* the prompt ends inside <think>: the turn starts as reasoning */
    bool think_done; /* the prompt ends with </think>: reasoning is off this turn
                      * (Qwen3's enable_thinking false writes an empty block) */
    /* the request's tools in the chat form ([{type, function: {name,
     * parameters}}], borrowed; may be NULL): the types of XML parameter
     * values */
    const json_t *schema;
    bool xml_calls; /* HERMES: the template shows Qwen3-Coder's XML bodies
                     * (what a forced call is held to; both parse) */
};

/* What a model writes, from its chat template's source (NULL: none) and
 * the rendered prompt: tool calls only when the request has tools. */
struct turn_syntax turn_syntax_of(const char *template_src, const char *prompt, size_t prompt_len,
                                  bool has_tools);

enum turn_kind { TURN_REASONING, TURN_CONTENT, TURN_TOOL_CALL };

struct turn_event {
    enum turn_kind kind;
    const char *text; /* REASONING, CONTENT: a piece of text */
    size_t n;
    const char *name; /* TOOL_CALL: the function's name, and */
    const char *args; /* its arguments, a JSON object as text ({"k": 1}) */
};

typedef void (*turn_emit_fn)(void *ctx, const struct turn_event *ev);

struct turn {
    struct turn_syntax syn;
    int state;
    bool after_think; /* a reasoning block has closed */
    bool reasoned;    /* some reasoning text was emitted */
    int n_calls;      /* tool calls emitted (during a call's event: before it,
                       * so its index) */
    size_t call_body; /* in a call: where its JSON starts in buf, and */
    size_t call_scan; /* where the search for its end goes on (before: no end) */
    char *buf;        /* text not yet emitted */
    size_t n, cap;
    bool oom;
    turn_emit_fn emit;
    void *ctx;
};

/* The longest tail of p[0..n) that is a proper beginning of marker[0..m):
 * text that may still become it, and is held (markers here, stop strings
 * in chat.c). */
size_t turn_held_tail(const char *p, size_t n, const char *marker, size_t m);

void turn_init(struct turn *t, struct turn_syntax syn, turn_emit_fn emit, void *ctx);
/* Takes the next piece of the turn. -1 when out of memory (t->oom). */
int turn_feed(struct turn *t, const char *text, size_t n);
/* The turn has ended: emits what was held (an unclosed call is parsed as
 * it stands, or comes back as content). */
int turn_finish(struct turn *t);
void turn_free(struct turn *t);

#endif
