/* fifo.c - named pipes (mkfifo, mknod S_IFIFO): the node (stat, mode, d_type, EEXIST, unlink),
 * open's rules (a blocking open waits for the other side, O_NONBLOCK readers at once, O_NONBLOCK
 * writers ENXIO without a reader, O_RDWR at once), one pipe shared by every open of a node and
 * gone with its last end, poll's POLLHUP/POLLERR, EPIPE, an open interrupted by a signal, and the
 * node and an open FIFO's bytes across snapshots. Every test but snapshot_state also runs on the
 * host (guest_c.check_on_linux): Linux's behaviour is the reference. */
#include "check.h"
#include "children.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

static char dir[64], path[96];

/* A private directory with a FIFO named "p" in it. */
static void make_fifo(unsigned mode) {
    snprintf(dir, sizeof dir, "/tmp/zbfifoXXXXXX");
    if (!mkdtemp(dir)) FAIL("mkdtemp: %s", strerror(errno));
    snprintf(path, sizeof path, "%s/p", dir);
    OK(mkfifo(path, mode));
}

static void remove_fifo(void) {
    unlink(path);
    rmdir(dir);
}

static short revents(int fd, short events) {
    struct pollfd p = {.fd = fd, .events = events};
    CHECK_EQ(syscall(SYS_poll, &p, 1, 0), p.revents ? 1 : 0);
    return p.revents;
}

/* The node: stat, d_type, its mode, EEXIST, mknod(S_IFIFO), fstat of an end, fchmod, unlink. */
static void test_node(int argc, char **argv) {
    (void)argc;
    (void)argv;
    umask(022);
    make_fifo(0666);
    struct stat st, fst;
    OK(stat(path, &st));
    CHECK(S_ISFIFO(st.st_mode), "mode 0%o", st.st_mode);
    CHECK_EQ(st.st_mode & 07777, 0644);
    CHECK_EQ(st.st_size, 0);
    CHECK_EQ(st.st_nlink, 1);
    CHECK_ERR(mkfifo(path, 0600), EEXIST);
    char other[128];
    snprintf(other, sizeof other, "%s/q", dir);
    OK(syscall(SYS_mknodat, AT_FDCWD, other, S_IFIFO | 0600, 0));
    OK(lstat(other, &fst));
    CHECK(S_ISFIFO(fst.st_mode) && (fst.st_mode & 07777) == 0600, "mode 0%o", fst.st_mode);
    CHECK(fst.st_ino != st.st_ino, "two nodes, one inode");
    DIR *d = opendir(dir);
    int seen = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') {
            CHECK(e->d_type == DT_FIFO, "%s: d_type %d", e->d_name, e->d_type);
            seen++;
        }
    if (d) closedir(d);
    CHECK_EQ(seen, 2);
    int fd = (int)OK(open(path, O_RDONLY | O_NONBLOCK));
    OK(fstat(fd, &fst));
    CHECK(S_ISFIFO(fst.st_mode), "fstat mode 0%o", fst.st_mode);
    CHECK_EQ(fst.st_ino, st.st_ino);
    CHECK_EQ(fst.st_dev, st.st_dev);
    CHECK_ERR(lseek(fd, 0, SEEK_CUR), ESPIPE);
    char b[4];
    CHECK_ERR(pread(fd, b, sizeof b, 0), ESPIPE);
    CHECK_EQ(fcntl(fd, F_GETFL) & (O_ACCMODE | O_NONBLOCK), O_RDONLY | O_NONBLOCK);
    OK(fchmod(fd, 0600));
    OK(stat(path, &st));
    CHECK_EQ(st.st_mode & 07777, 0600);
    CHECK_ERR(open(path, O_RDONLY | O_DIRECTORY), ENOTDIR);
    CHECK_ERR(open(other, O_RDONLY | O_CREAT | O_EXCL, 0600), EEXIST);
    OK(unlink(other));
    CHECK_ERR(stat(other, &st), ENOENT);
    OK(close(fd));
    remove_fifo();
}

/* Non-blocking opens, one pipe per node shared by its opens, EOF, EPIPE, poll, FIONREAD, O_RDWR,
 * and the bytes going with the last end. */
