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
void zb_sys_procs_register(zb_syscall_fn *t);   /* after zb_sys_process_register (wraps its prctl) */
/* sys_procs.c: a new process (clone without CLONE_THREAD, clone3, fork, vfork); the pid or -errno. */
long zb_sys_new_process(zb_sandbox *sb, uint64_t flags, uint64_t stack, uint64_t parent_tid, uint64_t child_tid,
                        uint64_t tls, uint64_t exit_signal);
/* tgkill/tkill of a thread of another process of the family (tgid <= 0: any); 0 or -ESRCH. */
long zb_sys_signal_process_thread(zb_sandbox *sb, int64_t tgid, int64_t tid, int sig);

/* Linux's TASK_SIZE_MAX: the highest user address + 1 (47-bit canonical user half, minus the guard
 * page). An FS/GS base at or above it is refused with EPERM, as Linux does: a non-canonical base
 * cannot be loaded into the vCPU (KVM_SET_SREGS or the VM entry fails), so the guest would die of
 * a confusing fault on its next instruction instead of getting an error. */
#define ZB_USER_ADDR_LIMIT 0x7ffffffff000ull

/* ---- ELF loading (elf_loader.c) ---- */
int zb_elf_exec(zb_sandbox *sb, const char *exe_guest_path, const char *const *argv,
                const char *const *envp, char *err);

#endif
