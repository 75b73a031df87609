/* config.c - builds the serve config snapshot: defaults, then CLLM_*
 * environment variables, then `cllm serve` flags (see config.h). */
#include "base/env.h"
#include "base/parse.h"
#include "serve/config.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

void serve_usage(FILE *f)
{
    fprintf(f,
            "usage: cllm serve <model> [options]\n"
            "\n"
            "Serves the model over HTTP: OpenAI /v1/chat/completions, /v1/completions,\n"
            "/v1/responses, Anthropic /v1/messages, plus /v1/models, /health, /stats.\n"
            "\n"
            "options (value flags are `--name value`; unknown flags are ignored with a warning):\n"
            "  --model PATH             the model (wins over the positional)\n"
            "  --tokenizer PATH         a directory with tokenizer.json (+ tokenizer_config.json\n"
            "                           with the chat template) or a tokenizer.json file, in\n"
            "                           place of the model's own (for GGUF files without one)\n"
            "  --host ADDR              interface to bind (default 127.0.0.1)\n"
            "  --port N                 port (default 8080)\n"
            "  --max-tokens N           completion cap when a request gives none (default: none)\n"
            "  --temperature T          default temperature (alias --temp; default:\n"
            "                           generation_config.json, else 0.7)\n"
            "  --top-p P                default top-p (default: generation_config.json, else off)\n"
            "  --top-k K                default top-k (default: generation_config.json, else off)\n"
            "  --min-p P                default min-p (default: generation_config.json, else off)\n"
            "  --thinking true|false    default enable_thinking for chat templates\n"
            "  --ctx N                  context tokens per request (default: the model's)\n"
            "  -t, --threads N          CPU threads (default: all cores)\n"
            "  --device D               cpu, cuda, cuda:N or auto (the first GPU if there is\n"
            "                           one, else the CPU; default cpu)\n"
            "  --batch N                sequences decoded together (default 8; 1 = strict\n"
            "                           serial); alias --decode-concurrency (--batch wins)\n"
            "  --prefill-chunk N        prompt tokens per forward pass (default 2048 on a GPU,\n"
            "                           128 on the CPU; at most 512 on a GPU in a step where\n"
            "                           other streams decode, so they wait less for tokens)\n"
            "  --prompt-cache GB        KV kept for prefix reuse (default: the whole KV pool;\n"
            "                           0 disables)\n"
            "  --draft-kind ngram       speculative decoding by prompt lookup: a request\n"
            "                           decoding alone drafts the tokens that followed an\n"
            "                           earlier occurrence of its last tokens and keeps those\n"
            "                           the model confirms (same output, fewer steps)\n"
            "  --draft-model PATH       speculative decoding with a small model of the same\n"
            "                           tokenizer drafting (--draft-kind two-model)\n"
            "  --num-draft-tokens N     drafts per step (1..32; default 10 ngram, 3 two-model)\n"
            "  --draft-p-min P          with --draft-model: a step's drafts stop before one the\n"
            "                           draft model gives less than P (0..1; default 0: never)\n"
            "  --ngram-max K, --ngram-min K  trailing n-gram lengths searched (3, 1)\n"
            "  --ssd-cache DIR          the prompt cache's SSD tier: KV blocks the RAM cache\n"
            "                           evicts (or that sit idle) become files in DIR, restored\n"
            "                           for a matching prompt, across restarts (default off)\n"
            "  --ssd-cache-max GB       cap on those files (GiB; default 0 = unlimited)\n"
            "  --kv-budget GB           aggregate projected KV (prompt + max_tokens) of running\n"
            "                           requests; joiners over it queue, a request over it\n"
            "                           alone is refused (400 memory_admission; default off)\n"
            "  --kv-block-size N        tokens per KV block (8..256, a power of two; 16)\n"
            "  --memory-budget GB       weights + KV pool; the pool gets what the weights\n"
            "                           leave (default: 75%% of RAM on the CPU, the free GPU\n"
            "                           memory on CUDA, capped at --batch x --ctx tokens plus\n"
            "                           the prompt cache)\n"
            "  --compiled-decode on|off decode steps recorded once as CUDA graphs and\n"
            "                           replayed (default on; the same output either way)\n"
            "  --no-open                accepted for compatibility (cllm opens no browser)\n"
            "\n"
            "environment: CLLM_SHUTDOWN_TIMEOUT_MS, CLLM_MAX_QUEUE, CLLM_MAX_BODY_BYTES,\n"
            "CLLM_CONNECTION_TIMEOUT_S, CLLM_MAX_CONNECTIONS, CLLM_RESPONSES_STORE,\n"
            "CLLM_LOG_REQUESTS, CLLM_PROMPT_CACHE_GB, CLLM_KV_BUDGET_GB, CLLM_MEMORY_BUDGET_GB,\n"
            "CLLM_DEVICE, CLLM_TOKENIZER, CLLM_COMPILED_DECODE\n"
            "(see docs/config.md)\n");
}

