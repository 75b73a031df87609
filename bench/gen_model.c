/* gen_model.c - writes GGUF models for benchmarks and tests: random weights
 * in the shape of a known model (so speed can be measured without
 * downloads), or a conversion of a Hugging Face / llama2.c model on disk.
 *
 *   gen_model --shape qwen3-0.6b --dtype bf16 -o /tmp/q.gguf [--seed N]
 *   gen_model --from-hf DIR --dtype q8_0 -o out.gguf
 *   gen_model --from-hf DIR --dtype f32 --layers 1 -o draft.gguf   (the first layer:
 *                                                  a draft model for speculation)
 *
 * Random weights are uniform with standard deviation 0.02 (norm weights
 * around 1), from a seeded xorshift generator: the same seed gives the same
 * file. The files carry no tokenizer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "model/gguf.h"
#include "model/model.h"

struct shape {
    const char *name, *arch;
    int dim, hidden, layers, heads, kv_heads, head_dim, vocab, ctx;
    float theta, eps;
    bool tied, qk_norm, bias;
};

static const struct shape shapes[] = {
    /* small shapes for tests: every code path in a few hundred KB */
    {"tiny", "qwen3", 64, 128, 2, 4, 2, 16, 256, 512, 1e6f, 1e-6f, true, true, false},
    {"tiny-llama", "llama", 64, 160, 2, 4, 2, 16, 256, 512, 1e4f, 1e-5f, false, false, false},
    {"tiny-qwen2", "qwen2", 64, 128, 2, 4, 2, 16, 256, 512, 1e6f, 1e-6f, true, false, true},
    /* the llama3 vocabulary (128256) for serving with --tokenizer llama3_1: ~33 MB in bf16 */
    {"tiny-llama3", "llama", 64, 128, 2, 4, 2, 16, 128256, 8192, 5e5f, 1e-5f, false, false, false},
    /* the qwen3 vocabulary (151936) for serving with --tokenizer qwen3: ~20 MB in bf16 */
    {"tiny-qwen3", "qwen3", 64, 128, 2, 4, 2, 16, 151936, 8192, 1e6f, 1e-6f, true, true, false},
    /* rows of 256 and more: the K formats' blocks divide every matrix */
    {"tiny-k", "qwen3", 256, 512, 2, 4, 2, 64, 1024, 512, 1e6f, 1e-6f, true, true, false},
    {"tiny-k-llama", "llama", 256, 768, 2, 4, 2, 64, 1024, 512, 1e4f, 1e-5f, false, false, false},
    /* published model shapes */
    {"qwen3-0.6b", "qwen3", 1024, 3072, 28, 16, 8, 128, 151936, 40960, 1e6f, 1e-6f, true, true, false},
    {"qwen3-1.7b", "qwen3", 2048, 6144, 28, 16, 8, 128, 151936, 40960, 1e6f, 1e-6f, true, true, false},
    {"qwen3-4b", "qwen3", 2560, 9728, 36, 32, 8, 128, 151936, 40960, 1e6f, 1e-6f, true, true, false},
    {"qwen3-8b", "qwen3", 4096, 12288, 36, 32, 8, 128, 151936, 40960, 1e6f, 1e-6f, false, true, false},
    {"qwen2.5-0.5b", "qwen2", 896, 4864, 24, 14, 2, 64, 151936, 32768, 1e6f, 1e-6f, true, false, true},
    {"llama3.2-1b", "llama", 2048, 8192, 16, 32, 8, 64, 128256, 131072, 5e5f, 1e-5f, true, false, false},
    {"llama3-8b", "llama", 4096, 14336, 32, 32, 8, 128, 128256, 131072, 5e5f, 1e-5f, false, false, false},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: gen_model --shape NAME --dtype DT -o FILE.gguf [--seed N]\n"
               "       gen_model --from-hf DIR --dtype DT -o FILE.gguf\n"
               "       (DT: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k, or\n"
               "       q4_k_m / q5_k_m: llama.cpp's mix, Q6_K for the output (tied: the\n"
               "       embedding) and some layers' attn_v and ffn_down; rows a 256-block\n"
               "       format does not divide fall back as llama.cpp does)\n"
               "       (either: --layers N keeps the first N layers, e.g. for a draft model;\n"
               "       --placeholder-vocab writes placeholder pieces as a vocabulary, so that\n"
               "       llama.cpp loads the file: tests/test_llamacpp.sh)\n"
               "shapes:");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        fprintf(f, " %s", shapes[i].name);
    fprintf(f, "\n");
}

