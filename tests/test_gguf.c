/* test_gguf.c - GGUF reader and writer: every metadata and tensor type
 * round-trips; truncated and corrupted files fail with a message (run under
 * ASan: never a crash); llama.cpp's vocab-only files parse; whole models
 * survive model -> GGUF -> model, including the llama q/k permutation. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/half.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/quant.h"
#include "testutil.h"

static char tmpdir[64];

static const char *tmp_path(const char *name)
{
    static char buf[8][256];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    return p;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static float frand(void) /* uniform in [-1, 1) */
{
    return (float)((double)(rng() >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

/* ---- a file with every metadata type and every tensor type ---- */

/* Little byte builder for hand-encoded (nested) values. */
struct bb {
    uint8_t b[4096];
    size_t n;
};

static void bb_put(struct bb *b, const void *p, size_t n)
{
    memcpy(b->b + b->n, p, n);
    b->n += n;
}

static void bb_u32(struct bb *b, uint32_t v) { bb_put(b, &v, 4); }
static void bb_u64(struct bb *b, uint64_t v) { bb_put(b, &v, 8); }

static void bb_str(struct bb *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}

static float t_f32[5 * 3], t_f16[4], t_bf16[3 * 2], t_q8[2 * 64];
static uint8_t t_q4k[144];

static int write_all_types(const char *path, size_t alignment)
{
    struct err e = {{0}};
    struct gguf_writer *w = gguf_writer_new(&e);
    int rc = 0;
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    uint32_t u32 = 4000000000u;
    int32_t i32 = -2000000000;
    float f32 = 1.5f;
    uint8_t bt = 1;
    uint64_t u64 = (1ull << 40) + 3;
    int64_t i64 = -(1ll << 40);
    double f64 = 3.14159265358979;
    uint64_t al = alignment;
    rc |= gguf_writer_kv_scalar(w, "general.alignment", GGUF_VT_UINT64, &al, &e);
    rc |= gguf_writer_kv_scalar(w, "t.u8", GGUF_VT_UINT8, &u8, &e);
    rc |= gguf_writer_kv_scalar(w, "t.i8", GGUF_VT_INT8, &i8, &e);
    rc |= gguf_writer_kv_scalar(w, "t.u16", GGUF_VT_UINT16, &u16, &e);
    rc |= gguf_writer_kv_scalar(w, "t.i16", GGUF_VT_INT16, &i16, &e);
    rc |= gguf_writer_kv_scalar(w, "t.u32", GGUF_VT_UINT32, &u32, &e);
    rc |= gguf_writer_kv_scalar(w, "t.i32", GGUF_VT_INT32, &i32, &e);
    rc |= gguf_writer_kv_scalar(w, "t.f32", GGUF_VT_FLOAT32, &f32, &e);
    rc |= gguf_writer_kv_scalar(w, "t.bool", GGUF_VT_BOOL, &bt, &e);
    rc |= gguf_writer_kv_scalar(w, "t.u64", GGUF_VT_UINT64, &u64, &e);
    rc |= gguf_writer_kv_scalar(w, "t.i64", GGUF_VT_INT64, &i64, &e);
    rc |= gguf_writer_kv_scalar(w, "t.f64", GGUF_VT_FLOAT64, &f64, &e);
    rc |= gguf_writer_kv_str(w, "t.str", "h\xc3\xa9llo", &e);
    rc |= gguf_writer_kv_str(w, "t.empty_str", "", &e);
    rc |= gguf_writer_kv_bool(w, "t.false", false, &e);

    const uint8_t a_u8[3] = {1, 2, 255};
    const int8_t a_i8[2] = {-1, 127};
    const uint16_t a_u16[2] = {7, 65535};
    const int16_t a_i16[2] = {-7, 32767};
    const uint32_t a_u32[4] = {0, 1, 2, 4294967295u};
    const int32_t a_i32[3] = {-1, 0, 1};
    const float a_f32[2] = {0.25f, -2.0f};
    const uint8_t a_bool[3] = {1, 0, 1};
    const uint64_t a_u64[2] = {0, UINT64_MAX};
    const int64_t a_i64[2] = {INT64_MIN, INT64_MAX};
    const double a_f64[2] = {1e300, -1e-300};
    rc |= gguf_writer_kv_arr(w, "a.u8", GGUF_VT_UINT8, a_u8, 3, &e);
    rc |= gguf_writer_kv_arr(w, "a.i8", GGUF_VT_INT8, a_i8, 2, &e);
    rc |= gguf_writer_kv_arr(w, "a.u16", GGUF_VT_UINT16, a_u16, 2, &e);
    rc |= gguf_writer_kv_arr(w, "a.i16", GGUF_VT_INT16, a_i16, 2, &e);
    rc |= gguf_writer_kv_arr(w, "a.u32", GGUF_VT_UINT32, a_u32, 4, &e);
    rc |= gguf_writer_kv_arr(w, "a.i32", GGUF_VT_INT32, a_i32, 3, &e);
    rc |= gguf_writer_kv_arr(w, "a.f32", GGUF_VT_FLOAT32, a_f32, 2, &e);
    rc |= gguf_writer_kv_arr(w, "a.bool", GGUF_VT_BOOL, a_bool, 3, &e);
    rc |= gguf_writer_kv_arr(w, "a.u64", GGUF_VT_UINT64, a_u64, 2, &e);
    rc |= gguf_writer_kv_arr(w, "a.i64", GGUF_VT_INT64, a_i64, 2, &e);
    rc |= gguf_writer_kv_arr(w, "a.f64", GGUF_VT_FLOAT64, a_f64, 2, &e);
    rc |= gguf_writer_kv_arr(w, "a.empty", GGUF_VT_INT32, NULL, 0, &e);
    const char *strs[3] = {"a", "", "ccc"};
    rc |= gguf_writer_kv_arr_str(w, "a.str", strs, 3, &e);

    /* [[1, 2], [3]] of u32 */
    struct bb b = {.n = 0};
    bb_u32(&b, GGUF_VT_ARRAY);
    bb_u64(&b, 2);
    bb_u32(&b, GGUF_VT_UINT32);
    bb_u64(&b, 2);
    bb_u32(&b, 1);
    bb_u32(&b, 2);
    bb_u32(&b, GGUF_VT_UINT32);
    bb_u64(&b, 1);
    bb_u32(&b, 3);
    rc |= gguf_writer_kv_raw(w, "n.u32", GGUF_VT_ARRAY, b.b, b.n, &e);
    /* [["x", "yz"], [], [[ "deep" ]]] : strings, empty, one more level */
    b.n = 0;
    bb_u32(&b, GGUF_VT_ARRAY);
    bb_u64(&b, 3);
    bb_u32(&b, GGUF_VT_STRING);
    bb_u64(&b, 2);
    bb_str(&b, "x");
    bb_str(&b, "yz");
    bb_u32(&b, GGUF_VT_STRING);
    bb_u64(&b, 0);
    bb_u32(&b, GGUF_VT_ARRAY);
    bb_u64(&b, 1);
    bb_u32(&b, GGUF_VT_STRING);
    bb_u64(&b, 1);
    bb_str(&b, "deep");
    rc |= gguf_writer_kv_raw(w, "n.str", GGUF_VT_ARRAY, b.b, b.n, &e);

    for (int i = 0; i < 15; i++)
        t_f32[i] = frand();
    for (int i = 0; i < 4; i++)
        t_f16[i] = f16_to_f32(f32_to_f16(frand()));
    for (int i = 0; i < 6; i++)
        t_bf16[i] = bf16_to_f32(f32_to_bf16(frand()));
    for (int i = 0; i < 128; i++)
        t_q8[i] = frand();
    for (int i = 0; i < 144; i++)
        t_q4k[i] = (uint8_t)rng();
    uint64_t ne_f32[2] = {5, 3}, ne_f16[1] = {4}, ne_bf16[2] = {3, 2}, ne_q8[2] = {64, 2},
             ne_q4k[1] = {256}, ne_3d[3] = {2, 2, 2};
    rc |= gguf_writer_add_tensor(w, "f32", GGUF_TENSOR_F32, 2, ne_f32, &e);
    rc |= gguf_writer_add_tensor(w, "f16", GGUF_TENSOR_F16, 1, ne_f16, &e);
    rc |= gguf_writer_add_tensor(w, "bf16", GGUF_TENSOR_BF16, 2, ne_bf16, &e);
    rc |= gguf_writer_add_tensor(w, "q8_0", GGUF_TENSOR_Q8_0, 2, ne_q8, &e);
    rc |= gguf_writer_add_tensor(w, "q4_k", GGUF_TENSOR_Q4_K, 1, ne_q4k, &e);
    rc |= gguf_writer_add_tensor(w, "three.d", GGUF_TENSOR_F32, 3, ne_3d, &e);
    rc |= gguf_writer_open(w, path, &e);
    uint16_t h[6];
    struct block_q8_0 q[4];
    rc |= gguf_writer_data(w, t_f32, sizeof t_f32, &e);
    gguf_encode_row(DT_F16, t_f16, h, 4);
    rc |= gguf_writer_data(w, h, 8, &e);
    gguf_encode_row(DT_BF16, t_bf16, h, 6);
    rc |= gguf_writer_data(w, h, 12, &e);
    gguf_encode_row(DT_Q8_0, t_q8, q, 128);
    /* streamed in odd-sized chunks on purpose */
    rc |= gguf_writer_data(w, q, 5, &e);
    rc |= gguf_writer_data(w, (uint8_t *)q + 5, sizeof q - 5, &e);
    rc |= gguf_writer_data(w, t_q4k, sizeof t_q4k, &e);
    rc |= gguf_writer_data(w, t_f32, 8 * sizeof(float), &e);
    rc |= gguf_writer_close(w, &e);
    if (rc)
        fprintf(stderr, "write_all_types: %s\n", e.msg);
    gguf_writer_free(w);
    return rc;
}

static const struct gguf_value *kv(const struct gguf_file *g, const char *key)
{
    const struct gguf_kv *k = gguf_find_kv(g, key);
    return k ? &k->val : NULL;
}

static void check_all_types(const char *path, size_t alignment)
{
    struct gguf_file g;
    struct err e = {{0}};
    int rc = gguf_open(&g, path, &e);
    CHECK(rc == 0, "open %s: %s", path, e.msg);
    if (rc)
        return;
    CHECK(g.version == 3, "version %u", g.version);
    CHECK(g.alignment == alignment, "alignment %zu", g.alignment);
    CHECK(g.n_kv == 30, "n_kv %llu", (unsigned long long)g.n_kv);
    CHECK(g.n_tensors == 6, "n_tensors %llu", (unsigned long long)g.n_tensors);
    const struct gguf_value *v;
    int64_t iv;
    double fv;
    CHECK((v = kv(&g, "t.u8")) && v->type == GGUF_VT_UINT8 && v->v.u == 200, "u8");
    CHECK((v = kv(&g, "t.i8")) && v->type == GGUF_VT_INT8 && v->v.i == -100, "i8");
    CHECK((v = kv(&g, "t.u16")) && v->type == GGUF_VT_UINT16 && v->v.u == 60000, "u16");
    CHECK((v = kv(&g, "t.i16")) && v->type == GGUF_VT_INT16 && v->v.i == -30000, "i16");
    CHECK((v = kv(&g, "t.u32")) && v->type == GGUF_VT_UINT32 && v->v.u == 4000000000u, "u32");
    CHECK((v = kv(&g, "t.i32")) && v->type == GGUF_VT_INT32 && v->v.i == -2000000000, "i32");
    CHECK((v = kv(&g, "t.f32")) && v->type == GGUF_VT_FLOAT32 && v->v.f == 1.5, "f32");
    CHECK((v = kv(&g, "t.bool")) && v->type == GGUF_VT_BOOL && v->v.u == 1, "bool");
    CHECK((v = kv(&g, "t.false")) && v->type == GGUF_VT_BOOL && v->v.u == 0, "bool false");
    CHECK((v = kv(&g, "t.u64")) && v->type == GGUF_VT_UINT64 && v->v.u == (1ull << 40) + 3, "u64");
    CHECK((v = kv(&g, "t.i64")) && v->type == GGUF_VT_INT64 && v->v.i == -(1ll << 40), "i64");
    CHECK((v = kv(&g, "t.f64")) && v->type == GGUF_VT_FLOAT64 && v->v.f == 3.14159265358979,
          "f64");
    CHECK((v = kv(&g, "t.str")) && v->type == GGUF_VT_STRING && gguf_str_eq(v->v.s, "h\xc3\xa9llo"),
          "str");
    CHECK((v = kv(&g, "t.empty_str")) && v->type == GGUF_VT_STRING && v->v.s.len == 0, "empty");
    CHECK(gguf_value_int(kv(&g, "t.u32"), &iv) == 0 && iv == 4000000000ll, "int view of u32");
    CHECK(gguf_value_int(kv(&g, "t.i8"), &iv) == 0 && iv == -100, "int view of i8");
    CHECK(gguf_value_int(kv(&g, "t.str"), &iv) == -1, "int view of a string fails");
    CHECK(gguf_value_float(kv(&g, "t.f32"), &fv) == 0 && fv == 1.5, "float view");
    CHECK(gguf_value_float(kv(&g, "t.i16"), &fv) == 0 && fv == -30000, "float view of int");
    CHECK(gguf_find_kv(&g, "nope") == NULL && gguf_find_kv(&g, "t.u") == NULL, "absent keys");

    struct gguf_arr_iter it;
    struct gguf_value x;
    int n;
    /* numeric arrays: element values through the iterator */
    v = kv(&g, "a.u8");
    CHECK(v && v->type == GGUF_VT_ARRAY && v->v.arr.type == GGUF_VT_UINT8 && v->v.arr.n == 3,
          "a.u8");
    uint64_t want_u8[3] = {1, 2, 255};
    gguf_arr_iter_init(&it, v);
    for (n = 0; gguf_arr_next(&it, &x); n++)
        CHECK(x.type == GGUF_VT_UINT8 && x.v.u == want_u8[n], "a.u8[%d]", n);
    CHECK(n == 3, "a.u8 count %d", n);
    gguf_arr_iter_init(&it, kv(&g, "a.i64"));
    CHECK(gguf_arr_next(&it, &x) && x.v.i == INT64_MIN, "a.i64[0]");
    CHECK(gguf_arr_next(&it, &x) && x.v.i == INT64_MAX, "a.i64[1]");
    CHECK(!gguf_arr_next(&it, &x), "a.i64 end");
    gguf_arr_iter_init(&it, kv(&g, "a.u64"));
    CHECK(gguf_arr_next(&it, &x) && gguf_arr_next(&it, &x) && x.v.u == UINT64_MAX, "a.u64");
    CHECK(gguf_value_int(&x, &iv) == -1, "u64 max has no int64 view");
    gguf_arr_iter_init(&it, kv(&g, "a.f64"));
    CHECK(gguf_arr_next(&it, &x) && x.v.f == 1e300, "a.f64");
    gguf_arr_iter_init(&it, kv(&g, "a.f32"));
    CHECK(gguf_arr_next(&it, &x) && x.v.f == 0.25 && gguf_arr_next(&it, &x) && x.v.f == -2.0,
          "a.f32");
    gguf_arr_iter_init(&it, kv(&g, "a.i16"));
    CHECK(gguf_arr_next(&it, &x) && x.v.i == -7, "a.i16");
    gguf_arr_iter_init(&it, kv(&g, "a.u16"));
    CHECK(gguf_arr_next(&it, &x) && gguf_arr_next(&it, &x) && x.v.u == 65535, "a.u16");
    gguf_arr_iter_init(&it, kv(&g, "a.i8"));
    CHECK(gguf_arr_next(&it, &x) && x.v.i == -1, "a.i8");
    gguf_arr_iter_init(&it, kv(&g, "a.u32"));
    for (n = 0; gguf_arr_next(&it, &x); n++)
        ;
    CHECK(n == 4 && x.v.u == 4294967295u, "a.u32");
    gguf_arr_iter_init(&it, kv(&g, "a.i32"));
    CHECK(gguf_arr_next(&it, &x) && x.v.i == -1, "a.i32");
    gguf_arr_iter_init(&it, kv(&g, "a.bool"));
    CHECK(gguf_arr_next(&it, &x) && x.v.u == 1 && gguf_arr_next(&it, &x) && x.v.u == 0, "a.bool");
    v = kv(&g, "a.empty");
    CHECK(v && v->v.arr.n == 0 && v->v.arr.type == GGUF_VT_INT32, "empty array");
    gguf_arr_iter_init(&it, v);
    CHECK(!gguf_arr_next(&it, &x), "empty array iterates nothing");
    const char *want_s[3] = {"a", "", "ccc"};
    gguf_arr_iter_init(&it, kv(&g, "a.str"));
    for (n = 0; gguf_arr_next(&it, &x); n++)
        CHECK(x.type == GGUF_VT_STRING && gguf_str_eq(x.v.s, want_s[n]), "a.str[%d]", n);
    CHECK(n == 3, "a.str count");

    /* nested arrays */
    gguf_arr_iter_init(&it, kv(&g, "n.u32"));
    struct gguf_arr_iter in;
    uint32_t got[3], k = 0;
    for (n = 0; gguf_arr_next(&it, &x); n++) {
        CHECK(x.type == GGUF_VT_ARRAY && x.v.arr.type == GGUF_VT_UINT32, "n.u32 inner");
        struct gguf_value y;
        gguf_arr_iter_init(&in, &x);
        while (gguf_arr_next(&in, &y) && k < 3)
            got[k++] = (uint32_t)y.v.u;
    }
    CHECK(n == 2 && k == 3 && got[0] == 1 && got[1] == 2 && got[2] == 3, "n.u32 values");
    gguf_arr_iter_init(&it, kv(&g, "n.str"));
    struct gguf_value a0, a1, a2, y, z;
    CHECK(gguf_arr_next(&it, &a0) && gguf_arr_next(&it, &a1) && gguf_arr_next(&it, &a2) &&
              !gguf_arr_next(&it, &x),
          "n.str has 3 elements");
    gguf_arr_iter_init(&in, &a0);
    CHECK(gguf_arr_next(&in, &y) && gguf_str_eq(y.v.s, "x") && gguf_arr_next(&in, &y) &&
              gguf_str_eq(y.v.s, "yz"),
          "n.str[0]");
    CHECK(a1.v.arr.n == 0 && a1.v.arr.type == GGUF_VT_STRING, "n.str[1] empty");
    gguf_arr_iter_init(&in, &a2);
    CHECK(gguf_arr_next(&in, &y) && y.type == GGUF_VT_ARRAY, "n.str[2] nested");
    struct gguf_arr_iter in2;
    gguf_arr_iter_init(&in2, &y);
    CHECK(gguf_arr_next(&in2, &z) && gguf_str_eq(z.v.s, "deep"), "n.str[2][0][0]");

    /* tensors */
    const struct gguf_tensor *t;
    t = gguf_find_tensor(&g, "f32");
    CHECK(t && t->type == GGUF_TENSOR_F32 && t->n_dims == 2 && t->ne[0] == 5 && t->ne[1] == 3 &&
              t->nbytes == 60 && !memcmp(t->data, t_f32, 60),
          "f32 tensor");
    for (uint64_t i = 0; i < g.n_tensors; i++)
        CHECK(((size_t)((const uint8_t *)g.tensors[i].data - g.base) - g.data_offset) %
                      alignment == 0,
              "tensor %llu aligned", (unsigned long long)i);
    CHECK(g.data_offset % alignment == 0, "data section aligned");
    float buf[128];
    t = gguf_find_tensor(&g, "f16");
    CHECK(t && t->type == GGUF_TENSOR_F16 && t->n_dims == 1 && t->ne[0] == 4 && t->ne[1] == 1,
          "f16 tensor");
    if (t) {
        gguf_decode_row(DT_F16, t->data, buf, 4);
        CHECK(!memcmp(buf, t_f16, 16), "f16 values");
    }
    t = gguf_find_tensor(&g, "bf16");
    CHECK(t && t->type == GGUF_TENSOR_BF16 && t->ne[0] == 3 && t->ne[1] == 2, "bf16 tensor");
    if (t) {
        gguf_decode_row(DT_BF16, t->data, buf, 6);
        CHECK(!memcmp(buf, t_bf16, 24), "bf16 values");
    }
    t = gguf_find_tensor(&g, "q8_0");
    CHECK(t && t->type == GGUF_TENSOR_Q8_0 && t->ne[0] == 64 && t->ne[1] == 2 && t->nbytes == 136,
          "q8_0 tensor");
    if (t) {
        gguf_decode_row(DT_Q8_0, t->data, buf, 128);
        float maxerr = 0;
        for (int i = 0; i < 128; i++)
            maxerr = fmaxf(maxerr, fabsf(buf[i] - t_q8[i]));
        CHECK(maxerr <= 0.6f / 127, "q8_0 error %g", maxerr);
    }
    t = gguf_find_tensor(&g, "q4_k");
    CHECK(t && t->type == 12 && t->nbytes == 144 && !memcmp(t->data, t_q4k, 144), "q4_k bytes");
    CHECK(!strcmp(gguf_ttype_name(12), "Q4_K") && !strcmp(gguf_ttype_name(30), "BF16") &&
              !strcmp(gguf_ttype_name(4), "unknown"),
          "type names");
    t = gguf_find_tensor(&g, "three.d");
    CHECK(t && t->n_dims == 3 && t->ne[2] == 2 && t->nbytes == 32, "3-d tensor");
    CHECK(gguf_find_tensor(&g, "f3") == NULL, "absent tensor");
    gguf_close(&g);
}

/* ---- truncation and corruption ---- */

static int parse_copy(const uint8_t *buf, size_t len, struct err *e)
{
    /* exact-size heap copy, so ASan sees any read past the end */
    uint8_t *c = malloc(len ? len : 1);
    memcpy(c, buf, len);
    struct gguf_file g;
    int rc = gguf_parse(&g, c, len, "cut.gguf", e);
    if (rc == 0) {
        /* touch everything the parser vouched for */
        unsigned sum = 0;
        for (uint64_t i = 0; i < g.n_tensors; i++)
            for (uint64_t j = 0; j < g.tensors[i].nbytes; j++)
                sum += ((const uint8_t *)g.tensors[i].data)[j];
        for (uint64_t i = 0; i < g.n_kv; i++) {
            struct gguf_arr_iter it, in;
            struct gguf_value x, y;
            gguf_arr_iter_init(&it, &g.kv[i].val);
            while (gguf_arr_next(&it, &x)) {
                if (x.type == GGUF_VT_STRING && x.v.s.len)
                    sum += (uint8_t)x.v.s.ptr[x.v.s.len - 1];
                gguf_arr_iter_init(&in, &x);
                while (gguf_arr_next(&in, &y))
                    sum++;
            }
        }
        (void)sum;
        gguf_close(&g);
    }
    free(c);
    return rc;
}

static void test_truncation(const char *path)
{
    size_t len;
    uint8_t *buf = (uint8_t *)test_read_file(path, &len);
    CHECK(buf != NULL, "read %s", path);
    if (!buf)
        return;
    struct gguf_file g;
    struct err e = {{0}};
    size_t last_end = 0;
    if (gguf_parse(&g, buf, len, path, &e) == 0) {
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            size_t end = g.data_offset + g.tensors[i].offset + g.tensors[i].nbytes;
            if (end > last_end)
                last_end = end;
        }
        gguf_close(&g);
    }
    CHECK(last_end > 0 && last_end <= len, "last tensor end %zu of %zu", last_end, len);
    int bad = 0;
    for (size_t cut = 0; cut < len; cut++) {
        e.msg[0] = 0;
        int rc = parse_copy(buf, cut, &e);
        if (cut < last_end) {
            if (rc == 0 || strncmp(e.msg, "cut.gguf: ", 10) != 0) {
                if (bad++ < 5)
                    CHECK(0, "cut at %zu of %zu: rc %d msg '%s'", cut, len, rc, e.msg);
            }
        } else if (rc != 0) {
            if (bad++ < 5)
                CHECK(0, "cut at %zu (after all tensor data) failed: %s", cut, e.msg);
        }
    }
    CHECK(bad == 0, "%d bad cut points of %zu", bad, len);
    /* a few messages, to see they say what is wrong */
    parse_copy(buf, 2, &e);
    CHECK(strstr(e.msg, "not a GGUF file"), "cut 2: %s", e.msg);
    parse_copy(buf, 10, &e);
    CHECK(strstr(e.msg, "truncated") && strstr(e.msg, "tensor count"), "cut 10: %s", e.msg);
    parse_copy(buf, last_end - 1, &e);
    CHECK(strstr(e.msg, "tensor 'three.d' extends past end of file"), "cut end-1: %s", e.msg);

    /* the same through gguf_open on real files */
    const char *tp = tmp_path("trunc.gguf");
    size_t cuts[] = {0, 3, 4, 100, len / 2, last_end - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        FILE *f = fopen(tp, "wb");
        fwrite(buf, 1, cuts[i], f);
        fclose(f);
        int rc = gguf_open(&g, tp, &e);
        CHECK(rc != 0 && strncmp(e.msg, tp, strlen(tp)) == 0, "open cut %zu: %s", cuts[i], e.msg);
        if (rc == 0)
            gguf_close(&g);
    }
    CHECK(gguf_open(&g, tmp_path("missing.gguf"), &e) != 0 && strstr(e.msg, "missing.gguf"),
          "missing file: %s", e.msg);
    CHECK(gguf_open(&g, tmpdir, &e) != 0, "directory: %s", e.msg);

    /* random mutations of the header: any outcome but a crash */
    int ok = 0;
    for (int it = 0; it < 4000; it++) {
        uint8_t *c = malloc(len);
        memcpy(c, buf, len);
        int nm = 1 + (int)(rng() % 4);
        size_t span = it % 2 ? 200 : len;
        for (int k = 0; k < nm; k++) {
            size_t pos = (size_t)(rng() % (span < len ? span : len));
            c[pos] = (uint8_t)(rng() % 3 == 0 ? 0xff : rng());
        }
        ok += parse_copy(c, len, &e) == 0;
        free(c);
    }
    CHECK(ok < 4000, "mutations: %d of 4000 still parse", ok);
    free(buf);
}

/* A small hand-checked file: KV "a" (u32) and KV "b" (u32), tensors "t" and
 * "u" (F32, 8 elements each). Field offsets:
 *   0 magic, 4 version, 8 n_tensors, 16 n_kv,
 *   24 keylen 32 'a' 33 type 37 value | 41 keylen 49 'b' 50 type 54 value
 *   58 namelen 66 't' 67 n_dims 71 ne0 79 type 83 offset
 *   91 namelen 99 'u' 100 n_dims 104 ne0 112 type 116 offset | 124 end of infos
 *   data at 128 (t) and 160 (u), file size 192. */
static uint8_t small[192];

static void make_small(void)
{
    struct bb b = {.n = 0};
    bb_put(&b, "GGUF", 4);
    bb_u32(&b, 3);
    bb_u64(&b, 2);
    bb_u64(&b, 2);
    bb_str(&b, "a");
    bb_u32(&b, GGUF_VT_UINT32);
    bb_u32(&b, 7);
    bb_str(&b, "b");
    bb_u32(&b, GGUF_VT_UINT32);
    bb_u32(&b, 8);
    bb_str(&b, "t");
    bb_u32(&b, 1);
    bb_u64(&b, 8);
    bb_u32(&b, GGUF_TENSOR_F32);
    bb_u64(&b, 0);
    bb_str(&b, "u");
    bb_u32(&b, 1);
    bb_u64(&b, 8);
    bb_u32(&b, GGUF_TENSOR_F32);
    bb_u64(&b, 32);
    memset(small, 0, sizeof small);
    memcpy(small, b.b, b.n);
}

static void patch32(uint8_t *p, size_t off, uint32_t v) { memcpy(p + off, &v, 4); }
static void patch64(uint8_t *p, size_t off, uint64_t v) { memcpy(p + off, &v, 8); }

/* Applies one patch to a copy of `small` and expects an error containing want. */
static void expect_bad(const char *what, size_t off, int width, uint64_t val, const char *want)
{
    uint8_t c[sizeof small];
    memcpy(c, small, sizeof c);
    if (width == 1)
        c[off] = (uint8_t)val;
    else if (width == 4)
        patch32(c, off, (uint32_t)val);
    else
        patch64(c, off, val);
    struct err e = {{0}};
    int rc = parse_copy(c, sizeof c, &e);
    CHECK(rc != 0 && strstr(e.msg, want) && !strncmp(e.msg, "cut.gguf: ", 10),
          "%s: rc %d, message '%s' should contain '%s'", what, rc, e.msg, want);
}

static void test_corruption(void)
{
    make_small();
    struct err e = {{0}};
    CHECK(parse_copy(small, sizeof small, &e) == 0, "small file parses: %s", e.msg);
    expect_bad("magic", 0, 1, 'X', "not a GGUF file");
    expect_bad("version 1", 4, 4, 1, "version 1 is not supported");
    expect_bad("version 9", 4, 4, 9, "unsupported GGUF version 9");
    expect_bad("big endian", 4, 4, 0x03000000u, "big-endian");
    expect_bad("tensor count", 8, 8, 1ull << 60, "tensor count");
    expect_bad("kv count", 16, 8, UINT64_MAX, "metadata count");
    expect_bad("kv count +1", 16, 8, 3, "");
    expect_bad("key length", 24, 8, 1ull << 62, "extends past end of file");
    expect_bad("empty key", 24, 8, 0, "key of 0 bytes");
    expect_bad("value type", 33, 4, 13, "unknown value type 13");
    expect_bad("duplicate key", 49, 1, 'a', "duplicate metadata key 'a'");
    expect_bad("name length", 58, 8, 1000, "extends past end of file");
    expect_bad("n_dims 0", 67, 4, 0, "has 0 dimensions");
    expect_bad("n_dims 5", 67, 4, 5, "has 5 dimensions");
    expect_bad("ne 0", 71, 8, 0, "invalid dimension 0 = 0");
    expect_bad("ne huge", 71, 8, 1ull << 62, "impossibly large");
    expect_bad("ne big", 71, 8, 1ull << 40, "tensor 't' extends past end of file");
    expect_bad("unknown type", 79, 4, 99, "tensor 't' has unknown type 99");
    expect_bad("removed type", 79, 4, 4, "unknown type 4");
    expect_bad("q8 block", 79, 4, GGUF_TENSOR_Q8_0, "not a multiple of the block size 32");
    expect_bad("offset misaligned", 83, 8, 4, "not a multiple of the alignment 32");
    expect_bad("offset past end", 116, 8, 64, "tensor 'u' extends past end of file");
    expect_bad("offset huge", 116, 8, UINT64_MAX - 31, "tensor 'u' extends past end of file");
    expect_bad("duplicate tensor", 99, 1, 't', "duplicate tensor name 't'");

    /* general.alignment: must be a power of two integer */
    struct bb b = {.n = 0};
    bb_put(&b, "GGUF", 4);
    bb_u32(&b, 2); /* v2 is accepted too */
    bb_u64(&b, 0);
    bb_u64(&b, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, GGUF_VT_UINT32);
    bb_u32(&b, 3);
    CHECK(parse_copy(b.b, b.n, &e) != 0 && strstr(e.msg, "power of two"), "alignment 3: %s",
          e.msg);
    patch32(b.b, b.n - 4, 64);
    struct gguf_file g;
    CHECK(gguf_parse(&g, b.b, b.n, "v2.gguf", &e) == 0 && g.version == 2 && g.alignment == 64,
          "v2 with alignment 64: %s", e.msg);
    gguf_close(&g);
    patch32(b.b, b.n - 8, GGUF_VT_FLOAT32);
    CHECK(parse_copy(b.b, b.n, &e) != 0 && strstr(e.msg, "general.alignment"),
          "float alignment: %s", e.msg);

    /* bad array element type, arrays nested too deep, huge array counts */
    b.n = 0;
    bb_put(&b, "GGUF", 4);
    bb_u32(&b, 3);
    bb_u64(&b, 0);
    bb_u64(&b, 1);
    bb_str(&b, "arr");
    bb_u32(&b, GGUF_VT_ARRAY);
    size_t val = b.n;
    bb_u32(&b, 77);
    bb_u64(&b, 1);
    bb_u32(&b, 0);
    CHECK(parse_copy(b.b, b.n, &e) != 0 && strstr(e.msg, "unknown element type 77") &&
              strstr(e.msg, "'arr'"),
          "array element type: %s", e.msg);
    b.n = val;
    for (int d = 0; d < 12; d++) {
        bb_u32(&b, GGUF_VT_ARRAY);
        bb_u64(&b, 1);
    }
    bb_u32(&b, GGUF_VT_UINT8);
    bb_u64(&b, 0);
    CHECK(parse_copy(b.b, b.n, &e) != 0 && strstr(e.msg, "nested"), "deep nesting: %s", e.msg);
    b.n = val;
    bb_u32(&b, GGUF_VT_STRING);
    bb_u64(&b, 1ull << 61);
    CHECK(parse_copy(b.b, b.n, &e) != 0 && strstr(e.msg, "array of 2305843009213693952 string"),
          "huge string array: %s", e.msg);
    b.n = val;
    bb_u32(&b, GGUF_VT_FLOAT64);
    bb_u64(&b, 1ull << 61);
    CHECK(parse_copy(b.b, b.n, &e) != 0 && strstr(e.msg, "extends past end"),
          "huge f64 array: %s", e.msg);
    b.n = val;
    bb_u32(&b, GGUF_VT_ARRAY);
    bb_u64(&b, 1ull << 40);
    CHECK(parse_copy(b.b, b.n, &e) != 0 && strstr(e.msg, "extends past end"),
          "huge nested array: %s", e.msg);
}

/* ---- writer misuse ---- */

static void test_writer_errors(void)
{
    struct err e = {{0}};
    struct gguf_writer *w = gguf_writer_new(&e);
    uint64_t ne[2] = {33, 2};
    CHECK(gguf_writer_kv_u32(w, "x", 1, &e) == 0, "kv");
    CHECK(gguf_writer_kv_u32(w, "x", 2, &e) != 0 && strstr(e.msg, "duplicate"), "dup kv: %s",
          e.msg);
    CHECK(gguf_writer_add_tensor(w, "q", GGUF_TENSOR_Q8_0, 2, ne, &e) != 0 &&
              strstr(e.msg, "multiple of 32"),
          "q8 cols: %s", e.msg);
    CHECK(gguf_writer_add_tensor(w, "bad", 4, 2, ne, &e) != 0, "unknown type");
    CHECK(gguf_writer_add_tensor(w, "f", GGUF_TENSOR_F32, 2, ne, &e) == 0, "tensor");
    CHECK(gguf_writer_add_tensor(w, "f", GGUF_TENSOR_F32, 2, ne, &e) != 0, "dup tensor");
    const char *p = tmp_path("partial.gguf");
    CHECK(gguf_writer_open(w, p, &e) == 0, "open: %s", e.msg);
    float z[66] = {0};
    CHECK(gguf_writer_data(w, z, 100, &e) == 0, "partial data");
    CHECK(gguf_writer_close(w, &e) != 0 && strstr(e.msg, "tensor 'f' is missing 164 bytes"),
          "close incomplete: %s", e.msg);
    gguf_writer_free(w);
    struct stat st;
    CHECK(stat(p, &st) != 0, "incomplete file removed");
}

/* ---- llama.cpp's vocab-only files ---- */

static void test_vocab_files(void)
{
    static const struct {
        const char *name, *model, *pre;
        int n;
    } want[] = {
        {"llama-spm", "llama", "default", 32000}, {"phi-3", "llama", "default", 32064},
        {"gpt-2", "gpt2", "gpt-2", 50257},        {"deepseek-llm", "gpt2", "deepseek-llm", 102400},
        {"deepseek-coder", "gpt2", "deepseek-coder", 32256},
        {"falcon", "gpt2", "falcon", 65024},      {"mpt", "gpt2", "mpt", 50432},
        {"starcoder", "gpt2", "starcoder", 49152}, {"refact", "gpt2", "refact", 49216},
        {"bert-bge", "bert", "bert-bge", 30522},
    };
    int found = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/testdata/tokenizer-vectors/ggml-vocab-%s.gguf",
                 CLLM_SHARED_DIR, want[i].name);
        if (access(path, R_OK) != 0)
            continue;
        found++;
        struct err e = {{0}};
        struct gguf_file g;
        int rc = gguf_open(&g, path, &e);
        CHECK(rc == 0, "%s: %s", want[i].name, e.msg);
        if (rc)
            continue;
        const struct gguf_value *a = kv(&g, "general.architecture");
        CHECK(a && a->type == GGUF_VT_STRING, "%s: architecture", want[i].name);
        gguf_close(&g);

        struct gguf_vocab v;
        rc = gguf_read_vocab(path, &v, &e);
        CHECK(rc == 0, "%s vocab: %s", want[i].name, e.msg);
        if (rc)
            continue;
        CHECK(!strcmp(v.model, want[i].model), "%s: model %s", want[i].name, v.model);
        CHECK(!strcmp(v.pre, want[i].pre), "%s: pre '%s'", want[i].name, v.pre);
        CHECK(v.n_tokens == want[i].n, "%s: %d tokens, want %d", want[i].name, v.n_tokens,
              want[i].n);
        CHECK(v.token_type != NULL, "%s: token types", want[i].name);
        int lens_ok = 1;
        for (int t = 0; t < v.n_tokens; t++)
            lens_ok &= strlen(v.tokens[t]) <= v.token_len[t];
        CHECK(lens_ok, "%s: token lengths", want[i].name);
        if (!strcmp(want[i].model, "llama")) {
            CHECK(v.scores != NULL, "%s: scores", want[i].name);
            CHECK(!strcmp(v.tokens[0], "<unk>") && !strcmp(v.tokens[1], "<s>") &&
                      !strcmp(v.tokens[2], "</s>"),
                  "%s: special tokens", want[i].name);
            CHECK(v.bos_id == 1 && v.eos_id == (!strcmp(want[i].name, "phi-3") ? 32000 : 2),
                  "%s: bos %d eos %d", want[i].name, v.bos_id, v.eos_id);
            CHECK(v.token_type[1] == 3 && v.token_type[3] == 6 && !strcmp(v.tokens[3], "<0x00>"),
                  "%s: control/byte token types", want[i].name);
        }
        if (!strcmp(want[i].model, "gpt2"))
            CHECK(v.n_merges > 1000 && v.merges && strchr(v.merges[0], ' '),
                  "%s: %d merges", want[i].name, v.n_merges);
        if (!strcmp(want[i].name, "gpt-2"))
            CHECK(!strcmp(v.tokens[0], "!") && v.bos_id == 50256 && v.eos_id == 50256,
                  "gpt-2 tokens: '%s' bos %d", v.tokens[0], v.bos_id);
        gguf_vocab_free(&v);
    }
    CHECK(found >= 5, "only %d vocab files found under %s", found, CLLM_SHARED_DIR);
    struct err e = {{0}};
    struct gguf_vocab v;
    const char *p = tmp_path("all.gguf");
    CHECK(gguf_read_vocab(p, &v, &e) != 0 && strstr(e.msg, "tokenizer.ggml.model"),
          "no vocab: %s", e.msg);
}

