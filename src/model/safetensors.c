/* safetensors.c - loads a Hugging Face model directory: config.json plus one
 * or more *.safetensors files, memory-mapped so weights are used in place. */
#include "model/model.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Maps a HF tensor name to the slot it fills; NULL for names we don't use. */
static struct tensor *slot_for_name(struct model *m, const char *name, int *is_vec)
{
    *is_vec = 0;
    if (!strcmp(name, "model.embed_tokens.weight"))
        return &m->tok_embd;
    if (!strcmp(name, "lm_head.weight"))
        return &m->lm_head;
    if (!strcmp(name, "model.norm.weight")) {
        *is_vec = 1;
        return &m->out_norm;
    }
    int layer, used = 0;
    if (sscanf(name, "model.layers.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0 ||
        layer >= m->cfg.n_layers)
        return NULL;
    struct layer_weights *w = &m->layers[layer];
    const char *rest = name + used;
    static const struct {
        const char *suffix;
        size_t off;
        int vec;
    } table[] = {
        {"input_layernorm.weight", offsetof(struct layer_weights, attn_norm), 1},
        {"self_attn.q_proj.weight", offsetof(struct layer_weights, wq), 0},
        {"self_attn.k_proj.weight", offsetof(struct layer_weights, wk), 0},
        {"self_attn.v_proj.weight", offsetof(struct layer_weights, wv), 0},
        {"self_attn.o_proj.weight", offsetof(struct layer_weights, wo), 0},
        {"self_attn.q_proj.bias", offsetof(struct layer_weights, bq), 1},
        {"self_attn.k_proj.bias", offsetof(struct layer_weights, bk), 1},
        {"self_attn.v_proj.bias", offsetof(struct layer_weights, bv), 1},
        {"self_attn.q_norm.weight", offsetof(struct layer_weights, q_norm), 1},
        {"self_attn.k_norm.weight", offsetof(struct layer_weights, k_norm), 1},
        {"post_attention_layernorm.weight", offsetof(struct layer_weights, ffn_norm), 1},
        {"mlp.gate_proj.weight", offsetof(struct layer_weights, w_gate), 0},
        {"mlp.up_proj.weight", offsetof(struct layer_weights, w_up), 0},
        {"mlp.down_proj.weight", offsetof(struct layer_weights, w_down), 0},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (!strcmp(rest, table[i].suffix)) {
            *is_vec = table[i].vec;
            return (struct tensor *)((char *)w + table[i].off);
        }
    }
    return NULL;
}

static int parse_dtype(const char *s, enum dtype *out)
{
    if (!strcmp(s, "F32")) *out = DT_F32;
    else if (!strcmp(s, "F16")) *out = DT_F16;
    else if (!strcmp(s, "BF16")) *out = DT_BF16;
    else return -1;
    return 0;
}

static int load_file(struct model *m, const char *file, struct err *e)
{
    void *base;
    size_t size;
    if (model_map_file(file, 8, "file too small to be safetensors", &base, &size, e))
        return -1;
    if (model_own_map(m, base, size, e)) {
        munmap(base, size);
        return -1;
    }
    uint64_t hlen;
    memcpy(&hlen, base, 8);
    if (hlen > size - 8 || hlen > (100u << 20))
        return err_set(e, "%s: header length %llu exceeds file size %zu (truncated or not "
                          "safetensors)", file, (unsigned long long)hlen, size);
    json_error_t je;
    json_t *hdr = json_loadb((const char *)base + 8, hlen, 0, &je);
    if (!json_is_object(hdr)) {
        json_decref(hdr);
        return err_set(e, "%s: invalid header JSON: %s", file, je.text);
    }
    const char *data = (const char *)base + 8 + hlen;
    size_t data_len = size - 8 - hlen;
    int rc = 0;
    const char *name;
    json_t *info;
    json_object_foreach(hdr, name, info) {
        if (!strcmp(name, "__metadata__"))
            continue;
        const char *dt = json_string_value(json_object_get(info, "dtype"));
        json_t *shape = json_object_get(info, "shape"), *offs = json_object_get(info, "data_offsets");
        if (!dt || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2) {
            rc = err_set(e, "%s: tensor %s has a malformed header entry", file, name);
            break;
        }
        int is_vec;
        struct tensor *slot = slot_for_name(m, name, &is_vec);
        if (!slot)
            continue; /* e.g. rotary_emb.inv_freq: recomputed, not needed */
        struct tensor t = {0};
        if (parse_dtype(dt, &t.dtype)) {
            rc = err_set(e, "%s: tensor %s has dtype %s (supported: F32, F16, BF16)", file, name, dt);
            break;
        }
        size_t nd = json_array_size(shape);
        if (nd == 1) {
            t.rows = 1;
            t.cols = json_integer_value(json_array_get(shape, 0));
        } else if (nd == 2) {
            t.rows = json_integer_value(json_array_get(shape, 0));
            t.cols = json_integer_value(json_array_get(shape, 1));
        } else {
            rc = err_set(e, "%s: tensor %s has %zu dimensions, expected 1 or 2", file, name, nd);
            break;
        }
        json_int_t b = json_integer_value(json_array_get(offs, 0));
        json_int_t end = json_integer_value(json_array_get(offs, 1));
        size_t want = dtype_row_bytes(t.dtype, t.cols) * (size_t)t.rows;
        if (t.rows <= 0 || t.cols <= 0 || b < 0 || end < b || (size_t)end > data_len ||
            (size_t)(end - b) != want) {
            rc = err_set(e, "%s: tensor %s: data_offsets [%lld, %lld] do not fit shape [%lld, %lld] "
                            "%s within %zu data bytes (truncated file?)",
                         file, name, (long long)b, (long long)end, (long long)t.rows,
                         (long long)t.cols, dt, data_len);
            break;
        }
        t.data = data + b;
        *slot = t;
        if (is_vec && (rc = model_vec_to_f32(m, slot, e)) != 0)
            break;
    }
    json_decref(hdr);
    return rc;
}

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Every shard named by model.safetensors.index.json must exist: a partial
 * download should say which file is missing, not "missing tensor". */
static int check_index(const char *dir, struct err *e)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) != 0)
        return 0;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return err_set(e, "%s: invalid JSON at line %d: %s", path, je.line, je.text);
    json_t *map = json_object_get(root, "weight_map");
    const char *k;
    json_t *v;
    int rc = 0;
    json_object_foreach(map, k, v) {
        const char *shard = json_string_value(v);
        char sp[2048];
        snprintf(sp, sizeof sp, "%s/%s", dir, shard ? shard : "");
        if (!shard || strchr(shard, '/') || access(sp, R_OK) != 0) {
            rc = err_set(e, "%s: shard \"%s\" (holding %s) is missing", path, shard ? shard : "?", k);
            break;
        }
    }
    json_decref(root);
    return rc;
}

