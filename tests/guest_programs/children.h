/* children.h - helpers for guest programs that fork: start a child, end it, check how it ended.
 *
 * Children report failed checks through their exit status (child_exit), since only the parent
 * prints PASS. Include after check.h.
 */
#ifndef ZB_GUEST_CHILDREN_H
#define ZB_GUEST_CHILDREN_H
#include "check.h"

#include <sys/wait.h>

/* A child ends: with its failures (100 + n) if any check failed, else with code. */
static inline void child_exit(int code) { _exit(zb_failures ? 100 + zb_failures : code); }

/* fork() with stdio flushed first, so that buffered output is not written twice. */
static inline pid_t fork_or_fail(void) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) FAIL("fork: %s", strerror(errno));
    return pid;
}

static inline void expect_exit(pid_t pid, int code) {
    int st = 0;
    CHECK_EQ(OK(waitpid(pid, &st, 0)), pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == code, "pid %d: status 0x%x, want exit %d", pid, st, code);
}

static inline void expect_signal(pid_t pid, int sig) {
    int st = 0;
    CHECK_EQ(OK(waitpid(pid, &st, 0)), pid);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == sig, "pid %d: status 0x%x, want signal %d", pid, st, sig);
}
#endif
