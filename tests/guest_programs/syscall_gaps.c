/* syscall_gaps.c - memfd_create and its seals, sendfile, copy_file_range, getpriority/setpriority,
 * F_GETPIPE_SZ/F_SETPIPE_SZ, whole blocking pipe writes, FIFOs and resource limits, with Linux's
 * error cases. Every
 * test also passes on Linux (tests/test_guest_syscall_gaps.py runs them on the host too), so the
 * checks are Linux's behaviour; the few answers that depend on who runs them (root on the host,
 * uid 1000 in the guest; host files and the sandbox's own being two file systems in the guest)
 * say so where they are checked.
 */
#include "check.h"
#include "children.h"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/utsname.h>

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

static void *const BAD_PTR = (void *)16; /* the low pages: never guest or user memory */

static int in_guest(void) {
    struct utsname u;
    return uname(&u) == 0 && !strcmp(u.nodename, "zeroboot");
}

static int memfd(const char *name, unsigned flags) { return (int)syscall(SYS_memfd_create, name, flags); }

static int tmp_file(const char *tag) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/zbgaps-%s-%d", tag, getpid());
    int fd = (int)OK(open(path, O_RDWR | O_CREAT | O_TRUNC, 0600));
    unlink(path);
    return fd;
}

/* memfd_create: a regular file with no name and no link, its reads, writes and sizes, its flags
 * and argument errors, its mappings (shared across fork, private not written back), inherited. */
static void test_memfd(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = memfd("gaps", 0);
    CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
    struct stat st;
    OK(fstat(fd, &st));
    CHECK(S_ISREG(st.st_mode), "mode %o", st.st_mode);
    CHECK_EQ(st.st_nlink, 0);
    CHECK_EQ(st.st_size, 0);
    CHECK_EQ(fcntl(fd, F_GETFD), 0);
    CHECK_EQ(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR);
    CHECK_EQ(write(fd, "hello memfd", 11), 11);
    CHECK_EQ(lseek(fd, 0, SEEK_CUR), 11);
    char buf[64] = {0};
    CHECK_EQ(pread(fd, buf, sizeof buf, 6), 5);
    CHECK(!memcmp(buf, "memfd", 5), "pread %.5s", buf);
    CHECK_EQ(pwrite(fd, "HELLO", 5, 0), 5);
    CHECK_EQ(lseek(fd, 0, SEEK_SET), 0);
    CHECK_EQ(read(fd, buf, sizeof buf), 11);
    CHECK(!memcmp(buf, "HELLO memfd", 11), "read %.11s", buf);
    OK(ftruncate(fd, 3 * PAGE));
    OK(fstat(fd, &st));
    CHECK_EQ(st.st_size, 3 * PAGE);
    OK(ftruncate(fd, 5));
    CHECK_EQ(pread(fd, buf, sizeof buf, 0), 5);
    CHECK_ERR(ftruncate(fd, -1), EINVAL);
    /* never named */
    char target[64];
    snprintf(target, sizeof target, "/tmp/zbgaps-link-%d", getpid());
    CHECK_ERR(linkat(fd, "", AT_FDCWD, target, AT_EMPTY_PATH), EXDEV); /* Linux: its own mount */
    /* flags and arguments */
    int cl = memfd("cloexec", MFD_CLOEXEC);
    CHECK_EQ(fcntl(cl, F_GETFD), FD_CLOEXEC);
    close(cl);
    CHECK_ERR(memfd("bad", 0x1000), EINVAL);
    CHECK_ERR(memfd("bad", MFD_CLOEXEC | 0x80000000u), EINVAL);
    CHECK_ERR(syscall(SYS_memfd_create, BAD_PTR, 0), EFAULT);
    char name[300];
    memset(name, 'n', sizeof name);
    name[250] = 0; /* 250 characters: one more than Linux's MFD_NAME_MAX_LEN */
    CHECK_ERR(memfd(name, 0), EINVAL);
    name[249] = 0;
    int longest = memfd(name, 0);
    CHECK(longest >= 0, "a 249-character name: %s", strerror(errno));
    close(longest);
    int empty = memfd("", 0);
    CHECK(empty >= 0, "an empty name: %s", strerror(errno));
    close(empty);
    if (in_guest()) /* huge-page memfds are not emulated: as a kernel without hugetlbfs */
        CHECK_ERR(memfd("huge", MFD_HUGETLB), ENOSYS);
    /* a shared mapping is the file, in this process and in a child; a private one is a copy */
    OK(ftruncate(fd, 2 * PAGE));
    char *shared = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(shared != MAP_FAILED, "mmap shared: %s", strerror(errno));
    char *priv = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    CHECK(priv != MAP_FAILED, "mmap private: %s", strerror(errno));
    if (shared == MAP_FAILED || priv == MAP_FAILED) return;
    CHECK(!memcmp(shared, "HELLO", 5), "mapped %.5s", shared);
    memcpy(shared + PAGE, "from the parent", 15);
    CHECK_EQ(pread(fd, buf, 15, PAGE), 15);
    CHECK(!memcmp(buf, "from the parent", 15), "read back %.15s", buf);
    memcpy(priv, "PRIVATE", 7);
    CHECK_EQ(pread(fd, buf, 7, 0), 7);
    CHECK(!memcmp(buf, "HELLO\0\0", 7), "a private write reached the file: %.7s", buf);
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        CHECK(!memcmp(shared + PAGE, "from the parent", 15), "child sees %.15s", shared + PAGE);
        memcpy(shared + PAGE, "from the child!", 15);
        CHECK_EQ(pwrite(fd, "fd", 2, 100), 2); /* the inherited fd is the same file */
        child_exit(0);
    }
    expect_exit(pid, 0);
    CHECK(!memcmp(shared + PAGE, "from the child!", 15), "parent sees %.15s", shared + PAGE);
    CHECK(!memcmp(shared + 100, "fd", 2), "parent's mapping sees the child's write: %.2s", shared + 100);
    munmap(shared, 2 * PAGE);
    munmap(priv, PAGE);
    close(fd);
}

