/* stats.c - GET /stats (live configuration, queue, engine and HTTP
 * counters, KV blocks, model) and GET /health. */
#include "serve/internal.h"
#include "base/clock.h"

static json_t *opt_f_json(struct opt_f o) { return o.set ? json_float(o.v) : json_null(); }
static json_t *opt_i_json(struct opt_i o) { return o.set ? json_integer(o.v) : json_null(); }

json_t *stats_json(struct server *srv)
{
    struct engine_stats es;
    engine_get_stats(srv->eng, &es);
    struct server_counters ctr;
    pthread_mutex_lock(&srv->mu);
    ctr = srv->ctr;
    pthread_mutex_unlock(&srv->mu);
    const struct serve_config *cfg = srv->cfg;
    const struct model_config *mc = &srv->sm.m.cfg;
    /* bytes of one KV block: 16 token slots x layers x (K + V) x kv width x f32 */
    double block_bytes = 16.0 * mc->n_layers * 2.0 * mc->n_kv_heads * mc->head_dim * 4.0;
    int used = es.kv_blocks_total - es.kv_blocks_free;

    json_t *model = json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i}",
                              "id", srv->sm.id, "path", srv->sm.path, "format", srv->sm.m.format,
                              "arch", mc->arch, "n_layers", mc->n_layers, "dim", mc->dim,
                              "n_heads", mc->n_heads, "n_kv_heads", mc->n_kv_heads, "vocab_size",
                              mc->vocab_size, "max_position_embeddings", mc->max_seq, "ctx_len",
                              srv->sm.ctx_len);
    json_t *defaults = json_pack(
        "{s:o, s:o, s:o, s:o, s:o, s:o}", "max_tokens", opt_i_json(cfg->max_tokens),
        "temperature", opt_f_json(cfg->temperature), "top_p", opt_f_json(cfg->top_p), "top_k",
        opt_i_json(cfg->top_k), "min_p", opt_f_json(cfg->min_p), "thinking",
        cfg->thinking < 0 ? json_null() : json_boolean(cfg->thinking));
    json_t *gen_config = json_pack(
        "{s:o, s:o, s:o, s:o}", "temperature", opt_f_json(srv->sm.gc_temperature), "top_p",
        opt_f_json(srv->sm.gc_top_p), "top_k", opt_i_json(srv->sm.gc_top_k), "min_p",
        opt_f_json(srv->sm.gc_min_p));

    json_t *root = json_pack(
        "{s:s, s:f, s:o, s:{s:s, s:i, s:i, s:i, s:I, s:I, s:o}, s:o, s:o, s:{s:i, s:i}, "
        "s:i, s:{s:I, s:I, s:I, s:I}, s:{s:I, s:I}, s:{s:i, s:i, s:i, s:I}, "
        "s:{s:b, s:I}, s:{s:s}, "
        "s:{s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:i, s:i}}",
        "status", atomic_load(&srv->draining) ? "draining" : "ok",
        "uptime_s", clock_now_s() - srv->t_start,
        "model", model,
        "server", "host", cfg->host, "port", cfg->port, "max_queue", cfg->max_queue,
        "shutdown_timeout_ms", cfg->shutdown_timeout_ms,
        "max_body_bytes", (json_int_t)cfg->max_body_bytes,
        "responses_store", (json_int_t)cfg->responses_store,
        "ctx", cfg->ctx ? json_integer(cfg->ctx) : json_null(),
        "defaults", defaults,
        "generation_config", gen_config,
        "queue", "waiting", es.queued, "max", cfg->max_queue,
        "running", es.running,
        "requests", "total", (json_int_t)es.requests_total, "cancelled",
        (json_int_t)es.requests_cancelled, "completed", (json_int_t)es.requests_completed,
        "rejected_queue_full", (json_int_t)ctr.rejected_queue_full,
        "tokens", "prompt", (json_int_t)es.tokens_prompt, "generated",
        (json_int_t)es.tokens_generated,
        "kv", "block_tokens", es.kv_block_tokens, "blocks_total", es.kv_blocks_total, "blocks_free",
        es.kv_blocks_free, "bytes_used", (json_int_t)(used * block_bytes),
        "prompt_cache", "enabled", es.cache_max_blocks > 0, "max_bytes",
        (json_int_t)(es.cache_max_blocks * block_bytes),
        "kv_quant", "mode", "off",
        "http", "requests", (json_int_t)ctr.http_requests, "status_2xx",
        (json_int_t)ctr.status_2xx, "status_4xx", (json_int_t)ctr.status_4xx, "status_5xx",
        (json_int_t)ctr.status_5xx, "disconnects", (json_int_t)ctr.disconnects, "in_flight",
        (json_int_t)atomic_load(&srv->in_flight), "active_requests",
        atomic_load(&srv->active), "connections",
        atomic_load(&srv->connections), "max_connections", cfg->max_connections);
    double lookups = (double)(es.cache_hits + es.cache_misses);
    json_t *pcs = json_pack("{s:I, s:I, s:I, s:i, s:i, s:I, s:f}", "hits",
                            (json_int_t)es.cache_hits, "misses", (json_int_t)es.cache_misses,
                            "cached_tokens", (json_int_t)es.cache_tokens, "blocks",
                            es.cache_blocks, "blocks_idle", es.cache_blocks_idle, "evictions",
                            (json_int_t)es.cache_evictions, "hit_rate",
                            lookups > 0 ? (double)es.cache_hits / lookups : 0.0);
    json_object_update(json_object_get(root, "prompt_cache"), pcs);
    json_decref(pcs);
    /* the SSD tier: null when off */
    json_t *ssd = json_null();
    if (es.ssd)
        ssd = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o}", "dir", es.ssd_dir,
                        "files", (json_int_t)es.ssd_files, "bytes", (json_int_t)es.ssd_bytes,
                        "writes", (json_int_t)es.ssd_writes, "restored",
                        (json_int_t)es.ssd_reads, "refused", (json_int_t)es.ssd_bad,
                        "evictions", (json_int_t)es.ssd_evictions, "max_bytes",
                        es.ssd_max_bytes > 0 ? json_integer(es.ssd_max_bytes) : json_null(),
                        "last_error", es.ssd_error[0] ? json_string(es.ssd_error) : json_null());
    json_object_set_new(json_object_get(root, "prompt_cache"), "ssd", ssd);
    /* speculation: null when off */
    json_t *spec = json_null();
    if (srv->cfg->draft_kind) {
        const struct serve_config *c = srv->cfg;
        spec = json_pack("{s:s, s:i, s:I, s:I, s:I, s:f}", "draft_kind", c->draft_kind,
                         "num_draft_tokens", c->num_draft_tokens, "steps",
                         (json_int_t)es.spec_steps, "drafted", (json_int_t)es.spec_drafted,
                         "accepted", (json_int_t)es.spec_accepted, "acceptance_rate",
                         es.spec_drafted ? (double)es.spec_accepted / (double)es.spec_drafted
                                         : 0.0);
        if (c->draft_model) {
            json_object_set_new(spec, "draft_model", json_string(c->draft_model));
            json_object_set_new(spec, "draft_p_min",
                                json_real(c->draft_p_min.set ? c->draft_p_min.v : 0));
            json_object_set_new(spec, "draft_tokens_computed",
                                json_integer((json_int_t)es.draft_computed));
            json_object_set_new(spec, "draft_tokens_cached",
                                json_integer((json_int_t)es.draft_cached));
            json_object_set_new(spec, "last_error",
                                es.spec_error[0] ? json_string(es.spec_error) : json_null());
        } else {
            json_object_set_new(spec, "ngram_max", json_integer(c->ngram_max));
            json_object_set_new(spec, "ngram_min", json_integer(c->ngram_min));
        }
    }
    json_object_set_new(root, "speculation", spec);
    /* the spec's batch block: mode "batch" with --batch > 1, "off" = --batch 1;
     * kv_bytes: blocks held by sequences (idle prompt-cache blocks not
     * counted); kv_budget_bytes: --kv-budget, null when unset;
     * kv_projected_bytes: the admitted sequences' projections summed */
    json_t *batch = json_pack(
        "{s:s, s:b, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:o, s:I, s:I, s:I, s:f}", "mode",
        es.max_running > 1 ? "batch" : "off", "batched", es.max_running > 1, "max_running",
        es.max_running, "prefill_chunk", es.prefill_chunk, "prefill_chunk_shared",
        es.prefill_chunk_shared, "active_rows", es.running, "pending_rows", es.pending, "submitted_rows",
        (json_int_t)es.requests_total, "kv_bytes", (json_int_t)es.kv_seq_bytes,
        "kv_budget_bytes",
        es.kv_budget_bytes > 0 ? json_integer(es.kv_budget_bytes) : json_null(),
        "kv_projected_bytes", (json_int_t)es.kv_projected_bytes, "preemptions",
        (json_int_t)es.preemptions, "steps", (json_int_t)es.batch_steps, "mean_rows",
        es.batch_steps ? (double)es.batch_rows / (double)es.batch_steps : 0.0);
    if (batch) /* greedy steps of a sequence alone queued before the one before them was read */
        json_object_set_new(batch, "steps_ahead", json_integer((json_int_t)es.steps_ahead));
    json_object_set_new(root, "batch", batch);
    return root;
}

