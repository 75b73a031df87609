/* jinja_parse.c - builds the syntax tree from tokens with Jinja2's grammar:
 * statements (if/for/set/macro/call/filter/with/raw/break/continue and
 * transformers' generation block) and expressions with Jinja2's operator
 * precedence, filters and tests resolved by name at compile time. */
#include <string.h>

#include "tokenizer/jinja_internal.h"

#define MAX_NEST 100 /* nested blocks + nested sub-expressions */

struct parser {
    struct jarena *a;
    struct jfail *f;
    const struct jtoken *t;
    size_t n, i;
    int depth;
    int loops; /* enclosing for-loops in the current macro */
    struct {
        const char *tag;
        int line;
    } stack[MAX_NEST + 8];
    int nstack;
};

static struct jnode *parse_expression(struct parser *p, bool with_condexpr);
static struct jnode *parse_tuple(struct parser *p, bool simplified, bool with_condexpr,
                                 const char *extra_end, bool explicit_parens, bool with_ns);
static struct jnode *parse_unary(struct parser *p, bool with_filter);
static struct jnode *parse_primary(struct parser *p, bool with_ns);
static struct jnode *parse_postfix(struct parser *p, struct jnode *n);
static struct jnode *parse_filter(struct parser *p, struct jnode *n, bool start_inline);
static void subparse(struct parser *p, const char *const *end_names, struct jnodes *body);
static struct jnode *parse_or_(struct parser *p);

/* ---- helpers ---- */

static const struct jtoken *cur(const struct parser *p) { return &p->t[p->i]; }
static const struct jtoken *peek(const struct parser *p)
{
    return &p->t[p->i + 1 < p->n ? p->i + 1 : p->n - 1];
}
static const struct jtoken *next(struct parser *p)
{
    const struct jtoken *t = cur(p);
    if (p->i + 1 < p->n)
        p->i++;
    return t;
}
static bool is_name(const struct jtoken *t, const char *name)
{
    return t->type == JT_NAME && js_eq(t->str, name);
}
static bool is_op(const struct jtoken *t, int op) { return t->type == JT_OP && t->op == op; }
static bool skip_name(struct parser *p, const char *name)
{
    if (!is_name(cur(p), name))
        return false;
    next(p);
    return true;
}
static bool skip_op(struct parser *p, int op)
{
    if (!is_op(cur(p), op))
        return false;
    next(p);
    return true;
}

static const char *describe(const struct jtoken *t)
{
    switch (t->type) {
    case JT_EOF: return "end of template";
    case JT_TEXT: return "template data / text";
    case JT_VAR_BEGIN: return "begin of print statement";
    case JT_VAR_END: return "end of print statement";
    case JT_BLOCK_BEGIN: return "begin of statement block";
    case JT_BLOCK_END: return "end of statement block";
    case JT_NAME: return t->str->s;
    case JT_STRING: return "string";
    case JT_INT: return "integer";
    case JT_FLOAT: return "float";
    default: return jop_text(t->op);
    }
}

static _Noreturn void fail_unexpected(struct parser *p, const char *expected)
{
    const struct jtoken *t = cur(p);
    if (t->type == JT_EOF)
        jfail(p->f, t->line, "unexpected end of template, expected %s", expected);
    jfail(p->f, t->line, "expected %s, got '%s'", expected, describe(t));
}

static void expect_op(struct parser *p, int op)
{
    if (!skip_op(p, op)) {
        char what[16];
        snprintf(what, sizeof what, "'%s'", jop_text(op));
        fail_unexpected(p, what);
    }
}
static void expect_type(struct parser *p, int type, const char *what)
{
    if (cur(p)->type != type)
        fail_unexpected(p, what);
    next(p);
}
static struct jstr *expect_name(struct parser *p)
{
    if (cur(p)->type != JT_NAME)
        fail_unexpected(p, "a name");
    return next(p)->str;
}
static void expect_kw(struct parser *p, const char *name)
{
    if (!skip_name(p, name)) {
        char what[32];
        snprintf(what, sizeof what, "'%s'", name);
        fail_unexpected(p, what);
    }
}

static struct jnode *mk(struct parser *p, int kind, int line)
{
    struct jnode *n = ja_alloc(p->a, sizeof *n);
    n->kind = kind;
    n->line = line;
    return n;
}

