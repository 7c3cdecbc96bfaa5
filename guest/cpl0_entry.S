/* cpl0_entry.S - the only code the guest ever runs at CPL0.
 *
 * On PVM hosts every CPL0 instruction is emulated (~800 ns each), so each entry point is a single
 * `out` that hands the event to the host; the host then resumes user mode itself with
 * KVM_SET_REGS + KVM_SET_SREGS (sysretq/iretq are never executed: sysretq at emulated CPL0 ends in
 * a shutdown on PVM).
 *
 * Entry for exception vector v sits at offset 8*v and does `out %al, $(0xc0 + v)`: the port tells
 * the host the vector without touching any register, and the IDT gate's IST stack holds the
 * hardware exception frame. `syscall` reaches the host the same way: LSTAR points at an address
 * that is never mapped, so the instruction fetch page-faults into vector 14 with the frame's RIP
 * equal to LSTAR (see native/run_loop.c).
 *
 * If the host ever resumed a stub, `hlt` would exit to the host as an error.
 */
    .text
    .code64
    .globl zb_cpl0_entry
zb_cpl0_entry:
    .set vector, 0
    .rept 32
    .org zb_cpl0_entry + vector * 8
    outb %al, $(0xc0 + vector)
    hlt
    jmp . - 1
    .set vector, vector + 1
    .endr
    .org zb_cpl0_entry + 32 * 8
