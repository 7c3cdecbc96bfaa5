/* process.c - time, sleeping, entropy, identity, futexes and clone's flag checks (processes:
 * procs.c). */
#include "check.h"

#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>

static int64_t ns_of(const struct timespec *t) { return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec; }

static int64_t clock_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return ns_of(&t);
}

static int64_t mono_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

/* glibc's clock_gettime goes through the vDSO (no exit); the raw syscall is served by the host.
 * Both must agree with each other and with the host's clock (the host side checks the printout). */
static void test_clock(int argc, char **argv) {
    (void)argc;
    (void)argv;
    static const clockid_t clocks[] = {CLOCK_REALTIME, CLOCK_MONOTONIC, CLOCK_BOOTTIME, CLOCK_MONOTONIC_RAW,
                                       CLOCK_REALTIME_COARSE, CLOCK_MONOTONIC_COARSE};
    for (size_t i = 0; i < sizeof clocks / sizeof clocks[0]; i++) {
        struct timespec v, s, v2;
        OK(clock_gettime(clocks[i], &v));
        OK(syscall(SYS_clock_gettime, clocks[i], &s));
        OK(clock_gettime(clocks[i], &v2));
        int64_t d = ns_of(&s) - ns_of(&v);
        CHECK(d > -50000000 && d < 1000000000, "clock %d: vDSO %ld.%09ld, syscall %ld.%09ld", clocks[i], (long)v.tv_sec,
              v.tv_nsec, (long)s.tv_sec, s.tv_nsec);
        CHECK(ns_of(&v2) >= ns_of(&v), "clock %d goes forward", clocks[i]);
        CHECK(v.tv_nsec >= 0 && v.tv_nsec < 1000000000, "tv_nsec %ld", v.tv_nsec);
    }
    struct timespec rt, cpu;
    OK(clock_gettime(CLOCK_REALTIME, &rt));
    struct timeval tv;
    OK(gettimeofday(&tv, NULL));
    CHECK(tv.tv_sec - rt.tv_sec >= 0 && tv.tv_sec - rt.tv_sec <= 1, "gettimeofday %ld vs %ld", (long)tv.tv_sec, (long)rt.tv_sec);
    OK(syscall(SYS_gettimeofday, &tv, NULL));
    CHECK(tv.tv_sec - rt.tv_sec >= 0 && tv.tv_sec - rt.tv_sec <= 1, "gettimeofday syscall");
    time_t t = time(NULL), ts = syscall(SYS_time, NULL);
    CHECK(t - rt.tv_sec >= 0 && t - rt.tv_sec <= 1 && ts - t >= 0 && ts - t <= 1, "time() %ld, syscall %ld", (long)t, (long)ts);
    OK(clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu));
    CHECK(cpu.tv_sec < 60, "process CPU time %ld s", (long)cpu.tv_sec);
    CHECK_ERR(syscall(SYS_clock_gettime, 12345, &rt), EINVAL);
    /* the dynamic CPU clocks of the process and its one thread */
    clockid_t pc, tc;
    CHECK_EQ(clock_getcpuclockid(0, &pc), 0);
    CHECK_EQ(pthread_getcpuclockid(pthread_self(), &tc), 0);
    OK(clock_gettime(pc, &cpu));
    OK(clock_gettime(tc, &cpu));
    OK(clock_getres(tc, &cpu));
    CHECK_ERR(syscall(SYS_clock_gettime, (int)((~42u << 3) | 2), &cpu), EINVAL); /* another pid's clock */
    /* setting clocks is for the host */
    OK(clock_gettime(CLOCK_REALTIME, &rt));
    CHECK_ERR(clock_settime(CLOCK_REALTIME, &rt), EPERM);
    CHECK_ERR(settimeofday(&tv, NULL), EPERM);
    struct timespec res;
    OK(clock_getres(CLOCK_MONOTONIC, &res));
    CHECK(res.tv_sec == 0 && res.tv_nsec > 0 && res.tv_nsec <= 4000000, "resolution %ld", res.tv_nsec);
    /* a tight loop of vDSO reads is monotonic */
    int64_t prev = mono_ns();
    for (int i = 0; i < 100000; i++) {
        int64_t now = mono_ns();
        if (now < prev) { FAIL("CLOCK_MONOTONIC went back by %ld ns", (long)(prev - now)); break; }
        prev = now;
    }
    OK(clock_gettime(CLOCK_REALTIME, &rt));
    printf("realtime %ld.%09ld\n", (long)rt.tv_sec, rt.tv_nsec);
}

