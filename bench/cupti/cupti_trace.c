/* cupti_trace.c - a kernel timeline of any CUDA program, for machines
 * without Nsight Systems: loaded by the CUDA driver through
 * CUDA_INJECTION64_PATH, it records every kernel's start and end on the GPU
 * (CUPTI's concurrent-kernel activity, which does not serialize launches, so
 * programmatic dependent launches still overlap as they do untraced, and
 * kernels replayed from CUDA graphs are recorded one by one) and writes them
 * at exit as CSV: start_ns,end_ns,graph_id,blocks,name.
 *
 *   CUDA_INJECTION64_PATH=$PWD/libcllm_trace.so CLLM_TRACE_OUT=t.csv cllm bench ...
 *   python3 bench/trace_steps.py t.csv
 *
 * Measurement only: nothing in cllm links it. */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define BUF_BYTES (8u << 20)

static FILE *out;
static long n_kernels, n_dropped;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
    *buf = aligned_alloc(8, BUF_BYTES);
    *size = *buf ? BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                      size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(out, "%llu,%llu,%u,%lld,%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->graphId,
                (long long)k->gridX * k->gridY * k->gridZ, k->name ? k->name : "?");
        n_kernels++;
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
        n_dropped += (long)dropped;
    free(buf);
}

static void finish(void)
{
    cuptiActivityFlushAll(1);
    fclose(out);
    fprintf(stderr, "cupti_trace: %ld kernels recorded, %ld dropped\n", n_kernels, n_dropped);
}

/* Called by the CUDA driver when this library is CUDA_INJECTION64_PATH. */
__attribute__((visibility("default"))) int InitializeInjection(void)
{
    const char *path = getenv("CLLM_TRACE_OUT");
    out = fopen(path && *path ? path : "cupti_trace.csv", "w");
    if (!out) {
        perror("cupti_trace: open the output");
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "cupti_trace: CUPTI refused kernel tracing\n");
        return 0;
    }
    atexit(finish);
    return 1;
}
