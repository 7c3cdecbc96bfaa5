/* run_loop.c - running a sandbox: KVM_RUN, and what each exit means.
 *
 * Every guest->host transition is an I/O exit:
 *   - ports 0x3f8-0x3ff from user code: the UART registers (uart16550.c);
 *   - port ZB_PORT_SYSCALL from the syscall entry at LSTAR (guest_abi.h): a `syscall`; from
 *     anywhere else, a syscall site the host rewrote (syscall_sites.c);
 *   - port 0xc0+v from the CPL0 stub of exception vector v (guest/cpl0_entry.S): a CPU fault.
 * After a syscall the host returns to user mode itself (registers and special registers, through
 * kvm_run where KVM has KVM_CAP_SYNC_REGS: zb_vm_set_user_state).
 * A run stops on an event for the caller, the deadline (POSIX timer -> kick signal) or a kick.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "dev.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "linux.h"
#include "run.h"
#include "guest_abi.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>


static const char *const vector_names[32] = {
    "divide error", "debug", "NMI", "breakpoint", "overflow", "bound range", "invalid opcode",
    "device not available", "double fault", "coprocessor overrun", "invalid TSS", "segment not present",
    "stack fault", "general protection fault", "page fault", "reserved", "x87 floating point",
    "alignment check", "machine check", "SIMD floating point", "virtualization", "control protection",
};

static int vector_signal(int v) {
    switch (v) {
    case 0: case 16: case 19: return SIGFPE;
    case 1: case 3: return SIGTRAP;
    case 6: return SIGILL;
    case 17: case 18: return SIGBUS;
    default: return SIGSEGV;
    }
}

static int has_error_code(int v) { return v == 8 || (v >= 10 && v <= 14) || v == 17 || v == 21 || v == 29 || v == 30; }

static void symbolize(zb_sandbox *sb, uint64_t addr, char *buf, size_t len) {
    const zb_region *r = zb_region_find(&sb->mem, addr);
    if (r) snprintf(buf, len, " (%s+0x%llx)", r->name, (unsigned long long)(addr - r->start));
    else buf[0] = 0;
}

void zb_fault_event(zb_sandbox *sb, zb_event *ev, int signo, uint64_t rip, uint64_t addr, const char *what) {
    char where[160];
    memset(ev, 0, sizeof *ev);
    ev->kind = ZB_EVENT_FAULT;
    ev->signal = signo;
    ev->rip = rip;
    ev->addr = addr;
    symbolize(sb, rip, where, sizeof where);
    snprintf(ev->message, sizeof ev->message, "guest killed by SIG%s: %s at rip 0x%llx%s", sigabbrev_np(signo) ? sigabbrev_np(signo) : "?",
             what, (unsigned long long)rip, where);
    sb->finished = 1;
}

static void error_event(zb_sandbox *sb, zb_event *ev, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void error_event(zb_sandbox *sb, zb_event *ev, const char *fmt, ...) {
    memset(ev, 0, sizeof *ev);
    ev->kind = ZB_EVENT_ERROR;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ev->message, sizeof ev->message, fmt, ap);
    va_end(ap);
    sb->finished = 1;
}

/* Enter user mode with sb->cpu.regs (after serving a syscall or delivering a signal). */
static int set_user_state(zb_sandbox *sb, zb_vm *vm, zb_event *ev) {
    if (!vm->user_sregs_valid) { /* the fields outside the user template: read once (zb_vm.user_sregs) */
        if (ioctl(vm->vcpu_fd, KVM_GET_SREGS, &vm->user_sregs) < 0) { error_event(sb, ev, "KVM_GET_SREGS: %s", strerror(errno)); return -1; }
        vm->user_sregs_valid = 1;
    }
    struct kvm_sregs s = vm->user_sregs;
    zb_layout_user_sregs(&sb->mem, &s, sb->cpu.fs_base, sb->cpu.gs_base);
    if (zb_vm_set_user_state(vm, &sb->cpu.regs, &s) < 0) { /* with sync_regs: applied by the next KVM_RUN */
        error_event(sb, ev, "KVM_SET_SREGS/REGS: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* 1 if these vCPU registers are inside a trap to the host rather than user state: `syscall` has
 * moved RIP to LSTAR but the entry's `out` has not run yet, or an exception has entered its CPL0
 * stub but the stub's `out` has not run yet. KVM_RUN returns there when a host signal (the kick,
 * the run's wake timer, the caller's) lands mid-trap, which a loaded host makes common: under PVM
 * every CPL0 step is emulated. No user code runs at these RIPs (the stubs are supervisor-only; the
 * entry page holds nothing but the entry, its in-guest answers and their data: user code that
 * jumps in there is making a syscall, which entry_to_out treats as one; ZB_SYSCALL_TRAP, the LSTAR without
 * ZB_SYSCALLS_DIRECT_ENTRY, is never mapped), so the test needs no CPL, which PVM does not report. */
/* RIP in the entry's timed answers (guest_abi.h ZB_ENTRY_TIMED_DISPATCH onwards), past its `out`. */
static int in_entry_timed(uint64_t rip) {
    return rip >= ZB_SYSCALL_ENTRY + ZB_ENTRY_TIMED_DISPATCH &&
           rip < ZB_SYSCALL_ENTRY + ZB_ENTRY_TIMED + ZB_ENTRY_TIMED_COUNT * ZB_ENTRY_TIMED_SIZE;
}

static int in_host_trap(const struct kvm_regs *r) {
    return (r->rip >= ZB_SYSCALL_ENTRY && r->rip <= ZB_SYSCALL_ENTRY + ZB_SYSCALL_ENTRY_OUT) || in_entry_timed(r->rip) ||
           r->rip == ZB_SYSCALL_TRAP ||
           (r->rip >= zb_layout_stub_addr(0) && r->rip < zb_layout_stub_addr(ZB_STUB_VECTORS));
}

/* The syscalls of the entry's slots (guest_abi.h), for a vCPU stopped at a slot's `jmp *%rcx`,
 * where rax already holds the answer. getuid serves geteuid's slot and getgid getegid's: same answers. */
static const uint64_t entry_slot_nr[ZB_ENTRY_SLOT_COUNT] = {SYS_getpid, SYS_getuid, SYS_getgid};
/* The per-fd slots' syscalls (guest_abi.h ZB_ENTRY_FD_SLOTS), for a vCPU stopped past a slot's start. */
static const uint64_t entry_fd_slot_nr[ZB_ENTRY_FD_SLOT_COUNT] = {SYS_lseek, SYS_ioctl, SYS_fcntl, SYS_fcntl};

/* The timed blocks' syscalls (guest_abi.h ZB_ENTRY_TIMED): read, newfstatat, getdents64, close,
 * read and getdents64 of read_fd. */
#define ENTRY_READ_BLOCK 4
#define ENTRY_DENTS_BLOCK 5
static const uint64_t entry_timed_nr[ZB_ENTRY_TIMED_COUNT] = {SYS_read, SYS_newfstatat, SYS_getdents64, SYS_close, SYS_read,
                                                               SYS_getdents64};

/* A vCPU stopped or faulting at rip in the timed answers gets the registers of the syscall it was
 * answering: rax its number, in the TSC window of a block (where rdtsc took rdx) rdx back from
 * r11, in the read and getdents64 blocks' copy rsi, rcx and rdi from where they saved them, and
 * r11 what PVM reports at the `out` (the blocks use it as scratch). (The dispatches only compare:
 * rax is still the number there.) */
static void entry_timed_regs(const zb_sandbox *sb, struct kvm_regs *r) {
    if (r->rip < ZB_SYSCALL_ENTRY + ZB_ENTRY_TIMED) return;
    uint64_t off = r->rip - ZB_SYSCALL_ENTRY - ZB_ENTRY_TIMED, block = off / ZB_ENTRY_TIMED_SIZE, in = off % ZB_ENTRY_TIMED_SIZE;
    if (block >= ZB_ENTRY_TIMED_COUNT) return;
    if (block == ENTRY_READ_BLOCK && in >= ZB_ENTRY_READ_DISPATCH) return;
    if (block == ZB_ENTRY_SIG_BLOCK && in >= ZB_ENTRY_SIG_CODE) { /* the disposition query: rax is 13 or 0 */
        r->rax = SYS_rt_sigaction;
        r->r11 = 0x202;
        return;
    }
    r->rax = entry_timed_nr[block];
    if (r->rax == SYS_close) return; /* before its commit: it changed nothing (entry_close_committed) */
    if (r->rax != SYS_getdents64 && in > ZB_ENTRY_TSC && in < ZB_ENTRY_TSC_END) r->rdx = r->r11;
    if ((block == ENTRY_READ_BLOCK && in >= ZB_ENTRY_READ_COPY && in < ZB_ENTRY_READ_DONE) ||
        (block == ENTRY_DENTS_BLOCK && in >= ZB_ENTRY_READ_COPY && in < ZB_ENTRY_DENTS_DONE))
        zb_layout_entry_read_saved(&sb->mem, r);
    r->r11 = 0x202; /* the blocks' scratch: RFLAGS as PVM reports them at the `out` */
}

/* 1 if rip is in the close block past its store (guest_abi.h ZB_ENTRY_CLOSE_DONE): the close has
 * happened (the slot holds it), and what is left is returning 0 to user code. */
static int entry_close_committed(uint64_t rip) {
    uint64_t block = ZB_SYSCALL_ENTRY + ZB_ENTRY_TIMED + 3 * ZB_ENTRY_TIMED_SIZE;
    _Static_assert(ZB_ENTRY_SIG_BLOCK == 3 && ZB_ENTRY_SIG_CODE > ZB_ENTRY_CLOSE_DONE,
                   "the disposition query follows the close's code in its block");
    return rip >= block + ZB_ENTRY_CLOSE_DONE && rip < block + ZB_ENTRY_SIG_CODE;
}

/* 1 if rip is at the read or getdents64 block's `jmp *%rcx`, past its commit to the position
 * (ZB_ENTRY_READ_DONE, ZB_ENTRY_DENTS_DONE): what is left is returning the count (rax). */
static int entry_read_committed(uint64_t rip) {
    uint64_t timed = ZB_SYSCALL_ENTRY + ZB_ENTRY_TIMED;
    return rip == timed + ENTRY_READ_BLOCK * ZB_ENTRY_TIMED_SIZE + ZB_ENTRY_READ_DONE ||
           rip == timed + ENTRY_DENTS_BLOCK * ZB_ENTRY_TIMED_SIZE + ZB_ENTRY_DENTS_DONE;
}

/* sync_regs found the vCPU mid-trap (in_host_trap). In the entry's in-guest answers (before its
 * `out`) the guest would return to user code without an exit, and the signal the caller holds back
 * for the trap's exit would wait for some later exit: move it to the `out`, with the syscall
 * number in rax, so that the host serves this call and delivers the signal after it. Returns 1
 * (still mid-trap) or -1. */
static int entry_to_out(zb_sandbox *sb, zb_vm *vm, zb_event *ev, struct kvm_regs *r) {
    uint64_t out = ZB_SYSCALL_ENTRY + ZB_SYSCALL_ENTRY_OUT;
    if (in_entry_timed(r->rip)) {
        entry_timed_regs(sb, r);
        r->rip = out;
        if (ioctl(vm->vcpu_fd, KVM_SET_REGS, r) < 0) { error_event(sb, ev, "KVM_SET_REGS: %s", strerror(errno)); return -1; }
        return 1;
    }
    if (r->rip < ZB_SYSCALL_ENTRY || r->rip >= out) return 1;
    uint64_t off = r->rip - ZB_SYSCALL_ENTRY;
    if (off >= ZB_ENTRY_SLOTS && off < ZB_ENTRY_SLOTS + ZB_ENTRY_SLOT_COUNT * ZB_ENTRY_SLOT_SIZE &&
        (off - ZB_ENTRY_SLOTS) % ZB_ENTRY_SLOT_SIZE >= ZB_ENTRY_SLOT_JMP)
        r->rax = entry_slot_nr[(off - ZB_ENTRY_SLOTS) / ZB_ENTRY_SLOT_SIZE];
    if (off >= ZB_ENTRY_FD_SLOTS && off < ZB_ENTRY_FD_SLOTS + ZB_ENTRY_FD_SLOT_COUNT * ZB_ENTRY_FD_SLOT_SIZE &&
        (off - ZB_ENTRY_FD_SLOTS) % ZB_ENTRY_FD_SLOT_SIZE)
        r->rax = entry_fd_slot_nr[(off - ZB_ENTRY_FD_SLOTS) / ZB_ENTRY_FD_SLOT_SIZE];
    r->rip = out;
    if (ioctl(vm->vcpu_fd, KVM_SET_REGS, r) < 0) { error_event(sb, ev, "KVM_SET_REGS: %s", strerror(errno)); return -1; }
    return 1;
}

/* Make sb->cpu.regs the vCPU's current user state (completing any pending port I/O first).
 * 0 on success; 1 if the vCPU is mid-trap (in_host_trap): it has no user state to interrupt, and
 * the caller must let KVM_RUN finish the trap (the host then handles the syscall or fault and
 * delivers pending signals after it, as Linux does on the way back to user mode); -1 on error. */
static int sync_regs(zb_sandbox *sb, zb_vm *vm, zb_event *ev) {
    struct kvm_regs r;
    if (zb_vm_flush_user_state(vm) < 0) { error_event(sb, ev, "KVM_SET_SREGS/REGS: %s", strerror(errno)); return -1; }
    /* With immediate_exit set, KVM_RUN does not enter the guest: it completes the port I/O of the
     * last exit (so the registers read next are final) and returns EINTR at once. EINTR (or EAGAIN,
     * as the run loop also accepts) is that expected answer, not an error. */
    vm->run->immediate_exit = 1;
    int rc = ioctl(vm->vcpu_fd, KVM_RUN, 0);
    vm->run->immediate_exit = 0;
    if (rc < 0 && errno != EINTR && errno != EAGAIN) {
        error_event(sb, ev, "KVM_RUN (immediate exit): %s", strerror(errno));
        return -1;
    }
    if (ioctl(vm->vcpu_fd, KVM_GET_REGS, &r) < 0) { error_event(sb, ev, "KVM_GET_REGS: %s", strerror(errno)); return -1; }
    int closed = entry_close_committed(r.rip);
    if (closed || entry_read_committed(r.rip)) {
        /* a deferred close or a read made: finish its return (rax = 0, or the count) */
        if (closed) r.rax = 0;
        r.rip = r.rcx;
        if (ioctl(vm->vcpu_fd, KVM_SET_REGS, &r) < 0) { error_event(sb, ev, "KVM_SET_REGS: %s", strerror(errno)); return -1; }
    }
    if (in_host_trap(&r)) return entry_to_out(sb, vm, ev, &r);
    sb->cpu.regs = r;
    return 0;
}

/* Deliver pending signals; 1 if an event ends the run. */
static int deliver_signals(zb_sandbox *sb, zb_event *ev) {
    int sig = 0;
    while (sb->sig.pending & ~sb->sig.blocked) {
        int r = zb_signal_deliver(sb, &sig);
        if (r) {
            zb_fault_event(sb, ev, sig, sb->cpu.regs.rip, 0, r < 0 ? "no usable stack for a signal frame" : "signal with default action");
            return 1;
        }
    }
    return 0;
}

/* What run_threads.c uses of the run loop (run.h). */
void zb_run_error(zb_sandbox *sb, zb_event *ev, const char *fmt, ...) {
    char msg[sizeof ev->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    error_event(sb, ev, "%s", msg);
}
int zb_run_deliver_signals(zb_sandbox *sb, zb_event *ev) { return deliver_signals(sb, ev); }
int zb_run_set_user_state(zb_sandbox *sb, zb_vm *vm, zb_event *ev) { return set_user_state(sb, vm, ev); }
int zb_run_sync_regs(zb_sandbox *sb, zb_vm *vm, zb_event *ev) { return sync_regs(sb, vm, ev); }

static void trace_syscall(zb_sandbox *sb, uint64_t nr, const uint64_t a[6], long ret, int64_t ns) {
    char line[768], path[256] = "";
    switch (nr) {
    case SYS_open: case SYS_stat: case SYS_lstat: case SYS_access: case SYS_readlink: case SYS_chdir:
    case SYS_mkdir: case SYS_unlink: case SYS_rmdir:
        if (zb_guest_string(sb, a[0], path + 1, sizeof path - 3) == 0) path[0] = '"';
        break;
    case SYS_openat: case SYS_newfstatat: case SYS_statx: case SYS_faccessat: case SYS_faccessat2:
    case SYS_readlinkat: case SYS_mkdirat: case SYS_unlinkat:
        if (zb_guest_string(sb, a[1], path + 1, sizeof path - 3) == 0) path[0] = '"';
        break;
    }
    if (path[0]) strcat(path, "\" ");
    const char *res = ret == ZB_SYSCALL_STOP ? "(paused)" : "";
    int n = snprintf(line, sizeof line, "%s(%s0x%llx, 0x%llx, 0x%llx, 0x%llx, 0x%llx, 0x%llx) = %ld%s%s [%.1f us]\n",
                     zb_syscall_name(nr), path, (unsigned long long)a[0], (unsigned long long)a[1], (unsigned long long)a[2],
                     (unsigned long long)a[3], (unsigned long long)a[4], (unsigned long long)a[5], ret, res,
                     ret < 0 && ret > -4096 ? (ret == -ENOSYS ? " ENOSYS" : "") : "", ns / 1e3);
    if (n > 0 && write(sb->trace_fd, line, (size_t)ZB_MIN(n, (int)sizeof line - 1)) < 0) sb->trace_fd = -1;
}

/* Serve the syscall described by sb->cpu.regs. 1 if an event ends the run. */
static int serve_syscall(zb_sandbox *sb, zb_vm *vm, zb_event *ev) {
    struct kvm_regs *r = &sb->cpu.regs;
    int trapped = !sb->cpu.pending_syscall; /* not a blocked syscall served again */
    uint64_t nr = sb->cpu.pending_syscall ? sb->cpu.pending_nr : r->rax;
    const uint64_t a[6] = {r->rdi, r->rsi, r->rdx, r->r10, r->r8, r->r9};
    int64_t t0 = zb_now_ns();
    zb_syscall_nr_profile *row = sb->profile && sb->prof_nr ? &sb->prof_nr[ZB_MIN(nr, ZB_PROFILE_NRS - 1)] : NULL;
    uint64_t host_calls0 = zb_host_calls;
    if (sb->profile && trapped) {
        sb->prof.syscalls++;
        sb->prof.kvm_run_ns += (uint64_t)sb->prof_run_ns;
        sb->prof.decode_ns += (uint64_t)(t0 - sb->prof_exit_ns);
        if (row) {
            row->calls++;
            row->exit_ns += (uint64_t)(t0 - sb->prof_exit_ns + sb->prof_run_ns);
        }
    }
    sb->has_stop = 0;
    sb->stop_retry = 0;
    sb->cpu.context_restored = 0;
    atomic_fetch_add(&zb_syscall_seq, 1); /* ends every timed answer's hint */
    uint64_t waited0 = zb_waited_ns;
    long ret = zb_syscall_dispatch(sb, nr, a);
    int64_t dt = zb_now_ns() - t0;
    sb->stats.syscalls++;
    sb->stats.syscall_ns += (uint64_t)dt;
    sb->proc.sys_ns += (uint64_t)dt - (zb_waited_ns - waited0); /* the guest's system time: not its waits */
    if (sb->profile) {
        sb->prof.dispatch_ns += (uint64_t)dt;
        sb->prof.host_calls += zb_host_calls - host_calls0;
        if (row) {
            row->dispatch_ns += (uint64_t)dt;
            row->host_calls += zb_host_calls - host_calls0;
        }
    }
    if (sb->trace_fd >= 0) trace_syscall(sb, nr, a, ret, dt);
    if (sb->threads.need_xsave_for >= 0 && zb_run_threads_after_syscall(sb, vm, ev)) return 1; /* clone */
    if (sb->cpu.context_restored) { /* rt_sigreturn: rax is the interrupted code's, not a result */
        sb->cpu.context_restored = 0;
        ret = (long)r->rax;
    } else if (ret == ZB_SYSCALL_BLOCK) { /* the thread waits or exits: another runs (run_threads.c) */
        return zb_run_threads_block(sb, vm, nr, ev);
    } else if (ret == ZB_SYSCALL_STOP) {
        sb->cpu.pending_syscall = !sb->finished;
        sb->cpu.pending_nr = nr;
        *ev = sb->stop_ev;
        return 1;
    }
    zb_cpu_syscall_done(&sb->cpu);
    r->rax = (uint64_t)ret;
    zb_wake_gen++; /* it completed: a yielded syscall of another thread or process may go on now */
    ZB_PROF_BEGIN(sb, t_ret);
    if (deliver_signals(sb, ev)) return 1;
    if (set_user_state(sb, vm, ev) < 0) return 1;
    if (sb->profile) {
        uint64_t ret_ns = (uint64_t)(zb_now_ns() - t_ret);
        sb->prof.return_ns += ret_ns;
        if (row) row->return_ns += ret_ns;
    }
    if (sb->threads.switch_request && zb_run_threads_after_syscall(sb, vm, ev)) return 1; /* sched_yield */
    if (sb->has_stop) {
        *ev = sb->stop_ev;
        return 1;
    }
    return 0;
}

/* Describe a #GP from user code: a port access or a privileged instruction. */
static void describe_gp(zb_sandbox *sb, uint64_t rip, char *buf, size_t len, int *is_port) {
    const uint8_t *code = zb_guest_ptr(sb, rip, 1, 0);
    uint8_t insn[16] = {0};
    *is_port = 0;
    if (!code) { snprintf(buf, len, "general protection fault"); return; }
    size_t avail = ZB_MIN(sizeof insn, ZB_PAGE - (rip % ZB_PAGE));
    memcpy(insn, code, avail);
    size_t i = 0;
    while (i < 14 && (insn[i] == 0x66 || insn[i] == 0x67 || insn[i] == 0xf2 || insn[i] == 0xf3 || (insn[i] & 0xf0) == 0x40)) i++;
    uint8_t op = insn[i];
    unsigned port = 0x10000;
    if (op == 0xe4 || op == 0xe5 || op == 0xe6 || op == 0xe7) port = insn[i + 1];
    else if (op == 0xec || op == 0xed || op == 0xee || op == 0xef || (op >= 0x6c && op <= 0x6f)) port = (unsigned)(sb->cpu.regs.rdx & 0xffff);
    if (port < 0x10000) {
        *is_port = 1;
        snprintf(buf, len, "the guest accessed I/O port 0x%x; only the UART (0x%x-0x%x) is allowed", port, ZB_UART_BASE,
                 ZB_UART_BASE + ZB_UART_PORTS - 1);
    } else if (op == 0xf4 || op == 0xfa || op == 0xfb || (op == 0x0f && (insn[i + 1] == 0x01 || insn[i + 1] == 0x20 || insn[i + 1] == 0x22 ||
                                                                          insn[i + 1] == 0x30 || insn[i + 1] == 0x32 || insn[i + 1] == 0x00))) {
        snprintf(buf, len, "privileged instruction (opcode %02x %02x) in user mode", op, insn[i + 1]);
    } else {
        snprintf(buf, len, "general protection fault");
    }
}

/* A `syscall` ran the entry at LSTAR (or faulted there, into vector 14, when LSTAR is
 * ZB_SYSCALL_TRAP): vr is user state but for RIP (rcx holds the return address) and RFLAGS (r11;
 * PVM reports r11 = 0x202, VMX the real flags). */
static int handle_syscall_entry(zb_sandbox *sb, zb_vm *vm, const struct kvm_regs *vr, zb_event *ev) {
    uint64_t uflags = (vr->r11 & 0x0dd5) | 0x202;
    sb->cpu.regs = *vr;
    sb->cpu.regs.rip = vr->rcx;
    sb->cpu.regs.rflags = uflags;
    sb->cpu.regs.r11 = uflags;
    sb->cpu.pending_syscall = 0;
    sb->cpu.io_done = 0;
    zb_syscall_site_rewrite(sb, vm, vr->rax, vr->rcx); /* before serving: an execve or munmap may take the site */
    return serve_syscall(sb, vm, ev);
}

/* An `out` to the syscall port from user code (guest_abi.h): a rewritten site, or code doing the
 * same by other means. vr is user state with RIP past the `out`; rcx and r11 get what `syscall`
 * would have given them, so the call is the same to its caller on either path. */
static int handle_syscall_site(zb_sandbox *sb, zb_vm *vm, const struct kvm_regs *vr, zb_event *ev) {
    sb->cpu.regs = *vr;
    sb->cpu.regs.rcx = vr->rip;
    sb->cpu.regs.r11 = vr->rflags;
    sb->cpu.pending_syscall = 0;
    sb->cpu.io_done = 0;
    return serve_syscall(sb, vm, ev);
}

/* vr: the registers handle_io just read (kvm_run's copy, or one KVM_GET_REGS). */
static int handle_exception(zb_sandbox *sb, zb_vm *vm, int vector, const struct kvm_regs *vrp, zb_event *ev) {
    struct kvm_regs vr = *vrp;
    /* the hardware frame on the IST stack: [error code,] rip, cs, rflags, rsp, ss */
    uint64_t top = zb_layout_exception_stack_top(), frame[6];
    int ec = has_error_code(vector);
    size_t words = ec ? 6 : 5;
    if (vr.rsp < ZB_PAGE || vr.rsp + words * 8 > top) { error_event(sb, ev, "corrupt exception frame (rsp 0x%llx)", (unsigned long long)vr.rsp); return 1; }
    memcpy(frame, sb->mem.host + vr.rsp, words * 8);
    uint64_t err = ec ? frame[0] : 0, rip = frame[ec], rflags = frame[ec + 2], rsp = frame[ec + 3];
    if (vector == 14 && rip == ZB_SYSCALL_TRAP) { /* LSTAR unmapped (ZB_SYSCALLS_DIRECT_ENTRY off) */
        vr.rsp = rsp;
        return handle_syscall_entry(sb, vm, &vr, ev);
    }
    if ((vector == 13 || vector == 14) && in_entry_timed(rip)) {
        /* a timed answer touched the user's memory (the path, the buffer) and faulted: the host
         * serves the call, which says EFAULT as Linux does */
        vr.rip = rip;
        entry_timed_regs(sb, &vr);
        vr.rsp = rsp;
        vr.r11 = rflags; /* r11 was the answer's scratch: the flags come from the frame */
        return handle_syscall_entry(sb, vm, &vr, ev);
    }
    sb->cpu.regs = vr;
    sb->cpu.regs.rsp = rsp;
    sb->cpu.regs.rip = rip;
    sb->cpu.regs.rflags = rflags;
    int sig = vector_signal(vector);
    uint64_t addr = 0;
    char what[256];
    if (vector == 14) {
        struct kvm_sregs s;
        if (ioctl(vm->vcpu_fd, KVM_GET_SREGS, &s) == 0) addr = s.cr2;
        snprintf(what, sizeof what, "%s at address 0x%llx", (err & 16) ? "instruction fetch" : (err & 2) ? "write" : "read",
                 (unsigned long long)addr);
    } else if (vector == 13) {
        int is_port;
        describe_gp(sb, rip, what, sizeof what, &is_port);
        if (is_port) { error_event(sb, ev, "%s (rip 0x%llx)", what, (unsigned long long)rip); return 1; }
    } else {
        snprintf(what, sizeof what, "%s", vector < 32 && vector_names[vector] ? vector_names[vector] : "CPU exception");
    }
    if (zb_signal_has_handler(sb, sig) && !(sb->sig.blocked & (1ull << (sig - 1)))) {
        sb->sig.pending |= 1ull << (sig - 1); /* the guest handles it itself (e.g. faulthandler) */
        sb->sig.fault_sig = sig;
        sb->sig.fault_addr = addr;
        /* si_code as Linux reports it: page faults say whether the page was mapped */
        sb->sig.fault_code = vector == 14 ? ((err & 1) ? 2 /* SEGV_ACCERR */ : 1 /* SEGV_MAPERR */)
                           : vector == 6 ? 2 /* ILL_ILLOPN */ : vector == 0 ? 1 /* FPE_INTDIV */ : 0x80 /* SI_KERNEL */;
        if (deliver_signals(sb, ev)) return 1;
        return set_user_state(sb, vm, ev) < 0;
    }
    zb_fault_event(sb, ev, sig, rip, addr, what);
    return 1;
}

static int handle_io(zb_sandbox *sb, zb_vm *vm, zb_event *ev) {
    struct kvm_run *run = vm->run;
    unsigned port = run->io.port;
    if (port >= ZB_UART_BASE && port < ZB_UART_BASE + ZB_UART_PORTS) {
        sb->stats.io_exits++;
        uint8_t *data = (uint8_t *)run + run->io.data_offset;
        if (run->io.size != 1) { error_event(sb, ev, "%u-byte access to UART port 0x%x: the UART is byte-wide", run->io.size, port); return 1; }
        for (uint32_t i = 0; i < run->io.count; i++) {
            if (run->io.direction == KVM_EXIT_IO_IN) { data[i] = zb_uart_port_in(&sb->uart, port - ZB_UART_BASE); continue; }
            if (sb->uart.frame_ready) { error_event(sb, ev, "string output across a UART frame boundary is not supported"); return 1; }
            char err[ZB_ERRLEN];
            if (zb_uart_port_out(&sb->uart, port - ZB_UART_BASE, data[i], err) < 0) {
                error_event(sb, ev, "guest sent a malformed UART frame: %.400s", err);
                return 1;
            }
        }
        if (sb->uart.frame_ready) {
            memset(ev, 0, sizeof *ev);
            ev->kind = ZB_EVENT_FRAME;
            uint16_t type;
            memcpy(&type, sb->uart.tx + 6, 2);
            ev->frame_type = type;
            ev->data = sb->uart.tx + ZB_FRAME_HEADER;
            ev->len = sb->uart.frame_ready - ZB_FRAME_HEADER;
            return 1;
        }
        return 0;
    }
    if (port == ZB_PORT_SYSCALL) {
        struct kvm_regs vr;
        if (zb_vm_exit_regs(vm, &vr) < 0) { error_event(sb, ev, "KVM_GET_REGS: %s", strerror(errno)); return 1; }
        if (run->io.direction == KVM_EXIT_IO_OUT)
            return vr.rip == ZB_SYSCALL_ENTRY + ZB_SYSCALL_ENTRY_OUT + ZB_STUB_OUT_LEN ? handle_syscall_entry(sb, vm, &vr, ev)
                                                                                     : handle_syscall_site(sb, vm, &vr, ev);
        /* user code can reach the port (the bitmap allows it), and write it (a syscall), not read it.
         * An `in` left pending would be completed by the next KVM_RUN, into the registers of the
         * next sandbox on this VM: complete it now, into this dead one's. */
        run->immediate_exit = 1;
        (void)ioctl(vm->vcpu_fd, KVM_RUN, 0); /* EINTR is the expected answer */
        run->immediate_exit = 0;
        error_event(sb, ev, "the guest accessed I/O port 0x%x; only the UART (0x%x-0x%x) is allowed (rip 0x%llx)", port, ZB_UART_BASE,
                    ZB_UART_BASE + ZB_UART_PORTS - 1, (unsigned long long)vr.rip);
        return 1;
    }
    if (port >= ZB_PORT_EXCEPTION && port < ZB_PORT_EXCEPTION + ZB_STUB_VECTORS && run->io.direction == KVM_EXIT_IO_OUT) {
        int vector = (int)(port - ZB_PORT_EXCEPTION);
        struct kvm_regs vr;
        if (zb_vm_exit_regs(vm, &vr) < 0) { error_event(sb, ev, "KVM_GET_REGS: %s", strerror(errno)); return 1; }
        if (vr.rip == zb_layout_stub_addr(vector) + ZB_STUB_OUT_LEN) return handle_exception(sb, vm, vector, &vr, ev);
    }
    error_event(sb, ev, "unexpected I/O exit on port 0x%x", port);
    return 1;
}

/* zb_sandbox_test_break_in_trap: a hardware execute breakpoint on the vector's stub (on = 1), or none. */
static int set_test_break(zb_sandbox *sb, zb_vm *vm, int on) {
    struct kvm_guest_debug dbg;
    memset(&dbg, 0, sizeof dbg);
    if (on) {
        dbg.control = KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_HW_BP;
        int v = sb->test_break_vector - 1;
        dbg.arch.debugreg[0] = v == ZB_BREAK_SYSCALL_ENTRY ? ZB_SYSCALL_ENTRY + ZB_SYSCALL_ENTRY_OUT : zb_layout_stub_addr(v);
        dbg.arch.debugreg[7] = 0x1; /* L0: execute, length 1 */
    }
    return ioctl(vm->vcpu_fd, KVM_SET_GUEST_DEBUG, &dbg);
}

static int handle_exit(zb_sandbox *sb, zb_vm *vm, zb_event *ev) {
    struct kvm_run *run = vm->run;
    switch (run->exit_reason) {
    case KVM_EXIT_IO: return handle_io(sb, vm, ev);
    case KVM_EXIT_DEBUG:
        if (!sb->test_break_vector) { error_event(sb, ev, "unexpected debug exit"); return 1; }
        sb->test_break_vector = 0; /* stopped mid-trap: the vCPU is at the stub or entry, its `out` not run */
        if (set_test_break(sb, vm, 0) < 0) { error_event(sb, ev, "KVM_SET_GUEST_DEBUG: %s", strerror(errno)); return 1; }
        memset(ev, 0, sizeof *ev);
        ev->kind = ZB_EVENT_KICK;
        return 1;
    case KVM_EXIT_INTR: return 0;
    case KVM_EXIT_SHUTDOWN: {
        struct kvm_regs r;
        if (ioctl(vm->vcpu_fd, KVM_GET_REGS, &r) < 0) {
            error_event(sb, ev, "the guest triple-faulted (KVM_GET_REGS then failed: %s)", strerror(errno));
            return 1;
        }
        zb_fault_event(sb, ev, SIGSEGV, r.rip, 0, "triple fault");
        return 1;
    }
    case KVM_EXIT_MMIO:
        error_event(sb, ev, "the guest accessed MMIO address 0x%llx: there are no devices there", (unsigned long long)run->mmio.phys_addr);
        return 1;
    case KVM_EXIT_HLT: error_event(sb, ev, "the guest halted the CPU"); return 1;
    case KVM_EXIT_INTERNAL_ERROR: error_event(sb, ev, "KVM internal error (suberror %u)", run->internal.suberror); return 1;
    case KVM_EXIT_FAIL_ENTRY:
        error_event(sb, ev, "KVM could not enter the guest (reason 0x%llx)", (unsigned long long)run->fail_entry.hardware_entry_failure_reason);
        return 1;
    default: error_event(sb, ev, "unexpected KVM exit reason %u", run->exit_reason); return 1;
    }
}

/* What the syscall entry answers in the guest for the process and thread about to run (its pid;
 * the fixed uid and gid; its fd table's per-fd answers), or off. Written before every KVM_RUN: every
 * change to an fd (read, write, lseek, dup, close, fcntl, fork, exec, another thread's or another
 * process's call on a shared description) happens in the host during an exit, and the next entry
 * into the guest, whichever process or thread it is, sees the table as it is then. A forked child's
 * memory starts as its parent's: rewritten here too. Only host files and overlay files answer
 * lseek(fd, 0, SEEK_CUR) (their seek is zb_file_seek_sized on f->offset, without side effects); every
 * kind but a pty's ends answers TCGETS with -ENOTTY. */
/* How long a timed answer (guest_abi.h ZB_ENTRY_TIMED) holds after the host saw its state. */
#define ENTRY_TIMED_NS 2000000

/* The timed answers for the run about to start: each is the state the syscall just served left
 * (zb_syscall_seq: any later syscall, of any thread or process, ends them), and holds until the
 * guest TSC passes deadline_tsc, ENTRY_TIMED_NS after the host saw that state. Needs the TSC's
 * rate and value (no timed answers without them). The caller's fd loop set ZB_EFD_EOF where
 * entry_eof_fresh said so, with `seen` the earliest of those files' eof_ns (now if none). */
static int entry_eof_fresh(const zb_file *f, uint64_t seq, int64_t now) {
    return f->eof_seq == seq && now - f->eof_ns < ENTRY_TIMED_NS;
}

/* The file this syscall opened, read into the entry's read buffer (guest_abi.h ZB_ENTRY_READ_BUF)
 * when it is a regular file opened for reading, still at offset 0, that fits: its first read (or
 * its only one) is then answered in the guest. A directory opened as opendir() opens one
 * (O_DIRECTORY | O_NONBLOCK: not a dirfd for the *at() calls, which would not list it) gets its
 * whole listing as getdents64 records, when they fit. Once per open (the next run takes it back);
 * 1 if filled. */
static int entry_read_fill(zb_sandbox *sb, zb_file *f, int fd, const struct stat *st, uint64_t seq) {
    if (sb->entry_read_seq == seq) return 0;
    sb->entry_read_seq = seq;
    if ((f->flags & O_ACCMODE) != O_RDONLY || (f->flags & O_PATH) || f->offset) return 0;
    uint8_t *buf = zb_layout_entry_read_buffer(&sb->mem);
    long n;
    if (f->kind == FILE_DIR) {
        if ((f->flags & (O_DIRECTORY | O_NONBLOCK)) != (O_DIRECTORY | O_NONBLOCK) || f->listing) return 0;
        n = zb_dir_dirents_all(sb, f, buf, ZB_ENTRY_READ_BYTES);
        /* too long (the listing is kept: taking it again would cost as much, and POSIX leaves a
         * file created after the opendir unspecified), or no listing: getdents64 exits */
        if (n < 0) return 0;
    } else {
        if ((f->kind != FILE_HOST && f->kind != FILE_OVERLAY) || !S_ISREG(st->st_mode) || st->st_size < 0 ||
            st->st_size > ZB_ENTRY_READ_BYTES)
            return 0;
        n = f->ops->read(sb, f, buf, ZB_ENTRY_READ_BYTES, 0);
        if (n != st->st_size) return 0; /* changed since the stat: the host serves the reads */
    }
    zb_layout_entry_read_filled(&sb->mem, (uint32_t)n);
    sb->entry_read_file = f;
    sb->entry_read_fd = fd;
    sb->entry_read_size = (uint32_t)n;
    return 1;
}

static void entry_timed_answers(zb_sandbox *sb, zb_vm *vm, struct zb_entry_data *d, uint64_t seq, int64_t now,
                                int64_t seen) {
    int any = seen < now;
    d->stat_fd = -1;
    d->read_fd = -1;
    int fd = sb->entry_stat_fd;
    if (sb->entry_stat_seq == seq && fd >= 0 && fd < ZB_ENTRY_FDS && sb->fds->fd[fd] == sb->entry_stat_file) {
        zb_file *f = sb->fds->fd[fd];
        struct stat st;
        _Static_assert(sizeof st == ZB_ENTRY_STAT_BYTES, "the entry's struct stat is the host's");
        if ((f->kind == FILE_HOST || f->kind == FILE_OVERLAY || f->kind == FILE_DIR) && zb_file_stat(sb, f, &st) == 0) {
            memcpy(d->stat, &st, sizeof st);
            d->stat_fd = fd;
            any = 1;
            if (vm->tsc_khz && entry_read_fill(sb, f, fd, &st, seq)) {
                d->read_fd = fd;
                d->read_size = sb->entry_read_size;
                d->read_dir = f->kind == FILE_DIR;
            }
        }
    }
    uint64_t tsc = any && vm->tsc_khz ? zb_vm_guest_tsc(vm) : 0;
    if (!tsc) { /* no deadline: no timed answer */
        for (int i = 0; i < ZB_ENTRY_FDS; i++) d->fd_state[i] &= (uint8_t)~ZB_EFD_EOF;
        d->stat_fd = -1;
        memset(d->stat, 0, sizeof d->stat);
        d->read_fd = -1;
        d->read_size = d->read_dir = 0;
        sb->entry_read_file = NULL;
        return;
    }
    int64_t left = ENTRY_TIMED_NS - (now - seen);
    d->deadline_tsc = tsc + (uint64_t)left * vm->tsc_khz / 1000000;
}

/* A close the entry may defer (ZB_EFD_CLOSE): dropping the fd is all it does, and nothing else in
 * the sandbox can see it before this process's next exit (threads share the one vCPU). */
static int close_deferrable(const zb_file *f) {
    return (f->kind == FILE_HOST || f->kind == FILE_OVERLAY || f->kind == FILE_DIR) && (f->flags & O_ACCMODE) == O_RDONLY;
}

/* Right after every KVM_RUN, before the exit is served: the close the entry deferred, made now.
 * The slot is guest-writable, so its fd is checked against what the entry was allowed to defer
 * (the table has not changed since entry_answers_refresh wrote ZB_EFD_CLOSE: only exits change it).
 * Taken with the answers off too, so that a user write to the slot means the same on every path. */
static void take_deferred_close(zb_sandbox *sb) {
    int fd = zb_layout_take_deferred_close(&sb->mem);
    if (fd < 0 || fd >= ZB_ENTRY_FDS || !sb->fds->fd[fd] || !close_deferrable(sb->fds->fd[fd])) return;
    zb_fd_close(sb, fd);
}

/* Right after every KVM_RUN, before the deferred close and the exit: what the run read of the
 * entry's read buffer (ZB_ENTRY_READ_POS, guest-written: bounded by the buffer's size) becomes
 * the file's offset (it was 0 when the buffer was filled, and only exits change the table): the
 * bytes of a file, the whole records of a directory's listing. */
static void take_entry_read(zb_sandbox *sb) {
    zb_file *f = sb->entry_read_file;
    if (!f) return;
    sb->entry_read_file = NULL;
    uint32_t pos = zb_layout_take_entry_read(&sb->mem);
    int fd = sb->entry_read_fd;
    if (fd < 0 || fd >= ZB_ENTRY_FDS || sb->fds->fd[fd] != f) return;
    /* a listing nothing has read yet is taken again at the first getdents64, as without the
     * answer: a file created after the open is in it, as on Linux */
    if (!pos && f->kind == FILE_DIR) zb_dir_drop_listing(f);
    if (!pos) return;
    pos = ZB_MIN(pos, sb->entry_read_size);
    f->offset = f->kind == FILE_DIR ? zb_dir_dirents_count(zb_layout_entry_read_buffer(&sb->mem), pos) : pos;
}

static void entry_answers_refresh(zb_sandbox *sb, zb_vm *vm) {
    if (!vm->guest_answers) { zb_layout_entry_answers(&sb->mem, 0, NULL); return; }
    struct zb_entry_data d;
    memset(&d, 0, sizeof d);
    d.value[0] = (uint32_t)zb_proc_getpid(sb);
    d.value[1] = ZB_GUEST_UID;
    d.value[2] = ZB_GUEST_GID;
    _Static_assert(ZB_ENTRY_FDS <= ZB_MAX_FDS, "the entry's fds are guest fds");
    uint64_t seq = atomic_load(&zb_syscall_seq);
    int64_t now = zb_now_ns(), seen = now;
    for (int fd = 0; fd < ZB_ENTRY_FDS; fd++) {
        const zb_file *f = sb->fds->fd[fd];
        if (!f) continue;
        if (entry_eof_fresh(f, seq, now)) { /* a timed answer: entry_timed_answers sets its deadline */
            d.fd_state[fd] |= ZB_EFD_EOF;
            seen = ZB_MIN(seen, f->eof_ns);
        }
        d.fd_state[fd] |= ZB_EFD_OPEN | (sb->fds->cloexec[fd] ? ZB_EFD_CLOEXEC : 0);
        if (f->kind != FILE_PTY_MASTER && f->kind != FILE_PTY_SLAVE)
            d.fd_state[fd] |= ZB_EFD_NOTTY; /* a terminal's TCGETS is file_pty.c's */
        d.fd_flags[fd] = (uint32_t)(f->flags | f->ops->status_flags);
        if ((f->kind == FILE_HOST || f->kind == FILE_OVERLAY) && f->offset <= (uint64_t)INT64_MAX) {
            d.fd_state[fd] |= ZB_EFD_SEEK;
            d.fd_offset[fd] = f->offset;
        }
        if (close_deferrable(f)) d.fd_state[fd] |= ZB_EFD_CLOSE;
        if (f->kind == FILE_DIR && f->listing && f->offset >= f->listing->n)
            d.fd_state[fd] |= ZB_EFD_DIR_END; /* a listing is kept once taken (file_dir.c): no deadline */
    }
    entry_timed_answers(sb, vm, &d, seq, now, seen);
    zb_layout_entry_answers(&sb->mem, 1, &d);
    struct zb_entry_sigactions acts; /* the process's dispositions, what sys_rt_sigaction copies out */
    for (int sig = 1; sig <= ZB_ENTRY_SIGS; sig++) {
        const zb_sigaction *a = &sb->sig.action[sig];
        acts.handler[sig - 1] = a->handler;
        acts.flags[sig - 1] = a->flags;
        acts.restorer[sig - 1] = a->restorer;
        acts.mask[sig - 1] = a->mask;
    }
    zb_layout_entry_sigactions(&sb->mem, &acts);
}

static void run_guest(zb_sandbox *sb, zb_vm *vm, zb_event *ev) {
    if (sb->uart.frame_ready) zb_uart_consume_frame(&sb->uart); /* the caller has seen it */
    sb->has_stop = 0;
    /* several threads, or the only one waits: signals raised meanwhile and who runs (run_threads.c) */
    if ((sb->threads.count > 1 || sb->threads.t[sb->threads.current].state != ZB_THREAD_RUNNABLE) &&
        zb_run_threads_start(sb, vm, ev))
        return;
    if (sb->cpu.pending_syscall && (sb->sig.pending & ~sb->sig.blocked)) {
        /* signals whose action is to do nothing (SIGCHLD by default) are discarded: they do not
         * interrupt the blocked syscall */
        uint64_t ready = sb->sig.pending & ~sb->sig.blocked, ignored = 0;
        for (int sig = 1; sig <= 64; sig++)
            if ((ready & ZB_SIG_BIT(sig)) && !zb_signal_interrupts(sb, sig) && !(ZB_SIG_BIT(sig) & ZB_SIG_UNBLOCKABLE)) ignored |= ZB_SIG_BIT(sig);
        sb->sig.pending &= ~ignored;
    }
    if (sb->sig.pending & ~sb->sig.blocked) {
        int mid_trap = 0;
        if (sb->cpu.pending_syscall) { /* interrupted while blocked: the syscall fails with EINTR */
            zb_cpu_interrupted(&sb->cpu);
        } else if ((mid_trap = sync_regs(sb, vm, ev)) < 0) {
            return;
        }
        /* mid-trap: the signals stay pending; the trap's exit below delivers them */
        if (!mid_trap && (deliver_signals(sb, ev) || set_user_state(sb, vm, ev) < 0)) return;
    }
    if (sb->cpu.pending_syscall && serve_syscall(sb, vm, ev)) return;
    for (;;) {
        if (sb->cpu.pending_syscall) { /* switched to a thread whose syscall yielded: serve it again */
            if (serve_syscall(sb, vm, ev)) return;
            continue;
        }
        /* a waiter's timeout, a signal for another thread, the time slice (run_threads.c) */
        if (sb->threads.count > 1 || sb->fam) {
            if (zb_run_threads_tick(sb, vm, ev)) return;
            if (sb->cpu.pending_syscall) continue; /* switched to a yielded syscall: served first */
        }
        if (zb_kick_pending(sb) || zb_outside_kick || (zb_run_deadline_ns && zb_now_ns() >= zb_run_deadline_ns)) {
            /* The run stops here. A KVM_RUN the kick or the deadline interrupted (EINTR) left the
             * vCPU anywhere in user code, and sb->cpu holds only its last syscall's registers; what
             * the host does next may take sb->cpu (the next cell's checkpoint, after a request
             * stopped threads or asyncio tasks running between cells), so it is made the vCPU's
             * now. Mid-trap, the trap's exit comes first (the kick stays pending). */
            int mid_trap = sync_regs(sb, vm, ev);
            if (mid_trap < 0) return;
            if (!mid_trap) {
                if (zb_take_kick(sb)) { memset(ev, 0, sizeof *ev); ev->kind = ZB_EVENT_KICK; return; }
                memset(ev, 0, sizeof *ev);
                ev->kind = ZB_EVENT_TIMEOUT;
                return;
            }
        }
        if ((sb->sig.alarm_ns && zb_alarm_check(sb, zb_now_ns())) || (zb_cpu_timers_armed(sb) && zb_cpu_timers_check(sb))) {
            /* SIGALRM (SIGVTALRM, SIGPROF) interrupts user code: take the registers back and enter its
             * handler (mid-trap: it stays pending, and the trap's exit delivers it) */
            int mid_trap = sync_regs(sb, vm, ev);
            if (mid_trap < 0 || (!mid_trap && (deliver_signals(sb, ev) || set_user_state(sb, vm, ev) < 0))) return;
            zb_run_timer_update(sb);
            continue;
        }
        zb_run_timer_rearm_if_spent(sb, vm);
        zb_kick_signal_seen = 0;
        entry_answers_refresh(sb, vm);
        ZB_PROF_BEGIN(sb, t_run);
        int run_rc = ioctl(vm->vcpu_fd, KVM_RUN, 0);
        take_entry_read(sb);
        take_deferred_close(sb);
        if (sb->profile) {
            sb->prof_exit_ns = zb_now_ns();
            sb->prof_run_ns = sb->prof_exit_ns - t_run;
        }
        if (run_rc < 0) {
            if (errno == EINTR || errno == EAGAIN) {
                zb_take_blocked_kick();
                if (sb->sig.alarm_ns && zb_now_ns() >= sb->sig.alarm_ns) continue; /* the wake timer: the alarm */
                /* A kick or the deadline stop the run at the loop's top (registers read first); so
                 * does another signal (e.g. the caller's SIGINT), as a kick for the caller to look
                 * at. Our own signal with nothing to do was the wake-up timer of an alarm that the
                 * loop already handled (it noticed the time first). */
                if (!zb_kick_pending(sb) && !(zb_run_deadline_ns && zb_now_ns() >= zb_run_deadline_ns) &&
                    !zb_kick_signal_seen)
                    zb_outside_kick = 1;
                continue;
            }
            error_event(sb, ev, "KVM_RUN failed: %s", strerror(errno));
            return;
        }
        sb->stats.exits++;
        if (handle_exit(sb, vm, ev)) return;
    }
}

/* The signal mask KVM applies while the vCPU runs; set only when it differs from the last one set
 * (a vCPU ioctl is a vCPU load and put under PVM, 8-10 us, and every run set the same mask). */
static int set_kvm_sigmask(zb_vm *vm, const sigset_t *mask) {
    if (vm->run_sigmask_set && !memcmp(vm->run_sigmask, mask, sizeof vm->run_sigmask)) return 0;
    struct {
        struct kvm_signal_mask h;
        uint8_t set[8];
    } m;
    m.h.len = 8; /* the kernel's sigset_t */
    memcpy(m.set, mask, 8);
    vm->run_sigmask_set = 0;
    if (ioctl(vm->vcpu_fd, KVM_SET_SIGNAL_MASK, &m) < 0) return -1;
    memcpy(vm->run_sigmask, mask, sizeof vm->run_sigmask);
    vm->run_sigmask_set = 1;
    return 0;
}

int zb_run_one(zb_sandbox *sb, int64_t deadline_ns, zb_event *ev) {
    memset(ev, 0, sizeof *ev);
    char err[ZB_ERRLEN];
    if (sb->finished) {
        ev->kind = ZB_EVENT_ERROR;
        snprintf(ev->message, sizeof ev->message, "this sandbox has finished (exited, crashed or was stopped) and cannot run again");
        return -1;
    }
    zb_engine *e = sb->engine;
    /* a child process runs on a children's executor, so that process 1's stays attached to it
     * with its shadow page tables warm, and so do the children's (kvm_vm.c; docs/ARCHITECTURE.md
     * "Processes") */
    int is_child = sb->fam && sb->fam->m[0].sb != sb;
    zb_vm *vm = zb_engine_executor(e, sb, is_child, err);
    if (!vm) {
        error_event(sb, ev, "cannot start the VM: %s", err);
        return 0;
    }
    /* Still attached (process 1 while children ran, or a child no other child displaced): the vCPU
     * is the process's state, whatever stopped its last run; after a stop in user code (a kick, the
     * deadline) or mid-trap, sb->cpu holds only its last syscall's registers. Reloaded from sb->cpu
     * only when the host changed that since (vcpu_stale), as an attach loads it. */
    int switching = vm->attached != sb;
    int64_t t_attach = zb_now_ns();
    if (!switching && sb->vcpu_stale && zb_vm_load_cpu(vm, sb, err) < 0) {
        error_event(sb, ev, "cannot reload the vCPU: %s", err);
        return 0;
    }
    sb->vcpu_stale = 0;
    if (zb_vm_attach(vm, sb, err) < 0) {
        error_event(sb, ev, "cannot start the VM: %s", err);
        return 0;
    }
    if (switching && sb->fam) { /* the fork breakdown (zb_stats proc_attach_ns) */
        sb->fam->attach_ns += (uint64_t)(zb_now_ns() - t_attach);
        sb->fam->attaches++;
    }
    int64_t t0 = zb_now_ns();
    sb->run_started_ns = t0;
    sb->run_waited_ns = zb_waited_ns;
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, ZB_KICK_SIGNAL);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    zb_run_wait_sigmask = old;
    sigdelset(&zb_run_wait_sigmask, ZB_KICK_SIGNAL);
    sb->runner = pthread_self();
    atomic_store(&sb->running, 1);
    if (set_kvm_sigmask(vm, &zb_run_wait_sigmask) < 0) {
        error_event(sb, ev, "KVM_SET_SIGNAL_MASK: %s", strerror(errno));
        goto out;
    }
    zb_run_deadline_ns = deadline_ns;
    if (zb_run_arm_wake_timer(sb, vm) < 0) {
        error_event(sb, ev, "cannot arm the run's wake-up timer: %s", strerror(errno));
        goto out;
    }
    if (sb->test_break_vector && set_test_break(sb, vm, 1) < 0) {
        error_event(sb, ev, "KVM_SET_GUEST_DEBUG: %s", strerror(errno));
        goto out;
    }
    zb_alarm_check(sb, t0); /* an alarm that expired while the sandbox was idle goes off now */
    zb_vdso_refresh(sb, vm);
    run_guest(sb, vm, ev);
    if (zb_vm_flush_user_state(vm) < 0 && ev->kind != ZB_EVENT_ERROR) /* the vCPU holds the state snapshots read */
        error_event(sb, ev, "KVM_SET_SREGS/REGS: %s", strerror(errno));
    zb_vdso_note_stop(sb, vm);
out:
    if (sb->test_break_vector) { /* not hit: the next sandbox on this VM must not stop there */
        sb->test_break_vector = 0;
        if (set_test_break(sb, vm, 0) < 0) /* a test hook: the run's own event stands */
            zb_log(sb, "cannot clear the test breakpoint (KVM_SET_GUEST_DEBUG): %s", strerror(errno));
    }
    if (vm->wake_timer_live) (void)timer_delete(vm->wake_timer); /* fails only for a bad timer id */
    vm->wake_timer_live = 0;
    vm->wake_at = 0;
    zb_run_deadline_ns = 0;
    atomic_store(&sb->running, 0);
    /* drop a kick that arrived after we stopped looking, then restore the caller's mask */
    struct timespec zero = {0, 0};
    while (sigtimedwait(&block, NULL, &zero) > 0) {}
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    uint64_t ran = (uint64_t)(zb_now_ns() - t0);
    sb->stats.run_ns += ran;   /* the host's statistic: all runs of this sandbox object */
    sb->proc.cpu_ns = zb_guest_cpu_ns(sb); /* the guest's CPU clock (this run less its waits): restored with its state */
    sb->run_started_ns = 0;
    return 0;
}

void zb_sandbox_kick(zb_sandbox *sb) {
    zb_family *fam = sb->fam; /* set once (the first fork), freed with the sandbox */
    if (fam) { /* whichever of its processes runs stops (zb_take_kick takes the family's flag) */
        atomic_store(&fam->kick, 1);
        if (atomic_load(&fam->running)) pthread_kill(fam->runner, ZB_KICK_SIGNAL);
        return;
    }
    atomic_store(&sb->kick_requested, 1);
    if (atomic_load(&sb->running)) pthread_kill(sb->runner, ZB_KICK_SIGNAL);
}