/* Waiting is not CPU time (a sleep, a poll's timeout, a futex wait); work is. 900 ms of waits
 * against a 300 ms bound: the calls around them are a few exits, and the guest's CPU clock (its
 * runs' wall time less its waits) counts a descheduled engine, so the bound leaves room for a
 * loaded host; before waits were left out they alone counted 900 ms. */
static void test_cpu_time(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int64_t p0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID), t0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    struct rusage r0, r1;
    OK(getrusage(RUSAGE_SELF, &r0));
    struct timespec req = {0, 300000000};
    OK(nanosleep(&req, NULL));
    CHECK_EQ(poll(NULL, 0, 300), 0);
    int word = 0;
    struct timespec wait = {0, 300000000};
    CHECK_ERR(syscall(SYS_futex, &word, FUTEX_WAIT, 0, &wait, NULL, 0), ETIMEDOUT);
    int64_t waited_cpu = clock_ns(CLOCK_PROCESS_CPUTIME_ID) - p0;
    CHECK(waited_cpu < 300000000, "900 ms of waiting cost %ld ns of process CPU time", (long)waited_cpu);
    CHECK(clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0 < 300000000, "waiting cost thread CPU time");
    OK(getrusage(RUSAGE_SELF, &r1));
    int64_t sys = (r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1000000000ll + (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) * 1000ll;
    CHECK(sys < 300000000, "900 ms of waiting cost %ld ns of system time", (long)sys);
    int64_t busy0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID), w0 = mono_ns();
    volatile uint64_t x = 0;
    while (mono_ns() - w0 < 200000000) x++;
    int64_t busy = clock_ns(CLOCK_PROCESS_CPUTIME_ID) - busy0;
    CHECK(busy > 50000000, "200 ms of work cost only %ld ns of CPU time", (long)busy);
    printf("cpu while waiting %ld, while working %ld\n", (long)waited_cpu, (long)busy);
}

static void test_sleep(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int64_t t0 = mono_ns();
    struct timespec req = {0, 150000000}, rem = {9, 9};
    OK(nanosleep(&req, &rem));
    int64_t slept = mono_ns() - t0;
    CHECK(slept >= 150000000 && slept < 2000000000, "nanosleep(150 ms) slept %ld ns", (long)slept);
    /* clock_nanosleep, relative and absolute */
    t0 = mono_ns();
    struct timespec rel = {0, 50000000};
    CHECK_EQ(clock_nanosleep(CLOCK_MONOTONIC, 0, &rel, NULL), 0);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += 50000000;
    if (until.tv_nsec >= 1000000000) { until.tv_sec++; until.tv_nsec -= 1000000000; }
    CHECK_EQ(clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL), 0);
    CHECK(mono_ns() >= ns_of(&until), "absolute sleep ended early");
    slept = mono_ns() - t0;
    CHECK(slept >= 100000000, "two 50 ms sleeps took %ld ns", (long)slept);
    struct timespec past = {1, 0};
    t0 = mono_ns();
    CHECK_EQ(clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &past, NULL), 0); /* in the past: at once */
    CHECK(mono_ns() - t0 < 100000000, "a sleep until 1970 returns at once");
    /* bad times */
    struct timespec bad = {0, 1000000000};
    CHECK_ERR(nanosleep(&bad, NULL), EINVAL);
    bad.tv_sec = -1;
    bad.tv_nsec = 0;
    CHECK_ERR(nanosleep(&bad, NULL), EINVAL);
    CHECK_EQ(clock_nanosleep(CLOCK_THREAD_CPUTIME_ID, 0, &rel, NULL), EINVAL);
    OK(sched_yield());
    usleep(1000);
    printf("slept %ld\n", (long)slept);
}

