/* config.h - the runtime-config snapshot of one `cllm serve` process: the
 * CLLM_* environment read once at start, then the command-line flags applied
 * on top, into one struct that is never modified afterwards (DESIGN.md: the
 * only global mutable state allowed is this snapshot, and it is not even
 * global: the server holds a const pointer to it).
 *
 * Environment rule (spec "Environment variables"): every MLX_BUN_<SUFFIX>
 * lever of the reference maps to CLLM_<SUFFIX>; boolean levers read the
 * literal strings "1" and "0", any other value counts as unset. */
#ifndef CLLM_SERVE_CONFIG_H
#define CLLM_SERVE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/err.h"

/* An optional number: a server default that is either given or not. */
struct opt_f {
    bool set;
    float v;
};
struct opt_i {
    bool set;
    int v;
};

struct serve_config {
    /* what to serve */
    const char *model;       /* path (positional or --model; --model wins) */
    const char *tokenizer;   /* --tokenizer / CLLM_TOKENIZER: a directory with tokenizer.json
                              * (+ tokenizer_config.json) or a tokenizer.json file, in place
                              * of the model's tokenizer and chat template; NULL = the model's */

    /* network */
    char host[256];          /* --host [127.0.0.1] */
    int port;                /* --port [8080] */
    bool no_open;            /* --no-open (accepted; cllm never opens a browser) */

    /* server-wide request defaults (request > these > generation_config.json > fallback) */
    struct opt_i max_tokens; /* --max-tokens: cap when a request gives none */
    struct opt_f temperature; /* --temperature / --temp (--temperature wins) */
    struct opt_f top_p;      /* --top-p */
    struct opt_i top_k;      /* --top-k */
    struct opt_f min_p;      /* --min-p */
    int thinking;            /* --thinking: -1 the model's own, 0 off, 1 on */

    /* engine */
    char device[32];         /* --device / CLLM_DEVICE: cpu | cuda | cuda:N | auto [cpu] */
    int ctx;                 /* --ctx: tokens per sequence; 0 = the model's own */
    int threads;             /* -t/--threads: 0 = all cores */
    int kv_block_size;       /* --kv-block-size / CLLM_KV_BLOCK_SIZE (16) */
    struct opt_i batch;      /* --batch N / --decode-concurrency: running sequences;
                              * unset = 8, 1 = strict serial */
    int prefill_chunk;       /* --prefill-chunk N: prompt tokens per forward; 0 = the
                              * engine's default (beside decodes at most the engine's
                              * default for that) */
    struct opt_f prompt_cache_gb; /* --prompt-cache GB / CLLM_PROMPT_CACHE_GB: cap on idle
                                   * cached KV; unset = the whole pool, 0 = off */
    struct opt_f kv_budget_gb;    /* --kv-budget GB / CLLM_KV_BUDGET_GB (decimal): aggregate
                                   * projected KV of admitted requests; unset = off */
    const char *draft_kind;  /* --draft-kind: "ngram" (prompt lookup), "two-model" (with
                              * --draft-model: the default kind there) or NULL (none) */
    const char *draft_model; /* --draft-model PATH: the drafter of "two-model", or NULL */
    int num_draft_tokens;    /* --num-draft-tokens (ngram: 10, two-model: 3) */
    struct opt_f draft_p_min; /* --draft-p-min P: two-model drafts stop below it (0: off) */
    int ngram_max, ngram_min; /* --ngram-max / --ngram-min (3 / 1) */
    bool ngram_flags;        /* either --ngram-* flag was given (warned without ngram) */
    const char *ssd_cache;   /* --ssd-cache DIR: the prompt cache's SSD tier, or NULL */
    struct opt_f ssd_cache_max_gb; /* --ssd-cache-max GB (binary GiB; 0 = unlimited) */
    int compiled_decode;     /* --compiled-decode on|off / CLLM_COMPILED_DECODE: decode steps
                              * replayed as CUDA graphs; 1 on, -1 off, 0 unset (on) */
    struct opt_f memory_budget_gb; /* --memory-budget GB / CLLM_MEMORY_BUDGET_GB (decimal):
                                    * weights + KV pool; unset = the engine's default
                                    * (75% of RAM / free GPU memory, capped) */

    /* environment levers (CLLM_*) */
    int shutdown_timeout_ms; /* CLLM_SHUTDOWN_TIMEOUT_MS [120000] */
    int max_queue;           /* CLLM_MAX_QUEUE [64] waiting requests before 429 */
    size_t max_body_bytes;   /* CLLM_MAX_BODY_BYTES [16 MiB] request body cap (413) */
    int conn_timeout_s;      /* CLLM_CONNECTION_TIMEOUT_S [300] idle keep-alive timeout */
    int max_connections;     /* CLLM_MAX_CONNECTIONS [256] open HTTP connections */
    int responses_store;     /* CLLM_RESPONSES_STORE [256] stored /v1/responses (LRU) */
    bool log_requests;       /* CLLM_LOG_REQUESTS=1: one stderr line per request */
};

/* Fills defaults, then reads the CLLM_* environment. A malformed value is
 * an error naming the variable (a typo must not silently change behaviour). */
int serve_config_from_env(struct serve_config *c, struct err *e);

/* Applies `cllm serve` flags (argv after the verb). Value flags are
 * `--name value`; unknown flags are ignored with one warning line each on
 * `warn`. Returns 0, -1 with a message for a bad value, or 1 for --help. */
int serve_config_parse_args(struct serve_config *c, int argc, char **argv, FILE *warn,
                            struct err *e);

void serve_usage(FILE *f);

#endif