/* Cuts and byte flips in a real vocab file (long string arrays): parse and
 * vocab extraction fail cleanly or succeed, never crash. */
static void test_vocab_fuzz(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/testdata/tokenizer-vectors/ggml-vocab-llama-spm.gguf",
             CLLM_SHARED_DIR);
    size_t len;
    uint8_t *buf = (uint8_t *)test_read_file(path, &len);
    if (!buf)
        return;
    int parsed = 0, failed_msg = 0;
    for (int it = 0; it < 400; it++) {
        size_t n = len;
        uint8_t *c = malloc(len);
        memcpy(c, buf, len);
        if (it % 2 == 0) {
            n = (size_t)(rng() % len);
        } else {
            for (int k = 0; k < 3; k++) /* mostly in the first 64 KB: headers, lengths */
                c[rng() % (k == 0 ? len : 65536)] = (uint8_t)rng();
        }
        uint8_t *d = malloc(n ? n : 1);
        memcpy(d, c, n);
        free(c);
        struct gguf_file g;
        struct err e = {{0}};
        if (gguf_parse(&g, d, n, "fuzz.gguf", &e) == 0) {
            struct gguf_vocab v;
            if (gguf_vocab_from_file(&g, &v, &e) == 0) {
                unsigned sum = 0;
                for (int t = 0; t < v.n_tokens; t++)
                    sum += v.token_len[t] ? (uint8_t)v.tokens[t][v.token_len[t] - 1] : 0;
                (void)sum;
                gguf_vocab_free(&v);
            }
            gguf_close(&g);
            parsed++;
        } else {
            failed_msg += strncmp(e.msg, "fuzz.gguf: ", 11) != 0;
        }
        free(d);
    }
    CHECK(failed_msg == 0, "%d failures without a file-named message", failed_msg);
    CHECK(parsed < 400, "fuzz: %d of 400 parsed", parsed);
    free(buf);
}

