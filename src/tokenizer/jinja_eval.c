/* jinja_eval.c - runs a parsed template: scopes as Jinja2 compiles them (for
 * bodies, macros, call/filter/set blocks and with get their own; if does
 * not), statements, expressions with Python's operator semantics, Jinja2's
 * sandboxed attribute/item lookup and Undefined, macro and caller calls,
 * loops with the `loop` object, and the step / depth limits. */
#include <math.h>
#include <string.h>

#include "tokenizer/jinja_internal.h"

#define MAX_EVAL_DEPTH 1500 /* nested jeval() calls: keeps the C stack bounded */

enum { X_NORMAL, X_BREAK, X_CONTINUE };

static int exec_body(struct jrender *r, const struct jnodes *body, struct jscope *sc,
                     struct jbuf *out);

void jstep(struct jrender *r, int line)
{
    r->fail.line = line;
    if (++r->steps > r->max_steps)
        jfail(&r->fail, line, "rendering took more than %llu steps (endless loop?)",
              (unsigned long long)r->max_steps);
}

/* ---- scopes ---- */

static struct jscope *scope_new(struct jrender *r, struct jscope *parent)
{
    struct jscope *s = ja_alloc(&r->arena, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(struct jrender *r, struct jscope *sc, struct jstr *name, jv v)
{
    for (int i = 0; i < sc->n; i++)
        if (sc->names[i]->len == name->len && !memcmp(sc->names[i]->s, name->s, name->len)) {
            sc->vals[i] = v;
            return;
        }
    if (sc->n == sc->cap) {
        int cap = sc->cap ? sc->cap * 2 : 8;
        sc->names = ja_grow(&r->arena, sc->names, (size_t)sc->cap * sizeof *sc->names,
                            (size_t)cap * sizeof *sc->names);
        sc->vals = ja_grow(&r->arena, sc->vals, (size_t)sc->cap * sizeof *sc->vals,
                           (size_t)cap * sizeof *sc->vals);
        sc->cap = cap;
    }
    sc->names[sc->n] = name;
    sc->vals[sc->n] = v;
    sc->n++;
}

static bool scope_find(const struct jscope *sc, const char *name, size_t len, jv *out)
{
    for (; sc; sc = sc->parent)
        for (int i = sc->n - 1; i >= 0; i--)
            if (sc->names[i]->len == len && !memcmp(sc->names[i]->s, name, len)) {
                *out = sc->vals[i];
                return true;
            }
    return false;
}

static jv lookup(struct jrender *r, struct jscope *sc, struct jstr *name)
{
    jv v;
    if (scope_find(sc, name->s, name->len, &v))
        return v;
    if (r->vars && jd_get_str(r->vars, name->s, name->len, &v))
        return v;
    const struct jbuiltin *g = jglobal_find(name->s);
    if (g) {
        struct jfunc *fn = ja_alloc(&r->arena, sizeof *fn);
        fn->kind = JF_BUILTIN;
        fn->bi = g;
        jv out = {.k = JV_FUNC, .u.fn = fn};
        return out;
    }
    return jv_undef_name(r, name);
}

/* ---- argument binding ---- */

void jbind(struct jrender *r, int line, const char *fname, const char *const *params, int np,
           const struct jargs *a, jv *out, struct jargs *rest)
{
    for (int i = 0; i < np; i++)
        out[i] = jv_missing();
    if (rest)
        memset(rest, 0, sizeof *rest);
    if (a->npos > np && !rest)
        jfail(&r->fail, line, "%s() takes at most %d argument%s (%d given)", fname, np,
              np == 1 ? "" : "s", a->npos);
    for (int i = 0; i < a->npos; i++) {
        if (i < np) {
            out[i] = a->pos[i];
        } else {
            if (!rest->pos)
                rest->pos = ja_alloc(&r->arena, (size_t)a->npos * sizeof(jv));
            rest->pos[rest->npos++] = a->pos[i];
        }
    }
    for (int k = 0; k < a->nkw; k++) {
        int idx = -1;
        for (int i = 0; i < np; i++)
            if (js_eq(a->kwn[k], params[i]))
                idx = i;
        if (idx >= 0) {
            if (out[idx].k != JV_MISSING)
                jfail(&r->fail, line, "%s() got multiple values for argument '%s'", fname,
                      params[idx]);
            out[idx] = a->kwv[k];
        } else if (rest) {
            if (!rest->kwn) {
                rest->kwn = ja_alloc(&r->arena, (size_t)a->nkw * sizeof *rest->kwn);
                rest->kwv = ja_alloc(&r->arena, (size_t)a->nkw * sizeof(jv));
            }
            rest->kwn[rest->nkw] = a->kwn[k];
            rest->kwv[rest->nkw++] = a->kwv[k];
        } else {
            jfail(&r->fail, line, "%s() got an unexpected keyword argument '%s'", fname,
                  a->kwn[k]->s);
        }
    }
}

static void eval_args(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jargs *a,
                      int extra_kw)
{
    memset(a, 0, sizeof *a);
    jv *dyn = NULL;
    size_t ndyn = 0;
    const struct jdict *dkw = NULL;
    if (n->c) {
        jv v = jeval(r, n->c, sc);
        jv_iterate(r, n->line, v, &dyn, &ndyn);
    }
    if (n->d) {
        jv v = jeval(r, n->d, sc);
        if (v.k != JV_DICT)
            jfail(&r->fail, n->line, "argument after ** must be a mapping, not %s",
                  jv_type_name(v));
        dkw = v.u.d;
    }
    size_t npos = (size_t)n->items.n + ndyn;
    size_t nkw = (size_t)n->kw.n + (dkw ? dkw->n : 0) + (size_t)extra_kw;
    a->pos = ja_alloc(&r->arena, (npos ? npos : 1) * sizeof(jv));
    a->kwn = ja_alloc(&r->arena, (nkw ? nkw : 1) * sizeof *a->kwn);
    a->kwv = ja_alloc(&r->arena, (nkw ? nkw : 1) * sizeof(jv));
    for (int i = 0; i < n->items.n; i++)
        a->pos[a->npos++] = jeval(r, n->items.v[i], sc);
    for (size_t i = 0; i < ndyn; i++)
        a->pos[a->npos++] = dyn[i];
    for (int i = 0; i < n->kw.n; i++) {
        a->kwn[a->nkw] = n->kw.v[i]->name;
        a->kwv[a->nkw++] = jeval(r, n->kw.v[i]->a, sc);
    }
    if (dkw)
        for (size_t i = 0; i < dkw->n; i++) {
            if (dkw->k[i].k != JV_STR)
                jfail(&r->fail, n->line, "keywords must be strings");
            a->kwn[a->nkw] = dkw->k[i].u.s;
            a->kwv[a->nkw++] = dkw->v[i];
        }
}

/* ---- attribute and item lookup (Jinja2 sandbox rules) ---- */

static jv bound_method(struct jrender *r, jv self, const struct jbuiltin *bi)
{
    struct jfunc *fn = ja_alloc(&r->arena, sizeof *fn);
    fn->kind = JF_METHOD;
    fn->bi = bi;
    fn->self = self;
    jv v = {.k = JV_FUNC, .u.fn = fn};
    return v;
}

static jv method_attr(struct jrender *r, jv obj, struct jstr *name, bool *found)
{
    bool unsafe = false;
    const struct jbuiltin *bi = jmethod_find(obj, name->s, &unsafe);
    *found = bi || unsafe;
    if (unsafe) {
        struct jbuf b;
        jb_init(&b, r);
        jb_printf(&b, "access to attribute '%s' of '%s' object is unsafe.", name->s,
                  jv_type_name(obj));
        jb_addc(&b, 0);
        struct jundef *u = ja_alloc(&r->arena, sizeof *u);
        u->hint = b.p;
        u->security = true;
        u->name = jv_s(name);
        jv v = {.k = JV_UNDEF, .u.u = u};
        return v;
    }
    if (bi)
        return bound_method(r, obj, bi);
    return jv_undef();
}

static jv loop_cycle(struct jrender *r, int line, jv self, const struct jargs *a)
{
    if (a->nkw)
        jfail(&r->fail, line, "cycle() takes no keyword arguments");
    if (a->npos == 0)
        jfail(&r->fail, line, "no items for cycling given");
    return a->pos[self.u.loop->i % (size_t)a->npos];
}

static jv loop_changed(struct jrender *r, int line, jv self, const struct jargs *a)
{
    (void)line;
    struct jloop *l = self.u.loop;
    struct jlist *t = jl_new(r, JL_TUPLE, (size_t)a->npos);
    for (int i = 0; i < a->npos; i++)
        t->v[t->n++] = a->pos[i];
    jv now = jv_l(t);
    if (l->changed_set && jv_eq(r, l->changed_last, now))
        return jv_bool(false);
    l->changed_last = now;
    l->changed_set = true;
    return jv_bool(true);
}

static const struct jbuiltin loop_cycle_bi = {"cycle", loop_cycle};
static const struct jbuiltin loop_changed_bi = {"changed", loop_changed};

static jv loop_attr(struct jrender *r, jv obj, struct jstr *name)
{
    struct jloop *l = obj.u.loop;
    int64_t i = (int64_t)l->i, n = (int64_t)l->n;
    if (js_eq(name, "index"))
        return jv_int(i + 1);
    if (js_eq(name, "index0"))
        return jv_int(i);
    if (js_eq(name, "revindex"))
        return jv_int(n - i);
    if (js_eq(name, "revindex0"))
        return jv_int(n - i - 1);
    if (js_eq(name, "first"))
        return jv_bool(i == 0);
    if (js_eq(name, "last"))
        return jv_bool(i == n - 1);
    if (js_eq(name, "length"))
        return jv_int(n);
    if (js_eq(name, "depth"))
        return jv_int(l->depth0 + 1);
    if (js_eq(name, "depth0"))
        return jv_int(l->depth0);
    if (js_eq(name, "previtem"))
        return i > 0 ? l->items[i - 1] : jv_undef_hint(r, "there is no previous item");
    if (js_eq(name, "nextitem"))
        return i + 1 < n ? l->items[i + 1] : jv_undef_hint(r, "there is no next item");
    if (js_eq(name, "cycle"))
        return bound_method(r, obj, &loop_cycle_bi);
    if (js_eq(name, "changed"))
        return bound_method(r, obj, &loop_changed_bi);
    return jv_undef_attr(r, obj, jv_s(name));
}

jv jgetattr(struct jrender *r, int line, jv obj, struct jstr *name)
{
    bool found;
    jv v;
    switch (obj.k) {
    case JV_UNDEF: jv_undef_fail(r, line, obj);
    case JV_DICT:
        v = method_attr(r, obj, name, &found);
        if (found)
            return v;
        if (jd_get_str(obj.u.d, name->s, name->len, &v))
            return v;
        break;
    case JV_NS:
        if (jd_get_str(obj.u.d, name->s, name->len, &v))
            return v;
        break;
    case JV_STR:
    case JV_LIST:
        v = method_attr(r, obj, name, &found);
        if (found)
            return v;
        break;
    case JV_LOOP: return loop_attr(r, obj, name);
    default: break;
    }
    return jv_undef_attr(r, obj, jv_s(name));
}

static bool index_of(struct jrender *r, jv key, int64_t len, int64_t *idx)
{
    (void)r;
    int64_t i;
    if (key.k == JV_INT)
        i = key.u.i;
    else if (key.k == JV_BOOL)
        i = key.u.b;
    else
        return false;
    if (i < 0)
        i += len;
    if (i < 0 || i >= len)
        return false;
    *idx = i;
    return true;
}

jv jgetitem(struct jrender *r, int line, jv obj, jv key)
{
    jv v;
    int64_t i;
    switch (obj.k) {
    case JV_UNDEF: jv_undef_fail(r, line, obj);
    case JV_DICT:
        if (jv_hashable(key) && jd_get(r, obj.u.d, key, &v))
            return v;
        break;
    case JV_LIST: {
        struct jlist *l = obj.u.l;
        if ((l->kind == JL_LIST || l->kind == JL_TUPLE || l->kind == JL_RANGE) &&
            index_of(r, key, (int64_t)l->n, &i))
            return l->v[i];
        break;
    }
    case JV_STR:
        if (index_of(r, key, js_ncp(obj.u.s), &i)) {
            size_t off = js_offset(obj.u.s, i);
            uint32_t c;
            int n = ju_decode(obj.u.s->s + off, obj.u.s->s + obj.u.s->len, &c);
            return jv_str(r, obj.u.s->s + off, (size_t)n);
        }
        break;
    default: break;
    }
    if (key.k == JV_STR) {
        /* obj[name] falls back to obj.name */
        if (obj.k == JV_NS || obj.k == JV_LOOP)
            return jgetattr(r, line, obj, key.u.s);
        if (obj.k == JV_DICT || obj.k == JV_STR || obj.k == JV_LIST) {
            bool found;
            v = method_attr(r, obj, key.u.s, &found);
            if (found)
                return v;
        }
    }
    return jv_undef_attr(r, obj, key);
}

/* Python's slice index clamping. */
static int64_t slice_bound(jv v, int64_t len, int64_t step, bool is_start)
{
    if (v.k == JV_NONE || v.k == JV_MISSING)
        return is_start ? (step < 0 ? len - 1 : 0) : (step < 0 ? -1 : len);
    int64_t i = v.k == JV_BOOL ? v.u.b : v.u.i;
    if (i < 0) {
        i += len;
        if (i < 0)
            i = step < 0 ? -1 : 0;
    } else if (i >= len) {
        i = step < 0 ? len - 1 : len;
    }
    return i;
}

static jv eval_slice(struct jrender *r, int line, jv obj, const struct jnode *s, struct jscope *sc,
                     bool folded)
{
    jv parts[3];
    const struct jnode *pn[3] = {s->a, s->b, s->c};
    bool ok = true;
    for (int k = 0; k < 3; k++) {
        parts[k] = pn[k] ? jeval(r, pn[k], sc) : jv_none();
        if (parts[k].k != JV_NONE && parts[k].k != JV_INT && parts[k].k != JV_BOOL)
            ok = false;
    }
    if (obj.k == JV_UNDEF)
        jv_undef_fail(r, line, obj);
    bool seq = obj.k == JV_STR ||
               (obj.k == JV_LIST && (obj.u.l->kind == JL_LIST || obj.u.l->kind == JL_TUPLE ||
                                     obj.u.l->kind == JL_RANGE));
    if (folded && (!seq || !ok)) /* folded by Jinja2's optimizer: environment.getitem */
        return jv_undef_hint(r, "a constant that cannot be sliced");
    /* Jinja2 compiles x[a:b] to a plain Python subscript: errors are raised */
    if (obj.k == JV_DICT)
        jfail(&r->fail, line, "unhashable type: 'slice'");
    if (!seq)
        jfail(&r->fail, line, "'%s' object is not subscriptable", jv_type_name(obj));
    if (!ok)
        jfail(&r->fail, line, "slice indices must be integers or None or have an __index__ method");
    int64_t step = parts[2].k == JV_NONE ? 1 : parts[2].k == JV_BOOL ? parts[2].u.b : parts[2].u.i;
    if (step == 0)
        jfail(&r->fail, line, "slice step cannot be zero");
    int64_t len = obj.k == JV_STR ? js_ncp(obj.u.s) : (int64_t)obj.u.l->n;
    int64_t start = slice_bound(parts[0], len, step, true);
    int64_t stop = slice_bound(parts[1], len, step, false);
    int64_t count = 0;
    if (step > 0 && start < stop)
        count = (stop - start - 1) / step + 1;
    else if (step < 0 && stop < start)
        count = (start - stop - 1) / (-step) + 1;
    if (obj.k == JV_LIST) {
        struct jlist *src = obj.u.l;
        struct jlist *l = jl_new(r, src->kind == JL_TUPLE ? JL_TUPLE : JL_LIST, (size_t)count);
        for (int64_t k = 0, i = start; k < count; k++, i += step)
            l->v[l->n++] = src->v[i];
        return jv_l(l);
    }
    struct jstr *s_ = obj.u.s;
    if (js_ncp(s_) == (int64_t)s_->len) {
        struct jstr *o = js_alloc(&r->arena, (size_t)count);
        for (int64_t k = 0, i = start; k < count; k++, i += step)
            o->s[k] = s_->s[i];
        o->ncp = count;
        return jv_s(o);
    }
    /* non-ASCII: index code points first */
    size_t *offs = ja_alloc_raw(&r->arena, (size_t)(len + 1) * sizeof *offs);
    size_t off = 0;
    for (int64_t k = 0; k < len; k++) {
        offs[k] = off;
        uint32_t c;
        off += (size_t)ju_decode(s_->s + off, s_->s + s_->len, &c);
    }
    offs[len] = s_->len;
    struct jbuf b;
    jb_init(&b, r);
    for (int64_t k = 0, i = start; k < count; k++, i += step)
        jb_add(&b, s_->s + offs[i], offs[i + 1] - offs[i]);
    return jv_s(jb_str(&b));
}

/* ---- operators ---- */

static int64_t as_int(jv v) { return v.k == JV_BOOL ? v.u.b : v.u.i; }
static double as_float(jv v) { return v.k == JV_FLOAT ? v.u.f : (double)as_int(v); }

static _Noreturn void unsupported(struct jrender *r, int line, int op, jv a, jv b)
{
    jfail(&r->fail, line, "unsupported operand type(s) for %s: '%s' and '%s'", jop_text(op),
          jv_type_name(a), jv_type_name(b));
}

static jv repeat(struct jrender *r, int line, jv seq, int64_t times)
{
    if (times < 0)
        times = 0;
    if (seq.k == JV_STR) {
        size_t len = seq.u.s->len;
        if (!len) /* '' * 4 ** 20: no bytes to copy, but as many turns of the loop */
            times = 0;
        else if ((uint64_t)times > r->max_output / len)
            jfail(&r->fail, line, "string repetition makes a string longer than %zu bytes",
                  r->max_output);
        struct jstr *o = js_alloc(&r->arena, len * (size_t)times);
        for (int64_t i = 0; i < times; i++)
            memcpy(o->s + (size_t)i * len, seq.u.s->s, len);
        return jv_s(o);
    }
    struct jlist *src = seq.u.l;
    if (!src->n) /* as for '' above */
        times = 0;
    else if ((uint64_t)times > (r->max_output / 16) / src->n)
        jfail(&r->fail, line, "list repetition makes a list that is too long");
    struct jlist *l = jl_new(r, src->kind == JL_TUPLE ? JL_TUPLE : JL_LIST, src->n * (size_t)times);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < src->n; k++)
            l->v[l->n++] = src->v[k];
    return jv_l(l);
}

static bool is_plain_seq(jv v)
{
    return v.k == JV_LIST && (v.u.l->kind == JL_LIST || v.u.l->kind == JL_TUPLE);
}

jv jbinop(struct jrender *r, int line, int op, jv a, jv b)
{
    if (a.k == JV_UNDEF)
        jv_undef_fail(r, line, a);
    if (b.k == JV_UNDEF)
        jv_undef_fail(r, line, b);
    bool nums = jv_is_num(a) && jv_is_num(b);
    bool ints = nums && a.k != JV_FLOAT && b.k != JV_FLOAT;
    int64_t x = 0, y = 0, z;
    if (ints) {
        x = as_int(a);
        y = as_int(b);
    }
    switch (op) {
    case OP_ADD:
        if (ints) {
            if (__builtin_add_overflow(x, y, &z))
                jfail(&r->fail, line, "integer overflow");
            return jv_int(z);
        }
        if (nums)
            return jv_float(as_float(a) + as_float(b));
        if (a.k == JV_STR && b.k == JV_STR) {
            struct jstr *o = js_alloc(&r->arena, a.u.s->len + b.u.s->len);
            memcpy(o->s, a.u.s->s, a.u.s->len);
            memcpy(o->s + a.u.s->len, b.u.s->s, b.u.s->len);
            return jv_s(o);
        }
        if (is_plain_seq(a) && is_plain_seq(b) && a.u.l->kind == b.u.l->kind) {
            struct jlist *l = jl_new(r, a.u.l->kind, a.u.l->n + b.u.l->n);
            for (size_t i = 0; i < a.u.l->n; i++)
                l->v[l->n++] = a.u.l->v[i];
            for (size_t i = 0; i < b.u.l->n; i++)
                l->v[l->n++] = b.u.l->v[i];
            return jv_l(l);
        }
        if (a.k == JV_STR || is_plain_seq(a))
            jfail(&r->fail, line, "can only concatenate %s (not \"%s\") to %s", jv_type_name(a),
                  jv_type_name(b), jv_type_name(a));
        unsupported(r, line, op, a, b);
    case OP_SUB:
        if (ints) {
            if (__builtin_sub_overflow(x, y, &z))
                jfail(&r->fail, line, "integer overflow");
            return jv_int(z);
        }
        if (nums)
            return jv_float(as_float(a) - as_float(b));
        unsupported(r, line, op, a, b);
    case OP_MUL:
        if (ints) {
            if (__builtin_mul_overflow(x, y, &z))
                jfail(&r->fail, line, "integer overflow");
            return jv_int(z);
        }
        if (nums)
            return jv_float(as_float(a) * as_float(b));
        if ((a.k == JV_STR || is_plain_seq(a)) && (b.k == JV_INT || b.k == JV_BOOL))
            return repeat(r, line, a, as_int(b));
        if ((b.k == JV_STR || is_plain_seq(b)) && (a.k == JV_INT || a.k == JV_BOOL))
            return repeat(r, line, b, as_int(a));
        if (a.k == JV_STR || is_plain_seq(a))
            jfail(&r->fail, line, "can't multiply sequence by non-int of type '%s'",
                  jv_type_name(b));
        unsupported(r, line, op, a, b);
    case OP_DIV:
        if (nums) {
            double d = as_float(b);
            if (d == 0)
                jfail(&r->fail, line, ints ? "division by zero" : "float division by zero");
            return jv_float(as_float(a) / d);
        }
        unsupported(r, line, op, a, b);
    case OP_FLOORDIV:
    case OP_MOD:
        if (ints) {
            if (y == 0)
                jfail(&r->fail, line, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1)
                jfail(&r->fail, line, "integer overflow");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q -= 1;
                m += y;
            }
            return jv_int(op == OP_MOD ? m : q);
        }
        if (nums) {
            double vx = as_float(a), wx = as_float(b);
            if (wx == 0)
                jfail(&r->fail, line,
                      op == OP_MOD ? "float modulo" : "float floor division by zero");
            double mod = fmod(vx, wx), div = (vx - mod) / wx;
            if (mod != 0) {
                if ((wx < 0) != (mod < 0)) {
                    mod += wx;
                    div -= 1.0;
                }
            } else {
                mod = copysign(0.0, wx);
            }
            double fl;
            if (div != 0) {
                fl = floor(div);
                if (div - fl > 0.5)
                    fl += 1.0;
            } else {
                fl = copysign(0.0, vx / wx);
            }
            return jv_float(op == OP_MOD ? mod : fl);
        }
        if (op == OP_MOD && a.k == JV_STR)
            return jpy_percent(r, line, a.u.s, b);
        unsupported(r, line, op, a, b);
    case OP_POW:
        if (ints) {
            if (y < 0) {
                if (x == 0)
                    jfail(&r->fail, line, "0.0 cannot be raised to a negative power");
                return jv_float(pow((double)x, (double)y));
            }
            int64_t res = 1, base = x;
            while (y) {
                if (y & 1 && __builtin_mul_overflow(res, base, &res))
                    jfail(&r->fail, line, "integer overflow");
                y >>= 1;
                if (y && __builtin_mul_overflow(base, base, &base))
                    jfail(&r->fail, line, "integer overflow");
            }
            return jv_int(res);
        }
        if (nums) {
            double bx = as_float(a), ex = as_float(b);
            if (bx == 0 && ex < 0)
                jfail(&r->fail, line, "0.0 cannot be raised to a negative power");
            if (bx < 0 && ex != floor(ex))
                jfail(&r->fail, line, "complex numbers are not supported");
            return jv_float(pow(bx, ex));
        }
        unsupported(r, line, op, a, b);
    default: break;
    }
    unsupported(r, line, op, a, b);
}

