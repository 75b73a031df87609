/* anthropic.c - the Anthropic Messages adapter, POST /v1/messages: system +
 * content blocks -> chat_req; output (thinking, text and tool_use blocks)
 * as a message object or the streaming event grammar message_start, ping,
 * (content_block_start, content_block_delta*, content_block_stop)*,
 * message_delta, message_stop. */
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"

static const char *const text_types[] = {"text", NULL};

static const char *stop_reason(const struct gen_result *res, int n_calls)
{
    if (res->finish == GEN_FINISH_LENGTH)
        return "max_tokens";
    if (n_calls)
        return "tool_use";
    return res->stop_index >= 0 ? "stop_sequence" : "end_turn";
}

/* A tool_use block; its input starts empty when streamed (the arguments
 * follow as one input_json_delta). NULL when args is not an object. */
static json_t *tool_use_json(const char *name, const char *args, bool streamed)
{
    json_t *input = streamed ? json_object() : json_loads(args, 0, NULL);
    if (!json_is_object(input)) {
        json_decref(input);
        return NULL;
    }
    char id[64];
    serve_make_id(id, sizeof id, "toolu_");
    return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name", name, "input",
                     input);
}

/* A whole answer's blocks: thinking, then text (also when it is all there
 * is, even empty), then the tool calls. */
static json_t *content_json(const struct turn_parts *tp)
{
    json_t *content = json_array();
    if (tp->reasoning.n)
        json_array_append_new(content, json_pack("{s:s, s:o, s:s}", "type", "thinking",
                                                 "thinking",
                                                 json_text(tp->reasoning.p, tp->reasoning.n),
                                                 "signature", ""));
    if (tp->content.n || !json_array_size(tp->calls))
        json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text",
                                                 json_text(tp->content.p, tp->content.n)));
    size_t i;
    json_t *c;
    json_array_foreach(tp->calls, i, c) json_array_append_new(
        content, tool_use_json(json_string_value(json_object_get(c, "name")),
                               json_string_value(json_object_get(c, "arguments")), false));
    return content;
}

static json_t *usage_json(int in, int out, int cached)
{
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", in, "output_tokens", out,
                     "cache_creation_input_tokens", 0, "cache_read_input_tokens", cached);
}

static json_t *message_json(const char *id, const char *model, json_t *content,
                            const char *stop_reason, const char *stop_seq, json_t *usage)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o}", "id", id, "type", "message",
                     "role", "assistant", "model", model, "content", content, "stop_reason",
                     stop_reason ? json_string(stop_reason) : json_null(), "stop_sequence",
                     stop_seq ? json_string(stop_seq) : json_null(), "usage", usage);
}

/* ---- request ---- */

/* A tool_result's content: a string or text blocks. */
static int tool_result_text(const json_t *block, const char *param, struct buf *t,
                            struct api_error *ae)
{
    return content_text(json_object_get(block, "content"), param, text_types, t, ae);
}

/* Blocks of tools another server ran (Anthropic's web search and fetch,
 * code execution, the MCP connector): a conversation begun there goes on
 * here without them, as it does without its earlier thinking. */
static bool ran_elsewhere(const char *type)
{
    static const char *const names[] = {"server_tool_use", "mcp_tool_use", "mcp_tool_result",
                                        "container_upload", NULL};
    if (name_among(type, names))
        return true;
    const size_t n = strlen(type), k = strlen("_tool_result");
    return n > k && !strcmp(type + n - k, "_tool_result");
}

/* A document block of plain text (source type "text", or "content" of
 * text blocks) or a search_result's text blocks, into t after its title. */
static int document_text(const json_t *b, const char *param, struct buf *t,
                         struct api_error *ae)
{
    const char *title = json_string_value(json_object_get(b, "title"));
    if (title && *title) {
        buf_puts(t, title);
        buf_puts(t, "\n\n");
    }
    const json_t *src = json_object_get(b, "source");
    if (!strcmp(json_string_value(json_object_get(b, "type")), "search_result"))
        return content_text(json_object_get(b, "content"), param, text_types, t, ae);
    const char *st = json_string_value(json_object_get(src, "type"));
    const json_t *data = json_object_get(src, "data");
    if (st && !strcmp(st, "text") && json_is_string(data)) {
        buf_putn(t, json_string_value(data), json_string_length(data));
        return 0;
    }
    if (st && !strcmp(st, "content"))
        return content_text(json_object_get(src, "content"), param, text_types, t, ae);
    return api_fail(ae, 400, NULL, param,
                    "'%s': documents of source type '%s' are not supported (this server takes "
                    "text only)", param, st ? st : "(none)");
}

