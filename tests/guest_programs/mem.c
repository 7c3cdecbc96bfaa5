/* mem.c - guest memory syscalls: bad pointers, mmap/munmap/brk/mremap, exhaustion, file mappings.
 * The guest has 256 MiB (see tests/guest_c.py); its low 2 MiB belong to the supervisor.
 */
#include "check.h"

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <time.h>

#define MIB (1ul << 20)

static void *map(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) FAIL("mmap(%zu): %s", len, strerror(errno));
    return p;
}

/* A page that was mapped and then unmapped: nothing is there. */
static char *unmapped_page(void) {
    char *p = map(PAGE);
    munmap(p, PAGE);
    return p;
}

/* Every pointer argument must be checked: unmapped memory, the supervisor's low 2 MiB, NULL, a
 * length running past the end of a mapping or wrapping around the address space. */
static void test_efault(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char *gone = unmapped_page();
    char *bads[] = {gone, (char *)0x1000, (char *)0x100000, NULL, (char *)0x7f0000000000ul, (char *)-4096l};
    int zero = OK(open("/dev/zero", O_RDONLY));
    int file = OK(open("/tmp/efault", O_CREAT | O_RDWR, 0600));
    CHECK_EQ(write(file, "0123456789abcdefghij", 20), 20);
    int p[2];
    OK(pipe2(p, O_NONBLOCK));
    OK(write(p[1], "x", 1));
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        char *bad = bads[i];
        fprintf(stderr, "bad pointer %p\n", (void *)bad);
        CHECK_ERR(syscall(SYS_read, zero, bad, 16), EFAULT);
        CHECK_ERR(syscall(SYS_write, p[1], bad, 16), EFAULT);
        CHECK_ERR(syscall(SYS_pread64, zero, bad, 16, 0), EFAULT);
        CHECK_ERR(syscall(SYS_pread64, file, bad, 16, 0), EFAULT);
        CHECK_ERR(syscall(SYS_pwrite64, file, bad, 16, 0), EFAULT);
        CHECK_ERR(syscall(SYS_write, file, bad, 16), EFAULT);
        CHECK_ERR(syscall(SYS_open, bad, O_RDONLY), EFAULT);
        CHECK_ERR(syscall(SYS_openat, AT_FDCWD, bad, O_RDONLY), EFAULT);
        CHECK_ERR(syscall(SYS_stat, bad, bad), EFAULT);
        CHECK_ERR(syscall(SYS_stat, "/tmp", bad), EFAULT);
        CHECK_ERR(syscall(SYS_fstat, zero, bad), EFAULT);
        CHECK_ERR(syscall(SYS_newfstatat, AT_FDCWD, "/tmp", bad, 0), EFAULT);
        CHECK_ERR(syscall(SYS_statx, AT_FDCWD, "/tmp", 0, 0x7ff, bad), EFAULT);
        CHECK_ERR(syscall(SYS_access, bad, F_OK), EFAULT);
        CHECK_ERR(syscall(SYS_readlink, "/proc/self/exe", bad, 64), EFAULT);
        CHECK_ERR(syscall(SYS_getcwd, bad, 64), EFAULT);
        CHECK_ERR(syscall(SYS_mkdir, bad, 0755), EFAULT);
        CHECK_ERR(syscall(SYS_uname, bad), EFAULT);
        CHECK_ERR(syscall(SYS_clock_gettime, CLOCK_REALTIME, bad), EFAULT);
        if (bad) CHECK_ERR(syscall(SYS_gettimeofday, bad, NULL), EFAULT); /* NULL: no output wanted */
        CHECK_ERR(syscall(SYS_nanosleep, bad, NULL), EFAULT);
        CHECK_ERR(syscall(SYS_getrandom, bad, 16, 0), EFAULT);
        CHECK_ERR(syscall(SYS_pipe2, bad, 0), EFAULT);
        if (bad) { /* NULL means "no new value" or "no old value wanted" here */
            CHECK_ERR(syscall(SYS_rt_sigaction, SIGUSR1, bad, NULL, 8), EFAULT);
            CHECK_ERR(syscall(SYS_rt_sigaction, SIGUSR1, NULL, bad, 8), EFAULT);
            CHECK_ERR(syscall(SYS_rt_sigprocmask, SIG_BLOCK, bad, NULL, 8), EFAULT);
            CHECK_ERR(syscall(SYS_rt_sigprocmask, SIG_BLOCK, NULL, bad, 8), EFAULT);
            CHECK_ERR(syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, NULL, bad), EFAULT);
        }
        CHECK_ERR(syscall(SYS_sched_getaffinity, 0, 128, bad), EFAULT);
        CHECK_ERR(syscall(SYS_sysinfo, bad), EFAULT);
        CHECK_ERR(syscall(SYS_futex, bad, 0 /* FUTEX_WAIT */, 0, NULL), EFAULT);
        CHECK_ERR(syscall(SYS_readv, zero, bad, 1), EFAULT);
        struct iovec iov[2] = {{bad, 8}, {bad, 8}};
        CHECK_ERR(syscall(SYS_readv, zero, iov, 2), EFAULT);
        CHECK_ERR(syscall(SYS_writev, p[1], iov, 2), EFAULT);
        int dir = OK(open("/tmp", O_RDONLY | O_DIRECTORY));
        CHECK_ERR(syscall(SYS_getdents64, dir, bad, 4096), EFAULT);
        close(dir);
    }
    /* a valid buffer with a length that runs past its mapping, or wraps around */
    char *buf = map(2 * PAGE);
    OK(munmap(buf + PAGE, PAGE));
    CHECK_ERR(syscall(SYS_read, zero, buf, 2 * PAGE), EFAULT);
    CHECK_ERR(syscall(SYS_write, p[1], buf + PAGE - 8, 16), EFAULT);
    CHECK_ERR(syscall(SYS_getrandom, buf + 8, PAGE, 0), EFAULT);
    CHECK_ERR(syscall(SYS_read, zero, buf, (size_t)-1), EFAULT);
    CHECK_ERR(syscall(SYS_write, p[1], buf, (size_t)0 - (size_t)buf + 16), EFAULT);
    CHECK_ERR(syscall(SYS_getrandom, buf, (size_t)-256, 0), EFAULT);
    struct iovec wrap = {buf, (size_t)-1 / 2};
    CHECK_ERR(syscall(SYS_readv, zero, &wrap, 1), EFAULT);
    /* a path string that runs into unmapped memory without a NUL (shorter than PATH_MAX, which
     * would be ENAMETOOLONG) */
    memset(buf, 'a', PAGE);
    CHECK_ERR(syscall(SYS_open, buf + 100, O_RDONLY), EFAULT);
    CHECK_ERR(syscall(SYS_stat, buf + 100, buf), EFAULT);
    CHECK_ERR(syscall(SYS_open, buf, O_RDONLY), ENAMETOOLONG);
    /* the valid part of a buffer is still usable */
    CHECK_EQ(syscall(SYS_read, zero, buf, PAGE), PAGE);
    CHECK_EQ(syscall(SYS_read, p[0], buf, 16), 1);
}

