/* file_console.c - the guest's stdout and stderr: each write becomes (part of) an OUTPUT event
 * for the host (zb_output), which drains it before the guest runs on. */
#include "process.h"
#include "fs.h"

#include <poll.h>

static long console_write(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off) {
    (void)off;
    if (!n) return 0;
    int w = zb_output(sb, f->stream, p, n);
    return w > 0 ? w : -EAGAIN;
}

static long console_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    (void)sb;
    (void)f;
    zb_file_stat_anon(st, S_IFIFO | 0600);
    return 0;
}

static short console_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart) {
    (void)sb;
    (void)f;
    (void)want;
    (void)waits_uart;
    return POLLOUT | POLLWRNORM;
}

const zb_file_ops zb_file_console_ops = {
    .name = "console",
    .props = ZB_FOPS_WRITE_ANY_MODE,
    .write = console_write,
    .stat = console_stat,
    .ready = console_ready,
};
