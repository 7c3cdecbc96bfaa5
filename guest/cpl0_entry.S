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
    /* The syscall entry page (runs at ZB_SYSCALL_ENTRY): a few syscalls whose answer is fixed
     * for the process are answered from the host-written zb_entry_data without an exit, when the
     * host has switched that on; rax is the only register they change (and the arithmetic flags,
     * which the host's own return does not keep under PVM either). Everything else: the `out`. */
    .set data, ZB_SYSCALL_ENTRY + ZB_ENTRY_DATA
    .set slots, zb_cpl0_entry + ZB_SYSCALL_ENTRY_OFFSET + ZB_ENTRY_SLOTS
    cmpl $ZB_ENTRY_ANSWERS_ON, data
    jne 9f
    cmpq $39, %rax          /* getpid */
    je slots
    cmpq $102, %rax         /* getuid */
    je slots + ZB_ENTRY_SLOT_SIZE
    cmpq $107, %rax         /* geteuid */
    je slots + ZB_ENTRY_SLOT_SIZE
    cmpq $104, %rax         /* getgid */
    je slots + 2 * ZB_ENTRY_SLOT_SIZE
    cmpq $108, %rax         /* getegid */
    je slots + 2 * ZB_ENTRY_SLOT_SIZE
    cmpq $13, %rax          /* rt_sigaction */
    je sig_code
    jmp fd_code
    .set slot, 0
    .rept ZB_ENTRY_SLOT_COUNT
    .org slots + slot * ZB_ENTRY_SLOT_SIZE
1:  movl data + 4 + 4 * slot, %eax
2:  jmp *%rcx
    .if 2b - 1b - ZB_ENTRY_SLOT_JMP
    .error "an entry slot's movl is not ZB_ENTRY_SLOT_JMP bytes long (the host finds the jmp there)"
    .endif
    .set slot, slot + 1
    .endr
    /* The per-fd answers (guest_abi.h): fd (rdi) bounded, open, then the call's own checks; only
     * compares until a slot, so rax is the syscall number everywhere before a slot's start. */
    .set fdslots, zb_cpl0_entry + ZB_SYSCALL_ENTRY_OFFSET + ZB_ENTRY_FD_SLOTS
    .org zb_cpl0_entry + ZB_SYSCALL_ENTRY_OFFSET + ZB_ENTRY_FD_CODE
fd_code:
    cmpl $ZB_ENTRY_CLOSE_NONE, ZB_ENTRY_CLOSE_SLOT /* a close waits: the host answers */
    jne 9f
    cmpq $ZB_ENTRY_FDS, %rdi
    jae 9f
    testb $ZB_EFD_OPEN, data + ZB_ENTRY_FD_STATE(%rdi)
    jz 9f
    cmpl %edi, data + ZB_ENTRY_READ_FD /* the file whose bytes the host read: its own dispatch */
    je read_dispatch
fd_answers:
    cmpq $8, %rax           /* lseek */
    je 3f
    cmpq $16, %rax          /* ioctl */
    je 4f
    cmpq $72, %rax          /* fcntl */
    jne timed_dispatch      /* (past the `out`: no room here) */
    cmpq $1, %rsi           /* F_GETFD */
    je fdslots + 2 * ZB_ENTRY_FD_SLOT_SIZE
    cmpq $3, %rsi           /* F_GETFL */
    je fdslots + 3 * ZB_ENTRY_FD_SLOT_SIZE
    jmp 9f
3:  testq %rsi, %rsi        /* offset 0 */
    jnz 9f
    cmpq $1, %rdx           /* SEEK_CUR */
    jne 9f
    testb $ZB_EFD_SEEK, data + ZB_ENTRY_FD_STATE(%rdi)
    jz 9f
    jmp fdslots