/* A dtype's name, or q4_k_m / q5_k_m (*k_m: GGUF_WRITE_K_M's mix). */
static int parse_dtype(const char *s, enum dtype *out, bool *k_m)
{
    *k_m = !strcmp(s, "q4_k_m") || !strcmp(s, "q5_k_m");
    if (*k_m) {
        *out = s[1] == '4' ? DT_Q4_K : DT_Q5_K;
        return 0;
    }
    for (int d = 0; d < DT_COUNT; d++) {
        if (!strcmp(s, dtype_name((enum dtype)d))) {
            *out = (enum dtype)d;
            return 0;
        }
    }
    return -1;
}

struct gen {
    const struct model *m;
    uint64_t s; /* xorshift64 state */
};

static inline uint64_t next(struct gen *g)
{
    uint64_t x = g->s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return g->s = x;
}

static bool is_norm(const struct model *m, const struct tensor *t)
{
    if (t == &m->out_norm)
        return true;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct layer_weights *w = &m->layers[l];
        if (t == &w->attn_norm || t == &w->ffn_norm || t == &w->q_norm || t == &w->k_norm)
            return true;
    }
    return false;
}

/* Uniform in [-a, a) has standard deviation a / sqrt(3). */
static int gen_row(void *ctx, const struct tensor *t, int64_t row, float *out)
{
    (void)row; /* rows are asked for in a fixed order: one stream suffices */
    struct gen *g = ctx;
    float center = 0.0f, a = 0.02f * 1.7320508f;
    if (is_norm(g->m, t)) {
        center = 1.0f;
        a = 0.1f;
    }
    const float scale = a / 2147483648.0f;
    int64_t i = 0;
    for (; i + 1 < t->cols; i += 2) {
        uint64_t r = next(g);
        out[i] = center + (float)(int32_t)(uint32_t)r * scale;
        out[i + 1] = center + (float)(int32_t)(uint32_t)(r >> 32) * scale;
    }
    if (i < t->cols)
        out[i] = center + (float)(int32_t)(uint32_t)next(g) * scale;
    return 0;
}

/* A model whose tensors have shapes but no storage: data points at a
 * placeholder so the tensors count as present; gen_row supplies the values.
 * An untied lm_head gets a placeholder of its own: the writer treats an
 * lm_head sharing the embedding's storage as tied. */
static int build_shape(struct model *m, const struct shape *s, struct err *e)
{
    static const char placeholder[2];
    memset(m, 0, sizeof *m);
    struct model_config *c = &m->cfg;
    snprintf(c->arch, sizeof c->arch, "%s", s->arch);
    snprintf(m->path, sizeof m->path, "random-%s", s->name);
    c->dim = s->dim;
    c->hidden_dim = s->hidden;
    c->n_layers = s->layers;
    c->n_heads = s->heads;
    c->n_kv_heads = s->kv_heads;
    c->head_dim = s->head_dim;
    c->vocab_size = s->vocab;
    c->max_seq = s->ctx;
    c->rope_theta = s->theta;
    c->norm_eps = s->eps;
    c->tied_embeddings = s->tied;
    c->qk_norm = s->qk_norm;
    c->qkv_bias = s->bias;
    /* random q/k rows need no reordering: declare the file's own convention */
    c->rope_interleaved = !strcmp(s->arch, "llama");
    c->bos_id = c->eos_id = -1;
    if (model_config_finish(c, s->name, e))
        return -1;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers)
        return err_set(e, "out of memory");
    const void *p = &placeholder[0];
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    enum dtype f = DT_F32; /* only the shape matters */
    m->tok_embd = (struct tensor){f, c->vocab_size, c->dim, p};
    m->out_norm = (struct tensor){f, 1, c->dim, p};
    m->lm_head = s->tied ? m->tok_embd : (struct tensor){f, c->vocab_size, c->dim, &placeholder[1]};
    for (int l = 0; l < c->n_layers; l++) {
        struct layer_weights *w = &m->layers[l];
        w->attn_norm = (struct tensor){f, 1, c->dim, p};
        w->wq = (struct tensor){f, q, c->dim, p};
        w->wk = (struct tensor){f, kv, c->dim, p};
        w->wv = (struct tensor){f, kv, c->dim, p};
        w->wo = (struct tensor){f, c->dim, q, p};
        if (s->bias) {
            w->bq = (struct tensor){f, 1, q, p};
            w->bk = (struct tensor){f, 1, kv, p};
            w->bv = (struct tensor){f, 1, kv, p};
        }
        if (s->qk_norm) {
            w->q_norm = (struct tensor){f, 1, c->head_dim, p};
            w->k_norm = (struct tensor){f, 1, c->head_dim, p};
        }
        w->ffn_norm = (struct tensor){f, 1, c->dim, p};
        w->w_gate = (struct tensor){f, c->hidden_dim, c->dim, p};
        w->w_up = (struct tensor){f, c->hidden_dim, c->dim, p};
        w->w_down = (struct tensor){f, c->dim, c->hidden_dim, p};
    }
    return 0;
}


