/* gguf.c - reads GGUF v2/v3 files defensively (every length, count and offset
 * is checked against the file size before it is used) and turns a llama /
 * mistral / qwen2 / qwen3 GGUF into the in-memory struct model, with the
 * weights left in place in the memory map. */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- type tables (GGUF / ggml format facts) ---- */

static const char *const vtype_names[GGUF_VT_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64",
};

size_t gguf_vtype_size(uint32_t t)
{
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

const char *gguf_vtype_name(uint32_t t)
{
    return t < GGUF_VT_COUNT ? vtype_names[t] : "unknown";
}

/* Every ggml type id that has appeared in released GGUF files, with its
 * block layout, so that any file can be bounds-checked even when cllm can't
 * compute with its tensors. Ids that were removed from ggml are absent. */
static const struct {
    uint32_t id;
    const char *name;
    uint32_t block_elems, block_bytes;
} ttypes[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},          {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},       {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 36},       {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},    {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},    {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98},  {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},   {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},          {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},         {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},        {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
};

const char *gguf_ttype_name(uint32_t t)
{
    for (size_t i = 0; i < sizeof ttypes / sizeof ttypes[0]; i++)
        if (ttypes[i].id == t)
            return ttypes[i].name;
    return "unknown";
}

int gguf_ttype_block(uint32_t t, uint32_t *block_elems, uint32_t *block_bytes)
{
    for (size_t i = 0; i < sizeof ttypes / sizeof ttypes[0]; i++) {
        if (ttypes[i].id == t) {
            *block_elems = ttypes[i].block_elems;
            *block_bytes = ttypes[i].block_bytes;
            return 1;
        }
    }
    return 0;
}

uint32_t gguf_ttype_from_dtype(enum dtype d)
{
    switch (d) {
    case DT_F32: return GGUF_TENSOR_F32;
    case DT_F16: return GGUF_TENSOR_F16;
    case DT_BF16: return GGUF_TENSOR_BF16;
    case DT_Q8_0: return GGUF_TENSOR_Q8_0;
    case DT_Q4_0: return GGUF_TENSOR_Q4_0;
    case DT_Q4_1: return GGUF_TENSOR_Q4_1;
    case DT_Q5_0: return GGUF_TENSOR_Q5_0;
    case DT_Q5_1: return GGUF_TENSOR_Q5_1;
    case DT_Q4_K: return GGUF_TENSOR_Q4_K;
    case DT_Q5_K: return GGUF_TENSOR_Q5_K;
    case DT_Q6_K: return GGUF_TENSOR_Q6_K;
    case DT_Q2_K: return GGUF_TENSOR_Q2_K;
    case DT_Q3_K: return GGUF_TENSOR_Q3_K;
    default: return (uint32_t)-1;
    }
}

int gguf_ttype_to_dtype(uint32_t t, enum dtype *out)
{
    switch (t) {
    case GGUF_TENSOR_F32: *out = DT_F32; return 0;
    case GGUF_TENSOR_F16: *out = DT_F16; return 0;
    case GGUF_TENSOR_BF16: *out = DT_BF16; return 0;
    case GGUF_TENSOR_Q8_0: *out = DT_Q8_0; return 0;
    case GGUF_TENSOR_Q4_0: *out = DT_Q4_0; return 0;
    case GGUF_TENSOR_Q4_1: *out = DT_Q4_1; return 0;
    case GGUF_TENSOR_Q5_0: *out = DT_Q5_0; return 0;
    case GGUF_TENSOR_Q5_1: *out = DT_Q5_1; return 0;
    case GGUF_TENSOR_Q4_K: *out = DT_Q4_K; return 0;
    case GGUF_TENSOR_Q5_K: *out = DT_Q5_K; return 0;
    case GGUF_TENSOR_Q6_K: *out = DT_Q6_K; return 0;
    case GGUF_TENSOR_Q2_K: *out = DT_Q2_K; return 0;
    case GGUF_TENSOR_Q3_K: *out = DT_Q3_K; return 0;
    default: return -1;
    }
}

/* ---- bounds-checked reading ---- */

struct rd {
    const uint8_t *base, *p, *end;
    const char *name; /* file name for messages */
    const char *what; /* what is being read, for "truncated" messages */
    struct err *e;    /* NULL: silent (re-reading validated data) */
};

static int rd_need(struct rd *r, uint64_t n)
{
    if ((uint64_t)(r->end - r->p) >= n)
        return 0;
    return err_set(r->e, "%s: truncated file: %s needs %llu bytes at offset %zu, file size %zu",
                   r->name, r->what, (unsigned long long)n, (size_t)(r->p - r->base),
                   (size_t)(r->end - r->base));
}

static int rd_u32(struct rd *r, uint32_t *v)
{
    if (rd_need(r, 4))
        return -1;
    memcpy(v, r->p, 4);
    r->p += 4;
    return 0;
}

static int rd_u64(struct rd *r, uint64_t *v)
{
    if (rd_need(r, 8))
        return -1;
    memcpy(v, r->p, 8);
    r->p += 8;
    return 0;
}

static int rd_str(struct rd *r, struct gguf_str *s)
{
    uint64_t len;
    if (rd_u64(r, &len))
        return -1;
    if ((uint64_t)(r->end - r->p) < len)
        return err_set(r->e, "%s: %s: string of %llu bytes at offset %zu extends past end of "
                             "file (file size %zu)",
                       r->name, r->what, (unsigned long long)len, (size_t)(r->p - r->base),
                       (size_t)(r->end - r->base));
    s->ptr = (const char *)r->p;
    s->len = len;
    r->p += len;
    return 0;
}

/* Reads one value of type `type`; arrays are validated element by element
 * (recursively, at most GGUF_MAX_NESTING deep) and left encoded. */
static int rd_value(struct rd *r, uint32_t type, struct gguf_value *out, int depth)
{
    out->type = (enum gguf_vtype)type;
    size_t sz = gguf_vtype_size(type);
    if (sz) {
        if (rd_need(r, sz))
            return -1;
        uint8_t b[8];
        memcpy(b, r->p, sz);
        r->p += sz;
        switch (type) {
        case GGUF_VT_UINT8: out->v.u = b[0]; break;
        case GGUF_VT_BOOL: out->v.u = b[0] != 0; break;
        case GGUF_VT_INT8: { int8_t x; memcpy(&x, b, 1); out->v.i = x; break; }
        case GGUF_VT_UINT16: { uint16_t x; memcpy(&x, b, 2); out->v.u = x; break; }
        case GGUF_VT_INT16: { int16_t x; memcpy(&x, b, 2); out->v.i = x; break; }
        case GGUF_VT_UINT32: { uint32_t x; memcpy(&x, b, 4); out->v.u = x; break; }
        case GGUF_VT_INT32: { int32_t x; memcpy(&x, b, 4); out->v.i = x; break; }
        case GGUF_VT_FLOAT32: { float x; memcpy(&x, b, 4); out->v.f = x; break; }
        case GGUF_VT_UINT64: memcpy(&out->v.u, b, 8); break;
        case GGUF_VT_INT64: memcpy(&out->v.i, b, 8); break;
        case GGUF_VT_FLOAT64: memcpy(&out->v.f, b, 8); break;
        }
        return 0;
    }
    if (type == GGUF_VT_STRING)
        return rd_str(r, &out->v.s);
    if (type != GGUF_VT_ARRAY)
        return err_set(r->e, "%s: %s has unknown value type %u (offset %zu)", r->name, r->what,
                       type, (size_t)(r->p - r->base));
    if (depth >= GGUF_MAX_NESTING)
        return err_set(r->e, "%s: %s: arrays nested more than %d deep", r->name, r->what,
                       GGUF_MAX_NESTING);
    uint32_t et;
    uint64_t n;
    if (rd_u32(r, &et) || rd_u64(r, &n))
        return -1;
    size_t left = (size_t)(r->end - r->p);
    out->v.arr.type = (enum gguf_vtype)et;
    out->v.arr.n = n;
    out->v.arr.data = r->p;
    size_t esz = gguf_vtype_size(et);
    if (esz) {
        if (n > left / esz)
            return err_set(r->e, "%s: %s: array of %llu %s values extends past end of file "
                                 "(offset %zu, file size %zu)",
                           r->name, r->what, (unsigned long long)n, gguf_vtype_name(et),
                           (size_t)(r->p - r->base), (size_t)(r->end - r->base));
        r->p += n * esz;
    } else if (et == GGUF_VT_STRING || et == GGUF_VT_ARRAY) {
        /* Each element takes at least 8 (string) or 12 (array) bytes: a huge
         * count in a small file is rejected before looping over it. */
        if (n > left / (et == GGUF_VT_STRING ? 8 : 12))
            return err_set(r->e, "%s: %s: array of %llu %s values extends past end of file "
                                 "(offset %zu, file size %zu)",
                           r->name, r->what, (unsigned long long)n, gguf_vtype_name(et),
                           (size_t)(r->p - r->base), (size_t)(r->end - r->base));
        for (uint64_t i = 0; i < n; i++) {
            struct gguf_value tmp;
            if (rd_value(r, et, &tmp, depth + 1))
                return -1;
        }
    } else {
        return err_set(r->e, "%s: %s: array has unknown element type %u", r->name, r->what, et);
    }
    out->v.arr.bytes = (size_t)(r->p - out->v.arr.data);
    return 0;
}

/* ---- lookups ---- */

static int str_cmp(struct gguf_str a, struct gguf_str b)
{
    size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (c)
        return c;
    return (a.len > b.len) - (a.len < b.len);
}

bool gguf_str_eq(struct gguf_str s, const char *cstr)
{
    size_t n = strlen(cstr);
    return s.len == n && memcmp(s.ptr, cstr, n) == 0;
}

struct name_idx {
    struct gguf_str s;
    uint32_t i;
};

static int cmp_name_idx(const void *a, const void *b)
{
    return str_cmp(((const struct name_idx *)a)->s, ((const struct name_idx *)b)->s);
}

/* Sorts the names for binary search; returns the index of a duplicate name,
 * -1 if none, -2 when out of memory. */
static long sort_names(const struct gguf_str *(*get)(const struct gguf_file *, uint64_t),
                       const struct gguf_file *g, uint64_t n, uint32_t **out)
{
    *out = NULL;
    if (n == 0)
        return -1;
    struct name_idx *tmp = malloc(n * sizeof *tmp);
    uint32_t *idx = malloc(n * sizeof *idx);
    if (!tmp || !idx) {
        free(tmp);
        free(idx);
        return -2;
    }
    for (uint64_t i = 0; i < n; i++)
        tmp[i] = (struct name_idx){*get(g, i), (uint32_t)i};
    qsort(tmp, n, sizeof *tmp, cmp_name_idx);
    long dup = -1;
    for (uint64_t i = 0; i < n; i++) {
        idx[i] = tmp[i].i;
        if (i > 0 && dup < 0 && str_cmp(tmp[i - 1].s, tmp[i].s) == 0)
            dup = (long)tmp[i].i;
    }
    free(tmp);
    *out = idx;
    return dup;
}

static const struct gguf_str *kv_name(const struct gguf_file *g, uint64_t i)
{
    return &g->kv[i].key;
}

static const struct gguf_str *tensor_name(const struct gguf_file *g, uint64_t i)
{
    return &g->tensors[i].name;
}

static long bsearch_name(const uint32_t *sorted, uint64_t n, const char *name,
                         const struct gguf_str *(*get)(const struct gguf_file *, uint64_t),
                         const struct gguf_file *g)
{
    struct gguf_str key = {name, strlen(name)};
    uint64_t lo = 0, hi = n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = str_cmp(*get(g, sorted[mid]), key);
        if (c == 0)
            return sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

const struct gguf_kv *gguf_find_kv(const struct gguf_file *g, const char *key)
{
    long i = bsearch_name(g->kv_sorted, g->n_kv, key, kv_name, g);
    return i < 0 ? NULL : &g->kv[i];
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name)
{
    long i = bsearch_name(g->tensor_sorted, g->n_tensors, name, tensor_name, g);
    return i < 0 ? NULL : &g->tensors[i];
}

int gguf_value_int(const struct gguf_value *v, int64_t *out)
{
    switch (v->type) {
    case GGUF_VT_UINT8: case GGUF_VT_UINT16: case GGUF_VT_UINT32: case GGUF_VT_UINT64:
        if (v->v.u > (uint64_t)INT64_MAX)
            return -1;
        *out = (int64_t)v->v.u;
        return 0;
    case GGUF_VT_INT8: case GGUF_VT_INT16: case GGUF_VT_INT32: case GGUF_VT_INT64:
        *out = v->v.i;
        return 0;
    default:
        return -1;
    }
}

int gguf_value_float(const struct gguf_value *v, double *out)
{
    int64_t i;
    if (v->type == GGUF_VT_FLOAT32 || v->type == GGUF_VT_FLOAT64) {
        *out = v->v.f;
        return 0;
    }
    if (gguf_value_int(v, &i) == 0) {
        *out = (double)i;
        return 0;
    }
    return -1;
}

void gguf_arr_iter_init(struct gguf_arr_iter *it, const struct gguf_value *arr)
{
    memset(it, 0, sizeof *it);
    if (arr->type != GGUF_VT_ARRAY)
        return;
    it->type = arr->v.arr.type;
    it->n = arr->v.arr.n;
    it->p = arr->v.arr.data;
    it->end = arr->v.arr.data + arr->v.arr.bytes;
}

int gguf_arr_next(struct gguf_arr_iter *it, struct gguf_value *out)
{
    if (it->i >= it->n)
        return 0;
    /* The bytes were validated by gguf_parse; reading them again through the
     * checked reader keeps a single decoding path. */
    struct rd r = {it->p, it->p, it->end, "", "array element", NULL};
    if (rd_value(&r, it->type, out, 1))
        return 0;
    it->p = r.p;
    it->i++;
    return 1;
}

/* ---- parsing ---- */

static int parse_header_and_kv(struct gguf_file *g, struct rd *r, struct err *e)
{
    r->what = "the header";
    if ((size_t)(r->end - r->p) < 4)
        return err_set(e, "%s: not a GGUF file (only %zu bytes)", g->name,
                       (size_t)(r->end - r->p));
    if (memcmp(r->p, "GGUF", 4) != 0)
        return err_set(e, "%s: not a GGUF file (magic bytes %02x %02x %02x %02x, expected "
                          "\"GGUF\")",
                       g->name, r->p[0], r->p[1], r->p[2], r->p[3]);
    r->p += 4;
    r->what = "the version";
    if (rd_u32(r, &g->version))
        return -1;
    if (g->version == 1)
        return err_set(e, "%s: GGUF version 1 is not supported (re-convert the model)", g->name);
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0)
            return err_set(e, "%s: big-endian GGUF (version bytes %08x) is not supported",
                           g->name, g->version);
        return err_set(e, "%s: unsupported GGUF version %u (expected 2 or 3)", g->name,
                       g->version);
    }
    r->what = "the tensor count";
    if (rd_u64(r, &g->n_tensors))
        return -1;
    r->what = "the metadata count";
    if (rd_u64(r, &g->n_kv))
        return -1;
    size_t left = (size_t)(r->end - r->p);
    /* A metadata entry takes at least 8 + 4 + 1 bytes, a tensor info at
     * least 8 + 4 + 8 + 4 + 8: counts that can't fit are corrupt. */
    if (g->n_kv > left / 13)
        return err_set(e, "%s: metadata count %llu is impossible for a file of %zu bytes "
                          "(corrupt header)",
                       g->name, (unsigned long long)g->n_kv, g->size);
    if (g->n_tensors > left / 32)
        return err_set(e, "%s: tensor count %llu is impossible for a file of %zu bytes "
                          "(corrupt header)",
                       g->name, (unsigned long long)g->n_tensors, g->size);
    if (g->n_kv > INT32_MAX || g->n_tensors > INT32_MAX)
        return err_set(e, "%s: more than 2^31 metadata entries or tensors", g->name);
    if (g->n_kv && !(g->kv = calloc(g->n_kv, sizeof *g->kv)))
        return err_set(e, "%s: out of memory", g->name);
    char what[200];
    r->what = what;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        struct gguf_kv *kv = &g->kv[i];
        snprintf(what, sizeof what, "the key of metadata entry %llu", (unsigned long long)i);
        if (rd_str(r, &kv->key))
            return -1;
        if (kv->key.len == 0 || kv->key.len > 65535)
            return err_set(e, "%s: metadata entry %llu has a key of %llu bytes (must be 1..65535)",
                           g->name, (unsigned long long)i, (unsigned long long)kv->key.len);
        snprintf(what, sizeof what, "metadata '%.*s'", (int)(kv->key.len > 100 ? 100 : kv->key.len),
                 kv->key.ptr);
        uint32_t type;
        if (rd_u32(r, &type) || rd_value(r, type, &kv->val, 0))
            return -1;
    }
    long dup = sort_names(kv_name, g, g->n_kv, &g->kv_sorted);
    if (dup == -2)
        return err_set(e, "%s: out of memory", g->name);
    if (dup >= 0)
        return err_set(e, "%s: duplicate metadata key '%.*s'", g->name,
                       (int)(g->kv[dup].key.len > 100 ? 100 : g->kv[dup].key.len),
                       g->kv[dup].key.ptr);
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *al = gguf_find_kv(g, "general.alignment");
    if (al) {
        int64_t a;
        if (gguf_value_int(&al->val, &a))
            return err_set(e, "%s: general.alignment has type %s, expected an integer", g->name,
                           gguf_vtype_name(al->val.type));
        if (a <= 0 || a > (1 << 30) || (a & (a - 1)))
            return err_set(e, "%s: general.alignment %lld is not a power of two up to 2^30",
                           g->name, (long long)a);
        g->alignment = (size_t)a;
    }
    r->what = ""; /* `what` goes out of scope */
    return 0;
}

