/* membudget.c - the memory budget of a sandbox's processes (issue 15): all processes of one
 * sandbox share its one memory limit, each charged with every page it could own privately on the
 * host (tests/test_guest_membudget.py drives these and measures the host side).
 *
 *   children N M   fork N children that each map and rewrite M MiB; each reports on a pipe whether
 *                  its mmap succeeded; the parent prints "holding OK REFUSED" and waits for a line
 *                  of input (the host measures its memory then) while every child still holds
 *                  its memory, then lets them go, reaps them and checks it still works
 *   inherit M      map and write M MiB, fork: the child rewrites all of it (no new allocation:
 *                  reserved at fork), a second fork is refused with ENOMEM while it lives, the
 *                  child's further big mmap is ENOMEM and its brk does not grow; the parent's data
 *                  is its own
 *   bomb M         map and write M MiB, then fork bomb: refused forks are EAGAIN or ENOMEM, at
 *                  least one ENOMEM; everyone but process 1 exits, process 1 reaps its children
 *   rusage         wait4's rusage and getrusage(RUSAGE_CHILDREN) of children that used CPU time
 *                  and memory, with a grandchild's counted in its waiting parent's
 */
#include "check.h"

#include <sys/resource.h>
#include <sys/times.h>
#include <sys/wait.h>
#include <time.h>

static void fill(uint8_t *p, size_t len, uint8_t v) {
    for (size_t i = 0; i < len; i += 4096) p[i] = v; /* one write per page: each becomes private */
    memset(p, v, len);
}

static int all_are(const uint8_t *p, size_t len, uint8_t v) {
    for (size_t i = 0; i < len; i += 4096)
        if (p[i] != v || p[i + 4095] != v) return 0;
    return 1;
}

static void test_children(int argc, char **argv) {
    CHECK(argc >= 4, "usage: children N M");
    if (argc < 4) return;
    int n = atoi(argv[2]);
    size_t mib = (size_t)atol(argv[3]);
    int report[2], release[2];
    OK(pipe(report));
    OK(pipe(release));
    int forked = 0, fork_refused = 0;
    for (int i = 0; i < n; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) {
            CHECK(errno == ENOMEM || errno == EAGAIN, "fork: %s", strerror(errno));
            fork_refused++;
            continue;
        }
        if (pid == 0) {
            close(report[0]);
            close(release[1]);
            uint8_t *p = mmap(NULL, mib << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            char c = p == MAP_FAILED ? (errno == ENOMEM ? 'n' : 'e') : 'y';
            if (p != MAP_FAILED) fill(p, mib << 20, (uint8_t)(i + 1));
            if (write(report[1], &c, 1) != 1) _exit(3);
            if (read(release[0], &c, 1) != 1) _exit(4); /* hold the memory until the parent says */
            if (p != MAP_FAILED && !all_are(p, mib << 20, (uint8_t)(i + 1))) _exit(5);
            _exit(0);
        }
        forked++;
    }
    close(report[1]);
    close(release[0]);
    int ok = 0, refused = 0;
    for (int i = 0; i < forked; i++) {
        char c = 0;
        CHECK_EQ(read(report[0], &c, 1), 1);
        if (c == 'y') ok++;
        else if (c == 'n') refused++;
        else FAIL("child's mmap failed with another error than ENOMEM");
    }
    int tty = (int)OK(open("/dev/ttyS0", O_RDWR));
    printf("holding %d %d %d\n", ok, refused + fork_refused, forked);
    fflush(stdout);
    char line[16];
    CHECK(read(tty, line, sizeof line) > 0, "no input"); /* the host measures here */
    close(tty);
    for (int i = 0; i < forked; i++) CHECK_EQ(write(release[1], "g", 1), 1);
    int status, reaped = 0;
    while (wait(&status) > 0) {
        reaped++;
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a child ended with status %#x", status);
    }
    CHECK_EQ(reaped, forked);
    /* the parent's own memory works as before, and the whole budget is free again */
    uint8_t *p = mmap(NULL, mib << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "mmap after the children ended: %s", strerror(errno));
    if (p != MAP_FAILED) { fill(p, mib << 20, 0x5a); CHECKM(all_are(p, mib << 20, 0x5a)); }
}

static void test_inherit(int argc, char **argv) {
    CHECK(argc >= 3, "usage: inherit M");
    if (argc < 3) return;
    size_t len = (size_t)atol(argv[2]) << 20;
    uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "mmap: %s", strerror(errno));
    if (p == MAP_FAILED) return;
    fill(p, len, 0x11);
    int go[2];
    OK(pipe(go));
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(go[1]);
        fill(p, len, 0x22); /* every inherited page rewritten: reserved at fork, never refused */
        if (!all_are(p, len, 0x22)) _exit(10);
        void *more = mmap(NULL, 4 * len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (more != MAP_FAILED || errno != ENOMEM) _exit(11);
        void *top = sbrk(0);
        if (sbrk((intptr_t)(4 * len)) != (void *)-1 || sbrk(0) != top) _exit(12); /* brk: ENOMEM, unchanged */
        char c;
        if (read(go[0], &c, 1) != 1) _exit(13); /* live until the parent tried its second fork */
        _exit(0);
    }
    close(go[0]);
    fflush(stdout);
    pid_t second = fork();
    if (second == 0) _exit(0);
    CHECK(second < 0 && errno == ENOMEM, "a second fork while the first child lives: %d (%s)", second,
          strerror(errno));
    CHECK_EQ(write(go[1], "g", 1), 1);
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
    CHECKM(all_are(p, len, 0x11)); /* copy-on-write: the child's rewrite was its own */
    /* its charge is gone: a fork fits again */
    fflush(stdout);
    pid = fork();
    CHECK(pid >= 0, "a fork after the child ended: %s", strerror(errno));
    if (pid == 0) _exit(all_are(p, len, 0x11) ? 0 : 1);
    if (pid > 0) { CHECK_EQ(waitpid(pid, &status, 0), pid); CHECK(WIFEXITED(status) && !WEXITSTATUS(status), "%#x", status); }
}

