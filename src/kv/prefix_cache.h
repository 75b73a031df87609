/* prefix_cache.h - the block-level prefix index over a kv_pool.
 *
 * A FULL block (block_size tokens) of a sequence is keyed by a 64-bit chain
 * key: XXH3_64bits_withSeed(its token ids, parent key), where the parent key
 * of the first block is the model fingerprint (model config, path, format,
 * KV scheme, block size), so different models or schemes never share keys.
 * The index maps key -> pool block id and holds one reference on every
 * indexed block. A lookup accepts an entry only when its stored token ids
 * equal the query's AND its recorded parent is exactly the block (and the
 * registration generation of that block) matched one step earlier, so a
 * hash collision can never serve wrong K/V: a match proves, by induction,
 * that the whole token prefix is identical.
 *
 * Indexed blocks whose only reference is the index are "idle" and form an
 * LRU. The pool evicts the least recently used idle block when its free list
 * runs dry (kv_seq_reserve) and whenever the idle count exceeds the cap. Only
 * full blocks are ever indexed and a sequence only appends to its own tail
 * block, so shared blocks are read-only (no copy-on-write in this design).
 *
 * Single-threaded: the owner of the pool (the engine thread) calls these. */
#ifndef CLLM_KV_PREFIX_CACHE_H
#define CLLM_KV_PREFIX_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_cache.h"

struct prefix_cache {
    struct kv_pool *pool;
    uint64_t seed;        /* model fingerprint: the parent key of block 0 */
    int max_idle;         /* cap on idle (index-only) blocks; 0 = disabled */
    int block_size;
    /* per pool block */
    bool *indexed;
    uint64_t *key;
    int *parent;          /* parent block id, -1 for a first block */
    uint32_t *parent_gen; /* the parent's gen when this block was indexed */
    uint32_t *gen;        /* bumped on every (re)indexing of the block */
    int *tokens;          /* [n_blocks][block_size] token ids */
    int *hnext;           /* hash chain */
    int *lru_prev, *lru_next; /* idle list, head = least recently used */
    bool *in_lru;
    int *buckets;         /* [n_buckets] heads, -1 empty */
    int n_buckets;        /* power of two */
    int lru_head, lru_tail;
    /* counts */
    int n_indexed, n_idle;
    uint64_t evictions;
    /* the SSD tier (kv_disk.h), or NULL: evicted and flushed blocks are
     * written there, and a lookup's chain continues from it */
    struct kv_disk *disk;
    uint64_t *pkey;   /* per pool block: its parent's chain key (the seed for a first) */
    bool *on_disk;    /* per pool block: its current indexing has a file */
    void *disk_buf;   /* one block's K/V on the host */
    int flush_next;   /* where prefix_cache_flush's scan resumes */
    char disk_err[256]; /* the last write failure, for the log */
};

/* A 64-bit fingerprint of a byte string (XXH3); for model fingerprints. */
uint64_t prefix_hash_bytes(const void *p, size_t n);
/* The chain key of a block: hash of its token ids seeded with the parent's. */
uint64_t prefix_block_key(uint64_t parent_key, const int *tokens, int block_size);

/* Attaches an index to the pool (pool->pc). max_idle_blocks caps the idle
 * LRU; 0 disables caching (lookups miss, registrations are no-ops). */
int prefix_cache_init(struct prefix_cache *pc, struct kv_pool *pool, uint64_t seed,
                      int max_idle_blocks, struct err *e);
/* Drops every indexed block (idle ones go back to the free list) and
 * detaches from the pool. */
void prefix_cache_free(struct prefix_cache *pc);
/* Changes the cap; 0 empties the index of every block (held blocks lose
 * their index reference and free at their sequence's release). */
void prefix_cache_set_cap(struct prefix_cache *pc, int max_idle_blocks);

/* Finds the longest chain of indexed blocks matching tokens[0, n) in full
 * blocks (at most max_blocks) and writes their ids to out. Returns the count.
 * Touches nothing. */
int prefix_cache_lookup(struct prefix_cache *pc, const int *tokens, int n, int max_blocks,
                        int *out);
/* Starts the sequence (which must be empty) on n_blocks cached blocks found
 * by lookup: one reference each; seq->n_tokens = n_blocks * block_size. */
int prefix_cache_attach(struct prefix_cache *pc, struct kv_seq *seq, const int *blocks,
                        int n_blocks, struct err *e);
/* Indexes every full block of the sequence (tokens[0, seq->n_tokens) are
 * the ids its K/V were computed from) that is not indexed yet. Returns the
 * number of newly indexed blocks. */
int prefix_cache_register(struct prefix_cache *pc, const struct kv_seq *seq, const int *tokens);
/* Attaches the SSD tier (owned by the caller; NULL detaches). */
int prefix_cache_set_disk(struct prefix_cache *pc, struct kv_disk *disk, struct err *e);
/* Continues a lookup's chain (found blocks in out, from prefix_cache_lookup)
 * with blocks read from the SSD tier into free pool blocks (or idle ones
 * outside the chain, evicted), indexed and idle like any cached block, up
 * to max_blocks; returns the new count. A block that cannot be read ends
 * the chain there. */
int prefix_cache_restore(struct prefix_cache *pc, const int *tokens, int n, int max_blocks,
                         int *out, int found);
/* Writes up to max indexed blocks that have no file yet to the SSD tier
 * (full blocks never change, so busy ones too); returns how many. */
int prefix_cache_flush(struct prefix_cache *pc, int max);
/* Evicts up to n idle blocks, LRU first, to the free list; returns how many. */
int prefix_cache_evict(struct prefix_cache *pc, int n);

/* Hooks for kv_cache.c: a block's refcount went from 2 to 1 / 1 to 2. */
void prefix_cache_on_idle(struct prefix_cache *pc, int block);
void prefix_cache_on_busy(struct prefix_cache *pc, int block);
/* After a release: trims the idle LRU to the cap. */
void prefix_cache_trim(struct prefix_cache *pc);

#endif
