/* fields.c - typed readers for request JSON fields (a wrong type or range is
 * a 400 that names the field) and the two API error body shapes. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "serve/internal.h"

int api_fail(struct api_error *ae, int status, const char *type, const char *param,
             const char *fmt, ...)
{
    ae->status = status;
    snprintf(ae->type, sizeof ae->type, "%s", type ? type : "invalid_request_error");
    snprintf(ae->param, sizeof ae->param, "%s", param ? param : "");
    ae->code[0] = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ae->message, sizeof ae->message, fmt, ap);
    va_end(ap);
    /* a body jansson can hold: a message cut mid-character would make the
     * answer a 500 instead of this error */
    utf8_one_line(ae->message);
    return -1;
}

static const char *anthropic_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

json_t *api_error_body(const struct api_error *ae, enum api_shape shape)
{
    if (shape == SHAPE_ANTHROPIC)
        return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
                         !strcmp(ae->type, "memory_admission") ? ae->type
                                                               : anthropic_type(ae->status),
                         "message", ae->message);
    return json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", ae->message, "type",
                     ae->type, "param", ae->param[0] ? json_string(ae->param) : json_null(),
                     "code", ae->code[0] ? json_string(ae->code) : json_null());
}

void chat_req_free(struct chat_req *r)
{
    json_decref(r->messages);
    json_decref(r->tools);
    json_decref(r->kwargs);
    free(r->text);
    free(r->ids);
    for (int i = 0; i < r->n_stops; i++)
        free(r->stops[i]);
    free(r->grammar);
    free(r->bias_ids);
    free(r->bias);
    memset(r, 0, sizeof *r);
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* The value of key, or NULL when absent or null. */
static const json_t *get(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

int field_number(const json_t *obj, const char *key, double lo, double hi, struct opt_f *out,
                 struct api_error *ae)
{
    const json_t *v = get(obj, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return api_fail(ae, 400, NULL, key, "'%s' must be a number, not %s", key, type_name(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return api_fail(ae, 400, NULL, key, "'%s' must be in [%g, %g] (got %g)", key, lo, hi, x);
    out->set = true;
    out->v = (float)x;
    return 0;
}

int field_int(const json_t *obj, const char *key, long lo, long hi, struct opt_i *out,
              struct api_error *ae)
{
    const json_t *v = get(obj, key);
    if (!v)
        return 0;
    double x;
    if (json_is_integer(v))
        x = (double)json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)))
        x = json_real_value(v);
    else
        return api_fail(ae, 400, NULL, key, "'%s' must be an integer, not %s", key, type_name(v));
    if (x < (double)lo || x > (double)hi)
        return api_fail(ae, 400, NULL, key, "'%s' must be in [%ld, %ld] (got %.0f)", key, lo, hi,
                        x);
    out->set = true;
    out->v = (int)x;
    return 0;
}

int field_bool(const json_t *obj, const char *key, bool *out, struct api_error *ae)
{
    const json_t *v = get(obj, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return api_fail(ae, 400, NULL, key, "'%s' must be a boolean, not %s", key, type_name(v));
    *out = json_is_true(v);
    return 0;
}

int field_string(const json_t *obj, const char *key, const char **out, struct api_error *ae)
{
    const json_t *v = get(obj, key);
    if (!v)
        return 0;
    if (!json_is_string(v))
        return api_fail(ae, 400, NULL, key, "'%s' must be a string, not %s", key, type_name(v));
    *out = json_string_value(v);
    return 0;
}

int field_object(const json_t *obj, const char *key, json_t **out, struct api_error *ae)
{
    const json_t *v = get(obj, key);
    if (!v)
        return 0;
    if (!json_is_object(v))
        return api_fail(ae, 400, NULL, key, "'%s' must be an object, not %s", key, type_name(v));
    *out = (json_t *)v;
    return 0;
}

int field_array(const json_t *obj, const char *key, json_t **out, struct api_error *ae)
{
    const json_t *v = get(obj, key);
    if (!v)
        return 0;
    if (!json_is_array(v))
        return api_fail(ae, 400, NULL, key, "'%s' must be an array, not %s", key, type_name(v));
    *out = (json_t *)v;
    return 0;
}

/* logit_bias: {"<token id>": bias, ...}, as OpenAI writes it. */
static int field_logit_bias(const json_t *obj, struct chat_req *r, struct api_error *ae)
{
    const json_t *v = get(obj, "logit_bias");
    if (!v)
        return 0;
    if (!json_is_object(v))
        return api_fail(ae, 400, NULL, "logit_bias",
                        "'logit_bias' must be an object of token ids to biases, not %s",
                        type_name(v));
    size_t n = json_object_size(v);
    if (n > LOGIT_BIAS_MAX)
        return api_fail(ae, 400, NULL, "logit_bias",
                        "'logit_bias' has %zu entries; at most %d are allowed", n,
                        LOGIT_BIAS_MAX);
    if (n == 0)
        return 0;
    r->bias_ids = malloc(sizeof(int) * n);
    r->bias = malloc(sizeof(float) * n);
    if (!r->bias_ids || !r->bias)
        return api_fail(ae, 500, "server_error", NULL, "out of memory");
    const char *key;
    const json_t *b;
    json_object_foreach((json_t *)v, key, b) {
        char *end;
        errno = 0;
        long id = strtol(key, &end, 10);
        if (!*key || *end || errno || id < 0 || id > INT32_MAX)
            return api_fail(ae, 400, NULL, "logit_bias",
                            "'logit_bias': the key \"%.64s\" is not a token id", key);
        if (!json_is_number(b) || !(json_number_value(b) >= -100 && json_number_value(b) <= 100))
            return api_fail(ae, 400, NULL, "logit_bias",
                            "'logit_bias': the bias of token %ld must be a number in [-100, 100]",
                            id);
        r->bias_ids[r->n_bias] = (int)id;
        r->bias[r->n_bias++] = (float)json_number_value(b);
    }
    return 0;
}

static int field_processors(const json_t *obj, struct chat_req *r, struct api_error *ae)
{
    return field_number(obj, "repetition_penalty", 0, 100, &r->repetition, ae) ||
                   field_number(obj, "presence_penalty", -2, 2, &r->presence, ae) ||
                   field_number(obj, "frequency_penalty", -2, 2, &r->frequency, ae) ||
                   field_int(obj, "repetition_context_size", 1, 10000000, &r->repetition_window,
                             ae) ||
                   field_int(obj, "presence_context_size", 1, 10000000, &r->presence_window, ae) ||
                   field_int(obj, "frequency_context_size", 1, 10000000, &r->frequency_window,
                             ae) ||
                   field_logit_bias(obj, r, ae)
               ? -1
               : 0;
}

int field_sampling(const json_t *obj, struct chat_req *r, struct api_error *ae)
{
    if (field_number(obj, "temperature", 0, 5, &r->temperature, ae) ||
        field_number(obj, "top_p", 0, 1, &r->top_p, ae) ||
        field_number(obj, "min_p", 0, 1, &r->min_p, ae) ||
        field_int(obj, "top_k", -1, 1000000, &r->top_k, ae) ||
        field_bool(obj, "ignore_eos", &r->ignore_eos, ae))
        return -1;
    const json_t *v = get(obj, "seed");
    if (v) {
        if (!json_is_integer(v))
            return api_fail(ae, 400, NULL, "seed", "'seed' must be an integer, not %s",
                            type_name(v));
        r->has_seed = true;
        r->seed = (uint64_t)json_integer_value(v);
    }
    if (r->top_k.set && r->top_k.v < 0) /* -1 is the common spelling of "off" */
        r->top_k.v = 0;
    return field_processors(obj, r, ae);
}

static int add_stop(struct chat_req *r, const char *key, const json_t *s, struct api_error *ae)
{
    size_t n = json_string_length(s);
    if (n == 0)
        return 0; /* an empty stop string would stop at once; ignore it */
    if (n > SERVE_MAX_STOP_LEN)
        return api_fail(ae, 400, NULL, key, "'%s': a stop string may have at most %d bytes", key,
                        SERVE_MAX_STOP_LEN);
    if (r->n_stops == SERVE_MAX_STOPS)
        return api_fail(ae, 400, NULL, key, "'%s': at most %d stop strings", key,
                        SERVE_MAX_STOPS);
    char *c = malloc(n + 1);
    if (!c)
        return api_fail(ae, 500, "server_error", NULL, "out of memory");
    memcpy(c, json_string_value(s), n + 1);
    r->stops[r->n_stops++] = c;
    return 0;
}

int field_stops(const json_t *obj, const char *key, struct chat_req *r, struct api_error *ae)
{
    const json_t *v = get(obj, key);
    if (!v)
        return 0;
    if (json_is_string(v))
        return add_stop(r, key, v, ae);
    if (!json_is_array(v))
        return api_fail(ae, 400, NULL, key, "'%s' must be a string or an array of strings, not %s",
                        key, type_name(v));
    size_t i;
    const json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s))
            return api_fail(ae, 400, NULL, key, "'%s[%zu]' must be a string, not %s", key, i,
                            type_name(s));
        if (add_stop(r, key, s, ae))
            return -1;
    }
    return 0;
}

