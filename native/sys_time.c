/* sys_time.c - clocks and sleeping. Guest time is the host's time (never the snapshot's); the
 * hot clock calls normally never get here because the guest's vDSO answers them (guest/vdso.c). A guest
 * sleep blocks the engine interruptibly: a kick or the run deadline pauses it and the sleep goes on,
 * to its original wake time, when the sandbox resumes; the guest's own alarm (sys_itimer.c) ends it
 * with EINTR.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "process.h"
#include "sandbox_state.h"
#include "linux.h"

#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>

/* Dynamic CPU clocks (clock_getcpuclockid, pthread_getcpuclockid) encode a pid or tid as
 * (~id << 3) | per_thread << 2 | type, with type PROF, VIRT or SCHED: for the guest (pid and tid 1,
 * or 0 = self) they are its CPU clock. */
static int is_cpu_clock(uint64_t clk) {
    int c = (int)clk;
    if (c >= 0 || (c & 3) == 3) return 0;
    int id = ~(c >> 3);
    return id == 0 || id == 1;
}

static int valid_clock(uint64_t clk) {
    if (is_cpu_clock(clk)) return 1;
    switch (clk) {
    case CLOCK_REALTIME: case CLOCK_MONOTONIC: case CLOCK_PROCESS_CPUTIME_ID: case CLOCK_THREAD_CPUTIME_ID:
    case CLOCK_MONOTONIC_RAW: case CLOCK_REALTIME_COARSE: case CLOCK_MONOTONIC_COARSE: case CLOCK_BOOTTIME:
        return 1;
    }
    return 0;
}

/* The guest's CPU clocks count the time it spent running. */
static void guest_cpu_time(zb_sandbox *sb, struct timespec *ts) {
    uint64_t ns = zb_guest_cpu_ns(sb);
    ts->tv_sec = (time_t)(ns / 1000000000);
    ts->tv_nsec = (long)(ns % 1000000000);
}

static long sys_clock_gettime(zb_sandbox *sb, const uint64_t a[6]) {
    if (!valid_clock(a[0])) return -EINVAL;
    struct timespec ts;
    if (a[0] == CLOCK_PROCESS_CPUTIME_ID || a[0] == CLOCK_THREAD_CPUTIME_ID || is_cpu_clock(a[0])) guest_cpu_time(sb, &ts);
    else clock_gettime((clockid_t)a[0], &ts);
    return zb_copy_to_guest(sb, a[1], &ts, sizeof ts);
}

static long sys_clock_getres(zb_sandbox *sb, const uint64_t a[6]) {
    if (!valid_clock(a[0])) return -EINVAL;
    if (!a[1]) return 0;
    struct timespec ts = {0, a[0] == CLOCK_REALTIME_COARSE || a[0] == CLOCK_MONOTONIC_COARSE ? 4000000 : 1};
    return zb_copy_to_guest(sb, a[1], &ts, sizeof ts);
}

static long sys_gettimeofday(zb_sandbox *sb, const uint64_t a[6]) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    if (a[0] && zb_copy_to_guest(sb, a[0], &tv, sizeof tv) < 0) return -EFAULT;
    if (a[1]) {
        struct timezone tz = {0, 0};
        if (zb_copy_to_guest(sb, a[1], &tz, sizeof tz) < 0) return -EFAULT;
    }
    return 0;
}

static long sys_time(zb_sandbox *sb, const uint64_t a[6]) {
    time_t t = time(NULL);
    if (a[0] && zb_copy_to_guest(sb, a[0], &t, sizeof t) < 0) return -EFAULT;
    return (long)t;
}

