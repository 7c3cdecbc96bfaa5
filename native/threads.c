/* threads.c - a sandbox's thread table (zb_threads): its slots, futex wait queues, copy for a
 * snapshot and on-disk form.
 *
 * Guest threads are M:1 on the sandbox's one vCPU (docs/ARCHITECTURE.md, "Threads"). The running
 * thread's registers, XSAVE image, signal mask and alternate stack are the sandbox's own (sb->cpu,
 * sb->sig); this table holds every thread's identity (tid, clear_child_tid, robust list), what a
 * waiting thread waits for, and the saved state of the threads that are not running. Futex queues
 * are not a separate structure: a waiter is a thread in state FUTEX with its address and bitset,
 * and a wake takes the oldest matching waiters (wait_seq), so the queue order is FIFO as Linux's
 * is for threads of one priority. Bounded: at most max_threads (<= ZB_THREADS_MAX) live threads.
 * The switching itself (vCPU registers, XSAVE) is in run_threads.c; the syscalls in sys_threads.c.
 */
#include "util.h"
#include "vm.h"
#include "process.h"
#include "serial.h"

int zb_threads_init(zb_threads *ts, size_t xsave_size) {
    memset(ts, 0, sizeof *ts);
    if (!(ts->t = calloc(1, sizeof *ts->t))) return -1;
    if (!(ts->t[0].cpu.xsave = calloc(1, xsave_size))) { free(ts->t); ts->t = NULL; return -1; }
    ts->cap = 1;
    ts->count = 1;
    ts->current = 0;
    ts->t[0].tid = 1;
    ts->t[0].state = ZB_THREAD_RUNNABLE;
    ts->t[0].wake_ns = INT64_MAX;
    ts->next_tid = 2;
    ts->max_threads = ZB_THREADS_DEFAULT;
    ts->need_xsave_for = -1;
    return 0;
}

void zb_threads_free(zb_threads *ts) {
    for (int i = 0; i < ts->cap; i++) zb_cpu_free(&ts->t[i].cpu);
    free(ts->t);
    memset(ts, 0, sizeof *ts);
}

int zb_threads_clone(zb_threads *dst, const zb_threads *src, size_t xsave_size) {
    *dst = *src;
    dst->t = calloc((size_t)src->cap, sizeof *dst->t);
    if (!dst->t) return -1;
    for (int i = 0; i < src->cap; i++) {
        dst->t[i] = src->t[i];
        dst->t[i].cpu.xsave = NULL;
        if (src->t[i].cpu.xsave && zb_cpu_clone(&dst->t[i].cpu, &src->t[i].cpu, xsave_size) < 0) {
            zb_threads_free(dst);
            return -1;
        }
    }
    dst->need_xsave_for = -1;
    dst->switch_request = 0;
    return 0;
}

int zb_threads_find(const zb_threads *ts, int32_t tid) {
    if (tid <= 0) return -1;
    for (int i = 0; i < ts->cap; i++)
        if (ts->t[i].tid == tid) return i;
    return -1;
}

int zb_threads_new_slot(zb_threads *ts, size_t xsave_size) {
    if (ts->count >= ts->max_threads || ts->next_tid >= INT32_MAX / 2) return -1;
    int slot = -1;
    for (int i = 0; i < ts->cap && slot < 0; i++)
        if (!ts->t[i].tid) slot = i;
    if (slot < 0) {
        int cap = ZB_MIN(ts->cap * 2, ZB_THREADS_MAX);
        if (cap <= ts->cap) return -1;
        zb_thread *nt = realloc(ts->t, (size_t)cap * sizeof *nt);
        if (!nt) return -1;
        memset(nt + ts->cap, 0, (size_t)(cap - ts->cap) * sizeof *nt);
        slot = ts->cap;
        ts->t = nt;
        ts->cap = cap;
    }
    zb_thread *t = &ts->t[slot];
    zb_cpu_free(&t->cpu);
    memset(t, 0, sizeof *t);
    if (!(t->cpu.xsave = calloc(1, xsave_size))) return -1;
    t->tid = ts->next_tid++;
    t->state = ZB_THREAD_RUNNABLE;
    t->wake_ns = INT64_MAX;
    ts->count++;
    return slot;
}

