/* util.c - the small services every layer uses: error messages, the sandbox log, the clock. */
#include "util.h"
#include "sandbox_state.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

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

int zb_self_pagemap_fd(void) {
    /* the fd and the pid that opened it, in one word so that threads agree on both */
    static _Atomic uint64_t cached; /* 0: none yet; else pid << 32 | fd */
    uint64_t pid = (uint64_t)getpid();
    for (;;) {
        uint64_t now = atomic_load(&cached);
        if (now && now >> 32 == pid) return (int)(uint32_t)now;
        int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
        if (fd < 0) return -1;
        if (atomic_compare_exchange_strong(&cached, &now, pid << 32 | (uint32_t)fd)) {
            if (now) close((int)(uint32_t)now); /* a forked child's copy of its parent's */
            return fd;
        }
        close(fd); /* another thread was first: use its */
    }
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
