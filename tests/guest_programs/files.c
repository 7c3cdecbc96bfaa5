/* files.c - file syscalls on the overlay (/tmp) and the read-only view: I/O, descriptors, pipes,
 * directories, metadata, namespace changes and EROFS.
 * argv[0] (this program) is a host file in the view; its directory is a view directory.
 */
#include "check.h"

#include <dirent.h>
#include <libgen.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <sys/xattr.h>

static void put(const char *path, const char *text) {
    int fd = OK(open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644));
    CHECK_EQ(write(fd, text, strlen(text)), (long)strlen(text));
    OK(close(fd));
}

static char *get(const char *path) {
    static char buf[4096];
    int fd = open(path, O_RDONLY);
    if (fd < 0) return NULL;
    long n = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[n < 0 ? 0 : n] = 0;
    return buf;
}

static void test_rw(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = OK(open("/tmp/rw", O_CREAT | O_RDWR | O_EXCL, 0600));
    CHECK_ERR(open("/tmp/rw", O_CREAT | O_RDWR | O_EXCL, 0600), EEXIST);
    CHECK_EQ(write(fd, "hello world", 11), 11);
    CHECK_EQ(lseek(fd, 0, SEEK_CUR), 11);
    char buf[64] = {0};
    CHECK_EQ(read(fd, buf, sizeof buf), 0); /* at the end */
    CHECK_EQ(lseek(fd, 6, SEEK_SET), 6);
    CHECK_EQ(read(fd, buf, 5), 5);
    CHECK(!memcmp(buf, "world", 5), "read after lseek: %.5s", buf);
    CHECK_EQ(lseek(fd, -5, SEEK_END), 6);
    CHECK_EQ(lseek(fd, -2, SEEK_CUR), 4);
    CHECK_ERR(lseek(fd, -100, SEEK_CUR), EINVAL);
    CHECK_ERR(lseek(fd, 0, 42), EINVAL);
    /* pread/pwrite leave the offset alone */
    CHECK_EQ(pwrite(fd, "W", 1, 6), 1);
    CHECK_EQ(pread(fd, buf, 11, 0), 11);
    CHECK(!memcmp(buf, "hello World", 11), "pread: %.11s", buf);
    CHECK_EQ(lseek(fd, 0, SEEK_CUR), 4);
    CHECK_ERR(pread(fd, buf, 1, -1), EINVAL);
    /* writing past the end leaves a hole of zeros */
    CHECK_EQ(pwrite(fd, "!", 1, 20), 1);
    CHECK_EQ(pread(fd, buf, 64, 0), 21);
    CHECK(buf[11] == 0 && buf[19] == 0 && buf[20] == '!', "hole");
    /* readv/writev: scattered buffers, in order */
    struct iovec w[3] = {{"abc", 3}, {"", 0}, {"defgh", 5}};
    CHECK_EQ(lseek(fd, 0, SEEK_SET), 0);
    CHECK_EQ(writev(fd, w, 3), 8);
    char r1[2], r2[10];
    struct iovec r[2] = {{r1, 2}, {r2, 10}};
    CHECK_EQ(lseek(fd, 0, SEEK_SET), 0);
    CHECK_EQ(readv(fd, r, 2), 12);
    CHECK(!memcmp(r1, "ab", 2) && !memcmp(r2, "cdefghrld", 10), "readv: %.2s|%.10s", r1, r2);
    CHECK_EQ(preadv(fd, r, 2, 3), 12);
    CHECK(!memcmp(r1, "de", 2), "preadv");
    CHECK_EQ(pwritev(fd, w, 1, 30), 3);
    struct stat st;
    OK(fstat(fd, &st));
    CHECK_EQ(st.st_size, 33);
    /* ftruncate shrinks and grows */
    OK(ftruncate(fd, 4));
    OK(fstat(fd, &st));
    CHECK_EQ(st.st_size, 4);
    OK(ftruncate(fd, 8192));
    CHECK_EQ(pread(fd, buf, 8, 2), 8);
    CHECK(buf[0] == 'c' && buf[1] == 'd' && buf[2] == 0 && buf[7] == 0, "extended with zeros");
    OK(close(fd));
    /* access modes */
    fd = OK(open("/tmp/rw", O_RDONLY));
    CHECK_ERR(write(fd, "x", 1), EBADF);
    CHECK_ERR(ftruncate(fd, 0), EINVAL);
    OK(close(fd));
    fd = OK(open("/tmp/rw", O_WRONLY | O_APPEND));
    CHECK_ERR(read(fd, buf, 1), EBADF);
    CHECK_EQ(write(fd, "end", 3), 3);
    CHECK_EQ(lseek(fd, 0, SEEK_CUR), 8195);
    OK(close(fd));
    fd = OK(open("/tmp/rw", O_RDWR | O_TRUNC));
    OK(fstat(fd, &st));
    CHECK_EQ(st.st_size, 0);
    OK(close(fd));
    CHECK_ERR(close(fd), EBADF);
    CHECK_ERR(read(fd, buf, 1), EBADF);
    CHECK_ERR(read(-1, buf, 1), EBADF);
    CHECK_ERR(write(100000, buf, 1), EBADF);
    CHECK_ERR(open("/tmp/missing", O_RDONLY), ENOENT);
    CHECK_ERR(open("/tmp/missing/x", O_CREAT | O_WRONLY, 0600), ENOENT);
    CHECK_ERR(open("/tmp/rw/x", O_RDONLY), ENOTDIR);
    CHECK_ERR(open("/tmp", O_WRONLY), EISDIR);
    CHECK_ERR(open("/tmp/rw", O_RDONLY | O_DIRECTORY), ENOTDIR);
    /* a large file, across the overlay's blocks */
    static char big[300000], back[300000];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (char)(i % 251);
    fd = OK(open("/tmp/big", O_CREAT | O_RDWR, 0600));
    CHECK_EQ(write(fd, big, sizeof big), (long)sizeof big);
    CHECK_EQ(pread(fd, back, sizeof back, 0), (long)sizeof back);
    CHECK(!memcmp(big, back, sizeof big), "300 KB round trip");
    OK(close(fd));
    /* devices */
    fd = OK(open("/dev/null", O_RDWR));
    CHECK_EQ(write(fd, "x", 1), 1);
    CHECK_EQ(read(fd, buf, 1), 0);
    CHECK_EQ(pread(fd, buf, 1, 0), 0);
    OK(close(fd));
    fd = OK(open("/dev/zero", O_RDONLY));
    memset(buf, 1, sizeof buf);
    CHECK_EQ(read(fd, buf, 16), 16);
    CHECK_EQ(buf[0] | buf[15], 0);
    OK(close(fd));
}

