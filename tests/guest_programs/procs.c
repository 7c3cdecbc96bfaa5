/* procs.c - processes: fork/vfork/clone, wait4/waitid, exit and killed-by-signal statuses, pipes
 * between processes with blocking reads, SIGCHLD, zombies, process groups and sessions, kill
 * across processes, PR_SET_PDEATHSIG, EPIPE/SIGPIPE, the process limit and hostile arguments.
 * Children report failed checks through their exit status (child_exit), since only the parent
 * prints PASS. */
#include "check.h"
#include "children.h"

#include <linux/sched.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <time.h>
#include <sys/wait.h>

static void test_fork_wait(int argc, char **argv) {
    (void)argc, (void)argv;
    pid_t me = getpid();
    CHECK_EQ(me, 1);
    CHECK_EQ(getppid(), 0);
    volatile int shared = 1;
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        CHECK(getpid() > 1, "child pid %d", getpid());
        CHECK_EQ(getppid(), me);
        CHECK_EQ(syscall(SYS_gettid), getpid());
        CHECK_EQ(shared, 1);
        shared = 2; /* copy-on-write: the parent keeps its 1 */
        child_exit(7);
    }
    CHECK(pid > 1, "fork returned %d", pid);
    expect_exit(pid, 7);
    CHECK_EQ(shared, 1);
    CHECK_ERR(waitpid(pid, NULL, 0), ECHILD);
    CHECK_ERR(wait(NULL), ECHILD);
    /* raw clone as glibc's fork makes it, and clone3 */
    pid = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    if (pid == 0) _exit(9);
    expect_exit(pid, 9);
    struct clone_args ca;
    memset(&ca, 0, sizeof ca);
    ca.exit_signal = SIGCHLD;
    fflush(stdout);
    pid = (pid_t)syscall(SYS_clone3, &ca, sizeof ca);
    if (pid == 0) _exit(11);
    CHECK(pid > 1, "clone3 returned %d (errno %d)", pid, errno);
    expect_exit(pid, 11);
    /* pids are new each time */
    pid_t a = fork_or_fail();
    if (a == 0) _exit(0);
    pid_t b = fork_or_fail();
    if (b == 0) _exit(0);
    CHECK(a != b, "two children with pid %d", a);
    expect_exit(b, 0);
    expect_exit(a, 0);
}

static void test_killed(int argc, char **argv) {
    (void)argc, (void)argv;
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        *(volatile int *)16 = 1; /* SIGSEGV */
        _exit(0);
    }
    expect_signal(pid, SIGSEGV);
    pid = fork_or_fail();
    if (pid == 0) {
        kill(getpid(), SIGTERM);
        _exit(0);
    }
    expect_signal(pid, SIGTERM);
    pid = fork_or_fail();
    if (pid == 0) abort();
    expect_signal(pid, SIGABRT);
    /* a child blocked in a read is killed by its parent */
    int p[2];
    OK(pipe(p));
    pid = fork_or_fail();
    if (pid == 0) {
        char c;
        close(p[1]);
        (void)read(p[0], &c, 1);
        _exit(3);
    }
    close(p[0]);
    sched_yield();
    OK(kill(pid, SIGKILL));
    expect_signal(pid, SIGKILL);
    close(p[1]);
}

