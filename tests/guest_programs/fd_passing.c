/* fd_passing.c - SCM_RIGHTS over AF_UNIX stream sockets: fds passed over a socketpair and over a
 * named connection and used through the received fd, the stream boundaries a read stops at, the
 * control buffer's truncation (MSG_CTRUNC), MSG_CMSG_CLOEXEC, MSG_PEEK, a read without a control
 * buffer closing the references, the errors of bad control data, a sender that exits first, and
 * every file kind in flight. Every test but "inflight_limit" also passes on Linux
 * (tests/test_guest_sockets.py runs them there too), so the checks are Linux's behaviour.
 */
#include "check.h"

#include <poll.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>

#define MAX_FDS 253 /* Linux's SCM_MAX_FD */

typedef union {
    struct cmsghdr h;
    char space[CMSG_SPACE(sizeof(int) * (MAX_FDS + 3))];
} control;

/* sendmsg of len bytes with n fds in one SCM_RIGHTS message (none: no control data). */
static long send_fds(int s, const void *data, size_t len, const int *fds, int n, int flags) {
    control c;
    memset(&c, 0, sizeof c);
    struct iovec iov = {(void *)data, len};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n) {
        m.msg_control = &c;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
        c.h.cmsg_level = SOL_SOCKET;
        c.h.cmsg_type = SCM_RIGHTS;
        c.h.cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
        memcpy(CMSG_DATA(&c.h), fds, sizeof(int) * (size_t)n);
    }
    return sendmsg(s, &m, flags);
}

typedef struct {
    int n, fds[MAX_FDS + 3];
    int cmsgs;             /* SCM_RIGHTS headers seen */
    int flags;             /* msg_flags */
    size_t controllen;     /* msg_controllen after the call */
} received;

/* recvmsg of up to len bytes with a control buffer of ctllen bytes; the fds it got into *got. */
static long recv_fds(int s, void *buf, size_t len, size_t ctllen, int flags, received *got) {
    control c;
    memset(&c, 0, sizeof c);
    memset(got, 0, sizeof *got);
    struct iovec iov = {buf, len};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctllen ? &c : NULL, .msg_controllen = ctllen};
    long r = recvmsg(s, &m, flags);
    if (r < 0) return r;
    got->flags = m.msg_flags;
    got->controllen = m.msg_controllen;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
        got->cmsgs++;
        int k = (int)((h->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        memcpy(got->fds + got->n, CMSG_DATA(h), sizeof(int) * (size_t)k);
        got->n += k;
    }
    return r;
}

static void close_received(received *got) {
    for (int i = 0; i < got->n; i++) close(got->fds[i]);
    got->n = 0;
}

/* The lowest fd free now. */
static int lowest_free(void) {
    int fd = (int)OK(dup(0));
    close(fd);
    return fd;
}

static int temp_file(const char *text) {
    char name[] = "/tmp/zbscmXXXXXX";
    int fd = (int)OK(mkstemp(name));
    OK(unlink(name));
    CHECK_EQ(write(fd, text, strlen(text)), (long)strlen(text));
    return fd;
}

/* Pass a pipe's read end, its write end and a file over `a` to `b`, and use them through the
 * received fds. */