4:  cmpq $0x5401, %rsi      /* TCGETS */
    jne 9f
    testb $ZB_EFD_NOTTY, data + ZB_ENTRY_FD_STATE(%rdi)
    jnz fdslots + ZB_ENTRY_FD_SLOT_SIZE
    jmp 9f
    .org fdslots
    movq data + ZB_ENTRY_FD_OFFSET(, %rdi, 8), %rax
    jmp *%rcx
    .org fdslots + ZB_ENTRY_FD_SLOT_SIZE
    movq $-25, %rax         /* -ENOTTY */
    jmp *%rcx
    .org fdslots + 2 * ZB_ENTRY_FD_SLOT_SIZE
    movzbl data + ZB_ENTRY_FD_STATE(%rdi), %eax
    andl $ZB_EFD_CLOEXEC, %eax
    jmp *%rcx
    .org fdslots + 3 * ZB_ENTRY_FD_SLOT_SIZE
    movl data + ZB_ENTRY_FD_FLAGS(, %rdi, 4), %eax
    jmp *%rcx
    .org zb_cpl0_entry + ZB_SYSCALL_ENTRY_OFFSET + ZB_SYSCALL_ENTRY_OUT
9:  outb %al, $ZB_PORT_SYSCALL
2:  hlt
    jmp . - 1
    .if 2b - 9b - ZB_STUB_OUT_LEN
    .error "the syscall entry's out instruction is not ZB_STUB_OUT_LEN bytes long"
    .endif

    /* The timed answers (guest_abi.h ZB_ENTRY_TIMED): rax is the block's syscall number but in
     * the TSC window, where rdtsc takes rax and rdx and r11 keeps rdx. Padding is nops. r11 is
     * their scratch (`syscall` put RFLAGS there, which the host's return reads): a block that used
     * it goes to the `out` through 8f, which makes it what PVM reports (0x202) again. */
    .set timed, zb_cpl0_entry + ZB_SYSCALL_ENTRY_OFFSET + ZB_ENTRY_TIMED
    .org zb_cpl0_entry + ZB_SYSCALL_ENTRY_OFFSET + ZB_ENTRY_TIMED_DISPATCH, 0x90
timed_dispatch:
    testq %rax, %rax        /* read */
    je timed
    cmpq $262, %rax         /* newfstatat */
    je timed + ZB_ENTRY_TIMED_SIZE
    cmpq $217, %rax         /* getdents64 */
    je timed + 2 * ZB_ENTRY_TIMED_SIZE
    cmpq $3, %rax           /* close */
    je timed + 3 * ZB_ENTRY_TIMED_SIZE
    jmp 9b
    /* rax (the TSC) compared with the deadline; then rax = nr again (mov keeps the flags) */
    .macro tsc_window block, nr
    .org \block + ZB_ENTRY_TSC, 0x90
    movq %rdx, %r11
    rdtsc
    shlq $32, %rdx
    orq %rdx, %rax
    movq %r11, %rdx
    cmpq data + ZB_ENTRY_DEADLINE, %rax
    movl $\nr, %eax
    .org \block + ZB_ENTRY_TSC_END, 0x90
    jae 8f
    .endm
    /* Linux's access_ok(buf, count) of read and getdents64: the range must be user addresses
     * (and above the low region, which the host refuses too) */
    .macro user_range
    cmpq $ZB_LOW_REGION_BYTES, %rsi
    jb 9b
    movq %rsi, %r11
    addq %rdx, %r11
    jc 8f
    shrq $47, %r11
    jnz 8f
    .endm

    /* The read and getdents64 blocks' end: rax bytes from the buffer at pos (r11) to the user's
     * buffer (rdi), the registers the copy took back from ZB_ENTRY_READ_SAVE (rdi: read_fd), and
     * the commit to pos, which ends `done` bytes into the block, right before its `jmp *%rcx`. */
    .macro copy_commit done
    leaq ZB_ENTRY_READ_BUF(%r11), %rsi
    movq %rax, %rcx
    cld                     /* forwards (SFMASK clears DF at syscall; PVM may not have) */
    rep movsb               /* into the user's buffer (a fault here: the host serves the call) */
    movq ZB_ENTRY_READ_SAVE, %rsi
    movq ZB_ENTRY_READ_SAVE + 8, %rcx
    movslq data + ZB_ENTRY_READ_FD, %rdi
    .org block + \done - 7, 0x90
1:  addl %eax, ZB_ENTRY_READ_POS /* the commit */
2:  jmp *%rcx
    .if 2b - 1b - 7 /* the .org put 1b at done - 7 */
    .error "a position's add must end at its block's done offset"
    .endif
    .endm

    .org timed, 0x90        /* read(fd, buf, count) at the end of a regular file: 0 */
    testb $ZB_EFD_EOF, data + ZB_ENTRY_FD_STATE(%rdi)
    jz 9b
    user_range
    tsc_window timed, 0
    jmp *%rcx               /* rax = 0: nothing read */
