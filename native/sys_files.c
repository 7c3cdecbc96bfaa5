/* sys_files.c - syscalls on file descriptors: open, read, write, seek, dup, fcntl, ioctl, pipes.
 * Paths are resolved in the guest namespace (fs_namespace.c); nothing here ever opens a host path
 * that did not come out of that resolution.
 */
#include "fs.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/openat2.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <termios.h>
#include <unistd.h>

#define IO_MAX (1ul << 30)       /* largest single read/write we serve, like Linux's MAX_RW_COUNT */
#define OUTPUT_EVENT_MAX (1ul << 20)

int zb_path_arg(zb_sandbox *sb, int64_t dirfd, uint64_t upath, int resolve_flags, int empty_ok, zb_resolved *r) {
    ZB_PROF_BEGIN(sb, t);
    char path[PATH_MAX];
    int rc = zb_guest_string(sb, upath, path, sizeof path);
    if (rc < 0) return rc;
    const char *base = sb->proc.cwd;
    if (path[0] != '/' && (int)dirfd != AT_FDCWD) {
        zb_file *f = zb_fd_get(sb, (uint64_t)dirfd);
        if (!f) return -EBADF;
        if (!path[0] && empty_ok) {
            if (!f->where) return -EBADF;
            *r = *f->where;
            return 0;
        }
        if (!f->where || !f->where->loc.is_dir) return -ENOTDIR;
        base = f->where->path;
    }
    if (!path[0]) return -ENOENT;
    rc = zb_fs_resolve(sb, base, path, resolve_flags, r);
    ZB_PROF_END(sb, t, path_ns);
    if (sb->profile) sb->prof.path_walks++;
    return rc;
}

/* O_TMPFILE: an unnamed overlay file in the directory `dir`. It lives while it is open, or longer
 * if linkat(fd, "", ..., AT_EMPTY_PATH) gives it a name. */
