/* gguf_write.c - writes GGUF v3 files: a streaming writer (metadata and
 * tensor descriptions first, then tensor bytes in order) and the converter
 * from an in-memory struct model, used by tests and bench/gen_model. */
#include "model/gguf.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/cpu/matmul.h"
#include "base/half.h"
#include "model/quant.h"

struct wtensor {
    char *name;
    uint32_t type;
    int n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t offset, nbytes;
};

struct gguf_writer {
    uint8_t *meta; /* the encoded metadata entries */
    size_t meta_len, meta_cap;
    uint64_t n_kv;
    char **keys; /* for the duplicate check */
    struct wtensor *t;
    int n_t, cap_t;
    uint64_t data_size; /* offset of the next tensor added */
    size_t alignment;
    FILE *f;
    char *path;
    int cur;           /* tensor whose bytes are being streamed */
    uint64_t cur_done; /* bytes of it written so far */
};

struct gguf_writer *gguf_writer_new(struct err *e)
{
    struct gguf_writer *w = calloc(1, sizeof *w);
    if (!w) {
        err_set(e, "out of memory");
        return NULL;
    }
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void gguf_writer_free(struct gguf_writer *w)
{
    if (!w)
        return;
    if (w->f) { /* not closed successfully: don't leave half a file behind */
        fclose(w->f);
        unlink(w->path);
    }
    for (uint64_t i = 0; i < w->n_kv; i++)
        free(w->keys[i]);
    for (int i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->keys);
    free(w->t);
    free(w->meta);
    free(w->path);
    free(w);
}

static int put(struct gguf_writer *w, const void *p, size_t n, struct err *e)
{
    if (w->meta_len + n > w->meta_cap) {
        size_t cap = w->meta_cap ? w->meta_cap : 4096;
        while (cap < w->meta_len + n)
            cap *= 2;
        uint8_t *m = realloc(w->meta, cap);
        if (!m)
            return err_set(e, "out of memory writing GGUF metadata");
        w->meta = m;
        w->meta_cap = cap;
    }
    if (n)
        memcpy(w->meta + w->meta_len, p, n);
    w->meta_len += n;
    return 0;
}

static int put_u32(struct gguf_writer *w, uint32_t v, struct err *e) { return put(w, &v, 4, e); }
static int put_u64(struct gguf_writer *w, uint64_t v, struct err *e) { return put(w, &v, 8, e); }

static int put_str(struct gguf_writer *w, const char *s, struct err *e)
{
    size_t n = strlen(s);
    return put_u64(w, n, e) || put(w, s, n, e);
}

/* Starts a metadata entry: checks the key and writes it with the type. */
static int begin_kv(struct gguf_writer *w, const char *key, enum gguf_vtype type, struct err *e)
{
    if (w->f)
        return err_set(e, "gguf writer: metadata '%s' added after the file was opened", key);
    size_t n = strlen(key);
    if (n == 0 || n > 65535)
        return err_set(e, "gguf writer: metadata key of %zu bytes", n);
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key))
            return err_set(e, "gguf writer: duplicate metadata key '%s'", key);
    char **keys = realloc(w->keys, (w->n_kv + 1) * sizeof *keys);
    if (!keys)
        return err_set(e, "out of memory");
    w->keys = keys;
    if (!(w->keys[w->n_kv] = strdup(key)))
        return err_set(e, "out of memory");
    w->n_kv++;
    return put_str(w, key, e) || put_u32(w, (uint32_t)type, e);
}

int gguf_writer_kv_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype type,
                          const void *val, struct err *e)
{
    size_t sz = gguf_vtype_size(type);
    if (!sz)
        return err_set(e, "gguf writer: '%s': %s is not a scalar type", key, gguf_vtype_name(type));
    if (!strcmp(key, "general.alignment")) {
        uint64_t a = 0;
        memcpy(&a, val, sz < 8 ? sz : 8); /* little-endian */
        if (type == GGUF_VT_FLOAT32 || type == GGUF_VT_FLOAT64 || a == 0 || (a & (a - 1)) ||
            a > (1u << 30))
            return err_set(e, "gguf writer: general.alignment must be a power of two");
        w->alignment = (size_t)a;
    }
    return begin_kv(w, key, type, e) || put(w, val, sz, e);
}

