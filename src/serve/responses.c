/* responses.c - the OpenAI Responses adapter, POST /v1/responses: input
 * string or items + instructions -> chat_req; output items (reasoning, the
 * message, function_call) as a response object or the response.* event
 * stream (with sequence_number); finished
 * conversations are kept in a bounded LRU so previous_response_id continues
 * them, and GET /v1/responses/{id} returns the stored object. */
#include <stdlib.h>
#include <string.h>

#include "serve/codex_items.h"
#include "serve/internal.h"

/* ---- the store ---- */

struct stored {
    char id[64];
    json_t *messages; /* the conversation including the answer (no instructions) */
    json_t *response; /* the response object */
    uint64_t used;
};

struct response_store {
    pthread_mutex_t mu;
    struct stored *e;
    int n, cap;
    uint64_t clock;
};

struct response_store *response_store_new(int cap)
{
    struct response_store *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->cap = cap;
    st->e = calloc((size_t)(cap > 0 ? cap : 1), sizeof *st->e);
    if (!st->e) {
        free(st);
        return NULL;
    }
    pthread_mutex_init(&st->mu, NULL);
    return st;
}

void response_store_free(struct response_store *st)
{
    if (!st)
        return;
    for (int i = 0; i < st->n; i++) {
        json_decref(st->e[i].messages);
        json_decref(st->e[i].response);
    }
    pthread_mutex_destroy(&st->mu);
    free(st->e);
    free(st);
}

/* Takes the references. */
static void store_put(struct response_store *st, const char *id, json_t *messages,
                      json_t *response)
{
    if (!st || st->cap <= 0 || !messages || !response) {
        json_decref(messages);
        json_decref(response);
        return;
    }
    pthread_mutex_lock(&st->mu);
    int slot = st->n;
    if (st->n == st->cap) { /* evict the least recently used */
        slot = 0;
        for (int i = 1; i < st->n; i++)
            if (st->e[i].used < st->e[slot].used)
                slot = i;
        json_decref(st->e[slot].messages);
        json_decref(st->e[slot].response);
    } else {
        st->n++;
    }
    snprintf(st->e[slot].id, sizeof st->e[slot].id, "%s", id);
    st->e[slot].messages = messages;
    st->e[slot].response = response;
    st->e[slot].used = ++st->clock;
    pthread_mutex_unlock(&st->mu);
}

/* A deep copy of the stored messages or response object, or NULL. */
static json_t *store_get(struct response_store *st, const char *id, bool response)
{
    json_t *out = NULL;
    if (!st)
        return NULL;
    pthread_mutex_lock(&st->mu);
    for (int i = 0; i < st->n; i++)
        if (!strcmp(st->e[i].id, id)) {
            st->e[i].used = ++st->clock;
            out = json_deep_copy(response ? st->e[i].response : st->e[i].messages);
            break;
        }
    pthread_mutex_unlock(&st->mu);
    return out;
}

json_t *responses_get(struct server *srv, const char *id) { return store_get(srv->store, id, true); }

/* ---- request ---- */

static const char *const part_types[] = {"input_text", "output_text", "text", NULL};

/* Takes call. The calls of one answer (and its text before them) are one
 * assistant turn, as the model wrote them. */
static void append_call(json_t *out, json_t *call)
{
    json_t *last = json_array_get(out, json_array_size(out) - 1);
    const char *lr = json_string_value(json_object_get(last, "role"));
    if (lr && !strcmp(lr, "assistant")) {
        json_t *calls = json_object_get(last, "tool_calls");
        if (!json_is_array(calls))
            json_object_set_new(last, "tool_calls", calls = json_array());
        json_array_append_new(calls, call);
        return;
    }
    json_array_append_new(out, json_pack("{s:s, s:s, s:[o]}", "role", "assistant", "content", "",
                                         "tool_calls", call));
}

