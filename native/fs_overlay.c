/* fs_overlay.c - the guest's private in-memory files (/tmp, the home directory, ...).
 *
 * Inodes live in chunks of ZB_INODE_CHUNK owned by one sandbox and shared copy-on-write with its
 * snapshots: a clone takes a reference on each chunk, and the first access to an inode through
 * zb_ovl_inode copies that chunk if it is shared. A directory's entries (zb_dirtab) are shared the
 * same way (copied when changed), and so are the name strings (refcounted) and the file data
 * (refcounted 64 KiB blocks, copied per block on write), so snapshots of a sandbox with many or
 * large files stay cheap.
 */
#include "util.h"
#include "fs.h"

#include <dirent.h>
#include <stddef.h>
#include <time.h>

static int64_t wall_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Engine memory an overlay object costs besides its file data: an inode, a directory entry with
 * its name, a symlink's target. It is charged to the same limit as the data (as a tmpfs charges
 * inodes and names), otherwise a guest could make the engine hold gigabytes of names and 4 KiB
 * symlink targets. */
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

/* ---- refcounted names ---- */

typedef struct {
    atomic_int refs;
    char s[];
} name_hdr;

static name_hdr *hdr_of(char *s) { return (name_hdr *)(s - offsetof(name_hdr, s)); }

static char *name_new(const char *s) {
    size_t len = strlen(s);
    name_hdr *h = malloc(sizeof *h + len + 1);
    if (!h) return NULL;
    atomic_init(&h->refs, 1);
    memcpy(h->s, s, len + 1);
    return h->s;
}

static void name_ref(char *s) { atomic_fetch_add(&hdr_of(s)->refs, 1); }

static void name_unref(char *s) {
    if (s && atomic_fetch_sub(&hdr_of(s)->refs, 1) == 1) free(hdr_of(s));
}

/* ---- directory tables ---- */

static void dirtab_unref(zb_dirtab *t) {
    if (!t || atomic_fetch_sub(&t->refs, 1) != 1) return;
    for (size_t i = 0; i < t->n; i++) name_unref(t->ents[i].name);
    free(t->ents);
    free(t->index);
    free(t);
}

static void dir_sync(zb_inode *d) {
    d->ents = d->dir ? d->dir->ents : NULL;
    d->nents = d->dir ? d->dir->n : 0;
}

/* Make d's entries its own before changing them: a shared table is copied (the array and the
 * index; the names are shared), an absent one created. 0 or -ENOMEM. */
static int dir_own(zb_inode *d) {
    zb_dirtab *t = d->dir;
    if (t && atomic_load(&t->refs) == 1) return 0;
    zb_dirtab *c = calloc(1, sizeof *c);
    if (!c) return -ENOMEM;
    atomic_init(&c->refs, 1);
    if (t && t->n) {
        if (!(c->ents = malloc(t->n * sizeof *c->ents))) { free(c); return -ENOMEM; }
        memcpy(c->ents, t->ents, t->n * sizeof *c->ents);
        c->n = c->cap = t->n;
        if (t->index && (c->index = malloc(t->index_cap * sizeof *c->index))) {
            memcpy(c->index, t->index, t->index_cap * sizeof *c->index);
            c->index_cap = t->index_cap;
        }
        for (size_t i = 0; i < c->n; i++) name_ref(c->ents[i].name);
    }
    dirtab_unref(t);
    d->dir = c;
    dir_sync(d);
    return 0;
}

/* Make d's entries its own, with room for one more: its table, or NULL if out of memory. */
static zb_dirtab *dir_room(zb_inode *d) {
    if (dir_own(d) < 0) return NULL;
    zb_dirtab *t = d->dir;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8;
        zb_dirent *ne = realloc(t->ents, cap * sizeof *ne);
        if (!ne) return NULL;
        t->ents = ne;
        t->cap = cap;
    }
    return t;
}

int zb_ovl_dir_append(zb_inode *d, const char *name, uint32_t ino) {
    zb_dirtab *t = dir_room(d);
    if (!t) return -ENOMEM;
    char *copy = name_new(name);
    if (!copy) return -ENOMEM;
    t->ents[t->n].name = copy;
    t->ents[t->n].ino = ino;
    t->n++;
    free(t->index); /* rebuilt on the next lookup */
    t->index = NULL;
    t->index_cap = 0;
    dir_sync(d);
    return 0;
}

/* ---- inode chunks ---- */

void zb_block_unref(zb_block *b) {
    if (b && atomic_fetch_sub(&b->refs, 1) == 1) free(b);
}

/* Free what an inode holds (no accounting: the caller's fs is going away, or accounts itself). */
static void inode_drop(zb_inode *in) {
    dirtab_unref(in->dir);
    for (size_t i = 0; i < in->nblocks; i++) zb_block_unref(in->blocks[i]);
    free(in->blocks);
    free(in->target);
    memset(in, 0, sizeof *in);
}

