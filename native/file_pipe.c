/* file_pipe.c - pipe ends: the read end reads its stream (rx, file_stream.c), the write end
 * writes it (tx). An empty pipe with a writer (or a full one with a reader) answers EAGAIN here;
 * on a blocking fd the syscall then waits (zb_io_would_block, ZB_FOPS_BLOCKS) for another thread
 * or process of the sandbox, which a fork shares the pipe with (zb_fdtable_share).
 */
#include "util.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"

#include <fcntl.h>
#include <poll.h>

static long pipe_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    if (off >= 0) return -ESPIPE;
    return f->rx ? zb_stream_read(f->rx, p, n) : -EBADF; /* the write end */
}

static long pipe_write(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    if (off >= 0) return -ESPIPE;
    if (!f->tx) return -EBADF;  /* the read end */
    if (!n) return 0;           /* Linux: a null write succeeds before the readers are looked at */
    return zb_stream_write(f->tx, p, n);
}

static long pipe_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    (void)sb;
    (void)f;
    zb_file_stat_anon(st, S_IFIFO | 0600);
    return 0;
}

static short pipe_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart) {
    (void)sb;
    (void)want;
    (void)waits_uart;
    /* writable while it has room (the size F_SETPIPE_SZ gave it), as Linux's pipe_poll */
    if (f->tx) return !f->tx->readers ? POLLERR : f->tx->len < zb_stream_cap(f->tx) ? POLLOUT | POLLWRNORM : 0;
    return f->rx->len ? POLLIN | POLLRDNORM : f->rx->writers ? 0 : POLLHUP;
}

/* Add the capacity of each enlarged pipe of table t not yet in seen[0..*n) (except `skip`). */
static uint64_t enlarged_in(const zb_fdtable *t, const zb_pipe *skip, const zb_pipe **seen, size_t *n, size_t max) {
    uint64_t bytes = 0;
    for (int i = 0; i < ZB_MAX_FDS; i++) {
        const zb_file *f = t->fd[i];
        const zb_pipe *p = f && (f->kind == FILE_PIPE || f->kind == FILE_FIFO) ? (f->rx ? f->rx : f->tx) : NULL;
        if (!p || p == skip || zb_stream_cap(p) <= ZB_STREAM_CAP) continue;
        size_t k = 0;
        while (k < *n && seen[k] != p) k++;
        if (k < *n) continue;
        if (*n < max) seen[(*n)++] = p;
        bytes += zb_stream_cap(p);
    }
    return bytes;
}

/* What the enlarged pipes of sb's processes hold at most, but `skip`'s (ZB_PIPE_ENLARGED_BUDGET).
 * At most budget / 128 KiB pipes are enlarged while under it, so `seen` is bounded. */
static uint64_t enlarged_bytes(const zb_sandbox *sb, const zb_pipe *skip) {
    enum { SEEN_MAX = ZB_PIPE_ENLARGED_BUDGET / (2 * ZB_STREAM_CAP) + 1 };
    const zb_pipe *seen[SEEN_MAX];
    size_t n = 0;
    uint64_t bytes = enlarged_in(sb->fds, skip, seen, &n, SEEN_MAX);
    for (int i = 0; sb->fam && i < sb->fam->count; i++) {
        const zb_sandbox *o = sb->fam->m[i].sb;
        if (o && o != sb && o->fds) bytes += enlarged_in(o->fds, skip, seen, &n, SEEN_MAX);
    }
    return bytes;
}

/* F_GETPIPE_SZ, F_SETPIPE_SZ as Linux's pipe_set_size: the size rounded up to a power of two of
 * at least a page; past ZB_PIPE_MAX_SIZE, or past the family's budget for enlarged pipes, EPERM;
 * smaller than the bytes it holds, EBUSY. The capacity is what a writer may put in before it
 * waits (file_stream.c); the buffer itself grows only with what is written. */
static long pipe_fcntl(zb_sandbox *sb, zb_file *f, unsigned cmd, uint64_t arg) {
    zb_pipe *p = f->rx ? f->rx : f->tx;
    if (cmd == F_GETPIPE_SZ) return p ? (long)zb_stream_cap(p) : -EBADF;
    if (cmd != F_SETPIPE_SZ) return -EINVAL;
    if (!p) return -EBADF;
    uint32_t want = (uint32_t)arg; /* fcntl passes it as an unsigned int */
    if (want > (1u << 31)) return -EINVAL;
    uint64_t size = ZB_PAGE;
    while (size < want) size <<= 1;
    if (size > zb_stream_cap(p) && size > ZB_PIPE_MAX_SIZE) return -EPERM;
    if (size > ZB_STREAM_CAP && size > zb_stream_cap(p) && enlarged_bytes(sb, p) + size > ZB_PIPE_ENLARGED_BUDGET) {
        zb_log(sb, "F_SETPIPE_SZ: the enlarged pipes would hold more than %u MiB together: EPERM",
               ZB_PIPE_ENLARGED_BUDGET >> 20);
        return -EPERM;
    }
    if (p->len > size) return -EBUSY;
    p->cap = size == ZB_STREAM_CAP ? 0 : (size_t)size;
    return (long)size;
}

const zb_file_ops zb_file_pipe_ops = {
    .name = "pipe",
    .props = ZB_FOPS_WRITE_ANY_MODE | ZB_FOPS_STREAMS | ZB_FOPS_BLOCKS | ZB_FOPS_WHOLE_WRITES,
    .read = pipe_read,
    .write = pipe_write,
    .stat = pipe_stat,
    .ready = pipe_ready,
    .unread = zb_stream_unread,
    .fcntl = pipe_fcntl,
};
