/* turn.c - the assistant turn's text split into reasoning, content and tool
 * calls as it streams in (turn.h): a small state machine over a buffer of
 * the text not yet emitted, holding back only what may still be a marker. */
#include "serve/turn.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

enum { ST_START, ST_THINK, ST_TEXT, ST_CALL, ST_JSON };

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";
static const char CALL_OPEN[] = "<tool_call>", CALL_CLOSE[] = "</tool_call>";

struct turn_syntax turn_syntax_of(const char *template_src, const char *prompt, size_t prompt_len,
                                  bool has_tools)
{
    struct turn_syntax s = {.tools = TURN_TOOLS_NONE};
    if (!template_src)
        return s;
    if (has_tools) {
        if (strstr(template_src, CALL_OPEN)) {
            s.tools = TURN_TOOLS_HERMES;
            s.xml_calls = strstr(template_src, "<function=") != NULL;
        }
        else if (strstr(template_src, "<|start_header_id|>") && strstr(template_src, "tools"))
            s.tools = TURN_TOOLS_JSON; /* Llama 3.x: tools rendered, calls written as JSON */
    }
    s.think = strstr(template_src, THINK_CLOSE) != NULL;
    if (s.think && prompt) { /* a generation prompt that opens the reasoning itself */
        size_t n = prompt_len;
        while (n && (prompt[n - 1] == '\n' || prompt[n - 1] == ' '))
            n--;
        size_t k = sizeof THINK_OPEN - 1, kc = sizeof THINK_CLOSE - 1;
        s.think_open = n >= k && !memcmp(prompt + n - k, THINK_OPEN, k);
        s.think_done = n >= kc && !memcmp(prompt + n - kc, THINK_CLOSE, kc);
    }
    return s;
}

void turn_init(struct turn *t, struct turn_syntax syn, turn_emit_fn emit, void *ctx)
{
    memset(t, 0, sizeof *t);
    t->syn = syn;
    t->state = syn.think && syn.think_open ? ST_THINK : ST_START;
    t->emit = emit;
    t->ctx = ctx;
}

void turn_free(struct turn *t)
{
    free(t->buf);
    t->buf = NULL;
    t->n = t->cap = 0;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

static void consume(struct turn *t, size_t k)
{
    memmove(t->buf, t->buf + k, t->n - k);
    t->n -= k;
}

static void emit_text(struct turn *t, enum turn_kind kind, const char *p, size_t n)
{
    if (!n)
        return;
    if (kind == TURN_REASONING)
        t->reasoned = true;
    struct turn_event ev = {.kind = kind, .text = p, .n = n};
    t->emit(t->ctx, &ev);
}

/* Where marker starts in buf[0..n), or -1. */
static long find(const char *buf, size_t n, const char *marker)
{
    const char *hit = memmem(buf, n, marker, strlen(marker));
    return hit ? (long)(hit - buf) : -1;
}

size_t turn_held_tail(const char *p, size_t n, const char *marker, size_t m)
{
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (!memcmp(p + n - k, marker, k))
            return k;
    return 0;
}

static size_t partial_tail(const char *buf, size_t n, const char *marker)
{
    return turn_held_tail(buf, n, marker, strlen(marker));
}

/* The text of a call's arguments: an object, or a string holding one;
 * absent or null is {}. NULL when they are anything else. Written with
 * ", " and ": " (jansson without JSON_COMPACT), as Python's json.dumps and
 * so the chat templates' tojson write it: the history a client sends back
 * renders to the tokens the model wrote, and the prefix cache keeps them. */
static char *args_text(const json_t *a)
{
    if (!a || json_is_null(a))
        return strdup("{}");
    if (json_is_object(a))
        return json_dumps(a, 0);
    if (!json_is_string(a))
        return NULL;
    json_t *o = json_loads(json_string_value(a), 0, NULL);
    char *s = json_is_object(o) ? json_dumps(o, 0) : NULL;
    json_decref(o);
    return s;
}

/* A function name: non-empty, no spaces or control bytes (NUL included). */
static bool name_ok(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= ' ')
            return false;
    return n > 0;
}

