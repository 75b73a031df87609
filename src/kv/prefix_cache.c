/* prefix_cache.c - chain-keyed index of full KV blocks with an LRU of idle
 * blocks (see prefix_cache.h for the contract). */
#include "kv/prefix_cache.h"

#include "kv/kv_disk.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

uint64_t prefix_hash_bytes(const void *p, size_t n) { return XXH3_64bits(p, n); }

uint64_t prefix_block_key(uint64_t parent_key, const int *tokens, int block_size)
{
    /* Token ids are hashed as little-endian 32-bit integers so keys do not
     * depend on the host's int layout (they will name SSD-tier files). */
    uint32_t buf[64];
    XXH3_state_t st;
    XXH3_64bits_reset_withSeed(&st, parent_key);
    for (int i = 0; i < block_size;) {
        int k = 0;
        for (; k < 64 && i < block_size; k++, i++) {
            uint32_t t = (uint32_t)tokens[i];
            uint8_t *b = (uint8_t *)&buf[k];
            b[0] = (uint8_t)t;
            b[1] = (uint8_t)(t >> 8);
            b[2] = (uint8_t)(t >> 16);
            b[3] = (uint8_t)(t >> 24);
        }
        XXH3_64bits_update(&st, buf, (size_t)k * sizeof buf[0]);
    }
    return XXH3_64bits_digest(&st);
}

int prefix_cache_init(struct prefix_cache *pc, struct kv_pool *pool, uint64_t seed,
                      int max_idle_blocks, struct err *e)
{
    memset(pc, 0, sizeof *pc);
    int n = pool->n_blocks;
    pc->pool = pool;
    pc->seed = seed;
    pc->block_size = pool->block_size;
    pc->max_idle = max_idle_blocks < 0 ? 0 : max_idle_blocks > n ? n : max_idle_blocks;
    pc->n_buckets = 16;
    while (pc->n_buckets < 2 * n)
        pc->n_buckets *= 2;
    pc->indexed = calloc((size_t)n, sizeof *pc->indexed);
    pc->in_lru = calloc((size_t)n, sizeof *pc->in_lru);
    pc->key = calloc((size_t)n, sizeof *pc->key);
    pc->parent = calloc((size_t)n, sizeof *pc->parent);
    pc->parent_gen = calloc((size_t)n, sizeof *pc->parent_gen);
    pc->gen = calloc((size_t)n, sizeof *pc->gen);
    pc->tokens = calloc((size_t)n * (size_t)pc->block_size, sizeof *pc->tokens);
    pc->hnext = calloc((size_t)n, sizeof *pc->hnext);
    pc->lru_prev = calloc((size_t)n, sizeof *pc->lru_prev);
    pc->lru_next = calloc((size_t)n, sizeof *pc->lru_next);
    pc->buckets = malloc((size_t)pc->n_buckets * sizeof *pc->buckets);
    pc->pkey = calloc((size_t)n, sizeof *pc->pkey);
    pc->on_disk = calloc((size_t)n, sizeof *pc->on_disk);
    if (!pc->indexed || !pc->in_lru || !pc->key || !pc->parent || !pc->parent_gen || !pc->gen ||
        !pc->tokens || !pc->hnext || !pc->lru_prev || !pc->lru_next || !pc->buckets ||
        !pc->pkey || !pc->on_disk) {
        prefix_cache_free(pc);
        return err_set(e, "prefix cache: out of memory");
    }
    for (int i = 0; i < pc->n_buckets; i++)
        pc->buckets[i] = -1;
    pc->lru_head = pc->lru_tail = -1;
    pool->pc = pc;
    return 0;
}

static void lru_remove(struct prefix_cache *pc, int b)
{
    if (!pc->in_lru[b])
        return;
    int pv = pc->lru_prev[b], nx = pc->lru_next[b];
    if (pv >= 0)
        pc->lru_next[pv] = nx;
    else
        pc->lru_head = nx;
    if (nx >= 0)
        pc->lru_prev[nx] = pv;
    else
        pc->lru_tail = pv;
    pc->in_lru[b] = false;
    pc->n_idle--;
}