/* ---- whole models ---- */

static size_t row_bytes(const struct tensor *t) { return dtype_row_bytes(t->dtype, t->cols); }

static void get_row(const struct tensor *t, int64_t r, float *out)
{
    gguf_decode_row(t->dtype, (const uint8_t *)t->data + (size_t)r * row_bytes(t), out, t->cols);
}

/* Row (or element) of the source that lands at r in a llama GGUF when the
 * source is in HF order: pairs (i, i + hd/2) become (2i, 2i + 1). */
static int64_t hf_to_llama(int64_t r, int hd)
{
    int64_t h = r / hd, k = r % hd;
    return h * hd + (k % 2) * (hd / 2) + k / 2;
}

/* Compares tensor b (reloaded) with a (original): rows of b are rows
 * perm(r) of a when perm_hd > 0. Returns the worst error relative to the
 * allowed one (<= 1 passes). */
static double cmp_tensor(const struct tensor *a, const struct tensor *b, enum dtype dt,
                         int perm_hd, bool vec, const char *what)
{
    if (!tensor_present(a) && !tensor_present(b))
        return 0;
    if (!tensor_present(a) || !tensor_present(b) || a->rows != b->rows || a->cols != b->cols) {
        CHECK(0, "%s: presence/shape differs", what);
        return 1e9;
    }
    float *x = malloc((size_t)a->cols * sizeof *x), *y = malloc((size_t)a->cols * sizeof *y);
    double worst = 0;
    for (int64_t r = 0; r < a->rows; r++) {
        int64_t sr = (!vec && perm_hd) ? hf_to_llama(r, perm_hd) : r;
        get_row(a, sr, x);
        get_row(b, r, y);
        if (vec && perm_hd) {
            float *t = malloc((size_t)a->cols * sizeof *t);
            for (int64_t i = 0; i < a->cols; i++)
                t[i] = x[hf_to_llama(i, perm_hd)];
            memcpy(x, t, (size_t)a->cols * sizeof *t);
            free(t);
        }
        enum dtype out = vec ? DT_F32 : dt;
        if (out == DT_Q8_0 && a->cols % 32)
            out = DT_F32;
        for (int64_t c0 = 0; c0 < a->cols; c0 += 32) {
            int64_t c1 = c0 + 32 < a->cols ? c0 + 32 : a->cols;
            float amax = 0;
            for (int64_t c = c0; c < c1; c++)
                amax = fmaxf(amax, fabsf(x[c]));
            for (int64_t c = c0; c < c1; c++) {
                double err, tol;
                switch (out) {
                case DT_F16: err = fabs(y[c] - f16_to_f32(f32_to_f16(x[c]))); tol = 0; break;
                case DT_BF16: err = fabs(y[c] - bf16_to_f32(f32_to_bf16(x[c]))); tol = 0; break;
                case DT_Q8_0:
                    err = fabs(y[c] - x[c]);
                    tol = 0.57 * amax / 127 + 127 * 3e-8 + 1e-9;
                    break;
                default: err = fabs(y[c] - x[c]); tol = 0; break;
                }
                double rel = err == 0 ? 0 : tol == 0 ? 1e9 : err / tol;
                if (rel > worst)
                    worst = rel;
            }
        }
    }
    free(x);
    free(y);
    CHECK(worst <= 1, "%s (%s): worst error %.3g x allowed", what, dtype_name(dt), worst);
    return worst;
}

