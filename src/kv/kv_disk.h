/* kv_disk.h - the prompt cache's SSD tier: full K/V blocks as files that
 * outlive the process, so a restarted server (or one whose RAM cache
 * evicted a prefix) restores a long shared prefix instead of computing it
 * again.
 *
 * A tier is a directory per identity (model fingerprint, KV scheme, block
 * size, backend layout, weights files' sizes and times): DIR/<identity>/,
 * holding one file per block, named by its chain key (prefix_cache.h). A
 * file carries its parent's chain key, its token ids and a hash of its
 * bytes; a read checks all three against what the caller expects, so a
 * torn, truncated or foreign file is a miss (and is removed), never wrong
 * K/V. Files are written to a temporary name and renamed, so a crash leaves
 * whole files or none. A byte cap (optional) removes the least recently
 * used files (by modification time, which a read refreshes).
 *
 * Single-threaded: the engine thread owns it. */
#ifndef CLLM_KV_KV_DISK_H
#define CLLM_KV_KV_DISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

struct kv_disk;

struct kv_disk_stats {
    uint64_t writes, reads;       /* blocks written, blocks restored */
    uint64_t bad;                 /* files refused on read (and removed) */
    uint64_t evictions;           /* files removed by the byte cap */
    long long bytes, max_bytes;   /* on disk now (this identity), the cap (0: none) */
    long long files;
};

/* Opens (creating) DIR/<identity hex>/. block_bytes: the K/V bytes of one
 * block; max_bytes <= 0: no cap. Fails with a message naming the path. */
struct kv_disk *kv_disk_open(const char *dir, uint64_t identity, int block_size,
                             size_t block_bytes, long long max_bytes, struct err *e);
void kv_disk_close(struct kv_disk *d);

/* Whether a file for this key exists (one stat). */
bool kv_disk_has(struct kv_disk *d, uint64_t key);
/* Writes a block (payload: block_bytes) unless its file exists. 0, or -1
 * with a message (disk full, permissions): the block is then just not
 * on disk. */
int kv_disk_write(struct kv_disk *d, uint64_t key, uint64_t parent_key, const int *tokens,
                  const void *payload, struct err *e);
/* Reads the block with this key into payload when its file holds exactly
 * this parent key and these tokens and its bytes hash right: 1. 0: no such
 * file, or a file that fails a check (removed). */
int kv_disk_read(struct kv_disk *d, uint64_t key, uint64_t parent_key, const int *tokens,
                 void *payload);
void kv_disk_get_stats(const struct kv_disk *d, struct kv_disk_stats *out);
/* The directory the tier's files are in. */
const char *kv_disk_path(const struct kv_disk *d);

#endif
