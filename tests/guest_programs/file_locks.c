/* file_locks.c - advisory locks between processes: flock(2) (whole file, owned by the open file
 * description: a fork's copy shares it, another open contends), fcntl(2) record locks (byte
 * ranges owned by the process: F_GETLK names the holder, a close of any descriptor of the file
 * and the process's end release them, F_SETLKW waits for the holder, or fails with EDEADLK when the
 * holder waits for the caller), OFD locks (owned by the
 * description, contending within one process) and lockf. Each test also runs on the host
 * (guest_c.check_on_linux): Linux's behaviour is the reference. */
#include "check.h"
#include "children.h"

#include <sys/file.h>

static char path[64];

static int open_file(void) {
    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/zblockXXXXXX");
        int fd = mkstemp(path);
        if (fd < 0) FAIL("mkstemp: %s", strerror(errno));
        CHECK_EQ(write(fd, "0123456789abcdefghij", 20), 20);
        OK(close(fd));
    }
    return (int)OK(open(path, O_RDWR));
}

static int record_lock(int fd, int cmd, short type, off_t start, off_t len) {
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
    return fcntl(fd, cmd, &fl);
}

/* flock: a second open contends, the fork's shared description does not, LOCK_UN and the last
 * close release, shared locks coexist. */
static void test_flock(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int a = open_file(), b = open_file();
    OK(flock(a, LOCK_EX));
    CHECK_ERR(flock(b, LOCK_SH | LOCK_NB), EWOULDBLOCK);
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        CHECK_ERR(flock(b, LOCK_EX | LOCK_NB), EWOULDBLOCK); /* its copy of b: another description */
        OK(flock(a, LOCK_EX | LOCK_NB));                     /* a is the same description: its own lock */
        child_exit(0);
    }
    expect_exit(pid, 0);
    OK(flock(a, LOCK_UN));
    OK(flock(b, LOCK_SH | LOCK_NB));
    OK(flock(a, LOCK_SH | LOCK_NB)); /* shared locks coexist */
    CHECK_ERR(flock(a, LOCK_EX | LOCK_NB), EWOULDBLOCK); /* b still shares it */
    OK(close(b));                    /* the last reference of b's description: its lock goes */
    OK(flock(a, LOCK_EX | LOCK_NB));
    CHECK_ERR(flock(a, 0), EINVAL);
    OK(flock(a, LOCK_MAND | LOCK_READ)); /* Linux ignores the retired mandatory locks */
    OK(close(a));
    unlink(path);
}

/* Record locks: ranges, F_GETLK's answer, the owner process, release by any close and by exit. */
static void test_record(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = open_file(), other = open_file();
    OK(record_lock(fd, F_SETLK, F_WRLCK, 0, 10));
    OK(record_lock(other, F_SETLK, F_RDLCK, 5, 1)); /* the same process: no conflict, the range is replaced */
    int ready[2];
    OK(pipe(ready));
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        int mine = open_file();
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 2, .l_len = 1};
        OK(fcntl(mine, F_GETLK, &fl));
        CHECK_EQ(fl.l_type, F_WRLCK);
        CHECK_EQ(fl.l_pid, getppid());
        CHECK_EQ(fl.l_start, 0);
        CHECK_EQ(fl.l_len, 5); /* 0..4: the read lock at 5 split the parent's write lock */
        fl = (struct flock){.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 5, .l_len = 1};
        OK(fcntl(mine, F_GETLK, &fl));
        CHECK_EQ(fl.l_type, F_UNLCK); /* read locks coexist */
        OK(record_lock(mine, F_SETLK, F_WRLCK, 10, 10)); /* past the parent's range */
        int rc = record_lock(mine, F_SETLK, F_WRLCK, 9, 2);
        CHECK(rc < 0 && (errno == EAGAIN || errno == EACCES), "rc %d errno %d", rc, errno);
        CHECK_EQ(write(ready[1], "x", 1), 1);
        /* F_SETLKW: waits until the parent closes a descriptor of the file */
        OK(record_lock(mine, F_SETLKW, F_WRLCK, 0, 0));
        child_exit(0);
    }
    char c;
    CHECK_EQ(read(ready[0], &c, 1), 1);
    OK(close(other)); /* any close of the file by the process drops all its record locks */
    expect_exit(pid, 0);
    OK(record_lock(fd, F_SETLK, F_WRLCK, 0, 0)); /* the child's locks went with it */
    OK(close(fd));
    OK(close(ready[0]));
    OK(close(ready[1]));
    unlink(path);
}

/* OFD locks: owned by the description, so two opens in one process contend; l_pid must be 0. */
static void test_ofd(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int a = open_file(), b = open_file();
    OK(record_lock(a, F_OFD_SETLK, F_WRLCK, 0, 4));
    int rc = record_lock(b, F_OFD_SETLK, F_RDLCK, 2, 1);
    CHECK(rc < 0 && (errno == EAGAIN || errno == EACCES), "rc %d errno %d", rc, errno);
    struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 3, .l_len = 1};
    OK(fcntl(b, F_OFD_GETLK, &fl));
    CHECK_EQ(fl.l_type, F_WRLCK);
    CHECK_EQ(fl.l_pid, -1);
    fl = (struct flock){.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1, .l_pid = 7};
    CHECK_ERR(fcntl(b, F_OFD_SETLK, &fl), EINVAL);
    rc = record_lock(b, F_SETLK, F_WRLCK, 1, 1); /* a record lock of the same process contends too */
    CHECK(rc < 0 && (errno == EAGAIN || errno == EACCES), "rc %d errno %d", rc, errno);
    OK(close(a));
    OK(record_lock(b, F_OFD_SETLK, F_WRLCK, 0, 4));
    OK(close(b));
    unlink(path);
}