static int read_timespec(zb_sandbox *sb, uint64_t addr, int64_t *ns) {
    struct timespec ts;
    if (zb_copy_from_guest(sb, &ts, addr, sizeof ts) < 0) return -EFAULT;
    if (ts.tv_sec < 0 || ts.tv_nsec < 0 || ts.tv_nsec >= 1000000000) return -EINVAL;
    *ns = ts.tv_sec > INT64_MAX / 1000000000 - 1 ? INT64_MAX / 2 : (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    return 0;
}

/* Sleep the guest until the monotonic time `wake` (the first time a syscall is served), or
 * until the wake time remembered when the same syscall was interrupted.
 * When the sleep is paused (kick or deadline), the time left goes to `rem` (if given) right away:
 * should a signal arrive before the sandbox resumes, the run loop fails the sleep with EINTR
 * without serving it again, and Linux reports the time left then. If the sleep resumes and
 * completes instead, rem holds a value the program must not look at anyway. */
static long sleep_syscall(zb_sandbox *sb, int64_t wake, uint64_t rem) {
    if (sb->cpu.pending_wake_ns) wake = sb->cpu.pending_wake_ns;
    long r = zb_sleep_until(sb, wake);
    if ((r == ZB_SYSCALL_STOP || r == ZB_SYSCALL_BLOCK || r == -EINTR) && rem) { /* -EINTR: the guest's alarm went off */
        int64_t left = ZB_MAX(wake - zb_now_ns(), 0);
        struct timespec ts = {(time_t)(left / 1000000000), (long)(left % 1000000000)};
        zb_copy_to_guest(sb, rem, &ts, sizeof ts); /* validated when the syscall started */
    }
    return r;
}

static long sys_nanosleep(zb_sandbox *sb, const uint64_t a[6]) {
    int64_t ns;
    int rc = read_timespec(sb, a[0], &ns);
    if (rc < 0) return rc;
    if (a[1] && !zb_guest_ptr(sb, a[1], sizeof(struct timespec), 1)) return -EFAULT;
    return sleep_syscall(sb, zb_now_ns() + ns, a[1]);
}

static long sys_clock_nanosleep(zb_sandbox *sb, const uint64_t a[6]) {
    if (!valid_clock(a[0]) || a[0] == CLOCK_THREAD_CPUTIME_ID || (is_cpu_clock(a[0]) && ((int)a[0] & 4))) return -EINVAL;
    int64_t ns;
    int rc = read_timespec(sb, a[2], &ns);
    if (rc < 0) return rc;
    int64_t now = zb_now_ns(), wake = now + ns;
    if (a[1] & TIMER_ABSTIME) {
        struct timespec cur;
        clock_gettime(a[0] == CLOCK_PROCESS_CPUTIME_ID ? CLOCK_MONOTONIC : (clockid_t)a[0], &cur);
        int64_t cur_ns = (int64_t)cur.tv_sec * 1000000000 + cur.tv_nsec;
        wake = now + (ns - cur_ns);
    }
    uint64_t rem = (a[1] & TIMER_ABSTIME) ? 0 : a[3]; /* an absolute sleep reports nothing */
    if (rem && !zb_guest_ptr(sb, rem, sizeof(struct timespec), 1)) return -EFAULT;
    return sleep_syscall(sb, wake, rem);
}


/* Setting the host's clocks needs CAP_SYS_TIME, which the guest does not have. */
static long sys_eperm(zb_sandbox *sb, const uint64_t a[6]) { (void)sb; (void)a; return -EPERM; }

void zb_sys_time_register(zb_syscall_fn *t) {
    t[SYS_clock_gettime] = sys_clock_gettime;
    t[SYS_clock_getres] = sys_clock_getres;
    t[SYS_gettimeofday] = sys_gettimeofday;
    t[SYS_time] = sys_time;
    t[SYS_nanosleep] = sys_nanosleep;
    t[SYS_clock_nanosleep] = sys_clock_nanosleep;
    t[SYS_clock_settime] = sys_eperm;
    t[SYS_settimeofday] = sys_eperm;
    t[SYS_adjtimex] = sys_eperm;
    t[SYS_clock_adjtime] = sys_eperm;
}
