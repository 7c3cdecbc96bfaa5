/* escape_cpu.c - a guest that tries to leave CPL3: privileged instructions, its own descriptor
 * tables and page tables, far transfers to the kernel code segment, interrupts and exceptions it
 * should not be able to raise, I/O ports other than the UART, addresses beyond guest memory, the
 * supervisor-only low 2 MiB (page tables, GDT, IDT, TSS, the CPL0 stubs, the exception stack), and
 * syscalls entered from odd states.
 *
 * `escape_cpu NAME` runs one attempt. Each announces itself on stderr first. An attempt that the
 * CPU or the engine lets through prints "SURVIVED NAME ..." on stdout and exits 0; the host test
 * decides, per attempt, whether surviving is acceptable (sgdt, say) or an escape.
 */
#include "check.h"

#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>

#define LOW_PML4 0x1000ul
#define LOW_GDT 0x3000ul
#define LOW_IDT 0x4000ul
#define LOW_TSS 0x5000ul
#define LOW_STUBS 0x8000ul
#define LOW_XSTACK 0x9000ul
#define LSTAR 0xe000ul /* guest_abi.h ZB_SYSCALL_ENTRY: user-executable, read-only */
#define CLOSE_SLOT 0xf000ul /* guest_abi.h ZB_ENTRY_CLOSE_SLOT: user read-write, never executable */
#define READ_BUF 0x100000ul /* guest_abi.h ZB_ENTRY_READ_BUF: user read-only, never executable */
#define NONCANONICAL 0x8000000000000000ul

static void announce(const char *what) { fprintf(stderr, "about to %s\n", what); }

static void survived(const char *name, unsigned long detail) {
    printf("SURVIVED %s 0x%lx\n", name, detail);
    fflush(stdout);
}

/* A page of user memory, 4 KiB aligned, for descriptor tables and page tables of our own. */
static uint64_t *user_page(void) {
    uint64_t *p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(2); }
    return p;
}

#define TEST(name) static void test_##name(int argc, char **argv)
#define UNUSED (void)argc, (void)argv

/* ---- privileged instructions ---- */

TEST(lgdt) { /* our own GDT with a DPL 3 64-bit code segment that claims ring 0 */
    UNUSED;
    uint64_t *gdt = user_page();
    gdt[1] = 0x00af9b000000ffffull;
    struct __attribute__((packed)) { uint16_t limit; uint64_t base; } d = {15, (uint64_t)gdt};
    announce("lgdt a GDT in user memory");
    __asm__ volatile("lgdt %0" ::"m"(d));
    survived("lgdt", 0);
}

TEST(lidt) {
    UNUSED;
    uint64_t *idt = user_page();
    struct __attribute__((packed)) { uint16_t limit; uint64_t base; } d = {4095, (uint64_t)idt};
    announce("lidt an IDT in user memory");
    __asm__ volatile("lidt %0" ::"m"(d));
    survived("lidt", 0);
}

TEST(lldt) { UNUSED; announce("lldt"); __asm__ volatile("lldt %w0" ::"r"(0x10)); survived("lldt", 0); }
TEST(ltr) { UNUSED; announce("ltr"); __asm__ volatile("ltr %w0" ::"r"(0x40)); survived("ltr", 0); }

TEST(mov_cr3) { /* load page tables of our own that map everything user-accessible */
    UNUSED;
    uint64_t *pml4 = user_page(), *pdpt = user_page();
    for (int i = 0; i < 512; i++) pdpt[i] = ((uint64_t)i << 30) | 0x87; /* 1 GiB pages, P|RW|US|PS */
    pml4[0] = (uint64_t)pdpt | 0x7;
    announce("mov our own page tables to cr3");
    __asm__ volatile("mov %0, %%cr3" ::"r"((uint64_t)pml4) : "memory");
    survived("mov_cr3", *(volatile uint64_t *)LOW_PML4);
}

TEST(read_cr3) {
    UNUSED;
    uint64_t v = 0;
    announce("read cr3");
    __asm__ volatile("mov %%cr3, %0" : "=r"(v));
    survived("read_cr3", v);
}

TEST(mov_cr0) { /* clear WP and PG */
    UNUSED;
    announce("write cr0");
    __asm__ volatile("mov %0, %%cr0" ::"r"(0x11ul));
    survived("mov_cr0", 0);
}