bool name_among(const char *s, const char *const *names)
{
    for (; *names; names++)
        if (!strcmp(s, *names))
            return true;
    return false;
}

json_t *chat_tool_call(const char *id, const char *name, json_t *args)
{
    json_t *call = json_object();
    if (call && id)
        json_object_set_new(call, "id", json_string(id));
    if (call)
        json_object_set_new(call, "type", json_string("function"));
    json_t *fn = json_pack("{s:s, s:o}", "name", name, "arguments", args);
    if (!call || !fn) {
        json_decref(call);
        json_decref(fn);
        return NULL;
    }
    json_object_set_new(call, "function", fn);
    return call;
}

int content_text(const json_t *content, const char *param, const char *const *types,
                 struct buf *out, struct api_error *ae)
{
    if (!content || json_is_null(content))
        return 0;
    if (json_is_string(content)) {
        buf_putn(out, json_string_value(content), json_string_length(content));
        return 0;
    }
    if (!json_is_array(content))
        return api_fail(ae, 400, NULL, param, "'%s' must be a string or an array of parts, not %s",
                        param, type_name(content));
    size_t i;
    const json_t *part;
    json_array_foreach(content, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!json_is_object(part) || !type)
            return api_fail(ae, 400, NULL, param, "'%s[%zu]' must be an object with a 'type'",
                            param, i);
        if (!name_among(type, types))
            return api_fail(ae, 400, NULL, param,
                            "'%s[%zu]': content of type '%s' is not supported (this server "
                            "takes text only)", param, i, type);
        const json_t *text = json_object_get(part, "text");
        if (!json_is_string(text))
            return api_fail(ae, 400, NULL, param, "'%s[%zu].text' must be a string", param, i);
        buf_putn(out, json_string_value(text), json_string_length(text));
    }
    return 0;
}

