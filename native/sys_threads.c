/* sys_threads.c - the thread syscalls: clone/clone3 with the pthread flags, exit of one thread,
 * set_tid_address, set/get_robust_list, gettid, tkill/tgkill, sched_yield and futex.
 *
 * Threads are M:1 on the sandbox's one vCPU (threads.c has the table, run_threads.c the switch).
 * A handler here only changes the table: a new thread is a runnable slot, a wait marks the running
 * thread as waiting and returns ZB_SYSCALL_BLOCK, an exit or a yield sets threads.switch_request;
 * the run loop then switches. A clone without CLONE_THREAD is a new process (sys_procs.c).
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "process.h"
#include "sandbox_state.h"
#include "linux.h"

#include <linux/futex.h>
#include <linux/sched.h>
#include <sys/syscall.h>

#define GUEST_PID 1

/* What pthread_create passes (glibc 2.34+: clone3 with these, clone with the same on ENOSYS). */
#define THREAD_FLAGS_NEEDED (CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD)
#define THREAD_FLAGS_OK (THREAD_FLAGS_NEEDED | CLONE_SYSVSEM | CLONE_SETTLS | CLONE_PARENT_SETTID | \
                         CLONE_CHILD_CLEARTID | CLONE_CHILD_SETTID | CLONE_DETACHED)

static zb_thread *running(zb_sandbox *sb) { return &sb->threads.t[sb->threads.current]; }

/* A new thread: the caller's registers at the syscall's return with rax 0 and the given stack and
 * TLS, its signal mask, no alternate stack (Linux clears it for CLONE_VM), its XSAVE image copied
 * by the run loop after this returns (the vCPU holds it). Returns the new tid or -errno. */
static long new_thread(zb_sandbox *sb, uint64_t flags, uint64_t stack, uint64_t parent_tid, uint64_t child_tid,
                       uint64_t tls) {
    if ((flags & THREAD_FLAGS_NEEDED) != THREAD_FLAGS_NEEDED) return -EINVAL; /* CLONE_THREAD without VM, FS, FILES, SIGHAND */
    if (flags & ~(uint64_t)THREAD_FLAGS_OK) return -EINVAL;
    if ((flags & CLONE_SETTLS) && tls >= ZB_USER_ADDR_LIMIT) return -EPERM;
    if ((flags & CLONE_PARENT_SETTID) && !zb_guest_ptr(sb, parent_tid, 4, 1)) return -EFAULT;
    if ((flags & (CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID)) && !zb_guest_ptr(sb, child_tid, 4, 1)) return -EFAULT;
    zb_threads *ts = &sb->threads;
    int slot = zb_threads_new_slot(ts, sb->engine->xsave_size);
    if (slot < 0) {
        zb_log(sb, "thread creation refused: the sandbox's limit of %d threads is reached", ts->max_threads);
        return -EAGAIN;
    }
    zb_thread *t = &ts->t[slot];
    if (sb->fam) t->tid = zb_family_new_id(sb->fam); /* tids and pids share the family's namespace */
    t->cpu.regs = sb->cpu.regs;
    t->cpu.regs.rax = 0;
    if (stack) t->cpu.regs.rsp = stack;
    t->cpu.fs_base = (flags & CLONE_SETTLS) ? tls : sb->cpu.fs_base;
    t->cpu.gs_base = sb->cpu.gs_base;
    t->blocked = sb->sig.blocked;
    if (flags & CLONE_CHILD_CLEARTID) t->clear_child_tid = child_tid;
    uint32_t tid = (uint32_t)t->tid;
    if (flags & CLONE_PARENT_SETTID) zb_copy_to_guest(sb, parent_tid, &tid, 4); /* validated above */
    if (flags & CLONE_CHILD_SETTID) zb_copy_to_guest(sb, child_tid, &tid, 4);
    ts->need_xsave_for = slot;
    return t->tid;
}

static long sys_clone(zb_sandbox *sb, const uint64_t a[6]) {
    /* x86-64 order: flags, stack, parent_tid, child_tid, tls; the low byte of flags is the exit
     * signal, which Linux ignores for a thread (clone3 refuses it) */
    if (!(a[0] & CLONE_THREAD)) return zb_sys_new_process(sb, a[0] & ~(uint64_t)CSIGNAL, a[1], a[2], a[3], a[4], a[0] & CSIGNAL);
    return new_thread(sb, a[0] & ~(uint64_t)CSIGNAL, a[1], a[2], a[3], a[4]);
}

