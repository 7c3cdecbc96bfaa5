/* vm.h - the vm layer: /dev/kvm and the executor VM (kvm_vm.c), the guest's low memory: page
 * tables, descriptors, CPL0 stubs (guest_layout.c), and a sandbox's vCPU state (cpu_state.c).
 */
#ifndef ZB_VM_H
#define ZB_VM_H
#include "memory.h"
#include "guest_abi.h"

#include <linux/kvm.h>
#include <signal.h>
#include <time.h>

struct zb_out; /* serial.h: the snapshot state writer and reader */
struct zb_snapshot; /* snapshot.h: a parked memory's base snapshot (below) */
#define ZB_MAX_MEMSLOTS 18   /* below the window, its parts (at most 16), above it */
struct zb_in;
/* ---- executor VM (kvm_vm.c) ---- */
#define ZB_CHILD_VMS 8           /* child processes that keep a VM of their own while they take turns */
typedef struct zb_vm {
    int vm_fd, vcpu_fd;
    struct kvm_run *run;
    size_t run_size;
    zb_sandbox *attached;    /* whose memory is in the memslots and whose vCPU state is loaded */
    /* The attached sandbox's memory as KVM memslots, in guest-physical order: below its unlogged
     * window (memory.h), each part of the window, above it; one slot when it has none. `logged`
     * is KVM's state of the slot, which collecting the changed pages follows. */
    struct zb_memslot {
        uint64_t first_pfn, npages;
        int logged;
        int part;            /* the window part it is, or -1 */
    } slot[ZB_MAX_MEMSLOTS];
    int nslots;
    /* Host address of the memory the memslots map (NULL: none). The slots stay after a detach, so
     * that attaching the same memory again keeps KVM's shadow page tables of it (zb_vm_attach):
     * on this nested host every page a guest touches first in a VM costs a shadow fault of
     * 20-40 us, ~2,800 of them for a new fork's first cell. */
    const uint8_t *slots_host;
    /* A freed sandbox's memory that the memslots still map, kept for the next fork of its lineage
     * (snapshot.c, "parked memory"), and that memory's base snapshot. Owned by the snapshot
     * layer: it parks, takes and drops them; this layer only keeps them. */
    zb_memory parked;
    struct zb_snapshot *parked_base;
    uint64_t parked_own;     /* its pages that differ from parked_base (its dirty set) */
    uint64_t tsc_khz;
    /* The guest's TSC is the host's plus this (KVM_VCPU_TSC_OFFSET, checked against KVM's own
     * reading at creation): zb_vm_guest_tsc reads it without an ioctl, which under PVM costs a vCPU
     * load and put (8-20 us), and the vDSO's clock sampling took up to eight of them at every run. */
    int64_t tsc_offset;
    int tsc_offset_known;
    uint8_t run_sigmask[8];  /* the KVM_SET_SIGNAL_MASK last set (run_loop.c), if run_sigmask_set */
    int run_sigmask_set;
    timer_t wake_timer;      /* during a run: sends the kick signal at the deadline or the guest's alarm */
    int wake_timer_live;
    int64_t wake_at;         /* the CLOCK_MONOTONIC time it is armed for (0: disarmed): once past, the
                                timer has fired and must be armed again before the next KVM_RUN */
    int manual_protect;      /* KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 is on: reading the dirty log does not
                                write-protect pages; zb_vm_protect_pages does, for the pages we name */
    /* The vCPU's special registers as last read, for returns to user mode after a syscall: they
     * are the user template (zb_layout_user_sregs, applied on each return) plus fields that do not
     * change while the guest runs at CPL3 without an irqchip (APIC base, CR8, no pending
     * interrupt; CR2 is not readable at CPL3). Saves a KVM_GET_SREGS per syscall (~3 us here).
     * Read again on every zb_vm_load_cpu. */
    struct kvm_sregs user_sregs;
    int user_sregs_valid;
    /* KVM_CAP_SYNC_REGS is in use (zb_vm_set_user_state): kvm_run carries the registers out of
     * every exit and the registers to enter with, so that a syscall round trip is one ioctl
     * (KVM_RUN) instead of four (KVM_GET_REGS, KVM_SET_SREGS, KVM_SET_REGS, KVM_RUN): under PVM
     * each vCPU ioctl costs a vcpu load/put (MSR reads, CR4 writes). */
    int sync_regs;
    /* The syscall entry answers getpid, getuid/geteuid, getgid/getegid in the guest
     * (ZB_SYSCALLS_GUEST_ANSWERS, PVM only: guest_abi.h zb_entry_data). */
    int guest_answers;
    /* Syscall sites that exit are rewritten (ZB_SYSCALLS_SITE_REWRITE, syscall_sites.c). */
    int site_rewrite;
    uint64_t last_used;      /* zb_engine.executor_runs at its last pick (zb_engine_executor) */
} zb_vm;