static int parse_tensor_infos(struct gguf_file *g, struct rd *r, struct err *e)
{
    if (g->n_tensors && !(g->tensors = calloc(g->n_tensors, sizeof *g->tensors)))
        return err_set(e, "%s: out of memory", g->name);
    char what[200];
    r->what = what;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        snprintf(what, sizeof what, "the name of tensor %llu", (unsigned long long)i);
        if (rd_str(r, &t->name))
            return -1;
        if (t->name.len == 0 || t->name.len > 255)
            return err_set(e, "%s: tensor %llu has a name of %llu bytes (must be 1..255)", g->name,
                           (unsigned long long)i, (unsigned long long)t->name.len);
        int nl = (int)t->name.len;
        const char *nm = t->name.ptr;
        snprintf(what, sizeof what, "tensor info of '%.*s'", nl, nm);
        if (rd_u32(r, &t->n_dims))
            return -1;
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
            return err_set(e, "%s: tensor '%.*s' has %u dimensions (must be 1..%d)", g->name, nl,
                           nm, t->n_dims, GGUF_MAX_DIMS);
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            if (rd_u64(r, &t->ne[d]))
                return -1;
            if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX)
                return err_set(e, "%s: tensor '%.*s' has invalid dimension %u = %llu", g->name,
                               nl, nm, d, (unsigned long long)t->ne[d]);
        }
        if (rd_u32(r, &t->type) || rd_u64(r, &t->offset))
            return -1;
        uint32_t be, bb;
        if (!gguf_ttype_block(t->type, &be, &bb))
            return err_set(e, "%s: tensor '%.*s' has unknown type %u", g->name, nl, nm, t->type);
        if (t->ne[0] % be)
            return err_set(e, "%s: tensor '%.*s' of type %s has %llu columns, not a multiple of "
                              "the block size %u",
                           g->name, nl, nm, gguf_ttype_name(t->type),
                           (unsigned long long)t->ne[0], be);
        /* bytes = ne0/be*bb * ne1*ne2*ne3, refused if it overflows 2^62 */
        const uint64_t lim = (uint64_t)1 << 62;
        if (t->ne[0] / be > lim / bb)
            return err_set(e, "%s: tensor '%.*s' is impossibly large", g->name, nl, nm);
        uint64_t bytes = t->ne[0] / be * bb;
        for (int d = 1; d < GGUF_MAX_DIMS; d++) {
            if (bytes > lim / t->ne[d])
                return err_set(e, "%s: tensor '%.*s' is impossibly large", g->name, nl, nm);
            bytes *= t->ne[d];
        }
        t->nbytes = bytes;
        if (t->offset % g->alignment)
            return err_set(e, "%s: tensor '%.*s' offset %llu is not a multiple of the alignment "
                              "%zu",
                           g->name, nl, nm, (unsigned long long)t->offset, g->alignment);
    }
    long dup = sort_names(tensor_name, g, g->n_tensors, &g->tensor_sorted);
    if (dup == -2)
        return err_set(e, "%s: out of memory", g->name);
    if (dup >= 0)
        return err_set(e, "%s: duplicate tensor name '%.*s'", g->name,
                       (int)g->tensors[dup].name.len, g->tensors[dup].name.ptr);

    size_t pos = (size_t)(r->p - r->base);
    g->data_offset = (pos + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors == 0)
        return 0; /* vocab-only files may end right after the metadata */
    if (g->data_offset > g->size)
        return err_set(e, "%s: truncated file: the tensor data section starts at offset %zu, "
                          "file size %zu",
                       g->name, g->data_offset, g->size);
    uint64_t avail = g->size - g->data_offset;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return err_set(e, "%s: tensor '%.*s' extends past end of file (offset %llu, %llu "
                              "bytes, data section at %zu, file size %zu)",
                           g->name, (int)t->name.len, t->name.ptr, (unsigned long long)t->offset,
                           (unsigned long long)t->nbytes, g->data_offset, g->size);
        t->data = r->base + g->data_offset + t->offset;
    }
    return 0;
}

