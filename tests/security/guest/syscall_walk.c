/* syscall_walk.c - every syscall number 0..511 with adversarial arguments.
 *
 *   syscall_walk FIRST LAST START_NR START_INDEX
 *
 * For each number in [FIRST, LAST] it makes CALLS_PER_NR calls: first one per pattern with every
 * argument equal to that pattern, then seeded random mixes of patterns. The patterns are what a
 * hostile program passes: NULL, -1 and other edge integers, addresses in the supervisor-only low
 * 2 MiB, in the kernel half and non-canonical, huge lengths, pointers to the last bytes of mapped
 * memory (the next page is unmapped), pointers into a scratch buffer whose contents are garbage,
 * self-referencing structures (iovecs, pollfds, timespecs that point into the buffer they live
 * in), overlapping in/out buffers (the same pointer for several arguments), path strings and the
 * guest's own interesting fds (a /tmp file, a directory, /dev/ttyS0, a pipe).
 *
 * Before each call it writes "AT nr index" to stdout, so when a call ends the guest (exit, a
 * signal it sent itself, a garbage UART frame, a forged sigreturn frame...) the host knows which
 * one did and restarts the walk after it. After each call it repairs what the call may have
 * changed in its own process (TLS base, signal mask and handler, stdout) so the walk goes on.
 * Calls that would block forever (pause, futex, poll without timeout...) are ended by the host
 * with a signal (EINTR). It prints "DONE" at the end.
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <signal.h>
#include <sys/uio.h>

#define PAGE 4096ul
#define CALLS_PER_NR 72
#define SCRATCH_SIZE (64 * 1024)
#define CONSOLE_BACKUP 900

static uint8_t *scratch;   /* SCRATCH_SIZE bytes, then one unmapped page */
static uint64_t fs_base, mem_top;
static uint64_t rng;

static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void on_usr1(int sig) { (void)sig; }

static void say(const char *s) {
    size_t n = strlen(s);
    if (syscall(SYS_write, 1, s, n) != (long)n) {
        /* stdout is gone or replaced: take the backup console, or give up (the host restarts) */
        if (syscall(SYS_dup2, CONSOLE_BACKUP, 1) != 1 || syscall(SYS_write, 1, s, n) != (long)n) syscall(SYS_exit_group, 42);
    }
}

/* Repair the walker's own process after a call that may have changed it. */
static void repair(void) {
    syscall(SYS_arch_prctl, ARCH_SET_FS, fs_base);
    uint64_t none = 0;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    syscall(SYS_sigaltstack, NULL, NULL);
    struct { uint64_t sp; int32_t flags, pad; uint64_t size; } off = {0, SS_DISABLE, 0, 0};
    syscall(SYS_sigaltstack, &off, NULL);
    if (syscall(SYS_fcntl, CONSOLE_BACKUP, F_GETFD) < 0) syscall(SYS_dup3, 2, CONSOLE_BACKUP, 0);
    /* the scratch buffer must be there, with its unmapped guard page after it */
    void *p = mmap(scratch, SCRATCH_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p != scratch) syscall(SYS_exit_group, 43);
    munmap(scratch + SCRATCH_SIZE, PAGE);
}

/* Fill the scratch buffer for one call: zeros, 0xff, ASCII, random bytes, or structures that
 * point back into the buffer (iovec/pollfd/timespec shaped), plus some path strings. */
static void fill_scratch(unsigned mode) {
    uint64_t *w = (uint64_t *)scratch;
    switch (mode % 5) {
    case 0: memset(scratch, 0, SCRATCH_SIZE); break;
    case 1: memset(scratch, 0xff, SCRATCH_SIZE); break;
    case 2: memset(scratch, 'A', SCRATCH_SIZE); break;
    case 3: for (size_t i = 0; i < SCRATCH_SIZE / 8; i++) w[i] = next_rand(); break;
    case 4:
        for (size_t i = 0; i < SCRATCH_SIZE / 8; i += 2) {
            w[i] = (uint64_t)scratch + (next_rand() % SCRATCH_SIZE); /* a pointer into the buffer */
            w[i + 1] = next_rand() % 3 ? next_rand() % 512 : next_rand();  /* a length, mostly small */
        }
        break;
    }
    strcpy((char *)scratch + 4096, "/etc/shadow");
    strcpy((char *)scratch + 4200, "../../../../../../../etc/passwd");
    strcpy((char *)scratch + 4300, "/dev/ttyS0");
    strcpy((char *)scratch + 4400, "/tmp/walk");
    strcpy((char *)scratch + 4500, "/proc/self/exe");
    scratch[4600] = 0;
    memset(scratch + SCRATCH_SIZE - 8, '/', 8); /* a string with no end before the guard page */
}