static void cmp_models(const struct model *a, const struct model *b, enum dtype dt, int perm,
                       const char *what)
{
    const struct model_config *x = &a->cfg, *y = &b->cfg;
    CHECK(x->dim == y->dim && x->hidden_dim == y->hidden_dim && x->n_layers == y->n_layers &&
              x->n_heads == y->n_heads && x->n_kv_heads == y->n_kv_heads &&
              x->head_dim == y->head_dim && x->vocab_size == y->vocab_size &&
              x->max_seq == y->max_seq,
          "%s: shape config differs", what);
    CHECK(x->norm_eps == y->norm_eps && x->rope_theta == y->rope_theta &&
              x->rope_scaling == y->rope_scaling && x->rope_factor == y->rope_factor,
          "%s: eps/rope differ (%g %g, %g %g)", what, x->norm_eps, y->norm_eps, x->rope_theta,
          y->rope_theta);
    CHECK(x->sliding_window == y->sliding_window, "%s: sliding_window %d vs %d", what,
          x->sliding_window, y->sliding_window);
    CHECK(x->bos_id == y->bos_id && x->eos_id == y->eos_id, "%s: bos/eos %d %d vs %d %d", what,
          x->bos_id, x->eos_id, y->bos_id, y->eos_id);
    CHECK(x->n_eos == y->n_eos && !memcmp(x->eos_ids, y->eos_ids, sizeof(int) * (size_t)x->n_eos),
          "%s: %d stop ids vs %d", what, x->n_eos, y->n_eos);
    CHECK(x->qkv_bias == y->qkv_bias && x->qk_norm == y->qk_norm &&
              x->tied_embeddings == y->tied_embeddings,
          "%s: bias/qk_norm/tied differ", what);
    CHECK(!strcmp(b->format, "gguf"), "%s: format %s", what, b->format);
    if (x->tied_embeddings)
        CHECK(b->lm_head.data == b->tok_embd.data, "%s: tied lm_head aliases embedding", what);
    char nm[256];
    snprintf(nm, sizeof nm, "%s tok_embd", what);
    cmp_tensor(&a->tok_embd, &b->tok_embd, dt, 0, false, nm);
    snprintf(nm, sizeof nm, "%s out_norm", what);
    cmp_tensor(&a->out_norm, &b->out_norm, dt, 0, true, nm);
    snprintf(nm, sizeof nm, "%s lm_head", what);
    cmp_tensor(&a->lm_head, &b->lm_head, dt, 0, false, nm);
    int hd = x->head_dim;
    for (int l = 0; l < x->n_layers; l++) {
        const struct layer_weights *p = &a->layers[l], *q = &b->layers[l];
        const struct {
            const char *n;
            const struct tensor *s, *d;
            bool vec, permuted;
        } parts[] = {
            {"attn_norm", &p->attn_norm, &q->attn_norm, true, false},
            {"wq", &p->wq, &q->wq, false, true},
            {"wk", &p->wk, &q->wk, false, true},
            {"wv", &p->wv, &q->wv, false, false},
            {"wo", &p->wo, &q->wo, false, false},
            {"bq", &p->bq, &q->bq, true, true},
            {"bk", &p->bk, &q->bk, true, true},
            {"bv", &p->bv, &q->bv, true, false},
            {"q_norm", &p->q_norm, &q->q_norm, true, true},
            {"k_norm", &p->k_norm, &q->k_norm, true, true},
            {"ffn_norm", &p->ffn_norm, &q->ffn_norm, true, false},
            {"w_gate", &p->w_gate, &q->w_gate, false, false},
            {"w_up", &p->w_up, &q->w_up, false, false},
            {"w_down", &p->w_down, &q->w_down, false, false},
        };
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            snprintf(nm, sizeof nm, "%s layer %d %s", what, l, parts[i].n);
            cmp_tensor(parts[i].s, parts[i].d, dt, parts[i].permuted && perm ? hd : 0,
                       parts[i].vec, nm);
        }
    }
}

