/* syscall_fuzz.c - libFuzzer harness for the syscall layer: zb_syscall_dispatch with random
 * syscall numbers and argument registers, over a sandbox whose guest memory holds fuzzer bytes.
 *
 * No KVM is needed: zb_sandbox_new only builds data (guest memory, page tables, namespace, fd
 * table) and the engine's VM is created on the first run, which never happens here. Each input
 * gets a fresh sandbox with a view (host files, a host symlink pointing out of it), /tmp and the
 * home directory as overlays, identity files, and three notebook folders mounted read-only, as an
 * overlay and read-write; a secret file sits next to them, outside every mount.
 *
 * Input: a count byte, that many records (at most MAX_CALLS) of 1 + 2 + 6 * 9 bytes - a register
 * byte (rsp for signal frames and rt_sigreturn), a syscall number and six arguments, each a
 * selector byte and 8 value bytes - then up to 4 KiB copied to the start of a 64 KiB guest data
 * region (the rest of it holds path strings and zeros).
 * Selectors turn values into what hostile programs pass: raw values, pointers into the data
 * region or to its last bytes (the next page is unmapped), path strings, small and negative
 * integers, powers of two, and edge addresses (NULL, the low 2 MiB, the kernel half, past the end
 * of guest memory).
 *
 * After each call the harness does what the run loop would (delivers pending signals onto the
 * guest's stack, hands out a finished UART frame, drops a pause) and checks invariants: the
 * result is a Linux return value, the overlay accounting stays within its limit, and after each
 * input nothing outside the mounts changed and the read-write folder only holds what the guest
 * made there (it is emptied again before the next input, so inputs reproduce).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"
#include "memory.h"
#include "vm.h"
#include "dev.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "linux.h"
#include "guest_abi.h"

#define MEM (64ul << 20)
#define DATA 0x400000ul
#define DATA_SIZE (64ul << 10)
#define STACK_TOP (MEM - 16 * ZB_PAGE) /* a small "stack" region at the top of guest memory */
#define MAX_CALLS 24
#define RECORD (1 + 2 + 6 * 9)

#define CHECK(cond)                                                                                      \
    do {                                                                                                 \
        if (!(cond)) {                                                                                   \
            fprintf(stderr, "syscall_fuzz: invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);   \
            abort();                                                                                     \
        }                                                                                                \
    } while (0)

static zb_engine engine;
static char root[PATH_MAX], view[PATH_MAX], outside[PATH_MAX], proj_ro[PATH_MAX], proj_ov[PATH_MAX], proj_rw[PATH_MAX];
static const char *paths[48] = {
    "/etc/shadow", "/etc/passwd", "/tmp", "/tmp/f", "/tmp/d/g", "/tmp/l", "..", "../../../../..", ".", "",
    "/dev/ttyS0", "/dev/null", "/dev/zero", "/dev/urandom", "/proc/self/exe", "/proc/self/exe/..",
    "f", "d", "l", "x/../..", "/", "//tmp///f/", "/home/sandbox", NULL /* view paths, filled in */,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
};
static size_t npaths;
static uint64_t path_at[64];

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, text, strlen(text)) < 0) { perror(path); abort(); }
    close(fd);
}

/* a/b in one of a few rotating static buffers (set-up code uses several at once) */
static const char *join(const char *a, const char *b) {
    static char bufs[8][PATH_MAX];
    static int next;
    char *s = bufs[next++ % 8];
    snprintf(s, PATH_MAX, "%s/%s", a, b);
    return s;
}

static const char *keep(const char *s) { return strdup(s); } /* for the path table: lives forever */

static void add_path(const char *p) { paths[npaths++] = p; }

