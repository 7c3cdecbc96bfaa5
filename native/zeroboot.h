/* zeroboot.h - the fork engine's public API, and the only header that cffi binds.
 *
 * The engine runs an unmodified Linux x86-64 program (CPython) at CPL3 inside a KVM VM with no
 * guest kernel: the program's syscalls trap to the host and are served here. See
 * docs/ARCHITECTURE.md for the guest ABI, the UART framing and the fork paths.
 *
 * Objects:
 *   zb_engine   one per process: the /dev/kvm handle, CPUID, one executor VM that sandboxes run on.
 *   zb_sandbox  a guest: its memory mapping, vCPU state and engine-side state (fds, files, maps).
 *               A sandbox is data; it runs on the engine's executor VM when zb_sandbox_run is called.
 *   zb_snapshot an immutable capture of a sandbox; sandboxes are forked from it copy-on-write.
 *
 * Threading: an engine and its sandboxes are used by one thread at a time, except
 * zb_sandbox_kick(), which any thread may call. The engine reserves SIGUSR2 (ZB_KICK_SIGNAL) as its
 * kick signal: zb_engine_open installs a handler so that a pending kick makes KVM_RUN (or a guest's
 * sleep) return. A SIGUSR2 sent to the engine's process from outside (kill) is a kick of the
 * running sandbox too: zb_sandbox_run then returns ZB_EVENT_KICK, also while the guest sleeps in a
 * syscall. It also handles ZB_WATCH_SIGNAL, a real-time signal that a watched file descriptor sends
 * (zb_engine_watch_fd), which kicks the same way: being queued, it is never merged into a pending
 * wake-up timer signal as a second SIGUSR2 would be. That handler and its flag are the only
 * process-wide state the engine owns.
 *
 * Errors: functions that can fail take `char *err` (ZB_ERRLEN bytes) and fill it with an
 * actionable message; they return NULL or -1. Nothing the guest does can make them crash.
 */
#ifndef ZEROBOOT_H
#define ZEROBOOT_H
#include <stddef.h>
#include <stdint.h>

/* CFFI-BEGIN */
typedef struct zb_engine zb_engine;
typedef struct zb_sandbox zb_sandbox;
typedef struct zb_snapshot zb_snapshot;

#define ZB_ERRLEN 512
#define ZB_KICK_SIGNAL 12 /* SIGUSR2 */
#define ZB_WATCH_SIGNAL 42 /* SIGRTMIN+8 of glibc (which keeps 32-33): sent by a watched fd */

/* Why zb_sandbox_run returned. */
#define ZB_EVENT_EXIT 1    /* guest called exit_group: `status`. The sandbox is finished. */
#define ZB_EVENT_FAULT 2   /* guest crashed (segfault, illegal instruction, abort...): `signal`,
                              `rip`, `addr`, `message`. The sandbox is finished. */
#define ZB_EVENT_OUTPUT 3  /* guest wrote to its stdout (stream 1) or stderr (stream 2): `data`. */
#define ZB_EVENT_FRAME 4   /* guest sent a complete UART frame: `frame_type`, `data` (payload). */
#define ZB_EVENT_INPUT 5   /* guest waits for UART input and none is queued (zb_sandbox_push_input);
                              `timed` if its wait (poll, select, epoll_wait) has a timeout. */
#define ZB_EVENT_TIMEOUT 6 /* the deadline passed; the guest is paused and can be resumed. */
#define ZB_EVENT_KICK 7    /* zb_sandbox_kick() was called; the guest is paused and can be resumed. */
#define ZB_EVENT_ERROR 8   /* the guest broke a sandbox rule (I/O port, malformed frame, ...) or the
                              engine failed: `message`. The sandbox is finished. */

typedef struct zb_event {
    int kind;                  /* ZB_EVENT_* */
    int status;                /* EXIT: exit status 0-255 */
    int signal;                /* FAULT: the Linux signal the guest would have died of */
    int stream;                /* OUTPUT: 1 stdout, 2 stderr */
    int timed;                 /* INPUT: the wait ends by itself at a timeout: the guest has work of its
                                  own then (an event loop's timers), which input_yields lets it do */
    uint32_t frame_type;       /* FRAME: ZB_FRAME_* type */
    const uint8_t *data;       /* OUTPUT/FRAME bytes; valid until the next call on this sandbox */
    size_t len;
    uint64_t rip;              /* FAULT: guest instruction pointer */
    uint64_t addr;             /* FAULT: faulting address (page faults), else 0 */
    char message[512];         /* FAULT/ERROR: report for humans */
} zb_event;