static void roundtrip(const struct model *src, const char *label, bool expect_perm)
{
    const enum dtype dts[] = {DT_F32, DT_F16, DT_BF16, DT_Q8_0};
    for (size_t i = 0; i < 4; i++) {
        char name[128], what[128];
        snprintf(name, sizeof name, "%s-%s.gguf", label, dtype_name(dts[i]));
        snprintf(what, sizeof what, "%s %s", label, dtype_name(dts[i]));
        const char *p = tmp_path(name);
        struct err e = {{0}};
        int rc = gguf_write_model(src, dts[i], p, &e);
        CHECK(rc == 0, "%s: write: %s", what, e.msg);
        if (rc)
            continue;
        struct model m;
        rc = model_load(&m, p, &e);
        CHECK(rc == 0, "%s: reload: %s", what, e.msg);
        if (rc)
            continue;
        bool want_interleaved = !strcmp(src->cfg.arch, "llama") || !strcmp(src->cfg.arch, "mistral");
        CHECK(m.cfg.rope_interleaved == want_interleaved, "%s: rope_interleaved", what);
        cmp_models(src, &m, dts[i], expect_perm, what);
        if (dts[i] == DT_F32 || dts[i] == DT_Q8_0) {
            /* writing the reloaded GGUF model again must not permute twice and
             * must reproduce the same tensor bytes */
            snprintf(name, sizeof name, "%s-%s-again.gguf", label, dtype_name(dts[i]));
            const char *p2 = tmp_path(name);
            rc = gguf_write_model(&m, dts[i], p2, &e);
            CHECK(rc == 0, "%s: rewrite: %s", what, e.msg);
            size_t la, lb;
            char *fa = test_read_file(p, &la), *fb = test_read_file(p2, &lb);
            struct gguf_file ga, gb;
            if (fa && fb && gguf_parse(&ga, fa, la, p, &e) == 0) {
                if (gguf_parse(&gb, fb, lb, p2, &e) == 0) {
                    int same = ga.n_tensors == gb.n_tensors;
                    for (uint64_t t = 0; same && t < ga.n_tensors; t++)
                        same = ga.tensors[t].nbytes == gb.tensors[t].nbytes &&
                               !memcmp(ga.tensors[t].data, gb.tensors[t].data,
                                       ga.tensors[t].nbytes);
                    CHECK(same, "%s: rewritten GGUF has different tensor data", what);
                    gguf_close(&gb);
                }
                gguf_close(&ga);
            }
            free(fa);
            free(fb);
        }
        model_free(&m);
    }
}

