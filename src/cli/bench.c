/* bench.c - `cllm bench`: prefill and decode speed of a model on a device,
 * each next to the floor that the device's memory bandwidth sets (bytes a
 * token must read ÷ bandwidth), and with --batch the aggregate decode speed
 * of S concurrent streams through the continuous-batching engine, the path
 * `cllm serve` takes.
 *
 * Prompts are made-up token ids (deterministic, distinct per stream so no
 * prefix is shared), decoding is greedy with EOS ignored: speed does not
 * depend on the text, and every run generates exactly the asked tokens. */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "cli/cli.h"

#include "backend/backend.h"
#include "backend/head_bound.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "kv/kv_cache.h"
#include "model/forward.h"
#include "model/model.h"

#define KV_BLOCK 16
#define MAX_BATCHES 32
#define MAX_STREAMS 1024
#define MIN_BATCH_TOKENS 2048

struct bench_opts {
    const char *model, *device;
    int threads, n_prompt, n_gen, reps;
    int prefill_chunk; /* --prefill-chunk: tokens per prefill forward (0: the whole prompt) */
    int kv_block; /* --kv-block-size for the batched runs (0: the engine's default) */
    int batch[MAX_BATCHES], n_batch;
    const char *draft;  /* --draft-model: also decode one stream speculatively */
    int n_draft;        /* --num-draft-tokens (default 3) */
    float draft_p_min;  /* --draft-p-min (default 0: off) */
    int compiled_decode; /* --compiled-decode: 1 on, -1 off, 0 the backend's default */
    double bandwidth; /* bytes/s from --bandwidth; 0: measure it */
    double peak_flops; /* FLOP/s from --peak-tflops; 0: no prefill floor */
    struct sampler_params sp; /* --temp etc.; temperature 0: greedy */
};

/* A flag's positive number (under 1e6) of unit, times scale into *out. */
static int parse_rate(const char *flag, const char *v, const char *unit, double scale, double *out)
{
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || *end || end == v || !(x > 0 && x < 1e6)) {
        fprintf(stderr, "cllm bench: %s needs a positive number of %s (got \"%s\")\n", flag, unit,
                v ? v : "");
        return -1;
    }
    *out = x * scale;
    return 0;
}


static void bench_usage(FILE *f)
{
    fprintf(f,
            "usage: cllm bench <model> [options]\n"
            "\n"
            "Prefill and decode tokens/s of <model> next to the floor the device's memory\n"
            "bandwidth sets: (weight bytes per token + KV bytes at the mean context) /\n"
            "bandwidth. Prompts are synthetic token ids; decoding is greedy unless --temp\n"
            "says otherwise; EOS is ignored.\n"
            "\n"
            "options:\n"
            "  -p, --prompt-tokens P    prompt length (default 512); prefill is one forward\n"
            "                           pass over all P tokens\n"
            "  -n, --n-predict N        tokens to decode after the prompt (default 128)\n"
            "  --prefill-chunk C        prefill in forward passes of at most C tokens, as\n"
            "                           cllm serve --prefill-chunk does (default: P, one pass)\n"
            "  --batch S,S,...          also run S concurrent streams (P-token prompts, N\n"
            "                           tokens each) through the batching engine and report\n"
            "                           aggregate decode tok/s while all S decode, and TTFT\n"
            "  --reps R                 repeat each measurement R times, report the median\n"
            "                           (default 1)\n"
            "  --kv-block-size N        tokens per KV block in the --batch runs (a power of\n"
            "                           two, 8..256; default the engine's, 16)\n"
            "  --bandwidth GBPS         memory bandwidth for the floor in GB/s (default:\n"
            "                           measured on the device)\n"
            "  --peak-tflops T          the device's matmul peak in TFLOP/s: prefill gets a\n"
            "                           floor too (FLOPs a token / peak; default none, the\n"
            "                           prefill row shows the TFLOP/s it reached)\n"
            "  --temp T                 decode by sampling at temperature T (default 0:\n"
            "                           greedy); with --top-k K, --top-p P, --min-p M and\n"
            "                           --seed S as for cllm run (on a GPU the draw is made\n"
            "                           there, CLLM_CUDA_SAMPLE=0 moves it to the host)\n"
            "  --draft-model D          also decode one stream through the engine with D\n"
            "                           drafting (two-model speculation, as cllm serve\n"
            "                           --draft-model), next to the same without drafts\n"
            "  --num-draft-tokens K     drafts a step with --draft-model (1..32; default 3)\n"
            "  --draft-p-min P          drafts stop before one the draft model gives less\n"
            "                           than P (0..1; default 0: never)\n"
            "  --compiled-decode on|off decode steps recorded once as CUDA graphs and\n"
            "                           replayed (default on; the same output either way)\n"
            "  -t, --threads N          CPU threads (default: all cores)\n"
            "  --device D               cpu, cuda, cuda:N or auto (default cpu)\n");
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out)
{
    return cli_parse_int("cllm bench", flag, v, lo, hi, out);
}