/* UART frames (guest <-> host), little endian: u32 magic, u16 version, u16 type, u32 length,
 * then `length` payload bytes. No in-band markers: only the length delimits a frame. */
#define ZB_FRAME_MAGIC 0x5a42464d /* "MFBZ" */
#define ZB_FRAME_VERSION 1
#define ZB_FRAME_HEADER 12
#define ZB_FRAME_MAX_PAYLOAD 16777216 /* 16 MiB */

typedef struct zb_stats {
    uint64_t exits;            /* KVM_RUN returns */
    uint64_t syscalls;         /* guest syscalls served */
    uint64_t unknown_syscalls; /* of which answered ENOSYS as unimplemented */
    uint64_t io_exits;         /* UART port accesses */
    uint64_t syscall_sites;    /* `syscall` instructions rewritten into the port's `out` (guest_abi.h), ever */
    uint64_t syscall_stubs;    /* answered numbers' sites given a jump to a stub of the entry (guest_abi.h), ever */
    uint64_t run_ns;           /* wall time inside zb_sandbox_run */
    uint64_t syscall_ns;       /* host time spent serving syscalls */
    uint64_t dirty_pages;      /* pages known to be written since the last snapshot/restore: the
                                  engine's own writes, and the guest's as of the last time KVM's
                                  dirty log was read (reading it re-protects pages, so stats do not) */
    uint64_t unchanged_finds;  /* pages that snapshots and restores found logged as written but
                                  holding what they should (left writable, or written back), ever */
    uint64_t pages_reprotected; /* of which write-protected again (page_reprotect.c), ever */
    uint64_t guest_pages;      /* pages the guest has allocated (mmap/brk/stack/ELF) */
    uint64_t guest_pages_limit;
    uint64_t threads;          /* guest threads alive */
    uint64_t thread_switches;  /* guest thread switches on the vCPU, ever */
    uint64_t family_pages;     /* pages charged to the memory budget of the sandbox's processes (all
                                  of them, process 1 included: every page each could own privately;
                                  without children, process 1's own); the limit is guest_pages_limit */
    uint64_t family_pages_peak; /* the most family_pages was since the first fork (0: never forked) */
    uint64_t family_refusals;  /* forks and allocations of its processes refused (ENOMEM) because the
                                  family's use left no room for them, ever */
    /* Where the host time of the sandbox's processes goes (cumulative, its family's; 0 before the
     * first fork), for the fork breakdown of `bench processes`: */
    uint64_t proc_forks;       /* processes forked */
    uint64_t proc_switches;    /* switches of the executor between processes */
    uint64_t proc_fork_ns;     /* making children: snapshot of the parent, fork of it, fork(2)'s changes */
    uint64_t proc_attaches;    /* attaches of a process to the executor VM (memslots + registers) */
    uint64_t proc_attach_ns;
    uint64_t proc_child_run_ns; /* children's runs on the executor (their first-touch faults included) */
    uint64_t proc_end_ns;      /* ending children: zombie, log, freeing their sandboxes */
} zb_stats;

/* Where the host-side time of guest syscalls goes, per phase (cumulative nanoseconds), collected
 * only while profiling is on (zb_sandbox_set_profile; off, it costs one branch per stamp). */
typedef struct zb_syscall_profile {
    uint64_t syscalls;      /* syscalls that trapped while profiling (resumed ones not counted) */
    uint64_t kvm_run_ns;    /* the KVM_RUN that ended in the syscall's exit: guest entry, the guest's
                               own code since the previous exit, the #PF at LSTAR, the CPL0 stub's
                               `out` and the exit back to the host */
    uint64_t decode_ns;     /* KVM_RUN's return to the handler: KVM_GET_REGS, the exception frame */
    uint64_t dispatch_ns;   /* the syscall's handler, all in (path_ns and host_ns are part of it) */
    uint64_t path_ns;       /* of which: path arguments copied from the guest and resolved (the
                               namespace walk, with the host lstats it makes) */
    uint64_t path_walks;
    uint64_t host_ns;       /* of which: host metadata calls of stat on host files */
    uint64_t return_ns;     /* signals + return to user mode (KVM_SET_SREGS, KVM_SET_REGS) */
    uint64_t host_calls;    /* host system calls the file layer made for these syscalls */
} zb_syscall_profile;

/* One syscall number's share of the profile (zb_sandbox_profile_syscalls). Numbers of
 * ZB_PROFILE_NRS - 1 and above (not x86-64 syscalls) share the last row. */
