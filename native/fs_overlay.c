/* fs_overlay.c - the guest's private in-memory files (/tmp, the home directory, ...).
 *
 * Inodes live in an array owned by one sandbox. A snapshot clones the array; file data sits in
 * refcounted 64 KiB blocks shared by the clones until one of them writes (copy-on-write per block),
 * so snapshots of a sandbox with large files stay cheap.
 */
#include "fs.h"

#include <time.h>

static int64_t wall_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Engine memory an overlay object costs besides its file data: an inode, a directory entry with
 * its name, a symlink's target. It is charged to the same limit as the data (as a tmpfs charges
 * inodes and names), otherwise a guest could make the engine hold gigabytes of names and 4 KiB
 * symlink targets, which every snapshot of it copies again. */
#define INODE_COST ((uint64_t)sizeof(zb_inode))
static uint64_t name_cost(const char *name) { return sizeof(zb_dirent) + strlen(name) + 1; }

static int charge(zb_fs *fs, uint64_t bytes) {
    if (fs->bytes_used + bytes > fs->bytes_limit) return -ENOSPC;
    fs->bytes_used += bytes;
    return 0;
}

static void uncharge(zb_fs *fs, uint64_t bytes) { fs->bytes_used -= ZB_MIN(bytes, fs->bytes_used); }

uint64_t zb_ovl_meta_cost(const zb_inode *in) {
    if (in->type == INO_FREE) return 0;
    uint64_t cost = INODE_COST + (in->target ? strlen(in->target) + 1 : 0);
    for (size_t i = 0; i < in->nents; i++) cost += name_cost(in->ents[i].name);
    return cost;
}

zb_inode *zb_ovl_inode(zb_fs *fs, uint32_t ino) {
    if (!ino || ino >= fs->ninodes || fs->inodes[ino].type == INO_FREE) return NULL;
    return &fs->inodes[ino];
}

uint32_t zb_ovl_new_inode(zb_fs *fs, int type, uint32_t mode) {
    uint32_t ino = 0;
    size_t i = fs->free_hint > 1 ? fs->free_hint : 1;
    for (; i < fs->ninodes; i++)
        if (fs->inodes[i].type == INO_FREE) { ino = (uint32_t)i; break; }
    fs->free_hint = i; /* everything below is in use */
    if (charge(fs, INODE_COST) < 0) return 0;
    if (!ino) {
        if (fs->ninodes >= 1u << 20) { uncharge(fs, INODE_COST); return 0; }
        if (fs->ninodes >= fs->inodes_cap) { /* grow geometrically: one realloc per inode was O(n^2) */
            size_t cap = ZB_MAX(2 * fs->ninodes, 64);
            zb_inode *n = realloc(fs->inodes, cap * sizeof *n);
            if (!n) { uncharge(fs, INODE_COST); return 0; }
            fs->inodes = n;
            fs->inodes_cap = cap;
        }
        ino = (uint32_t)fs->ninodes++;
    }
    zb_inode *in = &fs->inodes[ino];
    memset(in, 0, sizeof *in);
    in->type = type;
    in->mode = mode & 07777;
    in->atime_ns = in->mtime_ns = in->ctime_ns = wall_ns();
    return ino;
}

void zb_block_unref(zb_block *b) {
    if (b && atomic_fetch_sub(&b->refs, 1) == 1) free(b);
}

static void inode_release(zb_fs *fs, zb_inode *in) {
    uncharge(fs, zb_ovl_meta_cost(in));
    for (size_t i = 0; i < in->nents; i++) free(in->ents[i].name);
    free(in->ents);
    free(in->index);
    size_t ino = (size_t)(in - fs->inodes);
    if (ino < fs->free_hint) fs->free_hint = ino;
    for (size_t i = 0; i < in->nblocks; i++) {
        if (in->blocks[i]) fs->bytes_used -= in->blocks[i]->cap;
        zb_block_unref(in->blocks[i]);
    }
    free(in->blocks);
    free(in->target);
    memset(in, 0, sizeof *in);
}

