/* proc_family.c - a sandbox's process family: pids, parent links, zombies, process groups and
 * sessions, and the questions the schedulers ask about the other processes (process.h).
 *
 * A guest fork() is a sandbox fork (family_run.c), so every process of the guest is its own
 * zb_sandbox: memory, vCPU, threads, fds, signals. The family ties them together as Linux's pid
 * namespace does: process 1 is the sandbox the host made (the agent, or a test program); pids
 * and the tids of threads made once the family exists come from one counter, never reused. A
 * process that ends keeps a slot (a zombie: its wait status) until its parent waits for it, or
 * is removed at once when nobody will (its parent ignores SIGCHLD or set SA_NOCLDWAIT; an orphan,
 * whose parent ended, since process 1 may never wait). Everything here is engine data; no value
 * in it comes from the guest unchecked (pids are looked up, never used as indices).
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "process.h"
#include "sandbox_state.h"
#include "serial.h"

#include <signal.h>
#include <sys/wait.h>

zb_family *zb_family_ensure(zb_sandbox *sb) {
    if (sb->fam) return sb->fam;
    zb_family *fam = calloc(1, sizeof *fam);
    if (!fam || !(fam->m = calloc(8, sizeof *fam->m))) { free(fam); return NULL; }
    fam->cap = 8;
    fam->count = 1;
    fam->max_procs = sb->max_procs ? sb->max_procs : ZB_PROCS_DEFAULT;
    fam->yielded = -1;
    /* above every tid process 1 has given out: pids and tids share the namespace */
    fam->next_pid = ZB_MAX(sb->threads.next_tid, 2);
    fam->m[0] = (zb_member){.pid = 1, .ppid = 0, .pgid = 1, .sid = 1, .sb = sb};
    atomic_init(&fam->kick, 0);
    atomic_init(&fam->running, 0);
    fam->shared_latest = sb; /* its copies of shared mappings are the latest (shared_map.h) */
    sb->proc.pid = 1;
    sb->fam = fam;
    zb_mem_budget_own(&sb->mem, &fam->mem); /* process 1's limit is the family's */
    return fam;
}

int32_t zb_family_new_id(zb_family *fam) {
    if (fam->next_pid >= INT32_MAX / 2) fam->next_pid = 2; /* never in practice: ~10^9 forks */
    for (;;) { /* skip ids still in use after a wrap */
        int32_t id = fam->next_pid++;
        int used = zb_family_find(fam, id) >= 0;
        for (int i = 0; i < fam->count && !used; i++)
            if (fam->m[i].sb && zb_threads_find(&fam->m[i].sb->threads, id) >= 0) used = 1;
        if (!used) return id;
    }
}

int zb_family_make_room(zb_family *fam) {
    if (fam->count < fam->cap) return 0;
    int cap = ZB_MIN(fam->cap * 2, ZB_PROCS_MAX);
    if (cap <= fam->cap) return -1;
    zb_member *grown = realloc(fam->m, (size_t)cap * sizeof *grown);
    if (!grown) return -1;
    memset(grown + fam->cap, 0, (size_t)(cap - fam->cap) * sizeof *grown);
    fam->m = grown;
    fam->cap = cap;
    return 0;
}

int zb_family_find(const zb_family *fam, int32_t pid) {
    if (!fam || pid <= 0) return -1;
    for (int i = 0; i < fam->count; i++)
        if (fam->m[i].pid == pid) return i;
    return -1;
}

int zb_family_group_in_session(const zb_family *fam, int32_t pgid, int32_t sid) {
    for (int i = 0; fam && i < fam->count; i++)
        if (!fam->m[i].zombie && fam->m[i].pgid == pgid && fam->m[i].sid == sid) return 1;
    return 0;
}

int zb_family_self(const zb_family *fam, const zb_sandbox *sb) {
    return zb_family_find(fam, sb->proc.pid ? sb->proc.pid : 1);
}

/* A signal pending on the process that would interrupt a waiting thread (or kill it). */
static int signal_waiting(const zb_sandbox *sb) {
    uint64_t p = sb->sig.pending;
    for (int i = 0; i < sb->threads.cap && p; i++) p |= sb->threads.t[i].pending;
    for (int sig = 1; sig <= 64 && p; sig++)
        if ((p & ZB_SIG_BIT(sig)) && zb_signal_interrupts_mask(sb, sig, sb->threads.t[sb->threads.current].blocked & sb->sig.blocked))
            return 1;
    return 0;
}

static int blocked_outside(const zb_family *fam, int i) {
    const zb_member *m = &fam->m[i];
    if (!m->sb || m->zombie || m->sb->finished || m->waits_input) return 1;
    /* a vfork parent waits in its vfork syscall (sys_procs.c), which is served again: it is a RETRY thread */
    return 0;
}

