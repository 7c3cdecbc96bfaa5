/* run_threads.c - switching guest threads on the sandbox's one vCPU (M:1), for the run loop.
 *
 * The running thread's state is the sandbox's (sb->cpu, sb->sig.blocked and alternate stack; the
 * vCPU holds its registers and XSAVE image while attached). A switch parks it (XSAVE read back
 * from the vCPU, everything copied into its table slot) and loads another slot into sb->cpu and
 * the vCPU. Switches happen when the running thread blocks (futex wait, a sleep or poll that
 * yielded: ZB_SYSCALL_BLOCK), exits, calls sched_yield, at the end of its time slice
 * (ZB_THREAD_SLICE_NS, when another thread can run), and at once when a waiting thread's timeout
 * passes (CPython's GIL hand-off relies on a 5 ms timed wait of the waiting thread). The run's
 * wake-up timer (run_events.c) fires at the next of those times, so a thread spinning without
 * syscalls is preempted like any guest code is stopped at a deadline.
 *
 * When no thread can run, the run loop waits here (idle_wait) until a timeout passes, a signal
 * makes a waiter runnable, or the run's deadline or a kick comes: a deadlock of the guest's
 * threads is the cell blocking, never an engine hang.
 *
 * Process-directed signals (the kernel's SIGINT, kill) go to the main thread when it does not
 * block them, as Linux picks the thread group leader first, else to the running thread, else to
 * any thread that does not block them; a waiting thread that takes one fails its wait with EINTR.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "process.h"
#include "sandbox_state.h"
#include "run.h"
#include "fs.h"

#include <poll.h>
#include <sys/syscall.h>

/* Copy a thread's vCPU state without replacing dst's XSAVE buffer (both are xsave_size bytes). */
static void cpu_copy(zb_cpu *dst, const zb_cpu *src, size_t xsave_size) {
    uint8_t *keep = dst->xsave;
    *dst = *src;
    dst->xsave = keep;
    memcpy(dst->xsave, src->xsave, xsave_size);
}

/* The running thread (slot current, loaded) goes into its slot. */
static int park(zb_sandbox *sb, zb_vm *vm, zb_event *ev) {
    zb_threads *ts = &sb->threads;
    zb_thread *t = &ts->t[ts->current];
    char err[ZB_ERRLEN];
    if (zb_vm_save_xsave(vm, sb, err) < 0) { zb_run_error(sb, ev, "thread switch: %s", err); return -1; }
    cpu_copy(&t->cpu, &sb->cpu, sb->engine->xsave_size);
    t->blocked = sb->sig.blocked;
    t->altstack_sp = sb->sig.altstack_sp;
    t->altstack_size = sb->sig.altstack_size;
    t->altstack_flags = sb->sig.altstack_flags;
    return 0;
}

/* Load a parked slot into the sandbox and the vCPU. 0, or 1 if an event ends the run. */
static int load(zb_sandbox *sb, zb_vm *vm, int slot, zb_event *ev) {
    zb_threads *ts = &sb->threads;
    zb_thread *t = &ts->t[slot];
    cpu_copy(&sb->cpu, &t->cpu, sb->engine->xsave_size);
    sb->sig.blocked = t->blocked;
    sb->sig.altstack_sp = t->altstack_sp;
    sb->sig.altstack_size = t->altstack_size;
    sb->sig.altstack_flags = t->altstack_flags;
    sb->sig.pending |= t->pending; /* its own signals: delivered now that it runs */
    t->pending = 0;
    t->state = ZB_THREAD_RUNNABLE; /* a RETRY thread keeps its pending syscall: served again next */
    t->wake_ns = INT64_MAX;
    ts->current = slot;
    ts->slice_start_ns = zb_now_ns();
    ts->preempt = 0;
    ts->switches++;
    if (sb->cpu.pending_syscall) { /* a yielded sleep or poll: a signal it takes interrupts it */
        uint64_t ready = sb->sig.pending & ~sb->sig.blocked;
        for (int sig = 1; sig <= 64 && ready; sig++)
            if ((ready & ZB_SIG_BIT(sig)) && zb_signal_interrupts(sb, sig)) {
                zb_cpu_interrupted(&sb->cpu);
                break;
            }
    }
    char err[ZB_ERRLEN];
    if (zb_vm_load_thread(vm, sb, err) < 0) { zb_run_error(sb, ev, "thread switch: %s", err); return 1; }
    if (!sb->cpu.pending_syscall && (sb->sig.pending & ~sb->sig.blocked) &&
        (zb_run_deliver_signals(sb, ev) || zb_run_set_user_state(sb, vm, ev) < 0))
        return 1;
    zb_run_timer_update(sb);
    return 0;
}