static void test_random(int argc, char **argv) {
    (void)argc;
    (void)argv;
    unsigned char a[32], b[32];
    CHECK_EQ(getrandom(a, sizeof a, 0), 32);
    CHECK_EQ(getrandom(b, sizeof b, GRND_NONBLOCK), 32);
    CHECK(memcmp(a, b, sizeof a), "two getrandom calls differ");
    CHECK_ERR(getrandom(a, sizeof a, 0x100), EINVAL);
    CHECK_EQ(getrandom(a, 0, 0), 0);
    int fd = OK(open("/dev/urandom", O_RDONLY));
    CHECK_EQ(read(fd, b, sizeof b), 32);
    CHECK(memcmp(a, b, sizeof a), "/dev/urandom differs");
    close(fd);
    static unsigned char big[1 << 20];
    CHECK_EQ(getrandom(big, sizeof big, 0), (long)sizeof big);
    int zeros = 0;
    for (size_t i = 0; i < sizeof big; i++) zeros += !big[i];
    CHECK(zeros > 2000 && zeros < 6000, "%d zero bytes in 1 MiB of entropy", zeros);
    printf("random ");
    for (size_t i = 0; i < 16; i++) printf("%02x", a[i]);
    printf("\n");
}

/* The guest's identity is fixed (native/sys_process.c): pid 1, uid/gid 1000, host "zeroboot". */
static void test_identity(int argc, char **argv) {
    (void)argc;
    (void)argv;
    CHECK_EQ(getpid(), 1);
    CHECK_EQ(syscall(SYS_gettid), 1);
    CHECK_EQ(getppid(), 0);
    CHECK_EQ(getuid(), 1000);
    CHECK_EQ(geteuid(), 1000);
    CHECK_EQ(getgid(), 1000);
    CHECK_EQ(getegid(), 1000);
    uid_t r, e, s;
    OK(getresuid(&r, &e, &s));
    CHECK(r == 1000 && e == 1000 && s == 1000, "getresuid");
    gid_t groups[8];
    CHECK_EQ(getgroups(8, groups), 1);
    CHECK_EQ(groups[0], 1000);
    CHECK_ERR(setuid(0), EPERM);
    CHECK_ERR(setgid(0), EPERM);
    OK(setuid(1000)); /* becoming who we are is allowed */
    OK(syscall(SYS_setreuid, -1, -1));
    OK(syscall(SYS_setresgid, -1, 1000, -1));
    CHECK_ERR(syscall(SYS_setresuid, -1, 1000, 0), EPERM);
    CHECK_ERR(syscall(SYS_setregid, 0, -1), EPERM);
    CHECK_ERR(setsid(), EPERM);
    struct utsname u;
    OK(uname(&u));
    CHECK_STR(u.sysname, "Linux");
    CHECK_STR(u.nodename, "zeroboot");
    CHECK_STR(u.machine, "x86_64");
    char host[64];
    OK(gethostname(host, sizeof host));
    CHECK_STR(host, "zeroboot");
    printf("release %s\n", u.release);
    /* one CPU, and no other process to ask about */
    cpu_set_t set;
    OK(sched_getaffinity(0, sizeof set, &set));
    OK(sched_getaffinity(1, sizeof set, &set));
    CHECK_ERR(sched_getaffinity(-1, sizeof set, &set), EINVAL);
    CHECK_ERR(sched_getaffinity(2, sizeof set, &set), ESRCH);
    CHECK_ERR(sched_setaffinity(-1, sizeof set, &set), EINVAL);
    CHECK_EQ(sched_getscheduler(0), SCHED_OTHER);
    CHECK_ERR(sched_getscheduler(-1), EINVAL);
    struct sched_param sp;
    CHECK_ERR(sched_getparam(7, &sp), ESRCH);
    CHECK_EQ(CPU_COUNT(&set), 1);
    CHECK_EQ(sysconf(_SC_NPROCESSORS_ONLN), 1);
    /* limits */
    struct rlimit rl;
    OK(getrlimit(RLIMIT_NOFILE, &rl));
    CHECK_EQ(rl.rlim_cur, 1024);
    OK(getrlimit(RLIMIT_STACK, &rl));
    CHECK_EQ(rl.rlim_cur, 8 << 20);
    rl.rlim_cur = 512;
    rl.rlim_max = 1024;
    OK(setrlimit(RLIMIT_NOFILE, &rl)); /* lowering is accepted */
    rl.rlim_cur = rl.rlim_max = 1 << 20;
    CHECK_ERR(setrlimit(RLIMIT_NOFILE, &rl), EPERM);
    CHECK_ERR(prlimit(42, RLIMIT_NOFILE, NULL, &rl), ESRCH);
    struct rusage ru;
    OK(getrusage(RUSAGE_SELF, &ru));
    CHECK(ru.ru_maxrss > 0, "maxrss %ld", ru.ru_maxrss);
    /* no other processes */
    CHECK_ERR(kill(2, 0), ESRCH);
    OK(kill(1, 0));
    CHECK_ERR(waitpid(-1, NULL, 0), ECHILD);
}

