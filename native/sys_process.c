/* sys_process.c - the guest's process: identity, limits, exit_group, TLS, scheduling, entropy.
 *
 * Identity is fixed and documented (docs/ARCHITECTURE.md): uid/gid 1000 ("sandbox"), hostname
 * "zeroboot", one CPU. Threads are sys_threads.c's; processes, pids, groups and waiting are
 * sys_procs.c's.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "linux.h"
#include "serial.h"

#include <asm/prctl.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/times.h>
#include <sys/utsname.h>

static int own_pid(const zb_sandbox *sb) { return sb->proc.pid ? sb->proc.pid : 1; }

static long sys_getuid(zb_sandbox *sb, const uint64_t a[6]) { (void)sb; (void)a; return ZB_GUEST_UID; }
static long sys_eperm(zb_sandbox *sb, const uint64_t a[6]) { (void)sb; (void)a; return -EPERM; }
static long sys_zero(zb_sandbox *sb, const uint64_t a[6]) { (void)sb; (void)a; return 0; }
static long sys_enosys(zb_sandbox *sb, const uint64_t a[6]) { (void)sb; (void)a; return -ENOSYS; }

/* set*id: becoming who the guest already is (or -1, "unchanged") succeeds, as for any process;
 * any other id needs CAP_SETUID/CAP_SETGID (EPERM). */
static long set_ids(const uint64_t a[6], int n) {
    for (int i = 0; i < n; i++)
        if ((uint32_t)a[i] != ZB_GUEST_UID && (uint32_t)a[i] != (uint32_t)-1) return -EPERM;
    return 0;
}
static long sys_setid(zb_sandbox *sb, const uint64_t a[6]) { (void)sb; return (uint32_t)a[0] == (uint32_t)-1 ? -EINVAL : set_ids(a, 1); }
static long sys_setreid(zb_sandbox *sb, const uint64_t a[6]) { (void)sb; return set_ids(a, 2); }
static long sys_setresid(zb_sandbox *sb, const uint64_t a[6]) { (void)sb; return set_ids(a, 3); }

static long sys_getresuid(zb_sandbox *sb, const uint64_t a[6]) {
    unsigned id = ZB_GUEST_UID;
    for (int i = 0; i < 3; i++)
        if (zb_copy_to_guest(sb, a[i], &id, sizeof id) < 0) return -EFAULT;
    return 0;
}

static long sys_getgroups(zb_sandbox *sb, const uint64_t a[6]) {
    if ((int)a[0] < 0) return -EINVAL;
    if (a[0] == 0) return 1;
    unsigned g = ZB_GUEST_UID;
    return zb_copy_to_guest(sb, a[1], &g, sizeof g) < 0 ? -EFAULT : 1;
}

static long sys_uname(zb_sandbox *sb, const uint64_t a[6]) {
    struct utsname host, u;
    memset(&u, 0, sizeof u);
    uname(&host);
    snprintf(u.sysname, sizeof u.sysname, "Linux");
    snprintf(u.nodename, sizeof u.nodename, "zeroboot");
    snprintf(u.release, sizeof u.release, "%s", host.release);
    snprintf(u.version, sizeof u.version, "#1 SMP zeroboot sandbox");
    snprintf(u.machine, sizeof u.machine, "x86_64");
    snprintf(u.domainname, sizeof u.domainname, "(none)");
    return zb_copy_to_guest(sb, a[0], &u, sizeof u);
}

static long sys_sysinfo(zb_sandbox *sb, const uint64_t a[6]) {
    struct sysinfo si;
    memset(&si, 0, sizeof si);
    si.uptime = (long)(zb_guest_uptime_ns() / 1000000000); /* /proc/uptime's (fs_proc.c) */
    si.totalram = sb->mem.pages_limit * ZB_PAGE;
    si.freeram = (sb->mem.pages_limit - ZB_MIN(sb->mem.pages_allocated, sb->mem.pages_limit)) * ZB_PAGE;
    si.procs = 1;
    si.mem_unit = 1;
    return zb_copy_to_guest(sb, a[0], &si, sizeof si);
}

