/* sockets.c - socketpair streams, the absent network, epoll, and their state across snapshots
 * (named AF_UNIX sockets: unix_sockets.c). */
#include "check.h"

#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Both directions, peeking, vectors, shutdown, EOF and EPIPE, options and addresses. */
static void test_pair(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int sv[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
    CHECK_EQ(fcntl(sv[0], F_GETFD), FD_CLOEXEC);
    struct stat st;
    OK(fstat(sv[0], &st));
    CHECK(S_ISSOCK(st.st_mode), "mode %o", st.st_mode);
    CHECK_EQ(send(sv[0], "ping", 4, 0), 4);
    CHECK_EQ(write(sv[1], "pong!", 5), 5);
    char buf[16] = {0};
    CHECK_EQ(recv(sv[1], buf, 2, MSG_PEEK), 2);
    CHECK(!memcmp(buf, "pi", 2), "peeked %.2s", buf);
    CHECK_EQ(read(sv[1], buf, sizeof buf), 4);
    CHECK(!memcmp(buf, "ping", 4), "read %.4s", buf);
    CHECK_ERR(recv(sv[1], buf, sizeof buf, MSG_DONTWAIT), EAGAIN); /* nothing queued */
    CHECK_EQ(write(sv[0], "", 0), 0);   /* a null write succeeds at once */
    /* recvmsg scatters over two buffers; sendmsg gathers */
    char a[3] = {0}, b[8] = {0};
    struct iovec in[2] = {{a, 3}, {b, sizeof b}};
    struct msghdr m = {.msg_iov = in, .msg_iovlen = 2};
    CHECK_EQ(recvmsg(sv[0], &m, 0), 5);
    CHECK(!memcmp(a, "pon", 3) && !memcmp(b, "g!", 2), "scattered %.3s|%.2s", a, b);
    CHECK_EQ(m.msg_flags, 0);
    struct iovec out[2] = {{"ab", 2}, {"cd", 2}};
    struct msghdr m2 = {.msg_iov = out, .msg_iovlen = 2};
    CHECK_EQ(sendmsg(sv[1], &m2, MSG_NOSIGNAL), 4);
    CHECK_EQ(recv(sv[0], buf, sizeof buf, 0), 4);
    CHECK(!memcmp(buf, "abcd", 4), "gathered %.4s", buf);
    /* options and addresses */
    int type = 0;
    socklen_t len = sizeof type;
    OK(getsockopt(sv[0], SOL_SOCKET, SO_TYPE, &type, &len));
    CHECK_EQ(type, SOCK_STREAM);
    CHECK_EQ(len, sizeof type);
    int big = 1 << 16;
    OK(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big));
    CHECK_ERR(getsockopt(sv[0], SOL_SOCKET, SO_PEERCRED, &type, &len), ENOPROTOOPT);
    struct sockaddr_un addr;
    len = sizeof addr;
    OK(getsockname(sv[0], (struct sockaddr *)&addr, &len));
    CHECK(addr.sun_family == AF_UNIX && len == sizeof(sa_family_t), "family %d len %u", addr.sun_family, len);
    CHECK_ERR(connect(sv[0], (struct sockaddr *)&addr, sizeof(sa_family_t)), EISCONN);
    CHECK_ERR(listen(sv[0], 1), EINVAL);
    /* shutdown: the peer reads EOF; writing after SHUT_WR fails with EPIPE */
    OK(shutdown(sv[0], SHUT_WR));
    CHECK_EQ(read(sv[1], buf, sizeof buf), 0);
    signal(SIGPIPE, SIG_IGN);
    CHECK_ERR(send(sv[0], "x", 1, 0), EPIPE);
    CHECK_EQ(send(sv[1], "still", 5, 0), 5); /* the other direction still works */
    CHECK_EQ(recv(sv[0], buf, sizeof buf, 0), 5);
    /* closing one end: the other reads EOF and cannot write */
    OK(close(sv[0]));
    CHECK_EQ(read(sv[1], buf, sizeof buf), 0);
    CHECK_ERR(write(sv[1], "x", 1), EPIPE);
    OK(close(sv[1]));
    CHECK_ERR(shutdown(sv[1], SHUT_RD), EBADF);
}

