/* engine_holes.c - reproducers of issue 11's engine findings (items 4a, 5, 6, 7, 8).
 *
 *   engine_holes epoll_loops         an epoll watching itself through a dup, loops and deep chains
 *   engine_holes dir_listings DIR N  DIR holds N long names; open it 1,000 times and read each: the
 *                                    cached listings are bounded (ENOMEM past the budget); then
 *                                    waits on the UART ("ready") so the host can take snapshots
 *   engine_holes uart_loopback       MCR loopback + rep outsb of 4 KiB: the chip's 16-byte FIFO
 *   engine_holes host_modes DIR      create a file 06755 and a directory 07777 in DIR (read-write
 *                                    project): what reaches the host has no setuid/setgid/sticky bit
 *   engine_holes cpu_clock           commands from the UART: c = print CLOCK_PROCESS_CPUTIME_ID,
 *                                    s = spin 2 s, q = exit
 *   engine_holes big_dir N           an overlay directory of N entries: listed once each, looked up,
 *                                    half removed, listed again
 *   engine_holes list_dir DIR        count DIR's entries (a host directory the host filled)
 *   engine_holes hold_fds PATH       open PATH until it fails, then wait on the UART holding them
 *   engine_holes many_files N        N overlay files with 200-byte names in /tmp/many, then commands from
 *                                    the UART: a = add one more file there, q = exit
 *   engine_holes full_pipes          fill pipes until the fd table is full, wait on the UART, then
 *                                    check every byte is still there
 *   engine_holes clock_watch         read CLOCK_MONOTONIC (and BOOTTIME) in a loop until the UART
 *                                    says q; report the largest step back between two reads
 *   engine_holes side_channels       what rdtscp, rdpid and smsw tell a CPL3 guest (documented in
 *                                    docs/SECURITY.md as residual side channels)
 * Each prints "RESULT key=value ..." lines for the host to check.
 */
#include "check.h"

#include <dirent.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <time.h>

static int64_t clock_ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void test_epoll_loops(int argc, char **argv) {
    (void)argc;
    (void)argv;
    struct epoll_event ev = {.events = EPOLLIN};
    /* the reproducer: ep.register(os.dup(ep.fileno())), then ep.poll() */
    int ep = OK(epoll_create1(0));
    int same = OK(dup(ep));
    CHECK_ERR(epoll_ctl(ep, EPOLL_CTL_ADD, same, &ev), EINVAL);
    CHECK_ERR(epoll_ctl(same, EPOLL_CTL_ADD, ep, &ev), EINVAL);
    struct epoll_event got[4];
    CHECK_EQ(epoll_wait(ep, got, 4, 10), 0);
    /* a loop through two (and three) epoll files, named through dups */
    int a = OK(epoll_create1(0)), b = OK(epoll_create1(0)), c = OK(epoll_create1(0));
    OK(epoll_ctl(a, EPOLL_CTL_ADD, b, &ev));
    CHECK_ERR(epoll_ctl(b, EPOLL_CTL_ADD, OK(dup(a)), &ev), ELOOP);
    OK(epoll_ctl(b, EPOLL_CTL_ADD, c, &ev));
    CHECK_ERR(epoll_ctl(c, EPOLL_CTL_ADD, OK(dup(a)), &ev), ELOOP);
    /* nesting: 5 epoll files in a chain are fine (and readiness flows up), a 6th is ELOOP, from
     * either end, as in Linux */
    int e[7], p[2];
    for (int i = 0; i < 7; i++) e[i] = OK(epoll_create1(0));
    OK(pipe(p));
    OK(epoll_ctl(e[4], EPOLL_CTL_ADD, p[0], &ev));
    for (int i = 3; i >= 0; i--) OK(epoll_ctl(e[i], EPOLL_CTL_ADD, e[i + 1], &ev));
    CHECK_EQ(epoll_wait(e[0], got, 4, 0), 0);
    CHECK_EQ(write(p[1], "x", 1), 1);
    CHECK_EQ(epoll_wait(e[0], got, 4, 0), 1);
    struct pollfd pfd = {.fd = e[0], .events = POLLIN};
    CHECK_EQ(poll(&pfd, 1, 0), 1);
    CHECK_ERR(epoll_ctl(e[5], EPOLL_CTL_ADD, e[0], &ev), ELOOP); /* above the top */
    OK(epoll_ctl(e[6], EPOLL_CTL_ADD, p[0], &ev));
    CHECK_ERR(epoll_ctl(e[4], EPOLL_CTL_ADD, e[6], &ev), ELOOP); /* below the bottom */
    /* and the self-loop through a dup still refused after all this */
    CHECK_ERR(epoll_ctl(e[2], EPOLL_CTL_ADD, OK(dup(e[2])), &ev), EINVAL);
    printf("RESULT survived=1\n");
}

static void wait_for_host(void) {
    int tty = OK(open("/dev/ttyS0", O_RDWR));
    char c;
    printf("RESULT waiting=1\n");
    fflush(stdout);
    CHECK_EQ(read(tty, &c, 1), 1);
    close(tty);
}

