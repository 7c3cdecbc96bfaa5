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

/* ---- ELF loading (elf_loader.c) ---- */
int zb_elf_exec(zb_sandbox *sb, const char *exe_guest_path, const char *const *argv,
                const char *const *envp, char *err);

#endif
