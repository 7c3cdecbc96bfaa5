/* elf_loader.c - loading a Linux x86-64 ELF program into a sandbox, as execve does: its PT_LOAD
 * segments, its PT_INTERP loader (ld-linux) for dynamic programs, the vDSO, and the initial stack
 * with argc/argv/envp/auxv. Used for a new sandbox's first program (zb_elf_exec) and by the
 * guest's own execve (sys_exec.c).
 *
 * The program and its loader are files of the guest's namespace (the read-only view, overlay
 * files, a project's files), opened read-only by the engine. Everything in them is hostile input:
 * zb_exec_prepare checks the headers whole (sizes, offsets inside the file, segments sorted and
 * disjoint, below the user address limit, the entry inside them, PT_INTERP a terminated path)
 * before the caller's image is touched, so a bad file is ENOEXEC (ELIBBAD for a bad loader) and
 * the caller continues as it was.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "dev.h"
#include "process.h"
#include "sandbox_state.h"
#include "fs.h"
#include "linux.h"
#include "shared_map.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- argument strings ---- */

size_t zb_exec_args_size(const zb_exec_args *a) {
    return a->len + 8 * ((size_t)a->argc + a->envc + 2);
}

int zb_exec_args_push(zb_exec_args *a, const char *s, size_t n, int is_env) {
    if (n + 1 > ZB_EXEC_MAX_STRLEN || zb_exec_args_size(a) + n + 1 + 8 > ZB_EXEC_ARG_MAX) return -E2BIG;
    if (!is_env && a->envc) return -EINVAL; /* arguments come first */
    if (a->len + n + 1 > a->cap) {
        size_t cap = a->cap ? a->cap : 4096;
        while (cap < a->len + n + 1) cap *= 2;
        char *nb = realloc(a->buf, cap);
        if (!nb) return -ENOMEM;
        a->buf = nb;
        a->cap = cap;
    }
    memcpy(a->buf + a->len, s, n);
    a->buf[a->len + n] = 0;
    a->len += n + 1;
    if (is_env) a->envc++;
    else a->argc++;
    return 0;
}

void zb_exec_args_free(zb_exec_args *a) {
    free(a->buf);
    memset(a, 0, sizeof *a);
}

/* ---- the executable file ---- */

int zb_exec_open(zb_sandbox *sb, const zb_resolved *r, zb_exec_file *out) {
    memset(out, 0, sizeof *out);
    out->fd = -1;
    if (!r->exists) return -ENOENT;
    if (r->loc.kind == LOC_SYMLINK) return -ELOOP;
    if (r->loc.is_dir || (r->loc.kind != LOC_HOST && r->loc.kind != LOC_OVERLAY)) return -EACCES;
    struct stat st;
    int rc = zb_fs_stat(sb, r, &st);
    if (rc < 0) return rc;
    if (S_ISLNK(st.st_mode)) return -ELOOP; /* execveat(AT_SYMLINK_NOFOLLOW) of a symlink */
    if (!S_ISREG(st.st_mode)) return -EACCES;
    /* any execute bit, as faccessat(X_OK) answers here; set-user-ID and set-group-ID bits give
     * nothing (the guest has one identity: a nosuid mount) */
    if (!(st.st_mode & 0111)) return -EACCES;
    if (r->loc.kind == LOC_HOST) {
        int fd = zb_host_open_ro(r->path, 0);
        if (fd < 0) return fd;
        struct stat fst; /* the file opened, not the one stat'ed before (it may have been swapped) */
        if (fstat(fd, &fst) < 0 || !S_ISREG(fst.st_mode)) { close(fd); return -EACCES; }
        out->fd = fd;
        out->size = (uint64_t)fst.st_size;
    } else {
        zb_inode *in = zb_ovl_inode(sb->fs, r->loc.ino);
        if (!in || in->type != INO_FILE) return -EACCES;
        /* a shared writable mapping of the file holds its newest bytes: bring them into the file */
        long wb = zb_shmap_writeback(sb, r->loc.ino, 0, in->size);
        if (wb < 0) return (int)wb;
        zb_ovl_open_ref(sb->fs, r->loc.ino, 1); /* lives while exec reads it, even if unlinked and closed */
        out->ino = r->loc.ino;
        out->size = in->size;
    }
    snprintf(out->path, sizeof out->path, "%s", r->path);
    return 0;
}

