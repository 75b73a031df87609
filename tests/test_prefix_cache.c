/* test_prefix_cache.c - the block-level prefix index on a small CPU pool:
 * chain keys, lookup with the stored-token (collision) check and the parent
 * check, refcounts, the idle LRU's eviction order, the cap, and every block
 * back on the free list at the end. */
#include <string.h>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "kv/prefix_cache.h"
#include "testutil.h"

#define BS 4
#define NB 8

/* A sequence "computed" over toks[0, n): blocks reserved, n_tokens set. */
static void fill(struct kv_pool *p, struct kv_seq *s, int n)
{
    struct err e = {{0}};
    CHECK(kv_seq_reserve(p, s, n, &e) == 0, "reserve %d: %s", n, e.msg);
    s->n_tokens = n;
}

static int all_free_or_idle(const struct kv_pool *p, const struct prefix_cache *pc)
{
    for (int b = 0; b < p->n_blocks; b++) {
        if (p->refcount[b] == 0)
            continue;
        if (!(p->refcount[b] == 1 && pc->indexed[b]))
            return 0;
    }
    return p->n_free + pc->n_idle == p->n_blocks && pc->n_idle == pc->n_indexed;
}

int main(void)
{
    struct err e = {{0}};
    struct backend *be = backend_create("cpu", 1, &e);
    CHECK(be != NULL, "backend: %s", e.msg);
    if (!be)
        return test_summary("test_prefix_cache");

    /* 1. Chain keys: deterministic, order- and parent-sensitive. */
    int t1[BS] = {1, 2, 3, 4}, t2[BS] = {1, 2, 3, 5}, t3[BS] = {4, 3, 2, 1};
    uint64_t k1 = prefix_block_key(7, t1, BS);
    CHECK(k1 == prefix_block_key(7, t1, BS), "key deterministic");
    CHECK(k1 != prefix_block_key(8, t1, BS), "key depends on the parent/seed");
    CHECK(k1 != prefix_block_key(7, t2, BS) && k1 != prefix_block_key(7, t3, BS),
          "key depends on every token and their order");
    CHECK(prefix_block_key(k1, t2, BS) != prefix_block_key(prefix_block_key(7, t2, BS), t2, BS),
          "chained: block 2's key depends on block 1");
    CHECK(prefix_hash_bytes("a", 1) != prefix_hash_bytes("b", 1), "fingerprints differ");

    struct kv_pool pool;
    CHECK(kv_pool_init(&pool, be, 1, 1, 4, BS, NB, &e) == 0, "pool: %s", e.msg);
    struct prefix_cache pc;
    CHECK(prefix_cache_init(&pc, &pool, 42, NB, &e) == 0, "init: %s", e.msg);

    /* 2. Register three full blocks (+ a partial tail that is never indexed). */
    int A[14] = {10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33, 40, 41};
    struct kv_seq sa = {0};
    fill(&pool, &sa, 14);
    CHECK(prefix_cache_register(&pc, &sa, A) == 3, "3 full blocks indexed");
    CHECK(prefix_cache_register(&pc, &sa, A) == 0, "registering twice adds nothing");
    CHECK(pc.n_indexed == 3 && !pc.indexed[sa.blocks[3]], "partial tail not indexed");
    for (int i = 0; i < 3; i++)
        CHECK(pool.refcount[sa.blocks[i]] == 2, "seq + index references on block %d", i);
    CHECK(kv_seq_writable(&pool, &sa, 13) && !kv_seq_writable(&pool, &sa, 11),
          "tail writable, indexed blocks read-only");

    /* 3. Lookup: longest chain, bounded by max_blocks and by full blocks. */
    int out[NB];
    CHECK(prefix_cache_lookup(&pc, A, 14, NB, out) == 3 && out[0] == sa.blocks[0] &&
              out[1] == sa.blocks[1] && out[2] == sa.blocks[2], "full match");
    CHECK(prefix_cache_lookup(&pc, A, 11, NB, out) == 2, "only full blocks of the query");
    CHECK(prefix_cache_lookup(&pc, A, 14, 1, out) == 1, "max_blocks bounds the match");
    int B[12] = {10, 11, 12, 13, 20, 21, 99, 23, 30, 31, 32, 33};
    CHECK(prefix_cache_lookup(&pc, B, 12, NB, out) == 1, "diverging block 2 stops the chain");
    int C[8] = {20, 21, 22, 23, 30, 31, 32, 33};
    CHECK(prefix_cache_lookup(&pc, C, 8, NB, out) == 0, "same tokens at another depth miss");
    struct prefix_cache other = pc;
    other.seed = 43;
    CHECK(prefix_cache_lookup(&other, A, 14, NB, out) == 0, "another fingerprint never matches");

    /* 4. Collision check: a block whose key matches but whose stored ids
     * differ is never served (simulated by corrupting the stored ids). */
    int b1 = sa.blocks[1];
    pc.tokens[b1 * BS + 2] ^= 1;
    CHECK(prefix_cache_lookup(&pc, A, 14, NB, out) == 1, "stored-id mismatch rejects the block");
    pc.tokens[b1 * BS + 2] ^= 1;
    CHECK(prefix_cache_lookup(&pc, A, 14, NB, out) == 3, "restored");

    /* 5. Release: indexed blocks stay, idle, held only by the index. */
    kv_seq_release(&pool, &sa);
    CHECK(pc.n_idle == 3 && pool.n_free == NB - 3, "idle %d, free %d", pc.n_idle, pool.n_free);
    CHECK(all_free_or_idle(&pool, &pc), "free or index-only");

    /* 6. Attach: references return, the LRU gives the blocks up. */
    struct kv_seq sb = {0};
    int n = prefix_cache_lookup(&pc, B, 12, NB, out);
    CHECK(prefix_cache_attach(&pc, &sb, out, n, &e) == 0 && sb.n_tokens == BS && sb.n_blocks == 1,
          "attach: %s", e.msg);
    CHECK(pool.refcount[out[0]] == 2 && pc.n_idle == 2, "attached block busy");
    fill(&pool, &sb, 12);
    CHECK(prefix_cache_register(&pc, &sb, B) == 2, "B's own blocks 2 and 3 indexed");
    kv_seq_release(&pool, &sb);
    CHECK(pc.n_indexed == 5 && pc.n_idle == 5 && pool.n_free == NB - 5, "5 cached");

    /* 7. Eviction under pressure, LRU first; a chain's deepest block is the
     * oldest. LRU now: A2, A1, (A0 was busy, re-idled after) ... */
    int a0 = prefix_cache_lookup(&pc, A, 12, NB, out) == 3 ? out[0] : -1;
    int a1 = out[1], a2 = out[2];
    struct kv_seq sc = {0};
    fill(&pool, &sc, (NB - 5 + 1) * BS); /* one block more than is free */
    CHECK(pc.evictions == 1 && !pc.indexed[a2] && pc.indexed[a1] && pc.indexed[a0],
          "evicted the least recently used block (A's deepest)");
    CHECK(prefix_cache_lookup(&pc, A, 12, NB, out) == 2, "A's chain now 2 blocks");
    fill(&pool, &sc, (NB - 5 + 2) * BS);
    CHECK(pc.evictions == 2 && !pc.indexed[a1] && pc.indexed[a0], "then A's block 1");
    kv_seq_release(&pool, &sc);
    CHECK(pool.n_free == NB - pc.n_idle && all_free_or_idle(&pool, &pc), "after pressure");

    /* 8. An orphan (parent evicted) is never matched, and re-registering
     * the chain re-keys it under the new parent. */
    struct kv_seq sd = {0};
    fill(&pool, &sd, 12);
    CHECK(prefix_cache_register(&pc, &sd, A) == 2, "A's blocks 1-2 indexed again: block 0 shared");
    kv_seq_release(&pool, &sd);
    CHECK(prefix_cache_lookup(&pc, A, 12, NB, out) == 3, "A whole again");
    CHECK(all_free_or_idle(&pool, &pc), "idle after re-register");

    /* 9. The cap: idle blocks beyond it go, most recently used kept. */
    int keep = pc.lru_tail;
    prefix_cache_set_cap(&pc, 1);
    CHECK(pc.n_idle == 1 && pc.n_indexed == 1 && pc.indexed[keep], "cap 1 keeps the MRU block");
    CHECK(pool.n_free == NB - 1, "the rest freed");
    /* a held indexed block survives a cap of 0 as an ordinary block */
    prefix_cache_set_cap(&pc, NB);
    struct kv_seq se = {0};
    fill(&pool, &se, 8);
    prefix_cache_register(&pc, &se, A);
    prefix_cache_set_cap(&pc, 0);
    CHECK(pc.n_indexed == 0 && pc.n_idle == 0, "cap 0 empties the index");
    CHECK(pool.refcount[se.blocks[0]] == 1 && kv_seq_writable(&pool, &se, 0),
          "held block: index reference dropped");
    CHECK(prefix_cache_register(&pc, &se, A) == 0 && prefix_cache_lookup(&pc, A, 8, NB, out) == 0,
          "disabled: no registration, no lookup");
    kv_seq_release(&pool, &se);
    CHECK(pool.n_free == NB, "pool all free: %d of %d", pool.n_free, NB);
    for (int b = 0; b < NB; b++)
        CHECK(pool.refcount[b] == 0, "refcount of block %d is %d", b, pool.refcount[b]);

    /* 10. Freeing the index returns idle blocks to the pool. */
    prefix_cache_set_cap(&pc, NB);
    struct kv_seq sf = {0};
    fill(&pool, &sf, 12);
    prefix_cache_register(&pc, &sf, A);
    kv_seq_release(&pool, &sf);
    CHECK(pool.n_free == NB - 3, "3 idle");
    prefix_cache_free(&pc);
    CHECK(pool.n_free == NB && pool.pc == NULL, "free returns them");
    kv_pool_free(&pool);
    backend_destroy(be);
    return test_summary("test_prefix_cache");
}