/* The limits a process starts with: what the sandbox enforces (its fd table, its process limit;
 * 64 KiB of locked memory), its memory as the soft address-space and data limits, an 8 MiB stack
 * and no core dumps (soft 0), those four with no hard limit, as a Linux login gives (a raised core
 * limit changes nothing: a crash in the sandbox never writes a core file). The memory budget
 * stays what it is whatever a process sets (as RAM does): a limit set lower is enforced, one set
 * higher is allowed (the deep-recursion idiom raises the stack's), but the main thread's stack stays
 * the 8 MiB it was mapped with: threads get their own (threading.stack_size), and C recursion past
 * it is a crash of the cell, never of the host. */
static void default_limit(const zb_sandbox *sb, unsigned res, uint64_t *cur, uint64_t *max) {
    uint64_t soft = RLIM_INFINITY, hard = RLIM_INFINITY;
    switch (res) {
    case RLIMIT_NOFILE: soft = hard = ZB_MAX_FDS; break;
    case RLIMIT_STACK: soft = ZB_STACK_SIZE; break;
    case RLIMIT_AS: case RLIMIT_DATA: soft = sb->mem.pages_limit * ZB_PAGE; break;
    case RLIMIT_NPROC:
        soft = hard = (uint64_t)(sb->fam ? sb->fam->max_procs : sb->max_procs ? sb->max_procs : ZB_PROCS_DEFAULT);
        break;
    case RLIMIT_CORE: soft = 0; break;
    case RLIMIT_MEMLOCK: soft = hard = 64 << 10; break;
    }
    *cur = soft;
    *max = hard;
}

void zb_proc_limit(const zb_sandbox *sb, unsigned res, uint64_t *cur, uint64_t *max) {
    if (res < ZB_RLIMITS && (sb->proc.rlim_set & (1u << res))) {
        *cur = sb->proc.rlim_cur[res];
        *max = sb->proc.rlim_max[res];
        return;
    }
    default_limit(sb, res, cur, max);
}

int zb_proc_may_map(const zb_sandbox *sb, uint64_t npages) {
    uint64_t as, data, max;
    zb_proc_limit(sb, RLIMIT_AS, &as, &max);
    zb_proc_limit(sb, RLIMIT_DATA, &data, &max);
    uint64_t limit = ZB_MIN(as, data) / ZB_PAGE;
    return sb->mem.pages_allocated + npages <= limit && npages <= limit;
}

static long sys_prlimit64(zb_sandbox *sb, const uint64_t a[6]) {
    _Static_assert(RLIM_NLIMITS == ZB_RLIMITS, "one slot per Linux resource");
    if (a[0] != 0 && a[0] != (uint64_t)own_pid(sb)) return -ESRCH;
    if (a[1] >= RLIM_NLIMITS) return -EINVAL;
    unsigned res = (unsigned)a[1];
    uint64_t cur, max;
    zb_proc_limit(sb, res, &cur, &max);
    struct rlimit want;
    if (a[2] && zb_copy_from_guest(sb, &want, a[2], sizeof want) < 0) return -EFAULT;
    if (a[3]) {
        struct rlimit old = {cur, max};
        if (zb_copy_to_guest(sb, a[3], &old, sizeof old) < 0) return -EFAULT;
    }
    if (a[2]) {
        if (want.rlim_cur > want.rlim_max) return -EINVAL;
        if (want.rlim_max > max) return -EPERM; /* the guest has no privilege to raise a hard limit */
        if (res == RLIMIT_NOFILE && want.rlim_max > ZB_MAX_FDS) return -EPERM; /* Linux's nr_open */
        sb->proc.rlim_cur[res] = want.rlim_cur;
        sb->proc.rlim_max[res] = want.rlim_max;
        sb->proc.rlim_set |= 1u << res;
    }
    return 0;
}
static long sys_getrlimit(zb_sandbox *sb, const uint64_t a[6]) {
    const uint64_t b[6] = {0, a[0], 0, a[1], 0, 0};
    return sys_prlimit64(sb, b);
}
static long sys_setrlimit(zb_sandbox *sb, const uint64_t a[6]) {
    const uint64_t b[6] = {0, a[0], a[1], 0, 0, 0};
    return sys_prlimit64(sb, b);
}