/* An unknown syscall number and a real syscall the engine does not implement: ENOSYS, twice each
 * (the engine logs each only once). */
static void test_enosys(int argc, char **argv) {
    (void)argc;
    (void)argv;
    for (int i = 0; i < 2; i++) {
        CHECK_ERR(syscall(423), ENOSYS); /* unused by Linux on x86-64; zeroboot's own count up from 400 */
        CHECK_ERR(syscall(SYS_io_uring_setup, 8, NULL), ENOSYS);
        CHECK_ERR(syscall(100000), ENOSYS);
    }
}

/* Allocate until the 256 MiB guest is full: ENOMEM, never a crash. Give it all back, allocate the
 * same again, and the memory that was written before reads as zeros. */
static void test_exhaust(int argc, char **argv) {
    (void)argc;
    (void)argv;
    enum { CHUNK = 4 * MIB, MAXCHUNKS = 512 };
    static char *chunks[MAXCHUNKS];
    int n = 0;
    while (n < MAXCHUNKS) {
        char *c = mmap(NULL, CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (c == MAP_FAILED) {
            CHECK(errno == ENOMEM, "mmap failed with errno %d, want ENOMEM", errno);
            break;
        }
        for (size_t off = 0; off < CHUNK; off += 64 * 1024) *(uint64_t *)(c + off) = 0x5a5a5a5a00000000ull | off;
        chunks[n++] = c;
    }
    CHECK(n > 40 && n < 64, "%d chunks of 4 MiB fit a 256 MiB guest", n);
    /* smaller requests fail too once the memory is gone; fill the remaining crumbs first */
    while (mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) {}
    CHECK_EQ(errno, ENOMEM);
    long cur = syscall(SYS_brk, 0);
    CHECK_EQ(syscall(SYS_brk, cur + MIB), cur); /* brk cannot grow either */
    CHECK(mmap(NULL, 256 * MIB, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED && errno == ENOMEM, "256 MiB mmap");
    CHECK(mmap(NULL, 1ul << 40, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED && errno == ENOMEM, "1 TiB mmap");
    /* one chunk back: exactly that much can be allocated again */
    OK(munmap(chunks[n - 1], CHUNK));
    char *again = mmap(NULL, CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(again != MAP_FAILED, "mmap after munmap: %s", strerror(errno));
    if (again != MAP_FAILED) {
        CHECK_EQ(*(uint64_t *)again, 0);
        CHECK_EQ(*(uint64_t *)(again + CHUNK - 64 * 1024), 0);
        chunks[n - 1] = again;
    }
    for (int i = 0; i < n; i++) OK(munmap(chunks[i], CHUNK));
    for (int i = 0; i < n; i++) {
        char *c = mmap(NULL, CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (c == MAP_FAILED) { FAIL("chunk %d of %d after giving everything back: %s", i, n, strerror(errno)); break; }
        for (size_t off = 0; off < CHUNK; off += 64 * 1024)
            if (*(uint64_t *)(c + off)) { FAIL("chunk %d offset %zu reads 0x%lx, not zero", i, off, *(uint64_t *)(c + off)); break; }
    }
    printf("chunks %d\n", n);
}

static void test_brk(int argc, char **argv) {
    (void)argc;
    (void)argv;
    long start = syscall(SYS_brk, 0);
    CHECK(start > 0 && start % PAGE == 0, "initial break 0x%lx", start);
    CHECK_EQ(syscall(SYS_brk, start + MIB), start + MIB);
    memset((char *)start, 0xab, MIB);
    CHECK_EQ(readable((char *)start + MIB - 16, 16), 1);
    /* shrinking gives the memory back ... */
    CHECK_EQ(syscall(SYS_brk, start + PAGE), start + PAGE);
    CHECK_EQ(readable((char *)start + 2 * PAGE, 16), 0);
    CHECK_EQ(((unsigned char *)start)[PAGE - 1], 0xab);
    /* ... and growing again brings back zeros */
    CHECK_EQ(syscall(SYS_brk, start + 2 * MIB), start + 2 * MIB);
    CHECK_EQ(((unsigned char *)start)[PAGE + 5], 0);
    CHECK_EQ(((unsigned char *)start)[MIB - 1], 0);
    /* an unaligned break is kept as given; its page is usable */
    CHECK_EQ(syscall(SYS_brk, start + 3 * PAGE + 100), start + 3 * PAGE + 100);
    ((char *)start)[4 * PAGE - 1] = 1;
    /* impossible requests leave the break where it is */
    long cur = syscall(SYS_brk, 0);
    CHECK_EQ(cur, start + 3 * PAGE + 100);
    CHECK_EQ(syscall(SYS_brk, (long)&test_brk), cur); /* below the heap: in the program's text */
    CHECK_EQ(syscall(SYS_brk, start + 1024 * MIB), cur);
    CHECK_EQ(syscall(SYS_brk, -4096l), cur);
    /* glibc's malloc works on top */
    char *m = malloc(100);
    CHECK(m != NULL, "malloc");
    free(m);
}

static void fill(char *p, size_t len, int seed) {
    for (size_t i = 0; i < len; i++) p[i] = (char)(i * 7 + seed);
}
static int same(const char *p, size_t len, int seed) {
    for (size_t i = 0; i < len; i++)
        if (p[i] != (char)(i * 7 + seed)) return 0;
    return 1;
}

static void test_mremap(int argc, char **argv) {
    (void)argc;
    (void)argv;
    /* room above: grows in place */
    char *a = map(16 * PAGE);
    OK(munmap(a + 2 * PAGE, 14 * PAGE));
    fill(a, 2 * PAGE, 1);
    char *b = mremap(a, 2 * PAGE, 8 * PAGE, 0);
    CHECK(b == a, "grow in place: %p -> %p (%s)", (void *)a, (void *)b, strerror(errno));
    CHECK(same(a, 2 * PAGE, 1), "contents kept");
    CHECK_EQ(a[5 * PAGE], 0);
    a[8 * PAGE - 1] = 1;
    /* blocked above: ENOMEM unless it may move */
    char *blocker = mmap(a + 8 * PAGE, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(blocker == a + 8 * PAGE, "blocker at %p: %p", (void *)(a + 8 * PAGE), (void *)blocker);
    fill(a, 8 * PAGE, 2);
    CHECK(mremap(a, 8 * PAGE, 64 * PAGE, 0) == MAP_FAILED && errno == ENOMEM, "blocked grow without MREMAP_MAYMOVE");
    char *c = mremap(a, 8 * PAGE, 64 * PAGE, MREMAP_MAYMOVE);
    CHECK(c != MAP_FAILED && c != a, "grow by moving: %p", (void *)c);
    if (c == MAP_FAILED) return;
    CHECK(same(c, 8 * PAGE, 2), "contents moved");
    CHECK_EQ(c[40 * PAGE], 0);
    CHECK_EQ(readable(a, PAGE), 0); /* the old range is gone */
    CHECK_EQ(readable(blocker, PAGE), 1);
    c[64 * PAGE - 1] = 3;
    /* shrink: same address, the tail is gone */
    CHECK(mremap(c, 64 * PAGE, 4 * PAGE, 0) == c, "shrink");
    CHECK_EQ(readable(c + 4 * PAGE, PAGE), 0);
    CHECK(same(c, 4 * PAGE, 2), "contents after shrink");
    /* move to a chosen address */
    char *dst = unmapped_page();
    OK(munmap(dst - 8 * PAGE, 16 * PAGE)); /* make sure 16 pages around it are free */
    dst -= 8 * PAGE;
    char *d = mremap(c, 4 * PAGE, 4 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
    CHECK(d == dst, "MREMAP_FIXED: %p, want %p (%s)", (void *)d, (void *)dst, strerror(errno));
    if (d == dst) CHECK(same(d, 4 * PAGE, 2), "contents at the fixed address");
    CHECK_EQ(readable(c, PAGE), 0);
    /* bad requests */
    CHECK(mremap(d + 1, PAGE, 2 * PAGE, MREMAP_MAYMOVE) == MAP_FAILED && errno == EINVAL, "unaligned");
    CHECK(mremap(d, PAGE, 2 * PAGE, MREMAP_FIXED, dst + 64 * PAGE) == MAP_FAILED && errno == EINVAL, "FIXED without MAYMOVE");
    CHECK(mremap(c, PAGE, 2 * PAGE, MREMAP_MAYMOVE) == MAP_FAILED && errno == EFAULT, "unmapped old range");
    CHECK(mremap(d, 4 * PAGE, 1ul << 40, MREMAP_MAYMOVE) == MAP_FAILED && errno == ENOMEM, "1 TiB");
}

static void test_map_fixed(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char *a = map(4 * PAGE);
    memset(a, 0xaa, 4 * PAGE);
    /* MAP_FIXED replaces what was there with fresh zeros */
    char *b = mmap(a + PAGE, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    CHECK(b == a + PAGE, "MAP_FIXED over a mapping: %p", (void *)b);
    CHECK_EQ((unsigned char)a[PAGE - 1], 0xaa);
    CHECK_EQ(a[PAGE], 0);
    CHECK_EQ(a[3 * PAGE - 1], 0);
    CHECK_EQ((unsigned char)a[3 * PAGE], 0xaa);
    /* MAP_FIXED_NOREPLACE refuses an occupied range, takes a free one at exactly that address */
    CHECK(mmap(a + 3 * PAGE, 2 * PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) == MAP_FAILED &&
              errno == EEXIST, "NOREPLACE over a mapping");
    char *hole = unmapped_page();
    char *c = mmap(hole, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(c == hole, "NOREPLACE in a hole: %p, want %p", (void *)c, (void *)hole);
    /* a free hint is honoured without MAP_FIXED */
    hole = unmapped_page();
    c = mmap(hole, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(c == hole, "hint: %p, want %p", (void *)c, (void *)hole);
    /* an occupied hint is not */
    c = mmap(a, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(c != MAP_FAILED && c != a, "occupied hint: %p", (void *)c);
    CHECK_EQ((unsigned char)a[0], 0xaa);
    /* bad requests */
    CHECK(mmap(a + 1, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED && errno == EINVAL, "unaligned");
    CHECK(mmap(NULL, 0, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED && errno == EINVAL, "zero length");
    CHECK(mmap(NULL, PAGE, PROT_READ, MAP_ANONYMOUS, -1, 0) == MAP_FAILED && errno == EINVAL, "neither private nor shared");
    CHECK(mmap(NULL, PAGE, PROT_READ, MAP_PRIVATE, 999, 0) == MAP_FAILED && errno == EBADF, "bad fd");
    CHECK(mmap((void *)0x1000, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED && errno == EPERM,
          "below mmap_min_addr");
    CHECK(mmap((void *)0x100000, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED, "supervisor memory");
    CHECK(mmap((void *)(1ul << 40), PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED &&
              errno == ENOMEM, "beyond guest memory");
    CHECK_EQ(readable((void *)0x100000, 8), 0);
    /* munmap of unaligned or out-of-range addresses */
    CHECK_ERR(munmap(a + 1, PAGE), EINVAL);
    CHECK_ERR(munmap(a, 0), EINVAL);
    CHECK_EQ(munmap(hole + 64 * PAGE, PAGE), 0); /* nothing mapped there: fine, as in Linux */
}

/* Map `path` (a host file from the view, or an overlay file) and compare it with read(). */
static void check_file_mapping(const char *path) {
    int fd = OK(open(path, O_RDONLY));
    struct stat st;
    OK(fstat(fd, &st));
    size_t size = (size_t)st.st_size;
    CHECK(size > 2 * PAGE, "%s is %zu bytes", path, size);
    char *want = malloc(size);
    CHECK_EQ(pread(fd, want, size, 0), (long)size);
    char *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    CHECK(m != MAP_FAILED, "mmap %s: %s", path, strerror(errno));
    if (m == MAP_FAILED) return;
    CHECK(!memcmp(m, want, size), "mapping of %s equals its contents", path);
    size_t tail = (PAGE - size % PAGE) % PAGE;
    for (size_t i = 0; i < tail; i++)
        if (m[size + i]) { FAIL("byte %zu past the end of %s reads %d", i, path, m[size + i]); break; }
    /* an offset mapping */
    char *o = mmap(NULL, size - PAGE, PROT_READ, MAP_PRIVATE, fd, PAGE);
    CHECK(o != MAP_FAILED && !memcmp(o, want + PAGE, size - PAGE), "mapping at offset 4096");
    CHECK(mmap(NULL, PAGE, PROT_READ, MAP_PRIVATE, fd, 100) == MAP_FAILED && errno == EINVAL, "unaligned offset");
    /* private writes stay private */
    char *w = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    CHECK(w != MAP_FAILED, "writable private mapping: %s", strerror(errno));
    if (w != MAP_FAILED) {
        memset(w, 0x11, 2 * PAGE);
        char again[64];
        CHECK_EQ(pread(fd, again, sizeof again, 0), (long)sizeof again);
        CHECK(!memcmp(again, want, sizeof again), "the file is unchanged");
        CHECK(!memcmp(m, want, 2 * PAGE), "other mappings are unchanged");
        /* after munmap, anonymous memory at the same place reads zero, not the file */
        OK(munmap(w, size));
        char *z = mmap(w, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        CHECK(z == w, "remap");
        for (size_t i = 0; i < size; i += 512)
            if (z[i]) { FAIL("anonymous memory where %s was mapped reads %d at %zu", path, z[i], i); break; }
    }
    /* a mapping outlives its fd */
    close(fd);
    CHECK(!memcmp(m, want, size), "mapping after close");
    OK(munmap(m, size));
    CHECK_EQ(readable(m, 16), 0);
    /* a read-only fd cannot make a shared writable mapping; directories cannot be mapped */
    fd = OK(open(path, O_RDONLY));
    CHECK(mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED && errno == EACCES, "shared writable");
    close(fd);
    int dir = OK(open("/tmp", O_RDONLY | O_DIRECTORY));
    CHECK(mmap(NULL, PAGE, PROT_READ, MAP_PRIVATE, dir, 0) == MAP_FAILED && errno == ENODEV, "directory");
    close(dir);
    free(want);
}

static void test_mmap_host_file(int argc, char **argv) {
    (void)argc;
    check_file_mapping(argv[0]); /* this program: a host file in the read-only view */
}

static void test_mmap_overlay_file(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = OK(open("/tmp/mapped", O_CREAT | O_RDWR | O_TRUNC, 0644));
    size_t size = 5 * PAGE + 123;
    char *data = malloc(size);
    fill(data, size, 9);
    CHECK_EQ(write(fd, data, size), (long)size);
    close(fd);
    check_file_mapping("/tmp/mapped");
    free(data);
}

/* Freed memory reads as zeros when it is handed out again, however it was freed: big freed
 * ranges are kept mapped for reuse by the engine and must be zeroed when reused (munmap, brk,
 * mremap shrinks, part of a mapping, then smaller and larger mappings over the same range). */
static int all_zero(const char *p, size_t len) {
    for (size_t i = 0; i < len; i += 8)
        if (*(const uint64_t *)(p + i)) return 0;
    return 1;
}

static void test_reuse_reads_zero(int argc, char **argv) {
    (void)argc;
    (void)argv;
    for (int round = 0; round < 3; round++) {
        char *a = map(8 * MIB);
        memset(a, 0xab, 8 * MIB);
        OK(munmap(a, 8 * MIB));
        char *b = map(8 * MIB);
        CHECK(all_zero(b, 8 * MIB), "round %d: a mapping over freed memory (%p, was %p) is not all zeros", round,
              (void *)b, (void *)a);
        memset(b, 0xcd, 8 * MIB);
        OK(munmap(b, 8 * MIB));
        /* smaller pieces over the same range */
        char *c = map(1 * MIB), *d = map(3 * MIB), *e = map(4 * MIB);
        CHECK(all_zero(c, MIB) && all_zero(d, 3 * MIB) && all_zero(e, 4 * MIB), "round %d: pieces not zero", round);
        memset(c, 1, MIB);
        memset(d, 2, 3 * MIB);
        memset(e, 3, 4 * MIB);
        OK(munmap(c, MIB));
        OK(munmap(d, 3 * MIB));
        OK(munmap(e, 4 * MIB));
    }
    /* a hole punched into a big mapping, then mapped again at the same place */
    char *big = map(16 * MIB);
    memset(big, 0x5a, 16 * MIB);
    OK(munmap(big + 4 * MIB, 4 * MIB));
    char *again = mmap(big + 4 * MIB, 4 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(again == big + 4 * MIB, "MAP_FIXED_NOREPLACE into the hole: %p", (void *)again);
    CHECK(all_zero(again, 4 * MIB), "the hole is not zeros");
    CHECK_EQ((unsigned char)big[4 * MIB - 1], 0x5a);
    CHECK_EQ((unsigned char)big[8 * MIB], 0x5a);
    /* mremap: shrink a big mapping, then grow it back in place */
    CHECK(mremap(big, 16 * MIB, 2 * MIB, 0) == big, "shrink");
    char *grown = mremap(big, 2 * MIB, 16 * MIB, 0);
    if (grown == big) CHECK(all_zero(big + 2 * MIB, 14 * MIB), "grown tail is not zeros");
    CHECK_EQ((unsigned char)big[2 * MIB - 1], 0x5a);
    /* brk: grow, fill, shrink, grow */
    long start = syscall(SYS_brk, 0);
    CHECK_EQ(syscall(SYS_brk, start + 8 * MIB), start + 8 * MIB);
    memset((char *)start, 0x77, 8 * MIB);
    CHECK_EQ(syscall(SYS_brk, start), start);
    CHECK_EQ(syscall(SYS_brk, start + 8 * MIB), start + 8 * MIB);
    CHECK(all_zero((char *)start, 8 * MIB), "the heap grown again is not zeros");
}

static const zb_test tests[] = {
    {"reuse_reads_zero", test_reuse_reads_zero},
    {"efault", test_efault},
    {"enosys", test_enosys},
    {"exhaust", test_exhaust},
    {"brk", test_brk},
    {"mremap", test_mremap},
    {"map_fixed", test_map_fixed},
    {"mmap_host_file", test_mmap_host_file},
    {"mmap_overlay_file", test_mmap_overlay_file},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