TEST(mov_cr4) { UNUSED; announce("write cr4"); __asm__ volatile("mov %0, %%cr4" ::"r"(0x20ul)); survived("mov_cr4", 0); }

TEST(wrmsr_lstar) { /* point syscalls at our own code */
    UNUSED;
    announce("wrmsr LSTAR");
    __asm__ volatile("wrmsr" ::"c"(0xc0000082), "a"(0x400000), "d"(0));
    survived("wrmsr_lstar", 0);
}

TEST(rdmsr) {
    UNUSED;
    uint32_t lo = 0, hi = 0;
    announce("rdmsr EFER");
    __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(0xc0000080));
    survived("rdmsr", ((uint64_t)hi << 32) | lo);
}

TEST(cli) { UNUSED; announce("cli"); __asm__ volatile("cli"); survived("cli", 0); }
TEST(sti) { UNUSED; announce("sti"); __asm__ volatile("sti"); survived("sti", 0); }
TEST(hlt) { UNUSED; announce("hlt"); __asm__ volatile("hlt"); survived("hlt", 0); }
TEST(clts) { UNUSED; announce("clts"); __asm__ volatile("clts"); survived("clts", 0); }
TEST(invlpg) { UNUSED; announce("invlpg"); __asm__ volatile("invlpg (%0)" ::"r"(LOW_PML4) : "memory"); survived("invlpg", 0); }
TEST(wbinvd) { UNUSED; announce("wbinvd"); __asm__ volatile("wbinvd"); survived("wbinvd", 0); }
TEST(invd) { UNUSED; announce("invd"); __asm__ volatile("invd"); survived("invd", 0); }
TEST(mov_dr7) { UNUSED; announce("write dr7"); __asm__ volatile("mov %0, %%dr7" ::"r"(0x1ul)); survived("mov_dr7", 0); }
TEST(swapgs) { UNUSED; announce("swapgs"); __asm__ volatile("swapgs"); survived("swapgs", 0); }
TEST(sysretq) { UNUSED; announce("sysretq at CPL3"); __asm__ volatile("mov $0x400000, %%rcx\n sysretq" ::: "rcx", "r11"); survived("sysretq", 0); }
TEST(rdpmc) {
    UNUSED;
    uint32_t lo, hi;
    announce("rdpmc");
    __asm__ volatile("rdpmc" : "=a"(lo), "=d"(hi) : "c"(0));
    survived("rdpmc", lo);
}
TEST(xsetbv) { /* enable the AMX state the engine keeps off */
    UNUSED;
    announce("xsetbv");
    __asm__ volatile("xsetbv" ::"c"(0), "a"(0x602e7), "d"(0));
    survived("xsetbv", 0);
}
TEST(sysenter) { UNUSED; announce("sysenter"); __asm__ volatile("sysenter"); survived("sysenter", 0); }
TEST(vmcall) { /* a KVM hypercall (KVM_HC_KICK_CPU = 5) */
    UNUSED;
    long r = 5;
    announce("vmcall");
    __asm__ volatile("vmcall" : "+a"(r) : "b"(0), "c"(0) : "memory");
    survived("vmcall", (unsigned long)r);
}
TEST(vmmcall) {
    UNUSED;
    long r = 5;
    announce("vmmcall");
    __asm__ volatile("vmmcall" : "+a"(r) : "b"(0), "c"(0) : "memory");
    survived("vmmcall", (unsigned long)r);
}
TEST(sgdt) { /* allowed at CPL3 without UMIP: it only tells where the GDT is (a fixed, documented address) */
    UNUSED;
    struct __attribute__((packed)) { uint16_t limit; uint64_t base; } d = {0, 0};
    announce("sgdt");
    __asm__ volatile("sgdt %0" : "=m"(d));
    survived("sgdt", d.base);
}

/* ---- far transfers to the kernel code segment (selector 0x08) and system segments ---- */

TEST(ljmp_kernel) {
    UNUSED;
    struct __attribute__((packed)) { uint64_t off; uint16_t sel; } target = {0x400000, 0x08};
    announce("far jump to selector 0x08");
    __asm__ volatile("rex64 ljmp *%0" ::"m"(target));
    survived("ljmp_kernel", 0);
}

TEST(lcall_tss) { /* a task switch through the TSS descriptor */
    UNUSED;
    struct __attribute__((packed)) { uint64_t off; uint16_t sel; } target = {0, 0x40};
    announce("far call to the TSS selector 0x40");
    __asm__ volatile("rex64 lcall *%0" ::"m"(target));
    survived("lcall_tss", 0);
}