static void test_nonblock(int argc, char **argv) {
    (void)argc;
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    make_fifo(0600);
    CHECK_ERR(open(path, O_WRONLY | O_NONBLOCK), ENXIO); /* no reader */
    int r = (int)OK(open(path, O_RDONLY | O_NONBLOCK));
    char b[16];
    CHECK_EQ(read(r, b, sizeof b), 0);       /* no writer: EOF */
    CHECK_EQ(revents(r, POLLIN), 0);         /* no POLLHUP before a writer came (Linux's f_version) */
    int w = (int)OK(open(path, O_WRONLY | O_NONBLOCK));
    CHECK_EQ(revents(w, POLLOUT), POLLOUT);
    CHECK_ERR(read(r, b, sizeof b), EAGAIN); /* a writer, no bytes */
    int w2 = (int)OK(open(path, O_WRONLY | O_NONBLOCK)); /* a second writer: the same pipe */
    CHECK_EQ(write(w, "abc", 3), 3);
    CHECK_EQ(write(w2, "de", 2), 2);
    int n = -1;
    OK(ioctl(r, FIONREAD, &n));
    CHECK_EQ(n, 5);
    CHECK_EQ(revents(r, POLLIN), POLLIN);
    CHECK_EQ(fcntl(w, F_GETPIPE_SZ), 65536);
    CHECK_EQ(read(r, b, sizeof b), 5);
    CHECK(!memcmp(b, "abcde", 5), "read %.5s", b);
    OK(close(w));
    OK(close(w2));
    CHECK_EQ(revents(r, POLLIN) & POLLHUP, POLLHUP); /* the writers came and went */
    CHECK_EQ(read(r, b, sizeof b), 0);
    w = (int)OK(open(path, O_WRONLY | O_NONBLOCK));
    CHECK_EQ(revents(r, POLLIN), 0);
    OK(close(r)); /* the last reader */
    CHECK_ERR(write(w, "x", 1), EPIPE);
    CHECK_EQ(revents(w, POLLOUT), POLLOUT | POLLERR);
    OK(close(w));
    /* O_RDWR opens at once and is both ends; its bytes go with the pipe's last end */
    int rw = (int)OK(open(path, O_RDWR));
    CHECK_EQ(revents(rw, POLLIN | POLLOUT), POLLOUT);
    CHECK_EQ(write(rw, "kept", 4), 4);
    r = (int)OK(open(path, O_RDONLY | O_NONBLOCK)); /* a writer is there: the same pipe */
    CHECK_EQ(read(r, b, 2), 2);
    CHECK(!memcmp(b, "ke", 2), "read %.2s", b);
    OK(close(r));
    OK(close(rw));
    rw = (int)OK(open(path, O_RDWR | O_NONBLOCK)); /* a new pipe: nothing of the old one's bytes */
    CHECK_ERR(read(rw, b, sizeof b), EAGAIN);
    OK(close(rw));
    CHECK_ERR(open(path, O_WRONLY | O_NONBLOCK), ENXIO);
    remove_fifo();
}

/* Blocking opens meet: a reader waits for a writer and the other way round, whichever comes first;
 * a writer that opens, writes and closes before the waiting reader's open returns still reaches
 * it (the reader then reads the bytes and EOF); two writers share the reader's pipe; epoll. */
