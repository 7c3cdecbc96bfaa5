/* shared_map.c - MAP_SHARED | PROT_WRITE mappings of overlay files (/tmp, the home directory):
 * coherent with read/pread/write/pwrite/ftruncate, written back by msync and munmap, a second
 * overlapping writable mapping refused, and the mapping and the file across snapshots and forks. */
#include "check.h"

#include <sys/stat.h>
#include <sys/uio.h>

static int make_file(const char *path, size_t size) {
    int fd = (int)OK(open(path, O_RDWR | O_CREAT | O_TRUNC, 0600));
    OK(ftruncate(fd, (off_t)size));
    return fd;
}

static char *map_shared(int fd, size_t len, off_t off) {
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off);
    CHECK(p != MAP_FAILED, "mmap: %s", strerror(errno));
    return p;
}

static void check_pread(int fd, off_t off, const char *want) {
    char buf[64] = {0};
    size_t n = strlen(want);
    CHECK_EQ(pread(fd, buf, n, off), (long)n);
    CHECK(!memcmp(buf, want, n), "pread at %ld: \"%.*s\", want \"%s\"", (long)off, (int)n, buf, want);
}

/* Bytes stored through the mapping are what read() and pread() see, without msync. */
static void test_through_mapping(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = make_file("/tmp/shm-a", 3 * PAGE);
    char *p = map_shared(fd, 3 * PAGE, 0);
    memcpy(p + 100, "hello", 5);
    memcpy(p + 2 * PAGE + 7, "page three", 10);
    check_pread(fd, 100, "hello");
    check_pread(fd, 2 * PAGE + 7, "page three");
    char buf[8] = {0};
    OK(lseek(fd, 100, SEEK_SET));
    CHECK_EQ(read(fd, buf, 5), 5);
    CHECK_STR(buf, "hello");
    struct stat st;
    OK(fstat(fd, &st));
    CHECK_EQ(st.st_size, 3 * PAGE); /* the mapping never changes the size */
    /* another open of the file by name, and a private mapping, see them too */
    int fd2 = (int)OK(open("/tmp/shm-a", O_RDONLY));
    check_pread(fd2, 100, "hello");
    char *priv = mmap(NULL, PAGE, PROT_READ, MAP_PRIVATE, fd2, 0);
    CHECK(priv != MAP_FAILED, "private mmap");
    CHECK(!memcmp(priv + 100, "hello", 5), "a private mapping sees the shared mapping's bytes");
    /* a home-directory file works the same */
    int h = make_file("/home/sandbox/shm-h", PAGE);
    char *q = map_shared(h, PAGE, 0);
    strcpy(q, "home");
    check_pread(h, 0, "home");
    OK(munmap(q, PAGE));
    OK(munmap(priv, PAGE));
    OK(munmap(p, 3 * PAGE));
    OK(close(fd2));
    OK(close(fd));
    OK(close(h));
}

/* write() and pwrite() are seen through the mapping at once; a mapping at an offset too. */
static void test_write_then_map(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = make_file("/tmp/shm-b", 4 * PAGE);
    char *p = map_shared(fd, 3 * PAGE, 0);
    char *tail = map_shared(fd, PAGE, 3 * PAGE); /* another range of the file: allowed */
    memcpy(p + 10, "ZZZZZZZZ", 8);
    CHECK_EQ(pwrite(fd, "abc", 3, 12), 3); /* in the middle of what the mapping wrote */
    CHECK(!memcmp(p + 10, "ZZabcZZZ", 8), "mapping after pwrite: %.8s", p + 10);
    check_pread(fd, 10, "ZZabcZZZ");
    OK(lseek(fd, 3 * PAGE + 5, SEEK_SET));
    CHECK_EQ(write(fd, "tail", 4), 4);
    CHECK(!memcmp(tail + 5, "tail", 4), "offset mapping after write");
    struct iovec v[2] = {{"wr", 2}, {"itev", 4}};
    CHECK_EQ(pwritev(fd, v, 2, PAGE), 6);
    CHECK(!memcmp(p + PAGE, "writev", 6), "after pwritev: %.6s", p + PAGE);
    OK(munmap(tail, PAGE));
    OK(munmap(p, 3 * PAGE));
    OK(close(fd));
}

/* msync and munmap write back; the file keeps the bytes after its mappings and descriptors are
 * gone; unmapping the middle of a mapping leaves two working mappings. */
