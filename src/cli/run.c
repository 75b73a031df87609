/* run.c - `cllm run`: load a model, encode a prompt, generate, stream text
 * (or ids/logits) and report prompt and decode speed. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "cli/cli.h"
#include "backend/backend.h"
#include "base/file.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "engine/sampler.h"
#include "kv/kv_cache.h"
#include "model/forward.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#define KV_BLOCK 16


void cli_usage(FILE *f)
{
    fprintf(f,
            "usage: cllm <command> [options]\n"
            "\n"
            "commands:\n"
            "  run <model> [options]    generate text or ids from a prompt\n"
            "  serve <model> [options]  serve the model over HTTP (OpenAI, Anthropic APIs;\n"
            "                           see cllm serve --help)\n"
            "  tokenize <model> TEXT    token ids and pieces of TEXT (--json, --no-special,\n"
            "                           --decode ID,ID,... for text; see cllm tokenize --help)\n"
            "  template <model> --messages chat.json\n"
            "                           the chat prompt the model's template renders (--tools,\n"
            "                           --no-generation-prompt, --thinking on|off, --kwargs JSON;\n"
            "                           see cllm template --help)\n"
            "\n"
            "<model> is a Hugging Face directory (config.json + *.safetensors), a .gguf file,\n"
            "or a llama2.c checkpoint (.bin, or a directory holding one and tok*.bin).\n"
            "\n"
            "run options:\n"
            "  -p, --prompt TEXT        prompt text (tokenized with the model's tokenizer)\n"
            "  --prompt-ids I,J,...     prompt as token ids (no tokenizer needed)\n"
            "  --tokenizer PATH         a directory with tokenizer.json or a tokenizer.json\n"
            "                           file, in place of the model's own (for GGUF files\n"
            "                           without one; also for cllm serve)\n"
            "  -n, --n-predict N        tokens to generate (default 128; 0 = prompt only)\n"
            "  --temp T                 temperature (default 0.8; 0 = greedy)\n"
            "  --top-k K                (default 40; 0 = off)\n"
            "  --top-p P                (default 0.95; 1 = off)\n"
            "  --min-p P                (default 0.05; 0 = off)\n"
            "  --seed S                 RNG seed (default: time)\n"
            "  -t, --threads N          CPU threads (default: all cores)\n"
            "  --device D               cpu, cuda, cuda:N or auto (the first GPU if there is\n"
            "                           one, else the CPU; default cpu)\n"
            "  -c, --ctx N              context length to allocate (default: prompt + n)\n"
            "  --batch N                prompt tokens per forward pass (default 2048 on a\n"
            "                           GPU, 128 on the CPU, as cllm serve --prefill-chunk)\n"
            "  --ignore-eos             keep generating after end-of-sequence\n"
            "  --compiled-decode on|off decode steps recorded once as CUDA graphs and\n"
            "                           replayed (default on; the same output either way)\n"
            "  --warmup                 run the prompt and two decode steps once, untimed,\n"
            "                           before the timed run (for benchmarks)\n"
            "  --grammar-file FILE      hold the output to a GBNF grammar (docs/grammar.md)\n"
            "  --json-schema JSON       hold the output to JSON valid under this schema\n"
            "  --json-schema-file FILE  the same, the schema read from a file\n"
            "  --print-ids              print generated token ids instead of text\n"
            "  --logits-out FILE        write float32 logits of every prompt position\n"
            "                           (row-major [n_prompt, vocab])\n");
}

struct run_opts {
    const char *model, *prompt, *prompt_ids, *logits_out, *device, *tokenizer;
    const char *grammar_file, *json_schema, *json_schema_file;
    int n_predict, threads, ctx, batch, compiled_decode;
    bool print_ids, ignore_eos, seed_set, warmup;
    struct sampler_params sp;
};

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out)
{
    return cli_parse_int("cllm", flag, v, lo, hi, out);
}

static int parse_float(const char *flag, const char *v, float *out)
{
    return cli_parse_float("cllm", flag, v, out);
}

static int parse_run_args(int argc, char **argv, struct run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->batch = 0; /* the device's, once the backend is made */
    o->sp = (struct sampler_params){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0, takes = 1;
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "--prompt-ids")) o->prompt_ids = v;
        else if (!strcmp(a, "--logits-out")) o->logits_out = v;
        else if (!strcmp(a, "--device")) o->device = v;
        else if (!strcmp(a, "--tokenizer")) o->tokenizer = v;
        else if (!strcmp(a, "--grammar-file")) o->grammar_file = v;
        else if (!strcmp(a, "--json-schema")) o->json_schema = v;
        else if (!strcmp(a, "--json-schema-file")) o->json_schema_file = v;
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) rc = parse_int(a, v, 0, 1 << 24, &o->n_predict);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) rc = parse_int(a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) rc = parse_int(a, v, 1, 1 << 24, &o->ctx);
        else if (!strcmp(a, "--batch")) rc = parse_int(a, v, 1, 1 << 16, &o->batch);
        else if (!strcmp(a, "--compiled-decode")) rc = cli_parse_onoff("cllm", a, v, &o->compiled_decode);
        else if (!strcmp(a, "--temp")) rc = parse_float(a, v, &o->sp.temperature);
        else if (!strcmp(a, "--top-p")) rc = parse_float(a, v, &o->sp.top_p);
        else if (!strcmp(a, "--min-p")) rc = parse_float(a, v, &o->sp.min_p);
        else if (!strcmp(a, "--top-k")) rc = parse_int(a, v, 0, 1 << 24, &o->sp.top_k);
        else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->sp.seed = v ? strtoull(v, &end, 10) : 0;
            if (!v || errno || *end || end == v) {
                fprintf(stderr, "cllm: --seed needs a non-negative integer\n");
                return -1;
            }
            o->seed_set = true;
        } else {
            takes = 0;
            if (!strcmp(a, "--print-ids")) o->print_ids = true;
            else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = true;
            else if (!strcmp(a, "--warmup")) o->warmup = true;
            else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { cli_usage(stdout); exit(0); }
            else if (a[0] == '-' && a[1]) {
                fprintf(stderr, "cllm run: unknown option %s (see cllm --help)\n", a);
                return -1;
            } else if (!o->model) o->model = a;
            else {
                fprintf(stderr, "cllm run: unexpected argument \"%s\"\n", a);
                return -1;
            }
        }
        if (rc)
            return -1;
        if (takes) {
            if (!v) {
                fprintf(stderr, "cllm run: %s needs a value\n", a);
                return -1;
            }
            i++;
        }
    }
    if (!o->model) {
        fprintf(stderr, "cllm run: no model given (cllm run <model> -p TEXT)\n");
        return -1;
    }
    if (o->prompt && o->prompt_ids) {
        fprintf(stderr, "cllm run: give either --prompt or --prompt-ids, not both\n");
        return -1;
    }
    if (!o->seed_set)
        o->sp.seed = (uint64_t)time(NULL);
    struct err e = {{0}};
    char dir[4096];
    if (o->tokenizer && tok_override_dir(o->tokenizer, dir, sizeof dir, &e)) {
        fprintf(stderr, "cllm run: %s\n", e.msg);
        return -1;
    }
    return 0;
}

