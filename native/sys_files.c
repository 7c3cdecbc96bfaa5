/* sys_files.c - syscalls on file descriptors: open, read, write, seek, dup, fcntl, ioctl, pipes.
 * Paths are resolved in the guest namespace (fs_namespace.c); nothing here ever opens a host path
 * that did not come out of that resolution. The handlers decode and check their arguments, then
 * call the open file's operations (f->ops, fs.h): what a kind of file does is in its file_*.c.
 */
#include "util.h"
#include "memory.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "linux.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/openat2.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <termios.h>
#include <unistd.h>

#define IO_MAX (1ul << 30)       /* largest single read/write we serve, like Linux's MAX_RW_COUNT */

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

/* How each location kind is opened (file_host.c, file_overlay.c, file_dir.c, file_dev.c): r exists
 * and the generic checks passed; r may be updated to what was opened. */
typedef long (*open_fn)(zb_sandbox *sb, zb_resolved *r, uint64_t flags, zb_file **out);
static const open_fn open_location[] = {
    [LOC_SYNTH] = zb_synth_open,
    [LOC_HOST] = zb_host_open,
    [LOC_OVERLAY] = zb_overlay_open,
    [LOC_DEV] = zb_dev_open,
};

static long install_opened(zb_sandbox *sb, zb_file *f, const zb_resolved *r, int flags, uint64_t open_flags) {
    f->flags = flags;
    if (!(f->where = zb_where_new())) { zb_file_unref(sb->fs, f); return -ENOMEM; }
    *f->where = *r;
    long fd = zb_fd_install(sb, f, 0, open_flags & O_CLOEXEC);
    if (fd >= 0) { /* its fstat, which usually comes next, can be answered in the guest (guest_abi.h) */
        sb->entry_stat_seq = atomic_load(&zb_syscall_seq);
        sb->entry_stat_fd = (int)fd;
        sb->entry_stat_file = f;
    }
    return fd;
}

