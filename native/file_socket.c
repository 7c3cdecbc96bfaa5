/* file_socket.c - one end of a socketpair(AF_UNIX, SOCK_STREAM): it reads the stream its peer
 * writes (rx) and writes the one its peer reads (tx); shutdown() detaches either (sys_socket.c has
 * the socket syscalls). A direction shut down reads EOF and writes EPIPE, as in Linux. */
#include "fs.h"

#include <poll.h>

static long socket_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    if (off >= 0) return -ESPIPE;
    return f->rx ? zb_stream_read(f->rx, p, n) : 0;
}

static long socket_write(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    if (off >= 0) return -ESPIPE;
    return f->tx ? zb_stream_write(f->tx, p, n) : -EPIPE;
}

static long socket_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    (void)sb;
    (void)f;
    zb_file_stat_anon(st, S_IFSOCK | 0777);
    return 0;
}

/* Linux's unix stream sockets: EOF reads as POLLIN | POLLRDHUP, both ways shut as POLLHUP. */
static short socket_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart) {
    (void)sb;
    (void)want;
    (void)waits_uart;
    short got = 0;
    if (!f->rx || f->rx->len || !f->rx->writers) got |= POLLIN | POLLRDNORM;
    if (!f->rx || !f->rx->writers) got |= POLLRDHUP;
    if (f->tx && f->tx->readers && f->tx->len < ZB_STREAM_CAP) got |= POLLOUT | POLLWRNORM;
    if ((!f->tx || !f->tx->readers) && (!f->rx || !f->rx->writers)) got |= POLLHUP;
    return got;
}

const zb_file_ops zb_file_socket_ops = {
    .name = "socket",
    .props = ZB_FOPS_WRITE_ANY_MODE | ZB_FOPS_STREAMS | ZB_FOPS_BLOCKS,
    .read = socket_read,
    .write = socket_write,
    .stat = socket_stat,
    .ready = socket_ready,
    .unread = zb_stream_unread,
};