static void add(struct parser *p, struct jnodes *l, struct jnode *n)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        l->v = ja_grow(p->a, l->v, (size_t)l->cap * sizeof *l->v, (size_t)cap * sizeof *l->v);
        l->cap = cap;
    }
    l->v[l->n++] = n;
}

static void enter(struct parser *p)
{
    if (++p->depth > MAX_NEST)
        jfail(p->f, cur(p)->line, "template nests too deeply (more than %d levels)", MAX_NEST);
}
static void leave(struct parser *p) { p->depth--; }

/* ---- expressions ---- */

static struct jnode *parse_condexpr(struct parser *p)
{
    int line = cur(p)->line;
    struct jnode *e1 = parse_or_(p);
    while (skip_name(p, "if")) {
        struct jnode *n = mk(p, E_COND, line);
        n->a = e1;
        n->b = parse_or_(p);
        if (skip_name(p, "else")) {
            enter(p);
            n->c = parse_condexpr(p);
            leave(p);
        }
        e1 = n;
        line = cur(p)->line;
    }
    return e1;
}

static struct jnode *parse_math1(struct parser *p);

static struct jnode *parse_not(struct parser *p)
{
    if (is_name(cur(p), "not")) {
        struct jnode *n = mk(p, E_NOT, next(p)->line);
        enter(p);
        n->a = parse_not(p);
        leave(p);
        return n;
    }
    int line = cur(p)->line;
    struct jnode *e = parse_math1(p);
    struct jnode *cmp = NULL;
    for (;;) {
        const struct jtoken *t = cur(p);
        int op = 0;
        if (t->type == JT_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == OP_LT ||
                                 t->op == OP_LTEQ || t->op == OP_GT || t->op == OP_GTEQ)) {
            op = t->op;
            next(p);
        } else if (is_name(t, "in")) {
            op = OP_IN;
            next(p);
        } else if (is_name(t, "not") && is_name(peek(p), "in")) {
            op = OP_NOTIN;
            next(p);
            next(p);
        } else {
            break;
        }
        if (!cmp) {
            cmp = mk(p, E_COMPARE, line);
            cmp->a = e;
        }
        struct jnode *o = mk(p, E_OPERAND, t->line);
        o->op = op;
        o->a = parse_math1(p);
        add(p, &cmp->items, o);
    }
    return cmp ? cmp : e;
}

static struct jnode *parse_and(struct parser *p)
{
    int line = cur(p)->line;
    struct jnode *left = parse_not(p);
    while (skip_name(p, "and")) {
        struct jnode *n = mk(p, E_AND, line);
        n->a = left;
        n->b = parse_not(p);
        left = n;
        line = cur(p)->line;
    }
    return left;
}

static struct jnode *parse_or_(struct parser *p)
{
    int line = cur(p)->line;
    struct jnode *left = parse_and(p);
    while (skip_name(p, "or")) {
        struct jnode *n = mk(p, E_OR, line);
        n->a = left;
        n->b = parse_and(p);
        left = n;
        line = cur(p)->line;
    }
    return left;
}

static struct jnode *parse_pow(struct parser *p)
{
    int line = cur(p)->line;
    struct jnode *left = parse_unary(p, true);
    while (is_op(cur(p), OP_POW)) {
        next(p);
        struct jnode *n = mk(p, E_BIN, line);
        n->op = OP_POW;
        n->a = left;
        n->b = parse_unary(p, true);
        left = n;
        line = cur(p)->line;
    }
    return left;
}

static struct jnode *parse_math2(struct parser *p)
{
    int line = cur(p)->line;
    struct jnode *left = parse_pow(p);
    for (;;) {
        const struct jtoken *t = cur(p);
        if (!(t->type == JT_OP &&
              (t->op == OP_MUL || t->op == OP_DIV || t->op == OP_FLOORDIV || t->op == OP_MOD)))
            break;
        next(p);
        struct jnode *n = mk(p, E_BIN, line);
        n->op = t->op;
        n->a = left;
        n->b = parse_pow(p);
        left = n;
        line = cur(p)->line;
    }
    return left;
}

static struct jnode *parse_concat(struct parser *p)
{
    int line = cur(p)->line;
    struct jnode *first = parse_math2(p);
    if (!is_op(cur(p), OP_TILDE))
        return first;
    struct jnode *n = mk(p, E_CONCAT, line);
    add(p, &n->items, first);
    while (skip_op(p, OP_TILDE))
        add(p, &n->items, parse_math2(p));
    return n;
}

