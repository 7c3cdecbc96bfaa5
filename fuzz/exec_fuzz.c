/* exec_fuzz.c - libFuzzer harness for execve (sys_exec.c, elf_loader.c): the program and its
 * loader are fuzzer bytes, so the ELF checks, the #! parser and the image layout see every
 * malformed header, segment table, PT_INTERP and interpreter line.
 *
 * No KVM is needed (as in syscall_fuzz.c): each input gets a fresh sandbox of 64 MiB with /tmp as
 * an overlay and a small "old program" (a data region and a stack) in guest memory.
 * Input: a mode byte, a 2-byte length N, N bytes written to /tmp/prog (mode 0755), the rest to
 * /tmp/interp (mode 0755), which PT_INTERP or `#!` lines may name. Mode bit 0: execveat of an
 * open fd of /tmp/prog with AT_EMPTY_PATH instead of execve("/tmp/prog").
 *
 * Invariants: the result is 0 or one of the errors execve gives; an error leaves the caller as it
 * was (its memory, regions, program name); a success lays out a sane image (the entry and the
 * stack pointer in allocated guest memory, every region inside guest memory, the page count
 * within its limit) or, when it failed past the point of no return, leaves SIGSEGV pending.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>

#include "util.h"
#include "memory.h"
#include "vm.h"
#include "dev.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "linux.h"

#include <sys/syscall.h>

#define MEM (64ul << 20)
#define DATA 0x400000ul
#define DATA_SIZE (64ul << 10)
#define STACK_TOP (MEM - 16 * ZB_PAGE)

#define CHECK(cond)                                                                                    \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            fprintf(stderr, "exec_fuzz: invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);    \
            abort();                                                                                   \
        }                                                                                              \
    } while (0)

static zb_engine engine;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    engine.kvm_fd = -1;
    engine.xsave_size = 4096;
    engine.xcr0 = 7;
    return 0;
}

static void put_file(zb_sandbox *sb, const char *path, const uint8_t *data, size_t len) {
    zb_resolved r;
    CHECK(zb_fs_resolve(sb, "/", path, 0, &r) == 0 && !r.exists && r.parent.kind == LOC_OVERLAY);
    uint32_t ino = zb_ovl_new_inode(sb->fs, INO_FILE, 0755);
    CHECK(ino && zb_ovl_link(sb->fs, r.parent.ino, r.name, ino) == 0);
    CHECK(zb_ovl_write(sb->fs, ino, data, len, 0) == (long)len);
}

static int execve_error(long ret) {
    static const int known[] = {ENOEXEC, ELIBBAD, ENOMEM, EACCES, ENOENT, ELOOP, E2BIG, EFAULT, EIO,
                                ENAMETOOLONG, ENOTDIR, EBADF, EINVAL};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (ret == -known[i]) return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    char err[ZB_ERRLEN];
    zb_sandbox *sb = zb_sandbox_new(&engine, MEM, err);
    CHECK(sb);
    CHECK(zb_sandbox_overlay_dir(sb, "/tmp", err) == 0);
    CHECK(zb_sandbox_chdir(sb, "/tmp", err) == 0);
    size_t n = ZB_MIN((size_t)(data[1] | data[2] << 8), size - 3);
    put_file(sb, "/tmp/prog", data + 3, n);
    put_file(sb, "/tmp/interp", data + 3 + n, size - 3 - n);
    snprintf(sb->proc.exe, sizeof sb->proc.exe, "/old/program");
    snprintf(sb->proc.comm, sizeof sb->proc.comm, "old");

    /* the old program: data (strings and the vectors) and a stack */
    zb_memory *m = &sb->mem;
    zb_mem_mark(m, DATA, DATA_SIZE, 1);
    zb_region_add(m, DATA, DATA + DATA_SIZE, 3, "[data]");
    zb_mem_mark(m, STACK_TOP - 8 * ZB_PAGE, 8 * ZB_PAGE, 1);
    zb_region_add(m, STACK_TOP - 8 * ZB_PAGE, STACK_TOP, 3, "[stack]");
    m->brk_start = m->brk_end = DATA + DATA_SIZE + ZB_PAGE;
    m->mmap_top = STACK_TOP - 16 * ZB_PAGE;
    uint8_t *d = m->host + DATA;
    memcpy(d + 0, "/tmp/prog", 10);
    memcpy(d + 16, "prog", 5);
    memcpy(d + 24, "x", 2);
    memcpy(d + 32, "A=1", 4);
    uint64_t vec[] = {DATA + 16, DATA + 24, 0, DATA + 32, 0};
    memcpy(d + 64, vec, sizeof vec);
    memcpy(d + 128, "", 1);
    uint8_t *before = malloc(DATA_SIZE);
    CHECK(before);
    memcpy(before, d, DATA_SIZE);
    uint64_t pages = m->pages_allocated;
    size_t nregions = m->nregions;

    long ret;
    if (data[0] & 1) {
        const uint64_t o[6] = {DATA, O_RDONLY, 0, 0, 0, 0};
        long fd = zb_syscall_dispatch(sb, SYS_open, o);
        CHECK(fd >= 0);
        memcpy(before, d, DATA_SIZE);
        pages = m->pages_allocated;
        const uint64_t a[6] = {(uint64_t)fd, DATA + 128, DATA + 64, DATA + 64 + 24, AT_EMPTY_PATH, 0};
        ret = zb_syscall_dispatch(sb, SYS_execveat, a);
    } else {
        const uint64_t a[6] = {DATA, DATA + 64, DATA + 64 + 24, 0, 0, 0};
        ret = zb_syscall_dispatch(sb, SYS_execve, a);
    }
    CHECK(ret == 0 || execve_error(ret));
    if (ret < 0) { /* the caller goes on as it was */
        CHECK(m->pages_allocated == pages && m->nregions == nregions);
        CHECK(!memcmp(before, d, DATA_SIZE));
        CHECK(!strcmp(sb->proc.exe, "/old/program") && !strcmp(sb->proc.comm, "old"));
    } else if (!(sb->sig.pending & ZB_SIG_BIT(SIGSEGV))) { /* a new image */
        CHECK(m->pages_allocated <= m->pages_limit);
        CHECK(zb_mem_range_allocated(m, sb->cpu.regs.rip, 1));
        CHECK(sb->cpu.regs.rsp >= MEM - ZB_STACK_SIZE && sb->cpu.regs.rsp < MEM && !(sb->cpu.regs.rsp & 15));
        for (size_t i = 0; i < m->nregions; i++)
            CHECK(m->regions[i].start >= ZB_LOW_REGION && m->regions[i].end <= MEM && m->regions[i].start < m->regions[i].end);
        CHECK(!strcmp(sb->proc.exe, "/tmp/prog") || !strcmp(sb->proc.exe, "/tmp/interp"));
    }
    free(before);
    zb_sandbox_free(sb);
    return 0;
}
