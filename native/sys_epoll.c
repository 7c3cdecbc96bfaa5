/* sys_epoll.c - epoll over the guest's fds (what asyncio's default selector uses).
 *
 * An epoll fd holds an interest list of (fd, open file description) items; the epoll file kind
 * itself (its readiness, clones, snapshots) is file_epoll.c. Readiness is the one poll() computes
 * (zb_file_ready, file_ready.c), so it is level-triggered; EPOLLET is accepted and behaves as
 * level-triggered (an edge-triggered reader drains until EAGAIN anyway), EPOLLONESHOT disarms an
 * item once it was reported. As in Linux, closing the last fd of a description drops its items,
 * and regular files and directories cannot be added (EPERM). With nothing ready, epoll_wait sleeps
 * until its timeout (no other thread could make anything ready) or stops for UART input.
 * Nested epoll fds work as in Linux: an epoll cannot watch itself (EINVAL, whichever fd names it),
 * and an addition that would close a loop of epoll files or nest them more than ZB_EPOLL_MAX_NESTS
 * deep is refused with ELOOP. Loops and depth are checked on files, not fd numbers (a dup'ed fd is
 * the same file). Readiness of nested epolls is computed without C recursion (file_epoll.c).
 */
#include "memory.h"
#include "sandbox_state.h"
#include "fs.h"
#include "linux.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/epoll.h>
#include <sys/syscall.h>

#define EPOLL_KNOWN_EVENTS (EPOLLIN | EPOLLPRI | EPOLLOUT | EPOLLERR | EPOLLHUP | EPOLLRDNORM | EPOLLRDBAND | \
                            EPOLLWRNORM | EPOLLWRBAND | EPOLLMSG | EPOLLRDHUP | EPOLLEXCLUSIVE | EPOLLWAKEUP | \
                            EPOLLONESHOT | EPOLLET)

static zb_epoll *epoll_of(zb_sandbox *sb, uint64_t fd, long *err) {
    zb_file *f = zb_fd_get(sb, fd);
    *err = !f ? -EBADF : f->kind != FILE_EPOLL ? -EINVAL : 0;
    return *err ? NULL : f->epoll;
}

static long create(zb_sandbox *sb, int cloexec) {
    zb_file *f = zb_file_new(FILE_EPOLL);
    if (!f || !(f->epoll = calloc(1, sizeof *f->epoll))) { free(f); return -ENOMEM; }
    f->flags = O_RDWR;
    return zb_fd_install(sb, f, 0, cloexec);
}

static long sys_epoll_create(zb_sandbox *sb, const uint64_t a[6]) { return (int)a[0] <= 0 ? -EINVAL : create(sb, 0); }
static long sys_epoll_create1(zb_sandbox *sb, const uint64_t a[6]) {
    return a[0] & ~(uint64_t)EPOLL_CLOEXEC ? -EINVAL : create(sb, (a[0] & EPOLL_CLOEXEC) != 0);
}

static void drop_closed_items(zb_sandbox *sb, zb_epoll *e) {
    int kept = 0;
    for (int i = 0; i < e->n; i++)
        if (zb_epoll_item_file(sb, &e->items[i])) e->items[kept++] = e->items[i];
    e->n = kept;
}

static zb_epoll_item *find(zb_epoll *e, int fd) {
    for (int i = 0; i < e->n; i++) if (e->items[i].fd == fd) return &e->items[i];
    return NULL;
}

/* Does epoll file `outer` watch `inner` directly? */
static int watches(zb_sandbox *sb, const zb_file *outer, const zb_file *inner) {
    const zb_epoll *e = outer->epoll;
    for (int i = 0; i < e->n; i++)
        if (zb_epoll_item_file(sb, &e->items[i]) == inner) return 1;
    return 0;
}