/* struct clone_args as of Linux 5.7 (CLONE_ARGS_SIZE_VER2), read field by field. */
static long sys_clone3(zb_sandbox *sb, const uint64_t a[6]) {
    enum { VER0 = 64, KNOWN = 88, MAX = 4096 };
    uint64_t size = a[1];
    if (size < VER0 || size > MAX) return size > MAX ? -E2BIG : -EINVAL;
    uint64_t f[11] = {0};
    if (zb_copy_from_guest(sb, f, a[0], ZB_MIN(size, (uint64_t)KNOWN)) < 0) return -EFAULT;
    if (size > KNOWN) { /* newer fields this engine does not know must be zero, as Linux asks */
        const uint8_t *rest = zb_guest_ptr(sb, a[0] + KNOWN, size - KNOWN, 0);
        if (!rest) return -EFAULT;
        for (uint64_t i = 0; i < size - KNOWN; i++)
            if (rest[i]) return -E2BIG;
    }
    uint64_t flags = f[0], pidfd = f[1], child_tid = f[2], parent_tid = f[3], exit_signal = f[4], stack = f[5],
             stack_size = f[6], tls = f[7], set_tid_size = f[9], cgroup = f[10];
    (void)pidfd;
    if (exit_signal > 64 || (exit_signal && (flags & CLONE_THREAD))) return -EINVAL;
    if (set_tid_size || (flags & (CLONE_PIDFD | CLONE_INTO_CGROUP)) || cgroup) return -EINVAL;
    if ((stack == 0) != (stack_size == 0) || stack + stack_size < stack) return -EINVAL;
    if (!(flags & CLONE_THREAD))
        return zb_sys_new_process(sb, flags, stack ? stack + stack_size : 0, parent_tid, child_tid, tls, exit_signal);
    return new_thread(sb, flags, stack ? stack + stack_size : 0, parent_tid, child_tid, tls);
}

/* Robust futexes (Linux's exit_robust_list): a robust mutex the exiting thread still holds (on its
 * list, or the one it was locking or unlocking: list_op_pending) gets FUTEX_OWNER_DIED, and one
 * waiter is woken, so the next pthread_mutex_lock returns EOWNERDEAD instead of waiting forever.
 * The list is guest memory: at most ROBUST_LIST_LIMIT entries (Linux's bound, which also ends a
 * cycle), every word read and written through the checked copies; a bad pointer ends the walk, as
 * on Linux. Bit 0 of an entry marks a PI futex, which this engine does not have (ENOSYS). */
#define ROBUST_LIST_LIMIT 2048
#define FUTEX_WAITERS_BIT 0x80000000u
#define FUTEX_OWNER_DIED_BIT 0x40000000u
#define FUTEX_TID_BITS 0x3fffffffu

static void futex_owner_died(zb_sandbox *sb, uint64_t uaddr, int32_t tid) {
    uint32_t word;
    if ((uaddr & 3) || zb_copy_from_guest(sb, &word, uaddr, 4) < 0) return;
    if ((word & FUTEX_TID_BITS) != (uint32_t)tid) return; /* not held by this thread */
    uint32_t died = (word & FUTEX_WAITERS_BIT) | FUTEX_OWNER_DIED_BIT;
    if (zb_copy_to_guest(sb, uaddr, &died, 4) < 0) return;
    if (word & FUTEX_WAITERS_BIT) zb_threads_futex_wake(&sb->threads, uaddr, FUTEX_BITSET_MATCH_ANY, 1);
}

static void exit_robust_list(zb_sandbox *sb, const zb_thread *me) {
    uint64_t head[3]; /* struct robust_list_head: list.next, futex_offset, list_op_pending */
    if (!me->robust_list || zb_copy_from_guest(sb, head, me->robust_list, sizeof head) < 0) return;
    uint64_t entry = head[0], pending = head[2] & ~1ull, offset = head[1];
    for (int n = 0; entry != me->robust_list && n < ROBUST_LIST_LIMIT; n++) {
        uint64_t e = entry & ~1ull, next;
        if (!e || zb_copy_from_guest(sb, &next, e, 8) < 0) break;
        if (e != pending) futex_owner_died(sb, e + offset, me->tid);
        entry = next;
    }
    if (pending) futex_owner_died(sb, pending + offset, me->tid);
}

