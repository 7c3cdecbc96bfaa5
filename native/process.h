/* process.h - the process layer: what every syscall family and the file layer use of the guest
 * process: its signal state and delivery (signals.c), its process-level state (its copy and
 * on-disk form are in sys_process.c), and the run services: what a syscall handler asks of the
 * run loop (run_events.c).
 */
#ifndef ZB_PROCESS_H
#define ZB_PROCESS_H
#include "memory.h"
#include "vm.h"

#include <pthread.h>
#include <poll.h>
#include <signal.h>

struct zb_out; /* serial.h: the snapshot state writer and reader */
struct zb_in;
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
    int64_t cpu_timer_ns[2];   /* ITIMER_VIRTUAL (ZB_CPU_TIMER_VIRTUAL) and ITIMER_PROF expiries, on the
                                  process's user and user + system CPU clocks (zb_guest_cpu_split); 0 = disarmed */
    int64_t cpu_timer_interval_ns[2]; /* their periods */
    uint64_t suspend_mask;     /* rt_sigsuspend: the mask to restore once the handler that ended it */
    int suspend_restore;       /* returns (the signal frame carries it); 1 while set */
} zb_signals;
void zb_signals_clone(zb_signals *dst, const zb_signals *src);
enum { ZB_CPU_TIMER_VIRTUAL = 0, ZB_CPU_TIMER_PROF = 1 };
/* On disk (without the alarm: a host monotonic time; nor the CPU timers, whose clocks are not saved). */
void zb_signals_save(const zb_signals *s, struct zb_out *o);
int zb_signals_load(zb_signals *s, struct zb_in *in, char *err);

/* ---- process-level state (its copy and on-disk form: sys_process.c) ---- */
#define ZB_RLIMITS 16 /* Linux's RLIM_NLIMITS */
typedef struct zb_process {
    char exe[PATH_MAX];      /* guest path of the program, answer to readlink /proc/self/exe */
    char comm[16];           /* the program's name (the last component of the path it was run by,
                                PR_SET_NAME): prctl(PR_GET_NAME), /proc/self/status and stat */
    char cwd[PATH_MAX];
    uint64_t tid_address;
    uint64_t arg_start, arg_end; /* guest range of its argv strings (the initial stack's, elf_loader.c),
                                read by /proc/PID/cmdline as Linux reads mm->arg_start..arg_end */
    int32_t pid;             /* its pid in its family (1: process 1, also without a family) */
    unsigned umask;
    int32_t nice;            /* getpriority/setpriority (sys_priority.c): -20..19, no effect on scheduling */
    int exit_status;
    uint64_t cpu_ns;         /* CPU time the guest has used (its runs' wall time), as the guest reads it
                                (clock_gettime CPU clocks, getrusage, times): part of the state a
                                snapshot restores, so an isolated cell never learns how long another ran */
    uint64_t sys_ns;         /* the part of cpu_ns the engine spent serving the guest\'s syscalls (its
                                "system" time), restored the same way */
    uint64_t children_utime_ns, children_stime_ns; /* getrusage(RUSAGE_CHILDREN): of the children it
                                waited for, with what they waited for in turn (sys_procs.c) */
    uint64_t children_maxrss_kib; /* the largest of those children's ru_maxrss */
    int64_t clock_base[3];   /* CLOCK_MONOTONIC, BOOTTIME, MONOTONIC_RAW bases of the vDSO page last
                                published (host copies: the page itself is guest memory), */
    uint64_t clock_tsc0, clock_mult; /* with its TSC origin and scale (vdso_page.c) */
    int64_t clock_floor[3];  /* the latest of each the guest can have read, as of its last stop: the
                                next page never goes below */
    /* setrlimit (sys_process.c): the soft and hard limits of the resources whose bit is in
     * rlim_set, as the process (or the one it was forked from) set them; the others are the
     * sandbox's defaults. Inherited by fork, kept by execve, as on Linux. */
    uint32_t rlim_set;
    uint64_t rlim_cur[ZB_RLIMITS], rlim_max[ZB_RLIMITS];
} zb_process;
void zb_process_clone(zb_process *dst, const zb_process *src);
/* On disk: the program, its name, working directory, tid address, umask, nice value and the limits
 * it set (not the clocks). */
void zb_process_save(const zb_process *p, struct zb_out *o);
int zb_process_load(zb_process *p, struct zb_in *in, char *err);