long zb_exec_read(zb_sandbox *sb, const zb_exec_file *f, void *buf, size_t len, uint64_t off) {
    size_t done = 0;
    if (f->fd < 0) return zb_ovl_read(sb->fs, f->ino, buf, len, off);
    while (done < len) {
        ssize_t n = pread(f->fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -errno;
        if (n == 0) break;
        done += (size_t)n;
    }
    return (long)done;
}

void zb_exec_close(zb_sandbox *sb, zb_exec_file *f) {
    if (f->fd >= 0) close(f->fd);
    if (f->ino) zb_ovl_open_ref(sb->fs, f->ino, -1);
    f->fd = -1;
    f->ino = 0;
}

static int read_all(zb_sandbox *sb, const zb_exec_file *f, void *buf, size_t len, uint64_t off) {
    if (off > f->size || len > f->size - off) return -1;
    return zb_exec_read(sb, f, buf, len, off) == (long)len ? 0 : -1;
}

/* ---- checking an ELF file ---- */

/* Check f's headers into out; `what` names the file in err. -ENOEXEC for anything malformed. */
static int check_elf(zb_sandbox *sb, const zb_exec_file *f, int is_interp, zb_elf_info *out, char *err) {
    const char *what = f->path;
    memset(out, 0, sizeof *out);
    Elf64_Ehdr eh;
    Elf64_Phdr ph[ZB_EXEC_MAX_PHDRS];
    if (read_all(sb, f, &eh, sizeof eh, 0) < 0 || memcmp(eh.e_ident, ELFMAG, SELFMAG) || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_machine != EM_X86_64 || (eh.e_type != ET_EXEC && eh.e_type != ET_DYN)) {
        zb_seterr(err, "%s: not an x86-64 ELF executable", what);
        return -ENOEXEC;
    }
    if (eh.e_phnum == 0 || eh.e_phnum > ZB_EXEC_MAX_PHDRS || eh.e_phentsize != sizeof(Elf64_Phdr) ||
        read_all(sb, f, ph, (size_t)eh.e_phnum * sizeof *ph, eh.e_phoff) < 0) {
        zb_seterr(err, "%s: bad program headers", what);
        return -ENOEXEC;
    }
    out->type = eh.e_type;
    out->entry = eh.e_entry;
    out->phoff = eh.e_phoff;
    out->phnum = eh.e_phnum;
    out->phent = eh.e_phentsize;
    uint64_t prev_end = 0;
    int have_interp = 0;
    for (int i = 0; i < eh.e_phnum; i++) {
        const Elf64_Phdr *p = &ph[i];
        if (p->p_type == PT_LOAD) {
            if (!p->p_memsz) continue; /* maps nothing */
            if (p->p_filesz > p->p_memsz || p->p_vaddr >= ZB_USER_ADDR_LIMIT || p->p_memsz > ZB_USER_ADDR_LIMIT - p->p_vaddr ||
                (p->p_vaddr % ZB_PAGE) != (p->p_offset % ZB_PAGE) || p->p_offset > f->size || p->p_filesz > f->size - p->p_offset) {
                zb_seterr(err, "%s: malformed PT_LOAD segment %d", what, i);
                return -ENOEXEC;
            }
            /* sorted by address and disjoint, as the ELF specification requires: an overlap would
             * make one segment's bytes silently replace another's */
            if (out->nloads && p->p_vaddr < prev_end) {
                zb_seterr(err, "%s: PT_LOAD segments overlap or are out of order", what);
                return -ENOEXEC;
            }
            prev_end = p->p_vaddr + p->p_memsz;
            struct zb_elf_seg *s = &out->loads[out->nloads++];
            s->vaddr = p->p_vaddr;
            s->memsz = p->p_memsz;
            s->offset = p->p_offset;
            s->filesz = p->p_filesz;
            s->flags = p->p_flags;
            if (!out->phdr_vaddr && eh.e_phoff >= p->p_offset && eh.e_phoff - p->p_offset < p->p_filesz)
                out->phdr_vaddr = p->p_vaddr + (eh.e_phoff - p->p_offset);
        } else if (p->p_type == PT_PHDR) {
            out->phdr_vaddr = p->p_vaddr;
        } else if (p->p_type == PT_INTERP && !is_interp) {
            if (have_interp || p->p_filesz < 2 || p->p_filesz > PATH_MAX || p->p_offset > f->size ||
                p->p_filesz > f->size - p->p_offset || read_all(sb, f, out->interp, p->p_filesz, p->p_offset) < 0 ||
                out->interp[p->p_filesz - 1] != 0 || strlen(out->interp) != p->p_filesz - 1) {
                zb_seterr(err, "%s: bad PT_INTERP", what);
                out->interp[0] = 0;
                return -ENOEXEC;
            }
            have_interp = 1;
        }
    }
    if (!out->nloads) { zb_seterr(err, "%s: no loadable segments", what); return -ENOEXEC; }
    out->lo = ZB_PAGE_DOWN(out->loads[0].vaddr);
    out->hi = ZB_PAGE_UP(prev_end);
    if (out->entry < out->lo || out->entry >= out->hi) {
        zb_seterr(err, "%s: its entry point 0x%llx is outside its segments", what, (unsigned long long)out->entry);
        return -ENOEXEC;
    }
    return 0;
}

int zb_exec_prepare(zb_sandbox *sb, zb_exec_image *img, char *err) {
    img->has_interp = 0;
    img->interp.fd = -1;
    img->interp.ino = 0;
    int rc = check_elf(sb, &img->prog, 0, &img->prog_elf, err);
    if (rc < 0) return rc;
    if (!img->prog_elf.interp[0]) return 0;
    zb_resolved r;
    rc = zb_fs_resolve(sb, sb->proc.cwd[0] ? sb->proc.cwd : "/", img->prog_elf.interp, 0, &r);
    if (rc == 0) rc = zb_exec_open(sb, &r, &img->interp);
    if (rc < 0) {
        zb_seterr(err, "%s: its loader %s: %s", img->prog.path, img->prog_elf.interp, strerror(-rc));
        return rc;
    }
    img->has_interp = 1;
    if (check_elf(sb, &img->interp, 1, &img->interp_elf, err) < 0) return -ELIBBAD;
    return 0;
}

void zb_exec_image_close(zb_sandbox *sb, zb_exec_image *img) {
    zb_exec_close(sb, &img->prog);
    if (img->has_interp) zb_exec_close(sb, &img->interp);
    img->has_interp = 0;
}

/* ---- laying the image out ---- */

/* Where the program goes: ET_EXEC where it is linked, ET_DYN (PIE) at ZB_PIE_BASE. */
static uint64_t prog_base(const zb_elf_info *e) { return e->type == ET_DYN ? ZB_PIE_BASE - e->lo : 0; }

static uint64_t stack_lo(const zb_memory *m) { return m->size - ZB_STACK_SIZE; }
static uint64_t mmap_top_for(const zb_memory *m) { return stack_lo(m) - (1ul << 20); /* a guard gap below the stack */ }

static uint64_t vdso_bytes(void) { return zb_vdso_size(); }

int zb_exec_fits(zb_sandbox *sb, const zb_exec_image *img, uint64_t keep_lo, uint64_t keep_hi) {
    const zb_memory *m = &sb->mem;
    const zb_elf_info *p = &img->prog_elf;
    uint64_t base = prog_base(p), lo = base + p->lo, hi = base + p->hi, top = mmap_top_for(m);
    if (lo < ZB_LOW_REGION || hi > top || hi <= lo) return -ENOMEM;
    if (keep_hi > keep_lo && lo < keep_hi && keep_lo < hi) return -ENOMEM; /* on top of the vDSO */
    uint64_t pages = (p->hi - p->lo + ZB_STACK_SIZE) / ZB_PAGE + (keep_hi > keep_lo ? 0 : vdso_bytes() / ZB_PAGE);
    if (img->has_interp) {
        uint64_t span = img->interp_elf.hi - img->interp_elf.lo;
        if (span > top - ZB_LOW_REGION) return -ENOMEM;
        pages += span / ZB_PAGE;
    }
    if (pages > m->pages_limit || pages > (top - ZB_LOW_REGION) / ZB_PAGE) return -ENOMEM;
    return 0;
}

/* Copy one file's PT_LOAD segments to base + their addresses (the range is allocated, zeros). */
static int place_segments(zb_sandbox *sb, const zb_exec_file *f, const zb_elf_info *e, uint64_t base, char *err) {
    for (int i = 0; i < e->nloads; i++) {
        const struct zb_elf_seg *s = &e->loads[i];
        uint64_t at = base + s->vaddr;
        if (s->filesz && zb_exec_read(sb, f, sb->mem.host + at, s->filesz, s->offset) != (long)s->filesz) {
            zb_seterr(err, "%s: short read of a segment", f->path);
            return -EIO;
        }
        zb_region_add(&sb->mem, ZB_PAGE_DOWN(at), ZB_PAGE_UP(at + s->memsz),
                      (int)(((s->flags & PF_R) ? 1 : 0) | ((s->flags & PF_W) ? 2 : 0) | ((s->flags & PF_X) ? 4 : 0)), f->path);
    }
    zb_mem_dirty(&sb->mem, base + e->lo, e->hi - e->lo);
    return 0;
}

/* Reserve [lo, hi) for a file's image: free, above the low region, below the mmap area. */
static int claim(zb_sandbox *sb, uint64_t lo, uint64_t hi, const char *what, char *err) {
    zb_memory *m = &sb->mem;
    if (lo < ZB_LOW_REGION || hi > m->mmap_top || hi <= lo || !zb_mem_range_free(m, lo, hi - lo) ||
        !zb_mem_fits(m, (hi - lo) / ZB_PAGE)) {
        zb_seterr(err, "%s: its segments (0x%llx-0x%llx) do not fit this guest's memory", what,
                  (unsigned long long)lo, (unsigned long long)hi);
        return -ENOMEM;
    }
    zb_mem_mark(m, lo, hi - lo, 1);
    return 0;
}

static uint32_t cpuid_edx_leaf1(const zb_engine *e) {
    for (unsigned i = 0; e->cpuid && i < e->cpuid->nent; i++)
        if (e->cpuid->entries[i].function == 1) return e->cpuid->entries[i].edx;
    return 0;
}

/* Build the initial stack below the top of memory as Linux lays it out (strings at the top:
 * argv, envp, then the program's name; 16 random bytes; then argc, argv[], NULL, envp[], NULL,
 * auxv); returns the new stack pointer or 0 if it does not fit. */
static uint64_t build_stack(zb_sandbox *sb, const zb_exec_args *args, const char *execfn, const uint64_t (*auxv)[2], int nauxv) {
    uint8_t *m = sb->mem.host;
    uint64_t sp = sb->mem.size, floor = sb->mem.size - ZB_STACK_SIZE + ZB_PAGE;
    size_t fnlen = strlen(execfn) + 1;
#define PUSH_BYTES(src, n) do { if (sp - floor < (n) + 4096) return 0; sp -= (n); memcpy(m + sp, (src), (n)); } while (0)
    PUSH_BYTES(execfn, fnlen);
    uint64_t execfn_at = sp;
    PUSH_BYTES(args->buf, args->len);
    uint64_t strings = sp;
    sb->proc.arg_start = sb->proc.arg_end = strings;
    for (uint32_t i = 0; i < args->argc; i++) sb->proc.arg_end += strlen((const char *)m + sb->proc.arg_end) + 1;
    PUSH_BYTES("x86_64", 7);
    uint64_t platform = sp;
    uint8_t rnd[16];
    if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd) return 0;
    sp &= ~15ull;
    PUSH_BYTES(rnd, sizeof rnd);
    uint64_t at_random = sp;
#undef PUSH_BYTES
    uint32_t count = args->argc + args->envc;
    size_t words = 1 + (size_t)count + 2 + 2 * (size_t)nauxv;
    if (sp - floor < words * 8 + 4096) return 0;
    sp = (sp - words * 8) & ~15ull;
    uint64_t *w = (uint64_t *)(m + sp);
    size_t k = 0;
    w[k++] = args->argc;
    uint64_t at = strings;
    for (uint32_t i = 0; i < count; i++) {
        if (i == args->argc) w[k++] = 0; /* the end of argv */
        w[k++] = at;
        at += strlen((const char *)m + at) + 1;
    }
    if (args->argc == count) w[k++] = 0;
    w[k++] = 0; /* the end of envp */
    for (int i = 0; i < nauxv; i++) {
        w[k++] = auxv[i][0];
        w[k++] = auxv[i][0] == AT_RANDOM ? at_random : auxv[i][0] == AT_EXECFN ? execfn_at
               : auxv[i][0] == AT_PLATFORM ? platform : auxv[i][1];
    }
    zb_mem_dirty(&sb->mem, sp, sb->mem.size - sp);
    return sp;
}

