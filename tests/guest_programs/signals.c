/* signals.c - signal handlers: signals raised by the host while the guest sleeps or computes,
 * signals the guest sends itself, masks, the alternate stack, and faults the guest handles. */
#include "check.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>

static volatile sig_atomic_t got_sig, got_count;
static volatile uintptr_t handler_sp;

static void on_signal(int sig) {
    char here;
    got_sig = sig;
    got_count++;
    handler_sp = (uintptr_t)&here;
}

static void install(int sig, int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    OK(sigaction(sig, &sa, NULL));
}

/* The host raises SIGINT while we sleep: the handler runs, nanosleep fails with EINTR and says
 * how much was left, and the program goes on. */
static void test_sigint_sleep(int argc, char **argv) {
    (void)argc;
    (void)argv;
    install(SIGINT, 0);
    fprintf(stderr, "sleeping\n");
    struct timespec req = {20, 0}, rem = {0, 0};
    errno = 0;
    int r = nanosleep(&req, &rem);
    int e = errno;
    CHECK(r == -1 && e == EINTR, "nanosleep returned %d errno %d", r, e);
    CHECK_EQ(got_sig, SIGINT);
    CHECK_EQ(got_count, 1);
    CHECK(rem.tv_sec > 0 && rem.tv_sec <= 20, "remaining %ld.%09ld s", (long)rem.tv_sec, rem.tv_nsec);
    /* the program continues: syscalls and short sleeps work */
    struct timespec shortreq = {0, 10000000};
    OK(nanosleep(&shortreq, NULL));
    printf("interrupted with %ld s left\n", (long)rem.tv_sec);
}

/* The host raises SIGINT while we compute (no syscall in flight). */
static void test_sigint_busy(int argc, char **argv) {
    (void)argc;
    (void)argv;
    install(SIGINT, SA_RESTART);
    fprintf(stderr, "looping\n");
    volatile uint64_t spins = 0;
    while (!got_sig) spins++;
    CHECK_EQ(got_sig, SIGINT);
    CHECK(spins > 0, "spins");
    printf("handler ran after %lu spins\n", (unsigned long)spins);
}

/* Wait for any signal (sigsuspend / pause): the host's SIGINT ends the wait. */
static void test_sigint_pause(int argc, char **argv) {
    (void)argc;
    (void)argv;
    install(SIGINT, 0);
    fprintf(stderr, "pausing\n");
    CHECK_ERR(pause(), EINTR);
    CHECK_EQ(got_sig, SIGINT);
}

/* Sleep with no handler installed: the host cannot raise SIGINT (it would kill us). */
static void test_no_handler(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "sleeping\n");
    struct timespec req = {0, 300000000};
    OK(nanosleep(&req, NULL));
}

static sigjmp_buf jump;
static volatile void *fault_addr;
static void on_segv(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    got_sig = sig;
    fault_addr = si->si_addr;
    siglongjmp(jump, 1);
}

static void test_self(int argc, char **argv) {
    (void)argc;
    (void)argv;
    /* raise() runs the handler before it returns */
    install(SIGUSR1, 0);
    OK(raise(SIGUSR1));
    CHECK_EQ(got_sig, SIGUSR1);
    CHECK_EQ(got_count, 1);
    /* a blocked signal stays pending until it is unblocked */
    sigset_t set, old, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    OK(sigprocmask(SIG_BLOCK, &set, &old));
    OK(kill(getpid(), SIGUSR1));
    CHECK_EQ(got_count, 1);
    OK(sigpending(&pending));
    CHECK(sigismember(&pending, SIGUSR1), "SIGUSR1 pending");
    OK(sigprocmask(SIG_SETMASK, &old, NULL));
    CHECK_EQ(got_count, 2);
    OK(sigpending(&pending));
    CHECK(!sigismember(&pending, SIGUSR1), "SIGUSR1 delivered");
    /* ignored signals and default-ignored ones do nothing */
    signal(SIGUSR2, SIG_IGN);
    OK(raise(SIGUSR2));
    OK(raise(SIGCHLD));
    OK(raise(SIGWINCH));
    /* the old action comes back from sigaction */
    struct sigaction sa;
    OK(sigaction(SIGUSR1, NULL, &sa));
    CHECK(sa.sa_handler == on_signal, "old handler");
    CHECK_ERR(sigaction(SIGKILL, &sa, NULL), EINVAL);
    CHECK_ERR(sigaction(65, &sa, NULL), EINVAL);
    /* a handler on the alternate stack */
    static char alt[65536];
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0};
    OK(sigaltstack(&ss, NULL));
    install(SIGUSR1, SA_ONSTACK);
    OK(raise(SIGUSR1));
    CHECK(handler_sp >= (uintptr_t)alt && handler_sp < (uintptr_t)alt + sizeof alt, "handler stack %p, alt stack %p",
          (void *)handler_sp, (void *)alt);
    stack_t cur;
    OK(sigaltstack(NULL, &cur));
    CHECK(cur.ss_sp == alt && cur.ss_size == sizeof alt, "sigaltstack read back");
    ss.ss_size = 100;
    CHECK_ERR(sigaltstack(&ss, NULL), ENOMEM);
    /* SA_RESETHAND: once */
    install(SIGUSR1, SA_RESETHAND);
    OK(raise(SIGUSR1));
    OK(sigaction(SIGUSR1, NULL, &sa));
    CHECK(sa.sa_handler == SIG_DFL, "SA_RESETHAND resets the handler");
    /* floating point and vector registers survive a handler */
    volatile double x = 1.5;
    OK(raise(SIGCHLD));
    install(SIGUSR2, 0);
    double y = x * 3.0;
    OK(raise(SIGUSR2));
    CHECK(y == 4.5 && x * 2 == 3.0, "FPU state around a handler");
}