static void test_fork(int argc, char **argv) {
    (void)argc;
    (void)argv;
    make_fifo(0600);
    pid_t pid = fork_or_fail();
    if (pid == 0) { /* the writer */
        int w = (int)OK(open(path, O_WRONLY));
        CHECK_EQ(write(w, "hello", 5), 5);
        child_exit(0);
    }
    int r = (int)OK(open(path, O_RDONLY));
    char b[32];
    size_t got = 0;
    for (long k; (k = read(r, b + got, sizeof b - got)) > 0;) got += (size_t)k;
    CHECK_EQ(got, 5);
    CHECK(!memcmp(b, "hello", 5), "read %.5s", b);
    OK(close(r));
    expect_exit(pid, 0);
    /* the other way round: the reader is the child, the parent's blocking writer waits for it */
    pid = fork_or_fail();
    if (pid == 0) {
        int rc = (int)OK(open(path, O_RDONLY));
        char c[8] = {0};
        CHECK_EQ(read(rc, c, sizeof c), 3);
        CHECK(!memcmp(c, "abc", 3), "read %.3s", c);
        CHECK_EQ(read(rc, c, sizeof c), 0);
        child_exit(0);
    }
    int w = (int)OK(open(path, O_WRONLY));
    CHECK_EQ(write(w, "abc", 3), 3);
    OK(close(w));
    expect_exit(pid, 0);
    /* two writers, each blocked until the reader comes, into one pipe; the reader waits on epoll.
     * The writers keep their ends open until the reader has both bytes (the go pipe): a writer
     * that came and went before the other opened would give the reader an EOF between them, as
     * Linux does, and the bytes would then depend on the scheduler. */
    int go[2];
    OK(pipe(go));
    pid_t a = fork_or_fail();
    if (a == 0) {
        int wa = (int)OK(open(path, O_WRONLY));
        CHECK_EQ(write(wa, "1", 1), 1);
        char x;
        CHECK_EQ(read(go[0], &x, 1), 1);
        child_exit(0);
    }
    pid_t c = fork_or_fail();
    if (c == 0) {
        int wc = (int)OK(open(path, O_WRONLY));
        CHECK_EQ(write(wc, "2", 1), 1);
        char x;
        CHECK_EQ(read(go[0], &x, 1), 1);
        child_exit(0);
    }
    r = (int)OK(open(path, O_RDONLY));
    int ep = (int)OK(epoll_create1(0));
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = r};
    OK(epoll_ctl(ep, EPOLL_CTL_ADD, r, &ev));
    got = 0;
    while (got < 2) {
        struct epoll_event out;
        CHECK_EQ(epoll_wait(ep, &out, 1, 10000), 1);
        long k = read(r, b + got, sizeof b - got);
        CHECK(k > 0, "read %ld after %zu bytes", k, got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    CHECK_EQ(got, 2);
    CHECK((b[0] == '1' && b[1] == '2') || (b[0] == '2' && b[1] == '1'), "read %.2s", b);
    CHECK_EQ(write(go[1], "gg", 2), 2);
    expect_exit(a, 0);
    expect_exit(c, 0);
    CHECK_EQ(read(r, b, sizeof b), 0); /* both writers gone: EOF */
    OK(close(go[0]));
    OK(close(go[1]));
    OK(close(ep));
    OK(close(r));
    remove_fifo();
}

static void on_alarm(int sig) { (void)sig; }

/* A blocking open nobody answers, interrupted by a signal without SA_RESTART: EINTR, and the
 * reader it was is gone (a non-blocking writer is ENXIO again); in a child too (then it waits
 * in a family, with its parent waiting for it). */
static void test_interrupt(int argc, char **argv) {
    (void)argc;
    (void)argv;
    struct sigaction sa = {.sa_handler = on_alarm};
    OK(sigaction(SIGALRM, &sa, NULL));
    make_fifo(0600);
    alarm(1);
    CHECK_ERR(open(path, O_RDONLY), EINTR);
    CHECK_ERR(open(path, O_WRONLY | O_NONBLOCK), ENXIO);
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        alarm(1);
        CHECK_ERR(open(path, O_WRONLY), EINTR);
        int r = (int)OK(open(path, O_RDONLY | O_NONBLOCK));
        char b[4];
        CHECK_EQ(read(r, b, sizeof b), 0); /* the interrupted writer is none */
        CHECK_EQ(revents(r, POLLIN), 0);
        child_exit(0);
    }
    expect_exit(pid, 0);
    remove_fifo();
}

/* The node and an open FIFO's unread bytes across a snapshot: every fork (and a saved and loaded
 * template) still has both ends, its bytes, and a new open of the node joins the same pipe. */
static void test_snapshot_state(int argc, char **argv) {
    (void)argc;
    (void)argv;
    make_fifo(0640);
    int r = (int)OK(open(path, O_RDONLY | O_NONBLOCK));
    int w = (int)OK(open(path, O_WRONLY | O_NONBLOCK));
    CHECK_EQ(write(w, "kept", 4), 4);
    int tty = (int)OK(open("/dev/ttyS0", O_RDWR));
    printf("ready\n");
    fflush(stdout);
    char go[8];
    OK(read(tty, go, sizeof go)); /* the host snapshots here */
    struct stat st;
    OK(stat(path, &st));
    CHECK(S_ISFIFO(st.st_mode) && (st.st_mode & 0777) == 0640, "mode 0%o", st.st_mode);
    char b[16];
    CHECK_EQ(read(r, b, sizeof b), 4);
    CHECK(!memcmp(b, "kept", 4), "read %.4s", b);
    int w2 = (int)OK(open(path, O_WRONLY | O_NONBLOCK)); /* the reader is there: its pipe */
    CHECK_EQ(write(w2, "more", 4), 4);
    CHECK_EQ(read(r, b, sizeof b), 4);
    CHECK(!memcmp(b, "more", 4), "read %.4s", b);
    OK(close(w));
    OK(close(w2));
    CHECK_EQ(read(r, b, sizeof b), 0);
    remove_fifo();
}

static const zb_test tests[] = {
    {"node", test_node},
    {"nonblock", test_nonblock},
    {"fork", test_fork},
    {"interrupt", test_interrupt},
    {"snapshot_state", test_snapshot_state},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
