/* threads.c - guest threads: pthread create/join (clone3), raw clone with the tid flags, futex
 * (wait/wake, bitsets, timeouts on both clocks, requeue), signals to threads and per-thread masks,
 * preemption of a thread that spins without syscalls, exit_group from a thread, a deadlock, and
 * threads across a snapshot. Each test also passes on Linux (tests/test_guest_threads.py runs them
 * there too).
 */
#include "check.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

static long futex(atomic_uint *addr, int op, unsigned val, const struct timespec *ts, atomic_uint *addr2, unsigned val3) {
    return syscall(SYS_futex, addr, op, val, ts, addr2, val3);
}

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- create and join ---- */

static __thread int tls_value;

static void *square(void *arg) {
    long n = (long)arg;
    tls_value = (int)n; /* each thread has its own TLS (CLONE_SETTLS) */
    double d = (double)n * 1.5; /* and its own SSE state */
    sched_yield();
    if (tls_value != (int)n || d != (double)n * 1.5) return (void *)-1;
    return (void *)(n * n + (long)(syscall(SYS_gettid) > 1 ? 0 : 1000000));
}

static void test_create_join(int argc, char **argv) {
    (void)argc;
    (void)argv;
    enum { N = 16 };
    pthread_t t[N];
    tls_value = -7;
    for (long i = 0; i < N; i++) CHECK_EQ(pthread_create(&t[i], NULL, square, (void *)i), 0);
    for (long i = 0; i < N; i++) {
        void *r;
        CHECK_EQ(pthread_join(t[i], &r), 0);
        CHECK_EQ((long)r, i * i);
    }
    CHECK_EQ(tls_value, -7);
    CHECK_EQ(syscall(SYS_gettid), getpid());
}

/* ---- raw clone (glibc's clone(): SYS_clone) with PARENT_SETTID and CHILD_CLEARTID ---- */

static atomic_uint child_tid, parent_tid, child_ran;

static int clone_child(void *arg) {
    (void)arg;
    atomic_store(&child_ran, (unsigned)syscall(SYS_gettid));
    return 0; /* glibc's clone() then calls SYS_exit: the engine clears child_tid and wakes it */
}

static void test_cleartid(int argc, char **argv) {
    (void)argc;
    (void)argv;
    size_t size = 1 << 16;
    char *stack = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    CHECKM(stack != MAP_FAILED);
    int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM |
                CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID;
    atomic_store(&child_tid, 0xffffffffu);
    int tid = (int)OK(clone(clone_child, stack + size, flags, NULL, &parent_tid, NULL, &child_tid));
    CHECK_EQ(atomic_load(&parent_tid), tid);
    for (;;) { /* what pthread_join does: wait until the kernel clears the tid */
        unsigned v = atomic_load(&child_tid);
        if (v == 0) break;
        long r = futex(&child_tid, FUTEX_WAIT, v, NULL, NULL, 0);
        CHECK(r == 0 || errno == EAGAIN, "futex wait: %s", strerror(errno));
    }
    CHECK_EQ(atomic_load(&child_ran), tid);
    /* argument checks Linux makes before creating anything */
    CHECK_ERR(syscall(SYS_clone, flags | CLONE_NEWNS, stack + size, 0, 0, 0), EINVAL); /* with CLONE_FS */
    uint64_t args[11] = {0};
    CHECK_ERR(syscall(SYS_clone3, args, 32), EINVAL); /* shorter than version 0 */
    CHECK_ERR(syscall(SYS_clone3, (void *)8, sizeof args), EFAULT);
    args[0] = (uint64_t)flags;
    args[4] = SIGCHLD; /* an exit signal for a thread */
    CHECK_ERR(syscall(SYS_clone3, args, sizeof args), EINVAL);
    munmap(stack, size);
}

/* The engine's own refusals (not Linux's: it would create a thread despite a bad tid pointer): a
 * bad tid pointer is EFAULT before any thread exists, a thread without its shared parts EINVAL
 * (a process clone is a fork: procs.c). Not run on the host. */
static void test_refusals(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_PARENT_SETTID;
    CHECK_ERR(syscall(SYS_clone, CLONE_THREAD | CLONE_VM, 0x10000, 0, 0, 0), EINVAL);
    CHECK_ERR(syscall(SYS_clone, flags, 0x10000, (void *)8, 0, 0), EFAULT);
}

/* ---- futex ---- */

static atomic_uint word, word2, woken;

static void *waiter(void *arg) {
    unsigned bitset = (unsigned)(long)arg;
    long r = futex(&word, FUTEX_WAIT_BITSET, 0, NULL, NULL, bitset); /* Linux: shared and private keys differ */
    if (r == 0) atomic_fetch_add(&woken, 1);
    return NULL;
}

