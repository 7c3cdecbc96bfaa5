/* eventfd.c - eventfd2/eventfd: flags, 8-byte reads and writes, EFD_SEMAPHORE, EAGAIN, EINVAL,
 * the overflow limit, poll/select/epoll readiness, and the counter across snapshots and forks. */
#include "check.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/select.h>
#include <sys/stat.h>

static long efd(unsigned initval, int flags) { return syscall(SYS_eventfd2, initval, flags); }

static uint64_t read_count(int fd) {
    uint64_t v = 0;
    CHECK_EQ(syscall(SYS_read, fd, &v, sizeof v), 8);
    return v;
}

static void write_count(int fd, uint64_t v) { CHECK_EQ(syscall(SYS_write, fd, &v, sizeof v), 8); }

static short revents(int fd, short events) {
    struct pollfd p = {.fd = fd, .events = events};
    CHECK_EQ(syscall(SYS_poll, &p, 1, 0), p.revents ? 1 : 0);
    return p.revents;
}

/* Creation: flags, fd flags, fstat; eventfd (the old call) is eventfd2 without flags. */
static void test_create(int argc, char **argv) {
    (void)argc;
    (void)argv;
    CHECK_ERR(efd(0, 0x4000000), EINVAL); /* an unknown flag */
    CHECK_ERR(efd(0, O_APPEND), EINVAL);
    int a = (int)OK(efd(5, EFD_CLOEXEC | EFD_NONBLOCK));
    CHECK_EQ(fcntl(a, F_GETFD), FD_CLOEXEC);
    CHECK_EQ(fcntl(a, F_GETFL) & (O_ACCMODE | O_NONBLOCK), O_RDWR | O_NONBLOCK);
    int b = (int)OK(syscall(SYS_eventfd, 7));
    CHECK_EQ(fcntl(b, F_GETFD), 0);
    CHECK_EQ(fcntl(b, F_GETFL) & (O_ACCMODE | O_NONBLOCK), O_RDWR);
    CHECK_EQ(read_count(b), 7);
    struct stat st;
    OK(fstat(a, &st));
    CHECK_EQ(st.st_mode & 0777, 0600);
    CHECK_EQ(read_count(a), 5);
    char tmp[8];
    CHECK_ERR(syscall(SYS_pread64, a, tmp, sizeof tmp, 0), ESPIPE);
    OK(close(a));
    OK(close(b));
}

/* Reads return and zero the counter, writes add; short buffers, UINT64_MAX and overflow fail. */
static void test_counter(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = (int)OK(efd(0, EFD_NONBLOCK));
    uint64_t v = 0;
    CHECK_ERR(syscall(SYS_read, fd, &v, sizeof v), EAGAIN); /* zero */
    write_count(fd, 2);
    write_count(fd, 40);
    char small[7];
    CHECK_ERR(syscall(SYS_read, fd, small, sizeof small), EINVAL);
    CHECK_ERR(syscall(SYS_write, fd, small, sizeof small), EINVAL);
    CHECK_EQ(read_count(fd), 42);
    CHECK_ERR(syscall(SYS_read, fd, &v, sizeof v), EAGAIN);
    /* a bigger buffer reads 8 bytes; an unaligned one works */
    char big[17] = {0};
    write_count(fd, 3);
    CHECK_EQ(syscall(SYS_read, fd, big + 1, 16), 8);
    memcpy(&v, big + 1, sizeof v);
    CHECK_EQ(v, 3);
    v = UINT64_MAX;
    CHECK_ERR(syscall(SYS_write, fd, &v, sizeof v), EINVAL);
    write_count(fd, 0xfffffffffffffffeull); /* the largest value it holds */
    v = 1;
    CHECK_ERR(syscall(SYS_write, fd, &v, sizeof v), EAGAIN);
    CHECK_EQ(revents(fd, POLLIN | POLLOUT), POLLIN); /* full: readable only */
    CHECK_EQ(read_count(fd), 0xfffffffffffffffeull);
    write_count(fd, 0); /* adds nothing, succeeds */
    CHECK_ERR(syscall(SYS_read, fd, &v, sizeof v), EAGAIN);
    /* a blocking read of a zero counter waits, as on Linux, for another thread or process to
     * write (the counter test of procs.c); a blocking fd reads a non-zero counter at once */
    int blocking = (int)OK(efd(0, 0));
    /* readv and writev work through the same path */
    uint64_t w = 9, r = 0;
    struct iovec wio = {&w, sizeof w}, rio = {&r, sizeof r};
    CHECK_EQ(syscall(SYS_writev, blocking, &wio, 1), 8);
    CHECK_EQ(syscall(SYS_readv, blocking, &rio, 1), 8);
    CHECK_EQ(r, 9);
    OK(close(blocking));
    OK(close(fd));
}