static void lru_push(struct prefix_cache *pc, int b) /* most recently used end */
{
    if (pc->in_lru[b])
        return;
    pc->lru_prev[b] = pc->lru_tail;
    pc->lru_next[b] = -1;
    if (pc->lru_tail >= 0)
        pc->lru_next[pc->lru_tail] = b;
    else
        pc->lru_head = b;
    pc->lru_tail = b;
    pc->in_lru[b] = true;
    pc->n_idle++;
}

static void unhash(struct prefix_cache *pc, int b)
{
    int *pp = &pc->buckets[pc->key[b] & (uint64_t)(pc->n_buckets - 1)];
    while (*pp != b) {
        assert(*pp >= 0);
        pp = &pc->hnext[*pp];
    }
    *pp = pc->hnext[b];
}

/* Removes b from the index and drops the index's reference. */
static void unindex(struct prefix_cache *pc, int b)
{
    struct kv_pool *p = pc->pool;
    assert(pc->indexed[b] && p->refcount[b] >= 1);
    lru_remove(pc, b);
    unhash(pc, b);
    pc->indexed[b] = false;
    pc->n_indexed--;
    if (--p->refcount[b] == 0)
        p->free_list[p->n_free++] = b;
}

void prefix_cache_free(struct prefix_cache *pc)
{
    if (pc->pool && pc->indexed)
        for (int b = 0; b < pc->pool->n_blocks; b++)
            if (pc->indexed[b])
                unindex(pc, b);
    if (pc->pool && pc->pool->pc == pc)
        pc->pool->pc = NULL;
    free(pc->indexed);
    free(pc->in_lru);
    free(pc->key);
    free(pc->parent);
    free(pc->parent_gen);
    free(pc->gen);
    free(pc->tokens);
    free(pc->hnext);
    free(pc->lru_prev);
    free(pc->lru_next);
    free(pc->buckets);
    free(pc->pkey);
    free(pc->on_disk);
    free(pc->disk_buf);
    memset(pc, 0, sizeof *pc);
}

/* Writes block b to the SSD tier unless it has a file; false when it
 * could not (the reason kept in disk_err). */
static bool spill(struct prefix_cache *pc, int b)
{
    if (!pc->disk || pc->on_disk[b])
        return true;
    struct err e = {{0}};
    if (kv_block_io(pc->pool, b, pc->disk_buf, true, &e) ||
        kv_disk_write(pc->disk, pc->key[b], pc->pkey[b], pc->tokens + (size_t)b * pc->block_size,
                      pc->disk_buf, &e)) {
        snprintf(pc->disk_err, sizeof pc->disk_err, "%s", e.msg);
        return false;
    }
    pc->on_disk[b] = true;
    return true;
}

int prefix_cache_evict(struct prefix_cache *pc, int n)
{
    int done = 0;
    while (done < n && pc->lru_head >= 0) {
        int b = pc->lru_head;
        assert(pc->pool->refcount[b] == 1);
        spill(pc, b); /* RAM eviction demotes to the SSD tier */
        unindex(pc, b);
        pc->evictions++;
        done++;
    }
    return done;
}

void prefix_cache_trim(struct prefix_cache *pc)
{
    if (pc->n_idle > pc->max_idle)
        prefix_cache_evict(pc, pc->n_idle - pc->max_idle);
}

void prefix_cache_set_cap(struct prefix_cache *pc, int max_idle_blocks)
{
    int n = pc->pool->n_blocks;
    pc->max_idle = max_idle_blocks < 0 ? 0 : max_idle_blocks > n ? n : max_idle_blocks;
    if (pc->max_idle == 0) {
        for (int b = 0; b < n; b++)
            if (pc->indexed[b])
                unindex(pc, b);
        return;
    }
    prefix_cache_trim(pc);
}