static void test_dir_listings(int argc, char **argv) {
    const char *dir = argc > 2 ? argv[2] : "/tmp/big";
    int n = argc > 3 ? atoi(argv[3]) : 2000;
    char name[512], pad[201];
    memset(pad, 'n', 200);
    pad[200] = 0;
    mkdir(dir, 0755);
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%s/%06d%s", dir, i, pad + 6);
        int fd = open(name, O_CREAT | O_WRONLY, 0644);
        if (fd < 0) { FAIL("create %s: %s", name, strerror(errno)); return; }
        close(fd);
    }
    int ok = 0, nomem = 0, other = 0;
    char buf[4096];
    for (int i = 0; i < 1000; i++) {
        int fd = open(dir, O_RDONLY | O_DIRECTORY);
        if (fd < 0) { other++; break; }
        long r = syscall(SYS_getdents64, fd, buf, sizeof buf);
        if (r > 0) ok++;
        else if (r < 0 && errno == ENOMEM) { nomem++; close(fd); }
        else other++;
    }
    printf("RESULT listed=%d nomem=%d other=%d\n", ok, nomem, other);
    wait_for_host();
}

static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port)); }
static inline uint8_t inb(uint16_t port) {
    uint8_t v;
    __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}

static void test_uart_loopback(int argc, char **argv) {
    (void)argc;
    (void)argv;
    static uint8_t block[4096];
    memset(block, 'L', sizeof block);
    outb(0x3fc, 0x10); /* MCR: loopback */
    const void *src = block;
    unsigned long count = sizeof block;
    __asm__ volatile("rep outsb" : "+S"(src), "+c"(count) : "d"((uint16_t)0x3f8) : "memory");
    int received = 0, overrun = 0;
    for (;;) {
        uint8_t lsr = inb(0x3fd);
        if (lsr & 0x02) overrun = 1;
        if (!(lsr & 0x01)) break;
        if (inb(0x3f8) == 'L') received++;
        if (received > (int)sizeof block) break;
    }
    outb(0x3fc, 0x00);
    printf("RESULT received=%d overrun=%d\n", received, overrun);
}

static void test_host_modes(int argc, char **argv) {
    const char *dir = argc > 2 ? argv[2] : ".";
    char path[4096];
    snprintf(path, sizeof path, "%s/setuid-file", dir);
    int fd = OK(open(path, O_CREAT | O_WRONLY | O_EXCL, 06755));
    close(fd);
    snprintf(path, sizeof path, "%s/sticky-dir", dir);
    OK(mkdir(path, 07777));
    printf("RESULT created=1\n");
}

static void test_cpu_clock(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int tty = OK(open("/dev/ttyS0", O_RDWR));
    for (;;) {
        char c;
        if (read(tty, &c, 1) != 1) { FAIL("uart read"); return; }
        if (c == 'c') {
            printf("RESULT cpu_ns=%lld\n", (long long)clock_ns(CLOCK_PROCESS_CPUTIME_ID));
            fflush(stdout);
        } else if (c == 's') {
            int64_t end = clock_ns(CLOCK_MONOTONIC) + 2000000000;
            while (clock_ns(CLOCK_MONOTONIC) < end) {}
            printf("RESULT spun=1\n");
            fflush(stdout);
        } else if (c == 'q') {
            return;
        }
    }
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -errno;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void test_big_dir(int argc, char **argv) {
    int n = argc > 2 ? atoi(argv[2]) : 20000;
    char path[256];
    OK(mkdir("/tmp/many", 0755));
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "/tmp/many/f%07d", i);
        int fd = open(path, O_CREAT | O_WRONLY | O_EXCL, 0644);
        if (fd < 0) { FAIL("create %s: %s", path, strerror(errno)); return; }
        close(fd);
    }
    CHECK_EQ(count_entries("/tmp/many"), n);
    struct stat st;
    int missing = 0;
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "/tmp/many/f%07d", i);
        missing += stat(path, &st) != 0;
    }
    CHECK_EQ(missing, 0);
    for (int i = 0; i < n; i += 2) {
        snprintf(path, sizeof path, "/tmp/many/f%07d", i);
        OK(unlink(path));
    }
    int wrong = 0;
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "/tmp/many/f%07d", i);
        wrong += (stat(path, &st) == 0) != (i % 2 == 1);
    }
    CHECK_EQ(wrong, 0);
    CHECK_ERR(open("/tmp/many/f0000001", O_CREAT | O_EXCL | O_WRONLY, 0644), EEXIST);
    OK(rename("/tmp/many/f0000001", "/tmp/many/renamed"));
    CHECK_ERR(stat("/tmp/many/f0000001", &st), ENOENT);
    OK(stat("/tmp/many/renamed", &st));
    CHECK_EQ(count_entries("/tmp/many"), n / 2);
    printf("RESULT entries=%d\n", count_entries("/tmp/many"));
}

static void test_list_dir(int argc, char **argv) {
    int64_t t0 = clock_ns(CLOCK_MONOTONIC);
    int n = count_entries(argc > 2 ? argv[2] : "/");
    printf("RESULT entries=%d ms=%lld\n", n, (long long)(clock_ns(CLOCK_MONOTONIC) - t0) / 1000000);
}