static uint64_t patterns[64];
static int npatterns;

static void add(uint64_t v) { patterns[npatterns++] = v; }

static void setup_patterns(void) {
    add(0); add(1); add(2); add(3); add((uint64_t)-1); add((uint64_t)-100 /* AT_FDCWD */);
    add(0x7fffffff); add(0x80000000); add(0xffffffff); add(1ull << 62); add(1ull << 63); add(0x7fffffffffffffffull);
    add(0x1000); add(0x8000); add(0x1ffff8);                        /* page tables, CPL0 stubs, low region's end */
    add(0xffff888000000000ull); add(0x7f0000000000ull); add(0x8000000000000000ull + 0x1000);
    add(0x7ffffffff000ull); add(mem_top); add(mem_top - 1);          /* past the end of guest memory */
    add((uint64_t)scratch); add((uint64_t)scratch + 1); add((uint64_t)scratch + 4096);
    add((uint64_t)scratch + 4200); add((uint64_t)scratch + 4300); add((uint64_t)scratch + 4500);
    add((uint64_t)scratch + 4600);                                   /* an empty string */
    add((uint64_t)scratch + SCRATCH_SIZE - 1); add((uint64_t)scratch + SCRATCH_SIZE - 8);
    add((uint64_t)scratch + SCRATCH_SIZE);                           /* the first unmapped byte */
    add(4); add(5); add(6); add(7); add(1023); add(1024); add(4096); add(SCRATCH_SIZE); add(1ull << 40);
}

static int protected_fd(uint64_t fd) { return (int)fd == 1 || (int)fd == CONSOLE_BACKUP; }

/* The walk must keep a console: calls that would close or replace fd 1 and its backup get another
 * fd instead (the rest of their arguments are unchanged). */
static void spare_console(long nr, uint64_t a[6]) {
    switch (nr) {
    case SYS_close: if (protected_fd(a[0])) a[0] = 999; break;
    case SYS_dup2: case SYS_dup3: if (protected_fd(a[1])) a[1] = 999; break;
    case SYS_close_range: if (a[0] <= CONSOLE_BACKUP) a[0] = CONSOLE_BACKUP + 1; break;
    }
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    long first = strtol(argv[1], NULL, 0), last = strtol(argv[2], NULL, 0);
    long start_nr = strtol(argv[3], NULL, 0), start_i = strtol(argv[4], NULL, 0);
    syscall(SYS_arch_prctl, ARCH_GET_FS, &fs_base);
    mem_top = strtoull(getenv("ZB_MEM_TOP") ? getenv("ZB_MEM_TOP") : "0x10000000", NULL, 0);
    scratch = mmap(NULL, SCRATCH_SIZE + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (scratch == MAP_FAILED) return 2;
    dup2(1, CONSOLE_BACKUP);
    /* interesting fds at 3-7: a /tmp file, a directory, the UART, a pipe */
    int f3 = open("/tmp/walk", O_RDWR | O_CREAT, 0644);
    int f4 = open("/tmp", O_RDONLY | O_DIRECTORY);
    int f5 = open("/dev/ttyS0", O_RDWR);
    int pp[2];
    if (f3 != 3 || f4 != 4 || f5 != 5 || pipe(pp) < 0 || pp[0] != 6) return 2;
    write(f3, "walker data\n", 12);
    setup_patterns();
    repair();
    char line[64];
    for (long nr = first; nr <= last; nr++) {
        if (nr < start_nr) continue;
        for (long i = nr == start_nr ? start_i : 0; i < CALLS_PER_NR; i++) {
            rng = 0x9e3779b97f4a7c15ull ^ ((uint64_t)nr << 20) ^ (uint64_t)i;
            next_rand();
            uint64_t a[6];
            if (i < npatterns && i < CALLS_PER_NR / 2) {
                for (int k = 0; k < 6; k++) a[k] = patterns[i];
            } else {
                uint64_t shared = patterns[next_rand() % npatterns]; /* overlapping buffers */
                for (int k = 0; k < 6; k++) a[k] = next_rand() % 4 == 0 ? shared : patterns[next_rand() % npatterns];
            }
            spare_console(nr, a);
            fill_scratch((unsigned)(nr + i));
            snprintf(line, sizeof line, "AT %ld %ld\n", nr, i);
            say(line);
            syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
            repair();
        }
    }
    say("DONE\n");
    return 0;
}