static void chunk_unref(zb_inode_chunk *c) {
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    for (size_t i = 0; i < ZB_INODE_CHUNK; i++)
        if (c->in[i].type != INO_FREE) inode_drop(&c->in[i]);
    free(c);
}

/* A private copy of a shared chunk: the inodes, with references on their directory tables and
 * data blocks, and their own block tables and symlink targets. NULL if out of memory. */
static zb_inode_chunk *chunk_copy(const zb_inode_chunk *src) {
    zb_inode_chunk *c = malloc(sizeof *c);
    if (!c) return NULL;
    memcpy(c->in, src->in, sizeof c->in);
    atomic_init(&c->refs, 1);
    int failed = 0;
    for (size_t i = 0; i < ZB_INODE_CHUNK; i++) {
        zb_inode *in = &c->in[i];
        if (in->type == INO_FREE) continue;
        if (failed) { memset(in, 0, sizeof *in); continue; }
        const zb_inode *s = &src->in[i];
        if (in->dir) atomic_fetch_add(&in->dir->refs, 1);
        in->blocks = NULL;
        in->target = NULL;
        if (s->nblocks && !(in->blocks = malloc(s->nblocks * sizeof *in->blocks))) in->nblocks = 0, failed = 1;
        for (size_t k = 0; in->blocks && k < s->nblocks; k++) {
            in->blocks[k] = s->blocks[k];
            if (in->blocks[k]) atomic_fetch_add(&in->blocks[k]->refs, 1);
        }
        if (s->target && !(in->target = strdup(s->target))) failed = 1;
    }
    if (failed) {
        chunk_unref(c);
        return NULL;
    }
    return c;
}

const zb_inode *zb_ovl_peek(const zb_fs *fs, size_t i) {
    return i < fs->ninodes ? &fs->chunks[i / ZB_INODE_CHUNK]->in[i % ZB_INODE_CHUNK] : NULL;
}

zb_inode *zb_ovl_slot(zb_fs *fs, size_t i) {
    if (i >= fs->nchunks * ZB_INODE_CHUNK) return NULL;
    zb_inode_chunk **cp = &fs->chunks[i / ZB_INODE_CHUNK];
    if (atomic_load(&(*cp)->refs) > 1) { /* shared with a snapshot: this fs gets its own copy */
        zb_inode_chunk *c = chunk_copy(*cp);
        if (!c) return NULL;
        chunk_unref(*cp);
        *cp = c;
    }
    return &(*cp)->in[i % ZB_INODE_CHUNK];
}

int zb_ovl_reserve(zb_fs *fs, size_t n) {
    size_t need = (n + ZB_INODE_CHUNK - 1) / ZB_INODE_CHUNK;
    if (need <= fs->nchunks) return 0;
    zb_inode_chunk **nc = realloc(fs->chunks, need * sizeof *nc);
    if (!nc) return -1;
    fs->chunks = nc;
    while (fs->nchunks < need) {
        zb_inode_chunk *c = calloc(1, sizeof *c);
        if (!c) return -1;
        atomic_init(&c->refs, 1);
        fs->chunks[fs->nchunks++] = c;
    }
    return 0;
}

zb_inode *zb_ovl_inode(zb_fs *fs, uint32_t ino) {
    if (!ino || ino >= fs->ninodes || zb_ovl_peek(fs, ino)->type == INO_FREE) return NULL;
    return zb_ovl_slot(fs, ino);
}

uint32_t zb_ovl_new_inode(zb_fs *fs, int type, uint32_t mode) {
    uint32_t ino = 0;
    size_t i = fs->free_hint > 1 ? fs->free_hint : 1;
    for (; i < fs->ninodes; i++)
        if (zb_ovl_peek(fs, i)->type == INO_FREE) { ino = (uint32_t)i; break; }
    fs->free_hint = i; /* everything below is in use */
    if (charge(fs, INODE_COST) < 0) return 0;
    if (!ino) {
        if (fs->ninodes >= 1u << 20 || zb_ovl_reserve(fs, fs->ninodes + 1) < 0) { uncharge(fs, INODE_COST); return 0; }
        ino = (uint32_t)fs->ninodes++;
    }
    zb_inode *in = zb_ovl_slot(fs, ino);
    if (!in) { uncharge(fs, INODE_COST); return 0; }
    memset(in, 0, sizeof *in);
    in->type = type;
    in->mode = mode & 07777;
    in->atime_ns = in->mtime_ns = in->ctime_ns = wall_ns();
    return ino;
}