static struct timeval ns_to_timeval(uint64_t ns) {
    struct timeval tv = {(time_t)(ns / 1000000000), (suseconds_t)(ns % 1000000000 / 1000)};
    return tv;
}

static long sys_getrusage(zb_sandbox *sb, const uint64_t a[6]) {
    int who = (int)a[0];
    if (who != RUSAGE_SELF && who != RUSAGE_THREAD && who != RUSAGE_CHILDREN) return -EINVAL;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    if (who != RUSAGE_CHILDREN) {
        uint64_t user, sys;
        zb_guest_cpu_split(sb, &user, &sys);
        ru.ru_utime = ns_to_timeval(user);
        ru.ru_stime = ns_to_timeval(sys);
        /* resident = the pages the guest holds (all present: no demand paging, no swap); each was
         * faulted in once, which is what a kernel would count as a minor fault */
        ru.ru_maxrss = (long)(sb->mem.pages_allocated * 4);
        ru.ru_minflt = (long)sb->mem.pages_allocated;
    } else { /* the children it waited for (sys_procs.c), with what they waited for */
        ru.ru_utime = ns_to_timeval(sb->proc.children_utime_ns);
        ru.ru_stime = ns_to_timeval(sb->proc.children_stime_ns);
        ru.ru_maxrss = (long)ZB_MIN(sb->proc.children_maxrss_kib, (uint64_t)LONG_MAX);
    }
    return zb_copy_to_guest(sb, a[1], &ru, sizeof ru);
}

static long sys_times(zb_sandbox *sb, const uint64_t a[6]) {
    const uint64_t tick_ns = 10000000; /* USER_HZ = 100 */
    if (a[0]) {
        uint64_t user, sys;
        zb_guest_cpu_split(sb, &user, &sys);
        struct tms t = {(clock_t)(user / tick_ns), (clock_t)(sys / tick_ns),
                        (clock_t)(sb->proc.children_utime_ns / tick_ns), (clock_t)(sb->proc.children_stime_ns / tick_ns)};
        if (zb_copy_to_guest(sb, a[0], &t, sizeof t) < 0) return -EFAULT;
    }
    /* elapsed real time from an arbitrary point: the host's monotonic clock */
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long)((uint64_t)now.tv_sec * 100 + (uint64_t)now.tv_nsec / tick_ns);
}

static long sys_exit_group(zb_sandbox *sb, const uint64_t a[6]) {
    sb->proc.exit_status = (int)(a[0] & 0xff);
    sb->finished = 1;
    zb_event *ev = zb_stop_event(sb, ZB_EVENT_EXIT, 1);
    ev->status = sb->proc.exit_status;
    return ZB_SYSCALL_STOP;
}

/* FS/GS bases at or above ZB_USER_ADDR_LIMIT are refused (linux.h says why). */
static long sys_arch_prctl(zb_sandbox *sb, const uint64_t a[6]) {
    switch (a[0]) {
    case ARCH_SET_FS: if (a[1] >= ZB_USER_ADDR_LIMIT) return -EPERM; sb->cpu.fs_base = a[1]; return 0;
    case ARCH_SET_GS: if (a[1] >= ZB_USER_ADDR_LIMIT) return -EPERM; sb->cpu.gs_base = a[1]; return 0;
    case ARCH_GET_FS: return zb_copy_to_guest(sb, a[1], &sb->cpu.fs_base, 8);
    case ARCH_GET_GS: return zb_copy_to_guest(sb, a[1], &sb->cpu.gs_base, 8);
    default: return -EINVAL; /* CET, AMX permission requests, ... */
    }
}