int gguf_writer_kv_u32(struct gguf_writer *w, const char *key, uint32_t val, struct err *e)
{
    return gguf_writer_kv_scalar(w, key, GGUF_VT_UINT32, &val, e);
}

int gguf_writer_kv_i32(struct gguf_writer *w, const char *key, int32_t val, struct err *e)
{
    return gguf_writer_kv_scalar(w, key, GGUF_VT_INT32, &val, e);
}

int gguf_writer_kv_f32(struct gguf_writer *w, const char *key, float val, struct err *e)
{
    return gguf_writer_kv_scalar(w, key, GGUF_VT_FLOAT32, &val, e);
}

int gguf_writer_kv_bool(struct gguf_writer *w, const char *key, bool val, struct err *e)
{
    uint8_t b = val;
    return gguf_writer_kv_scalar(w, key, GGUF_VT_BOOL, &b, e);
}

int gguf_writer_kv_str(struct gguf_writer *w, const char *key, const char *val, struct err *e)
{
    return begin_kv(w, key, GGUF_VT_STRING, e) || put_str(w, val, e);
}

int gguf_writer_kv_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem_type,
                       const void *elems, uint64_t n, struct err *e)
{
    size_t sz = gguf_vtype_size(elem_type);
    if (!sz)
        return err_set(e, "gguf writer: '%s': use the string/raw writers for %s arrays", key,
                       gguf_vtype_name(elem_type));
    return begin_kv(w, key, GGUF_VT_ARRAY, e) || put_u32(w, elem_type, e) || put_u64(w, n, e) ||
           put(w, elems, (size_t)n * sz, e);
}

int gguf_writer_kv_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
                           uint64_t n, struct err *e)
{
    if (begin_kv(w, key, GGUF_VT_ARRAY, e) || put_u32(w, GGUF_VT_STRING, e) || put_u64(w, n, e))
        return -1;
    for (uint64_t i = 0; i < n; i++)
        if (put_str(w, strs[i], e))
            return -1;
    return 0;
}

int gguf_writer_kv_raw(struct gguf_writer *w, const char *key, enum gguf_vtype type,
                       const void *bytes, size_t len, struct err *e)
{
    return begin_kv(w, key, type, e) || put(w, bytes, len, e);
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t ttype, int n_dims,
                           const uint64_t *ne, struct err *e)
{
    if (w->f)
        return err_set(e, "gguf writer: tensor '%s' added after the file was opened", name);
    if (!*name || strlen(name) > 255)
        return err_set(e, "gguf writer: tensor name '%s' must be 1..255 bytes", name);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return err_set(e, "gguf writer: tensor '%s' has %d dimensions", name, n_dims);
    uint32_t be, bb;
    if (!gguf_ttype_block(ttype, &be, &bb))
        return err_set(e, "gguf writer: tensor '%s' has unknown type %u", name, ttype);
    for (int i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return err_set(e, "gguf writer: duplicate tensor '%s'", name);
    struct wtensor t = {.type = ttype, .n_dims = n_dims, .ne = {1, 1, 1, 1}};
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || ne[d] > ((uint64_t)1 << 40))
            return err_set(e, "gguf writer: tensor '%s' dimension %d is %llu", name, d,
                           (unsigned long long)ne[d]);
        t.ne[d] = ne[d];
    }
    if (t.ne[0] % be)
        return err_set(e, "gguf writer: tensor '%s' of type %s needs a multiple of %u columns",
                       name, gguf_ttype_name(ttype), be);
    t.nbytes = t.ne[0] / be * bb * t.ne[1] * t.ne[2] * t.ne[3];
    t.offset = w->data_size;
    if (w->n_t == w->cap_t) {
        int cap = w->cap_t ? w->cap_t * 2 : 64;
        struct wtensor *nt = realloc(w->t, (size_t)cap * sizeof *nt);
        if (!nt)
            return err_set(e, "out of memory");
        w->t = nt;
        w->cap_t = cap;
    }
    if (!(t.name = strdup(name)))
        return err_set(e, "out of memory");
    w->t[w->n_t++] = t;
    w->data_size = align_up(t.offset + t.nbytes, w->alignment);
    return 0;
}

