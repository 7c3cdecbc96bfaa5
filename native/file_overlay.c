/* file_overlay.c - overlay files: regular files of the in-memory overlay (fs_overlay.c), also the
 * upper copies of an overlay project's files, unnamed O_TMPFILE files and the private snapshots
 * of /proc files. An open description counts as an open of its inode, so an unlinked file lives
 * while it is open. Opening an overlay location (a file or a directory) is here too.
 * Shared mappings of a file are authoritative for their range (shared_map.c): reads and mmap fills
 * write them back first, writes and truncations refresh them.
 */
#include "memory.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "shared_map.h"

#include <fcntl.h>

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
#ifndef F_SEAL_EXEC
#define F_SEAL_EXEC 0x0020
#endif
#define ALL_SEALS (F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_FUTURE_WRITE | F_SEAL_EXEC)

/* How many of the n bytes a write at pos may put into a sealed memfd, as Linux's shmem_write_begin
 * decides page by page: none under F_SEAL_WRITE/FUTURE_WRITE (-EPERM), and under F_SEAL_GROW the
 * whole pages before the one that would pass the end of the file (-EPERM if that is none). */
static long sealed_write_room(const zb_inode *in, uint64_t pos, size_t n) {
    if (!in->seals) return (long)n;
    if (in->seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) return -EPERM;
    if (!(in->seals & F_SEAL_GROW) || pos + n <= in->size) return (long)n;
    uint64_t ok_end = in->size & ~(uint64_t)(ZB_PAGE - 1); /* the page holding the end would grow it */
    return ok_end > pos ? (long)ZB_MIN((uint64_t)n, ok_end - pos) : -EPERM;
}

static long overlay_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, int64_t off) {
    uint64_t pos = off < 0 ? f->offset : (uint64_t)off;
    if (zb_shmap_writeback(sb, f->ino, pos, n) < 0) return -EIO; /* a mapping's bytes did not fit the overlay */
    long r = zb_ovl_read(sb->fs, f->ino, p, n, pos);
    if (r > 0 && off < 0) f->offset += (uint64_t)r;
    return r;
}

static long overlay_write(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off) {
    zb_inode *in = zb_ovl_inode(sb->fs, f->ino);
    if (!in) return -EBADF;
    long denied = zb_file_write_check(f); /* a project file, and the project's mode changed */
    if (denied) return denied;
    uint64_t pos = off >= 0 ? (uint64_t)off : (f->flags & O_APPEND) ? in->size : f->offset;
    long room = sealed_write_room(in, pos, n);
    if (room < 0) return room;
    n = (size_t)room;
    uint64_t old_size = in->size;
    long r = zb_ovl_write(sb->fs, f->ino, p, n, pos);
    if (r > 0) zb_shmap_reload(sb, f->ino, ZB_MIN(pos, old_size), pos + (uint64_t)r - ZB_MIN(pos, old_size));
    if (r > 0 && off < 0) f->offset = pos + (uint64_t)r;
    return r;
}

static long overlay_seek(zb_sandbox *sb, zb_file *f, int64_t off, int whence) {
    return zb_file_seek_sized(f, off, whence, (int64_t)zb_ovl_inode(sb->fs, f->ino)->size);
}

static long overlay_truncate(zb_sandbox *sb, zb_file *f, uint64_t size) {
    const zb_inode *in = zb_ovl_inode(sb->fs, f->ino);
    if (in && ((size < in->size && (in->seals & F_SEAL_SHRINK)) || (size > in->size && (in->seals & F_SEAL_GROW))))
        return -EPERM; /* a sealed memfd */
    return zb_overlay_truncate(sb, f->ino, size);
}

static long overlay_fallocate(zb_sandbox *sb, zb_file *f, uint64_t end) {
    zb_inode *in = zb_ovl_inode(sb->fs, f->ino);
    if (end > in->size && (in->seals & F_SEAL_GROW)) return -EPERM;
    return end > in->size ? zb_overlay_truncate(sb, f->ino, end) : 0;
}