/* Until n threads are queued on addr. Linux has no query, but a requeue of a futex onto itself
 * moves nothing and returns how many waiters it found: the count, without timing luck. */
static void wait_until_waiting(atomic_uint *addr, int n) {
    while (syscall(SYS_futex, addr, FUTEX_CMP_REQUEUE, 0, INT32_MAX, addr, atomic_load(addr)) < n) sched_yield();
}

static void test_futex(int argc, char **argv) {
    (void)argc;
    (void)argv;
    atomic_store(&word, 5);
    /* value mismatch: EAGAIN at once */
    CHECK_ERR(futex(&word, FUTEX_WAIT, 4, NULL, NULL, 0), EAGAIN);
    /* relative timeout */
    struct timespec rel = {0, 30 * 1000000};
    int64_t t0 = mono_ns();
    CHECK_ERR(futex(&word, FUTEX_WAIT_PRIVATE, 5, &rel, NULL, 0), ETIMEDOUT);
    CHECK(mono_ns() - t0 >= 30 * 1000000, "timed out early: %lld ns", (long long)(mono_ns() - t0));
    /* absolute timeouts, CLOCK_MONOTONIC and CLOCK_REALTIME */
    struct timespec abs;
    clock_gettime(CLOCK_MONOTONIC, &abs);
    abs.tv_nsec += 20 * 1000000;
    if (abs.tv_nsec >= 1000000000) { abs.tv_sec++; abs.tv_nsec -= 1000000000; }
    CHECK_ERR(futex(&word, FUTEX_WAIT_BITSET, 5, &abs, NULL, FUTEX_BITSET_MATCH_ANY), ETIMEDOUT);
    clock_gettime(CLOCK_REALTIME, &abs);
    abs.tv_nsec += 20 * 1000000;
    if (abs.tv_nsec >= 1000000000) { abs.tv_sec++; abs.tv_nsec -= 1000000000; }
    CHECK_ERR(futex(&word, FUTEX_WAIT_BITSET | FUTEX_CLOCK_REALTIME, 5, &abs, NULL, FUTEX_BITSET_MATCH_ANY), ETIMEDOUT);
    /* a past absolute time, bad arguments */
    abs.tv_sec = 1;
    abs.tv_nsec = 0;
    CHECK_ERR(futex(&word, FUTEX_WAIT_BITSET, 5, &abs, NULL, FUTEX_BITSET_MATCH_ANY), ETIMEDOUT);
    CHECK_ERR(futex(&word, FUTEX_WAIT_BITSET, 5, NULL, NULL, 0), EINVAL);
    rel.tv_nsec = 1000000000;
    CHECK_ERR(futex(&word, FUTEX_WAIT, 5, &rel, NULL, 0), EINVAL);
    CHECK_ERR(syscall(SYS_futex, (char *)&word + 1, FUTEX_WAKE, 1, NULL, NULL, 0), EINVAL);
    CHECK_ERR(syscall(SYS_futex, (void *)8, FUTEX_WAKE, 1, NULL, NULL, 0), EFAULT);
    CHECK_ERR(futex(&word, FUTEX_WAKE | FUTEX_CLOCK_REALTIME, 1, NULL, NULL, 0), ENOSYS);
    CHECK_EQ(futex(&word, FUTEX_WAKE, 10, NULL, NULL, 0), 0); /* nobody waits */

    /* wake counts and bitsets: 3 waiters with bit 1, 2 with bit 2 */
    atomic_store(&word, 0);
    pthread_t t[5];
    for (int i = 0; i < 5; i++) CHECK_EQ(pthread_create(&t[i], NULL, waiter, (void *)(long)(i < 3 ? 1 : 2)), 0);
    wait_until_waiting(&word, 5);
    CHECK_EQ(futex(&word, FUTEX_WAKE_BITSET, 1, NULL, NULL, 2), 1);
    CHECK_EQ(futex(&word, FUTEX_WAKE_BITSET, 10, NULL, NULL, 1), 3);
    CHECK_EQ(futex(&word, FUTEX_WAKE, 10, NULL, NULL, 0), 1);
    for (int i = 0; i < 5; i++) CHECK_EQ(pthread_join(t[i], NULL), 0);
    CHECK_EQ(atomic_load(&woken), 5);

    /* requeue: 4 waiters on word; wake 1, move 2 to word2, the last stays */
    atomic_store(&woken, 0);
    pthread_t r[4];
    for (int i = 0; i < 4; i++) CHECK_EQ(pthread_create(&r[i], NULL, waiter, (void *)(long)FUTEX_BITSET_MATCH_ANY), 0);
    wait_until_waiting(&word, 4);
    CHECK_ERR(syscall(SYS_futex, &word, FUTEX_CMP_REQUEUE, 1, 2, &word2, 99), EAGAIN);
    CHECK_EQ(syscall(SYS_futex, &word, FUTEX_CMP_REQUEUE, 1, 2, &word2, 0), 3);
    CHECK_EQ(futex(&word2, FUTEX_WAKE, 10, NULL, NULL, 0), 2);
    CHECK_EQ(syscall(SYS_futex, &word, FUTEX_REQUEUE, 0, 5, &word2, 0), 1);
    CHECK_EQ(futex(&word2, FUTEX_WAKE, 10, NULL, NULL, 0), 1);
    for (int i = 0; i < 4; i++) CHECK_EQ(pthread_join(r[i], NULL), 0);
    CHECK_EQ(atomic_load(&woken), 4);

    /* wake_op: word2 = 7 (SET), wake word's waiters, and word2's if old value == 0 */
    atomic_store(&word2, 0);
    CHECK_EQ(syscall(SYS_futex, &word, FUTEX_WAKE_OP, 1, 1, &word2, FUTEX_OP(FUTEX_OP_SET, 7, FUTEX_OP_CMP_EQ, 0)), 0);
    CHECK_EQ(atomic_load(&word2), 7);
}

