/* head_bound.h - the bound behind head_pick (backend.h), shared by the CPU
 * (cpu/head_pick.c) and CUDA (cuda/head_pick.cu) implementations so the
 * two hold the same derivation.
 *
 * Row r of the LM head's int8 copy is q_r = round(w_r / s_r), s_r =
 * max|w_r| / 127, and the input is held as int16, x ~ dx xq with dx =
 * max|x| / HEAD_XQ_MAX, so the integer dot product q_r . xq is exact and
 *
 *   a_r = s_r dx (q_r . xq)
 *
 * differs from the exact logit w_r . x by at most
 *
 *   e_r = s_r (t1 + tq sum|q_r|),  t1 = (1/2 + 1.6e-5 + 127.01 gamma) sum|x|,
 *                                  tq = (1/2 + 1e-3) dx,
 *
 * each weight being off by at most s_r (1/2 + 2^-16) (w x (1/s) rounds to
 * within a few ulps of w / s), each input by at most dx (1/2 + 2^-10), and
 * gamma covering an f32 sum of the exact logit in any order (the CPU's,
 * whose logits are its matmul's; 0 where the kept rows are summed in
 * double, CUDA's). Every factor carries (1 + 1e-6) for the rounding of
 * these sums themselves. a_r and e_r are kept as floats: e_r grows by
 * 2e-7 |a_r|, more than a_r's rounding, so a_r - e_r <= w_r . x <= a_r +
 * e_r still holds in floats. */
#ifndef CLLM_BACKEND_HEAD_BOUND_H
#define CLLM_BACKEND_HEAD_BOUND_H

#include <math.h>

#ifdef __CUDACC__
#define HEAD_BOUND_FN static __host__ __device__ __forceinline__
#else
#define HEAD_BOUND_FN static inline
#endif

/* The most rows head_pick keeps for a top-k draw (k > 1); past it the
 * caller reads the whole head. */
#define HEAD_PICK_MAX_K 64
#define HEAD_XQ_MAX 16383 /* |xq| at most this: 127 x 16383 x 2 fits int16 pairs' int32 sums */

/* t1 of e_r for an input with sum|x| = x1, and an f32 sum over cols
 * terms (sums = 1) or none (sums = 0). */
HEAD_BOUND_FN double head_bound_t1(double x1, int cols, int sums)
{
    const double u = 5.9604644775390625e-8; /* 2^-24 */
    const double gamma = sums ? cols * u / (1.0 - cols * u) : 0.0;
    return (0.5 + 1.6e-5 + 127.01 * gamma) * x1 * (1.0 + 1e-6);
}

/* tq of e_r for the input's step dx. */
HEAD_BOUND_FN double head_bound_tq(float dx) { return (0.5 + 1e-3) * (double)dx * (1.0 + 1e-6); }

/* e_r as the float kept beside a_r (a: a_r in double; s: s_r; qabs:
 * sum|q_r|). */
HEAD_BOUND_FN float head_bound_e(double a, double s, double t1, double tq, double qabs)
{
    return (float)((s * (t1 + tq * qabs) + 2e-7 * fabs(a)) * (1.0 + 1e-6));
}

#endif
