/* chat_template.c - finds a model's chat templates the way transformers
 * does (chat_template.jinja and additional_chat_templates/ first, then
 * tokenizer_config.json, then chat_template.json; GGUF metadata for .gguf
 * files), compiles them, and renders a conversation with the variables
 * apply_chat_template passes. */
#include "tokenizer/chat_template.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "model/gguf.h"
#include "tokenizer/jinja.h"

struct named_template {
    char *name, *source;
    struct jinja_template *tpl;
};

struct chat_template {
    int n;
    struct named_template *t;
    json_t *special; /* bos_token, eos_token, ... as strings */
};

static const char *const special_names[] = {"bos_token", "eos_token", "unk_token",  "sep_token",
                                            "pad_token", "cls_token", "mask_token", NULL};

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int add_template(struct chat_template *ct, const char *name, const char *src, size_t len,
                        struct err *e)
{
    for (int i = 0; i < ct->n; i++)
        if (!strcmp(ct->t[i].name, name))
            return 0; /* the first source of a name wins */
    struct named_template *t = realloc(ct->t, (size_t)(ct->n + 1) * sizeof *t);
    if (!t)
        return err_set(e, "out of memory");
    ct->t = t;
    struct named_template *nt = &ct->t[ct->n];
    memset(nt, 0, sizeof *nt);
    nt->name = strdup(name);
    nt->source = malloc(len + 1);
    if (!nt->name || !nt->source) {
        free(nt->name);
        free(nt->source);
        return err_set(e, "out of memory");
    }
    memcpy(nt->source, src, len);
    nt->source[len] = 0;
    ct->n++;
    nt->tpl = jinja_compile(src, len, e);
    if (!nt->tpl)
        return err_wrap(e, "chat template '%s'", name);
    return 0;
}

/* "chat_template": a string, or a list of {"name", "template"}. */
static int add_from_json(struct chat_template *ct, const json_t *v, const char *where,
                         struct err *e)
{
    if (json_is_string(v))
        return add_template(ct, "default", json_string_value(v), json_string_length(v), e);
    if (json_is_array(v)) {
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item)
        {
            const json_t *name = json_object_get(item, "name");
            const json_t *src = json_object_get(item, "template");
            if (!json_is_string(name) || !json_is_string(src))
                return err_set(e,
                               "%s: chat_template[%zu] needs a \"name\" and a \"template\" string",
                               where, i);
            if (add_template(ct, json_string_value(name), json_string_value(src),
                             json_string_length(src), e))
                return -1;
        }
        return 0;
    }
    if (!v || json_is_null(v))
        return 0;
    return err_set(e, "%s: chat_template must be a string or a list", where);
}

/* A special token in tokenizer_config.json: a string or an AddedToken. */
static const char *token_text(const json_t *v)
{
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static void take_special(struct chat_template *ct, const json_t *config)
{
    if (!json_is_object(config))
        return;
    for (int i = 0; special_names[i]; i++) {
        const char *s = token_text(json_object_get(config, special_names[i]));
        if (s)
            json_object_set_new(ct->special, special_names[i], json_string(s));
    }
    const json_t *extra = json_object_get(config, "additional_special_tokens");
    if (json_is_array(extra)) {
        json_t *list = json_array();
        size_t i;
        json_t *item;
        json_array_foreach(extra, i, item)
        {
            const char *s = token_text(item);
            if (s)
                json_array_append_new(list, json_string(s));
        }
        json_object_set_new(ct->special, "additional_special_tokens", list);
    }
}

static struct chat_template *ct_new(void)
{
    struct chat_template *ct = calloc(1, sizeof *ct);
    if (ct)
        ct->special = json_object();
    return ct;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* additional_chat_templates/<name>.jinja, in name order */
static int add_extra_dir(struct chat_template *ct, const char *dir, struct err *e)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/additional_chat_templates", dir);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    char **names = NULL;
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!ends_with(de->d_name, ".jinja"))
            continue;
        char **nn = realloc(names, (n + 1) * sizeof *names);
        if (!nn)
            break;
        names = nn;
        names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (rc || !names[i]) {
            free(names[i]);
            continue;
        }
        char file[4096 + 256];
        snprintf(file, sizeof file, "%s/%s", path, names[i]);
        size_t len;
        char *src = read_file(file, &len, NULL);
        names[i][strlen(names[i]) - 6] = 0;
        if (src)
            rc = add_template(ct, names[i], src, len, e);
        free(src);
        free(names[i]);
    }
    free(names);
    return rc;
}