/* The distinct epoll files of the fd table (a description shared by dup'ed fds counts once). */
static int epoll_files(zb_sandbox *sb, const zb_file **out) {
    int n = 0;
    for (int fd = 0; fd < ZB_MAX_FDS; fd++) {
        const zb_file *f = sb->fds->fd[fd];
        if (!f || f->kind != FILE_EPOLL) continue;
        int seen = 0;
        for (int k = 0; k < n && !seen; k++) seen = out[k] == f;
        if (!seen) out[n++] = f;
    }
    return n;
}

/* How many levels of epoll files lie below `from` (0: it watches none) and whether `target` is
 * among them; or above it (`up`: files watching it, transitively). Level by level over the
 * table's epoll files, never deeper than `limit` levels: a breadth-first walk, no recursion. */
static int nest_levels(zb_sandbox *sb, const zb_file **files, int nfiles, const zb_file *from, int up,
                       const zb_file *target, int limit, int *reaches) {
    const zb_file *level[ZB_MAX_FDS], *next[ZB_MAX_FDS];
    int n = 1, depth = 0;
    level[0] = from;
    while (n && depth <= limit) {
        int m = 0;
        for (int k = 0; k < nfiles; k++) {
            const zb_file *g = files[k];
            for (int i = 0; i < n; i++) {
                if (!(up ? watches(sb, g, level[i]) : watches(sb, level[i], g))) continue;
                if (g == target) *reaches = 1;
                next[m++] = g;
                break;
            }
        }
        if (!m) break;
        depth++;
        memcpy(level, next, (size_t)m * sizeof *level);
        n = m;
    }
    return depth;
}

/* May epoll file `ep` watch epoll file `target`? Not if target is ep or reaches it (a loop), nor if
 * the chain through the new link would nest more than ZB_EPOLL_MAX_NESTS deep (ELOOP, as Linux). */
static long check_nesting(zb_sandbox *sb, const zb_file *ep, const zb_file *target) {
    if (target == ep) return -EINVAL;
    const zb_file **files = malloc(ZB_MAX_FDS * sizeof *files);
    if (!files) return -ENOMEM;
    int nfiles = epoll_files(sb, files), loop = 0;
    int below = nest_levels(sb, files, nfiles, target, 0, ep, ZB_EPOLL_MAX_NESTS, &loop);
    int above = loop ? 0 : nest_levels(sb, files, nfiles, ep, 1, NULL, ZB_EPOLL_MAX_NESTS, &loop);
    free(files);
    return loop || above + 1 + below > ZB_EPOLL_MAX_NESTS ? -ELOOP : 0;
}

/* Watches all the sandbox's epoll files may hold together (Linux: max_user_watches, ENOSPC). Each
 * is engine memory that every snapshot of the fd table copies. */
#define EPOLL_MAX_WATCHES 16384

static int total_watches(zb_sandbox *sb) {
    const zb_file **files = malloc(ZB_MAX_FDS * sizeof *files);
    if (!files) return EPOLL_MAX_WATCHES;
    int n = epoll_files(sb, files), total = 0;
    for (int k = 0; k < n; k++) total += files[k]->epoll->n;
    free(files);
    return total;
}