/* The arguments text of the call an object describes (caller frees), and
 * its name; NULL when it is not one: a string "name" (name_ok) and object
 * arguments under "arguments" or "parameters". */
static char *call_of(const json_t *o, const char **name)
{
    const json_t *nm = json_object_get(o, "name");
    *name = json_string_value(nm);
    if (!json_is_object(o) || !*name || !name_ok(*name, json_string_length(nm)))
        return NULL;
    const json_t *a = json_object_get(o, "arguments");
    return args_text(a ? a : json_object_get(o, "parameters"));
}

/* Emits the call an object describes; false (nothing emitted) when it is
 * not one (call_of). */
static bool emit_call(struct turn *t, const json_t *o)
{
    const char *name;
    char *args = call_of(o, &name);
    if (!args)
        return false;
    struct turn_event ev = {.kind = TURN_TOOL_CALL, .name = name, .args = args};
    t->emit(t->ctx, &ev);
    t->n_calls++;
    free(args);
    return true;
}

/* Whether p[0..n) starts with s, and past it. */
static bool eat(const char **p, const char *end, const char *s)
{
    size_t k = strlen(s);
    if ((size_t)(end - *p) < k || memcmp(*p, s, k))
        return false;
    *p += k;
    return true;
}

static void skip_space(const char **p, const char *end)
{
    while (*p < end && is_space(**p))
        (*p)++;
}

/* Whether the schema of parameter key of tool name types it as a string
 * (alone or among other types); false when it says nothing. */
static bool param_is_string(const json_t *tools, const char *name, const char *key)
{
    size_t i;
    const json_t *tl;
    json_array_foreach(tools, i, tl) {
        const json_t *fn = json_object_get(tl, "function");
        const char *tn = json_string_value(json_object_get(fn, "name"));
        if (!tn || strcmp(tn, name))
            continue;
        const json_t *ty = json_object_get(
            json_object_get(json_object_get(json_object_get(fn, "parameters"), "properties"), key),
            "type");
        if (json_is_string(ty))
            return !strcmp(json_string_value(ty), "string");
        size_t j;
        const json_t *v;
        json_array_foreach(ty, j, v) {
            if (json_is_string(v) && !strcmp(json_string_value(v), "string"))
                return true;
        }
        return false;
    }
    return false;
}

/* A parameter value as written (XML form): the schema's string as it is,
 * anything else as JSON when it parses (3, true, {"a": 1}), else text. */
static json_t *param_value(const json_t *tools, const char *name, const char *key,
                           const char *v, size_t n)
{
    if (!param_is_string(tools, name, key)) {
        json_t *j = json_loadb(v, n, JSON_DECODE_ANY, NULL);
        if (j)
            return j;
    }
    return json_stringn(v, n);
}

/* <function=NAME> (<parameter=KEY>VALUE</parameter>)* </function>, the
 * newline after an opening tag and before a closing one not part of the
 * value; the closing </function> may be missing at the end. */