static void pass_and_use(int a, int b) {
    int p[2];
    OK(pipe(p));
    int file = temp_file("file text");
    int three[3] = {p[0], p[1], file};
    CHECK_EQ(send_fds(a, "hello", 5, three, 3, 0), 5);
    int want = lowest_free();
    char buf[32] = {0};
    received got;
    CHECK_EQ(recv_fds(b, buf, sizeof buf, CMSG_SPACE(3 * sizeof(int)), 0, &got), 5);
    CHECK_STR(buf, "hello");
    CHECK_EQ(got.n, 3);
    CHECK_EQ(got.cmsgs, 1);
    CHECK_EQ(got.flags, 0);
    CHECK_EQ(got.controllen, CMSG_SPACE(3 * sizeof(int)));
    CHECK_EQ(got.fds[0], want); /* the lowest free fds, in order */
    CHECK(got.fds[1] > got.fds[0] && got.fds[2] > got.fds[1], "fds %d %d %d", got.fds[0], got.fds[1], got.fds[2]);
    CHECK_EQ(fcntl(got.fds[0], F_GETFD), 0); /* no close-on-exec without MSG_CMSG_CLOEXEC */
    OK(close(p[0]));
    OK(close(p[1]));
    OK(close(file));
    /* the same open file descriptions: the pipe works through the new fds, the file's offset is shared */
    CHECK_EQ(write(got.fds[1], "through", 7), 7);
    memset(buf, 0, sizeof buf);
    CHECK_EQ(read(got.fds[0], buf, sizeof buf), 7);
    CHECK_STR(buf, "through");
    CHECK_EQ(lseek(got.fds[2], 0, SEEK_CUR), 9);
    memset(buf, 0, sizeof buf);
    CHECK_EQ(pread(got.fds[2], buf, sizeof buf, 0), 9);
    CHECK_STR(buf, "file text");
    close_received(&got);
}

/* Over a socketpair, both ways; MSG_CMSG_CLOEXEC. */
static void test_pair(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int sv[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    pass_and_use(sv[0], sv[1]);
    pass_and_use(sv[1], sv[0]);
    int file = temp_file("x");
    CHECK_EQ(send_fds(sv[0], "c", 1, &file, 1, 0), 1);
    char b;
    received got;
    CHECK_EQ(recv_fds(sv[1], &b, 1, CMSG_SPACE(sizeof(int)), MSG_CMSG_CLOEXEC, &got), 1);
    CHECK_EQ(got.n, 1);
    CHECK_EQ(fcntl(got.fds[0], F_GETFD), FD_CLOEXEC);
    CHECK_EQ(got.flags, MSG_CMSG_CLOEXEC); /* Linux reports the flag back */
    close_received(&got);
    /* sendmsg with fds on a pipe: not a socket */
    int p[2];
    OK(pipe(p));
    CHECK_ERR(send_fds(p[1], "x", 1, &file, 1, 0), ENOTSOCK);
    OK(close(file));
    OK(close(sv[0]));
    OK(close(sv[1]));
}

/* Over a named connection (bind, listen, connect, accept), both ways. */
static void test_named(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char dir[] = "/tmp/zbscmXXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/server", dir);
    int l = (int)OK(socket(AF_UNIX, SOCK_STREAM, 0));
    OK(bind(l, (struct sockaddr *)&a, sizeof a));
    OK(listen(l, 4));
    int c = (int)OK(socket(AF_UNIX, SOCK_STREAM, 0));
    OK(connect(c, (struct sockaddr *)&a, sizeof a));
    int s = (int)OK(accept(l, NULL, NULL));
    pass_and_use(c, s);
    pass_and_use(s, c);
    /* the listening socket itself, passed: accept works through the received fd */
    CHECK_EQ(send_fds(c, "L", 1, &l, 1, 0), 1);
    char b;
    received got;
    CHECK_EQ(recv_fds(s, &b, 1, CMSG_SPACE(sizeof(int)), 0, &got), 1);
    CHECK_EQ(got.n, 1);
    int c2 = (int)OK(socket(AF_UNIX, SOCK_STREAM, 0));
    OK(connect(c2, (struct sockaddr *)&a, sizeof a));
    int s2 = (int)OK(accept(got.fds[0], NULL, NULL));
    CHECK_EQ(send(c2, "k", 1, 0), 1);
    CHECK_EQ(recv(s2, &b, 1, 0), 1);
    CHECK_EQ(b, 'k');
    close_received(&got);
    OK(close(c2));
    OK(close(s2));
    OK(close(c));
    OK(close(s));
    OK(close(l));
    OK(unlink(a.sun_path));
    OK(rmdir(dir));
}

