/* sys_procs.c - the process syscalls: fork, vfork, clone/clone3 without CLONE_THREAD, wait4,
 * waitid, getpid/getppid, process groups and sessions, kill across the processes of the family,
 * PR_SET_PDEATHSIG, and the process limit.
 *
 * A new process is a copy-on-write fork of the calling sandbox's live state, made at once by the
 * snapshot layer (zb_family_fork_sandbox, family_run.c) while the caller is inside its syscall,
 * so that errors are the syscall's. The family (proc_family.c) holds pids and links; waiting is a
 * blocking syscall like a sleep (zb_sleep_until): it yields to the family's other processes and is
 * served again, or sleeps until the deadline when nothing can change. Every pid, options word
 * and guest pointer is checked before anything happens; a pid outside the family is ESRCH, a
 * wait with no matching child ECHILD.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "process.h"
#include "sandbox_state.h"
#include "linux.h"

#include <linux/sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define GUEST_UID 1000
/* What a process clone may ask for. CLONE_VM is accepted only with CLONE_VFORK (vfork,
 * posix_spawn): the child gets a copy-on-write copy instead of the parent's memory, which code
 * that only execs or _exits cannot tell apart. */
#define PROC_FLAGS_OK (CLONE_VM | CLONE_VFORK | CLONE_SETTLS | CLONE_PARENT_SETTID | CLONE_CHILD_SETTID | \
                       CLONE_CHILD_CLEARTID | CLONE_DETACHED | CLONE_SYSVSEM | CLONE_FS | CLONE_IO)

static int32_t pid_of(const zb_sandbox *sb) { return sb->proc.pid ? sb->proc.pid : 1; }

/* The caller's member slot (the family exists). */
static zb_member *me(zb_sandbox *sb) {
    int i = zb_family_self(sb->fam, sb);
    return i >= 0 ? &sb->fam->m[i] : NULL;
}

/* vfork: the parent waits until the child exits or execs (served again until then). */
static long vfork_wait(zb_sandbox *sb) {
    int32_t pid = sb->cpu.vfork_child;
    int i = zb_family_find(sb->fam, pid);
    if (i >= 0 && !sb->fam->m[i].zombie && !sb->fam->m[i].vfork_done) {
        long r = zb_sleep_until(sb, INT64_MAX);
        if (r == ZB_SYSCALL_BLOCK || r == ZB_SYSCALL_STOP) return r;
    }
    sb->cpu.vfork_child = 0;
    return pid;
}

