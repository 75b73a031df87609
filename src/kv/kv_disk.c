/* kv_disk.c - K/V blocks as files (see kv_disk.h for the contract). */
#include "kv/kv_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

/* On-disk header (host byte order: the files belong to this machine's
 * backend layout anyway), then the token ids as int32, then the payload. */
struct kv_file_head {
    char magic[8]; /* "CLLMKVB1" */
    uint32_t block_size, pad;
    uint64_t key, parent_key;
    uint64_t payload_bytes, payload_hash;
};

static const char MAGIC[8] = {'C', 'L', 'L', 'M', 'K', 'V', 'B', '1'};

struct kv_disk {
    char dir[4096];
    int block_size;
    size_t block_bytes, file_bytes;
    long long max_bytes;
    struct kv_disk_stats st;
    unsigned char *buf; /* one whole file */
};

static int mkdir_p(const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, 0755) && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

static void file_path(const struct kv_disk *d, uint64_t key, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%016llx.kvb", d->dir, (unsigned long long)key);
}

/* Bytes and count of this identity's block files. */
static void scan(struct kv_disk *d)
{
    d->st.bytes = d->st.files = 0;
    DIR *dh = opendir(d->dir);
    if (!dh)
        return;
    struct dirent *de;
    char p[4600];
    while ((de = readdir(dh))) {
        size_t n = strlen(de->d_name);
        struct stat sb;
        if (n < 5 || strcmp(de->d_name + n - 4, ".kvb"))
            continue;
        snprintf(p, sizeof p, "%s/%s", d->dir, de->d_name);
        if (stat(p, &sb) == 0) {
            d->st.bytes += (long long)sb.st_size;
            d->st.files++;
        }
    }
    closedir(dh);
}

struct kv_disk *kv_disk_open(const char *dir, uint64_t identity, int block_size,
                             size_t block_bytes, long long max_bytes, struct err *e)
{
    struct kv_disk *d = calloc(1, sizeof *d);
    if (!d) {
        err_set(e, "out of memory");
        return NULL;
    }
    if (strlen(dir) > 4000) {
        free(d);
        err_set(e, "--ssd-cache: the path is too long");
        return NULL;
    }
    snprintf(d->dir, sizeof d->dir, "%s/%016llx", dir, (unsigned long long)identity);
    d->block_size = block_size;
    d->block_bytes = block_bytes;
    d->file_bytes = sizeof(struct kv_file_head) + sizeof(int32_t) * (size_t)block_size + block_bytes;
    d->max_bytes = max_bytes > 0 ? max_bytes : 0;
    d->st.max_bytes = d->max_bytes;
    if (mkdir_p(d->dir)) {
        err_set(e, "--ssd-cache: cannot create %s (%s)", d->dir, strerror(errno));
        free(d);
        return NULL;
    }
    if (access(d->dir, W_OK | R_OK | X_OK)) {
        err_set(e, "--ssd-cache: %s is not writable (%s)", d->dir, strerror(errno));
        free(d);
        return NULL;
    }
    if (!(d->buf = malloc(d->file_bytes))) {
        err_set(e, "out of memory for a %zu-byte KV block file", d->file_bytes);
        free(d);
        return NULL;
    }
    scan(d);
    return d;
}

void kv_disk_close(struct kv_disk *d)
{
    if (!d)
        return;
    free(d->buf);
    free(d);
}

const char *kv_disk_path(const struct kv_disk *d) { return d->dir; }

bool kv_disk_has(struct kv_disk *d, uint64_t key)
{
    char p[4200];
    file_path(d, key, p, sizeof p);
    return access(p, F_OK) == 0;
}

struct aged {
    char name[32];
    struct timespec t;
    long long size;
};

static int by_age(const void *a, const void *b)
{
    const struct aged *x = a, *y = b;
    if (x->t.tv_sec != y->t.tv_sec)
        return x->t.tv_sec < y->t.tv_sec ? -1 : 1;
    return (x->t.tv_nsec > y->t.tv_nsec) - (x->t.tv_nsec < y->t.tv_nsec);
}

/* Over the cap: removes the oldest files until 90% of it is left, so the
 * directory is not scanned on every write. */
