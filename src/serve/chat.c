/* chat.c - the path every API shares: a chat request becomes prompt text
 * (template) and ids (tokenizer), sampling settings are resolved (request >
 * server flag > generation_config.json > built-in), the engine runs it, and
 * token events come back as text deltas: streamed through the detokenizer,
 * with stop strings matched across token boundaries and held back until they
 * can no longer match, so a stop string never leaks into the output. */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/clock.h"
#include "serve/internal.h"
#include "serve/tool_grammar.h"
#include "tokenizer/chat_template.h"

struct gen {
    struct server *srv;
    struct engine_request *r;
    struct detok dt;
    char *piece;           /* detok scratch, detok_max_bytes */
    size_t piece_cap;
    struct buf pending;   /* decoded text not yet released (may start a stop string) */
    char *stops[SERVE_MAX_STOPS];
    size_t stop_len[SERVE_MAX_STOPS];
    int n_stops;
    int n_prompt, n_tokens;
    struct turn_syntax syn; /* how the turn's text splits (turn.h) */
    /* reasoning tokens: 0 before the turn's first text, 1 inside its
     * <think> block, 2 past it (or there is none); undecided: tokens of
     * blanks and of a possible "<think>" not yet whole */
    int think, think_undecided;
    char think_tail[8]; /* the last bytes seen: "<think>" or "</think>" may straddle tokens */
    size_t think_n;
    json_t *tools;          /* the request's, held for syn.schema */
    /* logprobs: every token's entry; those before `taken` were handed out
     * (gen_take_logprobs); chars: code points of text decoded so far */
    bool logprobs, lp_oom;
    struct gen_logprob *lps;
    int n_lps, cap_lps, taken;
    long long chars;
    /* echo: the prompt's text, released before anything else; pdt decodes
     * the prompt's tokens for their entries' offsets */
    char *echo;
    size_t echo_n;
    struct detok pdt;
    long long pchars;
    bool finished;
    bool listed; /* in srv->gens */
    struct gen_result res;
    struct gen *prev, *next; /* the server's in-flight list */
};

/* ---- sampling resolution ---- */

static float pick_f(struct opt_f req, struct opt_f flag, struct opt_f gc, float fallback,
                    bool *from_request)
{
    if (from_request)
        *from_request = req.set;
    return req.set ? req.v : flag.set ? flag.v : gc.set ? gc.v : fallback;
}

static int pick_i(struct opt_i req, struct opt_i flag, struct opt_i gc, int fallback)
{
    return req.set ? req.v : flag.set ? flag.v : gc.set ? gc.v : fallback;
}

/* enable_thinking: request chat_template_kwargs > reasoning_effort > --thinking
 * > the template's own default (left unset). Returns the kwargs object to
 * render with (a new reference) and the resolved value (-1 unset). */
static json_t *resolve_thinking(const struct server *srv, const struct chat_req *req,
                                int *thinking)
{
    json_t *kw = req->kwargs ? json_deep_copy(req->kwargs) : json_object();
    const json_t *et = json_object_get(kw, "enable_thinking");
    if (json_is_boolean(et))
        *thinking = json_is_true(et);
    else if (req->thinking >= 0)
        *thinking = req->thinking;
    else
        *thinking = srv->cfg->thinking;
    if (*thinking >= 0 && !json_is_boolean(et))
        json_object_set_new(kw, "enable_thinking", json_boolean(*thinking));
    return kw;
}

/* The syntax of a chat turn rendered with sm's template: the template
 * prompt_render used (which passes tools only when there are some). */
static struct turn_syntax chat_syntax(const struct served_model *sm, const struct chat_req *req,
                                      const char *prompt, size_t len)
{
    bool has_tools = req->tools && json_array_size(req->tools) > 0;
    const char *src = sm->tmpl ? chat_template_source(sm->tmpl, NULL, has_tools) : NULL;
    /* a constrained answer is the document asked for, not calls */
    return turn_syntax_of(src, prompt, len, has_tools && !req->calls_off && !req->grammar);
}

