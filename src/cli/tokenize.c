/* tokenize.c - `cllm tokenize`: text to ids and back with a model's
 * tokenizer (a directory with tokenizer.json, a tokenizer.json, a .gguf,
 * a llama2.c directory or checkpoint).
 *
 *   cllm tokenize <path> "text"            one "id<TAB>piece" line per token
 *   cllm tokenize <path> "text" --json     {"ids":[...],"pieces":[...]}
 *   cllm tokenize <path> --decode 1,2,3    the text of the ids
 *   cllm tokenize <path> --no-special ...  no BOS/EOS added
 *
 * "-" as the text reads it from standard input. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "base/file.h"
#include "tokenizer/tokenizer.h"

struct tok_opts {
    const char *path, *text, *decode;
    bool json, no_special, skip_special;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: cllm tokenize <model-or-tokenizer> [options] TEXT\n"
               "       cllm tokenize <model-or-tokenizer> --decode ID,ID,... [--skip-special]\n"
               "\n"
               "<model-or-tokenizer> is a directory with tokenizer.json, a tokenizer.json file,\n"
               "a .gguf file, or a llama2.c directory or checkpoint. TEXT \"-\" reads standard input.\n"
               "\n"
               "  --json            print {\"ids\": [...], \"pieces\": [...]} (or {\"text\": ...})\n"
               "  --no-special      do not add BOS/EOS (special tokens in the text still count)\n"
               "  --decode IDS      print the text of comma-separated ids\n"
               "  --skip-special    with --decode: leave out special tokens\n");
}

static int parse_args(int argc, char **argv, struct tok_opts *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (!strcmp(a, "--no-special")) {
            o->no_special = true;
        } else if (!strcmp(a, "--skip-special")) {
            o->skip_special = true;
        } else if (!strcmp(a, "--decode")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "cllm tokenize: --decode needs a list of ids\n");
                return -1;
            }
            o->decode = argv[++i];
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "cllm tokenize: unknown option %s (see cllm tokenize --help)\n", a);
            return -1;
        } else if (!o->path) {
            o->path = a;
        } else if (!o->text) {
            o->text = a;
        } else {
            fprintf(stderr, "cllm tokenize: unexpected argument \"%s\" (quote the text)\n", a);
            return -1;
        }
    }
    if (!o->path) {
        fprintf(stderr, "cllm tokenize: no model or tokenizer given\n");
        usage(stderr);
        return -1;
    }
    if (o->decode && o->text) {
        fprintf(stderr, "cllm tokenize: give either TEXT or --decode, not both\n");
        return -1;
    }
    if (!o->decode && !o->text) {
        fprintf(stderr, "cllm tokenize: no text given (cllm tokenize %s \"text\")\n", o->path);
        return -1;
    }
    return 0;
}

/* s as the inside of a JSON string (also used for one-line pieces). */
static void put_escaped(FILE *f, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        default:
            if (c < 0x20 || c == 0x7F)
                fprintf(f, "\\u%04x", c);
            else
                fputc(c, f);
        }
    }
}

/* A JSON string of bytes that may be invalid UTF-8: bad bytes become
 * U+FFFD so the output stays valid JSON. */
static void put_json_string(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                             : c >= 0xF0 && c <= 0xF4     ? 4
                                                          : 0;
        bool ok = k > 0 && i + k <= n;
        for (size_t j = 1; ok && j < k; j++)
            ok = ((unsigned char)s[i + j] & 0xC0) == 0x80;
        if (ok) {
            i += k;
            continue;
        }
        put_escaped(f, s + run, i - run);
        fputs("\\ufffd", f);
        run = ++i;
    }
    put_escaped(f, s + run, n - run);
    fputc('"', f);
}

int cmd_tokenize(int argc, char **argv)
{
    struct tok_opts o;
    if (parse_args(argc, argv, &o))
        return 2;
    struct err e = {{0}};
    struct tokenizer *t = tok_load_for_model(o.path, &e);
    if (!t) {
        fprintf(stderr, "cllm tokenize: %s\n", e.msg);
        return 1;
    }
    int rc = 1;
    int *ids = NULL;
    char *text = NULL;
    if (o.decode) {
        int n = cli_parse_ids("--decode", o.decode, tok_vocab_size(t), &ids, &e);
        char *s = n >= 0 ? tok_decode(t, ids, n, o.skip_special, &e) : NULL;
        if (s) {
            if (o.json) {
                fputs("{\"text\": ", stdout);
                put_json_string(stdout, s, strlen(s));
                fputs("}\n", stdout);
            } else {
                fputs(s, stdout);
                fputc('\n', stdout);
            }
            free(s);
            rc = 0;
        }
    } else {
        size_t len;
        const char *src = o.text;
        if (!strcmp(o.text, "-")) {
            text = read_stream(stdin, &len);
            if (!text) {
                err_set(&e, "cannot read standard input (out of memory or a read error)");
                goto done;
            }
            src = text;
        } else {
            len = strlen(o.text);
        }
        int n = tok_encode(t, src, len, !o.no_special, &ids, &e);
        if (n >= 0) {
            if (o.json) {
                fputs("{\"ids\": [", stdout);
                for (int i = 0; i < n; i++)
                    printf("%s%d", i ? ", " : "", ids[i]);
                fputs("], \"pieces\": [", stdout);
                for (int i = 0; i < n; i++) {
                    const char *p = tok_piece(t, ids[i]);
                    fputs(i ? ", " : "", stdout);
                    put_json_string(stdout, p, strlen(p));
                }
                fputs("]}\n", stdout);
            } else {
                for (int i = 0; i < n; i++) {
                    const char *p = tok_piece(t, ids[i]);
                    printf("%d\t", ids[i]);
                    put_escaped(stdout, p, strlen(p));
                    fputc('\n', stdout);
                }
            }
            rc = 0;
        }
    }
done:
    if (rc)
        fprintf(stderr, "cllm tokenize: %s\n", e.msg);
    free(ids);
    free(text);
    tok_free(t);
    return rc;
}