int gguf_parse(struct gguf_file *g, const void *buf, size_t size, const char *name,
               struct err *e)
{
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", name);
    g->base = buf;
    g->size = size;
    struct rd r = {buf, buf, (const uint8_t *)buf + size, g->name, "", e};
    if (parse_header_and_kv(g, &r, e) || parse_tensor_infos(g, &r, e)) {
        gguf_close(g);
        return -1;
    }
    return 0;
}

int gguf_open(struct gguf_file *g, const char *path, struct err *e)
{
    memset(g, 0, sizeof *g);
    void *map;
    size_t size;
    if (model_map_file(path, 4, "not a GGUF file (too short)", &map, &size, e))
        return -1;
    if (gguf_parse(g, map, size, path, e)) {
        munmap(map, size);
        return -1;
    }
    g->map = map;
    g->map_len = size;
    return 0;
}

void gguf_close(struct gguf_file *g)
{
    free(g->kv);
    free(g->tensors);
    free(g->kv_sorted);
    free(g->tensor_sorted);
    if (g->map)
        munmap(g->map, g->map_len);
    g->kv = NULL;
    g->tensors = NULL;
    g->kv_sorted = g->tensor_sorted = NULL;
    g->map = NULL;
    g->n_kv = g->n_tensors = 0;
}