int model_load_safetensors_dir(struct model *m, const char *dir, struct err *e)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (model_config_parse_hf(&m->cfg, path, e))
        return -1;
    m->cfg.rope_interleaved = false;
    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    if (!m->layers)
        return err_set(e, "out of memory");
    if (check_index(dir, e))
        return -1;

    DIR *d = opendir(dir);
    if (!d)
        return err_set(e, "%s: %s", dir, strerror(errno));
    char **files = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!has_suffix(de->d_name, ".safetensors"))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            char **nf = realloc(files, (size_t)cap * sizeof *files);
            if (!nf)
                break;
            files = nf;
        }
        files[n++] = strdup(de->d_name);
    }
    closedir(d);
    int rc = 0;
    if (n == 0)
        rc = err_set(e, "%s: no *.safetensors files", dir);
    qsort(files, (size_t)n, sizeof *files, cmp_str);
    for (int i = 0; i < n && rc == 0; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        rc = load_file(m, path, e);
    }
    for (int i = 0; i < n; i++)
        free(files[i]);
    free(files);
    if (rc)
        return rc;
    /* Tied heads: some files store only one of the pair. */
    if (!m->tok_embd.data && m->lm_head.data)
        m->tok_embd = m->lm_head;
    if (!m->lm_head.data && m->tok_embd.data) {
        m->lm_head = m->tok_embd;
        m->cfg.tied_embeddings = true;
    }
    return 0;
}
