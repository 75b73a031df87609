/* tensor.c - dtype names and storage sizes. */
#include "model/tensor.h"

/* name, elements a block, bytes a block */
static const struct {
    const char *name;
    int64_t elems;
    size_t bytes;
} dtypes[DT_COUNT] = {
    [DT_F32] = {"f32", 1, 4},       [DT_F16] = {"f16", 1, 2},
    [DT_BF16] = {"bf16", 1, 2},     [DT_Q8_0] = {"q8_0", 32, 34},
    [DT_Q4_0] = {"q4_0", 32, 18},   [DT_Q4_1] = {"q4_1", 32, 20},
    [DT_Q5_0] = {"q5_0", 32, 22},   [DT_Q5_1] = {"q5_1", 32, 24},
    [DT_Q4_K] = {"q4_k", 256, 144}, [DT_Q5_K] = {"q5_k", 256, 176},
    [DT_Q6_K] = {"q6_k", 256, 210}, [DT_Q2_K] = {"q2_k", 256, 84},
    [DT_Q3_K] = {"q3_k", 256, 110},
};

const char *dtype_name(enum dtype t)
{
    return (unsigned)t < DT_COUNT ? dtypes[t].name : "?";
}

int64_t dtype_block_elems(enum dtype t)
{
    return (unsigned)t < DT_COUNT ? dtypes[t].elems : 1;
}

size_t dtype_row_bytes(enum dtype t, int64_t cols)
{
    if ((unsigned)t >= DT_COUNT)
        return 0;
    return (size_t)(cols / dtypes[t].elems) * dtypes[t].bytes;
}
