/* file_host.c - host files: the view's read-only files and a project's files (read-only, or
 * writable in a read-write project), read and written with pread/pwrite at the description's own
 * offset so that the clones a snapshot makes can share one host fd. Opening a host location (a
 * file or a directory) is here too; the host fd is always opened symlink-free (zb_host_open_ro,
 * zb_proj_host_open).
 */
#include "util.h"
#include "memory.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"

#include <fcntl.h>
#include <unistd.h>

static long host_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    uint64_t pos = off < 0 ? f->offset : (uint64_t)off;
    long r = ZB_HOSTCALL(pread(f->host->fd, p, n, (off_t)pos));
    if (r < 0) return -errno;
    if (r > 0 && off < 0) f->offset += (uint64_t)r;
    return r;
}

/* Only a read-write project's files are opened for writing. */
static long host_write(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    long denied = zb_file_write_check(f); /* the project is no longer read-write */
    if (denied) return denied;
    struct stat st;
    uint64_t pos = off >= 0 ? (uint64_t)off : f->offset;
    if (off < 0 && (f->flags & O_APPEND)) pos = ZB_HOSTCALL(fstat(f->host->fd, &st)) == 0 ? (uint64_t)st.st_size : pos;
    long r = ZB_HOSTCALL(pwrite(f->host->fd, p, n, (off_t)pos));
    if (r < 0) return -errno;
    if (off < 0) f->offset = pos + (uint64_t)r;
    return r;
}

static long host_seek(zb_sandbox *sb, zb_file *f, int64_t off, int whence) {
    (void)sb;
    /* only SEEK_END/DATA/HOLE need the size (CPython's lseek(fd, 0, SEEK_CUR) on every open does not) */
    if (whence == SEEK_SET || whence == SEEK_CUR) return zb_file_seek_sized(f, off, whence, 0);
    struct stat st;
    if (ZB_HOSTCALL(fstat(f->host->fd, &st)) < 0) return -errno;
    return zb_file_seek_sized(f, off, whence, st.st_size);
}

static long host_truncate(zb_sandbox *sb, zb_file *f, uint64_t size) {
    (void)sb;
    return ZB_HOSTCALL(ftruncate(f->host->fd, (off_t)size)) < 0 ? -errno : 0; /* a read-write project's file */
}

/* Copy up to len bytes of a host file at off into guest memory (the rest stays zero). */
static long copy_host_file(zb_memory *m, int fd, uint64_t addr, uint64_t len, uint64_t off) {
    uint64_t done = 0;
    while (done < len) {
        ssize_t n = ZB_HOSTCALL(pread(fd, m->host + addr + done, len - done, (off_t)(off + done)));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -errno;
        if (n == 0) break;
        done += (uint64_t)n;
    }
    zb_mem_dirty(m, addr, len);
    return 0;
}

/* Whether a host file can shrink under a mapping through the guest or the notebook's user: a file
 * of a project (the notebook's folder), as opposed to the view's installed, read-only software. */
static int host_file_may_shrink(const zb_file *f) {
    return !f->where || f->where->loc.proj || f->where->parent.proj || (f->flags & O_ACCMODE) != O_RDONLY;
}

/* View files are mapped copy-on-write, project files are copied. */
static long host_mmap_fill(zb_sandbox *sb, zb_file *f, uint64_t addr, uint64_t len, uint64_t off) {
    zb_memory *m = &sb->mem;
    struct stat st;
    if (ZB_HOSTCALL(fstat(f->host->fd, &st)) < 0) return -errno;
    uint64_t size = (uint64_t)st.st_size;
    if (off >= size) return 0;
    uint64_t n = ZB_MIN(len, ZB_PAGE_UP(size - off));
    /* Pages of a file mapping past the file's end raise SIGBUS in whoever touches them, and the
     * engine touches guest memory (syscall buffers, snapshots): a project file truncated under
     * the guest's mapping (by the guest itself in read-write mode, or by the user's editor)
     * would kill the engine process. Such files are copied; only the view is mapped. */
    if (host_file_may_shrink(f)) return copy_host_file(m, f->host->fd, addr, n, off);
    return zb_mem_map_file(m, addr, n, f->host->fd, off);
}

static long host_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    (void)sb;
    memset(st, 0, sizeof *st);
    if (ZB_HOSTCALL(fstat(f->host->fd, st)) < 0) return -errno;
    if (S_ISREG(st->st_mode)) st->st_blksize = ZB_IO_BLKSIZE;
    if (f->where && f->where->loc.proj) zb_proj_owner(st);
    return 0;
}

static long host_chown(zb_sandbox *sb, zb_file *f, uint64_t uid, uint64_t gid) {
    (void)sb;
    (void)f;
    (void)uid;
    (void)gid;
    return -EROFS; /* the host's metadata stays the host's */
}

/* A loaded snapshot's host file or directory: open it again (zb_fds_load). */
int zb_host_reopen(zb_file *f, const zb_resolved *r, char *err) {
    if (r->loc.kind != LOC_HOST) return 0;
    int fd = zb_host_open_ro(r->path, r->loc.is_dir);
    if (fd < 0) { zb_seterr(err, "the template had host file %s open, which cannot be opened now: %s", r->path, strerror(-fd)); return -1; }
    if (!(f->host = zb_hostfd_new(fd))) { close(fd); zb_seterr(err, "out of memory"); return -1; }
    return 0;
}

const zb_file_ops zb_file_host_ops = {
    .name = "host file",
    .props = ZB_FOPS_NO_EPOLL | ZB_FOPS_MMAP_COPIES,
    .read = host_read,
    .write = host_write,
    .positional = zb_always,
    .seek = host_seek,
    .truncate = host_truncate,
    .mmap_fill = host_mmap_fill,
    .stat = host_stat,
    .chown = host_chown,
    .reopen = zb_host_reopen,
};

/* Open a LOC_HOST location read-only: a file, or a directory (FILE_DIR). */
long zb_host_open(zb_sandbox *sb, zb_resolved *r, uint64_t flags, zb_file **out) {
    (void)sb;
    if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC)) return -EROFS;
    int fd = zb_host_open_ro(r->path, r->loc.is_dir);
    if (fd < 0) return fd;
    zb_hostfd *h = zb_hostfd_new(fd);
    zb_file *f = h ? zb_file_new(r->loc.is_dir ? FILE_DIR : FILE_HOST) : NULL;
    if (!f) { if (h) zb_hostfd_unref(h); else close(fd); return -ENOMEM; }
    f->host = h;
    *out = f;
    return 0;
}

/* Open r for writing/creating in a read-write project: on the host, confined to the tree; r
 * becomes the host file's location. */
long zb_host_open_project(zb_sandbox *sb, zb_resolved *r, uint64_t flags, uint64_t mode, zb_file **out) {
    int fd = zb_proj_host_open(r, (int)(flags & (O_ACCMODE | O_CREAT | O_EXCL | O_TRUNC | O_APPEND)),
                               (unsigned)(mode & ~sb->proc.umask));
    if (fd < 0) return fd;
    zb_hostfd *h = zb_hostfd_new(fd);
    zb_file *f = h ? zb_file_new(FILE_HOST) : NULL;
    if (!f) { if (h) zb_hostfd_unref(h); else close(fd); return -ENOMEM; }
    f->host = h;
    r->exists = 1;
    r->loc.kind = LOC_HOST;
    r->loc.lower = 1;
    r->loc.proj = PROJ_READWRITE;
    r->loc.proj_root = r->parent.proj_root;
    *out = f;
    return 0;
}