static struct chat_template *load_dir(const char *dir, struct err *e)
{
    struct chat_template *ct = ct_new();
    if (!ct) {
        err_set(e, "out of memory");
        return NULL;
    }
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *config = NULL;
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        config = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
        if (!config) {
            err_set(e, "%s: line %d: %s", path, je.line, je.text);
            chat_template_free(ct);
            return NULL;
        }
        take_special(ct, config);
    }
    /* transformers: a chat_template.jinja file overrides the config */
    size_t len;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    char *src = read_file(path, &len, NULL); /* missing: none */
    int rc = 0;
    if (src) {
        rc = add_template(ct, "default", src, len, e);
        free(src);
        if (!rc)
            rc = add_extra_dir(ct, dir, e);
    }
    if (!rc && ct->n == 0 && config) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        rc = add_from_json(ct, json_object_get(config, "chat_template"), path, e);
    }
    if (!rc && ct->n == 0) {
        snprintf(path, sizeof path, "%s/chat_template.json", dir);
        json_t *cj = NULL;
        if ((f = fopen(path, "rb"))) {
            fclose(f);
            cj = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
            if (!cj)
                rc = err_set(e, "%s: line %d: %s", path, je.line, je.text);
            else
                rc = add_from_json(ct, json_object_get(cj, "chat_template"), path, e);
            json_decref(cj);
        }
    }
    json_decref(config);
    if (!rc && ct->n == 0)
        rc = err_set(e,
                     "%s: no chat template (no chat_template.jinja, no \"chat_template\" in "
                     "tokenizer_config.json or chat_template.json)",
                     dir);
    if (rc) {
        chat_template_free(ct);
        return NULL;
    }
    return ct;
}

static struct chat_template *load_gguf(const char *file, struct err *e)
{
    struct gguf_vocab v;
    if (gguf_read_vocab(file, &v, e))
        return NULL;
    struct chat_template *ct = ct_new();
    if (!ct) {
        gguf_vocab_free(&v);
        err_set(e, "out of memory");
        return NULL;
    }
    int rc;
    if (!v.chat_template) {
        rc = err_set(e, "%s: no tokenizer.chat_template in the GGUF metadata", file);
    } else {
        rc = add_template(ct, "default", v.chat_template, strlen(v.chat_template), e);
        if (rc)
            err_wrap(e, "%s", file);
    }
    const struct {
        const char *name;
        int id;
    } toks[] = {{"bos_token", v.bos_id},
                {"eos_token", v.eos_id},
                {"unk_token", v.unk_id},
                {"sep_token", v.sep_id},
                {"pad_token", v.pad_id}};
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++)
        if (toks[i].id >= 0 && toks[i].id < v.n_tokens)
            json_object_set_new(ct->special, toks[i].name, json_string(v.tokens[toks[i].id]));
    gguf_vocab_free(&v);
    if (rc) {
        chat_template_free(ct);
        return NULL;
    }
    return ct;
}

struct chat_template *chat_template_load(const char *path, struct err *e)
{
    if (is_dir(path))
        return load_dir(path, e);
    if (ends_with(path, ".gguf"))
        return load_gguf(path, e);
    if (ends_with(path, "tokenizer_config.json")) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            strcpy(dir, ".");
        return load_dir(dir, e);
    }
    struct stat st;
    if (stat(path, &st) != 0)
        err_set(e, "%s: no such file or directory", path);
    else
        err_set(e, "%s: not a model directory, tokenizer_config.json or .gguf file", path);
    return NULL;
}

