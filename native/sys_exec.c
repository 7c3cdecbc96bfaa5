/* sys_exec.c - execve and execveat: a new program replaces the calling process's image.
 *
 * In Linux's order: the path and the argument and environment strings are copied in (every guest
 * pointer checked, every count and length bounded: E2BIG past ZB_EXEC_ARG_MAX bytes in all or
 * ZB_EXEC_MAX_STRLEN per string, EFAULT for a bad pointer or a string that runs off guest
 * memory); the file is resolved in the guest's namespace and opened (ENOENT, EACCES, ELOOP);
 * `#!` scripts are followed to their interpreter (one optional argument, at most
 * EXEC_MAX_SCRIPTS levels: ELOOP); the ELF program and its loader are checked whole (ENOEXEC,
 * ELIBBAD) and must fit the guest's memory (ENOMEM). Until then the caller is untouched and gets
 * the error. Then the point of no return: other threads go (the caller becomes the main thread),
 * caught signals return to their default action (ignored ones stay ignored; the blocked mask and
 * pending signals stay), the alternate stack goes, every user mapping goes (shared file mappings
 * written back first; the vDSO stays where it is), close-on-exec fds are closed, the FPU state is
 * reset, and the image is laid out (elf_loader.c). A failure after that point kills the process
 * with SIGSEGV, as Linux does.
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
#include <sys/syscall.h>

#define BINPRM_BUF 256        /* bytes of a file looked at to recognise it (Linux's BINPRM_BUF_SIZE) */
#define EXEC_MAX_SCRIPTS 5    /* interpreters followed before ELOOP (Linux's exec_binprm depth) */

/* ---- copying the strings in ---- */

/* The NULL-terminated vector of string pointers at `vec` (NULL: none) into args. */
static long copy_strings(zb_sandbox *sb, uint64_t vec, int is_env, zb_exec_args *args, char *scratch) {
    for (uint64_t i = 0; vec; i++) {
        uint64_t ptr;
        if (vec + 8 * i < vec || zb_copy_from_guest(sb, &ptr, vec + 8 * i, 8) < 0) return -EFAULT;
        if (!ptr) break;
        int rc = zb_guest_string(sb, ptr, scratch, ZB_EXEC_MAX_STRLEN);
        if (rc == -ENAMETOOLONG) return -E2BIG;
        if (rc < 0) return rc;
        if ((rc = zb_exec_args_push(args, scratch, strlen(scratch), is_env)) < 0) return rc;
    }
    return 0;
}

/* The strings of a script's interpreter: prefix (n of them) instead of argv[0], then argv[1..]
 * and the environment, as Linux's load_script rebuilds them. */
static long rewrite_args(zb_exec_args *args, const char *const *prefix, int n) {
    zb_exec_args out;
    memset(&out, 0, sizeof out);
    long rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = zb_exec_args_push(&out, prefix[i], strlen(prefix[i]), 0);
    const char *s = args->buf;
    for (uint32_t i = 0; i < args->argc + args->envc && !rc; i++) {
        size_t len = strlen(s);
        if (i > 0 || i >= args->argc) rc = zb_exec_args_push(&out, s, len, i >= args->argc);
        s += len + 1;
    }
    if (rc) { zb_exec_args_free(&out); return rc; }
    zb_exec_args_free(args);
    *args = out;
    return 0;
}

/* ---- #! scripts ---- */

/* Parse the first line of a script (buf: its first n bytes, n >= 2, starting "#!") into the
 * interpreter's path and its one optional argument (the rest of the line, trailing blanks cut),
 * as Linux's binfmt_script does. -ENOEXEC for no interpreter or a line longer than BINPRM_BUF. */
static int parse_script(char *buf, size_t n, int whole_file, char **interp, char **arg) {
    char *end = memchr(buf, '\n', n);
    if (!end) {
        if (!whole_file) return -ENOEXEC; /* the line goes on beyond what Linux reads */
        end = buf + n;
    }
    *end = 0;
    if (memchr(buf, 0, (size_t)(end - buf))) end = buf + strlen(buf); /* a NUL ends the line too */
    while (end > buf + 2 && (end[-1] == ' ' || end[-1] == '\t')) *--end = 0;
    char *p = buf + 2;
    while (*p == ' ' || *p == '\t') p++;
    if (!*p) return -ENOEXEC;
    *interp = p;
    while (*p && *p != ' ' && *p != '\t') p++;
    *arg = NULL;
    if (*p) {
        *p++ = 0;
        while (*p == ' ' || *p == '\t') p++;
        if (*p) *arg = p;
    }
    return 0;
}

/* ---- the point of no return ---- */

static void reset_signals(zb_sandbox *sb) {
    for (int sig = 1; sig <= 64; sig++) {
        zb_sigaction *a = &sb->sig.action[sig];
        if (a->handler != (uint64_t)(uintptr_t)SIG_IGN) a->handler = (uint64_t)(uintptr_t)SIG_DFL;
        a->flags = a->restorer = a->mask = 0;
    }
    sb->sig.altstack_sp = sb->sig.altstack_size = 0;
    sb->sig.altstack_flags = 0;
    sb->sig.fault_sig = sb->sig.fault_code = 0;
    sb->sig.fault_addr = 0;
}

