/* openai.c - the OpenAI adapters: POST /v1/chat/completions and
 * POST /v1/completions (request fields -> chat_req; text deltas -> JSON or
 * SSE chunks ending in `data: [DONE]`), and GET /v1/models. */
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"

static const char *const part_types[] = {"text", "input_text", "output_text", NULL};

void reply_error(struct reply *rp, const struct api_error *ae, enum api_shape shape)
{
    rp->status = ae->status;
    rp->body = api_error_body(ae, shape);
}

const char *reply_model_name(const struct server *srv, const json_t *req)
{
    const char *m = json_string_value(json_object_get(req, "model"));
    return m && *m ? m : srv->sm.id;
}

/* The spec's usage.lane: "batched" when the engine runs more than one
 * sequence at once (--batch > 1, the default 8), "serial" for --batch 1. */
static const char *engine_lane(const struct server *srv)
{
    return !srv->cfg->batch.set || srv->cfg->batch.v > 1 ? "batched" : "serial";
}

/* Whether answers carry usage.speculation: the server speculates. */
static bool speculating(const struct server *srv) { return srv->cfg->draft_kind != NULL; }

/* OpenAI's usage, and the spec's lane and (with speculation on) speculation:
 * the request's verify steps, drafts fed and drafts kept. */
static json_t *usage_json(const struct gen_result *res, const char *lane, bool spec)
{
    json_t *u = json_pack("{s:i, s:i, s:i, s:{s:i}, s:{s:i}, s:s}", "prompt_tokens",
                          res->n_prompt, "completion_tokens", res->n_completion, "total_tokens",
                          res->n_prompt + res->n_completion, "prompt_tokens_details",
                          "cached_tokens", res->n_cached, "completion_tokens_details",
                          "reasoning_tokens", res->n_reasoning, "lane", lane);
    if (u && spec)
        json_object_set_new(u, "speculation",
                            json_pack("{s:i, s:i, s:i}", "steps", res->spec_steps, "drafted",
                                      res->spec_drafted, "accepted", res->spec_accepted));
    return u;
}

/* "tool_calls" when the turn ended on its own after calling tools. */
static const char *finish_reason(const struct gen_result *res, int n_calls)
{
    return res->finish == GEN_FINISH_LENGTH ? "length" : n_calls ? "tool_calls" : "stop";
}

/* One entry of a message's (or a delta's) tool_calls. */
static json_t *tool_call_json(const char *name, const char *args, int index, bool streamed)
{
    char id[64];
    serve_make_id(id, sizeof id, "call_");
    json_t *c = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function",
                          "name", name, "arguments", args);
    if (c && streamed)
        json_object_set_new(c, "index", json_integer(index));
    return c;
}

#define MAX_CHOICES 64 /* n times the prompts of one request */

/* Fields shared by both endpoints; completions take max_tokens 0 (the
 * prompt alone: lm-evaluation-harness scores a text by its echoed
 * logprobs so). */
static int parse_common(const json_t *req, struct chat_req *r, bool completions,
                        bool *include_usage, int *n_out, struct api_error *ae)
{
    struct opt_i n = {0}, mt = {0}, mct = {0};
    json_t *so = NULL;
    if (field_sampling(req, r, ae) || field_stops(req, "stop", r, ae) ||
        field_bool(req, "stream", &r->stream, ae) ||
        field_int(req, "n", 1, MAX_CHOICES, &n, ae) ||
        field_int(req, "max_tokens", completions ? 0 : 1, 10000000, &mt, ae) ||
        field_int(req, "max_completion_tokens", 1, 10000000, &mct, ae) ||
        field_object(req, "stream_options", &so, ae) ||
        field_structured(req, "response_format", "response_format", r, ae))
        return -1;
    *n_out = n.set ? n.v : 1;
    r->max_tokens = mct.set ? mct.v : mt.set ? mt.v : 0;
    r->prompt_only = !mct.set && mt.set && mt.v == 0;
    if (so && field_bool(so, "include_usage", include_usage, ae))
        return -1;
    const char *model = NULL;
    return field_string(req, "model", &model, ae);
}

/* ---- SSE ---- */

struct oai_stream {
    char id[64];
    char model[256];
    long created;
    bool chat, include_usage;
    const char *lane; /* usage.lane */
    bool spec;        /* usage.speculation (speculation is on) */
};

static json_t *chunk(const struct oai_stream *o, json_t *choice)
{
    json_t *choices = json_array();
    if (choice)
        json_array_append_new(choices, choice);
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", o->id, "object",
                          o->chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)o->created, "model", o->model, "choices", choices);
    if (o->chat)
        json_object_set_new(c, "system_fingerprint", json_string("cllm"));
    if (o->include_usage)
        json_object_set_new(c, "usage", json_null());
    return c;
}