/* No network, no socket files; socket calls on other files fail with ENOTSOCK; bad arguments. */
static void test_refused(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char buf1[4];
    CHECK_ERR(socket(AF_INET, SOCK_RAW, 0), EACCES); /* TCP is the loopback's (loopback.c) */
    CHECK_ERR(socket(AF_INET6, SOCK_DGRAM, 0), EACCES);
    CHECK_ERR(socket(AF_UNIX, SOCK_DGRAM, 0), EACCES); /* only streams (unix_sockets.c has them) */
    CHECK_ERR(socket(AF_UNIX, SOCK_STREAM | 0x10000, 0), EINVAL);
    CHECK_ERR(socket(AF_UNIX, SOCK_STREAM, 7), EPROTONOSUPPORT);
    int sv[2], p[2];
    CHECK_ERR(socketpair(AF_INET, SOCK_STREAM, 0, sv), EOPNOTSUPP);
    CHECK_ERR(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv), EOPNOTSUPP);
    CHECK_ERR(syscall(SYS_socketpair, AF_UNIX, SOCK_STREAM, 0, 8), EFAULT);
    OK(pipe(p));
    CHECK_ERR(send(p[1], "x", 1, 0), ENOTSOCK);
    CHECK_ERR(shutdown(p[0], SHUT_RD), ENOTSOCK);
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    CHECK_ERR(syscall(SYS_sendto, sv[0], 8, 4, 0, 0, 0), EFAULT);
    CHECK_ERR(syscall(SYS_recvfrom, sv[0], 8, 4, 0, 0, 0), EFAULT);
    CHECK_ERR(shutdown(sv[0], 7), EINVAL);
    CHECK_ERR(send(sv[0], "x", 1, MSG_OOB), EOPNOTSUPP);
    struct msghdr m = {.msg_iovlen = 5000};
    CHECK_ERR(sendmsg(sv[0], &m, 0), EMSGSIZE);
    /* fd passing (SCM_RIGHTS, what multiprocessing's forkserver and reduction.send_handle use):
     * bad control data fails before anything is sent (unix_sockets.c "scm_*" has the rest) */
    union { struct cmsghdr h; char space[CMSG_SPACE(4 * sizeof(int))]; } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec one = {"x", 1};
    struct msghdr fds = {.msg_iov = &one, .msg_iovlen = 1, .msg_control = &ctl, .msg_controllen = sizeof ctl};
    ctl.h.cmsg_level = SOL_SOCKET;
    ctl.h.cmsg_type = SCM_RIGHTS;
    ctl.h.cmsg_len = (size_t)-1; /* a huge fd count */
    CHECK_ERR(sendmsg(sv[0], &fds, 0), EINVAL);
    int negative = -5;
    ctl.h.cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(&ctl.h), &negative, sizeof(int));
    CHECK_ERR(sendmsg(sv[0], &fds, 0), EBADF);
    fds.msg_control = (void *)8;
    CHECK_ERR(sendmsg(sv[0], &fds, 0), EFAULT);
    fds.msg_controllen = (size_t)1 << 40;
    CHECK_ERR(sendmsg(sv[0], &fds, 0), ENOBUFS);
    CHECK_ERR(syscall(SYS_sendmsg, sv[0], 8, 0), EFAULT); /* the msghdr itself */
    CHECK_ERR(syscall(SYS_recvmsg, sv[0], 8, 0), EFAULT);
    CHECK_ERR(recv(sv[1], buf1, 1, MSG_DONTWAIT), EAGAIN); /* none of it was sent */
    /* a receiver's control buffer (a bad pointer too) gets nothing when no fds came: msg_controllen comes back 0 */
    CHECK_EQ(send(sv[0], "y", 1, 0), 1);
    struct iovec in = {buf1, 1};
    struct msghdr r = {.msg_iov = &in, .msg_iovlen = 1, .msg_control = (void *)8, .msg_controllen = 4096};
    CHECK_EQ(recvmsg(sv[1], &r, 0), 1);
    CHECK(buf1[0] == 'y' && r.msg_controllen == 0 && r.msg_flags == 0, "no control data received");
    /* socket calls on a socketpair end (connected) or a pipe */
    struct sockaddr_un longest = {.sun_family = AF_UNIX};
    memset(longest.sun_path, 'a', sizeof longest.sun_path); /* no terminating NUL: the maximum */
    CHECK_ERR(listen(sv[0], 1), EINVAL);
    CHECK_ERR(connect(sv[0], (struct sockaddr *)&longest, sizeof longest), EISCONN);
    CHECK_ERR(connect(p[0], (struct sockaddr *)&longest, sizeof longest), ENOTSOCK);
    CHECK_ERR(bind(p[0], (struct sockaddr *)&longest, sizeof longest), ENOTSOCK);
    CHECK_ERR(accept(sv[0], NULL, NULL), EINVAL);
    /* accept into a bad address buffer is EFAULT before the connection is taken: the next
     * accept gets it (Linux takes it and then drops it) */
    struct sockaddr_un named = {.sun_family = AF_UNIX, .sun_path = "/tmp/refused.sock"};
    int l = (int)OK(socket(AF_UNIX, SOCK_STREAM, 0)), c = (int)OK(socket(AF_UNIX, SOCK_STREAM, 0));
    OK(bind(l, (struct sockaddr *)&named, sizeof named));
    OK(listen(l, 1));
    OK(connect(c, (struct sockaddr *)&named, sizeof named));
    socklen_t alen = sizeof named;
    CHECK_ERR(accept(l, (struct sockaddr *)8, &alen), EFAULT);
    CHECK_ERR(accept(l, (struct sockaddr *)&named, (socklen_t *)8), EFAULT);
    int s = (int)OK(accept(l, NULL, NULL));
    CHECK_EQ(send(c, "k", 1, 0), 1);
    CHECK_EQ(recv(s, buf1, 1, 0), 1);
    OK(close(s));
    OK(close(c));
    OK(close(l));
    OK(unlink(named.sun_path));
    /* too many sockets: socketpair fails with EMFILE at the fd limit, and the fds come back */
    static int many[8192][2];
    int n = 0;
    while (n < 8192 && socketpair(AF_UNIX, SOCK_STREAM, 0, many[n]) == 0) n++;
    CHECK(n > 100 && n < 8192 && errno == EMFILE, "%d socketpairs, then %s", n, strerror(errno));
    for (int i = 0; i < n; i++) {
        OK(close(many[i][0]));
        OK(close(many[i][1]));
    }
    int again[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, again));
}

