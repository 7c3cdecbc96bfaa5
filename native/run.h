/* run.h - the run loop layer (run_loop.c): KVM_RUN and its exits. */
#ifndef ZB_RUN_H
#define ZB_RUN_H
#include "util.h"

/* ---- run loop helpers (run_loop.c) ---- */
void zb_fault_event(zb_sandbox *sb, zb_event *ev, int signo, uint64_t rip, uint64_t addr,
                    const char *what);

#endif