/* A read never goes past the end of the bytes fds came with; it takes bytes before them. */
static void test_boundaries(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int sv[2], p[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    OK(pipe(p));
    char buf[64] = {0};
    received got;
    /* plain bytes, bytes with an fd, plain bytes: the first read takes the first two, and the fd */
    CHECK_EQ(send(sv[0], "ab", 2, 0), 2);
    CHECK_EQ(send_fds(sv[0], "cd", 2, &p[0], 1, 0), 2);
    CHECK_EQ(send(sv[0], "ef", 2, 0), 2);
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(sizeof(int)), 0, &got), 4);
    CHECK(!memcmp(buf, "abcd", 4), "read %.4s", buf);
    CHECK_EQ(got.n, 1);
    close_received(&got);
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(sizeof(int)), 0, &got), 2);
    CHECK_EQ(got.n, 0);
    CHECK_EQ(got.controllen, 0);
    /* two messages with fds: two reads, never merged */
    CHECK_EQ(send_fds(sv[0], "12", 2, &p[0], 1, 0), 2);
    CHECK_EQ(send_fds(sv[0], "34", 2, &p[1], 1, 0), 2);
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(4 * sizeof(int)), 0, &got), 2);
    CHECK(!memcmp(buf, "12", 2), "read %.2s", buf);
    CHECK_EQ(got.n, 1);
    close_received(&got);
    /* a read of part of the message gets its fds with its first byte; the rest comes without */
    CHECK_EQ(recv_fds(sv[1], buf, 1, CMSG_SPACE(4 * sizeof(int)), 0, &got), 1);
    CHECK_EQ(buf[0], '3');
    CHECK_EQ(got.n, 1);
    close_received(&got);
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(4 * sizeof(int)), 0, &got), 1);
    CHECK_EQ(buf[0], '4');
    CHECK_EQ(got.n, 0);
    /* readv stops at the end of the fd's bytes too, even when a buffer ends exactly there */
    CHECK_EQ(send_fds(sv[0], "xy", 2, &p[0], 1, 0), 2);
    CHECK_EQ(send(sv[0], "zw", 2, 0), 2);
    char v1[2], v2[2];
    struct iovec iov[2] = {{v1, 2}, {v2, 2}};
    CHECK_EQ(readv(sv[1], iov, 2), 2);
    CHECK_EQ(recv(sv[1], buf, sizeof buf, 0), 2);
    /* MSG_PEEK installs a copy of the fds each time and leaves them; the read installs them again */
    CHECK_EQ(send_fds(sv[0], "pk", 2, &p[0], 1, 0), 2);
    CHECK_EQ(send(sv[0], "zz", 2, 0), 2);
    received peek1, peek2;
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(sizeof(int)), MSG_PEEK, &peek1), 2);
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(sizeof(int)), MSG_PEEK, &peek2), 2);
    CHECK_EQ(peek1.n, 1);
    CHECK_EQ(peek2.n, 1);
    CHECK(peek1.fds[0] != peek2.fds[0], "two copies: %d %d", peek1.fds[0], peek2.fds[0]);
    close_received(&peek1);
    close_received(&peek2);
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(sizeof(int)), 0, &got), 2);
    CHECK_EQ(got.n, 1);
    close_received(&got);
    CHECK_EQ(recv(sv[1], buf, sizeof buf, 0), 2);
    /* a sendmsg of no bytes with fds sends nothing (a stream has nothing to attach them to) */
    CHECK_EQ(send_fds(sv[0], "", 0, &p[0], 1, 0), 0);
    CHECK_EQ(send(sv[0], "n", 1, 0), 1);
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(sizeof(int)), 0, &got), 1);
    CHECK_EQ(got.n, 0);
    /* a read without a control buffer closes the references: the pipe's only write end went */
    int q[2];
    OK(pipe(q));
    CHECK_EQ(send_fds(sv[0], "rd", 2, &q[1], 1, 0), 2);
    OK(close(q[1]));
    CHECK_EQ(read(sv[1], buf, sizeof buf), 2);
    CHECK_EQ(read(q[0], buf, 1), 0); /* EOF */
    /* and so does recv, and recvmsg with no control buffer (MSG_CTRUNC) */
    OK(pipe(q));
    CHECK_EQ(send_fds(sv[0], "rv", 2, &q[1], 1, 0), 2);
    CHECK_EQ(send_fds(sv[0], "rm", 2, &q[1], 1, 0), 2);
    OK(close(q[1]));
    CHECK_EQ(recv(sv[1], buf, sizeof buf, 0), 2);
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, 0, 0, &got), 2);
    CHECK_EQ(got.flags, MSG_CTRUNC);
    CHECK_EQ(read(q[0], buf, 1), 0);
    OK(close(q[0]));
    OK(close(p[0]));
    OK(close(p[1]));
    OK(close(sv[0]));
    OK(close(sv[1]));
}

