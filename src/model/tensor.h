/* tensor.h - a weight tensor as the model code sees it: dtype, 2-D shape and
 * a pointer into memory owned by whoever loaded it (usually an mmap). */
#ifndef CLLM_MODEL_TENSOR_H
#define CLLM_MODEL_TENSOR_H

#include <stddef.h>
#include <stdint.h>

enum dtype {
    DT_F32 = 0,
    DT_F16,
    DT_BF16,
    DT_Q8_0, /* GGUF Q8_0: blocks of 32 int8 with one f16 scale (34 bytes) */
    /* GGUF's other block formats (model/quant.h): read as llama.cpp reads
     * them, computed on the CPU as integer codes (backend/cpu/unpack.h);
     * kept together, Q4_0 first and Q3_K last (quant_is_low_bit) */
    DT_Q4_0, /* 32 4-bit values, one f16 scale (18 bytes) */
    DT_Q4_1, /* 32 4-bit values, f16 scale and minimum (20 bytes) */
    DT_Q5_0, /* 32 5-bit values, one f16 scale (22 bytes) */
    DT_Q5_1, /* 32 5-bit values, f16 scale and minimum (24 bytes) */
    DT_Q4_K, /* 256 4-bit values in 8 groups, 6-bit group scales and mins (144 bytes) */
    DT_Q5_K, /* 256 5-bit values in 8 groups, 6-bit group scales and mins (176 bytes) */
    DT_Q6_K, /* 256 6-bit values in 16 groups, 8-bit group scales (210 bytes) */
    DT_Q2_K, /* 256 2-bit values in 16 groups, 4-bit group scales and mins (84 bytes) */
    DT_Q3_K, /* 256 3-bit values in 16 groups, 6-bit group scales (110 bytes) */
    DT_COUNT
};

#define Q8_0_BLOCK 32

/* Layout of one Q8_0 block, byte-compatible with GGUF/ggml. */
struct block_q8_0 {
    uint16_t d; /* f16 scale */
    int8_t qs[Q8_0_BLOCK];
};

/* A matrix is rows x cols, row-major; rows is the output dimension of a
 * linear layer (PyTorch's [out_features, in_features]). A vector has rows=1.
 * data == NULL means "absent" (e.g. no q/k norm for this architecture). */
struct tensor {
    enum dtype dtype;
    int64_t rows, cols;
    const void *data;
};

const char *dtype_name(enum dtype t);
/* Elements of one block: 1 for f32/f16/bf16, 32 or 256 for the block
 * formats; a row's cols must be a multiple of it. */
int64_t dtype_block_elems(enum dtype t);
/* Bytes of one row of `cols` elements (a multiple of dtype_block_elems). */
size_t dtype_row_bytes(enum dtype t, int64_t cols);

static inline int tensor_present(const struct tensor *t) { return t->data != NULL; }

#endif