/* Items another server made: the calls of tools OpenAI's servers ran (web
 * and file search, image generation, code interpreter, MCP) and their
 * encrypted compactions, none of which a model here can read or rerun. A
 * conversation begun there goes on here without them, as it does without
 * its earlier reasoning. */
static bool made_elsewhere(const char *type)
{
    static const char *const names[] = {
        "web_search_call", "file_search_call", "image_generation_call", "code_interpreter_call",
        "mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response",
        "compaction", "compaction_summary", "context_compaction", NULL};
    return name_among(type, names);
}

static int add_item(json_t *out, const json_t *it, size_t i, struct api_error *ae)
{
    char param[64];
    snprintf(param, sizeof param, "input[%zu]", i);
    if (!json_is_object(it))
        return api_fail(ae, 400, NULL, param, "'%s' must be an object", param);
    const char *type = json_string_value(json_object_get(it, "type"));
    const char *role = json_string_value(json_object_get(it, "role"));
    if (!type || !strcmp(type, "message")) {
        if (!role)
            return api_fail(ae, 400, NULL, param, "'%s.role' must be a string", param);
        char cp[80];
        snprintf(cp, sizeof cp, "%s.content", param);
        struct buf t = {0};
        if (content_text(json_object_get(it, "content"), cp, part_types, &t, ae)) {
            buf_free(&t);
            return -1;
        }
        json_array_append_new(out, json_pack("{s:s, s:o}", "role",
                                             strcmp(role, "developer") ? role : "system",
                                             "content", json_text(t.p, t.n)));
        buf_free(&t);
        return 0;
    }
    if (!strcmp(type, "function_call")) {
        const json_t *name = json_object_get(it, "name"), *args = json_object_get(it, "arguments");
        if (!json_is_string(name))
            return api_fail(ae, 400, NULL, param, "'%s.name' must be a string", param);
        append_call(out, chat_tool_call(json_string_value(json_object_get(it, "call_id")),
                                        json_string_value(name),
                                        args ? json_incref((json_t *)args) : json_string("{}")));
        return 0;
    }
    if (!strcmp(type, "custom_tool_call") || !strcmp(type, "local_shell_call")) {
        json_t *call = codex_item_call(it, param, ae);
        if (!call)
            return -1;
        append_call(out, call);
        return 0;
    }
    if (!strcmp(type, "function_call_output") || !strcmp(type, "custom_tool_call_output") ||
        !strcmp(type, "local_shell_call_output")) {
        const json_t *id = json_object_get(it, "call_id"), *o = json_object_get(it, "output");
        char op[80];
        snprintf(op, sizeof op, "%s.output", param);
        if (!json_is_string(o) && !json_is_array(o))
            return api_fail(ae, 400, NULL, param, "'%s' must be a string or an array of parts", op);
        struct buf t = {0};
        if (content_text(o, op, part_types, &t, ae)) {
            buf_free(&t);
            return -1;
        }
        json_t *m = json_pack("{s:s, s:o}", "role", "tool", "content", json_text(t.p, t.n));
        buf_free(&t);
        if (json_is_string(id))
            json_object_set(m, "tool_call_id", (json_t *)id);
        json_array_append_new(out, m);
        return 0;
    }
    if (!strcmp(type, "reasoning") || made_elsewhere(type))
        return 0; /* not replayed into the prompt */
    return api_fail(ae, 400, NULL, param, "'%s': items of type '%s' are not supported", param,
                    type);
}

struct resp_ctx {
    char id[64], msg_id[64];
    char model[256];
    long created;
    json_t *echo; /* request fields echoed in the response object */
    json_t *conversation; /* messages without instructions, for the store */
    bool store;
    struct server *srv;
    int seq;
    /* streams: the items done, the one open (ITEM_*) and its text */
    json_t *output;
    int open;
    char item_id[64];
    struct buf text;
    /* the answer as a chat message, for the store: content and tool_calls */
    struct buf answer;
    json_t *calls;
    /* the request's tools that are not functions: name -> enum codex_kind */
    json_t *kinds;
    /* include "message.output_text.logprobs" (or top_logprobs): the
     * message's tokens' entries, for its output_text part */
    bool logprobs;
    json_t *lps;
};