static long sys_epoll_ctl(zb_sandbox *sb, const uint64_t a[6]) {
    long err;
    zb_epoll *e = epoll_of(sb, a[0], &err);
    if (!e) return err;
    int op = (int)a[1], fd = (int)a[2];
    zb_file *target = zb_fd_get(sb, a[2]);
    if (!target) return -EBADF;
    if (target == zb_fd_get(sb, a[0])) return -EINVAL; /* the same file, whatever the fd numbers */
    if (target->ops->props & ZB_FOPS_NO_EPOLL) return -EPERM; /* regular files and directories, as Linux */
    struct epoll_event ev = {0, {0}};
    if (op != EPOLL_CTL_DEL && zb_copy_from_guest(sb, &ev, a[3], sizeof ev) < 0) return -EFAULT;
    if (op != EPOLL_CTL_DEL && (ev.events & ~(uint32_t)EPOLL_KNOWN_EVENTS)) return -EINVAL;
    drop_closed_items(sb, e);
    zb_epoll_item *it = find(e, fd);
    switch (op) {
    case EPOLL_CTL_ADD:
        if (it) return -EEXIST;
        if (target->kind == FILE_EPOLL) {
            long rc = check_nesting(sb, zb_fd_get(sb, a[0]), target);
            if (rc < 0) return rc;
        }
        if (total_watches(sb) >= EPOLL_MAX_WATCHES) return -ENOSPC;
        if (e->n == e->cap) {
            int cap = e->cap ? 2 * e->cap : 8;
            zb_epoll_item *items = realloc(e->items, (size_t)cap * sizeof *items);
            if (!items) return -ENOMEM;
            e->items = items;
            e->cap = cap;
        }
        e->items[e->n++] = (zb_epoll_item){.fd = fd, .file_id = target->id, .events = ev.events, .data = ev.data.u64};
        return 0;
    case EPOLL_CTL_MOD:
        if (!it) return -ENOENT;
        if (ev.events & EPOLLEXCLUSIVE) return -EINVAL;
        it->events = ev.events;
        it->data = ev.data.u64;
        it->disarmed = 0;
        return 0;
    case EPOLL_CTL_DEL:
        if (!it) return -ENOENT;
        *it = e->items[--e->n];
        return 0;
    default:
        return -EINVAL;
    }
}

static long do_wait(zb_sandbox *sb, uint64_t epfd, uint64_t events, int maxevents, int64_t timeout_ns) {
    long err;
    zb_epoll *e = epoll_of(sb, epfd, &err);
    if (!e) return err;
    if (maxevents <= 0 || maxevents > INT_MAX / (int)sizeof(struct epoll_event)) return -EINVAL;
    struct epoll_event *out = zb_guest_ptr(sb, events, (uint64_t)maxevents * sizeof *out, 1);
    if (!out) return -EFAULT;
    drop_closed_items(sb, e);
    for (;;) { /* scanned again when a watched host socket had an event (ZB_POLL_AGAIN) */
        int n = 0, waits_uart = 0;
        zb_ready_begin();
        for (int i = 0; i < e->n && n < maxevents; i++) {
            zb_epoll_item *it = &e->items[i];
            uint32_t got = zb_epoll_item_ready(sb, it, &waits_uart);
            if (!got) continue;
            out[n].events = got;
            out[n].data.u64 = it->data;
            n++;
            if (it->events & EPOLLONESHOT) it->disarmed = 1;
        }
        if (n) return n;
        long r = zb_poll_wait(sb, waits_uart, timeout_ns);
        if (r != ZB_POLL_AGAIN) return r < 0 ? r : 0;
    }
}

static int64_t ms_timeout(uint64_t ms) { return (int)ms < 0 ? -1 : (int64_t)(int)ms * 1000000; }

static long sys_epoll_wait(zb_sandbox *sb, const uint64_t a[6]) { return do_wait(sb, a[0], a[1], (int)a[2], ms_timeout(a[3])); }

/* The signal mask argument is not applied: signals reach the guest only between its syscalls and
 * when the host raises them, so there is no race for it to close. */
static long sys_epoll_pwait(zb_sandbox *sb, const uint64_t a[6]) { return do_wait(sb, a[0], a[1], (int)a[2], ms_timeout(a[3])); }

static long sys_epoll_pwait2(zb_sandbox *sb, const uint64_t a[6]) {
    int err = 0;
    int64_t ns = zb_poll_timeout_ns(sb, a[3], &err);
    return err ? err : do_wait(sb, a[0], a[1], (int)a[2], ns);
}

void zb_sys_epoll_register(zb_syscall_fn *t) {
    t[SYS_epoll_create] = sys_epoll_create;
    t[SYS_epoll_create1] = sys_epoll_create1;
    t[SYS_epoll_ctl] = sys_epoll_ctl;
    t[SYS_epoll_wait] = sys_epoll_wait;
    t[SYS_epoll_pwait] = sys_epoll_pwait;
    t[SYS_epoll_pwait2] = sys_epoll_pwait2;
}