/* Set by the handler of ZB_KICK_SIGNAL on this thread (kvm_vm.c); the run loop clears it before KVM_RUN. */
extern __thread volatile sig_atomic_t zb_kick_signal_seen;
/* Set by that handler when the kick signal came from another process, not from the run's own
 * wake-up timer; taken (and cleared) by zb_take_kick. */
extern volatile sig_atomic_t zb_outside_kick;

struct zb_engine {
    int kvm_fd;
    struct kvm_cpuid2 *cpuid;
    size_t vcpu_mmap_size;
    size_t xsave_size;       /* bytes KVM_GET_XSAVE(2) fills */
    int have_xsave2;
    uint64_t xcr0;
    zb_vm *vm;               /* the executor; created on first run */
    /* The executors of child processes (family_run.c), each created at the first run that needs
     * it: process 1 keeps `vm` and its shadow page tables while its children run, and up to
     * ZB_CHILD_VMS children keep theirs while they take turns (a pool worker and the parent, a
     * Manager's server and its clients), instead of re-attaching one VM at each switch, which
     * throws its shadow page tables away (DESIGN: ~20 ms of faults for a Python process). */
    zb_vm *child_vms[ZB_CHILD_VMS];
    uint64_t executor_runs;  /* picks of a child executor, for least-recently-used replacement */
    struct zb_net *net;      /* the network policy (net.h), NULL: no network */
    int syscall_path_off;    /* ZB_SYSCALLS_* bits switched off (zb_engine_set_syscall_path) */
    int entry_runs_at_cpl3;  /* KVM is PVM (kvm_pvm loaded, no kvm_intel/kvm_amd): `syscall` reaches
                              * LSTAR at CPL3, so the entry may return to user code itself */
    int parking_off;         /* zb_engine_set_parking(e, 0): freed memory is never parked (snapshot.c) */
    uint64_t parked_taken, parked_dropped; /* forks that took a parked memory; parked ones given back */
};

int zb_vm_create(zb_engine *e, zb_vm **out, char *err);
void zb_vm_destroy(zb_vm *vm);
/* Point the memslots at the sandbox's memory and load its vCPU state (no-op if already attached). */
/* The executor VM the sandbox is attached to, or the engine's main one if none is. */
zb_vm *zb_vm_of(const zb_sandbox *sb);
/* The executor a process runs on next: process 1 (is_child 0) on the engine's own VM; a child on
 * the child executor still attached to it, else an idle one, else the one picked longest ago
 * (which displaces its process); created when missing. sb is detached from any other executor
 * first. NULL with err on failure. */
zb_vm *zb_engine_executor(zb_engine *e, zb_sandbox *sb, int is_child, char *err);
int zb_vm_attach(zb_vm *vm, zb_sandbox *sb, char *err);
/* Save the attached sandbox's vCPU state and dirty log back into it and detach. */
int zb_vm_detach(zb_vm *vm, char *err);
/* Merge KVM's dirty log into the attached sandbox's host_dirty. With keep_writable (a snapshot or
 * a restore that compares pages, snapshot.c), logged pages stay writable for the guest and stay in
 * the log, and the caller write-protects those it finds unchanged (zb_vm_protect_pages); otherwise
 * every logged page is write-protected again, so that the next write to it is logged. */
