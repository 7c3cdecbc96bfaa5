/* unix_sockets.c - AF_UNIX stream sockets with names: bind/listen/accept/connect on a path and on
 * an abstract name, the addresses each call reports, the errors of each state, the backlog, and a
 * connection between two processes. Every test also passes on Linux (tests/test_guest_sockets.py
 * runs them there too), so the checks are Linux's behaviour.
 */
#include "check.h"

#include <poll.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#define ADDR_LEN(a) ((socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen((a)->sun_path) + 1))

static struct sockaddr_un path_addr(const char *dir, const char *name) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/%s", dir, name);
    return a;
}

static int unix_socket(int flags) { return (int)OK(socket(AF_UNIX, SOCK_STREAM | flags, 0)); }

static short revents(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLOUT};
    OK(poll(&p, 1, 0));
    return p.revents;
}

/* A listener on a path: the name is a socket file; the errors before and after listen(); a
 * connection's addresses and bytes both ways; EOF after the server end closes. */
static void test_path(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char dir[] = "/tmp/zbsockXXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    struct sockaddr_un a = path_addr(dir, "listener");
    int l = unix_socket(SOCK_CLOEXEC);
    CHECK_ERR(listen(l, 5), EINVAL); /* not bound */
    CHECK_ERR(recv(l, (char[1]){0}, 1, 0), EINVAL); /* never connected */
    CHECK_ERR(send(l, "x", 1, MSG_NOSIGNAL), ENOTCONN);
    CHECK_ERR(getpeername(l, &(struct sockaddr){0}, &(socklen_t){sizeof(struct sockaddr)}), ENOTCONN);
    CHECK_ERR(accept(l, NULL, NULL), EINVAL);
    CHECK_EQ(revents(l), POLLOUT | POLLHUP);
    OK(bind(l, (struct sockaddr *)&a, sizeof a));
    struct sockaddr_un second = path_addr(dir, "second");
    CHECK_ERR(bind(l, (struct sockaddr *)&second, sizeof second), EINVAL); /* bound already */
    CHECK_ERR(stat(second.sun_path, &(struct stat){0}), ENOENT); /* and no file made */
    struct stat st;
    OK(stat(a.sun_path, &st));
    CHECK(S_ISSOCK(st.st_mode), "the name is a socket file: mode %o", st.st_mode);
    CHECK_ERR(open(a.sun_path, O_RDONLY), ENXIO);
    int other = unix_socket(0);
    CHECK_ERR(bind(other, (struct sockaddr *)&a, sizeof a), EADDRINUSE);
    CHECK_ERR(connect(other, (struct sockaddr *)&a, sizeof a), ECONNREFUSED); /* bound, not listening */
    struct sockaddr_un got;
    socklen_t len = sizeof got;
    OK(getsockname(l, (struct sockaddr *)&got, &len));
    CHECK_EQ(len, ADDR_LEN(&a));
    CHECK_STR(got.sun_path, a.sun_path);
    /* a path that fills sun_path (no NUL of its own): its name comes back with one added */
    struct sockaddr_un full = {.sun_family = AF_UNIX};
    int dlen = snprintf(full.sun_path, sizeof full.sun_path, "%s/", dir);
    memset(full.sun_path + dlen, 'f', sizeof full.sun_path - (size_t)dlen);
    int longest = unix_socket(0);
    OK(bind(longest, (struct sockaddr *)&full, sizeof full));
    struct { struct sockaddr_un a; char more[8]; } back;
    memset(&back, 0x55, sizeof back);
    len = sizeof back;
    OK(getsockname(longest, (struct sockaddr *)&back, &len));
    CHECK_EQ(len, sizeof full + 1);
    CHECK(!memcmp(back.a.sun_path, full.sun_path, sizeof full.sun_path) && back.more[0] == 0, "the full path and a NUL");
    char full_path[sizeof full.sun_path + 1] = {0};
    memcpy(full_path, full.sun_path, sizeof full.sun_path);
    OK(unlink(full_path));
    OK(listen(l, 5));
    int v = 0;
    OK(getsockopt(l, SOL_SOCKET, SO_ACCEPTCONN, &v, &(socklen_t){sizeof v}));
    CHECK_EQ(v, 1);
    CHECK_EQ(revents(l), 0);
    int nb = unix_socket(SOCK_NONBLOCK);
    CHECK_ERR(connect(l, (struct sockaddr *)&a, sizeof a), EINVAL); /* a listener connects nowhere */
    OK(listen(l, 5)); /* again: only the backlog changes */
    OK(connect(other, (struct sockaddr *)&a, sizeof a));
    CHECK_EQ(revents(l), POLLIN);
    CHECK_ERR(connect(other, (struct sockaddr *)&a, sizeof a), EISCONN);
    struct sockaddr_un peer;
    memset(&peer, 0x55, sizeof peer);
    len = sizeof peer;
    int s = (int)OK(accept4(l, (struct sockaddr *)&peer, &len, SOCK_CLOEXEC));
    CHECK_EQ(len, sizeof(sa_family_t)); /* the client is unnamed */
    CHECK_EQ(peer.sun_family, AF_UNIX);
    CHECK_EQ(fcntl(s, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    CHECK_ERR(accept4(l, NULL, NULL, SOCK_NONBLOCK | 0x4000), EINVAL);
    OK(fcntl(l, F_SETFL, O_NONBLOCK));
    CHECK_ERR(accept(l, NULL, NULL), EAGAIN);
    /* addresses: the server end has the listener's name, the client's peer is it too */
    len = sizeof got;
    OK(getsockname(s, (struct sockaddr *)&got, &len));
    CHECK_STR(got.sun_path, a.sun_path);
    len = sizeof got;
    OK(getpeername(other, (struct sockaddr *)&got, &len));
    CHECK_EQ(len, ADDR_LEN(&a));
    CHECK_STR(got.sun_path, a.sun_path);
    len = sizeof got;
    OK(getpeername(s, (struct sockaddr *)&got, &len));
    CHECK_EQ(len, sizeof(sa_family_t));
    len = 4; /* a short buffer: cut, and the full length reported */
    memset(&got, 0, sizeof got);
    OK(getsockname(s, (struct sockaddr *)&got, &len));
    CHECK_EQ(len, ADDR_LEN(&a));
    CHECK(got.sun_path[0] == a.sun_path[0] && got.sun_path[1] == a.sun_path[1] && got.sun_path[2] == 0, "a cut name");
    /* bytes both ways, then EOF when the server end closes */
    char buf[16];
    CHECK_EQ(send(other, "ping", 4, 0), 4);
    CHECK_EQ(recv(s, buf, sizeof buf, 0), 4);
    CHECK(!memcmp(buf, "ping", 4), "ping");
    CHECK_EQ(write(s, "pong!", 5), 5);
    CHECK_EQ(read(other, buf, sizeof buf), 5);
    OK(close(s));
    CHECK_EQ(read(other, buf, sizeof buf), 0);
    /* a missing path, a file that is no socket, and a name unlinked */
    struct sockaddr_un missing = path_addr(dir, "missing"), plain = path_addr(dir, "plain");
    CHECK_ERR(connect(nb, (struct sockaddr *)&missing, sizeof missing), ENOENT);
    OK(close((int)OK(open(plain.sun_path, O_CREAT | O_WRONLY, 0600))));
    CHECK_ERR(connect(nb, (struct sockaddr *)&plain, sizeof plain), ECONNREFUSED);
    OK(unlink(a.sun_path));
    CHECK_ERR(connect(nb, (struct sockaddr *)&a, sizeof a), ENOENT);
    /* bad addresses */
    struct sockaddr_un bad = a;
    bad.sun_family = AF_INET;
    CHECK_ERR(bind(nb, (struct sockaddr *)&bad, sizeof bad), EINVAL);
    CHECK_ERR(connect(nb, (struct sockaddr *)&a, sizeof(sa_family_t)), EINVAL);
    CHECK_ERR(connect(nb, (struct sockaddr *)&a, 0), EINVAL);
    struct sockaddr_storage big = {.ss_family = AF_UNIX};
    CHECK_ERR(connect(nb, (struct sockaddr *)&big, sizeof big + 1), EINVAL);
    CHECK_ERR(connect(nb, (struct sockaddr *)&a, sizeof a + 1), EINVAL);
    CHECK_ERR(syscall(SYS_connect, nb, 8, sizeof a), EFAULT);
    CHECK_ERR(syscall(SYS_bind, nb, 8, sizeof a), EFAULT);
    /* a name made again after its file was unlinked is a new listener */
    int l2 = unix_socket(0);
    OK(bind(l2, (struct sockaddr *)&a, sizeof a));
    OK(listen(l2, 1));
    OK(close(l));
    int c2 = unix_socket(0);
    OK(connect(c2, (struct sockaddr *)&a, sizeof a));
    int s2 = (int)OK(accept(l2, NULL, NULL));
    CHECK_EQ(send(c2, "x", 1, 0), 1);
    CHECK_EQ(recv(s2, buf, 1, 0), 1);
    /* closed with a connection not accepted: that client's read is ECONNRESET, then EOF; its
     * write EPIPE. The socket file stays, and refuses connections. */
    int c4 = unix_socket(0);
    OK(connect(c4, (struct sockaddr *)&a, sizeof a));
    OK(close(l2));
    CHECK_ERR(recv(c4, buf, 1, 0), ECONNRESET);
    CHECK_EQ(recv(c4, buf, 1, 0), 0);
    CHECK_ERR(send(c4, "x", 1, MSG_NOSIGNAL), EPIPE);
    int c3 = unix_socket(0);
    CHECK_ERR(connect(c3, (struct sockaddr *)&a, sizeof a), ECONNREFUSED);
    OK(unlink(a.sun_path));
    OK(unlink(plain.sun_path));
    OK(rmdir(dir));
}

/* The backlog: listen(1) queues two connections (Linux lets backlog + 1 wait), a third
 * non-blocking connect is EAGAIN; accepting one makes room. */
static void test_backlog(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char dir[] = "/tmp/zbsockXXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    struct sockaddr_un a = path_addr(dir, "l");
    int l = unix_socket(0);
    OK(bind(l, (struct sockaddr *)&a, sizeof a));
    OK(listen(l, 1));
    int c[3];
    for (int i = 0; i < 3; i++) c[i] = unix_socket(SOCK_NONBLOCK);
    OK(connect(c[0], (struct sockaddr *)&a, sizeof a));
    OK(connect(c[1], (struct sockaddr *)&a, sizeof a));
    CHECK_ERR(connect(c[2], (struct sockaddr *)&a, sizeof a), EAGAIN);
    int s = (int)OK(accept(l, NULL, NULL));
    OK(connect(c[2], (struct sockaddr *)&a, sizeof a));
    /* connections are accepted oldest first */
    CHECK_EQ(send(c[0], "0", 1, 0), 1);
    CHECK_EQ(send(c[1], "1", 1, 0), 1);
    char b = 0;
    CHECK_EQ(recv(s, &b, 1, 0), 1);
    CHECK_EQ(b, '0');
    int s1 = (int)OK(accept(l, NULL, NULL));
    CHECK_EQ(recv(s1, &b, 1, 0), 1);
    CHECK_EQ(b, '1');
    /* no fd free: accept is EMFILE and the connection waits for the next accept */
    CHECK_EQ(send(c[2], "2", 1, 0), 1);
    static int fill[32768];
    int n = 0;
    while (n < 32768 && (fill[n] = dup(0)) >= 0) n++;
    CHECK(n < 32768 && errno == EMFILE, "%d fds, then %s", n, strerror(errno));
    CHECK_ERR(accept(l, NULL, NULL), EMFILE);
    OK(close(fill[--n]));
    int s2 = (int)OK(accept(l, NULL, NULL));
    CHECK_EQ(recv(s2, &b, 1, 0), 1);
    CHECK_EQ(b, '2');
    while (n > 0) OK(close(fill[--n]));
    OK(unlink(a.sun_path));
    OK(rmdir(dir));
}

/* Abstract names (a leading NUL): every byte of the given length counts, a second bind of one is
 * EADDRINUSE, connect finds it, and bind with the family alone picks one (autobind). */
static void test_abstract(int argc, char **argv) {
    (void)argc;
    (void)argv;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "zb-abstract-%d", (int)getpid());
    socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    int l = unix_socket(0);
    OK(bind(l, (struct sockaddr *)&a, alen));
    int dup = unix_socket(0);
    CHECK_ERR(bind(dup, (struct sockaddr *)&a, alen), EADDRINUSE);
    OK(bind(dup, (struct sockaddr *)&a, alen - 1)); /* a prefix is another name */
    struct sockaddr_un got;
    socklen_t len = sizeof got;
    OK(getsockname(l, (struct sockaddr *)&got, &len));
    CHECK_EQ(len, alen);
    CHECK(!memcmp(&got, &a, alen), "the abstract name comes back");
    OK(listen(l, 4));
    int c = unix_socket(0);
    OK(connect(c, (struct sockaddr *)&a, alen));
    int s = (int)OK(accept(l, NULL, NULL));
    CHECK_EQ(send(s, "hi", 2, 0), 2);
    char buf[4];
    CHECK_EQ(recv(c, buf, sizeof buf, 0), 2);
    int c2 = unix_socket(0);
    CHECK_ERR(connect(c2, (struct sockaddr *)&a, alen - 1), ECONNREFUSED); /* bound, not listening */
    /* autobind: NUL and five hex digits */
    int ab = unix_socket(0);
    struct sockaddr_un fam = {.sun_family = AF_UNIX};
    OK(bind(ab, (struct sockaddr *)&fam, sizeof(sa_family_t)));
    len = sizeof got;
    OK(getsockname(ab, (struct sockaddr *)&got, &len));
    CHECK_EQ(len, offsetof(struct sockaddr_un, sun_path) + 6);
    CHECK(got.sun_path[0] == 0 && strspn(got.sun_path + 1, "0123456789abcdef") == 5, "an autobind name");
    OK(bind(ab, (struct sockaddr *)&fam, sizeof(sa_family_t))); /* bound already: nothing to do */
    OK(close(l));
    CHECK_ERR(connect(c2, (struct sockaddr *)&a, alen), ECONNREFUSED); /* the name ended with it */
}

/* Between processes: the parent listens, a child connects and talks; the parent's blocking
 * accept waits for it. A socketpair end can be bound too. */
static void test_two_processes(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char dir[] = "/tmp/zbsockXXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    struct sockaddr_un a = path_addr(dir, "server");
    int l = unix_socket(0);
    OK(bind(l, (struct sockaddr *)&a, sizeof a));
    OK(listen(l, 8));
    pid_t pid = fork();
    if (pid == 0) {
        int c = socket(AF_UNIX, SOCK_STREAM, 0);
        int ok = c >= 0 && connect(c, (struct sockaddr *)&a, sizeof a) == 0 && send(c, "from child", 10, 0) == 10;
        char b[8] = {0};
        ok = ok && recv(c, b, 5, MSG_WAITALL) == 5 && !memcmp(b, "reply", 5);
        _exit(ok ? 0 : 3);
    }
    int s = (int)OK(accept(l, NULL, NULL));
    char buf[16] = {0};
    CHECK_EQ(recv(s, buf, 10, MSG_WAITALL), 10);
    CHECK_STR(buf, "from child");
    CHECK_EQ(send(s, "reply", 5, 0), 5);
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's status %#x", status);
    int sv[2];
    OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    struct sockaddr_un b = path_addr(dir, "pair");
    OK(bind(sv[0], (struct sockaddr *)&b, sizeof b));
    struct sockaddr_un got;
    socklen_t len = sizeof got;
    OK(getsockname(sv[0], (struct sockaddr *)&got, &len));
    CHECK_STR(got.sun_path, b.sun_path);
    CHECK_ERR(listen(sv[0], 1), EINVAL); /* connected */
    CHECK_EQ(send(sv[1], "z", 1, 0), 1);
    CHECK_EQ(recv(sv[0], buf, 1, 0), 1);
    OK(unlink(a.sun_path));
    OK(unlink(b.sun_path));
    OK(rmdir(dir));
}

static const zb_test tests[] = {
    {"path", test_path},
    {"backlog", test_backlog},
    {"abstract", test_abstract},
    {"two_processes", test_two_processes},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