/* exit of one thread: the last one ends the process (exit_group). Otherwise its robust futexes are
 * released (exit_robust_list), CHILD_CLEARTID's 0 is stored and its futex woken (pthread_join waits
 * on it), as Linux's mm_release does in that order, and the run loop switches away and frees the
 * slot. */
static long sys_exit(zb_sandbox *sb, const uint64_t a[6]) {
    zb_threads *ts = &sb->threads;
    if (ts->count <= 1) {
        sb->proc.exit_status = (int)(a[0] & 0xff);
        sb->finished = 1;
        zb_event *ev = zb_stop_event(sb, ZB_EVENT_EXIT, 1);
        ev->status = sb->proc.exit_status;
        return ZB_SYSCALL_STOP;
    }
    zb_thread *me = running(sb);
    exit_robust_list(sb, me);
    if (me->clear_child_tid && !(me->clear_child_tid & 3)) {
        uint32_t zero = 0;
        if (zb_copy_to_guest(sb, me->clear_child_tid, &zero, 4) == 0)
            zb_threads_futex_wake(ts, me->clear_child_tid, FUTEX_BITSET_MATCH_ANY, 1);
    }
    ts->switch_request = 2;
    return ZB_SYSCALL_BLOCK;
}

static long sys_set_tid_address(zb_sandbox *sb, const uint64_t a[6]) {
    running(sb)->clear_child_tid = a[0];
    if (sb->threads.current == 0) sb->proc.tid_address = a[0]; /* the main thread's, as before */
    return running(sb)->tid;
}

static long sys_set_robust_list(zb_sandbox *sb, const uint64_t a[6]) {
    if (a[1] != 24) return -EINVAL; /* sizeof(struct robust_list_head) */
    running(sb)->robust_list = a[0];
    running(sb)->robust_len = a[1];
    return 0;
}

static long sys_get_robust_list(zb_sandbox *sb, const uint64_t a[6]) {
    int slot = a[0] ? zb_threads_find(&sb->threads, (int32_t)a[0]) : sb->threads.current;
    if ((int64_t)a[0] < 0 || slot < 0) return -ESRCH;
    uint64_t head = sb->threads.t[slot].robust_list, len = 24;
    if (zb_copy_to_guest(sb, a[1], &head, 8) < 0 || zb_copy_to_guest(sb, a[2], &len, 8) < 0) return -EFAULT;
    return 0;
}

static long sys_gettid(zb_sandbox *sb, const uint64_t a[6]) { (void)a; return running(sb)->tid; }

/* A signal to one thread: queued on it (the running thread's goes straight to the pending set it
 * takes signals from); a waiting thread that the signal interrupts fails its wait with EINTR. */
static long signal_thread(zb_sandbox *sb, int64_t tid, int sig) {
    if (sig < 0 || sig > 64) return -EINVAL;
    if (tid <= 0) return -EINVAL;
    zb_threads *ts = &sb->threads;
    int slot = zb_threads_find(ts, (int32_t)tid);
    if (slot < 0) return zb_sys_signal_process_thread(sb, 0, tid, sig); /* another process's thread, or ESRCH */
    if (!sig) return 0;
    if (slot == ts->current && ts->t[slot].state == ZB_THREAD_RUNNABLE) { sb->sig.pending |= ZB_SIG_BIT(sig); return 0; }
    zb_thread *t = &ts->t[slot];
    t->pending |= ZB_SIG_BIT(sig);
    if (t->state != ZB_THREAD_RUNNABLE && zb_signal_interrupts_mask(sb, sig, t->blocked)) zb_threads_resume(ts, slot, -EINTR);
    return 0;
}

static long sys_tkill(zb_sandbox *sb, const uint64_t a[6]) { return signal_thread(sb, (int64_t)a[0], (int)a[1]); }

static long sys_tgkill(zb_sandbox *sb, const uint64_t a[6]) {
    if ((int64_t)a[0] <= 0 || (int64_t)a[1] <= 0) return -EINVAL;
    int64_t tgid = (int64_t)a[0], own = sb->proc.pid ? sb->proc.pid : GUEST_PID;
    if (tgid <= 0) return -EINVAL;
    if (tgid != own) {
        if ((int)a[2] < 0 || (int)a[2] > 64 || (int64_t)a[1] <= 0) return -EINVAL;
        return zb_sys_signal_process_thread(sb, tgid, (int64_t)a[1], (int)a[2]);
    }
    return signal_thread(sb, (int64_t)a[1], (int)a[2]);
}