static bool contains(struct jrender *r, int line, jv container, jv item)
{
    switch (container.k) {
    case JV_STR:
        if (item.k != JV_STR)
            jfail(&r->fail, line, "'in <string>' requires string as left operand, not %s",
                  jv_type_name(item));
        if (item.u.s->len == 0)
            return true;
        return memmem(container.u.s->s, container.u.s->len, item.u.s->s, item.u.s->len) != NULL;
    case JV_LIST: {
        const struct jlist *l = container.u.l;
        for (size_t i = l->kind == JL_ITER ? l->pos : 0; i < l->n; i++)
            if (jv_eq(r, l->v[i], item))
                return true;
        jv_check_poison(r, line, container);
        return false;
    }
    case JV_DICT:
        if (!jv_hashable(item))
            jfail(&r->fail, line, "unhashable type: '%s'", jv_type_name(item));
        return jd_get(r, container.u.d, item, NULL);
    case JV_UNDEF: return false;
    default:
        jfail(&r->fail, line, "argument of type '%s' is not iterable", jv_type_name(container));
    }
}

static bool compare(struct jrender *r, int line, int op, jv a, jv b)
{
    switch (op) {
    case OP_EQ: return jv_eq(r, a, b);
    case OP_NE: return !jv_eq(r, a, b);
    case OP_IN: return contains(r, line, b, a);
    case OP_NOTIN: return !contains(r, line, b, a);
    default: break;
    }
    int c = jv_cmp(r, line, jop_text(op), a, b);
    if (c == 2) /* NaN */
        return false;
    switch (op) {
    case OP_LT: return c < 0;
    case OP_LTEQ: return c <= 0;
    case OP_GT: return c > 0;
    default: return c >= 0;
    }
}