/* ---- guest threads (threads.c; their syscalls: sys_threads.c; switching them on the vCPU:
 * run_threads.c) ----
 * M:1: every guest thread is a saved register set multiplexed by the engine on the sandbox's one
 * vCPU. The running thread's state is the sandbox's own (sb->cpu, sb->sig.blocked, the alternate
 * stack); the table keeps every thread's identity and wait state, and for the others their saved
 * vCPU state and signal mask. Slot `current` is the running thread: its `cpu` is unused (sb->cpu
 * holds it). */
#define ZB_THREADS_MAX 1024       /* the highest per-sandbox limit (zb_sandbox_set_max_threads) */
#define ZB_THREADS_DEFAULT 256    /* the default limit (EAGAIN past it, as RLIMIT_NPROC) */
#define ZB_THREAD_SLICE_NS 10000000 /* a thread that runs without blocking is preempted after this */
enum {
    ZB_THREAD_RUNNABLE = 1,
    ZB_THREAD_FUTEX = 2,    /* waiting on futex_addr (bitset), until wake_ns (INT64_MAX: forever) */
    ZB_THREAD_RETRY = 3,    /* a blocking syscall (sleep, poll, ...) yielded: served again when picked */
};
typedef struct zb_thread {
    int32_t tid;            /* 0: a free slot */
    int state;
    zb_cpu cpu;             /* saved vCPU state; for the running thread (slot `current` while it is
                               RUNNABLE) sb->cpu is the live one and this copy is stale */
    uint64_t blocked;       /* signal mask (not for the running thread) */
    uint64_t pending;       /* signals sent to this thread (tgkill), moved to sb->sig.pending when it runs */
    uint64_t altstack_sp, altstack_size;
    int altstack_flags;
    uint64_t clear_child_tid; /* CLONE_CHILD_CLEARTID / set_tid_address: 0 written + futex wake at exit */
    uint64_t robust_list, robust_len;
    uint64_t futex_addr;
    uint32_t futex_bitset;
    uint64_t wait_seq;      /* order of futex waits: wakes take the oldest waiter first */
    int64_t wake_ns;        /* FUTEX/RETRY: host CLOCK_MONOTONIC wake time, INT64_MAX = none */
    uint64_t wait_gen;      /* RETRY: zb_wake_gen when it yielded */
} zb_thread;
/* Counts the syscalls that completed (threads.c; the run loop bumps it): a thread that yielded a
 * blocking syscall (RETRY) may be able to go on once it changed, since only a completed syscall of
 * another thread or process changes what it waits for (a pipe written, a child ended, ...). */
extern __thread uint64_t zb_wake_gen;
int zb_thread_retry_may_go_on(const zb_thread *t);
typedef struct zb_threads {
    zb_thread *t;           /* cap slots */
    int cap;
    int count;              /* live threads */
    int current;            /* slot of the running thread */
    int32_t next_tid;
    int max_threads;        /* the limit (a setting, not saved) */
    uint64_t wait_seq;
    int64_t slice_start_ns; /* when the running thread was switched in */
    int need_xsave_for;     /* a thread cloned by the syscall under way: copy the vCPU's XSAVE into it (-1 none) */
    int switch_request;     /* the syscall under way: 1 = sched_yield, 2 = the running thread exits */
    int preempt;            /* a waiter's timeout passed or a signal needs another thread: switch now */
    int64_t armed_horizon;  /* the zb_threads_timer_horizon the run's wake-up timer was last armed for */
    int armed_for_procs;    /* ... and whether it then included the end of the slice because another
                               process of the family could run (zb_run_arm_wake_timer) */
    uint64_t switches;      /* statistics */
} zb_threads;
/* One thread (tid 1), the running one. -1: out of memory. */
int zb_threads_init(zb_threads *ts, size_t xsave_size);
void zb_threads_free(zb_threads *ts);
int zb_threads_clone(zb_threads *dst, const zb_threads *src, size_t xsave_size);
void zb_threads_save(const zb_threads *ts, size_t xsave_size, struct zb_out *o);
int zb_threads_load(zb_threads *ts, size_t xsave_size, struct zb_in *in, char *err);
/* The slot of thread `tid`, or -1. */
int zb_threads_find(const zb_threads *ts, int32_t tid);
/* A free slot for a new thread (cap grown as needed), or -1 past the limit / out of memory. */
int zb_threads_new_slot(zb_threads *ts, size_t xsave_size);
/* Remove a thread that is not running (its slot becomes free). */
void zb_threads_remove(zb_threads *ts, int slot);
/* Wake up to n futex waiters on addr whose bitset intersects bitset (oldest first); the number woken. */
int zb_threads_futex_wake(zb_threads *ts, uint64_t addr, uint32_t bitset, int n);
/* How many threads wait on the futex at addr. */
int zb_threads_futex_waiters(const zb_threads *ts, uint64_t addr);
/* Move up to n waiters of addr to addr2 (FUTEX_REQUEUE); the number moved. */
int zb_threads_futex_requeue(zb_threads *ts, uint64_t addr, uint64_t addr2, int n);
/* Make a waiting (not running) thread runnable with this syscall result. */
void zb_threads_resume(zb_threads *ts, int slot, long result);
/* The earliest wake time of a waiting thread other than the running one (INT64_MAX: none). */
int64_t zb_threads_next_wake(const zb_threads *ts);
/* Another thread than the running one can run (RUNNABLE, or RETRY when with_retry). */
int zb_threads_others_runnable(const zb_threads *ts, int with_retry);
/* The guest's stop/timer horizon for the run's wake-up timer: the next wake of a waiting thread,
 * and the end of the running thread's time slice if another thread is runnable (INT64_MAX: none). */