#define ZB_PROFILE_NRS 512
typedef struct zb_syscall_nr_profile {
    uint64_t nr;
    uint64_t calls;         /* trapped while profiling (a blocked syscall served again counts once) */
    uint64_t exit_ns;       /* the KVM_RUN that ended in its exit + the exit decode */
    uint64_t dispatch_ns;   /* its handler, all in */
    uint64_t host_calls;    /* host system calls the file layer made for it */
    uint64_t return_ns;     /* signals + return to user mode */
} zb_syscall_nr_profile;

/* ---- engine ---- */
zb_engine *zb_engine_open(char *err);
void zb_engine_close(zb_engine *engine);
/* Parked memory (snapshot.c): a freed sandbox's memory that an executor VM still maps is kept
 * (one per executor) and the next fork of a snapshot with the same memory image takes it, made
 * equal to the snapshot in place, so that the fork keeps KVM's shadow page tables of it. On by
 * default; off gives back what is parked. release gives it back now (an idle engine), stats
 * counts the forks that took one and the parked memories given back unused. */
void zb_engine_set_parking(zb_engine *engine, int on);
void zb_engine_release_parked(zb_engine *engine);
void zb_engine_parking_stats(zb_engine *engine, uint64_t *taken, uint64_t *dropped);
/* A hash of what a snapshot depends on in this host's KVM: CPUID, XSAVE layout, XCR0.
 * A template made under another fingerprint must be rebuilt. */
uint64_t zb_engine_fingerprint(zb_engine *engine);
/* How syscalls reach the host and return to user mode; both on by default, off for measurements:
 *   ZB_SYSCALLS_SYNC_REGS: registers through kvm_run (KVM_CAP_SYNC_REGS, where KVM has it), not
 *     the KVM_GET_REGS, KVM_SET_SREGS and KVM_SET_REGS ioctls;
 *   ZB_SYSCALLS_DIRECT_ENTRY: LSTAR at the syscall entry page (guest_abi.h), not at an unmapped
 *     address whose page fault enters the CPL0 stub of vector 14 (the path of earlier engines);
 *   ZB_SYSCALLS_GUEST_ANSWERS: the entry answers getpid, getuid/geteuid and getgid/getegid in the
 *     guest without an exit (guest_abi.h zb_entry_data; only where the entry runs at CPL3, i.e. on
 *     PVM, and with DIRECT_ENTRY);
 *   ZB_SYSCALLS_SITE_REWRITE: a `syscall` instruction that exited is rewritten into the `out` that
 *     exits without it (guest_abi.h, syscall_sites.c), so that its next runs skip the trip to
 *     LSTAR. Off, no site is rewritten any more; sites rewritten before stay so (they work on
 *     every path).
 * Returns the flags in effect. Call between runs. */
#define ZB_SYSCALLS_SYNC_REGS 1
#define ZB_SYSCALLS_DIRECT_ENTRY 2
#define ZB_SYSCALLS_GUEST_ANSWERS 4
#define ZB_SYSCALLS_SITE_REWRITE 8
int zb_engine_set_syscall_path(zb_engine *engine, int flags);

/* Lock the engine process down with seccomp (native/seccomp.c): SETUP allows what starting,
 * building templates and running guests needs; RUN, stacked on it, also forbids changing host
 * files, opening them for writing and creating processes. Irreversible. */
#define ZB_LOCKDOWN_SETUP 1
#define ZB_LOCKDOWN_RUN 2
int zb_engine_lockdown(zb_engine *engine, int phase, char *err);

/* ---- network egress (net_policy.c, file_inet.c; docs/SECURITY.md "Network") ----
 * A policy is built by the host (never from guest data): rules that allow host names, domain
 * suffixes ("*.example.org" as ZB_NET_SUFFIX "example.org") or CIDRs, each on one port (1-65535) or
 * any port (0), and an optional static host map. Installed on the engine (which owns it and
 * frees it), it applies to every sandbox of that engine; with none installed (the default) every
 * socket() but socketpair's fails with EACCES. Install it before zb_engine_lockdown: the seccomp
 * filters allow the socket syscalls the policy needs only if a policy is installed then. */