/* One Anthropic message -> one or more template messages (tool results
 * become "tool" messages; tool_use blocks become OpenAI-style tool_calls,
 * which is what Hugging Face chat templates read). */
static int add_message(json_t *out, const json_t *m, size_t i, struct api_error *ae)
{
    char param[80];
    snprintf(param, sizeof param, "messages[%zu]", i);
    if (!json_is_object(m))
        return api_fail(ae, 400, NULL, param, "'%s' must be an object", param);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant"))) {
        snprintf(param, sizeof param, "messages[%zu].role", i);
        return api_fail(ae, 400, NULL, param, "'%s' must be \"user\" or \"assistant\"", param);
    }
    const json_t *content = json_object_get(m, "content");
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (json_is_string(content)) {
        json_array_append_new(out, json_pack("{s:s, s:O}", "role", role, "content", content));
        return 0;
    }
    if (!json_is_array(content))
        return api_fail(ae, 400, NULL, param, "'%s' must be a string or an array of blocks",
                        param);
    struct buf text = {0};
    json_t *calls = json_array();
    size_t k;
    const json_t *b;
    json_array_foreach(content, k, b) {
        const char *type = json_string_value(json_object_get(b, "type"));
        char bp[112];
        snprintf(bp, sizeof bp, "%s[%zu]", param, k);
        if (!type) {
            api_fail(ae, 400, NULL, bp, "'%s' must be an object with a 'type'", bp);
            goto fail;
        }
        if (!strcmp(type, "text")) {
            const json_t *t = json_object_get(b, "text");
            if (!json_is_string(t)) {
                api_fail(ae, 400, NULL, bp, "'%s.text' must be a string", bp);
                goto fail;
            }
            buf_putn(&text, json_string_value(t), json_string_length(t));
        } else if (!strcmp(type, "tool_result")) {
            struct buf t = {0};
            if (tool_result_text(b, bp, &t, ae)) {
                buf_free(&t);
                goto fail;
            }
            json_t *tm = json_pack("{s:s, s:o}", "role", "tool", "content", json_text(t.p, t.n));
            buf_free(&t);
            const json_t *id = json_object_get(b, "tool_use_id");
            if (json_is_string(id))
                json_object_set(tm, "tool_call_id", (json_t *)id);
            json_array_append_new(out, tm);
        } else if (!strcmp(type, "tool_use")) {
            const json_t *name = json_object_get(b, "name"), *input = json_object_get(b, "input");
            if (!json_is_string(name)) {
                api_fail(ae, 400, NULL, bp, "'%s.name' must be a string", bp);
                goto fail;
            }
            json_array_append_new(
                calls, chat_tool_call(json_string_value(json_object_get(b, "id")),
                                      json_string_value(name),
                                      input ? json_incref((json_t *)input) : json_object()));
        } else if (!strcmp(type, "document") || !strcmp(type, "search_result")) {
            if (document_text(b, bp, &text, ae))
                goto fail;
        } else if (!strcmp(type, "thinking") || !strcmp(type, "redacted_thinking") ||
                   ran_elsewhere(type)) {
            /* earlier reasoning is not replayed into the prompt */
        } else {
            api_fail(ae, 400, NULL, bp,
                     "'%s': content of type '%s' is not supported (this server takes text only)",
                     bp, type);
            goto fail;
        }
    }
    if (text.n || json_array_size(calls) || json_array_size(content) == 0) {
        json_t *nm = json_pack("{s:s, s:o}", "role", role, "content", json_text(text.p, text.n));
        if (json_array_size(calls))
            json_object_set(nm, "tool_calls", calls);
        json_array_append_new(out, nm);
    }
    json_decref(calls);
    buf_free(&text);
    return 0;
fail:
    json_decref(calls);
    buf_free(&text);
    return -1;
}