struct chat_template *chat_template_from_source(const char *src, const json_t *config,
                                                struct err *e)
{
    struct chat_template *ct = ct_new();
    if (!ct) {
        err_set(e, "out of memory");
        return NULL;
    }
    take_special(ct, config);
    if (add_template(ct, "default", src, strlen(src), e)) {
        chat_template_free(ct);
        return NULL;
    }
    return ct;
}

void chat_template_free(struct chat_template *ct)
{
    if (!ct)
        return;
    for (int i = 0; i < ct->n; i++) {
        free(ct->t[i].name);
        free(ct->t[i].source);
        jinja_free(ct->t[i].tpl);
    }
    free(ct->t);
    json_decref(ct->special);
    free(ct);
}

int chat_template_count(const struct chat_template *ct) { return ct->n; }

const char *chat_template_name(const struct chat_template *ct, int i)
{
    return i >= 0 && i < ct->n ? ct->t[i].name : NULL;
}

static const struct named_template *find(const struct chat_template *ct, const char *name)
{
    for (int i = 0; i < ct->n; i++)
        if (!strcmp(ct->t[i].name, name))
            return &ct->t[i];
    return NULL;
}

/* transformers' get_chat_template: an explicit name, else tool_use when
 * tools are given, else default; a single template is the default. */
static const struct named_template *pick(const struct chat_template *ct, const char *name,
                                         bool tools, struct err *e)
{
    if (name) {
        const struct named_template *t = find(ct, name);
        if (!t)
            err_set(e, "no chat template named '%s'", name);
        return t;
    }
    if (ct->n == 1)
        return &ct->t[0];
    const struct named_template *t = tools ? find(ct, "tool_use") : NULL;
    if (!t)
        t = find(ct, "default");
    if (!t)
        err_set(e, "this model has several chat templates and none is named 'default'; "
                   "pick one by name");
    return t;
}

const char *chat_template_source(const struct chat_template *ct, const char *name, bool tools)
{
    const struct named_template *t = pick(ct, name, tools, NULL);
    return t ? t->source : NULL;
}

char *chat_template_apply(const struct chat_template *ct, const struct chat_template_input *in,
                          size_t *len, struct err *e)
{
    if (!json_is_array(in->messages)) {
        err_set(e, "messages must be a JSON array");
        return NULL;
    }
    if (in->tools && !json_is_array(in->tools) && !json_is_null(in->tools)) {
        err_set(e, "tools must be a JSON array");
        return NULL;
    }
    if (in->kwargs && !json_is_object(in->kwargs)) {
        err_set(e, "template kwargs must be a JSON object");
        return NULL;
    }
    bool has_tools = in->tools && json_is_array(in->tools);
    const struct named_template *t = pick(ct, in->template_name, has_tools, e);
    if (!t)
        return NULL;
    static const char *const reserved[] = {"messages", "tools", "documents",
                                           "add_generation_prompt", NULL};
    json_t *vars = json_deep_copy(ct->special);
    if (in->kwargs) {
        for (int i = 0; reserved[i]; i++)
            if (json_object_get(in->kwargs, reserved[i])) {
                err_set(e, "template kwargs may not set '%s'", reserved[i]);
                json_decref(vars);
                return NULL;
            }
        json_object_update(vars, (json_t *)in->kwargs);
    }
    json_object_set(vars, "messages", (json_t *)in->messages);
    json_object_set_new(vars, "tools", has_tools ? json_incref((json_t *)in->tools) : json_null());
    json_object_set_new(vars, "documents",
                        in->documents ? json_incref((json_t *)in->documents) : json_null());
    json_object_set_new(vars, "add_generation_prompt", json_boolean(in->add_generation_prompt));
    struct jinja_render_opts opts = {.now = in->now};
    char *out = jinja_render(t->tpl, vars, &opts, len, e);
    json_decref(vars);
    return out;
}
