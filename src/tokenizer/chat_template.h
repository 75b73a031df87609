/* chat_template.h - a model's chat template(s): found beside its tokenizer
 * (chat_template.jinja, tokenizer_config.json "chat_template",
 * chat_template.json) or in GGUF metadata, and rendered for a conversation
 * exactly as transformers' apply_chat_template renders it. */
#ifndef CLLM_TOKENIZER_CHAT_TEMPLATE_H
#define CLLM_TOKENIZER_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include <jansson.h>

#include "base/err.h"

struct chat_template;

/* Loads and compiles the templates of a model: `path` is a model or
 * tokenizer directory, a tokenizer_config.json file, or a .gguf file.
 * Fails (with a message) when there is no template or it does not parse. */
struct chat_template *chat_template_load(const char *path, struct err *e);
/* One template from source text (named "default"), with the special-token
 * strings of a tokenizer_config.json-like object (may be NULL). */
struct chat_template *chat_template_from_source(const char *src, const json_t *config,
                                                struct err *e);
void chat_template_free(struct chat_template *ct);

/* Named templates ("default", "tool_use", ...) in file order. */
int chat_template_count(const struct chat_template *ct);
const char *chat_template_name(const struct chat_template *ct, int i);
/* The source of a template: the one named, or (name NULL) the one
 * chat_template_apply renders with when it is given tools or not. */
const char *chat_template_source(const struct chat_template *ct, const char *name, bool tools);

struct chat_template_input {
    const json_t *messages;  /* JSON array of messages (required) */
    const json_t *tools;     /* JSON array or NULL (the template sees None) */
    const json_t *documents; /* JSON array or NULL */
    bool add_generation_prompt;
    const json_t *kwargs;      /* JSON object of extra variables (enable_thinking, ...) or NULL */
    const char *template_name; /* NULL: "tool_use" when tools are given and it exists, else
                                  "default" (or the only template) */
    time_t now;                /* what strftime_now() sees; 0: the current time */
};

/* Renders the prompt text (NUL-terminated, caller frees; *len its length).
 * Variables are the tokenizer's special-token strings (bos_token,
 * eos_token, ...), then kwargs, then messages, tools, documents and
 * add_generation_prompt. A template's raise_exception(msg) comes back as
 * an error whose message ends in msg. */
char *chat_template_apply(const struct chat_template *ct, const struct chat_template_input *in,
                          size_t *len, struct err *e);

#endif