enum { ITEM_NONE, ITEM_MESSAGE, ITEM_REASONING };

static void ctx_free(void *p)
{
    struct resp_ctx *c = p;
    if (!c)
        return;
    json_decref(c->echo);
    json_decref(c->conversation);
    json_decref(c->output);
    json_decref(c->calls);
    json_decref(c->kinds);
    json_decref(c->lps);
    buf_free(&c->text);
    buf_free(&c->answer);
    free(c);
}

static int parse_request(struct server *srv, const json_t *req, struct chat_req *r,
                         struct resp_ctx *c, struct api_error *ae)
{
    struct opt_i mot = {0};
    const char *instructions = NULL, *prev = NULL, *model = NULL;
    json_t *tools = NULL, *reasoning = NULL, *kwargs = NULL;
    c->store = true;
    if (field_string(req, "model", &model, ae) || field_sampling(req, r, ae) ||
        field_bool(req, "stream", &r->stream, ae) || field_bool(req, "store", &c->store, ae) ||
        field_int(req, "max_output_tokens", 1, 10000000, &mot, ae) ||
        field_string(req, "instructions", &instructions, ae) ||
        field_string(req, "previous_response_id", &prev, ae) ||
        field_array(req, "tools", &tools, ae) || field_object(req, "reasoning", &reasoning, ae) ||
        field_object(req, "chat_template_kwargs", &kwargs, ae) ||
        field_stops(req, "stop", r, ae))
        return -1;
    r->max_tokens = mot.set ? mot.v : 0;
    if (reasoning && field_reasoning_effort(reasoning, "effort", r, ae))
        return -1;
    struct opt_i top = {0};
    json_t *include = NULL;
    if (field_int(req, "top_logprobs", 0, LOGPROBS_TOP_MAX, &top, ae) ||
        field_array(req, "include", &include, ae))
        return -1;
    size_t k;
    const json_t *inc;
    json_array_foreach(include, k, inc) {
        if (json_is_string(inc) && !strcmp(json_string_value(inc), "message.output_text.logprobs"))
            c->logprobs = true; /* other inclusions name data this server has none of */
    }
    c->logprobs = c->logprobs || (top.set && top.v > 0);
    r->logprobs = c->logprobs;
    r->top_logprobs = top.set ? top.v : 0;
    if (c->logprobs && !(c->lps = json_array()))
        return api_fail(ae, 500, "server_error", NULL, "out of memory");
    json_t *text = NULL;
    if (field_object(req, "text", &text, ae) ||
        (text && field_structured(text, "format", "text.format", r, ae)))
        return -1;
    r->kwargs = json_incref(kwargs);

    c->conversation = json_array();
    if (prev) {
        json_t *old = store_get(srv->store, prev, false);
        if (!old)
            return api_fail(ae, 400, NULL, "previous_response_id",
                            "Previous response with id '%s' not found.", prev);
        json_array_extend(c->conversation, old);
        json_decref(old);
    }
    const json_t *input = json_object_get(req, "input");
    if (json_is_string(input)) {
        json_array_append_new(c->conversation,
                              json_pack("{s:s, s:O}", "role", "user", "content", input));
    } else if (json_is_array(input)) {
        size_t i;
        const json_t *it;
        json_array_foreach(input, i, it) {
            if (add_item(c->conversation, it, i, ae))
                return -1;
        }
    } else if (input && !json_is_null(input)) {
        return api_fail(ae, 400, NULL, "input", "'input' must be a string or an array of items");
    }
    if (json_array_size(c->conversation) == 0)
        return api_fail(ae, 400, NULL, "input", "'input' is required");

    r->messages = json_array();
    if (instructions)
        json_array_append_new(r->messages,
                              json_pack("{s:s, s:s}", "role", "system", "content", instructions));
    json_array_extend(r->messages, c->conversation);