static long open_tmpfile(zb_sandbox *sb, const zb_resolved *dir, uint64_t flags, uint64_t mode) {
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

/* Open r for writing/creating in a read-write project: on the host, confined to the tree. */
static long open_project_host(zb_sandbox *sb, zb_resolved *r, uint64_t flags, uint64_t mode) {
    int fd = zb_proj_host_open(r, (int)(flags & (O_ACCMODE | O_CREAT | O_EXCL | O_TRUNC | O_APPEND)),
                               (unsigned)(mode & ~sb->proc.umask));
    if (fd < 0) return fd;
    zb_hostfd *h = zb_hostfd_new(fd);
    zb_file *f = h ? zb_file_new(FILE_HOST) : NULL;
    if (!f) { if (h) zb_hostfd_unref(h); else close(fd); return -ENOMEM; }
    f->host = h;
    f->flags = flags & (O_ACCMODE | O_APPEND | O_NONBLOCK);
    r->exists = 1;
    r->loc.kind = LOC_HOST;
    r->loc.lower = 1;
    r->loc.proj = PROJ_READWRITE;
    r->loc.proj_root = r->parent.proj_root;
    if (!(f->where = zb_where_new())) { zb_file_unref(sb->fs, f); return -ENOMEM; }
    *f->where = *r;
    return zb_fd_install(sb, f, 0, flags & O_CLOEXEC);
}

static long do_open(zb_sandbox *sb, int64_t dirfd, uint64_t upath, uint64_t flags, uint64_t mode) {
    zb_resolved r;
    int wr = (flags & O_ACCMODE) != O_RDONLY;
    long rc = zb_path_arg(sb, dirfd, upath, (flags & O_NOFOLLOW) ? ZB_RESOLVE_NOFOLLOW : 0, 0, &r);
    if (rc < 0) return rc;
    if ((flags & O_TMPFILE) == O_TMPFILE) return open_tmpfile(sb, &r, flags, mode);
    if (!r.exists && !(flags & O_CREAT)) return -ENOENT;
    if (r.exists && (flags & O_CREAT) && (flags & O_EXCL)) return -EEXIST;
    if (r.exists && (flags & O_DIRECTORY) && !r.loc.is_dir) return -ENOTDIR;
    if (r.exists && r.loc.is_dir && (wr || (flags & O_TRUNC))) return -EISDIR;
    int proj = r.exists ? r.loc.proj : r.parent.proj;
    if (proj && (wr || (flags & O_TRUNC) || !r.exists) && !(r.exists && r.loc.mnode)) {
        if (proj == PROJ_READONLY) return -EROFS;
        if (proj == PROJ_READWRITE) return open_project_host(sb, &r, flags, mode);
        if ((rc = zb_proj_copy_up(sb, &r, !r.exists)) < 0) return rc; /* overlay: work on the upper copy */
    }
    if (!r.exists) {
        if (r.parent.kind != LOC_OVERLAY) return -EROFS;
        uint32_t ino = zb_ovl_new_inode(sb->fs, INO_FILE, mode & ~sb->proc.umask);
        if (!ino) return -ENOSPC;
        if ((rc = zb_ovl_link(sb->fs, r.parent.ino, r.name, ino)) < 0) { zb_ovl_discard(sb->fs, ino); return rc; }
        r.exists = 1;
        r.loc.kind = LOC_OVERLAY;
        r.loc.ino = r.loc.upper = ino;
        r.loc.mnode = NULL;
        r.loc.is_dir = 0;
    }
    zb_file *f = NULL;
    switch (r.loc.kind) {
    case LOC_SYMLINK:
        return -ELOOP;
    case LOC_HOST: {
        if (wr || (flags & O_TRUNC)) return -EROFS;
        int fd = zb_host_open_ro(r.path, r.loc.is_dir);
        if (fd < 0) return fd == -ELOOP ? -ELOOP : fd;
        zb_hostfd *h = zb_hostfd_new(fd);
        if (!h || !(f = zb_file_new(r.loc.is_dir ? FILE_DIR : FILE_HOST))) { if (h) zb_hostfd_unref(h); else close(fd); return -ENOMEM; }
        f->host = h;
        break;
    }
    case LOC_OVERLAY: {
        zb_inode *in = zb_ovl_inode(sb->fs, r.loc.ino);
        if (!in) return -ENOENT;
        if (in->type == INO_SYMLINK) return -ELOOP;
        if (in->readonly && (wr || (flags & O_TRUNC))) return -EACCES;
        if ((flags & O_TRUNC) && wr && (rc = zb_ovl_truncate(sb->fs, r.loc.ino, 0)) < 0) return rc;
        if (!(f = zb_file_new(r.loc.is_dir ? FILE_DIR : FILE_OVERLAY))) return -ENOMEM;
        f->ino = r.loc.ino;
        zb_ovl_open_ref(sb->fs, f->ino, 1);
        break;
    }
    case LOC_SYNTH:
        if (!(f = zb_file_new(FILE_DIR))) return -ENOMEM;
        break;
    case LOC_DEV:
        if (zb_dev_is_proc(r.loc.dev)) { /* a private snapshot of the synthesised content (fs_proc.c) */
            if (wr || (flags & O_TRUNC)) return -EACCES;
            long ino = zb_proc_snapshot(sb, r.loc.dev);
            if (ino < 0) return ino;
            zb_ovl_open_ref(sb->fs, (uint32_t)ino, 1); /* nlink 0: released with its last open */
            if (!(f = zb_file_new(FILE_OVERLAY))) { zb_ovl_open_ref(sb->fs, (uint32_t)ino, -1); return -ENOMEM; }
            f->ino = (uint32_t)ino;
            r.loc.kind = LOC_OVERLAY;
            r.loc.ino = (uint32_t)ino;
            break;
        }
        if (!(f = zb_file_new(FILE_DEV))) return -ENOMEM;
        f->dev = r.loc.dev;
        break;
    default:
        return -ENOENT;
    }
    f->flags = flags & (O_ACCMODE | O_APPEND | O_NONBLOCK | O_PATH | O_DIRECTORY | O_NOATIME);
    if (!(f->where = zb_where_new())) { zb_file_unref(sb->fs, f); return -ENOMEM; }
    *f->where = r;
    return zb_fd_install(sb, f, 0, flags & O_CLOEXEC);
}

static long sys_openat(zb_sandbox *sb, const uint64_t a[6]) { return do_open(sb, (int)a[0], a[1], a[2], a[3]); }
static long sys_open(zb_sandbox *sb, const uint64_t a[6]) { return do_open(sb, AT_FDCWD, a[0], a[1], a[2]); }
static long sys_creat(zb_sandbox *sb, const uint64_t a[6]) {
    return do_open(sb, AT_FDCWD, a[0], O_CREAT | O_WRONLY | O_TRUNC, a[1]);
}
static long sys_openat2(zb_sandbox *sb, const uint64_t a[6]) {
    struct open_how how;
    if (a[3] < sizeof how) return -EINVAL;
    if (zb_copy_from_guest(sb, &how, a[2], sizeof how) < 0) return -EFAULT;
    return do_open(sb, (int)a[0], a[1], how.flags, how.mode);
}

static long sys_close(zb_sandbox *sb, const uint64_t a[6]) { return zb_fd_close(sb, (int)a[0]); }
/* CLOSE_RANGE_CLOEXEC marks the fds close-on-exec instead of closing them; UNSHARE means nothing
 * with one thread. */
static long sys_close_range(zb_sandbox *sb, const uint64_t a[6]) {
    unsigned first = (unsigned)a[0], last = (unsigned)a[1];
    if (a[2] & ~(uint64_t)(CLOSE_RANGE_UNSHARE | CLOSE_RANGE_CLOEXEC) || first > last) return -EINVAL;
    for (unsigned fd = first; fd <= last && fd < ZB_MAX_FDS; fd++) {
        if (!(a[2] & CLOSE_RANGE_CLOEXEC)) zb_fd_close(sb, (int)fd);
        else if (sb->fds->fd[fd]) sb->fds->cloexec[fd] = 1;
    }
    return 0;
}

/* ---- reading and writing one buffer ---- */

static long read_dev(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n) {
    switch (f->dev) {
    case DEV_NULL: return 0;
    case DEV_ZERO: memset(p, 0, n); return (long)n;
    case DEV_URANDOM: {
        size_t done = 0;
        while (done < n) {
            ssize_t k = getrandom(p + done, n - done, 0);
            if (k < 0) { if (errno == EINTR) continue; return done ? (long)done : -errno; }
            done += k;
        }
        return (long)n;
    }
    case DEV_UART:
        if (!zb_uart_rx_available(&sb->uart)) {
            if (f->flags & O_NONBLOCK) return -EAGAIN;
            zb_stop_event(sb, ZB_EVENT_INPUT, 1);
            return ZB_SYSCALL_STOP;
        }
        return (long)zb_uart_read(&sb->uart, p, n);
    }
    return -EINVAL;
}

/* A pipe end or a socket reads its rx stream. With nothing queued it never blocks: the guest is
 * one thread, so if a writer exists it is the guest itself, and waiting would wait forever. */
long zb_stream_read(zb_file *f, uint8_t *p, size_t n) {
    zb_pipe *pp = f->rx;
    if (!pp) return f->kind == FILE_SOCKET ? 0 : -EBADF; /* a socket shut down for reading reads EOF */
    if (!pp->len) return pp->writers ? -EAGAIN : 0;
    n = ZB_MIN(n, pp->len);
    memcpy(p, zb_pipe_bytes(pp), n);
    pp->start += n; /* (the bytes may be shared with a snapshot: never changed in place) */
    pp->len -= n;
    if (!pp->len) pp->start = 0;
    return (long)n;
}

long zb_stream_write(zb_file *f, const uint8_t *p, size_t n) {
    zb_pipe *pp = f->tx;
    if (!pp) return f->kind == FILE_SOCKET ? -EPIPE : -EBADF; /* shut down for writing */
    if (!pp->readers) return -EPIPE;
    if (pp->len + n > ZB_STREAM_CAP) n = ZB_STREAM_CAP - pp->len;
    if (!n) return -EAGAIN;
    zb_bytes *b = pp->buf;
    if (!b || atomic_load(&b->refs) > 1 || pp->start + pp->len + n > b->cap) {
        /* shared with a snapshot, or no room after the unread bytes: move them to a buffer of our own */
        size_t cap = ZB_MIN(ZB_MAX(pp->len + n, b ? 2 * b->cap : 4096), (size_t)ZB_STREAM_CAP);
        zb_bytes *nb = malloc(sizeof *nb + cap);
        if (!nb) return -ENOMEM;
        atomic_init(&nb->refs, 1);
        nb->cap = cap;
        if (pp->len) memcpy(nb->data, zb_pipe_bytes(pp), pp->len);
        if (b && atomic_fetch_sub(&b->refs, 1) == 1) free(b);
        pp->buf = b = nb;
        pp->start = 0;
    }
    memcpy(b->data + pp->start + pp->len, p, n);
    pp->len += n;
    return (long)n;
}

/* Read into guest memory at addr; off < 0 means "use and advance the file offset". */
static long read_into(zb_sandbox *sb, zb_file *f, uint64_t addr, size_t n, int64_t off) {
    if ((f->flags & O_ACCMODE) == O_WRONLY || (f->flags & O_PATH)) return -EBADF;
    n = ZB_MIN(n, IO_MAX);
    uint8_t *p = zb_guest_ptr(sb, addr, n, 1);
    if (!p) return -EFAULT;
    uint64_t pos = off < 0 ? f->offset : (uint64_t)off;
    long r;
    switch (f->kind) {
    case FILE_HOST:
        r = pread(f->host->fd, p, n, pos);
        if (r < 0) r = -errno;
        break;
    case FILE_OVERLAY: r = zb_ovl_read(sb->fs, f->ino, p, n, pos); break;
    case FILE_DIR: return -EISDIR;
    case FILE_DEV: return read_dev(sb, f, p, n);
    case FILE_PIPE: case FILE_SOCKET: return off < 0 ? zb_stream_read(f, p, n) : -ESPIPE;
    case FILE_CONSOLE: return -EBADF;
    default: return -EBADF;
    }
    if (r > 0 && off < 0) f->offset += r;
    return r;
}

int zb_output(zb_sandbox *sb, int stream, const void *data, size_t len) {
    zb_event *ev = &sb->stop_ev;
    if (sb->has_stop && (ev->kind != ZB_EVENT_OUTPUT || ev->stream != stream)) return 0;
    size_t have = sb->has_stop ? ev->len : 0;
    len = ZB_MIN(len, OUTPUT_EVENT_MAX - have);
    if (have + len > sb->out_cap) {
        size_t cap = ZB_MAX(have + len, sb->out_cap ? sb->out_cap * 2 : 4096);
        uint8_t *nb = realloc(sb->out_buf, cap);
        if (!nb) return -ENOMEM;
        sb->out_buf = nb;
        sb->out_cap = cap;
    }
    memcpy(sb->out_buf + have, data, len);
    ev = zb_stop_event(sb, ZB_EVENT_OUTPUT, 0);
    ev->stream = stream;
    ev->data = sb->out_buf;
    ev->len = have + len;
    return (int)len;
}

static long write_from(zb_sandbox *sb, zb_file *f, uint64_t addr, size_t n, int64_t off) {
    if ((f->flags & O_ACCMODE) == O_RDONLY && f->kind != FILE_CONSOLE && f->kind != FILE_PIPE && f->kind != FILE_SOCKET) return -EBADF;
    n = ZB_MIN(n, IO_MAX);
    const uint8_t *p = zb_guest_ptr(sb, addr, n, 0);
    if (!p) return -EFAULT;
    switch (f->kind) {
    case FILE_CONSOLE: {
        if (!n) return 0;
        int w = zb_output(sb, f->stream, p, n);
        return w > 0 ? w : -EAGAIN;
    }
    case FILE_HOST: { /* only a read-write project's files are opened for writing */
        long denied = zb_file_write_check(f); /* the project is no longer read-write */
        if (denied) return denied;
        struct stat st;
        uint64_t pos = off >= 0 ? (uint64_t)off : f->offset;
        if (off < 0 && (f->flags & O_APPEND)) pos = fstat(f->host->fd, &st) == 0 ? (uint64_t)st.st_size : pos;
        long r = pwrite(f->host->fd, p, n, (off_t)pos);
        if (r < 0) return -errno;
        if (off < 0) f->offset = pos + (uint64_t)r;
        return r;
    }
    case FILE_OVERLAY: {
        zb_inode *in = zb_ovl_inode(sb->fs, f->ino);
        if (!in) return -EBADF;
        long denied = zb_file_write_check(f); /* a project file, and the project's mode changed */
        if (denied) return denied;
        uint64_t pos = off >= 0 ? (uint64_t)off : (f->flags & O_APPEND) ? in->size : f->offset;
        long r = zb_ovl_write(sb->fs, f->ino, p, n, pos);
        if (r > 0 && off < 0) f->offset = pos + r;
        return r;
    }
    case FILE_DEV:
        if (f->dev != DEV_UART) return (long)n;
        {
            char err[ZB_ERRLEN];
            long r = zb_uart_write(&sb->uart, p, n, err);
            if (r < 0) {
                zb_event *ev = zb_stop_event(sb, ZB_EVENT_ERROR, 1);
                snprintf(ev->message, sizeof ev->message, "guest sent a malformed UART frame: %.400s", err);
                sb->finished = 1;
                return ZB_SYSCALL_STOP;
            }
            if (sb->uart.frame_ready) {
                zb_event *ev = zb_stop_event(sb, ZB_EVENT_FRAME, 0);
                memcpy(&ev->frame_type, sb->uart.tx + 6, 2);
                ev->frame_type &= 0xffff;
                ev->data = sb->uart.tx + ZB_FRAME_HEADER;
                ev->len = sb->uart.frame_ready - ZB_FRAME_HEADER;
            }
            return r;
        }
    case FILE_PIPE: case FILE_SOCKET: return off < 0 ? zb_stream_write(f, p, n) : -ESPIPE;
    case FILE_DIR: return -EISDIR;
    default: return -EBADF;
    }
}

static long sys_read(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    return f ? read_into(sb, f, a[1], a[2], -1) : -EBADF;
}
/* Whether the positional calls (pread, pwrite, preadv, pwritev) apply: as in Linux, files,
 * directories (which then say EISDIR) and the memory-like devices (/dev/null, zero, urandom) have a
 * position; pipes, the console and the UART (a tty) do not. */
static int positional(const zb_file *f) {
    switch (f->kind) {
    case FILE_HOST: case FILE_OVERLAY: case FILE_DIR: return 1;
    case FILE_DEV: return f->dev != DEV_UART;
    default: return 0;
    }
}

static long sys_pread64(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    if ((int64_t)a[3] < 0) return -EINVAL;
    if (!positional(f)) return -ESPIPE;
    return read_into(sb, f, a[1], a[2], (int64_t)a[3]);
}
static long sys_write(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    return f ? write_from(sb, f, a[1], a[2], -1) : -EBADF;
}
static long sys_pwrite64(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    if ((int64_t)a[3] < 0) return -EINVAL;
    if (!positional(f)) return -ESPIPE;
    return write_from(sb, f, a[1], a[2], (int64_t)a[3]);
}

/* readv/writev and the positional variants: one buffer at a time, stopping at the first short
 * transfer, like the kernel does. */
static long vector_io(zb_sandbox *sb, const uint64_t a[6], int is_write, int64_t off) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    if (off >= 0 && !positional(f)) return -ESPIPE;
    uint64_t cnt = a[2];
    if (cnt > 1024) return -EINVAL;
    struct iovec iov[1024];
    if (cnt && zb_copy_from_guest(sb, iov, a[1], cnt * sizeof(struct iovec)) < 0) return -EFAULT;
    long total = 0;
    for (uint64_t i = 0; i < cnt; i++) {
        uint64_t base = (uint64_t)(uintptr_t)iov[i].iov_base, len = iov[i].iov_len;
        if (!len) continue;
        /* the position of this buffer must fit in an off_t (Linux: EINVAL when pos + count
         * overflows); off + total itself would be a signed overflow */
        if (off >= 0 && (uint64_t)total > (uint64_t)(INT64_MAX - off)) return total ? total : -EINVAL;
        long r = is_write ? write_from(sb, f, base, len, off < 0 ? -1 : off + total)
                          : read_into(sb, f, base, len, off < 0 ? -1 : off + total);
        if (r == ZB_SYSCALL_STOP && total) { sb->has_stop = 0; return total; } /* partial, not blocked */
        if (r < 0) return total ? total : r;
        total += r;
        if ((uint64_t)r < len) break;
        if (sb->has_stop && sb->stop_ev.kind != ZB_EVENT_OUTPUT) break;
    }
    return total;
}
static long sys_readv(zb_sandbox *sb, const uint64_t a[6]) { return vector_io(sb, a, 0, -1); }
static long sys_writev(zb_sandbox *sb, const uint64_t a[6]) { return vector_io(sb, a, 1, -1); }
static long sys_preadv(zb_sandbox *sb, const uint64_t a[6]) { return (int64_t)a[3] < 0 ? -EINVAL : vector_io(sb, a, 0, (int64_t)a[3]); }
static long sys_pwritev(zb_sandbox *sb, const uint64_t a[6]) { return (int64_t)a[3] < 0 ? -EINVAL : vector_io(sb, a, 1, (int64_t)a[3]); }

