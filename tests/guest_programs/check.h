/* check.h - the tiny test harness shared by the guest programs in tests/guest_programs/.
 *
 * Each program is a static binary holding several named tests; `prog NAME [ARGS...]` runs one.
 * A test reports every failed check on stderr and the program exits 1 if any failed, else it
 * prints "PASS NAME" on stdout and exits 0. The checks call the raw syscall() wherever glibc
 * would add behaviour of its own (the vDSO, argument checks, retries), so that what is tested is
 * the engine's answer.
 */
#ifndef ZB_GUEST_CHECK_H
#define ZB_GUEST_CHECK_H
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static int zb_failures;

#define FAIL(...)                                                         \
    do {                                                                  \
        zb_failures++;                                                    \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);              \
        fprintf(stderr, __VA_ARGS__);                                     \
        fputc('\n', stderr);                                              \
    } while (0)

/* CHECK(cond, fmt, ...): report when cond is false. */
#define CHECK(cond, fmt, ...)                                             \
    do {                                                                  \
        if (!(cond)) FAIL("%s: " fmt, #cond, ##__VA_ARGS__);              \
    } while (0)
#define CHECKM(cond) CHECK(cond, "%s", #cond)

/* CHECK_ERR(expr, E): expr must fail (-1) with errno E. */
#define CHECK_ERR(expr, want)                                                              \
    do {                                                                                   \
        errno = 0;                                                                         \
        long r_ = (long)(expr);                                                            \
        int e_ = errno;                                                                    \
        if (!(r_ == -1 && e_ == (want)))                                                   \
            FAIL("%s = %ld (errno %d %s), want -1 with %s", #expr, r_, e_, strerrorname_np(e_) ? strerrorname_np(e_) : "0", #want); \
    } while (0)

/* OK(expr): expr must not fail (>= 0); evaluates to its value. */
#define OK(expr)                                                                           \
    ({                                                                                     \
        errno = 0;                                                                         \
        long r_ = (long)(expr);                                                            \
        if (r_ < 0) FAIL("%s = %ld (errno %d %s)", #expr, r_, errno, strerrorname_np(errno) ? strerrorname_np(errno) : "0"); \
        r_;                                                                                \
    })

#define CHECK_EQ(a, b)                                                                     \
    do {                                                                                   \
        long long a_ = (long long)(a), b_ = (long long)(b);                                \
        if (a_ != b_) FAIL("%s == %s: %lld != %lld (0x%llx != 0x%llx)", #a, #b, a_, b_, a_, b_); \
    } while (0)

#define CHECK_STR(a, b)                                                                    \
    do {                                                                                   \
        const char *a_ = (a), *b_ = (b);                                                   \
        if (strcmp(a_, b_)) FAIL("%s == %s: \"%s\" != \"%s\"", #a, #b, a_, b_);            \
    } while (0)

typedef struct {
    const char *name;
    void (*fn)(int argc, char **argv); /* argv[0] is the program, argv[1] the test name */
} zb_test;

#define PAGE 4096ul

static int zb_run(const zb_test *tests, int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s TEST [ARGS...]\n", argv[0]);
        return 2;
    }
    for (const zb_test *t = tests; t->name; t++) {
        if (strcmp(t->name, argv[1])) continue;
        t->fn(argc, argv);
        if (zb_failures) {
            fprintf(stderr, "%s: %d check(s) failed\n", t->name, zb_failures);
            return 1;
        }
        printf("PASS %s\n", t->name);
        return 0;
    }
    fprintf(stderr, "no test named %s\n", argv[1]);
    return 2;
}

/* 1 if [addr, addr+len) is guest memory the engine lets a syscall read: write() it to a pipe. */
static __attribute__((unused)) int readable(const void *addr, size_t len) {
    int p[2];
    if (pipe2(p, O_NONBLOCK) < 0) return -1;
    long r = syscall(SYS_write, p[1], addr, len);
    int e = errno;
    close(p[0]);
    close(p[1]);
    return r == (long)len ? 1 : (r == -1 && e == EFAULT) ? 0 : -1;
}

#endif