static int make_prompt(struct server *srv, const struct chat_req *req, int **ids, int *thinking,
                       struct turn_syntax *syn, struct api_error *ae)
{
    const struct served_model *sm = &srv->sm;
    struct err e = {{0}};
    *thinking = -1;
    *syn = turn_syntax_of(NULL, NULL, 0, false); /* raw prompts: plain text */
    if (req->n_ids > 0) {
        *ids = malloc(sizeof(int) * (size_t)req->n_ids);
        if (!*ids)
            return api_fail(ae, 500, "server_error", NULL, "out of memory");
        memcpy(*ids, req->ids, sizeof(int) * (size_t)req->n_ids);
        int vocab = sm->m.cfg.vocab_size;
        for (int i = 0; i < req->n_ids; i++)
            if (req->ids[i] < 0 || req->ids[i] >= vocab)
                return api_fail(ae, 400, NULL, "prompt",
                                "token id %d is outside the vocabulary (0..%d)", req->ids[i],
                                vocab - 1);
        return req->n_ids;
    }
    char *text = req->text;
    size_t len = text ? strlen(text) : 0;
    bool add_special = true;
    if (req->messages) {
        json_t *kw = resolve_thinking(srv, req, thinking);
        int rc = prompt_render(sm, req->messages, req->tools, kw, &text, &len, &add_special, &e);
        json_decref(kw);
        if (rc)
            return api_fail(ae, 400, NULL, "messages", "cannot render the chat template: %s",
                            e.msg);
        *syn = chat_syntax(sm, req, text, len);
    }
    int n = tok_encode(sm->tok, text ? text : "", len, add_special, ids, &e);
    if (req->messages)
        free(text);
    if (n < 0)
        return api_fail(ae, 400, NULL, req->messages ? "messages" : "prompt",
                        "cannot tokenize the prompt: %s", e.msg);
    if (n == 0)
        return api_fail(ae, 400, NULL, req->messages ? "messages" : "prompt",
                        "the prompt is empty");
    return n;
}

int gen_count_prompt(struct server *srv, const struct chat_req *req, struct api_error *ae)
{
    int *ids = NULL, thinking;
    struct turn_syntax syn;
    int n = make_prompt(srv, req, &ids, &thinking, &syn, ae);
    free(ids);
    return n;
}

/* A tool_choice that forces a call, as the grammar of the calls the
 * model's template writes (tool_grammar.h). */
static int force_call(const struct chat_req *req, const struct turn_syntax *syn, char **text,
                      struct api_error *ae)
{
    if (req->grammar)
        return api_fail(ae, 400, NULL, "tool_choice",
                        "a tool_choice that forces a call cannot be combined with a structured "
                        "output format; give one");
    if (!req->tools || json_array_size(req->tools) == 0)
        return api_fail(ae, 400, NULL, "tool_choice",
                        "tool_choice forces a tool call but the request has no 'tools'");
    struct err e = {{0}};
    *text = tool_call_gbnf(syn, req->tools, req->force == TOOLS_NAMED ? req->force_name : NULL,
                           req->single_call || req->force == TOOLS_NAMED, &e);
    if (!*text)
        return api_fail(ae, 400, NULL, "tool_choice", "tool_choice: %s", e.msg);
    return 0;
}

/* Code points in n bytes of UTF-8 (what completions' text_offset counts). */
static long long code_points(const char *p, size_t n)
{
    long long c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}

/* echo: the prompt's own text, or its ids decoded; generated text's
 * offsets count from its end. */
static int echo_text(struct gen *g, const struct chat_req *req, const int *ids, int n)
{
    struct err e = {{0}};
    const struct tokenizer *t = g->srv->sm.tok;
    g->echo = req->n_ids > 0 ? tok_decode(t, ids, n, true, &e) : strdup(req->text ? req->text : "");
    if (!g->echo)
        return -1;
    g->echo_n = strlen(g->echo);
    g->chars = code_points(g->echo, g->echo_n);
    detok_init(&g->pdt, t, true);
    return 0;
}

/* ---- start / stop ---- */