static void test_futex(int argc, char **argv) {
    (void)argc;
    (void)argv;
    static uint32_t word = 7;
    /* the value differs: EAGAIN at once */
    CHECK_ERR(syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 8, NULL), EAGAIN);
    /* it matches and nobody can wake us: ETIMEDOUT after the timeout */
    struct timespec to = {0, 80000000};
    int64_t t0 = mono_ns();
    CHECK_ERR(syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 7, &to), ETIMEDOUT);
    int64_t waited = mono_ns() - t0;
    CHECK(waited >= 80000000 && waited < 2000000000, "relative wait took %ld ns", (long)waited);
    /* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC time */
    struct timespec abs;
    clock_gettime(CLOCK_MONOTONIC, &abs);
    abs.tv_nsec += 50000000;
    if (abs.tv_nsec >= 1000000000) { abs.tv_sec++; abs.tv_nsec -= 1000000000; }
    CHECK_ERR(syscall(SYS_futex, &word, FUTEX_WAIT_BITSET_PRIVATE, 7, &abs, NULL, FUTEX_BITSET_MATCH_ANY), ETIMEDOUT);
    CHECK(mono_ns() >= ns_of(&abs), "absolute futex wait ended early");
    CHECK_EQ(syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1), 0); /* nobody waits */
    CHECK_ERR(syscall(SYS_futex, (char *)&word + 1, FUTEX_WAIT_PRIVATE, 7, &to), EINVAL); /* unaligned */
    /* glibc's locks work on top (uncontended, one thread) */
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    OK(pthread_mutex_lock(&m));
    CHECK_EQ(pthread_mutex_trylock(&m), EBUSY);
    OK(pthread_mutex_unlock(&m));
}

static void *thread_main(void *arg) { return arg; }

static void test_clone(int argc, char **argv) {
    (void)argc;
    (void)argv;
    /* a process clone is a fork (procs.c tests them); a thread clone without its flags is EINVAL */
    CHECK_ERR(syscall(SYS_clone, CLONE_THREAD | SIGCHLD, 0, NULL, NULL, 0), EINVAL);
    pthread_t t; /* threads work (threads.c tests them) */
    CHECK_EQ(pthread_create(&t, NULL, thread_main, NULL), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    /* still one working process afterwards */
    CHECK_EQ(getpid(), 1);
    char *p = malloc(1 << 20);
    CHECK(p != NULL, "malloc after failed thread creation");
    free(p);
}

static const zb_test tests[] = {
    {"clock", test_clock},
    {"sleep", test_sleep},
    {"cpu_time", test_cpu_time},
    {"random", test_random},
    {"identity", test_identity},
    {"futex", test_futex},
    {"clone", test_clone},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