/* ---- tokenizer metadata ---- */

static int vocab_id(const struct gguf_file *g, const char *key, int *out, struct err *e)
{
    *out = -1;
    const struct gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv)
        return 0;
    int64_t v;
    if (gguf_value_int(&kv->val, &v)) {
        /* UINT64 above INT64_MAX lands here too: treat it like -1 */
        if (kv->val.type == GGUF_VT_UINT64)
            return 0;
        return err_set(e, "%s: %s has type %s, expected a token id", g->name, key,
                       gguf_vtype_name(kv->val.type));
    }
    /* Some converters store "none" as -1 or as 0xffffffff: both mean absent. */
    if (v >= 0 && v < INT32_MAX)
        *out = (int)v;
    return 0;
}

static int vocab_flag(const struct gguf_file *g, const char *key, int *out)
{
    const struct gguf_kv *kv = gguf_find_kv(g, key);
    *out = kv && kv->val.type == GGUF_VT_BOOL ? (int)kv->val.v.u : -1;
    return 0;
}

/* The array under key with element type et and, when n >= 0, n elements. */
static const struct gguf_value *vocab_arr(const struct gguf_file *g, const char *key,
                                          enum gguf_vtype et, int64_t n, struct err *e, int *bad)
{
    const struct gguf_kv *kv = gguf_find_kv(g, key);
    *bad = 0;
    if (!kv)
        return NULL;
    if (kv->val.type != GGUF_VT_ARRAY || kv->val.v.arr.type != et) {
        *bad = err_set(e, "%s: %s must be an array of %s", g->name, key, gguf_vtype_name(et));
        return NULL;
    }
    if (n >= 0 && kv->val.v.arr.n != (uint64_t)n) {
        *bad = err_set(e, "%s: %s has %llu entries but there are %lld tokens", g->name, key,
                       (unsigned long long)kv->val.v.arr.n, (long long)n);
        return NULL;
    }
    return &kv->val;
}

