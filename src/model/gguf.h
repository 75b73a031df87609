/* gguf.h - GGUF files (versions 2 and 3): a bounds-checked reader over a
 * memory map, the tokenizer metadata they carry, and a small streaming writer
 * used by the converter, the tests and bench/gen_model.
 *
 * Format facts the code relies on (all little-endian):
 *   "GGUF" u32 version  u64 n_tensors  u64 n_kv
 *   n_kv x { string key, u32 value_type, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type,
 *                 u64 offset (relative to the data section) }
 *   padding to general.alignment (default 32), then the tensor data.
 * A string is u64 length + bytes (no NUL); an array is u32 element type, u64
 * count, elements. ne[0] is the innermost (fastest varying) dimension, so a
 * matrix of rows x cols is stored as ne = {cols, rows}. */
#ifndef CLLM_MODEL_GGUF_H
#define CLLM_MODEL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/model.h"
#include "model/tensor.h"

enum gguf_vtype {
    GGUF_VT_UINT8 = 0,
    GGUF_VT_INT8 = 1,
    GGUF_VT_UINT16 = 2,
    GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4,
    GGUF_VT_INT32 = 5,
    GGUF_VT_FLOAT32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_UINT64 = 10,
    GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12,
    GGUF_VT_COUNT
};

/* ggml tensor type ids as stored in a GGUF file; only the ones cllm reads
 * are named here (gguf_ttype_name knows every id for messages). */
enum gguf_ttype {
    GGUF_TENSOR_F32 = 0,
    GGUF_TENSOR_F16 = 1,
    GGUF_TENSOR_Q4_0 = 2,
    GGUF_TENSOR_Q4_1 = 3,
    GGUF_TENSOR_Q5_0 = 6,
    GGUF_TENSOR_Q5_1 = 7,
    GGUF_TENSOR_Q8_0 = 8,
    GGUF_TENSOR_Q2_K = 10,
    GGUF_TENSOR_Q3_K = 11,
    GGUF_TENSOR_Q4_K = 12,
    GGUF_TENSOR_Q5_K = 13,
    GGUF_TENSOR_Q6_K = 14,
    GGUF_TENSOR_BF16 = 30,
};

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NESTING 8 /* arrays of arrays deeper than this are rejected */

/* A string inside the mapped file: not NUL-terminated. */
struct gguf_str {
    const char *ptr;
    uint64_t len;
};

/* One decoded value. Arrays are left encoded in the file and read with
 * gguf_arr_iter; their bytes were validated when the file was parsed. */
struct gguf_value {
    enum gguf_vtype type;
    union {
        uint64_t u; /* UINT8, UINT16, UINT32, UINT64, BOOL (0/1) */
        int64_t i;  /* INT8, INT16, INT32, INT64 */
        double f;   /* FLOAT32, FLOAT64 */
        struct gguf_str s;
        struct {
            enum gguf_vtype type; /* element type */
            uint64_t n;
            const uint8_t *data; /* first element */
            size_t bytes;        /* all elements */
        } arr;
    } v;
};

struct gguf_kv {
    struct gguf_str key;
    struct gguf_value val;
};

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* innermost first; unused dims are 1 */
    uint32_t type;              /* ggml type id (enum gguf_ttype for the named ones) */
    uint64_t offset;            /* relative to the data section */
    uint64_t nbytes;
    const void *data;
};

struct gguf_file {
    char name[256]; /* the path, for messages */
    const uint8_t *base;
    size_t size;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    struct gguf_kv *kv;
    struct gguf_tensor *tensors;
    size_t alignment;
    size_t data_offset; /* start of the tensor data section */
    /* Private: sorted indices for lookups, and the mapping when gguf_open
     * made one (gguf_close unmaps it unless the caller took it over). */
    uint32_t *kv_sorted, *tensor_sorted;
    void *map;
    size_t map_len;
};

/* Maps and parses a file. Every length, count and offset is checked against
 * the file size; on any problem returns -1 with one line naming the file. */