    if (field_tool_choice(req, r, ae))
        return -1;
    if (tools) { /* {type:function, name, description, parameters} -> the chat form */
        r->tools = json_array();
        c->kinds = json_object();
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t) {
            const char *type = json_string_value(json_object_get(t, "type"));
            const json_t *name = json_object_get(t, "name");
            enum codex_kind kind = CODEX_FUNCTION;
            json_t *as_fn = codex_tool_function(t, &kind);
            if (as_fn) { /* Codex's custom and local_shell tools */
                const char *fname = json_string_value(
                    json_object_get(json_object_get(as_fn, "function"), "name"));
                json_object_set_new(c->kinds, fname, json_integer(kind));
                json_array_append_new(r->tools, as_fn);
                continue;
            }
            if (!type || strcmp(type, "function") || !json_is_string(name))
                continue; /* built-in tools (web search, ...) do not exist here */
            json_t *fn = json_pack("{s:O}", "name", name);
            const json_t *d = json_object_get(t, "description"), *p = json_object_get(t, "parameters");
            if (d)
                json_object_set(fn, "description", (json_t *)d);
            if (p)
                json_object_set(fn, "parameters", (json_t *)p);
            json_array_append_new(r->tools, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        }
    }

    c->echo = json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:b}", "instructions",
                        instructions ? json_string(instructions) : json_null(),
                        "max_output_tokens", mot.set ? json_integer(mot.v) : json_null(),
                        "previous_response_id", prev ? json_string(prev) : json_null(),
                        "temperature", r->temperature.set ? json_float(r->temperature.v) : json_null(),
                        "top_p", r->top_p.set ? json_float(r->top_p.v) : json_null(),
                        "tools", tools ? json_incref(tools) : json_array(), "store", c->store);
    const json_t *md = json_object_get(req, "metadata");
    json_object_set_new(c->echo, "metadata", json_is_object(md) ? json_deep_copy(md) : json_object());
    /* what the request chose, where response_json's defaults would say
     * otherwise */
    const json_t *ptc = json_object_get(req, "parallel_tool_calls");
    const json_t *tc = json_object_get(req, "tool_choice");
    const json_t *tr = json_object_get(req, "truncation");
    if (json_is_boolean(ptc))
        json_object_set(c->echo, "parallel_tool_calls", (json_t *)ptc);
    if (json_is_string(tc) || json_is_object(tc))
        json_object_set_new(c->echo, "tool_choice", json_deep_copy(tc));
    if (json_is_string(tr))
        json_object_set(c->echo, "truncation", (json_t *)tr);
    if (reasoning) {
        const json_t *e = json_object_get(reasoning, "effort"), *sm = json_object_get(reasoning, "summary");
        json_object_set_new(c->echo, "reasoning",
                            json_pack("{s:O, s:O}", "effort", json_is_string(e) ? e : json_null(),
                                      "summary", json_is_string(sm) ? sm : json_null()));
    }
    if (text) {
        json_t *t = json_deep_copy(text);
        if (t && !json_is_object(json_object_get(t, "format")))
            json_object_set_new(t, "format", json_pack("{s:s}", "type", "text"));
        json_object_set_new(c->echo, "text", t);
    }
    return c->echo ? 0 : api_fail(ae, 500, "server_error", NULL, "out of memory");
}

/* ---- response objects ---- */

/* An output_text part; with lps (borrowed), its logprobs. */
static json_t *part_json(const char *text, size_t n, const json_t *lps)
{
    json_t *p = json_pack("{s:s, s:o, s:[]}", "type", "output_text", "text", json_text(text, n),
                          "annotations");
    if (p && lps)
        json_object_set_new(p, "logprobs", json_deep_copy(lps));
    return p;
}

/* The entries of the tokens since the last call, appended to c->lps when
 * they are the message's (kind content); else dropped (reasoning, calls:
 * Responses reports the message's text alone). Returns the new entries
 * (NULL without logprobs). */