static void test_hf_model(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/tinystories-656k", CLLM_SHARED_DIR);
    struct model m;
    struct err e = {{0}};
    if (model_load(&m, dir, &e) != 0) {
        CHECK(0, "load %s: %s", dir, e.msg);
        return;
    }
    CHECK(!m.cfg.rope_interleaved && !strcmp(m.cfg.arch, "llama"), "HF llama: rotate-half");
    roundtrip(&m, "tinystories", true);
    model_free(&m);

    snprintf(dir, sizeof dir, "%s/models/stories260K/stories260K.bin", CLLM_SHARED_DIR);
    if (model_load(&m, dir, &e) != 0) {
        CHECK(0, "load %s: %s", dir, e.msg);
        return;
    }
    /* llama2.c checkpoints are already interleaved: written unpermuted;
     * hidden_dim 172 is not a multiple of 32, so ffn_down stays F32 in Q8_0 */
    CHECK(m.cfg.rope_interleaved, "llama2c is interleaved");
    roundtrip(&m, "stories260k", false);
    model_free(&m);

    /* the transformers oracle fixtures: one small model per architecture */
    static const char *const oracle[] = {"llama", "mistral", "qwen2", "qwen3", "qwen3_bf16"};
    for (size_t i = 0; i < sizeof oracle / sizeof oracle[0]; i++) {
        snprintf(dir, sizeof dir, "%s/oracle/%s", CLLM_FIXTURES_DIR, oracle[i]);
        if (model_load(&m, dir, &e) != 0) {
            CHECK(0, "load %s: %s", dir, e.msg);
            continue;
        }
        bool llama = !strcmp(m.cfg.arch, "llama") || !strcmp(m.cfg.arch, "mistral");
        roundtrip(&m, oracle[i], llama);
        model_free(&m);
    }
    snprintf(dir, sizeof dir, "%s/oracle/llama3", CLLM_FIXTURES_DIR);
    if (model_load(&m, dir, &e) == 0) {
        /* llama3 rope scaling goes out as llama.cpp's rope_freqs.weight and
         * comes back as the same frequencies (test_models: the same logits) */
        struct model r;
        CHECK(gguf_write_model(&m, DT_F32, tmp_path("llama3.gguf"), &e) == 0, "llama3: %s", e.msg);
        if (model_load(&r, tmp_path("llama3.gguf"), &e) == 0) {
            float a[256], b[256];
            rope_inv_freq(&m.cfg, a);
            rope_inv_freq(&r.cfg, b);
            double worst = 0;
            for (int i = 0; i < m.cfg.head_dim / 2; i++)
                worst = fmax(worst, fabs((double)a[i] - b[i]) / a[i]);
            CHECK(r.cfg.rope_scaling == ROPE_SCALING_FREQS && worst < 1e-6,
                  "llama3 frequencies through rope_freqs: %d, off by %.3g", r.cfg.rope_scaling,
                  worst);
            model_free(&r);
        } else {
            CHECK(0, "reload llama3.gguf: %s", e.msg);
        }
        model_free(&m);
    } else {
        CHECK(0, "load %s: %s", dir, e.msg);
    }
}

/* A synthetic qwen2/qwen3-style model in memory (random F32 weights). */
static int fake_tensor(struct model *m, struct tensor *t, int64_t rows, int64_t cols, float base)
{
    float *d = model_own_alloc(m, (size_t)(rows * cols) * sizeof *d, NULL);
    if (!d)
        return -1;
    for (int64_t i = 0; i < rows * cols; i++)
        d[i] = base + 0.05f * frand();
    *t = (struct tensor){DT_F32, rows, cols, d};
    return 0;
}

static void make_fake_sized(struct model *m, const char *arch, bool bias, bool qk_norm,
                            bool tied, bool interleaved, int dim, int hidden, int layers,
                            int head_dim);

static void make_fake(struct model *m, const char *arch, bool bias, bool qk_norm, bool tied,
                      bool interleaved)
{
    make_fake_sized(m, arch, bias, qk_norm, tied, interleaved, 64, 96, 2, 32);
}

/* make_fake with the given dim, hidden_dim, layers and head_dim. */
static void make_fake_sized(struct model *m, const char *arch, bool bias, bool qk_norm,
                            bool tied, bool interleaved, int dim, int hidden, int layers,
                            int head_dim)
{
    memset(m, 0, sizeof *m);
    struct model_config *c = &m->cfg;
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    snprintf(m->path, sizeof m->path, "/fake/%s", arch);
    c->dim = dim;
    c->hidden_dim = hidden;
    c->n_layers = layers;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = head_dim; /* 32 of 64: != dim / n_heads on purpose */
    c->vocab_size = 50;
    c->max_seq = 128;
    c->norm_eps = 1e-6f;
    c->rope_theta = 1e6f;
    c->rope_scaling = ROPE_SCALING_LINEAR;
    c->rope_factor = 2.0f;
    c->rope_interleaved = interleaved;
    c->qkv_bias = bias;
    c->qk_norm = qk_norm;
    c->tied_embeddings = tied;
    c->bos_id = -1;
    c->eos_id = 7;
    c->eos_ids[0] = 7;
    c->eos_ids[1] = 11;
    c->eos_ids[2] = 13;
    c->n_eos = 3;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    fake_tensor(m, &m->tok_embd, c->vocab_size, c->dim, 0);
    fake_tensor(m, &m->out_norm, 1, c->dim, 1);
    if (tied)
        m->lm_head = m->tok_embd;
    else
        fake_tensor(m, &m->lm_head, c->vocab_size, c->dim, 0);
    for (int l = 0; l < c->n_layers; l++) {
        struct layer_weights *w = &m->layers[l];
        fake_tensor(m, &w->attn_norm, 1, c->dim, 1);
        fake_tensor(m, &w->wq, q, c->dim, 0);
        fake_tensor(m, &w->wk, kv, c->dim, 0);
        fake_tensor(m, &w->wv, kv, c->dim, 0);
        fake_tensor(m, &w->wo, c->dim, q, 0);
        if (bias) {
            fake_tensor(m, &w->bq, 1, q, 0);
            fake_tensor(m, &w->bk, 1, kv, 0);
            fake_tensor(m, &w->bv, 1, kv, 0);
        }
        if (qk_norm) {
            fake_tensor(m, &w->q_norm, 1, c->head_dim, 1);
            fake_tensor(m, &w->k_norm, 1, c->head_dim, 1);
        }
        fake_tensor(m, &w->ffn_norm, 1, c->dim, 1);
        fake_tensor(m, &w->w_gate, c->hidden_dim, c->dim, 0);
        fake_tensor(m, &w->w_up, c->hidden_dim, c->dim, 0);
        fake_tensor(m, &w->w_down, c->dim, c->hidden_dim, 0);
    }
}

/* The inverse check for a qwen file written from an interleaved source:
 * GGUF (HF order) row r must be source row llama_to_hf(r). */
static void check_unpermute(void)
{
    struct model src, m;
    struct err e = {{0}};
    make_fake(&src, "qwen3", true, true, true, true);
    const char *p = tmp_path("unperm.gguf");
    CHECK(gguf_write_model(&src, DT_F32, p, &e) == 0, "write: %s", e.msg);
    if (model_load(&m, p, &e) != 0) {
        CHECK(0, "reload: %s", e.msg);
        model_free(&src);
        return;
    }
    CHECK(!m.cfg.rope_interleaved, "qwen3 gguf is rotate-half");
    /* hf_to_llama maps the llama position to its HF source, i.e. the source
     * row of HF row hf_to_llama(r) is interleaved row r. */
    int hd = src.cfg.head_dim, ok = 1;
    const struct layer_weights *a = &src.layers[1], *b = &m.layers[1];
    float x[64], y[64];
    for (int64_t r = 0; r < a->wq.rows; r++) {
        get_row(&a->wq, r, x);
        get_row(&b->wq, hf_to_llama(r, hd), y);
        ok &= !memcmp(x, y, sizeof x);
    }
    for (int64_t i = 0; i < a->bk.cols; i++)
        ok &= ((const float *)a->bk.data)[i] == ((const float *)b->bk.data)[hf_to_llama(i, hd)];
    for (int64_t i = 0; i < hd; i++)
        ok &= ((const float *)a->q_norm.data)[i] ==
              ((const float *)b->q_norm.data)[hf_to_llama(i, hd)];
    CHECK(ok, "interleaved -> rotate-half permutation of wq, bk, q_norm");
    model_free(&m);
    model_free(&src);
}

static int gen_row(void *ctx, const struct tensor *t, int64_t row, float *out)
{
    int *calls = ctx;
    ++*calls;
    for (int64_t i = 0; i < t->cols; i++)
        out[i] = (float)(row * 1000 + i) / 4096.0f;
    return 0;
}

