/* file_dev.c - the devices: /dev/null, /dev/zero, /dev/urandom (memory-like: positional, always
 * ready) and the UART (/dev/ttyS0, the agent's channel to the host: a tty, so not positional; it
 * is readable when the host queued input, and a read with none stops the guest for an INPUT event).
 * Opening a device location is here too; /proc files (fs_proc.c) are opened as overlay files, /dev/ptmx
 * and /dev/pts/N as the ends of a pty (file_pty.c).
 */
#include "dev.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>

static long dev_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, int64_t off) {
    (void)off;
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
            return zb_wait_input(sb, INT64_MAX); /* an INPUT stop, or other threads run meanwhile */
        }
        return (long)zb_uart_read(&sb->uart, p, n);
    }
    return -EINVAL;
}

/* A UART write is part of a frame for the host: a complete frame stops the guest (FRAME event),
 * a malformed one ends it. */
static long uart_write(zb_sandbox *sb, const uint8_t *p, size_t n) {
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

static long dev_write(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off) {
    (void)off;
    return f->dev == DEV_UART ? uart_write(sb, p, n) : (long)n; /* the others swallow everything */
}

static int dev_positional(const zb_file *f) { return f->dev != DEV_UART; }

static long dev_seek(zb_sandbox *sb, zb_file *f, int64_t off, int whence) {
    (void)sb;
    (void)f;
    (void)off;
    (void)whence;
    return 0;
}

static long dev_mmap_fill(zb_sandbox *sb, zb_file *f, uint64_t addr, uint64_t len, uint64_t off) {
    (void)sb;
    (void)addr;
    (void)len;
    (void)off;
    return f->dev == DEV_ZERO || f->dev == DEV_NULL ? 0 : -ENODEV; /* the range is zero already */
}

static long dev_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    (void)sb;
    zb_dev_stat(f->dev, st);
    return 0;
}

static short dev_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart) {
    short in = POLLIN | POLLRDNORM, out = POLLOUT | POLLWRNORM;
    if (f->dev != DEV_UART) return in | out;
    if (zb_uart_rx_available(&sb->uart)) return in | out;
    if (want & in) *waits_uart = 1;
    return out;
}

static int dev_unread(zb_sandbox *sb, const zb_file *f) {
    return f->dev == DEV_UART ? (int)zb_uart_rx_available(&sb->uart) : 0;
}

const zb_file_ops zb_file_dev_ops = {
    .name = "device",
    .read = dev_read,
    .write = dev_write,
    .positional = dev_positional,
    .seek = dev_seek,
    .mmap_fill = dev_mmap_fill,
    .stat = dev_stat,
    .ready = dev_ready,
    .unread = dev_unread,
};

/* Open a LOC_DEV location: a device, or a private snapshot of a /proc file's synthesised content
 * (fs_proc.c), which is then an unnamed overlay file (r becomes its location). */
long zb_dev_open(zb_sandbox *sb, zb_resolved *r, uint64_t flags, zb_file **out) {
    int wr = (flags & O_ACCMODE) != O_RDONLY;
    zb_file *f;
    if (r->loc.dev == DEV_PTMX) return zb_pty_open_master(sb, out);
    if (r->loc.dev == DEV_PTS_PTMX) return -EACCES; /* mode 0000 and root's, as devpts has it */
    if (r->loc.dev >= DEV_PTS_FIRST) return zb_pty_open_slave(sb, r->loc.dev, flags, out);
    if (zb_dev_is_proc(r->loc.dev)) {
        if (wr || (flags & O_TRUNC)) return -EACCES;
        long ino = zb_proc_snapshot(sb, &r->loc);
        if (ino < 0) return ino;
        zb_ovl_open_ref(sb->fs, (uint32_t)ino, 1); /* nlink 0: released with its last open */
        if (!(f = zb_file_new(FILE_OVERLAY))) { zb_ovl_open_ref(sb->fs, (uint32_t)ino, -1); return -ENOMEM; }
        f->ino = (uint32_t)ino;
        r->loc.kind = LOC_OVERLAY;
        r->loc.ino = (uint32_t)ino;
    } else {
        if (!(f = zb_file_new(FILE_DEV))) return -ENOMEM;
        f->dev = r->loc.dev;
    }
    *out = f;
    return 0;
}