static void emit(struct stream *s, json_t *c)
{
    sbuf_sse(&s->out, NULL, c);
    json_decref(c);
}

/* A choice's logprobs: those of the tokens generated since the last
 * chunk (a chunk carries the tokens whose text it releases, and held-back
 * tokens' entries may come a chunk early); null when not asked for, or
 * for a chunk with no new tokens. */
static json_t *choice_logprobs(struct gen *g, bool chat)
{
    const struct gen_logprob *e;
    int n = gen_has_logprobs(g) ? gen_take_logprobs(g, &e) : 0;
    if (n == 0)
        return json_null();
    if (!chat)
        return logprobs_completion(gen_tokenizer(g), e, n);
    return json_pack("{s:o, s:n}", "content", logprobs_content(gen_tokenizer(g), e, n),
                     "refusal");
}

static void oai_begin(struct stream *s)
{
    struct oai_stream *o = s->st;
    if (o->chat) /* the first chunk carries the role */
        emit(s, chunk(o, json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", 0, "delta", "role",
                                   "assistant", "content", "", "logprobs", "finish_reason")));
}

/* Content (chat's delta.content, completions' text) or reasoning
 * (delta.reasoning_content). */
static void oai_text(struct stream *s, enum turn_kind kind, const char *text, size_t n)
{
    struct oai_stream *o = s->st;
    json_t *lp = choice_logprobs(s->gen, o->chat);
    if (o->chat)
        emit(s, chunk(o, json_pack("{s:i, s:{s:o}, s:o, s:n}", "index", 0, "delta",
                                   kind == TURN_REASONING ? "reasoning_content" : "content",
                                   json_text(text, n), "logprobs", lp, "finish_reason")));
    else
        emit(s, chunk(o, json_pack("{s:i, s:o, s:o, s:n}", "index", 0, "text", json_text(text, n),
                                   "logprobs", lp, "finish_reason")));
}

static void oai_tool_call(struct stream *s, const char *name, const char *args)
{
    struct oai_stream *o = s->st;
    emit(s, chunk(o, json_pack("{s:i, s:{s:[o]}, s:o, s:n}", "index", 0, "delta", "tool_calls",
                               tool_call_json(name, args, s->turn.n_calls, true), "logprobs",
                               choice_logprobs(s->gen, true), "finish_reason")));
}

static void oai_end(struct stream *s, const struct gen_result *res)
{
    struct oai_stream *o = s->st;
    struct api_error ae;
    if (gen_failed(res, "server_error", &ae)) { /* a terminal error event; the SDKs raise it */
        json_t *e = api_error_body(&ae, SHAPE_OPENAI);
        emit(s, e);
        return;
    }
    json_t *lp = choice_logprobs(s->gen, o->chat); /* entries no text chunk took */
    if (o->chat)
        emit(s, chunk(o, json_pack("{s:i, s:{}, s:o, s:s}", "index", 0, "delta", "logprobs", lp,
                                   "finish_reason", finish_reason(res, s->turn.n_calls))));
    else
        emit(s, chunk(o, json_pack("{s:i, s:s, s:o, s:s}", "index", 0, "text", "", "logprobs", lp,
                                   "finish_reason", finish_reason(res, 0))));
    if (o->include_usage) {
        json_t *c = chunk(o, NULL);
        json_object_set_new(c, "usage", usage_json(res, o->lane, o->spec));
        emit(s, c);
    }
    buf_puts(&s->out, "data: [DONE]\n\n");
}

static const struct stream_ops oai_ops = {oai_begin, oai_text, oai_tool_call, oai_end, free};

/* A chat answer's message: content (null when the turn only called tools),
 * reasoning_content when there was reasoning, tool_calls when there were
 * calls. */
static json_t *chat_message(const struct turn_parts *tp)
{
    size_t n_calls = json_array_size(tp->calls);
    json_t *m = json_pack("{s:s, s:o, s:n}", "role", "assistant", "content",
                          tp->content.n || !n_calls ? json_text(tp->content.p, tp->content.n)
                                                    : json_null(),
                          "refusal");
    if (tp->reasoning.n)
        json_object_set_new(m, "reasoning_content", json_text(tp->reasoning.p, tp->reasoning.n));
    if (n_calls) {
        json_t *calls = json_array();
        size_t i;
        json_t *c;
        json_array_foreach(tp->calls, i, c) json_array_append_new(
            calls, tool_call_json(json_string_value(json_object_get(c, "name")),
                                  json_string_value(json_object_get(c, "arguments")), (int)i,
                                  false));
        json_object_set_new(m, "tool_calls", calls);
    }
    return m;
}