static int wr(struct gguf_writer *w, const void *p, size_t n, struct err *e)
{
    if (n && fwrite(p, 1, n, w->f) != n)
        return err_set(e, "%s: write failed: %s", w->path, strerror(errno));
    return 0;
}

static int wr_zeros(struct gguf_writer *w, size_t n, struct err *e)
{
    static const uint8_t zeros[256];
    while (n) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        if (wr(w, zeros, k, e))
            return -1;
        n -= k;
    }
    return 0;
}

int gguf_writer_open(struct gguf_writer *w, const char *path, struct err *e)
{
    if (w->f)
        return err_set(e, "gguf writer: already open");
    /* Tensor offsets were computed with the alignment known when each was
     * added; general.alignment must therefore come first. */
    for (int i = 0; i < w->n_t; i++)
        if (w->t[i].offset % w->alignment)
            return err_set(e, "gguf writer: general.alignment set after tensors were added");
    if (!(w->path = strdup(path)))
        return err_set(e, "out of memory");
    if (!(w->f = fopen(path, "wb")))
        return err_set(e, "%s: %s", path, strerror(errno));
    setvbuf(w->f, NULL, _IOFBF, 1 << 22);
    uint32_t version = 3;
    uint64_t n_t = (uint64_t)w->n_t;
    if (wr(w, "GGUF", 4, e) || wr(w, &version, 4, e) || wr(w, &n_t, 8, e) ||
        wr(w, &w->n_kv, 8, e) || wr(w, w->meta, w->meta_len, e))
        return -1;
    uint64_t pos = 24 + w->meta_len;
    for (int i = 0; i < w->n_t; i++) {
        const struct wtensor *t = &w->t[i];
        uint64_t len = strlen(t->name);
        uint32_t nd = (uint32_t)t->n_dims;
        if (wr(w, &len, 8, e) || wr(w, t->name, len, e) || wr(w, &nd, 4, e) ||
            wr(w, t->ne, 8 * (size_t)nd, e) || wr(w, &t->type, 4, e) || wr(w, &t->offset, 8, e))
            return -1;
        pos += 8 + len + 4 + 8 * nd + 4 + 8;
    }
    w->cur = 0;
    w->cur_done = 0;
    return wr_zeros(w, align_up(pos, w->alignment) - pos, e);
}

int gguf_writer_data(struct gguf_writer *w, const void *p, size_t n, struct err *e)
{
    if (!w->f)
        return err_set(e, "gguf writer: data written before gguf_writer_open");
    const uint8_t *b = p;
    while (n) {
        if (w->cur >= w->n_t)
            return err_set(e, "%s: more tensor data than the tensors described", w->path);
        struct wtensor *t = &w->t[w->cur];
        uint64_t k = t->nbytes - w->cur_done;
        if (k > n)
            k = n;
        if (wr(w, b, (size_t)k, e))
            return -1;
        b += k;
        n -= (size_t)k;
        w->cur_done += k;
        if (w->cur_done == t->nbytes) {
            uint64_t end = t->offset + t->nbytes;
            if (wr_zeros(w, (size_t)(align_up(end, w->alignment) - end), e))
                return -1;
            w->cur++;
            w->cur_done = 0;
        }
    }
    return 0;
}