/* A control buffer too small for the fds: those that fit, the rest closed, MSG_CTRUNC; a full fd
 * table the same; a buffer the receiver cannot write gets none. */
static void test_truncated(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int sv[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    int r[3], w[3];
    for (int i = 0; i < 3; i++) {
        int p[2];
        OK(pipe(p));
        r[i] = p[0];
        w[i] = p[1];
    }
    char buf[8];
    received got;
    CHECK_EQ(send_fds(sv[0], "tr", 2, w, 3, 0), 2);
    for (int i = 0; i < 3; i++) OK(close(w[i]));
    /* room for one int after the header: one fd */
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_LEN(sizeof(int)), 0, &got), 2);
    CHECK_EQ(got.n, 1);
    CHECK_EQ(got.flags, MSG_CTRUNC);
    CHECK_EQ(got.controllen, CMSG_LEN(sizeof(int))); /* CMSG_SPACE, cut to the buffer */
    CHECK_EQ(write(got.fds[0], "1", 1), 1);
    CHECK_EQ(read(r[0], buf, 1), 1);
    CHECK_EQ(read(r[1], buf, 1), 0); /* closed: EOF */
    CHECK_EQ(read(r[2], buf, 1), 0);
    close_received(&got);
    CHECK_EQ(read(r[0], buf, 1), 0);
    for (int i = 0; i < 3; i++) OK(close(r[i]));
    /* CMSG_SPACE(sizeof(int)) holds two: Linux counts ints after the header, not aligned spaces */
    int three[3] = {0, 1, 2};
    CHECK_EQ(send_fds(sv[0], "tr", 2, three, 3, 0), 2);
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(sizeof(int)), 0, &got), 2);
    CHECK_EQ(got.n, 2);
    CHECK_EQ(got.flags, MSG_CTRUNC);
    CHECK_EQ(got.controllen, CMSG_SPACE(sizeof(int)));
    close_received(&got);
    /* a header's room only: none */
    CHECK_EQ(send_fds(sv[0], "tr", 2, three, 3, 0), 2);
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, sizeof(struct cmsghdr), 0, &got), 2);
    CHECK_EQ(got.n, 0);
    CHECK_EQ(got.flags, MSG_CTRUNC);
    CHECK_EQ(got.controllen, 0);
    /* a control buffer at a bad address: the bytes come, the fds do not (MSG_CTRUNC) */
    CHECK_EQ(send_fds(sv[0], "ba", 2, three, 1, 0), 2);
    struct iovec iov = {buf, sizeof buf};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = (void *)8, .msg_controllen = 64};
    int before = lowest_free();
    CHECK_EQ(recvmsg(sv[1], &m, 0), 2);
    CHECK_EQ(m.msg_flags, MSG_CTRUNC);
    CHECK_EQ(m.msg_controllen, 0);
    CHECK_EQ(lowest_free(), before); /* nothing installed */
    /* a full fd table: the fds that fit, the rest closed, MSG_CTRUNC (Linux: EMFILE ends the list) */
    struct rlimit lim = {1024, 1024};
    setrlimit(RLIMIT_NOFILE, &lim); /* the guest's table has 1024 fds; the host's may have more */
    CHECK_EQ(send_fds(sv[0], "em", 2, three, 3, 0), 2);
    int filled[1024], n = 0;
    for (int fd; n < 1024 && (fd = dup(0)) >= 0;) filled[n++] = fd;
    CHECK(n > 3, "filled %d", n);
    OK(close(filled[--n])); /* one free fd */
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(3 * sizeof(int)), 0, &got), 2);
    CHECK_EQ(got.n, 1);
    CHECK_EQ(got.flags, MSG_CTRUNC);
    close_received(&got);
    for (int i = 0; i < n; i++) close(filled[i]);
    OK(close(sv[0]));
    OK(close(sv[1]));
}