/* ---- both endpoints ---- */

/* One prompt of a completions request's list into r (text or ids, owned). */
static int prompt_into(const json_t *p, struct chat_req *r, struct api_error *ae);

static void stream_one(struct server *srv, const json_t *req, const struct chat_req *r,
                       bool chat, bool include_usage, struct reply *rp)
{
    struct api_error ae;
    struct gen *g;
    if (gen_start(srv, r, &g, &ae)) {
        reply_error(rp, &ae, SHAPE_OPENAI);
        return;
    }
    struct oai_stream *o = calloc(1, sizeof *o);
    if (!o) {
        gen_free(g);
        api_fail(&ae, 500, "server_error", NULL, "out of memory");
        reply_error(rp, &ae, SHAPE_OPENAI);
        return;
    }
    serve_make_id(o->id, sizeof o->id, chat ? "chatcmpl-" : "cmpl-");
    snprintf(o->model, sizeof o->model, "%s", reply_model_name(srv, req));
    o->created = (long)time(NULL);
    o->chat = chat;
    o->include_usage = include_usage;
    o->lane = engine_lane(srv);
    o->spec = speculating(srv);
    rp->status = 200;
    rp->stream = stream_new(srv, g, &oai_ops, o);
    if (!rp->stream) {
        api_fail(&ae, 500, "server_error", NULL, "out of memory");
        reply_error(rp, &ae, SHAPE_OPENAI);
    }
}

/* Choice k of a whole answer, or NULL with ae filled. */
static json_t *choice_json(struct gen *g, const struct buf *text, const struct gen_result *res,
                           bool chat, int k, struct api_error *ae)
{
    if (gen_failed(res, "server_error", ae))
        return NULL;
    struct turn_parts tp = {0};
    if (text->oom || (chat && turn_parts_split(gen_syntax(g), text->p, text->n, &tp))) {
        turn_parts_free(&tp);
        api_fail(ae, 500, "server_error", NULL, "out of memory");
        return NULL;
    }
    json_t *lp = choice_logprobs(g, chat), *c;
    if (chat)
        c = json_pack("{s:i, s:o, s:o, s:s}", "index", k, "message", chat_message(&tp),
                      "logprobs", lp, "finish_reason",
                      finish_reason(res, (int)json_array_size(tp.calls)));
    else
        c = json_pack("{s:i, s:o, s:o, s:s}", "index", k, "text", json_text(text->p, text->n),
                      "logprobs", lp, "finish_reason", finish_reason(res, 0));
    turn_parts_free(&tp);
    return c;
}

/* n answers to each of the prompts (prompts NULL: r's own), generated
 * together and answered as one JSON body: choice k is copy k % n of prompt
 * k / n; with a seed, copy c samples with seed + c. usage counts each
 * prompt once. */
static void collect_many(struct server *srv, const json_t *req, const struct chat_req *r,
                         const json_t *prompts, int n, bool chat, const struct client *cl,
                         struct reply *rp)
{
    struct api_error ae = {0};
    int P = prompts ? (int)json_array_size(prompts) : 1, total = P * n;
    struct gen **gs = calloc((size_t)total, sizeof *gs);
    struct buf *texts = calloc((size_t)total, sizeof *texts);
    struct gen_result *res = calloc((size_t)total, sizeof *res);
    json_t *choices = json_array();
    bool failed = !gs || !texts || !res || !choices;
    if (failed)
        api_fail(&ae, 500, "server_error", NULL, "out of memory");
    for (int k = 0; k < total && !failed; k++) { /* all submitted before any is awaited */
        struct chat_req rk = *r; /* borrows r's fields: gen_start copies what it keeps */
        if (prompts) {
            rk.text = NULL;
            rk.ids = NULL;
            rk.n_ids = 0;
            failed = prompt_into(json_array_get(prompts, (size_t)(k / n)), &rk, &ae) != 0;
        }
        if (r->has_seed)
            rk.seed = r->seed + (uint64_t)(k % n);
        failed = failed || gen_start(srv, &rk, &gs[k], &ae) != 0;
        if (prompts) {
            free(rk.text);
            free(rk.ids);
        }
    }
    for (int k = 0; k < total && !failed; k++) {
        if (gen_collect(gs[k], &texts[k], &res[k], cl)) { /* the client left */
            rp->status = 0;
            goto out;
        }
        json_t *c = choice_json(gs[k], &texts[k], &res[k], chat, k, &ae);
        failed = !c || json_array_append_new(choices, c);
    }
    if (failed) {
        reply_error(rp, &ae, SHAPE_OPENAI);
        goto out;
    }
    struct gen_result sum = res[0];
    for (int k = 1; k < total; k++) {
        if (k % n == 0) { /* a new prompt */
            sum.n_prompt += res[k].n_prompt;
            sum.n_cached += res[k].n_cached;
        }
        sum.n_completion += res[k].n_completion;
        sum.n_reasoning += res[k].n_reasoning;
        sum.spec_steps += res[k].spec_steps;
        sum.spec_drafted += res[k].spec_drafted;
        sum.spec_accepted += res[k].spec_accepted;
    }
    char id[64];
    serve_make_id(id, sizeof id, chat ? "chatcmpl-" : "cmpl-");
    rp->status = 200;
    rp->body = json_pack("{s:s, s:s, s:I, s:s, s:O, s:o}", "id", id, "object",
                         chat ? "chat.completion" : "text_completion", "created",
                         (json_int_t)time(NULL), "model", reply_model_name(srv, req), "choices",
                         choices, "usage",
                         usage_json(&sum, engine_lane(srv), speculating(srv)));
    if (chat && rp->body)
        json_object_set_new(rp->body, "system_fingerprint", json_string("cllm"));
out:
    for (int k = 0; gs && k < total; k++)
        gen_free(gs[k]); /* cancels what is still running */
    for (int k = 0; texts && k < total; k++)
        buf_free(&texts[k]);
    free(gs);
    free(texts);
    free(res);
    json_decref(choices);
}