static long sys_lseek(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    int64_t off = (int64_t)a[1], size = 0, base;
    switch (f->kind) {
    case FILE_HOST: {
        struct stat st;
        if (fstat(f->host->fd, &st) < 0) return -errno;
        size = st.st_size;
        break;
    }
    case FILE_OVERLAY: size = (int64_t)zb_ovl_inode(sb->fs, f->ino)->size; break;
    case FILE_DIR:
        if (a[2] != SEEK_SET || off != 0) return -EINVAL; /* rewinddir */
        zb_listing_unref(f->listing);
        f->listing = NULL;
        f->offset = 0;
        return 0;
    case FILE_DEV: return 0;
    default: return -ESPIPE;
    }
    switch (a[2]) {
    case SEEK_SET: base = 0; break;
    case SEEK_CUR: base = (int64_t)f->offset; break;
    case SEEK_END: base = size; break;
    case SEEK_DATA: if (off >= size) return -ENXIO; base = 0; break;
    case SEEK_HOLE: if (off >= size) return -ENXIO; base = 0; off = size; break;
    default: return -EINVAL;
    }
    int64_t pos;
    if (__builtin_add_overflow(base, off, &pos) || pos < 0) return -EINVAL; /* (no signed overflow) */
    f->offset = (uint64_t)pos;
    return (long)f->offset;
}

