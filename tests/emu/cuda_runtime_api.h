/* cuda_runtime_api.h - the two CUDA runtime types the kernel launchers'
 * declarations (src/backend/cuda/cuda_backend.h) name, so test_sample_emu
 * builds where the CUDA toolkit is not installed. Only on the emulation
 * test's include path. */
#ifndef CLLM_TESTS_EMU_CUDA_RUNTIME_API_H
#define CLLM_TESTS_EMU_CUDA_RUNTIME_API_H

typedef struct CUstream_st *cudaStream_t;
typedef int cudaError_t;

#endif
