/* sys_poll.c - poll, ppoll, select and pselect6 over the guest's fds. Readiness and waiting are
 * file_ready.c's (shared with epoll): each fd's file says which events it has.
 */
#include "memory.h"
#include "fs.h"
#include "linux.h"

#include <poll.h>
#include <sys/select.h>
#include <sys/syscall.h>

#define MAX_POLL_FDS 4096

static short fd_ready(zb_sandbox *sb, int fd, short want, int *waits_uart) {
    const zb_file *f = zb_fd_get(sb, (uint64_t)fd);
    return f ? zb_file_ready(sb, f, want, waits_uart) : POLLNVAL;
}

static long do_poll(zb_sandbox *sb, uint64_t ufds, uint64_t nfds, int64_t timeout_ns) {
    if (nfds > MAX_POLL_FDS) return -EINVAL;
    /* the guest's array may sit at any address: work on an aligned copy (as Linux copies it in) */
    struct pollfd pfd[MAX_POLL_FDS];
    size_t bytes = nfds * sizeof *pfd;
    if (nfds && (!zb_guest_ptr(sb, ufds, bytes, 1) || zb_copy_from_guest(sb, pfd, ufds, bytes) < 0)) return -EFAULT;
    for (;;) { /* scanned again when a watched host socket had an event (ZB_POLL_AGAIN) */
        int ready = 0, waits_uart = 0;
        zb_ready_begin();
        for (uint64_t i = 0; i < nfds; i++) {
            pfd[i].revents = pfd[i].fd < 0 ? 0 : fd_ready(sb, pfd[i].fd, pfd[i].events, &waits_uart);
            ready += pfd[i].revents != 0;
        }
        if (nfds && zb_copy_to_guest(sb, ufds, pfd, bytes) < 0) return -EFAULT;
        if (ready) return ready;
        long r = zb_poll_wait(sb, waits_uart, timeout_ns);
        if (r != ZB_POLL_AGAIN) return r < 0 ? r : 0;
    }
}

static long sys_poll(zb_sandbox *sb, const uint64_t a[6]) {
    int ms = (int)a[2];
    return do_poll(sb, a[0], a[1], ms < 0 ? -1 : (int64_t)ms * 1000000);
}

static long sys_ppoll(zb_sandbox *sb, const uint64_t a[6]) {
    int err = 0;
    int64_t ns = zb_poll_timeout_ns(sb, a[2], &err);
    return err ? err : do_poll(sb, a[0], a[1], ns);
}

static long do_select(zb_sandbox *sb, int64_t nfds, uint64_t rd, uint64_t wr, uint64_t ex, int64_t timeout_ns) {
    if (nfds < 0 || nfds > ZB_MAX_FDS) return -EINVAL;
    size_t bytes = ((size_t)nfds + 63) / 64 * 8;
    uint64_t in[ZB_MAX_FDS / 64] = {0}, out[ZB_MAX_FDS / 64] = {0}, rin[ZB_MAX_FDS / 64] = {0}, rout[ZB_MAX_FDS / 64] = {0};
    if ((rd && zb_copy_from_guest(sb, in, rd, bytes) < 0) || (wr && zb_copy_from_guest(sb, out, wr, bytes) < 0)) return -EFAULT;
    if (ex && !zb_guest_ptr(sb, ex, bytes, 1)) return -EFAULT;
    int ready = 0;
    for (;;) { /* scanned again when a watched host socket had an event (ZB_POLL_AGAIN) */
        int waits_uart = 0;
        zb_ready_begin();
        for (int fd = 0; fd < nfds; fd++) {
            short want = (zb_bit(in, (uint64_t)fd) ? POLLIN : 0) | (zb_bit(out, (uint64_t)fd) ? POLLOUT : 0);
            if (!want) continue;
            short got = fd_ready(sb, fd, want, &waits_uart);
            if (got & POLLNVAL) return -EBADF;
            if (got & (POLLIN | POLLHUP | POLLERR) && (want & POLLIN)) { zb_bit_set(rin, (uint64_t)fd); ready++; }
            if (got & (POLLOUT | POLLERR) && (want & POLLOUT)) { zb_bit_set(rout, (uint64_t)fd); ready++; }
        }
        if (ready) break;
        long r = zb_poll_wait(sb, waits_uart, timeout_ns);
        if (r < 0) return r;
        if (r != ZB_POLL_AGAIN) break;
    }
    if ((rd && zb_copy_to_guest(sb, rd, rin, bytes) < 0) || (wr && zb_copy_to_guest(sb, wr, rout, bytes) < 0)) return -EFAULT;
    if (ex) memset(zb_guest_ptr(sb, ex, bytes, 1), 0, bytes); /* no exceptional conditions exist here */
    return ready;
}

static long sys_select(zb_sandbox *sb, const uint64_t a[6]) {
    int64_t ns = -1;
    if (a[4]) {
        struct { int64_t sec, usec; } tv;
        if (zb_copy_from_guest(sb, &tv, a[4], sizeof tv) < 0) return -EFAULT;
        if (tv.sec < 0 || tv.usec < 0 || tv.usec >= 1000000) return -EINVAL; /* as Linux; and usec * 1000 fits */
        ns = tv.sec > 1000000000 ? INT64_MAX / 4 : tv.sec * 1000000000 + tv.usec * 1000;
    }
    return do_select(sb, (int64_t)(int)a[0], a[1], a[2], a[3], ns);
}

static long sys_pselect6(zb_sandbox *sb, const uint64_t a[6]) {
    int err = 0;
    int64_t ns = zb_poll_timeout_ns(sb, a[4], &err);
    return err ? err : do_select(sb, (int64_t)(int)a[0], a[1], a[2], a[3], ns);
}

void zb_sys_poll_register(zb_syscall_fn *t) {
    t[SYS_poll] = sys_poll;
    t[SYS_ppoll] = sys_ppoll;
    t[SYS_select] = sys_select;
    t[SYS_pselect6] = sys_pselect6;
}