void zb_ovl_open_ref(zb_fs *fs, uint32_t ino, int delta) {
    zb_inode *in = zb_ovl_inode(fs, ino);
    if (!in) return;
    if (delta > 0) in->opens += delta;
    else if (in->opens >= (uint32_t)-delta) in->opens += delta;
    if (in->opens == 0 && in->nlink == 0 && in->type != INO_DIR) inode_release(fs, in);
}

void zb_ovl_discard(zb_fs *fs, uint32_t ino) {
    zb_inode *in = zb_ovl_inode(fs, ino);
    if (in && !in->nlink && !in->opens) inode_release(fs, in);
}

int zb_ovl_set_target(zb_fs *fs, uint32_t ino, const char *target) {
    zb_inode *in = zb_ovl_inode(fs, ino);
    if (!in || in->target) return -EINVAL;
    uint64_t cost = strlen(target) + 1;
    if (charge(fs, cost) < 0) return -ENOSPC;
    if (!(in->target = strdup(target))) { uncharge(fs, cost); return -ENOMEM; }
    return 0;
}

void zb_ovl_free_all(zb_fs *fs) {
    for (size_t i = 1; i < fs->ninodes; i++)
        if (fs->inodes[i].type != INO_FREE) inode_release(fs, &fs->inodes[i]);
    free(fs->inodes);
    fs->inodes = NULL;
    fs->ninodes = fs->inodes_cap = fs->free_hint = 0;
}

/* ---- directory indexes ---- */
/* Directories up to this many entries are scanned; larger ones get a hash index, so that a
 * directory of 80,000 files costs O(1) per lookup, create and unlink instead of O(n). */
#define INDEX_MIN 32

static size_t dir_slot(const zb_inode *d, const char *name) {
    size_t mask = d->index_cap - 1, i = (size_t)zb_name_hash(name) & mask;
    while (d->index[i] && strcmp(d->ents[d->index[i] - 1].name, name)) i = (i + 1) & mask;
    return i;
}

/* (Re)build d's index for at least `n` entries (load <= 1/2); -ENOMEM leaves it absent. */
static int dir_index_build(zb_inode *d, size_t n) {
    size_t cap = 64;
    while (cap < 2 * n) cap *= 2;
    uint32_t *idx = calloc(cap, sizeof *idx);
    if (!idx) return -ENOMEM;
    free(d->index);
    d->index = idx;
    d->index_cap = cap;
    for (size_t k = 0; k < d->nents; k++) d->index[dir_slot(d, d->ents[k].name)] = (uint32_t)(k + 1);
    return 0;
}

/* Entry number of `name` in d, or -1. Scans small directories; indexes large ones on demand
 * (clones and loaded snapshots start without an index). */
static long dir_find(zb_inode *d, const char *name) {
    if (!d->index && d->nents >= INDEX_MIN) (void)dir_index_build(d, d->nents);
    if (d->index) {
        uint32_t k = d->index[dir_slot(d, name)];
        return k ? (long)k - 1 : -1;
    }
    for (size_t i = 0; i < d->nents; i++)
        if (!strcmp(d->ents[i].name, name)) return (long)i;
    return -1;
}

/* Remove the index slot of entry `k` (before the entries move): backward-shift deletion keeps
 * every other entry reachable from its home slot without tombstones. */
static void dir_index_remove(zb_inode *d, size_t k) {
    size_t mask = d->index_cap - 1, hole = dir_slot(d, d->ents[k].name), j = hole;
    for (;;) {
        j = (j + 1) & mask;
        if (!d->index[j]) break;
        size_t home = (size_t)zb_name_hash(d->ents[d->index[j] - 1].name) & mask;
        int movable = j > hole ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            d->index[hole] = d->index[j];
            hole = j;
        }
    }
    d->index[hole] = 0;
}

