/* cpl0_entry.S - the only code the guest ever runs at CPL0.
 *
 * On PVM hosts every CPL0 instruction is emulated (~800 ns each), so each entry point is a single
 * `out` that hands the event to the host; the host then resumes user mode itself with
 * KVM_SET_REGS + KVM_SET_SREGS (sysretq/iretq are never executed: sysretq at emulated CPL0 ends in
 * a shutdown on PVM).
 *
 * Entry for exception vector v sits at offset ZB_STUB_SIZE * v and does
 * `out %al, $(ZB_PORT_EXCEPTION + v)`: the port tells the host the vector without touching any
 * register, and the IDT gate's IST stack holds the hardware exception frame. `syscall` reaches the
 * host through the entry after the stubs, which the host copies to its own page ZB_SYSCALL_ENTRY
 * (LSTAR; see guest_abi.h): `out %al, $ZB_PORT_SYSCALL`, run at CPL3 on PVM and at CPL0 on VMX.
 * The numbers are the guest ABI's (guest_abi.h); the assembler checks that
 * the code fits them (a stub longer than ZB_STUB_SIZE makes the next `.org` move backwards: an
 * error).
 *
 * If the host ever resumed a stub, `hlt` would exit to the host as an error.
 */
#include "guest_abi.h"

    .text
    .code64
    .globl zb_cpl0_entry
zb_cpl0_entry:
    .set vector, 0
    .rept ZB_STUB_VECTORS
    .org zb_cpl0_entry + vector * ZB_STUB_SIZE
1:  outb %al, $(ZB_PORT_EXCEPTION + vector)
2:  hlt
    jmp . - 1
    .if 2b - 1b - ZB_STUB_OUT_LEN
    .error "the stub's out instruction is not ZB_STUB_OUT_LEN bytes long (the host expects RIP after it)"
    .endif
    .set vector, vector + 1
    .endr
    .org zb_cpl0_entry + ZB_SYSCALL_ENTRY_OFFSET
1:  outb %al, $ZB_PORT_SYSCALL
2:  hlt
    jmp . - 1
    .if 2b - 1b - ZB_STUB_OUT_LEN
    .error "the syscall entry's out instruction is not ZB_STUB_OUT_LEN bytes long"
    .endif
