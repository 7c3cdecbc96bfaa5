/* file_pipe.c - pipe ends: the read end reads its stream (rx, file_stream.c), the write end
 * writes it (tx). An empty pipe with a writer (or a full one with a reader) answers EAGAIN here;
 * on a blocking fd the syscall then waits (zb_io_would_block, ZB_FOPS_BLOCKS) for another thread
 * or process of the sandbox, which a fork shares the pipe with (zb_fdtable_share).
 */
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
    if (f->tx) return f->tx->readers ? POLLOUT | POLLWRNORM : POLLERR;
    return f->rx->len ? POLLIN | POLLRDNORM : f->rx->writers ? 0 : POLLHUP;
}

static long pipe_fcntl(zb_sandbox *sb, zb_file *f, unsigned cmd, uint64_t arg) {
    (void)sb;
    (void)f;
    (void)arg;
    return cmd == F_GETPIPE_SZ ? (long)ZB_STREAM_CAP : -EINVAL;
}

const zb_file_ops zb_file_pipe_ops = {
    .name = "pipe",
    .props = ZB_FOPS_WRITE_ANY_MODE | ZB_FOPS_STREAMS | ZB_FOPS_BLOCKS,
    .read = pipe_read,
    .write = pipe_write,
    .stat = pipe_stat,
    .ready = pipe_ready,
    .unread = zb_stream_unread,
    .fcntl = pipe_fcntl,
};
