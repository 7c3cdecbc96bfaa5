/* engine.h - internal declarations shared by the engine's C files (not part of the cffi contract).
 *
 * Ownership, in Firecracker's spirit: each stateful part (memory, cpu, files, fds, signals, uart,
 * process) owns its own state struct and its clone (a snapshot's copy), save and load (its section
 * of the state file, serial.h); snapshot.c and snapshot_file.c only call them. The layers, and the
 * per-layer headers this one should become, are in docs/ARCHITECTURE.md section 7.
 */
#ifndef ZB_ENGINE_H
#define ZB_ENGINE_H
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/kvm.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "guest_abi.h" /* what the guest's code relies on: trap address, stub ports, UART, vDSO data */
#include "zeroboot.h"

#define ZB_PAGE 4096ul
#define ZB_PAGE_UP(x) (((x) + ZB_PAGE - 1) & ~(ZB_PAGE - 1))
#define ZB_PAGE_DOWN(x) ((x) & ~(ZB_PAGE - 1))
#define ZB_HUGE (2ul << 20)
#define ZB_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ZB_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- guest physical (= virtual) layout; see guest_layout.c and docs/ARCHITECTURE.md ---- */
#define ZB_LOW_REGION (2ul << 20)        /* supervisor-only: page tables, GDT/IDT/TSS, CPL0 stubs */
#define ZB_MEM_MIN (64ul << 20)
#define ZB_MEM_MAX (64ul << 30)
#define ZB_STACK_SIZE (8ul << 20)
#define ZB_PIE_BASE (16ul << 20)

#define ZB_MAX_FDS 1024
#define ZB_LOG_MAX 8192

typedef struct zb_fs zb_fs;
typedef struct zb_fdtable zb_fdtable;
/* The snapshot state writer and reader (serial.h): each component saves and loads its own state
 * with them (zb_cpu_save, zb_signals_save, ...; snapshot_file.c calls them in order). */
struct zb_out;
struct zb_in;
/* A memory image a sandbox's mapping can be built on: a template's memory file, shared
 * read-only (MAP_PRIVATE) by every fork in every process that loads the template. */
typedef struct zb_image {
    atomic_int refs;
    int fd;
    uint64_t size;
    const uint8_t *map;      /* read-only view of the image, to compare pages with; NULL if unmappable */
    uint64_t *data;          /* bitmap: page holds data in the file (else it is a hole: zeros);
                                NULL if the file system cannot tell (then every page may hold data) */
} zb_image;
/* Does image page pfn read as zeros without reading it (a hole of the sparse image file)? */
int zb_image_page_is_hole(const zb_image *img, uint64_t pfn);
zb_image *zb_image_new(int fd, uint64_t size);
void zb_image_ref(zb_image *img);
void zb_image_unref(zb_image *img);