/* Bad control data fails before anything is sent, with Linux's errors. */
static void test_errors(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int sv[2], p[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    OK(pipe(p));
    control c;
    memset(&c, 0, sizeof c);
    struct iovec one = {"x", 1};
    struct msghdr m = {.msg_iov = &one, .msg_iovlen = 1, .msg_control = &c, .msg_controllen = CMSG_SPACE(sizeof(int))};
    c.h.cmsg_level = SOL_SOCKET;
    c.h.cmsg_type = SCM_RIGHTS + 7; /* no such type */
    c.h.cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(&c.h), &p[0], sizeof(int));
    CHECK_ERR(sendmsg(sv[0], &m, 0), EINVAL);
    c.h.cmsg_type = SCM_RIGHTS;
    c.h.cmsg_len = sizeof(struct cmsghdr) - 1; /* shorter than its header */
    CHECK_ERR(sendmsg(sv[0], &m, 0), EINVAL);
    c.h.cmsg_len = CMSG_SPACE(sizeof(int)) + 1; /* past msg_controllen */
    CHECK_ERR(sendmsg(sv[0], &m, 0), EINVAL);
    c.h.cmsg_len = (size_t)-1;
    CHECK_ERR(sendmsg(sv[0], &m, 0), EINVAL);
    c.h.cmsg_len = CMSG_LEN(sizeof(int));
    int closed = (int)OK(dup(p[0]));
    OK(close(closed));
    memcpy(CMSG_DATA(&c.h), &closed, sizeof(int));
    CHECK_ERR(sendmsg(sv[0], &m, 0), EBADF);
    int negative = -1;
    memcpy(CMSG_DATA(&c.h), &negative, sizeof(int));
    CHECK_ERR(sendmsg(sv[0], &m, 0), EBADF);
    int huge = 1 << 30;
    memcpy(CMSG_DATA(&c.h), &huge, sizeof(int));
    CHECK_ERR(sendmsg(sv[0], &m, 0), EBADF);
    memcpy(CMSG_DATA(&c.h), &p[0], sizeof(int));
    m.msg_controllen = (size_t)1 << 20; /* past optmem_max */
    CHECK_ERR(sendmsg(sv[0], &m, 0), ENOBUFS);
    m.msg_controllen = (size_t)1 << 62;
    CHECK_ERR(sendmsg(sv[0], &m, 0), ENOBUFS);
    m.msg_controllen = CMSG_SPACE(sizeof(int));
    m.msg_control = (void *)8;
    CHECK_ERR(sendmsg(sv[0], &m, 0), EFAULT);
    m.msg_control = (char *)MAP_FAILED;
    CHECK_ERR(sendmsg(sv[0], &m, 0), EFAULT);
    m.msg_control = &c;
    m.msg_controllen = 8; /* shorter than a header: no control data at all */
    CHECK_EQ(sendmsg(sv[0], &m, 0), 1);
    m.msg_control = &c;
    /* too many fds: SCM_MAX_FD (253) in one message, over all its headers */
    int many[MAX_FDS + 1];
    for (int i = 0; i < MAX_FDS + 1; i++) many[i] = p[0];
    CHECK_ERR(send_fds(sv[0], "m", 1, many, MAX_FDS + 1, 0), EINVAL);
    /* two headers, the second with a bad fd: EBADF, nothing sent */
    memset(&c, 0, sizeof c);
    struct cmsghdr *h = &c.h;
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &p[0], sizeof(int));
    struct cmsghdr *h2 = (struct cmsghdr *)((char *)h + CMSG_SPACE(sizeof(int)));
    h2->cmsg_level = SOL_SOCKET;
    h2->cmsg_type = SCM_RIGHTS;
    h2->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h2), &closed, sizeof(int));
    m.msg_controllen = 2 * CMSG_SPACE(sizeof(int));
    CHECK_ERR(sendmsg(sv[0], &m, 0), EBADF);
    char buf[8];
    CHECK_EQ(recv(sv[1], buf, sizeof buf, MSG_DONTWAIT), 1); /* the one good send above */
    CHECK_ERR(recv(sv[1], buf, sizeof buf, MSG_DONTWAIT), EAGAIN); /* nothing else was sent */
    /* two good headers: the receiver gets both fds in one header */
    memcpy(CMSG_DATA(h2), &p[1], sizeof(int));
    CHECK_EQ(sendmsg(sv[0], &m, 0), 1);
    received got;
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(4 * sizeof(int)), 0, &got), 1);
    CHECK_EQ(got.n, 2);
    CHECK_EQ(got.cmsgs, 1);
    close_received(&got);
    /* another level is ignored, a header with no fds too; trailing bytes shorter than a header too */
    h->cmsg_level = SOL_SOCKET + 5;
    h->cmsg_type = 99;
    h2->cmsg_len = CMSG_LEN(2); /* no whole fd */
    m.msg_controllen = 2 * CMSG_SPACE(sizeof(int)) + 7;
    CHECK_EQ(sendmsg(sv[0], &m, 0), 1);
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(4 * sizeof(int)), 0, &got), 1);
    CHECK_EQ(got.n, 0);
    CHECK_EQ(got.controllen, 0);
    CHECK_EQ(got.flags, 0);
    /* the most: 253 fds, received in one header */
    CHECK_EQ(send_fds(sv[0], "M", 1, many, MAX_FDS, 0), 1);
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(MAX_FDS * sizeof(int)), 0, &got), 1);
    CHECK_EQ(got.n, MAX_FDS);
    CHECK_EQ(got.flags, 0);
    close_received(&got);
    /* a shut-down socket: EPIPE (SIGPIPE unless MSG_NOSIGNAL), nothing in flight */
    OK(shutdown(sv[0], SHUT_WR));
    CHECK_ERR(send_fds(sv[0], "s", 1, &p[0], 1, MSG_NOSIGNAL), EPIPE);
    OK(close(sv[0]));
    OK(close(sv[1]));
    OK(close(p[0]));
    OK(close(p[1]));
}

