/* bench_gemm_tc - times cuk_gemm_tc (the tensor-core GEMM of batched
 * decode steps) on the matrices of a Llama-3.1-8B and a Qwen3-0.6B decode
 * layer in bf16, for n = 2..64 tokens, against cuBLAS (cublasGemmEx, the
 * same bf16 operands and f32 output) and, up to CUK_MMA_MAX_N tokens, the
 * tensor-core GEMV of batched steps (cuk_gemv_mma, under programmatic
 * dependent launch as decode runs it; --mma-ks N,... times it with each
 * column-slice count, 0 = its own choice; --mma-in rmsnorm gives it the
 * norm's input op as q/k/v and gate/up have it, --stage-regs stages x
 * through registers), and prints µs per call and the
 * weight bandwidth as a % of --bw. Each timed matrix cycles through
 * enough copies (>= 256 MB) that the weights do not stay in L2; calls
 * replay in a CUDA graph, as a decode step does.
 *
 *   bench_gemm_tc [--bw BYTES_PER_S] [--reps N] [--n N,...] [--smem BYTES] [--ctas 1|2]
 *                 [--mma-ks N,...] [--mma-in x|rmsnorm] [--stage-regs]
 *
 * --ctas 2 launches two blocks per SM (with --smem at most half of it).
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "bench_cuda.cuh"
#include "model/tensor.h"

struct mshape {
    const char *name;
    int rows, cols;
};

int main(int argc, char **argv)
{
    double bw = 4.26e12;
    int reps = 20, smem = 0, ctas = 1, ns[16] = {2, 4, 8, 16, 32, 64}, nn = 6;
    int mks[8] = {0}, nmks = 1, mma_norm = 0, stage_regs = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bw") && i + 1 < argc)
            bw = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctas") && i + 1 < argc)
            ctas = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--smem") && i + 1 < argc)
            smem = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--n") && i + 1 < argc) {
            nn = 0;
            for (char *t = strtok(argv[++i], ","); t && nn < 16; t = strtok(NULL, ","))
                ns[nn++] = atoi(t);
        } else if (!strcmp(argv[i], "--mma-in") && i + 1 < argc &&
                   (!strcmp(argv[i + 1], "x") || !strcmp(argv[i + 1], "rmsnorm"))) {
            mma_norm = !strcmp(argv[++i], "rmsnorm");
        } else if (!strcmp(argv[i], "--stage-regs")) {
            stage_regs = 1;
        } else if (!strcmp(argv[i], "--mma-ks") && i + 1 < argc) {
            nmks = 0;
            for (char *t = strtok(argv[++i], ","); t && nmks < 8; t = strtok(NULL, ","))
                mks[nmks++] = atoi(t);
        } else {
            fprintf(stderr, "usage: bench_gemm_tc [--bw B] [--reps N] [--n N,...] [--smem B] "
                            "[--ctas 1|2] [--mma-ks N,...] [--mma-in x|rmsnorm] [--stage-regs]\n");
            return 2;
        }
    }
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    struct cuk_mma_cfg mcfg = {};
    mcfg.n_sms = sms;
    mcfg.stage_regs = stage_regs;
    CK(cudaDeviceGetAttribute(&mcfg.smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CK(cudaDeviceGetAttribute(&mcfg.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    void *ws;
    size_t wsb = cuk_gemm_tc_ws_bytes(2 * sms);
    CK(cudaMalloc(&ws, wsb));
    CK(cudaMemset(ws, 0, wsb));
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS)
        return 1;
    const struct mshape shapes[] = {
        {"8B q/k/v", 6144, 4096}, {"8B o", 4096, 4096},          {"8B gate", 14336, 4096},
        {"8B down", 4096, 14336}, {"0.6B q/k/v", 4096, 1024},    {"0.6B o", 1024, 2048},
        {"0.6B gate", 3072, 1024}, {"0.6B down", 1024, 3072},
    };
    uint16_t *x;
    float *out, *xf;
    CK(cudaMalloc(&x, (size_t)64 * 14336 * 2));
    CK(cudaMalloc(&xf, (size_t)64 * 14336 * 4));
    CK(cudaMalloc(&out, (size_t)64 * 14336 * 4));
    k_fill_bf16<<<256, 256>>>(x, (size_t)64 * 14336, 99, 1.0f);
    k_fill_f32<<<256, 256>>>(xf, (size_t)64 * 14336, 98);
    printf("%-12s %4s %10s %8s %10s %8s", "matrix", "n", "tc us", "tc %", "cuBLAS us", "%");
    for (int i = 0; i < nmks; i++)
        printf("  mma ks=%-2d %%", mks[i]);
    printf("\n");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct mshape sh = shapes[si];
        size_t bytes = (size_t)sh.rows * sh.cols * 2;
        int copies = (int)((256u << 20) / bytes) + 1;
        uint16_t **w = (uint16_t **)malloc(copies * sizeof *w);
        for (int c = 0; c < copies; c++) {
            CK(cudaMalloc(&w[c], bytes));
            k_fill_bf16<<<1024, 256>>>(w[c], bytes / 2, 1234 + c, 0.02f);
        }
        CK(cudaDeviceSynchronize());
        for (int ni = 0; ni < nn; ni++) {
            int n = ns[ni];
            const struct cuk_tc_cfg cfg = {.smem_bytes = smem};
            double us[2];
            us[0] = time_graph(3, reps, copies, [&](cudaStream_t s, int c) {
                CK(cuk_gemm_tc(s, out, sh.rows, w[c], DT_BF16, x, sh.rows, n, sh.cols, 0, ws,
                               sms * ctas, &cfg));
            });
            us[1] = time_graph(3, reps, copies, [&](cudaStream_t s, int c) {
                const float one = 1.0f, zero = 0.0f;
                if (cublasSetStream(blas, s) != CUBLAS_STATUS_SUCCESS ||
                    cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.rows, n, sh.cols, &one, w[c],
                                 CUDA_R_16BF, sh.cols, x, CUDA_R_16BF, sh.cols, &zero, out,
                                 CUDA_R_32F, sh.rows, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
                    fprintf(stderr, "cuBLAS failed\n");
                    exit(1);
                }
            });
            double floor_us = bytes / bw * 1e6;
            printf("%-12s %4d %10.2f %7.1f%% %10.2f %7.1f%%", sh.name, n, us[0],
                   100 * floor_us / us[0], us[1], 100 * floor_us / us[1]);
            for (int i = 0; i < nmks && n <= CUK_MMA_MAX_N; i++) {
                struct cuk_mma_cfg mc = mcfg;
                mc.ks = mks[i];
                struct cuk_gemv_in in = {};
                in.kind = mma_norm ? CUK_IN_RMSNORM : CUK_IN_X;
                in.x = xf;
                in.nw = xf + (size_t)32 * 14336; /* rows no call reads as x */
                in.eps = 1e-6f;
                struct cuk_weight w0 = {DT_BF16, sh.rows, sh.cols, w[0], NULL};
                const struct cuk_weight *w0p = &w0;
                cudaError_t e = cuk_gemv_mma(0, &out, &in, n, &w0p, 1, CUK_OUT_STORE, &mc);
                if (e == cudaErrorNotSupported) {
                    printf(" %14s", "declined");
                    continue;
                }
                CK(e);
                cuk_set_pdl(1);
                double u = time_graph(3, reps, copies, [&](cudaStream_t s, int c) {
                    struct cuk_weight wt = {DT_BF16, sh.rows, sh.cols, w[c], NULL};
                    const struct cuk_weight *wp = &wt;
                    CK(cuk_gemv_mma(s, &out, &in, n, &wp, 1, CUK_OUT_STORE, &mc));
                });
                cuk_set_pdl(0);
                printf(" %8.2f %5.1f%%", u, 100 * floor_us / u);
            }
            printf("\n");
        }
        for (int c = 0; c < copies; c++)
            cudaFree(w[c]);
        free(w);
    }
    return 0;
}