static void inode_release(zb_fs *fs, uint32_t ino, zb_inode *in) {
    uncharge(fs, zb_ovl_meta_cost(in));
    for (size_t i = 0; i < in->nblocks; i++)
        if (in->blocks[i]) fs->bytes_used -= ZB_MIN(in->blocks[i]->cap, fs->bytes_used);
    inode_drop(in);
    if (ino < fs->free_hint) fs->free_hint = ino;
}

void zb_ovl_open_ref(zb_fs *fs, uint32_t ino, int delta) {
    zb_inode *in = zb_ovl_inode(fs, ino);
    if (!in) return;
    if (delta > 0) in->opens += delta;
    else if (in->opens >= (uint32_t)-delta) in->opens += delta;
    if (in->opens == 0 && in->nlink == 0 && in->type != INO_DIR) inode_release(fs, ino, in);
}

void zb_ovl_discard(zb_fs *fs, uint32_t ino) {
    zb_inode *in = zb_ovl_inode(fs, ino);
    if (in && !in->nlink && !in->opens) inode_release(fs, ino, in);
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
    for (size_t i = 0; i < fs->nchunks; i++) chunk_unref(fs->chunks[i]);
    free(fs->chunks);
    fs->chunks = NULL;
    fs->nchunks = fs->ninodes = fs->free_hint = 0;
}

/* ---- directory indexes ---- */
/* Directories up to this many entries are scanned; larger ones get a hash index, so that a
 * directory of 80,000 files costs O(1) per lookup, create and unlink instead of O(n). */
#define INDEX_MIN 32

_Static_assert(offsetof(zb_dirent, name) == 0, "zb_name_slot reads names at offset 0");

static size_t dir_slot(const zb_dirtab *t, const char *name) {
    return zb_name_slot(t->index, t->index_cap, t->ents, sizeof *t->ents, name);
}

/* (Re)build t's index for at least `n` entries (load <= 1/2); -ENOMEM leaves it absent. An index
 * is a cache of the entries: it may be built on a table shared with snapshots. */
static int dir_index_build(zb_dirtab *t, size_t n) {
    return zb_name_index_build(&t->index, &t->index_cap, t->ents, sizeof *t->ents, t->n, n);
}

/* Entry number of `name` in d, or -1. Scans small directories; indexes large ones on demand
 * (loaded snapshots start without an index). */
static long dir_find(zb_inode *d, const char *name) {
    zb_dirtab *t = d->dir;
    if (!t) return -1;
    if (!t->index && t->n >= INDEX_MIN) (void)dir_index_build(t, t->n);
    if (t->index) {
        uint32_t k = t->index[dir_slot(t, name)];
        return k ? (long)k - 1 : -1;
    }
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->ents[i].name, name)) return (long)i;
    return -1;
}

/* Remove the index slot of entry `k` (before the entries move): backward-shift deletion keeps
 * every other entry reachable from its home slot without tombstones. */
static void dir_index_remove(zb_dirtab *t, size_t k) {
    size_t mask = t->index_cap - 1, hole = dir_slot(t, t->ents[k].name), j = hole;
    for (;;) {
        j = (j + 1) & mask;
        if (!t->index[j]) break;
        size_t home = (size_t)zb_name_hash(t->ents[t->index[j] - 1].name) & mask;
        int movable = j > hole ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            t->index[hole] = t->index[j];
            hole = j;
        }
    }
    t->index[hole] = 0;
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
    if (dir_find(d, name) >= 0) return -EEXIST;
    zb_dirtab *t = dir_room(d);
    if (!t) return -ENOMEM;
    if (charge(fs, name_cost(name)) < 0) return -ENOSPC;
    char *copy = name_new(name);
    if (!copy) { uncharge(fs, name_cost(name)); return -ENOMEM; }
    t->ents[t->n].name = copy;
    t->ents[t->n].ino = ino;
    t->n++;
    if (t->index && 2 * t->n > t->index_cap && dir_index_build(t, 2 * t->n) < 0) {
        free(t->index); /* scanned (and indexed again on the next lookup) */
        t->index = NULL;
        t->index_cap = 0;
    } else if (t->index) {
        t->index[dir_slot(t, copy)] = (uint32_t)t->n;
    }
    dir_sync(d);
    /* as Linux: a new entry changes the directory (mtime, ctime) and the linked inode (ctime, nlink) */
    d->mtime_ns = d->ctime_ns = wall_ns();
    in->ctime_ns = d->ctime_ns;
    in->nlink++;
    if (in->type == INO_DIR) in->parent = dir;
    return 0;
}

