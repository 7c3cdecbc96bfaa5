/* syscall_sites.c - rewriting the guest's `syscall` instructions into the port's `out`.
 *
 * On PVM the `syscall` instruction itself costs ~13 us of a ~52 us round trip here: the trip to
 * LSTAR, where the entry's `out` then exits. An `out` to ZB_PORT_SYSCALL from user code exits at
 * once (guest_abi.h). So when a syscall exits through the entry, the two bytes of the `syscall`
 * that made it (just before its return address, rcx) are rewritten into that `out`, the same
 * length: every later call from the site (glibc has one per wrapper: write, openat, mmap, futex,
 * ...) saves that trip. As gVisor's systrap does with its own trampolines, only where nothing
 * but the process itself can see it:
 *  - the bytes there are `syscall` (0f 05): a jump to LSTAR with some other rcx is left alone;
 *  - both bytes in one page of the process's own, allocated user memory (zb_guest_ptr), which is
 *    copy-on-write (a host file or the template's image is never written through); never a
 *    MAP_SHARED mapping, whose bytes are a file's or another process's (shared_map.h);
 *  - not for the numbers the entry answers in the guest, while it does (ZB_ENTRY_ANSWERED_NRS:
 *    an answer without any exit beats the shorter exit): their sites are stubbed instead (below);
 *  - at the site's second exit, not its first: a rewrite copies the page and makes the guest
 *    fault it in again (~30 us), which a site run once (most of a short program's start-up:
 *    execve, arch_prctl, set_tid_address, ...) never earns back.
 * The rewrite is guest memory like any other write of the engine: snapshots, forks and restores
 * carry it, a rollback to a state before it brings the `syscall` back (rewritten again at its
 * next exit). What differs from Linux: a process reading its own code sees `out` where its file
 * has `syscall`.
 *
 * Stubbed sites (guest_abi.h "Stubbed syscall sites"): the site of an answered number is glibc's
 * `mov $nr, %eax; syscall` nearly everywhere (close, lseek, ioctl, fcntl, newfstatat,
 * getdents64, ...; read's `xor %eax, %eax; syscall` has no room and keeps its `syscall`). At its
 * second exit (the same rules: its own private memory, not shared; seen once before) the `mov`
 * becomes a `jmp` to a stub in the process's stub page that enters the entry as `syscall` would,
 * so the entry's answers cost a few instructions instead of the trip to LSTAR, and its exits the
 * entry's `out`. A site out of a rel32's reach of the stub page (more than 2 GiB away), or with
 * the page full (ZB_SITE_STUB_SLOTS), keeps its `syscall`. The stub page is guest memory like the
 * site: snapshots, forks and restores carry both, and an execve gives the new program an empty one.
 */
#include "util.h"
#include "memory.h"
#include "vm.h"
#include "sandbox_state.h"
#include "shared_map.h"
#include "dev.h"
#include "linux.h"

static const uint64_t answered_nrs[] = {ZB_ENTRY_ANSWERED_NRS};
_Static_assert(ZB_SITE_SEEN == 64, "zb_syscall_site_rewrite hashes a site to 6 bits");

static int answered_in_guest(uint64_t nr) {
    for (size_t i = 0; i < sizeof answered_nrs / sizeof answered_nrs[0]; i++)
        if (answered_nrs[i] == nr) return 1;
    return 0;
}

/* 1 at a site's second exit (site_seen), 0 at its first (it is remembered). */
static int seen_before(zb_sandbox *sb, uint64_t site) {
    uint64_t *seen = &sb->site_seen[(site * 0x9e3779b97f4a7c15ull) >> 58]; /* 64 slots: the top 6 bits */
    if (*seen != site) {
        *seen = site;
        return 0;
    }
    *seen = 0;
    return 1;
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, sizeof v); }

/* rel32 of a jump or rip-relative operand from `next` (the address after the instruction) to
 * `target`, or 0 with *ok cleared when out of reach. */
static int32_t rel32(uint64_t next, uint64_t target, int *ok) {
    int64_t d = (int64_t)(target - next);
    if (d < INT32_MIN || d > INT32_MAX) *ok = 0;
    return *ok ? (int32_t)d : 0;
}

/* The stub of a site (guest_abi.h): mov $nr, %eax; lea site+7(%rip), %rcx; mov $0x202, %r11d;
 * jmp *entry(%rip), the entry's address being the page's first qword. */
enum { STUB_LEA = 5, STUB_R11 = 12, STUB_JMP = 18, STUB_END = 24 };
_Static_assert(STUB_END <= ZB_SITE_STUB_SIZE && (1 + ZB_SITE_STUB_SLOTS) * ZB_SITE_STUB_SIZE <= ZB_SITE_STUBS_SIZE,
               "the stubs fit their slots and the slots the page");

/* The site whose `jmp` leads to the stub at slot, or 0 if none does any more (the slot is free or
 * stale: its site was unmapped, replaced or written over). The slot's bytes are the guest's to
 * change, so they only say where to look; the site's own bytes must jump back to the slot. */
static uint64_t slot_site(zb_sandbox *sb, uint64_t slot) {
    const uint8_t *stub = zb_guest_ptr(sb, slot, STUB_END, 0);
    int32_t to_return;
    if (!stub || stub[0] != ZB_SITE_MOV_EAX) return 0;
    memcpy(&to_return, stub + STUB_LEA + 3, sizeof to_return);
    uint64_t site = slot + STUB_R11 + (uint64_t)(int64_t)to_return - 7;
    const uint8_t *code = zb_guest_ptr(sb, site, 7, 0);
    int32_t to_stub;
    if (!code || code[0] != ZB_SITE_JMP || code[5] != 0x0f || code[6] != 0x05 || zb_shmap_find(&sb->mem, site, 7)) return 0;
    memcpy(&to_stub, code + 1, sizeof to_stub);
    return site + 5 + (uint64_t)(int64_t)to_stub == slot ? site : 0;
}