static int parse_request(const json_t *req, struct chat_req *r, bool need_max,
                         struct api_error *ae)
{
    struct opt_i mt = {0};
    if (field_int(req, "max_tokens", 1, 10000000, &mt, ae))
        return -1;
    if (!mt.set && need_max)
        return api_fail(ae, 400, NULL, "max_tokens", "max_tokens: Field required");
    r->max_tokens = mt.v;
    const char *model = NULL;
    if (field_string(req, "model", &model, ae) || field_sampling(req, r, ae) ||
        field_stops(req, "stop_sequences", r, ae) || field_bool(req, "stream", &r->stream, ae))
        return -1;
    const json_t *msgs = json_object_get(req, "messages");
    if (!json_is_array(msgs))
        return api_fail(ae, 400, NULL, "messages", "messages: Field required (an array)");
    if (json_array_size(msgs) == 0)
        return api_fail(ae, 400, NULL, "messages", "messages: at least one message is required");
    r->messages = json_array();
    const json_t *sys = json_object_get(req, "system");
    if (sys && !json_is_null(sys)) {
        struct buf t = {0};
        if (content_text(sys, "system", text_types, &t, ae)) {
            buf_free(&t);
            return -1;
        }
        json_array_append_new(r->messages,
                              json_pack("{s:s, s:o}", "role", "system", "content", json_text(t.p, t.n)));
        buf_free(&t);
    }
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        if (add_message(r->messages, m, i, ae))
            return -1;
    }
    /* tools: {name, description, input_schema} -> the OpenAI form templates read */
    json_t *tools = NULL;
    if (field_tool_choice(req, r, ae) || field_array(req, "tools", &tools, ae) ||
        field_structured(req, "output_format", "output_format", r, ae))
        return -1;
    if (tools && json_array_size(tools)) {
        r->tools = json_array();
        const json_t *t;
        json_array_foreach(tools, i, t) {
            const json_t *name = json_object_get(t, "name");
            if (!json_is_string(name)) {
                char p[48];
                snprintf(p, sizeof p, "tools[%zu].name", i);
                return api_fail(ae, 400, NULL, p, "'%s' must be a string", p);
            }
            json_t *fn = json_pack("{s:O}", "name", name);
            const json_t *d = json_object_get(t, "description"), *s = json_object_get(t, "input_schema");
            if (d)
                json_object_set(fn, "description", (json_t *)d);
            if (s)
                json_object_set(fn, "parameters", (json_t *)s);
            json_array_append_new(r->tools, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        }
    }
    json_t *thinking = NULL;
    if (field_object(req, "thinking", &thinking, ae))
        return -1;
    const char *tt = json_string_value(json_object_get(thinking, "type"));
    if (tt)
        r->thinking = strcmp(tt, "disabled") != 0;
    return 0;
}

/* ---- SSE ---- */

enum { BLOCK_NONE, BLOCK_TEXT, BLOCK_THINKING };

struct ant_stream {
    char id[64];
    char model[256];
    int index; /* the open block's, or the next one's */
    int open;  /* BLOCK_*: the block open now */
};

static void ev(struct stream *s, const char *name, json_t *data)
{
    sbuf_sse(&s->out, name, data);
    json_decref(data);
}

static void ant_begin(struct stream *s)
{
    struct ant_stream *a = s->st;
    ev(s, "message_start",
       json_pack("{s:s, s:o}", "type", "message_start", "message",
                 message_json(a->id, a->model, json_array(), NULL, NULL,
                              usage_json(gen_prompt_tokens(s->gen), 0, 0))));
    ev(s, "ping", json_pack("{s:s}", "type", "ping"));
}

static void block_stop(struct stream *s)
{
    struct ant_stream *a = s->st;
    if (a->open == BLOCK_NONE)
        return;
    ev(s, "content_block_stop",
       json_pack("{s:s, s:i}", "type", "content_block_stop", "index", a->index));
    a->index++;
    a->open = BLOCK_NONE;
}

/* Opens a text or thinking block unless one of that kind is open. */
static void block_open(struct stream *s, int kind)
{
    struct ant_stream *a = s->st;
    if (a->open == kind)
        return;
    block_stop(s);
    json_t *b = kind == BLOCK_TEXT
                    ? json_pack("{s:s, s:s}", "type", "text", "text", "")
                    : json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "");
    ev(s, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start",
                                           "index", a->index, "content_block", b));
    a->open = kind;
}

/* A text or thinking delta, in a block of its kind. */
static void ant_text(struct stream *s, enum turn_kind kind, const char *text, size_t n)
{
    struct ant_stream *a = s->st;
    const bool is_text = kind != TURN_REASONING;
    block_open(s, is_text ? BLOCK_TEXT : BLOCK_THINKING);
    ev(s, "content_block_delta",
       json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index", a->index,
                 "delta", "type", is_text ? "text_delta" : "thinking_delta",
                 is_text ? "text" : "thinking", json_text(text, n)));
}