/* Seals: F_SEAL_SEAL without MFD_ALLOW_SEALING; SHRINK, GROW (page by page), WRITE (EBUSY while a
 * writable shared mapping exists; then no writes or writable shared mappings), SEAL, bad seals. */
static void test_seals(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int plain = memfd("plain", 0);
    CHECK_EQ(fcntl(plain, F_GET_SEALS), F_SEAL_SEAL);
    CHECK_ERR(fcntl(plain, F_ADD_SEALS, F_SEAL_WRITE), EPERM);
    close(plain);
    int p[2];
    OK(pipe(p));
    CHECK_ERR(fcntl(p[0], F_GET_SEALS), EINVAL);
    CHECK_ERR(fcntl(p[1], F_ADD_SEALS, F_SEAL_WRITE), EINVAL);
    close(p[0]);
    close(p[1]);
    int fd = memfd("sealed", MFD_ALLOW_SEALING);
    CHECK_EQ(fcntl(fd, F_GET_SEALS), 0);
    CHECK_ERR(fcntl(fd, F_ADD_SEALS, 0x100), EINVAL);
    OK(ftruncate(fd, PAGE + 10));
    OK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK));
    CHECK_ERR(ftruncate(fd, PAGE), EPERM);
    OK(ftruncate(fd, PAGE + 10)); /* the same size: no change */
    OK(fcntl(fd, F_ADD_SEALS, F_SEAL_GROW));
    CHECK_EQ(fcntl(fd, F_GET_SEALS), F_SEAL_SHRINK | F_SEAL_GROW);
    CHECK_ERR(ftruncate(fd, 2 * PAGE), EPERM);
    CHECK_ERR(fallocate(fd, 0, 0, 2 * PAGE), EPERM);
    CHECK_EQ(pwrite(fd, "inside", 6, 100), 6);
    char big[100];
    memset(big, 'g', sizeof big);
    /* a write across the end: the page it starts in is written, the one holding the end is not */
    CHECK_EQ(pwrite(fd, big, sizeof big, PAGE - 6), 6);
    CHECK_ERR(pwrite(fd, big, sizeof big, PAGE + 5), EPERM);
    CHECK_ERR(pwrite(fd, big, 1, PAGE + 10), EPERM); /* appending */
    struct stat st;
    OK(fstat(fd, &st));
    CHECK_EQ(st.st_size, PAGE + 10);
    /* F_SEAL_WRITE: refused while a shared mapping exists (a memfd's fds are O_RDWR: a read-only
     * shared mapping of it may become writable, so it holds the seal off too) */
    char *w = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(w != MAP_FAILED, "mmap: %s", strerror(errno));
    CHECK_ERR(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), EBUSY);
    munmap(w, PAGE);
    char *ro = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(ro != MAP_FAILED, "mmap read-only: %s", strerror(errno));
    CHECK_ERR(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), EBUSY);
    munmap(ro, PAGE);
    ro = mmap(NULL, PAGE, PROT_READ, MAP_PRIVATE, fd, 0); /* a private one does not */
    CHECK(ro != MAP_FAILED, "mmap private: %s", strerror(errno));
    OK(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE));
    CHECK_ERR(write(fd, "x", 1), EPERM);
    CHECK_ERR(pwrite(fd, "x", 1, 0), EPERM);
    CHECK_ERR(mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), EPERM);
    char *ro2 = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(ro2 != MAP_FAILED, "a read-only shared mapping of a write-sealed file: %s", strerror(errno));
    char *cow = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    CHECK(cow != MAP_FAILED, "a private writable mapping of a write-sealed file: %s", strerror(errno));
    if (ro != MAP_FAILED) CHECK(!memcmp(ro + 100, "inside", 6), "mapped %.6s", ro + 100);
    OK(fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL));
    CHECK_ERR(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), EPERM);
    CHECK_EQ(fcntl(fd, F_GET_SEALS), F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE);
    /* F_SEAL_FUTURE_WRITE: no new writes */
    int fw = memfd("future", MFD_ALLOW_SEALING);
    CHECK_EQ(write(fw, "abc", 3), 3);
    OK(fcntl(fw, F_ADD_SEALS, F_SEAL_FUTURE_WRITE));
    CHECK_ERR(write(fw, "d", 1), EPERM);
    OK(ftruncate(fw, 10)); /* not a write: only SHRINK and GROW stop it */
    close(fw);
    close(fd);
}

