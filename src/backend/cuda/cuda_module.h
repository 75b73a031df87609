/* cuda_module.h - the one entry point of the CUDA backend module
 * (libcllm_cuda.so: the kernels and host C files of src/backend/cuda, linked against
 * cudart/cuBLAS). The cllm binary and the tests do not link CUDA; backend.c
 * dlopens the module only when a CUDA device is asked for and calls
 * CLLM_CUDA_MODULE_SYMBOL to get this table. The module carries its own copy
 * of the few cllmcore helpers it uses (err_set, dtype_*) and exports nothing
 * else, so it works with any executable, exported symbols or not. */
#ifndef CLLM_BACKEND_CUDA_CUDA_MODULE_H
#define CLLM_BACKEND_CUDA_CUDA_MODULE_H

#include <stddef.h>

#include "backend/backend.h"

/* Bump when struct cllm_cuda_module or anything the module shares with the
 * executable (struct backend_ops, struct model, the KV structs) changes
 * incompatibly; the sizes below catch the commonest accidents too. */
#define CLLM_CUDA_MODULE_ABI 6
#define CLLM_CUDA_MODULE_NAME "libcllm_cuda.so"
#define CLLM_CUDA_MODULE_SYMBOL "cllm_cuda_module"

struct cllm_cuda_module {
    int abi;                 /* CLLM_CUDA_MODULE_ABI the module was built with */
    size_t err_size;         /* sizeof(struct err) */
    size_t ops_size;         /* sizeof(struct backend_ops) */
    /* Devices the driver reports; 0 with e set (the driver's reason) when
     * there are none or the driver cannot be used. */
    int (*device_count)(struct err *e);
    /* The backend on GPU `device`, or NULL with e set. */
    struct backend *(*create)(int device, struct err *e);
};

typedef const struct cllm_cuda_module *(*cllm_cuda_module_fn)(void);

/* Defined by the module (default visibility; everything else is hidden). */
const struct cllm_cuda_module *cllm_cuda_module(void);

#endif