static int is_eos(const struct model_config *c, int id)
{
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id)
            return 1;
    return 0;
}

static int write_logits(const char *path, const float *logits, size_t n, struct err *e)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return err_set(e, "%s: %s", path, strerror(errno));
    size_t w = fwrite(logits, sizeof(float), n, f);
    if (fclose(f) != 0 || w != n)
        return err_set(e, "%s: write failed", path);
    return 0;
}

/* The grammar of --grammar-file, --json-schema or --json-schema-file (at
 * most one); NULL without an error when none is given. */
static struct grammar *run_grammar(const struct run_opts *o, struct err *e)
{
    int given = !!o->grammar_file + !!o->json_schema + !!o->json_schema_file;
    if (given > 1) {
        err_set(e, "give one of --grammar-file, --json-schema and --json-schema-file");
        return NULL;
    }
    if (!given)
        return NULL;
    char *text = NULL;
    struct grammar *g = NULL;
    if (o->grammar_file) {
        if (!(text = read_file(o->grammar_file, NULL, e))) {
            err_wrap(e, "--grammar-file");
            return NULL;
        }
        g = grammar_parse(text, strlen(text), e);
        if (!g)
            err_wrap(e, "--grammar-file %s", o->grammar_file);
        free(text);
        return g;
    }
    const char *flag = o->json_schema ? "--json-schema" : "--json-schema-file";
    json_error_t je;
    json_t *schema = o->json_schema ? json_loads(o->json_schema, JSON_DECODE_ANY, &je)
                                    : json_load_file(o->json_schema_file, JSON_DECODE_ANY, &je);
    if (!schema) {
        err_set(e, "%s: not JSON: %s (line %d)", flag, je.text, je.line);
        return NULL;
    }
    text = json_schema_gbnf(schema, e);
    json_decref(schema);
    if (!text) {
        err_wrap(e, "%s", flag);
        return NULL;
    }
    g = grammar_parse(text, strlen(text), e);
    free(text);
    return g;
}

