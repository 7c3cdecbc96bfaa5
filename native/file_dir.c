/* file_dir.c - open directories of any location (synthetic, host, overlay, project): read and
 * write say EISDIR; getdents64 serves a listing taken at the first call (zb_fs_list) and kept
 * while the directory is open (shared by the fd table's clones, charged to ZB_LISTING_BUDGET);
 * lseek(fd, 0, SEEK_SET) is rewinddir. fstat is the location's (zb_fs_stat). A synthetic
 * directory has neither a host fd nor an inode; a host directory has a host fd (fchdir and the
 * *at() calls use its path, not the fd); an overlay directory has its inode. The entry's listing
 * answer (guest_abi.h ZB_ENTRY_READ_BUF) takes the listing at the open and formats it here too.
 */
#include "memory.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"

#include <dirent.h>
#include <fcntl.h>

static long dir_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    (void)f;
    (void)p;
    (void)n;
    (void)off;
    return -EISDIR;
}

static long dir_write(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    (void)f;
    (void)p;
    (void)n;
    (void)off;
    return -EISDIR;
}

static long dir_seek(zb_sandbox *sb, zb_file *f, int64_t off, int whence) {
    (void)sb;
    if (whence != SEEK_SET || off != 0) return -EINVAL; /* rewinddir */
    zb_dir_drop_listing(f);
    f->offset = 0;
    return 0;
}

/* The directory's listing, taken at its first use and kept (0, -errno, or ZB_DEADLINE_PASSED:
 * the run must stop, which only a syscall handler may ask for). */
static long take_listing(zb_sandbox *sb, zb_file *f) {
    if (!f->where) return -ENOTDIR;
    if (f->listing) return 0;
    zb_listing *l = calloc(1, sizeof *l);
    if (!l) return -ENOMEM;
    long rc = zb_fs_list(sb, f->where, l);
    if (rc < 0) { free(l); return rc; }
    /* every open directory's listing is host memory: charged to the sandbox's budget */
    if (zb_fdtable_listing_bytes(sb->fds) + l->bytes > ZB_LISTING_BUDGET) {
        zb_listing_free(l);
        free(l);
        return -ENOMEM;
    }
    atomic_init(&l->refs, 1);
    f->listing = l;
    return 0;
}

/* Linux's struct linux_dirent64 records of entries from *k on into out (len bytes at most, whole
 * records), *k advanced past them; the bytes written, or -EINVAL if not even the first fits. */
static long format_dirents(const zb_listing *l, uint64_t *k, uint8_t *out, size_t len) {
    size_t used = 0;
    while (*k < l->n) {
        const struct zb_listing_ent *e = &l->ents[*k];
        size_t namelen = strlen(e->name);
        size_t reclen = (offsetof(struct dirent64, d_name) + namelen + 1 + 7) & ~7ul;
        if (used + reclen > len) {
            if (!used) return -EINVAL;
            break;
        }
        /* built aligned here, then copied: the guest's buffer may sit at any address */
        struct { struct dirent64 d; char name[NAME_MAX + 8]; } rec;
        memset(&rec, 0, reclen);
        rec.d.d_ino = e->ino;
        rec.d.d_off = (int64_t)*k + 1;
        rec.d.d_reclen = (unsigned short)reclen;
        rec.d.d_type = e->type;
        memcpy(rec.d.d_name, e->name, namelen + 1);
        memcpy(out + used, &rec, reclen);
        used += reclen;
        (*k)++;
    }
    return (long)used;
}

static long dir_getdents(zb_sandbox *sb, zb_file *f, uint64_t addr, uint64_t len) {
    long rc = take_listing(sb, f);
    if (rc < 0) return rc == ZB_DEADLINE_PASSED ? zb_stop_for_deadline(sb) : rc;
    uint8_t *out = zb_guest_ptr(sb, addr, len, 1);
    if (!out) return -EFAULT;
    return format_dirents(f->listing, &f->offset, out, len);
}

long zb_dir_dirents_all(zb_sandbox *sb, zb_file *f, uint8_t *out, size_t len) {
    if (f->kind != FILE_DIR) return -ENOTDIR;
    long rc = take_listing(sb, f);
    if (rc < 0) return rc == ZB_DEADLINE_PASSED ? -EINTR : rc; /* the getdents64 will stop the run */
    uint64_t k = f->offset;
    rc = format_dirents(f->listing, &k, out, len);
    return rc >= 0 && k < f->listing->n ? -ENOSPC : rc;
}

void zb_dir_drop_listing(zb_file *f) {
    zb_listing_unref(f->listing);
    f->listing = NULL;
}

uint64_t zb_dir_dirents_count(const uint8_t *p, size_t len) {
    uint64_t k = 0;
    for (size_t off = 0; off + offsetof(struct dirent64, d_name) <= len;) {
        unsigned short reclen;
        memcpy(&reclen, p + off + offsetof(struct dirent64, d_reclen), sizeof reclen);
        if (reclen < offsetof(struct dirent64, d_name) || reclen > len - off) break;
        off += reclen;
        k++;
    }
    return k;
}

static long dir_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    memset(st, 0, sizeof *st);
    return f->where ? zb_fs_stat(sb, f->where, st) : -EBADF;
}

static long dir_chown(zb_sandbox *sb, zb_file *f, uint64_t uid, uint64_t gid) {
    (void)sb;
    return f->ino ? zb_own_ids(uid, gid) : -EROFS; /* host and synthetic directories are the view's */
}

static uint32_t dir_overlay_ino(const zb_file *f) { return f->ino; }

static void dir_release(zb_fs *fs, zb_file *f) {
    (void)fs;
    zb_listing_unref(f->listing);
}

/* A listing is immutable once taken: shared, never copied (a snapshot costs nothing here). */
static int dir_clone(zb_file *dst, const zb_file *src) {
    if (src->listing) {
        dst->listing = src->listing;
        atomic_fetch_add(&dst->listing->refs, 1);
    }
    return 0;
}

const zb_file_ops zb_file_dir_ops = {
    .name = "directory",
    .props = ZB_FOPS_NO_EPOLL,
    .status_flags = O_DIRECTORY,
    .read = dir_read,
    .write = dir_write,
    .positional = zb_always,
    .seek = dir_seek,
    .getdents = dir_getdents,
    .stat = dir_stat,
    .chown = dir_chown,
    .overlay_ino = dir_overlay_ino,
    .release = dir_release,
    .clone = dir_clone,
    .reopen = zb_host_reopen,
};

/* Open a LOC_SYNTH location: a directory that exists only to lead to what is visible. */
long zb_synth_open(zb_sandbox *sb, zb_resolved *r, uint64_t flags, zb_file **out) {
    (void)sb;
    (void)r;
    (void)flags;
    return (*out = zb_file_new(FILE_DIR)) ? 0 : -ENOMEM;
}