int gen_start(struct server *srv, const struct chat_req *req, struct gen **out,
              struct api_error *ae)
{
    const struct serve_config *cfg = srv->cfg;
    const struct served_model *sm = &srv->sm;
    *out = NULL;
    if (atomic_load(&srv->draining))
        return api_fail(ae, 503, "server_error", NULL, "the server is shutting down");
    int *ids = NULL, thinking;
    struct turn_syntax syn;
    int n = make_prompt(srv, req, &ids, &thinking, &syn, ae);
    if (n < 0) {
        free(ids);
        return -1;
    }
    if (n >= sm->ctx_len) {
        free(ids);
        api_fail(ae, 400, NULL, req->messages ? "messages" : "prompt",
                 "the prompt has %d tokens but the context is %d tokens (at least one must "
                 "remain for the answer); shorten the prompt or start the server with a larger "
                 "--ctx", n, sm->ctx_len);
        snprintf(ae->code, sizeof ae->code, "context_length_exceeded");
        return -1;
    }

    for (int i = 0; i < req->n_bias; i++)
        if (req->bias_ids[i] >= sm->m.cfg.vocab_size) {
            free(ids);
            return api_fail(ae, 400, NULL, "logit_bias",
                            "'logit_bias': token id %d is outside the vocabulary (0..%d)",
                            req->bias_ids[i], sm->m.cfg.vocab_size - 1);
        }
    struct engine_params p = {0};
    bool temp_from_request;
    p.sp.temperature = pick_f(req->temperature, cfg->temperature, sm->gc_temperature, 0.7f,
                              &temp_from_request);
    if (!temp_from_request && thinking == 0 && p.sp.temperature > 0.7f)
        p.sp.temperature = 0.7f; /* spec: a no-think turn is capped at 0.7 */
    p.sp.top_p = pick_f(req->top_p, cfg->top_p, sm->gc_top_p, 0, NULL);
    if (!(p.sp.top_p > 0 && p.sp.top_p < 1))
        p.sp.top_p = 1; /* 0 and 1 both mean off */
    p.sp.min_p = pick_f(req->min_p, cfg->min_p, sm->gc_min_p, 0, NULL);
    p.sp.top_k = pick_i(req->top_k, cfg->top_k, sm->gc_top_k, 0);
    if (req->has_seed) {
        p.sp.seed = req->seed;
    } else if (getrandom(&p.sp.seed, sizeof p.sp.seed, 0) != (ssize_t)sizeof p.sp.seed) {
        p.sp.seed = (uint64_t)(clock_now_s() * 1e9);
    }
    p.max_tokens = req->max_tokens > 0 ? req->max_tokens
                   : cfg->max_tokens.set ? cfg->max_tokens.v : 0;
    p.ignore_eos = req->ignore_eos;
    p.proc = (struct logits_params){
        .bias_ids = req->bias_ids, .bias = req->bias, .n_bias = req->n_bias,
        .repetition = pick_f(req->repetition, (struct opt_f){0}, sm->gc_repetition, 1, NULL),
        .presence = req->presence.set ? req->presence.v : 0,
        .frequency = req->frequency.set ? req->frequency.v : 0,
        .repetition_window = req->repetition_window.set ? req->repetition_window.v : 0,
        .presence_window = req->presence_window.set ? req->presence_window.v : 0,
        .frequency_window = req->frequency_window.set ? req->frequency_window.v : 0};
    p.logprobs = req->logprobs;
    p.top_logprobs = req->top_logprobs;
    p.prompt_logprobs = req->echo && req->logprobs;
    p.prompt_only = req->prompt_only;
    p.stop_ids = sm->stop_ids;
    p.n_stop_ids = req->ignore_eos ? 0 : sm->n_stop_ids;
    char *forced = NULL;
    if (req->force != TOOLS_AUTO && force_call(req, &syn, &forced, ae)) {
        free(ids);
        return -1;
    }
    if (req->grammar || forced) {
        const char *text = req->grammar ? req->grammar : forced;
        struct err ge = {{0}};
        p.grammar = grammar_parse(text, strlen(text), &ge);
        free(forced);
        if (!p.grammar) { /* compiled once already, or made here: a bug or memory */
            free(ids);
            return api_fail(ae, 500, "server_error", NULL, "%s", ge.msg);
        }
        p.grammar_vocab = sm->gvocab;
    }