TEST(iretq_cpl0) { /* an interrupt return frame that names CS 0x08 */
    UNUSED;
    announce("iretq to CPL0");
    __asm__ volatile("mov %%rsp, %%rax\n"
                     "pushq $0x10\n pushq %%rax\n pushfq\n pushq $0x08\n"
                     "lea 1f(%%rip), %%rax\n pushq %%rax\n iretq\n1:" ::: "rax", "memory");
    survived("iretq_cpl0", 0);
}

TEST(lret_cpl0) {
    UNUSED;
    announce("lret to CPL0");
    __asm__ volatile("pushq $0x08\n lea 1f(%%rip), %%rax\n pushq %%rax\n lretq\n1:" ::: "rax", "memory");
    survived("lret_cpl0", 0);
}

TEST(mov_ss_kernel) { UNUSED; announce("mov 0x10 to ss"); __asm__ volatile("mov %0, %%ss" ::"r"(0x10)); survived("mov_ss_kernel", 0); }
TEST(mov_ds_tss) { UNUSED; announce("mov the TSS selector to ds"); __asm__ volatile("mov %0, %%ds" ::"r"(0x40)); survived("mov_ds_tss", 0); }

TEST(popf_iopl) { /* IOPL 3 would open every port: popf at CPL3 must not change it */
    UNUSED;
    announce("popf IOPL=3, then out 0x80");
    __asm__ volatile("pushfq\n orq $0x3000, (%%rsp)\n popfq\n outb %%al, $0x80" ::"a"(0) : "memory", "cc");
    survived("popf_iopl", 0);
}

/* ---- software interrupts and exceptions ---- */

TEST(int80) { UNUSED; announce("int $0x80"); __asm__ volatile("int $0x80" ::"a"(39)); survived("int80", 0); }
TEST(int14) { UNUSED; announce("int $14 (the syscall vector)"); __asm__ volatile("int $14"); survived("int14", 0); }
TEST(int13) { UNUSED; announce("int $13"); __asm__ volatile("int $13"); survived("int13", 0); }
TEST(int8) { UNUSED; announce("int $8 (double fault)"); __asm__ volatile("int $8"); survived("int8", 0); }
TEST(int32) { UNUSED; announce("int $32 (past the IDT)"); __asm__ volatile("int $32"); survived("int32", 0); }
TEST(int255) { UNUSED; announce("int $255"); __asm__ volatile("int $255"); survived("int255", 0); }
TEST(int1) { UNUSED; announce("icebp (int1)"); __asm__ volatile(".byte 0xf1"); survived("int1", 0); }
TEST(into) { UNUSED; announce("into (invalid in 64-bit mode)"); __asm__ volatile(".byte 0xce"); survived("into", 0); }

/* ---- I/O ports ---- */

TEST(out_exception_port) { /* forge the CPL0 stub's exit for vector 14 (a syscall) */
    UNUSED;
    announce("out to port 0xce");
    __asm__ volatile("outb %%al, $0xce" ::"a"(0));
    survived("out_exception_port", 0);
}
TEST(out_pci) { UNUSED; announce("outl to the PCI config port 0xcf8"); __asm__ volatile("outl %%eax, %%dx" ::"a"(0x80000000), "d"(0xcf8)); survived("out_pci", 0); }
TEST(in_pit) { UNUSED; uint8_t v; announce("in from the PIT 0x40"); __asm__ volatile("inb $0x40, %%al" : "=a"(v)); survived("in_pit", v); }
TEST(out_uart_word) { /* a 16-bit access at the UART base: inside the bitmap, but not byte-wide */
    UNUSED;
    announce("outw to 0x3f8");
    __asm__ volatile("outw %%ax, %%dx" ::"a"(0x4d4d), "d"(0x3f8));
    survived("out_uart_word", 0);
}
TEST(out_uart_straddle) { /* 0x3fe-0x401: the last UART ports and the first denied one */
    UNUSED;
    announce("outl to 0x3fe");
    __asm__ volatile("outl %%eax, %%dx" ::"a"(0), "d"(0x3fe));
    survived("out_uart_straddle", 0);
}
TEST(rep_outsb_uart) { /* 8 KiB of garbage through rep outsb: the frame check ends the VM */
    UNUSED;
    static char junk[8192];
    memset(junk, 0x41, sizeof junk);
    announce("rep outsb garbage to the UART");
    __asm__ volatile("rep outsb" ::"S"(junk), "c"(sizeof junk), "d"(0x3f8) : "memory");
    survived("rep_outsb_uart", 0);
}
TEST(rep_insb_uart) { /* reads from the UART with nothing queued: zeros, the guest goes on */
    UNUSED;
    static char buf[64];
    announce("rep insb from the UART");
    __asm__ volatile("rep insb" ::"D"(buf), "c"(sizeof buf), "d"(0x3f8) : "memory");
    survived("rep_insb_uart", (unsigned char)buf[0]);
}