/* The sender exits before the receiver reads: what it sent stays in flight and works. */
static void test_sender_exits(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int sv[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[1]);
        int p[2];
        char name[] = "/tmp/zbscmXXXXXX";
        int file = mkstemp(name);
        int ok = file >= 0 && unlink(name) == 0 && write(file, "from the child", 14) == 14 && pipe(p) == 0 &&
                 write(p[1], "piped", 5) == 5;
        int fds[3] = {file, p[0], sv[0]};
        ok = ok && send_fds(sv[0], "bye", 3, fds, 3, 0) == 3;
        _exit(ok ? 0 : 3); /* its write end of the pipe goes with it: EOF after "piped" */
    }
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's status %#x", status);
    OK(close(sv[0]));
    char buf[32] = {0};
    received got;
    CHECK_EQ(recv_fds(sv[1], buf, sizeof buf, CMSG_SPACE(3 * sizeof(int)), 0, &got), 3);
    CHECK_STR(buf, "bye");
    CHECK_EQ(got.n, 3);
    memset(buf, 0, sizeof buf);
    CHECK_EQ(pread(got.fds[0], buf, sizeof buf, 0), 14);
    CHECK_STR(buf, "from the child");
    memset(buf, 0, sizeof buf);
    CHECK_EQ(read(got.fds[1], buf, sizeof buf), 5);
    CHECK_STR(buf, "piped");
    CHECK_EQ(read(got.fds[1], buf, sizeof buf), 0);
    /* the child's end of the socketpair, received: the other end of our own */
    CHECK_EQ(send(got.fds[2], "self", 4, 0), 4);
    CHECK_EQ(recv(sv[1], buf, sizeof buf, 0), 4);
    close_received(&got);
    CHECK_EQ(recv(sv[1], buf, sizeof buf, 0), 0); /* its last end closed now */
    OK(close(sv[1]));
}