void prefix_cache_on_idle(struct prefix_cache *pc, int block)
{
    if (pc->indexed[block])
        lru_push(pc, block);
}

void prefix_cache_on_busy(struct prefix_cache *pc, int block) { lru_remove(pc, block); }

/* The indexed block with this key, parent and token ids, or -1. */
static int find(const struct prefix_cache *pc, uint64_t key, int parent, uint32_t parent_gen,
                const int *tokens)
{
    size_t bs = (size_t)pc->block_size;
    for (int b = pc->buckets[key & (uint64_t)(pc->n_buckets - 1)]; b >= 0; b = pc->hnext[b])
        if (pc->key[b] == key && pc->parent[b] == parent && pc->parent_gen[b] == parent_gen &&
            !memcmp(pc->tokens + (size_t)b * bs, tokens, bs * sizeof *tokens))
            return b;
    return -1;
}

int prefix_cache_lookup(struct prefix_cache *pc, const int *tokens, int n, int max_blocks,
                        int *out)
{
    if (pc->max_idle == 0)
        return 0;
    int bs = pc->block_size, parent = -1, found = 0;
    uint32_t pgen = 0;
    uint64_t key = pc->seed;
    for (int i = 0; i < max_blocks && (i + 1) * bs <= n; i++) {
        const int *t = tokens + (size_t)i * bs;
        key = prefix_block_key(key, t, bs);
        int b = find(pc, key, parent, pgen, t);
        if (b < 0)
            break;
        out[found++] = b;
        parent = b;
        pgen = pc->gen[b];
    }
    return found;
}

int prefix_cache_attach(struct prefix_cache *pc, struct kv_seq *seq, const int *blocks,
                        int n_blocks, struct err *e)
{
    struct kv_pool *p = pc->pool;
    if (seq->n_blocks != 0 || seq->n_tokens != 0)
        return err_set(e, "prefix cache: attach to a non-empty sequence");
    if (n_blocks <= 0)
        return 0;
    if (n_blocks > seq->cap_blocks) {
        int *nb = realloc(seq->blocks, (size_t)n_blocks * sizeof(int));
        if (!nb)
            return err_set(e, "kv cache: out of memory");
        seq->blocks = nb;
        seq->cap_blocks = n_blocks;
    }
    for (int i = 0; i < n_blocks; i++) {
        int b = blocks[i];
        assert(pc->indexed[b] && p->refcount[b] >= 1);
        if (p->refcount[b]++ == 1)
            prefix_cache_on_busy(pc, b);
        seq->blocks[i] = b;
    }
    seq->n_blocks = n_blocks;
    seq->n_tokens = n_blocks * pc->block_size;
    return 0;
}

/* Indexes block b under key (child of parent, -1 for a first block, whose
 * key is pkey) with the index's reference. */
static void index_block(struct prefix_cache *pc, int b, uint64_t key, uint64_t pkey, int parent,
                        const int *tokens)
{
    size_t bs = (size_t)pc->block_size;
    pc->indexed[b] = true;
    pc->key[b] = key;
    pc->pkey[b] = pkey;
    pc->parent[b] = parent;
    pc->parent_gen[b] = parent >= 0 ? pc->gen[parent] : 0;
    pc->gen[b]++;
    memcpy(pc->tokens + (size_t)b * bs, tokens, bs * sizeof *tokens);
    size_t h = key & (uint64_t)(pc->n_buckets - 1);
    pc->hnext[b] = pc->buckets[h];
    pc->buckets[h] = b;
    pc->pool->refcount[b]++;
    pc->n_indexed++;
}

