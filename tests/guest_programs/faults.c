/* faults.c - ways for a guest to die. Each test announces itself on stderr (unbuffered) first;
 * the host checks the event that ends the sandbox and that it can go on running others. */
#include "check.h"

#include <signal.h>

static void announce(const char *what) {
    fprintf(stderr, "about to %s\n", what);
}

static void test_segv(int argc, char **argv) {
    (void)argc;
    (void)argv;
    announce("write to 0x10");
    *(volatile int *)0x10 = 1;
}

static void test_segv_unmapped(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char *p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(p, PAGE);
    announce("read unmapped memory");
    (void)*(volatile char *)(p + 100);
}

static void test_segv_beyond(int argc, char **argv) {
    (void)argc;
    (void)argv;
    announce("jump beyond guest memory");
    ((void (*)(void))0x500000000000ul)();
}

static void test_ud2(int argc, char **argv) {
    (void)argc;
    (void)argv;
    announce("execute ud2");
    __asm__ volatile("ud2");
}

static void test_int3(int argc, char **argv) {
    (void)argc;
    (void)argv;
    announce("execute int3");
    __asm__ volatile("int3");
}

static void test_div0(int argc, char **argv) {
    (void)argc;
    (void)argv;
    announce("divide by zero");
    volatile int zero = 0, x = 1;
    x /= zero;
}

static void test_hlt(int argc, char **argv) {
    (void)argc;
    (void)argv;
    announce("execute hlt");
    __asm__ volatile("hlt");
}

static void test_cli(int argc, char **argv) {
    (void)argc;
    (void)argv;
    announce("execute cli");
    __asm__ volatile("cli");
}

static void test_out80(int argc, char **argv) {
    (void)argc;
    (void)argv;
    announce("write port 0x80");
    __asm__ volatile("outb %%al, $0x80" ::"a"(0));
}

static void test_in_dx(int argc, char **argv) {
    (void)argc;
    (void)argv;
    announce("read port 0x3fa0 through dx");
    unsigned char v;
    __asm__ volatile("inb %%dx, %%al" : "=a"(v) : "d"(0x3fa0));
}

/* reading the syscall entry's port (guest_abi.h ZB_PORT_SYSCALL; writing it is a syscall) */
static void test_in_syscall_port(int argc, char **argv) {
    (void)argc;
    (void)argv;
    announce("read the syscall entry's port");
    unsigned char v;
    __asm__ volatile("inb $0xe0, %%al" : "=a"(v));
}

/* the syscall entry page (guest_abi.h ZB_SYSCALL_ENTRY) is readable by user code, never writable */
static void test_write_syscall_entry(int argc, char **argv) {
    (void)argc;
    (void)argv;
    volatile unsigned char *entry = (volatile unsigned char *)0xe000;
    announce("read then write the syscall entry page");
    if (entry[0x180] != 0xe6) fprintf(stderr, "the entry has no out at ZB_SYSCALL_ENTRY_OUT (0x%x)\n", entry[0x180]);
    entry[0] = 0x90;
}

static void test_abort(int argc, char **argv) {
    (void)argc;
    (void)argv;
    announce("abort");
    abort();
}

static volatile int keep_going = 1;
static int recurse(int n) {
    volatile char pad[4096];
    pad[0] = (char)n;
    return keep_going ? recurse(n + 1) + pad[0] : 0;
}
static void test_stack_overflow(int argc, char **argv) {
    (void)argc;
    (void)argv;
    announce("overflow the stack");
    recurse(0);
}

static const zb_test tests[] = {
    {"segv", test_segv},
    {"segv_unmapped", test_segv_unmapped},
    {"segv_beyond", test_segv_beyond},
    {"ud2", test_ud2},
    {"int3", test_int3},
    {"div0", test_div0},
    {"hlt", test_hlt},
    {"cli", test_cli},
    {"out80", test_out80},
    {"in_dx", test_in_dx},
    {"in_syscall_port", test_in_syscall_port},
    {"write_syscall_entry", test_write_syscall_entry},
    {"abort", test_abort},
    {"stack_overflow", test_stack_overflow},
    {NULL, NULL},
};

int main(int argc, char **argv) { return zb_run(tests, argc, argv); }
