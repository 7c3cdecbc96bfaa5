/* sys_signals.c - signal dispositions, masks and delivery, with Linux's x86-64 frame layout.
 *
 * Signals come from the host (zb_sandbox_raise: the kernel's KeyboardInterrupt) or from the guest
 * itself (kill/tgkill, e.g. abort()). Delivery builds an rt_sigframe on the guest stack exactly as
 * Linux does (siginfo, ucontext with the XSAVE image); the handler returns through sa_restorer into
 * rt_sigreturn, which restores the registers and FPU state from that frame.
 */
#include "engine.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/ioctl.h>

#define KSIG_BIT(sig) (1ull << ((sig) - 1))
#define UNBLOCKABLE (KSIG_BIT(SIGKILL) | KSIG_BIT(SIGSTOP))
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

int zb_signal_interrupts(const zb_sandbox *sb, int sig) {
    if (sb->sig.blocked & KSIG_BIT(sig)) return 0;
    uint64_t h = sb->sig.action[sig].handler;
    if (h == (uint64_t)(uintptr_t)SIG_IGN) return 0;
    return h != (uint64_t)(uintptr_t)SIG_DFL || !default_ignored(sig);
}

static long sys_rt_sigaction(zb_sandbox *sb, const uint64_t a[6]) {
    int sig = (int)a[0];
    if (sig < 1 || sig > 64 || a[3] != 8) return -EINVAL;
    zb_sigaction old = sb->sig.action[sig];
    if (a[1]) {
        if (sig == SIGKILL || sig == SIGSTOP) return -EINVAL;
        zb_sigaction act;
        if (zb_copy_from_guest(sb, &act, a[1], sizeof act) < 0) return -EFAULT;
        act.mask &= ~UNBLOCKABLE;
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
        sb->sig.blocked &= ~UNBLOCKABLE;
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

/* kill/tkill/tgkill aimed at the guest itself queue the signal; it is delivered when the syscall
 * returns. There is no other process to signal. */
static long queue_self(zb_sandbox *sb, int64_t pid, int sig) {
    if (pid != 0 && pid != 1 && pid != -1) return -ESRCH;
    if (sig < 0 || sig > 64) return -EINVAL;
    if (sig) sb->sig.pending |= KSIG_BIT(sig);
    return 0;
}
static long sys_kill(zb_sandbox *sb, const uint64_t a[6]) { return queue_self(sb, (int64_t)a[0], (int)a[1]); }
static long sys_tkill(zb_sandbox *sb, const uint64_t a[6]) { return queue_self(sb, (int64_t)a[0], (int)a[1]); }
static long sys_tgkill(zb_sandbox *sb, const uint64_t a[6]) {
    if ((int64_t)a[1] != 1) return -ESRCH;
    return queue_self(sb, (int64_t)a[0], (int)a[2]);
}

/* Waiting for a signal: only the host can send one, so sleep until it does (or a kick/deadline). */
static long sys_rt_sigsuspend(zb_sandbox *sb, const uint64_t a[6]) {
    (void)a;
    long r = zb_sleep_until(sb, INT64_MAX);
    return r == 0 ? -EINTR : r;
}

static long sys_rt_sigreturn(zb_sandbox *sb, const uint64_t a[6]) {
    (void)a;
    return zb_signals_sigreturn(sb);
}

static int get_xsave(zb_sandbox *sb) {
    zb_vm *vm = sb->engine->vm;
    char err[ZB_ERRLEN];
    return (vm && vm->attached == sb) ? zb_vm_save_xsave(vm, sb, err) : 0;
}

static int set_xsave(zb_sandbox *sb) {
    zb_vm *vm = sb->engine->vm;
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
    f->uc.sigmask = sb->sig.blocked;
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
    sb->sig.blocked |= act->mask | ((act->flags & SA_NODEFER) ? 0 : KSIG_BIT(sig));
    sb->sig.blocked &= ~UNBLOCKABLE;
    if (act->flags & SA_RESETHAND) sb->sig.action[sig].handler = (uint64_t)(uintptr_t)SIG_DFL;
    return 0;
}

/* Deliver the lowest pending unblocked signal, if any. Returns 0 when nothing (more) needs doing,
 * 1 if the guest must die of that signal (*killed_by is set), -1 on an unusable stack. */
int zb_signal_deliver(zb_sandbox *sb, int *killed_by) {
    uint64_t ready = sb->sig.pending & ~sb->sig.blocked;
    if (!ready) return 0;
    int sig = __builtin_ctzll(ready) + 1;
    sb->sig.pending &= ~KSIG_BIT(sig);
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
    sb->sig.blocked = uc.sigmask & ~UNBLOCKABLE;
    sb->cpu.context_restored = 1;
    return 0;
}

void zb_sys_signals_register(zb_syscall_fn *t) {
    t[SYS_rt_sigaction] = sys_rt_sigaction;
    t[SYS_rt_sigprocmask] = sys_rt_sigprocmask;
    t[SYS_rt_sigpending] = sys_rt_sigpending;
    t[SYS_sigaltstack] = sys_sigaltstack;
    t[SYS_rt_sigreturn] = sys_rt_sigreturn;
    t[SYS_rt_sigsuspend] = sys_rt_sigsuspend;
    t[SYS_pause] = sys_rt_sigsuspend;
    t[SYS_kill] = sys_kill;
    t[SYS_tkill] = sys_tkill;
    t[SYS_tgkill] = sys_tgkill;
}
