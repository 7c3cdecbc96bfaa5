/* file_ready.c - readiness of open files and waiting for it: what poll, select (sys_poll.c) and
 * epoll (sys_epoll.c, file_epoll.c) share. Each kind says which events it has (zb_file_ops.ready);
 * the guest is one thread and its files are in memory or read-only host files, so almost
 * everything is ready at once. The exceptions: the UART is readable only when the host queued
 * input (a guest waiting on it gives the caller an INPUT event, as a blocking read does), and
 * stream ends and eventfds follow their state. If nothing is ready, the guest sleeps until its
 * timeout, since no other thread could make anything ready in the meantime.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"

#include <poll.h>

short zb_file_ready(zb_sandbox *sb, const zb_file *f, short want, int *waits_uart) {
    short got = f->ops->ready ? f->ops->ready(sb, f, want, waits_uart) : (POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM);
    return (short)(got & (want | POLLERR | POLLHUP | POLLNVAL));
}

/* Nothing is ready: wait for nothing in particular until the timeout, or stop for UART input. */
long zb_poll_wait(zb_sandbox *sb, int waits_uart, int64_t timeout_ns) {
    if (timeout_ns == 0) return 0;
    if (waits_uart) {
        zb_stop_event(sb, ZB_EVENT_INPUT, 1);
        return ZB_SYSCALL_STOP;
    }
    int64_t wake = timeout_ns < 0 ? INT64_MAX : zb_now_ns() + timeout_ns;
    if (sb->cpu.pending_wake_ns) wake = sb->cpu.pending_wake_ns;
    return zb_sleep_until(sb, wake);
}

int64_t zb_poll_timeout_ns(zb_sandbox *sb, uint64_t addr, int *err) {
    struct timespec ts;
    if (!addr) return -1;
    if (zb_copy_from_guest(sb, &ts, addr, sizeof ts) < 0) { *err = -EFAULT; return 0; }
    if (ts.tv_sec < 0 || ts.tv_nsec < 0 || ts.tv_nsec >= 1000000000) { *err = -EINVAL; return 0; }
    return ts.tv_sec > 1000000000 ? INT64_MAX / 4 : (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