int zb_vm_collect_dirty(zb_vm *vm, int keep_writable, char *err);
/* Make the attached sandbox's window parts logged or not as its memory wishes (memory.h): a part
 * that stops being logged gives its log to host_dirty first; one that starts being logged gives
 * its populated pages to host_dirty first, unless just_snapshotted says a snapshot has just taken
 * them (no guest ran since its collection). Best effort: a part left as it was stays correct. */
void zb_vm_sync_window(zb_vm *vm, zb_sandbox *sb, int just_snapshotted);
/* Write-protect (and clear in the dirty log) the pages set in `pages` (one bit per guest page). */
int zb_vm_protect_pages(zb_vm *vm, uint64_t *pages, char *err);
int zb_vm_save_xsave(zb_vm *vm, zb_sandbox *sb, char *err);
/* Load sb->cpu.xsave into the vCPU (the attached sandbox's image changed: exec). */
int zb_vm_load_xsave(zb_vm *vm, zb_sandbox *sb, char *err);
/* Load the attached sandbox's registers, segments and XSAVE image into the vCPU. */
int zb_vm_load_cpu(zb_vm *vm, zb_sandbox *sb, char *err);
/* Another thread of the attached sandbox (run_threads.c): its XSAVE image now, its registers and
 * FS/GS base with the next entry, as a syscall's return sets them (KVM_CAP_SYNC_REGS), instead of
 * zb_vm_load_cpu's four ioctls. zb_vm_load_cpu for a sandbox that is not attached. */
int zb_vm_load_thread(zb_vm *vm, zb_sandbox *sb, char *err);
/* Sandbox sb (NULL: none) and memory m (its own, or a parked one) go away: no executor may keep
 * either attached or m in its memslots. */
void zb_engine_forget(zb_engine *e, const zb_sandbox *sb, const zb_memory *m);
/* Close /dev/kvm and free the executors (zb_engine_close, snapshot.c, gives back what they
 * park first). */
void zb_engine_destroy(zb_engine *e);
/* The vCPU's registers at the last exit of KVM_RUN (kvm_run's copy with sync_regs, else
 * KVM_GET_REGS). -1 with errno on failure. */
int zb_vm_exit_regs(zb_vm *vm, struct kvm_regs *out);
/* Enter user mode with these registers: with sync_regs they are applied by the next KVM_RUN,
 * else at once (KVM_SET_SREGS + KVM_SET_REGS). -1 with errno on failure. */
int zb_vm_set_user_state(zb_vm *vm, const struct kvm_regs *regs, const struct kvm_sregs *sregs);
/* Apply registers zb_vm_set_user_state left for the next KVM_RUN now (before anything reads or
 * writes the vCPU by other means, and when a run ends). -1 with errno on failure. */
int zb_vm_flush_user_state(zb_vm *vm);
/* Apply the engine's syscall path (zb_engine_set_syscall_path): LSTAR, KVM_CAP_SYNC_REGS. */
int zb_vm_apply_syscall_path(zb_vm *vm, zb_engine *e, char *err);

/* ---- guest low memory: page tables, descriptors, CPL0 stubs (guest_layout.c) ---- */
void zb_layout_write(zb_memory *m);
/* The guest's TSC now (on VMX it carries an offset from the host's); 0 if KVM does not say. */
uint64_t zb_vm_guest_tsc(zb_vm *vm);
/* Write the syscall entry page's zb_entry_data (guest_abi.h): *d with on set, or (off) all zero:
 * every syscall exits. The page is dirtied only when its data changes. */
void zb_layout_entry_answers(zb_memory *m, int on, const struct zb_entry_data *d);
/* The dispositions the entry's rt_sigaction query copies (guest_abi.h ZB_ENTRY_SIG_DATA): written,
 * and the page dirtied, only where they changed. */
void zb_layout_entry_sigactions(zb_memory *m, const struct zb_entry_sigactions *acts);
/* The fd of the close the guest's entry deferred (guest_abi.h ZB_ENTRY_CLOSE_SLOT), or -1; the
 * slot is emptied. A guest-written value: the caller checks it is a deferrable fd. */