static json_t *take_logprobs(struct resp_ctx *c, struct gen *g, bool message)
{
    if (!c->logprobs)
        return NULL;
    const struct gen_logprob *e;
    int n = gen_take_logprobs(g, &e);
    if (!message)
        return NULL;
    json_t *a = logprobs_content(gen_tokenizer(g), e, n);
    json_array_extend(c->lps, a);
    return a;
}

static json_t *message_item(const struct resp_ctx *c, const char *status, json_t *content)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", c->msg_id, "type", "message", "status",
                     status, "role", "assistant", "content", content);
}

/* A reasoning item: its text as reasoning_text (text NULL: none yet, while
 * it streams). */
static json_t *reasoning_item(const char *id, const char *status, const char *text, size_t n)
{
    json_t *content = json_array();
    if (text)
        json_array_append_new(content, json_pack("{s:s, s:o}", "type", "reasoning_text", "text",
                                                 json_text(text, n)));
    return json_pack("{s:s, s:s, s:s, s:[], s:o}", "id", id, "type", "reasoning", "status",
                     status, "summary", "content", content);
}

static json_t *call_item(const char *id, const char *call_id, const char *status,
                         const char *name, const char *args)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "function_call",
                     "status", status, "call_id", call_id, "name", name, "arguments", args);
}

/* A call of the answer: its item (completed; a custom_tool_call or
 * local_shell_call for the request's tools of those kinds), and the same
 * call in chat form kept for the store. */
static json_t *answer_call(struct resp_ctx *c, const char *name, const char *args)
{
    const enum codex_kind kind = json_integer_value(json_object_get(c->kinds, name));
    char id[64], call_id[64];
    serve_make_id(id, sizeof id, kind == CODEX_CUSTOM ? "ctc_" : kind == CODEX_LOCAL_SHELL ? "lsc_" : "fc_");
    serve_make_id(call_id, sizeof call_id, "call_");
    if (!c->calls)
        c->calls = json_array();
    json_array_append_new(c->calls, chat_tool_call(call_id, name, json_string(args)));
    json_t *item = codex_call_item(kind, id, call_id, "completed", name, args);
    if (item)
        return item;
    serve_make_id(id, sizeof id, "fc_"); /* arguments that do not fit the kind */
    return call_item(id, call_id, "completed", name, args);
}

static json_t *response_json(const struct resp_ctx *c, const char *status, json_t *output,
                             const struct gen_result *res, json_t *error)
{
    json_t *r = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:s, s:o, s:b, s:s, s:{s:o, s:o}, "
                          "s:{s:{s:s}}, s:s}",
                          "id", c->id, "object", "response", "created_at", (json_int_t)c->created,
                          "status", status, "error", error ? error : json_null(),
                          "incomplete_details",
                          res && res->finish == GEN_FINISH_LENGTH
                              ? json_pack("{s:s}", "reason", "max_output_tokens")
                              : json_null(),
                          "model", c->model, "output", output, "parallel_tool_calls", 1,
                          "tool_choice", "auto", "reasoning", "effort", json_null(), "summary",
                          json_null(), "text", "format", "type", "text", "truncation", "disabled");
    if (!r)
        return NULL;
    json_object_update(r, c->echo);
    if (res && (res->finish == GEN_FINISH_STOP || res->finish == GEN_FINISH_LENGTH))
        json_object_set_new(
            r, "usage",
            json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", res->n_prompt,
                      "input_tokens_details", "cached_tokens", res->n_cached, "output_tokens",
                      res->n_completion, "output_tokens_details", "reasoning_tokens", res->n_reasoning,
                      "total_tokens", res->n_prompt + res->n_completion));
    else
        json_object_set_new(r, "usage", json_null());
    return r;
}

static const char *final_status(const struct gen_result *res)
{
    return res->finish == GEN_FINISH_LENGTH ? "incomplete" : "completed";
}

/* Stores the finished conversation (the answer: c->answer, c->calls);
 * `response` is borrowed. */