/* Copies the strings of an array into blob (NUL-terminated). */
static char *copy_strings(const struct gguf_value *arr, char **ptrs, uint32_t *lens, char *blob)
{
    struct gguf_arr_iter it;
    struct gguf_value s;
    gguf_arr_iter_init(&it, arr);
    for (uint64_t i = 0; gguf_arr_next(&it, &s); i++) {
        ptrs[i] = blob;
        if (lens)
            lens[i] = (uint32_t)s.v.s.len;
        memcpy(blob, s.v.s.ptr, s.v.s.len);
        blob += s.v.s.len;
        *blob++ = '\0';
    }
    return blob;
}

static size_t strings_bytes(const struct gguf_value *arr)
{
    /* arr.bytes = sum(8 + len): the NULs take the place of part of the 8. */
    return arr ? arr->v.arr.bytes : 0;
}

int gguf_vocab_from_file(const struct gguf_file *g, struct gguf_vocab *v, struct err *e)
{
    memset(v, 0, sizeof *v);
    const struct gguf_kv *model = gguf_find_kv(g, "tokenizer.ggml.model");
    if (!model || model->val.type != GGUF_VT_STRING)
        return err_set(e, "%s: no tokenizer metadata (tokenizer.ggml.model missing or not a "
                          "string)", g->name);
    snprintf(v->model, sizeof v->model, "%.*s",
             (int)(model->val.v.s.len < sizeof v->model ? model->val.v.s.len : sizeof v->model),
             model->val.v.s.ptr);
    const struct gguf_kv *pre = gguf_find_kv(g, "tokenizer.ggml.pre");
    if (pre && pre->val.type == GGUF_VT_STRING)
        snprintf(v->pre, sizeof v->pre, "%.*s",
                 (int)(pre->val.v.s.len < sizeof v->pre ? pre->val.v.s.len : sizeof v->pre),
                 pre->val.v.s.ptr);
    int bad;
    const struct gguf_value *toks = vocab_arr(g, "tokenizer.ggml.tokens", GGUF_VT_STRING, -1, e, &bad);
    if (bad)
        return -1;
    if (!toks)
        return err_set(e, "%s: tokenizer.ggml.tokens missing", g->name);
    if (toks->v.arr.n == 0 || toks->v.arr.n > INT32_MAX)
        return err_set(e, "%s: tokenizer.ggml.tokens has %llu entries", g->name,
                       (unsigned long long)toks->v.arr.n);
    int n = (int)toks->v.arr.n;
    const struct gguf_value *scores = vocab_arr(g, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, n, e, &bad);
    if (bad)
        return -1;
    const struct gguf_value *types = vocab_arr(g, "tokenizer.ggml.token_type", GGUF_VT_INT32, n, e, &bad);
    if (bad)
        return -1;
    const struct gguf_value *merges = vocab_arr(g, "tokenizer.ggml.merges", GGUF_VT_STRING, -1, e, &bad);
    if (bad)
        return -1;
    if (merges && merges->v.arr.n > INT32_MAX)
        return err_set(e, "%s: too many merges", g->name);
    const struct gguf_kv *tmpl = gguf_find_kv(g, "tokenizer.chat_template");
    if (tmpl && tmpl->val.type != GGUF_VT_STRING)
        tmpl = NULL;

    if (vocab_id(g, "tokenizer.ggml.bos_token_id", &v->bos_id, e) ||
        vocab_id(g, "tokenizer.ggml.eos_token_id", &v->eos_id, e) ||
        vocab_id(g, "tokenizer.ggml.unknown_token_id", &v->unk_id, e) ||
        vocab_id(g, "tokenizer.ggml.padding_token_id", &v->pad_id, e) ||
        vocab_id(g, "tokenizer.ggml.eot_token_id", &v->eot_id, e))
        return -1;
    /* llama.cpp spells this key "seperator"; accept both. */
    if (vocab_id(g, "tokenizer.ggml.seperator_token_id", &v->sep_id, e))
        return -1;
    if (v->sep_id < 0 && vocab_id(g, "tokenizer.ggml.separator_token_id", &v->sep_id, e))
        return -1;
    vocab_flag(g, "tokenizer.ggml.add_bos_token", &v->add_bos);
    vocab_flag(g, "tokenizer.ggml.add_eos_token", &v->add_eos);

    size_t blob_len = strings_bytes(toks) + strings_bytes(merges) +
                      (tmpl ? (size_t)tmpl->val.v.s.len + 1 : 0) + 1;
    v->n_tokens = n;
    v->n_merges = merges ? (int)merges->v.arr.n : 0;
    v->blob_ = malloc(blob_len);
    v->tokens = malloc((size_t)n * sizeof *v->tokens);
    v->token_len = malloc((size_t)n * sizeof *v->token_len);
    if (scores)
        v->scores = malloc((size_t)n * sizeof *v->scores);
    if (types)
        v->token_type = malloc((size_t)n * sizeof *v->token_type);
    if (merges)
        v->merges = malloc((size_t)(v->n_merges ? v->n_merges : 1) * sizeof *v->merges);
    if (!v->blob_ || !v->tokens || !v->token_len || (scores && !v->scores) ||
        (types && !v->token_type) || (merges && !v->merges)) {
        gguf_vocab_free(v);
        return err_set(e, "%s: out of memory reading the vocabulary", g->name);
    }
    char *b = copy_strings(toks, v->tokens, v->token_len, v->blob_);
    if (merges)
        b = copy_strings(merges, v->merges, NULL, b);
    if (tmpl) {
        v->chat_template = b;
        memcpy(b, tmpl->val.v.s.ptr, tmpl->val.v.s.len);
        b[tmpl->val.v.s.len] = '\0';
    }
    if (scores)
        memcpy(v->scores, scores->v.arr.data, (size_t)n * sizeof(float));
    if (types)
        memcpy(v->token_type, types->v.arr.data, (size_t)n * sizeof(int32_t));
    return 0;
}