int prefix_cache_register(struct prefix_cache *pc, const struct kv_seq *seq, const int *tokens)
{
    if (pc->max_idle == 0)
        return 0;
    struct kv_pool *p = pc->pool;
    int bs = pc->block_size, n_full = seq->n_tokens / bs, parent = -1, added = 0;
    uint32_t pgen = 0;
    uint64_t key = pc->seed;
    for (int i = 0; i < n_full; i++) {
        const int *t = tokens + (size_t)i * bs;
        key = prefix_block_key(key, t, bs);
        int b = find(pc, key, parent, pgen, t);
        if (b < 0) {
            b = seq->blocks[i];
            /* Indexed under a parent that has since been evicted: re-key it
             * under the parent this chain has now (the seq holds it, so the
             * index's reference is not its last). */
            if (pc->indexed[b])
                unindex(pc, b);
            assert(p->refcount[b] >= 1);
            index_block(pc, b, key, parent >= 0 ? pc->key[parent] : pc->seed, parent, t);
            pc->on_disk[b] = false;
            added++;
        }
        parent = b;
        pgen = pc->gen[b];
    }
    return added;
}

int prefix_cache_set_disk(struct prefix_cache *pc, struct kv_disk *disk, struct err *e)
{
    free(pc->disk_buf);
    pc->disk_buf = NULL;
    pc->disk = disk;
    if (!disk)
        return 0;
    struct kv_pool *p = pc->pool;
    if (!(pc->disk_buf = malloc(kv_pool_bytes_per_block(p->n_layers, p->kv_dim, p->block_size,
                                                        p->elt_bytes)))) {
        pc->disk = NULL;
        return err_set(e, "prefix cache: out of memory for the SSD tier's block buffer");
    }
    return 0;
}

/* A pool block for a restored one: a free block, else the least recently
 * used idle block when it is not in chain[0, n) (evicted, and so spilled);
 * -1 when neither. */
static int take_block(struct prefix_cache *pc, const int *chain, int n)
{
    struct kv_pool *p = pc->pool;
    if (p->n_free == 0) {
        int b = pc->lru_head;
        if (b < 0)
            return -1;
        for (int i = 0; i < n; i++)
            if (chain[i] == b)
                return -1;
        prefix_cache_evict(pc, 1);
    }
    if (p->n_free == 0)
        return -1;
    return p->free_list[--p->n_free];
}

int prefix_cache_restore(struct prefix_cache *pc, const int *tokens, int n, int max_blocks,
                         int *out, int found)
{
    if (!pc->disk || pc->max_idle == 0)
        return found;
    struct kv_pool *p = pc->pool;
    int bs = pc->block_size;
    uint64_t key = found ? pc->key[out[found - 1]] : pc->seed;
    while (found < max_blocks && (found + 1) * bs <= n) {
        const int *t = tokens + (size_t)found * bs;
        uint64_t pk = key;
        key = prefix_block_key(pk, t, bs);
        if (!kv_disk_has(pc->disk, key))
            break;
        int b = take_block(pc, out, found);
        if (b < 0)
            break;
        struct err e = {{0}};
        if (kv_disk_read(pc->disk, key, pk, t, pc->disk_buf) != 1 ||
            kv_block_io(p, b, pc->disk_buf, false, &e)) {
            p->free_list[p->n_free++] = b;
            break;
        }
        index_block(pc, b, key, pk, found ? out[found - 1] : -1, t); /* refcount 0 -> 1 */
        pc->on_disk[b] = true;
        lru_push(pc, b);
        out[found++] = b;
    }
    return found;
}

int prefix_cache_flush(struct prefix_cache *pc, int max)
{
    int done = 0, n = pc->pool->n_blocks;
    if (!pc->disk)
        return 0;
    /* resumes where the last call stopped: an idle engine flushing a few
     * blocks at a time does not rescan the pool from its start each time */
    int start = pc->flush_next;
    for (int i = 0; i < n && done < max; i++) {
        int b = (start + i) % n;
        if (pc->indexed[b] && !pc->on_disk[b]) {
            if (!spill(pc, b)) {
                pc->flush_next = b;
                return done; /* the disk refuses: try again later */
            }
            done++;
            pc->flush_next = (b + 1) % n;
        }
    }
    return done;
}