int gguf_writer_close(struct gguf_writer *w, struct err *e)
{
    if (!w->f)
        return err_set(e, "gguf writer: not open");
    if (w->cur < w->n_t)
        return err_set(e, "%s: tensor '%s' is missing %llu bytes of data", w->path,
                       w->t[w->cur].name,
                       (unsigned long long)(w->t[w->cur].nbytes - w->cur_done));
    int bad = fflush(w->f) != 0 || ferror(w->f);
    int err_no = errno;
    bad |= fclose(w->f) != 0;
    w->f = NULL;
    if (bad) {
        unlink(w->path);
        return err_set(e, "%s: write failed: %s", w->path, strerror(err_no ? err_no : errno));
    }
    return 0;
}

/* ---- row encoding ---- */

void gguf_encode_row(enum dtype dt, const float *x, void *dst, int64_t cols)
{
    switch (dt) {
    case DT_F32:
        memcpy(dst, x, (size_t)cols * sizeof(float));
        break;
    case DT_F16: {
        uint16_t *h = dst;
        for (int64_t i = 0; i < cols; i++)
            h[i] = f32_to_f16(x[i]);
        break;
    }
    case DT_BF16: {
        uint16_t *h = dst;
        for (int64_t i = 0; i < cols; i++)
            h[i] = f32_to_bf16(x[i]);
        break;
    }
    case DT_Q8_0:
        quantize_row_q8_0(x, dst, cols);
        break;
    default:
        if (quant_is_low_bit(dt))
            quant_quantize_row(dt, x, dst, cols);
        break;
    }
}

void gguf_decode_row(enum dtype dt, const void *src, float *y, int64_t cols)
{
    quant_dequantize_row(dt, src, y, cols);
}

/* ---- the model converter ---- */

/* How the rows (matrices) or elements (vectors) of one tensor are reordered
 * between HF order (rotate-half RoPE pairs i, i+hd/2 within each head) and
 * llama.cpp's permuted order (interleaved pairs 2i, 2i+1). */
enum perm { PERM_NONE, PERM_TO_INTERLEAVED, PERM_FROM_INTERLEAVED };

struct plan {
    char name[64];
    const struct tensor *src;
    enum dtype out;
    bool vec;
    enum perm perm;
    int head_dim;
    bool own; /* the writer's own tensor (rope_freqs): from src->data even with a row_fn */
};

/* Source index of destination index r under the permutation. */
static int64_t perm_src(enum perm p, int hd, int64_t r)
{
    int64_t base = r / hd * hd, k = r % hd, half = hd / 2;
    switch (p) {
    case PERM_TO_INTERLEAVED: return base + (k % 2) * half + k / 2;
    case PERM_FROM_INTERLEAVED: return base + 2 * (k % half) + k / half;
    default: return r;
    }
}

/* Whether layer i of n gets more bits in a _M mix (llama.cpp's
 * use_more_bits). */
static bool more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static uint32_t file_type(enum dtype dt, bool k_m)
{
    if (k_m && dt == DT_Q4_K)
        return 15; /* Q4_K_M */
    if (k_m && dt == DT_Q5_K)
        return 17; /* Q5_K_M */
    switch (dt) { /* llama.cpp's general.file_type values */
    case DT_F16: return 1;
    case DT_Q4_0: return 2;
    case DT_Q4_1: return 3;
    case DT_Q8_0: return 7;
    case DT_Q5_0: return 8;
    case DT_Q5_1: return 9;
    case DT_Q4_K: return 14; /* every matrix Q4_K: llama.cpp's Q4_K_S */
    case DT_Q5_K: return 16; /* Q5_K_S */
    case DT_Q6_K: return 18;
    case DT_Q2_K: return 10;
    case DT_Q3_K: return 11; /* every matrix Q3_K: Q3_K_S */
    case DT_BF16: return 32;
    default: return 0;
    }
}

/* GGUF_WRITE_PLACEHOLDER_VOCAB's vocabulary (gguf.h): piece types 2
 * unknown, 3 control, 6 byte, 1 normal; every score 0. */