/* "1,8,32" into o->batch; every entry a stream count in [1, MAX_STREAMS]. */
static int parse_batch_list(const char *v, struct bench_opts *o)
{
    const char *p = v;
    bool ok = v && *v;
    o->n_batch = 0;
    while (ok && *p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        ok = isdigit((unsigned char)*p) && end != p && !errno && x >= 1 && x <= MAX_STREAMS && (*end == ',' || !*end) &&
             o->n_batch < MAX_BATCHES && !(*end == ',' && !end[1]);
        if (ok)
            o->batch[o->n_batch++] = (int)x;
        p = *end ? end + 1 : end;
    }
    if (!ok) {
        fprintf(stderr, "cllm bench: --batch needs a comma-separated list of at most %d stream "
                        "counts in [1, %d] (got \"%s\")\n", MAX_BATCHES, MAX_STREAMS, v ? v : "");
        return -1;
    }
    return 0;
}

/* 0 ok, 1 --help, -1 usage error (already reported). */
static int parse_bench_args(int argc, char **argv, struct bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_prompt = 512;
    o->n_gen = 128;
    o->reps = 1;
    o->n_draft = 3;
    o->sp = (struct sampler_params){.temperature = 0, .top_p = 1, .seed = 1};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0, takes = 1;
        if (!strcmp(a, "--device")) o->device = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt-tokens")) rc = parse_int(a, v, 1, 1 << 24, &o->n_prompt);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) rc = parse_int(a, v, 1, 1 << 24, &o->n_gen);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) rc = parse_int(a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "--reps")) rc = parse_int(a, v, 1, 1000, &o->reps);
        else if (!strcmp(a, "--prefill-chunk")) rc = parse_int(a, v, 1, 1 << 24, &o->prefill_chunk);
        else if (!strcmp(a, "--kv-block-size")) {
            rc = parse_int(a, v, 8, 256, &o->kv_block);
            if (!rc && (o->kv_block & (o->kv_block - 1))) {
                fprintf(stderr, "cllm bench: --kv-block-size %s: needs a power of two from 8 to "
                                "256\n", v);
                return -1;
            }
        }
        else if (!strcmp(a, "--batch")) rc = parse_batch_list(v, o);
        else if (!strcmp(a, "--compiled-decode"))
            rc = cli_parse_onoff("cllm bench", a, v, &o->compiled_decode);
        else if (!strcmp(a, "--draft-model")) o->draft = v;
        else if (!strcmp(a, "--num-draft-tokens")) rc = parse_int(a, v, 1, 32, &o->n_draft);
        else if (!strcmp(a, "--draft-p-min")) {
            rc = cli_parse_float("cllm bench", a, v, &o->draft_p_min);
            if (!rc && !(o->draft_p_min >= 0 && o->draft_p_min <= 1)) {
                fprintf(stderr, "cllm bench: --draft-p-min %s: needs a probability in [0, 1]\n", v);
                return -1;
            }
        }
        else if (!strcmp(a, "--top-k")) rc = parse_int(a, v, 0, 1 << 30, &o->sp.top_k);
        else if (!strcmp(a, "--seed")) {
            int seed = 0;
            rc = parse_int(a, v, 0, 2147483647, &seed);
            o->sp.seed = (uint64_t)seed;
        }
        else if (!strcmp(a, "--temp")) rc = cli_parse_float("cllm bench", a, v, &o->sp.temperature);
        else if (!strcmp(a, "--top-p")) rc = cli_parse_float("cllm bench", a, v, &o->sp.top_p);
        else if (!strcmp(a, "--min-p")) rc = cli_parse_float("cllm bench", a, v, &o->sp.min_p);
        else if (!strcmp(a, "--bandwidth")) rc = parse_rate(a, v, "GB/s", 1e9, &o->bandwidth);
        else if (!strcmp(a, "--peak-tflops")) rc = parse_rate(a, v, "TFLOP/s", 1e12, &o->peak_flops);
        else {
            takes = 0;
            if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
                bench_usage(stdout);
                return 1;
            } else if (a[0] == '-' && a[1]) {
                fprintf(stderr, "cllm bench: unknown option %s (see cllm bench --help)\n", a);
                return -1;
            } else if (!o->model) {
                o->model = a;
            } else {
                fprintf(stderr, "cllm bench: unexpected argument \"%s\"\n", a);
                return -1;
            }
        }
        if (rc)
            return -1;
        if (takes) {
            if (!v) {
                fprintf(stderr, "cllm bench: %s needs a value\n", a);
                return -1;
            }
            i++;
        }
    }
    if (!o->model) {
        fprintf(stderr, "cllm bench: no model given (cllm bench <model> [-p P] [-n N])\n");
        return -1;
    }
    if (!o->prefill_chunk || o->prefill_chunk > o->n_prompt)
        o->prefill_chunk = o->n_prompt; /* a chunk longer than the prompt is the prompt */
    struct sampler tmp;
    struct err e = {{0}};
    if (sampler_init(&tmp, &o->sp, 1, &e)) { /* the sampler's own range checks */
        fprintf(stderr, "cllm bench: %s\n", e.msg);
        return -1;
    }
    sampler_free(&tmp);
    return 0;
}

static size_t tensor_bytes(const struct tensor *t)
{
    return tensor_present(t) ? (size_t)t->rows * dtype_row_bytes(t->dtype, t->cols) : 0;
}

