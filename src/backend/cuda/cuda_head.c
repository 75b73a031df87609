/* cuda_head.c - the CUDA backend's head_pick: the LM head's int8 copy,
 * made at load (unless CLLM_CUDA_HEAD_SCREEN=0), and a greedy step's head
 * screened by it (the kernels: head_pick.cu). */
#include <stdio.h>

#include "backend/cuda/cuda_internal.h"

/* Byte offsets of the copy's parts in its one allocation. */
struct head_layout {
    size_t scale, qabs, ab, ws, total;
};

static size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

static struct head_layout head_layout(size_t rows, size_t cols)
{
    struct head_layout l;
    l.scale = up256(rows * cols);
    l.qabs = l.scale + up256(rows * 4);
    l.ab = l.qabs + up256(rows * 4);
    l.ws = l.ab + up256(rows * 8);
    l.total = l.ws + 256; /* ws: L and the blocks' counter; then the quantizer's flag */
    return l;
}

static bool head_takes(const struct tensor *t)
{
    return t->data && (t->dtype == DT_F32 || t->dtype == DT_F16 || t->dtype == DT_BF16) &&
           t->cols % 16 == 0 && t->cols <= CUK_HEAD_MAX_COLS && t->rows >= 2 &&
           t->rows <= INT32_MAX;
}

size_t cu_head_bytes(const struct cuda_backend *c, const struct model *m)
{
    if (!c->ops.head_pick || !head_takes(&m->lm_head))
        return 0;
    return head_layout((size_t)m->lm_head.rows, (size_t)m->lm_head.cols).total;
}

void cu_head_free(struct cuda_backend *c)
{
    if (c->head_mem)
        cudaFree(c->head_mem);
    c->head_mem = NULL;
    c->head_host = NULL;
}

int cu_head_load(struct cuda_backend *c, const struct model *m, struct err *e)
{
    const struct tensor *t = &m->lm_head;
    if (!cu_head_bytes(c, m)) {
        c->ops.head_pick = NULL; /* nothing to screen with: the full head */
        return 0;
    }
    const struct cuk_weight *w = dev_weight(c, t, "head_pick");
    if (!w)
        return sticky(c, e);
    const struct head_layout l = head_layout((size_t)t->rows, (size_t)t->cols);
    cudaError_t err = cudaMalloc(&c->head_mem, l.total);
    if (err != cudaSuccess) {
        c->head_mem = NULL;
        return err_set(e,
                       "%s: the LM head's int8 copy (%.1f MiB; CLLM_CUDA_HEAD_SCREEN=0 skips it): %s",
                       c->name, l.total / 1048576.0, cudaGetErrorString(err));
    }
    char *b = c->head_mem;
    c->head = (struct cuk_head_copy){.q = (int8_t *)b, .scale = (float *)(b + l.scale),
                                     .qabs = (float *)(b + l.qabs), .ab = (float *)(b + l.ab),
                                     .ws = (unsigned *)(b + l.ws), .rows = (int)t->rows,
                                     .cols = (int)t->cols};
    unsigned *bad = c->head.ws + 2, h_bad = 0;
    if ((err = cudaMemsetAsync(c->head.ws, 0, 256, c->stream)) != cudaSuccess ||
        (err = cuk_head_quant(c->stream, &c->head, w, bad)) != cudaSuccess ||
        (err = cudaMemcpyAsync(&h_bad, bad, sizeof h_bad, cudaMemcpyDeviceToHost, c->stream)) !=
            cudaSuccess ||
        (err = cudaStreamSynchronize(c->stream)) != cudaSuccess) {
        cu_head_free(c);
        return err_set(e, "%s: making the LM head's int8 copy: %s", c->name,
                       cudaGetErrorString(err));
    }
    if (h_bad) { /* a weight that is not finite: no bound holds */
        cu_head_free(c);
        c->ops.head_pick = NULL;
        fprintf(stderr, "%s: the LM head has weights that are not finite; greedy steps read "
                        "all of it\n", c->name);
        return 0;
    }
    c->head_host = t->data;
    c->weight_bytes += l.total;
    fprintf(stderr, "%s: greedy steps screen the LM head with an int8 copy (%.1f MiB)\n", c->name,
            l.total / 1048576.0);
    return 0;
}

int cu_head_pick(struct backend *be, float *logits, const float *x, const struct tensor *head,
                 int k, struct err *e)
{
    struct cuda_backend *c = op_begin(be);
    if (!c->head_mem || head->data != c->head_host || k != 1) /* greedy picks only */
        return 1;
    const struct cuk_weight *w = dev_weight(c, head, "head_pick");
    if (!w || sticky(c, e))
        return -1;
    if (fail_cuda(c, "head_pick", cuk_head_pick(c->stream, &c->head, w, x, logits, c->n_sms)))
        return sticky(c, e);
    return 0;
}
