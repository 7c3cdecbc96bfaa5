/* pty.c - pseudo-terminals: /dev/ptmx with glibc's posix_openpt/grantpt/unlockpt/ptsname and
 * openpty/forkpty, the line discipline (canonical lines, erase, EOF, echo, ONLCR, raw mode),
 * termios and window size, poll readiness, ISIG to the foreground group, closing one end, SIGHUP to
 * the foreground group when the session leader exits, the pty limit, /dev/pts (names, stat, ttyname,
 * opening a slave by name), and hostile arguments (bad pointers, writes nobody reads, bad TIOCGPTPEER
 * flags). */
#include "check.h"
#include "children.h"

#include <dirent.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <termios.h>

#ifndef TIOCGPTPEER
#define TIOCGPTPEER 0x5441
#endif

static short revents(int fd, short events) {
    struct pollfd p = {.fd = fd, .events = events};
    OK(syscall(SYS_poll, &p, 1, 0));
    return p.revents;
}

/* Read what the master has now (nonblocking) into buf, NUL-terminated; the byte count. */
static long drain(int master, char *buf, size_t cap) {
    int fl = fcntl(master, F_GETFL);
    fcntl(master, F_SETFL, fl | O_NONBLOCK);
    size_t n = 0;
    for (;;) {
        long r = read(master, buf + n, cap - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
    }
    fcntl(master, F_SETFL, fl);
    buf[n] = 0;
    return (long)n;
}

static void test_openpt(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int m = (int)OK(posix_openpt(O_RDWR | O_NOCTTY));
    CHECK_EQ(isatty(m), 1);
    OK(grantpt(m));
    unsigned n = 99;
    OK(ioctl(m, TIOCGPTN, &n));
    CHECK_EQ(n, 0);
    CHECK_STR(ptsname(m), "/dev/pts/0");
    int lock = 0;
    OK(ioctl(m, TIOCGPTLCK, &lock));
    CHECK_EQ(lock, 1);
    CHECK_ERR(ioctl(m, TIOCGPTPEER, O_RDWR), EIO); /* locked until unlockpt */
    OK(unlockpt(m));
    int s = (int)OK(ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
    CHECK_EQ(fcntl(s, F_GETFD), FD_CLOEXEC);
    CHECK_EQ(isatty(s), 1);
    struct stat st;
    OK(fstat(s, &st));
    CHECK(S_ISCHR(st.st_mode), "mode 0%o", st.st_mode);
    CHECK_ERR(ioctl(s, TIOCGPTN, &n), ENOTTY); /* a master's command */
    int p[2];
    OK(pipe(p));
    CHECK_EQ(isatty(p[0]), 0);
    CHECK_EQ(errno, ENOTTY);
    /* openpty: the next free index */
    int m2, s2;
    char name[64];
    OK(openpty(&m2, &s2, name, NULL, NULL));
    CHECK_STR(name, "/dev/pts/1");
    OK(close(m2));
    OK(close(s2));
    /* an index comes back once the pty's ends are closed */
    OK(close(m));
    OK(close(s));
    int m3 = (int)OK(posix_openpt(O_RDWR));
    OK(ioctl(m3, TIOCGPTN, &n));
    CHECK_EQ(n, 0);
    OK(close(m3));
}

/* The sandbox's limit of 64 ptys (ZB_PTY_MAX; Linux's default is 4096): ENOSPC past it. */
static void test_limit(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fds[70], k = 0;
    for (; k < 70; k++) {
        fds[k] = posix_openpt(O_RDWR);
        if (fds[k] < 0) break;
    }
    CHECK_EQ(k, 64);
    CHECK_EQ(errno, ENOSPC);
    while (k > 0) OK(close(fds[--k]));
    OK(close(OK(posix_openpt(O_RDWR)))); /* room again */
}

static void test_io(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int m, s;
    char buf[256];
    OK(openpty(&m, &s, NULL, NULL, NULL));
    /* output: ONLCR */
    CHECK_EQ(write(s, "a\nb\n", 4), 4);
    CHECK_EQ(revents(m, POLLIN), POLLIN);
    CHECK_EQ(drain(m, buf, sizeof buf), 6);
    CHECK_STR(buf, "a\r\nb\r\n");
    CHECK_EQ(revents(m, POLLIN), 0);
    /* input: ICRNL, a canonical line, its echo */
    CHECK_EQ(write(m, "hi\r", 3), 3);
    CHECK_EQ(revents(s, POLLIN), POLLIN);
    CHECK_EQ(read(s, buf, sizeof buf), 3);
    CHECK(!memcmp(buf, "hi\n", 3), "%.3s", buf);
    drain(m, buf, sizeof buf);
    CHECK_STR(buf, "hi\r\n");
    /* a partial line is not readable; erase edits it; FIONREAD counts it */
    OK(fcntl(s, F_SETFL, O_NONBLOCK));
    CHECK_EQ(write(m, "abc", 3), 3);
    CHECK_EQ(revents(s, POLLIN), 0);
    CHECK_ERR(read(s, buf, sizeof buf), EAGAIN);
    int q = -1;
    OK(ioctl(s, FIONREAD, &q));
    CHECK_EQ(q, 0); /* canonical: whole lines only, as Linux counts */
    CHECK_EQ(write(m, "\x7f" "d\n", 3), 3);
    CHECK_EQ(read(s, buf, sizeof buf), 4);
    CHECK(!memcmp(buf, "abd\n", 4), "%.4s", buf);
    drain(m, buf, sizeof buf);
    CHECK_STR(buf, "abc\b \bd\r\n");
    /* a short read takes part of a line, then the rest */
    CHECK_EQ(write(m, "xyz\n", 4), 4);
    CHECK_EQ(read(s, buf, 2), 2);
    CHECK_EQ(read(s, buf, sizeof buf), 2);
    CHECK(!memcmp(buf, "z\n", 2), "%.2s", buf);
    /* VEOF: a read of 0 on an empty line, the pending bytes on a partial one */
    CHECK_EQ(write(m, "\x04", 1), 1);
    CHECK_EQ(read(s, buf, sizeof buf), 0);
    CHECK_EQ(write(m, "ab\x04", 3), 3);
    CHECK_EQ(read(s, buf, sizeof buf), 2);
    CHECK_ERR(read(s, buf, sizeof buf), EAGAIN);
    /* raw mode: bytes as they come, no echo, no output processing */
    drain(m, buf, sizeof buf);
    struct termios t;
    OK(tcgetattr(s, &t));
    cfmakeraw(&t);
    OK(tcsetattr(s, TCSANOW, &t));
    CHECK_EQ(write(m, "q\r", 2), 2);
    CHECK_EQ(read(s, buf, sizeof buf), 2);
    CHECK(!memcmp(buf, "q\r", 2), "%.2s", buf);
    CHECK_EQ(write(s, "\n", 1), 1);
    CHECK_EQ(drain(m, buf, sizeof buf), 1);
    CHECK_STR(buf, "\n");
    OK(close(m));
    OK(close(s));
}

static void test_termios(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int m, s;
    OK(openpty(&m, &s, NULL, NULL, NULL));
    struct termios t;
    OK(tcgetattr(s, &t));
    CHECK((t.c_lflag & (ICANON | ECHO | ISIG)) == (ICANON | ECHO | ISIG), "lflag 0%o", t.c_lflag);
    CHECK((t.c_oflag & (OPOST | ONLCR)) == (OPOST | ONLCR), "oflag 0%o", t.c_oflag);
    CHECK_EQ(t.c_cc[VINTR], 3);
    CHECK_EQ(t.c_cc[VEOF], 4);
    CHECK_EQ(cfgetospeed(&t), B38400);
    /* the master's termios are the slave's */
    t.c_lflag &= ~ECHO;
    OK(tcsetattr(m, TCSAFLUSH, &t));
    struct termios u;
    OK(tcgetattr(s, &u));
    CHECK_EQ(u.c_lflag & ECHO, 0);
    struct winsize w = {0};
    OK(ioctl(s, TIOCGWINSZ, &w));
    CHECK_EQ(w.ws_row, 0);
    CHECK_EQ(w.ws_col, 0);
    struct winsize set = {.ws_row = 24, .ws_col = 80};
    OK(ioctl(m, TIOCSWINSZ, &set));
    OK(ioctl(s, TIOCGWINSZ, &w));
    CHECK_EQ(w.ws_row, 24);
    CHECK_EQ(w.ws_col, 80);
    OK(tcflush(s, TCIOFLUSH));
    OK(tcdrain(s));
    CHECK_ERR(tcflush(s, 7), EINVAL);
    OK(close(m));
    OK(close(s));
}

/* Nonblocking writes of buf until EAGAIN (at most 64 of them): the bytes taken, bounded. */
static long fill(int fd, const char *buf, size_t n) {
    long total = 0;
    for (int i = 0; i < 64; i++) {
        long w = write(fd, buf, n);
        if (w < 0) {
            CHECK_EQ(errno, EAGAIN);
            return total;
        }
        total += w;
    }
    FAIL("64 writes of %zu bytes all taken (%ld)", n, total);
    return -1;
}

static void test_hostile(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int m, s;
    OK(openpty(&m, &s, NULL, NULL, NULL));
    void *bad = (void *)1, *kernel = (void *)0xffff800000000000ul;
    CHECK_ERR(syscall(SYS_ioctl, s, TCGETS, bad), EFAULT);
    CHECK_ERR(syscall(SYS_ioctl, s, TCSETS, kernel), EFAULT);
    CHECK_ERR(syscall(SYS_ioctl, m, TIOCSWINSZ, NULL), EFAULT);
    CHECK_ERR(syscall(SYS_ioctl, m, TIOCGWINSZ, kernel), EFAULT);
    CHECK_ERR(syscall(SYS_ioctl, m, TIOCGPTN, bad), EFAULT);
    CHECK_ERR(syscall(SYS_ioctl, m, TIOCSPTLCK, NULL), EFAULT);
    CHECK_ERR(syscall(SYS_ioctl, s, TIOCSPGRP, bad), EFAULT);
    /* TIOCGPTPEER takes any flags (Linux too): only the access mode and fd flags count */
    OK(close((int)OK(syscall(SYS_ioctl, m, TIOCGPTPEER, O_RDWR | O_CREAT | O_TRUNC | O_DIRECTORY))));
    int ro = (int)OK(syscall(SYS_ioctl, m, TIOCGPTPEER, O_RDONLY));
    CHECK_ERR(write(ro, "x", 1), EBADF);
    OK(close(ro));
    CHECK_ERR(syscall(SYS_ioctl, m, 0x5400 + 0x77, 0), ENOTTY);
    /* writes nobody reads: the input stream fills (64 KiB), then EAGAIN */
    static char big[1 << 20];
    memset(big, 'x', sizeof big);
    OK(fcntl(m, F_SETFL, O_NONBLOCK));
    OK(fcntl(s, F_SETFL, O_NONBLOCK));
    struct termios t;
    OK(tcgetattr(s, &t));
    t.c_lflag &= ~ECHO;
    OK(tcsetattr(s, TCSANOW, &t));
    CHECK(fill(m, big, sizeof big) > 0, "nothing taken"); /* the sandbox takes 64 KiB, Linux more */
    CHECK_EQ(revents(m, POLLOUT), 0);
    /* output with a newline per byte (each becomes two): fills, then EAGAIN */
    memset(big, '\n', sizeof big);
    CHECK(fill(s, big, sizeof big) > 0, "nothing taken");
    /* the master closes: the slave reads EOF (after the queued input) and writes EIO */
    OK(tcflush(s, TCIFLUSH));
    OK(close(m));
    char buf[16];
    CHECK_EQ(read(s, buf, sizeof buf), 0);
    CHECK_ERR(write(s, "x", 1), EIO);
    CHECK(revents(s, POLLIN) & POLLHUP, "no POLLHUP");
    OK(close(s));
    /* the slave closes: the master reads what is queued, then EIO, and polls POLLHUP */
    OK(openpty(&m, &s, NULL, NULL, NULL));
    CHECK_EQ(write(s, "z", 1), 1);
    OK(close(s));
    CHECK(revents(m, POLLIN) & POLLHUP, "no POLLHUP");
    CHECK_EQ(read(m, buf, sizeof buf), 1);
    CHECK_ERR(read(m, buf, sizeof buf), EIO);
    OK(close(m));
}

/* forkpty: the child is a session leader with the pty as its controlling terminal and stdio. */
static void test_fork(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int m;
    fflush(stdout);
    pid_t pid = forkpty(&m, NULL, NULL, NULL);
    if (pid < 0) { FAIL("forkpty: %s", strerror(errno)); return; }
    if (pid == 0) {
        CHECK_EQ(isatty(0) && isatty(1), 1);
        CHECK_EQ(getsid(0), getpid());
        CHECK_EQ(tcgetpgrp(1), getpgrp());
        printf("hello\n");
        fflush(stdout);
        char line[32];
        CHECK(fgets(line, sizeof line, stdin) != NULL, "no line");
        CHECK_STR(line, "ping\n");
        child_exit(3);
    }
    CHECK_EQ(write(m, "ping\n", 5), 5);
    char buf[256];
    size_t n = 0;
    for (;;) { /* blocking reads until the child's end closes (EIO) */
        long r = read(m, buf + n, sizeof buf - 1 - n);
        if (r <= 0) { CHECK(r == 0 || errno == EIO, "read: %s", strerror(errno)); break; }
        n += (size_t)r;
    }
    buf[n] = 0;
    CHECK(strstr(buf, "ping\r\n") && strstr(buf, "hello\r\n"), "got \"%s\"", buf);
    expect_exit(pid, 3);
    OK(close(m));

    /* ^C reaches the foreground process group */
    pid = forkpty(&m, NULL, NULL, NULL);
    if (pid < 0) { FAIL("forkpty: %s", strerror(errno)); return; }
    if (pid == 0) {
        CHECK_EQ(write(1, "R", 1), 1);
        char c;
        for (;;) read(0, &c, 1);
    }
    char c;
    CHECK_EQ(read(m, &c, 1), 1);
    CHECK_EQ(write(m, "\x03", 1), 1);
    expect_signal(pid, SIGINT);
    OK(close(m));

    /* the session leader's exit hangs up its terminal's foreground group: a process of that group
     * it leaves behind (holding a pipe's write end until it ends) gets SIGHUP */
    int hup[2];
    OK(pipe(hup));
    fflush(stdout);
    pid = forkpty(&m, NULL, NULL, NULL);
    if (pid < 0) { FAIL("forkpty: %s", strerror(errno)); return; }
    if (pid == 0) {
        close(hup[0]);
        if (fork_or_fail() == 0) {
            for (;;) pause(); /* ended only by a signal */
        }
        child_exit(0);
    }
    OK(close(hup[1]));
    CHECK_EQ(read(hup[0], &c, 1), 0); /* EOF: the process left behind ended */
    expect_exit(pid, 0);
    OK(close(hup[0]));
    OK(close(m));

    /* closing the master while a reader waits: its read ends with EOF */
    int s;
    OK(openpty(&m, &s, NULL, NULL, NULL));
    pid = fork_or_fail();
    if (pid == 0) {
        close(m);
        char b[8];
        CHECK_EQ(write(s, "W", 1), 1);
        long r = read(s, b, sizeof b); /* blocks until the parent closes the master */
        /* Linux wakes a waiting reader with EIO (a later read is EOF); the sandbox says EOF */
        CHECK(r == 0 || (r == -1 && errno == EIO), "r = %ld (%s)", r, strerror(errno));
        child_exit(0);
    }
    OK(close(s));
    CHECK_EQ(read(m, &c, 1), 1);
    OK(close(m));
    expect_exit(pid, 0);
}

/* A pty across a snapshot: window size, queued input and its echo, the index. */
/* Read exactly n bytes (blocking; Linux's pty delivers in pieces). */
static void read_all(int fd, char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        long r = read(fd, buf + got, n - got);
        if (r <= 0) { FAIL("read: %ld %s", r, strerror(errno)); return; }
        got += (size_t)r;
    }
    buf[n] = 0;
}

static int pts_lists(const char *name) {
    DIR *d = opendir("/dev/pts");
    if (!d) { FAIL("opendir /dev/pts: %s", strerror(errno)); return 0; }
    int found = 0;
    for (struct dirent *e; (e = readdir(d));) found |= !strcmp(e->d_name, name);
    closedir(d);
    return found;
}

/* /dev/pts: the entries, stat of a name and fstat of a slave agreeing, ttyname of both ends, opening a
 * slave by name (EIO while locked, ENOENT after the master closed), O_NOCTTY and the controlling
 * terminal, hostile names. */
static void test_pts(int argc, char **argv) {
    (void)argc;
    (void)argv;
    struct stat st, fst;
    OK(stat("/dev/pts", &st));
    CHECK(S_ISDIR(st.st_mode), "mode 0%o", st.st_mode);
    OK(stat("/dev/pts/ptmx", &st));
    CHECK(S_ISCHR(st.st_mode) && (st.st_mode & 07777) == 0, "mode 0%o", st.st_mode);
    CHECK_EQ(major(st.st_rdev), 5);
    CHECK_EQ(minor(st.st_rdev), 2);
    CHECK_EQ(pts_lists("ptmx"), 1);

    int m = (int)OK(posix_openpt(O_RDWR | O_NOCTTY));
    unsigned n;
    OK(ioctl(m, TIOCGPTN, &n));
    char name[32], num[16];
    snprintf(name, sizeof name, "/dev/pts/%u", n);
    snprintf(num, sizeof num, "%u", n);
    CHECK_EQ(pts_lists(num), 1); /* listed from the open of ptmx, locked or not */
    OK(stat(name, &st));
    CHECK(S_ISCHR(st.st_mode), "mode 0%o", st.st_mode);
    CHECK_EQ(major(st.st_rdev), 136);
    CHECK_EQ(minor(st.st_rdev), n);
    CHECK_ERR(open(name, O_RDWR | O_NOCTTY), EIO); /* locked until unlockpt */
    OK(unlockpt(m));
    int s = (int)OK(open(name, O_RDWR | O_NOCTTY));
    CHECK_EQ(isatty(s), 1);
    OK(fstat(s, &fst));
    CHECK(fst.st_rdev == st.st_rdev && fst.st_ino == st.st_ino && fst.st_dev == st.st_dev,
          "fstat %lx/%lu/%lx, stat %lx/%lu/%lx", (long)fst.st_rdev, (unsigned long)fst.st_ino, (long)fst.st_dev,
          (long)st.st_rdev, (unsigned long)st.st_ino, (long)st.st_dev);
    CHECK_STR(ttyname(s), name);
    CHECK_STR(ttyname(m), "/dev/ptmx");
    int peer = (int)OK(ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY));
    CHECK_STR(ttyname(peer), name);
    OK(close(peer));

    /* talk through the slave opened by name */
    char buf[64];
    CHECK_EQ(write(m, "hi\n", 3), 3);
    read_all(s, buf, 3);
    CHECK_STR(buf, "hi\n");
    read_all(m, buf, 4); /* the echo */
    CHECK_STR(buf, "hi\r\n");
    CHECK_EQ(write(s, "yo\n", 3), 3);
    read_all(m, buf, 4);
    CHECK_STR(buf, "yo\r\n");

    /* names devpts never makes */
    const char *bad[] = {"/dev/pts/00", "/dev/pts/-1", "/dev/pts/+0", "/dev/pts/ 0", "/dev/pts/0x0", "/dev/pts/64",
                         "/dev/pts/4294967296", "/dev/pts/99999999999999999999999", "/dev/pts/0/", "/dev/pts/0/x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (!strcmp(bad[i], name)) continue;
        errno = 0;
        CHECK(stat(bad[i], &st) < 0 && (errno == ENOENT || errno == ENOTDIR), "stat %s: errno %d", bad[i], errno);
    }

    /* without O_NOCTTY, a session leader with no terminal gets this one */
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        CHECK_EQ(setsid(), getpid());
        int a = (int)OK(open(name, O_RDWR | O_NOCTTY));
        pid_t sid;
        CHECK_ERR(ioctl(a, TIOCGSID, &sid), ENOTTY);
        int b = (int)OK(open(name, O_RDWR));
        OK(ioctl(b, TIOCGSID, &sid));
        CHECK_EQ(sid, getpid());
        CHECK_EQ(tcgetpgrp(b), getpgrp());
        child_exit(0);
    }
    expect_exit(pid, 0);

    /* the master closed: the name is gone */
    OK(close(m));
    CHECK_ERR(stat(name, &st), ENOENT);
    CHECK_ERR(open(name, O_RDWR | O_NOCTTY), ENOENT);
    CHECK_EQ(pts_lists(num), 0);
    OK(close(s));
}