/* A fault the guest handles itself (as faulthandler does): the handler runs and jumps back. */
static void test_segv_handler(int argc, char **argv) {
    (void)argc;
    (void)argv;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    OK(sigaction(SIGSEGV, &sa, NULL));
    OK(sigaction(SIGFPE, &sa, NULL));
    if (!sigsetjmp(jump, 1)) {
        *(volatile int *)0x10 = 1;
        FAIL("the write to 0x10 went through");
    }
    CHECK_EQ(got_sig, SIGSEGV);
    got_sig = 0;
    if (!sigsetjmp(jump, 1)) {
        volatile int zero = 0, v = 1;
        v /= zero;
        FAIL("the division went through");
    }
    CHECK_EQ(got_sig, SIGFPE);
    printf("fault address %p\n", (void *)fault_addr);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* alarm(): the handler interrupts a sleep after the alarm's time; alarm() reports the seconds left
 * on the previous alarm; alarm(0) disarms. */
static void test_alarm_sleep(int argc, char **argv) {
    (void)argc;
    (void)argv;
    install(SIGALRM, 0);
    CHECK_EQ(alarm(30), 0u);
    CHECK_EQ(alarm(1), 30u);            /* 30 s left, rounded */
    int64_t t0 = now_ns();
    struct timespec req = {10, 0}, rem = {0, 0};
    CHECK_ERR(nanosleep(&req, &rem), EINTR);
    int64_t waited = now_ns() - t0;
    CHECK_EQ(got_sig, SIGALRM);
    CHECK(waited >= 950000000 && waited < 3000000000, "woke after %ld ns", (long)waited);
    CHECK(rem.tv_sec >= 7 && rem.tv_sec <= 9, "remaining %ld s", (long)rem.tv_sec);
    CHECK_EQ(alarm(0), 0u);             /* it went off: nothing left */
    alarm(5);
    CHECK_EQ(alarm(0), 5u);
    struct itimerval cur;
    OK(getitimer(ITIMER_REAL, &cur));
    CHECK(cur.it_value.tv_sec == 0 && cur.it_value.tv_usec == 0, "disarmed timer reads %ld.%06ld",
          (long)cur.it_value.tv_sec, (long)cur.it_value.tv_usec);
    printf("alarm after %ld ms\n", (long)(waited / 1000000));
}

/* sigwait/sigtimedwait take a blocked pending signal without its handler; a zero or short timeout
 * gives EAGAIN; the alarm ends a wait for SIGALRM; an unblocked handled signal ends it with EINTR;
 * bad arguments fail as in Linux. */
static void test_sigtimedwait(int argc, char **argv) {
    (void)argc;
    (void)argv;
    install(SIGUSR1, 0);
    install(SIGALRM, 0);
    install(SIGUSR2, 0);
    got_sig = 0;
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGALRM);
    OK(sigprocmask(SIG_BLOCK, &set, &old));
    OK(kill(getpid(), SIGUSR1));
    int sig = 0;
    CHECK_EQ(sigwait(&set, &sig), 0);
    CHECK_EQ(sig, SIGUSR1);
    CHECK_EQ(got_sig, 0);               /* taken, not handled */
    struct timespec zero = {0, 0}, short_wait = {0, 50000000};
    siginfo_t info;
    CHECK_ERR(sigtimedwait(&set, &info, &zero), EAGAIN);
    int64_t t0 = now_ns();
    CHECK_ERR(sigtimedwait(&set, &info, &short_wait), EAGAIN);
    CHECK(now_ns() - t0 >= 45000000, "a 50 ms wait took %ld ns", (long)(now_ns() - t0));
    CHECK_EQ(alarm(1), 0u);
    memset(&info, 0xff, sizeof info);
    CHECK_EQ(sigwaitinfo(&set, &info), SIGALRM);
    CHECK_EQ(info.si_signo, SIGALRM);
    CHECK_EQ(info.si_code, 0);
    CHECK_EQ(got_sig, 0);
    /* a wait that an unblocked handled signal ends: the alarm's SIGALRM, unblocked now */
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    OK(sigprocmask(SIG_UNBLOCK, &set, NULL));
    OK(sigprocmask(SIG_BLOCK, &usr1, NULL));
    CHECK_EQ(alarm(1), 0u);
    CHECK_ERR(sigwaitinfo(&usr1, &info), EINTR);
    CHECK_EQ(got_sig, SIGALRM);
    CHECK_ERR(syscall(SYS_rt_sigtimedwait, &set, NULL, NULL, 4), EINVAL);
    CHECK_ERR(syscall(SYS_rt_sigtimedwait, (void *)8, NULL, NULL, 8), EFAULT);
    CHECK_ERR(syscall(SYS_rt_sigtimedwait, &set, (void *)8, &zero, 8), EFAULT);
    struct timespec bad = {0, 1000000000};
    CHECK_ERR(syscall(SYS_rt_sigtimedwait, &set, NULL, &bad, 8), EINVAL);
    OK(sigprocmask(SIG_SETMASK, &old, NULL));
    /* in a child process, while its parent waits for it: the alarm still ends the wait */
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        sigset_t alrm;
        sigemptyset(&alrm);
        sigaddset(&alrm, SIGALRM);
        sigprocmask(SIG_BLOCK, &alrm, NULL);
        alarm(1);
        int got = 0;
        _exit(sigwait(&alrm, &got) == 0 && got == SIGALRM && got_sig == SIGALRM /* from before */ ? 0 : 1);
    }
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
}