/* ---- memory the guest must not reach ---- */

static void read_at(const char *name, uint64_t addr) {
    announce(name);
    uint64_t v = *(volatile uint64_t *)addr;
    survived(name, v);
}
static void write_at(const char *name, uint64_t addr) {
    announce(name);
    *(volatile uint64_t *)addr = 0x87;
    survived(name, 0);
}
static void jump_to(const char *name, uint64_t addr) {
    announce(name);
    ((void (*)(void))addr)();
    survived(name, 0);
}

TEST(read_pml4) { UNUSED; read_at("read_pml4", LOW_PML4); }
TEST(write_pml4) { UNUSED; write_at("write_pml4", LOW_PML4); }
TEST(write_gdt) { UNUSED; write_at("write_gdt", LOW_GDT + 8); }
TEST(write_idt) { UNUSED; write_at("write_idt", LOW_IDT + 14 * 16); }
TEST(read_tss) { UNUSED; read_at("read_tss", LOW_TSS + 4); }
TEST(write_iobitmap) { UNUSED; write_at("write_iobitmap", LOW_TSS + 0x68 + 0x10); }
TEST(write_xstack) { UNUSED; write_at("write_xstack", LOW_XSTACK + 0x2ff8); }
TEST(write_stub) { UNUSED; write_at("write_stub", LOW_STUBS); }
TEST(jump_stub) { UNUSED; jump_to("jump_stub", LOW_STUBS + 14 * 8); }
TEST(jump_idt) { UNUSED; jump_to("jump_idt", LOW_IDT); }
TEST(jump_null) { UNUSED; jump_to("jump_null", 0); }
TEST(read_low_top) { UNUSED; read_at("read_low_top", 0x200000 - 8); }
TEST(jump_close_slot) { /* code written into the one user-writable low page does not run */
    UNUSED;
    *(volatile uint32_t *)CLOSE_SLOT = 0x90909090u; /* nops: a fetch there must fault (NX) */
    jump_to("jump_close_slot", CLOSE_SLOT);
}
/* the entry's read buffer (guest_abi.h ZB_ENTRY_READ_BUF): user-readable file bytes, never
 * writable or executable */
TEST(write_read_buffer) { UNUSED; write_at("write_read_buffer", READ_BUF + 0x100); }
TEST(jump_read_buffer) { UNUSED; jump_to("jump_read_buffer", READ_BUF); }
/* Into the read block's copy (guest_abi.h: ZB_ENTRY_TIMED + 4 * ZB_ENTRY_TIMED_SIZE +
 * ZB_ENTRY_READ_COPY) with its source made the page tables: the copy runs at CPL3 and faults, the
 * host serves a read of read_fd (none: EBADF) and returns to the rcx the probe saved for it (rax
 * is the count, 16, so that the copy runs). The buffer must keep its sentinel. */
#define READ_COPY (LSTAR + 0x200 + 4 * 0x180 + 0x90)
static volatile uint64_t copy_buf[2] = {0x5a5a5a5a5a5a5a5aul, 0};
static void after_copy(void) { survived("jump_read_copy", copy_buf[0]); exit(0); }
TEST(jump_read_copy) {
    UNUSED;
    announce("jump into the read block's copy with the page tables as its source");
    ((volatile uint64_t *)(CLOSE_SLOT + 8))[0] = (uint64_t)copy_buf; /* ZB_ENTRY_READ_SAVE: rsi, rcx */
    ((volatile uint64_t *)(CLOSE_SLOT + 8))[1] = (uint64_t)after_copy;
    register uint64_t src __asm__("r11") = LOW_PML4 - READ_BUF; /* the copy reads READ_BUF + r11 */
    __asm__ volatile("jmp *%0" ::"r"(READ_COPY), "a"(16), "S"(copy_buf), "d"(16), "c"(0), "r"(src) : "memory");
    survived("jump_read_copy", 1);
}
TEST(read_beyond) { UNUSED; read_at("read_beyond", 0x10000000); } /* past a 256 MiB guest */
TEST(write_lapic) { UNUSED; write_at("write_lapic", 0xfee00000); }
TEST(write_ioapic) { UNUSED; write_at("write_ioapic", 0xfec00000); }
TEST(read_kernel_half) { UNUSED; read_at("read_kernel_half", 0xffff888000000000ul); }
TEST(read_noncanonical) { UNUSED; read_at("read_noncanonical", NONCANONICAL); }
TEST(jump_noncanonical) { UNUSED; jump_to("jump_noncanonical", NONCANONICAL); }

