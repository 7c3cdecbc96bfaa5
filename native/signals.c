/* signals.c - a sandbox's signal state (zb_signals), the delivery of its pending signals with
 * Linux's x86-64 frame layout, rt_sigreturn's restore from that frame, the alarm's expiry, and the
 * state's copy and on-disk form for snapshots.
 *
 * This is the layer below the signal syscalls (sys_signals.c, sys_itimer.c), which change the state,
 * and it is what the run loop calls on every return to user mode. Delivery builds an rt_sigframe on
 * the guest stack exactly as Linux does (siginfo, ucontext with the XSAVE image); the handler returns
 * through sa_restorer into rt_sigreturn, which restores the registers and FPU state from that frame.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "process.h"
#include "sandbox_state.h"
#include "serial.h"

#include <signal.h>
#include <sys/ioctl.h>

#define SA_RESTORER_FLAG 0x04000000
#define UC_FP_XSTATE 0x1
#define UC_SIGCONTEXT_SS 0x2

struct k_sigcontext {
    uint64_t r8, r9, r10, r11, r12, r13, r14, r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip, eflags;
    uint16_t cs, gs, fs, ss;
    uint64_t err, trapno, oldmask, cr2, fpstate;
    uint64_t reserved1[8];
};

struct k_ucontext {
    uint64_t uc_flags, uc_link;
    uint64_t ss_sp;
    int32_t ss_flags, pad;
    uint64_t ss_size;
    struct k_sigcontext mc;
    uint64_t sigmask;
};

struct k_siginfo {
    int32_t signo, errno_, code, pad;
    union {
        struct { int32_t pid; uint32_t uid; } kill;
        uint64_t addr;
        uint8_t raw[112];
    } u;
};

struct k_rt_sigframe {
    uint64_t pretcode;
    struct k_ucontext uc;
    struct k_siginfo info;
};

_Static_assert(sizeof(struct k_sigcontext) == 256, "sigcontext layout");
_Static_assert(sizeof(struct k_siginfo) == 128, "siginfo layout");

/* Signals whose default action is to do nothing. */
static int default_ignored(int sig) {
    return sig == SIGCHLD || sig == SIGWINCH || sig == SIGURG || sig == SIGCONT;
}

int zb_signal_has_handler(const zb_sandbox *sb, int sig) {
    uint64_t h = sb->sig.action[sig].handler;
    return h != (uint64_t)(uintptr_t)SIG_DFL && h != (uint64_t)(uintptr_t)SIG_IGN;
}

int zb_signal_interrupts(const zb_sandbox *sb, int sig) { return zb_signal_interrupts_mask(sb, sig, sb->sig.blocked); }

int zb_signal_interrupts_mask(const zb_sandbox *sb, int sig, uint64_t blocked) {
    if (blocked & ZB_SIG_BIT(sig)) return 0;
    uint64_t h = sb->sig.action[sig].handler;
    if (h == (uint64_t)(uintptr_t)SIG_IGN) return 0;
    return h != (uint64_t)(uintptr_t)SIG_DFL || !default_ignored(sig);
}

static int get_xsave(zb_sandbox *sb) {
    zb_vm *vm = zb_vm_of(sb);
    char err[ZB_ERRLEN];
    return (vm && vm->attached == sb) ? zb_vm_save_xsave(vm, sb, err) : 0;
}

static int set_xsave(zb_sandbox *sb) {
    zb_vm *vm = zb_vm_of(sb);
    if (vm && vm->attached == sb && ioctl(vm->vcpu_fd, KVM_SET_XSAVE, sb->cpu.xsave) < 0) return -1;
    return 0;
}

/* Build the frame for `sig` and point the guest at its handler. 0, or -1 if the guest's stack is
 * unusable (Linux then kills the process with SIGSEGV). */