long zb_sys_new_process(zb_sandbox *sb, uint64_t flags, uint64_t stack, uint64_t parent_tid, uint64_t child_tid,
                        uint64_t tls, uint64_t exit_signal) {
    if (sb->cpu.vfork_child) {
        if (sb->cpu.pending_syscall) return vfork_wait(sb); /* served again: still waiting */
        sb->cpu.vfork_child = 0;
    }
    if (exit_signal > 64) return -EINVAL;
    if (flags & ~(uint64_t)PROC_FLAGS_OK) return -EINVAL;
    if ((flags & CLONE_VM) && !(flags & CLONE_VFORK)) {
        zb_log(sb, "clone(CLONE_VM) of a process (memory shared without vfork) is not supported");
        return -EINVAL;
    }
    if ((flags & CLONE_SETTLS) && tls >= ZB_USER_ADDR_LIMIT) return -EPERM;
    if (stack >= ZB_USER_ADDR_LIMIT) return -EINVAL;
    if ((flags & CLONE_PARENT_SETTID) && !zb_guest_ptr(sb, parent_tid, 4, 1)) return -EFAULT;
    if ((flags & (CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID)) && !zb_guest_ptr(sb, child_tid, 4, 1)) return -EFAULT;
    zb_family *fam = zb_family_ensure(sb);
    if (!fam) return -ENOMEM;
    zb_member *self = me(sb);
    if (!self) return -ESRCH;
    if (fam->count >= fam->max_procs) {
        zb_log(sb, "fork refused: the sandbox's limit of %d processes is reached", fam->max_procs);
        return -EAGAIN;
    }
    uint64_t nproc, nproc_max;
    zb_proc_limit(sb, RLIMIT_NPROC, &nproc, &nproc_max);
    if ((uint64_t)fam->count >= nproc) return -EAGAIN; /* the RLIMIT_NPROC it set, checked as Linux's fork does */
    if (fam->count == fam->cap) {
        if (zb_family_make_room(fam) < 0) return -ENOMEM;
        self = me(sb); /* the members moved */
    }
    /* the family's memory budget (memory.h): the child is charged with every page it could write,
     * so it must fit now (zb_family_fork_sandbox checks again, with the store its snapshot made).
     * That is the parent's allocated pages: freed memory the parent keeps for reuse (its stale
     * and dropped pages, charged to the parent) is not part of the child. If the child does not
     * fit, that kept memory is given back first: it is a cache, and a big array freed cells ago
     * must not make a later fork fail (a `Manager()` with three processes after a 610 MB array was
     * freed did). */
    zb_mem_budget_sync(&sb->mem);
    uint64_t limit = fam->mem.owner->pages_limit, want = sb->mem.pages_allocated;
    if (zb_mem_budget_total(&fam->mem) + want > limit) (void)zb_mem_release_kept(&sb->mem); /* syncs the charge */
    if (zb_mem_budget_total(&fam->mem) + want > limit) {
        fam->mem.refusals++;
        zb_log(sb, "fork refused (ENOMEM): the sandbox's memory limit of %llu MiB is for all its processes, "
                   "%llu MiB are in use and this process could write %llu MiB",
               (unsigned long long)(limit * ZB_PAGE >> 20),
               (unsigned long long)(zb_mem_budget_total(&fam->mem) * ZB_PAGE >> 20),
               (unsigned long long)(want * ZB_PAGE >> 20));
        return -ENOMEM;
    }
    int32_t pid = zb_family_new_id(fam);
    char err[ZB_ERRLEN];
    int64_t t_fork = zb_now_ns();
    zb_sandbox *child = zb_family_fork_sandbox(sb, pid, err);
    fam->fork_ns += (uint64_t)(zb_now_ns() - t_fork);
    if (!child) {
        zb_log(sb, "fork failed: %s", err);
        return -ENOMEM;
    }
    fam->m[fam->count++] = (zb_member){.pid = pid, .ppid = pid_of(sb), .pgid = self->pgid, .sid = self->sid,
                                        .sb = child, .exit_signal = (int)exit_signal};
    fam->forks++;
    /* the child returns 0 from this syscall, on its own stack and TLS if given */
    child->cpu.regs.rax = 0;
    if (stack) child->cpu.regs.rsp = stack;
    if (flags & CLONE_SETTLS) child->cpu.fs_base = tls;
    zb_thread *ct = &child->threads.t[child->threads.current];
    ct->clear_child_tid = (flags & CLONE_CHILD_CLEARTID) ? child_tid : 0;
    uint32_t v = (uint32_t)pid;
    if (flags & CLONE_CHILD_SETTID) zb_copy_to_guest(child, child_tid, &v, 4); /* validated in the parent: same layout */
    if (flags & CLONE_PARENT_SETTID) zb_copy_to_guest(sb, parent_tid, &v, 4);
    zb_run_timer_update(sb); /* another process can run now: the caller's time slice counts */
    if (flags & CLONE_VFORK) {
        sb->cpu.vfork_child = pid;
        long r = vfork_wait(sb);
        return r;
    }
    return pid;
}

static long sys_fork(zb_sandbox *sb, const uint64_t a[6]) { (void)a; return zb_sys_new_process(sb, 0, 0, 0, 0, 0, SIGCHLD); }
static long sys_vfork(zb_sandbox *sb, const uint64_t a[6]) {
    (void)a;
    return zb_sys_new_process(sb, CLONE_VM | CLONE_VFORK, 0, 0, 0, 0, SIGCHLD);
}

/* ---- waiting ---- */

/* Which children a wait is for: any, one pid, or one process group. */
enum { SEL_ANY, SEL_PID, SEL_PGID };

/* Does child m match the selector (and the __WCLONE/__WALL rule) for the caller? */
static int wait_matches(const zb_member *m, const zb_member *self, int sel, int32_t v, int options) {
    if (m->ppid != self->pid || m == self) return 0;
    if (!(options & __WALL) && ((m->exit_signal != SIGCHLD) ^ !!(options & __WCLONE))) return 0;
    return sel == SEL_ANY || (sel == SEL_PID ? m->pid == v : m->pgid == v);
}

/* 1 with *slot of an ended matching child, 0 if matching children all run, -ECHILD if none. */
static int find_ended(zb_sandbox *sb, int sel, int32_t v, int options, int *slot) {
    zb_family *fam = sb->fam;
    zb_member *self = fam ? me(sb) : NULL;
    if (!self) return -ECHILD;
    int any = 0;
    for (int i = 0; i < fam->count; i++) {
        zb_member *m = &fam->m[i];
        if (!wait_matches(m, self, sel, v, options)) continue;
        any = 1;
        if (m->zombie) { *slot = i; return 1; }
    }
    return any ? 0 : -ECHILD;
}