/* ---- syscalls from odd states ---- */

/* Jump straight to LSTAR (as `syscall` would) with rcx = where to "return": the engine serves the
 * call (rax = getpid) and resumes at rcx. */
static void lstar_jump(const char *name, uint64_t rcx) {
    announce(name);
    __asm__ volatile("mov %0, %%rcx\n mov $39, %%eax\n jmp *%1" ::"r"(rcx), "r"(LSTAR) : "rax", "rcx", "r11", "memory");
    survived(name, 0);
}
static void back_here(void) { survived("lstar_jump", 0); exit(0); }
TEST(lstar_jump) { UNUSED; lstar_jump("lstar_jump", (uint64_t)back_here); }
TEST(lstar_noncanonical) { UNUSED; lstar_jump("lstar_noncanonical", NONCANONICAL); }
TEST(lstar_to_stub) { UNUSED; lstar_jump("lstar_to_stub", LOW_STUBS + 14 * 8); }

TEST(syscall_tf) { /* single-stepping into and out of a syscall */
    UNUSED;
    announce("syscall with TF set");
    __asm__ volatile("pushfq\n orq $0x100, (%%rsp)\n popfq\n mov $39, %%eax\n syscall\n nop\n nop" ::: "rax", "rcx", "r11", "memory", "cc");
    survived("syscall_tf", 0);
}

TEST(syscall_no_stack) { /* rsp 0, then in the exception stack: the engine never uses the guest's stack */
    UNUSED;
    uint64_t a, b;
    announce("syscall with rsp = 0 and rsp = the exception stack");
    __asm__ volatile("mov %%rsp, %%r12\n xor %%esp, %%esp\n mov $39, %%eax\n syscall\n mov %%rax, %%r13\n"
                     "mov $0xbff8, %%esp\n mov $39, %%eax\n syscall\n mov %%r12, %%rsp\n mov %%r13, %0\n mov %%rax, %1"
                     : "=r"(a), "=r"(b)::"rax", "rcx", "r11", "r12", "r13", "memory");
    CHECK_EQ(a, 1);
    CHECK_EQ(b, 1);
    survived("syscall_no_stack", a);
}

TEST(syscall_flags) { /* DF and AC set across a syscall; IOPL asked for */
    UNUSED;
    uint64_t fl;
    announce("syscall with DF, AC and IOPL bits set");
    __asm__ volatile("pushfq\n orq $0x43400, (%%rsp)\n popfq\n mov $39, %%eax\n syscall\n pushfq\n popq %0\n cld\n"
                     "pushfq\n andq $~0x40000, (%%rsp)\n popfq" : "=r"(fl)::"rax", "rcx", "r11", "memory", "cc");
    CHECK((fl & 0x3000) == 0, "IOPL 0x%lx after a syscall", fl & 0x3000);
    survived("syscall_flags", fl);
}

/* rt_sigreturn with a forged frame: non-canonical rip, or IOPL 3 in the flags. */
static void forged_sigreturn(const char *name, uint64_t rip, uint64_t eflags) {
    static uint64_t frame[128] __attribute__((aligned(16)));
    memset(frame, 0, sizeof frame);
    /* struct ucontext: uc_flags, uc_link, ss_sp, ss_flags/pad, ss_size, then sigcontext (r8...) */
    uint64_t *mc = frame + 5;
    mc[15] = (uint64_t)(frame + 100); /* rsp */
    mc[16] = rip;
    mc[17] = eflags;
    announce(name);
    __asm__ volatile("mov %0, %%rsp\n mov $15, %%eax\n syscall" ::"r"(frame), "a"(15) : "memory");
    survived(name, 0);
}
static void after_sigreturn(void) {
    uint8_t v = 0;
    __asm__ volatile("inb $0x80, %%al" : "=a"(v)); /* IOPL must still be 0 */
    survived("sigreturn_iopl", v);
    exit(0);
}
TEST(sigreturn_noncanonical) { UNUSED; forged_sigreturn("sigreturn_noncanonical", NONCANONICAL, 0x202); }
TEST(sigreturn_low) { UNUSED; forged_sigreturn("sigreturn_low", LOW_STUBS, 0x202); }
TEST(sigreturn_iopl) { UNUSED; forged_sigreturn("sigreturn_iopl", (uint64_t)after_sigreturn, 0x3202); }