/* Every kind of file in flight at once, received with the same type; then all of it in flight
 * again and every fd closed unreceived (dropped with the socket). */
static void test_kinds(int argc, char **argv) {
    (void)argc;
    int fds[16], n = 0;
    fds[n++] = (int)OK(open(argv[0], O_RDONLY));                        /* the program: a file of the view or the host */
    fds[n++] = temp_file("overlay");                                    /* a /tmp file */
    fds[n++] = (int)OK(open("/tmp", O_RDONLY | O_DIRECTORY));           /* a directory */
    fds[n++] = (int)OK(open("/dev/null", O_RDWR));                      /* a device */
    fds[n++] = (int)OK(dup(1));                                         /* stdout */
    int p[2], sv[2];
    OK(pipe(p));
    fds[n++] = p[0];
    fds[n++] = p[1];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    fds[n++] = (int)OK(socket(AF_UNIX, SOCK_STREAM, 0));                /* unconnected */
    fds[n++] = (int)OK(epoll_create1(0));
    fds[n++] = (int)OK(eventfd(3, 0));
    int pty = open("/dev/ptmx", O_RDWR | O_NOCTTY);                     /* a pty, where there is one */
    if (pty >= 0) fds[n++] = pty;
    fds[n++] = sv[0];                                                   /* the sending socket itself */
    fds[n++] = sv[1];                                                   /* the receiving one */
    struct stat want[16];
    for (int i = 0; i < n; i++) OK(fstat(fds[i], &want[i]));
    CHECK_EQ(send_fds(sv[0], "k", 1, fds, n, 0), 1);
    char b;
    received got;
    CHECK_EQ(recv_fds(sv[1], &b, 1, CMSG_SPACE(16 * sizeof(int)), 0, &got), 1);
    CHECK_EQ(got.n, n);
    for (int i = 0; i < got.n; i++) {
        struct stat st;
        OK(fstat(got.fds[i], &st));
        CHECK((st.st_mode & S_IFMT) == (want[i].st_mode & S_IFMT), "fd %d: mode %o, want %o", i, st.st_mode, want[i].st_mode);
    }
    uint64_t v = 0;
    CHECK_EQ(read(got.fds[9], &v, sizeof v), 8); /* the eventfd's counter, through the new fd */
    CHECK_EQ(v, 3);
    close_received(&got);
    /* in flight again, twice, and everything closed without receiving it: the socket ends drop it */
    CHECK_EQ(send_fds(sv[0], "k", 1, fds, n, 0), 1);
    CHECK_EQ(send_fds(sv[1], "k", 1, fds, n, 0), 1);
    for (int i = 0; i < n; i++) OK(close(fds[i]));
    /* a pipe whose only write end was in flight reads EOF once it is dropped */
    int q[2], s2[2];
    OK(pipe(q));
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, s2));
    CHECK_EQ(send_fds(s2[0], "q", 1, &q[1], 1, 0), 1);
    OK(close(q[1]));
    OK(close(s2[1])); /* the receiving end: its queue goes, with the write end */
    char c;
    CHECK_EQ(read(q[0], &c, 1), 0);
    OK(close(s2[0]));
    OK(close(q[0]));
}