static void remove_root(void);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    engine.kvm_fd = -1;
    engine.xsave_size = 4096;
    engine.xcr0 = 7;
    snprintf(root, sizeof root, "%s/zb-syscall-fuzz-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(root)) { perror("mkdtemp"); abort(); }
    snprintf(view, sizeof view, "%s/view", root);
    snprintf(outside, sizeof outside, "%s/outside", root);
    snprintf(proj_ro, sizeof proj_ro, "%s/proj_ro", root);
    snprintf(proj_ov, sizeof proj_ov, "%s/proj_ov", root);
    snprintf(proj_rw, sizeof proj_rw, "%s/proj_rw", root);
    const char *dirs[] = {view, outside, proj_ro, proj_ov, proj_rw};
    for (int i = 0; i < 5; i++) mkdir(dirs[i], 0755);
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/sub", view); mkdir(p, 0755);
    write_file(join(view, "a.txt"), "view file a\n");
    write_file(join(view, "sub/b.txt"), "view file b\n");
    write_file(join(outside, "secret.txt"), "SECRET\n");
    symlink("../outside/secret.txt", join(view, "up"));
    symlink("a.txt", join(view, "link"));
    for (int i = 2; i < 4; i++) {
        write_file(join(dirs[i], "data.csv"), "a,b\n1,2\n");
        mkdir(join(dirs[i], "sub"), 0755);
        symlink("../outside", join(dirs[i], "out"));
    }
    for (npaths = 0; paths[npaths]; npaths++) {}
    add_path(keep(join(view, "a.txt")));
    add_path(keep(join(view, "up")));
    add_path(keep(join(view, "sub/../../outside/secret.txt")));
    add_path(keep(join(proj_ro, "data.csv")));
    add_path(keep(join(proj_ov, "data.csv")));
    add_path(keep(join(proj_ov, "out/secret.txt")));
    add_path(keep(join(proj_rw, "new.txt")));
    add_path(keep(join(proj_rw, "sub/n")));
    add_path(keep(join(proj_rw, "out/x")));
    add_path(proj_rw);
    fprintf(stderr, "syscall_fuzz: host files under %s\n", root);
    atexit(remove_root);
    return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    if (ftw->level > 0) remove(path);
    return 0;
}