static int runnable_now(const zb_family *fam, int i, int64_t now) {
    if (blocked_outside(fam, i)) return 0;
    const zb_sandbox *sb = fam->m[i].sb;
    const zb_threads *ts = &sb->threads;
    for (int k = 0; k < ts->cap; k++) {
        const zb_thread *t = &ts->t[k];
        if (!t->tid) continue;
        if (t->state == ZB_THREAD_RUNNABLE || t->wake_ns <= now || zb_thread_retry_may_go_on(t)) return 1;
    }
    return signal_waiting(sb);
}

int zb_family_others_runnable(const zb_sandbox *sb, int64_t now) {
    const zb_family *fam = sb->fam;
    if (!fam) return 0;
    for (int i = 0; i < fam->count; i++)
        if (fam->m[i].sb != sb && runnable_now(fam, i, now)) return 1;
    return 0;
}

/* A live member: its alarm counts and can go off, even while it waits for input it will not get. */
static int alive(const zb_member *m) { return m->sb && !m->zombie && !m->sb->finished; }

int64_t zb_family_next_wake(const zb_sandbox *sb) {
    const zb_family *fam = sb->fam;
    int64_t at = INT64_MAX;
    for (int i = 0; fam && i < fam->count; i++) {
        if (fam->m[i].sb == sb || !alive(&fam->m[i])) continue;
        /* its alarm: whoever holds the VM (or sleeps on it) wakes then and queues its SIGALRM */
        if (fam->m[i].sb->sig.alarm_ns) at = ZB_MIN(at, fam->m[i].sb->sig.alarm_ns);
        if (blocked_outside(fam, i)) continue;
        const zb_threads *ts = &fam->m[i].sb->threads;
        for (int k = 0; k < ts->cap; k++)
            if (ts->t[k].tid && ts->t[k].state != ZB_THREAD_RUNNABLE) at = ZB_MIN(at, ts->t[k].wake_ns);
    }
    return at;
}

int zb_family_schedulable(const zb_family *fam, int i, int64_t now) {
    if (blocked_outside(fam, i)) return 0;
    if (runnable_now(fam, i, now)) return 1;
    const zb_threads *ts = &fam->m[i].sb->threads;
    for (int k = 0; k < ts->cap; k++) /* a yielded syscall is served again: it may be able to go on now */
        if (ts->t[k].tid && ts->t[k].state == ZB_THREAD_RETRY) return 1;
    return 0;
}

int zb_family_alarms_check(zb_family *fam, const zb_sandbox *except, int64_t now) {
    int any = 0;
    for (int i = 0; fam && i < fam->count; i++) {
        zb_member *m = &fam->m[i];
        if (m->sb == except || !alive(m) || !m->sb->sig.alarm_ns || !zb_alarm_check(m->sb, now)) continue;
        m->waits_input = 0; /* as zb_family_signal: a child waiting for input it never gets takes it */
        any = 1;
    }
    return any;
}

void zb_family_signal(zb_family *fam, int i, int sig) {
    zb_sandbox *sb = fam->m[i].sb;
    if (!sb || fam->m[i].zombie || sig < 1 || sig > 64) return;
    sb->sig.pending |= ZB_SIG_BIT(sig);
    /* a child that waits for UART input it will never get still takes signals */
    fam->m[i].waits_input = 0;
}

void zb_family_remove(zb_family *fam, int i) {
    if (i <= 0 || i >= fam->count) return; /* process 1 stays */
    int last = fam->count - 1;
    fam->m[i] = fam->m[last]; /* the last member moves into the freed slot: indexes into m follow it */
    memset(&fam->m[last], 0, sizeof fam->m[0]);
    fam->count--;
    if (fam->current == last) fam->current = i;
    else if (fam->current >= fam->count) fam->current = 0;
    if (fam->yielded == last) fam->yielded = i;
    else if (fam->yielded == i || fam->yielded >= fam->count) fam->yielded = -1;
}

void zb_family_member_execed(zb_sandbox *sb) {
    if (!sb->fam) return;
    int i = zb_family_self(sb->fam, sb);
    if (i < 0) return;
    sb->fam->m[i].vfork_done = 1; /* the parent's memory is no longer borrowed (CLONE_VFORK) */
    zb_wake_gen++;                /* its vfork parent's wait is served again */
}

/* The parent's disposition of SIGCHLD says nobody will wait for its children. */
static int parent_reaps_nothing(const zb_sandbox *parent) {
    const zb_sigaction *a = &parent->sig.action[SIGCHLD];
    return a->handler == (uint64_t)(uintptr_t)SIG_IGN || (a->flags & SA_NOCLDWAIT);
}