TEST(handler_noncanonical) { /* a signal handler the CPU cannot jump to */
    UNUSED;
    struct { uint64_t handler, flags, restorer, mask; } act = {NONCANONICAL, 0x04000000, NONCANONICAL, 0};
    OK(syscall(SYS_rt_sigaction, SIGUSR1, &act, NULL, 8));
    announce("raise SIGUSR1 with a non-canonical handler");
    syscall(SYS_kill, 1, SIGUSR1);
    survived("handler_noncanonical", 0);
}

TEST(fs_noncanonical) { /* a TLS base the CPU cannot load */
    UNUSED;
    announce("arch_prctl(ARCH_SET_FS) to a non-canonical address");
    long r = syscall(SYS_arch_prctl, ARCH_SET_FS, NONCANONICAL);
    long e = errno;
    survived("fs_noncanonical", r < 0 ? (unsigned long)e : 0);
}
TEST(gs_noncanonical) {
    UNUSED;
    announce("arch_prctl(ARCH_SET_GS) to a non-canonical address");
    long r = syscall(SYS_arch_prctl, ARCH_SET_GS, NONCANONICAL);
    long e = errno;
    survived("gs_noncanonical", r < 0 ? (unsigned long)e : 0);
}
TEST(fs_low) { /* a TLS base in the supervisor region: fs-relative reads fault */
    UNUSED;
    announce("read through fs at the page tables"); /* (stdio needs TLS: announce first) */
    uint64_t v;
    __asm__ volatile("mov $158, %%eax\n syscall\n mov %%fs:0, %0"
                     : "=r"(v) : "D"(ARCH_SET_FS), "S"(LOW_PML4) : "rax", "rcx", "r11", "memory");
    survived("fs_low", v);
}

#define T(name) {#name, test_##name}
static const zb_test tests[] = {
    T(lgdt), T(lidt), T(lldt), T(ltr), T(mov_cr3), T(read_cr3), T(mov_cr0), T(mov_cr4), T(wrmsr_lstar), T(rdmsr),
    T(cli), T(sti), T(hlt), T(clts), T(invlpg), T(wbinvd), T(invd), T(mov_dr7), T(swapgs), T(sysretq), T(rdpmc),
    T(xsetbv), T(sysenter), T(vmcall), T(vmmcall), T(sgdt),
    T(ljmp_kernel), T(lcall_tss), T(iretq_cpl0), T(lret_cpl0), T(mov_ss_kernel), T(mov_ds_tss), T(popf_iopl),
    T(int80), T(int14), T(int13), T(int8), T(int32), T(int255), T(int1), T(into),
    T(out_exception_port), T(out_pci), T(in_pit), T(out_uart_word), T(out_uart_straddle), T(rep_outsb_uart),
    T(rep_insb_uart),
    T(read_pml4), T(write_pml4), T(write_gdt), T(write_idt), T(read_tss), T(write_iobitmap), T(write_xstack),
    T(write_stub), T(jump_stub), T(jump_idt), T(jump_null), T(read_low_top), T(jump_close_slot), T(write_read_buffer),
    T(jump_read_buffer), T(jump_read_copy), T(read_beyond), T(write_lapic),
    T(write_ioapic), T(read_kernel_half), T(read_noncanonical), T(jump_noncanonical),
    T(lstar_jump), T(lstar_noncanonical), T(lstar_to_stub), T(syscall_tf), T(syscall_no_stack), T(syscall_flags),
    T(sigreturn_noncanonical), T(sigreturn_low), T(sigreturn_iopl), T(handler_noncanonical), T(fs_noncanonical),
    T(gs_noncanonical), T(fs_low),
    {NULL, NULL},
};

int main(int argc, char **argv) {
    setvbuf(stderr, NULL, _IONBF, 0);
    return zb_run(tests, argc, argv);
}