static int32_t own_pgid(zb_sandbox *sb) {
    zb_member *self = sb->fam ? me(sb) : NULL;
    return self ? self->pgid : 1;
}

static long wait_blocks(zb_sandbox *sb) {
    long r = zb_sleep_until(sb, INT64_MAX);
    return r == 0 ? -EINTR : r;
}

static struct timeval timeval_of(uint64_t ns) {
    struct timeval tv = {(time_t)(ns / 1000000000), (suseconds_t)(ns % 1000000000 / 1000)};
    return tv;
}

/* The reaped child m's rusage to the guest (ru_utime, ru_stime, ru_maxrss; the rest zero), and
 * counted in the caller's RUSAGE_CHILDREN if the wait reaps it. */
static void child_rusage(zb_sandbox *sb, const zb_member *m, uint64_t urusage, int reaps) {
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    ru.ru_utime = timeval_of(m->utime_ns);
    ru.ru_stime = timeval_of(m->stime_ns);
    ru.ru_maxrss = (long)ZB_MIN(m->maxrss_kib, (uint64_t)LONG_MAX);
    if (urusage) zb_copy_to_guest(sb, urusage, &ru, sizeof ru); /* validated by the caller */
    if (!reaps) return;
    sb->proc.children_utime_ns += m->utime_ns;
    sb->proc.children_stime_ns += m->stime_ns;
    sb->proc.children_maxrss_kib = ZB_MAX(sb->proc.children_maxrss_kib, m->maxrss_kib);
}

static long sys_wait4(zb_sandbox *sb, const uint64_t a[6]) {
    int64_t pid = (int32_t)a[0];
    uint64_t ustatus = a[1], urusage = a[3];
    if (a[2] >> 32) return -EINVAL;
    int options = (int)a[2];
    if (options & ~(WNOHANG | WUNTRACED | WCONTINUED | __WNOTHREAD | __WCLONE | __WALL)) return -EINVAL;
    if (pid == INT32_MIN) return -ESRCH;
    if (ustatus && !zb_guest_ptr(sb, ustatus, 4, 1)) return -EFAULT;
    if (urusage && !zb_guest_ptr(sb, urusage, sizeof(struct rusage), 1)) return -EFAULT;
    int sel = pid > 0 ? SEL_PID : pid == -1 ? SEL_ANY : SEL_PGID;
    int32_t v = pid > 0 ? (int32_t)pid : pid == 0 ? own_pgid(sb) : (int32_t)-pid;
    int slot = -1, r = find_ended(sb, sel, v, options, &slot);
    if (r < 0) return r;
    if (!r) return (options & WNOHANG) ? 0 : wait_blocks(sb);
    zb_member *m = &sb->fam->m[slot];
    int32_t cpid = m->pid, st = m->wstatus;
    if (ustatus) zb_copy_to_guest(sb, ustatus, &st, 4);
    child_rusage(sb, m, urusage, 1);
    zb_family_remove(sb->fam, slot);
    return cpid;
}

enum { P_ALL_ = 0, P_PID_ = 1, P_PGID_ = 2 };