    struct gen *g = calloc(1, sizeof *g);
    struct err e = {{0}};
    if (!g) {
        free(ids);
        grammar_free(p.grammar);
        return api_fail(ae, 500, "server_error", NULL, "out of memory");
    }
    g->srv = srv;
    g->n_prompt = n;
    g->logprobs = req->logprobs;
    if (req->echo && echo_text(g, req, ids, n)) {
        free(ids);
        grammar_free(p.grammar);
        gen_free(g);
        return api_fail(ae, 500, "server_error", NULL, "out of memory");
    }
    g->tools = json_incref(req->tools);
    g->syn = syn;
    g->think = !syn.think ? 2 : syn.think_open ? 1 : 0;
    g->syn.schema = g->tools;
    g->piece_cap = detok_max_bytes(sm->tok) + 1;
    g->piece = malloc(g->piece_cap);
    for (int i = 0; i < req->n_stops; i++) {
        g->stop_len[i] = strlen(req->stops[i]);
        g->stops[i] = malloc(g->stop_len[i] + 1);
        if (!g->stops[i])
            break;
        memcpy(g->stops[i], req->stops[i], g->stop_len[i] + 1);
        g->n_stops++;
    }
    if (!g->piece || g->n_stops != req->n_stops) {
        free(ids);
        grammar_free(p.grammar);
        gen_free(g);
        return api_fail(ae, 500, "server_error", NULL, "out of memory");
    }
    detok_init(&g->dt, sm->tok, true);
    g->dt.prev_id = ids[n - 1]; /* the first generated piece keeps its leading space */
    g->r = engine_request_new(ids, n, &p, &e); /* takes p.grammar when it succeeds */
    free(ids);
    if (!g->r) {
        grammar_free(p.grammar);
        gen_free(g);
        return api_fail(ae, 400, NULL, NULL, "%s", e.msg);
    }
    int src = engine_submit(srv->eng, g->r, &e);
    if (src) {
        gen_free(g);
        if (src == ENGINE_SUBMIT_ADMISSION)
            return api_fail(ae, 400, "memory_admission", NULL, "%s", e.msg);
        if (src == ENGINE_SUBMIT_INVALID)
            return api_fail(ae, 400, NULL, NULL, "%s", e.msg);
        if (atomic_load(&srv->draining))
            return api_fail(ae, 503, "server_error", NULL, "the server is shutting down");
        pthread_mutex_lock(&srv->mu);
        srv->ctr.rejected_queue_full++;
        pthread_mutex_unlock(&srv->mu);
        api_fail(ae, 429, "rate_limit_error", NULL, "%s", e.msg);
        snprintf(ae->code, sizeof ae->code, "rate_limit_exceeded");
        return -1;
    }
    pthread_mutex_lock(&srv->mu);
    g->next = srv->gens;
    if (srv->gens)
        srv->gens->prev = g;
    srv->gens = g;
    g->listed = true;
    pthread_mutex_unlock(&srv->mu);
    atomic_fetch_add(&srv->in_flight, 1);
    *out = g;
    return 0;
}

struct turn_syntax gen_syntax(const struct gen *g)
{
    return g->syn;
}

int gen_prompt_tokens(const struct gen *g) { return g->n_prompt; }

void gen_cancel(struct gen *g)
{
    if (g->r)
        engine_request_cancel(g->r);
}

void gen_free(struct gen *g)
{
    if (!g)
        return;
    struct server *srv = g->srv;
    if (g->listed) {
        pthread_mutex_lock(&srv->mu);
        if (g->prev)
            g->prev->next = g->next;
        else
            srv->gens = g->next;
        if (g->next)
            g->next->prev = g->prev;
        pthread_mutex_unlock(&srv->mu);
        atomic_fetch_sub(&srv->in_flight, 1);
    }
    if (g->r) {
        engine_request_cancel(g->r); /* no-op when it already ended */
        engine_request_release(g->r);
    }
    for (int i = 0; i < g->n_stops; i++)
        free(g->stops[i]);
    free(g->piece);
    free(g->lps);
    free(g->echo);
    buf_free(&g->pending);
    json_decref(g->tools);
    free(g);
}

void gen_cancel_all(struct server *srv)
{
    pthread_mutex_lock(&srv->mu); /* a gen leaves the list under mu before it is freed */
    for (struct gen *g = srv->gens; g; g = g->next)
        gen_cancel(g);
    pthread_mutex_unlock(&srv->mu);
}

/* ---- token events -> text ---- */

