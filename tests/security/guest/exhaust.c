/* exhaust.c - a guest that tries to exhaust what the host gives it.
 *
 *   exhaust mem             touch anonymous memory until mmap fails
 *   exhaust fds PATH        open PATH until the fd table is full (a host file: host fds)
 *   exhaust symlinks        overlay symlinks with 4 KiB targets until ENOSPC (engine metadata)
 *   exhaust names           overlay files with 255-byte names until ENOSPC
 *   exhaust pipes           fill pipes until the fd table is full
 *   exhaust big_pipes       enlarge pipes to 1 MiB (F_SETPIPE_SZ) until refused, and fill them
 *   exhaust memfd           grow a memfd by writing, and through a shared mapping, past the limit
 *   exhaust output          one write() of 64 MiB to stdout, then a flood of small writes
 *   exhaust spin            loop forever without a syscall
 *   exhaust scm_cycles      socketpairs with full streams, each end in flight on itself (a cycle
 *                           no fd names: no garbage collector) until ETOOMANYREFS
 *   exhaust scm_chain       a chain of sockets each in flight on the next, 1000 deep, then the
 *                           last closed: all of it goes at once (never by recursion)
 * Each prints "RESULT key=value ..." lines for the host to check.
 */
#include "check.h"

#include <sys/socket.h>
#include <sys/stat.h>

static void test_mem(int argc, char **argv) {
    (void)argc;
    (void)argv;
    size_t total = 0, chunk = 16 << 20;
    for (;;) {
        char *p = mmap(NULL, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) break;
        for (size_t i = 0; i < chunk; i += PAGE) p[i] = 1;
        total += chunk;
    }
    int e = errno;
    void *big = mmap(NULL, 1ul << 40, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    printf("RESULT mib=%zu errno=%s huge=%s brk=%s\n", total >> 20, strerrorname_np(e),
           big == MAP_FAILED ? strerrorname_np(errno) : "mapped", sbrk(1 << 30) == (void *)-1 ? "refused" : "grown");
}

static void test_fds(int argc, char **argv) {
    const char *path = argc > 2 ? argv[2] : "/dev/null";
    int n = 0, fd;
    while ((fd = open(path, O_RDONLY)) >= 0) n++;
    printf("RESULT opened=%d errno=%s\n", n, strerrorname_np(errno));
}

static void test_symlinks(int argc, char **argv) {
    (void)argc;
    (void)argv;
    static char target[4000];
    memset(target, 'x', sizeof target - 1);
    char name[64];
    int n = 0;
    for (;; n++) {
        snprintf(name, sizeof name, "/tmp/l%d", n);
        target[0] = (char)('a' + n % 26);
        if (symlink(target, name) < 0) break;
        if (n > 400000) break;
    }
    printf("RESULT symlinks=%d errno=%s\n", n, strerrorname_np(errno));
}

static void test_names(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char name[300];
    int n = 0;
    memset(name, 0, sizeof name);
    strcpy(name, "/tmp/");
    memset(name + 5, 'n', 255);
    for (;; n++) {
        snprintf(name + 5, 20, "%08d", n);
        name[13] = 'n'; /* keep the 255-byte length */
        int fd = open(name, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0) break;
        close(fd);
        if (n > 400000) break;
    }
    printf("RESULT files=%d errno=%s\n", n, strerrorname_np(errno));
}

static void test_pipes(int argc, char **argv) {
    (void)argc;
    (void)argv;
    static char block[65536];
    memset(block, 'p', sizeof block);
    int p[2], n = 0;
    long bytes = 0;
    while (pipe2(p, O_NONBLOCK) == 0) {
        n++;
        long w;
        while ((w = write(p[1], block, sizeof block)) > 0) bytes += w;
    }
    printf("RESULT pipes=%d mib=%ld pipe_size=%ld\n", n, bytes >> 20, (long)fcntl(3, F_GETPIPE_SZ));
}

static void test_big_pipes(int argc, char **argv) {
    (void)argc;
    (void)argv;
    static char block[1 << 20];
    memset(block, 'p', sizeof block);
    int p[2], n = 0;
    long bytes = 0;
    errno = 0;
    while (pipe2(p, O_NONBLOCK) == 0) {
        if (fcntl(p[1], F_SETPIPE_SZ, 1 << 20) < 0) break;
        n++;
        long w;
        while ((w = write(p[1], block, sizeof block)) > 0) bytes += w;
    }
    printf("RESULT enlarged=%d mib=%ld errno=%s\n", n, bytes >> 20, strerrorname_np(errno));
}

static void test_memfd(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = (int)syscall(SYS_memfd_create, "grow", 0);
    if (fd < 0) { printf("RESULT memfd=%s\n", strerrorname_np(errno)); return; }
    static char block[1 << 20];
    memset(block, 'm', sizeof block);
    long bytes = 0, w;
    while ((w = write(fd, block, sizeof block)) > 0) bytes += w;
    int e = errno;
    long sparse = ftruncate(fd, 1l << 40); /* sparse: no bytes until written */
    int fd2 = (int)syscall(SYS_memfd_create, "mapped", 0);
    long size = 64l << 20;
    long tr = ftruncate(fd2, size);
    char *m = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
    long unmapped = -2;
    if (m != MAP_FAILED) {
        memset(m, 'x', (size_t)size); /* guest memory; written back into the file at munmap */
        unmapped = munmap(m, (size_t)size);
    }
    printf("RESULT mib=%ld errno=%s sparse=%ld truncate=%ld mapped=%s unmap=%ld\n", bytes >> 20, strerrorname_np(e),
           sparse, tr, m == MAP_FAILED ? strerrorname_np(errno) : "yes", unmapped);
}

static void test_output(int argc, char **argv) {
    (void)argc;
    (void)argv;
    size_t len = 64 << 20;
    char *big = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(big, 'o', len);
    long w = write(2, big, len);
    long total = 0;
    for (int i = 0; i < 4000; i++) total += write(2, big, 4096);
    printf("RESULT first=%ld flood=%ld\n", w, total);
}

static void test_spin(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "about to spin\n");
    for (volatile unsigned long i = 0;; i++) {}
}

