/* family_run.c - the processes of a sandbox: forking a process (a copy-on-write fork of the live
 * sandbox), running the whole family when the host runs process 1, and ending it.
 *
 * zb_sandbox_run(process 1) is the family's scheduler: one process at a time runs (zb_run_one,
 * run_loop.c: process 1 on the engine's executor VM, children on the children's, vm.h) until it
 * ends, stops for the host (output, input, a frame, a kick, the deadline), or yields the VM
 * (ZB_EVENT_PROC_YIELD: all its threads wait while another process can run, or its time slice
 * ended while another waits). Output of any
 * process is an event of the host's run; only process 1 talks to the host over the UART (a
 * child's frames are dropped with a log line, a child waiting for UART input waits until it gets
 * a signal). A process that ends becomes a zombie for its parent (proc_family.c) and its sandbox
 * is freed at once; when process 1 ends, is restored or freed, every other process goes too.
 *
 * The fork itself (zb_family_fork_sandbox) is the snapshot path: a snapshot of the parent taken
 * inside its fork syscall (which copies only what it wrote since its last snapshot) and a fork of
 * that snapshot, then the changes fork(2) makes: one thread, no pending signals or alarm, shared
 * open file descriptions. docs/ARCHITECTURE.md "Processes" and docs/PERFORMANCE.md have the costs.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "dev.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "shared_map.h"
#include "run.h"
#include "sandbox.h"
#include "snapshot.h"

#include <poll.h>
#include <sys/wait.h>
#include <time.h>

/* Child sandboxes alive in this process (zb_child_processes_alive): every one is freed with its family. */
static atomic_long children_alive;

long zb_child_processes_alive(void) { return atomic_load(&children_alive); }

static void free_child(zb_sandbox *p) {
    zb_sandbox_free(p);
    atomic_fetch_sub(&children_alive, 1);
}

/* The processes of a family share one file system, as Linux processes share a mount namespace: a
 * file that `!cmd` writes is there for the notebook. The fork made the child a copy of the
 * parent's (same inode numbers, its opens counted in the copy): its open files become the
 * parent's shared descriptions, its shared mappings count in the parent's file system, and the
 * copy goes. */
static void share_file_system(zb_sandbox *child, zb_sandbox *parent) {
    zb_fdtable_share(child->fds, child->fs, parent->fds);
    zb_shmap_count_opens(&child->mem, parent->fs, 1);
    zb_fs_free(child->fs);
    child->fs = parent->fs;
    child->fs_borrowed = 1;
}

