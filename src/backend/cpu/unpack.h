/* unpack.h - GGUF's 2-6-bit block formats (model/quant.h: Q4_0, Q4_1,
 * Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) as one layout of unsigned integer codes
 * and per-16 scales, which the matmul's integer kernels multiply by
 * activations rounded to 8 bits (matmul_impl.h), as they do Q8_0's.
 *
 * Every format's value is s * u - m for a code u in 0..63 and a scale s
 * and min m shared by 16 values (Q4_0: s = d, m = 8 d; Q4_1: s = d,
 * m = -min; Q4_K: s = d sc, m = dmin mn, ggml's f32 products; Q6_K:
 * s = d sc, m = 32 s; Q2_K: s = d sc, m = dmin mn; Q3_K: s = d (sc - 32),
 * m = 4 s; the 5-bit ones likewise), so one kernel serves all.
 *
 * A row of cols values (a multiple of 32) is ceil(cols / 64) groups of
 * UNPACK_GROUP_BYTES bytes:
 *   u [64] uint8   codes of values 64g .. 64g + 63 (a missing half: zeros)
 *   s [16] f32     lane l (values 4l .. 4l + 3): its 16 values' s
 *   m [16] f32     likewise m
 * s and m stand once per four values, not once per 16, so that the
 * kernels read them straight into the lanes of their integer sums (a
 * 32-bit lane of a byte dot product sums four values).
 *
 * Built per instruction set like the attention's kernels (unpack_kern.h,
 * unpack_v3.c, unpack_v4.c); every build writes the reference's bytes. */
#ifndef CLLM_BACKEND_CPU_UNPACK_H
#define CLLM_BACKEND_CPU_UNPACK_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu_features.h"
#include "model/tensor.h"

#define UNPACK_GROUP 64
#define UNPACK_GROUP_BYTES 192

static inline size_t unpack_row_bytes(int64_t cols)
{
    return (size_t)((cols + UNPACK_GROUP - 1) / UNPACK_GROUP) * UNPACK_GROUP_BYTES;
}

/* The cols values of a row of dt at src into dst (unpack_row_bytes(cols)
 * bytes), in the layout above. */
typedef void (*cpu_unpack_fn)(enum dtype dt, const void *src, uint8_t *dst, int64_t cols);

/* The portable build, the reference of the others. */
void cpu_unpack_ref(enum dtype dt, const void *src, uint8_t *dst, int64_t cols);

/* The build for isa (the best at or below it). In unpack.c, built for the
 * baseline ISA: every CPU calls it. */
cpu_unpack_fn cpu_unpack_for(enum cpu_isa isa);

#endif