/* Counts a token toward res.n_reasoning when it is part of the reasoning
 * block that opens the turn, as turn.c splits it: blanks, "<think>", the
 * reasoning, "</think>" (or everything, when the prompt opened it). A
 * token's text is scanned once; only the marker-long tail is kept. */
static void count_reasoning(struct gen *g, const char *p, size_t k)
{
    static const char open[] = "<think>", close[] = "</think>";
    if (g->think == 2)
        return;
    for (size_t i = 0; i < k && g->think == 0; i++) {
        char c = p[i];
        if (g->think_n == 0 && (c == ' ' || c == '\n' || c == '\t' || c == '\r'))
            continue;
        g->think_tail[g->think_n++] = c;
        if (memcmp(g->think_tail, open, g->think_n)) {
            g->think = 2; /* the turn does not open with reasoning */
            return;
        }
        if (g->think_n == sizeof open - 1) {
            g->think = 1;
            g->think_n = 0;
            p += i + 1; /* the rest of this token is reasoning text */
            k -= i + 1;
        }
    }
    if (g->think == 0) {
        g->think_undecided++;
        return;
    }
    g->res.n_reasoning += 1 + g->think_undecided;
    g->think_undecided = 0;
    /* "</think>" in this token, or across the kept tail and its start */
    const size_t keep = sizeof close - 2;
    char win[2 * (sizeof close - 2)];
    size_t w = g->think_n, take = k < keep ? k : keep;
    memcpy(win, g->think_tail, w);
    memcpy(win + w, p, take);
    if (memmem(win, w + take, close, sizeof close - 1) || memmem(p, k, close, sizeof close - 1)) {
        g->think = 2;
        return;
    }
    if (k >= keep) { /* the tail: the last bytes seen */
        memcpy(g->think_tail, p + k - keep, keep);
        g->think_n = keep;
    } else {
        size_t n = w + take < keep ? w + take : keep;
        memmove(g->think_tail, win + w + take - n, n);
        g->think_n = n;
    }
}

/* Looks for a stop string in the pending text. Returns its index and sets
 * *emit to the bytes before it; or returns -1 and sets *emit to the bytes
 * that can no longer be part of a stop string (the rest is held: it is a
 * prefix of some stop string). Held text starts where a stop string starts,
 * at a character boundary, so released text is always whole UTF-8. */
static int stop_scan(const struct gen *g, size_t *emit)
{
    const char *p = g->pending.p;
    size_t n = g->pending.n, best = (size_t)-1;
    int which = -1;
    for (int i = 0; i < g->n_stops; i++) {
        const char *hit = memmem(p, n, g->stops[i], g->stop_len[i]);
        if (hit && (size_t)(hit - p) < best) {
            best = (size_t)(hit - p);
            which = i;
        }
    }
    if (which >= 0) {
        *emit = best;
        return which;
    }
    size_t hold = 0;
    for (int i = 0; i < g->n_stops; i++) {
        size_t k = turn_held_tail(p, n, g->stops[i], g->stop_len[i]);
        if (k > hold)
            hold = k;
    }
    *emit = n - hold;
    return -1;
}

static void release(struct gen *g, struct buf *text, size_t n)
{
    buf_putn(text, g->pending.p, n);
    buf_consume(&g->pending, n);
}

static void finish(struct gen *g, enum gen_finish why, const struct engine_event *ev)
{
    g->finished = true;
    g->res.finish = why;
    g->res.n_prompt = g->n_prompt;
    g->res.n_completion = g->n_tokens;
    if (ev)
        g->res.n_cached = ev->n_cached;
}

static int keep_logprob(struct gen *g, const struct engine_event *ev, long long offset)
{
    if (g->n_lps == g->cap_lps) {
        int cap = g->cap_lps ? 2 * g->cap_lps : 64;
        struct gen_logprob *n = realloc(g->lps, sizeof *n * (size_t)cap);
        if (!n)
            return -1;
        g->lps = n;
        g->cap_lps = cap;
    }
    g->lps[g->n_lps++] = (struct gen_logprob){.token = ev->token, .offset = offset,
                                              .none = !ev->has_logprobs, .lp = ev->lp};
    return 0;
}

int gen_take_logprobs(struct gen *g, const struct gen_logprob **out)
{
    *out = g->lps + g->taken;
    int n = g->n_lps - g->taken;
    g->taken = g->n_lps;
    return n;
}