static void test_hold_fds(int argc, char **argv) {
    const char *path = argc > 2 ? argv[2] : "/dev/null";
    int tty = OK(open("/dev/ttyS0", O_RDWR)), n = 0; /* before the table is full */
    while (open(path, O_RDONLY) >= 0) n++;
    printf("RESULT opened=%d errno=%s\n", n, strerrorname_np(errno));
    printf("RESULT waiting=1\n");
    fflush(stdout);
    char c;
    CHECK_EQ(read(tty, &c, 1), 1);
}

static void test_many_files(int argc, char **argv) {
    int n = argc > 2 ? atoi(argv[2]) : 20000;
    char path[512], pad[201];
    memset(pad, 'm', 200);
    pad[200] = 0;
    OK(mkdir("/tmp/many", 0755));
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "/tmp/many/%07d%s", i, pad + 7);
        int fd = open(path, O_CREAT | O_WRONLY | O_EXCL, 0644);
        if (fd < 0) { FAIL("create %s: %s", path, strerror(errno)); return; }
        close(fd);
    }
    int tty = OK(open("/dev/ttyS0", O_RDWR));
    printf("RESULT created=%d\n", n);
    fflush(stdout);
    for (int extra = 0;; extra++) {
        char c;
        if (read(tty, &c, 1) != 1) { FAIL("uart read"); return; }
        if (c == 'q') break;
        snprintf(path, sizeof path, "/tmp/many/extra%d", extra);
        close(OK(open(path, O_CREAT | O_WRONLY, 0644)));
    }
    CHECK_EQ(count_entries("/tmp/many") >= n, 1);
}

static void test_full_pipes(int argc, char **argv) {
    (void)argc;
    (void)argv;
    static char block[65536], back[65536];
    static int readers[600];
    int p[2], n = 0;
    long bytes = 0;
    while (n < 600 && pipe2(p, O_NONBLOCK) == 0) {
        memset(block, 'a' + n % 26, sizeof block);
        long w;
        while ((w = write(p[1], block, sizeof block)) > 0) bytes += w;
        readers[n++] = p[0];
    }
    printf("RESULT pipes=%d mib=%ld\n", n, bytes >> 20);
    wait_for_host();
    int bad = 0;
    for (int i = 0; i < n; i++) {
        long r = read(readers[i], back, sizeof back);
        bad += r != (long)sizeof back || back[0] != 'a' + i % 26 || back[sizeof back - 1] != 'a' + i % 26;
    }
    CHECK_EQ(bad, 0);
}

static void test_clock_watch(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int tty = OK(open("/dev/ttyS0", O_RDWR | O_NONBLOCK));
    printf("RESULT watching=1\n");
    fflush(stdout);
    int64_t prev = clock_ns(CLOCK_MONOTONIC), prev_boot = clock_ns(CLOCK_BOOTTIME), worst = 0;
    long reads = 0;
    for (;;) {
        for (int i = 0; i < 4096; i++, reads++) {
            int64_t t = clock_ns(CLOCK_MONOTONIC), b = clock_ns(CLOCK_BOOTTIME);
            if (prev - t > worst) worst = prev - t;
            if (prev_boot - b > worst) worst = prev_boot - b;
            prev = t;
            prev_boot = b;
        }
        char c;
        if (read(tty, &c, 1) == 1 && c == 'q') break;
    }
    printf("RESULT reads=%ld worst_back_ns=%lld\n", reads, (long long)worst);
    CHECK(worst == 0, "the clock went back by %lld ns", (long long)worst);
}

#include <cpuid.h>

static void test_side_channels(int argc, char **argv) {
    (void)argc;
    (void)argv;
    unsigned a, b, c, d;
    int has_rdtscp = __get_cpuid(0x80000001, &a, &b, &c, &d) && (d & (1u << 27));
    int has_rdpid = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 22));
    unsigned long cr0 = 0;
    __asm__ volatile("smsw %0" : "=r"(cr0));
    printf("RESULT smsw=0x%lx", cr0);
    if (has_rdtscp) {
        unsigned aux, lo, hi;
        __asm__ volatile("rdtscp" : "=a"(lo), "=d"(hi), "=c"(aux));
        printf(" rdtscp_aux=%u", aux);
    }
    if (has_rdpid) {
        unsigned long pid;
        __asm__ volatile("rdpid %0" : "=r"(pid));
        printf(" rdpid=%lu", pid);
    }
    printf(" has_rdtscp=%d has_rdpid=%d\n", has_rdtscp, has_rdpid);
}

static const zb_test tests[] = {
    {"epoll_loops", test_epoll_loops}, {"dir_listings", test_dir_listings}, {"uart_loopback", test_uart_loopback},
    {"host_modes", test_host_modes}, {"cpu_clock", test_cpu_clock}, {"big_dir", test_big_dir},
    {"list_dir", test_list_dir}, {"hold_fds", test_hold_fds},
    {"side_channels", test_side_channels}, {"many_files", test_many_files},
    {"full_pipes", test_full_pipes}, {"clock_watch", test_clock_watch}, {NULL, NULL},
};

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    return zb_run(tests, argc, argv);
}