static long send_fd(int s, int fd) {
    union { struct cmsghdr h; char space[CMSG_SPACE(sizeof(int))]; } c;
    memset(&c, 0, sizeof c);
    struct iovec iov = {"f", 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = &c, .msg_controllen = sizeof c};
    c.h.cmsg_level = SOL_SOCKET;
    c.h.cmsg_type = SCM_RIGHTS;
    c.h.cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(&c.h), &fd, sizeof fd);
    return sendmsg(s, &m, MSG_DONTWAIT);
}

static void test_scm_cycles(int argc, char **argv) {
    (void)argc;
    (void)argv;
    static char block[65536 - 1];
    memset(block, 'c', sizeof block);
    int cycles = 0, e = 0;
    long bytes = 0;
    for (int sv[2]; cycles < 100000 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0; cycles++) {
        long w0 = write(sv[0], block, sizeof block), w1 = write(sv[1], block, sizeof block);
        bytes += (w0 > 0 ? w0 : 0) + (w1 > 0 ? w1 : 0);
        long r = send_fd(sv[0], sv[1]); /* the last byte sv[1]'s stream holds, carrying sv[1] */
        e = r < 0 ? errno : 0;
        close(sv[0]);
        close(sv[1]);
        if (r < 0) break;
    }
    printf("RESULT cycles=%d errno=%s mib=%ld\n", cycles, e ? strerrorname_np(e) : "0", bytes >> 20);
}

static void test_scm_chain(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int prev = -1, n = 0;
    for (; n < 1000; n++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) break;
        if (prev >= 0 && send_fd(sv[0], prev) != 1) break; /* the chain so far rides on this pair's stream */
        if (prev >= 0) close(prev);
        close(sv[0]);
        prev = sv[1];
    }
    close(prev); /* the whole chain goes */
    int sv[2];
    printf("RESULT chain=%d after=%s\n", n, socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0 ? "ok" : strerrorname_np(errno));
}

static const zb_test tests[] = {
    {"mem", test_mem}, {"fds", test_fds}, {"symlinks", test_symlinks}, {"names", test_names},
    {"pipes", test_pipes}, {"big_pipes", test_big_pipes}, {"memfd", test_memfd}, {"output", test_output},
    {"spin", test_spin}, {"scm_cycles", test_scm_cycles}, {"scm_chain", test_scm_chain}, {NULL, NULL},
};

int main(int argc, char **argv) {
    setvbuf(stderr, NULL, _IONBF, 0);
    return zb_run(tests, argc, argv);
}