bool gen_has_logprobs(const struct gen *g) { return g->logprobs; }

const struct tokenizer *gen_tokenizer(const struct gen *g) { return g->srv->sm.tok; }

int gen_next(struct gen *g, struct buf *text, int timeout_ms, struct gen_result *res)
{
    size_t start = text->n;
    double deadline = clock_now_s() + timeout_ms / 1000.0;
    if (g->echo && g->echo_n) { /* before any token: it is no stop string's part */
        buf_putn(text, g->echo, g->echo_n);
        g->echo_n = 0;
    }
    while (!g->finished) {
        int left = (int)((deadline - clock_now_s()) * 1000.0);
        struct engine_event ev;
        if (engine_request_next(g->r, &ev, left > 0 ? left : 0) == 0)
            return text->n > start ? GEN_TEXT : GEN_WAIT;
        g->res.n_cached = ev.n_cached; /* every event carries it, and these */
        g->res.spec_steps = ev.spec_steps;
        g->res.spec_drafted = ev.spec_drafted;
        g->res.spec_accepted = ev.spec_accepted;
        if (ev.prompt) { /* echo's prompt entries, before any generated token */
            if (g->logprobs && !g->lp_oom && keep_logprob(g, &ev, g->pchars))
                g->lp_oom = true;
            size_t k = detok_feed(&g->pdt, ev.token, g->piece, g->piece_cap);
            g->pchars += code_points(g->piece, k);
            continue;
        }
        if (ev.finish == ENGINE_FINISH_NONE) {
            g->n_tokens++;
            if (g->logprobs && !g->lp_oom && ev.has_logprobs && keep_logprob(g, &ev, g->chars))
                g->lp_oom = true; /* out of memory: the rest go without */
            size_t k = detok_feed(&g->dt, ev.token, g->piece, g->piece_cap);
            if (g->logprobs) /* offsets are for logprobs alone */
                g->chars += code_points(g->piece, k);
            count_reasoning(g, g->piece, k);
            buf_putn(&g->pending, g->piece, k);
            size_t emit;
            int hit = stop_scan(g, &emit);
            release(g, text, emit);
            if (hit >= 0) {
                engine_request_cancel(g->r); /* the engine frees the slot at its next step */
                g->res.stop_index = hit;
                g->res.stop = g->stops[hit];
                finish(g, GEN_FINISH_STOP, NULL);
                break;
            }
            if (text->n > start)
                return GEN_TEXT;
            continue;
        }
        /* The final event: nothing held back can become a stop string now. */
        size_t k = detok_flush(&g->dt, g->piece, g->piece_cap);
        buf_putn(&g->pending, g->piece, k);
        release(g, text, g->pending.n);
        g->res.stop_index = -1;
        switch (ev.finish) {
        case ENGINE_FINISH_STOP: finish(g, GEN_FINISH_STOP, &ev); break;
        case ENGINE_FINISH_LENGTH: finish(g, GEN_FINISH_LENGTH, &ev); break;
        case ENGINE_FINISH_CANCELLED: finish(g, GEN_FINISH_CANCELLED, &ev); break;
        default:
            snprintf(g->res.error, sizeof g->res.error, "%s",
                     ev.error[0] ? ev.error : "generation failed");
            finish(g, GEN_FINISH_ERROR, &ev);
        }
    }
    if (text->n > start)
        return GEN_TEXT; /* the final text first; the next call reports the end */
    *res = g->res;
    return GEN_DONE;
}

int gen_collect(struct gen *g, struct buf *text, struct gen_result *res,
                const struct client *cl)
{
    double next_check = clock_now_s() + 0.1;
    for (;;) {
        if (gen_next(g, text, 100, res) == GEN_DONE)
            return 0;
        /* tokens may flow without pause: look at the socket on a clock, not
         * only when waiting */
        if (clock_now_s() >= next_check) {
            next_check = clock_now_s() + 0.1;
            if (cl && cl->gone && cl->gone(cl->ctx)) {
                gen_cancel(g);
                return -1;
            }
        }
    }
}

/* ---- streams ---- */

