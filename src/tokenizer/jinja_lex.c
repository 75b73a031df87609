/* jinja_lex.c - splits a Jinja template into tokens the way Jinja2's lexer
 * does with transformers' settings: text, {{ }}, {% %}, {# #} and raw
 * blocks; whitespace control by "-" and "+", trim_blocks (drop the newline
 * after a block tag) and lstrip_blocks (drop the indentation before one);
 * newlines normalized to \n and one trailing newline dropped. */
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"
#include "tokenizer/jinja_internal.h"

struct lexer {
    struct jarena *a;
    struct jfail *f;
    const char *s;
    size_t n, pos;
    int line;           /* line at pos */
    bool line_starting; /* the last tag ended with a newline */
    struct jtokens *out;
    char balance[256]; /* open brackets inside the current tag */
    int nbalance;
};

static const struct {
    const char *text;
    int op;
} ops[] = {
    {"//", OP_FLOORDIV}, {"**", OP_POW},   {"==", OP_EQ},      {"!=", OP_NE},      {">=", OP_GTEQ},
    {"<=", OP_LTEQ},     {"+", OP_ADD},    {"-", OP_SUB},      {"/", OP_DIV},      {"*", OP_MUL},
    {"%", OP_MOD},       {"~", OP_TILDE},  {"[", OP_LBRACKET}, {"]", OP_RBRACKET}, {"(", OP_LPAREN},
    {")", OP_RPAREN},    {"{", OP_LBRACE}, {"}", OP_RBRACE},   {">", OP_GT},       {"<", OP_LT},
    {"=", OP_ASSIGN},    {".", OP_DOT},    {":", OP_COLON},    {"|", OP_PIPE},     {",", OP_COMMA},
    {";", OP_SEMICOLON},
};

const char *jop_text(int op)
{
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (ops[i].op == op)
            return ops[i].text;
    return op == OP_IN ? "in" : op == OP_NOTIN ? "not in" : "?";
}

static void advance(struct lexer *lx, size_t to)
{
    for (size_t i = lx->pos; i < to; i++)
        lx->line += lx->s[i] == '\n';
    lx->pos = to;
}

static bool at(const struct lexer *lx, size_t pos, const char *lit)
{
    size_t k = strlen(lit);
    return pos + k <= lx->n && memcmp(lx->s + pos, lit, k) == 0;
}

/* Length of the (Python \s) whitespace character at pos, or 0. */
static int ws_at(const struct lexer *lx, size_t pos)
{
    if (pos >= lx->n)
        return 0;
    uint32_t c;
    int len = ju_decode(lx->s + pos, lx->s + lx->n, &c);
    return ju_isspace(c) ? len : 0;
}

static size_t skip_ws(const struct lexer *lx, size_t pos)
{
    int k;
    while ((k = ws_at(lx, pos)) > 0)
        pos += (size_t)k;
    return pos;
}

static struct jtoken *push(struct lexer *lx, int type, int line)
{
    struct jtokens *t = lx->out;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        t->v = ja_grow(lx->a, t->v, t->cap * sizeof *t->v, cap * sizeof *t->v);
        t->cap = cap;
    }
    struct jtoken *tok = &t->v[t->n++];
    memset(tok, 0, sizeof *tok);
    tok->type = type;
    tok->line = line;
    return tok;
}

/* Emits template text, applying the whitespace control of the tag that
 * follows it (sign '-', '+' or 0) and lstrip_blocks for block/comment tags. */