zb_sandbox *zb_family_fork_sandbox(zb_sandbox *parent, int32_t pid, char *err) {
    zb_snapshot *snap = zb_snapshot_take(parent, err);
    if (!snap) return NULL;
    zb_sandbox *child = zb_snapshot_fork_for(snap, 1, err);
    /* The pages this snapshot copied into a store of its own are the child's base (and the
     * parent's): another host copy of what the parent wrote since its last snapshot, charged to
     * the family once, while any of them lives. Held before the snapshot goes. */
    zb_family *fam = parent->fam;
    int held = 0, has_own = snap->own != NULL;
    if (child && has_own && fam) {
        if (fam->nstores == fam->stores_cap) {
            int cap = fam->stores_cap ? fam->stores_cap * 2 : 16;
            struct zb_store **grown = cap > fam->stores_cap ? realloc(fam->stores, (size_t)cap * sizeof *grown) : NULL;
            if (grown) { fam->stores = grown; fam->stores_cap = cap; }
        }
        if (fam->nstores < fam->stores_cap) {
            zb_store_hold(snap->own);
            fam->stores[fam->nstores++] = snap->own;
            held = 1;
        }
    }
    zb_snapshot_release(snap); /* the child (and the parent: its new base) keep it */
    if (!child) return NULL;
    if (has_own && !held) { /* what cannot be counted is not made */
        zb_seterr(err, "out of memory for the family's list of fork snapshot stores");
        zb_sandbox_free(child);
        return NULL;
    }
    if (fam) zb_family_count_stores(fam);
    zb_mem_budget *budget = parent->mem.budget;
    if (budget && zb_mem_budget_join(&child->mem, budget) < 0) {
        zb_seterr(err, "the sandbox's memory limit (%llu MiB for all its processes) cannot hold another copy "
                  "of this process (%llu MiB it could write; %llu MiB in use by the family)",
                  (unsigned long long)(budget->owner->pages_limit * ZB_PAGE >> 20),
                  (unsigned long long)(zb_mem_charge(&child->mem) * ZB_PAGE >> 20),
                  (unsigned long long)(zb_mem_budget_total(budget) * ZB_PAGE >> 20));
        zb_sandbox_free(child);
        return NULL;
    }
    /* one thread: the caller's, with the new pid as its tid */
    zb_threads *ts = &child->threads;
    for (int i = 0; i < ts->cap; i++)
        if (i != ts->current && ts->t[i].tid) zb_threads_remove(ts, i);
    zb_thread *t = &ts->t[ts->current];
    t->tid = pid;
    t->state = ZB_THREAD_RUNNABLE;
    t->wake_ns = INT64_MAX;
    t->pending = 0;
    t->robust_list = t->robust_len = 0;
    ts->max_threads = parent->threads.max_threads;
    ts->need_xsave_for = -1;
    ts->switch_request = 0;
    ts->preempt = 0;
    /* fork(2): no pending signals, no alarm or CPU timers, no CPU time yet; the mask and handlers are inherited */
    child->sig.pending = 0;
    child->sig.alarm_ns = child->sig.alarm_interval_ns = 0;
    memset(child->sig.cpu_timer_ns, 0, sizeof child->sig.cpu_timer_ns); /* nor interval timers */
    memset(child->sig.cpu_timer_interval_ns, 0, sizeof child->sig.cpu_timer_interval_ns);
    child->sig.fault_sig = 0;
    child->proc.pid = pid;
    child->cpu.vfork_child = 0;
    child->proc.exit_status = 0;
    child->proc.cpu_ns = child->proc.sys_ns = 0;
    child->proc.children_utime_ns = child->proc.children_stime_ns = child->proc.children_maxrss_kib = 0;
    child->cpu.pending_syscall = 0;
    child->cpu.context_restored = 0;
    child->uart.rx_len = child->uart.rx_pos = 0; /* the host's input is process 1's */
    child->uart.tx_len = 0;
    child->uart.frame_ready = 0;
    child->trace_fd = parent->trace_fd;
    share_file_system(child, parent);
    child->fam = parent->fam;
    atomic_fetch_add(&children_alive, 1);
    return child;
}

/* Move a process's log lines into process 1's, each marked with its pid. */
static void take_child_log(zb_sandbox *root, zb_sandbox *p) {
    char buf[ZB_LOG_MAX + 1];
    size_t n = zb_sandbox_take_log(p, buf, ZB_LOG_MAX);
    buf[n] = 0;
    for (char *line = buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (*line) zb_log(root, "[pid %d] %s", p->proc.pid, line);
    }
}

/* Shared mappings across the family's processes (shared_map.h): before p runs, its copies take in
 * the latest bytes; after it ran, they are written back, so the file system holds the latest. */
static void shared_before_run(zb_family *fam, zb_sandbox *p) {
    if (fam->shared_latest != p && p->mem.shmap) zb_shmap_switch_in(p);
    fam->shared_latest = p;
}

static void shared_after_run(zb_family *fam, zb_sandbox *p) {
    /* alone in its family, nobody else reads them: written back when another process appears */
    if (fam->count > 1 && p->mem.shmap && zb_shmap_switch_out(p) < 0) {
        /* as Linux answers a write to a shared page that a full tmpfs cannot hold: SIGBUS */
        zb_log(p, "a shared mapping's pages did not fit the file system (its limit): SIGBUS");
        int i = zb_family_self(fam, p);
        if (i >= 0) zb_family_signal(fam, i, SIGBUS);
    }
    fam->shared_latest = p;
}

int zb_family_futex_wake_shared(zb_sandbox *sb, uint64_t addr, uint32_t bitset, int n) {
    zb_family *fam = sb->fam;
    const zb_shmap_entry *e = zb_shmap_find(&sb->mem, addr, 4);
    if (!fam || !e || n <= 0 || addr < e->addr || addr + 4 > e->addr + e->len) return 0;
    uint32_t ino = e->ino;
    uint64_t off = e->off + (addr - e->addr); /* the futex's key: (inode, offset), as Linux's shared futexes */
    int woken = 0;
    for (int i = 0; i < fam->count && woken < n; i++) {
        zb_sandbox *p = fam->m[i].sb;
        if (!p || p == sb || fam->m[i].zombie || !p->mem.shmap) continue;
        const struct zb_shmap *t = p->mem.shmap;
        for (size_t k = 0; k < t->n && woken < n; k++) {
            const zb_shmap_entry *o = &t->e[k];
            if (o->ino != ino || off < o->off || off + 4 > o->off + o->len) continue;
            zb_threads *ts = &p->threads;
            int cur = ts->current, cur_waits = ts->t[cur].state == ZB_THREAD_FUTEX;
            woken += zb_threads_futex_wake(ts, o->addr + (off - o->off), bitset, n - woken);
            if (cur_waits && ts->t[cur].state == ZB_THREAD_RUNNABLE) zb_run_threads_load_parked(p);
        }
    }
    return woken;
}