static struct jnode *parse_math1(struct parser *p)
{
    int line = cur(p)->line;
    struct jnode *left = parse_concat(p);
    while (is_op(cur(p), OP_ADD) || is_op(cur(p), OP_SUB)) {
        int op = next(p)->op;
        struct jnode *n = mk(p, E_BIN, line);
        n->op = op;
        n->a = left;
        n->b = parse_concat(p);
        left = n;
        line = cur(p)->line;
    }
    return left;
}

static struct jnode *parse_expression(struct parser *p, bool with_condexpr)
{
    return with_condexpr ? parse_condexpr(p) : parse_or_(p);
}

static void parse_call_args(struct parser *p, struct jnode *n)
{
    int line = cur(p)->line;
    expect_op(p, OP_LPAREN);
    bool need_comma = false;
    while (!is_op(cur(p), OP_RPAREN)) {
        if (need_comma) {
            expect_op(p, OP_COMMA);
            if (is_op(cur(p), OP_RPAREN))
                break;
        }
        if (is_op(cur(p), OP_MUL)) {
            if (n->c || n->d)
                jfail(p->f, line, "invalid syntax for function call expression");
            next(p);
            n->c = parse_expression(p, true);
        } else if (is_op(cur(p), OP_POW)) {
            if (n->d)
                jfail(p->f, line, "invalid syntax for function call expression");
            next(p);
            n->d = parse_expression(p, true);
        } else if (cur(p)->type == JT_NAME && is_op(peek(p), OP_ASSIGN)) {
            if (n->d)
                jfail(p->f, line, "invalid syntax for function call expression");
            struct jnode *kw = mk(p, E_KW, cur(p)->line);
            kw->name = next(p)->str;
            next(p);
            kw->a = parse_expression(p, true);
            add(p, &n->kw, kw);
        } else {
            if (n->c || n->d || n->kw.n)
                jfail(p->f, line, "invalid syntax for function call expression");
            add(p, &n->items, parse_expression(p, true));
        }
        need_comma = true;
    }
    expect_op(p, OP_RPAREN);
}

static struct jnode *parse_call(struct parser *p, struct jnode *callee)
{
    struct jnode *n = mk(p, E_CALL, cur(p)->line);
    n->a = callee;
    parse_call_args(p, n);
    return n;
}

static struct jstr *dotted_name(struct parser *p)
{
    struct jstr *name = expect_name(p);
    while (is_op(cur(p), OP_DOT)) {
        next(p);
        struct jstr *part = expect_name(p);
        struct jstr *s = js_alloc(p->a, name->len + 1 + part->len);
        memcpy(s->s, name->s, name->len);
        s->s[name->len] = '.';
        memcpy(s->s + name->len + 1, part->s, part->len);
        js_ncp(s); /* shared by renders: count now (see jlex) */
        name = s;
    }
    return name;
}

static struct jnode *parse_filter(struct parser *p, struct jnode *n, bool start_inline)
{
    while (is_op(cur(p), OP_PIPE) || start_inline) {
        if (!start_inline)
            next(p);
        int line = cur(p)->line;
        struct jnode *f = mk(p, E_FILTER, line);
        f->name = dotted_name(p);
        f->fn = jfilter_find(f->name->s);
        if (!f->fn)
            jfail(p->f, line, "unknown filter '%s'", f->name->s);
        f->a = n;
        if (is_op(cur(p), OP_LPAREN))
            parse_call_args(p, f);
        n = f;
        start_inline = false;
    }
    return n;
}

static struct jnode *parse_test(struct parser *p, struct jnode *subject)
{
    int line = next(p)->line; /* "is" */
    bool negated = skip_name(p, "not");
    struct jnode *t = mk(p, E_TEST, line);
    t->a = subject;
    t->name = dotted_name(p);
    t->fn = jtest_find(t->name->s);
    if (!t->fn)
        jfail(p->f, line, "unknown test '%s'", t->name->s);
    const struct jtoken *c = cur(p);
    if (is_op(c, OP_LPAREN)) {
        parse_call_args(p, t);
    } else if ((c->type == JT_NAME || c->type == JT_STRING || c->type == JT_INT ||
                c->type == JT_FLOAT || is_op(c, OP_LBRACKET) || is_op(c, OP_LBRACE)) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is"))
            jfail(p->f, c->line, "you cannot chain multiple tests with is");
        add(p, &t->items, parse_postfix(p, parse_primary(p, false)));
    }
    if (negated) {
        struct jnode *n = mk(p, E_NOT, line);
        n->a = t;
        return n;
    }
    return t;
}