static void test_pipes(int argc, char **argv) {
    (void)argc, (void)argv;
    int down[2], up[2];
    OK(pipe(down));
    OK(pipe(up));
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        char buf[64];
        /* blocks until the parent writes: the parent runs meanwhile */
        ssize_t n = read(down[0], buf, sizeof buf);
        CHECK_EQ(n, 5);
        CHECK(n == 5 && !memcmp(buf, "ping\n", 5), "child read %zd", n);
        CHECK_EQ(write(up[1], "pong\n", 5), 5);
        /* a big transfer through the 64 KiB pipe: the writer blocks while it is full */
        size_t total = 0;
        for (;;) {
            char big[4096];
            ssize_t r = read(down[0], big, sizeof big);
            if (r <= 0) { CHECK_EQ(r, 0); break; }
            for (ssize_t i = 0; i < r; i++)
                if (big[i] != (char)((total + (size_t)i) % 251)) { FAIL("byte %zu", total + (size_t)i); break; }
            total += (size_t)r;
        }
        CHECK_EQ(total, 1 << 20);
        child_exit(0);
    }
    close(down[0]);
    close(up[1]);
    CHECK_EQ(write(down[1], "ping\n", 5), 5);
    char buf[64];
    /* blocks until the child answers */
    CHECK_EQ(read(up[0], buf, sizeof buf), 5);
    CHECK(!memcmp(buf, "pong\n", 5), "parent read");
    static char big[1 << 20];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (char)(i % 251);
    size_t done = 0;
    while (done < sizeof big) {
        ssize_t w = write(down[1], big + done, sizeof big - done);
        if (w <= 0) { FAIL("write: %s", strerror(errno)); break; }
        done += (size_t)w;
    }
    close(down[1]); /* the child reads EOF */
    expect_exit(pid, 0);
    CHECK_EQ(read(up[0], buf, 1), 0); /* the child's write end closed with it */
    close(up[0]);
    /* a socketpair the same way */
    int sv[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    pid = fork_or_fail();
    if (pid == 0) {
        char c;
        CHECK_EQ(recv(sv[1], &c, 1, 0), 1);
        CHECK_EQ(send(sv[1], &c, 1, 0), 1);
        child_exit(0);
    }
    CHECK_EQ(send(sv[0], "s", 1, 0), 1);
    char c = 0;
    CHECK_EQ(recv(sv[0], &c, 1, 0), 1);
    CHECK_EQ(c, 's');
    expect_exit(pid, 0);
    /* a blocking eventfd read waits for the other process's write */
    int efd = (int)OK(eventfd(0, 0));
    pid = fork_or_fail();
    if (pid == 0) {
        uint64_t v = 0;
        CHECK_EQ(read(efd, &v, 8), 8);
        CHECK_EQ(v, 42);
        child_exit(0);
    }
    uint64_t v = 42;
    sched_yield();
    CHECK_EQ(write(efd, &v, 8), 8);
    expect_exit(pid, 0);
    close(efd);
}

static volatile sig_atomic_t chld_seen;
static void on_chld(int sig) { (void)sig; chld_seen++; }

static void test_sigchld(int argc, char **argv) {
    (void)argc, (void)argv;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_chld;
    OK(sigaction(SIGCHLD, &sa, NULL));
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    OK(sigprocmask(SIG_BLOCK, &block, &old));
    pid_t pid = fork_or_fail();
    if (pid == 0) _exit(4);
    while (!chld_seen) sigsuspend(&old); /* the child's end wakes it */
    CHECK_EQ(chld_seen, 1);
    expect_exit(pid, 4);
    OK(sigprocmask(SIG_SETMASK, &old, NULL));
    /* SIGCHLD ignored: children are reaped at once, wait reports ECHILD */
    signal(SIGCHLD, SIG_IGN);
    pid = fork_or_fail();
    if (pid == 0) _exit(0);
    CHECK_ERR(waitpid(pid, NULL, 0), ECHILD);
    signal(SIGCHLD, SIG_DFL);
    /* SA_NOCLDWAIT the same */
    sa.sa_handler = SIG_DFL;
    sa.sa_flags = SA_NOCLDWAIT;
    OK(sigaction(SIGCHLD, &sa, NULL));
    pid = fork_or_fail();
    if (pid == 0) _exit(0);
    CHECK_ERR(waitpid(-1, NULL, 0), ECHILD);
    signal(SIGCHLD, SIG_DFL);
}