/* Every other thread goes; the caller stays, as the main thread (slot 0, tid = the pid). */
static void single_thread(zb_sandbox *sb) {
    zb_threads *ts = &sb->threads;
    for (int i = 0; i < ts->cap; i++)
        if (i != ts->current && ts->t[i].tid) zb_threads_remove(ts, i);
    if (ts->current != 0) {
        ts->t[0] = ts->t[ts->current]; /* slot 0 was freed above: its XSAVE buffer moves along */
        memset(&ts->t[ts->current], 0, sizeof ts->t[ts->current]);
        ts->current = 0;
    }
    zb_thread *t = &ts->t[0];
    t->tid = sb->proc.pid ? sb->proc.pid : 1; /* the process's main thread: tid = pid */
    t->state = ZB_THREAD_RUNNABLE;
    t->clear_child_tid = t->robust_list = t->robust_len = 0; /* they named the old image's memory */
    t->futex_addr = 0;
    t->wake_ns = INT64_MAX;
    ts->count = 1;
    ts->switch_request = ts->preempt = 0;
    sb->proc.tid_address = 0;
}

/* Let go of every user page but the vDSO's (zb_mem_drop: free, zeroed when handed out again, left
 * as they are until then); forget the regions and the brk. */
static long drop_image(zb_sandbox *sb) {
    zb_memory *m = &sb->mem;
    uint64_t keep_lo = sb->vdso_data / ZB_PAGE, keep_hi = sb->vdso_data ? keep_lo + zb_vdso_size() / ZB_PAGE : 0;
    long rc = zb_shmap_unmap(sb, ZB_LOW_REGION, m->size - ZB_LOW_REGION); /* shared file mappings written back */
    if (rc < 0) return rc;
    if ((rc = zb_mem_release_stale(m)) < 0) return rc;
    for (uint64_t p = ZB_LOW_REGION / ZB_PAGE; p < m->npages;) {
        if (!(p & 63) && p + 64 <= m->npages && !m->allocated[p >> 6]) { p += 64; continue; }
        if (!zb_bit(m->allocated, p) || (p >= keep_lo && p < keep_hi)) { p++; continue; }
        uint64_t q = p;
        while (q < m->npages && zb_bit(m->allocated, q) && !(q >= keep_lo && q < keep_hi)) q++;
        zb_mem_drop(m, p * ZB_PAGE, (q - p) * ZB_PAGE);
        p = q;
    }
    zb_region_remove(m, ZB_LOW_REGION, m->size);
    m->brk_start = m->brk_end = 0;
    return 0;
}

static void close_on_exec(zb_sandbox *sb) {
    for (int fd = 0; fd < ZB_MAX_FDS; fd++)
        if (sb->fds->fd[fd] && sb->fds->cloexec[fd]) zb_fd_close(sb, fd);
}

static long reset_fpu(zb_sandbox *sb) {
    char err[ZB_ERRLEN];
    zb_cpu_init_fpu(sb->cpu.xsave, sb->engine->xsave_size);
    zb_vm *vm = zb_vm_of(sb);
    if (vm && vm->attached == sb && zb_vm_load_xsave(vm, sb, err) < 0) {
        zb_log(sb, "execve: %s", err);
        return -EIO;
    }
    return 0;
}

/* After the point of no return: the process dies of SIGSEGV (its handler is the default one by
 * now), delivered on the way back from this syscall. */
static long exec_failed(zb_sandbox *sb, const char *what, long rc) {
    zb_log(sb, "execve failed after the old program was gone (%s: %s): the process is killed with SIGSEGV",
           what, strerror((int)-rc));
    sb->sig.action[SIGSEGV].handler = (uint64_t)(uintptr_t)SIG_DFL;
    sb->sig.blocked &= ~ZB_SIG_BIT(SIGSEGV);
    sb->sig.pending |= ZB_SIG_BIT(SIGSEGV);
    return 0;
}

static const char *basename_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash && slash[1] ? slash + 1 : path;
}