/* ---- descriptors ---- */

static long dup_to(zb_sandbox *sb, uint64_t oldfd, uint64_t newfd, int cloexec) {
    zb_file *f = zb_fd_get(sb, oldfd);
    if (!f) return -EBADF;
    if (newfd >= ZB_MAX_FDS) return -EBADF;
    if (oldfd == newfd) return (long)newfd;
    f->refs++;
    if (sb->fds->fd[newfd]) zb_fd_close(sb, (int)newfd);
    sb->fds->fd[newfd] = f;
    sb->fds->cloexec[newfd] = cloexec ? 1 : 0;
    return (long)newfd;
}

static long sys_dup(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    f->refs++;
    return zb_fd_install(sb, f, 0, 0);
}
static long sys_dup2(zb_sandbox *sb, const uint64_t a[6]) {
    if (!zb_fd_get(sb, a[0])) return -EBADF;
    return dup_to(sb, a[0], a[1], 0);
}
static long sys_dup3(zb_sandbox *sb, const uint64_t a[6]) {
    if (a[0] == a[1] || (a[2] & ~(uint64_t)O_CLOEXEC)) return -EINVAL;
    return dup_to(sb, a[0], a[1], a[2] & O_CLOEXEC);
}

static long sys_fcntl(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    switch (a[1]) {
    case F_DUPFD:
    case F_DUPFD_CLOEXEC:
        if (a[2] >= ZB_MAX_FDS) return -EINVAL;
        f->refs++;
        return zb_fd_install(sb, f, (int)a[2], a[1] == F_DUPFD_CLOEXEC);
    case F_GETFD: return sb->fds->cloexec[a[0]] ? FD_CLOEXEC : 0;
    case F_SETFD: sb->fds->cloexec[a[0]] = (a[2] & FD_CLOEXEC) ? 1 : 0; return 0;
    case F_GETFL: return f->flags | (f->kind == FILE_DIR ? O_DIRECTORY : 0);
    case F_SETFL: f->flags = (f->flags & ~(O_APPEND | O_NONBLOCK)) | (a[2] & (O_APPEND | O_NONBLOCK)); return 0;
    case F_GETLK: {
        struct flock fl;
        if (zb_copy_from_guest(sb, &fl, a[2], sizeof fl) < 0) return -EFAULT;
        fl.l_type = F_UNLCK; /* one process: no lock can conflict */
        return zb_copy_to_guest(sb, a[2], &fl, sizeof fl);
    }
    case F_SETLK: case F_SETLKW: case F_OFD_SETLK: case F_OFD_SETLKW: return 0;
    case F_GETPIPE_SZ: return f->kind == FILE_PIPE ? (long)ZB_STREAM_CAP : -EBADF;
    default: return -EINVAL;
    }
}