static void test_snapshot_state(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int m, s;
    OK(openpty(&m, &s, NULL, NULL, NULL));
    struct winsize set = {.ws_row = 30, .ws_col = 100};
    OK(ioctl(m, TIOCSWINSZ, &set));
    CHECK_EQ(write(m, "queued\n", 7), 7);
    int tty = (int)OK(open("/dev/ttyS0", O_RDWR));
    printf("ready\n");
    fflush(stdout);
    char go[8];
    OK(read(tty, go, sizeof go)); /* the host snapshots here */
    struct winsize w = {0};
    OK(ioctl(s, TIOCGWINSZ, &w));
    CHECK_EQ(w.ws_row, 30);
    CHECK_EQ(w.ws_col, 100);
    char buf[64];
    CHECK_EQ(read(s, buf, sizeof buf), 7);
    CHECK(!memcmp(buf, "queued\n", 7), "%.7s", buf);
    CHECK_EQ(drain(m, buf, sizeof buf), 8);
    CHECK_STR(buf, "queued\r\n");
    unsigned n = 9;
    OK(ioctl(m, TIOCGPTN, &n));
    CHECK_EQ(n, 0);
    CHECK_EQ(isatty(s), 1);
    CHECK_STR(ttyname(s), "/dev/pts/0"); /* the restored pty has its /dev/pts entry */
    int again = (int)OK(open("/dev/pts/0", O_RDWR | O_NOCTTY));
    CHECK_EQ(write(again, "x\n", 2), 2);
    read_all(m, buf, 3);
    CHECK_STR(buf, "x\r\n");
}

static const zb_test tests[] = {
    {"openpt", test_openpt},
    {"limit", test_limit},
    {"io", test_io},
    {"termios", test_termios},
    {"hostile", test_hostile},
    {"fork", test_fork},
    {"pts", test_pts},
    {"snapshot_state", test_snapshot_state},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