static long do_execve(zb_sandbox *sb, int64_t dirfd, uint64_t upath, uint64_t uargv, uint64_t uenvp, uint64_t flags) {
    if (flags & ~(uint64_t)(AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)) return -EINVAL;
    char *path = malloc(PATH_MAX), *scratch = malloc(ZB_EXEC_MAX_STRLEN), *filename = malloc(PATH_MAX + 32);
    char *cur = malloc(PATH_MAX + 32), *line = malloc(BINPRM_BUF + 1);
    zb_exec_args args;
    zb_exec_image img;
    memset(&args, 0, sizeof args);
    memset(&img, 0, sizeof img);
    img.prog.fd = img.interp.fd = -1;
    long rc = -ENOMEM;
    if (!path || !scratch || !filename || !cur || !line) goto out;
    if ((rc = zb_guest_string(sb, upath, path, PATH_MAX)) < 0) goto out;
    /* the name the program is run by (Linux's bprm->filename): an fd-relative one is /dev/fd/N/... */
    int by_fd = path[0] != '/' && (int)dirfd != AT_FDCWD;
    if (!by_fd) snprintf(filename, PATH_MAX + 32, "%s", path);
    else if (!path[0]) snprintf(filename, PATH_MAX + 32, "/dev/fd/%d", (int)dirfd);
    else snprintf(filename, PATH_MAX + 32, "/dev/fd/%d/%s", (int)dirfd, path);
    if ((rc = copy_strings(sb, uargv, 0, &args, scratch)) < 0) goto out;
    if (!args.argc && (rc = zb_exec_args_push(&args, "", 0, 0)) < 0) goto out; /* Linux adds "" for an empty argv */
    if ((rc = copy_strings(sb, uenvp, 1, &args, scratch)) < 0) goto out;

    zb_resolved r;
    rc = zb_path_arg(sb, dirfd, upath, (flags & AT_SYMLINK_NOFOLLOW) ? ZB_RESOLVE_NOFOLLOW : 0, (flags & AT_EMPTY_PATH) != 0, &r);
    if (rc < 0) goto out;
    if ((rc = zb_exec_open(sb, &r, &img.prog)) < 0) goto out;
    char comm[16];
    snprintf(comm, sizeof comm, "%.15s", basename_of(by_fd ? r.path : filename));
    snprintf(cur, PATH_MAX + 32, "%s", filename);
    for (int depth = 0;; depth++) {
        long n = zb_exec_read(sb, &img.prog, line, BINPRM_BUF, 0);
        if (n < 0) { rc = n; goto out; }
        if (n >= SELFMAG && !memcmp(line, ELFMAG, SELFMAG)) break;
        if (n < 2 || line[0] != '#' || line[1] != '!') { rc = -ENOEXEC; goto out; }
        if (depth >= EXEC_MAX_SCRIPTS) { rc = -ELOOP; goto out; }
        char *interp, *arg;
        line[n] = 0;
        if ((rc = parse_script(line, (size_t)n, img.prog.size <= BINPRM_BUF, &interp, &arg)) < 0) goto out;
        const char *prefix[3] = {interp, arg ? arg : cur, cur};
        if ((rc = rewrite_args(&args, prefix, arg ? 3 : 2)) < 0) goto out;
        zb_exec_close(sb, &img.prog);
        if ((rc = zb_fs_resolve(sb, sb->proc.cwd, interp, 0, &r)) < 0 || (rc = zb_exec_open(sb, &r, &img.prog)) < 0) goto out;
        snprintf(cur, PATH_MAX + 32, "%s", interp);
    }
    char err[ZB_ERRLEN];
    if ((rc = zb_exec_prepare(sb, &img, err)) < 0) {
        zb_log(sb, "execve %s: %s", filename, err);
        goto out;
    }
    uint64_t keep = sb->vdso_data && zb_mem_range_allocated(&sb->mem, sb->vdso_data, zb_vdso_size()) ? sb->vdso_data : 0;
    if ((rc = zb_exec_fits(sb, &img, keep, keep ? keep + zb_vdso_size() : 0)) < 0) {
        zb_log(sb, "execve %s: it does not fit this guest's memory", filename);
        goto out;
    }

    /* ---- the point of no return: from here on a failure kills the process ---- */
    reset_signals(sb);
    single_thread(sb);
    if ((rc = drop_image(sb)) < 0) { rc = exec_failed(sb, "releasing the old image", rc); goto out; }
    close_on_exec(sb);
    if ((rc = reset_fpu(sb)) < 0) { rc = exec_failed(sb, "the FPU state", rc); goto out; }
    uint64_t vdso = zb_vdso_keep(sb);
    if ((rc = zb_exec_load(sb, &img, &args, filename, vdso, err)) < 0) { rc = exec_failed(sb, err, rc); goto out; }
    memcpy(sb->proc.comm, comm, sizeof comm);
    zb_family_member_execed(sb);
    rc = 0; /* rax of the new program's first instruction */
out:
    zb_exec_image_close(sb, &img);
    zb_exec_args_free(&args);
    free(path);
    free(scratch);
    free(filename);
    free(cur);
    free(line);
    return rc;
}

static long sys_execve(zb_sandbox *sb, const uint64_t a[6]) { return do_execve(sb, AT_FDCWD, a[0], a[1], a[2], 0); }
static long sys_execveat(zb_sandbox *sb, const uint64_t a[6]) { return do_execve(sb, (int)a[0], a[1], a[2], a[3], a[4]); }

void zb_sys_exec_register(zb_syscall_fn *t) {
    t[SYS_execve] = sys_execve;
    t[SYS_execveat] = sys_execveat;
}