/* sendfile: offsets (given: the input's own stays; not given: it advances), outputs (a file, a
 * pipe, a full non-blocking pipe), and the errors, in Linux's order. */
static void test_sendfile(int argc, char **argv) {
    (void)argc;
    int in = tmp_file("sf-in");
    char data[10000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (char)('a' + i % 26);
    CHECK_EQ(write(in, data, sizeof data), (long)sizeof data);
    int out = tmp_file("sf-out");
    off_t off = 100;
    CHECK_EQ(sendfile(out, in, &off, 1000), 1000);
    CHECK_EQ(off, 1100);
    CHECK_EQ(lseek(in, 0, SEEK_CUR), (long)sizeof data); /* unchanged */
    CHECK_EQ(lseek(out, 0, SEEK_CUR), 1000);
    char buf[10000];
    CHECK_EQ(pread(out, buf, sizeof buf, 0), 1000);
    CHECK(!memcmp(buf, data + 100, 1000), "the bytes copied");
    OK(lseek(in, 9000, SEEK_SET));
    CHECK_EQ(sendfile(out, in, NULL, 1 << 30), 1000); /* a huge count: to the end */
    CHECK_EQ(lseek(in, 0, SEEK_CUR), 10000);
    CHECK_EQ(sendfile(out, in, NULL, 100), 0); /* at the end */
    off = 20000;
    CHECK_EQ(sendfile(out, in, &off, 100), 0);
    CHECK_EQ(off, 20000);
    CHECK_EQ(sendfile(out, in, NULL, 0), 0);
    /* into a pipe; a full non-blocking one says EAGAIN */
    int p[2];
    OK(pipe2(p, O_NONBLOCK));
    off = 0;
    CHECK_EQ(sendfile(p[1], in, &off, 5000), 5000);
    CHECK_EQ(read(p[0], buf, sizeof buf), 5000);
    CHECK(!memcmp(buf, data, 5000), "the piped bytes");
    long filled = 0, r;
    while ((r = write(p[1], data, sizeof data)) > 0) filled += r;
    CHECK_ERR(sendfile(p[1], in, &(off_t){0}, 10), EAGAIN);
    CHECK(filled > 60000, "filled %ld", filled); /* (Linux counts pages of the pipe, not bytes) */
    /* a host file (the program itself) into the sandbox's /tmp */
    int self = (int)OK(open(argv[0], O_RDONLY));
    struct stat st;
    OK(fstat(self, &st));
    int copy = tmp_file("sf-self");
    long total = 0;
    while ((r = sendfile(copy, self, NULL, 1 << 20)) > 0) total += r;
    CHECK_EQ(total, st.st_size);
    static char a[1 << 16], b[1 << 16];
    for (off_t at = 0; at < st.st_size; at += sizeof a) {
        long n = pread(self, a, sizeof a, at);
        CHECK_EQ(pread(copy, b, sizeof b, at), n);
        CHECK(n > 0 && !memcmp(a, b, (size_t)n), "the copy differs at %ld", (long)at);
    }
    /* errors */
    CHECK_ERR(sendfile(out, p[0], NULL, 10), EINVAL);   /* from a pipe */
    CHECK_ERR(sendfile(out, p[0], &off, 10), ESPIPE);   /* a pipe has no position */
    CHECK_ERR(sendfile(out, in, (off_t *)BAD_PTR, 10), EFAULT);
    off = -1;
    CHECK_ERR(sendfile(out, in, &off, 10), EINVAL);
    CHECK_ERR(sendfile(out, in, &(off_t){5}, SIZE_MAX), EINVAL); /* a count that is negative as ssize_t */
    CHECK_ERR(sendfile(out, 999, NULL, 10), EBADF);
    CHECK_ERR(sendfile(999, in, NULL, 10), EBADF);
    int rd = (int)OK(open(argv[0], O_RDONLY));
    CHECK_ERR(sendfile(rd, in, &(off_t){0}, 10), EBADF);  /* the output is not writable */
    int wo = (int)OK(dup(copy));
    char path[64];
    snprintf(path, sizeof path, "/tmp/zbgaps-wo-%d", getpid());
    int wronly = (int)OK(open(path, O_WRONLY | O_CREAT, 0600));
    CHECK_ERR(sendfile(out, wronly, &(off_t){0}, 10), EBADF); /* the input is not readable */
    int app = (int)OK(open(path, O_WRONLY | O_APPEND));
    CHECK_ERR(sendfile(app, in, &(off_t){0}, 10), EINVAL);
    unlink(path);
    close(app);
    close(wronly);
    close(wo);
    close(rd);
    close(self);
    close(copy);
    close(p[0]);
    close(p[1]);
    close(in);
    close(out);
}

/* copy_file_range: offsets updated as given, the errors (flags, overlaps within one file, pipes,
 * directories, access modes, O_APPEND, bad or negative offsets), copies past the end. */
static void test_copy_file_range(int argc, char **argv) {
    (void)argc;
    int in = tmp_file("cfr-in");
    char data[20000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (char)('A' + i % 23);
    CHECK_EQ(write(in, data, sizeof data), (long)sizeof data);
    int out = tmp_file("cfr-out");
    loff_t oi = 1000, oo = 50;
    CHECK_EQ(copy_file_range(in, &oi, out, &oo, 5000, 0), 5000);
    CHECK_EQ(oi, 6000);
    CHECK_EQ(oo, 5050);
    CHECK_EQ(lseek(in, 0, SEEK_CUR), 20000); /* the files' own offsets stay */
    CHECK_EQ(lseek(out, 0, SEEK_CUR), 0);
    char buf[20000];
    CHECK_EQ(pread(out, buf, sizeof buf, 0), 5050);
    CHECK(!memcmp(buf + 50, data + 1000, 5000), "the bytes copied");
    CHECK(!memcmp(buf, (char[50]){0}, 50), "the hole before them reads zeros");
    OK(lseek(in, 19000, SEEK_SET));
    CHECK_EQ(copy_file_range(in, NULL, out, NULL, 1 << 30, 0), 1000); /* to the end; offsets move */
    CHECK_EQ(lseek(in, 0, SEEK_CUR), 20000);
    CHECK_EQ(lseek(out, 0, SEEK_CUR), 1000);
    CHECK_EQ(copy_file_range(in, NULL, out, NULL, 100, 0), 0);
    oi = 30000;
    CHECK_EQ(copy_file_range(in, &oi, out, NULL, 100, 0), 0);
    /* within one file: apart is fine, overlapping is EINVAL */
    oi = 0, oo = 10000;
    CHECK_EQ(copy_file_range(in, &oi, in, &oo, 5000, 0), 5000);
    oi = 0, oo = 100;
    CHECK_ERR(copy_file_range(in, &oi, in, &oo, 5000, 0), EINVAL);
    /* errors */
    CHECK_ERR(copy_file_range(in, NULL, out, NULL, 10, 1), EINVAL);
    CHECK_ERR(copy_file_range(999, NULL, out, NULL, 10, 0), EBADF);
    CHECK_ERR(copy_file_range(in, NULL, 999, NULL, 10, 0), EBADF);
    int p[2];
    OK(pipe(p));
    CHECK_ERR(copy_file_range(p[0], NULL, out, NULL, 10, 0), EINVAL);
    CHECK_ERR(copy_file_range(in, &(loff_t){0}, p[1], NULL, 10, 0), EINVAL);
    int dir = (int)OK(open("/tmp", O_RDONLY | O_DIRECTORY));
    CHECK_ERR(copy_file_range(dir, NULL, out, NULL, 10, 0), EISDIR);
    CHECK_ERR(copy_file_range(in, (loff_t *)BAD_PTR, out, NULL, 10, 0), EFAULT);
    CHECK_ERR(copy_file_range(in, NULL, out, (loff_t *)BAD_PTR, 10, 0), EFAULT);
    oi = -5;
    CHECK_ERR(copy_file_range(in, &oi, out, NULL, 10, 0), EOVERFLOW); /* -5 + 10 wraps as unsigned */
    oi = -5;
    CHECK_ERR(copy_file_range(in, &oi, out, NULL, 2, 0), EINVAL);
    oi = 5;
    CHECK_ERR(copy_file_range(in, &oi, out, NULL, SIZE_MAX, 0), EOVERFLOW);
    oi = 5;
    CHECK_EQ(copy_file_range(in, &oi, out, &(loff_t){0}, INT64_MAX, 0), 19995);
    char path[64];
    snprintf(path, sizeof path, "/tmp/zbgaps-cfr-%d", getpid());
    int app = (int)OK(open(path, O_WRONLY | O_CREAT | O_APPEND, 0600));
    CHECK_ERR(copy_file_range(in, &(loff_t){0}, app, NULL, 10, 0), EBADF);
    int rdonly = (int)OK(open(path, O_RDONLY));
    CHECK_ERR(copy_file_range(in, &(loff_t){0}, rdonly, NULL, 10, 0), EBADF);
    int wronly = (int)OK(open(path, O_WRONLY));
    CHECK_ERR(copy_file_range(wronly, &(loff_t){0}, out, NULL, 10, 0), EBADF);
    unlink(path);
    if (in_guest()) { /* a host file (the program) and /tmp are two file systems in the guest */
        int self = (int)OK(open(argv[0], O_RDONLY));
        CHECK_ERR(copy_file_range(self, NULL, out, NULL, 10, 0), EXDEV);
        CHECK_EQ(copy_file_range(self, &(loff_t){1 << 30}, out, NULL, 10, 0), 0); /* nothing to copy first */
        close(self);
    }
    close(app);
    close(rdonly);
    close(wronly);
    close(dir);
    close(p[0]);
    close(p[1]);
    close(in);
    close(out);
}

static long raw_getpriority(int which, int who) { return syscall(SYS_getpriority, which, who); }

/* getpriority/setpriority: the raw 20 - nice answer, nice(), clamping, lowering (allowed: RLIMIT_NICE
 * is unlimited in the guest, root on the host), the targets (a child, a group, the uid), ESRCH and
 * EINVAL, inherited across fork. */
static void test_priority(int argc, char **argv) {
    (void)argc;
    (void)argv;
    /* a group of its own: PRIO_PGRP then names this process and its children (a session leader,
     * as the guest's process 1 is, leads its group already and may not move: EPERM) */
    if (setpgid(0, 0) < 0) CHECK_EQ(getpgid(0), getpid());
    OK(setpriority(PRIO_PROCESS, 0, 0));
    CHECK_EQ(raw_getpriority(PRIO_PROCESS, 0), 20);
    OK(setpriority(PRIO_PROCESS, 0, 5));
    CHECK_EQ(raw_getpriority(PRIO_PROCESS, 0), 15);
    CHECK_EQ(raw_getpriority(PRIO_PROCESS, getpid()), 15);
    errno = 0;
    CHECK_EQ(getpriority(PRIO_PROCESS, 0), 5);
    CHECK_EQ(errno, 0);
    CHECK_EQ(nice(2), 7);
    CHECK_EQ(getpriority(PRIO_PGRP, 0), 7);
    CHECK_EQ(getpriority(PRIO_USER, 0), getpriority(PRIO_USER, getuid())); /* every process of the uid */
    OK(setpriority(PRIO_PROCESS, 0, 100)); /* clamped */
    CHECK_EQ(raw_getpriority(PRIO_PROCESS, 0), 1);
    OK(setpriority(PRIO_PROCESS, 0, -100));
    CHECK_EQ(raw_getpriority(PRIO_PROCESS, 0), 40);
    OK(setpriority(PRIO_PROCESS, 0, 3));
    CHECK_ERR(getpriority(7, 0), EINVAL);
    CHECK_ERR(setpriority(7, 0, 1), EINVAL);
    CHECK_ERR(getpriority(PRIO_PROCESS, -1), ESRCH);
    /* a child inherits the value; each sets its own; the parent reads and sets the child's */
    int go[2], back[2];
    OK(pipe(go));
    OK(pipe(back));
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        CHECK_EQ(getpriority(PRIO_PROCESS, 0), 3);
        OK(setpriority(PRIO_PROCESS, 0, 9));
        CHECK_EQ(write(back[1], "s", 1), 1);
        char c;
        CHECK_EQ(read(go[0], &c, 1), 1);
        CHECK_EQ(getpriority(PRIO_PROCESS, 0), 11); /* the parent set it */
        child_exit(0);
    }
    char c;
    CHECK_EQ(read(back[0], &c, 1), 1);
    CHECK_EQ(getpriority(PRIO_PROCESS, pid), 9);
    CHECK_EQ(getpriority(PRIO_PROCESS, 0), 3);
    OK(setpriority(PRIO_PROCESS, pid, 11));
    CHECK_EQ(write(go[1], "g", 1), 1);
    expect_exit(pid, 0);
    CHECK_ERR(getpriority(PRIO_PROCESS, pid), ESRCH); /* reaped */
    CHECK_ERR(setpriority(PRIO_PROCESS, pid, 1), ESRCH);
    OK(setpriority(PRIO_PROCESS, 0, 0));
}

/* F_GETPIPE_SZ/F_SETPIPE_SZ: the default, rounding to a power of two of at least a page, what a
 * writer may put in, EBUSY below what it holds, the limit (1 MiB: root may pass it on Linux, the
 * guest's uid may not), EINVAL and EBADF. */
static void test_pipe_size(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int p[2];
    OK(pipe2(p, O_NONBLOCK));
    CHECK_EQ(fcntl(p[0], F_GETPIPE_SZ), 65536);
    CHECK_EQ(fcntl(p[1], F_SETPIPE_SZ, 100000), 131072);
    CHECK_EQ(fcntl(p[0], F_GETPIPE_SZ), 131072);
    static char chunk[4096];
    long filled = 0, r;
    while ((r = write(p[1], chunk, sizeof chunk)) > 0) filled += r;
    CHECK_ERR(write(p[1], chunk, 1), EAGAIN);
    CHECK_EQ(filled, 131072);
    struct pollfd pf = {.fd = p[1], .events = POLLOUT};
    CHECK_EQ(poll(&pf, 1, 0), 0); /* full: not writable */
    CHECK_ERR(fcntl(p[1], F_SETPIPE_SZ, 4096), EBUSY);
    static char sink[131072];
    CHECK_EQ(read(p[0], sink, sizeof sink), 131072);
    CHECK_EQ(fcntl(p[1], F_SETPIPE_SZ, 0), 4096); /* at least a page */
    CHECK_EQ(fcntl(p[1], F_SETPIPE_SZ, 4097), 8192);
    CHECK_EQ(fcntl(p[1], F_SETPIPE_SZ, 1), 4096);
    CHECK_EQ(write(p[1], chunk, sizeof chunk), 4096);
    CHECK_ERR(write(p[1], chunk, 1), EAGAIN);
    CHECK_EQ(read(p[0], sink, sizeof sink), 4096);
    CHECK_EQ(fcntl(p[1], F_SETPIPE_SZ, 1 << 20), 1 << 20);
    if (geteuid() != 0) CHECK_ERR(fcntl(p[1], F_SETPIPE_SZ, 2 << 20), EPERM); /* past pipe-max-size
                                                (root may pass it with CAP_SYS_RESOURCE) */
    CHECK_ERR(fcntl(p[1], F_SETPIPE_SZ, 0x80000001u), EINVAL);
    int f = tmp_file("pipesz");
    CHECK_ERR(fcntl(f, F_GETPIPE_SZ), EBADF);
    CHECK_ERR(fcntl(f, F_SETPIPE_SZ, 8192), EBADF);
    close(f);
    close(p[0]);
    close(p[1]);
}

/* A blocking write bigger than the pipe returns once all its bytes are in, as Linux's pipe_write
 * (an unbuffered 4 MiB write of a child lost all but 64 KiB before). */
static void test_whole_write(int argc, char **argv) {
    (void)argc;
    (void)argv;
    enum { N = (1 << 20) + 3 };
    static char data[N];
    for (size_t i = 0; i < N; i++) data[i] = (char)(i * 7);
    int p[2], res[2];
    OK(pipe(p));
    OK(pipe(res));
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        close(p[0]);
        long n = write(p[1], data, N);
        CHECK_EQ(write(res[1], &n, sizeof n), (long)sizeof n);
        child_exit(0);
    }
    close(p[1]);
    static char got[N + 10];
    long total = 0, r;
    while ((r = read(p[0], got + total, sizeof got - (size_t)total)) > 0) total += r;
    CHECK_EQ(total, N);
    CHECK(!memcmp(got, data, N), "the bytes");
    long n = 0;
    CHECK_EQ(read(res[0], &n, sizeof n), (long)sizeof n);
    CHECK_EQ(n, N);
    expect_exit(pid, 0);
}

