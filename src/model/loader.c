/* loader.c - format detection, ownership bookkeeping and validation shared
 * by every model loader. */
#include "model/model.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/half.h"

static int grow(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return 0;
    int ncap = *cap ? *cap * 2 : 8;
    while (ncap < need)
        ncap *= 2;
    void *p = realloc(*arr, (size_t)ncap * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

int model_map_file(const char *file, size_t min_size, const char *what, void **base,
                   size_t *size, struct err *e)
{
    int fd = open(file, O_RDONLY);
    if (fd < 0)
        return err_set(e, "%s: %s", file, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(e, "%s: not a regular file", file);
    }
    if ((size_t)st.st_size < min_size) {
        close(fd);
        return err_set(e, "%s: %s (%lld bytes)", file, what, (long long)st.st_size);
    }
    *size = (size_t)st.st_size;
    *base = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (*base == MAP_FAILED)
        return err_set(e, "%s: mmap failed: %s", file, strerror(errno));
    return 0;
}

int model_own_map(struct model *m, void *addr, size_t len, struct err *e)
{
    if (grow((void **)&m->maps, &m->cap_maps, m->n_maps + 1, sizeof *m->maps))
        return err_set(e, "out of memory");
    m->maps[m->n_maps++] = (struct mapping){addr, len};
    /* Fault the weights in now, at load, rather than during the first
     * forward pass (which would otherwise be measured as slow prefill).
     * MADV_POPULATE_READ (Linux 5.14) maps every page; older kernels get
     * read-ahead only. Failure is harmless: pages fault in on use. */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
    if (madvise(addr, len, MADV_POPULATE_READ) != 0)
        (void)madvise(addr, len, MADV_WILLNEED);
    return 0;
}

void *model_own_alloc(struct model *m, size_t bytes, struct err *e)
{
    if (grow((void **)&m->bufs, &m->cap_bufs, m->n_bufs + 1, sizeof *m->bufs)) {
        err_set(e, "out of memory");
        return NULL;
    }
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        err_set(e, "out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    m->bufs[m->n_bufs++] = p;
    return p;
}

int model_vec_to_f32(struct model *m, struct tensor *t, struct err *e)
{
    if (!t->data || t->dtype == DT_F32)
        return 0;
    int64_t n = t->rows * t->cols;
    float *out = model_own_alloc(m, (size_t)n * sizeof(float), e);
    if (!out)
        return -1;
    const uint16_t *h = t->data;
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case DT_F16: out[i] = f16_to_f32(h[i]); break;
        case DT_BF16: out[i] = bf16_to_f32(h[i]); break;
        default: return err_set(e, "vector tensor of dtype %s not supported", dtype_name(t->dtype));
        }
    }
    t->data = out;
    t->dtype = DT_F32;
    return 0;
}

void model_free(struct model *m)
{
    for (int i = 0; i < m->n_maps; i++)
        munmap(m->maps[i].addr, m->maps[i].len);
    for (int i = 0; i < m->n_bufs; i++)
        free(m->bufs[i]);
    free(m->maps);
    free(m->bufs);
    free(m->layers);
    memset(m, 0, sizeof *m);
}

int model_config_finish(struct model_config *c, const char *src, struct err *e)
{
    if (c->dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->vocab_size <= 0 ||
        c->hidden_dim <= 0)
        return err_set(e, "%s: hidden size, layers, heads, vocab and intermediate size must be positive "
                          "(got %d, %d, %d, %d, %d)",
                       src, c->dim, c->n_layers, c->n_heads, c->vocab_size, c->hidden_dim);
    if (c->n_kv_heads <= 0)
        c->n_kv_heads = c->n_heads;
    if (c->n_heads % c->n_kv_heads)
        return err_set(e, "%s: %d attention heads is not a multiple of %d key/value heads", src,
                       c->n_heads, c->n_kv_heads);
    if (c->head_dim <= 0) {
        if (c->dim % c->n_heads)
            return err_set(e, "%s: hidden size %d is not divisible by %d heads", src, c->dim,
                           c->n_heads);
        c->head_dim = c->dim / c->n_heads;
    }
    if (c->head_dim % 2 || c->head_dim > 1024)
        return err_set(e, "%s: head_dim %d must be even and at most 1024", src, c->head_dim);
    if (c->norm_eps <= 0)
        c->norm_eps = 1e-5f;
    if (c->rope_theta <= 0)
        c->rope_theta = 10000.0f;
    if (c->max_seq <= 0)
        c->max_seq = 4096;
    if (c->n_eos == 0 && c->eos_id >= 0)
        c->eos_ids[c->n_eos++] = c->eos_id;
    if (c->rope_scaling == ROPE_SCALING_LLAMA3 &&
        (c->rope_factor <= 0 || c->rope_orig_max_seq <= 0 ||
         c->rope_high_freq_factor <= c->rope_low_freq_factor))
        return err_set(e, "%s: llama3 rope_scaling needs factor, original_max_position_embeddings "
                          "and high_freq_factor > low_freq_factor", src);
    if (c->rope_scaling == ROPE_SCALING_LINEAR && c->rope_factor <= 0)
        return err_set(e, "%s: linear rope_scaling needs a positive factor", src);
    return 0;
}

static int check_shape(const struct model *m, const struct tensor *t, const char *name, int layer,
                       int64_t rows, int64_t cols, int required, struct err *e)
{
    if (!t->data) {
        if (!required)
            return 0;
        return err_set(e, "%s: missing tensor %s (layer %d)", m->path, name, layer);
    }
    if (t->rows != rows || t->cols != cols)
        return err_set(e, "%s: tensor %s (layer %d) has shape [%lld, %lld], expected [%lld, %lld]",
                       m->path, name, layer, (long long)t->rows, (long long)t->cols,
                       (long long)rows, (long long)cols);
    if (cols % dtype_block_elems(t->dtype))
        return err_set(e, "%s: %s tensor %s has %lld columns, not a multiple of its %lld-value "
                          "blocks", m->path, dtype_name(t->dtype), name, (long long)cols,
                       (long long)dtype_block_elems(t->dtype));
    return 0;
}

int model_validate(const struct model *m, struct err *e)
{
    const struct model_config *c = &m->cfg;
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    if (check_shape(m, &m->tok_embd, "token embedding", -1, c->vocab_size, c->dim, 1, e) ||
        check_shape(m, &m->out_norm, "final norm", -1, 1, c->dim, 1, e) ||
        check_shape(m, &m->lm_head, "lm_head", -1, c->vocab_size, c->dim, 1, e))
        return -1;
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *w = &m->layers[l];
        if (check_shape(m, &w->attn_norm, "attn_norm", l, 1, c->dim, 1, e) ||
            check_shape(m, &w->wq, "q_proj", l, q, c->dim, 1, e) ||
            check_shape(m, &w->wk, "k_proj", l, kv, c->dim, 1, e) ||
            check_shape(m, &w->wv, "v_proj", l, kv, c->dim, 1, e) ||
            check_shape(m, &w->wo, "o_proj", l, c->dim, q, 1, e) ||
            check_shape(m, &w->bq, "q_proj.bias", l, 1, q, c->qkv_bias, e) ||
            check_shape(m, &w->bk, "k_proj.bias", l, 1, kv, c->qkv_bias, e) ||
            check_shape(m, &w->bv, "v_proj.bias", l, 1, kv, c->qkv_bias, e) ||
            check_shape(m, &w->q_norm, "q_norm", l, 1, c->head_dim, c->qk_norm, e) ||
            check_shape(m, &w->k_norm, "k_norm", l, 1, c->head_dim, c->qk_norm, e) ||
            check_shape(m, &w->ffn_norm, "ffn_norm", l, 1, c->dim, 1, e) ||
            check_shape(m, &w->w_gate, "gate_proj", l, c->hidden_dim, c->dim, 1, e) ||
            check_shape(m, &w->w_up, "up_proj", l, c->hidden_dim, c->dim, 1, e) ||
            check_shape(m, &w->w_down, "down_proj", l, c->dim, c->hidden_dim, 1, e))
            return -1;
    }
    return 0;
}

