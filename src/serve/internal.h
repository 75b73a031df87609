/* internal.h - what the files of serve/ share: the server object, the one
 * chat request every API adapter parses into, the generation stream that
 * chat.c runs for it, SSE output buffers and API errors.
 *
 * Data path: http.c parses the body JSON and routes; an adapter (openai.c,
 * anthropic.c, responses.c) validates fields into a struct chat_req; chat.c
 * renders/tokenizes it, submits it to the engine and turns token events into
 * text deltas (streaming detokenizer + stop strings); the adapter formats
 * those deltas as JSON or SSE events. */
#ifndef CLLM_SERVE_INTERNAL_H
#define CLLM_SERVE_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "base/buf.h"
#include "base/err.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "serve/config.h"
#include "serve/turn.h"
#include "tokenizer/tokenizer.h"

#define SERVE_MAX_STOPS 16      /* stop strings per request */
#define SERVE_MAX_STOP_LEN 1024 /* bytes per stop string */

/* ---- text buffers (base/buf.h), SSE and JSON helpers (sbuf.c) ---- */

/* One server-sent event: "event: NAME\n" (when name is non-NULL) then
 * "data: <compact JSON>\n\n". Does not take the reference. */
void sbuf_sse(struct buf *b, const char *name, const json_t *data);
/* A JSON value as compact text (caller frees); NULL when out of memory. */
char *json_compact(const json_t *v, size_t *len);
/* A JSON string from text that should be UTF-8 (bad bytes become U+FFFD). */
json_t *json_text(const char *p, size_t n);
/* A float as the short decimal it came from (0.6, not 0.60000002). */
json_t *json_float(float v);
/* A random id with a prefix: "chatcmpl-3f2a..." (24 hex digits). */
void serve_make_id(char *out, size_t cap, const char *prefix);

/* ---- API errors (fields.c) ---- */

enum api_shape { SHAPE_OPENAI, SHAPE_ANTHROPIC };

struct api_error {
    int status;     /* HTTP status */
    char type[48];  /* OpenAI error.type; Anthropic error.type is derived from status */
    char param[96]; /* the offending field ("" = null) */
    char code[48];  /* OpenAI error.code ("" = null) */
    char message[768];
};