/* The pid argument of the sched_* calls: 0 or the calling process itself (another process of
 * the family is ESRCH: these answer for the caller only). */
static long sched_pid(const zb_sandbox *sb, uint64_t pid) {
    if ((int)pid < 0) return -EINVAL;
    return (int)pid == 0 || (int)pid == own_pid(sb) ? 0 : -ESRCH;
}

static long sys_sched_getaffinity(zb_sandbox *sb, const uint64_t a[6]) {
    if (sched_pid(sb, a[0]) < 0) return sched_pid(sb, a[0]);
    if (a[1] < 8 || (a[1] & 7)) return -EINVAL;
    uint64_t mask = 1; /* one CPU: OpenBLAS & co stay single-threaded */
    if (zb_copy_to_guest(sb, a[2], &mask, 8) < 0) return -EFAULT;
    return 8;
}

static long sys_getcpu(zb_sandbox *sb, const uint64_t a[6]) {
    unsigned zero = 0;
    if (a[0] && zb_copy_to_guest(sb, a[0], &zero, sizeof zero) < 0) return -EFAULT;
    if (a[1] && zb_copy_to_guest(sb, a[1], &zero, sizeof zero) < 0) return -EFAULT;
    return 0;
}

static long sys_sched_pid_only(zb_sandbox *sb, const uint64_t a[6]) { return sched_pid(sb, a[0]); }

static long sys_sched_getparam(zb_sandbox *sb, const uint64_t a[6]) {
    if (sched_pid(sb, a[0]) < 0) return sched_pid(sb, a[0]);
    int prio = 0;
    return zb_copy_to_guest(sb, a[1], &prio, sizeof prio);
}

static long sys_getrandom(zb_sandbox *sb, const uint64_t a[6]) {
    if (a[2] & ~(uint64_t)(GRND_NONBLOCK | GRND_RANDOM | GRND_INSECURE)) return -EINVAL;
    size_t n = ZB_MIN(a[1], 1u << 25);
    uint8_t *p = zb_guest_ptr(sb, a[0], n, 1);
    if (!p) return -EFAULT;
    size_t done = 0;
    while (done < n) { /* always fresh host entropy: forks never share it */
        ssize_t k = getrandom(p + done, n - done, 0);
        if (k < 0) { if (errno == EINTR) continue; return done ? (long)done : -errno; }
        done += k;
    }
    return (long)n;
}

static long sys_prctl(zb_sandbox *sb, const uint64_t a[6]) {
    switch (a[0]) {
    case PR_SET_NAME: { /* at most 15 bytes are kept, as Linux keeps them */
        char name[16];
        for (size_t i = 0; i < sizeof name; i++) {
            if (zb_copy_from_guest(sb, &name[i], a[1] + i, 1) < 0) return -EFAULT;
            if (!name[i]) break;
        }
        name[15] = 0;
        memcpy(sb->proc.comm, name, sizeof name);
        return 0;
    }
    case PR_SET_PDEATHSIG: case PR_SET_DUMPABLE: case PR_SET_NO_NEW_PRIVS: return 0;
    case PR_GET_NAME: return zb_copy_to_guest(sb, a[1], sb->proc.comm, sizeof sb->proc.comm);
    case PR_GET_DUMPABLE: return 0;
    default: return -EINVAL;
    }
}

/* ---- the process state's copy and on-disk form ---- */

void zb_process_clone(zb_process *dst, const zb_process *src) { *dst = *src; /* plain data */ }

/* Not saved: exit_status (a saved sandbox has not exited), the guest's CPU time (cpu_ns, sys_ns and
 * its waited-for children's, children_*: a loaded template starts its guest CPU clocks at zero) and the vDSO clock bases and floors (host
 * CLOCK_MONOTONIC values, meaningless in another boot; the next run publishes new ones). */
