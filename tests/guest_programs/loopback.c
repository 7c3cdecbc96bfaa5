/* loopback.c - TCP on the loopback: a listener and its connections on 127.0.0.1 and ::1, the
 * addresses each call reports, the port namespace (ephemeral ports, EADDRINUSE, listen without
 * bind), dual-stack listeners, the options, and a connection between two processes. Every test but
 * "unreachable" also passes on Linux (tests/test_guest_sockets.py runs them there too), so the
 * checks are Linux's behaviour.
 */
#include "check.h"
#include "children.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/utsname.h>

static int in_guest(void) {
    struct utsname u;
    return uname(&u) == 0 && !strcmp(u.nodename, "zeroboot");
}

static struct sockaddr_in v4(const char *ip, uint16_t port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    CHECK_EQ(inet_pton(AF_INET, ip, &a.sin_addr), 1);
    return a;
}

static struct sockaddr_in6 v6(const char *ip, uint16_t port) {
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
    CHECK_EQ(inet_pton(AF_INET6, ip, &a.sin6_addr), 1);
    return a;
}

/* A listener on addr (port 0: a free one); its port. */
static int listener(const void *addr, socklen_t len, uint16_t *port) {
    int family = ((const struct sockaddr *)addr)->sa_family;
    int l = (int)OK(socket(family, SOCK_STREAM, 0));
    int on = 1;
    OK(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on));
    OK(bind(l, addr, len));
    OK(listen(l, 8));
    struct sockaddr_in6 got;
    socklen_t glen = sizeof got;
    OK(getsockname(l, (struct sockaddr *)&got, &glen));
    *port = ntohs(got.sin6_port); /* sin_port and sin6_port are at the same offset */
    CHECK(*port != 0, "listener port 0");
    return l;
}

static void ip_of(const struct sockaddr *a, char *out, size_t n) {
    const void *src = a->sa_family == AF_INET ? (const void *)&((const struct sockaddr_in *)a)->sin_addr
                                              : (const void *)&((const struct sockaddr_in6 *)a)->sin6_addr;
    CHECK(inet_ntop(a->sa_family, src, out, (socklen_t)n) != NULL, "inet_ntop: %s", strerror(errno));
}

/* 127.0.0.1: the names both ends report, bytes both ways, EOF after shutdown, the options. */
static void test_tcp4(int argc, char **argv) {
    (void)argc;
    (void)argv;
    uint16_t port;
    struct sockaddr_in any = v4("127.0.0.1", 0);
    int l = listener(&any, sizeof any, &port);
    int c = (int)OK(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_TCP));
    struct sockaddr_in to = v4("127.0.0.1", port), got;
    socklen_t len = sizeof got;
    CHECK_ERR(getpeername(c, (struct sockaddr *)&got, &len), ENOTCONN);
    OK(connect(c, (struct sockaddr *)&to, sizeof to));
    CHECK_ERR(connect(c, (struct sockaddr *)&to, sizeof to), EISCONN);
    struct sockaddr_in peer;
    len = sizeof peer;
    int s = (int)OK(accept(l, (struct sockaddr *)&peer, &len));
    CHECK_EQ(len, sizeof peer);
    char ip[64];
    ip_of((struct sockaddr *)&peer, ip, sizeof ip);
    CHECK_STR(ip, "127.0.0.1");
    len = sizeof got;
    OK(getsockname(c, (struct sockaddr *)&got, &len));
    CHECK_EQ(got.sin_port, peer.sin_port); /* the client's ephemeral port is the server's peer */
    CHECK(ntohs(got.sin_port) >= 1024, "client port %u", ntohs(got.sin_port));
    len = sizeof got;
    OK(getpeername(c, (struct sockaddr *)&got, &len));
    CHECK_EQ(ntohs(got.sin_port), port);
    len = sizeof got;
    OK(getsockname(s, (struct sockaddr *)&got, &len));
    CHECK_EQ(ntohs(got.sin_port), port);
    char buf[16] = {0};
    CHECK_EQ(send(c, "ping", 4, 0), 4);
    CHECK_EQ(recv(s, buf, sizeof buf, 0), 4);
    CHECK_EQ(memcmp(buf, "ping", 4), 0);
    CHECK_EQ(sendto(s, "pong", 4, 0, (struct sockaddr *)&to, sizeof to), 4); /* TCP ignores the address */
    CHECK_EQ(recv(c, buf, sizeof buf, 0), 4);
    int v = 0, on = 1;
    len = sizeof v;
    OK(setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on));
    OK(getsockopt(c, IPPROTO_TCP, TCP_NODELAY, &v, &len));
    CHECK(v != 0, "TCP_NODELAY %d", v);
    OK(getsockopt(c, SOL_SOCKET, SO_DOMAIN, &v, &len));
    CHECK_EQ(v, AF_INET);
    OK(getsockopt(c, SOL_SOCKET, SO_PROTOCOL, &v, &len));
    CHECK_EQ(v, IPPROTO_TCP);
    OK(getsockopt(l, SOL_SOCKET, SO_ACCEPTCONN, &v, &len));
    CHECK_EQ(v, 1);
    OK(shutdown(c, SHUT_WR));
    CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
    OK(close(s));
    CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
    OK(close(c));
    OK(close(l));
    /* the listener is gone: nobody listens on its port */
    c = (int)OK(socket(AF_INET, SOCK_STREAM, 0));
    CHECK_ERR(connect(c, (struct sockaddr *)&to, sizeof to), ECONNREFUSED);
    OK(close(c));
}