/* Sockets in flight on themselves (cycles), then every fd closed: on Linux the garbage collector
 * frees them; in the sandbox they live until its family ends (tests/test_guest_sockets.py looks). */
static void test_cycle(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int sv[2], a[2], b[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    CHECK_EQ(send_fds(sv[0], "s", 1, &sv[1], 1, 0), 1); /* sv[1] in flight to itself */
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, a));
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, b));
    CHECK_EQ(send_fds(a[0], "a", 1, &b[1], 1, 0), 1); /* b's receiving end on a's stream */
    CHECK_EQ(send_fds(b[0], "b", 1, &a[1], 1, 0), 1); /* and a's on b's */
    int all[6] = {sv[0], sv[1], a[0], a[1], b[0], b[1]};
    for (int i = 0; i < 6; i++) OK(close(all[i]));
    printf("in flight: 3\n");
}

/* The sandbox's bound on references in flight (1024): ETOOMANYREFS past it, and room again once
 * received. Only in the guest: Linux's bound is RLIMIT_NOFILE per user, and root has none. */
static void test_inflight_limit(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int sv[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    int many[MAX_FDS];
    for (int i = 0; i < MAX_FDS; i++) many[i] = 0;
    for (int i = 0; i < 4; i++) CHECK_EQ(send_fds(sv[0], "m", 1, many, MAX_FDS, 0), 1); /* 1012 */
    CHECK_EQ(send_fds(sv[0], "m", 1, many, 12, 0), 1);                                   /* 1024 */
    CHECK_ERR(send_fds(sv[0], "m", 1, many, 1, 0), ETOOMANYREFS);
    char b;
    received got;
    CHECK_EQ(recv_fds(sv[1], &b, 1, 0, 0, &got), 1); /* 253 closed */
    CHECK_EQ(got.flags, MSG_CTRUNC);
    CHECK_EQ(send_fds(sv[0], "m", 1, many, 1, 0), 1);
    OK(close(sv[0]));
    OK(close(sv[1])); /* the rest dropped with it */
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    CHECK_EQ(send_fds(sv[0], "m", 1, many, MAX_FDS, 0), 1); /* room again */
    CHECK_EQ(recv_fds(sv[1], &b, 1, CMSG_SPACE(MAX_FDS * sizeof(int)), 0, &got), 1);
    CHECK_EQ(got.n, MAX_FDS);
    close_received(&got);
}

/* A snapshot while an fd is in flight is refused (tests/test_guest_sockets.py takes one at each
 * "ready"): once it is received, snapshots work again. */
static void test_snapshot(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int sv[2], p[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    OK(pipe(p));
    CHECK_EQ(send_fds(sv[0], "s", 1, &p[0], 1, 0), 1);
    int tty = (int)OK(open("/dev/ttyS0", O_RDWR));
    char c;
    printf("ready: in flight\n");
    fflush(stdout);
    CHECK_EQ(read(tty, &c, 1), 1); /* the host snapshots here */
    received got;
    CHECK_EQ(recv_fds(sv[1], &c, 1, CMSG_SPACE(sizeof(int)), 0, &got), 1);
    CHECK_EQ(got.n, 1);
    close_received(&got);
    printf("ready: received\n");
    fflush(stdout);
    CHECK_EQ(read(tty, &c, 1), 1);
}

static const zb_test tests[] = {
    {"pair", test_pair},
    {"named", test_named},
    {"boundaries", test_boundaries},
    {"truncated", test_truncated},
    {"errors", test_errors},
    {"sender_exits", test_sender_exits},
    {"kinds", test_kinds},
    {"cycle", test_cycle},
    {"inflight_limit", test_inflight_limit},
    {"snapshot", test_snapshot},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