typedef struct zb_net zb_net;
#define ZB_NET_NAME 1
#define ZB_NET_SUFFIX 2
#define ZB_NET_CIDR4 3
#define ZB_NET_CIDR6 4
typedef struct zb_net_stats {
    uint64_t connects;       /* connections the policy allowed */
    uint64_t refused;        /* connections (and datagrams) it refused */
    uint64_t dns_queries;    /* DNS queries the sandbox's resolver read */
    uint64_t dns_answers;    /* ... that it answered with addresses (or none) for an allowed name */
    uint64_t dns_refused;    /* ... for names the policy does not allow (NXDOMAIN) */
    uint64_t dns_host_lookups; /* host resolver calls made for them */
    uint64_t bytes_sent, bytes_received; /* over connected sockets */
    uint64_t over_connection_limit; /* connects refused by max_connections */
    uint64_t throttled_ns;   /* time transfers waited for the rate limit */
    uint64_t dns_host_timeouts; /* host DNS lookups unanswered in time (the guest got SERVFAIL) */
} zb_net_stats;
zb_net *zb_net_new(void);
void zb_net_free(zb_net *net);
/* addr: 4 (ZB_NET_CIDR4) or 16 bytes, network byte order; name: for ZB_NET_NAME / SUFFIX. */
int zb_net_allow(zb_net *net, int kind, const char *name, const uint8_t *addr, int prefix, int port, char *err);
/* A static answer of the sandbox's resolver (family AF_INET or AF_INET6): a name it maps is never
 * looked up on the host. */
int zb_net_add_host(zb_net *net, const char *name, int family, const uint8_t *addr, char *err);
/* Limits of a policy: host connections open at once (0: none) and bytes per second, both ways
 * together (0: none); a transfer over the rate waits (also on a non-blocking socket, briefly). */
int zb_net_set_limits(zb_net *net, int max_connections, uint64_t bytes_per_second, char *err);
/* The host DNS server the engine asks for allowed names that neither the host map nor the host's
 * /etc/hosts lists (family AF_INET or AF_INET6, port 1-65535); default: the first nameserver of
 * the host's /etc/resolv.conf. A lookup never blocks the engine: the guest's socket waits for the
 * answer (ZEROBOOT_NETWORK_RESOLVER). */
int zb_net_set_resolver(zb_net *net, int family, const uint8_t *addr, int port, char *err);
/* Install a policy (NULL: none); the engine takes ownership of it and frees the previous one. */
void zb_engine_set_network(zb_engine *engine, zb_net *net);
/* The installed policy's counters (zeros without one). */
void zb_engine_network_stats(zb_engine *engine, zb_net_stats *out);

/* A KVM statistic of the executor's vCPU (e.g. "pf_fixed", "exits"), for benchmarks.
 * Returns -1 when KVM does not offer it. */
int zb_engine_vcpu_stat(zb_engine *engine, const char *name, uint64_t *value);

/* ---- building a sandbox from scratch ---- */
zb_sandbox *zb_sandbox_new(zb_engine *engine, uint64_t mem_bytes, char *err);
/* Make a host file or directory tree visible read-only, at the same path in the guest. */
int zb_sandbox_view_add(zb_sandbox *sb, const char *host_path, char *err);
/* Create a writable, private, in-memory directory (and its parents) in the guest. */
int zb_sandbox_overlay_dir(zb_sandbox *sb, const char *guest_path, char *err);
/* Create a read-only file with the given content in the guest (e.g. /etc/passwd). */
int zb_sandbox_put_file(zb_sandbox *sb, const char *guest_path, const void *data, size_t len,
                        char *err);
/* Cap on the bytes all overlay files together may hold (ENOSPC beyond). 0 = default. */
void zb_sandbox_set_overlay_limit(zb_sandbox *sb, uint64_t bytes);
/* Cap on guest-allocated memory (mmap/brk fail with ENOMEM beyond). 0 = the whole guest memory. */
void zb_sandbox_set_memory_limit(zb_sandbox *sb, uint64_t bytes);
/* A host directory (the notebook's folder) visible at its own path: READONLY (writes fail with
 * EROFS), OVERLAY (writes go to a private in-memory layer on top; the host is never changed) or
 * READWRITE (writes go to the host, confined to that tree). Works on forks too. */
#define ZB_PROJECT_READONLY 1
#define ZB_PROJECT_OVERLAY 2
#define ZB_PROJECT_READWRITE 3
int zb_sandbox_mount_project(zb_sandbox *sb, const char *host_dir, int mode, char *err);
int zb_sandbox_set_project_mode(zb_sandbox *sb, const char *host_dir, int mode, char *err);
/* Hide paths of a mounted project from the guest (credentials in a home folder): `paths` holds
 * paths relative to host_dir separated by '\n' ("" hides nothing). A hidden path and everything
 * below it is absent in every mode (ENOENT; no host call reaches it in readwrite mode). */
int zb_sandbox_project_hide(zb_sandbox *sb, const char *host_dir, const char *paths, char *err);
/* Listings for the host side (%sandbox diff and export) are binary records with explicit lengths,
 * never text: guest names may hold any byte but '/' and NUL. Integers are little-endian.
 *
 * What the overlay of a project holds, relative to host_dir: records of a tag byte, a u32 length
 * and that many bytes of relative path. Tags: ZB_DIFF_CREATED, ZB_DIFF_CHANGED, ZB_DIFF_DELETED,
 * and ZB_DIFF_TOO_DEEP for a directory nested deeper than ZB_DIFF_MAX_DEPTH whose contents are not
 * listed. Returns the bytes needed (call again with more room if larger than len; only whole
 * records are written), or -1 with err. */