void zb_process_save(const zb_process *p, struct zb_out *o) {
    out_str(o, p->exe);
    out_str(o, p->comm);
    out_str(o, p->cwd);
    out_u64(o, p->tid_address);
    out_u64(o, p->arg_start);
    out_u64(o, p->arg_end);
    out_u32(o, p->umask);
    out_u32(o, (uint32_t)p->nice);
    out_u32(o, p->rlim_set);
    for (int r = 0; r < ZB_RLIMITS; r++) {
        if (!(p->rlim_set & (1u << r))) continue;
        out_u64(o, p->rlim_cur[r]);
        out_u64(o, p->rlim_max[r]);
    }
}

int zb_process_load(zb_process *p, struct zb_in *in, char *err) {
    memset(p, 0, sizeof *p);
    in_str_into(in, p->exe, sizeof p->exe);
    in_str_into(in, p->comm, sizeof p->comm);
    in_str_into(in, p->cwd, sizeof p->cwd);
    p->tid_address = in_u64(in);
    p->arg_start = in_u64(in);
    p->arg_end = in_u64(in);
    uint32_t umask = in_u32(in);
    int32_t nice = (int32_t)in_u32(in);
    p->rlim_set = in_u32(in);
    int limits_ok = p->rlim_set < (1u << ZB_RLIMITS);
    for (int r = 0; limits_ok && r < ZB_RLIMITS; r++) {
        if (!(p->rlim_set & (1u << r))) continue;
        p->rlim_cur[r] = in_u64(in);
        p->rlim_max[r] = in_u64(in);
        limits_ok = p->rlim_cur[r] <= p->rlim_max[r] && (r != RLIMIT_NOFILE || p->rlim_max[r] <= ZB_MAX_FDS);
    }
    if (in->err || !limits_ok || umask > 0777 || nice < -20 || nice > 19 || p->arg_end < p->arg_start ||
        p->arg_end - p->arg_start > ZB_STACK_SIZE) {
        memset(p, 0, sizeof *p);
        zb_seterr(err, "process state: truncated or corrupt");
        return -1;
    }
    p->umask = umask;
    p->nice = nice;
    return 0;
}

void zb_sys_process_register(zb_syscall_fn *t) {
    t[SYS_getuid] = sys_getuid;
    t[SYS_geteuid] = sys_getuid;
    t[SYS_getgid] = sys_getuid;
    t[SYS_getegid] = sys_getuid;
    t[SYS_getresuid] = sys_getresuid;
    t[SYS_getresgid] = sys_getresuid;
    t[SYS_getgroups] = sys_getgroups;
    t[SYS_setuid] = sys_setid;
    t[SYS_setgid] = sys_setid;
    t[SYS_setreuid] = sys_setreid;
    t[SYS_setregid] = sys_setreid;
    t[SYS_setresuid] = sys_setresid;
    t[SYS_setresgid] = sys_setresid;
    t[SYS_setgroups] = sys_eperm;
    t[SYS_uname] = sys_uname;
    t[SYS_sysinfo] = sys_sysinfo;
    t[SYS_prlimit64] = sys_prlimit64;
    t[SYS_getrlimit] = sys_getrlimit;
    t[SYS_setrlimit] = sys_setrlimit;
    t[SYS_getrusage] = sys_getrusage;
    t[SYS_times] = sys_times;
    t[SYS_exit_group] = sys_exit_group;
    t[SYS_arch_prctl] = sys_arch_prctl;
    t[SYS_rseq] = sys_enosys;
    t[SYS_sched_getaffinity] = sys_sched_getaffinity;
    t[SYS_sched_setaffinity] = sys_sched_pid_only; /* accepted, but one CPU it stays */
    t[SYS_sched_getscheduler] = sys_sched_pid_only; /* 0: SCHED_OTHER */
    t[SYS_sched_getparam] = sys_sched_getparam;
    t[SYS_getcpu] = sys_getcpu;
    t[SYS_getrandom] = sys_getrandom;
    t[SYS_prctl] = sys_prctl;
    t[SYS_personality] = sys_zero;
}