json_t *health_json(struct server *srv)
{
    return json_pack("{s:s, s:s}", "status", atomic_load(&srv->draining) ? "draining" : "ok",
                     "model", srv->sm.id);
}

/* Each number (and boolean) of v under name, flattened: objects add
 * "_key" to the name (characters Prometheus does not allow become '_'). */
static void flatten(struct buf *b, const char *name, const json_t *v)
{
    if (json_is_object(v)) {
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)v, k, x) {
            char sub[256];
            int n = snprintf(sub, sizeof sub, "%s_%s", name, k);
            if (n <= 0 || (size_t)n >= sizeof sub)
                continue;
            for (char *c = sub; *c; c++)
                if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                      (*c >= '0' && *c <= '9') || *c == '_'))
                    *c = '_';
            flatten(b, sub, x);
        }
    } else if (json_is_integer(v)) {
        buf_printf(b, "%s %lld\n", name, (long long)json_integer_value(v));
    } else if (json_is_real(v)) {
        buf_printf(b, "%s %.17g\n", name, json_real_value(v));
    } else if (json_is_boolean(v)) {
        buf_printf(b, "%s %d\n", name, json_is_true(v));
    }
}

char *metrics_text(struct server *srv, size_t *len)
{
    json_t *st = stats_json(srv);
    if (!st)
        return NULL;
    struct buf b = {0};
    buf_puts(&b, "# cllm: every number of GET /stats, named by its path (docs/api.md)\n");
    flatten(&b, "cllm", st);
    json_decref(st);
    if (b.oom) {
        buf_free(&b);
        return NULL;
    }
    *len = b.n;
    buf_putn(&b, "", 1);
    return b.p;
}