#define ZB_DIFF_CREATED 65  /* 'A' */
#define ZB_DIFF_CHANGED 77  /* 'M' */
#define ZB_DIFF_DELETED 68  /* 'D' */
#define ZB_DIFF_TOO_DEEP 33 /* '!' */
#define ZB_DIFF_MAX_DEPTH 256
long zb_sandbox_project_diff(zb_sandbox *sb, const char *host_dir, char *buf, size_t len, char *err);
/* Read a regular file as the guest sees it (overlay or host): bytes read, 0 at its end, or -1.
 * A symlink in the last component is not followed (an error). */
long zb_sandbox_read_file(zb_sandbox *sb, const char *guest_path, uint64_t offset, void *buf, size_t len,
                          char *err);
/* Directory entries: records of a kind byte (ZB_ENTRY_*), a u64 size (regular files; else 0), a
 * u16 name length and the name. "." and ".." are left out; guest symlinks are reported as
 * symlinks, never followed (neither in guest_path's last component). Returns the bytes needed
 * (call again with more room if larger than len; only whole records are written), or -1. */
#define ZB_ENTRY_DIR 100     /* 'd' */
#define ZB_ENTRY_FILE 102    /* 'f' */
#define ZB_ENTRY_SYMLINK 108 /* 'l' */
#define ZB_ENTRY_OTHER 111   /* 'o': fifo, socket, device */
long zb_sandbox_list_dir(zb_sandbox *sb, const char *guest_path, char *buf, size_t len, char *err);
/* One entry record (as above) for guest_path itself, its last component not followed. */
long zb_sandbox_guest_stat(zb_sandbox *sb, const char *guest_path, char *buf, size_t len, char *err);
/* Set the guest's working directory (an existing directory in its namespace). */
int zb_sandbox_chdir(zb_sandbox *sb, const char *guest_path, char *err);
/* Load an ELF executable (static, or dynamic through its PT_INTERP) and set up its stack.
 * exe_path is a guest path inside the view; argv/envp are NULL-terminated. */
int zb_sandbox_exec(zb_sandbox *sb, const char *exe_path, const char *cwd,
                    const char *const *argv, const char *const *envp, char *err);
/* Write one line per served syscall (name, arguments, result, host time) to fd; -1 stops. */
void zb_sandbox_set_trace_fd(zb_sandbox *sb, int fd);
/* Profile syscalls per phase (on != 0; switching it on also clears the counts); read them. */
void zb_sandbox_set_profile(zb_sandbox *sb, int on);
/* The most guest threads alive at once (1..1024, default 256): clone past it fails with EAGAIN.
 * -1 for a value out of range. A setting of the sandbox: restores keep it, forks start at 256. */
int zb_sandbox_set_max_threads(zb_sandbox *sb, int n);
/* The most processes (process 1 and its descendants, zombies included) at once (1..1024,
 * default 64): fork past it fails with EAGAIN. -1 for a value out of range. A setting of the
 * sandbox: restores keep it. */
int zb_sandbox_set_max_processes(zb_sandbox *sb, int n);
/* The processes of the sandbox's family alive now (1 without children). */
int zb_sandbox_process_count(zb_sandbox *sb);
/* Its child processes, zombies (exited, not waited for) included: while there are any,
 * zb_sandbox_snapshot fails (zb_sandbox_checkpoint does not; 0 without children). */
int zb_sandbox_child_count(zb_sandbox *sb);
/* The listening sockets (AF_UNIX, loopback TCP) process 1 has open. A snapshot holds them with
 * their names, but not a connection waiting in an accept queue: while one waits, snapshots fail. */
int zb_sandbox_listening_sockets(zb_sandbox *sb);
/* Of them, those with a connection waiting in their accept queue (while any is, snapshots fail). */
int zb_sandbox_listeners_waiting(zb_sandbox *sb);
/* File references in flight on the AF_UNIX sockets of the sandbox's family (sent with SCM_RIGHTS,
 * not received yet): while there are any zb_sandbox_snapshot fails, as with waiting connections. */
int zb_sandbox_fds_in_flight(zb_sandbox *sb);
/* Child-process sandboxes alive in this process, over all families (for leak checks). */
long zb_child_processes_alive(void);
/* Between requests (on != 0): a blocking UART read with no input queued does not stop the run for
 * INPUT while another guest thread can run or wake by itself; the reader waits and the others run
 * until a kick (or the deadline), or until none can, then INPUT as usual. Off (the default) during
 * requests, where INPUT means the guest asks the host for something (an input() reply). */
