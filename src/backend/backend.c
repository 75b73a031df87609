/* backend.c - choosing a backend by name ("cpu", "cuda[:N]", "auto") and the
 * small helpers over the optional ops. The CUDA backend lives in a module
 * (libcllm_cuda.so, see backend/cuda/cuda_module.h) loaded with dlopen the
 * first time a CUDA device is asked for, so a CPU run never maps cudart or
 * cuBLAS; builds without CUDA get stubs that explain themselves. */
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

int backend_cuda_module_device_count(struct err *e)
{
    err_set(e, "this build has no CUDA backend");
    return -1;
}

const char *backend_cuda_module_path(void) { return NULL; }
#else
#include <dlfcn.h>
#include <glob.h>
#include <pthread.h>
#include <unistd.h>

#include "backend/cuda/cuda_module.h"

static pthread_once_t mod_once = PTHREAD_ONCE_INIT;
static const struct cllm_cuda_module *mod;
static char mod_path[4096];
static struct err mod_err;

static bool file_exists(const char *p) { return access(p, F_OK) == 0; }

/* Tries one candidate: 1 loaded, 0 absent, -1 present but unusable (mod_err
 * says why; the search stops there rather than hiding the reason). */
static int try_module(const char *path)
{
    if (!file_exists(path))
        return 0;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        err_set(&mod_err, "CUDA backend module %s cannot be loaded: %s", path, dlerror());
        return -1;
    }
    cllm_cuda_module_fn fn;
    void *sym = dlsym(h, CLLM_CUDA_MODULE_SYMBOL);
    memcpy(&fn, &sym, sizeof fn); /* object to function pointer, as POSIX allows */
    const struct cllm_cuda_module *m = fn ? fn() : NULL;
    if (!m || m->abi != CLLM_CUDA_MODULE_ABI || m->err_size != sizeof(struct err) ||
        m->ops_size != sizeof(struct backend_ops)) {
        err_set(&mod_err, "CUDA backend module %s is not one this cllm can use (%s); rebuild it "
                          "with the binary", path, !fn ? "no " CLLM_CUDA_MODULE_SYMBOL " entry"
                                                        : "built for another version");
        dlclose(h);
        return -1;
    }
    /* Never closed: the CUDA runtime does not take well to being unloaded. */
    mod = m;
    snprintf(mod_path, sizeof mod_path, "%s", path);
    return 1;
}

/* Loads $CLLM_CUDA_MODULE where it is set, and only that: a module named
 * on purpose (a measurement build beside the release) wins over the one
 * that came with the binary, and a missing one is an error, not a quiet
 * fallback to another. Else looks next to the executable, then at the
 * path the build wrote it to. */
static void load_module(void)
{
    const char *env = getenv("CLLM_CUDA_MODULE");
    if (env && *env) {
        if (try_module(env) == 0)
            err_set(&mod_err, "CUDA backend module %s (CLLM_CUDA_MODULE) not found; unset "
                              "CLLM_CUDA_MODULE to use the one next to cllm", env);
        return;
    }
    char cand[2][4096] = {{0}};
    int n = 0;
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(cand[n++], sizeof cand[0], "%s/%s", exe, CLLM_CUDA_MODULE_NAME);
        }
    }
#ifdef CLLM_CUDA_MODULE_PATH
    snprintf(cand[n++], sizeof cand[0], "%s", CLLM_CUDA_MODULE_PATH);
#endif
    char looked[2 * 4096 + 16] = "";
    for (int i = 0; i < n; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++)
            seen = seen || !strcmp(cand[i], cand[j]);
        if (seen)
            continue;
        int rc = try_module(cand[i]);
        if (rc != 0)
            return;
        size_t l = strlen(looked);
        snprintf(looked + l, sizeof looked - l, "%s%s", l ? ", " : "", cand[i]);
    }
    err_set(&mod_err, "CUDA backend module not found (looked in %s); set CLLM_CUDA_MODULE to the "
                      "path of " CLLM_CUDA_MODULE_NAME " or use --device cpu",
            n ? looked : "no place");
}

static const struct cllm_cuda_module *module_get(struct err *e)
{
    pthread_once(&mod_once, load_module);
    if (!mod)
        err_set(e, "%s", mod_err.msg);
    return mod;
}

/* Whether an NVIDIA driver is visible at all (device nodes, the driver's
 * proc entry, or WSL's /dev/dxg): "auto" asks this before paying for the
 * module and the CUDA libraries. */
static bool nvidia_present(void)
{
    if (file_exists("/proc/driver/nvidia") || file_exists("/dev/nvidiactl") ||
        file_exists("/dev/dxg"))
        return true;
    glob_t g;
    bool any = glob("/dev/nvidia[0-9]*", GLOB_NOSORT, NULL, &g) == 0 && g.gl_pathc > 0;
    globfree(&g);
    return any;
}

struct backend *backend_cuda_create(int device, struct err *e)
{
    const struct cllm_cuda_module *m = module_get(e);
    return m ? m->create(device, e) : NULL;
}

int backend_cuda_device_count(void)
{
    if (!nvidia_present())
        return 0;
    struct err e;
    const struct cllm_cuda_module *m = module_get(&e);
    return m ? m->device_count(&e) : 0;
}

int backend_cuda_module_device_count(struct err *e)
{
    const struct cllm_cuda_module *m = module_get(e);
    return m ? m->device_count(e) : -1;
}

const char *backend_cuda_module_path(void)
{
    pthread_once(&mod_once, load_module);
    return mod ? mod_path : NULL;
}
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

bool backend_on_device(const struct backend *be)
{
    return be->ops->mem_info != NULL;
}

int backend_kv_dtype(struct backend *be)
{
    return be->ops->kv_dtype ? be->ops->kv_dtype(be) : DT_F32;
}

void backend_set_compiled_decode(struct backend *be, int on)
{
    if (on && be->ops->set_compiled_decode)
        be->ops->set_compiled_decode(be, on > 0);
}

int backend_load_weights(struct backend *be, const struct model *m, struct err *e)
{
    return be->ops->load_weights ? be->ops->load_weights(be, m, e) : 0;
}

size_t backend_dev_free(struct backend *be)
{
    struct backend_mem bm = {0};
    if (!backend_on_device(be) || !be->ops->mem_info)
        return 0;
    be->ops->mem_info(be, &bm);
    return bm.dev_free;
}

size_t backend_dev_margin(size_t free)
{
    const size_t gib = (size_t)1 << 30;
    return free / 10 > gib ? free / 10 : gib;
}

int backend_load_spare(struct backend *be, const struct model *m, size_t free_before,
                       struct err *e)
{
    if (!be->ops->load_spare)
        return 0;
    const size_t now = backend_dev_free(be);
    const size_t keep = backend_dev_margin(free_before ? free_before : now);
    return be->ops->load_spare(be, m, now > keep ? now - keep : 0, e);
}

static double mib(size_t b) { return (double)b / (1024.0 * 1024.0); }

void backend_print_plan(struct backend *be, size_t kv_bytes, FILE *f)
{
    if (!backend_on_device(be))
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