void zb_run_threads_load_parked(zb_sandbox *sb) {
    zb_threads *ts = &sb->threads;
    sb->vcpu_stale = 1; /* it may still be attached to its executor (vm.h child_vms): reloaded before it runs */
    zb_thread *t = &ts->t[ts->current];
    cpu_copy(&sb->cpu, &t->cpu, sb->engine->xsave_size);
    sb->sig.blocked = t->blocked;
    sb->sig.altstack_sp = t->altstack_sp;
    sb->sig.altstack_size = t->altstack_size;
    sb->sig.altstack_flags = t->altstack_flags;
    sb->sig.pending |= t->pending;
    t->pending = 0;
}

/* Waiters whose timeout passed become runnable (a futex wait fails with ETIMEDOUT; a yielded
 * syscall is served again and finds its time up). 1 if any did. */
static int expire(zb_threads *ts, int64_t now) {
    int any = 0;
    for (int i = 0; i < ts->cap; i++) {
        zb_thread *t = &ts->t[i];
        if (!t->tid || t->state == ZB_THREAD_RUNNABLE || t->wake_ns > now) continue;
        if (t->state == ZB_THREAD_FUTEX) zb_threads_resume(ts, i, -ETIMEDOUT);
        else { t->state = ZB_THREAD_RUNNABLE; t->wake_ns = INT64_MAX; } /* RETRY: served again */
        any = 1;
    }
    return any;
}

static int takes_signal(const zb_sandbox *sb, int slot, int sig) {
    const zb_threads *ts = &sb->threads;
    int loaded = slot == ts->current && ts->t[slot].state == ZB_THREAD_RUNNABLE;
    return !((loaded ? sb->sig.blocked : ts->t[slot].blocked) & ZB_SIG_BIT(sig));
}

/* Which thread the lowest routable pending process signal goes to, when that is not the loaded
 * running thread: it is made runnable (EINTR, if it waits and the signal interrupts it) and its
 * slot returned; -1 when the running thread takes it (or nobody can). */
static int route_signals(zb_sandbox *sb) {
    zb_threads *ts = &sb->threads;
    uint64_t p = sb->sig.pending;
    int cur_loaded = ts->t[ts->current].state == ZB_THREAD_RUNNABLE;
    int main_slot = zb_threads_find(ts, sb->proc.pid ? sb->proc.pid : 1); /* the thread whose tid is the pid */
    for (int sig = 1; sig <= 64 && p; sig++) {
        if (!(p & ZB_SIG_BIT(sig))) continue;
        p &= ~ZB_SIG_BIT(sig);
        int target = -1;
        if (main_slot >= 0 && takes_signal(sb, main_slot, sig)) target = main_slot;
        else if (cur_loaded && takes_signal(sb, ts->current, sig)) target = ts->current;
        else
            for (int i = 0; i < ts->cap && target < 0; i++)
                if (ts->t[i].tid && takes_signal(sb, i, sig)) target = i;
        if (target < 0) continue; /* blocked everywhere: stays pending */
        if (target == ts->current && cur_loaded) return -1;
        zb_thread *t = &ts->t[target];
        if (t->state != ZB_THREAD_RUNNABLE) {
            if (!zb_signal_interrupts_mask(sb, sig, t->blocked)) continue; /* ignored: discarded when delivered */
            zb_threads_resume(ts, target, -EINTR);
        }
        return target;
    }
    return -1;
}