/* ---- calls ---- */

static jv call_macro(struct jrender *r, int line, struct jfunc *fn, const struct jargs *a)
{
    const struct jnode *m = fn->node;
    const char *mname = m->name ? m->name->s : "caller";
    if (++r->depth > r->max_depth)
        jfail(&r->fail, line, "macro calls nest more than %d deep", r->max_depth);
    struct jscope *sc = scope_new(r, fn->closure);
    int np = m->items.n;
    bool *used = ja_alloc(&r->arena, (size_t)(a->nkw + 1) * sizeof *used);
    for (int i = 0; i < np; i++) {
        const struct jnode *param = m->items.v[i];
        jv v = jv_missing();
        if (i < a->npos) {
            v = a->pos[i];
        } else {
            for (int k = 0; k < a->nkw; k++)
                if (!used[k] && a->kwn[k]->len == param->name->len &&
                    !memcmp(a->kwn[k]->s, param->name->s, param->name->len)) {
                    v = a->kwv[k];
                    used[k] = true;
                    break;
                }
        }
        if (v.k == JV_MISSING) {
            if (param->a) {
                v = jeval(r, param->a, sc);
            } else {
                char *hint = ja_alloc(&r->arena, param->name->len + 40);
                sprintf(hint, "parameter '%s' was not provided", param->name->s);
                v = jv_undef_hint(r, hint);
            }
        }
        scope_set(r, sc, param->name, v);
    }
    if (m->flags & NF_CALLER) {
        jv caller = jv_undef_hint(r, "No caller defined");
        for (int k = 0; k < a->nkw; k++)
            if (!used[k] && js_eq(a->kwn[k], "caller")) {
                caller = a->kwv[k];
                used[k] = true;
            }
        scope_set(r, sc, js_lit(&r->arena, "caller"), caller);
    }
    struct jdict *kw = (m->flags & NF_KWARGS) ? jd_new(r, (size_t)a->nkw) : NULL;
    for (int k = 0; k < a->nkw; k++) {
        if (used[k])
            continue;
        if (!kw) {
            if (js_eq(a->kwn[k], "caller"))
                jfail(&r->fail, line,
                      "macro '%s' was invoked with two values for the special caller argument",
                      mname);
            jfail(&r->fail, line, "macro '%s' takes no keyword argument '%s'", mname, a->kwn[k]->s);
        }
        jd_set(r, kw, jv_s(a->kwn[k]), a->kwv[k]);
    }
    if (kw) {
        jv kv = {.k = JV_DICT, .u.d = kw};
        scope_set(r, sc, js_lit(&r->arena, "kwargs"), kv);
    }
    if (a->npos > np && !(m->flags & NF_VARARGS))
        jfail(&r->fail, line, "macro '%s' takes not more than %d argument(s)", mname, np);
    if (m->flags & NF_VARARGS) {
        struct jlist *rest = jl_new(r, JL_TUPLE, a->npos > np ? (size_t)(a->npos - np) : 0);
        for (int i = np; i < a->npos; i++)
            rest->v[rest->n++] = a->pos[i];
        scope_set(r, sc, js_lit(&r->arena, "varargs"), jv_l(rest));
    }
    struct jbuf out;
    jb_init(&out, r);
    exec_body(r, &m->body, sc, &out);
    r->depth--;
    return jv_s(jb_str(&out));
}