/* F_ADD_SEALS and F_GET_SEALS of a memfd (memfd_fcntl in Linux); other overlay files have no seals
 * (EINVAL, as a file system without them answers), and F_GETPIPE_SZ of a file is EBADF. */
static long overlay_fcntl(zb_sandbox *sb, zb_file *f, unsigned cmd, uint64_t arg) {
    zb_inode *in = zb_ovl_inode(sb->fs, f->ino);
    if (cmd == F_GETPIPE_SZ || cmd == F_SETPIPE_SZ) return -EBADF;
    if ((cmd != F_ADD_SEALS && cmd != F_GET_SEALS) || !in || !in->memfd) return -EINVAL;
    if (cmd == F_GET_SEALS) return (long)in->seals;
    unsigned seals = (unsigned)arg;
    if ((f->flags & O_ACCMODE) == O_RDONLY) return -EPERM;
    if (seals & ~(unsigned)ALL_SEALS) return -EINVAL;
    if (in->seals & F_SEAL_SEAL) return -EPERM;
    if ((seals & F_SEAL_WRITE) && !(in->seals & F_SEAL_WRITE) && zb_shmap_mapped(sb, f->ino)) return -EBUSY;
    if ((seals & F_SEAL_EXEC) && (in->mode & 0111)) /* W^X from the start, as Linux 6.3+ */
        seals |= F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_FUTURE_WRITE;
    in->seals |= seals;
    return 0;
}

int zb_memfd_where(zb_file *f, const char *path) {
    if (!(f->where = zb_where_new())) return -ENOMEM;
    memset(f->where, 0, sizeof *f->where);
    f->where->exists = 1;
    f->where->loc.kind = LOC_OVERLAY;
    f->where->loc.ino = f->ino;
    snprintf(f->where->path, sizeof f->where->path, "%s", path);
    const char *name = path[0] == '/' ? path + 1 : path; /* "memfd:NAME", without " (deleted)" */
    size_t n = strlen(name), tail = strlen(" (deleted)");
    if (n >= tail && !strcmp(name + n - tail, " (deleted)")) n -= tail;
    snprintf(f->where->name, sizeof f->where->name, "%.*s", (int)ZB_MIN(n, (size_t)NAME_MAX), name);
    return 0;
}

int zb_overlay_write_sealed(zb_sandbox *sb, uint32_t ino) {
    const zb_inode *in = zb_ovl_inode(sb->fs, ino);
    return in && (in->seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE));
}

/* A mapping is a copy of the file's bytes (a shared one is then kept coherent: shared_map.c). */
static long overlay_mmap_fill(zb_sandbox *sb, zb_file *f, uint64_t addr, uint64_t len, uint64_t off) {
    if (zb_shmap_writeback(sb, f->ino, off, len) < 0) return -ENOMEM; /* as above */
    long r = zb_ovl_read(sb->fs, f->ino, sb->mem.host + addr, len, off);
    zb_mem_dirty(&sb->mem, addr, len);
    return r < 0 ? r : 0;
}

static long overlay_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    memset(st, 0, sizeof *st);
    zb_ovl_stat(sb->fs, f->ino, st);
    return 0;
}

static long overlay_chown(zb_sandbox *sb, zb_file *f, uint64_t uid, uint64_t gid) {
    if (zb_ovl_inode(sb->fs, f->ino)->readonly) return -EPERM; /* put there by the host */
    return zb_own_ids(uid, gid);
}

static uint32_t overlay_ino(const zb_file *f) { return f->ino; }

const zb_file_ops zb_file_overlay_ops = {
    .name = "overlay file",
    .props = ZB_FOPS_NO_EPOLL | ZB_FOPS_MMAP_COPIES | ZB_FOPS_SHARED_MAP,
    .read = overlay_read,
    .write = overlay_write,
    .positional = zb_always,
    .seek = overlay_seek,
    .truncate = overlay_truncate,
    .fallocate = overlay_fallocate,
    .mmap_fill = overlay_mmap_fill,
    .stat = overlay_stat,
    .chown = overlay_chown,
    .overlay_ino = overlay_ino,
    .fcntl = overlay_fcntl,
};