static void test_fds(int argc, char **argv) {
    (void)argc;
    (void)argv;
    put("/tmp/f", "0123456789");
    int fd = OK(open("/tmp/f", O_RDONLY));
    /* dup shares the offset */
    int d = OK(dup(fd));
    CHECK(d > fd, "dup gives the lowest free fd: %d", d);
    char c;
    CHECK_EQ(read(fd, &c, 1), 1);
    CHECK_EQ(read(d, &c, 1), 1);
    CHECK_EQ(c, '1');
    CHECK_EQ(lseek(fd, 0, SEEK_CUR), 2);
    /* dup2 onto an open fd closes it first; onto itself does nothing */
    int other = OK(open("/dev/zero", O_RDONLY));
    CHECK_EQ(dup2(fd, other), other);
    CHECK_EQ(read(other, &c, 1), 1);
    CHECK_EQ(c, '2');
    CHECK_EQ(dup2(fd, fd), fd);
    CHECK_ERR(dup2(fd, 5000), EBADF);
    CHECK_ERR(dup2(999, 20), EBADF);
    CHECK_EQ(dup2(fd, 100), 100);
    CHECK_EQ(fcntl(100, F_GETFD), 0);
    /* dup3: O_CLOEXEC, and never the same fd */
    CHECK_EQ(dup3(fd, 101, O_CLOEXEC), 101);
    CHECK_EQ(fcntl(101, F_GETFD), FD_CLOEXEC);
    CHECK_ERR(dup3(fd, fd, 0), EINVAL);
    CHECK_ERR(dup3(fd, 102, O_NONBLOCK), EINVAL);
    /* fcntl */
    int low = OK(fcntl(fd, F_DUPFD, 50));
    CHECK_EQ(low, 50);
    CHECK_EQ(fcntl(fd, F_DUPFD, 50), 51);
    int ce = OK(fcntl(fd, F_DUPFD_CLOEXEC, 0));
    CHECK_EQ(fcntl(ce, F_GETFD), FD_CLOEXEC);
    OK(fcntl(ce, F_SETFD, 0));
    CHECK_EQ(fcntl(ce, F_GETFD), 0);
    CHECK_EQ(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
    OK(fcntl(fd, F_SETFL, O_NONBLOCK | O_APPEND));
    CHECK_EQ(fcntl(fd, F_GETFL) & (O_NONBLOCK | O_APPEND), O_NONBLOCK | O_APPEND);
    CHECK_EQ(fcntl(d, F_GETFL) & O_NONBLOCK, O_NONBLOCK); /* status flags belong to the description */
    int wfd = OK(open("/tmp/f", O_WRONLY));
    CHECK_EQ(fcntl(wfd, F_GETFL) & O_ACCMODE, O_WRONLY);
    OK(fcntl(wfd, F_SETFL, O_RDWR)); /* the access mode cannot be changed */
    CHECK_EQ(fcntl(wfd, F_GETFL) & O_ACCMODE, O_WRONLY);
    CHECK_ERR(fcntl(999, F_GETFD), EBADF);
    CHECK_ERR(fcntl(fd, F_DUPFD, 100000), EINVAL);
    struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    OK(fcntl(wfd, F_SETLK, &lk));
    OK(fcntl(wfd, F_GETLK, &lk));
    CHECK_EQ(lk.l_type, F_UNLCK);
    /* closing one of the dup'ed fds leaves the others working */
    OK(close(fd));
    CHECK_EQ(pread(d, &c, 1, 9), 1);
    CHECK_EQ(c, '9');
    /* the standard fds exist */
    CHECK_EQ(fcntl(0, F_GETFL) & O_ACCMODE, O_RDONLY);
    CHECK_EQ(fcntl(1, F_GETFL) & O_ACCMODE, O_WRONLY);
    CHECK_EQ(write(2, "", 0), 0);
    CHECK_ERR(lseek(1, 0, SEEK_SET), ESPIPE);
    /* close_range: closes, or only marks close-on-exec */
    CHECK_EQ(dup2(0, 300), 300);
    CHECK_EQ(dup2(0, 301), 301);
    OK(syscall(SYS_close_range, 300, 301, CLOSE_RANGE_CLOEXEC));
    CHECK_EQ(fcntl(300, F_GETFD), FD_CLOEXEC);
    CHECK_EQ(fcntl(301, F_GETFD), FD_CLOEXEC);
    OK(syscall(SYS_close_range, 301, ~0u, 0));
    CHECK_ERR(fcntl(301, F_GETFD), EBADF);
    CHECK_EQ(fcntl(300, F_GETFD), FD_CLOEXEC);
    CHECK_ERR(syscall(SYS_close_range, 10, 9, 0), EINVAL);
    CHECK_ERR(syscall(SYS_close_range, 300, 300, 1), EINVAL);
    OK(close(300));
    /* the fd table fills up with EMFILE */
    int last = -1, n = 0;
    for (;;) {
        int k = dup(0);
        if (k < 0) { CHECK_EQ(errno, EMFILE); break; }
        last = k;
        n++;
    }
    CHECK(last == 1023, "highest fd %d", last);
    for (int k = 200; k <= last; k++) close(k);
    printf("dups %d\n", n);
}

static void test_pipe(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int p[2];
    OK(pipe2(p, O_CLOEXEC));
    CHECK_EQ(fcntl(p[0], F_GETFD), FD_CLOEXEC);
    CHECK_EQ(write(p[1], "abc", 3), 3);
    CHECK_EQ(write(p[1], "def", 3), 3);
    char buf[16] = {0};
    CHECK_EQ(read(p[0], buf, 4), 4);
    CHECK(!memcmp(buf, "abcd", 4), "pipe order");
    CHECK_EQ(read(p[0], buf, 16), 2);
    CHECK_EQ(write(p[1], "", 0), 0);    /* a null write succeeds at once (it used to wait forever) */
    CHECK_ERR(write(p[0], "x", 1), EBADF);
    CHECK_ERR(read(p[1], buf, 1), EBADF);
    CHECK_ERR(lseek(p[0], 0, SEEK_SET), ESPIPE);
    CHECK_ERR(pread(p[0], buf, 1, 0), ESPIPE);
    CHECK_ERR(pwrite(p[1], buf, 1, 0), ESPIPE);
    struct stat st;
    OK(fstat(p[0], &st));
    CHECK(S_ISFIFO(st.st_mode), "pipe mode 0%o", st.st_mode);
    /* an empty pipe with a writer: EAGAIN when non-blocking (a blocking read waits for another
     * thread or process: procs.c) */
    OK(fcntl(p[0], F_SETFL, O_NONBLOCK));
    CHECK_ERR(read(p[0], buf, 1), EAGAIN);
    /* pipe: writev then readv */
    struct iovec w[2] = {{"12", 2}, {"345", 3}};
    CHECK_EQ(writev(p[1], w, 2), 5);
    CHECK_EQ(read(p[0], buf, 16), 5);
    CHECK(!memcmp(buf, "12345", 5), "writev to a pipe");
    /* no writer left: end of file */
    CHECK_EQ(write(p[1], "z", 1), 1);
    OK(close(p[1]));
    CHECK_EQ(read(p[0], buf, 16), 1);
    CHECK_EQ(read(p[0], buf, 16), 0);
    OK(close(p[0]));
    /* no reader left: EPIPE (SIGPIPE ignored, as CPython does) */
    signal(SIGPIPE, SIG_IGN);
    OK(pipe(p));
    OK(close(p[0]));
    CHECK_ERR(write(p[1], "x", 1), EPIPE);
    CHECK_EQ(write(p[1], "", 0), 0);    /* null write: 0 before the readers are looked at */
    OK(close(p[1]));
    CHECK_ERR(pipe2(p, O_DIRECT << 4), EINVAL);
    /* a full pipe: a non-blocking write is partial, then EAGAIN */
    OK(pipe2(p, O_NONBLOCK));
    static char chunk[300000];
    long total = 0, r;
    while ((r = write(p[1], chunk, sizeof chunk)) > 0) total += r;
    CHECK_EQ(errno, EAGAIN);
    CHECK(total >= 65536, "a pipe holds %ld bytes", total);
    CHECK_EQ(write(p[1], "", 0), 0);    /* full: a null write still succeeds */
    int avail = -1;
    OK(ioctl(p[0], FIONREAD, &avail));
    CHECK_EQ(avail, total);
}

/* getdents64 through readdir: names of an overlay directory, a view directory and the root. */
static int list(const char *path, char names[][256], int max) {
    DIR *d = opendir(path);
    if (!d) { FAIL("opendir %s: %s", path, strerror(errno)); return 0; }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) snprintf(names[n++], 256, "%s", e->d_name);
    closedir(d);
    return n;
}
static int has(char names[][256], int n, const char *name) {
    for (int i = 0; i < n; i++) if (!strcmp(names[i], name)) return 1;
    return 0;
}