static int run_for(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jbuf *out,
                   jv iterable, int depth0);

jv jcall(struct jrender *r, int line, jv callee, const struct jargs *a)
{
    switch (callee.k) {
    case JV_FUNC: {
        struct jfunc *fn = callee.u.fn;
        switch (fn->kind) {
        case JF_MACRO: return call_macro(r, line, fn, a);
        case JF_BUILTIN: return fn->bi->fn(r, line, jv_none(), a);
        case JF_METHOD: return fn->bi->fn(r, line, fn->self, a);
        case JF_JOINER:
            if (a->npos || a->nkw)
                jfail(&r->fail, line, "joiner takes no arguments");
            if (!fn->used) {
                fn->used = true;
                return jv_str(r, "", 0);
            }
            return fn->self;
        }
        break;
    }
    case JV_UNDEF: jv_undef_fail(r, line, callee);
    case JV_LOOP: {
        struct jloop *l = callee.u.loop;
        if (!(l->node->flags & NF_RECURSIVE))
            jfail(&r->fail, line,
                  "The loop must have the 'recursive' marker to be called recursively.");
        if (a->npos != 1 || a->nkw)
            jfail(&r->fail, line, "loop() takes exactly one argument");
        if (++r->depth > r->max_depth)
            jfail(&r->fail, line, "recursive loops nest more than %d deep", r->max_depth);
        struct jbuf b;
        jb_init(&b, r);
        run_for(r, l->node, l->outer, &b, a->pos[0], l->depth0 + 1);
        r->depth--;
        return jv_s(jb_str(&b));
    }
    default: break;
    }
    jfail(&r->fail, line, "'%s' object is not callable", jv_type_name(callee));
}