/* ---- signals to threads ---- */

static atomic_long handled_by[65];
static void record(int sig) { atomic_store(&handled_by[sig], syscall(SYS_gettid)); }

static atomic_uint go;
static atomic_long worker_tid;

static void *sig_worker(void *arg) {
    (void)arg;
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &block, NULL); /* this thread never takes SIGUSR2 */
    atomic_store(&worker_tid, syscall(SYS_gettid));
    while (!atomic_load(&go)) {
        long r = futex(&go, FUTEX_WAIT, 0, NULL, NULL, 0); /* tgkill interrupts: EINTR */
        if (r < 0 && errno != EINTR && errno != EAGAIN) return (void *)1;
    }
    return NULL;
}

static void test_signals(int argc, char **argv) {
    (void)argc;
    (void)argv;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = record;
    OK(sigaction(SIGUSR1, &sa, NULL));
    OK(sigaction(SIGUSR2, &sa, NULL));
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, sig_worker, NULL), 0);
    while (!atomic_load(&worker_tid)) sched_yield();
    wait_until_waiting(&go, 1);
    long wt = atomic_load(&worker_tid);
    /* to the thread: its handler runs on it, interrupting its futex wait */
    OK(syscall(SYS_tgkill, getpid(), wt, SIGUSR1));
    /* the handler runs when the worker is next scheduled: on a loaded host that takes a while */
    for (int64_t until = mono_ns() + 20 * 1000000000LL; !atomic_load(&handled_by[SIGUSR1]) && mono_ns() < until;)
        sched_yield();
    CHECK_EQ(atomic_load(&handled_by[SIGUSR1]), wt);
    /* to the process: the main thread (which does not block it) takes it */
    OK(kill(getpid(), SIGUSR2));
    CHECK_EQ(atomic_load(&handled_by[SIGUSR2]), getpid());
    CHECK_ERR(syscall(SYS_tgkill, getpid(), 999999, SIGUSR1), ESRCH);
    CHECK_ERR(syscall(SYS_tgkill, 12345, wt, SIGUSR1), ESRCH);
    CHECK_ERR(syscall(SYS_tgkill, getpid(), wt, 65), EINVAL);
    CHECK_EQ(syscall(SYS_tgkill, getpid(), wt, 0), 0);
    atomic_store(&go, 1);
    futex(&go, FUTEX_WAKE, 1, NULL, NULL, 0);
    void *r;
    CHECK_EQ(pthread_join(t, &r), 0);
    CHECK_EQ((long)r, 0);
    /* the CPUs exposed, consistently (one in the sandbox) */
    cpu_set_t set;
    CHECK_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    CHECK_EQ(CPU_COUNT(&set), sysconf(_SC_NPROCESSORS_ONLN));
}

/* ---- preemption: a thread spinning without syscalls does not starve the others ---- */

static atomic_uint stop_spinning, spinner_started;

static void *spinner(void *arg) {
    (void)arg;
    atomic_store(&spinner_started, 1);
    unsigned long n = 0;
    while (!atomic_load_explicit(&stop_spinning, memory_order_relaxed)) n++;
    return (void *)n;
}