int field_reasoning_effort(const json_t *obj, const char *key, struct chat_req *r,
                           struct api_error *ae)
{
    const char *eff = NULL;
    if (field_string(obj, key, &eff, ae))
        return -1;
    if (eff)
        r->thinking = strcmp(eff, "none") != 0;
    return 0;
}

int field_tool_choice(const json_t *obj, struct chat_req *r, struct api_error *ae)
{
    const json_t *tc = json_object_get(obj, "tool_choice");
    const json_t *par = json_object_get(obj, "parallel_tool_calls");
    r->single_call = json_is_false(par);
    const char *type = json_is_object(tc) ? json_string_value(json_object_get(tc, "type"))
                                          : json_string_value(tc);
    if (!type)
        return 0;
    if (json_is_object(tc) && json_is_true(json_object_get(tc, "disable_parallel_tool_use")))
        r->single_call = true;
    if (!strcmp(type, "none")) {
        r->calls_off = true;
    } else if (!strcmp(type, "required") || !strcmp(type, "any")) {
        r->force = TOOLS_REQUIRED;
    } else if (json_is_object(tc) && !strcmp(type, "allowed_tools")) {
        /* Responses: the mode holds; the subset is left to the model */
        const char *mode = json_string_value(json_object_get(tc, "mode"));
        if (mode && !strcmp(mode, "required"))
            r->force = TOOLS_REQUIRED;
    } else if (json_is_object(tc) && (!strcmp(type, "function") || !strcmp(type, "tool") ||
                                      !strcmp(type, "custom"))) {
        const json_t *fn = json_object_get(tc, "function");
        const char *name = json_string_value(json_object_get(json_is_object(fn) ? fn : tc, "name"));
        if (!name || !*name)
            return api_fail(ae, 400, NULL, "tool_choice",
                            "tool_choice of type \"%s\" needs the tool's name", type);
        if (strlen(name) >= sizeof r->force_name)
            return api_fail(ae, 400, NULL, "tool_choice", "tool_choice: the name is too long");
        r->force = TOOLS_NAMED;
        snprintf(r->force_name, sizeof r->force_name, "%s", name);
    }
    return 0;
}