int64_t zb_threads_timer_horizon(const zb_threads *ts);

/* ---- the process family (proc_family.c; syscalls: sys_procs.c; running and forking it:
 * family_run.c) ----
 * A guest fork() makes a new sandbox, a copy-on-write fork of the caller's live state. The
 * sandboxes of one lineage of forks form a family, created at the first fork and owned by its
 * first process (pid 1, the sandbox the host created: member 0). Pids (and the tids of threads
 * created once the family exists) come from one counter, as in a pid namespace. A member that
 * exited is a zombie (its sandbox freed, its wait status kept) until its parent waits for it.
 * The processes run in turn on the engine's executor VM (family_run.c), M:1 like threads. */
#define ZB_PROCS_MAX 1024        /* the highest per-family limit (zb_sandbox_set_max_processes) */
#define ZB_PROCS_DEFAULT 64      /* the default: fork past it fails with EAGAIN */
/* A process that runs without blocking gives the VM to another after this: longer than a
 * thread's slice, since a switch of processes re-attaches the VM to other memory and both sides
 * then re-fault what they touch (docs/PERFORMANCE.md, "Processes"). */
#define ZB_PROC_SLICE_NS 100000000
#define ZB_PROC_CMDLINE_MAX (2u << 20) /* the most of argv /proc/PID/cmdline shows (ARG_MAX's 2 MiB) */
#define ZB_TIMER_RETRY_NS 1000000 /* a spent wake-up timer whose reason is still to come looks again after this */
/* Internal stop events (never returned by zb_sandbox_run): the running process cannot go on now
 * and another process of its family can run. */
#define ZB_EVENT_PROC_YIELD 101
typedef struct zb_member {
    int32_t pid, ppid, pgid, sid;
    zb_sandbox *sb;          /* NULL once it is a zombie */
    int zombie;              /* exited, not reaped: wstatus says how */
    int wstatus;             /* the wait status as Linux encodes it (exit code << 8, or the signal) */
    int exit_signal;         /* sent to the parent when it ends (SIGCHLD for fork; 0: none) */
    int pdeathsig;           /* PR_SET_PDEATHSIG: sent to it when its parent ends (0: none) */
    int vfork_done;          /* its vfork parent may go on (it exited or exec'ed) */
    int waits_input;         /* it read the UART with nothing queued: only process 1 gets input */
    int orphan;              /* its parent ended: reaped at once when it ends (pid 1 never waits) */
    char comm[16];           /* once ended: its name, for the zombie's /proc/PID (fs_proc.c) */
    uint64_t utime_ns, stime_ns, maxrss_kib; /* once ended: its rusage as wait4 reports it (its own
                                and its waited-for children's CPU time; the larger maxrss) */
} zb_member;
struct zb_family {
    zb_member *m;            /* cap slots; m[0] is process 1 */
    int cap, count;          /* count: members, zombies included */
    int32_t next_pid;
    int max_procs;
    int current;             /* the member that ran last */
    int yielded;             /* it gave the VM up (ZB_EVENT_PROC_YIELD): the next pick starts after it */
    atomic_int kick;         /* zb_sandbox_kick of process 1: whichever process runs stops */
    atomic_int running;      /* the family's run loop is under way on thread `runner` */
    pthread_t runner;
    uint64_t forks;          /* statistics */
    uint64_t switches;
    /* where a process fork's host time goes (zb_stats proc_*): making the child (snapshot + fork +
     * fork(2)'s changes), attaching a process to the executor VM on a switch, the children's runs
     * (their first-touch shadow faults are in them), ending children */
    uint64_t fork_ns, attach_ns, attaches, child_run_ns, end_ns;
    zb_mem_budget mem;       /* the family's one memory budget (memory.h): process 1's limit, every
                                member charged with all it could own privately */
    struct zb_store **stores; /* the stores its fork snapshots made, held while pages of them live:
                                their live pages are mem.shared_pages (family_run.c) */
    int nstores, stores_cap;

