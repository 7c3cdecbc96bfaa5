/* elf_loader.c - loading a Linux x86-64 ELF program into a fresh sandbox, like execve does:
 * its PT_LOAD segments, its PT_INTERP loader (ld-linux) for dynamic programs, the vDSO, and the
 * initial stack with argc/argv/envp/auxv.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "dev.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "linux.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_PHDRS 64
#define MAX_ARGS 4096

typedef struct loaded {
    uint64_t base, entry, phdr, phnum, phent, hi;
    char interp[PATH_MAX];
} loaded_t;

/* Resolve a guest path to a host file we can read (programs live in the read-only view). */
static int open_program(zb_sandbox *sb, const char *path, char *canonical, char *err) {
    zb_resolved r;
    int rc = zb_fs_resolve(sb, sb->proc.cwd[0] ? sb->proc.cwd : "/", path, 0, &r);
    if (rc < 0 || !r.exists) { zb_seterr(err, "%s: not found in the guest's view: %s", path, strerror(rc < 0 ? -rc : ENOENT)); return -1; }
    if (r.loc.kind != LOC_HOST || r.loc.is_dir) { zb_seterr(err, "%s: not a regular file from the host view", path); return -1; }
    int fd = zb_host_open_ro(r.path, 0);
    if (fd < 0) { zb_seterr(err, "%s: %s", r.path, strerror(-fd)); return -1; }
    if (canonical) snprintf(canonical, PATH_MAX, "%s", r.path);
    return fd;
}

static int read_exact(int fd, void *buf, size_t len, uint64_t off) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (n <= 0) return -1;
        done += n;
    }
    return 0;
}

static int load_elf(zb_sandbox *sb, const char *path, int is_interp, loaded_t *out, char *canonical, char *err) {
    memset(out, 0, sizeof *out);
    int fd = open_program(sb, path, canonical, err);
    if (fd < 0) return -1;
    int ret = -1;
    Elf64_Ehdr eh;
    Elf64_Phdr ph[MAX_PHDRS];
    if (read_exact(fd, &eh, sizeof eh, 0) < 0 || memcmp(eh.e_ident, ELFMAG, SELFMAG) || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_machine != EM_X86_64 || (eh.e_type != ET_EXEC && eh.e_type != ET_DYN)) {
        zb_seterr(err, "%s: not an x86-64 ELF executable", path);
        goto out;
    }
    if (eh.e_phnum == 0 || eh.e_phnum > MAX_PHDRS || eh.e_phentsize != sizeof(Elf64_Phdr) ||
        read_exact(fd, ph, eh.e_phnum * sizeof *ph, eh.e_phoff) < 0) {
        zb_seterr(err, "%s: bad program headers", path);
        goto out;
    }
    uint64_t lo = UINT64_MAX, hi = 0, phdr_vaddr = 0;
    for (int i = 0; i < eh.e_phnum; i++) {
        const Elf64_Phdr *p = &ph[i];
        if (p->p_type == PT_LOAD) {
            if (p->p_filesz > p->p_memsz || p->p_vaddr + p->p_memsz < p->p_vaddr ||
                (p->p_vaddr % ZB_PAGE) != (p->p_offset % ZB_PAGE)) {
                zb_seterr(err, "%s: malformed PT_LOAD segment", path);
                goto out;
            }
            lo = ZB_MIN(lo, ZB_PAGE_DOWN(p->p_vaddr));
            hi = ZB_MAX(hi, ZB_PAGE_UP(p->p_vaddr + p->p_memsz));
            if (!phdr_vaddr && eh.e_phoff >= p->p_offset && eh.e_phoff < p->p_offset + p->p_filesz)
                phdr_vaddr = p->p_vaddr + (eh.e_phoff - p->p_offset);
        } else if (p->p_type == PT_PHDR) {
            phdr_vaddr = p->p_vaddr;
        } else if (p->p_type == PT_INTERP && !is_interp) {
            if (p->p_filesz == 0 || p->p_filesz >= PATH_MAX || read_exact(fd, out->interp, p->p_filesz, p->p_offset) < 0) {
                zb_seterr(err, "%s: bad PT_INTERP", path);
                goto out;
            }
            out->interp[p->p_filesz] = 0;
        }
    }
    if (hi <= lo) { zb_seterr(err, "%s: no loadable segments", path); goto out; }
    uint64_t base = 0;
    if (eh.e_type == ET_DYN) {
        uint64_t at = is_interp ? zb_mem_alloc(&sb->mem, hi - lo) : ZB_PIE_BASE;
        if (!at) { zb_seterr(err, "%s: no room in guest memory", path); goto out; }
        base = at - lo;
    }
    if (base + lo < ZB_LOW_REGION || base + hi > sb->mem.mmap_top || !zb_mem_range_free(&sb->mem, base + lo, hi - lo)) {
        zb_seterr(err, "%s: its segments (0x%llx-0x%llx) do not fit this guest's memory", path,
                  (unsigned long long)(base + lo), (unsigned long long)(base + hi));
        goto out;
    }
    zb_mem_mark(&sb->mem, base + lo, hi - lo, 1);
    for (int i = 0; i < eh.e_phnum; i++) {
        const Elf64_Phdr *p = &ph[i];
        if (p->p_type != PT_LOAD) continue;
        if (p->p_filesz && read_exact(fd, sb->mem.host + base + p->p_vaddr, p->p_filesz, p->p_offset) < 0) {
            zb_seterr(err, "%s: short read of a segment", path);
            goto out;
        }
        zb_region_add(&sb->mem, base + ZB_PAGE_DOWN(p->p_vaddr), base + ZB_PAGE_UP(p->p_vaddr + p->p_memsz),
                      (int)(((p->p_flags & PF_R) ? 1 : 0) | ((p->p_flags & PF_W) ? 2 : 0) | ((p->p_flags & PF_X) ? 4 : 0)),
                      canonical ? canonical : path);
    }
    zb_mem_dirty(&sb->mem, base + lo, hi - lo);
    out->base = base;
    out->entry = base + eh.e_entry;
    out->phdr = base + phdr_vaddr;
    out->phnum = eh.e_phnum;
    out->phent = eh.e_phentsize;
    out->hi = base + hi;
    ret = 0;
out:
    close(fd);
    return ret;
}