static void test_preempt(int argc, char **argv) {
    (void)argc;
    (void)argv;
    pthread_t t[2];
    for (int i = 0; i < 2; i++) CHECK_EQ(pthread_create(&t[i], NULL, spinner, NULL), 0);
    while (!atomic_load(&spinner_started)) sched_yield();
    /* main sleeps 50 ms, then must get the CPU back from the spinners to stop them */
    struct timespec ts = {0, 50 * 1000000};
    OK(nanosleep(&ts, NULL));
    atomic_store(&stop_spinning, 1);
    for (int i = 0; i < 2; i++) {
        void *r;
        CHECK_EQ(pthread_join(t[i], &r), 0);
        CHECK((long)r > 0, "a spinner never ran");
    }
}

/* ---- exit_group from a thread ends every thread ---- */

static void *exiter(void *arg) {
    (void)arg;
    printf("PASS exit_group\n"); /* the program's status is the test */
    fflush(stdout);
    syscall(SYS_exit_group, 0);
    return NULL;
}

static void test_exit_group(int argc, char **argv) {
    (void)argc;
    (void)argv;
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, exiter, NULL), 0);
    atomic_uint never = 0;
    futex(&never, FUTEX_WAIT, 0, NULL, NULL, 0); /* blocks forever: the exit_group ends it */
    FAIL("main thread woke");
    exit(1);
}

/* ---- every thread waits forever: the run's deadline still stops it ---- */

static void *blocker(void *arg) {
    atomic_uint *w = arg;
    futex(w, FUTEX_WAIT, 0, NULL, NULL, 0);
    return NULL;
}

static void test_deadlock(int argc, char **argv) {
    (void)argc;
    (void)argv;
    static atomic_uint w = 0;
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, blocker, &w), 0);
    printf("blocking\n");
    fflush(stdout);
    pthread_join(t, NULL); /* never returns: the host's deadline ends the run */
}

/* ---- threads across a snapshot: two workers wait in futex, one sleeps in a timed wait ---- */

static atomic_uint release;
static __thread double thread_fp;

static void *snap_worker(void *arg) {
    long id = (long)arg;
    thread_fp = 0.25 * (double)id; /* the XSAVE image of a waiting thread must survive */
    tls_value = (int)id * 11;
    while (!atomic_load(&release)) futex(&release, FUTEX_WAIT, 0, NULL, NULL, 0);
    double check = thread_fp * 4.0;
    return (void *)(long)((long)check * 100 + tls_value);
}

static void test_snapshot_state(int argc, char **argv) {
    (void)argc;
    (void)argv;
    pthread_t t[3];
    for (long i = 0; i < 3; i++) CHECK_EQ(pthread_create(&t[i], NULL, snap_worker, (void *)(i + 1)), 0);
    wait_until_waiting(&release, 3);
    int tty = (int)OK(open("/dev/ttyS0", O_RDWR));
    printf("ready\n");
    fflush(stdout);
    char buf[8];
    OK(read(tty, buf, sizeof buf)); /* the host snapshots here */
    atomic_store(&release, 1);
    CHECK_EQ(futex(&release, FUTEX_WAKE, 10, NULL, NULL, 0), 3);
    for (long i = 0; i < 3; i++) {
        void *r;
        CHECK_EQ(pthread_join(t[i], &r), 0);
        CHECK_EQ((long)r, (i + 1) * 100 + (i + 1) * 11);
    }
}

/* ---- the thread limit: argv[2] threads alive at most (main included), EAGAIN past it ---- */

static void test_limit(int argc, char **argv) {
    int limit = argc > 2 ? atoi(argv[2]) : 0;
    static atomic_uint hold = 0;
    pthread_t t[64];
    int made = 0;
    while (made < 64 && pthread_create(&t[made], NULL, blocker, &hold) == 0) made++;
    CHECK_EQ(made, limit - 1);
    CHECK_EQ(pthread_create(&t[63], NULL, blocker, &hold), EAGAIN);
    atomic_store(&hold, 1);
    futex(&hold, FUTEX_WAKE, 64, NULL, NULL, 0);
    for (int i = 0; i < made; i++) CHECK_EQ(pthread_join(t[i], NULL), 0);
    CHECK_EQ(pthread_create(&t[0], NULL, blocker, &hold), 0); /* room again once they ended */
    CHECK_EQ(pthread_join(t[0], NULL), 0);
}

static const zb_test tests[] = {
    {"limit", test_limit},
    {"create_join", test_create_join},
    {"cleartid", test_cleartid},
    {"refusals", test_refusals},
    {"futex", test_futex},
    {"signals", test_signals},
    {"preempt", test_preempt},
    {"exit_group", test_exit_group},
    {"deadlock", test_deadlock},
    {"snapshot_state", test_snapshot_state},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