static long sys_sched_yield(zb_sandbox *sb, const uint64_t a[6]) {
    (void)a;
    if (zb_threads_others_runnable(&sb->threads, 1)) sb->threads.switch_request = 1;
    return 0;
}

/* ---- futex ---- */

/* A futex timeout as an absolute host CLOCK_MONOTONIC time: relative for FUTEX_WAIT, absolute on
 * CLOCK_MONOTONIC or (FUTEX_CLOCK_REALTIME) CLOCK_REALTIME for WAIT_BITSET. */
static long futex_wake_time(zb_sandbox *sb, int cmd, int realtime, uint64_t addr, int64_t *wake) {
    *wake = INT64_MAX;
    if (!addr) return 0;
    struct timespec ts;
    if (zb_copy_from_guest(sb, &ts, addr, sizeof ts) < 0) return -EFAULT;
    if (ts.tv_sec < 0 || ts.tv_nsec < 0 || ts.tv_nsec >= 1000000000) return -EINVAL;
    /* seconds clamped (to the year 2116) so that no sum below overflows: such a wait never ends anyway */
    const int64_t max_sec = INT64_MAX / 1000000000 / 2;
    int64_t ns = (ts.tv_sec > max_sec ? max_sec : (int64_t)ts.tv_sec) * 1000000000 + ts.tv_nsec;
    int64_t now = zb_now_ns();
    if (cmd == FUTEX_WAIT) { *wake = now + ns; return 0; }
    struct timespec c;
    clock_gettime(realtime ? CLOCK_REALTIME : CLOCK_MONOTONIC, &c);
    *wake = now + (ns - ((int64_t)c.tv_sec * 1000000000 + c.tv_nsec));
    return 0;
}

/* FUTEX_WAKE_OP's operation on *uaddr2, and its comparison of the old value. */
static int wake_op(uint32_t *word, uint32_t encoded, int *cmp_true) {
    unsigned op = (encoded >> 28) & 7, cmp = (encoded >> 24) & 15;
    uint32_t oparg = (encoded >> 12) & 0xfff, cmparg = encoded & 0xfff;
    if (encoded & (8u << 28)) { if (oparg >= 32) return -EINVAL; oparg = 1u << oparg; }
    else oparg = (uint32_t)((int32_t)(oparg << 20) >> 20); /* sign-extended 12 bits */
    cmparg = (uint32_t)((int32_t)(cmparg << 20) >> 20);
    uint32_t old = *word;
    switch (op) {
    case FUTEX_OP_SET: *word = oparg; break;
    case FUTEX_OP_ADD: *word = old + oparg; break;
    case FUTEX_OP_OR: *word = old | oparg; break;
    case FUTEX_OP_ANDN: *word = old & ~oparg; break;
    case FUTEX_OP_XOR: *word = old ^ oparg; break;
    default: return -ENOSYS;
    }
    int32_t o = (int32_t)old, c = (int32_t)cmparg;
    switch (cmp) {
    case FUTEX_OP_CMP_EQ: *cmp_true = o == c; break;
    case FUTEX_OP_CMP_NE: *cmp_true = o != c; break;
    case FUTEX_OP_CMP_LT: *cmp_true = o < c; break;
    case FUTEX_OP_CMP_LE: *cmp_true = o <= c; break;
    case FUTEX_OP_CMP_GT: *cmp_true = o > c; break;
    case FUTEX_OP_CMP_GE: *cmp_true = o >= c; break;
    default: return -ENOSYS;
    }
    return 0;
}

