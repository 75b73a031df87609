/* template.c - `cllm template`: renders a model's chat template for a
 * conversation and prints the prompt exactly (no newline added).
 *
 *   cllm template <model> --messages chat.json [--tools tools.json]
 *                 [--no-generation-prompt] [--thinking on|off]
 *                 [--kwargs '{"k": v}'] [--template-name NAME] [--template FILE]
 *
 * chat.json is a JSON array of messages, or an object with "messages" and
 * optionally "tools", "documents", "add_generation_prompt" and
 * "chat_template_kwargs". "-" reads it from standard input. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "base/file.h"
#include "base/parse.h"
#include "tokenizer/chat_template.h"

struct template_opts {
    const char *path, *messages, *tools, *kwargs, *thinking, *name, *template_file;
    bool no_gen_prompt;
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: cllm template <model> --messages chat.json [options]\n"
        "\n"
        "<model> is a model or tokenizer directory (chat_template.jinja or\n"
        "tokenizer_config.json), a tokenizer_config.json file, or a .gguf file.\n"
        "chat.json holds a JSON array of messages or {\"messages\": [...], \"tools\": [...]};\n"
        "\"-\" reads it from standard input. The prompt is printed exactly, with no\n"
        "newline added.\n"
        "\n"
        "  --messages FILE          the conversation (required)\n"
        "  --tools FILE             a JSON array of tool definitions\n"
        "  --no-generation-prompt   do not open an assistant turn at the end\n"
        "  --thinking on|off        sets enable_thinking (Qwen3-style templates; also true|false, 1|0)\n"
        "  --kwargs JSON            extra template variables, e.g. '{\"enable_thinking\": false}'\n"
        "  --template-name NAME     use a named template (\"tool_use\", ...)\n"
        "  --template FILE          render this Jinja file instead of the model's template\n");
}

static int parse_args(int argc, char **argv, struct template_opts *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char **slot = NULL;
        if (!strcmp(a, "--messages"))
            slot = &o->messages;
        else if (!strcmp(a, "--tools"))
            slot = &o->tools;
        else if (!strcmp(a, "--kwargs"))
            slot = &o->kwargs;
        else if (!strcmp(a, "--thinking"))
            slot = &o->thinking;
        else if (!strcmp(a, "--template-name"))
            slot = &o->name;
        else if (!strcmp(a, "--template"))
            slot = &o->template_file;
        if (slot) {
            if (i + 1 >= argc) {
                fprintf(stderr, "cllm template: %s needs a value\n", a);
                return -1;
            }
            *slot = argv[++i];
            continue;
        }
        if (!strcmp(a, "--no-generation-prompt")) {
            o->no_gen_prompt = true;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "cllm template: unknown option %s (see cllm template --help)\n", a);
            return -1;
        } else if (!o->path) {
            o->path = a;
        } else {
            fprintf(stderr, "cllm template: unexpected argument \"%s\"\n", a);
            return -1;
        }
    }
    if (!o->path && !o->template_file) {
        fprintf(stderr, "cllm template: no model given\n");
        usage(stderr);
        return -1;
    }
    if (!o->messages) {
        fprintf(stderr, "cllm template: --messages is required\n");
        return -1;
    }
    bool on;
    if (o->thinking && !parse_switch(o->thinking, &on)) {
        fprintf(stderr, "cllm template: --thinking takes on or off (or true/false, 1/0; got \"%s\")\n",
                o->thinking);
        return -1;
    }
    return 0;
}

static json_t *load_json(const char *path, const char *what)
{
    json_error_t je;
    json_t *j = !strcmp(path, "-") ? json_loadf(stdin, 0, &je) : json_load_file(path, 0, &je);
    if (!j)
        fprintf(stderr, "cllm template: %s %s: %s (line %d)\n", what, path, je.text, je.line);
    return j;
}

int cmd_template(int argc, char **argv)
{
    struct template_opts o;
    if (parse_args(argc, argv, &o))
        return 2;
    struct err e = {{0}};
    int rc = 1;
    json_t *chat = NULL, *tools = NULL, *kwargs = NULL, *config = NULL;
    struct chat_template *ct = NULL;
    char *out = NULL;

    if (o.template_file) {
        char *src = read_file(o.template_file, NULL, &e);
        if (!src) {
            fprintf(stderr, "cllm template: %s\n", e.msg);
            goto done;
        }
        if (o.path) { /* special tokens still come from the model */
            char cfg[4096];
            snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", o.path);
            json_error_t je;
            config = json_load_file(cfg, JSON_DECODE_INT_AS_REAL, &je);
        }
        ct = chat_template_from_source(src, config, &e);
        free(src);
    } else {
        ct = chat_template_load(o.path, &e);
    }
    if (!ct) {
        fprintf(stderr, "cllm template: %s\n", e.msg);
        goto done;
    }

    chat = load_json(o.messages, "messages");
    if (!chat)
        goto done;
    const json_t *messages = chat, *doc_tools = NULL, *documents = NULL;
    bool gen = !o.no_gen_prompt;
    kwargs = json_object();
    if (json_is_object(chat)) {
        messages = json_object_get(chat, "messages");
        doc_tools = json_object_get(chat, "tools");
        documents = json_object_get(chat, "documents");
        const json_t *agp = json_object_get(chat, "add_generation_prompt");
        if (json_is_boolean(agp) && !o.no_gen_prompt)
            gen = json_is_true(agp);
        const json_t *ctk = json_object_get(chat, "chat_template_kwargs");
        if (json_is_object(ctk))
            json_object_update(kwargs, (json_t *)ctk);
    }
    if (!json_is_array(messages)) {
        fprintf(stderr,
                "cllm template: %s: expected a JSON array of messages or an object with "
                "\"messages\"\n",
                o.messages);
        goto done;
    }
    if (o.tools) {
        tools = load_json(o.tools, "tools");
        if (!tools)
            goto done;
        if (!json_is_array(tools)) {
            fprintf(stderr, "cllm template: %s: tools must be a JSON array\n", o.tools);
            goto done;
        }
    }
    if (o.kwargs) {
        json_error_t je;
        json_t *k = json_loads(o.kwargs, 0, &je);
        if (!json_is_object(k)) {
            fprintf(stderr, "cllm template: --kwargs needs a JSON object (%s)\n",
                    k ? "got another JSON value" : je.text);
            json_decref(k);
            goto done;
        }
        json_object_update(kwargs, k);
        json_decref(k);
    }
    bool thinking;
    if (o.thinking && parse_switch(o.thinking, &thinking))
        json_object_set_new(kwargs, "enable_thinking", json_boolean(thinking));

    struct chat_template_input in = {
        .messages = messages,
        .tools = tools ? tools : (json_is_array(doc_tools) ? doc_tools : NULL),
        .documents = json_is_array(documents) ? documents : NULL,
        .add_generation_prompt = gen,
        .kwargs = kwargs,
        .template_name = o.name,
    };
    size_t len;
    out = chat_template_apply(ct, &in, &len, &e);
    if (!out) {
        fprintf(stderr, "cllm template: %s\n", e.msg);
        goto done;
    }
    if (fwrite(out, 1, len, stdout) != len || fflush(stdout)) {
        fprintf(stderr, "cllm template: cannot write the output\n");
        goto done;
    }
    rc = 0;
done:
    free(out);
    chat_template_free(ct);
    json_decref(chat);
    json_decref(tools);
    json_decref(kwargs);
    json_decref(config);
    return rc;
}