/* mknod: a regular file (S_IFREG or no type) is made as by open(O_CREAT | O_EXCL); a bad type is
 * EINVAL; an existing name EEXIST. A FIFO is made (fifo.c tests it); socket files are not made by
 * mknod in the guest (ENOSYS, logged: bind(2) makes them). */
static void test_mknod(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char path[64];
    snprintf(path, sizeof path, "/tmp/zbgaps-node-%d", getpid());
    OK(mknod(path, S_IFREG | 0640, 0));
    struct stat st;
    OK(stat(path, &st));
    CHECK(S_ISREG(st.st_mode) && st.st_size == 0, "mode %o size %ld", st.st_mode, (long)st.st_size);
    CHECK_ERR(mknod(path, S_IFREG | 0600, 0), EEXIST);
    OK(unlink(path));
    OK(mknodat(AT_FDCWD, path, 0600, 0)); /* no type: a regular file */
    OK(stat(path, &st));
    CHECK(S_ISREG(st.st_mode), "mode %o", st.st_mode);
    OK(unlink(path));
    CHECK_ERR(mknod(path, 0170000 | 0600, 0), EINVAL);
    OK(mkfifo(path, 0600));
    OK(stat(path, &st));
    CHECK(S_ISFIFO(st.st_mode), "mode %o", st.st_mode);
    CHECK_ERR(mknod(path, S_IFIFO | 0600, 0), EEXIST);
    OK(unlink(path));
    if (in_guest()) CHECK_ERR(mknod(path, S_IFSOCK | 0600, 0), ENOSYS);
}