static struct jnode *parse_subscribed(struct parser *p)
{
    int line = cur(p)->line;
    struct jnode *start = NULL;
    if (!is_op(cur(p), OP_COLON)) {
        struct jnode *e = parse_expression(p, true);
        if (!is_op(cur(p), OP_COLON))
            return e;
        start = e;
    }
    next(p); /* ':' */
    struct jnode *s = mk(p, E_SLICE, line);
    s->a = start;
    if (!is_op(cur(p), OP_COLON) && !is_op(cur(p), OP_RBRACKET) && !is_op(cur(p), OP_COMMA))
        s->b = parse_expression(p, true);
    if (skip_op(p, OP_COLON)) {
        if (!is_op(cur(p), OP_RBRACKET) && !is_op(cur(p), OP_COMMA))
            s->c = parse_expression(p, true);
    }
    return s;
}

/* Whether Jinja2's optimizer can fold an expression at compile time: only
 * literals and what is computed from them (no names, no calls, no filters
 * that need the context). It matters for one thing: a folded slice uses
 * environment.getitem (an undefined value when the object cannot be
 * sliced), a compiled one Python's subscript (a TypeError). */
static bool is_const(const struct jnode *n)
{
    if (!n)
        return true;
    switch (n->kind) {
    case E_CONST: return true;
    case E_NAME:
    case E_NSREF:
    case E_CALL: return false;
    case E_FILTER:
        if (!strcmp(n->name->s, "map") || !strcmp(n->name->s, "select") ||
            !strcmp(n->name->s, "reject") || !strcmp(n->name->s, "selectattr") ||
            !strcmp(n->name->s, "rejectattr") || n->c || n->d)
            return false;
        /* fall through */
    default:
        for (int i = 0; i < n->items.n; i++)
            if (!is_const(n->items.v[i]))
                return false;
        for (int i = 0; i < n->kw.n; i++)
            if (!is_const(n->kw.v[i]->a))
                return false;
        return (n->kind == E_FILTER && !n->a)
                   ? false
                   : is_const(n->a) && is_const(n->b) && is_const(n->c) && is_const(n->d);
    }
}

static struct jnode *parse_postfix(struct parser *p, struct jnode *n)
{
    for (;;) {
        const struct jtoken *t = cur(p);
        if (is_op(t, OP_DOT)) {
            next(p);
            const struct jtoken *a = next(p);
            if (a->type == JT_NAME) {
                struct jnode *g = mk(p, E_GETATTR, t->line);
                g->a = n;
                g->attr = a->str;
                n = g;
            } else if (a->type == JT_INT) {
                struct jnode *g = mk(p, E_GETITEM, t->line);
                g->a = n;
                g->b = mk(p, E_CONST, a->line);
                g->b->val = jv_int(a->i);
                n = g;
            } else {
                p->i--;
                fail_unexpected(p, "a name or number after '.'");
            }
        } else if (is_op(t, OP_LBRACKET)) {
            next(p);
            struct jnode *g = mk(p, E_GETITEM, t->line);
            g->a = n;
            struct jnodes args = {0};
            while (!is_op(cur(p), OP_RBRACKET)) {
                if (args.n)
                    expect_op(p, OP_COMMA);
                add(p, &args, parse_subscribed(p));
            }
            expect_op(p, OP_RBRACKET);
            if (args.n == 1) {
                g->b = args.v[0];
            } else {
                g->b = mk(p, E_TUPLE, t->line);
                g->b->items = args;
            }
            n = g;
        } else if (is_op(t, OP_LPAREN)) {
            n = parse_call(p, n);
        } else {
            return n;
        }
    }
}

