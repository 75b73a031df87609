/* server.c - one `cllm serve` process from start to exit: port pre-flight
 * and bind, model + tokenizer + generation_config.json, the engine, the
 * HTTP daemon, then SIGINT/SIGTERM: stop accepting, let in-flight requests
 * finish up to CLLM_SHUTDOWN_TIMEOUT_MS, cancel the rest, exit cleanly. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "serve/internal.h"
#include "serve/serve.h"
#include "tokenizer/chat_template.h"

/* ---- network ---- */

bool serve_port_in_use(const char *host, int port)
{
    /* a wildcard bind is probed on loopback, where a local server answers */
    const char *h = !strcmp(host, "0.0.0.0") || !*host ? "127.0.0.1"
                    : !strcmp(host, "::") ? "::1" : host;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(h, ps, &hints, &res))
        return false;
    bool used = false;
    for (struct addrinfo *a = res; a && !used; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            used = true;
        } else if (errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int err = 0;
            socklen_t len = sizeof err;
            if (poll(&p, 1, 1000) == 1 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) &&
                err == 0)
                used = true;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return used;
}

static int listen_on(const char *host, int port, struct err *e)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc)
        return err_set(e, "--host %s: %s", host, gai_strerror(rc));
    int fd = -1, last = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last = errno;
            continue;
        }
        int one = 1, zero = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (a->ai_family == AF_INET6) /* "::" also takes IPv4 */
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0)
            break;
        last = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (last == EADDRINUSE)
            return err_set(e, "port %d on %s is already in use; stop what runs there or pick "
                              "another --port", port, host);
        return err_set(e, "cannot listen on %s:%d: %s", host, port, strerror(last));
    }
    return fd;
}

/* ---- the model ---- */

static void model_id(const char *path, char *out, size_t cap)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/')
        tmp[--n] = 0;
    const char *base = strrchr(tmp, '/') ? strrchr(tmp, '/') + 1 : tmp;
    snprintf(out, cap, "%s", base);
    char *dot = strrchr(out, '.');
    if (dot && (!strcmp(dot, ".gguf") || !strcmp(dot, ".bin")))
        *dot = 0;
}

static void add_stop_id(struct served_model *sm, int id)
{
    if (id < 0 || id >= sm->m.cfg.vocab_size)
        return;
    for (int i = 0; i < sm->m.cfg.n_eos; i++)
        if (sm->m.cfg.eos_ids[i] == id)
            return;
    for (int i = 0; i < sm->n_stop_ids; i++)
        if (sm->stop_ids[i] == id)
            return;
    if (sm->n_stop_ids < (int)(sizeof sm->stop_ids / sizeof sm->stop_ids[0]))
        sm->stop_ids[sm->n_stop_ids++] = id;
}

/* generation_config.json beside the model: sampling defaults and eos ids. */
static int read_generation_config(struct served_model *sm, struct err *e)
{
    char path[1100];
    struct stat st;
    if (stat(sm->path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(path, sizeof path, "%s/generation_config.json", sm->path);
    } else {
        const char *slash = strrchr(sm->path, '/');
        snprintf(path, sizeof path, "%.*s/generation_config.json",
                 slash ? (int)(slash - sm->path) : 1, slash ? sm->path : ".");
    }
    if (access(path, R_OK))
        return 0;
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je);
    if (!g || !json_is_object(g)) {
        json_decref(g);
        return err_set(e, "%s: %s (line %d)", path, g ? "not an object" : je.text, je.line);
    }
    const json_t *v;
    if (json_is_number(v = json_object_get(g, "temperature")))
        sm->gc_temperature = (struct opt_f){true, (float)json_number_value(v)};
    if (json_is_number(v = json_object_get(g, "top_p")))
        sm->gc_top_p = (struct opt_f){true, (float)json_number_value(v)};
    if (json_is_number(v = json_object_get(g, "min_p")))
        sm->gc_min_p = (struct opt_f){true, (float)json_number_value(v)};
    if (json_is_integer(v = json_object_get(g, "top_k")))
        sm->gc_top_k = (struct opt_i){true, (int)json_integer_value(v)};
    if (json_is_number(v = json_object_get(g, "repetition_penalty")))
        sm->gc_repetition = (struct opt_f){true, (float)json_number_value(v)};
    v = json_object_get(g, "eos_token_id");
    if (json_is_integer(v))
        add_stop_id(sm, (int)json_integer_value(v));
    size_t i;
    const json_t *x;
    if (json_is_array(v))
        json_array_foreach(v, i, x) if (json_is_integer(x)) add_stop_id(sm, (int)json_integer_value(x));
    json_decref(g);
    /* values the sampler would refuse are dropped rather than failing every request */
    if (sm->gc_temperature.set && !(sm->gc_temperature.v >= 0))
        sm->gc_temperature.set = false;
    if (sm->gc_top_p.set && !(sm->gc_top_p.v >= 0 && sm->gc_top_p.v <= 1))
        sm->gc_top_p.set = false;
    if (sm->gc_min_p.set && !(sm->gc_min_p.v >= 0 && sm->gc_min_p.v <= 1))
        sm->gc_min_p.set = false;
    if (sm->gc_top_k.set && sm->gc_top_k.v < 0)
        sm->gc_top_k.set = false;
    if (sm->gc_repetition.set && !(sm->gc_repetition.v > 0 && sm->gc_repetition.v <= 100))
        sm->gc_repetition.set = false;
    return 0;
}