static void test_wnohang_zombies(int argc, char **argv) {
    (void)argc, (void)argv;
    int p[2];
    OK(pipe(p));
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        char c;
        close(p[1]);
        CHECK_EQ(read(p[0], &c, 1), 1);
        child_exit(c);
    }
    close(p[0]);
    int st = -1;
    CHECK_EQ(waitpid(pid, &st, WNOHANG), 0); /* still running (blocked in its read) */
    siginfo_t si;
    memset(&si, 0xff, sizeof si);
    CHECK_EQ(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG), 0);
    CHECK_EQ(si.si_pid, 0);
    CHECK_EQ(write(p[1], "\x05", 1), 1);
    close(p[1]);
    /* waitid with WNOWAIT leaves the zombie, then wait4 reaps it */
    memset(&si, 0, sizeof si);
    CHECK_EQ(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT), 0);
    CHECK_EQ(si.si_pid, pid);
    CHECK_EQ(si.si_signo, SIGCHLD);
    CHECK_EQ(si.si_code, CLD_EXITED);
    CHECK_EQ(si.si_status, 5);
    CHECK_EQ(si.si_uid, 1000);
    expect_exit(pid, 5);
    /* several zombies, reaped by wait(-1) in any order */
    pid_t kids[3];
    for (int i = 0; i < 3; i++) {
        kids[i] = fork_or_fail();
        if (kids[i] == 0) _exit(20 + i);
    }
    int seen = 0;
    for (int i = 0; i < 3; i++) {
        pid_t got = waitpid(-1, &st, 0);
        for (int k = 0; k < 3; k++)
            if (got == kids[k]) { CHECK_EQ(WEXITSTATUS(st), 20 + k); seen |= 1 << k; }
    }
    CHECK_EQ(seen, 7);
    CHECK_ERR(waitpid(-1, NULL, WNOHANG), ECHILD);
    /* a killed child through waitid */
    pid = fork_or_fail();
    if (pid == 0) { raise(SIGUSR1); _exit(0); }
    memset(&si, 0, sizeof si);
    CHECK_EQ(waitid(P_ALL, 0, &si, WEXITED), 0);
    CHECK_EQ(si.si_pid, pid);
    CHECK_EQ(si.si_code, CLD_KILLED);
    CHECK_EQ(si.si_status, SIGUSR1);
}

static void test_groups(int argc, char **argv) {
    (void)argc, (void)argv;
    CHECK_EQ(getpgrp(), 1);
    CHECK_EQ(getsid(0), 1);
    CHECK_ERR(setsid(), EPERM); /* a group leader */
    int p[2];
    OK(pipe(p));
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        CHECK_EQ(getpgrp(), 1);
        CHECK_EQ(OK(setpgid(0, 0)), 0);
        CHECK_EQ(getpgrp(), getpid());
        char c;
        close(p[1]);
        (void)read(p[0], &c, 1); /* killed while waiting */
        _exit(0);
    }
    close(p[0]);
    /* the parent may move its child too (a race in a shell, so both call it) */
    setpgid(pid, pid);
    CHECK_EQ(getpgid(pid), pid);
    CHECK_EQ(getsid(pid), 1);
    OK(kill(-pid, SIGTERM)); /* the child's group */
    expect_signal(pid, SIGTERM);
    close(p[1]);
    /* a new session */
    pid = fork_or_fail();
    if (pid == 0) {
        CHECK_EQ(setsid(), getpid());
        CHECK_EQ(getsid(0), getpid());
        CHECK_EQ(getpgrp(), getpid());
        CHECK_ERR(setpgid(0, 1), EPERM); /* a session leader */
        child_exit(0);
    }
    expect_exit(pid, 0);
    /* errors */
    CHECK_ERR(kill(99999, 0), ESRCH);
    CHECK_ERR(kill(-99999, SIGTERM), ESRCH);
    CHECK_ERR(kill(1, 65), EINVAL);
    CHECK_ERR(getpgid(99999), ESRCH);
    CHECK_ERR(getsid(99999), ESRCH);
    CHECK_ERR(setpgid(99999, 0), ESRCH);
    CHECK_ERR(setpgid(0, -1), EINVAL);
    CHECK_ERR(setpgid(0, 4242), EPERM); /* no such group */
    OK(kill(0, 0));
    OK(kill(getpid(), 0));
}

static int spawned(void *arg) {
    (void)arg;
    syscall(SYS_exit_group, 6);
    return 0;
}