void zb_sandbox_set_input_yields(zb_sandbox *sb, int on);
void zb_sandbox_profile(zb_sandbox *sb, zb_syscall_profile *out);
/* The per-number rows of the profile with calls > 0, ascending by number: up to max of them
 * copied to out; returns how many there are (0 if profiling was never on). */
int zb_sandbox_profile_syscalls(zb_sandbox *sb, zb_syscall_nr_profile *out, int max);
/* The Linux name of x86-64 syscall nr ("unknown" if it has none). */
const char *zb_sandbox_syscall_name(uint64_t nr);

/* ---- running ---- */
/* Run until something needs the caller (see ZB_EVENT_*). deadline_ns is CLOCK_MONOTONIC, 0 = none.
 * Returns 0 with *ev filled; -1 only if the sandbox is already finished. */
int zb_sandbox_run(zb_sandbox *sb, int64_t deadline_ns, zb_event *ev);
/* Queue bytes for the guest to read from the UART. */
int zb_sandbox_push_input(zb_sandbox *sb, const void *data, size_t len, char *err);
/* Ask a running zb_sandbox_run (on another thread) to return ZB_EVENT_KICK soon. Thread-safe. */
void zb_sandbox_kick(zb_sandbox *sb);
/* Make input arriving on fd (a socket or pipe) kick the run of the calling thread (on != 0: O_ASYNC,
 * owner this thread, signal ZB_WATCH_SIGNAL), or stop that (on = 0). The engine server watches its
 * request socket this way while guest threads run between requests. -1 (errno) if fcntl failed. */
int zb_engine_watch_fd(int fd, int on);
/* Deliver a signal (e.g. SIGINT = 2) to the guest's handler when it next runs. Returns -1 with err
 * when the guest has no handler for it (the default action would kill it). With child processes,
 * every process of the first process's group (the foreground group) gets it too, as a terminal's
 * Ctrl-C does. */
int zb_sandbox_raise(zb_sandbox *sb, int signo, char *err);
/* Test hook: in the next run, stop with ZB_EVENT_KICK when exception `vector` (0-31) has entered
 * its CPL0 stub, or (ZB_BREAK_SYSCALL_ENTRY) a `syscall` the entry does not answer in the guest has
 * reached the entry's `out`, before the stub or the entry hands it to the host: the point a host
 * signal can interrupt a trap. A hardware breakpoint (KVM_SET_GUEST_DEBUG) does it exactly (under
 * PVM it fires on instructions KVM emulates, such as these `out`s, only); the run returns an
 * ERROR event if KVM refuses it. */
#define ZB_BREAK_SYSCALL_ENTRY 32
int zb_sandbox_test_break_in_trap(zb_sandbox *sb, int vector, char *err);
/* Disarm the guest's alarm()/setitimer(ITIMER_REAL) timer; 1 if one was armed. A cell's alarm must
 * not go off in the agent after the cell ended. */
int zb_sandbox_cancel_alarm(zb_sandbox *sb);
int zb_sandbox_finished(zb_sandbox *sb);
void zb_sandbox_stats(zb_sandbox *sb, zb_stats *out);
/* Take the engine's log lines for this sandbox (unimplemented syscalls etc.), '\n' separated.
 * Returns the number of bytes copied (0 when there is nothing new). */
size_t zb_sandbox_take_log(zb_sandbox *sb, char *buf, size_t len);
void zb_sandbox_free(zb_sandbox *sb);

/* ---- snapshots and forks ---- */
/* Capture the sandbox's current state. The sandbox goes on; the snapshot never changes. Refused
 * while it has child processes (a snapshot holds one process), listening sockets or fds in flight. */
zb_snapshot *zb_sandbox_snapshot(zb_sandbox *sb, char *err);
/* A rollback point of process 1 (a cell's checkpoint): zb_sandbox_snapshot, but child processes
 * are allowed. The snapshot holds process 1 alone; a restore of it (or a fork) ends the family's
 * other processes, as every restore does, and gives process 1 back its own children of the
 * moment it was taken as zombies: killed by SIGKILL (or their own status if they had ended), so
 * its waits see them end. zb_snapshot_lost_children says which. */
zb_snapshot *zb_sandbox_checkpoint(zb_sandbox *sb, char *err);
/* The pids of the children a restore of this checkpoint gives back as ended (at most max into
 * pids); their number. */