/* The GBNF of a schema into r->grammar; param names the field. */
static int schema_grammar(const json_t *schema, const char *param, struct chat_req *r,
                          struct api_error *ae)
{
    struct err e = {{0}};
    if (!(r->grammar = json_schema_gbnf(schema, &e)))
        return api_fail(ae, 400, NULL, param, "%s: %s", param, e.msg);
    return 0;
}

/* Any JSON object (json_object formats). */
static int object_grammar(const char *param, struct chat_req *r, struct api_error *ae)
{
    json_t *obj = json_pack("{s:s}", "type", "object");
    int rc = schema_grammar(obj, param, r, ae);
    json_decref(obj);
    return rc;
}

static int format_grammar(const json_t *f, const char *param, struct chat_req *r,
                          struct api_error *ae)
{
    const char *type = NULL;
    if (!json_is_object(f))
        return api_fail(ae, 400, NULL, param, "'%s' must be an object", param);
    if (field_string(f, "type", &type, ae))
        return -1;
    if (!type || !strcmp(type, "text"))
        return 0;
    if (!strcmp(type, "json_object"))
        return object_grammar(param, r, ae);
    if (strcmp(type, "json_schema"))
        return api_fail(ae, 400, NULL, param,
                        "%s.type must be \"text\", \"json_object\" or \"json_schema\", not \"%s\"",
                        param, type);
    const json_t *holder = json_object_get(f, "json_schema");
    if (holder && !json_is_object(holder))
        return api_fail(ae, 400, NULL, param, "'%s.json_schema' must be an object", param);
    const json_t *schema = json_object_get(holder ? holder : f, "schema");
    if (!schema)
        return api_fail(ae, 400, NULL, param, "%s: a json_schema format needs a 'schema'%s",
                        param, holder ? " inside 'json_schema'" : "");
    return schema_grammar(schema, param, r, ae);
}

/* guided_choice: the answer is exactly one of the strings. */
static int choice_grammar(const json_t *v, const char *param, struct chat_req *r,
                          struct api_error *ae)
{
    size_t n = json_array_size(v), i;
    const json_t *c;
    if (!json_is_array(v) || n == 0 || n > 4096)
        return api_fail(ae, 400, NULL, param, "'%s' must be an array of 1 to 4096 strings",
                        param);
    struct buf b = {0};
    buf_puts(&b, "root ::=");
    json_array_foreach(v, i, c) {
        const char *s = json_string_value(c);
        size_t len = s ? strlen(s) : 0;
        char *q = s && len ? malloc(4 * len + 3) : NULL;
        if (!q) {
            buf_free(&b);
            return s && len ? api_fail(ae, 500, "server_error", NULL, "out of memory")
                            : api_fail(ae, 400, NULL, param,
                                       "%s[%zu] must be a non-empty string", param, i);
        }
        buf_puts(&b, i ? " | " : " ");
        buf_putn(&b, q, grammar_literal(s, len, q));
        free(q);
    }
    buf_putn(&b, "", 1);
    if (b.oom) {
        buf_free(&b);
        return api_fail(ae, 500, "server_error", NULL, "out of memory");
    }
    r->grammar = b.p;
    return 0;
}

/* guided_regex: the whole answer matches the expression (grammar/regex.h). */
static int regex_grammar(const json_t *v, const char *param, struct chat_req *r,
                         struct api_error *ae)
{
    if (!json_is_string(v))
        return api_fail(ae, 400, NULL, param, "'%s' must be a regular expression (a string)",
                        param);
    struct err e = {{0}};
    char *expr = regex_gbnf(json_string_value(v), REGEX_TEXT, false, &e);
    if (!expr)
        return api_fail(ae, 400, NULL, param, "%s: %s", param, e.msg);
    size_t n = strlen(expr) + 16;
    if ((r->grammar = malloc(n)))
        snprintf(r->grammar, n, "root ::= %s\n", expr);
    free(expr);
    return r->grammar ? 0 : api_fail(ae, 500, "server_error", NULL, "out of memory");
}