static long sys_futex(zb_sandbox *sb, const uint64_t a[6]) {
    int cmd = (int)a[1] & FUTEX_CMD_MASK, realtime = ((int)a[1] & FUTEX_CLOCK_REALTIME) != 0;
    zb_threads *ts = &sb->threads;
    if (realtime && cmd != FUTEX_WAIT && cmd != FUTEX_WAIT_BITSET) return -ENOSYS;
    if (a[0] & 3) return -EINVAL;
    uint32_t *word = zb_guest_ptr(sb, a[0], 4, 0);
    if (!word) return -EFAULT;
    uint32_t val3 = (uint32_t)a[5];
    switch (cmd) {
    case FUTEX_WAIT: case FUTEX_WAIT_BITSET: {
        uint32_t bitset = cmd == FUTEX_WAIT ? FUTEX_BITSET_MATCH_ANY : val3;
        if (!bitset) return -EINVAL;
        int64_t wake;
        long rc = futex_wake_time(sb, cmd, realtime, a[3], &wake);
        if (rc < 0) return rc;
        if (*word != (uint32_t)a[2]) return -EAGAIN;
        if (wake <= zb_now_ns()) return -ETIMEDOUT;
        zb_thread *me = running(sb);
        me->state = ZB_THREAD_FUTEX;
        me->futex_addr = a[0];
        me->futex_bitset = bitset;
        me->wake_ns = wake;
        me->wait_seq = ++ts->wait_seq;
        return ZB_SYSCALL_BLOCK;
    }
    case FUTEX_WAKE: case FUTEX_WAKE_BITSET: {
        uint32_t bitset = cmd == FUTEX_WAKE ? FUTEX_BITSET_MATCH_ANY : val3;
        if (!bitset) return -EINVAL;
        int n = (int)ZB_MIN(a[2] & 0xffffffff, (uint64_t)INT32_MAX);
        int woken = zb_threads_futex_wake(ts, a[0], bitset, n);
        if (!((int)a[1] & FUTEX_PRIVATE_FLAG)) woken += zb_family_futex_wake_shared(sb, a[0], bitset, n - woken);
        return woken;
    }
    case FUTEX_REQUEUE: case FUTEX_CMP_REQUEUE: {
        int nwake = (int)a[2], nmove = (int)a[3];
        if (nwake < 0 || nmove < 0) return -EINVAL;
        if ((a[4] & 3)) return -EINVAL;
        if (!zb_guest_ptr(sb, a[4], 4, 0)) return -EFAULT;
        if (cmd == FUTEX_CMP_REQUEUE && *word != val3) return -EAGAIN;
        int woken = zb_threads_futex_wake(ts, a[0], FUTEX_BITSET_MATCH_ANY, nwake);
        /* onto itself: Linux moves nothing but counts the waiters it would have moved */
        if (a[4] == a[0]) return woken + ZB_MIN(zb_threads_futex_waiters(ts, a[0]), nmove);
        return woken + zb_threads_futex_requeue(ts, a[0], a[4], nmove);
    }
    case FUTEX_WAKE_OP: {
        if (a[4] & 3) return -EINVAL;
        uint32_t *word2 = zb_guest_ptr(sb, a[4], 4, 1);
        if (!word2) return -EFAULT;
        int cmp_true = 0;
        long rc = wake_op(word2, val3, &cmp_true);
        if (rc < 0) return rc;
        int nwake = (int)ZB_MIN(a[2] & 0xffffffff, (uint64_t)INT32_MAX), nwake2 = (int)ZB_MIN(a[3] & 0xffffffff, (uint64_t)INT32_MAX);
        int woken = zb_threads_futex_wake(ts, a[0], FUTEX_BITSET_MATCH_ANY, nwake);
        int shared = !((int)a[1] & FUTEX_PRIVATE_FLAG);
        if (shared) woken += zb_family_futex_wake_shared(sb, a[0], FUTEX_BITSET_MATCH_ANY, nwake - woken);
        if (cmp_true) {
            int w2 = zb_threads_futex_wake(ts, a[4], FUTEX_BITSET_MATCH_ANY, nwake2);
            if (shared) w2 += zb_family_futex_wake_shared(sb, a[4], FUTEX_BITSET_MATCH_ANY, nwake2 - w2);
            woken += w2;
        }
        return woken;
    }
    default:
        return -ENOSYS; /* priority-inheritance futexes: glibc uses them only for PTHREAD_PRIO_INHERIT mutexes */
    }
}

void zb_sys_threads_register(zb_syscall_fn *t) {
    t[SYS_clone] = sys_clone;
    t[SYS_clone3] = sys_clone3;
    t[SYS_exit] = sys_exit;
    t[SYS_set_tid_address] = sys_set_tid_address;
    t[SYS_set_robust_list] = sys_set_robust_list;
    t[SYS_get_robust_list] = sys_get_robust_list;
    t[SYS_gettid] = sys_gettid;
    t[SYS_tkill] = sys_tkill;
    t[SYS_tgkill] = sys_tgkill;
    t[SYS_sched_yield] = sys_sched_yield;
    t[SYS_futex] = sys_futex;
}
