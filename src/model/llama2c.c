/* llama2c.c - loads a llama2.c checkpoint (the legacy "version 0" export:
 * a 7-int header followed by float32 arrays), as used by the stories*.bin
 * TinyStories models. */
#include "model/model.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A directory holds the checkpoint plus tok*.bin; pick the non-tokenizer .bin. */
static int find_checkpoint(const char *dir, char *out, size_t cap, struct err *e)
{
    DIR *d = opendir(dir);
    if (!d)
        return err_set(e, "%s: %s", dir, strerror(errno));
    struct dirent *de;
    int found = 0;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 4, ".bin") || !strncmp(de->d_name, "tok", 3))
            continue;
        if (found++ == 0)
            snprintf(out, cap, "%s/%s", dir, de->d_name);
    }
    closedir(d);
    if (found == 0)
        return err_set(e, "%s: no config.json (Hugging Face) and no llama2.c *.bin checkpoint", dir);
    if (found > 1)
        return err_set(e, "%s: several llama2.c checkpoints; name the .bin file", dir);
    return 0;
}

static struct tensor take(const float **p, int64_t rows, int64_t cols)
{
    struct tensor t = {DT_F32, rows, cols, *p};
    *p += rows * cols;
    return t;
}

int model_load_llama2c(struct model *m, const char *path, struct err *e)
{
    char file[1100];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (find_checkpoint(path, file, sizeof file, e))
            return -1;
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    void *base;
    size_t size;
    if (model_map_file(file, 28, "too small for a llama2.c checkpoint", &base, &size, e))
        return -1;
    if (model_own_map(m, base, size, e)) {
        munmap(base, size);
        return -1;
    }
    int32_t h[7];
    memcpy(h, base, sizeof h);
    if ((uint32_t)h[0] == 0x616b3432u)
        return err_set(e, "%s: llama2.c export version 1/2 is not supported (only the legacy "
                          "version 0 layout)", file);
    struct model_config *c = &m->cfg;
    snprintf(c->arch, sizeof c->arch, "llama");
    c->dim = h[0];
    c->hidden_dim = h[1];
    c->n_layers = h[2];
    c->n_heads = h[3];
    c->n_kv_heads = h[4];
    int shared = h[5] > 0;
    /* negative: the classifier is stored apart; INT32_MIN has no positive
     * twin and is refused below as a vocabulary of 0 */
    c->vocab_size = h[5] == INT32_MIN ? 0 : h[5] < 0 ? -h[5] : h[5];
    c->max_seq = h[6];
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->rope_interleaved = true;
    c->tied_embeddings = shared;
    c->bos_id = 1;
    c->eos_id = 2;
    /* TinyStories checkpoints end a story by predicting BOS (llama2.c's run.c
     * stops on it), so both ids end generation. */
    c->eos_ids[0] = 2;
    c->eos_ids[1] = 1;
    c->n_eos = 2;
    if (c->dim <= 0 || c->dim > 65536 || c->n_layers <= 0 || c->n_layers > 1024 ||
        c->vocab_size <= 0 || c->vocab_size > (1 << 22) || c->hidden_dim <= 0 ||
        c->hidden_dim > (1 << 20) || c->max_seq <= 0 || c->max_seq > (1 << 24) ||
        c->n_heads <= 0 || c->n_kv_heads <= 0 || c->n_kv_heads > c->n_heads)
        return err_set(e, "%s: header (%d %d %d %d %d %d %d) is not a llama2.c checkpoint", file,
                       h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
    if (model_config_finish(c, file, e))
        return -1;
    int64_t dim = c->dim, hd = c->head_dim, L = c->n_layers, hid = c->hidden_dim;
    int64_t kv = c->n_kv_heads * hd, V = c->vocab_size;
    int64_t floats = V * dim + L * dim * 2 + L * dim * dim * 2 + L * kv * dim * 2 +
                     L * hid * dim * 3 + dim + c->max_seq * hd;
    if (!shared)
        floats += V * dim;
    if ((size_t)floats * 4 + 28 != size)
        return err_set(e, "%s: size %zu bytes does not match the header (expected %lld): "
                          "truncated or not a llama2.c checkpoint", file, size,
                       (long long)(floats * 4 + 28));
    m->layers = calloc((size_t)L, sizeof *m->layers);
    if (!m->layers)
        return err_set(e, "out of memory");
    const float *p = (const float *)((const char *)base + 28);
    m->tok_embd = take(&p, V, dim);
    for (int l = 0; l < L; l++) m->layers[l].attn_norm = take(&p, 1, dim);
    for (int l = 0; l < L; l++) m->layers[l].wq = take(&p, c->n_heads * hd, dim);
    for (int l = 0; l < L; l++) m->layers[l].wk = take(&p, kv, dim);
    for (int l = 0; l < L; l++) m->layers[l].wv = take(&p, kv, dim);
    for (int l = 0; l < L; l++) m->layers[l].wo = take(&p, dim, c->n_heads * hd);
    for (int l = 0; l < L; l++) m->layers[l].ffn_norm = take(&p, 1, dim);
    for (int l = 0; l < L; l++) m->layers[l].w_gate = take(&p, hid, dim);
    for (int l = 0; l < L; l++) m->layers[l].w_down = take(&p, dim, hid);
    for (int l = 0; l < L; l++) m->layers[l].w_up = take(&p, hid, dim);
    m->out_norm = take(&p, 1, dim);
    p += c->max_seq * hd; /* freq_cis real+imag: recomputed from theta */
    m->lm_head = shared ? m->tok_embd : take(&p, V, dim);
    return 0;
}