/* The next thread to run after `from` in round-robin order (RUNNABLE or RETRY), `from` itself
 * last if allowed; -1 if none. */
static int pick(const zb_threads *ts, int from, int allow_from) {
    for (int k = 1; k <= ts->cap; k++) {
        int i = (from + k) % ts->cap;
        if (i == from && !allow_from) break;
        const zb_thread *t = &ts->t[i];
        if (t->tid && (t->state == ZB_THREAD_RUNNABLE || t->state == ZB_THREAD_RETRY)) return i;
    }
    return -1;
}

/* The process gives the VM up to another process of its family (family_run.c): its threads stay
 * as they are (parked, or the running one's state in sb->cpu) and the run ends with the internal
 * event ZB_EVENT_PROC_YIELD. Returns 1 (an event ends the run). */
static int yield_process(zb_sandbox *sb, zb_event *ev) {
    memset(ev, 0, sizeof *ev);
    ev->kind = ZB_EVENT_PROC_YIELD;
    sb->threads.preempt = 0;
    return 1;
}

/* Nothing can run: wait for a timeout, a signal, the deadline or a kick (as zb_sleep_until). Then
 * load the thread that can run. 0, or 1 with an event (the threads stay as they are). With other
 * processes in the family that can run, the process yields to them instead. */
static int idle_wait(zb_sandbox *sb, zb_vm *vm, zb_event *ev) {
    zb_threads *ts = &sb->threads;
    for (;;) {
        int64_t now = zb_now_ns();
        expire(ts, now);
        if (sb->fam) zb_family_alarms_check(sb->fam, sb, now); /* another process's alarm: it can run */
        int slot = route_signals(sb);
        if (slot < 0 && sb->fam && zb_family_others_runnable(sb, now)) return yield_process(sb, ev);
        if (slot < 0) slot = pick(ts, ts->current, 1);
        if (slot >= 0) return load(sb, vm, slot, ev);
        int kind = 0;
        if (zb_take_kick(sb)) kind = ZB_EVENT_KICK;
        else if (zb_run_deadline_ns && now >= zb_run_deadline_ns) kind = ZB_EVENT_TIMEOUT;
        if (kind) {
            memset(ev, 0, sizeof *ev);
            ev->kind = kind;
            return 1;
        }
        if (sb->sig.alarm_ns && zb_alarm_check(sb, now)) { zb_run_timer_update(sb); continue; } /* SIGALRM: routed next */
        int64_t until = INT64_MAX;
        for (int i = 0; i < ts->cap; i++)
            if (ts->t[i].tid && ts->t[i].state != ZB_THREAD_RUNNABLE) until = ZB_MIN(until, ts->t[i].wake_ns);
        if (zb_run_deadline_ns) until = ZB_MIN(until, zb_run_deadline_ns);
        if (sb->sig.alarm_ns) until = ZB_MIN(until, sb->sig.alarm_ns);
        if (sb->fam) until = ZB_MIN(until, zb_family_next_wake(sb));
        int64_t ns = ZB_MIN(ZB_MAX(until - now, 0), (int64_t)3600 * 1000000000);
        struct timespec tsp = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
        zb_wait_ppoll(NULL, 0, &tsp, &zb_run_wait_sigmask); /* returns early on the kick signal */
    }
}

