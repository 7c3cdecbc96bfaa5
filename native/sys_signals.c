/* sys_signals.c - the signal syscalls: dispositions, masks, the alternate stack, kill/tgkill aimed
 * at the guest itself, waiting for a signal, and rt_sigreturn.
 *
 * Signals come from the host (zb_sandbox_raise: the kernel's KeyboardInterrupt) or from the guest
 * itself (kill/tgkill, e.g. abort()). Their delivery (the rt_sigframe) and rt_sigreturn's reading of
 * it are not syscalls: they are in signals.c, which the run loop calls too.
 */
#include "memory.h"
#include "process.h"
#include "sandbox_state.h"
#include "linux.h"

#include <signal.h>
#include <sys/syscall.h>

static long sys_rt_sigaction(zb_sandbox *sb, const uint64_t a[6]) {
    int sig = (int)a[0];
    if (sig < 1 || sig > 64 || a[3] != 8) return -EINVAL;
    zb_sigaction old = sb->sig.action[sig];
    if (a[1]) {
        if (sig == SIGKILL || sig == SIGSTOP) return -EINVAL;
        zb_sigaction act;
        if (zb_copy_from_guest(sb, &act, a[1], sizeof act) < 0) return -EFAULT;
        act.mask &= ~ZB_SIG_UNBLOCKABLE;
        sb->sig.action[sig] = act;
    }
    if (a[2] && zb_copy_to_guest(sb, a[2], &old, sizeof old) < 0) return -EFAULT;
    return 0;
}

static long sys_rt_sigprocmask(zb_sandbox *sb, const uint64_t a[6]) {
    if (a[3] != 8) return -EINVAL;
    uint64_t old = sb->sig.blocked;
    if (a[1]) {
        uint64_t set;
        if (zb_copy_from_guest(sb, &set, a[1], 8) < 0) return -EFAULT;
        switch (a[0]) {
        case SIG_BLOCK: sb->sig.blocked |= set; break;
        case SIG_UNBLOCK: sb->sig.blocked &= ~set; break;
        case SIG_SETMASK: sb->sig.blocked = set; break;
        default: return -EINVAL;
        }
        sb->sig.blocked &= ~ZB_SIG_UNBLOCKABLE;
    }
    if (a[2] && zb_copy_to_guest(sb, a[2], &old, 8) < 0) return -EFAULT;
    return 0;
}

static long sys_rt_sigpending(zb_sandbox *sb, const uint64_t a[6]) {
    uint64_t p = sb->sig.pending & sb->sig.blocked;
    return zb_copy_to_guest(sb, a[0], &p, 8);
}

static long sys_sigaltstack(zb_sandbox *sb, const uint64_t a[6]) {
    struct { uint64_t sp; int32_t flags, pad; uint64_t size; } ss, old;
    old.sp = sb->sig.altstack_sp;
    old.flags = sb->sig.altstack_size ? sb->sig.altstack_flags : SS_DISABLE;
    old.pad = 0;
    old.size = sb->sig.altstack_size;
    if (a[0]) {
        if (zb_copy_from_guest(sb, &ss, a[0], sizeof ss) < 0) return -EFAULT;
        if (ss.flags & SS_DISABLE) { sb->sig.altstack_sp = sb->sig.altstack_size = 0; }
        else {
            if (ss.size < 2048) return -ENOMEM;
            sb->sig.altstack_sp = ss.sp;
            sb->sig.altstack_size = ss.size;
            sb->sig.altstack_flags = ss.flags;
        }
    }
    if (a[1] && zb_copy_to_guest(sb, a[1], &old, sizeof old) < 0) return -EFAULT;
    return 0;
}

/* kill aimed at the guest itself queues the signal (tkill/tgkill: sys_threads.c); it is delivered when the syscall
 * returns. There is no other process to signal. */
static long queue_self(zb_sandbox *sb, int64_t pid, int sig) {
    if (pid != 0 && pid != 1 && pid != -1) return -ESRCH;
    if (sig < 0 || sig > 64) return -EINVAL;
    if (sig) sb->sig.pending |= ZB_SIG_BIT(sig);
    return 0;
}
static long sys_kill(zb_sandbox *sb, const uint64_t a[6]) { return queue_self(sb, (int64_t)a[0], (int)a[1]); }

/* A pending signal that the wait would end for (handled or fatal, not blocked). */
static int signal_ready(const zb_sandbox *sb) {
    uint64_t ready = sb->sig.pending & ~sb->sig.blocked;
    for (int sig = 1; sig <= 64 && ready; sig++)
        if ((ready & ZB_SIG_BIT(sig)) && zb_signal_interrupts(sb, sig)) return 1;
    return 0;
}

/* Waiting for a signal with a temporary mask (restored when the handler of the signal that ends
 * the wait returns: its frame carries the old mask). The host or another thread or process sends
 * it; the wait yields to them (zb_sleep_until) and is served again. */
static long sys_rt_sigsuspend(zb_sandbox *sb, const uint64_t a[6]) {
    if (!sb->cpu.pending_syscall) { /* the first time, not served again */
        uint64_t mask;
        if (a[1] != 8) return -EINVAL;
        if (zb_copy_from_guest(sb, &mask, a[0], 8) < 0) return -EFAULT;
        if (!sb->sig.suspend_restore) sb->sig.suspend_mask = sb->sig.blocked;
        sb->sig.suspend_restore = 1;
        sb->sig.blocked = mask & ~ZB_SIG_UNBLOCKABLE;
    }
    if (signal_ready(sb)) return -EINTR; /* one came already (a child's SIGCHLD blocked until now) */
    long r = zb_sleep_until(sb, INT64_MAX);
    return r == 0 ? -EINTR : r;
}