static void test_getdents(int argc, char **argv) {
    (void)argc;
    static char names[2000][256];
    OK(mkdir("/tmp/sub", 0755));
    for (int i = 0; i < 300; i++) {
        char p[64];
        snprintf(p, sizeof p, "/tmp/sub/file-with-a-longish-name-%03d", i);
        put(p, "x");
    }
    OK(mkdir("/tmp/sub/dir", 0755));
    OK(symlink("file-with-a-longish-name-000", "/tmp/sub/link"));
    int n = list("/tmp/sub", names, 2000);
    CHECK_EQ(n, 300 + 2 + 2);
    CHECK(has(names, n, ".") && has(names, n, ".."), "dot entries");
    CHECK(has(names, n, "file-with-a-longish-name-299") && has(names, n, "dir") && has(names, n, "link"), "entries");
    /* d_type, and small buffers take several calls */
    int fd = OK(open("/tmp/sub", O_RDONLY | O_DIRECTORY));
    char buf[512];
    long got, calls = 0, seen = 0, dirs = 0, links = 0;
    while ((got = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
        calls++;
        for (long off = 0; off < got;) {
            struct dirent64 *e = (struct dirent64 *)(buf + off);
            seen++;
            dirs += e->d_type == DT_DIR;
            links += e->d_type == DT_LNK;
            CHECK(e->d_reclen % 8 == 0 && e->d_ino != 0, "record of %s", e->d_name);
            off += e->d_reclen;
        }
    }
    CHECK_EQ(got, 0);
    CHECK_EQ(seen, 304);
    CHECK_EQ(dirs, 3);
    CHECK_EQ(links, 1);
    CHECK(calls > 10, "%ld calls with a 512-byte buffer", calls);
    CHECK_EQ(syscall(SYS_getdents64, fd, buf, 10), 0); /* at the end: nothing, whatever the size */
    lseek(fd, 0, SEEK_SET);
    CHECK_ERR(syscall(SYS_getdents64, fd, buf, 10), EINVAL); /* a record is due, and does not fit */
    CHECK(syscall(SYS_getdents64, fd, buf, sizeof buf) > 0, "after rewinddir");
    close(fd);
    fd = OK(open("/tmp/sub/link", O_RDONLY));
    CHECK_ERR(syscall(SYS_getdents64, fd, buf, sizeof buf), ENOTDIR);
    close(fd);
    /* a view directory: this program's own */
    char self[4096];
    snprintf(self, sizeof self, "%s", argv[0]);
    char *base = basename(self);
    char dirbuf[4096];
    snprintf(dirbuf, sizeof dirbuf, "%s", argv[0]);
    char *dir = dirname(dirbuf);
    n = list(dir, names, 2000);
    CHECK(has(names, n, base), "%s lists %s", dir, base);
    /* the root: print it, the host side knows what the view should show */
    n = list("/", names, 2000);
    for (int i = 0; i < n; i++) printf("root: %s\n", names[i]);
}

static void test_stat(int argc, char **argv) {
    (void)argc;
    struct stat st, st2;
    /* an overlay file */
    put("/tmp/s", "12345");
    OK(stat("/tmp/s", &st));
    CHECK(S_ISREG(st.st_mode), "mode 0%o", st.st_mode);
    CHECK_EQ(st.st_mode & 0777, 0644 & ~022);
    CHECK_EQ(st.st_size, 5);
    CHECK_EQ(st.st_uid, 1000);
    int fd = OK(open("/tmp/s", O_RDONLY));
    OK(fstat(fd, &st2));
    CHECK_EQ(st2.st_ino, st.st_ino);
    CHECK_EQ(st2.st_size, 5);
    OK(fstatat(AT_FDCWD, "/tmp/s", &st2, 0));
    CHECK_EQ(st2.st_ino, st.st_ino);
    OK(fstatat(fd, "", &st2, AT_EMPTY_PATH));
    CHECK_EQ(st2.st_ino, st.st_ino);
    int tmp = OK(open("/tmp", O_RDONLY | O_DIRECTORY));
    OK(fstatat(tmp, "s", &st2, 0));
    CHECK_EQ(st2.st_ino, st.st_ino);
    CHECK_ERR(fstatat(tmp, "s", &st2, 0x12345678), EINVAL);
    struct statx sx;
    OK(statx(AT_FDCWD, "/tmp/s", 0, STATX_BASIC_STATS, &sx));
    CHECK_EQ(sx.stx_size, 5);
    CHECK_EQ(sx.stx_ino, st.st_ino);
    CHECK(sx.stx_mask & STATX_SIZE, "statx mask 0x%x", sx.stx_mask);
    CHECK(S_ISREG(sx.stx_mode), "statx mode");
    OK(statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &sx));
    CHECK_EQ(sx.stx_size, 5);
    CHECK_ERR(stat("/tmp/nope", &st2), ENOENT);
    CHECK_ERR(stat("/tmp/s/x", &st2), ENOTDIR);
    CHECK_ERR(stat("", &st2), ENOENT);
    OK(stat("/tmp", &st2));
    CHECK(S_ISDIR(st2.st_mode), "/tmp is a directory");
    OK(stat("/tmp/", &st2));
    OK(stat("/tmp/./../tmp//s", &st2));
    CHECK_EQ(st2.st_ino, st.st_ino);
    /* a host file in the view: print what the host should agree with */
    OK(stat(argv[0], &st));
    CHECK(S_ISREG(st.st_mode) && (st.st_mode & 0111), "the program is an executable file: 0%o", st.st_mode);
    OK(statx(AT_FDCWD, argv[0], 0, STATX_BASIC_STATS, &sx));
    CHECK_EQ(sx.stx_size, st.st_size);
    CHECK_EQ(sx.stx_mtime.tv_sec, st.st_mtim.tv_sec);
    printf("size %ld mtime %ld ino %lu\n", (long)st.st_size, (long)st.st_mtim.tv_sec, (unsigned long)st.st_ino);
    /* readlink of /proc/self/exe: this program's absolute path */
    char link[4096];
    long n = OK(readlink("/proc/self/exe", link, sizeof link));
    link[n < 0 ? 0 : n] = 0;
    CHECK_STR(link, argv[0]);
    n = OK(readlinkat(AT_FDCWD, "/proc/self/exe", link, 4));
    CHECK_EQ(n, 4); /* truncated, not NUL-terminated, as in Linux */
    OK(lstat("/proc/self/exe", &st2));
    CHECK(S_ISLNK(st2.st_mode), "/proc/self/exe is a symlink");
    OK(stat("/proc/self/exe", &st2));
    CHECK_EQ(st2.st_size, st.st_size);
    CHECK_ERR(readlink("/tmp/s", link, sizeof link), EINVAL);
    CHECK_ERR(readlink("/proc/self/exe", link, 0), EINVAL);
    /* access */
    OK(access("/tmp/s", R_OK | W_OK));
    OK(access(argv[0], R_OK | X_OK));
    CHECK_ERR(access(argv[0], W_OK), EROFS);
    CHECK_ERR(access("/tmp/s", X_OK), EACCES);
    CHECK_ERR(access("/tmp/nope", F_OK), ENOENT);
    CHECK_ERR(access("/tmp/s", 0100), EINVAL);
    OK(faccessat(tmp, "s", R_OK, 0));
    CHECK_ERR(faccessat(tmp, "nope", R_OK, 0), ENOENT);
    /* cwd */
    char cwd[256];
    CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd");
    CHECK_STR(cwd, "/home/sandbox");
    OK(chdir("/tmp"));
    CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd");
    CHECK_STR(cwd, "/tmp");
    OK(stat("s", &st2));
    CHECK_EQ(st2.st_size, 5);
    CHECK_ERR(chdir("/tmp/s"), ENOTDIR);
    CHECK_ERR(chdir("/nope"), ENOENT);
    CHECK_ERR(syscall(SYS_getcwd, cwd, 2), ERANGE);
    OK(fchdir(tmp));
    OK(chdir(".."));
    CHECK(getcwd(cwd, sizeof cwd) != NULL && !strcmp(cwd, "/"), "cwd %s", cwd);
    OK(chdir(".."));
    CHECK(getcwd(cwd, sizeof cwd) != NULL && !strcmp(cwd, "/"), "/.. is /: %s", cwd);
}