int zb_snapshot_lost_children(zb_snapshot *snap, int32_t *pids, int max);
/* A new sandbox whose memory is a copy-on-write view of the snapshot. */
zb_sandbox *zb_snapshot_fork(zb_snapshot *snap, char *err);
/* Make an existing sandbox equal to the snapshot again (its memory and state), in place. */
int zb_sandbox_restore(zb_sandbox *sb, zb_snapshot *snap, char *err);
/* Write a snapshot (memory image + state) to a directory; load it back, e.g. in another process. */
int zb_snapshot_save(zb_snapshot *snap, const char *dir, char *err);
zb_snapshot *zb_snapshot_load(zb_engine *engine, const char *dir, char *err);
/* The layout version of the state file zb_snapshot_save writes (and the only one zb_snapshot_load
 * reads): part of a template's key, so that templates of another layout are rebuilt. */
uint32_t zb_snapshot_format(void);
/* The MAC of a spilled checkpoint's record (mac.c; checkpoint_spill.py): GMAC, i.e. AES-256-GCM
 * over the bytes as associated data only, from OpenSSL's libcrypto (several GB/s here, against
 * ~0.7 GB/s for the portable BLAKE2b it replaced, which was most of a spill's time). A key must
 * never see a nonce twice: the spill file draws a key per session and each record's id, never
 * reused, is its nonce. prepare loads the cipher (OpenSSL reads its configuration on first use,
 * which the engine's lockdown forbids later; begin does it too); update fails (-1, and every
 * later call) if the library refused; end writes tag_len <= ZB_MAC_TAG_BYTES bytes and frees m,
 * as abandon does without a tag. */
#define ZB_MAC_KEY_BYTES 32
#define ZB_MAC_NONCE_BYTES 12
#define ZB_MAC_TAG_BYTES 16
typedef struct zb_mac zb_mac;
int zb_mac_prepare(char *err);
zb_mac *zb_mac_begin(const uint8_t *key, size_t key_len, const uint8_t *nonce, size_t nonce_len, char *err);
int zb_mac_update(zb_mac *m, const uint8_t *p, size_t n);
int zb_mac_end(zb_mac *m, uint8_t *tag, size_t tag_len, char *err);
void zb_mac_abandon(zb_mac *m);
/* Session saves (zeroboot_kernel/session_save.py): the state and only the pages that differ from
 * the snapshot's memory image, written to two fds; and a snapshot of a state (validated like
 * state.bin) over a memory image fd (duplicated; e.g. a memfd rebuilt from the template's image). */
int zb_snapshot_save_delta(zb_snapshot *snap, int state_fd, int pages_fd, char *err);
zb_snapshot *zb_snapshot_load_bytes(zb_engine *engine, const uint8_t *state, size_t state_len, int mem_fd, char *err);
/* A spilled checkpoint read back (zeroboot_kernel/checkpoint_spill.py): a snapshot of a spill
 * record in the aligned layout (zb_spill_write) over base's memory image, so that a sandbox of
 * base's lineage can be restored to it, validated as untrusted input: the state and the page
 * records' words (nwords u64s, `stored` of them stored pages) in memory, their contents read from
 * the file at offset (a multiple of ZB_SPILL_ALIGN) straight into the snapshot, through direct_fd
 * (the file opened O_DIRECT; -1: none) or, where that is refused, fd, each byte added to mac as
 * read, so that the caller checks the record's MAC before it uses the snapshot. */
zb_snapshot *zb_snapshot_load_aligned(zb_snapshot *base, const uint8_t *state, size_t state_len, const uint8_t *words,
                                      uint64_t nwords, uint64_t stored, int fd, int direct_fd, uint64_t offset,
                                      zb_mac *mac, char *err);
void zb_snapshot_release(zb_snapshot *snap);
/* A checkpoint spilled to disk without holding up the engine (checkpoint_spill.py, snapshot_file.c):
 * prepare (engine thread) holds the snapshot, serializes its state and counts its page records
 * (records: pages in the delta, stored: those with contents, the others being zero pages); write
 * (any one thread, while the engine goes on) writes the record at offset, which must be a multiple
 * of ZB_SPILL_ALIGN, in the aligned layout (head, state, a u64 count of the
 * page records and their u64 words, zeros up to the next ZB_SPILL_ALIGN boundary, the stored
 * pages' contents in the words' order), then mac_len bytes of the MAC (zb_mac_*, with nonce)
 * over all of it after the head, then the head, also returned in mac_out. The page contents go
 * through direct_fd (the same file opened O_DIRECT, straight from the snapshot's stores and
 * without the page cache; -1, or where a write through it is refused: through fd). job_free
 * (engine thread, after write returned) releases the snapshot. */