/* A periodic ITIMER_REAL interrupts a computation that makes no syscalls, again and again. */
static void test_itimer_busy(int argc, char **argv) {
    (void)argc;
    (void)argv;
    install(SIGALRM, SA_RESTART);
    struct itimerval tv = {{0, 50000}, {0, 50000}}, old, cur;
    OK(setitimer(ITIMER_REAL, &tv, &old));
    CHECK(old.it_value.tv_sec == 0 && old.it_value.tv_usec == 0, "no previous timer");
    OK(getitimer(ITIMER_REAL, &cur));
    CHECK(cur.it_interval.tv_usec == 50000 && cur.it_value.tv_sec == 0 && cur.it_value.tv_usec <= 50000,
          "getitimer: value %ld.%06ld interval %ld", (long)cur.it_value.tv_sec, (long)cur.it_value.tv_usec,
          (long)cur.it_interval.tv_usec);
    int64_t t0 = now_ns();
    volatile uint64_t spins = 0;
    while (got_count < 4 && now_ns() - t0 < 5000000000) spins++;
    int64_t took = now_ns() - t0;
    struct itimerval off = {{0, 0}, {0, 0}};
    OK(setitimer(ITIMER_REAL, &off, NULL));
    CHECK(got_count >= 4, "%d SIGALRMs in %ld ms", (int)got_count, (long)(took / 1000000));
    CHECK(took >= 150000000, "4 periods of 50 ms took %ld ms", (long)(took / 1000000));
    printf("%d alarms in %ld ms\n", (int)got_count, (long)(took / 1000000));
}

/* SIGALRM with the default action ends the program, as on Linux; an ignored one does nothing. */
static void test_alarm_default(int argc, char **argv) {
    (void)argv;
    if (argc > 2) { /* "ignored" */
        signal(SIGALRM, SIG_IGN);
        struct itimerval tv = {{0, 0}, {0, 100000}};
        OK(setitimer(ITIMER_REAL, &tv, NULL));
        struct timespec req = {0, 300000000};
        OK(nanosleep(&req, NULL));  /* not interrupted */
        return;
    }
    alarm(1);
    pause();
    FAIL("pause() returned after SIGALRM with the default action");
}