static void remember(struct resp_ctx *c, const json_t *response)
{
    if (!c->store || !response)
        return;
    json_t *conv = json_deep_copy(c->conversation);
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content",
                          json_text(c->answer.p, c->answer.n));
    if (m && c->calls)
        json_object_set(m, "tool_calls", c->calls);
    json_array_append_new(conv, m);
    store_put(c->srv->store, c->id, conv, json_deep_copy(response));
}

/* ---- SSE ---- */

static void ev(struct stream *s, const char *name, json_t *data)
{
    struct resp_ctx *c = s->st;
    if (data) {
        json_object_set_new(data, "type", json_string(name));
        json_object_set_new(data, "sequence_number", json_integer(c->seq++));
    }
    sbuf_sse(&s->out, name, data);
    json_decref(data);
}

static void rs_begin(struct stream *s)
{
    struct resp_ctx *c = s->st;
    ev(s, "response.created", json_pack("{s:o}", "response",
                                        response_json(c, "in_progress", json_array(), NULL, NULL)));
    ev(s, "response.in_progress",
       json_pack("{s:o}", "response", response_json(c, "in_progress", json_array(), NULL, NULL)));
}

static int out_index(const struct resp_ctx *c)
{
    return (int)json_array_size(c->output);
}

/* Ends the item being streamed, if any: "incomplete" when the answer was
 * cut there (max_output_tokens), as OpenAI marks the item it cut. */
static void item_end(struct stream *s, bool cut)
{
    struct resp_ctx *c = s->st;
    const char *t = c->text.p ? c->text.p : "";
    size_t n = c->text.n;
    json_t *item = NULL;
    if (c->open == ITEM_MESSAGE) {
        ev(s, "response.output_text.done",
           json_pack("{s:s, s:i, s:i, s:o, s:o}", "item_id", c->msg_id, "output_index",
                     out_index(c), "content_index", 0, "text", json_text(t, n), "logprobs",
                     c->lps ? json_deep_copy(c->lps) : json_array()));
        ev(s, "response.content_part.done",
           json_pack("{s:s, s:i, s:i, s:o}", "item_id", c->msg_id, "output_index", out_index(c),
                     "content_index", 0, "part", part_json(t, n, c->lps)));
        item = message_item(c, cut ? "incomplete" : "completed",
                            json_pack("[o]", part_json(t, n, c->lps)));
        buf_putn(&c->answer, t, n);
    } else if (c->open == ITEM_REASONING) {
        ev(s, "response.reasoning_text.done",
           json_pack("{s:s, s:i, s:i, s:o}", "item_id", c->item_id, "output_index", out_index(c),
                     "content_index", 0, "text", json_text(t, n)));
        item = reasoning_item(c->item_id, cut ? "incomplete" : "completed", t, n);
    } else {
        return;
    }
    ev(s, "response.output_item.done",
       json_pack("{s:i, s:O}", "output_index", out_index(c), "item", item));
    json_array_append_new(c->output, item);
    c->text.n = 0;
    c->open = ITEM_NONE;
}

static void item_close(struct stream *s)
{
    item_end(s, false);
}

/* Starts a message or reasoning item unless one of that kind is open. */
static void item_open(struct stream *s, int kind)
{
    struct resp_ctx *c = s->st;
    if (c->open == kind)
        return;
    item_close(s);
    c->open = kind;
    if (kind == ITEM_REASONING) {
        serve_make_id(c->item_id, sizeof c->item_id, "rs_");
        ev(s, "response.output_item.added",
           json_pack("{s:i, s:o}", "output_index", out_index(c), "item",
                     reasoning_item(c->item_id, "in_progress", NULL, 0)));
        return;
    }
    ev(s, "response.output_item.added",
       json_pack("{s:i, s:o}", "output_index", out_index(c), "item",
                 message_item(c, "in_progress", json_array())));
    ev(s, "response.content_part.added",
       json_pack("{s:s, s:i, s:i, s:o}", "item_id", c->msg_id, "output_index", out_index(c),
                 "content_index", 0, "part", part_json("", 0, NULL)));
}