static void test_namespace(int argc, char **argv) {
    (void)argc;
    (void)argv;
    struct stat st;
    /* mkdir / rmdir */
    OK(mkdir("/tmp/d", 0700));
    CHECK_ERR(mkdir("/tmp/d", 0700), EEXIST);
    CHECK_ERR(mkdir("/tmp/none/d", 0700), ENOENT);
    OK(stat("/tmp/d", &st));
    CHECK(S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700, "mode 0%o", st.st_mode);
    OK(mkdirat(AT_FDCWD, "/tmp/d/e", 0755));
    put("/tmp/d/e/f", "data");
    CHECK_ERR(rmdir("/tmp/d"), ENOTEMPTY);
    CHECK_ERR(unlink("/tmp/d"), EISDIR);
    CHECK_ERR(rmdir("/tmp/d/e/f"), ENOTDIR);
    /* rename: a file across directories, over an existing file, a directory */
    OK(rename("/tmp/d/e/f", "/tmp/g"));
    CHECK_ERR(stat("/tmp/d/e/f", &st), ENOENT);
    CHECK_STR(get("/tmp/g"), "data");
    put("/tmp/h", "old");
    OK(rename("/tmp/g", "/tmp/h"));
    CHECK_STR(get("/tmp/h"), "data");
    CHECK_ERR(stat("/tmp/g", &st), ENOENT);
    OK(rename("/tmp/d/e", "/tmp/e2"));
    OK(stat("/tmp/e2", &st));
    CHECK_ERR(rename("/tmp/d", "/tmp/d/x"), EINVAL);
    CHECK_ERR(rename("/tmp/h", "/tmp/d"), EISDIR);
    CHECK_ERR(rename("/tmp/d", "/tmp/h"), ENOTDIR);
    CHECK_ERR(rename("/tmp/nope", "/tmp/x"), ENOENT);
    CHECK_ERR(renameat2(AT_FDCWD, "/tmp/h", AT_FDCWD, "/tmp/e2", RENAME_NOREPLACE), EEXIST);
    OK(rmdir("/tmp/e2"));
    OK(rmdir("/tmp/d"));
    CHECK_ERR(stat("/tmp/d", &st), ENOENT);
    /* symlinks: followed by open and stat, not by lstat, unlink or readlink */
    OK(symlink("h", "/tmp/ln"));
    OK(symlink("/tmp/ln", "/tmp/ln2"));
    CHECK_STR(get("/tmp/ln2"), "data");
    OK(lstat("/tmp/ln", &st));
    CHECK(S_ISLNK(st.st_mode) && st.st_size == 1, "lstat of a symlink");
    OK(stat("/tmp/ln2", &st));
    CHECK(S_ISREG(st.st_mode) && st.st_size == 4, "stat through two symlinks");
    char buf[64];
    CHECK_EQ(readlink("/tmp/ln2", buf, sizeof buf), 7);
    CHECK_ERR(open("/tmp/ln", O_RDONLY | O_NOFOLLOW), ELOOP);
    CHECK_ERR(symlink("x", "/tmp/ln"), EEXIST);
    CHECK_ERR(symlink("", "/tmp/empty"), ENOENT);
    OK(symlink("loop2", "/tmp/loop1"));
    OK(symlink("loop1", "/tmp/loop2"));
    CHECK_ERR(open("/tmp/loop1", O_RDONLY), ELOOP);
    OK(symlink("/tmp/nowhere", "/tmp/dangling"));
    CHECK_ERR(stat("/tmp/dangling", &st), ENOENT);
    int fd = OK(open("/tmp/dangling", O_CREAT | O_WRONLY, 0600)); /* creates the target */
    close(fd);
    OK(stat("/tmp/nowhere", &st));
    OK(unlink("/tmp/ln"));
    OK(stat("/tmp/h", &st)); /* the target stays */
    CHECK_ERR(stat("/tmp/ln2", &st), ENOENT);
    /* a directory symlink in the middle of a path */
    OK(mkdir("/tmp/real", 0755));
    put("/tmp/real/file", "in real");
    OK(symlink("/tmp/real", "/tmp/alias"));
    CHECK_STR(get("/tmp/alias/file"), "in real");
    CHECK_STR(get("/tmp/alias/../h"), "data"); /* .. after a symlink is the target's parent */
    /* an unlinked file lives while it is open */
    fd = OK(open("/tmp/h", O_RDWR));
    OK(unlink("/tmp/h"));
    CHECK_ERR(stat("/tmp/h", &st), ENOENT);
    CHECK_EQ(pread(fd, buf, sizeof buf, 0), 4);
    CHECK_EQ(write(fd, "more", 4), 4);
    OK(fstat(fd, &st));
    CHECK_EQ(st.st_size, 4);
    OK(close(fd));
    /* chmod, utimensat, truncate */
    put("/tmp/m", "abcdef");
    OK(chmod("/tmp/m", 0600));
    OK(stat("/tmp/m", &st));
    CHECK_EQ(st.st_mode & 0777, 0600);
    struct timespec ts[2] = {{0, UTIME_OMIT}, {1000000000, 5}};
    OK(utimensat(AT_FDCWD, "/tmp/m", ts, 0));
    OK(stat("/tmp/m", &st));
    CHECK_EQ(st.st_mtim.tv_sec, 1000000000);
    OK(truncate("/tmp/m", 2));
    CHECK_STR(get("/tmp/m"), "ab");
    /* relative paths and *at with a directory fd */
    int dir = OK(open("/tmp", O_RDONLY | O_DIRECTORY));
    OK(mkdirat(dir, "rel", 0755));
    fd = OK(openat(dir, "rel/f", O_CREAT | O_WRONLY, 0644));
    close(fd);
    OK(renameat(dir, "rel/f", dir, "rel/g"));
    OK(unlinkat(dir, "rel/g", 0));
    OK(unlinkat(dir, "rel", AT_REMOVEDIR));
    CHECK_ERR(unlinkat(dir, "m", 0x4000), EINVAL);
    CHECK_ERR(openat(fd, "x", O_RDONLY), EBADF);
    int file = OK(open("/tmp/m", O_RDONLY));
    CHECK_ERR(openat(file, "x", O_RDONLY), ENOTDIR);
    /* the overlay's mount points cannot be removed */
    CHECK_ERR(rmdir("/tmp"), EBUSY);
    /* umask applies to new files */
    umask(077);
    put("/tmp/masked", "");
    OK(stat("/tmp/masked", &st));
    CHECK_EQ(st.st_mode & 0777, 0600);
}