uint32_t zb_ovl_lookup(zb_fs *fs, uint32_t dir, const char *name) {
    zb_inode *d = zb_ovl_inode(fs, dir);
    if (!d || d->type != INO_DIR) return 0;
    long k = dir_find(d, name);
    return k < 0 ? 0 : d->ents[k].ino;
}

int zb_ovl_link(zb_fs *fs, uint32_t dir, const char *name, uint32_t ino) {
    zb_inode *d = zb_ovl_inode(fs, dir), *in = zb_ovl_inode(fs, ino);
    if (!d || !in) return -ENOENT;
    if (d->type != INO_DIR) return -ENOTDIR;
    if (zb_ovl_lookup(fs, dir, name)) return -EEXIST;
    if (d->nents == d->ents_cap) {
        size_t cap = d->ents_cap ? d->ents_cap * 2 : 8;
        zb_dirent *ne = realloc(d->ents, cap * sizeof *ne);
        if (!ne) return -ENOMEM;
        d->ents = ne;
        d->ents_cap = cap;
    }
    if (charge(fs, name_cost(name)) < 0) return -ENOSPC;
    char *copy = strdup(name);
    if (!copy) { uncharge(fs, name_cost(name)); return -ENOMEM; }
    d = zb_ovl_inode(fs, dir); /* (no realloc of the inode array happened, but stay explicit) */
    d->ents[d->nents].name = copy;
    d->ents[d->nents].ino = ino;
    d->nents++;
    if (d->index && 2 * d->nents > d->index_cap && dir_index_build(d, 2 * d->nents) < 0) {
        free(d->index); /* scanned (and indexed again on the next lookup) */
        d->index = NULL;
        d->index_cap = 0;
    } else if (d->index) {
        d->index[dir_slot(d, copy)] = (uint32_t)d->nents;
    }
    d->mtime_ns = wall_ns();
    in->nlink++;
    if (in->type == INO_DIR) in->parent = dir;
    return 0;
}

int zb_ovl_unlink(zb_fs *fs, uint32_t dir, const char *name) {
    zb_inode *d = zb_ovl_inode(fs, dir);
    if (!d || d->type != INO_DIR) return -ENOTDIR;
    long found = dir_find(d, name);
    if (found >= 0) {
        size_t i = (size_t)found, last = d->nents - 1;
        uint32_t ino = d->ents[i].ino;
        if (d->index) {
            dir_index_remove(d, i);
            if (i != last) d->index[dir_slot(d, d->ents[last].name)] = (uint32_t)(i + 1); /* it moves to i */
        }
        uncharge(fs, name_cost(d->ents[i].name));
        free(d->ents[i].name);
        d->ents[i] = d->ents[last];
        d->nents--;
        d->mtime_ns = wall_ns();
        zb_inode *in = zb_ovl_inode(fs, ino);
        if (in && --in->nlink == 0 && in->opens == 0) inode_release(fs, in);
        return 0;
    }
    return -ENOENT;
}

long zb_ovl_read(zb_fs *fs, uint32_t ino, void *buf, size_t len, uint64_t off) {
    zb_inode *in = zb_ovl_inode(fs, ino);
    if (!in) return -EBADF;
    if (in->type == INO_DIR) return -EISDIR;
    if (off >= in->size) return 0;
    len = ZB_MIN(len, in->size - off);
    size_t done = 0;
    while (done < len) {
        uint64_t pos = off + done;
        size_t bi = pos / ZB_BLOCK_SIZE, bo = pos % ZB_BLOCK_SIZE;
        size_t n = ZB_MIN(len - done, ZB_BLOCK_SIZE - bo);
        zb_block *b = bi < in->nblocks ? in->blocks[bi] : NULL;
        if (b && bo < b->cap) {
            size_t have = ZB_MIN(n, b->cap - bo);
            memcpy((uint8_t *)buf + done, b->data + bo, have);
            memset((uint8_t *)buf + done + have, 0, n - have);
        } else {
            memset((uint8_t *)buf + done, 0, n); /* a hole */
        }
        done += n;
    }
    return (long)len;
}