/* A message's or reasoning item's text delta, in an item of its kind. */
static void rs_text(struct stream *s, enum turn_kind kind, const char *text, size_t n)
{
    struct resp_ctx *c = s->st;
    const bool msg = kind != TURN_REASONING;
    item_open(s, msg ? ITEM_MESSAGE : ITEM_REASONING);
    buf_putn(&c->text, text, n);
    json_t *d = json_pack("{s:s, s:i, s:i, s:o}", "item_id", msg ? c->msg_id : c->item_id,
                          "output_index", out_index(c), "content_index", 0, "delta",
                          json_text(text, n));
    json_t *lp = take_logprobs(c, s->gen, msg);
    if (d && msg)
        json_object_set_new(d, "logprobs", lp ? lp : json_array());
    ev(s, msg ? "response.output_text.delta" : "response.reasoning_text.delta", d);
}

static void rs_tool_call(struct stream *s, const char *name, const char *args)
{
    struct resp_ctx *c = s->st;
    item_close(s);
    take_logprobs(c, s->gen, false);
    json_t *done = answer_call(c, name, args);
    const char *id = json_string_value(json_object_get(done, "id"));
    const char *type = json_string_value(json_object_get(done, "type"));
    const int at = out_index(c);
    if (type && strcmp(type, "function_call")) { /* Codex's kinds */
        json_t *added = json_deep_copy(done);
        json_object_set_new(added, "status", json_string("in_progress"));
        const bool custom = !strcmp(type, "custom_tool_call");
        if (custom)
            json_object_set_new(added, "input", json_string(""));
        ev(s, "response.output_item.added",
           json_pack("{s:i, s:o}", "output_index", at, "item", added));
        if (custom) {
            const char *input = codex_call_input(done);
            ev(s, "response.custom_tool_call_input.delta",
               json_pack("{s:s, s:i, s:s}", "item_id", id, "output_index", at, "delta", input));
            ev(s, "response.custom_tool_call_input.done",
               json_pack("{s:s, s:i, s:s}", "item_id", id, "output_index", at, "input", input));
        }
    } else {
        json_t *added = call_item(id, json_string_value(json_object_get(done, "call_id")),
                                  "in_progress", name, "");
        ev(s, "response.output_item.added",
           json_pack("{s:i, s:o}", "output_index", at, "item", added));
        ev(s, "response.function_call_arguments.delta",
           json_pack("{s:s, s:i, s:s}", "item_id", id, "output_index", at, "delta", args));
        ev(s, "response.function_call_arguments.done",
           json_pack("{s:s, s:i, s:s, s:s}", "item_id", id, "output_index", at, "name", name,
                     "arguments", args));
    }
    ev(s, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", at, "item", done));
    json_array_append_new(c->output, done);
}

static void rs_end(struct stream *s, const struct gen_result *res)
{
    struct resp_ctx *c = s->st;
    struct api_error ae;
    if (gen_failed(res, "server_error", &ae)) {
        ev(s, "response.failed",
           json_pack("{s:o}", "response",
                     response_json(c, "failed", json_array(), res,
                                   json_pack("{s:s, s:s}", "code", "server_error", "message",
                                             ae.message))));
        return;
    }
    if (!out_index(c) && c->open == ITEM_NONE)
        item_open(s, ITEM_MESSAGE); /* an empty answer is one empty message */
    item_end(s, res->finish == GEN_FINISH_LENGTH);
    json_t *resp = response_json(c, final_status(res), json_deep_copy(c->output), res, NULL);
    remember(c, resp);
    ev(s, res->finish == GEN_FINISH_LENGTH ? "response.incomplete" : "response.completed",
       json_pack("{s:o}", "response", resp));
}

static const struct stream_ops rs_ops = {rs_begin, rs_text, rs_tool_call, rs_end, ctx_free};

/* A whole answer's items: reasoning, the message (also when it is all
 * there is, even empty), the calls. Cut (max_output_tokens): its text is
 * "incomplete" (a call cut short stays text): the message, and the
 * reasoning too when the cut came inside it. */
static json_t *output_json(struct resp_ctx *c, const struct turn_parts *tp, bool cut)
{
    json_t *out = json_array();
    const bool message = tp->content.n || !json_array_size(tp->calls);
    if (tp->reasoning.n) {
        char id[64];
        serve_make_id(id, sizeof id, "rs_");
        const bool last = !tp->content.n && !json_array_size(tp->calls);
        json_array_append_new(out, reasoning_item(id, cut && last ? "incomplete" : "completed",
                                                  tp->reasoning.p, tp->reasoning.n));
    }
    if (message)
        json_array_append_new(out, message_item(c, cut ? "incomplete" : "completed",
                                                json_pack("[o]", part_json(tp->content.p ? tp->content.p : "",
                                                                           tp->content.n, c->lps))));
    buf_putn(&c->answer, tp->content.p, tp->content.n);
    size_t i;
    json_t *call;
    json_array_foreach(tp->calls, i, call) json_array_append_new(
        out, answer_call(c, json_string_value(json_object_get(call, "name")),
                         json_string_value(json_object_get(call, "arguments"))));
    return out;
}

/* ---- POST /v1/responses ---- */

void responses_create(struct server *srv, const json_t *req, const struct client *cl,
                      struct reply *rp)
{
    struct chat_req r = {.thinking = -1};
    struct api_error ae;
    struct gen *g = NULL;
    struct resp_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        api_fail(&ae, 500, "server_error", NULL, "out of memory");
        reply_error(rp, &ae, SHAPE_OPENAI);
        return;
    }
    c->srv = srv;
    if (parse_request(srv, req, &r, c, &ae) || gen_start(srv, &r, &g, &ae)) {
        chat_req_free(&r);
        ctx_free(c);
        reply_error(rp, &ae, SHAPE_OPENAI);
        return;
    }
    bool stream = r.stream;
    chat_req_free(&r);
    serve_make_id(c->id, sizeof c->id, "resp_");
    serve_make_id(c->msg_id, sizeof c->msg_id, "msg_");
    snprintf(c->model, sizeof c->model, "%s", reply_model_name(srv, req));
    c->created = (long)time(NULL);
    if (stream) {
        c->output = json_array();
        rp->status = 200;
        rp->stream = stream_new(srv, g, &rs_ops, c);
        if (!rp->stream) {
            api_fail(&ae, 500, "server_error", NULL, "out of memory");
            reply_error(rp, &ae, SHAPE_OPENAI);
        }
        return;
    }
    struct buf text = {0};
    struct gen_result res;
    struct turn_parts tp = {0};
    if (gen_collect(g, &text, &res, cl)) {
        rp->status = 0; /* the client left */
    } else if (gen_failed(&res, "server_error", &ae)) {
        reply_error(rp, &ae, SHAPE_OPENAI);
    } else if (text.oom || turn_parts_split(gen_syntax(g), text.p, text.n, &tp)) {
        api_fail(&ae, 500, "server_error", NULL, "out of memory");
        reply_error(rp, &ae, SHAPE_OPENAI);
    } else {
        if (c->logprobs) { /* the tokens after the reasoning block */
            const struct gen_logprob *e;
            int n = gen_take_logprobs(g, &e), skip = res.n_reasoning < n ? res.n_reasoning : n;
            json_decref(c->lps);
            c->lps = logprobs_content(gen_tokenizer(g), e + skip, n - skip);
        }
        rp->status = 200;
        rp->body = response_json(c, final_status(&res), output_json(c, &tp, res.finish == GEN_FINISH_LENGTH), &res, NULL);
        remember(c, rp->body);
    }
    buf_free(&text);
    turn_parts_free(&tp);
    gen_free(g);
    ctx_free(c);
}