/* ---- expressions ---- */

static jv eval_filter(struct jrender *r, const struct jnode *n, struct jscope *sc, jv input)
{
    jv v = n->a ? (n->a->kind == E_FILTER ? eval_filter(r, n->a, sc, input) : jeval(r, n->a, sc))
                : input;
    struct jargs a;
    eval_args(r, n, sc, &a, 0);
    jstep(r, n->line);
    return n->fn->fn(r, n->line, v, &a);
}

static jv eval_node(struct jrender *r, const struct jnode *n, struct jscope *sc);

/* Whether a value could be a constant in Python source (has_safe_repr). */
static bool safe_repr(jv v, int depth)
{
    if (depth > 50)
        return false;
    switch (v.k) {
    case JV_NONE:
    case JV_BOOL:
    case JV_INT:
    case JV_FLOAT:
    case JV_STR: return true;
    case JV_LIST:
        if (v.u.l->kind != JL_LIST && v.u.l->kind != JL_TUPLE && v.u.l->kind != JL_RANGE)
            return false;
        for (size_t i = 0; i < v.u.l->n; i++)
            if (!safe_repr(v.u.l->v[i], depth + 1))
                return false;
        return true;
    case JV_DICT:
        for (size_t i = 0; i < v.u.d->n; i++)
            if (!safe_repr(v.u.d->k[i], depth + 1) || !safe_repr(v.u.d->v[i], depth + 1))
                return false;
        return true;
    default: return false;
    }
}