/* The draft model of --draft-model must read token ids as the served
 * model does: with a tokenizer of its own, every piece must match; without
 * one (a bare GGUF), the vocabulary sizes must. */
static int load_draft(struct served_model *sm, const char *path, struct err *e)
{
    fprintf(stderr, "cllm serve: loading the draft model %s\n", path);
    if (model_load(&sm->draft, path, e))
        return err_wrap(e, "--draft-model");
    sm->draft_loaded = true;
    struct err te = {{0}};
    struct tokenizer *dt = tok_load_for_model(path, &te);
    if (!dt) {
        if (sm->draft.cfg.vocab_size != sm->m.cfg.vocab_size)
            return err_set(e, "--draft-model %s: no tokenizer of its own (%s) and %d ids where "
                              "the served model has %d: drafts would be other tokens",
                           path, te.msg, sm->draft.cfg.vocab_size, sm->m.cfg.vocab_size);
        fprintf(stderr, "cllm serve: the draft model has no tokenizer of its own; its %d ids "
                        "are taken as the served model's\n", sm->draft.cfg.vocab_size);
        return 0;
    }
    int n = tok_vocab_size(sm->tok), bad = -1;
    if (tok_vocab_size(dt) != n)
        bad = n < tok_vocab_size(dt) ? n : tok_vocab_size(dt);
    for (int i = 0; bad < 0 && i < n; i++) {
        const char *a = tok_piece(sm->tok, i), *b = tok_piece(dt, i);
        if ((a == NULL) != (b == NULL) || (a && strcmp(a, b)))
            bad = i;
    }
    int vd = tok_vocab_size(dt);
    tok_free(dt);
    if (bad >= 0)
        return err_set(e, "--draft-model %s: its tokenizer is not the served model's (%d and "
                          "%d tokens, first difference at id %d); a draft model must share "
                          "the tokenizer", path, vd, n, bad);
    return 0;
}

static int load_model(struct served_model *sm, const struct serve_config *cfg, struct err *e)
{
    snprintf(sm->path, sizeof sm->path, "%s", cfg->model);
    model_id(cfg->model, sm->id, sizeof sm->id);
    if (model_load(&sm->m, cfg->model, e))
        return -1;
    sm->loaded = true;
    char tdir[4096];
    if (cfg->tokenizer) { /* --tokenizer replaces the model's tokenizer and chat template */
        if (tok_override_dir(cfg->tokenizer, tdir, sizeof tdir, e) ||
            !(sm->tok = tok_load_override(cfg->tokenizer, sm->m.cfg.vocab_size, e)))
            return -1;
    } else if (!(sm->tok = tok_load_for_model(cfg->model, e))) {
        return err_wrap(e, "the model's tokenizer");
    }
    if (read_generation_config(sm, e))
        return -1;
    add_stop_id(sm, tok_eos_id(sm->tok));
    if (cfg->draft_model && load_draft(sm, cfg->draft_model, e))
        return -1;
    if (!(sm->gvocab = grammar_vocab_new(sm->tok, sm->m.cfg.vocab_size, e)))
        return -1;
    struct err te = {{0}};
    sm->tmpl = chat_template_load(cfg->tokenizer ? tdir : cfg->model, &te);
    if (!sm->tmpl)
        fprintf(stderr, "cllm serve: %s; chat requests use a plain \"role: content\" "
                        "transcript\n", te.msg);
    int max = sm->m.cfg.max_seq;
    sm->ctx_len = cfg->ctx > 0 && cfg->ctx < max ? cfg->ctx : max;
    if (cfg->ctx > max)
        fprintf(stderr, "cllm serve: warning: --ctx %d is more than the model's %d positions; "
                        "using %d\n", cfg->ctx, max, max);
    return 0;
}