int gguf_read_vocab(const char *file, struct gguf_vocab *out, struct err *e)
{
    struct gguf_file g;
    memset(out, 0, sizeof *out);
    if (gguf_open(&g, file, e))
        return -1;
    int rc = gguf_vocab_from_file(&g, out, e);
    gguf_close(&g);
    return rc;
}

void gguf_vocab_free(struct gguf_vocab *v)
{
    free(v->tokens);
    free(v->token_len);
    free(v->scores);
    free(v->token_type);
    free(v->merges);
    free(v->blob_);
    memset(v, 0, sizeof *v);
}

/* ---- the model loader ---- */

struct ld {
    const struct gguf_file *g;
    const char *arch; /* key prefix */
    struct err *e;
};

/* Reads the integer <arch>.<suffix> into *out; absent keys give def, or an
 * error when required. */
static int ld_int(struct ld *l, const char *suffix, int required, int def, int *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", l->arch, suffix);
    const struct gguf_kv *kv = gguf_find_kv(l->g, key);
    if (!kv) {
        if (required)
            return err_set(l->e, "%s: missing metadata key %s", l->g->name, key);
        *out = def;
        return 0;
    }
    int64_t v;
    if (gguf_value_int(&kv->val, &v))
        return err_set(l->e, "%s: metadata %s has type %s, expected an integer", l->g->name, key,
                       gguf_vtype_name(kv->val.type));
    if (v < 0 || v > INT32_MAX)
        return err_set(l->e, "%s: metadata %s = %lld is out of range", l->g->name, key,
                       (long long)v);
    *out = (int)v;
    return 0;
}

static int ld_float(struct ld *l, const char *suffix, float def, float *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", l->arch, suffix);
    const struct gguf_kv *kv = gguf_find_kv(l->g, key);
    if (!kv) {
        *out = def;
        return 0;
    }
    double v;
    if (gguf_value_float(&kv->val, &v))
        return err_set(l->e, "%s: metadata %s has type %s, expected a number", l->g->name, key,
                       gguf_vtype_name(kv->val.type));
    *out = (float)v;
    return 0;
}