static struct jnode *parse_primary(struct parser *p, bool with_ns)
{
    const struct jtoken *t = cur(p);
    struct jnode *n;
    switch (t->type) {
    case JT_NAME:
        next(p);
        n = mk(p, E_CONST, t->line);
        if (js_eq(t->str, "true") || js_eq(t->str, "True")) {
            n->val = jv_bool(true);
        } else if (js_eq(t->str, "false") || js_eq(t->str, "False")) {
            n->val = jv_bool(false);
        } else if (js_eq(t->str, "none") || js_eq(t->str, "None")) {
            n->val = jv_none();
        } else if (with_ns && is_op(cur(p), OP_DOT)) {
            next(p);
            n->kind = E_NSREF;
            n->name = t->str;
            n->attr = expect_name(p);
        } else {
            n->kind = E_NAME;
            n->name = t->str;
        }
        return n;
    case JT_STRING: {
        next(p);
        n = mk(p, E_CONST, t->line);
        struct jstr *s = t->str;
        while (cur(p)->type == JT_STRING) {
            struct jstr *more = next(p)->str;
            struct jstr *c = js_alloc(p->a, s->len + more->len);
            memcpy(c->s, s->s, s->len);
            memcpy(c->s + s->len, more->s, more->len);
            js_ncp(c);
            s = c;
        }
        n->val = jv_s(s);
        return n;
    }
    case JT_INT:
        next(p);
        n = mk(p, E_CONST, t->line);
        n->val = jv_int(t->i);
        return n;
    case JT_FLOAT:
        next(p);
        n = mk(p, E_CONST, t->line);
        n->val = jv_float(t->f);
        return n;
    case JT_OP:
        if (t->op == OP_LPAREN) {
            next(p);
            n = parse_tuple(p, false, true, NULL, true, false);
            expect_op(p, OP_RPAREN);
            return n;
        }
        if (t->op == OP_LBRACKET) {
            next(p);
            n = mk(p, E_LIST, t->line);
            while (!is_op(cur(p), OP_RBRACKET)) {
                if (n->items.n)
                    expect_op(p, OP_COMMA);
                if (is_op(cur(p), OP_RBRACKET))
                    break;
                add(p, &n->items, parse_expression(p, true));
            }
            expect_op(p, OP_RBRACKET);
            return n;
        }
        if (t->op == OP_LBRACE) {
            next(p);
            n = mk(p, E_DICT, t->line);
            while (!is_op(cur(p), OP_RBRACE)) {
                if (n->items.n)
                    expect_op(p, OP_COMMA);
                if (is_op(cur(p), OP_RBRACE))
                    break;
                add(p, &n->items, parse_expression(p, true));
                expect_op(p, OP_COLON);
                add(p, &n->items, parse_expression(p, true));
            }
            expect_op(p, OP_RBRACE);
            return n;
        }
        break;
    default: break;
    }
    jfail(p->f, t->line, "unexpected '%s'", describe(t));
}

static struct jnode *parse_unary(struct parser *p, bool with_filter)
{
    enter(p);
    const struct jtoken *t = cur(p);
    struct jnode *n;
    if (is_op(t, OP_SUB) || is_op(t, OP_ADD)) {
        next(p);
        n = mk(p, t->op == OP_SUB ? E_NEG : E_POS, t->line);
        n->a = parse_unary(p, false);
    } else {
        n = parse_primary(p, false);
    }
    n = parse_postfix(p, n);
    if (with_filter) {
        for (;;) {
            if (is_op(cur(p), OP_PIPE))
                n = parse_filter(p, n, false);
            else if (is_name(cur(p), "is"))
                n = parse_test(p, n);
            else if (is_op(cur(p), OP_LPAREN))
                n = parse_call(p, n);
            else
                break;
        }
    }
    leave(p);
    return n;
}

static bool tuple_end(const struct parser *p, const char *extra)
{
    const struct jtoken *t = cur(p);
    if (t->type == JT_VAR_END || t->type == JT_BLOCK_END || is_op(t, OP_RPAREN))
        return true;
    return extra && is_name(t, extra);
}

static struct jnode *parse_tuple(struct parser *p, bool simplified, bool with_condexpr,
                                 const char *extra_end, bool explicit_parens, bool with_ns)
{
    int line = cur(p)->line;
    struct jnodes args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n)
            expect_op(p, OP_COMMA);
        if (tuple_end(p, extra_end))
            break;
        add(p, &args, simplified ? parse_primary(p, with_ns) : parse_expression(p, with_condexpr));
        if (is_op(cur(p), OP_COMMA))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (args.n)
            return args.v[0];
        if (!explicit_parens)
            fail_unexpected(p, "an expression");
    }
    struct jnode *n = mk(p, E_TUPLE, line);
    n->items = args;
    return n;
}

/* ---- statements ---- */

