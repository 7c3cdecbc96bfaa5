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

/* An interval timer expiring at `at` (0: disarmed) on a clock that reads `now`, as getitimer reads
 * it: an armed one reads as >= 1 ns. The alarm is on CLOCK_MONOTONIC, the CPU timers on the
 * process's CPU clocks (zb_cpu_timer_clock). */
static struct itimerval timer_value(int64_t at, int64_t interval, int64_t now) {
    return (struct itimerval){.it_value = ns_timeval(at ? ZB_MAX(at - now, 1) : 0), .it_interval = ns_timeval(interval)};
}

/* Arm it `value` ns from `now` (0: disarm), with period `interval`. */
static void timer_arm(int64_t *at, int64_t *period, int64_t now, int64_t value, int64_t interval) {
    *at = value ? now + value : 0;
    *period = value ? interval : 0;
}

static void current_timer(const zb_sandbox *sb, struct itimerval *out) {
    *out = timer_value(sb->sig.alarm_ns, sb->sig.alarm_interval_ns, zb_now_ns());
}

/* ITIMER_VIRTUAL (i = ZB_CPU_TIMER_VIRTUAL) or ITIMER_PROF. */
static void current_cpu_timer(const zb_sandbox *sb, int i, struct itimerval *out) {
    *out = timer_value(sb->sig.cpu_timer_ns[i], sb->sig.cpu_timer_interval_ns[i], zb_cpu_timer_clock(sb, i));
}

static int cpu_timer_index(uint64_t which) { return which == ITIMER_VIRTUAL ? ZB_CPU_TIMER_VIRTUAL : ZB_CPU_TIMER_PROF; }

static int valid_timeval(const struct timeval *tv) {
    return tv->tv_sec >= 0 && tv->tv_sec <= MAX_TIMER_S && tv->tv_usec >= 0 && tv->tv_usec < 1000000;
}

static void set_timer(zb_sandbox *sb, int64_t value_ns, int64_t interval_ns) {
    timer_arm(&sb->sig.alarm_ns, &sb->sig.alarm_interval_ns, zb_now_ns(), value_ns, interval_ns);
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
        current_cpu_timer(sb, i, &old);
        timer_arm(&sb->sig.cpu_timer_ns[i], &sb->sig.cpu_timer_interval_ns[i], zb_cpu_timer_clock(sb, i),
                  timeval_ns(&next.it_value), timeval_ns(&next.it_interval));
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