static void test_vfork(int argc, char **argv) {
    (void)argc, (void)argv;
    int p[2];
    OK(pipe2(p, O_NONBLOCK));
    fflush(stdout);
    pid_t pid = vfork();
    if (pid == 0) {
        (void)!write(p[1], "v", 1);
        _exit(3);
    }
    /* the parent goes on only once the child has exited: its byte is there already */
    char c = 0;
    CHECK_EQ(read(p[0], &c, 1), 1);
    CHECK_EQ(c, 'v');
    expect_exit(pid, 3);
    /* posix_spawn's clone: CLONE_VM | CLONE_VFORK with a stack of its own */
    static char stack[65536] __attribute__((aligned(16)));
    fflush(stdout);
    pid = clone(spawned, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
    CHECK(pid > 1, "clone(CLONE_VM|CLONE_VFORK) = %d", pid);
    expect_exit(pid, 6);
    CHECK_ERR(syscall(SYS_clone, CLONE_VM | SIGCHLD, stack + sizeof stack, 0, 0, 0), EINVAL);
    close(p[0]);
    close(p[1]);
}

/* ---- the process limit: argv[2] processes at most (the parent included), EAGAIN past it ---- */
static void test_limit(int argc, char **argv) {
    int limit = argc > 2 ? atoi(argv[2]) : 64;
    int hold[2];
    OK(pipe(hold));
    int made = 0;
    for (;;) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            char c;
            close(hold[1]);
            (void)read(hold[0], &c, 1); /* until the parent lets go */
            _exit(0);
        }
        if (pid < 0) { CHECK_EQ(errno, EAGAIN); break; }
        if (++made > 2000) { FAIL("no limit"); break; }
    }
    CHECK_EQ(made, limit - 1);
    close(hold[1]); /* every child reads EOF and exits */
    for (int i = 0; i < made; i++) {
        int st;
        if (waitpid(-1, &st, 0) < 0) { FAIL("wait %d: %s", i, strerror(errno)); break; }
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
    }
    CHECK_ERR(wait(NULL), ECHILD);
    /* the slots are free again */
    pid_t pid = fork_or_fail();
    if (pid == 0) _exit(0);
    expect_exit(pid, 0);
    printf("made %d\n", made);
}

/* A fork bomb: every process forks up to 7 times (2^7 > the limit of 64), its children go on
 * forking; refused forks fail with EAGAIN, every process but the first then exits (orphans are
 * reaped) and the first gets its children back. The host stays unharmed. */
static void test_bomb(int argc, char **argv) {
    (void)argc, (void)argv;
    int refused = 0;
    for (int round = 0; round < 7; round++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) { CHECK_EQ(errno, EAGAIN); refused++; break; }
    }
    if (getpid() != 1) _exit(0);
    while (wait(NULL) > 0) {}
    CHECK_EQ(errno, ECHILD);
    printf("bomb done\n");
}

static void *thread_forks(void *arg) {
    (void)arg;
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        /* one thread in the child: the one that forked, its tid the child's pid */
        CHECK_EQ(syscall(SYS_gettid), getpid());
        child_exit(5);
    }
    expect_exit(pid, 5);
    return NULL;
}

static void test_fork_in_thread(int argc, char **argv) {
    (void)argc, (void)argv;
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, thread_forks, NULL), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
}

static void test_sigpipe_pdeathsig(int argc, char **argv) {
    (void)argc, (void)argv;
    /* writing to a pipe whose readers all exited: SIGPIPE kills a writer with the default action */
    int p[2];
    OK(pipe(p));
    pid_t reader = fork_or_fail();
    if (reader == 0) _exit(0); /* holds the read end, then exits */
    close(p[0]);
    expect_exit(reader, 0);
    pid_t writer = fork_or_fail();
    if (writer == 0) {
        (void)!write(p[1], "x", 1);
        _exit(0);
    }
    expect_signal(writer, SIGPIPE);
    signal(SIGPIPE, SIG_IGN);
    CHECK_ERR(write(p[1], "x", 1), EPIPE);
    signal(SIGPIPE, SIG_DFL);
    close(p[1]);
    /* PR_SET_PDEATHSIG: a grandchild dies with its parent; its write end closes then */
    OK(pipe(p));
    pid_t mid = fork_or_fail();
    if (mid == 0) {
        pid_t g = fork_or_fail();
        if (g == 0) {
            close(p[0]);
            OK(prctl(PR_SET_PDEATHSIG, SIGKILL));
            int sig = 0;
            OK(prctl(PR_GET_PDEATHSIG, &sig));
            CHECK_EQ(sig, SIGKILL);
            (void)!write(p[1], "g", 1);
            for (;;) pause();
        }
        char c;
        close(p[1]);
        CHECK_EQ(read(p[0], &c, 1), 1); /* the grandchild is set up */
        child_exit(0);
    }
    close(p[1]);
    expect_exit(mid, 0);
    char buf[4];
    ssize_t n;
    int got_g = 0;
    while ((n = read(p[0], buf, 1)) > 0) got_g++; /* EOF once the grandchild is gone */
    CHECK_EQ(n, 0);
    CHECK_EQ(got_g, 0); /* the middle process read its byte */
    close(p[0]);
    CHECK_ERR(prctl(PR_SET_PDEATHSIG, 65), EINVAL);
}