static bool can_assign(const struct jnode *n)
{
    if (n->kind == E_NAME || n->kind == E_NSREF)
        return true;
    if (n->kind == E_TUPLE) {
        for (int i = 0; i < n->items.n; i++)
            if (n->items.v[i]->kind != E_NAME && n->items.v[i]->kind != E_TUPLE)
                return false;
            else if (!can_assign(n->items.v[i]))
                return false;
        return true;
    }
    return false;
}

static struct jnode *parse_assign_target(struct parser *p, const char *extra_end, bool with_ns)
{
    int line = cur(p)->line;
    struct jnode *t = parse_tuple(p, true, true, extra_end, false, with_ns);
    if (!can_assign(t))
        jfail(p->f, line, "can't assign to this expression");
    return t;
}

static void parse_statements(struct parser *p, const char *const *end_names, bool drop,
                             struct jnodes *body)
{
    skip_op(p, OP_COLON);
    expect_type(p, JT_BLOCK_END, "end of statement block");
    subparse(p, end_names, body);
    if (drop)
        next(p);
}

static void scan_names(const struct jnode *n, unsigned *flags);
static void scan_list(const struct jnodes *l, unsigned *flags)
{
    for (int i = 0; i < l->n; i++)
        scan_names(l->v[i], flags);
}
/* Which of caller / varargs / kwargs a macro body reads. */
static void scan_names(const struct jnode *n, unsigned *flags)
{
    if (!n)
        return;
    if (n->kind == E_NAME) {
        if (js_eq(n->name, "caller"))
            *flags |= NF_CALLER;
        else if (js_eq(n->name, "varargs"))
            *flags |= NF_VARARGS;
        else if (js_eq(n->name, "kwargs"))
            *flags |= NF_KWARGS;
        return;
    }
    if (n->kind == E_CALL && n->a && n->a->kind == E_NAME && js_eq(n->a->name, "caller"))
        *flags |= NF_CALLER;
    scan_names(n->a, flags);
    scan_names(n->b, flags);
    scan_names(n->c, flags);
    scan_names(n->d, flags);
    scan_list(&n->items, flags);
    scan_list(&n->kw, flags);
    scan_list(&n->body, flags);
    scan_list(&n->orelse, flags);
}

static void parse_signature(struct parser *p, struct jnode *n)
{
    expect_op(p, OP_LPAREN);
    bool defaults = false;
    while (!is_op(cur(p), OP_RPAREN)) {
        if (n->items.n)
            expect_op(p, OP_COMMA);
        struct jnode *arg = mk(p, E_NAME, cur(p)->line);
        arg->name = expect_name(p);
        if (skip_op(p, OP_ASSIGN)) {
            arg->a = parse_expression(p, true);
            defaults = true;
        } else if (defaults) {
            jfail(p->f, arg->line, "non-default argument follows default argument");
        }
        add(p, &n->items, arg);
    }
    expect_op(p, OP_RPAREN);
}