static void unload_model(struct served_model *sm)
{
    chat_template_free(sm->tmpl);
    sm->tmpl = NULL;
    grammar_vocab_free(sm->gvocab);
    sm->gvocab = NULL;
    if (sm->tok)
        tok_free(sm->tok);
    if (sm->loaded)
        model_free(&sm->m);
    if (sm->draft_loaded)
        model_free(&sm->draft);
    sm->draft_loaded = false;
    sm->tok = NULL;
    sm->loaded = false;
}

/* ---- lifecycle ---- */

/* Waits until every request has been answered (not only generated: the
 * last bytes must be out before the daemon stops) or the deadline passes; a
 * second signal ends the wait early. Returns true when everything finished. */
static bool wait_idle(struct server *srv, const sigset_t *sigs, double deadline, bool *again)
{
    while (atomic_load(&srv->in_flight) > 0 || atomic_load(&srv->active) > 0) {
        double left = deadline - clock_now_s();
        if (left <= 0)
            return false;
        struct timespec ts = {0, left > 0.05 ? 50000000L : (long)(left * 1e9)};
        if (again && sigtimedwait(sigs, NULL, &ts) > 0) {
            *again = true;
            return false;
        }
        if (!again)
            nanosleep(&ts, NULL);
    }
    return true;
}

