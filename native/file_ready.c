/* file_ready.c - readiness of open files and waiting for it: what poll, select (sys_poll.c) and
 * epoll (sys_epoll.c, file_epoll.c) share. Each kind says which events it has (zb_file_ops.ready);
 * the guest is one thread and its files are in memory or read-only host files, so almost
 * everything is ready at once. The exceptions: the UART is readable only when the host queued
 * input (a guest waiting on it gives the caller an INPUT event, as a blocking read does), and
 * stream ends and eventfds follow their state, and host sockets (file_inet.c) the host's state.
 * If nothing is ready, the guest sleeps until its timeout, since no other thread could make
 * anything ready in the meantime, unless a host socket was among the files: then the sleep
 * watches those (zb_ready_watch) and the caller scans again when one has an event.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"

#include <poll.h>
#include <signal.h>
#include <time.h>

short zb_file_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart) {
    short got = f->ops->ready ? f->ops->ready(sb, f, want, waits_uart) : (POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM);
    return (short)(got & (want | POLLERR | POLLHUP | POLLNVAL));
}

/* The host sockets (file_inet.c) a scan found not ready: a wait watches them. This thread's
 * guest is the only one using it, from zb_ready_begin to the wait. */
static __thread struct pollfd watched[ZB_MAX_FDS];
static __thread int nwatched;

void zb_ready_begin(void) { nwatched = 0; }

void zb_ready_watch(int host_fd, short events) {
    for (int i = 0; i < nwatched; i++)
        if (watched[i].fd == host_fd) { watched[i].events |= events; return; }
    if (nwatched < ZB_MAX_FDS) watched[nwatched++] = (struct pollfd){.fd = host_fd, .events = events};
}

/* Sleep until wake, a kick, the run's deadline or the guest's alarm, or until a watched host
 * socket has an event (ZB_POLL_AGAIN, with the wake time kept for the scan that follows). */
static long wait_watched(zb_sandbox *sb, int64_t wake) {
    for (;;) {
        int64_t now = zb_now_ns();
        if (now >= wake) return 0;
        /* other threads or processes run meanwhile (the syscall is served again, asking its host
         * sockets again, each time this thread is switched back in) */
        if (zb_sleep_yields(sb, wake, now)) {
            nwatched = 0;
            return ZB_SYSCALL_BLOCK;
        }
        int kind = 0;
        if (zb_take_kick(sb)) kind = ZB_EVENT_KICK;
        else if (zb_run_deadline_ns && now >= zb_run_deadline_ns) kind = ZB_EVENT_TIMEOUT;
        if (kind) {
            sb->cpu.pending_wake_ns = wake;
            zb_stop_event(sb, kind, 1);
            return ZB_SYSCALL_STOP;
        }
        if (zb_alarm_check(sb, now) && zb_signal_interrupts(sb, SIGALRM)) return -EINTR;
        int64_t until = zb_run_deadline_ns ? ZB_MIN(wake, zb_run_deadline_ns) : wake;
        if (sb->sig.alarm_ns) until = ZB_MIN(until, sb->sig.alarm_ns);
        until = zb_sleep_bound(sb, until);
        int64_t ns = ZB_MAX(0, ZB_MIN(until - now, (int64_t)3600 * 1000000000));
        struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
        if (zb_wait_ppoll(watched, (nfds_t)nwatched, &ts, &zb_run_wait_sigmask) > 0) { /* else the kick signal, or time */
            sb->cpu.pending_wake_ns = wake;
            nwatched = 0;
            return ZB_POLL_AGAIN;
        }
    }
}

/* Nothing is ready: wait until the timeout (or a watched host socket's event), or, when the UART
 * is among the files, as a read of it waits (zb_wait_input: an INPUT stop, or between requests a
 * sleep until the timeout). */
long zb_poll_wait(zb_sandbox *sb, int waits_uart, int64_t timeout_ns) {
    if (timeout_ns == 0) return 0;
    int64_t wake = timeout_ns < 0 ? INT64_MAX : zb_now_ns() + timeout_ns;
    if (sb->cpu.pending_wake_ns) wake = sb->cpu.pending_wake_ns;
    if (waits_uart) return zb_wait_input(sb, wake); /* host sockets among the files wait for the next request */
    if (nwatched) return wait_watched(sb, wake);
    return zb_sleep_until(sb, wake);
}

int64_t zb_poll_timeout_ns(zb_sandbox *sb, uint64_t addr, int *err) {
    struct timespec ts;
    if (!addr) return -1;
    if (zb_copy_from_guest(sb, &ts, addr, sizeof ts) < 0) { *err = -EFAULT; return 0; }
    if (ts.tv_sec < 0 || ts.tv_nsec < 0 || ts.tv_nsec >= 1000000000) { *err = -EINVAL; return 0; }
    return ts.tv_sec > 1000000000 ? INT64_MAX / 4 : (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