    zb_sandbox *shared_latest; /* the member whose copies of shared mappings are the latest (it ran
                                  last, or took them in since); NULL: the file system has them */
};
typedef struct zb_family zb_family;
/* The child processes a checkpoint of process 1 leaves out (zb_sandbox_checkpoint: a snapshot holds
 * one process). Its restore ends the family's other processes, as every restore does, and these,
 * process 1's own children when it was taken, come back as its zombies: killed by SIGKILL, or with
 * their own status if they had ended already, so that its waits (Popen.wait, a Pool's workers,
 * loky's executor) see them end instead of waiting for processes that are gone. */
typedef struct zb_lost_child {
    int32_t pid, pgid, sid;
    int32_t wstatus;         /* the wait status its zombie reports */
    int32_t exit_signal;     /* sent to process 1 as its end would (SIGCHLD for fork; 0: none) */
    char comm[16];
} zb_lost_child;
typedef struct zb_lost_children {
    zb_lost_child *c;
    uint32_t n;
} zb_lost_children;
/* Record process 1's children in fam as lost (*lost empty before). -1: out of memory. */
int zb_lost_children_take(zb_lost_children *lost, const zb_family *fam);
void zb_lost_children_free(zb_lost_children *lost);
void zb_lost_children_save(const zb_lost_children *lost, struct zb_out *o);
int zb_lost_children_load(zb_lost_children *lost, struct zb_in *in, char *err);
/* After a restore of process 1 (sb, alone in its family): the lost children as its zombies, each
 * end sending its exit signal as zb_family_member_ended does (or reaped at once if sb ignores
 * SIGCHLD); later pids stay above theirs. -1: out of memory. */
int zb_family_restore_lost(zb_sandbox *sb, const zb_lost_children *lost);
/* The family of sb, created with sb as process 1 if it has none. NULL: out of memory. */
zb_family *zb_family_ensure(zb_sandbox *sb);
/* The uid and gid every guest process has (and its euid/egid: sys_process.c refuses others). */
#define ZB_GUEST_UID 1000
#define ZB_GUEST_GID ZB_GUEST_UID
/* What getpid returns to sb (sys_procs.c); also what the syscall entry answers in the guest. */
int32_t zb_proc_getpid(const zb_sandbox *sb);
/* The caller's parent pid (0 for the agent), process group and session, as getppid/getpgid/getsid
 * answer them (fs_proc.c writes them into /proc/self/stat and status). */
void zb_proc_ids(zb_sandbox *sb, int32_t *ppid, int32_t *pgid, int32_t *sid);
/* Room for one more member in fam->m (members may move). -1: out of memory or at ZB_PROCS_MAX. */
int zb_family_make_room(zb_family *fam);
/* A new pid or tid of the family. */
int32_t zb_family_new_id(zb_family *fam);
/* The member slot of pid, or -1. */
int zb_family_find(const zb_family *fam, int32_t pid);
/* 1 if a live member of group pgid is in session sid (setpgid, TIOCSPGRP). */
int zb_family_group_in_session(const zb_family *fam, int32_t pgid, int32_t sid);
/* The member slot of the sandbox (its proc.pid), or -1. */
int zb_family_self(const zb_family *fam, const zb_sandbox *sb);
/* Another process than sb of its family can run now: a runnable thread, or a signal that would
 * interrupt it, or (at now) a waiter's timeout passed. */
int zb_family_others_runnable(const zb_sandbox *sb, int64_t now);
/* The earliest wake time of a waiting thread of another process, or of another process's alarm
 * (INT64_MAX: none). */
int64_t zb_family_next_wake(const zb_sandbox *sb);
/* Queue SIGALRM on every live member but `except` whose alarm expired by now (zb_alarm_check):
 * a process's alarm goes off while another process holds the VM or sleeps on it. 1 if any did. */
