/* trap_signal.c - a host signal that arrives while a syscall is on its way to the host.
 * The test stops the run inside the syscall's trap (at the entry LSTAR points at, before its
 * `out`: the host has not seen it yet), raises SIGUSR1 and resumes: getppid must still return 0 and
 * the handler must run exactly once, after it. (getppid: getpid never reaches the `out` on PVM, the
 * entry answers it in the guest.) */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile int handled;

static void on_usr1(int sig) { (void)sig; handled++; }

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    if (sigaction(SIGUSR1, &sa, NULL) < 0) return 2;
    syscall(SYS_write, 1, "READY\n", 6);
    long ppid = syscall(SYS_getppid); /* the test stops the run in this call's trap */
    char line[64];
    int n = snprintf(line, sizeof line, "ppid=%ld handled=%d\n", ppid, handled);
    syscall(SYS_write, 1, line, (size_t)n);
    return 0;
}