jv jeval(struct jrender *r, const struct jnode *n, struct jscope *sc)
{
    if (!(n->flags & NF_FOLD))
        return eval_node(r, n, sc);
    /* Jinja2 computes a constant expression when it compiles the template
     * and keeps the result if it can be written as a constant (or is
     * printed); otherwise the expression runs, with Python's subscripts. */
    r->folding++;
    jv v = eval_node(r, n, sc);
    r->folding--;
    if ((n->flags & NF_OUTFOLD) || safe_repr(v, 0))
        return v;
    return eval_node(r, n, sc);
}

static jv eval_node(struct jrender *r, const struct jnode *n, struct jscope *sc)
{
    jstep(r, n->line);
    if (++r->edepth > MAX_EVAL_DEPTH)
        jfail(&r->fail, n->line, "expression nests too deeply");
    jv v;
    switch (n->kind) {
    case E_CONST: v = n->val; break;
    case E_NAME: v = lookup(r, sc, n->name); break;
    case E_NSREF: v = jgetattr(r, n->line, lookup(r, sc, n->name), n->attr); break;
    case E_LIST:
    case E_TUPLE: {
        struct jlist *l = jl_new(r, n->kind == E_LIST ? JL_LIST : JL_TUPLE, (size_t)n->items.n);
        for (int i = 0; i < n->items.n; i++)
            l->v[l->n++] = jeval(r, n->items.v[i], sc);
        v = jv_l(l);
        break;
    }
    case E_DICT: {
        struct jdict *d = jd_new(r, (size_t)n->items.n / 2);
        for (int i = 0; i + 1 < n->items.n; i += 2) {
            jv k = jeval(r, n->items.v[i], sc);
            if (!jv_hashable(k))
                jfail(&r->fail, n->line, "unhashable type: '%s'", jv_type_name(k));
            jd_set(r, d, k, jeval(r, n->items.v[i + 1], sc));
        }
        v = jv_d(d);
        break;
    }
    case E_GETATTR: v = jgetattr(r, n->line, jeval(r, n->a, sc), n->attr); break;
    case E_GETITEM: {
        jv obj = jeval(r, n->a, sc);
        if (n->b->kind == E_SLICE)
            v = eval_slice(r, n->line, obj, n->b, sc, r->folding > 0);
        else
            v = jgetitem(r, n->line, obj, jeval(r, n->b, sc));
        break;
    }
    case E_SLICE: jfail(&r->fail, n->line, "a slice outside of a subscript");
    case E_CALL: {
        jv callee = jeval(r, n->a, sc);
        struct jargs a;
        eval_args(r, n, sc, &a, 0);
        v = jcall(r, n->line, callee, &a);
        break;
    }
    case E_FILTER: v = eval_filter(r, n, sc, jv_undef()); break;
    case E_TEST: {
        jv subject = jeval(r, n->a, sc);
        struct jargs a;
        eval_args(r, n, sc, &a, 0);
        v = n->fn->fn(r, n->line, subject, &a);
        break;
    }
    case E_NOT: v = jv_bool(!jv_truthy(jeval(r, n->a, sc))); break;
    case E_NEG:
    case E_POS: {
        jv x = jeval(r, n->a, sc);
        if (x.k == JV_UNDEF)
            jv_undef_fail(r, n->line, x);
        if (x.k == JV_FLOAT)
            v = jv_float(n->kind == E_NEG ? -x.u.f : x.u.f);
        else if (x.k == JV_INT || x.k == JV_BOOL) {
            int64_t i = as_int(x);
            if (n->kind == E_NEG && i == INT64_MIN)
                jfail(&r->fail, n->line, "integer overflow");
            v = jv_int(n->kind == E_NEG ? -i : i);
        } else
            jfail(&r->fail, n->line, "bad operand type for unary %c: '%s'",
                  n->kind == E_NEG ? '-' : '+', jv_type_name(x));
        break;
    }
    case E_BIN: {
        jv a = jeval(r, n->a, sc);
        jv b = jeval(r, n->b, sc);
        v = jbinop(r, n->line, n->op, a, b);
        break;
    }
    case E_AND:
        v = jeval(r, n->a, sc);
        if (jv_truthy(v))
            v = jeval(r, n->b, sc);
        break;
    case E_OR:
        v = jeval(r, n->a, sc);
        if (!jv_truthy(v))
            v = jeval(r, n->b, sc);
        break;
    case E_CONCAT: {
        struct jbuf b;
        jb_init(&b, r);
        for (int i = 0; i < n->items.n; i++)
            jv_write_str(r, jeval(r, n->items.v[i], sc), &b);
        v = jv_s(jb_str(&b));
        break;
    }
    case E_COMPARE: {
        jv left = jeval(r, n->a, sc);
        v = jv_bool(true);
        for (int i = 0; i < n->items.n; i++) {
            const struct jnode *o = n->items.v[i];
            jv right = jeval(r, o->a, sc);
            if (!compare(r, o->line, o->op, left, right)) {
                v = jv_bool(false);
                break;
            }
            left = right;
        }
        break;
    }
    case E_COND:
        if (jv_truthy(jeval(r, n->b, sc))) {
            v = jeval(r, n->a, sc);
        } else if (n->c) {
            v = jeval(r, n->c, sc);
        } else {
            char *hint = ja_alloc(&r->arena, 120);
            snprintf(hint, 120,
                     "the inline if-expression on line %d evaluated to false and no else "
                     "section was defined.",
                     n->line);
            v = jv_undef_hint(r, hint);
        }
        break;
    default: jfail(&r->fail, n->line, "cannot evaluate this expression");
    }
    r->edepth--;
    return v;
}