int zb_exec_load(zb_sandbox *sb, zb_exec_image *img, const zb_exec_args *args, const char *execfn,
                 uint64_t vdso, char *err) {
    zb_memory *m = &sb->mem;
    uint64_t slo = stack_lo(m);
    if (!zb_mem_range_free(m, slo, ZB_STACK_SIZE)) { zb_seterr(err, "the stack's range is in use"); return -ENOMEM; }
    zb_mem_mark(m, slo, ZB_STACK_SIZE, 1);
    zb_region_add(m, slo, m->size, 3, "[stack]");
    m->mmap_top = mmap_top_for(m);
    const zb_elf_info *p = &img->prog_elf;
    uint64_t base = prog_base(p);
    int rc = claim(sb, base + p->lo, base + p->hi, img->prog.path, err);
    if (rc < 0 || (rc = place_segments(sb, &img->prog, p, base, err)) < 0) return rc;
    uint64_t entry = base + p->entry, interp_base = 0;
    if (img->has_interp) {
        const zb_elf_info *ie = &img->interp_elf;
        uint64_t span = ie->hi - ie->lo;
        if (ie->type == ET_DYN) {
            uint64_t at = zb_mem_alloc(m, span, ZB_ALLOC_OTHER);
            if (!at) { zb_seterr(err, "%s: no room in guest memory", img->interp.path); return -ENOMEM; }
            interp_base = at - ie->lo;
        }
        if ((rc = claim(sb, interp_base + ie->lo, interp_base + ie->hi, img->interp.path, err)) < 0 ||
            (rc = place_segments(sb, &img->interp, ie, interp_base, err)) < 0)
            return rc;
        entry = interp_base + ie->entry;
    }
    m->brk_start = m->brk_end = ZB_PAGE_UP(base + p->hi);
    if (!vdso && !(vdso = zb_vdso_load(sb, err))) return -ENOMEM;
    const uint64_t auxv[][2] = {
        {AT_SYSINFO_EHDR, vdso}, {AT_MINSIGSTKSZ, 2048 + sb->engine->xsave_size},
        {AT_HWCAP, cpuid_edx_leaf1(sb->engine)}, {AT_PAGESZ, ZB_PAGE}, {AT_CLKTCK, 100},
        {AT_PHDR, base + p->phdr_vaddr}, {AT_PHENT, p->phent}, {AT_PHNUM, p->phnum}, {AT_BASE, interp_base},
        {AT_FLAGS, 0}, {AT_ENTRY, base + p->entry}, {AT_UID, 1000}, {AT_EUID, 1000}, {AT_GID, 1000},
        {AT_EGID, 1000}, {AT_SECURE, 0}, {AT_RANDOM, 0}, {AT_HWCAP2, 0}, {AT_EXECFN, 0},
        {AT_PLATFORM, 0}, {AT_NULL, 0},
    };
    uint64_t sp = build_stack(sb, args, execfn, auxv, (int)(sizeof auxv / sizeof auxv[0]));
    if (!sp) { zb_seterr(err, "arguments and environment do not fit the %lu MiB stack", ZB_STACK_SIZE >> 20); return -E2BIG; }
    memset(&sb->cpu.regs, 0, sizeof sb->cpu.regs);
    sb->cpu.regs.rip = entry;
    sb->cpu.regs.rsp = sp;
    sb->cpu.regs.rflags = 0x202;
    sb->cpu.fs_base = sb->cpu.gs_base = 0;
    snprintf(sb->proc.exe, sizeof sb->proc.exe, "%s", img->prog.path);
    return 0;
}