static size_t tensor_bytes(const struct tensor *t)
{
    return t->data ? dtype_row_bytes(t->dtype, t->cols) * (size_t)t->rows : 0;
}

void layer_matrices(const struct layer_weights *w, const struct tensor *out[LAYER_MATRICES])
{
    const struct tensor *ts[LAYER_MATRICES] = {&w->wq,     &w->wk,   &w->wv,    &w->wo,
                                               &w->w_gate, &w->w_up, &w->w_down};
    memcpy(out, ts, sizeof ts);
}

size_t model_weight_bytes_per_token(const struct model *m)
{
    size_t b = tensor_bytes(&m->lm_head);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct tensor *ts[LAYER_MATRICES];
        layer_matrices(&m->layers[l], ts);
        for (int i = 0; i < LAYER_MATRICES; i++)
            b += tensor_bytes(ts[i]);
    }
    return b;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int model_load(struct model *m, const char *path, struct err *e)
{
    memset(m, 0, sizeof *m);
    snprintf(m->path, sizeof m->path, "%s", path);
    struct stat st;
    if (stat(path, &st) != 0)
        return err_set(e, "%s: no such file or directory", path);
    int rc;
    if (S_ISDIR(st.st_mode)) {
        char probe[1100];
        snprintf(probe, sizeof probe, "%s/config.json", path);
        if (stat(probe, &st) == 0) {
            snprintf(m->format, sizeof m->format, "safetensors");
            rc = model_load_safetensors_dir(m, path, e);
        } else {
            snprintf(m->format, sizeof m->format, "llama2c");
            rc = model_load_llama2c(m, path, e);
        }
    } else if (ends_with(path, ".gguf")) {
        snprintf(m->format, sizeof m->format, "gguf");
        rc = model_load_gguf(m, path, e);
    } else if (ends_with(path, ".bin")) {
        snprintf(m->format, sizeof m->format, "llama2c");
        rc = model_load_llama2c(m, path, e);
    } else {
        rc = err_set(e, "%s: not a model (expected a directory with config.json and "
                        "*.safetensors, a .gguf file, or a llama2.c .bin checkpoint)", path);
    }
    if (rc == 0)
        rc = model_validate(m, e);
    if (rc != 0)
        model_free(m);
    return rc;
}
