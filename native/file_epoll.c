/* file_epoll.c - the epoll file kind: its interest list (zb_epoll), its readiness (readable when
 * an item is ready, nested epolls walked without recursion), and its life across clones and
 * snapshots. The epoll syscalls are in sys_epoll.c. */
#include "fs.h"
#include "serial.h"

#include <poll.h>
#include <sys/epoll.h>


#define EPOLL_POLL_BITS 0xffffu /* the readiness bits, which equal poll()'s */

void zb_epoll_free(zb_epoll *e) {
    if (!e) return;
    free(e->items);
    free(e);
}

zb_epoll *zb_epoll_copy(const zb_epoll *e) {
    zb_epoll *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (e->n) {
        if (!(c->items = malloc((size_t)e->n * sizeof *c->items))) { free(c); return NULL; }
        memcpy(c->items, e->items, (size_t)e->n * sizeof *c->items);
    }
    c->n = c->cap = e->n;
    return c;
}

const zb_file *zb_epoll_item_file(zb_sandbox *sb, const zb_epoll_item *it) {
    const zb_file *f = zb_fd_get(sb, (uint64_t)it->fd);
    return f && f->id == it->file_id ? f : NULL;
}

uint32_t zb_epoll_item_ready(zb_sandbox *sb, const zb_epoll_item *it, int *waits_uart) {
    const zb_file *f = zb_epoll_item_file(sb, it);
    if (!f || it->disarmed) return 0;
    short want = (short)((it->events | EPOLLERR | EPOLLHUP) & EPOLL_POLL_BITS);
    return (uint16_t)zb_file_ready(sb, f, want, waits_uart);
}

/* Is anything in e ready? Nested epoll items are walked with an explicit stack (no recursion),
 * no deeper than ZB_EPOLL_MAX_NESTS levels below e: what lies deeper counts as not ready. */
static int any_ready(zb_sandbox *sb, const zb_epoll *e, int *waits_uart) {
    struct { const zb_epoll *e; int i; } stack[ZB_EPOLL_MAX_NESTS + 1];
    int top = 0;
    stack[0].e = e;
    stack[0].i = 0;
    while (top >= 0) {
        const zb_epoll *cur = stack[top].e;
        if (stack[top].i >= cur->n) { top--; continue; }
        const zb_epoll_item *it = &cur->items[stack[top].i++];
        const zb_file *f = zb_epoll_item_file(sb, it);
        if (!f || it->disarmed) continue;
        if (f->kind != FILE_EPOLL) {
            if (zb_epoll_item_ready(sb, it, waits_uart)) return 1;
            continue;
        }
        /* an epoll file is readable (its only readiness) when something in it is ready */
        if (!(it->events & (EPOLLIN | EPOLLRDNORM))) continue;
        if (top == ZB_EPOLL_MAX_NESTS) continue;
        top++;
        stack[top].e = f->epoll;
        stack[top].i = 0;
    }
    return 0;
}

static short epoll_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart) {
    (void)want;
    return any_ready(sb, f->epoll, waits_uart) ? POLLIN | POLLRDNORM : 0;
}

static long epoll_stat(zb_sandbox *sb, zb_file *f, struct stat *st) {
    (void)sb;
    (void)f;
    zb_file_stat_anon(st, 0600);
    return 0;
}

static void epoll_release(zb_fs *fs, zb_file *f) {
    (void)fs;
    zb_epoll_free(f->epoll);
}

static int epoll_clone(zb_file *dst, const zb_file *src) {
    return src->epoll && !(dst->epoll = zb_epoll_copy(src->epoll)) ? -1 : 0;
}

static uint64_t epoll_copy_bytes(const zb_file *f) {
    return f->epoll ? sizeof *f->epoll + (uint64_t)f->epoll->n * sizeof *f->epoll->items : 0;
}

/* The interest list: a count, then each item. */
static void epoll_save(const zb_file *f, zb_out *o) {
    out_u32(o, f->epoll ? (uint32_t)f->epoll->n : 0);
    for (int e = 0; f->epoll && e < f->epoll->n; e++) {
        const zb_epoll_item *it = &f->epoll->items[e];
        out_u32(o, (uint32_t)it->fd);
        out_u64(o, it->file_id);
        out_u32(o, it->events);
        out_u64(o, it->data);
        out_u32(o, (uint32_t)it->disarmed);
    }
}

static int epoll_load(zb_file *f, zb_in *in) {
    uint32_t n = in_u32(in);
    if (in->err || n > ZB_MAX_FDS) return -1;
    if (!(f->epoll = calloc(1, sizeof *f->epoll)) || (n && !(f->epoll->items = calloc(n, sizeof *f->epoll->items)))) return -1;
    f->epoll->cap = (int)n;
    for (uint32_t e = 0; e < n; e++) {
        zb_epoll_item *it = &f->epoll->items[e];
        it->fd = (int)in_u32(in);
        it->file_id = in_u64(in);
        it->events = in_u32(in);
        it->data = in_u64(in);
        it->disarmed = in_u32(in) != 0;
        if (in->err || it->fd < 0 || it->fd >= ZB_MAX_FDS) return -1;
        f->epoll->n++;
    }
    return 0;
}

const zb_file_ops zb_file_epoll_ops = {
    .name = "epoll",
    .ready = epoll_ready,
    .stat = epoll_stat,
    .release = epoll_release,
    .clone = epoll_clone,
    .save = epoll_save,
    .load = epoll_load,
    .copy_bytes = epoll_copy_bytes,
};