static int rm_all(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* At a normal exit the host files go (after a crash they stay, for the report). */
static void remove_root(void) { nftw(root, rm_all, 16, FTW_DEPTH | FTW_PHYS); }

/* The read-write folder starts each input as it was made in LLVMFuzzerInitialize. */
static void reset_rw(void) {
    nftw(proj_rw, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    write_file(join(proj_rw, "data.csv"), "a,b\n1,2\n");
    mkdir(join(proj_rw, "sub"), 0755);
    symlink("../outside", join(proj_rw, "out"));
}

static void check_outside(void) {
    DIR *d = opendir(outside);
    CHECK(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) { n++; CHECK(!strcmp(e->d_name, "secret.txt")); }
    closedir(d);
    CHECK(n == 1);
    char buf[64] = "";
    int fd = open(join(outside, "secret.txt"), O_RDONLY);
    CHECK(fd >= 0 && read(fd, buf, sizeof buf) == 7 && !memcmp(buf, "SECRET\n", 7));
    close(fd);
    /* nothing new next to the mounts either */
    d = opendir(root);
    n = 0;
    while ((e = readdir(d))) n += e->d_name[0] != '.';
    closedir(d);
    CHECK(n == 5);
}

static uint64_t u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static uint64_t argument(uint8_t sel, uint64_t v) {
    static const uint64_t special[] = {0, 1, 0x1000, ZB_STUBS_GPA, 0x1ffff8, ZB_LOW_REGION, 0xffff888000000000ull,
                                       ZB_SYSCALL_TRAP, 0x8000000000000000ull, MEM, MEM - 1, MEM - 8,
                                       STACK_TOP, STACK_TOP - 8, (uint64_t)-1, (uint64_t)-100 /* AT_FDCWD */,
                                       DATA + DATA_SIZE, DATA - 1, 0x7ffffffff000ull, 1ull << 40};
    switch (sel % 10) {
    case 0: return v;
    case 1: return DATA + v % DATA_SIZE;
    case 2: return special[v % (sizeof special / sizeof *special)];
    case 3: return v % 16;                                /* fds, flags, small counts */
    case 4: return DATA + DATA_SIZE - 1 - v % 64;         /* the last bytes before the unmapped page */
    case 5: return path_at[v % npaths];
    case 6: return (uint64_t)-(int64_t)(v % 128);          /* -1, -EINTR-like, AT_FDCWD-like */
    case 7: return 1ull << (v % 64);
    case 8: return v & 0xffffffff;
    default: return DATA + (v % 64) * 64;                  /* aligned structures in the data region */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[ZB_ERRLEN];
    reset_rw();
    zb_sandbox *sb = zb_sandbox_new(&engine, MEM, err);
    CHECK(sb);
    CHECK(zb_sandbox_view_add(sb, view, err) == 0);
    CHECK(zb_sandbox_overlay_dir(sb, "/tmp", err) == 0);
    CHECK(zb_sandbox_overlay_dir(sb, "/home/sandbox", err) == 0);
    CHECK(zb_sandbox_put_file(sb, "/etc/passwd", "sandbox:x:1000:1000::/home/sandbox:/bin/sh\n", 43, err) == 0);
    CHECK(zb_sandbox_mount_project(sb, proj_ro, ZB_PROJECT_READONLY, err) == 0);
    CHECK(zb_sandbox_mount_project(sb, proj_ov, ZB_PROJECT_OVERLAY, err) == 0);
    CHECK(zb_sandbox_mount_project(sb, proj_rw, ZB_PROJECT_READWRITE, err) == 0);
    zb_sandbox_set_overlay_limit(sb, 8 << 20);
    CHECK(zb_sandbox_chdir(sb, "/tmp", err) == 0);
    snprintf(sb->proc.exe, sizeof sb->proc.exe, "%s/a.txt", view);
    zb_memory *m = &sb->mem;
    zb_mem_mark(m, DATA, DATA_SIZE, 1);
    zb_region_add(m, DATA, DATA + DATA_SIZE, 3, "[data]");
    zb_mem_mark(m, STACK_TOP - 8 * ZB_PAGE, 8 * ZB_PAGE, 1);
    zb_region_add(m, STACK_TOP - 8 * ZB_PAGE, STACK_TOP, 3, "[stack]");
    m->brk_start = m->brk_end = DATA + DATA_SIZE + ZB_PAGE;
    m->mmap_top = STACK_TOP - 16 * ZB_PAGE;
    size_t ncalls = size ? ZB_MIN((size_t)data[0] % (MAX_CALLS + 1), (size - 1) / RECORD) : 0;
    const uint8_t *records = data + 1, *rest = records + ncalls * RECORD;
    size_t rest_len = size ? size - 1 - ncalls * RECORD : 0;
    memcpy(m->host + DATA, rest, ZB_MIN(rest_len, (size_t)4096));
    uint64_t at = DATA + 8192;
    for (size_t i = 0; i < npaths; i++) {
        size_t len = strlen(paths[i]) + 1;
        memcpy(m->host + at, paths[i], len);
        path_at[i] = at;
        at += len;
    }
    zb_run_deadline_ns = 1; /* a sleeping call pauses at once instead of sleeping */

    /* clones of the file state, as snapshots keep them: the sandbox then changes state it shares
     * copy-on-write with them (overlay chunks, directory tables, names, streams, paths, listings) */
    enum { KEPT = 4 };
    zb_fs *kept_fs[KEPT] = {0};
    zb_fdtable *kept_fds[KEPT] = {0};
    size_t nkept = 0;
    const uint8_t *p = records;
    for (size_t n = 0; n < ncalls && !sb->finished; n++, p += RECORD) {
        if (p[2] & 0x80) {
            size_t k = nkept++ % KEPT;
            zb_fdtable_free(kept_fds[k], kept_fs[k]);
            zb_fs_free(kept_fs[k]);
            kept_fs[k] = zb_fs_clone(sb->fs);
            kept_fds[k] = kept_fs[k] ? zb_fdtable_clone(sb->fds) : NULL;
        }
        sb->cpu.regs.rsp = argument(p[0], u64(p + 3 + 1)) & ~7ull;
        uint64_t nr = (p[1] | (uint64_t)p[2] << 8) % 448, a[6];
        for (int k = 0; k < 6; k++) a[k] = argument(p[3 + 9 * k], u64(p + 3 + 9 * k + 1));
        sb->has_stop = 0;
        sb->stop_retry = 0;
        long ret = zb_syscall_dispatch(sb, nr, a);
        CHECK(ret == ZB_SYSCALL_STOP || ret == ZB_SYSCALL_BLOCK || ret >= -4095);
        if (ret == ZB_SYSCALL_BLOCK) { /* it waits for another thread or process (a fork made one): the run
                                        * loop would switch; here the same thread simply goes on */
            zb_thread *t = &sb->threads.t[sb->threads.current];
            t->state = ZB_THREAD_RUNNABLE;
            t->wake_ns = INT64_MAX;
            sb->threads.switch_request = 0;
        }
        CHECK(sb->fs->bytes_used <= sb->fs->bytes_limit);
        CHECK(m->pages_allocated <= m->pages_limit);
        /* what the run loop does after a call */
        sb->cpu.pending_syscall = 0;
        sb->cpu.pending_wake_ns = 0;
        sb->has_stop = 0;
        if (sb->uart.frame_ready) zb_uart_consume_frame(&sb->uart);
        int killed_by = 0;
        for (int s = 0; s < 4 && (sb->sig.pending & ~sb->sig.blocked); s++)
            if (zb_signal_deliver(sb, &killed_by)) break;
        sb->sig.pending = 0;
    }
    zb_run_deadline_ns = 0;
    for (size_t k = 0; k < KEPT; k++) {
        zb_fdtable_free(kept_fds[k], kept_fs[k]);
        zb_fs_free(kept_fs[k]);
    }
    zb_sandbox_free(sb);
    check_outside();
    return 0;
}
