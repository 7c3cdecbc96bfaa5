/* util.h - the host layer, the bottom of the engine (docs/ARCHITECTURE.md section 7): page
 * arithmetic, error messages, the sandbox log, the clock (util.c). Every other internal header
 * includes it first: it defines _GNU_SOURCE before any system header, and brings the C library
 * headers every file of the engine uses. Not part of the cffi contract (zeroboot.h is).
 */
#ifndef ZB_UTIL_H
#define ZB_UTIL_H
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "zeroboot.h"

#define ZB_PAGE 4096ul
#define ZB_PAGE_UP(x) (((x) + ZB_PAGE - 1) & ~(ZB_PAGE - 1))
#define ZB_PAGE_DOWN(x) ((x) & ~(ZB_PAGE - 1))
#define ZB_HUGE (2ul << 20)
#define ZB_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ZB_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- errors, logging, the clock (util.c) ---- */
/* Format an error message into err (ZB_ERRLEN bytes; NULL: dropped). */
void zb_seterr(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append a line to the sandbox's log (zb_sandbox_take_log drains it). */
void zb_log(zb_sandbox *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Host CLOCK_MONOTONIC in ns. */
int64_t zb_now_ns(void);
/* This process's /proc/self/pagemap, opened once (an open costs more than a scan of the unlogged
 * window at every snapshot); callers do not close it. It is bound to the process that opened it,
 * so a forked engine process opens its own. -1 with errno if it cannot be opened. */
int zb_self_pagemap_fd(void);
/* seccomp.c: the filter of a lockdown phase (ZB_LOCKDOWN_*), with the client socket calls a
 * network policy needs when `network` is set (zb_engine_lockdown in kvm_vm.c decides). */
int zb_seccomp_lockdown(int phase, int network, char *err);

/* Host system calls made on the guest's behalf, counted per thread for the syscall profile
 * (zb_syscall_nr_profile.host_calls): the file layer wraps each call it makes while serving a
 * guest syscall in ZB_HOSTCALL. A thread-local increment: free whether profiling is on or not. */
extern __thread uint64_t zb_host_calls;
/* Bumped by every syscall the host serves (run_loop.c serve_syscall), from 1: a hint stamped with
 * it (the timed answers, guest_abi.h) holds only until the next one. Atomic: the executors of a
 * family may run on other threads, and a file can be shared between them. */
extern _Atomic uint64_t zb_syscall_seq;
#define ZB_HOSTCALL(call) (zb_host_calls++, (call))
/* Odd while this thread serves a guest syscall (zb_syscall_dispatch bumps it on entry and on
 * return): what one syscall learned from the host (a path walk's lstat, fs.h zb_walk_stat_get)
 * is reused within that syscall only, never by a later one. */
extern __thread uint64_t zb_syscall_serial;

#endif