static bool parse_xml_call(struct turn *t, const char *p, size_t n)
{
    const char *end = p + n, *q;
    skip_space(&p, end);
    if (!eat(&p, end, "<function=") || !(q = memchr(p, '>', (size_t)(end - p))) ||
        !name_ok(p, (size_t)(q - p)))
        return false;
    char *name = strndup(p, (size_t)(q - p));
    json_t *args = json_object();
    bool ok = name && args;
    p = q + 1;
    while (ok) {
        skip_space(&p, end);
        if (p == end || eat(&p, end, "</function>"))
            break;
        const char *kq;
        long ve;
        if (!eat(&p, end, "<parameter=") || !(kq = memchr(p, '>', (size_t)(end - p))) ||
            !name_ok(p, (size_t)(kq - p)) ||
            (ve = find(kq + 1, (size_t)(end - kq - 1), "</parameter>")) < 0) {
            ok = false;
            break;
        }
        const char *v = kq + 1, *vend = v + ve;
        if (v < vend && *v == '\n')
            v++;
        if (vend > v && vend[-1] == '\n')
            vend--;
        /* A NUL byte: JSON as jansson reads it by default cannot hold one
         * (the JSON form refuses "\u0000", and the Anthropic answer and
         * Codex's custom-tool and shell items re-read the arguments), so
         * this is not a call; it comes back as text. */
        if (memchr(v, 0, (size_t)(vend - v))) {
            ok = false;
            break;
        }
        char *key = strndup(p, (size_t)(kq - p));
        json_t *val = key ? param_value(t->syn.schema, name, key, v, (size_t)(vend - v)) : NULL;
        ok = key && val && !json_object_set_new(args, key, val);
        free(key);
        p = kq + 1 + ve + sizeof "</parameter>" - 1;
    }
    skip_space(&p, end);
    ok = ok && p == end;
    char *text = ok ? json_dumps(args, 0) : NULL;
    if (text) {
        struct turn_event ev = {.kind = TURN_TOOL_CALL, .name = name, .args = text};
        t->emit(t->ctx, &ev);
        t->n_calls++;
    }
    free(text);
    free(name);
    json_decref(args);
    return text != NULL;
}

/* One call's body (HERMES): JSON, or the XML form; surrounding whitespace
 * allowed. */
static bool parse_call(struct turn *t, const char *p, size_t n)
{
    json_t *o = json_loadb(p, n, 0, NULL);
    bool ok = o && emit_call(t, o);
    json_decref(o);
    return ok || (!o && parse_xml_call(t, p, n));
}

/* The whole turn as calls (JSON): one object, an array of them, or objects
 * separated by ';'. All or nothing: each is checked before any is emitted. */
static bool parse_json_calls(struct turn *t, const char *p, size_t n)
{
    json_t *calls = json_array();
    size_t i = 0;
    bool ok = calls != NULL;
    while (ok) {
        while (i < n && is_space(p[i]))
            i++;
        if (i == n)
            break;
        json_error_t je;
        json_t *v = json_loadb(p + i, n - i, JSON_DISABLE_EOF_CHECK, &je);
        if (!v) {
            ok = false;
            break;
        }
        i += (size_t)je.position;
        if (json_is_array(v))
            json_array_extend(calls, v);
        else
            json_array_append(calls, v);
        json_decref(v);
        while (i < n && is_space(p[i]))
            i++;
        if (i < n && p[i] == ';')
            i++;
    }
    size_t k;
    json_t *c;
    ok = ok && json_array_size(calls) > 0;
    json_array_foreach(calls, k, c) {
        const char *name;
        char *args = ok ? call_of(c, &name) : NULL;
        ok = args != NULL;
        free(args);
    }
    if (ok)
        json_array_foreach(calls, k, c) emit_call(t, c);
    json_decref(calls);
    return ok;
}

/* One move of the machine on the buffered text; false when it must wait
 * for more. */