static void test_writeback(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = make_file("/tmp/shm-c", 3 * PAGE);
    char *p = map_shared(fd, 3 * PAGE, 0);
    strcpy(p, "synced");
    OK(msync(p, PAGE, MS_SYNC));
    strcpy(p + PAGE, "middle");
    strcpy(p + 2 * PAGE, "last");
    OK(munmap(p + PAGE, PAGE)); /* the middle: written back, the two ends stay mapped */
    strcpy(p + 2 * PAGE + 8, "after split");
    strcpy(p + 8, "head");
    check_pread(fd, PAGE, "middle");
    check_pread(fd, 2 * PAGE + 8, "after split");
    check_pread(fd, 8, "head");
    OK(munmap(p, PAGE));
    OK(munmap(p + 2 * PAGE, PAGE));
    OK(close(fd));
    fd = (int)OK(open("/tmp/shm-c", O_RDONLY));
    check_pread(fd, 0, "synced");
    check_pread(fd, 2 * PAGE, "last");
    OK(close(fd));
    /* a mapping outlives its descriptor and the file's name */
    fd = make_file("/tmp/shm-d", PAGE);
    int keep = (int)OK(open("/tmp/shm-d", O_RDONLY));
    p = map_shared(fd, PAGE, 0);
    OK(close(fd));
    OK(unlink("/tmp/shm-d"));
    strcpy(p, "unlinked");
    check_pread(keep, 0, "unlinked");
    OK(munmap(p, PAGE));
    check_pread(keep, 0, "unlinked");
    OK(close(keep));
    /* MAP_FIXED over a shared mapping writes it back first */
    fd = make_file("/tmp/shm-e", PAGE);
    p = map_shared(fd, PAGE, 0);
    strcpy(p, "replaced");
    CHECK(mmap(p, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == p, "MAP_FIXED");
    check_pread(fd, 0, "replaced");
    OK(munmap(p, PAGE));
    OK(close(fd));
}

/* ftruncate: growing makes the mapped range past the old end part of the file (zeros); shrinking
 * zeroes the mapping past the new end. */
static void test_truncate(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = make_file("/tmp/shm-f", 100);
    char *p = map_shared(fd, 3 * PAGE, 0);
    strcpy(p, "start");
#ifndef ON_LINUX
    p[2 * PAGE] = 'x'; /* past the end of the file: not kept (Linux raises SIGBUS) */
#endif
    OK(ftruncate(fd, 3 * PAGE));
    CHECK_EQ(p[2 * PAGE], 0);
    check_pread(fd, 0, "start");
    strcpy(p + 2 * PAGE + 1, "grown");
    check_pread(fd, 2 * PAGE + 1, "grown");
    char z[4] = {1, 1, 1, 1};
    CHECK_EQ(pread(fd, z, 4, PAGE), 4);
    CHECK(!z[0] && !z[1] && !z[2] && !z[3], "the grown range reads zeros");
    OK(ftruncate(fd, 3));
    CHECK_EQ(p[2], 'a');
    CHECK_EQ(p[3], 0);
#ifndef ON_LINUX
    CHECK_EQ(p[2 * PAGE + 1], 0); /* (SIGBUS on Linux) */
#endif
    struct stat st;
    OK(fstat(fd, &st));
    CHECK_EQ(st.st_size, 3);
    OK(ftruncate(fd, PAGE));
    p[10] = 'k';
    check_pread(fd, 10, "k");
    OK(munmap(p, 3 * PAGE));
    OK(close(fd));
}

/* A second shared mapping overlapping a writable one could not be kept coherent: refused. */
static void test_overlap(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = make_file("/tmp/shm-g", 4 * PAGE);
    char *p = map_shared(fd, 2 * PAGE, 0);
#ifndef ON_LINUX
    CHECK(mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, PAGE) == MAP_FAILED && errno == EBUSY,
          "an overlapping writable shared mapping: %s", strerror(errno));
    CHECK(mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED && errno == EBUSY,
          "an overlapping read-only shared mapping");
    /* growing or moving a shared mapping is not supported; shrinking is */
    CHECK(mremap(p, 2 * PAGE, 3 * PAGE, MREMAP_MAYMOVE) == MAP_FAILED && errno == EINVAL, "mremap grow");
#endif
    char *q = map_shared(fd, 2 * PAGE, 2 * PAGE); /* the rest of the file: allowed */
    strcpy(p, "one");
    strcpy(q, "two");
    check_pread(fd, 0, "one");
    check_pread(fd, 2 * PAGE, "two");
    /* read-only shared mappings may overlap each other, and stay read-only */
    int ro = (int)OK(open("/tmp/shm-g", O_RDONLY));
    OK(munmap(q, 2 * PAGE));
    char *r1 = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, ro, 2 * PAGE);
    char *r2 = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, ro, 2 * PAGE);
    CHECK(r1 != MAP_FAILED && r2 != MAP_FAILED, "two read-only shared mappings");
    CHECK(!strcmp(r1, "two") && !strcmp(r2, "two"), "read-only mappings see the file");
    CHECK_EQ(pwrite(fd, "TWO", 3, 2 * PAGE), 3);
    CHECK(!strcmp(r1, "TWO") && !strcmp(r2, "TWO"), "read-only mappings see a write");
    CHECK_ERR(mprotect(r1, PAGE, PROT_READ | PROT_WRITE), EACCES);
    /* MAP_FIXED over a shared mapping may map the same range again: the old one goes first */
    char *again = mmap(p, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    CHECK(again == p, "MAP_FIXED over the same shared range: %s", strerror(errno));
    CHECK(!strcmp(p, "one"), "the range mapped again holds the file's bytes");
    strcpy(p + 4, "async");
    OK(msync(p, PAGE, MS_ASYNC));
    check_pread(fd, 4, "async");
    OK(mremap(p, 2 * PAGE, PAGE, 0)); /* shrink in place */
    q = map_shared(fd, PAGE, PAGE);   /* the page given back can be mapped again */
    OK(munmap(q, PAGE));
    OK(munmap(r1, PAGE));
    OK(munmap(r2, PAGE));
    OK(munmap(p, PAGE));
    OK(close(ro));
    OK(close(fd));
}