static int push_frame(zb_sandbox *sb, int sig, const zb_sigaction *act) {
    struct kvm_regs *r = &sb->cpu.regs;
    size_t xsz = sb->engine->xsave_size;
    uint64_t sp = r->rsp;
    int on_alt = sb->sig.altstack_size && sp - sb->sig.altstack_sp < sb->sig.altstack_size;
    if ((act->flags & SA_ONSTACK) && sb->sig.altstack_size && !on_alt) sp = sb->sig.altstack_sp + sb->sig.altstack_size;
    else sp -= 128; /* red zone */
    uint64_t fp = (sp - xsz - 4) & ~63ull;
    uint64_t frame = ((fp - sizeof(struct k_rt_sigframe)) & ~15ull) - 8;
    if (get_xsave(sb) < 0) return -1;
    uint8_t *fpmem = zb_guest_ptr(sb, fp, xsz + 4, 1);
    struct k_rt_sigframe *f = zb_guest_ptr(sb, frame, sizeof *f, 1);
    if (!fpmem || !f) return -1;
    memcpy(fpmem, sb->cpu.xsave, xsz);
    uint32_t sw[4] = {FP_XSTATE_MAGIC1, (uint32_t)(xsz + 4), 0, (uint32_t)xsz};
    memcpy(fpmem + 464, sw, sizeof sw);              /* struct _fpx_sw_bytes */
    memcpy(fpmem + 464 + 8, &sb->engine->xcr0, 8);   /* xfeatures */
    uint32_t magic2 = FP_XSTATE_MAGIC2;
    memcpy(fpmem + xsz, &magic2, 4);
    memset(f, 0, sizeof *f);
    f->pretcode = act->restorer;
    f->uc.uc_flags = UC_FP_XSTATE | UC_SIGCONTEXT_SS;
    f->uc.ss_sp = sb->sig.altstack_sp;
    f->uc.ss_flags = sb->sig.altstack_size ? (on_alt ? SS_ONSTACK : 0) : SS_DISABLE;
    f->uc.ss_size = sb->sig.altstack_size;
    struct k_sigcontext *mc = &f->uc.mc;
    mc->r8 = r->r8; mc->r9 = r->r9; mc->r10 = r->r10; mc->r11 = r->r11;
    mc->r12 = r->r12; mc->r13 = r->r13; mc->r14 = r->r14; mc->r15 = r->r15;
    mc->rdi = r->rdi; mc->rsi = r->rsi; mc->rbp = r->rbp; mc->rbx = r->rbx;
    mc->rdx = r->rdx; mc->rax = r->rax; mc->rcx = r->rcx; mc->rsp = r->rsp;
    mc->rip = r->rip; mc->eflags = r->rflags;
    mc->cs = 0x33;
    mc->ss = 0x2b;
    mc->fpstate = fp;
    f->uc.sigmask = sb->sig.suspend_restore ? sb->sig.suspend_mask : sb->sig.blocked; /* sigsuspend's own mask ends with it */
    sb->sig.suspend_restore = 0;
    f->info.signo = sig;
    if (sig == sb->sig.fault_sig) { /* a CPU fault: its code and address */
        f->info.code = sb->sig.fault_code;
        f->info.u.addr = sb->sig.fault_addr;
        sb->sig.fault_sig = 0;
    } else {
        f->info.code = 0; /* SI_USER */
        f->info.u.kill.pid = 0;
    }
    r->rip = act->handler;
    r->rsp = frame;
    r->rdi = (uint64_t)sig;
    r->rsi = frame + offsetof(struct k_rt_sigframe, info);
    r->rdx = frame + offsetof(struct k_rt_sigframe, uc);
    r->rax = 0;
    r->rflags &= ~(0x400ull | 0x100ull); /* DF, TF */
    sb->sig.blocked |= act->mask | ((act->flags & SA_NODEFER) ? 0 : ZB_SIG_BIT(sig));
    sb->sig.blocked &= ~ZB_SIG_UNBLOCKABLE;
    if (act->flags & SA_RESETHAND) sb->sig.action[sig].handler = (uint64_t)(uintptr_t)SIG_DFL;
    return 0;
}