int zb_family_alarms_check(zb_family *fam, const zb_sandbox *except, int64_t now);
/* Member slot i can be scheduled (not a zombie, not waiting for input or a vfork child, and a
 * thread that can run or be served again, or a signal for it). */
int zb_family_schedulable(const zb_family *fam, int i, int64_t now);
/* Queue a process-directed signal on member i (sig 1-64). */
void zb_family_signal(zb_family *fam, int i, int sig);
/* A member ended with wait status wstatus: its sandbox is gone (the caller frees it), its children
 * are orphans, its parent gets its exit signal; it becomes a zombie, or is removed at once when
 * nobody will wait for it (orphans, a parent ignoring SIGCHLD or with SA_NOCLDWAIT). */
void zb_family_member_ended(zb_family *fam, int i, int wstatus);
/* Member i, still with its sandbox, is ending (file_pty.c): if it leads a session with a controlling
 * pty, SIGHUP goes to that pty's foreground group and the pty has no session any more (Linux's
 * disassociate_ctty on exit), so a command whose shell was terminated does not outlive it. */
void zb_pty_session_leader_ends(zb_family *fam, int i);
/* sb exec'ed a new program (past the point of no return): a vfork parent waiting for it goes on. */
void zb_family_member_execed(zb_sandbox *sb);
/* Recount the live pages of the family's fork stores into its budget (mem.shared_pages), letting
 * go of the stores none of whose pages live any more (family_run.c). */
void zb_family_count_stores(zb_family *fam);
/* Remove (reap) member slot i, a zombie. */
void zb_family_remove(zb_family *fam, int i);
/* A kick is pending for sb (its own, or its family's); zb_take_kick takes both. */
int zb_kick_pending(const zb_sandbox *sb);
/* The child process of a fork (family_run.c, the snapshot layer above: declared here for the
 * syscall that calls it): a copy-on-write fork of parent's live state, made while the parent is
 * inside its syscall, with one thread (tid = pid), no pending signals or alarm, and an fd table
 * whose pipes, sockets, consoles, devices, host files and eventfds are the parent's own open file
 * descriptions (shared, as after Linux's fork). NULL with err. */
zb_sandbox *zb_family_fork_sandbox(zb_sandbox *parent, int32_t pid, char *err);
/* A non-private FUTEX_WAKE of addr in sb (family_run.c, for sys_threads.c): wake up to n waiters
 * of the same (inode, offset) of a shared mapping (shared_map.h) in the other processes of sb's
 * family, through their own mappings of it, as Linux keys shared futexes. The number woken. */
int zb_family_futex_wake_shared(zb_sandbox *sb, uint64_t addr, uint32_t bitset, int n);

/* ---- what a syscall handler asks of the run loop (run_events.c) ----
 * A handler that cannot finish now calls zb_stop_event(sb, kind, 1) and returns ZB_SYSCALL_STOP;
 * the syscall is served again when the sandbox resumes. A handler that finished but needs the
 * caller (e.g. output to hand over) calls zb_stop_event(sb, kind, 0) and returns its result. */
#define ZB_SYSCALL_STOP (-100000)
/* A long engine operation (a listing of a huge directory) gave up because the run's deadline
 * passed or a kick came: the handler turns it into zb_stop_for_deadline (never seen by the guest). */
#define ZB_DEADLINE_PASSED (-100001)
/* A blocking syscall of the running thread cannot complete now and other threads can run: the
 * thread waits (sb->threads: its state says for what) and the run loop switches to another. */
#define ZB_SYSCALL_BLOCK (-100002)
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
/* For other waits until wake_ns (file_ready.c's on host sockets): 1 if the running thread yields
 * to another thread or process instead (its syscall is served again later: return
 * ZB_SYSCALL_BLOCK), and the earliest of until and the other threads' and processes' wake times
 * (a wait must end by then to let them run). */
int zb_sleep_yields(zb_sandbox *sb, int64_t wake_ns, int64_t now);
int64_t zb_sleep_bound(const zb_sandbox *sb, int64_t until);
/* A wait for UART input until wake_ns (INT64_MAX: a blocking read, or a poll without timeout)
 * found none: stop the run for an INPUT event (`timed` if wake_ns is a time), or, between requests
 * (zb_sandbox_set_input_yields), wait like a sleep until wake_ns while that ends by itself or
 * another thread can run or wake by itself, so that the guest's own work goes on (run_events.c).
 * A syscall result: 0 once wake_ns passed. */