/* ---- statements ---- */

static void assign(struct jrender *r, const struct jnode *t, jv v, struct jscope *sc)
{
    switch (t->kind) {
    case E_NAME: scope_set(r, sc, t->name, v); return;
    case E_NSREF: {
        jv ns = lookup(r, sc, t->name);
        if (ns.k != JV_NS)
            jfail(&r->fail, t->line, "cannot assign attribute on non-namespace object");
        jd_set(r, ns.u.d, jv_s(t->attr), v);
        return;
    }
    case E_TUPLE: {
        jv *items;
        size_t n;
        jv_iterate(r, t->line, v, &items, &n);
        size_t want = (size_t)t->items.n;
        if (n < want)
            jfail(&r->fail, t->line, "not enough values to unpack (expected %zu, got %zu)", want,
                  n);
        if (n > want)
            jfail(&r->fail, t->line, "too many values to unpack (expected %zu)", want);
        for (size_t i = 0; i < want; i++)
            assign(r, t->items.v[i], items[i], sc);
        return;
    }
    default: jfail(&r->fail, t->line, "cannot assign to this expression");
    }
}

static int run_for(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jbuf *out,
                   jv iterable, int depth0)
{
    jv *items;
    size_t count;
    jv_iterate(r, n->line, iterable, &items, &count);
    struct jscope *ls = scope_new(r, sc);
    if (n->c) { /* {% for x in xs if cond %}: filter first, loop.* counts what is left */
        jv *kept = ja_alloc_raw(&r->arena, (count ? count : 1) * sizeof(jv));
        size_t k = 0;
        for (size_t i = 0; i < count; i++) {
            ls->n = 0;
            assign(r, n->a, items[i], ls);
            if (jv_truthy(jeval(r, n->c, ls)))
                kept[k++] = items[i];
        }
        items = kept;
        count = k;
    }
    struct jloop *loop = ja_alloc(&r->arena, sizeof *loop);
    loop->items = items;
    loop->n = count;
    loop->depth0 = depth0;
    loop->node = n;
    loop->outer = sc;
    jv lv = {.k = JV_LOOP, .u.loop = loop};
    struct jstr *loop_name = js_lit(&r->arena, "loop");
    for (size_t i = 0; i < count; i++) {
        jstep(r, n->line);
        loop->i = i;
        ls->n = 0; /* each iteration starts from a clean scope */
        assign(r, n->a, items[i], ls);
        scope_set(r, ls, loop_name, lv);
        if (exec_body(r, &n->body, ls, out) == X_BREAK)
            break;
    }
    if (count == 0) /* the else block gets its own scope too */
        return exec_body(r, &n->orelse, scope_new(r, sc), out);
    return X_NORMAL;
}

