/* quant.h - GGUF's block formats besides Q8_0 (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): their rows widened to f32 with llama.cpp's arithmetic,
 * so a file's weights mean here what they mean there, and a plain
 * quantizer for each, for test and benchmark models (not llama.cpp's
 * error-minimizing search: valid blocks, not the best ones). */
#ifndef CLLM_MODEL_QUANT_H
#define CLLM_MODEL_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "model/tensor.h"

/* Whether dt is one of the formats below (Q8_0 is not: it has kernels of
 * its own, backend/cpu/matmul.h). */
bool quant_is_low_bit(enum dtype dt);

/* The n values (a multiple of dtype_block_elems(dt)) of a row of any
 * dtype at src as f32 into y: the one widening every reader of rows uses
 * (the embedding, the matmul's reference, the head's screen, the GGUF
 * writer). */
void quant_dequantize_row(enum dtype dt, const void *src, float *y, int64_t n);

/* The n values of x (a multiple of dtype_block_elems(dt)) as blocks of dt
 * at dst (dtype_row_bytes(dt, n) bytes). */
void quant_quantize_row(enum dtype dt, const float *x, void *dst, int64_t n);

#endif
