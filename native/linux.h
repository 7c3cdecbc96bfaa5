/* linux.h - the linux layer: the syscall table (syscalls.c) the sys_*.c families register into,
 * and exec (elf_loader.c).
 */
#ifndef ZB_LINUX_H
#define ZB_LINUX_H
#include "util.h"

/* ---- syscalls (syscalls.c dispatches to the sys_*.c families) ---- */
#define ZB_SYSCALL_MAX 512
typedef long (*zb_syscall_fn)(zb_sandbox *sb, const uint64_t a[6]);
long zb_syscall_dispatch(zb_sandbox *sb, uint64_t nr, const uint64_t a[6]);
const char *zb_syscall_name(uint64_t nr);

void zb_sys_memory_register(zb_syscall_fn *t);
void zb_sys_files_register(zb_syscall_fn *t);
void zb_sys_fsmeta_register(zb_syscall_fn *t);
void zb_sys_time_register(zb_syscall_fn *t);
void zb_sys_process_register(zb_syscall_fn *t);
void zb_sys_signals_register(zb_syscall_fn *t);
void zb_sys_poll_register(zb_syscall_fn *t);
void zb_sys_itimer_register(zb_syscall_fn *t);
void zb_sys_socket_register(zb_syscall_fn *t);
void zb_sys_inet_register(zb_syscall_fn *t);  /* wraps the socket handlers: after zb_sys_socket_register */
void zb_sys_epoll_register(zb_syscall_fn *t);
void zb_sys_eventfd_register(zb_syscall_fn *t); /* file_eventfd.c */
void zb_sys_threads_register(zb_syscall_fn *t);
void zb_sys_exec_register(zb_syscall_fn *t);
void zb_sys_procs_register(zb_syscall_fn *t);   /* after zb_sys_process_register (wraps its prctl) */
void zb_sys_memfd_register(zb_syscall_fn *t);
void zb_sys_copy_register(zb_syscall_fn *t);    /* sendfile, copy_file_range */
void zb_sys_priority_register(zb_syscall_fn *t);
/* sys_procs.c: a new process (clone without CLONE_THREAD, clone3, fork, vfork); the pid or -errno. */
long zb_sys_new_process(zb_sandbox *sb, uint64_t flags, uint64_t stack, uint64_t parent_tid, uint64_t child_tid,
                        uint64_t tls, uint64_t exit_signal);
/* tgkill/tkill of a thread of another process of the family (tgid <= 0: any); 0 or -ESRCH. */
long zb_sys_signal_process_thread(zb_sandbox *sb, int64_t tgid, int64_t tid, int sig);
/* sys_process.c: the soft and hard limit of resource res (RLIMIT_*) for sb: what it set with
 * setrlimit, else the sandbox's default; and whether n more pages keep sb within its
 * RLIMIT_AS and RLIMIT_DATA (mmap, mremap and brk ask, as Linux checks them). */
void zb_proc_limit(const zb_sandbox *sb, unsigned res, uint64_t *cur, uint64_t *max);
int zb_proc_may_map(const zb_sandbox *sb, uint64_t npages);

/* ---- syscall sites (syscall_sites.c) ----
 * A syscall (number nr) exited through the entry, returning to return_rip: rewrite the `syscall`
 * before it into the port's `out`, or for a number the entry answers stub its site, where that is
 * safe (the run loop calls it). */
struct zb_vm;
void zb_syscall_site_rewrite(zb_sandbox *sb, const struct zb_vm *vm, uint64_t nr, uint64_t return_rip);
/* [addr, addr+len) is being unmapped, replaced or zeroed (sys_memory.c): if that takes the stubbed
 * sites' page (guest_abi.h), every stubbed site gets its `mov` back and the page's slots are
 * emptied, so that no code jumps to a stub that is gone. */
void zb_syscall_stubs_drop(zb_sandbox *sb, uint64_t addr, uint64_t len);

/* Linux's TASK_SIZE_MAX: the highest user address + 1 (47-bit canonical user half, minus the guard
 * page). An FS/GS base at or above it is refused with EPERM, as Linux does: a non-canonical base
 * cannot be loaded into the vCPU (KVM_SET_SREGS or the VM entry fails), so the guest would die of
 * a confusing fault on its next instruction instead of getting an error. */
#define ZB_USER_ADDR_LIMIT 0x7ffffffff000ull

/* ---- exec: loading a program image (elf_loader.c) and the execve syscalls (sys_exec.c) ----
 * A program is opened in the guest's namespace (never by a host path from the guest), checked
 * whole before anything of the caller is touched (zb_exec_prepare: every error before the point of
 * no return leaves the caller as it was), then laid out into memory that holds nothing of a user
 * program any more (zb_exec_load: segments, PT_INTERP loader, vDSO, stack with argv/envp/auxv). */