/* A slot for a new stub in the page (a free one, else one no site uses any more), or 0. */
static uint64_t free_slot(zb_sandbox *sb, uint64_t page) {
    const uint8_t *slots = sb->mem.host + page;
    for (uint64_t i = 1; i <= ZB_SITE_STUB_SLOTS; i++)
        if (slots[i * ZB_SITE_STUB_SIZE] == 0) return page + i * ZB_SITE_STUB_SIZE;
    for (uint64_t i = 1; i <= ZB_SITE_STUB_SLOTS; i++)
        if (!slot_site(sb, page + i * ZB_SITE_STUB_SIZE)) return page + i * ZB_SITE_STUB_SIZE;
    return 0;
}

void zb_syscall_stubs_drop(zb_sandbox *sb, uint64_t addr, uint64_t len) {
    uint64_t page = zb_vdso_site_stubs(sb);
    if (!page || addr >= page + ZB_SITE_STUBS_SIZE || addr + len <= page) return;
    for (uint64_t i = 1; i <= ZB_SITE_STUB_SLOTS; i++) {
        uint64_t slot = page + i * ZB_SITE_STUB_SIZE, site = slot_site(sb, slot);
        uint8_t *code = site ? zb_guest_ptr(sb, site, 5, 1) : NULL;
        if (!code) continue;
        code[0] = ZB_SITE_MOV_EAX; /* the `mov $nr, %eax` the stub holds */
        memcpy(code + 1, sb->mem.host + slot + 1, 4);
    }
    uint8_t *slots = zb_guest_ptr(sb, page, ZB_SITE_STUBS_SIZE, 1);
    if (slots) memset(slots + ZB_SITE_STUB_SIZE, 0, ZB_SITE_STUBS_SIZE - ZB_SITE_STUB_SIZE);
}

/* An answered number's `mov $nr, %eax; syscall` at return_rip - 7 becomes a jump to a new stub. */
static void stub_site(zb_sandbox *sb, uint64_t nr, uint64_t return_rip) {
    if (return_rip < ZB_LOW_REGION + 8) return;
    uint64_t site = return_rip - 7;
    const uint8_t *before = zb_guest_ptr(sb, site - 1, 8, 0), *now = before ? before + 1 : NULL;
    uint32_t imm;
    if (!now || now[0] != ZB_SITE_MOV_EAX || now[5] != 0x0f || now[6] != 0x05) return;
    /* a REX prefix makes it another instruction (41 b8: mov $imm32, %r8d), whatever rax holds */
    if ((before[0] & 0xf0) == 0x40) return;
    memcpy(&imm, now + 1, sizeof imm);
    if (imm != nr || zb_shmap_find(&sb->mem, site, 7) || !seen_before(sb, site)) return;
    uint64_t page = zb_vdso_site_stubs(sb), slot = page ? free_slot(sb, page) : 0;
    if (!slot) return; /* no page, or full: the site keeps its `syscall` */
    int ok = 1;
    int32_t to_stub = rel32(site + 5, slot, &ok), to_return = rel32(slot + STUB_R11, return_rip, &ok),
            to_entry = rel32(slot + STUB_END, page, &ok);
    if (!ok) return;
    uint8_t stub[STUB_END] = {ZB_SITE_MOV_EAX, 0, 0, 0, 0, 0x48, 0x8d, 0x0d, 0, 0, 0, 0, /* lea rel32(%rip), %rcx */
                              0x41, 0xbb, 0x02, 0x02, 0x00, 0x00,                        /* mov $0x202, %r11d */
                              0xff, 0x25, 0, 0, 0, 0};                                   /* jmp *rel32(%rip) */
    put_u32(stub + 1, imm);
    put_u32(stub + STUB_LEA + 3, (uint32_t)to_return);
    put_u32(stub + STUB_JMP + 2, (uint32_t)to_entry);
    uint8_t *head = zb_guest_ptr(sb, page, 8, 1), *dst = zb_guest_ptr(sb, slot, STUB_END, 1), *code;
    if (!head || !dst) return;
    uint64_t entry = ZB_SYSCALL_ENTRY;
    memcpy(head, &entry, sizeof entry); /* what the stubs jump through, whatever the process wrote there */
    memcpy(dst, stub, sizeof stub);
    if (!(code = zb_guest_ptr(sb, site, 5, 1))) return; /* marks the pages written, for the next snapshot */
    code[0] = ZB_SITE_JMP;
    put_u32(code + 1, (uint32_t)to_stub);
    sb->stats.syscall_stubs++;
}

void zb_syscall_site_rewrite(zb_sandbox *sb, const zb_vm *vm, uint64_t nr, uint64_t return_rip) {
    if (!vm->site_rewrite) return;
    if (vm->guest_answers && answered_in_guest(nr)) {
        stub_site(sb, nr, return_rip);
        return;
    }
    if (return_rip < ZB_LOW_REGION + 2) return;
    uint64_t site = return_rip - 2;
    if ((site & (ZB_PAGE - 1)) == ZB_PAGE - 1) return; /* across two pages */
    const uint8_t *now = zb_guest_ptr(sb, site, 2, 0);
    if (!now || now[0] != 0x0f || now[1] != 0x05 || zb_shmap_find(&sb->mem, site, 2) || !seen_before(sb, site)) return;
    uint8_t *code = zb_guest_ptr(sb, site, 2, 1); /* marks the page written, for the next snapshot */
    if (!code) return;
    code[0] = ZB_SITE_OUT_0;
    code[1] = ZB_PORT_SYSCALL;
    sb->stats.syscall_sites++;
}