/* Metadata beyond stat: hard links, owners, extended attributes, times, O_TMPFILE. */
static void test_metadata(int argc, char **argv) {
    (void)argc;
    struct stat st, fst;
    put("/tmp/a", "abc");
    /* stat and fstat of one file agree (os.path.samestat, shutil.rmtree rely on it) */
    int fd = OK(open("/tmp/a", O_RDONLY));
    OK(stat("/tmp/a", &st));
    OK(fstat(fd, &fst));
    CHECK(st.st_dev == fst.st_dev && st.st_ino == fst.st_ino, "stat (%lu, %lu) vs fstat (%lu, %lu)", (unsigned long)st.st_dev,
          (unsigned long)st.st_ino, (unsigned long)fst.st_dev, (unsigned long)fst.st_ino);
    /* io.open sizes its buffer from st_blksize: set, and the same for stat and fstat */
    CHECK(fst.st_blksize == st.st_blksize && fst.st_blksize >= 4096, "st_blksize %ld vs %ld", (long)fst.st_blksize,
          (long)st.st_blksize);
    int dir = OK(open("/tmp", O_RDONLY | O_DIRECTORY));
    OK(stat("/tmp", &st));
    OK(fstat(dir, &fst));
    CHECK(st.st_dev == fst.st_dev && st.st_ino == fst.st_ino, "directory stat vs fstat");
    /* hard links */
    OK(link("/tmp/a", "/tmp/b"));
    OK(stat("/tmp/b", &st));
    CHECK_EQ(st.st_nlink, 2);
    struct stat sa;
    OK(stat("/tmp/a", &sa));
    CHECK_EQ(st.st_ino, sa.st_ino);
    put("/tmp/b", "changed through b");
    char buf[64];
    CHECK_EQ(pread(fd, buf, sizeof buf, 0), 17); /* one file, two names */
    OK(unlink("/tmp/a"));
    OK(stat("/tmp/b", &st));
    CHECK_EQ(st.st_nlink, 1);
    CHECK_ERR(link("/tmp/b", "/tmp/b"), EEXIST);
    CHECK_ERR(link("/tmp", "/tmp/dirlink"), EPERM);
    CHECK_ERR(link("/tmp/nope", "/tmp/c"), ENOENT);
    CHECK_ERR(link(argv[0], "/tmp/prog"), EXDEV);
    CHECK_ERR(link("/etc/passwd", "/tmp/passwd"), EXDEV);
    CHECK_ERR(link("/tmp/b", "/new-link"), EROFS);
    OK(symlink("b", "/tmp/sym"));
    OK(linkat(AT_FDCWD, "/tmp/sym", AT_FDCWD, "/tmp/sym2", 0)); /* links the symlink itself */
    OK(lstat("/tmp/sym2", &st));
    CHECK(S_ISLNK(st.st_mode), "linkat without AT_SYMLINK_FOLLOW");
    OK(linkat(AT_FDCWD, "/tmp/sym", AT_FDCWD, "/tmp/b2", AT_SYMLINK_FOLLOW));
    OK(lstat("/tmp/b2", &st));
    CHECK(S_ISREG(st.st_mode) && st.st_nlink == 2, "linkat with AT_SYMLINK_FOLLOW");
    /* owners: keeping one's own is fine, giving files away is not */
    OK(chown("/tmp/b", 1000, 1000));
    OK(chown("/tmp/b", -1, -1));
    OK(lchown("/tmp/sym", 1000, -1));
    OK(fchown(fd, 1000, 1000));
    OK(fchownat(dir, "b", -1, 1000, 0));
    CHECK_ERR(chown("/tmp/b", 0, 0), EPERM);
    CHECK_ERR(fchown(fd, 1000, 0), EPERM);
    CHECK_ERR(chown(argv[0], 1000, 1000), EROFS);
    CHECK_ERR(chown("/tmp/nope", 1000, 1000), ENOENT);
    CHECK_ERR(fchown(999, 1000, 1000), EBADF);
    /* extended attributes: none, and none can be set */
    char xlist[256];
    CHECK_EQ(listxattr("/tmp/b", xlist, sizeof xlist), 0);
    CHECK_EQ(llistxattr("/tmp/sym", xlist, sizeof xlist), 0);
    CHECK_EQ(flistxattr(fd, xlist, sizeof xlist), 0);
    CHECK_EQ(listxattr(argv[0], xlist, sizeof xlist), 0);
    CHECK_ERR(listxattr("/tmp/nope", xlist, sizeof xlist), ENOENT);
    CHECK_ERR(flistxattr(999, xlist, sizeof xlist), EBADF);
    CHECK_ERR(getxattr("/tmp/b", "user.x", xlist, sizeof xlist), EOPNOTSUPP);
    CHECK_ERR(fgetxattr(fd, "user.x", xlist, sizeof xlist), EOPNOTSUPP);
    CHECK_ERR(setxattr("/tmp/b", "user.x", "v", 1, 0), EOPNOTSUPP);
    CHECK_ERR(setxattr(argv[0], "user.x", "v", 1, 0), EROFS);
    CHECK_ERR(removexattr("/tmp/b", "user.x"), EOPNOTSUPP);
    CHECK_ERR(getxattr("/tmp/b", (char *)16, xlist, sizeof xlist), EFAULT);
    /* access and modification times are kept apart */
    struct timespec ts[2] = {{1000000000, 111}, {1500000000, 222}};
    OK(utimensat(AT_FDCWD, "/tmp/b", ts, 0));
    OK(stat("/tmp/b", &st));
    CHECK(st.st_atim.tv_sec == 1000000000 && st.st_atim.tv_nsec == 111, "atime %ld.%ld", (long)st.st_atim.tv_sec, st.st_atim.tv_nsec);
    CHECK(st.st_mtim.tv_sec == 1500000000 && st.st_mtim.tv_nsec == 222, "mtime %ld.%ld", (long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    ts[0].tv_nsec = UTIME_OMIT;
    ts[1].tv_nsec = UTIME_NOW;
    OK(futimens(fd, ts));
    OK(fstat(fd, &st));
    CHECK(st.st_atim.tv_sec == 1000000000 && st.st_mtim.tv_sec > 1600000000, "UTIME_OMIT / UTIME_NOW");
    ts[1].tv_nsec = 1000000000;
    CHECK_ERR(utimensat(AT_FDCWD, "/tmp/b", ts, 0), EINVAL);
    /* O_TMPFILE: unnamed until linked */
    int t = OK(open("/tmp", O_TMPFILE | O_RDWR, 0600));
    CHECK_EQ(write(t, "anonymous", 9), 9);
    OK(fstat(t, &st));
    CHECK(S_ISREG(st.st_mode) && st.st_size == 9, "O_TMPFILE file");
    char names[64][256];
    int n = list("/tmp", names, 64);
    for (int i = 0; i < n; i++) CHECK(names[i][0] != '#', "the unnamed file shows up as %s", names[i]);
    OK(linkat(t, "", AT_FDCWD, "/tmp/named", AT_EMPTY_PATH));
    OK(close(t));
    CHECK_STR(get("/tmp/named"), "anonymous");
    CHECK_ERR(open("/tmp", O_TMPFILE | O_RDONLY, 0600), EINVAL);
    CHECK_ERR(open("/", O_TMPFILE | O_RDWR, 0600), EROFS);
    t = OK(open("/tmp", O_TMPFILE | O_WRONLY, 0600));
    OK(close(t)); /* gone without a trace */
    OK(close(fd));
    OK(close(dir));
}

/* The view and the synthetic directories around it are read-only: EROFS (or EACCES for the
 * files the host put in place, like /etc/passwd). */
static void test_erofs(int argc, char **argv) {
    (void)argc;
    char dirbuf[4096], path[4200];
    snprintf(dirbuf, sizeof dirbuf, "%s", argv[0]);
    char *dir = dirname(dirbuf);
    snprintf(path, sizeof path, "%s/new-file", dir);
    CHECK_ERR(open(argv[0], O_WRONLY), EROFS);
    CHECK_ERR(open(argv[0], O_RDWR), EROFS);
    CHECK_ERR(open(argv[0], O_RDONLY | O_TRUNC), EROFS);
    CHECK_ERR(open(path, O_CREAT | O_WRONLY, 0644), EROFS);
    CHECK_ERR(creat(path, 0644), EROFS);
    CHECK_ERR(mkdir(path, 0755), EROFS);
    CHECK_ERR(symlink("/tmp", path), EROFS);
    CHECK_ERR(unlink(argv[0]), EROFS);
    CHECK_ERR(rmdir(dir), EROFS);
    CHECK_ERR(rename(argv[0], "/tmp/stolen"), EROFS);
    put("/tmp/mine", "x");
    CHECK_ERR(rename("/tmp/mine", path), EROFS);
    CHECK_ERR(truncate(argv[0], 0), EROFS);
    CHECK_ERR(chmod(argv[0], 0777), EROFS);
    CHECK_ERR(utimensat(AT_FDCWD, argv[0], NULL, 0), EROFS);
    CHECK_ERR(access(dir, W_OK), EROFS);
    int fd = OK(open(argv[0], O_RDONLY));
    CHECK_ERR(write(fd, "x", 1), EBADF);
    CHECK_ERR(pwrite(fd, "x", 1, 0), EBADF);
    CHECK_ERR(ftruncate(fd, 0), EINVAL);
    close(fd);
    /* synthetic directories */
    CHECK_ERR(open("/new-file", O_CREAT | O_WRONLY, 0644), EROFS);
    CHECK_ERR(mkdir("/home/other", 0755), EROFS);
    CHECK_ERR(mkdir("/dev/x", 0755), EROFS);
    CHECK_ERR(unlink("/dev/null"), EROFS);
    CHECK_ERR(rmdir("/proc"), EROFS);
    /* files the host put in place: like read-only bind mounts */
    CHECK_ERR(open("/etc/passwd", O_WRONLY), EACCES);
    CHECK_ERR(unlink("/etc/passwd"), EBUSY);
    CHECK_ERR(rename("/etc/passwd", "/tmp/passwd"), EBUSY);
    CHECK(strstr(get("/etc/passwd"), "sandbox:x:1000") != NULL, "/etc/passwd");
}

static const zb_test tests[] = {
    {"rw", test_rw},
    {"fds", test_fds},
    {"pipe", test_pipe},
    {"getdents", test_getdents},
    {"stat", test_stat},
    {"namespace", test_namespace},
    {"metadata", test_metadata},
    {"erofs", test_erofs},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