void zb_threads_remove(zb_threads *ts, int slot) {
    zb_cpu_free(&ts->t[slot].cpu);
    memset(&ts->t[slot], 0, sizeof ts->t[slot]);
    ts->count--;
}

void zb_threads_resume(zb_threads *ts, int slot, long result) {
    zb_thread *t = &ts->t[slot];
    t->state = ZB_THREAD_RUNNABLE;
    t->wake_ns = INT64_MAX;
    t->futex_addr = 0;
    /* a waiting thread is parked (run_threads.c), the running one's included: its slot holds its state */
    if (result == -EINTR && t->cpu.pending_syscall) { zb_cpu_interrupted(&t->cpu); return; } /* a whole write's count */
    t->cpu.regs.rax = (uint64_t)result;
    zb_cpu_syscall_done(&t->cpu);
}

int zb_threads_futex_wake(zb_threads *ts, uint64_t addr, uint32_t bitset, int n) {
    int woken = 0;
    while (woken < n) {
        int best = -1;
        for (int i = 0; i < ts->cap; i++) {
            const zb_thread *t = &ts->t[i];
            if (t->tid && t->state == ZB_THREAD_FUTEX && t->futex_addr == addr && (t->futex_bitset & bitset) &&
                (best < 0 || t->wait_seq < ts->t[best].wait_seq))
                best = i;
        }
        if (best < 0) break;
        zb_threads_resume(ts, best, 0);
        woken++;
    }
    return woken;
}

int zb_threads_futex_waiters(const zb_threads *ts, uint64_t addr) {
    int n = 0;
    for (int i = 0; i < ts->cap; i++)
        n += ts->t[i].tid && ts->t[i].state == ZB_THREAD_FUTEX && ts->t[i].futex_addr == addr;
    return n;
}

int zb_threads_futex_requeue(zb_threads *ts, uint64_t addr, uint64_t addr2, int n) {
    int moved = 0;
    while (moved < n) { /* oldest first, so the queue order carries over */
        int best = -1;
        for (int i = 0; i < ts->cap; i++) {
            const zb_thread *t = &ts->t[i];
            if (t->tid && t->state == ZB_THREAD_FUTEX && t->futex_addr == addr &&
                (best < 0 || t->wait_seq < ts->t[best].wait_seq))
                best = i;
        }
        if (best < 0) break;
        ts->t[best].futex_addr = addr2;
        ts->t[best].wait_seq = ++ts->wait_seq; /* behind addr2's waiters */
        moved++;
    }
    return moved;
}

int64_t zb_threads_next_wake(const zb_threads *ts) {
    int64_t at = INT64_MAX;
    for (int i = 0; i < ts->cap; i++)
        if (i != ts->current && ts->t[i].tid && ts->t[i].state != ZB_THREAD_RUNNABLE) at = ZB_MIN(at, ts->t[i].wake_ns);
    return at;
}

__thread uint64_t zb_wake_gen; /* per thread: an engine and its sandboxes run on one thread at a time */

int zb_thread_retry_may_go_on(const zb_thread *t) { return t->state == ZB_THREAD_RETRY && t->wait_gen != zb_wake_gen; }

int zb_threads_others_runnable(const zb_threads *ts, int with_retry) {
    for (int i = 0; i < ts->cap; i++)
        if (i != ts->current && ts->t[i].tid &&
            (ts->t[i].state == ZB_THREAD_RUNNABLE || (with_retry && ts->t[i].state == ZB_THREAD_RETRY) ||
             zb_thread_retry_may_go_on(&ts->t[i])))
            return 1;
    return 0;
}

int64_t zb_threads_timer_horizon(const zb_threads *ts) {
    if (ts->count <= 1) return INT64_MAX;
    int64_t at = zb_threads_next_wake(ts);
    if (zb_threads_others_runnable(ts, 1)) at = ZB_MIN(at, ts->slice_start_ns + ZB_THREAD_SLICE_NS);
    return at;
}

/* ---- on disk ----
 * count, current slot index among the saved threads, next tid, then per live thread: tid, state,
 * signal mask, pending, alternate stack, clear_child_tid, robust list, futex address and bitset,
 * whether it waits with a timeout, and its saved vCPU state. Wake times are host
 * CLOCK_MONOTONIC values: a loaded waiter with a timeout wakes at once (ETIMEDOUT, or its
 * syscall is served again), as after a host suspend; one without waits on. */