int gguf_open(struct gguf_file *g, const char *path, struct err *e);
/* Parses a file already in memory (the caller keeps buf alive and owns it);
 * `name` is used in messages. */
int gguf_parse(struct gguf_file *g, const void *buf, size_t size, const char *name,
               struct err *e);
void gguf_close(struct gguf_file *g);

const struct gguf_kv *gguf_find_kv(const struct gguf_file *g, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name);

/* Typed views of a value: 0 on success, -1 when the type doesn't fit (any
 * integer type for _int, integers or floats for _float). */
int gguf_value_int(const struct gguf_value *v, int64_t *out);
int gguf_value_float(const struct gguf_value *v, double *out);
bool gguf_str_eq(struct gguf_str s, const char *cstr);

/* Walks the elements of an array value in order. */
struct gguf_arr_iter {
    enum gguf_vtype type;
    uint64_t n, i;
    const uint8_t *p, *end;
};
void gguf_arr_iter_init(struct gguf_arr_iter *it, const struct gguf_value *arr);
/* 1 and the next element in *out; 0 at the end. Nested arrays come back as
 * GGUF_VT_ARRAY values that can be iterated in turn. */
int gguf_arr_next(struct gguf_arr_iter *it, struct gguf_value *out);

const char *gguf_vtype_name(uint32_t t);
/* Bytes of one scalar of type t; 0 for string, array or unknown. */
size_t gguf_vtype_size(uint32_t t);
/* "Q4_K" etc.; "unknown" for ids that are not ggml types. */
const char *gguf_ttype_name(uint32_t t);
/* Elements per block and bytes per block of a ggml type; 0 when unknown. */
int gguf_ttype_block(uint32_t t, uint32_t *block_elems, uint32_t *block_bytes);
/* The GGUF type of a cllm dtype and back (-1 when cllm can't hold it). */
uint32_t gguf_ttype_from_dtype(enum dtype d);
int gguf_ttype_to_dtype(uint32_t t, enum dtype *out);

/* ---- tokenizer metadata (tokenizer.ggml.*) ---- */

struct gguf_vocab {
    char model[32]; /* tokenizer.ggml.model: "llama" (SPM), "gpt2" (BPE), "bert", ... */
    char pre[64];   /* tokenizer.ggml.pre, "" when absent */
    int n_tokens;
    char **tokens;        /* NUL-terminated copies, token_len[i] bytes each */
    uint32_t *token_len;
    float *scores;        /* NULL when absent */
    int32_t *token_type;  /* NULL when absent (1 normal, 2 unknown, 3 control, 4 user, 6 byte) */
    int n_merges;
    char **merges;        /* "a b" pairs for BPE; NULL when absent */
    int bos_id, eos_id, unk_id, pad_id, sep_id, eot_id; /* -1 when absent */
    int add_bos, add_eos; /* -1 when absent, else 0/1 */
    char *chat_template;  /* tokenizer.chat_template or NULL */
    void *blob_;          /* private: one allocation behind all the strings */
};

/* Reads the tokenizer metadata of a GGUF file (vocab-only files included). */
int gguf_read_vocab(const char *file, struct gguf_vocab *out, struct err *e);
int gguf_vocab_from_file(const struct gguf_file *g, struct gguf_vocab *out, struct err *e);
void gguf_vocab_free(struct gguf_vocab *v);

/* ---- writer ---- */

struct gguf_writer;

/* Builds a file in three steps: add metadata and tensor descriptions, then
 * gguf_writer_open writes everything up to the data section, then the
 * tensors' bytes are streamed in the order they were added (any chunking),
 * then gguf_writer_close. gguf_writer_free on a file that was not closed
 * successfully removes it. */
struct gguf_writer *gguf_writer_new(struct err *e);
void gguf_writer_free(struct gguf_writer *w);