static void test_hostile(int argc, char **argv) {
    (void)argc, (void)argv;
    CHECK_ERR(syscall(SYS_wait4, -1, NULL, 0, NULL), ECHILD); /* no children yet */
    pid_t pid = fork_or_fail();
    if (pid == 0) _exit(1);
    CHECK_ERR(syscall(SYS_wait4, pid, (void *)16, 0, NULL), EFAULT);
    CHECK_ERR(syscall(SYS_wait4, pid, (void *)0xffffffffff000, 0, NULL), EFAULT);
    CHECK_ERR(syscall(SYS_wait4, pid, NULL, 0, (void *)8), EFAULT);
    CHECK_ERR(syscall(SYS_wait4, pid, NULL, 0x12345678, NULL), EINVAL);
    CHECK_ERR(syscall(SYS_wait4, (long)INT32_MIN, NULL, 0, NULL), ESRCH);
    CHECK_ERR(syscall(SYS_wait4, 99999, NULL, 0, NULL), ECHILD);
    CHECK_ERR(syscall(SYS_waitid, 7, 0, NULL, WEXITED, NULL), EINVAL);
    CHECK_ERR(syscall(SYS_waitid, P_PID, 0, NULL, WEXITED, NULL), EINVAL);
    CHECK_ERR(syscall(SYS_waitid, P_ALL, 0, NULL, WNOHANG, NULL), EINVAL); /* no event kind */
    CHECK_ERR(syscall(SYS_waitid, P_ALL, 0, (void *)32, WEXITED, NULL), EFAULT);
    CHECK_ERR(syscall(SYS_waitid, P_PIDFD, 3, NULL, WEXITED, NULL), EINVAL);
    CHECK_ERR(syscall(SYS_clone, SIGCHLD | CLONE_CHILD_SETTID, 0, 0, (void *)24, 0), EFAULT);
    CHECK_ERR(syscall(SYS_clone, SIGCHLD | CLONE_PARENT_SETTID, 0, (void *)24, 0, 0), EFAULT);
    CHECK_ERR(syscall(SYS_clone, SIGCHLD | CLONE_NEWPID, 0, 0, 0, 0), EINVAL);
    CHECK_ERR(syscall(SYS_clone, 99 /* exit signal > 64 */, 0, 0, 0, 0), EINVAL);
    CHECK_ERR(syscall(SYS_tgkill, 99999, 99999, SIGTERM), ESRCH);
    CHECK_ERR(syscall(SYS_tgkill, pid, pid, 99), EINVAL);
    expect_exit(pid, 1);
    /* the parent-settid/child-settid pointers get the child's pid */
    pid_t ptid = 0, ctid = 0;
    fflush(stdout);
    pid = (pid_t)syscall(SYS_clone, SIGCHLD | CLONE_PARENT_SETTID | CLONE_CHILD_SETTID, 0, &ptid, &ctid, 0);
    if (pid == 0) _exit(ctid == getpid() ? 0 : 1);
    CHECK_EQ(ptid, pid);
    CHECK_EQ(ctid, 0); /* the child's copy, not ours */
    expect_exit(pid, 0);
}

/* Leaves argv[2] children blocked on a pipe, prints "forked", then blocks itself (the host's
 * deadline stops it): the host looks at, snapshots, restores or frees a family with live children. */