void zb_threads_save(const zb_threads *ts, size_t xsave_size, struct zb_out *o) {
    out_u32(o, (uint32_t)ts->count);
    int cur = 0;
    for (int i = 0, k = 0; i < ts->cap; i++)
        if (ts->t[i].tid) { if (i == ts->current) cur = k; k++; }
    out_u32(o, (uint32_t)cur);
    out_u32(o, (uint32_t)ts->next_tid);
    for (int i = 0; i < ts->cap; i++) {
        const zb_thread *t = &ts->t[i];
        if (!t->tid) continue;
        out_u32(o, (uint32_t)t->tid);
        out_u32(o, (uint32_t)t->state);
        out_u64(o, t->blocked);
        out_u64(o, t->pending);
        out_u64(o, t->altstack_sp);
        out_u64(o, t->altstack_size);
        out_u32(o, (uint32_t)t->altstack_flags);
        out_u64(o, t->clear_child_tid);
        out_u64(o, t->robust_list);
        out_u64(o, t->robust_len);
        out_u64(o, t->futex_addr);
        out_u32(o, t->futex_bitset);
        out_u32(o, t->wake_ns != INT64_MAX ? 1 : 0);
        zb_cpu_save(&t->cpu, xsave_size, o); /* the running thread's too: stale, but it is the
                                                   state a waiting running thread resumes from */
    }
}

int zb_threads_load(zb_threads *ts, size_t xsave_size, struct zb_in *in, char *err) {
    memset(ts, 0, sizeof *ts);
    uint32_t count = in_u32(in), cur = in_u32(in), next_tid = in_u32(in);
    if (in->err || count < 1 || count > ZB_THREADS_MAX || cur >= count || next_tid < 2 || next_tid >= INT32_MAX / 2) {
        zb_seterr(err, "thread table: truncated, or an impossible thread count");
        return -1;
    }
    if (!(ts->t = calloc(count, sizeof *ts->t))) { zb_seterr(err, "out of memory"); return -1; }
    ts->cap = ts->count = (int)count;
    ts->current = (int)cur;
    ts->next_tid = (int32_t)next_tid;
    ts->max_threads = ZB_THREADS_DEFAULT; /* the sandbox's setting is kept by a restore (snapshot.c) */
    ts->need_xsave_for = -1;
    int64_t now = zb_now_ns();
    for (uint32_t i = 0; i < count; i++) {
        zb_thread *t = &ts->t[i];
        uint32_t tid = in_u32(in), state = in_u32(in);
        t->blocked = in_u64(in);
        t->pending = in_u64(in);
        t->altstack_sp = in_u64(in);
        t->altstack_size = in_u64(in);
        t->altstack_flags = (int)in_u32(in);
        t->clear_child_tid = in_u64(in);
        t->robust_list = in_u64(in);
        t->robust_len = in_u64(in);
        t->futex_addr = in_u64(in);
        t->futex_bitset = in_u32(in);
        uint32_t timed = in_u32(in);
        int bad = in->err || tid < 1 || tid >= next_tid || zb_threads_find(ts, (int32_t)tid) >= 0 ||
                  state < ZB_THREAD_RUNNABLE || state > ZB_THREAD_RETRY || timed > 1 ||
                  (t->blocked & ZB_SIG_UNBLOCKABLE) || (t->futex_addr & 3);
        if (bad) {
            zb_threads_free(ts);
            zb_seterr(err, "thread table: truncated or corrupt (thread %u)", i);
            return -1;
        }
        if (zb_cpu_load(&t->cpu, xsave_size, in, err) < 0) {
            zb_threads_free(ts);
            return -1;
        }
        t->tid = (int32_t)tid;
        t->state = (int)state;
        t->wake_ns = timed ? now : INT64_MAX;
        t->wait_seq = i;
    }
    ts->wait_seq = count;
    if (ts->t[cur].state != ZB_THREAD_RUNNABLE && ts->t[cur].state != ZB_THREAD_FUTEX) {
        zb_threads_free(ts);
        zb_seterr(err, "thread table: corrupt (the running thread waits in a syscall it yielded)");
        return -1;
    }
    return 0;
}