/* The same writable file range mapped twice in one process (multiprocessing.shared_memory attached
 * by name in a fork child that inherited the block): each mapping sees the other's bytes at once,
 * and each munmap takes back one. In the sandbox the second mmap is the first's pages (the guest's
 * page tables cannot alias two ranges), so what would take those pages from under the other
 * mapping is refused, and the aliases are bounded. */
static void test_alias(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = make_file("/tmp/shm-al", 2 * PAGE);
    char *p = map_shared(fd, 2 * PAGE, 0);
    char *q = map_shared(fd, 2 * PAGE, 0);
    strcpy(p + 10, "via p");
    CHECK(!strcmp(q + 10, "via p"), "the second mapping sees the first's bytes");
    strcpy(q + PAGE, "via q");
    CHECK(!strcmp(p + PAGE, "via q"), "the first mapping sees the second's bytes");
    check_pread(fd, PAGE, "via q");
    int ro = (int)OK(open("/tmp/shm-al", O_RDONLY));
    char *r = mmap(NULL, 2 * PAGE, PROT_READ, MAP_SHARED, ro, 0); /* read-only, same range */
    CHECK(r != MAP_FAILED && !strcmp(r + 10, "via p"), "a read-only mapping of the same range: %s", strerror(errno));
#ifndef ON_LINUX
    CHECK(q == p && r == p, "the aliases are the first mapping's pages");
    CHECK_ERR(munmap(p, PAGE), EBUSY); /* a part of an aliased mapping */
    CHECK_ERR(munmap(p, 3 * PAGE), EBUSY); /* more than it */
    CHECK(mmap(p, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED &&
          errno == EBUSY, "MAP_FIXED over an aliased mapping");
    CHECK(mremap(p, 2 * PAGE, PAGE, 0) == MAP_FAILED && errno == EINVAL, "mremap of an aliased mapping");
    CHECK(mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED && errno == EBUSY,
          "a part of the range is no alias");
    char *more[80];
    int n = 0;
    while (n < 80 && (more[n] = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) != MAP_FAILED) n++;
    CHECK(n == 62 && errno == EBUSY, "64 aliases of one mapping, then EBUSY: %d (%s)", n, strerror(errno));
    for (int i = 0; i < n; i++) OK(munmap(more[i], 2 * PAGE));
#endif
    OK(munmap(q, 2 * PAGE));
    OK(munmap(r, 2 * PAGE));
    CHECK(!strcmp(p + 10, "via p") && !strcmp(p + PAGE, "via q"), "the first mapping stays after the others go");
    strcpy(p + 20, "after");
    check_pread(fd, 20, "after");
    OK(munmap(p, 2 * PAGE));
    q = map_shared(fd, PAGE, PAGE); /* the range is free again: any part of it maps */
    check_pread(fd, 10, "via p");
    CHECK(!strcmp(q, "via q"), "a new mapping of a part sees the file");
    OK(munmap(q, PAGE));
    OK(close(ro));
    OK(close(fd));
}

/* At most 1024 shared mappings per sandbox; a file range that wraps is refused. */
static void test_limits(int argc, char **argv) {
    (void)argc;
    (void)argv;
    enum { MAX = 1024 };
    int fd = make_file("/tmp/shm-l", (MAX + 1) * PAGE);
    static char *maps[MAX];
    for (int i = 0; i < MAX; i++) {
        maps[i] = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)i * PAGE);
        if (maps[i] == MAP_FAILED) { FAIL("mapping %d: %s", i, strerror(errno)); return; }
        maps[i][0] = (char)('a' + i % 26);
    }