static int ld_config(struct ld *l, struct model_config *c, int *rope_dims_out)
{
    const struct gguf_file *g = l->g;
    const struct gguf_kv *a = gguf_find_kv(g, "general.architecture");
    if (!a || a->val.type != GGUF_VT_STRING)
        return err_set(l->e, "%s: general.architecture missing or not a string", g->name);
    static const char *const archs[] = {"llama", "mistral", "qwen2", "qwen3"};
    const char *arch = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (gguf_str_eq(a->val.v.s, archs[i]))
            arch = archs[i];
    if (!arch)
        return err_set(l->e, "%s: architecture '%.*s' is not supported (supported: llama, "
                             "mistral, qwen2, qwen3)",
                       g->name, (int)(a->val.v.s.len > 64 ? 64 : a->val.v.s.len), a->val.v.s.ptr);
    l->arch = arch;
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    int rope_dims, value_len;
    if (ld_int(l, "embedding_length", 1, 0, &c->dim) ||
        ld_int(l, "feed_forward_length", 1, 0, &c->hidden_dim) ||
        ld_int(l, "block_count", 1, 0, &c->n_layers) ||
        ld_int(l, "attention.head_count", 1, 0, &c->n_heads) ||
        ld_int(l, "attention.head_count_kv", 0, 0, &c->n_kv_heads) ||
        ld_int(l, "attention.key_length", 0, 0, &c->head_dim) ||
        ld_int(l, "attention.value_length", 0, 0, &value_len) ||
        ld_int(l, "rope.dimension_count", 0, 0, &rope_dims) ||
        ld_int(l, "context_length", 0, 0, &c->max_seq) ||
        ld_float(l, "attention.layer_norm_rms_epsilon", 0, &c->norm_eps) ||
        ld_float(l, "rope.freq_base", 10000.0f, &c->rope_theta))
        return -1;
    if (c->n_layers > 4096)
        return err_set(l->e, "%s: block_count %d is implausible", g->name, c->n_layers);
    /* llama.cpp's llama family: q/k rows were permuted for interleaved RoPE. */
    c->rope_interleaved = !strcmp(arch, "llama") || !strcmp(arch, "mistral");
    if (c->rope_interleaved && ld_int(l, "attention.sliding_window", 0, 0, &c->sliding_window))
        return -1;

    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    const struct gguf_kv *st = gguf_find_kv(g, key);
    float factor;
    if (ld_float(l, "rope.scaling.factor", 0, &factor))
        return -1;
    if (st) {
        if (st->val.type != GGUF_VT_STRING)
            return err_set(l->e, "%s: %s is not a string", g->name, key);
        if (gguf_str_eq(st->val.v.s, "linear")) {
            c->rope_scaling = ROPE_SCALING_LINEAR;
            c->rope_factor = factor;
        } else if (!gguf_str_eq(st->val.v.s, "none")) {
            return err_set(l->e, "%s: rope scaling '%.*s' is not supported (supported: none, "
                                 "linear)",
                           g->name, (int)(st->val.v.s.len > 32 ? 32 : st->val.v.s.len),
                           st->val.v.s.ptr);
        }
    } else {
        float lin; /* older files: <arch>.rope.scale_linear */
        if (ld_float(l, "rope.scale_linear", 0, &lin))
            return -1;
        if (lin > 0 && lin != 1.0f) {
            c->rope_scaling = ROPE_SCALING_LINEAR;
            c->rope_factor = lin;
        }
    }
    /* Generation stops at eos and, when given, at the end-of-turn and
     * end-of-message tokens (Llama 3 instruct's <|eot_id|>, <|eom_id|>). */
    int eot, eom;
    if (vocab_id(g, "tokenizer.ggml.bos_token_id", &c->bos_id, l->e) ||
        vocab_id(g, "tokenizer.ggml.eos_token_id", &c->eos_id, l->e) ||
        vocab_id(g, "tokenizer.ggml.eot_token_id", &eot, l->e) ||
        vocab_id(g, "tokenizer.ggml.eom_token_id", &eom, l->e))
        return -1;
    int stops[3] = {c->eos_id, eot, eom};
    for (int i = 0; i < 3; i++) {
        bool seen = stops[i] < 0;
        for (int j = 0; j < c->n_eos; j++)
            seen |= c->eos_ids[j] == stops[i];
        if (!seen)
            c->eos_ids[c->n_eos++] = stops[i];
    }
    if (c->eos_id < 0 && c->n_eos > 0)
        c->eos_id = c->eos_ids[0];
    /* The key_length / value_length / rope.dimension_count consistency is
     * checked after model_config_finish derived head_dim. */
    if (value_len && c->head_dim && value_len != c->head_dim)
        return err_set(l->e, "%s: attention.value_length %d differs from key_length %d (not "
                             "supported)",
                       g->name, value_len, c->head_dim);
    *rope_dims_out = rope_dims;
    return 0;
}

/* Which struct tensor a GGUF tensor name fills; NULL for unknown names. */
static struct tensor *ld_slot(struct model *m, const char *name, int *is_vec, int *layer)
{
    *is_vec = 0;
    *layer = -1;
    if (!strcmp(name, "token_embd.weight"))
        return &m->tok_embd;
    if (!strcmp(name, "output.weight"))
        return &m->lm_head;
    if (!strcmp(name, "output_norm.weight")) {
        *is_vec = 1;
        return &m->out_norm;
    }
    int l, used = 0;
    if (sscanf(name, "blk.%d.%n", &l, &used) != 1 || used == 0 || l < 0)
        return NULL;
    char canon[32]; /* "blk.03." or "blk.+3." must not alias "blk.3." */
    if (snprintf(canon, sizeof canon, "blk.%d.", l) != used || strncmp(canon, name, (size_t)used))
        return NULL;
    *layer = l;
    if (l >= m->cfg.n_layers)
        return NULL;
    struct layer_weights *w = &m->layers[l];
    static const struct {
        const char *suffix;
        size_t off;
        int vec;
    } table[] = {
        {"attn_norm.weight", offsetof(struct layer_weights, attn_norm), 1},
        {"attn_q.weight", offsetof(struct layer_weights, wq), 0},
        {"attn_k.weight", offsetof(struct layer_weights, wk), 0},
        {"attn_v.weight", offsetof(struct layer_weights, wv), 0},
        {"attn_output.weight", offsetof(struct layer_weights, wo), 0},
        {"attn_q.bias", offsetof(struct layer_weights, bq), 1},
        {"attn_k.bias", offsetof(struct layer_weights, bk), 1},
        {"attn_v.bias", offsetof(struct layer_weights, bv), 1},
        {"attn_q_norm.weight", offsetof(struct layer_weights, q_norm), 1},
        {"attn_k_norm.weight", offsetof(struct layer_weights, k_norm), 1},
        {"ffn_norm.weight", offsetof(struct layer_weights, ffn_norm), 1},
        {"ffn_gate.weight", offsetof(struct layer_weights, w_gate), 0},
        {"ffn_up.weight", offsetof(struct layer_weights, w_up), 0},
        {"ffn_down.weight", offsetof(struct layer_weights, w_down), 0},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (!strcmp(name + used, table[i].suffix)) {
            *is_vec = table[i].vec;
            return (struct tensor *)((char *)w + table[i].off);
        }
    }
    return NULL;
}

/* Llama 3.1's rope scaling as llama.cpp stores it: rope_freqs.weight, one
 * f32 divisor for each of the head's head_dim / 2 frequencies. Copied into
 * the model (the file's data section need not be 4-byte aligned). */