/* ---- environment ---- */

/* --device values: cpu, auto, cuda, cuda:N (N decimal). */
static bool device_ok(const char *v)
{
    if (!strcmp(v, "cpu") || !strcmp(v, "auto") || !strcmp(v, "cuda"))
        return true;
    if (strncmp(v, "cuda:", 5) || !v[5] || strlen(v) > 9)
        return false;
    for (const char *p = v + 5; *p; p++)
        if (*p < '0' || *p > '9')
            return false;
    return true;
}

static int set_device(struct serve_config *c, bool env, const char *v, struct err *e)
{
    if (!device_ok(v))
        return env ? err_set(e, "CLLM_DEVICE=\"%s\": needs cpu, cuda, cuda:N or auto", v)
                   : err_set(e, "--device needs cpu, cuda, cuda:N or auto (got \"%s\")", v);
    snprintf(c->device, sizeof c->device, "%s", v);
    return 0;
}

int serve_config_from_env(struct serve_config *c, struct err *e)
{
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "127.0.0.1");
    snprintf(c->device, sizeof c->device, "cpu");
    c->port = 8080;
    c->thinking = -1;
    c->shutdown_timeout_ms = 120000;
    c->max_queue = 64;
    c->max_body_bytes = 16u << 20;
    c->conn_timeout_s = 300;
    c->max_connections = 256;
    c->responses_store = 256;
    c->num_draft_tokens = 10; /* the spec's ngram defaults */
    c->ngram_max = 3;
    c->ngram_min = 1;

    long v;
    v = c->shutdown_timeout_ms;
    if (env_long("CLLM_SHUTDOWN_TIMEOUT_MS", 1, 86400000L, &v, e) < 0)
        return -1;
    c->shutdown_timeout_ms = (int)v;
    v = c->max_queue;
    if (env_long("CLLM_MAX_QUEUE", 1, 1 << 20, &v, e) < 0)
        return -1;
    c->max_queue = (int)v;
    v = (long)c->max_body_bytes;
    if (env_long("CLLM_MAX_BODY_BYTES", 1024, 1L << 30, &v, e) < 0)
        return -1;
    c->max_body_bytes = (size_t)v;
    v = c->conn_timeout_s;
    if (env_long("CLLM_CONNECTION_TIMEOUT_S", 1, 86400, &v, e) < 0)
        return -1;
    c->conn_timeout_s = (int)v;
    v = c->max_connections;
    if (env_long("CLLM_MAX_CONNECTIONS", 4, 65536, &v, e) < 0)
        return -1;
    c->max_connections = (int)v;
    v = 16;
    if (env_long("CLLM_KV_BLOCK_SIZE", 8, 256, &v, e) < 0)
        return -1;
    if (v & (v - 1))
        return err_set(e, "CLLM_KV_BLOCK_SIZE=%ld: needs a power of two from 8 to 256", v);
    c->kv_block_size = (int)v;
    v = c->responses_store;
    if (env_long("CLLM_RESPONSES_STORE", 0, 1 << 20, &v, e) < 0)
        return -1;
    c->responses_store = (int)v;
    c->log_requests = env_flag("CLLM_LOG_REQUESTS", c->log_requests);
    c->compiled_decode = env_flag("CLLM_COMPILED_DECODE", true) ? 0 : -1;
    const char *dv = getenv("CLLM_DEVICE");
    if (dv && *dv && set_device(c, true, dv, e))
        return -1;
    const char *tv = getenv("CLLM_TOKENIZER");
    if (tv && *tv)
        c->tokenizer = tv;
    const char *pcv = getenv("CLLM_PROMPT_CACHE_GB");
    if (pcv && *pcv) {
        double x;
        if (!parse_double(pcv, 0, 1e6, &x))
            return err_set(e, "CLLM_PROMPT_CACHE_GB=\"%s\": needs a number in [0, 1e+06]", pcv);
        c->prompt_cache_gb.v = (float)x;
        c->prompt_cache_gb.set = true;
    }
    static const char *const gb_env[] = {"CLLM_KV_BUDGET_GB", "CLLM_MEMORY_BUDGET_GB"};
    struct opt_f *gb_out[] = {&c->kv_budget_gb, &c->memory_budget_gb};
    for (int i = 0; i < 2; i++) {
        const char *gv = getenv(gb_env[i]);
        if (!gv || !*gv)
            continue;
        double x;
        if (!parse_double(gv, 0, 1e6, &x) || x == 0)
            return err_set(e, "%s=\"%s\": needs a number in (0, 1e+06]", gb_env[i], gv);
        gb_out[i]->v = (float)x;
        gb_out[i]->set = true;
    }
    return 0;
}