int zb_ovl_unlink(zb_fs *fs, uint32_t dir, const char *name) {
    zb_inode *d = zb_ovl_inode(fs, dir);
    if (!d || d->type != INO_DIR) return -ENOTDIR;
    long found = dir_find(d, name);
    if (found < 0) return -ENOENT;
    if (dir_own(d) < 0) return -ENOMEM;
    zb_dirtab *t = d->dir;
    size_t i = (size_t)found, last = t->n - 1;
    uint32_t ino = t->ents[i].ino;
    if (t->index) {
        dir_index_remove(t, i);
        if (i != last) t->index[dir_slot(t, t->ents[last].name)] = (uint32_t)(i + 1); /* it moves to i */
    }
    uncharge(fs, name_cost(t->ents[i].name));
    name_unref(t->ents[i].name);
    t->ents[i] = t->ents[last];
    t->n--;
    dir_sync(d);
    d->mtime_ns = d->ctime_ns = wall_ns();
    zb_inode *in = zb_ovl_inode(fs, ino);
    if (in) in->ctime_ns = d->ctime_ns;
    if (in && --in->nlink == 0 && in->opens == 0) inode_release(fs, ino, in);
    return 0;
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
    in->mtime_ns = in->ctime_ns = wall_ns();
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
    in->mtime_ns = in->ctime_ns = wall_ns();
    return 0;
}

int zb_ovl_clone(zb_fs *dst, const zb_fs *src) {
    if (!(dst->chunks = malloc(ZB_MAX(src->nchunks, 1) * sizeof *dst->chunks))) return -1;
    for (size_t i = 0; i < src->nchunks; i++) {
        dst->chunks[i] = src->chunks[i];
        atomic_fetch_add(&dst->chunks[i]->refs, 1);
    }
    dst->nchunks = src->nchunks;
    dst->ninodes = src->ninodes;
    dst->free_hint = src->free_hint;
    dst->bytes_used = src->bytes_used;
    return 0;
}

unsigned char zb_ovl_dtype(const zb_inode *in) {
    switch (in->type) {
    case INO_DIR: return DT_DIR;
    case INO_SYMLINK: return DT_LNK;
    case INO_SOCKET: return DT_SOCK;
    case INO_FIFO: return DT_FIFO;
    default: return DT_REG;
    }
}

void zb_ovl_stat(zb_fs *fs, uint32_t ino, struct stat *st) {
    zb_inode *in = zb_ovl_inode(fs, ino);
    if (!in) return;
    st->st_dev = ZB_DEV_ID;
    st->st_ino = ino;
    st->st_blksize = in->type == INO_FILE ? ZB_IO_BLKSIZE : 4096; /* io.open sizes its buffers from this */
    st->st_uid = in->readonly ? 0 : 1000;
    st->st_gid = in->readonly ? 0 : 1000;
    st->st_nlink = in->type == INO_DIR ? 2 : in->nlink ? in->nlink : in->memfd ? 0 : 1; /* a memfd is never named */
    st->st_mode = in->mode | (in->type == INO_DIR ? S_IFDIR : in->type == INO_SYMLINK ? S_IFLNK
                              : in->type == INO_SOCKET ? S_IFSOCK : in->type == INO_FIFO ? S_IFIFO : S_IFREG);
    /* a directory is one 4 KiB block, as ext4 reports a small one (the notebook folder's usual
     * file system): tools and code that read a directory's size see what they see on the host */
    st->st_size = in->type == INO_SYMLINK ? (off_t)strlen(in->target) : in->type == INO_DIR ? 4096 : (off_t)in->size;
    st->st_blocks = (st->st_size + 511) / 512;
    st->st_mtim.tv_sec = in->mtime_ns / 1000000000;
    st->st_mtim.tv_nsec = in->mtime_ns % 1000000000;
    st->st_ctim.tv_sec = in->ctime_ns / 1000000000;
    st->st_ctim.tv_nsec = in->ctime_ns % 1000000000;
    st->st_atim.tv_sec = in->atime_ns / 1000000000;
    st->st_atim.tv_nsec = in->atime_ns % 1000000000;
}

uint64_t zb_ovl_private_bytes(const zb_fs *fs) {
    uint64_t bytes = fs->nchunks * sizeof *fs->chunks;
    for (size_t c = 0; c < fs->nchunks; c++) {
        const zb_inode_chunk *ch = fs->chunks[c];
        if (atomic_load(&ch->refs) > 1) continue; /* shared: the sandbox or another snapshot has it too */
        bytes += sizeof *ch;
        for (size_t i = 0; i < ZB_INODE_CHUNK; i++) {
            const zb_inode *in = &ch->in[i];
            if (in->type == INO_FREE) continue;
            bytes += in->nblocks * sizeof *in->blocks + (in->target ? strlen(in->target) + 1 : 0);
            if (in->dir && atomic_load(&in->dir->refs) == 1)
                bytes += sizeof *in->dir + in->dir->cap * sizeof(zb_dirent) + in->dir->index_cap * sizeof(uint32_t);
        }
    }
    return bytes;
}