/* Ports: a held one is EADDRINUSE (the wildcard overlaps 127.0.0.1), a free one binds, listen
 * without bind takes one, connect(0.0.0.0) is the local host, bad addresses fail. */
static void test_ports(int argc, char **argv) {
    (void)argc;
    (void)argv;
    uint16_t port;
    struct sockaddr_in wild = v4("0.0.0.0", 0);
    int l = listener(&wild, sizeof wild, &port);
    int b = (int)OK(socket(AF_INET, SOCK_STREAM, 0)), on = 1;
    OK(setsockopt(b, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on));
    struct sockaddr_in same = v4("127.0.0.1", port);
    CHECK_ERR(bind(b, (struct sockaddr *)&same, sizeof same), EADDRINUSE);
    struct sockaddr_in other = v4("127.0.0.1", 0);
    OK(bind(b, (struct sockaddr *)&other, sizeof other));
    CHECK_ERR(bind(b, (struct sockaddr *)&other, sizeof other), EINVAL); /* bound already */
    OK(close(b));
    struct sockaddr_in zero = v4("0.0.0.0", port);
    int c = (int)OK(socket(AF_INET, SOCK_STREAM, 0));
    OK(connect(c, (struct sockaddr *)&zero, sizeof zero));
    int s = (int)OK(accept(l, NULL, NULL));
    OK(close(s));
    OK(close(c));
    OK(close(l));
    l = (int)OK(socket(AF_INET, SOCK_STREAM, 0));
    OK(listen(l, 1)); /* a free port on the wildcard */
    struct sockaddr_in got;
    socklen_t len = sizeof got;
    OK(getsockname(l, (struct sockaddr *)&got, &len));
    CHECK(got.sin_port != 0 && got.sin_addr.s_addr == htonl(INADDR_ANY), "listen's name %x:%u",
          ntohl(got.sin_addr.s_addr), ntohs(got.sin_port));
    OK(close(l));
    b = (int)OK(socket(AF_INET, SOCK_STREAM, 0));
    struct sockaddr_in far = v4("192.0.2.1", 0);
    CHECK_ERR(bind(b, (struct sockaddr *)&far, sizeof far), EADDRNOTAVAIL);
    CHECK_ERR(bind(b, (struct sockaddr *)&far, sizeof far - 1), EINVAL);
    CHECK_ERR(bind(b, (struct sockaddr *)&far, 129), EINVAL); /* longer than any address */
    struct sockaddr_in6 wrong = v6("::1", 0);
    CHECK_ERR(bind(b, (struct sockaddr *)&wrong, sizeof wrong), EAFNOSUPPORT);
    CHECK_ERR(bind(b, (struct sockaddr *)8, sizeof far), EFAULT);
    CHECK_ERR(socket(AF_INET, SOCK_STREAM, IPPROTO_UDP), EPROTONOSUPPORT);
    OK(close(b));
}

/* ::1, and a dual-stack wildcard listener that takes AF_INET connections as v4-mapped peers; with
 * IPV6_V6ONLY it takes none. */
