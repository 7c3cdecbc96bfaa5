/* signals.c - signal handlers: signals raised by the host while the guest sleeps or computes,
 * signals the guest sends itself, masks, the alternate stack, and faults the guest handles. */
#include "check.h"

#include <setjmp.h>
#include <signal.h>
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

static const zb_test tests[] = {
    {"sigint_sleep", test_sigint_sleep},
    {"sigint_busy", test_sigint_busy},
    {"sigint_pause", test_sigint_pause},
    {"no_handler", test_no_handler},
    {"self", test_self},
    {"segv_handler", test_segv_handler},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