static void ant_tool_call(struct stream *s, const char *name, const char *args)
{
    struct ant_stream *a = s->st;
    json_t *b = tool_use_json(name, args, true);
    if (!b) {
        s->out.oom = true;
        return;
    }
    block_stop(s);
    ev(s, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start",
                                           "index", a->index, "content_block", b));
    ev(s, "content_block_delta",
       json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", a->index,
                 "delta", "type", "input_json_delta", "partial_json", args));
    ev(s, "content_block_stop",
       json_pack("{s:s, s:i}", "type", "content_block_stop", "index", a->index));
    a->index++;
}

static void ant_end(struct stream *s, const struct gen_result *res)
{
    struct api_error ae;
    if (gen_failed(res, NULL, &ae)) {
        ev(s, "error", api_error_body(&ae, SHAPE_ANTHROPIC));
        return;
    }
    struct ant_stream *a = s->st;
    if (a->index == 0 && a->open == BLOCK_NONE)
        block_open(s, BLOCK_TEXT); /* an empty answer is one empty text block */
    block_stop(s);
    ev(s, "message_delta",
       json_pack("{s:s, s:{s:s, s:o}, s:{s:i, s:i}}", "type", "message_delta", "delta",
                 "stop_reason", stop_reason(res, s->turn.n_calls), "stop_sequence",
                 res->stop ? json_string(res->stop) : json_null(), "usage", "output_tokens",
                 res->n_completion, "cache_read_input_tokens", res->n_cached));
    ev(s, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static const struct stream_ops ant_ops = {ant_begin, ant_text, ant_tool_call, ant_end, free};

/* ---- POST /v1/messages/count_tokens ---- */

void anthropic_count_tokens(struct server *srv, const json_t *req, const struct client *cl,
                            struct reply *rp)
{
    (void)cl;
    struct chat_req r = {.thinking = -1};
    struct api_error ae;
    int n = -1;
    if (parse_request(req, &r, false, &ae) || (n = gen_count_prompt(srv, &r, &ae)) < 0) {
        chat_req_free(&r);
        reply_error(rp, &ae, SHAPE_ANTHROPIC);
        return;
    }
    chat_req_free(&r);
    rp->status = 200;
    rp->body = json_pack("{s:i}", "input_tokens", n);
}

/* ---- POST /v1/messages ---- */

void anthropic_messages(struct server *srv, const json_t *req, const struct client *cl,
                        struct reply *rp)
{
    struct chat_req r = {.thinking = -1};
    struct api_error ae;
    struct gen *g;
    if (parse_request(req, &r, true, &ae) || gen_start(srv, &r, &g, &ae)) {
        chat_req_free(&r);
        reply_error(rp, &ae, SHAPE_ANTHROPIC);
        return;
    }
    bool stream = r.stream;
    chat_req_free(&r);
    char id[64];
    serve_make_id(id, sizeof id, "msg_");
    if (stream) {
        struct ant_stream *a = calloc(1, sizeof *a);
        if (a) {
            snprintf(a->id, sizeof a->id, "%s", id);
            snprintf(a->model, sizeof a->model, "%s", reply_model_name(srv, req));
            rp->stream = stream_new(srv, g, &ant_ops, a);
        } else {
            gen_free(g);
        }
        rp->status = 200;
        if (!rp->stream) {
            api_fail(&ae, 500, NULL, NULL, "out of memory");
            reply_error(rp, &ae, SHAPE_ANTHROPIC);
        }
        return;
    }
    struct buf text = {0};
    struct gen_result res;
    struct turn_parts tp = {0};
    if (gen_collect(g, &text, &res, cl)) {
        rp->status = 0; /* the client left */
    } else if (gen_failed(&res, NULL, &ae)) {
        reply_error(rp, &ae, SHAPE_ANTHROPIC);
    } else if (text.oom || turn_parts_split(gen_syntax(g), text.p, text.n, &tp)) {
        api_fail(&ae, 500, NULL, NULL, "out of memory");
        reply_error(rp, &ae, SHAPE_ANTHROPIC);
    } else {
        rp->status = 200;
        rp->body = message_json(id, reply_model_name(srv, req), content_json(&tp),
                                stop_reason(&res, (int)json_array_size(tp.calls)),
                                res.stop, /* owned by g: used before gen_free */
                                usage_json(res.n_prompt, res.n_completion, res.n_cached));
    }
    buf_free(&text);
    turn_parts_free(&tp);
    gen_free(g);
}