void zb_family_member_ended(zb_family *fam, int i, int wstatus) {
    zb_member *m = &fam->m[i];
    int32_t pid = m->pid;
    if (m->sb) memcpy(m->comm, m->sb->proc.comm, sizeof m->comm);
    m->sb = NULL;
    m->zombie = 1;
    m->wstatus = wstatus;
    m->vfork_done = 1;
    /* its children: orphans, adopted by process 1 (which is never asked to wait for them) */
    for (int k = 0; k < fam->count; k++) {
        zb_member *c = &fam->m[k];
        if (c->ppid != pid || k == i) continue;
        c->ppid = 1;
        c->orphan = 1;
        if (c->pdeathsig) zb_family_signal(fam, k, c->pdeathsig);
    }
    for (int k = fam->count - 1; k > 0; k--) /* orphans that are zombies already: nobody waits */
        if (fam->m[k].orphan && fam->m[k].zombie && k != i) zb_family_remove(fam, k);
    i = zb_family_find(fam, pid);
    m = &fam->m[i];
    int parent = zb_family_find(fam, m->ppid);
    if (m->orphan || parent < 0 || !fam->m[parent].sb) { zb_family_remove(fam, i); return; }
    zb_sandbox *psb = fam->m[parent].sb;
    int reap = parent_reaps_nothing(psb);
    if (m->exit_signal && !(m->exit_signal == SIGCHLD && psb->sig.action[SIGCHLD].handler == (uint64_t)(uintptr_t)SIG_IGN))
        zb_family_signal(fam, parent, m->exit_signal);
    if (reap) zb_family_remove(fam, i);
}

/* ---- children a checkpoint leaves out (zb_sandbox_checkpoint) ---- */

int zb_lost_children_take(zb_lost_children *lost, const zb_family *fam) {
    lost->c = NULL;
    lost->n = 0;
    if (!fam || fam->count <= 1) return 0;
    if (!(lost->c = calloc((size_t)fam->count, sizeof *lost->c))) return -1;
    for (int i = 1; i < fam->count; i++) {
        const zb_member *m = &fam->m[i];
        if (m->ppid != fam->m[0].pid || m->orphan) continue; /* grandchildren and orphans: nobody waits */
        zb_lost_child *c = &lost->c[lost->n++];
        c->pid = m->pid;
        c->pgid = m->pgid;
        c->sid = m->sid;
        c->wstatus = m->zombie ? m->wstatus : SIGKILL;
        c->exit_signal = m->exit_signal;
        memcpy(c->comm, m->zombie || !m->sb ? m->comm : m->sb->proc.comm, sizeof c->comm);
        c->comm[sizeof c->comm - 1] = 0;
    }
    return 0;
}

void zb_lost_children_free(zb_lost_children *lost) {
    free(lost->c);
    lost->c = NULL;
    lost->n = 0;
}

void zb_lost_children_save(const zb_lost_children *lost, zb_out *o) {
    out_u32(o, lost->n);
    for (uint32_t i = 0; i < lost->n; i++) {
        const zb_lost_child *c = &lost->c[i];
        out_u32(o, (uint32_t)c->pid);
        out_u32(o, (uint32_t)c->pgid);
        out_u32(o, (uint32_t)c->sid);
        out_u32(o, (uint32_t)c->wstatus);
        out_u32(o, (uint32_t)c->exit_signal);
        out_bytes(o, c->comm, sizeof c->comm);
    }
}

int zb_lost_children_load(zb_lost_children *lost, zb_in *in, char *err) {
    lost->c = NULL;
    lost->n = in_u32(in);
    if (in->err || lost->n > ZB_PROCS_MAX) goto bad;
    if (lost->n && !(lost->c = calloc(lost->n, sizeof *lost->c))) { zb_seterr(err, "out of memory"); return -1; }
    for (uint32_t i = 0; i < lost->n; i++) {
        zb_lost_child *c = &lost->c[i];
        c->pid = (int32_t)in_u32(in);
        c->pgid = (int32_t)in_u32(in);
        c->sid = (int32_t)in_u32(in);
        c->wstatus = (int32_t)in_u32(in);
        c->exit_signal = (int32_t)in_u32(in);
        in_bytes(in, c->comm, sizeof c->comm);
        if (in->err || c->pid < 2 || c->pgid < 1 || c->sid < 1 || c->wstatus < 0 || c->wstatus > 0xffff ||
            c->exit_signal < 0 || c->exit_signal > 64 || c->comm[sizeof c->comm - 1])
            goto bad;
    }
    return 0;
bad:
    zb_lost_children_free(lost);
    zb_seterr(err, "the record of a checkpoint's child processes is corrupt");
    return -1;
}

int zb_family_restore_lost(zb_sandbox *sb, const zb_lost_children *lost) {
    if (!lost->n) return 0;
    zb_family *fam = zb_family_ensure(sb);
    if (!fam) return -1;
    for (uint32_t k = 0; k < lost->n; k++) {
        const zb_lost_child *c = &lost->c[k];
        if (c->pid >= fam->next_pid) fam->next_pid = c->pid + 1; /* no later process takes its pid */
        if (zb_family_find(fam, c->pid) >= 0 || fam->count >= ZB_PROCS_MAX) continue;
        if (zb_family_make_room(fam) < 0) return -1;
        int i = fam->count++;
        fam->m[i] = (zb_member){.pid = c->pid, .ppid = fam->m[0].pid, .pgid = c->pgid, .sid = c->sid,
                                .exit_signal = c->exit_signal};
        memcpy(fam->m[i].comm, c->comm, sizeof c->comm);
        zb_family_member_ended(fam, i, c->wstatus);
    }
    return 0;
}