static int write_placeholder_vocab(struct gguf_writer *w, int nv, struct err *e)
{
    if (nv < 259)
        return err_set(e, "a placeholder vocabulary needs at least 259 ids (the model has %d)", nv);
    char *pieces = malloc((size_t)nv * 16);
    const char **ptr = malloc(sizeof(char *) * (size_t)nv);
    float *scores = calloc((size_t)nv, sizeof(float));
    int32_t *types = malloc(sizeof(int32_t) * (size_t)nv);
    int rc = -1;
    if (!pieces || !ptr || !scores || !types) {
        err_set(e, "out of memory");
        goto out;
    }
    for (int i = 0; i < nv; i++) {
        char *p = pieces + (size_t)i * 16;
        if (i < 3)
            snprintf(p, 16, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259)
            snprintf(p, 16, "<0x%02X>", i - 3);
        else
            snprintf(p, 16, "t%d", i);
        ptr[i] = p;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
    }
    rc = gguf_writer_kv_str(w, "tokenizer.ggml.model", "llama", e) ||
                 gguf_writer_kv_arr_str(w, "tokenizer.ggml.tokens", ptr, (uint64_t)nv, e) ||
                 gguf_writer_kv_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores,
                                    (uint64_t)nv, e) ||
                 gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types,
                                    (uint64_t)nv, e)
             ? -1
             : 0;
out:
    free(pieces);
    free(ptr);
    free(scores);
    free(types);
    return rc;
}

static int write_kvs(struct gguf_writer *w, const struct model *m, const char *arch,
                     enum dtype dt, unsigned flags, struct err *e)
{
    const struct model_config *c = &m->cfg;
    char k[128];
    const char *base = strrchr(m->path, '/');
    base = base && base[1] ? base + 1 : (m->path[0] ? m->path : "cllm-model");
#define KEY(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    if (gguf_writer_kv_u32(w, "general.alignment", GGUF_DEFAULT_ALIGNMENT, e) ||
        gguf_writer_kv_str(w, "general.architecture", arch, e) ||
        gguf_writer_kv_str(w, "general.name", base, e) ||
        gguf_writer_kv_u32(w, "general.file_type", file_type(dt, flags & GGUF_WRITE_K_M), e) ||
        (dtype_block_elems(dt) > 1 &&
         gguf_writer_kv_u32(w, "general.quantization_version", 2, e)) ||
        gguf_writer_kv_u32(w, KEY("vocab_size"), (uint32_t)c->vocab_size, e) ||
        gguf_writer_kv_u32(w, KEY("context_length"), (uint32_t)c->max_seq, e) ||
        gguf_writer_kv_u32(w, KEY("embedding_length"), (uint32_t)c->dim, e) ||
        gguf_writer_kv_u32(w, KEY("feed_forward_length"), (uint32_t)c->hidden_dim, e) ||
        gguf_writer_kv_u32(w, KEY("block_count"), (uint32_t)c->n_layers, e) ||
        gguf_writer_kv_u32(w, KEY("attention.head_count"), (uint32_t)c->n_heads, e) ||
        gguf_writer_kv_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_kv_heads, e) ||
        gguf_writer_kv_u32(w, KEY("attention.key_length"), (uint32_t)c->head_dim, e) ||
        gguf_writer_kv_u32(w, KEY("attention.value_length"), (uint32_t)c->head_dim, e) ||
        gguf_writer_kv_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->norm_eps, e) ||
        gguf_writer_kv_f32(w, KEY("rope.freq_base"), c->rope_theta, e) ||
        gguf_writer_kv_u32(w, KEY("rope.dimension_count"), (uint32_t)c->head_dim, e))
        return -1;
    if (c->rope_scaling == ROPE_SCALING_LINEAR &&
        (gguf_writer_kv_str(w, KEY("rope.scaling.type"), "linear", e) ||
         gguf_writer_kv_f32(w, KEY("rope.scaling.factor"), c->rope_factor, e)))
        return -1;
    if (c->sliding_window > 0 && strcmp(arch, "llama"))
        return err_set(e, "sliding-window attention can only be written for llama/mistral");
    if (c->sliding_window > 0 &&
        gguf_writer_kv_u32(w, KEY("attention.sliding_window"), (uint32_t)c->sliding_window, e))
        return -1;