/* Level-triggered readiness, MOD/DEL, ONESHOT, timeouts, closed fds and the error cases. */
static void test_epoll(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int ep = OK(epoll_create1(EPOLL_CLOEXEC)), sv[2], p[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    OK(pipe(p));
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0x1111};
    OK(epoll_ctl(ep, EPOLL_CTL_ADD, sv[1], &ev));
    CHECK_ERR(epoll_ctl(ep, EPOLL_CTL_ADD, sv[1], &ev), EEXIST);
    ev = (struct epoll_event){.events = EPOLLIN, .data.u64 = 0x2222};
    OK(epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &ev));
    struct epoll_event got[8];
    /* nothing ready: waits for the timeout */
    int64_t t0 = now_ms();
    CHECK_EQ(epoll_wait(ep, got, 8, 150), 0);
    CHECK(now_ms() - t0 >= 140, "returned after %ld ms", (long)(now_ms() - t0));
    /* ready, and stays ready until read (level-triggered) */
    CHECK_EQ(write(sv[0], "x", 1), 1);
    CHECK_EQ(epoll_wait(ep, got, 8, 0), 1);
    CHECK(got[0].events == EPOLLIN && got[0].data.u64 == 0x1111, "events %x data %lx", got[0].events, (unsigned long)got[0].data.u64);
    CHECK_EQ(epoll_wait(ep, got, 8, -1), 1);
    CHECK_EQ(write(p[1], "y", 1), 1);
    CHECK_EQ(epoll_wait(ep, got, 8, 0), 2);
    CHECK_EQ(epoll_wait(ep, got, 1, 0), 1); /* maxevents */
    char c;
    CHECK_EQ(read(sv[1], &c, 1), 1);
    CHECK_EQ(epoll_wait(ep, got, 8, 0), 1);
    CHECK_EQ(got[0].data.u64, 0x2222);
    /* MOD: also writability; DEL */
    ev = (struct epoll_event){.events = EPOLLIN | EPOLLOUT, .data.u64 = 0x3333};
    OK(epoll_ctl(ep, EPOLL_CTL_MOD, sv[1], &ev));
    CHECK_EQ(epoll_wait(ep, got, 8, 0), 2);
    OK(epoll_ctl(ep, EPOLL_CTL_DEL, p[0], NULL));
    CHECK_ERR(epoll_ctl(ep, EPOLL_CTL_DEL, p[0], NULL), ENOENT);
    CHECK_EQ(epoll_wait(ep, got, 8, 0), 1);
    CHECK(got[0].events == EPOLLOUT && got[0].data.u64 == 0x3333, "events %x", got[0].events);
    /* ONESHOT: reported once, then again after MOD re-arms it */
    ev = (struct epoll_event){.events = EPOLLOUT | EPOLLONESHOT, .data.u64 = 4};
    OK(epoll_ctl(ep, EPOLL_CTL_MOD, sv[1], &ev));
    CHECK_EQ(epoll_wait(ep, got, 8, 0), 1);
    CHECK_EQ(epoll_wait(ep, got, 8, 0), 0);
    OK(epoll_ctl(ep, EPOLL_CTL_MOD, sv[1], &ev));
    CHECK_EQ(epoll_wait(ep, got, 8, 0), 1);
    /* the peer hanging up */
    ev = (struct epoll_event){.events = EPOLLIN | EPOLLRDHUP, .data.u64 = 5};
    OK(epoll_ctl(ep, EPOLL_CTL_MOD, sv[1], &ev));
    OK(close(sv[0]));
    CHECK_EQ(epoll_wait(ep, got, 8, 0), 1);
    CHECK(got[0].events & EPOLLRDHUP && got[0].events & EPOLLHUP, "events %x", got[0].events);
    /* closing the fd drops its item: a new file at that fd number is not watched, and can be added */
    OK(close(sv[1]));
    int again = OK(dup2(p[1], sv[1]));
    CHECK_EQ(epoll_wait(ep, got, 8, 0), 0);
    ev = (struct epoll_event){.events = EPOLLOUT, .data.u64 = 6};
    OK(epoll_ctl(ep, EPOLL_CTL_ADD, again, &ev));
    CHECK_EQ(epoll_wait(ep, got, 8, 0), 1);
    /* nesting: an epoll fd is readable when one of its items is ready; cycles are refused */
    int outer = OK(epoll_create(1));
    ev = (struct epoll_event){.events = EPOLLIN, .data.u64 = 7};
    OK(epoll_ctl(outer, EPOLL_CTL_ADD, ep, &ev));
    CHECK_EQ(epoll_wait(outer, got, 8, 0), 1);
    CHECK_ERR(epoll_ctl(ep, EPOLL_CTL_ADD, outer, &ev), ELOOP);
    struct pollfd pfd = {.fd = ep, .events = POLLIN};
    CHECK_EQ(poll(&pfd, 1, 0), 1);
    /* epoll_pwait2 takes a timespec */
    struct timespec zero = {0, 0}, bad = {0, 2000000000};
    CHECK_EQ(syscall(SYS_epoll_pwait2, outer, got, 8, &zero, NULL, 8), 1);
    CHECK_ERR(syscall(SYS_epoll_pwait2, outer, got, 8, &bad, NULL, 8), EINVAL);
    /* errors */
    int file = OK(open("/tmp/plain", O_CREAT | O_RDWR, 0600));
    CHECK_ERR(epoll_ctl(ep, EPOLL_CTL_ADD, file, &ev), EPERM);
    CHECK_ERR(epoll_ctl(ep, EPOLL_CTL_ADD, ep, &ev), EINVAL);
    CHECK_ERR(epoll_ctl(file, EPOLL_CTL_ADD, p[0], &ev), EINVAL);
    CHECK_ERR(epoll_ctl(ep, EPOLL_CTL_ADD, 999, &ev), EBADF);
    CHECK_ERR(epoll_ctl(ep, 42, p[0], &ev), EINVAL);
    CHECK_ERR(syscall(SYS_epoll_ctl, ep, EPOLL_CTL_MOD, p[0], 8), EFAULT);
    CHECK_ERR(epoll_wait(ep, got, 0, 0), EINVAL);
    CHECK_ERR(syscall(SYS_epoll_wait, ep, 8, 8, 0), EFAULT);
    CHECK_ERR(epoll_create(0), EINVAL);
    CHECK_ERR(epoll_create1(1), EINVAL);
}