static void test_leave(int argc, char **argv) {
    int n = argc > 2 ? atoi(argv[2]) : 3;
    int hold[2];
    OK(pipe(hold));
    for (int i = 0; i < n; i++) {
        pid_t pid = fork_or_fail();
        if (pid == 0) {
            char c;
            (void)read(hold[0], &c, 1);
            _exit(0);
        }
    }
    printf("forked %d\n", n);
    fflush(stdout);
    if (argc > 3) exit(0); /* "exit": leave them */
    char c;
    (void)read(hold[0], &c, 1); /* nobody writes: blocks until the deadline */
}

/* ---- a child's own alarm interrupts its blocking wait (issue 15) ----
 * A forked child arms alarm(1) and blocks in select/pselect6/poll/ppoll/epoll_wait on an empty
 * pipe with a 20 s timeout and a SIGALRM handler (no SA_RESTART): the wait must end with EINTR
 * after the alarm, not at its timeout, while the parent holds the VM, either sleeping in a wait of
 * its own (poll on the child's report pipe: argv[2] "sleep") or spinning with no syscalls
 * ("spin"). The bound (10 s) is a hang guard, not a timing check. */
static volatile sig_atomic_t alarms_seen;
static void on_alarm(int sig) { (void)sig; alarms_seen++; }

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#define ALARM_WAIT_GUARD_NS 10000000000ll

static void child_waits(const char *how, int rd) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; /* no SA_RESTART: the wait fails with EINTR */
    OK(sigaction(SIGALRM, &sa, NULL));
    alarms_seen = 0;
    int64_t t0 = mono_ns();
    alarm(1);
    long r;
    if (!strcmp(how, "select")) {
        fd_set set;
        FD_ZERO(&set);
        FD_SET(rd, &set);
        struct timeval tv = {20, 0};
        r = select(rd + 1, &set, NULL, NULL, &tv);
    } else if (!strcmp(how, "pselect")) {
        fd_set set;
        FD_ZERO(&set);
        FD_SET(rd, &set);
        struct timespec ts = {20, 0};
        r = pselect(rd + 1, &set, NULL, NULL, &ts, NULL);
    } else if (!strcmp(how, "poll")) {
        struct pollfd p = {.fd = rd, .events = POLLIN};
        r = poll(&p, 1, 20000);
    } else if (!strcmp(how, "ppoll")) {
        struct pollfd p = {.fd = rd, .events = POLLIN};
        struct timespec ts = {20, 0};
        r = ppoll(&p, 1, &ts, NULL);
    } else {
        int ep = (int)OK(epoll_create1(0));
        struct epoll_event want = {.events = EPOLLIN, .data.fd = rd}, got;
        OK(epoll_ctl(ep, EPOLL_CTL_ADD, rd, &want));
        r = epoll_wait(ep, &got, 1, 20000);
        close(ep);
    }
    int e = errno;
    int64_t waited = mono_ns() - t0;
    alarm(0);
    CHECK(r == -1 && e == EINTR, "%s: %ld (errno %d), want EINTR from the alarm", how, r, e);
    CHECK_EQ(alarms_seen, 1);
    CHECK(waited < ALARM_WAIT_GUARD_NS, "%s: the child's alarm ended its wait after %ld ms (the timeout is 20 s)",
          how, (long)(waited / 1000000));
}

static void test_child_alarm(int argc, char **argv) {
    int spin = argc > 2 && !strcmp(argv[2], "spin");
    static const char *const hows[] = {"select", "pselect", "poll", "ppoll", "epoll"};
    volatile int *done = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (done == MAP_FAILED) { FAIL("mmap: %s", strerror(errno)); return; }
    for (size_t k = 0; k < sizeof hows / sizeof *hows; k++) {
        int empty[2], up[2];
        OK(pipe(empty));
        OK(pipe(up));
        *done = 0;
        pid_t pid = fork_or_fail();
        if (pid == 0) {
            close(up[0]);
            child_waits(hows[k], empty[0]);
            *done = 1;
            close(up[1]); /* the parent's poll sees EOF */
            child_exit(0);
        }
        close(up[1]);
        int64_t t0 = mono_ns();
        if (spin) { /* the parent keeps the VM busy with no syscalls (vDSO clock): the child's alarm gets it */
            while (!*done && mono_ns() - t0 < 3 * ALARM_WAIT_GUARD_NS) {}
            CHECK(*done, "%s: the child's wait did not end while the parent spun", hows[k]);
            if (!*done) kill(pid, SIGKILL);
            int st = 0;
            CHECK_EQ(OK(waitpid(pid, &st, 0)), pid);
            if (*done) CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: child status 0x%x", hows[k], st);
        } else { /* the parent sleeps in a wait of its own (as subprocess.run's communicate) */
            struct pollfd p = {.fd = up[0], .events = POLLIN};
            CHECK_EQ(poll(&p, 1, 30000), 1);
            expect_exit(pid, 0);
        }
        close(up[0]);
        close(empty[0]);
        close(empty[1]);
        printf("%s %s: %ld ms\n", spin ? "spin" : "sleep", hows[k], (long)((mono_ns() - t0) / 1000000));
    }
    munmap((void *)done, 4096);
}

