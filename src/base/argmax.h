/* argmax.h - the greedy pick every host path shares: the index of the
 * largest float, the lowest on ties (as torch.argmax); NaNs never win, 0
 * when every value is NaN. The device argmax kernels follow the same rule. */
#ifndef CLLM_BASE_ARGMAX_H
#define CLLM_BASE_ARGMAX_H

#include <math.h>

static inline int argmax_f32(const float *x, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best]))
            best = i;
    return best < 0 ? 0 : best;
}

#endif
