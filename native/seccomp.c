/* seccomp.c - locking the engine process down, in two phases.
 *
 * The engine serves guest syscalls in the host, so it is an attack surface: if a guest ever found
 * a bug that gave it code execution inside the engine process, seccomp decides what that code can
 * do. Both phases allow only listed syscalls (everything else fails with EPERM) and set
 * no_new_privs:
 *   ZB_LOCKDOWN_SETUP  what the engine process (CPython + this engine) needs to start, load or build
 *                      templates and run guests: no exec, no new processes or threads, no network
 *                      sockets, no ptrace, no mounts, no module loading, no bpf, no namespaces,
 *                      signals only to itself.
 *                      With a network policy installed (zb_engine_set_network), both phases also
 *                      allow socket(AF_INET / AF_INET6), connect, get/setsockopt, getsockname,
 *                      getpeername and sendmmsg (the host resolver's); bind, listen and accept never.
 *   ZB_LOCKDOWN_RUN    stacked on top once the session is ready: additionally no file creation,
 *                      renaming, deletion or truncation of host files, host files opened read-only
 *                      only (openat2, whose flags a filter cannot read, is gone too).
 * Filters stack: a later phase can only remove permissions. Each phase applies to every thread of
 * the process (SECCOMP_FILTER_FLAG_TSYNC): the spill writer thread, started before the first phase
 * (checkpoint_spill.py), is filtered exactly as the engine's own thread.
 */
#include "util.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_INSNS 512
#define DENY (SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA))

typedef struct {
    struct sock_filter insn[MAX_INSNS];
    unsigned n;
    int overflow;
} prog_t;

static void emit(prog_t *p, struct sock_filter f) {
    if (p->n < MAX_INSNS) p->insn[p->n++] = f;
    else p->overflow = 1;
}

#define LOAD_NR() emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)))
#define LOAD_ARG_LO(i) emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[i])))
#define RET(v) emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, (v)))

static void check_arch(prog_t *p) {
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0));
    RET(SECCOMP_RET_KILL_PROCESS);
    LOAD_NR();
    /* x32 syscalls would bypass the numbers below */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1));
    RET(DENY);
}

/* if nr == `nr`: return `action` (accumulator holds nr) */
static void rule(prog_t *p, int nr, uint32_t action) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 1));
    RET(action);
}

/* if nr == `nr`: allow when (arg_lo & mask) == 0, else deny. Other syscalls fall through with
 * the accumulator still holding nr. */
static void rule_flags_clear(prog_t *p, int nr, int arg, uint32_t mask) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 4));
    LOAD_ARG_LO(arg);
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, mask, 1, 0));
    RET(SECCOMP_RET_ALLOW);
    RET(DENY);
}

/* if nr == `nr`: allow when arg_lo == value, else deny (fall-through keeps nr) */
static void rule_arg_eq(prog_t *p, int nr, int arg, uint32_t value) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 4));
    LOAD_ARG_LO(arg);
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, value, 0, 1));
    RET(SECCOMP_RET_ALLOW);
    RET(DENY);
}

/* if nr == `nr`: allow when arg_lo is v1 or v2, else deny (fall-through keeps nr) */
static void rule_arg_in2(prog_t *p, int nr, int arg, uint32_t v1, uint32_t v2) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 5));
    LOAD_ARG_LO(arg);
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, v1, 1, 0));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, v2, 0, 1));
    RET(SECCOMP_RET_ALLOW);
    RET(DENY);
}

/* What a running engine process needs, in either phase. */
static const int always[] = {
    SYS_read, SYS_write, SYS_pread64, SYS_pwrite64, SYS_pwritev, SYS_readv, SYS_writev, SYS_close, SYS_close_range,
    SYS_fstat, SYS_newfstatat, SYS_statx, SYS_lstat, SYS_stat, SYS_lseek, SYS_getdents64, SYS_readlink,
    SYS_readlinkat, SYS_access, SYS_faccessat, SYS_faccessat2, SYS_getcwd, SYS_fcntl, SYS_dup, SYS_dup2,
    SYS_dup3, SYS_ioctl, SYS_mmap, SYS_munmap, SYS_mremap, SYS_mprotect, SYS_madvise, SYS_brk, SYS_msync,
    SYS_mincore, SYS_memfd_create, SYS_ftruncate, SYS_futex, SYS_set_robust_list, SYS_get_robust_list,
    SYS_rseq, SYS_sched_yield, SYS_sched_getaffinity, SYS_getrandom, SYS_clock_gettime, SYS_clock_getres,
    SYS_gettimeofday, SYS_time, SYS_nanosleep, SYS_clock_nanosleep, SYS_rt_sigaction, SYS_rt_sigprocmask,
    SYS_rt_sigreturn, SYS_rt_sigtimedwait, SYS_sigaltstack, SYS_timer_create, SYS_timer_settime,
    SYS_timer_gettime, SYS_timer_delete, SYS_poll, SYS_ppoll, SYS_select, SYS_pselect6, SYS_epoll_create1,
    SYS_epoll_ctl, SYS_epoll_wait, SYS_epoll_pwait, SYS_recvfrom, SYS_sendto, SYS_recvmsg, SYS_sendmsg,
    SYS_getsockopt, SYS_shutdown, SYS_getpid, SYS_gettid, SYS_getppid, SYS_getuid, SYS_geteuid, SYS_getgid,
    SYS_getegid, SYS_getgroups, SYS_uname, SYS_sysinfo, SYS_getrusage, SYS_times, SYS_prlimit64,
    SYS_getrlimit, SYS_umask, SYS_arch_prctl, SYS_set_tid_address, SYS_exit, SYS_exit_group,
    SYS_restart_syscall, SYS_pipe2, SYS_seccomp, SYS_prctl, SYS_sched_getparam, SYS_sched_getscheduler,
    SYS_getpriority, SYS_fadvise64, SYS_eventfd2,
};

