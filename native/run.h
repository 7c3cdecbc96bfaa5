/* run.h - the run loop layer (run_loop.c): KVM_RUN and its exits. */
#ifndef ZB_RUN_H
#define ZB_RUN_H
#include "util.h"
#include "vm.h"

/* ---- run loop helpers (run_loop.c) ---- */
void zb_fault_event(zb_sandbox *sb, zb_event *ev, int signo, uint64_t rip, uint64_t addr,
                    const char *what);
/* For run_threads.c: an ERROR event that finishes the sandbox; delivering pending signals (1 if an
 * event ends the run); entering user mode with sb->cpu.regs; making sb->cpu.regs the vCPU's user
 * state (1: mid-trap, there is none yet; -1 error). */
void zb_run_error(zb_sandbox *sb, zb_event *ev, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int zb_run_deliver_signals(zb_sandbox *sb, zb_event *ev);
int zb_run_set_user_state(zb_sandbox *sb, zb_vm *vm, zb_event *ev);
int zb_run_sync_regs(zb_sandbox *sb, zb_vm *vm, zb_event *ev);


/* One process's run (what zb_sandbox_run is without a family): family_run.c's scheduler runs
 * every process of a family through it. It may also end with ZB_EVENT_PROC_YIELD (process.h). */
int zb_run_one(zb_sandbox *sb, int64_t deadline_ns, zb_event *ev);

/* ---- guest threads on the one vCPU (run_threads.c) ---- */
/* The running thread's syscall returned ZB_SYSCALL_BLOCK (it waits or exits): switch. syscall
 * number nr is served again later for a yielded one. 0, or 1 if an event ends the run. */
int zb_run_threads_block(zb_sandbox *sb, zb_vm *vm, uint64_t nr, zb_event *ev);
/* After any syscall of a sandbox with threads: a clone's XSAVE copy, a sched_yield's switch. */
int zb_run_threads_after_syscall(zb_sandbox *sb, zb_vm *vm, zb_event *ev);
/* At the start of a run: route signals raised meanwhile, resume waiting threads. */
int zb_run_threads_start(zb_sandbox *sb, zb_vm *vm, zb_event *ev);
/* A thread of sb, a process that is not running, was woken from another process (a shared futex,
 * shared_map.c) and it is sb's current slot: a RUNNABLE current slot means loaded (its state in
 * sb->cpu), so its parked state goes there, as a thread switch would load it, and sb's vCPU is
 * reloaded from it before sb runs again (vcpu_stale: sb may have stayed attached to its executor). */
void zb_run_threads_load_parked(zb_sandbox *sb);
/* At every turn of the run loop with several threads: timeouts, signals, the time slice. */
int zb_run_threads_tick(zb_sandbox *sb, zb_vm *vm, zb_event *ev);

#endif