static long sys_ioctl(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    switch (a[1]) {
    case FIOCLEX: sb->fds->cloexec[a[0]] = 1; return 0;
    case FIONCLEX: sb->fds->cloexec[a[0]] = 0; return 0;
    case FIONBIO: {
        int on;
        if (zb_copy_from_guest(sb, &on, a[2], sizeof on) < 0) return -EFAULT;
        f->flags = on ? (f->flags | O_NONBLOCK) : (f->flags & ~O_NONBLOCK);
        return 0;
    }
    case FIONREAD: {
        int n = f->kind == FILE_DEV && f->dev == DEV_UART ? (int)zb_uart_rx_available(&sb->uart)
              : f->rx ? (int)f->rx->len : 0;
        return zb_copy_to_guest(sb, a[2], &n, sizeof n);
    }
    default:
        return -ENOTTY; /* no terminals in the sandbox: TCGETS, TIOCGWINSZ, ... */
    }
}

int zb_fd_install_pair(zb_sandbox *sb, zb_file *first, zb_file *second, int cloexec, uint64_t fds_addr) {
    int fds[2];
    fds[0] = zb_fd_install(sb, first, 0, cloexec);
    if (fds[0] < 0) { zb_file_unref(sb->fs, second); return fds[0]; }
    fds[1] = zb_fd_install(sb, second, 0, cloexec);
    if (fds[1] < 0) { zb_fd_close(sb, fds[0]); return fds[1]; }
    if (zb_copy_to_guest(sb, fds_addr, fds, sizeof fds) < 0) { /* validated by the caller */
        zb_fd_close(sb, fds[0]);
        zb_fd_close(sb, fds[1]);
        return -EFAULT;
    }
    return 0;
}

