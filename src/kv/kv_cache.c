/* kv_cache.c - the block pool and per-sequence block tables. */
#include "kv/kv_cache.h"

#include "backend/backend.h"
#include "kv/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

size_t kv_pool_bytes_per_block(int n_layers, int kv_dim, int block_size, int elt_bytes)
{
    return 2 * (size_t)n_layers * (size_t)kv_dim * (size_t)block_size * (size_t)elt_bytes;
}

size_t kv_pool_bytes(const struct kv_pool *p)
{
    return kv_pool_bytes_per_block(p->n_layers, p->kv_dim, p->block_size, p->elt_bytes) *
           (size_t)p->n_blocks;
}

int kv_pool_init(struct kv_pool *p, struct backend *be, int n_layers, int n_kv_heads, int head_dim,
                 int block_size, int n_blocks, struct err *e)
{
    memset(p, 0, sizeof *p);
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || block_size <= 0 || n_blocks <= 0)
        return err_set(e, "kv pool: invalid geometry");
    const int kv_dim = n_kv_heads * head_dim;
    p->dtype = backend_kv_dtype(be);
    p->elt_bytes = (int)dtype_row_bytes((enum dtype)p->dtype, 1);
    size_t per = (size_t)n_layers * kv_dim * block_size * (size_t)p->elt_bytes;
    p->be = be;
    p->k = be->ops->alloc(be, per * n_blocks);
    p->v = be->ops->alloc(be, per * n_blocks);
    p->free_list = malloc((size_t)n_blocks * sizeof(int));
    p->refcount = calloc((size_t)n_blocks, sizeof(int));
    if (!p->k || !p->v || !p->free_list || !p->refcount) {
        kv_pool_free(p);
        return err_set(e, "kv pool: out of %s memory for %d blocks (%zu MiB)", be->ops->name,
                       n_blocks, per * 2 * (size_t)n_blocks >> 20);
    }
    p->n_layers = n_layers;
    p->n_kv_heads = n_kv_heads;
    p->head_dim = head_dim;
    p->kv_dim = kv_dim;
    p->block_size = block_size;
    p->n_blocks = n_blocks;
    for (int i = 0; i < n_blocks; i++)
        p->free_list[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return 0;
}

void kv_pool_free(struct kv_pool *p)
{
    if (p->be) {
        if (p->k)
            p->be->ops->free(p->be, p->k);
        if (p->v)
            p->be->ops->free(p->be, p->v);
    }
    free(p->free_list);
    free(p->refcount);
    memset(p, 0, sizeof *p);
}

int kv_seq_reserve(struct kv_pool *p, struct kv_seq *s, int n_tokens, struct err *e)
{
    int need = (n_tokens + p->block_size - 1) / p->block_size;
    if (need <= s->n_blocks)
        return 0;
    if (need - s->n_blocks > p->n_free && p->pc)
        prefix_cache_evict(p->pc, need - s->n_blocks - p->n_free);
    if (need - s->n_blocks > p->n_free)
        return err_set(e, "kv cache full: %d tokens need %d more blocks, %d free (raise the "
                          "context/KV budget)", n_tokens, need - s->n_blocks, p->n_free);
    if (need > s->cap_blocks) {
        int cap = s->cap_blocks ? s->cap_blocks : 8;
        while (cap < need)
            cap *= 2;
        int *nb = realloc(s->blocks, (size_t)cap * sizeof(int));
        if (!nb)
            return err_set(e, "kv cache: out of memory");
        s->blocks = nb;
        s->cap_blocks = cap;
    }
    while (s->n_blocks < need) {
        int b = p->free_list[--p->n_free];
        p->refcount[b] = 1;
        s->blocks[s->n_blocks++] = b;
    }
    return 0;
}

void kv_seq_release(struct kv_pool *p, struct kv_seq *s)
{
    /* Deepest first, so a cached chain's tail is older in the LRU than its
     * head and goes first (an evicted parent orphans its children). */
    for (int i = s->n_blocks - 1; i >= 0; i--) {
        int b = s->blocks[i];
        int rc = --p->refcount[b];
        if (rc == 0)
            p->free_list[p->n_free++] = b;
        else if (rc == 1 && p->pc)
            prefix_cache_on_idle(p->pc, b);
    }
    if (p->pc)
        prefix_cache_trim(p->pc);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

int kv_seq_writable(const struct kv_pool *p, const struct kv_seq *s, int pos)
{
    int i = pos / p->block_size;
    if (i >= s->n_blocks)
        return 1; /* a fresh block from kv_seq_reserve */
    int b = s->blocks[i];
    return p->refcount[b] == 1 && !(p->pc && p->pc->indexed[b]);
}

int kv_block_io(struct kv_pool *p, int block, void *buf, bool to_host, struct err *e)
{
    size_t half = kv_pool_bytes_per_block(p->n_layers, p->kv_dim, p->block_size, p->elt_bytes) / 2;
    char *k = buf, *v = k + half;
    if (p->be->ops->kv_block_copy)
        return p->be->ops->kv_block_copy(p->be, p, block, k, v, to_host, e);
    if (backend_on_device(p->be))
        return err_set(e, "the %s backend cannot copy KV blocks to the host", p->be->ops->name);
    char *pk = (char *)p->k + (size_t)block * half, *pv = (char *)p->v + (size_t)block * half;
    if (to_host) {
        memcpy(k, pk, half);
        memcpy(v, pv, half);
    } else {
        memcpy(pk, k, half);
        memcpy(pv, v, half);
    }
    return 0;
}