/* EFD_SEMAPHORE: each read takes 1. */
static void test_semaphore(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = (int)OK(efd(2, EFD_SEMAPHORE | EFD_NONBLOCK));
    write_count(fd, 1);
    CHECK_EQ(read_count(fd), 1);
    CHECK_EQ(read_count(fd), 1);
    CHECK_EQ(read_count(fd), 1);
    uint64_t v;
    CHECK_ERR(syscall(SYS_read, fd, &v, sizeof v), EAGAIN);
    OK(close(fd));
}

/* poll, select and epoll: readable while non-zero, writable while a write of 1 fits. */
static void test_ready(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = (int)OK(efd(0, EFD_NONBLOCK));
    CHECK_EQ(revents(fd, POLLIN | POLLOUT), POLLOUT);
    CHECK_EQ(revents(fd, POLLIN), 0);
    int ep = (int)OK(epoll_create1(0));
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0x5eed};
    OK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev)); /* (regular files would be EPERM) */
    struct epoll_event got[2];
    CHECK_EQ(epoll_wait(ep, got, 2, 0), 0);
    write_count(fd, 1);
    CHECK_EQ(revents(fd, POLLIN | POLLOUT), POLLIN | POLLOUT);
    CHECK_EQ(epoll_wait(ep, got, 2, 0), 1);
    CHECK_EQ(got[0].events, EPOLLIN);
    CHECK_EQ(got[0].data.u64, 0x5eed);
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(fd, &rd);
    struct timeval tv = {0, 0};
    CHECK_EQ(syscall(SYS_select, fd + 1, &rd, NULL, NULL, &tv), 1);
    CHECK(FD_ISSET(fd, &rd), "select did not report the eventfd readable");
    /* an epoll watching the epoll sees it too */
    int outer = (int)OK(epoll_create1(0));
    ev.events = EPOLLIN;
    OK(epoll_ctl(outer, EPOLL_CTL_ADD, ep, &ev));
    CHECK_EQ(epoll_wait(outer, got, 2, 0), 1);
    CHECK_EQ(read_count(fd), 1);
    CHECK_EQ(epoll_wait(ep, got, 2, 0), 0);
    CHECK_EQ(epoll_wait(outer, got, 2, 0), 0);
    /* a timed wait with nothing ready sleeps its timeout and returns 0 */
    CHECK_EQ(epoll_wait(ep, got, 2, 1), 0);
    OK(close(outer));
    OK(close(ep));
    OK(close(fd));
}

/* The counters across a snapshot: the host snapshots while this waits on the UART, then every
 * fork (and a saved and loaded template) sees the counters as they were. */
static void test_snapshot_state(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int plain = (int)OK(efd(0, EFD_NONBLOCK));
    int sem = (int)OK(efd(2, EFD_NONBLOCK | EFD_SEMAPHORE | EFD_CLOEXEC));
    write_count(plain, 1234);
    int ep = (int)OK(epoll_create1(0));
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 77};
    OK(epoll_ctl(ep, EPOLL_CTL_ADD, plain, &ev));
    int tty = (int)OK(open("/dev/ttyS0", O_RDWR));
    printf("ready\n");
    fflush(stdout);
    char go[8];
    OK(read(tty, go, sizeof go)); /* the host snapshots here */
    struct epoll_event got[2];
    CHECK_EQ(epoll_wait(ep, got, 2, 0), 1);
    CHECK_EQ(got[0].data.u64, 77);
    CHECK_EQ(read_count(plain), 1234);
    CHECK_EQ(fcntl(sem, F_GETFD), FD_CLOEXEC);
    CHECK_EQ(fcntl(sem, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
    CHECK_EQ(read_count(sem), 1); /* still a semaphore */
    CHECK_EQ(read_count(sem), 1);
    uint64_t v;
    CHECK_ERR(syscall(SYS_read, sem, &v, sizeof v), EAGAIN);
    CHECK_EQ(epoll_wait(ep, got, 2, 0), 0);
}

static const zb_test tests[] = {
    {"create", test_create},
    {"counter", test_counter},
    {"semaphore", test_semaphore},
    {"ready", test_ready},
    {"snapshot_state", test_snapshot_state},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