static long usec_of(const struct timeval *tv) { return (long)tv->tv_sec * 1000000 + (long)tv->tv_usec; }

/* ITIMER_VIRTUAL and ITIMER_PROF count the process's CPU time: they fire in a busy loop, never while
 * it sleeps; getitimer counts down; a fork's child has none; bad arguments fail. The first expiry
 * is 1 s away, far beyond what the few calls before the busy loop can cost on a loaded host (the
 * guest's CPU clock is its runs' wall time less its waits: a descheduled engine counts). */
static void test_itimer_cpu(int argc, char **argv) {
    (void)argc;
    (void)argv;
    install(SIGVTALRM, SA_RESTART);
    install(SIGPROF, SA_RESTART);
    struct itimerval tv = {{0, 20000}, {1, 0}}, off = {{0, 0}, {0, 0}}, cur, old;
    OK(setitimer(ITIMER_VIRTUAL, &tv, &old));
    CHECK(usec_of(&old.it_value) == 0, "no previous ITIMER_VIRTUAL");
    OK(getitimer(ITIMER_VIRTUAL, &cur));
    CHECK(usec_of(&cur.it_interval) == 20000 && usec_of(&cur.it_value) > 0 && usec_of(&cur.it_value) <= 1050000, /* Linux rounds up to its tick */
          "getitimer(ITIMER_VIRTUAL): value %ld interval %ld us", usec_of(&cur.it_value), usec_of(&cur.it_interval));
    pid_t pid = fork();
    if (pid == 0) { /* the child starts without timers */
        struct itimerval c;
        _exit(getitimer(ITIMER_VIRTUAL, &c) == 0 && usec_of(&c.it_value) == 0 ? 0 : 1);
    }
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child had an ITIMER_VIRTUAL (status %d)", status);
    struct timespec req = {0, 200000000};
    OK(nanosleep(&req, NULL));
    CHECK_EQ(got_count, 0); /* 200 ms asleep: no CPU time */
    OK(getitimer(ITIMER_VIRTUAL, &cur));
    CHECK(usec_of(&cur.it_value) > 500000, "a sleep used up the timer: %ld us left", usec_of(&cur.it_value));
    int64_t t0 = now_ns();
    volatile uint64_t spins = 0;
    while (got_count < 3 && now_ns() - t0 < 30000000000) spins++; /* ~1.04 s of CPU time */
    CHECK(got_count >= 3 && got_sig == SIGVTALRM, "%d signals (last %d) in a busy loop", (int)got_count, (int)got_sig);
    OK(setitimer(ITIMER_VIRTUAL, &off, &old));
    CHECK(usec_of(&old.it_interval) == 20000, "the old interval: %ld us", usec_of(&old.it_interval));
    got_count = 0;
    struct itimerval once = {{0, 0}, {0, 30000}};
    OK(setitimer(ITIMER_PROF, &once, NULL));
    t0 = now_ns();
    while (got_count < 1 && now_ns() - t0 < 30000000000) spins++;
    CHECK(got_count == 1 && got_sig == SIGPROF, "%d signals (last %d) for a one-shot ITIMER_PROF", (int)got_count, (int)got_sig);
    OK(getitimer(ITIMER_PROF, &cur));
    CHECK(usec_of(&cur.it_value) == 0, "a one-shot timer that fired reads %ld us", usec_of(&cur.it_value));
    CHECK_ERR(syscall(SYS_setitimer, 7, &tv, NULL), EINVAL);
    struct itimerval bad = {{0, 0}, {0, 1000000}};
    CHECK_ERR(setitimer(ITIMER_REAL, &bad, NULL), EINVAL);
    CHECK_ERR(setitimer(ITIMER_PROF, &bad, NULL), EINVAL);
    CHECK_ERR(syscall(SYS_setitimer, ITIMER_REAL, (void *)8, NULL), EFAULT);
    CHECK_ERR(syscall(SYS_getitimer, ITIMER_REAL, (void *)8), EFAULT);
    CHECK_ERR(syscall(SYS_getitimer, ITIMER_VIRTUAL, (void *)8), EFAULT);
    printf("CPU timers fired in a busy loop, not in a sleep\n");
}