/* getrlimit/setrlimit/prlimit: a soft limit above the hard one is EINVAL; a lowered fd limit makes
 * open EMFILE, dup2 EBADF and F_DUPFD EINVAL past it (fds open above it stay); a lowered address
 * space limit makes a bigger mmap ENOMEM; the stack's soft limit goes up to its hard one (the
 * deep-recursion idiom), and so does the core file's (no core dumps by default, none ever in the
 * guest); a lowered process limit makes fork EAGAIN; a child inherits the limits.
 * (Raising a hard limit is EPERM in the guest, which has no privilege, but works for root on the
 * host: checked in Python in the guest only.) */
static void test_rlimits(int argc, char **argv) {
    (void)argc;
    (void)argv;
    struct rlimit rl, bad;
    OK(getrlimit(RLIMIT_NOFILE, &rl));
    CHECK(rl.rlim_cur <= rl.rlim_max && rl.rlim_cur >= 64, "nofile %lu %lu", (unsigned long)rl.rlim_cur,
          (unsigned long)rl.rlim_max);
    bad.rlim_cur = rl.rlim_cur;
    bad.rlim_max = rl.rlim_cur - 1;
    CHECK_ERR(setrlimit(RLIMIT_NOFILE, &bad), EINVAL);
    int high = (int)OK(fcntl(0, F_DUPFD, 40));
    struct rlimit low = {32, rl.rlim_max};
    OK(setrlimit(RLIMIT_NOFILE, &low));
    struct rlimit now;
    OK(getrlimit(RLIMIT_NOFILE, &now));
    CHECK(now.rlim_cur == 32 && now.rlim_max == rl.rlim_max, "after set: %lu", (unsigned long)now.rlim_cur);
    int fds[40], n = 0, fd;
    while ((fd = open("/dev/null", O_RDONLY)) >= 0 && n < 40) fds[n++] = fd;
    CHECK(fd < 0 && errno == EMFILE, "open past the limit: fd %d errno %d", fd, errno);
    CHECK(n > 0 && fds[n - 1] == 31, "the last fd %d", n ? fds[n - 1] : -1);
    CHECK_ERR(dup2(0, 32), EBADF);
    CHECK_ERR(fcntl(0, F_DUPFD, 32), EINVAL);
    CHECK_EQ(fcntl(high, F_GETFD), 0); /* still open above the limit */
    OK(close(high));
    for (int i = 0; i < n; i++) close(fds[i]);
    pid_t pid = fork_or_fail();
    if (pid == 0) { /* inherited */
        struct rlimit c;
        child_exit(getrlimit(RLIMIT_NOFILE, &c) == 0 && c.rlim_cur == 32 ? 0 : 1);
    }
    expect_exit(pid, 0);
    OK(setrlimit(RLIMIT_NOFILE, &rl));

    OK(getrlimit(RLIMIT_STACK, &rl));
    if (rl.rlim_max != RLIM_INFINITY) {
        struct rlimit up = {rl.rlim_max, rl.rlim_max};
        OK(setrlimit(RLIMIT_STACK, &up));
    } else {
        struct rlimit up = {RLIM_INFINITY, RLIM_INFINITY};
        OK(setrlimit(RLIMIT_STACK, &up));
        OK(getrlimit(RLIMIT_STACK, &now));
        CHECK(now.rlim_cur == RLIM_INFINITY, "stack soft %lu", (unsigned long)now.rlim_cur);
    }

    OK(getrlimit(RLIMIT_CORE, &rl)); /* no core dumps by default; the soft limit may go up */
    CHECK(rl.rlim_cur == 0 || !in_guest(), "core soft %lu", (unsigned long)rl.rlim_cur);
    CHECK(rl.rlim_max == RLIM_INFINITY || !in_guest(), "core hard %lu", (unsigned long)rl.rlim_max);
    struct rlimit core = {rl.rlim_max, rl.rlim_max};
    OK(setrlimit(RLIMIT_CORE, &core));

    OK(getrlimit(RLIMIT_AS, &rl));
    struct rlimit as = {64ul << 20, rl.rlim_max};
    pid = fork_or_fail();
    if (pid == 0) { /* in a child, so that the parent's limit stays */
        if (setrlimit(RLIMIT_AS, &as) < 0) child_exit(2);
        void *big = mmap(NULL, 256ul << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (big != MAP_FAILED || errno != ENOMEM) child_exit(3);
        void *small = mmap(NULL, 1ul << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        child_exit(small == MAP_FAILED ? 4 : 0);
    }
    expect_exit(pid, 0);

    OK(getrlimit(RLIMIT_NPROC, &rl));
    CHECK(rl.rlim_cur >= 2, "nproc %lu", (unsigned long)rl.rlim_cur);
    if (in_guest()) { /* root on the host is not held to RLIMIT_NPROC */
        struct rlimit one = {1, rl.rlim_max};
        OK(setrlimit(RLIMIT_NPROC, &one));
        CHECK_ERR(fork(), EAGAIN);
        OK(setrlimit(RLIMIT_NPROC, &rl));
    }
}

/* State that must survive snapshots, saved templates and forks of them: a memfd's bytes and seals,
 * a pipe's size, the nice value, a resource limit. */
static void test_snapshot_state(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = memfd("kept", MFD_ALLOW_SEALING);
    CHECK_EQ(write(fd, "kept bytes", 10), 10);
    OK(fcntl(fd, F_ADD_SEALS, F_SEAL_GROW));
    int p[2];
    OK(pipe2(p, O_NONBLOCK));
    CHECK_EQ(fcntl(p[1], F_SETPIPE_SZ, 200000), 262144);
    CHECK_EQ(write(p[1], "queued", 6), 6);
    OK(setpriority(PRIO_PROCESS, 0, 6));
    struct rlimit nofile;
    OK(getrlimit(RLIMIT_NOFILE, &nofile));
    struct rlimit low = {100, nofile.rlim_max};
    OK(setrlimit(RLIMIT_NOFILE, &low));
    int tty = (int)OK(open("/dev/ttyS0", O_RDWR));
    printf("ready\n");
    fflush(stdout);
    char go[8];
    OK(read(tty, go, sizeof go)); /* the host snapshots here */
    char buf[16] = {0};
    CHECK_EQ(pread(fd, buf, sizeof buf, 0), 10);
    CHECK(!memcmp(buf, "kept bytes", 10), "memfd bytes %.10s", buf);
    CHECK_EQ(fcntl(fd, F_GET_SEALS), F_SEAL_GROW);
    CHECK_ERR(write(fd, "x", 1), EPERM); /* at the end: it would grow */
    struct stat st;
    OK(fstat(fd, &st));
    CHECK_EQ(st.st_nlink, 0);
    CHECK_EQ(fcntl(p[0], F_GETPIPE_SZ), 262144);
    CHECK_EQ(read(p[0], buf, sizeof buf), 6);
    CHECK_EQ(getpriority(PRIO_PROCESS, 0), 6);
    struct rlimit kept;
    OK(getrlimit(RLIMIT_NOFILE, &kept));
    CHECK(kept.rlim_cur == 100 && kept.rlim_max == nofile.rlim_max, "nofile %lu", (unsigned long)kept.rlim_cur);
}

static const zb_test tests[] = {
    {"memfd", test_memfd},
    {"seals", test_seals},
    {"sendfile", test_sendfile},
    {"copy_file_range", test_copy_file_range},
    {"priority", test_priority},
    {"pipe_size", test_pipe_size},
    {"whole_write", test_whole_write},
    {"mknod", test_mknod},
    {"rlimits", test_rlimits},
    {"snapshot_state", test_snapshot_state},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