/* Set up queued bytes and epoll items, then wait on the UART: the host snapshots us there and
 * resumes forks; each fork must find the same state and consume it privately. */
static void test_snapshot_state(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int sv[2], p[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    OK(pipe(p));
    int ep = OK(epoll_create1(0));
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0xabc};
    OK(epoll_ctl(ep, EPOLL_CTL_ADD, sv[1], &ev));
    ev.data.u64 = 0xdef;
    OK(epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &ev));
    CHECK_EQ(send(sv[0], "socket", 6, 0), 6);
    CHECK_EQ(write(p[1], "pipe", 4), 4);
    int tty = OK(open("/dev/ttyS0", O_RDWR));
    printf("ready\n");
    fflush(stdout);
    char go[8];
    OK(read(tty, go, sizeof go)); /* the host snapshots here */
    struct epoll_event got[4];
    CHECK_EQ(epoll_wait(ep, got, 4, 0), 2);
    uint64_t seen = got[0].data.u64 | got[1].data.u64;
    CHECK_EQ(seen, 0xabc | 0xdef);
    char buf[16] = {0};
    CHECK_EQ(recv(sv[1], buf, sizeof buf, 0), 6);
    CHECK(!memcmp(buf, "socket", 6), "socket bytes %.6s", buf);
    CHECK_EQ(read(p[0], buf, sizeof buf), 4);
    CHECK(!memcmp(buf, "pipe", 4), "pipe bytes %.4s", buf);
    CHECK_EQ(epoll_wait(ep, got, 4, 0), 0);
    CHECK_EQ(send(sv[1], "back", 4, 0), 4); /* the peer end is live too */
    CHECK_EQ(recv(sv[0], buf, sizeof buf, 0), 4);
}

static const zb_test tests[] = {
    {"pair", test_pair},
    {"refused", test_refused},
    {"epoll", test_epoll},
    {"snapshot_state", test_snapshot_state},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
