/* sandbox_state.h - struct zb_sandbox: one sandbox's state, a field per layer (memory, vCPU,
 * signals, UART, process, and the file layer's namespace and fd table, opaque here: fs.h).
 *
 * Ownership, in Firecracker's spirit: each stateful part (memory, cpu, files, fds, signals, uart,
 * process) owns its own state struct and its clone (a snapshot's copy), save and load (its section
 * of the state file, serial.h); snapshot.c and snapshot_file.c only call them.
 *
 * It sits above the process and dev layers (it embeds every lower layer's state), yet the files
 * of those layers that take a zb_sandbox * and reach into it include it too: those upward
 * includes are listed, with the reason, in docs/ARCHITECTURE.md section 7 and
 * tests/test_native_layers.py.
 */
#ifndef ZB_SANDBOX_STATE_H
#define ZB_SANDBOX_STATE_H
#include "dev.h"
#include "process.h"

#include <pthread.h>

#define ZB_LOG_MAX 8192
#define ZB_SITE_SEEN 64

typedef struct zb_fs zb_fs;
typedef struct zb_fdtable zb_fdtable;

/* ---- the sandbox ---- */
struct zb_sandbox {
    zb_engine *engine;
    zb_memory mem;
    zb_cpu cpu;
    zb_fs *fs;
    zb_fdtable *fds;
    zb_signals sig;
    zb_threads threads;      /* the guest's threads (threads.c); the running one's state is cpu/sig */
    zb_uart uart;
    zb_process proc;
    zb_family *fam;          /* its process family (process.h), NULL until the first fork; owned by
                                process 1, shared by every member */
    int max_procs;           /* the process limit (zb_sandbox_set_max_processes; 0: default): a setting */
    uint64_t vdso_data;      /* guest address of the vDSO data page, 0 if none */
    zb_snapshot *base;       /* the snapshot this sandbox's memory is relative to (host_dirty and
                                KVM's dirty log say what changed since), or NULL */
    uint64_t snapshots_taken; /* by zb_sandbox_snapshot: every 8th also moves pages out of mostly dead stores */

    int finished;            /* exited, crashed or broke a rule: cannot run again */
    int memory_unknown;      /* a restore of it failed halfway: its memory is not what its base and
                                dirty bits say, so it is never parked for another fork (snapshot.c) */
    int fs_borrowed;         /* a child process: fs is its family's (process 1's), not freed with it */
    int vcpu_stale;          /* the host changed `cpu` while the process did not run and its executor VM
                                stayed attached to it (a parked thread loaded, run_threads.c): the vCPU
                                is reloaded from `cpu` before its next run. Never set otherwise: while
                                attached, the vCPU is the process's state (after a stop in user code or
                                mid-trap `cpu` holds only its last syscall's registers) */
    atomic_int kick_requested;
    atomic_int running;
    int64_t run_started_ns;  /* while zb_sandbox_run runs: when it started (guest CPU clocks) */
    uint64_t run_waited_ns;  /* and zb_waited_ns then (its waits are not the guest's CPU time) */
    pthread_t runner;        /* valid while running */
    int trace_fd;
    int profile;             /* syscall phases are stamped (zb_sandbox_set_profile) */
    int input_yields;        /* a UART read with no input lets other threads run (zb_sandbox_set_input_yields) */
    zb_syscall_profile prof;
    zb_syscall_nr_profile *prof_nr; /* ZB_PROFILE_NRS rows, allocated when profiling is first switched on */
    int64_t prof_exit_ns;    /* profiling: when the last KVM_RUN returned, and how long it took */
    int64_t prof_run_ns;
    int test_break_vector;   /* zb_sandbox_test_break_in_trap: the stub's vector + 1, 0 = off */
    /* the timed answers' hint (guest_abi.h ZB_ENTRY_TIMED): the fd this syscall opened (its
     * newfstatat can be answered in the guest until the next exit), valid while stat_seq is the
     * syscall being served (zb_syscall_seq) */
    uint64_t entry_stat_seq;
    int entry_stat_fd;
    const struct zb_file *entry_stat_file;
    /* the entry's read answer (guest_abi.h ZB_ENTRY_READ_BUF): the file whose bytes the buffer
     * holds for the run about to start (NULL: none; taken back right after that KVM_RUN), its fd
     * and size; read_seq the syscall whose open filled the buffer (filled once per open) */
    struct zb_file *entry_read_file;
    int entry_read_fd;
    uint32_t entry_read_size;
    uint64_t entry_read_seq;
    /* syscall sites seen exiting once (syscall_sites.c; direct-mapped, a hint: forgetting one
     * only delays its rewrite) */
    uint64_t site_seen[ZB_SITE_SEEN];

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
    int logged_mknod;          /* mknod of a socket file was logged (sys_fsmeta.c) */
    int logged_no_network;   /* socket() refusals so far (the first one is logged) */
    int read_took_files;     /* a read of the syscall under way reached files passed over a socket
                                (SCM_RIGHTS): readv reads no further buffer (vector_io resets it) */
};

/* Phase stamps of the syscall profile: nothing but a branch when profiling is off. */
#define ZB_PROF_BEGIN(sb, t) int64_t t = (sb)->profile ? zb_now_ns() : 0
#define ZB_PROF_END(sb, t, field) do { if ((sb)->profile) (sb)->prof.field += (uint64_t)(zb_now_ns() - (t)); } while (0)

#endif