/* ---- a process stopped in user code resumes where it stopped (issue 15) ----
 * The host stops a run anywhere in user code (its deadline, a kick) without reading the vCPU's
 * registers: the vCPU holds them, the sandbox's copy is its last syscall's. The process must go on
 * from the vCPU, whether it is process 1 kept attached to its executor while a child exists
 * (argv[2] "parent"), a child on the children's executor while process 1 waits ("child"), or
 * process 1 stopped inside a syscall's trap, before the host saw it ("trap"). A process resumed
 * from its last syscall's registers instead runs the code after that syscall again: `passes`
 * counts that. The host raises SIGINT after the stops (as an interrupt does); the handler ends
 * the spin. */
static volatile sig_atomic_t sigints;
static void on_sigint(int sig) { (void)sig; sigints++; }

static void spin_after_last_syscall(const char *who, int trap) {
    static volatile int passes;
    char line[64];
    int n = snprintf(line, sizeof line, "%s spinning\n", who);
    syscall(SYS_write, 1, line, (size_t)n); /* the last syscall before the stops */
    if (++passes != 1) {
        static const char msg[] = "FAIL resumed at its last syscall's registers (stale vCPU reload)\n";
        syscall(SYS_write, 2, msg, sizeof msg - 1);
        _exit(3);
    }
    if (trap) CHECK_EQ(syscall(SYS_getppid), 0); /* the host stops it inside this syscall's trap */
    while (!sigints) {} /* no syscalls: the host's stops land in user code */
}

static void test_stopped_in_user_code(int argc, char **argv) {
    const char *mode = argc > 2 ? argv[2] : "parent";
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint; /* no SA_RESTART: a blocked read fails with EINTR */
    OK(sigaction(SIGINT, &sa, NULL));
    if (!strcmp(mode, "child")) {
        pid_t pid = fork_or_fail();
        if (pid == 0) {
            spin_after_last_syscall("child", 0);
            child_exit(sigints == 1 ? 0 : 4);
        }
        int st = 0;
        pid_t r;
        while ((r = waitpid(pid, &st, 0)) < 0 && errno == EINTR) {} /* SIGINT reaches it too */
        CHECK_EQ(r, pid);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status 0x%x, want exit 0", st);
        return;
    }
    int hold[2];
    OK(pipe(hold));
    pid_t pid = fork_or_fail();
    if (pid == 0) { /* blocked for good: the family lives while process 1 spins */
        char c;
        for (;;) (void)read(hold[0], &c, 1);
    }
    spin_after_last_syscall("parent", !strcmp(mode, "trap"));
    CHECK_EQ(sigints, 1);
    OK(kill(pid, SIGKILL));
    expect_signal(pid, SIGKILL);
}

static const zb_test tests[] = {
    {"leave", test_leave},
    {"fork_wait", test_fork_wait},
    {"killed", test_killed},
    {"pipes", test_pipes},
    {"sigchld", test_sigchld},
    {"wnohang_zombies", test_wnohang_zombies},
    {"groups", test_groups},
    {"vfork", test_vfork},
    {"limit", test_limit},
    {"bomb", test_bomb},
    {"fork_in_thread", test_fork_in_thread},
    {"sigpipe_pdeathsig", test_sigpipe_pdeathsig},
    {"hostile", test_hostile},
    {"child_alarm", test_child_alarm},
    {"stopped_in_user_code", test_stopped_in_user_code},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
