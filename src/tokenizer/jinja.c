/* jinja.c - the interpreter's public entry points (jinja.h): compile a
 * template into a syntax tree, render it with JSON variables under the
 * configured limits, and turn any error jump into a returned message. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja_internal.h"

struct jinja_template *jinja_compile(const char *src, size_t len, struct err *e)
{
    if (!src || !ju_valid(src, len)) {
        err_set(e, "template: not valid UTF-8 text");
        return NULL;
    }
    struct jinja_template *volatile t = calloc(1, sizeof *t);
    struct jfail *f = calloc(1, sizeof *f);
    if (!t || !f) {
        free(t);
        free(f);
        err_set(e, "template: out of memory");
        return NULL;
    }
    jmp_buf jb;
    f->e = e;
    f->jb = &jb;
    t->arena.fail = f;
    if (setjmp(jb)) {
        ja_free_all(&t->arena);
        free(t);
        free(f);
        return NULL;
    }
    struct jtokens toks;
    jlex(&t->arena, f, src, len, &toks);
    t->root = jparse(&t->arena, f, &toks);
    t->arena.fail = NULL; /* read-only from now on: renders share it */
    free(f);
    return t;
}

void jinja_free(struct jinja_template *t)
{
    if (!t)
        return;
    ja_free_all(&t->arena);
    free(t);
}

char *jinja_render(const struct jinja_template *t, const json_t *vars,
                   const struct jinja_render_opts *opts, size_t *len, struct err *e)
{
    struct jinja_render_opts dflt = {0};
    if (!opts)
        opts = &dflt;
    struct jrender *volatile r = calloc(1, sizeof *r);
    if (!r) {
        err_set(e, "template: out of memory");
        return NULL;
    }
    const struct jinja_limits *lim = &opts->limits;
    jmp_buf jb;
    r->fail.e = &r->err;
    r->fail.jb = &jb;
    r->arena.fail = &r->fail;
    r->arena.limit = lim->max_memory ? lim->max_memory : (size_t)512 << 20;
    r->max_steps = lim->max_steps ? lim->max_steps : 20000000;
    r->max_output = lim->max_output ? lim->max_output : (size_t)64 << 20;
    r->max_depth = lim->max_call_depth ? lim->max_call_depth : 100;
    r->tpl = t;
    r->now = opts->now;
    char *volatile result = NULL;
    if (setjmp(jb) == 0) {
        if (vars) {
            if (!json_is_object(vars))
                jfail(&r->fail, 0, "the variables must be a JSON object");
            r->vars = jv_from_json(r, vars).u.d;
        }
        struct jbuf out;
        jb_init(&out, r);
        jrun(r, t->root, &out);
        char *s = malloc(out.n + 1);
        if (!s) {
            err_set(&r->err, "template: out of memory");
        } else {
            if (out.n)
                memcpy(s, out.p, out.n);
            s[out.n] = 0;
            if (len)
                *len = out.n;
            result = s;
        }
    }
    if (!result && e)
        *e = r->err;
    ja_free_all(&r->arena);
    free(r);
    return result;
}