int serve_main(const struct serve_config *cfg, struct err *e)
{
    if (serve_port_in_use(cfg->host, cfg->port))
        return err_set(e, "something is already serving on %s:%d; stop it or pick another "
                          "--port", cfg->host, cfg->port);
    int fd = listen_on(cfg->host, cfg->port, e);
    if (fd < 0)
        return -1;

    sigset_t sigs, old;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    signal(SIGPIPE, SIG_IGN);

    struct server *srv = calloc(1, sizeof *srv);
    if (!srv) {
        close(fd);
        return err_set(e, "out of memory");
    }
    srv->cfg = cfg;
    srv->t_start = clock_now_s();
    srv->created = time(NULL);
    pthread_mutex_init(&srv->mu, NULL);
    struct http *h = NULL;
    int rc = -1;

    fprintf(stderr, "cllm serve: loading %s\n", cfg->model);
    pthread_sigmask(SIG_SETMASK, NULL, &old);
    if (load_model(&srv->sm, cfg, e)) /* Ctrl-C here simply ends the process */
        goto out;
    /* From here signals go to sigwait below, never to a worker thread: block
     * them before any thread exists so every thread inherits the mask. */
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    /* The engine sizes the KV pool once the backend holds the weights:
     * --memory-budget, else the default (75% of RAM / free GPU memory,
     * capped at what --batch sequences of --ctx and the prompt cache use). */
    struct engine_config ec = {.n_threads = cfg->threads, .ctx_len = srv->sm.ctx_len,
                               .max_queue = cfg->max_queue, .device = cfg->device,
                               .kv_block_size = cfg->kv_block_size,
                               .max_running = cfg->batch.set ? cfg->batch.v : 8,
                               .prefill_chunk = cfg->prefill_chunk,
                               .compiled_decode = cfg->compiled_decode,
                               .memory_budget_bytes = ENGINE_MEMORY_DEFAULT};
    if (cfg->kv_budget_gb.set)
        ec.kv_budget_bytes = llround((double)cfg->kv_budget_gb.v * 1e9);
    if (cfg->memory_budget_gb.set)
        ec.memory_budget_bytes = llround((double)cfg->memory_budget_gb.v * 1e9);
    if (cfg->draft_kind) { /* "ngram": prompt lookup; "two-model": the draft model's picks */
        ec.spec_draft = cfg->num_draft_tokens;
        ec.ngram_min = cfg->ngram_min;
        ec.ngram_max = cfg->ngram_max;
        ec.draft_model = srv->sm.draft_loaded ? &srv->sm.draft : NULL;
        ec.draft_p_min = cfg->draft_p_min.set ? cfg->draft_p_min.v : 0;
    }
    ec.ssd_dir = cfg->ssd_cache;
    if (cfg->ssd_cache_max_gb.set) /* binary GiB, as the spec's --ssd-cache-max */
        ec.ssd_max_bytes = (long long)((double)cfg->ssd_cache_max_gb.v * 1073741824.0);
    if (cfg->prompt_cache_gb.set) /* 0 disables; unset keeps the default (the whole pool) */
        ec.prompt_cache_bytes = cfg->prompt_cache_gb.v > 0
                                    ? (long long)((double)cfg->prompt_cache_gb.v * 1e9) + 1
                                    : -1;
    fprintf(stderr, "cllm serve: device %s\n", cfg->device);
    srv->eng = engine_create(&srv->sm.m, &ec, e);
    if (!srv->eng && cfg->memory_budget_gb.set)
        err_wrap(e, "--memory-budget %g GB", (double)cfg->memory_budget_gb.v);
    srv->store = response_store_new(cfg->responses_store);
    if (!srv->eng || !srv->store) {
        if (srv->eng && !srv->store)
            err_set(e, "out of memory");
        goto out;
    }
    struct engine_stats es;
    engine_get_stats(srv->eng, &es);
    if (es.ctx_len < srv->sm.ctx_len) { /* the pool holds less than one context */
        fprintf(stderr, "cllm serve: warning: the KV pool (%s) holds %d tokens, less than the "
                        "%d-token context; the context is %d tokens\n", es.kv_sizing,
                es.ctx_len, srv->sm.ctx_len, es.ctx_len);
        srv->sm.ctx_len = es.ctx_len;
    }
    h = http_start(srv, fd, e);
    if (!h)
        goto out;
    fd = -1; /* the daemon owns it now */
    double block_mib = (double)es.kv_block_bytes / 1048576.0;
    char pcache[64];
    if (es.cache_max_blocks > 0)
        snprintf(pcache, sizeof pcache, "prompt cache up to %.1f MiB", es.cache_max_blocks * block_mib);
    else
        snprintf(pcache, sizeof pcache, "prompt cache off");
    char kvb[96] = "";
    if (es.kv_budget_bytes > 0)
        snprintf(kvb, sizeof kvb, ", KV budget %lld bytes", es.kv_budget_bytes);
    if (es.ssd)
        fprintf(stderr, "cllm serve: SSD cache in %s: %lld blocks (%.1f MiB) there%s\n",
                es.ssd_dir, es.ssd_files, (double)es.ssd_bytes / 1048576.0,
                es.ssd_max_bytes > 0 ? "" : ", no cap");
    fprintf(stderr, "cllm serve: KV pool %d blocks of %d tokens x %lld bytes = %.1f MiB (%s; "
            "weights %.1f MiB)\n", es.kv_blocks_total, es.kv_block_tokens, es.kv_block_bytes,
            es.kv_blocks_total * block_mib,
            es.kv_sizing, (double)model_weight_bytes_per_token(&srv->sm.m) / 1048576.0);
    if (es.draft_bytes > 0)
        fprintf(stderr, "cllm serve: draft model: %.1f MiB of weights and K/V (its own pool, "
                        "1.5 x the context)\n", (double)es.draft_bytes / 1048576.0);
    if (cfg->draft_kind)
        fprintf(stderr, "cllm serve: speculation: %s%s%s, up to %d drafts a step%s\n",
                cfg->draft_kind, cfg->draft_model ? ", draft model " : "",
                cfg->draft_model ? cfg->draft_model : "", cfg->num_draft_tokens,
                cfg->draft_model && cfg->draft_p_min.set && cfg->draft_p_min.v > 0
                    ? ", stopping below the draft's p-min" : "");
    if (cfg->compiled_decode < 0)
        fprintf(stderr, "cllm serve: compiled decode off: decode steps are launched op by op, "
                        "not replayed as graphs\n");
    fprintf(stderr, "cllm serve: serving %s on http://%s:%d (device %s, context %d tokens, queue "
            "%d, batch %d, prefill chunk %d (%d beside decodes), KV %d blocks = %.1f MiB, %s%s)\n",
            srv->sm.id, cfg->host, cfg->port, es.device, srv->sm.ctx_len, cfg->max_queue,
            es.max_running, es.prefill_chunk, es.prefill_chunk_shared, es.kv_blocks_total,
            es.kv_blocks_total * block_mib, pcache, kvb);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0)
        ;
    int n = atomic_load(&srv->in_flight);
    fprintf(stderr, "cllm serve: %s: no new requests; draining %d in flight (up to %d ms)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", n, cfg->shutdown_timeout_ms);
    atomic_store(&srv->draining, true);
    http_quiesce(h);
    bool again = false;
    if (!wait_idle(srv, &sigs, clock_now_s() + cfg->shutdown_timeout_ms / 1000.0, &again)) {
        fprintf(stderr, "cllm serve: %s; cancelling %d request(s)\n",
                again ? "second signal" : "shutdown timeout", atomic_load(&srv->in_flight));
        gen_cancel_all(srv);
        wait_idle(srv, &sigs, clock_now_s() + 10.0, NULL);
    }
    rc = 0;
out:
    http_stop(h); /* joins every connection thread */
    if (fd >= 0)
        close(fd);
    engine_destroy(srv->eng);
    response_store_free(srv->store);
    unload_model(&srv->sm);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0)
        fprintf(stderr, "cllm serve: stopped\n");
    return rc;
}
