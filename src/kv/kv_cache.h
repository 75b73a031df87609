/* kv_cache.h - paged key/value storage: a pool of fixed-size blocks, each
 * holding block_size token slots for every layer, and per-sequence block
 * tables. Sequences map logical positions to (block, slot); the batching
 * scheduler and the prefix index will share blocks through refcounts. */
#ifndef CLLM_KV_KV_CACHE_H
#define CLLM_KV_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"

struct backend;
struct prefix_cache;

/* K/V storage (k, v) is backend memory, allocated through the backend given
 * to kv_pool_init (device memory for CUDA); block tables, refcounts and the
 * free list are host memory. Backends that cannot read host block tables
 * copy seq->blocks to the device when it changes. */
struct kv_pool {
    struct backend *be; /* owner of k and v */
    int n_layers;
    int n_kv_heads, head_dim;
    int kv_dim;      /* n_kv_heads * head_dim */
    int block_size;  /* tokens per block */
    int n_blocks;
    int dtype;       /* enum dtype of the elements: DT_F32, or DT_BF16 where the
                      * backend stores K/V in bf16 (backend_kv_dtype) */
    int elt_bytes;   /* bytes per element */
    /* The elements' layout is the backend's: the CPU's V is kv_offset's,
     * [n_blocks][n_layers][n_kv_heads][block_size][head_dim], its K the same
     * with each panel of positions transposed (kv_k_offset); CUDA's is cuk_kv_row's
     * (src/backend/cuda/cuda_common.cuh). */
    void *k, *v;
    int *free_list;  /* stack of free block ids */
    int n_free;
    int *refcount;
    struct prefix_cache *pc; /* the prefix index, or NULL (see prefix_cache.h) */
};

struct kv_seq {
    int *blocks;     /* logical block i -> pool block id */
    int n_blocks, cap_blocks;
    int n_tokens;    /* positions [0, n_tokens) hold valid K/V */
};

/* The element type is the backend's choice (backend_kv_dtype). */
int kv_pool_init(struct kv_pool *p, struct backend *be, int n_layers, int n_kv_heads, int head_dim,
                 int block_size, int n_blocks, struct err *e);
/* Frees k/v through the backend they came from; call it before
 * backend_destroy. A zeroed pool is fine. */
void kv_pool_free(struct kv_pool *p);
/* Bytes of K/V storage the pool holds. */
size_t kv_pool_bytes(const struct kv_pool *p);
size_t kv_pool_bytes_per_block(int n_layers, int kv_dim, int block_size, int elt_bytes);

/* Makes sure the sequence has blocks for positions [0, n_tokens). When the
 * free list runs dry it evicts idle prefix-cache blocks (LRU first). Fails
 * with a message (never aborts) when the pool is exhausted. */
int kv_seq_reserve(struct kv_pool *p, struct kv_seq *s, int n_tokens, struct err *e);
/* Drops the sequence's references; its blocks return to the pool at zero.
 * Blocks the prefix index still holds stay cached (idle, in its LRU). */
void kv_seq_release(struct kv_pool *p, struct kv_seq *s);

/* True when position pos of the sequence may be written: its block is held
 * by this sequence alone (shared/indexed blocks are read-only). */
int kv_seq_writable(const struct kv_pool *p, const struct kv_seq *s, int pos);

/* Copies a pool block's K/V (every layer; kv_pool_bytes_per_block bytes:
 * K's half, then V's) to the host buffer (to_host) or from it, in the
 * backend's layout. -1 with a message when the backend cannot. */
int kv_block_io(struct kv_pool *p, int block, void *buf, bool to_host, struct err *e);

/* The CPU backend's element offset of V's row (layer, pos, KV head kvh): a
 * block holds each layer's rows head by head, [n_layers][n_kv_heads]
 * [block_size][head_dim], so a head's rows of a block lie together (8 KB
 * in f32 at head_dim 128), read in order by the attention of one head. */
static inline size_t kv_offset(const struct kv_pool *p, const struct kv_seq *s, int layer, int pos,
                               int kvh)
{
    int blk = s->blocks[pos / p->block_size];
    return ((((size_t)blk * (size_t)p->n_layers + (size_t)layer) * (size_t)p->n_kv_heads +
             (size_t)kvh) * (size_t)p->block_size + (size_t)(pos % p->block_size)) *
           (size_t)p->head_dim;
}

/* Positions per K panel on the CPU: 16, or the block size below that. */
static inline int kv_panel(const struct kv_pool *p)
{
    return p->block_size < 16 ? p->block_size : 16;
}

/* The CPU backend's element offset of K's (layer, pos, kvh, d = 0); element
 * d lies kv_panel(p) * d further. K is kept transposed in panels of
 * kv_panel positions, [head_dim][panel] each, where V has rows: the
 * scores of a panel's keys are then vectors over keys, one multiply-add
 * per dimension, with no sum across a vector's lanes (docs/design.md). A
 * panel takes the place of its positions' rows in kv_offset's layout. */
static inline size_t kv_k_offset(const struct kv_pool *p, const struct kv_seq *s, int layer,
                                 int pos, int kvh)
{
    int pw = kv_panel(p);
    return kv_offset(p, s, layer, pos - pos % pw, kvh) + (size_t)(pos % pw);
}

#endif