/* ---- flags ---- */

static int parse_i(const char *flag, const char *v, long lo, long hi, int *out, struct err *e)
{
    long x;
    if (!parse_long(v, lo, hi, &x))
        return err_set(e, "%s needs an integer in [%ld, %ld] (got \"%s\")", flag, lo, hi, v);
    *out = (int)x;
    return 0;
}

static int parse_f(const char *flag, const char *v, double lo, double hi, float *out,
                   struct err *e)
{
    double x;
    if (!parse_double(v, lo, hi, &x))
        return err_set(e, "%s needs a number in [%g, %g] (got \"%s\")", flag, lo, hi, v);
    *out = (float)x;
    return 0;
}

static int parse_bool(const char *flag, const char *v, int *out, struct err *e)
{
    bool b;
    if (!parse_switch(v, &b))
        return err_set(e, "%s needs true|false|on|off|1|0 (got \"%s\")", flag, v);
    *out = b;
    return 0;
}

enum { F_MODEL, F_HOST, F_PORT, F_MAXTOK, F_TEMPERATURE, F_TEMP, F_TOPP, F_TOPK, F_MINP,
       F_THINKING, F_CTX, F_THREADS, F_PROMPT_CACHE, F_BATCH, F_DECODE_CONC,
       F_KV_BUDGET, F_MEMORY_BUDGET, F_DEVICE, F_TOKENIZER, F_KV_BLOCK, F_SSD, F_SSD_MAX,
       F_DRAFT_KIND, F_DRAFT_MODEL, F_NUM_DRAFT, F_NGRAM_MAX, F_NGRAM_MIN, F_DRAFT_P_MIN, F_PREFILL_CHUNK,
       F_COMPILED_DECODE };

static const struct {
    const char *name, *alias;
    int id;
} value_flags[] = {
    {"--model", NULL, F_MODEL},         {"--host", NULL, F_HOST},
    {"--port", NULL, F_PORT},           {"--max-tokens", NULL, F_MAXTOK},
    {"--temperature", NULL, F_TEMPERATURE}, {"--temp", NULL, F_TEMP},
    {"--top-p", NULL, F_TOPP},          {"--top-k", NULL, F_TOPK},
    {"--min-p", NULL, F_MINP},          {"--thinking", NULL, F_THINKING},
    {"--ctx", "--context-length", F_CTX}, {"--threads", "-t", F_THREADS},
    {"--prompt-cache", NULL, F_PROMPT_CACHE},
    {"--batch", NULL, F_BATCH},         {"--decode-concurrency", NULL, F_DECODE_CONC},
    {"--kv-budget", NULL, F_KV_BUDGET}, {"--memory-budget", NULL, F_MEMORY_BUDGET},
    {"--device", NULL, F_DEVICE},       {"--tokenizer", NULL, F_TOKENIZER},
    {"--kv-block-size", NULL, F_KV_BLOCK},
    {"--ssd-cache", NULL, F_SSD},       {"--ssd-cache-max", NULL, F_SSD_MAX},
    {"--draft-kind", NULL, F_DRAFT_KIND}, {"--draft-model", NULL, F_DRAFT_MODEL},
    {"--num-draft-tokens", NULL, F_NUM_DRAFT}, {"--ngram-max", NULL, F_NGRAM_MAX},
    {"--ngram-min", NULL, F_NGRAM_MIN}, {"--draft-p-min", NULL, F_DRAFT_P_MIN},
    {"--prefill-chunk", NULL, F_PREFILL_CHUNK},
    {"--compiled-decode", NULL, F_COMPILED_DECODE},
};