/* Deliver the lowest pending unblocked signal, if any. Returns 0 when nothing (more) needs doing,
 * 1 if the guest must die of that signal (*killed_by is set), -1 on an unusable stack. */
int zb_signal_deliver(zb_sandbox *sb, int *killed_by) {
    uint64_t ready = sb->sig.pending & ~sb->sig.blocked;
    if (!ready) return 0;
    int sig = __builtin_ctzll(ready) + 1;
    sb->sig.pending &= ~ZB_SIG_BIT(sig);
    zb_sigaction *act = &sb->sig.action[sig];
    if (act->handler == (uint64_t)(uintptr_t)SIG_IGN || (act->handler == (uint64_t)(uintptr_t)SIG_DFL && default_ignored(sig)))
        return 0;
    if (act->handler == (uint64_t)(uintptr_t)SIG_DFL || !(act->flags & SA_RESTORER_FLAG)) {
        *killed_by = sig;
        return 1;
    }
    if (push_frame(sb, sig, act) < 0) {
        *killed_by = SIGSEGV;
        return -1;
    }
    return 0;
}

long zb_signals_sigreturn(zb_sandbox *sb) {
    struct kvm_regs *r = &sb->cpu.regs;
    struct k_ucontext uc;
    if (zb_copy_from_guest(sb, &uc, r->rsp, sizeof uc) < 0) return -EFAULT;
    const struct k_sigcontext *mc = &uc.mc;
    size_t xsz = sb->engine->xsave_size;
    if (mc->fpstate) {
        const uint8_t *fpmem = zb_guest_ptr(sb, mc->fpstate, xsz, 0);
        if (!fpmem || (mc->fpstate & 63)) return -EFAULT;
        uint8_t *saved = malloc(xsz);
        if (!saved) return -ENOMEM;
        memcpy(saved, sb->cpu.xsave, xsz);
        memcpy(sb->cpu.xsave, fpmem, xsz);
        memset(sb->cpu.xsave + 464, 0, 48);        /* software-reserved bytes */
        uint64_t *xstate_bv = (uint64_t *)(sb->cpu.xsave + 512);
        *xstate_bv &= sb->engine->xcr0;             /* never let the guest name other components */
        uint32_t *mxcsr = (uint32_t *)(sb->cpu.xsave + 24);
        *mxcsr &= 0xffff;
        if (set_xsave(sb) < 0) { /* KVM refused the image: keep the old one and fail the call */
            memcpy(sb->cpu.xsave, saved, xsz);
            free(saved);
            return -EFAULT;
        }
        free(saved);
    }
    r->r8 = mc->r8; r->r9 = mc->r9; r->r10 = mc->r10; r->r11 = mc->r11;
    r->r12 = mc->r12; r->r13 = mc->r13; r->r14 = mc->r14; r->r15 = mc->r15;
    r->rdi = mc->rdi; r->rsi = mc->rsi; r->rbp = mc->rbp; r->rbx = mc->rbx;
    r->rdx = mc->rdx; r->rax = mc->rax; r->rcx = mc->rcx; r->rsp = mc->rsp;
    r->rip = mc->rip;
    r->rflags = (mc->eflags & 0x0dd5) | 0x202; /* arithmetic flags, TF, DF; IF always set */
    sb->sig.blocked = uc.sigmask & ~ZB_SIG_UNBLOCKABLE;
    sb->cpu.context_restored = 1;
    return 0;
}

/* An interval timer expiring at *at (0: disarmed) on some clock that reads `now`: 1 if it expired,
 * then re-armed (periodic: the next expiry in the timer's own rhythm, skipping the ones already
 * missed) or disarmed. The alarm and the CPU timers share it, each on its own clock. */
static int timer_expired(int64_t *at, int64_t interval, int64_t now) {
    if (!*at || now < *at) return 0;
    *at = interval ? *at + ((now - *at) / interval + 1) * interval : 0;
    return 1;
}