/* Make block bi exclusively ours and at least `need` bytes long. Each fs accounts for the blocks
 * it references, shared or not, so a clone's usage never depends on its siblings. */
static zb_block *block_for_write(zb_fs *fs, zb_inode *in, size_t bi, size_t need) {
    zb_block *b = in->blocks[bi];
    if (b && atomic_load(&b->refs) == 1 && b->cap >= need) return b;
    size_t cap = ZB_MAX(need, b ? b->cap : 0);
    cap = cap < 4096 ? 4096 : cap < ZB_BLOCK_SIZE ? ZB_MIN(ZB_BLOCK_SIZE, ZB_PAGE_UP(cap * 2)) : ZB_BLOCK_SIZE;
    uint64_t grow = cap - (b ? b->cap : 0);
    if (fs->bytes_used + grow > fs->bytes_limit) return NULL;
    zb_block *nb = calloc(1, sizeof *nb + cap);
    if (!nb) return NULL;
    atomic_init(&nb->refs, 1);
    nb->cap = cap;
    if (b) memcpy(nb->data, b->data, b->cap);
    fs->bytes_used += grow;
    zb_block_unref(b);
    in->blocks[bi] = nb;
    return nb;
}

long zb_ovl_write(zb_fs *fs, uint32_t ino, const void *buf, size_t len, uint64_t off) {
    zb_inode *in = zb_ovl_inode(fs, ino);
    if (!in) return -EBADF;
    if (in->type == INO_DIR) return -EISDIR;
    if (off + len < off || off + len > (1ull << 40)) return -EFBIG;
    size_t need_blocks = (off + len + ZB_BLOCK_SIZE - 1) / ZB_BLOCK_SIZE;
    if (need_blocks > in->nblocks) {
        zb_block **nb = realloc(in->blocks, need_blocks * sizeof *nb);
        if (!nb) return -ENOMEM;
        memset(nb + in->nblocks, 0, (need_blocks - in->nblocks) * sizeof *nb);
        in->blocks = nb;
        in->nblocks = need_blocks;
    }
    size_t done = 0;
    while (done < len) {
        uint64_t pos = off + done;
        size_t bi = pos / ZB_BLOCK_SIZE, bo = pos % ZB_BLOCK_SIZE;
        size_t n = ZB_MIN(len - done, ZB_BLOCK_SIZE - bo);
        zb_block *b = block_for_write(fs, in, bi, bo + n);
        if (!b) {
            if (!done) return -ENOSPC;
            break;
        }
        memcpy(b->data + bo, (const uint8_t *)buf + done, n);
        done += n;
    }
    if (off + done > in->size) in->size = off + done;
    in->mtime_ns = wall_ns();
    return (long)done;
}

int zb_ovl_truncate(zb_fs *fs, uint32_t ino, uint64_t size) {
    zb_inode *in = zb_ovl_inode(fs, ino);
    if (!in) return -EBADF;
    if (in->type != INO_FILE) return -EINVAL;
    if (size > (1ull << 40)) return -EFBIG;
    size_t keep = (size + ZB_BLOCK_SIZE - 1) / ZB_BLOCK_SIZE;
    for (size_t i = keep; i < in->nblocks; i++) {
        if (in->blocks[i]) fs->bytes_used -= in->blocks[i]->cap;
        zb_block_unref(in->blocks[i]);
        in->blocks[i] = NULL;
    }
    if (keep < in->nblocks) in->nblocks = keep;
    if (size < in->size && size % ZB_BLOCK_SIZE && keep) {
        /* zero the tail of the last kept block so a later extension reads zeros */
        size_t bi = keep - 1, bo = size % ZB_BLOCK_SIZE;
        zb_block *b = in->blocks[bi];
        if (b && bo < b->cap) {
            if (!(b = block_for_write(fs, in, bi, b->cap))) return -ENOSPC;
            memset(b->data + bo, 0, b->cap - bo);
        }
    }
    in->size = size;
    in->mtime_ns = wall_ns();
    return 0;
}