8:  movl $0x202, %r11d
    jmp 9b

    .set block, timed + ZB_ENTRY_TIMED_SIZE
    .org block, 0x90        /* newfstatat(stat_fd, "", buf, AT_EMPTY_PATH): the host's stat bytes */
    cmpl data + ZB_ENTRY_STAT_FD, %edi
    jne 9b
    cmpq $0x1000, %r10      /* AT_EMPTY_PATH alone, as glibc's fstat passes it */
    jne 9b
    cmpb $0, (%rsi)         /* the empty path (a fault here: the host serves the call) */
    jne 9b
    tsc_window block, 262
    .set word, 0
    .rept ZB_ENTRY_STAT_BYTES / 8
    movq data + ZB_ENTRY_STAT + word, %r11
    movq %r11, word(%rdx)   /* the user's buffer (a fault here: the host serves the call) */
    .set word, word + 8
    .endr
    xorl %eax, %eax
    jmp *%rcx
8:  movl $0x202, %r11d
    jmp 9b

    .set block, timed + 2 * ZB_ENTRY_TIMED_SIZE
    .org block, 0x90        /* getdents64(fd, buf, count) of a listing read to its end: 0 */
    testb $ZB_EFD_DIR_END, data + ZB_ENTRY_FD_STATE(%rdi)
    jz 9b
    user_range
    xorl %eax, %eax
    jmp *%rcx
8:  movl $0x202, %r11d
    jmp 9b
    .set block, timed + 3 * ZB_ENTRY_TIMED_SIZE
    .org block, 0x90        /* close(fd) of a read-only file: deferred through the close slot */
    testb $ZB_EFD_CLOSE, data + ZB_ENTRY_FD_STATE(%rdi)
    jz 9b
    .org block + ZB_ENTRY_CLOSE_DONE - 7, 0x90
1:  movl %edi, ZB_ENTRY_CLOSE_SLOT /* the commit (fd_code saw the slot empty) */
2:  xorl %eax, %eax
    jmp *%rcx
    .if 2b - 1b - 7 /* the .org put 1b at ZB_ENTRY_CLOSE_DONE - 7 */
    .error "the close slot's store must end ZB_ENTRY_CLOSE_DONE bytes into its block"
    .endif
    /* rt_sigaction(sig, NULL, oldact, 8), a disposition query (guest_abi.h ZB_ENTRY_SIG_CODE):
     * not timed (only exits change a disposition); r11 is the scratch, rax stays 13 until the end */
    .if ZB_ENTRY_SIG_BLOCK - 3
    .error "the disposition query's code is in the close block's tail"
    .endif
    .org block + ZB_ENTRY_SIG_CODE, 0x90
sig_code:
    testq %rsi, %rsi        /* a new action: the host's */
    jnz 9b
    cmpq $8, %r10           /* the sigset size Linux accepts */
    jne 9b
    leaq -1(%rdi), %r11     /* 1 <= sig <= 64, as an unsigned 64-bit value */
    cmpq $ZB_ENTRY_SIGS - 1, %r11
    ja 8f
    testq %rdx, %rdx        /* no oldact: nothing to copy */
    jz 1f
    /* oldact on the caller's stack, within a page above rsp (glibc's sigaction passes its own
     * local there): live stack, so mapped. Anywhere else it may be memory the process has not
     * mapped, which the guest's page tables still reach but Linux answers EFAULT: the host's. */
    cmpq %rsp, %rdx
    jb 8f
    movq %rsp, %r11
    addq $ZB_ENTRY_SIG_STACK - 32, %r11
    jc 8f
    cmpq %r11, %rdx
    ja 8f
    cmpq $ZB_LOW_REGION_BYTES, %rdx /* access_ok(oldact, 32), as the read block's user_range */
    jb 8f
    movq %rdx, %r11
    addq $32, %r11
    jc 8f
    shrq $47, %r11
    jnz 8f
    .set field, 0
    .rept 4                 /* handler, flags, restorer, mask (a fault here: the host serves the call) */
    movq ZB_ENTRY_SIG_DATA + field * 8 * ZB_ENTRY_SIGS - 8(, %rdi, 8), %r11
    movq %r11, field * 8(%rdx)
    .set field, field + 1
    .endr
