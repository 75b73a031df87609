/* attention_base.c - the attention kernels built for the build's own
 * target (on x86-64 the baseline, SSE2; elsewhere, e.g. NEON on arm64,
 * whatever the compiler targets): the ones every CPU can run. */
#define ATT_KERNELS att_kernels_base
#include "backend/cpu/attention_kern.h"