static void test_fake_models(void)
{
    struct model m;
    make_fake(&m, "qwen2", true, false, false, false);
    roundtrip(&m, "qwen2", false);
    model_free(&m);
    make_fake(&m, "qwen3", false, true, true, false);
    roundtrip(&m, "qwen3", false);
    model_free(&m);
    make_fake(&m, "mistral", true, true, false, false);
    m.cfg.sliding_window = 4096;
    roundtrip(&m, "mistral", true);
    model_free(&m);
    check_unpermute();

    /* streaming generation through a row callback */
    make_fake(&m, "qwen3", false, true, true, false);
    int calls = 0;
    struct err e = {{0}};
    const char *p = tmp_path("rows.gguf");
    CHECK(gguf_write_model_rows(&m, DT_BF16, p, gen_row, &calls, &e) == 0, "rows: %s", e.msg);
    struct model r;
    if (model_load(&r, p, &e) == 0) {
        float x[96];
        get_row(&r.layers[1].w_down, 5, x);
        CHECK(x[3] == bf16_to_f32(f32_to_bf16((5 * 1000 + 3) / 4096.0f)), "row_fn values");
        CHECK(((const float *)r.layers[0].k_norm.data)[2] == 2 / 4096.0f, "row_fn vectors");
        model_free(&r);
    } else {
        CHECK(0, "rows reload: %s", e.msg);
    }
    CHECK(calls > 0, "row_fn called");
    model_free(&m);

    /* GGUF_WRITE_K_M: llama.cpp's Q4_K_M mix. Of 8 layers, 0, 3, 6 and 7
     * get more bits (their attn_v and ffn_down Q6_K), and so does the
     * output matrix, or the embedding where tied; everything else Q4_K. */
    for (int tied = 0; tied < 2; tied++) {
        make_fake_sized(&m, "llama", false, false, tied, true, 256, 256, 8, 64);
        p = tmp_path("k_m.gguf");
        CHECK(gguf_write_model_flags(&m, DT_Q4_K, p, NULL, NULL, GGUF_WRITE_K_M, &e) == 0,
              "k_m: %s", e.msg);
        if (model_load(&r, p, &e) == 0) {
            CHECK(r.tok_embd.dtype == (tied ? DT_Q6_K : DT_Q4_K), "k_m embedding: %s",
                  dtype_name(r.tok_embd.dtype));
            CHECK(tied || r.lm_head.dtype == DT_Q6_K, "k_m output: %s",
                  dtype_name(r.lm_head.dtype));
            for (int l = 0; l < 8; l++) {
                const struct layer_weights *w = &r.layers[l];
                const enum dtype want = l == 0 || l == 3 || l == 6 || l == 7 ? DT_Q6_K : DT_Q4_K;
                CHECK(w->wv.dtype == want && w->w_down.dtype == want && w->wq.dtype == DT_Q4_K &&
                          w->wk.dtype == DT_Q4_K && w->wo.dtype == DT_Q4_K &&
                          w->w_gate.dtype == DT_Q4_K && w->w_up.dtype == DT_Q4_K,
                      "k_m layer %d: v %s, down %s, q %s", l, dtype_name(w->wv.dtype),
                      dtype_name(w->w_down.dtype), dtype_name(w->wq.dtype));
            }
            model_free(&r);
        } else {
            CHECK(0, "k_m reload: %s", e.msg);
        }
        model_free(&m);
    }


}

/* Model-level errors: unsupported tensor type, architecture, missing keys. */
static int write_min_model(const char *path, const char *arch, const char *q_name,
                           uint32_t q_type, bool rope_freqs, bool with_layers, struct err *e)
{
    struct gguf_writer *w = gguf_writer_new(e);
    char k[64];
    int rc = gguf_writer_kv_str(w, "general.architecture", arch, e);
    const char *keys[] = {"embedding_length", "feed_forward_length", "block_count",
                          "attention.head_count"};
    const uint32_t vals[] = {256, 256, 1, 2};
    for (int i = 0; i < 4 && with_layers; i++) {
        snprintf(k, sizeof k, "%s.%s", arch, keys[i]);
        rc |= gguf_writer_kv_u32(w, k, vals[i], e);
    }
    uint64_t ne_e[2] = {256, 4}, ne_q[2] = {256, 256}, ne_r[1] = {64};
    rc |= gguf_writer_add_tensor(w, "token_embd.weight", GGUF_TENSOR_F32, 2, ne_e, e);
    rc |= gguf_writer_add_tensor(w, q_name, q_type, 2, ne_q, e);
    if (rope_freqs)
        rc |= gguf_writer_add_tensor(w, "rope_freqs.weight", GGUF_TENSOR_F32, 1, ne_r, e);
    rc |= gguf_writer_kv_u32(w, "tokenizer.ggml.padding_token_id", 0xffffffffu, e);
    rc |= gguf_writer_kv_i32(w, "tokenizer.ggml.bos_token_id", -1, e);
    rc |= gguf_writer_open(w, path, e);
    static uint8_t zeros[256 * 256 * 4];
    rc |= gguf_writer_data(w, zeros, 256 * 4 * 4, e);
    uint32_t be, bb;
    gguf_ttype_block(q_type, &be, &bb);
    rc |= gguf_writer_data(w, zeros, 256 / be * bb * 256, e);
    if (rope_freqs)
        rc |= gguf_writer_data(w, zeros, 64 * 4, e);
    rc |= gguf_writer_close(w, e);
    gguf_writer_free(w);
    return rc;
}

static void test_model_errors(void)
{
    struct err e = {{0}};
    struct model m;
    const char *p = tmp_path("iq4xs.gguf");
    CHECK(write_min_model(p, "llama", "blk.0.attn_q.weight", 23 /* IQ4_XS */, false, true, &e) == 0, "write: %s", e.msg);
    CHECK(model_load(&m, p, &e) != 0 && strstr(e.msg, "blk.0.attn_q.weight") &&
              strstr(e.msg, "IQ4_XS (23)") && strstr(e.msg, "iq4xs.gguf") && strstr(e.msg, "Q6_K") &&
              strstr(e.msg, "Q2_K"),
          "IQ4_XS refused, naming what is supported: %s", e.msg);
    p = tmp_path("gemma.gguf");
    CHECK(write_min_model(p, "gemma2", "blk.0.attn_q.weight", GGUF_TENSOR_F32, false, true, &e) == 0, "write: %s", e.msg);
    CHECK(model_load(&m, p, &e) != 0 && strstr(e.msg, "architecture 'gemma2' is not supported"),
          "arch refused: %s", e.msg);
    p = tmp_path("nokeys.gguf");
    CHECK(write_min_model(p, "qwen3", "blk.0.attn_q.weight", GGUF_TENSOR_F32, false, false, &e) == 0, "write: %s", e.msg);
    CHECK(model_load(&m, p, &e) != 0 && strstr(e.msg, "missing metadata key qwen3.embedding_length"),
          "missing key: %s", e.msg);
    p = tmp_path("ropefreqs.gguf");
    CHECK(write_min_model(p, "llama", "blk.0.attn_q.weight", GGUF_TENSOR_F32, true, true, &e) == 0, "write: %s", e.msg);
    CHECK(model_load(&m, p, &e) != 0 && strstr(e.msg, "rope_freqs.weight[0] = 0") &&
              strstr(e.msg, "positive"),
          "rope_freqs of zeros refused: %s", e.msg);
    p = tmp_path("partial-model.gguf");
    CHECK(write_min_model(p, "llama", "blk.0.attn_q.weight", GGUF_TENSOR_F32, false, true, &e) == 0, "write: %s", e.msg);
    CHECK(model_load(&m, p, &e) != 0 && strstr(e.msg, "missing tensor"), "incomplete: %s", e.msg);
    static const struct {
        const char *name, *want;
    } bad_names[] = {
        {"blk.00.attn_q.weight", "unexpected tensor 'blk.00.attn_q.weight'"},
        {"blk.5.attn_q.weight", "belongs to layer 5 but block_count is 1"},
        {"blk.0.attn_qkv.weight", "unexpected tensor 'blk.0.attn_qkv.weight'"},
        {"token_embd.weight", "duplicate tensor name 'token_embd.weight'"},
    };
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        p = tmp_path("badname.gguf");
        int rc = write_min_model(p, "llama", bad_names[i].name, GGUF_TENSOR_F32, false, true, &e);
        if (rc) /* the writer refuses duplicates itself (the reader: test_corruption) */
            CHECK(!strcmp(bad_names[i].name, "token_embd.weight"), "%s: %s", bad_names[i].name,
                  e.msg);
        else
            CHECK(model_load(&m, p, &e) != 0 && strstr(e.msg, bad_names[i].want), "%s: %s",
                  bad_names[i].name, e.msg);
    }
    /* converting a GGUF onto itself is refused before the file is touched */
    struct model src;
    make_fake(&src, "qwen3", false, true, true, false);
    p = tmp_path("self.gguf");
    CHECK(gguf_write_model(&src, DT_F32, p, &e) == 0, "write: %s", e.msg);
    model_free(&src);
    if (model_load(&m, p, &e) == 0) {
        CHECK(gguf_write_model(&m, DT_BF16, p, &e) != 0 && strstr(e.msg, "being converted"),
              "self overwrite: %s", e.msg);
        CHECK(m.cfg.bos_id == -1, "bos -1");
        model_free(&m);
    } else {
        CHECK(0, "reload: %s", e.msg);
    }
    /* a real vocab-only file is not a model */
    char vp[512];
    snprintf(vp, sizeof vp, "%s/testdata/tokenizer-vectors/ggml-vocab-llama-spm.gguf",
             CLLM_SHARED_DIR);
    if (access(vp, R_OK) == 0)
        CHECK(model_load(&m, vp, &e) != 0 && strstr(e.msg, "token_embd.weight"),
              "vocab-only file: %s", e.msg);
}

/* ---- the 2-6-bit block formats ----
 *
 * One block of each, its bytes laid out here from the format's description
 * (ggml's block_* structs and dequantize_row_*), not by quant.c's
 * quantizer, and every value checked against the formula written out
 * below. The scales are powers of two and the codes small, so every
 * expected value is exact in f32 and compared with ==. */
static int check_block(enum dtype dt, const uint8_t *blk, const float *want, int n)
{
    float got[256];
    quant_dequantize_row(dt, blk, got, n);
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (got[i] != want[i] && bad++ < 3)
            fprintf(stderr, "%s value %d: %g, want %g\n", dtype_name(dt), i, got[i], want[i]);
    return bad;
}

static void put_f16(uint8_t *p, float v)
{
    uint16_t h = f32_to_f16(v);
    memcpy(p, &h, 2);
}

