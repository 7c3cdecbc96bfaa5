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
 * Every exception vector v < ZB_STUB_VECTORS enters the CPL0 stub at ZB_STUBS_GPA + v *
 * ZB_STUB_SIZE, whose first instruction is `out %al, $(ZB_PORT_EXCEPTION + v)` (ZB_STUB_OUT_LEN
 * bytes long): the port tells the host the vector, and the host finds the vCPU's RIP just after
 * that `out`.
 *
 * `syscall` enters ZB_SYSCALL_ENTRY (LSTAR): a page of its own in the low 2 MiB that user code may
 * read and execute but nobody can write (user, read-only, CR0.WP), holding `out %al,
 * $ZB_PORT_SYSCALL` (the entry code's offset in the stub blob is ZB_SYSCALL_ENTRY_OFFSET). On PVM
 * `syscall` reaches LSTAR still at CPL3 (a fetch there is a user-mode fetch), so that `out` - the
 * TSS I/O bitmap lets user code use this one port - exits straight to the host: no page fault, no
 * IDT/IST delivery, no emulated CPL0 instruction. On VMX it runs at CPL0 (no SMEP) to the same
 * effect. The host takes an exit on ZB_PORT_SYSCALL with RIP == ZB_SYSCALL_ENTRY +
 * ZB_STUB_OUT_LEN as a syscall (rcx = the return address); user code that jumps there itself has
 * made a syscall by other means, nothing more.
 *
 * Rewritten syscall sites (native/syscall_sites.c): the host may replace a `syscall` (0f 05) that
 * user code just ran with `out %al, $ZB_PORT_SYSCALL` (ZB_SITE_OUT_0 ZB_PORT_SYSCALL: two bytes,
 * the same length, so no other instruction moves). An `out` to the port from anywhere but the
 * entry page is a syscall: RIP returns past it, rcx and r11 get what `syscall` gives them (the
 * return address, RFLAGS). On PVM it skips the `syscall` instruction's own trip to LSTAR (~13 of a
 * ~52 us round trip here). Only where that is invisible to anything but the process itself: its
 * private mappings (never a MAP_SHARED one, whose bytes are a file's or another process's), both
 * bytes in one page, and not for the numbers the entry answers in the guest. An `in` from the port
 * ends the sandbox.
 *
 * Stubbed syscall sites (native/syscall_sites.c): a site calling a number the entry answers in the
 * guest is better off reaching the entry's answers without the `syscall` instruction, whose trip
 * to LSTAR costs ~13 us on PVM even when the entry then answers in a few instructions. Where such
 * a site is glibc's `mov $nr, %eax; syscall` (b8 imm32 0f 05), the host replaces the `mov` (five
 * bytes) with a `jmp rel32` (e9) to a stub of its own in the process's stub page, and leaves the
 * `syscall` bytes as they are (a jump straight to them still makes the syscall). The stub does what
 * the `mov` and the `syscall` did for the entry: eax = nr, rcx = the return address (the site + 7),
 * r11 = 0x202 (RFLAGS as PVM reports them at LSTAR), then jumps to ZB_SYSCALL_ENTRY, which answers
 * (`jmp *%rcx`) or exits through its `out` as for any `syscall`. No stack is touched, so a leaf
 * function's red zone is safe. The stub page is the page after the vDSO image (ZB_SITE_STUBS):
 * its first qword holds ZB_SYSCALL_ENTRY (the stubs' `jmp *` reads it; written with each stub), then ZB_SITE_STUB_SLOTS
 * slots of ZB_SITE_STUB_SIZE bytes; a slot is free while its first byte is 0. Only on PVM with the
 * answers on (elsewhere the entry runs at CPL0 and the `out` rewrite serves every number). */
#define ZB_SYSCALL_ENTRY 0xe000        /* LSTAR */
/* zeroboot's own syscalls, for the guest agent (guest/_zeroboot_agent reads these two lines):
 * numbers from 400 up in x86-64's unused range 335-423 (syscall_64.tbl goes from rseq, 334, to
 * 424, where the numbers common to all architectures start), so that Linux never gives them
 * another meaning; on Linux they fail with ENOSYS and the agent does without (the tests use 423
 * as a number nothing implements).
 * ZB_SYS_STAT_MANY(const char *const paths[n], n, struct stat out[n], int32_t errors[n], 0):
 * stat(2) of each path (relative to the cwd, symlinks followed), one exit for all of them;
 * errors[i] is 0 (out[i] holds the result) or the errno stat would have set. Returns n, or -EINVAL
 * (n > ZB_STAT_MANY_MAX, flags not 0), -EFAULT (paths, out or errors not writable/readable). */
#define ZB_SYS_STAT_MANY 400
#define ZB_STAT_MANY_MAX 1024
#define ZB_LOW_REGION_BYTES 0x200000   /* the low 2 MiB: supervisor-only but this page; no user buffer */
/* The entry page's layout (offsets from ZB_SYSCALL_ENTRY; cpl0_entry.S checks them with .org):
 * at 0 the dispatch of the syscalls answered in the guest, each slot ZB_ENTRY_SLOT_SIZE bytes from
 * ZB_ENTRY_SLOTS (`movl <data>, %eax` then, ZB_ENTRY_SLOT_JMP bytes in, `jmp *%rcx`), the `out`
 * at ZB_SYSCALL_ENTRY_OUT, and struct zb_entry_data at ZB_ENTRY_DATA. The dispatch answers only
 * when the host has written ZB_ENTRY_ANSWERS_ON into zb_entry_data.on (PVM, where the entry runs
 * at CPL3 so its `jmp *%rcx` back to user code keeps CPL3; never on VMX, where it runs at CPL0);
 * every other call, and every call while `on` is anything else, reaches the `out`. */
#define ZB_SYSCALL_ENTRY_OUT 0x180
#define ZB_ENTRY_SLOTS 0x40
#define ZB_ENTRY_SLOT_SIZE 0x10
#define ZB_ENTRY_SLOT_COUNT 3          /* getpid; getuid/geteuid; getgid/getegid */
#define ZB_ENTRY_SLOT_JMP 7            /* `movl abs32, %eax` is 7 bytes */
/* The per-fd answers (issue 24): a call on fd < ZB_ENTRY_FDS whose zb_entry_data.fd_state says
 * ZB_EFD_OPEN is checked by the code at ZB_ENTRY_FD_CODE and, when answerable, answered by one of
 * ZB_ENTRY_FD_SLOT_COUNT slots from ZB_ENTRY_FD_SLOTS (each ZB_ENTRY_FD_SLOT_SIZE bytes: the
 * instructions that set rax, then `jmp *%rcx`; rax keeps the syscall number until the slot's
 * first instruction, so a vCPU stopped past a slot's start is moved to the `out` with rax = the
 * slot's syscall). Slots, in order: lseek(fd, 0, SEEK_CUR) of a file whose ZB_EFD_SEEK is set
 * (its offset); ioctl(fd, TCGETS) of a file whose ZB_EFD_NOTTY is set (-ENOTTY: not a terminal;
 * a pty's ends exit to file_pty.c); fcntl(fd, F_GETFD);
 * fcntl(fd, F_GETFL).
 *
 * Two answers hold only until zb_entry_data.deadline_tsc (guest TSC), a moment the host sets a
 * 2 ms after the exit that took them, because the host file behind them can change (the
 * user edits it in JupyterLab): as if the call had run at that exit, which Linux allows a call
 * racing with another writer. From ZB_ENTRY_TIMED: read(fd, buf, count) = 0 of a file whose
 * ZB_EFD_EOF is set (a regular file whose last read, in that exit, ended at its end), and
 * newfstatat(stat_fd, "", buf, AT_EMPTY_PATH) = 0 with the bytes of `stat` (the file the exit
 * opened as stat_fd, stated in that exit), the copy done by the entry with the user's own rights.
 * A directory's getdents64 = 0 once its listing is read to the end (ZB_EFD_DIR_END) has no
 * deadline: a listing is taken once and kept (file_dir.c). A buffer below ZB_LOW_REGION_BYTES or
 * past the user half goes to the host (EFAULT); one in memory the process has not mapped does
 * not (the guest's page tables map all its memory): there read and getdents64 say 0 and the
 * fstat is written, where the host says EFAULT. Each timed code block is ZB_ENTRY_TIMED_SIZE
 * bytes from ZB_ENTRY_TIMED, in the order read, newfstatat, getdents64, close, read of read_fd,
 * getdents64 of read_fd;
 * in a block rax is the block's syscall number except between ZB_ENTRY_TSC and ZB_ENTRY_TSC_END bytes
 * in (the TSC read, with rdx kept in r11 there), so a vCPU stopped or faulting in a block is moved
 * to the `out` with rax = the block's syscall and, in that window, rdx = r11.
 *
 * close(fd) of a file whose ZB_EFD_CLOSE is set (a read-only host, overlay or directory file:
 * closing it only drops the fd, nothing else can observe it) is deferred, not served: the fourth
 * timed block (it has no deadline) stores fd into the int32 at ZB_ENTRY_CLOSE_SLOT, which must
 * hold ZB_ENTRY_CLOSE_NONE, and answers 0. The host takes that slot right after every KVM_RUN,
 * before it serves anything or looks at the fd table, closes the fd if ZB_EFD_CLOSE still allows
 * it (user code can write the slot: any other value is ignored) and writes ZB_ENTRY_CLOSE_NONE
 * back. While a close waits, the per-fd code sends every call to the `out` (fd_state still says
 * the fd is open). The store is the commit: a vCPU stopped before ZB_ENTRY_CLOSE_DONE bytes into
 * the block is moved to the `out` with rax = close; one stopped at or past it has closed the fd
 * and returns to user code with rax = 0. A close pays no exit; the next exit pays the close.
 *
 * read(read_fd, buf, count) of the regular file the exit just served opened (read-only, at offset
 * 0, at most ZB_ENTRY_READ_BYTES long) is answered from the file's bytes, which that exit read
 * into the user read-only pages at ZB_ENTRY_READ_BUF (read_size of them: the whole file then):
 * the fifth timed block (a deadline as the others) copies min(count, read_size - pos) bytes from
 * buffer + pos, pos being the uint32 at ZB_ENTRY_READ_POS (the close slot's page; the host writes
 * 0 there when it fills the buffer), and adds the count to pos. The host takes pos right after
 * every KVM_RUN, before the deferred close (the guest's value, bounded by read_size: user code can
 * write it, which is worth an lseek), and makes it the file's offset. The block keeps rsi and rcx
 * at ZB_ENTRY_READ_SAVE (two uint64) while the copy has them: a vCPU stopped or faulting between
 * ZB_ENTRY_READ_COPY and ZB_ENTRY_READ_DONE bytes into the block gets rsi and rcx back from there
 * and rdi = read_fd; one at ZB_ENTRY_READ_DONE (the `jmp *%rcx`, after the commit to pos) returns
 * to user code with rax = the count. Every call on read_fd goes to the code at
 * ZB_ENTRY_READ_DISPATCH in that block (compares only): read to the block, and once pos is not 0,
 * close and fstat to theirs and everything else to the `out` (the per-fd table's offset is old).
 * When read_dir is 1, read_fd is a directory just opened as opendir() opens one (O_DIRECTORY |
 * O_NONBLOCK) whose whole listing fits, and the buffer holds its getdents64 records: getdents64
 * goes to the sixth block instead (no deadline, as a listing is kept), which copies the whole
 * records from pos that fit in count (the host answers when not even one fits: EINVAL), and read
 * to the `out` (EISDIR). The host makes the records read the directory's offset. Its copy window
 * is ZB_ENTRY_READ_COPY to ZB_ENTRY_DENTS_DONE, and stopped at ZB_ENTRY_DENTS_DONE the call has
 * happened, as in the read block. */
#define ZB_ENTRY_FD_CODE 0x70
#define ZB_ENTRY_FD_SLOTS 0x110
#define ZB_ENTRY_FD_SLOT_SIZE 0x10
#define ZB_ENTRY_FD_SLOT_COUNT 4
#define ZB_ENTRY_FDS 64
#define ZB_EFD_CLOEXEC 0x01            /* = FD_CLOEXEC: F_GETFD's answer is fd_state & 1 */
#define ZB_EFD_OPEN 0x02               /* the fd is open: F_GETFD and F_GETFL answer */
#define ZB_EFD_SEEK 0x04               /* lseek(fd, 0, SEEK_CUR) answers fd_offset */
#define ZB_EFD_NOTTY 0x08              /* not a terminal: ioctl(fd, TCGETS) answers -ENOTTY */
#define ZB_EFD_EOF 0x10                /* read(fd, ...) answers 0 until deadline_tsc */
#define ZB_EFD_DIR_END 0x20            /* getdents64(fd, ...) answers 0 */
#define ZB_EFD_CLOSE 0x40              /* close(fd) may be deferred through the close slot */
#define ZB_ENTRY_TIMED_DISPATCH 0x1c0 /* the fd code's jump to the timed blocks */
#define ZB_ENTRY_TIMED 0x200
#define ZB_ENTRY_TIMED_SIZE 0x180
#define ZB_ENTRY_TIMED_COUNT 6         /* read, newfstatat, getdents64, close, read and getdents64 of read_fd */
#define ZB_ENTRY_TSC 0x30              /* the TSC read in a block that has one (read, newfstatat) */
#define ZB_ENTRY_TSC_END 0x50
#define ZB_ENTRY_CLOSE_DONE 0x20       /* in the close block: the slot's store ends here (committed) */
#define ZB_ENTRY_CLOSE_SLOT 0xf000     /* the page after the entry: user read-write, the deferred close */
#define ZB_ENTRY_CLOSE_NONE (-1)       /* the slot's value when no close waits */
#define ZB_ENTRY_READ_POS (ZB_ENTRY_CLOSE_SLOT + 4)  /* uint32: the guest's position in read_fd */
#define ZB_ENTRY_READ_SAVE (ZB_ENTRY_CLOSE_SLOT + 8) /* rsi, rcx while the read block copies */
#define ZB_ENTRY_READ_BUF 0x100000     /* user read-only pages of the low 2 MiB: read_fd's bytes */
#define ZB_ENTRY_READ_BYTES 0x10000    /* the largest file read at its open (64 KiB) */
#define ZB_ENTRY_READ_COPY 0x90        /* in the read block: the registers are the copy's from here */
#define ZB_ENTRY_READ_DONE 0xc0        /* ... to here, its `jmp *%rcx` (pos committed) */
#define ZB_ENTRY_DENTS_DONE 0x120      /* the same in the getdents64 block */
/* The disposition query (issue 15: CPython's subprocess child asks for all 64 dispositions before
 * its exec, 60 exits of ~22 us here, 12% of a subprocess.run): rt_sigaction(sig, NULL, oldact, 8)
 * with 1 <= sig <= 64 and oldact on the caller's stack (within ZB_ENTRY_SIG_STACK above rsp, where
 * glibc's sigaction puts it; elsewhere it may be memory the process has not mapped, which Linux
 * answers EFAULT: the host's answer) copies the process's disposition of sig from
 * zb_entry_sigactions at ZB_ENTRY_SIG_DATA, a user read-only page of the low 2 MiB that the host
 * writes before every KVM_RUN, as zb_entry_data. Its code sits in the close block's tail, from
 * ZB_ENTRY_SIG_CODE; a vCPU stopped or faulting there is moved to the `out` as rt_sigaction (a
 * copy made twice is the same copy). */
#define ZB_ENTRY_SIG_BLOCK 3           /* the close block (ZB_ENTRY_TIMED + 3 * ZB_ENTRY_TIMED_SIZE) */
#define ZB_ENTRY_SIG_CODE 0x80         /* in that block: past the close's own code */
#define ZB_ENTRY_SIG_DATA 0x110000     /* right after the read buffer */
#define ZB_ENTRY_SIGS 64
#define ZB_ENTRY_SIG_STACK 4096        /* oldact within this many bytes above rsp, else the host answers */
#define ZB_ENTRY_READ_DISPATCH 0x100   /* in the read block: the calls on read_fd, compares only */
#define ZB_ENTRY_STAT_BYTES 144        /* struct stat on x86-64 */
#define ZB_ENTRY_DATA 0xb00          /* right after the timed blocks */
#define ZB_ENTRY_FD_STATE 16           /* offsets in struct zb_entry_data, for the assembler */
#define ZB_ENTRY_FD_FLAGS (ZB_ENTRY_FD_STATE + ZB_ENTRY_FDS)
#define ZB_ENTRY_FD_OFFSET (ZB_ENTRY_FD_FLAGS + 4 * ZB_ENTRY_FDS)
#define ZB_ENTRY_DEADLINE (ZB_ENTRY_FD_OFFSET + 8 * ZB_ENTRY_FDS)
#define ZB_ENTRY_STAT_FD (ZB_ENTRY_DEADLINE + 8)
#define ZB_ENTRY_STAT (ZB_ENTRY_STAT_FD + 8)
#define ZB_ENTRY_READ_FD (ZB_ENTRY_STAT + ZB_ENTRY_STAT_BYTES)
#define ZB_ENTRY_READ_SIZE (ZB_ENTRY_READ_FD + 4)
#define ZB_ENTRY_READ_DIR (ZB_ENTRY_READ_SIZE + 4)
#define ZB_ENTRY_ANSWERS_ON 0x7a627361 /* any other value: every syscall exits */
#define ZB_PORT_SYSCALL 0xe0           /* above the exception ports */
#define ZB_SITE_OUT_0 0xe6             /* `out %al, $imm8`'s opcode: a rewritten site is ZB_SITE_OUT_0 ZB_PORT_SYSCALL */
/* The syscall numbers cpl0_entry.S may answer in the guest (each `cmpq $N, %rax` there; a test
 * checks the two agree): a site calling one of them keeps its `syscall` while the answers are on. */
#define ZB_ENTRY_ANSWERED_NRS 0, 3, 8, 13, 16, 39, 72, 102, 104, 107, 108, 217, 262
#define ZB_SITE_MOV_EAX 0xb8           /* `mov $imm32, %eax`: a stubbed site's first five bytes were b8 imm32 */
#define ZB_SITE_JMP 0xe9               /* `jmp rel32`: what the host writes there */
#define ZB_SITE_STUB_SIZE 32           /* bytes from one stub slot to the next */
#define ZB_SITE_STUB_SLOTS 127         /* slots after the entry pointer in the page's first slot */
#define ZB_SYSCALL_TRAP 0x7f0000000000 /* never mapped (the LSTAR of earlier engines; the fuzzer's wild pointer) */
#define ZB_STUBS_GPA 0x8000            /* the CPL0 stubs, in the supervisor-only low 2 MiB */
#define ZB_STUB_VECTORS 32             /* one stub per CPU exception vector */
#define ZB_STUB_SIZE 8                 /* bytes from one stub to the next */
#define ZB_SYSCALL_ENTRY_OFFSET (ZB_STUB_VECTORS * ZB_STUB_SIZE) /* in the stub blob */
#define ZB_STUB_OUT_LEN 2              /* `outb %al, $imm8`: e6 ib */
#define ZB_PORT_EXCEPTION 0xc0         /* ports 0xc0 .. 0xc0 + ZB_STUB_VECTORS - 1 */

/* ---- the UART (COM1): the only ports user code may touch (TSS I/O bitmap) ---- */
#define ZB_UART_BASE 0x3f8
#define ZB_UART_PORTS 8

/* ---- the vDSO's data page ----
 * One page right below the vDSO image (the guest finds it from the image's ELF header), written by
 * the host every time the sandbox starts running (native/vdso_page.c), read by guest/vdso.c. */
#define ZB_VDSO_DATA_SIZE 4096
/* The stubbed syscall sites' page (above): right after the vDSO image, one page. */
#define ZB_SITE_STUBS_SIZE 4096

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

/* In the syscall entry page at ZB_ENTRY_DATA, written by the host (native/guest_layout.c,
 * zb_layout_entry_answers) before every KVM_RUN (run_loop.c: so after every exit that could change
 * an fd, whichever process or thread of the family runs next); user code can read it, nobody in the
 * guest can write it (the page is user read-only, CR0.WP, and the guest has no code of its own at
 * CPL0). The host never reads it back. value[i] is slot i's answer. */
struct zb_entry_data {
    uint32_t on;          /* ZB_ENTRY_ANSWERS_ON: the slots answer */
    uint32_t value[ZB_ENTRY_SLOT_COUNT]; /* pid, uid, gid */
    uint8_t fd_state[ZB_ENTRY_FDS];      /* ZB_EFD_*; 0: the call exits (closed, or fd >= ZB_ENTRY_FDS) */
    uint32_t fd_flags[ZB_ENTRY_FDS];     /* F_GETFL's answer */
    uint64_t fd_offset[ZB_ENTRY_FDS];    /* the open file description's offset (ZB_EFD_SEEK) */
    uint64_t deadline_tsc;               /* the timed answers hold while the guest TSC is below it */
    int32_t stat_fd, pad;                /* newfstatat's fd (-1: none), and nothing */
    uint8_t stat[ZB_ENTRY_STAT_BYTES];   /* its struct stat */
    int32_t read_fd;                     /* the file whose bytes are at ZB_ENTRY_READ_BUF (-1: none) */
    uint32_t read_size;                  /* how many (the file's size when they were read) */
    uint32_t read_dir;                   /* 1: read_fd is a directory, the bytes its getdents64 records */
};
_Static_assert(ZB_ENTRY_DATA + sizeof(struct zb_entry_data) <= 4096, "the entry data must fit the entry page");

/* At ZB_ENTRY_SIG_DATA: the dispositions of the process about to run, what rt_sigaction copies to
 * oldact (struct kernel_sigaction: handler, flags, restorer, mask), one array per field indexed by
 * sig - 1, so that the entry reads field f of sig at ZB_ENTRY_SIG_DATA + f * 512 - 8 + 8 * sig. */
struct zb_entry_sigactions {
    uint64_t handler[ZB_ENTRY_SIGS], flags[ZB_ENTRY_SIGS], restorer[ZB_ENTRY_SIGS], mask[ZB_ENTRY_SIGS];
};
_Static_assert(sizeof(struct zb_entry_sigactions) == 4 * 8 * ZB_ENTRY_SIGS && ZB_ENTRY_SIG_DATA % 4096 == 0 &&
               ZB_ENTRY_SIG_DATA >= ZB_ENTRY_READ_BUF + ZB_ENTRY_READ_BYTES &&
               ZB_ENTRY_SIG_DATA + sizeof(struct zb_entry_sigactions) <= ZB_LOW_REGION_BYTES,
               "the dispositions are one page of their own in the low 2 MiB");
_Static_assert(__builtin_offsetof(struct zb_entry_data, fd_state) == ZB_ENTRY_FD_STATE &&
               __builtin_offsetof(struct zb_entry_data, fd_flags) == ZB_ENTRY_FD_FLAGS &&
               __builtin_offsetof(struct zb_entry_data, fd_offset) == ZB_ENTRY_FD_OFFSET &&
               __builtin_offsetof(struct zb_entry_data, deadline_tsc) == ZB_ENTRY_DEADLINE &&
               __builtin_offsetof(struct zb_entry_data, stat_fd) == ZB_ENTRY_STAT_FD &&
               __builtin_offsetof(struct zb_entry_data, stat) == ZB_ENTRY_STAT &&
               __builtin_offsetof(struct zb_entry_data, read_fd) == ZB_ENTRY_READ_FD &&
               __builtin_offsetof(struct zb_entry_data, read_size) == ZB_ENTRY_READ_SIZE &&
               __builtin_offsetof(struct zb_entry_data, read_dir) == ZB_ENTRY_READ_DIR, "the entry data's offsets");
_Static_assert(ZB_ENTRY_TIMED + ZB_ENTRY_TIMED_COUNT * ZB_ENTRY_TIMED_SIZE <= ZB_ENTRY_DATA, "the timed blocks overlap the data");
_Static_assert(ZB_ENTRY_READ_BYTES <= UINT32_MAX && ZB_ENTRY_READ_BUF + ZB_ENTRY_READ_BYTES <= ZB_LOW_REGION_BYTES,
               "the read buffer is in the low 2 MiB, its size a uint32");
#endif

#endif
