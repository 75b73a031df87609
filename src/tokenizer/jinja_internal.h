/* jinja_internal.h - what the Jinja interpreter's files share (not a public
 * contract; see jinja.h): the error jump and arena, values, tokens, the
 * syntax tree, the render state and the calls between lexer, parser,
 * evaluator and builtins.
 *
 * Memory and errors: a compile and a render each own one arena; everything
 * they allocate lives there and goes away at once at the end. Any error
 * (syntax, type, limits, raise_exception) longjmps back to jinja_compile /
 * jinja_render, which frees the arena, so no code on the way needs cleanup
 * paths. (The one other catcher is a lazy generator filter, which keeps an
 * error for whoever reads it, as Jinja2's generators do.) Values are small
 * structs passed by value; strings, lists and dicts are arena objects that
 * are never freed individually. A compiled template is read-only while it
 * renders, so threads can share it. */
#ifndef CLLM_TOKENIZER_JINJA_INTERNAL_H
#define CLLM_TOKENIZER_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "tokenizer/jinja.h"

/* ---- errors ---- */

struct jfail {
    jmp_buf *jb; /* where errors jump: the entry point, or a filter catching them */
    struct err *e;
    int line; /* the line being worked on, for errors raised without one */
};
/* Formats "template line N: reason" into f->e and jumps out (line <= 0:
 * f->line). */