static long sys_pipe2(zb_sandbox *sb, const uint64_t a[6]) {
    if (a[1] & ~(uint64_t)(O_CLOEXEC | O_NONBLOCK)) return -EINVAL;
    if (!zb_guest_ptr(sb, a[0], 2 * sizeof(int), 1)) return -EFAULT;
    zb_pipe *p = zb_pipe_new();
    zb_file *r = zb_file_new(FILE_PIPE), *w = zb_file_new(FILE_PIPE);
    if (!p || !r || !w) { free(p); free(r); free(w); return -ENOMEM; }
    zb_file_attach_rx(r, p);
    zb_file_attach_tx(w, p);
    r->flags = O_RDONLY | (a[1] & O_NONBLOCK);
    w->flags = O_WRONLY | (a[1] & O_NONBLOCK);
    return zb_fd_install_pair(sb, r, w, a[1] & O_CLOEXEC, a[0]);
}
static long sys_pipe(zb_sandbox *sb, const uint64_t a[6]) {
    uint64_t b[6] = {a[0], 0, 0, 0, 0, 0};
    return sys_pipe2(sb, b);
}

static long sys_ftruncate(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    if ((int64_t)a[1] < 0) return -EINVAL;
    if ((f->flags & O_ACCMODE) == O_RDONLY) return -EINVAL;
    long denied = zb_file_write_check(f);
    if (denied) return denied;
    if (f->kind == FILE_HOST) return ftruncate(f->host->fd, (off_t)a[1]) < 0 ? -errno : 0; /* read-write project */
    if (f->kind != FILE_OVERLAY) return -EINVAL;
    return zb_ovl_truncate(sb->fs, f->ino, a[1]);
}

