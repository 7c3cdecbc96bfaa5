/* cpu_state.c - a sandbox's vCPU state (zb_cpu): its copy for a snapshot and its form on disk.
 *
 * What a sandbox keeps of its vCPU is the user-mode registers, FS/GS base, the XSAVE image and a
 * syscall that was interrupted and is served again on resume. The special registers and the MSRs
 * are not sandbox state: they are the same for every sandbox (STAR/LSTAR/SFMASK are set once per
 * executor VM in kvm_vm.c; segments, CR0/3/4 and EFER are rebuilt from the guest layout with the
 * saved FS/GS base on every load, zb_layout_user_sregs), so a snapshot carries none of them.
 */
#include "util.h"
#include "vm.h"
#include "linux.h"
#include "serial.h"

/* The XSAVE image's size is the host's (KVM_CAP_XSAVE2): a template from a host with another
 * layout cannot be loaded here. Bounded so a corrupt size never reaches malloc. */
#define XSAVE_MAX (1u << 20)

void zb_cpu_init_fpu(uint8_t *x, size_t xsave_size) {
    uint16_t fcw = 0x37f;
    uint32_t mxcsr = 0x1f80;
    memset(x, 0, xsave_size);
    memcpy(x, &fcw, 2);
    memcpy(x + 24, &mxcsr, 4);
}

int zb_cpu_clone(zb_cpu *dst, const zb_cpu *src, size_t xsave_size) {
    *dst = *src;
    if (!(dst->xsave = malloc(xsave_size))) return -1;
    memcpy(dst->xsave, src->xsave, xsave_size);
    return 0;
}

void zb_cpu_syscall_done(zb_cpu *c) {
    c->pending_syscall = 0;
    c->vfork_child = 0;
    c->pending_wake_ns = 0;
    c->waits_input = 0;
    c->io_done = 0;
    c->fifo_wait = 0;
}

void zb_cpu_interrupted(zb_cpu *c) {
    c->regs.rax = c->io_done ? c->io_done : (uint64_t)-EINTR;
    zb_cpu_syscall_done(c);
}

void zb_cpu_free(zb_cpu *c) {
    free(c->xsave);
    c->xsave = NULL;
}

static void save_regs(const struct kvm_regs *r, zb_out *o) {
    const uint64_t v[18] = {r->rax, r->rbx, r->rcx, r->rdx, r->rsi, r->rdi, r->rsp, r->rbp, r->r8, r->r9,
                            r->r10, r->r11, r->r12, r->r13, r->r14, r->r15, r->rip, r->rflags};
    for (int i = 0; i < 18; i++) out_u64(o, v[i]);
}

static void load_regs(struct kvm_regs *r, zb_in *in) {
    __u64 *const v[18] = {&r->rax, &r->rbx, &r->rcx, &r->rdx, &r->rsi, &r->rdi, &r->rsp, &r->rbp, &r->r8, &r->r9,
                          &r->r10, &r->r11, &r->r12, &r->r13, &r->r14, &r->r15, &r->rip, &r->rflags};
    memset(r, 0, sizeof *r);
    for (int i = 0; i < 18; i++) *v[i] = in_u64(in);
}

/* Not saved: pending_wake_ns (a host CLOCK_MONOTONIC time, meaningless in another boot: an
 * interrupted sleep served again from a loaded template recomputes its wake time from its
 * arguments), waits_input (a hint, set again when the wait is served again) and context_restored
 * (only set while one syscall is served). */
void zb_cpu_save(const zb_cpu *c, size_t xsave_size, struct zb_out *o) {
    save_regs(&c->regs, o);
    out_u64(o, c->fs_base);
    out_u64(o, c->gs_base);
    out_u64(o, xsave_size);
    out_bytes(o, c->xsave, xsave_size);
    out_u32(o, c->pending_syscall ? 1 : 0);
    out_u64(o, c->pending_nr);
    out_u64(o, c->pending_syscall ? c->io_done : 0);
}

int zb_cpu_load(zb_cpu *c, size_t xsave_size, struct zb_in *in, char *err) {
    memset(c, 0, sizeof *c);
    load_regs(&c->regs, in);
    c->fs_base = in_u64(in);
    c->gs_base = in_u64(in);
    uint64_t size = in_count(in, XSAVE_MAX);
    if (in->err) { zb_seterr(err, "vCPU state: truncated, or an XSAVE image of an impossible size"); return -1; }
    if (size != xsave_size) {
        zb_seterr(err, "the template was made where the CPU's XSAVE state has another size (%llu bytes, here %zu): "
                  "it must be rebuilt here", (unsigned long long)size, xsave_size);
        return -1;
    }
    if (!(c->xsave = malloc(xsave_size))) { zb_seterr(err, "out of memory"); return -1; }
    in_bytes(in, c->xsave, xsave_size);
    uint32_t pending = in_u32(in);
    c->pending_nr = in_u64(in);
    c->io_done = in_u64(in);
    if (in->err || pending > 1 || (pending && c->pending_nr >= ZB_SYSCALL_MAX) || c->io_done > (1ull << 30) ||
        (c->io_done && !pending)) {
        zb_cpu_free(c);
        zb_seterr(err, "vCPU state: truncated or corrupt");
        return -1;
    }
    c->pending_syscall = (int)pending;
    return 0;
}
