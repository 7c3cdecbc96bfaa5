/* syscalls.c - the syscall table: each family registers its handlers (sys_*.c); anything else is
 * answered with ENOSYS, counted, and logged once per syscall name for the sandbox.
 * The table is filled once per process and read-only afterwards.
 */
#include "util.h"
#include "sandbox_state.h"
#include "linux.h"
#include "guest_abi.h"

extern const char *const zb_syscall_names[ZB_SYSCALL_MAX]; /* generated from <asm/unistd_64.h> */

static zb_syscall_fn table[ZB_SYSCALL_MAX];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void fill_table(void) {
    zb_sys_memory_register(table);
    zb_sys_files_register(table);
    zb_sys_fsmeta_register(table);
    zb_sys_time_register(table);
    zb_sys_process_register(table);
    zb_sys_signals_register(table);
    zb_sys_poll_register(table);
    zb_sys_itimer_register(table);
    zb_sys_socket_register(table);
    zb_sys_inet_register(table);
    zb_sys_epoll_register(table);
    zb_sys_eventfd_register(table);
    zb_sys_threads_register(table);
    zb_sys_exec_register(table);
    zb_sys_procs_register(table);
    zb_sys_memfd_register(table);
    zb_sys_copy_register(table);
    zb_sys_priority_register(table);
}

const char *zb_syscall_name(uint64_t nr) {
    if (nr == ZB_SYS_STAT_MANY) return "zb_stat_many";
    return nr < ZB_SYSCALL_MAX && zb_syscall_names[nr] ? zb_syscall_names[nr] : "unknown";
}

long zb_syscall_dispatch(zb_sandbox *sb, uint64_t nr, const uint64_t a[6]) {
    pthread_once(&table_once, fill_table);
    if (nr < ZB_SYSCALL_MAX && table[nr]) {
        zb_syscall_serial++; /* odd: inside this syscall (util.h) */
        long rc = table[nr](sb, a);
        zb_syscall_serial++;
        return rc;
    }
    sb->stats.unknown_syscalls++;
    uint64_t bit = nr < ZB_SYSCALL_MAX ? nr : ZB_SYSCALL_MAX - 1;
    if (!(sb->logged_unknown[bit / 64] & (1ull << (bit % 64)))) {
        sb->logged_unknown[bit / 64] |= 1ull << (bit % 64);
        zb_log(sb, "unimplemented syscall %s (%llu) answered ENOSYS", zb_syscall_name(nr), (unsigned long long)nr);
    }
    return -ENOSYS;
}