int serve_config_parse_args(struct serve_config *c, int argc, char **argv, FILE *warn,
                            struct err *e)
{
    const char *positional = NULL, *model_flag = NULL;
    struct opt_f temp_alias = {0};
    struct opt_i conc_alias = {0};
    bool num_draft_set = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return 1;
        if (!strcmp(a, "--no-open")) {
            c->no_open = true;
            continue;
        }
        int id = -1;
        for (size_t k = 0; k < sizeof value_flags / sizeof value_flags[0]; k++)
            if (!strcmp(a, value_flags[k].name) ||
                (value_flags[k].alias && !strcmp(a, value_flags[k].alias)))
                id = value_flags[k].id;
        if (id < 0) {
            if (a[0] == '-' && a[1]) {
                if (warn)
                    fprintf(warn, "cllm serve: warning: ignoring unknown flag %s%s\n", a,
                            strchr(a, '=') ? " (value flags are `--name value`)" : "");
            } else if (!positional) {
                positional = a;
            } else if (warn) {
                fprintf(warn, "cllm serve: warning: ignoring extra argument \"%s\"\n", a);
            }
            continue;
        }
        /* A value flag with no following value takes its default (the spec's rule). */
        const char *v = i + 1 < argc && strncmp(argv[i + 1], "--", 2) ? argv[++i] : NULL;
        if (!v)
            continue;
        int rc = 0;
        switch (id) {
        case F_MODEL: model_flag = v; break;
        case F_HOST:
            if (strlen(v) >= sizeof c->host)
                return err_set(e, "--host: address too long");
            snprintf(c->host, sizeof c->host, "%s", v);
            break;
        case F_PORT: rc = parse_i(a, v, 1, 65535, &c->port, e); break;
        case F_MAXTOK:
            rc = parse_i(a, v, 1, 10000000, &c->max_tokens.v, e);
            c->max_tokens.set = true;
            break;
        case F_TEMPERATURE:
            rc = parse_f(a, v, 0, 5, &c->temperature.v, e);
            c->temperature.set = true;
            break;
        case F_TEMP:
            rc = parse_f(a, v, 0, 5, &temp_alias.v, e);
            temp_alias.set = true;
            break;
        case F_TOPP:
            rc = parse_f(a, v, 0, 1, &c->top_p.v, e);
            c->top_p.set = true;
            break;
        case F_TOPK:
            rc = parse_i(a, v, 0, 1000000, &c->top_k.v, e);
            c->top_k.set = true;
            break;
        case F_MINP:
            rc = parse_f(a, v, 0, 1, &c->min_p.v, e);
            c->min_p.set = true;
            break;
        case F_THINKING: rc = parse_bool(a, v, &c->thinking, e); break;
        case F_COMPILED_DECODE: {
            int on = 0;
            rc = parse_bool(a, v, &on, e);
            c->compiled_decode = on ? 1 : -1;
            break;
        }
        case F_CTX: rc = parse_i(a, v, 1, 1 << 24, &c->ctx, e); break;
        case F_THREADS: rc = parse_i(a, v, 1, 1024, &c->threads, e); break;
        case F_BATCH:
            rc = parse_i(a, v, 1, 4096, &c->batch.v, e);
            c->batch.set = true;
            break;
        case F_PREFILL_CHUNK: rc = parse_i(a, v, 1, 1 << 20, &c->prefill_chunk, e); break;
        case F_DECODE_CONC:
            rc = parse_i(a, v, 1, 4096, &conc_alias.v, e);
            conc_alias.set = true;
            break;
        case F_PROMPT_CACHE:
            rc = parse_f(a, v, 0, 1e6, &c->prompt_cache_gb.v, e);
            c->prompt_cache_gb.set = true;
            break;
        case F_KV_BUDGET:
            rc = parse_f(a, v, 1e-9, 1e6, &c->kv_budget_gb.v, e);
            c->kv_budget_gb.set = true;
            break;
        case F_DEVICE: rc = set_device(c, false, v, e); break;
        case F_TOKENIZER: c->tokenizer = v; break;
        case F_KV_BLOCK:
            rc = parse_i(a, v, 8, 256, &c->kv_block_size, e);
            if (!rc && (c->kv_block_size & (c->kv_block_size - 1)))
                rc = err_set(e, "%s %s: needs a power of two from 8 to 256", a, v);
            break;
        case F_MEMORY_BUDGET:
            rc = parse_f(a, v, 1e-9, 1e6, &c->memory_budget_gb.v, e);
            c->memory_budget_gb.set = true;
            break;
        case F_SSD:
            c->ssd_cache = v;
            if (!*v)
                rc = err_set(e, "%s needs a directory", a);
            break;
        case F_DRAFT_KIND:
            if (strcmp(v, "ngram") && strcmp(v, "two-model"))
                rc = err_set(e, "%s %s: the kinds are \"ngram\" (prompt lookup) and "
                             "\"two-model\" (a --draft-model of the same tokenizer); "
                             "assistant, dspark, deepspec and mtp drafters are not supported",
                             a, v);
            c->draft_kind = v;
            break;
        case F_DRAFT_MODEL:
            c->draft_model = v;
            if (!*v)
                rc = err_set(e, "%s needs a model path", a);
            break;
        case F_DRAFT_P_MIN:
            rc = parse_f(a, v, 0, 1, &c->draft_p_min.v, e);
            c->draft_p_min.set = true;
            break;
        case F_NUM_DRAFT:
            rc = parse_i(a, v, 1, 32, &c->num_draft_tokens, e);
            num_draft_set = true;
            break;
        case F_NGRAM_MAX:
            rc = parse_i(a, v, 1, 64, &c->ngram_max, e);
            c->ngram_flags = true;
            break;
        case F_NGRAM_MIN:
            rc = parse_i(a, v, 1, 64, &c->ngram_min, e);
            c->ngram_flags = true;
            break;
        case F_SSD_MAX:
            rc = parse_f(a, v, 0, 1e6, &c->ssd_cache_max_gb.v, e);
            c->ssd_cache_max_gb.set = true;
            break;
        }
        if (rc)
            return -1;
    }
    if (!c->temperature.set && temp_alias.set) /* explicit --temperature wins over --temp */
        c->temperature = temp_alias;
    if (!c->batch.set && conc_alias.set) /* explicit --batch wins over --decode-concurrency */
        c->batch = conc_alias;
    /* the spec's pairing: ngram drafts without a model, every other kind
     * with one; a model alone means two-model */
    if (c->draft_model && !c->draft_kind)
        c->draft_kind = "two-model";
    if (c->draft_model && !strcmp(c->draft_kind, "ngram"))
        return err_set(e, "--draft-kind ngram drafts from the prompt: it takes no --draft-model");
    if (c->draft_kind && !strcmp(c->draft_kind, "two-model") && !c->draft_model)
        return err_set(e, "--draft-kind two-model needs a --draft-model");
    if (c->draft_model && !num_draft_set)
        c->num_draft_tokens = 3; /* mlx_lm.server's default for a drafter model */
    if (c->draft_p_min.set && !c->draft_model && warn)
        fprintf(warn, "cllm serve: warning: --draft-p-min without --draft-model is ignored\n");
    if (c->ngram_min > c->ngram_max)
        return err_set(e, "--ngram-min %d is more than --ngram-max %d", c->ngram_min,
                       c->ngram_max);
    if (c->ngram_flags && (!c->draft_kind || c->draft_model) && warn)
        fprintf(warn, "cllm serve: warning: --ngram-max/--ngram-min without --draft-kind ngram "
                      "are ignored\n");
    if (c->ssd_cache_max_gb.set && !c->ssd_cache && warn) /* as the spec: warn, ignore */
        fprintf(warn, "cllm serve: warning: --ssd-cache-max without --ssd-cache is ignored\n");
    c->model = model_flag ? model_flag : positional;
    if (!c->model)
        return err_set(e, "no model given (cllm serve <model>)");
    char dir[4096]; /* a missing --tokenizer is a usage error, before the model loads */
    if (c->tokenizer && tok_override_dir(c->tokenizer, dir, sizeof dir, e))
        return -1;
    return 0;
}