/* The turn's events to the adapter's ops. */
static void stream_turn_event(void *ctx, const struct turn_event *ev)
{
    struct stream *s = ctx;
    if (ev->kind == TURN_TOOL_CALL)
        s->ops->tool_call(s, ev->name, ev->args);
    else
        s->ops->text(s, ev->kind, ev->text, ev->n);
}

struct stream *stream_new(struct server *srv, struct gen *gen, const struct stream_ops *ops,
                          void *st)
{
    struct stream *s = calloc(1, sizeof *s);
    if (!s) {
        gen_free(gen);
        if (ops->free)
            ops->free(st);
        return NULL;
    }
    s->srv = srv;
    s->gen = gen;
    s->ops = ops;
    s->st = st;
    turn_init(&s->turn, gen_syntax(gen), stream_turn_event, s);
    return s;
}

int stream_fill(struct stream *s, const struct client *cl)
{
    if (s->off == s->out.n) {
        s->off = 0;
        s->out.n = 0;
    }
    while (s->off == s->out.n) {
        if (s->out.oom)
            return -1;
        if (s->phase == 2)
            return 0;
        if (s->phase == 0) {
            s->ops->begin(s);
            s->phase = 1;
            continue;
        }
        struct buf text = {0};
        struct gen_result res;
        int rc = gen_next(s->gen, &text, 100, &res);
        /* Events that are already there go out in the same write: one
         * event per token still, but one syscall when the socket lags. */
        while (rc == GEN_TEXT && s->out.n - s->off < 16384) {
            turn_feed(&s->turn, text.p, text.n);
            text.n = 0;
            rc = gen_next(s->gen, &text, 0, &res);
        }
        if (rc == GEN_TEXT) /* the buffer is full: send what there is first */
            turn_feed(&s->turn, text.p, text.n);
        buf_free(&text);
        if (s->turn.oom)
            s->out.oom = true;
        if (rc == GEN_DONE) {
            if (turn_finish(&s->turn))
                s->out.oom = true;
            s->ops->end(s, &res);
            s->phase = 2;
        } else if (rc == GEN_WAIT && s->off == s->out.n && cl && cl->gone && cl->gone(cl->ctx)) {
            /* (while bytes flow, a failed write tells libmicrohttpd instead) */
            gen_cancel(s->gen);
            return -1;
        }
    }
    return 1;
}

void stream_free(struct stream *s)
{
    if (!s)
        return;
    gen_free(s->gen);
    if (s->ops->free)
        s->ops->free(s->st);
    buf_free(&s->out);
    turn_free(&s->turn);
    free(s);
}

bool gen_failed(const struct gen_result *res, const char *type, struct api_error *ae)
{
    if (res->finish == GEN_FINISH_CANCELLED) {
        api_fail(ae, 503, type, NULL, "the generation was cancelled (the server is shutting down)");
        return true;
    }
    if (res->finish == GEN_FINISH_ERROR) {
        api_fail(ae, 500, type, NULL, "generation failed: %s", res->error);
        return true;
    }
    return false;
}

/* ---- a whole turn's parts ---- */

static void parts_event(void *ctx, const struct turn_event *ev)
{
    struct turn_parts *p = ctx;
    if (ev->kind == TURN_CONTENT) {
        buf_putn(&p->content, ev->text, ev->n);
    } else if (ev->kind == TURN_REASONING) {
        buf_putn(&p->reasoning, ev->text, ev->n);
    } else if (!p->calls || json_array_append_new(p->calls, json_pack("{s:s, s:s}", "name", ev->name,
                                                                      "arguments", ev->args))) {
        p->oom = true;
    }
}

int turn_parts_split(struct turn_syntax syn, const char *text, size_t n, struct turn_parts *p)
{
    memset(p, 0, sizeof *p);
    p->calls = json_array();
    struct turn t;
    turn_init(&t, syn, parts_event, p);
    if (turn_feed(&t, text, n) || turn_finish(&t))
        p->oom = true;
    turn_free(&t);
    p->oom = p->oom || !p->calls || p->content.oom || p->reasoning.oom;
    return p->oom ? -1 : 0;
}

void turn_parts_free(struct turn_parts *p)
{
    buf_free(&p->content);
    buf_free(&p->reasoning);
    json_decref(p->calls);
    p->calls = NULL;
}