static uint32_t cpuid_edx_leaf1(const zb_engine *e) {
    for (unsigned i = 0; i < e->cpuid->nent; i++)
        if (e->cpuid->entries[i].function == 1) return e->cpuid->entries[i].edx;
    return 0;
}

/* Build the initial stack below sp; returns the new stack pointer or 0. */
static uint64_t build_stack(zb_sandbox *sb, uint64_t sp, const char *const *argv, const char *const *envp,
                            const uint64_t (*auxv)[2], int nauxv, uint64_t *at_random_slot, uint64_t *execfn_slot) {
    uint8_t *m = sb->mem.host;
    uint64_t floor = sb->mem.size - ZB_STACK_SIZE + ZB_PAGE;
    int argc = 0, envc = 0;
    while (argv[argc] && argc < MAX_ARGS) argc++;
    while (envp[envc] && envc < MAX_ARGS) envc++;
    uint64_t *ptrs = calloc((size_t)argc + envc, sizeof *ptrs);
    if (!ptrs) return 0;
#define PUSH_BYTES(src, n) do { if (sp - floor < (n) + 4096) goto fail; sp -= (n); memcpy(m + sp, (src), (n)); } while (0)
    PUSH_BYTES(sb->proc.exe, strlen(sb->proc.exe) + 1);
    *execfn_slot = sp;
    for (int i = envc - 1; i >= 0; i--) { PUSH_BYTES(envp[i], strlen(envp[i]) + 1); ptrs[argc + i] = sp; }
    for (int i = argc - 1; i >= 0; i--) { PUSH_BYTES(argv[i], strlen(argv[i]) + 1); ptrs[i] = sp; }
    PUSH_BYTES("x86_64", 7);
    uint64_t platform = sp;
    uint8_t rnd[16];
    if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd) goto fail;
    sp &= ~15ull;
    PUSH_BYTES(rnd, sizeof rnd);
    *at_random_slot = sp;
    size_t words = 1 + (size_t)argc + 1 + (size_t)envc + 1 + 2 * (size_t)nauxv;
    if (sp - floor < words * 8 + 4096) goto fail;
    sp = (sp - words * 8) & ~15ull;
    uint64_t *w = (uint64_t *)(m + sp);
    size_t k = 0;
    w[k++] = (uint64_t)argc;
    for (int i = 0; i < argc; i++) w[k++] = ptrs[i];
    w[k++] = 0;
    for (int i = 0; i < envc; i++) w[k++] = ptrs[argc + i];
    w[k++] = 0;
    for (int i = 0; i < nauxv; i++) {
        w[k++] = auxv[i][0];
        w[k++] = auxv[i][0] == AT_RANDOM ? *at_random_slot : auxv[i][0] == AT_EXECFN ? *execfn_slot
               : auxv[i][0] == AT_PLATFORM ? platform : auxv[i][1];
    }