static long sys_pause(zb_sandbox *sb, const uint64_t a[6]) {
    (void)a;
    if (signal_ready(sb)) return -EINTR;
    long r = zb_sleep_until(sb, INT64_MAX);
    return r == 0 ? -EINTR : r;
}

/* rt_sigtimedwait(set, info, timeout, sigsetsize) (sigwait, sigwaitinfo, sigtimedwait): take the
 * lowest pending signal of `set` without running its handler, and return its number (its siginfo
 * to `info`: a signal the guest or the host raised reads as SI_USER). With none pending it waits
 * like a sleep (served again after yielding to other threads and processes, which may send one)
 * until one is, the timeout passes (EAGAIN; a zero timeout polls), or another signal that is not
 * blocked ends the wait (EINTR: its handler runs). As POSIX asks, the signals of `set` should be
 * blocked: one that is not is delivered to its handler instead (the run loop delivers unblocked
 * signals before serving the wait again). */
static long sys_rt_sigtimedwait(zb_sandbox *sb, const uint64_t a[6]) {
    uint64_t set;
    if (a[3] != 8) return -EINVAL;
    if (zb_copy_from_guest(sb, &set, a[0], 8) < 0) return -EFAULT;
    if (a[1] && !zb_guest_ptr(sb, a[1], 128, 1)) return -EFAULT;
    set &= ~ZB_SIG_UNBLOCKABLE;
    int64_t wake = INT64_MAX;
    if (sb->cpu.pending_wake_ns) wake = sb->cpu.pending_wake_ns; /* served again: the first deadline */
    else if (a[2]) {
        struct { int64_t sec, nsec; } ts;
        if (zb_copy_from_guest(sb, &ts, a[2], sizeof ts) < 0) return -EFAULT;
        if (ts.sec < 0 || ts.nsec < 0 || ts.nsec >= 1000000000) return -EINVAL;
        int64_t ns = ts.sec > INT64_MAX / 1000000000 / 4 ? INT64_MAX / 4 : ts.sec * 1000000000 + ts.nsec;
        wake = zb_now_ns() + ns;
    }
    for (;;) {
        if (sb->sig.alarm_ns) zb_alarm_check(sb, zb_now_ns()); /* its SIGALRM may be what it waits for */
        uint64_t ready = sb->sig.pending & set;
        if (ready) {
            int sig = __builtin_ctzll(ready) + 1;
            sb->sig.pending &= ~ZB_SIG_BIT(sig);
            if (a[1]) {
                struct { int32_t signo, errno_, code, pad; uint8_t rest[112]; } info;
                memset(&info, 0, sizeof info);
                info.signo = sig; /* code 0: SI_USER */
                if (zb_copy_to_guest(sb, a[1], &info, sizeof info) < 0) return -EFAULT;
            }
            return sig;
        }
        if (signal_ready(sb)) return -EINTR; /* another signal, handled or fatal, ends the wait */
        /* While it sleeps the set counts as unblocked, as Linux waits (so the guest's alarm ends a
         * wait for SIGALRM); the mask is the thread's own again whenever the syscall is not in
         * progress, so a signal of the set that came meanwhile is taken above, never handled. */
        uint64_t blocked = sb->sig.blocked;
        sb->sig.blocked &= ~set;
        long r = zb_sleep_until(sb, wake);
        sb->sig.blocked = blocked;
        if (r == 0 && !(sb->sig.pending & set)) return -EAGAIN; /* the timeout passed (at once for a zero timeout) */
        if (r == ZB_SYSCALL_BLOCK && sb->sig.alarm_ns && (set & ZB_SIG_BIT(SIGALRM))) {
            /* parked (its mask is its own): the scheduler runs it again at the alarm, which it waits for */
            zb_thread *me = &sb->threads.t[sb->threads.current];
            me->wake_ns = ZB_MIN(me->wake_ns, sb->sig.alarm_ns);
        }
        if (r != 0 && r != -EINTR) return r; /* yielded or stopped: served again (pending_wake_ns keeps the deadline) */
        /* -EINTR: the guest's alarm went off (SIGALRM queued): taken above if it is in `set` */
    }
}

static long sys_rt_sigreturn(zb_sandbox *sb, const uint64_t a[6]) {
    (void)a;
    return zb_signals_sigreturn(sb);
}

void zb_sys_signals_register(zb_syscall_fn *t) {
    t[SYS_rt_sigaction] = sys_rt_sigaction;
    t[SYS_rt_sigprocmask] = sys_rt_sigprocmask;
    t[SYS_rt_sigpending] = sys_rt_sigpending;
    t[SYS_sigaltstack] = sys_sigaltstack;
    t[SYS_rt_sigreturn] = sys_rt_sigreturn;
    t[SYS_rt_sigsuspend] = sys_rt_sigsuspend;
    t[SYS_rt_sigtimedwait] = sys_rt_sigtimedwait;
    t[SYS_pause] = sys_pause;
    t[SYS_kill] = sys_kill;
}