/* Switch from the running thread (loaded: runnable, or just blocked) to `target` or the next one. */
static int switch_away(zb_sandbox *sb, zb_vm *vm, int target, zb_event *ev) {
    zb_threads *ts = &sb->threads;
    if (park(sb, vm, ev) < 0) return 1;
    if (target < 0) target = route_signals(sb);
    if (target < 0) target = pick(ts, ts->current, ts->t[ts->current].state == ZB_THREAD_RUNNABLE);
    if (target < 0) return idle_wait(sb, vm, ev);
    /* only yielded syscalls are left to serve again: another process that can run goes first */
    if (sb->fam && ts->t[target].state != ZB_THREAD_RUNNABLE && zb_family_others_runnable(sb, zb_now_ns()))
        return yield_process(sb, ev);
    return load(sb, vm, target, ev);
}

int zb_run_threads_block(zb_sandbox *sb, zb_vm *vm, uint64_t nr, zb_event *ev) {
    zb_threads *ts = &sb->threads;
    if (ts->switch_request == 2) { /* exit of this thread: nothing to park */
        ts->switch_request = 0;
        int gone = ts->current;
        zb_threads_remove(ts, gone);
        int next = pick(ts, gone, 0);
        if (next < 0) { /* everyone waits: idle on any of them */
            for (int i = 0; i < ts->cap && next < 0; i++)
                if (ts->t[i].tid) next = i;
            ts->current = next;
            return idle_wait(sb, vm, ev);
        }
        ts->current = next; /* parked already: load it without parking */
        return load(sb, vm, next, ev);
    }
    zb_thread *me = &ts->t[ts->current];
    if (me->state == ZB_THREAD_RETRY) { /* the syscall is served again when the thread runs */
        sb->cpu.pending_syscall = 1;
        sb->cpu.pending_nr = nr;
    } else {
        zb_cpu_syscall_done(&sb->cpu);
    }
    return switch_away(sb, vm, -1, ev);
}

int zb_run_threads_after_syscall(zb_sandbox *sb, zb_vm *vm, zb_event *ev) {
    zb_threads *ts = &sb->threads;
    if (ts->need_xsave_for >= 0) { /* clone: the new thread starts with the caller's FPU/SSE/AVX state */
        char err[ZB_ERRLEN];
        int slot = ts->need_xsave_for;
        ts->need_xsave_for = -1;
        if (zb_vm_save_xsave(vm, sb, err) < 0) { zb_run_error(sb, ev, "clone: %s", err); return 1; }
        memcpy(ts->t[slot].cpu.xsave, sb->cpu.xsave, sb->engine->xsave_size);
        zb_run_timer_update(sb);
    }
    if (ts->switch_request == 1) { /* sched_yield */
        ts->switch_request = 0;
        return switch_away(sb, vm, -1, ev);
    }
    return 0;
}

/* The thread (not the loaded running one) whose blocking read of the UART yielded to the other
 * threads between requests (zb_wait_input), when the host has pushed input since: it runs first,
 * so the request is served at once rather than after another thread's slice or sleep. Found from
 * the thread's pending syscall (a read of a UART file, so a restored snapshot needs no mark; or
 * one zb_wait_input marked: the agent's poll of the UART and its asyncio loop's wake-up socket,
 * agent_loop.py). -1 if there is none. */
static int input_reader(zb_sandbox *sb) {
    const zb_threads *ts = &sb->threads;
    if (!zb_uart_rx_available(&sb->uart)) return -1;
    for (int i = 0; i < ts->cap; i++) {
        const zb_thread *t = &ts->t[i];
        if (!t->tid || i == ts->current || t->state == ZB_THREAD_FUTEX) continue;
        if (!t->cpu.pending_syscall) continue;
        if (t->cpu.waits_input) return i;
        if (t->cpu.pending_nr != SYS_read) continue;
        const zb_file *f = zb_fd_get(sb, t->cpu.regs.rdi);
        if (f && f->kind == FILE_DEV && f->dev == DEV_UART) return i;
    }
    return -1;
}