1:  xorl %eax, %eax
    jmp *%rcx
8:  movl $0x202, %r11d
    jmp 9b
    .set block, timed + 4 * ZB_ENTRY_TIMED_SIZE
    .org block, 0x90        /* read(read_fd, buf, count): the bytes the host read at the open */
    user_range
    tsc_window block, 0
    movl ZB_ENTRY_READ_POS, %r11d /* guest-writable: bounded by the size */
    cmpl data + ZB_ENTRY_READ_SIZE, %r11d
    ja 8f
    movl data + ZB_ENTRY_READ_SIZE, %eax
    subl %r11d, %eax        /* what is left */
    cmpq %rdx, %rax
    cmovaq %rdx, %rax       /* rax = the count read */
    movq %rsi, ZB_ENTRY_READ_SAVE
    movq %rcx, ZB_ENTRY_READ_SAVE + 8
    .org block + ZB_ENTRY_READ_COPY, 0x90
    movq %rsi, %rdi         /* from here to the commit the host restores rsi, rcx and rdi */
    copy_commit ZB_ENTRY_READ_DONE
8:  movl $0x202, %r11d
    jmp 9b
    .org block + ZB_ENTRY_READ_DISPATCH, 0x90
read_dispatch:              /* a call on read_fd, rax its number (compares only) */
    cmpl $0, data + ZB_ENTRY_READ_DIR
    jne 1f
    testq %rax, %rax        /* read */
    je block
    jmp 2f
1:  cmpq $217, %rax         /* a directory's getdents64 */
    je block + ZB_ENTRY_TIMED_SIZE
    testq %rax, %rax        /* a directory's read: EISDIR */
    je 9b
2:  cmpl $0, ZB_ENTRY_READ_POS
    je fd_answers           /* nothing read in the guest yet: the per-fd answers hold */
    cmpq $3, %rax           /* close: deferred as ever */
    je timed + 3 * ZB_ENTRY_TIMED_SIZE
    cmpq $262, %rax         /* newfstatat (the offset is not in a stat) */
    je timed + ZB_ENTRY_TIMED_SIZE
    jmp 9b                  /* the per-fd table's offset is old: the host answers */

    .set block, timed + 5 * ZB_ENTRY_TIMED_SIZE
    .org block, 0x90        /* getdents64(read_fd, buf, count) of a directory just opened */
    user_range
    movl ZB_ENTRY_READ_POS, %r11d /* guest-writable: bounded by the size */
    cmpl data + ZB_ENTRY_READ_SIZE, %r11d
    ja 8f
    movq %rsi, ZB_ENTRY_READ_SAVE
    movq %rcx, ZB_ENTRY_READ_SAVE + 8
    .org block + ZB_ENTRY_READ_COPY, 0x90
    movl %r11d, %esi        /* from here to the commit the host restores rsi, rcx and rdi */
    xorl %eax, %eax         /* rsi: the next record, rax: the bytes that fit */
1:  cmpl data + ZB_ENTRY_READ_SIZE, %esi
    jae 2f                  /* the end of the listing */
    movzwl ZB_ENTRY_READ_BUF + 16(%rsi), %ecx /* d_reclen (0 only if user code moved pos) */
    jrcxz 3f
    addq %rax, %rcx
    cmpq %rdx, %rcx
    ja 4f                   /* does not fit */
    subq %rax, %rcx
    addl %ecx, %esi
    addl %ecx, %eax
    jmp 1b
4:  testl %eax, %eax
    jnz 2f
3:  movq ZB_ENTRY_READ_SAVE, %rsi /* the host answers (EINVAL: not even one record fits) */
    movq ZB_ENTRY_READ_SAVE + 8, %rcx
    movslq data + ZB_ENTRY_READ_FD, %rdi
    movl $217, %eax
    jmp 8f
2:  movq ZB_ENTRY_READ_SAVE, %rdi /* the user's buffer */
    copy_commit ZB_ENTRY_DENTS_DONE
8:  movl $0x202, %r11d
    jmp 9b
    .org timed + ZB_ENTRY_TIMED_COUNT * ZB_ENTRY_TIMED_SIZE, 0x90
