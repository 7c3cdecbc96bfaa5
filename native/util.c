/* util.c - the small services every layer uses: error messages, the sandbox log, the clock. */
#include "util.h"
#include "sandbox_state.h"

#include <time.h>

void zb_seterr(char *err, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, ZB_ERRLEN, fmt, ap);
    va_end(ap);
}

__thread uint64_t zb_host_calls;
_Atomic uint64_t zb_syscall_seq = 1;
__thread uint64_t zb_syscall_serial;

int64_t zb_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

void zb_log(zb_sandbox *sb, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    n = ZB_MIN(n, (int)sizeof line - 2);
    line[n++] = '\n';
    if (sb->log_len + (size_t)n > sizeof sb->log) return; /* full: the caller drains it after each run */
    memcpy(sb->log + sb->log_len, line, (size_t)n);
    sb->log_len += (size_t)n;
}