/* Truncate an overlay file and refresh its shared mappings past the shorter of the two sizes
 * (they read zeros there, as Linux's do after the pages are dropped). */
long zb_overlay_truncate(zb_sandbox *sb, uint32_t ino, uint64_t size) {
    zb_inode *in = zb_ovl_inode(sb->fs, ino);
    if (!in) return -EBADF;
    uint64_t from = ZB_MIN(size, in->size);
    int rc = zb_ovl_truncate(sb->fs, ino, size);
    if (rc == 0) zb_shmap_reload(sb, ino, from, UINT64_MAX - from);
    return rc;
}

/* Open a LOC_OVERLAY location: a file (truncated by O_TRUNC when opened for writing), a
 * directory (FILE_DIR) or a FIFO's end (file_fifo.c). */
long zb_overlay_open(zb_sandbox *sb, zb_resolved *r, uint64_t flags, zb_file **out) {
    int wr = (flags & O_ACCMODE) != O_RDONLY;
    long rc;
    zb_inode *in = zb_ovl_inode(sb->fs, r->loc.ino);
    if (!in) return -ENOENT;
    if (in->type == INO_SYMLINK) return -ELOOP;
    if (in->type == INO_SOCKET) return -ENXIO; /* a socket's name: connect(2) to it, as in Linux */
    if (in->type == INO_FIFO) return zb_fifo_open(sb, r, flags, out); /* (O_TRUNC does nothing to it) */
    if (in->readonly && (wr || (flags & O_TRUNC))) return -EACCES;
    if ((flags & O_TRUNC) && wr && (rc = zb_overlay_truncate(sb, r->loc.ino, 0)) < 0) return rc;
    zb_file *f = zb_file_new(r->loc.is_dir ? FILE_DIR : FILE_OVERLAY);
    if (!f) return -ENOMEM;
    f->ino = r->loc.ino;
    zb_ovl_open_ref(sb->fs, f->ino, 1);
    *out = f;
    return 0;
}

/* O_TMPFILE: an unnamed overlay file in the directory `dir`. It lives while it is open, or longer
 * if linkat(fd, "", ..., AT_EMPTY_PATH) gives it a name. */
long zb_overlay_open_tmpfile(zb_sandbox *sb, const zb_resolved *dir, uint64_t flags, uint64_t mode) {
    if ((flags & O_ACCMODE) == O_RDONLY) return -EINVAL;
    if (!dir->exists) return -ENOENT;
    if (!dir->loc.is_dir) return -ENOTDIR;
    if (dir->loc.kind != LOC_OVERLAY) return -EROFS;
    uint32_t ino = zb_ovl_new_inode(sb->fs, INO_FILE, mode & ~sb->proc.umask);
    if (!ino) return -ENOSPC;
    zb_ovl_open_ref(sb->fs, ino, 1); /* nlink 0: released again with its last open */
    zb_file *f = zb_file_new(FILE_OVERLAY);
    if (!f || !(f->where = zb_where_new())) {
        free(f);
        zb_ovl_open_ref(sb->fs, ino, -1);
        return -ENOMEM;
    }
    f->ino = ino;
    f->flags = flags & (O_ACCMODE | O_APPEND | O_NONBLOCK | O_NOATIME);
    *f->where = *dir;
    f->where->parent = dir->loc;
    memset(&f->where->loc, 0, sizeof f->where->loc);
    f->where->loc.kind = LOC_OVERLAY;
    f->where->loc.ino = ino;
    snprintf(f->where->name, sizeof f->where->name, "#%u", ino);
    return zb_fd_install(sb, f, 0, flags & O_CLOEXEC);
}