#define ZB_SPILL_ALIGN 4096
typedef struct zb_spill_job zb_spill_job;
zb_spill_job *zb_spill_prepare(zb_snapshot *snap, uint64_t *state_len, uint64_t *records, uint64_t *stored,
                               char *err);
int zb_spill_write(zb_spill_job *job, int fd, int direct_fd, uint64_t offset, const uint8_t *head, size_t head_len,
                   const uint8_t *key, size_t key_len, const uint8_t *nonce, size_t nonce_len, uint8_t *mac_out,
                   size_t mac_len, char *err);
void zb_spill_job_free(zb_spill_job *job);
/* Learn a snapshot's working set: the pages present in sb's memory after sb, forked from snap,
 * ran representative requests. Forks of snap can then prefault them (zb_sandbox_prefault). */
int zb_snapshot_learn_working_set(zb_snapshot *snap, zb_sandbox *sb, char *err);
uint64_t zb_snapshot_working_set_pages(zb_snapshot *snap);
/* Prefault the base snapshot's working set into sb's memory: mode 1 = MADV_POPULATE_WRITE
 * (private copies; the guest's first touch then costs ~1.5 us instead of 8-20 us), mode 2 =
 * MADV_POPULATE_READ. Returns the pages prefaulted, or -1 with err. */
long zb_sandbox_prefault(zb_sandbox *sb, int mode, char *err);
/* Bytes of host memory the snapshot holds on its own (pages it copied, and its copy of the engine's
 * state of the sandbox: overlay metadata, fd table, stream and UART buffers), for accounting. */
uint64_t zb_snapshot_private_bytes(zb_snapshot *snap);
/* Bytes of host memory held by the page stores that these snapshots use, each store counted once
 * (a store shared by several checkpoints is one cost): what a session's checkpoints cost the host,
 * and what its checkpoint memory budget is compared with. NULL entries are skipped. */
uint64_t zb_snapshots_memory(zb_snapshot **snaps, size_t n);
/* At most how many bytes of pages the next snapshot of sb would store (the guest's pages written
 * since its last snapshot), or -1 with err: lets the caller make room in a budget before it. */
int64_t zb_sandbox_pending_bytes(zb_sandbox *sb, char *err);
/* on = 1: store pages that no snapshot uses any more are kept (not given back) and the next
 * snapshot writes its new pages into them, which costs about a third of fresh pages; on = 0: give
 * back what is left. For a drop of old snapshots just before a snapshot; the pages are held only
 * between the two calls, and zb_snapshot_spare_bytes says how many bytes they are. */
void zb_snapshot_keep_spare(int on);
uint64_t zb_snapshot_spare_bytes(void);
/* Store pages that no snapshot uses any more are given back to the host in batches (up to 8 MiB
 * of them wait, merged into longer runs, and a store that dies first needs none): give back the
 * ones waiting now (an idle session). */
void zb_snapshot_give_back_dead(void);
/* Bytes of dead store pages waiting for that batch now (for stats and tests). */
uint64_t zb_snapshot_dead_waiting_bytes(void);
/* Bytes of snapshot pages written into spare pages so far in this process (for stats and tests). */
uint64_t zb_snapshot_spare_reused_bytes(void);
/* on = 1 (the default): guest memory made from now on gets an unlogged window, a memslot without
 * KVM dirty logging where big anonymous mappings go (memory.h); 0: none (one dirty-logged slot,
 * for measurements). Returns the previous setting. */
int zb_mem_unlogged_window(int on);
/* Bytes of sb's unlogged window that should be dirty-logged now, because they held still (memory.h). */
uint64_t zb_sandbox_window_logged_bytes(zb_sandbox *sb);
/* Give back the host's private copies of sb's pages that hold its template's bytes again (a cell
 * writes ~1,000 pages and most end as they were: CPython's reference counts go up and back down),
 * so an idle live sandbox holds only what its cells changed. The guest reads the same bytes
 * afterwards; its next write to such a page copies it again (a host fault). Only between runs.
 * Returns the pages given back, or -1 with err. */
int64_t zb_sandbox_release_template_copies(zb_sandbox *sb, char *err);
/* Give back the memory sb's guest freed that is kept mapped for reuse (the next big allocation
 * would otherwise fault in fresh pages): it reads as zeros either way, and snapshots record freed
 * pages as zero pages, so nothing the guest or a checkpoint sees changes; the next allocation that
 * would have reused it gets fresh host pages instead. Only between runs. Returns the pages given
 * back, or -1 with err. */
int64_t zb_sandbox_release_freed(zb_sandbox *sb, char *err);
/* CFFI-END */

#endif