/* ---- the first program of a new sandbox ---- */

static int args_from_arrays(zb_exec_args *a, const char *const *argv, const char *const *envp, char *err) {
    for (int pass = 0; pass < 2; pass++) {
        const char *const *v = pass ? envp : argv;
        for (size_t i = 0; v && v[i]; i++) {
            int rc = zb_exec_args_push(a, v[i], strlen(v[i]), pass);
            if (rc < 0) {
                zb_seterr(err, "arguments and environment: %s (at most %lu bytes in all, %lu per string)", strerror(-rc),
                          ZB_EXEC_ARG_MAX, ZB_EXEC_MAX_STRLEN);
                return -1;
            }
        }
    }
    return 0;
}

int zb_elf_exec(zb_sandbox *sb, const char *exe, const char *const *argv, const char *const *envp, char *err) {
    zb_exec_image img;
    zb_exec_args args;
    memset(&img, 0, sizeof img);
    memset(&args, 0, sizeof args);
    img.prog.fd = img.interp.fd = -1;
    zb_resolved r;
    int rc = zb_fs_resolve(sb, sb->proc.cwd[0] ? sb->proc.cwd : "/", exe, 0, &r);
    if (rc == 0) rc = zb_exec_open(sb, &r, &img.prog);
    if (rc < 0) {
        zb_seterr(err, "%s: cannot run it from the guest's view: %s", exe, strerror(-rc));
        return -1;
    }
    int ret = -1;
    if (zb_exec_prepare(sb, &img, err) < 0 || args_from_arrays(&args, argv, envp, err) < 0) goto out;
    if (zb_exec_fits(sb, &img, 0, 0) < 0) {
        zb_seterr(err, "%s does not fit this guest's memory", img.prog.path);
        goto out;
    }
    if (zb_exec_load(sb, &img, &args, img.prog.path, 0, err) < 0) goto out;
    snprintf(sb->proc.comm, sizeof sb->proc.comm, "%.15s", strrchr(exe, '/') ? strrchr(exe, '/') + 1 : exe);
    ret = 0;
out:
    zb_exec_image_close(sb, &img);
    zb_exec_args_free(&args);
    return ret;
}