static void test_block_formats(void)
{
    uint8_t b[256];
    float want[256];
    /* Q4_0: d, 16 bytes: value j in the low nibble of byte j, value j + 16
     * in its high nibble; value = (code - 8) d */
    memset(b, 0, sizeof b);
    put_f16(b, 0.5f);
    for (int j = 0; j < 16; j++) {
        b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
        want[j] = (float)(j - 8) * 0.5f;
        want[j + 16] = (float)(15 - j - 8) * 0.5f;
    }
    CHECK(check_block(DT_Q4_0, b, want, 32) == 0, "Q4_0 block");
    /* Q4_1: d, m, 16 bytes as Q4_0; value = code d + m */
    put_f16(b, 0.25f);
    put_f16(b + 2, -1.0f);
    for (int j = 0; j < 16; j++) {
        b[4 + j] = (uint8_t)(j | ((15 - j) << 4));
        want[j] = (float)j * 0.25f - 1.0f;
        want[j + 16] = (float)(15 - j) * 0.25f - 1.0f;
    }
    CHECK(check_block(DT_Q4_1, b, want, 32) == 0, "Q4_1 block");
    /* Q5_0: d, a 32-bit little-endian word whose bit i is the fifth bit of
     * value i, 16 bytes of low nibbles as Q4_0; value = (code - 16) d.
     * Word 0xAAAA5555: values 0, 2, .., 14 and 17, 19, .., 31 have it. */
    const uint32_t qh = 0xAAAA5555u;
    put_f16(b, 1.0f);
    memcpy(b + 2, &qh, 4);
    for (int j = 0; j < 16; j++) {
        b[6 + j] = (uint8_t)(j | ((15 - j) << 4));
        want[j] = (float)((j | (j % 2 == 0) << 4) - 16);
        want[j + 16] = (float)(((15 - j) | (j % 2 == 1) << 4) - 16);
    }
    CHECK(check_block(DT_Q5_0, b, want, 32) == 0, "Q5_0 block");
    /* Q5_1: d, m, the word, the nibbles; value = code d + m */
    put_f16(b, 0.5f);
    put_f16(b + 2, 2.0f);
    memcpy(b + 4, &qh, 4);
    for (int j = 0; j < 16; j++) {
        b[8 + j] = (uint8_t)(j | ((15 - j) << 4));
        want[j] = (float)(j | (j % 2 == 0) << 4) * 0.5f + 2.0f;
        want[j + 16] = (float)((15 - j) | (j % 2 == 1) << 4) * 0.5f + 2.0f;
    }
    CHECK(check_block(DT_Q5_1, b, want, 32) == 0, "Q5_1 block");
    /* Q4_K / Q5_K: d, dmin, 12 bytes of 6-bit group scales sc and mins mn
     * for the 8 groups of 32: bytes 0-3 hold sc 0-3 in their low 6 bits and
     * sc 4-7's top 2 bits above; bytes 4-7 the same for mn; bytes 8-11 hold
     * sc 4-7's low nibble and mn 4-7's low nibble above it. Then (Q5_K) 32
     * bytes whose byte l, bit g is the fifth bit of value l of group g,
     * then 128 bytes: groups 2c and 2c+1 share bytes 32c..32c+31, the
     * first in the low nibbles. value = d sc code - dmin mn. */
    int sc[8], mn[8];
    for (int g = 0; g < 8; g++) {
        sc[g] = 10 + 7 * g; /* 38..59 from group 4 on: the top bits count */
        mn[g] = 63 - 5 * g;
    }
    for (int k5 = 0; k5 < 2; k5++) {
        const enum dtype dt = k5 ? DT_Q5_K : DT_Q4_K;
        memset(b, 0, sizeof b);
        put_f16(b, 0.5f);
        put_f16(b + 2, 0.25f);
        uint8_t *scales = b + 4, *qhk = b + 16, *qs = b + (k5 ? 48 : 16);
        for (int g = 0; g < 4; g++) {
            scales[g] = (uint8_t)(sc[g] | (sc[g + 4] >> 4) << 6);
            scales[g + 4] = (uint8_t)(mn[g] | (mn[g + 4] >> 4) << 6);
            scales[g + 8] = (uint8_t)((sc[g + 4] & 15) | (mn[g + 4] & 15) << 4);
        }
        for (int e = 0; e < 256; e++) {
            const int g = e / 32, l = e % 32, code4 = (e * 7 + 3) % 16;
            const int hi = k5 && e % 3 == 0;
            qs[32 * (g / 2) + l] |= (uint8_t)(code4 << (4 * (g % 2)));
            if (hi)
                qhk[l] |= (uint8_t)(1 << g);
            want[e] = 0.5f * (float)sc[g] * (float)(code4 + 16 * hi) - 0.25f * (float)mn[g];
        }
        CHECK(check_block(dt, b, want, 256) == 0, "%s block", dtype_name(dt));
    }
    /* Q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16
     * int8 group scales (groups of 16), d last. Value e of half n = e / 128
     * (r = e % 128, quarter k = r / 32, l = r % 32): low nibble in byte
     * 64 n + l (k = 0, 2) or 64 n + 32 + l (k = 1, 3), the low nibble for
     * k < 2; high pair at bit 2 k of byte 128 + 32 n + l; scale e / 16;
     * value = d scale (code - 32). */
    memset(b, 0, sizeof b);
    int8_t s6[16];
    for (int i = 0; i < 16; i++) {
        s6[i] = (int8_t)((i * 13) % 64 - 32);
        b[192 + i] = (uint8_t)s6[i];
    }
    put_f16(b + 208, 0.125f);
    for (int e = 0; e < 256; e++) {
        const int n = e / 128, r = e % 128, k = r / 32, l = r % 32, code = (e * 5 + 1) % 64;
        b[64 * n + l + 32 * (k % 2)] |= (uint8_t)((code & 15) << (4 * (k / 2)));
        b[128 + 32 * n + l] |= (uint8_t)((code >> 4) << (2 * k));
        want[e] = 0.125f * (float)s6[e / 16] * (float)(code - 32);
    }
    CHECK(check_block(DT_Q6_K, b, want, 256) == 0, "Q6_K block");
    /* Q2_K: 16 bytes of group scales (low nibble sc, high nibble mn, groups
     * of 16), 64 bytes of 2-bit codes, d, dmin. Value e of half n = e / 128
     * (r = e % 128, run j = r / 32): its code in bits 2j of byte 16 + 32n +
     * r % 32; value = d sc code - dmin mn. */
    memset(b, 0, sizeof b);
    for (int g = 0; g < 16; g++)
        b[g] = (uint8_t)((3 * g + 1) % 16 | ((5 * g + 2) % 16) << 4);
    put_f16(b + 80, 0.5f);
    put_f16(b + 82, 0.25f);
    for (int e = 0; e < 256; e++) {
        const int n = e / 128, r = e % 128, code = (e * 7 + 3) % 4, g = e / 16;
        b[16 + 32 * n + r % 32] |= (uint8_t)(code << (2 * (r / 32)));
        want[e] = 0.5f * (float)((3 * g + 1) % 16) * (float)code - 0.25f * (float)((5 * g + 2) % 16);
    }
    CHECK(check_block(DT_Q2_K, b, want, 256) == 0, "Q2_K block");
    /* Q3_K: 32 bytes of high bits, 64 bytes of low 2-bit codes (as Q2_K's),
     * 12 bytes of 6-bit scales, d. Value e's high bit is bit 4n + j of
     * byte e % 32: set, the code is the low bits; clear, they minus 4.
     * Scale g's low nibble is byte g's low one (g < 8) or byte g - 8's high
     * one, its top two bits bits 2 (g / 4) of byte 104 + g % 4 (8 + g % 4
     * of the 12); value = d (scale - 32) code. */
    memset(b, 0, sizeof b);
    int s3[16];
    for (int g = 0; g < 16; g++) {
        s3[g] = (g * 11 + 5) % 64;
        b[96 + g % 8] |= (uint8_t)((s3[g] & 15) << (g < 8 ? 0 : 4));
        b[104 + g % 4] |= (uint8_t)((s3[g] >> 4) << (2 * (g / 4)));
    }
    put_f16(b + 108, 0.125f);
    for (int e = 0; e < 256; e++) {
        const int n = e / 128, r = e % 128, j = r / 32, lo = (e * 5 + 1) % 4, hi = e % 3 != 0;
        b[32 + 32 * n + r % 32] |= (uint8_t)(lo << (2 * j));
        if (hi)
            b[e % 32] |= (uint8_t)(1 << (4 * n + j));
        want[e] = 0.125f * (float)(s3[e / 16] - 32) * (float)(hi ? lo : lo - 4);
    }
    CHECK(check_block(DT_Q3_K, b, want, 256) == 0, "Q3_K block");
    /* the quantizer's blocks widen back to within a step of the values */
    const enum dtype all[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K,
                              DT_Q5_K, DT_Q6_K, DT_Q2_K, DT_Q3_K};
    const float step[] = {2.0f / 8,  2.0f / 15, 2.0f / 16, 2.0f / 31, 2.0f / 15,
                          2.0f / 31, 2.0f / 32, 2.0f / 3,  2.0f / 8};
    float x[512], y[512];
    uint8_t q[512];
    for (int i = 0; i < 512; i++)
        x[i] = sinf((float)i * 0.7f) * (i % 64 < 32 ? 1.0f : 0.25f);
    for (size_t f = 0; f < sizeof all / sizeof all[0]; f++) {
        gguf_encode_row(all[f], x, q, 512);
        gguf_decode_row(all[f], q, y, 512);
        double worst = 0;
        for (int i = 0; i < 512; i++) {
            double amax = 0; /* of the value's 32 (where x has one magnitude) */
            for (int k = i / 32 * 32; k < (i / 32 + 1) * 32; k++)
                amax = fmax(amax, fabs(x[k]));
            worst = fmax(worst, fabs(y[i] - x[i]) / (amax * step[f] + 1e-9));
        }
        CHECK(worst <= 1.5, "%s: encode then decode off by %.2f steps of its group", dtype_name(all[f]), worst);
    }
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_gguf.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    const char *all = tmp_path("all.gguf"), *all64 = tmp_path("all64.gguf");
    CHECK(write_all_types(all, 32) == 0, "write all types");
    check_all_types(all, 32);
    CHECK(write_all_types(all64, 64) == 0, "write all types, alignment 64");
    check_all_types(all64, 64);
    test_truncation(all);
    test_corruption();
    test_writer_errors();
    test_vocab_files();
    test_vocab_fuzz();
    test_model_errors();
    test_block_formats();
    test_fake_models();
    test_hf_model();

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_summary("test_gguf");
}
