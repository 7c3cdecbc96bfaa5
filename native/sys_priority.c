/* sys_priority.c - getpriority/setpriority (and so nice(3)): a nice value per process, kept in its
 * process state (zb_process.nice: copied by fork, captured by snapshots, saved in templates). It
 * has no effect on scheduling: the processes of a family take turns on one vCPU by their own
 * slices (family_run.c), whatever their nice values. Targets: PRIO_PROCESS a pid of the family (0:
 * the caller; a tid of the caller's threads names the caller: one value per process), PRIO_PGRP a
 * process group (0: the caller's), PRIO_USER the guest's one uid (0: the caller's), which names
 * every process. Lowering the value is allowed, as Linux allows it under the RLIMIT_NICE the guest
 * is told it has (unlimited, sys_process.c). A zombie has no process state left: it reads as 0 and
 * setting it does nothing.
 */
#include "util.h"
#include "process.h"
#include "sandbox_state.h"
#include "linux.h"

#include <sys/resource.h>
#include <sys/syscall.h>

#define NICE_MIN (-20)
#define NICE_MAX 19

/* 1 if the process with this pid, pgid (the member's, or the lone process's) is a target. */
static int matches(int which, int64_t who, int32_t pid, int32_t pgid, int32_t self_pid, int32_t self_pgid) {
    switch (which) {
    case PRIO_PROCESS: return pid == (who ? who : self_pid);
    case PRIO_PGRP: return pgid == (who ? who : self_pgid);
    default: return who == 0 || who == ZB_GUEST_UID; /* PRIO_USER: every process is the guest's uid */
    }
}

/* Calls fn(sb of the target or NULL for a zombie, ctx) for every target; the number of targets. */
static int each_target(zb_sandbox *sb, int which, int64_t who, void (*fn)(zb_sandbox *t, void *ctx), void *ctx) {
    int32_t self_pid = zb_proc_getpid(sb), ppid, self_pgid, sid;
    zb_proc_ids(sb, &ppid, &self_pgid, &sid);
    if (which == PRIO_PROCESS && who > 0 && who <= INT32_MAX && zb_threads_find(&sb->threads, (int32_t)who) >= 0)
        who = self_pid; /* one of the caller's threads: the process (nice is per process here) */
    if (!sb->fam) {
        if (!matches(which, who, self_pid, self_pgid, self_pid, self_pgid)) return 0;
        fn(sb, ctx);
        return 1;
    }
    int n = 0;
    for (int i = 0; i < sb->fam->count; i++) {
        zb_member *m = &sb->fam->m[i];
        if (!matches(which, who, m->pid, m->pgid, self_pid, self_pgid)) continue;
        fn(m->zombie ? NULL : m->sb, ctx);
        n++;
    }
    return n;
}

static void lowest_nice(zb_sandbox *t, void *ctx) {
    int *best = ctx, nice = t ? t->proc.nice : 0;
    if (nice < *best) *best = nice;
}

/* The raw syscall answers 20 - nice (1..40), so that no answer looks like an error; glibc's
 * getpriority() turns it back into the nice value. The highest priority of the targets. */
static long sys_getpriority(zb_sandbox *sb, const uint64_t a[6]) {
    int which = (int)a[0];
    int64_t who = (int32_t)a[1];
    if (which != PRIO_PROCESS && which != PRIO_PGRP && which != PRIO_USER) return -EINVAL;
    if (who < 0) return -ESRCH;
    int best = NICE_MAX + 1;
    if (!each_target(sb, which, who, lowest_nice, &best)) return -ESRCH;
    return 20 - best;
}

static void set_nice(zb_sandbox *t, void *ctx) {
    if (t) t->proc.nice = *(int *)ctx;
}

static long sys_setpriority(zb_sandbox *sb, const uint64_t a[6]) {
    int which = (int)a[0];
    int64_t who = (int32_t)a[1];
    int nice = (int)a[2];
    if (which != PRIO_PROCESS && which != PRIO_PGRP && which != PRIO_USER) return -EINVAL;
    if (who < 0) return -ESRCH;
    nice = ZB_MAX(NICE_MIN, ZB_MIN(NICE_MAX, nice)); /* Linux clamps */
    return each_target(sb, which, who, set_nice, &nice) ? 0 : -ESRCH;
}

void zb_sys_priority_register(zb_syscall_fn *t) {
    t[SYS_getpriority] = sys_getpriority;
    t[SYS_setpriority] = sys_setpriority;
}