static long sys_waitid(zb_sandbox *sb, const uint64_t a[6]) {
    uint64_t idtype = a[0], uinfo = a[2], urusage = a[4];
    int64_t id = (int64_t)a[1];
    if (a[3] >> 32) return -EINVAL;
    int options = (int)a[3];
    if (options & ~(WNOHANG | WEXITED | WSTOPPED | WCONTINUED | WNOWAIT | __WNOTHREAD | __WCLONE | __WALL)) return -EINVAL;
    if (!(options & (WEXITED | WSTOPPED | WCONTINUED))) return -EINVAL;
    int sel;
    int32_t v = 0;
    switch (idtype) {
    case P_ALL_: sel = SEL_ANY; break;
    case P_PID_: if (id <= 0 || id > INT32_MAX) return -EINVAL; sel = SEL_PID; v = (int32_t)id; break;
    case P_PGID_: if (id < 0 || id > INT32_MAX) return -EINVAL; sel = SEL_PGID; v = id ? (int32_t)id : own_pgid(sb); break;
    default: return -EINVAL; /* P_PIDFD: there are no pidfds */
    }
    if (uinfo && !zb_guest_ptr(sb, uinfo, 128, 1)) return -EFAULT;
    if (urusage && !zb_guest_ptr(sb, urusage, sizeof(struct rusage), 1)) return -EFAULT;
    int slot = -1, r = find_ended(sb, sel, v, options, &slot);
    if (r < 0) return r;
    if (!(options & WEXITED)) r = 0; /* stopped and continued children are never reported: none stops */
    uint8_t info[128];
    memset(info, 0, sizeof info);
    if (!r) {
        if (!(options & WNOHANG)) return wait_blocks(sb);
        if (uinfo) zb_copy_to_guest(sb, uinfo, info, sizeof info); /* si_pid 0: nothing yet */
        return 0;
    }
    zb_member *m = &sb->fam->m[slot];
    int32_t signo = SIGCHLD, code, status, cpid = m->pid;
    uint32_t uid = GUEST_UID;
    if (WIFEXITED(m->wstatus)) { code = 1 /* CLD_EXITED */; status = WEXITSTATUS(m->wstatus); }
    else { code = WCOREDUMP(m->wstatus) ? 3 /* CLD_DUMPED */ : 2 /* CLD_KILLED */; status = WTERMSIG(m->wstatus); }
    memcpy(info + 0, &signo, 4); /* siginfo_t: si_signo, si_errno, si_code, then si_pid, si_uid, si_status */
    memcpy(info + 8, &code, 4);
    memcpy(info + 16, &cpid, 4);
    memcpy(info + 20, &uid, 4);
    memcpy(info + 24, &status, 4);
    if (uinfo) zb_copy_to_guest(sb, uinfo, info, sizeof info);
    child_rusage(sb, m, urusage, !(options & WNOWAIT));
    if (!(options & WNOWAIT)) zb_family_remove(sb->fam, slot);
    return 0;
}

/* ---- identity, groups and sessions ---- */

static long sys_getpid(zb_sandbox *sb, const uint64_t a[6]) { (void)a; return pid_of(sb); }
int32_t zb_proc_getpid(const zb_sandbox *sb) { return pid_of(sb); }
void zb_proc_ids(zb_sandbox *sb, int32_t *ppid, int32_t *pgid, int32_t *sid) {
    zb_member *self = sb->fam ? me(sb) : NULL;
    *ppid = self ? self->ppid : 0;
    *pgid = self ? self->pgid : pid_of(sb);
    *sid = self ? self->sid : pid_of(sb);
}
static long sys_getppid(zb_sandbox *sb, const uint64_t a[6]) {
    (void)a;
    zb_member *self = sb->fam ? me(sb) : NULL;
    return self ? self->ppid : 0;
}

/* The member a pid argument names (0: the caller), or NULL. Process 1 without a family is itself. */
static zb_member *target_of(zb_sandbox *sb, int64_t pid) {
    if (pid < 0 || pid > INT32_MAX) return NULL;
    if (!sb->fam && !zb_family_ensure(sb)) return NULL;
    if (pid == 0) return me(sb);
    int i = zb_family_find(sb->fam, (int32_t)pid);
    return i >= 0 ? &sb->fam->m[i] : NULL;
}

static long sys_getpgid(zb_sandbox *sb, const uint64_t a[6]) {
    if ((int64_t)(int32_t)a[0] < 0) return -ESRCH;
    zb_member *t = target_of(sb, (int32_t)a[0]);
    return t ? t->pgid : -ESRCH;
}
static long sys_getpgrp(zb_sandbox *sb, const uint64_t a[6]) {
    (void)a;
    zb_member *t = target_of(sb, 0);
    return t ? t->pgid : 1;
}
static long sys_getsid(zb_sandbox *sb, const uint64_t a[6]) {
    if ((int64_t)(int32_t)a[0] < 0) return -ESRCH;
    zb_member *t = target_of(sb, (int32_t)a[0]);
    return t ? t->sid : -ESRCH;
}

static long sys_setpgid(zb_sandbox *sb, const uint64_t a[6]) {
    int64_t pid = (int32_t)a[0], pgid = (int32_t)a[1];
    if (pgid < 0) return -EINVAL;
    if (pid < 0) return -ESRCH;
    zb_member *t = target_of(sb, pid);
    if (!t) return -ESRCH;
    zb_member *self = me(sb);
    if (!self) return -ESRCH;
    if (t != self && t->ppid != self->pid) return -ESRCH;
    if (t->sid != self->sid) return -EPERM;
    if (t->pid == t->sid) return -EPERM; /* a session leader keeps its group */
    int32_t want = pgid ? (int32_t)pgid : t->pid;
    /* joining a group: it must exist in the caller's session */
    if (want != t->pid && !zb_family_group_in_session(sb->fam, want, self->sid)) return -EPERM;
    t->pgid = want;
    return 0;
}