static void test_tcp6(int argc, char **argv) {
    (void)argc;
    (void)argv;
    uint16_t port;
    struct sockaddr_in6 one = v6("::1", 0);
    int l = listener(&one, sizeof one, &port);
    int c = (int)OK(socket(AF_INET6, SOCK_STREAM, 0));
    struct sockaddr_in6 to = v6("::1", port), peer;
    OK(connect(c, (struct sockaddr *)&to, sizeof to));
    socklen_t len = sizeof peer;
    int s = (int)OK(accept(l, (struct sockaddr *)&peer, &len));
    char ip[64];
    ip_of((struct sockaddr *)&peer, ip, sizeof ip);
    CHECK_STR(ip, "::1");
    CHECK_EQ(send(s, "6", 1, 0), 1);
    char buf[4];
    CHECK_EQ(recv(c, buf, sizeof buf, 0), 1);
    OK(close(s));
    OK(close(c));
    OK(close(l));

    struct sockaddr_in6 wild = v6("::", 0);
    l = listener(&wild, sizeof wild, &port);
    c = (int)OK(socket(AF_INET, SOCK_STREAM, 0));
    struct sockaddr_in four = v4("127.0.0.1", port);
    OK(connect(c, (struct sockaddr *)&four, sizeof four));
    len = sizeof peer;
    s = (int)OK(accept(l, (struct sockaddr *)&peer, &len));
    CHECK_EQ(peer.sin6_family, AF_INET6);
    ip_of((struct sockaddr *)&peer, ip, sizeof ip);
    CHECK_STR(ip, "::ffff:127.0.0.1");
    OK(close(s));
    OK(close(c));
    int b = (int)OK(socket(AF_INET, SOCK_STREAM, 0));
    CHECK_ERR(bind(b, (struct sockaddr *)&four, sizeof four), EADDRINUSE); /* the dual-stack wildcard has it */
    OK(close(b));
    OK(close(l));

    l = (int)OK(socket(AF_INET6, SOCK_STREAM, 0));
    int on = 1, v = 0;
    OK(setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on));
    socklen_t vlen = sizeof v;
    OK(getsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &v, &vlen));
    CHECK_EQ(v, 1);
    OK(bind(l, (struct sockaddr *)&wild, sizeof wild));
    OK(listen(l, 1));
    struct sockaddr_in6 got;
    len = sizeof got;
    OK(getsockname(l, (struct sockaddr *)&got, &len));
    CHECK_ERR(setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on), EINVAL); /* bound */
    four.sin_port = got.sin6_port;
    c = (int)OK(socket(AF_INET, SOCK_STREAM, 0));
    CHECK_ERR(connect(c, (struct sockaddr *)&four, sizeof four), ECONNREFUSED);
    OK(close(c));
    OK(close(l));
}

/* A child process connects to its parent's listener; poll sees the connection, then the bytes. */
static void test_two_processes(int argc, char **argv) {
    (void)argc;
    (void)argv;
    uint16_t port;
    struct sockaddr_in lo = v4("127.0.0.1", 0);
    int l = listener(&lo, sizeof lo, &port);
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        OK(close(l));
        int c = (int)OK(socket(AF_INET, SOCK_STREAM, 0));
        struct sockaddr_in to = v4("127.0.0.1", port);
        OK(connect(c, (struct sockaddr *)&to, sizeof to));
        CHECK_EQ(send(c, "child", 5, 0), 5);
        char buf[8];
        CHECK_EQ(recv(c, buf, sizeof buf, 0), 2);
        child_exit(0);
    }
    struct pollfd p = {.fd = l, .events = POLLIN};
    CHECK_EQ(OK(poll(&p, 1, 10000)), 1);
    int s = (int)OK(accept(l, NULL, NULL));
    char buf[8] = {0};
    size_t got = 0;
    while (got < 5) {
        long r = OK(recv(s, buf + got, sizeof buf - got, 0));
        if (r == 0) break;
        got += (size_t)r;
    }
    CHECK_EQ(got, 5);
    CHECK_EQ(send(s, "ok", 2, 0), 2);
    expect_exit(pid, 0);
    OK(close(s));
    OK(close(l));
}

/* The sandbox has no network: an address off the loopback is unreachable (guest only: Linux would
 * try the host's network). */
static void test_unreachable(int argc, char **argv) {
    (void)argc;
    (void)argv;
    CHECK(in_guest(), "a guest-only test");
    int c = (int)OK(socket(AF_INET, SOCK_STREAM, 0));
    struct sockaddr_in far = v4("192.0.2.1", 80);
    CHECK_ERR(connect(c, (struct sockaddr *)&far, sizeof far), ENETUNREACH);
    OK(close(c));
    CHECK_ERR(socket(AF_INET, SOCK_DGRAM, 0), EACCES);
}

static const zb_test tests[] = {
    {"tcp4", test_tcp4},
    {"ports", test_ports},
    {"tcp6", test_tcp6},
    {"two_processes", test_two_processes},
    {"unreachable", test_unreachable},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