static long do_open(zb_sandbox *sb, int64_t dirfd, uint64_t upath, uint64_t flags, uint64_t mode) {
    zb_resolved r;
    int wr = (flags & O_ACCMODE) != O_RDONLY;
    long rc = zb_path_arg(sb, dirfd, upath, (flags & O_NOFOLLOW) ? ZB_RESOLVE_NOFOLLOW : 0, 0, &r);
    if (rc < 0) return rc;
    if ((flags & O_TMPFILE) == O_TMPFILE) return zb_overlay_open_tmpfile(sb, &r, flags, mode);
    if (!r.exists && !(flags & O_CREAT)) return -ENOENT;
    if (r.exists && (flags & O_CREAT) && (flags & O_EXCL)) return -EEXIST;
    if (r.exists && (flags & O_DIRECTORY) && !r.loc.is_dir) return -ENOTDIR;
    if (r.exists && r.loc.is_dir && (wr || (flags & O_TRUNC))) return -EISDIR;
    zb_file *f = NULL;
    int proj = r.exists ? r.loc.proj : r.parent.proj;
    if (proj && (wr || (flags & O_TRUNC) || !r.exists) && !(r.exists && r.loc.mnode)) {
        if (proj == PROJ_READONLY) return -EROFS;
        if (proj == PROJ_READWRITE) {
            if ((rc = zb_host_open_project(sb, &r, flags, mode, &f)) < 0) return rc;
            return install_opened(sb, f, &r, (int)(flags & (O_ACCMODE | O_APPEND | O_NONBLOCK)), flags);
        }
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
    if (r.loc.kind == LOC_SYMLINK) return -ELOOP;
    if (r.loc.kind <= 0 || (size_t)r.loc.kind >= sizeof open_location / sizeof *open_location || !open_location[r.loc.kind])
        return -ENOENT;
    if ((rc = open_location[r.loc.kind](sb, &r, flags, &f)) < 0) return rc;
    return install_opened(sb, f, &r, (int)(flags & (O_ACCMODE | O_APPEND | O_NONBLOCK | O_PATH | O_DIRECTORY | O_NOATIME)), flags);
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

/* Read into guest memory at addr; off < 0 means "use and advance the file offset". */
static long read_into(zb_sandbox *sb, zb_file *f, uint64_t addr, size_t n, int64_t off) {
    if ((f->flags & O_ACCMODE) == O_WRONLY || (f->flags & O_PATH)) return -EBADF;
    n = ZB_MIN(n, IO_MAX);
    uint8_t *p = zb_guest_ptr(sb, addr, n, 1);
    if (!p) return -EFAULT;
    return f->ops->read ? f->ops->read(sb, f, p, n, off) : -EBADF;
}

static long write_from(zb_sandbox *sb, zb_file *f, uint64_t addr, size_t n, int64_t off) {
    if ((f->flags & O_ACCMODE) == O_RDONLY && !(f->ops->props & ZB_FOPS_WRITE_ANY_MODE)) return -EBADF;
    n = ZB_MIN(n, IO_MAX);
    const uint8_t *p = zb_guest_ptr(sb, addr, n, 0);
    if (!p) return -EFAULT;
    return f->ops->write ? f->ops->write(sb, f, p, n, off) : -EBADF;
}

static long sys_read(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    long got = read_into(sb, f, a[1], a[2], -1);
    if ((f->kind == FILE_HOST || f->kind == FILE_OVERLAY) && got >= 0 && (uint64_t)got < ZB_MIN(a[2], IO_MAX)) {
        /* a regular file read to its end: the next read can say 0 in the guest (guest_abi.h) */
        f->eof_seq = atomic_load(&zb_syscall_seq);
        f->eof_ns = zb_now_ns();
    }
    return zb_io_would_block(sb, f, got, 0, 0, 0);
}
/* Whether the positional calls (pread, pwrite, preadv, pwritev) apply: as in Linux, files,
 * directories (which then say EISDIR) and the memory-like devices (/dev/null, zero, urandom) have a
 * position; pipes, the console and the UART (a tty) do not. */
static int positional(const zb_file *f) { return f->ops->positional && f->ops->positional(f); }

static long sys_pread64(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    if ((int64_t)a[3] < 0) return -EINVAL;
    if (!positional(f)) return -ESPIPE;
    return read_into(sb, f, a[1], a[2], (int64_t)a[3]);
}
/* write(2). On a blocking pipe or stream socket (ZB_FOPS_WHOLE_WRITES) it returns only once all
 * its bytes are in, as Linux's pipe_write does: a short write waits for room and the syscall is
 * served again for the rest, with what it moved so far in sb->cpu.io_done (a signal ends the wait
 * with that count: zb_cpu_interrupted; the readers leaving end it too, with SIGPIPE). Without
 * this, a 4 MiB write of an unbuffered stdout (PYTHONUNBUFFERED, python -u) into a pipe moved its
 * first 64 KiB and lost the rest (CPython's test_communicate_pipe_buf). */
static long sys_write(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    uint64_t total = ZB_MIN(a[2], IO_MAX);
    uint64_t done = sb->cpu.pending_syscall ? ZB_MIN(sb->cpu.io_done, total) : 0; /* served again */
    sb->cpu.io_done = 0;
    if (!f) return done ? (long)done : -EBADF; /* closed by another thread while it waited */
    int whole = (f->ops->props & ZB_FOPS_WHOLE_WRITES) && !(f->flags & O_NONBLOCK);
    long r = write_from(sb, f, a[1] + done, total - done, -1);
    if (!whole) return zb_io_would_block(sb, f, r, 1, 0, 0);
    if (r > 0) done += (uint64_t)r;
    if (r > 0 && done < total) { /* no room for the rest: wait for it */
        zb_wake_gen++; /* what it wrote lets a yielded reader go on (run_loop.c bumps it per completed call) */
        r = -EAGAIN;
    }
    if (r == -EAGAIN) {
        long w = zb_io_would_block(sb, f, r, 1, 0, 0);
        if (w == ZB_SYSCALL_BLOCK || w == ZB_SYSCALL_STOP) sb->cpu.io_done = done; /* the rest when served again */
        return done && w != ZB_SYSCALL_BLOCK && w != ZB_SYSCALL_STOP ? (long)done : w;
    }
    if (r < 0 && done) { (void)zb_io_would_block(sb, f, r, 1, 1, 0); return (long)done; } /* EPIPE: SIGPIPE too */
    return r < 0 ? zb_io_would_block(sb, f, r, 1, 0, 0) : (long)done;
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
    sb->read_took_files = 0;
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
        if ((uint64_t)r < len || sb->read_took_files) break; /* (files passed over a socket end a read) */
        if (sb->has_stop && sb->stop_ev.kind != ZB_EVENT_OUTPUT) break;
    }
    return total;
}
static long sys_readv(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    long r = vector_io(sb, a, 0, -1);
    return f ? zb_io_would_block(sb, f, r, 0, 0, 0) : r;
}
static long sys_writev(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    long r = vector_io(sb, a, 1, -1);
    return f ? zb_io_would_block(sb, f, r, 1, 0, 0) : r;
}
static long sys_preadv(zb_sandbox *sb, const uint64_t a[6]) { return (int64_t)a[3] < 0 ? -EINVAL : vector_io(sb, a, 0, (int64_t)a[3]); }
static long sys_pwritev(zb_sandbox *sb, const uint64_t a[6]) { return (int64_t)a[3] < 0 ? -EINVAL : vector_io(sb, a, 1, (int64_t)a[3]); }

static long sys_lseek(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    return f->ops->seek ? f->ops->seek(sb, f, (int64_t)a[1], (int)a[2]) : -ESPIPE;
}

/* ---- descriptors ---- */

static long dup_to(zb_sandbox *sb, uint64_t oldfd, uint64_t newfd, int cloexec) {
    zb_file *f = zb_fd_get(sb, oldfd);
    if (!f) return -EBADF;
    if (oldfd == newfd) return (long)newfd; /* dup2 of an open fd to itself: before the limit, as Linux */
    if (newfd >= (uint64_t)zb_fd_limit(sb)) return -EBADF;
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
        if (a[2] >= (uint64_t)zb_fd_limit(sb)) return -EINVAL;
        f->refs++;
        return zb_fd_install(sb, f, (int)a[2], a[1] == F_DUPFD_CLOEXEC);
    case F_GETFD: return sb->fds->cloexec[a[0]] ? FD_CLOEXEC : 0;
    case F_SETFD: sb->fds->cloexec[a[0]] = (a[2] & FD_CLOEXEC) ? 1 : 0; return 0;
    case F_GETFL: return f->flags | f->ops->status_flags;
    case F_SETFL: f->flags = (f->flags & ~(O_APPEND | O_NONBLOCK)) | (a[2] & (O_APPEND | O_NONBLOCK)); return 0;
    case F_GETLK: case F_SETLK: case F_SETLKW: case F_OFD_GETLK: case F_OFD_SETLK: case F_OFD_SETLKW:
        return zb_lock_fcntl(sb, f, (unsigned)a[1], a[2]);
    default: /* the kind's own commands; F_GETPIPE_SZ of what is not a pipe is EBADF, as in Linux */
        if (f->ops->fcntl) return f->ops->fcntl(sb, f, (unsigned)a[1], a[2]);
        return a[1] == F_GETPIPE_SZ ? -EBADF : -EINVAL;
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
        int n = f->ops->unread ? f->ops->unread(sb, f) : 0;
        return zb_copy_to_guest(sb, a[2], &n, sizeof n);
    }
    default: /* the kind's own (a pty's termios, window size, ...); else not a terminal */
        return f->ops->ioctl ? f->ops->ioctl(sb, f, a[1], a[2]) : -ENOTTY;
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
    return f->ops->truncate ? f->ops->truncate(sb, f, a[1]) : -EINVAL;
}

static long sys_fallocate(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    if (!f) return -EBADF;
    if (!f->ops->fallocate) return -EOPNOTSUPP;
    if (a[1] != 0) return -EOPNOTSUPP;
    long denied = zb_file_write_check(f);
    if (denied) return denied;
    int64_t off = (int64_t)a[2], len = (int64_t)a[3], sum;
    if (off < 0 || len <= 0) return -EINVAL;                  /* as Linux */
    if (__builtin_add_overflow(off, len, &sum)) return -EFBIG; /* (offset + len wrapped before) */
    return f->ops->fallocate(sb, f, (uint64_t)sum);
}

static long sys_fd_noop(zb_sandbox *sb, const uint64_t a[6]) { return zb_fd_get(sb, a[0]) ? 0 : -EBADF; }

static long sys_flock(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *f = zb_fd_get(sb, a[0]);
    return f ? zb_lock_flock(sb, f, (unsigned)a[1]) : -EBADF;
}

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
    t[SYS_flock] = sys_flock;
    t[SYS_syncfs] = sys_fd_noop;
}