static long sys_setsid(zb_sandbox *sb, const uint64_t a[6]) {
    (void)a;
    zb_member *self = target_of(sb, 0);
    if (!self) return -EPERM;
    for (int i = 0; i < sb->fam->count; i++) /* a group leader, or its pid names a group: EPERM */
        if (sb->fam->m[i].pgid == self->pid) return -EPERM;
    self->sid = self->pgid = self->pid;
    return self->pid;
}

/* ---- signals to processes ---- */

static void deliver(zb_sandbox *sb, int i, int sig) {
    if (sb->fam->m[i].sb == sb) sb->sig.pending |= ZB_SIG_BIT(sig);
    else zb_family_signal(sb->fam, i, sig);
}

static long sys_kill(zb_sandbox *sb, const uint64_t a[6]) {
    int64_t pid = (int32_t)a[0];
    if (a[1] > 64) return -EINVAL;
    int sig = (int)a[1];
    if (!sb->fam) { /* no other process: only the guest itself can be named */
        if (pid != 0 && pid != 1 && pid != -1) return -ESRCH;
        if (sig) sb->sig.pending |= ZB_SIG_BIT(sig);
        return 0;
    }
    if (pid == INT32_MIN) return -ESRCH;
    zb_member *self = me(sb);
    if (!self) return -ESRCH;
    int32_t self_pid = self->pid, self_pgid = self->pgid;
    int hits = 0;
    for (int i = 0; i < sb->fam->count; i++) {
        zb_member *m = &sb->fam->m[i];
        int match = pid > 0 ? m->pid == pid
                  : pid == 0 ? m->pgid == self_pgid
                  : pid == -1 ? (m->pid != 1 && m->pid != self_pid) || (self_pid == 1 && sb->fam->count == 1)
                  : m->pgid == -pid;
        if (!match) continue;
        hits++;
        if (sig && !m->zombie) deliver(sb, i, sig);
    }
    return hits ? 0 : -ESRCH;
}

long zb_sys_signal_process_thread(zb_sandbox *sb, int64_t tgid, int64_t tid, int sig) {
    zb_family *fam = sb->fam;
    if (!fam || tid <= 0 || tid > INT32_MAX) return -ESRCH;
    for (int i = 0; i < fam->count; i++) {
        zb_member *m = &fam->m[i];
        if (!m->sb || m->sb == sb || m->zombie) continue;
        if (tgid > 0 && m->pid != tgid) continue;
        if (zb_threads_find(&m->sb->threads, (int32_t)tid) < 0) continue;
        if (sig) zb_family_signal(fam, i, sig); /* process-directed: its threads take it as the main thread's */
        return 0;
    }
    return -ESRCH;
}

/* ---- prctl: the parent-death signal; the rest is sys_process.c's ---- */

static zb_syscall_fn prctl_rest;

static long sys_prctl(zb_sandbox *sb, const uint64_t a[6]) {
    if (a[0] == PR_SET_PDEATHSIG) {
        if (a[1] > 64) return -EINVAL;
        zb_member *self = target_of(sb, 0);
        if (self) self->pdeathsig = (int)a[1];
        return 0;
    }
    if (a[0] == PR_GET_PDEATHSIG) {
        zb_member *self = sb->fam ? me(sb) : NULL;
        int32_t v = self ? self->pdeathsig : 0;
        return zb_copy_to_guest(sb, a[1], &v, 4);
    }
    return prctl_rest ? prctl_rest(sb, a) : -EINVAL;
}

void zb_sys_procs_register(zb_syscall_fn *t) {
    prctl_rest = t[SYS_prctl];
    t[SYS_prctl] = sys_prctl;
    t[SYS_fork] = sys_fork;
    t[SYS_vfork] = sys_vfork;
    t[SYS_wait4] = sys_wait4;
    t[SYS_waitid] = sys_waitid;
    t[SYS_getpid] = sys_getpid;
    t[SYS_getppid] = sys_getppid;
    t[SYS_getpgrp] = sys_getpgrp;
    t[SYS_getpgid] = sys_getpgid;
    t[SYS_getsid] = sys_getsid;
    t[SYS_setsid] = sys_setsid;
    t[SYS_setpgid] = sys_setpgid;
    t[SYS_kill] = sys_kill;
}