int zb_layout_take_deferred_close(zb_memory *m);
/* The entry's read buffer (guest_abi.h ZB_ENTRY_READ_BUF, ZB_ENTRY_READ_BYTES long) in host
 * memory, for the host to fill; zb_layout_entry_read_filled then dirties its first n bytes and
 * sets the guest's position to 0. */
uint8_t *zb_layout_entry_read_buffer(zb_memory *m);
void zb_layout_entry_read_filled(zb_memory *m, uint32_t n);
/* The guest's position in that buffer (ZB_ENTRY_READ_POS), which is set back to 0: a
 * guest-written value, which the caller bounds. */
uint32_t zb_layout_take_entry_read(zb_memory *m);
/* Into r: rsi and rcx as the read block saved them (ZB_ENTRY_READ_SAVE), and rdi the read_fd the
 * host last wrote into the entry data. */
void zb_layout_entry_read_saved(const zb_memory *m, struct kvm_regs *r);
void zb_layout_user_sregs(const zb_memory *m, struct kvm_sregs *s, uint64_t fs_base, uint64_t gs_base);
uint64_t zb_layout_stub_addr(int vector);
uint64_t zb_layout_exception_stack_top(void);

/* ---- vCPU state of a sandbox (cpu_state.c) ---- */
typedef struct zb_cpu {
    struct kvm_regs regs;    /* user-mode registers to resume with */
    uint64_t fs_base, gs_base;
    uint8_t *xsave;          /* engine->xsave_size bytes, KVM's standard XSAVE layout; while the
                                sandbox is attached, the VM holds the current contents */
    int pending_syscall;     /* a syscall was interrupted and is re-served on resume */
    uint64_t pending_nr;
    int64_t pending_wake_ns; /* for an interrupted sleep: absolute wake time */
    int waits_input;         /* the interrupted syscall waits for UART input (a read, or a poll of it
                                among other files: zb_wait_input), so pushed input wakes this thread
                                first; not saved (a loaded read of the UART is found by its number) */
    uint64_t io_done;        /* a blocking write to a pipe or stream socket waiting for room: the bytes
                                it moved already (sys_files.c whole writes); its result if a signal
                                interrupts it (zb_cpu_interrupted) */
    int32_t vfork_child;     /* a thread in vfork: the child it waits for (sys_procs.c), 0 once the
                                syscall is over; per thread, since threads of a process vfork at
                                the same time (subprocess from a thread pool) */
    uint64_t fifo_wait;      /* a blocked open of a FIFO: the id of its zb_fifo_wait (file_fifo.c), 0
                                once the syscall completed or was interrupted; not saved (a loaded
                                thread starts its open over) */
    int context_restored;    /* set by rt_sigreturn: regs (rax included) are the restored context,
                                not a syscall's result, whatever value rax holds */
} zb_cpu;
/* A copy with its own XSAVE image (xsave_size bytes, the engine's); -1 out of memory. */
int zb_cpu_clone(zb_cpu *dst, const zb_cpu *src, size_t xsave_size);
/* The FPU state of a new program into an XSAVE image of xsave_size bytes: x87 control word and
 * MXCSR at their reset values, every extended component in its init state (XSTATE_BV = 0). */
void zb_cpu_init_fpu(uint8_t *xsave, size_t xsave_size);
void zb_cpu_free(zb_cpu *c);
/* A signal interrupts the blocked syscall c was to serve again: it is no longer pending, and its
 * result is -EINTR, or what a whole write moved before it waited (io_done), as Linux returns a
 * partial count then. */
/* The syscall it was in completed (or the thread gave it up): nothing of it is pending any more. */
void zb_cpu_syscall_done(zb_cpu *c);
void zb_cpu_interrupted(zb_cpu *c);
/* On disk. A load refuses an XSAVE image of another size than xsave_size (another host's CPU). */
void zb_cpu_save(const zb_cpu *c, size_t xsave_size, struct zb_out *o);
int zb_cpu_load(zb_cpu *c, size_t xsave_size, struct zb_in *in, char *err);

#endif