/* Set-up only: building and saving templates, Python start-up. */
static const int setup_only[] = {
    SYS_openat2, SYS_mkdir, SYS_mkdirat, SYS_rename, SYS_renameat, SYS_renameat2, SYS_unlink, SYS_unlinkat,
    SYS_rmdir, SYS_chmod, SYS_fchmod, SYS_fchmodat, SYS_utimensat, SYS_copy_file_range, SYS_fallocate,
    SYS_fsync, SYS_fdatasync, SYS_symlink, SYS_symlinkat, SYS_truncate, SYS_chdir, SYS_fchdir, SYS_sendfile,
    SYS_flock, SYS_fstatfs, SYS_statfs,
};

static void build(prog_t *p, int phase, int network) {
    check_arch(p);
    for (size_t i = 0; i < sizeof always / sizeof always[0]; i++) rule(p, always[i], SECCOMP_RET_ALLOW);
    if (phase == ZB_LOCKDOWN_SETUP) {
        for (size_t i = 0; i < sizeof setup_only / sizeof setup_only[0]; i++) rule(p, setup_only[i], SECCOMP_RET_ALLOW);
        rule(p, SYS_open, SECCOMP_RET_ALLOW);
        rule(p, SYS_openat, SECCOMP_RET_ALLOW);
    } else {
        /* host files may only be read: no write, create, truncate or append */
        uint32_t writing = O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND;
        rule_flags_clear(p, SYS_openat, 2, writing);
        rule_flags_clear(p, SYS_open, 1, writing);
    }
    /* signals only to this process: kill(getpid(), ...), tgkill(getpid(), ...) */
    rule_arg_eq(p, SYS_kill, 0, (uint32_t)getpid());
    rule_arg_eq(p, SYS_tgkill, 0, (uint32_t)getpid());
    /* sockets: only AF_UNIX pairs (the kernel's channel); no network unless the session has a
     * network policy (net_policy.c), and then only client sockets of the internet families: the
     * guest's connections and the engine's own host resolver. Never bind, listen or accept. */
    if (phase == ZB_LOCKDOWN_SETUP) {
        rule_arg_eq(p, SYS_socketpair, 0, AF_UNIX);
    }
    if (network) {
        static const int client[] = {SYS_connect, SYS_getsockname, SYS_getpeername, SYS_setsockopt, SYS_sendmmsg};
        for (size_t i = 0; i < sizeof client / sizeof client[0]; i++) rule(p, client[i], SECCOMP_RET_ALLOW);
        rule_arg_in2(p, SYS_socket, 0, AF_INET, AF_INET6);
    }
    RET(DENY);
}

int zb_seccomp_lockdown(int phase, int network, char *err) {
    if (phase != ZB_LOCKDOWN_SETUP && phase != ZB_LOCKDOWN_RUN) {
        zb_seterr(err, "unknown lockdown phase %d", phase);
        return -1;
    }
    prog_t *p = calloc(1, sizeof *p);
    if (!p) { zb_seterr(err, "out of memory"); return -1; }
    build(p, phase, network);
    if (p->overflow) { free(p); zb_seterr(err, "seccomp program too long"); return -1; }
    struct sock_fprog fprog = {.len = (unsigned short)p->n, .filter = p->insn};
    int rc = 0;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
        zb_seterr(err, "PR_SET_NO_NEW_PRIVS: %s", strerror(errno));
        rc = -1;
    } else {
        /* TSYNC: every thread of the process gets the filter, also threads started before it (the
         * spill writer, checkpoint_spill.py); a thread that cannot take it fails the call */
        long r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &fprog);
        if (r < 0) {
            zb_seterr(err, "seccomp: %s", strerror(errno));
            rc = -1;
        } else if (r > 0) {
            zb_seterr(err, "seccomp: thread %ld could not take the engine's filter", r);
            rc = -1;
        }
    }
    free(p);
    return rc;
}