/* Member i's process ended with this wait status: free its sandbox, make it a zombie. */
static void end_member(zb_sandbox *root, zb_family *fam, int i, int wstatus) {
    int64_t t_end = zb_now_ns();
    zb_sandbox *p = fam->m[i].sb;
    if (p) { /* its rusage, for the wait that reaps it (sys_procs.c) */
        uint64_t user, sys;
        zb_guest_cpu_split(p, &user, &sys);
        zb_mem_budget_sync(&p->mem);
        fam->m[i].utime_ns = user + p->proc.children_utime_ns;
        fam->m[i].stime_ns = sys + p->proc.children_stime_ns;
        fam->m[i].maxrss_kib = ZB_MAX(p->mem.peak_charge * (ZB_PAGE / 1024), p->proc.children_maxrss_kib);
    }

    if (fam->shared_latest == p) fam->shared_latest = NULL;
    if (p) zb_pty_session_leader_ends(fam, i); /* before its fds go: they may hold its terminal */
    zb_lock_process_gone(root->fs, fam->m[i].pid); /* its record locks (fcntl(2)) */
    zb_family_member_ended(fam, i, wstatus);
    zb_wake_gen++; /* its parent's wait, readers of its pipes: may go on */
    if (p) {
        take_child_log(root, p);
        free_child(p);
    }
    zb_family_count_stores(fam); /* the stores only it used are gone */
    fam->end_ns += (uint64_t)(zb_now_ns() - t_end);
}

void zb_family_count_stores(zb_family *fam) {
    uint64_t pages = 0;
    int w = 0;
    for (int i = 0; i < fam->nstores; i++) {
        struct zb_store *s = fam->stores[i];
        if (!s->live_pages) { zb_store_release(s); continue; } /* no snapshot uses any page of it */
        pages += s->live_pages;
        fam->stores[w++] = s;
    }
    fam->nstores = w;
    fam->mem.shared_pages = pages;
    if (zb_mem_budget_total(&fam->mem) > fam->mem.peak) fam->mem.peak = zb_mem_budget_total(&fam->mem);
}

void zb_family_end(zb_sandbox *root) {
    zb_family *fam = root->fam;
    if (!fam || fam->m[0].sb != root) return;
    for (int i = fam->count - 1; i > 0; i--) {
        zb_sandbox *p = fam->m[i].sb;
        zb_lock_process_gone(root->fs, fam->m[i].pid); /* its record locks (fcntl(2)) */
        if (p) {
            take_child_log(root, p);
            free_child(p);
        }
        zb_family_remove(fam, i);
    }
    /* process 1 alone again: what of the fork stores lives is its checkpoints' or its base's, as
     * for a sandbox that never forked */
    for (int i = 0; i < fam->nstores; i++) zb_store_release(fam->stores[i]);
    fam->nstores = 0;
    fam->mem.shared_pages = 0;
    fam->current = 0;
    fam->yielded = -1;
    fam->shared_latest = root; /* alone again (or restored): its copies are the latest */
}

/* The next member to run: the current one unless it yielded, then round-robin; -1 if none can. */
static int pick(zb_family *fam, int64_t now) {
    int from = fam->current;
    if (fam->yielded != from && from < fam->count && zb_family_schedulable(fam, from, now)) return from;
    for (int k = 1; k <= fam->count; k++) {
        int i = (from + k) % fam->count;
        if (zb_family_schedulable(fam, i, now)) return i;
    }
    return -1;
}

/* Nobody can run: wait for a timeout of some process's thread, the deadline or a kick. 1 with an
 * event for the caller, 0 to look again. */