/* Bytes of weights one decode token reads: every layer matrix, the LM
 * head, the norm vectors and biases (f32 after load), and one row of the
 * embedding table (a tied head is read in full as the LM head anyway). */
static size_t weight_bytes_per_token(const struct model *m)
{
    size_t b = model_weight_bytes_per_token(m) + tensor_bytes(&m->out_norm) +
               dtype_row_bytes(m->tok_embd.dtype, m->tok_embd.cols);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct layer_weights *w = &m->layers[l];
        b += tensor_bytes(&w->attn_norm) + tensor_bytes(&w->ffn_norm) + tensor_bytes(&w->q_norm) +
             tensor_bytes(&w->k_norm) + tensor_bytes(&w->bq) + tensor_bytes(&w->bk) +
             tensor_bytes(&w->bv);
    }
    return b;
}

/* "q8_0 97.1%, f32 2.9%": the dtypes of the matrices read per token, by bytes. */
static void dtype_summary(const struct model *m, char *out, size_t cap)
{
    size_t by[DT_COUNT] = {0}, total = 0;
    by[m->lm_head.dtype] += tensor_bytes(&m->lm_head);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct tensor *ts[LAYER_MATRICES];
        layer_matrices(&m->layers[l], ts);
        for (int i = 0; i < LAYER_MATRICES; i++)
            by[ts[i]->dtype] += tensor_bytes(ts[i]);
    }
    for (int d = 0; d < DT_COUNT; d++)
        total += by[d];
    size_t len = 0;
    out[0] = 0;
    for (int d = 0; d < DT_COUNT; d++)
        if (by[d] == total) { /* one dtype */
            snprintf(out, cap, "%s (every matrix)", dtype_name((enum dtype)d));
            return;
        }
    for (int d = 0; d < DT_COUNT && len < cap; d++)
        if (by[d])
            len += (size_t)snprintf(out + len, cap - len, "%s%s %.1f%%", len ? ", " : "",
                                    dtype_name((enum dtype)d), 100.0 * (double)by[d] / (double)total);
}