#undef PUSH_BYTES
    free(ptrs);
    zb_mem_dirty(&sb->mem, sp, sb->mem.size - sp);
    return sp;
fail:
    free(ptrs);
    return 0;
}

int zb_elf_exec(zb_sandbox *sb, const char *exe, const char *const *argv, const char *const *envp, char *err) {
    loaded_t prog, interp;
    char canonical[PATH_MAX];
    uint64_t stack_lo = sb->mem.size - ZB_STACK_SIZE;
    zb_mem_mark(&sb->mem, stack_lo, ZB_STACK_SIZE, 1);
    zb_region_add(&sb->mem, stack_lo, sb->mem.size, 3, "[stack]");
    sb->mem.mmap_top = stack_lo - (1ul << 20); /* a guard gap below the stack */
    if (load_elf(sb, exe, 0, &prog, canonical, err) < 0) return -1;
    snprintf(sb->proc.exe, sizeof sb->proc.exe, "%s", canonical);
    uint64_t entry = prog.entry, interp_base = 0;
    if (prog.interp[0]) {
        if (load_elf(sb, prog.interp, 1, &interp, NULL, err) < 0) return -1;
        entry = interp.entry;
        interp_base = interp.base;
    }
    sb->mem.brk_start = sb->mem.brk_end = ZB_PAGE_UP(prog.hi);
    uint64_t vdso = zb_vdso_load(sb, err);
    if (!vdso) return -1;
    uint64_t at_random = 0, execfn = 0;
    const uint64_t auxv[][2] = {
        {AT_SYSINFO_EHDR, vdso}, {AT_MINSIGSTKSZ, 2048 + sb->engine->xsave_size},
        {AT_HWCAP, cpuid_edx_leaf1(sb->engine)}, {AT_PAGESZ, ZB_PAGE}, {AT_CLKTCK, 100},
        {AT_PHDR, prog.phdr}, {AT_PHENT, prog.phent}, {AT_PHNUM, prog.phnum}, {AT_BASE, interp_base},
        {AT_FLAGS, 0}, {AT_ENTRY, prog.entry}, {AT_UID, 1000}, {AT_EUID, 1000}, {AT_GID, 1000},
        {AT_EGID, 1000}, {AT_SECURE, 0}, {AT_RANDOM, 0}, {AT_HWCAP2, 0}, {AT_EXECFN, 0},
        {AT_PLATFORM, 0}, {AT_NULL, 0},
    };
    uint64_t sp = build_stack(sb, sb->mem.size, argv, envp, auxv, (int)(sizeof auxv / sizeof auxv[0]), &at_random, &execfn);
    if (!sp) { zb_seterr(err, "arguments and environment do not fit the %lu MiB stack", ZB_STACK_SIZE >> 20); return -1; }
    memset(&sb->cpu.regs, 0, sizeof sb->cpu.regs);
    sb->cpu.regs.rip = entry;
    sb->cpu.regs.rsp = sp;
    sb->cpu.regs.rflags = 0x202;
    sb->cpu.fs_base = sb->cpu.gs_base = 0;
    return 0;
}