static int family_idle(zb_sandbox *root, zb_family *fam, int64_t deadline_ns, zb_event *ev) {
    int64_t now = zb_now_ns(), until = deadline_ns ? deadline_ns : INT64_MAX;
    int kind = 0;
    if (zb_take_kick(root)) kind = ZB_EVENT_KICK;
    else if (deadline_ns && now >= deadline_ns) kind = ZB_EVENT_TIMEOUT;
    if (kind) {
        memset(ev, 0, sizeof *ev);
        ev->kind = kind;
        return 1;
    }
    for (int i = 0; i < fam->count; i++) {
        zb_sandbox *p = fam->m[i].sb;
        if (!p || fam->m[i].zombie) continue;
        for (int k = 0; k < p->threads.cap; k++)
            if (p->threads.t[k].tid) until = ZB_MIN(until, p->threads.t[k].wake_ns);
        if (p->sig.alarm_ns) until = ZB_MIN(until, p->sig.alarm_ns);
    }
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, ZB_KICK_SIGNAL);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    sigset_t wait = old;
    sigdelset(&wait, ZB_KICK_SIGNAL);
    if (!zb_kick_pending(root)) {
        int64_t ns = ZB_MIN(ZB_MAX(until - now, 0), (int64_t)3600 * 1000000000);
        struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
        zb_wait_ppoll(NULL, 0, &ts, &wait); /* the kick signal ends it early */
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    zb_family_alarms_check(fam, NULL, zb_now_ns()); /* an alarm that expired queues its SIGALRM */
    return 0;
}

int zb_sandbox_run(zb_sandbox *root, int64_t deadline_ns, zb_event *ev) {
    zb_family *fam = root->fam;
    if (!fam || root->finished) { /* the first fork makes the family during this run */
        int r = zb_run_one(root, deadline_ns, ev);
        if (root->fam && root->fam->m[0].sb == root) /* it forked in this run: the copies of its */
            shared_after_run(root->fam, root);        /* children are older than its own */
        if (ev->kind != ZB_EVENT_PROC_YIELD) return r;
        fam = root->fam;
        fam->yielded = 0;
    }
    if (fam->m[0].sb != root) { /* a child process is run by its family's process 1 only */
        memset(ev, 0, sizeof *ev);
        ev->kind = ZB_EVENT_ERROR;
        snprintf(ev->message, sizeof ev->message, "this sandbox is a child process: run its process 1");
        return -1;
    }
    fam->runner = pthread_self();
    atomic_store(&fam->running, 1);
    int rc = 0;
    for (;;) {
        int64_t now = zb_now_ns();
        int i = pick(fam, now);
        if (i > 0 && fam->m[0].sb->finished) i = 0; /* (cannot happen: process 1's end ends the family) */
        if (i < 0) {
            if (family_idle(root, fam, deadline_ns, ev)) break;
            continue;
        }
        if (i != fam->current) fam->switches++;
        fam->current = i;
        fam->yielded = -1;
        zb_sandbox *p = fam->m[i].sb;
        int32_t pid = fam->m[i].pid;
        p->threads.slice_start_ns = now;
        shared_before_run(fam, p);
        int64_t t_run = zb_now_ns();
        rc = zb_run_one(p, deadline_ns, ev);
        if (p != root) fam->child_run_ns += (uint64_t)(zb_now_ns() - t_run);
        shared_after_run(fam, p);
        /* its run may have reaped other members (wait4), and a removal moves the last member into
         * the freed slot: p's own slot can have moved, so it is looked up again (a process never
         * reaps itself, and only its end removes it) */
        i = zb_family_find(fam, pid);
        if (i < 0) { /* cannot happen: treated as the end of the family's run */
            memset(ev, 0, sizeof *ev);
            ev->kind = ZB_EVENT_ERROR;
            snprintf(ev->message, sizeof ev->message, "process %d left the family during its own run", pid);
            break;
        }
        fam->current = i;
        if (ev->kind == ZB_EVENT_PROC_YIELD) {
            fam->yielded = i;
            continue;
        }
        if (p == root) {
            if (ev->kind == ZB_EVENT_EXIT || ev->kind == ZB_EVENT_FAULT || ev->kind == ZB_EVENT_ERROR) zb_family_end(root);
            break;
        }
        zb_member *m = &fam->m[i];
        if (ev->kind == ZB_EVENT_EXIT) { end_member(root, fam, i, (ev->status & 0xff) << 8); continue; }
        if (ev->kind == ZB_EVENT_FAULT) { end_member(root, fam, i, ev->signal & 0x7f); continue; }
        if (ev->kind == ZB_EVENT_ERROR) {
            zb_log(root, "[pid %d] ended by the engine: %s", pid, ev->message);
            end_member(root, fam, i, SIGKILL);
            continue;
        }
        if (ev->kind == ZB_EVENT_INPUT) { m->waits_input = 1; continue; } /* only process 1 gets input */
        if (ev->kind == ZB_EVENT_FRAME) {
            zb_log(root, "[pid %d] a UART frame of a child process was dropped (only process 1 talks to the host)", pid);
            continue;
        }
        break; /* output, a kick, the deadline: the caller's */
    }
    /* between runs the host (snapshots, file export, a cell's files) sees process 1: it takes in
     * the bytes a child wrote */
    if (fam->m[0].sb == root) shared_before_run(fam, root);
    atomic_store(&fam->running, 0);
    return rc < 0 ? 0 : 0;
}