/* Distinct, deterministic ids away from the low (often special) ids. */
static void make_prompt(int *ids, int n, int stream, int vocab)
{
    int base = vocab > 400 ? 100 : 0, range = vocab - 2 * base;
    for (int i = 0; i < n; i++)
        ids[i] = base + (int)(((int64_t)stream * 7919 + (int64_t)i * 104729) % range);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Nearest rank of sorted v. */
static double percentile(const double *v, int n, double p)
{
    int k = (int)((p / 100.0) * n + 0.999999) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

/* The decode floor in tok/s: per step, the weights once plus every stream's
 * K/V at the mean context, for s tokens. 0 when the bandwidth is unknown. */
static double floor_tps(double bw, double weight_bytes, double kv_bytes_ctx, int s)
{
    return bw > 0 ? s * bw / (weight_bytes + s * kv_bytes_ctx) : 0;
}

/* FLOPs a token of a P-token prefill (a multiply-add is 2), split into the
 * layer matrices' (each once a token) and the attention's (QK^T and PV
 * over the keys each query sees: i + 1 for position i, capped by a sliding
 * window; n_heads query heads whatever the KV heads); the LM head counts
 * once, for the prompt's last token. */
static void prefill_flops(const struct model *m, int P, double *mats, double *attn)
{
    double elems = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct tensor *ts[LAYER_MATRICES];
        layer_matrices(&m->layers[l], ts);
        for (int i = 0; i < LAYER_MATRICES; i++)
            if (tensor_present(ts[i]))
                elems += (double)ts[i]->rows * (double)ts[i]->cols;
    }
    const struct model_config *c = &m->cfg;
    const double W = c->sliding_window > 0 && c->sliding_window < P ? c->sliding_window : P;
    const double keys = W * (W + 1) / 2 + ((double)P - W) * W; /* summed over the positions */
    *mats = 2 * elems + 2.0 * m->lm_head.rows * m->lm_head.cols / P;
    *attn = 4.0 * c->n_layers * c->n_heads * c->head_dim * keys / P;
}

static void print_floor(double tps, double floor)
{
    if (floor > 0)
        printf("  floor %10.1f tok/s %5.1f%%\n", floor, 100.0 * tps / floor);
    else
        printf("  floor - (bandwidth unknown)\n");
}

struct single_result {
    double prefill_tps, decode_tps;
    double kv_bytes_per_token; /* of the pool this backend keeps */
    double bandwidth;          /* measured bytes/s, or <= 0 */
    char bw_err[256];
    char device[160];
    bool head_pick; /* the steps may read the head's int8 copy (backend head_pick) */
};

/* One sequence on a backend of its own: measures the bandwidth (unless
 * given), warms up, then times reps × (prefill of P tokens in one forward,
 * N greedy decode steps). */
static int run_single(const struct model *m, const struct bench_opts *o, struct single_result *r,
                      struct err *e)
{
    const struct model_config *c = &m->cfg;
    const int P = o->n_prompt, N = o->n_gen;
    struct backend *be = NULL;
    struct forward_state fs = {0};
    struct kv_pool pool = {0};
    struct sampler smp = {0};
    int *prompt = malloc(sizeof(int) * (size_t)P);
    float *logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    double *pre = calloc((size_t)o->reps, sizeof(double)), *dec = calloc((size_t)o->reps, sizeof(double));
    int rc = -1;
    if (!prompt || !logits || !pre || !dec) {
        err_set(e, "out of memory");
        goto out;
    }
    make_prompt(prompt, P, 0, c->vocab_size);
    /* forward_init with the chunk (P unless --prefill-chunk): forward_tokens
     * splits the prompt into passes of that many tokens; the pool holds one
     * sequence of P + N at a time. */
    be = backend_create(o->device, o->threads, e);
    if (be)
        backend_set_compiled_decode(be, o->compiled_decode);
    if (!be || backend_load_weights(be, m, e) || forward_init(&fs, m, be, o->prefill_chunk, e) ||
        kv_pool_init(&pool, be, c->n_layers, c->n_kv_heads, c->head_dim, KV_BLOCK,
                     (P + N + KV_BLOCK - 1) / KV_BLOCK + 1, e) ||
        backend_load_spare(be, m, 0, e))
        goto out;
    r->kv_bytes_per_token = (double)kv_pool_bytes(&pool) / ((double)pool.n_blocks * pool.block_size);
    if (be->ops->mem_info) {
        struct backend_mem mi;
        be->ops->mem_info(be, &mi);
        snprintf(r->device, sizeof r->device, "%s", mi.device);
    } else if (o->threads) {
        snprintf(r->device, sizeof r->device, "%s, %d threads", be->ops->name, o->threads);
    } else {
        snprintf(r->device, sizeof r->device, "%s, all cores", be->ops->name);
    }
    r->head_pick = be->ops->head_pick != NULL &&
                   (o->sp.temperature <= 0 || (o->sp.top_k > 0 && o->sp.top_k <= HEAD_PICK_MAX_K));
    if (o->bandwidth > 0) {
        r->bandwidth = o->bandwidth;
    } else if (be->ops->mem_bandwidth) {
        struct err be_err = {{0}};
        r->bandwidth = be->ops->mem_bandwidth(be, &be_err);
        if (r->bandwidth <= 0)
            snprintf(r->bw_err, sizeof r->bw_err, "%s", be_err.msg);
    } else {
        snprintf(r->bw_err, sizeof r->bw_err, "the %s backend cannot measure it", be->ops->name);
    }

    /* Warmup, untimed: first-use costs (kernel loading, CUDA graph capture,
     * page faults on the weights) are not prefill or decode speed. */
    struct kv_seq seq = {0};
    int next = 0;
    if (sampler_init(&smp, &o->sp, c->vocab_size, e))
        goto out;
    /* three steps: the first runs eagerly, the next two record a decode
     * graph for each half of the CUDA backend's step record */
    int wrc = cli_forward_next(&fs, &pool, &seq, prompt, P, logits, &smp, &next, e);
    if (!wrc)
        wrc = cli_decode_n(&fs, &pool, &seq, N < 3 ? N : 3, logits, &smp, &next, e);
    kv_seq_release(&pool, &seq);
    if (wrc)
        goto out;
    for (int rep = 0; rep < o->reps; rep++) {
        seq = (struct kv_seq){0};
        double t0 = clock_now_s();
        int frc = cli_forward_next(&fs, &pool, &seq, prompt, P, logits, &smp, &next, e);
        double t1 = clock_now_s();
        if (!frc)
            frc = cli_decode_n(&fs, &pool, &seq, N, logits, &smp, &next, e);
        double t2 = clock_now_s();
        kv_seq_release(&pool, &seq);
        if (frc)
            goto out;
        pre[rep] = P / (t1 - t0);
        dec[rep] = N / (t2 - t1);
    }
    r->prefill_tps = median(pre, o->reps);
    r->decode_tps = median(dec, o->reps);
    rc = 0;
out:
    sampler_free(&smp);
    free(prompt);
    free(logits);
    free(pre);
    free(dec);
    if (pool.k)
        kv_pool_free(&pool);
    forward_free(&fs);
    backend_destroy(be);
    return rc;
}

struct batch_result {
    double agg_tps;           /* median over reps; 0 when no window */
    double ttft_p50, ttft_p99; /* seconds, over every stream of every rep */
    uint64_t preemptions;
    uint64_t spec_steps, spec_drafted, spec_accepted; /* with a draft model */
    int *ids; /* when set: the last rep's tokens, [S][N] */
};

/* Records one event of stream s: the time the engine queued a token in
 * times[s][i] (the first cap tokens; not when this thread read it, which
 * on a busy machine may be after the last: a 260K-parameter model's 22
 * tokens of two streams read in one pass gave an empty window) and its id
 * in ids[s][i] (the first N), or the end of the stream. want: the tokens
 * a stream must give unless cancelled (cancelled: set by the caller when
 * it cancels the rest). */
static int on_event(const struct engine_event *ev, int s, int N, int cap, int want,
                    double *times, int *ids, int *got, int *done, int *n_done, struct err *e)
{
    if (ev->finish == ENGINE_FINISH_NONE) {
        if (got[s] < cap)
            times[(size_t)s * cap + got[s]] = ev->t;
        if (got[s] < N && ids)
            ids[(size_t)s * N + got[s]] = ev->token;
        got[s]++;
        return 0;
    }
    done[s] = (int)ev->finish;
    ++*n_done;
    if (ev->finish == ENGINE_FINISH_ERROR)
        return err_set(e, "%s", ev->error);
    if (ev->finish != ENGINE_FINISH_CANCELLED && got[s] < want)
        return err_set(e, "a stream ended after %d of %d tokens", got[s], want);
    return 0;
}

/* Waits for every stream to end, recording when each token arrived (at
 * most cap a stream). With until > 0 (the batch window): once every
 * stream has a token, the one whose first came last has to reach until
 * tokens, then the rest are cancelled; *last is that stream and fin[s]
 * how stream s ended (enum engine_finish). */
static int collect(struct engine_request **rs, int S, int N, int cap, int until, double *times,
                   int *ids, int *got, int *last, int *fin, struct err *e)
{
    int *done = calloc((size_t)S, sizeof(int)); /* its engine_finish, 0 while running */
    if (!done)
        return err_set(e, "out of memory");
    int n_done = 0, rc = 0, want = until > 0 ? 0 : N;
    bool cancelled = false;
    if (last)
        *last = -1;
    memset(got, 0, sizeof(int) * (size_t)S);
    while (n_done < S && !rc) {
        bool any = false;
        struct engine_event ev;
        for (int s = 0; s < S && !rc; s++)
            while (!rc && !done[s] && engine_request_next(rs[s], &ev, 0) == 1) {
                any = true;
                rc = on_event(&ev, s, N, cap, want, times, ids, got, done, &n_done, e);
            }
        if (until > 0 && !cancelled && !rc) {
            /* the stream whose first token came last, once all have one */
            int l = -1;
            for (int s = 0; s < S; s++) {
                if (got[s] == 0) {
                    l = -1;
                    break;
                }
                if (l < 0 || times[(size_t)s * cap] > times[(size_t)l * cap])
                    l = s;
            }
            if (l >= 0 && (got[l] >= until || done[l])) {
                *last = l;
                for (int s = 0; s < S; s++)
                    if (!done[s])
                        engine_request_cancel(rs[s]);
                cancelled = true;
            }
        }
        /* A pass found nothing: block on one unfinished stream (the engine
         * emits every stream's token at the end of the same step) rather
         * than spin on the cores the engine computes on. */
        if (!any && !rc && n_done < S) {
            int s = 0;
            while (done[s])
                s++;
            if (engine_request_next(rs[s], &ev, 5) == 1)
                rc = on_event(&ev, s, N, cap, want, times, ids, got, done, &n_done, e);
        }
    }
    if (fin)
        memcpy(fin, done, sizeof(int) * (size_t)S);
    free(done);
    return rc;
}

/* Decode steps of all S streams at the start of the batch window that
 * are left out of it: the first step of a new batch shape runs eagerly
 * and the second records its CUDA graph, costs a server pays once per
 * shape (docs/benchmarks.md, session 58). */
#define BATCH_WARM_STEPS 2

/* S streams through the engine, as `cllm serve` runs them: max_running S,
 * every prompt prefilled in chunks of C tokens (the whole prompt unless
 * --prefill-chunk), one chunk a step beside decoding streams, no prompt
 * cache, a pool that fits all. The aggregate is steady-state decode: the
 * window opens when the stream whose prompt went last has its first
 * BATCH_WARM_STEPS + 1 tokens and closes N - 1 steps later, every stream
 * decoding throughout (each may generate up to `before` tokens while the
 * others' prompts go in, so its cap allows those too); then the rest are
 * cancelled. */
static int run_batch(const struct model *m, const struct bench_opts *o, int S,
                     const struct model *draft, struct batch_result *r, struct err *e)
{
    const int P = o->n_prompt, N = o->n_gen, R = o->reps, C = o->prefill_chunk;
    int batch_tokens = C + S > MIN_BATCH_TOKENS ? C + S : MIN_BATCH_TOKENS;
    /* steps before the last prompt's first token: one chunk a step (the
     * first step may take more), and a margin */
    const long before = (long)S * ((P + C - 1) / C) + 2;
    long cap_l = N + BATCH_WARM_STEPS + before;
    if (P + cap_l > m->cfg.max_seq) /* cmd_bench checked that P + N fits */
        cap_l = m->cfg.max_seq - P;
    const int cap = (int)cap_l, until = N + BATCH_WARM_STEPS < cap ? N + BATCH_WARM_STEPS : cap;
    struct engine_config cfg = {.n_threads = o->threads, .ctx_len = P + cap,
                                .kv_tokens = (S + 2) * (P + cap + KV_BLOCK),
                                .prefill_chunk = C, .prefill_chunk_shared = C,
                                .batch_tokens = batch_tokens,
                                .max_queue = S + 8, .max_running = S,
                                .prompt_cache_bytes = -1, .device = o->device,
                                .kv_block_size = o->kv_block,
                                .spec_draft = draft ? o->n_draft : 0, .draft_model = draft,
                                .draft_p_min = o->draft_p_min,
                                .compiled_decode = o->compiled_decode};
    struct engine *eng = engine_create(m, &cfg, e);
    if (!eng)
        return -1;
    struct engine_request **rs = calloc((size_t)S, sizeof *rs);
    int *prompt = malloc(sizeof(int) * (size_t)P), *got = calloc((size_t)S, sizeof(int));
    int *fin = calloc((size_t)S, sizeof(int));
    double *times = malloc(sizeof(double) * (size_t)S * (size_t)cap);
    double *ttft = malloc(sizeof(double) * (size_t)S * (size_t)R), *agg = calloc((size_t)R, sizeof(double));
    int rc = -1, n_req = 0;
    if (!rs || !prompt || !got || !fin || !times || !ttft || !agg) {
        err_set(e, "out of memory");
        goto out;
    }
    struct engine_params par = {.sp = o->sp, .ignore_eos = true};
    /* Warmup, untimed: up to two streams of the same prompt length and a
     * few tokens, so kernel loading and first-shape costs stay out. */
    n_req = S < 2 ? S : 2;
    par.max_tokens = N < 3 ? N : 3;
    for (int s = 0; s < n_req; s++) {
        make_prompt(prompt, P, 1 + R * S + s, m->cfg.vocab_size);
        if (!(rs[s] = engine_request_new(prompt, P, &par, e)) || engine_submit(eng, rs[s], e) < 0)
            goto out;
    }
    if (collect(rs, n_req, par.max_tokens, par.max_tokens, 0, times, NULL, got, NULL, NULL, e))
        goto out;
    for (int s = 0; s < n_req; s++) {
        engine_request_release(rs[s]);
        rs[s] = NULL;
    }
    n_req = 0;

    par.max_tokens = cap;
    for (int rep = 0; rep < R; rep++) {
        for (int s = 0; s < S; s++) { /* stream 0 is single-sequence run's prompt: distinct */
            make_prompt(prompt, P, 1 + rep * S + s, m->cfg.vocab_size);
            if (!(rs[s] = engine_request_new(prompt, P, &par, e)))
                goto out;
            n_req = s + 1;
        }
        /* All S arrive together: the engine's first step sees every one,
         * whatever this thread's timing (one by one, the first stream could
         * start its prefill alone). */
        const double t_sub = clock_now_s();
        if (engine_submit_many(eng, rs, S, e) < 0)
            goto out;
        int last;
        if (collect(rs, S, N, cap, until, times, r->ids, got, &last, fin, e))
            goto out;
        /* From the last stream's token BATCH_WARM_STEPS + 1 to its token
         * `until`; a stream that ended sooner (its cap: more steps went to
         * prompts than `before` allows) closes the window there. */
        const int w0 = until - N;
        double t_start = last >= 0 && got[last] > w0 ? times[(size_t)last * cap + w0] : 0;
        double t_end = last >= 0 ? times[(size_t)last * cap + (got[last] < until ? got[last] : until) - 1]
                                 : 0;
        for (int s = 0; s < S; s++) {
            const double *ts = times + (size_t)s * cap;
            ttft[rep * S + s] = ts[0] - t_sub;
            if (fin[s] == ENGINE_FINISH_LENGTH && got[s] > 0 && ts[got[s] - 1] < t_end)
                t_end = ts[got[s] - 1];
        }
        int in_window = 0;
        for (int s = 0; s < S; s++)
            for (int i = 0; i < got[s] && i < cap; i++) {
                const double t = times[(size_t)s * cap + i];
                in_window += t > t_start && t <= t_end;
            }
        agg[rep] = t_end > t_start && in_window ? in_window / (t_end - t_start) : 0;
        for (int s = 0; s < S; s++) {
            engine_request_release(rs[s]);
            rs[s] = NULL;
        }
        n_req = 0;
    }
    r->agg_tps = median(agg, R);
    qsort(ttft, (size_t)S * R, sizeof *ttft, cmp_double);
    r->ttft_p50 = percentile(ttft, S * R, 50);
    r->ttft_p99 = percentile(ttft, S * R, 99);
    struct engine_stats st;
    engine_get_stats(eng, &st);
    r->preemptions = st.preemptions;
    r->spec_steps = st.spec_steps;
    r->spec_drafted = st.spec_drafted;
    r->spec_accepted = st.spec_accepted;
    rc = 0;
out:
    for (int s = 0; s < n_req && rs; s++)
        if (rs[s])
            engine_request_release(rs[s]);
    engine_destroy(eng);
    free(rs);
    free(prompt);
    free(got);
    free(fin);
    free(times);
    free(ttft);
    free(agg);
    return rc;
}

/* One engine (with the draft model dm, or none), one greedy prompt twice,
 * one request after the other: the second meets what the first left (the
 * draft's index, recorded graphs, the prompt cache: its prefill is the
 * prompt's last block alone). Returns how many of the first N tokens
 * agree, -1 on error. */
static int spec_repeats(const struct model *m, const struct bench_opts *o,
                        const struct model *dm, struct err *e)
{
    const int P = o->n_prompt, N = o->n_gen;
    struct engine_config cfg = {.n_threads = o->threads, .ctx_len = P + N, .kv_tokens = 4 * (P + N),
                                .prefill_chunk = o->prefill_chunk, .max_queue = 4,
                                .max_running = 1,
                                .device = o->device, .spec_draft = dm ? o->n_draft : 0,
                                .draft_model = dm, .draft_p_min = o->draft_p_min,
                                .compiled_decode = o->compiled_decode};
    struct engine *eng = engine_create(m, &cfg, e);
    int *prompt = malloc(sizeof(int) * (size_t)P), *ids = malloc(sizeof(int) * 2 * (size_t)N);
    double *times = malloc(sizeof(double) * (size_t)N);
    int rc = -1, got;
    if (!eng || !prompt || !ids || !times) {
        if (eng)
            err_set(e, "out of memory");
        goto out;
    }
    make_prompt(prompt, P, 7, m->cfg.vocab_size);
    struct engine_params par = {.sp = {.temperature = 0, .top_p = 1}, .ignore_eos = true,
                                .max_tokens = N};
    for (int t = 0; t < 2; t++) {
        struct engine_request *r = engine_request_new(prompt, P, &par, e);
        int bad = !r || engine_submit(eng, r, e) < 0 || collect(&r, 1, N, N, 0, times, ids + t * N, &got, NULL, NULL, e);
        if (r)
            engine_request_release(r);
        if (bad)
            goto out;
    }
    rc = 0;
    while (rc < N && ids[rc] == ids[N + rc])
        rc++;
    struct engine_stats st;
    engine_get_stats(eng, &st);
    if (st.spec_error[0])
        printf("(speculation stopped: %s)\n", st.spec_error);
out:
    engine_destroy(eng);
    free(prompt);
    free(ids);
    free(times);
    return rc;
}

/* One stream through the engine without drafts, then with the draft
 * model's: decode tok/s of each (the same prompt, so the same tokens when
 * greedy), and what the drafts did. The warmup also brings the draft
 * model's first-shape costs forward. */
static int run_spec(const struct model *m, const struct bench_opts *o, struct err *e)
{
    struct model dm;
    if (model_load(&dm, o->draft, e))
        return -1;
    int rc = -1;
    if (dm.cfg.vocab_size != m->cfg.vocab_size)
        printf("(the draft model has %d ids, the model %d: drafts past %d stop a step's)\n",
               dm.cfg.vocab_size, m->cfg.vocab_size, m->cfg.vocab_size);
    struct batch_result plain = {0}, spec = {0};
    plain.ids = malloc(sizeof(int) * (size_t)o->n_gen);
    spec.ids = malloc(sizeof(int) * (size_t)o->n_gen);
    if (!plain.ids || !spec.ids) {
        err_set(e, "out of memory");
        goto out;
    }
    if (run_batch(m, o, 1, NULL, &plain, e) || run_batch(m, o, 1, &dm, &spec, e))
        goto out;
    /* Greedy, the tokens are the same up to a near-tie that a span's rows
     * resolve differently from single-token steps' (docs/design.md, "Batch
     * invariance"); sampled, the draws are spent differently. */
    int same = 0;
    while (same < o->n_gen && plain.ids[same] == spec.ids[same])
        same++;
    printf("engine  tg%-5d    %10.1f tok/s  (one stream, no drafts)\n", o->n_gen, plain.agg_tps);
    double acc = spec.spec_drafted ? (double)spec.spec_accepted / (double)spec.spec_drafted : 0;
    double per = spec.spec_steps ? (double)(spec.spec_accepted + spec.spec_steps) /
                                       (double)spec.spec_steps : 0;
    printf("spec    tg%-5d    %10.1f tok/s  (%.2fx; draft %s, %d drafts a step: %.1f%% kept,\n"
           "                                  %.2f tokens a verify step over %llu steps)\n",
           o->n_gen, spec.agg_tps, plain.agg_tps > 0 ? spec.agg_tps / plain.agg_tps : 0,
           o->draft, o->n_draft, 100 * acc, per, (unsigned long long)spec.spec_steps);
    int again = spec_repeats(m, o, &dm, e), again_plain = again < 0 ? -1 : spec_repeats(m, o, NULL, e);
    if (again_plain < 0)
        goto out;
    printf("        the first %d of %d tokens the same as without drafts; %d the same when\n"
           "        one engine answers the prompt twice (without drafts: %d)\n", same, o->n_gen,
           again, again_plain);
    fflush(stdout);
    rc = 0;
out:
    free(plain.ids);
    free(spec.ids);
    model_free(&dm);
    return rc;
}

int cmd_bench(int argc, char **argv)
{
    struct bench_opts o;
    int prc = parse_bench_args(argc, argv, &o);
    if (prc)
        return prc > 0 ? 0 : 2;
    struct err e = {{0}};
    struct model m;
    if (model_load(&m, o.model, &e)) {
        fprintf(stderr, "cllm bench: %s\n", e.msg);
        return 2;
    }
    const struct model_config *c = &m.cfg;
    const int P = o.n_prompt, N = o.n_gen;
    if ((long)P + N > c->max_seq) {
        fprintf(stderr, "cllm bench: -p %d + -n %d = %ld tokens exceeds the model's context of %d\n",
                P, N, (long)P + N, c->max_seq);
        model_free(&m);
        return 2;
    }
    struct single_result sr = {0};
    if (run_single(&m, &o, &sr, &e)) {
        fprintf(stderr, "cllm bench: %s\n", e.msg);
        model_free(&m);
        return 1;
    }
    double wb = (double)weight_bytes_per_token(&m);
    /* Decode step i attends to P + i + 1 positions: P + (N + 1) / 2 on
     * average (capped by a sliding window). */
    double ctx = P + (N + 1) / 2.0;
    if (c->sliding_window > 0 && ctx > c->sliding_window)
        ctx = c->sliding_window;
    double kv_ctx = sr.kv_bytes_per_token * ctx;
    double fl_mats, fl_attn;
    prefill_flops(&m, P, &fl_mats, &fl_attn);
    const double fl = fl_mats + fl_attn;
    char dts[160];
    dtype_summary(&m, dts, sizeof dts);

    printf("model:      %s (%s, %s, %d layers, dim %d, vocab %d)\n", o.model, m.format, c->arch,
           c->n_layers, c->dim, c->vocab_size);
    printf("device:     %s\n", sr.device);
    printf("weights:    %s; %.2f MB read per token (layer matrices, LM head,\n"
           "            norms, one embedding row)\n", dts, wb / 1e6);
    printf("kv cache:   %.1f KB per token of context; %.2f MB read per decode token at the mean\n"
           "            context %.1f\n", sr.kv_bytes_per_token / 1e3, kv_ctx / 1e6, ctx);
    if (sr.bandwidth > 0)
        printf("bandwidth:  %.1f GB/s (%s)\n", sr.bandwidth / 1e9,
               o.bandwidth > 0 ? "--bandwidth" : "measured");
    else
        printf("bandwidth:  unknown (%s); no floor (give --bandwidth GBPS)\n", sr.bw_err);
    printf("floor:      S x bandwidth / (weight bytes + S x KV bytes at the mean context), S streams\n");
    if (sr.head_pick)
        printf("head:       one stream's steps (a greedy pick or a top-k draw) read the LM head's int8\n"
               "            copy where the backend takes them (head_pick, half a bf16 head); the floor\n"
               "            counts the whole head\n");
    printf("compute:    %.3f %s a prefill token (matrices %.1f%%, attention %.1f%%)",
           fl >= 1e9 ? fl / 1e9 : fl / 1e6, fl >= 1e9 ? "GFLOP" : "MFLOP", 100 * fl_mats / fl,
           100 * fl_attn / fl);
    if (o.peak_flops > 0)
        printf("; prefill floor = %g TFLOP/s (--peak-tflops) / that\n", o.peak_flops / 1e12);
    else
        printf("\n");
    if (o.n_batch)
        printf("batch:      engine with max_running S, prefill_chunk %d, batch_tokens max(%d, C+S),\n"
               "            distinct prompts, no prompt cache; agg = tokens a second over %d steps\n"
               "            in which all S streams decode, after the first %d such steps (the\n"
               "            shape's warmup); TTFT from submit\n", o.prefill_chunk, MIN_BATCH_TOKENS,
               N - 1, BATCH_WARM_STEPS);
    if (o.sp.temperature > 0)
        printf("decoding:   sampled: temperature %g, top-k %d, top-p %g, min-p %g, seed %llu\n",
               o.sp.temperature, o.sp.top_k, o.sp.top_p, o.sp.min_p,
               (unsigned long long)o.sp.seed);
    else
        printf("decoding:   greedy\n");
    if (o.prefill_chunk < P)
        printf("prefill:    in passes of %d tokens (--prefill-chunk)\n", o.prefill_chunk);
    printf("runs:       %d rep%s, median\n\n", o.reps, o.reps > 1 ? "s" : "");

    /* the floor in the decode row's column */
    printf("prefill p%-6d    %10.1f tok/s %9.2f TFLOP/s", P, sr.prefill_tps,
           sr.prefill_tps * fl / 1e12);
    if (o.peak_flops > 0) {
        printf("%*s", 36, "");
        print_floor(sr.prefill_tps, o.peak_flops / fl);
    } else {
        printf("\n");
    }
    printf("decode  tg%-5d    %10.1f tok/s%*s", N, sr.decode_tps, 54, "");
    print_floor(sr.decode_tps, floor_tps(sr.bandwidth, wb, kv_ctx, 1));
    fflush(stdout);

    int rc = 0;
    for (int i = 0; i < o.n_batch; i++) {
        int S = o.batch[i];
        struct batch_result br = {0};
        if (run_batch(&m, &o, S, NULL, &br, &e)) {
            fprintf(stderr, "cllm bench: --batch %d: %s\n", S, e.msg);
            rc = 1;
            break;
        }
        printf("batch   %-5d agg %10.1f tok/s  per-stream %8.1f  ttft p50/p99 %7.1f /%7.1f ms", S,
               br.agg_tps, br.agg_tps / S, br.ttft_p50 * 1e3, br.ttft_p99 * 1e3);
        print_floor(br.agg_tps, floor_tps(sr.bandwidth, wb, kv_ctx, S));
        if (br.agg_tps <= 0)
            printf("        (no window in which all %d streams decode: -n must be 2 or more)\n", S);
        if (br.preemptions)
            printf("        (%llu preemptions: the pool ran short; the figure includes recompute)\n",
                   (unsigned long long)br.preemptions);
        fflush(stdout);
    }
    if (!rc && o.draft && run_spec(&m, &o, &e)) {
        fprintf(stderr, "cllm bench: --draft-model: %s\n", e.msg);
        rc = 1;
    }
    model_free(&m);
    return rc;
}
