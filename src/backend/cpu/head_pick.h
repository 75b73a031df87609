/* head_pick.h - the CPU backend's head_pick (backend.h): a greedy step's
 * LM head read as an int8 copy that rules rows out, then the rows it
 * cannot rule out computed exactly, as cpu_matmul computes every row.
 *
 * Row r of the copy is q_r = round(w_r / s_r), s_r = max|w_r| / 127, so
 * the copy's logit a_r = s_r (q_r . x) is within e_r of the exact one, e_r
 * a worst-case bound (backend/head_bound.h: each weight off by at most
 * s_r / 2, the input held as int16, and the float rounding of the exact
 * logit's sum, whatever its order). The exact argmax is then
 * among the rows with a_r + e_r >= max_r (a_r - e_r): a step reads half
 * the head's bf16 bytes (a quarter of f32's) and a few rows of the head
 * itself. */
#ifndef CLLM_BACKEND_CPU_HEAD_PICK_H
#define CLLM_BACKEND_CPU_HEAD_PICK_H

#include <stdint.h>

#include "backend/cpu/matmul.h"

/* The copy of one head, made on first use; zeroed = none. */
struct head_screen {
    const void *data; /* the head it was made from */
    int64_t rows, cols;
    int8_t *q;          /* rows x cols */
    float *scale;       /* s_r */
    float *qabs;        /* sum_i |q_ri| (the input's rounding term of e_r) */
    float *approx;      /* per row: a_r (scratch) */
    float *bound;       /* per row: e_r (scratch) */
    int16_t *xq;        /* the input as int16 (scratch) */
    double *lo;         /* per pool thread: its rows' k largest a_r - e_r */
};

/* logits[head->rows] = x . headᵀ where it matters for a pick among the k
 * largest (1..HEAD_PICK_MAX_K; 1: greedy): exact (cpu_matmul's bits) at
 * every row the copy cannot rule out of the k largest, and -INFINITY
 * elsewhere, so argmax_f32 over logits picks the row it picks over the
 * full product, and the k largest are the full product's. Returns 0; 1
 * when it does not take this head or k
 * (not f32, f16 or bf16; more columns than it holds exactly; a weight or
 * an input that is not finite; no memory for the copy) and the caller
 * computes the full product; -1 with a message when cpu_matmul fails.
 * Makes hs's copy when hs holds another head's. */
int head_screen_pick(struct head_screen *hs, struct cpu_matmul *mm, float *logits, const float *x,
                     const struct tensor *head, int k, struct err *e);

void head_screen_free(struct head_screen *hs);

#endif
