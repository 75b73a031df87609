/* backend.h - the op set model code is written against. A backend (CPU now,
 * CUDA next) implements every op; model/ never knows which one runs.
 * Activation pointers are backend memory (host memory for the CPU backend,
 * device memory for CUDA), obtained from backend_alloc. */
#ifndef CLLM_BACKEND_BACKEND_H
#define CLLM_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"
#include "kv/kv_cache.h"
#include "model/tensor.h"

struct backend;

/* Geometry of one attention call: n query tokens of one sequence at
 * positions pos0 .. pos0+n-1, attending causally to the sequence's cache. */
struct attn_args {
    int n, pos0;
    int n_heads, n_kv_heads, head_dim;
    int sliding_window; /* 0 = unlimited */
    float scale;        /* usually 1/sqrt(head_dim) */
};

struct backend_ops {
    const char *name;
    void (*destroy)(struct backend *be);
    void *(*alloc)(struct backend *be, size_t bytes);
    void (*free)(struct backend *be, void *p);
    /* Copies n floats of backend memory to the host. */
    void (*download)(struct backend *be, float *dst, const float *src, size_t n);

    /* out[i][:] = row ids[i] of table (any dtype) as f32. */
    void (*embed)(struct backend *be, float *out, const struct tensor *table, const int *ids, int n);
    /* out[n][w->rows] = x[n][w->cols] . W^T */
    int (*matmul)(struct backend *be, float *out, const float *x, int n, const struct tensor *w,
                  struct err *e);
    /* Row-wise RMSNorm of n rows of dim: out = x / rms(x) * w (w is f32). */
    void (*rmsnorm)(struct backend *be, float *out, const float *x, const float *w, int n, int dim,
                    float eps);
    /* x[n][dim] += b[dim] */
    void (*add_bias)(struct backend *be, float *x, const float *b, int n, int dim);
    /* Rotates n rows of n_heads*head_dim in place; position of row i is
     * pos0+i; inv_freq has head_dim/2 entries (scaling already applied). */
    void (*rope)(struct backend *be, float *x, int n, int n_heads, int head_dim, int pos0,
                 const float *inv_freq, bool interleaved);
    /* Writes k/v rows [n][kv_dim] for positions pos0.. into the cache. */
    void (*kv_store)(struct backend *be, struct kv_pool *pool, const struct kv_seq *seq, int layer,
                     const float *k, const float *v, int n, int pos0);
    /* out[n][n_heads*head_dim] = softmax(q k^T * scale) v over the cache. */
    int (*attention)(struct backend *be, float *out, const float *q, const struct kv_pool *pool,
                     const struct kv_seq *seq, int layer, const struct attn_args *a, struct err *e);
    /* gate[i] = silu(gate[i]) * up[i] */
    void (*silu_mul)(struct backend *be, float *gate, const float *up, size_t n);
    /* x[i] += y[i] */
    void (*add)(struct backend *be, float *x, const float *y, size_t n);
};

struct backend {
    const struct backend_ops *ops;
    void *impl;
};

/* n_threads <= 0: all online CPUs. */
struct backend *backend_cpu_create(int n_threads, struct err *e);
void backend_destroy(struct backend *be);

#endif
