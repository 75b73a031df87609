/* row_split.h - how many blocks each row of a rows-at-once launch gets
 * (the greedy rows in kernels.cu, the sampler's preparation in sample.cu):
 * the caller's blocks shared out among the rows, each block at least
 * min_span of a row's n elements, at most `cap` blocks a row (0: no
 * bound), and at least one. */
#ifndef CLLM_CUDA_ROW_SPLIT_H
#define CLLM_CUDA_ROW_SPLIT_H

static inline int cuk_row_blocks(int blocks, int rows, int n, int min_span, int cap)
{
    const int most = (n + min_span - 1) / min_span;
    int per_row = blocks / rows;
    if (per_row > most)
        per_row = most;
    if (cap > 0 && per_row > cap)
        per_row = cap;
    return per_row < 1 ? 1 : per_row;
}

#endif