/* Every register of the interrupted code, all 64 bits, and its flags survive signal delivery and
 * rt_sigreturn: a loop holds patterns (bits 31 and 63 set) in the caller-saved registers and CF
 * while a 2 ms timer interrupts it, and checks them after every stretch of spinning. */
static void test_regs_survive_signals(int argc, char **argv) {
    (void)argc;
    (void)argv;
    install(SIGALRM, 0);
    struct itimerval tv = {{0, 2000}, {0, 2000}};
    OK(setitimer(ITIMER_REAL, &tv, NULL));
    uint64_t bad = 0, rounds = 0;
    int64_t t0 = now_ns();
    while (got_count < 40 && now_ns() - t0 < 10000000000) {
        rounds++;
        __asm__ volatile(
            "movabs $0x8000000180000001, %%rax\n\t"
            "movabs $0x8000000280000002, %%rdx\n\t"
            "movabs $0x8000000380000003, %%rsi\n\t"
            "movabs $0x8000000480000004, %%rdi\n\t"
            "movabs $0x8000000580000005, %%r8\n\t"
            "movabs $0x8000000680000006, %%r9\n\t"
            "movabs $0x8000000780000007, %%r10\n\t"
            "movabs $0x8000000880000008, %%r11\n\t"
            "mov $200000, %%ecx\n\t"
            "stc\n\t"
            "1: dec %%ecx\n\t"          /* dec leaves CF alone */
            "jnz 1b\n\t"
            "jnc 3f\n\t"
            "movabs $0x8000000180000001, %%rcx\n\t cmp %%rcx, %%rax\n\t jne 3f\n\t"
            "movabs $0x8000000280000002, %%rcx\n\t cmp %%rcx, %%rdx\n\t jne 3f\n\t"
            "movabs $0x8000000380000003, %%rcx\n\t cmp %%rcx, %%rsi\n\t jne 3f\n\t"
            "movabs $0x8000000480000004, %%rcx\n\t cmp %%rcx, %%rdi\n\t jne 3f\n\t"
            "movabs $0x8000000580000005, %%rcx\n\t cmp %%rcx, %%r8\n\t jne 3f\n\t"
            "movabs $0x8000000680000006, %%rcx\n\t cmp %%rcx, %%r9\n\t jne 3f\n\t"
            "movabs $0x8000000780000007, %%rcx\n\t cmp %%rcx, %%r10\n\t jne 3f\n\t"
            "movabs $0x8000000880000008, %%rcx\n\t cmp %%rcx, %%r11\n\t jne 3f\n\t"
            "jmp 4f\n\t"
            "3: incq %[bad]\n\t"
            "4:\n\t"
            : [bad] "+m"(bad)
            :
            : "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "cc", "memory");
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    OK(setitimer(ITIMER_REAL, &off, NULL));
    CHECK(got_count >= 40, "only %d signals", (int)got_count);
    CHECK(bad == 0, "%lu of %lu rounds saw a clobbered register or flag", (unsigned long)bad, (unsigned long)rounds);
    printf("%d signals over %lu rounds\n", (int)got_count, (unsigned long)rounds);
}

/* The host stops the guest many times while it reads the clock (test_guest_process.py raises SIGINT
 * each time, and every resume rewrites the vDSO's data page): the clock never jumps or goes back. */
static void test_clock_across_stops(int argc, char **argv) {
    (void)argc;
    (void)argv;
    install(SIGINT, 0);
    fprintf(stderr, "reading the clock\n");
    int64_t prev = now_ns(), start = prev, worst = 0;
    while (got_count < 10 && prev - start < 20000000000) {
        int64_t t = now_ns();
        if (t < prev || t - prev > 1000000000) worst = t - prev;
        prev = t;
    }
    CHECK(got_count >= 10, "only %d signals", (int)got_count);
    CHECK(worst == 0, "the clock moved by %ld ns between two reads", (long)worst);
}

static const zb_test tests[] = {
    {"sigint_sleep", test_sigint_sleep},
    {"sigint_busy", test_sigint_busy},
    {"sigint_pause", test_sigint_pause},
    {"no_handler", test_no_handler},
    {"self", test_self},
    {"segv_handler", test_segv_handler},
    {"alarm_sleep", test_alarm_sleep},
    {"sigtimedwait", test_sigtimedwait},
    {"itimer_busy", test_itimer_busy},
    {"alarm_default", test_alarm_default},
    {"itimer_cpu", test_itimer_cpu},
    {"regs_survive_signals", test_regs_survive_signals},
    {"clock_across_stops", test_clock_across_stops},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