long zb_wait_input(zb_sandbox *sb, int64_t wake_ns);
/* The run's deadline (0: none), set by zb_sandbox_run for the running thread. */
extern __thread int64_t zb_run_deadline_ns;
/* This thread's signal mask with the kick signal unblocked, for sleeps (set by zb_sandbox_run). */
extern __thread sigset_t zb_run_wait_sigmask;
/* 1 if the sandbox was kicked (zb_sandbox_kick or a kick signal from outside); clears both. */
int zb_take_kick(zb_sandbox *sb);
/* Arm the run's POSIX timer (the kick signal to this thread) at the earlier of the run deadline and
 * the guest's alarm, or disarm it. */
int zb_run_arm_wake_timer(zb_sandbox *sb, zb_vm *vm);
void zb_run_timer_rearm_if_spent(zb_sandbox *sb, zb_vm *vm);
/* Take a kick signal queued while blocked (zb_kick_signal_seen, zb_outside_kick as its handler). */
void zb_take_blocked_kick(void);
/* The guest changed its alarm: re-arm the running sandbox's wake-up timer. */
void zb_run_timer_update(zb_sandbox *sb);

/* ---- signal delivery (signals.c) ---- */
/* Queue SIGALRM if the guest's alarm expired by `now` (and re-arm a periodic one); 1 if it did. */
int zb_alarm_check(zb_sandbox *sb, int64_t now);
/* The CPU timers (setitimer ITIMER_VIRTUAL, ITIMER_PROF): the clock timer i counts (ns), whether any
 * is armed, and queue SIGVTALRM / SIGPROF for each that expired (re-arming a periodic one): 1 if any
 * did. They advance only while the process runs (waits are not CPU time): the run loop checks them
 * before every KVM_RUN, and the wake timer stops the run when the earliest could expire. */
int64_t zb_cpu_timer_clock(const zb_sandbox *sb, int i);
int zb_cpu_timers_armed(const zb_sandbox *sb);
int zb_cpu_timers_check(zb_sandbox *sb);
/* The host CLOCK_MONOTONIC time by which the earliest armed CPU timer expires if the process runs
 * from `now` on without a stop, or INT64_MAX. */
int64_t zb_cpu_timers_wake(const zb_sandbox *sb, int64_t now);
/* Deliver the lowest pending unblocked signal: 0 = done or nothing to do, 1 = the default action
 * kills the guest (*killed_by), -1 = the guest's stack cannot take a frame (*killed_by = SIGSEGV). */
int zb_signal_deliver(zb_sandbox *sb, int *killed_by);
int zb_signal_has_handler(const zb_sandbox *sb, int sig);
/* 1 if `sig` arriving now would interrupt a blocked syscall (unblocked, and handled or fatal). */
int zb_signal_interrupts(const zb_sandbox *sb, int sig);
/* The same for a thread whose signal mask is `blocked` (a thread that is not running). */
int zb_signal_interrupts_mask(const zb_sandbox *sb, int sig, uint64_t blocked);
/* rt_sigreturn: restore the interrupted context into sb->cpu.regs and set context_restored;
 * or -errno (regs untouched) for a frame that cannot be read. */
long zb_signals_sigreturn(zb_sandbox *sb);

/* The guest's CPU time in ns: proc.cpu_ns plus the run under way (run_events.c), less the time
 * the engine spent waiting in it for the guest (zb_wait_ppoll). */
uint64_t zb_guest_cpu_ns(const zb_sandbox *sb);
/* ppoll for a guest that waits (a sleep, a poll, every thread waiting), counted in zb_waited_ns:
 * a process that waits uses no CPU on Linux, so that time is not the guest's CPU time (time.sleep
 * in a cell used to show as system time in %time, getrusage and time.process_time). */
int zb_wait_ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *ts, const sigset_t *mask);
/* Nanoseconds this thread has spent in zb_wait_ppoll, ever. */
extern __thread uint64_t zb_waited_ns;
/* The guest's uptime: CLOCK_BOOTTIME, which the guest reads from the host's (sys_time.c). */
uint64_t zb_guest_uptime_ns(void);
/* The same split as a kernel reports it: syscall service is system time, the rest user time. */
void zb_guest_cpu_split(const zb_sandbox *sb, uint64_t *user_ns, uint64_t *sys_ns);

#endif
