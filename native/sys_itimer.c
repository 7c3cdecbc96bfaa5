/* sys_itimer.c - the guest's interval timers: alarm(), setitimer()/getitimer().
 *
 * Grading tools and test runners bound a piece of code with SIGALRM (signal.alarm, pytest-timeout's
 * signal method), so the timer is real: the expiry time lives in the guest's signal state (it is
 * snapshotted with it), the run loop wakes the engine when it passes (run_loop.c arms its POSIX timer
 * at the earlier of the run deadline and the alarm), and zb_alarm_check() (signals.c) then queues
 * SIGALRM.
 * The timer counts wall-clock time, as ITIMER_REAL does, but it can only fire while the sandbox runs:
 * an alarm that expired while the sandbox was idle fires as soon as it runs again.
 * ITIMER_VIRTUAL and ITIMER_PROF (sampling profilers, CPython's test_signal) count the process's
 * user and user + system CPU time (zb_guest_cpu_split: its runs less its waits), with SIGVTALRM and
 * SIGPROF (zb_cpu_timers_check, signals.c). Each timer is the process's (its threads' time
 * together), a fork's child starts without any, and execve keeps them, as on Linux.
 */
#include "util.h"
#include "memory.h"
#include "process.h"
#include "sandbox_state.h"
#include "linux.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/time.h>

#define NS_PER_S 1000000000ll
#define NS_PER_US 1000ll
#define MAX_TIMER_S (INT64_MAX / NS_PER_S / 4) /* far beyond any run, without overflowing now + t */

int zb_sandbox_cancel_alarm(zb_sandbox *sb) {
    int armed = sb->sig.alarm_ns != 0;
    sb->sig.alarm_ns = sb->sig.alarm_interval_ns = 0;
    return armed;
}

static int64_t timeval_ns(const struct timeval *tv) { return (int64_t)tv->tv_sec * NS_PER_S + (int64_t)tv->tv_usec * NS_PER_US; }

static struct timeval ns_timeval(int64_t ns) {
    struct timeval tv = {(time_t)(ns / NS_PER_S), (suseconds_t)((ns % NS_PER_S + NS_PER_US - 1) / NS_PER_US)};
    if (tv.tv_usec == 1000000) { tv.tv_sec++; tv.tv_usec = 0; }
    return tv;
}

static void current_timer(const zb_sandbox *sb, struct itimerval *out) {
    int64_t left = sb->sig.alarm_ns ? ZB_MAX(sb->sig.alarm_ns - zb_now_ns(), 1) : 0; /* armed reads as >= 1 ns */
    out->it_value = ns_timeval(left);
    out->it_interval = ns_timeval(sb->sig.alarm_interval_ns);
}

/* ITIMER_VIRTUAL (i = ZB_CPU_TIMER_VIRTUAL) or ITIMER_PROF, read as current_timer reads the alarm. */
static void current_cpu_timer(const zb_sandbox *sb, int i, struct itimerval *out) {
    int64_t at = sb->sig.cpu_timer_ns[i], left = at ? ZB_MAX(at - zb_cpu_timer_clock(sb, i), 1) : 0;
    out->it_value = ns_timeval(left);
    out->it_interval = ns_timeval(sb->sig.cpu_timer_interval_ns[i]);
}

static int cpu_timer_index(uint64_t which) { return which == ITIMER_VIRTUAL ? ZB_CPU_TIMER_VIRTUAL : ZB_CPU_TIMER_PROF; }

static int valid_timeval(const struct timeval *tv) {
    return tv->tv_sec >= 0 && tv->tv_sec <= MAX_TIMER_S && tv->tv_usec >= 0 && tv->tv_usec < 1000000;
}

static void set_timer(zb_sandbox *sb, int64_t value_ns, int64_t interval_ns) {
    sb->sig.alarm_ns = value_ns ? zb_now_ns() + value_ns : 0;
    sb->sig.alarm_interval_ns = value_ns ? interval_ns : 0;
    zb_run_timer_update(sb);
}

static long sys_getitimer(zb_sandbox *sb, const uint64_t a[6]) {
    struct itimerval cur = {{0, 0}, {0, 0}};
    if (a[0] == ITIMER_REAL) current_timer(sb, &cur);
    else if (a[0] == ITIMER_VIRTUAL || a[0] == ITIMER_PROF) current_cpu_timer(sb, cpu_timer_index(a[0]), &cur);
    else return -EINVAL;
    return zb_copy_to_guest(sb, a[1], &cur, sizeof cur) < 0 ? -EFAULT : 0;
}

static long sys_setitimer(zb_sandbox *sb, const uint64_t a[6]) {
    struct itimerval next = {{0, 0}, {0, 0}}, old = {{0, 0}, {0, 0}};
    if (a[1] && zb_copy_from_guest(sb, &next, a[1], sizeof next) < 0) return -EFAULT;
    if (!valid_timeval(&next.it_value) || !valid_timeval(&next.it_interval)) return -EINVAL;
    if (a[2] && !zb_guest_ptr(sb, a[2], sizeof old, 1)) return -EFAULT;
    if (a[0] == ITIMER_VIRTUAL || a[0] == ITIMER_PROF) {
        int i = cpu_timer_index(a[0]);
        int64_t value = timeval_ns(&next.it_value);
        current_cpu_timer(sb, i, &old);
        sb->sig.cpu_timer_ns[i] = value ? zb_cpu_timer_clock(sb, i) + value : 0;
        sb->sig.cpu_timer_interval_ns[i] = value ? timeval_ns(&next.it_interval) : 0;
        zb_run_timer_update(sb);
    } else if (a[0] == ITIMER_REAL) {
        current_timer(sb, &old);
        set_timer(sb, timeval_ns(&next.it_value), timeval_ns(&next.it_interval));
    } else {
        return -EINVAL;
    }
    if (a[2]) zb_copy_to_guest(sb, a[2], &old, sizeof old); /* validated above */
    return 0;
}

/* alarm(): the seconds left on the previous alarm, rounded to nearest but at least 1, as Linux does. */
static long sys_alarm(zb_sandbox *sb, const uint64_t a[6]) {
    struct itimerval old;
    current_timer(sb, &old);
    long left = (long)old.it_value.tv_sec + (old.it_value.tv_usec >= 500000);
    if (!left && (old.it_value.tv_sec || old.it_value.tv_usec)) left = 1;
    set_timer(sb, (int64_t)(unsigned int)a[0] * NS_PER_S, 0);
    return left;
}

void zb_sys_itimer_register(zb_syscall_fn *t) {
    t[SYS_alarm] = sys_alarm;
    t[SYS_setitimer] = sys_setitimer;
    t[SYS_getitimer] = sys_getitimer;
}