static bool step(struct turn *t)
{
    char *b = t->buf;
    size_t n = t->n;
    switch (t->state) {
    case ST_START: { /* the turn's (or the answer after reasoning's) first text */
        size_t k = 0;
        while (k < n && is_space(b[k]))
            k++;
        if (k == n)
            return false;
        const size_t to = sizeof THINK_OPEN - 1;
        if (t->syn.think && !t->after_think) {
            if (n - k >= to && !memcmp(b + k, THINK_OPEN, to)) {
                consume(t, k + to);
                t->state = ST_THINK;
                return true;
            }
            if (n - k < to && !memcmp(b + k, THINK_OPEN, n - k))
                return false; /* may still be <think> */
        }
        if (t->syn.tools == TURN_TOOLS_JSON && b[k] == '{') {
            t->state = ST_JSON;
            return true;
        }
        if (t->after_think)
            consume(t, k); /* the blank lines between reasoning and answer */
        t->state = ST_TEXT;
        return true;
    }
    case ST_THINK: {
        if (!t->reasoned) { /* <think>\n: the newline is the marker's */
            size_t k = 0;
            while (k < n && b[k] == '\n')
                k++;
            consume(t, k);
            n = t->n;
        }
        long i = find(b, n, THINK_CLOSE);
        size_t e = i >= 0 ? (size_t)i : n - partial_tail(b, n, THINK_CLOSE);
        size_t r = e;
        while (r && b[r - 1] == '\n') /* \n</think>: held until it is known */
            r--;
        emit_text(t, TURN_REASONING, b, r);
        if (i < 0) {
            consume(t, r);
            return false;
        }
        consume(t, e + sizeof THINK_CLOSE - 1);
        t->after_think = true;
        t->state = ST_START;
        return true;
    }
    case ST_TEXT: {
        if (t->syn.tools != TURN_TOOLS_HERMES) {
            emit_text(t, TURN_CONTENT, b, n);
            consume(t, n);
            return false;
        }
        long i = find(b, n, CALL_OPEN);
        size_t e = i >= 0 ? (size_t)i : n - partial_tail(b, n, CALL_OPEN);
        size_t r = e;
        while (r && is_space(b[r - 1])) /* the whitespace before a call is not content */
            r--;
        emit_text(t, TURN_CONTENT, b, r);
        consume(t, r);
        if (i < 0)
            return false;
        /* the whitespace and the marker stay: content again if the call
         * does not parse */
        t->call_body = t->call_scan = e - r + sizeof CALL_OPEN - 1;
        t->state = ST_CALL;
        return true;
    }
    case ST_CALL: { /* searched from where the last search could not match */
        const size_t at = t->call_body, from = t->call_scan;
        long i = find(b + from, n - from, CALL_CLOSE);
        if (i < 0) {
            t->call_scan = n - partial_tail(b + from, n - from, CALL_CLOSE);
            return false;
        }
        i += (long)(from - at);
        const size_t end = at + (size_t)i + sizeof CALL_CLOSE - 1;
        if (!parse_call(t, b + at, (size_t)i))
            emit_text(t, TURN_CONTENT, b, end); /* as written */
        consume(t, end);
        t->state = ST_TEXT;
        return true;
    }
    default: /* ST_JSON: the whole turn, parsed at its end */
        return false;
    }
}

int turn_feed(struct turn *t, const char *text, size_t n)
{
    if (t->oom)
        return -1;
    if (!n) /* nothing new; before the first piece the buffer is NULL */
        return 0;
    if (t->n + n > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->n + n)
            cap *= 2;
        char *p = realloc(t->buf, cap);
        if (!p) {
            t->oom = true;
            return -1;
        }
        t->buf = p;
        t->cap = cap;
    }
    memcpy(t->buf + t->n, text, n);
    t->n += n;
    while (step(t))
        ;
    return t->oom ? -1 : 0;
}

static bool all_space(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!is_space(p[i]))
            return false;
    return true;
}

int turn_finish(struct turn *t)
{
    if (t->oom)
        return -1;
    char *b = t->buf;
    size_t n = t->n;
    switch (t->state) {
    case ST_THINK: { /* cut off while reasoning */
        while (n && b[n - 1] == '\n')
            n--;
        emit_text(t, TURN_REASONING, b, n);
        break;
    }
    case ST_CALL: /* the model ended the call without its closing tag */
        if (!parse_call(t, b + t->call_body, n - t->call_body))
            emit_text(t, TURN_CONTENT, b, n);
        break;
    case ST_JSON:
        if (!parse_json_calls(t, b, n))
            emit_text(t, TURN_CONTENT, b, n);
        break;
    default: /* START, TEXT: what was held, unless it is blank after reasoning or calls */
        if (!(all_space(b, n) && (t->after_think || t->n_calls)))
            emit_text(t, TURN_CONTENT, b, n);
        break;
    }
    t->n = 0;
    return t->oom ? -1 : 0;
}
