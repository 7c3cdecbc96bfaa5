/* sys_copy.c - sendfile and copy_file_range: copies from one open file to another inside the
 * engine. The bytes go through the two files' own read and write operations (fs.h zb_file_ops), in
 * chunks of COPY_CHUNK through an engine buffer, never through a host sendfile/copy_file_range: so
 * a copy into a file of the notebook's folder is exactly a write(2) to it (read-only folder: the
 * file could not be opened for writing; overlay folder: the upper copy; read-write: the host file,
 * still under zb_file_write_check), and a copy into a full pipe waits or says EAGAIN as write(2)
 * does. A call copies at most COPY_MAX bytes (a short count, as Linux's MAX_RW_COUNT gives one);
 * offsets change only by what was written, so a call served again after a wait repeats nothing.
 */
#include "util.h"
#include "memory.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "linux.h"

#include <fcntl.h>
#include <sys/syscall.h>

#define COPY_CHUNK (64u << 10) /* bytes per read/write pair */
#define COPY_MAX (16u << 20)   /* bytes per call */

static int can_read(const zb_file *f) { return (f->flags & O_ACCMODE) != O_WRONLY && !(f->flags & O_PATH); }
static int can_write(const zb_file *f) {
    return !(f->flags & O_PATH) && ((f->flags & O_ACCMODE) != O_RDONLY || (f->ops->props & ZB_FOPS_WRITE_ANY_MODE));
}
static int positional(const zb_file *f) { return f->ops->positional && f->ops->positional(f); }

/* Copy up to count bytes from `in` at in_pos to `out` (at out_pos, or at its own offset when
 * out_pos < 0). The bytes written (> 0), 0 at the input's end, or the first error when nothing was
 * written (ZB_SYSCALL_STOP: the output's write asked to be served again). */
static long copy_bytes(zb_sandbox *sb, zb_file *in, uint64_t in_pos, zb_file *out, int64_t out_pos, uint64_t count) {
    count = ZB_MIN(count, (uint64_t)COPY_MAX);
    count = ZB_MIN(count, (uint64_t)INT64_MAX - in_pos);
    if (out_pos >= 0) count = ZB_MIN(count, (uint64_t)(INT64_MAX - out_pos));
    if (!count) return 0;
    uint8_t *buf = malloc(ZB_MIN(count, (uint64_t)COPY_CHUNK));
    if (!buf) return -ENOMEM;
    uint64_t done = 0;
    long err = 0;
    while (done < count) {
        size_t want = (size_t)ZB_MIN(count - done, (uint64_t)COPY_CHUNK);
        long r = in->ops->read(sb, in, buf, want, (int64_t)(in_pos + done));
        if (r <= 0) { err = r; break; }
        long w = out->ops->write(sb, out, buf, (size_t)r, out_pos < 0 ? -1 : out_pos + (int64_t)done);
        if (w == ZB_SYSCALL_STOP && done) sb->has_stop = 0; /* partial: the count, not a retry */
        if (w <= 0) { err = w; break; }
        done += (uint64_t)w;
        if (w < r) break; /* the output is full (a pipe) or at its limit */
        if (sb->has_stop && sb->stop_ev.kind != ZB_EVENT_OUTPUT) break;
    }
    free(buf);
    return done ? (long)done : err;
}

/* sendfile(out_fd, in_fd, offset, count): in_fd must be a file with a position (Linux: one that can
 * splice_read; a pipe or a socket is EINVAL), out_fd anything that can be written but an eventfd;
 * with an offset pointer the input's file offset stays, without it the offset advances. */
static long sys_sendfile(zb_sandbox *sb, const uint64_t a[6]) {
    zb_file *out = zb_fd_get(sb, a[0]), *in = zb_fd_get(sb, a[1]);
    uint64_t uoff = a[2], count = a[3];
    if (!in || !can_read(in)) return -EBADF;
    int64_t pos;
    if (uoff) {
        if (!positional(in)) return -ESPIPE;
        if (zb_copy_from_guest(sb, &pos, uoff, sizeof pos) < 0) return -EFAULT;
    } else {
        pos = (int64_t)in->offset;
    }
    if (pos < 0 || (int64_t)count < 0) return -EINVAL; /* rw_verify_area */
    if (!out || !can_write(out)) return -EBADF;
    int out_stream = (out->ops->props & ZB_FOPS_STREAMS) != 0; /* a pipe or a socket: no position */
    if (!out_stream && (out->flags & O_APPEND)) return -EINVAL;
    if (!in->ops->read || !positional(in) || in->ops->getdents) return -EINVAL;
    if (!out->ops->write || out->kind == FILE_EVENTFD || out->kind == FILE_EPOLL) return -EINVAL;
    long r = copy_bytes(sb, in, (uint64_t)pos, out, -1, count);
    if (r > 0) {
        if (uoff) {
            int64_t now = pos + r;
            if (zb_copy_to_guest(sb, uoff, &now, sizeof now) < 0) return -EFAULT; /* (Linux: the same) */
        } else {
            in->offset = (uint64_t)pos + (uint64_t)r;
        }
        return r;
    }
    if (r == 0 && uoff && zb_copy_to_guest(sb, uoff, &pos, sizeof pos) < 0) return -EFAULT;
    int nonblock = (in->flags & O_NONBLOCK) != 0; /* Linux: SPLICE_F_NONBLOCK from either end */
    return zb_io_would_block(sb, out, r, 1, nonblock, 0);
}

