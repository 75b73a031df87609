/* widen.h - GGUF's 4-6-bit block formats (model/quant.h) widened to f32 by
 * code built for the CPU's instruction set (widen_v3.c, widen_v4.c; the
 * reference build elsewhere), for the matmul's widened path. Every build
 * gives the same bits as quant_dequantize_row. */
#ifndef CLLM_BACKEND_CPU_WIDEN_H
#define CLLM_BACKEND_CPU_WIDEN_H

#include <stdint.h>

#include "backend/cpu/cpu_features.h"
#include "model/tensor.h"

typedef void (*cpu_widen_fn)(enum dtype dt, const void *src, float *y, int64_t n);

/* The widening for isa (what the CPU runs; the best build at or below it).
 * In widen.c, built for the baseline ISA: every CPU calls it. */
cpu_widen_fn cpu_widen_for(enum cpu_isa isa);

#endif
