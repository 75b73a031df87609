/* tensor.c - dtype names and storage sizes. */
#include "model/tensor.h"

const char *dtype_name(enum dtype t)
{
    switch (t) {
    case DT_F32: return "f32";
    case DT_F16: return "f16";
    case DT_BF16: return "bf16";
    case DT_Q8_0: return "q8_0";
    default: return "?";
    }
}

size_t dtype_row_bytes(enum dtype t, int64_t cols)
{
    switch (t) {
    case DT_F32: return (size_t)cols * 4;
    case DT_F16:
    case DT_BF16: return (size_t)cols * 2;
    case DT_Q8_0: return (size_t)(cols / Q8_0_BLOCK) * sizeof(struct block_q8_0);
    default: return 0;
    }
}