int zb_sandbox_set_max_processes(zb_sandbox *sb, int n) {
    if (n < 1 || n > ZB_PROCS_MAX) return -1;
    sb->max_procs = n;
    if (sb->fam) sb->fam->max_procs = n;
    return 0;
}

int zb_sandbox_process_count(zb_sandbox *sb) {
    if (!sb->fam) return 1;
    int n = 0;
    for (int i = 0; i < sb->fam->count; i++) n += !sb->fam->m[i].zombie;
    return n;
}

int zb_sandbox_child_count(zb_sandbox *sb) { return sb->fam ? sb->fam->count - 1 : 0; }

/* The refusals a snapshot of process 1 alone still has: what it cannot copy. */
static int snapshot_refused(zb_sandbox *sb, char *err) {
    int waiting = zb_usock_listeners_waiting(sb);
    if (waiting) {
        zb_seterr(err, "cannot snapshot a sandbox with connections waiting to be accepted on %d listening socket%s: "
                       "a snapshot holds a listener only with an empty accept queue; accept them (or close the "
                       "listener) first", waiting, waiting > 1 ? "s" : "");
        return 1;
    }
    int in_flight = zb_sandbox_fds_in_flight(sb);
    if (in_flight) {
        zb_seterr(err, "cannot snapshot a sandbox with %d file descriptor%s in flight on its AF_UNIX sockets (sent with "
                       "SCM_RIGHTS, not received yet): snapshots of passed fds are not supported; receive them "
                       "(recvmsg) or close the sockets first", in_flight, in_flight > 1 ? "s" : "");
        return 1;
    }
    return 0;
}

zb_snapshot *zb_sandbox_snapshot(zb_sandbox *sb, char *err) {
    zb_family *fam = sb->fam;
    if (fam && fam->count > 1) {
        char pids[256] = "";
        size_t at = 0;
        for (int i = 1; i < fam->count && at + 16 < sizeof pids; i++)
            at += (size_t)snprintf(pids + at, sizeof pids - at, "%s%d%s", at ? ", " : "", fam->m[i].pid,
                                   fam->m[i].zombie ? " (exited, not waited for)" : "");
        zb_seterr(err, "cannot snapshot a sandbox with child processes (pids %s): snapshots of a process tree are "
                       "not supported yet; wait for them (os.waitpid, Popen.wait) or end them first", pids);
        return NULL;
    }
    if (snapshot_refused(sb, err)) return NULL;
    return zb_snapshot_take(sb, err);
}

zb_snapshot *zb_sandbox_checkpoint(zb_sandbox *sb, char *err) {
    if (sb->fam && sb->fam->m[0].sb != sb) {
        zb_seterr(err, "this sandbox is a child process of a family: only its process 1 has checkpoints");
        return NULL;
    }
    if (snapshot_refused(sb, err)) return NULL;
    zb_snapshot *snap = zb_snapshot_take(sb, err);
    if (snap && zb_lost_children_take(&snap->st.lost, sb->fam) < 0) {
        zb_snapshot_release(snap);
        zb_seterr(err, "out of memory recording the checkpoint's child processes");
        return NULL;
    }
    return snap;
}

int zb_snapshot_lost_children(zb_snapshot *snap, int32_t *pids, int max) {
    for (int i = 0; i < max && (uint32_t)i < snap->st.lost.n; i++) pids[i] = snap->st.lost.c[i].pid;
    return (int)snap->st.lost.n;
}

int zb_sandbox_listening_sockets(zb_sandbox *sb) { return zb_usock_listeners(sb); }

int zb_sandbox_listeners_waiting(zb_sandbox *sb) { return zb_usock_listeners_waiting(sb); }

int zb_sandbox_fds_in_flight(zb_sandbox *sb) { return sb->fs ? sb->fs->scm_inflight : 0; }
