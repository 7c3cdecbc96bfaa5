/* guest_abi.h - the contract between the engine (native/) and the code it puts into every guest
 * (guest/cpl0_entry.S, guest/vdso.c): addresses, ports and layouts that both sides must agree on.
 *
 * The one copy of these numbers: the engine files that use them include it, the guest's C and
 * assembly directly (gcc runs the C preprocessor on .S files, so the C-only parts are kept out of
 * the assembler's view with __ASSEMBLER__). docs/ARCHITECTURE.md section 2 explains the ABI.
 * Only preprocessor constants and plain C types: no engine headers, no libc beyond <stdint.h>
 * (the vDSO is built with -nostdlib).
 */
#ifndef ZB_GUEST_ABI_H
#define ZB_GUEST_ABI_H

/* ---- syscalls and exceptions ----
 * LSTAR points at ZB_SYSCALL_TRAP, which is never mapped: `syscall` page-faults into vector 14
 * with the frame's RIP equal to it. Every exception vector v < ZB_STUB_VECTORS enters the CPL0
 * stub at ZB_STUBS_GPA + v * ZB_STUB_SIZE, whose first instruction is `out %al, $(ZB_PORT_EXCEPTION
 * + v)` (ZB_STUB_OUT_LEN bytes long): the port tells the host the vector, and the host finds the
 * vCPU's RIP just after that `out`. */
#define ZB_SYSCALL_TRAP 0x7f0000000000 /* LSTAR */
#define ZB_STUBS_GPA 0x8000            /* the CPL0 stubs, in the supervisor-only low 2 MiB */
#define ZB_STUB_VECTORS 32             /* one stub per CPU exception vector */
#define ZB_STUB_SIZE 8                 /* bytes from one stub to the next */
#define ZB_STUB_OUT_LEN 2              /* `outb %al, $imm8`: e6 ib */
#define ZB_PORT_EXCEPTION 0xc0         /* ports 0xc0 .. 0xc0 + ZB_STUB_VECTORS - 1 */

/* ---- the UART (COM1): the only ports user code may touch (TSS I/O bitmap) ---- */
#define ZB_UART_BASE 0x3f8
#define ZB_UART_PORTS 8

/* ---- the vDSO's data page ----
 * One page right below the vDSO image (the guest finds it from the image's ELF header), written by
 * the host every time the sandbox starts running (native/vdso_page.c), read by guest/vdso.c. */
#define ZB_VDSO_DATA_SIZE 4096

#ifndef __ASSEMBLER__
#include <stdint.h>

struct zb_vdso_data {
    uint64_t tsc0;       /* guest TSC when the host took the base times */
    uint64_t mult;       /* ns per TSC tick, 32.32 fixed point; 0 = unknown: use the syscall */
    int64_t mono_ns, real_ns, boot_ns;
    int64_t raw_ns;      /* CLOCK_MONOTONIC_RAW: not slewed by NTP, so its own base */
    uint64_t generation; /* bumped by every rewrite: a guest reader stopped mid-read retries */
};
_Static_assert(sizeof(struct zb_vdso_data) <= ZB_VDSO_DATA_SIZE, "the vDSO data must fit its page");
#endif

#endif