int main(int argc, char **argv)
{
    const char *shape = NULL, *from = NULL, *out = NULL, *dts = "bf16";
    uint64_t seed = 1;
    int layers = 0;
    unsigned flags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--placeholder-vocab")) {
            flags |= GGUF_WRITE_PLACEHOLDER_VOCAB;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "gen_model: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--shape"))
            shape = v;
        else if (!strcmp(a, "--from-hf"))
            from = v;
        else if (!strcmp(a, "--dtype"))
            dts = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output"))
            out = v;
        else if (!strcmp(a, "--seed"))
            seed = strtoull(v, NULL, 0);
        else if (!strcmp(a, "--layers")) {
            if ((layers = atoi(v)) <= 0) {
                fprintf(stderr, "gen_model: --layers %s: needs a positive count\n", v);
                return 2;
            }
        }
        else {
            fprintf(stderr, "gen_model: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    enum dtype dt;
    bool k_m;
    if (!out || !shape == !from || parse_dtype(dts, &dt, &k_m)) {
        fprintf(stderr, "gen_model: need -o, a valid --dtype and exactly one of --shape / "
                        "--from-hf\n");
        usage(stderr);
        return 2;
    }
    if (k_m)
        flags |= GGUF_WRITE_K_M;
    struct err e = {{0}};
    struct model m;
    double t0 = clock_now_s();
    int rc;
    if (from) {
        if (model_load(&m, from, &e)) {
            fprintf(stderr, "gen_model: %s\n", e.msg);
            return 1;
        }
        if (layers > 0 && layers < m.cfg.n_layers)
            m.cfg.n_layers = layers; /* the first ones: a model's early-exit draft */
        rc = gguf_write_model_flags(&m, dt, out, NULL, NULL, flags, &e);
    } else {
        const struct shape *s = NULL;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            if (!strcmp(shapes[i].name, shape))
                s = &shapes[i];
        if (!s) {
            fprintf(stderr, "gen_model: unknown shape '%s'\n", shape);
            usage(stderr);
            return 2;
        }
        struct shape sl = *s;
        if (layers > 0)
            sl.layers = layers;
        s = &sl;
        if (build_shape(&m, s, &e)) {
            fprintf(stderr, "gen_model: %s\n", e.msg);
            free(m.layers);
            return 1;
        }
        /* xorshift must not start at 0; splitmix the seed once */
        uint64_t z = seed + 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        struct gen g = {&m, (z ^ (z >> 31)) | 1};
        rc = gguf_write_model_flags(&m, dt, out, gen_row, &g, flags, &e);
    }
    if (rc) {
        fprintf(stderr, "gen_model: %s\n", e.msg);
        model_free(&m);
        return 1;
    }
    struct stat st;
    double secs = clock_now_s() - t0;
    long long bytes = stat(out, &st) == 0 ? (long long)st.st_size : -1;
    /* mistral models are written with llama.cpp's architecture name "llama" */
    const char *arch = strcmp(m.cfg.arch, "mistral") ? m.cfg.arch : "llama";
    printf("%s: %s %s%s, %d layers, dim %d, vocab %d, %.1f MB in %.2f s\n", out, arch,
           dtype_name(dt), k_m ? "_m" : "", m.cfg.n_layers, m.cfg.dim, m.cfg.vocab_size, bytes / 1e6, secs);
    model_free(&m);
    return 0;
}