static long sys_fallocate(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    if (f->kind != FILE_OVERLAY) return -EOPNOTSUPP;
    if (a[1] != 0) return -EOPNOTSUPP;
    long denied = zb_file_write_check(f);
    if (denied) return denied;
    int64_t off = (int64_t)a[2], len = (int64_t)a[3], sum;
    if (off < 0 || len <= 0) return -EINVAL;                  /* as Linux */
    if (__builtin_add_overflow(off, len, &sum)) return -EFBIG; /* (offset + len wrapped before) */
    uint64_t end = (uint64_t)sum;
    zb_inode *in = zb_ovl_inode(sb->fs, f->ino);
    return end > in->size ? zb_ovl_truncate(sb->fs, f->ino, end) : 0;
}

static long sys_fd_noop(zb_sandbox *sb, const uint64_t a[6]) { return zb_fd_get(sb, a[0]) ? 0 : -EBADF; }

void zb_sys_files_register(zb_syscall_fn *t) {
    t[SYS_read] = sys_read;
    t[SYS_write] = sys_write;
    t[SYS_open] = sys_open;
    t[SYS_openat] = sys_openat;
    t[SYS_openat2] = sys_openat2;
    t[SYS_creat] = sys_creat;
    t[SYS_close] = sys_close;
    t[SYS_close_range] = sys_close_range;
    t[SYS_pread64] = sys_pread64;
    t[SYS_pwrite64] = sys_pwrite64;
    t[SYS_readv] = sys_readv;
    t[SYS_writev] = sys_writev;
    t[SYS_preadv] = sys_preadv;
    t[SYS_pwritev] = sys_pwritev;
    t[SYS_lseek] = sys_lseek;
    t[SYS_dup] = sys_dup;
    t[SYS_dup2] = sys_dup2;
    t[SYS_dup3] = sys_dup3;
    t[SYS_fcntl] = sys_fcntl;
    t[SYS_ioctl] = sys_ioctl;
    t[SYS_pipe] = sys_pipe;
    t[SYS_pipe2] = sys_pipe2;
    t[SYS_ftruncate] = sys_ftruncate;
    t[SYS_fallocate] = sys_fallocate;
    t[SYS_fsync] = sys_fd_noop;
    t[SYS_fdatasync] = sys_fd_noop;
    t[SYS_fadvise64] = sys_fd_noop;
    t[SYS_flock] = sys_fd_noop;
    t[SYS_syncfs] = sys_fd_noop;
}
