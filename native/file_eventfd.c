/* file_eventfd.c - eventfd(2): a 64-bit counter read and written 8 bytes at a time (what
 * asyncio-free event loops, libuv, glib and ZeroMQ use to wake a poll).
 *
 * write adds its value (UINT64_MAX is EINVAL) unless the counter would pass
 * EVENTFD_MAX (0xfffffffffffffffe); read returns the counter and zeroes it, or with EFD_SEMAPHORE
 * returns 1 and decrements it; buffers shorter than 8 bytes are EINVAL. The file is readable
 * while the counter is non-zero and writable while a write of 1 would succeed.
 * A read of a zero counter, or a write that would overflow, answers EAGAIN; without EFD_NONBLOCK
 * the syscall then waits for another thread or process to change the counter
 * (zb_io_would_block, ZB_FOPS_BLOCKS), as pipes do (file_pipe.c).
 * The counter is the kind's own state (zb_file.priv): copied by forks and snapshots, saved in
 * templates.
 */
#include "fs.h"
#include "linux.h"
#include "serial.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>


#define EVENTFD_MAX 0xfffffffffffffffeull

typedef struct {
    uint64_t count;
    int semaphore; /* EFD_SEMAPHORE (kept apart from f->flags: it equals O_WRONLY) */
} eventfd_state;

static eventfd_state *state_of(const zb_file *f) { return f->priv; }

static long counter_read(zb_sandbox *sb, zb_file *f, uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    (void)off;
    eventfd_state *e = state_of(f);
    if (n < sizeof(uint64_t)) return -EINVAL;
    if (!e->count) return -EAGAIN;
    uint64_t v = e->semaphore ? 1 : e->count;
    e->count -= v;
    memcpy(p, &v, sizeof v); /* (the guest's buffer may be unaligned) */
    return sizeof v;
}

static long counter_write(zb_sandbox *sb, zb_file *f, const uint8_t *p, size_t n, int64_t off) {
    (void)sb;
    (void)off;
    eventfd_state *e = state_of(f);
    uint64_t v;
    if (n < sizeof v) return -EINVAL;
    memcpy(&v, p, sizeof v);
    if (v == UINT64_MAX) return -EINVAL;
    if (v > EVENTFD_MAX - e->count) return -EAGAIN;
    e->count += v;
    return sizeof v;
}

static long counter_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    (void)sb;
    (void)f;
    zb_file_stat_anon(st, 0600); /* an anonymous inode, as epoll's */
    return 0;
}

static short counter_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart) {
    (void)sb;
    (void)want;
    (void)waits_uart;
    const eventfd_state *e = state_of(f);
    return (short)((e->count ? POLLIN | POLLRDNORM : 0) | (e->count < EVENTFD_MAX ? POLLOUT | POLLWRNORM : 0));
}

static void counter_release(zb_fs *fs, zb_file *f) {
    (void)fs;
    free(f->priv);
}

static int counter_clone(zb_file *dst, const zb_file *src) {
    if (!(dst->priv = malloc(sizeof(eventfd_state)))) return -1;
    memcpy(dst->priv, src->priv, sizeof(eventfd_state));
    return 0;
}

static uint64_t counter_copy_bytes(const zb_file *f) {
    (void)f;
    return sizeof(eventfd_state);
}

/* One record: the counter and the semaphore flag. */
static void counter_save(const zb_file *f, zb_out *o) {
    const eventfd_state *e = state_of(f);
    out_u32(o, 1);
    out_u64(o, e->count);
    out_u32(o, (uint32_t)e->semaphore);
}

static int counter_load(zb_file *f, zb_in *in) {
    uint32_t records = in_u32(in);
    eventfd_state *e = calloc(1, sizeof *e);
    if (!e) return -1;
    f->priv = e;
    e->count = in_u64(in);
    uint32_t semaphore = in_u32(in);
    if (in->err || records != 1 || e->count > EVENTFD_MAX || semaphore > 1) return -1;
    e->semaphore = (int)semaphore;
    return 0;
}

const zb_file_ops zb_file_eventfd_ops = {
    .name = "eventfd",
    .props = ZB_FOPS_BLOCKS,
    .read = counter_read,
    .write = counter_write,
    .stat = counter_stat,
    .ready = counter_ready,
    .release = counter_release,
    .clone = counter_clone,
    .save = counter_save,
    .load = counter_load,
    .copy_bytes = counter_copy_bytes,
};

static long sys_eventfd2(zb_sandbox *sb, const uint64_t a[6]) {
    if (a[1] & ~(uint64_t)(EFD_CLOEXEC | EFD_NONBLOCK | EFD_SEMAPHORE)) return -EINVAL;
    zb_file *f = zb_file_new(FILE_EVENTFD);
    eventfd_state *e = f ? calloc(1, sizeof *e) : NULL;
    if (!e) { free(f); return -ENOMEM; }
    e->count = (uint32_t)a[0]; /* an unsigned int, as in Linux */
    e->semaphore = (a[1] & EFD_SEMAPHORE) != 0;
    f->priv = e;
    f->flags = O_RDWR | ((a[1] & EFD_NONBLOCK) ? O_NONBLOCK : 0);
    return zb_fd_install(sb, f, 0, (a[1] & EFD_CLOEXEC) != 0);
}

static long sys_eventfd(zb_sandbox *sb, const uint64_t a[6]) {
    uint64_t b[6] = {a[0], 0, 0, 0, 0, 0};
    return sys_eventfd2(sb, b);
}

void zb_sys_eventfd_register(zb_syscall_fn *t) {
    t[SYS_eventfd2] = sys_eventfd2;
    t[SYS_eventfd] = sys_eventfd;
}