static void enforce_cap(struct kv_disk *d)
{
    if (!d->max_bytes || d->st.bytes <= d->max_bytes)
        return;
    DIR *dh = opendir(d->dir);
    if (!dh)
        return;
    struct aged *a = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    char p[4600];
    while ((de = readdir(dh))) {
        size_t len = strlen(de->d_name);
        struct stat sb;
        if (len < 5 || len >= sizeof a->name || strcmp(de->d_name + len - 4, ".kvb"))
            continue;
        snprintf(p, sizeof p, "%s/%s", d->dir, de->d_name);
        if (stat(p, &sb))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 256;
            struct aged *na = realloc(a, nc * sizeof *a);
            if (!na)
                break;
            a = na;
            cap = nc;
        }
        snprintf(a[n].name, sizeof a[n].name, "%s", de->d_name);
        a[n].t = sb.st_mtim;
        a[n].size = (long long)sb.st_size;
        n++;
    }
    closedir(dh);
    qsort(a, n, sizeof *a, by_age);
    long long target = d->max_bytes / 10 * 9;
    for (size_t i = 0; i < n && d->st.bytes > target; i++) {
        snprintf(p, sizeof p, "%s/%s", d->dir, a[i].name);
        if (unlink(p) == 0) {
            d->st.bytes -= a[i].size;
            d->st.files--;
            d->st.evictions++;
        }
    }
    free(a);
}

int kv_disk_write(struct kv_disk *d, uint64_t key, uint64_t parent_key, const int *tokens,
                  const void *payload, struct err *e)
{
    char p[4200], tmp[4300];
    file_path(d, key, p, sizeof p);
    if (access(p, F_OK) == 0)
        return 0;
    struct kv_file_head h = {.block_size = (uint32_t)d->block_size,
                             .key = key,
                             .parent_key = parent_key,
                             .payload_bytes = d->block_bytes,
                             .payload_hash = XXH3_64bits(payload, d->block_bytes)};
    memcpy(h.magic, MAGIC, sizeof MAGIC);
    unsigned char *b = d->buf;
    memcpy(b, &h, sizeof h);
    for (int i = 0; i < d->block_size; i++) {
        int32_t t = tokens[i];
        memcpy(b + sizeof h + sizeof t * (size_t)i, &t, sizeof t);
    }
    memcpy(b + sizeof h + sizeof(int32_t) * (size_t)d->block_size, payload, d->block_bytes);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", p, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return err_set(e, "ssd cache: cannot write %s (%s)", tmp, strerror(errno));
    size_t off = 0;
    while (off < d->file_bytes) {
        ssize_t k = write(fd, b + off, d->file_bytes - off);
        if (k <= 0) {
            int saved = errno;
            close(fd);
            unlink(tmp);
            return err_set(e, "ssd cache: writing %s failed (%s)", tmp,
                           strerror(k < 0 ? saved : ENOSPC));
        }
        off += (size_t)k;
    }
    if (close(fd) || rename(tmp, p)) {
        int saved = errno;
        unlink(tmp);
        return err_set(e, "ssd cache: cannot finish %s (%s)", p, strerror(saved));
    }
    d->st.writes++;
    d->st.bytes += (long long)d->file_bytes;
    d->st.files++;
    enforce_cap(d);
    return 0;
}

int kv_disk_read(struct kv_disk *d, uint64_t key, uint64_t parent_key, const int *tokens,
                 void *payload)
{
    char p[4200];
    file_path(d, key, p, sizeof p);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t off = 0;
    ssize_t k = 1;
    while (off < d->file_bytes && (k = read(fd, d->buf + off, d->file_bytes - off)) > 0)
        off += (size_t)k;
    char extra;
    bool whole = off == d->file_bytes && read(fd, &extra, 1) == 0;
    struct kv_file_head h;
    memcpy(&h, d->buf, sizeof h);
    const unsigned char *tk = d->buf + sizeof h;
    const unsigned char *pl = tk + sizeof(int32_t) * (size_t)d->block_size;
    bool ok = whole && !memcmp(h.magic, MAGIC, sizeof MAGIC) &&
              h.block_size == (uint32_t)d->block_size && h.key == key &&
              h.parent_key == parent_key && h.payload_bytes == d->block_bytes;
    for (int i = 0; ok && i < d->block_size; i++) {
        int32_t t;
        memcpy(&t, tk + sizeof t * (size_t)i, sizeof t);
        ok = t == tokens[i];
    }
    ok = ok && XXH3_64bits(pl, d->block_bytes) == h.payload_hash;
    if (!ok) { /* a torn or foreign file: never K/V, and out of the way */
        struct stat sb;
        long long size = fstat(fd, &sb) == 0 ? (long long)sb.st_size : (long long)off;
        close(fd);
        if (unlink(p) == 0) {
            d->st.bytes -= size;
            d->st.files--;
        }
        d->st.bad++;
        return 0;
    }
    futimens(fd, NULL); /* recently used: the cap removes it last */
    close(fd);
    memcpy(payload, pl, d->block_bytes);
    d->st.reads++;
    return 1;
}

void kv_disk_get_stats(const struct kv_disk *d, struct kv_disk_stats *out) { *out = d->st; }