#ifndef ON_LINUX
    CHECK(mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)MAX * PAGE) == MAP_FAILED && errno == ENOMEM,
          "mapping 1025: %s", strerror(errno));
    /* unmapping the middle of a mapping needs a new entry: the table is full */
    char *three = mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    OK(munmap(three + PAGE, PAGE)); /* (an anonymous one needs none) */
    OK(munmap(three, PAGE));
    OK(munmap(three + 2 * PAGE, PAGE));
#endif
    char c;
    CHECK_EQ(pread(fd, &c, 1, 700 * PAGE), 1);
    CHECK_EQ(c, 'a' + 700 % 26);
    for (int i = 0; i < MAX; i++) OK(munmap(maps[i], PAGE));
    CHECK_EQ(pread(fd, &c, 1, 1023 * PAGE), 1);
    CHECK_EQ(c, 'a' + 1023 % 26);
    CHECK_ERR(syscall(SYS_mmap, 0, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, -PAGE), EOVERFLOW); /* wraps */
    OK(close(fd));
}

/* Shared mappings of host files (the read-only view) stay refused for writing. */
static void test_host_file(int argc, char **argv) {
    (void)argc;
    int fd = (int)OK(open(argv[0], O_RDONLY));
    CHECK_ERR((long)mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), EACCES);
    char *p = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(p != MAP_FAILED && !memcmp(p, "\177ELF", 4), "a read-only shared mapping of a host file");
    OK(munmap(p, PAGE));
    OK(close(fd));
}

/* The file and its mapping across a snapshot: each fork (and a loaded template) sees both as they
 * were, and they stay coherent in it. */
static void test_snapshot_state(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = make_file("/tmp/shm-s", 2 * PAGE);
    char *p = map_shared(fd, 2 * PAGE, 0);
    strcpy(p, "mapped before");
    CHECK_EQ(pwrite(fd, "written before", 14, PAGE), 14);
    int tty = (int)OK(open("/dev/ttyS0", O_RDWR));
    printf("ready\n");
    fflush(stdout);
    char go[8];
    OK(read(tty, go, sizeof go)); /* the host snapshots here */
    check_pread(fd, 0, "mapped before");
    CHECK(!strcmp(p + PAGE, "written before"), "mapping after the snapshot");
    strcpy(p, "mapped after!");
    check_pread(fd, 0, "mapped after!");
    CHECK_EQ(pwrite(fd, "written after!", 14, PAGE), 14);
    CHECK(!strcmp(p + PAGE, "written after!"), "a write after the snapshot");
#ifndef ON_LINUX
    CHECK(mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED && errno == EBUSY,
          "the table came with the snapshot");
#endif
    OK(munmap(p, 2 * PAGE));
    check_pread(fd, 0, "mapped after!");
    OK(close(fd));
}

static const zb_test tests[] = {
    {"through_mapping", test_through_mapping},
    {"write_then_map", test_write_then_map},
    {"writeback", test_writeback},
    {"truncate", test_truncate},
    {"overlap", test_overlap},
    {"alias", test_alias},
    {"limits", test_limits},
    {"host_file", test_host_file},
    {"snapshot_state", test_snapshot_state},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
