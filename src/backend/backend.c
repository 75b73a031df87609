/* backend.c - choosing a backend by name ("cpu", "cuda[:N]", "auto") and the
 * small helpers over the optional ops; the CUDA entry points are stubs that
 * explain themselves when the build has no CUDA backend. */
#include "backend/backend.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifndef CLLM_HAVE_CUDA
struct backend *backend_cuda_create(int device, struct err *e)
{
    (void)device;
    err_set(e, "this build has no CUDA backend (nvcc was not found when it was configured, or "
               "CLLM_NO_CUDA or CLLM_SANITIZE was set); rebuild with the CUDA toolkit or use "
               "--device cpu");
    return NULL;
}

int backend_cuda_device_count(void) { return 0; }
#endif

struct backend *backend_create(const char *device, int n_threads, struct err *e)
{
    if (!device || !strcmp(device, "cpu"))
        return backend_cpu_create(n_threads, e);
    if (!strcmp(device, "auto"))
        return backend_cuda_device_count() > 0 ? backend_cuda_create(0, e)
                                               : backend_cpu_create(n_threads, e);
    if (!strncmp(device, "cuda", 4) && (device[4] == 0 || device[4] == ':')) {
        long n = 0;
        if (device[4] == ':') {
            char *end;
            errno = 0;
            n = strtol(device + 5, &end, 10);
            if (errno || end == device + 5 || *end || n < 0 || n > 1023) {
                err_set(e, "device \"%s\": expected cuda:N with N a GPU index", device);
                return NULL;
            }
        }
        return backend_cuda_create((int)n, e);
    }
    err_set(e, "unknown device \"%s\" (expected cpu, cuda, cuda:N or auto)", device);
    return NULL;
}

void backend_upload(struct backend *be, void *dst, const void *src, size_t bytes)
{
    if (be->ops->upload)
        be->ops->upload(be, dst, src, bytes);
    else
        memcpy(dst, src, bytes);
}

int backend_load_weights(struct backend *be, const struct model *m, struct err *e)
{
    return be->ops->load_weights ? be->ops->load_weights(be, m, e) : 0;
}

static double mib(size_t b) { return (double)b / (1024.0 * 1024.0); }

void backend_print_plan(struct backend *be, size_t kv_bytes, FILE *f)
{
    if (!be->ops->mem_info)
        return;
    struct backend_mem mi;
    memset(&mi, 0, sizeof mi);
    be->ops->mem_info(be, &mi);
    size_t act = mi.allocated > kv_bytes ? mi.allocated - kv_bytes : 0;
    fprintf(f,
            "%s memory plan: weights %.1f MiB, activations %.1f MiB, KV %.1f MiB, scratch "
            "%.1f MiB; %.0f of %.0f MiB free\n",
            mi.device, mib(mi.weights), mib(act), mib(kv_bytes), mib(mi.scratch), mib(mi.dev_free),
            mib(mi.dev_total));
}
