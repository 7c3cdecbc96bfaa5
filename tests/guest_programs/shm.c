/* shm.c - memory shared between processes: MAP_SHARED anonymous mappings and MAP_SHARED mappings
 * of /dev/shm files that stay shared across fork (each side sees the other's writes), private
 * mappings that do not, named POSIX semaphores (sem_open: a /dev/shm file mapped shared + futexes)
 * ping-ponged between processes, and non-private futex waits woken from another process (a
 * private wake does not cross), and a timed wait that expires while another process runs.
 * Children report failed checks through their exit status. */
#include "check.h"
#include "children.h"

#include <linux/futex.h>
#include <semaphore.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

/* One byte through a pipe: the other side may go on. */
static void signal_fd(int fd) { CHECK_EQ(OK(write(fd, "x", 1)), 1); }
static void wait_fd(int fd) {
    char c;
    CHECK_EQ(OK(read(fd, &c, 1)), 1);
}

/* Writes cross in both directions, at several pages, while a MAP_PRIVATE mapping stays private. */
static void check_shared(volatile uint32_t *sh, size_t pages) {
    volatile uint32_t *priv = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(priv != MAP_FAILED, "mmap private");
    int to_child[2], to_parent[2];
    OK(pipe(to_child));
    OK(pipe(to_parent));
    sh[0] = 1;
    *priv = 1;
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        CHECK_EQ(sh[0], 1);
        for (size_t p = 0; p < pages; p++) sh[p * 1024 + 1] = (uint32_t)(100 + p);
        sh[0] = 2;
        *priv = 2;
        signal_fd(to_parent[1]);
        wait_fd(to_child[0]);
        CHECK_EQ(sh[0], 3); /* the parent's write after the fork */
        CHECK_EQ(sh[2], 33);
        CHECK_EQ(*priv, 2);
        child_exit(0);
    }
    wait_fd(to_parent[0]);
    CHECK_EQ(sh[0], 2); /* the child's write */
    for (size_t p = 0; p < pages; p++) CHECK(sh[p * 1024 + 1] == 100 + p, "page %zu: %u", p, sh[p * 1024 + 1]);
    CHECK_EQ(*priv, 1);
    sh[0] = 3;
    sh[2] = 33;
    signal_fd(to_child[1]);
    expect_exit(pid, 0);
    CHECK_EQ(sh[0], 3);
    close(to_child[0]), close(to_child[1]), close(to_parent[0]), close(to_parent[1]);
}

static void test_anon_shared(int argc, char **argv) {
    (void)argc, (void)argv;
    const size_t pages = 4;
    uint32_t *sh = mmap(NULL, pages * 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED, "mmap shared anonymous: %s", strerror(errno));
    CHECK_EQ(sh[0] | sh[1023], 0); /* reads as zeros */
    check_shared(sh, pages);
    /* grandchildren share it too, and a counter incremented in turn by 4 processes adds up */
    sh[3] = 0;
    pid_t kids[4];
    for (int i = 0; i < 4; i++) {
        kids[i] = fork_or_fail();
        if (kids[i] == 0) {
            pid_t g = fork_or_fail();
            if (g == 0) {
                for (int k = 0; k < 100; k++) __atomic_fetch_add(&sh[3], 1, __ATOMIC_SEQ_CST);
                child_exit(0);
            }
            expect_exit(g, 0);
            child_exit(0);
        }
    }
    for (int i = 0; i < 4; i++) expect_exit(kids[i], 0);
    CHECK_EQ(sh[3], 400);
    OK(munmap(sh, pages * 4096));
}

static void test_devshm(int argc, char **argv) {
    (void)argc, (void)argv;
    int fd = OK(shm_open("/zb-test", O_RDWR | O_CREAT | O_EXCL, 0600));
    OK(ftruncate(fd, 3 * 4096));
    struct stat st;
    OK(fstat(fd, &st));
    CHECK_EQ(st.st_size, 3 * 4096);
    uint32_t *sh = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(sh != MAP_FAILED, "mmap /dev/shm file: %s", strerror(errno));
    check_shared(sh, 3);
    /* a second process opening it by name sees the bytes, and its write() reaches the mapping */
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        int f2 = OK(shm_open("/zb-test", O_RDWR, 0));
        uint32_t v = 0;
        CHECK_EQ(OK(pread(f2, &v, 4, 0)), 4);
        CHECK_EQ(v, 3);
        v = 77;
        CHECK_EQ(OK(pwrite(f2, &v, 4, 4096 + 8)), 4);
        child_exit(0);
    }
    expect_exit(pid, 0);
    CHECK_EQ(sh[1024 + 2], 77);
    OK(munmap(sh, 3 * 4096));
    OK(shm_unlink("/zb-test"));
    CHECK_ERR(shm_open("/zb-test", O_RDWR, 0), ENOENT);
    close(fd);
}

/* Named semaphores ping-ponged: every sem_wait that blocks is woken by the other process's post. */
static void test_semaphores(int argc, char **argv) {
    (void)argc, (void)argv;
    sem_t *ping = sem_open("/zb-ping", O_CREAT | O_EXCL, 0600, 0), *pong = sem_open("/zb-pong", O_CREAT | O_EXCL, 0600, 0);
    CHECK(ping != SEM_FAILED && pong != SEM_FAILED, "sem_open: %s", strerror(errno));
    OK(sem_unlink("/zb-ping"));
    OK(sem_unlink("/zb-pong"));
    const int rounds = 200;
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        for (int i = 0; i < rounds; i++) {
            OK(sem_wait(ping));
            OK(sem_post(pong));
        }
        child_exit(0);
    }
    for (int i = 0; i < rounds; i++) {
        OK(sem_post(ping));
        OK(sem_wait(pong));
    }
    expect_exit(pid, 0);
    int v = -1;
    OK(sem_getvalue(ping, &v));
    CHECK_EQ(v, 0);
    OK(sem_getvalue(pong, &v));
    CHECK_EQ(v, 0);
}