#undef KEY
    if ((flags & GGUF_WRITE_PLACEHOLDER_VOCAB) && write_placeholder_vocab(w, c->vocab_size, e))
        return -1;
    if (c->bos_id >= 0 &&
        gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_id, e))
        return -1;
    if (c->eos_id >= 0 &&
        gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_id, e))
        return -1;
    /* GGUF has no list of stop tokens: further ones go to the end-of-turn
     * and end-of-message keys, which the reader adds back (a 4th is lost). */
    static const char *const more[] = {"tokenizer.ggml.eot_token_id",
                                       "tokenizer.ggml.eom_token_id"};
    int nm = 0;
    for (int i = 0; i < c->n_eos && nm < 2; i++) {
        if (c->eos_ids[i] == c->eos_id || c->eos_ids[i] < 0)
            continue;
        if (gguf_writer_kv_u32(w, more[nm++], (uint32_t)c->eos_ids[i], e))
            return -1;
    }
    return 0;
}

static int add_plan(struct plan *p, int *n, const char *name, const struct tensor *src,
                    enum dtype dt, bool vec, enum perm perm, int hd)
{
    if (!tensor_present(src))
        return 0;
    struct plan *x = &p[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->src = src;
    x->vec = vec;
    x->out = vec ? DT_F32 : dt;
    /* rows that a format's 256-blocks do not divide take a 32-block format
     * of about as many bits, as llama.cpp does (Q4_K: Q5_0, Q5_K: Q5_1,
     * Q6_K: Q8_0; Q2_K and Q3_K: Q4_0, where llama.cpp now takes IQ4_NL,
     * which cllm does not compute); rows 32 does not divide either stay
     * f32 */
    if (src->cols % dtype_block_elems(x->out))
        x->out = x->out == DT_Q4_K                        ? DT_Q5_0
                 : x->out == DT_Q5_K                      ? DT_Q5_1
                 : x->out == DT_Q2_K || x->out == DT_Q3_K ? DT_Q4_0
                                                          : DT_Q8_0;
    if (src->cols % dtype_block_elems(x->out))
        x->out = DT_F32;
    x->perm = perm;
    x->head_dim = hd;
    return 0;
}

/* Streams one planned tensor: rows in destination order, each fetched from
 * the source (or row_fn), reordered, encoded and written. */
static int write_tensor(struct gguf_writer *w, const struct plan *p, gguf_row_fn row_fn,
                        void *ctx, float *buf, float *tmp, void *enc, struct err *e)
{
    const struct tensor *t = p->src;
    size_t src_rb = dtype_row_bytes(t->dtype, t->cols), out_rb = dtype_row_bytes(p->out, t->cols);
    for (int64_t r = 0; r < t->rows; r++) {
        int64_t sr = p->vec ? r : perm_src(p->perm, p->head_dim, r);
        if (p->own)
            row_fn = NULL;
        const void *raw = row_fn ? NULL : (const uint8_t *)t->data + (size_t)sr * src_rb;
        if (raw && t->dtype == p->out && (p->vec ? p->perm == PERM_NONE : true)) {
            if (gguf_writer_data(w, raw, out_rb, e))
                return -1;
            continue; /* same dtype: copy the bytes exactly */
        }
        if (row_fn) {
            if (row_fn(ctx, t, sr, buf))
                return err_set(e, "generating tensor %s failed", p->name);
        } else {
            gguf_decode_row(t->dtype, raw, buf, t->cols);
        }
        const float *row = buf;
        if (p->vec && p->perm != PERM_NONE) {
            for (int64_t i = 0; i < t->cols; i++)
                tmp[i] = buf[perm_src(p->perm, p->head_dim, i)];
            row = tmp;
        }
        gguf_encode_row(p->out, row, enc, t->cols);
        if (gguf_writer_data(w, enc, out_rb, e))
            return -1;
    }
    return 0;
}

int gguf_write_model_rows(const struct model *m, enum dtype dt, const char *path,
                          gguf_row_fn row_fn, void *ctx, struct err *e)
{
    return gguf_write_model_flags(m, dt, path, row_fn, ctx, 0, e);
}

int gguf_write_model_flags(const struct model *m, enum dtype dt, const char *path,
                           gguf_row_fn row_fn, void *ctx, unsigned flags, struct err *e)
{
    const struct model_config *c = &m->cfg;
    const char *arch;
    bool interleaved;
    if (!strcmp(c->arch, "llama") || !strcmp(c->arch, "mistral")) {
        arch = "llama"; /* llama.cpp writes mistral models as llama too */
        interleaved = true;
    } else if (!strcmp(c->arch, "qwen2") || !strcmp(c->arch, "qwen3")) {
        arch = c->arch;
        interleaved = false;
    } else {
        return err_set(e, "%s: can't write architecture '%s' as GGUF", path, c->arch);
    }
    if (dt >= DT_COUNT)
        return err_set(e, "%s: bad dtype", path);
    struct stat so, sd; /* writing over the mapped source would crash the reads */
    if (stat(m->path, &so) == 0 && S_ISREG(so.st_mode) && stat(path, &sd) == 0 &&
        so.st_dev == sd.st_dev && so.st_ino == sd.st_ino)
        return err_set(e, "%s: is the model being converted; choose another output file", path);
    /* Llama 3.1's scaling as llama.cpp's converter stores it: a divisor
     * for each frequency (rope_freqs.weight), worked out in double as its
     * Python does */
    const int half = c->head_dim / 2;
    float freqs[512];
    struct tensor freqs_t = {DT_F32, 1, half, freqs};
    if ((c->rope_scaling == ROPE_SCALING_LLAMA3 || c->rope_scaling == ROPE_SCALING_FREQS) &&
        half > (int)(sizeof freqs / sizeof freqs[0]))
        return err_set(e, "%s: head_dim %d is too large for rope_freqs", path, c->head_dim);
    for (int i = 0; i < half && c->rope_scaling == ROPE_SCALING_FREQS; i++)
        freqs[i] = c->rope_freqs[i];
    for (int i = 0; i < half && c->rope_scaling == ROPE_SCALING_LLAMA3; i++) {
        const double f = 1.0 / pow((double)c->rope_theta, (double)(2 * i) / c->head_dim);
        const double wl = 2.0 * M_PI / f, old = c->rope_orig_max_seq;
        const double lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
        double k = 1.0;
        if (wl > old / lo)
            k = c->rope_factor;
        else if (wl >= old / hi) {
            const double sm = (old / wl - lo) / (hi - lo);
            k = 1.0 / ((1.0 - sm) / c->rope_factor + sm);
        }
        freqs[i] = (float)k;
    }
    enum perm perm = PERM_NONE;
    if (interleaved && !c->rope_interleaved)
        perm = PERM_TO_INTERLEAVED;
    else if (!interleaved && c->rope_interleaved)
        perm = PERM_FROM_INTERLEAVED;

    int cap = 4 + 14 * c->n_layers, n = 0;
    struct plan *p = calloc((size_t)cap, sizeof *p);
    if (!p)
        return err_set(e, "out of memory");
    bool tied = c->tied_embeddings || m->lm_head.data == m->tok_embd.data;
    int hd = c->head_dim;
    char nm[64];
    /* the _M mix's Q6_K matrices (GGUF_WRITE_K_M) */
    const bool k_m = (flags & GGUF_WRITE_K_M) && (dt == DT_Q4_K || dt == DT_Q5_K);
    const enum dtype hi = k_m ? DT_Q6_K : dt;
    add_plan(p, &n, "token_embd.weight", &m->tok_embd, tied ? hi : dt, false, PERM_NONE, hd);
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *lw = &m->layers[l];
        const struct {
            const char *suffix;
            const struct tensor *t;
            bool vec;
            bool permuted;
        } parts[] = {
            {"attn_norm.weight", &lw->attn_norm, true, false},
            {"attn_q.weight", &lw->wq, false, true},
            {"attn_k.weight", &lw->wk, false, true},
            {"attn_v.weight", &lw->wv, false, false},
            {"attn_output.weight", &lw->wo, false, false},
            {"attn_q.bias", &lw->bq, true, true},
            {"attn_k.bias", &lw->bk, true, true},
            {"attn_v.bias", &lw->bv, true, false},
            {"attn_q_norm.weight", &lw->q_norm, true, true},
            {"attn_k_norm.weight", &lw->k_norm, true, true},
            {"ffn_norm.weight", &lw->ffn_norm, true, false},
            {"ffn_gate.weight", &lw->w_gate, false, false},
            {"ffn_up.weight", &lw->w_up, false, false},
            {"ffn_down.weight", &lw->w_down, false, false},
        };
        const bool more = k_m && more_bits(l, c->n_layers);
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            snprintf(nm, sizeof nm, "blk.%d.%s", l, parts[i].suffix);
            const bool up = more && (parts[i].t == &lw->wv || parts[i].t == &lw->w_down);
            add_plan(p, &n, nm, parts[i].t, up ? hi : dt, parts[i].vec,
                     parts[i].permuted ? perm : PERM_NONE, hd);
        }
    }
    add_plan(p, &n, "output_norm.weight", &m->out_norm, dt, true, PERM_NONE, hd);
    if (c->rope_scaling == ROPE_SCALING_LLAMA3 || c->rope_scaling == ROPE_SCALING_FREQS) {
        add_plan(p, &n, "rope_freqs.weight", &freqs_t, DT_F32, true, PERM_NONE, hd);
        p[n - 1].own = true;
    }
    if (!tied)
        add_plan(p, &n, "output.weight", &m->lm_head, hi, false, PERM_NONE, hd);

    int rc = -1;
    int64_t max_cols = 1;
    float *buf = NULL, *tmp = NULL;
    void *enc = NULL;
    struct gguf_writer *w = gguf_writer_new(e);
    if (!w || write_kvs(w, m, arch, dt, flags, e))
        goto out;
    for (int i = 0; i < n; i++) {
        const struct tensor *t = p[i].src;
        if (t->rows <= 0 || t->cols <= 0 || (p[i].perm != PERM_NONE && (hd <= 0 || hd % 2 ||
            (p[i].vec ? t->cols : t->rows) % hd))) {
            err_set(e, "%s: tensor %s has shape [%lld, %lld], not usable with head_dim %d", path,
                    p[i].name, (long long)t->rows, (long long)t->cols, hd);
            goto out;
        }
        uint64_t ne[2] = {(uint64_t)t->cols, (uint64_t)t->rows};
        if (gguf_writer_add_tensor(w, p[i].name, gguf_ttype_from_dtype(p[i].out),
                                   p[i].vec ? 1 : 2, ne, e))
            goto out;
        if (p[i].vec && t->rows != 1) {
            err_set(e, "%s: %s should be a vector but has %lld rows", path, p[i].name,
                    (long long)t->rows);
            goto out;
        }
        if (t->cols > max_cols)
            max_cols = t->cols;
    }
    buf = malloc((size_t)max_cols * sizeof *buf);
    tmp = malloc((size_t)max_cols * sizeof *tmp);
    enc = malloc((size_t)max_cols * sizeof(float));
    if (!buf || !tmp || !enc) {
        err_set(e, "out of memory");
        goto out;
    }
    if (gguf_writer_open(w, path, e))
        goto out;
    for (int i = 0; i < n; i++)
        if (write_tensor(w, &p[i], row_fn, ctx, buf, tmp, enc, e))
            goto out;
    rc = gguf_writer_close(w, e);
out:
    gguf_writer_free(w);
    free(buf);
    free(tmp);
    free(enc);
    free(p);
    return rc;
}

int gguf_write_model(const struct model *m, enum dtype dt, const char *path, struct err *e)
{
    return gguf_write_model_rows(m, dt, path, NULL, NULL, e);
}