static void emit_text(struct lexer *lx, size_t from, size_t to, char sign, bool lstrip_ok, int line)
{
    const char *s = lx->s;
    if (sign == '-') {
        /* Python str.rstrip(): drop trailing whitespace of any kind */
        size_t end = to;
        while (end > from) {
            size_t k = end - 1;
            while (k > from && ((unsigned char)s[k] & 0xc0) == 0x80)
                k--;
            uint32_t c;
            ju_decode(s + k, s + end, &c);
            if (!ju_isspace(c))
                break;
            end = k;
        }
        to = end;
    } else if (sign != '+' && lstrip_ok) {
        size_t l_pos = from;
        for (size_t i = to; i > from; i--)
            if (s[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        if ((l_pos > from || lx->line_starting) && l_pos < to) {
            size_t p = l_pos;
            int k;
            while (p < to && (k = ws_at(lx, p)) > 0)
                p += (size_t)k;
            if (p == to)
                to = l_pos;
        }
    }
    if (to > from) {
        struct jtoken *t = push(lx, JT_TEXT, line);
        t->str = js_new(lx->a, s + from, to - from);
    }
}

/* Decodes a string literal's body like Python's unicode-escape codec. */
static struct jstr *unescape(struct lexer *lx, const char *p, size_t n, int line)
{
    /* at most 3x: "\é" (3 bytes) becomes the 5 characters \\xe9, and
     * "\<4-byte char>" (5 bytes) the 11 characters \\U0001f600 */
    struct jstr *out = js_alloc(lx->a, n * 3 + 16);
    char *o = out->s;
    const char *end = p + n;
    while (p < end) {
        if (*p != '\\' || p + 1 >= end) {
            *o++ = *p++;
            continue;
        }
        char c = p[1];
        p += 2;
        uint32_t cp;
        switch (c) {
        case '\n': continue;
        case '\\': *o++ = '\\'; continue;
        case '\'': *o++ = '\''; continue;
        case '"': *o++ = '"'; continue;
        case 'a': *o++ = '\a'; continue;
        case 'b': *o++ = '\b'; continue;
        case 'f': *o++ = '\f'; continue;
        case 'n': *o++ = '\n'; continue;
        case 'r': *o++ = '\r'; continue;
        case 't': *o++ = '\t'; continue;
        case 'v': *o++ = '\v'; continue;
        case 'x':
        case 'u':
        case 'U': {
            int want = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            cp = 0;
            for (int i = 0; i < want; i++) {
                int h = p + i < end ? hex_value(p[i]) : -1;
                if (h < 0)
                    jfail(lx->f, line, "truncated \\%cXX escape in a string", c);
                cp = cp * 16 + (uint32_t)h;
            }
            p += want;
            if (cp > 0x10ffff)
                jfail(lx->f, line, "illegal Unicode character in a string");
            if (cp >= 0xd800 && cp <= 0xdfff)
                jfail(lx->f, line, "a string escapes a lone surrogate (U+%04X)", cp);
            break;
        }
        case 'N': jfail(lx->f, line, "\\N{...} escapes are not supported");
        default:
            if (c >= '0' && c <= '7') {
                cp = (uint32_t)(c - '0');
                for (int i = 0; i < 2 && p < end && *p >= '0' && *p <= '7'; i++)
                    cp = cp * 8 + (uint32_t)(*p++ - '0');
                break;
            }
            if ((unsigned char)c >= 0x80) {
                /* backslashreplace turned the character into \xNN / \uNNNN
                 * text before decoding: the backslash stays, so does that */
                uint32_t u;
                int len = ju_decode(p - 1, end, &u);
                p += len - 1;
                char tmp[16];
                int k = u <= 0xff     ? snprintf(tmp, sizeof tmp, "\\x%02x", u)
                        : u <= 0xffff ? snprintf(tmp, sizeof tmp, "\\u%04x", u)
                                      : snprintf(tmp, sizeof tmp, "\\U%08x", u);
                *o++ = '\\';
                memcpy(o, tmp, (size_t)k);
                o += k;
                continue;
            }
            *o++ = '\\';
            *o++ = c;
            continue;
        }
        o += ju_encode(cp, o);
    }
    out->len = (size_t)(o - out->s);
    *o = 0;
    return out;
}

/* One digit group: \d+ with single underscores between digits. */
static size_t digits(const struct lexer *lx, size_t p, bool (*ok)(char))
{
    size_t start = p;
    if (p >= lx->n || !ok(lx->s[p]))
        return start;
    while (p < lx->n) {
        if (ok(lx->s[p]))
            p++;
        else if (lx->s[p] == '_' && p + 1 < lx->n && ok(lx->s[p + 1]))
            p++;
        else
            break;
    }
    return p;
}
static bool is_dec(char c) { return c >= '0' && c <= '9'; }
static bool is_bin(char c) { return c == '0' || c == '1'; }
static bool is_oct(char c) { return c >= '0' && c <= '7'; }
static bool is_hex(char c) { return hex_value(c) >= 0; }

static void lex_number(struct lexer *lx, int line)
{
    const char *s = lx->s;
    size_t p = lx->pos, end;
    char buf[128];
    /* float: digits, then .digits and/or an exponent (not right after a dot) */
    if (p == 0 || s[p - 1] != '.') {
        size_t q = digits(lx, p, is_dec);
        bool frac = false, expo = false;
        size_t r = q;
        if (r < lx->n && s[r] == '.' && digits(lx, r + 1, is_dec) > r + 1) {
            r = digits(lx, r + 1, is_dec);
            frac = true;
        }
        if (r < lx->n && (s[r] == 'e' || s[r] == 'E')) {
            size_t e = r + 1;
            if (e < lx->n && (s[e] == '+' || s[e] == '-'))
                e++;
            size_t d = digits(lx, e, is_dec);
            if (d > e) {
                r = d;
                expo = true;
            }
        }
        if (frac || expo) {
            size_t k = 0;
            for (size_t i = p; i < r && k + 1 < sizeof buf; i++)
                if (s[i] != '_')
                    buf[k++] = s[i];
            buf[k] = 0;
            struct jtoken *t = push(lx, JT_FLOAT, line);
            t->f = strtod(buf, NULL);
            advance(lx, r);
            return;
        }
    }
    int base = 10;
    if (s[p] == '0' && p + 1 < lx->n && strchr("bBoOxX", s[p + 1]) && s[p + 1]) {
        char b = (char)(s[p + 1] | 32);
        base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
        bool (*ok)(char) = base == 2 ? is_bin : base == 8 ? is_oct : is_hex;
        size_t q = p + 2;
        if (q < lx->n && s[q] == '_')
            q++;
        end = digits(lx, q, ok);
        if (end == q) { /* "0x" with no digits: just the 0 */
            base = 10;
            end = p + 1;
        } else {
            p += 2;
        }
    } else if (s[p] == '0') {
        end = p + 1;
        while (end < lx->n &&
               (s[end] == '0' || (s[end] == '_' && end + 1 < lx->n && s[end + 1] == '0')))
            end++;
    } else {
        end = digits(lx, p, is_dec);
    }
    size_t k = 0;
    for (size_t i = p; i < end && k + 1 < sizeof buf; i++)
        if (s[i] != '_')
            buf[k++] = s[i];
    buf[k] = 0;
    int64_t v = 0;
    for (size_t i = 0; i < k; i++) {
        int d = hex_value(buf[i]);
        if (v > (INT64_MAX - d) / base)
            jfail(lx->f, line, "integer literal too large");
        v = v * base + d;
    }
    struct jtoken *t = push(lx, JT_INT, line);
    t->i = v;
    advance(lx, end);
}

static bool name_start(unsigned char c)
{
    return c == '_' || (unsigned)((c | 32) - 'a') < 26u || c >= 0x80;
}
static bool name_char(unsigned char c) { return name_start(c) || (c >= '0' && c <= '9'); }

/* Tokens of one {{ }} or {% %} tag, up to and including its end. */
static void lex_tag(struct lexer *lx, bool block)
{
    const char *s = lx->s;
    lx->nbalance = 0;
    for (;;) {
        size_t p = lx->pos;
        int line = lx->line;
        if (p >= lx->n)
            jfail(lx->f, line, "unexpected end of template: a '%s' tag is not closed",
                  block ? "{%" : "{{");
        if (lx->nbalance == 0) {
            size_t end = 0;
            if (block && at(lx, p, "+%}")) {
                end = p + 3;
            } else if (at(lx, p, block ? "-%}" : "-}}")) {
                end = skip_ws(lx, p + 3);
            } else if (at(lx, p, block ? "%}" : "}}")) {
                end = p + 2;
                if (block && end < lx->n && s[end] == '\n')
                    end++; /* trim_blocks */
            }
            if (end) {
                push(lx, block ? JT_BLOCK_END : JT_VAR_END, line);
                lx->line_starting = s[end - 1] == '\n';
                advance(lx, end);
                return;
            }
        }
        int w = ws_at(lx, p);
        if (w) {
            advance(lx, skip_ws(lx, p));
            continue;
        }
        unsigned char c = (unsigned char)s[p];
        if (c >= '0' && c <= '9') {
            lex_number(lx, line);
            continue;
        }
        if (name_start(c)) {
            size_t q = p;
            while (q < lx->n && name_char((unsigned char)s[q]) && !ws_at(lx, q))
                q++;
            struct jtoken *t = push(lx, JT_NAME, line);
            t->str = js_new(lx->a, s + p, q - p);
            advance(lx, q);
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t q = p + 1;
            while (q < lx->n && s[q] != (char)c) {
                if (s[q] == '\\' && q + 1 < lx->n)
                    q++;
                q++;
            }
            if (q >= lx->n)
                jfail(lx->f, line, "unterminated string");
            struct jtoken *t = push(lx, JT_STRING, line);
            t->str = unescape(lx, s + p + 1, q - p - 1, line);
            advance(lx, q + 1);
            continue;
        }
        int op = 0;
        size_t oplen = 0;
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
            if (at(lx, p, ops[i].text)) {
                op = ops[i].op;
                oplen = strlen(ops[i].text);
                break;
            }
        if (!op) {
            uint32_t cp;
            ju_decode(s + p, s + lx->n, &cp);
            jfail(lx->f, line, "unexpected character '%.*s'", cp < 0x80 ? 1 : 4, s + p);
        }
        if (op == OP_LBRACE || op == OP_LPAREN || op == OP_LBRACKET) {
            if (lx->nbalance == (int)sizeof lx->balance)
                jfail(lx->f, line, "brackets nest too deeply");
            lx->balance[lx->nbalance++] = op == OP_LBRACE ? '}' : op == OP_LPAREN ? ')' : ']';
        } else if (op == OP_RBRACE || op == OP_RPAREN || op == OP_RBRACKET) {
            char want = (char)c;
            if (lx->nbalance == 0)
                jfail(lx->f, line, "unexpected '%c'", want);
            char expected = lx->balance[--lx->nbalance];
            if (expected != want)
                jfail(lx->f, line, "unexpected '%c', expected '%c'", want, expected);
        }
        struct jtoken *t = push(lx, JT_OP, line);
        t->op = op;
        advance(lx, p + oplen);
    }
}

/* {% raw %}...{% endraw %}: the position of the end tag and its parts. */
static bool find_endraw(const struct lexer *lx, size_t from, size_t *tag, char *sign, size_t *after)
{
    for (size_t j = from; j + 1 < lx->n; j++) {
        if (lx->s[j] != '{' || lx->s[j + 1] != '%')
            continue;
        size_t k = j + 2;
        char sg = 0;
        if (k < lx->n && (lx->s[k] == '-' || lx->s[k] == '+'))
            sg = lx->s[k++];
        k = skip_ws(lx, k);
        if (!at(lx, k, "endraw"))
            continue;
        k = skip_ws(lx, k + 6);
        size_t end = 0;
        if (at(lx, k, "+%}"))
            end = k + 3;
        else if (at(lx, k, "-%}"))
            end = skip_ws(lx, k + 3);
        else if (at(lx, k, "%}")) {
            end = k + 2;
            if (end < lx->n && lx->s[end] == '\n')
                end++;
        }
        if (!end)
            continue;
        *tag = j;
        *sign = sg;
        *after = end;
        return true;
    }
    return false;
}

void jlex(struct jarena *a, struct jfail *f, const char *src, size_t len, struct jtokens *out)
{
    /* newlines: \r\n and \r become \n; one trailing newline goes */
    char *s = ja_alloc_raw(a, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    s[n] = 0;

    struct lexer lx = {
        .a = a, .f = f, .s = s, .n = n, .line = 1, .line_starting = true, .out = out};
    memset(out, 0, sizeof *out);
    while (lx.pos < lx.n) {
        size_t q = lx.pos;
        const char *hit = NULL;
        while (q + 1 < lx.n) {
            hit = memchr(s + q, '{', lx.n - q - 1);
            if (!hit)
                break;
            q = (size_t)(hit - s);
            if (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')
                break;
            q++;
            hit = NULL;
        }
        if (!hit) {
            emit_text(&lx, lx.pos, lx.n, 0, false, lx.line);
            advance(&lx, lx.n);
            break;
        }
        char kind = s[q + 1];
        size_t after = q + 2;
        char sign = 0;
        if (after < lx.n && (s[after] == '-' || s[after] == '+'))
            sign = s[after++];
        int text_line = lx.line;

        /* {% raw %} */
        size_t raw_end = 0;
        if (kind == '%') {
            size_t k = skip_ws(&lx, after);
            if (at(&lx, k, "raw")) {
                k = skip_ws(&lx, k + 3);
                if (at(&lx, k, "-%}"))
                    raw_end = skip_ws(&lx, k + 3);
                else if (at(&lx, k, "%}"))
                    raw_end = k + 2;
            }
        }
        emit_text(&lx, lx.pos, q, sign, kind != '{', text_line);
        advance(&lx, q);
        int tag_line = lx.line;

        if (raw_end) {
            lx.line_starting = s[raw_end - 1] == '\n';
            advance(&lx, raw_end);
            size_t tag, end;
            char esign;
            if (!find_endraw(&lx, lx.pos, &tag, &esign, &end))
                jfail(f, tag_line, "missing end of raw directive");
            emit_text(&lx, lx.pos, tag, esign, true, lx.line);
            lx.line_starting = s[end - 1] == '\n';
            advance(&lx, end);
            continue;
        }
        if (kind == '#') {
            const char *e = NULL;
            size_t from = after;
            while (from + 1 < lx.n) {
                e = memchr(s + from, '#', lx.n - from - 1);
                if (!e)
                    break;
                if (e[1] == '}')
                    break;
                from = (size_t)(e - s) + 1;
                e = NULL;
            }
            if (!e)
                jfail(f, tag_line, "missing end of comment tag");
            size_t j = (size_t)(e - s), end = j + 2;
            char esign = j > after ? s[j - 1] : 0;
            if (esign == '-')
                end = skip_ws(&lx, end);
            else if (esign != '+' && end < lx.n && s[end] == '\n')
                end++;
            lx.line_starting = s[end - 1] == '\n';
            advance(&lx, end);
            continue;
        }
        push(&lx, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, tag_line);
        advance(&lx, after);
        lex_tag(&lx, kind == '%');
    }
    push(&lx, JT_EOF, lx.line);
    /* count code points now: renders share these strings and must not
     * write to them (js_ncp caches its count) */
    for (size_t i = 0; i < out->n; i++)
        if (out->v[i].str)
            js_ncp(out->v[i].str);
}