static void run(struct server *srv, const json_t *req, struct chat_req *r, const json_t *prompts,
                int n, bool chat, bool include_usage, const struct client *cl, struct reply *rp)
{
    struct api_error ae;
    int total = n * (prompts ? (int)json_array_size(prompts) : 1);
    if (total > MAX_CHOICES) {
        api_fail(&ae, 400, NULL, prompts ? "prompt" : "n",
                 "%d choices asked for (n times the prompts); at most %d a request", total,
                 MAX_CHOICES);
        reply_error(rp, &ae, SHAPE_OPENAI);
    } else if (r->stream && total > 1) {
        api_fail(&ae, 400, NULL, prompts ? "prompt" : "n",
                 "streaming several choices (n > 1, or several prompts) is not supported; "
                 "send them as separate requests, or without stream");
        reply_error(rp, &ae, SHAPE_OPENAI);
    } else if (r->stream) {
        stream_one(srv, req, r, chat, include_usage, rp);
    } else {
        collect_many(srv, req, r, prompts, n, chat, cl, rp);
    }
}

/* ---- POST /v1/chat/completions ---- */

static int parse_messages(const json_t *req, struct chat_req *r, struct api_error *ae)
{
    const json_t *msgs = json_object_get(req, "messages");
    if (!msgs || json_is_null(msgs))
        return api_fail(ae, 400, NULL, "messages", "'messages' is required");
    if (!json_is_array(msgs))
        return api_fail(ae, 400, NULL, "messages", "'messages' must be an array");
    if (json_array_size(msgs) == 0)
        return api_fail(ae, 400, NULL, "messages", "'messages' must hold at least one message");
    r->messages = json_array();
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m))
            return api_fail(ae, 400, NULL, param, "'%s' must be an object", param);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role) {
            snprintf(param, sizeof param, "messages[%zu].role", i);
            return api_fail(ae, 400, NULL, param, "'%s' must be a string", param);
        }
        snprintf(param, sizeof param, "messages[%zu].content", i);
        struct buf t = {0};
        if (content_text(json_object_get(m, "content"), param, part_types, &t, ae)) {
            buf_free(&t);
            return -1;
        }
        json_t *nm = json_copy((json_t *)m);
        json_object_set_new(nm, "content", json_text(t.p, t.n));
        buf_free(&t);
        if (!strcmp(role, "developer")) /* the newer name of the system role */
            json_object_set_new(nm, "role", json_string("system"));
        json_array_append_new(r->messages, nm);
    }
    return 0;
}