/* ---- errors, logging, the clock (util.c) ---- */
/* Format an error message into err (ZB_ERRLEN bytes; NULL: dropped). */
void zb_seterr(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append a line to the sandbox's log (zb_sandbox_take_log drains it). */
void zb_log(zb_sandbox *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Host CLOCK_MONOTONIC in ns. */
int64_t zb_now_ns(void);

/* ---- executor VM (kvm_vm.c) ---- */
typedef struct zb_vm {
    int vm_fd, vcpu_fd;
    struct kvm_run *run;
    size_t run_size;
    zb_sandbox *attached;    /* whose memory is in slot 0 and whose vCPU state is loaded */
    uint64_t slot_hva, slot_size;
    int slot_present;
    uint64_t tsc_khz;
    timer_t wake_timer;      /* during a run: sends the kick signal at the deadline or the guest's alarm */
    int wake_timer_live;
    int manual_protect;      /* KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 is on: reading the dirty log does not
                                write-protect pages; zb_vm_protect_pages does, for the pages we name */
    /* The vCPU's special registers as last read, for returns to user mode after a syscall: they
     * are the user template (zb_layout_user_sregs, applied on each return) plus fields that do not
     * change while the guest runs at CPL3 without an irqchip (APIC base, CR8, no pending
     * interrupt; CR2 is not readable at CPL3). Saves a KVM_GET_SREGS per syscall (~3 us here).
     * Read again on every zb_vm_load_cpu. */
    struct kvm_sregs user_sregs;
    int user_sregs_valid;
} zb_vm;

struct zb_engine {
    int kvm_fd;
    struct kvm_cpuid2 *cpuid;
    size_t vcpu_mmap_size;
    size_t xsave_size;       /* bytes KVM_GET_XSAVE(2) fills */
    int have_xsave2;
    uint64_t xcr0;
    zb_vm *vm;               /* the executor; created on first run */
};

int zb_vm_create(zb_engine *e, zb_vm **out, char *err);
void zb_vm_destroy(zb_vm *vm);
/* Point slot 0 at the sandbox's memory and load its vCPU state (no-op if already attached). */
int zb_vm_attach(zb_vm *vm, zb_sandbox *sb, char *err);
/* Save the attached sandbox's vCPU state and dirty log back into it and detach. */
int zb_vm_detach(zb_vm *vm, char *err);
/* Merge KVM's dirty log into the attached sandbox's host_dirty. With keep_writable (a snapshot or
 * a restore that compares pages, snapshot.c), logged pages stay writable for the guest and stay in
 * the log, and the caller write-protects those it finds unchanged (zb_vm_protect_pages); otherwise
 * every logged page is write-protected again, so that the next write to it is logged. */
int zb_vm_collect_dirty(zb_vm *vm, int keep_writable, char *err);
/* Write-protect (and clear in the dirty log) the pages set in `pages` (one bit per guest page). */
int zb_vm_protect_pages(zb_vm *vm, uint64_t *pages, char *err);
int zb_vm_save_xsave(zb_vm *vm, zb_sandbox *sb, char *err);
/* Load the attached sandbox's registers, segments and XSAVE image into the vCPU. */
int zb_vm_load_cpu(zb_vm *vm, zb_sandbox *sb, char *err);
/* The sandbox's memory goes away: unmap it from the executor if attached. */
int zb_vm_forget(zb_vm *vm, zb_sandbox *sb, char *err);

/* ---- guest memory (guest_memory.c) ---- */
typedef struct zb_region {   /* what the guest mapped where: for fault reports and munmap */
    uint64_t start, end;
    int prot;
    char name[96];
} zb_region;

struct zb_shmap;
typedef struct zb_memory {
    uint8_t *host;           /* host address of guest physical 0 */
    uint64_t size;           /* bytes, multiple of 2 MiB */
    uint64_t npages;
    uint64_t *allocated;     /* bitmap: page belongs to the guest (ELF, stack, brk, mmap) */
    uint64_t *host_dirty;    /* bitmap: pages changed by the engine (guest writes: KVM dirty log) */
    uint64_t *file_backed;   /* bitmap: page's host mapping is a file (the base image, a snapshot
                                store or a host file the guest mapped): MADV_DONTNEED would not
                                make it read zero */
    uint64_t *from_image;    /* bitmap: page's host mapping is the base image at the same offset,
                                so MADV_DONTNEED reverts it to the image's content */
    uint64_t pages_allocated, pages_limit;
    uint64_t mmap_top;       /* top-down mmap search starts below this */
    uint64_t brk_start, brk_end;
    zb_region *regions;
    size_t nregions, regions_cap;
    zb_image *image;         /* base image this mapping was forked from, or NULL */
    uint8_t *unchanged_runs; /* per page: snapshots in a row that found it logged as written but
                                unchanged while it was left writable (snapshot.c); NULL until the
                                first snapshot needs it */
    uint64_t *stale;         /* bitmap: freed anonymous pages kept mapped for reuse (still holding
                                what the guest wrote): zeroed when handed out again, given back at
                                the next restore (zb_mem_free_for_reuse) */
    uint64_t stale_pages;
    struct zb_shmap *shmap;  /* MAP_SHARED mappings of overlay files (shared_map.h), or NULL */
} zb_memory;

int zb_mem_init(zb_memory *m, uint64_t size, zb_image *image, char *err);
void zb_mem_destroy(zb_memory *m);
/* The bookkeeping part of guest memory (which pages are the guest's, its regions, brk), as a
 * snapshot keeps it. */
typedef struct zb_mem_meta {
    uint64_t *allocated;
    uint64_t npages, pages_allocated, pages_limit, mmap_top, brk_start, brk_end;
    zb_region *regions;
    size_t nregions;
    struct zb_shmap *shmap;  /* a copy of zb_memory's, or NULL */
} zb_mem_meta;
/* Copy m's bookkeeping into a snapshot's (capture), or a snapshot's back into m (apply). */
int zb_mem_meta_capture(const zb_memory *m, zb_mem_meta *out);
int zb_mem_meta_apply(zb_memory *m, const zb_mem_meta *in);
void zb_mem_meta_free(zb_mem_meta *meta);
/* On disk; a load refuses another page count than npages (the snapshot's memory size). */
void zb_mem_meta_save(const zb_mem_meta *m, struct zb_out *o);
int zb_mem_meta_load(zb_mem_meta *m, uint64_t npages, struct zb_in *in, char *err);
/* Validated access to guest memory: NULL unless [addr, addr+len) lies in guest-allocated user
 * pages. `write` marks the pages dirty. */
void *zb_guest_ptr(zb_sandbox *sb, uint64_t addr, uint64_t len, int write);
int zb_copy_from_guest(zb_sandbox *sb, void *dst, uint64_t addr, uint64_t len);
int zb_copy_to_guest(zb_sandbox *sb, uint64_t addr, const void *src, uint64_t len);
/* Copy a NUL-terminated guest string; -EFAULT or -ENAMETOOLONG. */
int zb_guest_string(zb_sandbox *sb, uint64_t addr, char *buf, size_t cap);
uint64_t zb_mem_alloc(zb_memory *m, uint64_t len);            /* top-down; 0 if none */
int zb_mem_range_free(const zb_memory *m, uint64_t addr, uint64_t len);
int zb_mem_range_allocated(const zb_memory *m, uint64_t addr, uint64_t len);
void zb_mem_mark(zb_memory *m, uint64_t addr, uint64_t len, int allocated);
/* Give pages back: contents read as zero afterwards. */
int zb_mem_zero(zb_memory *m, uint64_t addr, uint64_t len);
/* The guest freed [addr, addr+len): like zb_mem_zero, but a big anonymous range keeps its host
 * pages (and the VM's mappings of them) until the next restore, and is zeroed in place if the
 * guest allocates it again (zb_mem_mark): a freed 80 MB temporary costs one memset instead of
 * 20,000 first-touch faults. Snapshots record such pages as zero pages (they are logged as
 * written and not allocated). The caller marks the range free. */
int zb_mem_free_for_reuse(zb_memory *m, uint64_t addr, uint64_t len);
/* Give back every page kept for reuse (before a restore: memory then holds exactly what the
 * snapshot says, and nothing freed survives a rollback, a rewind or an isolated cell's reset). */
int zb_mem_release_stale(zb_memory *m);
/* Host-side prefault of a new anonymous guest mapping the guest is about to fill (numpy arrays,
 * pandas frames): transparent huge pages where allowed, then MADV_POPULATE_WRITE, so the guest's
 * first touch of each page costs ~1.5 us instead of 8-20 us. Best effort: errors are ignored. */
void zb_mem_prefault_anonymous(zb_memory *m, uint64_t addr, uint64_t len);
/* Map len bytes of host fd at offset (page aligned) copy-on-write at guest addr. */
int zb_mem_map_file(zb_memory *m, uint64_t addr, uint64_t len, int fd, uint64_t offset);
/* Make [addr, addr+len) read the base image's bytes again (no-op copy where already mapped). */
int zb_mem_revert_to_image(zb_memory *m, uint64_t addr, uint64_t len);
void zb_mem_dirty(zb_memory *m, uint64_t addr, uint64_t len);
void zb_region_add(zb_memory *m, uint64_t start, uint64_t end, int prot, const char *name);
void zb_region_remove(zb_memory *m, uint64_t start, uint64_t end);
void zb_region_set_prot(zb_memory *m, uint64_t start, uint64_t end, int prot);
const zb_region *zb_region_find(const zb_memory *m, uint64_t addr);
static inline int zb_bit(const uint64_t *b, uint64_t i) { return (b[i >> 6] >> (i & 63)) & 1; }
static inline void zb_bit_set(uint64_t *b, uint64_t i) { b[i >> 6] |= 1ull << (i & 63); }
static inline void zb_bit_clear(uint64_t *b, uint64_t i) { b[i >> 6] &= ~(1ull << (i & 63)); }
void zb_bits_set_range(uint64_t *b, uint64_t first, uint64_t n, int value);

/* ---- guest low memory: page tables, descriptors, CPL0 stubs (guest_layout.c) ---- */
void zb_layout_write(zb_memory *m);
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
    int context_restored;    /* set by rt_sigreturn: regs (rax included) are the restored context,
                                not a syscall's result, whatever value rax holds */
} zb_cpu;
/* A copy with its own XSAVE image (xsave_size bytes, the engine's); -1 out of memory. */
int zb_cpu_clone(zb_cpu *dst, const zb_cpu *src, size_t xsave_size);
void zb_cpu_free(zb_cpu *c);
/* On disk. A load refuses an XSAVE image of another size than xsave_size (another host's CPU). */
void zb_cpu_save(const zb_cpu *c, size_t xsave_size, struct zb_out *o);
int zb_cpu_load(zb_cpu *c, size_t xsave_size, struct zb_in *in, char *err);

/* ---- signal state (signals.c; changed by the syscalls of sys_signals.c and sys_itimer.c) ---- */
#define ZB_SIG_BIT(sig) (1ull << ((sig) - 1))
#define ZB_SIG_UNBLOCKABLE (ZB_SIG_BIT(SIGKILL) | ZB_SIG_BIT(SIGSTOP))
typedef struct zb_sigaction {
    uint64_t handler, flags, restorer, mask;
} zb_sigaction;

typedef struct zb_signals {
    zb_sigaction action[65];
    uint64_t blocked;
    uint64_t pending;        /* raised by the host (zb_sandbox_raise), delivered on resume */
    uint64_t altstack_sp, altstack_size;
    int altstack_flags;
    int fault_sig, fault_code; /* a pending CPU fault's signal and si_code (SEGV_MAPERR, ...) */
    uint64_t fault_addr;       /* and its si_addr, delivered with it */
    int64_t alarm_ns;          /* ITIMER_REAL expiry, host CLOCK_MONOTONIC ns; 0 = disarmed (sys_itimer.c) */
    int64_t alarm_interval_ns; /* its period, 0 = one-shot */
} zb_signals;
void zb_signals_clone(zb_signals *dst, const zb_signals *src);
/* On disk (without the alarm: a host monotonic time). */
void zb_signals_save(const zb_signals *s, struct zb_out *o);
int zb_signals_load(zb_signals *s, struct zb_in *in, char *err);

/* ---- the UART (uart16550.c) ---- */
typedef struct zb_uart {
    uint8_t ier, lcr, mcr, scr, dll, dlm, fcr;
    uint8_t *rx;             /* host -> guest bytes, rx[rx_pos..rx_len) unread */
    size_t rx_len, rx_pos, rx_cap;
    uint8_t *tx;             /* guest -> host bytes of the frame being assembled */
    size_t tx_len, tx_cap;
    size_t frame_ready;      /* bytes of a complete frame at tx[0..] handed out as an event */
    int overrun;             /* loopback bytes were lost to a full receive FIFO (LSR OE) */
} zb_uart;

void zb_uart_init(zb_uart *u);
void zb_uart_destroy(zb_uart *u);
int zb_uart_clone(zb_uart *dst, const zb_uart *src);
void zb_uart_save(const zb_uart *u, struct zb_out *o);
int zb_uart_load(zb_uart *u, struct zb_in *in, char *err);
int zb_uart_push_input(zb_uart *u, const void *data, size_t len);
size_t zb_uart_rx_available(const zb_uart *u);
size_t zb_uart_read(zb_uart *u, void *buf, size_t len);
/* Feed guest bytes into the frame assembler. Returns bytes consumed (stops after a complete
 * frame), or -1 with a message for a malformed frame. */
long zb_uart_write(zb_uart *u, const uint8_t *data, size_t len, char *err);
/* Port access from a CPL3 polled driver. Returns 0, or -1 with err for a malformed frame. */
void zb_uart_consume_frame(zb_uart *u);
int zb_uart_port_out(zb_uart *u, unsigned offset, uint8_t value, char *err);
uint8_t zb_uart_port_in(zb_uart *u, unsigned offset);
/* Frame parsing, also used by the fuzzer: 1 = complete frame of *total bytes, 0 = need more,
 * -1 = malformed (err). */
int zb_frame_check(const uint8_t *buf, size_t len, size_t *total, char *err);

/* ---- process-level state (its copy and on-disk form: sys_process.c) ---- */
typedef struct zb_process {
    char exe[PATH_MAX];      /* guest path of the program, answer to readlink /proc/self/exe */
    char cwd[PATH_MAX];
    uint64_t tid_address;
    unsigned umask;
    int exit_status;
    uint64_t cpu_ns;         /* CPU time the guest has used (its runs' wall time), as the guest reads it
                                (clock_gettime CPU clocks, getrusage, times, sysinfo): part of the state a
                                snapshot restores, so an isolated cell never learns how long another ran */
    uint64_t sys_ns;         /* the part of cpu_ns the engine spent serving the guest\'s syscalls (its
                                "system" time), restored the same way */
    int64_t clock_base[3];   /* CLOCK_MONOTONIC, BOOTTIME, MONOTONIC_RAW bases of the vDSO page last
                                published (host copies: the page itself is guest memory), */
    uint64_t clock_tsc0, clock_mult; /* with its TSC origin and scale (vdso_page.c) */
    int64_t clock_floor[3];  /* the latest of each the guest can have read, as of its last stop: the
                                next page never goes below */
} zb_process;
void zb_process_clone(zb_process *dst, const zb_process *src);
/* On disk: the program, its working directory, tid address and umask (not the clocks). */
void zb_process_save(const zb_process *p, struct zb_out *o);
int zb_process_load(zb_process *p, struct zb_in *in, char *err);

/* ---- the sandbox ---- */
struct zb_sandbox {
    zb_engine *engine;
    zb_memory mem;
    zb_cpu cpu;
    zb_fs *fs;
    zb_fdtable *fds;
    zb_signals sig;
    zb_uart uart;
    zb_process proc;
    uint64_t vdso_data;      /* guest address of the vDSO data page, 0 if none */
    zb_snapshot *base;       /* the snapshot this sandbox's memory is relative to (host_dirty and
                                KVM's dirty log say what changed since), or NULL */
    uint64_t snapshots_taken; /* by zb_sandbox_snapshot: every 8th also moves pages out of mostly dead stores */

    int finished;            /* exited, crashed or broke a rule: cannot run again */
    atomic_int kick_requested;
    atomic_int running;
    int64_t run_started_ns;  /* while zb_sandbox_run runs: when it started (guest CPU clocks) */
    pthread_t runner;        /* valid while running */
    int trace_fd;
    int profile;             /* syscall phases are stamped (zb_sandbox_set_profile) */
    zb_syscall_profile prof;
    int64_t prof_exit_ns;    /* profiling: when the last KVM_RUN returned, and how long it took */
    int64_t prof_run_ns;
    int test_break_vector;   /* zb_sandbox_test_break_in_trap: the stub's vector + 1, 0 = off */

    /* an event a syscall handler asks the run loop to return after the syscall */
    zb_event stop_ev;
    int has_stop;
    int stop_retry;          /* the syscall did not complete: serve it again on resume */
    uint8_t *out_buf;        /* OUTPUT event bytes */
    size_t out_cap;

    zb_stats stats;
    char log[ZB_LOG_MAX];
    size_t log_len;
    uint64_t logged_unknown[8]; /* bitmap of syscall numbers already logged as unimplemented */
    int logged_no_network;   /* socket() refusals so far (the first one is logged) */
};

/* Phase stamps of the syscall profile: nothing but a branch when profiling is off. */
#define ZB_PROF_BEGIN(sb, t) int64_t t = (sb)->profile ? zb_now_ns() : 0
#define ZB_PROF_END(sb, t, field) do { if ((sb)->profile) (sb)->prof.field += (uint64_t)(zb_now_ns() - (t)); } while (0)

/* ---- syscalls (syscalls.c dispatches to the sys_*.c families) ---- */
#define ZB_SYSCALL_MAX 512
typedef long (*zb_syscall_fn)(zb_sandbox *sb, const uint64_t a[6]);
long zb_syscall_dispatch(zb_sandbox *sb, uint64_t nr, const uint64_t a[6]);
const char *zb_syscall_name(uint64_t nr);

void zb_sys_memory_register(zb_syscall_fn *t);
void zb_sys_files_register(zb_syscall_fn *t);
void zb_sys_fsmeta_register(zb_syscall_fn *t);
void zb_sys_time_register(zb_syscall_fn *t);
void zb_sys_process_register(zb_syscall_fn *t);
void zb_sys_signals_register(zb_syscall_fn *t);
void zb_sys_poll_register(zb_syscall_fn *t);
void zb_sys_itimer_register(zb_syscall_fn *t);
void zb_sys_socket_register(zb_syscall_fn *t);
void zb_sys_epoll_register(zb_syscall_fn *t);
void zb_sys_eventfd_register(zb_syscall_fn *t); /* file_eventfd.c */

/* ---- what a syscall handler asks of the run loop (run_events.c) ----
 * A handler that cannot finish now calls zb_stop_event(sb, kind, 1) and returns ZB_SYSCALL_STOP;
 * the syscall is served again when the sandbox resumes. A handler that finished but needs the
 * caller (e.g. output to hand over) calls zb_stop_event(sb, kind, 0) and returns its result. */
#define ZB_SYSCALL_STOP (-100000)
/* A long engine operation (a listing of a huge directory) gave up because the run's deadline
 * passed or a kick came: the handler turns it into zb_stop_for_deadline (never seen by the guest). */
#define ZB_DEADLINE_PASSED (-100001)
zb_event *zb_stop_event(zb_sandbox *sb, int kind, int retry);
/* Append guest output to the pending OUTPUT event (one event per syscall). */
int zb_output(zb_sandbox *sb, int stream, const void *data, size_t len);
/* 1 if the running sandbox's deadline has passed or a kick is pending (checked by long operations). */
int zb_should_stop(const zb_sandbox *sb);
/* Stop the syscall for that deadline or kick; it is served again on resume. Returns ZB_SYSCALL_STOP. */
long zb_stop_for_deadline(zb_sandbox *sb);
/* sleeping inside a syscall: waits until wake_ns or a kick/deadline. 0 = slept fully,
 * ZB_SYSCALL_STOP = interrupted (sb->stop set), -EINTR = the guest's alarm went off and interrupts. */
long zb_sleep_until(zb_sandbox *sb, int64_t wake_ns);
/* The run's deadline (0: none), set by zb_sandbox_run for the running thread. */
extern __thread int64_t zb_run_deadline_ns;
/* This thread's signal mask with the kick signal unblocked, for sleeps (set by zb_sandbox_run). */
extern __thread sigset_t zb_run_wait_sigmask;
/* Set by the handler of ZB_KICK_SIGNAL on this thread (kvm_vm.c); the run loop clears it before KVM_RUN. */
extern __thread volatile sig_atomic_t zb_kick_signal_seen;
/* Set by that handler when the kick signal came from another process, not from the run's own
 * wake-up timer; taken (and cleared) by zb_take_kick. */
extern volatile sig_atomic_t zb_outside_kick;
/* 1 if the sandbox was kicked (zb_sandbox_kick or a kick signal from outside); clears both. */
int zb_take_kick(zb_sandbox *sb);
/* Arm the run's POSIX timer (the kick signal to this thread) at the earlier of the run deadline and
 * the guest's alarm, or disarm it. */
int zb_run_arm_wake_timer(zb_sandbox *sb, zb_vm *vm);
/* The guest changed its alarm: re-arm the running sandbox's wake-up timer. */
void zb_run_timer_update(zb_sandbox *sb);

/* ---- signal delivery (signals.c) ---- */
/* Queue SIGALRM if the guest's alarm expired by `now` (and re-arm a periodic one); 1 if it did. */
int zb_alarm_check(zb_sandbox *sb, int64_t now);
/* Deliver the lowest pending unblocked signal: 0 = done or nothing to do, 1 = the default action
 * kills the guest (*killed_by), -1 = the guest's stack cannot take a frame (*killed_by = SIGSEGV). */
int zb_signal_deliver(zb_sandbox *sb, int *killed_by);
int zb_signal_has_handler(const zb_sandbox *sb, int sig);
/* 1 if `sig` arriving now would interrupt a blocked syscall (unblocked, and handled or fatal). */
int zb_signal_interrupts(const zb_sandbox *sb, int sig);
/* rt_sigreturn: restore the interrupted context into sb->cpu.regs and set context_restored;
 * or -errno (regs untouched) for a frame that cannot be read. */
long zb_signals_sigreturn(zb_sandbox *sb);

/* ---- ELF loading (elf_loader.c) and the vDSO's placement and data page (vdso_page.c) ---- */
int zb_elf_exec(zb_sandbox *sb, const char *exe_guest_path, const char *const *argv,
                const char *const *envp, char *err);
uint64_t zb_vdso_load(zb_sandbox *sb, char *err);
void zb_vdso_refresh(zb_sandbox *sb, zb_vm *vm);
/* The run stopped: record the latest monotonic times the guest can have read (proc.clock_floor). */
void zb_vdso_note_stop(zb_sandbox *sb, zb_vm *vm);

/* The guest's CPU time in ns: proc.cpu_ns plus the run under way (run_events.c). */
uint64_t zb_guest_cpu_ns(const zb_sandbox *sb);
/* The same split as a kernel reports it: syscall service is system time, the rest user time. */
void zb_guest_cpu_split(const zb_sandbox *sb, uint64_t *user_ns, uint64_t *sys_ns);

/* ---- sandboxes (sandbox.c) ----
 * A sandbox's base snapshot (sb->base) is the snapshot layer's: snapshot.c takes and drops that
 * reference (zb_sandbox_free is there), and sandbox.c never calls into snapshots. */
zb_sandbox *zb_sandbox_alloc(zb_engine *e, char *err);
/* Free everything but the base snapshot reference (the caller has dropped it). */
void zb_sandbox_destroy(zb_sandbox *sb);
/* Free the namespace and the fd table (before they are replaced by a snapshot's copies). */
void zb_sandbox_free_state(zb_sandbox *sb);
/* A fork gets files-mode policies of its own (fs.h, zb_proj_policy): changing its mode then
 * leaves the snapshot it came from, and that snapshot's other forks, as they are. */
int zb_sandbox_own_policies(zb_sandbox *sb, char *err);

/* ---- run loop helpers (run_loop.c) ---- */
void zb_fault_event(zb_sandbox *sb, zb_event *ev, int signo, uint64_t rip, uint64_t addr,
                    const char *what);

#endif