/* lockf (fcntl record locks underneath) and the access modes a lock type needs. */
static void test_lockf(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = open_file();
    OK(lockf(fd, F_TLOCK, 0));
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        int mine = open_file();
        int rc = lockf(mine, F_TEST, 0);
        CHECK(rc < 0 && (errno == EAGAIN || errno == EACCES), "rc %d errno %d", rc, errno);
        child_exit(0);
    }
    expect_exit(pid, 0);
    OK(lockf(fd, F_ULOCK, 0));
    OK(close(fd));
    int ro = (int)OK(open(path, O_RDONLY));
    CHECK_ERR(record_lock(ro, F_SETLK, F_WRLCK, 0, 1), EBADF);
    OK(record_lock(ro, F_SETLK, F_RDLCK, 0, 1));
    OK(close(ro));
    unlink(path);
}

/* Malformed requests get Linux's errors: a bad whence or type, a range before 0 or past the
 * largest offset, a struct at an unmapped address; and many disjoint locks of one process work. */
static void test_bad_requests(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = open_file();
    struct flock fl = {.l_type = F_WRLCK, .l_whence = 7, .l_start = 0, .l_len = 1};
    CHECK_ERR(fcntl(fd, F_SETLK, &fl), EINVAL);
    fl = (struct flock){.l_type = 9, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    CHECK_ERR(fcntl(fd, F_SETLK, &fl), EINVAL);
    CHECK_ERR(record_lock(fd, F_SETLK, F_WRLCK, -1, 1), EINVAL);
    CHECK_ERR(record_lock(fd, F_SETLK, F_WRLCK, 5, -10), EINVAL); /* reaches before byte 0 */
    CHECK_ERR(record_lock(fd, F_SETLK, F_WRLCK, 10, INT64_MAX), EOVERFLOW);
    fl = (struct flock){.l_type = F_WRLCK, .l_whence = SEEK_END, .l_start = -30, .l_len = 1};
    CHECK_ERR(fcntl(fd, F_SETLK, &fl), EINVAL); /* the file has 20 bytes */
    CHECK_ERR(fcntl(fd, F_SETLK, (struct flock *)8), EFAULT);
    CHECK_ERR(fcntl(fd, F_GETLK, (struct flock *)8), EFAULT);
    for (int i = 0; i < 2000; i++) OK(record_lock(fd, F_SETLK, i % 2 ? F_RDLCK : F_WRLCK, 2 * i, 1));
    OK(record_lock(fd, F_SETLK, F_UNLCK, 0, 0));
    OK(record_lock(fd, F_SETLK, F_WRLCK, 5, -5)); /* bytes 0..4 */
    OK(close(fd));
    unlink(path);
}

/* n processes in a ring, each holding byte i and then waiting (F_SETLKW) for byte i + 1 of the
 * next: the request that would close the cycle fails with EDEADLK, whichever process makes it last
 * (the order is the scheduler's), and exactly one does; it lets its byte go, and the others then
 * get theirs in turn. Returns 1 if this process got EDEADLK. */
static int ring_member(int fd, int i, int n) {
    int rc = record_lock(fd, F_SETLKW, F_WRLCK, (i + 1) % n, 1);
    if (rc < 0) {
        CHECK_EQ(errno, EDEADLK);
        OK(record_lock(fd, F_SETLK, F_UNLCK, i, 1));
        return 1;
    }
    return 0;
}

static void deadlock_ring(int n) {
    int fd = open_file();
    int ready[2], go[2];
    OK(pipe(ready));
    OK(pipe(go));
    pid_t pids[8];
    OK(record_lock(fd, F_SETLK, F_WRLCK, 0, 1));
    for (int i = 1; i < n; i++) {
        pids[i] = fork_or_fail();
        if (pids[i] == 0) {
            int mine = open_file(); /* its own descriptor: record locks are the process's anyway */
            OK(record_lock(mine, F_SETLK, F_WRLCK, i, 1));
            char c;
            CHECK_EQ(write(ready[1], "r", 1), 1);
            CHECK_EQ(read(go[0], &c, 1), 1);
            child_exit(ring_member(mine, i, n));
        }
    }
    char c;
    for (int i = 1; i < n; i++) CHECK_EQ(read(ready[0], &c, 1), 1);
    for (int i = 1; i < n; i++) CHECK_EQ(write(go[1], "g", 1), 1);
    int deadlocks = ring_member(fd, 0, n);
    OK(record_lock(fd, F_SETLK, F_UNLCK, 0, 0)); /* lets the process before it go on */
    for (int i = 1; i < n; i++) {
        int st = 0;
        CHECK_EQ(OK(waitpid(pids[i], &st, 0)), pids[i]);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) <= 1, "pid %d: status 0x%x", pids[i], st);
        deadlocks += WIFEXITED(st) ? WEXITSTATUS(st) : 0;
    }
    CHECK_EQ(deadlocks, 1);
    OK(close(fd));
    OK(close(ready[0]));
    OK(close(ready[1]));
    OK(close(go[0]));
    OK(close(go[1]));
}

/* Deadlocks between record-lock waiters: EDEADLK for the request that closes a cycle of two or of
 * three processes, as on Linux (test_record has a wait that closes none: it just waits). */
static void test_deadlock(int argc, char **argv) {
    (void)argc;
    (void)argv;
    deadlock_ring(2);
    deadlock_ring(3);
    unlink(path);
}

static const zb_test tests[] = {
    {"deadlock", test_deadlock},
    {"bad_requests", test_bad_requests},
    {"flock", test_flock},
    {"record", test_record},
    {"ofd", test_ofd},
    {"lockf", test_lockf},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