#define ZB_EXEC_MAX_STRLEN (32 * ZB_PAGE)  /* one argv/envp string, NUL included (MAX_ARG_STRLEN) */
#define ZB_EXEC_ARG_MAX (2ul << 20)        /* argv + envp strings and pointers: Linux's limit, a
                                              quarter of the 8 MiB stack limit (ZB_STACK_SIZE) */
#define ZB_EXEC_MAX_PHDRS 64

/* The argument and environment strings of a new program: argc strings then envc strings, each
 * NUL-terminated, back to back in buf (len bytes used, cap allocated). */
typedef struct zb_exec_args {
    char *buf;
    size_t len, cap;
    uint32_t argc, envc;
} zb_exec_args;
/* The bytes the strings and their pointers take on the new stack (what ZB_EXEC_ARG_MAX bounds). */
size_t zb_exec_args_size(const zb_exec_args *a);
/* Append one string (of length n, without NUL) as the next argument or environment entry:
 * 0, or -E2BIG past the limits, -ENOMEM. */
int zb_exec_args_push(zb_exec_args *a, const char *s, size_t n, int is_env);
void zb_exec_args_free(zb_exec_args *a);

/* An executable file opened read-only in the guest's namespace. */
typedef struct zb_exec_file {
    int fd;                  /* host file (the view, a project): a read-only host fd, else -1 */
    uint32_t ino;            /* overlay file (/tmp, home, a project's upper layer): its inode
                                (an open reference is held), else 0 */
    uint64_t size;
    char path[PATH_MAX];     /* its canonical guest path (what /proc/self/exe shows) */
} zb_exec_file;
/* Open what r names for execution: -ENOENT (missing), -ELOOP (a symlink not followed), -EACCES
 * (a directory, not a regular file, no execute bit), or what the host open says. */
struct zb_resolved;
int zb_exec_open(zb_sandbox *sb, const struct zb_resolved *r, zb_exec_file *out);
/* Read up to len bytes at off: the count (short at the end of the file) or -errno. */
long zb_exec_read(zb_sandbox *sb, const zb_exec_file *f, void *buf, size_t len, uint64_t off);
void zb_exec_close(zb_sandbox *sb, zb_exec_file *f);

/* One checked ELF file: its PT_LOAD segments are sorted, do not overlap, lie inside the file and
 * below ZB_USER_ADDR_LIMIT, its entry is inside them. */
typedef struct zb_elf_info {
    int type;                /* ET_EXEC or ET_DYN */
    uint64_t entry, phoff, phdr_vaddr;
    uint16_t phnum, phent;
    uint64_t lo, hi;         /* page-rounded span of the PT_LOAD segments (link-time addresses) */
    int nloads;
    struct zb_elf_seg { uint64_t vaddr, memsz, offset, filesz; uint32_t flags; } loads[ZB_EXEC_MAX_PHDRS];
    char interp[PATH_MAX];   /* PT_INTERP, "" for none */
} zb_elf_info;

/* A program ready to load: the ELF and, for a dynamic one, its loader, both open and checked. */
typedef struct zb_exec_image {
    zb_exec_file prog, interp;
    zb_elf_info prog_elf, interp_elf;
    int has_interp;
} zb_exec_image;
/* Check the ELF file img->prog (already opened) and open and check its PT_INTERP loader, resolved
 * in the guest's namespace. -ENOEXEC for a malformed program, -ELIBBAD for a malformed loader,
 * the open's error for a missing one; err (may be NULL) says what was wrong. */
int zb_exec_prepare(zb_sandbox *sb, zb_exec_image *img, char *err);
/* Would the image fit this guest's memory once the old program is gone (keeping the vDSO at
 * [keep_lo, keep_hi), or nothing for 0, 0)? 0 or -ENOMEM. */
int zb_exec_fits(zb_sandbox *sb, const zb_exec_image *img, uint64_t keep_lo, uint64_t keep_hi);
/* Lay the image out in memory that holds no user program (a new sandbox, or after exec's
 * teardown), with the vDSO already at vdso (0: place it now), and build the stack: argv and envp
 * from args, AT_EXECFN = execfn. Sets the registers for the program's first instruction. */
int zb_exec_load(zb_sandbox *sb, zb_exec_image *img, const zb_exec_args *args, const char *execfn,
                 uint64_t vdso, char *err);
void zb_exec_image_close(zb_sandbox *sb, zb_exec_image *img);

/* The first program of a new sandbox (zb_sandbox_exec): a host-side exec with error messages. */
int zb_elf_exec(zb_sandbox *sb, const char *exe_guest_path, const char *const *argv,
                const char *const *envp, char *err);

#endif