int api_fail(struct api_error *ae, int status, const char *type, const char *param,
             const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* {"error":{"message","type","param","code"}} or
 * {"type":"error","error":{"type","message"}}. */
json_t *api_error_body(const struct api_error *ae, enum api_shape shape);

/* ---- the loaded model (server.c) ---- */

struct served_model {
    struct model m;
    bool loaded;
    struct tokenizer *tok;
    struct chat_template *tmpl; /* NULL: the plain "role: content" transcript */
    struct grammar_vocab *gvocab; /* every token's bytes, for structured output */
    char id[256];    /* the name /v1/models reports (the path's base name) */
    char path[1024];
    int ctx_len;     /* tokens per sequence the engine allows */
    struct model draft; /* --draft-model, when draft_loaded */
    bool draft_loaded;
    /* generation_config.json sampling defaults (below the server flags) */
    struct opt_f gc_temperature, gc_top_p, gc_min_p, gc_repetition;
    struct opt_i gc_top_k;
    /* ids that end generation beyond config.json's eos ids:
     * generation_config.json eos_token_id and the tokenizer's eos */
    int stop_ids[16];
    int n_stop_ids;
};

/* ---- the common chat request (filled by the adapters; fields.c) ---- */

struct chat_req {
    /* chat: normalized messages [{role, content: string, ...}] fed to the
     * chat template; NULL for a raw prompt (/v1/completions). */
    json_t *messages;
    json_t *tools;  /* array or NULL */
    bool calls_off; /* tool_choice "none": the model's calls stay text */
    /* tool_choice that forces a call: "required" / {"type": "any"}, or one
     * named tool; one call only when parallel calls are turned off */
    enum { TOOLS_AUTO, TOOLS_REQUIRED, TOOLS_NAMED } force;
    char force_name[256];
    bool single_call;
    json_t *kwargs; /* chat_template_kwargs object or NULL */
    int thinking;   /* from reasoning_effort: -1 unset, 0 off, 1 on */
    /* raw prompt: text, or ids when n_ids > 0 */
    char *text;
    int *ids;
    int n_ids;
    /* sampling; unset fields fall back to flag > generation_config > built-in */
    struct opt_f temperature, top_p, min_p;
    struct opt_i top_k;
    bool has_seed;
    uint64_t seed;
    int max_tokens; /* 0: unset */
    bool prompt_only; /* completions' max_tokens 0: generate nothing (the echoed
                       * prompt and its logprobs are the answer) */
    bool ignore_eos;
    char *stops[SERVE_MAX_STOPS];
    int n_stops;
    bool stream;
    /* structured output: GBNF text the answer must be a sentence of (a
     * JSON Schema's, or the request's own grammar), or NULL */
    char *grammar;
    /* logits processing (engine/logits.h): logit_bias (arrays owned) and
     * the penalties with their windows (*_context_size); unset repetition
     * falls back to generation_config.json's */
    int *bias_ids;
    float *bias;
    int n_bias;
    struct opt_f repetition, presence, frequency;
    struct opt_i repetition_window, presence_window, frequency_window;
    /* each generated token's log-probability and the top_logprobs most
     * likely alternatives' come back with it */
    bool logprobs;
    int top_logprobs;
    /* completions' echo: the answer's text starts with the prompt's, and
     * with logprobs the prompt's tokens have entries too */
    bool echo;
};

void chat_req_free(struct chat_req *r);

/* Field readers: absent or JSON null leaves the output unset and returns 0;
 * a wrong type or range fills ae (400, naming the field) and returns -1. */
int field_number(const json_t *obj, const char *key, double lo, double hi, struct opt_f *out,
                 struct api_error *ae);
int field_int(const json_t *obj, const char *key, long lo, long hi, struct opt_i *out,
              struct api_error *ae);
int field_bool(const json_t *obj, const char *key, bool *out, struct api_error *ae);
int field_string(const json_t *obj, const char *key, const char **out, struct api_error *ae);
int field_object(const json_t *obj, const char *key, json_t **out, struct api_error *ae);
int field_array(const json_t *obj, const char *key, json_t **out, struct api_error *ae);
/* temperature, top_p, top_k, min_p, seed, ignore_eos, and the logits
 * processors (logit_bias, repetition_penalty, presence_penalty,
 * frequency_penalty and their *_context_size windows) into r. */
int field_sampling(const json_t *obj, struct chat_req *r, struct api_error *ae);
/* A stop string or list of stop strings (key names the field). */
int field_stops(const json_t *obj, const char *key, struct chat_req *r, struct api_error *ae);
/* Whether s is one of names (NULL-terminated). */
bool name_among(const char *s, const char *const *names);
/* A tool call in the chat form the templates read (OpenAI's): {id (when
 * not NULL), type: "function", function: {name, arguments}}, taking
 * args (a JSON string, or an object); NULL when out of memory. */
json_t *chat_tool_call(const char *id, const char *name, json_t *args);
/* A message content: a string, null, or an array of text parts whose type
 * is one of `types` (NULL-terminated). Appends the text; non-text parts are
 * refused with a 400 naming param. */
int content_text(const json_t *content, const char *param, const char *const *types,
                 struct buf *out, struct api_error *ae);
/* tool_choice in any API's shape into r: "none" / {"type": "none"} turns
 * call parsing off; "required", {"type": "any"} or "required" forces a
 * call; {"type": "function", "function": {"name"}} (chat), {"type":
 * "function" or "custom", "name"} (Responses) or {"type": "tool", "name"}
 * (Messages) forces that tool, and Responses' {"type": "allowed_tools",
 * "mode": "required"} a call; parallel_tool_calls false or Anthropic's
 * disable_parallel_tool_use allow one call. "auto" and choices cllm does
 * not know are left to the model. A named choice without a name: 400. */
int field_tool_choice(const json_t *obj, struct chat_req *r, struct api_error *ae);
/* Structured output into r->grammar, from whichever of these fields the
 * request has (two of them: 400): response_format / Anthropic's
 * output_format ({type: "text" | "json_object" | "json_schema"}, the schema
 * under json_schema.schema or, as Responses' text.format has it, beside the
 * type), and the extensions guided_json (a schema), guided_grammar and
 * grammar (GBNF text), guided_choice (an array of strings: one of them),
 * guided_regex (a regular expression the whole answer matches) and vLLM's
 * structured_outputs ({json | regex | choice | grammar | json_object}).
 * format_key names where the format object is read from obj, format_param
 * how errors name it ("response_format", "text.format", "output_format").
 * A schema outside the supported subset, an unsupported expression or a
 * grammar that does not compile is a 400 naming the field. */
int field_structured(const json_t *obj, const char *format_key, const char *format_param,
                     struct chat_req *r, struct api_error *ae);
/* reasoning_effort: "none" -> 0, any other level -> 1. */
int field_reasoning_effort(const json_t *obj, const char *key, struct chat_req *r,
                           struct api_error *ae);

/* ---- the server ---- */

struct gen;
struct response_store;
struct chat_template;

struct server_counters {
    uint64_t http_requests;
    uint64_t status_2xx, status_4xx, status_5xx;
    uint64_t rejected_queue_full; /* 429 */
    uint64_t disconnects;         /* clients that left before the end */
};

struct server {
    const struct serve_config *cfg;
    struct served_model sm;
    struct engine *eng;
    double t_start;
    time_t created;
    atomic_bool draining;  /* SIGINT/SIGTERM seen: refuse new generations */
    atomic_int in_flight;  /* generations started and not yet freed */
    atomic_int active;     /* HTTP requests received and not yet fully answered */
    atomic_int connections;
    pthread_mutex_t mu;    /* guards gens, ctr */
    struct gen *gens;      /* in-flight generations (cancelled at shutdown) */
    struct server_counters ctr;
    struct response_store *store;
};

void server_count_status(struct server *srv, int status);

/* ---- prompt (prompt.c) ---- */

/* Renders messages (+ tools, template kwargs) into prompt text with the
 * model's chat template, or with the plain "role: content\n" fallback when
 * the model has none. *add_special says whether tokenizing the text should
 * add BOS/EOS (templates write their own). */
int prompt_render(const struct served_model *sm, const json_t *messages, const json_t *tools,
                  const json_t *kwargs, char **out, size_t *len, bool *add_special,
                  struct err *e);

/* ---- generation (chat.c) ---- */

enum gen_finish { GEN_FINISH_STOP, GEN_FINISH_LENGTH, GEN_FINISH_CANCELLED, GEN_FINISH_ERROR };

struct gen_result {
    enum gen_finish finish;
    int stop_index;     /* which stop string matched, or -1 (EOS / stop token) */
    const char *stop;   /* that string (owned by the gen), or NULL */
    int n_prompt, n_completion, n_cached;
    int n_reasoning; /* generated tokens of the <think> block opening the turn */
    int spec_steps, spec_drafted, spec_accepted; /* its speculation (engine_event's) */
    char error[256];
};

enum { GEN_WAIT = 0, GEN_TEXT = 1, GEN_DONE = 2 };

/* Renders, tokenizes and submits. On failure fills ae: 400 (bad prompt,
 * too long for the context), 429 (queue full), 503 (shutting down). */
int gen_start(struct server *srv, const struct chat_req *req, struct gen **out,
              struct api_error *ae);
/* Waits up to timeout_ms. GEN_TEXT: new text was appended to `text` (never
 * a stop string or a prefix of one that may still complete); GEN_DONE: the
 * generation ended (res filled; call again and it stays DONE); GEN_WAIT:
 * nothing yet. */
int gen_next(struct gen *g, struct buf *text, int timeout_ms, struct gen_result *res);
int gen_prompt_tokens(const struct gen *g);
/* A generated token's log-probabilities (the request asked for logprobs):
 * offset counts the code points of the text before it. */
struct gen_logprob {
    int token;
    long long offset;
    bool none; /* the prompt's first token (echo): nothing predicts it */
    struct token_logprobs lp;
};
/* The entries of the tokens that came since the last call (every one, the
 * first time), in order; valid until gen_free. Tokens whose text is still
 * held back (a possible stop string) are among them. */
int gen_take_logprobs(struct gen *g, const struct gen_logprob **out);
/* Whether the request asked for logprobs. */
bool gen_has_logprobs(const struct gen *g);
const struct tokenizer *gen_tokenizer(const struct gen *g);

/* ---- logprobs in each API's shape (logprobs.c) ---- */

/* Chat's logprobs.content and Responses' output_text logprobs: [{token,
 * logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]. */
json_t *logprobs_content(const struct tokenizer *t, const struct gen_logprob *e, int n);
/* Completions' logprobs: {tokens, token_logprobs, top_logprobs: [{token:
 * logprob}], text_offset}. */
json_t *logprobs_completion(const struct tokenizer *t, const struct gen_logprob *e, int n);
/* How the generated text splits into reasoning, content and tool calls:
 * from the chat template and the request's tools (plain for raw prompts).
 * Its schema is g's: valid until gen_free(g). */
struct turn_syntax gen_syntax(const struct gen *g);

/* A whole turn split (non-streamed answers): reasoning and content text,
 * calls [{name, arguments: compact JSON text}] in order. */
struct turn_parts {
    struct buf reasoning, content;
    json_t *calls;
    bool oom;
};
/* -1 when out of memory (p is still freed with turn_parts_free). */
int turn_parts_split(struct turn_syntax syn, const char *text, size_t n, struct turn_parts *p);
void turn_parts_free(struct turn_parts *p);
/* The prompt's token count without generating (-1 with ae on failure). */
int gen_count_prompt(struct server *srv, const struct chat_req *req, struct api_error *ae);
void gen_cancel(struct gen *g);
/* Cancels every in-flight generation (shutdown timeout). */
void gen_cancel_all(struct server *srv);
/* Cancels if still running and frees; the engine slot frees at its next step. */
void gen_free(struct gen *g);

/* Whether the HTTP client has gone away (http.c supplies it). */
struct client {
    bool (*gone)(void *ctx);
    void *ctx;
};

/* Runs to the end, appending all text. Returns 0, or -1 when the client
 * left (the generation is cancelled). */
int gen_collect(struct gen *g, struct buf *text, struct gen_result *res,
                const struct client *cl);
/* A generation that did not finish normally (cancelled at shutdown: 503;
 * failed: 500) as an API error of `type` (NULL for the Anthropic shape,
 * which sets its own); false when it finished normally. */
bool gen_failed(const struct gen_result *res, const char *type, struct api_error *ae);

/* ---- streams (chat.c drives, adapters format) ---- */

struct stream;

/* A stream's text goes through the turn parser (turn.h) of its gen's
 * syntax: content and reasoning reach `text` with their kind, tool calls
 * `tool_call` (a raw prompt's stream has only content). */
struct stream_ops {
    void (*begin)(struct stream *s); /* first events */
    void (*text)(struct stream *s, enum turn_kind kind, const char *text, size_t n);
    void (*tool_call)(struct stream *s, const char *name, const char *args); /* a whole call */
    void (*end)(struct stream *s, const struct gen_result *res); /* last events */
    void (*free)(void *st);                                      /* adapter state */
};

struct stream {
    struct server *srv;
    struct gen *gen;
    const struct stream_ops *ops;
    void *st;          /* adapter state */
    struct buf out;   /* bytes not yet handed to HTTP: [off, out.n) */
    size_t off;
    struct turn turn;  /* the gen's text into the ops */
    int phase;         /* 0 before begin, 1 streaming, 2 ended */
};

/* Takes ownership of gen and st. */
struct stream *stream_new(struct server *srv, struct gen *gen, const struct stream_ops *ops,
                          void *st);
/* Makes bytes available in s->out[s->off..]: 1 when there are some, 0 at
 * the end of the stream, -1 when the client left (generation cancelled). */
int stream_fill(struct stream *s, const struct client *cl);
void stream_free(struct stream *s);

/* ---- routes ---- */

struct reply {
    int status;
    json_t *body;          /* JSON body (owned), or */
    struct stream *stream; /* an SSE stream (owned) */
};

/* Sets an error reply in the route's shape. */
void reply_error(struct reply *rp, const struct api_error *ae, enum api_shape shape);
/* The "model" field answers: the request's name, or the loaded model's id. */
const char *reply_model_name(const struct server *srv, const json_t *req);

void openai_chat(struct server *srv, const json_t *req, const struct client *cl,
                 struct reply *rp);
void openai_completions(struct server *srv, const json_t *req, const struct client *cl,
                        struct reply *rp);
json_t *openai_models(const struct server *srv);
json_t *openai_model(const struct server *srv, const char *name);
void anthropic_messages(struct server *srv, const json_t *req, const struct client *cl,
                        struct reply *rp);
/* POST /v1/messages/count_tokens */
void anthropic_count_tokens(struct server *srv, const json_t *req, const struct client *cl,
                            struct reply *rp);
void responses_create(struct server *srv, const json_t *req, const struct client *cl,
                      struct reply *rp);
/* GET /v1/responses/{id}: the stored response object, or NULL. */
json_t *responses_get(struct server *srv, const char *id);
struct response_store *response_store_new(int cap);
void response_store_free(struct response_store *st);

json_t *stats_json(struct server *srv);
/* GET /metrics: /stats in Prometheus's text format, every number and
 * boolean a metric named cllm_<path> (cllm_kv_blocks_free, ...). Caller
 * frees; NULL when out of memory. */
char *metrics_text(struct server *srv, size_t *len);
json_t *health_json(struct server *srv);

/* ---- HTTP (http.c) ---- */

struct http;
struct http *http_start(struct server *srv, int listen_fd, struct err *e);
/* Stops accepting new connections (existing ones keep being served). */
void http_quiesce(struct http *h);
void http_stop(struct http *h);

#endif
