/* vdso.c - the guest's vDSO (the library the guest maps; the host side that places it and fills
 * its data page is native/vdso_page.c): clock_gettime, gettimeofday and time answered at CPL3.
 *
 * Without it half of CPython's syscalls are clock_gettime, each a ~40 us exit here. Time is
 * base + (rdtsc - tsc0) * mult >> 32, from a data page (struct zb_vdso_data, guest_abi.h) the host
 * fills just below this image every time the sandbox starts running, so guest time is always the
 * host's time. glibc only accepts a vDSO with exactly one PT_LOAD (see vdso.ld).
 */
#include <asm/unistd.h>
#include <stdint.h>
#include <sys/time.h>
#include <time.h>

#include "guest_abi.h"

/* The data page is the page below this image's ELF header (the linker's __ehdr_start). */
static inline const volatile struct zb_vdso_data *data(void) {
    uintptr_t image;
    __asm__("lea __ehdr_start(%%rip), %0" : "=r"(image));
    return (const volatile struct zb_vdso_data *)(image - ZB_VDSO_DATA_SIZE);
}

static inline long syscall2(long nr, long a, long b) {
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b) : "rcx", "r11", "memory");
    return ret;
}

/* One of the data page's base times plus the time since the host took it. The host rewrites the
 * page whenever the sandbox resumes, and the guest can be stopped anywhere (a signal, a deadline):
 * a reader stopped between its rdtsc and its use of the page would mix an old TSC reading with new
 * base times and go back in time. So it reads under the page's generation and retries when a
 * rewrite happened in between. */
static inline int64_t now_ns(const volatile int64_t *base) {
    const volatile struct zb_vdso_data *d = data();
    for (;;) {
        uint64_t gen = d->generation;
        uint32_t lo, hi;
        __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi) : : "memory");
        uint64_t ticks = (((uint64_t)hi << 32) | lo) - d->tsc0;
        int64_t ns = *base + (int64_t)(((unsigned __int128)ticks * d->mult) >> 32);
        __asm__ volatile("" : : : "memory");
        if (d->generation == gen) return ns;
    }
}

int __vdso_clock_gettime(clockid_t clock, struct timespec *ts) {
    const volatile int64_t *base;
    if (!data()->mult) return (int)syscall2(__NR_clock_gettime, clock, (long)ts);
    switch (clock) {
    case CLOCK_REALTIME: case CLOCK_REALTIME_COARSE: base = &data()->real_ns; break;
    case CLOCK_MONOTONIC: case CLOCK_MONOTONIC_COARSE: base = &data()->mono_ns; break;
    case CLOCK_MONOTONIC_RAW: base = &data()->raw_ns; break;
    case CLOCK_BOOTTIME: base = &data()->boot_ns; break;
    default: return (int)syscall2(__NR_clock_gettime, clock, (long)ts); /* CPU-time clocks: the host knows */
    }
    int64_t ns = now_ns(base);
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    return 0;
}

int __vdso_gettimeofday(struct timeval *tv, void *tz) {
    if (!data()->mult) return (int)syscall2(__NR_gettimeofday, (long)tv, (long)tz);
    if (tv) {
        int64_t ns = now_ns(&data()->real_ns);
        tv->tv_sec = ns / 1000000000;
        tv->tv_usec = (ns % 1000000000) / 1000;
    }
    if (tz) ((int *)tz)[0] = ((int *)tz)[1] = 0;
    return 0;
}

time_t __vdso_time(time_t *t) {
    time_t s = data()->mult ? (time_t)(now_ns(&data()->real_ns) / 1000000000) : (time_t)syscall2(__NR_time, 0, 0);
    if (t) *t = s;
    return s;
}

long __vdso_getcpu(unsigned *cpu, unsigned *node, void *cache) {
    (void)cache;
    if (cpu) *cpu = 0;
    if (node) *node = 0;
    return 0;
}

int __vdso_clock_getres(clockid_t clock, struct timespec *ts) { return (int)syscall2(__NR_clock_getres, clock, (long)ts); }