int zb_run_threads_start(zb_sandbox *sb, zb_vm *vm, zb_event *ev) {
    zb_threads *ts = &sb->threads;
    int64_t now = zb_now_ns();
    ts->slice_start_ns = now;
    /* The current thread waited when the last run ended (a kick, the deadline or a yield to another
     * process stopped the wait): it is parked, and a wake-up (its timeout just now, a signal, a
     * futex wake by another thread) wrote its result into its slot, not into sb->cpu, which still
     * holds its state at the blocked syscall (rax: the syscall number). It must be loaded, never
     * run from sb->cpu, even when it is runnable again. */
    int parked = ts->t[ts->current].state != ZB_THREAD_RUNNABLE;
    expire(ts, now);
    int target = route_signals(sb);
    if (target < 0) target = input_reader(sb);
    if (parked || ts->t[ts->current].state != ZB_THREAD_RUNNABLE) { /* it waits, or waited */
        if (target < 0) target = pick(ts, ts->current, 1);
        if (target < 0) return idle_wait(sb, vm, ev);
        return load(sb, vm, target, ev);
    }
    if (target < 0) { zb_run_timer_update(sb); return 0; }
    /* the signal (or the pushed input) is another thread's (the main thread's, usually): switch to it. A run that ended on
     * a kick or the deadline stopped the running thread anywhere in user code without reading its
     * registers, so sb->cpu holds those of its last syscall: read them before parking it. Mid-trap,
     * the trap's syscall is served first and the next tick switches. (A thread stopped inside a
     * syscall, pending_syscall, is described by sb->cpu already.) */
    if (!sb->cpu.pending_syscall) {
        int r = zb_run_sync_regs(sb, vm, ev);
        if (r < 0) return 1;
        if (r > 0) { ts->preempt = 1; zb_run_timer_update(sb); return 0; }
    }
    return switch_away(sb, vm, target, ev);
}

int zb_run_threads_tick(zb_sandbox *sb, zb_vm *vm, zb_event *ev) {
    zb_threads *ts = &sb->threads;
    /* a syscall woke or cloned a thread (or a waiter began a timed wait): the time slice of the
     * running thread, or that timeout, must stop it */
    if (zb_threads_timer_horizon(ts) != ts->armed_horizon) zb_run_timer_update(sb);
    int64_t now = zb_now_ns();
    /* a syscall made another process runnable (a vfork child's execve lets its parent go on; a
     * write, a kill, a futex wake): the slice must end for it even if this one never exits again */
    if (sb->fam && !ts->armed_for_procs && zb_family_others_runnable(sb, now)) zb_run_timer_update(sb);
    if (expire(ts, now)) ts->preempt = 1;
    /* another process's alarm went off (the wake timer): it waits for the VM now, re-armed for the slice */
    if (sb->fam && zb_family_alarms_check(sb->fam, sb, now)) zb_run_timer_update(sb);
    int target = sb->sig.pending ? route_signals(sb) : -1;
    if (target >= 0) ts->preempt = 1; /* switched to at once, or at the next tick if mid-trap */
    int slice_end = now - ts->slice_start_ns >= ZB_THREAD_SLICE_NS;
    int slice_over = slice_end && zb_threads_others_runnable(ts, 1);
    /* another process of the family waits for the VM: at the end of the slice it gets it */
    int procs_wait = now - ts->slice_start_ns >= ZB_PROC_SLICE_NS && target < 0 && sb->fam && zb_family_others_runnable(sb, now);
    if (target < 0 && !ts->preempt && !slice_over && !procs_wait) return 0;
    (void)slice_end;
    int r = zb_run_sync_regs(sb, vm, ev);
    if (r < 0) return 1;
    if (r > 0) return 0; /* mid-trap: after the trap's syscall, the next tick switches */
    if (procs_wait) { ts->slice_start_ns = now; return yield_process(sb, ev); } /* sb->cpu holds the running thread */
    if (target < 0 && !zb_threads_others_runnable(ts, 1)) { ts->preempt = 0; ts->slice_start_ns = now; zb_run_timer_update(sb); return 0; }
    return switch_away(sb, vm, target, ev);
}
