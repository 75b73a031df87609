/* jinja.h - a Jinja template interpreter for chat templates: compiles a
 * template once, renders it any number of times (from any thread) with
 * variables given as a JSON object, byte-identical to Jinja2 3.1 configured
 * the way Hugging Face transformers configures it (ImmutableSandboxedEnvironment,
 * trim_blocks, lstrip_blocks, loopcontrols, tojson = json.dumps,
 * raise_exception, strftime_now). docs/chat-templates.md lists the subset. */
#ifndef CLLM_TOKENIZER_JINJA_H
#define CLLM_TOKENIZER_JINJA_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <jansson.h>

#include "base/err.h"

struct jinja_template;

/* Bounds that keep a hostile template from hanging or exhausting memory.
 * A zero field means "use the default" (in brackets). */
struct jinja_limits {
    uint64_t max_steps; /* statements + expressions evaluated [20,000,000] */
    size_t max_memory;  /* bytes allocated while rendering [512 MiB] */
    size_t max_output;  /* bytes of rendered text [64 MiB] */
    int max_call_depth; /* nested macro / caller / recursive-loop calls [100] */
};

struct jinja_render_opts {
    struct jinja_limits limits;
    time_t now; /* the time strftime_now() formats (local time); 0: the current time */
};

/* Parses a template (UTF-8). Syntax errors come back as
 * "template line N: reason". The source is copied. */
struct jinja_template *jinja_compile(const char *src, size_t len, struct err *e);
void jinja_free(struct jinja_template *t);

/* Renders with the members of `vars` (a JSON object, may be NULL) as the
 * template's variables: null -> None, true/false, integers, reals, strings,
 * arrays -> lists, objects -> dicts (key order kept). opts may be NULL.
 * Returns the text (NUL-terminated, caller frees, *len its length) or NULL
 * with "template line N: reason" in e; raise_exception(msg) gives
 * "template line N: msg". */
char *jinja_render(const struct jinja_template *t, const json_t *vars,
                   const struct jinja_render_opts *opts, size_t *len, struct err *e);

#endif