void openai_chat(struct server *srv, const json_t *req, const struct client *cl,
                 struct reply *rp)
{
    struct chat_req r = {.thinking = -1};
    struct api_error ae;
    bool include_usage = false;
    struct opt_i top = {0};
    json_t *tools = NULL, *kwargs = NULL;
    int n;
    if (parse_messages(req, &r, &ae) || parse_common(req, &r, false, &include_usage, &n, &ae) ||
        field_array(req, "tools", &tools, &ae) ||
        field_object(req, "chat_template_kwargs", &kwargs, &ae) ||
        field_reasoning_effort(req, "reasoning_effort", &r, &ae) ||
        field_bool(req, "logprobs", &r.logprobs, &ae) ||
        field_int(req, "top_logprobs", 0, LOGPROBS_TOP_MAX, &top, &ae))
        goto fail;
    r.top_logprobs = top.set ? top.v : 0; /* without logprobs: ignored */
    if (field_tool_choice(req, &r, &ae))
        goto fail;
    r.tools = json_incref(tools);
    r.kwargs = json_incref(kwargs);
    run(srv, req, &r, NULL, n, true, include_usage, cl, rp);
    chat_req_free(&r);
    return;
fail:
    chat_req_free(&r);
    reply_error(rp, &ae, SHAPE_OPENAI);
}

/* ---- POST /v1/completions ---- */

static int ids_from_array(const json_t *a, struct chat_req *r, struct api_error *ae)
{
    size_t n = json_array_size(a), i;
    const json_t *v;
    r->ids = malloc(sizeof(int) * (n ? n : 1));
    if (!r->ids)
        return api_fail(ae, 500, "server_error", NULL, "out of memory");
    json_array_foreach(a, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return api_fail(ae, 400, NULL, "prompt",
                            "'prompt' must be a string or an array of token ids");
        r->ids[i] = (int)json_integer_value(v);
    }
    r->n_ids = (int)n;
    return 0;
}

static int prompt_into(const json_t *p, struct chat_req *r, struct api_error *ae)
{
    if (json_is_string(p)) {
        r->text = strdup(json_string_value(p));
        return r->text ? 0 : api_fail(ae, 500, "server_error", NULL, "out of memory");
    }
    if (!json_is_array(p))
        return api_fail(ae, 400, NULL, "prompt",
                        "'prompt' must be a string, an array of token ids, or an array of those");
    if (json_array_size(p) == 0)
        return api_fail(ae, 400, NULL, "prompt", "'prompt' is empty");
    return ids_from_array(p, r, ae);
}

/* The prompt into r; a list of several prompts is left in *several (each
 * checked here) for run() to answer one choice each. */
static int parse_prompt(const json_t *req, struct chat_req *r, const json_t **several,
                        struct api_error *ae)
{
    const json_t *p = json_object_get(req, "prompt");
    *several = NULL;
    if (!p || json_is_null(p))
        return api_fail(ae, 400, NULL, "prompt", "'prompt' is required");
    const json_t *first = json_is_array(p) ? json_array_get(p, 0) : NULL;
    if (first && (json_is_string(first) || json_is_array(first))) { /* a batch */
        if (json_array_size(p) > 1) {
            size_t i;
            const json_t *x;
            json_array_foreach(p, i, x) {
                struct chat_req scratch = {0};
                int rc = prompt_into(x, &scratch, ae);
                chat_req_free(&scratch);
                if (rc)
                    return -1;
            }
            *several = p;
        }
        p = first;
    }
    return prompt_into(p, r, ae);
}

void openai_completions(struct server *srv, const json_t *req, const struct client *cl,
                        struct reply *rp)
{
    struct chat_req r = {.thinking = -1};
    struct api_error ae;
    bool include_usage = false, echo = false;
    struct opt_i logprobs = {0}, best_of = {0};
    const json_t *prompts;
    int n;
    if (parse_prompt(req, &r, &prompts, &ae) ||
        parse_common(req, &r, true, &include_usage, &n, &ae) ||
        field_bool(req, "echo", &echo, &ae) ||
        field_int(req, "logprobs", 0, LOGPROBS_TOP_MAX, &logprobs, &ae) ||
        field_int(req, "best_of", 1, 128, &best_of, &ae))
        goto fail;
    r.echo = echo;
    r.logprobs = logprobs.set; /* 0: the chosen tokens' alone */
    r.top_logprobs = logprobs.set ? logprobs.v : 0;
    if (best_of.set && best_of.v != 1) {
        api_fail(&ae, 400, NULL, "best_of", "'best_of' must be 1");
        goto fail;
    }
    run(srv, req, &r, prompts, n, false, include_usage, cl, rp);
    chat_req_free(&r);
    return;
fail:
    chat_req_free(&r);
    reply_error(rp, &ae, SHAPE_OPENAI);
}

/* ---- GET /v1/models ---- */

json_t *openai_model(const struct server *srv, const char *name)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", name ? name : srv->sm.id, "object",
                     "model", "created", (json_int_t)srv->created, "owned_by", "cllm", "context_length",
                     srv->sm.ctx_len);
}

json_t *openai_models(const struct server *srv)
{
    return json_pack("{s:s, s:[o]}", "object", "list", "data", openai_model(srv, NULL));
}