enum constraint { C_FORMAT, C_JSON, C_GRAMMAR, C_CHOICE, C_REGEX, C_JSON_OBJECT, C_NESTED };

/* One constraint of kind k from v into r->grammar (left NULL for a text
 * format); param names the field in errors. */
static int constraint_grammar(enum constraint k, const json_t *v, const char *param,
                              struct chat_req *r, struct api_error *ae);

/* vLLM's structured_outputs: an object with one of json, regex, choice,
 * grammar, json_object. */
static int nested_grammar(const json_t *v, struct chat_req *r, struct api_error *ae)
{
    static const struct { const char *key; enum constraint k; } kinds[] = {
        {"json", C_JSON}, {"regex", C_REGEX}, {"choice", C_CHOICE},
        {"grammar", C_GRAMMAR}, {"json_object", C_JSON_OBJECT}};
    if (!json_is_object(v))
        return api_fail(ae, 400, NULL, "structured_outputs",
                        "'structured_outputs' must be an object");
    int found = -1;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        const json_t *x = json_object_get(v, kinds[i].key);
        if (!x || json_is_null(x) || (kinds[i].k == C_JSON_OBJECT && json_is_false(x)))
            continue;
        if (found >= 0)
            return api_fail(ae, 400, NULL, "structured_outputs",
                            "structured_outputs: '%s' and '%s' both constrain the answer; give "
                            "one", kinds[found].key, kinds[i].key);
        found = (int)i;
    }
    if (found < 0)
        return 0;
    char param[64];
    snprintf(param, sizeof param, "structured_outputs.%s", kinds[found].key);
    return constraint_grammar(kinds[found].k, json_object_get(v, kinds[found].key), param, r, ae);
}

static int constraint_grammar(enum constraint k, const json_t *v, const char *param,
                              struct chat_req *r, struct api_error *ae)
{
    switch (k) {
    case C_FORMAT: return format_grammar(v, param, r, ae);
    case C_CHOICE: return choice_grammar(v, param, r, ae);
    case C_REGEX: return regex_grammar(v, param, r, ae);
    case C_NESTED: return nested_grammar(v, r, ae);
    case C_JSON_OBJECT: return object_grammar(param, r, ae);
    case C_JSON: {
        json_t *parsed = NULL;
        if (json_is_string(v)) { /* vLLM takes the schema as text too */
            json_error_t je;
            if (!(parsed = json_loads(json_string_value(v), 0, &je)))
                return api_fail(ae, 400, NULL, param, "%s: %s", param, je.text);
        }
        int rc = schema_grammar(parsed ? parsed : v, param, r, ae);
        json_decref(parsed);
        return rc;
    }
    default: /* C_GRAMMAR */
        if (!json_is_string(v))
            return api_fail(ae, 400, NULL, param, "'%s' must be GBNF text", param);
        return (r->grammar = strdup(json_string_value(v))) ? 0
               : api_fail(ae, 500, "server_error", NULL, "out of memory");
    }
}

int field_structured(const json_t *obj, const char *format_key, const char *format_param,
                     struct chat_req *r, struct api_error *ae)
{
    static const struct { const char *key; enum constraint k; } fields[] = {
        {NULL, C_FORMAT}, {"guided_json", C_JSON}, {"guided_grammar", C_GRAMMAR},
        {"grammar", C_GRAMMAR}, {"guided_choice", C_CHOICE}, {"guided_regex", C_REGEX},
        {"structured_outputs", C_NESTED}};
    const char *found = NULL;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const char *key = i == 0 ? format_key : fields[i].key;
        const json_t *v = key ? json_object_get(obj, key) : NULL;
        if (!v || json_is_null(v))
            continue;
        if (found)
            return api_fail(ae, 400, NULL, key, "'%s' and '%s' both constrain the answer; "
                            "give one", found, key);
        found = key;
        const char *param = i == 0 ? format_param : key;
        if (constraint_grammar(fields[i].k, v, param, r, ae))
            return -1;
        if (!r->grammar) /* {"type": "text"} (or no type): nothing to hold the answer to */
            continue;
        struct err e = {{0}};
        struct grammar *g = grammar_parse(r->grammar, strlen(r->grammar), &e);
        if (!g)
            return api_fail(ae, 400, NULL, param, "%s: %s", param, e.msg);
        grammar_free(g);
    }
    return 0;
}