int gguf_writer_kv_str(struct gguf_writer *w, const char *key, const char *val, struct err *e);
int gguf_writer_kv_u32(struct gguf_writer *w, const char *key, uint32_t val, struct err *e);
int gguf_writer_kv_i32(struct gguf_writer *w, const char *key, int32_t val, struct err *e);
int gguf_writer_kv_f32(struct gguf_writer *w, const char *key, float val, struct err *e);
int gguf_writer_kv_bool(struct gguf_writer *w, const char *key, bool val, struct err *e);
/* Any scalar type: `val` points to the matching C type (uint8_t ... double,
 * bool as uint8_t 0/1). */
int gguf_writer_kv_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype type,
                          const void *val, struct err *e);
/* Array of fixed-size elements (not strings or arrays), n of them at elems. */
int gguf_writer_kv_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem_type,
                       const void *elems, uint64_t n, struct err *e);
int gguf_writer_kv_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
                           uint64_t n, struct err *e);
/* A value already encoded in GGUF form (e.g. nested arrays). */
int gguf_writer_kv_raw(struct gguf_writer *w, const char *key, enum gguf_vtype type,
                       const void *bytes, size_t len, struct err *e);

/* ne is innermost first (ne[0] = cols). Any known ggml type id is accepted
 * so tests can write files cllm will refuse to load. */
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t ttype,
                           int n_dims, const uint64_t *ne, struct err *e);
int gguf_writer_open(struct gguf_writer *w, const char *path, struct err *e);
int gguf_writer_data(struct gguf_writer *w, const void *p, size_t n, struct err *e);
int gguf_writer_close(struct gguf_writer *w, struct err *e);

/* Encodes `cols` floats as one row of dtype dt (cols % 32 == 0 for Q8_0). */
void gguf_encode_row(enum dtype dt, const float *x, void *dst, int64_t cols);
/* Decodes one row of any cllm dtype to floats. */
void gguf_decode_row(enum dtype dt, const void *src, float *y, int64_t cols);

/* Writes m as a GGUF file of architecture m->cfg.arch with matrices in dt
 * (Q8_0 only where cols % 32 == 0, F32 elsewhere; norms and biases always
 * F32). For arch llama/mistral the q/k rows are stored in llama.cpp's
 * permuted order (interleaved RoPE); for qwen2/qwen3 in HF order. The rows
 * are reordered as needed from whatever m->cfg.rope_interleaved says. */
int gguf_write_model(const struct model *m, enum dtype dt, const char *path, struct err *e);

/* The same, but row `row` of every present tensor t of m (t points into m)
 * is produced by row_fn instead of being read from t->data; used to stream
 * generated weights without holding them in memory. */
typedef int (*gguf_row_fn)(void *ctx, const struct tensor *t, int64_t row, float *out);
int gguf_write_model_rows(const struct model *m, enum dtype dt, const char *path,
                          gguf_row_fn row_fn, void *ctx, struct err *e);

/* gguf_write_model_rows with flags: GGUF_WRITE_PLACEHOLDER_VOCAB adds a
 * SentencePiece-style vocabulary of placeholder pieces (<unk>, <s>, </s>,
 * the 256 byte pieces <0x00>..<0xFF>, then "t<id>"; needs vocab_size >=
 * 259) to a model that has none, so that llama.cpp, which loads no file
 * without one, runs it: tests/test_llamacpp.sh uses llama.cpp as the
 * oracle of the formats written here. */
#define GGUF_WRITE_PLACEHOLDER_VOCAB 1u
/* GGUF_WRITE_K_M, with dt Q4_K or Q5_K: llama.cpp's Q4_K_M / Q5_K_M mix,
 * the output matrix (or, tied, the embedding) and attn_v and ffn_down of
 * the layers given more bits (the first and last eighths, and every
 * third between) in Q6_K; the file type says so. Other dtypes: ignored. */
#define GGUF_WRITE_K_M 2u
int gguf_write_model_flags(const struct model *m, enum dtype dt, const char *path,
                           gguf_row_fn row_fn, void *ctx, unsigned flags, struct err *e);

#endif