static void test_bomb(int argc, char **argv) {
    CHECK(argc >= 3, "usage: bomb M");
    if (argc < 3) return;
    size_t len = (size_t)atol(argv[2]) << 20;
    uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "mmap: %s", strerror(errno));
    if (p == MAP_FAILED) return;
    fill(p, len, 0x33);
    int nomem = 0, report[2];
    OK(pipe(report));
    for (int round = 0; round < 7; round++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) {
            CHECK(errno == EAGAIN || errno == ENOMEM, "fork: %s", strerror(errno));
            if (errno == ENOMEM) nomem++;
            break;
        }
        if (pid == 0) fill(p, len, (uint8_t)round); /* every process rewrites all it inherited */
    }
    if (getpid() != 1) {
        if (nomem) (void)!write(report[1], "n", 1);
        _exit(0);
    }
    close(report[1]);
    while (wait(NULL) > 0) {}
    CHECK_EQ(errno, ECHILD);
    char buf[64];
    ssize_t got;
    while ((got = read(report[0], buf, sizeof buf)) > 0) nomem += (int)got;
    CHECK(nomem > 0, "no fork was refused for memory");
    CHECKM(all_are(p, len, 0x33));
    printf("bomb done, %d refused for memory\n", nomem);
}

static uint64_t cpu_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* Use at least `us` of CPU time and touch `mib` MiB (the process's own CPU clock: no wall time). */
static void burn(uint64_t us, size_t mib) {
    if (mib) {
        uint8_t *p = mmap(NULL, mib << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) _exit(20);
        fill(p, mib << 20, 7);
    }
    volatile uint64_t x = 0;
    uint64_t start = cpu_us();
    while (cpu_us() - start < us) x++;
}

static uint64_t tv_us(struct timeval tv) { return (uint64_t)tv.tv_sec * 1000000 + (uint64_t)tv.tv_usec; }

static void test_rusage(int argc, char **argv) {
    (void)argc, (void)argv;
    struct rusage ru;
    OK(getrusage(RUSAGE_CHILDREN, &ru));
    CHECK(tv_us(ru.ru_utime) + tv_us(ru.ru_stime) == 0 && ru.ru_maxrss == 0, "no child waited for yet");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        burn(30000, 24);
        _exit(0);
    }
    CHECK(pid > 0, "fork: %s", strerror(errno));
    int status;
    memset(&ru, 0, sizeof ru);
    CHECK_EQ(wait4(pid, &status, 0, &ru), pid);
    uint64_t child_us = tv_us(ru.ru_utime) + tv_us(ru.ru_stime);
    CHECK(child_us >= 30000, "wait4: the child's CPU time %llu us", (unsigned long long)child_us);
    CHECK(ru.ru_maxrss >= 24 * 1024, "wait4: the child's maxrss %ld KiB", ru.ru_maxrss);
    struct rusage all;
    OK(getrusage(RUSAGE_CHILDREN, &all));
    CHECK_EQ(tv_us(all.ru_utime), tv_us(ru.ru_utime));
    CHECK_EQ(tv_us(all.ru_stime), tv_us(ru.ru_stime));
    CHECK_EQ(all.ru_maxrss, ru.ru_maxrss);
    /* a child that waits for its own child: wait4 reports both; an unwaited one is not counted */
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        pid_t g = fork();
        if (g == 0) { burn(30000, 40); _exit(0); }
        if (g < 0 || waitpid(g, NULL, 0) != g) _exit(30);
        struct rusage c;
        if (getrusage(RUSAGE_CHILDREN, &c) || c.ru_maxrss < 40 * 1024) _exit(31);
        _exit(0);
    }
    CHECK_EQ(wait4(pid, &status, 0, &ru), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %#x", status);
    CHECK(tv_us(ru.ru_utime) + tv_us(ru.ru_stime) >= 30000, "the grandchild's CPU time is its parent's child usage");
    CHECK(ru.ru_maxrss >= 40 * 1024, "maxrss %ld", ru.ru_maxrss);
    OK(getrusage(RUSAGE_CHILDREN, &all));
    CHECK(tv_us(all.ru_utime) + tv_us(all.ru_stime) >= 60000, "both children's CPU time");
    CHECK(all.ru_maxrss >= 40 * 1024, "the larger maxrss: %ld", all.ru_maxrss);
    struct tms t;
    CHECK(times(&t) != (clock_t)-1, "times");
    CHECK(t.tms_cutime + t.tms_cstime >= 5, "times: the children's ticks %ld", (long)(t.tms_cutime + t.tms_cstime));
    /* a bad rusage pointer: EFAULT, and the child is not reaped */
    fflush(stdout);
    pid = fork();
    if (pid == 0) _exit(0);
    CHECK_ERR(wait4(pid, &status, 0, (struct rusage *)8), EFAULT);
    CHECK_EQ(wait4(pid, &status, 0, NULL), pid);
}

static const zb_test tests[] = {
    {"rusage", test_rusage},
    {"children", test_children},
    {"inherit", test_inherit},
    {"bomb", test_bomb},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