static long futex(volatile uint32_t *w, int op, uint32_t val) {
    return syscall(SYS_futex, w, op, val, NULL, NULL, 0);
}

/* A child waits on a shared word; a private wake does not reach it, a shared one does (once). */
static void test_futex(int argc, char **argv) {
    (void)argc, (void)argv;
    volatile uint32_t *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(w != MAP_FAILED, "mmap");
    int ready[2];
    OK(pipe(ready));
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        w[1] = 1; /* about to wait */
        signal_fd(ready[1]);
        while (w[0] == 0) {
            long r = futex(&w[0], FUTEX_WAIT, 0);
            CHECK(r == 0 || (r == -1 && (errno == EAGAIN || errno == EINTR)), "futex wait: %ld %s", r, strerror(errno));
        }
        CHECK_EQ(w[0], 5);
        child_exit(0);
    }
    wait_fd(ready[0]);
    /* let the child get into its wait (it runs while the parent sleeps); a private wake meanwhile
     * must not reach it */
    for (int spins = 0; spins < 1000; spins++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL); /* the parent sleeps: the child runs into its futex wait */
        if (futex(&w[0], FUTEX_WAKE_PRIVATE, 1) != 0) { FAIL("a private wake reached another process"); break; }
        if (spins > 20) break;
    }
    w[0] = 5;
    long woken = 0;
    for (int tries = 0; tries < 1000 && !woken; tries++) {
        woken = futex(&w[0], FUTEX_WAKE, 1);
        if (!woken) { struct timespec ts = {0, 1000000}; nanosleep(&ts, NULL); }
    }
    CHECK_EQ(woken, 1);
    expect_exit(pid, 0);
    /* a shared wake of an address no other process maps wakes nobody */
    volatile uint32_t local = 0;
    CHECK_EQ(OK(futex(&local, FUTEX_WAKE, 10)), 0);
}

/* A timed futex wait whose timeout passes while another process runs (its slice is longer): the
 * waiter's process resumes with ETIMEDOUT, not with another register state (the waiting thread is
 * parked while its process has yielded). */
static void test_timed_wait(int argc, char **argv) {
    (void)argc, (void)argv;
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do clock_gettime(CLOCK_MONOTONIC, &t); /* busy past the waiter's timeout and a slice */
        while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 300000000L);
        child_exit(0);
    }
    for (int i = 0; i < 3; i++) {
        volatile uint32_t word = 0;
        struct timespec to = {0, 20000000};
        errno = 0;
        long r = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &to, NULL, 0);
        CHECK(r == -1 && errno == ETIMEDOUT, "round %d: futex = %ld (errno %d)", i, r, errno);
    }
    expect_exit(pid, 0);
}

/* A shared anonymous mapping's bytes live in the file system (256 MiB by default) once shared:
 * one larger than that is ENOMEM at mmap, while a private one of that size is fine (run with a
 * guest of 1 GiB). */
static void test_fs_limit(int argc, char **argv) {
    (void)argc, (void)argv;
    size_t big = 300ul << 20;
    void *p = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(p == MAP_FAILED && errno == ENOMEM, "a 300 MiB shared mapping: %p %s", p, strerror(errno));
    p = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "a 300 MiB private mapping: %s", strerror(errno));
    uint32_t *sh = mmap(NULL, 16ul << 20, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED, "a 16 MiB shared mapping: %s", strerror(errno));
    if (sh == MAP_FAILED) return;
    check_shared(sh, 4096); /* every page of it crosses */
}

/* Hostile and edge arguments: shared anonymous mappings the size of memory, splits, fork of a split one. */
static void test_hostile(int argc, char **argv) {
    (void)argc, (void)argv;
    CHECK(mmap(NULL, 1ul << 46, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0) == MAP_FAILED, "huge");
    uint32_t *sh = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED, "mmap");
    OK(munmap(sh + 1024, 4096)); /* the middle page goes: two mappings of one region */
    sh[0] = 1;
    sh[2048] = 2;
    pid_t pid = fork_or_fail();
    if (pid == 0) {
        CHECK_EQ(sh[0], 1);
        CHECK_EQ(sh[2048], 2);
        sh[2048] = 3;
        child_exit(0);
    }
    expect_exit(pid, 0);
    CHECK_EQ(sh[2048], 3);
    /* a MAP_FIXED private mapping over a shared one ends the sharing there */
    CHECK(mmap(sh, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == sh, "fixed");
    CHECK_EQ(sh[0], 0);
    pid = fork_or_fail();
    if (pid == 0) {
        sh[0] = 9;
        child_exit(0);
    }
    expect_exit(pid, 0);
    CHECK_EQ(sh[0], 0);
    /* many small shared mappings: the table's limit answers ENOMEM, never a crash */
    int refused = 0;
    for (int i = 0; i < 1100 && !refused; i++)
        refused = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0) == MAP_FAILED;
    CHECK(refused && errno == ENOMEM, "the 1,024 mapping limit: %d %s", refused, strerror(errno));
}

static const zb_test tests[] = {
    {"anon_shared", test_anon_shared},
    {"devshm", test_devshm},
    {"semaphores", test_semaphores},
    {"futex", test_futex},
    {"timed_wait", test_timed_wait},
    {"fs_limit", test_fs_limit},
    {"hostile", test_hostile},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