int zb_alarm_check(zb_sandbox *sb, int64_t now) {
    zb_signals *s = &sb->sig;
    if (!timer_expired(&s->alarm_ns, s->alarm_interval_ns, now)) return 0;
    s->pending |= ZB_SIG_BIT(SIGALRM);
    return 1;
}

int64_t zb_cpu_timer_clock(const zb_sandbox *sb, int i) {
    uint64_t user, sys;
    zb_guest_cpu_split(sb, &user, &sys);
    return (int64_t)(i == ZB_CPU_TIMER_VIRTUAL ? user : user + sys);
}

int zb_cpu_timers_armed(const zb_sandbox *sb) { return sb->sig.cpu_timer_ns[0] || sb->sig.cpu_timer_ns[1]; }

int zb_cpu_timers_check(zb_sandbox *sb) {
    static const int sigs[2] = {SIGVTALRM, SIGPROF};
    zb_signals *s = &sb->sig;
    int fired = 0;
    for (int i = 0; i < 2; i++) {
        if (!s->cpu_timer_ns[i] || !timer_expired(&s->cpu_timer_ns[i], s->cpu_timer_interval_ns[i], zb_cpu_timer_clock(sb, i)))
            continue;
        s->pending |= ZB_SIG_BIT(sigs[i]);
        fired = 1;
    }
    return fired;
}

int64_t zb_cpu_timers_wake(const zb_sandbox *sb, int64_t now) {
    int64_t at = INT64_MAX;
    for (int i = 0; i < 2; i++)
        if (sb->sig.cpu_timer_ns[i]) /* a CPU clock runs at most as fast as the wall clock */
            at = ZB_MIN(at, now + ZB_MAX(sb->sig.cpu_timer_ns[i] - zb_cpu_timer_clock(sb, i), 0));
    return at;
}

/* ---- the state's copy and on-disk form ---- */

void zb_signals_clone(zb_signals *dst, const zb_signals *src) { *dst = *src; /* plain data */ }

/* Not saved: the alarm (alarm_ns, alarm_interval_ns), a host CLOCK_MONOTONIC time that means
 * nothing in another boot; a loaded template has none armed. */
void zb_signals_save(const zb_signals *s, struct zb_out *o) {
    for (int sig = 0; sig <= 64; sig++) {
        const zb_sigaction *a = &s->action[sig];
        out_u64(o, a->handler);
        out_u64(o, a->flags);
        out_u64(o, a->restorer);
        out_u64(o, a->mask);
    }
    out_u64(o, s->blocked);
    out_u64(o, s->pending);
    out_u64(o, s->altstack_sp);
    out_u64(o, s->altstack_size);
    out_u32(o, (uint32_t)s->altstack_flags);
    out_u32(o, (uint32_t)s->fault_sig);
    out_u32(o, (uint32_t)s->fault_code);
    out_u64(o, s->fault_addr);
}

int zb_signals_load(zb_signals *s, struct zb_in *in, char *err) {
    memset(s, 0, sizeof *s);
    for (int sig = 0; sig <= 64; sig++) {
        zb_sigaction *a = &s->action[sig];
        a->handler = in_u64(in);
        a->flags = in_u64(in);
        a->restorer = in_u64(in);
        a->mask = in_u64(in);
    }
    s->blocked = in_u64(in);
    s->pending = in_u64(in);
    s->altstack_sp = in_u64(in);
    s->altstack_size = in_u64(in);
    s->altstack_flags = (int)in_u32(in);
    uint32_t fault_sig = in_u32(in);
    s->fault_code = (int)in_u32(in);
    s->fault_addr = in_u64(in);
    if (in->err || fault_sig > 64 || (s->blocked & ZB_SIG_UNBLOCKABLE)) {
        memset(s, 0, sizeof *s);
        zb_seterr(err, "signal state: truncated or corrupt");
        return -1;
    }
    s->fault_sig = (int)fault_sig;
    return 0;
}