/* The next token from a logits row the grammar masks first. */
static int pick_constrained(struct grammar_matcher *gm, const struct model_config *c,
                            bool ignore_eos, struct sampler *smp, float *row, int *next,
                            struct err *e)
{
    int n = grammar_matcher_mask(gm, row, c->eos_ids, ignore_eos ? 0 : c->n_eos, e);
    if (n < 0)
        return -1;
    if (n == 0)
        return err_set(e, "the grammar allows no token of the vocabulary here");
    *next = sampler_sample(smp, row);
    return 0;
}

int cmd_run(int argc, char **argv)
{
    struct run_opts o;
    if (parse_run_args(argc, argv, &o))
        return 2;
    struct err e = {{0}};
    struct model m;
    struct tokenizer *tok = NULL;
    struct backend *be = NULL;
    struct forward_state fs = {0};
    struct kv_pool pool = {0};
    struct kv_seq seq = {0};
    struct sampler smp = {0};
    int *prompt = NULL, n_prompt = 0, rc = 1;
    float *logits = NULL;
    struct grammar *gram = NULL;
    struct grammar_vocab *gvocab = NULL;
    struct grammar_matcher *gm = NULL;

    if (model_load(&m, o.model, &e)) {
        fprintf(stderr, "cllm: %s\n", e.msg);
        return 1;
    }
    const struct model_config *c = &m.cfg;
    bool constrained = o.grammar_file || o.json_schema || o.json_schema_file;
    bool need_tok = !o.prompt_ids || !o.print_ids || constrained;
    if (need_tok) {
        tok = o.tokenizer ? tok_load_override(o.tokenizer, c->vocab_size, &e)
                          : tok_load_for_model(o.model, &e);
        if (!tok && (!o.prompt_ids || o.tokenizer || constrained))
            goto fail;
        if (!tok) { /* ids in, text out impossible: fall back to printing ids */
            fprintf(stderr, "cllm: no tokenizer (%s); printing ids\n", e.msg);
            o.print_ids = true;
        }
    }
    if (o.prompt_ids) {
        n_prompt = cli_parse_ids("--prompt-ids", o.prompt_ids, c->vocab_size, &prompt, &e);
        if (n_prompt == 0) {
            free(prompt);
            prompt = NULL;
            n_prompt = err_set(&e, "--prompt-ids: empty list");
        }
    } else {
        const char *text = o.prompt ? o.prompt : "";
        n_prompt = tok_encode(tok, text, strlen(text), true, &prompt, &e);
    }
    if (n_prompt < 0)
        goto fail;
    if (constrained && (!(gram = run_grammar(&o, &e)) ||
                        !(gvocab = grammar_vocab_new(tok, c->vocab_size, &e)) ||
                        !(gm = grammar_matcher_new(gram, gvocab, &e))))
        goto fail;
    if (n_prompt == 0) {
        err_set(&e, "the prompt encodes to no tokens and the tokenizer has no BOS; give a prompt");
        goto fail;
    }
    int ctx = o.ctx ? o.ctx : n_prompt + o.n_predict;
    if (n_prompt + o.n_predict > ctx) {
        err_set(&e, "prompt (%d tokens) + %d to generate exceeds --ctx %d", n_prompt, o.n_predict, ctx);
        goto fail;
    }
    be = backend_create(o.device, o.threads, &e);
    if (be)
        backend_set_compiled_decode(be, o.compiled_decode);
    /* prompt passes as the engine's (engine.c): 2,048 tokens on a GPU, 128
     * on the CPU; logits rows only for --logits-out, in passes of at most
     * 256 rows (a row is vocab_size floats) */
    if (be && !o.batch)
        o.batch = backend_on_device(be) ? 2048 : 128;
    int logit_rows = o.logits_out ? (o.batch < 256 ? o.batch : 256) : 1;
    if (!be || backend_load_weights(be, &m, &e) ||
        forward_init_rows(&fs, &m, be, o.batch, logit_rows, &e) ||
        kv_pool_init(&pool, be, c->n_layers, c->n_kv_heads, c->head_dim, KV_BLOCK,
                     (ctx + KV_BLOCK - 1) / KV_BLOCK +
                         (o.warmup ? (n_prompt + 2 + KV_BLOCK - 1) / KV_BLOCK : 0), &e) ||
        backend_load_spare(be, &m, 0, &e) || sampler_init(&smp, &o.sp, c->vocab_size, &e))
        goto fail;
    backend_print_plan(be, kv_pool_bytes(&pool), stderr);
    size_t rows = o.logits_out ? (size_t)n_prompt : 1;
    logits = malloc(rows * c->vocab_size * sizeof(float));
    if (!logits) {
        err_set(&e, "out of memory for logits");
        goto fail;
    }

    if (o.warmup) { /* first-use costs (kernel loading, graph recording) stay untimed */
        struct kv_seq ws = {0};
        int tok0 = prompt[0], rc_w = forward_tokens(&fs, &pool, &ws, prompt, n_prompt, false, logits, &e);
        for (int i = 0; i < 3 && rc_w == 0; i++) /* eager, then a graph per record half */
            rc_w = forward_tokens(&fs, &pool, &ws, &tok0, 1, false, logits, &e);
        kv_seq_release(&pool, &ws);
        if (rc_w)
            goto fail;
    }
    double t0 = clock_now_s();
    if (forward_tokens(&fs, &pool, &seq, prompt, n_prompt, o.logits_out != NULL, logits, &e))
        goto fail;
    double t1 = clock_now_s();
    if (o.logits_out && write_logits(o.logits_out, logits, rows * c->vocab_size, &e))
        goto fail;
    const float *last = logits + (rows - 1) * c->vocab_size;

    struct detok dt;
    if (tok && !o.print_ids) {
        detok_init(&dt, tok, true);
        if (o.prompt) { /* echo the prompt as the tokenizer sees it */
            char buf[4096];
            for (int i = 0; i < n_prompt; i++) {
                detok_feed(&dt, prompt[i], buf, sizeof buf);
                fputs(buf, stdout);
            }
        } else { /* ids in, text out: the first piece's space depends on the prompt */
            dt.prev_id = prompt[n_prompt - 1];
        }
        fflush(stdout);
    }
    int n_gen = 0, n_fwd = 0;
    /* The first token from the prompt's last row (on the host: the prompt
     * pass may have written every row to a file); each decode step then
     * yields the next (on the device when the backend can pick it: no
     * logits row crosses to the host). One draw per token in the same
     * order either way, so a seed gives the same ids. */
    int next;
    if (!gm)
        next = sampler_sample(&smp, last);
    else if (pick_constrained(gm, c, o.ignore_eos, &smp, (float *)last, &next, &e))
        goto fail;
    /* Greedy without a grammar: the step fed a token is queued before that
     * token is printed, and the step after it (fed the id still on the
     * device) before the token's own id is read (forward_pipe_issue); a
     * step the stop makes unnecessary is dropped. */
    const bool ahead = !gm && sampler_is_greedy(&smp);
    while (n_gen < o.n_predict) {
        if (!o.ignore_eos && is_eos(c, next))
            break;
        if (gm && grammar_matcher_feed_token(gm, next, &e))
            goto fail;
        if (o.print_ids) {
            printf(n_gen ? ",%d" : "%d", next);
        } else {
            char buf[4096];
            detok_feed(&dt, next, buf, sizeof buf);
            fputs(buf, stdout);
        }
        fflush(stdout);
        if (++n_gen == o.n_predict || (gm && grammar_matcher_must_end(gm)))
            break; /* the last token needs no forward pass */
        int tok = next;
        if (ahead) {
            /* a step in flight is the one fed tok (queued last time) */
            if ((fs.pipe.n == 0 && forward_pipe_issue(&fs, &pool, &seq, &tok, &e)) ||
                (n_gen + 1 < o.n_predict && forward_pipe_issue(&fs, &pool, &seq, NULL, &e)) ||
                forward_pipe_take(&fs, &next, &e))
                goto fail;
            n_fwd++;
            continue;
        }
        if (gm ? forward_tokens(&fs, &pool, &seq, &tok, 1, false, logits, &e) ||
                     pick_constrained(gm, c, o.ignore_eos, &smp, logits, &next, &e)
               : cli_forward_next(&fs, &pool, &seq, &tok, 1, logits, &smp, &next, &e))
            goto fail;
        n_fwd++;
    }
    if (forward_pipe_drop(&fs, &e))
        goto fail;
    double t2 = clock_now_s();
    if (tok && !o.print_ids) {
        char buf[64];
        detok_flush(&dt, buf, sizeof buf);
        fputs(buf, stdout);
    }
    printf("\n");
    fprintf(stderr, "prompt: %d tokens in %.3f s, %.2f tok/s | decode: %d tokens, %d steps in "
                    "%.3f s, %.2f tok/s\n",
            n_prompt, t1 - t0, n_prompt / (t1 - t0), n_gen, n_fwd, t2 - t1,
            n_fwd ? n_fwd / (t2 - t1) : 0.0);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "cllm: %s\n", e.msg);
done:
    free(logits);
    free(prompt);
    grammar_matcher_free(gm);
    grammar_vocab_free(gvocab);
    grammar_free(gram);
    sampler_free(&smp);
    if (pool.k)
        kv_seq_release(&pool, &seq);
    kv_pool_free(&pool);
    forward_free(&fs);
    backend_destroy(be);
    if (tok)
        tok_free(tok);
    model_free(&m);
    return rc;
}