static int exec_stmt(struct jrender *r, const struct jnode *n, struct jscope *sc, struct jbuf *out)
{
    jstep(r, n->line);
    switch (n->kind) {
    case S_TEXT: jb_add(out, n->val.u.s->s, n->val.u.s->len); return X_NORMAL;
    case S_PRINT: jv_write_str(r, jeval(r, n->a, sc), out); return X_NORMAL;
    case S_IF:
        if (jv_truthy(jeval(r, n->a, sc)))
            return exec_body(r, &n->body, sc, out);
        return exec_body(r, &n->orelse, sc, out);
    case S_FOR: return run_for(r, n, sc, out, jeval(r, n->b, sc), 0);
    case S_SET: assign(r, n->a, jeval(r, n->b, sc), sc); return X_NORMAL;
    case S_SETBLOCK: {
        struct jbuf b;
        jb_init(&b, r);
        exec_body(r, &n->body, scope_new(r, sc), &b);
        jv v = jv_s(jb_str(&b));
        if (n->c)
            v = eval_filter(r, n->c, sc, v);
        assign(r, n->a, v, sc);
        return X_NORMAL;
    }
    case S_MACRO: {
        struct jfunc *fn = ja_alloc(&r->arena, sizeof *fn);
        fn->kind = JF_MACRO;
        fn->node = n;
        fn->closure = sc;
        jv v = {.k = JV_FUNC, .u.fn = fn};
        scope_set(r, sc, n->name, v);
        return X_NORMAL;
    }
    case S_CALLBLOCK: {
        struct jfunc *fn = ja_alloc(&r->arena, sizeof *fn);
        fn->kind = JF_MACRO;
        fn->node = n;
        fn->closure = sc;
        const struct jnode *call = n->a;
        jv callee = jeval(r, call->a, sc);
        struct jargs a;
        eval_args(r, call, sc, &a, 1);
        a.kwn[a.nkw] = js_lit(&r->arena, "caller");
        a.kwv[a.nkw].k = JV_FUNC;
        a.kwv[a.nkw++].u.fn = fn;
        jv_write_str(r, jcall(r, call->line, callee, &a), out);
        return X_NORMAL;
    }
    case S_FILTERBLOCK: {
        struct jbuf b;
        jb_init(&b, r);
        exec_body(r, &n->body, scope_new(r, sc), &b);
        jv_write_str(r, eval_filter(r, n->c, sc, jv_s(jb_str(&b))), out);
        return X_NORMAL;
    }
    case S_WITH: {
        jv *vals = ja_alloc(&r->arena, (size_t)(n->items.n + 1) * sizeof(jv));
        for (int i = 0; i < n->items.n; i++)
            vals[i] = jeval(r, n->items.v[i]->b, sc);
        struct jscope *ws = scope_new(r, sc);
        for (int i = 0; i < n->items.n; i++)
            assign(r, n->items.v[i]->a, vals[i], ws);
        return exec_body(r, &n->body, ws, out);
    }
    case S_BREAK: return X_BREAK;
    case S_CONTINUE: return X_CONTINUE;
    case S_SCOPE:
        return exec_body(r, &n->body, (n->flags & NF_SCOPED) ? scope_new(r, sc) : sc, out);
    default: jfail(&r->fail, n->line, "cannot execute this statement");
    }
}

static int exec_body(struct jrender *r, const struct jnodes *body, struct jscope *sc,
                     struct jbuf *out)
{
    for (int i = 0; i < body->n; i++) {
        int st = exec_stmt(r, body->v[i], sc, out);
        if (st != X_NORMAL)
            return st;
    }
    return X_NORMAL;
}

void jrun(struct jrender *r, const struct jnode *root, struct jbuf *out)
{
    struct jscope *sc = scope_new(r, NULL);
    exec_body(r, &root->body, sc, out);
}