int zb_ovl_clone(zb_fs *dst, const zb_fs *src) {
    dst->inodes = calloc(src->ninodes ? src->ninodes : 1, sizeof(zb_inode));
    if (!dst->inodes) return -1;
    dst->ninodes = dst->inodes_cap = src->ninodes;
    dst->free_hint = src->free_hint;
    dst->bytes_used = src->bytes_used;
    for (size_t i = 1; i < src->ninodes; i++) {
        const zb_inode *s = &src->inodes[i];
        zb_inode *d = &dst->inodes[i];
        *d = *s;
        d->ents = NULL;
        d->index = NULL; /* rebuilt on demand */
        d->index_cap = 0;
        d->blocks = NULL;
        d->target = NULL;
        d->nents = d->ents_cap = d->nblocks = 0;
        if (s->type == INO_FREE) continue;
        if (s->nents) {
            if (!(d->ents = calloc(s->nents, sizeof *d->ents))) return -1;
            d->ents_cap = s->nents;
            for (size_t k = 0; k < s->nents; k++) {
                if (!(d->ents[k].name = strdup(s->ents[k].name))) return -1;
                d->ents[k].ino = s->ents[k].ino;
                d->nents++;
            }
        }
        if (s->nblocks) {
            if (!(d->blocks = calloc(s->nblocks, sizeof *d->blocks))) return -1;
            for (size_t k = 0; k < s->nblocks; k++) {
                d->blocks[k] = s->blocks[k];
                if (d->blocks[k]) atomic_fetch_add(&d->blocks[k]->refs, 1);
            }
            d->nblocks = s->nblocks;
        }
        if (s->target && !(d->target = strdup(s->target))) return -1;
    }
    return 0;
}

void zb_ovl_stat(zb_fs *fs, uint32_t ino, struct stat *st) {
    zb_inode *in = zb_ovl_inode(fs, ino);
    if (!in) return;
    st->st_dev = ZB_DEV_ID;
    st->st_ino = ino;
    st->st_blksize = in->type == INO_FILE ? ZB_IO_BLKSIZE : 4096; /* io.open sizes its buffers from this */
    st->st_uid = in->readonly ? 0 : 1000;
    st->st_gid = in->readonly ? 0 : 1000;
    st->st_nlink = in->type == INO_DIR ? 2 : in->nlink ? in->nlink : 1;
    st->st_mode = in->mode | (in->type == INO_DIR ? S_IFDIR : in->type == INO_SYMLINK ? S_IFLNK : S_IFREG);
    st->st_size = in->type == INO_SYMLINK ? (off_t)strlen(in->target) : (off_t)in->size;
    st->st_blocks = (st->st_size + 511) / 512;
    st->st_mtim.tv_sec = in->mtime_ns / 1000000000;
    st->st_mtim.tv_nsec = in->mtime_ns % 1000000000;
    st->st_ctim.tv_sec = in->ctime_ns / 1000000000;
    st->st_ctim.tv_nsec = in->ctime_ns % 1000000000;
    st->st_atim.tv_sec = in->atime_ns / 1000000000;
    st->st_atim.tv_nsec = in->atime_ns % 1000000000;
}

uint64_t zb_ovl_copy_bytes(const zb_fs *fs) {
    uint64_t bytes = fs->ninodes * sizeof(zb_inode);
    for (size_t i = 1; i < fs->ninodes; i++) {
        const zb_inode *in = &fs->inodes[i];
        if (in->type == INO_FREE) continue;
        bytes += zb_ovl_meta_cost(in) - INODE_COST + in->nblocks * sizeof(zb_block *);
    }
    return bytes;
}