_Noreturn void jfail(struct jfail *f, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- arena ---- */

struct jblock;
struct jarena {
    struct jblock *blocks;
    char *cur;
    size_t left;
    size_t used, limit; /* bytes taken from malloc; 0 limit = none */
    struct jfail *fail;
};
void *ja_alloc(struct jarena *a, size_t n);     /* zeroed, 16-aligned */
void *ja_alloc_raw(struct jarena *a, size_t n); /* not zeroed */
void *ja_grow(struct jarena *a, void *p, size_t old, size_t n);
void ja_free_all(struct jarena *a);

/* ---- values ---- */

enum jv_kind {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST, /* list, tuple, iterator, dict view, range: see jlist.kind */
    JV_DICT,
    JV_NS,      /* namespace(): a dict whose attributes can be set */
    JV_FUNC,    /* macro, caller, global function, bound method, joiner */
    JV_LOOP,    /* the `loop` variable */
    JV_MISSING, /* internal: an argument that was not passed */
};

struct jstr {
    size_t len;
    int64_t ncp; /* code points; -1 until counted */
    char s[];    /* NUL-terminated, may hold NULs */
};

enum jlist_kind { JL_LIST, JL_TUPLE, JL_ITER, JL_ITEMS, JL_KEYS, JL_VALUES, JL_RANGE };

typedef struct jv jv;
struct jlist;
struct jdict;
struct jfunc;
struct jloop;
struct jundef;

struct jv {
    uint8_t k; /* enum jv_kind */
    union {
        bool b;
        int64_t i;
        double f;
        struct jstr *s;
        struct jlist *l;
        struct jdict *d;
        struct jfunc *fn;
        struct jloop *loop;
        struct jundef *u; /* NULL: plain Undefined */
    } u;
};

struct jlist {
    int kind; /* enum jlist_kind */
    size_t n, cap;
    size_t pos; /* JL_ITER: items before pos were consumed */
    jv *v;
    int64_t r[3];       /* JL_RANGE: start, stop, step (for repr) */
    const char *poison; /* JL_ITER: the error Jinja2's lazy generator raises
                           when it is consumed past its n items */
};

struct jdict {
    size_t n, cap;
    jv *k, *v;
};

/* Why a value is undefined, for the error raised when it is used. */
struct jundef {
    const char *hint;    /* a full message, or NULL */
    const char *objtype; /* "dict object"...; NULL when a name was undefined */
    jv name;             /* the name, attribute or key */
    bool security;       /* SecurityError (unsafe attribute) */
};

struct jrender;
struct jargs {
    int npos, nkw;
    jv *pos;
    struct jstr **kwn;
    jv *kwv;
};
/* Filters get the filtered value in self, tests the tested value, methods
 * the receiver; globals ignore it. */
typedef jv (*jbuiltin_fn)(struct jrender *r, int line, jv self, const struct jargs *a);
struct jbuiltin {
    const char *name;
    jbuiltin_fn fn;
};

enum jfunc_kind { JF_MACRO, JF_BUILTIN, JF_METHOD, JF_JOINER };
struct jnode;
struct jscope;
struct jfunc {
    int kind;
    const struct jnode *node;  /* JF_MACRO: the S_MACRO or S_CALLBLOCK node */
    struct jscope *closure;    /* JF_MACRO */
    const struct jbuiltin *bi; /* JF_BUILTIN, JF_METHOD */
    jv self;                   /* JF_METHOD receiver, JF_JOINER separator */
    bool used;                 /* JF_JOINER */
};

struct jloop {
    jv *items;
    size_t n, i; /* i: index0 */
    int depth0;
    const struct jnode *node; /* the S_FOR node, for recursive loops */
    struct jscope *outer;
    jv changed_last;
    bool changed_set;
};

static inline jv jv_undef(void) { return (jv){.k = JV_UNDEF}; }
static inline jv jv_none(void) { return (jv){.k = JV_NONE}; }
static inline jv jv_missing(void) { return (jv){.k = JV_MISSING}; }
static inline jv jv_bool(bool b) { return (jv){.k = JV_BOOL, .u.b = b}; }
static inline jv jv_int(int64_t i) { return (jv){.k = JV_INT, .u.i = i}; }
static inline jv jv_float(double f) { return (jv){.k = JV_FLOAT, .u.f = f}; }
static inline jv jv_s(struct jstr *s) { return (jv){.k = JV_STR, .u.s = s}; }
static inline jv jv_l(struct jlist *l) { return (jv){.k = JV_LIST, .u.l = l}; }
static inline jv jv_d(struct jdict *d) { return (jv){.k = JV_DICT, .u.d = d}; }
static inline bool jv_is_str(jv v) { return v.k == JV_STR; }
static inline bool jv_is_num(jv v) { return v.k == JV_BOOL || v.k == JV_INT || v.k == JV_FLOAT; }
static inline bool jv_is_seq(jv v) { return v.k == JV_LIST; }

/* ---- the render state ---- */

struct jscope {
    struct jscope *parent;
    int n, cap;
    struct jstr **names;
    jv *vals;
};

struct jrender {
    struct jfail fail;
    struct err err; /* fail.e points here; copied out at the end */
    struct jarena arena;
    const struct jinja_template *tpl;
    struct jdict *vars;
    uint64_t steps, max_steps;
    int depth, max_depth; /* macro / caller / recursive-loop calls */
    int edepth;           /* nested expression evaluation */
    int folding;          /* inside a constant expression Jinja2 folds */
    size_t max_output;
    time_t now;
};

/* Growable byte buffer in the render arena. */
struct jbuf {
    struct jrender *r;
    char *p;
    size_t n, cap;
};
void jb_init(struct jbuf *b, struct jrender *r);
void jb_add(struct jbuf *b, const void *p, size_t n);
void jb_addc(struct jbuf *b, char c);
void jb_adds(struct jbuf *b, const char *s);
void jb_printf(struct jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
struct jstr *jb_str(struct jbuf *b); /* the contents as a string */

/* ---- strings and text (jinja_value.c) ---- */

struct jstr *js_new(struct jarena *a, const char *p, size_t len);
struct jstr *js_alloc(struct jarena *a, size_t len); /* contents uninitialised */
struct jstr *js_lit(struct jarena *a, const char *z);
jv jv_str(struct jrender *r, const char *p, size_t len);
jv jv_strz(struct jrender *r, const char *z);
bool js_eq(const struct jstr *s, const char *z);
int64_t js_ncp(struct jstr *s); /* number of code points */
/* Decodes one UTF-8 code point at p (valid UTF-8 assumed); returns its length. */
int ju_decode(const char *p, const char *end, uint32_t *cp);
int ju_encode(uint32_t cp, char *out);
bool ju_valid(const char *p, size_t n);
bool ju_isspace(uint32_t cp);   /* Python str.isspace() */
uint32_t ju_upper(uint32_t cp); /* simple case mappings (utf8proc) */
uint32_t ju_lower(uint32_t cp);
bool ju_isalpha(uint32_t cp);     /* Unicode letters */
bool ju_isalnum(uint32_t cp);     /* letters and numbers: Python's isalnum, re's \w */
bool ju_isdigit(uint32_t cp);     /* ASCII digits */
bool ju_islower(uint32_t cp);     /* category Ll */
bool ju_isupper(uint32_t cp);     /* category Lu */
bool ju_iscased(uint32_t cp);     /* Lu, Ll, Lt */
bool ju_isprintable(uint32_t cp); /* Python str.isprintable() */
/* Byte offset of code point index i (0 <= i <= ncp). */
size_t js_offset(struct jstr *s, int64_t i);

/* Python repr(float) / json.dumps(float) text. */
void jfmt_float(double f, bool json, char out[40]);

/* ---- values (jinja_value.c) ---- */

struct jlist *jl_new(struct jrender *r, int kind, size_t cap);
void jl_push(struct jrender *r, struct jlist *l, jv v);
struct jdict *jd_new(struct jrender *r, size_t cap);
bool jd_get(struct jrender *r, const struct jdict *d, jv key, jv *out);
bool jd_get_str(const struct jdict *d, const char *k, size_t len, jv *out);
void jd_set(struct jrender *r, struct jdict *d, jv key, jv val);
jv jv_from_json(struct jrender *r, const json_t *j);

jv jv_undef_name(struct jrender *r, struct jstr *name);
jv jv_undef_attr(struct jrender *r, jv obj, jv name);
jv jv_undef_hint(struct jrender *r, const char *hint);
/* Raises the error an undefined value carries ("'x' is undefined"). */
_Noreturn void jv_undef_fail(struct jrender *r, int line, jv u);

const char *jv_type_name(jv v); /* Python type(x).__name__ */
const char *jv_obj_repr(jv v);  /* Jinja2 object_type_repr: "dict object" */
bool jv_truthy(jv v);
bool jv_eq(struct jrender *r, jv a, jv b);
/* <0, 0, >0 like Python's <; op ("<", ">=", ...) names the error. */
int jv_cmp(struct jrender *r, int line, const char *op, jv a, jv b);
bool jv_hashable(jv v);
void jv_write_str(struct jrender *r, jv v, struct jbuf *b);  /* str(v) */
void jv_write_repr(struct jrender *r, jv v, struct jbuf *b); /* repr(v) */
struct jstr *jv_to_str(struct jrender *r, jv v);
struct jtojson {
    const char *indent; /* NULL: compact */
    const char *item_sep, *key_sep;
    bool ensure_ascii, sort_keys;
};
void jv_write_json(struct jrender *r, int line, jv v, const struct jtojson *o, struct jbuf *b);
/* Materializes an iterable (consumes an iterator): items and count. */
void jv_check_poison(struct jrender *r, int line, jv v);
void jv_iterate(struct jrender *r, int line, jv v, jv **items, size_t *n);
int64_t jv_len(struct jrender *r, int line, jv v);

/* ---- lexer and parser ---- */

enum jtok_type {
    JT_EOF,
    JT_TEXT,
    JT_VAR_BEGIN,
    JT_VAR_END,
    JT_BLOCK_BEGIN,
    JT_BLOCK_END,
    JT_NAME,
    JT_STRING,
    JT_INT,
    JT_FLOAT,
    JT_OP,
};
enum jop {
    OP_NONE,
    OP_ADD,
    OP_SUB,
    OP_DIV,
    OP_FLOORDIV,
    OP_MUL,
    OP_MOD,
    OP_POW,
    OP_TILDE,
    OP_LBRACKET,
    OP_RBRACKET,
    OP_LPAREN,
    OP_RPAREN,
    OP_LBRACE,
    OP_RBRACE,
    OP_EQ,
    OP_NE,
    OP_GT,
    OP_GTEQ,
    OP_LT,
    OP_LTEQ,
    OP_ASSIGN,
    OP_DOT,
    OP_COLON,
    OP_PIPE,
    OP_COMMA,
    OP_SEMICOLON,
    /* comparison operators only in the tree */
    OP_IN,
    OP_NOTIN,
};
struct jtoken {
    int type, op, line;
    struct jstr *str; /* JT_NAME, JT_STRING, JT_TEXT */
    int64_t i;
    double f;
};
struct jtokens {
    struct jtoken *v;
    size_t n, cap;
};
/* Splits a template into tokens with Jinja2's whitespace control (-, +,
 * trim_blocks, lstrip_blocks, one trailing newline dropped). */
void jlex(struct jarena *a, struct jfail *f, const char *src, size_t len, struct jtokens *out);
const char *jop_text(int op);

enum jnode_kind {
    /* statements */
    S_TEXT,
    S_PRINT,
    S_IF,
    S_FOR,
    S_SET,
    S_SETBLOCK,
    S_MACRO,
    S_CALLBLOCK,
    S_FILTERBLOCK,
    S_WITH,
    S_BREAK,
    S_CONTINUE,
    S_SCOPE,
    /* expressions */
    E_CONST,
    E_NAME,
    E_NSREF,
    E_LIST,
    E_TUPLE,
    E_DICT,
    E_GETATTR,
    E_GETITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_NOT,
    E_NEG,
    E_POS,
    E_BIN,
    E_AND,
    E_OR,
    E_CONCAT,
    E_COMPARE,
    E_OPERAND,
    E_COND,
    E_KW,
};
enum {
    NF_RECURSIVE = 1,
    NF_CALLER = 2,
    NF_VARARGS = 4,
    NF_KWARGS = 8,
    NF_SCOPED = 16,
    NF_FOLD = 32,    /* a constant expression with a constant slice in it */
    NF_OUTFOLD = 64, /* ... printed by {{ }} as it is */
};

struct jnodes {
    struct jnode **v;
    int n, cap;
};
/* One node type for the whole tree; which fields mean what:
 *   S_TEXT val | S_PRINT a | S_IF a test, body, orelse (elif = nested S_IF)
 *   S_FOR a target, b iterable, c filter or NULL, body, orelse, NF_RECURSIVE
 *   S_SET a target, b value | S_SETBLOCK a target, c filter chain, body
 *   S_MACRO name, items params (E_NAME, a = default), body, NF_* flags
 *   S_CALLBLOCK a the E_CALL, items caller params, body, NF_* flags
 *   S_FILTERBLOCK c filter chain (innermost a NULL), body
 *   S_WITH items S_SET nodes, body | S_SCOPE body, NF_SCOPED: in a new scope
 *   E_CONST val | E_NAME name | E_NSREF name, attr | E_LIST/E_TUPLE items
 *   E_DICT items key, value, key, value... | E_GETATTR a, attr
 *   E_GETITEM a, b | E_SLICE a start, b stop, c step (each may be NULL)
 *   E_CALL a callee, items, kw (E_KW name a), c *args, d **kwargs
 *   E_FILTER a input (NULL: the block's text), name, fn, items, kw, c, d
 *   E_TEST a subject, name, fn, items, kw, c, d
 *   E_NOT/E_NEG/E_POS a | E_BIN op, a, b | E_AND/E_OR a, b
 *   E_CONCAT items | E_COMPARE a, items (E_OPERAND op a) | E_COND a if b else c */
struct jnode {
    int kind, op, line;
    unsigned flags;
    jv val;
    struct jstr *name, *attr;
    const struct jbuiltin *fn;
    struct jnode *a, *b, *c, *d;
    struct jnodes items, kw, body, orelse;
};
struct jnode *jparse(struct jarena *a, struct jfail *f, const struct jtokens *t);

struct jinja_template {
    struct jarena arena;
    struct jnode *root;
};

/* ---- evaluator (jinja_eval.c) ---- */

void jstep(struct jrender *r, int line); /* counts work against the step limit */
jv jeval(struct jrender *r, const struct jnode *n, struct jscope *sc);
jv jcall(struct jrender *r, int line, jv callee, const struct jargs *a);
jv jgetattr(struct jrender *r, int line, jv obj, struct jstr *name);
jv jgetitem(struct jrender *r, int line, jv obj, jv key);
jv jbinop(struct jrender *r, int line, int op, jv a, jv b);
/* Renders the template's root statement list into out. */
void jrun(struct jrender *r, const struct jnode *root, struct jbuf *out);
/* Maps a call's arguments onto named parameters (fname names errors);
 * out[i] is JV_MISSING for those not passed. Extra positional arguments
 * are an error unless rest is non-NULL (then they go there). */
void jbind(struct jrender *r, int line, const char *fname, const char *const *params, int np,
           const struct jargs *a, jv *out, struct jargs *rest);

/* ---- builtins (jinja_filters.c, jinja_methods.c) ---- */

/* The entry called name of a {NULL, NULL}-terminated table, or NULL. */
const struct jbuiltin *jbuiltin_find(const struct jbuiltin *t, const char *name);
const struct jbuiltin *jfilter_find(const char *name);
const struct jbuiltin *jtest_find(const char *name);
const struct jbuiltin *jglobal_find(const char *name);
/* A method of a str / dict / list / tuple receiver, or NULL. *unsafe is set
 * for methods the immutable sandbox refuses (list.append, dict.update...). */
const struct jbuiltin *jmethod_find(jv recv, const char *name, bool *unsafe);
jv jcall_filter(struct jrender *r, int line, const char *name, jv v, const struct jargs *a);
bool jcall_test(struct jrender *r, int line, const char *name, jv v, const struct jargs *a);

/* Python str helpers shared by filters and methods. */
struct jstr *jpy_strip(struct jrender *r, struct jstr *s, struct jstr *chars, bool left,
                       bool right);
struct jstr *jpy_case(struct jrender *r, struct jstr *s,
                      int mode); /* 0 lower 1 upper 2 capitalize 3 title 4 swapcase */
struct jstr *jpy_replace(struct jrender *r, int line, struct jstr *s, struct jstr *old,
                         struct jstr *new_, int64_t count);
int64_t jpy_int_arg(struct jrender *r, int line, jv v, const char *what);
jv jpy_percent(struct jrender *r, int line, struct jstr *fmt, jv args); /* fmt % args */

#endif