static struct jnode *parse_statement(struct parser *p)
{
    const struct jtoken *t = cur(p);
    if (t->type != JT_NAME)
        jfail(p->f, t->line, "tag name expected");
    int line = t->line;
    struct jstr *tag = t->str;
    struct jnode *n;
    if (p->nstack < (int)(sizeof p->stack / sizeof p->stack[0])) {
        p->stack[p->nstack].tag = tag->s;
        p->stack[p->nstack].line = line;
    }
    p->nstack++;
    enter(p);
    next(p);
    if (js_eq(tag, "for")) {
        static const char *const ends[] = {"endfor", "else", NULL};
        static const char *const ends2[] = {"endfor", NULL};
        n = mk(p, S_FOR, line);
        n->a = parse_assign_target(p, "in", false);
        expect_kw(p, "in");
        n->b = parse_tuple(p, false, false, "recursive", false, false);
        if (skip_name(p, "if"))
            n->c = parse_expression(p, true);
        if (skip_name(p, "recursive"))
            n->flags |= NF_RECURSIVE;
        p->loops++;
        parse_statements(p, ends, false, &n->body);
        p->loops--;
        if (js_eq(next(p)->str, "else"))
            parse_statements(p, ends2, true, &n->orelse);
    } else if (js_eq(tag, "if")) {
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        static const char *const ends2[] = {"endif", NULL};
        struct jnode *node = n = mk(p, S_IF, line);
        for (;;) {
            node->a = parse_tuple(p, false, false, NULL, false, false);
            parse_statements(p, ends, false, &node->body);
            const struct jtoken *e = next(p);
            if (js_eq(e->str, "elif")) {
                struct jnode *elif = mk(p, S_IF, cur(p)->line);
                add(p, &node->orelse, elif);
                node = elif;
                continue;
            }
            if (js_eq(e->str, "else"))
                parse_statements(p, ends2, true, &node->orelse);
            break;
        }
    } else if (js_eq(tag, "set")) {
        static const char *const ends[] = {"endset", NULL};
        struct jnode *target = parse_assign_target(p, NULL, true);
        if (skip_op(p, OP_ASSIGN)) {
            n = mk(p, S_SET, line);
            n->a = target;
            n->b = parse_tuple(p, false, true, NULL, false, false);
        } else {
            n = mk(p, S_SETBLOCK, line);
            n->a = target;
            n->c = parse_filter(p, NULL, false);
            int loops = p->loops;
            p->loops = 0;
            parse_statements(p, ends, true, &n->body);
            p->loops = loops;
        }
    } else if (js_eq(tag, "macro") || js_eq(tag, "call")) {
        static const char *const mends[] = {"endmacro", NULL};
        static const char *const cends[] = {"endcall", NULL};
        bool macro = js_eq(tag, "macro");
        n = mk(p, macro ? S_MACRO : S_CALLBLOCK, line);
        if (macro) {
            n->name = expect_name(p);
            parse_signature(p, n);
        } else {
            if (is_op(cur(p), OP_LPAREN))
                parse_signature(p, n);
            n->a = parse_expression(p, true);
            if (n->a->kind != E_CALL)
                jfail(p->f, line, "expected a call after 'call'");
        }
        int loops = p->loops;
        p->loops = 0;
        parse_statements(p, macro ? mends : cends, true, &n->body);
        p->loops = loops;
        scan_list(&n->body, &n->flags);
        for (int i = 0; i < n->items.n; i++) /* defaults may read them too */
            scan_names(n->items.v[i]->a, &n->flags);
    } else if (js_eq(tag, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        n = mk(p, S_FILTERBLOCK, line);
        n->c = parse_filter(p, NULL, true);
        parse_statements(p, ends, true, &n->body);
    } else if (js_eq(tag, "with")) {
        static const char *const ends[] = {"endwith", NULL};
        n = mk(p, S_WITH, line);
        while (cur(p)->type != JT_BLOCK_END) {
            if (n->items.n)
                expect_op(p, OP_COMMA);
            struct jnode *s = mk(p, S_SET, cur(p)->line);
            s->a = parse_assign_target(p, NULL, false);
            expect_op(p, OP_ASSIGN);
            s->b = parse_expression(p, true);
            add(p, &n->items, s);
        }
        parse_statements(p, ends, true, &n->body);
    } else if (js_eq(tag, "generation")) {
        /* transformers' AssistantTracker tag: renders its body in place */
        static const char *const ends[] = {"endgeneration", NULL};
        n = mk(p, S_SCOPE, line);
        n->flags = NF_SCOPED;
        parse_statements(p, ends, true, &n->body);
    } else if (js_eq(tag, "break") || js_eq(tag, "continue")) {
        if (!p->loops)
            jfail(p->f, line, "'%s' outside of a loop", tag->s);
        n = mk(p, js_eq(tag, "break") ? S_BREAK : S_CONTINUE, line);
    } else if (js_eq(tag, "print")) {
        n = mk(p, S_SCOPE, line); /* a plain statement list, no new scope */
        while (cur(p)->type != JT_BLOCK_END) {
            if (n->body.n)
                expect_op(p, OP_COMMA);
            struct jnode *pr = mk(p, S_PRINT, cur(p)->line);
            pr->a = parse_expression(p, true);
            add(p, &n->body, pr);
        }
    } else if (js_eq(tag, "include") || js_eq(tag, "import") || js_eq(tag, "from") ||
               js_eq(tag, "extends") || js_eq(tag, "block")) {
        jfail(p->f, line, "'%s' is not supported: a chat template is rendered on its own", tag->s);
    } else {
        p->nstack--;
        const char *open = p->nstack > 0 && p->nstack <= (int)(sizeof p->stack / sizeof p->stack[0])
                               ? p->stack[p->nstack - 1].tag
                               : NULL;
        if (!strncmp(tag->s, "end", 3) || js_eq(tag, "else") || js_eq(tag, "elif"))
            jfail(p->f, line, "unexpected '%s'%s%s%s", tag->s,
                  open ? " (the innermost open block is '" : "", open ? open : "",
                  open ? "')" : "");
        jfail(p->f, line, "unknown tag '%s'", tag->s);
    }
    p->nstack--;
    leave(p);
    return n;
}

static void subparse(struct parser *p, const char *const *end_names, struct jnodes *body)
{
    for (;;) {
        const struct jtoken *t = cur(p);
        switch (t->type) {
        case JT_EOF:
            if (end_names) {
                char want[128] = "";
                for (int i = 0; end_names[i]; i++) {
                    size_t k = strlen(want);
                    snprintf(want + k, sizeof want - k, "%s'%s'", i ? " or " : "", end_names[i]);
                }
                int top = p->nstack - 1;
                if (top >= 0 && top < (int)(sizeof p->stack / sizeof p->stack[0]))
                    jfail(p->f, t->line,
                          "unexpected end of template: expected %s to close the '%s' on line %d",
                          want, p->stack[top].tag, p->stack[top].line);
                jfail(p->f, t->line, "unexpected end of template: expected %s", want);
            }
            return;
        case JT_TEXT: {
            struct jnode *n = mk(p, S_TEXT, t->line);
            n->val = jv_s(t->str);
            add(p, body, n);
            next(p);
            break;
        }
        case JT_VAR_BEGIN: {
            next(p);
            struct jnode *n = mk(p, S_PRINT, t->line);
            n->a = parse_tuple(p, false, true, NULL, false, false);
            expect_type(p, JT_VAR_END, "end of print statement");
            add(p, body, n);
            break;
        }
        case JT_BLOCK_BEGIN:
            next(p);
            if (end_names && cur(p)->type == JT_NAME)
                for (int i = 0; end_names[i]; i++)
                    if (js_eq(cur(p)->str, end_names[i]))
                        return;
            add(p, body, parse_statement(p));
            expect_type(p, JT_BLOCK_END, "end of statement block");
            break;
        default: jfail(p->f, t->line, "unexpected '%s'", describe(t));
        }
    }
}

static bool has_slice(const struct jnode *n)
{
    if (!n)
        return false;
    if (n->kind == E_SLICE)
        return true;
    if (has_slice(n->a) || has_slice(n->b) || has_slice(n->c) || has_slice(n->d))
        return true;
    for (int i = 0; i < n->items.n; i++)
        if (has_slice(n->items.v[i]))
            return true;
    for (int i = 0; i < n->kw.n; i++)
        if (has_slice(n->kw.v[i]))
            return true;
    return false;
}

static void mark_expr(struct jnode *n, bool parent_const, bool output);
static void mark_list(struct jnodes *l, bool parent_const)
{
    for (int i = 0; i < l->n; i++)
        mark_expr(l->v[i], parent_const, false);
}

/* Flags the outermost constant expressions that slice (NF_FOLD): the
 * evaluator gives them the optimizer's semantics. Statements pass through. */
static void mark_expr(struct jnode *n, bool parent_const, bool output)
{
    if (!n)
        return;
    bool c = n->kind >= E_CONST && n->kind != E_KW && n->kind != E_OPERAND && is_const(n);
    if (c && !parent_const && has_slice(n))
        n->flags |= NF_FOLD | (output ? NF_OUTFOLD : 0);
    if (n->kind == S_PRINT) {
        mark_expr(n->a, false, true);
        return;
    }
    bool pc = c || (parent_const && (n->kind == E_KW || n->kind == E_OPERAND));
    mark_expr(n->a, pc, false);
    mark_expr(n->b, pc, false);
    mark_expr(n->c, pc, false);
    mark_expr(n->d, pc, false);
    mark_list(&n->items, pc);
    mark_list(&n->kw, pc);
    mark_list(&n->body, false);
    mark_list(&n->orelse, false);
}

struct jnode *jparse(struct jarena *a, struct jfail *f, const struct jtokens *t)
{
    struct parser p = {.a = a, .f = f, .t = t->v, .n = t->n};
    struct jnode *root = mk(&p, S_SCOPE, 1);
    subparse(&p, NULL, &root->body);
    mark_list(&root->body, false);
    return root;
}