/* The file system of an open file, as stat reports it (copy_file_range stays within one). */
static long stat_of(zb_sandbox *sb, zb_file *f, struct stat *st) {
    memset(st, 0, sizeof *st);
    return zb_file_stat(sb, f, st);
}

/* copy_file_range(fd_in, off_in, fd_out, off_out, len, flags): between regular files of one file
 * system, in Linux's order of checks (vfs_copy_file_range, generic_copy_file_checks): flags,
 * EISDIR, EINVAL for what is not a regular file, EBADF for the access modes and O_APPEND,
 * EOVERFLOW for a range that wraps, EINVAL for an overlap within one file, then for a negative
 * offset, nothing to copy (0), EXDEV across file systems (host files and the sandbox's own files
 * are two, as stat's st_dev says: Linux 5.19+ refuses copies between file systems of two types). */
static long sys_copy_file_range(zb_sandbox *sb, const uint64_t a[6]) {
    uint64_t uoff_in = a[1], uoff_out = a[3], len = a[4];
    if (a[5]) return -EINVAL;
    zb_file *in = zb_fd_get(sb, a[0]), *out = zb_fd_get(sb, a[2]);
    if (!in || !out) return -EBADF;
    int64_t pos_in = (int64_t)in->offset, pos_out = (int64_t)out->offset;
    if (uoff_in && zb_copy_from_guest(sb, &pos_in, uoff_in, sizeof pos_in) < 0) return -EFAULT;
    if (uoff_out && zb_copy_from_guest(sb, &pos_out, uoff_out, sizeof pos_out) < 0) return -EFAULT;
    struct stat si, so;
    if ((in->flags & O_PATH) || (out->flags & O_PATH)) return -EBADF;
    long rc = stat_of(sb, in, &si);
    if (rc < 0) return rc;
    if ((rc = stat_of(sb, out, &so)) < 0) return rc;
    if (S_ISDIR(si.st_mode) || S_ISDIR(so.st_mode)) return -EISDIR;
    if (!S_ISREG(si.st_mode) || !S_ISREG(so.st_mode) || !in->ops->read || !out->ops->write || !positional(in) ||
        !positional(out))
        return -EINVAL;
    if (!can_read(in) || (out->flags & O_ACCMODE) == O_RDONLY || (out->flags & O_APPEND)) return -EBADF;
    uint64_t count = len, uin = (uint64_t)pos_in, uout = (uint64_t)pos_out;
    if (uin + count < uin || uout + count < uout) return -EOVERFLOW; /* (a negative offset may wrap too) */
    /* shortened to the input's end */
    count = pos_in >= (int64_t)si.st_size ? 0 : ZB_MIN(count, (uint64_t)si.st_size - uin);
    if (si.st_dev == so.st_dev && si.st_ino == so.st_ino && uout + count > uin && uout < uin + count) return -EINVAL;
    if (pos_in < 0 || pos_out < 0 || (int64_t)count < 0) return -EINVAL; /* rw_verify_area */
    if (!count) return 0;
    if (si.st_dev != so.st_dev) return -EXDEV;
    long r = copy_bytes(sb, in, (uint64_t)pos_in, out, pos_out, count);
    if (r <= 0) return r;
    if (uoff_in) {
        int64_t now = pos_in + r;
        if (zb_copy_to_guest(sb, uoff_in, &now, sizeof now) < 0) return -EFAULT;
    } else {
        in->offset = (uint64_t)pos_in + (uint64_t)r;
    }
    if (uoff_out) {
        int64_t now = pos_out + r;
        if (zb_copy_to_guest(sb, uoff_out, &now, sizeof now) < 0) return -EFAULT;
    } else {
        out->offset = (uint64_t)pos_out + (uint64_t)r;
    }
    return r;
}

void zb_sys_copy_register(zb_syscall_fn *t) {
    t[SYS_sendfile] = sys_sendfile;
    t[SYS_copy_file_range] = sys_copy_file_range;
}