static int ld_rope_freqs(struct model *m, const struct gguf_file *g, struct err *e)
{
    const struct gguf_tensor *t = gguf_find_tensor(g, "rope_freqs.weight");
    if (!t)
        return 0;
    struct model_config *c = &m->cfg;
    const uint64_t half = (uint64_t)c->head_dim / 2;
    if (t->type != GGUF_TENSOR_F32 || t->ne[0] != half || t->ne[1] != 1 || t->ne[2] != 1 ||
        t->ne[3] != 1)
        return err_set(e, "%s: rope_freqs.weight is %s [%llu x %llu], expected F32 [%llu] (head_dim "
                          "%d / 2)",
                       g->name, gguf_ttype_name(t->type), (unsigned long long)t->ne[0],
                       (unsigned long long)t->ne[1], (unsigned long long)half, c->head_dim);
    if (c->rope_scaling != ROPE_SCALING_NONE)
        return err_set(e, "%s: rope_freqs.weight beside rope.scaling.type: one rope scaling at a "
                          "time", g->name);
    float *f = model_own_alloc(m, sizeof(float) * half, e);
    if (!f)
        return -1;
    memcpy(f, t->data, sizeof(float) * half);
    for (uint64_t i = 0; i < half; i++)
        if (!(f[i] > 0) || !isfinite(f[i]))
            return err_set(e, "%s: rope_freqs.weight[%llu] = %g: a frequency's divisor must be a "
                              "positive number", g->name, (unsigned long long)i, f[i]);
    c->rope_scaling = ROPE_SCALING_FREQS;
    c->rope_freqs = f;
    return 0;
}

static int ld_tensor(struct model *m, const struct gguf_file *g, const struct gguf_tensor *gt,
                     struct err *e)
{
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)gt->name.len, gt->name.ptr);
    int is_vec, layer;
    if (!strcmp(name, "rope_freqs.weight")) /* read by ld_rope_freqs */
        return 0;
    struct tensor *slot = ld_slot(m, name, &is_vec, &layer);
    if (!slot) {
        if (layer >= m->cfg.n_layers)
            return err_set(e, "%s: tensor '%s' belongs to layer %d but block_count is %d",
                           g->name, name, layer, m->cfg.n_layers);
        return err_set(e, "%s: unexpected tensor '%s' for architecture %s", g->name, name,
                       m->cfg.arch);
    }
    if (tensor_present(slot))
        return err_set(e, "%s: tensor '%s' is given twice", g->name, name);
    struct tensor t = {0};
    if (gguf_ttype_to_dtype(gt->type, &t.dtype))
        return err_set(e, "%s: tensor '%s' has type %s (%u), which is not supported (supported: "
                          "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, "
                          "Q6_K)",
                       g->name, name, gguf_ttype_name(gt->type), gt->type);
    if (gt->ne[2] != 1 || gt->ne[3] != 1)
        return err_set(e, "%s: tensor '%s' has %u dimensions, expected 1 or 2", g->name, name,
                       gt->n_dims);
    t.cols = (int64_t)gt->ne[0];
    t.rows = (int64_t)gt->ne[1];
    t.data = gt->data;
    /* The data section is aligned within the (page-aligned) map, but a file
     * with general.alignment 1 or 2 could still misalign f32/f16 elements. */
    size_t need = t.dtype == DT_F32 ? 4 : 2;
    if ((uintptr_t)t.data % need)
        return err_set(e, "%s: tensor '%s' data is not %zu-byte aligned", g->name, name, need);
    *slot = t;
    if (is_vec && model_vec_to_f32(m, slot, e))
        return err_wrap(e, "%s: tensor '%s'", g->name, name);
    return 0;
}

int model_load_gguf(struct model *m, const char *file, struct err *e)
{
    struct gguf_file g;
    if (gguf_open(&g, file, e))
        return -1;
    /* The model owns the mapping from here on; gguf_close frees the index. */
    if (model_own_map(m, g.map, g.map_len, e)) {
        gguf_close(&g);
        return -1;
    }
    g.map = NULL;
    snprintf(m->format, sizeof m->format, "gguf");
    int rc = -1;
    struct ld l = {&g, NULL, e};
    struct model_config *c = &m->cfg;
    memset(c, 0, sizeof *c);
    int rope_dims = 0;
    if (ld_config(&l, c, &rope_dims))
        goto out;
    const struct gguf_tensor *emb = gguf_find_tensor(&g, "token_embd.weight");
    if (!emb) {
        rc = err_set(e, "%s: tensor token_embd.weight missing", g.name);
        goto out;
    }
    if (emb->ne[1] > INT32_MAX) {
        rc = err_set(e, "%s: token_embd.weight has %llu rows", g.name,
                     (unsigned long long)emb->ne[1]);
        goto out;
    }
    c->vocab_size = (int)emb->ne[1];
    if (model_config_finish(c, g.name, e))
        goto out;
    if (rope_dims && rope_dims != c->head_dim) {
        rc = err_set(e, "%s: rope.dimension_count %d differs from head_dim %d (partial rotary "
                        "embeddings are not supported)",
                     g.name, rope_dims, c->head_dim);
        goto out;
    }
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        rc = err_set(e, "%s: out of memory", g.name);
        goto out;
    }
    for (uint64_t i = 0; i < g.n_tensors; i++)
        if (ld_tensor(m, &g, &g.tensors[i], e))
            goto out;
    if (ld_rope_freqs(m, &g, e))
        goto out;
    if (!tensor_present(&m->lm_head)) {
        m->lm_head = m->tok_embd;
        c->tied_embeddings = true;
    }
    for (int i = 0; i < c->n_layers; i++) {
        if (tensor_present(&m->layers[i].bq) || tensor_present(&m->layers[i].bk) ||
            tensor_present(&m->layers[i].bv))
            c->qkv_bias = true;
        if (tensor_present(&m->layers[i].q_norm) || tensor_present(&m->layers[i].k_norm))
            c->qk_norm = true;
    }
    rc = 0;
out:
    gguf_close(&g);
    return rc;
}
